/*
 * test_hostile.c - kvpoold against many misbehaving clients at once, and
 * the guarantees well-behaved clients keep meanwhile:
 *   - huge announcements: 200 connections announce 4 GiB PUTs and stall
 *     or trickle; the server's memory barely moves, they are refused and
 *     closed, and a normal 1 MiB put/get works throughout;
 *   - a connection storm with clients killed mid-handshake and mid-payload;
 *   - slow uploads within the limits: the in-flight budget holds, BUSY
 *     beyond it, payload_timeout_ms frees the rest;
 *   - size boundaries around max_block_bytes, on the wire and in libkvpool;
 *   - four tensor-parallel ranks on one chain under eviction pressure;
 *   - prefix boundaries of the block-hash helper;
 *   - the same chain computed in two processes.
 *
 * The binary doubles as the helper process of the last test: run with
 * "--chain-helper ..." it computes a chain, prints it and puts or checks
 * blocks (see helper_main).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"

#define MIB (1u << 20)
#define BLOCK_LIMIT (8u * MIB)         /* the group server's max_block_bytes */
#define INFLIGHT_LIMIT (36ull * MIB)   /* its max_inflight_put_bytes */
#define PAYLOAD_TIMEOUT_MS 2000
#define REPLY_MS 5000

#define HUGE_CONNS 200
#define SLOW_CONNS 200
#define STORM_THREADS 8
#define STORM_CYCLES 50                /* per thread */
#define STORM_KILLED_CHILDREN 12

#define TP_RANKS 4
#define TP_BLOCKS 64
#define TP_BLOCK_BYTES (64u << 10)
#define TP_TOKENS_PER_BLOCK 16

static const char *const flags[] = {
	"--dram-capacity", "128MiB", "--max-block-bytes", "8MiB", "--max-batch-blocks", "64",
	"--max-frame-bytes", "64KiB", "--max-inflight-put-bytes", "36MiB",
	"--max-connections", "700", "--idle-timeout-ms", "5000",
	"--payload-timeout-ms", "2000", "--threads", "2", "--log-level", "error", NULL,
};

static struct {
	struct harness_server srv;
	struct kvpool_client *c;   /* namespace "hostile": STATS and checks */
	struct harness_server srv_tp; /* test_tp_ranks_under_eviction's own */
} g;

static int group_setup(void **state)
{
	struct rlimit rl;

	(void)state;
	/* Hundreds of sockets at once: lift our own descriptor limit. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	signal(SIGPIPE, SIG_IGN);
	if (harness_group_start(&g.srv, flags))
		return -1;
	return harness_group_client(&g.srv, "hostile", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	harness_kill(&g.srv_tp);
	return 0;
}

/* ---- helpers ---------------------------------------------------------------- */

/* Timeouts stretch under valgrind, which runs kvpoold many times slower. */
static int slow(int ms)
{
	return harness_valgrind() ? 4 * ms : ms;
}

/* VmRSS of a process in kB. */
static uint64_t rss_kb(pid_t pid)
{
	char path[64], line[256];
	uint64_t kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "VmRSS:", 6) == 0)
			kb = strtoull(line + 6, NULL, 10);
	fclose(f);
	assert_true(kb > 0);
	return kb;
}

/* The server's RSS once it has stopped moving (the arena is faulted in
 * by a background thread after start-up): three samples 100 ms apart
 * within 256 kB of each other, or whatever it is after 10 s. */
static uint64_t rss_settled_kb(pid_t pid)
{
	uint64_t deadline = harness_now_ms() + (uint64_t)slow(10000);
	uint64_t prev = rss_kb(pid), cur;
	int stable = 0;

	while (stable < 3 && harness_now_ms() < deadline) {
		harness_sleep_ms(100);
		cur = rss_kb(pid);
		stable = (cur > prev ? cur - prev : prev - cur) < 256 ? stable + 1 : 0;
		prev = cur;
	}
	return prev;
}

/* Put a len-byte block under (tag, n) and get it back byte-exact. */
static void put_get_or_fail(struct kvpool_client *c, const char *tag, uint64_t n, size_t len)
{
	uint8_t key[32], *data = malloc(len);

	assert_non_null(data);
	harness_key(key, tag, n);
	harness_fill(data, len, harness_key_seed(key));
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, len), 0);
	harness_check_block_or_fail(c, key, data, len);
	free(data);
}

/* Send a request header only. */
static int send_header(int fd, uint8_t op, uint64_t id, uint32_t body_bytes,
		       uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = op,
		.body_bytes = body_bytes, .request_id = id, .payload_bytes = payload_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];

	proto_header_encode(&h, hdr);
	return harness_send_all(fd, hdr, sizeof(hdr));
}

/* Is fd closed by the peer (EOF or reset) right now? Drains what is
 * readable. */
static int peer_closed(int fd)
{
	uint8_t sink[4096];

	for (;;) {
		ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);

		if (n == 0)
			return 1;
		if (n < 0)
			return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
	}
}

/* Close with a reset, as a process that dies with unsent data does. */
static void close_reset(int fd)
{
	struct linger l = { .l_onoff = 1, .l_linger = 0 };

	setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	close(fd);
}

/* Open connections of other clients (ours, g.c, counts as one). */
static uint64_t others_connected(void)
{
	return harness_stat_or_fail(g.c, "connections.current") - 1;
}

/* Wait until only our own connection is open; returns how many others
 * were still open at the deadline. */
static uint64_t wait_others_gone(int timeout_ms)
{
	return harness_wait_stat_or_fail(g.c, "connections.current", 1, slow(timeout_ms)) - 1;
}

/* ---- 1. huge announcements ---------------------------------------------------------- */

/* Read the TOO_LARGE reply a refused header gets; its message names the
 * limit that refused it. */
