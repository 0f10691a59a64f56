/*
 * arena.h - the DRAM arena and its page extent allocator (internal to
 * storage/).
 *
 * The arena is one anonymous mapping carved into 4 KiB pages. Extents
 * (runs of pages) are either allocated or free; neighbouring free extents
 * are always merged (boundary tags at each extent's first and last page),
 * and free extents sit on segregated lists by size class, so an allocation
 * takes an extent of about the right size in near constant time. All
 * allocator metadata lives outside the arena: the arena holds payload bytes
 * only.
 *
 * Threads: none of these functions lock; the caller serialises every call
 * on one arena (store.c holds its mutex). The payload memory itself may be
 * read and written by any thread that owns an allocated extent.
 */
#ifndef KVPOOL_STORE_ARENA_H
#define KVPOOL_STORE_ARENA_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

/* Largest arena in pages (extent lengths are kept in 31 bits): ~8 TiB. */
#define STORE_ARENA_MAX_PAGES 0x7fffffffu

struct store_arena;

/* Map an arena of `pages` 4 KiB pages (MAP_NORESERVE, huge pages advised)
 * and its metadata; the whole arena starts as one free extent.
 * Errors: -EINVAL (pages 0 or > STORE_ARENA_MAX_PAGES), -ENOMEM. */
int store_arena_open(uint64_t pages, struct store_arena **out);

/* Fault in payload bytes [offset, offset + bytes) (clipped to the arena)
 * with MADV_POPULATE_WRITE, which never changes their content, so it is
 * safe while blocks are being written. Returns the bytes populated: 0 past
 * the end, or where the kernel lacks MADV_POPULATE_WRITE (before 5.14). */
uint64_t store_arena_prefault(struct store_arena *a, uint64_t offset, uint64_t bytes);

/* Unmap the arena and its metadata. Accepts NULL. */
void store_arena_close(struct store_arena *a);

/* Allocate an extent of exactly `pages` pages; *first receives its first
 * page number. Prefers an extent of the same size class, then the smallest
 * larger class; splits the rest off as a free extent.
 * Errors: -EINVAL (pages 0), -ENOSPC (no free extent is large enough). */
int store_arena_alloc(struct store_arena *a, uint32_t pages, uint32_t *first);

/* Free the allocated extent that starts at page `first`, merging it with
 * free neighbours. `first` must come from store_arena_alloc and not have
 * been freed since (checked: a bad page is ignored and returns -EINVAL). */
int store_arena_free(struct store_arena *a, uint32_t first);

/* Address of page `page` (no bounds check; stable for the arena's life). */
void *store_arena_ptr(const struct store_arena *a, uint32_t page);

uint32_t store_arena_pages(const struct store_arena *a);      /* total pages */
uint64_t store_arena_free_pages(const struct store_arena *a); /* free pages */
uint32_t store_arena_free_extents(const struct store_arena *a);
/* Pages of the largest free extent (0 when full). O(extents of the top class). */
uint32_t store_arena_largest_free(const struct store_arena *a);
/* Bytes of allocator metadata (outside the arena). */
uint64_t store_arena_meta_bytes(const struct store_arena *a);

/* Describe the extent that starts at page `page` (walk the arena with
 * page = 0, then page += *pages). Errors: -EINVAL (page out of range). */
int store_arena_extent(const struct store_arena *a, uint32_t page, uint32_t *pages,
		       bool *is_free);

/* Verify the allocator's invariants: extents tile the arena, boundary tags
 * agree, no two free extents touch, free lists and class bitmap match,
 * free page count. Returns 0 or -EFAULT with a reason in why (may be NULL).
 * O(pages of metadata walked = extents + free extents). */
int store_arena_check(const struct store_arena *a, char *why, size_t why_len);

#endif /* KVPOOL_STORE_ARENA_H */
