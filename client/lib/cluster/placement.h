/*
 * placement.h - which node holds a block (internal to the cluster).
 *
 * The one question placement answers is owner(key, where it sits in its
 * chain) -> node. Everything else in the cluster asks only that, through
 * these functions, so that the rule can change here alone.
 *
 * Today's rule: a chain is cut into segments of D blocks (segment k:
 * blocks k*D .. k*D+D-1); a segment lives on the member with the highest
 * HRW score for the key of its first block (hrw.c). A segment's first
 * block starts a run on its owner (stored there with no parent), so each
 * node keeps the no-holes rule for what it holds. A MATCH sends each node
 * the concatenation of its runs, in chain order.
 *
 * Chain positions. PUT, GET, EXISTS and DELETE name blocks by key only,
 * so the cluster remembers, per key it has seen, where it sits: a MATCH
 * teaches every key of its chain (a MATCH is given a chain from its first
 * block), a PUT every block it stores (a block with no parent is position
 * 0; any other one past its parent). The table holds KVCL_POS_SLOTS
 * entries, KVCL_POS_WAYS-way set-associative, the oldest entry of a set
 * making room. A key whose place is not known cannot be placed.
 *
 * Threads: under the cluster's lock.
 */
#ifndef KVC_PLACEMENT_H
#define KVC_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define KVCL_MAX_NODES 64
#define KVCL_POS_SLOTS (1u << 16) /* chain positions remembered */
#define KVCL_POS_WAYS 8

/* Where a block sits in its chain. */
struct kvcl_loc {
	uint32_t pos;                    /* 0 for a chain's first block */
	uint8_t run[KVPOOL_KEY_BYTES];   /* the key its placement is decided by */
};

/* The members a call places on (indices are per view). */
struct kvcl_view {
	size_t n;
	uint64_t seed[KVCL_MAX_NODES];
	const char *name[KVCL_MAX_NODES];
	struct kvcl_node *node[KVCL_MAX_NODES];
};

struct kvcl_pos;

struct kvcl_place {
	uint32_t segment_blocks;         /* D */
	struct kvcl_pos *pos;            /* the table */
	uint32_t clock;
	uint64_t unplaced;               /* blocks whose place was unknown */
};

/* Set up / free the table. Errors: -ENOMEM. */
int kvcl_place_init(struct kvcl_place *pl);
void kvcl_place_free(struct kvcl_place *pl);

/* MATCH: learn every key of chain[0..count) (from its first block). */
void kvcl_place_learn_chain(struct kvcl_place *pl, const uint8_t (*chain)[KVPOOL_KEY_BYTES],
			    size_t count);

/* The place of the i-th block of a chain given from its first block. */
void kvcl_place_chain_loc(const struct kvcl_place *pl, const uint8_t (*chain)[KVPOOL_KEY_BYTES],
			  size_t i, struct kvcl_loc *out);

/* PUT: the place of block key with `parent` (NULL or zero: a first block),
 * remembered. Errors: -ENOLINK (the parent's place is not known; counted
 * as unplaced). */
int kvcl_place_put(struct kvcl_place *pl, const uint8_t *key, const uint8_t *parent,
		   struct kvcl_loc *out);

/* GET, EXISTS, DELETE: the remembered place of key. Errors: -ENOENT (not
 * known; counted as unplaced). */
int kvcl_place_find(struct kvcl_place *pl, const uint8_t *key, struct kvcl_loc *out);

/* Does the block at loc start a run on its owner (no parent there)? */
int kvcl_place_starts_run(const struct kvcl_place *pl, const struct kvcl_loc *loc);

/* The owner of the block at loc: an index into v, -1 when v is empty. */
int kvcl_place_owner(const struct kvcl_place *pl, const struct kvcl_view *v,
		     const struct kvcl_loc *loc);

/* The share of placements each member of v gets (fractions into share[],
 * from a fixed sample of keys). */
void kvcl_place_shares(const struct kvcl_place *pl, const struct kvcl_view *v, double *share);

#endif /* KVC_PLACEMENT_H */
