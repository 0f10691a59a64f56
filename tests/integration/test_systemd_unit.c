/*
 * test_systemd_unit.c - config/kvpoold.service passes `systemd-analyze
 * verify` with no output at all (it exits 0 even when it ignores a
 * misspelt key, so any output fails), on a copy whose ExecStart runs the
 * kvpoold just built; and the unit says what the issue asks of it.
 *
 * Without systemd-analyze the tests skip, except under CI=true, where a
 * missing tool fails.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define EXEC_START "ExecStart=/usr/local/bin/kvpoold "

/* config/kvpoold.service as a string (caller frees). */
static char *read_unit(void)
{
	const char *data = getenv("KVPOOL_TEST_DATA");
	char path[4096];
	char *buf = calloc(1, 65536);
	size_t n;
	FILE *f;

	assert_non_null(buf);
	snprintf(path, sizeof(path), "%s/../../config/kvpoold.service", data ? data : "tests/data");
	f = fopen(path, "r");
	assert_non_null(f);
	n = fread(buf, 1, 65535, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static void need_analyze(void)
{
	const char *ci = getenv("CI");

	if (system("command -v systemd-analyze >/dev/null 2>&1") == 0)
		return;
	if (ci && strcmp(ci, "true") == 0)
		fail_msg("systemd-analyze is missing (CI=true: not skipping)");
	harness_skip("systemd-analyze not installed");
}

/* Write `unit` to DIR/kvpoold.service with ExecStart pointing at
 * $KVPOOLD, run systemd-analyze verify on it; returns its exit status and
 * its output (stdout and stderr) in *out (caller frees). */
static int verify(const char *unit, char **out)
{
	const char *kvpoold = getenv("KVPOOLD");
	char dir[] = "/tmp/kvpool-unit-XXXXXX", path[128], cmd[512];
	const char *exec = strstr(unit, EXEC_START);
	char *buf = calloc(1, 65536);
	size_t n;
	FILE *f, *p;
	int status;

	assert_non_null(buf);
	assert_non_null(kvpoold);
	assert_non_null(exec);
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/kvpoold.service", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fwrite(unit, 1, (size_t)(exec - unit), f);
	fprintf(f, "ExecStart=%s %s", kvpoold, exec + strlen(EXEC_START));
	assert_int_equal(fclose(f), 0);
	snprintf(cmd, sizeof(cmd), "systemd-analyze verify '%s' 2>&1", path);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(buf, 1, 65535, p);
	buf[n] = '\0';
	status = pclose(p);
	unlink(path);
	rmdir(dir);
	*out = buf;
	return status;
}

/* The shipped unit: exit 0 and not a byte of output. */
static void test_unit_verifies(void **state)
{
	char *unit, *out;
	int status;

	(void)state;
	need_analyze();
	unit = read_unit();
	status = verify(unit, &out);
	if (out[0])
		fail_msg("systemd-analyze verify said:\n%s", out);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	free(out);
	free(unit);
}

/* The check can fail: a misspelt key gives output (though exit 0). */
static void test_verify_catches_typo(void **state)
{
	char *unit, *out, *at;

	(void)state;
	need_analyze();
	unit = read_unit();
	at = strstr(unit, "LockPersonality=");
	assert_non_null(at);
	memcpy(at, "LockPersonalitx=", 16);
	verify(unit, &out);
	assert_non_null(strstr(out, "LockPersonalitx"));
	free(out);
	free(unit);
}

/* What the issue asks of the unit. */
static void test_unit_contents(void **state)
{
	static const char *const want[] = {
		"\nType=notify\n", "\nExecReload=/bin/kill -HUP $MAINPID\n", "\nUser=kvpool\n",
		"\nLimitMEMLOCK=infinity\n", "\nNoNewPrivileges=yes\n", "\nProtectSystem=strict\n",
		"\nReadWritePaths=/var/lib/kvpool\n", "\nPrivateTmp=yes\n", "\nProtectHome=yes\n",
		"\nWatchdogSec=",
	};
	char *unit = read_unit();
	const char *raf;

	(void)state;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!strstr(unit, want[i]))
			fail_msg("unit lacks '%s'", want[i]);
	/* the nvme_dir the unit's comment suggests is made by systemd, and
	 * holds tenants' payloads: owner only (issue 20 items 7, 10) */
	{
		const char *sd = strstr(unit, "\nStateDirectory=");

		assert_non_null(sd);
		assert_non_null(strstr(sd, " kvpool/nvme\n"));
		assert_non_null(strstr(unit, "\nStateDirectoryMode=0700\n"));
		assert_non_null(strstr(unit, "nvme_dir = /var/lib/kvpool/nvme"));
	}
	/* PrivateDevices would hide /dev/infiniband */
	assert_null(strstr(unit, "\nPrivateDevices="));
	raf = strstr(unit, "\nRestrictAddressFamilies=");
	if (raf) {
		const char *end = strchr(raf + 1, '\n');
		char line[256];

		assert_non_null(end);
		snprintf(line, sizeof(line), "%.*s ", (int)(end - raf - 1), raf + 1);
		*strchr(line, '=') = ' ';
		assert_non_null(strstr(line, " AF_INET "));
		assert_non_null(strstr(line, " AF_INET6 "));
		assert_non_null(strstr(line, " AF_UNIX "));
		assert_non_null(strstr(line, " AF_NETLINK "));
		assert_non_null(strstr(line, " AF_IB "));
	}
	free(unit);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unit_contents),
		cmocka_unit_test(test_unit_verifies),
		cmocka_unit_test(test_verify_catches_typo),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
