/*
 * test_tier.c - the pool with an NVMe tier, in a temporary directory with
 * small segments (1 MiB) and a small arena: demotion keeps blocks
 * matchable and byte-exact, more than DRAM holds comes back, admission,
 * no holes across tiers under churn (store_check after every step),
 * segment reclaim rewrites what must stay, warm rebuild (its orphans, and
 * the use order of blocks demoted on both sides of a clock aging pass),
 * corruption on NVMe is a counted miss that takes the descendants along,
 * a dropped namespace stays dropped, write failures fall back to DRAM
 * eviction and recover, store_get_async and store_drain.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include "nvme/nvme_index.h"
#include "store.h"
#include "debug/store_debug.h"
#include "store_fixture.h"

#define PAGE STORE_PAGE_BYTES
#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* ---- helpers ---- */

struct fixture {
	char dir[64];
	struct store_config cfg;
	struct store *s;
	uint32_t ns;
	int errors;      /* ERR log lines */
	int warns;       /* WARN log lines */
};

/* Payload derived from the key, so a wrong block shows. */
static void fill_payload(void *dst, uint64_t len, const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t *p = dst;
	uint64_t seed;

	memcpy(&seed, key, 8);
	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)mix64(seed + i / 8) ^ (uint8_t)i;
}

static void capture_log(void *arg, enum store_log_level level, const char *msg)
{
	struct fixture *f = arg;

	if (level == STORE_LOG_ERR)
		f->errors++;
	if (level == STORE_LOG_WARN)
		f->warns++;
	if (getenv("TIER_LOG"))
		fprintf(stderr, "log %d: %s\n", level, msg);
}

static void open_fixture(struct fixture *f)
{
	store_fixture_open(&f->cfg, &f->s, "model-a", &f->ns);
}

static void close_fixture(struct fixture *f)
{
	store_fixture_close(&f->s, f->ns);
}

/* A fixture: dram_bytes of arena, nvme_bytes of 1 MiB segments. */
static struct fixture *fixture_new(uint64_t dram_bytes, uint64_t nvme_bytes)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	store_fixture_tmpdir(f->dir, sizeof(f->dir), "kvpool-tier");
	f->cfg.dram_capacity_bytes = dram_bytes;
	f->cfg.max_block_bytes = 64 * KIB;
	f->cfg.max_lease_ms = 5000;
	f->cfg.nvme_dir = f->dir;
	f->cfg.nvme_capacity_bytes = nvme_bytes;
	f->cfg.nvme_segment_bytes = MIB;
	f->cfg.nvme_io_threads = 2;
	f->cfg.log = capture_log;
	f->cfg.log_arg = f;
	open_fixture(f);
	return f;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (!f)
		return 0;
	if (f->s)
		close_fixture(f);
	store_fixture_rmdir(f->dir);
	free(f);
	*state = NULL;
	return 0;
}

/* Put block id below parent_id (0: none), retrying while the demoter
 * makes room (-EAGAIN). Returns the final rc. */
static int put_id(struct fixture *f, uint64_t id, uint64_t parent_id)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	uint64_t len = len_of(id);
	struct store_block *b;
	uint8_t *buf = malloc(len);
	void *dst;
	int rc;

	assert_non_null(buf);
	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	fill_payload(buf, len, key);
	for (int tries = 0;; tries++) {
		rc = store_put_begin(f->s, f->ns, key, parent_id ? parent : NULL, 0, len,
				     XXH3_64bits(buf, len), &b, &dst);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc == 0) {
		memcpy(dst, buf, len);
		rc = store_put_commit(f->s, b);
	}
	free(buf);
	return rc;
}

/* Get block id (retrying -EAGAIN), check its bytes, release it.
 * Returns the rc; *tier (may be NULL) receives where it came from. */
