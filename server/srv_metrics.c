/*
 * srv_metrics.c - the Prometheus text of a STATS snapshot.
 */
#include "srv_metrics.h"
#include "srv_events.h"
#include "srv_tenant.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>

#include <event2/buffer.h>

#include "store.h"

/* A text writer over an evbuffer that remembers the first failure, so the
 * families below read straight through. */
struct mw {
	struct evbuffer *out;
	int err;
};

static void mw_printf(struct mw *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mw_printf(struct mw *m, const char *fmt, ...)
{
	va_list ap;

	if (m->err)
		return;
	va_start(ap, fmt);
	if (evbuffer_add_vprintf(m->out, fmt, ap) < 0)
		m->err = -ENOMEM;
	va_end(ap);
}

/* The HELP and TYPE lines that open a family. */
static void family(struct mw *m, const char *name, const char *type, const char *help)
{
	mw_printf(m, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample without labels. */
static void sample(struct mw *m, const char *name, uint64_t v)
{
	mw_printf(m, "%s %" PRIu64 "\n", name, v);
}

/* A family of one unlabelled sample. */
static void single(struct mw *m, const char *name, const char *type, const char *help, uint64_t v)
{
	family(m, name, type, help);
	sample(m, name, v);
}

/* Microseconds as decimal seconds, exactly ("0.000008", "16.777216"). */
static void seconds(struct mw *m, uint64_t us)
{
	mw_printf(m, "%" PRIu64 ".%06" PRIu64, us / 1000000, us % 1000000);
}

/* A label value: backslash, double quote and newline escaped. Namespace
 * names are printable ASCII already; the escaping keeps any name valid. */
static void label_value(struct mw *m, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			mw_printf(m, "\\%c", *s);
		else if (*s == '\n')
			mw_printf(m, "\\n");
		else
			mw_printf(m, "%c", *s);
	}
}

/* ---- server and tiers ---------------------------------------------------- */

static void write_server(struct mw *m, const struct srv_stats_doc *d)
{
	family(m, "kvpool_build_info", "gauge", "Always 1; labels name the server and protocol version.");
	mw_printf(m, "kvpool_build_info{version=\"");
	label_value(m, d->version);
	mw_printf(m, "\",protocol=\"%d\"} 1\n", d->protocol);
	single(m, "kvpool_uptime_seconds", "gauge", "Seconds since kvpoold started.", d->uptime_s);
	single(m, "kvpool_connections", "gauge", "Client connections open now.", d->conn_current);
	single(m, "kvpool_connections_accepted_total", "counter",
	       "Client connections accepted.", d->conn_total);
	single(m, "kvpool_connections_rejected_total", "counter",
	       "Client connections refused at max_connections.", d->conn_rejected);
}

/* tier="dram" always, tier="nvme" only with an NVMe tier. */
static void tier_family(struct mw *m, const struct store_stats *st, const char *name,
			const char *help, uint64_t dram, uint64_t nvme)
{
	family(m, name, "gauge", help);
	mw_printf(m, "%s{tier=\"dram\"} %" PRIu64 "\n", name, dram);
	if (st->nvme_enabled)
		mw_printf(m, "%s{tier=\"nvme\"} %" PRIu64 "\n", name, nvme);
}

static void write_tiers(struct mw *m, const struct store_stats *st)
{
	tier_family(m, st, "kvpool_tier_capacity_bytes", "Bytes the tier may hold.",
		    st->capacity_bytes, st->nvme_capacity_bytes);
	tier_family(m, st, "kvpool_tier_used_bytes",
		    "Bytes of the tier in use (DRAM: committed blocks in 4 KiB pages; NVMe: segments).",
		    st->used_bytes, st->nvme_used_bytes);
	tier_family(m, st, "kvpool_tier_payload_bytes", "Payload bytes of the blocks with a copy in the tier.",
		    st->payload_bytes, st->nvme_payload_bytes);
	tier_family(m, st, "kvpool_tier_blocks", "Blocks with a copy in the tier.", st->dram_blocks,
		    st->nvme_blocks);
	single(m, "kvpool_dram_free_bytes", "gauge", "Free bytes of the DRAM arena.", st->free_bytes);
	single(m, "kvpool_dram_largest_free_bytes", "gauge",
	       "Largest contiguous free extent of the DRAM arena.", st->largest_free_bytes);
	family(m, "kvpool_dram_fragmentation_ratio", "gauge",
	       "1 - largest free extent / free bytes of the DRAM arena.");
	mw_printf(m, "kvpool_dram_fragmentation_ratio %.6f\n", st->fragmentation);
	single(m, "kvpool_dram_inflight_put_bytes", "gauge",
	       "DRAM bytes reserved by PUTs whose payload is still arriving.", st->inflight_put_bytes);
	single(m, "kvpool_dram_evict_passes_total", "counter",
	       "Passes that evicted or dropped DRAM copies to make room for a put or a promotion.",
	       st->evict_passes);
	family(m, "kvpool_dram_evict_pass_max_seconds", "gauge",
	       "Longest such pass since start, measured under the store lock.");
	mw_printf(m, "kvpool_dram_evict_pass_max_seconds ");
	seconds(m, st->evict_pass_max_us);
	mw_printf(m, "\n");
	single(m, "kvpool_blocks", "gauge", "Visible blocks in either tier, each once.", st->blocks);
	single(m, "kvpool_index_bytes", "gauge", "Memory of the index and block headers.", st->index_bytes);
	single(m, "kvpool_namespaces", "gauge", "Namespaces held now.", st->namespaces);
	single(m, "kvpool_evictions_total", "counter", "Blocks dropped from the pool to make room (either tier).",
	       st->evictions);
	single(m, "kvpool_leases_active", "gauge", "Lease pins held now (MATCH with a lease).",
	       st->leases_active);
	single(m, "kvpool_checksum_errors_total", "counter", "PUT blocks whose payload failed its checksum.",
	       st->checksum_errors);
}

/* The NVMe tier's families; kvpool_nvme_enabled always, the rest only
 * with a tier (a series that can never move would only clutter). */
static void write_nvme(struct mw *m, const struct store_stats *st)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} fams[] = {
#define NV(n, t, h, f) { "kvpool_nvme_" n, t, h, offsetof(struct store_stats, f) }
		NV("segment_bytes", "gauge", "Bytes of one segment file.", nvme_segment_bytes),
		NV("demotions_total", "counter", "Blocks written from DRAM to NVMe.", demotions),
		NV("demoted_bytes_total", "counter", "Payload bytes written from DRAM to NVMe.", demoted_bytes),
		NV("promotions_total", "counter", "Blocks read back from NVMe into DRAM by a GET.", promotions),
		NV("promoted_bytes_total", "counter", "Payload bytes read back into DRAM.", promoted_bytes),
		NV("written_bytes_total", "counter", "Segment bytes written (demotions and rewrites).",
		   nvme_bytes_written),
		NV("read_bytes_total", "counter", "Segment bytes read.", nvme_bytes_read),
		NV("rewritten_bytes_total", "counter", "Bytes copied forward by segment reclaim.",
		   rewritten_bytes),
		NV("segments_reclaimed_total", "counter", "Segments reclaimed.", segments_reclaimed),
		NV("admission_rejections_total", "counter",
		   "Blocks evicted from DRAM instead of demoted (nvme_admission).", admission_rejections),
		NV("evictions_total", "counter", "Blocks dropped from NVMe to make room.", nvme_evictions),
		NV("corrupt_blocks_total", "counter", "NVMe copies that failed their checksum.",
		   corrupt_blocks),
		NV("read_errors_total", "counter", "Failed NVMe reads.", nvme_read_errors),
		NV("write_errors_total", "counter", "Failed NVMe writes.", nvme_write_errors),
		NV("rebuild_blocks", "gauge", "Blocks made matchable again by the start-up rebuild.",
		   rebuild_blocks),
		NV("rebuild_orphans_dropped", "gauge",
		   "Blocks the start-up rebuild dropped: an ancestor did not survive.", orphans_dropped),
		NV("rebuild_truncated", "gauge",
		   "Blocks the start-up rebuild dropped: their segment file was missing or cut short.",
		   rebuild_truncated),
		NV("index_records_lost", "gauge",
		   "Index log records lost to damage at start (the index was moved aside).",
		   index_records_lost),
		NV("index_quarantined", "gauge",
		   "1 when a damaged index was moved aside at start (the tier started empty).",
		   index_quarantined),
#undef NV
	};

	single(m, "kvpool_nvme_enabled", "gauge", "1 with an NVMe tier (nvme_dir set), else 0.",
	       st->nvme_enabled);
	if (!st->nvme_enabled)
		return;
	single(m, "kvpool_nvme_healthy", "gauge", "0 while writes to the NVMe tier fail.", st->nvme_healthy);
	single(m, "kvpool_nvme_direct_io", "gauge", "1 when segment files use O_DIRECT.",
	       st->nvme_direct_io);
	for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++)
		single(m, fams[i].name, fams[i].type, fams[i].help,
		       *(const uint64_t *)((const char *)st + fams[i].off));
	family(m, "kvpool_nvme_rebuild_seconds", "gauge", "Time the start-up index rebuild took.");
	mw_printf(m, "kvpool_nvme_rebuild_seconds ");
	seconds(m, st->rebuild_ms * 1000);
	mw_printf(m, "\n");
}

