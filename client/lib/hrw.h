/*
 * hrw.h - rendezvous (highest random weight, HRW) placement of chain
 * segments on pool nodes (internal to libkvpool; the public entry points
 * are kvpool_hrw_score and kvpool_hrw_owner in kvpool.h).
 *
 * A chain is cut into segments of D consecutive blocks; segment k covers
 * blocks k*D .. k*D+D-1 and is owned by the node with the highest score
 * for (key of the segment's first block, node name). See hrw.c for the
 * score function and why it is what it is.
 */
#ifndef KVC_HRW_H
#define KVC_HRW_H

#include <stddef.h>
#include <stdint.h>

#define KVC_HRW_DEFAULT_SEGMENT_BLOCKS 32

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

#endif /* KVC_HRW_H */
