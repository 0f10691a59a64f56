/*
 * put.c - the two-phase PUT: reserve arena space (evicting if needed),
 * let the caller write the payload with no lock held, then verify the
 * checksum outside the lock and make the block visible under it.
 *
 * With an NVMe tier, room comes from dropping clean DRAM copies; when only
 * dirty copies are left, begin answers -EAGAIN and wakes the demoter
 * rather than wait for the disk (evict.c, store_alloc_room_locked).
 *
 * Reservations are not in the index: several puts of one key may each
 * reserve, and the first to commit wins; the others get -EEXIST and their
 * space back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "proto_xxh3.h"

static const uint8_t zero_key[STORE_KEY_BYTES];

/* A parent of 32 zero bytes is how a first block is written in the index,
 * so it means "no parent" just like NULL. */
static bool has_parent(const uint8_t *parent)
{
	return parent && memcmp(parent, zero_key, STORE_KEY_BYTES) != 0;
}

/* Would reserving `bytes` more exceed max_inflight_put_bytes (0 = no limit)? */
static bool inflight_full(const struct store *s, uint64_t bytes)
{
	uint64_t max = s->cfg.max_inflight_put_bytes;

	return max && (s->inflight_bytes > max || bytes > max - s->inflight_bytes);
}

/* Growth that a later commit must not fail on: heap room for every
 * header that may become visible, and index buckets (best effort). */
static int reserve_room_locked(struct store *s)
{
	uint64_t headers = s->blocks + s->nreserved + 1;

	if (headers > store_index_buckets(&s->index)) {
		store_wr_begin(s);
		(void)store_index_reserve(&s->index, headers);
		store_wr_end(s);
	}
	return store_lru_reserve_locked(s, headers);
}

/* Checks of store_put_begin under the lock, in the documented order;
 * *pin receives the stored parent to pin (or NULL). */
static int begin_checks_locked(struct store *s, struct store_ns *ns, const uint8_t *key,
			       const uint8_t *parent, uint32_t flags, uint64_t bytes,
			       struct store_block **pin)
{
	struct store_block *p = NULL;

	if (store_find_locked(s, ns->ns_id, key))
		return -EEXIST;
	if (has_parent(parent)) {
		p = store_find_locked(s, ns->ns_id, parent);
		if (!p && !(flags & STORE_PUT_PARENT_IN_BATCH))
			return -ENOLINK;
	}
	if (inflight_full(s, bytes))
		return -EAGAIN;
	*pin = p;
	return 0;
}

/* Fill a new reservation's header. */
static void init_reservation(struct store_block *b, struct store_ns *ns, const uint8_t *key,
			     const uint8_t *parent, uint64_t length, uint64_t checksum)
{
	b->node.ns_id = ns->ns_id;
	memcpy(b->node.key, key, STORE_KEY_BYTES);
	b->has_parent = has_parent(parent);
	b->state = STORE_BLOCK_RESERVED;
	store_block_set_length(b, length);
	store_block_set_checksum(b, checksum);
	b->heap_idx[0] = STORE_HEAP_NONE;
	b->heap_idx[1] = STORE_HEAP_NONE;
}

/* The least recently used block of ns that can leave the pool now: no
 * visible children, no refs (GET, child reservation, I/O), no lease pins,
 * no retention; with t, only a block charged to t. A scan of the
 * namespace's blocks. NULL when there is none. */
static struct store_block *ns_victim_locked(struct store *s, struct store_ns *ns,
					    const struct store_tenant *t)
{
	struct store_block *best = NULL;

	for (uint32_t id = ns->blocks; id; id = store_ring_next(s, ns->blocks, id, STORE_RING_LINK)) {
		struct store_block *b = store_blk(s, id);

		if (store_has_children(b) || b->refs || b->leased || b->retained ||
		    (t && b->tenant_id != t->id))
			continue;
		if (!best || b->last_use < best->last_use)
			best = b;
	}
	return best;
}

/* Keep ns within its quota with length more payload bytes: evict its own
 * least recently used leaves until they fit. Errors: -EDQUOT (they do not
 * fit even then; what was evicted stays evicted). */
static int quota_room_locked(struct store *s, struct store_ns *ns, uint64_t length)
{
	uint64_t quota = ns->quota_bytes;

	if (!quota)
		return 0;
	if (length > quota)
		return -EDQUOT;
	store_wr_begin(s); /* the victims must see MATCHes' leases */
	while (ns->bytes + ns->reserved_bytes > quota - length) {
		struct store_block *victim = ns_victim_locked(s, ns, NULL);

		if (!victim) {
			store_wr_end(s);
			return -EDQUOT;
		}
		ns->evictions++;
		s->evictions++;
		store_block_remove_locked(s, victim);
	}
	store_wr_end(s);
	return 0;
}

