/*
 * test_basic.c - one client against a real kvpoold: byte-exact round trips,
 * immutability, misses, parents, exists/match/delete/drop, namespaces,
 * scatter-gather, STATS keys and counts, ping, clean shutdown.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "harness.h"

static struct {
	struct harness_server srv;
	struct kvpool_client *c; /* namespace "basic" */
} g;

static int group_setup(void **state)
{
	(void)state;
	if (harness_group_start(&g.srv, harness_default_flags))
		return -1;
	return harness_group_client(&g.srv, "basic", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	g.c = NULL;
	harness_kill(&g.srv);
	return 0;
}

/* Put one contiguous block of `len` bytes whose content follows `seed`. */
static int put_filled(struct kvpool_client *c, const uint8_t key[32], const uint8_t *parent,
		      size_t len, uint64_t seed)
{
	uint8_t *buf = malloc(len);
	int rc;

	assert_non_null(buf);
	harness_fill(buf, len, seed);
	rc = kvpool_put_bytes(c, key, parent, buf, len);
	free(buf);
	return rc;
}

/* Get a block and check it is exactly `len` bytes following `seed`. */
static void assert_block(struct kvpool_client *c, const uint8_t key[32], size_t len, uint64_t seed)
{
	uint8_t *want = malloc(len), *got = malloc(len + 64);
	uint64_t got_len = 0;

	assert_non_null(want);
	assert_non_null(got);
	harness_fill(want, len, seed);
	memset(got, 0xA5, len + 64);
	assert_int_equal(kvpool_get_bytes(c, key, got, len + 64, &got_len), 0);
	assert_int_equal(got_len, len);
	assert_memory_equal(got, want, len);
	/* Nothing written past the block. */
	for (size_t i = len; i < len + 64; i++)
		assert_int_equal(got[i], 0xA5);
	free(want);
	free(got);
}

static void test_round_trip_sizes(void **state)
{
	static const size_t sizes[] = { 1, 4095, 4096, (1u << 20) + 1 };
	uint8_t key[32];

	(void)state;
	harness_need_server(&g.srv);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		harness_key(key, "sizes", i);
		assert_int_equal(put_filled(g.c, key, NULL, sizes[i], 100 + i), 0);
		assert_block(g.c, key, sizes[i], 100 + i);
	}
}

/* A buffer one byte too small is refused, and a buffer of exactly the
 * block's size works. */
static void test_get_buffer_sizes(void **state)
{
	const size_t len = 10000;
	uint8_t key[32], *want = malloc(len), *buf = malloc(len);
	uint64_t got_len = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(want);
	assert_non_null(buf);
	harness_key(key, "bufsize", 0);
	harness_fill(want, len, 7);
	assert_int_equal(kvpool_put_bytes(g.c, key, NULL, want, len), 0);
	assert_int_equal(kvpool_get_bytes(g.c, key, buf, len - 1, &got_len), -EMSGSIZE);
	assert_int_equal(kvpool_get_bytes(g.c, key, buf, len, &got_len), 0);
	assert_int_equal(got_len, len);
	assert_memory_equal(buf, want, len);
	free(want);
	free(buf);
}

static void test_immutable(void **state)
{
	uint8_t key[32];

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "immutable", 0);
	assert_int_equal(put_filled(g.c, key, NULL, 8192, 1), 0);
	/* Same key, other content, other length: success, nothing replaced. */
	assert_int_equal(put_filled(g.c, key, NULL, 8192, 2), 0);
	assert_int_equal(put_filled(g.c, key, NULL, 100, 3), 0);
	assert_block(g.c, key, 8192, 1);
}

static void test_get_miss(void **state)
{
	uint8_t key[32], buf[64];
	uint64_t len = 12345;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "never-stored", 0);
	assert_int_equal(kvpool_get_bytes(g.c, key, buf, sizeof(buf), &len), -ENOENT);
	assert_int_equal(len, 12345); /* out-param untouched on error */
}

