/*
 * retain.c - retentions: records by block and by deadline, the no-holes
 * walk up a chain, budgets, expiry, and the public calls that set them
 * (store_retain, store_put_commit_retain, MATCH's refresh in match.c).
 *
 * Records live in one array that grows by doubling (no allocation per
 * retention once it is big enough), chained per bucket by block id and
 * ordered by deadline in a min-heap of record indexes. Deadlines are
 * CLOCK_MONOTONIC ms; an NVMe record keeps CLOCK_REALTIME ms instead
 * (store_retain_wall_until_locked), which a warm restart converts back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"
#include "nvme/tier.h"

/* ---- the table ---- */

static uint32_t bucket_of(const struct store_retain_tab *t, uint32_t block_id)
{
	return (uint32_t)(((uint64_t)block_id * 0x9e3779b97f4a7c15ull) >> 32) & (t->nbuckets - 1);
}

/* Record index + 1 of block_id's retention, 0 when none. */
static uint32_t rec_find(const struct store_retain_tab *t, uint32_t block_id)
{
	uint32_t i;

	if (!t->nbuckets)
		return 0;
	for (i = t->buckets[bucket_of(t, block_id)]; i; i = t->recs[i - 1].next)
		if (t->recs[i - 1].block_id == block_id)
			return i;
	return 0;
}

/* Re-chain every record in use into a bucket array of n buckets. */
static int rehash(struct store_retain_tab *t, uint32_t n)
{
	uint32_t *b = calloc(n, sizeof(*b));

	if (!b)
		return -ENOMEM;
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
	/* records in use are exactly those in the heap */
	for (uint32_t k = 0; k < t->used; k++) {
		struct store_retention *r = &t->recs[t->heap[k]];
		uint32_t *head = &t->buckets[bucket_of(t, r->block_id)];

		r->next = *head;
		*head = t->heap[k] + 1;
	}
	return 0;
}

/* Room for `more` records beyond those in use. Errors: -ENOMEM. */
static int tab_reserve(struct store_retain_tab *t, uint32_t more)
{
	uint32_t cap = t->cap ? t->cap : 64, need;
	struct store_retention *recs;
	uint32_t *heap;

	if (more > UINT32_MAX / 2 - t->used)
		return -ENOMEM;
	need = t->used + more;
	if (need <= t->cap)
		return 0;
	while (cap < need)
		cap *= 2;
	recs = realloc(t->recs, (size_t)cap * sizeof(*recs));
	if (!recs)
		return -ENOMEM;
	t->recs = recs;
	heap = realloc(t->heap, (size_t)cap * sizeof(*heap));
	if (!heap)
		return -ENOMEM;
	t->heap = heap;
	/* the new records go on the free list, lowest index first */
	for (uint32_t i = cap; i-- > t->cap;) {
		t->recs[i].next = t->free_head;
		t->recs[i].block_id = 0;
		t->free_head = i + 1;
	}
	t->cap = cap;
	return rehash(t, cap);
}

/* ---- the deadline heap ---- */

static uint64_t heap_key(const struct store_retain_tab *t, uint32_t k)
{
	return t->recs[t->heap[k]].until_ms;
}

static void heap_put(struct store_retain_tab *t, uint32_t k, uint32_t rec)
{
	t->heap[k] = rec;
	t->recs[rec].heap_idx = k;
}

static void heap_up(struct store_retain_tab *t, uint32_t k)
{
	uint32_t rec = t->heap[k];
	uint64_t key = t->recs[rec].until_ms;

	while (k > 0) {
		uint32_t up = (k - 1) / 2;

		if (heap_key(t, up) <= key)
			break;
		heap_put(t, k, t->heap[up]);
		k = up;
	}
	heap_put(t, k, rec);
}

static void heap_down(struct store_retain_tab *t, uint32_t k)
{
	uint32_t rec = t->heap[k];
	uint64_t key = t->recs[rec].until_ms;

	for (;;) {
		uint32_t l = 2 * k + 1, r = l + 1, m;

		if (l >= t->used)
			break;
		m = r < t->used && heap_key(t, r) < heap_key(t, l) ? r : l;
		if (heap_key(t, m) >= key)
			break;
		heap_put(t, k, t->heap[m]);
		k = m;
	}
	heap_put(t, k, rec);
}

/* A new record for block_id until until_ms (room reserved). */
static void rec_add(struct store_retain_tab *t, uint32_t block_id, uint64_t until_ms,
		    uint32_t tenant_id)
{
	uint32_t i = t->free_head - 1, *head = &t->buckets[bucket_of(t, block_id)];
	struct store_retention *r = &t->recs[i];

	t->free_head = r->next;
	r->block_id = block_id;
	r->until_ms = until_ms;
	r->tenant_id = tenant_id;
	r->next = *head;
	*head = i + 1;
	heap_put(t, t->used++, i);
	heap_up(t, t->used - 1);
}