static void expect_too_large(int fd, uint64_t id, const char *limit_name)
{
	struct harness_frame f;
	char msg[1100];

	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.request_id, id);
	assert_int_equal(f.h.status, PROTO_STATUS_TOO_LARGE);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	if (!strstr(msg, limit_name))
		fail_msg("TOO_LARGE message \"%s\" does not name %s", msg, limit_name);
	harness_frame_free(&f);
}

/* 200 connections each announce a 4 GiB PUT payload in a header and send
 * nothing more (even ones) or one byte a second (odd ones). Each is
 * refused at the header (4 GiB > max_batch_blocks x max_block_bytes) and
 * closed by payload_timeout_ms; the server's RSS grows < 10 MiB; a normal
 * client's 1 MiB put/get works while they hang on. */
static void test_huge_announcements(void **state)
{
	static int fds[HUGE_CONNS];
	uint64_t rss0, peak, t0, last_trickle = 0, closed_at = 0, total0;
	int closed[HUGE_CONNS] = { 0 }, n_closed = 0, round = 0;
	const uint8_t one = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(wait_others_gone(3000), 0);
	total0 = harness_stat_or_fail(g.c, "connections.total");
	rss0 = rss_settled_kb(g.srv.pid);
	peak = rss0;
	for (int i = 0; i < HUGE_CONNS; i++) {
		fds[i] = harness_raw_session_or_fail(g.srv.port, "hostile-huge", NULL);
		assert_int_equal(send_header(fds[i], PROTO_OP_PUT, 100 + (uint64_t)i,
					     PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES,
					     4ull << 30),
				 0);
	}
	t0 = harness_now_ms();
	for (int i = 0; i < HUGE_CONNS; i++)
		expect_too_large(fds[i], 100 + (uint64_t)i, "max_block_bytes");
	assert_int_equal(others_connected(), HUGE_CONNS);

	/* Stall and trickle; a normal client works meanwhile. */
	while (n_closed < HUGE_CONNS && harness_now_ms() - t0 < (uint64_t)slow(4 * PAYLOAD_TIMEOUT_MS)) {
		uint64_t rss = rss_kb(g.srv.pid);

		peak = rss > peak ? rss : peak;
		if (round++ < 3)
			put_get_or_fail(g.c, "hostile-huge-normal", (uint64_t)round, MIB);
		if (harness_now_ms() - last_trickle >= 1000) {
			last_trickle = harness_now_ms();
			for (int i = 1; i < HUGE_CONNS; i += 2)
				if (!closed[i])
					harness_send_all(fds[i], &one, 1); /* may find it closed */
		}
		for (int i = 0; i < HUGE_CONNS; i++) {
			if (!closed[i] && peer_closed(fds[i])) {
				closed[i] = 1;
				n_closed++;
				closed_at = harness_now_ms() - t0;
			}
		}
		harness_sleep_ms(50);
	}
	for (int i = 0; i < HUGE_CONNS; i++)
		close(fds[i]);
	print_message("huge announcements: %d connections, VmRSS %" PRIu64 " kB -> peak %" PRIu64
		      " kB (+%" PRIu64 " kB), all closed %" PRIu64 " ms after the headers\n",
		      HUGE_CONNS, rss0, peak, peak - rss0, closed_at);
	assert_int_equal(n_closed, HUGE_CONNS);
	assert_true(peak - rss0 < 10 * 1024);
	/* Closed by the frame deadline, not at once. */
	assert_true(closed_at >= PAYLOAD_TIMEOUT_MS - 300);
	assert_int_equal(wait_others_gone(3000), 0);
	assert_true(harness_stat_or_fail(g.c, "connections.total") - total0 >= HUGE_CONNS);
	put_get_or_fail(g.c, "hostile-huge-normal", 100, MIB);
}

/* ---- 2. connection storm --------------------------------------------------------------- */

struct storm_thread {
	pthread_t thr;
	int id;
	uint16_t port;
	char url[64];
	int good, aborted, errors;
	char first_error[160];
	uint64_t put_ok[STORM_CYCLES]; /* 1 when cycle i stored its block */
};

static void storm_error(struct storm_thread *t, const char *what, int err)
{
	if (!t->errors++)
		snprintf(t->first_error, sizeof(t->first_error), "thread %d: %s: %s", t->id, what,
			 kvpool_strerror(err));
}

static size_t storm_len(int id, int i)
{
	return 4096 + (size_t)((id * 7919 + i * 104729) % (60 * 1024));
}

/* One well-behaved cycle: connect, put, get back, compare, close. */
static void storm_good(struct storm_thread *t, int i)
{
	struct kvpool_options opts = { .timeout_ms = (uint32_t)slow(10000) };
	size_t len = storm_len(t->id, i);
	uint8_t key[32], *data = malloc(len), *got = malloc(len);
	struct kvpool_client *c = NULL;
	char ns[32];
	uint64_t n = 0;
	int rc;

	snprintf(ns, sizeof(ns), "storm-%d", t->id);
	harness_key(key, ns, (uint64_t)i);
	if (!data || !got) {
		storm_error(t, "malloc", -ENOMEM);
		goto out_free;
	}
	harness_fill(data, len, harness_key_seed(key));
	rc = kvpool_connect(t->url, ns, &opts, &c);
	if (rc) {
		storm_error(t, "connect", rc);
		goto out_free;
	}
	rc = kvpool_put_bytes(c, key, NULL, data, len);
	if (!rc)
		rc = kvpool_get_bytes(c, key, got, len, &n);
	if (rc)
		storm_error(t, "put/get", rc);
	else if (n != len || memcmp(got, data, len))
		storm_error(t, "get returned other bytes", -EBADMSG);
	else
		t->put_ok[i] = 1;
	t->good++;
	kvpool_close(c);
out_free:
	free(data);
	free(got);
}