static void test_no_parent(void **state)
{
	uint8_t key[32], parent[32];

	(void)state;
	harness_need_server(&g.srv);
	harness_key(parent, "orphan-parent", 0);
	harness_key(key, "orphan", 0);
	assert_int_equal(put_filled(g.c, key, parent, 4096, 5), -ENOLINK);
	harness_check_absent_or_fail(g.c, key);
}

/* A chain put in one batch: each block's parent is the one before it in
 * the same batch. A block with a missing parent fails alone. */
static void test_batch_chain_put(void **state)
{
	enum { N = 6 };
	uint8_t keys[N][32], stray_parent[32], bufs[N][3000];
	struct iovec iov[N];
	struct kvpool_put_block blocks[N];
	int st[N];
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(stray_parent, "batch-stray-parent", 0);
	for (int i = 0; i < N; i++) {
		harness_key(keys[i], "batch-chain", i);
		harness_fill(bufs[i], sizeof(bufs[i]), 300 + i);
		iov[i] = (struct iovec){ .iov_base = bufs[i], .iov_len = sizeof(bufs[i]) };
		blocks[i] = (struct kvpool_put_block){
			.key = keys[i], .parent = i ? keys[i - 1] : NULL, .iov = &iov[i], .iovcnt = 1,
		};
		st[i] = 1;
	}
	/* The last block hangs off a parent that was never stored. */
	blocks[N - 1].parent = stray_parent;
	assert_int_equal(kvpool_put(g.c, blocks, N, st), -ENOLINK);
	for (int i = 0; i < N - 1; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(st[N - 1], -ENOLINK);
	assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])keys, N, 0, &matched), 0);
	assert_int_equal(matched, N - 1);
	for (int i = 0; i < N - 1; i++)
		assert_block(g.c, keys[i], sizeof(bufs[i]), 300 + i);
}

/* One GET batch with a hit, a miss, a too-small buffer and a hit: each
 * block gets its own status and the hits are byte-exact. A PUT batch with
 * the same key twice stores it once. */
static void test_mixed_batches(void **state)
{
	enum { N = 4, LEN = 6000 };
	uint8_t keys[N][32], data[N][LEN], got[N][LEN + 1];
	struct iovec piov[2], giov[N];
	struct kvpool_put_block pb[2];
	struct kvpool_get_block gb[N];
	int st[N];

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < N; i++) {
		harness_key(keys[i], "mixed", (uint64_t)i);
		harness_fill(data[i], LEN, 900 + (uint64_t)i);
		if (i != 1)
			assert_int_equal(kvpool_put_bytes(g.c, keys[i], NULL, data[i], LEN), 0);
		giov[i] = (struct iovec){ .iov_base = got[i], .iov_len = i == 2 ? LEN - 1 : LEN + 1 };
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
		st[i] = 1;
	}
	assert_int_equal(kvpool_get(g.c, gb, N, st), -ENOENT);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -ENOENT);
	assert_int_equal(st[2], -EMSGSIZE);
	assert_int_equal(st[3], 0);
	assert_int_equal(gb[0].length, LEN);
	assert_int_equal(gb[3].length, LEN);
	assert_memory_equal(got[0], data[0], LEN);
	assert_memory_equal(got[3], data[3], LEN);

	/* keys[1] twice in one batch, different bytes: the first wins. */
	piov[0] = (struct iovec){ .iov_base = data[1], .iov_len = LEN };
	piov[1] = (struct iovec){ .iov_base = data[2], .iov_len = LEN };
	pb[0] = (struct kvpool_put_block){ .key = keys[1], .iov = &piov[0], .iovcnt = 1 };
	pb[1] = (struct kvpool_put_block){ .key = keys[1], .iov = &piov[1], .iovcnt = 1 };
	assert_int_equal(kvpool_put(g.c, pb, 2, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	harness_check_block_or_fail(g.c, keys[1], data[1], LEN);
}

static void test_exists_match(void **state)
{
	enum { N = 5 };
	uint8_t keys[N + 1][32];
	int st[N + 1];
	size_t matched = 99;

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i <= N; i++)
		harness_key(keys[i], "exists-chain", i);
	for (int i = 0; i < N; i++)
		assert_int_equal(put_filled(g.c, keys[i], i ? keys[i - 1] : NULL, 5000, i), 0);
	/* keys[N] is never stored. */
	assert_int_equal(kvpool_exists(g.c, (const uint8_t(*)[32])keys, N + 1, st), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(st[N], -ENOENT);

	assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])keys, N, 0, &matched), 0);
	assert_int_equal(matched, N);
	assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])keys, N + 1, 0, &matched), 0);
	assert_int_equal(matched, N);
	assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])keys, 3, 0, &matched), 0);
	assert_int_equal(matched, 3);
	/* A miss in the middle stops the prefix there. */
	{
		uint8_t holey[4][32];

		memcpy(holey[0], keys[0], 32);
		memcpy(holey[1], keys[1], 32);
		memcpy(holey[2], keys[N], 32);
		memcpy(holey[3], keys[3], 32);
		assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])holey, 4, 0, &matched), 0);
		assert_int_equal(matched, 2);
		assert_int_equal(kvpool_match(g.c, (const uint8_t(*)[32])holey + 2, 2, 0, &matched),
				 0);
		assert_int_equal(matched, 0);
	}
}

