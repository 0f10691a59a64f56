/*
 * replay_report.c - counters, latency samples and the report of
 * `kvpool replay`.
 */
#include "replay.h"
#include "cli_opts.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

static const char *const op_names[CLI_REPLAY_NOPS] = { "match", "get", "put" };

int cli_lat_add(struct cli_lat *l, uint64_t us)
{
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 4096;
		uint32_t *n = realloc(l->us, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		l->us = n;
		l->cap = ncap;
	}
	l->us[l->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
	return 0;
}

struct timespec cli_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t;
}

int cli_lat_since(struct cli_lat *l, struct timespec t0)
{
	struct timespec t1 = cli_now();
	int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);

	return cli_lat_add(l, ns > 0 ? (uint64_t)ns / 1000 : 0);
}

int cli_lat_merge(struct cli_lat *into, const struct cli_lat *from)
{
	for (size_t i = 0; i < from->n; i++)
		if (cli_lat_add(into, from->us[i]))
			return -ENOMEM;
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

uint64_t cli_lat_quantile(struct cli_lat *l, double p)
{
	size_t rank;

	if (!l->n)
		return 0;
	qsort(l->us, l->n, sizeof(*l->us), cmp_u32);
	rank = (size_t)ceil(p * (double)l->n);
	rank = rank < 1 ? 1 : rank > l->n ? l->n : rank;
	return l->us[rank - 1];
}

void cli_lat_release(struct cli_lat *l)
{
	if (!l)
		return;
	free(l->us);
	memset(l, 0, sizeof(*l));
}

void cli_replay_count_errno(uint64_t *table, int err)
{
	int e = err < 0 ? -err : err;

	table[e > 0 && e < CLI_REPLAY_ERRNO_SLOTS - 1 ? e : CLI_REPLAY_ERRNO_SLOTS - 1]++;
}

uint64_t cli_replay_errno_total(const uint64_t *table)
{
	uint64_t n = 0;

	for (int e = 0; e < CLI_REPLAY_ERRNO_SLOTS; e++)
		n += table[e];
	return n;
}

int cli_replay_counts_add(struct cli_replay_counts *into, const struct cli_replay_counts *from)
{
	into->requests += from->requests;
	into->block_refs += from->block_refs;
	into->hits += from->hits;
	into->returned += from->returned;
	into->wrong += from->wrong;
	into->get_misses += from->get_misses;
	into->blocks_put += from->blocks_put;
	into->put_retries += from->put_retries;
	into->lease_cuts += from->lease_cuts;
	into->lease_cut_blocks += from->lease_cut_blocks;
	into->get_retries += from->get_retries;
	into->bytes_put += from->bytes_put;
	into->bytes_got += from->bytes_got;
	for (int i = 0; i < CLI_REPLAY_ERRNO_SLOTS; i++) {
		into->put_errors[i] += from->put_errors[i];
		into->get_errors[i] += from->get_errors[i];
		into->match_errors[i] += from->match_errors[i];
	}
	for (int op = 0; op < CLI_REPLAY_NOPS; op++)
		if (cli_lat_merge(&into->lat[op], &from->lat[op]))
			return -ENOMEM;
	return 0;
}

void cli_replay_counts_release(struct cli_replay_counts *c)
{
	if (!c)
		return;
	for (int op = 0; op < CLI_REPLAY_NOPS; op++)
		cli_lat_release(&c->lat[op]);
}

/* Symbolic name of errno slot e ("ENOSPC"), or "other". */
static const char *errno_name(int e)
{
	const char *name = e < CLI_REPLAY_ERRNO_SLOTS - 1 ? strerrorname_np(e) : NULL;

	return name ? name : "other";
}

/* hits / refs, 0 when there are no refs. */
static double ratio(uint64_t hits, uint64_t refs)
{
	return refs ? (double)hits / (double)refs : 0.0;
}

/* Payload GB/s over the wall time. */
static double report_gbps(const struct cli_replay_report *r)
{
	if (r->wall_s <= 0)
		return 0.0;
	return (double)(r->counts.bytes_put + r->counts.bytes_got) / r->wall_s / 1e9;
}

/* A JSON number printed with `prec` decimals. */
static struct json_object *jfixed(double v, int prec)
{
	char buf[64];

	snprintf(buf, sizeof(buf), "%.*f", prec, v);
	return json_object_new_double_s(v, buf);
}

/* {"ENOSPC": n, ...} of the non-zero slots of an errno table. */
static struct json_object *jerrnos(const uint64_t *table)
{
	struct json_object *o = json_object_new_object();

	for (int e = 1; o && e < CLI_REPLAY_ERRNO_SLOTS; e++)
		if (table[e])
			json_object_object_add(o, errno_name(e), json_object_new_uint64(table[e]));
	return o;
}

/* {"match": {"p50": .., "p99": ..}, "get": ..., "put": ...} */
static struct json_object *jlatency(struct cli_replay_counts *c)
{
	struct json_object *o = json_object_new_object();

	for (int op = 0; o && op < CLI_REPLAY_NOPS; op++) {
		struct json_object *q = json_object_new_object();

		json_object_object_add(q, "p50",
				       json_object_new_uint64(cli_lat_quantile(&c->lat[op], 0.50)));
		json_object_object_add(q, "p99",
				       json_object_new_uint64(cli_lat_quantile(&c->lat[op], 0.99)));
		json_object_object_add(o, op_names[op], q);
	}
	return o;
}

int cli_replay_print_json(FILE *f, struct cli_replay_report *r)
{
	struct cli_replay_counts *c = &r->counts;
	struct json_object *o = json_object_new_object();

	if (!o)
		return -ENOMEM;
#define ADD(k, v) json_object_object_add(o, k, v)
	ADD("requests", json_object_new_uint64(c->requests));
	ADD("block_refs", json_object_new_uint64(c->block_refs));
	ADD("hit_ratio", jfixed(ratio(c->hits, c->block_refs), 6));
	ADD("ideal_hit_ratio", jfixed(ratio(r->ideal_hits, c->block_refs), 6));
	ADD("hits", json_object_new_uint64(c->hits));
	ADD("server_get_hits", json_object_new_uint64(r->server_get_hits));
	ADD("client_get_hits", json_object_new_uint64(c->returned));
	ADD("prefill_tokens_saved", json_object_new_uint64(c->hits * r->block_tokens));
	ADD("wrong_blocks", json_object_new_uint64(c->wrong));
	ADD("get_misses", json_object_new_uint64(c->get_misses));
	ADD("get_retries", json_object_new_uint64(c->get_retries));
	ADD("get_errors", jerrnos(c->get_errors));
	ADD("lease_cuts", json_object_new_uint64(c->lease_cuts));
	ADD("lease_cut_blocks", json_object_new_uint64(c->lease_cut_blocks));
	ADD("match_errors", jerrnos(c->match_errors));
	ADD("evictions", json_object_new_uint64(r->evictions));
	ADD("blocks_put", json_object_new_uint64(c->blocks_put));
	ADD("put_retries", json_object_new_uint64(c->put_retries));
	ADD("put_errors", jerrnos(c->put_errors));
	ADD("bytes_put", json_object_new_uint64(c->bytes_put));
	ADD("bytes_got", json_object_new_uint64(c->bytes_got));
	ADD("gbps", jfixed(report_gbps(r), 3));
	ADD("wall_s", jfixed(r->wall_s, 3));
	ADD("latency_us", jlatency(c));
	ADD("block_bytes", json_object_new_uint64(r->block_bytes));
	ADD("block_tokens", json_object_new_uint64(r->block_tokens));
	ADD("concurrency", json_object_new_uint64(r->concurrency));
	ADD("namespace", json_object_new_string(r->ns));
	ADD("namespace_dropped", json_object_new_boolean(r->namespace_dropped));
	ADD("dropped_blocks", json_object_new_uint64(r->dropped_blocks));
#undef ADD
	fprintf(f, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
							   JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
	return 0;
}

/* "ENOSPC 3, ENOLINK 2" (nothing when the table is empty). Returns
 * whether it printed anything. */
static bool print_errnos_inline(FILE *f, const uint64_t *table)
{
	const char *sep = "";

	for (int e = 1; e < CLI_REPLAY_ERRNO_SLOTS; e++) {
		if (!table[e])
			continue;
		fprintf(f, "%s%s %" PRIu64, sep, errno_name(e), table[e]);
		sep = ", ";
	}
	return *sep;
}

/* "ENOSPC 3, ENOLINK 2" or "0", and the end of the line. */
static void print_errnos(FILE *f, const uint64_t *table)
{
	fprintf(f, "%s\n", print_errnos_inline(f, table) ? "" : "0");
}

/* The lines under the title that qualify every figure below them: was
 * the namespace empty, did every block get stored. */
static void print_caveats(FILE *f, const struct cli_replay_report *r)
{
	uint64_t put_errors = cli_replay_errno_total(r->counts.put_errors);

	if (r->namespace_dropped)
		fprintf(f, "  dropped %" PRIu64 " block%s of namespace \"%s\" first\n",
			r->dropped_blocks, r->dropped_blocks == 1 ? "" : "s", r->ns);
	else
		fprintf(f, "  WARNING: --keep-namespace: the figures include what namespace \"%s\" "
			"held before the run\n", r->ns);
	if (put_errors) {
		fprintf(f, "  WARNING: %" PRIu64 " block%s could not be put: the hit ratios are "
			"lower than the pool could give (", put_errors, put_errors == 1 ? "" : "s");
		print_errnos_inline(f, r->counts.put_errors);
		fprintf(f, ")\n");
	}
}

void cli_replay_print_text(FILE *f, struct cli_replay_report *r)
{
	struct cli_replay_counts *c = &r->counts;
	char bb[32], moved[32];

	fprintf(f, "replay of %s: namespace \"%s\" on %s, %u connection%s\n", r->trace_path,
		r->ns, r->url, r->concurrency, r->concurrency == 1 ? "" : "s");
	print_caveats(f, r);
	fprintf(f, "  requests              %" PRIu64 "\n", c->requests);
	fprintf(f, "  block references      %" PRIu64 " (%s blocks, %" PRIu64 " tokens each)\n",
		c->block_refs, cli_fmt_bytes(r->block_bytes, bb, sizeof(bb)), r->block_tokens);
	fprintf(f, "  hit ratio             %.4f  (%" PRIu64 " blocks returned byte-exact)\n",
		ratio(c->hits, c->block_refs), c->hits);
	fprintf(f, "  ideal hit ratio       %.4f  (infinite cache)\n",
		ratio(r->ideal_hits, c->block_refs));
	fprintf(f, "  get hits              %" PRIu64 " by the server, %" PRIu64 " by the client\n",
		r->server_get_hits, c->returned);
	fprintf(f, "  prefill tokens saved  %" PRIu64 "\n", c->hits * r->block_tokens);
	fprintf(f, "  wrong blocks          %" PRIu64 "\n", c->wrong);
	fprintf(f, "  get misses            %" PRIu64 " (matched, then not returned)\n",
		c->get_misses);
	if (c->get_retries)
		fprintf(f, "  get retries           %" PRIu64 " (blocks asked again after BUSY)\n",
			c->get_retries);
	if (cli_replay_errno_total(c->get_errors)) {
		fprintf(f, "  get errors            ");
		print_errnos(f, c->get_errors);
	}
	if (c->lease_cuts)
		fprintf(f, "  lease cuts            %" PRIu64 " (%" PRIu64 " blocks present past the "
			"run whose lease fit: put again)\n", c->lease_cuts, c->lease_cut_blocks);
	if (cli_replay_errno_total(c->match_errors)) {
		fprintf(f, "  match refusals        ");
		print_errnos(f, c->match_errors);
	}
	fprintf(f, "  evictions             %" PRIu64 "\n", r->evictions);
	fprintf(f, "  blocks put            %" PRIu64 " (%" PRIu64 " sent again after BUSY)\n",
		c->blocks_put, c->put_retries);
	fprintf(f, "  put errors            ");
	print_errnos(f, c->put_errors);
	fprintf(f, "  throughput            %.3f GB/s (%s put + got in %.3f s)\n",
		report_gbps(r), cli_fmt_bytes(c->bytes_put + c->bytes_got, moved, sizeof(moved)),
		r->wall_s);
	fprintf(f, "  latency (us)          %8s %8s\n", "p50", "p99");
	for (int op = 0; op < CLI_REPLAY_NOPS; op++)
		fprintf(f, "    %-19s %8" PRIu64 " %8" PRIu64 "\n", op_names[op],
			cli_lat_quantile(&c->lat[op], 0.50), cli_lat_quantile(&c->lat[op], 0.99));
}
