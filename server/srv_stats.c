/*
 * srv_stats.c - per-worker counters, their sum, and the STATS JSON writer.
 */
#include "srv_stats.h"
#include "srv_tenant.h"
#include "srv_events.h"
#include "srv_rdma.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include <event2/buffer.h>

#include "proto.h"

void srv_stats_count_status(struct srv_stats *s, uint16_t status)
{
	switch (status) {
	case PROTO_STATUS_BAD_REQUEST:
		srv_stats_add(s, SRV_C_errors_bad_request, 1);
		break;
	case PROTO_STATUS_TOO_LARGE:
		srv_stats_add(s, SRV_C_errors_too_large, 1);
		break;
	case PROTO_STATUS_BUSY:
		srv_stats_add(s, SRV_C_errors_busy, 1);
		break;
	case PROTO_STATUS_FULL:
		srv_stats_add(s, SRV_C_errors_full, 1);
		break;
	default:
		break;
	}
}

void srv_stats_sum(struct srv_stats *dst, const struct srv_stats *src)
{
	for (int i = 0; i < SRV_C_COUNT; i++)
		dst->c[i] += __atomic_load_n(&src->c[i], __ATOMIC_RELAXED);
	for (int i = 0; i < SRV_LAT_COUNT; i++)
		srv_hist_merge(&dst->lat[i], &src->lat[i]);
	srv_hist_merge(&dst->match_wake, &src->match_wake);
}

/* A JSON writer over an evbuffer that remembers the first failure, so the
 * document code reads straight through without an error check per line. */
struct jw {
	struct evbuffer *out;
	int err;
};

