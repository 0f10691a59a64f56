/*
 * membership.c - who the nodes of a cluster handle are: a static list
 * from the URL, or etcd's kvpool/<cluster>/nodes/ prefix, read at connect
 * and then followed by a watch thread. Each node gets its thread
 * (nodes.c) when it is first seen.
 *
 * The watch thread (one per cluster handle, documented in kvpool.h):
 * watches the prefix from the revision it read, applies each PUT (a node
 * joins or its address changes) and DELETE (it leaves: its blocks go to the
 * next nodes by score, asked at it no more) under cl->lock, and bumps
 * cl->epoch. When the stream drops
 * (etcd stopped, network), the handle keeps the last membership, says
 * "etcd unreachable" in its stats, and starts the watch again from the
 * revision after the last event it applied (resume: nothing is missed)
 * every 500 ms; a compacted revision, or a store behind that revision
 * (etcd wiped or replaced), makes it read the prefix afresh.
 *
 * A handle uses at most KVCL_MAX_NODES nodes: a list longer than that is
 * refused at connect (-E2BIG). Of an etcd prefix holding more, a handle
 * uses the first KVCL_MAX_NODES by name (etcd's key order, the same for
 * every handle that connects at one time); a node past them, or
 * registered later past the limit, is not used and the stats say so
 * (cluster.ignored_nodes, cluster.error). A static list must use one scheme for all its nodes and
 * name each node once: the same host:port twice, or two spellings of one
 * address (localhost:7470 and 127.0.0.1:7470), are refused (-EINVAL), and
 * so is an unspecified address (0.0.0.0, ::), which reaches this machine
 * under a name no other client could share.
 */
#include <errno.h>
#include <json-c/json.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cluster_impl.h"
#include "lib/hrw.h"
#include "lib/url.h"

#define WATCH_RETRY_MS 500

struct kvcl_node *kvcl_node_get_locked(struct kvcl *cl, const char *name)
{
	struct kvcl_node *n;

	for (size_t i = 0; i < cl->n_nodes; i++)
		if (strcmp(cl->nodes[i]->name, name) == 0)
			return cl->nodes[i];
	if (cl->n_nodes == KVCL_MAX_NODES || strlen(name) > KVCL_NAME_MAX_BYTES)
		return NULL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->cl = cl;
	snprintf(n->name, sizeof(n->name), "%s", name);
	n->seed = kvc_hrw_node_seed(name);
	n->wake_fd = -1;
	if (kvcl_node_start(n) != 0) {
		free(n);
		return NULL;
	}
	cl->nodes[cl->n_nodes++] = n;
	return n;
}

/* ---- static lists --------------------------------------------------------- */

/* The addresses host:port resolves to (numeric, sorted into out), to
 * tell two spellings of one node apart. Returns how many (0: does not
 * resolve here; then only the spelling can be compared). */
static size_t node_addresses(const char *host, uint16_t port, struct sockaddr_storage *out,
			     size_t cap)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	char svc[8];
	size_t n = 0;

	snprintf(svc, sizeof(svc), "%u", port);
	if (getaddrinfo(host, svc, &hints, &res) != 0)
		return 0;
	for (struct addrinfo *r = res; r && n < cap; r = r->ai_next) {
		memset(&out[n], 0, sizeof(out[n]));
		memcpy(&out[n], r->ai_addr, r->ai_addrlen);
		n++;
	}
	freeaddrinfo(res);
	return n;
}

static int same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return 0;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;

		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	if (a->ss_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;

		return x->sin6_port == y->sin6_port &&
		       !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr));
	}
	return 0;
}

/* 0.0.0.0 or ::, a listening address: connecting to it reaches this
 * machine, under a name no other machine's client can share. */
static int unspecified_address(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
		       htonl(INADDR_ANY);
	if (a->ss_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)(const void *)a)
						->sin6_addr);
	return 0;
}

#define ADDRS_PER_NODE 4
#define ITEM_BYTES 300
#define URL_BYTES 320
#define SCHEME_BYTES 16

static int static_members(struct kvcl *cl, const char *list, char *scheme, char *item, char *url,
			  char *name, struct sockaddr_storage (*addr)[ADDRS_PER_NODE],
			  size_t *n_addr, size_t *countp);

