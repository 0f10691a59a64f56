/*
 * arena.c - page extent allocator over one anonymous mapping.
 *
 * Metadata (three uint32 arrays indexed by page, 12 bytes per 4 KiB page,
 * mapped lazily so untouched parts cost nothing):
 *   tag[p]   at an extent's first and last page: (pages << 1) | free
 *   fnext[p], fprev[p]  free-list links, meaningful at a free extent's
 *            first page only
 * Interior pages' entries are never read. Because extents tile the arena,
 * page first-1 is always the last page of the left neighbour and page
 * first+pages the first page of the right one: that is what lets free()
 * merge in O(1).
 *
 * Size classes: 1..15 pages have one exact class each; above that every
 * power of two is split into 8 classes (the three bits after the leading
 * one), so a class spans at most 12.5% of its lower bound.
 */
#include "arena.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE_BYTES 4096u
#define NO_PAGE UINT32_MAX
#define EXACT_CLASSES 16u
#define SL_BITS 3u
#define SL_COUNT (1u << SL_BITS)
#define NCLASSES (EXACT_CLASSES + (31u - 4u) * SL_COUNT)
#define BITMAP_WORDS ((NCLASSES + 63u) / 64u)
#define PROBE_LIMIT 16u

struct store_arena {
	uint8_t *base;             /* the payload pages */
	uint64_t base_bytes;
	uint32_t pages;
	uint32_t *tag;             /* see above */
	uint32_t *fnext, *fprev;
	void *meta;                /* one mapping holding tag, fnext, fprev */
	uint64_t meta_bytes;
	uint64_t free_pages;
	uint32_t free_extents;
	uint32_t head[NCLASSES];   /* first page of each class's free list */
	uint64_t nonempty[BITMAP_WORDS];
};

/* Size class of an extent of n pages (n >= 1). */
static unsigned int class_of(uint32_t n)
{
	unsigned int fl, sl;

	if (n < EXACT_CLASSES)
		return n;
	fl = 31u - (unsigned int)__builtin_clz(n);
	sl = (n >> (fl - SL_BITS)) & (SL_COUNT - 1u);
	return EXACT_CLASSES + (fl - 4u) * SL_COUNT + sl;
}

/* Smallest extent length that belongs to class c. */
static uint64_t class_low(unsigned int c)
{
	unsigned int fl, sl;

	if (c < EXACT_CLASSES)
		return c;
	fl = 4u + (c - EXACT_CLASSES) / SL_COUNT;
	sl = (c - EXACT_CLASSES) % SL_COUNT;
	return (uint64_t)(SL_COUNT + sl) << (fl - SL_BITS);
}

static uint32_t tag_pages(uint32_t t)
{
	return t >> 1;
}

static bool tag_free(uint32_t t)
{
	return t & 1u;
}

/* Write the boundary tags of extent [first, first + n). */
static void set_tags(struct store_arena *a, uint32_t first, uint32_t n, bool is_free)
{
	uint32_t t = (n << 1) | (is_free ? 1u : 0u);

	a->tag[first] = t;
	a->tag[first + n - 1] = t;
}

static void bitmap_set(struct store_arena *a, unsigned int c, bool on)
{
	uint64_t bit = 1ull << (c % 64u);

	if (on)
		a->nonempty[c / 64u] |= bit;
	else
		a->nonempty[c / 64u] &= ~bit;
}

/* First class >= c with a non-empty free list, or NCLASSES. */
static unsigned int next_nonempty(const struct store_arena *a, unsigned int c)
{
	unsigned int w = c / 64u;
	uint64_t bits;

	if (c >= NCLASSES)
		return NCLASSES;
	bits = a->nonempty[w] & (~0ull << (c % 64u));
	for (;;) {
		if (bits)
			return w * 64u + (unsigned int)__builtin_ctzll(bits);
		if (++w >= BITMAP_WORDS)
			return NCLASSES;
		bits = a->nonempty[w];
	}
}

/* Put free extent [first, first + n) on its class list (LIFO). */
static void list_insert(struct store_arena *a, uint32_t first, uint32_t n)
{
	unsigned int c = class_of(n);
	uint32_t old = a->head[c];

	set_tags(a, first, n, true);
	a->fprev[first] = NO_PAGE;
	a->fnext[first] = old;
	if (old != NO_PAGE)
		a->fprev[old] = first;
	a->head[c] = first;
	bitmap_set(a, c, true);
	a->free_pages += n;
	a->free_extents++;
}

/* Take free extent starting at `first` off its class list. */
static void list_remove(struct store_arena *a, uint32_t first)
{
	uint32_t n = tag_pages(a->tag[first]);
	unsigned int c = class_of(n);
	uint32_t next = a->fnext[first], prev = a->fprev[first];

	if (prev != NO_PAGE)
		a->fnext[prev] = next;
	else
		a->head[c] = next;
	if (next != NO_PAGE)
		a->fprev[next] = prev;
	if (a->head[c] == NO_PAGE)
		bitmap_set(a, c, false);
	a->free_pages -= n;
	a->free_extents--;
}

