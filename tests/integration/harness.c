/*
 * harness.c - shared helpers of the integration tests (see harness.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"

extern char **environ;

#define HARNESS_VALGRIND_FACTOR 3

/* ---- small utilities ------------------------------------------------------- */

uint64_t harness_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void harness_sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

/* splitmix64: a tiny, well-mixed generator for keys and payloads. */
static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void harness_key(uint8_t key[32], const char *tag, uint64_t n)
{
	uint64_t state = 0xCBF29CE484222325ull;

	/* FNV-1a of the tag, then mixed with n: distinct tags, distinct keys. */
	for (const char *p = tag; *p; p++)
		state = (state ^ (uint8_t)*p) * 0x100000001B3ull;
	state ^= n * 0x9E3779B97F4A7C15ull;
	for (int i = 0; i < 4; i++)
		proto_put_u64(key + 8 * i, splitmix64(&state));
}

void harness_fill(void *buf, size_t len, uint64_t seed)
{
	uint8_t *p = buf;
	uint64_t state = seed;
	size_t i = 0;

	for (; i + 8 <= len; i += 8)
		proto_put_u64(p + i, splitmix64(&state));
	if (i < len) {
		uint8_t tail[8];

		proto_put_u64(tail, splitmix64(&state));
		memcpy(p + i, tail, len - i);
	}
}

uint64_t harness_key_seed(const uint8_t key[32])
{
	return proto_get_u64(key) ^ proto_get_u64(key + 8) ^ proto_get_u64(key + 16) ^
	       proto_get_u64(key + 24);
}

uint64_t harness_xxh3(const void *buf, size_t len)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };

	return kvpool_checksum(&iov, 1);
}

void harness_skip(const char *why)
{
	const char *ci = getenv("CI");

	if (ci && strcmp(ci, "true") == 0)
		fail_msg("cannot run under CI=true: %s", why);
	print_message("skipped: %s\n", why);
	skip();
	abort(); /* skip() does not return */
}

/* ---- server lifecycle ------------------------------------------------------- */

int harness_valgrind(void)
{
	const char *v = getenv("KVPOOL_VALGRIND");

	return v && strcmp(v, "1") == 0;
}

/* Timeouts grow under valgrind, which runs the daemon many times slower. */
static int scaled_ms(int ms)
{
	return harness_valgrind() ? ms * HARNESS_VALGRIND_FACTOR : ms;
}

/* Ask the kernel for a free loopback port: bind port 0, read it, close. */
static int pick_free_port(uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd, err = 0;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		err = -errno;
	else
		*port = ntohs(sa.sin_port);
	close(fd);
	return err;
}

/* Build argv: [valgrind flags] kvpoold --listen 127.0.0.1 --port P
 * --admin-port 0 extra... */
static int build_argv(const struct harness_server *s, const char *kvpoold, char *port_text,
		      const char **argv, size_t cap)
{
	size_t n = 0;

	if (harness_valgrind()) {
		argv[n++] = "valgrind";
		argv[n++] = "--quiet";
		argv[n++] = "--leak-check=full";
		argv[n++] = "--error-exitcode=99";
		argv[n++] = "--num-callers=40"; /* deep enough to reach our frames */
		/* tests/valgrind.supp: the one leak kvpoold makes on purpose
		 * (a failed RocksDB index it must not close); tests/run.sh
		 * names it in KVPOOL_VALGRIND_SUPP */
		if (getenv("KVPOOL_VALGRIND_SUPP")) {
			static char supp[4200];

			snprintf(supp, sizeof(supp), "--suppressions=%s",
				 getenv("KVPOOL_VALGRIND_SUPP"));
			argv[n++] = supp;
		}
	}
	argv[n++] = kvpoold;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1";
	argv[n++] = "--port";
	argv[n++] = port_text;
	/* No admin HTTP unless a test asks (a later --admin-port wins): the
	 * default port 7471 would be shared by every server of every test. */
	argv[n++] = "--admin-port";
	argv[n++] = "0";
	for (size_t i = 0; s->extra[i]; i++) {
		if (n + 1 >= cap)
			return -E2BIG;
		argv[n++] = s->extra[i];
	}
	argv[n] = NULL;
	return 0;
}

