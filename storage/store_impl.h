/*
 * store_impl.h - the pool's internal structures, shared by the files of
 * storage/ only (never included outside it).
 *
 * Locking: one mutex per pool, s->lock. Functions named *_locked expect
 * the caller to hold it; public store_* functions take it themselves.
 * Nothing copies payload bytes, does disk I/O or calls RocksDB while
 * holding it: the NVMe tier prepares under the lock, does its I/O
 * unlocked, and commits under the lock again, re-checking what changed.
 *
 * MATCH reads without the lock (match.c): it walks the index's chains
 * inside seqlock read sections (index.h) and writes what it must change
 * (recency, lease pins, namespace counters) as intents to its thread's
 * log, which whoever next holds the lock applies (store_lock drains every
 * log). For that to be safe:
 *  - every change of the index's chains and of the namespace table, and
 *    every decision that reads recency or lease pins to evict or reject a
 *    block, runs inside store_wr_begin/store_wr_end, which makes the
 *    index's seq odd and then drains the logs: an intent a reader logged
 *    before its read section validated is applied before the decision;
 *  - block headers are never unmapped while the pool is open; grown bucket
 *    arrays and slab chunk tables and reclaimed namespaces are freed only
 *    after store_quiesce (no reader still in a read section).
 *
 * Block life cycle:
 *   RESERVED  store_put_begin made it; on s->reserved; not in the index;
 *             parent_id is the parent it pins (a ref), if any; a
 *             parent not stored yet (same batch) is kept by key in
 *             pending_parent.
 *   VISIBLE   committed; in the index, on its namespace's list, on its
 *             parent's child list; in each LRU heap exactly when it
 *             qualifies (below). A block that is not a first block
 *             (has_parent) always has its visible parent in parent_id:
 *             removal takes whole subtrees, so no child outlives it.
 *   REMOVED   deleted/dropped/evicted while refs were held; on
 *             s->zombies until the last store_release frees its pages.
 * A visible block has a DRAM copy (in_dram: arena extent first_page,
 * pages), an NVMe copy (on_nvme: segment seg at page seg_page, with a committed
 * RocksDB record), or both. A DRAM copy is clean when the block is also
 * on NVMe, dirty otherwise.
 *
 * LRU heaps (min-heaps on last_use, a use counter):
 *   EVICT  VISIBLE, in DRAM, no visible children (either tier), no refs,
 *          no lease pins: what leaves the pool when DRAM must make room
 *          and no NVMe tier can take it (absent, unhealthy, stalled).
 *   CLEAN  NVMe tier only: VISIBLE, in DRAM and on NVMe, no refs, no lease
 *          pins: DRAM copies dropped instantly on the put path.
 *   DIRTY  NVMe tier only: VISIBLE, in DRAM, not on NVMe, not being
 *          demoted: what the demoter writes next.
 *
 * Memory per block (index_bytes): a 116-byte header from the slab
 * (slab.c), named by a 32-bit id; the hash table, the heaps, parent and
 * child links and the block lists hold ids, not pointers (a 4-byte bucket
 * and a 4-byte EVICT heap slot per block). Leases, promotions in flight
 * and namespaces live in their own tables, found by block or by id, so a
 * block pays nothing for them. The header has no 8-byte field, so it
 * packs at 4-byte alignment: the checksum is 8 unaligned bytes
 * (store_block_checksum) and last_use a 32-bit use count.
 *
 * The use clock (s->clock) is 32 bits. When it is about to pass
 * UINT32_MAX, store_lru_touch_locked first ages the pool
 * (store_lru_age_locked): every header in use gets last_use / 2, and so
 * does the clock. That is one pass over the headers, under the lock,
 * every 2^31 uses: about 3 ms at a million blocks (tests/bench/index_bytes
 * --aging), every 2.4 hours at 250k uses per second. The price in order: two blocks whose last uses were
 * consecutive counts may become equal (ties break by heap position);
 * after k passes, uses less than 2^k counts apart may. NVMe records keep
 * the number of passes with last_use (store_use_stamp), so a restart puts
 * blocks demoted in different epochs back in one order.
 */
#ifndef KVPOOL_STORE_IMPL_H
#define KVPOOL_STORE_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "index.h"
#include "store.h"

#define STORE_HEAP_NONE UINT32_MAX

/* Buckets of the namespace name table: at most STORE_MAX_NAMESPACES / 4
 * names per bucket on average when full, 8 KiB inside struct store. */
#define STORE_NS_BUCKETS 1024u

#define store_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* Circular doubly linked list with a sentinel head. */
struct store_list {
	struct store_list *next, *prev;
};

static inline void store_list_init(struct store_list *h)
{
	h->next = h;
	h->prev = h;
}

static inline bool store_list_empty(const struct store_list *h)
{
	return h->next == h;
}

static inline void store_list_add_tail(struct store_list *h, struct store_list *n)
{
	n->prev = h->prev;
	n->next = h;
	h->prev->next = n;
	h->prev = n;
}

