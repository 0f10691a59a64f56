/*
 * test_restart_nvme.c - kill -9 with the NVMe tier on (issue 7, item 3).
 *
 * kvpoold runs on a temporary directory with a DRAM of 4 MiB, so blocks
 * are demoted as they arrive. First a "settled" namespace of chains is
 * put and the test waits until STATS says every one of its blocks has an
 * NVMe copy (namespaces.settled.nvme_blocks == blocks): those blocks were
 * acknowledged and demoted, and so were all their ancestors. Then a
 * client loop on one handle puts chains in a "live" namespace and gets
 * earlier blocks back, while kvpoold is killed with SIGKILL and started
 * again on the same directory and port. Afterwards:
 *  - every settled block is readable byte-exact;
 *  - in every live chain what is left is a prefix: EXISTS never finds a
 *    block whose parent is absent, MATCH reports exactly that prefix and
 *    a GET under its lease returns every matched block byte-exact (MATCH
 *    never reports a block GET cannot return); the rest were DRAM-only
 *    or are counted in tiers.nvme.orphans_dropped;
 *  - no GET, before or after the kill, ever returned other bytes (no
 *    torn block); every acknowledged block on NVMe before the kill is
 *    back or counted as an orphan (rebuild_blocks + orphans_dropped);
 *  - it prints the recovery time: kill to the loop's first successful
 *    call, and kvpoold's start to its first answer (the rebuild included).
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
#include <sys/uio.h>

#include "harness.h"

#define KIB 1024u
#define CHAIN_LEN 8
#define BLOCK_BYTES (16 * KIB)
#define SETTLED_CHAINS 40       /* 5 MiB: more than the DRAM */
#define MAX_LIVE_CHAINS 4000
#define MAX_CALLS 40000
#define CALL_TIMEOUT_MS 1000
#define BUSY_RETRY_MS 5000

static struct {
	struct harness_server srv;
	char dir[256];
	const char *flags[HARNESS_MAX_ARGS];
} g;

static void set_flags(void)
{
	const char *f[] = {
		"--dram-capacity", "4MiB", "--max-block-bytes", "64KiB", "--threads", "2",
		"--log-level", "warn", "--nvme-dir", g.dir, "--nvme-capacity", "128MiB",
		"--nvme-segment-size", "2MiB", "--nvme-io-threads", "2", NULL,
	};
	size_t i;

	for (i = 0; f[i]; i++)
		g.flags[i] = f[i];
	g.flags[i] = NULL;
}

static int teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	if (g.dir[0])
		harness_rm_rf(g.dir);
	g.dir[0] = '\0';
	return 0;
}

/* ---- chains ---- */

struct chain {
	uint8_t keys[CHAIN_LEN][32];
	uint8_t data[CHAIN_LEN][BLOCK_BYTES];
	struct iovec iov[CHAIN_LEN];
};

static void chain_build(struct chain *c, const char *tag, uint32_t n)
{
	for (uint32_t i = 0; i < CHAIN_LEN; i++) {
		harness_key(c->keys[i], tag, (uint64_t)n * 100 + i);
		harness_fill(c->data[i], BLOCK_BYTES, harness_key_seed(c->keys[i]));
		c->iov[i] = (struct iovec){ .iov_base = c->data[i], .iov_len = BLOCK_BYTES };
	}
}

/* Put chain c, retrying while the server is busy (DRAM waiting for the
 * demoter). st[] receives the last per-block statuses. */
static int chain_put(struct kvpool_client *cl, const struct chain *c, int st[CHAIN_LEN])
{
	struct kvpool_put_block b[CHAIN_LEN];
	uint64_t deadline = harness_now_ms() + BUSY_RETRY_MS;
	int rc;

	for (uint32_t i = 0; i < CHAIN_LEN; i++)
		b[i] = (struct kvpool_put_block){ .key = c->keys[i],
						  .parent = i ? c->keys[i - 1] : NULL,
						  .iov = &c->iov[i], .iovcnt = 1 };
	for (;;) {
		int busy = 0;

		rc = kvpool_put(cl, b, CHAIN_LEN, st);
		for (uint32_t i = 0; i < CHAIN_LEN; i++)
			busy |= st[i] == -EAGAIN || st[i] == -ENOLINK;
		if (rc == 0 || !busy || harness_now_ms() > deadline)
			return rc;
		harness_sleep_ms(2);
	}
}

