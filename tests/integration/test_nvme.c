/*
 * test_nvme.c - the NVMe tier against a real kvpoold whose nvme_dir is a
 * fresh temporary directory: blocks spill from a small DRAM tier to NVMe
 * and come back byte-exact; they survive a clean restart and a kill -9 in
 * the middle of demotions with no hole and nothing half-written; a byte
 * flipped in a segment file is a counted miss, never wrong data, and only
 * that block's result fails; a dropped namespace stays dropped after a
 * restart; a tier that runs out of room leaves DRAM serving; a second
 * kvpoold on the same directory, a directory of an unknown format and a
 * missing directory are refused before any port opens.
 *
 * Data: chains of blocks (each block's parent is the one before), keys
 * from harness_key(tag, chain * 1000 + i), payloads derived from the key
 * (so any block can be checked without remembering it), 8..64 KiB long.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"

#define KIB 1024u
#define MAX_BLOCK (64 * KIB)
#define CHAIN_MAX 32
/* A put or get answered BUSY (DRAM waits for the demoter) is retried
 * until this deadline. */
#define RETRY_MS 30000

/* One server on one directory, with the flags that name it. */
struct nvme_server {
	struct harness_server srv;
	char dir[256];
	const char *flags[HARNESS_MAX_ARGS];
};

/* The server (and directory) of the test running; teardown kills it and
 * removes the directory whatever the test's outcome. */
static struct nvme_server g_srv;
static char g_dir[256]; /* a directory a refusal test made */

static int teardown(void **state)
{
	(void)state;
	harness_kill(&g_srv.srv);
	if (g_srv.dir[0])
		harness_rm_rf(g_srv.dir);
	if (g_dir[0])
		harness_rm_rf(g_dir);
	memset(&g_srv, 0, sizeof(g_srv));
	g_dir[0] = '\0';
	return 0;
}

/* Fill s->flags: DRAM of dram, NVMe of capacity in segments of segment
 * bytes, then more (NULL-terminated list, may be NULL). The strings must
 * be static (they outlive the server). */
static void nvme_flags(struct nvme_server *s, const char *dram, const char *capacity,
		       const char *segment, const char *const *more)
{
	size_t n = 0;
	const char *base[] = {
		"--dram-capacity", dram, "--max-block-bytes", "256KiB", "--threads", "2",
		"--log-level", "warn", "--nvme-dir", s->dir, "--nvme-capacity", capacity,
		"--nvme-segment-size", segment, "--nvme-io-threads", "2", NULL,
	};

	for (size_t i = 0; base[i]; i++)
		s->flags[n++] = base[i];
	for (size_t i = 0; more && more[i]; i++)
		s->flags[n++] = more[i];
	assert_true(n < HARNESS_MAX_ARGS);
	s->flags[n] = NULL;
}

/* A fresh directory and a server on it; skips when $KVPOOLD is missing. */
static void nvme_start(struct nvme_server *s, const char *tag, const char *dram,
		       const char *capacity, const char *segment, const char *const *more)
{
	int err;

	memset(s, 0, sizeof(*s));
	assert_int_equal(harness_tmpdir(tag, s->dir, sizeof(s->dir)), 0);
	nvme_flags(s, dram, capacity, segment, more);
	err = harness_start(&s->srv, s->flags);
	if (err == -ENOENT) {
		harness_rm_rf(s->dir);
		harness_skip("KVPOOLD is not set to a built kvpoold");
	}
	assert_int_equal(err, 0);
}

/* Start again on the same directory and flags (after a stop or a kill). */
static void nvme_restart(struct nvme_server *s)
{
	assert_int_equal(s->srv.pid, 0);
	assert_int_equal(harness_start(&s->srv, s->flags), 0);
}

static void nvme_finish(struct nvme_server *s)
{
	if (s->srv.pid)
		assert_int_equal(harness_stop(&s->srv), 0);
	assert_int_equal(harness_rm_rf(s->dir), 0);
	s->dir[0] = '\0';
}

/* ---- blocks ------------------------------------------------------------- */

static void block_key(uint8_t key[32], const char *tag, uint32_t chain, uint32_t i)
{
	harness_key(key, tag, (uint64_t)chain * 1000 + i);
}

/* 8..64 KiB, from the key; fixed_len (if nonzero) instead. */
static size_t block_len(const uint8_t key[32], size_t fixed_len)
{
	return fixed_len ? fixed_len : 8 * KIB + harness_key_seed(key) % (56 * KIB + 1);
}

struct chain_bufs {
	uint8_t keys[CHAIN_MAX][32];
	uint8_t *data[CHAIN_MAX];
	size_t len[CHAIN_MAX];
	struct iovec iov[CHAIN_MAX];
};

static void chain_build(struct chain_bufs *b, const char *tag, uint32_t chain, uint32_t n,
			size_t fixed_len)
{
	assert_true(n <= CHAIN_MAX);
	for (uint32_t i = 0; i < n; i++) {
		block_key(b->keys[i], tag, chain, i);
		b->len[i] = block_len(b->keys[i], fixed_len);
		b->data[i] = malloc(b->len[i]);
		assert_non_null(b->data[i]);
		harness_fill(b->data[i], b->len[i], harness_key_seed(b->keys[i]));
		b->iov[i] = (struct iovec){ .iov_base = b->data[i], .iov_len = b->len[i] };
	}
}

