/*
 * test_async.c - libkvpool's asynchronous API against a real kvpoold:
 * every op round trip, many requests in flight, the bound on them
 * (-EAGAIN), cancel (guard pages catch any touch of a cancelled
 * request's buffers), a server killed with requests in flight (each one
 * fails cleanly; its buffers are write-protected the moment its
 * completion is polled, so a late write would crash the test), the event
 * fd with poll(2), synchronous and whole-pool calls while asynchronous
 * ones run, and several threads submitting while another polls and two
 * more make blocking calls on the same handle (run under ThreadSanitizer
 * by make test-tsan).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define SMALL_BYTES 4096
#define BIG_BYTES (1u << 20)
#define N_REQ 32

static struct {
	struct harness_server srv;
	struct kvpool_client *c; /* namespace "async" */
} g;

static int group_setup(void **state)
{
	(void)state;
	if (harness_group_start(&g.srv, harness_default_flags))
		return -1;
	return harness_group_client(&g.srv, "async", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	return 0;
}

/* Page-aligned memory that can be protected as a whole. */
static uint8_t *map_bytes(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	return p;
}

/* Poll until `want` completions have come (fails after 20 s). */
static int poll_all(struct kvpool_client *c, struct kvpool_completion *out, int want)
{
	int got = 0;

	for (int tries = 0; got < want && tries < 200; tries++) {
		int n = kvpool_poll(c, out + got, want - got, 100);

		assert_true(n >= 0);
		got += n;
	}
	assert_int_equal(got, want);
	return got;
}

static void put_one(struct kvpool_client *c, const char *tag, uint64_t n, const void *buf,
		    size_t len)
{
	uint8_t key[32];

	harness_key(key, tag, n);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, buf, len), 0);
}

/* PUT, GET, EXISTS, MATCH (with a lease) and DELETE, each N_REQ requests in
 * flight at once; every completion carries its tag and the twin's result. */
