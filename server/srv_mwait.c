/*
 * srv_mwait.c - MATCHes that wait for blocks (srv_mwait.h): the index of
 * waited keys the store's events feed, and each connection's queue of
 * MATCHes answered in request order.
 *
 * Shared, under mw->lock:
 *   key entries     (namespace, key) -> one "sub" per worker that has
 *                   waiters on it, each a doubly linked list of waiters;
 *   namespace records, one per namespace with parked MATCHes: its key
 *                   entries (so a drop finds them) and a drop count;
 *   tenant counts   token digest -> parked MATCHes (with a tokens file);
 *   woken subs      per worker (srv_worker.mw_woken): subs whose key was
 *                   committed, taken whole by the worker.
 * A waiter's own fields are its worker's, except `sub`/`next`/`prev`
 * (where it is linked), which change under the lock only.
 *
 * The lost wake-up: a worker parks a MATCH under key k after looking k
 * up and not finding it; a PUT of k may commit in between. So the worker
 * links the waiter first, then looks k up again (store_present) and
 * unparks it if k arrived. The hook runs after the commit is visible and
 * takes this lock; the worker's second look comes after its link
 * (released under this lock): one of the two sees the other.
 */
#include "srv_mwait.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "srv_auth.h"
#include "srv_clock.h"
#include "srv_conn.h"
#include "srv_log.h"
#include "srv_match.h"
#include "srv_request.h"
#include "srv_server.h"
#include "srv_worker.h"

#define KEY_BUCKETS_MIN 1024u
#define NS_BUCKETS 256u
#define TENANT_BUCKETS 64u
/* MATCHes a connection may have queued beyond its waiting ones (answered
 * in turn, or refused) before it stops reading. */
#define QUEUE_SLACK 64u

enum { HELD_NONE = 0, HELD_HEADER = 1, HELD_FRAME = 2 };
enum mw_state { MW_QUEUED, MW_WAITING, MW_READY };

struct mw_ns;
struct mw_key;
struct mw_tenant;

/* The waiters of one worker on one key. */
struct mw_sub {
	struct mw_sub *knext;     /* in its key's subs; once woken, the worker's list */
	struct mw_key *key;       /* NULL once woken */
	struct srv_worker *w;
	struct srv_mw *head;      /* waiters, doubly linked */
	uint64_t stored_us;       /* when the key was committed (woken) */
};

/* A key some MATCHes wait for. */
struct mw_key {
	struct mw_key *hnext;     /* hash chain */
	struct mw_key *nsnext, *nsprev;
	struct mw_ns *ns;
	uint64_t h;
	uint32_t ns_id;
	uint8_t key[STORE_KEY_BYTES];
	struct mw_sub *subs;
};

/* A namespace with parked MATCHes. */
struct mw_ns {
	struct mw_ns *hnext;
	uint32_t ns_id;
	uint32_t refs;            /* parked waiters */
	uint64_t drop_gen;        /* namespace drops seen */
	struct mw_key *keys;
};

/* The parked MATCHes of one token (tenant_max_match_waits). */
struct mw_tenant {
	struct mw_tenant *next;
	uint8_t digest[32];
	uint32_t count;
};

/* One queued MATCH. */
struct srv_mw {
	struct srv_mw *next, *prev;   /* in its sub (under the lock), or a run's list */
	struct mw_sub *sub;           /* where it is linked (under the lock), or NULL */
	struct srv_mw *qnext;         /* the connection's queue */
	struct srv_conn *c;
	struct mw_ns *ns;             /* while parked */
	struct mw_tenant *tenant;     /* while parked and counted */
	uint64_t drop_gen;
	struct event timer;
	uint8_t state;                /* enum mw_state */
	uint8_t parked;               /* counted as waiting (ns, tenant, counts) */
	uint8_t timer_on;
	uint8_t indexed_once;         /* it has waited for a block: WAITED */
	uint8_t version;              /* of its request: its reply's layout */
	struct proto_header hdr;      /* its request's header */
	uint64_t start_us;            /* request received */
	uint64_t woken_us;            /* commit of the key that woke it last, 0 none */
	uint32_t ns_id, count, want, lease_ms, wait_ms, retain_ms;
	uint32_t present;             /* leading keys known present (checked again at the end) */
	uint32_t flags;               /* reply flags decided so far (WAIT_CLAMPED, _REFUSED) */
	uint8_t end;                  /* enum mw_end once ready */
	uint8_t keys[][STORE_KEY_BYTES];
};

enum mw_end { END_NONE, END_COMPLETE, END_TIMEOUT, END_ENDED, END_REFUSED };

