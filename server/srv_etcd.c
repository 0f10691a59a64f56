/*
 * srv_etcd.c - keep this node's record in etcd (see srv_etcd.h), with
 * the etcd client kvpoold and libkvpool share (etcd/etcd.c).
 *
 * The record is written with a compare-and-put (one etcd transaction):
 * when the key is absent, under this process's lease, or holds the record
 * an earlier run of this node left (same address and port, its lease not
 * yet ended). A record of another node under the same name is left alone
 * and the name reported in use. Every renewal reads the record back, so a
 * record deleted (or replaced) while the lease lives is noticed and
 * written again; leaving deletes it only while it is under this process's
 * lease (compare-and-delete), so a second kvpoold with the same name
 * never removes the first one's record.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "srv_etcd.h"
#include "srv_log.h"

#define ETCD_CALL_TIMEOUT_MS 1000 /* each call to etcd */
#define ETCD_RETRY_MS 1000        /* wait after a failed call */
#define ETCD_PUT_TRIES 3          /* compare-and-put races lost before giving up a round */

struct srv_etcd {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stop;                     /* under lock */
	struct kvc_etcd *etcd;        /* used by the thread, then by stop */
	char url[256];
	char endpoint[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];
	char key[512];
	size_t prefix_len;            /* of key: the cluster's nodes/ prefix */
	char *record;                 /* the JSON value */
	char address[256];            /* advertised, as in the record */
	uint16_t port;
	uint32_t lease_s;
	int64_t lease;                /* thread, then stop */
	char holder[300];             /* thread: "address:port" of a node holding the name */
	/* state, under lock */
	int registered;
	const char *state;            /* "starting", "registered", "unreachable", ... */
	char last_error[384];
	char current[KVC_ETCD_ENDPOINT_MAX_BYTES + 1]; /* the etcd endpoint in use */
	int64_t lease_shown;
	uint64_t registrations, failures, reregistrations, failovers;
};

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait up to ms or until stop; returns the stop flag. */
static int wait_ms(struct srv_etcd *e, uint64_t ms)
{
	struct timespec ts;
	int stop;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&e->lock);
	while (!e->stop && pthread_cond_timedwait(&e->cond, &e->lock, &ts) == 0)
		;
	stop = e->stop;
	pthread_mutex_unlock(&e->lock);
	return stop;
}

/* Record a change of state; log it once per change. */
static void set_state_why(struct srv_etcd *e, const char *state, int registered, int err,
			  const char *why)
{
	int changed;

	pthread_mutex_lock(&e->lock);
	changed = e->state != state;
	e->state = state;
	e->registered = registered;
	e->lease_shown = registered ? e->lease : 0;
	if (e->etcd) {
		snprintf(e->current, sizeof(e->current), "%s", kvc_etcd_current(e->etcd));
		e->failovers = kvc_etcd_failovers(e->etcd);
	}
	if (err) {
		e->failures++;
		if (why)
			snprintf(e->last_error, sizeof(e->last_error), "%s", why);
		else if (err == -EADDRINUSE)
			snprintf(e->last_error, sizeof(e->last_error),
				 "the name is registered by another node (%s)", e->holder);
		else
			snprintf(e->last_error, sizeof(e->last_error), "%s", strerror(-err));
	}
	pthread_mutex_unlock(&e->lock);
	if (!changed || why)
		return; /* a reason given: the caller logged it */
	if (!strcmp(state, "left"))
		return;
	if (!err)
		srv_info("cluster: registered as %s in etcd %s (lease %" PRIu32 " s)", e->key,
			 e->endpoint, e->lease_s);
	else if (err == -EADDRINUSE)
		srv_err("cluster: %s in etcd %s is the record of another node (%s), not this one "
			"(%s:%u): two nodes must not share a node_name; not registered, trying "
			"again when that record goes", e->key, e->endpoint, e->holder, e->address,
			e->port);
	else
		srv_warn("cluster: etcd %s: %s (%s); still serving, retrying every %d ms",
			 e->endpoint, state, strerror(-err), ETCD_RETRY_MS);
}

static void set_state(struct srv_etcd *e, const char *state, int registered, int err)
{
	set_state_why(e, state, registered, err, NULL);
}

/* Is this record (JSON) one of this node's: same address and port? Then
 * it was left by an earlier run of this node whose lease has not ended. */
static int record_is_this_node(const struct srv_etcd *e, const struct kvc_etcd_kv *kv,
			       char *holder, size_t cap)
{
	struct json_object *o = json_tokener_parse((const char *)kv->value), *a, *p;
	const char *addr = "?";
	int port = 0, same;

	if (o && json_object_object_get_ex(o, "address", &a))
		addr = json_object_get_string(a);
	if (o && json_object_object_get_ex(o, "port", &p))
		port = json_object_get_int(p);
	snprintf(holder, cap, "%s:%d", addr ? addr : "?", port);
	same = addr && !strcmp(addr, e->address) && port == (int)e->port;
	json_object_put(o);
	return same;
}