static void test_roundtrip(void **state)
{
	static uint8_t data[N_REQ][SMALL_BYTES], back[N_REQ][SMALL_BYTES];
	static uint8_t keys[N_REQ][32];
	struct kvpool_put_block pb[N_REQ];
	struct kvpool_get_block gb[N_REQ];
	struct iovec piov[N_REQ], giov[N_REQ];
	struct kvpool_completion comp[N_REQ];
	int pst[N_REQ], gst[N_REQ], est[N_REQ];
	uint64_t id;
	int seen[N_REQ];

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < N_REQ; i++) {
		harness_key(keys[i], "rt", (uint64_t)i);
		harness_fill(data[i], SMALL_BYTES, (uint64_t)i + 1);
		piov[i] = (struct iovec){ data[i], SMALL_BYTES };
		/* a chain: each block's parent is the one before */
		pb[i] = (struct kvpool_put_block){ .key = keys[i], .parent = i ? keys[i - 1] : NULL,
						   .iov = &piov[i], .iovcnt = 1 };
		assert_int_equal(kvpool_submit_put(g.c, &pb[i], 1, &pst[i], 100 + (uint64_t)i, &id), 0);
		assert_true(id != 0);
	}
	assert_int_equal(kvpool_inflight(g.c), N_REQ);
	poll_all(g.c, comp, N_REQ);
	assert_int_equal(kvpool_inflight(g.c), 0);
	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < N_REQ; i++) {
		int k = (int)(comp[i].tag - 100);

		assert_true(k >= 0 && k < N_REQ && !seen[k]);
		seen[k] = 1;
		assert_int_equal(comp[i].op, KVPOOL_OP_PUT);
		assert_int_equal(comp[i].status, 0);
		assert_int_equal(pst[k], 0);
		assert_int_equal(comp[i].count, 1);
	}

	memset(back, 0, sizeof(back));
	for (int i = 0; i < N_REQ; i++) {
		giov[i] = (struct iovec){ back[i], SMALL_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
		assert_int_equal(kvpool_submit_get(g.c, &gb[i], 1, &gst[i], (uint64_t)i, &id), 0);
	}
	poll_all(g.c, comp, N_REQ);
	for (int i = 0; i < N_REQ; i++) {
		assert_int_equal(comp[i].status, 0);
		assert_int_equal(comp[i].op, KVPOOL_OP_GET);
		assert_int_equal(gst[i], 0);
		assert_int_equal(gb[i].length, SMALL_BYTES);
		assert_memory_equal(back[i], data[i], SMALL_BYTES);
	}

	/* One request of many blocks (split into several frames). */
	memset(back, 0, sizeof(back));
	for (int i = 0; i < N_REQ; i++)
		gb[i].length = 0;
	assert_int_equal(kvpool_submit_get(g.c, gb, N_REQ, gst, 7, &id), 0);
	poll_all(g.c, comp, 1);
	assert_int_equal(comp[0].id, id);
	assert_int_equal(comp[0].count, N_REQ);
	assert_int_equal(comp[0].status, 0);
	for (int i = 0; i < N_REQ; i++)
		assert_memory_equal(back[i], data[i], SMALL_BYTES);

	/* EXISTS with one unknown key; MATCH over the chain with a lease. */
	harness_key(keys[N_REQ - 1], "rt-missing", 0);
	assert_int_equal(kvpool_submit_exists(g.c, keys, N_REQ, est, 1, &id), 0);
	assert_int_equal(kvpool_submit_match(g.c, keys, N_REQ, 500, 2, &id), 0);
	poll_all(g.c, comp, 2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(comp[i].status, 0);
		if (comp[i].op == KVPOOL_OP_MATCH) {
			assert_int_equal(comp[i].tag, 2);
			assert_int_equal(comp[i].matched, N_REQ - 1);
		} else {
			assert_int_equal(comp[i].op, KVPOOL_OP_EXISTS);
		}
	}
	for (int i = 0; i < N_REQ - 1; i++)
		assert_int_equal(est[i], 0);
	assert_int_equal(est[N_REQ - 1], -ENOENT);

	/* DELETE of the head removes the chain. */
	harness_key(keys[0], "rt", 0);
	assert_int_equal(kvpool_submit_delete(g.c, keys, 1, NULL, 3, &id), 0);
	poll_all(g.c, comp, 1);
	assert_int_equal(comp[0].status, 0);
	harness_check_absent_or_fail(g.c, keys[5]);

	/* Bad arguments: nothing submitted. */
	assert_int_equal(kvpool_submit_get(g.c, NULL, 1, NULL, 0, &id), -EINVAL);
	assert_int_equal(kvpool_submit_exists(g.c, keys, 1, NULL, 0, &id), -EINVAL);
	assert_int_equal(kvpool_submit_match(g.c, keys, 1, 0, 0, NULL), -EINVAL);
	assert_int_equal(kvpool_poll(g.c, comp, 0, 0), -EINVAL);
	assert_int_equal(kvpool_inflight(g.c), 0);
	/* Nothing in flight: a poll that would wait forever returns. */
	assert_int_equal(kvpool_poll(g.c, comp, 1, -1), 0);
}

/* max_inflight bounds the requests from submit to poll; -EAGAIN beyond. */
static void test_full_queue(void **state)
{
	static uint8_t buf[8][SMALL_BYTES];
	struct kvpool_get_block gb[8];
	struct iovec iov[8];
	struct kvpool_completion comp[8];
	uint8_t key[32];
	uint64_t id;

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(buf[0], SMALL_BYTES, 5);
	put_one(g.c, "fq", 0, buf[0], SMALL_BYTES);
	harness_key(key, "fq", 0);
	assert_int_equal(kvpool_set_max_inflight(g.c, 4), 0);
	for (int i = 0; i < 8; i++) {
		iov[i] = (struct iovec){ buf[i], SMALL_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = key, .iov = &iov[i], .iovcnt = 1 };
	}
	for (int i = 0; i < 4; i++)
		assert_int_equal(kvpool_submit_get(g.c, &gb[i], 1, NULL, (uint64_t)i, &id), 0);
	assert_int_equal(kvpool_submit_get(g.c, &gb[4], 1, NULL, 4, &id), -EAGAIN);
	assert_int_equal(kvpool_set_max_inflight(g.c, 8), -EBUSY);
	/* Finished but not polled still counts. */
	usleep(100 * 1000);
	assert_int_equal(kvpool_submit_get(g.c, &gb[4], 1, NULL, 4, &id), -EAGAIN);
	assert_int_equal(kvpool_poll(g.c, comp, 1, 5000), 1);
	assert_int_equal(comp[0].status, 0);
	assert_int_equal(kvpool_submit_get(g.c, &gb[4], 1, NULL, 4, &id), 0);
	poll_all(g.c, comp, 4);
	assert_int_equal(kvpool_set_max_inflight(g.c, 0), 0);
	assert_int_equal(kvpool_set_max_inflight(g.c, KVPOOL_MAX_INFLIGHT_LIMIT + 1), -EINVAL);
}

