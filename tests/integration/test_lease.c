/*
 * test_lease.c - MATCH with a lease, then GET, under eviction pressure in a
 * small arena (8 MiB, 1 MiB blocks): leased blocks are never evicted,
 * leases end on GET, on expiry and on disconnect (and return to exactly
 * 0), and a pool whose every block is leased answers FULL.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#define MIB (1u << 20)
#define ARENA_BLOCKS 8

static struct {
	struct harness_server srv;
	struct kvpool_client *a; /* namespace "lease-a": matches and gets */
	struct kvpool_client *b; /* namespace "lease-b": floods */
	uint8_t *buf;            /* one block */
} g;

static int group_setup(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "8MiB", "--max-block-bytes", "1MiB",
		"--max-inflight-put-bytes", "4MiB", "--max-lease-ms", "5000",
		"--threads", "2", "--log-level", "warn",
		/* these tests lease the whole arena from one connection on purpose */
		"--max-conn-leased-bytes", "8MiB", NULL,
	};

	(void)state;
	g.buf = malloc(MIB);
	if (!g.buf)
		return -1;
	if (harness_group_start(&g.srv, flags) ||
	    harness_group_client(&g.srv, "lease-a", &g.a) ||
	    harness_group_client(&g.srv, "lease-b", &g.b))
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.a);
	kvpool_close(g.b);
	harness_kill(&g.srv);
	free(g.buf);
	return 0;
}

/* Put a chain of n 1 MiB blocks whose content follows each key. */
static void put_chain(struct kvpool_client *c, const char *tag, uint64_t first, int n,
		      uint8_t (*keys)[32])
{
	for (int i = 0; i < n; i++) {
		int rc;

		harness_key(keys[i], tag, first + (uint64_t)i);
		harness_fill(g.buf, MIB, harness_key_seed(keys[i]));
		rc = kvpool_put_bytes(c, keys[i], i ? keys[i - 1] : NULL, g.buf, MIB);
		if (rc)
			fail_msg("put %s/%llu: %s", tag, (unsigned long long)(first + i),
				 kvpool_strerror(rc));
	}
}

/* B puts n blocks as chains of two. */
static void flood(const char *tag, int n)
{
	uint8_t keys[2][32];

	for (int i = 0; i < n; i += 2)
		put_chain(g.b, tag, (uint64_t)i, 2, keys);
}

/* Get the chain in one batch; every block must hit, byte-exact. */
static void assert_chain(struct kvpool_client *c, uint8_t (*keys)[32], int n)
{
	struct kvpool_get_block gb[8];
	struct iovec iov[8];
	uint8_t *bufs[8];
	int st[8];

	assert_true(n <= 8);
	for (int i = 0; i < n; i++) {
		bufs[i] = malloc(MIB);
		assert_non_null(bufs[i]);
		iov[i] = (struct iovec){ .iov_base = bufs[i], .iov_len = MIB };
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &iov[i], .iovcnt = 1 };
	}
	assert_int_equal(kvpool_get(c, gb, (size_t)n, st), 0);
	for (int i = 0; i < n; i++) {
		assert_int_equal(st[i], 0);
		assert_int_equal(gb[i].length, MIB);
		harness_fill(g.buf, MIB, harness_key_seed(keys[i]));
		assert_memory_equal(bufs[i], g.buf, MIB);
		free(bufs[i]);
	}
}

static void test_lease_survives_pressure(void **state)
{
	uint8_t keys[4][32];
	uint64_t ev0;
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	ev0 = harness_stat_or_fail(g.a, "evictions");
	put_chain(g.a, "lease-chain", 0, 4, keys);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])keys, 4, 5000, &matched), 0);
	assert_int_equal(matched, 4);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 4);

	/* 40 MiB through the 4 MiB that are not leased. */
	flood("lease-flood", 40);
	assert_true(harness_stat_or_fail(g.a, "evictions") - ev0 >= 36);
	assert_true(harness_ns_stat_or_fail(g.b, "lease-b", "evictions") >= 36);
	assert_int_equal(harness_ns_stat_or_fail(g.a, "lease-a", "evictions"), 0);

	/* A GET on another connection does not end A's lease. */
	{
		struct kvpool_client *other = NULL;

		assert_int_equal(harness_client(&g.srv, "lease-a", &other), 0);
		assert_chain(other, keys, 4);
		kvpool_close(other);
		assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 4);
	}
	assert_chain(g.a, keys, 4);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 1000), 0);
}

/* Without a GET the lease runs out by itself; then the blocks are fair game. */
static void test_lease_expires(void **state)
{
	uint8_t keys[2][32];
	size_t matched = 0;
	uint64_t t0, elapsed;

	(void)state;
	harness_need_server(&g.srv);
	put_chain(g.a, "lease-expiry", 0, 2, keys);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])keys, 2, 400, &matched), 0);
	t0 = harness_now_ms();
	assert_int_equal(matched, 2);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 2);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 3000), 0);
	elapsed = harness_now_ms() - t0;
	assert_true(elapsed >= 300);

	flood("lease-flood-2", 12);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])keys, 2, 0, &matched), 0);
	assert_int_equal(matched, 0);
}

