/*
 * test_srv_stats.c - unit tests of kvpoold's figures: the latency
 * histogram, the sum of the workers' counters, and the STATS JSON
 * document. (Moved from test_server.c.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "proto.h"
#include "srv_hist.h"
#include "srv_server.h"
#include "srv_stats.h"
#include "srv_tenant.h"

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
	"\"hit_ratio\":0.250000,\"waits\":{\"waiting\":23,\"bytes\":4096,\"started\":31,"
	"\"complete\":32,\"timeout\":33,\"refused\":34,\"refused_bytes\":37,\"ended\":35,"
	"\"clamped\":36,"
	"\"wake_us\":{\"p50\":41,\"p99\":900,\"p999\":900}}},"
	"\"delete\":{\"requests\":15,\"blocks\":16},"
	"\"ping\":{\"requests\":17},\"stats\":{\"requests\":18},"
	"\"errors\":{\"bad_request\":19,\"too_large\":20,\"busy\":21,\"full\":22}},"
	"\"latency_us\":{\"put\":{\"p50\":12,\"p99\":12,\"p999\":12},"
	"\"get\":{\"p50\":0,\"p99\":0,\"p999\":0},"
	"\"exists\":{\"p50\":0,\"p99\":0,\"p999\":0},"
	"\"match\":{\"p50\":0,\"p99\":0,\"p999\":0}},"
	"\"blocks\":2,"
	"\"retention\":{\"retained_blocks\":3,\"retained_bytes\":12288,\"refused\":4,"
	"\"expired\":5,\"max_retain_ms\":86400000,\"max_retained_bytes\":262144},"
	"\"namespaces\":{\"a\\\"b\\\\c\":{\"blocks\":2,\"nvme_blocks\":0,\"bytes\":5000,\"puts\":3,"
	"\"put_exists\":2,\"put_errors\":1,\"get_hits\":9,\"get_misses\":10,"
	"\"exists_hits\":12,\"exists_misses\":13,\"match_requests\":14,"
	"\"match_blocks_queried\":0,\"match_blocks_matched\":0,\"match_hit_ratio\":0.000000,"
	"\"evictions\":4,\"deletes\":16,\"retained_blocks\":3,\"retained_bytes\":12288,"
	"\"retain_budget_bytes\":262144,\"retain_budget_of\":\"namespace\",\"retain_refused\":4,"
	"\"retain_expired\":5},"
	"\"m2\":{\"blocks\":0,\"nvme_blocks\":0,\"bytes\":0,\"puts\":0,\"put_exists\":0,\"put_errors\":0,"
	"\"get_hits\":0,\"get_misses\":0,\"exists_hits\":0,\"exists_misses\":0,"
	"\"match_requests\":1,\"match_blocks_queried\":4,\"match_blocks_matched\":3,"
	"\"match_hit_ratio\":0.750000,\"evictions\":0,\"deletes\":0,\"retained_blocks\":0,"
	"\"retained_bytes\":0,\"retain_budget_bytes\":0,\"retain_budget_of\":\"tenant\","
	"\"retain_refused\":0,\"retain_expired\":0}}}";

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
	ops->c[SRV_C_match_waits_started] = 31;
	ops->c[SRV_C_match_waits_complete] = 32;
	ops->c[SRV_C_match_waits_timeout] = 33;
	ops->c[SRV_C_match_waits_refused] = 34;
	ops->c[SRV_C_match_waits_ended] = 35;
	ops->c[SRV_C_match_waits_clamped] = 36;
	ops->c[SRV_C_match_waits_refused_bytes] = 37;
	/* wake-ups: 40 us (twice) and 900 us: p50 41 (the top of 40's bucket),
	 * p99 and p999 900 (capped at the largest value) */
	srv_hist_record(&ops->match_wake, 40);
	srv_hist_record(&ops->match_wake, 40);
	srv_hist_record(&ops->match_wake, 900);
	*st = (struct store_stats){ .capacity_bytes = 1048576, .used_bytes = 8192,
				    .payload_bytes = 5000, .inflight_put_bytes = 4096,
				    .free_bytes = 1040384, .largest_free_bytes = 520192,
				    .fragmentation = 0.5, .index_bytes = 999, .blocks = 2,
				    .dram_blocks = 2,
				    .evictions = 4, .evict_passes = 6, .evict_pass_max_us = 1234,
				    .leases_active = 1, .checksum_errors = 2,
				    .namespaces = 2, .retained_blocks = 3, .retained_bytes = 12288,
				    .retain_refused = 4, .retain_expired = 5 };
	memset(ns, 0, 2 * sizeof(ns[0]));
	strcpy(ns[0].name, "a\"b\\c");
	ns[0].blocks = 2, ns[0].bytes = 5000, ns[0].puts = 3, ns[0].put_exists = 2;
	ns[0].put_errors = 1, ns[0].get_hits = 9, ns[0].get_misses = 10;
	ns[0].exists_hits = 12, ns[0].exists_misses = 13, ns[0].match_requests = 14;
	ns[0].evictions = 4, ns[0].deletes = 16;
	ns[0].retained_blocks = 3, ns[0].retained_bytes = 12288, ns[0].retain_budget_bytes = 262144;
	ns[0].retain_refused = 4, ns[0].retain_expired = 5;
	ns[1].retain_tenant = 1;
	strcpy(ns[1].name, "m2");
	ns[1].match_requests = 1, ns[1].match_blocks_queried = 4, ns[1].match_blocks_matched = 3;
	*doc = (struct srv_stats_doc){ .version = "0.1.0", .protocol = 1, .pid = 42,
				       .uptime_s = 7, .conn_current = 3, .conn_total = 10,
				       .conn_rejected = 1, .ops = ops, .store = st, .ns = ns,
				       .ns_count = 2, .max_retain_ms = 86400000,
				       .max_retained_bytes = 262144, .match_waiting = 23,
				       .match_wait_bytes = 4096 };
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
	st.rebuild_truncated = 118;
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
			      "\"rebuild_truncated\":118,\"index_records_lost\":117,\"index_quarantined\":1}},\"index_bytes\":"));
	assert_non_null(strstr(s, "\"p999\":0}},\"blocks\":9,\"retention\":{"));
	assert_non_null(strstr(s, "{\"blocks\":9,\"nvme_blocks\":8,\"bytes\":5000,"));
	st.nvme_direct_io = 1, st.nvme_healthy = 0;
	free(s);
	s = render(&doc);
	assert_non_null(strstr(s, "\"direct_io\":true,\"healthy\":false,"));
	free(s);
	free(ops);
}

