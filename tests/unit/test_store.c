/*
 * test_store.c - the pool: PUT/GET/EXISTS/MATCH/DELETE semantics, the
 * no-holes and LRU-among-leaves eviction rules, leases, in-flight limits,
 * concurrent puts, checksums, the 98% fill rule, and random operation
 * sequences checked with store_check after every step.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "store.h"
#include "debug/store_debug.h"
#include "store_fixture.h"

#define PAGE STORE_PAGE_BYTES
#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* ---- helpers ---- */

/* Payload derived from the key and length, so a wrong block shows. */
static void fill_payload(void *dst, uint64_t len, const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t *p = dst;
	uint64_t seed, i;

	memcpy(&seed, key, 8);
	for (i = 0; i + 8 <= len; i += 8) {
		uint64_t w = mix64(seed + i);

		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)mix64(seed + i);
}

static bool payload_ok(const void *data, uint64_t len, const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t *want = malloc(len);
	bool ok;

	assert_non_null(want);
	fill_payload(want, len, key);
	ok = memcmp(want, data, len) == 0;
	free(want);
	return ok;
}

static uint64_t payload_sum(uint64_t len, const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t *buf = malloc(len);
	uint64_t sum;

	assert_non_null(buf);
	fill_payload(buf, len, key);
	sum = XXH3_64bits(buf, len);
	free(buf);
	return sum;
}

/* Whole put of block `id` (parent id or 0 for none). Returns the rc of
 * begin if it failed, else the rc of commit. */
static int put_id(struct store *s, uint32_t ns, uint64_t id, uint64_t parent_id, uint64_t len)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	struct store_block *b;
	void *dst;
	int rc;

	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	rc = store_put_begin(s, ns, key, parent_id ? parent : NULL, 0, len,
			     payload_sum(len, key), &b, &dst);
	if (rc)
		return rc;
	assert_int_equal((uintptr_t)dst % PAGE, 0);
	fill_payload(dst, len, key);
	return store_put_commit(s, b);
}

static bool stored(struct store *s, uint32_t ns, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	return store_exists(s, ns, key, NULL) == 0;
}

static struct store *open_store(uint64_t capacity, uint64_t max_block, uint64_t inflight,
				uint32_t max_lease_ms)
{
	struct store_config cfg = {
		.dram_capacity_bytes = capacity,
		.max_block_bytes = max_block,
		.max_inflight_put_bytes = inflight,
		.max_lease_ms = max_lease_ms,
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

static struct store_ns_stats ns_stats_of(struct store *s, uint32_t ns_id)
{
	struct store_ns_stats st;

	assert_int_equal(store_ns_stats(s, ns_id - 1, &st), 0);
	assert_int_equal(st.ns_id, ns_id);
	return st;
}

/* Chain of keys for a MATCH. */
static void keys_of(const uint64_t *ids, uint32_t n, uint8_t (*keys)[STORE_KEY_BYTES])
{
	for (uint32_t i = 0; i < n; i++)
		key_of(ids[i], keys[i]);
}

/* ---- basic API ---- */

static void test_open_errors(void **state)
{
	struct store_config cfg = { .dram_capacity_bytes = PAGE - 1, .max_block_bytes = PAGE };
	struct store *s = (struct store *)0x1;

	(void)state;
	assert_int_equal(store_open(&cfg, &s, NULL, 0), -EINVAL);
	cfg.dram_capacity_bytes = 4 * PAGE;
	cfg.max_block_bytes = 0;
	assert_int_equal(store_open(&cfg, &s, NULL, 0), -EINVAL);
	assert_ptr_equal(s, (struct store *)0x1);
	store_close(NULL);

	/* capacity is rounded down to whole pages */
	s = open_store(3 * PAGE + 100, PAGE, 0, 0);
	assert_int_equal(stats_of(s).capacity_bytes, 3 * PAGE);
	assert_int_equal(stats_of(s).free_bytes, 3 * PAGE);
	assert_int_equal(stats_of(s).largest_free_bytes, 3 * PAGE);
	assert_true(stats_of(s).index_bytes > 0);
	assert_check(s);
	store_close(s);
}

static void test_namespaces(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	char long_name[STORE_NAME_MAX_BYTES + 2];
	struct store_ns_stats st;
	uint32_t a, b, id = 99;

	(void)state;
	a = ns_of(s, "llama");
	b = ns_of(s, "qwen");
	assert_int_not_equal(a, b);
	assert_int_equal(ns_of(s, "llama"), a);
	assert_int_equal(store_namespace_id(s, "x", 0, &id), -EINVAL);
	memset(long_name, 'n', sizeof(long_name));
	assert_int_equal(store_namespace_id(s, long_name, STORE_NAME_MAX_BYTES + 1, &id), -EINVAL);
	assert_int_equal(id, 99);
	assert_int_equal(store_namespace_id(s, long_name, STORE_NAME_MAX_BYTES, &id), 0);
	assert_int_equal(stats_of(s).namespaces, 3);
	assert_int_equal(store_ns_stats(s, 0, &st), 0);
	assert_string_equal(st.name, "llama");
	assert_int_equal(store_ns_stats(s, 1, &st), 0);
	assert_string_equal(st.name, "qwen");
	assert_int_equal(store_ns_stats(s, 2, &st), 0);
	assert_int_equal(strlen(st.name), STORE_NAME_MAX_BYTES);
	assert_int_equal(store_ns_stats(s, 3, &st), -ENOENT);
	store_close(s);
}

/* store_namespace_forget forgets an unused, empty namespace (name and
 * id), and refuses one with a user or a block. */
static void test_namespace_forget(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	uint32_t a, b, id;

	(void)state;
	a = ns_of(s, "only-waited");
	b = ns_of(s, "filled");
	assert_int_equal(store_namespace_forget(s, a), -EBUSY); /* a user */
	store_namespace_release(s, a);
	assert_int_equal(put_id(s, b, 1, 0, 100), 0);
	store_namespace_release(s, b);
	assert_int_equal(store_namespace_forget(s, b), -EBUSY); /* a block */
	assert_int_equal(store_namespace_forget(s, a), 0);
	assert_int_equal(store_namespace_find(s, "only-waited", 11, &id), -ENOENT);
	assert_int_equal(store_namespace_forget(s, a), -ENOENT);
	assert_int_equal(stats_of(s).namespaces, 1);
	assert_int_equal(store_namespace_find(s, "filled", 6, &id), 0);
	assert_int_equal(id, b);
	/* the name comes back fresh, with a new id */
	assert_int_not_equal(ns_of(s, "only-waited"), a);
	assert_check(s);
	store_close(s);
}

/* store_namespace_find never creates; it agrees with store_namespace_id. */
static void test_namespace_find(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	char long_name[STORE_NAME_MAX_BYTES + 1];
	uint32_t a, id = 77;

	(void)state;
	assert_int_equal(store_namespace_find(s, "llama", 5, &id), -ENOENT);
	assert_int_equal(id, 77);
	assert_int_equal(stats_of(s).namespaces, 0);
	a = ns_of(s, "llama");
	assert_int_equal(store_namespace_find(s, "llama", 5, &id), 0);
	assert_int_equal(id, a);
	/* a prefix or an extension is another name */
	id = 77;
	assert_int_equal(store_namespace_find(s, "llam", 4, &id), -ENOENT);
	assert_int_equal(store_namespace_find(s, "llamas", 6, &id), -ENOENT);
	assert_int_equal(id, 77);
	assert_int_equal(stats_of(s).namespaces, 1);
	assert_int_equal(store_namespace_find(s, "x", 0, &id), -EINVAL);
	memset(long_name, 'n', sizeof(long_name));
	assert_int_equal(store_namespace_find(s, long_name, STORE_NAME_MAX_BYTES + 1, &id),
			 -EINVAL);
	assert_int_equal(store_namespace_find(s, long_name, STORE_NAME_MAX_BYTES, &id), -ENOENT);
	assert_int_equal(id, 77);
	assert_int_equal(stats_of(s).namespaces, 1);
	assert_check(s);
	store_close(s);
}

/* Name number i, of varying length so chains mix lengths. */
static size_t ns_name(uint32_t i, char *buf, size_t len)
{
	return (size_t)snprintf(buf, len, "ns-%u%.*s", i, (int)(i % 7), "xxxxxxx");
}

/* STORE_MAX_NAMESPACES names fit; one more is -EDQUOT; all still resolve. */
static void test_namespace_cap(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	struct store_ns_stats nst;
	char name[64];
	uint32_t id;

	(void)state;
	for (uint32_t i = 0; i < STORE_MAX_NAMESPACES; i++) {
		size_t n = ns_name(i, name, sizeof(name));

		assert_int_equal(store_namespace_id(s, name, n, &id), 0);
		assert_int_equal(id, i + 1);
	}
	assert_int_equal(stats_of(s).namespaces, STORE_MAX_NAMESPACES);
	id = 0;
	assert_int_equal(store_namespace_id(s, "one-more", 8, &id), -EDQUOT);
	assert_int_equal(id, 0);
	assert_int_equal(store_namespace_find(s, "one-more", 8, &id), -ENOENT);
	assert_int_equal(stats_of(s).namespaces, STORE_MAX_NAMESPACES);
	/* at the cap, every existing name still resolves, both ways */
	for (uint32_t i = 0; i < STORE_MAX_NAMESPACES; i++) {
		size_t n = ns_name(i, name, sizeof(name));

		assert_int_equal(store_namespace_id(s, name, n, &id), 0);
		assert_int_equal(id, i + 1);
		id = 0;
		assert_int_equal(store_namespace_find(s, name, n, &id), 0);
		assert_int_equal(id, i + 1);
	}
	assert_int_equal(store_ns_stats(s, STORE_MAX_NAMESPACES - 1, &nst), 0);
	ns_name(STORE_MAX_NAMESPACES - 1, name, sizeof(name));
	assert_string_equal(nst.name, name);
	assert_int_equal(store_ns_stats(s, STORE_MAX_NAMESPACES, &nst), -ENOENT);
	/* the last namespace works */
	assert_int_equal(put_id(s, STORE_MAX_NAMESPACES, 1, 0, 100), 0);
	assert_true(stored(s, STORE_MAX_NAMESPACES, 1));
	assert_check(s);
	store_close(s);
}

/* Fill the pool with STORE_MAX_NAMESPACES names ns_name(0..), each with
 * one user reference (as if a connection said HELLO to each). */
static void fill_namespaces(struct store *s)
{
	char name[64];
	uint32_t id;

	for (uint32_t i = 0; i < STORE_MAX_NAMESPACES; i++) {
		size_t n = ns_name(i, name, sizeof(name));

		assert_int_equal(store_namespace_id(s, name, n, &id), 0);
		assert_int_equal(id, i + 1);
	}
}

static bool ns_exists(struct store *s, uint32_t i, uint32_t *id)
{
	char name[64];
	size_t n = ns_name(i, name, sizeof(name));

	return store_namespace_find(s, name, n, id) == 0;
}

/* At the cap, a new name takes the slot of a namespace with no users, no
 * blocks and no put in flight; one with blocks, a user, or a reservation
 * is never reclaimed, and reclaimed ids are never handed out again. */
static void test_namespace_reclaim(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	uint8_t key[STORE_KEY_BYTES];
	struct store_ns_stats nst;
	struct store_block *res;
	struct store_ref ref;
	uint32_t id, a, b, c;
	void *dst;

	(void)state;
	fill_namespaces(s);
	/* ns 1: a block, no user; ns 2: a user, empty; ns 3: no user, a put in flight */
	assert_int_equal(put_id(s, 2, 10, 0, 100), 0);
	store_namespace_release(s, 2);
	key_of(30, key);
	assert_int_equal(store_put_begin(s, 4, key, NULL, 0, 100, payload_sum(100, key), &res,
					 &dst),
			 0);
	fill_payload(dst, 100, key);
	store_namespace_release(s, 4);
	store_namespace_release(s, 999999); /* unknown id: ignored */
	assert_int_equal(store_namespace_id(s, "new-a", 5, &id), -EDQUOT);
	assert_check(s);

	/* ns-0 released and empty: its slot goes to new-a, with a fresh id */
	store_namespace_release(s, 1);
	assert_check(s);
	assert_int_equal(store_namespace_id(s, "new-a", 5, &a), 0);
	assert_int_equal(a, STORE_MAX_NAMESPACES + 1);
	assert_int_equal(stats_of(s).namespaces, STORE_MAX_NAMESPACES);
	assert_false(ns_exists(s, 0, &id));
	assert_true(ns_exists(s, 1, &id) && id == 2);
	assert_true(ns_exists(s, 2, &id) && id == 3);
	assert_true(ns_exists(s, 3, &id) && id == 4);
	assert_true(stored(s, 2, 10));
	/* creation order kept: ns-1 first now, new-a last */
	assert_int_equal(store_ns_stats(s, 0, &nst), 0);
	assert_int_equal(nst.ns_id, 2);
	assert_int_equal(store_ns_stats(s, STORE_MAX_NAMESPACES - 1, &nst), 0);
	assert_string_equal(nst.name, "new-a");
	assert_int_equal(nst.ns_id, a);
	assert_int_equal(store_put_begin(s, 1, key, NULL, 0, 100, 0, &res, &dst), -EINVAL);
	assert_check(s);

	/* the put in flight keeps ns-3; once aborted, ns-3 is reclaimable */
	assert_int_equal(store_namespace_id(s, "new-b", 5, &id), -EDQUOT);
	store_put_abort(s, res);
	assert_int_equal(store_namespace_id(s, "new-b", 5, &b), 0);
	assert_int_equal(b, a + 1);
	assert_false(ns_exists(s, 3, &id));
	assert_true(ns_exists(s, 1, &id) && id == 2);
	assert_true(ns_exists(s, 2, &id) && id == 3);
	/* the old id of ns-3 names nothing now */
	assert_int_equal(store_put_begin(s, 4, key, NULL, 0, 100, payload_sum(100, key), &res,
					 &dst),
			 -EINVAL);
	assert_int_equal(store_exists(s, 4, key, NULL), -ENOENT);
	assert_check(s);

	/* a block GET-pinned while its namespace is dropped and reclaimed:
	 * released afterwards without touching the forgotten namespace */
	key_of(10, key);
	assert_int_equal(store_get(s, 2, key, NULL, &ref), 0);
	assert_int_equal(store_drop_namespace(s, 2, NULL, NULL), 0);
	assert_int_equal(store_namespace_id(s, "new-c", 5, &c), 0);
	assert_int_equal(c, b + 1);
	assert_false(ns_exists(s, 1, &id));
	assert_check(s);
	assert_true(payload_ok(ref.data, ref.length, key));
	store_release(s, ref.block);
	assert_check(s);

	/* a reclaimed name said again gets a fresh, empty namespace */
	store_namespace_release(s, b);
	assert_int_equal(store_namespace_id(s, "ns-0", 4, &id), 0);
	assert_int_equal(id, c + 1);
	assert_int_equal(store_ns_stats(s, STORE_MAX_NAMESPACES - 1, &nst), 0);
	assert_string_equal(nst.name, "ns-0");
	assert_int_equal(nst.blocks + nst.puts + nst.get_hits, 0);
	/* the held ns-2 survived it all */
	assert_true(ns_exists(s, 2, &id) && id == 3);
	assert_int_equal(store_namespace_id(s, "new-d", 5, &id), -EDQUOT);
	assert_check(s);
	store_close(s);
}

struct ns_racer {
	struct store *s;
	uint32_t ids[64];
};

static void *ns_race(void *arg)
{
	struct ns_racer *r = arg;
	char name[64];

	for (uint32_t i = 0; i < 64; i++) {
		size_t n = ns_name(i, name, sizeof(name));

		if (store_namespace_id(r->s, name, n, &r->ids[i]))
			r->ids[i] = 0;
	}
	return NULL;
}

/* Threads creating the same names at once get one namespace per name. */
static void test_namespace_race(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	struct ns_racer r[4];
	pthread_t t[4];

	(void)state;
	for (int k = 0; k < 4; k++) {
		r[k].s = s;
		assert_int_equal(pthread_create(&t[k], NULL, ns_race, &r[k]), 0);
	}
	for (int k = 0; k < 4; k++)
		pthread_join(t[k], NULL);
	assert_int_equal(stats_of(s).namespaces, 64);
	for (uint32_t i = 0; i < 64; i++) {
		assert_int_not_equal(r[0].ids[i], 0);
		for (int k = 1; k < 4; k++)
			assert_int_equal(r[k].ids[i], r[0].ids[i]);
	}
	assert_check(s);
	store_close(s);
}

static void test_put_get_basic(void **state)
{
	struct store *s = open_store(64 * PAGE, 8 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m"), ns2 = ns_of(s, "other");
	uint8_t key[STORE_KEY_BYTES];
	struct store_block *b = (struct store_block *)0x1;
	struct store_ref ref;
	struct store_stats st;
	struct store_ns_stats nst;
	uint64_t len = 0;
	void *dst = NULL;

	(void)state;
	key_of(1, key);
	assert_int_equal(put_id(s, ns, 1, 0, 5000), 0);
	/* immutable: a second put of the key is "already stored" at begin */
	assert_int_equal(put_id(s, ns, 1, 0, 5000), -EEXIST);
	assert_int_equal(store_exists(s, ns, key, &len), 0);
	assert_int_equal(len, 5000);
	/* the same hash in another namespace is another block */
	assert_int_equal(store_exists(s, ns2, key, NULL), -ENOENT);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
	assert_int_equal(ref.length, 5000);
	assert_int_equal(ref.tier, 1);
	assert_int_equal(ref.checksum, payload_sum(5000, key));
	assert_true(payload_ok(ref.data, 5000, key));
	assert_int_equal((uintptr_t)ref.data % PAGE, 0);
	store_release(s, ref.block);
	store_release(s, NULL);

	st = stats_of(s);
	assert_int_equal(st.blocks, 1);
	assert_int_equal(st.payload_bytes, 5000);
	assert_int_equal(st.used_bytes, 2 * PAGE);
	assert_int_equal(st.free_bytes, 62 * PAGE);
	assert_int_equal(st.inflight_put_bytes, 0);
	nst = ns_stats_of(s, ns);
	assert_int_equal(nst.blocks, 1);
	assert_int_equal(nst.bytes, 5000);
	assert_int_equal(nst.puts, 1);
	assert_int_equal(nst.put_exists, 1);
	assert_int_equal(nst.get_hits, 1);
	assert_int_equal(nst.exists_hits, 1);

	/* misses and argument errors; out-params untouched */
	key_of(2, key);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), -ENOENT);
	assert_int_equal(store_get(s, 999, key, NULL, &ref), -ENOENT);
	assert_int_equal(store_exists(s, ns, key, NULL), -ENOENT);
	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, 0, 0, &b, &dst), -EINVAL);
	assert_int_equal(store_put_begin(s, 999, key, NULL, 0, 10, 0, &b, &dst), -EINVAL);
	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, 8 * PAGE + 1, 0, &b, &dst),
			 -EMSGSIZE);
	assert_ptr_equal(b, (struct store_block *)0x1);
	assert_null(dst);
	nst = ns_stats_of(s, ns);
	assert_int_equal(nst.get_misses, 1);
	assert_int_equal(nst.exists_misses, 1);
	assert_check(s);
	store_close(s);
}

