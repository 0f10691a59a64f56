/*
 * match.c - MATCH without the store lock.
 *
 * A MATCH of a 1,000-block chain looks up 1,000 keys; under the store
 * lock it would queue every worker's PUT and GET behind it. Here the
 * lookups read the index without the lock, one probe per key, inside
 * seqlock read sections (index.h), and what a MATCH changes is deferred:
 *
 *  - each thread that matches owns a log (struct store_mlog): a ring of
 *    intents it alone appends to: "block id (ns, key) was matched: mark
 *    it used, lease it to this lessee until then", and one "namespace
 *    counters" intent per MATCH;
 *  - whoever next takes the lock (store_lock, store_wr_begin) applies
 *    every log in order, re-checking that each block still is the one
 *    matched (visible, same namespace, same leading key bytes);
 *  - an eviction or any other change the reader must not miss runs inside
 *    store_wr_begin, which first makes the index's seq odd, then drains.
 *    A reader appends its intent BEFORE it validates its read section, so
 *    either its validation sees that writer (and it looks again), or the
 *    writer's drain sees its intent (and the block is pinned before the
 *    eviction decides): a lease MATCH granted is never lost to a race.
 *
 * What is approximate: a matched block's recency is updated when the
 * intent is applied, not at the MATCH (within one locked operation or one
 * store_tick, 100 ms, later). What needs the lock anyway: a thread beyond
 * STORE_MLOG_MAX, a MATCH longer than its log, a log that stays full, or
 * a writer holding seq odd for long (a large DROP_NAMESPACE): those MATCHes
 * take the lock as before, with one probe per key too.
 *
 * Memory safety without the lock: headers are never unmapped while the
 * pool is open; the bucket array, the slab's chunk table and namespace
 * records are freed only after store_quiesce, which waits for every
 * reader in a read section (its log's odd epoch) to leave it.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Polls of an odd seq before a reader gives up and takes the lock: a
 * few tens of microseconds, longer than a PUT's commit, shorter than an
 * eviction pass of many blocks. */
#define READ_SPINS 2000u
/* Times one read section may restart before the MATCH takes the lock. */
#define KEY_RETRIES 64u
/* Keys looked up in one read section (one validation each). */
#define SECTION_KEYS 32u

/* The pool and log this thread used last: a thread matches on one pool
 * almost always (a kvpoold worker); tests that switch pools pay a scan. */
static __thread uint64_t tl_serial;
static __thread struct store_mlog *tl_log;

/* This thread's log in s, registered on first use; NULL when every slot
 * is taken or there is no memory (the caller takes the lock instead). */
static struct store_mlog *mlog_mine(struct store *s)
{
	pthread_t me = pthread_self();
	struct store_mlog *log = NULL;
	uint32_t n;

	if (tl_serial == s->serial)
		return tl_log;
	n = __atomic_load_n(&s->nmlogs, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < n && !log; i++)
		if (pthread_equal(s->mlogs[i]->owner, me))
			log = s->mlogs[i];
	if (!log) {
		pthread_mutex_lock(&s->lock);
		if (s->nmlogs < STORE_MLOG_MAX) {
			log = aligned_alloc(64, sizeof(*log));
			if (log) {
				memset(log, 0, offsetof(struct store_mlog, e));
				log->owner = me;
				s->mlogs[s->nmlogs] = log;
				__atomic_store_n(&s->nmlogs, s->nmlogs + 1, __ATOMIC_RELEASE);
			}
		}
		pthread_mutex_unlock(&s->lock);
	}
	/* cached even when NULL: slots never come free while s is open */
	tl_serial = s->serial;
	tl_log = log;
	return log;
}

/* Free entries in log (owner's view). */
static uint64_t mlog_room(const struct store_mlog *log)
{
	return STORE_MLOG_ENTRIES - (log->tail - __atomic_load_n(&log->head, __ATOMIC_ACQUIRE));
}

/* Append one intent; the caller checked the room. A writer whose
 * store_wr_begin comes after the reader's validation finds it (see the
 * top). */
static void mlog_append(struct store_mlog *log, uint32_t id, uint32_t ns_id, uint64_t key8,
			struct store_lease *lease, uint64_t matched)
{
	struct store_intent *e = &log->e[log->tail & (STORE_MLOG_ENTRIES - 1)];

