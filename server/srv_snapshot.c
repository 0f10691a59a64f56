/*
 * srv_snapshot.c - gather the STATS figures of a running server.
 */
#include "srv_snapshot.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "srv_clock.h"
#include "srv_etcd.h"
#include "srv_lifecycle.h"
#include "srv_mwait.h"
#include "srv_server.h"
#include "srv_tenant.h"
#include "srv_worker.h"

/* Find a namespace by name without creating it (a STATS of a name nobody
 * said HELLO to must not use up the namespace cap). Returns 0 and *ns
 * (its stats, including ns_id), or -ENOENT. */
static int ns_find(struct store *st, const char *name, uint16_t len, struct store_ns_stats *ns)
{
	struct store_ns_stats n;
	uint32_t ns_id;
	int rc = store_namespace_find(st, name, len, &ns_id);

	if (rc < 0)
		return rc;
	/* Namespaces are numbered in creation order from 1: try its slot
	 * first, and check it, before looking through them all. */
	if (store_ns_stats(st, ns_id - 1, &n) == 0 && n.ns_id == ns_id) {
		*ns = n;
		return 0;
	}
	for (uint32_t i = 0; store_ns_stats(st, i, &n) == 0; i++) {
		if (n.ns_id == ns_id) {
			*ns = n;
			return 0;
		}
	}
	return -ENOENT;
}

/* Collect the namespaces to show: all, or the one called name (none if it
 * does not exist). *out is malloc'd. Errors: -ENOMEM. */
static int snapshot_namespaces(struct store *st, const char *name, uint16_t len,
			       struct store_ns_stats **out, uint32_t *count)
{
	struct store_stats ss;
	struct store_ns_stats *ns;
	uint32_t n = 0;

	store_stats(st, &ss);
	ns = calloc(ss.namespaces ? ss.namespaces : 1, sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	if (len) {
		if (ns_find(st, name, len, &ns[0]) == 0)
			n = 1;
	} else {
		/* Namespaces created since store_stats are left for next time. */
		while (n < ss.namespaces && store_ns_stats(st, n, &ns[n]) == 0)
			n++;
	}
	*out = ns;
	*count = n;
	return 0;
}

int srv_snapshot_take(struct srv *s, const char *name, uint16_t len, struct srv_snapshot **out)
{
	struct srv_snapshot *snap = calloc(1, sizeof(*snap));
	struct srv_stats_doc *doc;

	if (!snap)
		return -ENOMEM;
	doc = &snap->doc;
	if (snapshot_namespaces(s->store, name, len, &snap->ns, &doc->ns_count) < 0) {
		free(snap);
		return -ENOMEM;
	}
	store_stats(s->store, &snap->store);
	for (uint32_t i = 0; i < s->n_workers; i++)
		srv_stats_sum(&snap->ops, &s->workers[i].stats);
	doc->version = SRV_VERSION;
	doc->protocol = PROTO_VERSION_MAX; /* the highest version it speaks */
	doc->pid = (long)getpid();
	doc->uptime_s = (srv_now_ms() - s->start_ms) / 1000;
	doc->conn_current = __atomic_load_n(&s->conn_current, __ATOMIC_RELAXED);
	doc->conn_total = __atomic_load_n(&s->conn_total, __ATOMIC_RELAXED);
	doc->conn_rejected = __atomic_load_n(&s->conn_rejected, __ATOMIC_RELAXED);
	doc->ops = &snap->ops;
	doc->match_waiting = srv_mwait_waiting(s->mwait);
	doc->match_wait_bytes = srv_mwait_bytes(s->mwait);
	doc->store = &snap->store;
	doc->ns = snap->ns;
	doc->transport_rdma = &s->rdma;
	doc->tls = s->tls != NULL;
	doc->tls_only = s->tls_only;
	if (s->kv_events) {
		srv_events_stats(s->kv_events, &snap->events);
		doc->events = &snap->events;
	}
	snap->settings = srv_settings_json(s);
	doc->settings = snap->settings;
	snap->cluster = srv_etcd_json(s->etcd);
	doc->cluster = snap->cluster;
	doc->max_retain_ms = s->conf.max_retain_ms;
	doc->max_retained_bytes = s->conf.max_retained_bytes ? s->conf.max_retained_bytes
							     : s->conf.dram_capacity_bytes / 4;
	/* with a tokens file, every tenant (an empty object before the
	 * first HELLO); out of memory leaves them out */
	if (s->tenants && srv_tenants_stats(s->tenants, s->store, &snap->tenants,
					    &doc->tenant_count) == 0)
		doc->tenants_on = 1;
	doc->tenants = snap->tenants;
	*out = snap;
	return 0;
}

void srv_snapshot_free(struct srv_snapshot *snap)
{
	if (!snap)
		return;
	free(snap->ns);
	free(snap->settings);
	free(snap->cluster);
	free(snap->tenants);
	free(snap);
}
