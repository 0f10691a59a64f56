/*
 * test_server.c - unit tests of kvpoold's pure parts: the log sanitizer,
 * the protocol-error log rate limit, what a log line may quote of a
 * request, the per-opcode body bound, the dram_capacity check against
 * physical memory, namespace name validation, the latency histogram, the
 * counter sum, the STATS JSON document, and the TCP output queue (order,
 * pins released exactly once, buffers kept between requests).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <xxhash.h>

#include "proto.h"
#include "srv_conn.h"
#include "srv_hist.h"
#include "srv_log.h"
#include "srv_out.h"
#include "srv_request.h"
#include "srv_server.h"
#include "srv_stats.h"

/* ---- log sanitizer ------------------------------------------------------ */

static void test_sanitize_printable_passes(void **state)
{
	char out[64];

	(void)state;
	assert_int_equal(srv_log_sanitize("hello world", 11, out, sizeof(out)), 11);
	assert_string_equal(out, "hello world");
}

static void test_sanitize_escapes(void **state)
{
	const uint8_t in[] = { 'K', 0x00, '\\', 0x7f, 0xff, '\n' };
	char out[64];
	size_t n;

	(void)state;
	n = srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_string_equal(out, "K\\x00\\\\\\x7f\\xff\\x0a");
	assert_int_equal(n, strlen(out));
}

static void test_sanitize_truncates_with_ellipsis(void **state)
{
	char in[100], out[16];
	size_t n;

	(void)state;
	memset(in, 'a', sizeof(in));
	n = srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_int_equal(n, 15);
	assert_string_equal(out, "aaaaaaaaaaaa...");
}

