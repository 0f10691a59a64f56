/*
 * test_cli.c - unit tests of the kvpool CLI: its pure parts (trace lines,
 * trace loading and ordering, key chaining, the infinite-cache ideal, the
 * payload generator and checker, size units, keys, connection messages,
 * STATS counters, latency quantiles and the replay reports), then its
 * subcommands run in-process against the fake server of fake_server.h
 * (put's "already stored" and size limit, option messages, replay's
 * namespace drop and its retries of busy puts), and `kvpool bench`: its
 * option parsing, keys and payload checks, and short runs against the fake
 * server (a corrupted GET must fail the run).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>
#include <openssl/evp.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "cli/cli_key.h"
#include "cli/cli_opts.h"
#include "cli/cli_stats.h"
#include "cli/payload.h"
#include "cli/replay.h"
#include "cli/trace.h"
#include "fake_server.h"

/* Parse a NUL-terminated line; returns the parser's result. */
static int parse(const char *line, struct cli_trace_req *req, char *err, size_t errlen)
{
	return cli_trace_parse_line(line, strlen(line), req, err, errlen);
}

static void test_parse_good_line(void **state)
{
	struct cli_trace_req r;
	char err[256] = "";

	(void)state;
	assert_int_equal(parse("{\"timestamp\": 27482, \"input_length\": 6955, "
			       "\"output_length\": 52, \"hash_ids\": [46, 47, 0, "
			       "18446744073709551615], \"extra\": {\"x\": [1]}}\n",
			       &r, err, sizeof(err)), 0);
	assert_true(r.timestamp_ms == 27482.0);
	assert_int_equal(r.input_tokens, 6955);
	assert_int_equal(r.output_tokens, 52);
	assert_int_equal(r.n_hash_ids, 4);
	assert_int_equal(r.hash_ids[0], 46);
	assert_int_equal(r.hash_ids[2], 0);
	assert_true(r.hash_ids[3] == UINT64_MAX);
	assert_null(r.keys);
	cli_trace_req_release(&r);
}

static void test_parse_timestamp_forms(void **state)
{
	struct cli_trace_req r;
	char err[256];

	(void)state;
	assert_int_equal(parse("{\"timestamp\": \"1234.5\", \"input_length\": 1, "
			       "\"output_length\": 1, \"hash_ids\": []}", &r, err, sizeof(err)), 0);
	assert_true(r.timestamp_ms == 1234.5);
	assert_int_equal(r.n_hash_ids, 0);
	cli_trace_req_release(&r);
	assert_int_equal(parse("{\"timestamp\": \"77\", \"input_length\": 1, "
			       "\"output_length\": 1, \"hash_ids\": [3]}\r\n", &r, err, sizeof(err)),
			 0);
	assert_true(r.timestamp_ms == 77.0);
	cli_trace_req_release(&r);
	assert_int_equal(parse("{\"timestamp\": 0.25, \"input_length\": 1, "
			       "\"output_length\": 1, \"hash_ids\": [3]}", &r, err, sizeof(err)), 0);
	assert_true(r.timestamp_ms == 0.25);
	cli_trace_req_release(&r);
	/* The ends of the accepted range. */
	assert_int_equal(parse("{\"timestamp\": 0, \"input_length\": 1, "
			       "\"output_length\": 1, \"hash_ids\": [3]}", &r, err, sizeof(err)), 0);
	assert_true(r.timestamp_ms == 0.0);
	cli_trace_req_release(&r);
	assert_int_equal(parse("{\"timestamp\": 1e15, \"input_length\": 1, "
			       "\"output_length\": 1, \"hash_ids\": [3]}", &r, err, sizeof(err)), 0);
	assert_true(r.timestamp_ms == 1e15);
	cli_trace_req_release(&r);
}

