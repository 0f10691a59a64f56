/*
 * slab.c - block headers from 1 MiB chunks with a free list, so a PUT
 * allocates nothing on the hot path and a header costs its size and no
 * allocator overhead.
 *
 * Each chunk is one anonymous mapping aligned to its own size, so the
 * chunk of any header is its address rounded down, and each header has a
 * 32-bit id (chunk number * headers per chunk + slot + 1; 0 is never an
 * id). Freed headers go on a free list threaded through their first four
 * bytes (state 0) and are reused first. Chunks are never returned before
 * store_slab_destroy: a pool that once held N blocks keeps N headers' worth
 * (counted in index_bytes), which is what it needs to hold them again.
 *
 * Threads: none of these functions lock; the store's mutex serialises them.
 * A MATCH without the lock reads headers through store_slab_ptr_racy: the
 * chunk table is replaced (never realloc'd in place) and the old one freed
 * after sl->quiesce, and a chunk is in the table before nchunks counts it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core.h"

/* Map one chunk aligned to STORE_SLAB_CHUNK_BYTES: map twice the size and
 * unmap what lies outside the aligned middle. NULL without memory. */
static char *map_chunk(void)
{
	size_t len = 2 * (size_t)STORE_SLAB_CHUNK_BYTES;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t start, end;

	if (p == MAP_FAILED)
		return NULL;
	start = ((uintptr_t)p + STORE_SLAB_CHUNK_BYTES - 1) & ~(uintptr_t)(STORE_SLAB_CHUNK_BYTES - 1);
	end = start + STORE_SLAB_CHUNK_BYTES;
	if (start > (uintptr_t)p)
		munmap(p, start - (uintptr_t)p);
	if ((uintptr_t)p + len > end)
		munmap((void *)end, (uintptr_t)p + len - end);
	return (char *)start;
}

int store_slab_init(struct store_slab *sl)
{
	memset(sl, 0, sizeof(*sl));
	sl->chunks = calloc(16, sizeof(*sl->chunks));
	if (!sl->chunks)
		return -ENOMEM;
	sl->cap = 16;
	return 0;
}

/* Add a chunk; its headers become the fresh ones. Errors: -ENOMEM. */
static int slab_grow(struct store_slab *sl)
{
	char *c;

	if (sl->nchunks == sl->cap) {
		/* A new table, not realloc: a lock-free MATCH may be reading
		 * the old one until quiesce returns (core.h). */
		uint32_t cap = sl->cap * 2;
		char **t = malloc(cap * sizeof(*t)), **old = sl->chunks;

		if (!t)
			return -ENOMEM;
		memcpy(t, old, sl->nchunks * sizeof(*t));
		__atomic_store_n(&sl->chunks, t, __ATOMIC_RELEASE);
		sl->cap = cap;
		if (sl->quiesce)
			sl->quiesce(sl->quiesce_arg);
		free(old);
	}
	if ((uint64_t)(sl->nchunks + 1) * STORE_SLAB_PER_CHUNK >= UINT32_MAX)
		return -ENOMEM; /* ids are 32-bit */
	c = map_chunk();
	if (!c)
		return -ENOMEM;
	memcpy(c, &sl->nchunks, sizeof(sl->nchunks)); /* the chunk's number */
	sl->chunks[sl->nchunks] = c;
	__atomic_store_n(&sl->nchunks, sl->nchunks + 1, __ATOMIC_RELEASE);
	sl->fresh = 0;
	return 0;
}

struct store_block *store_slab_alloc(struct store_slab *sl)
{
	struct store_block *b;

	if (sl->free_head) {
		b = store_slab_ptr(sl, sl->free_head);
		memcpy(&sl->free_head, b, sizeof(sl->free_head));
	} else {
		if (!sl->nchunks || sl->fresh == STORE_SLAB_PER_CHUNK) {
			if (slab_grow(sl))
				return NULL;
		}
		b = (struct store_block *)(void *)(sl->chunks[sl->nchunks - 1] + STORE_SLAB_HDR_BYTES +
						   (size_t)sl->fresh * sizeof(*b));
		sl->fresh++;
	}
	memset(b, 0, sizeof(*b));
	sl->live++;
	return b;
}

void store_slab_free(struct store_slab *sl, struct store_block *b)
{
	uint32_t id = store_slab_id(b);

	b->state = 0; /* free: aging skips it, a stale MATCH intent ignores it */
	memcpy(b, &sl->free_head, sizeof(sl->free_head));
	sl->free_head = id;
	sl->live--;
}

struct store_block *store_slab_chunk(const struct store_slab *sl, uint32_t c, uint32_t *count)
{
	*count = c + 1 == sl->nchunks ? sl->fresh : STORE_SLAB_PER_CHUNK;
	return (struct store_block *)(void *)(sl->chunks[c] + STORE_SLAB_HDR_BYTES);
}

uint64_t store_slab_bytes(const struct store_slab *sl)
{
	return (uint64_t)sl->nchunks * STORE_SLAB_CHUNK_BYTES + sl->cap * sizeof(*sl->chunks);
}

void store_slab_destroy(struct store_slab *sl)
{
	for (uint32_t i = 0; i < sl->nchunks; i++)
		munmap(sl->chunks[i], STORE_SLAB_CHUNK_BYTES);
	free(sl->chunks);
	memset(sl, 0, sizeof(*sl));
}
