/*
 * bench_report.c - the report of `kvpool bench`: a table or one JSON line.
 */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>

const char *cli_bench_op_name(enum cli_bench_op op)
{
	static const char *const names[CLI_BENCH_NOPS] = { "put", "get", "exists", "match" };

	return (unsigned int)op < CLI_BENCH_NOPS ? names[op] : "?";
}

double cli_bench_blocks_per_s(const struct cli_bench_result *r)
{
	return r->seconds > 0 ? (double)r->blocks / r->seconds : 0.0;
}

double cli_bench_gbps(const struct cli_bench_result *r)
{
	return r->seconds > 0 ? (double)r->blocks * (double)r->block_bytes / r->seconds / 1e9 : 0.0;
}

/* Calls per second (MATCH: chain matches per second). */
static double calls_per_s(const struct cli_bench_result *r)
{
	return r->seconds > 0 ? (double)r->calls / r->seconds : 0.0;
}

/* The run's parameters, one line. */
static void print_header(FILE *f, const struct cli_bench_opts *o)
{
	fprintf(f, "kvpool bench: %s namespace \"%s\", %u connection%s, %u block%s per call ",
		o->conn.url, o->conn.ns, o->connections, o->connections == 1 ? "" : "s", o->batch,
		o->batch == 1 ? "" : "s");
	if (o->async)
		fprintf(f, "(async: %u calls in flight per connection), ", o->inflight);
	else
		fprintf(f, "(= in flight per connection), ");
	if (o->count)
		fprintf(f, "%" PRIu64 " per phase\n", o->count);
	else
		fprintf(f, "%.1f s per phase\n", o->duration_s);
}

/* One row of the table for PUT, GET or EXISTS. */
static void print_row(FILE *f, const struct cli_bench_result *r)
{
	char size[32] = "-", gbps[32] = "-";

	if (r->block_bytes) {
		cli_fmt_bytes(r->block_bytes, size, sizeof(size));
		snprintf(gbps, sizeof(gbps), "%.3f", cli_bench_gbps(r));
	}
	fprintf(f, "%-7s %-10s %12.1f %8s %9" PRIu64 " %8" PRIu64 " %8" PRIu64 " %9" PRIu64
		" %7" PRIu64 " %6" PRIu64 " %7" PRIu64 "\n", cli_bench_op_name(r->op), size,
		cli_bench_blocks_per_s(r), gbps, r->calls, r->p50_us, r->p99_us, r->p999_us,
		r->misses, r->wrong, r->errors);
}

/* The MATCH result, in its own words. */
static void print_match(FILE *f, const struct cli_bench_result *r)
{
	fprintf(f, "match   %u-block chain: %.1f matches/s (%.0f blocks/s), %" PRIu64
		" matches, %" PRIu64 " short\n", r->chain, calls_per_s(r),
		cli_bench_blocks_per_s(r), r->calls, r->misses);
	if (r->lease_cuts || r->refused)
		fprintf(f, "        %" PRIu64 " with the lease cut to what fits the leased-bytes bound, "
			"%" PRIu64 " refused (QUOTA, FULL or BUSY)\n", r->lease_cuts, r->refused);
	fprintf(f, "        per match, client end to end: p50 %" PRIu64 " us, p99 %" PRIu64
		" us, p99.9 %" PRIu64 " us\n", r->p50_us, r->p99_us, r->p999_us);
	fprintf(f, "        server time (STATS latency_us.match): p50 %" PRIu64 " us, p99 %"
		PRIu64 " us, p99.9 %" PRIu64 " us\n", r->server_p50_us, r->server_p99_us,
		r->server_p999_us);
}

void cli_bench_print_text(FILE *f, const struct cli_bench_report *rep)
{
	char vbytes[32];
	bool table = false;

	print_header(f, rep->opts);
	for (size_t i = 0; i < rep->n_results; i++) {
		const struct cli_bench_result *r = &rep->results[i];

		if (r->op == CLI_BENCH_MATCH) {
			print_match(f, r);
			continue;
		}
		if (!table)
			fprintf(f, "%-7s %-10s %12s %8s %9s %8s %8s %9s %7s %6s %7s\n", "op", "block",
				"blocks/s", "GB/s", "calls", "p50 us", "p99 us", "p99.9 us",
				"misses", "wrong", "errors");
		table = true;
		print_row(f, r);
		if (r->retries)
			fprintf(f, "        (%" PRIu64 " blocks sent again after BUSY)\n", r->retries);
	}
	fprintf(f, "verified: %" PRIu64 " GET blocks (%s) byte by byte\n", rep->verified_blocks,
		cli_fmt_bytes(rep->verified_bytes, vbytes, sizeof(vbytes)));
	fprintf(f, "GB/s = 10^9 payload bytes per second; latency per call of %u block%s\n",
		rep->opts->batch, rep->opts->batch == 1 ? "" : "s");
}