/* DELETE removes the block and every descendant, across branches. */
static void test_delete_descendants(void **state)
{
	enum { N = 5 };
	uint8_t keys[N][32], branch[32], missing[32];
	int st[N];

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < N; i++) {
		harness_key(keys[i], "delete-chain", i);
		assert_int_equal(put_filled(g.c, keys[i], i ? keys[i - 1] : NULL, 4096, 50 + i), 0);
	}
	harness_key(branch, "delete-branch", 0);
	assert_int_equal(put_filled(g.c, branch, keys[2], 4096, 60), 0);
	harness_key(missing, "delete-missing", 0);

	st[0] = 1;
	assert_int_equal(kvpool_delete(g.c, (const uint8_t(*)[32])keys[2], 1, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(kvpool_exists(g.c, (const uint8_t(*)[32])keys, N, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	for (int i = 2; i < N; i++)
		assert_int_equal(st[i], -ENOENT);
	assert_int_equal(kvpool_exists(g.c, (const uint8_t(*)[32])branch, 1, st), 0);
	assert_int_equal(st[0], -ENOENT);
	assert_block(g.c, keys[1], 4096, 51);

	st[0] = 1;
	assert_int_equal(kvpool_delete(g.c, (const uint8_t(*)[32])missing, 1, st), 0);
	assert_int_equal(st[0], -ENOENT);
}

static void test_drop_namespace(void **state)
{
	struct kvpool_client *a = NULL, *b = NULL;
	uint8_t keys[4][32];
	uint64_t dropped = 0;
	int st[4];

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "basic-drop-a", &a), 0);
	assert_int_equal(harness_client(&g.srv, "basic-drop-b", &b), 0);
	for (int i = 0; i < 4; i++) {
		harness_key(keys[i], "drop", i);
		assert_int_equal(put_filled(a, keys[i], i == 1 || i == 2 ? keys[i - 1] : NULL, 4096, i),
				 0);
		assert_int_equal(put_filled(b, keys[i], NULL, 4096, i), 0);
	}
	/* Own namespace. */
	assert_int_equal(kvpool_drop_namespace(a, NULL, &dropped), 0);
	assert_int_equal(dropped, 4);
	assert_int_equal(kvpool_exists(a, (const uint8_t(*)[32])keys, 4, st), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], -ENOENT);
	assert_int_equal(harness_ns_stat_or_fail(a, "basic-drop-a", "blocks"), 0);
	/* The other namespace is untouched until it is dropped by name. */
	assert_int_equal(kvpool_exists(b, (const uint8_t(*)[32])keys, 4, st), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], 0);
	dropped = 0;
	assert_int_equal(kvpool_drop_namespace(g.c, "basic-drop-b", &dropped), 0);
	assert_int_equal(dropped, 4);
	assert_int_equal(kvpool_exists(b, (const uint8_t(*)[32])keys, 4, st), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], -ENOENT);
	/* Dropping a namespace that never held anything is fine. */
	dropped = 99;
	assert_int_equal(kvpool_drop_namespace(g.c, "basic-never-used", &dropped), 0);
	assert_int_equal(dropped, 0);
	{
		struct json_object *doc, *nss;

		assert_int_equal(harness_stats(g.c, "basic-never-used", &doc), 0);
		assert_true(json_object_object_get_ex(doc, "namespaces", &nss));
		assert_true(json_object_is_type(nss, json_type_object));
		assert_int_equal(json_object_object_length(nss), 0);
		json_object_put(doc);
	}
	/* A dropped namespace can be used again. */
	assert_int_equal(put_filled(a, keys[0], NULL, 4096, 77), 0);
	assert_block(a, keys[0], 4096, 77);
	kvpool_close(a);
	kvpool_close(b);
}