/* Cancelled requests: -ECANCELED, and their buffers (protected right after
 * the cancel) are never touched again, while the others finish. */
static void test_cancel(void **state)
{
	enum { N = 6 };
	uint8_t *src = map_bytes(BIG_BYTES);
	uint8_t *dst[N];
	struct kvpool_get_block gb[N];
	struct iovec iov[N];
	struct kvpool_completion comp[N + 1];
	int st[N], cancelled = 0, got = 0;
	uint64_t ids[N], pid;
	uint8_t key[32];

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(src, BIG_BYTES, 9);
	put_one(g.c, "cancel", 0, src, BIG_BYTES);
	harness_key(key, "cancel", 0);
	for (int i = 0; i < N; i++) {
		dst[i] = map_bytes(BIG_BYTES);
		iov[i] = (struct iovec){ dst[i], BIG_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = key, .iov = &iov[i], .iovcnt = 1 };
		assert_int_equal(kvpool_submit_get(g.c, &gb[i], 1, &st[i], (uint64_t)i, &ids[i]), 0);
	}
	/* Cancel the odd ones, some probably half received. */
	for (int i = 1; i < N; i += 2) {
		int rc = kvpool_cancel(g.c, ids[i]);

		assert_true(rc == 0 || rc == -ENOENT);
		if (rc == 0) {
			cancelled++;
			assert_int_equal(mprotect(dst[i], BIG_BYTES, PROT_NONE), 0);
		}
		assert_int_equal(kvpool_cancel(g.c, ids[i]), -ENOENT);
	}
	/* A cancelled PUT: its source is unreadable from now on. */
	{
		uint8_t pkey[32];
		struct iovec piov = { src, BIG_BYTES };
		struct kvpool_put_block pb = { .key = pkey, .iov = &piov, .iovcnt = 1 };
		int rc;

		harness_key(pkey, "cancel-put", 0);
		assert_int_equal(kvpool_submit_put(g.c, &pb, 1, NULL, 99, &pid), 0);
		rc = kvpool_cancel(g.c, pid);
		assert_true(rc == 0 || rc == -ENOENT);
		if (rc == 0)
			assert_int_equal(mprotect(src, BIG_BYTES, PROT_NONE), 0);
		while (got < N + 1) {
			int n = kvpool_poll(g.c, comp + got, N + 1 - got, 5000);

			assert_true(n > 0);
			got += n;
		}
	}
	for (int i = 0; i < N + 1; i++) {
		if (comp[i].id == pid) {
			assert_true(comp[i].status == 0 || comp[i].status == -ECANCELED);
			continue;
		}
		if (comp[i].status == -ECANCELED) {
			assert_true(comp[i].tag % 2 == 1);
			cancelled--;
			continue;
		}
		assert_int_equal(comp[i].status, 0);
		mprotect(src, BIG_BYTES, PROT_READ);
		assert_memory_equal(dst[comp[i].tag], src, BIG_BYTES);
	}
	assert_int_equal(cancelled, 0);
	assert_int_equal(kvpool_cancel(g.c, 12345678), -ENOENT);
	/* The connection is still in step. */
	mprotect(src, BIG_BYTES, PROT_READ | PROT_WRITE);
	harness_check_block_or_fail(g.c, key, src, BIG_BYTES);
	for (int i = 0; i < N; i++)
		munmap(dst[i], BIG_BYTES);
	munmap(src, BIG_BYTES);
}

