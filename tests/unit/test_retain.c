/*
 * test_retain.c - retention in the pool (storage/retain.c): a retained
 * chain survives a flood that evicts everything else, expires back into
 * an ordinary chain, stays within its budget (leading blocks first), is
 * bounded per tenant, is refreshed by MATCH and by a PUT of a stored
 * key, goes with DELETE and namespace drops, coexists with leases, and
 * (with an NVMe tier) keeps its deadline through a warm restart. Every
 * test runs store_check, which verifies the retention invariants too.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "store.h"
#include "debug/store_debug.h"
#include "store_fixture.h"

#define PAGE STORE_PAGE_BYTES
#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define BLOCK (16 * KIB) /* every block of these tests: 4 pages */

/* ---- helpers ---- */

static void fill(void *dst, uint64_t len, const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t *p = dst;
	uint64_t seed;

	memcpy(&seed, key, 8);
	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)mix64(seed + i / 8) ^ (uint8_t)i;
}

/* The pool of these tests: dram bytes of arena, retention up to
 * max_retain_ms, max_retained_bytes per namespace (or new tenant). */
static struct store *open_pool(uint64_t dram, uint32_t max_retain_ms, uint64_t max_retained)
{
	struct store_config cfg = {
		.dram_capacity_bytes = dram,
		.max_block_bytes = 64 * KIB,
		.max_lease_ms = 5000,
		.max_retain_ms = max_retain_ms,
		.max_retained_bytes = max_retained,
	};
	struct store *s = NULL;

	store_fixture_open(&cfg, &s, NULL, NULL);
	return s;
}

static uint32_t ns_of(struct store *s, const char *name)
{
	uint32_t id = 0;

	assert_int_equal(store_namespace_id(s, name, strlen(name), &id), 0);
	return id;
}

/* Put block id (parent_id 0: a first block) with retain_ms, retrying
 * while an NVMe tier's demoter makes room (-EAGAIN). Returns the rc;
 * *res (may be NULL) receives the retention outcome. */
static int put_ret(struct store *s, uint32_t ns, uint64_t id, uint64_t parent_id,
		   uint32_t retain_ms, struct store_retain_res *res)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	uint8_t *buf = malloc(BLOCK);
	struct store_block *b;
	uint64_t sum;
	void *dst;
	int rc;

	assert_non_null(buf);
	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	fill(buf, BLOCK, key);
	sum = XXH3_64bits(buf, BLOCK);
	for (int tries = 0;; tries++) {
		rc = store_put_begin(s, ns, key, parent_id ? parent : NULL, 0, BLOCK, sum, &b, &dst);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc == -EEXIST && retain_ms) /* as the server does: the refresh */
		rc = store_put_retain(s, ns, key, retain_ms, res) ?: -EEXIST;
	if (rc == 0) {
		memcpy(dst, buf, BLOCK);
		rc = store_put_commit_retain(s, b, &sum, retain_ms, res);
	}
	free(buf);
	return rc;
}

/* Chain ids first..first+n-1, each the child of the one before. Asserts
 * each put succeeds; res[i] (res may be NULL) gets block i's outcome. */
static void put_chain(struct store *s, uint32_t ns, uint64_t first, uint32_t n,
		      uint32_t retain_ms, struct store_retain_res *res)
{
	for (uint32_t i = 0; i < n; i++) {
		struct store_retain_res r;
		int rc = put_ret(s, ns, first + i, i ? first + i - 1 : 0, retain_ms, &r);

		assert_true(rc == 0 || rc == -EEXIST);
		if (res)
			res[i] = r;
	}
}

/* Leading blocks of chain first.. (n long) that the pool holds. */
static uint32_t present(struct store *s, uint32_t ns, uint64_t first, uint32_t n)
{
	uint8_t (*keys)[STORE_KEY_BYTES] = malloc(n * sizeof(*keys));
	uint32_t matched = 0;

	assert_non_null(keys);
	for (uint32_t i = 0; i < n; i++)
		key_of(first + i, keys[i]);
	assert_int_equal(store_match(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, n, 0, NULL,
				     &matched, NULL), 0);
	free(keys);
	return matched;
}

/* Chains of 8 blocks of one-off ids from *next, bytes in all, never
 * retained: the flood. A put the pool refuses as FULL counts in *full. */
static void flood(struct store *s, uint32_t ns, uint64_t *next, uint64_t bytes, uint64_t *full)
{
	for (uint64_t done = 0; done < bytes; done += 8 * BLOCK) {
		for (uint32_t i = 0; i < 8; i++) {
			int rc = put_ret(s, ns, *next + i, i ? *next + i - 1 : 0, 0, NULL);

			if (rc == -ENOSPC && full)
				(*full)++;
			else
				assert_true(rc == 0 || rc == -ENOLINK);
		}
		*next += 8;
	}
}

static struct store_ns_stats ns_stats(struct store *s, uint32_t ns_id)
{
	struct store_ns_stats st;

	for (uint32_t i = 0; store_ns_stats(s, i, &st) == 0; i++)
		if (st.ns_id == ns_id)
			return st;
	fail_msg("namespace %u not listed", ns_id);
	return st;
}

static uint64_t left_ms(struct store *s, uint32_t ns, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];
	uint64_t ms = 0;

	key_of(id, key);
	assert_int_equal(store_debug_retained_ms(s, ns, key, &ms), 0);
	return ms;
}

/* ---- survival and expiry ---- */

/* A retained chain survives 20x DRAM of unretained chains; the same
 * chain put without a retention does not. */
