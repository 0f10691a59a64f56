/*
 * test_index.c - the block index's hash table: lookups, growth, and
 * resistance to keys a hostile client chooses to collide.
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

static const struct store_index_ops ops = { .node = node_of, .id = id_of };

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

	for (uint64_t b = 0; b < ix->nbuckets; b++) {
		uint64_t len = 0;

		for (uint32_t id = ix->buckets[b]; id; id = node_of(NULL, id)->next)
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
	for (uint32_t i = 0; i < NODES; i++)
		store_index_insert(&ix, &nodes[i]);
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
	for (uint32_t i = 0; i < NODES; i++)
		store_index_insert(&ix, &nodes[i]);
	assert_int_equal(store_index_reserve(&ix, NODES), 0);
	assert_int_equal(ix.nbuckets, NODES);
	assert_int_equal(ix.count, NODES);
	assert_true(longest_chain(&ix) <= 16);
	for (uint32_t i = 0; i < NODES; i += 2)
		assert_int_equal(store_index_remove(&ix, &nodes[i]), 0);
	assert_int_equal(store_index_remove(&ix, &nodes[0]), -ENOENT);
	for (uint32_t i = 0; i < NODES; i++)
		assert_ptr_equal(store_index_find(&ix, 1, nodes[i].key),
				 i % 2 ? &nodes[i] : NULL);
	store_index_destroy(&ix);
	free(nodes);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chosen_keys_spread),
		cmocka_unit_test(test_growth_keeps_every_node),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
