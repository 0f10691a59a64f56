/*
 * test_tier_durable.c - the NVMe tier across crashes and faults (issue
 * 16): a DELETE or DROP_NAMESPACE that returned is still done after a
 * SIGKILL right after it (the pool runs in a child process that is
 * killed the moment it reports), a namespace drop that races a demotion
 * in flight stays dropped, and a failed index write leaves DRAM serving.
 *
 * Each test uses a fresh temporary directory with 1 MiB segments; keys,
 * lengths and the checks come from store_fixture.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>
#include <dirent.h>

#include "nvme/nvme_index.h"
#include "store.h"
#include "debug/store_debug.h"
#include "store_fixture.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* ---- helpers ---- */

struct fixture {
	char dir[64];
	struct store_config cfg;
	struct store *s;
	uint32_t ns;
	int errors, warns;
	char last_warn[512];
	uint64_t fixed_len;  /* every block this long, when not 0 */
	bool mounted;        /* a tmpfs is mounted on dir */
	int shrank;          /* "nvme_capacity shrank" warnings */
};



/* Length of block id: f->fixed_len, or len_of's 5..20 KiB. */
static uint64_t blk_len(const struct fixture *f, uint64_t id)
{
	return f->fixed_len ? f->fixed_len : len_of(id);
}

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
	if (level == STORE_LOG_WARN || level == STORE_LOG_ERR) {
		f->warns++;
		snprintf(f->last_warn, sizeof(f->last_warn), "%s", msg);
		f->shrank += strstr(msg, "shrank") != NULL;
	}
	if (getenv("TIER_LOG"))
		fprintf(stderr, "log %d: %s\n", level, msg);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}




/* Open f->s (no cmocka calls: also used in the child). 0 or rc. */
static int open_pool(struct fixture *f)
{
	char why[256] = "";
	int rc = store_open(&f->cfg, &f->s, why, sizeof(why));

	if (rc) {
		fprintf(stderr, "store_open: %d %s\n", rc, why);
		return rc;
	}
	return store_namespace_id(f->s, "model-a", 7, &f->ns);
}

static void close_pool(struct fixture *f)
{
	store_namespace_release(f->s, f->ns);
	store_close(f->s);
	f->s = NULL;
}

static struct fixture *fixture_new(uint64_t dram_bytes, uint64_t nvme_bytes)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvpool-durable-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	f->cfg.dram_capacity_bytes = dram_bytes;
	f->cfg.max_block_bytes = 64 * KIB;
	f->cfg.max_lease_ms = 5000;
	f->cfg.nvme_dir = f->dir;
	f->cfg.nvme_capacity_bytes = nvme_bytes;
	f->cfg.nvme_segment_bytes = MIB;
	f->cfg.nvme_io_threads = 2;
	f->cfg.log = capture_log;
	f->cfg.log_arg = f;
	return f;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (!f)
		return 0;
	if (f->s)
		close_pool(f);
	if (f->mounted)
		umount(f->dir);
	nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	*state = NULL;
	return 0;
}

