/*
 * test_copycount.c - kvpoold's hot path copies no payload in user space
 * and allocates nothing per request, checked from outside the code:
 * kvpoold runs under the LD_PRELOAD counter of tests/bench/copycount.c
 * while whole blocks are put and got. The bytes it passed to
 * memcpy/memmove in calls of 4 KiB or more must stay below 1% of the
 * payload bytes it moved; and once warm, a run of 400 PUT and GET
 * batches must make it call malloc, calloc, realloc or an aligned variant
 * fewer than 4 times in all (it makes none; the counter's snapshot signal
 * reads the counts between the phases).
 *
 * The counter is checked first on known copies and allocations (this
 * binary, run again as a probe under the same library), so a counter that
 * counts nothing cannot make the main tests pass.
 *
 * Environment: KVPOOL_COPYCOUNT is the counter library (tests/run.sh sets
 * it). Under AddressSanitizer the compiler replaces kvpoold's memcpy calls
 * with its own, and under valgrind (KVPOOL_VALGRIND=1) valgrind replaces
 * them too: the kvpoold copy test is skipped there. Valgrind replaces
 * malloc as well: the allocation test is skipped under it (under ASan the
 * counter forwards to ASan's allocator and the test runs). The probe
 * always runs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PROBE_ARG "--copycount-probe"
#define PROBE_BIG_BYTES (1u << 20)
#define PROBE_MOVE_BYTES (64u << 10)
#define PROBE_SMALL_BYTES 100u

#define PROBE_ALLOCS 100
#define PROBE_ALLOC_BYTES 1000u

/* What the counter wrote (at exit, or in a snapshot). */
struct counts {
	uint64_t big_calls, big_bytes, all_calls, all_bytes, min_bytes;
	uint64_t alloc_calls, alloc_bytes, free_calls, snapshots;
	char callers[4096];  /* its "caller ..." lines */
	char alloc_callers[4096]; /* its "alloc_caller ..." lines */
};

static char out_path[64];
static const char *self_path;

/* The counter library, or skip (a failure under CI=true). */
static const char *copycount_lib(void)
{
	const char *lib = getenv("KVPOOL_COPYCOUNT");

	if (!lib || access(lib, R_OK))
		harness_skip("KVPOOL_COPYCOUNT does not name the copy counter library "
			     "(make bench, or tests/run.sh sets it)");
	return lib;
}

/* Read the counter's report. */
static void counts_read(struct counts *c)
{
	FILE *f = fopen(out_path, "r");
	char line[512], key[32];
	unsigned long long v;
	size_t used = 0, aused = 0;

	memset(c, 0, sizeof(*c));
	if (!f)
		fail_msg("the copy counter wrote no report to %s", out_path);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "caller ", 7)) {
			size_t n = strlen(line);

			if (used + n < sizeof(c->callers)) {
				memcpy(c->callers + used, line, n + 1);
				used += n;
			}
			continue;
		}
		if (!strncmp(line, "alloc_caller ", 13)) {
			size_t n = strlen(line);

			if (aused + n < sizeof(c->alloc_callers)) {
				memcpy(c->alloc_callers + aused, line, n + 1);
				aused += n;
			}
			continue;
		}
		if (sscanf(line, "%31s %llu", key, &v) != 2)
			continue;
		if (!strcmp(key, "big_calls"))
			c->big_calls = v;
		else if (!strcmp(key, "big_bytes"))
			c->big_bytes = v;
		else if (!strcmp(key, "all_calls"))
			c->all_calls = v;
		else if (!strcmp(key, "all_bytes"))
			c->all_bytes = v;
		else if (!strcmp(key, "min_bytes"))
			c->min_bytes = v;
		else if (!strcmp(key, "alloc_calls"))
			c->alloc_calls = v;
		else if (!strcmp(key, "alloc_bytes"))
			c->alloc_bytes = v;
		else if (!strcmp(key, "free_calls"))
			c->free_calls = v;
		else if (!strcmp(key, "snapshots"))
			c->snapshots = v;
	}
	fclose(f);
}