/* With a tokens file: each tenant's billing and retention under "tenants", by the
 * head of its token's digest; an empty object before any tenant. */
static void test_stats_json_tenants(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct srv_tenant_stats t[2] = {
		{ .id = "0123456789ab", .retain = { 1, 4096, 8192, 2, 3 },
		  .billed_bytes = 65536, .leased_bytes = 4096, .namespaces = 2 },
		{ .id = "ba9876543210", .retain = { 0, 0, 0, 7, 0 } },
	};
	struct store_ns_stats ns[2];
	struct store_stats st;
	struct srv_stats_doc doc;
	char *s;

	(void)state;
	assert_non_null(ops);
	fill_doc(&doc, ops, &st, ns);
	s = render(&doc);
	assert_null(strstr(s, "\"tenants\""));
	free(s);
	doc.tenants_on = 1;
	s = render(&doc);
	assert_non_null(strstr(s, "\"max_retained_bytes\":262144},\"tenants\":{},\"namespaces\""));
	free(s);
	doc.tenants = t;
	doc.tenant_count = 2;
	s = render(&doc);
	assert_non_null(strstr(s, "\"tenants\":{\"0123456789ab\":{\"billed_bytes\":65536,"
			      "\"leased_bytes\":4096,\"namespaces\":2,\"retained_blocks\":1,"
			      "\"retained_bytes\":4096,\"retain_budget_bytes\":8192,"
			      "\"retain_refused\":2,\"retain_expired\":3},\"ba9876543210\":{"
			      "\"billed_bytes\":0,\"leased_bytes\":0,\"namespaces\":0,"
			      "\"retained_blocks\":0,\"retained_bytes\":0,\"retain_budget_bytes\":0,"
			      "\"retain_refused\":7,\"retain_expired\":0}},\"namespaces\""));
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hist_buckets_cover_values),
		cmocka_unit_test(test_hist_percentiles_uniform),
		cmocka_unit_test(test_hist_empty_and_single),
		cmocka_unit_test(test_hist_tail),
		cmocka_unit_test(test_stats_sum_adds_workers),
		cmocka_unit_test(test_stats_json_exact),
		cmocka_unit_test(test_stats_json_nvme),
		cmocka_unit_test(test_stats_json_tenants),
		cmocka_unit_test(test_stats_json_no_namespaces),
		cmocka_unit_test(test_stats_json_escapes_odd_bytes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
