/*
 * test_lifecycle.c - kvpoold as a service: systemd readiness (READY=1 only
 * once the port accepts, STOPPING=1, watchdog pings) through a
 * NOTIFY_SOCKET of our own, SIGHUP reload, the SIGTERM drain with a
 * request in flight (and its timeout), protected mode, and the effective
 * settings in STATS (`kvpool stats settings`).
 *
 * Each test starts its own kvpoold with stderr in a file, so that it can
 * read what was logged.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <arpa/inet.h>

#include <cmocka.h>

#include "harness.h"

struct daemon {
	pid_t pid;
	uint16_t port;
	char log[64];
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* A port nobody listens on right now. */
static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* 0 if 127.0.0.1:port accepts a connection. */
static int try_connect(uint16_t port)
{
	int fd;

	if (harness_raw_connect(port, &fd) != 0)
		return -1;
	close(fd);
	return 0;
}

/* Start kvpoold with `args` (NULL-terminated) after --port and
 * --admin-port 0, `env` ("NAME=value", NULL-terminated, may be NULL)
 * added to the environment, stderr into d->log. */
static void daemon_spawn(struct daemon *d, const char *const *args, const char *const *env)
{
	const char *kvpoold = getenv("KVPOOLD");
	char port[16];
	const char *argv[40] = { kvpoold, "--port", port, "--admin-port", "0", "--threads", "2",
				 "--dram-capacity", "64MiB" };
	size_t n = 9;
	int fd;

	if (!kvpoold || access(kvpoold, X_OK) != 0)
		harness_skip("KVPOOLD not set");
	d->port = free_port();
	snprintf(port, sizeof(port), "%u", d->port);
	for (; args && *args; args++) {
		assert_true(n + 1 < sizeof(argv) / sizeof(argv[0]));
		argv[n++] = *args;
	}
	argv[n] = NULL;
	snprintf(d->log, sizeof(d->log), "/tmp/kvpool-life-XXXXXX");
	fd = mkstemp(d->log);
	assert_true(fd >= 0);
	d->pid = fork();
	assert_true(d->pid >= 0);
	if (d->pid == 0) {
		dup2(fd, 2);
		for (; env && *env; env++)
			putenv((char *)*env);
		execv(kvpoold, (char *const *)argv);
		_exit(127);
	}
	close(fd);
}

/* Wait until the port accepts or the daemon exits. */
static void daemon_wait_port(struct daemon *d)
{
	uint64_t deadline = now_ms() + HARNESS_READY_TIMEOUT_MS;
	int status;

	while (try_connect(d->port) != 0) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid)
			fail_msg("kvpoold exited at start (status 0x%x)", status);
		assert_true(now_ms() < deadline);
		sleep_ms(20);
	}
}

/* Wait for the daemon's exit; returns its wait status, -1 on timeout
 * (after which it is killed). */
static int daemon_wait_exit(struct daemon *d, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	int status;

	for (;;) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = 0;
			return status;
		}
		if (now_ms() > deadline) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, &status, 0);
			d->pid = 0;
			return -1;
		}
		sleep_ms(10);
	}
}

/* The daemon's stderr so far (caller frees). */
static char *daemon_log(const struct daemon *d)
{
	FILE *f = fopen(d->log, "r");
	char *buf = calloc(1, 1 << 20);
	size_t n;

	assert_non_null(f);
	assert_non_null(buf);
	n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

static void assert_log_contains(const struct daemon *d, const char *needle)
{
	char *log = daemon_log(d);

	if (!strstr(log, needle))
		fail_msg("kvpoold log lacks '%s':\n%s", needle, log);
	free(log);
}

/* Wait until the log contains needle. */
static void wait_log(const struct daemon *d, const char *needle, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		char *log = daemon_log(d);
		int found = strstr(log, needle) != NULL;

		free(log);
		if (found)
			return;
		if (now_ms() > deadline)
			assert_log_contains(d, needle); /* fails with the log */
		sleep_ms(20);
	}
}

/* SIGTERM and expect a clean exit 0; then remove the log. */
static void daemon_stop(struct daemon *d)
{
	int status;

	assert_int_equal(kill(d->pid, SIGTERM), 0);
	status = daemon_wait_exit(d, HARNESS_STOP_TIMEOUT_MS);
	assert_true(status != -1);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	unlink(d->log);
}