/* Put block id below parent_id (0: none), retrying -EAGAIN. */
static int put_id(struct fixture *f, uint32_t ns, uint64_t id, uint64_t parent_id)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	uint64_t len = blk_len(f, id);
	struct store_block *b;
	uint8_t *buf = malloc(len);
	void *dst;
	int rc;

	if (!buf)
		return -ENOMEM;
	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	fill_payload(buf, len, key);
	for (int tries = 0;; tries++) {
		rc = store_put_begin(f->s, ns, key, parent_id ? parent : NULL, 0, len,
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

static bool stored(struct fixture *f, uint32_t ns, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	return store_exists(f->s, ns, key, NULL) == 0;
}

/* Get block id (retrying -EAGAIN and promotions) and compare its bytes.
 * 0, -ENOENT, or -EBADMSG when the bytes are wrong. */
static int get_check(struct fixture *f, uint32_t ns, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES], *want;
	struct store_ref ref;
	int rc;

	key_of(id, key);
	for (int tries = 0;; tries++) {
		rc = store_get(f->s, ns, key, NULL, &ref);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc)
		return rc;
	want = malloc(ref.length);
	if (!want)
		return -ENOMEM;
	fill_payload(want, ref.length, key);
	rc = ref.length == blk_len(f, id) && memcmp(ref.data, want, ref.length) == 0 ? 0 : -EBADMSG;
	free(want);
	store_release(f->s, ref.block);
	return rc;
}

/* Run fn(f) in a child process that opens the pool, and SIGKILL the
 * child the moment fn returns (it writes one byte to a pipe; the parent
 * kills on reading it). fn returns 0 or a small failure code, which the
 * child sends instead of the byte. Returns what fn returned. */
static int run_then_kill(struct fixture *f, int (*fn)(struct fixture *f))
{
	int fds[2], status;
	char c = 0;
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char r;

		close(fds[0]);
		r = open_pool(f) ? 100 : (char)fn(f);
		if (write(fds[1], &r, 1) != 1)
			_exit(2);
		for (;;)
			pause();
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], &c, 1), 1);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	close(fds[0]);
	return c;
}

/* ---- durable removals ---- */

/* Chains 1..4 and 5..8 and 11..14 on NVMe, then DELETE of block 1. */
static int child_delete(struct fixture *f)
{
	uint8_t key[STORE_KEY_BYTES];
	uint64_t removed = 0;

	for (uint64_t id = 1; id <= 14; id++)
		if (put_id(f, f->ns, id, (id - 1) % 4 ? id - 1 : 0))
			return 1;
	if (store_debug_nvme_demote_all(f->s))
		return 2;
	if (stats_of(f->s).nvme_blocks != 14)
		return 3;
	key_of(1, key);
	if (store_delete(f->s, f->ns, key, &removed) || removed != 4)
		return 4;
	/* a chain in DRAM too: deleting its middle takes the rest along */
	key_of(6, key);
	if (store_delete(f->s, f->ns, key, &removed) || removed != 3)
		return 5;
	return 0;
}

/* A DELETE that returned holds after a SIGKILL right after it. */
static void test_delete_then_kill(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	for (int round = 0; round < 3; round++) {
		assert_int_equal(run_then_kill(f, child_delete), 0);
		assert_int_equal(open_pool(f), 0);
		assert_check(f->s);
		for (uint64_t id = 1; id <= 4; id++)
			assert_false(stored(f, f->ns, id));
		for (uint64_t id = 6; id <= 8; id++)
			assert_false(stored(f, f->ns, id));
		assert_true(stored(f, f->ns, 5));
		for (uint64_t id = 11; id <= 14; id++)
			assert_int_equal(get_check(f, f->ns, id), 0);
		/* the next round starts from an empty pool */
		assert_int_equal(store_drop_namespace(f->s, f->ns, NULL, NULL), 0);
		close_pool(f);
	}
}

/* One DELETE request of several keys (store_delete_many): per-key
 * statuses, one durability step for the batch, and a SIGKILL right after
 * brings none back. */
static int child_delete_many(struct fixture *f)
{
	uint8_t keys[4][STORE_KEY_BYTES];
	uint64_t removed = 0;
	int st[4];

	for (uint64_t id = 1; id <= 12; id++)
		if (put_id(f, f->ns, id, (id - 1) % 4 ? id - 1 : 0))
			return 1;
	if (store_debug_nvme_demote_all(f->s))
		return 2;
	key_of(1, keys[0]);  /* chain 1..4 */
	key_of(2, keys[1]);  /* already gone with 1: -ENOENT */
	key_of(99, keys[2]); /* never stored */
	key_of(10, keys[3]); /* 10..12 */
	if (store_delete_many(f->s, f->ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 4, st,
			      &removed))
		return 3;
	if (st[0] || st[1] != -ENOENT || st[2] != -ENOENT || st[3] || removed != 7)
		return 4;
	if (store_delete_many(f->s, f->ns, NULL, 1, st, &removed) != -EINVAL)
		return 5;
	return 0;
}