/* Every line here must be refused with an error containing `needle`. */
static const struct bad_line {
	const char *line;
	const char *needle;
} bad_lines[] = {
	{ "", "empty" },
	{ "   \n", "empty" },
	{ "{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}", "timestamp" },
	{ "{\"timestamp\": 1, \"output_length\": 1, \"hash_ids\": []}", "input_length" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"hash_ids\": []}", "output_length" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}", "hash_ids" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": 5}",
	  "hash_ids must be an array" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, \"2\"]}",
	  "hash_ids[1]" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, -2]}",
	  "hash_ids[1]" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1.5]}",
	  "hash_ids[0]" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [null]}",
	  "hash_ids[0]" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
	  "\"hash_ids\": [18446744073709551616]}", "out of 64-bit range" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
	  "\"hash_ids\": [99999999999999999999999999]}", "out of 64-bit range" },
	{ "{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": []}",
	  "input_length" },
	{ "{\"timestamp\": 1, \"input_length\": \"5\", \"output_length\": 1, \"hash_ids\": []}",
	  "input_length" },
	{ "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": true, \"hash_ids\": []}",
	  "output_length" },
	{ "{\"timestamp\": \"soon\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp" },
	{ "{\"timestamp\": \"\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp" },
	{ "{\"timestamp\": \"12x\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp" },
	{ "{\"timestamp\": null, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp" },
	{ "{\"timestamp\": [1], \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp" },
	{ "{\"timestamp\": \"nan\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "finite" },
	{ "{\"timestamp\": NaN, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "finite" },
	{ "{\"timestamp\": -Infinity, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "finite" },
	{ "{\"timestamp\": \"inf\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "finite" },
	{ "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp -5 is negative" },
	{ "{\"timestamp\": \"-0.5\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "negative" },
	{ "{\"timestamp\": 1e16, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "timestamp 1e+16 is absurd" },
	{ "{\"timestamp\": 18446744073709551615, \"input_length\": 1, \"output_length\": 1, "
	  "\"hash_ids\": []}", "absurd" },
	{ "{\"timestamp\": \"1e300\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
	  "absurd" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, 2",
	  "truncated" },
	{ "{\"timestamp\": 1, \"input_le", "truncated" },
	{ "[1, 2, 3]", "not a JSON object" },
	{ "42 ", "not a JSON object" },
	{ "\"timestamp\"", "not a JSON object" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []} x",
	  "after the JSON value" },
	{ "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}{}",
	  "after the JSON value" },
	{ "{timestamp: 1}", "invalid JSON" },
};

static void test_parse_bad_lines(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(bad_lines) / sizeof(bad_lines[0]); i++) {
		struct cli_trace_req r = { .n_hash_ids = 12345 };
		char err[256] = "";
		int rc = parse(bad_lines[i].line, &r, err, sizeof(err));

		if (rc != -EINVAL || !strstr(err, bad_lines[i].needle))
			fail_msg("line %zu '%s': rc %d, err '%s', want '%s'", i, bad_lines[i].line,
				 rc, err, bad_lines[i].needle);
		assert_int_equal(r.n_hash_ids, 12345);  /* untouched on failure */
	}
}

/* Only line[0..len) is read: what follows (no NUL here) is ignored. */
static void test_parse_respects_len(void **state)
{
	static const char buf[] = "{\"timestamp\": 5, \"input_length\": 1, "
				  "\"output_length\": 1, \"hash_ids\": [12]}99999999999999999999999";
	size_t len = strchr(buf, '}') - buf + 1;
	struct cli_trace_req r;
	char err[256];

	(void)state;
	assert_int_equal(cli_trace_parse_line(buf, len, &r, err, sizeof(err)), 0);
	assert_int_equal(r.hash_ids[0], 12);
	cli_trace_req_release(&r);
	assert_int_equal(cli_trace_parse_line(buf, len - 1, &r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated"));
}

/* A string with a quote and digits must not be mistaken for a number. */
static void test_parse_digits_in_strings(void **state)
{
	struct cli_trace_req r;
	char err[256];

	(void)state;
	assert_int_equal(parse("{\"note\": \"99999999999999999999999 \\\" 1\", \"timestamp\": 1, "
			       "\"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}",
			       &r, err, sizeof(err)), 0);
	cli_trace_req_release(&r);
}

/* Read a trace held in memory. */
static int read_mem(const char *text, size_t limit, struct cli_trace *t, char *err,
		    size_t errlen)
{
	FILE *f = fmemopen((void *)text, strlen(text), "r");
	int rc;

	assert_non_null(f);
	rc = cli_trace_read(f, "mem", limit, t, err, errlen);
	fclose(f);
	return rc;
}

#define LINE(ts, ids) "{\"timestamp\": " #ts ", \"input_length\": 512, " \
		      "\"output_length\": 1, \"hash_ids\": " ids "}\n"

static void test_read_sorts_stably(void **state)
{
	static const char text[] =
		LINE(30, "[9]")
		"\n"
		LINE(10, "[1]")
		LINE("20", "[2]")
		LINE(10, "[3]")
		LINE(0.5, "[4, 5]");
	struct cli_trace t;
	char err[256];

	(void)state;
	assert_int_equal(read_mem(text, 0, &t, err, sizeof(err)), 0);
	assert_int_equal(t.n_reqs, 5);
	assert_int_equal(t.n_refs, 6);
	assert_int_equal(t.reqs[0].hash_ids[0], 4);
	assert_int_equal(t.reqs[0].line, 6);
	assert_int_equal(t.reqs[1].hash_ids[0], 1);  /* ties keep file order */
	assert_int_equal(t.reqs[1].line, 3);
	assert_int_equal(t.reqs[2].hash_ids[0], 3);
	assert_int_equal(t.reqs[3].hash_ids[0], 2);
	assert_int_equal(t.reqs[4].hash_ids[0], 9);
	assert_ptr_equal(t.reqs[0].keys, t.keys);
	assert_ptr_equal(t.reqs[1].keys, t.keys + 2);
	cli_trace_destroy(&t);

	assert_int_equal(read_mem(text, 2, &t, err, sizeof(err)), 0);
	assert_int_equal(t.n_reqs, 2);
	assert_int_equal(t.n_refs, 3);
	assert_int_equal(t.reqs[1].hash_ids[0], 1);
	cli_trace_destroy(&t);
	cli_trace_destroy(NULL);
}

static void test_read_names_bad_line(void **state)
{
	static const char text[] = LINE(1, "[1]") LINE(2, "[2]") "\n" LINE(3, "[-3]");
	static const char negative[] = LINE(1, "[1]") LINE(-2, "[2]");
	struct cli_trace t = { .n_reqs = 77 };
	char err[256] = "";

	(void)state;
	assert_int_equal(read_mem(negative, 0, &t, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "mem:2: timestamp -2 is negative: want milliseconds from 0 to 1e15");
	assert_int_equal(read_mem(text, 0, &t, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "mem:4: "));
	assert_non_null(strstr(err, "hash_ids[0]"));
	assert_int_equal(t.n_reqs, 77);
	assert_int_equal(cli_trace_load("/nonexistent/trace.jsonl", 0, &t, err, sizeof(err)),
			 -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/trace.jsonl"));
}

/* SHA-256 of data[0..len) computed here, independently of the CLI. */
static void sha256(const void *data, size_t len, uint8_t out[32])
{
	assert_int_equal(EVP_Digest(data, len, out, NULL, EVP_sha256(), NULL), 1);
}

static void test_chain_matches_sha256(void **state)
{
	uint64_t ids[3] = { 7, UINT64_MAX, 0x0102030405060708ULL };
	uint8_t keys[3][32], want[32], buf[40];
	char hex[CLI_KEY_HEX_BYTES];

	(void)state;
	assert_int_equal(cli_trace_chain_keys(ids, 3, keys), 0);
	/* fixed vectors */
	assert_string_equal(cli_key_hex(keys[0], hex),
			    "aae89fc0f03e2959ae4d701a80cc3915918c950b159f6abb6c92c1433b1a8534");
	assert_string_equal(cli_key_hex(keys[1], hex),
			    "582b3af3778b2b6356c9e819deb643f68322fec71b4166bc196c58f2a35a7d18");
	/* the rule, computed directly */
	memcpy(buf, keys[1], 32);
	for (int b = 0; b < 8; b++)
		buf[32 + b] = (uint8_t)(ids[2] >> (8 * b));
	assert_int_equal(buf[32], 0x08);
	sha256(buf, sizeof(buf), want);
	assert_memory_equal(keys[2], want, 32);
	/* the first key hashes no parent bytes */
	sha256("\x07\0\0\0\0\0\0\0", 8, want);
	assert_memory_equal(keys[0], want, 32);
}

static void test_ideal_small_trace(void **state)
{
	/* file order differs from time order: [1,2,3,4] comes at t=3 */
	static const char text[] =
		LINE(3, "[1, 2, 3, 4]")   /* after t0..t2: 1,2,3 seen -> 3 */
		LINE(0, "[1, 2, 3]")      /* nothing seen -> 0 */
		LINE(1, "[1, 2, 4]")      /* 1,2 -> 2 (4 after 2 is new) */
		LINE(2, "[5, 2, 3]")      /* a new first id: its chain is new -> 0 */
		LINE(4, "[2, 3]")         /* [2] alone is another chain -> 0 */
		LINE(5, "[]")
		LINE(6, "[1, 2, 4, 9]");  /* 1,2,4 -> 3 */
	struct cli_trace t;
	uint64_t hits = 99;
	char err[256];

	(void)state;
	assert_int_equal(read_mem(text, 0, &t, err, sizeof(err)), 0);
	assert_int_equal(t.n_refs, 19);
	assert_int_equal(cli_trace_ideal_hits(&t, &hits), 0);
	assert_int_equal(hits, 8);
	cli_trace_destroy(&t);

	/* only the first three requests in time order */
	assert_int_equal(read_mem(text, 3, &t, err, sizeof(err)), 0);
	assert_int_equal(cli_trace_ideal_hits(&t, &hits), 0);
	assert_int_equal(hits, 2);
	assert_int_equal(t.n_refs, 9);
	cli_trace_destroy(&t);
}

/* The bundled Mooncake trace: the ideal must come out 0.6396. */
static void test_ideal_synthetic_trace(void **state)
{
	const char *dir = getenv("KVPOOL_TEST_DATA");
	struct cli_trace t;
	uint64_t hits;
	char path[4096], err[512];

	(void)state;
	snprintf(path, sizeof(path), "%s/synthetic_trace.jsonl", dir ? dir : "tests/data");
	if (cli_trace_load(path, 0, &t, err, sizeof(err)))
		fail_msg("%s (set KVPOOL_TEST_DATA)", err);
	assert_int_equal(t.n_reqs, 3993);
	assert_int_equal(t.n_refs, 121877);
	assert_int_equal(cli_trace_ideal_hits(&t, &hits), 0);
	assert_int_equal(hits, 77953);
	assert_true((double)hits / (double)t.n_refs > 0.63955);
	assert_true((double)hits / (double)t.n_refs < 0.63965);
	cli_trace_destroy(&t);
}

static void test_payload_roundtrip_and_damage(void **state)
{
	static const size_t lens[] = { 1, 7, 8, 9, 4095, 4096, 65536 + 3 };
	uint8_t a[32], b[32];

	(void)state;
	sha256("a", 1, a);
	sha256("b", 1, b);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t len = lens[i];
		uint8_t *buf = malloc(len), *again = malloc(len);
		size_t offs[3] = { 0, len / 2, len - 1 };

		assert_non_null(buf);
		assert_non_null(again);
		cli_payload_fill(a, buf, len);
		cli_payload_fill(a, again, len);
		assert_memory_equal(buf, again, len);
		assert_true(cli_payload_check(a, buf, len));
		assert_false(cli_payload_check(b, buf, len));
		for (int k = 0; k < 3; k++) {
			buf[offs[k]] ^= 0x10;
			assert_false(cli_payload_check(a, buf, len));
			buf[offs[k]] ^= 0x10;
		}
		assert_true(cli_payload_check(a, buf, len));
		free(buf);
		free(again);
	}
}

static void test_payload_torn_block(void **state)
{
	size_t len = 64 << 10;
	uint8_t a[32], b[32], *buf = malloc(len), *other = malloc(len);

	(void)state;
	assert_non_null(buf);
	assert_non_null(other);
	sha256("block a", 7, a);
	memcpy(b, a, 32);
	b[31] ^= 1;   /* a key that differs in its last byte only */
	cli_payload_fill(a, buf, len);
	cli_payload_fill(b, other, len);
	assert_memory_not_equal(buf, other, 64);
	/* second half from the other key's block */
	memcpy(buf + len / 2, other + len / 2, len / 2);
	assert_false(cli_payload_check(a, buf, len));
	assert_false(cli_payload_check(b, buf, len));
	/* only the last 8 bytes torn */
	cli_payload_fill(a, buf, len);
	memcpy(buf + len - 8, other + len - 8, 8);
	assert_false(cli_payload_check(a, buf, len));
	free(buf);
	free(other);
}

static void test_parse_size(void **state)
{
	static const struct {
		const char *s;
		uint64_t want;
	} good[] = {
		{ "4096", 4096 }, { "64KiB", 65536 }, { "64kib", 65536 }, { "64 KiB", 65536 },
		{ "1KB", 1000 }, { "1.5GiB", 1610612736ULL }, { "0.5KiB", 512 },
		{ "2MB", 2000000 }, { "1MiB", 1048576 }, { "3B", 3 }, { "1TiB", 1ULL << 40 },
		{ "1.25kB", 1250 }, { "18446744073709551615", UINT64_MAX },
	};
	static const struct {
		const char *s;
		int err;
	} bad[] = {
		{ "", -EINVAL }, { "KiB", -EINVAL }, { "-1", -EINVAL }, { "1.5", -EINVAL },
		{ "12XB", -EINVAL }, { "1e3", -EINVAL }, { " 1", -EINVAL }, { "1.1B", -EINVAL },
		{ "0.0001KiB", -EINVAL }, { "18446744073709551616", -ERANGE },
		{ "20000PiB", -ERANGE }, { "64KiBs", -EINVAL },
	};
	uint64_t v;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		v = 1;
		if (cli_parse_size(good[i].s, &v) || v != good[i].want)
			fail_msg("'%s' gave %llu", good[i].s, (unsigned long long)v);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 42;
		if (cli_parse_size(bad[i].s, &v) != bad[i].err || v != 42)
			fail_msg("'%s' was not refused with %d", bad[i].s, bad[i].err);
	}
}

static void test_parse_numbers_and_exit_codes(void **state)
{
	uint64_t v = 5;
	double d = 0;

	(void)state;
	assert_int_equal(cli_parse_u64("12", 1, 100, &v), 0);
	assert_int_equal(v, 12);
	assert_int_equal(cli_parse_u64("0", 1, 100, &v), -ERANGE);
	assert_int_equal(cli_parse_u64("101", 1, 100, &v), -ERANGE);
	assert_int_equal(cli_parse_u64("-3", 0, 100, &v), -EINVAL);
	assert_int_equal(cli_parse_u64("3x", 0, 100, &v), -EINVAL);
	assert_int_equal(v, 12);
	assert_int_equal(cli_parse_nonneg_double("2.5", &d), 0);
	assert_true(d == 2.5);
	assert_int_equal(cli_parse_nonneg_double("-1", &d), -EINVAL);
	assert_int_equal(cli_parse_nonneg_double("inf", &d), -EINVAL);
	assert_int_equal(cli_exit_code(0), CLI_EXIT_OK);
	assert_int_equal(cli_exit_code(-ENOENT), CLI_EXIT_MISS);
	assert_int_equal(cli_exit_code(-ENOSPC), CLI_EXIT_MISS);
	/* FULL in a user's words, without the library's output-array case */
	assert_null(strstr(cli_strerror(-ENOSPC), "array"));
	assert_non_null(strstr(cli_strerror(-ENOSPC), "pool full"));
	assert_string_equal(cli_strerror(-ENOENT), kvpool_strerror(-ENOENT));
	assert_int_equal(cli_exit_code(-ECONNREFUSED), CLI_EXIT_ERROR);
	assert_int_equal(cli_exit_code(-EPROTO), CLI_EXIT_ERROR);
}

static void test_key_parse(void **state)
{
	uint8_t k[32], again[32];
	char hex[CLI_KEY_HEX_BYTES];

	(void)state;
	assert_int_equal(cli_key_parse("text:abc", k), 0);
	assert_string_equal(cli_key_hex(k, hex),
			    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	assert_int_equal(cli_key_parse("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
				       again), 0);
	assert_memory_equal(k, again, 32);
	assert_int_equal(cli_key_parse("ba7816bf", again), -EINVAL);
	assert_int_equal(cli_key_parse("za7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
				       again), -EINVAL);
	assert_int_equal(cli_key_parse("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0",
				       again), -EINVAL);
	assert_memory_equal(k, again, 32);
}

static void test_stats_counters(void **state)
{
	static const char doc[] =
		"{\"version\":\"0.1.0\",\"evictions\":12,\"namespaces\":{"
		"\"llama/tp0\":{\"get_hits\":5},\"replay\":{\"get_hits\":77953}}}";
	struct cli_stats_counters c = { 1, 1 };

	(void)state;
	assert_int_equal(cli_stats_parse_counters(doc, "replay", &c), 0);
	assert_int_equal(c.ns_get_hits, 77953);
	assert_int_equal(c.evictions, 12);
	assert_int_equal(cli_stats_parse_counters(doc, "llama/tp0", &c), 0);
	assert_int_equal(c.ns_get_hits, 5);
	assert_int_equal(cli_stats_parse_counters(doc, "absent", &c), 0);
	assert_int_equal(c.ns_get_hits, 0);
	assert_int_equal(cli_stats_parse_counters("{\"namespaces\":{}}", "replay", &c), -EPROTO);
	assert_int_equal(cli_stats_parse_counters("not json", "replay", &c), -EPROTO);
	assert_int_equal(c.evictions, 12);
}

/* cli_stats_report into a string (caller frees); asserts it succeeded. */
static char *stats_report(const char *json)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	assert_int_equal(cli_stats_report(f, json), 0);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void assert_has(const char *text, const char *needle)
{
	if (!strstr(text, needle))
		fail_msg("report lacks '%s':\n%s", needle, text);
}

/* The report shows both tiers when the server has an NVMe tier, and says
 * the tier is off when it has none. */
static void test_stats_report_tiers(void **state)
{
	static const char two[] =
		"{\"version\":\"0.1.0\",\"protocol\":1,\"pid\":7,\"uptime_s\":3,"
		"\"tiers\":{\"dram\":{\"capacity_bytes\":67108864,\"used_bytes\":65536,"
		"\"payload_bytes\":60000,\"free_bytes\":67043328,\"largest_free_bytes\":67043328,"
		"\"fragmentation\":0.0,\"blocks\":3,\"inflight_put_bytes\":0,"
		"\"evict_passes\":17,\"evict_pass_max_us\":2345},"
		"\"nvme\":{\"enabled\":true,\"direct_io\":false,\"healthy\":true,"
		"\"capacity_bytes\":1073741824,\"segment_bytes\":134217728,"
		"\"used_bytes\":268435456,\"payload_bytes\":5000000,\"blocks\":41,"
		"\"demotions\":45,\"demoted_bytes\":4000000,\"promotions\":6,"
		"\"promoted_bytes\":600000,\"bytes_written\":5000000,\"bytes_read\":700000,"
		"\"rewritten_bytes\":1000000,\"segments_reclaimed\":2,"
		"\"admission_rejections\":9,\"evictions\":4,\"corrupt_blocks\":1,"
		"\"read_errors\":0,\"write_errors\":0,\"rebuild_ms\":250,"
		"\"rebuild_blocks\":100000,\"orphans_dropped\":12}},"
		"\"blocks\":42,\"evictions\":0,\"checksum_errors\":5,"
		"\"rdma\":{\"built\":true,\"available\":true,\"port\":7472,\"reason\":\"\","
		"\"connections\":{\"current\":2,\"total\":9},\"bytes_read\":3145728,"
		"\"bytes_written\":1048576,\"transfer_errors\":1},"
		"\"kv_events\":{\"enabled\":true,\"produced\":120,\"published\":100,"
		"\"dropped\":20,\"queued\":0,\"batches\":7,\"resync_batches\":2,"
		"\"replay_requests\":3,\"replayed_batches\":11,\"replay_errors\":0},"
		"\"retention\":{\"retained_blocks\":8,\"retained_bytes\":131072,\"refused\":3,"
		"\"expired\":5,\"max_retain_ms\":86400000,\"max_retained_bytes\":16777216},"
		"\"tenants\":{\"0123456789ab\":{\"retained_blocks\":8,\"retained_bytes\":131072,"
		"\"retain_budget_bytes\":1048576,\"retain_refused\":3,\"retain_expired\":5}},"
		"\"namespaces\":{\"m\":{\"blocks\":42,\"nvme_blocks\":41,\"bytes\":5060000,"
		"\"retained_blocks\":8,\"retained_bytes\":131072}}}";
	static const char one[] =
		"{\"version\":\"0.1.0\",\"tiers\":{\"dram\":{\"blocks\":3},"
		"\"nvme\":{\"enabled\":false}},\"blocks\":3}";
	char *r;

	(void)state;
	r = stats_report(two);
	assert_non_null(strstr(r, "\ndram "));
	assert_has(r, "\nnvme             41 ");
	assert_has(r, "blocks 42 (in either tier)");
	assert_has(r, "checksum errors 5\n");
	assert_has(r, "dram eviction passes 17, longest 2345 us\n");
	assert_has(r, "nvme tier: buffered I/O (no O_DIRECT here), healthy");
	assert_has(r, "demotions   45 blocks");
	assert_has(r, "promotions 6 blocks");
	assert_has(r, "of 2 segments (write amplification 1.25)");
	assert_has(r, "admission rejections 9, evictions 4, corrupt blocks 1");
	assert_has(r, "rebuild at start: 100000 blocks in 250 ms (400000 blocks/s), "
		      "12 orphans dropped");
	assert_has(r, "on nvme");
	assert_has(r, "m                            42         41 ");
	assert_has(r, "rdma: available on port 7472\n  connections 2 now, 9 total; read 3");
	assert_has(r, "; transfer errors 1\n");
	assert_has(r, "kv events: 100 published in 7 batches, 20 dropped (2 resync batches), "
		      "0 queued; replay requests 3 (11 batches)\n");
	/* retention: a column per namespace, a line, a row per tenant */
	assert_has(r, "evictions    retained\n");
	assert_has(r, "retention: 8 blocks (128.0 KiB) retained, 3 refused for a budget, 5 expired; "
		      "budget 16.0 MiB per tenant");
	assert_has(r, "0123456789ab            8   128.0 KiB    1.00 MiB          3          5\n");
	free(r);

	r = stats_report(one);
	assert_null(strstr(r, "\nnvme   ")); /* no NVMe row */
	assert_has(r, "nvme tier: off (no nvme_dir)");
	assert_null(strstr(r, "eviction passes")); /* an older server's document */
	assert_null(strstr(r, "kv events")); /* nor kv events */
	assert_null(strstr(r, "retention:")); /* nor retention */
	free(r);
	assert_int_equal(cli_stats_report(stdout, "not json"), -EPROTO);
}

static int slow_call(int rc)
{
	struct timespec t = { 0, 2000000 }; /* 2 ms */

	nanosleep(&t, NULL);
	return rc;
}

/* CLI_LAT_TIMED (replay's and bench's call timer) yields the call's value
 * and records how long the call took, in microseconds. */
static void test_lat_timed(void **state)
{
	struct cli_lat l = { 0 };

	(void)state;
	assert_int_equal(CLI_LAT_TIMED(&l, slow_call(-EAGAIN)), -EAGAIN);
	assert_int_equal(CLI_LAT_TIMED(&l, slow_call(0)), 0);
	assert_int_equal(l.n, 2);
	assert_true(l.us[0] >= 2000 && l.us[1] >= 2000);
	assert_true(l.us[0] < 10000000);
	cli_lat_release(&l);
}

static void test_latency_quantiles(void **state)
{
	struct cli_lat l = { 0 }, m = { 0 };

	(void)state;
	assert_int_equal(cli_lat_quantile(&l, 0.5), 0);
	for (uint64_t v = 100; v >= 1; v--)
		assert_int_equal(cli_lat_add(&l, v), 0);
	assert_int_equal(cli_lat_quantile(&l, 0.50), 50);
	assert_int_equal(cli_lat_quantile(&l, 0.99), 99);
	assert_int_equal(cli_lat_quantile(&l, 1.0), 100);
	assert_int_equal(cli_lat_add(&m, 1ULL << 40), 0);
	assert_int_equal(cli_lat_merge(&l, &m), 0);
	assert_int_equal(l.n, 101);
	assert_int_equal(cli_lat_quantile(&l, 1.0), UINT32_MAX);
	cli_lat_release(&l);
	cli_lat_release(&m);
	cli_lat_release(NULL);
}

static void test_replay_json_report(void **state)
{
	struct cli_replay_report r = {
		.trace_path = "t.jsonl", .url = "tcp://127.0.0.1:1", .ns = "replay",
		.block_bytes = 65536, .block_tokens = 512, .concurrency = 1,
		.ideal_hits = 6, .server_get_hits = 5, .evictions = 2, .wall_s = 0.5,
	};
	struct json_object *o, *v;
	char *text = NULL;
	size_t len = 0;
	FILE *f;

	(void)state;
	r.counts.requests = 3;
	r.counts.block_refs = 10;
	r.counts.hits = 5;
	r.counts.returned = 5;
	r.counts.bytes_put = 250000000;
	r.counts.bytes_got = 250000000;
	cli_replay_count_errno(r.counts.put_errors, -ENOSPC);
	cli_replay_count_errno(r.counts.put_errors, -ENOSPC);
	assert_int_equal(cli_lat_add(&r.counts.lat[CLI_REPLAY_GET], 42), 0);
	f = open_memstream(&text, &len);
	assert_non_null(f);
	assert_int_equal(cli_replay_print_json(f, &r), 0);
	fclose(f);
	assert_non_null(strchr(text, '\n'));
	assert_ptr_equal(strchr(text, '\n'), text + len - 1);  /* one line */
	o = json_tokener_parse(text);
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "hit_ratio", &v));
	assert_true(json_object_get_double(v) == 0.5);
	assert_true(json_object_object_get_ex(o, "ideal_hit_ratio", &v));
	assert_true(json_object_get_double(v) == 0.6);
	assert_true(json_object_object_get_ex(o, "gbps", &v));
	assert_true(json_object_get_double(v) == 1.0);
	assert_true(json_object_object_get_ex(o, "prefill_tokens_saved", &v));
	assert_int_equal(json_object_get_int64(v), 2560);
	assert_true(json_object_object_get_ex(o, "put_errors", &v));
	assert_true(json_object_object_get_ex(v, "ENOSPC", &v));
	assert_int_equal(json_object_get_int64(v), 2);
	assert_true(json_object_object_get_ex(o, "latency_us", &v));
	assert_true(json_object_object_get_ex(v, "get", &v));
	assert_true(json_object_object_get_ex(v, "p99", &v));
	assert_int_equal(json_object_get_int64(v), 42);
	for (const char *const *k = (const char *const[]){ "requests", "block_refs",
			"server_get_hits", "client_get_hits", "wrong_blocks", "evictions",
			"wall_s", "put_retries", "namespace_dropped", "dropped_blocks",
			NULL }; *k; k++)
		if (!json_object_object_get_ex(o, *k, NULL))
			fail_msg("key %s missing", *k);
	json_object_put(o);
	free(text);
	cli_replay_counts_release(&r.counts);
}

/* ---- connection messages ------------------------------------------------ */

static void test_ns_valid(void **state)
{
	char name[300];

	(void)state;
	memset(name, 'n', sizeof(name));
	name[255] = '\0';
	assert_true(cli_ns_valid(name));
	name[255] = 'n';
	name[256] = '\0';
	assert_false(cli_ns_valid(name));
	assert_true(cli_ns_valid("llama3-8b:bf16:tp1/b16"));
	assert_true(cli_ns_valid("~!"));
	assert_false(cli_ns_valid(""));
	assert_false(cli_ns_valid(NULL));
	assert_false(cli_ns_valid("a b"));
	assert_false(cli_ns_valid("tab\there"));
	assert_false(cli_ns_valid("del\x7f"));
	assert_false(cli_ns_valid("caf\xc3\xa9"));
}

/* Each failure of kvpool_connect is said in its own words. */
static void test_connect_error_messages(void **state)
{
	struct cli_conn conn = { .url = "tcp://127.0.0.1:7470", .ns = "a b" };
	char buf[512];

	(void)state;
	assert_string_equal(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			    "bad namespace \"a b\": namespace must be 1..255 printable ASCII "
			    "characters without spaces");
	conn = (struct cli_conn){ .url = "notaurl", .ns = "default" };
	assert_string_equal(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			    "bad URL: expected tcp://, tls://, rdma:// or auto:// then host[:port], a node "
			    "list (tcp://a:7470,b:7470) or etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER, "
			    "got 'notaurl'");
	conn.url = "udp://127.0.0.1:7470";
	assert_string_equal(cli_connect_error(&conn, -EOPNOTSUPP, buf, sizeof(buf)),
			    "bad URL: expected tcp://, tls://, rdma:// or auto:// then host[:port], a node "
			    "list (tcp://a:7470,b:7470) or etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER "
			    "(unknown scheme), got 'udp://127.0.0.1:7470'");
	/* cluster URLs: what is wrong with them, in words */
	conn.url = "etcd://127.0.0.1:2379";
	assert_non_null(strstr(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			       "bad etcd URL: expected etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER"));
	conn.url = "etcd://127.0.0.1:2379/typo";
	assert_non_null(strstr(cli_connect_error(&conn, -ENXIO, buf, sizeof(buf)),
			       "no kvpoold is registered in etcd under kvpool/typo/nodes/"));
	conn.url = "tcp://a:1,rdma://b:1";
	assert_non_null(strstr(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			       "bad node list: it mixes tcp:// and rdma://: every node must use "
			       "the same scheme"));
	conn.url = "tcp://a:1,b:1,A:1";
	assert_non_null(strstr(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			       "bad node list: node A:1 is listed twice"));
	conn.url = "tcp://a:1,,b:1";
	assert_non_null(strstr(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			       "bad node list: an empty entry in the node list"));
	conn.url = "tcp://a:1,b:1";
	assert_non_null(strstr(cli_connect_error(&conn, -E2BIG, buf, sizeof(buf)),
			       "bad node list: more than 64 nodes: expected"));
	assert_non_null(strstr(cli_connect_error(&conn, -EINVAL, buf, sizeof(buf)),
			       "bad node list: expected tcp://"));
	/* A tcp:// URL and -EOPNOTSUPP: the server's protocol version. */
	conn.url = "tcp://h:1";
	assert_non_null(strstr(cli_connect_error(&conn, -EOPNOTSUPP, buf, sizeof(buf)),
			       "cannot connect to tcp://h:1 (namespace \"default\"): not supported"));
	/* rdma:// is a scheme libkvpool knows: -EOPNOTSUPP is not a bad URL. */
	conn.url = "rdma://h:1";
	assert_non_null(strstr(cli_connect_error(&conn, -EOPNOTSUPP, buf, sizeof(buf)),
			       "cannot connect to rdma://h:1 (namespace \"default\"): not supported"));
	conn.url = "tcp://no-such-host.invalid:1";
	assert_string_equal(cli_connect_error(&conn, -ENOENT, buf, sizeof(buf)),
			    "cannot connect to tcp://no-such-host.invalid:1: host name does not "
			    "resolve");
	conn.url = "tcp://127.0.0.1:1";
	assert_string_equal(cli_connect_error(&conn, -ECONNREFUSED, buf, sizeof(buf)),
			    "cannot connect to tcp://127.0.0.1:1 (namespace \"default\"): "
			    "connection refused: server not reachable");
	/* Truncated to the buffer, still a string. */
	assert_int_equal(strlen(cli_connect_error(&conn, -ECONNREFUSED, buf, 10)), 9);
}

/* The text report says first whether the figures stand on an empty
 * namespace, and warns when blocks could not be put. */
static void test_replay_text_caveats(void **state)
{
	struct cli_replay_report r = {
		.trace_path = "t.jsonl", .url = "tcp://127.0.0.1:1", .ns = "replay",
		.block_bytes = 4096, .block_tokens = 16, .concurrency = 1,
		.namespace_dropped = true, .dropped_blocks = 7,
	};
	char *text = NULL;
	size_t len = 0;
	FILE *f;

	(void)state;
	f = open_memstream(&text, &len);
	cli_replay_print_text(f, &r);
	fclose(f);
	assert_non_null(strstr(text, "\n  dropped 7 blocks of namespace \"replay\" first\n"));
	assert_null(strstr(text, "WARNING"));
	assert_non_null(strstr(text, "  put errors            0\n"));
	free(text);

	r.namespace_dropped = false;
	cli_replay_count_errno(r.counts.put_errors, -EAGAIN);
	cli_replay_count_errno(r.counts.put_errors, -EAGAIN);
	cli_replay_count_errno(r.counts.put_errors, -ENOSPC);
	assert_int_equal(cli_replay_errno_total(r.counts.put_errors), 3);
	f = open_memstream(&text, &len);
	cli_replay_print_text(f, &r);
	fclose(f);
	assert_null(strstr(text, "dropped"));
	assert_non_null(strstr(text, "\n  WARNING: --keep-namespace: the figures include what "
				     "namespace \"replay\" held before the run\n"));
	assert_non_null(strstr(text, "\n  WARNING: 3 blocks could not be put: the hit ratios are "
				     "lower than the pool could give (EAGAIN 2, ENOSPC 1)\n"));
	assert_non_null(strstr(text, "  put errors            EAGAIN 2, ENOSPC 1\n"));
	/* Both warnings come before the figures. */
	assert_true(strstr(text, "WARNING: 3 blocks") < strstr(text, "hit ratio"));
	free(text);
	cli_replay_counts_release(&r.counts);
}

/* ---- subcommands against the fake server --------------------------------- */

/* What a subcommand printed and returned. */
struct run {
	int status;
	char *out;
	char *err;
};

/* The whole of a temporary file, NUL-terminated, malloc'd. */
static char *slurp(FILE *f)
{
	long n;
	char *buf;

	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	assert_true(n >= 0);
	rewind(f);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* Run subcommand `fn` in this process with the arguments after `name`
 * (NULL-terminated), its stdout and stderr captured. */
static void run_cmd(struct run *r, int (*fn)(int, char **), const char *name, ...)
{
	char *argv[32];
	FILE *out = tmpfile(), *err = tmpfile();
	int argc = 0, saved_out, saved_err;
	va_list ap;

	assert_non_null(out);
	assert_non_null(err);
	argv[argc++] = (char *)name;
	va_start(ap, name);
	for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *)) {
		assert_true(argc < 31);
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;
	fflush(stdout);
	fflush(stderr);
	saved_out = dup(STDOUT_FILENO);
	saved_err = dup(STDERR_FILENO);
	dup2(fileno(out), STDOUT_FILENO);
	dup2(fileno(err), STDERR_FILENO);
	r->status = fn(argc, argv);
	fflush(stdout);
	fflush(stderr);
	dup2(saved_out, STDOUT_FILENO);
	dup2(saved_err, STDERR_FILENO);
	close(saved_out);
	close(saved_err);
	r->out = slurp(out);
	r->err = slurp(err);
}

static void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
	r->out = r->err = NULL;
}

/* A fake server and temp files for one test. */
struct cli_env {
	struct fake fk;
	char url[64];
	char path[64];   /* a temp file: trace or block */
};

static struct cli_env *cli_env_open(const struct proto_hello_reply *limits)
{
	struct cli_env *e = calloc(1, sizeof(*e));
	int fd;

	assert_non_null(e);
	e->fk.limits = *limits;
	fake_start(&e->fk, 0);
	snprintf(e->url, sizeof(e->url), "tcp://127.0.0.1:%u", (unsigned)e->fk.port);
	snprintf(e->path, sizeof(e->path), "/tmp/kvpool-test-cli-XXXXXX");
	fd = mkstemp(e->path);
	assert_true(fd >= 0);
	close(fd);
	return e;
}

static void cli_env_close(struct cli_env *e)
{
	fake_stop(&e->fk);
	fake_release(&e->fk);
	unlink(e->path);
	free(e);
}

static int cli_setup(void **state)
{
	*state = cli_env_open(&fake_default_limits);
	return 0;
}

static int cli_teardown(void **state)
{
	cli_env_close(*state);
	return 0;
}

/* Write text to the env's temp file. */
static void write_file(struct cli_env *e, const char *text, size_t len)
{
	FILE *f = fopen(e->path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* A second put of a stored key says so, and sends no PUT. */
static void test_put_already_stored(void **state)
{
	struct cli_env *e = *state;
	struct run r;

	write_file(e, "some kv bytes", 13);
	run_cmd(&r, cli_put_main, "kvpool put", "text:blk", e->path, "--server", e->url,
		"--namespace", "t-put", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, " stored (13 B)\n"));
	assert_null(strstr(r.out, "already"));
	run_free(&r);
	run_cmd(&r, cli_put_main, "kvpool put", "text:blk", e->path, "--server", e->url,
		"--namespace", "t-put", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, " already stored (nothing written)\n"));
	assert_string_equal(r.err, "");
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 1);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_EXISTS]), 2);
	assert_string_equal(e->fk.hello_ns, "t-put");
}