/* fork + exec the daemon; the child dies with us (PR_SET_PDEATHSIG). */
static int spawn_server(const char *const *argv, pid_t *pid_out)
{
	pid_t parent = getpid();
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "harness: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	*pid_out = pid;
	return 0;
}

/* Reap the child if it has exited. Returns 1 when it is gone. */
static int child_exited(pid_t pid, int *wstatus)
{
	pid_t r = waitpid(pid, wstatus, WNOHANG);

	return r == pid || (r < 0 && errno == ECHILD);
}

static int wstatus_code(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 255;
}

/* One readiness probe: connect, HELLO, PING. A HELLO refused for want of
 * a token (a server with a tokens file) is an answer too. */
static int probe_ready(const char *url)
{
	struct kvpool_options opts = { .timeout_ms = 1000 };
	struct kvpool_client *c;
	int err;

	err = kvpool_connect(url, "harness-ready", &opts, &c);
	if (err == -EACCES)
		return 0;
	if (err)
		return err;
	err = kvpool_ping(c, NULL);
	kvpool_close(c);
	return err;
}

/* Wait until the server answers or exits. 0: ready; -ECHILD: it exited
 * (status in *code); -ETIMEDOUT. */
static int wait_ready(struct harness_server *s, int *code)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)scaled_ms(HARNESS_READY_TIMEOUT_MS);
	int wstatus;

	for (;;) {
		if (probe_ready(s->url) == 0)
			return 0;
		if (child_exited(s->pid, &wstatus)) {
			*code = wstatus_code(wstatus);
			s->pid = 0;
			return -ECHILD;
		}
		if (harness_now_ms() > deadline)
			return -ETIMEDOUT;
		harness_sleep_ms(50);
	}
}

/* Start once on `port`. */
static int start_once(struct harness_server *s, uint16_t port, int *code)
{
	const char *argv[HARNESS_MAX_ARGS + 16];
	const char *kvpoold = getenv("KVPOOLD");
	char port_text[16];
	int err;

	if (!kvpoold || access(kvpoold, X_OK) != 0)
		return -ENOENT;
	snprintf(port_text, sizeof(port_text), "%u", port);
	err = build_argv(s, kvpoold, port_text, argv, sizeof(argv) / sizeof(argv[0]));
	if (err)
		return err;
	s->port = port;
	snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%u", port);
	err = spawn_server(argv, &s->pid);
	if (err)
		return err;
	err = wait_ready(s, code);
	if (err == -ETIMEDOUT)
		harness_kill(s);
	return err;
}

static int copy_extra(struct harness_server *s, const char *const *extra)
{
	size_t n = 0;

	for (; extra && extra[n]; n++) {
		if (n + 1 >= HARNESS_MAX_ARGS)
			return -E2BIG;
		s->extra[n] = extra[n];
	}
	s->extra[n] = NULL;
	return 0;
}

int harness_start(struct harness_server *s, const char *const *extra)
{
	int err, code = 0;

	err = copy_extra(s, extra);
	if (err)
		return err;
	for (int attempt = 0; attempt < 3; attempt++) {
		uint16_t port = 0;

		err = pick_free_port(&port);
		if (err)
			return err;
		err = start_once(s, port, &code);
		if (err != -ECHILD)
			return err;
		fprintf(stderr, "harness: kvpoold exited with %d at start on port %u\n", code,
			port);
	}
	return -ECHILD;
}

int harness_start_on_port(struct harness_server *s, uint16_t port, const char *const *extra)
{
	uint64_t deadline = harness_now_ms() + 10000;
	int err, code = 0;

	err = copy_extra(s, extra);
	if (err)
		return err;
	for (;;) {
		err = start_once(s, port, &code);
		if (err != -ECHILD)
			return err;
		fprintf(stderr, "harness: kvpoold exited with %d at start on port %u\n", code,
			port);
		if (harness_now_ms() > deadline)
			return -ECHILD;
		harness_sleep_ms(200);
	}
}

