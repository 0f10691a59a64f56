/*
 * test_cli.c - the kvpool CLI against a real kvpoold: exit codes (0 ok, 1
 * miss, 2 error), put/get of a file, stats --json, and replay of the first
 * 300 requests of the bundled Mooncake trace with a big arena (hit ratio
 * at the ideal, server and client hit counts agree) and a small one
 * (evictions, still no wrong block).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"

#define TRACE_LINES 300
#define RUN_MS 60000

static struct {
	struct harness_server srv;   /* big arena */
	struct harness_server small; /* test_replay_small_arena's own server */
	const char *cli;
	char trace[128];             /* temp file: first TRACE_LINES lines */
	char tmpdir[64];
} g;

static int group_setup(void **state)
{
	(void)state;
	g.cli = getenv("KVPOOL_CLI");
	snprintf(g.tmpdir, sizeof(g.tmpdir), "/tmp/kvpool-integ-cli-XXXXXX");
	if (!mkdtemp(g.tmpdir)) {
		print_error("mkdtemp: %s\n", strerror(errno));
		return -1;
	}
	return harness_group_start(&g.srv, harness_default_flags);
}

static int group_teardown(void **state)
{
	static const char *const files[] = { "block.in", "block.out", "miss.out", "bad.jsonl" };
	char path[128];

	(void)state;
	harness_kill(&g.srv);
	harness_kill(&g.small);
	if (g.trace[0])
		unlink(g.trace);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", g.tmpdir, files[i]);
		unlink(path);
	}
	rmdir(g.tmpdir);
	return 0;
}

/* Skip unless the CLI is built and the server runs. */
static void need_cli(void)
{
	harness_need_server(&g.srv);
	if (!g.cli || access(g.cli, X_OK) != 0)
		harness_skip("kvpool CLI not built (is KVPOOL_CLI set?)");
}

static char *tmp_path(const char *name)
{
	static char path[128];

	snprintf(path, sizeof(path), "%s/%s", g.tmpdir, name);
	return path;
}

/* Run the CLI with up to 15 arguments; returns its exit status and frees
 * (or hands back, when out is not NULL) its stdout. */
static int run_cli(char **out, const char *first, ...)
{
	char *argv[18];
	char *output = NULL;
	va_list ap;
	int n = 0, status = -1, err;

	argv[n++] = (char *)g.cli;
	argv[n++] = (char *)first;
	va_start(ap, first);
	for (char *a = va_arg(ap, char *); a && n < 17; a = va_arg(ap, char *))
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	err = harness_run(argv, RUN_MS, &output, &status);
	if (err)
		fail_msg("running %s %s: %s", g.cli, first, strerror(-err));
	if (out)
		*out = output;
	else
		free(output);
	return status;
}

static void test_ping(void **state)
{
	(void)state;
	need_cli();
	assert_int_equal(run_cli(NULL, "ping", "--server", g.srv.url, NULL), 0);
}

static void test_bad_server_url(void **state)
{
	(void)state;
	need_cli();
	assert_int_equal(run_cli(NULL, "ping", "--server", "notaurl", NULL), 2);
	assert_int_equal(run_cli(NULL, "ping", "--server", "udp://127.0.0.1:7470", NULL), 2);
	/* Nobody listens on port 1. */
	assert_int_equal(run_cli(NULL, "ping", "--server", "tcp://127.0.0.1:1", NULL), 2);
}

