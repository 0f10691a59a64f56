/*
 * test_index.c - the block index's hash table: lookups, growth, and
 * resistance to keys a hostile client chooses to collide, and lookups
 * without the lock (seqlock read sections).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "index.h"

#define NODES 4096u

/* The nodes of the test in progress: id i + 1 is nodes[i]. */
static struct store_index_node *g_nodes;

static struct store_index_node *node_of(void *arg, uint32_t id)
{
	(void)arg;
	assert_true(id >= 1 && id <= NODES);
	return &g_nodes[id - 1];
}

static uint32_t id_of(void *arg, const struct store_index_node *n)
{
	(void)arg;
	return (uint32_t)(n - g_nodes) + 1;
}

static struct store_index_node *node_racy(void *arg, uint32_t id)
{
	(void)arg;
	return id >= 1 && id <= NODES ? &g_nodes[id - 1] : NULL;
}

static unsigned g_quiesced;

static void quiesce(void *arg)
{
	(void)arg;
	g_quiesced++;
}

static const struct store_index_ops ops = {
	.node = node_of, .id = id_of, .node_racy = node_racy, .quiesce = quiesce,
};

/* Insert nodes[0..n) in one write section. */
static void insert_all(struct store_index *ix, struct store_index_node *nodes, uint32_t n)
{
	store_index_write_begin(ix);
	for (uint32_t i = 0; i < n; i++)
		store_index_insert(ix, &nodes[i]);
	store_index_write_end(ix);
}

/* A racy lookup in a read section that nothing disturbs: the id found. */
static uint32_t find_racy(const struct store_index *ix, uint32_t ns_id, const uint8_t *key)
{
	int64_t seq = store_index_read_begin(ix, 0);
	uint32_t id = UINT32_MAX;

	assert_true(seq >= 0);
	assert_int_equal(store_index_find_racy(ix, seq, ns_id, key, &id), 0);
	assert_false(store_index_read_retry(ix, seq));
	return id;
}

/* Keys that agree in their first 24 bytes and differ only in the last 8:
 * a hash of the first bytes alone puts them all in one bucket. */
static struct store_index_node *colliding_nodes(uint32_t ns_id)
{
	struct store_index_node *nodes = calloc(NODES, sizeof(*nodes));

	assert_non_null(nodes);
	for (uint32_t i = 0; i < NODES; i++) {
		memset(nodes[i].key, 0xab, sizeof(nodes[i].key));
		memcpy(nodes[i].key + 24, &i, sizeof(i));
		nodes[i].ns_id = ns_id;
	}
	g_nodes = nodes;
	return nodes;
}

static uint64_t longest_chain(const struct store_index *ix)
{
	uint64_t longest = 0;

	for (uint64_t b = 0; b < store_index_buckets(ix); b++) {
		uint64_t len = 0;

		for (uint32_t id = ix->table->buckets[b]; id; id = node_of(NULL, id)->next)
			len++;
		if (len > longest)
			longest = len;
	}
	return longest;
}

static void test_chosen_keys_spread(void **state)
{
	struct store_index ix;
	struct store_index_node *nodes = colliding_nodes(7);

	(void)state;
	assert_int_equal(store_index_init(&ix, NODES, &ops, NULL), 0);
	insert_all(&ix, nodes, NODES);
	/* 4096 keys in 4096 buckets: a uniform hash's longest chain is ~7. */
	assert_true(longest_chain(&ix) <= 16);
	for (uint32_t i = 0; i < NODES; i++)
		assert_ptr_equal(store_index_find(&ix, 7, nodes[i].key), &nodes[i]);
	assert_null(store_index_find(&ix, 8, nodes[0].key));
	store_index_destroy(&ix);
	free(nodes);
}