static inline void store_list_del(struct store_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->next = n;
	n->prev = n;
}

enum store_block_state {
	STORE_BLOCK_RESERVED = 1,
	STORE_BLOCK_VISIBLE,
	STORE_BLOCK_REMOVED,
};

struct store_ns;
struct store_promo;

enum store_lru_kind {
	STORE_LRU_EVICT = 0,
	STORE_LRU_CLEAN,
	STORE_LRU_DIRTY,
	STORE_LRU_KINDS,
};

/* A min-heap of blocks (their header ids) on last_use; a block's slot is
 * store_lru_slot(b, kind). */
struct store_heap {
	uint32_t *v;
	uint64_t len, cap;
};

/* A link in a ring of block headers, by slab id; a ring's head is the id
 * of its first member (0 = empty). Half the size of two pointers. */
struct store_ring {
	uint32_t next, prev; /* 0, 0 when on no ring */
};

struct store_block {
	struct store_index_node node;     /* ns_id, key, hash chain (40 bytes) */
	uint32_t first_page;              /* arena extent start (valid when in_dram) */
	uint32_t pages;                   /* extent: 4 KiB pages of the payload */
	/* xxh3-64 given by the client, host order, 8 unaligned bytes so
	 * that nothing in the header needs 8-byte alignment: read and
	 * written only by store_block_checksum / store_block_set_checksum */
	uint8_t xxh3[8];
	/* slots in the LRU heaps, STORE_HEAP_NONE if not in one: [0] EVICT,
	 * [1] CLEAN or DIRTY (never both: on_nvme or not), which one is
	 * slot1_clean (store_lru_slot) */
	uint32_t heap_idx[2];
	uint16_t pad_bytes;               /* pages * 4 KiB - payload bytes (store_block_length) */
	uint16_t state : 2;               /* enum store_block_state */
	uint16_t has_parent : 1;          /* not a first block: parent_id is its parent */
	uint16_t in_dram : 1;             /* first_page holds a copy */
	uint16_t on_nvme : 1;             /* seg/seg_page hold a copy with a committed record */
	uint16_t demoting : 1;            /* a demotion is writing it (holds a ref) */
	uint16_t promoting : 1;           /* a promotion is in flight (store_promo_find_locked) */
	uint16_t reused : 1;              /* GET or MATCH since its put (admission) */
	uint16_t mark : 1;                /* scratch for rebuild and checks */
	uint16_t slot1_clean : 1;         /* heap_idx[1] is a CLEAN slot, not DIRTY */
	uint16_t leased : 1;              /* a lease pins it (in s->lease_by_block) */
	/* visible parent; for a reservation the pinned one (store_parent) */
	uint32_t parent_id;
	struct store_ring link;           /* ns->blocks, s->reserved or s->zombies */
	union {
		/* VISIBLE and REMOVED (zeroed when a reservation is published;
		 * nobody finds a reservation, so it holds no refs) */
		struct {
			/* s->clock at last put, GET or MATCH (halved by each
			 * aging pass); first member: publish zeroes from here */
			uint32_t last_use;
			uint32_t refs;            /* GET pins + pins by child reservations + I/O */
			uint32_t seg;             /* NVMe segment (when on_nvme) */
			uint32_t seg_page;        /* offset in it in 4 KiB pages (store_seg_off) */
			/* visible children (either tier): the head of their
			 * sibling ring, 0 when there are none */
			uint32_t first_child;
			struct store_ring sibling;  /* ring of the parent's children */
			struct store_ring seg_link; /* tier->segs[seg].blocks when on_nvme */
		};
		/* RESERVED with has_parent and no parent_id (its parent was
		 * to come in the same batch): the parent's key, looked up at
		 * commit. Every other parent key is the parent's node.key. */
		uint8_t pending_parent[STORE_KEY_BYTES];
	};
};

/* ---- match.c: MATCH without the lock ---- */

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

/* The header is paid once per block (index_bytes): 116 bytes, 4-byte
 * aligned, so the slab packs 9039 per 1 MiB chunk. Nothing in it needs
 * more than 4-byte alignment (ids, the free list's link in its first 4
 * bytes, the chunk number at the chunk's start): a field that would
 * (a uint64_t) grows it back to 120 and fails here. */
_Static_assert(sizeof(struct store_block) == 116, "block header is 116 bytes");
_Static_assert(_Alignof(struct store_block) == 4, "block header is 4-byte aligned");

/* The client's xxh3-64 of b's payload. */
static inline uint64_t store_block_checksum(const struct store_block *b)
{
	uint64_t sum;

	memcpy(&sum, b->xxh3, sizeof(sum));
	return sum;
}

/* Record sum as b's checksum. */
static inline void store_block_set_checksum(struct store_block *b, uint64_t sum)
{
	memcpy(b->xxh3, &sum, sizeof(sum));
}

/* ---- slab.c: block headers ---- */