struct srv_mwait {
	pthread_mutex_t lock;
	struct srv *srv;
	struct mw_key **kb;
	uint32_t nkb, nkeys;
	struct mw_ns *nsb[NS_BUCKETS];
	struct mw_tenant *tb[TENANT_BUCKETS];
	uint64_t waiting;             /* parked MATCHes; atomic */
	uint64_t bytes;               /* what they hold (mw_bytes); under lock, read atomic */
};

/* ---- the index (mw->lock held) -------------------------------------------- */

static uint64_t key_hash(uint32_t ns_id, const uint8_t *key)
{
	uint64_t k;

	/* keys are block hashes already: their bytes are uniform */
	memcpy(&k, key, sizeof(k));
	return k ^ ((uint64_t)ns_id * 0x9E3779B97F4A7C15ull);
}

static struct mw_key *key_find(struct srv_mwait *mw, uint32_t ns_id, const uint8_t *key,
			       uint64_t h)
{
	struct mw_key *k = mw->kb[h & (mw->nkb - 1)];

	while (k && (k->h != h || k->ns_id != ns_id || memcmp(k->key, key, STORE_KEY_BYTES)))
		k = k->hnext;
	return k;
}

/* Double the bucket array when it is full; on no memory keep the chains
 * longer. */
static void key_grow(struct srv_mwait *mw)
{
	uint32_t n = mw->nkb * 2;
	struct mw_key **kb;

	if (mw->nkeys < mw->nkb || n < mw->nkb)
		return;
	kb = calloc(n, sizeof(*kb));
	if (!kb)
		return;
	for (uint32_t i = 0; i < mw->nkb; i++) {
		struct mw_key *k = mw->kb[i], *next;

		for (; k; k = next) {
			next = k->hnext;
			k->hnext = kb[k->h & (n - 1)];
			kb[k->h & (n - 1)] = k;
		}
	}
	free(mw->kb);
	mw->kb = kb;
	mw->nkb = n;
}

/* Take key k out of the hash and its namespace's list (not freed). */
static void key_unlink(struct srv_mwait *mw, struct mw_key *k)
{
	struct mw_key **pp = &mw->kb[k->h & (mw->nkb - 1)];

	while (*pp != k)
		pp = &(*pp)->hnext;
	*pp = k->hnext;
	if (k->nsprev)
		k->nsprev->nsnext = k->nsnext;
	else
		k->ns->keys = k->nsnext;
	if (k->nsnext)
		k->nsnext->nsprev = k->nsprev;
	mw->nkeys--;
}

static struct mw_ns *ns_find(struct srv_mwait *mw, uint32_t ns_id)
{
	struct mw_ns *n = mw->nsb[ns_id % NS_BUCKETS];

	while (n && n->ns_id != ns_id)
		n = n->hnext;
	return n;
}

static void ns_put(struct srv_mwait *mw, struct mw_ns *n)
{
	struct mw_ns **pp;

	if (--n->refs)
		return;
	for (pp = &mw->nsb[n->ns_id % NS_BUCKETS]; *pp != n; pp = &(*pp)->hnext)
		;
	*pp = n->hnext;
	free(n);
}

static struct mw_tenant *tenant_find(struct srv_mwait *mw, const uint8_t *digest)
{
	struct mw_tenant *t = mw->tb[digest[0] % TENANT_BUCKETS];

	while (t && memcmp(t->digest, digest, 32))
		t = t->next;
	return t;
}

static void tenant_put(struct srv_mwait *mw, struct mw_tenant *t)
{
	struct mw_tenant **pp;

	if (--t->count)
		return;
	for (pp = &mw->tb[t->digest[0] % TENANT_BUCKETS]; *pp != t; pp = &(*pp)->next)
		;
	*pp = t->next;
	free(t);
}

/* Spare entries allocated outside the lock, used by index_link if needed. */
struct spares {
	struct mw_key *key;
	struct mw_sub *sub;
};

static int spares_get(struct spares *sp)
{
	if (!sp->key)
		sp->key = malloc(sizeof(*sp->key));
	if (!sp->sub)
		sp->sub = malloc(sizeof(*sp->sub));
	return sp->key && sp->sub ? 0 : -ENOMEM;
}

static void spares_free(struct spares *sp)
{
	free(sp->key);
	free(sp->sub);
	sp->key = NULL;
	sp->sub = NULL;
}

