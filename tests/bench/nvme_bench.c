/*
 * nvme_bench.c - demotion and promotion throughput of the NVMe tier,
 * through storage/store.h only.
 *
 * Opens a store with a small DRAM arena and an NVMe directory, puts N
 * blocks (chains of 16, like prompts) so that nearly all of them must be
 * demoted, waits until demotions stop, then gets every block in random
 * order with a window of asynchronous gets (the NVMe-only ones are
 * promoted) and checks every byte.
 *
 *   demotion GB/s  = demoted_bytes / (time demoted_bytes took to go from 0
 *                    to its final value), sampled every 2 ms
 *   promotion GB/s = promoted_bytes / duration of the get phase
 *
 * Then it closes the store and opens it again: the rebuild's time and
 * block count (rebuild_ms, rebuild_blocks, orphans_dropped) are reported,
 * every block is looked up with EXISTS, and a sample is fetched and
 * byte-checked. --no-get skips the get phase (a rebuild-only run with many
 * small blocks).
 *
 * Payloads: 64 random 1 MiB patterns; block i is pattern i % 64 with the
 * first 16 bytes of each 4 KiB page replaced by (magic, i, page), so a
 * block read from the wrong place, or a page from the wrong place, fails
 * the byte check. Checksums are computed before the timed phases.
 *
 * Last line of output, for tests/bench/nvme_tier.sh:
 *   RESULT demote_gbps=F promote_gbps=F put_gbps=F direct_io=B blocks=N
 *          demoted=N promoted=N rebuild_ms=N rebuild_blocks=N
 *          rebuild_blocks_per_s=F orphans=N errors=N
 * Exit status 0 only when every block came back byte-exact.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../unit/store_fixture.h" /* mix64 (inline; nothing of it is linked) */
#include "debug/store_debug.h"
#include "store.h"

#define MIB ((uint64_t)1 << 20)
#define PATTERNS 64u
#define CHAIN_BLOCKS 16u
#define STAMP_MAGIC 0x6b76706f6f6c4e56ull /* "kvpoolNV" */
#define SAMPLE_NS 2000000ull
#define STALL_LIMIT_NS (60ull * 1000000000ull)
#define REOPEN_SAMPLE 256u

struct opts {
	const char *dir;
	uint64_t blocks;
	uint64_t block_bytes;
	uint64_t dram_bytes;
	uint64_t nvme_capacity_bytes; /* 0 = blocks' bytes + 4 segments */
	uint64_t segment_bytes;       /* 0 = store default */
	uint32_t io_threads;
	uint32_t window;              /* asynchronous gets in flight */
	bool no_get;                  /* skip the get phase */
	bool verbose;
};

struct bench {
	struct opts o;
	struct store *s;
	uint32_t ns;
	uint8_t *patterns;            /* PATTERNS * block_bytes */
	uint64_t *checksums;          /* per block */
	uint64_t errors;
	/* demotion sampler */
	pthread_t sampler;
	atomic_bool sampler_stop;
	pthread_mutex_t lock;
	uint64_t t_zero_ns;           /* last sample with demoted_bytes == 0 */
	uint64_t t_change_ns;         /* first sample with the latest value */
	uint64_t last_demoted;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };

	nanosleep(&ts, NULL);
}

static void log_line(void *arg, enum store_log_level level, const char *msg)
{
	static const char *names[] = { "err", "warn", "info", "debug" };
	const struct opts *o = arg;

	if (level <= STORE_LOG_WARN || o->verbose)
		fprintf(stderr, "store %s: %s\n", names[level], msg);
}

/* ---- payloads ------------------------------------------------------------ */

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Block i's key: 32 uniformly mixed bytes, as real block hashes
 * (SHA-256) are; the store's index relies on that. */
static void block_key(uint64_t i, uint8_t key[STORE_KEY_BYTES])
{
	uint64_t words[4];
	int j;

	for (j = 0; j < 4; j++)
		words[j] = mix64(i * 4 + (uint64_t)j);
	memcpy(key, words, STORE_KEY_BYTES);
}

