/*
 * register.c - kvpool_register and kvpool_unregister: the table of caller
 * memory regions a handle was told about.
 *
 * On TCP the table is only bookkeeping: it checks the caller's promises
 * (no overlap, unregister what was registered). On RDMA each region is
 * also a memory registration (rdmx_client_reg, remote read and write) on
 * the handle's RDMA connection, made here or, for regions registered
 * before it, when the connection is made (conn_rdma.c); buffers inside a
 * region then move without a copy. The table is sorted by start address;
 * regions do not overlap, so a lookup is one binary search.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "rdmx.h"

/* Index of the first region whose start is >= addr (n_regions if none). */
static size_t lower_bound(const struct kvpool_client *c, uintptr_t addr)
{
	size_t lo = 0, hi = c->n_regions;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (c->regions[mid].start < addr)
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

/* Make room for one more region. Errors: -ENOMEM. */
static int regions_reserve(struct kvpool_client *c)
{
	size_t cap = c->regions_cap ? 2 * c->regions_cap : 8;
	struct kvc_region *p;

	if (c->n_regions < c->regions_cap)
		return 0;
	if (cap > SIZE_MAX / sizeof(*p))
		return -ENOMEM;
	p = realloc(c->regions, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	c->regions = p;
	c->regions_cap = cap;
	return 0;
}

int kvpool_register(struct kvpool_client *c, const void *buf, size_t len)
{
	uintptr_t start = (uintptr_t)buf;
	struct rdmx_client_mr *mr = NULL;
	size_t i;
	int rc;

	if (!c || !buf || len == 0 || len > UINTPTR_MAX - start)
		return -EINVAL;
	i = lower_bound(c, start);
	/* Only the neighbours on either side can overlap a sorted, disjoint table. */
	if ((i < c->n_regions && overlaps(&c->regions[i], start, len)) ||
	    (i > 0 && overlaps(&c->regions[i - 1], start, len)))
		return -EEXIST;
	rc = regions_reserve(c);
	if (rc)
		return rc;
	if (c->rdma) {
		rc = rdmx_client_reg(c->rdma, (void *)buf, len, &mr);
		if (rc)
			return rc;
	}
	memmove(&c->regions[i + 1], &c->regions[i], (c->n_regions - i) * sizeof(c->regions[0]));
	c->regions[i] = (struct kvc_region){ .start = start, .len_bytes = len, .mr = mr };
	c->n_regions++;
	return 0;
}

int kvpool_unregister(struct kvpool_client *c, const void *buf)
{
	uintptr_t start = (uintptr_t)buf;
	size_t i;

	if (!c || !buf)
		return -EINVAL;
	i = lower_bound(c, start);
	if (i == c->n_regions || c->regions[i].start != start)
		return -ENOENT;
	if (c->regions[i].mr)
		rdmx_client_dereg(c->rdma, c->regions[i].mr);
	memmove(&c->regions[i], &c->regions[i + 1],
		(c->n_regions - i - 1) * sizeof(c->regions[0]));
	c->n_regions--;
	return 0;
}

const struct kvc_region *kvc_region_find(const struct kvpool_client *c, const void *buf,
					 size_t len)
{
	uintptr_t start = (uintptr_t)buf;
	size_t i = lower_bound(c, start);
	const struct kvc_region *r;

	/* The region holding start is the one starting at start, or the one before. */
	if (i < c->n_regions && c->regions[i].start == start)
		r = &c->regions[i];
	else if (i > 0)
		r = &c->regions[i - 1];
	else
		return NULL;
	if (start < r->start || len > r->len_bytes || start - r->start > r->len_bytes - len)
		return NULL;
	return r;
}

void kvc_regions_free(struct kvpool_client *c)
{
	free(c->regions);
	c->regions = NULL;
	c->n_regions = 0;
	c->regions_cap = 0;
}