/* Take record index + 1 `ri` out of its chain and the heap, and free it. */
static void rec_del(struct store_retain_tab *t, uint32_t ri)
{
	struct store_retention *r = &t->recs[ri - 1];
	uint32_t *pp = &t->buckets[bucket_of(t, r->block_id)], k = r->heap_idx;

	while (*pp != ri)
		pp = &t->recs[*pp - 1].next;
	*pp = r->next;
	t->used--;
	if (k != t->used) {
		heap_put(t, k, t->heap[t->used]);
		heap_up(t, k);
		heap_down(t, t->recs[t->heap[k]].heap_idx);
	}
	r->block_id = 0;
	r->next = t->free_head;
	t->free_head = ri;
}

/* ---- budget holders ---- */

struct store_retain_acct *store_retain_holder_locked(struct store *s, struct store_ns *ns,
						     uint64_t *max_bytes)
{
	if (ns->tenant) {
		*max_bytes = ns->tenant->racct.max_bytes;
		return &ns->tenant->racct;
	}
	*max_bytes = s->cfg.max_retained_bytes;
	return &ns->racct;
}

/* The tenant with this id (0: none). */
static struct store_tenant *tenant_of(struct store *s, uint32_t tenant_id)
{
	return tenant_id ? s->tenant_by_id[tenant_id - 1] : NULL;
}

/* Add (sign 1) or take away (-1) one retained block of `bytes` in one
 * account. */
static void acct_add(struct store_retain_acct *a, uint64_t bytes, int sign)
{
	a->bytes += sign > 0 ? bytes : -bytes;
	a->blocks += sign > 0 ? 1 : (uint64_t)-1;
}

/* Add or take away one retained block of `bytes`: namespace ns's
 * figures, the holder tenant's (t, may be NULL) and the pool's. */
static void charge(struct store *s, struct store_ns *ns, struct store_tenant *t, uint64_t bytes,
		   int sign)
{
	acct_add(&ns->racct, bytes, sign);
	if (t)
		acct_add(&t->racct, bytes, sign);
	s->retain.bytes += sign > 0 ? bytes : -bytes;
	s->retain.blocks += sign > 0 ? 1 : (uint64_t)-1;
}

/* Count n events in field `off` of ns's figures, tenant t's (may be
 * NULL) and the pool's. */
static void count(struct store *s, struct store_ns *ns, struct store_tenant *t, size_t off,
		  uint64_t n)
{
	*(uint64_t *)(void *)((char *)&ns->racct + off) += n;
	if (t)
		*(uint64_t *)(void *)((char *)&t->racct + off) += n;
	if (off == offsetof(struct store_retain_acct, refused))
		s->retain.refused += n;
	else
		s->retain.expired += n;
}

/* The retentions of ns that are charged to no tenant (made before the
 * namespace had one: rebuilt from NVMe at a warm restart) are charged to
 * its new tenant from now on. */
void store_retain_ns_to_tenant_locked(struct store *s, struct store_ns *ns)
{
	struct store_retain_tab *t = &s->retain;

	for (uint32_t k = 0; k < t->used; k++) {
		struct store_retention *r = &t->recs[t->heap[k]];
		struct store_block *b = store_blk(s, r->block_id);

		if (r->tenant_id || store_block_ns(s, b) != ns)
			continue;
		r->tenant_id = ns->tenant->id;
		acct_add(&ns->tenant->racct, store_block_length(b), 1);
	}
}

/* ---- retaining, expiring, dropping ---- */

/* b has a DRAM copy only, an NVMe record, or a demotion writing one: a
 * record that exists must learn the new deadline (tier.h). */
static void changed(struct store *s, struct store_block *b)
{
	if (s->tier && (b->on_nvme || b->demoting))
		store_tier_retain_changed_locked(s, b);
}

enum store_retain_outcome store_retain_block_locked(struct store *s, struct store_block *b,
						    uint64_t until_ms, bool charge_check,
						    struct store_tenant *by)
{
	struct store_retain_tab *t = &s->retain;
	struct store_ns *ns = store_block_ns(s, b);
	struct store_tenant *who = by ? by : ns->tenant;
	uint32_t who_id = who ? who->id : 0;
	const struct store_retain_acct *h = who ? &who->racct : &ns->racct;
	uint64_t cost = 0, fresh_bytes = 0, max = who ? who->racct.max_bytes
						      : s->cfg.max_retained_bytes;
	uint64_t cap = s->cfg.max_retained_total_bytes;
	uint32_t fresh = 0;
	struct store_block *p;

