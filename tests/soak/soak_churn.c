/*
 * soak_churn.c - a bounded churn soak of kvpoold: a small DRAM tier under
 * continuous MATCH / GET / PUT / DELETE of prompt chains with block sizes
 * from 4 KiB to 4 MiB, so that eviction never stops. It checks, and prints:
 *   - every GET of a block MATCH reported under a lease succeeds with the
 *     block's own bytes (unless a DELETE, which leases do not hold off,
 *     ran in between);
 *   - the server's RSS, sampled twice a second, stays below the issue's
 *     bound "DRAM capacity plus index overhead times live blocks", made
 *     concrete as: the idle server's RSS outside the arena (code,
 *     libraries, stacks) + the DRAM capacity + STATS index_bytes (index and
 *     block headers: overhead x live blocks) + a fixed allowance; and it
 *     plateaus: the last third of the samples peaks no higher than the
 *     middle third plus a margin;
 *   - no eviction pass stalls puts for more than --max-evict-pass-ms: the
 *     server times each pass that makes DRAM room under the store lock
 *     (STATS tiers.dram.evict_pass_max_us), and that is what is checked;
 *   - it also prints what a client sees: the put latency of a 4 KiB probe
 *     every 10 ms (each needing an eviction), worst, p99 and count over
 *     10 ms. That round trip includes the network, the payload and CPU
 *     scheduling on a busy machine, so it is reported, not checked;
 *   - at the end, leases, in-flight reservations and pinned bytes return
 *     exactly to 0 (STATS), and nothing is left connected.
 *
 * Usage: soak_churn [--seconds N] [--max-evict-pass-ms N]
 * Defaults: 600 s (a 10-minute soak) and 50 ms; KVPOOL_SOAK_SECONDS and
 * KVPOOL_SOAK_MAX_EVICT_PASS_MS override them (make test runs 30 s).
 * Needs KVPOOLD like the integration tests, whose harness it uses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../integration/harness.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define CAPACITY_BYTES (64ull * MIB)
#define LEASE_MS 1000
#define WORKERS 3
#define PROMPTS 96
#define MAX_CHAIN 12
#define TOKENS_PER_BLOCK 16
#define PROBE_PERIOD_MS 10
#define MAX_SAMPLES 4096
/* The fixed allowance of the RSS bound, over the idle server's own RSS,
 * the arena and the index. Under load kvpoold touches memory it had not
 * touched while idle and that no STATS figure counts:
 *   - glibc gives each thread that allocates (the 2 workers, the main
 *     thread with the listener) its own malloc arena; the index's block
 *     headers and lease records are spread over them, and each keeps
 *     freed chunks and top padding (128 KiB trim threshold) resident;
 *   - libevent's per-connection input and output evbuffers (5 clients:
 *     request bodies of up to 12 PUT entries, GET reply headers; payload
 *     goes straight to and from the arena) and the reply batches;
 *   - thread stacks growing past what the idle server touched.
 * Together a few MiB (measured here: RSS rose 0.9 MiB over idle in a 30-s
 * run); 16 MiB leaves room for other allocator behaviour on other
 * machines. With ASan add its allocator caches, the heap's shadow and the
 * 4 MiB quarantine we set (measured: 17 MiB over idle; allowed 48). */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_ALLOWANCE_KB (48u * 1024u)
#else
#define RSS_ALLOWANCE_KB (16u * 1024u)
#endif
/* "Plateau": the last third of the samples may peak this much higher than
 * the middle third (allocator noise; a leak of even 1 KiB per round would
 * show as tens of MiB over a 10-minute run). */
#define PLATEAU_MARGIN_KB (4u * 1024u)

static const char *const flags[] = {
	"--dram-capacity", "64MiB", "--max-block-bytes", "4MiB", "--max-lease-ms", "2000",
	"--threads", "2", "--log-level", "warn", NULL,
};

