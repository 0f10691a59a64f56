/*
 * lease.h - leases (lease.c; internal to storage/): short pins on matched
 * blocks, by lessee, by block and by expiry. Lock held unless noted.
 */
#ifndef KVPOOL_STORE_LEASE_H
#define KVPOOL_STORE_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "block.h"
#include "list.h"
#include "retain.h"

struct store;


struct store_lessee {
	struct store_list link;   /* s->lessees */
	struct store_list leases; /* struct store_lease.by_lessee */
	uint64_t leased_bytes;    /* payload bytes of the blocks it leases */
	uint64_t max_leased_bytes; /* store_lessee_limit; 0 = no bound */
	struct store_tenant *tenant; /* charged for its leases too; may be NULL */
};

/* A tenant (store_tenant_new): limits shared by the blocks charged to it
 * (the ones it wrote), the namespaces it created and the lessees that name
 * it. Freed by store_close. */
struct store_tenant {
	struct store_list link;    /* s->tenants */
	uint32_t id;               /* 1, 2, ...: store_block.tenant_id */
	uint64_t key;              /* store_tenant_new_keyed's key (kept in the NVMe
				    * index with its blocks and namespaces); 0 = none */
	uint32_t namespaces;       /* namespaces charged to it (store_namespace_tenant) */
	uint64_t max_bytes;        /* payload bytes of its blocks; 0 = no limit */
	uint64_t max_leased_bytes; /* bytes its lessees may lease; 0 = no bound */
	uint64_t bytes;            /* visible + reserved payload bytes of its blocks */
	uint64_t leased_bytes;     /* bytes its lessees lease now */
	struct store_retain_acct racct; /* its namespaces' retained blocks, its budget */
};

/* The tenant with this key (not 0), or a new one with it and no limits;
 * key 0: always a new one. NULL without memory. */
struct store_tenant *store_tenant_of_key_locked(struct store *s, uint64_t key);

/* One lease pin: (lessee, block) until expiry_ms. At most one per pair;
 * a second MATCH extends it. */
struct store_lease {
	struct store_block *block;
	struct store_lessee *lessee;
	uint64_t expiry_ms;          /* CLOCK_MONOTONIC ms */
	struct store_lease *by_block; /* chain in s->lease_by_block (active leases) */
	struct store_list by_lessee;
	struct store_list by_expiry; /* s->expiry (ascending) or s->lease_pool */
};

/* The bucket of block b in s->lease_by_block (lease_buckets not 0). */
struct store_lease **store_lease_bucket(const struct store *s, const struct store_block *b);
/* Lease b to r->lessee until r->expiry_ms with record r, allocated
 * outside the lock (match.c). Returns true when r became the lease (the
 * pool owns it now), false when that lessee's lease on b was extended
 * instead (r stays the caller's). */
bool store_lease_grant_rec_locked(struct store *s, struct store_lease *r, struct store_block *b);
/* A spare record taken out of the pool (and out of lease_records: the
 * caller owns it now), or NULL when there is none. */
struct store_lease *store_lease_take_spare_locked(struct store *s);
/* Have at least n spare lease records. Errors: -ENOMEM. */
int store_lease_reserve_locked(struct store *s, uint64_t n);
/* Pin b for lessee until expiry_ms (or extend); needs a spare record. */
void store_lease_grant_locked(struct store *s, struct store_lessee *l, struct store_block *b,
			      uint64_t expiry_ms);
/* End the lessee's lease on b, if any. */
void store_lease_end_for_locked(struct store *s, struct store_lessee *l, struct store_block *b);
/* End every lease on b. */
void store_lease_end_block_locked(struct store *s, struct store_block *b);
/* Does l hold a lease on b? */
bool store_lease_held_locked(const struct store *s, const struct store_lessee *l,
			     const struct store_block *b);
/* End leases that expired at or before now_ms; returns how many. */
uint64_t store_lease_expire_locked(struct store *s, uint64_t now_ms);
/* Free every lessee, lease and spare record (store_close). */
void store_lease_free_all_locked(struct store *s);

#endif /* KVPOOL_STORE_LEASE_H */
