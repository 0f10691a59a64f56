/*
 * index.h - hash table from (namespace id, 32-byte block hash) to an
 * intrusive node (internal to storage/).
 *
 * Chained buckets, a power of two of them, chosen by a seeded xxh3-64 of
 * the whole key and the namespace id: keys are chosen by clients, and a
 * seed drawn at init keeps a hostile key set from filling one chain
 * (hash flooding). Inserting
 * never fails: growing the bucket array is a separate step
 * (store_index_reserve) that may fail harmlessly, leaving longer chains.
 *
 * Buckets and chains hold 32-bit node ids rather than pointers (half the
 * memory per node); the owner maps ids to nodes and back through the
 * store_index_ops given at init. Id 0 is never a node's.
 *
 * Threads: no locking; the caller serialises calls on one index.
 */
#ifndef KVPOOL_STORE_INDEX_H
#define KVPOOL_STORE_INDEX_H

#include <stdint.h>

#define STORE_INDEX_KEY_BYTES 32

/* Embedded in the indexed object; ns_id and key are set by the owner. */
struct store_index_node {
	uint32_t next;     /* id of the next node in the chain, 0 at the end */
	uint32_t ns_id;
	uint8_t key[STORE_INDEX_KEY_BYTES];
};

/* How the owner names its nodes: both calls are cheap and never fail. */
struct store_index_ops {
	struct store_index_node *(*node)(void *arg, uint32_t id); /* id (not 0) -> node */
	uint32_t (*id)(void *arg, const struct store_index_node *n); /* node -> id */
};

struct store_index {
	uint32_t *buckets; /* node ids, 0 = empty */
	uint64_t nbuckets; /* power of two */
	uint64_t count;    /* nodes in the table */
	uint64_t seed;     /* bucket hash seed, random per table */
	const struct store_index_ops *ops;
	void *arg;         /* passed to ops */
};

/* Empty table with `nbuckets` (rounded up to a power of two, >= 16)
 * buckets, whose nodes are named through ops (kept, with arg).
 * Errors: -ENOMEM. */
int store_index_init(struct store_index *ix, uint64_t nbuckets,
		     const struct store_index_ops *ops, void *arg);

/* Free the bucket array (not the nodes). Accepts an index never inited
 * if it was zeroed. */
void store_index_destroy(struct store_index *ix);

/* The node with this (ns_id, key), or NULL. */
struct store_index_node *store_index_find(const struct store_index *ix, uint32_t ns_id,
					  const uint8_t key[STORE_INDEX_KEY_BYTES]);

/* Add a node whose key is not in the table yet (not checked). */
void store_index_insert(struct store_index *ix, struct store_index_node *n);

/* Remove a node that is in the table. Returns 0, or -ENOENT if it is not. */
int store_index_remove(struct store_index *ix, struct store_index_node *n);

/* Grow the bucket array so that `count` nodes give a load factor <= 1.
 * Errors: -ENOMEM (the table stays as it was and keeps working). */
int store_index_reserve(struct store_index *ix, uint64_t count);

/* Bytes of the bucket array. */
uint64_t store_index_bytes(const struct store_index *ix);

#endif /* KVPOOL_STORE_INDEX_H */