static struct {
	unsigned seconds;
	unsigned max_evict_pass_ms;
	struct harness_server srv;
	struct kvpool_client *c;  /* STATS */
	uint8_t keys[PROMPTS][MAX_CHAIN][32];
	size_t chain_len[PROMPTS];
	volatile int stop;
	/* Deletes started and done: a leased block may still be deleted
	 * (leases only hold off eviction), so a miss is a violation only if
	 * no delete ran between the MATCH and the GET. */
	uint64_t deletes_started, deletes_done;
} g;

/* ---- the workload ------------------------------------------------------------- */

/* Block sizes, 4 KiB to 4 MiB, the small ones more often. */
static const uint32_t sizes[16] = {
	4 * KIB, 4 * KIB, 4 * KIB, 16 * KIB, 16 * KIB, 16 * KIB, 64 * KIB, 64 * KIB,
	64 * KIB, 256 * KIB, 256 * KIB, 512 * KIB, 1 * MIB, 1 * MIB, 2 * MIB, 4 * MIB,
};

/* A block's size and bytes follow from its key, so whoever puts it, it is
 * the same block, and a GET can check what it got. */
static uint32_t block_bytes(const uint8_t key[32])
{
	return sizes[key[0] % 16];
}

/* 256 bytes drawn from the key, repeated: distinct per key and cheap, so
 * that filling and checking megabytes takes little of the CPU kvpoold
 * needs (the put-stall probe would measure the test otherwise). */
static void block_fill(uint8_t *buf, const uint8_t key[32])
{
	size_t len = block_bytes(key), have = 256;

	harness_fill(buf, have, harness_key_seed(key));
	for (; have < len; have *= 2)
		memcpy(buf + have, buf, have * 2 <= len ? have : len - have);
}

/* The prompts: chains of 4..MAX_CHAIN blocks that share prefixes the way
 * prompts do. Block 0 comes from one of 8 system prompts, blocks 1-2 from
 * one of 24 conversation starts, the rest is the prompt's own. */
static void make_prompts(void)
{
	static uint32_t tokens[MAX_CHAIN * TOKENS_PER_BLOCK];

	for (size_t p = 0; p < PROMPTS; p++) {
		size_t n = 0, len = 4 + p % (MAX_CHAIN - 3);

		for (size_t b = 0; b < len; b++) {
			uint64_t group = b == 0 ? p % 8 : b < 3 ? p % 24 : 1000 + p;

			for (size_t t = 0; t < TOKENS_PER_BLOCK; t++)
				tokens[b * TOKENS_PER_BLOCK + t] =
					(uint32_t)((group * 131 + b * 17 + t) * 2654435761u % 151643u);
		}
		assert_int_equal(kvpool_block_hashes(tokens, len * TOKENS_PER_BLOCK,
						     TOKENS_PER_BLOCK, NULL, NULL, 0, g.keys[p],
						     MAX_CHAIN, &n),
				 0);
		assert_int_equal(n, len);
		g.chain_len[p] = len;
	}
}

struct worker {
	pthread_t thr;
	int id;
	uint64_t rounds, matched, got, put_blocks, refused, deletes, deleted_misses;
	uint64_t violations;
	char first_violation[200];
	uint8_t *buf;   /* MAX_CHAIN * 4 MiB */
	uint8_t *want;  /* 4 MiB */
};

static void violation(struct worker *w, const char *fmt, ...)
{
	va_list ap;

	if (w->violations++)
		return;
	va_start(ap, fmt);
	vsnprintf(w->first_violation, sizeof(w->first_violation), fmt, ap);
	va_end(ap);
}

/* GET the m blocks MATCH leased: each must come back with its bytes.
 * done0 is deletes_done read before the MATCH. */