/* Block i's bytes into dst (block_bytes, page aligned). */
static void make_block(const struct bench *b, uint64_t i, uint8_t *dst)
{
	const uint8_t *p = b->patterns + (i % PATTERNS) * b->o.block_bytes;
	uint64_t off;

	memcpy(dst, p, b->o.block_bytes);
	for (off = 0; off < b->o.block_bytes; off += STORE_PAGE_BYTES) {
		uint64_t stamp[2] = { STAMP_MAGIC ^ i, off / STORE_PAGE_BYTES };

		memcpy(dst + off, stamp, sizeof(stamp));
	}
}

/* Every byte of block i as read back: stamps and pattern, page by page. */
static bool block_ok(const struct bench *b, uint64_t i, const uint8_t *data, uint64_t length)
{
	const uint8_t *p = b->patterns + (i % PATTERNS) * b->o.block_bytes;
	uint64_t off;

	if (length != b->o.block_bytes)
		return false;
	for (off = 0; off < length; off += STORE_PAGE_BYTES) {
		uint64_t stamp[2] = { STAMP_MAGIC ^ i, off / STORE_PAGE_BYTES };
		uint64_t n = length - off < STORE_PAGE_BYTES ? length - off : STORE_PAGE_BYTES;

		if (memcmp(data + off, stamp, sizeof(stamp)) ||
		    memcmp(data + off + sizeof(stamp), p + off + sizeof(stamp), n - sizeof(stamp)))
			return false;
	}
	return true;
}

/* Random patterns and every block's checksum, before anything is timed. */
static int prepare_payloads(struct bench *b)
{
	uint64_t seed = 0x1234567887654321ull, i, n = PATTERNS * b->o.block_bytes / 8;
	uint64_t *w;
	uint8_t *tmp;

	if (posix_memalign((void **)&b->patterns, STORE_PAGE_BYTES, PATTERNS * b->o.block_bytes) ||
	    posix_memalign((void **)&tmp, STORE_PAGE_BYTES, b->o.block_bytes))
		return -ENOMEM;
	b->checksums = calloc(b->o.blocks, sizeof(*b->checksums));
	if (!b->checksums)
		return -ENOMEM;
	w = (uint64_t *)b->patterns;
	for (i = 0; i < n; i++)
		w[i] = xorshift(&seed);
	for (i = 0; i < b->o.blocks; i++) {
		make_block(b, i, tmp);
		b->checksums[i] = XXH3_64bits(tmp, b->o.block_bytes);
	}
	free(tmp);
	return 0;
}

/* ---- demotion sampler ---------------------------------------------------- */

static void *sampler_main(void *arg)
{
	struct bench *b = arg;
	struct store_stats st;

	while (!atomic_load(&b->sampler_stop)) {
		uint64_t t = now_ns();

		store_stats(b->s, &st);
		pthread_mutex_lock(&b->lock);
		if (st.demoted_bytes == 0)
			b->t_zero_ns = t;
		if (st.demoted_bytes != b->last_demoted) {
			b->last_demoted = st.demoted_bytes;
			b->t_change_ns = t;
		}
		pthread_mutex_unlock(&b->lock);
		sleep_ns(SAMPLE_NS);
	}
	return NULL;
}

/* ---- put phase ----------------------------------------------------------- */

/* Put block i, retrying while the store answers -EAGAIN (DRAM full of
 * dirty blocks: the demoter must catch up). */