/* Grant a lease if there is none and put the record under it, by
 * compare-and-put. Errors: -EADDRINUSE (another node's record holds the
 * name; e->holder says whose), -EAGAIN (the key kept changing), and those
 * of the etcd calls. */
static int register_once(struct srv_etcd *e)
{
	int rc;

	if (!e->lease) {
		rc = kvc_etcd_lease_grant(e->etcd, e->lease_s, &e->lease);
		if (rc)
			return rc;
	}
	for (int i = 0; i < ETCD_PUT_TRIES; i++) {
		struct kvc_etcd_kv kv;
		int64_t mod = 0;

		rc = kvc_etcd_get(e->etcd, e->key, &kv);
		if (rc && rc != -ENOENT)
			return rc;
		if (rc == 0) {
			char holder[sizeof(e->holder)];
			int mine = kv.lease == e->lease;

			if (!mine && !record_is_this_node(e, &kv, holder, sizeof(holder))) {
				snprintf(e->holder, sizeof(e->holder), "%s", holder);
				kvc_etcd_kv_free(&kv);
				return -EADDRINUSE;
			}
			if (!mine)
				srv_info("cluster: replacing the record an earlier run of this node left "
					 "in etcd (%s)", e->key);
			mod = kv.mod_revision;
			kvc_etcd_kv_free(&kv);
		}
		rc = kvc_etcd_put_if(e->etcd, e->key, e->record, strlen(e->record), e->lease, mod);
		if (rc == -ENOENT)
			e->lease = 0; /* expired between grant and put: start again */
		if (rc != -EEXIST)
			return rc;
	}
	return -EAGAIN;
}

/* Clients use at most this many nodes of a cluster: the first by name
 * (KVCL_MAX_NODES in client/lib/cluster/placement.h; keep them equal). */
#define CLIENT_MAX_NODES 64

/* After registering: warn when the cluster holds more nodes than a client
 * uses, saying whether this node is one that new clients leave out. */
static void warn_if_crowded(struct srv_etcd *e)
{
	char prefix[sizeof(e->key)];
	struct kvc_etcd_kv *kvs = NULL;
	size_t n = 0, before = 0;
	int64_t rev = 0;

	snprintf(prefix, sizeof(prefix), "%.*s", (int)e->prefix_len, e->key);
	if (kvc_etcd_range_prefix(e->etcd, prefix, &kvs, &n, &rev) != 0)
		return;
	for (size_t i = 0; i < n; i++)
		before += strcmp(kvs[i].key, e->key) < 0;
	if (n > CLIENT_MAX_NODES)
		srv_warn("cluster: %zu nodes are registered under %s, more than the %d a client "
			 "uses: clients that connect now use the first %d by name, %s", n, prefix,
			 CLIENT_MAX_NODES, CLIENT_MAX_NODES,
			 before < CLIENT_MAX_NODES ? "this node among them"
						   : "and not this node (it gets no traffic from them)");
	kvc_etcd_kvs_free(kvs, n);
}

/* Is the record still there, under this process's lease? 0 yes;
 * -ENOENT deleted; -ESTALE replaced (another lease); etcd errors. */
static int check_record(struct srv_etcd *e)
{
	struct kvc_etcd_kv kv;
	int rc = kvc_etcd_get(e->etcd, e->key, &kv);

	if (rc)
		return rc;
	rc = kv.lease == e->lease ? 0 : -ESTALE;
	kvc_etcd_kv_free(&kv);
	return rc;
}

