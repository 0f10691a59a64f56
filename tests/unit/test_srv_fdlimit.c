/*
 * test_srv_fdlimit.c - unit tests of srv_fdlimit.c: how many connections
 * fit in an RLIMIT_NOFILE soft limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "srv_fdlimit.h"

/* Enough descriptors: max_connections; short: what fits beside the
 * reserved ones, never 0. */
static void test_conn_limit(void **state)
{
	(void)state;
	assert_int_equal(srv_conn_limit(1000, 1000 + SRV_RESERVED_FDS), 1000);
	assert_int_equal(srv_conn_limit(1000, UINT64_MAX), 1000);
	assert_int_equal(srv_conn_limit(1000, 1000 + SRV_RESERVED_FDS - 1), 999);
	assert_int_equal(srv_conn_limit(1000, 1024), 1024 - SRV_RESERVED_FDS);
	assert_int_equal(srv_conn_limit(1000, SRV_RESERVED_FDS), 1);
	assert_int_equal(srv_conn_limit(1000, 0), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conn_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