/* A client that dies: in the middle of its HELLO, of a PUT payload, or
 * right after connecting; the socket is reset, not closed politely. */
static void storm_abort(struct storm_thread *t, int i, int kind)
{
	static const uint8_t zeros[64 << 10];
	uint8_t key[32], body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES];
	struct proto_put_entry e = { .length = sizeof(zeros) };
	int fd = -1, rc;

	rc = harness_raw_connect(t->port, &fd);
	if (rc) {
		storm_error(t, "raw connect", rc);
		return;
	}
	if (kind == 0) {
		/* Half a HELLO: a header announcing a body that never comes. */
		rc = send_header(fd, PROTO_OP_HELLO, 1, 20, 0);
	} else if (kind == 1) {
		rc = harness_raw_hello(fd, "storm-aborted", NULL);
		harness_key(key, "storm-aborted", (uint64_t)(t->id * STORM_CYCLES + i));
		memcpy(e.key, key, 32);
		e.checksum = harness_xxh3(zeros, sizeof(zeros));
		proto_batch_encode_prefix(body, 1, 0);
		proto_put_entry_encode(body, 0, &e);
		if (!rc)
			rc = send_header(fd, PROTO_OP_PUT, 2, sizeof(body), sizeof(zeros));
		if (!rc)
			rc = harness_send_all(fd, body, sizeof(body));
		if (!rc)
			rc = harness_send_all(fd, zeros, sizeof(zeros) / 2);
	}
	if (rc)
		storm_error(t, "raw send", rc);
	close_reset(fd);
	t->aborted++;
}

static void *storm_main(void *arg)
{
	struct storm_thread *t = arg;

	for (int i = 0; i < STORM_CYCLES; i++) {
		int kind = (t->id * STORM_CYCLES + i) % 10;

		if (kind < 3)
			storm_abort(t, i, kind);
		else
			storm_good(t, i);
	}
	return NULL;
}

/* A child process that loops connect/put/get/close until it is killed. */
static pid_t spawn_doomed_client(const char *url, int n)
{
	pid_t parent = getpid(), pid = fork();

	assert_true(pid >= 0);
	if (pid)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(0);
	for (uint64_t i = 0;; i++) {
		struct kvpool_options opts = { .timeout_ms = 5000 };
		static uint8_t data[256 << 10];
		struct kvpool_client *c;
		uint8_t key[32];

		harness_key(key, "storm-doomed", (uint64_t)n << 32 | i);
		harness_fill(data, sizeof(data), i);
		if (kvpool_connect(url, "storm-doomed", &opts, &c) == 0) {
			kvpool_put_bytes(c, key, NULL, data, sizeof(data));
			kvpool_get_bytes(c, key, data, sizeof(data), NULL);
			kvpool_close(c);
		}
	}
}

/* Kill clients at random points of their work with SIGKILL. */
static void storm_kill_children(const char *url)
{
	unsigned seed = 12345;

	for (int k = 0; k < STORM_KILLED_CHILDREN; k++) {
		pid_t pid = spawn_doomed_client(url, k);

		harness_sleep_ms(20 + rand_r(&seed) % 120);
		kill(pid, SIGKILL);
		assert_int_equal(waitpid(pid, NULL, 0), pid);
	}
}

/* Hundreds of connect/put/get/disconnect cycles in parallel, 3 in 10 of
 * them cut off mid-handshake or mid-payload with a reset, plus client
 * processes SIGKILLed mid-work: the server stays up, every finished
 * cycle's block reads back byte-exact, aborted PUTs stored nothing, and
 * the open connections return to just ours. */
static void test_connection_storm(void **state)
{
	static struct storm_thread th[STORM_THREADS];
	uint64_t total0, total1, t0;
	int good = 0, aborted = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(wait_others_gone(3000), 0);
	total0 = harness_stat_or_fail(g.c, "connections.total");
	t0 = harness_now_ms();
	storm_kill_children(g.srv.url);
	for (int i = 0; i < STORM_THREADS; i++) {
		th[i] = (struct storm_thread){ .id = i, .port = g.srv.port };
		snprintf(th[i].url, sizeof(th[i].url), "%s", g.srv.url);
		assert_int_equal(pthread_create(&th[i].thr, NULL, storm_main, &th[i]), 0);
	}
	for (int i = 0; i < STORM_THREADS; i++) {
		assert_int_equal(pthread_join(th[i].thr, NULL), 0);
		if (th[i].errors)
			fail_msg("%d storm errors; first: %s", th[i].errors, th[i].first_error);
		good += th[i].good;
		aborted += th[i].aborted;
	}
	assert_int_equal(kill(g.srv.pid, 0), 0);
	assert_int_equal(kvpool_ping(g.c, NULL), 0);
	assert_int_equal(wait_others_gone(5000), 0);
	total1 = harness_stat_or_fail(g.c, "connections.total");
	print_message("storm: %" PRIu64 " connections in %" PRIu64 " ms (%d put/get cycles, %d "
		      "aborted mid-way, %d clients SIGKILLed)\n", total1 - total0,
		      harness_now_ms() - t0, good, aborted, STORM_KILLED_CHILDREN);
	assert_true(total1 - total0 >= (uint64_t)(good + aborted));
	assert_int_equal(good + aborted, STORM_THREADS * STORM_CYCLES);

	/* Every finished cycle's block is there, byte-exact. */
	for (int i = 0; i < STORM_THREADS; i++) {
		struct kvpool_client *c = NULL;
		char ns[32];

		snprintf(ns, sizeof(ns), "storm-%d", i);
		assert_int_equal(harness_client(&g.srv, ns, &c), 0);
		for (int k = 0; k < STORM_CYCLES; k++) {
			size_t len = storm_len(i, k);
			uint8_t key[32], *want;

			if (!th[i].put_ok[k])
				continue;
			want = malloc(len);
			assert_non_null(want);
			harness_key(key, ns, (uint64_t)k);
			harness_fill(want, len, harness_key_seed(key));
			harness_check_block_or_fail(c, key, want, len);
			free(want);
		}
		kvpool_close(c);
	}
	/* A PUT cut off in its payload stored nothing. */
	{
		struct kvpool_client *c = NULL;

		assert_int_equal(harness_client(&g.srv, "storm-aborted", &c), 0);
		assert_int_equal(harness_ns_stat_or_fail(c, "storm-aborted", "blocks"), 0);
		kvpool_close(c);
	}
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes"), 0);
}