/* ---- operations ---------------------------------------------------------- */

/* A family with one sample per label value: label=values[i] -> c[idx[i]]. */
static void labelled(struct mw *m, const char *name, const char *help, const char *label,
		     const char *const *values, const enum srv_counter *idx, int n, const uint64_t *c)
{
	family(m, name, "counter", help);
	for (int i = 0; i < n; i++)
		mw_printf(m, "%s{%s=\"%s\"} %" PRIu64 "\n", name, label, values[i], c[idx[i]]);
}

static void write_ops(struct mw *m, const uint64_t *c)
{
	static const char *const ops[] = { "put", "get", "exists", "match", "delete", "ping", "stats" };
	static const enum srv_counter op_c[] = {
		SRV_C_put_requests, SRV_C_get_requests, SRV_C_exists_requests, SRV_C_match_requests,
		SRV_C_delete_requests, SRV_C_ping_requests, SRV_C_stats_requests,
	};
	static const char *const put_r[] = { "ok", "exists", "error" };
	static const enum srv_counter put_c[] = { SRV_C_put_ok, SRV_C_put_exists, SRV_C_put_errors };
	static const char *const hm[] = { "hit", "miss" };
	static const enum srv_counter get_c[] = { SRV_C_get_hits, SRV_C_get_misses };
	static const enum srv_counter ex_c[] = { SRV_C_exists_hits, SRV_C_exists_misses };
	static const char *const err[] = { "bad_request", "too_large", "busy", "full" };
	static const enum srv_counter err_c[] = {
		SRV_C_errors_bad_request, SRV_C_errors_too_large, SRV_C_errors_busy, SRV_C_errors_full,
	};

	labelled(m, "kvpool_requests_total", "Requests received, by operation.", "op", ops, op_c, 7, c);
	single(m, "kvpool_put_blocks_total", "counter", "Blocks in PUT requests.", c[SRV_C_put_blocks]);
	labelled(m, "kvpool_put_results_total", "PUT block results: stored, already there, refused.",
		 "result", put_r, put_c, 3, c);
	single(m, "kvpool_put_payload_bytes_total", "counter",
	       "Payload bytes of PUT blocks that got a result (bytes in).", c[SRV_C_put_bytes]);
	labelled(m, "kvpool_get_blocks_total", "GET blocks found (hit) or not (miss).", "result", hm,
		 get_c, 2, c);
	single(m, "kvpool_get_payload_bytes_total", "counter",
	       "Payload bytes sent in GET replies (bytes out).", c[SRV_C_get_bytes]);
	labelled(m, "kvpool_exists_blocks_total", "EXISTS blocks found (hit) or not (miss).", "result",
		 hm, ex_c, 2, c);
	single(m, "kvpool_match_blocks_queried_total", "counter", "Blocks asked about by MATCH.",
	       c[SRV_C_match_blocks_queried]);
	single(m, "kvpool_match_blocks_matched_total", "counter",
	       "Leading blocks MATCH found held (prefix hits).", c[SRV_C_match_blocks_matched]);
	single(m, "kvpool_delete_blocks_total", "counter", "Blocks removed by DELETE (descendants included).",
	       c[SRV_C_delete_blocks]);
	labelled(m, "kvpool_errors_total", "Error results, by status.", "status", err, err_c, 4, c);
	single(m, "kvpool_rdma_connections", "gauge", "RDMA connections open now.",
	       c[SRV_C_rdma_conns_current]);
	single(m, "kvpool_rdma_connections_total", "counter", "RDMA connections accepted.",
	       c[SRV_C_rdma_conns_total]);
	single(m, "kvpool_rdma_read_bytes_total", "counter",
	       "Bytes pulled from clients by RDMA READ (PUT).", c[SRV_C_rdma_bytes_read]);
	single(m, "kvpool_rdma_written_bytes_total", "counter",
	       "Bytes pushed to clients by RDMA WRITE (GET).", c[SRV_C_rdma_bytes_written]);
	single(m, "kvpool_rdma_transfer_errors_total", "counter",
	       "RDMA READ or WRITE transfers that failed (the connection closed).",
	       c[SRV_C_rdma_xfer_errors]);
}

