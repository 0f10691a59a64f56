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
 * Threads: the caller serialises every call that changes the table
 * (insert, remove, reserve) and store_index_find. Lookups may also run
 * without that serialisation, concurrently with changes, through
 * store_index_find_racy inside a read section validated by the table's
 * sequence counter (a seqlock; see "Reading without the lock" below).
 *
 * Reading without the lock (Linux's seqcount, Documentation/locking/
 * seqlock.rst, applied to a chained hash table):
 *  - every change of the chains (insert, remove, reserve) happens while
 *    `seq` is odd: the owner calls store_index_write_begin/_end around it;
 *  - a reader takes seq (store_index_read_begin, which waits while it is
 *    odd), walks the chain, and keeps its answer only if seq is the same
 *    afterwards (store_index_read_retry);
 *  - nodes are never unmapped while the table lives (the owner's promise),
 *    so a reader that raced a change reads stale ids, never freed memory;
 *    ids it reads are checked through ops->node_racy, and a walk is cut
 *    short when it runs long while seq moved, so a chain being rebuilt
 *    under it cannot trap it in a cycle;
 *  - a grown bucket array is published, then ops->quiesce waits until no
 *    reader can still hold the old one, then it is freed.
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

/* How the owner names its nodes: cheap calls that never fail. */
struct store_index_ops {
	struct store_index_node *(*node)(void *arg, uint32_t id); /* id (not 0) -> node */
	uint32_t (*id)(void *arg, const struct store_index_node *n); /* node -> id */
	/* id -> node for a reader without the lock: NULL when id names no
	 * node that was ever handed out (a stale or torn id) */
	struct store_index_node *(*node_racy)(void *arg, uint32_t id);
	/* return once no reader that started before the call is still
	 * reading (store_index_reserve frees the old bucket array after it) */
	void (*quiesce)(void *arg);
};

/* A bucket array and its size, published as one pointer so a reader
 * without the lock never pairs an array with another's mask. */
struct store_index_table {
	uint64_t mask;       /* buckets - 1; buckets is a power of two */
	uint32_t buckets[];  /* node ids, 0 = empty */
};

struct store_index {
	struct store_index_table *table;
	uint64_t count;    /* nodes in the table */
	uint64_t seed;     /* bucket hash seed, random per table */
	uint64_t seq;      /* odd while a change is in progress (seqlock) */
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

/* The id of the node with this (ns_id, key) in *id (0 when none), read
 * without the lock inside the read section that store_index_read_begin
 * opened with `seq` (the answer counts only if store_index_read_retry
 * then says 0). Returns 0, or -EAGAIN when the walk met an id that names
 * no node, or ran long while the table was changing (start the read
 * section again). */
int store_index_find_racy(const struct store_index *ix, int64_t seq, uint32_t ns_id,
			  const uint8_t key[STORE_INDEX_KEY_BYTES], uint32_t *id);

/* Start a read section: the current (even) sequence number, waiting at
 * most `spins` polls while a change is in progress. Returns the number,
 * or -EBUSY (as a negative int64) if the change outlasted the spins. */
int64_t store_index_read_begin(const struct store_index *ix, uint32_t spins);

/* Did the table change since store_index_read_begin returned seq? Also a
 * full barrier: what the reader wrote before it (e.g. to a log the owner
 * reads under the lock after store_index_write_begin) is visible to a
 * writer that starts later, and a writer that started earlier is seen. */
static inline int store_index_read_retry(const struct store_index *ix, int64_t seq)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&ix->seq, __ATOMIC_SEQ_CST) != (uint64_t)seq;
}

/* Mark the start and end of a change (the owner's lock held). The
 * owner nests them itself: these two never nest. */
static inline void store_index_write_begin(struct store_index *ix)
{
	__atomic_add_fetch(&ix->seq, 1, __ATOMIC_SEQ_CST);
}

static inline void store_index_write_end(struct store_index *ix)
{
	__atomic_add_fetch(&ix->seq, 1, __ATOMIC_SEQ_CST);
}

/* Is a change in progress (seq odd)? For the owner's assertions. */
static inline int store_index_writing(const struct store_index *ix)
{
	return (int)(__atomic_load_n(&ix->seq, __ATOMIC_RELAXED) & 1);
}

/* Number of buckets. */
static inline uint64_t store_index_buckets(const struct store_index *ix)
{
	return ix->table->mask + 1;
}

/* Add a node whose key is not in the table yet (not checked). */
void store_index_insert(struct store_index *ix, struct store_index_node *n);

/* Remove a node that is in the table. Returns 0, or -ENOENT if it is not. */
int store_index_remove(struct store_index *ix, struct store_index_node *n);

/* Grow the bucket array so that `count` nodes give a load factor <= 1
 * (inside a write section: it relinks every chain). The old array is
 * freed after ops->quiesce. Errors: -ENOMEM (the table stays as it was
 * and keeps working). */
int store_index_reserve(struct store_index *ix, uint64_t count);

/* Bytes of the bucket array (with its header). */
uint64_t store_index_bytes(const struct store_index *ix);

#endif /* KVPOOL_STORE_INDEX_H */
