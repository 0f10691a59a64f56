/*
 * test_restart.c - the server goes away and comes back on the same port:
 * calls fail fast while it is gone, and the next call after it is back
 * reconnects, says HELLO again (new limits) and works.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fail_fast_then_reconnect),
		cmocka_unit_test(test_restart_while_idle),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_restart", tests, group_setup, group_teardown);
}