/* Link waiter m under its first missing key, keys[m->present]. */
static void index_link(struct srv_mwait *mw, struct srv_mw *m, struct spares *sp)
{
	const uint8_t *key = m->keys[m->present];
	uint64_t h = key_hash(m->ns_id, key);
	struct mw_key *k = key_find(mw, m->ns_id, key, h);
	struct srv_worker *w = m->c->w;
	struct mw_sub *sub;

	if (!k) {
		k = sp->key;
		sp->key = NULL;
		memset(k, 0, sizeof(*k));
		k->h = h;
		k->ns_id = m->ns_id;
		memcpy(k->key, key, STORE_KEY_BYTES);
		k->ns = m->ns;
		k->hnext = mw->kb[h & (mw->nkb - 1)];
		mw->kb[h & (mw->nkb - 1)] = k;
		k->nsnext = m->ns->keys;
		if (k->nsnext)
			k->nsnext->nsprev = k;
		m->ns->keys = k;
		mw->nkeys++;
		key_grow(mw);
	}
	for (sub = k->subs; sub && sub->w != w; sub = sub->knext)
		;
	if (!sub) {
		sub = sp->sub;
		sp->sub = NULL;
		memset(sub, 0, sizeof(*sub));
		sub->key = k;
		sub->w = w;
		sub->knext = k->subs;
		k->subs = sub;
	}
	m->prev = NULL;
	m->next = sub->head;
	if (m->next)
		m->next->prev = m;
	sub->head = m;
	m->sub = sub;
	m->indexed_once = 1;
}

/* Unlink waiter m from wherever it is linked. An emptied sub that is
 * still under its key goes (and the key with its last sub); one already
 * woken stays on its worker's list, which frees it. */
static void index_unlink(struct srv_mwait *mw, struct srv_mw *m)
{
	struct mw_sub *sub = m->sub, **pp;
	struct mw_key *k;

	if (!sub)
		return;
	if (m->prev)
		m->prev->next = m->next;
	else
		sub->head = m->next;
	if (m->next)
		m->next->prev = m->prev;
	m->sub = NULL;
	m->next = m->prev = NULL;
	k = sub->key;
	if (sub->head || !k)
		return;
	for (pp = &k->subs; *pp != sub; pp = &(*pp)->knext)
		;
	*pp = sub->knext;
	free(sub);
	if (k->subs)
		return;
	key_unlink(mw, k);
	free(k);
}

/* Move every sub of key k (already unlinked) to its worker's woken list,
 * stamped `now`; workers whose list was empty go into wake[*n]. */
static void key_wake(struct mw_key *k, uint64_t now, struct srv_worker **wake, uint32_t *n,
		     uint32_t cap)
{
	struct mw_sub *sub, *next;

	for (sub = k->subs; sub; sub = next) {
		struct srv_worker *w = sub->w;

		next = sub->knext;
		sub->key = NULL;
		sub->stored_us = now;
		if (!w->mw_woken && *n < cap)
			wake[(*n)++] = w;
		sub->knext = w->mw_woken;
		w->mw_woken = sub;
	}
	k->subs = NULL;
}

/* ---- lifecycle ------------------------------------------------------------- */

struct srv_mwait *srv_mwait_new(struct srv *s)
{
	struct srv_mwait *mw = calloc(1, sizeof(*mw));

	if (!mw)
		return NULL;
	mw->kb = calloc(KEY_BUCKETS_MIN, sizeof(*mw->kb));
	if (!mw->kb) {
		free(mw);
		return NULL;
	}
	mw->nkb = KEY_BUCKETS_MIN;
	mw->srv = s;
	pthread_mutex_init(&mw->lock, NULL);
	return mw;
}

void srv_mwait_free(struct srv_mwait *mw)
{
	if (!mw)
		return;
	/* every connection closed, so every waiter, key and record is gone */
	if (mw->nkeys || __atomic_load_n(&mw->waiting, __ATOMIC_RELAXED))
		srv_err("match waits: %u keys and %" PRIu64 " waiters left at exit", mw->nkeys,
			__atomic_load_n(&mw->waiting, __ATOMIC_RELAXED));
	pthread_mutex_destroy(&mw->lock);
	free(mw->kb);
	free(mw);
}

uint64_t srv_mwait_waiting(const struct srv_mwait *mw)
{
	return mw ? __atomic_load_n(&mw->waiting, __ATOMIC_RELAXED) : 0;
}

uint64_t srv_mwait_bytes(const struct srv_mwait *mw)
{
	return mw ? __atomic_load_n(&mw->bytes, __ATOMIC_RELAXED) : 0;
}

/* ---- the hook ---------------------------------------------------------------- */