static void jw_printf(struct jw *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jw_printf(struct jw *j, const char *fmt, ...)
{
	va_list ap;

	if (j->err)
		return;
	va_start(ap, fmt);
	if (evbuffer_add_vprintf(j->out, fmt, ap) < 0)
		j->err = -ENOMEM;
	va_end(ap);
}

/* A JSON string: quotes and backslashes escaped, bytes outside printable
 * ASCII as \u00XX (names are validated ASCII; this is belt and braces). */
static void jw_string(struct jw *j, const char *s)
{
	jw_printf(j, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			jw_printf(j, "\\%c", *p);
		else if (*p < 0x20 || *p > 0x7e)
			jw_printf(j, "\\u%04x", *p);
		else
			jw_printf(j, "%c", *p);
	}
	jw_printf(j, "\"");
}

/* A ratio rendered as a JSON number; 0 when the denominator is 0. */
static double ratio(uint64_t num, uint64_t den)
{
	return den ? (double)num / (double)den : 0.0;
}

static void json_connections(struct jw *j, const struct srv_stats_doc *d)
{
	jw_printf(j, "\"connections\":{\"current\":%" PRIu64 ",\"total\":%" PRIu64 ",\"rejected\":%" PRIu64 "},",
		  d->conn_current, d->conn_total, d->conn_rejected);
}

/* tiers.nvme: {"enabled":false} without the tier, else every figure. */
static void json_nvme(struct jw *j, const struct store_stats *st)
{
	if (!st->nvme_enabled) {
		jw_printf(j, "\"nvme\":{\"enabled\":false}");
		return;
	}
	jw_printf(j,
		  "\"nvme\":{\"enabled\":true,\"direct_io\":%s,\"healthy\":%s,"
		  "\"capacity_bytes\":%" PRIu64 ",\"segment_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64 ","
		  "\"payload_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64 ",",
		  st->nvme_direct_io ? "true" : "false", st->nvme_healthy ? "true" : "false",
		  st->nvme_capacity_bytes, st->nvme_segment_bytes, st->nvme_used_bytes,
		  st->nvme_payload_bytes, st->nvme_blocks);
	jw_printf(j,
		  "\"demotions\":%" PRIu64 ",\"demoted_bytes\":%" PRIu64 ",\"promotions\":%" PRIu64 ","
		  "\"promoted_bytes\":%" PRIu64 ",\"bytes_written\":%" PRIu64 ",\"bytes_read\":%" PRIu64 ","
		  "\"rewritten_bytes\":%" PRIu64 ",\"segments_reclaimed\":%" PRIu64 ","
		  "\"admission_rejections\":%" PRIu64 ",\"evictions\":%" PRIu64 ",",
		  st->demotions, st->demoted_bytes, st->promotions, st->promoted_bytes,
		  st->nvme_bytes_written, st->nvme_bytes_read, st->rewritten_bytes,
		  st->segments_reclaimed, st->admission_rejections, st->nvme_evictions);
	jw_printf(j,
		  "\"corrupt_blocks\":%" PRIu64 ",\"read_errors\":%" PRIu64 ",\"write_errors\":%" PRIu64 ","
		  "\"rebuild_ms\":%" PRIu64 ",\"rebuild_blocks\":%" PRIu64 ",\"orphans_dropped\":%" PRIu64 ","
		  "\"rebuild_truncated\":%" PRIu64 ","
		  "\"index_records_lost\":%" PRIu64 ",\"index_quarantined\":%" PRIu64 "}",
		  st->corrupt_blocks, st->nvme_read_errors, st->nvme_write_errors, st->rebuild_ms,
		  st->rebuild_blocks, st->orphans_dropped, st->rebuild_truncated,
		  st->index_records_lost, st->index_quarantined);
}

static void json_store(struct jw *j, const struct store_stats *st)
{
	/* tiers.dram.blocks: blocks with a DRAM copy; "blocks" (top level,
	 * after latency_us) counts both tiers. */
	jw_printf(j,
		  "\"tiers\":{\"dram\":{\"capacity_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64 ","
		  "\"payload_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64 ",\"largest_free_bytes\":%" PRIu64 ","
		  "\"fragmentation\":%.6f,\"blocks\":%" PRIu64 ",\"inflight_put_bytes\":%" PRIu64 ","
		  "\"evict_passes\":%" PRIu64 ",\"evict_pass_max_us\":%" PRIu64 "},",
		  st->capacity_bytes, st->used_bytes, st->payload_bytes, st->free_bytes,
		  st->largest_free_bytes, st->fragmentation, st->dram_blocks, st->inflight_put_bytes,
		  st->evict_passes, st->evict_pass_max_us);
	json_nvme(j, st);
	jw_printf(j, "},");
	jw_printf(j,
		  "\"index_bytes\":%" PRIu64 ",\"evictions\":%" PRIu64 ",\"leases_active\":%" PRIu64 ","
		  "\"checksum_errors\":%" PRIu64 ",",
		  st->index_bytes, st->evictions, st->leases_active, st->checksum_errors);
}

/* "retention": what is retained pool-wide, the settings that bound it. */
static void json_retention(struct jw *j, const struct srv_stats_doc *d)
{
	const struct store_stats *st = d->store;

	jw_printf(j,
		  "\"retention\":{\"retained_blocks\":%" PRIu64 ",\"retained_bytes\":%" PRIu64 ","
		  "\"refused\":%" PRIu64 ",\"expired\":%" PRIu64 ",\"max_retain_ms\":%" PRIu32 ","
		  "\"max_retained_bytes\":%" PRIu64 "},",
		  st->retained_blocks, st->retained_bytes, st->retain_refused, st->retain_expired,
		  d->max_retain_ms, d->max_retained_bytes);
}

/* "tenants": each tenant's billing and retention (with a tokens file). */
static void json_tenants(struct jw *j, const struct srv_stats_doc *d)
{
	jw_printf(j, "\"tenants\":{");
	for (uint32_t i = 0; i < d->tenant_count; i++) {
		const struct store_retain_stats *r = &d->tenants[i].retain;

		jw_printf(j, "%s", i ? "," : "");
		jw_string(j, d->tenants[i].id);
		jw_printf(j,
			  ":{\"billed_bytes\":%" PRIu64 ",\"leased_bytes\":%" PRIu64 ","
			  "\"namespaces\":%" PRIu32 ","
			  "\"retained_blocks\":%" PRIu64 ",\"retained_bytes\":%" PRIu64 ","
			  "\"retain_budget_bytes\":%" PRIu64 ",\"retain_refused\":%" PRIu64 ","
			  "\"retain_expired\":%" PRIu64 "}",
			  d->tenants[i].billed_bytes, d->tenants[i].leased_bytes,
			  d->tenants[i].namespaces,
			  r->blocks, r->bytes, r->budget_bytes, r->refused, r->expired);
	}
	jw_printf(j, "},");
}

static void json_ops(struct jw *j, const struct srv_stats_doc *d)
{
	const uint64_t *c = d->ops->c;
	const struct srv_hist *wake = &d->ops->match_wake;

	jw_printf(j,
		  "\"ops\":{\"put\":{\"requests\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"ok\":%" PRIu64 ","
		  "\"exists\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"bytes\":%" PRIu64 "},",
		  c[SRV_C_put_requests], c[SRV_C_put_blocks], c[SRV_C_put_ok],
		  c[SRV_C_put_exists], c[SRV_C_put_errors], c[SRV_C_put_bytes]);
	jw_printf(j,
		  "\"get\":{\"requests\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ","
		  "\"bytes\":%" PRIu64 "},",
		  c[SRV_C_get_requests], c[SRV_C_get_hits], c[SRV_C_get_misses], c[SRV_C_get_bytes]);
	jw_printf(j, "\"exists\":{\"requests\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 "},",
		  c[SRV_C_exists_requests], c[SRV_C_exists_hits], c[SRV_C_exists_misses]);
	jw_printf(j,
		  "\"match\":{\"requests\":%" PRIu64 ",\"blocks_queried\":%" PRIu64 ","
		  "\"blocks_matched\":%" PRIu64 ",\"hit_ratio\":%.6f,",
		  c[SRV_C_match_requests], c[SRV_C_match_blocks_queried],
		  c[SRV_C_match_blocks_matched],
		  ratio(c[SRV_C_match_blocks_matched], c[SRV_C_match_blocks_queried]));
	jw_printf(j,
		  "\"waits\":{\"waiting\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"started\":%" PRIu64
		  ",\"complete\":%" PRIu64
		  ",\"timeout\":%" PRIu64 ",\"refused\":%" PRIu64 ",\"refused_bytes\":%" PRIu64
		  ",\"ended\":%" PRIu64
		  ",\"clamped\":%" PRIu64 ",\"wake_us\":{\"p50\":%" PRIu64 ",\"p99\":%" PRIu64
		  ",\"p999\":%" PRIu64 "}}},",
		  d->match_waiting, d->match_wait_bytes, c[SRV_C_match_waits_started],
		  c[SRV_C_match_waits_complete],
		  c[SRV_C_match_waits_timeout], c[SRV_C_match_waits_refused],
		  c[SRV_C_match_waits_refused_bytes],
		  c[SRV_C_match_waits_ended], c[SRV_C_match_waits_clamped],
		  srv_hist_percentile(wake, 0.5), srv_hist_percentile(wake, 0.99),
		  srv_hist_percentile(wake, 0.999));
	jw_printf(j, "\"delete\":{\"requests\":%" PRIu64 ",\"blocks\":%" PRIu64 "},",
		  c[SRV_C_delete_requests], c[SRV_C_delete_blocks]);
	jw_printf(j, "\"ping\":{\"requests\":%" PRIu64 "},\"stats\":{\"requests\":%" PRIu64 "},",
		  c[SRV_C_ping_requests], c[SRV_C_stats_requests]);
	jw_printf(j,
		  "\"errors\":{\"bad_request\":%" PRIu64 ",\"too_large\":%" PRIu64 ",\"busy\":%" PRIu64 ","
		  "\"full\":%" PRIu64 "}},",
		  c[SRV_C_errors_bad_request], c[SRV_C_errors_too_large], c[SRV_C_errors_busy],
		  c[SRV_C_errors_full]);
}