/* Read fd until EOF or the deadline into a growing NUL-terminated buffer. */
static int collect_output(int fd, uint64_t deadline, char **out);

int harness_start_fail(const char *const *extra, int timeout_ms, int *status, char **err_text)
{
	const char *argv[HARNESS_MAX_ARGS + 16];
	const char *kvpoold = getenv("KVPOOLD");
	struct harness_server s = { 0 };
	uint64_t deadline;
	char port_text[16], *text = NULL;
	int pipefd[2], wstatus, err, answered = 0;
	uint16_t port = 0;
	pid_t pid;

	if (!kvpoold || access(kvpoold, X_OK) != 0)
		return -ENOENT;
	err = copy_extra(&s, extra);
	if (!err)
		err = pick_free_port(&port);
	if (err)
		return err;
	snprintf(port_text, sizeof(port_text), "%u", port);
	snprintf(s.url, sizeof(s.url), "tcp://127.0.0.1:%u", port);
	err = build_argv(&s, kvpoold, port_text, argv, sizeof(argv) / sizeof(argv[0]));
	if (err)
		return err;
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -errno;
	deadline = harness_now_ms() + (uint64_t)scaled_ms(timeout_ms);
	pid = fork();
	if (pid < 0) {
		err = -errno;
		close(pipefd[0]);
		close(pipefd[1]);
		return err;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(pipefd[1], 2);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pipefd[1]);
	/* stderr closes when it exits (or hangs on): read it, then reap. */
	err = collect_output(pipefd[0], deadline, &text);
	close(pipefd[0]);
	while (!err && !child_exited(pid, &wstatus)) {
		if (probe_ready(s.url) == 0)
			answered = 1;
		if (answered || harness_now_ms() > deadline) {
			err = answered ? -EADDRINUSE : -ETIMEDOUT;
			break;
		}
		harness_sleep_ms(10);
	}
	if (err) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		free(text);
		return err;
	}
	*status = wstatus_code(wstatus);
	*err_text = text;
	return 0;
}

int harness_stop(struct harness_server *s)
{
	uint64_t deadline;
	int wstatus;

	if (!s->pid)
		return -ECHILD;
	deadline = harness_now_ms() + (uint64_t)scaled_ms(HARNESS_STOP_TIMEOUT_MS);
	kill(s->pid, SIGTERM);
	while (!child_exited(s->pid, &wstatus)) {
		if (harness_now_ms() > deadline) {
			fprintf(stderr, "harness: kvpoold pid %d ignored SIGTERM for %d ms\n",
				(int)s->pid, scaled_ms(HARNESS_STOP_TIMEOUT_MS));
			harness_kill(s);
			return -ETIMEDOUT;
		}
		harness_sleep_ms(10);
	}
	s->pid = 0;
	return wstatus_code(wstatus);
}

void harness_kill(struct harness_server *s)
{
	if (!s->pid)
		return;
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	s->pid = 0;
}

void harness_need_server(const struct harness_server *s)
{
	if (!s->pid)
		harness_skip("kvpoold is not running (is KVPOOLD set to a built binary?)");
}

int harness_client(const struct harness_server *s, const char *ns, struct kvpool_client **out)
{
	struct kvpool_options opts = { .timeout_ms = (uint32_t)scaled_ms(10000) };

	return kvpool_connect(s->url, ns, &opts, out);
}

/* ---- cmocka group fixtures ------------------------------------------------- */

const char *const harness_default_flags[] = {
	"--dram-capacity", "64MiB", "--threads", "2", "--log-level", "warn",
	/* a client left mid-frame must not hold every stop for the default 10 s */
	"--drain-timeout-ms", "2000", NULL,
};

int harness_group_start(struct harness_server *s, const char *const *extra)
{
	int err = harness_start(s, extra);

	/* A missing $KVPOOLD is not a setup failure: each test skips. */
	if (err && err != -ENOENT) {
		print_error("kvpoold did not start: %s\n", strerror(-err));
		return -1;
	}
	return 0;
}

int harness_group_client(const struct harness_server *s, const char *ns,
			 struct kvpool_client **out)
{
	int err;

