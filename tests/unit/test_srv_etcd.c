/*
 * test_srv_etcd.c - kvpoold's check of the address it advertises in etcd
 * (srv_etcd_loopback in server/srv_etcd.c): loopback literals in every
 * spelling, "localhost", names that resolve to loopback only, and
 * addresses other machines can reach.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "srv_etcd.h"

static void test_loopback_literals(void **state)
{
	(void)state;
	assert_int_equal(srv_etcd_loopback("127.0.0.1"), 1);
	assert_int_equal(srv_etcd_loopback("127.1.2.3"), 1);
	assert_int_equal(srv_etcd_loopback("::1"), 1);
	assert_int_equal(srv_etcd_loopback("[::1]"), 1);
	assert_int_equal(srv_etcd_loopback("::ffff:127.0.0.1"), 1);
	assert_int_equal(srv_etcd_loopback("localhost"), 1);
	assert_int_equal(srv_etcd_loopback("LOCALHOST"), 1);
	assert_int_equal(srv_etcd_loopback("localhost.localdomain"), 1);
}

static void test_reachable_addresses(void **state)
{
	(void)state;
	assert_int_equal(srv_etcd_loopback("10.0.0.1"), 0);
	assert_int_equal(srv_etcd_loopback("192.168.1.20"), 0);
	assert_int_equal(srv_etcd_loopback("128.0.0.1"), 0);
	assert_int_equal(srv_etcd_loopback("2001:db8::1"), 0);
	assert_int_equal(srv_etcd_loopback("[2001:db8::1]"), 0);
	assert_int_equal(srv_etcd_loopback("::ffff:10.1.1.1"), 0);
	/* a name that does not resolve is not called loopback */
	assert_int_equal(srv_etcd_loopback("no-such-host.invalid"), 0);
	assert_int_equal(srv_etcd_loopback(""), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loopback_literals),
		cmocka_unit_test(test_reachable_addresses),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
