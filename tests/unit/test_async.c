/*
 * test_async.c - libkvpool's asynchronous core against the fake server
 * (fake_server.h): completions in request order and out of it (a request
 * refused BUSY finishing after later ones), replies out of request order
 * (a protocol error),
 * BUSY retries of PUT blocks, a timeout with the server silent, replies
 * with wrong ids, a corrupted and a truncated GET (never reported as
 * data), the event fd staying readable until completions are polled,
 * and a refusal's message reaching kvpool_last_server_message.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_server.h"
#include "kvpool.h"

#define BLOCK_BYTES 1000
#define N 4

struct env {
	struct fake fk;
	struct kvpool_client *c;
	uint8_t keys[N][KVPOOL_KEY_BYTES];
	uint8_t data[N][BLOCK_BYTES];
	uint8_t back[N][BLOCK_BYTES];
	struct iovec iov[N];
	struct kvpool_get_block gb[N];
	int st[N];
	uint64_t ids[N];
};

static int setup(void **state)
{
	struct kvpool_options opts = { .timeout_ms = 3000 };
	struct env *e = calloc(1, sizeof(*e));
	char url[64];

	if (!e)
		return -1;
	e->fk.limits = fake_default_limits;
	atomic_store(&e->fk.mode, MODE_NORMAL);
	fake_start(&e->fk, 0);
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", (unsigned)e->fk.port);
	if (kvpool_connect(url, "async-ns", &opts, &e->c)) {
		fake_stop(&e->fk);
		free(e);
		return -1;
	}
	for (int i = 0; i < N; i++) {
		memset(e->keys[i], 0, KVPOOL_KEY_BYTES);
		e->keys[i][0] = 0xA5;
		e->keys[i][1] = (uint8_t)i;
		for (int j = 0; j < BLOCK_BYTES; j++)
			e->data[i][j] = (uint8_t)(i * 13 + j * 7);
		assert_int_equal(kvpool_put_bytes(e->c, e->keys[i], NULL, e->data[i], BLOCK_BYTES), 0);
		e->iov[i] = (struct iovec){ e->back[i], BLOCK_BYTES };
		e->gb[i] = (struct kvpool_get_block){ .key = e->keys[i], .iov = &e->iov[i], .iovcnt = 1 };
	}
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	kvpool_close(e->c);
	fake_stop(&e->fk);
	fake_release(&e->fk);
	free(e);
	return 0;
}

static void submit_gets(struct env *e)
{
	memset(e->back, 0, sizeof(e->back));
	for (int i = 0; i < N; i++)
		assert_int_equal(kvpool_submit_get(e->c, &e->gb[i], 1, &e->st[i], (uint64_t)i,
						   &e->ids[i]), 0);
}

/* Poll one completion at a time until n have come; their tags in order. */
static void poll_tags(struct env *e, int n, uint64_t *tags, struct kvpool_completion *comp)
{
	for (int got = 0; got < n;) {
		int r = kvpool_poll(e->c, &comp[got], 1, 5000);

		assert_int_equal(r, 1);
		tags[got] = comp[got].tag;
		got++;
	}
}

static void test_in_order(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	uint64_t tags[N];

	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++) {
		assert_int_equal(tags[i], i);
		assert_int_equal(comp[i].id, e->ids[i]);
		assert_int_equal(comp[i].status, 0);
		assert_int_equal(e->gb[i].length, BLOCK_BYTES);
		assert_memory_equal(e->back[i], e->data[i], BLOCK_BYTES);
	}
}

/* A server that answers newest first breaks the protocol (replies come in
 * request order): every request fails -EPROTO, none takes another's
 * bytes; the next submit reconnects. */
static void test_replies_out_of_order(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	uint64_t tags[N];

	e->fk.hold = N;
	atomic_store(&e->fk.mode, MODE_HOLD_REVERSE);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	atomic_store(&e->fk.mode, MODE_NORMAL);
	for (int i = 0; i < N; i++) {
		assert_int_equal(comp[i].status, -EPROTO);
		assert_int_equal(e->st[i], -EPROTO);
	}
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++) {
		assert_int_equal(tags[i], i);
		assert_int_equal(comp[i].status, 0);
	}
}

/* The first request is refused BUSY: it waits for its retry while the
 * later ones complete, then completes itself. */
