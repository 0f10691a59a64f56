/*
 * srv_stats.h - kvpoold's request counters and latency histograms, and the
 * STATS reply document (JSON).
 *
 * Counters are declared once, in SRV_COUNTERS; each worker thread owns one
 * struct srv_stats and is its only writer. STATS sums every worker's copy
 * (srv_stats_sum) and renders it with the store's figures (srv_stats_json).
 * The JSON keys are fixed: the CLI and the replay tool read them.
 */
#ifndef KVPOOL_SRV_STATS_H
#define KVPOOL_SRV_STATS_H

#include <stdint.h>

#include "srv_hist.h"
#include "store.h"

struct evbuffer;

/* X(name): one counter each, rendered under "ops" in the JSON; the rdma_
 * ones under "rdma" and the tls_ ones under "tls" (*_conns_current go down
 * too: they wrap as unsigned and sum right over workers). */
#define SRV_COUNTERS(X)                                                         \
	X(put_requests) X(put_blocks) X(put_ok) X(put_exists) X(put_errors)     \
	X(put_bytes)                                                            \
	X(get_requests) X(get_hits) X(get_misses) X(get_bytes)                 \
	X(exists_requests) X(exists_hits) X(exists_misses)                     \
	X(match_requests) X(match_blocks_queried) X(match_blocks_matched)      \
	X(match_waits_started) X(match_waits_complete) X(match_waits_timeout)  \
	X(match_waits_refused) X(match_waits_ended) X(match_waits_clamped)     \
	X(match_waits_refused_bytes)                                           \
	X(delete_requests) X(delete_blocks)                                    \
	X(ping_requests) X(stats_requests)                                     \
	X(errors_bad_request) X(errors_too_large) X(errors_busy) X(errors_full) \
	X(rdma_conns_current) X(rdma_conns_total) X(rdma_bytes_read)            \
	X(rdma_bytes_written) X(rdma_xfer_errors)                              \
	X(tls_conns_current) X(tls_conns_total) X(tls_handshake_errors)        \
	X(tls_ktls_send) X(tls_ktls_recv) X(tls_plaintext_refused)             \
	X(tls_token_refused)

enum srv_counter {
#define SRV_COUNTER_ENUM(name) SRV_C_##name,
	SRV_COUNTERS(SRV_COUNTER_ENUM)
#undef SRV_COUNTER_ENUM
	SRV_C_COUNT
};

/* Operations with a latency histogram, from request fully received to
 * reply queued. */
enum srv_lat_op { SRV_LAT_PUT, SRV_LAT_GET, SRV_LAT_EXISTS, SRV_LAT_MATCH, SRV_LAT_COUNT };

struct srv_stats {
	uint64_t c[SRV_C_COUNT];
	struct srv_hist lat[SRV_LAT_COUNT];
	/* MATCHes that waited and were completed by a PUT: from the commit
	 * of the block that completed the run to the reply queued */
	struct srv_hist match_wake;
};

/* Add n to counter c. Only the owning thread may call it (relaxed atomic
 * store, no locked instruction). */
static inline void srv_stats_add(struct srv_stats *s, enum srv_counter c, uint64_t n)
{
	__atomic_store_n(&s->c[c], __atomic_load_n(&s->c[c], __ATOMIC_RELAXED) + n,
			 __ATOMIC_RELAXED);
}

/* Count a non-success status (enum proto_status) in the "errors" group:
 * BAD_REQUEST, TOO_LARGE, BUSY and FULL each have a counter; other
 * statuses are not counted there. Owning thread only. */
void srv_stats_count_status(struct srv_stats *s, uint16_t status);

/* Add every counter and histogram of src (owned by another thread, read
 * with relaxed atomics) into dst (private to the caller). */
void srv_stats_sum(struct srv_stats *dst, const struct srv_stats *src);

/* Everything the STATS document shows. All pointers are borrowed for the
 * duration of srv_stats_json. */
struct srv_rdma_state;
struct srv_events_stats;
struct srv_tenant_stats;

struct srv_stats_doc {
	const char *version;          /* server version, e.g. "0.1.0" */
	int protocol;                 /* wire protocol version */
	long pid;
	uint64_t uptime_s;
	uint64_t conn_current, conn_total, conn_rejected;
	const struct srv_stats *ops;  /* summed over workers */
	const struct store_stats *store;
	const struct store_ns_stats *ns; /* ns_count namespaces to list */
	uint32_t ns_count;
	const struct srv_rdma_state *transport_rdma; /* "rdma" object; NULL leaves it out */
	const struct srv_events_stats *events; /* "kv_events" object; NULL (events off)
						* leaves it out */
	int tls;                      /* TLS on the data port: the "tls" object */
	int tls_only;                 /* plaintext is refused (tls_only in force) */
	const char *settings;         /* the effective settings as a JSON object
				       * (conf_json), shown as "settings"; NULL
				       * leaves the key out */
	uint64_t match_waiting;       /* MATCHes waiting for blocks now */
	uint64_t match_wait_bytes;    /* what they hold (max_match_wait_bytes) */
	const char *cluster;          /* etcd registration state as a JSON object
				       * (srv_etcd_json), shown as "cluster"; NULL
				       * (standalone) leaves the key out */
	/* retention: the settings in force (max_retained_bytes resolved) */
	uint32_t max_retain_ms;
	uint64_t max_retained_bytes;
	int tenants_on;               /* 1: show "tenants" (a tokens file is in use) */
	const struct srv_tenant_stats *tenants; /* tenant_count of them */
	uint32_t tenant_count;
};

/* Append the STATS JSON document (compact, one line, keys as in
 * PROTOCOL.md) to out. Namespace names are escaped as JSON strings.
 * Errors: -ENOMEM (the evbuffer could not grow). */
int srv_stats_json(const struct srv_stats_doc *doc, struct evbuffer *out);

#endif /* KVPOOL_SRV_STATS_H */
