/*
 * lease.c - lessees and lease pins.
 *
 * A lease record pins one block for one lessee until expiry_ms. It sits in
 * the store's table of leases by block (so removing a block ends its
 * leases; a table sized with the lease records costs nothing per block),
 * on its lessee's list (so freeing a lessee ends them) and on the store's
 * expiry list, kept in ascending expiry order. Leases mostly share one lease_ms, so a
 * new expiry belongs at or near the tail and insertion walks back from
 * there. Spare records are kept on a pool so MATCH rarely allocates.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core.h"

struct store_lease **store_lease_bucket(const struct store *s, const struct store_block *b)
{
	uint64_t h = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull;

	return &s->lease_by_block[(h >> 20) & (s->lease_buckets - 1)];
}

/* Grow the table of leases by block to at least `records` buckets, so
 * chains stay short however many leases are active. Errors: -ENOMEM. */
static int lease_table_grow(struct store *s, uint64_t records)
{
	struct store_lease **old = s->lease_by_block;
	uint64_t nold = s->lease_buckets, n = nold ? nold : 64;

	while (n < records)
		n *= 2;
	if (n == nold)
		return 0;
	s->lease_by_block = calloc(n, sizeof(*s->lease_by_block));
	if (!s->lease_by_block) {
		s->lease_by_block = old;
		return -ENOMEM;
	}
	s->lease_buckets = n;
	for (uint64_t i = 0; i < nold; i++) {
		struct store_lease *r = old[i], *next;

		for (; r; r = next) {
			struct store_lease **head = store_lease_bucket(s, r->block);

			next = r->by_block;
			r->by_block = *head;
			*head = r;
		}
	}
	free(old);
	return 0;
}

int store_lease_reserve_locked(struct store *s, uint64_t n)
{
	while (s->lease_spare < n) {
		struct store_lease *r = malloc(sizeof(*r));

		if (!r)
			return -ENOMEM;
		store_list_add_tail(&s->lease_pool, &r->by_expiry);
		s->lease_spare++;
		s->lease_records++;
	}
	return lease_table_grow(s, s->lease_records);
}

/* Link lease r into the expiry list at its place (ascending). */
static void expiry_insert(struct store *s, struct store_lease *r)
{
	struct store_list *pos = s->expiry.prev;

	while (pos != &s->expiry &&
	       store_container_of(pos, struct store_lease, by_expiry)->expiry_ms > r->expiry_ms)
		pos = pos->prev;
	/* insert after pos */
	r->by_expiry.prev = pos;
	r->by_expiry.next = pos->next;
	pos->next->prev = &r->by_expiry;
	pos->next = &r->by_expiry;
}

/* The lease of lessee l on b, or NULL; any lease on b when l is NULL. */
static struct store_lease *find_lease(const struct store *s, const struct store_lessee *l,
				      const struct store_block *b)
{
	struct store_lease *r;

	if (!b->leased)
		return NULL;
	for (r = *store_lease_bucket(s, b); r; r = r->by_block)
		if (r->block == b && (!l || r->lessee == l))
			return r;
	return NULL;
}

/* Make record r (on no list) the lease of l on b until expiry_ms. */
static void lease_link(struct store *s, struct store_lease *r, struct store_lessee *l,
		       struct store_block *b, uint64_t expiry_ms)
{
	struct store_lease **head = store_lease_bucket(s, b);

	r->block = b;
	r->lessee = l;
	r->expiry_ms = expiry_ms;
	r->by_block = *head;
	*head = r;
	store_list_add_tail(&l->leases, &r->by_lessee);
	expiry_insert(s, r);
	l->leased_bytes += store_block_length(b);
	if (l->tenant)
		l->tenant->leased_bytes += store_block_length(b);
	b->leased = 1;
	s->leases_active++;
	store_lru_sync_locked(s, b);
}

/* Extend l's lease on b to expiry_ms if it has one; returns whether. */
static bool lease_extend(struct store *s, struct store_lessee *l, struct store_block *b,
			 uint64_t expiry_ms)
{
	struct store_lease *r = find_lease(s, l, b);

	if (!r)
		return false;
	if (expiry_ms > r->expiry_ms) {
		store_list_del(&r->by_expiry);
		r->expiry_ms = expiry_ms;
		expiry_insert(s, r);
	}
	return true;
}