/* ---- the client loop ---- */

struct call {
	uint64_t start_ms, end_ms;
	int rc;
};

static struct {
	struct kvpool_client *c;
	volatile int stop;
	uint32_t chains;          /* live chains started */
	struct call *calls;
	size_t ncalls;
	int false_success;        /* a GET that returned other bytes */
	int bad_rc;               /* a GET that failed with a data error */
} lp;

/* Keep a call's outcome. A refused connection returns at once, so the
 * loop pauses 1 ms after one: a long outage (kvpoold under valgrind
 * restarts in seconds) must not fill calls[] before the restart. When it
 * is full anyway, the last slot keeps the newest call. */
static void record(uint64_t t0, int rc)
{
	size_t i = lp.ncalls < MAX_CALLS ? lp.ncalls++ : MAX_CALLS - 1;

	lp.calls[i] = (struct call){ t0, harness_now_ms(), rc };
	if (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EPIPE)
		harness_sleep_ms(1);
}

/* Put chain after chain; after each, GET the first block of an earlier
 * chain (likely on NVMe by then): exact bytes, a miss, or a call error. */
static void *loop_main(void *arg)
{
	static struct chain c;
	static uint8_t got[BLOCK_BYTES];

	(void)arg;
	while (!lp.stop) {
		uint32_t n = lp.chains, back;
		int st[CHAIN_LEN], rc;
		uint64_t t0 = harness_now_ms(), len = 0;
		uint8_t key[32], want[BLOCK_BYTES];

		/* After MAX_LIVE_CHAINS (a slow run, under valgrind, waits long
		 * for the settled blocks) the loop puts recent chains again, so
		 * it still makes calls that can succeed across the kill and the
		 * restart (a put of a stored chain succeeds too). */
		if (n >= MAX_LIVE_CHAINS)
			n = MAX_LIVE_CHAINS - 1 - (uint32_t)(lp.ncalls % 20);
		chain_build(&c, "live", n);
		rc = chain_put(lp.c, &c, st);
		record(t0, rc);
		if (n + 1 > lp.chains)
			__atomic_store_n(&lp.chains, n + 1, __ATOMIC_SEQ_CST);

		back = n > 20 ? n - 20 : 0;
		harness_key(key, "live", (uint64_t)back * 100);
		harness_fill(want, sizeof(want), harness_key_seed(key));
		t0 = harness_now_ms();
		rc = kvpool_get_bytes(lp.c, key, got, sizeof(got), &len);
		record(t0, rc);
		if (rc == 0 && (len != sizeof(got) || memcmp(got, want, sizeof(got))))
			lp.false_success++;
		if (rc == -EBADMSG || rc == -EMSGSIZE)
			lp.bad_rc++;
	}
	return NULL;
}

/* The first successful call that started at or after `from`, or 0. */
static uint64_t first_success(uint64_t from)
{
	size_t n = __atomic_load_n(&lp.ncalls, __ATOMIC_SEQ_CST);

	for (size_t i = 0; i < n; i++)
		if (lp.calls[i].start_ms >= from && lp.calls[i].rc == 0)
			return lp.calls[i].end_ms;
	return 0;
}

/* ---- checks after the restart ---- */