#define STORE_SLAB_CHUNK_BYTES (1u << 20)  /* one mapping, aligned to its size */
#define STORE_SLAB_HDR_BYTES 64u           /* the chunk's number, then headers */
#define STORE_SLAB_PER_CHUNK \
	((uint32_t)((STORE_SLAB_CHUNK_BYTES - STORE_SLAB_HDR_BYTES) / sizeof(struct store_block)))

/* Every block header of a pool (slab.c). */
struct store_slab {
	char **chunks;       /* read without the lock by MATCH: replaced, never realloc'd */
	uint32_t nchunks, cap;
	uint32_t fresh;      /* headers of the last chunk handed out at least once */
	uint32_t free_head;  /* id of the first freed header, 0 = none */
	uint64_t live;       /* headers handed out and not freed */
	/* called after a grown chunk table is published, before the old
	 * one is freed (store_quiesce) */
	void (*quiesce)(void *arg);
	void *quiesce_arg;
};

/* An empty slab with room for 16 chunks in its table. Errors: -ENOMEM. */
int store_slab_init(struct store_slab *sl);
/* A zeroed header, or NULL without memory. */
struct store_block *store_slab_alloc(struct store_slab *sl);
/* Give header b back (it is on no list any more). Its state becomes 0:
 * a free header is told from one in use by its state. */
void store_slab_free(struct store_slab *sl, struct store_block *b);
/* The headers of chunk c (< nchunks): the first, and in *count how many
 * were handed out at least once (in use or free, by their state). */
struct store_block *store_slab_chunk(const struct store_slab *sl, uint32_t c, uint32_t *count);
/* Bytes held: chunks and the chunk table. */
uint64_t store_slab_bytes(const struct store_slab *sl);
/* Unmap every chunk (every header goes). */
void store_slab_destroy(struct store_slab *sl);

/* The 32-bit id of header b (never 0). */
static inline uint32_t store_slab_id(const struct store_block *b)
{
	uintptr_t base = (uintptr_t)b & ~(uintptr_t)(STORE_SLAB_CHUNK_BYTES - 1);
	uint32_t chunk = *(const uint32_t *)base;
	uint32_t slot = (uint32_t)(((uintptr_t)b - base - STORE_SLAB_HDR_BYTES) /
				   sizeof(struct store_block));

	return chunk * STORE_SLAB_PER_CHUNK + slot + 1;
}

/* The header with id `id` (not 0). */
static inline struct store_block *store_slab_ptr(const struct store_slab *sl, uint32_t id)
{
	uint32_t i = id - 1;

	return (struct store_block *)(void *)(sl->chunks[i / STORE_SLAB_PER_CHUNK] +
					      STORE_SLAB_HDR_BYTES +
					      (size_t)(i % STORE_SLAB_PER_CHUNK) *
						      sizeof(struct store_block));
}

/* The header with id `id` for a reader without the lock: NULL if id
 * names no chunk handed out yet (a stale or torn id). */
static inline struct store_block *store_slab_ptr_racy(const struct store_slab *sl, uint32_t id)
{
	uint32_t i = id - 1, chunk = i / STORE_SLAB_PER_CHUNK;
	char **chunks;

	if (!id || chunk >= __atomic_load_n(&sl->nchunks, __ATOMIC_ACQUIRE))
		return NULL;
	chunks = __atomic_load_n(&sl->chunks, __ATOMIC_ACQUIRE);
	return (struct store_block *)(void *)(chunks[chunk] + STORE_SLAB_HDR_BYTES +
					      (size_t)(i % STORE_SLAB_PER_CHUNK) *
						      sizeof(struct store_block));
}

/* Payload bytes of b. */
static inline uint64_t store_block_length(const struct store_block *b)
{
	return (uint64_t)b->pages * STORE_PAGE_BYTES - b->pad_bytes;
}

/* Set b's payload bytes (1 .. 2^32 pages of 4 KiB) and extent pages. */
static inline void store_block_set_length(struct store_block *b, uint64_t length)
{
	uint64_t pages = length / STORE_PAGE_BYTES + (length % STORE_PAGE_BYTES != 0);

	b->pages = (uint32_t)pages;
	b->pad_bytes = (uint16_t)(pages * STORE_PAGE_BYTES - length);
}

/* Byte offset of b's NVMe copy in its segment. */
static inline uint64_t store_seg_off(const struct store_block *b)
{
	return (uint64_t)b->seg_page * STORE_PAGE_BYTES;
}

/* b's slot in LRU heap `kind`, or STORE_HEAP_NONE if it is not in it. */
static inline uint32_t store_lru_slot(const struct store_block *b, int kind)
{
	if (kind == 0)
		return b->heap_idx[0];
	if (b->heap_idx[1] == STORE_HEAP_NONE || b->slot1_clean != (kind == STORE_LRU_CLEAN))
		return STORE_HEAP_NONE;
	return b->heap_idx[1];
}

