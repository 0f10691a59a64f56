/*
 * get.c - GET (pin and release; an NVMe-only block is promoted by an I/O
 * thread, nvme/promote.c) and EXISTS. MATCH is in match.c, DELETE with
 * the rest of removal in evict.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "nvme/tier.h"

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

/* The block was used by a GET: recency, admission, the lessee's pin. */
static void mark_got_locked(struct store *s, struct store_block *b, struct store_lessee *lessee)
{
	store_lru_touch_locked(s, b);
	b->reused = 1;
	if (lessee)
		store_lease_end_for_locked(s, lessee, b);
}

int store_get_fit_async(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			uint64_t max_length, struct store_lessee *lessee, struct store_ref *out,
			store_get_done_fn done, void *arg)
{
	struct store_ns *ns;
	struct store_block *b;
	int rc;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	b = ns ? store_find_locked(s, ns_id, key) : NULL;
	if (b && !b->in_dram && !store_tier_can_promote_locked(s))
		b = NULL;
	if (!b) {
		if (ns)
			ns->get_misses++;
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	if (store_block_length(b) > max_length) {
		/* a size query, or a buffer too small: nothing is sent, so
		 * nothing is pinned, promoted or marked, and a lease the
		 * lessee holds stays for the GET that follows */
		memset(out, 0, sizeof(*out));
		out->length = store_block_length(b);
		out->tier = b->in_dram ? STORE_TIER_DRAM : STORE_TIER_NVME;
		pthread_mutex_unlock(&s->lock);
		return -EMSGSIZE;
	}
	if (!b->in_dram) {
		/* hit or miss is counted when the read ends */
		rc = store_promo_join_locked(s, b, ns_id, out, done, arg);
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
	fill_ref(s, b, out, STORE_TIER_DRAM);
	return 0;
}

int store_get_async(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    struct store_lessee *lessee, struct store_ref *out,
		    store_get_done_fn done, void *arg)
{
	return store_get_fit_async(s, ns_id, key, UINT64_MAX, lessee, out, done, arg);
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
		where = b->in_dram ? STORE_TIER_DRAM : STORE_TIER_NVME;
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