/* Prefaulting while blocks are stored leaves their bytes alone, covers the
 * whole arena, and reports 0 past its end. */
static void test_prefault_keeps_bytes(void **state)
{
	const uint64_t cap = 16 * PAGE * 16;
	struct store *s = open_store(cap, cap, cap, 1000);
	uint32_t ns = ns_of(s, "pf");
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;
	uint64_t off = 0, done;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, 5 * PAGE + 17), 0);
	while ((done = store_prefault(s, off, 3 * PAGE)) > 0)
		off += done;
	if (off != 0)
		assert_int_equal(off, cap);
	assert_int_equal(store_prefault(s, cap, PAGE), 0);
	key_of(1, key);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
	assert_true(payload_ok(ref.data, ref.length, key));
	store_release(s, ref.block);
	assert_check(s);
	store_close(s);
}

static void test_block_larger_than_arena(void **state)
{
	struct store *s = open_store(4 * PAGE, 64 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, 4 * PAGE), 0);
	assert_int_equal(put_id(s, ns, 2, 0, 4 * PAGE + 1), -EMSGSIZE);
	assert_check(s);
	store_close(s);
}

static void test_parent_rules(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES], zero[STORE_KEY_BYTES] = { 0 };
	struct store_block *b;
	void *dst;

	(void)state;
	/* a parent that is not stored: nothing is stored */
	assert_int_equal(put_id(s, ns, 2, 1, 100), -ENOLINK);
	assert_false(stored(s, ns, 2));
	assert_int_equal(ns_stats_of(s, ns).put_errors, 1);
	/* a parent of 32 zero bytes means "first block" */
	key_of(1, key);
	assert_int_equal(store_put_begin(s, ns, key, zero, 0, 100, payload_sum(100, key), &b,
					 &dst), 0);
	fill_payload(dst, 100, key);
	assert_int_equal(store_put_commit(s, b), 0);
	assert_int_equal(put_id(s, ns, 2, 1, 100), 0);
	assert_check(s);
	store_close(s);
}

/* STORE_PUT_PARENT_IN_BATCH: begin before the parent exists, check at commit. */
static void test_parent_in_batch(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k2[STORE_KEY_BYTES], k3[STORE_KEY_BYTES];
	struct store_block *b1, *b2, *b3;
	void *d1, *d2, *d3;

	(void)state;
	key_of(1, k1);
	key_of(2, k2);
	key_of(3, k3);
	assert_int_equal(store_put_begin(s, ns, k1, NULL, 0, 100, payload_sum(100, k1), &b1, &d1),
			 0);
	assert_int_equal(store_put_begin(s, ns, k2, k1, 0, 100, 0, &b2, &d2), -ENOLINK);
	assert_int_equal(store_put_begin(s, ns, k2, k1, STORE_PUT_PARENT_IN_BATCH, 100,
					 payload_sum(100, k2), &b2, &d2), 0);
	assert_int_equal(store_put_begin(s, ns, k3, k2, STORE_PUT_PARENT_IN_BATCH, 100,
					 payload_sum(100, k3), &b3, &d3), 0);
	assert_int_equal(stats_of(s).inflight_put_bytes, 3 * PAGE);
	fill_payload(d1, 100, k1);
	fill_payload(d2, 100, k2);
	fill_payload(d3, 100, k3);
	/* block 3 before block 2: its parent is not stored yet */
	assert_int_equal(store_put_commit(s, b3), -ENOLINK);
	assert_int_equal(store_put_commit(s, b1), 0);
	assert_int_equal(store_put_commit(s, b2), 0);
	assert_true(stored(s, ns, 2));
	assert_false(stored(s, ns, 3));
	assert_int_equal(stats_of(s).inflight_put_bytes, 0);
	assert_int_equal(stats_of(s).blocks, 2);
	assert_check(s);
	store_close(s);
}

/* The parent is pinned between begin and commit: not evictable. */
static void test_parent_pinned_during_put(void **state)
{
	struct store *s = open_store(3 * PAGE, 2 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t kc[STORE_KEY_BYTES], kp[STORE_KEY_BYTES];
	struct store_block *bc;
	void *dc;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, PAGE), 0);
	key_of(1, kp);
	key_of(2, kc);
	assert_int_equal(store_put_begin(s, ns, kc, kp, 0, PAGE, payload_sum(PAGE, kc), &bc, &dc),
			 0);
	/* 1 page free, parent pinned, child not visible: nothing to evict */
	assert_int_equal(put_id(s, ns, 3, 0, 2 * PAGE), -ENOSPC);
	assert_true(stored(s, ns, 1));
	assert_int_equal(stats_of(s).evictions, 0);
	assert_check(s);
	fill_payload(dc, PAGE, kc);
	assert_int_equal(store_put_commit(s, bc), 0);
	/* block 1 has a child now: block 2, the leaf, goes first */
	assert_int_equal(put_id(s, ns, 3, 0, 2 * PAGE), 0);
	assert_true(stored(s, ns, 1));
	assert_false(stored(s, ns, 2));
	assert_int_equal(stats_of(s).evictions, 1);
	assert_check(s);
	store_close(s);
}

/* The pinned parent is deleted before the child commits: the child gets
 * -ENOLINK (no hole) and the parent's pages go at the last unpin. */
static void test_parent_deleted_during_put(void **state)
{
	struct store *s = open_store(8 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t kp[STORE_KEY_BYTES], k2[STORE_KEY_BYTES], k3[STORE_KEY_BYTES];
	struct store_block *b2, *b3;
	void *d2, *d3;

	(void)state;
	key_of(1, kp);
	key_of(2, k2);
	key_of(3, k3);
	assert_int_equal(put_id(s, ns, 1, 0, PAGE), 0);
	assert_int_equal(store_put_begin(s, ns, k2, kp, 0, PAGE, payload_sum(PAGE, k2), &b2, &d2),
			 0);
	/* in-batch flag with the parent already stored pins it as well */
	assert_int_equal(store_put_begin(s, ns, k3, kp, STORE_PUT_PARENT_IN_BATCH, PAGE,
					 payload_sum(PAGE, k3), &b3, &d3), 0);
	assert_int_equal(store_delete(s, ns, kp, NULL), 0);
	assert_false(stored(s, ns, 1));
	assert_int_equal(stats_of(s).free_bytes, 5 * PAGE);
	assert_check(s);
	fill_payload(d2, PAGE, k2);
	assert_int_equal(store_put_commit(s, b2), -ENOLINK);
	assert_int_equal(stats_of(s).free_bytes, 6 * PAGE);
	assert_check(s);
	store_put_abort(s, b3);
	assert_int_equal(stats_of(s).free_bytes, 8 * PAGE);
	assert_int_equal(stats_of(s).blocks, 0);
	assert_check(s);
	store_close(s);
}

/* Two reservations of one key: the first commit wins, the second -EEXIST. */
static void test_eexist_at_commit(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	struct store_block *a, *b;
	void *da, *db;
	uint64_t sum;

	(void)state;
	key_of(7, key);
	sum = payload_sum(300, key);
	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, 300, sum, &a, &da), 0);
	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, 300, sum, &b, &db), 0);
	assert_ptr_not_equal(da, db);
	fill_payload(da, 300, key);
	fill_payload(db, 300, key);
	assert_int_equal(store_put_commit(s, b), 0);
	assert_int_equal(store_put_commit(s, a), -EEXIST);
	assert_int_equal(stats_of(s).blocks, 1);
	assert_int_equal(stats_of(s).used_bytes, PAGE);
	assert_int_equal(stats_of(s).free_bytes, 15 * PAGE);
	assert_int_equal(ns_stats_of(s, ns).puts, 1);
	assert_int_equal(ns_stats_of(s, ns).put_exists, 1);
	assert_check(s);
	store_close(s);
}

struct racer {
	struct store *s;
	uint32_t ns;
	uint64_t id;
	pthread_barrier_t *go;
	int rc;
};

static void *race_put(void *arg)
{
	struct racer *r = arg;

	pthread_barrier_wait(r->go);
	r->rc = put_id(r->s, r->ns, r->id, 0, 3 * PAGE + 17);
	return NULL;
}

/* Several threads put one key at once: exactly one copy, all succeed. */
static void test_concurrent_puts(void **state)
{
	enum { THREADS = 6, ROUNDS = 40 };
	struct store *s = open_store(256 * PAGE, 4 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	pthread_barrier_t go;
	uint64_t exists = 0;

	(void)state;
	for (int round = 0; round < ROUNDS; round++) {
		struct racer r[THREADS];
		pthread_t t[THREADS];
		int ok = 0;

		pthread_barrier_init(&go, NULL, THREADS);
		for (int i = 0; i < THREADS; i++) {
			r[i] = (struct racer){ .s = s, .ns = ns, .id = 1000 + (uint64_t)round,
					       .go = &go };
			assert_int_equal(pthread_create(&t[i], NULL, race_put, &r[i]), 0);
		}
		for (int i = 0; i < THREADS; i++) {
			pthread_join(t[i], NULL);
			assert_true(r[i].rc == 0 || r[i].rc == -EEXIST);
			ok += r[i].rc == 0;
			exists += r[i].rc == -EEXIST;
		}
		pthread_barrier_destroy(&go);
		assert_int_equal(ok, 1);
		assert_check(s);
	}
	assert_int_equal(stats_of(s).blocks, ROUNDS);
	assert_int_equal(stats_of(s).inflight_put_bytes, 0);
	assert_int_equal(ns_stats_of(s, ns).puts, ROUNDS);
	assert_int_equal(ns_stats_of(s, ns).put_exists, exists);
	assert_int_equal(exists, ROUNDS * (THREADS - 1));
	store_close(s);
}

/* A bad checksum drops that block only and is counted. */
static void test_checksum_failure(void **state)
{
	struct store *s = open_store(64 * PAGE, 4 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	struct store_block *b;
	struct store_stats before;
	void *dst;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, 2 * PAGE), 0);
	assert_int_equal(put_id(s, ns, 2, 1, 2 * PAGE), 0);
	before = stats_of(s);
	key_of(3, key);
	key_of(2, parent);
	assert_int_equal(store_put_begin(s, ns, key, parent, 0, 2 * PAGE,
					 payload_sum(2 * PAGE, key), &b, &dst), 0);
	fill_payload(dst, 2 * PAGE, key);
	((uint8_t *)dst)[PAGE + 5] ^= 0x40; /* one flipped bit */
	assert_int_equal(store_put_commit(s, b), -EBADMSG);
	assert_false(stored(s, ns, 3));
	assert_true(stored(s, ns, 1));
	assert_true(stored(s, ns, 2));
	assert_int_equal(stats_of(s).checksum_errors, 1);
	assert_int_equal(stats_of(s).blocks, before.blocks);
	assert_int_equal(stats_of(s).free_bytes, before.free_bytes);
	assert_int_equal(stats_of(s).inflight_put_bytes, 0);
	assert_int_equal(ns_stats_of(s, ns).put_errors, 1);
	assert_check(s);
	store_close(s);
}