/* Keep the writing tenant t within its max_bytes with length more payload
 * bytes: evict the least recently used leaves of ns that t wrote (never
 * another namespace's, never another tenant's) until they fit.
 * Errors: -EDQUOT. */
static int tenant_room_locked(struct store *s, struct store_ns *ns, struct store_tenant *t,
			      uint64_t length)
{
	if (!t || !t->max_bytes)
		return 0;
	if (length > t->max_bytes)
		return -EDQUOT;
	store_wr_begin(s); /* the victims must see MATCHes' leases */
	while (t->bytes > t->max_bytes - length) {
		struct store_block *victim = ns_victim_locked(s, ns, t);

		if (!victim) {
			store_wr_end(s);
			return -EDQUOT;
		}
		ns->evictions++;
		s->evictions++;
		store_block_remove_locked(s, victim);
	}
	store_wr_end(s);
	return 0;
}

/* Under the lock: check, take a header, pin the parent, allocate
 * (evicting), and record the reservation in *out. */
static int begin_locked(struct store *s, struct store_block **out, uint32_t ns_id,
			const uint8_t *key, const uint8_t *parent, uint32_t flags,
			uint64_t length, uint64_t checksum, struct store_tenant *writer)
{
	uint64_t pages = store_pages_of(length), bytes = pages * STORE_PAGE_BYTES;
	struct store_ns *ns = store_ns_find_locked(s, ns_id);
	struct store_block *pin = NULL, *b = NULL;
	int rc;

	if (!ns)
		return -EINVAL;
	rc = begin_checks_locked(s, ns, key, parent, flags, bytes, &pin);
	if (rc == 0)
		rc = reserve_room_locked(s);
	if (rc == 0) {
		/* before anything is evicted for it */
		b = store_slab_alloc(&s->slab);
		rc = b ? 0 : -ENOMEM;
	}
	if (rc) {
		if (rc == -EEXIST)
			ns->put_exists++;
		else
			ns->put_errors++;
		return rc;
	}
	/* pinned first, so that making room under the quota spares it */
	if (pin) {
		pin->refs++;
		store_lru_sync_locked(s, pin);
	}
	/* a writer without a tenant of its own: the namespace's */
	if (!writer)
		writer = ns->tenant;
	rc = quota_room_locked(s, ns, length);
	if (rc == 0)
		rc = tenant_room_locked(s, ns, writer, length);
	if (rc == 0)
		rc = store_alloc_room_locked(s, (uint32_t)pages, &b->first_page);
	if (rc) {
		if (pin)
			store_block_unpin_locked(s, pin);
		store_slab_free(&s->slab, b);
		ns->put_errors++;
		return rc;
	}
	init_reservation(b, ns, key, parent, length, checksum);
	store_set_parent(b, pin);
	if (b->has_parent && !pin)
		memcpy(b->pending_parent, parent, STORE_KEY_BYTES);
	store_ring_add_tail(s, &s->reserved, b, STORE_RING_LINK);
	ns->reservations++;
	ns->reserved_bytes += length;
	b->tenant_id = writer ? writer->id : 0;
	if (writer)
		writer->bytes += length;
	s->nreserved++;
	s->inflight_bytes += bytes;
	*out = b;
	return 0;
}

int store_put_begin(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    const uint8_t *parent, uint32_t flags, uint64_t length, uint64_t checksum,
		    struct store_block **out, void **dst)
{
	return store_put_begin_for(s, ns_id, key, parent, flags, length, checksum, NULL, out, dst);
}

int store_put_begin_for(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			const uint8_t *parent, uint32_t flags, uint64_t length, uint64_t checksum,
			struct store_tenant *writer, struct store_block **out, void **dst)
{
	struct store_block *b;
	int rc;

	if (length == 0)
		return -EINVAL;
	if (length > s->cfg.max_block_bytes || store_pages_of(length) > store_arena_pages(s->arena))
		return -EMSGSIZE;
	store_lock(s);
	rc = begin_locked(s, &b, ns_id, key, parent, flags, length, checksum, writer);
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return rc;
	*out = b;
	*dst = store_arena_ptr(s->arena, b->first_page);
	return 0;
}

/* Take reservation b off the reserved list and the in-flight total. */
static void unreserve_locked(struct store *s, struct store_block *b)
{
	struct store_ns *ns = store_block_ns(s, b);

	store_ring_del(s, &s->reserved, b, STORE_RING_LINK);
	ns->reservations--;
	ns->reserved_bytes -= store_block_length(b);
	if (store_block_tenant(s, b))
		store_block_tenant(s, b)->bytes -= store_block_length(b);
	s->nreserved--;
	s->inflight_bytes -= (uint64_t)b->pages * STORE_PAGE_BYTES;
}