static void test_sanitize_never_splits_an_escape(void **state)
{
	const uint8_t in[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	char out[12];

	(void)state;
	/* 8 bytes need 32 characters; room for 11: two escapes + "...". */
	srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_string_equal(out, "\\x01\\x02...");
}

static void test_sanitize_exact_fit_has_no_ellipsis(void **state)
{
	char out[5];

	(void)state;
	assert_int_equal(srv_log_sanitize("abcd", 4, out, sizeof(out)), 4);
	assert_string_equal(out, "abcd");
	assert_int_equal(srv_log_sanitize("abcde", 5, out, sizeof(out)), 0 + 1 + 3);
	assert_string_equal(out, "a...");
}

static void test_sanitize_tiny_buffers(void **state)
{
	char out[2] = { 'x', 'x' };

	(void)state;
	assert_int_equal(srv_log_sanitize("abc", 3, out, 0), 0);
	assert_int_equal(out[0], 'x'); /* nothing written with no room */
	assert_int_equal(srv_log_sanitize("abc", 3, out, 1), 0);
	assert_string_equal(out, "");
	assert_int_equal(srv_log_sanitize("", 0, out, sizeof(out)), 0);
	assert_string_equal(out, "");
}

/* ---- namespace names ------------------------------------------------------ */

static void test_ns_name_valid(void **state)
{
	char longest[PROTO_NAME_MAX_BYTES + 1];

	(void)state;
	memset(longest, 'n', sizeof(longest));
	assert_true(srv_ns_name_valid("llama3-8b/bf16/tp2:r0", 21));
	assert_true(srv_ns_name_valid("!", 1));
	assert_true(srv_ns_name_valid("~", 1));
	assert_true(srv_ns_name_valid(longest, PROTO_NAME_MAX_BYTES));
	assert_false(srv_ns_name_valid(longest, PROTO_NAME_MAX_BYTES + 1));
	assert_false(srv_ns_name_valid("", 0));
	assert_false(srv_ns_name_valid("a b", 3));
	assert_false(srv_ns_name_valid("a\x7f", 2));
	assert_false(srv_ns_name_valid("a\tb", 3));
	assert_false(srv_ns_name_valid("caf\xc3\xa9", 5));
	assert_false(srv_ns_name_valid("a\0b", 3));
}

/* ---- latency histogram ---------------------------------------------------- */

static void test_hist_buckets_cover_values(void **state)
{
	unsigned prev = 0;

	(void)state;
	for (uint64_t v = 0; v < 200000; v += 1 + v / 50) {
		unsigned b = srv_hist_bucket(v);
		uint64_t hi = srv_hist_bucket_max(b);

		assert_true(b >= prev); /* monotonic */
		assert_true(b < SRV_HIST_BUCKETS);
		assert_true(hi >= v);
		/* The bucket is at most 1/16 of its values wide. */
		assert_true(hi - v <= v / 16 + 1);
		if (b > 0)
			assert_true(srv_hist_bucket_max(b - 1) < v);
		prev = b;
	}
	for (uint64_t v = 0; v < 16; v++)
		assert_int_equal(srv_hist_bucket(v), v);
	assert_int_equal(srv_hist_bucket(UINT64_MAX), SRV_HIST_BUCKETS - 1);
	assert_int_equal(srv_hist_bucket(1ull << 40), SRV_HIST_BUCKETS - 1);
	assert_true(srv_hist_bucket((1ull << 40) - 1) < SRV_HIST_BUCKETS - 1);
}

static void test_hist_percentiles_uniform(void **state)
{
	struct srv_hist *h = calloc(1, sizeof(*h));
	uint64_t p50, p99, p999;

	(void)state;
	assert_non_null(h);
	for (uint64_t v = 1; v <= 10000; v++)
		srv_hist_record(h, v);
	p50 = srv_hist_percentile(h, 0.5);
	p99 = srv_hist_percentile(h, 0.99);
	p999 = srv_hist_percentile(h, 0.999);
	/* Never below the true value, at most 6.25% above it. */
	assert_true(p50 >= 5000 && p50 <= 5000 + 5000 / 16);
	assert_true(p99 >= 9900 && p99 <= 10000);
	assert_true(p999 >= 9990 && p999 <= 10000);
	assert_int_equal(srv_hist_percentile(h, 1.0), 10000); /* capped at the max */
	assert_int_equal(h->count, 10000);
	free(h);
}

static void test_hist_empty_and_single(void **state)
{
	struct srv_hist *h = calloc(1, sizeof(*h));

	(void)state;
	assert_non_null(h);
	assert_int_equal(srv_hist_percentile(h, 0.5), 0);
	srv_hist_record(h, 777);
	assert_int_equal(srv_hist_percentile(h, 0.5), 777);
	assert_int_equal(srv_hist_percentile(h, 0.999), 777);
	free(h);
}

static void test_hist_tail(void **state)
{
	struct srv_hist *h = calloc(1, sizeof(*h));

	(void)state;
	assert_non_null(h);
	for (int i = 0; i < 990; i++)
		srv_hist_record(h, 10);
	for (int i = 0; i < 10; i++)
		srv_hist_record(h, 100000);
	assert_int_equal(srv_hist_percentile(h, 0.5), 10);
	assert_int_equal(srv_hist_percentile(h, 0.99), 10);
	assert_true(srv_hist_percentile(h, 0.999) >= 100000);
	free(h);
}

static void test_stats_sum_adds_workers(void **state)
{
	struct srv_stats *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	struct srv_stats *sum = calloc(1, sizeof(*sum));

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(sum);
	srv_stats_add(a, SRV_C_get_hits, 5);
	srv_stats_add(b, SRV_C_get_hits, 7);
	srv_stats_add(b, SRV_C_put_requests, 1);
	srv_stats_count_status(a, PROTO_STATUS_BUSY);
	srv_stats_count_status(a, PROTO_STATUS_NOT_FOUND); /* not an "errors" counter */
	srv_stats_count_status(b, PROTO_STATUS_FULL);
	srv_stats_count_status(b, PROTO_STATUS_BAD_REQUEST);
	srv_stats_count_status(b, PROTO_STATUS_TOO_LARGE);
	srv_hist_record(&a->lat[SRV_LAT_GET], 100);
	srv_hist_record(&b->lat[SRV_LAT_GET], 300);
	srv_stats_sum(sum, a);
	srv_stats_sum(sum, b);
	assert_int_equal(sum->c[SRV_C_get_hits], 12);
	assert_int_equal(sum->c[SRV_C_put_requests], 1);
	assert_int_equal(sum->c[SRV_C_errors_busy], 1);
	assert_int_equal(sum->c[SRV_C_errors_full], 1);
	assert_int_equal(sum->c[SRV_C_errors_bad_request], 1);
	assert_int_equal(sum->c[SRV_C_errors_too_large], 1);
	assert_int_equal(sum->lat[SRV_LAT_GET].count, 2);
	assert_int_equal(sum->lat[SRV_LAT_GET].max_us, 300);
	assert_int_equal(srv_hist_percentile(&sum->lat[SRV_LAT_GET], 0.5),
			 srv_hist_bucket_max(srv_hist_bucket(100)));
	assert_in_range(srv_hist_percentile(&sum->lat[SRV_LAT_GET], 0.5), 100, 106);
	assert_int_equal(srv_hist_percentile(&sum->lat[SRV_LAT_GET], 1.0), 300);
	free(a);
	free(b);
	free(sum);
}

/* ---- STATS JSON ----------------------------------------------------------- */

/* Render doc and return it as a malloc'd NUL-terminated string. */
static char *render(const struct srv_stats_doc *doc)
{
	struct evbuffer *b = evbuffer_new();
	size_t len;
	char *s;

	assert_non_null(b);
	assert_int_equal(srv_stats_json(doc, b), 0);
	len = evbuffer_get_length(b);
	s = malloc(len + 1);
	assert_non_null(s);
	assert_int_equal(evbuffer_remove(b, s, len), (int)len);
	s[len] = '\0';
	evbuffer_free(b);
	return s;
}

static const char expected_doc[] =
	"{\"version\":\"0.1.0\",\"protocol\":1,\"pid\":42,\"uptime_s\":7,"
	"\"connections\":{\"current\":3,\"total\":10,\"rejected\":1},"
	"\"tiers\":{\"dram\":{\"capacity_bytes\":1048576,\"used_bytes\":8192,"
	"\"payload_bytes\":5000,\"free_bytes\":1040384,\"largest_free_bytes\":520192,"
	"\"fragmentation\":0.500000,\"blocks\":2,\"inflight_put_bytes\":4096,"
	"\"evict_passes\":6,\"evict_pass_max_us\":1234},"
	"\"nvme\":{\"enabled\":false}},"
	"\"index_bytes\":999,\"evictions\":4,\"leases_active\":1,\"checksum_errors\":2,"
	"\"ops\":{\"put\":{\"requests\":5,\"blocks\":6,\"ok\":3,\"exists\":2,\"errors\":1,"
	"\"bytes\":393216},"
	"\"get\":{\"requests\":8,\"hits\":9,\"misses\":10,\"bytes\":589824},"
	"\"exists\":{\"requests\":11,\"hits\":12,\"misses\":13},"
	"\"match\":{\"requests\":14,\"blocks_queried\":20,\"blocks_matched\":5,"
	"\"hit_ratio\":0.250000},"
	"\"delete\":{\"requests\":15,\"blocks\":16},"
	"\"ping\":{\"requests\":17},\"stats\":{\"requests\":18},"
	"\"errors\":{\"bad_request\":19,\"too_large\":20,\"busy\":21,\"full\":22}},"
	"\"latency_us\":{\"put\":{\"p50\":12,\"p99\":12,\"p999\":12},"
	"\"get\":{\"p50\":0,\"p99\":0,\"p999\":0},"
	"\"exists\":{\"p50\":0,\"p99\":0,\"p999\":0},"
	"\"match\":{\"p50\":0,\"p99\":0,\"p999\":0}},"
	"\"blocks\":2,"
	"\"namespaces\":{\"a\\\"b\\\\c\":{\"blocks\":2,\"nvme_blocks\":0,\"bytes\":5000,\"puts\":3,"
	"\"put_exists\":2,\"put_errors\":1,\"get_hits\":9,\"get_misses\":10,"
	"\"exists_hits\":12,\"exists_misses\":13,\"match_requests\":14,"
	"\"match_blocks_queried\":0,\"match_blocks_matched\":0,\"match_hit_ratio\":0.000000,"
	"\"evictions\":4,\"deletes\":16},"
	"\"m2\":{\"blocks\":0,\"nvme_blocks\":0,\"bytes\":0,\"puts\":0,\"put_exists\":0,\"put_errors\":0,"
	"\"get_hits\":0,\"get_misses\":0,\"exists_hits\":0,\"exists_misses\":0,"
	"\"match_requests\":1,\"match_blocks_queried\":4,\"match_blocks_matched\":3,"
	"\"match_hit_ratio\":0.750000,\"evictions\":0,\"deletes\":0}}}";

static void fill_doc(struct srv_stats_doc *doc, struct srv_stats *ops, struct store_stats *st,
		     struct store_ns_stats ns[2])
{
	static const enum srv_counter order[] = {
		SRV_C_put_requests, SRV_C_put_blocks, SRV_C_put_ok, SRV_C_put_exists,
		SRV_C_put_errors, SRV_C_get_requests, SRV_C_get_hits, SRV_C_get_misses,
		SRV_C_exists_requests, SRV_C_exists_hits, SRV_C_exists_misses,
		SRV_C_match_requests, SRV_C_delete_requests, SRV_C_delete_blocks,
		SRV_C_ping_requests, SRV_C_stats_requests, SRV_C_errors_bad_request,
		SRV_C_errors_too_large, SRV_C_errors_busy, SRV_C_errors_full,
	};
	static const uint64_t values[] = { 5, 6, 3, 2, 1, 8, 9, 10, 11, 12, 13, 14, 15, 16,
					   17, 18, 19, 20, 21, 22 };

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		ops->c[order[i]] = values[i];
	ops->c[SRV_C_match_blocks_queried] = 20;
	ops->c[SRV_C_match_blocks_matched] = 5;
	ops->c[SRV_C_put_bytes] = 6 * 65536;
	ops->c[SRV_C_get_bytes] = 9 * 65536;
	srv_hist_record(&ops->lat[SRV_LAT_PUT], 12);
	*st = (struct store_stats){ .capacity_bytes = 1048576, .used_bytes = 8192,
				    .payload_bytes = 5000, .inflight_put_bytes = 4096,
				    .free_bytes = 1040384, .largest_free_bytes = 520192,
				    .fragmentation = 0.5, .index_bytes = 999, .blocks = 2,
				    .dram_blocks = 2,
				    .evictions = 4, .evict_passes = 6, .evict_pass_max_us = 1234,
				    .leases_active = 1, .checksum_errors = 2,
				    .namespaces = 2 };
	memset(ns, 0, 2 * sizeof(ns[0]));
	strcpy(ns[0].name, "a\"b\\c");
	ns[0].blocks = 2, ns[0].bytes = 5000, ns[0].puts = 3, ns[0].put_exists = 2;
	ns[0].put_errors = 1, ns[0].get_hits = 9, ns[0].get_misses = 10;
	ns[0].exists_hits = 12, ns[0].exists_misses = 13, ns[0].match_requests = 14;
	ns[0].evictions = 4, ns[0].deletes = 16;
	strcpy(ns[1].name, "m2");
	ns[1].match_requests = 1, ns[1].match_blocks_queried = 4, ns[1].match_blocks_matched = 3;
	*doc = (struct srv_stats_doc){ .version = "0.1.0", .protocol = 1, .pid = 42,
				       .uptime_s = 7, .conn_current = 3, .conn_total = 10,
				       .conn_rejected = 1, .ops = ops, .store = st, .ns = ns,
				       .ns_count = 2 };
}

static void test_stats_json_exact(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_ns_stats ns[2];
	struct store_stats st;
	struct srv_stats_doc doc;
	char *s;

	(void)state;
	assert_non_null(ops);
	fill_doc(&doc, ops, &st, ns);
	s = render(&doc);
	assert_string_equal(s, expected_doc);
	free(s);
	free(ops);
}

/* With the NVMe tier: top-level blocks counts both tiers, tiers.dram.blocks
 * the DRAM copies, tiers.nvme every figure, and each namespace its NVMe
 * blocks. */
static void test_stats_json_nvme(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_ns_stats ns[2];
	struct store_stats st;
	struct srv_stats_doc doc;
	char *s;

	(void)state;
	assert_non_null(ops);
	fill_doc(&doc, ops, &st, ns);
	st.blocks = 9, st.dram_blocks = 2, st.nvme_enabled = 1, st.nvme_direct_io = 0;
	st.nvme_healthy = 1, st.nvme_capacity_bytes = 1 << 30, st.nvme_segment_bytes = 1 << 27;
	st.nvme_used_bytes = 1 << 28, st.nvme_payload_bytes = 70000, st.nvme_blocks = 8;
	st.demotions = 101, st.demoted_bytes = 102, st.promotions = 103, st.promoted_bytes = 104;
	st.nvme_bytes_written = 105, st.nvme_bytes_read = 106, st.rewritten_bytes = 107;
	st.segments_reclaimed = 108, st.admission_rejections = 109, st.nvme_evictions = 110;
	st.corrupt_blocks = 111, st.nvme_read_errors = 112, st.nvme_write_errors = 113;
	st.rebuild_ms = 114, st.rebuild_blocks = 115, st.orphans_dropped = 116;
	st.index_records_lost = 117, st.index_quarantined = 1;
	ns[0].blocks = 9, ns[0].nvme_blocks = 8;
	s = render(&doc);
	assert_non_null(strstr(s, "\"blocks\":2,\"inflight_put_bytes\":4096,\"evict_passes\":6,"
			      "\"evict_pass_max_us\":1234},\"nvme\":{"
			      "\"enabled\":true,\"direct_io\":false,\"healthy\":true,"
			      "\"capacity_bytes\":1073741824,\"segment_bytes\":134217728,"
			      "\"used_bytes\":268435456,\"payload_bytes\":70000,\"blocks\":8,"
			      "\"demotions\":101,\"demoted_bytes\":102,\"promotions\":103,"
			      "\"promoted_bytes\":104,\"bytes_written\":105,\"bytes_read\":106,"
			      "\"rewritten_bytes\":107,\"segments_reclaimed\":108,"
			      "\"admission_rejections\":109,\"evictions\":110,\"corrupt_blocks\":111,"
			      "\"read_errors\":112,\"write_errors\":113,\"rebuild_ms\":114,"
			      "\"rebuild_blocks\":115,\"orphans_dropped\":116,"
			      "\"index_records_lost\":117,\"index_quarantined\":1}},\"index_bytes\":"));
	assert_non_null(strstr(s, "\"p999\":0}},\"blocks\":9,\"namespaces\":{"));
	assert_non_null(strstr(s, "{\"blocks\":9,\"nvme_blocks\":8,\"bytes\":5000,"));
	st.nvme_direct_io = 1, st.nvme_healthy = 0;
	free(s);
	s = render(&doc);
	assert_non_null(strstr(s, "\"direct_io\":true,\"healthy\":false,"));
	free(s);
	free(ops);
}

static void test_stats_json_no_namespaces(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_ns_stats ns[2];
	struct store_stats st;
	struct srv_stats_doc doc;
	char *s;

	(void)state;
	assert_non_null(ops);
	fill_doc(&doc, ops, &st, ns);
	doc.ns_count = 0;
	s = render(&doc);
	assert_non_null(strstr(s, ",\"namespaces\":{}}"));
	assert_int_equal(s[strlen(s) - 1], '}');
	free(s);
	free(ops);
}

static void test_stats_json_escapes_odd_bytes(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_ns_stats ns[2];
	struct store_stats st;
	struct srv_stats_doc doc;
	char *s;

	(void)state;
	assert_non_null(ops);
	fill_doc(&doc, ops, &st, ns);
	strcpy(ns[0].name, "x\x01\xc3");
	doc.ns_count = 1;
	s = render(&doc);
	assert_non_null(strstr(s, "\"namespaces\":{\"x\\u0001\\u00c3\":{"));
	free(s);
	free(ops);
}

/* ---- protocol-error log rate limit ------------------------------------------ */

/* Lines allowed by srv_ratelimit_allow in `n` calls at now_ms; the
 * suppressed counts reported along the way are added to *reported. */
static uint32_t allow_n(struct srv_ratelimit *rl, uint64_t now_ms, uint32_t n, uint64_t *reported)
{
	uint32_t allowed = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t sup = 0;

		if (srv_ratelimit_allow(rl, now_ms, &sup))
			allowed++;
		*reported += sup;
	}
	return allowed;
}