	/* what the walk up the chain would add: blocks not retained yet, and
	 * blocks another holder retains less long (their retention becomes
	 * this holder's: the tenant that set a deadline pays for it); it
	 * stops at a block retained at least as long (its ancestors are too) */
	for (p = b; p; p = store_parent(s, p)) {
		if (p->retained) {
			const struct store_retention *r = &t->recs[rec_find(t, store_slab_id(p)) - 1];

			if (r->until_ms >= until_ms)
				break;
			if (r->tenant_id != who_id)
				cost += store_block_length(p);
			continue;
		}
		cost += store_block_length(p);
		fresh_bytes += store_block_length(p);
		fresh++;
	}
	if (charge_check && ((cost && (cost > max || h->bytes > max - cost)) ||
			     (fresh_bytes && cap && (fresh_bytes > cap ||
						     t->bytes > cap - fresh_bytes)))) {
		count(s, ns, who, offsetof(struct store_retain_acct, refused), 1);
		return STORE_RETAIN_REFUSED;
	}
	if (tab_reserve(t, fresh))
		return STORE_RETAIN_NOMEM;
	for (p = b; p; p = store_parent(s, p)) {
		uint32_t id = store_slab_id(p);

		if (p->retained) {
			struct store_retention *r = &t->recs[rec_find(t, id) - 1];

			if (r->until_ms >= until_ms)
				break;
			r->until_ms = until_ms;
			heap_down(t, r->heap_idx);
			if (r->tenant_id != who_id) {
				struct store_tenant *old = tenant_of(s, r->tenant_id);

				if (old)
					acct_add(&old->racct, store_block_length(p), -1);
				if (who)
					acct_add(&who->racct, store_block_length(p), 1);
				r->tenant_id = who_id;
			}
		} else {
			rec_add(t, id, until_ms, who_id);
			p->retained = 1;
			charge(s, ns, who, store_block_length(p), 1);
			store_lru_sync_locked(s, p); /* out of the EVICT heap */
		}
		changed(s, p);
	}
	return STORE_RETAIN_OK;
}

void store_retain_count_expired_locked(struct store *s, struct store_block *b)
{
	struct store_ns *ns = store_block_ns(s, b);

	count(s, ns, ns->tenant, offsetof(struct store_retain_acct, expired), 1);
}

void store_retain_drop_locked(struct store *s, struct store_block *b)
{
	uint32_t ri = rec_find(&s->retain, store_slab_id(b));
	struct store_tenant *t = ri ? tenant_of(s, s->retain.recs[ri - 1].tenant_id) : NULL;

	if (ri)
		rec_del(&s->retain, ri);
	b->retained = 0;
	charge(s, store_block_ns(s, b), t, store_block_length(b), -1);
}

uint64_t store_retain_until_locked(const struct store *s, const struct store_block *b)
{
	uint32_t ri = b->retained ? rec_find(&s->retain, store_slab_id(b)) : 0;

	return ri ? s->retain.recs[ri - 1].until_ms : 0;
}

uint64_t store_retain_expire_locked(struct store *s, uint64_t now_ms)
{
	struct store_retain_tab *t = &s->retain;
	uint64_t n = 0;

	while (t->used && heap_key(t, 0) <= now_ms) {
		uint32_t rec = t->heap[0];
		struct store_block *b = store_blk(s, t->recs[rec].block_id);
		struct store_ns *ns = store_block_ns(s, b);
		struct store_tenant *who = tenant_of(s, t->recs[rec].tenant_id);

		rec_del(t, rec + 1);
		b->retained = 0;
		charge(s, ns, who, store_block_length(b), -1);
		count(s, ns, who, offsetof(struct store_retain_acct, expired), 1);
		store_lru_sync_locked(s, b); /* evictable again */
		n++;
	}
	return n;
}

/* CLOCK_REALTIME in ms. */
static uint64_t wall_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t store_retain_wall_until_locked(const struct store *s, const struct store_block *b)
{
	uint64_t until = store_retain_until_locked(s, b), now = store_now_ms();

	return until > now ? wall_now_ms() + (until - now) : 0;
}

uint64_t store_retain_until_from_wall(const struct store *s, uint64_t wall_until_ms)
{
	uint64_t wall = wall_now_ms(), left;

	if (wall_until_ms <= wall)
		return 0;
	left = wall_until_ms - wall;
	if (left > s->cfg.max_retain_ms)
		left = s->cfg.max_retain_ms;
	return left ? store_now_ms() + left : 0;
}

