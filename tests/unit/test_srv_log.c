/*
 * test_srv_log.c - unit tests of kvpoold's log helpers: the sanitizer that
 * renders untrusted bytes in a log line, and the per-second rate limit of
 * protocol-error lines. (Moved from test_server.c.)
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

#include "proto.h"
#include "srv_log.h"

/* ---- log sanitizer ------------------------------------------------------ */

static void test_sanitize_printable_passes(void **state)
{
	char out[64];

	(void)state;
	assert_int_equal(srv_log_sanitize("hello world", 11, out, sizeof(out)), 11);
	assert_string_equal(out, "hello world");
}

static void test_sanitize_escapes(void **state)
{
	const uint8_t in[] = { 'K', 0x00, '\\', 0x7f, 0xff, '\n' };
	char out[64];
	size_t n;

	(void)state;
	n = srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_string_equal(out, "K\\x00\\\\\\x7f\\xff\\x0a");
	assert_int_equal(n, strlen(out));
}

static void test_sanitize_truncates_with_ellipsis(void **state)
{
	char in[100], out[16];
	size_t n;

	(void)state;
	memset(in, 'a', sizeof(in));
	n = srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_int_equal(n, 15);
	assert_string_equal(out, "aaaaaaaaaaaa...");
}

static void test_sanitize_never_splits_an_escape(void **state)
{
	const uint8_t in[] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	char out[12];

	(void)state;
	/* 8 bytes need 32 characters; room for 11: two escapes + "...". */
	srv_log_sanitize(in, sizeof(in), out, sizeof(out));
	assert_string_equal(out, "\\x01\\x02...");
}

static void test_sanitize_exact_fit_has_no_ellipsis(void **state)
{
	char out[5];

	(void)state;
	assert_int_equal(srv_log_sanitize("abcd", 4, out, sizeof(out)), 4);
	assert_string_equal(out, "abcd");
	assert_int_equal(srv_log_sanitize("abcde", 5, out, sizeof(out)), 0 + 1 + 3);
	assert_string_equal(out, "a...");
}

static void test_sanitize_tiny_buffers(void **state)
{
	char out[2] = { 'x', 'x' };

	(void)state;
	assert_int_equal(srv_log_sanitize("abc", 3, out, 0), 0);
	assert_int_equal(out[0], 'x'); /* nothing written with no room */
	assert_int_equal(srv_log_sanitize("abc", 3, out, 1), 0);
	assert_string_equal(out, "");
	assert_int_equal(srv_log_sanitize("", 0, out, sizeof(out)), 0);
	assert_string_equal(out, "");
}

/* ---- protocol-error log rate limit ------------------------------------------ */

/* Lines allowed by srv_ratelimit_allow in `n` calls at now_ms; the
 * suppressed counts reported along the way are added to *reported. */
static uint32_t allow_n(struct srv_ratelimit *rl, uint64_t now_ms, uint32_t n, uint64_t *reported)
{
	uint32_t allowed = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t sup = 0;

		if (srv_ratelimit_allow(rl, now_ms, &sup))
			allowed++;
		*reported += sup;
	}
	return allowed;
}

static void test_ratelimit_caps_a_burst(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 20 };
	uint64_t reported = 0;

	(void)state;
	/* 50000 bad requests within one second: 20 lines, the rest counted. */
	assert_int_equal(allow_n(&rl, 5000, 25000, &reported), 20);
	assert_int_equal(allow_n(&rl, 5999, 25000, &reported), 0);
	assert_int_equal(reported, 0);
	/* The next second: its first line comes with the count, once. */
	assert_int_equal(allow_n(&rl, 6000, 1, &reported), 1);
	assert_int_equal(reported, 49980);
	assert_int_equal(allow_n(&rl, 6001, 30, &reported), 19);
	assert_int_equal(reported, 49980);
}

static void test_ratelimit_quiet_traffic_passes(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 20 };
	uint64_t reported = 0;

	(void)state;
	/* Ten lines a second for a minute: never limited, nothing reported. */
	for (uint64_t t = 0; t < 60000; t += 100)
		assert_int_equal(allow_n(&rl, 1000 + t, 1, &reported), 1);
	assert_int_equal(reported, 0);
	assert_int_equal(srv_ratelimit_flush(&rl, 100000), 0);
}

static void test_ratelimit_flush_reports_once(void **state)
{
	struct srv_ratelimit rl = { .per_sec = 3 };
	uint64_t reported = 0;

	(void)state;
	assert_int_equal(allow_n(&rl, 10000, 10, &reported), 3);
	/* Within the window: nothing to report yet. */
	assert_int_equal(srv_ratelimit_flush(&rl, 10999), 0);
	/* The window is over: the timer reports the 7, and only once. */
	assert_int_equal(srv_ratelimit_flush(&rl, 11000), 7);
	assert_int_equal(srv_ratelimit_flush(&rl, 12500), 0);
	assert_int_equal(allow_n(&rl, 12600, 1, &reported), 1);
	assert_int_equal(reported, 0);
	/* A clock that goes backwards starts a new window too. */
	assert_int_equal(allow_n(&rl, 12600, 5, &reported), 2);
	assert_int_equal(allow_n(&rl, 500, 1, &reported), 1);
	assert_int_equal(reported, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sanitize_printable_passes),
		cmocka_unit_test(test_sanitize_escapes),
		cmocka_unit_test(test_sanitize_truncates_with_ellipsis),
		cmocka_unit_test(test_sanitize_never_splits_an_escape),
		cmocka_unit_test(test_sanitize_exact_fit_has_no_ellipsis),
		cmocka_unit_test(test_sanitize_tiny_buffers),
		cmocka_unit_test(test_ratelimit_caps_a_burst),
		cmocka_unit_test(test_ratelimit_quiet_traffic_passes),
		cmocka_unit_test(test_ratelimit_flush_reports_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