	if (!s->pid)
		return 0;
	err = harness_client(s, ns, out);
	if (err) {
		print_error("connect: %s\n", kvpool_strerror(err));
		return -1;
	}
	return 0;
}

void harness_test_clean_shutdown(void **state)
{
	struct harness_server *s = *state;

	harness_need_server(s);
	assert_int_equal(harness_stop(s), 0);
}

/* ---- raw frames ----------------------------------------------------------- */

int harness_raw_connect(uint16_t port, int *fd_out)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd, one = 1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*fd_out = fd;
	return 0;
}

int harness_send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int harness_send_frame(int fd, uint8_t op, uint64_t request_id, const void *body,
		       uint32_t body_bytes, const void *payload, uint64_t payload_bytes)
{
	return harness_send_frame_v(fd, PROTO_VERSION, op, request_id, body, body_bytes, payload,
				    payload_bytes);
}

int harness_send_frame_v(int fd, uint8_t version, uint8_t op, uint64_t request_id,
			 const void *body, uint32_t body_bytes, const void *payload,
			 uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = version, .opcode = op,
		.body_bytes = body_bytes, .request_id = request_id,
		.payload_bytes = payload_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];
	int err;

	proto_header_encode(&h, hdr);
	err = harness_send_all(fd, hdr, sizeof(hdr));
	if (!err && body_bytes)
		err = harness_send_all(fd, body, body_bytes);
	if (!err && payload_bytes)
		err = harness_send_all(fd, payload, payload_bytes);
	return err;
}

/* Read exactly len bytes before the deadline. */
static int read_exact(int fd, void *buf, size_t len, uint64_t deadline)
{
	uint8_t *p = buf;

	while (len > 0) {
		uint64_t now = harness_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		r = poll(&pfd, 1, (int)(deadline - now));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		n = recv(fd, p, len, 0);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return errno == ECONNRESET || errno == EPIPE ? -ECONNRESET : -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int harness_read_frame(int fd, int timeout_ms, struct harness_frame *f)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
	uint8_t hdr[PROTO_HEADER_BYTES];
	struct harness_frame fr = { 0 };
	int err;

	err = read_exact(fd, hdr, sizeof(hdr), deadline);
	if (err)
		return err;
	/* No limits: the tests judge sizes themselves. */
	err = proto_header_decode(hdr, 1, NULL, &fr.h);
	if (err)
		return err;
	if (fr.h.body_bytes > (64u << 20) || fr.h.payload_bytes > (1ull << 32))
		return -EMSGSIZE;
	if (fr.h.body_bytes) {
		fr.body = malloc(fr.h.body_bytes);
		if (!fr.body)
			return -ENOMEM;
		err = read_exact(fd, fr.body, fr.h.body_bytes, deadline);
		if (err)
			goto out_free;
	}
	if (fr.h.payload_bytes) {
		fr.payload = malloc(fr.h.payload_bytes);
		err = fr.payload ? read_exact(fd, fr.payload, fr.h.payload_bytes, deadline) : -ENOMEM;
		if (err)
			goto out_free;
	}
	*f = fr;
	return 0;
out_free:
	harness_frame_free(&fr);
	return err;
}

void harness_frame_free(struct harness_frame *f)
{
	free(f->body);
	free(f->payload);
	f->body = NULL;
	f->payload = NULL;
}

int harness_wait_closed(int fd, int timeout_ms)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
	uint8_t sink[65536];

	for (;;) {
		uint64_t now = harness_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (now >= deadline)
			return -ETIMEDOUT;
		if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
			continue;
		n = recv(fd, sink, sizeof(sink), 0);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return 0;
	}
}

int harness_raw_hello(int fd, const char *ns, struct proto_hello_reply *out)
{
	return harness_raw_hello_v(fd, ns, PROTO_VERSION_MIN, PROTO_VERSION_MAX, out);
}