uint64_t srv_metrics_hist_below(const struct srv_hist *h, uint64_t bound_us)
{
	uint64_t n = 0;

	for (unsigned i = 0; i < SRV_HIST_BUCKETS; i++) {
		if (srv_hist_bucket_max(i) >= bound_us)
			break;
		n += h->buckets[i];
	}
	return n;
}

/* One histogram per operation: cumulative buckets, +Inf, sum, count. The
 * count is the sum of the buckets (srv_hist_merge keeps them equal). */
static void write_latency(struct mw *m, const struct srv_stats *s)
{
	static const char *const names[SRV_LAT_COUNT] = { "put", "get", "exists", "match" };
	const char *fam = "kvpool_request_duration_seconds";

	family(m, fam, "histogram",
	       "Server-side request latency, from request received to reply queued.");
	for (int op = 0; op < SRV_LAT_COUNT; op++) {
		const struct srv_hist *h = &s->lat[op];

		for (unsigned k = SRV_METRICS_LE_MIN_SHIFT; k <= SRV_METRICS_LE_MAX_SHIFT; k++) {
			mw_printf(m, "%s_bucket{op=\"%s\",le=\"", fam, names[op]);
			seconds(m, 1ull << k);
			mw_printf(m, "\"} %" PRIu64 "\n", srv_metrics_hist_below(h, 1ull << k));
		}
		mw_printf(m, "%s_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", fam, names[op], h->count);
		mw_printf(m, "%s_sum{op=\"%s\"} ", fam, names[op]);
		seconds(m, h->sum_us);
		mw_printf(m, "\n%s_count{op=\"%s\"} %" PRIu64 "\n", fam, names[op], h->count);
	}
}