void srv_mwait_hook(struct srv_mwait *mw, const struct store_event *e)
{
	struct srv_worker *wake[256];
	uint32_t nwake = 0;
	uint64_t now;

	if (!mw || e->announce)
		return;
	/* Pairs with the worker's count-then-look (mw_park): both are
	 * read-modify-writes of `waiting`, so one comes first; if ours, the
	 * worker's reads it and sees this commit when it looks, else we see
	 * its count and take the lock, under which it links or has linked. */
	if (!__atomic_fetch_add(&mw->waiting, 0, __ATOMIC_SEQ_CST))
		return;
	if (e->kind != STORE_EVENT_STORED && e->kind != STORE_EVENT_CLEARED)
		return;
	now = srv_now_us();
	pthread_mutex_lock(&mw->lock);
	if (e->kind == STORE_EVENT_STORED) {
		uint64_t h = key_hash(e->ns_id, e->key);
		struct mw_key *k = key_find(mw, e->ns_id, e->key, h);

		if (k) {
			key_unlink(mw, k);
			key_wake(k, now, wake, &nwake, 256);
			free(k);
		}
	} else {
		struct mw_ns *n = ns_find(mw, e->ns_id);

		if (n) {
			n->drop_gen++;
			while (n->keys) {
				struct mw_key *k = n->keys;

				key_unlink(mw, k);
				key_wake(k, now, wake, &nwake, 256);
				free(k);
			}
		}
	}
	pthread_mutex_unlock(&mw->lock);
	for (uint32_t i = 0; i < nwake; i++)
		srv_worker_wake(wake[i]);
}

/* ---- waiters (worker thread) ------------------------------------------------ */

static struct srv_mwait *mw_of(const struct srv_conn *c)
{
	return c->w->srv->mwait;
}

/* Queue c for an answer pass of its worker (its queue's head is ready). */
static void conn_list(struct srv_conn *c)
{
	struct srv_worker *w = c->w;

	if (c->mw_listed || c->mw_in_cycle)
		return;
	c->mw_listed = 1;
	c->mw_ready_next = w->mw_ready;
	w->mw_ready = c;
}

static void conn_unlist(struct srv_conn *c)
{
	struct srv_conn **pp;

	if (!c->mw_listed)
		return;
	for (pp = &c->w->mw_ready; *pp && *pp != c; pp = &(*pp)->mw_ready_next)
		;
	if (*pp)
		*pp = c->mw_ready_next;
	c->mw_listed = 0;
}

/* The memory a parked MATCH holds: its record and its keys (what
 * max_match_wait_bytes bounds). */
static uint64_t mw_bytes(const struct srv_mw *m)
{
	return sizeof(*m) + (uint64_t)m->count * STORE_KEY_BYTES;
}

/* m stops waiting: out of the index, its counts and its timer released. */
static void mw_unpark(struct srv_mw *m)
{
	struct srv_mwait *mw = mw_of(m->c);

	if (m->timer_on) {
		evtimer_del(&m->timer);
		m->timer_on = 0;
	}
	if (!m->parked)
		return;
	pthread_mutex_lock(&mw->lock);
	index_unlink(mw, m);
	ns_put(mw, m->ns);
	m->ns = NULL;
	if (m->tenant)
		tenant_put(mw, m->tenant);
	m->tenant = NULL;
	__atomic_store_n(&mw->bytes, mw->bytes - mw_bytes(m), __ATOMIC_RELAXED);
	pthread_mutex_unlock(&mw->lock);
	__atomic_fetch_sub(&mw->waiting, 1, __ATOMIC_RELAXED);
	m->c->mw_waiting--;
	m->parked = 0;
}

/* m is to be answered (why: enum mw_end). */
static void mw_ready(struct srv_mw *m, int why)
{
	mw_unpark(m);
	m->state = MW_READY;
	m->end = (uint8_t)why;
	if (m->c->mw_head == m)
		conn_list(m->c);
}

/* Leading keys of m present now, looked up from `from`. */
static uint32_t mw_probe(const struct srv_mw *m, uint32_t from, uint32_t upto)
{
	uint32_t n = 0;

	if (from >= upto)
		return upto;
	store_present(m->c->w->srv->store, m->ns_id,
		      (const uint8_t(*)[STORE_KEY_BYTES])m->keys[from], upto - from, &n);
	return from + n;
}

/* Look again how far m's run has got; answer it (ready) when it has
 * `want` keys, else park it under its first missing key. m is not linked
 * in the index. */