static void test_growth_keeps_every_node(void **state)
{
	struct store_index ix;
	struct store_index_node *nodes = colliding_nodes(1);

	(void)state;
	assert_int_equal(store_index_init(&ix, 16, &ops, NULL), 0);
	insert_all(&ix, nodes, NODES);
	g_quiesced = 0;
	store_index_write_begin(&ix);
	assert_int_equal(store_index_reserve(&ix, NODES), 0);
	store_index_write_end(&ix);
	/* the old array was freed only after readers were waited for */
	assert_int_equal(g_quiesced, 1);
	assert_int_equal(store_index_buckets(&ix), NODES);
	assert_int_equal(ix.count, NODES);
	assert_true(longest_chain(&ix) <= 16);
	store_index_write_begin(&ix);
	for (uint32_t i = 0; i < NODES; i += 2)
		assert_int_equal(store_index_remove(&ix, &nodes[i]), 0);
	assert_int_equal(store_index_remove(&ix, &nodes[0]), -ENOENT);
	store_index_write_end(&ix);
	for (uint32_t i = 0; i < NODES; i++) {
		assert_ptr_equal(store_index_find(&ix, 1, nodes[i].key),
				 i % 2 ? &nodes[i] : NULL);
		assert_int_equal(find_racy(&ix, 1, nodes[i].key), i % 2 ? i + 1 : 0);
	}
	store_index_destroy(&ix);
	free(nodes);
}

/* A read section that overlaps a write is told to retry; one that begins
 * during a write waits for it (here: gives up after its spins). */
static void test_read_section_sees_writes(void **state)
{
	struct store_index ix;
	struct store_index_node *nodes = colliding_nodes(3);
	int64_t seq;
	uint32_t id = 0;

	(void)state;
	assert_int_equal(store_index_init(&ix, NODES, &ops, NULL), 0);
	insert_all(&ix, nodes, 10);
	seq = store_index_read_begin(&ix, 0);
	assert_true(seq >= 0);
	assert_int_equal(store_index_find_racy(&ix, seq, 3, nodes[5].key, &id), 0);
	assert_int_equal(id, 6);
	assert_false(store_index_read_retry(&ix, seq));
	/* a removal between begin and retry invalidates the answer */
	store_index_write_begin(&ix);
	assert_int_equal(store_index_remove(&ix, &nodes[5]), 0);
	assert_true(store_index_read_retry(&ix, seq));
	/* while the write is open a new read section cannot start */
	assert_int_equal(store_index_read_begin(&ix, 100), -EBUSY);
	store_index_write_end(&ix);
	assert_int_equal(find_racy(&ix, 3, nodes[5].key), 0);
	assert_int_equal(find_racy(&ix, 4, nodes[6].key), 0); /* other namespace */
	assert_int_equal(find_racy(&ix, 3, nodes[6].key), 7);
	store_index_destroy(&ix);
	free(nodes);
}

/* A reader that raced a change may meet a chain that loops or names ids
 * never handed out: it must give up (-EAGAIN) rather than spin or read
 * outside the nodes, as soon as it sees the table moved. */
static void test_racy_walk_gives_up(void **state)
{
	struct store_index ix;
	struct store_index_node *nodes = colliding_nodes(9);
	uint8_t absent[STORE_INDEX_KEY_BYTES];
	uint32_t id = 0, a, b;
	int64_t seq;

	(void)state;
	memset(absent, 0x5a, sizeof(absent));
	assert_int_equal(store_index_init(&ix, 16, &ops, NULL), 0);
	insert_all(&ix, nodes, 2);
	seq = store_index_read_begin(&ix, 0);
	assert_true(seq >= 0);
	/* a writer turns the bucket of `absent` into a two-node cycle, as a
	 * torn read of headers being reused could show it */
	store_index_write_begin(&ix);
	a = 1;
	b = 2;
	for (uint64_t i = 0; i < store_index_buckets(&ix); i++)
		ix.table->buckets[i] = a;
	nodes[0].next = b;
	nodes[1].next = a;
	assert_int_equal(store_index_find_racy(&ix, seq, 9, absent, &id), -EAGAIN);
	/* an id that names no node is refused too */
	nodes[1].next = NODES + 5;
	assert_int_equal(store_index_find_racy(&ix, seq, 9, absent, &id), -EAGAIN);
	store_index_write_end(&ix);
	store_index_destroy(&ix);
	free(nodes);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chosen_keys_spread),
		cmocka_unit_test(test_growth_keeps_every_node),
		cmocka_unit_test(test_read_section_sees_writes),
		cmocka_unit_test(test_racy_walk_gives_up),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
