/*
 * srv_snapshot.h - one reading of everything the STATS document shows:
 * the counters and histograms summed over every worker, the store's
 * figures and its namespaces. The STATS opcode (srv_request.c) and the
 * admin HTTP server (srv_admin.c: /stats and /metrics) render the same
 * snapshot, so they cannot disagree about what a counter means.
 *
 * Threads: any thread, once the workers run and the store is open (the
 * workers' counters are read with relaxed atomics; store calls lock
 * inside the store). A snapshot is not an exact cut across counters
 * while requests are in flight.
 */
#ifndef KVPOOL_SRV_SNAPSHOT_H
#define KVPOOL_SRV_SNAPSHOT_H

#include <stdint.h>

#include "srv_events.h"
#include "srv_stats.h"
#include "store.h"

struct srv;

struct srv_snapshot {
	struct srv_stats ops;         /* summed over workers */
	struct store_stats store;
	struct store_ns_stats *ns;    /* doc.ns_count of them */
	char *settings;               /* srv_settings_json; NULL if out of memory */
	struct srv_events_stats events; /* KV-event counters (doc.events; NULL when off) */
	char *cluster;                /* srv_etcd_json; NULL when standalone */
	struct srv_tenant_stats *tenants; /* doc.tenant_count; NULL without a tokens file */
	struct srv_stats_doc doc;     /* what srv_stats_json renders; points
				       * into this snapshot */
};

/* Take a snapshot of server s. name[0..len) picks one namespace (len 0:
 * all of them; a name that does not exist gives none, and is never
 * created). *out is heap-allocated; free it with srv_snapshot_free.
 * Errors: -ENOMEM. */
int srv_snapshot_take(struct srv *s, const char *name, uint16_t len, struct srv_snapshot **out);

/* Free a snapshot. Accepts NULL. */
void srv_snapshot_free(struct srv_snapshot *snap);

#endif /* KVPOOL_SRV_SNAPSHOT_H */