/* Every block of the chain byte-exact (GET of the whole chain). */
static void get_exact(struct kvpool_client *cl, const struct chain *c, uint32_t count)
{
	static uint8_t got[CHAIN_LEN][BLOCK_BYTES];
	struct kvpool_get_block gb[CHAIN_LEN];
	struct iovec iov[CHAIN_LEN];
	int st[CHAIN_LEN];
	uint64_t deadline = harness_now_ms() + BUSY_RETRY_MS;
	int rc;

	for (uint32_t i = 0; i < count; i++) {
		iov[i] = (struct iovec){ .iov_base = got[i], .iov_len = BLOCK_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = c->keys[i], .iov = &iov[i],
						   .iovcnt = 1 };
	}
	while ((rc = kvpool_get(cl, gb, count, st)) == -EAGAIN && harness_now_ms() < deadline)
		harness_sleep_ms(5);
	if (rc)
		fail_msg("get of %u matched blocks: %s", count, kvpool_strerror(rc));
	for (uint32_t i = 0; i < count; i++) {
		assert_int_equal(gb[i].length, BLOCK_BYTES);
		assert_memory_equal(got[i], c->data[i], BLOCK_BYTES);
	}
}

/* What is left of a live chain is a prefix, MATCH says exactly that, and
 * GET returns all of it. Returns the prefix length. */
static uint32_t check_live_chain(struct kvpool_client *cl, uint32_t n)
{
	static struct chain c;
	int st[CHAIN_LEN];
	uint32_t prefix = 0;
	size_t matched = 0;

	chain_build(&c, "live", n);
	assert_int_equal(kvpool_exists(cl, c.keys, CHAIN_LEN, st), 0);
	while (prefix < CHAIN_LEN && st[prefix] == 0)
		prefix++;
	for (uint32_t i = prefix; i < CHAIN_LEN; i++)
		if (st[i] == 0)
			fail_msg("live chain %u: block %u present, its ancestor %u absent", n, i,
				 prefix);
	assert_int_equal(kvpool_match(cl, c.keys, CHAIN_LEN, 10000, &matched), 0);
	assert_int_equal(matched, prefix);
	if (prefix)
		get_exact(cl, &c, prefix);
	return prefix;
}