static int get_id(struct fixture *f, uint64_t id, uint8_t *tier)
{
	uint8_t key[STORE_KEY_BYTES], *want;
	struct store_ref ref;
	int rc;

	key_of(id, key);
	for (int tries = 0;; tries++) {
		rc = store_get(f->s, f->ns, key, NULL, &ref);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc)
		return rc;
	assert_int_equal(ref.length, len_of(id));
	want = malloc(ref.length);
	assert_non_null(want);
	fill_payload(want, ref.length, key);
	assert_memory_equal(ref.data, want, ref.length);
	assert_int_equal(XXH3_64bits(ref.data, ref.length), ref.checksum);
	free(want);
	if (tier)
		*tier = ref.tier;
	store_release(f->s, ref.block);
	return 0;
}

static bool stored(struct fixture *f, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	return store_exists(f->s, f->ns, key, NULL) == 0;
}

static void drop_dram(struct fixture *f, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	assert_int_equal(store_debug_drop_dram(f->s, f->ns, key), 0);
}

/* Chains of `len` blocks: block id's parent is id - 1 unless id starts a
 * chain (ids from 1). */
static uint64_t chain_parent(uint64_t id, uint64_t len)
{
	return (id - 1) % len ? id - 1 : 0;
}

/* ---- tests ---- */

/* Demoted blocks stay matchable; read back from NVMe they are byte-exact. */
static void test_demote_and_promote(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint8_t keys[20][STORE_KEY_BYTES], tier = 0;
	struct store_stats st;
	uint32_t matched = 0;

	*state = f;
	for (uint64_t id = 1; id <= 20; id++)
		assert_int_equal(put_id(f, id, chain_parent(id, 20)), 0);
	assert_int_equal(stats_of(f->s).nvme_blocks, 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.nvme_enabled, 1);
	assert_int_equal(st.nvme_healthy, 1);
	assert_int_equal(st.nvme_blocks, 20);
	assert_int_equal(st.demotions, 20);
	assert_int_equal(st.dram_blocks, 20);
	assert_int_equal(st.blocks, 20);
	assert_true(st.nvme_bytes_written >= st.demoted_bytes);
	assert_int_equal(st.nvme_segment_bytes, MIB);
	/* clean copies go; the blocks stay visible */
	for (uint64_t id = 1; id <= 20; id++)
		drop_dram(f, id);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.dram_blocks, 0);
	assert_int_equal(st.blocks, 20);
	for (uint64_t id = 1; id <= 20; id++)
		key_of(id, keys[id - 1]);
	assert_int_equal(store_match(f->s, f->ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 20, 0,
				     NULL, &matched, NULL), 0);
	assert_int_equal(matched, 20);
	for (uint64_t id = 1; id <= 20; id++) {
		uint64_t length = 0;

		/* EXISTS says where the block is: NVMe only, then DRAM */
		tier = 0;
		assert_int_equal(store_exists_where(f->s, f->ns, keys[id - 1], &length, &tier), 0);
		assert_int_equal(tier, 2);
		assert_true(length > 0);
		assert_int_equal(get_id(f, id, &tier), 0);
		assert_int_equal(tier, 2);
		assert_int_equal(store_exists_where(f->s, f->ns, keys[id - 1], NULL, &tier), 0);
		assert_int_equal(tier, 1);
		assert_check(f->s);
	}
	/* now in DRAM again */
	assert_int_equal(get_id(f, 7, &tier), 0);
	assert_int_equal(tier, 1);
	st = stats_of(f->s);
	assert_int_equal(st.promotions, 20);
	assert_true(st.nvme_bytes_read >= st.promoted_bytes);
	assert_int_equal(st.dram_blocks, 20);
	assert_int_equal(f->errors, 0);
}

/* Four times DRAM in chains of 8: everything comes back, byte-exact. */
static void test_more_than_dram(void **state)
{
	struct fixture *f = fixture_new(1 * MIB, 16 * MIB);
	const uint64_t n = 320, chain = 8;
	struct store_stats st;

	*state = f;
	for (uint64_t id = 1; id <= n; id++) {
		assert_int_equal(put_id(f, id, chain_parent(id, chain)), 0);
		if (id % 32 == 0)
			assert_check(f->s);
	}
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.blocks, n);
	assert_int_equal(st.evictions, 0);
	assert_true(st.nvme_blocks > n / 2);
	assert_true(st.dram_blocks < n / 2);
	for (uint64_t id = n; id >= 1; id--) {
		assert_int_equal(get_id(f, id, NULL), 0);
		if (id % 32 == 0)
			assert_check(f->s);
	}
	assert_true(stats_of(f->s).promotions > 0);
	assert_int_equal(f->errors, 0);
}