static void test_survives_flood(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram / 4);
	uint32_t ns = ns_of(s, "m"), other = ns_of(s, "plain");
	struct store_retain_res res[16];

	(void)state;
	put_chain(s, ns, 1, 16, 60000, res);
	for (int i = 0; i < 16; i++) {
		assert_int_equal(res[i].flags, STORE_PUT_RETAINED);
		assert_int_equal(res[i].retain_ms, 60000);
	}
	put_chain(s, other, 100, 16, 0, res);
	assert_int_equal(res[0].flags, 0);
	assert_int_equal(res[0].retain_ms, 0);
	assert_int_equal(stats_of(s).retained_blocks, 16);
	assert_int_equal(stats_of(s).retained_bytes, 16 * BLOCK);
	flood(s, other, &next, 20 * dram, NULL);
	assert_check(s);
	assert_int_equal(present(s, ns, 1, 16), 16);
	assert_int_equal(present(s, other, 100, 16), 0);
	assert_true(stats_of(s).evictions > 0);
	assert_int_equal(ns_stats(s, ns).retained_blocks, 16);
	assert_int_equal(ns_stats(s, ns).evictions, 0);
	store_close(s);
}

/* After retain_ms the chain is ordinary again and a flood takes it. */
static void test_expires(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram / 4);
	uint32_t ns = ns_of(s, "m");

	(void)state;
	put_chain(s, ns, 1, 8, 150, NULL);
	assert_true(left_ms(s, ns, 8) > 0);
	flood(s, ns, &next, 4 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 8), 8); /* still retained */
	sleep_ms(200);
	assert_int_equal(store_tick(s), 0); /* no lease ended; the retentions did */
	assert_int_equal(stats_of(s).retained_blocks, 0);
	assert_int_equal(ns_stats(s, ns).retain_expired, 8);
	assert_int_equal(stats_of(s).retain_expired, 8);
	assert_int_equal(left_ms(s, ns, 8), 0);
	flood(s, ns, &next, 4 * dram, NULL);
	assert_check(s);
	assert_int_equal(present(s, ns, 1, 8), 0);
	store_close(s);
}

/* An eviction pass ends retentions that ran out even without a tick. */
static void test_expiry_without_tick(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram);
	uint32_t ns = ns_of(s, "m");
	uint64_t full = 0;

	(void)state;
	/* retain (nearly) all of DRAM: a flood then finds nothing to evict */
	put_chain(s, ns, 1, (uint32_t)(dram / BLOCK) - 2, 100, NULL);
	flood(s, ns, &next, 8 * BLOCK, &full);
	assert_true(full > 0);
	sleep_ms(150);
	full = 0;
	flood(s, ns, &next, 2 * dram, &full);
	assert_int_equal(full, 0);
	assert_check(s);
	store_close(s);
}

/* Only retained blocks left: a put gets FULL, no retention is broken. */
static void test_full_rather_than_break(void **state)
{
	uint64_t dram = 1 * MIB, next = 1000000, full = 0;
	struct store *s = open_pool(dram, 60000, dram);
	uint32_t ns = ns_of(s, "m");
	uint32_t n = (uint32_t)(dram / BLOCK);

	(void)state;
	put_chain(s, ns, 1, n, 60000, NULL);
	assert_int_equal(stats_of(s).retained_blocks, n);
	flood(s, ns, &next, 4 * BLOCK, &full);
	assert_true(full >= 1);
	assert_int_equal(present(s, ns, 1, n), n);
	assert_check(s);
	store_close(s);
}

/* ---- no holes ---- */

/* Retaining a tail retains its stored ancestors at least as long; a
 * shorter retention of an ancestor never shortens it. */
static void test_no_holes(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram / 4);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	struct store_retain_res r;

	(void)state;
	put_chain(s, ns, 1, 8, 0, NULL);
	key_of(8, key);
	assert_int_equal(store_put_retain(s, ns, key, 30000, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAINED);
	assert_int_equal(stats_of(s).retained_blocks, 8);
	for (uint64_t id = 1; id <= 8; id++)
		assert_true(left_ms(s, ns, id) > 29000);
	key_of(3, key);
	assert_int_equal(store_put_retain(s, ns, key, 1000, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAINED);
	assert_true(left_ms(s, ns, 3) > 29000); /* not shortened */
	/* a longer one on a middle block extends it and its ancestors only */
	key_of(4, key);
	assert_int_equal(store_put_retain(s, ns, key, 50000, NULL), 0);
	assert_true(left_ms(s, ns, 1) > 49000);
	assert_true(left_ms(s, ns, 4) > 49000);
	assert_true(left_ms(s, ns, 5) < 31000);
	assert_check(s);
	flood(s, ns, &next, 10 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 8), 8);
	assert_check(s);
	store_close(s);
}

/* ---- budgets ---- */

/* A chain past max_retained_bytes: the leading blocks within the budget
 * are retained, the others stored without it and reported. */
