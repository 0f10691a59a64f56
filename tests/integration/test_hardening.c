/*
 * test_hardening.c - kvpoold against a hostile client: the namespace cap,
 * the frame deadline, bodies that are announced but not sent, signals
 * that must not kill it, secrets and floods in its log, opcode 0, short
 * probes, and a dram_capacity the host cannot hold.
 *
 * The group's server writes its log (stderr) to a temporary file, which
 * the tests read.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"

#define REPLY_MS 5000
#define PAYLOAD_TIMEOUT_MS 1500
#define FLOOD_CONNS 100
#define NS_MAX 4096 /* kvpoold's namespace cap (STORE_MAX_NAMESPACES) */

static struct {
	struct harness_server srv;    /* the group's server, log in log_path */
	struct harness_server srv_ns; /* test_namespace_cap's own server */
	struct harness_server srv_fd; /* test_nofile_caps_connections' own server */
	struct kvpool_client *c;      /* namespace "hard" */
	char log_path[64];
	int log_fd;
} g = { .log_fd = -1 };

/* Start `s` with its stderr sent to log_fd (our own stderr is put back). */
static int start_logged(struct harness_server *s, const char *const *flags, int log_fd)
{
	int saved = dup(STDERR_FILENO), rc;

	if (saved < 0)
		return -1;
	fflush(stderr);
	dup2(log_fd, STDERR_FILENO);
	rc = harness_group_start(s, flags);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	return rc;
}

static int group_setup(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "64MiB", "--threads", "2", "--log-level", "warn",
		"--payload-timeout-ms", "1500", "--max-frame-bytes", "8MiB",
		"--max-batch-blocks", "65536", NULL,
	};

	(void)state;
	snprintf(g.log_path, sizeof(g.log_path), "/tmp/kvpool-hardening-XXXXXX");
	g.log_fd = mkstemp(g.log_path);
	if (g.log_fd < 0)
		return -1;
	if (start_logged(&g.srv, flags, g.log_fd))
		return -1;
	return harness_group_client(&g.srv, "hard", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	harness_kill(&g.srv_ns);
	harness_kill(&g.srv_fd);
	if (g.log_fd >= 0) {
		close(g.log_fd);
		unlink(g.log_path);
	}
	return 0;
}

/* ---- helpers -------------------------------------------------------------- */

/* The server's log from byte `from` on, NUL-terminated (free()). */
static char *log_read(off_t from)
{
	struct stat st;
	char *buf;
	ssize_t n;

	assert_int_equal(fstat(g.log_fd, &st), 0);
	if (st.st_size < from)
		from = st.st_size;
	buf = calloc(1, (size_t)(st.st_size - from) + 1);
	assert_non_null(buf);
	n = pread(g.log_fd, buf, (size_t)(st.st_size - from), from);
	assert_true(n >= 0);
	buf[n] = '\0';
	return buf;
}

static off_t log_size(void)
{
	struct stat st;

	assert_int_equal(fstat(g.log_fd, &st), 0);
	return st.st_size;
}

/* Occurrences of `what` in s. */
static unsigned count_str(const char *s, const char *what)
{
	unsigned n = 0;

	for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
		n++;
	return n;
}

/* Poll the log (from byte `from`) until it contains `what`, for up to
 * timeout_ms. Returns the log text (free()), or NULL on a timeout. */
static char *log_wait_for(off_t from, const char *what, int timeout_ms)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		char *text = log_read(from);

		if (strstr(text, what))
			return text;
		free(text);
		if (harness_now_ms() >= deadline)
			return NULL;
		harness_sleep_ms(20);
	}
}

/* A field of /proc/<pid>/status, in kB ("VmRSS", "VmData"). */
static uint64_t proc_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t len = strlen(field);
	uint64_t kb = 0;
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, field, len) && line[len] == ':') {
			kb = strtoull(line + len + 1, NULL, 10);
			found = 1;
			break;
		}
	}
	fclose(f);
	assert_true(found);
	return kb;
}