int harness_raw_hello_v(int fd, const char *ns, uint16_t min_version, uint16_t max_version,
			struct proto_hello_reply *out)
{
	struct proto_hello h = {
		.min_version = min_version, .max_version = max_version,
		.ns = ns, .ns_len = (uint16_t)strlen(ns),
	};
	uint8_t body[PROTO_HELLO_FIXED_BYTES + PROTO_NAME_MAX_BYTES + 1];
	size_t body_bytes = proto_hello_body_bytes(&h);
	struct proto_hello_reply r;
	struct harness_frame f;
	int err;

	err = proto_hello_encode(&h, body, sizeof(body));
	if (err)
		return err;
	err = harness_send_frame(fd, PROTO_OP_HELLO, 1, body, (uint32_t)body_bytes, NULL, 0);
	if (err)
		return err;
	err = harness_read_frame(fd, 5000, &f);
	if (err)
		return err;
	if (f.h.opcode != PROTO_OP_HELLO || f.h.status != PROTO_STATUS_OK ||
	    f.h.request_id != 1 ||
	    proto_hello_reply_decode(f.body, f.h.body_bytes, &r) != 0)
		err = -EPROTO;
	harness_frame_free(&f);
	if (!err && out)
		*out = r;
	return err;
}

int harness_raw_session_or_fail(uint16_t port, const char *ns, struct proto_hello_reply *limits)
{
	int fd = -1;

	assert_int_equal(harness_raw_connect(port, &fd), 0);
	assert_int_equal(harness_raw_hello(fd, ns, limits), 0);
	return fd;
}

int harness_error_message(const struct harness_frame *f, char *buf, size_t cap,
			  uint16_t *min_v, uint16_t *max_v)
{
	uint16_t lo, hi;
	const char *msg;
	uint32_t msg_bytes;
	size_t n;

	if (!f->body || proto_error_decode(f->body, f->h.body_bytes, &lo, &hi, &msg, &msg_bytes))
		return -EPROTO;
	n = msg_bytes < cap - 1 ? msg_bytes : cap - 1;
	memcpy(buf, msg, n);
	buf[n] = '\0';
	if (min_v)
		*min_v = lo;
	if (max_v)
		*max_v = hi;
	return 0;
}

int harness_reply_result(const struct harness_frame *f, uint32_t i, struct proto_result *out)
{
	const struct proto_limits wide = {
		.max_frame_bytes = UINT32_MAX, .max_batch_blocks = UINT32_MAX,
		.max_block_bytes = UINT64_MAX,
	};
	struct proto_batch b;
	int err;

	if (!f->body)
		return -EPROTO;
	err = proto_batch_decode_v(f->body, f->h.body_bytes, PROTO_RESULT_ENTRY_BYTES, f->h.version,
				   &wide, &b);
	if (err)
		return err;
	if (i >= b.count)
		return -EPROTO;
	return proto_result_decode(&b, i, out);
}

int harness_raw_put(int fd, uint64_t request_id, const uint8_t key[32], const uint8_t *parent,
		    const void *data, uint64_t len, uint64_t checksum, uint64_t sent_bytes)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES];
	struct proto_put_entry e = { .length = len, .checksum = checksum };
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PUT,
		.body_bytes = sizeof(body), .request_id = request_id, .payload_bytes = len,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];
	int err;

	memcpy(e.key, key, 32);
	if (parent) {
		memcpy(e.parent, parent, 32);
		e.flags = PROTO_PUT_HAS_PARENT;
	}
	proto_batch_encode_prefix(body, 1, 0);
	proto_put_entry_encode(body, 0, &e);
	proto_header_encode(&h, hdr);
	err = harness_send_all(fd, hdr, sizeof(hdr));
	if (!err)
		err = harness_send_all(fd, body, sizeof(body));
	if (!err && sent_bytes)
		err = harness_send_all(fd, data, sent_bytes);
	return err;
}

int harness_raw_get_send(int fd, uint64_t request_id, const uint8_t (*keys)[32], uint32_t count,
			 uint64_t max_length)
{
	size_t body_bytes = proto_batch_body_bytes(count, PROTO_GET_ENTRY_BYTES);
	uint8_t *body = malloc(body_bytes);
	int err;

	if (!body)
		return -ENOMEM;
	proto_batch_encode_prefix(body, count, 0);
	for (uint32_t i = 0; i < count; i++) {
		struct proto_get_entry e = { .max_length = max_length };

		memcpy(e.key, keys[i], 32);
		proto_get_entry_encode(body, i, &e);
	}
	err = harness_send_frame(fd, PROTO_OP_GET, request_id, body, (uint32_t)body_bytes, NULL, 0);
	free(body);
	return err;
}