/* Map the payload pages; huge pages are advice only. */
static int map_base(struct store_arena *a, uint64_t pages)
{
	a->base_bytes = pages * PAGE_BYTES;
	a->base = mmap(NULL, a->base_bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (a->base == MAP_FAILED) {
		a->base = NULL;
		return -ENOMEM;
	}
#ifdef MADV_HUGEPAGE
	(void)madvise(a->base, a->base_bytes, MADV_HUGEPAGE);
#endif
	return 0;
}

/* Map the three metadata arrays in one lazily zeroed mapping. */
static int map_meta(struct store_arena *a, uint64_t pages)
{
	a->meta_bytes = pages * 3u * sizeof(uint32_t);
	a->meta = mmap(NULL, a->meta_bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (a->meta == MAP_FAILED) {
		a->meta = NULL;
		return -ENOMEM;
	}
	a->tag = a->meta;
	a->fnext = a->tag + pages;
	a->fprev = a->fnext + pages;
	return 0;
}

uint64_t store_arena_prefault(struct store_arena *a, uint64_t offset, uint64_t bytes)
{
	if (offset >= a->base_bytes)
		return 0;
	if (bytes > a->base_bytes - offset)
		bytes = a->base_bytes - offset;
#ifdef MADV_POPULATE_WRITE
	if (madvise(a->base + offset, bytes, MADV_POPULATE_WRITE) == 0)
		return bytes;
#endif
	return 0;
}

int store_arena_open(uint64_t pages, struct store_arena **out)
{
	struct store_arena *a;
	int rc;

	if (pages == 0 || pages > STORE_ARENA_MAX_PAGES)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	rc = map_base(a, pages);
	if (rc)
		goto out_free;
	rc = map_meta(a, pages);
	if (rc)
		goto out_unmap_base;
	a->pages = (uint32_t)pages;
	for (unsigned int c = 0; c < NCLASSES; c++)
		a->head[c] = NO_PAGE;
	list_insert(a, 0, a->pages);
	*out = a;
	return 0;

out_unmap_base:
	munmap(a->base, a->base_bytes);
out_free:
	free(a);
	return rc;
}

void store_arena_close(struct store_arena *a)
{
	if (!a)
		return;
	munmap(a->meta, a->meta_bytes);
	munmap(a->base, a->base_bytes);
	free(a);
}

/* First extent of class c with at least n pages, looking at no more than
 * `limit` entries; NO_PAGE if none. */
static uint32_t class_find(const struct store_arena *a, unsigned int c, uint32_t n,
			   uint64_t limit)
{
	uint32_t p = a->head[c];

	for (uint64_t i = 0; p != NO_PAGE && i < limit; i++, p = a->fnext[p])
		if (tag_pages(a->tag[p]) >= n)
			return p;
	return NO_PAGE;
}

/* Choose a free extent of at least n pages: a fit in n's own class when
 * one is quickly found (every member fits when n is the class's lower
 * bound), else the head of the next non-empty larger class, else a full
 * scan of n's class. NO_PAGE when nothing fits. */
static uint32_t pick_extent(const struct store_arena *a, uint32_t n)
{
	unsigned int c = class_of(n);
	unsigned int up;
	uint32_t p;

	if (class_low(c) == n && a->head[c] != NO_PAGE)
		return a->head[c];
	p = class_find(a, c, n, PROBE_LIMIT);
	if (p != NO_PAGE)
		return p;
	up = next_nonempty(a, c + 1);
	if (up < NCLASSES)
		return a->head[up];
	return class_find(a, c, n, UINT64_MAX);
}

int store_arena_alloc(struct store_arena *a, uint32_t pages, uint32_t *first)
{
	uint32_t p, have;

	if (pages == 0)
		return -EINVAL;
	if (pages > a->pages)
		return -ENOSPC;
	p = pick_extent(a, pages);
	if (p == NO_PAGE)
		return -ENOSPC;
	have = tag_pages(a->tag[p]);
	list_remove(a, p);
	set_tags(a, p, pages, false);
	if (have > pages)
		list_insert(a, p + pages, have - pages);
	*first = p;
	return 0;
}

int store_arena_free(struct store_arena *a, uint32_t first)
{
	uint32_t n, t;

	if (first >= a->pages)
		return -EINVAL;
	t = a->tag[first];
	n = tag_pages(t);
	if (tag_free(t) || n == 0 || n > a->pages - first || a->tag[first + n - 1] != t)
		return -EINVAL;
	if (first > 0 && tag_free(a->tag[first - 1])) {
		uint32_t left = tag_pages(a->tag[first - 1]);

		list_remove(a, first - left);
		first -= left;
		n += left;
	}
	if (first + n < a->pages && tag_free(a->tag[first + n])) {
		uint32_t right = tag_pages(a->tag[first + n]);

		list_remove(a, first + n);
		n += right;
	}
	list_insert(a, first, n);
	return 0;
}

void *store_arena_ptr(const struct store_arena *a, uint32_t page)
{
	return a->base + (uint64_t)page * PAGE_BYTES;
}

uint32_t store_arena_pages(const struct store_arena *a)
{
	return a->pages;
}

uint64_t store_arena_free_pages(const struct store_arena *a)
{
	return a->free_pages;
}

uint32_t store_arena_free_extents(const struct store_arena *a)
{
	return a->free_extents;
}

uint32_t store_arena_largest_free(const struct store_arena *a)
{
	unsigned int top = NCLASSES;
	uint32_t best = 0;

	/* the highest non-empty class holds the largest extent */
	for (unsigned int w = BITMAP_WORDS; w-- > 0;) {
		if (a->nonempty[w]) {
			top = w * 64u + 63u - (unsigned int)__builtin_clzll(a->nonempty[w]);
			break;
		}
	}
	if (top == NCLASSES)
		return 0;
	for (uint32_t p = a->head[top]; p != NO_PAGE; p = a->fnext[p])
		if (tag_pages(a->tag[p]) > best)
			best = tag_pages(a->tag[p]);
	return best;
}

uint64_t store_arena_meta_bytes(const struct store_arena *a)
{
	return sizeof(*a) + a->meta_bytes;
}

int store_arena_extent(const struct store_arena *a, uint32_t page, uint32_t *pages,
		       bool *is_free)
{
	if (page >= a->pages)
		return -EINVAL;
	*pages = tag_pages(a->tag[page]);
	*is_free = tag_free(a->tag[page]);
	return 0;
}

/* Format a failure reason and return -EFAULT. */
static int fail(char *why, size_t why_len, const char *msg, uint64_t v1, uint64_t v2)
{
	if (why && why_len)
		snprintf(why, why_len, "arena: %s (%llu, %llu)", msg,
			 (unsigned long long)v1, (unsigned long long)v2);
	return -EFAULT;
}

/* Walk the extents in address order: tags, tiling, coalescing, totals. */
static int check_tiling(const struct store_arena *a, char *why, size_t why_len)
{
	uint64_t free_pages = 0, free_ext = 0;
	bool prev_free = false;
	uint32_t p = 0;

	while (p < a->pages) {
		uint32_t t = a->tag[p], n = tag_pages(t);

		if (n == 0 || n > a->pages - p)
			return fail(why, why_len, "bad extent length at page", p, n);
		if (a->tag[p + n - 1] != t)
			return fail(why, why_len, "head and tail tags differ at page", p, n);
		if (tag_free(t) && prev_free)
			return fail(why, why_len, "free extents not merged at page", p, n);
		if (tag_free(t)) {
			free_pages += n;
			free_ext++;
		}
		prev_free = tag_free(t);
		p += n;
	}
	if (free_pages != a->free_pages || free_ext != a->free_extents)
		return fail(why, why_len, "free totals disagree", free_pages, a->free_pages);
	return 0;
}

/* Every free list holds free extent heads of its own class, doubly linked. */
static int check_lists(const struct store_arena *a, char *why, size_t why_len)
{
	uint64_t listed = 0;

	for (unsigned int c = 0; c < NCLASSES; c++) {
		uint32_t prev = NO_PAGE;
		bool on = a->nonempty[c / 64u] >> (c % 64u) & 1u;

		if (on != (a->head[c] != NO_PAGE))
			return fail(why, why_len, "class bitmap wrong for class", c, on);
		for (uint32_t p = a->head[c]; p != NO_PAGE; p = a->fnext[p]) {
			if (p >= a->pages || !tag_free(a->tag[p]))
				return fail(why, why_len, "listed extent not free", c, p);
			if (class_of(tag_pages(a->tag[p])) != c)
				return fail(why, why_len, "extent on wrong class list", c, p);
			if (a->fprev[p] != prev)
				return fail(why, why_len, "broken back link at page", p, prev);
			if (++listed > a->free_extents)
				return fail(why, why_len, "free list longer than free extents", c,
					    listed);
			prev = p;
		}
	}
	if (listed != a->free_extents)
		return fail(why, why_len, "free extents missing from lists", listed,
			    a->free_extents);
	return 0;
}

int store_arena_check(const struct store_arena *a, char *why, size_t why_len)
{
	int rc = check_tiling(a, why, why_len);

	if (rc)
		return rc;
	return check_lists(a, why, why_len);
}