/* A fake that speaks protocol 2. */
static struct cli_env *cli_env_open_v2(void)
{
	struct proto_hello_reply lim = fake_default_limits;

	lim.version = 2;
	lim.max_match_wait_ms = 30000;
	lim.max_retain_ms = 86400000;
	return cli_env_open(&lim);
}

/* put --retain-ms sends the retention (also for a block already stored,
 * which it extends) and says what the server granted, in words. */
static void test_put_retain_ms(void **state)
{
	struct cli_env *e = cli_env_open_v2();
	struct run r;

	(void)state;
	write_file(e, "some kv bytes", 13);
	e->fk.put_flags = PROTO_PUT_RETAINED | PROTO_PUT_RETAIN_CLAMPED;
	e->fk.put_retain_ms = 86400000;
	run_cmd(&r, cli_put_main, "kvpool put", "text:r", "--retain-ms", "90000000", e->path,
		"--server", e->url, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, " stored (13 B); retained, cut to the server's "
				      "max_retain_ms\n"));
	assert_int_equal(e->fk.last_put_retain_ms, 90000000);
	run_free(&r);
	/* already stored: put again, which extends the retention */
	e->fk.put_flags = PROTO_PUT_RETAIN_BUDGET;
	e->fk.put_retain_ms = 0;
	run_cmd(&r, cli_put_main, "kvpool put", "text:r", "--retain-ms", "1000", e->path,
		"--server", e->url, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, " already stored (nothing written); not retained: over "
				      "the retention budget\n"));
	assert_int_equal(e->fk.last_put_retain_ms, 1000);
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 2);
	run_cmd(&r, cli_put_main, "kvpool put", "text:r", "--retain-ms", "-1", e->path,
		"--server", e->url, NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--retain-ms wants milliseconds"));
	run_free(&r);
	run_cmd(&r, cli_put_main, "kvpool put", "text:r", "--retain-ms", "4294967296", e->path,
		"--server", e->url, NULL);
	assert_int_equal(r.status, 2);
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 2);
	cli_env_close(e);
	/* a v1 server: the block is stored, the retention not asked */
	e = cli_env_open(&fake_default_limits);
	write_file(e, "abc", 3);
	run_cmd(&r, cli_put_main, "kvpool put", "text:v1", "--retain-ms", "500", e->path,
		"--server", e->url, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, " stored (3 B); retention not asked: the server speaks "
				      "protocol 1 only\n"));
	assert_int_equal(e->fk.last_put_retain_ms, 0);
	run_free(&r);
	cli_env_close(e);
}