int harness_raw_get(int fd, uint64_t request_id, const uint8_t (*keys)[32], uint32_t count,
		    uint64_t max_length, int timeout_ms, struct harness_frame *f)
{
	int err = harness_raw_get_send(fd, request_id, keys, count, max_length);

	return err ? err : harness_read_frame(fd, timeout_ms, f);
}

/* ---- stats ------------------------------------------------------------------ */

int harness_stats(struct kvpool_client *c, const char *ns, struct json_object **doc)
{
	struct json_object *d;
	char *json;
	int err;

	err = kvpool_stats(c, ns, &json);
	if (err)
		return err;
	d = json_tokener_parse(json);
	kvpool_free(json);
	if (!d || !json_object_is_type(d, json_type_object)) {
		json_object_put(d);
		return -EPROTO;
	}
	*doc = d;
	return 0;
}

/* Walk a dotted path of object keys. */
static struct json_object *json_path(struct json_object *doc, const char *path)
{
	char buf[512];
	char *save = NULL;
	struct json_object *cur = doc;

	if (strlen(path) >= sizeof(buf))
		return NULL;
	strcpy(buf, path);
	for (char *part = strtok_r(buf, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
		if (!json_object_is_type(cur, json_type_object) ||
		    !json_object_object_get_ex(cur, part, &cur))
			return NULL;
	}
	return cur;
}

int harness_json_u64(struct json_object *doc, const char *path, uint64_t *out)
{
	struct json_object *v = json_path(doc, path);
	int64_t x;

	if (!v)
		return -ENOENT;
	if (!json_object_is_type(v, json_type_int))
		return -EINVAL;
	x = json_object_get_int64(v);
	if (x < 0)
		return -EINVAL;
	*out = (uint64_t)x;
	return 0;
}

int harness_json_double(struct json_object *doc, const char *path, double *out)
{
	struct json_object *v = json_path(doc, path);

	if (!v)
		return -ENOENT;
	if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
		return -EINVAL;
	*out = json_object_get_double(v);
	return 0;
}

uint64_t harness_json_u64_or_fail(struct json_object *doc, const char *path)
{
	uint64_t v = 0;

	if (harness_json_u64(doc, path, &v))
		fail_msg("json key %s missing or not an integer", path);
	return v;
}

double harness_json_double_or_fail(struct json_object *doc, const char *path)
{
	double v = 0;

	if (harness_json_double(doc, path, &v))
		fail_msg("json key %s missing or not a number", path);
	return v;
}

uint64_t harness_stat_or_fail(struct kvpool_client *c, const char *path)
{
	struct json_object *doc;
	uint64_t v = 0;
	int err;

	err = harness_stats(c, NULL, &doc);
	if (err)
		fail_msg("stats: %s", kvpool_strerror(err));
	err = harness_json_u64(doc, path, &v);
	json_object_put(doc);
	if (err)
		fail_msg("stats field %s: %s", path, err == -ENOENT ? "missing" : "not an integer");
	return v;
}

uint64_t harness_ns_stat_or_fail(struct kvpool_client *c, const char *ns, const char *field)
{
	struct json_object *doc, *nss, *one;
	char path[300];
	uint64_t v = 0;
	int err;

	err = harness_stats(c, ns, &doc);
	if (err)
		fail_msg("stats %s: %s", ns, kvpool_strerror(err));
	if (!json_object_object_get_ex(doc, "namespaces", &nss)) {
		json_object_put(doc);
		fail_msg("stats has no \"namespaces\"");
	}
	if (!json_object_object_get_ex(nss, ns, &one)) {
		json_object_put(doc);
		return 0;
	}
	snprintf(path, sizeof(path), "namespaces.%s.%s", ns, field);
	err = harness_json_u64(doc, path, &v);
	json_object_put(doc);
	if (err)
		fail_msg("stats field %s: %s", path, err == -ENOENT ? "missing" : "not an integer");
	return v;
}

/* Poll STATS every 20 ms until `path` equals want (or, with at_least, is
 * want or more) or timeout_ms passes; returns the last value read. */
static uint64_t wait_stat(struct kvpool_client *c, const char *path, uint64_t want, int at_least,
			  int timeout_ms)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)scaled_ms(timeout_ms);
	uint64_t v;

	for (;;) {
		v = harness_stat_or_fail(c, path);
		if ((at_least ? v >= want : v == want) || harness_now_ms() > deadline)
			return v;
		harness_sleep_ms(20);
	}
}