struct store_lessee {
	struct store_list link;   /* s->lessees */
	struct store_list leases; /* struct store_lease.by_lessee */
	uint64_t leased_bytes;    /* payload bytes of the blocks it leases */
	uint64_t max_leased_bytes; /* store_lessee_limit; 0 = no bound */
	struct store_tenant *tenant; /* charged for its leases too; may be NULL */
};

/* A tenant (store_tenant_new): limits shared by the namespaces charged to
 * it and the lessees that name it. Freed by store_close. */
struct store_tenant {
	struct store_list link;    /* s->tenants */
	uint64_t max_bytes;        /* payload bytes of its namespaces; 0 = no limit */
	uint64_t max_leased_bytes; /* bytes its lessees may lease; 0 = no bound */
	uint64_t bytes;            /* visible + reserved payload bytes of its namespaces */
	uint64_t leased_bytes;     /* bytes its lessees lease now */
};

/* One lease pin: (lessee, block) until expiry_ms. At most one per pair;
 * a second MATCH extends it. */
struct store_lease {
	struct store_block *block;
	struct store_lessee *lessee;
	uint64_t expiry_ms;          /* CLOCK_MONOTONIC ms */
	struct store_lease *by_block; /* chain in s->lease_by_block (active leases) */
	struct store_list by_lessee;
	struct store_list by_expiry; /* s->expiry (ascending) or s->lease_pool */
};

/* A namespace lives until it is reclaimed: when a new name arrives at
 * STORE_MAX_NAMESPACES, one with no users, no visible blocks and no
 * reservations is freed and the new name gets a fresh id. Blocks hold
 * only its id (node.ns_id); REMOVED blocks (zombies) never look theirs up,
 * as it may be reclaimed before their last release. */
struct store_ns {
	char name[STORE_NAME_MAX_BYTES + 1];
	uint32_t name_len;
	uint32_t ns_id;
	uint64_t name_hash;       /* xxh3-64 of the name */
	struct store_ns *name_next; /* chain in s->ns_by_name */
	struct store_ns *id_next; /* chain in s->ns_by_id */
	uint32_t users;           /* store_namespace_id refs not yet released */
	uint32_t reservations;    /* uncommitted puts (RESERVED blocks) */
	uint64_t reserved_bytes;  /* their payload bytes (quota) */
	uint64_t quota_bytes;     /* payload bytes allowed (visible + reserved); 0 = no limit */
	struct store_tenant *tenant; /* charged with its bytes; NULL = none */
	uint32_t blocks;          /* ring of its visible blocks (struct store_block.link) */
	uint64_t nblocks, bytes;
	uint64_t puts, put_exists, put_errors;
	uint64_t get_hits, get_misses, exists_hits, exists_misses;
	uint64_t match_requests, match_blocks_queried, match_blocks_matched;
	uint64_t evictions, deletes;
	uint64_t nvme_blocks;     /* visible blocks with an NVMe copy */
	uint32_t disk_id;         /* NVMe disk id, 0 until its first demotion */
	bool disk_named;          /* disk_id recorded with the name in the index */
};

/* ---- NVMe tier ---- */

struct store_nvme_io;
struct store_nvme_index;

enum store_seg_state {
	STORE_SEG_FREE = 0,  /* no record points into it; may be reused */
	STORE_SEG_ACTIVE,    /* demotions append to it */
	STORE_SEG_SEALED,    /* full or left; holds blocks until reclaimed */
	STORE_SEG_FREEING,   /* reclaimed; FREE once readers and pending deletes are 0 */
};

/* One segment file: its fill pointer and the blocks it holds. */
struct store_seg {
	uint8_t state;            /* enum store_seg_state */
	uint64_t fill_bytes;      /* bytes handed out to writes since it was freed */
	uint64_t live_bytes;      /* extent bytes of blocks whose NVMe copy is here */
	uint64_t seq;             /* age: higher = activated later */
	uint32_t readers;         /* reads in flight (promotions, reclaim) */
	uint32_t pending_dels;    /* queued record deletes of ranges here */
	uint32_t blocks;          /* ring of the blocks here (struct store_block.seg_link) */
};

/* A RocksDB record to delete: the block left NVMe (or never should have
 * reached it). Until the delete is written, its segment is not reused. */
struct store_del {
	uint32_t disk_id;
	uint8_t key[STORE_KEY_BYTES];
	uint32_t seg;             /* segment whose range it protects */
};

/* One caller waiting for a promotion. */
struct store_waiter {
	struct store_waiter *next;
	store_get_done_fn done;
	void *arg;
	struct store_ref *out;
	uint32_t ns_id;
};

/* A promotion: NVMe -> DRAM for one block, shared by its waiters. */
struct store_promo {
	struct store_block *block;   /* holds a ref on it */
	struct store_promo *hnext;   /* chain in tier->promo_by_block */
	struct store_list link;      /* tier->promo_queue, then tier->promo_running */
	struct store_waiter *waiters;
	uint32_t first_page;         /* arena extent being filled (when has_pages) */
	bool has_pages;
};

