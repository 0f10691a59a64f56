/*
 * placement.h - which nodes hold a block (internal to the cluster;
 * docs/cluster.md, "Placement").
 *
 * Per block: a block lives on the first usable node of its own key's
 * rendezvous ranking (hrw.h), stored there with no parent; a hot block
 * (hot.h: a shared prefix) on the first R usable nodes. The ranking
 * depends on the key and the node names only, so any client finds any
 * block at its owner; the usable nodes are the members that are not in a
 * back-off (a node that failed is skipped, so its blocks go to, and are
 * read from, the next node by score).
 *
 * Fallback epoch: when the set of usable members changes (a node joins,
 * leaves, fails or comes back), the set before the change is kept as the
 * previous view for one epoch: a key whose owners changed is also asked
 * at its previous owners, and what is found there is copied to the new
 * ones. The epoch ends at the next change, after fallback_ms, or once the
 * new owners are warm (of the last KVCL_WARM_SAMPLE keys asked at their
 * previous owners, fewer than 1% were found only there).
 *
 * A handle that starts after a change has not seen it: at its first call,
 * members registered less than fallback_ms ago (the age etcd's records
 * give; a static list gives none) count as joining, and when older
 * members are there too, an epoch starts with the older ones as the
 * previous view (ending as above, its time counted from the youngest
 * member's registration). So a process started after a node joined a warm
 * pool still finds the blocks at their previous owners.
 *
 * Everything else in the cluster asks only these functions, so the rule
 * can change here alone. Threads: under the cluster's lock.
 */
#ifndef KVC_PLACEMENT_H
#define KVC_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "hot.h"
#include "kvpool.h"

#define KVCL_MAX_NODES 64
#define KVCL_MAX_REPLICAS 4          /* hot_replicas at most */
#define KVCL_DEFAULT_FALLBACK_MS 600000
#define KVCL_WARM_SAMPLE 4096

struct kvcl_node;

/* The members a call places on (indices are per view). */
struct kvcl_view {
	size_t n;
	uint64_t seed[KVCL_MAX_NODES];
	const char *name[KVCL_MAX_NODES];
	struct kvcl_node *node[KVCL_MAX_NODES];
	unsigned char up[KVCL_MAX_NODES]; /* usable now: not in a back-off */
	uint64_t age_ms[KVCL_MAX_NODES];  /* since the member registered (etcd's record);
					   * UINT64_MAX when unknown (a static list) */
	size_t n_up;
};

struct kvcl_place {
	struct kvcl_hot hot;
	uint32_t replicas;            /* R: nodes of a hot block (1: no copies) */
	uint64_t fallback_ms;
	/* the usable members at the last call, and before the last change */
	struct kvcl_node *last[KVCL_MAX_NODES];
	uint64_t last_seed[KVCL_MAX_NODES];
	const char *last_name[KVCL_MAX_NODES]; /* the nodes' own names: they live until close */
	size_t n_last;
	int have_last;
	struct kvcl_node *prev[KVCL_MAX_NODES];
	uint64_t prev_seed[KVCL_MAX_NODES];
	const char *prev_name[KVCL_MAX_NODES];
	size_t n_prev;
	int fallback;                 /* an epoch is on */
	uint64_t fallback_until_ms;
	uint64_t epoch_asked, epoch_only_prev; /* warm-up of the current epoch */
	uint64_t changes;             /* usable-set changes seen */
};

/* Set up: hot copies on `replicas` nodes (1..KVCL_MAX_REPLICAS), a
 * branching point at hot_children children (0: nothing is hot), epochs of
 * at most fallback_ms. Errors: -ENOMEM, -EINVAL. */
int kvcl_place_init(struct kvcl_place *pl, uint32_t replicas, uint32_t hot_children,
		    uint64_t fallback_ms);
void kvcl_place_free(struct kvcl_place *pl);

/* Compare v's usable members with those of the last call: a change starts
 * a fallback epoch (the last set becomes the previous view); at the first
 * call, members younger than fallback_ms beside older ones start one with
 * the older ones as the previous view. now_ms: the monotonic clock. Also
 * ends an epoch that ran out. */
void kvcl_place_observe(struct kvcl_place *pl, const struct kvcl_view *v, uint64_t now_ms);

/* Is a fallback epoch on? */
int kvcl_place_in_epoch(const struct kvcl_place *pl);

/* The nodes that hold `key`: the first 1 (or R when hot) usable nodes of
 * its ranking, as indices into v, best first. Returns how many (0: no
 * node usable). */
size_t kvcl_place_owners(const struct kvcl_place *pl, const struct kvcl_view *v,
			 const uint8_t *key, int hot, size_t *out);

/* The first `k` members of the ranking (usable or not), indices into v:
 * where a block may sit, for DELETE. Returns how many. */
size_t kvcl_place_ranked(const struct kvcl_view *v, const uint8_t *key, size_t k, size_t *out);

/* In an epoch: the nodes that held `key` before the change (its owners in
 * the previous view) that are usable members of v and not among cur[0..n
 * _cur), indices into v. Returns how many (0 outside an epoch). */
size_t kvcl_place_prev_owners(const struct kvcl_place *pl, const struct kvcl_view *v,
			      const uint8_t *key, int hot, const size_t *cur, size_t n_cur,
			      size_t *out);

/* An epoch's warm-up: `asked` keys were asked at previous owners, of
 * which `only_prev` were found there and not at their owners. */
void kvcl_place_epoch_note(struct kvcl_place *pl, uint64_t asked, uint64_t only_prev);

/* The share of blocks each usable member of v owns (fractions into
 * share[], 0 for the others; from a fixed sample of keys). */
void kvcl_place_shares(const struct kvcl_place *pl, const struct kvcl_view *v, double *share);

#endif /* KVC_PLACEMENT_H */