/* Put keys text:k0 .. text:k{n-1} as a chain through the library. */
static void put_text_chain(struct cli_env *e, int n)
{
	struct kvpool_client *c;
	uint8_t keys[8][KVPOOL_KEY_BYTES];

	assert_true(n <= 8);
	assert_int_equal(kvpool_connect(e->url, "default", NULL, &c), 0);
	for (int i = 0; i < n; i++) {
		char text[32];

		snprintf(text, sizeof(text), "text:k%d", i);
		assert_int_equal(cli_key_parse(text, keys[i]), 0);
		assert_int_equal(kvpool_put_bytes(c, keys[i], i ? keys[i - 1] : NULL, "x", 1), 0);
	}
	kvpool_close(c);
}

/* match --wait-ms --want --retain-ms: sent as asked, the answer in words,
 * exit 0 once the wanted run is held; bad values are usage errors. */
static void test_match_v2_options(void **state)
{
	struct cli_env *e = cli_env_open_v2();
	struct run r;

	(void)state;
	put_text_chain(e, 2);
	e->fk.match_v2.flags = PROTO_MATCH_WAITED | PROTO_MATCH_WAIT_TIMEOUT;
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "text:k1", "text:k2",
		"--wait-ms", "100", "--want", "2", "--retain-ms", "50", "--lease-ms", "7",
		"--server", e->url, NULL);
	assert_int_equal(r.status, 0); /* the 2 wanted are held */
	assert_string_equal(r.out, "matched 2 of 3\n"
				   "present 2, lease 7 ms, retained 0 for 0 ms, flags: waited, "
				   "wait timed out\n");
	assert_int_equal(e->fk.last_match_version, 2);
	assert_int_equal(e->fk.last_match_opts.want, 2);
	assert_int_equal(e->fk.last_match_opts.retain_ms, 50);
	assert_true(e->fk.last_match_opts.wait_ms > 0 && e->fk.last_match_opts.wait_ms <= 100);
	run_free(&r);
	/* all three wanted: a miss; a lease cut is said even unasked */
	e->fk.match_v2.flags = PROTO_MATCH_LEASE_CUT;
	e->fk.match_cut = 1;
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "text:k1", "text:k2",
		"--lease-ms", "100", "--server", e->url, NULL);
	assert_int_equal(r.status, 1);
	assert_string_equal(r.out, "matched 1 of 3\n"
				   "present 2, lease 100 ms, retained 0 for 0 ms, flags: lease cut\n");
	run_free(&r);
	/* a plain match prints one line, as before */
	e->fk.match_v2.flags = 0;
	e->fk.match_cut = 0;
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "text:k1", "--server", e->url,
		NULL);
	assert_int_equal(r.status, 0);
	assert_string_equal(r.out, "matched 2 of 2\n");
	run_free(&r);
	/* bad values: nothing sent */
	atomic_store(&e->fk.frames[PROTO_OP_MATCH], 0);
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "--want", "2", "--server",
		e->url, NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--want 2 is more than the 1 keys given"));
	run_free(&r);
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "--want", "0", "--server",
		e->url, NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--want wants a count of blocks"));
	run_free(&r);
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "--wait-ms", "soon", "--server",
		e->url, NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--wait-ms wants milliseconds"));
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 0);
	run_cmd(&r, cli_match_main, "kvpool match", "--help", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "--wait-ms MS"));
	assert_non_null(strstr(r.out, "--want N"));
	assert_non_null(strstr(r.out, "--retain-ms MS"));
	run_free(&r);
	cli_env_close(e);
}