static void mw_advance(struct srv_mw *m)
{
	struct srv_mwait *mw = mw_of(m->c);
	struct spares sp = { 0 };

	for (;;) {
		uint32_t from = m->present;

		m->present = mw_probe(m, from, m->want);
		if (m->present >= m->want && from > 0)
			/* the keys before `from` were seen earlier: a DELETE
			 * or an eviction may have taken some since */
			m->present = mw_probe(m, 0, m->want);
		if (m->present >= m->want) {
			mw_ready(m, END_COMPLETE);
			break;
		}
		if (spares_get(&sp) < 0) {
			/* no memory to park it: answer what there is */
			mw_ready(m, END_TIMEOUT);
			break;
		}
		pthread_mutex_lock(&mw->lock);
		if (m->ns->drop_gen != m->drop_gen) {
			pthread_mutex_unlock(&mw->lock);
			mw_ready(m, END_ENDED);
			break;
		}
		index_link(mw, m, &sp);
		pthread_mutex_unlock(&mw->lock);
		/* the lost wake-up: did the key commit before we linked? */
		if (mw_probe(m, m->present, m->present + 1) == m->present)
			break; /* parked */
		pthread_mutex_lock(&mw->lock);
		index_unlink(mw, m);
		pthread_mutex_unlock(&mw->lock);
	}
	spares_free(&sp);
}

static void mw_timer_cb(evutil_socket_t fd, short what, void *arg);

/* Count m as waiting and take its namespace record and tenant count.
 * Returns 0, or -EDQUOT (the token's tenant_max_match_waits is reached:
 * nothing taken), -ENOBUFS (the server's max_match_wait_bytes would be
 * passed: nothing taken), -ENOMEM. */
static int mw_park(struct srv_mw *m, uint32_t tenant_max, uint64_t bytes_max)
{
	struct srv_conn *c = m->c;
	struct srv_mwait *mw = mw_of(c);
	struct mw_ns *n_new = malloc(sizeof(*n_new));
	struct mw_tenant *t_new = tenant_max ? malloc(sizeof(*t_new)) : NULL;
	struct mw_tenant *t = NULL;
	struct mw_ns *n;
	int rc = 0;

	pthread_mutex_lock(&mw->lock);
	if (bytes_max && mw->bytes + mw_bytes(m) > bytes_max) {
		rc = -ENOBUFS;
		goto out;
	}
	if (tenant_max) {
		t = tenant_find(mw, c->token_digest);
		if (t && t->count >= tenant_max) {
			rc = -EDQUOT;
			goto out;
		}
		if (!t && !t_new) {
			rc = -ENOMEM;
			goto out;
		}
	}
	n = ns_find(mw, m->ns_id);
	if (!n) {
		if (!n_new) {
			rc = -ENOMEM;
			goto out;
		}
		n = n_new;
		n_new = NULL;
		memset(n, 0, sizeof(*n));
		n->ns_id = m->ns_id;
		n->hnext = mw->nsb[m->ns_id % NS_BUCKETS];
		mw->nsb[m->ns_id % NS_BUCKETS] = n;
	}
	n->refs++;
	m->ns = n;
	m->drop_gen = n->drop_gen;
	if (tenant_max) {
		if (!t) {
			t = t_new;
			t_new = NULL;
			memcpy(t->digest, c->token_digest, 32);
			t->count = 0;
			t->next = mw->tb[t->digest[0] % TENANT_BUCKETS];
			mw->tb[t->digest[0] % TENANT_BUCKETS] = t;
		}
		t->count++;
		m->tenant = t;
	}
	__atomic_store_n(&mw->bytes, mw->bytes + mw_bytes(m), __ATOMIC_RELAXED);
out:
	pthread_mutex_unlock(&mw->lock);
	free(n_new);
	free(t_new);
	if (rc)
		return rc;
	m->parked = 1;
	c->mw_waiting++;
	/* before the first look in the index: pairs with the hook's fence */
	__atomic_fetch_add(&mw->waiting, 1, __ATOMIC_SEQ_CST);
	return 0;
}

/* Answer m (the head of its connection's queue, ready) and free it.
 * Returns 0, or -ENOMEM (the connection must close). */
