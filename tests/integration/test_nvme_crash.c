/*
 * test_nvme_crash.c - crash consistency of the NVMe tier (issue 16).
 *
 * test_crash_cycles: kvpoold with a 4 MiB DRAM and an NVMe tier is
 * killed with SIGKILL at a random point of a loop of PUT, DELETE and
 * DROP_NAMESPACE, and started again on the same directory, CYCLES times.
 * Each cycle first settles new chains - "settled" ones and two in a fresh
 * namespace that is dropped later - until STATS says every one of their
 * blocks has an NVMe copy (filler chains push them out of DRAM). Then a
 * client thread deletes settled and live chains, puts live ones, and
 * drops the cycle's namespace, in random order, while the main thread
 * kills kvpoold after a random 10..250 ms. Only calls that were answered
 * OK count as acknowledged. After each restart:
 *  - no acknowledged DELETE came back: MATCH of the chain finds nothing;
 *  - no acknowledged DROP_NAMESPACE came back: MATCH in it finds nothing;
 *  - no settled block that was not deleted is lost: GET returns every
 *    block of the chain byte-exact;
 *  - a live chain is a prefix whose every block GET returns byte-exact;
 *  - no GET ever returned other bytes, tiers.nvme.corrupt_blocks is 0.
 * It prints the counts.
 *
 * test_sigterm_keeps_dram: a pool whose DRAM is large enough never
 * demotes; SIGTERM writes its DRAM-only blocks to NVMe (nvme_drain_ms),
 * and the restart finds every one, byte-exact.
 *
 * test_readonly_nvme_dir: kvpoold runs under tests/bench/rofs.c, an
 * LD_PRELOAD shim that turns nvme_dir read-only on demand (EROFS from
 * every write, as after an ext4 error). RocksDB's first failed log write
 * used to abort kvpoold (an assertion in RocksDB's file writer); now the
 * tier turns unhealthy, puts go on in DRAM, NVMe copies stay readable, a
 * DELETE or DROP that cannot be recorded answers an error, SIGTERM exits
 * 0, and after the directory is writable again a restart finds what was
 * on NVMe. Environment: KVPOOL_ROFS, the shim (tests/run.sh sets it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "harness.h"

#define KIB 1024u
#define CHAIN_LEN 4
#define BLOCK_BYTES (16 * KIB)
#define CYCLES 22
#define SETTLE_PER_CYCLE 4
#define MAX_SETTLED (CYCLES * SETTLE_PER_CYCLE)
#define MAX_LIVE 4000
#define BUSY_RETRY_MS 5000
#define SETTLE_TIMEOUT_MS 30000

static struct {
	struct harness_server srv;
	char dir[256];
	const char *flags[HARNESS_MAX_ARGS];
	struct kvpool_options opts;
} g;

static int teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	if (g.dir[0])
		harness_rm_rf(g.dir);
	g.dir[0] = '\0';
	return 0;
}

/* The tier (512 MiB) is large enough that no segment is reclaimed during
 * the run: a reclaim may evict cold settled blocks, which a cache may do
 * but which is not what is checked here (check_all asserts it did not). */