/* Against a v1 server the options are not sent, and the output says so. */
static void test_match_v2_options_v1_server(void **state)
{
	struct cli_env *e = *state;
	struct run r;

	put_text_chain(e, 2);
	run_cmd(&r, cli_match_main, "kvpool match", "text:k0", "text:k1", "--wait-ms", "100",
		"--server", e->url, NULL);
	assert_int_equal(r.status, 0);
	assert_string_equal(r.out, "matched 2 of 2\n"
				   "server speaks protocol 1 only: --wait-ms, --want and "
				   "--retain-ms were not sent\n");
	assert_int_equal(e->fk.last_match_version, 1);
	assert_int_equal(e->fk.last_match_opts.wait_ms, 0);
	run_free(&r);
}

/* A block above the server's limit is refused (exit 1) naming that limit,
 * without reading more of the file than the limit. */
static void test_put_too_large(void **state)
{
	struct proto_hello_reply lim = fake_default_limits;
	static char data[2000];
	struct cli_env *e;
	struct run r;

	(void)state;
	lim.max_block_bytes = 1000;
	e = cli_env_open(&lim);
	write_file(e, data, sizeof(data));
	run_cmd(&r, cli_put_main, "kvpool put", "text:big", e->path, "--server", e->url, NULL);
	assert_int_equal(r.status, 1);
	/* The file is read only up to the limit, so its size is not known. */
	assert_non_null(strstr(r.err, " holds more than the server's max_block_bytes 1000\n"));
	assert_string_equal(r.out, "");
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 0);
	cli_env_close(e);
}