/* Buckets of the promotions-in-flight table (struct store_tier). */
#define STORE_PROMO_BUCKETS 256u

/* Rate limit for repeated error log lines: one per interval. */
struct store_ratelimit {
	uint64_t last_ms;
	uint64_t suppressed;
};

struct store_tier {
	struct store_nvme_io *io;
	struct store_nvme_index *ix;
	uint64_t segment_bytes;
	uint32_t nseg;
	struct store_seg *segs;
	uint32_t active;             /* segment demotions append to, or STORE_SEG_NONE */
	uint32_t nfree;
	uint64_t next_seq;
	uint32_t next_disk_id;
	uint64_t low_pages;          /* demote while free + clean pages are below this */
	uint64_t batch_bytes;        /* one demotion write at most */
	uint64_t backoff_ms;         /* after a failed write */

	pthread_t *threads;
	uint32_t nthreads;
	pthread_cond_t wake;         /* workers sleep on it */
	pthread_cond_t idle;         /* drain and test hooks wait on it */
	bool stop, draining, demoter_busy, want_demote, stalled;
	/* The last reclaim found its segment full of blocks that must stay
	 * and could evict no cold subtree: nothing will change by waiting, so
	 * a put that finds no leaf gets FULL, not BUSY. */
	bool reclaim_stuck;
	bool healthy;
	uint64_t retry_at_ms;        /* no demotion before this (back-off) */
	uint64_t demote_all;         /* test hook: demote every dirty block */
	uint32_t fail_writes;        /* test hook: fail this many writes */
	bool hold, held;             /* test hook: park the demoter before its write */

	/* promotions in flight by block (few: a table in the tier rather
	 * than a pointer in every block header) */
	struct store_promo *promo_by_block[STORE_PROMO_BUCKETS];
	struct store_list promo_queue;   /* promotions not started */
	struct store_list promo_running; /* promotions holding arena pages */
	uint64_t promos;                 /* queued + running */
	uint64_t promo_bytes;            /* arena bytes held by running promotions */

	struct store_del *dels;      /* record deletes not written yet */
	size_t ndels, dels_cap;

	struct store_ratelimit rl_write, rl_read, rl_corrupt;

	/* counters (store_stats) */
	uint64_t nvme_blocks, nvme_payload_bytes;
	uint64_t demotions, demoted_bytes, promotions, promoted_bytes;
	uint64_t bytes_written, bytes_read, rewritten_bytes, segments_reclaimed;
	uint64_t admission_rejections, evictions, corrupt_blocks, read_errors, write_errors;
	uint64_t rebuild_ms, rebuild_blocks, orphans_dropped;
};

#define STORE_SEG_NONE UINT32_MAX

/* Filesystem space a segment write must leave free: room for RocksDB's
 * log and flushes, which must never meet a full disk (nvme_io.h). */
#define STORE_TIER_FS_RESERVE_BYTES (64ull << 20)

/* tier.c: may `bytes` more be written to the segment files and still leave
 * STORE_TIER_FS_RESERVE_BYTES free? 0, -ENOSPC, or -EIO (statvfs failed).
 * Without the lock. */
int store_tier_room_for(struct store *s, uint64_t bytes);

struct store {
	pthread_mutex_t lock;
	uint64_t serial;              /* unique per pool opened in this process */
	uint32_t wr_depth;            /* nesting of store_wr_begin */
	struct store_mlog *mlogs[STORE_MLOG_MAX]; /* MATCH logs, one per thread */
	uint32_t nmlogs;              /* read without the lock (acquire) */
	struct store_config cfg;
	struct store_arena *arena;
	uint64_t capacity_bytes;
	struct store_slab slab;       /* every block header (visible, reserved, removed) */
	struct store_index index;     /* visible blocks only (either tier) */
	struct store_heap lru[STORE_LRU_KINDS];
	uint64_t clean_pages;         /* pages of the blocks in lru[STORE_LRU_CLEAN] */
	uint32_t clock;               /* use counter for last_use (aged near UINT32_MAX) */
	uint32_t clock_epoch;         /* aging passes so far, restored by rebuild */
	struct store_ns **ns;         /* live namespaces in creation order */
	uint32_t nns, ns_cap;
	uint32_t next_ns_id;          /* id for the next new namespace */
	struct store_ns *ns_by_name[STORE_NS_BUCKETS]; /* chained on name_next */
	struct store_ns *ns_by_id[STORE_NS_BUCKETS];   /* chained on id_next */
	uint32_t reserved;            /* ring of RESERVED blocks (their link) */
	uint32_t zombies;             /* ring of REMOVED blocks still referenced */
	struct store_list lessees;
	struct store_list tenants;    /* struct store_tenant.link */
	struct store_list expiry;     /* active leases, ascending expiry_ms */
	struct store_list lease_pool; /* spare lease records */
	uint64_t nreserved, nzombies, nlessees;
	uint64_t lease_records;       /* allocated lease records, active or spare */
	uint64_t lease_spare;
	/* active leases by block: a table sized with the lease records
	 * rather than a list head in every block header */
	struct store_lease **lease_by_block;
	uint64_t lease_buckets;       /* power of two, >= lease_records; 0 before the first */
	/* used_bytes: arena bytes of committed DRAM copies not yet freed,
	 * visible or REMOVED (zombie_bytes of them), so used + inflight +
	 * promotions' bytes + free = capacity at every moment. payload_bytes:
	 * payload of visible blocks in DRAM. */
	uint64_t used_bytes, payload_bytes, inflight_bytes, zombie_bytes;
	uint64_t blocks, dram_blocks, evictions, leases_active, checksum_errors;
	/* Passes of store_alloc_room_locked that had to free DRAM (the arena
	 * had no room at first), and the longest one in microseconds: the
	 * time puts wait behind the lock for an eviction. */
	uint64_t evict_passes, evict_pass_max_us;
	void (*evict_hook)(void *arg); /* store_debug_evict_hook */
	void *evict_hook_arg;
	struct store_tier *tier;      /* NULL without an NVMe tier */
};