static void set_flags(const char *dram)
{
	const char *f[] = {
		"--dram-capacity", dram, "--max-block-bytes", "64KiB", "--threads", "2",
		"--log-level", "warn", "--nvme-dir", g.dir, "--nvme-capacity", "512MiB",
		"--nvme-segment-size", "4MiB", "--nvme-io-threads", "2", NULL,
	};
	size_t i;

	for (i = 0; f[i]; i++)
		g.flags[i] = f[i];
	g.flags[i] = NULL;
	g.opts = (struct kvpool_options){ .timeout_ms = harness_valgrind() ? 20000 : 3000 };
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

/* Put chain c, retrying while the server is busy. */
static int chain_put(struct kvpool_client *cl, const struct chain *c)
{
	struct kvpool_put_block b[CHAIN_LEN];
	uint64_t deadline = harness_now_ms() + BUSY_RETRY_MS;
	int st[CHAIN_LEN], rc;

	for (uint32_t i = 0; i < CHAIN_LEN; i++)
		b[i] = (struct kvpool_put_block){ .key = c->keys[i],
						  .parent = i ? c->keys[i - 1] : NULL,
						  .iov = &c->iov[i], .iovcnt = 1 };
	for (;;) {
		int busy = 0;

		rc = kvpool_put(cl, b, CHAIN_LEN, st);
		for (uint32_t i = 0; i < CHAIN_LEN; i++)
			busy |= st[i] == -EAGAIN;
		if (rc || !busy || harness_now_ms() > deadline)
			return rc ? rc : (busy ? -EAGAIN : 0);
		harness_sleep_ms(2);
	}
}

/* How many leading blocks of the chain GET returns byte-exact (the rest
 * MATCH does not report). A GET of other bytes fails the test. */
static uint32_t chain_check(struct kvpool_client *cl, const char *tag, uint32_t n)
{
	static struct chain c;
	static uint8_t got[CHAIN_LEN][BLOCK_BYTES];
	struct kvpool_get_block gb[CHAIN_LEN];
	struct iovec iov[CHAIN_LEN];
	int st[CHAIN_LEN], rc;
	uint64_t deadline = harness_now_ms() + BUSY_RETRY_MS;
	size_t matched = 0;

	chain_build(&c, tag, n);
	assert_int_equal(kvpool_match(cl, c.keys, CHAIN_LEN, 10000, &matched), 0);
	if (!matched)
		return 0;
	for (uint32_t i = 0; i < matched; i++) {
		iov[i] = (struct iovec){ .iov_base = got[i], .iov_len = BLOCK_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = c.keys[i], .iov = &iov[i], .iovcnt = 1 };
	}
	while ((rc = kvpool_get(cl, gb, matched, st)) == -EAGAIN && harness_now_ms() < deadline)
		harness_sleep_ms(5);
	if (rc)
		fail_msg("%s chain %u: get of %zu matched blocks: %s", tag, n, matched,
			 kvpool_strerror(rc));
	for (uint32_t i = 0; i < matched; i++) {
		if (st[i])
			fail_msg("%s chain %u: matched block %u missing (%d)", tag, n, i, st[i]);
		assert_int_equal(gb[i].length, BLOCK_BYTES);
		if (memcmp(got[i], c.data[i], BLOCK_BYTES))
			fail_msg("%s chain %u: block %u has other bytes", tag, n, i);
	}
	return (uint32_t)matched;
}

/* ---- what the cycles acknowledged ---- */

/* A removal: none, sent but not answered when kvpoold died (it may or
 * may not have happened), acknowledged (it must hold). */
enum { DEL_NONE, DEL_MAYBE, DEL_ACKED };

static struct {
	uint32_t settled;              /* settled chains put (all reached NVMe) */
	uint8_t settled_del[MAX_SETTLED];
	uint32_t live;                 /* live chains put (or tried) */
	uint8_t live_del[MAX_LIVE];
	uint8_t dropped[CYCLES];       /* namespace drop<c> drop acknowledged */
	uint32_t cycle;
	/* counts */
	uint64_t deletes_acked, drops_acked, ops, settled_checked, live_blocks;
	uint64_t deleted_checked, dropped_checked;
} w;

static struct {
	struct kvpool_client *c, *s;  /* namespaces "live" and "settled" */
	volatile int stop;
	uint32_t seed;
} lp;

static uint32_t rnd(uint32_t *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

/* Delete chain n of tag (its first block: the chain goes with it).
 * Returns 1 when acknowledged: removed, or (a live chain whose put the
 * last kill cut short) not there. */
static int delete_chain(struct kvpool_client *c, const char *tag, uint32_t n)
{
	uint8_t key[32];
	int st = -1;

	harness_key(key, tag, (uint64_t)n * 100);
	if (kvpool_delete(c, key, 1, &st))
		return 0;
	if (st == -ENOENT && strcmp(tag, "settled") == 0)
		fail_msg("settled chain %u is not there to delete", n);
	return st == 0 || st == -ENOENT;
}

/* The random loop until the kill (or its first failed call). */
static void *loop_main(void *arg)
{
	static struct chain c;
	char ns[32];
	uint64_t blocks;

	(void)arg;
	snprintf(ns, sizeof(ns), "drop%u", w.cycle);
	while (!lp.stop) {
		uint32_t r = rnd(&lp.seed) % 10, n;

		w.ops++;
		if (r < 3 && w.settled) {
			n = rnd(&lp.seed) % w.settled;
			if (w.settled_del[n])
				continue;
			w.settled_del[n] = DEL_MAYBE; /* in flight at the kill: either */
			if (!delete_chain(lp.s, "settled", n))
				break;
			w.settled_del[n] = DEL_ACKED;
			w.deletes_acked++;
		} else if (r < 5 && w.live) {
			n = rnd(&lp.seed) % w.live;
			if (w.live_del[n])
				continue;
			w.live_del[n] = DEL_MAYBE;
			if (!delete_chain(lp.c, "live", n))
				break;
			w.live_del[n] = DEL_ACKED;
			w.deletes_acked++;
		} else if (r == 5 && !w.dropped[w.cycle]) {
			w.dropped[w.cycle] = DEL_MAYBE;
			if (kvpool_drop_namespace(lp.c, ns, &blocks))
				break;
			w.dropped[w.cycle] = DEL_ACKED;
			w.drops_acked++;
		} else if (w.live < MAX_LIVE) {
			chain_build(&c, "live", w.live++);
			if (chain_put(lp.c, &c))
				break;
		}
	}
	return NULL;
}

/* ---- the checks after a restart ---- */

static void check_all(void)
{
	struct kvpool_client *s = NULL, *l = NULL;
	char ns[32];

	assert_int_equal(kvpool_connect(g.srv.url, "settled", &g.opts, &s), 0);
	for (uint32_t n = 0; n < w.settled; n++) {
		uint32_t k = chain_check(s, "settled", n);

		if (w.settled_del[n] == DEL_ACKED) {
			if (k)
				fail_msg("settled chain %u was deleted (acknowledged) and came back", n);
			w.deleted_checked++;
		} else if (w.settled_del[n] == DEL_MAYBE) {
			/* whole or gone, whichever happened: settle it now */
			if (k && k != CHAIN_LEN)
				fail_msg("settled chain %u: %u of %u blocks", n, k, CHAIN_LEN);
			w.settled_del[n] = k ? DEL_NONE : DEL_ACKED;
		} else if (k != CHAIN_LEN) {
			fail_msg("settled chain %u reached nvme but %u of %u blocks are back", n, k,
				 CHAIN_LEN);
		} else {
			w.settled_checked++;
		}
	}
	assert_int_equal(kvpool_connect(g.srv.url, "live", &g.opts, &l), 0);
	for (uint32_t n = 0; n < w.live; n++) {
		uint32_t k = chain_check(l, "live", n);

		if (w.live_del[n] == DEL_ACKED && k)
			fail_msg("live chain %u was deleted (acknowledged) and came back", n);
		if (w.live_del[n] == DEL_MAYBE && !k)
			w.live_del[n] = DEL_ACKED;
		w.deleted_checked += w.live_del[n] == DEL_ACKED;
		w.live_blocks += k;
	}
	for (uint32_t c = 0; c < w.cycle; c++) {
		struct kvpool_client *d = NULL;

		snprintf(ns, sizeof(ns), "drop%u", c);
		assert_int_equal(kvpool_connect(g.srv.url, ns, &g.opts, &d), 0);
		for (uint32_t n = 0; n < 2; n++) {
			uint32_t k = chain_check(d, ns, n);

			if (w.dropped[c] == DEL_ACKED && k)
				fail_msg("namespace %s was dropped (acknowledged) and chain %u came "
					 "back", ns, n);
		}
		w.dropped_checked += w.dropped[c] == DEL_ACKED;
		kvpool_close(d);
	}
	assert_int_equal(harness_stat_or_fail(s, "tiers.nvme.corrupt_blocks"), 0);
	assert_int_equal(harness_stat_or_fail(s, "tiers.nvme.evictions"), 0);
	kvpool_close(l);
	kvpool_close(s);
}

/* Put this cycle's settled chains and two chains in drop<c>, then filler
 * until all of them have an NVMe copy. */
static void settle(void)
{
	static struct chain c;
	struct kvpool_client *s = NULL, *d = NULL, *f = NULL;
	uint64_t t0 = harness_now_ms(), want_settled;
	static uint32_t filler;
	char ns[32];

	snprintf(ns, sizeof(ns), "drop%u", w.cycle);
	assert_int_equal(kvpool_connect(g.srv.url, "settled", &g.opts, &s), 0);
	assert_int_equal(kvpool_connect(g.srv.url, ns, &g.opts, &d), 0);
	assert_int_equal(kvpool_connect(g.srv.url, "filler", &g.opts, &f), 0);
	for (uint32_t i = 0; i < SETTLE_PER_CYCLE; i++) {
		chain_build(&c, "settled", w.settled);
		assert_int_equal(chain_put(s, &c), 0);
		w.settled++;
	}
	for (uint32_t n = 0; n < 2; n++) {
		chain_build(&c, ns, n);
		assert_int_equal(chain_put(d, &c), 0);
	}
	want_settled = harness_ns_stat_or_fail(s, "settled", "blocks");
	for (;;) {
		if (harness_ns_stat_or_fail(s, "settled", "nvme_blocks") == want_settled &&
		    harness_ns_stat_or_fail(s, ns, "nvme_blocks") == 2 * CHAIN_LEN)
			break;
		if (harness_now_ms() - t0 > SETTLE_TIMEOUT_MS)
			fail_msg("cycle %u: the settled blocks did not reach nvme (nvme used %" PRIu64
				 " bytes, %" PRIu64 " write errors, %" PRIu64 " reclaimed)", w.cycle,
				 harness_stat_or_fail(s, "tiers.nvme.used_bytes"),
				 harness_stat_or_fail(s, "tiers.nvme.write_errors"),
				 harness_stat_or_fail(s, "tiers.nvme.segments_reclaimed"));
		for (int i = 0; i < 16; i++) {
			chain_build(&c, "filler", filler++);
			(void)chain_put(f, &c);
		}
	}
	kvpool_close(f);
	kvpool_close(d);
	kvpool_close(s);
}

static void test_crash_cycles(void **state)
{
	uint16_t port = 0;
	pthread_t thr;
	int err;

	(void)state;
	assert_int_equal(harness_tmpdir("nvme-crash", g.dir, sizeof(g.dir)), 0);
	set_flags("4MiB");
	lp.seed = (uint32_t)harness_now_ms();
	for (w.cycle = 0; w.cycle < CYCLES; w.cycle++) {
		uint32_t delay;

		err = port ? harness_start_on_port(&g.srv, port, g.flags)
			   : harness_start(&g.srv, g.flags);
		if (err == -ENOENT)
			harness_skip("KVPOOLD is not set to a built kvpoold");
		assert_int_equal(err, 0);
		port = g.srv.port;
		check_all();
		settle();
		lp.stop = 0;
		assert_int_equal(kvpool_connect(g.srv.url, "live", &g.opts, &lp.c), 0);
		assert_int_equal(kvpool_connect(g.srv.url, "settled", &g.opts, &lp.s), 0);
		assert_int_equal(pthread_create(&thr, NULL, loop_main, NULL), 0);
		delay = 10 + rnd(&lp.seed) % 240;
		harness_sleep_ms(delay);
		harness_kill(&g.srv); /* SIGKILL */
		lp.stop = 1;
		assert_int_equal(pthread_join(thr, NULL), 0);
		kvpool_close(lp.c);
		kvpool_close(lp.s);
	}
	assert_int_equal(harness_start_on_port(&g.srv, port, g.flags), 0);
	check_all();
	print_message("nvme crash cycles: %u SIGKILLs; %" PRIu64 " ops; acknowledged: %" PRIu64
		      " deletes, %" PRIu64 " drops; over the restarts' checks: %" PRIu64
		      " deleted chains and %" PRIu64 " dropped namespaces found absent, %" PRIu64
		      " settled (on nvme) chains found whole, %" PRIu64 " live blocks read back "
		      "byte-exact; 0 wrong bytes\n", CYCLES, w.ops, w.deletes_acked, w.drops_acked,
		      w.deleted_checked, w.dropped_checked, w.settled_checked, w.live_blocks);
	assert_true(w.deletes_acked > 0);
	assert_int_equal(harness_stop(&g.srv), 0);
}

/* ---- SIGTERM keeps DRAM ---- */

static void test_sigterm_keeps_dram(void **state)
{
	static struct chain c;
	struct kvpool_client *cl = NULL;
	uint16_t port;
	int err;

	(void)state;
	assert_int_equal(harness_tmpdir("nvme-term", g.dir, sizeof(g.dir)), 0);
	set_flags("64MiB");
	err = harness_start(&g.srv, g.flags);
	if (err == -ENOENT)
		harness_skip("KVPOOLD is not set to a built kvpoold");
	assert_int_equal(err, 0);
	port = g.srv.port;
	assert_int_equal(kvpool_connect(g.srv.url, "warm", &g.opts, &cl), 0);
	for (uint32_t n = 0; n < 30; n++) {
		chain_build(&c, "warm", n);
		assert_int_equal(chain_put(cl, &c), 0);
	}
	harness_sleep_ms(300);
	assert_int_equal(harness_ns_stat_or_fail(cl, "warm", "nvme_blocks"), 0);
	kvpool_close(cl);
	assert_int_equal(harness_stop(&g.srv), 0);
	assert_int_equal(harness_start_on_port(&g.srv, port, g.flags), 0);
	assert_int_equal(kvpool_connect(g.srv.url, "warm", &g.opts, &cl), 0);
	assert_int_equal(harness_stat_or_fail(cl, "tiers.nvme.rebuild_blocks"), 30 * CHAIN_LEN);
	for (uint32_t n = 0; n < 30; n++)
		assert_int_equal(chain_check(cl, "warm", n), CHAIN_LEN);
	print_message("sigterm: %u blocks that were only in dram are back after the restart\n",
		      30 * CHAIN_LEN);
	kvpool_close(cl);
	assert_int_equal(harness_stop(&g.srv), 0);
}

/* ---- a read-only nvme_dir ---- */

/* STATS tiers.nvme.healthy (a JSON boolean). */
static bool nvme_healthy(struct kvpool_client *cl)
{
	char *json = NULL;
	bool healthy;

	assert_int_equal(kvpool_stats(cl, NULL, &json), 0);
	healthy = strstr(json, "\"healthy\":true") != NULL;
	kvpool_free(json);
	return healthy;
}

static void test_readonly_nvme_dir(void **state)
{
	static struct chain c;
	struct kvpool_client *cl = NULL, *f = NULL;
	const char *shim = getenv("KVPOOL_ROFS");
	char trigger[300];
	uint64_t blocks, t0;
	uint16_t port;
	uint8_t key[32];
	int err, st = 0, fd;

	(void)state;
	if (!shim || access(shim, R_OK))
		harness_skip("KVPOOL_ROFS is not set to the built read-only shim");
	assert_int_equal(harness_tmpdir("nvme-ro", g.dir, sizeof(g.dir)), 0);
	snprintf(trigger, sizeof(trigger), "%s.readonly", g.dir);
	unlink(trigger);
	set_flags("4MiB");
	setenv("LD_PRELOAD", shim, 1);
	setenv("ROFS_DIR", g.dir, 1);
	setenv("ROFS_TRIGGER", trigger, 1);
	setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
	err = harness_start(&g.srv, g.flags);
	unsetenv("LD_PRELOAD");
	unsetenv("ROFS_DIR");
	unsetenv("ROFS_TRIGGER");
	unsetenv("ASAN_OPTIONS");
	if (err == -ENOENT)
		harness_skip("KVPOOLD is not set to a built kvpoold");
	assert_int_equal(err, 0);
	port = g.srv.port;

	/* 20 chains, all on NVMe (filler pushes them out of DRAM) */
	assert_int_equal(kvpool_connect(g.srv.url, "ro", &g.opts, &cl), 0);
	assert_int_equal(kvpool_connect(g.srv.url, "filler", &g.opts, &f), 0);
	for (uint32_t n = 0; n < 20; n++) {
		chain_build(&c, "ro", n);
		assert_int_equal(chain_put(cl, &c), 0);
	}
	blocks = harness_ns_stat_or_fail(cl, "ro", "blocks");
	for (uint32_t n = 0, t0 = (uint32_t)harness_now_ms();
	     harness_ns_stat_or_fail(cl, "ro", "nvme_blocks") < blocks; n++) {
		if ((uint32_t)harness_now_ms() - t0 > SETTLE_TIMEOUT_MS)
			fail_msg("the chains did not reach nvme");
		chain_build(&c, "filler", n);
		(void)chain_put(f, &c);
	}

	/* the filesystem turns read-only */
	fd = open(trigger, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	for (uint32_t n = 1000; n < 1200; n++) {
		chain_build(&c, "filler", n);
		err = chain_put(f, &c);
		if (err)
			fail_msg("put %u with a read-only nvme_dir: %s", n, kvpool_strerror(err));
	}
	t0 = harness_now_ms();
	while (nvme_healthy(cl) && harness_now_ms() - t0 < 5000)
		harness_sleep_ms(20);
	assert_false(nvme_healthy(cl));
	assert_true(harness_stat_or_fail(cl, "tiers.nvme.write_errors") > 0);
	/* DRAM serves the newest filler; NVMe copies are still read */
	assert_int_equal(chain_check(f, "filler", 1199), CHAIN_LEN);
	for (uint32_t n = 0; n < 20; n += 5)
		assert_int_equal(chain_check(cl, "ro", n), CHAIN_LEN);
	/* a removal that cannot be recorded is not acknowledged */
	harness_key(key, "ro", 1900);
	chain_build(&c, "ro", 19);
	assert_int_equal(kvpool_delete(cl, c.keys[0], 1, &st), 0);
	assert_int_not_equal(st, 0);
	assert_int_not_equal(kvpool_drop_namespace(cl, "filler", NULL), 0);
	kvpool_close(f);
	kvpool_close(cl);
	/* a clean stop, not an abort */
	assert_int_equal(harness_stop(&g.srv), 0);

	/* writable again: the restart finds what was on NVMe */
	unlink(trigger);
	assert_int_equal(harness_start_on_port(&g.srv, port, g.flags), 0);
	assert_int_equal(kvpool_connect(g.srv.url, "ro", &g.opts, &cl), 0);
	for (uint32_t n = 0; n < 19; n++)
		assert_int_equal(chain_check(cl, "ro", n), CHAIN_LEN);
	assert_true(nvme_healthy(cl));
	print_message("read-only nvme_dir: kvpoold kept serving from dram and nvme, stopped "
		      "cleanly, and the restart found the 19 chains left on nvme\n");
	kvpool_close(cl);
	assert_int_equal(harness_stop(&g.srv), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_sigterm_keeps_dram, teardown),
		cmocka_unit_test_teardown(test_readonly_nvme_dir, teardown),
		cmocka_unit_test_teardown(test_crash_cycles, teardown),
	};

	return cmocka_run_group_tests_name("integ_nvme_crash", tests, NULL, NULL);
}