/* ---- 3. slow uploads within the limits ---------------------------------------------------- */

/* Start an 8 MiB PUT of key (tag, n): header, body and `sent` payload bytes. */
static int start_put(int fd, uint64_t id, const char *tag, uint64_t n, const uint8_t *data,
		     uint64_t len, uint64_t sent)
{
	uint8_t key[32];

	harness_key(key, tag, n);
	return harness_raw_put(fd, id, key, NULL, data, len, harness_xxh3(data, len), sent);
}

/* A libkvpool client that puts an 8 MiB block while the in-flight budget
 * is taken, retrying BUSY for up to `tries` tries. */
struct lib_put {
	pthread_t thr;
	const char *url;
	const uint8_t *data;
	uint32_t tries;
	int rc;
	uint64_t ms;
	struct kvpool_counters counters;
};

static void *lib_put_main(void *arg)
{
	struct kvpool_options opts = { .timeout_ms = (uint32_t)slow(10000) };
	struct lib_put *p = arg;
	struct kvpool_client *c = NULL;
	uint64_t t0 = harness_now_ms();
	uint8_t key[32];

	p->rc = kvpool_connect(p->url, "hostile-slow-lib", &opts, &c);
	if (p->rc)
		return NULL;
	kvpool_set_busy_tries(c, p->tries);
	harness_key(key, "hostile-slow-lib", p->tries);
	p->rc = kvpool_put_bytes(c, key, NULL, p->data, BLOCK_LIMIT);
	p->ms = harness_now_ms() - t0;
	kvpool_get_counters(c, &p->counters);
	kvpool_close(c);
	return NULL;
}

/* 200 connections each start an 8 MiB PUT and trickle a byte a second.
 * The in-flight reservations never pass max_inflight_put_bytes (36 MiB:
 * four of them fit), a PUT that arrives whole meanwhile is answered BUSY,
 * a small put from another client still fits, and payload_timeout_ms
 * closes the slow ones and frees everything they held. libkvpool retries
 * BUSY with backoff: with the default tries it gives up (-EAGAIN) in well
 * under a second; with many tries it gets in once the budget is freed. */
static void test_slow_uploads(void **state)
{
	static int fds[SLOW_CONNS];
	uint8_t *data = malloc(BLOCK_LIMIT);
	uint64_t max_inflight = 0, busy0, t0, last_trickle;
	int closed[SLOW_CONNS] = { 0 }, n_closed = 0, fd;
	struct lib_put give_up, patient;
	struct proto_result r;
	struct harness_frame f;
	const uint8_t one = 0;
	uint8_t key[32];

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	assert_int_equal(wait_others_gone(3000), 0);
	harness_fill(data, BLOCK_LIMIT, 77);
	busy0 = harness_stat_or_fail(g.c, "ops.errors.busy");
	for (int i = 0; i < SLOW_CONNS; i++) {
		fds[i] = harness_raw_session_or_fail(g.srv.port, "hostile-slow", NULL);
		assert_int_equal(start_put(fds[i], 5, "hostile-slow", (uint64_t)i, data, BLOCK_LIMIT,
					   1),
				 0);
	}
	t0 = last_trickle = harness_now_ms();
	max_inflight = harness_wait_stat_at_least_or_fail(g.c, "tiers.dram.inflight_put_bytes",
							  32ull * MIB, slow(1000));
	assert_true(max_inflight >= 32ull * MIB);

	/* A whole 8 MiB PUT while the budget is taken: BUSY, nothing stored. */
	fd = harness_raw_session_or_fail(g.srv.port, "hostile-slow", NULL);
	assert_int_equal(start_put(fd, 6, "hostile-slow-whole", 0, data, BLOCK_LIMIT, BLOCK_LIMIT),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(harness_reply_result(&f, 0, &r), 0);
	assert_int_equal(r.status, PROTO_STATUS_BUSY);
	harness_frame_free(&f);
	close(fd);
	/* A 1 MiB put fits in what is left of the budget. */
	put_get_or_fail(g.c, "hostile-slow-small", 0, MIB);
	/* The library's own backoff, bounded: it gives up. */
	give_up = (struct lib_put){ .url = g.srv.url, .data = data, .tries = KVPOOL_BUSY_TRIES };
	lib_put_main(&give_up);
	assert_int_equal(give_up.rc, -EAGAIN);
	assert_int_equal(give_up.counters.busy_retries, KVPOOL_BUSY_TRIES - 1);
	assert_true(give_up.ms < 2000);
	/* With many tries, it outlasts the slow uploads. */
	patient = (struct lib_put){ .url = g.srv.url, .data = data, .tries = 60 };
	assert_int_equal(pthread_create(&patient.thr, NULL, lib_put_main, &patient), 0);

	while (n_closed < SLOW_CONNS && harness_now_ms() - t0 < (uint64_t)slow(4 * PAYLOAD_TIMEOUT_MS)) {
		uint64_t v = harness_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes");

		max_inflight = v > max_inflight ? v : max_inflight;
		if (harness_now_ms() - last_trickle >= 1000) {
			last_trickle = harness_now_ms();
			for (int i = 0; i < SLOW_CONNS; i++)
				if (!closed[i])
					harness_send_all(fds[i], &one, 1);
		}
		for (int i = 0; i < SLOW_CONNS; i++) {
			if (!closed[i] && peer_closed(fds[i])) {
				closed[i] = 1;
				n_closed++;
			}
		}
		harness_sleep_ms(50);
	}
	for (int i = 0; i < SLOW_CONNS; i++)
		close(fds[i]);
	assert_int_equal(pthread_join(patient.thr, NULL), 0);
	print_message("slow uploads: %d connections, in-flight peak %" PRIu64 " of %" PRIu64
		      " bytes, %" PRIu64 " BUSY, all closed after %" PRIu64 " ms; libkvpool gave "
		      "up after %" PRIu64 " ms (%" PRIu64 " retries), or got in after %" PRIu64
		      " ms (%" PRIu64 " retries)\n", SLOW_CONNS, max_inflight,
		      (uint64_t)INFLIGHT_LIMIT, harness_stat_or_fail(g.c, "ops.errors.busy") - busy0,
		      harness_now_ms() - t0, give_up.ms, give_up.counters.busy_retries, patient.ms,
		      patient.counters.busy_retries);
	assert_int_equal(patient.rc, 0);
	assert_true(patient.counters.busy_retries > 0);
	assert_int_equal(n_closed, SLOW_CONNS);
	assert_true(max_inflight <= INFLIGHT_LIMIT);
	assert_true(harness_stat_or_fail(g.c, "ops.errors.busy") > busy0);
	assert_int_equal(harness_wait_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes", 0,
						   slow(3000)),
			 0);
	assert_int_equal(wait_others_gone(3000), 0);
	assert_int_equal(harness_ns_stat_or_fail(g.c, "hostile-slow", "blocks"), 0);
	/* The patient client's block is there; the one that gave up is not. */
	assert_int_equal(harness_ns_stat_or_fail(g.c, "hostile-slow-lib", "blocks"), 1);
	harness_key(key, "hostile-slow-lib", patient.tries);
	{
		struct kvpool_client *c = NULL;

		assert_int_equal(harness_client(&g.srv, "hostile-slow-lib", &c), 0);
		harness_check_block_or_fail(c, key, data, BLOCK_LIMIT);
		kvpool_close(c);
	}
	/* With the budget back, an 8 MiB block goes in. */
	put_get_or_fail(g.c, "hostile-slow-after", 0, BLOCK_LIMIT);
	free(data);
}

