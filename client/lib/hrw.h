/*
 * hrw.h - rendezvous (highest random weight, HRW) ranking of pool nodes
 * for a key (internal to libkvpool; the public entry points are
 * kvpool_hrw_score, kvpool_hrw_owner and kvpool_hrw_rank in kvpool.h).
 *
 * The nodes are ranked for a key by their score, highest first, an equal
 * score going to the smaller name; a block lives on the first node of its
 * own key's ranking, a hot block on the first R (docs/cluster.md). See
 * hrw.c for the score function and why it is what it is.
 */
#ifndef KVC_HRW_H
#define KVC_HRW_H

#include <stddef.h>
#include <stdint.h>

#define KVC_HRW_DEFAULT_SEGMENT_BLOCKS 32
#define KVC_HRW_RANK_MAX 64 /* the longest ranking kvc_hrw_rank / kvpool_hrw_rank write */

/* The per-node half of the score: the first 8 bytes (little-endian) of
 * SHA-256(name). Computed once per membership change. name: NUL-terminated.
 * Cannot fail (OpenSSL's one-shot SHA256 does not allocate). */
uint64_t kvc_hrw_node_seed(const char *name);

/* The score of a key on a node with the given seed. Pure, cannot fail. */
uint64_t kvc_hrw_score_seeded(const uint8_t key[32], uint64_t node_seed);

/* Index of the owner of `key` among n nodes (seeds[i], names[i] for the
 * tie-break: the smaller name by strcmp wins an equal score), or -1 when
 * n is 0. `up` (may be NULL) marks the nodes that may own (nonzero);
 * nodes with up[i] == 0 are skipped. Pure, cannot fail. */
int kvc_hrw_owner(const uint8_t key[32], const uint64_t *seeds, const char *const *names,
		  const unsigned char *up, size_t n);

/* The first min(k, KVC_HRW_RANK_MAX, nodes up) indices of the ranking of
 * `key` among n nodes into out[], best first (out[0] is kvc_hrw_owner's
 * answer). `up` as for kvc_hrw_owner. Returns how many were written.
 * Pure, cannot fail. */
size_t kvc_hrw_rank(const uint8_t key[32], const uint64_t *seeds, const char *const *names,
		    const unsigned char *up, size_t n, size_t *out, size_t k);

#endif /* KVC_HRW_H */
