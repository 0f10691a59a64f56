/*
 * hot.h - which blocks a cluster handle treats as hot (internal to the
 * cluster backend; docs/cluster.md, "Hot blocks").
 *
 * A block is hot when many chains share it, as every conversation shares
 * its system prompt. The handle learns it from the chains it MATCHes: it
 * counts, per key, the distinct keys seen right after it (its children);
 * a key with at least `threshold` children is a branching point, and it
 * and every key before it in a chain that reaches it are hot - the whole
 * shared prefix, not only its last block. A hot block is written to the
 * first R nodes of its ranking and read from one of them per request
 * (placement.c); a block that is not known hot lives on the first only,
 * so a client that has seen nothing (a one-shot command) still finds
 * every block at its owner.
 *
 * The table is bounded: KVCL_HOT_SLOTS entries of 32 bytes (512 KiB),
 * KVCL_HOT_WAYS-way set-associative, the entry least recently touched
 * making room. Children are remembered as 16-bit fingerprints, the last
 * KVCL_HOT_KIDS per key: counting is exact while a key alternates between
 * at most that many children and counts high beyond it (a key with more
 * children than that is shared anyway).
 *
 * Threads: none of its own; the caller serialises (the cluster's lock).
 */
#ifndef KVC_CLUSTER_HOT_H
#define KVC_CLUSTER_HOT_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define KVCL_HOT_SLOTS (1u << 14)
#define KVCL_HOT_WAYS 8
#define KVCL_HOT_KIDS 6
#define KVCL_HOT_DEFAULT_CHILDREN 32 /* docs/cluster.md: what the simulation chose */

struct kvcl_hot_ent;

struct kvcl_hot {
	struct kvcl_hot_ent *ent;   /* KVCL_HOT_SLOTS entries */
	uint32_t threshold;         /* children that make a key a branching point; 0 = off */
	uint32_t clock;
	uint64_t marked;            /* keys marked hot, ever */
};

/* Set up (threshold 0: nothing is ever hot). Errors: -ENOMEM. */
int kvcl_hot_init(struct kvcl_hot *h, uint32_t threshold);

/* Free the table; accepts a zeroed struct. */
void kvcl_hot_free(struct kvcl_hot *h);

/* Learn chain[0..n) (keys from the chain's first block): count each key's
 * child, then mark every key up to the last one that is hot (marked
 * before, or now has threshold children). Returns how many leading keys
 * of the chain are hot (0: none). */
size_t kvcl_hot_learn(struct kvcl_hot *h, const uint8_t (*chain)[KVPOOL_KEY_BYTES], size_t n);

/* Is `key` marked hot? 1 or 0. Does not change the table. */
int kvcl_hot_is(const struct kvcl_hot *h, const uint8_t key[KVPOOL_KEY_BYTES]);

/* Distinct children counted for `key` (0 when unknown). */
uint32_t kvcl_hot_children(const struct kvcl_hot *h, const uint8_t key[KVPOOL_KEY_BYTES]);

#endif /* KVC_CLUSTER_HOT_H */