static void test_busy_completes_last(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	struct kvpool_counters k0, k1;
	uint64_t tags[N];

	assert_int_equal(kvpool_get_counters(e->c, &k0), 0);
	atomic_store(&e->fk.refuse_next, 1);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	assert_int_equal(tags[N - 1], 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(comp[i].status, 0);
		assert_memory_equal(e->back[i], e->data[i], BLOCK_BYTES);
	}
	assert_int_equal(kvpool_get_counters(e->c, &k1), 0);
	assert_int_equal(k1.busy_retries, k0.busy_retries + 1);
}

/* PUT blocks answered BUSY are sent again; the request reports success. */
static void test_put_busy_retry(void **state)
{
	struct env *e = *state;
	uint8_t key[KVPOOL_KEY_BYTES] = { 0x77 };
	struct iovec iov = { e->data[0], BLOCK_BYTES };
	struct kvpool_put_block pb = { .key = key, .iov = &iov, .iovcnt = 1 };
	struct kvpool_completion comp;
	int st = 1;
	uint64_t id;

	atomic_store(&e->fk.busy_puts, 2);
	assert_int_equal(kvpool_submit_put(e->c, &pb, 1, &st, 9, &id), 0);
	assert_int_equal(kvpool_poll(e->c, &comp, 1, 5000), 1);
	assert_int_equal(comp.status, 0);
	assert_int_equal(st, 0);
	assert_int_equal(comp.tag, 9);
	assert_int_equal(comp.op, KVPOOL_OP_PUT);
}

/* A silent server: the requests time out; the handle reconnects after. */
static void test_timeout(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	uint64_t tags[N];
	int timed_out = 0;

	kvpool_set_timeout(e->c, 300);
	atomic_store(&e->fk.mode, MODE_SILENT);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++) {
		assert_true(comp[i].status == -ETIMEDOUT || comp[i].status == -ECONNRESET);
		assert_int_equal(e->st[tags[i]], comp[i].status);
		timed_out += comp[i].status == -ETIMEDOUT;
	}
	assert_true(timed_out >= 1);
	atomic_store(&e->fk.mode, MODE_NORMAL);
	kvpool_set_timeout(e->c, 3000);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++)
		assert_int_equal(comp[i].status, 0);
}

/* Replies with ids we never sent: a broken stream fails everything. */
static void test_wrong_id(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	uint64_t tags[N];

	atomic_store(&e->fk.mode, MODE_WRONG_ID);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++)
		assert_int_equal(comp[i].status, -EPROTO);
	atomic_store(&e->fk.mode, MODE_NORMAL);
}

/* A flipped payload byte: -EBADMSG, counted; a truncated reply: the
 * connection error, never 0 for a block whose bytes did not all come. */
static void test_corrupt_and_truncated(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[N];
	struct kvpool_counters k;
	uint64_t tags[N];

	atomic_store(&e->fk.mode, MODE_CORRUPT_GET);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++) {
		assert_int_equal(comp[i].status, -EBADMSG);
		assert_int_equal(e->st[i], -EBADMSG);
	}
	assert_int_equal(kvpool_get_counters(e->c, &k), 0);
	assert_true(k.checksum_errors >= N);

	atomic_store(&e->fk.mode, MODE_TRUNCATE_GET);
	submit_gets(e);
	poll_tags(e, N, tags, comp);
	for (int i = 0; i < N; i++) {
		assert_true(comp[i].status != 0);
		assert_true(e->st[tags[i]] != 0);
	}
	atomic_store(&e->fk.mode, MODE_NORMAL);
}

/* The event fd is readable while a completion waits, until it is polled. */
static void test_event_fd_ready(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp;
	struct pollfd p = { .events = POLLIN };
	int got = 0;

	p.fd = kvpool_event_fd(e->c);
	assert_true(p.fd >= 0);
	assert_int_equal(kvpool_submit_get(e->c, &e->gb[0], 1, NULL, 1, &e->ids[0]), 0);
	/* Wait without polling: the reply makes the descriptor readable. */
	assert_int_equal(poll(&p, 1, 5000), 1);
	while (!got) {
		assert_int_equal(poll(&p, 1, 5000), 1);
		got = kvpool_poll(e->c, &comp, 1, 0);
	}
	assert_int_equal(comp.status, 0);
	assert_int_equal(poll(&p, 1, 0), 0);
	assert_int_equal(kvpool_event_fd(NULL), -EINVAL);
	assert_int_equal(kvpool_cancel(NULL, 1), -EINVAL);
	assert_int_equal(kvpool_poll(NULL, &comp, 1, 0), -EINVAL);
	assert_int_equal(kvpool_poll(e->c, &comp, 1, -2), -EINVAL);
}