static void test_budget_leading_first(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, 5 * BLOCK);
	uint32_t ns = ns_of(s, "m");
	struct store_retain_res res[8];
	struct store_ns_stats st;

	(void)state;
	put_chain(s, ns, 1, 8, 60000, res);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(res[i].flags, i < 5 ? STORE_PUT_RETAINED : STORE_PUT_RETAIN_BUDGET);
		assert_int_equal(res[i].retain_ms, i < 5 ? 60000 : 0);
	}
	st = ns_stats(s, ns);
	assert_int_equal(st.retained_blocks, 5);
	assert_int_equal(st.retained_bytes, 5 * BLOCK);
	assert_int_equal(st.retain_budget_bytes, 5 * BLOCK);
	assert_int_equal(st.retain_refused, 3);
	assert_int_equal(st.retain_tenant, 0);
	assert_int_equal(stats_of(s).retain_refused, 3);
	flood(s, ns, &next, 10 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 8), 5);
	/* extending what is retained costs nothing, even at the budget */
	put_chain(s, ns, 1, 5, 30000, res);
	assert_int_equal(res[4].flags, STORE_PUT_RETAINED);
	assert_check(s);
	store_close(s);
}

/* A budget of 0 refuses every retention; max_retain_ms 0 grants none. */
static void test_budget_zero_and_retention_off(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 0);
	uint32_t ns = ns_of(s, "m");
	struct store_retain_res r;

	(void)state;
	assert_int_equal(put_ret(s, ns, 1, 0, 1000, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAIN_BUDGET);
	assert_int_equal(r.retain_ms, 0);
	store_close(s);
	s = open_pool(2 * MIB, 0, 2 * MIB);
	ns = ns_of(s, "m");
	assert_int_equal(put_ret(s, ns, 1, 0, 1000, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAIN_CLAMPED);
	assert_int_equal(r.retain_ms, 0);
	assert_int_equal(stats_of(s).retained_blocks, 0);
	store_close(s);
}

/* Huge retain_ms (a negative number through a u32) is cut to the cap. */
static void test_clamped(void **state)
{
	struct store *s = open_pool(2 * MIB, 5000, 2 * MIB);
	uint32_t ns = ns_of(s, "m");
	struct store_retain_res r;

	(void)state;
	assert_int_equal(put_ret(s, ns, 1, 0, UINT32_MAX, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAINED | STORE_PUT_RETAIN_CLAMPED);
	assert_int_equal(r.retain_ms, 5000);
	assert_true(left_ms(s, ns, 1) <= 5000);
	assert_int_equal(put_ret(s, ns, 2, 1, 4000, &r), 0);
	assert_int_equal(r.flags, STORE_PUT_RETAINED);
	assert_int_equal(r.retain_ms, 4000);
	store_close(s);
}

/* Per tenant: two namespaces of one tenant share its budget; a second
 * tenant's retained blocks survive the first's flood and retentions. */
static void test_tenants(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000, full = 0;
	struct store *s = open_pool(dram, 60000, dram / 4);
	struct store_tenant *t1 = store_tenant_new(s, 0, 0), *t2 = store_tenant_new(s, 0, 0);
	uint32_t a1 = ns_of(s, "t1/a"), a2 = ns_of(s, "t1/b"), b = ns_of(s, "t2/x");
	struct store_retain_res res[16];
	struct store_retain_stats rs;

	(void)state;
	assert_non_null(t1);
	assert_non_null(t2);
	store_tenant_retain_budget(s, t1, 6 * BLOCK);
	assert_int_equal(store_namespace_tenant(s, a1, t1), 0);
	assert_int_equal(store_namespace_tenant(s, a2, t1), 0);
	assert_int_equal(store_namespace_tenant(s, b, t2), 0);
	put_chain(s, b, 500, 8, 60000, res);
	assert_int_equal(res[7].flags, STORE_PUT_RETAINED); /* t2's budget: dram / 4 */
	put_chain(s, a1, 1, 4, 60000, res);
	put_chain(s, a2, 100, 4, 60000, res);
	/* the tenant's budget is shared: 4 + 2 fit */
	assert_int_equal(res[1].flags, STORE_PUT_RETAINED);
	assert_int_equal(res[2].flags, STORE_PUT_RETAIN_BUDGET);
	store_tenant_retain_stats(s, t1, &rs);
	assert_int_equal(rs.blocks, 6);
	assert_int_equal(rs.bytes, 6 * BLOCK);
	assert_int_equal(rs.budget_bytes, 6 * BLOCK);
	assert_int_equal(rs.refused, 2);
	assert_int_equal(ns_stats(s, a2).retain_budget_bytes, 6 * BLOCK);
	assert_int_equal(ns_stats(s, a2).retain_tenant, 1);
	/* t1 floods its own namespace with unretained chains */
	flood(s, a1, &next, 20 * dram, &full);
	assert_int_equal(full, 0);
	assert_int_equal(present(s, b, 500, 8), 8);
	assert_int_equal(present(s, a1, 1, 4), 4);
	assert_int_equal(present(s, a2, 100, 4), 2);
	store_tenant_retain_stats(s, t2, &rs);
	assert_int_equal(rs.blocks, 8);
	assert_check(s);
	store_close(s);
}

/* A namespace charged to a tenant after it retained: the tenant takes
 * over its figures. */
static void test_tenant_after(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	struct store_tenant *t = store_tenant_new(s, 0, 0);
	uint32_t ns = ns_of(s, "m");
	struct store_retain_stats rs;

	(void)state;
	put_chain(s, ns, 1, 3, 60000, NULL);
	assert_int_equal(store_namespace_tenant(s, ns, t), 0);
	store_tenant_retain_stats(s, t, &rs);
	assert_int_equal(rs.blocks, 3);
	assert_int_equal(rs.bytes, 3 * BLOCK);
	assert_check(s);
	store_close(s);
}

/* Retain the leading n blocks of chain first.. by MATCH on behalf of
 * tenant `by` for retain_ms; returns the result. */
static struct store_match_res match_retain(struct store *s, uint32_t ns, uint64_t first,
					   uint32_t n, uint32_t retain_ms, struct store_tenant *by)
{
	uint8_t (*keys)[STORE_KEY_BYTES] = malloc(n * sizeof(*keys));
	struct store_match_opts o = { .retain_ms = retain_ms, .retainer = by };
	struct store_match_res r;

	assert_non_null(keys);
	for (uint32_t i = 0; i < n; i++)
		key_of(first + i, keys[i]);
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, n, &o, &r),
			 0);
	free(keys);
	return r;
}