static int put_block(struct bench *b, uint64_t i, uint64_t *retries)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	const uint8_t *par = NULL;
	struct store_block *blk;
	uint64_t stalled_since = 0;
	void *dst;
	int rc;

	block_key(i, key);
	if (i % CHAIN_BLOCKS) {
		block_key(i - 1, parent);
		par = parent;
	}
	for (;;) {
		rc = store_put_begin(b->s, b->ns, key, par, 0, b->o.block_bytes, b->checksums[i],
				     &blk, &dst);
		if (rc != -EAGAIN)
			break;
		(*retries)++;
		if (!stalled_since)
			stalled_since = now_ns();
		else if (now_ns() - stalled_since > STALL_LIMIT_NS)
			return -ETIMEDOUT;
		sleep_ns(100000);
	}
	if (rc == -EEXIST)
		fprintf(stderr, "nvme_bench: block %" PRIu64 " is already stored: %s is not empty\n",
			i, b->o.dir);
	if (rc)
		return rc;
	make_block(b, i, dst);
	return store_put_commit(b->s, blk);
}

static int put_all(struct bench *b, double *put_gbps)
{
	uint64_t i, retries = 0, t0 = now_ns();
	int rc;

	for (i = 0; i < b->o.blocks; i++) {
		rc = put_block(b, i, &retries);
		if (rc) {
			fprintf(stderr, "nvme_bench: put of block %" PRIu64 " failed: %s\n", i,
				strerror(-rc));
			return rc;
		}
	}
	*put_gbps = (double)(b->o.blocks * b->o.block_bytes) / (double)(now_ns() - t0);
	printf("put:      %" PRIu64 " blocks in %.2f s (%.2f GB/s), %" PRIu64 " busy retries\n",
	       b->o.blocks, (double)(now_ns() - t0) / 1e9, *put_gbps, retries);
	return 0;
}

/* Wait until demoted_bytes has not moved for a second. */
static void wait_demotions(struct bench *b)
{
	uint64_t seen = UINT64_MAX, since = now_ns();

	for (;;) {
		uint64_t d;

		pthread_mutex_lock(&b->lock);
		d = b->last_demoted;
		pthread_mutex_unlock(&b->lock);
		if (d != seen) {
			seen = d;
			since = now_ns();
		} else if (now_ns() - since > 1000000000ull) {
			return;
		}
		sleep_ns(10 * 1000000ull);
	}
}

/* ---- get phase ----------------------------------------------------------- */

struct slot {
	struct bench *b;
	struct store_ref ref;
	uint64_t block;
	int status;
	bool busy, done;
	struct slot *next_done;
};

struct getter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct slot *done;     /* completed asynchronous gets */
	struct slot *slots;
	uint64_t *retry;       /* blocks to get again (-EAGAIN) */
	uint64_t nretry, retries;
	uint64_t promoted_blocks, dram_hits, missing, bad;
};

static struct getter *g_getter; /* the done callback's way back */

static void get_done(void *arg, int status)
{
	struct slot *sl = arg;

	pthread_mutex_lock(&g_getter->lock);
	sl->status = status;
	sl->done = true;
	sl->next_done = g_getter->done;
	g_getter->done = sl;
	pthread_cond_signal(&g_getter->cond);
	pthread_mutex_unlock(&g_getter->lock);
}

/* A get finished with status: check the bytes and release, or queue a
 * retry, or count a miss. */
static void finish_get(struct getter *g, struct slot *sl, int status)
{
	struct bench *b = sl->b;

	sl->busy = false;
	if (status == -EAGAIN) {
		g->retry[g->nretry++] = sl->block;
		g->retries++;
		return;
	}
	if (status) {
		g->missing++;
		fprintf(stderr, "nvme_bench: block %" PRIu64 " missing: %s\n", sl->block,
			strerror(-status));
		return;
	}
	if (sl->ref.tier == 2)
		g->promoted_blocks++;
	else
		g->dram_hits++;
	if (sl->ref.checksum != b->checksums[sl->block] ||
	    !block_ok(b, sl->block, sl->ref.data, sl->ref.length)) {
		g->bad++;
		fprintf(stderr, "nvme_bench: block %" PRIu64 " came back with wrong bytes\n",
			sl->block);
	}
	store_release(b->s, sl->ref.block);
}

/* Start a get of block i in a free slot; finishes it at once when the
 * block is in DRAM. */
