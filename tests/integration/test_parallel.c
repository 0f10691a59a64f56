/*
 * test_parallel.c - many clients at once (distinct and shared keys, all
 * byte-exact), and pipelining: many frames on one raw connection before
 * the first reply is read, replies in order with their request ids.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define THREADS 8
#define ROUNDS 40
#define BATCH 8
#define SHARED_KEYS 50
#define PIPE_FRAMES 64

#define MANY_CONNS 200

static struct {
	struct harness_server srv;
	struct harness_server limited; /* test_max_connections' own server */
} g;

static int group_setup(void **state)
{
	(void)state;
	return harness_group_start(&g.srv, harness_default_flags);
}

static int group_teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	harness_kill(&g.limited);
	return 0;
}

/* ---- many clients --------------------------------------------------------- */

struct worker {
	int id;
	pthread_t thread;
	int failures;
	char why[256];
	uint64_t blocks_checked;
};

/* Record a failure; cmocka asserts may not run off the test thread. */
static void worker_fail(struct worker *w, const char *fmt, ...)
{
	va_list ap;

	if (w->failures++ == 0) {
		va_start(ap, fmt);
		vsnprintf(w->why, sizeof(w->why), fmt, ap);
		va_end(ap);
	}
}

/* Block size from its key: 512 B .. ~12.5 KiB, odd sizes included. */
static size_t size_of_key(const uint8_t key[32])
{
	return 512 + (size_t)(harness_key_seed(key) % 12000);
}

/* Put one batch of BATCH chained blocks, then get them all back. */
static void worker_batch(struct worker *w, struct kvpool_client *c, int round)
{
	uint8_t keys[BATCH][32], *bufs[BATCH], *got[BATCH];
	struct iovec piov[BATCH], giov[BATCH];
	struct kvpool_put_block pb[BATCH];
	struct kvpool_get_block gb[BATCH];
	char tag[32];
	int st[BATCH], rc;

	snprintf(tag, sizeof(tag), "par-t%d", w->id);
	for (int i = 0; i < BATCH; i++) {
		size_t len;

		harness_key(keys[i], tag, (uint64_t)round * BATCH + i);
		len = size_of_key(keys[i]);
		bufs[i] = malloc(len);
		got[i] = malloc(len);
		harness_fill(bufs[i], len, harness_key_seed(keys[i]));
		piov[i] = (struct iovec){ .iov_base = bufs[i], .iov_len = len };
		giov[i] = (struct iovec){ .iov_base = got[i], .iov_len = len };
		pb[i] = (struct kvpool_put_block){
			.key = keys[i], .parent = i ? keys[i - 1] : NULL, .iov = &piov[i], .iovcnt = 1,
		};
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
	}
	rc = kvpool_put(c, pb, BATCH, st);
	if (rc)
		worker_fail(w, "thread %d round %d put: %s", w->id, round, kvpool_strerror(rc));
	rc = kvpool_get(c, gb, BATCH, st);
	if (rc)
		worker_fail(w, "thread %d round %d get: %s", w->id, round, kvpool_strerror(rc));
	for (int i = 0; i < BATCH; i++) {
		if (!rc && (gb[i].length != piov[i].iov_len ||
			    memcmp(got[i], bufs[i], piov[i].iov_len) != 0))
			worker_fail(w, "thread %d round %d block %d differs", w->id, round, i);
		else if (!rc)
			w->blocks_checked++;
		free(bufs[i]);
		free(got[i]);
	}
}

/* Put a key every thread puts (same bytes), then get it back. */
static void worker_shared(struct worker *w, struct kvpool_client *c, int n)
{
	uint8_t key[32], *buf, *got;
	uint64_t got_len = 0;
	size_t len;
	int rc;

	harness_key(key, "par-shared", (uint64_t)n);
	len = size_of_key(key);
	buf = malloc(len);
	got = malloc(len);
	harness_fill(buf, len, harness_key_seed(key));
	rc = kvpool_put_bytes(c, key, NULL, buf, len);
	if (rc)
		worker_fail(w, "thread %d shared %d put: %s", w->id, n, kvpool_strerror(rc));
	rc = kvpool_get_bytes(c, key, got, len, &got_len);
	if (rc)
		worker_fail(w, "thread %d shared %d get: %s", w->id, n, kvpool_strerror(rc));
	else if (got_len != len || memcmp(got, buf, len) != 0)
		worker_fail(w, "thread %d shared %d differs", w->id, n);
	else
		w->blocks_checked++;
	free(buf);
	free(got);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct kvpool_client *c = NULL;
	int rc;

	rc = harness_client(&g.srv, "parallel", &c);
	if (rc) {
		worker_fail(w, "thread %d connect: %s", w->id, kvpool_strerror(rc));
		return NULL;
	}
	for (int round = 0; round < ROUNDS; round++) {
		worker_batch(w, c, round);
		/* Threads walk the shared keys from different starting points. */
		worker_shared(w, c, (round + w->id * 7) % SHARED_KEYS);
		worker_shared(w, c, (round * 3 + w->id) % SHARED_KEYS);
	}
	kvpool_close(c);
	return NULL;
}