static void assert_ping_works(int fd, uint64_t id)
{
	struct harness_frame f;

	assert_int_equal(harness_send_frame(fd, PROTO_OP_PING, id, NULL, 0, NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.request_id, id);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
}

/* The "namespaces" member of a STATS document: its member count, and
 * whether `name` is one of them. */
static size_t stats_namespaces(struct kvpool_client *c, const char *ns, const char *name,
			       int *has_name)
{
	struct json_object *doc = NULL, *nss = NULL, *one = NULL;
	size_t n;

	assert_int_equal(harness_stats(c, ns, &doc), 0);
	assert_true(json_object_object_get_ex(doc, "namespaces", &nss));
	assert_true(json_object_is_type(nss, json_type_object));
	n = (size_t)json_object_object_length(nss);
	if (has_name)
		*has_name = name && json_object_object_get_ex(nss, name, &one);
	json_object_put(doc);
	return n;
}

/* ---- 5. secrets in the log ---------------------------------------------------- */

/* A malformed HELLO is logged by its header fields, never its body, which
 * carries the token. (First in the group: the log rate limit is fresh.) */
static void test_hello_token_not_logged(void **state)
{
	static const char token[] = "hardening-s3cret-token";
	struct proto_hello h = {
		.min_version = 1, .max_version = 1, .ns = "hard-tok", .ns_len = 8,
		.token = token, .token_len = sizeof(token) - 1,
	};
	uint8_t body[PROTO_HELLO_FIXED_BYTES + 64];
	size_t body_bytes = proto_hello_body_bytes(&h);
	struct harness_frame f;
	off_t from = log_size();
	char *text;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	proto_put_u16(body, 0); /* min_version 0: malformed */
	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_HELLO, 77, body, (uint32_t)body_bytes,
					    NULL, 0),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
	harness_frame_free(&f);
	close(fd);
	text = log_wait_for(from, "request 77", 3000);
	assert_non_null(text);
	assert_non_null(strstr(text, "header only: opcode 1"));
	assert_null(strstr(text, "s3cret"));
	assert_null(strstr(text, "hard-tok"));
	free(text);
}

/* A bad magic is logged as those four bytes only: the rest of the header,
 * where a client framing bug can put a token, never reaches the log. */
static void test_bad_magic_logs_magic_only(void **state)
{
	static const char junk[32] = "S_fh-token=hardening-t0ken-xyz";
	struct harness_frame f;
	off_t from = log_size();
	char *text;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	assert_int_equal(harness_send_all(fd, junk, sizeof(junk)), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
	harness_frame_free(&f);
	assert_int_equal(harness_wait_closed(fd, 3000), 0);
	close(fd);
	text = log_wait_for(from, "bad magic 0x68665f53", 3000);
	assert_non_null(text);
	assert_null(strstr(text, "t0ken"));
	assert_null(strstr(text, "token"));
	assert_null(strstr(text, "header:"));
	free(text);
}

/* ---- 4. signals ------------------------------------------------------------------ */

/* SIGHUP reloads (nothing changed, so nothing applied), SIGUSR1 and
 * SIGUSR2 are ignored: the server keeps serving (and test_clean_shutdown,
 * last, sees it exit 0). */
static void test_signals_do_not_kill(void **state)
{
	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(kill(g.srv.pid, SIGHUP), 0);
	assert_int_equal(kill(g.srv.pid, SIGUSR1), 0);
	assert_int_equal(kill(g.srv.pid, SIGUSR2), 0);
	/* the reload's lines are info, below this server's log level; what
	 * the reload does is tested in test_lifecycle */
	harness_sleep_ms(300);
	assert_int_equal(kill(g.srv.pid, 0), 0);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
	/* Twice, to be sure the handler stays installed. */
	assert_int_equal(kill(g.srv.pid, SIGHUP), 0);
	harness_sleep_ms(100);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
}

/* ---- 7, 8. opcode 0 and short probes ----------------------------------------- */

/* A request with opcode 0 gets a reply with opcode 0, which a client must
 * treat as connection-level: so the server closes as well. */
static void test_opcode_zero_closes(void **state)
{
	struct harness_frame f;
	char msg[256];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	fd = harness_raw_session_or_fail(g.srv.port, "hard", NULL);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_NONE, 5, NULL, 0, NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.opcode, PROTO_OP_NONE);
	assert_int_equal(f.h.status, PROTO_STATUS_UNSUPPORTED);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	assert_non_null(strstr(msg, "opcode 0"));
	harness_frame_free(&f);
	assert_int_equal(harness_wait_closed(fd, 3000), 0);
	close(fd);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
}

/* A probe shorter than a header ("GET / HTTP/1.0") is answered with the
 * bad-magic reply at once, not after payload_timeout_ms, then closed. */
