/*
 * retain.h - retentions (retain.c; internal to storage/): "keep this
 * block until then", by block and by deadline, and what each budget
 * holder (a tenant, or a namespace without one) retains. Lock held.
 *
 * A retained block has b->retained set and one record here: its
 * deadline (CLOCK_MONOTONIC ms), found by the block's slab id (a hash
 * table) and by deadline (a min-heap), so extending, expiring and
 * removing are O(log n) and a block that is not retained pays nothing.
 *
 * Rules kept here:
 *  - no holes: a retained block's stored ancestors are retained at
 *    least as long (every retention walks up its chain, extending);
 *  - the bytes of every retained block are counted in its namespace
 *    and charged to the tenant whose request set its deadline (the
 *    retainer: the requester's tenant, else the namespace's; none: the
 *    namespace's own budget); extending another holder's retention moves
 *    it to the extender. The holder's budget, and the pool's
 *    max_retained_total_bytes, bound a NEW or moved retention: one that
 *    would pass either is refused, nothing else changes;
 *  - a retained block is not in the EVICT heap (evict.c), is kept by
 *    segment reclaim, and is never a quota victim; it may still be
 *    demoted and its clean DRAM copy dropped;
 *  - an expired retention makes the block ordinary again; a removed
 *    block (DELETE, drop, corruption) loses its retention with it.
 */
#ifndef KVPOOL_STORE_RETAIN_H
#define KVPOOL_STORE_RETAIN_H

#include <stdbool.h>
#include <stdint.h>

struct store;
struct store_block;
struct store_ns;

/* What one budget holder (a tenant, or a namespace) retains, and its
 * counters. max_bytes is the tenant's budget; a namespace's budget is
 * the pool's max_retained_bytes (s->cfg), read when a retention asks. */
struct store_retain_acct {
	uint64_t max_bytes;        /* tenants only: payload bytes it may retain */
	uint64_t bytes, blocks;    /* retained now */
	uint64_t refused;          /* blocks whose retention the budget refused */
	uint64_t expired;          /* retentions that ran out (the block stayed, ordinary) */
};

/* One retention. */
struct store_retention {
	uint64_t until_ms;   /* CLOCK_MONOTONIC ms */
	uint32_t block_id;   /* slab id of the retained block */
	uint32_t heap_idx;   /* slot in the deadline heap */
	uint32_t next;       /* by-block chain, or the free list: record index + 1; 0 = end */
	uint32_t tenant_id;  /* the tenant charged for it (store_tenant.id), 0 = none:
				the namespace's own budget */
};

/* Every retention of a pool (in struct store). */
struct store_retain_tab {
	struct store_retention *recs;  /* records, cap of them; free ones chained on free_head */
	uint32_t cap, used, free_head; /* free_head: record index + 1, 0 = none */
	uint32_t *buckets;             /* by block id: record index + 1 of the chain's head */
	uint32_t nbuckets;             /* power of two >= cap, 0 before the first record */
	uint32_t *heap;                /* record indexes, min-heap on until_ms; `used` long */
	uint64_t bytes, blocks;        /* retained now, pool-wide */
	uint64_t refused, expired;     /* pool-wide counters */
};

/* How a retention went (flags are the wire's PUT result bits, store.h). */
enum store_retain_outcome {
	STORE_RETAIN_OK = 0,     /* retained (set or extended) */
	STORE_RETAIN_REFUSED,    /* the holder's budget would pass: nothing changed */
	STORE_RETAIN_NOMEM,      /* no memory for a record: nothing changed */
};

/* Retain visible block b and its stored ancestors until at least
 * until_ms on behalf of tenant `by` (NULL: b's namespace's tenant, if
 * any), who is charged for every block whose deadline this sets;
 * charge_check false skips the budgets (a warm restart puts back what
 * was granted before). Counts a refusal in the holder. */
enum store_retain_outcome store_retain_block_locked(struct store *s, struct store_block *b,
						    uint64_t until_ms, bool charge_check,
						    struct store_tenant *by);
/* Count an expiry of b's retention that a warm restart found past (it
 * ran out while kvpoold was down, or before the stop): in b's namespace
 * and the pool, so that the counters do not lose it. */
void store_retain_count_expired_locked(struct store *s, struct store_block *b);
/* b (retained) is leaving the pool: forget its retention and uncharge. */
void store_retain_drop_locked(struct store *s, struct store_block *b);
/* b's deadline (CLOCK_MONOTONIC ms), 0 when it is not retained. */
uint64_t store_retain_until_locked(const struct store *s, const struct store_block *b);
/* End retentions whose deadline is at or before now_ms; returns how many. */
uint64_t store_retain_expire_locked(struct store *s, uint64_t now_ms);
/* Namespace ns is charged to tenant ns->tenant from now on: its
 * retentions charged to no tenant become the tenant's. */
void store_retain_ns_to_tenant_locked(struct store *s, struct store_ns *ns);
/* The holder that ns's retentions are charged to and bounded by, with
 * its budget in *max_bytes. */
struct store_retain_acct *store_retain_holder_locked(struct store *s, struct store_ns *ns,
						     uint64_t *max_bytes);
/* b's deadline as CLOCK_REALTIME ms for an NVMe record (0: not
 * retained, or already past). */
uint64_t store_retain_wall_until_locked(const struct store *s, const struct store_block *b);
/* The deadline a request's retain_ms asks for, capped at max_retain_ms
 * (0: none); fills res->flags (STORE_PUT_RETAIN_CLAMPED) and res->retain_ms
 * (what would be granted). No lock needed. */
struct store_retain_res;
uint64_t store_retain_until_for(const struct store *s, uint32_t retain_ms,
				struct store_retain_res *res);
/* Retain visible block b until `until` (0: nothing asked, no-op) and add
 * the outcome to *res: STORE_PUT_RETAINED, or STORE_PUT_RETAIN_BUDGET (then
 * res->retain_ms becomes 0; also 0 without memory). */
void store_retain_apply_locked(struct store *s, struct store_block *b, uint64_t until,
			       struct store_tenant *by, struct store_retain_res *res);
/* Retain the leading run keys[0..n) of namespace ns_id until `until`,
 * leading blocks first: stops at the first block that is gone or that
 * the budget refuses (STORE_MATCH_RETAIN_BUDGET added to *flags, the
 * blocks left counted as refused). Returns how many were retained. */
uint32_t store_retain_run_locked(struct store *s, uint32_t ns_id,
				 const uint8_t (*keys)[32], uint32_t n, uint64_t until,
				 struct store_tenant *by, uint32_t *flags);
/* The CLOCK_MONOTONIC deadline of an NVMe record's CLOCK_REALTIME one
 * (a warm restart), at most max_retain_ms from now; 0 when it passed. */
uint64_t store_retain_until_from_wall(const struct store *s, uint64_t wall_until_ms);
/* Memory of the table (index_bytes). */
uint64_t store_retain_mem_bytes(const struct store *s);
/* Free the table (store_close). */
void store_retain_free(struct store *s);

#endif /* KVPOOL_STORE_RETAIN_H */