static void test_put_get_miss(void **state)
{
	uint8_t data[10000], got[10001];
	FILE *f;
	size_t n;

	(void)state;
	need_cli();
	harness_fill(data, sizeof(data), 11);
	f = fopen(tmp_path("block.in"), "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, sizeof(data), f), sizeof(data));
	fclose(f);
	assert_int_equal(run_cli(NULL, "put", "text:cli-block", tmp_path("block.in"), "--server",
				 g.srv.url, "--namespace", "cli-ops", NULL),
			 0);
	assert_int_equal(run_cli(NULL, "get", "text:cli-block", "-o", tmp_path("block.out"),
				 "--server", g.srv.url, "--namespace", "cli-ops", NULL),
			 0);
	f = fopen(tmp_path("block.out"), "rb");
	assert_non_null(f);
	n = fread(got, 1, sizeof(got), f);
	fclose(f);
	assert_int_equal(n, sizeof(data));
	assert_memory_equal(got, data, sizeof(data));

	/* Missing key: exit 1, no output file. Other namespace: also a miss. */
	assert_int_equal(run_cli(NULL, "get", "text:cli-missing", "-o", tmp_path("miss.out"),
				 "--server", g.srv.url, "--namespace", "cli-ops", NULL),
			 1);
	assert_int_not_equal(access(tmp_path("miss.out"), F_OK), 0);
	assert_int_equal(run_cli(NULL, "get", "text:cli-block", "-o", tmp_path("miss.out"),
				 "--server", g.srv.url, "--namespace", "cli-other", NULL),
			 1);
	/* A key that is not a key: usage error. */
	assert_int_equal(run_cli(NULL, "get", "xyz", "--server", g.srv.url, NULL), 2);
}

static void test_stats_json(void **state)
{
	struct json_object *doc;
	char *out = NULL;
	uint64_t cap = 0;

	(void)state;
	need_cli();
	assert_int_equal(run_cli(&out, "stats", "--json", "--server", g.srv.url, NULL), 0);
	doc = json_tokener_parse(out);
	free(out);
	assert_non_null(doc);
	assert_int_equal(harness_json_u64(doc, "tiers.dram.capacity_bytes", &cap), 0);
	assert_int_equal(cap, 64u << 20); /* as harness_default_flags asks */
	json_object_put(doc);
}

/* Write the first TRACE_LINES lines of the bundled trace to a temp file. */
static void make_trace(void)
{
	const char *data = getenv("KVPOOL_TEST_DATA");
	char src_path[512], line[1 << 16];
	FILE *src, *dst;
	int fd;

	if (g.trace[0])
		return;
	if (!data)
		harness_skip("KVPOOL_TEST_DATA is not set");
	snprintf(src_path, sizeof(src_path), "%s/synthetic_trace.jsonl", data);
	src = fopen(src_path, "r");
	if (!src)
		harness_skip("tests/data/synthetic_trace.jsonl not found");
	snprintf(g.trace, sizeof(g.trace), "%s/trace-XXXXXX", g.tmpdir);
	fd = mkstemp(g.trace);
	assert_true(fd >= 0);
	dst = fdopen(fd, "w");
	assert_non_null(dst);
	for (int i = 0; i < TRACE_LINES; i++) {
		assert_non_null(fgets(line, sizeof(line), src));
		assert_non_null(strchr(line, '\n')); /* whole lines only */
		fputs(line, dst);
	}
	fclose(src);
	assert_int_equal(fclose(dst), 0);
}

/* Infinite-cache hit ratio of the trace file, computed here independently:
 * a block reference hits when its whole prefix of hash ids was seen. */
static double ideal_hit_ratio(const char *path, uint64_t *refs_out)
{
	size_t cap = 1 << 16, used = 0;
	uint64_t *set = calloc(cap, sizeof(*set));
	uint64_t refs = 0, hits = 0;
	char line[1 << 16];
	FILE *f = fopen(path, "r");

	assert_non_null(set);
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		struct json_object *doc = json_tokener_parse(line), *ids;
		uint64_t h = 0x84222325CBF29CE4ull;

		assert_non_null(doc);
		assert_true(json_object_object_get_ex(doc, "hash_ids", &ids));
		for (size_t i = 0; i < json_object_array_length(ids); i++) {
			uint64_t id = (uint64_t)json_object_get_int64(json_object_array_get_idx(ids, i));
			size_t slot;

			/* Chain the ids like the keys are chained; 0 marks empty. */
			h = (h ^ id) * 0x100000001B3ull;
			h ^= h >> 29;
			h |= 1;
			refs++;
			for (slot = h & (cap - 1); set[slot] && set[slot] != h; slot = (slot + 1) & (cap - 1))
				;
			if (set[slot]) {
				hits++;
			} else {
				set[slot] = h;
				used++;
				assert_true(used < cap / 2);
			}
		}
		json_object_put(doc);
	}
	fclose(f);
	free(set);
	*refs_out = refs;
	return (double)hits / (double)refs;
}