/* nvme_admission=reused: blocks never used after their put are evicted
 * from DRAM rather than demoted, and counted. */
static void test_admission_reused(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct store_stats st;
	uint64_t kept = 0;

	*state = f;
	store_fixture_tmpdir(f->dir, sizeof(f->dir), "kvpool-tier");
	f->cfg = (struct store_config){ .dram_capacity_bytes = MIB, .max_block_bytes = 64 * KIB,
					.nvme_dir = f->dir, .nvme_capacity_bytes = 16 * MIB,
					.nvme_segment_bytes = MIB,
					.nvme_admission = STORE_ADMIT_REUSED,
					.log = capture_log, .log_arg = f };
	open_fixture(f);
	for (uint64_t id = 1; id <= 40; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	for (uint64_t id = 2; id <= 40; id += 2)
		assert_int_equal(get_id(f, id, NULL), 0);
	for (uint64_t id = 41; id <= 240; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	st = stats_of(f->s);
	for (uint64_t id = 2; id <= 40; id += 2)
		assert_true(stored(f, id));
	for (uint64_t id = 1; id <= 240; id++)
		kept += stored(f, id);
	assert_true(st.admission_rejections > 0);
	assert_int_equal(st.evictions, st.admission_rejections);
	assert_int_equal(kept, 240 - st.admission_rejections);
	/* only blocks that were used went to NVMe */
	assert_true(st.demotions <= 20);
	for (uint64_t id = 2; id <= 40; id += 2)
		assert_int_equal(get_id(f, id, NULL), 0);
}

/* Random puts (chains and branches), gets, deletes and matches on a small
 * arena and a small NVMe tier: store_check after every step. */
static void test_churn_no_holes(void **state)
{
	struct fixture *f = fixture_new(512 * KIB, 4 * MIB);
	uint64_t next = 1, rng = 12345, ok = 0;

	*state = f;
	for (int step = 0; step < 1500; step++) {
		uint64_t r = mix64(rng++), op = r % 10, id = next > 1 ? 1 + (r >> 8) % (next - 1) : 1;
		int rc;

		if (op < 6) {
			uint64_t parent = (r >> 20) % 3 && next > 1 ? id : 0;

			rc = put_id(f, next, parent && stored(f, parent) ? parent : 0);
			/* the parent may leave NVMe (reclaim) between the check and the put */
			if (rc != 0 && rc != -ENOSPC && rc != -EAGAIN && rc != -ENOLINK)
				fail_msg("put: %d", rc);
			next++;
			ok += rc == 0;
		} else if (op < 8) {
			rc = get_id(f, id, NULL);
			assert_true(rc == 0 || rc == -ENOENT || rc == -EAGAIN);
		} else if (op < 9) {
			uint8_t key[STORE_KEY_BYTES];

			key_of(id, key);
			rc = store_delete(f->s, f->ns, key, NULL);
			assert_true(rc == 0 || rc == -ENOENT);
		} else {
			uint8_t keys[1][STORE_KEY_BYTES];
			uint32_t matched;

			key_of(id, keys[0]);
			assert_int_equal(store_match(f->s, f->ns,
						     (const uint8_t (*)[STORE_KEY_BYTES])keys, 1, 0,
						     NULL, &matched, NULL), 0);
		}
		assert_check(f->s);
	}
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	assert_true(ok > 500);
	assert_true(stats_of(f->s).segments_reclaimed > 0);
	assert_int_equal(f->errors, 0);
}

/* Reclaim rewrites what must stay: blocks with children (the heads) and
 * pinned blocks (their children, held by a GET); unpinned leaves go. */
static void test_reclaim_rewrites(void **state)
{
	struct fixture *f = fixture_new(512 * KIB, 4 * MIB);
	const uint64_t heads = 8;
	struct store_ref pins[8];
	uint8_t key[STORE_KEY_BYTES];
	struct store_stats st;
	uint64_t id = 100;

	*state = f;
	/* heads with one child each, demoted first (oldest segment) */
	for (uint64_t h = 1; h <= heads; h++)
		assert_int_equal(put_id(f, h, 0), 0);
	for (uint64_t h = 1; h <= heads; h++) {
		assert_int_equal(put_id(f, 50 + h, h), 0);
		key_of(50 + h, key);
		assert_int_equal(store_get(f->s, f->ns, key, NULL, &pins[h - 1]), 0);
	}
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	/* a stream of unrelated blocks cycles through every segment */
	for (int round = 0; round < 3 && stats_of(f->s).segments_reclaimed < 8; round++)
		for (int i = 0; i < 300; i++)
			assert_int_equal(put_id(f, id++, 0), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_true(st.segments_reclaimed >= 4);
	assert_true(st.rewritten_bytes > 0);
	assert_true(st.nvme_evictions > 0);
	for (uint64_t h = 1; h <= heads; h++) {
		assert_true(stored(f, h));
		assert_true(stored(f, 50 + h));
		assert_int_equal(get_id(f, h, NULL), 0);
		store_release(f->s, pins[h - 1].block);
	}
	assert_false(stored(f, 100));
	assert_check(f->s);
	assert_int_equal(f->errors, 0);
}

/* Long chains fill the tier with interior blocks whose children live in
 * later segments: no segment could be reclaimed by moving blocks, and
 * the tier used to stall for good. Reclaim now evicts cold subtrees
 * whole (never leaving a hole), so old chains leave and new ones stay. */
static void test_reclaim_cold_subtrees(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	const uint64_t len = 200, total = 2000;
	struct store_stats st;

	*state = f;
	for (uint64_t id = 1; id <= total; id++) {
		int rc = put_id(f, id, chain_parent(id, len));

		if (rc) {
			st = stats_of(f->s);
			fail_msg("put %llu: %d (reclaimed %llu, blocks %llu dram %llu nvme %llu used %llu "
				 "healthy %d evict %llu)", (unsigned long long)id, rc,
				 (unsigned long long)st.segments_reclaimed, (unsigned long long)st.blocks,
				 (unsigned long long)st.dram_blocks, (unsigned long long)st.nvme_blocks,
				 (unsigned long long)st.nvme_used_bytes, st.nvme_healthy,
				 (unsigned long long)st.nvme_evictions);
		}
	}
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_true(st.segments_reclaimed >= 4);
	assert_true(st.nvme_evictions >= len);
	assert_true(st.nvme_healthy);
	/* the first chain is gone whole; the last one is all there */
	for (uint64_t id = 1; id <= len; id++)
		assert_false(stored(f, id));
	for (uint64_t id = total - len + 1; id <= total; id++)
		assert_int_equal(get_id(f, id, NULL), 0);
	assert_int_equal(f->errors, 0);
}

/* One chain longer than both tiers: every stored block is an ancestor of
 * the next put, so nothing can go. The pool answers FULL (after BUSY
 * while the tier still had room to reclaim), never BUSY for good. */
static void test_chain_longer_than_pool(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint64_t id;
	int rc = 0;

	*state = f;
	for (id = 1; id <= 2000; id++) {
		rc = put_id(f, id, id - 1); /* put_id retries BUSY for up to ~5 s */
		if (rc)
			break;
	}
	assert_int_equal(rc, -ENOSPC);
	assert_true(id > 400); /* past DRAM: the tier took part of the chain */
	assert_true(stored(f, 1) && stored(f, id - 1));
	assert_check(f->s);
	assert_int_equal(f->errors, 0);
}

/* Close and reopen: every block on NVMe is back, byte-exact. */
static void test_rebuild(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint8_t tier = 0;
	struct store_stats st;

	*state = f;
	for (uint64_t id = 1; id <= 60; id++)
		assert_int_equal(put_id(f, id, chain_parent(id, 6)), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	close_fixture(f);
	open_fixture(f);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.rebuild_blocks, 60);
	assert_int_equal(st.orphans_dropped, 0);
	assert_int_equal(st.blocks, 60);
	assert_int_equal(st.nvme_blocks, 60);
	assert_int_equal(st.dram_blocks, 0);
	for (uint64_t id = 1; id <= 60; id++) {
		assert_int_equal(get_id(f, id, &tier), 0);
		assert_int_equal(tier, 2);
	}
	/* puts continue after the rebuilt segments */
	for (uint64_t id = 61; id <= 90; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_check(f->s);
	assert_int_equal(f->errors, 0);
}

static uint32_t last_use_of(struct fixture *f, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];
	uint32_t use = 0;

	key_of(id, key);
	assert_int_equal(store_debug_last_use(f->s, f->ns, key, &use), 0);
	return use;
}

/* Records keep the aging epoch with last_use: blocks demoted before an
 * aging pass come back from a restart halved like the blocks in memory
 * were, older than one demoted after it (not newer, as their raw counts
 * near UINT32_MAX would say). */
static void test_rebuild_across_aging(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint32_t clock, epoch, use1, use2, use3;

	*state = f;
	assert_int_equal(store_debug_clock_set(f->s, UINT32_MAX - 10), 0);
	assert_int_equal(put_id(f, 1, 0), 0);
	store_debug_clock(f->s, &clock, &epoch);
	assert_int_equal(store_debug_clock_set(f->s, clock + 1), 0);
	assert_int_equal(put_id(f, 2, 0), 0);
	use1 = last_use_of(f, 1);
	use2 = last_use_of(f, 2);
	assert_int_equal(use1, UINT32_MAX - 9);
	assert_int_equal(use2, UINT32_MAX - 7);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_int_equal(store_debug_clock_set(f->s, UINT32_MAX), 0);
	assert_int_equal(put_id(f, 3, 0), 0); /* ages the pool first */
	use3 = last_use_of(f, 3);
	assert_int_equal(use3, UINT32_MAX / 2 + 1);
	assert_int_equal(last_use_of(f, 1), use1 / 2);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_check(f->s);
	close_fixture(f);
	open_fixture(f);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).rebuild_blocks, 3);
	store_debug_clock(f->s, &clock, &epoch);
	assert_int_equal(epoch, 1);
	assert_int_equal(clock, use3);
	assert_int_equal(last_use_of(f, 1), use1 / 2);
	assert_int_equal(last_use_of(f, 2), use2 / 2);
	assert_int_equal(last_use_of(f, 3), use3);
	/* uses go on above every rebuilt block; demotions too */
	assert_int_equal(get_id(f, 1, NULL), 0);
	assert_true(last_use_of(f, 1) > use3);
	assert_int_equal(put_id(f, 4, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_check(f->s);
	assert_int_equal(f->errors, 0);
}

/* A segment file cut short (or deleted) while kvpoold was down: records
 * reaching past what it still holds name bytes that are gone. Rebuild
 * drops them with a warning instead of serving the zeros of a regrown
 * file; blocks within what is left come back byte-exact. */
static void test_rebuild_lost_segment(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint64_t back = 0;
	char path[128];
	struct store_stats st;

	*state = f;
	for (uint64_t id = 1; id <= 60; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	close_fixture(f);
	snprintf(path, sizeof(path), "%s/segments/00000000", f->cfg.nvme_dir);
	assert_int_equal(truncate(path, 256 * KIB), 0); /* 60 blocks of 5..20 KiB: ~750 KiB */
	f->warns = 0;
	open_fixture(f);
	assert_check(f->s);
	st = stats_of(f->s);
	for (uint64_t id = 1; id <= 60; id++) {
		if (!stored(f, id))
			continue;
		assert_int_equal(get_id(f, id, NULL), 0); /* byte-exact, never zeros */
		back++;
	}
	assert_int_equal(back, st.rebuild_blocks);
	assert_true(back > 0 && back < 60);
	assert_true(f->warns >= 1);
	/* counted, not only logged (issue 28 item 7) */
	assert_int_equal(st.rebuild_truncated + st.orphans_dropped, 60 - back);
	assert_true(st.rebuild_truncated > 0);
	assert_int_equal(st.checksum_errors, 0);
	assert_int_equal(f->errors, 0);
}

/* A block whose parent did not reach NVMe is an orphan at rebuild:
 * dropped and counted, never a hole. */
static void test_rebuild_orphans(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	struct store_nvme_index *ix;
	uint8_t key[STORE_KEY_BYTES];
	char path[128];
	struct store_stats st;

	*state = f;
	/* chain 1 -> 2 -> 3 and a sibling 4 of 2 */
	assert_int_equal(put_id(f, 1, 0), 0);
	assert_int_equal(put_id(f, 2, 1), 0);
	assert_int_equal(put_id(f, 3, 2), 0);
	assert_int_equal(put_id(f, 4, 1), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	close_fixture(f);
	/* as if block 2 had been in DRAM only when the process died */
	snprintf(path, sizeof(path), "%s/index", f->dir);
	assert_int_equal(store_nvme_index_open(path, NULL, NULL, &ix, NULL, 0), 0);
	key_of(2, key);
	assert_int_equal(store_nvme_index_delete(ix, 1, key), 0);
	store_nvme_index_close(ix);
	open_fixture(f);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.rebuild_blocks, 2);
	assert_int_equal(st.orphans_dropped, 1);
	assert_true(stored(f, 1));
	assert_false(stored(f, 2));
	assert_false(stored(f, 3));
	assert_true(stored(f, 4));
	/* the orphan's record is gone too */
	close_fixture(f);
	open_fixture(f);
	assert_int_equal(stats_of(f->s).orphans_dropped, 0);
	assert_int_equal(stats_of(f->s).rebuild_blocks, 2);
}

/* Flip a byte of a block on NVMe: its GET is a counted miss and it goes
 * with its descendants, from both tiers and from the index. */
static void test_corrupt_block(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint8_t key[STORE_KEY_BYTES], byte;
	struct store_ref ref;
	uint32_t seg;
	uint64_t off;
	char path[128];
	int fd;

	*state = f;
	for (uint64_t id = 1; id <= 5; id++)
		assert_int_equal(put_id(f, id, chain_parent(id, 5)), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	for (uint64_t id = 1; id <= 5; id++)
		drop_dram(f, id);
	key_of(3, key);
	assert_int_equal(store_debug_nvme_where(f->s, f->ns, key, &seg, &off, NULL), 0);
	snprintf(path, sizeof(path), "%s/segments/%08u", f->dir, seg);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)(off + 100)), 1);
	byte ^= 0x40;
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)(off + 100)), 1);
	close(fd);

	assert_int_equal(store_get(f->s, f->ns, key, NULL, &ref), -ENOENT);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).corrupt_blocks, 1);
	assert_int_equal(stats_of(f->s).blocks, 2);
	assert_true(stored(f, 1));
	assert_true(stored(f, 2));
	for (uint64_t id = 3; id <= 5; id++)
		assert_false(stored(f, id));
	assert_true(f->errors >= 1);
	assert_int_equal(get_id(f, 2, NULL), 0);
	/* and after a restart */
	close_fixture(f);
	open_fixture(f);
	assert_int_equal(stats_of(f->s).rebuild_blocks, 2);
	for (uint64_t id = 3; id <= 5; id++)
		assert_false(stored(f, id));
}