/* A retention is charged to the tenant that asks for it, not to the
 * namespace's tenant nor the blocks' writer: a reader retaining a
 * writer's blocks by MATCH spends its own budget (and is bounded by it),
 * the writer's stays whole; a tenant at its budget cannot retain in a
 * namespace another tenant created (PUT), on that tenant's budget. */
static void test_retainer_pays(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	struct store_tenant *w = store_tenant_new(s, 0, 0), *r = store_tenant_new(s, 0, 0);
	uint32_t ns = ns_of(s, "w/1"), shared = ns_of(s, "shared/y");
	struct store_retain_stats ws, rs;
	struct store_retain_res res[8];
	struct store_match_res m;

	(void)state;
	assert_non_null(w);
	assert_non_null(r);
	store_tenant_retain_budget(s, w, 4 * BLOCK);
	store_tenant_retain_budget(s, r, 2 * BLOCK);
	assert_int_equal(store_namespace_tenant(s, ns, w), 0);
	assert_int_equal(store_namespace_tenant(s, shared, r), 0);
	put_chain(s, ns, 1, 8, 0, NULL);
	/* the reader retains the writer's chain: 2 blocks on its budget */
	m = match_retain(s, ns, 1, 8, 60000, r);
	assert_int_equal(m.matched, 8);
	assert_int_equal(m.retained, 2);
	assert_int_equal(m.retain_ms, 60000);
	assert_int_equal(m.flags, STORE_MATCH_RETAIN_BUDGET);
	store_tenant_retain_stats(s, r, &rs);
	store_tenant_retain_stats(s, w, &ws);
	assert_int_equal(rs.bytes, 2 * BLOCK);
	assert_int_equal(rs.refused, 6); /* blocks 3..8 */
	assert_int_equal(ws.bytes, 0);
	assert_int_equal(ws.refused, 0);
	/* the writer's own retentions still have its whole budget: blocks
	 * 1-2 are retained longer already (free), 3-6 fit its 4 blocks */
	m = match_retain(s, ns, 1, 8, 50000, w);
	assert_int_equal(m.retained, 6);
	assert_int_equal(m.flags, STORE_MATCH_RETAIN_BUDGET);
	store_tenant_retain_stats(s, w, &ws);
	assert_int_equal(ws.bytes, 4 * BLOCK);
	store_tenant_retain_stats(s, r, &rs);
	assert_int_equal(rs.bytes, 2 * BLOCK);
	/* the writer, at its budget, PUTs in a namespace the reader created:
	 * refused, and the reader's budget is not spent for it */
	store_tenant_retain_budget(s, r, 8 * BLOCK);
	for (uint32_t i = 0; i < 2; i++) {
		uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
		uint8_t *buf = malloc(BLOCK);
		struct store_block *b;
		uint64_t sum;
		void *dst;

		assert_non_null(buf);
		key_of(900 + i, key);
		key_of(899 + i, parent);
		fill(buf, BLOCK, key);
		sum = XXH3_64bits(buf, BLOCK);
		assert_int_equal(store_put_begin(s, shared, key, i ? parent : NULL, 0, BLOCK, sum,
						 &b, &dst), 0);
		memcpy(dst, buf, BLOCK);
		assert_int_equal(store_put_commit_retain_by(s, b, &sum, 60000, w, &res[i]), 0);
		free(buf);
		assert_int_equal(res[i].flags, STORE_PUT_RETAIN_BUDGET);
		assert_int_equal(res[i].retain_ms, 0);
	}
	store_tenant_retain_stats(s, r, &rs);
	assert_int_equal(rs.bytes, 2 * BLOCK); /* unchanged */
	assert_int_equal(ns_stats(s, shared).retained_blocks, 0);
	/* a refresh of a stored key by the writer: also its own budget */
	{
		uint8_t key[STORE_KEY_BYTES];
		struct store_retain_res rr;

		key_of(900, key);
		assert_int_equal(store_put_retain_by(s, shared, key, 60000, w, &rr), 0);
		assert_int_equal(rr.flags, STORE_PUT_RETAIN_BUDGET);
		assert_int_equal(store_put_retain_by(s, shared, key, 60000, r, &rr), 0);
		assert_int_equal(rr.flags, STORE_PUT_RETAINED);
	}
	store_tenant_retain_stats(s, r, &rs);
	assert_int_equal(rs.bytes, 3 * BLOCK);
	assert_check(s);
	store_close(s);
}

/* A tenant that extends another's retention takes it over: the first
 * holder's budget is freed, the extender's spent; a shorter ask changes
 * neither. Expiry and DELETE uncharge the holder of the moment. */