static void test_short_probe_answered(void **state)
{
	static const char probe[] = "GET / HTTP/1.0\r\n\r\n";
	struct harness_frame f;
	uint64_t t0, elapsed;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	assert_int_equal(harness_send_all(fd, probe, sizeof(probe) - 1), 0);
	t0 = harness_now_ms();
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	elapsed = harness_now_ms() - t0;
	assert_int_equal(f.h.opcode, PROTO_OP_NONE);
	assert_int_equal(f.h.request_id, 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
	harness_frame_free(&f);
	assert_true(elapsed < PAYLOAD_TIMEOUT_MS);
	assert_int_equal(harness_wait_closed(fd, 3000), 0);
	close(fd);
}

/* ---- 2. the frame deadline --------------------------------------------------- */

/* A PUT whose payload trickles in (a byte every 100 ms, never silent for
 * long) is cut off payload_timeout_ms after its header, and its
 * reservation goes back to the in-flight budget. */
static void test_trickled_payload_cut_off(void **state)
{
	enum { LEN = 1 << 20 };
	uint8_t key[32], *data = malloc(LEN);
	uint64_t t0, elapsed;
	int fd, closed = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	harness_fill(data, LEN, 5);
	harness_key(key, "hard-trickle", 0);
	fd = harness_raw_session_or_fail(g.srv.port, "hard", NULL);
	assert_int_equal(harness_raw_put(fd, 3, key, NULL, data, LEN, harness_xxh3(data, LEN), 0),
			 0);
	t0 = harness_now_ms();
	assert_true(harness_wait_stat_at_least_or_fail(g.c, "tiers.dram.inflight_put_bytes", LEN,
						       1000) >= LEN);
	for (size_t i = 0; !closed && harness_now_ms() - t0 < 4 * PAYLOAD_TIMEOUT_MS; i++) {
		if (harness_send_all(fd, data + i, 1) < 0)
			break; /* already gone */
		closed = harness_wait_closed(fd, 100) == 0;
	}
	elapsed = harness_now_ms() - t0;
	close(fd);
	free(data);
	assert_true(elapsed >= PAYLOAD_TIMEOUT_MS - 200);
	assert_true(elapsed < 3 * PAYLOAD_TIMEOUT_MS);
	assert_int_equal(harness_wait_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes", 0, 3000),
			 0);
	harness_check_absent_or_fail(g.c, key);
}

/* ---- 3. bodies announced but not sent -------------------------------------------- */

/* Open FLOOD_CONNS sessions; each announces an EXISTS body of body_bytes
 * and sends `sent` bytes of it. fds receives them. */
static void flood_bodies(int *fds, uint32_t body_bytes, size_t sent)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_EXISTS,
		.body_bytes = body_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];
	uint8_t *part = calloc(1, sent);

	assert_non_null(part);
	for (int i = 0; i < FLOOD_CONNS; i++) {
		fds[i] = harness_raw_session_or_fail(g.srv.port, "hard", NULL);
		h.request_id = 1000 + (uint64_t)i;
		proto_header_encode(&h, hdr);
		assert_int_equal(harness_send_all(fds[i], hdr, sizeof(hdr)), 0);
		assert_int_equal(harness_send_all(fds[i], part, sent), 0);
	}
	free(part);
	harness_sleep_ms(300); /* let the server take what was sent */
}

/* 100 connections announcing a 4 MiB EXISTS body (more than an EXISTS of
 * max_batch_blocks keys can need) and sending 1 MiB of it: each is refused
 * at its header, and the server does not buffer the bytes. */
static void test_oversized_body_not_buffered(void **state)
{
	static int fds[FLOOD_CONNS];
	const uint32_t body_bytes = 4u << 20;
	uint64_t rss0, rss1;
	char msg[1100];

	(void)state;
	harness_need_server(&g.srv);
	rss0 = proc_kb(g.srv.pid, "VmRSS");
	flood_bodies(fds, body_bytes, 1u << 20);
	rss1 = proc_kb(g.srv.pid, "VmRSS");
	print_message("VmRSS %" PRIu64 " kB -> %" PRIu64 " kB\n", rss0, rss1);
	assert_true(rss1 < rss0 + 20 * 1024);
	for (int i = 0; i < FLOOD_CONNS; i++) {
		struct harness_frame f;

		assert_int_equal(harness_read_frame(fds[i], REPLY_MS, &f), 0);
		assert_int_equal(f.h.request_id, 1000 + (uint64_t)i);
		assert_int_equal(f.h.status, PROTO_STATUS_TOO_LARGE);
		assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
		assert_non_null(strstr(msg, "max_batch_blocks"));
		harness_frame_free(&f);
		close(fds[i]);
	}
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
}

/* 100 connections announcing the largest legitimate EXISTS body (8 + 32 *
 * 65536 bytes) and sending 64 KiB of it: the server's buffers grow with
 * the bytes that arrived, not with what was announced. */