/* The event fd: readable once a completion waits, not after it is polled. */
static void test_event_fd(void **state)
{
	static uint8_t buf[SMALL_BYTES], back[SMALL_BYTES];
	struct iovec iov = { back, SMALL_BYTES };
	uint8_t key[32];
	struct kvpool_get_block gb = { .key = key, .iov = &iov, .iovcnt = 1 };
	struct kvpool_completion comp;
	struct pollfd p;
	uint64_t id;
	int fd, n = 0;

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(buf, SMALL_BYTES, 77);
	put_one(g.c, "efd", 0, buf, SMALL_BYTES);
	harness_key(key, "efd", 0);
	fd = kvpool_event_fd(g.c);
	assert_true(fd >= 0);
	assert_int_equal(kvpool_event_fd(g.c), fd);
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 0), 0);
	assert_int_equal(kvpool_submit_get(g.c, &gb, 1, NULL, 5, &id), 0);
	for (int i = 0; i < 50 && n == 0; i++) {
		assert_int_equal(poll(&p, 1, 5000), 1);
		n = kvpool_poll(g.c, &comp, 1, 0);
	}
	assert_int_equal(n, 1);
	assert_int_equal(comp.id, id);
	assert_int_equal(comp.status, 0);
	assert_memory_equal(back, buf, SMALL_BYTES);
	assert_int_equal(poll(&p, 1, 0), 0);

	/* A completion left in the queue keeps it readable. */
	assert_int_equal(kvpool_submit_get(g.c, &gb, 1, NULL, 6, &id), 0);
	assert_int_equal(kvpool_submit_get(g.c, &gb, 1, NULL, 7, &id), 0);
	n = 0;
	for (int i = 0; i < 100 && n == 0; i++) {
		assert_int_equal(poll(&p, 1, 5000), 1);
		n = kvpool_poll(g.c, &comp, 1, 0);
	}
	assert_int_equal(n, 1);
	for (int i = 0; i < 100 && n < 2; i++) {
		assert_int_equal(poll(&p, 1, 5000), 1);
		n += kvpool_poll(g.c, &comp, 1, 0);
	}
	assert_int_equal(n, 2);
	assert_int_equal(poll(&p, 1, 0), 0);
}

/* A synchronous call while asynchronous requests are in flight queues
 * behind them, whole-pool calls included; their completions still come
 * to poll. */