uint64_t harness_wait_stat_or_fail(struct kvpool_client *c, const char *path, uint64_t want,
				   int timeout_ms)
{
	return wait_stat(c, path, want, 0, timeout_ms);
}

uint64_t harness_wait_stat_at_least_or_fail(struct kvpool_client *c, const char *path,
					    uint64_t min, int timeout_ms)
{
	return wait_stat(c, path, min, 1, timeout_ms);
}

/* ---- blocks ------------------------------------------------------------------ */

void harness_check_block_or_fail(struct kvpool_client *c, const uint8_t key[32], const void *want,
				 size_t len)
{
	uint8_t *got = malloc(len);
	uint64_t got_len = 0;

	assert_non_null(got);
	assert_int_equal(kvpool_get_bytes(c, key, got, len, &got_len), 0);
	assert_int_equal(got_len, len);
	assert_memory_equal(got, want, len);
	free(got);
}

void harness_check_absent_or_fail(struct kvpool_client *c, const uint8_t key[32])
{
	int st = 1;

	assert_int_equal(kvpool_exists(c, (const uint8_t(*)[32])key, 1, &st), 0);
	assert_int_equal(st, -ENOENT);
}

/* ---- directories ----------------------------------------------------------- */

int harness_tmpdir(const char *tag, char *buf, size_t cap)
{
	const char *base = getenv("TMPDIR");
	int n;

	if (!base || !*base)
		base = "/tmp";
	n = snprintf(buf, cap, "%s/kvpool-%s-XXXXXX", base, tag);
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	return mkdtemp(buf) ? 0 : -errno;
}

/* nftw callback: remove one entry, children first (FTW_DEPTH). */
static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if ((type == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int harness_rm_rf(const char *path)
{
	int rc = nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);

	if (rc < 0 && errno == ENOENT)
		return 0;
	return rc < 0 ? -errno : rc;
}

/* ---- processes ------------------------------------------------------------- */

/* Collect the child's stdout until EOF or the deadline. */
static int collect_output(int fd, uint64_t deadline, char **out)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	for (;;) {
		uint64_t now = harness_now_ms();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (now >= deadline) {
			free(buf);
			return -ETIMEDOUT;
		}
		if (poll(&pfd, 1, (int)(deadline - now)) <= 0)
			continue;
		if (len + 1 == cap) {
			char *bigger = realloc(buf, cap * 2);

			if (!bigger) {
				free(buf);
				return -ENOMEM;
			}
			buf = bigger;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

int harness_run(char *const argv[], int timeout_ms, char **out, int *status)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
	posix_spawn_file_actions_t fa;
	int pipefd[2], wstatus, err;
	char *buf = NULL;
	pid_t pid;

	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -errno;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
	err = -posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pipefd[1]);
	if (err) {
		close(pipefd[0]);
		return err;
	}
	err = collect_output(pipefd[0], deadline, &buf);
	close(pipefd[0]);
	while (!err && !child_exited(pid, &wstatus)) {
		if (harness_now_ms() > deadline) {
			free(buf);
			err = -ETIMEDOUT;
			break;
		}
		harness_sleep_ms(10);
	}
	if (err) {
		kill(pid, SIGKILL);
		waitpid(pid, &wstatus, 0);
		return err;
	}
	*status = wstatus_code(wstatus);
	*out = buf;
	return 0;
}