/* MATCHes that wait for blocks: how many wait now, how their waits
 * ended, and the wake-up latency (the commit of the block that completed
 * the run to the reply queued) as a histogram. */
static void write_match_waits(struct mw *m, const struct srv_stats_doc *d)
{
	static const char *const ends[] = { "complete", "timeout", "refused", "ended" };
	static const enum srv_counter end_c[] = {
		SRV_C_match_waits_complete, SRV_C_match_waits_timeout, SRV_C_match_waits_refused,
		SRV_C_match_waits_ended,
	};
	const struct srv_hist *h = &d->ops->match_wake;
	const uint64_t *c = d->ops->c;
	const char *fam = "kvpool_match_wake_seconds";

	single(m, "kvpool_match_waiting", "gauge", "MATCHes waiting for blocks now.",
	       d->match_waiting);
	single(m, "kvpool_match_wait_bytes", "gauge",
	       "Memory the waiting MATCHes hold now (their keys and records; bounded by "
	       "max_match_wait_bytes).", d->match_wait_bytes);
	single(m, "kvpool_match_waits_total", "counter",
	       "MATCHes that waited for blocks (parked).", c[SRV_C_match_waits_started]);
	labelled(m, "kvpool_match_wait_results_total",
		 "MATCHes that asked to wait, by how the wait ended: complete (a PUT completed the "
		 "run), timeout (wait_ms passed), refused (a waiting limit: answered at once), ended "
		 "(the server ended it: namespace dropped, grant changed, shutdown).",
		 "result", ends, end_c, 4, c);
	single(m, "kvpool_match_wait_clamped_total", "counter",
	       "MATCHes whose wait_ms was cut to max_match_wait_ms.", c[SRV_C_match_waits_clamped]);
	family(m, fam, "histogram",
	       "Waiting MATCH wake-up latency: from the commit of the block that completed the run "
	       "to the reply queued.");
	for (unsigned k = SRV_METRICS_LE_MIN_SHIFT; k <= SRV_METRICS_LE_MAX_SHIFT; k++) {
		mw_printf(m, "%s_bucket{le=\"", fam);
		seconds(m, 1ull << k);
		mw_printf(m, "\"} %" PRIu64 "\n", srv_metrics_hist_below(h, 1ull << k));
	}
	mw_printf(m, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", fam, h->count);
	mw_printf(m, "%s_sum ", fam);
	seconds(m, h->sum_us);
	mw_printf(m, "\n%s_count %" PRIu64 "\n", fam, h->count);
}

/* ---- namespaces ----------------------------------------------------------- */

/* One per-namespace family: the field at `off` of each namespace, with an
 * extra label (e.g. result="hit") when extra is not NULL. Families that
 * share a name (hit and miss) are written by consecutive calls, the
 * first with help. */
static void ns_series(struct mw *m, const struct srv_stats_doc *d, const char *name, size_t off,
		      const char *extra)
{
	for (uint32_t i = 0; i < d->ns_count; i++) {
		mw_printf(m, "%s{namespace=\"", name);
		label_value(m, d->ns[i].name);
		mw_printf(m, "\"%s%s} %" PRIu64 "\n", extra ? "," : "", extra ? extra : "",
			  *(const uint64_t *)((const char *)&d->ns[i] + off));
	}
}

static void write_namespaces(struct mw *m, const struct srv_stats_doc *d)
{
	static const struct {
		const char *name, *type, *help, *extra;
		size_t off;
	} fams[] = {
#define NS(n, t, h, e, f) { "kvpool_namespace_" n, t, h, e, offsetof(struct store_ns_stats, f) }
		NS("blocks", "gauge", "Visible blocks of the namespace (either tier).", NULL, blocks),
		NS("nvme_blocks", "gauge", "Blocks of the namespace with an NVMe copy.", NULL, nvme_blocks),
		NS("payload_bytes", "gauge", "Payload bytes of the namespace's blocks.", NULL, bytes),
		NS("put_results_total", "counter", "PUT block results of the namespace.", "result=\"ok\"",
		   puts),
		NS("put_results_total", NULL, NULL, "result=\"exists\"", put_exists),
		NS("put_results_total", NULL, NULL, "result=\"error\"", put_errors),
		NS("get_blocks_total", "counter", "GET blocks of the namespace found or not.",
		   "result=\"hit\"", get_hits),
		NS("get_blocks_total", NULL, NULL, "result=\"miss\"", get_misses),
		NS("exists_blocks_total", "counter", "EXISTS blocks of the namespace found or not.",
		   "result=\"hit\"", exists_hits),
		NS("exists_blocks_total", NULL, NULL, "result=\"miss\"", exists_misses),
		NS("match_requests_total", "counter", "MATCH requests in the namespace.", NULL,
		   match_requests),
		NS("match_blocks_queried_total", "counter", "Blocks asked about by MATCH in the namespace.",
		   NULL, match_blocks_queried),
		NS("match_blocks_matched_total", "counter", "Leading blocks MATCH found held in the namespace.",
		   NULL, match_blocks_matched),
		NS("evictions_total", "counter", "Blocks of the namespace dropped to make room.", NULL, evictions),
		NS("deleted_blocks_total", "counter", "Blocks of the namespace removed by DELETE.", NULL,
		   deletes),
		NS("retained_blocks", "gauge", "Blocks of the namespace retained now.", NULL,
		   retained_blocks),
		NS("retained_bytes", "gauge", "Payload bytes of the namespace retained now.", NULL,
		   retained_bytes),
		NS("retain_budget_bytes", "gauge",
		   "Retention budget that bounds the namespace (its tenant's, shared, with a tokens "
		   "file).", NULL, retain_budget_bytes),
		NS("retain_refused_total", "counter",
		   "Blocks of the namespace whose retention the budget refused.", NULL,
		   retain_refused),
		NS("retain_expired_total", "counter", "Retentions of the namespace that ran out.", NULL,
		   retain_expired),
#undef NS
	};

	for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
		if (fams[i].help)
			family(m, fams[i].name, fams[i].type, fams[i].help);
		ns_series(m, d, fams[i].name, fams[i].off, fams[i].extra);
	}
}