/* ---- 4. size boundaries ----------------------------------------------------------------- */

/* A raw PUT of one len-byte block: refused TOO_LARGE naming the limit in
 * bytes; the connection stays in step (the payload is read and dropped)
 * and no key is left. */
static void raw_put_refused(uint64_t len, const uint8_t *data)
{
	uint8_t key[32];
	char msg[1100], limit[32];
	struct harness_frame f;
	int fd;

	harness_key(key, "hostile-size-raw", len);
	fd = harness_raw_session_or_fail(g.srv.port, "hostile", NULL);
	assert_int_equal(harness_raw_put(fd, 9, key, NULL, data, len, harness_xxh3(data, len), len),
			 0);
	assert_int_equal(harness_read_frame(fd, slow(REPLY_MS), &f), 0);
	assert_int_equal(f.h.request_id, 9);
	assert_int_equal(f.h.status, PROTO_STATUS_TOO_LARGE);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	snprintf(limit, sizeof(limit), "%u", BLOCK_LIMIT);
	if (!strstr(msg, "max_block_bytes") || !strstr(msg, limit))
		fail_msg("TOO_LARGE message \"%s\" does not state max_block_bytes %s", msg, limit);
	harness_frame_free(&f);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_PING, 10, NULL, 0, NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, slow(REPLY_MS), &f), 0);
	assert_int_equal(f.h.request_id, 10);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	close(fd);
	harness_check_absent_or_fail(g.c, key);
}

/* max_block_bytes 8 MiB: 8 MiB and 8 MiB - 1 go in and come back
 * byte-exact; 8 MiB + 1 and 64 MiB are refused by the server with a
 * TOO_LARGE that states the limit and leave no key; libkvpool knows the
 * limit from HELLO and refuses them itself, sending nothing. */
static void test_size_boundaries(void **state)
{
	const size_t big = 64u * MIB;
	uint8_t *data = malloc(big), key[32];
	struct kvpool_limits lim;
	uint64_t requests;
	int st = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	harness_fill(data, big, 4242);
	assert_int_equal(kvpool_get_limits(g.c, &lim), 0);
	assert_int_equal(lim.max_block_bytes, BLOCK_LIMIT);
	for (uint64_t len = BLOCK_LIMIT - 1; len <= BLOCK_LIMIT; len++) {
		harness_key(key, "hostile-size", len);
		assert_int_equal(kvpool_put_bytes(g.c, key, NULL, data, len), 0);
		harness_check_block_or_fail(g.c, key, data, len);
	}
	raw_put_refused(BLOCK_LIMIT + 1ull, data);
	raw_put_refused(big, data);

	/* The library refuses locally: no PUT frame reaches the server. */
	requests = harness_stat_or_fail(g.c, "ops.put.requests");
	for (uint64_t len = BLOCK_LIMIT + 1ull; len <= big; len += big - BLOCK_LIMIT - 1) {
		struct iovec iov = { .iov_base = data, .iov_len = len };
		struct kvpool_put_block b = { .key = key, .iov = &iov, .iovcnt = 1 };

		harness_key(key, "hostile-size-lib", len);
		assert_int_equal(kvpool_put(g.c, &b, 1, &st), -EMSGSIZE);
		assert_int_equal(st, -EMSGSIZE);
		harness_check_absent_or_fail(g.c, key);
	}
	assert_int_equal(harness_stat_or_fail(g.c, "ops.put.requests"), requests);
	free(data);
}

