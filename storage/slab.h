/*
 * slab.h - block headers (slab.c; internal to storage/): 1 MiB chunks of
 * struct store_block, each header named by a 32-bit id.
 */
#ifndef KVPOOL_STORE_SLAB_H
#define KVPOOL_STORE_SLAB_H

#include <stdint.h>

#include "block.h"

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

#endif /* KVPOOL_STORE_SLAB_H */