static void chain_free(struct chain_bufs *b, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		free(b->data[i]);
}

/* Put one chain of n blocks, retrying the blocks the server was too busy
 * for (a child of a busy block comes back NO_PARENT: retried with it).
 * Returns 0, the first other per-block error, or -ETIMEDOUT. Any thread. */
static int put_chain(struct kvpool_client *c, const char *tag, uint32_t chain, uint32_t n,
		     size_t fixed_len)
{
	struct chain_bufs b;
	struct kvpool_put_block blocks[CHAIN_MAX];
	int st[CHAIN_MAX], rc = -ETIMEDOUT;
	uint64_t deadline = harness_now_ms() + RETRY_MS;

	chain_build(&b, tag, chain, n, fixed_len);
	for (uint32_t i = 0; i < n; i++)
		blocks[i] = (struct kvpool_put_block){ .key = b.keys[i],
						       .parent = i ? b.keys[i - 1] : NULL,
						       .iov = &b.iov[i], .iovcnt = 1 };
	while (harness_now_ms() < deadline) {
		int retry = 0;

		rc = kvpool_put(c, blocks, n, st);
		if (rc == 0)
			break;
		for (uint32_t i = 0; i < n && !retry; i++)
			retry = st[i] == -EAGAIN || st[i] == -ENOLINK;
		if (!retry)
			break;
		rc = -ETIMEDOUT;
		harness_sleep_ms(2);
	}
	chain_free(&b, n);
	return rc;
}

static void put_chains_or_fail(struct kvpool_client *c, const char *tag, uint32_t first,
			       uint32_t chains, uint32_t n, size_t fixed_len)
{
	for (uint32_t ch = first; ch < first + chains; ch++) {
		int rc = put_chain(c, tag, ch, n, fixed_len);

		if (rc)
			fail_msg("put chain %s/%u: %s", tag, ch, kvpool_strerror(rc));
	}
}

/* What a look at one chain found. */
struct chain_check {
	uint32_t matched;  /* MATCH: leading blocks present */
	uint32_t returned; /* of them, GET returned byte-exact */
	uint32_t missed;   /* of them, GET answered NOT_FOUND */
};

/* GET blocks [0, count) of a chain in one batch, retrying BUSY ones.
 * Every answer is exact bytes or NOT_FOUND, never anything else. */
static void get_prefix(struct kvpool_client *c, const char *tag, uint32_t chain, uint32_t count,
		       size_t fixed_len, struct chain_check *out)
{
	struct chain_bufs want;
	struct kvpool_get_block gb[CHAIN_MAX];
	struct iovec iov[CHAIN_MAX];
	uint8_t *got[CHAIN_MAX];
	int st[CHAIN_MAX], done[CHAIN_MAX] = { 0 };
	uint64_t deadline = harness_now_ms() + RETRY_MS;
	uint32_t left = count;

	chain_build(&want, tag, chain, count, fixed_len);
	for (uint32_t i = 0; i < count; i++) {
		got[i] = malloc(MAX_BLOCK);
		assert_non_null(got[i]);
	}
	while (left) {
		uint32_t idx[CHAIN_MAX], m = 0;

		assert_true(harness_now_ms() < deadline);
		for (uint32_t i = 0; i < count; i++) {
			if (done[i])
				continue;
			iov[m] = (struct iovec){ .iov_base = got[i], .iov_len = MAX_BLOCK };
			gb[m] = (struct kvpool_get_block){ .key = want.keys[i], .iov = &iov[m],
							   .iovcnt = 1 };
			idx[m++] = i;
		}
		kvpool_get(c, gb, m, st);
		for (uint32_t k = 0; k < m; k++) {
			uint32_t i = idx[k];

			if (st[k] == -EAGAIN)
				continue;
			if (st[k] == 0) {
				assert_int_equal(gb[k].length, want.len[i]);
				assert_memory_equal(got[i], want.data[i], want.len[i]);
				out->returned++;
			} else if (st[k] == -ENOENT) {
				out->missed++;
			} else {
				fail_msg("get %s/%u block %u: %s", tag, chain, i, kvpool_strerror(st[k]));
			}
			done[i] = 1;
			left--;
		}
		if (left)
			harness_sleep_ms(2);
	}
	for (uint32_t i = 0; i < count; i++)
		free(got[i]);
	chain_free(&want, count);
}

/* MATCH the chain, check EXISTS agrees with it block by block (a prefix,
 * no hole), then GET the matched prefix. */
