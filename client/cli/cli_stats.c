/*
 * cli_stats.c - `kvpool stats`: the server's STATS document as a report or
 * as one line of JSON; and the counters replay reads from it.
 */
#include "cli.h"
#include "cli_opts.h"
#include "cli_stats.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

/* Walk a NULL-terminated list of object keys from o; NULL if any is absent. */
static struct json_object *jwalk(struct json_object *o, const char *const *keys)
{
	for (; o && *keys; keys++)
		if (!json_object_object_get_ex(o, *keys, &o))
			return NULL;
	return o;
}

#define JGET(o, ...) jwalk((o), (const char *const[]){ __VA_ARGS__, NULL })

/* A non-negative integer member, or false. */
static bool jcount(struct json_object *v, uint64_t *out)
{
	if (!v || !json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
		return false;
	*out = json_object_get_uint64(v);
	return true;
}

int cli_stats_parse_counters(const char *json, const char *ns, struct cli_stats_counters *out)
{
	struct cli_stats_counters c = { 0 };
	struct json_object *doc = json_tokener_parse(json);
	int rc = -EPROTO;

	if (!doc)
		return -EPROTO;
	if (!jcount(JGET(doc, "evictions"), &c.evictions))
		goto out_put;
	/* A namespace that has no blocks yet may be absent: 0 hits so far. */
	jcount(JGET(doc, "namespaces", ns, "get_hits"), &c.ns_get_hits);
	*out = c;
	rc = 0;
out_put:
	json_object_put(doc);
	return rc;
}

int cli_stats_counters(struct kvpool_client *c, const char *ns, struct cli_stats_counters *out)
{
	char *json = NULL;
	int rc;

	rc = kvpool_stats(c, ns, &json);
	if (rc)
		return rc;
	rc = cli_stats_parse_counters(json, ns, out);
	kvpool_free(json);
	return rc;
}

/* ---- the human report -------------------------------------------------- */

/* Text of a count member ("-" when absent), in a caller buffer. */
static const char *fmt_count(struct json_object *v, char *buf, size_t len)
{
	uint64_t n;

	if (!jcount(v, &n))
		return "-";
	snprintf(buf, len, "%" PRIu64, n);
	return buf;
}

/* Text of a byte-count member with a unit ("-" when absent). */
static const char *fmt_size(struct json_object *v, char *buf, size_t len)
{
	uint64_t n;

	if (!jcount(v, &n))
		return "-";
	return cli_fmt_bytes(n, buf, len);
}

/* Text of a fractional member with `prec` decimals ("-" when absent). */
static const char *fmt_frac(struct json_object *v, int prec, char *buf, size_t len)
{
	if (!v || !(json_object_is_type(v, json_type_double) ||
		    json_object_is_type(v, json_type_int)))
		return "-";
	snprintf(buf, len, "%.*f", prec, json_object_get_double(v));
	return buf;
}

/* A fraction as a percentage with one decimal ("-" when absent). */
static const char *fmt_percent(struct json_object *v, char *buf, size_t len)
{
	if (!v || !(json_object_is_type(v, json_type_double) ||
		    json_object_is_type(v, json_type_int)))
		return "-";
	snprintf(buf, len, "%.1f", 100 * json_object_get_double(v));
	return buf;
}

/* Uptime as "1d 02h 03m 04s" (leading zero units left out). */
static const char *fmt_uptime(struct json_object *v, char *buf, size_t len)
{
	uint64_t s;

	if (!jcount(v, &s))
		return "-";
	if (s >= 86400)
		snprintf(buf, len, "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s",
			 s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
	else if (s >= 3600)
		snprintf(buf, len, "%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", s / 3600,
			 s / 60 % 60, s % 60);
	else if (s >= 60)
		snprintf(buf, len, "%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, len, "%" PRIu64 "s", s);
	return buf;
}

/* Header lines: version, pid, uptime, connections. */
static void print_server(FILE *f, struct json_object *doc)
{
	char a[32], b[32], c[32], d[48];
	struct json_object *ver = JGET(doc, "version");

	fprintf(f, "kvpoold %s, protocol %s, pid %s, up %s\n",
		ver ? json_object_get_string(ver) : "-",
		fmt_count(JGET(doc, "protocol"), a, sizeof(a)),
		fmt_count(JGET(doc, "pid"), b, sizeof(b)),
		fmt_uptime(JGET(doc, "uptime_s"), d, sizeof(d)));
	fprintf(f, "connections: %s current, %s total, %s rejected\n",
		fmt_count(JGET(doc, "connections", "current"), a, sizeof(a)),
		fmt_count(JGET(doc, "connections", "total"), b, sizeof(b)),
		fmt_count(JGET(doc, "connections", "rejected"), c, sizeof(c)));
}

/* A boolean member as yes/no text; "-" when absent. */
static const char *fmt_bool(struct json_object *v, const char *yes, const char *no)
{
	if (!v || !json_object_is_type(v, json_type_boolean))
		return "-";
	return json_object_get_boolean(v) ? yes : no;
}

/* num / den with two decimals ("-" when either is absent or den is 0). */
static const char *fmt_ratio(struct json_object *num, struct json_object *den, char *buf,
			     size_t len)
{
	uint64_t n, d;

	if (!jcount(num, &n) || !jcount(den, &d) || !d)
		return "-";
	snprintf(buf, len, "%.2f", (double)n / (double)d);
	return buf;
}

/* Blocks per second of the rebuild ("-" when unknown). */
static const char *fmt_rate(struct json_object *blocks, struct json_object *ms, char *buf,
			    size_t len)
{
	uint64_t b, m;

	if (!jcount(blocks, &b) || !jcount(ms, &m))
		return "-";
	snprintf(buf, len, "%" PRIu64, b * 1000 / (m ? m : 1));
	return buf;
}

/* Is tiers.nvme there and enabled? */
static bool nvme_enabled(struct json_object *nvme)
{
	struct json_object *on = JGET(nvme, "enabled");

	return on && json_object_is_type(on, json_type_boolean) && json_object_get_boolean(on);
}

#define TIER_ROW "%-6s %12s %12s %12s %12s %12s %13s %10s\n"

/* The DRAM row. */
static void print_dram_row(FILE *f, struct json_object *t)
{
	char a[32], b[32], c[32], d[32], e[32], g[32], h[32];

	fprintf(f, "%-6s %12s %12s %12s %12s %12s %13s %9s%%\n", "dram",
		fmt_count(JGET(t, "blocks"), a, sizeof(a)),
		fmt_size(JGET(t, "used_bytes"), b, sizeof(b)),
		fmt_size(JGET(t, "payload_bytes"), c, sizeof(c)),
		fmt_size(JGET(t, "capacity_bytes"), d, sizeof(d)),
		fmt_size(JGET(t, "free_bytes"), e, sizeof(e)),
		fmt_size(JGET(t, "largest_free_bytes"), g, sizeof(g)),
		fmt_percent(JGET(t, "fragmentation"), h, sizeof(h)));
}

/* The NVMe row: free is capacity - used (whole segments); no extents. */
static void print_nvme_row(FILE *f, struct json_object *t)
{
	char a[32], b[32], c[32], d[32], e[32];
	uint64_t cap, used;
	const char *free_text = "-";

	if (jcount(JGET(t, "capacity_bytes"), &cap) && jcount(JGET(t, "used_bytes"), &used))
		free_text = cli_fmt_bytes(cap > used ? cap - used : 0, e, sizeof(e));
	fprintf(f, TIER_ROW, "nvme", fmt_count(JGET(t, "blocks"), a, sizeof(a)),
		fmt_size(JGET(t, "used_bytes"), b, sizeof(b)),
		fmt_size(JGET(t, "payload_bytes"), c, sizeof(c)),
		fmt_size(JGET(t, "capacity_bytes"), d, sizeof(d)), free_text, "-", "-");
}

/* What moved between the tiers, what the disk did, and the last rebuild. */
static void print_nvme_detail(FILE *f, struct json_object *t)
{
	char a[32], b[32], c[32], d[32], e[32], g[32];

	fprintf(f, "nvme tier: %s, %s, segments of %s\n",
		fmt_bool(JGET(t, "direct_io"), "O_DIRECT", "buffered I/O (no O_DIRECT here)"),
		fmt_bool(JGET(t, "healthy"), "healthy", "UNHEALTHY (writes failing; DRAM only)"),
		fmt_size(JGET(t, "segment_bytes"), a, sizeof(a)));
	fprintf(f, "  demotions   %s blocks (%s)   promotions %s blocks (%s)\n",
		fmt_count(JGET(t, "demotions"), a, sizeof(a)),
		fmt_size(JGET(t, "demoted_bytes"), b, sizeof(b)),
		fmt_count(JGET(t, "promotions"), c, sizeof(c)),
		fmt_size(JGET(t, "promoted_bytes"), d, sizeof(d)));
	fprintf(f, "  written     %s   read %s   rewritten %s by reclaim of %s segments"
		" (write amplification %s)\n",
		fmt_size(JGET(t, "bytes_written"), a, sizeof(a)),
		fmt_size(JGET(t, "bytes_read"), b, sizeof(b)),
		fmt_size(JGET(t, "rewritten_bytes"), c, sizeof(c)),
		fmt_count(JGET(t, "segments_reclaimed"), d, sizeof(d)),
		fmt_ratio(JGET(t, "bytes_written"), JGET(t, "demoted_bytes"), e, sizeof(e)));
	fprintf(f, "  admission rejections %s, evictions %s, corrupt blocks %s, read errors %s,"
		" write errors %s\n",
		fmt_count(JGET(t, "admission_rejections"), a, sizeof(a)),
		fmt_count(JGET(t, "evictions"), b, sizeof(b)),
		fmt_count(JGET(t, "corrupt_blocks"), c, sizeof(c)),
		fmt_count(JGET(t, "read_errors"), d, sizeof(d)),
		fmt_count(JGET(t, "write_errors"), e, sizeof(e)));
	fprintf(f, "  rebuild at start: %s blocks in %s ms (%s blocks/s), %s orphans dropped\n",
		fmt_count(JGET(t, "rebuild_blocks"), a, sizeof(a)),
		fmt_count(JGET(t, "rebuild_ms"), b, sizeof(b)),
		fmt_rate(JGET(t, "rebuild_blocks"), JGET(t, "rebuild_ms"), c, sizeof(c)),
		fmt_count(JGET(t, "orphans_dropped"), g, sizeof(g)));
}

/* The RDMA transport: served on which port and what it carried, or why
 * not. Nothing when the server does not report it (an older kvpoold). */
static void print_rdma(FILE *f, struct json_object *r)
{
	struct json_object *avail = JGET(r, "available"), *why = JGET(r, "reason");
	char a[32], b[32], c[32], d[32], e[32];

	if (!r || !avail)
		return;
	if (!json_object_get_boolean(avail)) {
		fprintf(f, "rdma: unavailable (%s)\n", why ? json_object_get_string(why) : "-");
		return;
	}
	fprintf(f, "rdma: available on port %s\n", fmt_count(JGET(r, "port"), a, sizeof(a)));
	if (!JGET(r, "connections"))
		return;
	fprintf(f, "  connections %s now, %s total; read %s (puts), written %s (gets); "
		"transfer errors %s\n",
		fmt_count(JGET(r, "connections", "current"), a, sizeof(a)),
		fmt_count(JGET(r, "connections", "total"), b, sizeof(b)),
		fmt_size(JGET(r, "bytes_read"), c, sizeof(c)),
		fmt_size(JGET(r, "bytes_written"), d, sizeof(d)),
		fmt_count(JGET(r, "transfer_errors"), e, sizeof(e)));
}

/* The KV-event publisher (docs/events.md): what it sent, dropped and
 * replayed. Nothing when the server does not report it (events off, or an
 * older kvpoold). */
static void print_kv_events(FILE *f, struct json_object *e)
{
	struct json_object *on = JGET(e, "enabled");
	char a[32], b[32], c[32], d[32], g[32], h[32], k[32];

	if (!e || !on)
		return;
	if (!json_object_get_boolean(on)) {
		fprintf(f, "kv events: off (no kv_events_endpoint)\n");
		return;
	}
	fprintf(f, "kv events: %s published in %s batches, %s dropped (%s resync batches), "
		"%s queued; replay requests %s (%s batches)\n",
		fmt_count(JGET(e, "published"), a, sizeof(a)),
		fmt_count(JGET(e, "batches"), b, sizeof(b)),
		fmt_count(JGET(e, "dropped"), c, sizeof(c)),
		fmt_count(JGET(e, "resync_batches"), d, sizeof(d)),
		fmt_count(JGET(e, "queued"), g, sizeof(g)),
		fmt_count(JGET(e, "replay_requests"), h, sizeof(h)),
		fmt_count(JGET(e, "replayed_batches"), k, sizeof(k)));
}

/* One row per tier, the NVMe tier's activity, then pool-wide memory and
 * eviction figures. */
static void print_tiers(FILE *f, struct json_object *doc)
{
	struct json_object *nvme = JGET(doc, "tiers", "nvme");
	char a[32], b[32], c[32], d[32], e[32];

	fprintf(f, "\n" TIER_ROW, "tier", "blocks", "used", "payload", "capacity", "free",
		"largest free", "fragment.");
	print_dram_row(f, JGET(doc, "tiers", "dram"));
	if (nvme_enabled(nvme))
		print_nvme_row(f, nvme);
	fprintf(f, "blocks %s (in either tier), index %s, evictions %s, leases active %s, "
		"checksum errors %s\n",
		fmt_count(JGET(doc, "blocks"), a, sizeof(a)),
		fmt_size(JGET(doc, "index_bytes"), b, sizeof(b)),
		fmt_count(JGET(doc, "evictions"), c, sizeof(c)),
		fmt_count(JGET(doc, "leases_active"), d, sizeof(d)),
		fmt_count(JGET(doc, "checksum_errors"), e, sizeof(e)));
	/* servers before the eviction-pass counters do not send them */
	if (JGET(doc, "tiers", "dram", "evict_passes"))
		fprintf(f, "dram eviction passes %s, longest %s us\n",
			fmt_count(JGET(doc, "tiers", "dram", "evict_passes"), a, sizeof(a)),
			fmt_count(JGET(doc, "tiers", "dram", "evict_pass_max_us"), b, sizeof(b)));
	if (nvme_enabled(nvme))
		print_nvme_detail(f, nvme);
	else
		fprintf(f, "nvme tier: off (no nvme_dir)\n");
	print_rdma(f, JGET(doc, "rdma"));
	print_kv_events(f, JGET(doc, "kv_events"));
}

/* Per-operation counts, with the prefix-match hit ratio. */
static void print_ops(FILE *f, struct json_object *doc)
{
	struct json_object *ops = JGET(doc, "ops");
	char a[32], b[32], c[32], d[32], e[32];

	fprintf(f, "\noperations\n");
	fprintf(f, "  put     %s requests, %s blocks: %s stored, %s already stored, %s errors\n",
		fmt_count(JGET(ops, "put", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "put", "blocks"), b, sizeof(b)),
		fmt_count(JGET(ops, "put", "ok"), c, sizeof(c)),
		fmt_count(JGET(ops, "put", "exists"), d, sizeof(d)),
		fmt_count(JGET(ops, "put", "errors"), e, sizeof(e)));
	fprintf(f, "  get     %s requests, %s block hits, %s block misses\n",
		fmt_count(JGET(ops, "get", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "get", "hits"), b, sizeof(b)),
		fmt_count(JGET(ops, "get", "misses"), c, sizeof(c)));
	fprintf(f, "  exists  %s requests, %s hits, %s misses\n",
		fmt_count(JGET(ops, "exists", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "exists", "hits"), b, sizeof(b)),
		fmt_count(JGET(ops, "exists", "misses"), c, sizeof(c)));
	fprintf(f, "  match   %s requests, %s blocks queried, %s matched: prefix-match hit ratio %s\n",
		fmt_count(JGET(ops, "match", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "match", "blocks_queried"), b, sizeof(b)),
		fmt_count(JGET(ops, "match", "blocks_matched"), c, sizeof(c)),
		fmt_frac(JGET(ops, "match", "hit_ratio"), 4, d, sizeof(d)));
	fprintf(f, "  delete  %s requests, %s blocks\n",
		fmt_count(JGET(ops, "delete", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "delete", "blocks"), b, sizeof(b)));
	fprintf(f, "  ping    %s requests; stats %s requests\n",
		fmt_count(JGET(ops, "ping", "requests"), a, sizeof(a)),
		fmt_count(JGET(ops, "stats", "requests"), b, sizeof(b)));
	fprintf(f, "  refused %s bad request, %s too large, %s busy, %s full\n",
		fmt_count(JGET(ops, "errors", "bad_request"), a, sizeof(a)),
		fmt_count(JGET(ops, "errors", "too_large"), b, sizeof(b)),
		fmt_count(JGET(ops, "errors", "busy"), c, sizeof(c)),
		fmt_count(JGET(ops, "errors", "full"), d, sizeof(d)));
}

/* Latency percentiles per operation, in microseconds. */
static void print_latency(FILE *f, struct json_object *doc)
{
	struct json_object *lat = JGET(doc, "latency_us");
	char a[32], b[32], c[32];

	if (!lat || !json_object_is_type(lat, json_type_object))
		return;
	fprintf(f, "\n%-16s %10s %10s %10s\n", "latency (us)", "p50", "p99", "p999");
	json_object_object_foreach(lat, op, v) {
		fprintf(f, "  %-14s %10s %10s %10s\n", op, fmt_count(JGET(v, "p50"), a, sizeof(a)),
			fmt_count(JGET(v, "p99"), b, sizeof(b)),
			fmt_count(JGET(v, "p999"), c, sizeof(c)));
	}
}

/* One row per namespace. */
static void print_namespaces(FILE *f, struct json_object *doc)
{
	struct json_object *nss = JGET(doc, "namespaces");
	char a[32], b[32], c[32], d[32], e[32], g[32], h[32], k[32], r[32];

	if (!nss || !json_object_is_type(nss, json_type_object))
		return;
	fprintf(f, "\n%-20s %10s %10s %11s %10s %10s %10s %11s %10s %11s\n", "namespace", "blocks",
		"on nvme", "bytes", "puts", "get hits", "get miss", "match ratio", "evictions",
		"retained");
	if (!json_object_object_length(nss))
		fprintf(f, "  (none)\n");
	json_object_object_foreach(nss, name, v) {
		fprintf(f, "%-20s %10s %10s %11s %10s %10s %10s %11s %10s %11s\n", name,
			fmt_count(JGET(v, "blocks"), a, sizeof(a)),
			fmt_count(JGET(v, "nvme_blocks"), k, sizeof(k)),
			fmt_size(JGET(v, "bytes"), b, sizeof(b)),
			fmt_count(JGET(v, "puts"), c, sizeof(c)),
			fmt_count(JGET(v, "get_hits"), d, sizeof(d)),
			fmt_count(JGET(v, "get_misses"), e, sizeof(e)),
			fmt_frac(JGET(v, "match_hit_ratio"), 4, g, sizeof(g)),
			fmt_count(JGET(v, "evictions"), h, sizeof(h)),
			fmt_size(JGET(v, "retained_bytes"), r, sizeof(r)));
	}
}

/* Retention: what is retained, refused and expired, pool-wide, then one
 * row per tenant (with a tokens file). Nothing from an older server. */
static void print_retention(FILE *f, struct json_object *doc)
{
	struct json_object *r = JGET(doc, "retention"), *ts = JGET(doc, "tenants");
	char a[32], b[32], c[32], d[32], e[32], g[32];

	if (!r)
		return;
	fprintf(f, "\nretention: %s blocks (%s) retained, %s refused for a budget, %s expired; "
		"budget %s per %s, longest %s ms\n",
		fmt_count(JGET(r, "retained_blocks"), a, sizeof(a)),
		fmt_size(JGET(r, "retained_bytes"), b, sizeof(b)),
		fmt_count(JGET(r, "refused"), c, sizeof(c)),
		fmt_count(JGET(r, "expired"), d, sizeof(d)),
		fmt_size(JGET(r, "max_retained_bytes"), e, sizeof(e)),
		ts ? "tenant (unless its token sets one)" : "namespace",
		fmt_count(JGET(r, "max_retain_ms"), g, sizeof(g)));
	if (!ts || !json_object_is_type(ts, json_type_object))
		return;
	fprintf(f, "%-14s %10s %11s %11s %10s %10s\n", "tenant", "retained", "bytes", "budget",
		"refused", "expired");
	if (!json_object_object_length(ts))
		fprintf(f, "  (none yet)\n");
	json_object_object_foreach(ts, id, v) {
		fprintf(f, "%-14s %10s %11s %11s %10s %10s\n", id,
			fmt_count(JGET(v, "retained_blocks"), a, sizeof(a)),
			fmt_size(JGET(v, "retained_bytes"), b, sizeof(b)),
			fmt_size(JGET(v, "retain_budget_bytes"), c, sizeof(c)),
			fmt_count(JGET(v, "retain_refused"), d, sizeof(d)),
			fmt_count(JGET(v, "retain_expired"), e, sizeof(e)));
	}
}

static const char stats_usage[] =
	"usage: kvpool stats [--json] [--watch SECONDS] [--namespace NS] [--server URL]\n"
	"                    [--timeout-ms N] [--cluster]\n"
	"       kvpool stats settings [--json] [--server URL] [--timeout-ms N]\n"
	"\n"
	"Show the pool server's statistics: per tier (DRAM, and NVMe when the\n"
	"server has one) blocks, bytes, capacity and fragmentation; the NVMe tier's\n"
	"demotions, promotions, bytes written, read and rewritten, corrupt blocks\n"
	"and last rebuild; hits and misses per operation; the prefix-match hit\n"
	"ratio; evictions, leases, connections, uptime, latency percentiles, and a\n"
	"table of namespaces (only NS with --namespace).\n"
	"\n"
	"'kvpool stats settings' prints the server's effective settings instead, one\n"
	"'key = value' line each (sizes in bytes, times in ms): a valid kvpool.conf.\n"
	"\n"
	"  --json              print the server's JSON document on one line\n"
	"  --watch SECONDS     print again every SECONDS (decimals allowed) until\n"
	"                      interrupted; the report clears a terminal first\n"
	"  --cluster           for a cluster URL (tcp://a:7470,b:7470 or\n"
	"                      etcd://HOST:2379/CLUSTER): one line per node - up or\n"
	"                      down, blocks, bytes, match hit ratio, share of the\n"
	"                      blocks it owns - the membership's state, and the\n"
	"                      placement's counters: fallback hits, background\n"
	"                      copies, redirected puts, budget expiries, pending\n"
	"                      removals (with --json: the document's \"cluster\"\n"
	"                      object)\n"
	"\n"
	"A cluster URL without --cluster shows the nodes' figures summed (pid and\n"
	"uptime are each node's own: see --cluster --json).\n"
	CLI_COMMON_HELP;

int cli_stats_report(FILE *f, const char *json)
{
	struct json_object *doc = json_tokener_parse(json);

	if (!doc)
		return -EPROTO;
	print_server(f, doc);
	print_tiers(f, doc);
	print_ops(f, doc);
	print_latency(f, doc);
	print_namespaces(f, doc);
	print_retention(f, doc);
	json_object_put(doc);
	return 0;
}

/* `kvpool stats settings`: the document's "settings" object as INI lines
 * (or as one line of JSON). */
static int settings_print(const char *json, bool as_json)
{
	struct json_object *doc = json_tokener_parse(json), *set;
	int rc = CLI_EXIT_OK;

	if (!doc || !json_object_object_get_ex(doc, "settings", &set) ||
	    !json_object_is_type(set, json_type_object)) {
		fprintf(stderr, "kvpool stats settings: the server sent no settings (older server?)\n");
		rc = CLI_EXIT_ERROR;
		goto out_put;
	}
	if (as_json) {
		puts(json_object_to_json_string_ext(set, JSON_C_TO_STRING_PLAIN |
						    JSON_C_TO_STRING_NOSLASHESCAPE));
		goto out_put;
	}
	json_object_object_foreach(set, key, val) {
		if (json_object_is_type(val, json_type_string))
			printf("%s = %s\n", key, json_object_get_string(val));
		else
			printf("%s = %s\n", key, json_object_to_json_string(val));
	}
out_put:
	json_object_put(doc);
	return rc;
}

/* Look a dotted path up in o as an integer or a number; 0 when absent. */
static double path_num(struct json_object *o, const char *path)
{
	char buf[128], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *t = strtok_r(buf, ".", &save); t; t = strtok_r(NULL, ".", &save))
		if (!o || !json_object_object_get_ex(o, t, &o))
			return 0;
	return o ? json_object_get_double(o) : 0;
}

int cli_cluster_nodes_report(FILE *f, const char *json, const char *indent)
{
	struct json_object *doc = json_tokener_parse(json), *cl, *nodes;
	int down = 0;

	if (!doc || !json_object_object_get_ex(doc, "cluster", &cl) ||
	    !json_object_object_get_ex(cl, "nodes", &nodes)) {
		json_object_put(doc);
		return -EPROTO;
	}
	for (size_t i = 0; i < json_object_array_length(nodes); i++) {
		struct json_object *n = json_object_array_get_idx(nodes, i), *v;
		const char *name = json_object_get_string(json_object_object_get(n, "name"));
		const char *url = json_object_get_string(json_object_object_get(n, "url"));
		bool up = json_object_object_get_ex(n, "up", &v) && json_object_get_boolean(v);

		if (up) {
			fprintf(f, "%s%-24s %-28s up\n", indent, name ? name : "?", url ? url : "?");
			continue;
		}
		down++;
		/* a node that answers and refuses (token, namespace) is not down */
		fprintf(f, "%s%-24s %-28s %s: %s\n", indent, name ? name : "?", url ? url : "?",
			json_object_object_get_ex(n, "state", &v) &&
			!strcmp(json_object_get_string(v), "refused") ? "REFUSED" : "DOWN",
			json_object_get_string(json_object_object_get(n, "error")));
	}
	if (json_object_object_get_ex(cl, "error", &nodes) && json_object_get_string_len(nodes))
		fprintf(f, "%s(%s)\n", indent, json_object_get_string(nodes));
	json_object_put(doc);
	return down;
}

int cli_cluster_down_report(FILE *f, const char *json, const char *indent)
{
	struct json_object *doc = json_tokener_parse(json), *cl, *nodes;
	int down = 0;

	if (!doc || !json_object_object_get_ex(doc, "cluster", &cl) ||
	    !json_object_object_get_ex(cl, "nodes", &nodes)) {
		json_object_put(doc);
		return 0;
	}
	for (size_t i = 0; i < json_object_array_length(nodes); i++) {
		struct json_object *n = json_object_array_get_idx(nodes, i), *v;
		const char *name = json_object_get_string(json_object_object_get(n, "name"));

		if (json_object_object_get_ex(n, "up", &v) && json_object_get_boolean(v))
			continue;
		down++;
		if (f)
			fprintf(f, "%s%-24s %s\n", indent, name ? name : "?",
			json_object_get_string(json_object_object_get(n, "error")));
	}
	json_object_put(doc);
	return down;
}

/* `kvpool stats --cluster`: the "cluster" object as a table. */
static int cluster_print(const char *json, bool as_json)
{
	struct json_object *doc = json_tokener_parse(json), *cl, *nodes, *e, *v;
	int rc = CLI_EXIT_OK;

	if (!doc || !json_object_object_get_ex(doc, "cluster", &cl)) {
		fprintf(stderr, "kvpool stats --cluster: not a cluster URL (give a node list "
			"tcp://a:7470,b:7470 or etcd://HOST:2379/CLUSTER)\n");
		rc = CLI_EXIT_ERROR;
		goto out_put;
	}
	if (as_json) {
		puts(json_object_to_json_string_ext(cl, JSON_C_TO_STRING_PLAIN |
						    JSON_C_TO_STRING_NOSLASHESCAPE));
		goto out_put;
	}
	printf("membership %s, epoch %.0f, placement per block (hot blocks on %.0f nodes once "
	       "%.0f continuations share them; %.0f hot), budget %.0f ms",
	       json_object_object_get_ex(cl, "membership", &v) ? json_object_get_string(v) : "?",
	       path_num(cl, "epoch"), path_num(cl, "hot_replicas"), path_num(cl, "hot_children"),
	       path_num(cl, "hot_blocks"), path_num(cl, "budget_ms"));
	if (json_object_object_get_ex(cl, "etcd", &e)) {
		json_object_object_get_ex(e, "reachable", &v);
		printf("; etcd %s %s", path_num(cl, "etcd.reachable") ? "reachable" : "UNREACHABLE "
		       "(keeping the last membership)",
		       json_object_get_string(json_object_object_get(e, "endpoint")));
	}
	printf("\nfallback %s; fallback hits %.0f, copies %.0f (%.0f dropped), redirected puts "
	       "%.0f, puts no node took %.0f, budget expired %.0f, removals pending %.0f\n",
	       path_num(cl, "fallback.active") ? "on (after a membership change)" : "off",
	       path_num(cl, "fallback_hits"), path_num(cl, "copies"), path_num(cl, "copies_dropped"),
	       path_num(cl, "redirected_puts"), path_num(cl, "puts_nowhere"),
	       path_num(cl, "budget_expired"), path_num(cl, "pending_removals"));
	if (json_object_object_get_ex(cl, "error", &v) && json_object_get_string_len(v))
		printf("PROBLEM: %s\n", json_object_get_string(v));
	printf("%-28s %-11s %12s %14s %9s %7s\n", "node", "state", "blocks", "bytes",
	       "hit_ratio", "share");
	if (json_object_object_get_ex(cl, "nodes", &nodes))
		for (size_t i = 0; i < json_object_array_length(nodes); i++) {
			struct json_object *n = json_object_array_get_idx(nodes, i), *st = NULL;
			bool up = path_num(n, "up") != 0;

			json_object_object_get_ex(n, "stats", &st);
			printf("%-28s %-11s %12.0f %14.0f %9.4f %7.3f\n",
			       json_object_get_string(json_object_object_get(n, "name")),
			       json_object_object_get_ex(n, "state", &v) ? json_object_get_string(v)
									  : up ? "up" : "down",
			       path_num(st, "blocks"),
			       path_num(st, "tiers.dram.used_bytes") + path_num(st, "tiers.nvme.used_bytes"),
			       path_num(st, "ops.match.hit_ratio"), path_num(n, "share"));
		}
out_put:
	json_object_put(doc);
	return rc;
}

/* Print the document as one line of JSON, or as the report. */
static int stats_print(const char *json, bool as_json)
{
	struct json_object *doc = json_tokener_parse(json);

	if (!doc) {
		fprintf(stderr, "kvpool stats: the server sent a document that is not JSON\n");
		return CLI_EXIT_ERROR;
	}
	if (as_json)
		puts(json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN |
						    JSON_C_TO_STRING_NOSLASHESCAPE));
	else
		cli_stats_report(stdout, json);
	json_object_put(doc);
	return CLI_EXIT_OK;
}

/* Seconds between two --watch rounds: a sane window, no busy loop. */
#define WATCH_MIN_S 0.1
#define WATCH_MAX_S 86400.0

/* Sleep s seconds (EINTR ends it early, which is fine: SIGINT exits). */
static void sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s,
			       .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };

	nanosleep(&ts, NULL);
}