/* store_put_commit_hashed judges by the caller's digest, not the bytes:
 * intact bytes with a wrong digest are refused and counted like a bad
 * checksum; a digest streamed over the bytes in uneven chunks (as the
 * server receives them) equals the one-shot xxh3 and commits. */
static void test_commit_hashed(void **state)
{
	struct store *s = open_store(64 * PAGE, 4 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint64_t len = 3 * PAGE + 77, sum, off = 0, chunk = 1;
	uint8_t key[STORE_KEY_BYTES];
	XXH3_state_t *h = XXH3_createState();
	struct store_block *b;
	struct store_stats before;
	struct store_ref ref;
	void *dst;

	(void)state;
	assert_non_null(h);
	key_of(7, key);
	sum = payload_sum(len, key);
	before = stats_of(s);
	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, len, sum, &b, &dst), 0);
	fill_payload(dst, len, key);
	assert_int_equal(store_put_commit_hashed(s, b, sum ^ 1), -EBADMSG);
	assert_false(stored(s, ns, 7));
	assert_int_equal(stats_of(s).checksum_errors, 1);
	assert_int_equal(stats_of(s).free_bytes, before.free_bytes);
	assert_int_equal(stats_of(s).inflight_put_bytes, 0);
	assert_int_equal(ns_stats_of(s, ns).put_errors, 1);
	assert_check(s);

	assert_int_equal(store_put_begin(s, ns, key, NULL, 0, len, sum, &b, &dst), 0);
	fill_payload(dst, len, key);
	assert_int_equal(XXH3_64bits_reset(h), XXH_OK);
	for (; off < len; off += chunk, chunk = chunk * 3 + 1) {
		if (chunk > len - off)
			chunk = len - off;
		assert_int_equal(XXH3_64bits_update(h, (uint8_t *)dst + off, chunk), XXH_OK);
	}
	assert_int_equal(XXH3_64bits_digest(h), sum);
	assert_int_equal(store_put_commit_hashed(s, b, XXH3_64bits_digest(h)), 0);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
	assert_int_equal(ref.checksum, sum);
	assert_true(payload_ok(ref.data, len, key));
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).checksum_errors, 1);
	assert_int_equal(ns_stats_of(s, ns).puts, 1);
	assert_check(s);
	XXH3_freeState(h);
	store_close(s);
}

/* Reserved bytes are bounded by max_inflight_put_bytes: -EAGAIN beyond. */
static void test_inflight_limit(void **state)
{
	struct store *s = open_store(64 * PAGE, 4 * PAGE, 3 * PAGE, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k2[STORE_KEY_BYTES], k3[STORE_KEY_BYTES];
	struct store_block *b1, *b2, *b3;
	void *d1, *d2, *d3;

	(void)state;
	key_of(1, k1);
	key_of(2, k2);
	key_of(3, k3);
	assert_int_equal(store_put_begin(s, ns, k1, NULL, 0, 2 * PAGE, 0, &b1, &d1), 0);
	assert_int_equal(store_put_begin(s, ns, k2, NULL, 0, PAGE + 1, 0, &b2, &d2), -EAGAIN);
	assert_int_equal(store_put_begin(s, ns, k2, NULL, 0, PAGE, 0, &b2, &d2), 0);
	assert_int_equal(stats_of(s).inflight_put_bytes, 3 * PAGE);
	assert_int_equal(store_put_begin(s, ns, k3, NULL, 0, 1, 0, &b3, &d3), -EAGAIN);
	assert_check(s);
	/* an abort (connection died) frees its space and leaves nothing */
	store_put_abort(s, b1);
	store_put_abort(s, b2);
	assert_int_equal(stats_of(s).inflight_put_bytes, 0);
	assert_int_equal(stats_of(s).free_bytes, 64 * PAGE);
	assert_int_equal(stats_of(s).blocks, 0);
	assert_false(stored(s, ns, 1));
	assert_int_equal(store_put_begin(s, ns, k3, NULL, 0, 3 * PAGE, 0, &b3, &d3), 0);
	store_put_abort(s, b3);
	assert_check(s);
	store_close(s);
}

/* ---- eviction ---- */

/* LRU among leaves: a parent re-enters at its own (old) recency. */
static void test_lru_order_among_leaves(void **state)
{
	struct store *s = open_store(5 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m"), matched;
	uint8_t keys[1][STORE_KEY_BYTES];
	struct store_ref ref;
	uint64_t a = 3;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, PAGE), 0); /* D */
	assert_int_equal(put_id(s, ns, 2, 1, PAGE), 0); /* E, child of D */
	assert_int_equal(put_id(s, ns, 3, 0, PAGE), 0); /* A */
	assert_int_equal(put_id(s, ns, 4, 0, PAGE), 0); /* B */
	assert_int_equal(put_id(s, ns, 5, 0, PAGE), 0); /* C */
	keys_of(&a, 1, keys);
	assert_int_equal(store_match(s, ns, keys, 1, 0, NULL, &matched, NULL), 0); /* use A */
	assert_int_equal(matched, 1);
	/* eviction order: E (oldest leaf), D (its own age), B, C, then A */
	static const uint64_t order[] = { 2, 1, 4, 5, 3 };
	assert_int_equal(stats_of(s).evict_passes, 0); /* filling took no pass */
	for (int i = 0; i < 5; i++) {
		assert_int_equal(put_id(s, ns, 100 + (uint64_t)i, 0, PAGE), 0);
		assert_false(stored(s, ns, order[i]));
		for (int j = i + 1; j < 5; j++)
			assert_true(stored(s, ns, order[j]));
		assert_int_equal(stats_of(s).evictions, (uint64_t)i + 1);
		/* each put into the full arena is one timed pass (one page each) */
		assert_int_equal(stats_of(s).evict_passes, (uint64_t)i + 1);
		assert_true(stats_of(s).evict_pass_max_us < 1000000);
		assert_check(s);
	}
	/* a GET is a use too: 101 now outlives 100 and 102 */
	key_of(101, keys[0]);
	assert_int_equal(store_get(s, ns, keys[0], NULL, &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(put_id(s, ns, 200, 0, PAGE), 0);
	assert_false(stored(s, ns, 100));
	assert_int_equal(put_id(s, ns, 201, 0, PAGE), 0);
	assert_false(stored(s, ns, 102));
	assert_true(stored(s, ns, 101));
	assert_int_equal(ns_stats_of(s, ns).evictions, 7);
	assert_check(s);
	store_close(s);
}

/* ---- aging of the 32-bit use clock ---- */

static uint32_t last_use_of(struct store *s, uint32_t ns, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];
	uint32_t use = 0;

	key_of(id, key);
	assert_int_equal(store_debug_last_use(s, ns, key, &use), 0);
	return use;
}

static uint32_t clock_of(struct store *s, uint32_t *epoch)
{
	uint32_t clock, e;

	store_debug_clock(s, &clock, &e);
	if (epoch)
		*epoch = e;
	return clock;
}

/* Move the clock one count on, as another block's use would. */
static void clock_skip(struct store *s)
{
	assert_int_equal(store_debug_clock_set(s, clock_of(s, NULL) + 1), 0);
}

/* When the clock is about to wrap, the next use halves every block's
 * last_use and the clock: blocks used before and after the pass are still
 * evicted least recently used first, and the pool still checks. */
static void test_aging_keeps_lru_order(void **state)
{
	struct store *s = open_store(6 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m"), before[4], epoch;
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;

	(void)state;
	assert_int_equal(store_debug_clock_set(s, UINT32_MAX - 20), 0);
	assert_int_equal(store_debug_clock_set(s, UINT32_MAX - 21), -EINVAL);
	/* 1, 2, 3 with a use of something else between each: distinct
	 * after halving (uses at consecutive counts may tie) */
	for (uint64_t id = 1; id <= 3; id++) {
		assert_int_equal(put_id(s, ns, id, 0, PAGE), 0);
		before[id] = last_use_of(s, ns, id);
		clock_skip(s);
	}
	assert_int_equal(before[1], UINT32_MAX - 19);
	assert_true(before[1] < before[2] && before[2] < before[3]);
	assert_int_equal(store_debug_clock_set(s, UINT32_MAX), 0);
	/* this GET of 1 is the use that ages the pool first */
	key_of(1, key);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(clock_of(s, &epoch), UINT32_MAX / 2 + 1);
	assert_int_equal(epoch, 1);
	assert_int_equal(last_use_of(s, ns, 1), UINT32_MAX / 2 + 1);
	assert_int_equal(last_use_of(s, ns, 2), before[2] / 2);
	assert_int_equal(last_use_of(s, ns, 3), before[3] / 2);
	assert_check(s);
	/* 4, 5, 6 after the pass fill the pool */
	for (uint64_t id = 4; id <= 6; id++)
		assert_int_equal(put_id(s, ns, id, 0, PAGE), 0);
	assert_true(last_use_of(s, ns, 4) > last_use_of(s, ns, 1));
	assert_check(s);
	static const uint64_t order[] = { 2, 3, 1, 4, 5, 6 };
	for (int i = 0; i < 6; i++) {
		assert_int_equal(put_id(s, ns, 100 + (uint64_t)i, 0, PAGE), 0);
		assert_false(stored(s, ns, order[i]));
		for (int j = i + 1; j < 6; j++)
			assert_true(stored(s, ns, order[j]));
		assert_check(s);
	}
	assert_int_equal(stats_of(s).evictions, 6);
	store_close(s);
}

/* The pass halves only headers in use by a visible or removed block: a
 * reservation's header holds its pending parent's key where last_use
 * would be, and must come through intact; a removed block still pinned by
 * a GET is aged and freed at its release. */
static void test_aging_spares_reservations(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k2[STORE_KEY_BYTES], k9[STORE_KEY_BYTES];
	uint8_t k8[1][STORE_KEY_BYTES];
	struct store_block *b1, *b2;
	struct store_ref ref;
	uint32_t epoch, matched = 0;
	uint64_t removed = 0;
	void *d1, *d2;

	(void)state;
	key_of(1, k1);
	key_of(2, k2);
	key_of(9, k9);
	key_of(8, k8[0]);
	assert_int_equal(put_id(s, ns, 9, 0, PAGE), 0);
	assert_int_equal(put_id(s, ns, 8, 0, PAGE), 0);
	/* 9 removed while a GET holds it */
	assert_int_equal(store_get(s, ns, k9, NULL, &ref), 0);
	assert_int_equal(store_delete(s, ns, k9, &removed), 0);
	assert_int_equal(removed, 1);
	/* 2 waits for parent 1 of the same batch: pending by key */
	assert_int_equal(store_put_begin(s, ns, k1, NULL, 0, 100, payload_sum(100, k1), &b1, &d1),
			 0);
	assert_int_equal(store_put_begin(s, ns, k2, k1, STORE_PUT_PARENT_IN_BATCH, 100,
					 payload_sum(100, k2), &b2, &d2), 0);
	fill_payload(d1, 100, k1);
	fill_payload(d2, 100, k2);
	assert_int_equal(store_debug_clock_set(s, UINT32_MAX), 0);
	/* a MATCH of 8 ages the pool, the reservations and removed 9 with it */
	assert_int_equal(store_match(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])k8, 1, 0, NULL,
				     &matched, NULL), 0);
	assert_int_equal(matched, 1);
	assert_int_equal(clock_of(s, &epoch), UINT32_MAX / 2 + 1);
	assert_int_equal(epoch, 1);
	assert_check(s);
	assert_int_equal(store_put_commit(s, b1), 0);
	assert_int_equal(store_put_commit(s, b2), 0); /* found its parent by key */
	assert_true(stored(s, ns, 2));
	assert_true(last_use_of(s, ns, 2) > last_use_of(s, ns, 8));
	assert_true(payload_ok(ref.data, PAGE, k9)); /* the removed block's pages */
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).blocks, 3);
	assert_check(s);
	store_close(s);
}

/* A namespace over its quota evicts its own LRU leaves, never another
 * namespace's blocks, never a block a child or a GET depends on, and
 * answers -EDQUOT when its own blocks cannot make room. */
