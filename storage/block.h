/*
 * block.h - a block's header, struct store_block (internal to storage/):
 * its life cycle, its place in the LRU heaps, what it costs.
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
 *          no lease pins, not retained: what leaves the pool when DRAM must make room
 *          and no NVMe tier can take it (absent, unhealthy, stalled).
 *   CLEAN  NVMe tier only: VISIBLE, in DRAM and on NVMe, no refs, no lease
 *          pins: DRAM copies dropped instantly on the put path.
 *   DIRTY  NVMe tier only: VISIBLE, in DRAM, not on NVMe, not being
 *          demoted: what the demoter writes next.
 *
 * Memory per block (index_bytes): a 120-byte header from the slab
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
#ifndef KVPOOL_STORE_BLOCK_H
#define KVPOOL_STORE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "index.h"
#include "store.h"

#define STORE_HEAP_NONE UINT32_MAX

enum store_block_state {
	STORE_BLOCK_RESERVED = 1,
	STORE_BLOCK_VISIBLE,
	STORE_BLOCK_REMOVED,
};

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
	uint16_t retained : 1;            /* a retention keeps it (in s->retain, retain.h) */
	uint16_t retain_dirty : 1;        /* its NVMe record must learn a new deadline (tier) */
	/* visible parent; for a reservation the pinned one (store_parent) */
	uint32_t parent_id;
	/* the tenant its bytes are charged to (store_tenant.id: the writer's,
	 * store_put_begin_for), 0 for none */
	uint32_t tenant_id;
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

/* The header is paid once per block (index_bytes): 120 bytes, 4-byte
 * aligned, so the slab packs 8738 per 1 MiB chunk (116 until the
 * writer's tenant was recorded per block, so that bytes are billed to
 * who wrote them). Nothing in it needs more than 4-byte alignment (ids,
 * the free list's link in its first 4 bytes, the chunk number at the
 * chunk's start): a field that would (a uint64_t) grows it to 128 and
 * fails here. */
_Static_assert(sizeof(struct store_block) == 120, "block header is 120 bytes");
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

/* Extent bytes of b (its pages). */
static inline uint64_t store_extent_bytes(const struct store_block *b)
{
	return (uint64_t)b->pages * STORE_PAGE_BYTES;
}

#endif /* KVPOOL_STORE_BLOCK_H */
