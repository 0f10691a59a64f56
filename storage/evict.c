/*
 * evict.c - block removal and eviction: the LRU heaps, unlinking a block
 * (or a whole subtree) from index, namespace, parent and leases, freeing
 * its pages when no reference is left, DELETE, and making DRAM room.
 */
#include <errno.h>
#include <stdlib.h>

#include "core.h"
#include "nvme/tier.h"

bool store_block_evictable(const struct store_block *b)
{
	return b->state == STORE_BLOCK_VISIBLE && b->in_dram && !store_has_children(b) &&
	       b->refs == 0 && !b->leased && !b->retained;
}

bool store_lru_member(const struct store *s, const struct store_block *b, enum store_lru_kind kind)
{
	switch (kind) {
	case STORE_LRU_EVICT:
		return store_block_evictable(b);
	case STORE_LRU_CLEAN:
		return s->tier && b->state == STORE_BLOCK_VISIBLE && b->in_dram && b->on_nvme &&
		       b->refs == 0 && !b->leased;
	case STORE_LRU_DIRTY:
		return s->tier && b->state == STORE_BLOCK_VISIBLE && b->in_dram && !b->on_nvme &&
		       !b->demoting;
	default:
		return false;
	}
}

/* ---- LRU heaps: min-heaps on last_use ----
 * A block has two slot indexes: EVICT's, and one shared by CLEAN and
 * DIRTY, which never hold the same block (store_lru_slot). */

/* Record that b sits at slot i of heap k. */
static void slot_set(struct store_block *b, int k, uint32_t i)
{
	if (k == STORE_LRU_EVICT) {
		b->heap_idx[0] = i;
		return;
	}
	b->heap_idx[1] = i;
	b->slot1_clean = k == STORE_LRU_CLEAN;
}

/* The block at slot i of heap h. */
static struct store_block *heap_at(const struct store *s, const struct store_heap *h, uint64_t i)
{
	return store_slab_ptr(&s->slab, h->v[i]);
}

static void heap_place(struct store *s, int k, uint64_t i, struct store_block *b)
{
	s->lru[k].v[i] = store_slab_id(b);
	slot_set(b, k, (uint32_t)i);
}

/* Move the block at slot i towards the root while it is older than its parent. */
static void heap_up(struct store *s, int k, uint64_t i)
{
	struct store_heap *h = &s->lru[k];
	struct store_block *b = heap_at(s, h, i);

	while (i > 0) {
		uint64_t up = (i - 1) / 2;
		struct store_block *p = heap_at(s, h, up);

		if (p->last_use <= b->last_use)
			break;
		heap_place(s, k, i, p);
		i = up;
	}
	heap_place(s, k, i, b);
}

/* Move the block at slot i towards the leaves while a child is older. */
static void heap_down(struct store *s, int k, uint64_t i)
{
	struct store_heap *h = &s->lru[k];
	struct store_block *b = heap_at(s, h, i);

	for (;;) {
		uint64_t l = 2 * i + 1, r = l + 1;
		struct store_block *m;

		if (l >= h->len)
			break;
		m = heap_at(s, h, l);
		if (r < h->len && heap_at(s, h, r)->last_use < m->last_use) {
			m = heap_at(s, h, r);
			l = r;
		}
		if (m->last_use >= b->last_use)
			break;
		heap_place(s, k, i, m);
		i = l;
	}
	heap_place(s, k, i, b);
}

static void heap_insert(struct store *s, int k, struct store_block *b)
{
	struct store_heap *h = &s->lru[k];
	uint64_t i = h->len++;

	heap_place(s, k, i, b);
	heap_up(s, k, i);
	if (k == STORE_LRU_CLEAN)
		s->clean_pages += b->pages;
}

static void heap_remove(struct store *s, int k, struct store_block *b)
{
	struct store_heap *h = &s->lru[k];
	uint64_t i = store_lru_slot(b, k);
	struct store_block *last = heap_at(s, h, --h->len);

	slot_set(b, k, STORE_HEAP_NONE);
	if (k == STORE_LRU_CLEAN)
		s->clean_pages -= b->pages;
	if (i == h->len)
		return;
	heap_place(s, k, i, last);
	heap_up(s, k, i);
	heap_down(s, k, store_lru_slot(last, k));
}