static void start_get(struct getter *g, struct bench *b, uint64_t i, struct slot *sl)
{
	uint8_t key[STORE_KEY_BYTES];
	int rc;

	block_key(i, key);
	sl->b = b;
	sl->block = i;
	sl->busy = true;
	sl->done = false;
	rc = store_get_async(b->s, b->ns, key, NULL, &sl->ref, get_done, sl);
	if (rc != -EINPROGRESS)
		finish_get(g, sl, rc);
}

static struct slot *free_slot(struct getter *g, uint32_t window)
{
	uint32_t k;

	for (k = 0; k < window; k++)
		if (!g->slots[k].busy)
			return &g->slots[k];
	return NULL;
}

/* Reap completed gets, waiting for one when `wait` and none is ready. */
static void reap(struct getter *g, bool wait)
{
	struct slot *list;

	pthread_mutex_lock(&g->lock);
	while (wait && !g->done)
		pthread_cond_wait(&g->cond, &g->lock);
	list = g->done;
	g->done = NULL;
	pthread_mutex_unlock(&g->lock);
	while (list) {
		struct slot *next = list->next_done;

		finish_get(g, list, list->status);
		list = next;
	}
}

static uint32_t busy_slots(const struct getter *g, uint32_t window)
{
	uint32_t k, n = 0;

	for (k = 0; k < window; k++)
		n += g->slots[k].busy;
	return n;
}

/* Get every block once, in random order, with o.window gets in flight. */
static int get_all(struct bench *b, struct getter *g, double *secs)
{
	uint64_t *order = malloc(b->o.blocks * sizeof(*order)), next = 0, i, seed = 42;
	uint64_t t0, last_progress;
	struct slot *sl;

	g->slots = calloc(b->o.window, sizeof(*g->slots));
	g->retry = malloc(b->o.blocks * sizeof(*g->retry));
	if (!order || !g->slots || !g->retry) {
		free(order);
		return -ENOMEM;
	}
	for (i = 0; i < b->o.blocks; i++)
		order[i] = i;
	for (i = b->o.blocks - 1; i > 0; i--) {
		uint64_t j = xorshift(&seed) % (i + 1), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	t0 = last_progress = now_ns();
	while (next < b->o.blocks || g->nretry || busy_slots(g, b->o.window)) {
		while ((sl = free_slot(g, b->o.window)) != NULL) {
			if (g->nretry)
				start_get(g, b, g->retry[--g->nretry], sl);
			else if (next < b->o.blocks)
				start_get(g, b, order[next++], sl);
			else
				break;
			last_progress = now_ns();
		}
		if (busy_slots(g, b->o.window))
			reap(g, true);
		else if (g->nretry)
			sleep_ns(100000); /* every get was refused for room: let DRAM drain */
		if (now_ns() - last_progress > STALL_LIMIT_NS) {
			fprintf(stderr, "nvme_bench: gets made no progress for 60 s\n");
			free(order);
			return -ETIMEDOUT;
		}
	}
	*secs = (double)(now_ns() - t0) / 1e9;
	free(order);
	return 0;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s --dir DIR [--blocks N] [--block-mib N] [--dram-mib N]\n"
		"          [--nvme-capacity-mib N] [--segment-mib N] [--io-threads N]\n"
		"          [--block-kib N] [--window N] [--no-get] [--verbose]\n"
		"Puts N blocks (default 6144 x 1 MiB) into a store with a small DRAM arena\n"
		"(default 256 MiB) so they are demoted to DIR, then gets them all back\n"
		"(promotions) and checks every byte, then reopens the store and reports\n"
		"the rebuild. DIR must exist and should be empty.\n",
		argv0);
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "blocks", required_argument, NULL, 'n' },
		{ "block-mib", required_argument, NULL, 'b' },
		{ "block-kib", required_argument, NULL, 'k' },
		{ "dram-mib", required_argument, NULL, 'm' },
		{ "nvme-capacity-mib", required_argument, NULL, 'c' },
		{ "segment-mib", required_argument, NULL, 's' },
		{ "io-threads", required_argument, NULL, 't' },
		{ "window", required_argument, NULL, 'w' },
		{ "no-get", no_argument, NULL, 'g' },
		{ "verbose", no_argument, NULL, 'v' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct opts){ .blocks = 6144, .block_bytes = MIB, .dram_bytes = 256 * MIB,
			    .io_threads = 0, .window = 8 };
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		unsigned long long v = 0;

		if (optarg)
			v = strtoull(optarg, NULL, 10);
		switch (c) {
		case 'd': o->dir = optarg; break;
		case 'n': o->blocks = v; break;
		case 'b': o->block_bytes = v * MIB; break;
		case 'k': o->block_bytes = v * 1024; break;
		case 'm': o->dram_bytes = v * MIB; break;
		case 'c': o->nvme_capacity_bytes = v * MIB; break;
		case 's': o->segment_bytes = v * MIB; break;
		case 't': o->io_threads = (uint32_t)v; break;
		case 'w': o->window = (uint32_t)v; break;
		case 'g': o->no_get = true; break;
		case 'v': o->verbose = true; break;
		default: return -EINVAL;
		}
	}
	if (!o->dir || !o->blocks || !o->block_bytes || o->block_bytes % STORE_PAGE_BYTES ||
	    !o->dram_bytes || !o->window)
		return -EINVAL;
	if (!o->nvme_capacity_bytes) {
		uint64_t seg = o->segment_bytes ? o->segment_bytes : 256 * MIB;

		o->nvme_capacity_bytes = o->blocks * o->block_bytes + 4 * seg;
	}
	return 0;
}