static void test_delete_many_then_kill(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	assert_int_equal(run_then_kill(f, child_delete_many), 0);
	assert_int_equal(open_pool(f), 0);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).blocks, 5);
	for (uint64_t id = 5; id <= 9; id++)
		assert_int_equal(get_check(f, f->ns, id), 0);
}

/* DROP_NAMESPACE while a demotion batch of that namespace is in flight
 * (parked by the test hook), then the batch finishes - writing its
 * records and the namespace's name under the old disk id - and the
 * process dies before anything else happens. */
static int child_drop_racing_demotion(struct fixture *f)
{
	uint32_t other;

	if (store_namespace_id(f->s, "model-b", 7, &other))
		return 1;
	for (uint64_t id = 1; id <= 8; id++)
		if (put_id(f, f->ns, id, id > 1 ? id - 1 : 0))
			return 2;
	if (put_id(f, other, 100, 0))
		return 3;
	if (store_debug_nvme_hold(f->s, 1))
		return 4;
	if (store_drop_namespace(f->s, f->ns, NULL, NULL))
		return 5;
	if (store_debug_nvme_hold(f->s, 0))
		return 6;
	return 0;
}

static void test_drop_racing_demotion_then_kill(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	uint32_t other;

	*state = f;
	assert_int_equal(run_then_kill(f, child_drop_racing_demotion), 0);
	assert_int_equal(open_pool(f), 0);
	assert_check(f->s);
	for (uint64_t id = 1; id <= 8; id++)
		assert_false(stored(f, f->ns, id));
	assert_int_equal(store_namespace_id(f->s, "model-b", 7, &other), 0);
	assert_int_equal(get_check(f, other, 100), 0);
	assert_int_equal(stats_of(f->s).blocks, 1);
	store_namespace_release(f->s, other);
}

/* A plain drop of a namespace on NVMe, killed right after. */
static int child_drop(struct fixture *f)
{
	for (uint64_t id = 1; id <= 20; id++)
		if (put_id(f, f->ns, id, (id - 1) % 5 ? id - 1 : 0))
			return 1;
	if (store_debug_nvme_demote_all(f->s))
		return 2;
	if (store_drop_namespace(f->s, f->ns, NULL, NULL))
		return 3;
	return 0;
}