static void json_latency(struct jw *j, const struct srv_stats *s)
{
	static const char *const names[SRV_LAT_COUNT] = { "put", "get", "exists", "match" };

	jw_printf(j, "\"latency_us\":{");
	for (int i = 0; i < SRV_LAT_COUNT; i++) {
		const struct srv_hist *h = &s->lat[i];

		jw_printf(j, "%s\"%s\":{\"p50\":%" PRIu64 ",\"p99\":%" PRIu64 ",\"p999\":%" PRIu64 "}", i ? "," : "",
			  names[i], srv_hist_percentile(h, 0.5), srv_hist_percentile(h, 0.99),
			  srv_hist_percentile(h, 0.999));
	}
	jw_printf(j, "},");
}

static void json_namespace(struct jw *j, const struct store_ns_stats *n)
{
	jw_string(j, n->name);
	jw_printf(j,
		  ":{\"blocks\":%" PRIu64 ",\"nvme_blocks\":%" PRIu64 ",\"bytes\":%" PRIu64 ","
		  "\"puts\":%" PRIu64 ",\"put_exists\":%" PRIu64 ","
		  "\"put_errors\":%" PRIu64 ",\"get_hits\":%" PRIu64 ",\"get_misses\":%" PRIu64 ",",
		  n->blocks, n->nvme_blocks, n->bytes, n->puts, n->put_exists, n->put_errors,
		  n->get_hits, n->get_misses);
	jw_printf(j,
		  "\"exists_hits\":%" PRIu64 ",\"exists_misses\":%" PRIu64 ",\"match_requests\":%" PRIu64 ","
		  "\"match_blocks_queried\":%" PRIu64 ",\"match_blocks_matched\":%" PRIu64 ","
		  "\"match_hit_ratio\":%.6f,\"evictions\":%" PRIu64 ",\"deletes\":%" PRIu64 ",",
		  n->exists_hits, n->exists_misses, n->match_requests, n->match_blocks_queried,
		  n->match_blocks_matched, ratio(n->match_blocks_matched, n->match_blocks_queried),
		  n->evictions, n->deletes);
	jw_printf(j,
		  "\"retained_blocks\":%" PRIu64 ",\"retained_bytes\":%" PRIu64 ","
		  "\"retain_budget_bytes\":%" PRIu64 ",\"retain_budget_of\":\"%s\","
		  "\"retain_refused\":%" PRIu64 ",\"retain_expired\":%" PRIu64 "}",
		  n->retained_blocks, n->retained_bytes, n->retain_budget_bytes,
		  n->retain_tenant ? "tenant" : "namespace", n->retain_refused, n->retain_expired);
}