/* ---- systemd notifications ---------------------------------------------- */

/* Receive one notification within timeout_ms into buf; 0 or -ETIMEDOUT. */
static int notify_recv(int fd, char *buf, size_t cap, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t n;

	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	n = recv(fd, buf, cap - 1, 0);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

/* READY=1 comes only when the port already accepts; watchdog pings
 * follow when WATCHDOG_USEC is set; SIGTERM sends STOPPING=1. */
static void test_notify_ready(void **state)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char env_sock[160], msg[512];
	const char *env[] = { env_sock, "WATCHDOG_USEC=200000", NULL };
	struct daemon d;
	int fd, status, pings = 0;
	uint64_t deadline;

	(void)state;
	snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/kvpool-notify-%d", (int)getpid());
	unlink(a.sun_path);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	snprintf(env_sock, sizeof(env_sock), "NOTIFY_SOCKET=%s", a.sun_path);

	daemon_spawn(&d, NULL, env);
	assert_int_equal(notify_recv(fd, msg, sizeof(msg), HARNESS_READY_TIMEOUT_MS), 0);
	/* the first message is READY=1, and by then the port accepts */
	if (!strstr(msg, "READY=1"))
		fail_msg("first notification is not READY=1: '%s'", msg);
	assert_int_equal(try_connect(d.port), 0);
	assert_non_null(strstr(msg, "STATUS=serving"));

	/* 200 ms watchdog: pings every 100 ms */
	deadline = now_ms() + 2000;
	while (pings < 3 && now_ms() < deadline)
		if (notify_recv(fd, msg, sizeof(msg), 500) == 0 && strstr(msg, "WATCHDOG=1"))
			pings++;
	assert_true(pings >= 3);

	assert_int_equal(kill(d.pid, SIGTERM), 0);
	deadline = now_ms() + 5000;
	for (;;) {
		assert_true(now_ms() < deadline);
		if (notify_recv(fd, msg, sizeof(msg), 500) == 0 && strstr(msg, "STOPPING=1"))
			break;
	}
	status = daemon_wait_exit(&d, HARNESS_STOP_TIMEOUT_MS);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	close(fd);
	unlink(a.sun_path);
	unlink(d.log);
}

/* ---- SIGHUP ----------------------------------------------------------------- */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

/* A smaller idle_timeout_ms applies to open connections; a setting that
 * needs a restart is logged and kept; a broken file changes nothing. */
static void test_sighup_reload(void **state)
{
	char conf[64] = "/tmp/kvpool-life-conf-XXXXXX";
	const char *args[] = { "--config", conf, NULL };
	struct daemon d;
	int cfd, fd;

	(void)state;
	cfd = mkstemp(conf);
	assert_true(cfd >= 0);
	close(cfd);
	write_file(conf, "idle_timeout_ms = 60000\nlog_level = info\n");
	daemon_spawn(&d, args, NULL);
	daemon_wait_port(&d);
	assert_int_equal(harness_raw_connect(d.port, &fd), 0);
	/* still open: 60 s idle timeout */
	assert_int_equal(harness_wait_closed(fd, 500), -ETIMEDOUT);

	write_file(conf, "idle_timeout_ms = 300\nlog_level = info\nmax_batch_blocks = 10\n");
	assert_int_equal(kill(d.pid, SIGHUP), 0);
	wait_log(&d, "sighup: idle_timeout_ms changed from '60000' to '300'", 5000);
	assert_log_contains(&d, "sighup: max_batch_blocks changed from '1024' to '10' but needs "
			       "a restart; still '1024'");
	assert_log_contains(&d, "sighup: 1 settings applied");
	/* the open connection is now idle too long */
	assert_int_equal(harness_wait_closed(fd, 3000), 0);
	close(fd);

	/* a bad file: logged with file:line, nothing changes, still serving */
	write_file(conf, "idle_timeout_ms = soon\n");
	assert_int_equal(kill(d.pid, SIGHUP), 0);
	wait_log(&d, "sighup: configuration not reloaded, nothing changed", 5000);
	assert_log_contains(&d, ":1: idle_timeout_ms: not a whole number");
	assert_int_equal(try_connect(d.port), 0);

	daemon_stop(&d);
	unlink(conf);
}