/* A bad namespace is refused before connecting, a bad URL is named, and
 * a host that does not resolve is not reported as "not found". */
static void test_option_messages(void **state)
{
	struct cli_env *e = *state;
	struct run r;

	run_cmd(&r, cli_ping_main, "kvpool ping", "--server", e->url, "--namespace", "a b", NULL);
	assert_int_equal(r.status, 2);
	assert_string_equal(r.err, "kvpool ping: bad --namespace \"a b\": namespace must be "
				   "1..255 printable ASCII characters without spaces\n");
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.connections), 0);
	run_cmd(&r, cli_ping_main, "kvpool ping", "--server", "notaurl", NULL);
	assert_int_equal(r.status, 2);
	assert_string_equal(r.err, "kvpool ping: bad URL: expected tcp://, tls://, rdma:// or auto:// "
				   "then host[:port], a node list (tcp://a:7470,b:7470) or "
				   "etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER, got 'notaurl'\n");
	run_free(&r);
	run_cmd(&r, cli_ping_main, "kvpool ping", "--server", "tcp://no-such-host.invalid:1",
		NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "host name does not resolve"));
	run_free(&r);
	run_cmd(&r, cli_ping_main, "kvpool ping", "--server", e->url, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "pong from "));
	run_free(&r);
}

/* Three requests: 5 distinct blocks in 10 references, 5 of them seen
 * before (ideal 0.5). */
static const char small_trace[] =
	LINE(0, "[1, 2, 3]")
	LINE(1, "[1, 2, 4]")
	LINE(2, "[1, 2, 3, 5]");

/* Run replay --json on the env's trace with extra arguments (up to 4). */
static struct json_object *replay_json(struct cli_env *e, struct run *r, const char *a1,
				       const char *a2, const char *a3)
{
	struct json_object *doc;

	run_cmd(r, cli_replay_main, "kvpool replay", "--json", "--server", e->url, "--namespace",
		"t-replay", e->path, a1, a2, a3, NULL);
	doc = json_tokener_parse(r->out);
	if (!doc)
		fail_msg("replay printed no JSON (exit %d): %s / %s", r->status, r->out, r->err);
	return doc;
}

/* A member of a replay report: an integer, or the double times 1e6. */
static int64_t jget(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v))
		fail_msg("report has no \"%s\"", key);
	if (json_object_is_type(v, json_type_double))
		return (int64_t)(json_object_get_double(v) * 1e6 + 0.5);
	return json_object_get_int64(v);
}

/* Replay empties its namespace first: a second run with another block
 * size finds no block of the first (which came back "wrong" before), and
 * a rerun scores the trace, not what the last run left. --keep-namespace
 * keeps it, and the report says the figures include it. */
static void test_replay_drops_namespace(void **state)
{
	struct cli_env *e = *state;
	struct json_object *rep;
	struct run r;

	write_file(e, small_trace, strlen(small_trace));
	rep = replay_json(e, &r, "--block-bytes", "4096", NULL);
	assert_int_equal(r.status, 0);
	assert_int_equal(jget(rep, "namespace_dropped"), 1);
	assert_int_equal(jget(rep, "dropped_blocks"), 0);
	assert_int_equal(jget(rep, "hit_ratio"), 500000);
	assert_int_equal(jget(rep, "blocks_put"), 5);
	json_object_put(rep);
	run_free(&r);

	rep = replay_json(e, &r, "--block-bytes", "8192", NULL);
	assert_int_equal(r.status, 0);
	assert_int_equal(jget(rep, "wrong_blocks"), 0);
	assert_int_equal(jget(rep, "dropped_blocks"), 5);
	assert_int_equal(jget(rep, "hit_ratio"), 500000);
	assert_int_equal(jget(rep, "ideal_hit_ratio"), 500000);
	json_object_put(rep);
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_DROP_NAMESPACE]), 2);

	/* Kept: every block is there already. */
	run_cmd(&r, cli_replay_main, "kvpool replay", "--keep-namespace", "--block-bytes", "8192",
		"--server", e->url, "--namespace", "t-replay", e->path, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "WARNING: --keep-namespace: the figures include what "
				      "namespace \"t-replay\" held before the run\n"));
	assert_non_null(strstr(r.out, "  hit ratio             1.0000"));
	run_free(&r);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_DROP_NAMESPACE]), 2);

	/* And the human report of a dropping run says how much went. */
	run_cmd(&r, cli_replay_main, "kvpool replay", "--block-bytes", "8192", "--server", e->url,
		"--namespace", "t-replay", e->path, NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "\n  dropped 5 blocks of namespace \"t-replay\" first\n"));
	assert_non_null(strstr(r.out, "  hit ratio             0.5000"));
	assert_null(strstr(r.out, "WARNING"));
	run_free(&r);

	run_cmd(&r, cli_replay_main, "kvpool replay", "--help", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "--keep-namespace"));
	assert_non_null(strstr(r.out, "drops every block of its namespace"));
	run_free(&r);
}

/* A put the server turns away as busy is sent again after a short wait:
 * three BUSY blocks cost no put error and no hit. */
static void test_replay_retries_busy(void **state)
{
	struct cli_env *e = *state;
	struct json_object *rep, *v;
	struct run r;

	write_file(e, small_trace, strlen(small_trace));
	atomic_store(&e->fk.busy_puts, 3);
	rep = replay_json(e, &r, "--block-bytes", "4096", NULL);
	assert_int_equal(r.status, 0);
	assert_true(json_object_object_get_ex(rep, "put_errors", &v));
	assert_int_equal(json_object_object_length(v), 0);
	assert_int_equal(jget(rep, "put_retries"), 3);
	assert_int_equal(jget(rep, "blocks_put"), 5);
	assert_int_equal(jget(rep, "hit_ratio"), 500000);
	assert_int_equal(atomic_load(&e->fk.busy_puts), 0);
	assert_null(strstr(r.err, "warning"));
	json_object_put(rep);
	run_free(&r);
}

/* A server that stays busy: each batch is tried 1 + 5 times, then its
 * blocks count as put errors, loudly, and the exit status stays 0. */
static void test_replay_busy_for_good(void **state)
{
	struct cli_env *e = *state;
	struct run r;

	write_file(e, small_trace, strlen(small_trace));
	atomic_store(&e->fk.busy_puts, 1000000);
	run_cmd(&r, cli_replay_main, "kvpool replay", "--block-bytes", "4096", "--server", e->url,
		"--namespace", "t-busy", e->path, NULL);
	assert_int_equal(r.status, 0);
	/* 3 + 3 + 4 blocks, 6 times each */
	assert_int_equal(atomic_load(&e->fk.put_blocks), 60);
	assert_non_null(strstr(r.err, "kvpool replay: warning: 10 blocks could not be put"));
	assert_non_null(strstr(r.out, "\n  WARNING: 10 blocks could not be put: the hit ratios "
				      "are lower than the pool could give (EAGAIN 10)\n"));
	assert_non_null(strstr(r.out, "  put errors            EAGAIN 10\n"));
	run_free(&r);
}

/* ---- kvpool bench ------------------------------------------------------------ */