static void test_many_clients(void **state)
{
	struct worker w[THREADS];
	struct kvpool_client *c = NULL;
	uint8_t key[32];
	char tag[32];
	int st;

	(void)state;
	harness_need_server(&g.srv);
	memset(w, 0, sizeof(w));
	for (int i = 0; i < THREADS; i++) {
		w[i].id = i;
		assert_int_equal(pthread_create(&w[i].thread, NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_join(w[i].thread, NULL), 0);
	for (int i = 0; i < THREADS; i++) {
		if (w[i].failures)
			fail_msg("%d failures, first: %s", w[i].failures, w[i].why);
		assert_int_equal(w[i].blocks_checked, ROUNDS * (BATCH + 2));
	}

	/* Every distinct key is still there; shared keys are stored once. */
	assert_int_equal(harness_client(&g.srv, "parallel", &c), 0);
	for (int t = 0; t < THREADS; t++) {
		snprintf(tag, sizeof(tag), "par-t%d", t);
		for (int n = 0; n < ROUNDS * BATCH; n++) {
			harness_key(key, tag, (uint64_t)n);
			st = 1;
			assert_int_equal(kvpool_exists(c, (const uint8_t(*)[32])key, 1, &st), 0);
			assert_int_equal(st, 0);
		}
	}
	{
		/* Shared keys touched: the union of both walks. */
		int touched[SHARED_KEYS] = { 0 }, n_touched = 0;

		for (int t = 0; t < THREADS; t++)
			for (int r = 0; r < ROUNDS; r++) {
				touched[(r + t * 7) % SHARED_KEYS] = 1;
				touched[(r * 3 + t) % SHARED_KEYS] = 1;
			}
		for (int i = 0; i < SHARED_KEYS; i++)
			n_touched += touched[i];
		assert_int_equal(harness_ns_stat_or_fail(c, "parallel", "blocks"),
				 THREADS * ROUNDS * BATCH + n_touched);
	}
	assert_int_equal(harness_ns_stat_or_fail(c, "parallel", "get_misses"), 0);
	assert_int_equal(harness_ns_stat_or_fail(c, "parallel", "get_hits"),
			 THREADS * ROUNDS * (BATCH + 2));
	assert_int_equal(harness_stat_or_fail(c, "evictions"), 0);
	kvpool_close(c);
}

/* ---- pipelining ------------------------------------------------------------ */

struct pipe_req {
	uint8_t op;
	uint64_t id;
	uint8_t key[32];
	size_t len; /* PUT: payload bytes */
};

/* Append one encoded frame to out (grown by the caller to fit). */
static size_t encode_frame(uint8_t *out, uint8_t op, uint64_t id, const uint8_t *body,
			   uint32_t body_bytes, const uint8_t *payload, uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = op,
		.body_bytes = body_bytes, .request_id = id, .payload_bytes = payload_bytes,
	};

	proto_header_encode(&h, out);
	if (body_bytes)
		memcpy(out + PROTO_HEADER_BYTES, body, body_bytes);
	if (payload_bytes)
		memcpy(out + PROTO_HEADER_BYTES + body_bytes, payload, payload_bytes);
	return PROTO_HEADER_BYTES + body_bytes + payload_bytes;
}

static size_t encode_put(uint8_t *out, struct pipe_req *r)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES];
	struct proto_put_entry e = { .length = r->len };
	uint8_t *payload = malloc(r->len);
	size_t n;

	harness_fill(payload, r->len, harness_key_seed(r->key));
	memcpy(e.key, r->key, 32);
	e.checksum = harness_xxh3(payload, r->len);
	proto_batch_encode_prefix(body, 1, 0);
	proto_put_entry_encode(body, 0, &e);
	n = encode_frame(out, PROTO_OP_PUT, r->id, body, sizeof(body), payload, r->len);
	free(payload);
	return n;
}

