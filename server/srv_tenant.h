/*
 * srv_tenant.h - the tenants of a server with a tokens file: one
 * store_tenant (storage/store.h) per token digest, made at the token's
 * first HELLO and kept until kvpoold stops (namespaces charged to it
 * outlive its connections). A token's limits are tenant_max_bytes and
 * tenant_max_leased_bytes (config/), the same for every token.
 *
 * Threads: any (a mutex guards the table); srv_tenants_free once, after
 * every worker stopped and before store_close.
 */
#ifndef KVPOOL_SRV_TENANT_H
#define KVPOOL_SRV_TENANT_H

#include <stdint.h>

#include "store.h"

struct store;
struct store_tenant;
struct srv_tenants;

/* A new, empty table. NULL on -ENOMEM. */
struct srv_tenants *srv_tenants_new(void);

/* Destructor (the store_tenants stay the store's). Accepts NULL. */
void srv_tenants_free(struct srv_tenants *ts);

/* The store_tenant key of the token with this SHA-256 digest: its first
 * 8 bytes, little-endian (never 0). Stable across restarts. */
uint64_t srv_tenant_key(const uint8_t digest[32]);

/* The tenant of the token with this digest, made in st with max_bytes and
 * max_leased_bytes (0 = no limit) at its first call (or the one a warm restart rebuilt for its key,
 * srv_tenant_key, which then takes these limits). The pointer stays
 * valid until store_close(st). NULL on -ENOMEM (the caller serves the
 * connection without tenant limits rather than refuse it). */
struct store_tenant *srv_tenant_get(struct srv_tenants *ts, struct store *st,
				    const uint8_t digest[32], uint64_t max_bytes,
				    uint64_t max_leased_bytes);

/* Call fn(digest, tenant, arg) for every tenant made so far, in digest
 * order, under the table's lock (fn must not call back into ts). */
void srv_tenants_foreach(struct srv_tenants *ts,
			 void (*fn)(const uint8_t digest[32], struct store_tenant *t, void *arg),
			 void *arg);

/* A tenant's name in STATS and /metrics: the first 12 hex digits of
 * its token's SHA-256 digest (`printf %s TOKEN | sha256sum | cut -c1-12`),
 * which names it without showing the token. */
#define SRV_TENANT_ID_CHARS 12

/* One tenant's figures for STATS. */
struct srv_tenant_stats {
	char id[SRV_TENANT_ID_CHARS + 1];  /* NUL-terminated hex */
	struct store_retain_stats retain;
	uint64_t billed_bytes;   /* payload bytes of the blocks it wrote (both tiers) */
	uint64_t leased_bytes;   /* bytes its connections lease now */
	uint32_t namespaces;     /* namespaces it created (tenant_max_namespaces) */
};

/* The figures of every tenant made so far, in digest order, into a
 * malloc'd array *out of *count (NULL, 0 when there is none).
 * Errors: -ENOMEM. */
int srv_tenants_stats(struct srv_tenants *ts, struct store *st, struct srv_tenant_stats **out,
		      uint32_t *count);

#endif /* KVPOOL_SRV_TENANT_H */
