/*
 * test_cluster_hot.c - the hot-block table of a cluster handle
 * (client/lib/cluster/hot.c): a shared prefix becomes hot, whole, once it
 * has branched into `threshold` distinct continuations; a conversation
 * that only grows, or two that alternate, never does; the table stays
 * bounded and forgets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "lib/cluster/hot.h"

/* Key j of chain c: SHA-256 of (c, j); chains with c < 0 share their
 * first `shared` keys. */
static void key_of(int c, int j, int shared, uint8_t out[32])
{
	int v[2] = { j < shared ? -1 : c, j };

	SHA256((const unsigned char *)v, sizeof(v), out);
}

static void chain(int c, int len, int shared, uint8_t (*out)[32])
{
	for (int j = 0; j < len; j++)
		key_of(c, j, shared, out[j]);
}

static void test_shared_prefix(void **state)
{
	struct kvcl_hot h;
	uint8_t ch[12][32];
	size_t got = 0;

	(void)state;
	assert_int_equal(kvcl_hot_init(&h, 32), 0);
	/* 5 shared blocks, then each conversation its own 7 */
	for (int c = 0; c < 31; c++) {
		chain(c, 12, 5, ch);
		assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 12), 0);
	}
	assert_false(kvcl_hot_is(&h, ch[0]));
	assert_int_equal(kvcl_hot_children(&h, ch[4]), 31);
	assert_int_equal(kvcl_hot_children(&h, ch[3]), 1);
	chain(31, 12, 5, ch);
	got = kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 12);
	assert_int_equal(got, 5); /* the 32nd continuation: the whole prefix */
	for (int j = 0; j < 12; j++)
		assert_int_equal(kvcl_hot_is(&h, ch[j]), j < 5);
	/* a later chain through it learns its hot prefix at once, also one
	 * that is only the prefix */
	chain(100, 9, 5, ch);
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 9), 5);
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 5), 5);
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 3), 3);
	assert_int_equal(h.marked, 5);
	kvcl_hot_free(&h);
	kvcl_hot_free(&h); /* twice is fine */
}

static void test_growing_and_alternating(void **state)
{
	struct kvcl_hot h;
	static uint8_t ch[200][32];

	(void)state;
	assert_int_equal(kvcl_hot_init(&h, 4), 0);
	/* one conversation, turn after turn: each block has one child */
	chain(7, 200, 0, ch);
	for (int t = 1; t <= 200; t++)
		assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, (size_t)t), 0);
	assert_int_equal(kvcl_hot_children(&h, ch[10]), 1);
	/* two conversations after one shared block, alternating 100 times:
	 * two children, counted once each */
	for (int t = 0; t < 100; t++) {
		chain(t % 2, 6, 1, ch);
		assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 6), 0);
	}
	assert_int_equal(kvcl_hot_children(&h, ch[0]), 2);
	assert_false(kvcl_hot_is(&h, ch[0]));
	kvcl_hot_free(&h);
}

static void test_off_and_bounded(void **state)
{
	struct kvcl_hot h;
	uint8_t ch[4][32];

	(void)state;
	assert_int_equal(kvcl_hot_init(&h, 0), 0); /* off */
	for (int c = 0; c < 100; c++) {
		chain(c, 4, 2, ch);
		assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 4), 0);
	}
	assert_false(kvcl_hot_is(&h, ch[0]));
	kvcl_hot_free(&h);
	assert_int_equal(kvcl_hot_init(&h, 2), 0);
	chain(0, 4, 2, ch);
	kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 4);
	chain(1, 4, 2, ch);
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 4), 2);
	assert_true(kvcl_hot_is(&h, ch[1]));
	/* many more distinct keys than the table holds: still answers, and
	 * the old marks are eventually forgotten */
	for (int c = 1000; c < 1000 + 4 * (int)KVCL_HOT_SLOTS; c++) {
		uint8_t k[2][32];

		chain(c, 2, 0, k);
		kvcl_hot_learn(&h, (const uint8_t(*)[32])k, 2);
	}
	assert_false(kvcl_hot_is(&h, ch[1]));
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 0), 0);
	assert_int_equal(kvcl_hot_learn(&h, (const uint8_t(*)[32])ch, 1), 0);
	kvcl_hot_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shared_prefix),
		cmocka_unit_test(test_growing_and_alternating),
		cmocka_unit_test(test_off_and_bounded),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
