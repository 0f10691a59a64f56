/*
 * srv_tenant.c - token digest -> store_tenant (srv_tenant.h).
 */
#include "srv_tenant.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"

struct tenant_entry {
	uint8_t digest[32];
	struct store_tenant *t;
};

struct srv_tenants {
	pthread_mutex_t lock;
	struct tenant_entry *v; /* sorted by digest */
	uint32_t n, cap;
};

struct srv_tenants *srv_tenants_new(void)
{
	struct srv_tenants *ts = calloc(1, sizeof(*ts));

	if (ts)
		pthread_mutex_init(&ts->lock, NULL);
	return ts;
}

void srv_tenants_free(struct srv_tenants *ts)
{
	if (!ts)
		return;
	pthread_mutex_destroy(&ts->lock);
	free(ts->v);
	free(ts);
}

/* Index of digest in ts->v, or where it would go (*found = 0). */
static uint32_t tenant_pos(const struct srv_tenants *ts, const uint8_t *digest, int *found)
{
	uint32_t lo = 0, hi = ts->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int c = memcmp(ts->v[mid].digest, digest, 32);

		if (c == 0) {
			*found = 1;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = 0;
	return lo;
}

uint64_t srv_tenant_key(const uint8_t digest[32])
{
	uint64_t k = 0;

	for (int i = 7; i >= 0; i--)
		k = k << 8 | digest[i];
	return k ? k : 1; /* 0 means "no tenant" */
}

struct store_tenant *srv_tenant_get(struct srv_tenants *ts, struct store *st,
				    const uint8_t digest[32], uint64_t max_bytes,
				    uint64_t max_leased_bytes)
{
	struct store_tenant *t = NULL;
	int found = 0;
	uint32_t i;

	pthread_mutex_lock(&ts->lock);
	i = tenant_pos(ts, digest, &found);
	if (found) {
		t = ts->v[i].t;
		goto out;
	}
	if (ts->n == ts->cap) {
		uint32_t cap = ts->cap ? 2 * ts->cap : 16;
		struct tenant_entry *v = realloc(ts->v, cap * sizeof(*v));

		if (!v)
			goto out;
		ts->v = v;
		ts->cap = cap;
	}
	/* keyed by the digest's first 8 bytes, which the NVMe index keeps
	 * with the blocks it writes and the namespaces it creates: after a
	 * warm restart they are charged to it again, not to whoever binds
	 * them first */
	t = store_tenant_new_keyed(st, srv_tenant_key(digest), max_bytes, max_leased_bytes);
	if (!t)
		goto out;
	memmove(&ts->v[i + 1], &ts->v[i], (ts->n - i) * sizeof(*ts->v));
	memcpy(ts->v[i].digest, digest, 32);
	ts->v[i].t = t;
	ts->n++;
out:
	pthread_mutex_unlock(&ts->lock);
	return t;
}

void srv_tenants_foreach(struct srv_tenants *ts,
			 void (*fn)(const uint8_t digest[32], struct store_tenant *t, void *arg),
			 void *arg)
{
	pthread_mutex_lock(&ts->lock);
	for (uint32_t i = 0; i < ts->n; i++)
		fn(ts->v[i].digest, ts->v[i].t, arg);
	pthread_mutex_unlock(&ts->lock);
}

int srv_tenants_stats(struct srv_tenants *ts, struct store *st, struct srv_tenant_stats **out,
		      uint32_t *count)
{
	struct srv_tenant_stats *v = NULL;
	uint32_t n;

	pthread_mutex_lock(&ts->lock);
	n = ts->n;
	if (n) {
		v = calloc(n, sizeof(*v));
		if (!v) {
			pthread_mutex_unlock(&ts->lock);
			return -ENOMEM;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		for (int k = 0; k < SRV_TENANT_ID_CHARS / 2; k++)
			snprintf(v[i].id + 2 * k, 3, "%02x", ts->v[i].digest[k]);
		store_tenant_retain_stats(st, ts->v[i].t, &v[i].retain);
		store_tenant_usage(st, ts->v[i].t, &v[i].billed_bytes, &v[i].leased_bytes);
		v[i].namespaces = store_tenant_namespaces(st, ts->v[i].t);
	}
	pthread_mutex_unlock(&ts->lock);
	*out = v;
	*count = n;
	return 0;
}