	e->id = id;
	e->ns_id = ns_id;
	e->key8 = key8;
	if (id)
		e->lease = lease;
	else
		e->matched = matched;
	/* release: the full barrier of store_index_read_retry orders this
	 * store before the reader's validation (store-buffering pattern
	 * against the writer's seq increment, then its tail load) */
	__atomic_store_n(&log->tail, log->tail + 1, __ATOMIC_RELEASE);
}

/* Have at least n lease records in the owner's stock (allocated without
 * the lock). Errors: -ENOMEM (what was allocated stays in the stock). */
static int stock_fill(struct store_mlog *log, uint32_t n)
{
	struct store_lease *r = log->nstock < n ?
		__atomic_exchange_n(&log->returned, NULL, __ATOMIC_ACQUIRE) : NULL;

	while (r) {
		struct store_lease *next = r->by_block;

		r->by_block = log->stock;
		log->stock = r;
		log->nstock++;
		r = next;
	}
	while (log->nstock < n) {
		struct store_lease *r = malloc(sizeof(*r));

		if (!r)
			return -ENOMEM;
		r->by_block = log->stock;
		log->stock = r;
		log->nstock++;
	}
	return 0;
}

/* A record from the stock for lessee l until expiry_ms, or NULL if the
 * stock is empty. */
static struct store_lease *stock_take(struct store_mlog *log, struct store_lessee *l,
				      uint64_t expiry_ms)
{
	struct store_lease *r = log->stock;

	if (!r)
		return NULL;
	log->stock = r->by_block;
	log->nstock--;
	r->block = NULL;
	r->lessee = l;
	r->expiry_ms = expiry_ms;
	return r;
}

static uint64_t key8_of(const uint8_t *key)
{
	uint64_t k;

	memcpy(&k, key, sizeof(k));
	return k;
}