static int mw_answer(struct srv_conn *c, struct srv_mw *m)
{
	struct srv_stats *ss = &c->w->stats;
	struct srv_match_req r = {
		.keys = (const uint8_t(*)[PROTO_KEY_BYTES])m->keys,
		.count = m->count,
		.lease_ms = m->lease_ms,
		.wait_ms = m->wait_ms,
		.want = m->want,
		.retain_ms = m->retain_ms,
		.flags = m->flags,
		.version = m->version,
	};
	struct proto_header saved = c->hdr;
	uint64_t saved_start = c->req_start_us;
	uint32_t saved_have = c->body_have;
	uint64_t saved_skip = c->skip_bytes;
	enum srv_next next;

	/* a wait that timed out behind an earlier MATCH may have been
	 * completed before its turn came */
	if (m->end == END_TIMEOUT && mw_probe(m, 0, m->want) >= m->want) {
		m->end = END_COMPLETE;
		m->woken_us = 0; /* not a wake-up's doing */
	}
	if (m->indexed_once)
		r.flags |= PROTO_MATCH_WAITED;
	switch (m->end) {
	case END_TIMEOUT:
		r.flags |= PROTO_MATCH_WAIT_TIMEOUT;
		srv_stats_add(ss, SRV_C_match_waits_timeout, 1);
		break;
	case END_ENDED:
		r.flags |= PROTO_MATCH_WAIT_ENDED;
		srv_stats_add(ss, SRV_C_match_waits_ended, 1);
		break;
	case END_COMPLETE:
		if (m->indexed_once)
			srv_stats_add(ss, SRV_C_match_waits_complete, 1);
		break;
	default:
		break;
	}
	/* the reply echoes m's request; the request being read (if any)
	 * gets its header back. No body of m's is at hand: an error reply
	 * quotes none. */
	c->hdr = m->hdr;
	c->req_start_us = m->start_us;
	c->body_have = 0;
	/* a reload that revoked the token while it waited: DENIED, with no
	 * answer and no lease (the request path checks only new requests) */
	if (!srv_request_auth_recheck(c, &next))
		next = srv_match_answer(c, &r);
	c->hdr = saved;
	c->req_start_us = saved_start;
	c->body_have = saved_have;
	c->skip_bytes = saved_skip;
	if (m->end == END_COMPLETE && m->woken_us)
		srv_hist_record(&ss->match_wake, srv_now_us() - m->woken_us);
	return next == SRV_NEXT_ABORT ? -ENOMEM : 0;
}

/* Pop and answer the ready MATCHes at the head of c's queue. in_cycle:
 * called by the handler of the request in hand (the transport sends
 * what is queued when the handler returns); otherwise send it now, and
 * once the queue is empty, handle the request held behind it. May close
 * c when not in_cycle. Returns -1 when c must close (in_cycle), else 0. */
static int conn_answer(struct srv_conn *c, bool in_cycle)
{
	struct srv_mw *m;
	int held;

	while ((m = c->mw_head) && m->state == MW_READY) {
		c->mw_head = m->qnext;
		if (!c->mw_head)
			c->mw_tail = NULL;
		c->mw_count--;
		if (mw_answer(c, m) < 0) {
			free(m);
			if (in_cycle)
				return -1;
			srv_conn_close(c, SRV_LOG_WARN, "aborted: out of memory");
			return 0;
		}
		free(m);
	}
	if (in_cycle)
		return 0;
	if (c->mw_head) {
		c->ops->kick(c);
		return 0;
	}
	held = c->mw_held;
	c->mw_held = HELD_NONE;
	if (held == HELD_HEADER) {
		c->frame_start_ms = srv_now_ms(); /* its deadline starts now */
		c->ops->resume(c);
	} else if (held == HELD_FRAME) {
		srv_conn_request_done(c, srv_conn_body_done(c));
	} else if (!c->ops->kick) {
		/* the connection parked with its MATCH (SRV_NEXT_WAIT) */
		srv_conn_request_done(c, SRV_NEXT_HEADER);
	} else {
		c->ops->kick(c);
	}
	return 0;
}

/* Answer every connection listed on w. */
static void answer_listed(struct srv_worker *w)
{
	struct srv_conn *c;

	while ((c = w->mw_ready)) {
		w->mw_ready = c->mw_ready_next;
		c->mw_listed = 0;
		conn_answer(c, false);
	}
}

static void mw_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_mw *m = arg;
	struct srv_worker *w = m->c->w;

	(void)fd;
	(void)what;
	m->timer_on = 0;
	if (m->state != MW_WAITING)
		return;
	m->woken_us = 0;
	/* wait_ms passed: answered with what is present; a run completed
	 * in the meantime (its wake-up not handled yet) is complete */
	mw_ready(m, mw_probe(m, 0, m->want) >= m->want ? END_COMPLETE : END_TIMEOUT);
	answer_listed(w);
}

