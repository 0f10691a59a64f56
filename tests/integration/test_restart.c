/*
 * test_restart.c - the server goes away and comes back on the same port:
 * calls fail fast while it is gone, and the next call after it is back
 * reconnects, says HELLO again (new limits) and works; also while a client
 * loop runs and kvpoold is killed with SIGKILL.
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

#include "harness.h"

#define FAST_MS 2000

static const char *const flags_a[] = {
	"--dram-capacity", "32MiB", "--max-block-bytes", "4MiB", "--threads", "2",
	"--log-level", "warn", NULL,
};
static const char *const flags_b[] = {
	"--dram-capacity", "32MiB", "--max-block-bytes", "2MiB", "--threads", "2",
	"--log-level", "warn", NULL,
};

static struct {
	struct harness_server srv;
} g;

static int group_setup(void **state)
{
	(void)state;
	return harness_group_start(&g.srv, flags_a);
}

static int group_teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	return 0;
}

static void put_one(struct kvpool_client *c, const char *tag, uint64_t n)
{
	uint8_t key[32], data[9000];

	harness_key(key, tag, n);
	harness_fill(data, sizeof(data), n);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
}

static int get_one(struct kvpool_client *c, const char *tag, uint64_t n)
{
	uint8_t key[32], want[9000], got[9000];
	uint64_t len = 0;
	int rc;

	harness_key(key, tag, n);
	harness_fill(want, sizeof(want), n);
	rc = kvpool_get_bytes(c, key, got, sizeof(got), &len);
	if (rc == 0) {
		assert_int_equal(len, sizeof(want));
		assert_memory_equal(got, want, sizeof(want));
	}
	return rc;
}

/* A call against a stopped server: negative, not a miss, and quick. */
static void assert_fails_fast(struct kvpool_client *c)
{
	uint64_t t0 = harness_now_ms(), elapsed;
	int rc = get_one(c, "restart", 0);

	elapsed = harness_now_ms() - t0;
	if (rc >= 0 || rc == -ENOENT)
		fail_msg("call to a stopped server returned %s", kvpool_strerror(rc));
	if (elapsed >= FAST_MS)
		fail_msg("call to a stopped server took %llu ms (%s)", (unsigned long long)elapsed,
			 kvpool_strerror(rc));
}

static void test_fail_fast_then_reconnect(void **state)
{
	struct kvpool_client *c = NULL;
	struct kvpool_limits limits;
	uint16_t port = g.srv.port;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "restart", &c), 0);
	put_one(c, "restart", 0);
	assert_int_equal(get_one(c, "restart", 0), 0);
	assert_int_equal(kvpool_get_limits(c, &limits), 0);
	assert_int_equal(limits.max_block_bytes, 4u << 20);

	assert_int_equal(harness_stop(&g.srv), 0);
	assert_fails_fast(c); /* the old connection is gone */
	assert_fails_fast(c); /* reconnecting is refused */

	assert_int_equal(harness_start_on_port(&g.srv, port, flags_b), 0);
	put_one(c, "restart", 1);
	assert_int_equal(get_one(c, "restart", 1), 0);
	/* A new server, DRAM only: the old block is gone. */
	assert_int_equal(get_one(c, "restart", 0), -ENOENT);
	/* Limits come from the new HELLO. */
	assert_int_equal(kvpool_get_limits(c, &limits), 0);
	assert_int_equal(limits.max_block_bytes, 2u << 20);
	assert_int_equal(kvpool_ping(c, NULL), 0);
	kvpool_close(c);
}

/* Restart while the client is idle: its first call may fail (fast), the
 * call after it works. */
static void test_restart_while_idle(void **state)
{
	struct kvpool_client *c = NULL;
	uint16_t port = g.srv.port;
	uint64_t t0;
	int rc;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "restart", &c), 0);
	put_one(c, "restart-idle", 0);
	assert_int_equal(harness_stop(&g.srv), 0);
	assert_int_equal(harness_start_on_port(&g.srv, port, flags_a), 0);

	t0 = harness_now_ms();
	rc = kvpool_ping(c, NULL);
	assert_true(harness_now_ms() - t0 < FAST_MS);
	if (rc)
		assert_int_equal(kvpool_ping(c, NULL), 0);
	put_one(c, "restart-idle", 1);
	assert_int_equal(get_one(c, "restart-idle", 1), 0);
	kvpool_close(c);
}

/* ---- kill -9 under load ---------------------------------------------------- */

#define KILL_ROUNDS 2
#define KILL_CALL_TIMEOUT_MS 1000
#define KILL_SLACK_MS 500
#define KILL_MAX_CALLS 100000

/* One call of the client loop. */
struct kill_call {
	uint64_t start_ms, end_ms;
	int rc;
	int is_get;
};

/* The client loop: one handle, put then get of a fresh block, again and
 * again, until told to stop. epoch goes up at every kill, so that a get
 * that misses a block put before the kill is known to be a clean miss. */
static struct {
	struct kvpool_client *c;
	volatile int stop;
	volatile int epoch;
	struct kill_call *calls;
	size_t n_calls;
	int false_success; /* a get that returned other bytes */
	int unexplained_miss; /* a get that missed a block put in the same epoch */
} kl;

static void kill_record(uint64_t t0, int rc, int is_get)
{
	if (kl.n_calls < KILL_MAX_CALLS)
		kl.calls[kl.n_calls++] = (struct kill_call){ t0, harness_now_ms(), rc, is_get };
}