static void test_bench_parse_sizes(void **state)
{
	static const char *const bad[] = {
		"", ",", "64KiB,", ",64KiB", "64KiB,,1MiB", "0", "64KiB,0", "2GiB", "1.5B",
		"64XB", "-1", "64KiB,64KiB", "1MiB,1024KiB", "abc", " 64KiB",
		"1234567890123456789012345678901234567890123456789012345678901234567890",
	};
	uint64_t sizes[CLI_BENCH_MAX_SIZES] = { 7 };
	size_t n = 99;

	(void)state;
	assert_int_equal(cli_bench_parse_sizes("64KiB,256KiB,1MiB,4MiB,16MiB", sizes,
					       CLI_BENCH_MAX_SIZES, &n), 0);
	assert_int_equal(n, 5);
	assert_int_equal(sizes[0], 65536);
	assert_int_equal(sizes[2], 1 << 20);
	assert_int_equal(sizes[4], 16 << 20);
	assert_int_equal(cli_bench_parse_sizes("1GiB,1,4096", sizes, CLI_BENCH_MAX_SIZES, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(sizes[0], 1ULL << 30);
	assert_int_equal(sizes[1], 1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		sizes[0] = 7;
		n = 99;
		if (cli_bench_parse_sizes(bad[i], sizes, CLI_BENCH_MAX_SIZES, &n) != -EINVAL)
			fail_msg("'%s' was not refused as -EINVAL", bad[i]);
		assert_int_equal(sizes[0], 7);  /* nothing written on failure */
		assert_int_equal(n, 99);
	}
	assert_int_equal(cli_bench_parse_sizes("1,2,3", sizes, 2, &n), -E2BIG);
	assert_int_equal(cli_bench_parse_sizes("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", sizes,
					       CLI_BENCH_MAX_SIZES, &n), -E2BIG);
	assert_int_equal(cli_bench_parse_sizes(NULL, sizes, CLI_BENCH_MAX_SIZES, &n), -EINVAL);
}

static void test_bench_parse_ops(void **state)
{
	unsigned int m = 12345;

	(void)state;
	assert_int_equal(cli_bench_parse_ops("get", &m), 0);
	assert_int_equal(m, 1u << CLI_BENCH_GET);
	assert_int_equal(cli_bench_parse_ops("match,put", &m), 0);
	assert_int_equal(m, (1u << CLI_BENCH_MATCH) | (1u << CLI_BENCH_PUT));
	assert_int_equal(cli_bench_parse_ops("all", &m), 0);
	assert_int_equal(m, 15);
	m = 12345;
	assert_int_equal(cli_bench_parse_ops("", &m), -EINVAL);
	assert_int_equal(cli_bench_parse_ops("gets", &m), -EINVAL);
	assert_int_equal(cli_bench_parse_ops("put,", &m), -EINVAL);
	assert_int_equal(cli_bench_parse_ops("PUT", &m), -EINVAL);
	assert_int_equal(cli_bench_parse_ops("ge", &m), -EINVAL);
	assert_int_equal(m, 12345);
}

/* Parse a bench command line (NULL-terminated, after "kvpool bench"). */
static int bench_args(struct cli_bench_opts *o, ...)
{
	char *argv[32] = { "kvpool bench" };
	int argc = 1;
	va_list ap;

	va_start(ap, o);
	for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *))
		argv[argc++] = a;
	va_end(ap);
	return cli_bench_parse_args(argc, argv, o);
}

static void test_bench_parse_args(void **state)
{
	struct cli_bench_opts o;

	(void)state;
	assert_int_equal(bench_args(&o, NULL), -1);
	assert_int_equal(o.n_sizes, 5);
	assert_int_equal(o.sizes[3], 4 << 20);
	assert_int_equal(o.ops, 15);
	assert_int_equal(o.batch, 1);
	assert_int_equal(o.connections, 1);
	assert_true(o.duration_s == 2.0);
	assert_int_equal(o.count, 0);
	assert_int_equal(o.chain, 1000);
	assert_int_equal(o.lease_ms, 0);
	assert_int_equal(o.source_bytes, 1ULL << 30);
	assert_string_equal(o.conn.ns, "kvpool-bench");
	assert_false(o.json);

	assert_int_equal(bench_args(&o, "--sizes", "1MiB", "--batch", "8", "--connections", "3",
				    "--count", "100", "--chain", "7", "--json", "--ops", "get",
				    "--lease-ms", "250",
				    "--source-bytes", "2MiB", "--namespace", "b1", NULL), -1);
	assert_int_equal(o.n_sizes, 1);
	assert_int_equal(o.batch, 8);
	assert_int_equal(o.connections, 3);
	assert_int_equal(o.count, 100);
	assert_int_equal(o.chain, 7);
	assert_int_equal(o.lease_ms, 250);
	assert_true(o.json);
	assert_int_equal(o.ops, 1u << CLI_BENCH_GET);
	assert_int_equal(o.source_bytes, 2 << 20);
	assert_string_equal(o.conn.ns, "b1");
	/* --depth is --batch by another name */
	assert_int_equal(bench_args(&o, "--depth", "16", "--duration", "0.5", NULL), -1);
	assert_int_equal(o.batch, 16);
	assert_true(o.duration_s == 0.5);
	assert_int_equal(bench_args(&o, "--depth", "4", "--batch", "4", NULL), -1);
	assert_int_equal(o.batch, 4);
}

/* Every bad command line: exit 2, a message naming the problem, and no
 * connection to the server. */
static void test_bench_bad_options(void **state)
{
	static const struct {
		const char *args[4];
		const char *needle;
	} bad[] = {
		{ { "--sizes", "0" }, "bad value '0' for --sizes" },
		{ { "--sizes", "2GiB" }, "bad value '2GiB' for --sizes" },
		{ { "--sizes", "64KiB,64KiB" }, "distinct sizes" },
		{ { "--sizes", "12parsecs" }, "--sizes" },
		{ { "--batch", "0" }, "bad value '0' for --batch" },
		{ { "--batch", "65537" }, "1..65536" },
		{ { "--depth", "x" }, "for --depth" },
		{ { "--batch", "4", "--depth", "8" }, "cannot differ" },
		{ { "--connections", "0" }, "for --connections" },
		{ { "--connections", "257" }, "1..256" },
		{ { "--duration", "0" }, "for --duration" },
		{ { "--duration", "-1" }, "for --duration" },
		{ { "--duration", "1", "--count", "5" }, "exclude each other" },
		{ { "--count", "0" }, "for --count" },
		{ { "--chain", "0" }, "for --chain" },
		{ { "--lease-ms", "3600001" }, "for --lease-ms" },
		{ { "--lease-ms", "-1" }, "for --lease-ms" },
		{ { "--ops", "scan" }, "for --ops" },
		{ { "--source-bytes", "1KiB" }, "for --source-bytes" },
		{ { "--source-bytes", "1MiB", "--sizes", "2MiB" }, "smaller than the largest block" },
		{ { "extra" }, "unexpected argument 'extra'" },
		{ { "--namespace", "a b" }, "bad --namespace" },
	};
	struct cli_env *e = *state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct run r;

		run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, bad[i].args[0],
			bad[i].args[1], bad[i].args[2], bad[i].args[3], NULL);
		if (r.status != 2 || !strstr(r.err, bad[i].needle))
			fail_msg("case %zu (%s %s): exit %d, stderr '%s', want '%s'", i,
				 bad[i].args[0], bad[i].args[1] ? bad[i].args[1] : "", r.status, r.err,
				 bad[i].needle);
		assert_string_equal(r.out, "");
		run_free(&r);
	}
	assert_int_equal(atomic_load(&e->fk.connections), 0);
}

/* Keys differ for different arguments; a payload checks only against its
 * own key, whole, at its own length. */
static void test_bench_keys_and_payloads(void **state)
{
	static const uint64_t lens[] = { 1, 31, 32, 33, 4096, 65536 + 7 };
	struct cli_bench_src src;
	uint8_t k[64][KVPOOL_KEY_BYTES], other[KVPOOL_KEY_BYTES];
	size_t nk = 0;

	(void)state;
	for (uint32_t conn = 0; conn < 2; conn++)
		for (uint32_t phase = 0; phase < 2; phase++)
			for (uint64_t seq = 0; seq < 8; seq++)
				cli_bench_key(1, conn, phase, seq, k[nk++]);
	for (uint64_t nonce = 2; nonce < 34; nonce++)
		cli_bench_key(nonce, 0, 0, 0, k[nk++]);
	for (size_t i = 0; i < nk; i++)
		for (size_t j = i + 1; j < nk; j++)
			assert_memory_not_equal(k[i], k[j], 8);  /* even the first 8 bytes */
	cli_bench_key(1, 0, 0, 3, other);
	assert_memory_equal(other, k[3], KVPOOL_KEY_BYTES);

	assert_int_equal(cli_bench_src_init(&src, 1 << 20), 0);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		uint64_t len = lens[i];
		uint8_t *buf = malloc(len);
		struct iovec iov[2];

		assert_non_null(buf);
		cli_bench_block_iov(&src, k[0], len, iov);
		assert_int_equal(iov[0].iov_len + iov[1].iov_len, len);
		memcpy(buf, iov[0].iov_base, iov[0].iov_len);
		if (iov[1].iov_len)
			memcpy(buf + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
		assert_true(cli_bench_block_check(&src, k[0], buf, len));
		assert_false(cli_bench_block_check(&src, k[1], buf, len));
		buf[len - 1] ^= 1;
		assert_false(cli_bench_block_check(&src, k[0], buf, len));
		buf[len - 1] ^= 1;
		buf[len / 2] ^= 0x80;
		assert_false(cli_bench_block_check(&src, k[0], buf, len));
		free(buf);
	}
	/* A block of another key with the key bytes patched in is still
	 * wrong: its window starts elsewhere. */
	{
		uint8_t *a = malloc(65536);
		struct iovec iov[2];

		assert_non_null(a);
		cli_bench_block_iov(&src, k[1], 65536, iov);
		memcpy(a, k[0], 32);
		memcpy(a + 32, iov[1].iov_base, iov[1].iov_len);
		assert_false(cli_bench_block_check(&src, k[0], a, 65536));
		free(a);
	}
	cli_bench_src_release(&src);
	cli_bench_src_release(&src);
}