static int open_store(struct bench *b)
{
	struct store_config cfg = {
		.dram_capacity_bytes = b->o.dram_bytes,
		.max_block_bytes = b->o.block_bytes,
		.max_lease_ms = 1000,
		.nvme_dir = b->o.dir,
		.nvme_capacity_bytes = b->o.nvme_capacity_bytes,
		.nvme_segment_bytes = b->o.segment_bytes,
		.nvme_io_threads = b->o.io_threads,
		.nvme_admission = STORE_ADMIT_ALL,
		.log = log_line,
		.log_arg = &b->o,
	};
	char why[512] = "";
	int rc = store_open(&cfg, &b->s, why, sizeof(why));

	if (rc) {
		fprintf(stderr, "nvme_bench: store_open: %s (%s)\n", why, strerror(-rc));
		return rc;
	}
	store_prefault(b->s, 0, b->o.dram_bytes);
	return store_namespace_id(b->s, "nvme-bench", 10, &b->ns);
}

/* Demotion rate from the sampler's record of demoted_bytes. */
static double demotion_gbps(struct bench *b, uint64_t *demoted)
{
	double gbps = 0;

	pthread_mutex_lock(&b->lock);
	*demoted = b->last_demoted;
	if (b->t_change_ns > b->t_zero_ns)
		gbps = (double)b->last_demoted / (double)(b->t_change_ns - b->t_zero_ns);
	pthread_mutex_unlock(&b->lock);
	return gbps;
}

struct results {
	double put_gbps, demote_gbps, promote_gbps;
	uint64_t demotions, promotions;
	uint8_t direct_io;
	uint64_t rebuild_ms, rebuild_blocks, orphans;
	double rebuild_blocks_per_s;
};