/* ---- 5. tensor-parallel ranks under eviction ---------------------------------------------- */

struct tp_rank {
	pthread_t thr;
	int rank;
	const char *url;
	const uint8_t (*keys)[32];    /* the chain, shared by every rank */
	int rounds, full_matches, puts_refused, violations;
	uint64_t matched_blocks;
	char first_violation[200];
};

static volatile int tp_stop;

/* The bytes of block j of rank r's shard: distinct per rank and block,
 * with the rank written at the start for the error message. */
static void tp_shard(uint8_t *buf, int rank, int j)
{
	harness_fill(buf, TP_BLOCK_BYTES, (uint64_t)rank * 1000003u + (uint64_t)j);
	buf[0] = (uint8_t)rank;
}

static void tp_violation(struct tp_rank *t, const char *fmt, ...)
{
	va_list ap;

	if (t->violations++)
		return;
	va_start(ap, fmt);
	vsnprintf(t->first_violation, sizeof(t->first_violation), fmt, ap);
	va_end(ap);
}

/* Put blocks from..TP_BLOCKS-1 of this rank's shard (parents chained). */
static void tp_put_suffix(struct tp_rank *t, struct kvpool_client *c, size_t from, uint8_t *buf)
{
	struct kvpool_put_block b[TP_BLOCKS];
	struct iovec iov[TP_BLOCKS];
	int st[TP_BLOCKS];
	size_t n = 0;

	for (size_t j = from; j < TP_BLOCKS; j++, n++) {
		tp_shard(buf + n * TP_BLOCK_BYTES, t->rank, (int)j);
		iov[n] = (struct iovec){ buf + n * TP_BLOCK_BYTES, TP_BLOCK_BYTES };
		b[n] = (struct kvpool_put_block){ .key = t->keys[j],
						  .parent = j ? t->keys[j - 1] : NULL,
						  .iov = &iov[n], .iovcnt = 1 };
	}
	if (!n)
		return;
	kvpool_put(c, b, n, st);
	for (size_t k = 0; k < n; k++) {
		if (st[k] == -ENOSPC || st[k] == -EAGAIN || st[k] == -ENOLINK)
			t->puts_refused++;
		else if (st[k])
			tp_violation(t, "rank %d put block %zu: %s", t->rank, from + k,
				     kvpool_strerror(st[k]));
	}
}

/* MATCH under a lease, then GET the whole chain: the m matched blocks
 * must all come back, each this rank's own shard; the others must be a
 * clean miss or (if stored since) this rank's shard too. */
static size_t tp_check_round(struct tp_rank *t, struct kvpool_client *c, uint8_t *buf,
			     uint8_t *want)
{
	struct kvpool_get_block gb[TP_BLOCKS];
	struct iovec iov[TP_BLOCKS];
	int st[TP_BLOCKS];
	size_t m = 0;
	int rc;

	rc = kvpool_match(c, t->keys, TP_BLOCKS, 3000, &m);
	if (rc) {
		tp_violation(t, "rank %d match: %s", t->rank, kvpool_strerror(rc));
		return 0;
	}
	for (int j = 0; j < TP_BLOCKS; j++) {
		iov[j] = (struct iovec){ buf + (size_t)j * TP_BLOCK_BYTES, TP_BLOCK_BYTES };
		gb[j] = (struct kvpool_get_block){ .key = t->keys[j], .iov = &iov[j], .iovcnt = 1 };
	}
	kvpool_get(c, gb, TP_BLOCKS, st);
	for (size_t j = 0; j < TP_BLOCKS; j++) {
		if (st[j] == -ENOENT && j >= m)
			continue;
		if (st[j]) {
			tp_violation(t, "rank %d block %zu (matched %zu): %s", t->rank, j, m,
				     kvpool_strerror(st[j]));
			continue;
		}
		tp_shard(want, t->rank, (int)j);
		if (gb[j].length != TP_BLOCK_BYTES || memcmp(want, iov[j].iov_base, TP_BLOCK_BYTES))
			tp_violation(t, "rank %d block %zu holds rank %d's bytes", t->rank, j,
				     ((uint8_t *)iov[j].iov_base)[0]);
	}
	return m;
}

static void *tp_rank_main(void *arg)
{
	struct kvpool_options opts = { .timeout_ms = 10000 };
	struct tp_rank *t = arg;
	uint8_t *buf = malloc((size_t)TP_BLOCKS * TP_BLOCK_BYTES), *want = malloc(TP_BLOCK_BYTES);
	struct kvpool_client *c = NULL;
	char ns[64];
	int rc;

	/* The namespace names everything that makes KV bytes differ. */
	snprintf(ns, sizeof(ns), "model-x/rev1/bf16/tp%d/rank%d/b%d", TP_RANKS, t->rank,
		 TP_TOKENS_PER_BLOCK);
	rc = buf && want ? kvpool_connect(t->url, ns, &opts, &c) : -ENOMEM;
	if (rc) {
		tp_violation(t, "rank %d connect: %s", t->rank, kvpool_strerror(rc));
		goto out_free;
	}
	while (!tp_stop) {
		size_t m = tp_check_round(t, c, buf, want);

		t->rounds++;
		t->matched_blocks += m;
		t->full_matches += m == TP_BLOCKS;
		tp_put_suffix(t, c, m, buf);
	}
	kvpool_close(c);
out_free:
	free(buf);
	free(want);
	return NULL;
}