static void test_retention_moves(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	struct store_tenant *a = store_tenant_new(s, 0, 0), *b = store_tenant_new(s, 0, 0);
	uint32_t ns = ns_of(s, "a/1");
	struct store_retain_stats as, bs;
	struct store_match_res m;
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	(void)state;
	assert_int_equal(store_namespace_tenant(s, ns, a), 0);
	put_chain(s, ns, 1, 4, 10000, NULL); /* a's (the namespace's tenant) */
	store_tenant_retain_stats(s, a, &as);
	assert_int_equal(as.bytes, 4 * BLOCK);
	m = match_retain(s, ns, 1, 4, 5000, b); /* shorter: a keeps it, b pays nothing */
	assert_int_equal(m.retained, 4);
	store_tenant_retain_stats(s, b, &bs);
	assert_int_equal(bs.bytes, 0);
	m = match_retain(s, ns, 1, 2, 30000, b); /* longer, on the first 2: they move */
	assert_int_equal(m.retained, 2);
	store_tenant_retain_stats(s, a, &as);
	store_tenant_retain_stats(s, b, &bs);
	assert_int_equal(as.bytes, 2 * BLOCK);
	assert_int_equal(bs.bytes, 2 * BLOCK);
	assert_check(s);
	/* b's budget cut to 3 blocks: it takes over a's 3rd block, not the 4th */
	store_tenant_retain_budget(s, b, 3 * BLOCK);
	m = match_retain(s, ns, 1, 4, 40000, b);
	assert_int_equal(m.retained, 3); /* 2 extended free, the 3rd moves; the 4th is refused */
	assert_int_equal(m.flags, STORE_MATCH_RETAIN_BUDGET);
	store_tenant_retain_stats(s, a, &as);
	store_tenant_retain_stats(s, b, &bs);
	assert_int_equal(as.bytes, 1 * BLOCK);
	assert_int_equal(bs.bytes, 3 * BLOCK);
	/* DELETE of block 2 (and its descendants) uncharges b for 2, a for 1 */
	key_of(2, key);
	assert_int_equal(store_delete(s, ns, key, &removed), 0);
	assert_int_equal(removed, 3);
	store_tenant_retain_stats(s, a, &as);
	store_tenant_retain_stats(s, b, &bs);
	assert_int_equal(as.bytes, 0);
	assert_int_equal(bs.bytes, 1 * BLOCK);
	assert_check(s);
	store_close(s);
}

/* max_retained_total_bytes bounds the pool, whoever asks: two
 * namespaces whose own budgets would take the whole pool share it, and
 * ordinary blocks keep the rest of DRAM. */
static void test_pool_wide_cap(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000, full = 0;
	struct store_config cfg = {
		.dram_capacity_bytes = dram,
		.max_block_bytes = 64 * KIB,
		.max_lease_ms = 5000,
		.max_retain_ms = 60000,
		.max_retained_bytes = dram, /* each namespace alone could take the pool */
		.max_retained_total_bytes = dram / 2,
	};
	struct store *s = NULL;
	uint32_t n1, n2, n3;
	struct store_retain_res res[64];
	uint32_t granted = 0;

	(void)state;
	store_fixture_open(&cfg, &s, NULL, NULL);
	n1 = ns_of(s, "one");
	n2 = ns_of(s, "two");
	n3 = ns_of(s, "plain");
	put_chain(s, n1, 1, 40, 60000, res);
	for (int i = 0; i < 40; i++)
		granted += res[i].flags == STORE_PUT_RETAINED;
	assert_int_equal(granted, 40);
	put_chain(s, n2, 100, 40, 60000, res);
	assert_int_equal(res[23].flags, STORE_PUT_RETAINED); /* 64 blocks = 1 MiB */
	assert_int_equal(res[24].flags, STORE_PUT_RETAIN_BUDGET);
	assert_int_equal(stats_of(s).retained_bytes, dram / 2);
	assert_int_equal(ns_stats(s, n2).retain_refused, 16);
	/* ordinary traffic still finds room */
	flood(s, n3, &next, 10 * dram, &full);
	assert_int_equal(full, 0);
	assert_int_equal(present(s, n1, 1, 40), 40);
	assert_check(s);
	store_close(s);
}

/* ---- refresh: MATCH and a PUT of a stored key ---- */

static void test_match_refresh(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram / 4);
	uint32_t ns = ns_of(s, "m");
	uint8_t keys[10][STORE_KEY_BYTES];
	struct store_match_opts o = { .retain_ms = 2000 };
	struct store_match_res r;

	(void)state;
	put_chain(s, ns, 1, 8, 200, NULL);
	for (int i = 0; i < 10; i++)
		key_of((uint64_t)i + 1, keys[i]);
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 10, &o,
					&r), 0);
	assert_int_equal(r.matched, 8);
	assert_int_equal(r.present, 8);
	assert_int_equal(r.retained, 8);
	assert_int_equal(r.retain_ms, 2000);
	assert_int_equal(r.flags, 0);
	sleep_ms(300); /* the put's 200 ms are over, the refresh's are not */
	assert_int_equal(store_tick(s), 0);
	assert_int_equal(stats_of(s).retained_blocks, 8);
	flood(s, ns, &next, 10 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 8), 8);
	/* clamped */
	o.retain_ms = 999999;
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 8, &o,
					&r), 0);
	assert_int_equal(r.flags, STORE_MATCH_RETAIN_CLAMPED);
	assert_int_equal(r.retain_ms, 60000);
	assert_int_equal(r.retained, 8);
	/* without retain_ms: nothing retained, nothing said */
	o.retain_ms = 0;
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 8, &o,
					&r), 0);
	assert_int_equal(r.retained, 0);
	assert_int_equal(r.retain_ms, 0);
	assert_int_equal(r.flags, 0);
	assert_check(s);
	store_close(s);
}