/* A limit, read atomically: SIGHUP may change it. */
static uint32_t conf_u32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* Leading keys of request r present now, up to `upto` (c's namespace). */
static uint32_t mw_probe_keys(const struct srv_conn *c, const struct srv_match_req *r,
			      uint32_t upto)
{
	uint32_t n = 0;

	store_present(c->w->srv->store, c->ns_id, (const uint8_t(*)[STORE_KEY_BYTES])r->keys,
		      upto, &n);
	return n;
}

/* Answer the MATCH in hand now (nothing queued before it), with `flags`
 * added to its reply's. */
static enum srv_next answer_now(struct srv_conn *c, const struct srv_match_req *r, uint32_t flags)
{
	struct srv_match_req now = *r;

	now.flags |= flags;
	return srv_match_answer(c, &now);
}

enum srv_next srv_mwait_match(struct srv_conn *c, const struct srv_match_req *r)
{
	struct srv_worker *w = c->w;
	struct srv *s = w->srv;
	struct srv_stats *ss = &w->stats;
	uint32_t want = r->want && r->want <= r->count ? r->want : r->count;
	uint32_t wait_ms = r->wait_ms, flags = 0, present = 0;
	uint32_t conn_max = conf_u32(&s->conf.max_conn_match_waits);
	uint32_t tenant_max = s->auth ? conf_u32(&s->conf.tenant_max_match_waits) : 0;
	uint64_t bytes_max = __atomic_load_n(&s->conf.max_match_wait_bytes, __ATOMIC_RELAXED);
	bool queued = c->mw_count != 0;
	int why = END_NONE;
	struct srv_mw *m;
	struct timeval tv;
	char msg[160];

	/* wait_ms is already cut to max_match_wait_ms (srv_match_decode) */
	if (r->flags & PROTO_MATCH_WAIT_CLAMPED)
		srv_stats_add(ss, SRV_C_match_waits_clamped, 1);
	if (!wait_ms && !queued)
		return srv_match_answer(c, r);
	if (wait_ms) {
		/* a waiting MATCH creates its namespace, as a PUT would, so
		 * that the PUTs it waits for land where it looks */
		if (!c->ns_id) {
			uint32_t id;
			bool made = store_namespace_find(s->store, c->ns_name, strlen(c->ns_name),
							 &id) == -ENOENT;

			if (srv_conn_ns_create(c, msg, sizeof(msg)) != PROTO_STATUS_OK) {
				srv_debug("conn %" PRIu64 " %s: match not parked: %s", c->id,
					  c->peer, msg);
				why = END_REFUSED;
			} else if (made) {
				/* nobody has put to it yet (a consumer, possibly a
				 * read-only token, waiting for its producer): it goes
				 * with this connection if it is still empty then */
				c->ns_made_by_wait = 1;
			}
		}
		if (why == END_NONE && !queued) {
			present = mw_probe_keys(c, r, want);
			if (present >= want)
				return srv_match_answer(c, r);
		}
		if (why == END_NONE && w->mw_draining)
			why = END_ENDED;
		else if (why == END_NONE && conn_max && c->mw_waiting >= conn_max)
			why = END_REFUSED;
	}
	if (why == END_REFUSED) {
		flags |= PROTO_MATCH_WAIT_REFUSED;
		srv_stats_add(ss, SRV_C_match_waits_refused, 1);
	}
	if (why == END_ENDED)
		srv_stats_add(ss, SRV_C_match_waits_ended, 1);
	if (why != END_NONE && !queued)
		return answer_now(c, r, flags | (why == END_ENDED ? PROTO_MATCH_WAIT_ENDED : 0));
	m = calloc(1, sizeof(*m) + (size_t)r->count * STORE_KEY_BYTES);
	if (!m)
		return SRV_NEXT_ABORT;
	memcpy(m->keys, r->keys, (size_t)r->count * STORE_KEY_BYTES);
	m->c = c;
	m->hdr = c->hdr;
	m->version = r->version;
	m->start_us = c->req_start_us;
	m->ns_id = c->ns_id;
	m->count = r->count;
	m->want = want;
	m->lease_ms = r->lease_ms;
	m->wait_ms = wait_ms;
	m->retain_ms = r->retain_ms;
	m->flags = r->flags | flags;
	m->present = present;
	m->state = MW_QUEUED;
	if (c->mw_tail)
		c->mw_tail->qnext = m;
	else
		c->mw_head = m;
	c->mw_tail = m;
	c->mw_count++;
	c->mw_in_cycle = 1;
	if (why == END_ENDED) {
		m->flags |= PROTO_MATCH_WAIT_ENDED;
		mw_ready(m, END_NONE);
	} else if (why != END_NONE || !wait_ms) {
		mw_ready(m, END_NONE);
	} else {
		int rc = mw_park(m, tenant_max, bytes_max);

		if (rc == -EDQUOT || rc == -ENOBUFS) {
			if (rc == -ENOBUFS)
				srv_stats_add(ss, SRV_C_match_waits_refused_bytes, 1);
			m->flags |= PROTO_MATCH_WAIT_REFUSED;
			srv_stats_add(ss, SRV_C_match_waits_refused, 1);
			mw_ready(m, END_NONE);
		} else if (rc < 0) {
			mw_ready(m, END_NONE); /* no memory to wait: answered as is */
		} else {
			m->state = MW_WAITING;
			event_assign(&m->timer, w->base, -1, 0, mw_timer_cb, m);
			tv.tv_sec = wait_ms / 1000;
			tv.tv_usec = (wait_ms % 1000) * 1000;
			if (evtimer_add(&m->timer, &tv) == 0)
				m->timer_on = 1;
			mw_advance(m);
			if (m->indexed_once)
				srv_stats_add(ss, SRV_C_match_waits_started, 1);
		}
	}
	c->mw_in_cycle = 0;
	if (conn_answer(c, true) < 0)
		return SRV_NEXT_ABORT;
	if (!c->mw_count || c->ops->kick)
		return SRV_NEXT_HEADER;
	return SRV_NEXT_WAIT;
}

bool srv_mwait_hold_header(struct srv_conn *c)
{
	const struct srv *s = c->w->srv;
	uint32_t conn_max = conf_u32(&s->conf.max_conn_match_waits);
	struct proto_header h;

	if (!c->mw_count)
		return false;
	/* a well-formed MATCH header goes on (its body is read, and it is
	 * queued) while the queue has room; anything else waits its turn,
	 * so that even an error reply leaves in request order */
	if (c->ops->kick && c->mw_count < conn_max + QUEUE_SLACK &&
	    proto_header_decode(c->hdr_raw, 0, &s->limits, &h) == 0 &&
	    h.opcode == PROTO_OP_MATCH && h.body_bytes &&
	    h.body_bytes <= srv_conn_body_max_v(h.opcode, h.version, &s->limits))
		return false;
	c->mw_held = HELD_HEADER;
	return true;
}

enum srv_next srv_mwait_hold_frame(struct srv_conn *c)
{
	c->mw_held = HELD_FRAME;
	return SRV_NEXT_WAIT;
}

void srv_mwait_conn_free(struct srv_conn *c)
{
	struct srv_mw *m, *next;

	conn_unlist(c);
	for (m = c->mw_head; m; m = next) {
		next = m->qnext;
		mw_unpark(m);
		free(m);
	}
	c->mw_head = c->mw_tail = NULL;
	c->mw_count = 0;
	c->mw_held = HELD_NONE;
}

void srv_mwait_worker_run(struct srv_worker *w)
{
	struct srv_mwait *mw = w->srv->mwait;
	struct srv_mw *list = NULL, *m, *next;
	struct mw_sub *sub, *snext;

	if (!mw)
		return;
	pthread_mutex_lock(&mw->lock);
	sub = w->mw_woken;
	w->mw_woken = NULL;
	for (; sub; sub = snext) {
		snext = sub->knext;
		for (m = sub->head; m; m = next) {
			next = m->next;
			m->sub = NULL;
			m->prev = NULL;
			m->woken_us = sub->stored_us;
			m->next = list;
			list = m;
		}
		free(sub);
	}
	pthread_mutex_unlock(&mw->lock);
	/* first every waiter (none is answered, so none is freed), then the
	 * answers, which may close connections */
	for (m = list; m; m = next) {
		next = m->next;
		m->next = NULL;
		if (m->state == MW_WAITING)
			mw_advance(m);
	}
	answer_listed(w);
}

/* End every waiting MATCH of c (WAIT_ENDED). */
static void conn_end_waits(struct srv_conn *c)
{
	for (struct srv_mw *m = c->mw_head; m; m = m->qnext)
		if (m->state == MW_WAITING)
			mw_ready(m, END_ENDED);
}

void srv_mwait_worker_drain(struct srv_worker *w)
{
	w->mw_draining = 1;
	for (struct srv_conn *c = w->conns; c; c = c->next)
		conn_end_waits(c);
	answer_listed(w);
}

void srv_mwait_worker_recheck(struct srv_worker *w)
{
	struct srv_auth *a = w->srv->auth;

	if (!a)
		return;
	for (struct srv_conn *c = w->conns; c; c = c->next) {
		enum srv_access was = c->may_write ? SRV_ACCESS_RW : SRV_ACCESS_RO;

		if (!c->mw_waiting)
			continue;
		if (srv_auth_access(a, c->token_digest, c->ns_name, strlen(c->ns_name)) == was)
			continue;
		srv_debug("conn %" PRIu64 " %s: its token's grant of namespace %s changed: its "
			  "%u waiting matches are answered now", c->id, c->peer, c->ns_name,
			  c->mw_waiting);
		conn_end_waits(c);
	}
	answer_listed(w);
}