/* A lease belongs to its connection: closing it ends the lease. The
 * server caps lease_ms at max_lease_ms and says so in the reply. */
static void test_lease_ends_on_close(void **state)
{
	uint8_t keys[2][32], body[PROTO_BATCH_PREFIX_BYTES + 2 * PROTO_KEY_ENTRY_BYTES];
	struct kvpool_client *c = NULL;
	struct harness_frame f;
	uint32_t matched32 = 0, lease_ms = 0;
	size_t matched = 0;
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "lease-a", &c), 0);
	put_chain(c, "lease-close", 0, 2, keys);
	assert_int_equal(kvpool_match(c, (const uint8_t(*)[32])keys, 2, 5000, &matched), 0);
	assert_int_equal(matched, 2);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 2);
	kvpool_close(c);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 2000), 0);

	fd = harness_raw_session_or_fail(g.srv.port, "lease-a", NULL);
	proto_batch_encode_prefix(body, 2, 60000);
	proto_key_entry_encode(body, 0, keys[0]);
	proto_key_entry_encode(body, 1, keys[1]);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_MATCH, 3, body, sizeof(body), NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(proto_match_reply_decode(f.body, f.h.body_bytes, &matched32, &lease_ms), 0);
	harness_frame_free(&f);
	assert_int_equal(matched32, 2);
	assert_int_equal(lease_ms, 5000);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 2);
	close(fd);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 2000), 0);
}

/* DELETE and DROP_NAMESPACE remove leased blocks too, and their lease
 * pins go with them. */
static void test_delete_leased(void **state)
{
	uint8_t keys[3][32];
	size_t matched = 0;
	uint64_t dropped = 0;
	int st[3];

	(void)state;
	harness_need_server(&g.srv);
	put_chain(g.a, "lease-del", 0, 3, keys);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])keys, 3, 5000, &matched), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 3);
	/* Deleting the middle block removes it and its child. */
	assert_int_equal(kvpool_delete(g.a, (const uint8_t(*)[32])keys[1], 1, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(kvpool_exists(g.a, (const uint8_t(*)[32])keys, 3, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -ENOENT);
	assert_int_equal(st[2], -ENOENT);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 1, 1000), 1);
	/* Dropping the namespace removes the last leased one. */
	assert_int_equal(kvpool_drop_namespace(g.b, "lease-a", &dropped), 0);
	assert_true(dropped >= 1);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 1000), 0);
	assert_int_equal(harness_ns_stat_or_fail(g.a, "lease-a", "blocks"), 0);
	/* A's GET of the dropped blocks misses cleanly. */
	{
		uint64_t len = 0;

		assert_int_equal(kvpool_get_bytes(g.a, keys[0], g.buf, MIB, &len), -ENOENT);
	}
}

/* Every block leased: a PUT gets FULL (-ENOSPC), not a silent drop. */
static void test_full_when_all_leased(void **state)
{
	uint8_t c1[4][32], c2[4][32], extra[32];
	uint64_t full0, cap;
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(kvpool_drop_namespace(g.a, "lease-a", NULL), 0);
	assert_int_equal(kvpool_drop_namespace(g.a, "lease-b", NULL), 0);
	assert_int_equal(harness_stat_or_fail(g.a, "tiers.dram.used_bytes"), 0);
	cap = harness_stat_or_fail(g.a, "tiers.dram.capacity_bytes");
	assert_int_equal(cap, ARENA_BLOCKS * MIB);

	put_chain(g.a, "full-1", 0, 4, c1);
	put_chain(g.a, "full-2", 0, 4, c2);
	assert_int_equal(harness_stat_or_fail(g.a, "tiers.dram.used_bytes"), cap);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])c1, 4, 5000, &matched), 0);
	assert_int_equal(matched, 4);
	assert_int_equal(kvpool_match(g.a, (const uint8_t(*)[32])c2, 4, 5000, &matched), 0);
	assert_int_equal(matched, 4);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 8);

	full0 = harness_stat_or_fail(g.a, "ops.errors.full");
	harness_key(extra, "full-extra", 0);
	harness_fill(g.buf, MIB, 1);
	assert_int_equal(kvpool_put_bytes(g.b, extra, NULL, g.buf, MIB), -ENOSPC);
	assert_int_equal(kvpool_put_bytes(g.b, extra, NULL, g.buf, 4096), -ENOSPC);
	assert_int_equal(harness_stat_or_fail(g.a, "ops.errors.full") - full0, 2);
	harness_check_absent_or_fail(g.b, extra);

	/* Getting chain 1 ends its leases: now there is room again. */
	assert_chain(g.a, c1, 4);
	assert_int_equal(harness_stat_or_fail(g.a, "leases_active"), 4);
	assert_int_equal(kvpool_put_bytes(g.b, extra, NULL, g.buf, MIB), 0);
	assert_chain(g.a, c2, 4);
	assert_int_equal(harness_wait_stat_or_fail(g.a, "leases_active", 0, 1000), 0);
}