static void test_sync_while_async(void **state)
{
	static uint8_t buf[SMALL_BYTES], back[4][SMALL_BYTES];
	struct iovec iov[4];
	struct kvpool_get_block gb[4];
	struct kvpool_completion comp[4];
	uint8_t key[32];
	uint64_t id, rtt;
	size_t matched;
	int st;

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(buf, SMALL_BYTES, 3);
	put_one(g.c, "mix", 0, buf, SMALL_BYTES);
	harness_key(key, "mix", 0);
	for (int i = 0; i < 4; i++) {
		iov[i] = (struct iovec){ back[i], SMALL_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = key, .iov = &iov[i], .iovcnt = 1 };
		assert_int_equal(kvpool_submit_get(g.c, &gb[i], 1, NULL, (uint64_t)i, &id), 0);
	}
	assert_int_equal(kvpool_exists(g.c, key, 1, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvpool_match(g.c, key, 1, 0, &matched), 0);
	assert_int_equal(matched, 1);
	/* Whole-pool calls queue behind them too (they answered -EBUSY while
	 * the synchronous calls had an engine of their own). */
	assert_true(kvpool_inflight(g.c) > 0);
	assert_int_equal(kvpool_ping(g.c, &rtt), 0);
	{
		char *json = NULL;
		uint64_t dropped = 7;

		assert_int_equal(kvpool_stats(g.c, "async", &json), 0);
		assert_non_null(strstr(json, "\"blocks\""));
		kvpool_free(json);
		assert_int_equal(kvpool_drop_namespace(g.c, "async-none", &dropped), 0);
		assert_int_equal(dropped, 0);
	}
	poll_all(g.c, comp, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(comp[i].status, 0);
		assert_memory_equal(back[i], buf, SMALL_BYTES);
	}
	assert_int_equal(kvpool_ping(g.c, &rtt), 0);
}

/* ---- threads ------------------------------------------------------------------ */

#define T_SUBMITTERS 3
#define T_PER_THREAD 200

struct tctx {
	struct kvpool_client *c;
	int idx;
	uint8_t key[32];
	uint8_t data[SMALL_BYTES];
	uint8_t back[T_PER_THREAD][SMALL_BYTES];
	struct iovec iov[T_PER_THREAD];
	struct kvpool_get_block gb[T_PER_THREAD];
	int st[T_PER_THREAD];
	int failed;
};

static int done_count; /* guarded by done_lock */
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static int bad_count;

static void *submitter(void *arg)
{
	struct tctx *t = arg;

	for (int i = 0; i < T_PER_THREAD; i++) {
		uint64_t id;
		int rc;

		t->iov[i] = (struct iovec){ t->back[i], SMALL_BYTES };
		t->gb[i] = (struct kvpool_get_block){ .key = t->key, .iov = &t->iov[i], .iovcnt = 1 };
		while ((rc = kvpool_submit_get(t->c, &t->gb[i], 1, &t->st[i],
					       ((uint64_t)t->idx << 32) | (uint64_t)i, &id)) == -EAGAIN)
			usleep(200);
		if (rc)
			t->failed++;
	}
	return NULL;
}

static void *poller(void *arg)
{
	struct tctx *ts = arg;
	struct kvpool_completion comp[16];
	int total = T_SUBMITTERS * T_PER_THREAD, got = 0;
	time_t end = time(NULL) + 60;

	while (got < total && time(NULL) < end) {
		/* Returns at once while nothing is in flight yet. */
		int n = kvpool_poll(ts[0].c, comp, 16, 10);

		if (n == 0)
			usleep(100);

		for (int j = 0; j < n; j++) {
			struct tctx *t = &ts[comp[j].tag >> 32];
			int i = (int)(comp[j].tag & 0xffffffff);

			if (comp[j].status || t->st[i] || memcmp(t->back[i], t->data, SMALL_BYTES)) {
				pthread_mutex_lock(&done_lock);
				bad_count++;
				pthread_mutex_unlock(&done_lock);
			}
		}
		if (n > 0)
			got += n;
	}
	pthread_mutex_lock(&done_lock);
	done_count = got;
	pthread_mutex_unlock(&done_lock);
	return NULL;
}

/* Blocking calls from other threads meanwhile: EXISTS, MATCH and GET of
 * the same blocks, and PING, each checked. */
static void *sync_caller(void *arg)
{
	struct tctx *ts = arg;
	uint8_t back[SMALL_BYTES];

	for (int i = 0; i < T_PER_THREAD / 4; i++) {
		struct tctx *t = &ts[i % T_SUBMITTERS];
		uint64_t len = 0;
		size_t m = 0;
		int st = 1;

		if (kvpool_exists(t->c, t->key, 1, &st) || st ||
		    kvpool_match(t->c, t->key, 1, 0, &m) || m != 1 ||
		    kvpool_get_bytes(t->c, t->key, back, sizeof(back), &len) || len != SMALL_BYTES ||
		    memcmp(back, t->data, SMALL_BYTES) || kvpool_ping(t->c, NULL)) {
			pthread_mutex_lock(&done_lock);
			bad_count++;
			pthread_mutex_unlock(&done_lock);
		}
	}
	return NULL;
}

/* Submitters on three threads, one poller on a fourth, two threads making
 * blocking calls: one handle. */
static void test_threads(void **state)
{
	static struct tctx t[T_SUBMITTERS];
	pthread_t sub[T_SUBMITTERS], pol, syn[2];

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < T_SUBMITTERS; i++) {
		t[i].c = g.c;
		t[i].idx = i;
		t[i].failed = 0;
		harness_fill(t[i].data, SMALL_BYTES, 1000 + (uint64_t)i);
		put_one(g.c, "thr", (uint64_t)i, t[i].data, SMALL_BYTES);
		harness_key(t[i].key, "thr", (uint64_t)i);
	}
	assert_int_equal(kvpool_set_max_inflight(g.c, 16), 0);
	done_count = 0;
	bad_count = 0;
	assert_int_equal(pthread_create(&pol, NULL, poller, t), 0);
	for (int i = 0; i < T_SUBMITTERS; i++)
		assert_int_equal(pthread_create(&sub[i], NULL, submitter, &t[i]), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&syn[i], NULL, sync_caller, t), 0);
	for (int i = 0; i < T_SUBMITTERS; i++)
		pthread_join(sub[i], NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(syn[i], NULL);
	pthread_join(pol, NULL);
	for (int i = 0; i < T_SUBMITTERS; i++)
		assert_int_equal(t[i].failed, 0);
	assert_int_equal(done_count, T_SUBMITTERS * T_PER_THREAD);
	assert_int_equal(bad_count, 0);
	assert_int_equal(kvpool_set_max_inflight(g.c, 0), 0);
}