int kvcl_static_members(struct kvcl *cl, const char *list)
{
	char scheme[SCHEME_BYTES] = "tcp://", item[ITEM_BYTES], url[URL_BYTES], name[ITEM_BYTES];
	struct sockaddr_storage (*addr)[ADDRS_PER_NODE] = calloc(KVCL_MAX_NODES, sizeof(*addr));
	size_t n_addr[KVCL_MAX_NODES], count = 0;
	int rc;

	if (!addr)
		return -ENOMEM;
	rc = static_members(cl, list, scheme, item, url, name, addr, n_addr, &count);
	free(addr);
	return rc;
}

static int static_members(struct kvcl *cl, const char *list, char *scheme, char *item, char *url,
			  char *name, struct sockaddr_storage (*addr)[ADDRS_PER_NODE],
			  size_t *n_addr, size_t *countp)
{
	const char *p = list;
	size_t count = *countp;
	int rc = 0;

	while (*p) {
		size_t len = strcspn(p, ",");
		struct kvc_url u;
		struct kvcl_node *n;
		const char *sep;

		if (len == 0 || len >= ITEM_BYTES)
			return -EINVAL;
		if (count == KVCL_MAX_NODES)
			return -E2BIG;
		memcpy(item, p, len);
		item[len] = 0;
		sep = strstr(item, "://");
		if (sep) {
			size_t sl = (size_t)(sep - item) + 3;

			if (sl >= SCHEME_BYTES)
				return -EINVAL;
			/* one scheme for the whole list: tcp://a,rdma://b is refused */
			if (count && (strlen(scheme) != sl || strncmp(scheme, item, sl) != 0))
				return -EINVAL;
			snprintf(scheme, SCHEME_BYTES, "%.*s", (int)sl, item);
			memcpy(url, item, len + 1);
		} else if (strlen(scheme) + len < URL_BYTES) {
			memcpy(url, scheme, strlen(scheme));
			memcpy(url + strlen(scheme), item, len + 1);
		} else {
			return -EINVAL;
		}
		rc = kvc_url_parse(url, &u);
		if (rc)
			return rc;
		snprintf(name, ITEM_BYTES, strchr(u.host, ':') ? "[%s]:%u" : "%s:%u", u.host,
			 u.port);
		/* the same node twice, as written or as resolved */
		n_addr[count] = node_addresses(u.host, u.port, addr[count], ADDRS_PER_NODE);
		for (size_t a = 0; a < n_addr[count]; a++)
			if (unspecified_address(&addr[count][a]))
				return -EINVAL;
		for (size_t i = 0; i < cl->n_nodes; i++)
			if (strcasecmp(cl->nodes[i]->name, name) == 0)
				return -EINVAL;
		for (size_t i = 0; i < count; i++)
			for (size_t a = 0; a < n_addr[i]; a++)
				for (size_t b = 0; b < n_addr[count]; b++)
					if (same_address(&addr[i][a], &addr[count][b]))
						return -EINVAL;
		pthread_mutex_lock(&cl->lock);
		n = kvcl_node_get_locked(cl, name);
		if (n) {
			snprintf(n->url, sizeof(n->url), "%s", url);
			n->member = 1;
		}
		pthread_mutex_unlock(&cl->lock);
		if (!n)
			return cl->n_nodes == KVCL_MAX_NODES ? -E2BIG : -ENOMEM;
		count++;
		*countp = count;
		p += len;
		if (*p == ',') {
			p++;
			if (!*p)
				return -EINVAL; /* a trailing comma */
		}
	}
	return cl->n_nodes ? 0 : -EINVAL;
}

/* ---- etcd ------------------------------------------------------------------- */

/* The client URL of a node record: tcp://ADDRESS:PORT, or tls://... when
 * the node says it serves TLS ("tls": true). */