/* A refusal that arrives through the asynchronous calls sets the polling
 * thread's kvpool_last_server_message, as a synchronous call's does (the
 * asynchronous core used to decode error replies with its own copy, which
 * did not); a completion without one clears it, as a call without one does. */
static void test_refusal_message(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp;
	uint64_t id;

	kvpool_set_busy_tries(e->c, 1);
	atomic_store(&e->fk.refuse_next, 1);
	assert_int_equal(kvpool_submit_get(e->c, &e->gb[0], 1, &e->st[0], 9, &id), 0);
	assert_int_equal(kvpool_poll(e->c, &comp, 1, 5000), 1);
	assert_int_equal(comp.status, -EAGAIN);
	assert_int_equal(e->st[0], -EAGAIN);
	assert_string_equal(kvpool_last_server_message(), FAKE_BUSY_MESSAGE);
	assert_int_equal(kvpool_submit_get(e->c, &e->gb[0], 1, &e->st[0], 10, &id), 0);
	assert_int_equal(kvpool_poll(e->c, &comp, 1, 5000), 1);
	assert_int_equal(comp.status, 0);
	assert_string_equal(kvpool_last_server_message(), "");
}

/* A poll that returns several completions keeps the first refusal's
 * words (a later completion without any used to clear them, so a batch
 * poll lost every message); a poll or submit that meets no refusal
 * leaves "" (an older refusal's words used to stay). */
static void test_refusal_message_in_a_batch(void **state)
{
	struct env *e = *state;
	struct kvpool_completion comp[3];
	uint64_t id;
	int got = 0;

	kvpool_set_busy_tries(e->c, 1);
	atomic_store(&e->fk.refuse_next, 1);
	for (int i = 0; i < 3; i++)
		assert_int_equal(kvpool_submit_get(e->c, &e->gb[i], 1, &e->st[i], (uint64_t)i,
						   &id), 0);
	/* a synchronous call queues behind them: when it returns, all three
	 * are finished and wait to be polled together */
	assert_int_equal(kvpool_get(e->c, &e->gb[3], 1, &e->st[3]), 0);
	got = kvpool_poll(e->c, comp, 3, 5000);
	assert_int_equal(got, 3);
	assert_int_equal(comp[0].status, -EAGAIN);
	assert_int_equal(comp[1].status, 0);
	assert_int_equal(comp[2].status, 0);
	assert_string_equal(kvpool_last_server_message(), FAKE_BUSY_MESSAGE);
	/* nothing refused since: a poll with nothing to return says "" */
	assert_int_equal(kvpool_poll(e->c, comp, 3, 0), 0);
	assert_string_equal(kvpool_last_server_message(), "");
	/* and so does a submit after a refusal */
	atomic_store(&e->fk.refuse_next, 1);
	assert_int_equal(kvpool_submit_get(e->c, &e->gb[0], 1, &e->st[0], 9, &id), 0);
	assert_int_equal(kvpool_poll(e->c, comp, 1, 5000), 1);
	assert_string_equal(kvpool_last_server_message(), FAKE_BUSY_MESSAGE);
	assert_int_equal(kvpool_submit_get(e->c, &e->gb[1], 1, &e->st[1], 10, &id), 0);
	assert_string_equal(kvpool_last_server_message(), "");
	assert_int_equal(kvpool_poll(e->c, comp, 1, 5000), 1);
	assert_int_equal(comp[0].status, 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_in_order),
		T(test_replies_out_of_order),
		T(test_busy_completes_last),
		T(test_put_busy_retry),
		T(test_timeout),
		T(test_wrong_id),
		T(test_corrupt_and_truncated),
		T(test_event_fd_ready),
		T(test_refusal_message),
		T(test_refusal_message_in_a_batch),
	};

	return cmocka_run_group_tests_name("unit_async", tests, NULL, NULL);
}