/* ---- a server killed with requests in flight ------------------------------------- */

/* Every request fails cleanly or succeeded with the right bytes; each
 * GET's buffer is write-protected as soon as its completion is polled, so
 * a late write would crash the test. Then a restarted server on the same
 * port serves the next submit. */
static void test_server_killed(void **state)
{
	enum { N = 24 };
	struct harness_server srv = { 0 };
	struct kvpool_client *c;
	uint8_t *src = map_bytes(BIG_BYTES), *dst[N];
	struct iovec iov[N];
	struct kvpool_get_block gb[N];
	struct kvpool_completion comp;
	int st[N], got = 0, failed = 0;
	uint8_t key[32];
	uint64_t id;
	uint16_t port;

	(void)state;
	if (harness_start(&srv, harness_default_flags))
		harness_skip("kvpoold did not start");
	assert_int_equal(harness_client(&srv, "killed", &c), 0);
	harness_fill(src, BIG_BYTES, 31);
	put_one(c, "kill", 0, src, BIG_BYTES);
	harness_key(key, "kill", 0);
	for (int i = 0; i < N; i++) {
		dst[i] = map_bytes(BIG_BYTES);
		iov[i] = (struct iovec){ dst[i], BIG_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = key, .iov = &iov[i], .iovcnt = 1 };
		assert_int_equal(kvpool_submit_get(c, &gb[i], 1, &st[i], (uint64_t)i, &id), 0);
	}
	port = srv.port;
	harness_kill(&srv);
	while (got < N) {
		int n = kvpool_poll(c, &comp, 1, 10000);
		int i;

		assert_int_equal(n, 1);
		got++;
		i = (int)comp.tag;
		assert_int_equal(mprotect(dst[i], BIG_BYTES, PROT_READ), 0);
		if (comp.status == 0) {
			assert_int_equal(st[i], 0);
			assert_memory_equal(dst[i], src, BIG_BYTES);
			continue;
		}
		failed++;
		assert_true(comp.status == -ECONNRESET || comp.status == -EPIPE ||
			    comp.status == -EPROTO);
		assert_int_equal(st[i], comp.status);
	}
	printf("# %d of %d requests failed with the server killed\n", failed, N);
	assert_int_equal(kvpool_inflight(c), 0);
	/* Nothing to reconnect to. */
	assert_int_equal(kvpool_submit_get(c, &gb[0], 1, NULL, 0, &id), -ECONNREFUSED);
	/* A new server on the same port: the next submit reconnects. */
	srv = (struct harness_server){ 0 };
	if (harness_start_on_port(&srv, port, harness_default_flags) == 0) {
		uint8_t back[16];
		struct iovec biov = { back, sizeof(back) };
		struct kvpool_get_block b = { .key = key, .iov = &biov, .iovcnt = 1 };
		int s;

		assert_int_equal(kvpool_submit_get(c, &b, 1, &s, 0, &id), 0);
		assert_int_equal(kvpool_poll(c, &comp, 1, 5000), 1);
		assert_int_equal(comp.status, -ENOENT); /* a fresh pool */
		harness_kill(&srv);
	}
	kvpool_close(c);
	for (int i = 0; i < N; i++)
		munmap(dst[i], BIG_BYTES);
	munmap(src, BIG_BYTES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_full_queue),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_event_fd),
		cmocka_unit_test(test_sync_while_async),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_server_killed),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_async", tests, group_setup, group_teardown);
}