static void test_ratelimit_caps_a_burst(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 20 };
	uint64_t reported = 0;

	(void)state;
	/* 50000 bad requests within one second: 20 lines, the rest counted. */
	assert_int_equal(allow_n(&rl, 5000, 25000, &reported), 20);
	assert_int_equal(allow_n(&rl, 5999, 25000, &reported), 0);
	assert_int_equal(reported, 0);
	/* The next second: its first line comes with the count, once. */
	assert_int_equal(allow_n(&rl, 6000, 1, &reported), 1);
	assert_int_equal(reported, 49980);
	assert_int_equal(allow_n(&rl, 6001, 30, &reported), 19);
	assert_int_equal(reported, 49980);
}

static void test_ratelimit_quiet_traffic_passes(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 20 };
	uint64_t reported = 0;

	(void)state;
	/* Ten lines a second for a minute: never limited, nothing reported. */
	for (uint64_t t = 0; t < 60000; t += 100)
		assert_int_equal(allow_n(&rl, 1000 + t, 1, &reported), 1);
	assert_int_equal(reported, 0);
	assert_int_equal(srv_ratelimit_flush(&rl, 100000), 0);
}

static void test_ratelimit_flush_reports_once(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 3 };
	uint64_t reported = 0;

	(void)state;
	assert_int_equal(allow_n(&rl, 10000, 10, &reported), 3);
	/* Within the window: nothing to report yet. */
	assert_int_equal(srv_ratelimit_flush(&rl, 10999), 0);
	/* The window is over: the timer reports the 7, and only once. */
	assert_int_equal(srv_ratelimit_flush(&rl, 11000), 7);
	assert_int_equal(srv_ratelimit_flush(&rl, 12500), 0);
	assert_int_equal(allow_n(&rl, 12600, 1, &reported), 1);
	assert_int_equal(reported, 0);
	/* A clock that goes backwards starts a new window too. */
	assert_int_equal(allow_n(&rl, 12600, 5, &reported), 2);
	assert_int_equal(allow_n(&rl, 500, 1, &reported), 1);
	assert_int_equal(reported, 3);
}