static void test_body_buffer_grows_as_it_arrives(void **state)
{
	static int fds[FLOOD_CONNS];
	const uint32_t body_bytes = PROTO_BATCH_PREFIX_BYTES + PROTO_KEY_ENTRY_BYTES * 65536;
	uint64_t data0, data1;

	(void)state;
	harness_need_server(&g.srv);
	data0 = proc_kb(g.srv.pid, "VmData");
	flood_bodies(fds, body_bytes, 64u << 10);
	data1 = proc_kb(g.srv.pid, "VmData");
	print_message("VmData %" PRIu64 " kB -> %" PRIu64 " kB\n", data0, data1);
	/* Announced: 200 MiB. Received: 6.4 MiB. */
	assert_true(data1 < data0 + 64 * 1024);
	for (int i = 0; i < FLOOD_CONNS; i++)
		close(fds[i]);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
}

/* ---- 6. log flood ------------------------------------------------------------------- */

/* 2000 bad requests on one connection: at most 20 lines a second about
 * them, then one line counting the rest. */
static void test_protocol_errors_rate_limited(void **state)
{
	enum { ROUNDS = 40, PER_ROUND = 50 };
	static const char marker[] = "reserved header field nonzero";
	uint8_t hdr[PROTO_HEADER_BYTES * PER_ROUND];
	uint64_t t0, elapsed_s;
	off_t from;
	unsigned lines;
	char *text;
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	harness_sleep_ms(1100); /* a fresh rate-limit window */
	from = log_size();
	fd = harness_raw_session_or_fail(g.srv.port, "hard", NULL);
	for (int i = 0; i < PER_ROUND; i++) {
		struct proto_header h = {
			.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PING,
			.request_id = (uint64_t)i,
		};

		proto_header_encode(&h, hdr + i * PROTO_HEADER_BYTES);
		proto_put_u16(hdr + i * PROTO_HEADER_BYTES + 10, 1); /* reserved */
	}
	t0 = harness_now_ms();
	for (int r = 0; r < ROUNDS; r++) {
		assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
		for (int i = 0; i < PER_ROUND; i++) {
			struct harness_frame f;

			assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
			assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
			harness_frame_free(&f);
		}
	}
	elapsed_s = (harness_now_ms() - t0) / 1000;
	assert_ping_works(fd, 999);
	close(fd);
	/* The suppressed count comes once the second is over. */
	text = log_wait_for(from, "protocol error messages suppressed", 3000);
	assert_non_null(text);
	lines = count_str(text, marker);
	print_message("%u lines for %d bad requests in ~%" PRIu64 " s\n", lines,
		      ROUNDS * PER_ROUND, elapsed_s);
	assert_true(lines >= 1);
	assert_true(lines <= 20 * (elapsed_s + 2));
	free(text);
}

/* ---- 1. namespaces ------------------------------------------------------------------- */

/* STATS and DROP_NAMESPACE of a name nobody said HELLO to create nothing. */
static void test_stats_and_drop_create_nothing(void **state)
{
	uint64_t blocks = 99;
	size_t n0, n1;
	int has;

	(void)state;
	harness_need_server(&g.srv);
	n0 = stats_namespaces(g.c, NULL, NULL, NULL);
	assert_int_equal(stats_namespaces(g.c, "hard-ghost-stats", NULL, NULL), 0);
	assert_int_equal(kvpool_drop_namespace(g.c, "hard-ghost-drop", &blocks), 0);
	assert_int_equal(blocks, 0);
	n1 = stats_namespaces(g.c, NULL, "hard-ghost-stats", &has);
	assert_false(has);
	stats_namespaces(g.c, NULL, "hard-ghost-drop", &has);
	assert_false(has);
	assert_int_equal(n1, n0);
	/* nor do the CLI's stats --namespace, ping, health and drop-namespace,
	 * which say HELLO to the namespace they name (issue 20) */
	{
		const char *cli = getenv("KVPOOL_CLI");
		char *const cmds[][8] = {
			{ (char *)cli, "stats", "--namespace", "hard-ghost-cli", "--server", g.srv.url, NULL },
			{ (char *)cli, "ping", "--namespace", "hard-ghost-ping", "--server", g.srv.url, NULL },
			{ (char *)cli, "health", "--namespace", "hard-ghost-health", "--server", g.srv.url,
			  NULL },
			{ (char *)cli, "drop-namespace", "--namespace", "hard-ghost-dropper", "--server",
			  g.srv.url, "hard-ghost-cli", NULL },
		};
		static const char *const names[] = { "hard-ghost-cli", "hard-ghost-ping",
						      "hard-ghost-health", "hard-ghost-dropper" };

		if (!cli || access(cli, X_OK) != 0)
			return;
		for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
			char *out = NULL;
			int status = -1;

			assert_int_equal(harness_run(cmds[i], 20000, &out, &status), 0);
			if (status != 0)
				fail_msg("%s exited %d: %s", cmds[i][1], status, out ? out : "");
			free(out);
		}
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			stats_namespaces(g.c, NULL, names[i], &has);
			if (has)
				fail_msg("namespace %s was created", names[i]);
		}
		assert_int_equal(stats_namespaces(g.c, NULL, NULL, NULL), n0);
	}
}

