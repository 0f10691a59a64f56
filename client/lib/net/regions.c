/*
 * regions.c - the table of caller memory regions (regions.h). Regions do
 * not overlap and are sorted by start, so a lookup is one binary search.
 */
#include "regions.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Index of the first region whose start is >= addr (n if none). */
static size_t lower_bound(const struct kvc_regions *t, uintptr_t addr)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->r[mid].start < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Does [start, start + len) overlap region r? */
static int overlaps(const struct kvc_region *r, uintptr_t start, size_t len)
{
	return start < r->start + r->len_bytes && r->start < start + len;
}

int kvc_regions_add(struct kvc_regions *t, const void *buf, size_t len, size_t *at)
{
	uintptr_t start = (uintptr_t)buf;
	size_t i;

	if (!buf || len == 0 || len > UINTPTR_MAX - start)
		return -EINVAL;
	i = lower_bound(t, start);
	/* Only the neighbours on either side can overlap a sorted, disjoint table. */
	if ((i < t->n && overlaps(&t->r[i], start, len)) ||
	    (i > 0 && overlaps(&t->r[i - 1], start, len)))
		return -EEXIST;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 8;
		struct kvc_region *p;

		if (cap > SIZE_MAX / sizeof(*p))
			return -ENOMEM;
		p = realloc(t->r, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		t->r = p;
		t->cap = cap;
	}
	memmove(&t->r[i + 1], &t->r[i], (t->n - i) * sizeof(t->r[0]));
	t->r[i] = (struct kvc_region){ .start = start, .len_bytes = len };
	t->n++;
	*at = i;
	return 0;
}

long kvc_regions_index(const struct kvc_regions *t, const void *buf)
{
	size_t i = lower_bound(t, (uintptr_t)buf);

	if (i == t->n || t->r[i].start != (uintptr_t)buf)
		return -ENOENT;
	return (long)i;
}

void kvc_regions_remove(struct kvc_regions *t, size_t i)
{
	memmove(&t->r[i], &t->r[i + 1], (t->n - i - 1) * sizeof(t->r[0]));
	t->n--;
}

const struct kvc_region *kvc_regions_find(const struct kvc_regions *t, const void *buf,
					  size_t len)
{
	uintptr_t start = (uintptr_t)buf;
	size_t i = lower_bound(t, start);
	const struct kvc_region *r;

	/* The region holding start is the one starting at start, or the one before. */
	if (i < t->n && t->r[i].start == start)
		r = &t->r[i];
	else if (i > 0)
		r = &t->r[i - 1];
	else
		return NULL;
	if (start < r->start || len > r->len_bytes || start - r->start > r->len_bytes - len)
		return NULL;
	return r;
}

void kvc_regions_free(struct kvc_regions *t)
{
	free(t->r);
	*t = (struct kvc_regions){ 0 };
}