static void test_namespaces_isolate(void **state)
{
	struct kvpool_client *a = NULL, *b = NULL;
	uint8_t key[32], only_a[32];

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "basic-iso-a", &a), 0);
	assert_int_equal(harness_client(&g.srv, "basic-iso-b", &b), 0);
	harness_key(key, "iso-shared", 0);
	harness_key(only_a, "iso-only-a", 0);
	assert_int_equal(put_filled(a, key, NULL, 6000, 1000), 0);
	assert_int_equal(put_filled(b, key, NULL, 7000, 2000), 0);
	assert_int_equal(put_filled(a, only_a, key, 3000, 3000), 0);
	assert_block(a, key, 6000, 1000);
	assert_block(b, key, 7000, 2000);
	harness_check_absent_or_fail(b, only_a);
	/* The parent is looked up in b's namespace: b's key is there. */
	assert_int_equal(put_filled(b, only_a, key, 3000, 4000), 0);
	assert_block(a, only_a, 3000, 3000);
	assert_block(b, only_a, 3000, 4000);
	kvpool_close(a);
	kvpool_close(b);
}

/* Scatter-gather: put from several pieces, get into a different split. */
static void test_scatter_gather(void **state)
{
	static const size_t put_parts[] = { 1, 1000, 4096, 7, 65536 + 3 };
	static const size_t get_parts[] = { 4097, 3, 66543 };
	enum { NPUT = 5, NGET = 3 };
	size_t total = 0, off = 0;
	uint8_t key[32], key2[32], *want, *flat;
	struct iovec piov[NPUT], giov[NGET];
	uint8_t *gbuf[NGET];
	struct kvpool_put_block pb[2];
	struct kvpool_get_block gb[2];
	struct iovec flat_iov;
	int st[2];

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < NPUT; i++)
		total += put_parts[i];
	want = malloc(total);
	flat = malloc(total);
	assert_non_null(want);
	assert_non_null(flat);
	harness_fill(want, total, 4242);
	for (int i = 0; i < NPUT; i++) {
		/* Separate allocations, so the pieces are really apart. */
		piov[i].iov_base = malloc(put_parts[i]);
		assert_non_null(piov[i].iov_base);
		memcpy(piov[i].iov_base, want + off, put_parts[i]);
		piov[i].iov_len = put_parts[i];
		off += put_parts[i];
	}
	assert_int_equal(off, total);
	harness_key(key, "sg", 0);
	harness_key(key2, "sg", 1);
	flat_iov = (struct iovec){ .iov_base = want, .iov_len = total };
	assert_int_equal(kvpool_checksum(piov, NPUT), kvpool_checksum(&flat_iov, 1));
	/* Two blocks in one batch: key (pieces) and key2 (its child, flat). */
	pb[0] = (struct kvpool_put_block){ .key = key, .iov = piov, .iovcnt = NPUT };
	pb[1] = (struct kvpool_put_block){ .key = key2, .parent = key, .iov = &flat_iov, .iovcnt = 1 };
	assert_int_equal(kvpool_put(g.c, pb, 2, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);

	for (int i = 0; i < NGET; i++) {
		gbuf[i] = malloc(get_parts[i]);
		assert_non_null(gbuf[i]);
		giov[i] = (struct iovec){ .iov_base = gbuf[i], .iov_len = get_parts[i] };
	}
	memset(flat, 0, total);
	struct iovec fiov = { .iov_base = flat, .iov_len = total };
	gb[0] = (struct kvpool_get_block){ .key = key2, .iov = giov, .iovcnt = NGET };
	gb[1] = (struct kvpool_get_block){ .key = key, .iov = &fiov, .iovcnt = 1 };
	assert_int_equal(kvpool_get(g.c, gb, 2, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	assert_int_equal(gb[0].length, total);
	assert_int_equal(gb[1].length, total);
	assert_memory_equal(flat, want, total);
	off = 0;
	for (int i = 0; i < NGET; i++) {
		assert_memory_equal(gbuf[i], want + off, get_parts[i]);
		off += get_parts[i];
		free(gbuf[i]);
	}
	for (int i = 0; i < NPUT; i++)
		free(piov[i].iov_base);
	free(want);
	free(flat);
}

/* Every documented STATS key, with its JSON type. */
static void assert_stats_keys(struct json_object *doc, const char *ns)
{
	static const char *const ints[] = {
		"protocol", "pid", "uptime_s", "connections.current", "connections.total",
		"connections.rejected", "tiers.dram.capacity_bytes", "tiers.dram.used_bytes",
		"tiers.dram.payload_bytes", "tiers.dram.free_bytes", "tiers.dram.largest_free_bytes",
		"tiers.dram.blocks", "tiers.dram.inflight_put_bytes", "tiers.dram.evict_passes",
		"tiers.dram.evict_pass_max_us", "index_bytes", "evictions",
		"leases_active", "checksum_errors", "ops.put.requests", "ops.put.blocks", "ops.put.ok",
		"ops.put.exists", "ops.put.errors", "ops.get.requests", "ops.get.hits",
		"ops.get.misses", "ops.exists.requests", "ops.exists.hits", "ops.exists.misses",
		"ops.match.requests", "ops.match.blocks_queried", "ops.match.blocks_matched",
		"ops.delete.requests", "ops.delete.blocks", "ops.ping.requests",
		"ops.stats.requests", "ops.errors.bad_request", "ops.errors.too_large",
		"ops.errors.busy", "ops.errors.full", "blocks",
	};
	static const char *const nums[] = { "tiers.dram.fragmentation", "ops.match.hit_ratio" };
	static const char *const lat_ops[] = { "put", "get", "exists", "match" };
	static const char *const lat_pcts[] = { "p50", "p99", "p999" };
	static const char *const ns_ints[] = {
		"blocks", "nvme_blocks", "bytes", "puts", "put_exists", "put_errors", "get_hits",
		"get_misses",
		"exists_hits", "exists_misses", "match_requests", "match_blocks_queried",
		"match_blocks_matched", "evictions", "deletes",
	};
	struct json_object *v;
	char path[300];
	uint64_t u;
	double d;

	assert_true(json_object_object_get_ex(doc, "version", &v));
	assert_true(json_object_is_type(v, json_type_string));
	assert_string_equal(json_object_get_string(v), KVPOOL_VERSION);
	/* no NVMe tier here: tiers.nvme says so and nothing else */
	assert_true(json_object_object_get_ex(doc, "tiers", &v));
	assert_true(json_object_object_get_ex(v, "nvme", &v));
	assert_int_equal(json_object_object_length(v), 1);
	assert_true(json_object_object_get_ex(v, "enabled", &v));
	assert_true(json_object_is_type(v, json_type_boolean));
	assert_false(json_object_get_boolean(v));
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		harness_json_u64_or_fail(doc, ints[i]);
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		d = harness_json_double_or_fail(doc, nums[i]);
		assert_true(d >= 0.0 && d <= 1.0);
	}
	for (size_t i = 0; i < 4; i++) {
		for (size_t j = 0; j < 3; j++) {
			snprintf(path, sizeof(path), "latency_us.%s.%s", lat_ops[i], lat_pcts[j]);
			harness_json_u64_or_fail(doc, path);
		}
	}
	for (size_t i = 0; i < sizeof(ns_ints) / sizeof(ns_ints[0]); i++) {
		snprintf(path, sizeof(path), "namespaces.%s.%s", ns, ns_ints[i]);
		harness_json_u64_or_fail(doc, path);
	}
	snprintf(path, sizeof(path), "namespaces.%s.match_hit_ratio", ns);
	harness_json_double_or_fail(doc, path);
	assert_int_equal(harness_json_u64(doc, "protocol", &u), 0);
	assert_int_equal(u, PROTO_VERSION_MAX);
	assert_int_equal(harness_json_u64(doc, "pid", &u), 0);
	assert_int_equal(u, (uint64_t)g.srv.pid);
	assert_int_equal(harness_json_u64(doc, "tiers.dram.capacity_bytes", &u), 0);
	assert_int_equal(u, 64ull << 20);
	assert_int_equal(harness_json_u64(doc, "connections.current", &u), 0);
	assert_true(u >= 2);
}

static uint64_t delta(struct json_object *before, struct json_object *after, const char *path)
{
	return harness_json_u64_or_fail(after, path) - harness_json_u64_or_fail(before, path);
}

/* Do a known mix of operations in a fresh namespace; STATS must count
 * exactly that, globally (as deltas) and in the namespace. */
static void test_stats_counts(void **state)
{
	const char *ns = "basic-stats";
	struct kvpool_client *c = NULL;
	struct json_object *before, *after, *nsdoc, *nss;
	uint8_t k[4][32], miss[32], q[4][32];
	char path[300];
	uint8_t buf[8192];
	uint64_t len, puts;
	size_t matched = 0;
	int st[3];
	double ratio;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, ns, &c), 0);
	for (int i = 0; i < 4; i++)
		harness_key(k[i], "stats", i);
	harness_key(miss, "stats-miss", 0);
	assert_int_equal(harness_stats(c, NULL, &before), 0);

	assert_int_equal(put_filled(c, k[0], NULL, 5000, 1), 0);
	assert_int_equal(put_filled(c, k[1], k[0], 4096, 2), 0);
	assert_int_equal(put_filled(c, k[2], k[1], 1, 3), 0);
	assert_int_equal(put_filled(c, k[0], NULL, 5000, 1), 0);     /* already stored */
	assert_int_equal(put_filled(c, k[3], miss, 4096, 4), -ENOLINK); /* no parent */
	assert_int_equal(kvpool_get_bytes(c, k[0], buf, sizeof(buf), &len), 0);
	assert_int_equal(kvpool_get_bytes(c, k[2], buf, sizeof(buf), &len), 0);
	assert_int_equal(kvpool_get_bytes(c, miss, buf, sizeof(buf), &len), -ENOENT);
	/* a buffer too small: TOO_LARGE with the size, not a hit (no bytes sent) */
	assert_int_equal(kvpool_get_bytes(c, k[0], buf, 100, &len), -EMSGSIZE);
	assert_int_equal(len, 5000);
	memcpy(q[0], k[0], 32);
	memcpy(q[1], k[1], 32);
	memcpy(q[2], miss, 32);
	assert_int_equal(kvpool_exists(c, (const uint8_t(*)[32])q, 3, st), 0);
	memcpy(q[2], k[2], 32);
	memcpy(q[3], miss, 32);
	assert_int_equal(kvpool_match(c, (const uint8_t(*)[32])q, 4, 0, &matched), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(kvpool_delete(c, (const uint8_t(*)[32])k[2], 1, st), 0);
	assert_int_equal(kvpool_ping(c, NULL), 0);

	assert_int_equal(harness_stats(c, NULL, &after), 0);
	assert_stats_keys(after, ns);
	assert_int_equal(delta(before, after, "ops.put.requests"), 5);
	assert_int_equal(delta(before, after, "ops.put.blocks"), 5);
	assert_int_equal(delta(before, after, "ops.put.ok"), 3);
	assert_int_equal(delta(before, after, "ops.put.exists"), 1);
	assert_int_equal(delta(before, after, "ops.put.errors"), 1);
	assert_int_equal(delta(before, after, "ops.get.requests"), 4);
	assert_int_equal(delta(before, after, "ops.get.hits"), 2);
	assert_int_equal(delta(before, after, "ops.errors.too_large"), 1);
	assert_int_equal(delta(before, after, "ops.get.misses"), 1);
	assert_int_equal(delta(before, after, "ops.exists.requests"), 1);
	assert_int_equal(delta(before, after, "ops.exists.hits"), 2);
	assert_int_equal(delta(before, after, "ops.exists.misses"), 1);
	assert_int_equal(delta(before, after, "ops.match.requests"), 1);
	assert_int_equal(delta(before, after, "ops.match.blocks_queried"), 4);
	assert_int_equal(delta(before, after, "ops.match.blocks_matched"), 3);
	assert_int_equal(delta(before, after, "ops.delete.requests"), 1);
	assert_int_equal(delta(before, after, "ops.delete.blocks"), 1);
	assert_int_equal(delta(before, after, "ops.ping.requests"), 1);
	assert_true(delta(before, after, "ops.stats.requests") >= 1);
	assert_int_equal(delta(before, after, "tiers.dram.blocks"), 2);
	assert_int_equal(delta(before, after, "blocks"), 2); /* DRAM only: the same */
	assert_int_equal(delta(before, after, "tiers.dram.payload_bytes"), 5000 + 4096);
	/* Payloads are 4 KiB aligned: 5000 B takes 8 KiB. */
	assert_int_equal(delta(before, after, "tiers.dram.used_bytes"), 8192 + 4096);
	assert_int_equal(harness_json_u64_or_fail(after, "tiers.dram.used_bytes") +
				 harness_json_u64_or_fail(after, "tiers.dram.free_bytes"),
			 harness_json_u64_or_fail(after, "tiers.dram.capacity_bytes"));
	json_object_put(before);
	json_object_put(after);

	/* STATS for one namespace: only it under "namespaces". */
	assert_int_equal(harness_stats(c, ns, &nsdoc), 0);
	assert_true(json_object_object_get_ex(nsdoc, "namespaces", &nss));
	assert_int_equal(json_object_object_length(nss), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "blocks"), 2);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "bytes"), 5000 + 4096);
	puts = harness_ns_stat_or_fail(c, ns, "puts");
	assert_true(puts >= 3 && puts <= 5);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "put_exists"), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "put_errors"), 1);
	/* blocks sent, as ops.get.hits: the TOO_LARGE answer is not a hit */
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "get_hits"), 2);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "get_misses"), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "exists_hits"), 2);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "exists_misses"), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "match_requests"), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "match_blocks_queried"), 4);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "match_blocks_matched"), 3);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "deletes"), 1);
	assert_int_equal(harness_ns_stat_or_fail(c, ns, "evictions"), 0);
	snprintf(path, sizeof(path), "namespaces.%s.match_hit_ratio", ns);
	assert_int_equal(harness_json_double(nsdoc, path, &ratio), 0);
	assert_true(ratio > 0.7499 && ratio < 0.7501);
	json_object_put(nsdoc);
	kvpool_close(c);
}

static void test_ping(void **state)
{
	uint64_t rtt_us = UINT64_MAX;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(kvpool_ping(g.c, &rtt_us), 0);
	assert_true(rtt_us < 1000000);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip_sizes),
		cmocka_unit_test(test_get_buffer_sizes),
		cmocka_unit_test(test_immutable),
		cmocka_unit_test(test_get_miss),
		cmocka_unit_test(test_no_parent),
		cmocka_unit_test(test_batch_chain_put),
		cmocka_unit_test(test_mixed_batches),
		cmocka_unit_test(test_exists_match),
		cmocka_unit_test(test_delete_descendants),
		cmocka_unit_test(test_drop_namespace),
		cmocka_unit_test(test_namespaces_isolate),
		cmocka_unit_test(test_scatter_gather),
		cmocka_unit_test(test_stats_counts),
		cmocka_unit_test(test_ping),
		/* Last: SIGTERM makes the server exit 0 while a client is connected. */
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_basic", tests, group_setup, group_teardown);
}