/* A double rounded to `prec` decimals, as JSON. */
static struct json_object *jfixed(double v, int prec)
{
	char buf[64];

	snprintf(buf, sizeof(buf), "%.*f", prec, v);
	return json_object_new_double_s(v, buf);
}

/* Add key: value to obj, remembering a failure in *ok. */
static void jadd(struct json_object *obj, const char *key, struct json_object *v, bool *ok)
{
	if (!v || json_object_object_add(obj, key, v)) {
		json_object_put(v);
		*ok = false;
	}
}

/* One result as a JSON object. */
static struct json_object *jresult(const struct cli_bench_result *r)
{
	struct json_object *o = json_object_new_object();
	bool ok = o != NULL;

	if (!o)
		return NULL;
	jadd(o, "op", json_object_new_string(cli_bench_op_name(r->op)), &ok);
	jadd(o, "block_bytes", json_object_new_uint64(r->block_bytes), &ok);
	if (r->op == CLI_BENCH_MATCH) {
		jadd(o, "chain_blocks", json_object_new_uint64(r->chain), &ok);
		jadd(o, "matches_per_s", jfixed(calls_per_s(r), 1), &ok);
	}
	jadd(o, "blocks", json_object_new_uint64(r->blocks), &ok);
	jadd(o, "calls", json_object_new_uint64(r->calls), &ok);
	jadd(o, "seconds", jfixed(r->seconds, 6), &ok);
	jadd(o, "blocks_per_s", jfixed(cli_bench_blocks_per_s(r), 1), &ok);
	jadd(o, "gbps", jfixed(cli_bench_gbps(r), 4), &ok);
	jadd(o, "p50_us", json_object_new_uint64(r->p50_us), &ok);
	jadd(o, "p99_us", json_object_new_uint64(r->p99_us), &ok);
	jadd(o, "p999_us", json_object_new_uint64(r->p999_us), &ok);
	jadd(o, "misses", json_object_new_uint64(r->misses), &ok);
	jadd(o, "wrong", json_object_new_uint64(r->wrong), &ok);
	jadd(o, "errors", json_object_new_uint64(r->errors), &ok);
	jadd(o, "retries", json_object_new_uint64(r->retries), &ok);
	if (r->op == CLI_BENCH_MATCH) {
		jadd(o, "lease_cuts", json_object_new_uint64(r->lease_cuts), &ok);
		jadd(o, "refused", json_object_new_uint64(r->refused), &ok);
		jadd(o, "server_p50_us", json_object_new_uint64(r->server_p50_us), &ok);
		jadd(o, "server_p99_us", json_object_new_uint64(r->server_p99_us), &ok);
		jadd(o, "server_p999_us", json_object_new_uint64(r->server_p999_us), &ok);
	}
	if (!ok) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

int cli_bench_print_json(FILE *f, const struct cli_bench_report *rep)
{
	const struct cli_bench_opts *o = rep->opts;
	struct json_object *doc = json_object_new_object(), *arr = json_object_new_array();
	bool ok = true;

	if (!doc || !arr) {
		json_object_put(doc);
		json_object_put(arr);
		return -ENOMEM;
	}
	jadd(doc, "url", json_object_new_string(o->conn.url), &ok);
	jadd(doc, "namespace", json_object_new_string(o->conn.ns), &ok);
	jadd(doc, "connections", json_object_new_uint64(o->connections), &ok);
	jadd(doc, "batch", json_object_new_uint64(o->batch), &ok);
	jadd(doc, "async", json_object_new_boolean(o->async), &ok);
	jadd(doc, "inflight", json_object_new_uint64(o->async ? o->inflight : 1), &ok);
	jadd(doc, "duration_s", jfixed(o->count ? 0.0 : o->duration_s, 3), &ok);
	jadd(doc, "count", json_object_new_uint64(o->count), &ok);
	for (size_t i = 0; i < rep->n_results; i++) {
		struct json_object *r = jresult(&rep->results[i]);

		if (!r || json_object_array_add(arr, r)) {
			json_object_put(r);
			ok = false;
		}
	}
	jadd(doc, "results", arr, &ok);
	jadd(doc, "verified_blocks", json_object_new_uint64(rep->verified_blocks), &ok);
	jadd(doc, "verified_bytes", json_object_new_uint64(rep->verified_bytes), &ok);
	if (ok)
		fprintf(f, "%s\n", json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN));
	json_object_put(doc);
	return ok ? 0 : -ENOMEM;
}