void store_lease_grant_locked(struct store *s, struct store_lessee *l, struct store_block *b,
			      uint64_t expiry_ms)
{
	struct store_lease *r;

	if (lease_extend(s, l, b, expiry_ms))
		return;
	r = store_container_of(s->lease_pool.next, struct store_lease, by_expiry);
	store_list_del(&r->by_expiry);
	s->lease_spare--;
	lease_link(s, r, l, b, expiry_ms);
}

struct store_lease *store_lease_take_spare_locked(struct store *s)
{
	struct store_lease *r;

	if (!s->lease_spare)
		return NULL;
	r = store_container_of(s->lease_pool.next, struct store_lease, by_expiry);
	store_list_del(&r->by_expiry);
	s->lease_spare--;
	s->lease_records--;
	return r;
}

bool store_lease_grant_rec_locked(struct store *s, struct store_lease *r, struct store_block *b)
{
	if (lease_extend(s, r->lessee, b, r->expiry_ms))
		return false;
	s->lease_records++;
	/* best effort: a table that cannot grow has longer chains */
	(void)lease_table_grow(s, s->lease_records);
	lease_link(s, r, r->lessee, b, r->expiry_ms);
	return true;
}

/* End one lease: unpin its block and return the record to the pool. */
static void lease_end(struct store *s, struct store_lease *r)
{
	struct store_block *b = r->block;
	struct store_lease **pp = store_lease_bucket(s, b);

	while (*pp != r)
		pp = &(*pp)->by_block;
	*pp = r->by_block;
	r->lessee->leased_bytes -= store_block_length(b);
	if (r->lessee->tenant)
		r->lessee->tenant->leased_bytes -= store_block_length(b);
	store_list_del(&r->by_lessee);
	store_list_del(&r->by_expiry);
	store_list_add_tail(&s->lease_pool, &r->by_expiry);
	s->lease_spare++;
	b->leased = find_lease(s, NULL, b) != NULL; /* r is out of the table */
	s->leases_active--;
	store_lru_sync_locked(s, b);
}

void store_lease_end_for_locked(struct store *s, struct store_lessee *l, struct store_block *b)
{
	struct store_lease *r = find_lease(s, l, b);

	if (r)
		lease_end(s, r);
}

void store_lease_end_block_locked(struct store *s, struct store_block *b)
{
	struct store_lease *r;

	while ((r = find_lease(s, NULL, b)))
		lease_end(s, r);
}

uint64_t store_lease_expire_locked(struct store *s, uint64_t now_ms)
{
	uint64_t n = 0;

	while (!store_list_empty(&s->expiry)) {
		struct store_lease *r =
			store_container_of(s->expiry.next, struct store_lease, by_expiry);

		if (r->expiry_ms > now_ms)
			break;
		lease_end(s, r);
		n++;
	}
	return n;
}

uint64_t store_tick(struct store *s)
{
	uint64_t n;

	uint64_t now = store_now_ms();

	store_lock(s);
	n = store_lease_expire_locked(s, now);
	store_retain_expire_locked(s, now);
	pthread_mutex_unlock(&s->lock);
	return n;
}

struct store_lessee *store_lessee_new(struct store *s)
{
	struct store_lessee *l = malloc(sizeof(*l));

	if (!l)
		return NULL;
	l->leased_bytes = 0;
	l->max_leased_bytes = 0;
	l->tenant = NULL;
	store_list_init(&l->leases);
	store_lock(s);
	store_list_add_tail(&s->lessees, &l->link);
	s->nlessees++;
	pthread_mutex_unlock(&s->lock);
	return l;
}

/* End all of l's leases and unlink it (the caller frees it). */
static void lessee_drop_locked(struct store *s, struct store_lessee *l)
{
	while (!store_list_empty(&l->leases))
		lease_end(s, store_container_of(l->leases.next, struct store_lease, by_lessee));
	store_list_del(&l->link);
	s->nlessees--;
}