static size_t encode_key_op(uint8_t *out, uint8_t op, uint64_t id, const uint8_t key[32])
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_KEY_ENTRY_BYTES];

	proto_batch_encode_prefix(body, 1, 0);
	proto_key_entry_encode(body, 0, key);
	return encode_frame(out, op, id, body, sizeof(body), NULL, 0);
}

static size_t encode_get(uint8_t *out, uint64_t id, const uint8_t key[32], uint64_t max_len)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_GET_ENTRY_BYTES];
	struct proto_get_entry e = { .max_length = max_len };

	memcpy(e.key, key, 32);
	proto_batch_encode_prefix(body, 1, 0);
	proto_get_entry_encode(body, 0, &e);
	return encode_frame(out, PROTO_OP_GET, id, body, sizeof(body), NULL, 0);
}

/* Check the reply to one pipelined request. */
static void check_pipe_reply(const struct pipe_req *r, const struct harness_frame *f)
{
	struct proto_result res;

	assert_int_equal(f->h.request_id, r->id);
	assert_int_equal(f->h.opcode, r->op);
	assert_int_equal(f->h.flags & PROTO_FLAG_REPLY, PROTO_FLAG_REPLY);
	assert_int_equal(f->h.status, PROTO_STATUS_OK);
	if (r->op == PROTO_OP_PING)
		return;
	assert_int_equal(harness_reply_result(f, 0, &res), 0);
	assert_int_equal(res.status, PROTO_STATUS_OK);
	assert_int_equal(res.length, r->len);
	if (r->op == PROTO_OP_PUT) {
		uint8_t *payload = malloc(r->len);

		harness_fill(payload, r->len, harness_key_seed(r->key));
		assert_int_equal(res.checksum, harness_xxh3(payload, r->len));
		free(payload);
	}
}

/* 64 frames (PUT, EXISTS of the block just put, PING, ...) sent back to
 * back; then 64 replies read in order. Then 16 GETs the same way. */
static void test_pipelining(void **state)
{
	struct pipe_req reqs[PIPE_FRAMES];
	struct kvpool_client *c = NULL;
	uint8_t *wire, *got;
	size_t off = 0, n_puts = 0;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	wire = malloc(PIPE_FRAMES * (PROTO_HEADER_BYTES + 200 + 8192));
	assert_non_null(wire);
	for (int i = 0; i < PIPE_FRAMES; i++) {
		struct pipe_req *r = &reqs[i];

		r->id = 0x51000 + (uint64_t)i * 7; /* not sequential: echo is checked */
		if (i % 3 == 0) {
			r->op = PROTO_OP_PUT;
			harness_key(r->key, "pipe", (uint64_t)i);
			r->len = 4000 + (size_t)i * 13;
			off += encode_put(wire + off, r);
			n_puts++;
		} else if (i % 3 == 1) {
			r->op = PROTO_OP_EXISTS;
			memcpy(r->key, reqs[i - 1].key, 32);
			r->len = reqs[i - 1].len;
			off += encode_key_op(wire + off, PROTO_OP_EXISTS, r->id, r->key);
		} else {
			r->op = PROTO_OP_PING;
			off += encode_frame(wire + off, PROTO_OP_PING, r->id, NULL, 0, NULL, 0);
		}
	}
	fd = harness_raw_session_or_fail(g.srv.port, "parallel-pipe", NULL);
	assert_int_equal(harness_send_all(fd, wire, off), 0);
	for (int i = 0; i < PIPE_FRAMES; i++) {
		struct harness_frame f;

		assert_int_equal(harness_read_frame(fd, 10000, &f), 0);
		check_pipe_reply(&reqs[i], &f);
		harness_frame_free(&f);
	}

	/* GETs pipelined: each reply carries its own block's bytes. */
	off = 0;
	for (int i = 0; i < PIPE_FRAMES; i += 3)
		off += encode_get(wire + off, 0x77000 + (uint64_t)i, reqs[i].key, 1 << 20);
	assert_int_equal(harness_send_all(fd, wire, off), 0);
	for (int i = 0; i < PIPE_FRAMES; i += 3) {
		struct harness_frame f;
		struct proto_result res;

		assert_int_equal(harness_read_frame(fd, 10000, &f), 0);
		assert_int_equal(f.h.request_id, 0x77000 + (uint64_t)i);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		assert_int_equal(harness_reply_result(&f, 0, &res), 0);
		assert_int_equal(res.status, PROTO_STATUS_OK);
		assert_int_equal(res.length, reqs[i].len);
		assert_int_equal(f.h.payload_bytes, reqs[i].len);
		got = malloc(reqs[i].len);
		harness_fill(got, reqs[i].len, harness_key_seed(reqs[i].key));
		assert_memory_equal(f.payload, got, reqs[i].len);
		assert_int_equal(res.checksum, harness_xxh3(got, reqs[i].len));
		free(got);
		harness_frame_free(&f);
	}
	close(fd);
	free(wire);

	/* The library sees the same blocks. */
	assert_int_equal(harness_client(&g.srv, "parallel-pipe", &c), 0);
	assert_int_equal(harness_ns_stat_or_fail(c, "parallel-pipe", "blocks"), n_puts);
	kvpool_close(c);
}