static void *registration_thread(void *arg)
{
	struct srv_etcd *e = arg;
	uint64_t renew_ms = e->lease_s * 1000ull / 3, last_ok = 0;

	while (!wait_ms(e, 0)) {
		int rc;

		if (!e->registered) {
			rc = register_once(e);
			if (rc) {
				set_state(e, rc == -EADDRINUSE ? "name in use by another node"
							       : "unreachable", 0, rc);
				wait_ms(e, rc == -EADDRINUSE ? renew_ms : ETCD_RETRY_MS);
				continue;
			}
			last_ok = mono_ms();
			pthread_mutex_lock(&e->lock);
			e->registrations++;
			pthread_mutex_unlock(&e->lock);
			set_state(e, "registered", 1, 0);
			warn_if_crowded(e);
			wait_ms(e, renew_ms);
			continue;
		}
		rc = kvc_etcd_lease_keepalive(e->etcd, e->lease, NULL);
		if (rc == 0) {
			int r = check_record(e);

			if (r == 0) {
				last_ok = mono_ms();
				set_state(e, "registered", 1, 0);
				wait_ms(e, renew_ms);
				continue;
			}
			if (r == -ENOENT || r == -ESTALE) {
				/* The lease lives but the record is gone or is not ours
				 * any more (deleted by hand, or by another node's leave):
				 * write it again (compare-and-put: never over another
				 * node's record). */
				pthread_mutex_lock(&e->lock);
				e->reregistrations++;
				pthread_mutex_unlock(&e->lock);
				srv_warn("cluster: this node's record %s %s in etcd %s while its lease "
					 "lives; registering again", e->key,
					 r == -ESTALE ? "was replaced" : "was deleted", e->endpoint);
				set_state_why(e, "record lost", 0, r,
					      r == -ESTALE ? "the record was replaced while the lease lived"
							   : "the record was deleted while the lease lived");
				continue;
			}
			rc = r; /* etcd failing: not a lost lease */
		}
		if (rc == -ENOENT || mono_ms() - last_ok >= e->lease_s * 1000ull) {
			/* The lease is gone (etcd lost it, or it ran out while
			 * etcd was away): register afresh. */
			e->lease = 0;
			set_state_why(e, "lease expired", 0, rc ? rc : -ETIMEDOUT,
				      rc == -ENOENT ? "etcd no longer has this node's lease"
						    : "the lease ran out while etcd could not be reached");
			srv_warn("cluster: etcd %s: this node's lease is gone (%s); registering "
				 "again", e->endpoint, rc == -ENOENT ? "etcd no longer has it"
								      : "it ran out meanwhile");
			continue;
		}
		set_state(e, "renewal failing", 1, rc);
		wait_ms(e, ETCD_RETRY_MS);
	}
	return NULL;
}

/* The record: what a client needs to reach and weigh this node. */
static char *make_record(const struct srv_etcd_node *n, const char *name, const char *address)
{
	struct json_object *o = json_object_new_object();
	char *s;

	if (!o)
		return NULL;
	json_object_object_add(o, "name", json_object_new_string(name));
	json_object_object_add(o, "address", json_object_new_string(address));
	json_object_object_add(o, "port", json_object_new_int(n->port));
	json_object_object_add(o, "tls", json_object_new_boolean(n->tls));
	json_object_object_add(o, "rdma", json_object_new_boolean(n->rdma));
	json_object_object_add(o, "rdma_port", json_object_new_int(n->rdma ? n->rdma_port : 0));
	json_object_object_add(o, "admin_port", json_object_new_int(n->admin_port));
	json_object_object_add(o, "dram_capacity_bytes",
			       json_object_new_int64((int64_t)n->dram_capacity_bytes));
	json_object_object_add(o, "nvme_capacity_bytes",
			       json_object_new_int64((int64_t)n->nvme_capacity_bytes));
	json_object_object_add(o, "start_epoch_ms", json_object_new_int64((int64_t)time(NULL) * 1000));
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return s;
}

static int is_wildcard(const char *listen)
{
	return !listen[0] || !strcmp(listen, "0.0.0.0") || !strcmp(listen, "::") ||
	       !strcmp(listen, "[::]");
}

/* Is `address` a loopback address (127.0.0.0/8, ::1, "localhost"), or a
 * name that resolves here to loopback addresses only? 1 literal or
 * localhost, 2 a name resolving to loopback, 0 otherwise. */
int srv_etcd_loopback(const char *address)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	struct in6_addr a6;
	struct in_addr a4;
	char buf[256];
	size_t len = strlen(address);
	int loop = 1;

	if (!strcasecmp(address, "localhost") || !strncasecmp(address, "localhost.", 10))
		return 1;
	if (len >= 2 && address[0] == '[' && address[len - 1] == ']' && len - 2 < sizeof(buf)) {
		memcpy(buf, address + 1, len - 2);
		buf[len - 2] = 0;
		address = buf;
	}
	if (inet_pton(AF_INET, address, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, address, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) ||
		       (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	if (getaddrinfo(address, NULL, &hints, &res) != 0 || !res)
		return 0;
	for (struct addrinfo *r = res; r && loop; r = r->ai_next) {
		if (r->ai_family == AF_INET)
			loop = (ntohl(((struct sockaddr_in *)r->ai_addr)->sin_addr.s_addr) >> 24) == 127;
		else if (r->ai_family == AF_INET6)
			loop = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr);
		else
			loop = 0;
	}
	freeaddrinfo(res);
	return loop ? 2 : 0;
}