static void get_matched(struct worker *w, struct kvpool_client *c, size_t p, size_t m,
			uint64_t done0)
{
	struct kvpool_get_block gb[MAX_CHAIN];
	struct iovec iov[MAX_CHAIN];
	int st[MAX_CHAIN];

	for (size_t i = 0; i < m; i++) {
		iov[i] = (struct iovec){ w->buf + i * 4 * MIB, block_bytes(g.keys[p][i]) };
		gb[i] = (struct kvpool_get_block){ .key = g.keys[p][i], .iov = &iov[i], .iovcnt = 1 };
	}
	kvpool_get(c, gb, m, st);
	for (size_t i = 0; i < m; i++) {
		if (st[i] == -ENOENT &&
		    __atomic_load_n(&g.deletes_started, __ATOMIC_SEQ_CST) > done0) {
			w->deleted_misses++;
			continue;
		}
		if (st[i]) {
			violation(w, "prompt %zu block %zu of %zu leased: %s", p, i, m,
				  kvpool_strerror(st[i]));
			continue;
		}
		block_fill(w->want, g.keys[p][i]);
		if (gb[i].length != iov[i].iov_len || memcmp(w->want, iov[i].iov_base, iov[i].iov_len))
			violation(w, "prompt %zu block %zu: other bytes", p, i);
		w->got++;
	}
}

/* PUT blocks from..len-1 of prompt p, chained. */
static void put_rest(struct worker *w, struct kvpool_client *c, size_t p, size_t from)
{
	struct kvpool_put_block pb[MAX_CHAIN];
	struct iovec iov[MAX_CHAIN];
	int st[MAX_CHAIN];
	size_t n = 0;

	for (size_t i = from; i < g.chain_len[p]; i++, n++) {
		uint8_t *b = w->buf + n * 4 * MIB;

		block_fill(b, g.keys[p][i]);
		iov[n] = (struct iovec){ b, block_bytes(g.keys[p][i]) };
		pb[n] = (struct kvpool_put_block){ .key = g.keys[p][i],
						   .parent = i ? g.keys[p][i - 1] : NULL,
						   .iov = &iov[n], .iovcnt = 1 };
	}
	if (!n)
		return;
	kvpool_put(c, pb, n, st);
	for (size_t k = 0; k < n; k++) {
		if (st[k] == 0)
			w->put_blocks++;
		else if (st[k] == -ENOSPC || st[k] == -EAGAIN || st[k] == -ENOLINK)
			w->refused++;
		else
			violation(w, "prompt %zu put block %zu: %s", p, from + k,
				  kvpool_strerror(st[k]));
	}
}

static void *worker_main(void *arg)
{
	struct kvpool_options opts = { .timeout_ms = 30000 };
	struct worker *w = arg;
	struct kvpool_client *c = NULL;
	unsigned seed = 7919u * (unsigned)(w->id + 1);
	int rc;

	rc = kvpool_connect(g.srv.url, "soak", &opts, &c);
	if (rc) {
		violation(w, "connect: %s", kvpool_strerror(rc));
		return NULL;
	}
	while (!g.stop) {
		size_t p = (size_t)rand_r(&seed) % PROMPTS, m = 0;
		uint64_t done0 = __atomic_load_n(&g.deletes_done, __ATOMIC_SEQ_CST);

		rc = kvpool_match(c, g.keys[p], g.chain_len[p], LEASE_MS, &m);
		if (rc) {
			violation(w, "match: %s", kvpool_strerror(rc));
			break;
		}
		w->rounds++;
		w->matched += m;
		get_matched(w, c, p, m, done0);
		put_rest(w, c, p, m);
		/* Now and then a prompt goes away: delete its tail. */
		if (rand_r(&seed) % 50 == 0) {
			int st = 0;

			__atomic_add_fetch(&g.deletes_started, 1, __ATOMIC_SEQ_CST);
			kvpool_delete(c, g.keys[p][g.chain_len[p] - 1], 1, &st);
			__atomic_add_fetch(&g.deletes_done, 1, __ATOMIC_SEQ_CST);
			w->deletes += st == 0;
		}
	}
	kvpool_close(c);
	return NULL;
}

