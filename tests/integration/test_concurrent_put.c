/*
 * test_concurrent_put.c - several clients put the same key at the same
 * moment: every one succeeds, exactly one copy is stored, and each client
 * can read the block right after its own put returned.
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
#define ROUNDS 20

static struct {
	struct harness_server srv;
	pthread_barrier_t barrier;
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
	return 0;
}

/* Round r puts key r (child of key r-1 on odd rounds) of this size. */
static size_t size_of_round(int r)
{
	static const size_t sizes[] = { 4096, 1 << 20, 100001, (2 << 20) + 5 };

	return sizes[r % 4];
}

struct worker {
	int id;
	pthread_t thread;
	int put_rc[ROUNDS];
	int get_rc[ROUNDS];
	int differs[ROUNDS];
	int connect_rc;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct kvpool_client *c = NULL;
	uint8_t keys[ROUNDS][32];
	uint8_t *buf = malloc((2 << 20) + 5), *got = malloc((2 << 20) + 5);

	w->connect_rc = harness_client(&g.srv, "cput", &c);
	for (int r = 0; r < ROUNDS; r++) {
		size_t len = size_of_round(r);
		uint64_t got_len = 0;

		harness_key(keys[r], "cput", (uint64_t)r);
		harness_fill(buf, len, harness_key_seed(keys[r]));
		/* Everyone starts the same put at the same moment. */
		pthread_barrier_wait(&g.barrier);
		if (w->connect_rc || !buf || !got)
			continue;
		w->put_rc[r] = kvpool_put_bytes(c, keys[r], r % 2 ? keys[r - 1] : NULL, buf, len);
		/* Read right after our own success: the block must be there. */
		w->get_rc[r] = kvpool_get_bytes(c, keys[r], got, len, &got_len);
		w->differs[r] = !w->get_rc[r] && (got_len != len || memcmp(got, buf, len) != 0);
	}
	kvpool_close(c);
	free(buf);
	free(got);
	return NULL;
}

static void test_same_key_at_once(void **state)
{
	struct worker w[THREADS];
	struct kvpool_client *c = NULL;
	uint64_t used0, payload0, sum = 0, sum_pages = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_client(&g.srv, "cput", &c), 0);
	used0 = harness_stat_or_fail(c, "tiers.dram.used_bytes");
	payload0 = harness_stat_or_fail(c, "tiers.dram.payload_bytes");
	assert_int_equal(pthread_barrier_init(&g.barrier, NULL, THREADS), 0);
	memset(w, 0, sizeof(w));
	for (int i = 0; i < THREADS; i++) {
		w[i].id = i;
		assert_int_equal(pthread_create(&w[i].thread, NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_join(w[i].thread, NULL), 0);
	pthread_barrier_destroy(&g.barrier);

	for (int i = 0; i < THREADS; i++) {
		assert_int_equal(w[i].connect_rc, 0);
		for (int r = 0; r < ROUNDS; r++) {
			if (w[i].put_rc[r] || w[i].get_rc[r] || w[i].differs[r])
				fail_msg("thread %d round %d: put %s, get %s%s", i, r,
					 kvpool_strerror(w[i].put_rc[r]),
					 kvpool_strerror(w[i].get_rc[r]),
					 w[i].differs[r] ? ", bytes differ" : "");
		}
	}
	for (int r = 0; r < ROUNDS; r++) {
		sum += size_of_round(r);
		sum_pages += (size_of_round(r) + 4095) / 4096 * 4096;
	}
	/* One copy of each key. */
	assert_int_equal(harness_ns_stat_or_fail(c, "cput", "blocks"), ROUNDS);
	assert_int_equal(harness_ns_stat_or_fail(c, "cput", "bytes"), sum);
	assert_int_equal(harness_stat_or_fail(c, "tiers.dram.payload_bytes") - payload0, sum);
	assert_int_equal(harness_stat_or_fail(c, "tiers.dram.used_bytes") - used0, sum_pages);
	assert_int_equal(harness_wait_stat_or_fail(c, "tiers.dram.inflight_put_bytes", 0, 2000), 0);
	assert_int_equal(harness_ns_stat_or_fail(c, "cput", "get_hits"), THREADS * ROUNDS);
	kvpool_close(c);
}

/* A raw client starts a 4 MiB put of key K and stalls half way; a library
 * client puts K meanwhile and must neither wait for the stalled one nor be
 * refused. Then the stalled one either finishes (OK or EXISTS, still one
 * copy) or dies (the stored copy stays). */
static void test_put_while_other_stalls(void **state)
{
	const size_t len = 4u << 20;
	struct kvpool_client *c = NULL;
	uint8_t *data = malloc(len), *got = malloc(len);
	uint64_t used0, t0, elapsed, got_len = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	assert_non_null(got);
	assert_int_equal(harness_client(&g.srv, "cput-stall", &c), 0);
	for (int finish = 0; finish < 2; finish++) {
		struct harness_frame f;
		struct proto_result res;
		uint8_t key[32];
		int fd = -1;

		harness_key(key, "cput-stall", (uint64_t)finish);
		harness_fill(data, len, harness_key_seed(key));
		used0 = harness_stat_or_fail(c, "tiers.dram.used_bytes");
		fd = harness_raw_session_or_fail(g.srv.port, "cput-stall", NULL);
		assert_int_equal(harness_raw_put(fd, 21, key, NULL, data, len,
						 harness_xxh3(data, len), len / 4),
				 0);
		/* Wait until the server has seen the stalled put's header. */
		harness_wait_stat_at_least_or_fail(c, "tiers.dram.inflight_put_bytes", len, 3000);
		t0 = harness_now_ms();
		assert_int_equal(kvpool_put_bytes(c, key, NULL, data, len), 0);
		elapsed = harness_now_ms() - t0;
		if (elapsed > 2000)
			fail_msg("put waited %llu ms for another client's stalled put",
				 (unsigned long long)elapsed);
		harness_check_block_or_fail(c, key, data, len);

		if (finish) {
			assert_int_equal(harness_send_all(fd, data + len / 4, len - len / 4), 0);
			assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
			assert_int_equal(f.h.status, PROTO_STATUS_OK);
			assert_int_equal(harness_reply_result(&f, 0, &res), 0);
			if (res.status != PROTO_STATUS_OK && res.status != PROTO_STATUS_EXISTS)
				fail_msg("the late put got %s", proto_status_name(res.status));
			harness_frame_free(&f);
		}
		close(fd);
		assert_int_equal(
			harness_wait_stat_or_fail(c, "tiers.dram.inflight_put_bytes", 0, 3000), 0);
		/* One copy, whoever finished first. */
		assert_int_equal(harness_stat_or_fail(c, "tiers.dram.used_bytes") - used0, len);
		assert_int_equal(kvpool_get_bytes(c, key, got, len, &got_len), 0);
		assert_memory_equal(got, data, len);
	}
	assert_int_equal(harness_ns_stat_or_fail(c, "cput-stall", "blocks"), 2);
	kvpool_close(c);
	free(data);
	free(got);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_key_at_once),
		cmocka_unit_test(test_put_while_other_stalls),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_concurrent_put", tests, group_setup,
					   group_teardown);
}