static void test_drop_then_kill(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	assert_int_equal(run_then_kill(f, child_drop), 0);
	assert_int_equal(open_pool(f), 0);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).blocks, 0);
	/* the namespace is usable again, under a fresh disk id */
	assert_int_equal(put_id(f, f->ns, 7, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	close_pool(f);
	assert_int_equal(open_pool(f), 0);
	assert_int_equal(get_check(f, f->ns, 7), 0);
	assert_int_equal(stats_of(f->s).blocks, 1);
}

/* The index itself: a name (and records) written under a dropped disk id
 * after the drop - what a demotion batch in flight does - are ignored by
 * the scans, and the id is never handed out again. */
static int count_ns(void *arg, uint32_t id, const char *name, size_t len)
{
	(void)name;
	(void)len;
	if (id == 5)
		++*(int *)arg;
	return 0;
}

static void test_index_tombstone(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	struct store_nvme_index *ix;
	struct store_nvme_rec rec;
	char path[128], why[256];
	uint32_t next = 0;
	int seen = 0;

	*state = f;
	snprintf(path, sizeof(path), "%s/ix", f->dir);
	assert_int_equal(store_nvme_index_open(path, NULL, NULL, &ix, why, sizeof(why)), 0);
	assert_int_equal(store_nvme_index_ns_put(ix, 5, "a", 1), 0);
	assert_int_equal(store_nvme_index_ns_drop(ix, 5), 0);
	memset(&rec, 0, sizeof(rec));
	rec.ns_disk_id = 5;
	key_of(1, rec.key);
	rec.length = 4096;
	assert_int_equal(store_nvme_index_ns_put(ix, 5, "a", 1), 0);
	assert_int_equal(store_nvme_index_write(ix, &rec, 1, NULL, NULL, 0), 0);
	assert_int_equal(store_nvme_index_ns_scan(ix, count_ns, &seen), 0);
	assert_int_equal(seen, 0);
	/* a drop of an id never recorded moves next_ns past it */
	assert_int_equal(store_nvme_index_ns_drop(ix, 9), 0);
	assert_int_equal(store_nvme_index_next_ns_id(ix, &next), 0);
	assert_int_equal(next, 10);
	assert_int_equal(store_nvme_index_ns_drop(ix, 0), -EINVAL);
	store_nvme_index_close(ix);
	/* and after a reopen */
	assert_int_equal(store_nvme_index_open(path, NULL, NULL, &ix, why, sizeof(why)), 0);
	assert_int_equal(store_nvme_index_ns_scan(ix, count_ns, &seen), 0);
	assert_int_equal(seen, 0);
	store_nvme_index_close(ix);
}

/* nvme_admission = reused: blocks never read are not demoted, and are
 * evicted in LRU order one at a time as room is needed - DRAM past the
 * demoter's watermark (a quarter of the arena free) must not be emptied. */
static void test_admission_keeps_dram(void **state)
{
	struct fixture *f = fixture_new(8 * MIB, 16 * MIB);
	struct store_stats st;
	uint64_t kept = 0;

	*state = f;
	f->fixed_len = 64 * KIB - 100;
	f->cfg.nvme_admission = STORE_ADMIT_REUSED;
	assert_int_equal(open_pool(f), 0);
	/* 100 blocks of 64 KiB: 78% of the 8 MiB arena */
	for (uint64_t id = 1; id <= 100; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	sleep_ms(300);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	for (uint64_t id = 1; id <= 100; id++)
		kept += stored(f, f->ns, id);
	st = stats_of(f->s);
	/* enough left to meet the watermark: a handful, not all of them */
	assert_true(kept >= 90);
	assert_int_equal(st.admission_rejections, 100 - kept);
	assert_int_equal(st.demotions, 0);
	/* more puts: the oldest go first, one at a time, the newest stay */
	for (uint64_t id = 101; id <= 200; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	assert_false(stored(f, f->ns, 1));
	kept = 0;
	for (uint64_t id = 111; id <= 200; id++)
		kept += stored(f, f->ns, id);
	assert_int_equal(kept, 90);
	assert_true(stats_of(f->s).blocks >= 90);
}

/* ---- a clean stop keeps DRAM ---- */

/* store_keep_dram writes every DRAM-only block (DRAM large enough that
 * nothing was demoted), the next open finds them all byte-exact; with
 * admission "reused" too, and blocks put after it are still demoted. */
static void test_keep_dram(void **state)
{
	struct fixture *f = fixture_new(16 * MIB, 32 * MIB);
	uint64_t kept = 0, left = 1;

	*state = f;
	f->cfg.nvme_admission = STORE_ADMIT_REUSED;
	assert_int_equal(open_pool(f), 0);
	for (uint64_t id = 1; id <= 60; id++)
		assert_int_equal(put_id(f, f->ns, id, (id - 1) % 6 ? id - 1 : 0), 0);
	for (uint64_t id = 31; id <= 36; id++)
		assert_int_equal(get_check(f, f->ns, id), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_int_equal(stats_of(f->s).nvme_blocks, 0);
	assert_int_equal(store_keep_dram(f->s, 10000, &kept, &left), 0);
	assert_int_equal(kept, 60);
	assert_int_equal(left, 0);
	assert_int_equal(stats_of(f->s).nvme_blocks, 60);
	assert_check(f->s);
	/* nothing left: a second call keeps nothing more */
	assert_int_equal(store_keep_dram(f->s, 1000, &kept, &left), 0);
	assert_int_equal(kept, 0);
	close_pool(f);
	assert_int_equal(open_pool(f), 0);
	assert_check(f->s);
	assert_int_equal(stats_of(f->s).rebuild_blocks, 60);
	assert_int_equal(stats_of(f->s).orphans_dropped, 0);
	for (uint64_t id = 1; id <= 60; id++)
		assert_int_equal(get_check(f, f->ns, id), 0);
}

/* Time runs out: what was written is a set of whole chains' prefixes, so
 * nothing written is an orphan at the next start; the hottest chain went
 * first. Without a tier: -ENODEV. */
static void test_keep_dram_timeout(void **state)
{
	struct fixture *f = fixture_new(16 * MIB, 32 * MIB);
	struct store_config dram_only;
	struct store *s2;
	uint64_t kept = 0, left = 0;
	char why[128];
	int rc;

	*state = f;
	assert_int_equal(open_pool(f), 0);
	for (uint64_t id = 1; id <= 200; id++)
		assert_int_equal(put_id(f, f->ns, id, (id - 1) % 10 ? id - 1 : 0), 0);
	/* chain 191..200 is the hottest: its leaf was read last */
	assert_int_equal(get_check(f, f->ns, 200), 0);
	store_debug_nvme_backoff(f->s, 50);
	store_debug_nvme_fail_writes(f->s, 1000); /* nothing gets through */
	assert_int_equal(store_keep_dram(f->s, 300, &kept, &left), -EIO);
	assert_int_equal(kept, 0);
	assert_int_equal(left, 200);
	store_debug_nvme_fail_writes(f->s, 0);
	sleep_ms(60);
	/* no time at all: the one batch that started (a quarter segment)
	 * finishes, no more */
	rc = store_keep_dram(f->s, 3, &kept, &left);
	assert_true(rc == -ETIMEDOUT || (rc == 0 && left == 0));
	assert_int_equal(kept + left, 200);
	close_pool(f);
	assert_int_equal(open_pool(f), 0);
	assert_int_equal(stats_of(f->s).orphans_dropped, 0);
	assert_int_equal(stats_of(f->s).rebuild_blocks, kept);
	if (kept >= 10)
		for (uint64_t id = 191; id <= 200; id++)
			assert_true(stored(f, f->ns, id));
	close_pool(f);

	dram_only = f->cfg;
	dram_only.nvme_dir = NULL;
	dram_only.nvme_capacity_bytes = 0;
	assert_int_equal(store_open(&dram_only, &s2, why, sizeof(why)), 0);
	assert_int_equal(store_keep_dram(s2, 100, &kept, &left), -ENODEV);
	store_close(s2);
}

/* ---- space comes back ---- */

/* Bytes the segment files hold on disk (st_blocks). */
static uint64_t segment_disk_bytes(struct fixture *f)
{
	char dir[128], path[400];
	struct dirent *e;
	uint64_t sum = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "%.60s/segments", f->dir);
	d = opendir(dir);
	assert_non_null(d);
	while ((e = readdir(d))) {
		struct stat sb;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%.200s", dir, e->d_name);
		if (stat(path, &sb) == 0)
			sum += (uint64_t)sb.st_blocks * 512;
	}
	closedir(d);
	return sum;
}

/* Freed segments are hole-punched: after a drop, the segment files hold
 * (almost) nothing on disk. */
static void test_freed_segments_punched(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 16 * MIB);
	uint64_t before, after;

	*state = f;
	assert_int_equal(open_pool(f), 0);
	for (uint64_t id = 1; id <= 400; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	store_debug_nvme_wait_idle(f->s);
	before = segment_disk_bytes(f);
	assert_true(before >= 4 * MIB);
	assert_int_equal(store_drop_namespace(f->s, f->ns, NULL, NULL), 0);
	store_debug_nvme_wait_idle(f->s);
	assert_check(f->s);
	after = segment_disk_bytes(f);
	print_message("segment files: %llu KiB on disk before the drop, %llu KiB after\n",
		      (unsigned long long)(before / KIB), (unsigned long long)(after / KIB));
	/* the active segment is never freed; every other one is punched */
	assert_true(after <= MIB + 64 * KIB);
	/* and the punched segments are usable again */
	for (uint64_t id = 1000; id <= 1400; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_check(f->s);
	for (uint64_t id = 1000; id <= 1400; id += 37)
		assert_int_equal(get_check(f, f->ns, id), 0);
}

/* A full filesystem (a small tmpfs under nvme_dir; skipped where mounting
 * is not allowed): demotion fails with ENOSPC and the tier turns
 * unhealthy while DRAM keeps serving; dropping every block gives the
 * space back (hole punch) and the tier recovers by itself. */
static void test_enospc_recovers(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 96 * MIB);
	struct store_stats st;
	uint64_t id = 1;

	*state = f;
	if (mount("tmpfs", f->dir, "tmpfs", 0, "size=100m,mode=0700")) {
		print_message("skipped: cannot mount a tmpfs here (%s)\n", strerror(errno));
		skip();
	}
	f->mounted = true;
	assert_int_equal(open_pool(f), 0);
	store_debug_nvme_backoff(f->s, 20);
	/* 100 MiB less the 64 MiB reserve: about 30 MiB of segments fit */
	for (; id <= 6000 && stats_of(f->s).nvme_write_errors == 0; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	st = stats_of(f->s);
	assert_true(st.nvme_write_errors > 0);
	assert_int_equal(st.nvme_healthy, 0);
	/* DRAM serves meanwhile: puts evict, gets of DRAM blocks work */
	for (uint64_t k = 0; k < 50; k++, id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	assert_int_equal(get_check(f, f->ns, id - 1), 0);
	assert_check(f->s);
	assert_int_equal(store_drop_namespace(f->s, f->ns, NULL, NULL), 0);
	for (uint64_t k = 0; k < 200; k++, id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	for (int i = 0; i < 100 && !stats_of(f->s).nvme_healthy; i++) {
		(void)store_debug_nvme_demote_all(f->s);
		sleep_ms(30);
	}
	st = stats_of(f->s);
	if (!st.nvme_healthy) {
		struct statvfs vfs;

		statvfs(f->dir, &vfs);
		fail_msg("not healthy: fs free %llu KiB, segments %llu KiB on disk, nvme used %llu",
			 (unsigned long long)(vfs.f_bavail * vfs.f_frsize / KIB),
			 (unsigned long long)(segment_disk_bytes(f) / KIB),
			 (unsigned long long)st.nvme_used_bytes);
	}
	assert_true(st.nvme_blocks > 0);
	assert_check(f->s);
	close_pool(f);
}

/* ---- capacity checks ---- */

/* How many entries f->dir/segments holds (-1: no such directory). */
static int segment_files(struct fixture *f)
{
	char dir[128];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(dir, sizeof(dir), "%.60s/segments", f->dir);
	d = opendir(dir);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* A capacity the fd limit or the filesystem cannot hold is refused
 * before a single segment file is created (before: ~20,000 files were
 * created, then the open failed and left them behind). */
static void test_huge_capacity_refused_early(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	char why[512] = "";
	struct store *s2 = NULL;
	int rc;

	*state = f;
	f->cfg.nvme_capacity_bytes = 1ull << 50; /* 1 PiB of 1 MiB segments */
	rc = store_open(&f->cfg, &s2, why, sizeof(why));
	if (rc != -EMFILE && rc != -ENOSPC)
		fail_msg("store_open: %d (%s)", rc, why);
	assert_non_null(strstr(why, f->dir));
	assert_true(segment_files(f) <= 0);
	/* 64 segments fit the fd limit, but not a filesystem of this size */
	f->cfg.nvme_segment_bytes = 1ull << 40;
	f->cfg.nvme_capacity_bytes = 64ull << 40;
	why[0] = '\0';
	rc = store_open(&f->cfg, &s2, why, sizeof(why));
	if (rc != -EINVAL) { /* segments this large may be refused as such */
		assert_int_equal(rc, -ENOSPC);
		assert_non_null(strstr(why, "nvme_capacity"));
	}
	assert_true(segment_files(f) <= 0);
}

/* Shrinking nvme_capacity drops the blocks of the segments that go, with
 * a warning (it was an info line). */
static void test_shrink_warns(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 16 * MIB);

	*state = f;
	assert_int_equal(open_pool(f), 0);
	for (uint64_t id = 1; id <= 600; id++)
		assert_int_equal(put_id(f, f->ns, id, 0), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	close_pool(f);
	f->cfg.nvme_capacity_bytes = 4 * MIB;
	f->warns = 0;
	assert_int_equal(open_pool(f), 0);
	assert_true(f->warns >= 1);
	assert_true(f->shrank >= 1);
	assert_int_equal(segment_files(f), 4);
	assert_check(f->s);
}

/* ---- index damage ---- */

/* 30 blocks in chains of 5, all demoted; the process is killed, so the
 * index's records are in its write-ahead log only. */
static int child_fill(struct fixture *f)
{
	for (uint64_t id = 1; id <= 30; id++)
		if (put_id(f, f->ns, id, (id - 1) % 5 ? id - 1 : 0))
			return 1;
	return store_debug_nvme_demote_all(f->s) ? 2 : 0;
}

/* The first file in f->dir/index whose name holds `part`, into path. */
static bool index_file(struct fixture *f, const char *part, char *path, size_t len)
{
	char dir[512];
	struct dirent *e;
	DIR *d;
	bool found = false;

	snprintf(dir, sizeof(dir), "%.60s/index", f->dir);
	d = opendir(dir);
	assert_non_null(d);
	while (!found && (e = readdir(d))) {
		if (strstr(e->d_name, part)) {
			snprintf(path, len, "%.100s/%.200s", dir, e->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* Flip one byte of file path at offset off. */
static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t c;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &c, 1, off), 1);
	c ^= 0x5a;
	assert_int_equal(pwrite(fd, &c, 1, off), 1);
	close(fd);
}

/* How many entries of f->dir start with "index.damaged-"; the last one's
 * path into aside. */
static int damaged_dirs(struct fixture *f, char *aside, size_t len)
{
	struct dirent *e;
	DIR *d = opendir(f->dir);
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (strncmp(e->d_name, "index.damaged-", 14) == 0) {
			snprintf(aside, len, "%s/%s", f->dir, e->d_name);
			n++;
		}
	closedir(d);
	return n;
}

/* After damage the pool opens, DRAM and the (empty) tier both work. */
static void assert_serves(struct fixture *f)
{
	assert_check(f->s);
	assert_int_equal(put_id(f, f->ns, 900, 0), 0);
	assert_int_equal(get_check(f, f->ns, 900), 0);
	assert_int_equal(store_debug_nvme_demote_all(f->s), 0);
	assert_int_equal(stats_of(f->s).nvme_healthy, 1);
}

/* One flipped byte early in the write-ahead log: the open says how many
 * records were lost, keeps the log as found, and serves. */
static void test_wal_damage(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	char wal[512], aside[512], kept[600];
	struct store_stats st;
	struct stat sb;

	*state = f;
	assert_int_equal(run_then_kill(f, child_fill), 0);
	assert_true(index_file(f, ".log", wal, sizeof(wal)));
	flip_byte(wal, 40);
	f->warns = 0;
	assert_int_equal(open_pool(f), 0);
	st = stats_of(f->s);
	assert_true(st.index_records_lost >= 30);
	assert_int_equal(st.index_quarantined, 1);
	assert_int_equal(st.blocks, 0);
	assert_true(f->warns >= 1);
	assert_non_null(strstr(f->last_warn, "lost"));
	assert_int_equal(damaged_dirs(f, aside, sizeof(aside)), 1);
	snprintf(kept, sizeof(kept), "%s/wal-as-found", aside);
	assert_int_equal(stat(kept, &sb), 0);
	assert_true(S_ISDIR(sb.st_mode));
	assert_serves(f);
	/* the next start is clean: nothing lost, nothing moved aside */
	close_pool(f);
	assert_int_equal(open_pool(f), 0);
	st = stats_of(f->s);
	assert_int_equal(st.index_records_lost, 0);
	assert_int_equal(st.index_quarantined, 0);
	assert_int_equal(get_check(f, f->ns, 900), 0);
	assert_int_equal(damaged_dirs(f, aside, sizeof(aside)), 1);
}

/* An undamaged log loses nothing (no false alarm after a kill). */
static void test_wal_intact(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);
	char aside[512];

	*state = f;
	assert_int_equal(run_then_kill(f, child_fill), 0);
	assert_int_equal(open_pool(f), 0);
	assert_int_equal(stats_of(f->s).index_records_lost, 0);
	assert_int_equal(stats_of(f->s).blocks, 30);
	assert_int_equal(damaged_dirs(f, aside, sizeof(aside)), 0);
	for (uint64_t id = 1; id <= 30; id++)
		assert_int_equal(get_check(f, f->ns, id), 0);
}

/* Damage to CURRENT, the MANIFEST, or a table file: the index is moved
 * aside and the pool opens with an empty tier (before: store_open failed,
 * so kvpoold exited and DRAM never came up). */
static void damage_and_reopen(struct fixture *f, const char *part, off_t off, bool truncate_it)
{
	char path[512], aside[512];

	assert_int_equal(run_then_kill(f, child_fill), 0);
	/* a clean open and close: the log's records go to a table file */
	assert_int_equal(open_pool(f), 0);
	assert_int_equal(stats_of(f->s).blocks, 30);
	close_pool(f);
	assert_true(index_file(f, part, path, sizeof(path)));
	if (truncate_it)
		assert_int_equal(truncate(path, off), 0);
	else
		flip_byte(path, off);
	f->errors = 0;
	assert_int_equal(open_pool(f), 0);
	assert_int_equal(stats_of(f->s).index_quarantined, 1);
	assert_int_equal(stats_of(f->s).blocks, 0);
	assert_true(f->errors >= 1);
	assert_int_equal(damaged_dirs(f, aside, sizeof(aside)), 1);
	assert_serves(f);
}

static void test_current_damage(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	damage_and_reopen(f, "CURRENT", 3, false);
}

static void test_manifest_damage(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	damage_and_reopen(f, "MANIFEST-", 20, true);
}

static void test_sst_damage(void **state)
{
	struct fixture *f = fixture_new(2 * MIB, 8 * MIB);

	*state = f;
	damage_and_reopen(f, ".sst", 64, false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_delete_then_kill, teardown),
		cmocka_unit_test_teardown(test_delete_many_then_kill, teardown),
		cmocka_unit_test_teardown(test_drop_racing_demotion_then_kill, teardown),
		cmocka_unit_test_teardown(test_drop_then_kill, teardown),
		cmocka_unit_test_teardown(test_index_tombstone, teardown),
		cmocka_unit_test_teardown(test_admission_keeps_dram, teardown),
		cmocka_unit_test_teardown(test_keep_dram, teardown),
		cmocka_unit_test_teardown(test_keep_dram_timeout, teardown),
		cmocka_unit_test_teardown(test_freed_segments_punched, teardown),
		cmocka_unit_test_teardown(test_enospc_recovers, teardown),
		cmocka_unit_test_teardown(test_huge_capacity_refused_early, teardown),
		cmocka_unit_test_teardown(test_shrink_warns, teardown),
		cmocka_unit_test_teardown(test_wal_damage, teardown),
		cmocka_unit_test_teardown(test_wal_intact, teardown),
		cmocka_unit_test_teardown(test_current_damage, teardown),
		cmocka_unit_test_teardown(test_manifest_damage, teardown),
		cmocka_unit_test_teardown(test_sst_damage, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