/* Retention, pool-wide. */
static void write_retention(struct mw *m, const struct srv_stats_doc *d)
{
	const struct store_stats *st = d->store;

	single(m, "kvpool_retained_blocks", "gauge", "Blocks retained now (not evicted before "
	       "their deadline).", st->retained_blocks);
	single(m, "kvpool_retained_bytes", "gauge", "Payload bytes of the blocks retained now.",
	       st->retained_bytes);
	single(m, "kvpool_retain_refused_total", "counter",
	       "Blocks whose retention a budget refused (stored without it).", st->retain_refused);
	single(m, "kvpool_retain_expired_total", "counter",
	       "Retentions that ran out (the block became ordinary again).", st->retain_expired);
	single(m, "kvpool_max_retained_bytes", "gauge",
	       "The retention budget of a namespace, or of a tenant whose token sets none.",
	       d->max_retained_bytes);
}

/* Each tenant's retention (with a tokens file): label tenant = the head
 * of its token's SHA-256 digest. */
static void write_tenants(struct mw *m, const struct srv_stats_doc *d)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} fams[] = {
#define TN(n, t, h, f) { "kvpool_tenant_" n, t, h, offsetof(struct store_retain_stats, f) }
		TN("retained_blocks", "gauge", "Blocks the tenant's namespaces retain now.", blocks),
		TN("retained_bytes", "gauge", "Payload bytes the tenant's namespaces retain now.", bytes),
		TN("retain_budget_bytes", "gauge", "The tenant's retention budget.", budget_bytes),
		TN("retain_refused_total", "counter",
		   "Blocks of the tenant whose retention its budget refused.", refused),
		TN("retain_expired_total", "counter", "Retentions of the tenant that ran out.", expired),
#undef TN
	};

	if (!d->tenants_on)
		return;
	for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
		family(m, fams[f].name, fams[f].type, fams[f].help);
		for (uint32_t i = 0; i < d->tenant_count; i++)
			mw_printf(m, "%s{tenant=\"%s\"} %" PRIu64 "\n", fams[f].name,
				  d->tenants[i].id,
				  *(const uint64_t *)((const char *)&d->tenants[i].retain +
						      fams[f].off));
	}
}