/* A dropped namespace stays dropped after a restart. */
static void test_drop_namespace_persists(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint64_t blocks = 0, bytes = 0;
	uint32_t other;

	*state = f;
	assert_int_equal(store_namespace_id(f->s, "model-b", 7, &other), 0);
	for (uint64_t id = 1; id <= 30; id++)
		assert_int_equal(put_id(f, id, chain_parent(id, 10)), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_int_equal(store_drop_namespace(f->s, f->ns, &blocks, &bytes), 0);
	assert_int_equal(blocks, 30);
	assert_int_equal(stats_of(f->s).nvme_blocks, 0);
	assert_check(f->s);
	/* a new block of the namespace demotes under a fresh disk id */
	assert_int_equal(put_id(f, 500, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	store_namespace_release(f->s, other);
	close_fixture(f);
	open_fixture(f);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).blocks, 1);
	for (uint64_t id = 1; id <= 30; id++)
		assert_false(stored(f, id));
	assert_true(stored(f, 500));
}

/* Blocks deleted while their demotion writes them do not come back, now
 * or after a restart: their fresh records are deleted. */
static void test_delete_during_demotion(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	*state = f;
	for (uint64_t id = 1; id <= 4; id++)
		assert_int_equal(put_id(f, id, chain_parent(id, 4)), 0);
	assert_int_equal(put_id(f, 9, 0), 0);
	assert_int_equal(store_debug_nvme_hold(f->s, 1), 0);
	key_of(1, key);
	assert_int_equal(store_delete(f->s, f->ns, key, &removed), 0);
	assert_int_equal(removed, 4);
	assert_check(f->s);
	assert_int_equal(store_debug_nvme_hold(f->s, 0), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	for (uint64_t id = 1; id <= 4; id++)
		assert_false(stored(f, id));
	assert_int_equal(stats_of(f->s).blocks, 1);
	assert_int_equal(stats_of(f->s).nvme_blocks, 1);
	assert_int_equal(stats_of(f->s).demotions, 1);
	close_fixture(f);
	open_fixture(f);
	assert_int_equal(stats_of(f->s).rebuild_blocks, 1);
	assert_int_equal(stats_of(f->s).orphans_dropped, 0);
	for (uint64_t id = 1; id <= 4; id++)
		assert_false(stored(f, id));
	assert_int_equal(get_id(f, 9, NULL), 0);
}

/* Writes fail: the tier is unhealthy, puts go on in DRAM (evicting), and
 * the tier resumes when writes succeed again. */
static void test_write_failure(void **state)
{
	struct fixture *f = fixture_new(1 * MIB, 8 * MIB);
	struct store_stats st;

	*state = f;
	store_debug_nvme_backoff(f->s, 50);
	store_debug_nvme_fail_writes(f->s, 1000000);
	for (uint64_t id = 1; id <= 200; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	assert_check(f->s);
	st = stats_of(f->s);
	assert_int_equal(st.nvme_healthy, 0);
	assert_true(st.nvme_write_errors > 0);
	assert_true(st.evictions > 0);
	assert_int_equal(st.nvme_blocks, 0);
	assert_true(f->errors >= 1);
	store_debug_nvme_fail_writes(f->s, 0);
	sleep_ms(60);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	st = stats_of(f->s);
	assert_int_equal(st.nvme_healthy, 1);
	assert_true(st.nvme_blocks > 0);
	for (uint64_t id = 201; id <= 400; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).evictions, st.evictions);
}

/* store_get_async: -EINPROGRESS for an NVMe-only block, done exactly once;
 * a second request joins; after store_drain, NVMe-only is a miss. */
struct done_rec {
	pthread_mutex_t m;
	pthread_cond_t cv;
	int calls, status;
};

static void on_done(void *arg, int status)
{
	struct done_rec *d = arg;

	pthread_mutex_lock(&d->m);
	d->calls++;
	d->status = status;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->m);
}

static void wait_done(struct done_rec *d)
{
	pthread_mutex_lock(&d->m);
	while (!d->calls)
		pthread_cond_wait(&d->cv, &d->m);
	pthread_mutex_unlock(&d->m);
}

static void test_get_async_and_drain(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	struct done_rec d1 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1 };
	struct done_rec d2 = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1 };
	uint8_t key[STORE_KEY_BYTES], missing[STORE_KEY_BYTES];
	struct store_ref r1, r2;
	int rc1, rc2;

	*state = f;
	for (uint64_t id = 1; id <= 3; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	drop_dram(f, 1);
	drop_dram(f, 2);
	key_of(1, key);
	key_of(999, missing);
	assert_int_equal(store_get_async(f->s, f->ns, missing, NULL, &r1, on_done, &d1), -ENOENT);
	rc1 = store_get_async(f->s, f->ns, key, NULL, &r1, on_done, &d1);
	rc2 = store_get_async(f->s, f->ns, key, NULL, &r2, on_done, &d2);
	assert_int_equal(rc1, -EINPROGRESS);
	assert_true(rc2 == -EINPROGRESS || rc2 == 0);
	wait_done(&d1);
	if (rc2 == -EINPROGRESS)
		wait_done(&d2);
	store_debug_nvme_wait_idle(f->s);
	assert_int_equal(d1.calls, 1);
	assert_int_equal(d1.status, 0);
	assert_int_equal(r1.tier, 2);
	assert_int_equal(r1.length, len_of(1));
	assert_int_equal(XXH3_64bits(r1.data, r1.length), r1.checksum);
	if (rc2 == -EINPROGRESS) {
		assert_int_equal(d2.calls, 1);
		assert_int_equal(d2.status, 0);
	}
	assert_ptr_equal(r2.block, r1.block);
	assert_check(f->s);
	store_release(f->s, r1.block);
	store_release(f->s, r2.block);
	/* a DRAM block answers at once, no callback */
	d1.calls = 0;
	assert_int_equal(store_get_async(f->s, f->ns, key, NULL, &r1, on_done, &d1), 0);
	store_release(f->s, r1.block);
	/* drain: block 2 is NVMe-only and is now a miss */
	store_drain(f->s);
	key_of(2, key);
	assert_int_equal(store_get_async(f->s, f->ns, key, NULL, &r1, on_done, &d1), -ENOENT);
	assert_int_equal(d1.calls, 0);
	assert_true(stored(f, 2));
	/* puts still work after drain: DRAM evicts */
	for (uint64_t id = 10; id <= 200; id++)
		assert_int_equal(put_id(f, id, 0), 0);
	assert_check(f->s);
}