static void test_kill9_with_nvme(void **state)
{
	/* under valgrind one call to a restarted kvpoold can take seconds */
	struct kvpool_options opts = { .timeout_ms = harness_valgrind() ? 10 * CALL_TIMEOUT_MS
									 : CALL_TIMEOUT_MS };
	static struct chain c;
	struct kvpool_client *sc = NULL;
	struct kvpool_counters k0, k1;
	uint64_t killed, started, ready, back, nvme_before, live_nvme_before, settled_blocks;
	uint64_t rebuild_ms, rebuild_blocks, orphans, live_blocks = 0;
	uint16_t port;
	pthread_t thr;
	int err, st[CHAIN_LEN];

	(void)state;
	assert_int_equal(harness_tmpdir("restart-nvme", g.dir, sizeof(g.dir)), 0);
	set_flags();
	err = harness_start(&g.srv, g.flags);
	if (err == -ENOENT)
		harness_skip("KVPOOLD is not set to a built kvpoold");
	assert_int_equal(err, 0);
	port = g.srv.port;

	/* settled: acknowledged, then demoted as a whole (ancestors too) */
	assert_int_equal(kvpool_connect(g.srv.url, "settled", &opts, &sc), 0);
	for (uint32_t n = 0; n < SETTLED_CHAINS; n++) {
		chain_build(&c, "settled", n);
		err = chain_put(sc, &c, st);
		if (err)
			fail_msg("settled chain %u: %s", n, kvpool_strerror(err));
	}
	settled_blocks = (uint64_t)SETTLED_CHAINS * CHAIN_LEN;
	assert_int_equal(harness_ns_stat_or_fail(sc, "settled", "blocks"), settled_blocks);

	/* the live loop pushes the settled blocks out of DRAM onto NVMe */
	lp.calls = calloc(MAX_CALLS, sizeof(*lp.calls));
	assert_non_null(lp.calls);
	assert_int_equal(kvpool_connect(g.srv.url, "live", &opts, &lp.c), 0);
	assert_int_equal(kvpool_get_counters(lp.c, &k0), 0);
	assert_int_equal(pthread_create(&thr, NULL, loop_main, NULL), 0);
	for (uint64_t t0 = harness_now_ms();;) {
		if (harness_ns_stat_or_fail(sc, "settled", "nvme_blocks") == settled_blocks &&
		    harness_ns_stat_or_fail(sc, "live", "nvme_blocks") >= 100)
			break;
		if (harness_now_ms() - t0 > 60000)
			fail_msg("the settled blocks did not all reach nvme within 60 s");
		harness_sleep_ms(20);
	}
	assert_int_equal(harness_ns_stat_or_fail(sc, "settled", "blocks"), settled_blocks);
	assert_int_equal(harness_stat_or_fail(sc, "tiers.nvme.evictions"), 0);
	nvme_before = harness_stat_or_fail(sc, "tiers.nvme.blocks");
	live_nvme_before = harness_ns_stat_or_fail(sc, "live", "nvme_blocks");
	harness_sleep_ms(200); /* demotions and puts in flight at the kill */

	killed = harness_now_ms();
	harness_kill(&g.srv); /* SIGKILL */
	harness_sleep_ms(300);
	started = harness_now_ms();
	assert_int_equal(harness_start_on_port(&g.srv, port, g.flags), 0);
	ready = harness_now_ms();
	/* under valgrind a restarted kvpoold takes seconds per demotion round */
	while (!(back = first_success(started)) &&
	       harness_now_ms() - ready < (harness_valgrind() ? 60000u : 10000u))
		harness_sleep_ms(5);
	assert_true(back != 0);
	harness_sleep_ms(300); /* the loop goes on against the new server */
	lp.stop = 1;
	assert_int_equal(pthread_join(thr, NULL), 0);

	rebuild_ms = harness_stat_or_fail(sc, "tiers.nvme.rebuild_ms");
	rebuild_blocks = harness_stat_or_fail(sc, "tiers.nvme.rebuild_blocks");
	orphans = harness_stat_or_fail(sc, "tiers.nvme.orphans_dropped");
	print_message("kill -9 with nvme: %" PRIu64 " blocks on nvme at the last look before the "
		      "kill; rebuild %" PRIu64 " blocks in %" PRIu64 " ms, %" PRIu64
		      " orphans dropped; kvpoold answered %" PRIu64 " ms after its start; "
		      "recovery (kill to the loop's first success) %" PRIu64 " ms, %" PRIu64
		      " ms after the start\n", nvme_before, rebuild_blocks, rebuild_ms, orphans,
		      ready - started, back - killed, back - started);

	/* what was on NVMe came back or is a counted orphan */
	assert_true(rebuild_blocks + orphans >= nvme_before);
	/* every settled block, byte-exact */
	assert_int_equal(harness_ns_stat_or_fail(sc, "settled", "blocks"), settled_blocks);
	for (uint32_t n = 0; n < SETTLED_CHAINS; n++) {
		chain_build(&c, "settled", n);
		get_exact(sc, &c, CHAIN_LEN);
	}
	/* live chains: prefixes only, MATCH == what GET returns */
	for (uint32_t n = 0; n < lp.chains; n++)
		live_blocks += check_live_chain(lp.c, n);
	print_message("live chains: %u put, %" PRIu64 " blocks readable after the restart (%" PRIu64
		      " of them had an nvme copy at the last look)\n", lp.chains, live_blocks,
		      live_nvme_before);
	assert_int_equal(lp.false_success, 0);
	assert_int_equal(lp.bad_rc, 0);
	assert_int_equal(harness_stat_or_fail(sc, "tiers.nvme.corrupt_blocks"), 0);
	assert_int_equal(kvpool_get_counters(lp.c, &k1), 0);
	assert_true(k1.reconnects > k0.reconnects);
	kvpool_close(lp.c);
	kvpool_close(sc);
	free(lp.calls);
	assert_int_equal(harness_stop(&g.srv), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_kill9_with_nvme, teardown),
	};

	return cmocka_run_group_tests_name("integ_restart_nvme", tests, NULL, NULL);
}