/* Fill the pool with unrelated blocks until told to stop. */
static void *tp_filler_main(void *arg)
{
	struct kvpool_options opts = { .timeout_ms = 10000 };
	static uint8_t data[256 << 10];
	struct kvpool_client *c = NULL;
	uint8_t key[32];

	if (kvpool_connect(arg, "filler", &opts, &c))
		return NULL;
	harness_fill(data, sizeof(data), 99);
	for (uint64_t i = 0; !tp_stop; i++) {
		harness_key(key, "tp-filler", i);
		data[0] = (uint8_t)i;
		kvpool_put_bytes(c, key, NULL, data, sizeof(data));
	}
	kvpool_close(c);
	return NULL;
}

/* Four ranks of one model put their own shard of the same 64-block chain
 * (same keys) in per-rank namespaces, and check it under MATCH leases,
 * while a writer in another namespace forces eviction. */
static void test_tp_ranks_under_eviction(void **state)
{
	static const char *const tp_flags[] = {
		"--dram-capacity", "24MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "error", NULL,
	};
	static struct tp_rank ranks[TP_RANKS];
	static uint32_t tokens[TP_BLOCKS * TP_TOKENS_PER_BLOCK];
	static uint8_t keys[TP_BLOCKS][32];
	struct kvpool_client *c = NULL;
	pthread_t filler;
	size_t n = 0;
	uint64_t evictions;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&g.srv_tp, tp_flags), 0);
	for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++)
		tokens[i] = (uint32_t)(i * 2654435761u % 151643u);
	assert_int_equal(kvpool_block_hashes(tokens, TP_BLOCKS * TP_TOKENS_PER_BLOCK,
					     TP_TOKENS_PER_BLOCK, NULL, NULL, 0, keys, TP_BLOCKS,
					     &n),
			 0);
	assert_int_equal(n, TP_BLOCKS);
	tp_stop = 0;
	assert_int_equal(pthread_create(&filler, NULL, tp_filler_main, g.srv_tp.url), 0);
	for (int r = 0; r < TP_RANKS; r++) {
		ranks[r] = (struct tp_rank){ .rank = r, .url = g.srv_tp.url,
					     .keys = (const uint8_t(*)[32])keys };
		assert_int_equal(pthread_create(&ranks[r].thr, NULL, tp_rank_main, &ranks[r]), 0);
	}
	harness_sleep_ms((uint32_t)slow(3000));
	tp_stop = 1;
	for (int r = 0; r < TP_RANKS; r++)
		assert_int_equal(pthread_join(ranks[r].thr, NULL), 0);
	assert_int_equal(pthread_join(filler, NULL), 0);

	assert_int_equal(harness_client(&g.srv_tp, "filler", &c), 0);
	evictions = harness_stat_or_fail(c, "evictions");
	for (int r = 0; r < TP_RANKS; r++) {
		print_message("rank %d: %d rounds, %d full matches, %" PRIu64 " blocks matched, "
			      "%d blocks refused\n", r, ranks[r].rounds, ranks[r].full_matches,
			      ranks[r].matched_blocks, ranks[r].puts_refused);
		if (ranks[r].violations)
			fail_msg("%d violations; first: %s", ranks[r].violations,
				 ranks[r].first_violation);
		assert_true(ranks[r].rounds >= 2);
	}
	print_message("tp: %" PRIu64 " evictions\n", evictions);
	assert_true(evictions > 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(&g.srv_tp), 0);
}

/* ---- 6. prefix boundaries ------------------------------------------------------------------ */

/* Put the chain of `keys` (n blocks) with small payloads. */
static void put_chain_or_fail(struct kvpool_client *c, const uint8_t (*keys)[32], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t data[100];

		harness_fill(data, sizeof(data), harness_key_seed(keys[i]));
		assert_int_equal(kvpool_put_bytes(c, keys[i], i ? keys[i - 1] : NULL, data,
						  sizeof(data)),
				 0);
	}
}

/* Only full blocks are hashed: a 40-token prompt with 16-token blocks is
 * 2 keys and MATCH reports at most 32 tokens; a prompt that diverges
 * inside block 2 (token 20) matches exactly 1 block, one that diverges
 * inside block 1 matches none. */