/* Raise our RLIMIT_NOFILE to its hard limit (kvpoold, started later,
 * inherits it) and return how many raw sessions the test may hold open,
 * at most NS_MAX, keeping 128 descriptors spare. */
static size_t sessions_we_may_hold(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || getrlimit(RLIMIT_NOFILE, &rl) < 0)
			return 0;
	}
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= NS_MAX + 128)
		return NS_MAX;
	return rl.rlim_cur > 128 ? (size_t)rl.rlim_cur - 128 : 0;
}

/* PUT one 64-byte first block (key {7}) on a bound session; returns the
 * request's status, or the block's when the request was taken. */
static uint16_t raw_put_one(int fd, uint64_t id, char *msg, size_t cap)
{
	uint8_t key[32] = { 7 }, data[64];
	struct harness_frame f;
	struct proto_result r;
	uint16_t status;

	memset(data, 0x5a, sizeof(data));
	assert_int_equal(harness_raw_put(fd, id, key, NULL, data, sizeof(data),
					 harness_xxh3(data, sizeof(data)), sizeof(data)),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	status = f.h.status;
	if (status == PROTO_STATUS_OK) {
		assert_int_equal(harness_reply_result(&f, 0, &r), 0);
		status = r.status;
	} else if (msg) {
		assert_int_equal(harness_error_message(&f, msg, cap, NULL, NULL), 0);
	}
	harness_frame_free(&f);
	return status;
}

/* DELETE key {7} on a bound session. */
static void raw_delete_one(int fd, uint64_t id)
{
	uint8_t key[32] = { 7 }, body[PROTO_BATCH_PREFIX_BYTES + PROTO_KEY_ENTRY_BYTES];
	struct harness_frame f;

	proto_batch_encode_prefix(body, 1, 0);
	proto_key_entry_encode(body, 0, key);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_DELETE, id, body, sizeof(body), NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
}

/* Say HELLO to `ns`, store one block in it and close: a namespace that is
 * unused but not empty. */
static void put_one_block(uint16_t port, const char *ns)
{
	int fd = harness_raw_session_or_fail(port, ns, NULL);

	assert_int_equal(raw_put_one(fd, 2, NULL, 0), PROTO_STATUS_OK);
	close(fd);
}

/* Create namespace ns (HELLO does not: its first PUT does) and leave it
 * empty; returns the session, still bound to it. */
static int empty_ns_session(uint16_t port, const char *ns)
{
	int fd = harness_raw_session_or_fail(port, ns, NULL);

	assert_int_equal(raw_put_one(fd, 2, NULL, 0), PROTO_STATUS_OK);
	raw_delete_one(fd, 3);
	return fd;
}

/* Connect `ns` and PUT one block through the client library, retrying for
 * up to 5 s while the server still processes the closes that free a
 * slot. Returns the PUT's result. */
static int put_when_slot_frees(const struct harness_server *srv, const char *ns)
{
	uint8_t key[32] = { 9 }, data[16] = { 1 };
	struct kvpool_client *c = NULL;
	int rc = -EDQUOT;

	assert_int_equal(harness_client(srv, ns, &c), 0);
	for (int i = 0; i < 100 && rc == -EDQUOT; i++) {
		rc = kvpool_put_bytes(c, key, NULL, data, sizeof(data));
		if (rc == -EDQUOT)
			usleep(50 * 1000);
	}
	kvpool_close(c);
	return rc;
}

/* NS_MAX namespaces fit. HELLO creates none (a first PUT does), so
 * health checks, STATS and DROP work whatever the table holds. Unused
 * empty namespaces are forgotten when a new name arrives at the cap, so
 * closed sessions never lock "default" out; while every namespace is
 * bound to an open session or holds a block, a PUT to a new name gets
 * QUOTA until one of them is closed. */
static void test_namespace_cap(void **state)
{
	/* A STATS document of 4096 namespaces needs more than the default
	 * 1 MiB max_frame_bytes, which binds requests only. */
	static const char *const flags[] = {
		"--dram-capacity", "64MiB", "--threads", "2", "--log-level", "error",
		"--max-connections", "8192", NULL,
	};
	struct harness_server *srv = &g.srv_ns;
	struct kvpool_client *c = NULL, *extra = NULL;
	size_t have, held_max, nheld = 0;
	uint64_t blocks = 99, rtt = 0;
	char ns[32], msg[256];
	int fd, has, *held;

	(void)state;
	harness_need_server(&g.srv);
	held_max = sessions_we_may_hold();
	assert_int_equal(harness_start(srv, flags), 0);
	assert_int_equal(harness_client(srv, "cap-0", &c), 0);
	/* HELLO alone created nothing */
	assert_int_equal(stats_namespaces(c, NULL, "cap-0", &has), 0);
	assert_false(has);
	close(empty_ns_session(srv->port, "cap-0"));
	/* fill up with unused empty namespaces */
	have = stats_namespaces(c, NULL, NULL, NULL);
	assert_int_equal(have, 1);
	for (size_t i = 1; have < NS_MAX; i++, have++) {
		snprintf(ns, sizeof(ns), "cap-%zu", i);
		close(empty_ns_session(srv->port, ns));
	}
	assert_int_equal(stats_namespaces(c, NULL, NULL, NULL), NS_MAX);
	/* The cap is reached, but those are unused and empty: a slot frees. */
	assert_int_equal(put_when_slot_frees(srv, "default"), 0);
	assert_int_equal(stats_namespaces(c, NULL, "default", &has), NS_MAX);
	assert_true(has);
	{
		uint8_t key[32] = { 9 };
		int st = 0;

		assert_int_equal(harness_client(srv, "default", &extra), 0);
		assert_int_equal(kvpool_delete(extra, key, 1, &st), 0);
		kvpool_close(extra);
	}

	/* Now make every namespace busy: NS_MAX new names, bound to open
	 * sessions as far as descriptors allow, the rest holding a block.
	 * Each takes the slot of an unused empty one. */
	held = calloc(NS_MAX, sizeof(*held));
	assert_non_null(held);
	for (size_t i = 0; i < NS_MAX; i++) {
		snprintf(ns, sizeof(ns), "busy-%zu", i);
		if (nheld < held_max)
			held[nheld++] = empty_ns_session(srv->port, ns);
		else
			put_one_block(srv->port, ns);
	}
	assert_int_equal(stats_namespaces(c, NULL, "default", &has), NS_MAX);
	assert_false(has);

	/* HELLO to a new name works; its first PUT gets QUOTA, naming the cap */
	fd = harness_raw_session_or_fail(srv->port, "cap-one-too-many", NULL);
	assert_int_equal(raw_put_one(fd, 2, msg, sizeof(msg)), PROTO_STATUS_QUOTA);
	assert_string_equal(msg, "namespace cap-one-too-many not created: the server holds its "
				 "maximum of 4096 namespaces");
	/* Still open: PING works */
	assert_ping_works(fd, 3);
	close(fd);
	/* health checks, STATS and DROP need no new namespace */
	assert_int_equal(harness_client(srv, "default", &extra), 0);
	assert_int_equal(kvpool_ping(extra, &rtt), 0);
	assert_int_equal(stats_namespaces(extra, "default", NULL, NULL), 0);
	assert_int_equal(stats_namespaces(extra, NULL, NULL, NULL), NS_MAX);
	{
		uint8_t key[32] = { 9 }, data[16] = { 1 };

		assert_int_equal(kvpool_put_bytes(extra, key, NULL, data, sizeof(data)), -EDQUOT);
	}
	assert_int_equal(kvpool_drop_namespace(extra, "busy-7", &blocks), 0);
	assert_int_equal(stats_namespaces(extra, NULL, NULL, NULL), NS_MAX);
	kvpool_close(extra);

	/* Closing the open sessions frees their (empty) namespaces: the
	 * oldest goes to "default"; namespaces holding blocks stay. */
	for (size_t i = 0; i < nheld; i++)
		close(held[i]);
	free(held);
	if (nheld > 0) {
		assert_int_equal(put_when_slot_frees(srv, "default"), 0);
		assert_int_equal(stats_namespaces(c, NULL, "busy-0", &has), NS_MAX);
		assert_false(has);
	}
	if (nheld < NS_MAX) {
		snprintf(ns, sizeof(ns), "busy-%d", NS_MAX - 1);
		assert_int_equal(stats_namespaces(c, ns, ns, &has), 1);
		assert_true(has);
	}

	/* Looking up or dropping an unknown name neither fails nor creates. */
	assert_int_equal(stats_namespaces(c, "cap-ghost", NULL, NULL), 0);
	assert_int_equal(kvpool_drop_namespace(c, "cap-ghost", &blocks), 0);
	assert_int_equal(blocks, 0);
	assert_int_equal(stats_namespaces(c, NULL, "cap-ghost", &has), NS_MAX);
	assert_false(has);
	assert_int_equal(stats_namespaces(c, "busy-9", "busy-9", &has), 1);
	assert_true(has);
	kvpool_close(c);
	assert_int_equal(harness_stop(srv), 0);
}

/* ---- 10. max_connections against RLIMIT_NOFILE ------------------------------------ */

#define NOFILE 80       /* hard and soft limit the server gets */
#define NOFILE_CONNS 16 /* NOFILE - the 64 descriptors it keeps aside */

/* Start g.srv_fd under "ulimit -n NOFILE" (soft and hard), through a
 * shell wrapper standing in for $KVPOOLD. */
static int start_nofile_limited(const char *const *flags)
{
	const char *kvpoold = getenv("KVPOOLD");
	char wrapper[] = "/tmp/kvpool-nofile-XXXXXX", *real;
	int fd, rc = -1;
	FILE *fp;

	if (!kvpoold)
		return -1;
	real = strdup(kvpoold);
	fd = mkstemp(wrapper);
	if (!real || fd < 0)
		goto out_free;
	fp = fdopen(fd, "w");
	if (!fp) {
		close(fd);
		goto out_unlink;
	}
	fprintf(fp, "#!/bin/sh\nulimit -n %d || exit 3\nexec \"$KVPOOLD_REAL\" \"$@\"\n", NOFILE);
	fclose(fp);
	chmod(wrapper, 0700);
	setenv("KVPOOLD_REAL", real, 1);
	setenv("KVPOOLD", wrapper, 1);
	rc = start_logged(&g.srv_fd, flags, g.log_fd);
	setenv("KVPOOLD", real, 1);
out_unlink:
	unlink(wrapper);
out_free:
	free(real);
	return rc;
}

/* With too few descriptors for max_connections even after raising the
 * soft limit, kvpoold warns once, naming both numbers, and answers BUSY
 * beyond what fits (NOFILE - 64 connections). */
static void test_nofile_caps_connections(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "warn", "--max-connections", "100", NULL,
	};
	int fds[NOFILE_CONNS], extra = -1;
	struct harness_frame f;
	char msg[256], *text;
	off_t from;

	(void)state;
	harness_need_server(&g.srv);
	from = log_size();
	assert_int_equal(start_nofile_limited(flags), 0);
	text = log_read(from);
	assert_non_null(strstr(text, "max_connections 100 needs 164 file descriptors but "
				     "RLIMIT_NOFILE is 80; serving at most 16 connections"));
	free(text);
	usleep(200 * 1000); /* the readiness probe's connection is gone */
	for (int i = 0; i < NOFILE_CONNS; i++)
		fds[i] = harness_raw_session_or_fail(g.srv_fd.port, "nofile", NULL);
	assert_int_equal(harness_raw_connect(g.srv_fd.port, &extra), 0);
	assert_int_equal(harness_read_frame(extra, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BUSY);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	assert_non_null(strstr(msg, "16"));
	harness_frame_free(&f);
	close(extra);
	for (int i = 0; i < NOFILE_CONNS; i++)
		close(fds[i]);
	assert_int_equal(harness_stop(&g.srv_fd), 0);
}

/* A free loopback TCP port (bound and released). */
static uint16_t free_tcp_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

/* The status of GET /healthz on the admin port, or -1. */
static int healthz_status(uint16_t port)
{
	static const char req[] = "GET /healthz HTTP/1.0\r\n\r\n";
	char buf[256] = "";
	int fd = -1, status = -1;
	ssize_t n;

	if (harness_raw_connect(port, &fd) < 0)
		return -1;
	if (harness_send_all(fd, req, sizeof(req) - 1) == 0) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, REPLY_MS) == 1 && (n = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
			buf[n] = '\0';
			if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
				status = -1;
		}
	}
	close(fd);
	return status;
}