static void check_chain(struct kvpool_client *c, const char *tag, uint32_t chain, uint32_t n,
			size_t fixed_len, struct chain_check *out)
{
	uint8_t keys[CHAIN_MAX][32] = { { 0 } };
	int st[CHAIN_MAX];
	size_t matched = 0;

	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < n; i++)
		block_key(keys[i], tag, chain, i);
	assert_int_equal(kvpool_match(c, keys, n, 0, &matched), 0);
	assert_int_equal(kvpool_exists(c, keys, n, st), 0);
	for (uint32_t i = 0; i < n; i++) {
		if ((st[i] == 0) != (i < matched))
			fail_msg("chain %s/%u: match says %zu blocks but block %u %s", tag, chain,
				 matched, i, st[i] == 0 ? "exists (a hole)" : "is missing");
	}
	out->matched = (uint32_t)matched;
	if (matched)
		get_prefix(c, tag, chain, (uint32_t)matched, fixed_len, out);
}

/* Check chains [0, chains); returns the totals. */
static struct chain_check check_chains(struct kvpool_client *c, const char *tag, uint32_t chains,
				       uint32_t n, size_t fixed_len)
{
	struct chain_check sum = { 0 }, one;

	for (uint32_t ch = 0; ch < chains; ch++) {
		check_chain(c, tag, ch, n, fixed_len, &one);
		sum.matched += one.matched;
		sum.returned += one.returned;
		sum.missed += one.missed;
	}
	return sum;
}

/* STATS of the NVMe tier: tiers.nvme.<field>. */
static uint64_t nvme_stat(struct kvpool_client *c, const char *field)
{
	char path[128];

	snprintf(path, sizeof(path), "tiers.nvme.%s", field);
	return harness_stat_or_fail(c, path);
}

static struct kvpool_client *client_or_fail(const struct nvme_server *s, const char *ns)
{
	struct kvpool_client *c = NULL;

	assert_int_equal(harness_client(&s->srv, ns, &c), 0);
	return c;
}

/* ---- spill, both tiers, restart ---------------------------------------- */

#define SPILL_CHAINS 40
#define SPILL_LEN 16

/* Three times what DRAM holds goes in; everything comes back byte-exact,
 * some of it from NVMe (tier 2 in the GET result). */
static void test_spill_and_get_both_tiers(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct chain_check sum;
	struct json_object *doc;
	uint32_t from_nvme = 0, from_dram = 0;
	int fd;

	(void)state;
	nvme_start(sv, "nvme-spill", "8MiB", "64MiB", "2MiB", NULL);
	c = client_or_fail(sv, "spill");
	put_chains_or_fail(c, "spill", 0, SPILL_CHAINS, SPILL_LEN, 0);
	assert_true(nvme_stat(c, "demotions") > 0);
	assert_int_equal(harness_stat_or_fail(c, "blocks"), SPILL_CHAINS * SPILL_LEN);
	assert_true(harness_stat_or_fail(c, "tiers.dram.blocks") < SPILL_CHAINS * SPILL_LEN);

	/* the oldest chains left DRAM: a raw GET shows where each came from */
	fd = harness_raw_session_or_fail(sv->srv.port, "spill", NULL);
	for (uint32_t ch = 0; ch < 4; ch++) {
		uint8_t keys[SPILL_LEN][32];
		struct harness_frame f;
		uint64_t off = 0;

		for (uint32_t i = 0; i < SPILL_LEN; i++)
			block_key(keys[i], "spill", ch, i);
		assert_int_equal(harness_raw_get(fd, 10 + ch, keys, SPILL_LEN, MAX_BLOCK, 10000, &f),
				 0);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		assert_int_equal(f.h.request_id, 10 + ch);
		for (uint32_t i = 0; i < SPILL_LEN; i++) {
			struct proto_result r;
			uint8_t *want;

			assert_int_equal(harness_reply_result(&f, i, &r), 0);
			if (r.status == PROTO_STATUS_BUSY)
				continue; /* no DRAM room right now: fine, checked below */
			assert_int_equal(r.status, PROTO_STATUS_OK);
			assert_int_equal(r.length, block_len(keys[i], 0));
			want = malloc(r.length);
			assert_non_null(want);
			harness_fill(want, r.length, harness_key_seed(keys[i]));
			assert_memory_equal(f.payload + off, want, r.length);
			assert_int_equal(r.checksum, harness_xxh3(want, r.length));
			free(want);
			off += r.length;
			from_nvme += r.tier == PROTO_TIER_NVME;
			from_dram += r.tier == PROTO_TIER_DRAM;
		}
		assert_int_equal(off, f.h.payload_bytes);
		harness_frame_free(&f);
	}
	close(fd);
	assert_true(from_nvme > 0);
	assert_true(nvme_stat(c, "promotions") >= from_nvme);
	assert_true(nvme_stat(c, "promoted_bytes") > 0);

	sum = check_chains(c, "spill", SPILL_CHAINS, SPILL_LEN, 0);
	assert_int_equal(sum.matched, SPILL_CHAINS * SPILL_LEN);
	assert_int_equal(sum.returned, SPILL_CHAINS * SPILL_LEN);
	assert_int_equal(nvme_stat(c, "corrupt_blocks"), 0);
	assert_int_equal(harness_stats(c, NULL, &doc), 0);
	assert_true(harness_json_u64_or_fail(doc, "namespaces.spill.nvme_blocks") > 0);
	assert_int_equal(harness_json_u64_or_fail(doc, "namespaces.spill.blocks"),
			 SPILL_CHAINS * SPILL_LEN);
	assert_true(harness_json_u64_or_fail(doc, "tiers.nvme.used_bytes") <=
		    harness_json_u64_or_fail(doc, "tiers.nvme.capacity_bytes"));
	json_object_put(doc);
	/* every file and directory kvpoold made holds tenants' payloads or
	 * their index: owner only (issue 20 item 7) */
	{
		static const char *const dirs[] = { "segments", "index" };
		static const char *const files[] = { "segments/00000000", "FORMAT", "LOCK",
						     "index/CURRENT" };
		char path[600];
		struct stat st;

		for (size_t i = 0; i < 2; i++) {
			snprintf(path, sizeof(path), "%s/%s", sv->dir, dirs[i]);
			assert_int_equal(stat(path, &st), 0);
			if ((st.st_mode & 07777) != 0700)
				fail_msg("%s has mode %04o, want 0700", path, st.st_mode & 07777);
		}
		for (size_t i = 0; i < 4; i++) {
			snprintf(path, sizeof(path), "%s/%s", sv->dir, files[i]);
			assert_int_equal(stat(path, &st), 0);
			if ((st.st_mode & 07777) != 0600)
				fail_msg("%s has mode %04o, want 0600", path, st.st_mode & 07777);
		}
	}
	kvpool_close(c);
	nvme_finish(sv);
}