/* A short run against the fake server: every op, JSON out, byte-exact. */
static void test_bench_run_fake(void **state)
{
	struct cli_env *e = *state;
	struct json_object *doc, *results, *v;
	struct run r;

	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "4KiB,64KiB",
		"--count", "24", "--batch", "3", "--connections", "2", "--chain", "9",
		"--source-bytes", "1MiB", "--json", NULL);
	if (r.status != 0)
		fail_msg("bench exit %d: %s / %s", r.status, r.out, r.err);
	doc = json_tokener_parse(r.out);
	assert_non_null(doc);
	assert_int_equal(jget(doc, "connections"), 2);
	assert_int_equal(jget(doc, "batch"), 3);
	assert_int_equal(jget(doc, "verified_blocks"), 48);
	assert_int_equal(jget(doc, "verified_bytes"), 24 * 4096 + 24 * 65536);
	assert_true(json_object_object_get_ex(doc, "results", &results));
	assert_int_equal(json_object_array_length(results), 6);
	v = json_object_array_get_idx(results, 0);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "op")), "put");
	assert_int_equal(jget(v, "block_bytes"), 4096);
	assert_int_equal(jget(v, "blocks"), 24);
	/* 24 blocks over 2 connections, 3 per call */
	assert_int_equal(jget(v, "calls"), 8);
	v = json_object_array_get_idx(results, 3);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "op")), "get");
	assert_int_equal(jget(v, "blocks"), 24);
	assert_int_equal(jget(v, "wrong"), 0);
	assert_int_equal(jget(v, "misses"), 0);
	v = json_object_array_get_idx(results, 4);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "op")), "exists");
	assert_int_equal(jget(v, "blocks"), 24);
	v = json_object_array_get_idx(results, 5);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "op")), "match");
	assert_int_equal(jget(v, "chain_blocks"), 9);
	assert_int_equal(jget(v, "calls"), 24);
	assert_int_equal(jget(v, "blocks"), 24 * 9);
	assert_int_equal(jget(v, "misses"), 0);
	assert_int_equal(jget(v, "server_p99_us"), 2);
	json_object_put(doc);
	run_free(&r);
	/* emptied before and after */
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_DROP_NAMESPACE]), 2);
	assert_int_equal(e->fk.n_blocks, 0);
	assert_string_equal(e->fk.hello_ns, "kvpool-bench");

	/* The table names every op. */
	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "4KiB",
		"--count", "4", "--chain", "3", "--source-bytes", "1MiB", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "\nput     4.00 KiB "));
	assert_non_null(strstr(r.out, "\nget     4.00 KiB "));
	assert_non_null(strstr(r.out, "\nexists  -  "));
	assert_non_null(strstr(r.out, "\nmatch   3-block chain: "));
	assert_non_null(strstr(r.out, "server time (STATS latency_us.match): p50 1 us"));
	assert_non_null(strstr(r.out, "verified: 4 GET blocks (16.0 KiB) byte by byte\n"));
	run_free(&r);
}

/* --async: the same counts through kvpool_submit_* with several requests
 * in flight per connection; a corrupting server still fails the run. */
static void test_bench_async(void **state)
{
	struct cli_env *e = *state;
	struct json_object *doc, *results, *v;
	struct run r;

	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "4KiB",
		"--count", "30", "--batch", "2", "--connections", "2", "--chain", "5", "--async",
		"--inflight", "3", "--source-bytes", "1MiB", "--json", NULL);
	if (r.status != 0)
		fail_msg("bench --async exit %d: %s / %s", r.status, r.out, r.err);
	doc = json_tokener_parse(r.out);
	assert_non_null(doc);
	assert_true(json_object_get_boolean(json_object_object_get(doc, "async")));
	assert_int_equal(jget(doc, "inflight"), 3);
	assert_int_equal(jget(doc, "verified_blocks"), 30);
	assert_true(json_object_object_get_ex(doc, "results", &results));
	assert_int_equal(json_object_array_length(results), 4);
	v = json_object_array_get_idx(results, 0);
	assert_int_equal(jget(v, "blocks"), 30);
	assert_int_equal(jget(v, "calls"), 16); /* 15 blocks per connection, 2 per call */
	v = json_object_array_get_idx(results, 1);
	assert_int_equal(jget(v, "blocks"), 30);
	assert_int_equal(jget(v, "wrong"), 0);
	v = json_object_array_get_idx(results, 3);
	assert_int_equal(jget(v, "blocks"), 30 * 5);
	assert_int_equal(jget(v, "misses"), 0);
	json_object_put(doc);
	run_free(&r);

	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--inflight", "2", NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--inflight needs --async"));
	run_free(&r);
	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--async", "--inflight",
		"0", NULL);
	assert_int_equal(r.status, 2);
	run_free(&r);

	atomic_store(&e->fk.mode, MODE_CORRUPT_GET);
	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "8KiB",
		"--ops", "put,get", "--count", "6", "--async", "--source-bytes", "1MiB", NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "FAILED: 6 blocks came back wrong"));
	run_free(&r);
}

/* GET alone puts its blocks first (untimed); a server that corrupts what
 * it returns fails the run. */
static void test_bench_get_only_and_corruption(void **state)
{
	struct cli_env *e = *state;
	struct json_object *doc;
	struct run r;

	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "8KiB",
		"--ops", "get", "--count", "10", "--source-bytes", "1MiB", "--json", NULL);
	if (r.status != 0)
		fail_msg("bench exit %d: %s / %s", r.status, r.out, r.err);
	doc = json_tokener_parse(r.out);
	assert_non_null(doc);
	assert_int_equal(jget(doc, "verified_blocks"), 10);
	json_object_put(doc);
	run_free(&r);
	assert_true(atomic_load(&e->fk.frames[PROTO_OP_PUT]) > 0);

	atomic_store(&e->fk.mode, MODE_CORRUPT_GET);
	run_cmd(&r, cli_bench_main, "kvpool bench", "--server", e->url, "--sizes", "8KiB",
		"--ops", "put,get", "--count", "5", "--source-bytes", "1MiB", NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "FAILED: 5 blocks came back wrong"));
	assert_non_null(strstr(r.out, "verified: 0 GET blocks"));
	run_free(&r);
}

/* The help says how pipelining is counted. */
static void test_bench_help(void **state)
{
	struct run r;

	(void)state;
	run_cmd(&r, cli_bench_main, "kvpool bench", "--help", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "--batch is the number of blocks in\nflight per connection"));
	assert_non_null(strstr(r.out, "--depth is another name for --batch"));
	run_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_good_line),
		cmocka_unit_test(test_parse_timestamp_forms),
		cmocka_unit_test(test_parse_bad_lines),
		cmocka_unit_test(test_parse_respects_len),
		cmocka_unit_test(test_parse_digits_in_strings),
		cmocka_unit_test(test_read_sorts_stably),
		cmocka_unit_test(test_read_names_bad_line),
		cmocka_unit_test(test_chain_matches_sha256),
		cmocka_unit_test(test_ideal_small_trace),
		cmocka_unit_test(test_ideal_synthetic_trace),
		cmocka_unit_test(test_payload_roundtrip_and_damage),
		cmocka_unit_test(test_payload_torn_block),
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_parse_numbers_and_exit_codes),
		cmocka_unit_test(test_key_parse),
		cmocka_unit_test(test_stats_counters),
		cmocka_unit_test(test_stats_report_tiers),
		cmocka_unit_test(test_latency_quantiles),
		cmocka_unit_test(test_lat_timed),
		cmocka_unit_test(test_replay_json_report),
		cmocka_unit_test(test_ns_valid),
		cmocka_unit_test(test_connect_error_messages),
		cmocka_unit_test(test_replay_text_caveats),
		cmocka_unit_test_setup_teardown(test_put_already_stored, cli_setup, cli_teardown),
		cmocka_unit_test(test_put_too_large),
		cmocka_unit_test_setup_teardown(test_option_messages, cli_setup, cli_teardown),
		cmocka_unit_test(test_put_retain_ms),
		cmocka_unit_test(test_match_v2_options),
		cmocka_unit_test_setup_teardown(test_match_v2_options_v1_server, cli_setup,
						cli_teardown),
		cmocka_unit_test_setup_teardown(test_replay_drops_namespace, cli_setup,
						cli_teardown),
		cmocka_unit_test_setup_teardown(test_replay_retries_busy, cli_setup, cli_teardown),
		cmocka_unit_test_setup_teardown(test_replay_busy_for_good, cli_setup, cli_teardown),
		cmocka_unit_test(test_bench_parse_sizes),
		cmocka_unit_test(test_bench_parse_ops),
		cmocka_unit_test(test_bench_parse_args),
		cmocka_unit_test_setup_teardown(test_bench_bad_options, cli_setup, cli_teardown),
		cmocka_unit_test(test_bench_keys_and_payloads),
		cmocka_unit_test_setup_teardown(test_bench_run_fake, cli_setup, cli_teardown),
		cmocka_unit_test_setup_teardown(test_bench_async, cli_setup, cli_teardown),
		cmocka_unit_test_setup_teardown(test_bench_get_only_and_corruption, cli_setup,
						cli_teardown),
		cmocka_unit_test(test_bench_help),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