/* Take the store lock and apply what MATCHes logged meanwhile. */
static inline void store_lock(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	store_match_drain_locked(s);
}

/* Start a change that lock-free MATCH readers must not see half done, or
 * a decision that must see their intents (store_impl.h, top). Nests. */
static inline void store_wr_begin(struct store *s)
{
	if (s->wr_depth++ == 0) {
		store_index_write_begin(&s->index);
		store_match_drain_locked(s);
	}
}

static inline void store_wr_end(struct store *s)
{
	if (--s->wr_depth == 0)
		store_index_write_end(&s->index);
}

/* What an NVMe record keeps of b's last use: the aging passes so far in
 * the high 32 bits, last_use in the low ones (store_use_unstamp). */
static inline uint64_t store_use_stamp(const struct store *s, const struct store_block *b)
{
	return (uint64_t)s->clock_epoch << 32 | b->last_use;
}

/* The last_use a block stamped `stamp` would have now, after the aging
 * passes up to `epoch` (each halves it). A stamp from a later epoch
 * (never written so) counts as this one. */
static inline uint32_t store_use_unstamp(uint64_t stamp, uint32_t epoch)
{
	uint32_t e = (uint32_t)(stamp >> 32), use = (uint32_t)stamp;
	uint32_t shift = e < epoch ? epoch - e : 0;

	return shift >= 32 ? 0 : use >> shift;
}

/* ---- block headers by id: parents, children, rings ---- */

/* The header with id `id`, or NULL for 0. */
static inline struct store_block *store_blk(const struct store *s, uint32_t id)
{
	return id ? store_slab_ptr(&s->slab, id) : NULL;
}

/* b's parent (visible, or pinned by reservation b), or NULL. */
static inline struct store_block *store_parent(const struct store *s, const struct store_block *b)
{
	return store_blk(s, b->parent_id);
}

static inline void store_set_parent(struct store_block *b, const struct store_block *p)
{
	b->parent_id = p ? store_slab_id(p) : 0;
}

#define STORE_RING_LINK offsetof(struct store_block, link)
#define STORE_RING_SIBLING offsetof(struct store_block, sibling)
#define STORE_RING_SEG offsetof(struct store_block, seg_link)

/* The ring link at offset `off` of header `id`. */
static inline struct store_ring *store_ring_at(const struct store *s, uint32_t id, size_t off)
{
	return (struct store_ring *)(void *)((char *)store_slab_ptr(&s->slab, id) + off);
}

/* Put b last on the ring whose head is *head (its link at `off` is free). */
static inline void store_ring_add_tail(struct store *s, uint32_t *head, struct store_block *b,
				       size_t off)
{
	uint32_t id = store_slab_id(b);
	struct store_ring *n = (struct store_ring *)(void *)((char *)b + off), *first;

	if (!*head) {
		n->next = id;
		n->prev = id;
		*head = id;
		return;
	}
	first = store_ring_at(s, *head, off);
	n->next = *head;
	n->prev = first->prev;
	store_ring_at(s, first->prev, off)->next = id;
	first->prev = id;
}

/* Take b off the ring whose head is *head (no-op if b is on no ring). */
static inline void store_ring_del(struct store *s, uint32_t *head, struct store_block *b,
				  size_t off)
{
	uint32_t id = store_slab_id(b);
	struct store_ring *n = (struct store_ring *)(void *)((char *)b + off);

	if (!n->next)
		return;
	if (n->next == id) {
		*head = 0;
	} else {
		store_ring_at(s, n->prev, off)->next = n->next;
		store_ring_at(s, n->next, off)->prev = n->prev;
		if (*head == id)
			*head = n->next;
	}
	n->next = 0;
	n->prev = 0;
}