static void *kill_loop_main(void *arg)
{
	static uint8_t data[32768], got[32768];
	uint8_t key[32];

	(void)arg;
	for (uint64_t i = 0; !kl.stop; i++) {
		uint64_t t0 = harness_now_ms(), len = 0;
		int epoch = kl.epoch, rc;

		harness_key(key, "restart-kill", i);
		harness_fill(data, sizeof(data), i);
		rc = kvpool_put_bytes(kl.c, key, NULL, data, sizeof(data));
		kill_record(t0, rc, 0);
		if (rc) {
			/* a refused connect returns at once: without a pause the
			 * loop fills the call log (KILL_MAX_CALLS) during a long
			 * outage, as under valgrind, and the first success after
			 * the restart goes unrecorded */
			harness_sleep_ms(1);
			continue;
		}
		t0 = harness_now_ms();
		rc = kvpool_get_bytes(kl.c, key, got, sizeof(got), &len);
		kill_record(t0, rc, 1);
		if (rc == 0 && (len != sizeof(data) || memcmp(got, data, sizeof(data))))
			kl.false_success++;
		if (rc == -ENOENT && kl.epoch == epoch)
			kl.unexplained_miss++;
	}
	return NULL;
}

/* Calls that started after `from` and ended before `to`: how many, how
 * many succeeded, the slowest. */
static void kill_window(uint64_t from, uint64_t to, size_t *n, size_t *ok, uint64_t *slowest)
{
	*n = *ok = 0;
	*slowest = 0;
	for (size_t i = 0; i < kl.n_calls; i++) {
		const struct kill_call *k = &kl.calls[i];

		if (k->start_ms < from || k->end_ms > to)
			continue;
		(*n)++;
		*ok += k->rc == 0;
		if (k->end_ms - k->start_ms > *slowest)
			*slowest = k->end_ms - k->start_ms;
	}
}

/* The first successful call that started at or after `from`, or 0. */
static uint64_t kill_first_success(uint64_t from)
{
	for (size_t i = 0; i < kl.n_calls; i++)
		if (kl.calls[i].start_ms >= from && kl.calls[i].rc == 0)
			return kl.calls[i].end_ms;
	return 0;
}

/* A client loop of put/get on one handle while kvpoold is killed with
 * SIGKILL and started again on the same port, twice. During each outage
 * every call fails (no false success) within its timeout; after each
 * restart the same handle works again without being reopened, and its
 * reconnect counter goes up. Prints the recovery times. */
static void test_kill9_under_load(void **state)
{
	struct kvpool_options opts = { .timeout_ms = KILL_CALL_TIMEOUT_MS };
	uint64_t killed[KILL_ROUNDS], started[KILL_ROUNDS], ready[KILL_ROUNDS], back[KILL_ROUNDS];
	struct kvpool_counters k0, k1;
	uint16_t port = g.srv.port;
	pthread_t thr;

	(void)state;
	harness_need_server(&g.srv);
	kl.calls = calloc(KILL_MAX_CALLS, sizeof(*kl.calls));
	assert_non_null(kl.calls);
	assert_int_equal(kvpool_connect(g.srv.url, "restart-kill", &opts, &kl.c), 0);
	assert_int_equal(kvpool_get_counters(kl.c, &k0), 0);
	assert_int_equal(pthread_create(&thr, NULL, kill_loop_main, NULL), 0);
	for (int r = 0; r < KILL_ROUNDS; r++) {
		harness_sleep_ms(300);
		killed[r] = harness_now_ms();
		kl.epoch++;
		harness_kill(&g.srv); /* SIGKILL */
		harness_sleep_ms(500);
		started[r] = harness_now_ms();
		assert_int_equal(harness_start_on_port(&g.srv, port, flags_a), 0);
		ready[r] = harness_now_ms();
		while (!(back[r] = kill_first_success(started[r])) &&
		       harness_now_ms() - ready[r] < 5000)
			harness_sleep_ms(5);
		assert_true(back[r] != 0);
	}
	harness_sleep_ms(200);
	kl.stop = 1;
	assert_int_equal(pthread_join(thr, NULL), 0);

	for (int r = 0; r < KILL_ROUNDS; r++) {
		size_t n, ok;
		uint64_t slowest;

		/* The outage: from the kill to the new kvpoold's start. */
		kill_window(killed[r] + 1, started[r], &n, &ok, &slowest);
		print_message("kill -9 #%d: %zu calls during the outage, %zu succeeded, slowest %"
			      PRIu64 " ms; kvpoold answered %" PRIu64 " ms after its start; the "
			      "client's first success %" PRIu64 " ms after the start, %" PRIu64
			      " ms after the kill\n", r + 1, n, ok, slowest, ready[r] - started[r],
			      back[r] - started[r], back[r] - killed[r]);
		assert_true(n > 0);
		assert_int_equal(ok, 0);
		assert_true(slowest < KILL_CALL_TIMEOUT_MS + KILL_SLACK_MS);
		assert_true(back[r] < ready[r] + 2000);
	}
	/* No call ever hung, and no get returned other bytes. */
	for (size_t i = 0; i < kl.n_calls; i++)
		assert_true(kl.calls[i].end_ms - kl.calls[i].start_ms <
			    KILL_CALL_TIMEOUT_MS + KILL_SLACK_MS);
	assert_int_equal(kl.false_success, 0);
	assert_int_equal(kl.unexplained_miss, 0);
	assert_int_equal(kvpool_get_counters(kl.c, &k1), 0);
	assert_true(k1.reconnects >= k0.reconnects + KILL_ROUNDS);
	assert_int_equal(kvpool_ping(kl.c, NULL), 0);
	kvpool_close(kl.c);
	free(kl.calls);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fail_fast_then_reconnect),
		cmocka_unit_test(test_restart_while_idle),
		cmocka_unit_test(test_kill9_under_load),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_restart", tests, group_setup, group_teardown);
}