/* Run replay --json and return its report (one JSON line alone on stdout). */
static struct json_object *replay(const struct harness_server *srv, const char *ns, int *status)
{
	struct json_object *doc;
	char *out = NULL, *nl;

	*status = run_cli(&out, "replay", "--json", "--block-bytes", "4096", "--server", srv->url,
			  "--namespace", ns, g.trace, NULL);
	nl = strchr(out, '\n');
	if (!nl || nl[1] != '\0')
		fail_msg("replay --json printed not exactly one line: \"%s\"", out);
	doc = json_tokener_parse(out);
	if (!doc || !json_object_is_type(doc, json_type_object))
		fail_msg("replay --json printed no JSON object: \"%s\"", out);
	free(out);
	return doc;
}

/* Checks every replay report passes; returns the hit ratio. */
static double check_report(struct json_object *rep, struct kvpool_client *c, const char *ns)
{
	uint64_t refs = 0, server_hits, client_hits = 0;
	double ideal = ideal_hit_ratio(g.trace, &refs), hit_ratio;

	assert_int_equal(harness_json_u64_or_fail(rep, "requests"), TRACE_LINES);
	assert_int_equal(harness_json_u64_or_fail(rep, "block_refs"), refs);
	assert_int_equal(harness_json_u64_or_fail(rep, "wrong_blocks"), 0);
	/* The report rounds ratios to 6 decimals. */
	assert_true(fabs(harness_json_double_or_fail(rep, "ideal_hit_ratio") - ideal) < 1e-5);
	hit_ratio = harness_json_double_or_fail(rep, "hit_ratio");
	assert_true(hit_ratio >= 0 && hit_ratio <= ideal + 1e-5);
	assert_true(harness_json_double_or_fail(rep, "gbps") > 0);
	server_hits = harness_json_u64_or_fail(rep, "server_get_hits");
	/* The client's hits: byte-exact GETs, hit_ratio * block_refs. */
	assert_true(fabs((double)server_hits - hit_ratio * (double)refs) < 0.5);
	if (harness_json_u64(rep, "client_get_hits", &client_hits) == 0)
		assert_int_equal(server_hits, client_hits);
	/* And the server says the same when we ask it ourselves. */
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "get_hits"), server_hits);
	return hit_ratio;
}

static void test_replay_big_arena(void **state)
{
	struct kvpool_client *c = NULL;
	struct json_object *rep;
	uint64_t refs = 0;
	double ideal, hit_ratio;
	int status;

	(void)state;
	need_cli();
	make_trace();
	ideal = ideal_hit_ratio(g.trace, &refs);
	assert_int_equal(harness_client(&g.srv, "cli-big", &c), 0);
	rep = replay(&g.srv, "cli-big", &status);
	assert_int_equal(status, 0);
	hit_ratio = check_report(rep, c, "cli-big");
	if (fabs(hit_ratio - ideal) > 0.005)
		fail_msg("hit_ratio %.4f is not within 0.005 of the ideal %.4f", hit_ratio, ideal);
	assert_int_equal(harness_json_u64_or_fail(rep, "evictions"), 0);
	json_object_put(rep);
	kvpool_close(c);
}

/* Issue 28 item 2: a chain whose lease would pass the connection's
 * leased-bytes bound stopped the replay ("request at line 122: match:
 * quota exceeded" on this trace with a 256 KiB bound; the bundled trace
 * stopped at line 2,205 with 64 MiB of DRAM and an NVMe tier). Now the
 * server answers the run whose lease fits, and the replay goes on and
 * counts the cut. */
static void test_replay_lease_cut(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "64MiB", "--max-block-bytes", "1MiB",
		"--max-conn-leased-bytes", "256KiB", "--threads", "2", "--log-level", "warn", NULL,
	};
	struct harness_server srv = { 0 };
	struct kvpool_client *c = NULL;
	struct json_object *rep;
	int status;

	(void)state;
	need_cli();
	make_trace();
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(harness_client(&srv, "cli-cut", &c), 0);
	rep = replay(&srv, "cli-cut", &status);
	assert_int_equal(status, 0);
	check_report(rep, c, "cli-cut");
	assert_true(harness_json_u64_or_fail(rep, "lease_cuts") > 0);
	assert_true(harness_json_u64_or_fail(rep, "lease_cut_blocks") > 0);
	json_object_put(rep);
	kvpool_close(c);
	assert_int_equal(harness_stop(&srv), 0);
}