/* Issue 20 item 5: with the default bound (a quarter of the 8 MiB arena
 * per connection) a connection that leases its own blocks over and over
 * gets no lease past 2 MiB, and another connection's puts still find room.
 * Issue 28 item 2: such a MATCH is not refused any more (QUOTA lost the
 * whole prefix): it answers the longest leading run whose lease fits. */
static void test_lease_bound_default(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "8MiB", "--max-block-bytes", "1MiB",
		"--max-inflight-put-bytes", "4MiB", "--max-lease-ms", "60000",
		"--threads", "2", "--log-level", "warn", NULL,
	};
	struct harness_server srv = { 0 };
	struct kvpool_client *hog = NULL, *other = NULL;
	uint8_t c1[4][32], c2[2][32], more[8][32];
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(harness_client(&srv, "hog", &hog), 0);
	assert_int_equal(harness_client(&srv, "other", &other), 0);
	put_chain(hog, "hog-1", 0, 4, c1);
	put_chain(hog, "hog-2", 0, 2, c2);
	assert_int_equal(kvpool_match(hog, (const uint8_t(*)[32])c1, 2, 60000, &matched), 0);
	assert_int_equal(matched, 2);
	/* the same two again extend; two more would pass 2 MiB */
	assert_int_equal(kvpool_match(hog, (const uint8_t(*)[32])c1, 2, 60000, &matched), 0);
	assert_int_equal(kvpool_match(hog, (const uint8_t(*)[32])c1, 4, 60000, &matched), 0);
	assert_int_equal(matched, 2); /* cut to what fits */
	assert_int_equal(kvpool_match(hog, (const uint8_t(*)[32])c2, 1, 60000, &matched), 0);
	assert_int_equal(matched, 0); /* not even one more block fits */
	assert_int_equal(harness_stat_or_fail(hog, "leases_active"), 2);
	/* without a lease the match works */
	assert_int_equal(kvpool_match(hog, (const uint8_t(*)[32])c1, 4, 0, &matched), 0);
	assert_int_equal(matched, 4);
	/* another connection fills the arena (chains of two): all but the 2
	 * leased blocks make room */
	for (int i = 0; i < 3; i++)
		put_chain(other, "other", (uint64_t)(2 * i), 2, more + 2 * i);
	assert_chain(hog, c1, 2);
	/* another connection may lease its own 2 MiB */
	assert_int_equal(kvpool_match(other, (const uint8_t(*)[32])more + 4, 2, 60000, &matched),
			 0);
	assert_int_equal(matched, 2);
	kvpool_close(hog);
	kvpool_close(other);
	assert_int_equal(harness_stop(&srv), 0);
}

/* Issue 28 item 2: a chain whose lease would pass max_conn_leased_bytes is
 * answered with the longest leading run whose lease fits, leased, instead
 * of QUOTA for the whole prefix (the bundled trace's replay stopped at
 * request 2,205 on such a chain). */
static void test_long_chain_lease_cut(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
		"--max-lease-ms", "60000", "--max-conn-leased-bytes", "3MiB",
		"--threads", "2", "--log-level", "warn", NULL,
	};
	struct harness_server srv = { 0 };
	struct kvpool_client *c = NULL;
	uint8_t chain[8][32];
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(harness_client(&srv, "long", &c), 0);
	put_chain(c, "long", 0, 8, chain); /* 8 x 1 MiB: its lease would be 8 MiB */
	assert_int_equal(kvpool_match(c, (const uint8_t(*)[32])chain, 8, 60000, &matched), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(harness_stat_or_fail(c, "leases_active"), 3);
	assert_chain(c, chain, 3); /* the leased run is there, whole */
	assert_int_equal(harness_wait_stat_or_fail(c, "leases_active", 0, 1000), 0);
	/* the leases ended with the GETs: the whole bound is free again; in
	 * protocol v2 the reply says the lease was cut and what is there */
	{
		struct kvpool_match_opts o = { .lease_ms = 60000 };
		struct kvpool_match_result r;

		assert_int_equal(kvpool_match_ex(c, chain, 8, &o, &r), 0);
		assert_int_equal(r.matched, 3);
		assert_int_equal(r.present, 8);
		assert_true(r.flags & KVPOOL_MATCH_LEASE_CUT);
		assert_int_equal(r.lease_ms, 60000);
		/* without a lease nothing is cut */
		o.lease_ms = 0;
		assert_int_equal(kvpool_match_ex(c, chain, 8, &o, &r), 0);
		assert_int_equal(r.matched, 8);
		assert_int_equal(r.flags & KVPOOL_MATCH_LEASE_CUT, 0);
	}
	kvpool_close(c);
	assert_int_equal(harness_stop(&srv), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lease_survives_pressure),
		cmocka_unit_test(test_lease_expires),
		cmocka_unit_test(test_lease_ends_on_close),
		cmocka_unit_test(test_delete_leased),
		cmocka_unit_test(test_full_when_all_leased),
		cmocka_unit_test(test_lease_bound_default),
		cmocka_unit_test(test_long_chain_lease_cut),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_lease", tests, group_setup, group_teardown);
}
