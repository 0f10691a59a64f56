/*
 * membership.c - who the nodes of a cluster handle are: a static list
 * from the URL, or etcd's kvpool/<cluster>/nodes/ prefix, read at connect
 * and then followed by a watch thread. Each node gets its thread
 * (nodes.c) when it is first seen.
 *
 * The watch thread (one per cluster handle, documented in kvpool.h):
 * watches the prefix from the revision it read, applies each PUT (a node
 * joins or its address changes) and DELETE (it leaves: its segments become
 * misses) under cl->lock, and bumps cl->epoch. When the stream drops
 * (etcd stopped, network), the handle keeps the last membership, says
 * "etcd unreachable" in its stats, and starts the watch again from the
 * revision after the last event it applied (resume: nothing is missed)
 * every 500 ms; a compacted revision makes it read the prefix afresh.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int kvcl_static_members(struct kvcl *cl, const char *list)
{
	char scheme[16] = "tcp://", item[300], url[320], name[300];
	const char *p = list;
	int rc = 0;

	while (*p) {
		size_t len = strcspn(p, ",");
		struct kvc_url u;
		struct kvcl_node *n;
		const char *sep;

		if (len == 0 || len >= sizeof(item))
			return -EINVAL;
		memcpy(item, p, len);
		item[len] = 0;
		sep = strstr(item, "://");
		if (sep) {
			if ((size_t)(sep - item) + 3 >= sizeof(scheme))
				return -EINVAL;
			snprintf(scheme, sizeof(scheme), "%.*s", (int)(sep - item) + 3, item);
			memcpy(url, item, len + 1);
		} else if (strlen(scheme) + len < sizeof(url)) {
			memcpy(url, scheme, strlen(scheme));
			memcpy(url + strlen(scheme), item, len + 1);
		} else {
			return -EINVAL;
		}
		rc = kvc_url_parse(url, &u);
		if (rc)
			return rc;
		snprintf(name, sizeof(name), strchr(u.host, ':') ? "[%s]:%u" : "%s:%u", u.host,
			 u.port);
		pthread_mutex_lock(&cl->lock);
		n = kvcl_node_get_locked(cl, name);
		if (n) {
			snprintf(n->url, sizeof(n->url), "%s", url);
			n->member = 1;
		}
		pthread_mutex_unlock(&cl->lock);
		if (!n)
			return cl->n_nodes == KVCL_MAX_NODES ? -E2BIG : -ENOMEM;
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
	if (record_url(kv->value, kv->value_len, url, sizeof(url)))
		return 0; /* a record we cannot use: as if absent */
	n = kvcl_node_get_locked(cl, name);
	if (!n)
		return 0;
	snprintf(n->record, sizeof(n->record), "%s", (const char *)kv->value);
	if (strcmp(n->url, url) != 0) {
		if (n->url[0])
			n->url_changed = 1;
		snprintf(n->url, sizeof(n->url), "%s", url);
	}
	if (n->member)
		return 0;
	n->member = 1;
	n->retry_at_ms = 0; /* a node that (re)joins is tried at once */
	return 1;
}

/* Replace the membership with what a read of the prefix returned. */
static void apply_all(struct kvcl *cl, const struct kvc_etcd_kv *kvs, size_t n, int64_t rev)
{
	unsigned char was[KVCL_MAX_NODES];
	int changed = 0;

	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++) {
		was[i] = (unsigned char)cl->nodes[i]->member;
		cl->nodes[i]->member = 0;
	}
	for (size_t i = 0; i < n; i++)
		apply_locked(cl, KVC_ETCD_PUT, &kvs[i]);
	for (size_t i = 0; i < cl->n_nodes; i++)
		changed |= i >= KVCL_MAX_NODES || was[i] != cl->nodes[i]->member;
	if (changed)
		cl->epoch++;
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
		if (apply_locked(cl, type, kv))
			cl->epoch++;
		if (kv->mod_revision > cl->etcd_revision)
			cl->etcd_revision = kv->mod_revision;
	}
	pthread_mutex_unlock(&cl->lock);
	return 0;
}

static void pause_ms(struct kvcl *cl, int ms)
{
	struct timespec ts = { 0, 50 * 1000000L };

	for (int t = 0; t < ms && !cl->stop; t += 50)
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
	while (!cl->stop) {
		int64_t next = from;
		int rc = kvc_etcd_watch_prefix(e, cl->prefix, from, on_event, cl, &cl->stop, &next);

		if (cl->stop)
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
			while (!cl->stop && read_all(cl, e) != 0)
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
	rc = -pthread_create(&cl->watch_thread, NULL, watch_thread, cl);
	if (rc == 0)
		cl->has_watch = 1;
	return rc;
}

void kvcl_etcd_stop(struct kvcl *cl)
{
	if (!cl->has_watch)
		return;
	cl->stop = 1;
	pthread_join(cl->watch_thread, NULL);
	cl->has_watch = 0;
}