/* --watch: print every `every_s` seconds until killed, reconnecting after
 * an error (the server may be restarting: say so and keep watching). */
static int stats_watch(const struct cli_conn *conn, const char *prog, const char *ns,
		       bool as_json, double every_s)
{
	bool tty = isatty(STDOUT_FILENO);
	struct kvpool_client *c = NULL;
	char *json = NULL, when[32];
	int rc;

	for (;;) {
		time_t t = time(NULL);

		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&t));
		if (!c && cli_connect(conn, prog, &c))
			c = NULL;
		rc = c ? kvpool_stats(c, ns, &json) : -ENOTCONN;
		if (rc && c) {
			fprintf(stderr, "%s: %s\n", prog, cli_reason(rc));
			kvpool_close(c);
			c = NULL;
		}
		if (rc == 0) {
			if (tty && !as_json)
				printf("\033[H\033[2J");
			if (!as_json)
				printf("%s every %.1f s: %s\n\n", conn->url, every_s, when);
			stats_print(json, as_json);
			fflush(stdout);
			kvpool_free(json);
			json = NULL;
		}
		sleep_s(every_s);
	}
	return CLI_EXIT_OK;
}

int cli_stats_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "json", no_argument, NULL, 'j' },
		{ "watch", required_argument, NULL, 'w' },
		{ "cluster", no_argument, NULL, 'C' },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	struct kvpool_client *c;
	struct cli_conn conn;
	bool as_json = false, one_ns = false, settings = false, cluster = false;
	double watch_s = 0;
	char *json = NULL;
	int opt, rc;

	cli_conn_init(&conn, "default");
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		rc = cli_conn_opt(&conn, prog, opt, optarg);
		if (rc < 0)
			return CLI_EXIT_ERROR;
		if (rc) {
			one_ns |= opt == CLI_OPT_NAMESPACE;
			continue;
		}
		switch (opt) {
		case 'j':
			as_json = true;
			break;
		case 'C':
			cluster = true;
			break;
		case 'w':
			if (cli_parse_nonneg_double(optarg, &watch_s) || watch_s < WATCH_MIN_S ||
			    watch_s > WATCH_MAX_S)
				return cli_usage_error(prog, "--watch wants seconds in %g..%g, not '%s'",
						       WATCH_MIN_S, WATCH_MAX_S, optarg);
			break;
		case 'h':
			fputs(stats_usage, stdout);
			return CLI_EXIT_OK;
		default:
			return cli_try_help(prog);
		}
	}
	if (optind < argc && strcmp(argv[optind], "settings") == 0) {
		settings = true;
		optind++;
		if (watch_s > 0 || one_ns)
			return cli_usage_error(prog, "settings takes neither --watch nor --namespace");
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	if (cluster && (settings || watch_s > 0))
		return cli_usage_error(prog, "--cluster takes neither settings nor --watch");
	if (watch_s > 0)
		return stats_watch(&conn, prog, one_ns ? conn.ns : NULL, as_json, watch_s);
	rc = cli_connect(&conn, prog, &c);
	if (rc)
		return cli_connect_exit_code(rc);
	rc = kvpool_stats(c, one_ns ? conn.ns : NULL, &json);
	kvpool_close(c);
	if (rc) {
		fprintf(stderr, "%s: %s\n", prog, cli_reason(rc));
		return CLI_EXIT_ERROR;
	}
	rc = settings ? settings_print(json, as_json)
		: cluster ? cluster_print(json, as_json) : stats_print(json, as_json);
	if (!settings && !cluster && rc == CLI_EXIT_OK) {
		/* the figures are the answering nodes' sum: say which did not
		 * answer, so that a node lost does not read as "fewer blocks" */
		int down = cli_cluster_down_report(NULL, json, "");

		if (down > 0) {
			fprintf(stderr, "%s: %d node(s) did not answer; the figures above are the "
				"other nodes' only:\n", prog, down);
			cli_cluster_down_report(stderr, json, "  ");
			rc = CLI_EXIT_ERROR;
		}
	}
	kvpool_free(json);
	return rc;
}