/* A clean stop keeps what is on NVMe: after the restart every surviving
 * block is matchable and byte-exact, chains have no hole, and the rebuild
 * counts add up. */
static void test_restart_keeps_nvme_blocks(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct chain_check sum;
	uint64_t on_nvme, rebuilt, orphans;

	(void)state;
	nvme_start(sv, "nvme-restart", "8MiB", "64MiB", "2MiB", NULL);
	c = client_or_fail(sv, "warm");
	put_chains_or_fail(c, "warm", 0, SPILL_CHAINS, SPILL_LEN, 0);
	on_nvme = nvme_stat(c, "blocks");
	assert_true(on_nvme > SPILL_CHAINS * SPILL_LEN / 2);
	kvpool_close(c);
	assert_int_equal(harness_stop(&sv->srv), 0);

	nvme_restart(sv);
	c = client_or_fail(sv, "warm");
	rebuilt = nvme_stat(c, "rebuild_blocks");
	orphans = nvme_stat(c, "orphans_dropped");
	/* demotions in flight at the stop may have finished: >= */
	assert_true(rebuilt + orphans >= on_nvme);
	assert_int_equal(harness_stat_or_fail(c, "blocks"), rebuilt);
	assert_int_equal(nvme_stat(c, "blocks"), rebuilt);
	assert_int_equal(harness_stat_or_fail(c, "tiers.dram.blocks"), 0);
	sum = check_chains(c, "warm", SPILL_CHAINS, SPILL_LEN, 0);
	assert_int_equal(sum.matched, rebuilt);
	assert_int_equal(sum.returned, rebuilt);
	assert_int_equal(nvme_stat(c, "promotions"), rebuilt);
	/* everything read back is in DRAM again, and still on NVMe */
	assert_int_equal(nvme_stat(c, "blocks"), rebuilt);
	kvpool_close(c);
	nvme_finish(sv);
}

/* ---- kill -9 while demoting --------------------------------------------- */

struct putter {
	const struct nvme_server *s;
	uint32_t chains;   /* started (the last may be partly stored) */
	volatile int stop;
	int err;           /* what ended it (the server going away) */
};

/* Put chains until told to stop or the server dies. */
static void *putter_main(void *arg)
{
	struct putter *p = arg;
	struct kvpool_client *c = NULL;
	struct kvpool_options opts = { .timeout_ms = 5000 };

	p->err = kvpool_connect(p->s->srv.url, "crash", &opts, &c);
	while (!p->err && !p->stop && p->chains < 200) {
		__atomic_add_fetch(&p->chains, 1, __ATOMIC_SEQ_CST);
		p->err = put_chain(c, "crash", p->chains - 1, SPILL_LEN, 0);
	}
	kvpool_close(c);
	return NULL;
}

static void test_kill9_while_demoting(void **state)
{
	struct putter p = { 0 };
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct chain_check sum;
	uint64_t corrupt, read_errors, misses0;
	pthread_t t;

	(void)state;
	nvme_start(sv, "nvme-kill", "8MiB", "64MiB", "2MiB", NULL);
	p.s = sv;
	c = client_or_fail(sv, "crash");
	assert_int_equal(pthread_create(&t, NULL, putter_main, &p), 0);
	/* demotions are running: kill mid-stream, puts still arriving */
	assert_true(harness_wait_stat_at_least_or_fail(c, "tiers.nvme.demotions", 300, 20000) >=
		    300);
	kvpool_close(c);
	harness_kill(&sv->srv);
	p.stop = 1;
	assert_int_equal(pthread_join(t, NULL), 0);

	nvme_restart(sv);
	c = client_or_fail(sv, "crash");
	misses0 = harness_stat_or_fail(c, "ops.get.misses");
	sum = check_chains(c, "crash", p.chains, SPILL_LEN, 0);
	corrupt = nvme_stat(c, "corrupt_blocks");
	read_errors = nvme_stat(c, "read_errors");
	assert_true(sum.matched > 0);
	assert_int_equal(harness_ns_stat_or_fail(c, "crash", "blocks"), sum.returned);
	/* a process crash loses no written byte: nothing visible is bad */
	assert_int_equal(sum.missed, 0);
	assert_int_equal(corrupt + read_errors, 0);
	assert_int_equal(harness_stat_or_fail(c, "ops.get.misses") - misses0, 0);
	assert_int_equal(sum.returned, sum.matched);
	kvpool_close(c);
	nvme_finish(sv);
}

