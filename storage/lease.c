/*
 * lease.c - lessees and lease pins.
 *
 * A lease record pins one block for one lessee until expiry_ms. It sits on
 * three lists: its block's (so removing a block ends its leases), its
 * lessee's (so freeing a lessee ends them) and the store's expiry list,
 * kept in ascending expiry order. Leases mostly share one lease_ms, so a
 * new expiry belongs at or near the tail and insertion walks back from
 * there. Spare records are kept on a pool so MATCH rarely allocates.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "store_impl.h"

uint64_t store_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
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
	return 0;
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

static struct store_lease *find_lease(struct store_lessee *l, struct store_block *b)
{
	struct store_list *pos;

	for (pos = b->leases.next; pos != &b->leases; pos = pos->next) {
		struct store_lease *r = store_container_of(pos, struct store_lease, by_block);

		if (r->lessee == l)
			return r;
	}
	return NULL;
}

void store_lease_grant_locked(struct store *s, struct store_lessee *l, struct store_block *b,
			      uint64_t expiry_ms)
{
	struct store_lease *r = find_lease(l, b);

	if (r) {
		if (expiry_ms > r->expiry_ms) {
			store_list_del(&r->by_expiry);
			r->expiry_ms = expiry_ms;
			expiry_insert(s, r);
		}
		return;
	}
	r = store_container_of(s->lease_pool.next, struct store_lease, by_expiry);
	store_list_del(&r->by_expiry);
	s->lease_spare--;
	r->block = b;
	r->lessee = l;
	r->expiry_ms = expiry_ms;
	store_list_add_tail(&b->leases, &r->by_block);
	store_list_add_tail(&l->leases, &r->by_lessee);
	expiry_insert(s, r);
	b->lease_pins++;
	s->leases_active++;
	store_lru_sync_locked(s, b);
}

/* End one lease: unpin its block and return the record to the pool. */
static void lease_end(struct store *s, struct store_lease *r)
{
	struct store_block *b = r->block;

	store_list_del(&r->by_block);
	store_list_del(&r->by_lessee);
	store_list_del(&r->by_expiry);
	store_list_add_tail(&s->lease_pool, &r->by_expiry);
	s->lease_spare++;
	b->lease_pins--;
	s->leases_active--;
	store_lru_sync_locked(s, b);
}

void store_lease_end_for_locked(struct store *s, struct store_lessee *l, struct store_block *b)
{
	struct store_lease *r = find_lease(l, b);

	if (r)
		lease_end(s, r);
}

void store_lease_end_block_locked(struct store *s, struct store_block *b)
{
	while (!store_list_empty(&b->leases))
		lease_end(s, store_container_of(b->leases.next, struct store_lease, by_block));
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

	pthread_mutex_lock(&s->lock);
	n = store_lease_expire_locked(s, store_now_ms());
	pthread_mutex_unlock(&s->lock);
	return n;
}

struct store_lessee *store_lessee_new(struct store *s)
{
	struct store_lessee *l = malloc(sizeof(*l));

	if (!l)
		return NULL;
	store_list_init(&l->leases);
	pthread_mutex_lock(&s->lock);
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
	pthread_mutex_lock(&s->lock);
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
}