/* Open the store, put every block, and time the demotions they cause. */
static int phase_put(struct bench *b, struct results *r)
{
	struct store_stats st;
	uint64_t demoted = 0;
	int rc = open_store(b);

	if (rc)
		return rc;
	store_stats(b->s, &st);
	printf("store:    dram %" PRIu64 " MiB, nvme %" PRIu64 " MiB in %" PRIu64
	       " MiB segments, o_direct %s, %" PRIu64 " x %" PRIu64 " KiB blocks\n",
	       st.capacity_bytes / MIB, st.nvme_capacity_bytes / MIB, st.nvme_segment_bytes / MIB,
	       st.nvme_direct_io ? "yes" : "no", b->o.blocks, b->o.block_bytes / 1024);
	if (!st.nvme_enabled) {
		fprintf(stderr, "nvme_bench: the store opened without its NVMe tier\n");
		return -EIO;
	}
	r->direct_io = st.nvme_direct_io;
	if (pthread_create(&b->sampler, NULL, sampler_main, b))
		return -EAGAIN;
	rc = put_all(b, &r->put_gbps);
	if (!rc)
		wait_demotions(b);
	atomic_store(&b->sampler_stop, true);
	pthread_join(b->sampler, NULL);
	if (rc)
		return rc;
	r->demote_gbps = demotion_gbps(b, &demoted);
	store_stats(b->s, &st);
	r->demotions = st.demotions;
	printf("demote:   %" PRIu64 " blocks, %.2f GiB in %.2f s: %.2f GB/s"
	       " (nvme bytes written %.2f GiB, write errors %" PRIu64 ")\n",
	       st.demotions, (double)demoted / (double)(1ull << 30),
	       r->demote_gbps > 0 ? (double)demoted / r->demote_gbps / 1e9 : 0.0, r->demote_gbps,
	       (double)st.nvme_bytes_written / (double)(1ull << 30), st.nvme_write_errors);
	return 0;
}

/* Get every block back (promotions) and check every byte. */
static int phase_get(struct bench *b, struct getter *g, struct results *r)
{
	struct store_stats st;
	double secs = 1;
	int rc = get_all(b, g, &secs);

	if (rc)
		return rc;
	store_stats(b->s, &st);
	r->promote_gbps = (double)st.promoted_bytes / (secs * 1e9);
	r->promotions = st.promotions;
	printf("promote:  %" PRIu64 " blocks, %.2f GiB in %.2f s: %.2f GB/s"
	       " (%" PRIu64 " dram hits, %" PRIu64 " busy retries, window %u)\n",
	       st.promotions, (double)st.promoted_bytes / (double)(1ull << 30), secs,
	       r->promote_gbps, g->dram_hits, g->retries, b->o.window);
	printf("verify:   %" PRIu64 " blocks checked byte for byte, %" PRIu64 " wrong, %" PRIu64
	       " missing, corrupt %" PRIu64 ", read errors %" PRIu64 "\n",
	       g->promoted_blocks + g->dram_hits, g->bad, g->missing, st.corrupt_blocks,
	       st.nvme_read_errors);
	b->errors += g->bad + g->missing;
	return 0;
}

/* store_get of block i, retrying while there is no DRAM room to promote
 * into; checks the bytes. */
static int get_and_check(struct bench *b, uint64_t i)
{
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;
	uint64_t t0 = now_ns();
	int rc;

	block_key(i, key);
	while ((rc = store_get(b->s, b->ns, key, NULL, &ref)) == -EAGAIN) {
		if (now_ns() - t0 > STALL_LIMIT_NS)
			return -ETIMEDOUT;
		sleep_ns(100000);
	}
	if (rc)
		return rc;
	if (ref.checksum != b->checksums[i] || !block_ok(b, i, ref.data, ref.length))
		rc = -EBADMSG;
	store_release(b->s, ref.block);
	return rc;
}

/* Close the store and open it again: time the rebuild, look every block
 * up, and fetch a sample of the survivors byte-checked. */