/* ---- a flipped byte ------------------------------------------------------- */

/* Flip byte `at` of every segment file whose first page holds data.
 * Returns how many files were changed. */
static uint32_t flip_segments(const char *dir, off_t at)
{
	char path[1024];
	struct dirent *e;
	uint32_t flipped = 0;
	DIR *d;

	snprintf(path, sizeof(path), "%s/segments", dir);
	d = opendir(path);
	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		uint8_t page[4096], zero[4096] = { 0 };
		int fd;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/segments/%s", dir, e->d_name);
		fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		if (pread(fd, page, sizeof(page), 0) == (ssize_t)sizeof(page) &&
		    memcmp(page, zero, sizeof(page))) {
			page[at] ^= 0x5a;
			assert_int_equal(pwrite(fd, &page[at], 1, at), 1);
			flipped++;
		}
		close(fd);
	}
	closedir(d);
	return flipped;
}

#define FLIP_CHAINS 20

/* Every segment's first block gets a byte flipped on disk. After a
 * restart (so every block is read from NVMe) one batch GET of every block
 * answers the damaged blocks NOT_FOUND, counted, and every other block
 * byte-exact; nothing comes back wrong. */
static void test_flipped_byte_is_a_counted_miss(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	uint8_t (*keys)[32];
	struct kvpool_get_block *gb;
	struct iovec *iov;
	uint8_t *bufs, *want;
	int *st;
	uint32_t n = 0, ok = 0, missed = 0, flipped;
	uint64_t misses0, rebuilt;

	(void)state;
	nvme_start(sv, "nvme-flip", "8MiB", "64MiB", "2MiB", NULL);
	c = client_or_fail(sv, "flip");
	put_chains_or_fail(c, "flip", 0, FLIP_CHAINS, SPILL_LEN, MAX_BLOCK);
	kvpool_close(c);
	assert_int_equal(harness_stop(&sv->srv), 0);
	flipped = flip_segments(sv->dir, 100);
	assert_true(flipped > 0);
	nvme_restart(sv);
	c = client_or_fail(sv, "flip");
	rebuilt = nvme_stat(c, "rebuild_blocks");
	assert_true(rebuilt > 0);
	misses0 = harness_stat_or_fail(c, "ops.get.misses");

	keys = calloc(FLIP_CHAINS * SPILL_LEN, 32);
	gb = calloc(FLIP_CHAINS * SPILL_LEN, sizeof(*gb));
	iov = calloc(FLIP_CHAINS * SPILL_LEN, sizeof(*iov));
	st = calloc(FLIP_CHAINS * SPILL_LEN, sizeof(*st));
	bufs = malloc((size_t)FLIP_CHAINS * SPILL_LEN * MAX_BLOCK);
	want = malloc(MAX_BLOCK);
	assert_true(keys && gb && iov && st && bufs && want);
	/* one batch: every block the rebuild made visible */
	for (uint32_t ch = 0; ch < FLIP_CHAINS; ch++) {
		for (uint32_t i = 0; i < SPILL_LEN; i++) {
			int ex;

			block_key(keys[n], "flip", ch, i);
			assert_int_equal(kvpool_exists(c, keys[n], 1, &ex), 0);
			if (ex)
				continue;
			iov[n] = (struct iovec){ .iov_base = bufs + (size_t)n * MAX_BLOCK,
						 .iov_len = MAX_BLOCK };
			gb[n] = (struct kvpool_get_block){ .key = keys[n], .iov = &iov[n], .iovcnt = 1 };
			n++;
		}
	}
	assert_int_equal(n, rebuilt);
	kvpool_get(c, gb, n, st);
	for (uint32_t k = 0; k < n; k++) {
		if (st[k] == -EAGAIN)
			continue; /* no DRAM room for it right now: neither */
		if (st[k] == -ENOENT) {
			missed++;
			continue;
		}
		if (st[k] != 0)
			fail_msg("block %u: %s (wrong bytes must never arrive)", k,
				 kvpool_strerror(st[k]));
		harness_fill(want, MAX_BLOCK, harness_key_seed(keys[k]));
		assert_int_equal(gb[k].length, MAX_BLOCK);
		assert_memory_equal(iov[k].iov_base, want, MAX_BLOCK);
		ok++;
	}
	/* per block: the damaged ones failed, the rest of the batch did not */
	assert_true(missed >= 1);
	assert_true(ok >= 1);
	assert_true(nvme_stat(c, "corrupt_blocks") >= 1);
	assert_true(nvme_stat(c, "corrupt_blocks") <= flipped);
	assert_int_equal(harness_stat_or_fail(c, "ops.get.misses") - misses0, missed);
	/* what failed is gone with its descendants; what remains is whole */
	{
		struct chain_check sum = check_chains(c, "flip", FLIP_CHAINS, SPILL_LEN, MAX_BLOCK);

		assert_true(sum.matched <= rebuilt - missed);
		assert_int_equal(sum.returned, sum.matched);
		assert_int_equal(harness_stat_or_fail(c, "blocks"), sum.matched);
	}
	free(keys);
	free(gb);
	free(iov);
	free(st);
	free(bufs);
	free(want);
	kvpool_close(c);
	nvme_finish(sv);
}