/* ---- what a protocol-error log line quotes ------------------------------------ */

static void test_quote_never_shows_hello_body(void **state)
{
	static const char token[] = "s3cret-token-value";
	struct proto_hello hello = {
		.min_version = 1, .max_version = 1, .ns = "tenant", .ns_len = 6,
		.token = token, .token_len = sizeof(token) - 1,
	};
	struct proto_header h = { .opcode = PROTO_OP_HELLO, .request_id = 3 };
	uint8_t body[64];
	char out[512];
	size_t n;

	(void)state;
	h.body_bytes = (uint32_t)proto_hello_body_bytes(&hello);
	assert_int_equal(proto_hello_encode(&hello, body, sizeof(body)), 0);
	/* Make it malformed (min > max), as a refused HELLO would be. */
	proto_put_u16(body, 9);
	n = srv_conn_quote_body(&h, body, h.body_bytes, out, sizeof(out));
	assert_int_equal(n, strlen(out));
	assert_null(strstr(out, "s3cret"));
	assert_null(strstr(out, "tenant"));
	assert_string_equal(out, "header only: opcode 1, body_bytes 32, payload_bytes 0");
}

static void test_quote_other_bodies_sanitized(void **state)
{
	struct proto_header h = { .opcode = PROTO_OP_EXISTS };
	uint8_t body[200];
	char out[512];

	(void)state;
	memset(body, 'k', sizeof(body));
	body[0] = 0x01;
	h.body_bytes = sizeof(body);
	srv_conn_quote_body(&h, body, sizeof(body), out, sizeof(out));
	/* "body: ", \x01, then 63 of the 'k's: SRV_QUOTE_BODY_BYTES in all. */
	assert_int_equal(strncmp(out, "body: \\x01kkk", 13), 0);
	assert_int_equal(strlen(out), 6 + 4 + SRV_QUOTE_BODY_BYTES - 1);
	/* No body, nothing to quote; a tiny buffer stays terminated. */
	assert_int_equal(srv_conn_quote_body(&h, NULL, 0, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	assert_int_equal(srv_conn_quote_body(&h, body, sizeof(body), out, 4), 0);
	assert_string_equal(out, "");
}

/* ---- body bound per opcode ------------------------------------------------------ */

static void test_body_max_per_opcode(void **state)
{
	struct proto_limits l = { .max_frame_bytes = 4 << 20, .max_batch_blocks = 1024,
				  .max_block_bytes = 1 << 20 };

	(void)state;
	assert_int_equal(srv_conn_body_max(PROTO_OP_EXISTS, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_MATCH, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_DELETE, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_GET, &l), 8 + 40 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), 8 + 88 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_HELLO, &l), 8 + 255 + 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_DROP_NAMESPACE, &l), 4 + 255);
	assert_int_equal(srv_conn_body_max(PROTO_OP_STATS, &l), 4 + 255);
	assert_int_equal(srv_conn_body_max(PROTO_OP_PING, &l), 0);
	assert_int_equal(srv_conn_body_max(PROTO_OP_NONE, &l), 0);
	assert_int_equal(srv_conn_body_max(200, &l), 0);
	l.max_batch_blocks = 65536;
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), 8 + 88 * 65536);
	l.max_batch_blocks = UINT32_MAX; /* saturates instead of wrapping */
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), UINT32_MAX);
}

