/*
 * match.h - MATCH without the lock (match.c; internal to storage/): the
 * per-thread intent logs and the read sections (core.h, top, has the rules).
 */
#ifndef KVPOOL_STORE_MATCH_H
#define KVPOOL_STORE_MATCH_H

#include <pthread.h>
#include <stdint.h>

struct store;
struct store_lease;

/* One intent in a MATCH log. id != 0: block `id` was matched, if it still
 * holds (ns_id, a key starting with key8): mark it used and, with a lease
 * record (its lessee and expiry_ms filled, allocated by the MATCH before
 * it logged anything), lease it. id == 0: a MATCH's counters for
 * namespace ns_id: key8 keys queried, `matched` found. */
struct store_intent {
	uint32_t id;
	uint32_t ns_id;
	uint64_t key8;            /* first 8 key bytes, or queried (id == 0) */
	union {
		struct store_lease *lease; /* NULL: no lease */
		uint64_t matched;
	};
};

/* Entries of one thread's log: a MATCH of up to this many keys minus one
 * fits (larger ones take the lock). 512 KiB per thread that matches. */
#define STORE_MLOG_ENTRIES 16384u
/* Threads with a log of their own in one pool; more take the lock. */
#define STORE_MLOG_MAX 128u

/* A thread's MATCH log: a single-producer ring (the owner thread appends
 * at tail; whoever holds the store lock consumes from head) plus the
 * owner's read-section counter (odd while it reads without the lock). */
struct store_mlog {
	uint64_t epoch __attribute__((aligned(64)));
	pthread_t owner;
	/* lease records the owner allocated without the lock for its next
	 * MATCH (chained on by_block), so applying a lease never allocates;
	 * records its intents did not use come back on `returned` (pushed
	 * under the store lock, taken whole by the owner) */
	struct store_lease *stock;
	uint32_t nstock;
	struct store_lease *returned;
	uint64_t tail __attribute__((aligned(64)));
	uint64_t head __attribute__((aligned(64)));
	struct store_intent e[STORE_MLOG_ENTRIES];
};

/* Apply every log's intents (lock held). Cheap when they are empty. */
void store_match_drain_locked(struct store *s);
/* Wait until no reader that was in a read section when called still is
 * (lock held: readers never take it, so this ends). */
void store_quiesce(struct store *s);
/* Free every log (store_close, no other thread left). */
void store_match_free_logs(struct store *s);

#endif /* KVPOOL_STORE_MATCH_H */