/* ---- DROP_NAMESPACE --------------------------------------------------------- */

static void test_drop_namespace_survives_restart(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *keep, *drop;
	struct chain_check sum;
	uint64_t dropped = 0, keep_nvme;

	(void)state;
	nvme_start(sv, "nvme-drop", "8MiB", "64MiB", "2MiB", NULL);
	keep = client_or_fail(sv, "keep-b");
	drop = client_or_fail(sv, "drop-a");
	put_chains_or_fail(keep, "keep", 0, 10, SPILL_LEN, 0);
	/* drop-a pushes keep-b out to NVMe, and spills itself */
	put_chains_or_fail(drop, "drop", 0, 30, SPILL_LEN, 0);
	assert_true(harness_ns_stat_or_fail(drop, "drop-a", "nvme_blocks") > 0);
	keep_nvme = harness_ns_stat_or_fail(keep, "keep-b", "nvme_blocks");
	assert_true(keep_nvme > 0);
	assert_int_equal(kvpool_drop_namespace(drop, NULL, &dropped), 0);
	assert_int_equal(dropped, 30 * SPILL_LEN);
	assert_int_equal(harness_ns_stat_or_fail(drop, "drop-a", "blocks"), 0);
	assert_int_equal(harness_ns_stat_or_fail(drop, "drop-a", "nvme_blocks"), 0);
	kvpool_close(drop);
	kvpool_close(keep);
	assert_int_equal(harness_stop(&sv->srv), 0);

	nvme_restart(sv);
	drop = client_or_fail(sv, "drop-a");
	keep = client_or_fail(sv, "keep-b");
	sum = check_chains(drop, "drop", 30, SPILL_LEN, 0);
	assert_int_equal(sum.matched, 0);
	assert_int_equal(harness_ns_stat_or_fail(drop, "drop-a", "blocks"), 0);
	sum = check_chains(keep, "keep", 10, SPILL_LEN, 0);
	assert_true(sum.matched >= keep_nvme - nvme_stat(keep, "orphans_dropped"));
	assert_int_equal(sum.returned, sum.matched);
	assert_int_equal(harness_stat_or_fail(keep, "blocks"), sum.matched);
	kvpool_close(drop);
	kvpool_close(keep);
	nvme_finish(sv);
}

/* ---- a full tier -------------------------------------------------------- */

/* NVMe room for four segments of 1 MiB and 8 MiB of DRAM, and 30 MiB of
 * blocks: the tier fills and evicts, puts keep succeeding, the newest
 * blocks and whatever is still listed stay byte-exact. */
static void test_full_tier_keeps_dram_serving(void **state)
{
	static const char *const small_blocks[] = { "--max-block-bytes", "64KiB", NULL };
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct chain_check sum, last;
	uint64_t visible;

	(void)state;
	nvme_start(sv, "nvme-full", "8MiB", "4MiB", "1MiB", small_blocks);
	c = client_or_fail(sv, "full");
	put_chains_or_fail(c, "full", 0, 60, 8, MAX_BLOCK);
	assert_true(nvme_stat(c, "used_bytes") <= 4 * 1024 * KIB);
	assert_true(nvme_stat(c, "evictions") + harness_stat_or_fail(c, "evictions") > 0);
	/* refusals were BUSY (DRAM waiting for the demoter) and the NO_PARENT
	 * of their children, all retried: never FULL */
	assert_int_equal(harness_stat_or_fail(c, "ops.errors.full"), 0);
	visible = harness_stat_or_fail(c, "blocks");
	assert_true(visible < 60 * 8);
	/* the last chain put is whole */
	check_chain(c, "full", 59, 8, MAX_BLOCK, &last);
	assert_int_equal(last.matched, 8);
	assert_int_equal(last.returned, 8);
	sum = check_chains(c, "full", 60, 8, MAX_BLOCK);
	assert_true(sum.matched >= 8);
	assert_int_equal(sum.missed, 0);
	/* and it keeps taking more */
	put_chains_or_fail(c, "full", 60, 10, 8, MAX_BLOCK);
	check_chain(c, "full", 69, 8, MAX_BLOCK, &last);
	assert_int_equal(last.returned, 8);
	kvpool_close(c);
	nvme_finish(sv);
}