int srv_etcd_start(const struct srv_etcd_node *n, struct srv_etcd **out)
{
	char cluster[KVC_ETCD_CLUSTER_MAX_BYTES + 1], host[256] = "", name[300], prefix[128];
	const char *address;
	struct srv_etcd *e;
	int rc;

	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	rc = kvc_etcd_url_parse(n->cluster_url, e->endpoint, sizeof(e->endpoint), cluster,
				sizeof(cluster));
	if (rc)
		goto out_free;
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	if (n->node_name && n->node_name[0])
		snprintf(name, sizeof(name), "%s", n->node_name);
	else
		snprintf(name, sizeof(name), "%s:%u", host, n->port);
	address = n->address && n->address[0] ? n->address : is_wildcard(n->listen) ? host : n->listen;
	snprintf(prefix, sizeof(prefix), KVC_ETCD_NODES_FMT, cluster);
	snprintf(e->key, sizeof(e->key), "%s%s", prefix, name);
	e->prefix_len = strlen(prefix);
	snprintf(e->url, sizeof(e->url), "%s", n->cluster_url);
	snprintf(e->address, sizeof(e->address), "%s", address);
	e->port = n->port;
	e->lease_s = n->lease_s ? n->lease_s : 10;
	switch (srv_etcd_loopback(address)) {
	case 1:
		srv_warn("cluster: the advertised address %s is a loopback address: clients on "
			 "other machines cannot reach this node (set advertise_address)", address);
		break;
	case 2:
		srv_warn("cluster: the advertised address %s resolves to a loopback address on "
			 "this machine (e.g. a Debian /etc/hosts line for the host name): clients "
			 "elsewhere may not reach this node; set advertise_address to an address "
			 "they can", address);
		break;
	}
	e->state = "starting";
	e->record = make_record(n, name, address);
	rc = -ENOMEM;
	if (!e->record)
		goto out_free;
	rc = kvc_etcd_open(e->endpoint, ETCD_CALL_TIMEOUT_MS, &e->etcd);
	if (rc)
		goto out_record;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	rc = -pthread_create(&e->thread, NULL, registration_thread, e);
	if (rc)
		goto out_sync;
	srv_info("cluster: registering %s in etcd %s as %s", e->record, e->endpoint, e->key);
	*out = e;
	return 0;
out_sync:
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	kvc_etcd_close(e->etcd);
out_record:
	free(e->record);
out_free:
	free(e);
	return rc;
}

void srv_etcd_leave(struct srv_etcd *e)
{
	int64_t deleted = 0;
	int rc;

	if (!e || !e->etcd)
		return;
	pthread_mutex_lock(&e->lock);
	e->stop = 1;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	pthread_join(e->thread, NULL);
	/* Only the record under this process's lease: another kvpoold using
	 * the same name keeps its own (compare-and-delete, one transaction). */
	rc = e->lease ? kvc_etcd_delete_if_lease(e->etcd, e->key, e->lease, &deleted) : 0;
	if (e->lease)
		kvc_etcd_lease_revoke(e->etcd, e->lease);
	if (rc)
		srv_warn("cluster: could not delete %s from etcd %s (%s); it goes when its lease "
			 "ends", e->key, e->endpoint, strerror(-rc));
	else if (deleted)
		srv_info("cluster: left (deleted %s)", e->key);
	else
		srv_info("cluster: left (%s was not this process's record; left as it is)",
			 e->key);
	kvc_etcd_close(e->etcd);
	e->etcd = NULL;
	set_state(e, "left", 0, 0);
}

void srv_etcd_free(struct srv_etcd *e)
{
	if (!e)
		return;
	if (e->etcd)
		srv_etcd_leave(e);
	pthread_cond_destroy(&e->cond);
	pthread_mutex_destroy(&e->lock);
	free(e->record);
	free(e);
}

char *srv_etcd_json(struct srv_etcd *e)
{
	struct json_object *o;
	char *s;

	if (!e)
		return NULL;
	o = json_object_new_object();
	if (!o)
		return NULL;
	pthread_mutex_lock(&e->lock);
	json_object_object_add(o, "url", json_object_new_string(e->url));
	json_object_object_add(o, "key", json_object_new_string(e->key));
	json_object_object_add(o, "registered", json_object_new_boolean(e->registered));
	json_object_object_add(o, "state", json_object_new_string(e->state));
	json_object_object_add(o, "last_error", json_object_new_string(e->last_error));
	json_object_object_add(o, "registrations", json_object_new_int64((int64_t)e->registrations));
	json_object_object_add(o, "reregistrations",
			       json_object_new_int64((int64_t)e->reregistrations));
	json_object_object_add(o, "failures", json_object_new_int64((int64_t)e->failures));
	{
		char lease[24] = "";

		/* hex, as etcdctl shows it; a string, so no summing tool adds ids */
		if (e->lease_shown)
			snprintf(lease, sizeof(lease), "%" PRIx64, (uint64_t)e->lease_shown);
		json_object_object_add(o, "lease", json_object_new_string(lease));
	}
	json_object_object_add(o, "endpoint", json_object_new_string(e->current));
	json_object_object_add(o, "failovers", json_object_new_int64((int64_t)e->failovers));
	pthread_mutex_unlock(&e->lock);
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return s;
}
