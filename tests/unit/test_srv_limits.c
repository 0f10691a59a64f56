/*
 * test_srv_limits.c - unit tests of srv_limits.c: the dram_capacity check
 * against physical memory and the cgroup v2 limit, and the parser of
 * memory.max. (Moved from test_server.c.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "srv_limits.h"

/* ---- dram_capacity against physical memory ---------------------------------------- */

static void test_check_dram(void **state)
{
	char err[256] = "";

	(void)state;
	assert_int_equal(srv_check_dram(1ull << 30, 16ull << 30, 0, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram(16ull << 30, 16ull << 30, 0, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram(1ull << 42, 0, 0, err, sizeof(err)), 0); /* unknown */
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram(1ull << 42, 16ull << 30, 0, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity"));
	assert_non_null(strstr(err, "4398046511104"));
	assert_non_null(strstr(err, "17179869184"));
	assert_non_null(strstr(err, "physical memory"));
	/* This host's figure is known and sane. */
	assert_true(srv_phys_bytes() >= (64ull << 20));
}

/* The effective limit is the smaller of physical memory and the cgroup's
 * memory.max, and the message says which one it was. */
static void test_check_dram_cgroup(void **state)
{
	char err[256] = "";

	(void)state;
	/* at the cgroup limit passes, one byte above fails */
	assert_int_equal(srv_check_dram(314572800, 16ull << 30, 314572800, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram(314572801, 16ull << 30, 314572800, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity"));
	assert_non_null(strstr(err, "314572801"));
	assert_non_null(strstr(err, "cgroup memory.max 314572800"));
	assert_null(strstr(err, "physical memory"));
	/* a cgroup limit above physical memory: physical memory decides */
	memset(err, 0, sizeof(err));
	assert_int_equal(srv_check_dram(1ull << 36, 16ull << 30, 1ull << 40, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "physical memory (17179869184 bytes)"));
	assert_null(strstr(err, "cgroup"));
	/* physical memory unknown: the cgroup limit alone */
	assert_int_equal(srv_check_dram(1ull << 30, 0, 1ull << 29, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "cgroup memory.max 536870912"));
	assert_int_equal(srv_check_dram(1ull << 29, 0, 1ull << 29, err, sizeof(err)), 0);
}

static void test_parse_memory_max(void **state)
{
	uint64_t v = 7;

	(void)state;
	assert_int_equal(srv_parse_memory_max("max\n", &v), 0);
	assert_int_equal(v, 0);
	v = 7;
	assert_int_equal(srv_parse_memory_max("max", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(srv_parse_memory_max("314572800\n", &v), 0);
	assert_int_equal(v, 314572800);
	assert_int_equal(srv_parse_memory_max("18446744073709551615", &v), 0);
	assert_int_equal(v, UINT64_MAX);
	v = 7;
	assert_int_equal(srv_parse_memory_max("", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("-1\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("12x\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("1 2", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("99999999999999999999999", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("maximum", &v), -EINVAL);
	assert_int_equal(v, 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_dram),
		cmocka_unit_test(test_check_dram_cgroup),
		cmocka_unit_test(test_parse_memory_max),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