/* ---- the put-stall probe --------------------------------------------------------------- */

struct probe {
	pthread_t thr;
	uint64_t n, worst_us, over_10ms, failed;
	uint64_t *lat_us;
	size_t cap;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Every PROBE_PERIOD_MS, put one new 4 KiB block: with the pool full,
 * each one waits for an eviction. Its latency is the put stall. */
static void *probe_main(void *arg)
{
	struct kvpool_options opts = { .timeout_ms = 30000 };
	struct probe *pr = arg;
	struct kvpool_client *c = NULL;
	uint8_t key[32], data[4096];

	if (kvpool_connect(g.srv.url, "soak-probe", &opts, &c))
		return NULL;
	for (uint64_t i = 0; !g.stop; i++) {
		struct timespec t0, t1;
		uint64_t us;

		harness_key(key, "soak-probe", i);
		harness_fill(data, sizeof(data), i);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (kvpool_put_bytes(c, key, NULL, data, sizeof(data)))
			pr->failed++;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		us = (uint64_t)(((int64_t)t1.tv_sec - t0.tv_sec) * 1000000 +
				((int64_t)t1.tv_nsec - t0.tv_nsec) / 1000);
		pr->worst_us = us > pr->worst_us ? us : pr->worst_us;
		pr->over_10ms += us > 10000;
		if (pr->n < pr->cap)
			pr->lat_us[pr->n] = us;
		pr->n++;
		harness_sleep_ms(PROBE_PERIOD_MS);
	}
	kvpool_close(c);
	return NULL;
}

/* ---- RSS ------------------------------------------------------------------------------- */

static uint64_t rss_kb(pid_t pid)
{
	char path[64], line[256];
	uint64_t kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "VmRSS:", 6) == 0)
			kb = strtoull(line + 6, NULL, 10);
	fclose(f);
	return kb;
}

/* RSS once the arena has been faulted in (kvpoold does it from a thread at
 * start, see store_prefault): three samples 100 ms apart within 256 kB,
 * or whatever it is after 10 s. */
static uint64_t rss_settled_kb(pid_t pid)
{
	uint64_t deadline = harness_now_ms() + 10000, prev = rss_kb(pid), cur;
	int stable = 0;

	while (stable < 3 && harness_now_ms() < deadline) {
		harness_sleep_ms(100);
		cur = rss_kb(pid);
		stable = (cur > prev ? cur - prev : prev - cur) < 256 ? stable + 1 : 0;
		prev = cur;
	}
	return prev;
}

/* Resident kB of kvpoold's arena: the one anonymous mapping of exactly the
 * DRAM capacity in /proc/PID/smaps (the arena is mapped on its own, with
 * MADV_HUGEPAGE, so the kernel does not merge it with its neighbours).
 * Returns -1 if no single mapping has that size. */
static int64_t arena_rss_kb(pid_t pid, uint64_t capacity_kb)
{
	char path[64], line[256];
	int64_t found = -1;
	int matches = 0, in_arena = 0;
	unsigned long lo, hi;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in_arena = (hi - lo) / 1024 == capacity_kb;
			matches += in_arena;
		} else if (in_arena && strncmp(line, "Rss:", 4) == 0) {
			found = (int64_t)strtoull(line + 4, NULL, 10);
		}
	}
	fclose(f);
	return matches == 1 ? found : -1;
}

