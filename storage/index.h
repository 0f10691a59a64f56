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
 * Threads: no locking; the caller serialises calls on one index.
 */
#ifndef KVPOOL_STORE_INDEX_H
#define KVPOOL_STORE_INDEX_H

#include <stdint.h>

#define STORE_INDEX_KEY_BYTES 32

/* Embedded in the indexed object; ns_id and key are set by the owner.
 * Packed to 44 bytes (4-byte aligned) so that the owner's next 4-byte
 * field fills what would be padding: one million blocks, 4 MB. Never take
 * the address of `next` or `ns_id`. */
struct store_index_node {
	struct store_index_node *next;
	uint32_t ns_id;
	uint8_t key[STORE_INDEX_KEY_BYTES];
} __attribute__((packed, aligned(4)));

struct store_index {
	struct store_index_node **buckets;
	uint64_t nbuckets; /* power of two */
	uint64_t count;    /* nodes in the table */
	uint64_t seed;     /* bucket hash seed, random per table */
};

/* Empty table with `nbuckets` (rounded up to a power of two, >= 16)
 * buckets. Errors: -ENOMEM. */
int store_index_init(struct store_index *ix, uint64_t nbuckets);

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