/* Put the counter in the environment of processes started from now on. */
static void preload_on(const char *lib)
{
	unlink(out_path);
	setenv("LD_PRELOAD", lib, 1);
	setenv("COPYCOUNT_OUT", out_path, 1);
	/* An ASan binary refuses a preload that comes before its runtime. */
	setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
}

static void preload_off(void)
{
	unsetenv("LD_PRELOAD");
	unsetenv("COPYCOUNT_OUT");
	unsetenv("COPYCOUNT_SIGNAL");
	unsetenv("ASAN_OPTIONS");
}

/* The signal that asks the counter for a snapshot: a real-time one,
 * which kvpoold neither handles nor ignores. */
static int snap_signal(void)
{
	return SIGRTMIN + 2;
}

/* ---- the probe: this binary run again, making known copies ---------------- */

/* Through a volatile pointer, so the compiler cannot inline the copy. */
static void *(*volatile copy_fn)(void *, const void *, size_t) = memcpy;
static void *(*volatile move_fn)(void *, const void *, size_t) = memmove;
static void *(*volatile malloc_fn)(size_t) = malloc;

/* PROBE_ALLOCS allocations of PROBE_ALLOC_BYTES (through a volatile
 * pointer: the compiler may drop a malloc/free pair it can see). */
static int probe_allocs(void)
{
	void *p[PROBE_ALLOCS];

	for (int i = 0; i < PROBE_ALLOCS; i++)
		if (!(p[i] = malloc_fn(PROBE_ALLOC_BYTES)))
			return 1;
	for (int i = 0; i < PROBE_ALLOCS; i++)
		free(p[i]);
	return 0;
}

static int probe_main(void)
{
	static char a[PROBE_BIG_BYTES], b[PROBE_BIG_BYTES];

	memset(a, 7, sizeof(a));
	copy_fn(b, a, PROBE_BIG_BYTES);
	move_fn(b + 1, b, PROBE_MOVE_BYTES);
	copy_fn(a, b, PROBE_SMALL_BYTES);
	if (probe_allocs())
		return 1;
	/* The snapshot signal writes the report now; exit rewrites it. */
	if (raise(snap_signal()))
		return 1;
	if (probe_allocs())
		return 1;
	return b[PROBE_BIG_BYTES - 1] == 7 && b[1] == 7 ? 0 : 1;
}

/* The counter counts a known memcpy and memmove as big, a small copy as
 * a call only, known allocations and their callers after a snapshot, and
 * writes its report at exit. */
static void test_counter_counts_known_copies(void **state)
{
	char *argv[] = { (char *)self_path, PROBE_ARG, NULL };
	const char *lib = copycount_lib();
	struct counts c;
	char *out = NULL, sig[16];
	int status = -1, rc;

	(void)state;
	preload_on(lib);
	snprintf(sig, sizeof(sig), "%d", snap_signal());
	setenv("COPYCOUNT_SIGNAL", sig, 1);
	rc = harness_run(argv, 30000, &out, &status);
	preload_off();
	free(out);
	assert_int_equal(rc, 0);
	assert_int_equal(status, 0);
	counts_read(&c);
	assert_int_equal(c.min_bytes, 4096);
	assert_true(c.big_calls >= 2);
	assert_true(c.big_bytes >= PROBE_BIG_BYTES + PROBE_MOVE_BYTES);
	/* ...and nothing near that again: the probe makes no other big copy
	 * worth 1 MiB. */
	assert_true(c.big_bytes < 2 * PROBE_BIG_BYTES);
	assert_true(c.all_calls > c.big_calls);
	assert_true(c.all_bytes >= c.big_bytes + PROBE_SMALL_BYTES);
	assert_non_null(strstr(c.callers, "caller "));
	/* Both rounds of allocations, and only the second one's caller:
	 * recording starts at the snapshot. */
	assert_int_equal(c.snapshots, 1);
	assert_true(c.alloc_calls >= 2 * PROBE_ALLOCS);
	assert_true(c.alloc_bytes >= 2 * PROBE_ALLOCS * PROBE_ALLOC_BYTES);
	assert_true(c.free_calls >= 2 * PROBE_ALLOCS);
	assert_non_null(strstr(c.alloc_callers, " calls 100 bytes 100000\n"));
}