static void test_prefix_boundaries(void **state)
{
	uint32_t tokens[48], other[48];
	uint8_t keys[3][32], okeys[3][32];
	size_t n = 0, m = 99;

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < 48; i++)
		tokens[i] = (uint32_t)(1000 + i * 7);
	assert_int_equal(kvpool_block_hashes(tokens, 40, 16, NULL, NULL, 0, keys, 3, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(kvpool_block_hashes(tokens, 47, 16, NULL, NULL, 0, okeys, 3, &n), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(okeys, keys, 2 * 32);
	assert_int_equal(kvpool_block_hashes(tokens, 48, 16, NULL, NULL, 0, okeys, 3, &n), 0);
	assert_int_equal(n, 3);
	/* Room for fewer keys than full blocks: refused, nothing written. */
	assert_int_equal(kvpool_block_hashes(tokens, 40, 16, NULL, NULL, 0, okeys, 1, &n), -ENOSPC);

	put_chain_or_fail(g.c, (const uint8_t(*)[32])keys, 2);
	assert_int_equal(kvpool_match(g.c, keys, 2, 0, &m), 0);
	assert_int_equal(m, 2);
	assert_true(m * 16 <= 40 && m * 16 == 32);

	memcpy(other, tokens, sizeof(other));
	other[20] ^= 1; /* inside block 2 (tokens 16..31) */
	assert_int_equal(kvpool_block_hashes(other, 40, 16, NULL, NULL, 0, okeys, 3, &n), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(okeys[0], keys[0], 32);
	assert_memory_not_equal(okeys[1], keys[1], 32);
	assert_int_equal(kvpool_match(g.c, okeys, n, 0, &m), 0);
	assert_int_equal(m, 1);

	memcpy(other, tokens, sizeof(other));
	other[15] ^= 1; /* the last token of block 1 */
	assert_int_equal(kvpool_block_hashes(other, 40, 16, NULL, NULL, 0, okeys, 3, &n), 0);
	assert_int_equal(kvpool_match(g.c, okeys, n, 0, &m), 0);
	assert_int_equal(m, 0);

	/* A divergence in the ignored partial block changes nothing. */
	memcpy(other, tokens, sizeof(other));
	other[39] ^= 1;
	assert_int_equal(kvpool_block_hashes(other, 40, 16, NULL, NULL, 0, okeys, 3, &n), 0);
	assert_int_equal(kvpool_match(g.c, okeys, n, 0, &m), 0);
	assert_int_equal(m, 2);
}

/* ---- 7. determinism across processes -------------------------------------------------------- */

#define HELPER_TOKENS 64
#define HELPER_BLOCK 16
#define HELPER_BLOCKS (HELPER_TOKENS / HELPER_BLOCK)

/* The helper process: compute the chain of the fixed prompt with `extra`,
 * print it as hex (one key a line), then in namespace ns either put every
 * block with payloads seeded by `seed` ("put") or check that each block is
 * there with those payloads ("check") or absent ("absent"). Exit 0 when
 * all went as asked. */
static int helper_main(const char *url, const char *ns, const char *extra, const char *action,
		       uint64_t seed)
{
	uint32_t tokens[HELPER_TOKENS];
	uint8_t keys[HELPER_BLOCKS][32], data[512], got[512];
	struct kvpool_client *c = NULL;
	size_t n = 0;
	int rc;

	for (int i = 0; i < HELPER_TOKENS; i++)
		tokens[i] = (uint32_t)(i * 31 + 7);
	rc = kvpool_block_hashes(tokens, HELPER_TOKENS, HELPER_BLOCK, NULL, extra,
				 extra ? strlen(extra) : 0, keys, HELPER_BLOCKS, &n);
	if (rc || n != HELPER_BLOCKS)
		return 2;
	for (size_t i = 0; i < n; i++) {
		for (int b = 0; b < 32; b++)
			printf("%02x", keys[i][b]);
		printf("\n");
	}
	fflush(stdout);
	if (kvpool_connect(url, ns, NULL, &c))
		return 3;
	for (size_t i = 0; i < n && !rc; i++) {
		uint64_t len = 0;

		harness_fill(data, sizeof(data), seed + i);
		if (!strcmp(action, "put")) {
			rc = kvpool_put_bytes(c, keys[i], i ? keys[i - 1] : NULL, data, sizeof(data));
		} else if (!strcmp(action, "check")) {
			rc = kvpool_get_bytes(c, keys[i], got, sizeof(got), &len);
			rc = rc ? rc : (len != sizeof(data) || memcmp(got, data, sizeof(data)));
		} else {
			rc = kvpool_get_bytes(c, keys[i], got, sizeof(got), &len) != -ENOENT;
		}
	}
	kvpool_close(c);
	return rc ? 4 : 0;
}

/* Run the helper; returns its stdout (free()) after checking it exited 0. */
static char *run_helper(const char *ns, const char *extra, const char *action, const char *seed)
{
	char exe[4096], *out = NULL;
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int status = -1;

	assert_true(len > 0);
	exe[len] = '\0';
	{
		char *const argv[] = { exe, "--chain-helper", g.srv.url, (char *)ns,
				       (char *)(extra ? extra : "-"), (char *)action, (char *)seed,
				       NULL };

		assert_int_equal(harness_run(argv, slow(10000), &out, &status), 0);
	}
	if (status != 0)
		fail_msg("helper %s %s %s exited %d", ns, action, extra ? extra : "-", status);
	assert_int_equal(strlen(out), HELPER_BLOCKS * 65);
	return out;
}

/* Two processes compute the same chain for the same tokens; other extra
 * bytes (LoRA id, salt) give other keys; the same keys in another
 * namespace are other blocks. */
static void test_determinism_across_processes(void **state)
{
	char *a, *b, *lora, *salt;

	(void)state;
	harness_need_server(&g.srv);
	a = run_helper("det-a", NULL, "put", "1000");
	b = run_helper("det-a", NULL, "check", "1000");
	assert_string_equal(a, b);
	lora = run_helper("det-a", "lora:7", "absent", "0");
	salt = run_helper("det-a", "tenant-salt-42", "absent", "0");
	for (int i = 0; i < HELPER_BLOCKS; i++) {
		assert_memory_not_equal(a + 65 * i, lora + 65 * i, 64);
		assert_memory_not_equal(a + 65 * i, salt + 65 * i, 64);
		assert_memory_not_equal(lora + 65 * i, salt + 65 * i, 64);
	}
	free(b);
	/* Same keys, another namespace: not there, then other bytes. */
	b = run_helper("det-b", NULL, "absent", "0");
	assert_string_equal(a, b);
	free(b);
	free(run_helper("det-b", NULL, "put", "2000"));
	free(run_helper("det-b", NULL, "check", "2000"));
	free(run_helper("det-a", NULL, "check", "1000"));
	free(a);
	free(lora);
	free(salt);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_huge_announcements),
		cmocka_unit_test(test_connection_storm),
		cmocka_unit_test(test_slow_uploads),
		cmocka_unit_test(test_size_boundaries),
		cmocka_unit_test(test_tp_ranks_under_eviction),
		cmocka_unit_test(test_prefix_boundaries),
		cmocka_unit_test(test_determinism_across_processes),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	if (argc == 7 && !strcmp(argv[1], "--chain-helper"))
		return helper_main(argv[2], argv[3], strcmp(argv[4], "-") ? argv[4] : NULL, argv[5],
				   strtoull(argv[6], NULL, 10));
	return cmocka_run_group_tests_name("integ_hostile", tests, group_setup, group_teardown);
}