uint64_t store_retain_mem_bytes(const struct store *s)
{
	const struct store_retain_tab *t = &s->retain;

	return (uint64_t)t->cap * (sizeof(*t->recs) + sizeof(*t->heap)) +
	       (uint64_t)t->nbuckets * sizeof(*t->buckets);
}

void store_retain_free(struct store *s)
{
	free(s->retain.recs);
	free(s->retain.heap);
	free(s->retain.buckets);
	memset(&s->retain, 0, sizeof(s->retain));
}

/* ---- the public calls ---- */

uint64_t store_retain_until_for(const struct store *s, uint32_t retain_ms,
				struct store_retain_res *res)
{
	uint32_t max = s->cfg.max_retain_ms;

	res->flags = 0;
	res->retain_ms = 0;
	if (!retain_ms)
		return 0;
	if (retain_ms > max) {
		res->flags |= STORE_PUT_RETAIN_CLAMPED;
		retain_ms = max;
	}
	if (!retain_ms)
		return 0;
	res->retain_ms = retain_ms;
	return store_now_ms() + retain_ms;
}

void store_retain_apply_locked(struct store *s, struct store_block *b, uint64_t until,
			       struct store_tenant *by, struct store_retain_res *res)
{
	enum store_retain_outcome o;

	if (!until)
		return;
	o = store_retain_block_locked(s, b, until, true, by);
	if (o == STORE_RETAIN_OK) {
		res->flags |= STORE_PUT_RETAINED;
		return;
	}
	if (o == STORE_RETAIN_REFUSED)
		res->flags |= STORE_PUT_RETAIN_BUDGET;
	res->retain_ms = 0;
}

int store_put_retain(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint32_t retain_ms, struct store_retain_res *out)
{
	return store_put_retain_by(s, ns_id, key, retain_ms, NULL, out);
}

int store_put_retain_by(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			uint32_t retain_ms, struct store_tenant *by, struct store_retain_res *out)
{
	struct store_retain_res res;
	uint64_t until = store_retain_until_for(s, retain_ms, &res);
	struct store_block *b;
	int rc = 0;

	store_lock(s);
	if (!store_ns_find_locked(s, ns_id)) {
		rc = -EINVAL;
	} else {
		b = store_find_locked(s, ns_id, key);
		if (!b)
			rc = -ENOENT;
		else
			store_retain_apply_locked(s, b, until, by, &res);
	}
	pthread_mutex_unlock(&s->lock);
	if (!rc && out)
		*out = res;
	return rc;
}

/* Retain the leading run keys[0..n) of namespace ns (a MATCH's), until
 * `until`, leading blocks first: stops at the first block the budget
 * refuses (or that is gone). Returns how many are retained. */
uint32_t store_retain_run_locked(struct store *s, uint32_t ns_id,
				 const uint8_t (*keys)[STORE_KEY_BYTES], uint32_t n,
				 uint64_t until, struct store_tenant *by, uint32_t *flags)
{
	uint32_t i;

	for (i = 0; i < n; i++) {
		struct store_block *b = store_find_locked(s, ns_id, keys[i]);
		enum store_retain_outcome o;

		if (!b)
			break;
		o = store_retain_block_locked(s, b, until, true, by);
		if (o == STORE_RETAIN_OK)
			continue;
		if (o == STORE_RETAIN_REFUSED) {
			*flags |= STORE_MATCH_RETAIN_BUDGET;
			/* the rest would each cost at least as much: refused too */
			if (n - i - 1) {
				struct store_ns *ns = store_ns_find_locked(s, ns_id);

				count(s, ns, by ? by : ns->tenant,
				      offsetof(struct store_retain_acct, refused), n - i - 1);
			}
		}
		break;
	}
	return i;
}

void store_tenant_retain_budget(struct store *s, struct store_tenant *t,
				uint64_t max_retained_bytes)
{
	store_lock(s);
	t->racct.max_bytes = max_retained_bytes;
	pthread_mutex_unlock(&s->lock);
}

void store_tenant_retain_stats(struct store *s, const struct store_tenant *t,
			       struct store_retain_stats *out)
{
	store_lock(s);
	store_retain_expire_locked(s, store_now_ms());
	out->blocks = t->racct.blocks;
	out->bytes = t->racct.bytes;
	out->budget_bytes = t->racct.max_bytes;
	out->refused = t->racct.refused;
	out->expired = t->racct.expired;
	pthread_mutex_unlock(&s->lock);
}