/* ---- kvpoold under the counter ------------------------------------------------ */

/* Sizes and counts of the blocks moved: whole blocks, several sizes. */
static const struct {
	size_t bytes;
	int count;
	int batch;
} work[] = {
	{ 64u << 10, 64, 16 },
	{ 1u << 20, 40, 8 },
	{ 4u << 20, 10, 2 },
	{ 16u << 20, 3, 1 },
};

/* Put then get every block of one size in batches, checking each byte.
 * Returns the payload bytes moved (put + got). */
static uint64_t move_blocks(struct kvpool_client *c, size_t bytes, int count, int batch, int tag)
{
	uint8_t (*keys)[32] = calloc((size_t)batch, 32);
	uint8_t *data = malloc(bytes * (size_t)batch), *back = malloc(bytes * (size_t)batch);
	struct kvpool_put_block *pb = calloc((size_t)batch, sizeof(*pb));
	struct kvpool_get_block *gb = calloc((size_t)batch, sizeof(*gb));
	struct iovec *iov = calloc(2 * (size_t)batch, sizeof(*iov));
	uint64_t moved = 0;

	assert_true(keys && data && back && pb && gb && iov);
	for (int done = 0; done < count; done += batch) {
		int n = count - done < batch ? count - done : batch;

		for (int i = 0; i < n; i++) {
			harness_key(keys[i], "copycount", (uint64_t)tag << 32 | (uint64_t)(done + i));
			harness_fill(data + i * bytes, bytes, harness_key_seed(keys[i]));
			iov[i] = (struct iovec){ data + i * bytes, bytes };
			iov[batch + i] = (struct iovec){ back + i * bytes, bytes };
			pb[i] = (struct kvpool_put_block){ .key = keys[i], .iov = &iov[i], .iovcnt = 1 };
			gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &iov[batch + i],
							   .iovcnt = 1 };
		}
		assert_int_equal(kvpool_put(c, pb, (size_t)n, NULL), 0);
		assert_int_equal(kvpool_get(c, gb, (size_t)n, NULL), 0);
		assert_memory_equal(back, data, (size_t)n * bytes);
		moved += 2 * (uint64_t)n * bytes;
	}
	free(keys);
	free(data);
	free(back);
	free(pb);
	free(gb);
	free(iov);
	return moved;
}

/* Under PUT/GET of whole blocks, kvpoold's big user-space copies stay
 * below 1% of the payload bytes it moved. */
static void test_kvpoold_copies_no_payload(void **state)
{
	static const char *const flags[] = { "--dram-capacity", "256MiB", "--threads", "2",
					     "--log-level", "warn", NULL };
	struct harness_server srv = { 0 };
	const char *lib = copycount_lib();
	struct kvpool_client *c;
	uint64_t moved = 0;
	struct counts n;
	char *json = NULL;

	(void)state;
#if defined(__SANITIZE_ADDRESS__)
	skip(); /* the compiler replaced kvpoold's memcpy calls: nothing to count */
#endif
	if (harness_valgrind())
		skip(); /* valgrind replaces memcpy itself */
	preload_on(lib);
	assert_int_equal(harness_start(&srv, flags), 0);
	preload_off();
	assert_int_equal(harness_client(&srv, "copycount", &c), 0);
	for (size_t i = 0; i < sizeof(work) / sizeof(work[0]); i++)
		moved += move_blocks(c, work[i].bytes, work[i].count, work[i].batch, (int)i);
	assert_int_equal(kvpool_stats(c, NULL, &json), 0);
	kvpool_free(json);
	kvpool_close(c);
	assert_int_equal(harness_stop(&srv), 0);
	counts_read(&n);
	print_message("kvpoold moved %" PRIu64 " payload bytes; copied %" PRIu64 " bytes in %"
		      PRIu64 " calls >= %" PRIu64 " B (%" PRIu64 " calls, %" PRIu64
		      " bytes in all)\n%s", moved, n.big_bytes, n.big_calls, n.min_bytes,
		      n.all_calls, n.all_bytes, n.callers);
	/* The preload was active: kvpoold copies headers and keys. */
	assert_true(n.all_calls > 0);
	assert_true(moved >= 256ull << 20);
	assert_true(n.big_bytes * 100 < moved);
}