/* ---- SIGTERM drain ------------------------------------------------------ */

/* A PUT whose payload is half sent when SIGTERM comes: the port closes at
 * once, the PUT completes and is answered OK, then the connection closes
 * and kvpoold exits 0. */
static void test_sigterm_drain(void **state)
{
	const char *args[] = { "--drain-timeout-ms", "10000", NULL };
	uint8_t key[32], data[65536];
	struct harness_frame f = { 0 };
	struct proto_result r;
	struct daemon d;
	int fd, status;

	(void)state;
	memset(key, 0x5a, sizeof(key));
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7);
	daemon_spawn(&d, args, NULL);
	daemon_wait_port(&d);
	assert_int_equal(harness_raw_connect(d.port, &fd), 0);
	assert_int_equal(harness_raw_hello(fd, "drain", NULL), 0);
	assert_int_equal(harness_raw_put(fd, 5, key, NULL, data, sizeof(data),
					 harness_xxh3(data, sizeof(data)), sizeof(data) / 2), 0);
	sleep_ms(100); /* the server has read the header and half the payload */
	assert_int_equal(kill(d.pid, SIGTERM), 0);
	wait_log(&d, "no longer accepting", 5000);
	assert_int_equal(try_connect(d.port), -1);
	/* still draining: the connection with a request in flight stays */
	sleep_ms(300);
	assert_true(waitpid(d.pid, &status, WNOHANG) == 0);

	assert_int_equal(harness_send_all(fd, data + sizeof(data) / 2, sizeof(data) / 2), 0);
	assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(f.h.request_id, 5);
	assert_int_equal(harness_reply_result(&f, 0, &r), 0);
	assert_int_equal(r.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	/* answered and idle: closed by the server, which then exits 0 */
	assert_int_equal(harness_wait_closed(fd, 5000), 0);
	close(fd);
	status = daemon_wait_exit(&d, HARNESS_STOP_TIMEOUT_MS);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_log_contains(&d, "drained in");
	unlink(d.log);
}

/* A request that never completes holds the drain for drain_timeout_ms
 * only; the exit is still clean. */
static void test_drain_timeout(void **state)
{
	const char *args[] = { "--drain-timeout-ms", "300", NULL };
	uint8_t key[32], data[4096];
	struct daemon d;
	uint64_t t0;
	int fd, status;

	(void)state;
	memset(key, 0x33, sizeof(key));
	memset(data, 1, sizeof(data));
	daemon_spawn(&d, args, NULL);
	daemon_wait_port(&d);
	assert_int_equal(harness_raw_connect(d.port, &fd), 0);
	assert_int_equal(harness_raw_hello(fd, "stuck", NULL), 0);
	assert_int_equal(harness_raw_put(fd, 1, key, NULL, data, sizeof(data),
					 harness_xxh3(data, sizeof(data)), 100), 0);
	sleep_ms(100);
	t0 = now_ms();
	assert_int_equal(kill(d.pid, SIGTERM), 0);
	status = daemon_wait_exit(&d, 5000);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_true(now_ms() - t0 >= 250);
	assert_log_contains(&d, "drain_timeout_ms (300) passed with 1 connections still busy");
	close(fd);
	unlink(d.log);
}

/* ---- protected mode ------------------------------------------------------- */

static void test_protected_mode(void **state)
{
	const char *refuse[] = { "--listen", "0.0.0.0", NULL };
	const char *allow[] = { "--listen", "0.0.0.0", "--allow-unauthenticated", "true", NULL };
	const char *loop[] = { "--listen", "localhost", NULL };
	struct daemon d;
	int status;

	(void)state;
	daemon_spawn(&d, refuse, NULL);
	status = daemon_wait_exit(&d, 5000);
	assert_true(status != -1 && WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 2);
	assert_log_contains(&d, "protected mode: listen 0.0.0.0 is not a loopback address and no "
			       "tokens_file is set");
	unlink(d.log);

	/* KVPOOL_ALLOW_UNAUTHENTICATED works as well as the flag */
	{
		const char *env[] = { "KVPOOL_ALLOW_UNAUTHENTICATED=yes", NULL };

		daemon_spawn(&d, refuse, env);
		daemon_wait_port(&d);
		assert_log_contains(&d, "listening on 0.0.0.0 without authentication");
		daemon_stop(&d);
	}

	daemon_spawn(&d, allow, NULL);
	daemon_wait_port(&d);
	assert_log_contains(&d, "listening on 0.0.0.0 without authentication");
	daemon_stop(&d);

	/* a loopback name needs nothing and warns of nothing */
	daemon_spawn(&d, loop, NULL);
	daemon_wait_port(&d);
	{
		char *log = daemon_log(&d);

		assert_null(strstr(log, "without authentication"));
		free(log);
	}
	daemon_stop(&d);
}