/* MATCH past the budget: leading blocks first, the rest refused. */
static void test_match_budget(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 3 * BLOCK);
	uint32_t ns = ns_of(s, "m");
	uint8_t keys[6][STORE_KEY_BYTES];
	struct store_match_opts o = { .retain_ms = 5000 };
	struct store_match_res r;

	(void)state;
	put_chain(s, ns, 1, 6, 0, NULL);
	for (int i = 0; i < 6; i++)
		key_of((uint64_t)i + 1, keys[i]);
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 6, &o,
					&r), 0);
	assert_int_equal(r.matched, 6);
	assert_int_equal(r.retained, 3);
	assert_int_equal(r.flags, STORE_MATCH_RETAIN_BUDGET);
	assert_int_equal(r.retain_ms, 5000);
	assert_int_equal(ns_stats(s, ns).retain_refused, 3);
	assert_true(left_ms(s, ns, 3) > 0);
	assert_int_equal(left_ms(s, ns, 4), 0);
	assert_check(s);
	store_close(s);
}

/* A PUT of a stored key with retain_ms extends the retention. */
static void test_put_exists_extends(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	uint32_t ns = ns_of(s, "m");
	struct store_retain_res r;

	(void)state;
	put_chain(s, ns, 1, 4, 100, NULL);
	assert_int_equal(put_ret(s, ns, 4, 3, 20000, &r), -EEXIST);
	assert_int_equal(r.flags, STORE_PUT_RETAINED);
	assert_int_equal(r.retain_ms, 20000);
	assert_true(left_ms(s, ns, 1) > 19000);
	assert_true(left_ms(s, ns, 4) > 19000);
	assert_check(s);
	store_close(s);
}

/* ---- leases, DELETE, drop ---- */

static void test_lease_and_retention(void **state)
{
	uint64_t dram = 2 * MIB, next = 1000000;
	struct store *s = open_pool(dram, 60000, dram / 4);
	uint32_t ns = ns_of(s, "m");
	struct store_lessee *l = store_lessee_new(s);
	uint8_t keys[4][STORE_KEY_BYTES];
	struct store_match_opts o = { .lease_ms = 1000, .retain_ms = 300, .lessee = l };
	struct store_match_res r;

	(void)state;
	assert_non_null(l);
	put_chain(s, ns, 1, 4, 0, NULL);
	for (int i = 0; i < 4; i++)
		key_of((uint64_t)i + 1, keys[i]);
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 4, &o,
					&r), 0);
	assert_int_equal(r.matched, 4);
	assert_int_equal(r.lease_ms, 1000);
	assert_int_equal(r.retained, 4);
	assert_int_equal(stats_of(s).leases_active, 4);
	/* the lease ends; the retention keeps them */
	store_lessee_free(s, l);
	assert_int_equal(stats_of(s).leases_active, 0);
	flood(s, ns, &next, 5 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 4), 4);
	/* the retention ends; nothing keeps them */
	sleep_ms(350);
	flood(s, ns, &next, 5 * dram, NULL);
	assert_int_equal(present(s, ns, 1, 4), 0);
	assert_check(s);
	store_close(s);
}

static void test_delete_and_drop(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0, blocks = 0;

	(void)state;
	put_chain(s, ns, 1, 6, 60000, NULL);
	key_of(3, key);
	assert_int_equal(store_delete(s, ns, key, &removed), 0);
	assert_int_equal(removed, 4);
	assert_int_equal(stats_of(s).retained_blocks, 2);
	assert_int_equal(ns_stats(s, ns).retained_bytes, 2 * BLOCK);
	assert_check(s);
	put_chain(s, ns, 10, 5, 60000, NULL);
	assert_int_equal(store_drop_namespace(s, ns, &blocks, NULL), 0);
	assert_int_equal(blocks, 7);
	assert_int_equal(stats_of(s).retained_blocks, 0);
	assert_int_equal(stats_of(s).retained_bytes, 0);
	assert_int_equal(ns_stats(s, ns).retained_blocks, 0);
	/* no expiry is counted for them, and the budget is free again */
	assert_int_equal(ns_stats(s, ns).retain_expired, 0);
	put_chain(s, ns, 20, 3, 60000, NULL);
	assert_int_equal(stats_of(s).retained_blocks, 3);
	assert_check(s);
	store_close(s);
}

/* A namespace quota never evicts a retained block. */
static void test_quota_spares_retained(void **state)
{
	struct store *s = open_pool(2 * MIB, 60000, 2 * MIB);
	uint32_t ns = ns_of(s, "m");
	uint64_t next = 1000000;

	(void)state;
	assert_int_equal(store_namespace_quota(s, ns, 16 * BLOCK), 0);
	put_chain(s, ns, 1, 4, 60000, NULL);
	for (int i = 0; i < 20; i++) {
		int rc = put_ret(s, ns, next, 0, 0, NULL);

		assert_int_equal(rc, 0);
		next++;
	}
	assert_int_equal(present(s, ns, 1, 4), 4);
	assert_check(s);
	store_close(s);
}

/* Random puts, retentions, matches, deletes and expiries, checked after
 * each step (the invariants include the retention records). */