/* The member after `id` on the ring with head `head`, 0 after the last. */
static inline uint32_t store_ring_next(const struct store *s, uint32_t head, uint32_t id,
				       size_t off)
{
	uint32_t next = store_ring_at(s, id, off)->next;

	return next == head ? 0 : next;
}

/* Has b visible children? */
static inline bool store_has_children(const struct store_block *b)
{
	return b->first_child != 0;
}

/* Put b on p's children (b->sibling is free). */
static inline void store_child_add(struct store *s, struct store_block *p, struct store_block *b)
{
	store_ring_add_tail(s, &p->first_child, b, STORE_RING_SIBLING);
}

/* Take b off p's children. */
static inline void store_child_del(struct store *s, struct store_block *p, struct store_block *b)
{
	store_ring_del(s, &p->first_child, b, STORE_RING_SIBLING);
}

/* ---- store.c ---- */
/* The namespace with this id, or NULL. */
struct store_ns *store_ns_find_locked(struct store *s, uint32_t ns_id);
/* The namespace of visible or reserved block b (it exists while b does). */
static inline struct store_ns *store_block_ns(struct store *s, const struct store_block *b)
{
	return store_ns_find_locked(s, b->node.ns_id);
}
/* The visible block (ns_id, key), or NULL. */
struct store_block *store_find_locked(struct store *s, uint32_t ns_id,
				      const uint8_t key[STORE_KEY_BYTES]);
/* 4 KiB pages needed for length bytes (no overflow for any length). */
uint64_t store_pages_of(uint64_t length);
/* The namespace called name[0..len), created (with no user) if missing.
 * Errors: -ENOMEM, -EDQUOT. */
int store_ns_get_locked(struct store *s, const char *name, size_t len, struct store_ns **out);

/* ---- block.c: LRU heaps, removal, eviction, DRAM room ---- */
/* VISIBLE, in DRAM, no visible children, no refs, no lease pins. */
bool store_block_evictable(const struct store_block *b);
/* Does b belong in heap `kind` now? */
bool store_lru_member(const struct store *s, const struct store_block *b, enum store_lru_kind kind);
/* Put b in each heap or take it out so membership matches the rules. */
void store_lru_sync_locked(struct store *s, struct store_block *b);
/* Mark b used now (most recent); ages the pool first when the clock is
 * at UINT32_MAX. */
void store_lru_touch_locked(struct store *s, struct store_block *b);
/* Halve last_use of every header in use, and the clock: one pass over
 * the slab (store_lru_touch_locked, and the clock test hook). */
void store_lru_age_locked(struct store *s);
/* Room in the heaps for `count` blocks. Errors: -ENOMEM. */
int store_lru_reserve_locked(struct store *s, uint64_t count);
/* Give back a block's pages (if in DRAM) and header (on no list any more). */
void store_block_free_locked(struct store *s, struct store_block *b);
/* Drop one ref; frees a REMOVED block at its last ref. */
void store_block_unpin_locked(struct store *s, struct store_block *b);
/* Make visible block b (with no visible children) leave the pool, from
 * both tiers (its NVMe record delete is queued). */
void store_block_remove_locked(struct store *s, struct store_block *b);
/* Remove root and every visible descendant; returns the block count and
 * adds their payload bytes to *bytes (may be NULL). */
uint64_t store_block_remove_tree_locked(struct store *s, struct store_block *root,
					uint64_t *bytes);
/* Drop the clean DRAM copy of b (it stays visible on NVMe). */
void store_block_drop_dram_locked(struct store *s, struct store_block *b);
/* Allocate `pages` of DRAM: drop clean copies (LRU), and without a
 * working NVMe tier evict LRU leaves. Errors: -ENOSPC (nothing left to
 * drop or evict), -EAGAIN (only dirty copies left: the demoter is woken). */
int store_alloc_room_locked(struct store *s, uint32_t pages, uint32_t *first);

/* ---- lease.c ---- */
/* CLOCK_MONOTONIC in milliseconds. */
uint64_t store_now_ms(void);
/* The bucket of block b in s->lease_by_block (lease_buckets not 0). */
struct store_lease **store_lease_bucket(const struct store *s, const struct store_block *b);
/* Lease b to r->lessee until r->expiry_ms with record r, allocated
 * outside the lock (match.c). Returns true when r became the lease (the
 * pool owns it now), false when that lessee's lease on b was extended
 * instead (r stays the caller's). */
bool store_lease_grant_rec_locked(struct store *s, struct store_lease *r, struct store_block *b);
/* A spare record taken out of the pool (and out of lease_records: the
 * caller owns it now), or NULL when there is none. */
struct store_lease *store_lease_take_spare_locked(struct store *s);
/* Have at least n spare lease records. Errors: -ENOMEM. */
int store_lease_reserve_locked(struct store *s, uint64_t n);
/* Pin b for lessee until expiry_ms (or extend); needs a spare record. */
void store_lease_grant_locked(struct store *s, struct store_lessee *l, struct store_block *b,
			      uint64_t expiry_ms);