static int record_url(const uint8_t *value, size_t len, char *url, size_t cap)
{
	struct json_object *o = json_tokener_parse((const char *)value), *a, *p, *t;
	const char *addr, *scheme;
	int port, rc = -EPROTO;
	struct kvc_url u;

	(void)len;
	if (!o)
		return -EPROTO;
	scheme = json_object_object_get_ex(o, "tls", &t) && json_object_get_boolean(t) ? "tls" :
										      "tcp";
	if (json_object_object_get_ex(o, "address", &a) && json_object_object_get_ex(o, "port", &p)) {
		addr = json_object_get_string(a);
		port = json_object_get_int(p);
		if (addr && *addr && port > 0 && port < 65536) {
			snprintf(url, cap, strchr(addr, ':') && addr[0] != '[' ? "%s://[%s]:%d"
										: "%s://%s:%d",
				 scheme, addr, port);
			rc = kvc_url_parse(url, &u);
		}
	}
	json_object_put(o);
	return rc;
}

/* The record's start_epoch_ms (when the node registered, wall clock ms),
 * 0 when absent or not a positive number. */
static uint64_t record_registered_ms(const uint8_t *value)
{
	struct json_object *o = json_tokener_parse((const char *)value), *t;
	int64_t ms = 0;

	if (!o)
		return 0;
	if (json_object_object_get_ex(o, "start_epoch_ms", &t) &&
	    json_object_is_type(t, json_type_int))
		ms = json_object_get_int64(t);
	json_object_put(o);
	return ms > 0 ? (uint64_t)ms : 0;
}

/* Apply one node record (PUT) or its removal (DELETE). Under cl->lock.
 * Returns 1 when the membership changed. */
static int apply_locked(struct kvcl *cl, enum kvc_etcd_event type, const struct kvc_etcd_kv *kv)
{
	const char *name = kv->key + strlen(cl->prefix);
	char url[320];
	struct kvcl_node *n;

	if (strncmp(kv->key, cl->prefix, strlen(cl->prefix)) != 0 || !*name)
		return 0;
	if (type == KVC_ETCD_DELETE) {
		for (size_t i = 0; i < cl->n_nodes; i++)
			if (strcmp(cl->nodes[i]->name, name) == 0 && cl->nodes[i]->member) {
				cl->nodes[i]->member = 0;
				return 1;
			}
		return 0;
	}
	if (record_url(kv->value, kv->value_len, url, URL_BYTES))
		return 0; /* a record we cannot use: as if absent */
	n = kvcl_node_get_locked(cl, name);
	if (!n) {
		/* past KVCL_MAX_NODES: not used, and said so in the stats */
		cl->ignored_nodes++;
		snprintf(cl->ignored_name, sizeof(cl->ignored_name), "%.*s", KVCL_NAME_MAX_BYTES,
			 name);
		return 0;
	}
	snprintf(n->record, sizeof(n->record), "%s", (const char *)kv->value);
	n->registered_ms = record_registered_ms(kv->value);
	if (strcmp(n->url, url) != 0) {
		if (n->url[0])
			n->url_changed = 1;
		snprintf(n->url, sizeof(n->url), "%s", url);
	}
	if (n->member)
		return 0;
	n->member = 1;
	kvcl_node_up_locked(n); /* a node that (re)joins is used at once */
	return 1;
}

/* Replace the membership with what a read of the prefix returned. */
static void apply_all(struct kvcl *cl, const struct kvc_etcd_kv *kvs, size_t n, int64_t rev)
{
	unsigned char was[KVCL_MAX_NODES];
	int changed = 0;

	pthread_mutex_lock(&cl->lock);
	cl->ignored_nodes = 0;
	for (size_t i = 0; i < cl->n_nodes; i++) {
		was[i] = (unsigned char)cl->nodes[i]->member;
		cl->nodes[i]->member = 0;
	}
	for (size_t i = 0; i < n; i++)
		apply_locked(cl, KVC_ETCD_PUT, &kvs[i]);
	for (size_t i = 0; i < cl->n_nodes; i++)
		changed |= i >= KVCL_MAX_NODES || was[i] != cl->nodes[i]->member;
	if (changed) {
		cl->epoch++;
		kvcl_waits_follow_locked(cl);
	}
	cl->etcd_revision = rev;
	cl->etcd_reachable = 1;
	pthread_mutex_unlock(&cl->lock);
}