/* ---- bad settings found before start-up ----------------------------------- */

/* kvpoold with `args` exits 2 at once, its message holding `want`. */
static void expect_bad_setting(const char *const *args, const char *want)
{
	struct daemon d;
	int status;

	daemon_spawn(&d, args, NULL);
	status = daemon_wait_exit(&d, 10000);
	assert_true(status != -1 && WIFEXITED(status));
	if (WEXITSTATUS(status) != 2) {
		char *log = daemon_log(&d);

		fail_msg("%s: exit %d, want 2: %s", args[1], WEXITSTATUS(status), log);
	}
	assert_log_contains(&d, want);
	unlink(d.log);
}

/* What the settings name (an address, files, ports) is checked before
 * the pool opens, so each mistake is a bad setting: exit 2, not 1. */
static void test_bad_settings_exit_2(void **state)
{
	const char *bad_listen[] = { "--listen", "999.1.1.1", NULL };
	const char *bad_listen_open[] = { "--listen", "999.1.1.1", "--allow-unauthenticated",
					  "true", NULL };
	const char *no_tokens[] = { "--tokens-file", "/nonexistent/kvpool-tokens", NULL };
	const char *no_dir[] = { "--nvme-dir", "/nonexistent/kvpool-nvme", "--nvme-capacity",
				 "1GiB", NULL };
	const char *file_dir[] = { "--nvme-dir", "/dev/null", "--nvme-capacity", "1GiB", NULL };
	const char *no_dir_cap[] = { "--nvme-capacity", "1GiB", NULL };
	const char *admin_same[] = { "--port", "7470", "--admin-port", "7470", NULL };

	(void)state;
	/* a bad address, not protected mode, is what is reported */
	expect_bad_setting(bad_listen, "listen: 999.1.1.1 is not an address or a host name");
	expect_bad_setting(bad_listen_open, "listen: 999.1.1.1 is not an address or a host name");
	expect_bad_setting(no_tokens, "tokens_file: /nonexistent/kvpool-tokens: does not exist");
	expect_bad_setting(no_dir, "nvme_dir: /nonexistent/kvpool-nvme: does not exist");
	expect_bad_setting(file_dir, "nvme_dir: /dev/null: is not a directory");
	expect_bad_setting(no_dir_cap, "nvme_capacity (1GiB) needs nvme_dir");
	expect_bad_setting(admin_same, "admin_port (7470) must differ from port");
}

/* ---- kvpool stats settings ------------------------------------------------ */

/* Output of `$KVPOOL_CLI stats settings [--json]` against d (caller frees). */
static char *cli_settings(const struct daemon *d, int json)
{
	const char *cli = getenv("KVPOOL_CLI");
	char cmd[512], *buf = calloc(1, 65536);
	size_t n;
	FILE *p;

	if (!cli)
		harness_skip("KVPOOL_CLI not set");
	assert_non_null(buf);
	snprintf(cmd, sizeof(cmd), "'%s' stats settings %s--server tcp://127.0.0.1:%u", cli,
		 json ? "--json " : "", d->port);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(buf, 1, 65535, p);
	buf[n] = '\0';
	assert_int_equal(pclose(p), 0);
	return buf;
}