/* Grow heap h to hold `count` blocks. Errors: -ENOMEM. */
static int heap_reserve(struct store_heap *h, uint64_t count)
{
	uint32_t *v;
	uint64_t cap = h->cap ? h->cap : 64;

	if (count <= h->cap)
		return 0;
	while (cap < count)
		cap *= 2;
	v = realloc(h->v, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	h->v = v;
	h->cap = cap;
	return 0;
}

/* Without an NVMe tier only the EVICT heap is kept. */
int store_lru_reserve_locked(struct store *s, uint64_t count)
{
	int kinds = s->tier ? STORE_LRU_KINDS : 1;

	for (int k = 0; k < kinds; k++) {
		int rc = heap_reserve(&s->lru[k], count);

		if (rc)
			return rc;
	}
	return 0;
}

/* Leaving heaps first, then joining: a block moving from DIRTY to CLEAN
 * (or back) frees the slot the two share before taking it. */
void store_lru_sync_locked(struct store *s, struct store_block *b)
{
	int kinds = s->tier ? STORE_LRU_KINDS : 1;
	bool want[STORE_LRU_KINDS];

	for (int k = 0; k < kinds; k++) {
		want[k] = store_lru_member(s, b, (enum store_lru_kind)k);
		if (!want[k] && store_lru_slot(b, k) != STORE_HEAP_NONE)
			heap_remove(s, k, b);
	}
	for (int k = 0; k < kinds; k++)
		if (want[k] && store_lru_slot(b, k) == STORE_HEAP_NONE)
			heap_insert(s, k, b);
}

/*
 * Aging: last_use and the clock are 32 bits, so before the clock passes
 * UINT32_MAX every header in use (VISIBLE or REMOVED; a reservation's
 * union holds its pending parent key, and a free header has state 0) and
 * the clock are halved. Halving is monotone - a <= b gives a / 2 <= b / 2
 * - so every order that held still holds, as equal or the same way:
 * each LRU heap (parent <= child) stays a valid heap without a single
 * move, the clock stays >= every last_use, reclaim's recent/old cut and
 * the quota victim scan still see the same older/newer relation. What is
 * lost is strictness: 2k and 2k+1 both become k, so two blocks used at
 * consecutive counts may tie (either can go first). A block used after
 * the pass gets clock + 1, above every halved value, so "used since"
 * stays exact.
 */
void store_lru_age_locked(struct store *s)
{
	for (uint32_t c = 0; c < s->slab.nchunks; c++) {
		uint32_t count;
		struct store_block *b = store_slab_chunk(&s->slab, c, &count);

		for (uint32_t i = 0; i < count; i++, b++)
			if (b->state == STORE_BLOCK_VISIBLE || b->state == STORE_BLOCK_REMOVED)
				b->last_use /= 2;
	}
	s->clock /= 2;
	s->clock_epoch++;
}

void store_lru_touch_locked(struct store *s, struct store_block *b)
{
	if (s->clock == UINT32_MAX)
		store_lru_age_locked(s);
	b->last_use = ++s->clock;
	for (int k = 0; k < STORE_LRU_KINDS; k++) {
		uint32_t i = store_lru_slot(b, k);

		if (i != STORE_HEAP_NONE)
			heap_down(s, k, i);
	}
}

/* ---- freeing and removal ---- */

void store_block_free_locked(struct store *s, struct store_block *b)
{
	if (b->in_dram)
		(void)store_arena_free(s->arena, b->first_page);
	store_slab_free(&s->slab, b);
}

void store_block_unpin_locked(struct store *s, struct store_block *b)
{
	b->refs--;
	if (b->state == STORE_BLOCK_REMOVED && b->refs == 0) {
		uint64_t arena_bytes = b->in_dram ? store_extent_bytes(b) : 0;

		store_ring_del(s, &s->zombies, b, STORE_RING_LINK);
		s->nzombies--;
		s->zombie_bytes -= arena_bytes;
		s->used_bytes -= arena_bytes; /* the pages are free only now */
		store_block_free_locked(s, b);
		return;
	}
	store_lru_sync_locked(s, b);
}

/* Detach b from its parent's child list; the parent may become evictable. */
static void unlink_parent(struct store *s, struct store_block *b)
{
	struct store_block *p = store_parent(s, b);

	if (!p)
		return;
	store_child_del(s, p, b);
	b->parent_id = 0;
	store_lru_sync_locked(s, p);
}

/* Take b out of every heap (it is leaving the pool). */
static void lru_leave_all(struct store *s, struct store_block *b)
{
	for (int k = 0; k < STORE_LRU_KINDS; k++)
		if (store_lru_slot(b, k) != STORE_HEAP_NONE)
			heap_remove(s, k, b);
}

void store_block_remove_locked(struct store *s, struct store_block *b)
{
	uint64_t arena_bytes = b->in_dram ? store_extent_bytes(b) : 0;
	struct store_ns *ns = store_block_ns(s, b);

	store_event_block_locked(s, b, STORE_EVENT_REMOVED);
	store_wr_begin(s);
	(void)store_index_remove(&s->index, &b->node);
	store_wr_end(s);
	store_ring_del(s, &ns->blocks, b, STORE_RING_LINK);
	ns->nblocks--;
	ns->bytes -= store_block_length(b);
	if (store_block_tenant(s, b))
		store_block_tenant(s, b)->bytes -= store_block_length(b);
	s->blocks--;
	if (b->in_dram) {
		s->payload_bytes -= store_block_length(b);
		s->dram_blocks--;
	}
	lru_leave_all(s, b);
	if (b->retained)
		store_retain_drop_locked(s, b);
	b->state = STORE_BLOCK_REMOVED;
	store_lease_end_block_locked(s, b);
	unlink_parent(s, b);
	if (s->tier)
		store_tier_removed_locked(s, b);
	if (b->on_nvme)
		store_tier_detach_locked(s, b);
	if (b->refs == 0) {
		s->used_bytes -= arena_bytes;
		store_block_free_locked(s, b);
		return;
	}
	/* a GET still sends from these pages (or an I/O thread holds the
	 * block): they stay in used_bytes; the namespace may be reclaimed
	 * before the last release */
	store_ring_add_tail(s, &s->zombies, b, STORE_RING_LINK);
	s->nzombies++;
	s->zombie_bytes += arena_bytes;
}

/* Post-order walk without recursion (chains can be thousands deep): go
 * down to a leaf, remove it, continue from its parent. */
uint64_t store_block_remove_tree_locked(struct store *s, struct store_block *root,
					uint64_t *bytes)
{
	struct store_block *cur = root;
	uint64_t n = 0;

	for (;;) {
		struct store_block *up;

		while (cur->first_child)
			cur = store_blk(s, cur->first_child);
		up = store_parent(s, cur);
		if (bytes)
			*bytes += store_block_length(cur);
		n++;
		if (cur == root) {
			store_block_remove_locked(s, cur);
			return n;
		}
		store_block_remove_locked(s, cur);
		cur = up;
	}
}

void store_block_drop_dram_locked(struct store *s, struct store_block *b)
{
	uint64_t arena_bytes = store_extent_bytes(b);

	(void)store_arena_free(s->arena, b->first_page);
	b->in_dram = 0;
	s->used_bytes -= arena_bytes;
	s->payload_bytes -= store_block_length(b);
	s->dram_blocks--;
	store_lru_sync_locked(s, b);
}

/* Evict the least recently used evictable block. Errors: -ENOSPC. */
static int evict_one(struct store *s)
{
	struct store_heap *h = &s->lru[STORE_LRU_EVICT];
	struct store_block *victim;

	if (h->len == 0)
		return -ENOSPC;
	victim = heap_at(s, h, 0);
	store_block_ns(s, victim)->evictions++;
	s->evictions++;
	store_block_remove_locked(s, victim);
	return 0;
}

/* One step towards free DRAM: drop the LRU clean copy, or (without a
 * working tier) evict the LRU leaf. Errors: -ENOSPC, -EAGAIN. */
static int make_room_step(struct store *s)
{
	struct store_heap *clean = &s->lru[STORE_LRU_CLEAN];

	if (!s->tier)
		return evict_one(s);
	if (clean->len) {
		store_block_drop_dram_locked(s, heap_at(s, clean, 0));
		return 0;
	}
	if (store_tier_fallback_locked(s)) {
		int rc = evict_one(s);

		/* A tier that is only stalled (its last reclaim freed too
		 * little, but did free something) tries again soon, and its
		 * dirty blocks are room to come: BUSY, not FULL, when no leaf
		 * can go meanwhile. A reclaim that could free nothing at all
		 * (every block kept, e.g. one chain longer than both tiers)
		 * will not do better by waiting: FULL. */
		if (rc == -ENOSPC && s->lru[STORE_LRU_DIRTY].len &&
		    store_tier_may_recover_locked(s))
			return -EAGAIN;
		return rc;
	}
	if (store_tier_request_demote_locked(s))
		return -EAGAIN;
	return -ENOSPC;
}

int store_alloc_room_locked(struct store *s, uint32_t pages, uint32_t *first)
{
	int rc = store_arena_alloc(s->arena, pages, first);
	uint64_t t0, us;

	if (rc != -ENOSPC)
		return rc;
	/* An eviction pass: timed, since every other put waits for it.
	 * A write section: leases and recency that MATCHes logged count. */
	t0 = store_now_us();
	if (s->evict_hook)
		s->evict_hook(s->evict_hook_arg);
	store_wr_begin(s);
	/* leases and retentions that ran out since the last tick must not
	 * keep blocks */
	store_lease_expire_locked(s, t0 / 1000);
	store_retain_expire_locked(s, t0 / 1000);
	while ((rc = store_arena_alloc(s->arena, pages, first)) == -ENOSPC) {
		rc = make_room_step(s);
		if (rc)
			break;
	}
	store_wr_end(s);
	us = store_now_us() - t0;
	s->evict_passes++;
	if (us > s->evict_pass_max_us)
		s->evict_pass_max_us = us;
	return rc;
}

/* ---- DELETE: a block and its descendants ---- */

int store_delete(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *removed)
{
	uint64_t n = 0;
	int status;
	int rc = store_delete_many(s, ns_id, (const uint8_t (*)[STORE_KEY_BYTES])key, 1, &status,
				   &n);

	if (rc)
		return rc;
	if (status == 0 && removed)
		*removed = n; /* untouched otherwise, as before */
	return status;
}

int store_delete_many(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		      uint32_t count, int *statuses, uint64_t *removed)
{
	struct store_ns *ns;
	uint64_t n = 0, before;
	int rc = 0;

	if (count && (!keys || !statuses))
		return -EINVAL;
	store_lock(s);
	before = store_tier_disk_removals_locked(s);
	ns = store_ns_find_locked(s, ns_id);
	for (uint32_t i = 0; i < count; i++) {
		struct store_block *b = ns ? store_find_locked(s, ns_id, keys[i]) : NULL;
		uint64_t k;

		statuses[i] = b ? 0 : -ENOENT;
		if (!b)
			continue;
		k = store_block_remove_tree_locked(s, b, NULL);
		ns->deletes += k;
		n += k;
	}
	/* answered only once no record of the chains can come back: one
	 * write and one log sync for the whole batch */
	if (store_tier_disk_removals_locked(s) != before)
		rc = store_tier_persist_removals_locked(s);
	pthread_mutex_unlock(&s->lock);
	if (rc) {
		for (uint32_t i = 0; i < count; i++)
			if (statuses[i] == 0)
				statuses[i] = rc;
		return 0;
	}
	if (removed)
		*removed = n;
	return 0;
}