/* Issue 20 item 6: 150 half-sent admin requests under "ulimit -n 80".
 * kvpoold holds at most 16 admin connections (out of the descriptors it
 * keeps aside, so the data port keeps its own), pauses accepting when it
 * runs out of descriptors (rather than spin), logs that at most once a
 * second (libevent's own lines go through our rate-limited log), keeps
 * serving the data port, and answers /healthz again once they are gone. */
static void test_admin_port_under_nofile(void **state)
{
	static char admin[16];
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "info", "--max-connections", "8", "--admin-port", admin, NULL,
	};
	uint16_t port = free_tcp_port();
	int fds[150], n = 0, fd;
	off_t from;
	char *text;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(admin, sizeof(admin), "%u", port);
	assert_int_equal(start_nofile_limited(flags), 0);
	from = log_size();
	for (int i = 0; i < 150; i++) {
		static const char half[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

		fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
			close(fd);
			continue;
		}
		fds[n++] = fd;
		usleep(2000);
		(void)!send(fd, half, sizeof(half) - 1, MSG_NOSIGNAL);
	}
	sleep(2);
	/* the data port still answers */
	fd = harness_raw_session_or_fail(g.srv_fd.port, "nofile-admin", NULL);
	assert_ping_works(fd, 5);
	close(fd);
	text = log_read(from);
	if (strlen(text) > 8192)
		fail_msg("%zu bytes of log in 2 s: %.300s", strlen(text), text);
	free(text);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	{
		int st = -1;

		for (int i = 0; i < 50 && st != 200; i++) {
			usleep(100 * 1000);
			st = healthz_status(port);
		}
		assert_int_equal(st, 200);
	}
	assert_int_equal(harness_stop(&g.srv_fd), 0);
}