static uint64_t max_of(const uint64_t *v, size_t from, size_t to)
{
	uint64_t m = 0;

	for (size_t i = from; i < to; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

/* ---- the test ------------------------------------------------------------------------------ */

/* A kvpoold built with AddressSanitizer (as this binary is, in the same
 * build) keeps freed memory in a quarantine of 256 MiB, which would show
 * as RSS growing all through the run: keep it small, so that RSS measures
 * kvpoold rather than ASan. Only the child reads the variable: ASan
 * parsed ours at start. */
static void small_asan_quarantine(void)
{
#if defined(__SANITIZE_ADDRESS__)
	const char *old = getenv("ASAN_OPTIONS");
	char opts[1024];

	snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4", old ? old : "",
		 old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", opts, 1);
#endif
}

static int setup(void **state)
{
	(void)state;
	small_asan_quarantine();
	return harness_group_start(&g.srv, flags) ? -1 : harness_group_client(&g.srv, "soak", &g.c);
}

static int teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	return 0;
}

/* Wait until STATS `path` is 0; fail naming it otherwise. */
static void expect_zero(const char *path, int timeout_ms)
{
	uint64_t v = harness_wait_stat_or_fail(g.c, path, 0, timeout_ms);

	if (v)
		fail_msg("%s is %" PRIu64 " after the soak, want 0", path, v);
}

/* The RSS bound's terms, in kB, fixed at the idle server. */
struct rss_terms {
	uint64_t idle, arena_resident, base, capacity;
	const char *how; /* how arena_resident was found */
};

/* Idle RSS minus what of it is the arena, so that the capacity term does
 * not count the prefaulted arena twice. */
static void rss_terms_at_idle(struct rss_terms *t)
{
	int64_t arena;

	t->capacity = CAPACITY_BYTES / 1024;
	t->idle = rss_settled_kb(g.srv.pid);
	arena = arena_rss_kb(g.srv.pid, t->capacity);
	if (arena >= 0) {
		t->arena_resident = (uint64_t)arena;
		t->how = "smaps";
	} else {
		/* no single mapping of that size: assume prefaulted when the
		 * idle RSS can hold it (the conservative reading: smaller base) */
		t->arena_resident = t->idle >= t->capacity ? t->capacity : 0;
		t->how = "assumed";
	}
	t->base = t->idle - t->arena_resident;
}

/* Sorted probe latencies' p99, in us (0 without any). */
static uint64_t probe_p99_us(struct probe *pr)
{
	size_t k = pr->n < pr->cap ? pr->n : pr->cap;

	if (!k)
		return 0;
	qsort(pr->lat_us, k, sizeof(*pr->lat_us), cmp_u64);
	return pr->lat_us[k * 99 / 100];
}

static void test_churn_soak(void **state)
{
	static uint64_t rss[MAX_SAMPLES], index_bytes[MAX_SAMPLES], bound[MAX_SAMPLES];
	static struct worker ws[WORKERS];
	struct probe pr = { .cap = 1u << 20 };
	struct rss_terms terms;
	uint64_t t0, peak, index_max = 0, mid_max, last_max, p99_us, pass_max_us, passes;
	uint64_t rounds = 0, got = 0, put = 0, refused = 0, deletes = 0, deleted_misses = 0;
	uint64_t evictions;
	int64_t least_headroom = INT64_MAX;
	size_t n = 0, over = 0, first_over = 0, worst_i = 0;

	(void)state;
	harness_need_server(&g.srv);
	make_prompts();
	rss_terms_at_idle(&terms);
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.evict_passes"), 0);
	pr.lat_us = calloc(pr.cap, sizeof(*pr.lat_us));
	assert_non_null(pr.lat_us);
	for (int i = 0; i < WORKERS; i++) {
		ws[i] = (struct worker){ .id = i, .buf = malloc((size_t)MAX_CHAIN * 4 * MIB),
					 .want = malloc(4 * MIB) };
		assert_non_null(ws[i].buf);
		assert_non_null(ws[i].want);
		assert_int_equal(pthread_create(&ws[i].thr, NULL, worker_main, &ws[i]), 0);
	}
	assert_int_equal(pthread_create(&pr.thr, NULL, probe_main, &pr), 0);

	/* Each sample: RSS against the bound with that moment's index. */
	t0 = harness_now_ms();
	while (harness_now_ms() - t0 < (uint64_t)g.seconds * 1000 && n < MAX_SAMPLES) {
		harness_sleep_ms(500);
		index_bytes[n] = harness_stat_or_fail(g.c, "index_bytes") / 1024;
		rss[n] = rss_kb(g.srv.pid);
		bound[n] = terms.base + terms.capacity + index_bytes[n] + RSS_ALLOWANCE_KB;
		if (rss[n] > bound[n] && !over++)
			first_over = n;
		if ((int64_t)(bound[n] - rss[n]) < least_headroom) {
			least_headroom = (int64_t)(bound[n] - rss[n]);
			worst_i = n;
		}
		index_max = index_bytes[n] > index_max ? index_bytes[n] : index_max;
		n++;
	}
	g.stop = 1;
	for (int i = 0; i < WORKERS; i++) {
		assert_int_equal(pthread_join(ws[i].thr, NULL), 0);
		rounds += ws[i].rounds;
		got += ws[i].got;
		put += ws[i].put_blocks;
		refused += ws[i].refused;
		deletes += ws[i].deletes;
		deleted_misses += ws[i].deleted_misses;
	}
	assert_int_equal(pthread_join(pr.thr, NULL), 0);
	evictions = harness_stat_or_fail(g.c, "evictions");
	passes = harness_stat_or_fail(g.c, "tiers.dram.evict_passes");
	pass_max_us = harness_stat_or_fail(g.c, "tiers.dram.evict_pass_max_us");

	/* The figures. */
	peak = max_of(rss, 0, n);
	mid_max = max_of(rss, n / 3, 2 * n / 3);
	last_max = max_of(rss, 2 * n / 3, n);
	p99_us = probe_p99_us(&pr);
	print_message("soak: %u s, %u workers: %" PRIu64 " rounds, %" PRIu64 " blocks got, %" PRIu64
		      " put, %" PRIu64 " refused (full/busy/no parent), %" PRIu64 " deletes (%"
		      PRIu64 " leased blocks deleted before their GET), %" PRIu64 " evictions\n",
		      g.seconds, WORKERS, rounds, got, put, refused, deletes, deleted_misses,
		      evictions);
	print_message("soak: rss bound = base %" PRIu64 " kB (idle VmRSS %" PRIu64 " - arena resident "
		      "%" PRIu64 " [%s]) + dram capacity %" PRIu64 " kB + index_bytes (per sample, "
		      "max %" PRIu64 " kB) + allowance %u kB\n",
		      terms.base, terms.idle, terms.arena_resident, terms.how, terms.capacity,
		      index_max, RSS_ALLOWANCE_KB);
	print_message("soak: kvpoold VmRSS kB: at 25%% %" PRIu64 ", 50%% %" PRIu64 ", 75%% %" PRIu64
		      ", end %" PRIu64 ", peak %" PRIu64 "; closest to the bound at sample %zu/%zu: "
		      "%" PRIu64 " of %" PRIu64 " (index %" PRIu64 "); %zu samples over\n",
		      rss[n / 4], rss[n / 2], rss[3 * n / 4], rss[n - 1], peak, worst_i, n,
		      rss[worst_i], bound[worst_i], index_bytes[worst_i], over);
	print_message("soak: plateau: max VmRSS middle third %" PRIu64 " kB, last third %" PRIu64
		      " kB (margin %u kB)\n", mid_max, last_max, PLATEAU_MARGIN_KB);
	print_message("soak: server eviction passes %" PRIu64 ", worst %.3f ms (limit %u ms)\n",
		      passes, (double)pass_max_us / 1000, g.max_evict_pass_ms);
	print_message("soak: client put round trip (4 KiB probe every %d ms, not checked): %" PRIu64
		      " puts, p99 %.2f ms, worst %.2f ms, %" PRIu64 " over 10 ms, %" PRIu64 " failed; "
		      "server-side put latency p99 %" PRIu64 " us, p999 %" PRIu64 " us\n",
		      PROBE_PERIOD_MS, pr.n, (double)p99_us / 1000, (double)pr.worst_us / 1000,
		      pr.over_10ms, pr.failed, harness_stat_or_fail(g.c, "latency_us.put.p99"),
		      harness_stat_or_fail(g.c, "latency_us.put.p999"));

	for (int i = 0; i < WORKERS; i++) {
		if (ws[i].violations)
			fail_msg("worker %d: %" PRIu64 " violations; first: %s", i, ws[i].violations,
				 ws[i].first_violation);
		free(ws[i].buf);
		free(ws[i].want);
	}
	free(pr.lat_us);
	assert_true(n >= 6);
	assert_true(evictions > 0 && passes > 0);
	assert_true(got > 0 && put > 0);
	if (over)
		fail_msg("VmRSS over the bound in %zu samples, first at sample %zu: %" PRIu64
			 " kB > %" PRIu64 " kB", over, first_over, rss[first_over], bound[first_over]);
	if (last_max > mid_max + PLATEAU_MARGIN_KB)
		fail_msg("VmRSS still growing: last third max %" PRIu64 " kB > middle third max %"
			 PRIu64 " kB + %u kB", last_max, mid_max, PLATEAU_MARGIN_KB);
	assert_int_equal(pr.failed, 0);
	if (pass_max_us > (uint64_t)g.max_evict_pass_ms * 1000)
		fail_msg("worst eviction pass %.3f ms, over the limit of %u ms",
			 (double)pass_max_us / 1000, g.max_evict_pass_ms);

	/* Everything returns exactly to 0: leases (they end within
	 * max_lease_ms), reservations, and pinned bytes (once every block is
	 * dropped, the arena is all free). */
	expect_zero("leases_active", 2000 + 2000);
	expect_zero("tiers.dram.inflight_put_bytes", 2000);
	assert_int_equal(harness_wait_stat_or_fail(g.c, "connections.current", 1, 3000), 1);
	assert_int_equal(kvpool_drop_namespace(g.c, "soak", NULL), 0);
	assert_int_equal(kvpool_drop_namespace(g.c, "soak-probe", NULL), 0);
	expect_zero("tiers.dram.blocks", 2000);
	expect_zero("tiers.dram.used_bytes", 2000);
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.free_bytes"), CAPACITY_BYTES);
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.largest_free_bytes"),
			 CAPACITY_BYTES);
}

