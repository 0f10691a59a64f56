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
 * Block life cycle:
 *   RESERVED  store_put_begin made it; on s->reserved; not in the index;
 *             parent_blk is the parent it pins (a ref), if any.
 *   VISIBLE   committed; in the index, on its namespace's list, on its
 *             parent's child list; in each LRU heap exactly when it
 *             qualifies (below).
 *   REMOVED   deleted/dropped/evicted while refs were held; on
 *             s->zombies until the last store_release frees its pages.
 * A visible block has a DRAM copy (in_dram: arena extent first_page,
 * pages), an NVMe copy (on_nvme: segment seg at seg_off, with a committed
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
 */
#ifndef KVPOOL_STORE_IMPL_H
#define KVPOOL_STORE_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* A min-heap of blocks on last_use; a block's slot is heap_idx[kind]. */
struct store_heap {
	struct store_block **v;
	uint64_t len, cap;
};

struct store_block {
	struct store_index_node node;     /* ns_id, key, hash chain */
	uint8_t parent[STORE_KEY_BYTES];  /* zeros for a first block */
	uint8_t has_parent;
	uint8_t state;                    /* enum store_block_state */
	uint8_t in_dram;                  /* first_page holds a copy */
	uint8_t on_nvme;                  /* seg/seg_off hold a copy with a committed record */
	uint8_t demoting;                 /* a demotion is writing it (holds a ref) */
	uint8_t reused;                   /* GET or MATCH since its put (admission) */
	uint8_t mark;                     /* scratch for rebuild and checks */
	uint32_t first_page, pages;       /* arena extent (first_page valid when in_dram) */
	uint64_t length;                  /* payload bytes */
	uint64_t checksum;                /* xxh3-64 given by the client */
	uint32_t refs;                    /* GET pins + pins by child reservations + I/O */
	uint32_t lease_pins;              /* leases held on it */
	uint32_t children;                /* visible children (either tier) */
	uint32_t heap_idx[STORE_LRU_KINDS]; /* slot per heap, STORE_HEAP_NONE if not in it */
	uint64_t last_use;                /* s->clock at last put, GET or MATCH */
	uint32_t seg;                     /* NVMe segment (when on_nvme) */
	uint64_t seg_off;                 /* byte offset in it */
	struct store_promo *promo;        /* promotion in flight, or NULL */
	struct store_ns *ns;
	struct store_block *parent_blk;   /* visible parent; for a reservation the pinned one */
	struct store_list child_list;     /* visible children (their sibling links) */
	struct store_list sibling;        /* in parent_blk->child_list */
	struct store_list link;           /* ns->blocks, s->reserved or s->zombies */
	struct store_list leases;         /* struct store_lease.by_block */
	struct store_list seg_link;       /* tier->segs[seg].blocks when on_nvme */
};

struct store_lessee {
	struct store_list link;   /* s->lessees */
	struct store_list leases; /* struct store_lease.by_lessee */
};

/* One lease pin: (lessee, block) until expiry_ms. At most one per pair;
 * a second MATCH extends it. */
struct store_lease {
	struct store_block *block;
	struct store_lessee *lessee;
	uint64_t expiry_ms;          /* CLOCK_MONOTONIC ms */
	struct store_list by_block;
	struct store_list by_lessee;
	struct store_list by_expiry; /* s->expiry (ascending) or s->lease_pool */
};

/* A namespace lives until it is reclaimed: when a new name arrives at
 * STORE_MAX_NAMESPACES, one with no users, no visible blocks and no
 * reservations is freed and the new name gets a fresh id. REMOVED blocks
 * (zombies) have ns == NULL so nothing points at a reclaimed one. */
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
	struct store_list blocks; /* visible blocks, struct store_block.link */
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
	struct store_list blocks; /* struct store_block.seg_link */
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
	struct store_list link;      /* tier->promo_queue, then tier->promo_running */
	struct store_waiter *waiters;
	uint32_t first_page;         /* arena extent being filled (when has_pages) */
	bool has_pages;
};

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
	bool healthy;
	uint64_t retry_at_ms;        /* no demotion before this (back-off) */
	uint64_t demote_all;         /* test hook: demote every dirty block */
	uint32_t fail_writes;        /* test hook: fail this many writes */
	bool hold, held;             /* test hook: park the demoter before its write */

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
	struct store_config cfg;
	struct store_arena *arena;
	uint64_t capacity_bytes;
	struct store_index index;     /* visible blocks only (either tier) */
	struct store_heap lru[STORE_LRU_KINDS];
	uint64_t clean_pages;         /* pages of the blocks in lru[STORE_LRU_CLEAN] */
	uint64_t clock;               /* use counter for last_use */
	struct store_ns **ns;         /* live namespaces in creation order */
	uint32_t nns, ns_cap;
	uint32_t next_ns_id;          /* id for the next new namespace */
	struct store_ns *ns_by_name[STORE_NS_BUCKETS]; /* chained on name_next */
	struct store_ns *ns_by_id[STORE_NS_BUCKETS];   /* chained on id_next */
	struct store_list reserved;   /* RESERVED blocks */
	struct store_list zombies;    /* REMOVED blocks still referenced */
	struct store_list lessees;
	struct store_list expiry;     /* active leases, ascending expiry_ms */
	struct store_list lease_pool; /* spare lease records */
	uint64_t nreserved, nzombies, nlessees;
	uint64_t lease_records;       /* allocated lease records, active or spare */
	uint64_t lease_spare;
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
	struct store_tier *tier;      /* NULL without an NVMe tier */
};

/* ---- store.c ---- */
/* The namespace with this id, or NULL. */
struct store_ns *store_ns_find_locked(struct store *s, uint32_t ns_id);
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
/* Mark b used now (most recent). */
void store_lru_touch_locked(struct store *s, struct store_block *b);
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
/* Have at least n spare lease records. Errors: -ENOMEM. */
int store_lease_reserve_locked(struct store *s, uint64_t n);
/* Pin b for lessee until expiry_ms (or extend); needs a spare record. */
void store_lease_grant_locked(struct store *s, struct store_lessee *l, struct store_block *b,
			      uint64_t expiry_ms);
/* End the lessee's lease on b, if any. */
void store_lease_end_for_locked(struct store *s, struct store_lessee *l, struct store_block *b);
/* End every lease on b. */
void store_lease_end_block_locked(struct store *s, struct store_block *b);
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
/* Run one queued promotion (I/O thread). Drops and retakes the lock. */
void store_promo_run_locked(struct store *s, struct store_promo *p);

/* ---- rebuild.c ---- */
/* Rebuild the index from the NVMe records (store_open, no threads yet). */
int store_rebuild(struct store *s, char *why, size_t why_len);

#endif /* KVPOOL_STORE_IMPL_H */