/* ---- admission ------------------------------------------------------------- */

/* nvme_admission = reused: blocks never read after their put are evicted,
 * not demoted (counted), except to keep chains whole; nothing gets a hole. */
static void test_admission_reused(void **state)
{
	static const char *const reused[] = { "--nvme-admission", "reused", NULL };
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct chain_check sum, first;

	(void)state;
	nvme_start(sv, "nvme-admit", "8MiB", "64MiB", "2MiB", reused);
	c = client_or_fail(sv, "admit");
	put_chains_or_fail(c, "admit", 0, 2, SPILL_LEN, 0);
	check_chain(c, "admit", 0, SPILL_LEN, 0, &first); /* chain 0 is used */
	assert_int_equal(first.returned, SPILL_LEN);
	put_chains_or_fail(c, "admit", 2, SPILL_CHAINS - 2, SPILL_LEN, 0);
	assert_true(nvme_stat(c, "admission_rejections") > 0);
	check_chain(c, "admit", 0, SPILL_LEN, 0, &first);
	assert_int_equal(first.matched, SPILL_LEN); /* the reused chain was kept */
	sum = check_chains(c, "admit", SPILL_CHAINS, SPILL_LEN, 0);
	assert_int_equal(sum.returned, sum.matched);
	assert_int_equal(harness_stat_or_fail(c, "blocks"), sum.matched);
	kvpool_close(c);
	nvme_finish(sv);
}

/* ---- ordering and connections closed mid-read ------------------------------ */

/* After a restart every block is on NVMe only. Pipelined GET, PING, GET
 * on one connection come back in request order; a connection that sends
 * GETs of NVMe blocks and closes at once leaves the server well; SIGTERM
 * is clean (and leak-free under valgrind) with such reads in flight. */
static void test_order_and_close_while_reading(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;
	struct harness_frame f;
	uint8_t keys[SPILL_LEN][32];
	int fd;

	(void)state;
	nvme_start(sv, "nvme-order", "8MiB", "64MiB", "2MiB", NULL);
	c = client_or_fail(sv, "order");
	put_chains_or_fail(c, "order", 0, SPILL_CHAINS, SPILL_LEN, 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(&sv->srv), 0);
	nvme_restart(sv);

	fd = harness_raw_session_or_fail(sv->srv.port, "order", NULL);
	for (uint32_t i = 0; i < SPILL_LEN; i++)
		block_key(keys[i], "order", 0, i);
	assert_int_equal(harness_raw_get_send(fd, 21, keys, 4, MAX_BLOCK), 0);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_PING, 22, NULL, 0, NULL, 0), 0);
	assert_int_equal(harness_raw_get_send(fd, 23, keys, 8, MAX_BLOCK), 0);
	for (uint64_t id = 21; id <= 23; id++) {
		assert_int_equal(harness_read_frame(fd, 10000, &f), 0);
		assert_int_equal(f.h.request_id, id);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		if (id == 21) {
			struct proto_result r;

			assert_int_equal(harness_reply_result(&f, 0, &r), 0);
			assert_true(r.status == PROTO_STATUS_OK || r.status == PROTO_STATUS_BUSY);
			if (r.status == PROTO_STATUS_OK)
				assert_int_equal(r.tier, PROTO_TIER_NVME);
		}
		harness_frame_free(&f);
	}
	close(fd);

	/* GETs of NVMe blocks, then the peer is gone before the reads end */
	for (uint32_t ch = 1; ch < 6; ch++) {
		fd = harness_raw_session_or_fail(sv->srv.port, "order", NULL);
		for (uint32_t i = 0; i < SPILL_LEN; i++)
			block_key(keys[i], "order", ch, i);
		assert_int_equal(harness_raw_get_send(fd, 1, keys, SPILL_LEN, MAX_BLOCK), 0);
		assert_int_equal(harness_raw_get_send(fd, 2, keys, SPILL_LEN, MAX_BLOCK), 0);
		close(fd);
	}
	/* and once more with the server stopping while they are read */
	fd = harness_raw_session_or_fail(sv->srv.port, "order", NULL);
	for (uint32_t i = 0; i < SPILL_LEN; i++)
		block_key(keys[i], "order", 7, i);
	assert_int_equal(harness_raw_get_send(fd, 1, keys, SPILL_LEN, MAX_BLOCK), 0);
	c = client_or_fail(sv, "order");
	assert_int_equal(kvpool_ping(c, NULL), 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(&sv->srv), 0);
	close(fd);
	nvme_finish(sv);
}

/* ---- directories kvpoold refuses ------------------------------------------- */

/* Run kvpoold on dir (capacity 64MiB) expecting a refusal with `status`
 * and a message holding every NULL-terminated string that follows. */
