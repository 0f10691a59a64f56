/*
 * srv_etcd.c - keep this node's record in etcd (see srv_etcd.h), with
 * libkvpool's etcd client (etcd/etcd.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "srv_etcd.h"
#include "srv_log.h"

#define ETCD_CALL_TIMEOUT_MS 1000 /* each call to etcd */
#define ETCD_RETRY_MS 1000        /* wait after a failed call */

struct srv_etcd {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stop;                     /* under lock */
	struct kvc_etcd *etcd;        /* used by the thread, then by stop */
	char url[256];
	char endpoint[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];
	char key[512];
	char *record;                 /* the JSON value */
	uint32_t lease_s;
	int64_t lease;                /* thread, then stop */
	/* state, under lock */
	int registered;
	const char *state;            /* "starting", "registered", "unreachable", ... */
	char last_error[128];
	uint64_t registrations, failures;
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
static void set_state(struct srv_etcd *e, const char *state, int registered, int err)
{
	int changed;

	pthread_mutex_lock(&e->lock);
	changed = e->state != state;
	e->state = state;
	e->registered = registered;
	if (err) {
		e->failures++;
		snprintf(e->last_error, sizeof(e->last_error), "%s", strerror(-err));
	}
	pthread_mutex_unlock(&e->lock);
	if (!changed)
		return;
	if (!strcmp(state, "left"))
		return;
	if (!err)
		srv_info("cluster: registered as %s in etcd %s (lease %" PRIu32 " s)", e->key,
			 e->endpoint, e->lease_s);
	else
		srv_warn("cluster: etcd %s: %s (%s); still serving, retrying every %d ms",
			 e->endpoint, state, err ? strerror(-err) : "", ETCD_RETRY_MS);
}

/* Grant a lease and put the record under it. */
static int register_once(struct srv_etcd *e)
{
	int rc;

	if (!e->lease) {
		rc = kvc_etcd_lease_grant(e->etcd, e->lease_s, &e->lease);
		if (rc)
			return rc;
	}
	rc = kvc_etcd_put(e->etcd, e->key, e->record, strlen(e->record), e->lease);
	if (rc == -ENOENT)
		e->lease = 0; /* expired between grant and put: start again */
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
				set_state(e, "unreachable", 0, rc);
				wait_ms(e, ETCD_RETRY_MS);
				continue;
			}
			last_ok = mono_ms();
			pthread_mutex_lock(&e->lock);
			e->registrations++;
			pthread_mutex_unlock(&e->lock);
			set_state(e, "registered", 1, 0);
			wait_ms(e, renew_ms);
			continue;
		}
		rc = kvc_etcd_lease_keepalive(e->etcd, e->lease, NULL);
		if (rc == 0) {
			last_ok = mono_ms();
			set_state(e, "registered", 1, 0);
			wait_ms(e, renew_ms);
			continue;
		}
		if (rc == -ENOENT || mono_ms() - last_ok >= e->lease_s * 1000ull) {
			/* The lease is gone (etcd lost it, or it ran out while
			 * etcd was away): register afresh. */
			e->lease = 0;
			set_state(e, "lease expired", 0, rc);
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
	snprintf(e->url, sizeof(e->url), "%s", n->cluster_url);
	e->lease_s = n->lease_s ? n->lease_s : 10;
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
	int rc;

	if (!e || !e->etcd)
		return;
	pthread_mutex_lock(&e->lock);
	e->stop = 1;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	pthread_join(e->thread, NULL);
	rc = kvc_etcd_delete(e->etcd, e->key, NULL);
	if (e->lease)
		kvc_etcd_lease_revoke(e->etcd, e->lease);
	if (rc)
		srv_warn("cluster: could not delete %s from etcd %s (%s); it goes when its lease "
			 "ends", e->key, e->endpoint, strerror(-rc));
	else
		srv_info("cluster: left (deleted %s)", e->key);
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
	json_object_object_add(o, "failures", json_object_new_int64((int64_t)e->failures));
	pthread_mutex_unlock(&e->lock);
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return s;
}
