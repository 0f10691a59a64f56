/*
 * lookup.c - GET (pin and release; an NVMe-only block is promoted by an
 * I/O thread, promote.c), EXISTS, DELETE. MATCH is in match.c.
 */
#include <errno.h>
#include <stdlib.h>

#include "store_impl.h"

/* Fill a caller's reference to pinned block b (in DRAM). */
static void fill_ref(const struct store *s, struct store_block *b, struct store_ref *out,
		     uint8_t tier)
{
	out->block = b;
	out->data = store_arena_ptr(s->arena, b->first_page);
	out->length = store_block_length(b);
	out->checksum = store_block_checksum(b);
	out->tier = tier;
}

/* Start a promotion of NVMe-only block b, or join the one running, for
 * this waiter. Errors: -ENOMEM. */
static int promo_join_locked(struct store *s, struct store_block *b, uint32_t ns_id,
			     struct store_ref *out, store_get_done_fn done, void *arg)
{
	struct store_waiter *w = malloc(sizeof(*w));
	struct store_promo *p = b->promoting ? store_promo_find_locked(s->tier, b) : NULL;

	if (!w)
		return -ENOMEM;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			free(w);
			return -ENOMEM;
		}
		p->block = b;
		store_promo_add_locked(s->tier, p);
		b->refs++;
		store_lru_sync_locked(s, b);
		store_list_add_tail(&s->tier->promo_queue, &p->link);
		s->tier->promos++;
		store_tier_kick_locked(s);
	}
	w->done = done;
	w->arg = arg;
	w->out = out;
	w->ns_id = ns_id;
	w->next = p->waiters;
	p->waiters = w;
	return 0;
}

/* Can an NVMe-only block be promoted now? Not after store_drain. */
static bool can_promote(const struct store *s)
{
	return s->tier && !s->tier->draining && !s->tier->stop;
}

/* The block was used by a GET: recency, admission, the lessee's pin. */
static void mark_got_locked(struct store *s, struct store_block *b, struct store_lessee *lessee)
{
	store_lru_touch_locked(s, b);
	b->reused = 1;
	if (lessee)
		store_lease_end_for_locked(s, lessee, b);
}

int store_get_async(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    struct store_lessee *lessee, struct store_ref *out,
		    store_get_done_fn done, void *arg)
{
	struct store_ns *ns;
	struct store_block *b;
	int rc;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	b = ns ? store_find_locked(s, ns_id, key) : NULL;
	if (b && !b->in_dram && !can_promote(s))
		b = NULL;
	if (!b) {
		if (ns)
			ns->get_misses++;
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	if (!b->in_dram) {
		/* hit or miss is counted when the read ends */
		rc = promo_join_locked(s, b, ns_id, out, done, arg);
		if (rc == 0)
			mark_got_locked(s, b, lessee);
		pthread_mutex_unlock(&s->lock);
		return rc ? rc : -EINPROGRESS;
	}
	ns->get_hits++;
	b->refs++;
	mark_got_locked(s, b, lessee);
	store_lru_sync_locked(s, b);
	pthread_mutex_unlock(&s->lock);
	fill_ref(s, b, out, 1);
	return 0;
}

/* store_get waiting for a promotion: the done callback wakes it. */
struct get_wait {
	pthread_mutex_t m;
	pthread_cond_t cv;
	bool done;
	int status;
};

static void get_wait_done(void *arg, int status)
{
	struct get_wait *w = arg;

	pthread_mutex_lock(&w->m);
	w->status = status;
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->m);
}

int store_get(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
	      struct store_lessee *lessee, struct store_ref *out)
{
	struct get_wait w = { .m = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	int rc = store_get_async(s, ns_id, key, lessee, out, get_wait_done, &w);

	if (rc != -EINPROGRESS)
		return rc;
	pthread_mutex_lock(&w.m);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.m);
	pthread_mutex_unlock(&w.m);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.m);
	return w.status;
}

void store_release(struct store *s, struct store_block *b)
{
	if (!b)
		return;
	store_lock(s);
	store_block_unpin_locked(s, b);
	pthread_mutex_unlock(&s->lock);
}

int store_exists_where(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		       uint64_t *length, uint8_t *tier)
{
	struct store_ns *ns;
	struct store_block *b;
	uint64_t len = 0;
	uint8_t where = 0;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	b = ns ? store_find_locked(s, ns_id, key) : NULL;
	if (ns) {
		if (b)
			ns->exists_hits++;
		else
			ns->exists_misses++;
	}
	if (b) {
		len = store_block_length(b);
		where = b->in_dram ? 1 : 2;
	}
	pthread_mutex_unlock(&s->lock);
	if (!b)
		return -ENOENT;
	if (length)
		*length = len;
	if (tier)
		*tier = where;
	return 0;
}

int store_exists(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *length)
{
	return store_exists_where(s, ns_id, key, length, NULL);
}

int store_delete(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *removed)
{
	struct store_ns *ns;
	struct store_block *b;
	uint64_t n = 0, before;
	int rc = 0;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	b = ns ? store_find_locked(s, ns_id, key) : NULL;
	if (b) {
		before = s->tier ? s->tier->disk_removals : 0;
		n = store_block_remove_tree_locked(s, b, NULL);
		ns->deletes += n;
		/* answered only once no record of the chain can come back */
		if (s->tier && s->tier->disk_removals != before)
			rc = store_tier_persist_removals_locked(s);
	}
	pthread_mutex_unlock(&s->lock);
	if (!b)
		return -ENOENT;
	if (rc)
		return rc;
	if (removed)
		*removed = n;
	return 0;
}