static void expect_refusal(const char *dir, int status, ...)
{
	const char *flags[] = {
		"--dram-capacity", "8MiB", "--max-block-bytes", "256KiB", "--log-level", "warn",
		"--nvme-dir", dir,
		"--nvme-capacity", "64MiB", "--nvme-segment-size", "2MiB", NULL,
	};
	char *text = NULL;
	int code = -1, err;
	va_list ap;

	err = harness_start_fail(flags, 20000, &code, &text);
	if (err == -ENOENT)
		harness_skip("KVPOOLD is not set to a built kvpoold");
	if (err)
		fail_msg("kvpoold on %s did not refuse: %s", dir, strerror(-err));
	if (code != status)
		fail_msg("kvpoold on %s exited %d, want %d: %s", dir, code, status, text);
	va_start(ap, status);
	for (const char *want; (want = va_arg(ap, const char *)) != NULL;) {
		if (!strstr(text, want))
			fail_msg("kvpoold's message lacks '%s': %s", want, text);
	}
	va_end(ap);
	free(text);
}

static void test_second_server_same_dir_refused(void **state)
{
	struct nvme_server *sv = &g_srv;
	struct kvpool_client *c;

	(void)state;
	nvme_start(sv, "nvme-lock", "8MiB", "64MiB", "2MiB", NULL);
	expect_refusal(sv->dir, 1, sv->dir, "in use", "locked by another process", NULL);
	/* the first one never noticed */
	c = client_or_fail(sv, "lock");
	assert_int_equal(put_chain(c, "lock", 0, 4, 0), 0);
	kvpool_close(c);
	nvme_finish(sv);
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

static void test_unknown_format_refused(void **state)
{
	char *dir = g_dir, path[512];

	(void)state;
	assert_int_equal(harness_tmpdir("nvme-format", g_dir, sizeof(g_dir)), 0);
	write_file(dir, "FORMAT", "kvpool-nvme 2\n");
	expect_refusal(dir, 1, dir, "format version 2", "reads version 1", NULL);
	write_file(dir, "FORMAT", "something else\n");
	expect_refusal(dir, 1, dir, "not a kvpool-nvme format file", NULL);
	/* a tier directory without its FORMAT is not guessed at either */
	snprintf(path, sizeof(path), "%s/FORMAT", dir);
	assert_int_equal(unlink(path), 0);
	snprintf(path, sizeof(path), "%s/segments", dir);
	assert_int_equal(mkdir(path, 0700), 0);
	expect_refusal(dir, 1, dir, NULL);
}

static void test_missing_dir_refused(void **state)
{
	char *dir = g_dir, missing[300], file[300];

	(void)state;
	assert_int_equal(harness_tmpdir("nvme-missing", g_dir, sizeof(g_dir)), 0);
	snprintf(missing, sizeof(missing), "%s/nope", dir);
	/* a bad setting, found before the store opens: exit 2 */
	expect_refusal(missing, 2, missing, "does not exist", NULL);
	snprintf(file, sizeof(file), "%s/a-file", dir);
	write_file(dir, "a-file", "x");
	expect_refusal(file, 2, file, "is not a directory", NULL);
}

/* A bad combination of settings stops kvpoold before the store: exit 2. */
static void test_bad_settings_refused(void **state)
{
	static const char *const no_capacity[] = {
		"--dram-capacity", "8MiB", "--max-block-bytes", "256KiB", "--nvme-dir", "/tmp", NULL,
	};
	static const char *const tiny[] = {
		"--dram-capacity", "8MiB", "--max-block-bytes", "256KiB", "--nvme-dir", "/tmp",
		"--nvme-capacity", "3MiB",
		"--nvme-segment-size", "2MiB", NULL,
	};
	char *text = NULL;
	int code = -1;

	(void)state;
	if (harness_start_fail(no_capacity, 10000, &code, &text) == -ENOENT)
		harness_skip("KVPOOLD is not set to a built kvpoold");
	assert_int_equal(code, 2);
	assert_non_null(strstr(text, "nvme_capacity must be set when nvme_dir is set"));
	free(text);
	assert_int_equal(harness_start_fail(tiny, 10000, &code, &text), 0);
	assert_int_equal(code, 2);
	assert_non_null(strstr(text, "must hold two segments"));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_spill_and_get_both_tiers, teardown),
		cmocka_unit_test_teardown(test_restart_keeps_nvme_blocks, teardown),
		cmocka_unit_test_teardown(test_kill9_while_demoting, teardown),
		cmocka_unit_test_teardown(test_flipped_byte_is_a_counted_miss, teardown),
		cmocka_unit_test_teardown(test_drop_namespace_survives_restart, teardown),
		cmocka_unit_test_teardown(test_full_tier_keeps_dram_serving, teardown),
		cmocka_unit_test_teardown(test_admission_reused, teardown),
		cmocka_unit_test_teardown(test_order_and_close_while_reading, teardown),
		cmocka_unit_test_teardown(test_second_server_same_dir_refused, teardown),
		cmocka_unit_test_teardown(test_unknown_format_refused, teardown),
		cmocka_unit_test_teardown(test_missing_dir_refused, teardown),
		cmocka_unit_test_teardown(test_bad_settings_refused, teardown),
	};

	return cmocka_run_group_tests_name("integ_nvme", tests, NULL, NULL);
}