/* The KV-event publisher's counters; none when events are off. */
static void write_events(struct mw *m, const struct srv_events_stats *e)
{
	if (!e)
		return;
	single(m, "kvpool_kv_events_produced_total", "counter",
	       "KV events the pool reported to the publisher.", e->produced);
	single(m, "kvpool_kv_events_published_total", "counter",
	       "KV events sent in a batch on the PUB socket.", e->published);
	single(m, "kvpool_kv_events_dropped_total", "counter",
	       "KV events dropped because the publisher's queue was full.", e->dropped);
	single(m, "kvpool_kv_events_batches_total", "counter",
	       "KV-event batches sent (the next sequence number).", e->batches);
	single(m, "kvpool_kv_events_resync_batches_total", "counter",
	       "KV-event batches flagged for resynchronisation after drops.", e->resync_batches);
	single(m, "kvpool_kv_events_replay_requests_total", "counter",
	       "KV-event replay requests served.", e->replay_requests);
	single(m, "kvpool_kv_events_replayed_batches_total", "counter",
	       "KV-event batches sent in replay answers.", e->replayed_batches);
}

/* TLS on the data port; none when it is off. */
static void write_tls(struct mw *m, const struct srv_stats_doc *d)
{
	const uint64_t *c = d->ops->c;

	if (!d->tls)
		return;
	single(m, "kvpool_tls_connections", "gauge", "TLS connections open now.",
	       c[SRV_C_tls_conns_current]);
	single(m, "kvpool_tls_connections_total", "counter", "TLS handshakes completed.",
	       c[SRV_C_tls_conns_total]);
	single(m, "kvpool_tls_handshake_errors_total", "counter",
	       "TLS handshakes that failed (certificate refused, bad bytes, no shared cipher).",
	       c[SRV_C_tls_handshake_errors]);
	single(m, "kvpool_tls_kernel_send_connections_total", "counter",
	       "TLS connections whose kernel encrypts what they send (kernel TLS).",
	       c[SRV_C_tls_ktls_send]);
	single(m, "kvpool_tls_kernel_recv_connections_total", "counter",
	       "TLS connections whose kernel decrypts what they receive (kernel TLS).",
	       c[SRV_C_tls_ktls_recv]);
	single(m, "kvpool_tls_plaintext_refused_total", "counter",
	       "Plaintext connections refused by tls_only.", c[SRV_C_tls_plaintext_refused]);
	single(m, "kvpool_tls_plaintext_tokens_refused_total", "counter",
	       "HELLOs refused for a token sent in plaintext from a non-loopback peer.",
	       c[SRV_C_tls_token_refused]);
}

int srv_metrics_write(const struct srv_stats_doc *doc, struct evbuffer *out)
{
	struct mw m = { .out = out, .err = 0 };

	write_server(&m, doc);
	write_tiers(&m, doc->store);
	write_nvme(&m, doc->store);
	write_ops(&m, doc->ops->c);
	write_latency(&m, doc->ops);
	write_match_waits(&m, doc);
	write_namespaces(&m, doc);
	write_retention(&m, doc);
	write_tenants(&m, doc);
	write_events(&m, doc->events);
	write_tls(&m, doc);
	return m.err;
}