/* Make reservation b visible below parent p (may be NULL). */
static void publish_locked(struct store *s, struct store_block *b, struct store_block *p)
{
	struct store_ns *ns = store_block_ns(s, b);

	store_wr_begin(s); /* before b looks visible to a logged MATCH intent */
	b->state = STORE_BLOCK_VISIBLE;
	b->in_dram = 1;
	store_set_parent(b, p);
	/* the fields of a visible block, over pending_parent (read already) */
	memset(&b->last_use, 0, sizeof(*b) - offsetof(struct store_block, last_use));
	store_index_insert(&s->index, &b->node);
	store_ring_add_tail(s, &ns->blocks, b, STORE_RING_LINK);
	if (p) {
		store_child_add(s, p, b);
		store_lru_sync_locked(s, p);
	}
	ns->nblocks++;
	ns->bytes += store_block_length(b);
	if (store_block_tenant(s, b))
		store_block_tenant(s, b)->bytes += store_block_length(b);
	ns->puts++;
	s->blocks++;
	s->dram_blocks++;
	s->used_bytes += (uint64_t)b->pages * STORE_PAGE_BYTES;
	s->payload_bytes += store_block_length(b);
	store_lru_touch_locked(s, b);
	store_lru_sync_locked(s, b);
	store_wr_end(s);
	store_event_block_locked(s, b, STORE_EVENT_STORED);
}

/* Decide the fate of reservation b whose payload hashed to `sum`. */
static int commit_locked(struct store *s, struct store_block *b, uint64_t sum)
{
	struct store_ns *ns = store_block_ns(s, b);
	struct store_block *p = NULL;

	if (sum != store_block_checksum(b)) {
		s->checksum_errors++;
		ns->put_errors++;
		return -EBADMSG;
	}
	if (store_find_locked(s, ns->ns_id, b->node.key)) {
		ns->put_exists++;
		return -EEXIST;
	}
	if (b->has_parent) {
		/* the pinned parent may have been removed (and put again) */
		struct store_block *pin = store_parent(s, b);

		p = store_find_locked(s, ns->ns_id, pin ? pin->node.key : b->pending_parent);
		if (!p) {
			ns->put_errors++;
			return -ENOLINK;
		}
	}
	publish_locked(s, b, p);
	return 0;
}

int store_put_commit(struct store *s, struct store_block *b)
{
	return store_put_commit_hashed(s, b, XXH3_64bits(store_arena_ptr(s->arena, b->first_page),
							 store_block_length(b)));
}

/* Commit b (payload hashed to sum) and, with until != 0, retain what
 * the key names afterwards: b, or the block a concurrent put committed
 * first (-EEXIST); the outcome goes to *res. */
static int commit_retain(struct store *s, struct store_block *b, uint64_t sum, uint64_t until,
			 struct store_tenant *by, struct store_retain_res *res)
{
	struct store_block *pin;
	int rc;

	store_lock(s);
	pin = store_parent(s, b); /* the slab's chunk table only under the lock */
	unreserve_locked(s, b);
	rc = commit_locked(s, b, sum);
	if (until && (rc == 0 || rc == -EEXIST)) {
		struct store_block *e = rc ? store_find_locked(s, b->node.ns_id, b->node.key) : b;

		if (e)
			store_retain_apply_locked(s, e, until, by, res);
	}
	if (rc) {
		(void)store_arena_free(s->arena, b->first_page);
		store_slab_free(&s->slab, b);
	}
	if (pin)
		store_block_unpin_locked(s, pin);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int store_put_commit_hashed(struct store *s, struct store_block *b, uint64_t sum)
{
	return commit_retain(s, b, sum, 0, NULL, NULL);
}

int store_put_commit_retain(struct store *s, struct store_block *b, const uint64_t *sum,
			    uint32_t retain_ms, struct store_retain_res *out)
{
	return store_put_commit_retain_by(s, b, sum, retain_ms, NULL, out);
}

int store_put_commit_retain_by(struct store *s, struct store_block *b, const uint64_t *sum,
			       uint32_t retain_ms, struct store_tenant *by,
			       struct store_retain_res *out)
{
	struct store_retain_res res;
	uint64_t until = store_retain_until_for(s, retain_ms, &res);
	uint64_t h = sum ? *sum : XXH3_64bits(store_arena_ptr(s->arena, b->first_page),
					      store_block_length(b));
	int rc = commit_retain(s, b, h, until, by, &res);

	if (rc && rc != -EEXIST)
		memset(&res, 0, sizeof(res));
	if (out)
		*out = res;
	return rc;
}

void store_put_abort(struct store *s, struct store_block *b)
{
	struct store_block *pin;

	store_lock(s);
	pin = store_parent(s, b);
	unreserve_locked(s, b);
	(void)store_arena_free(s->arena, b->first_page);
	store_slab_free(&s->slab, b);
	if (pin)
		store_block_unpin_locked(s, pin);
	pthread_mutex_unlock(&s->lock);
}