/* Hundreds of connections open at once, all served; when they close the
 * server's connection count comes back down. */
static void test_many_connections(void **state)
{
	static int fds[MANY_CONNS];
	struct kvpool_client *c = NULL;
	uint64_t current0, total0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "parallel-conns", &c), 0);
	current0 = harness_wait_stat_or_fail(c, "connections.current", 1, 2000);
	total0 = harness_stat_or_fail(c, "connections.total");
	for (int i = 0; i < MANY_CONNS; i++) {
		fds[i] = -1;
		assert_int_equal(harness_raw_connect(g.srv.port, &fds[i]), 0);
	}
	/* HELLO and PING on every one, in reverse order of connecting. */
	for (int i = MANY_CONNS - 1; i >= 0; i--) {
		struct harness_frame f;

		assert_int_equal(harness_raw_hello(fds[i], "parallel-conns", NULL), 0);
		assert_int_equal(harness_send_frame(fds[i], PROTO_OP_PING, (uint64_t)i, NULL, 0, NULL,
						    0),
				 0);
		assert_int_equal(harness_read_frame(fds[i], 5000, &f), 0);
		assert_int_equal(f.h.request_id, (uint64_t)i);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		harness_frame_free(&f);
	}
	assert_int_equal(harness_stat_or_fail(c, "connections.current"), current0 + MANY_CONNS);
	assert_int_equal(harness_stat_or_fail(c, "connections.total") - total0, MANY_CONNS);
	for (int i = 0; i < MANY_CONNS; i++)
		close(fds[i]);
	assert_int_equal(harness_wait_stat_or_fail(c, "connections.current", current0, 3000),
			 current0);
	kvpool_close(c);
}

/* Over --max-connections: a connection-level BUSY naming the limit, then
 * a close; a slot that frees up can be used again. */
static void test_max_connections(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "error", "--max-connections", "4", NULL,
	};
	struct kvpool_client *c = NULL;
	struct harness_frame f;
	int fds[3], extra = -1;
	uint64_t rejected0;
	char msg[1100];

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&g.limited, flags), 0);
	assert_int_equal(harness_client(&g.limited, "parallel-max", &c), 0);
	/* The start-up probe's connection may not be gone yet. */
	assert_int_equal(harness_wait_stat_or_fail(c, "connections.current", 1, 2000), 1);
	rejected0 = harness_stat_or_fail(c, "connections.rejected");
	for (int i = 0; i < 3; i++)
		fds[i] = harness_raw_session_or_fail(g.limited.port, "parallel-max", NULL);
	assert_int_equal(harness_raw_connect(g.limited.port, &extra), 0);
	assert_int_equal(harness_read_frame(extra, 5000, &f), 0);
	assert_int_equal(f.h.opcode, 0);
	assert_int_equal(f.h.request_id, 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BUSY);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	harness_frame_free(&f);
	if (!strstr(msg, "max_connections"))
		fail_msg("BUSY message \"%s\" does not name max_connections", msg);
	assert_int_equal(harness_wait_closed(extra, 5000), 0);
	close(extra);
	assert_int_equal(harness_stat_or_fail(c, "connections.rejected") - rejected0, 1);
	/* The connections that got in still work. */
	assert_int_equal(kvpool_ping(c, NULL), 0);

	close(fds[0]);
	assert_int_equal(harness_wait_stat_or_fail(c, "connections.current", 3, 2000), 3);
	extra = harness_raw_session_or_fail(g.limited.port, "parallel-max", NULL);
	close(extra);
	close(fds[1]);
	close(fds[2]);
	kvpool_close(c);
	assert_int_equal(harness_stop(&g.limited), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_clients),
		cmocka_unit_test(test_pipelining),
		cmocka_unit_test(test_many_connections),
		cmocka_unit_test(test_max_connections),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_parallel", tests, group_setup, group_teardown);
}