static int on_event(void *arg, enum kvc_etcd_event type, const struct kvc_etcd_kv *kv)
{
	struct kvcl *cl = arg;

	pthread_mutex_lock(&cl->lock);
	if (type == KVC_ETCD_WATCHING) {
		cl->etcd_reachable = 1;
		cl->etcd_error[0] = 0;
	} else {
		if (apply_locked(cl, type, kv)) {
			cl->epoch++;
			kvcl_waits_follow_locked(cl);
		}
		if (kv->mod_revision > cl->etcd_revision)
			cl->etcd_revision = kv->mod_revision;
	}
	pthread_mutex_unlock(&cl->lock);
	return 0;
}

/* The watch thread's stop flag (set by kvcl_etcd_stop). */
static int stopping(struct kvcl *cl)
{
	return __atomic_load_n(&cl->stop, __ATOMIC_ACQUIRE);
}

static void pause_ms(struct kvcl *cl, int ms)
{
	struct timespec ts = { 0, 50 * 1000000L };

	for (int t = 0; t < ms && !stopping(cl); t += 50)
		nanosleep(&ts, NULL);
}

/* Read the prefix and apply it. */
static int read_all(struct kvcl *cl, struct kvc_etcd *e)
{
	struct kvc_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t rev = 0;
	int rc = kvc_etcd_range_prefix(e, cl->prefix, &kvs, &n, &rev);

	if (rc == 0)
		apply_all(cl, kvs, n, rev);
	kvc_etcd_kvs_free(kvs, n);
	return rc;
}

static void *watch_thread(void *arg)
{
	struct kvcl *cl = arg;
	struct kvc_etcd *e = NULL;
	int64_t from;

	if (kvc_etcd_open(cl->endpoint, KVCL_ETCD_TIMEOUT_MS, &e))
		return NULL;
	pthread_mutex_lock(&cl->lock);
	from = cl->etcd_revision + 1;
	pthread_mutex_unlock(&cl->lock);
	while (!stopping(cl)) {
		int64_t next = from;
		int rc = kvc_etcd_watch_prefix(e, cl->prefix, from, on_event, cl, &cl->stop, &next);

		if (stopping(cl))
			break;
		pthread_mutex_lock(&cl->lock);
		cl->etcd_reachable = 0;
		cl->etcd_failures++;
		snprintf(cl->etcd_error, sizeof(cl->etcd_error), "%s", kvpool_strerror(rc));
		pthread_mutex_unlock(&cl->lock);
		from = next;
		pause_ms(cl, WATCH_RETRY_MS);
		if (rc == -ESTALE) {
			/* compacted: read everything again, watch from there */
			while (!stopping(cl) && read_all(cl, e) != 0)
				pause_ms(cl, WATCH_RETRY_MS);
			pthread_mutex_lock(&cl->lock);
			from = cl->etcd_revision + 1;
			pthread_mutex_unlock(&cl->lock);
		}
		pthread_mutex_lock(&cl->lock);
		cl->etcd_resumes++;
		pthread_mutex_unlock(&cl->lock);
	}
	kvc_etcd_close(e);
	return NULL;
}

int kvcl_etcd_start(struct kvcl *cl)
{
	struct kvc_etcd *e = NULL;
	int rc;

	snprintf(cl->prefix, sizeof(cl->prefix), KVC_ETCD_NODES_FMT, cl->cluster);
	rc = kvc_etcd_open(cl->endpoint, KVCL_ETCD_TIMEOUT_MS, &e);
	if (rc)
		return rc;
	rc = read_all(cl, e);
	kvc_etcd_close(e);
	if (rc)
		return rc;
	/* More registered nodes than a handle uses: the first KVCL_MAX_NODES
	 * in etcd's key order (the node names' byte order) are used, by every
	 * handle that connects now alike, and the stats name the rest. Refusing
	 * would lock out every new client, and the tools that diagnose it. */
	rc = -pthread_create(&cl->watch_thread, NULL, watch_thread, cl);
	if (rc == 0)
		cl->has_watch = 1;
	return rc;
}

void kvcl_etcd_stop(struct kvcl *cl)
{
	if (!cl->has_watch)
		return;
	__atomic_store_n(&cl->stop, 1, __ATOMIC_RELEASE);
	pthread_join(cl->watch_thread, NULL);
	cl->has_watch = 0;
}