/* The effective settings from every source, and after a SIGHUP. */
static void test_stats_settings(void **state)
{
	char conf[64] = "/tmp/kvpool-life-conf-XXXXXX", want[64];
	const char *args[] = { "--config", conf, "--idle-timeout-ms", "1234", NULL };
	const char *env[] = { "KVPOOL_MAX_CONNECTIONS=77", NULL };
	struct daemon d;
	char *out;
	int fd;

	(void)state;
	fd = mkstemp(conf);
	assert_true(fd >= 0);
	close(fd);
	write_file(conf, "payload_timeout_ms = 4321\nidle_timeout_ms = 5\n");
	daemon_spawn(&d, args, env);
	daemon_wait_port(&d);
	out = cli_settings(&d, 0);
	snprintf(want, sizeof(want), "\nport = %u\n", d.port);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "\nidle_timeout_ms = 1234\n"));    /* flag over file */
	assert_non_null(strstr(out, "\nmax_connections = 77\n"));      /* env */
	assert_non_null(strstr(out, "\npayload_timeout_ms = 4321\n")); /* file */
	assert_non_null(strstr(out, "\ndram_capacity = 67108864\n"));
	assert_non_null(strstr(out, "\nallow_unauthenticated = false\n"));
	assert_non_null(strstr(out, "\ntokens_file = \n"));
	assert_true(strncmp(out, "listen = 127.0.0.1\n", 19) == 0);
	free(out);
	out = cli_settings(&d, 1);
	assert_non_null(strstr(out, "\"drain_timeout_ms\":10000"));
	free(out);

	write_file(conf, "payload_timeout_ms = 999\n");
	assert_int_equal(kill(d.pid, SIGHUP), 0);
	wait_log(&d, "sighup: 1 settings applied", 5000);
	out = cli_settings(&d, 0);
	assert_non_null(strstr(out, "\npayload_timeout_ms = 999\n"));
	free(out);
	daemon_stop(&d);
	unlink(conf);
}

/* ---- SIGHUP and the tokens file --------------------------------------------- */

#define TOKEN_OLD "old-token-0123456789abcdef"
#define TOKEN_NEW "new-token-0123456789abcdef"

/* Exit status of `kvpool stats` against d with KVPOOL_TOKEN = token. */
static int cli_stats_with(const struct daemon *d, const char *token)
{
	const char *cli = getenv("KVPOOL_CLI");
	char cmd[512];
	int status;

	if (!cli)
		harness_skip("KVPOOL_CLI not set");
	snprintf(cmd, sizeof(cmd), "KVPOOL_TOKEN=%s '%s' stats --server tcp://127.0.0.1:%u "
		 ">/dev/null 2>&1", token, cli, d->port);
	status = system(cmd);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* SIGHUP reads the tokens file again: the new token works, the old one
 * no longer does. */
static void test_sighup_tokens(void **state)
{
	char tokens[64] = "/tmp/kvpool-life-tok-XXXXXX";
	const char *args[] = { "--tokens-file", tokens, NULL };
	struct daemon d;
	int fd;

	(void)state;
	fd = mkstemp(tokens); /* mode 0600 */
	assert_true(fd >= 0);
	close(fd);
	write_file(tokens, TOKEN_OLD " rw *\n");
	daemon_spawn(&d, args, NULL);
	daemon_wait_port(&d);
	assert_int_equal(cli_stats_with(&d, TOKEN_OLD), 0);
	assert_true(cli_stats_with(&d, TOKEN_NEW) != 0);

	write_file(tokens, TOKEN_NEW " rw *\n");
	assert_int_equal(kill(d.pid, SIGHUP), 0);
	wait_log(&d, "sighup: auth: 1 tokens", 5000);
	assert_int_equal(cli_stats_with(&d, TOKEN_NEW), 0);
	assert_true(cli_stats_with(&d, TOKEN_OLD) != 0);

	/* a broken file keeps the tokens that work */
	write_file(tokens, "short rw *\n");
	assert_int_equal(kill(d.pid, SIGHUP), 0);
	wait_log(&d, "sighup: tokens not reloaded, the old ones stay", 5000);
	assert_int_equal(cli_stats_with(&d, TOKEN_NEW), 0);
	daemon_stop(&d);
	unlink(tokens);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_notify_ready),
		cmocka_unit_test(test_sighup_reload),
		cmocka_unit_test(test_sigterm_drain),
		cmocka_unit_test(test_drain_timeout),
		cmocka_unit_test(test_protected_mode),
		cmocka_unit_test(test_bad_settings_exit_2),
		cmocka_unit_test(test_stats_settings),
		cmocka_unit_test(test_sighup_tokens),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