/* ---- kvpoold allocates nothing per request ------------------------------------ */

/* A steady state of whole-block batches: each round puts STEADY_BATCH new
 * blocks and gets them back. The arena holds 256 of them, so the warm-up
 * already evicts: the measured rounds see the pool as it will stay. */
#define STEADY_BLOCK_BYTES (256u << 10)
#define STEADY_BATCH 8
#define STEADY_WARM_ROUNDS 80
#define STEADY_ROUNDS 200

/* Ask kvpoold (pid) for a snapshot of its counts and read it. */
static void snapshot(pid_t pid, struct counts *c)
{
	unlink(out_path);
	assert_int_equal(kill(pid, snap_signal()), 0);
	for (int i = 0; i < 1000 && access(out_path, R_OK); i++)
		usleep(10000);
	counts_read(c);
}

/* After a warm-up, STEADY_ROUNDS rounds of one PUT and one GET batch of
 * whole blocks make kvpoold allocate (nearly) nothing: fewer than one
 * allocation per 100 requests, i.e. at most 3 in the 400 (0 measured; the
 * slack is for an array of the store that grows once to a new high-water
 * mark). An allocation per request, or per block, shows up 200 to 1600
 * times. */
static void test_kvpoold_allocates_nothing_per_request(void **state)
{
	static const char *const flags[] = { "--dram-capacity", "64MiB", "--threads", "1",
					     "--log-level", "warn", NULL };
	struct harness_server srv = { 0 };
	const char *lib = copycount_lib();
	struct counts before, after;
	struct kvpool_client *c;
	uint64_t allocs, requests = 2 * STEADY_ROUNDS;
	char sig[16];

	(void)state;
	if (harness_valgrind())
		skip(); /* valgrind replaces malloc itself */
	preload_on(lib);
	snprintf(sig, sizeof(sig), "%d", snap_signal());
	setenv("COPYCOUNT_SIGNAL", sig, 1);
	assert_int_equal(harness_start(&srv, flags), 0);
	preload_off();
	assert_int_equal(harness_client(&srv, "allocs", &c), 0);
	move_blocks(c, STEADY_BLOCK_BYTES, STEADY_WARM_ROUNDS * STEADY_BATCH, STEADY_BATCH, 100);
	snapshot(srv.pid, &before);
	move_blocks(c, STEADY_BLOCK_BYTES, STEADY_ROUNDS * STEADY_BATCH, STEADY_BATCH, 101);
	snapshot(srv.pid, &after);
	kvpool_close(c);
	assert_int_equal(harness_stop(&srv), 0);
	allocs = after.alloc_calls - before.alloc_calls;
	print_message("kvpoold: %" PRIu64 " allocations (%" PRIu64 " bytes) in %" PRIu64
		      " PUT/GET requests of %u blocks of %u bytes after warm-up\n%s", allocs,
		      after.alloc_bytes - before.alloc_bytes, requests, STEADY_BATCH,
		      STEADY_BLOCK_BYTES, after.alloc_callers);
	/* The snapshots were taken, and the counter saw start-up allocate. */
	assert_int_equal(before.snapshots, 1);
	assert_int_equal(after.snapshots, 2);
	assert_true(before.alloc_calls > 0);
	assert_true(allocs * 100 < requests);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_counter_counts_known_copies),
		cmocka_unit_test(test_kvpoold_copies_no_payload),
		cmocka_unit_test(test_kvpoold_allocates_nothing_per_request),
	};

	static char self[4096];
	ssize_t n;
	int rc;

	if (argc == 2 && !strcmp(argv[1], PROBE_ARG))
		return probe_main();
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	self_path = n > 0 ? (self[n] = '\0', self) : argv[0];
	snprintf(out_path, sizeof(out_path), "/tmp/kvpool-copycount-%d", (int)getpid());
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(out_path);
	return rc;
}