/* kvpool bench --ops match counts lease cuts (and whole refusals) instead
 * of failing the run (issue 28 item 2). */
static void test_bench_match_lease_cut(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "64MiB", "--max-block-bytes", "1MiB",
		"--max-conn-leased-bytes", "64KiB", "--threads", "2", "--log-level", "warn", NULL,
	};
	struct harness_server srv = { 0 };
	struct json_object *doc, *results, *m;
	char *out = NULL;
	int status;

	(void)state;
	need_cli();
	assert_int_equal(harness_start(&srv, flags), 0);
	status = run_cli(&out, "bench", "--json", "--server", srv.url, "--ops", "match",
			 "--chain", "200", "--sizes", "64KiB", "--lease-ms", "1000", "--duration",
			 "1", NULL);
	assert_int_equal(status, 0);
	doc = json_tokener_parse(out);
	assert_non_null(doc);
	assert_true(json_object_object_get_ex(doc, "results", &results));
	m = json_object_array_get_idx(results, 0);
	assert_non_null(m);
	assert_true(harness_json_u64_or_fail(m, "calls") > 0);
	/* every match of the 200-block chain is cut to what 64 KiB leases */
	assert_int_equal(harness_json_u64_or_fail(m, "lease_cuts"),
			 harness_json_u64_or_fail(m, "calls"));
	assert_int_equal(harness_json_u64_or_fail(m, "refused"), 0);
	json_object_put(doc);
	free(out);
	assert_int_equal(harness_stop(&srv), 0);
}

static void test_replay_small_arena(void **state)
{
	/* 1024 blocks of 4 KiB for ~7,300 distinct blocks. */
	static const char *const flags[] = {
		"--dram-capacity", "4MiB", "--max-block-bytes", "1MiB", "--max-inflight-put-bytes",
		"2MiB", "--threads", "2", "--log-level", "warn", NULL,
	};
	struct kvpool_client *c = NULL;
	struct json_object *rep;
	int status;

	(void)state;
	need_cli();
	make_trace();
	assert_int_equal(harness_start(&g.small, flags), 0);
	assert_int_equal(harness_client(&g.small, "cli-small", &c), 0);
	rep = replay(&g.small, "cli-small", &status);
	assert_int_equal(status, 0);
	check_report(rep, c, "cli-small");
	assert_true(harness_json_u64_or_fail(rep, "evictions") > 0);
	assert_true(harness_stat_or_fail(c, "evictions") > 0);
	assert_int_equal(harness_stat_or_fail(c, "leases_active"), 0);
	json_object_put(rep);
	kvpool_close(c);
	assert_int_equal(harness_stop(&g.small), 0);
}

static void test_malformed_trace(void **state)
{
	static const char *const bad[] = {
		"{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2,\n",
		"{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": \"x\"}\n",
		"not json at all\n",
	};

	(void)state;
	need_cli();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		FILE *f = fopen(tmp_path("bad.jsonl"), "w");

		assert_non_null(f);
		fputs("{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, "
		      "\"hash_ids\": [1, 2]}\n", f);
		fputs(bad[i], f);
		fclose(f);
		if (run_cli(NULL, "replay", "--json", "--block-bytes", "4096", "--server", g.srv.url,
			    "--namespace", "cli-bad", tmp_path("bad.jsonl"), NULL) != 2)
			fail_msg("replay of a trace with line \"%.40s...\" did not exit 2", bad[i]);
	}
	/* A trace file that does not exist. */
	assert_int_equal(run_cli(NULL, "replay", "--server", g.srv.url, tmp_path("nonexistent"),
				 NULL),
			 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ping),
		cmocka_unit_test(test_bad_server_url),
		cmocka_unit_test(test_put_get_miss),
		cmocka_unit_test(test_stats_json),
		cmocka_unit_test(test_replay_big_arena),
		cmocka_unit_test(test_replay_small_arena),
		cmocka_unit_test(test_replay_lease_cut),
		cmocka_unit_test(test_bench_match_lease_cut),
		cmocka_unit_test(test_malformed_trace),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_cli", tests, group_setup, group_teardown);
}
