/*
 * block.c - block removal and eviction: the LRU heap of evictable blocks,
 * unlinking a block (or a whole subtree) from index, namespace, parent and
 * leases, and freeing its pages when no reference is left.
 */
#include <errno.h>
#include <stdlib.h>

#include "store_impl.h"

bool store_block_evictable(const struct store_block *b)
{
	return b->state == STORE_BLOCK_VISIBLE && b->children == 0 && b->refs == 0 &&
	       b->lease_pins == 0;
}

/* ---- LRU heap: min-heap on last_use ---- */

static void heap_place(struct store *s, uint64_t i, struct store_block *b)
{
	s->heap[i] = b;
	b->heap_idx = (uint32_t)i;
}

/* Move the block at slot i towards the root while it is older than its parent. */
static void heap_up(struct store *s, uint64_t i)
{
	struct store_block *b = s->heap[i];

	while (i > 0) {
		uint64_t up = (i - 1) / 2;

		if (s->heap[up]->last_use <= b->last_use)
			break;
		heap_place(s, i, s->heap[up]);
		i = up;
	}
	heap_place(s, i, b);
}

/* Move the block at slot i towards the leaves while a child is older. */
static void heap_down(struct store *s, uint64_t i)
{
	struct store_block *b = s->heap[i];

	for (;;) {
		uint64_t l = 2 * i + 1, r = l + 1, m = l;

		if (l >= s->heap_len)
			break;
		if (r < s->heap_len && s->heap[r]->last_use < s->heap[l]->last_use)
			m = r;
		if (s->heap[m]->last_use >= b->last_use)
			break;
		heap_place(s, i, s->heap[m]);
		i = m;
	}
	heap_place(s, i, b);
}

static void heap_insert(struct store *s, struct store_block *b)
{
	s->heap[s->heap_len] = b;
	b->heap_idx = (uint32_t)s->heap_len;
	s->heap_len++;
	heap_up(s, b->heap_idx);
}

static void heap_remove(struct store *s, struct store_block *b)
{
	uint64_t i = b->heap_idx;
	struct store_block *last = s->heap[--s->heap_len];

	b->heap_idx = STORE_HEAP_NONE;
	if (i == s->heap_len)
		return;
	heap_place(s, i, last);
	heap_up(s, i);
	heap_down(s, last->heap_idx);
}

int store_lru_reserve_locked(struct store *s, uint64_t count)
{
	struct store_block **h;
	uint64_t cap = s->heap_cap ? s->heap_cap : 64;

	if (count <= s->heap_cap)
		return 0;
	while (cap < count)
		cap *= 2;
	h = realloc(s->heap, cap * sizeof(*h));
	if (!h)
		return -ENOMEM;
	s->heap = h;
	s->heap_cap = cap;
	return 0;
}

void store_lru_sync_locked(struct store *s, struct store_block *b)
{
	bool in = b->heap_idx != STORE_HEAP_NONE;

	if (store_block_evictable(b) && !in)
		heap_insert(s, b);
	else if (!store_block_evictable(b) && in)
		heap_remove(s, b);
}

void store_lru_touch_locked(struct store *s, struct store_block *b)
{
	b->last_use = ++s->clock;
	if (b->heap_idx != STORE_HEAP_NONE)
		heap_down(s, b->heap_idx);
}

/* ---- freeing and removal ---- */

void store_block_free_locked(struct store *s, struct store_block *b)
{
	(void)store_arena_free(s->arena, b->first_page);
	free(b);
}

void store_block_unpin_locked(struct store *s, struct store_block *b)
{
	b->refs--;
	if (b->state == STORE_BLOCK_REMOVED && b->refs == 0) {
		uint64_t arena_bytes = (uint64_t)b->pages * STORE_PAGE_BYTES;

		store_list_del(&b->link);
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
	struct store_block *p = b->parent_blk;

	if (!p)
		return;
	store_list_del(&b->sibling);
	p->children--;
	b->parent_blk = NULL;
	store_lru_sync_locked(s, p);
}

void store_block_remove_locked(struct store *s, struct store_block *b)
{
	uint64_t arena_bytes = (uint64_t)b->pages * STORE_PAGE_BYTES;

	(void)store_index_remove(&s->index, &b->node);
	store_list_del(&b->link);
	b->ns->nblocks--;
	b->ns->bytes -= b->length;
	s->blocks--;
	s->payload_bytes -= b->length;
	if (b->heap_idx != STORE_HEAP_NONE)
		heap_remove(s, b);
	b->state = STORE_BLOCK_REMOVED;
	store_lease_end_block_locked(s, b);
	unlink_parent(s, b);
	if (b->refs == 0) {
		s->used_bytes -= arena_bytes;
		store_block_free_locked(s, b);
		return;
	}
	/* a GET still sends from these pages: they stay in used_bytes; the
	 * namespace may be reclaimed before the last release */
	b->ns = NULL;
	store_list_add_tail(&s->zombies, &b->link);
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

		while (!store_list_empty(&cur->child_list))
			cur = store_container_of(cur->child_list.next, struct store_block, sibling);
		up = cur->parent_blk;
		if (bytes)
			*bytes += cur->length;
		n++;
		if (cur == root) {
			store_block_remove_locked(s, cur);
			return n;
		}
		store_block_remove_locked(s, cur);
		cur = up;
	}
}

/* Evict the least recently used evictable block. Errors: -ENOSPC. */
static int evict_one(struct store *s)
{
	struct store_block *victim;

	if (s->heap_len == 0)
		return -ENOSPC;
	victim = s->heap[0];
	victim->ns->evictions++;
	s->evictions++;
	store_block_remove_locked(s, victim);
	return 0;
}

int store_alloc_evicting_locked(struct store *s, uint32_t pages, uint32_t *first)
{
	int rc = store_arena_alloc(s->arena, pages, first);

	if (rc != -ENOSPC)
		return rc;
	/* leases that ran out since the last tick must not keep blocks */
	store_lease_expire_locked(s, store_now_ms());
	while ((rc = store_arena_alloc(s->arena, pages, first)) == -ENOSPC) {
		rc = evict_one(s);
		if (rc)
			return rc;
	}
	return rc;
}
