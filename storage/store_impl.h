/*
 * store_impl.h - the pool's internal structures, shared by the files of
 * storage/ only (never included outside it).
 *
 * Locking: one mutex per pool, s->lock. Functions named *_locked expect
 * the caller to hold it; public store_* functions take it themselves.
 * Nothing copies payload bytes while holding it.
 *
 * Block life cycle:
 *   RESERVED  store_put_begin made it; on s->reserved; not in the index;
 *             parent_blk is the parent it pins (a ref), if any.
 *   VISIBLE   committed; in the index, on its namespace's list, on its
 *             parent's child list; in the LRU heap exactly when evictable.
 *   REMOVED   deleted/dropped/evicted while GET refs were held; on
 *             s->zombies until the last store_release frees its pages.
 * Evictable = VISIBLE, no visible children, no refs, no lease pins. The
 * LRU heap is a min-heap on last_use (a use counter) of evictable blocks
 * only, so a block that loses its last child re-enters at its own recency.
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

struct store_block {
	struct store_index_node node;     /* ns_id, key, hash chain */
	uint8_t parent[STORE_KEY_BYTES];  /* zeros for a first block */
	uint8_t has_parent;
	uint8_t state;                    /* enum store_block_state */
	uint32_t first_page, pages;       /* arena extent */
	uint64_t length;                  /* payload bytes */
	uint64_t checksum;                /* xxh3-64 given by the client */
	uint32_t refs;                    /* GET pins + pins by child reservations */
	uint32_t lease_pins;              /* leases held on it */
	uint32_t children;                /* visible children */
	uint32_t heap_idx;                /* LRU heap slot, STORE_HEAP_NONE if not evictable */
	uint64_t last_use;                /* s->clock at last put, GET or MATCH */
	struct store_ns *ns;
	struct store_block *parent_blk;   /* visible parent; for a reservation the pinned one */
	struct store_list child_list;     /* visible children (their sibling links) */
	struct store_list sibling;        /* in parent_blk->child_list */
	struct store_list link;           /* ns->blocks, s->reserved or s->zombies */
	struct store_list leases;         /* struct store_lease.by_block */
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
	struct store_list blocks; /* visible blocks, struct store_block.link */
	uint64_t nblocks, bytes;
	uint64_t puts, put_exists, put_errors;
	uint64_t get_hits, get_misses, exists_hits, exists_misses;
	uint64_t match_requests, match_blocks_queried, match_blocks_matched;
	uint64_t evictions, deletes;
};

struct store {
	pthread_mutex_t lock;
	struct store_config cfg;
	struct store_arena *arena;
	uint64_t capacity_bytes;
	struct store_index index;     /* visible blocks only */
	struct store_block **heap;    /* LRU min-heap of evictable blocks */
	uint64_t heap_len, heap_cap;
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
	/* used_bytes: arena bytes of committed blocks not yet freed, visible
	 * or REMOVED (zombie_bytes of them), so used + inflight + free =
	 * capacity at every moment */
	uint64_t used_bytes, payload_bytes, inflight_bytes, zombie_bytes;
	uint64_t blocks, evictions, leases_active, checksum_errors;
};

/* ---- store.c ---- */
/* The namespace with this id, or NULL. */
struct store_ns *store_ns_find_locked(struct store *s, uint32_t ns_id);
/* The visible block (ns_id, key), or NULL. */
struct store_block *store_find_locked(struct store *s, uint32_t ns_id,
				      const uint8_t key[STORE_KEY_BYTES]);
/* 4 KiB pages needed for length bytes (no overflow for any length). */
uint64_t store_pages_of(uint64_t length);

/* ---- block.c: LRU heap, removal, eviction ---- */
/* VISIBLE, no visible children, no refs, no lease pins. */
bool store_block_evictable(const struct store_block *b);
/* Put b in the heap or take it out so membership matches evictability. */
void store_lru_sync_locked(struct store *s, struct store_block *b);
/* Mark b used now (most recent). */
void store_lru_touch_locked(struct store *s, struct store_block *b);
/* Room in the heap for `count` blocks. Errors: -ENOMEM. */
int store_lru_reserve_locked(struct store *s, uint64_t count);
/* Give back a block's pages and header (not on any list any more). */
void store_block_free_locked(struct store *s, struct store_block *b);
/* Drop one ref; frees a REMOVED block at its last ref. */
void store_block_unpin_locked(struct store *s, struct store_block *b);
/* Make visible block b (with no visible children) leave the pool. */
void store_block_remove_locked(struct store *s, struct store_block *b);
/* Remove root and every visible descendant; returns the block count and
 * adds their payload bytes to *bytes (may be NULL). */
uint64_t store_block_remove_tree_locked(struct store *s, struct store_block *root,
					uint64_t *bytes);
/* Allocate `pages`, evicting LRU leaves as needed. Errors: -ENOSPC. */
int store_alloc_evicting_locked(struct store *s, uint32_t pages, uint32_t *first);

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

#endif /* KVPOOL_STORE_IMPL_H */