static void test_namespace_quota(void **state)
{
	struct store *s = open_store(64 * PAGE, 4 * PAGE, 0, 0);
	uint32_t a = ns_of(s, "tenant-a"), b = ns_of(s, "tenant-b");
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;

	(void)state;
	assert_int_equal(store_namespace_quota(s, 999, PAGE), -ENOENT);
	assert_int_equal(store_namespace_quota(s, a, 3 * PAGE), 0);
	for (uint64_t i = 1; i <= 4; i++)
		assert_int_equal(put_id(s, b, 50 + i, 0, PAGE), 0); /* b has no quota */
	/* a: chain 1 <- 2, and 3 alone: exactly 3 pages */
	assert_int_equal(put_id(s, a, 1, 0, PAGE), 0);
	assert_int_equal(put_id(s, a, 2, 1, PAGE), 0);
	assert_int_equal(put_id(s, a, 3, 0, PAGE), 0);
	assert_int_equal(ns_stats_of(s, a).bytes, 3 * PAGE);
	/* 4 takes the LRU leaf: 2 (1 has a child, so 1 stays) */
	assert_int_equal(put_id(s, a, 4, 0, PAGE), 0);
	assert_false(stored(s, a, 2));
	assert_true(stored(s, a, 1) && stored(s, a, 3) && stored(s, a, 4));
	assert_int_equal(ns_stats_of(s, a).evictions, 1);
	/* bigger than the whole quota: refused without evicting */
	assert_int_equal(put_id(s, a, 5, 0, 4 * PAGE), -EDQUOT);
	assert_int_equal(ns_stats_of(s, a).blocks, 3);
	/* the parent of the block being put is spared even when it is the
	 * LRU leaf: 1 is older than 3 and 4 */
	assert_int_equal(put_id(s, a, 6, 1, PAGE), 0);
	assert_true(stored(s, a, 1) && stored(s, a, 6));
	assert_false(stored(s, a, 3));
	/* pinned by a GET, leased or with children: nothing can go */
	key_of(4, key);
	assert_int_equal(store_get(s, a, key, NULL, &ref), 0);
	assert_int_equal(put_id(s, a, 7, 6, PAGE), -EDQUOT);
	assert_true(stored(s, a, 1) && stored(s, a, 4) && stored(s, a, 6));
	store_release(s, ref.block);
	assert_int_equal(put_id(s, a, 7, 6, PAGE), 0);
	assert_false(stored(s, a, 4));
	/* uncommitted puts count too */
	{
		struct store_block *res;
		uint8_t k[STORE_KEY_BYTES];
		void *dst;

		key_of(8, k);
		assert_int_equal(store_put_begin(s, a, k, NULL, 0, 2 * PAGE,
						 payload_sum(2 * PAGE, k), &res, &dst), 0);
		/* 1 <- 6 <- 7 is one chain: evicted from its tail, 7 then 6 */
		assert_false(stored(s, a, 7) || stored(s, a, 6));
		assert_int_equal(ns_stats_of(s, a).bytes, 1 * PAGE);
		/* 1 page: 1 goes, 2 reserved + 1 = 3 fits */
		assert_int_equal(put_id(s, a, 9, 0, PAGE), 0);
		assert_false(stored(s, a, 1));
		/* 2 pages: 9 goes, 2 reserved + 2 > 3 still: refused */
		assert_int_equal(put_id(s, a, 10, 0, 2 * PAGE), -EDQUOT);
		assert_false(stored(s, a, 9));
		assert_int_equal(ns_stats_of(s, a).blocks, 0);
		store_put_abort(s, res);
		assert_int_equal(put_id(s, a, 10, 0, 2 * PAGE), 0);
	}
	/* the other namespace never lost a block, and the totals add up */
	for (uint64_t i = 1; i <= 4; i++)
		assert_true(stored(s, b, 50 + i));
	assert_int_equal(ns_stats_of(s, b).evictions, 0);
	/* no quota: back to the pool-wide rules */
	assert_int_equal(store_namespace_quota(s, a, 0), 0);
	for (uint64_t i = 20; i < 30; i++)
		assert_int_equal(put_id(s, a, i, 0, PAGE), 0);
	assert_check(s);
	store_close(s);
}

/* A chain is evicted from its tail, never leaving a hole. */
static void test_chain_evicted_from_tail(void **state)
{
	struct store *s = open_store(8 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");

	(void)state;
	for (uint64_t i = 1; i <= 8; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, PAGE), 0);
	for (uint64_t i = 0; i < 8; i++) {
		assert_int_equal(put_id(s, ns, 100 + i, 0, PAGE), 0);
		assert_false(stored(s, ns, 8 - i));
		if (i < 7)
			assert_true(stored(s, ns, 7 - i));
		assert_check(s);
	}
	store_close(s);
}

/* Same-size blocks fill >= 98% of the arena before the first eviction. */
static void fill_until_eviction(uint64_t capacity, uint64_t block_bytes)
{
	struct store *s = open_store(capacity, block_bytes, 0, 0);
	uint32_t ns = ns_of(s, "fill");
	struct store_stats st;
	uint64_t id = 1, n = 0, payload_before = 0, used_before = 0;

	for (;;) {
		st = stats_of(s);
		payload_before = st.payload_bytes;
		used_before = st.used_bytes;
		assert_int_equal(put_id(s, ns, id++, 0, block_bytes), 0);
		if (stats_of(s).evictions)
			break;
		n++;
	}
	printf("fill %llu-byte blocks in %llu MiB: %llu blocks, payload %.4f, used %.4f "
	       "of capacity\n",
	       (unsigned long long)block_bytes, (unsigned long long)(capacity / MIB),
	       (unsigned long long)n, (double)payload_before / (double)capacity,
	       (double)used_before / (double)capacity);
	assert_true((double)used_before >= 0.98 * (double)capacity);
	if (block_bytes % PAGE == 0) {
		assert_true((double)payload_before >= 0.98 * (double)capacity);
		assert_int_equal(n, capacity / block_bytes);
	}
	/* steady state: same-size churn never runs out and stays dense */
	for (int i = 0; i < 200; i++)
		assert_int_equal(put_id(s, ns, id++, 0, block_bytes), 0);
	st = stats_of(s);
	assert_true((double)st.used_bytes >= 0.98 * (double)capacity);
	assert_true(st.free_bytes < block_bytes + PAGE);
	assert_check(s);
	store_close(s);
}

static void test_fill_98_percent(void **state)
{
	(void)state;
	fill_until_eviction(64 * MIB, 1 * MIB);   /* 64 blocks */
	fill_until_eviction(64 * MIB, 100 * KIB); /* 25 pages each */
	fill_until_eviction(64 * MIB, 104 * KIB);
	fill_until_eviction(32 * MIB, 64 * KIB);
	fill_until_eviction(32 * MIB, 4 * KIB);
	fill_until_eviction(64 * MIB, 1280 * KIB);
	fill_until_eviction(32 * MIB, 100000);    /* not a page multiple */
}

/* Everything leased: a PUT answers -ENOSPC and evicts nothing. */
static void test_enospc_when_all_leased(void **state)
{
	struct store *s = open_store(8 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "m"), matched = 0, granted = 0;
	struct store_lessee *l = store_lessee_new(s);
	uint8_t keys[8][STORE_KEY_BYTES];
	uint64_t ids[8];

	(void)state;
	assert_non_null(l);
	for (uint64_t i = 0; i < 8; i++) {
		ids[i] = 10 + i;
		assert_int_equal(put_id(s, ns, ids[i], 0, PAGE), 0);
	}
	keys_of(ids, 8, keys);
	assert_int_equal(store_match(s, ns, keys, 8, 30000, l, &matched, &granted), 0);
	assert_int_equal(matched, 8);
	assert_int_equal(granted, 30000);
	assert_int_equal(stats_of(s).leases_active, 8);
	assert_int_equal(put_id(s, ns, 99, 0, PAGE), -ENOSPC);
	assert_int_equal(stats_of(s).evictions, 0);
	assert_int_equal(stats_of(s).blocks, 8);
	for (int i = 0; i < 8; i++)
		assert_true(stored(s, ns, ids[i]));
	assert_check(s);
	/* closing the connection ends its leases */
	store_lessee_free(s, l);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_int_equal(put_id(s, ns, 99, 0, PAGE), 0);
	assert_int_equal(stats_of(s).evictions, 1);
	assert_check(s);
	store_close(s);
}

/* A GET that only learns a leased block's size (max_length 0), or whose
 * buffer is too small, keeps the lease: the block is not evicted by the
 * puts that follow, and the GET that fetches it ends the lease. Before
 * this, the size query ended the lease and the fetch missed (issue 28
 * item 8: Python's get_many on a new handle asks the sizes first). */
static void test_size_query_keeps_lease(void **state)
{
	struct store *s = open_store(4 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "m"), matched = 0, granted = 0;
	struct store_lessee *l = store_lessee_new(s);
	uint64_t ids[2] = { 1, 2 };
	uint8_t keys[2][STORE_KEY_BYTES];
	struct store_ns_stats before, after;
	struct store_ref ref;

	(void)state;
	assert_non_null(l);
	assert_int_equal(put_id(s, ns, 1, 0, PAGE), 0);
	assert_int_equal(put_id(s, ns, 2, 1, PAGE), 0);
	keys_of(ids, 2, keys);
	assert_int_equal(store_match(s, ns, keys, 2, 30000, l, &matched, &granted), 0);
	assert_int_equal(matched, 2);
	assert_int_equal(stats_of(s).leases_active, 2);
	before = ns_stats_of(s, ns);
	for (uint64_t room = 0; room < PAGE; room += PAGE - 1) {
		memset(&ref, 0xa5, sizeof(ref));
		assert_int_equal(store_get_fit_async(s, ns, keys[1], room, l, &ref, NULL, NULL),
				 -EMSGSIZE);
		assert_int_equal(ref.length, PAGE);
		assert_int_equal(ref.tier, STORE_TIER_DRAM);
		assert_null(ref.block);
		assert_null(ref.data);
	}
	after = ns_stats_of(s, ns);
	assert_int_equal(after.get_hits, before.get_hits); /* nothing was sent */
	assert_int_equal(stats_of(s).leases_active, 2);
	/* fill the pool: the leased chain stays, the others go */
	for (uint64_t i = 10; i < 20; i++)
		assert_int_equal(put_id(s, ns, i, 0, PAGE), 0);
	assert_true(stored(s, ns, 1));
	assert_true(stored(s, ns, 2));
	assert_check(s);
	/* the fetch ends the lease of the block it returns */
	assert_int_equal(store_get_fit_async(s, ns, keys[1], PAGE, l, &ref, NULL, NULL), 0);
	assert_true(payload_ok(ref.data, PAGE, keys[1]));
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).leases_active, 1);
	/* a miss stays a miss */
	key_of(999, keys[1]);
	assert_int_equal(store_get_fit_async(s, ns, keys[1], 0, l, &ref, NULL, NULL), -ENOENT);
	store_lessee_free(s, l);
	assert_check(s);
	store_close(s);
}

/* GET-pinned blocks are never evicted; -ENOSPC when all are pinned. */
static void test_get_pins_block(void **state)
{
	struct store *s = open_store(2 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k2[STORE_KEY_BYTES];
	struct store_ref r1, r2;

	(void)state;
	key_of(1, k1);
	assert_int_equal(put_id(s, ns, 1, 0, PAGE), 0);
	assert_int_equal(put_id(s, ns, 2, 0, PAGE), 0);
	assert_int_equal(store_get(s, ns, k1, NULL, &r1), 0);
	/* block 1 is older but pinned: block 2 goes */
	assert_int_equal(put_id(s, ns, 3, 0, PAGE), 0);
	assert_true(stored(s, ns, 1));
	assert_false(stored(s, ns, 2));
	key_of(3, k2);
	assert_int_equal(store_get(s, ns, k2, NULL, &r2), 0);
	assert_int_equal(put_id(s, ns, 4, 0, PAGE), -ENOSPC);
	assert_true(payload_ok(r1.data, PAGE, k1));
	assert_true(payload_ok(r2.data, PAGE, k2));
	assert_check(s);
	store_release(s, r1.block);
	store_release(s, r2.block);
	assert_int_equal(put_id(s, ns, 4, 0, PAGE), 0);
	assert_true(stored(s, ns, 3));
	assert_false(stored(s, ns, 1));
	assert_check(s);
	store_close(s);
}

/* ---- removal ---- */

static void test_delete_removes_descendants(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	(void)state;
	/* 1 -> 2 -> 3, 1 -> 4, 2 -> 5 */
	assert_int_equal(put_id(s, ns, 1, 0, 10), 0);
	assert_int_equal(put_id(s, ns, 2, 1, 10), 0);
	assert_int_equal(put_id(s, ns, 3, 2, 10), 0);
	assert_int_equal(put_id(s, ns, 4, 1, 10), 0);
	assert_int_equal(put_id(s, ns, 5, 2, 10), 0);
	key_of(2, key);
	assert_int_equal(store_delete(s, ns, key, &removed), 0);
	assert_int_equal(removed, 3);
	assert_true(stored(s, ns, 1));
	assert_true(stored(s, ns, 4));
	assert_false(stored(s, ns, 2));
	assert_false(stored(s, ns, 3));
	assert_false(stored(s, ns, 5));
	assert_int_equal(store_delete(s, ns, key, &removed), -ENOENT);
	assert_int_equal(removed, 3);
	assert_int_equal(store_delete(s, 77, key, NULL), -ENOENT);
	assert_int_equal(ns_stats_of(s, ns).deletes, 3);
	assert_check(s);
	key_of(1, key);
	assert_int_equal(store_delete(s, ns, key, NULL), 0);
	assert_int_equal(stats_of(s).blocks, 0);
	assert_int_equal(stats_of(s).free_bytes, 64 * PAGE);
	assert_check(s);
	store_close(s);
}

/* Siblings of one parent leave in any order (first, middle, last of its
 * child ring): the parent stays pinned as a non-leaf until the last one
 * goes, and store_check sees every child on the ring at each step. */
static void test_delete_siblings_any_order(void **state)
{
	static const uint64_t order[] = { 2, 5, 7, 3, 6, 4 };
	struct store *s = open_store(64 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, 10), 0);
	for (uint64_t id = 2; id <= 7; id++)
		assert_int_equal(put_id(s, ns, id, 1, 10), 0);
	assert_int_equal(put_id(s, ns, 8, 5, 10), 0); /* a grandchild under 5 */
	assert_check(s);
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		key_of(order[i], key);
		assert_int_equal(store_delete(s, ns, key, &removed), 0);
		assert_int_equal(removed, order[i] == 5 ? 2 : 1);
		assert_false(stored(s, ns, order[i]));
		assert_true(stored(s, ns, 1));
		assert_check(s);
	}
	assert_false(stored(s, ns, 8));
	assert_int_equal(stats_of(s).blocks, 1);
	/* a leaf now: the parent is the LRU eviction victim when room runs out */
	for (uint64_t id = 100; id < 164; id++)
		assert_int_equal(put_id(s, ns, id, 0, 10), 0);
	assert_false(stored(s, ns, 1));
	assert_true(stored(s, ns, 100));
	assert_check(s);
	store_close(s);
}

/* Block headers come from the pool's slab and go back to it: filling,
 * emptying and filling again reuses them, so index_bytes does not grow;
 * headers are never given back to the system while the pool is open. */