/* ---- dram_capacity against physical memory ---------------------------------------- */

static void test_check_dram(void **state)
{
	char err[256] = "";

	(void)state;
	assert_int_equal(srv_check_dram(1ull << 30, 16ull << 30, 0, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram(16ull << 30, 16ull << 30, 0, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram(1ull << 42, 0, 0, err, sizeof(err)), 0); /* unknown */
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram(1ull << 42, 16ull << 30, 0, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity"));
	assert_non_null(strstr(err, "4398046511104"));
	assert_non_null(strstr(err, "17179869184"));
	assert_non_null(strstr(err, "physical memory"));
	/* This host's figure is known and sane. */
	assert_true(srv_phys_bytes() >= (64ull << 20));
}

/* The effective limit is the smaller of physical memory and the cgroup's
 * memory.max, and the message says which one it was. */
static void test_check_dram_cgroup(void **state)
{
	char err[256] = "";

	(void)state;
	/* at the cgroup limit passes, one byte above fails */
	assert_int_equal(srv_check_dram(314572800, 16ull << 30, 314572800, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram(314572801, 16ull << 30, 314572800, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity"));
	assert_non_null(strstr(err, "314572801"));
	assert_non_null(strstr(err, "cgroup memory.max 314572800"));
	assert_null(strstr(err, "physical memory"));
	/* a cgroup limit above physical memory: physical memory decides */
	memset(err, 0, sizeof(err));
	assert_int_equal(srv_check_dram(1ull << 36, 16ull << 30, 1ull << 40, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "physical memory (17179869184 bytes)"));
	assert_null(strstr(err, "cgroup"));
	/* physical memory unknown: the cgroup limit alone */
	assert_int_equal(srv_check_dram(1ull << 30, 0, 1ull << 29, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "cgroup memory.max 536870912"));
	assert_int_equal(srv_check_dram(1ull << 29, 0, 1ull << 29, err, sizeof(err)), 0);
}

static void test_parse_memory_max(void **state)
{
	uint64_t v = 7;

	(void)state;
	assert_int_equal(srv_parse_memory_max("max\n", &v), 0);
	assert_int_equal(v, 0);
	v = 7;
	assert_int_equal(srv_parse_memory_max("max", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(srv_parse_memory_max("314572800\n", &v), 0);
	assert_int_equal(v, 314572800);
	assert_int_equal(srv_parse_memory_max("18446744073709551615", &v), 0);
	assert_int_equal(v, UINT64_MAX);
	v = 7;
	assert_int_equal(srv_parse_memory_max("", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("-1\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("12x\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("1 2", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("99999999999999999999999", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("maximum", &v), -EINVAL);
	assert_int_equal(v, 7);
}


/* ---- TCP output queue ------------------------------------------------------ */

#define OUT_BLOCK_BYTES (256u * 1024)

/* A store holding blocks "a" and "b" (OUT_BLOCK_BYTES each, bytes i + seed). */
static struct store *out_store(uint32_t *ns_id)
{
	struct store_config cfg = {
		.dram_capacity_bytes = 8u << 20,
		.max_block_bytes = 1u << 20,
		.max_inflight_put_bytes = 4u << 20,
	};
	static uint8_t data[OUT_BLOCK_BYTES];
	struct store *st = NULL;

	assert_int_equal(store_open(&cfg, &st, NULL, 0), 0);
	assert_int_equal(store_namespace_id(st, "out", 3, ns_id), 0);
	for (int k = 0; k < 2; k++) {
		uint8_t key[STORE_KEY_BYTES] = { (uint8_t)('a' + k) };
		struct store_block *b;
		void *dst;

		for (size_t i = 0; i < sizeof(data); i++)
			data[i] = (uint8_t)(i * 7 + (size_t)k);
		assert_int_equal(store_put_begin(st, *ns_id, key, NULL, 0, sizeof(data),
						 XXH3_64bits(data, sizeof(data)), &b, &dst), 0);
		memcpy(dst, data, sizeof(data));
		assert_int_equal(store_put_commit(st, b), 0);
	}
	return st;
}

/* Pin block 'a' + k, then delete it: its bytes are freed at the last
 * release, which pinned_removed_bytes shows. */
static struct store_ref out_pin_deleted(struct store *st, uint32_t ns_id, int k)
{
	uint8_t key[STORE_KEY_BYTES] = { (uint8_t)('a' + k) };
	struct store_ref r;
	uint64_t removed = 0;

	assert_int_equal(store_get(st, ns_id, key, NULL, &r), 0);
	assert_int_equal(store_delete(st, ns_id, key, &removed), 0);
	return r;
}

static uint64_t out_pinned_removed(struct store *st)
{
	struct store_stats ss;

	store_stats(st, &ss);
	return ss.pinned_removed_bytes;
}

/* Queue `text` as reply bytes. */
static void out_text(struct srv_out *o, const char *text)
{
	uint8_t *p;

	assert_int_equal(srv_out_reserve(o, strlen(text) + 10, &p), 0);
	memcpy(p, text, strlen(text));
	srv_out_commit(o, strlen(text));
}

/* Bytes, blocks and bytes leave in the order queued, through a socket
 * that takes them a little at a time; each block's pin is released once,
 * when its last byte is written. */
static void test_out_order_and_pins(void **state)
{
	static uint8_t got[2 * OUT_BLOCK_BYTES + 64];
	struct store_ref ra, rb;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;
	size_t have = 0, written = 0, want = 2 * OUT_BLOCK_BYTES + 9;
	int sv[2], sndbuf = 16384;

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	rb = out_pin_deleted(st, ns_id, 1);
	assert_true(out_pinned_removed(st) >= 2 * OUT_BLOCK_BYTES);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	srv_out_init(&o, st);
	out_text(&o, "hdr");
	assert_int_equal(srv_out_block(&o, ra.data, ra.length, ra.block), 0);
	out_text(&o, "mi");
	out_text(&o, "d"); /* joins "mi": one segment */
	assert_int_equal(srv_out_block(&o, rb.data, rb.length, rb.block), 0);
	out_text(&o, "end");
	assert_int_equal(o.tail - o.head, 5);
	assert_int_equal(srv_out_bytes(&o), want);
	while (have < want) {
		long w = srv_out_write(&o, sv[0]);
		ssize_t n;

		assert_true(w > 0 || w == -EAGAIN);
		written += w > 0 ? (size_t)w : 0;
		/* Block a is released once its last byte is out, not before. */
		if (written < 3 + OUT_BLOCK_BYTES)
			assert_true(out_pinned_removed(st) >= 2 * OUT_BLOCK_BYTES);
		else if (written < want - 3)
			assert_true(out_pinned_removed(st) < 2 * OUT_BLOCK_BYTES &&
				    out_pinned_removed(st) >= OUT_BLOCK_BYTES);
		n = read(sv[1], got + have, sizeof(got) - have);
		assert_true(n > 0);
		have += (size_t)n;
	}
	assert_int_equal(written, want);
	assert_int_equal(have, want);
	assert_int_equal(srv_out_bytes(&o), 0);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_memory_equal(got, "hdr", 3);
	for (size_t i = 0; i < OUT_BLOCK_BYTES; i += 4099) {
		assert_int_equal(got[3 + i], (uint8_t)(i * 7));
		assert_int_equal(got[6 + OUT_BLOCK_BYTES + i], (uint8_t)(i * 7 + 1));
	}
	assert_memory_equal(got + 3 + OUT_BLOCK_BYTES, "mid", 3);
	assert_memory_equal(got + want - 3, "end", 3);
	assert_int_equal(srv_out_write(&o, sv[0]), 0);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
	store_close(st);
}

/* Dropping a queue with bytes unsent releases every pin it holds (once:
 * the store would trip over a second release), and leaves it reusable. */
static void test_out_free_releases_unsent(void **state)
{
	struct store_ref ra, rb;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;
	int sv[2];

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	rb = out_pin_deleted(st, ns_id, 1);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	srv_out_init(&o, st);
	out_text(&o, "hdr");
	assert_int_equal(srv_out_block(&o, ra.data, ra.length, ra.block), 0);
	assert_int_equal(srv_out_block(&o, rb.data, rb.length, rb.block), 0);
	/* Part of it written: the peer reads nothing, the socket fills. */
	assert_true(srv_out_write(&o, sv[0]) > 0);
	assert_true(srv_out_bytes(&o) > 0);
	assert_true(out_pinned_removed(st) > 0);
	srv_out_free(&o);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_int_equal(srv_out_bytes(&o), 0);
	srv_out_free(&o); /* twice, and on an empty queue: nothing happens */
	out_text(&o, "again");
	assert_int_equal(srv_out_bytes(&o), 5);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
	store_close(st);
}

/* An empty block queues nothing and its pin goes back at once. */
static void test_out_empty_block_released(void **state)
{
	struct store_ref ra;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	assert_true(out_pinned_removed(st) > 0);
	srv_out_init(&o, st);
	assert_int_equal(srv_out_block(&o, ra.data, 0, ra.block), 0);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_int_equal(srv_out_bytes(&o), 0);
	assert_int_equal(o.tail, o.head);
	srv_out_free(&o);
	store_close(st);
}

/* Once the queue empties, the next replies reuse the same buffer and
 * segment array (no allocation); a burst beyond the keep sizes gives its
 * memory back. */
static void test_out_buffers_kept(void **state)
{
	struct srv_out o;
	uint8_t *buf, *p;
	struct srv_out_seg *segs;
	int sv[2];
	char drain[4096];

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	srv_out_init(&o, NULL);
	out_text(&o, "first reply");
	buf = o.buf;
	segs = o.segs;
	assert_non_null(buf);
	assert_int_equal(srv_out_write(&o, sv[0]), 11);
	assert_int_equal(read(sv[1], drain, sizeof(drain)), 11);
	for (int i = 0; i < 100; i++) {
		out_text(&o, "same-shaped reply");
		assert_int_equal(srv_out_write(&o, sv[0]), 17);
		assert_int_equal(read(sv[1], drain, sizeof(drain)), 17);
		assert_ptr_equal(o.buf, buf);
		assert_ptr_equal(o.segs, segs);
	}
	assert_int_equal(srv_out_reserve(&o, SRV_OUT_KEEP_BYTES + 1, &p), 0);
	memset(p, 'x', 100);
	srv_out_commit(&o, 100);
	assert_true(o.buf_cap > SRV_OUT_KEEP_BYTES);
	assert_int_equal(srv_out_write(&o, sv[0]), 100);
	assert_null(o.buf);
	assert_int_equal(o.buf_cap, 0);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sanitize_printable_passes),
		cmocka_unit_test(test_sanitize_escapes),
		cmocka_unit_test(test_sanitize_truncates_with_ellipsis),
		cmocka_unit_test(test_sanitize_never_splits_an_escape),
		cmocka_unit_test(test_sanitize_exact_fit_has_no_ellipsis),
		cmocka_unit_test(test_sanitize_tiny_buffers),
		cmocka_unit_test(test_ns_name_valid),
		cmocka_unit_test(test_hist_buckets_cover_values),
		cmocka_unit_test(test_hist_percentiles_uniform),
		cmocka_unit_test(test_hist_empty_and_single),
		cmocka_unit_test(test_hist_tail),
		cmocka_unit_test(test_stats_sum_adds_workers),
		cmocka_unit_test(test_stats_json_exact),
		cmocka_unit_test(test_stats_json_nvme),
		cmocka_unit_test(test_stats_json_no_namespaces),
		cmocka_unit_test(test_stats_json_escapes_odd_bytes),
		cmocka_unit_test(test_ratelimit_caps_a_burst),
		cmocka_unit_test(test_ratelimit_quiet_traffic_passes),
		cmocka_unit_test(test_ratelimit_flush_reports_once),
		cmocka_unit_test(test_quote_never_shows_hello_body),
		cmocka_unit_test(test_quote_other_bodies_sanitized),
		cmocka_unit_test(test_body_max_per_opcode),
		cmocka_unit_test(test_check_dram),
		cmocka_unit_test(test_check_dram_cgroup),
		cmocka_unit_test(test_parse_memory_max),
		cmocka_unit_test(test_out_order_and_pins),
		cmocka_unit_test(test_out_free_releases_unsent),
		cmocka_unit_test(test_out_empty_block_released),
		cmocka_unit_test(test_out_buffers_kept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