/* End the lessee's lease on b, if any. */
void store_lease_end_for_locked(struct store *s, struct store_lessee *l, struct store_block *b);
/* End every lease on b. */
void store_lease_end_block_locked(struct store *s, struct store_block *b);
/* Does l hold a lease on b? */
bool store_lease_held_locked(const struct store *s, const struct store_lessee *l,
			     const struct store_block *b);
/* End leases that expired at or before now_ms; returns how many. */
uint64_t store_lease_expire_locked(struct store *s, uint64_t now_ms);
/* Free every lessee, lease and spare record (store_close). */
void store_lease_free_all_locked(struct store *s);

/* ---- tier.c: the NVMe tier's life, workers, demotion, record deletes ---- */
/* Open the NVMe tier of s (cfg.nvme_dir set): files, index, rebuild,
 * threads. Errors: as store_open. */
int store_tier_open(struct store *s, char *why, size_t why_len);
/* Stop promotions and demotions (store_drain). */
void store_tier_drain(struct store *s);
/* Drain, join the threads, write pending deletes, close files. */
void store_tier_close(struct store *s);
/* Is the tier unable to take demotions now (absent, unhealthy, drained,
 * stalled)? Then DRAM makes room by evicting. */
bool store_tier_fallback_locked(const struct store *s);
/* Wake the workers (demotion wanted, promotion queued). */
void store_tier_kick_locked(struct store *s);
/* Attach b's NVMe copy at (seg, off) (commit of a demotion or rewrite). */
void store_tier_attach_locked(struct store *s, struct store_block *b, uint32_t seg, uint64_t off);
/* Detach b's NVMe copy and queue its record's delete. */
void store_tier_detach_locked(struct store *s, struct store_block *b);
/* Queue the delete of record (disk_id, key) that protects segment seg. */
void store_tier_queue_del_locked(struct store *s, uint32_t disk_id, const uint8_t *key,
				 uint32_t seg);
/* Segment seg lost a reader or a pending delete: free it if it can be. */
void store_tier_seg_settle_locked(struct store *s, uint32_t seg);
/* Take every queued delete (*dels is the caller's to free). */
void store_tier_take_dels_locked(struct store *s, struct store_del **dels, size_t *n);
/* The deletes are written: their segments may become free. */
void store_tier_dels_done_locked(struct store *s, const struct store_del *dels, size_t n);
/* The deletes were not written: queue them again. */
void store_tier_dels_requeue_locked(struct store *s, const struct store_del *dels, size_t n);
/* A write to the tier failed: unhealthy, counted, back off. */
void store_tier_write_failed_locked(struct store *s);
/* Write records recs[0..n) and deletes dels[0..ndels) in one RocksDB
 * batch (deletes one by one when n == 0). Without the lock.
 * Errors: -EIO, -ENOMEM. */
struct store_nvme_rec;
int store_tier_index_commit(struct store *s, const struct store_nvme_rec *recs, size_t n,
			    const struct store_del *dels, size_t ndels);
/* Log one line (formatted; call without the lock). */
void store_log(struct store *s, enum store_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Log one line at most once per second per limiter (call without the lock). */
void store_log_limited(struct store *s, struct store_ratelimit *rl, enum store_log_level level,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Extent bytes of b (its pages). */
static inline uint64_t store_extent_bytes(const struct store_block *b)
{
	return (uint64_t)b->pages * STORE_PAGE_BYTES;
}

/* ---- demote.c: the demoter (one worker at a time) ---- */
/* Is a demotion round wanted now? */
bool store_demote_wanted_locked(struct store *s);
/* One round: reclaim a segment or write one batch of dirty blocks.
 * Drops and retakes the lock. */
void store_demote_round_locked(struct store *s);
/* Write the queued record deletes (demoter role). Drops and retakes the lock. */
void store_tier_flush_dels_locked(struct store *s);

/* ---- reclaim.c ---- */
/* The sealed segment activated longest ago, or STORE_SEG_NONE. */
uint32_t store_tier_oldest_sealed(const struct store_tier *t);
/* Free the oldest sealed segment, rewriting the blocks that must stay
 * into the active one. Returns 0, or -EAGAIN when nothing could be freed.
 * Drops and retakes the lock. */
int store_reclaim_locked(struct store *s);

/* ---- promote.c ---- */
/* The promotion in flight for b, or NULL (look only when b->promoting). */
struct store_promo *store_promo_find_locked(const struct store_tier *t,
					    const struct store_block *b);
/* Start promotion p of p->block: in the table, the block marked. */
void store_promo_add_locked(struct store_tier *t, struct store_promo *p);
/* Run one queued promotion (I/O thread). Drops and retakes the lock. */
void store_promo_run_locked(struct store *s, struct store_promo *p);

/* ---- rebuild.c ---- */
/* Rebuild the index from the NVMe records (store_open, no threads yet). */
int store_rebuild(struct store *s, char *why, size_t why_len);

#endif /* KVPOOL_STORE_IMPL_H */