static unsigned parse_uint(const char *s, const char *what)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || v == 0 || v > 86400) {
		fprintf(stderr, "soak_churn: bad %s '%s'\n", what, s);
		exit(2);
	}
	return (unsigned)v;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_churn_soak),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};
	const char *env = getenv("KVPOOL_SOAK_SECONDS");

	g.seconds = env && *env ? parse_uint(env, "KVPOOL_SOAK_SECONDS") : 600;
	env = getenv("KVPOOL_SOAK_MAX_EVICT_PASS_MS");
	g.max_evict_pass_ms = env && *env ? parse_uint(env, "KVPOOL_SOAK_MAX_EVICT_PASS_MS") : 50;
	/* ours, not kvpoold's: it would warn about unknown KVPOOL_ settings */
	unsetenv("KVPOOL_SOAK_SECONDS");
	unsetenv("KVPOOL_SOAK_MAX_EVICT_PASS_MS");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			g.seconds = parse_uint(argv[++i], "--seconds");
		} else if (!strcmp(argv[i], "--max-evict-pass-ms") && i + 1 < argc) {
			g.max_evict_pass_ms = parse_uint(argv[++i], "--max-evict-pass-ms");
		} else {
			fprintf(stderr, "usage: soak_churn [--seconds N] [--max-evict-pass-ms N]\n");
			return 2;
		}
	}
	return cmocka_run_group_tests_name("soak_churn", tests, setup, teardown);
}