/* Open errors name the problem. */
static void test_open_errors(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	struct store_config cfg = f->cfg;
	struct store *s2 = (struct store *)0x1;
	char why[256] = "";

	*state = f;
	/* the directory is locked by f->s */
	assert_int_equal(store_open(&cfg, &s2, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, f->dir));
	assert_ptr_equal(s2, (struct store *)0x1);
	cfg.nvme_capacity_bytes = MIB;
	assert_int_equal(store_open(&cfg, &s2, why, sizeof(why)), -EINVAL);
	cfg.nvme_capacity_bytes = 8 * MIB;
	cfg.nvme_dir = "/nonexistent/kvpool-tier";
	assert_int_equal(store_open(&cfg, &s2, why, sizeof(why)), -ENOENT);
	assert_ptr_equal(s2, (struct store *)0x1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_demote_and_promote, teardown),
		cmocka_unit_test_teardown(test_more_than_dram, teardown),
		cmocka_unit_test_teardown(test_admission_reused, teardown),
		cmocka_unit_test_teardown(test_churn_no_holes, teardown),
		cmocka_unit_test_teardown(test_reclaim_rewrites, teardown),
		cmocka_unit_test_teardown(test_reclaim_cold_subtrees, teardown),
		cmocka_unit_test_teardown(test_chain_longer_than_pool, teardown),
		cmocka_unit_test_teardown(test_rebuild, teardown),
		cmocka_unit_test_teardown(test_rebuild_orphans, teardown),
		cmocka_unit_test_teardown(test_rebuild_across_aging, teardown),
		cmocka_unit_test_teardown(test_rebuild_lost_segment, teardown),
		cmocka_unit_test_teardown(test_corrupt_block, teardown),
		cmocka_unit_test_teardown(test_drop_namespace_persists, teardown),
		cmocka_unit_test_teardown(test_delete_during_demotion, teardown),
		cmocka_unit_test_teardown(test_write_failure, teardown),
		cmocka_unit_test_teardown(test_get_async_and_drain, teardown),
		cmocka_unit_test_teardown(test_open_errors, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