static void test_random_ops(void **state)
{
	struct store *s = open_pool(1 * MIB, 400, 20 * BLOCK);
	uint32_t ns = ns_of(s, "m");
	uint64_t rnd = 42;

	(void)state;
	for (int step = 0; step < 3000; step++) {
		uint64_t x = mix64(rnd++), id = 1 + x % 300, parent = (x >> 16) % 4 ? id - 1 : 0;
		uint32_t op = (uint32_t)(x >> 32) % 10, ms = (uint32_t)(x >> 40) % 500;
		uint8_t key[STORE_KEY_BYTES];

		key_of(id, key);
		if (op < 5) {
			(void)put_ret(s, ns, id, parent == 0 || id == 1 ? 0 : parent, op < 3 ? ms : 0,
				      NULL);
		} else if (op < 7) {
			(void)store_put_retain(s, ns, key, ms, NULL);
		} else if (op == 7) {
			(void)store_delete(s, ns, key, NULL);
		} else if (op == 8) {
			(void)store_tick(s);
		} else {
			uint8_t keys[4][STORE_KEY_BYTES];
			struct store_match_opts o = { .retain_ms = ms };
			struct store_match_res r;

			for (int i = 0; i < 4; i++)
				key_of(id + (uint64_t)i, keys[i]);
			assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys,
							4, &o, &r), 0);
		}
		if (step % 50 == 0)
			sleep_ms(2);
		assert_check(s);
	}
	assert_true(ns_stats(s, ns).retain_refused > 0 || ns_stats(s, ns).retain_expired > 0);
	store_close(s);
}

/* ---- NVMe tier ---- */

/* A pool with a 2 MiB arena and an NVMe tier of 1 MiB segments. */
static struct store *open_nvme(const char *dir, uint64_t nvme_bytes, uint32_t max_retain_ms)
{
	struct store_config cfg = {
		.dram_capacity_bytes = 2 * MIB,
		.max_block_bytes = 64 * KIB,
		.max_lease_ms = 5000,
		.max_retain_ms = max_retain_ms,
		.max_retained_bytes = 2 * MIB,
		.nvme_dir = dir,
		.nvme_capacity_bytes = nvme_bytes,
		.nvme_segment_bytes = MIB,
		.nvme_io_threads = 2,
	};
	struct store *s = NULL;

	store_fixture_open(&cfg, &s, NULL, NULL);
	return s;
}

/* Retained blocks may be demoted (their DRAM copies dropped) but stay
 * in the pool through a flood that fills both tiers many times over;
 * segment reclaim keeps them. */
static void test_nvme_demoted_not_evicted(void **state)
{
	char dir[64];
	struct store *s;
	uint32_t ns;
	uint64_t next = 1000000;

	(void)state;
	store_fixture_tmpdir(dir, sizeof(dir), "kvpool-retain");
	s = open_nvme(dir, 4 * MIB, 60000);
	ns = ns_of(s, "m");
	put_chain(s, ns, 1, 16, 60000, NULL);
	flood(s, ns, &next, 20 * 6 * MIB, NULL);
	store_debug_nvme_wait_idle(s);
	assert_check(s);
	assert_int_equal(present(s, ns, 1, 16), 16);
	assert_true(stats_of(s).nvme_evictions + stats_of(s).evictions > 0);
	store_fixture_close(&s, 0);
	store_fixture_rmdir(dir);
}

/* Retained blocks filling whole segments (more than a segment of them,
 * all on NVMe): segment reclaim works around them, so a flood of 10x both
 * tiers keeps going, the tier stays healthy and a planned stop still
 * writes DRAM out. */
static void test_nvme_retained_segments(void **state)
{
	char dir[64];
	struct store *s;
	uint32_t ns;
	uint64_t next = 1000000, full = 0, kept = 0, left = 1;

	(void)state;
	store_fixture_tmpdir(dir, sizeof(dir), "kvpool-retain");
	s = open_nvme(dir, 6 * MIB, 60000);
	ns = ns_of(s, "m");
	/* 2 MiB retained: two whole segments' worth */
	put_chain(s, ns, 1, 128, 60000, NULL);
	assert_int_equal(stats_of(s).retained_blocks, 128);
	assert_int_equal(store_debug_nvme_demote_all(s), 0);
	flood(s, ns, &next, 10 * 8 * MIB, &full);
	store_debug_nvme_wait_idle(s);
	assert_int_equal(full, 0);
	assert_int_equal(present(s, ns, 1, 128), 128);
	assert_true(stats_of(s).nvme_healthy);
	assert_true(stats_of(s).segments_reclaimed > 4);
	assert_int_equal(store_keep_dram(s, 10000, &kept, &left), 0);
	assert_int_equal(left, 0);
	assert_check(s);
	store_fixture_close(&s, 0);
	store_fixture_rmdir(dir);
}

/* A planned stop whose time runs out (nvme_drain_ms) writes the
 * retained blocks first, head of the chain first: the retained chain,
 * the coldest in the pool, comes back retained after the restart, while
 * hotter ordinary chains are the ones left behind. */