static int phase_reopen(struct bench *b, struct getter *g, struct results *r)
{
	uint8_t key[STORE_KEY_BYTES];
	struct store_stats st;
	uint64_t i, present = 0, checked = 0, seed = 7, t0;
	int rc;

	store_drain(b->s);
	reap(g, false);
	store_close(b->s);
	b->s = NULL;
	t0 = now_ns();
	rc = open_store(b);
	if (rc)
		return rc;
	store_stats(b->s, &st);
	r->rebuild_ms = st.rebuild_ms;
	r->rebuild_blocks = st.rebuild_blocks;
	r->orphans = st.orphans_dropped;
	r->rebuild_blocks_per_s = st.rebuild_blocks * 1000.0 / (double)(st.rebuild_ms ? st.rebuild_ms : 1);
	for (i = 0; i < b->o.blocks; i++) {
		block_key(i, key);
		present += store_exists(b->s, b->ns, key, NULL) == 0;
	}
	if (present != st.blocks) {
		fprintf(stderr, "nvme_bench: %" PRIu64 " blocks found after reopen, stats say %"
			PRIu64 "\n", present, st.blocks);
		b->errors++;
	}
	for (i = 0; i < REOPEN_SAMPLE * 4 && checked < REOPEN_SAMPLE && present; i++) {
		uint64_t k = xorshift(&seed) % b->o.blocks;

		block_key(k, key);
		if (store_exists(b->s, b->ns, key, NULL))
			continue;
		rc = get_and_check(b, k);
		if (rc) {
			fprintf(stderr, "nvme_bench: block %" PRIu64 " after reopen: %s\n", k,
				strerror(-rc));
			b->errors++;
		}
		checked++;
	}
	printf("reopen:   %.2f s; rebuild %" PRIu64 " blocks in %" PRIu64 " ms (%.0f blocks/s),"
	       " %" PRIu64 " orphans dropped, %" PRIu64 " of %" PRIu64 " blocks present,"
	       " %" PRIu64 " fetched and checked\n",
	       (double)(now_ns() - t0) / 1e9, st.rebuild_blocks, st.rebuild_ms,
	       r->rebuild_blocks_per_s, st.orphans_dropped, present, b->o.blocks, checked);
	return 0;
}

static int run(struct bench *b, struct getter *g)
{
	struct results r;
	char why[256] = "";
	int rc;

	memset(&r, 0, sizeof(r));
	rc = phase_put(b, &r);
	if (!rc && !b->o.no_get)
		rc = phase_get(b, g, &r);
	if (rc)
		return rc;
	if (store_check(b->s, why, sizeof(why))) {
		fprintf(stderr, "nvme_bench: store_check: %s\n", why);
		b->errors++;
	}
	rc = phase_reopen(b, g, &r);
	if (rc)
		return rc;
	printf("RESULT demote_gbps=%.3f promote_gbps=%.3f put_gbps=%.3f direct_io=%d"
	       " blocks=%" PRIu64 " demoted=%" PRIu64 " promoted=%" PRIu64 " rebuild_ms=%" PRIu64
	       " rebuild_blocks=%" PRIu64 " rebuild_blocks_per_s=%.0f orphans=%" PRIu64
	       " errors=%" PRIu64 "\n",
	       r.demote_gbps, r.promote_gbps, r.put_gbps, r.direct_io, b->o.blocks, r.demotions,
	       r.promotions, r.rebuild_ms, r.rebuild_blocks, r.rebuild_blocks_per_s, r.orphans,
	       b->errors);
	return b->errors ? -EIO : 0;
}

int main(int argc, char **argv)
{
	struct bench b;
	struct getter g;
	int rc;

	memset(&b, 0, sizeof(b));
	memset(&g, 0, sizeof(g));
	if (parse_opts(argc, argv, &b.o)) {
		usage(argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	pthread_mutex_init(&b.lock, NULL);
	pthread_mutex_init(&g.lock, NULL);
	pthread_cond_init(&g.cond, NULL);
	g_getter = &g;
	rc = prepare_payloads(&b);
	if (!rc)
		rc = run(&b, &g);
	if (b.s) {
		store_drain(b.s);
		reap(&g, false);
		store_close(b.s);
	}
	free(g.slots);
	free(g.retry);
	free(b.patterns);
	free(b.checksums);
	if (rc)
		fprintf(stderr, "nvme_bench: failed: %s\n", strerror(-rc));
	return rc ? 1 : 0;
}