/* ---- 9. dram_capacity over physical memory --------------------------------------------- */

/* kvpoold refuses, at start and with exit status 2, an arena larger than
 * the host's memory, naming dram_capacity and the memory it found. */
static void test_dram_over_physical_memory(void **state)
{
	long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
	const char *kvpoold = getenv("KVPOOLD");
	char size[32], phys_text[32], *out = NULL, *text;
	uint64_t phys;
	off_t from;
	int status = -1, saved, rc;

	(void)state;
	harness_need_server(&g.srv);
	assert_true(pages > 0 && page_bytes > 0);
	phys = (uint64_t)pages * (uint64_t)page_bytes;
	if (phys + (1ull << 30) > (4ull << 40))
		harness_skip("this host has more memory than dram_capacity may ask for");
	snprintf(size, sizeof(size), "%" PRIu64, phys + ((uint64_t)1 << 30));
	snprintf(phys_text, sizeof(phys_text), "%" PRIu64, phys);
	{
		char *const argv[] = {
			(char *)kvpoold, "--listen", "127.0.0.1", "--port", "1",
			"--dram-capacity", size, NULL,
		};

		/* Its stderr goes to our log file, to be read below. */
		from = log_size();
		saved = dup(STDERR_FILENO);
		assert_true(saved >= 0);
		fflush(stderr);
		dup2(g.log_fd, STDERR_FILENO);
		rc = harness_run(argv, 10000, &out, &status);
		fflush(stderr);
		dup2(saved, STDERR_FILENO);
		close(saved);
	}
	free(out);
	assert_int_equal(rc, 0);
	assert_int_equal(status, 2);
	text = log_read(from);
	assert_non_null(strstr(text, "dram_capacity"));
	assert_non_null(strstr(text, "physical memory"));
	assert_non_null(strstr(text, phys_text));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_token_not_logged),
		cmocka_unit_test(test_bad_magic_logs_magic_only),
		cmocka_unit_test(test_signals_do_not_kill),
		cmocka_unit_test(test_opcode_zero_closes),
		cmocka_unit_test(test_short_probe_answered),
		cmocka_unit_test(test_trickled_payload_cut_off),
		cmocka_unit_test(test_oversized_body_not_buffered),
		cmocka_unit_test(test_body_buffer_grows_as_it_arrives),
		cmocka_unit_test(test_protocol_errors_rate_limited),
		cmocka_unit_test(test_stats_and_drop_create_nothing),
		cmocka_unit_test(test_namespace_cap),
		cmocka_unit_test(test_dram_over_physical_memory),
		cmocka_unit_test(test_nofile_caps_connections),
		cmocka_unit_test(test_admin_port_under_nofile),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};
	struct CMUnitTest run[sizeof(tests) / sizeof(tests[0])];
	size_t n = 0;

	/* The descriptor-limit case starts kvpoold through a shell wrapper
	 * that lowers RLIMIT_NOFILE; under valgrind the wrapper itself would be
	 * the valgrind guest and valgrind needs descriptors of its own, so that
	 * case runs in the plain and sanitizer builds only. */
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (harness_valgrind() && (tests[i].test_func == test_nofile_caps_connections ||
					   tests[i].test_func == test_admin_port_under_nofile)) {
			print_message("under valgrind: test_nofile_caps_connections left out\n");
			continue;
		}
		run[n++] = tests[i];
	}
	return _cmocka_run_group_tests("test_hardening", run, n, group_setup, group_teardown);
}
