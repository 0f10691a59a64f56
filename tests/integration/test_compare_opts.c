/*
 * test_compare_opts.c - tests/bench/compare.sh checks its command line
 * before it builds, installs or starts anything: a missing value, a count
 * out of range, an unknown block size or too many bytes in flight prints
 * what is wrong and the usage, and exits 2. The benchmark itself never
 * runs here (BUILD points at a directory that does not exist, so a check
 * that let a bad option through would show as "building" instead).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#define RUN_MS 10000

/* Run compare.sh with args (NULL-terminated, at most 6) and stderr
 * merged into the output; returns its exit status, *out its output
 * (caller frees). */
static int compare(char **out, ...)
{
	const char *data = getenv("KVPOOL_TEST_DATA");
	char script[4096];
	char *argv[12] = { "/bin/sh", "-c",
			   "BUILD=/nonexistent/kvpool-build exec bash \"$0\" \"$@\" 2>&1", script };
	int n = 4, status = -1;
	va_list ap;

	snprintf(script, sizeof(script), "%s/../bench/compare.sh", data ? data : "tests/data");
	va_start(ap, out);
	for (char *a; (a = va_arg(ap, char *)) != NULL && n < 11;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	assert_int_equal(harness_run(argv, RUN_MS, out, &status), 0);
	return status;
}

/* Exit 2 with `why` and the usage line, and nothing run. */
static void expect_refused(const char *why, char *out, int status)
{
	if (status != 2 || !strstr(out, why) || !strstr(out, "usage: compare.sh") ||
	    strstr(out, "building"))
		fail_msg("want exit 2 with '%s' and the usage; got exit %d:\n%s", why, status, out);
	free(out);
}

static void test_missing_values(void **state)
{
	char *out;
	int st;

	(void)state;
	st = compare(&out, "--connections", NULL);
	expect_refused("--connections needs a value", out, st);
	st = compare(&out, "--quick", "--depth", NULL);
	expect_refused("--depth needs a value", out, st);
	st = compare(&out, "--sizes", NULL);
	expect_refused("--sizes needs a value", out, st);
}

static void test_numbers_out_of_range(void **state)
{
	static const char *const cases[][3] = {
		{ "--connections", "0", "--connections must be an integer in 1..256, not '0'" },
		{ "--connections", "257", "in 1..256, not '257'" },
		{ "--connections", "-1", "in 1..256, not '-1'" },
		{ "--connections", "2x", "in 1..256, not '2x'" },
		{ "--connections", "", "in 1..256, not ''" },
		{ "--depth", "0", "--depth must be an integer in 1..1024, not '0'" },
		{ "--depth", "1025", "in 1..1024, not '1025'" },
		{ "--depth", "99999999999999999999", "in 1..1024" },
	};
	char *out;
	int st;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		st = compare(&out, cases[i][0], cases[i][1], NULL);
		expect_refused(cases[i][2], out, st);
	}
}

static void test_block_sizes(void **state)
{
	char *out;
	int st;

	(void)state;
	st = compare(&out, "--sizes", "3MiB", NULL);
	expect_refused("unknown block size '3MiB' (known: 64KiB,256KiB,1MiB,4MiB,16MiB)", out, st);
	st = compare(&out, "--sizes", "1MiB,1mib", NULL);
	expect_refused("unknown block size '1mib'", out, st);
	st = compare(&out, "--sizes", "1MiB,1MiB", NULL);
	expect_refused("block size 1MiB given twice", out, st);
	st = compare(&out, "--sizes", "1MiB,", NULL);
	expect_refused("empty item in --sizes", out, st);
	/* 64 x 64 blocks of 16 MiB in flight: 64 GiB, over kvpoold's 1 GiB */
	st = compare(&out, "--connections", "64", "--depth", "64", NULL);
	expect_refused("exceed the 1 GiB in flight", out, st);
	st = compare(&out, "--x", NULL);
	expect_refused("unknown argument '--x'", out, st);
}

static void test_help(void **state)
{
	char *out;
	int st;

	(void)state;
	st = compare(&out, "--help", NULL);
	assert_int_equal(st, 0);
	assert_non_null(strstr(out, "C: 1..256"));
	assert_non_null(strstr(out, "1..1024"));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_values),
		cmocka_unit_test(test_numbers_out_of_range),
		cmocka_unit_test(test_block_sizes),
		cmocka_unit_test(test_help),
	};

	return cmocka_run_group_tests_name("integ_compare_opts", tests, NULL, NULL);
}