static void test_nvme_drain_retained_first(void **state)
{
	char dir[64];
	struct store *s;
	uint32_t ns;
	uint64_t kept = 0, left = 0, total = 0;
	int rc;

	(void)state;
	store_fixture_tmpdir(dir, sizeof(dir), "kvpool-retain");
	s = open_nvme(dir, 8 * MIB, 60000);
	ns = ns_of(s, "m");
	put_chain(s, ns, 1, 8, 60000, NULL);       /* retained, put first: coldest */
	for (uint64_t c = 0; c < 6; c++)
		put_chain(s, ns, 100 + 10 * c, 8, 0, NULL);
	for (uint64_t c = 0; c < 6; c++)           /* ordinary chains, used since */
		assert_int_equal(present(s, ns, 100 + 10 * c, 8), 8);
	store_debug_nvme_wait_idle(s);
	assert_int_equal(stats_of(s).nvme_blocks, 0);
	/* no time: the batch that starts (a quarter segment, 16 blocks)
	 * finishes, no more; called again until something was written */
	for (int tries = 0; total < 8 && tries < 1000; tries++) {
		rc = store_keep_dram(s, 1, &kept, &left);
		assert_true(rc == -ETIMEDOUT || rc == 0);
		total += kept;
	}
	assert_true(total >= 8);
	assert_int_equal(total + left, 56);
	store_fixture_close(&s, 0);

	s = open_nvme(dir, 8 * MIB, 60000);
	ns = ns_of(s, "m");
	assert_int_equal(present(s, ns, 1, 8), 8);
	assert_int_equal(stats_of(s).retained_blocks, 8);
	assert_int_equal(stats_of(s).rebuild_blocks, total);
	assert_check(s);
	store_fixture_close(&s, 0);
	store_fixture_rmdir(dir);
}

/* A warm restart keeps the deadlines: of blocks demoted with their
 * retention, and of blocks whose retention was extended after their
 * record was written. An expired one comes back ordinary. */
static void test_nvme_restart_keeps_deadlines(void **state)
{
	char dir[64];
	struct store *s;
	uint32_t ns;
	uint8_t keys[4][STORE_KEY_BYTES];
	struct store_match_opts o = { .retain_ms = 50000 };
	struct store_match_res r;
	uint64_t next = 1000000, kept = 0, dram_left = 1;

	(void)state;
	store_fixture_tmpdir(dir, sizeof(dir), "kvpool-retain");
	s = open_nvme(dir, 8 * MIB, 60000);
	ns = ns_of(s, "m");
	put_chain(s, ns, 1, 8, 20000, NULL);     /* retained 20 s */
	put_chain(s, ns, 100, 4, 0, NULL);       /* ordinary */
	put_chain(s, ns, 200, 4, 100, NULL);     /* expires before the restart */
	assert_int_equal(store_debug_nvme_demote_all(s), 0);
	/* extended after the records were written: 1..4 to 50 s */
	for (int i = 0; i < 4; i++)
		key_of((uint64_t)i + 1, keys[i]);
	assert_int_equal(store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 4, &o,
					&r), 0);
	assert_int_equal(r.retained, 4);
	store_debug_nvme_wait_idle(s);
	sleep_ms(150);
	store_fixture_close(&s, 0);

	s = open_nvme(dir, 8 * MIB, 60000);
	ns = ns_of(s, "m");
	assert_int_equal(present(s, ns, 1, 8), 8);
	assert_int_equal(stats_of(s).retained_blocks, 8);
	assert_int_equal(ns_stats(s, ns).retained_blocks, 8);
	for (uint64_t id = 1; id <= 4; id++)
		assert_true(left_ms(s, ns, id) > 45000);
	for (uint64_t id = 5; id <= 8; id++) {
		assert_true(left_ms(s, ns, id) > 15000);
		assert_true(left_ms(s, ns, id) <= 20000);
	}
	assert_int_equal(left_ms(s, ns, 100), 0);
	assert_int_equal(left_ms(s, ns, 200), 0);
	/* the 4 whose deadline passed are counted as expired, not lost */
	assert_int_equal(stats_of(s).retain_expired, 4);
	assert_int_equal(ns_stats(s, ns).retain_expired, 4);
	assert_check(s);
	/* and they still hold against a flood */
	flood(s, ns, &next, 10 * 10 * MIB, NULL);
	store_debug_nvme_wait_idle(s);
	assert_int_equal(present(s, ns, 1, 8), 8);
	assert_check(s);
	/* blocks retained since before the restart (old uses) do not stall
	 * segment reclaim: a planned stop still writes DRAM out */
	assert_int_equal(store_keep_dram(s, 10000, &kept, &dram_left), 0);
	assert_int_equal(dram_left, 0);
	store_fixture_close(&s, 0);

	/* a lowered max_retain_ms caps what comes back */
	s = open_nvme(dir, 8 * MIB, 10000);
	ns = ns_of(s, "m");
	assert_true(left_ms(s, ns, 1) <= 10000);
	assert_true(left_ms(s, ns, 1) > 9000);
	store_fixture_close(&s, 0);
	store_fixture_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_survives_flood),
		cmocka_unit_test(test_expires),
		cmocka_unit_test(test_expiry_without_tick),
		cmocka_unit_test(test_full_rather_than_break),
		cmocka_unit_test(test_no_holes),
		cmocka_unit_test(test_budget_leading_first),
		cmocka_unit_test(test_budget_zero_and_retention_off),
		cmocka_unit_test(test_clamped),
		cmocka_unit_test(test_tenants),
		cmocka_unit_test(test_tenant_after),
		cmocka_unit_test(test_match_refresh),
		cmocka_unit_test(test_match_budget),
		cmocka_unit_test(test_put_exists_extends),
		cmocka_unit_test(test_lease_and_retention),
		cmocka_unit_test(test_delete_and_drop),
		cmocka_unit_test(test_quota_spares_retained),
		cmocka_unit_test(test_retainer_pays),
		cmocka_unit_test(test_retention_moves),
		cmocka_unit_test(test_pool_wide_cap),
		cmocka_unit_test(test_random_ops),
		cmocka_unit_test(test_nvme_demoted_not_evicted),
		cmocka_unit_test(test_nvme_restart_keeps_deadlines),
		cmocka_unit_test(test_nvme_drain_retained_first),
		cmocka_unit_test(test_nvme_retained_segments),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
