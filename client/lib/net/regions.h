/*
 * regions.h - the caller memory a handle was told about (kvpool_register):
 * a table of disjoint regions sorted by start address, each with the
 * transport's registration of it (RDMA: a memory registration the server
 * may READ and WRITE), or none (internal to libkvpool).
 *
 * Threads: the table belongs to its session; callers serialise (the
 * engine's lock).
 */
#ifndef KVC_REGIONS_H
#define KVC_REGIONS_H

#include <stddef.h>
#include <stdint.h>

/* One caller memory region (borrowed from the caller). */
struct kvc_region {
	uintptr_t start;
	size_t len_bytes;
	void *mr; /* the transport's registration on the connection, or NULL */
};

struct kvc_regions {
	struct kvc_region *r; /* sorted by start, disjoint */
	size_t n, cap;
};

/* Record buf[0..len) at its sorted place; *at receives its index.
 * Errors: -EINVAL (buf NULL, len 0, or past the end of the address
 * space), -EEXIST (overlaps a region already recorded), -ENOMEM. */
int kvc_regions_add(struct kvc_regions *t, const void *buf, size_t len, size_t *at);

/* The index of the region that starts exactly at buf, or -ENOENT. */
long kvc_regions_index(const struct kvc_regions *t, const void *buf);

/* Forget region i (its registration is the caller's to undo first). */
void kvc_regions_remove(struct kvc_regions *t, size_t i);

/* The region that holds all of buf[0..len), or NULL. Cannot fail. */
const struct kvc_region *kvc_regions_find(const struct kvc_regions *t, const void *buf,
					  size_t len);

/* Free the table (registrations undone first by the caller). */
void kvc_regions_free(struct kvc_regions *t);

#endif /* KVC_REGIONS_H */
