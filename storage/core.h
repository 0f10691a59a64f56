/*
 * core.h - the DRAM core of the pool (internal to storage/, never included
 * outside it): struct store, namespaces, the lock, block links, and the
 * functions of store.c, put.c, get.c and evict.c that other rooms call.
 * The NVMe wing is reached only through nvme/tier.h.
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
 */
#ifndef KVPOOL_STORE_CORE_H
#define KVPOOL_STORE_CORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "block.h"
#include "clock.h"
#include "index.h"
#include "lease.h"
#include "list.h"
#include "match.h"
#include "retain.h"
#include "slab.h"
#include "store.h"

/* Buckets of the namespace name table: at most STORE_MAX_NAMESPACES / 4
 * names per bucket on average when full, 8 KiB inside struct store. */
#define STORE_NS_BUCKETS 1024u


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
	/* the tenant that created it (counted in its namespaces), or after a
	 * warm restart its first read-write binder; NULL = none. Blocks are
	 * charged to their writers (store_block.tenant_id), not to it. */
	struct store_tenant *tenant;
	uint32_t blocks;          /* ring of its visible blocks (struct store_block.link) */
	uint64_t nblocks, bytes;
	uint64_t puts, put_exists, put_errors;
	uint64_t get_hits, get_misses, exists_hits, exists_misses;
	uint64_t match_requests, match_blocks_queried, match_blocks_matched;
	uint64_t evictions, deletes;
	uint64_t nvme_blocks;     /* visible blocks with an NVMe copy */
	struct store_retain_acct racct; /* its retained blocks (retain.h) */
	uint32_t disk_id;         /* NVMe disk id, 0 until its first demotion */
	bool disk_named;          /* disk_id recorded with the name in the index */
};

/* Rate limit for repeated error log lines: one per interval. */
struct store_ratelimit {
	uint64_t last_ms;
	uint64_t suppressed;
};

struct store_tier;

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
	struct store_tenant **tenant_by_id; /* [id - 1], ntenants of them */
	uint32_t ntenants, tenants_cap;
	struct store_list expiry;     /* active leases, ascending expiry_ms */
	struct store_list lease_pool; /* spare lease records */
	struct store_retain_tab retain; /* retentions by block and deadline (retain.h) */
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
	store_event_fn event_fn;      /* store_set_event_hook; NULL = none */
	void *event_arg;
	bool events_quiet;            /* store_drop_namespace: no REMOVED per block */
};

/* Take the store lock and apply what MATCHes logged meanwhile. */
static inline void store_lock(struct store *s)
{
	pthread_mutex_lock(&s->lock);
	store_match_drain_locked(s);
}

/* Start a change that lock-free MATCH readers must not see half done, or
 * a decision that must see their intents (core.h, top). Nests. */
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
/* The tenant block b's bytes are charged to, or NULL. */
static inline struct store_tenant *store_block_tenant(const struct store *s,
						      const struct store_block *b)
{
	return b->tenant_id ? s->tenant_by_id[b->tenant_id - 1] : NULL;
}
/* The visible block (ns_id, key), or NULL. */
struct store_block *store_find_locked(struct store *s, uint32_t ns_id,
				      const uint8_t key[STORE_KEY_BYTES]);
/* 4 KiB pages needed for length bytes (no overflow for any length). */
uint64_t store_pages_of(uint64_t length);
/* The namespace called name[0..len), created (with no user) if missing.
 * Errors: -ENOMEM, -EDQUOT. */
int store_ns_get_locked(struct store *s, const char *name, size_t len, struct store_ns **out);

/* ---- evict.c: LRU heaps, removal, eviction, DRAM room ---- */
/* VISIBLE, in DRAM, no visible children, no refs, no lease pins, not
 * retained. */
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

/* ---- event.c: the event hook ---- */
/* Tell the hook (if any) that visible block b was stored (publish) or is
 * leaving the pool (before its state changes). */
void store_event_block_locked(struct store *s, const struct store_block *b,
			      enum store_event_kind kind);
/* Tell the hook that namespace ns was emptied. */
void store_event_cleared_locked(struct store *s, const struct store_ns *ns);

/* ---- log.c ---- */
/* Log one line (formatted; call without the lock). */
void store_log(struct store *s, enum store_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Log one line at most once per second per limiter (call without the lock). */
void store_log_limited(struct store *s, struct store_ratelimit *rl, enum store_log_level level,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif /* KVPOOL_STORE_CORE_H */