/* "rdma": whether the transport is built and served, on which port, and
 * why not. */
static void json_rdma(struct jw *j, const struct srv_rdma_state *r, const uint64_t *c)
{
	jw_printf(j, "\"rdma\":{\"built\":%s,\"available\":%s,\"port\":%u,\"reason\":",
		  r->built ? "true" : "false", r->available ? "true" : "false", r->port);
	jw_string(j, r->reason);
	jw_printf(j,
		  ",\"connections\":{\"current\":%" PRIu64 ",\"total\":%" PRIu64 "},"
		  "\"bytes_read\":%" PRIu64 ",\"bytes_written\":%" PRIu64 ",\"transfer_errors\":%" PRIu64
		  "},", c[SRV_C_rdma_conns_current], c[SRV_C_rdma_conns_total],
		  c[SRV_C_rdma_bytes_read], c[SRV_C_rdma_bytes_written], c[SRV_C_rdma_xfer_errors]);
}

/* "tls": TLS on the data port (srv_tls.h), with its connection counters. */
static void json_tls(struct jw *j, const struct srv_stats_doc *d, const uint64_t *c)
{
	jw_printf(j,
		  "\"tls\":{\"enabled\":true,\"tls_only\":%s,\"connections\":{\"current\":%" PRIu64
		  ",\"total\":%" PRIu64 "},\"handshake_errors\":%" PRIu64 ",\"kernel_tls\":"
		  "{\"send\":%" PRIu64 ",\"recv\":%" PRIu64 "},\"plaintext_refused\":%" PRIu64
		  ",\"plaintext_tokens_refused\":%" PRIu64 "},",
		  d->tls_only ? "true" : "false", c[SRV_C_tls_conns_current], c[SRV_C_tls_conns_total],
		  c[SRV_C_tls_handshake_errors], c[SRV_C_tls_ktls_send], c[SRV_C_tls_ktls_recv],
		  c[SRV_C_tls_plaintext_refused], c[SRV_C_tls_token_refused]);
}

/* "kv_events": the publisher's counters (srv_events.h). */
static void json_events(struct jw *j, const struct srv_events_stats *e)
{
	jw_printf(j,
		  "\"kv_events\":{\"enabled\":true,\"produced\":%" PRIu64 ",\"published\":%" PRIu64
		  ",\"dropped\":%" PRIu64 ",\"queued\":%" PRIu64 ",\"batches\":%" PRIu64
		  ",\"resync_batches\":%" PRIu64 ",\"replay_requests\":%" PRIu64
		  ",\"replayed_batches\":%" PRIu64 ",\"replay_errors\":%" PRIu64
		  ",\"replay_refused\":%" PRIu64 ",\"replay_truncated\":%" PRIu64
		  ",\"replay_stalled\":%" PRIu64 "},",
		  e->produced, e->published, e->dropped, e->queued, e->batches, e->resync_batches,
		  e->replay_requests, e->replayed_batches, e->replay_errors, e->replay_refused,
		  e->replay_truncated, e->replay_stalled);
}

int srv_stats_json(const struct srv_stats_doc *d, struct evbuffer *out)
{
	struct jw j = { .out = out, .err = 0 };

	jw_printf(&j, "{\"version\":");
	jw_string(&j, d->version);
	jw_printf(&j, ",\"protocol\":%d,\"pid\":%ld,\"uptime_s\":%" PRIu64 ",", d->protocol, d->pid,
		  d->uptime_s);
	json_connections(&j, d);
	json_store(&j, d->store);
	json_ops(&j, d);
	json_latency(&j, d->ops);
	jw_printf(&j, "\"blocks\":%" PRIu64 ",", d->store->blocks);
	json_retention(&j, d);
	if (d->tenants_on)
		json_tenants(&j, d);
	if (d->transport_rdma)
		json_rdma(&j, d->transport_rdma, d->ops->c);
	if (d->tls)
		json_tls(&j, d, d->ops->c);
	if (d->events)
		json_events(&j, d->events);
	jw_printf(&j, "\"namespaces\":{");
	for (uint32_t i = 0; i < d->ns_count; i++) {
		if (i)
			jw_printf(&j, ",");
		json_namespace(&j, &d->ns[i]);
	}
	jw_printf(&j, "}");
	if (d->settings)
		jw_printf(&j, ",\"settings\":%s", d->settings);
	if (d->cluster)
		jw_printf(&j, ",\"cluster\":%s", d->cluster);
	jw_printf(&j, "}");
	return j.err;
}