/* Give lease record r back to the log it came from (lock held). */
static void stock_return(struct store_mlog *log, struct store_lease *r)
{
	r->by_block = __atomic_load_n(&log->returned, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(&log->returned, &r->by_block, r, true,
					    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
		;
}

/* Apply one matched-block intent of log (lock held). */
static void apply_block(struct store *s, struct store_mlog *log, const struct store_intent *e)
{
	struct store_block *b = store_slab_ptr_racy(&s->slab, e->id);

	if (!b || b->state != STORE_BLOCK_VISIBLE || b->node.ns_id != e->ns_id ||
	    key8_of(b->node.key) != e->key8) {
		/* gone, or its header now holds another block */
		if (e->lease)
			stock_return(log, e->lease);
		return;
	}
	store_lru_touch_locked(s, b);
	b->reused = 1;
	if (!e->lease)
		return;
	if (store_lease_grant_rec_locked(s, e->lease, b)) {
		/* The record is the pool's now; leases that ended left their
		 * records there as spares: one goes back to the thread in its
		 * place, so a thread's stock is not refilled by malloc while
		 * spares pile up in the pool. */
		struct store_lease *spare = store_lease_take_spare_locked(s);

		if (spare)
			stock_return(log, spare);
	} else {
		stock_return(log, e->lease); /* an existing lease was extended */
	}
}

/* Apply a MATCH's namespace counters (lock held). */
static void apply_counts(struct store *s, const struct store_intent *e)
{
	struct store_ns *ns = store_ns_find_locked(s, e->ns_id);

	if (!ns)
		return;
	ns->match_requests++;
	ns->match_blocks_queried += e->key8;
	ns->match_blocks_matched += e->matched;
}

void store_match_drain_locked(struct store *s)
{
	uint32_t n = s->nmlogs;

	for (uint32_t i = 0; i < n; i++) {
		struct store_mlog *log = s->mlogs[i];
		uint64_t head = log->head, tail = __atomic_load_n(&log->tail, __ATOMIC_SEQ_CST);

		if (head == tail)
			continue;
		for (; head != tail; head++) {
			const struct store_intent *e = &log->e[head & (STORE_MLOG_ENTRIES - 1)];

			if (e->id)
				apply_block(s, log, e);
			else
				apply_counts(s, e);
		}
		__atomic_store_n(&log->head, tail, __ATOMIC_RELEASE);
	}
}

void store_quiesce(struct store *s)
{
	uint32_t n = __atomic_load_n(&s->nmlogs, __ATOMIC_ACQUIRE);

	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint32_t i = 0; i < n; i++) {
		const struct store_mlog *log = s->mlogs[i];
		uint64_t v = __atomic_load_n(&log->epoch, __ATOMIC_SEQ_CST);

		if (!(v & 1))
			continue;
		/* a read section lasts microseconds, unless its thread lost
		 * its CPU: then give ours up rather than spin a time slice */
		for (uint32_t spins = 0; __atomic_load_n(&log->epoch, __ATOMIC_ACQUIRE) == v;
		     spins++)
			if (spins >= 1000)
				sched_yield();
	}
}

void store_match_free_logs(struct store *s)
{
	for (uint32_t i = 0; i < s->nmlogs; i++) {
		struct store_mlog *log = s->mlogs[i];

		struct store_lease *lists[2] = { log->stock, log->returned };

		for (int k = 0; k < 2; k++) {
			while (lists[k]) {
				struct store_lease *r = lists[k];

				lists[k] = r->by_block;
				free(r);
			}
		}
		free(log);
	}
	s->nmlogs = 0;
}

/* Does namespace ns_id exist, read without the lock? 1 yes, 0 no,
 * -EAGAIN the read section failed. Namespace records are freed only after
 * store_quiesce, and their table changes inside write sections. */
static int ns_exists_racy(const struct store *s, uint32_t ns_id)
{
	int64_t seq = store_index_read_begin(&s->index, READ_SPINS);
	const struct store_ns *ns;
	uint32_t steps = 0;

	if (seq < 0)
		return -EAGAIN;
	ns = __atomic_load_n(&s->ns_by_id[ns_id & (STORE_NS_BUCKETS - 1)], __ATOMIC_ACQUIRE);
	while (ns && __atomic_load_n(&ns->ns_id, __ATOMIC_RELAXED) != ns_id &&
	       ++steps < STORE_MAX_NAMESPACES)
		ns = __atomic_load_n(&ns->id_next, __ATOMIC_ACQUIRE);
	if (store_index_read_retry(&s->index, seq))
		return -EAGAIN;
	return ns != NULL;
}

/* The lookups of a MATCH without the lock, logging an intent per matched
 * key (with a lease record from the stock when lessee) and one for the
 * counters. *matched = leading keys found. Errors: -EINVAL (unknown
 * ns_id), -EAGAIN (read sections kept failing, or the log or the stock
 * ran out: take the lock; intents logged so far are harmless repeats of
 * what the locked path does). */
static int match_racy(struct store *s, struct store_mlog *log, uint32_t ns_id,
		      const uint8_t (*keys)[STORE_KEY_BYTES], uint32_t count,
		      struct store_lessee *lessee, uint64_t expiry_ms, uint32_t *matched)
{
	uint32_t n = 0;
	int exists;

	bool miss = false;

	/* Keys are looked up in read sections of up to SECTION_KEYS: one
	 * validation (a full barrier) per section, not per key. A section
	 * that fails is looked up again; its intents stay logged (repeats). */
	while (n < count && !miss) {
		uint32_t tries = 0, done;
		int64_t seq;

		for (;;) {
			uint32_t id = 0;

			seq = store_index_read_begin(&s->index, READ_SPINS);
			if (seq < 0 || ++tries > KEY_RETRIES)
				return -EAGAIN;
			miss = false;
			for (done = 0; done < SECTION_KEYS && n + done < count; done++) {
				if (mlog_room(log) < 2 || (lessee && !log->stock))
					return -EAGAIN;
				if (store_index_find_racy(&s->index, seq, ns_id, keys[n + done],
							  &id) < 0)
					break; /* invalid: the retry below will say so */
				if (!id) {
					miss = true;
					break;
				}
				mlog_append(log, id, ns_id, key8_of(keys[n + done]),
					    lessee ? stock_take(log, lessee, expiry_ms) : NULL, 0);
			}
			if (!store_index_read_retry(&s->index, seq))
				break;
		}
		n += done;
	}
	if (n == 0) {
		/* a visible block implies its namespace; none found: ask */
		exists = ns_exists_racy(s, ns_id);
		if (exists < 0)
			return exists;
		if (!exists)
			return -EINVAL;
	}
	mlog_append(log, 0, ns_id, count, NULL, n);
	*matched = n;
	return 0;
}

/* Lease records a MATCH of `count` keys takes from the stock: one per
 * key, and some spare for keys whose read section restarts. */
#define STOCK_SLACK (2 * SECTION_KEYS)

/* Does leasing one more block of `bytes` to l take l or its tenant past
 * its bound? (What this MATCH leased so far is in leased_bytes already.) */
static bool lease_passes(const struct store_lessee *l, uint64_t bytes)
{
	const struct store_tenant *t = l->tenant;

	if (l->max_leased_bytes && l->leased_bytes + bytes > l->max_leased_bytes)
		return true;
	return t && t->max_leased_bytes && t->leased_bytes + bytes > t->max_leased_bytes;
}

/* Does a lease for l need the locked path (a bound to check exactly)? */
static bool lease_bounded(const struct store_lessee *l)
{
	const struct store_tenant *t;

	if (!l)
		return false;
	t = __atomic_load_n(&l->tenant, __ATOMIC_RELAXED);
	return __atomic_load_n(&l->max_leased_bytes, __ATOMIC_RELAXED) ||
	       (t && __atomic_load_n(&t->max_leased_bytes, __ATOMIC_RELAXED));
}

/* MATCH under the lock: one probe per key; lease records reserved first,
 * so a failure leaves nothing done. *present receives the leading run
 * stored; *matched the run answered: with a lessee whose bound (or its
 * tenant's) the lease of the whole present run would pass, the longest
 * leading run whose lease fits (blocks it leases already count nothing,
 * matching them again only extends them). Only the answered blocks are
 * marked used and leased. Errors: -EINVAL, -ENOMEM. */
static int match_locked(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
			uint32_t count, struct store_lessee *lessee, uint64_t expiry_ms,
			uint32_t *matched, uint32_t *present)
{
	struct store_ns *ns = store_ns_find_locked(s, ns_id);
	bool bounded = lessee && (lessee->max_leased_bytes ||
				  (lessee->tenant && lessee->tenant->max_leased_bytes));
	uint32_t n = 0, cut = UINT32_MAX;
	int rc;

	if (!ns)
		return -EINVAL;
	if (lessee && count) {
		rc = store_lease_reserve_locked(s, count);
		if (rc)
			return rc;
	}
	for (; n < count; n++) {
		struct store_block *b = store_find_locked(s, ns_id, keys[n]);

		if (!b)
			break;
		if (cut != UINT32_MAX)
			continue; /* present, past the cut: counted, not answered */
		if (bounded && !store_lease_held_locked(s, lessee, b) &&
		    lease_passes(lessee, store_block_length(b))) {
			cut = n;
			continue;
		}
		store_lru_touch_locked(s, b);
		b->reused = 1;
		if (lessee)
			store_lease_grant_locked(s, lessee, b, expiry_ms);
	}
	*present = n;
	*matched = cut == UINT32_MAX ? n : cut;
	ns->match_requests++;
	ns->match_blocks_queried += count;
	ns->match_blocks_matched += *matched;
	return 0;
}

/* The lease length MATCH grants: lease_ms capped, 0 when no lessee. */
static uint32_t lease_ms_for(const struct store *s, uint32_t lease_ms,
			     const struct store_lessee *lessee)
{
	if (!lessee)
		return 0;
	return lease_ms < s->cfg.max_lease_ms ? lease_ms : s->cfg.max_lease_ms;
}

/* Make room in log for `need` intents: apply the pool's logs if the lock
 * is free right now (never waits for it). Returns whether there is room. */
static bool mlog_make_room(struct store *s, struct store_mlog *log, uint64_t need)
{
	if (mlog_room(log) >= need && mlog_room(log) > STORE_MLOG_ENTRIES / 2)
		return true;
	if (pthread_mutex_trylock(&s->lock) == 0) {
		store_match_drain_locked(s);
		pthread_mutex_unlock(&s->lock);
	}
	return mlog_room(log) >= need;
}

int store_match_ex(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		   uint32_t count, const struct store_match_opts *opts,
		   struct store_match_res *out)
{
	struct store_lessee *lessee = opts ? opts->lessee : NULL;
	uint32_t granted = lease_ms_for(s, opts ? opts->lease_ms : 0, lessee), n = 0, present = 0;
	struct store_lessee *l = granted ? lessee : NULL;
	uint64_t expiry_ms = granted ? store_now_ms() + granted : 0;
	struct store_retain_res rr;
	uint64_t until = store_retain_until_for(s, opts ? opts->retain_ms : 0, &rr);
	struct store_match_res res = { 0 };
	struct store_mlog *log = until ? NULL : mlog_mine(s);
	int rc = -EAGAIN;

	if (log && l && !lease_bounded(l) && stock_fill(log, count + STOCK_SLACK) < 0)
		return -ENOMEM; /* nothing logged: nothing leased or marked */
	/* a bounded lease is checked exactly, under the lock; so is a
	 * retention (budgets) */
	if (log && !lease_bounded(l) && mlog_make_room(s, log, (uint64_t)count + 1)) {
		__atomic_add_fetch(&log->epoch, 1, __ATOMIC_SEQ_CST);
		rc = match_racy(s, log, ns_id, keys, count, l, expiry_ms, &n);
		__atomic_add_fetch(&log->epoch, 1, __ATOMIC_RELEASE);
	}
	if (rc == -EAGAIN) {
		store_lock(s);
		rc = match_locked(s, ns_id, keys, count, l, expiry_ms, &n, &present);
		if (!rc && until && n)
			res.retained = store_retain_run_locked(s, ns_id, keys, n, until,
								opts->retainer, &res.flags);
		pthread_mutex_unlock(&s->lock);
	} else {
		present = n;
	}
	if (rc)
		return rc;
	res.matched = n;
	res.present = present;
	res.lease_ms = n ? granted : 0;
	if (present > n)
		res.flags |= STORE_MATCH_LEASE_CUT;
	if (rr.flags & STORE_PUT_RETAIN_CLAMPED)
		res.flags |= STORE_MATCH_RETAIN_CLAMPED;
	res.retain_ms = res.retained ? rr.retain_ms : 0;
	*out = res;
	return 0;
}

int store_match(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		uint32_t count, uint32_t lease_ms, struct store_lessee *lessee,
		uint32_t *matched, uint32_t *lease_ms_granted)
{
	struct store_match_opts o = { .lease_ms = lease_ms, .lessee = lessee };
	struct store_match_res r;
	int rc = store_match_ex(s, ns_id, keys, count, &o, &r);

	if (rc)
		return rc;
	*matched = r.matched;
	if (lease_ms_granted)
		*lease_ms_granted = r.lease_ms;
	return 0;
}

/* The lookups of store_present without the lock: as match_racy, but
 * nothing is logged. Errors: -EAGAIN (read sections kept failing). */
static int present_racy(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
			uint32_t count, uint32_t *present)
{
	uint32_t n = 0;
	bool miss = false;

	while (n < count && !miss) {
		uint32_t tries = 0, done;
		int64_t seq;

		for (;;) {
			uint32_t id = 0;

			seq = store_index_read_begin(&s->index, READ_SPINS);
			if (seq < 0 || ++tries > KEY_RETRIES)
				return -EAGAIN;
			miss = false;
			for (done = 0; done < SECTION_KEYS && n + done < count; done++) {
				if (store_index_find_racy(&s->index, seq, ns_id, keys[n + done],
							  &id) < 0)
					break; /* invalid: the retry below will say so */
				if (!id) {
					miss = true;
					break;
				}
			}
			if (!store_index_read_retry(&s->index, seq))
				break;
		}
		n += done;
	}
	*present = n;
	return 0;
}

int store_present(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		  uint32_t count, uint32_t *present)
{
	struct store_mlog *log = mlog_mine(s);
	uint32_t n = 0;
	int rc = -EAGAIN;

	if (log) {
		/* the odd epoch keeps the bucket array and headers alive
		 * while we read them (store_quiesce) */
		__atomic_add_fetch(&log->epoch, 1, __ATOMIC_SEQ_CST);
		rc = present_racy(s, ns_id, keys, count, &n);
		__atomic_add_fetch(&log->epoch, 1, __ATOMIC_RELEASE);
	}
	if (rc == -EAGAIN) {
		n = 0;
		store_lock(s);
		while (n < count && store_find_locked(s, ns_id, keys[n]))
			n++;
		pthread_mutex_unlock(&s->lock);
	}
	*present = n;
	return 0;
}