static void test_headers_reused(void **state)
{
	enum { N = 20000 };
	struct store *s = open_store((N + 64) * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	uint64_t full, empty;

	(void)state;
	for (uint64_t id = 1; id <= N; id++)
		assert_int_equal(put_id(s, ns, id, id % 100 == 1 ? 0 : id - 1, 10), 0);
	full = stats_of(s).index_bytes;
	for (uint64_t id = 1; id <= N; id += 100) {
		key_of(id, key);
		assert_int_equal(store_delete(s, ns, key, NULL), 0);
	}
	assert_int_equal(stats_of(s).blocks, 0);
	empty = stats_of(s).index_bytes;
	assert_int_equal(empty, full); /* kept for the next fill */
	assert_check(s);
	for (uint64_t id = N + 1; id <= 2 * N; id++)
		assert_int_equal(put_id(s, ns, id, 0, 10), 0);
	assert_int_equal(stats_of(s).index_bytes, full);
	assert_check(s);
	store_close(s);
}

/* A deep chain is removed without recursion trouble. */
static void test_delete_deep_chain(void **state)
{
	enum { DEPTH = 20000 };
	struct store *s = open_store(DEPTH * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	(void)state;
	for (uint64_t i = 1; i <= DEPTH; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 64), 0);
	assert_check(s);
	key_of(1, key);
	assert_int_equal(store_delete(s, ns, key, &removed), 0);
	assert_int_equal(removed, DEPTH);
	assert_int_equal(stats_of(s).blocks, 0);
	assert_check(s);
	store_close(s);
}

/* Removed while referenced: gone from the index, bytes kept until release. */
static void test_delete_while_pinned(void **state)
{
	struct store *s = open_store(16 * PAGE, 2 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k2[STORE_KEY_BYTES];
	struct store_ref r1, r2;
	struct store_stats st;

	(void)state;
	key_of(1, k1);
	key_of(2, k2);
	assert_int_equal(put_id(s, ns, 1, 0, 2 * PAGE), 0);
	assert_int_equal(put_id(s, ns, 2, 1, 2 * PAGE), 0);
	assert_int_equal(store_get(s, ns, k1, NULL, &r1), 0);
	assert_int_equal(store_get(s, ns, k2, NULL, &r2), 0);
	assert_int_equal(store_delete(s, ns, k1, NULL), 0);
	assert_false(stored(s, ns, 1));
	assert_false(stored(s, ns, 2));
	st = stats_of(s);
	assert_int_equal(st.blocks, 0);
	assert_int_equal(st.payload_bytes, 0);
	/* the 4 referenced pages stay in used_bytes until the last release */
	assert_int_equal(st.used_bytes, 4 * PAGE);
	assert_int_equal(st.pinned_removed_bytes, 4 * PAGE);
	assert_int_equal(st.free_bytes, 12 * PAGE);
	assert_int_equal(st.used_bytes + st.inflight_put_bytes + st.free_bytes, st.capacity_bytes);
	assert_check(s);
	/* the space is not reused while referenced */
	for (uint64_t i = 10; i < 16; i++)
		assert_int_equal(put_id(s, ns, i, 0, 2 * PAGE), 0);
	assert_true(payload_ok(r1.data, 2 * PAGE, k1));
	assert_true(payload_ok(r2.data, 2 * PAGE, k2));
	assert_check(s);
	st = stats_of(s);
	assert_int_equal(st.used_bytes, 16 * PAGE);
	assert_int_equal(st.free_bytes, 0);
	store_release(s, r2.block);
	st = stats_of(s);
	assert_int_equal(st.used_bytes, 14 * PAGE); /* k2's pages freed */
	assert_int_equal(st.pinned_removed_bytes, 2 * PAGE);
	assert_int_equal(st.free_bytes, 2 * PAGE);
	assert_check(s);
	store_release(s, r1.block);
	st = stats_of(s);
	assert_int_equal(st.free_bytes, 4 * PAGE);
	assert_int_equal(st.used_bytes, 12 * PAGE);
	assert_int_equal(st.pinned_removed_bytes, 0);
	assert_check(s);
	store_close(s);
}

/* A pinned block that is dropped with its namespace, and a pinned parent
 * whose reservation is in flight: used + in-flight + free = capacity at
 * every step. */
static void test_bytes_add_up_while_pinned(void **state)
{
	struct store *s = open_store(8 * PAGE, 2 * PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t k1[STORE_KEY_BYTES], k3[STORE_KEY_BYTES];
	struct store_block *res;
	struct store_ref r1;
	struct store_stats st;
	void *dst;

	(void)state;
	key_of(1, k1);
	key_of(3, k3);
	assert_int_equal(put_id(s, ns, 1, 0, PAGE + 1), 0);
	assert_int_equal(store_get(s, ns, k1, NULL, &r1), 0);
	assert_int_equal(store_put_begin(s, ns, k3, k1, 0, PAGE, payload_sum(PAGE, k3), &res,
					 &dst), 0);
	assert_int_equal(store_drop_namespace(s, ns, NULL, NULL), 0);
	st = stats_of(s);
	assert_int_equal(st.used_bytes, 2 * PAGE);
	assert_int_equal(st.pinned_removed_bytes, 2 * PAGE);
	assert_int_equal(st.inflight_put_bytes, PAGE);
	assert_int_equal(st.free_bytes, 5 * PAGE);
	assert_int_equal(st.used_bytes + st.inflight_put_bytes + st.free_bytes, st.capacity_bytes);
	assert_check(s);
	fill_payload(dst, PAGE, k3);
	assert_int_equal(store_put_commit(s, res), -ENOLINK); /* its parent is gone */
	store_release(s, r1.block);
	st = stats_of(s);
	assert_int_equal(st.used_bytes, 0);
	assert_int_equal(st.pinned_removed_bytes, 0);
	assert_int_equal(st.free_bytes, 8 * PAGE);
	assert_check(s);
	store_close(s);
}

struct releaser {
	struct store *s;
	struct store_block *b;
};

static void *release_in_thread(void *arg)
{
	struct releaser *r = arg;

	store_release(r->s, r->b);
	return NULL;
}

/* store_release works from another thread, including the final free. */
static void test_release_other_thread(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	struct releaser r = { .s = s };
	struct store_ref ref;
	pthread_t t;

	(void)state;
	key_of(1, key);
	assert_int_equal(put_id(s, ns, 1, 0, 100), 0);
	assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
	assert_int_equal(store_delete(s, ns, key, NULL), 0);
	r.b = ref.block;
	assert_int_equal(pthread_create(&t, NULL, release_in_thread, &r), 0);
	pthread_join(t, NULL);
	assert_int_equal(stats_of(s).free_bytes, 16 * PAGE);
	assert_check(s);
	store_close(s);
}

static void test_drop_namespace(void **state)
{
	struct store *s = open_store(64 * PAGE, 2 * PAGE, 0, 60000);
	uint32_t a = ns_of(s, "a"), b = ns_of(s, "b"), matched;
	struct store_lessee *l = store_lessee_new(s);
	uint8_t keys[3][STORE_KEY_BYTES];
	uint64_t ids[3] = { 1, 2, 3 }, blocks = 0, bytes = 0;
	struct store_ref ref;

	(void)state;
	for (uint64_t i = 1; i <= 3; i++) {
		assert_int_equal(put_id(s, a, i, i - 1, 1000 * i), 0);
		assert_int_equal(put_id(s, b, i, i - 1, 1000 * i), 0);
	}
	assert_int_equal(put_id(s, a, 10, 1, 500), 0);
	assert_int_equal(put_id(s, a, 20, 0, 500), 0);
	keys_of(ids, 3, keys);
	assert_int_equal(store_match(s, a, keys, 3, 1000, l, &matched, NULL), 0);
	assert_int_equal(store_get(s, a, keys[0], NULL, &ref), 0);
	assert_int_equal(store_drop_namespace(s, a, &blocks, &bytes), 0);
	assert_int_equal(blocks, 5);
	assert_int_equal(bytes, 7000);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_int_equal(ns_stats_of(s, a).blocks, 0);
	assert_int_equal(ns_stats_of(s, a).bytes, 0);
	assert_int_equal(ns_stats_of(s, b).blocks, 3);
	assert_true(stored(s, b, 3));
	assert_false(stored(s, a, 1));
	assert_true(payload_ok(ref.data, 1000, keys[0]));
	assert_check(s);
	store_release(s, ref.block);
	/* the namespace stays usable */
	assert_int_equal(put_id(s, a, 1, 0, 100), 0);
	assert_int_equal(store_drop_namespace(s, a, NULL, NULL), 0);
	assert_int_equal(store_drop_namespace(s, 99, &blocks, &bytes), -ENOENT);
	assert_int_equal(blocks, 5);
	assert_check(s);
	store_lessee_free(s, l);
	store_close(s);
}

/* ---- store_present: a look without effects ---- */

/* store_present counts the leading keys held, like store_match, but
 * marks nothing used (eviction order unchanged), counts nothing and
 * leases nothing; an unknown namespace holds nothing. */
static void test_present_has_no_effect(void **state)
{
	struct store *s = open_store(4 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "p"), present = 99;
	uint64_t ids[4] = { 1, 2, 3, 4 }, first = 1;
	uint8_t keys[4][STORE_KEY_BYTES], k1[1][STORE_KEY_BYTES];
	struct store_ns_stats before, after;

	(void)state;
	for (uint64_t i = 1; i <= 3; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, PAGE), 0);
	assert_int_equal(put_id(s, ns, 50, 0, PAGE), 0); /* the newest leaf */
	keys_of(ids, 4, keys);
	before = ns_stats_of(s, ns);
	assert_int_equal(store_present(s, ns, keys, 4, &present), 0);
	assert_int_equal(present, 3);
	assert_int_equal(store_present(s, ns, keys + 1, 3, &present), 0);
	assert_int_equal(present, 2);
	assert_int_equal(store_present(s, ns, keys + 3, 1, &present), 0);
	assert_int_equal(present, 0);
	assert_int_equal(store_present(s, ns + 100, keys, 4, &present), 0);
	assert_int_equal(present, 0);
	after = ns_stats_of(s, ns);
	assert_int_equal(after.match_requests, before.match_requests);
	assert_int_equal(after.match_blocks_queried, before.match_blocks_queried);
	assert_int_equal(after.exists_hits, before.exists_hits);
	assert_int_equal(after.exists_misses, before.exists_misses);
	assert_int_equal(after.get_hits, before.get_hits);
	assert_int_equal(stats_of(s).leases_active, 0);
	/* not a use: the chain's leaf 3 is still older than leaf 50, so a
	 * full arena evicts 3 first (a MATCH of 1..3 would have made 50 go) */
	keys_of(&first, 1, k1);
	for (int i = 0; i < 3; i++)
		assert_int_equal(store_present(s, ns, keys, 3, &present), 0);
	assert_int_equal(put_id(s, ns, 60, 0, PAGE), 0);
	assert_false(stored(s, ns, 3));
	assert_true(stored(s, ns, 50));
	assert_int_equal(store_present(s, ns, keys, 4, &present), 0);
	assert_int_equal(present, 2);
	assert_int_equal(store_present(s, ns, k1, 1, &present), 0);
	assert_int_equal(present, 1);
	assert_check(s);
	store_close(s);
}

/* ---- MATCH and leases ---- */

static void test_match_prefix(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "m"), matched = 9, granted = 9;
	uint64_t ids[5] = { 1, 2, 3, 4, 5 };
	uint8_t keys[5][STORE_KEY_BYTES];
	struct store_ns_stats nst;

	(void)state;
	for (uint64_t i = 1; i <= 3; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 10), 0);
	assert_int_equal(put_id(s, ns, 5, 0, 10), 0);
	keys_of(ids, 5, keys);
	assert_int_equal(store_match(s, ns, keys, 5, 0, NULL, &matched, &granted), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(granted, 0);
	assert_int_equal(store_match(s, ns, keys + 3, 2, 0, NULL, &matched, NULL), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(store_match(s, ns, keys, 0, 0, NULL, &matched, NULL), 0);
	assert_int_equal(matched, 0);
	matched = 9;
	assert_int_equal(store_match(s, 42, keys, 5, 0, NULL, &matched, NULL), -EINVAL);
	assert_int_equal(matched, 9);
	nst = ns_stats_of(s, ns);
	assert_int_equal(nst.match_requests, 3);
	assert_int_equal(nst.match_blocks_queried, 7);
	assert_int_equal(nst.match_blocks_matched, 3);
	store_close(s);
}

/* store_match_ex with options: today's answer (no lease cut, no
 * retention) and store_match as its wrapper; the PUT retention seam
 * answers "no retention". */
static void test_match_ex_and_retain_seam(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "mx"), matched = 0, granted = 0;
	uint64_t ids[4] = { 1, 2, 3, 9 };
	uint8_t keys[4][STORE_KEY_BYTES];
	struct store_lessee *l = store_lessee_new(s);
	struct store_match_opts o = { .lease_ms = 5000, .retain_ms = 60000, .lessee = l };
	struct store_match_res r;
	struct store_retain_res rr = { 7, 7 };

	(void)state;
	assert_non_null(l);
	for (uint64_t i = 1; i <= 3; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 10), 0);
	keys_of(ids, 4, keys);
	memset(&r, 0xee, sizeof(r));
	assert_int_equal(store_match_ex(s, ns, keys, 4, &o, &r), 0);
	assert_int_equal(r.matched, 3);
	assert_int_equal(r.present, 3);
	assert_int_equal(r.lease_ms, 1000); /* capped at max_lease_ms */
	/* this pool grants no retention (max_retain_ms 0): asked, cut to 0
	 * (test_retain.c has retention itself) */
	assert_int_equal(r.retained, 0);
	assert_int_equal(r.retain_ms, 0);
	assert_int_equal(r.flags, STORE_MATCH_RETAIN_CLAMPED);
	assert_int_equal(store_lessee_leased_bytes(s, l), 30);
	assert_int_equal(store_match(s, ns, keys, 4, 100, l, &matched, &granted), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(granted, 100);
	/* no lessee, no options: no lease */
	assert_int_equal(store_match_ex(s, ns, keys + 3, 1, NULL, &r), 0);
	assert_int_equal(r.matched, 0);
	assert_int_equal(r.lease_ms, 0);
	memset(&r, 0xee, sizeof(r));
	assert_int_equal(store_match_ex(s, 42, keys, 4, &o, &r), -EINVAL);
	assert_int_equal(r.matched, 0xeeeeeeeeu); /* written only on success */
	/* the PUT retention seam: stored, but this pool grants none */
	assert_int_equal(store_put_retain(s, ns, keys[0], 60000, &rr), 0);
	assert_int_equal(rr.retain_ms, 0);
	assert_int_equal(rr.flags, STORE_PUT_RETAIN_CLAMPED);
	assert_int_equal(store_put_retain(s, ns, keys[0], 60000, NULL), 0);
	assert_int_equal(store_put_retain(s, ns, keys[3], 60000, &rr), -ENOENT);
	assert_int_equal(store_put_retain(s, 42, keys[0], 60000, &rr), -EINVAL);
	store_lessee_free(s, l);
	store_close(s);
}

/* ---- MATCH without the lock, racing puts that evict ---- */

#define RACE_CHAIN 8u

struct match_race {
	struct store *s;
	uint32_t ns;
	uint64_t first_id;       /* the chain is first_id .. first_id + 7 */
	volatile bool *stop;
	uint64_t rounds, full;   /* MATCHes, and those that matched all */
	const char *failed;      /* set by the thread on a broken promise */
};

/* Put the missing tail of the chain from block `from` on; stop at the
 * first put the pool refuses (full of pinned blocks: try later). */
static void race_reput(struct match_race *r, uint32_t from)
{
	for (uint32_t i = from; i < RACE_CHAIN; i++) {
		uint64_t id = r->first_id + i;
		int rc = put_id(r->s, r->ns, id, i ? id - 1 : 0, PAGE);

		if (rc && rc != -EEXIST)
			return;
	}
}

/* MATCH the chain with a lease, then GET every matched block: a block
 * MATCH leased must still be there (evictions run all the while). */
static void *match_racer(void *arg)
{
	struct match_race *r = arg;
	struct store_lessee *l = store_lessee_new(r->s);
	uint8_t keys[RACE_CHAIN][STORE_KEY_BYTES];

	if (!l) {
		r->failed = "no lessee";
		return NULL;
	}
	for (uint32_t i = 0; i < RACE_CHAIN; i++)
		key_of(r->first_id + i, keys[i]);
	while (!*r->stop && !r->failed) {
		uint32_t n = 0, granted = 0;

		if (store_match(r->s, r->ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, RACE_CHAIN,
				10000, l, &n, &granted)) {
			r->failed = "match failed";
			break;
		}
		for (uint32_t i = 0; i < n; i++) {
			struct store_ref ref;

			if (store_get(r->s, r->ns, keys[i], l, &ref) != 0) {
				r->failed = "a leased block was evicted";
				break;
			}
			if (!payload_ok(ref.data, ref.length, keys[i]))
				r->failed = "a leased block has the wrong bytes";
			store_release(r->s, ref.block);
		}
		r->rounds++;
		r->full += n == RACE_CHAIN;
		race_reput(r, n);
	}
	store_lessee_free(r->s, l);
	return NULL;
}

/* Fill the pool with fresh one-page blocks, evicting all the time. */
static void *evict_churn(void *arg)
{
	struct match_race *r = arg;

	for (uint64_t id = 1000000; !*r->stop; id++) {
		int rc = put_id(r->s, r->ns, id, 0, PAGE);

		if (rc && rc != -ENOSPC && rc != -EAGAIN) {
			r->failed = "churn put failed";
			break;
		}
		__atomic_add_fetch(&r->rounds, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_match_races_evictions(void **state)
{
	/* 48 pages: two chains of 8 and room for 32 churn blocks */
	struct store *s = open_store(48 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "race");
	volatile bool stop = false;
	struct match_race r[3] = {
		{ .s = s, .ns = ns, .first_id = 1, .stop = &stop },
		{ .s = s, .ns = ns, .first_id = 100, .stop = &stop },
		{ .s = s, .ns = ns, .stop = &stop },
	};
	pthread_t t[3];
	struct store_stats st;

	(void)state;
	race_reput(&r[0], 0);
	race_reput(&r[1], 0);
	for (int k = 0; k < 3; k++)
		assert_int_equal(pthread_create(&t[k], NULL, k < 2 ? match_racer : evict_churn,
						&r[k]), 0);
	/* run until each matcher did enough rounds (bounded: 20 s at most) */
	for (int ms = 0; ms < 20000; ms += 10) {
		if (r[0].rounds > 20000 && r[1].rounds > 20000 && r[2].rounds > 20000)
			break;
		usleep(10000);
	}
	stop = true;
	for (int k = 0; k < 3; k++)
		pthread_join(t[k], NULL);
	for (int k = 0; k < 3; k++)
		if (r[k].failed)
			fail_msg("thread %d: %s", k, r[k].failed);
	printf("match races: %llu + %llu matches (%llu + %llu full), %llu churn puts\n",
	       (unsigned long long)r[0].rounds, (unsigned long long)r[1].rounds,
	       (unsigned long long)r[0].full, (unsigned long long)r[1].full,
	       (unsigned long long)r[2].rounds);
	assert_true(r[0].full > 0 && r[1].full > 0);
	st = stats_of(s);
	assert_true(st.evictions > 0);
	assert_int_equal(st.leases_active, 0); /* every lessee freed */
	assert_check(s);
	store_close(s);
}

/* A MATCH that completes while an eviction pass holds the lock, before
 * the pass decides (the window a lock-free reader can hit): the lease it
 * was granted must keep its block from being the victim. */
struct window_match {
	struct store *s;
	uint32_t ns;
	struct store_lessee *l;
	uint8_t key[STORE_KEY_BYTES];
	pthread_t thread;
	uint32_t matched;
	int rc, fired;
};

static void *window_match_thread(void *arg)
{
	struct window_match *w = arg;
	uint32_t granted = 0;

	w->rc = store_match(w->s, w->ns, (const uint8_t (*)[STORE_KEY_BYTES])w->key, 1, 10000,
			    w->l, &w->matched, &granted);
	return NULL;
}

/* The eviction hook: run the MATCH in another thread and wait for it
 * (it must not need the lock this thread holds). */
static void window_hook(void *arg)
{
	struct window_match *w = arg;

	if (w->fired++)
		return;
	assert_int_equal(pthread_create(&w->thread, NULL, window_match_thread, w), 0);
	pthread_join(w->thread, NULL);
}

static void test_match_lease_in_eviction_window(void **state)
{
	struct store *s = open_store(4 * PAGE, PAGE, 0, 60000);
	struct window_match w = { .s = s, .ns = ns_of(s, "w") };
	struct store_ref ref;
	uint8_t other[STORE_KEY_BYTES];
	uint32_t n = 0;

	(void)state;
	w.l = store_lessee_new(s);
	assert_non_null(w.l);
	/* block 1 is the least recently used of four: the next victim */
	for (uint64_t id = 1; id <= 4; id++)
		assert_int_equal(put_id(s, w.ns, id, 0, PAGE), 0);
	key_of(1, w.key);
	/* the matching thread's first MATCH registers its log (that takes
	 * the lock once); later ones do not */
	assert_int_equal(pthread_create(&w.thread, NULL, window_match_thread, &w), 0);
	pthread_join(w.thread, NULL);
	assert_int_equal(w.rc, 0);
	assert_int_equal(w.matched, 1);
	store_lessee_free(s, w.l);
	w.l = store_lessee_new(s);
	assert_non_null(w.l);
	/* recency back to: 1 oldest */
	for (uint64_t id = 2; id <= 4; id++) {
		key_of(id, other);
		assert_int_equal(store_match(s, w.ns, (const uint8_t (*)[STORE_KEY_BYTES])other, 1,
					     0, NULL, &n, NULL), 0);
	}
	w.fired = 0;
	store_debug_evict_hook(s, window_hook, &w);
	assert_int_equal(put_id(s, w.ns, 5, 0, PAGE), 0); /* evicts one block */
	store_debug_evict_hook(s, NULL, NULL);
	assert_int_equal(w.fired, 1);
	assert_int_equal(w.rc, 0);
	assert_int_equal(w.matched, 1);
	/* the leased block stayed; another one went */
	assert_int_equal(store_get(s, w.ns, w.key, w.l, &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).evictions, 1);
	assert_check(s);
	store_lessee_free(s, w.l);
	store_close(s);
}

/* A lessee that matches the same chain again only extends its leases:
 * the lease records its MATCHes took are reused, not piled up. */
static void test_match_lease_records_reused(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "again"), n = 0, granted = 0;
	struct store_lessee *l = store_lessee_new(s);
	uint64_t ids[16];
	uint8_t keys[16][STORE_KEY_BYTES];
	uint64_t bytes_after_two = 0;

	(void)state;
	assert_non_null(l);
	for (uint64_t i = 0; i < 16; i++) {
		ids[i] = i + 1;
		assert_int_equal(put_id(s, ns, i + 1, i, PAGE), 0);
	}
	keys_of(ids, 16, keys);
	for (int round = 0; round < 200; round++) {
		assert_int_equal(store_match(s, ns, keys, 16, 5000, l, &n, &granted), 0);
		assert_int_equal(n, 16);
		assert_int_equal(granted, 5000);
		if (round == 1)
			bytes_after_two = stats_of(s).index_bytes;
	}
	assert_int_equal(stats_of(s).leases_active, 16);
	assert_int_equal(stats_of(s).index_bytes, bytes_after_two);
	assert_check(s);
	/* MATCH then GET, the usual pattern: every lease is granted anew and
	 * ends at the GET; the records of ended leases are used again */
	for (int round = 0; round < 200; round++) {
		assert_int_equal(store_match(s, ns, keys, 16, 5000, l, &n, &granted), 0);
		assert_int_equal(n, 16);
		for (int i = 0; i < 16; i++) {
			struct store_ref ref;

			assert_int_equal(store_get(s, ns, keys[i], l, &ref), 0);
			store_release(s, ref.block);
		}
		assert_int_equal(stats_of(s).leases_active, 0);
		if (round == 1)
			bytes_after_two = stats_of(s).index_bytes;
	}
	assert_int_equal(stats_of(s).index_bytes, bytes_after_two);
	assert_check(s);
	store_lessee_free(s, l);
	assert_int_equal(stats_of(s).leases_active, 0);
	store_close(s);
}

/* MATCH readers keep finding a chain while puts grow the index's bucket
 * array under them (each growth publishes a new array and frees the old
 * one only after the readers left their read sections). */
struct grow_reader {
	struct store *s;
	uint32_t ns;
	volatile bool *stop;
	uint64_t rounds;
	const char *failed;
};

static void *grow_reader_thread(void *arg)
{
	struct grow_reader *r = arg;
	uint64_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint8_t keys[8][STORE_KEY_BYTES];

	keys_of(ids, 8, keys);
	while (!*r->stop) {
		uint32_t n = 0;

		if (store_match(r->s, r->ns, keys, 8, 0, NULL, &n, NULL) != 0 || n != 8) {
			__atomic_store_n(&r->failed, "the chain was not matched whole", __ATOMIC_RELAXED);
			break;
		}
		__atomic_fetch_add(&r->rounds, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_match_while_index_grows(void **state)
{
	/* 4096 pages: the index starts at 1024 buckets and grows to 4096 */
	struct store *s = open_store(4096 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "grow");
	volatile bool stop = false;
	struct grow_reader r[2] = {
		{ .s = s, .ns = ns, .stop = &stop },
		{ .s = s, .ns = ns, .stop = &stop },
	};
	pthread_t t[2];
	uint64_t before;

	(void)state;
	for (uint64_t id = 1; id <= 8; id++)
		assert_int_equal(put_id(s, ns, id, id - 1, 16), 0);
	before = stats_of(s).index_bytes;
	for (int k = 0; k < 2; k++)
		assert_int_equal(pthread_create(&t[k], NULL, grow_reader_thread, &r[k]), 0);
	/* Both readers must be reading before the index grows: on a loaded
	 * machine a new thread may not run for a while (bounded: 10 s; a
	 * reader that failed ends the wait, its message is reported below). */
	for (int i = 0; i < 10000; i++) {
		bool ready = true;
		for (int k = 0; k < 2; k++)
			if (!__atomic_load_n(&r[k].rounds, __ATOMIC_RELAXED) &&
			    !__atomic_load_n(&r[k].failed, __ATOMIC_RELAXED))
				ready = false;
		if (ready)
			break;
		usleep(1000);
	}
	for (uint64_t id = 100; id < 100 + 4000; id++)
		assert_int_equal(put_id(s, ns, id, 0, 16), 0);
	stop = true;
	for (int k = 0; k < 2; k++) {
		pthread_join(t[k], NULL);
		if (r[k].failed)
			fail_msg("reader %d: %s", k, r[k].failed);
		assert_true(r[k].rounds > 0);
	}
	/* the bucket array did grow while they read */
	assert_true(stats_of(s).index_bytes > before + 3 * 1024 * sizeof(uint32_t));
	assert_check(s);
	store_close(s);
}

static void test_lease_lifecycle(void **state)
{
	struct store *s = open_store(64 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "m"), matched, granted = 7;
	struct store_lessee *l1 = store_lessee_new(s), *l2 = store_lessee_new(s);
	uint64_t ids[4] = { 1, 2, 3, 4 };
	uint8_t keys[4][STORE_KEY_BYTES];
	struct store_ref ref;

	(void)state;
	assert_non_null(l1);
	assert_non_null(l2);
	for (uint64_t i = 1; i <= 3; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 10), 0);
	keys_of(ids, 4, keys);
	/* capped to max_lease_ms; only matched blocks are leased */
	assert_int_equal(store_match(s, ns, keys, 4, 60000, l1, &matched, &granted), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(granted, 1000);
	assert_int_equal(stats_of(s).leases_active, 3);
	/* a second MATCH by the same lessee extends, it does not add pins */
	assert_int_equal(store_match(s, ns, keys, 4, 500, l1, &matched, &granted), 0);
	assert_int_equal(granted, 500);
	assert_int_equal(stats_of(s).leases_active, 3);
	/* no lessee or nothing matched: nothing leased */
	assert_int_equal(store_match(s, ns, keys, 4, 500, NULL, &matched, &granted), 0);
	assert_int_equal(granted, 0);
	assert_int_equal(store_match(s, ns, keys + 3, 1, 500, l1, &matched, &granted), 0);
	assert_int_equal(granted, 0);
	assert_int_equal(stats_of(s).leases_active, 3);
	/* another lessee's leases are its own */
	assert_int_equal(store_match(s, ns, keys, 1, 500, l2, &matched, &granted), 0);
	assert_int_equal(stats_of(s).leases_active, 4);
	/* a GET through a lessee ends that lessee's pin on that block */
	assert_int_equal(store_get(s, ns, keys[0], l1, &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).leases_active, 3);
	assert_int_equal(store_get(s, ns, keys[1], NULL, &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).leases_active, 3);
	assert_check(s);
	/* DELETE ends leases on what it removes */
	assert_int_equal(store_delete(s, ns, keys[2], NULL), 0);
	assert_int_equal(stats_of(s).leases_active, 2);
	assert_check(s);
	store_lessee_free(s, l1);
	assert_int_equal(stats_of(s).leases_active, 1);
	store_lessee_free(s, l2);
	store_lessee_free(s, NULL);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_check(s);
	store_close(s);
}

/* Many leases from several lessees on one long chain: the table of leases
 * by block grows while leases are active and keeps every pin findable -
 * by the lessee's GET, by DELETE of a subtree and by freeing a lessee. */
static void test_many_leases(void **state)
{
	enum { N = 600, LESSEES = 3 };
	struct store *s = open_store((N + 8) * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "m"), matched, granted;
	struct store_lessee *l[LESSEES];
	uint64_t ids[N];
	uint8_t (*keys)[STORE_KEY_BYTES] = malloc(N * STORE_KEY_BYTES);
	struct store_ref ref;

	(void)state;
	assert_non_null(keys);
	for (uint64_t i = 0; i < N; i++) {
		ids[i] = i + 1;
		assert_int_equal(put_id(s, ns, i + 1, i, 10), 0);
	}
	keys_of(ids, N, keys);
	for (int k = 0; k < LESSEES; k++) {
		l[k] = store_lessee_new(s);
		assert_non_null(l[k]);
		/* lessee k leases a longer prefix each: N/3, 2N/3, N */
		assert_int_equal(store_match(s, ns, keys, (uint32_t)(N * (k + 1) / LESSEES), 60000,
					     l[k], &matched, &granted), 0);
		assert_int_equal(matched, N * (k + 1) / LESSEES);
		assert_check(s);
	}
	assert_int_equal(stats_of(s).leases_active, N / 3 + 2 * N / 3 + N);
	/* lessee 0's GET ends only its own pin */
	assert_int_equal(store_get(s, ns, keys[0], l[0], &ref), 0);
	store_release(s, ref.block);
	assert_int_equal(stats_of(s).leases_active, N / 3 + 2 * N / 3 + N - 1);
	assert_check(s);
	/* DELETE of the second half ends every lease on it */
	assert_int_equal(store_delete(s, ns, keys[N / 2], NULL), 0);
	assert_int_equal(stats_of(s).leases_active, N / 3 - 1 + N / 2 + N / 2);
	assert_check(s);
	store_lessee_free(s, l[1]);
	assert_int_equal(stats_of(s).leases_active, N / 3 - 1 + N / 2);
	assert_check(s);
	store_lessee_free(s, l[0]);
	store_lessee_free(s, l[2]);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_check(s);
	free(keys);
	store_close(s);
}

/* Leases run out: store_tick ends them, and so does a PUT needing space.
 * Sleeps are generous multiples of the lease so load cannot flip them. */
static void test_lease_expiry(void **state)
{
	struct store *s = open_store(4 * PAGE, PAGE, 0, 250);
	uint32_t ns = ns_of(s, "m"), matched, granted;
	struct store_lessee *l = store_lessee_new(s);
	uint64_t ids[4] = { 1, 2, 3, 4 };
	uint8_t keys[4][STORE_KEY_BYTES];

	(void)state;
	for (uint64_t i = 0; i < 4; i++)
		assert_int_equal(put_id(s, ns, ids[i], 0, PAGE), 0);
	keys_of(ids, 4, keys);
	assert_int_equal(store_match(s, ns, keys, 4, 1000, l, &matched, &granted), 0);
	assert_int_equal(granted, 250);
	assert_int_equal(stats_of(s).leases_active, 4);
	assert_int_equal(put_id(s, ns, 9, 0, PAGE), -ENOSPC);
	sleep_ms(400);
	assert_int_equal(store_tick(s), 4);
	assert_int_equal(store_tick(s), 0);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_check(s);

	/* without a tick: the PUT that needs space ends expired leases itself */
	assert_int_equal(store_match(s, ns, keys, 4, 20, l, &matched, &granted), 0);
	assert_int_equal(matched, 4);
	assert_int_equal(granted, 20);
	sleep_ms(100);
	assert_int_equal(put_id(s, ns, 9, 0, PAGE), 0);
	assert_int_equal(stats_of(s).evictions, 1);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_check(s);

	/* and store_stats reports expired leases as ended */
	assert_int_equal(store_match(s, ns, keys + 1, 3, 20, l, &matched, &granted), 0);
	assert_int_equal(matched, 3);
	sleep_ms(100);
	assert_int_equal(stats_of(s).leases_active, 0);
	assert_check(s);
	store_lessee_free(s, l);
	store_close(s);
}

/* store_close frees lessees and their leases with the pool. */
static void test_close_with_leases(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 1000);
	uint32_t ns = ns_of(s, "m"), matched;
	uint8_t keys[1][STORE_KEY_BYTES];
	uint64_t id = 1;

	(void)state;
	assert_int_equal(put_id(s, ns, 1, 0, 10), 0);
	keys_of(&id, 1, keys);
	assert_non_null(store_lessee_new(s));
	assert_int_equal(store_match(s, ns, keys, 1, 500, store_lessee_new(s), &matched, NULL), 0);
	assert_int_equal(stats_of(s).leases_active, 1);
	store_close(s);
}

/* ---- the checker itself ---- */

static void test_check_detects_hole(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "m");
	uint8_t key[STORE_KEY_BYTES];
	char why[256];

	(void)state;
	for (uint64_t i = 1; i <= 3; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 100), 0);
	assert_int_equal(store_check(s, why, sizeof(why)), 0);
	key_of(9, key);
	assert_int_equal(store_debug_remove_one(s, ns, key), -ENOENT);
	key_of(2, key);
	assert_int_equal(store_debug_remove_one(s, ns, key), 0);
	assert_true(stored(s, ns, 3));
	assert_int_equal(store_check(s, why, sizeof(why)), -EFAULT);
	assert_non_null(strstr(why, "hole"));
	assert_int_equal(store_check(s, NULL, 0), -EFAULT);
	printf("store_check on a hole: %s\n", why);
	store_close(s);
}

/* ---- random operation sequences ---- */

#define R_IDS 400
#define R_HELD 8
#define R_LESSEES 3
#define R_PENDING 6

struct model_block {
	uint32_t ns;
	uint64_t parent; /* id, 0 = first block */
	uint64_t len;
};

struct held {
	struct store_ref ref;
	uint64_t id;
};

struct pending {
	struct store_block *b;
	void *dst;
	uint64_t id;
	bool corrupt;
};

struct rnd_state {
	struct store *s;
	uint32_t ns[2];
	uint64_t rng;
	struct model_block ids[R_IDS + 1];
	uint64_t nids;
	struct held held[R_HELD];
	uint32_t nheld;
	struct store_lessee *lessee[R_LESSEES];
	bool leased[R_LESSEES][R_IDS + 1]; /* model of lease pins */
	struct pending pend[R_PENDING];
	uint32_t npend;
	uint64_t counts[16];
};

static uint64_t rr(struct rnd_state *st, uint64_t n)
{
	st->rng = mix64(st->rng);
	return st->rng % n;
}

static uint64_t model_leases(struct rnd_state *st)
{
	uint64_t n = 0;

	for (int l = 0; l < R_LESSEES; l++)
		for (uint64_t i = 1; i <= st->nids; i++)
			n += st->leased[l][i];
	return n;
}

static bool is_descendant(struct rnd_state *st, uint64_t id, uint64_t root)
{
	for (uint64_t cur = id; cur; cur = st->ids[cur].parent)
		if (cur == root)
			return true;
	return false;
}

/* Forget model leases on root and every descendant of it. */
static void model_unlease_tree(struct rnd_state *st, uint64_t root)
{
	for (uint64_t i = 1; i <= st->nids; i++)
		if (is_descendant(st, i, root))
			for (int l = 0; l < R_LESSEES; l++)
				st->leased[l][i] = false;
}

/* After -ENOSPC every stored block must be pinned: leased, referenced,
 * the parent of a stored block, of a pending reservation or of the put
 * that failed (pinned while it looked for space). */
static void assert_nothing_evictable(struct rnd_state *st, uint64_t putting)
{
	for (uint64_t i = 1; i <= st->nids; i++) {
		bool pinned = st->ids[putting].parent == i;

		if (!stored(st->s, st->ids[i].ns, i))
			continue;
		for (int l = 0; l < R_LESSEES; l++)
			pinned |= st->leased[l][i];
		for (uint32_t h = 0; h < st->nheld; h++)
			pinned |= st->held[h].id == i;
		for (uint32_t p = 0; p < st->npend; p++)
			pinned |= st->ids[st->pend[p].id].parent == i;
		for (uint64_t c = 1; c <= st->nids && !pinned; c++)
			pinned |= st->ids[c].parent == i && stored(st->s, st->ids[c].ns, c);
		assert_true(pinned);
	}
}

/* Pick a new id (sometimes an old one again) and put it, maybe leaving
 * the reservation pending. */
static void r_put(struct rnd_state *st)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	struct pending p = { 0 };
	struct model_block *m;
	uint64_t id;
	int rc;

	if (st->nids < R_IDS && (st->nids < 10 || rr(st, 4))) {
		id = ++st->nids;
		m = &st->ids[id];
		m->ns = st->ns[rr(st, 2)];
		m->parent = 0;
		if (id > 1 && rr(st, 4)) {
			/* mostly recent ids, so chains grow long */
			uint64_t back = 1 + rr(st, id - 1 < 12 ? id - 1 : 12);
			uint64_t cand = rr(st, 8) ? id - back : 1 + rr(st, id - 1);

			if (st->ids[cand].ns == m->ns)
				m->parent = cand;
		}
		m->len = 1 + rr(st, 6 * PAGE);
	} else {
		id = 1 + rr(st, st->nids);
		m = &st->ids[id];
	}
	key_of(id, key);
	if (m->parent)
		key_of(m->parent, parent);
	rc = store_put_begin(st->s, m->ns, key, m->parent ? parent : NULL, 0, m->len,
			     payload_sum(m->len, key), &p.b, &p.dst);
	assert_true(rc == 0 || rc == -EEXIST || rc == -ENOLINK || rc == -ENOSPC ||
		    rc == -EAGAIN);
	st->counts[-rc & 15]++;
	if (rc == -ENOSPC)
		assert_nothing_evictable(st, id);
	if (rc)
		return;
	p.id = id;
	fill_payload(p.dst, m->len, key);
	p.corrupt = rr(st, 50) == 0;
	if (p.corrupt)
		((uint8_t *)p.dst)[rr(st, m->len)] ^= 1;
	if (st->npend < R_PENDING && rr(st, 3) == 0) {
		st->pend[st->npend++] = p;
		return;
	}
	rc = store_put_commit(st->s, p.b);
	assert_true(rc == (p.corrupt ? -EBADMSG : 0) || (!p.corrupt && rc == -EEXIST));
}

/* Commit or abort one pending reservation. */
static void r_finish_pending(struct rnd_state *st)
{
	uint32_t i;
	struct pending p;
	int rc;

	if (!st->npend)
		return;
	i = (uint32_t)rr(st, st->npend);
	p = st->pend[i];
	st->pend[i] = st->pend[--st->npend];
	if (rr(st, 4) == 0) {
		store_put_abort(st->s, p.b);
		return;
	}
	rc = store_put_commit(st->s, p.b);
	if (p.corrupt)
		assert_int_equal(rc, -EBADMSG);
	else
		/* the parent may have been deleted meanwhile: -ENOLINK */
		assert_true(rc == 0 || rc == -EEXIST || rc == -ENOLINK);
}

static void r_get(struct rnd_state *st)
{
	uint64_t id = 1 + rr(st, st->nids);
	struct model_block *m = &st->ids[id];
	int li = (int)rr(st, R_LESSEES + 1);
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;
	int rc;

	key_of(id, key);
	rc = store_get(st->s, m->ns, key, li < R_LESSEES ? st->lessee[li] : NULL, &ref);
	if (rc) {
		assert_int_equal(rc, -ENOENT);
		/* a leased block cannot be missing */
		for (int l = 0; l < R_LESSEES; l++)
			assert_false(st->leased[l][id]);
		return;
	}
	if (li < R_LESSEES)
		st->leased[li][id] = false;
	assert_int_equal(ref.length, m->len);
	assert_true(payload_ok(ref.data, ref.length, key));
	assert_int_equal(ref.checksum, payload_sum(m->len, key));
	if (st->nheld < R_HELD && rr(st, 2)) {
		st->held[st->nheld].ref = ref;
		st->held[st->nheld++].id = id;
	} else {
		store_release(st->s, ref.block);
	}
}

static void r_release(struct rnd_state *st)
{
	uint32_t i;
	uint8_t key[STORE_KEY_BYTES];

	if (!st->nheld)
		return;
	i = (uint32_t)rr(st, st->nheld);
	key_of(st->held[i].id, key);
	assert_true(payload_ok(st->held[i].ref.data, st->held[i].ref.length, key));
	store_release(st->s, st->held[i].ref.block);
	st->held[i] = st->held[--st->nheld];
}

/* MATCH the chain ending at a random id, leasing with a random lessee. */
static void r_match(struct rnd_state *st)
{
	uint64_t chain[64], id = 1 + rr(st, st->nids);
	uint8_t (*keys)[STORE_KEY_BYTES];
	uint32_t n = 0, matched, granted;
	int li = (int)rr(st, R_LESSEES + 1);
	bool lease = li < R_LESSEES && rr(st, 2);

	for (uint64_t cur = id; cur && n < 64; cur = st->ids[cur].parent)
		chain[n++] = cur;
	keys = malloc(n * sizeof(*keys));
	assert_non_null(keys);
	for (uint32_t i = 0; i < n; i++)
		key_of(chain[n - 1 - i], keys[i]);
	assert_int_equal(store_match(st->s, st->ids[id].ns, keys, n, lease ? 60000 : 0,
				     lease ? st->lessee[li] : NULL, &matched, &granted), 0);
	assert_true(matched <= n);
	/* no holes: the stored blocks of a chain are exactly its first `matched` */
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(stored(st->s, st->ids[id].ns, chain[n - 1 - i]), i < matched);
	for (uint32_t i = 0; lease && i < matched; i++)
		st->leased[li][chain[n - 1 - i]] = true;
	assert_int_equal(granted, lease && matched ? 60000 : 0);
	free(keys);
}

static void r_delete(struct rnd_state *st)
{
	uint64_t id = 1 + rr(st, st->nids);
	uint8_t key[STORE_KEY_BYTES];
	int rc;

	key_of(id, key);
	rc = store_delete(st->s, st->ids[id].ns, key, NULL);
	assert_true(rc == 0 || rc == -ENOENT);
	if (rc == 0)
		model_unlease_tree(st, id);
}

static void r_drop(struct rnd_state *st)
{
	uint32_t ns = st->ns[rr(st, 2)];

	assert_int_equal(store_drop_namespace(st->s, ns, NULL, NULL), 0);
	for (uint64_t i = 1; i <= st->nids; i++)
		if (st->ids[i].ns == ns)
			for (int l = 0; l < R_LESSEES; l++)
				st->leased[l][i] = false;
}

static void r_renew_lessee(struct rnd_state *st)
{
	int l = (int)rr(st, R_LESSEES);

	store_lessee_free(st->s, st->lessee[l]);
	st->lessee[l] = store_lessee_new(st->s);
	assert_non_null(st->lessee[l]);
	memset(st->leased[l], 0, sizeof(st->leased[l]));
}

/* After every step: invariants, pinned bytes, leased blocks present. */
static void r_verify(struct rnd_state *st)
{
	struct store_stats ss = stats_of(st->s);

	assert_check(st->s);
	assert_int_equal(ss.used_bytes + ss.inflight_put_bytes + ss.free_bytes, ss.capacity_bytes);
	assert_true(ss.pinned_removed_bytes <= ss.used_bytes);
	assert_int_equal(ss.leases_active, model_leases(st));
	/* referenced bytes never change (spot check; release checks all) */
	for (uint32_t i = 0; i < st->nheld; i++) {
		uint64_t len = st->held[i].ref.length < 16 ? st->held[i].ref.length : 16;
		uint8_t key[STORE_KEY_BYTES], want[16];

		key_of(st->held[i].id, key);
		fill_payload(want, 16, key);
		assert_memory_equal(st->held[i].ref.data, want, len);
	}
	for (int l = 0; l < R_LESSEES; l++)
		for (uint64_t i = 1; i <= st->nids; i++)
			if (st->leased[l][i])
				assert_true(stored(st->s, st->ids[i].ns, i));
}

static void random_run(uint64_t seed, int ops, uint64_t arena_pages)
{
	struct rnd_state *st = calloc(1, sizeof(*st));

	assert_non_null(st);
	st->s = open_store(arena_pages * PAGE, 6 * PAGE, 24 * PAGE, 60000);
	st->ns[0] = ns_of(st->s, "ns-a");
	st->ns[1] = ns_of(st->s, "ns-b");
	st->rng = seed;
	for (int l = 0; l < R_LESSEES; l++)
		st->lessee[l] = store_lessee_new(st->s);
	for (int op = 0; op < ops; op++) {
		uint64_t r = st->nids ? rr(st, 1000) : 0;

		if (r < 380)
			r_put(st);
		else if (r < 480)
			r_finish_pending(st);
		else if (r < 680)
			r_get(st);
		else if (r < 780)
			r_release(st);
		else if (r < 940)
			r_match(st);
		else if (r < 980)
			r_delete(st);
		else if (r < 983)
			r_drop(st);
		else if (r < 990)
			r_renew_lessee(st);
		else
			assert_int_equal(store_tick(st->s), 0); /* leases are long */
		r_verify(st);
	}
	while (st->npend)
		r_finish_pending(st);
	while (st->nheld)
		r_release(st);
	for (int l = 0; l < R_LESSEES; l++)
		store_lessee_free(st->s, st->lessee[l]);
	assert_int_equal(stats_of(st->s).leases_active, 0);
	assert_int_equal(stats_of(st->s).inflight_put_bytes, 0);
	assert_check(st->s);
	printf("random seed %llu, %llu pages: %d ops, put ok %llu exists %llu nolink %llu "
	       "nospc %llu again %llu, evictions %llu, blocks %llu, fragmentation %.3f\n",
	       (unsigned long long)seed, (unsigned long long)arena_pages, ops,
	       (unsigned long long)st->counts[0],
	       (unsigned long long)st->counts[EEXIST & 15],
	       (unsigned long long)st->counts[ENOLINK & 15],
	       (unsigned long long)st->counts[ENOSPC & 15],
	       (unsigned long long)st->counts[EAGAIN & 15],
	       (unsigned long long)stats_of(st->s).evictions,
	       (unsigned long long)stats_of(st->s).blocks, stats_of(st->s).fragmentation);
	assert_true(stats_of(st->s).evictions > 0);
	store_close(st->s);
	free(st);
}

static void test_random_sequences(void **state)
{
	(void)state;
	random_run(1, 4000, 96);
	random_run(2, 4000, 96);
	random_run(0xfeedface, 4000, 160);
	/* a small arena: pins and leases often leave nothing evictable */
	random_run(3, 4000, 24);
	random_run(4, 4000, 30);
}

/* ---- figures (printed, never judged on time) ---- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_print_figures(void **state)
{
	enum { N = 20000 };
	struct store *s = open_store(N * PAGE, PAGE, 0, 0);
	uint32_t ns = ns_of(s, "bench");
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;
	struct store_stats st;
	double t0, t1, t2;

	(void)state;
	t0 = now_s();
	for (uint64_t i = 1; i <= N; i++)
		assert_int_equal(put_id(s, ns, i, i % 16 ? i - 1 : 0, PAGE), 0);
	t1 = now_s();
	for (uint64_t i = 1; i <= N; i++) {
		key_of(i, key);
		assert_int_equal(store_get(s, ns, key, NULL, &ref), 0);
		store_release(s, ref.block);
	}
	t2 = now_s();
	st = stats_of(s);
	assert_int_equal(st.blocks, N);
	printf("figures: %d 4 KiB puts %.0f/s (fill + xxh3 included), gets %.0f/s, "
	       "index %.0f bytes/block\n", N, N / (t1 - t0), N / (t2 - t1),
	       (double)st.index_bytes / N);
	store_close(s);
}

/* ---- tenants: leased bytes and payload bytes over namespaces (issue 20) ---- */

/* A lessee bounded to 2 pages: a MATCH whose lease would pass the bound
 * answers the longest leading run whose lease fits and leases only that
 * (issue 28 item 2: before, -EDQUOT and the whole prefix lost); blocks
 * leased already count once; without a lease the whole run matches. */
static void test_lease_bound_per_lessee(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "m"), matched = 0, granted = 0;
	struct store_lessee *l = store_lessee_new(s);
	uint8_t keys[4][STORE_KEY_BYTES];
	uint64_t ids[4] = { 1, 2, 3, 4 };

	(void)state;
	assert_non_null(l);
	for (int i = 0; i < 4; i++)
		assert_int_equal(put_id(s, ns, ids[i], i ? ids[i - 1] : 0, PAGE), 0);
	keys_of(ids, 4, keys);
	store_lessee_limit(s, l, 2 * PAGE, NULL);
	assert_int_equal(store_match(s, ns, keys, 4, 1000, l, &matched, &granted), 0);
	assert_int_equal(matched, 2);
	assert_int_equal(granted, 1000);
	assert_int_equal(stats_of(s).leases_active, 2);
	assert_int_equal(store_lessee_leased_bytes(s, l), 2 * PAGE);
	/* the same two again: extended, no new bytes */
	assert_int_equal(store_match(s, ns, keys, 2, 1000, l, &matched, &granted), 0);
	assert_int_equal(matched, 2);
	assert_int_equal(store_lessee_leased_bytes(s, l), 2 * PAGE);
	/* full: the two it holds are answered again, nothing more */
	assert_int_equal(store_match(s, ns, keys, 3, 1000, l, &matched, &granted), 0);
	assert_int_equal(matched, 2);
	assert_int_equal(store_lessee_leased_bytes(s, l), 2 * PAGE);
	/* not even the first block of another chain fits: 0, nothing leased */
	assert_int_equal(store_match(s, ns, keys + 2, 2, 1000, l, &matched, &granted), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(granted, 0);
	assert_int_equal(stats_of(s).leases_active, 2);
	/* no lease asked: no bound */
	assert_int_equal(store_match(s, ns, keys, 4, 0, l, &matched, &granted), 0);
	assert_int_equal(matched, 4);
	assert_int_equal(stats_of(s).leases_active, 2);
	assert_check(s);
	store_lessee_free(s, l);
	assert_int_equal(stats_of(s).leases_active, 0);
	store_close(s);
}

/* Two lessees of one tenant share its max_leased_bytes; a lessee of no
 * tenant (or another) is not held back by it; ending leases frees room. */
static void test_lease_bound_per_tenant(void **state)
{
	struct store *s = open_store(16 * PAGE, PAGE, 0, 60000);
	uint32_t ns = ns_of(s, "m"), matched = 0;
	struct store_tenant *t = store_tenant_new(s, 0, 3 * PAGE);
	struct store_lessee *a = store_lessee_new(s), *b = store_lessee_new(s),
			    *other = store_lessee_new(s);
	uint8_t keys[4][STORE_KEY_BYTES];
	uint64_t ids[4] = { 11, 12, 13, 14 }, leased = 0;

	(void)state;
	assert_non_null(t);
	for (int i = 0; i < 4; i++)
		assert_int_equal(put_id(s, ns, ids[i], 0, PAGE), 0);
	keys_of(ids, 4, keys);
	store_lessee_limit(s, a, 0, t);
	store_lessee_limit(s, b, 0, t);
	assert_int_equal(store_match(s, ns, keys, 1, 1000, a, &matched, NULL), 0);
	assert_int_equal(store_match(s, ns, keys + 1, 1, 1000, a, &matched, NULL), 0);
	assert_int_equal(store_match(s, ns, keys + 2, 1, 1000, b, &matched, NULL), 0);
	store_tenant_usage(s, t, NULL, &leased);
	assert_int_equal(leased, 3 * PAGE);
	/* the tenant is full: b's MATCH is cut to 0, another tenant's is not */
	assert_int_equal(store_match(s, ns, keys + 3, 1, 1000, b, &matched, NULL), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(store_match(s, ns, keys + 3, 1, 1000, other, &matched, NULL), 0);
	assert_int_equal(matched, 1);
	store_lessee_free(s, a);
	store_tenant_usage(s, t, NULL, &leased);
	assert_int_equal(leased, PAGE);
	assert_int_equal(store_match(s, ns, keys + 3, 1, 1000, b, &matched, NULL), 0);
	assert_check(s);
	store_lessee_free(s, b);
	store_lessee_free(s, other);
	store_tenant_usage(s, t, NULL, &leased);
	assert_int_equal(leased, 0);
	store_close(s);
}

/* A tenant's max_bytes covers every namespace charged to it: a put past
 * it evicts the written namespace's own oldest leaves, never the other
 * namespace's, then answers -EDQUOT; an uncharged namespace is free. */
static void test_tenant_bytes(void **state)
{
	struct store *s = open_store(32 * PAGE, 2 * PAGE, 0, 0);
	uint32_t a = ns_of(s, "t/a"), b = ns_of(s, "t/b"), c = ns_of(s, "free");
	struct store_tenant *t = store_tenant_new(s, 4 * PAGE, 0);
	uint64_t bytes = 0;

	(void)state;
	assert_non_null(t);
	assert_int_equal(put_id(s, a, 50, 0, PAGE), 0);
	/* charging the namespace to its creator charges none of the blocks
	 * it holds already: they stay their writer's (here nobody's), so a
	 * tenant is never billed for bytes it did not write */
	assert_int_equal(store_namespace_tenant(s, a, t), 0);
	assert_int_equal(store_namespace_tenant(s, b, t), 0);
	assert_int_equal(store_namespace_tenant(s, 999999, t), -EINVAL);
	store_tenant_usage(s, t, &bytes, NULL);
	assert_int_equal(bytes, 0);
	assert_int_equal(put_id(s, a, 1, 0, PAGE), 0);
	assert_int_equal(put_id(s, a, 2, 0, PAGE), 0);
	assert_int_equal(put_id(s, a, 3, 0, PAGE), 0);
	assert_int_equal(put_id(s, b, 4, 0, PAGE), 0);
	store_tenant_usage(s, t, &bytes, NULL);
	assert_int_equal(bytes, 4 * PAGE);
	/* b is full for the tenant: b's own block 4 goes */
	assert_int_equal(put_id(s, b, 5, 0, PAGE), 0);
	assert_false(stored(s, b, 4));
	assert_true(stored(s, a, 1) && stored(s, a, 2) && stored(s, a, 3));
	/* two pages: b's only block is the new one's parent (pinned), so b
	 * cannot make room, and a's blocks are not b's to evict */
	assert_int_equal(put_id(s, b, 6, 5, 2 * PAGE), -EDQUOT);
	assert_true(stored(s, b, 5));
	/* the uncharged namespace is not limited */
	for (uint64_t i = 0; i < 8; i++)
		assert_int_equal(put_id(s, c, 100 + i, 0, PAGE), 0);
	/* deleting frees the tenant's bytes */
	{
		uint8_t key[STORE_KEY_BYTES];

		key_of(1, key);
		assert_int_equal(store_delete(s, a, key, NULL), 0);
	}
	store_tenant_usage(s, t, &bytes, NULL);
	assert_int_equal(bytes, 3 * PAGE);
	assert_check(s);
	store_close(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_lease_bound_per_lessee),
		cmocka_unit_test(test_lease_bound_per_tenant),
		cmocka_unit_test(test_tenant_bytes),
		cmocka_unit_test(test_namespaces),
		cmocka_unit_test(test_namespace_find),
		cmocka_unit_test(test_namespace_forget),
		cmocka_unit_test(test_namespace_cap),
		cmocka_unit_test(test_namespace_reclaim),
		cmocka_unit_test(test_namespace_race),
		cmocka_unit_test(test_put_get_basic),
		cmocka_unit_test(test_block_larger_than_arena),
		cmocka_unit_test(test_parent_rules),
		cmocka_unit_test(test_parent_in_batch),
		cmocka_unit_test(test_parent_pinned_during_put),
		cmocka_unit_test(test_parent_deleted_during_put),
		cmocka_unit_test(test_eexist_at_commit),
		cmocka_unit_test(test_concurrent_puts),
		cmocka_unit_test(test_checksum_failure),
		cmocka_unit_test(test_commit_hashed),
		cmocka_unit_test(test_inflight_limit),
		cmocka_unit_test(test_lru_order_among_leaves),
		cmocka_unit_test(test_aging_keeps_lru_order),
		cmocka_unit_test(test_aging_spares_reservations),
		cmocka_unit_test(test_chain_evicted_from_tail),
		cmocka_unit_test(test_namespace_quota),
		cmocka_unit_test(test_fill_98_percent),
		cmocka_unit_test(test_prefault_keeps_bytes),
		cmocka_unit_test(test_enospc_when_all_leased),
		cmocka_unit_test(test_get_pins_block),
		cmocka_unit_test(test_size_query_keeps_lease),
		cmocka_unit_test(test_delete_removes_descendants),
		cmocka_unit_test(test_delete_siblings_any_order),
		cmocka_unit_test(test_delete_deep_chain),
		cmocka_unit_test(test_headers_reused),
		cmocka_unit_test(test_delete_while_pinned),
		cmocka_unit_test(test_bytes_add_up_while_pinned),
		cmocka_unit_test(test_release_other_thread),
		cmocka_unit_test(test_drop_namespace),
		cmocka_unit_test(test_present_has_no_effect),
		cmocka_unit_test(test_match_prefix),
		cmocka_unit_test(test_match_ex_and_retain_seam),
		cmocka_unit_test(test_lease_lifecycle),
		cmocka_unit_test(test_lease_expiry),
		cmocka_unit_test(test_many_leases),
		cmocka_unit_test(test_close_with_leases),
		cmocka_unit_test(test_check_detects_hole),
		cmocka_unit_test(test_random_sequences),
		cmocka_unit_test(test_match_races_evictions),
		cmocka_unit_test(test_match_while_index_grows),
		cmocka_unit_test(test_match_lease_records_reused),
		cmocka_unit_test(test_match_lease_in_eviction_window),
		cmocka_unit_test(test_print_figures),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