void store_lessee_free(struct store *s, struct store_lessee *l)
{
	if (!l)
		return;
	store_lock(s);
	lessee_drop_locked(s, l);
	pthread_mutex_unlock(&s->lock);
	free(l);
}

void store_lease_free_all_locked(struct store *s)
{
	while (!store_list_empty(&s->lessees)) {
		struct store_lessee *l =
			store_container_of(s->lessees.next, struct store_lessee, link);

		lessee_drop_locked(s, l);
		free(l);
	}
	while (!store_list_empty(&s->lease_pool)) {
		struct store_lease *r =
			store_container_of(s->lease_pool.next, struct store_lease, by_expiry);

		store_list_del(&r->by_expiry);
		free(r);
	}
	s->lease_spare = 0;
	s->lease_records = 0;
	free(s->lease_by_block);
	s->lease_by_block = NULL;
	s->lease_buckets = 0;
}

bool store_lease_held_locked(const struct store *s, const struct store_lessee *l,
			     const struct store_block *b)
{
	return find_lease(s, l, b) != NULL;
}

void store_lessee_limit(struct store *s, struct store_lessee *l, uint64_t max_leased_bytes,
			struct store_tenant *t)
{
	store_lock(s);
	/* what it leases now moves to the new tenant */
	if (l->tenant)
		l->tenant->leased_bytes -= l->leased_bytes;
	if (t)
		t->leased_bytes += l->leased_bytes;
	__atomic_store_n(&l->tenant, t, __ATOMIC_RELAXED);
	__atomic_store_n(&l->max_leased_bytes, max_leased_bytes, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
}

struct store_tenant *store_tenant_of_key_locked(struct store *s, uint64_t key)
{
	struct store_tenant *t;

	if (key)
		for (uint32_t i = 0; i < s->ntenants; i++)
			if (s->tenant_by_id[i]->key == key)
				return s->tenant_by_id[i];
	if (s->ntenants == s->tenants_cap) {
		uint32_t cap = s->tenants_cap ? 2 * s->tenants_cap : 16;
		struct store_tenant **v = cap > s->tenants_cap ?
			realloc(s->tenant_by_id, cap * sizeof(*v)) : NULL;

		if (!v)
			return NULL;
		s->tenant_by_id = v;
		s->tenants_cap = cap;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->key = key;
	t->racct.max_bytes = s->cfg.max_retained_bytes;
	s->tenant_by_id[s->ntenants++] = t;
	t->id = s->ntenants;
	store_list_add_tail(&s->tenants, &t->link);
	return t;
}

struct store_tenant *store_tenant_new_keyed(struct store *s, uint64_t key, uint64_t max_bytes,
					    uint64_t max_leased_bytes)
{
	struct store_tenant *t;

	store_lock(s);
	t = store_tenant_of_key_locked(s, key);
	if (t) {
		t->max_bytes = max_bytes;
		__atomic_store_n(&t->max_leased_bytes, max_leased_bytes, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->lock);
	return t;
}

struct store_tenant *store_tenant_new(struct store *s, uint64_t max_bytes, uint64_t max_leased_bytes)
{
	return store_tenant_new_keyed(s, 0, max_bytes, max_leased_bytes);
}

uint32_t store_tenant_namespaces(struct store *s, const struct store_tenant *t)
{
	uint32_t n;

	store_lock(s);
	n = t->namespaces;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void store_tenant_limits(struct store *s, struct store_tenant *t, uint64_t max_bytes,
			 uint64_t max_leased_bytes)
{
	store_lock(s);
	t->max_bytes = max_bytes;
	__atomic_store_n(&t->max_leased_bytes, max_leased_bytes, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
}

void store_tenant_usage(struct store *s, const struct store_tenant *t, uint64_t *bytes,
			uint64_t *leased_bytes)
{
	store_lock(s);
	if (bytes)
		*bytes = t->bytes;
	if (leased_bytes)
		*leased_bytes = t->leased_bytes;
	pthread_mutex_unlock(&s->lock);
}

uint64_t store_lessee_leased_bytes(struct store *s, const struct store_lessee *l)
{
	uint64_t n;

	store_lock(s);
	n = l->leased_bytes;
	pthread_mutex_unlock(&s->lock);
	return n;
}
