/*
 * split.c - how each call of a cluster handle splits into node children
 * and how their results merge back (cluster_impl.h; docs/cluster.md).
 *
 * Placement is per block (placement.h): a block's owner is the first
 * usable node of its key's ranking, a hot block's the first R. Every
 * block is stored with no parent on its node.
 *
 * PUT sends each block to each of its owners; a share that cannot reach
 * its node goes to the next node by score (once). A block no node took
 * is -EHOSTDOWN, never "stored".
 *
 * GET and EXISTS ask one place per block first - its owner, a hot
 * block's replica chosen per request (rotating), then the other replicas
 * and, in a fallback epoch, its previous owners - and ask the next place
 * in a further round of the same call when the first says missing or
 * cannot answer within the budget. A block read from a place that is not
 * an owner that said missing is copied to that owner in the background.
 *
 * MATCH sends each node, in one round, the chain's keys only that node
 * holds (in chain order; its leading run is exact for the chain: the
 * chain cannot go past the node's first missing key) and, in a second
 * request of the same round, the keys that may be elsewhere too (hot
 * blocks at every replica, moved keys at new and previous owners), so a
 * gap among those cannot hide the node's other keys; that request is an
 * EXISTS (each key answered on its own, so a gap among those keys cannot
 * hide the ones after it either), a MATCH only when the call extends
 * retention. A key is present
 * where a run covers it; the chain's match is its first key no run
 * covers. Leases are taken on the first request only (the blocks a GET
 * will fetch from their one owner); a lease a node took past the chain's
 * end runs its term (only a GET that returns a block's bytes ends a
 * lease: PROTOCOL.md 6.3). Waiting (v2 wait_ms/want) is asked of the first
 * requests, each node for its own keys among the chain's first `want`.
 *
 * DELETE goes everywhere a block may be (its first R ranked members,
 * usable or not, and its previous owners); a node that cannot be reached
 * keeps it as a removal finished when the node is back (-EINPROGRESS).
 * Whole-pool calls (STATS, PING, DROP_NAMESPACE, limits, connect) have a
 * child on every member.
 *
 * MATCH and GET children have a deadline of the call's budget
 * (KVCL_DEFAULT_BUDGET_MS; a waiting MATCH adds its wait): a node that
 * does not answer in time costs its share as misses and is down from
 * then on (nodes.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "lib/clock.h"

#define BIT(j) (1ull << (j))

/* A block and a node to send it to. */
struct pair {
	size_t i;
	uint8_t j;
	uint8_t amb;
};

/* A growing list of pairs (one per block in the common case). */
struct pairs {
	struct pair *v;
	size_t n, cap;
	int err;
};

static void push(struct pairs *pv, size_t i, size_t j, int amb)
{
	if (pv->n == pv->cap) {
		size_t cap = pv->cap ? pv->cap * 2 : 16;
		struct pair *v = realloc(pv->v, cap * sizeof(*v));

		if (!v) {
			pv->err = -ENOMEM;
			return;
		}
		pv->v = v;
		pv->cap = cap;
	}
	pv->v[pv->n++] = (struct pair){ .i = i, .j = (uint8_t)j, .amb = (uint8_t)amb };
}

static void copy_locked(struct kvcl *cl, struct kvcl_parent *p, size_t i, int from);
static void copy_matched_locked(struct kvcl *cl, struct kvcl_parent *p);

/* ---- children --------------------------------------------------------------------- */

/* Where a child's per-entry scratch starts (after perm and statuses). */
static void *child_entries(struct kvcl_child *c, size_t count)
{
	return (uint8_t *)(c->st + count) + (8 - ((uintptr_t)(c->st + count) & 7)) % 8;
}

/* Bytes of scratch a child needs per entry, for op. */
static size_t entry_bytes(int op)
{
	switch (op) {
	case KVPOOL_OP_PUT:
		return sizeof(struct kvpool_put_block) + sizeof(uint32_t);
	case KVPOOL_OP_GET:
		return sizeof(struct kvpool_get_block);
	default:
		return KVPOOL_KEY_BYTES;
	}
}

/* The deadline of a MATCH or GET share: the budget. */
static void set_budget(const struct kvcl *cl, struct kvcl_child *c, uint32_t extra_ms)
{
	uint64_t d;

	if (!cl->budget_ms || (c->r.op != KVPOOL_OP_MATCH && c->r.op != KVPOOL_OP_GET))
		return;
	d = kvc_now_ms() + cl->budget_ms + extra_ms;
	if (d < c->r.deadline_ms)
		c->r.deadline_ms = d;
}

/* Make the children for pairs pr[0..n) (grouped by node and kind, in
 * order) and, when post, queue them. Errors: -ENOMEM (children made so
 * far stay on p). */
static int post_pairs(struct kvcl *cl, struct kvcl_parent *p, const struct pair *pr, size_t n,
		      int post)
{
	size_t cnt[KVCL_MAX_NODES][2] = { { 0 } }, each = entry_bytes(p->r.op);
	struct kvcl_child *by[KVCL_MAX_NODES][2] = { { NULL } };
	size_t want = p->r.mopts.want ? p->r.mopts.want : p->r.count;

	for (size_t k = 0; k < n; k++)
		cnt[pr[k].j][pr[k].amb]++;
	for (size_t j = 0; j < p->view.n; j++)
		for (int a = 0; a < 2; a++) {
			struct kvcl_child *c;

			if (!cnt[j][a])
				continue;
			c = kvcl_child_new(p, p->view.node[j], cnt[j][a] * (sizeof(size_t) +
						   sizeof(int) + each) + 16);
			if (!c)
				return -ENOMEM;
			c->vj = (int)j;
			c->amb = a;
			c->perm = (size_t *)(c + 1);
			c->st = (int *)(c->perm + cnt[j][a]);
			c->r.statuses = c->st;
			by[j][a] = c;
			if (p->r.op == KVPOOL_OP_MATCH) {
				c->r.mopts.want = 0; /* set below: this node's share */
				if (a) {
					/* elsewhere too: no lease (the GET reads one
					 * place), no waiting for a copy that may never
					 * come */
					c->r.mopts.lease_ms = 0;
					c->r.mopts.wait_ms = 0;
					/* and asked as EXISTS, each key answered on
					 * its own: a MATCH's run would stop at the
					 * node's first gap among them, and a previous
					 * owner lacks every block put since the change
					 * - which hid the keys after it for the whole
					 * epoch. A MATCH that extends retention keeps
					 * asking MATCH (EXISTS retains nothing). */
					if (!p->r.mopts.retain_ms)
						c->r.op = KVPOOL_OP_EXISTS;
				}
			}
		}
	for (size_t k = 0; k < n; k++) {
		struct kvcl_child *c = by[pr[k].j][pr[k].amb];
		size_t i = pr[k].i, at = c->n++;
		void *ents = child_entries(c, cnt[pr[k].j][pr[k].amb]);

		c->perm[at] = i;
		p->ent[i].asked |= BIT(pr[k].j);
		switch (p->r.op) {
		case KVPOOL_OP_PUT: {
			struct kvpool_put_block *pb = ents;

			pb[at] = p->r.put[i];
			pb[at].parent = NULL; /* every block is a root on its node */
			break;
		}
		case KVPOOL_OP_GET: {
			struct kvpool_get_block *gb = ents;

			gb[at] = p->r.get[i];
			gb[at].length = 0;
			break;
		}
		default:
			memcpy((uint8_t *)ents + at * KVPOOL_KEY_BYTES, p->r.keys[i], KVPOOL_KEY_BYTES);
			break;
		}
		if (p->r.op == KVPOOL_OP_MATCH && !pr[k].amb && i < want)
			c->r.mopts.want++;
	}
	for (size_t j = 0; j < p->view.n; j++)
		for (int a = 0; a < 2; a++) {
			struct kvcl_child *c = by[j][a];
			void *ents;

			if (!c)
				continue;
			ents = child_entries(c, c->n);
			c->r.count = c->n;
			switch (p->r.op) {
			case KVPOOL_OP_PUT:
				c->r.put = ents;
				c->r.flags = (uint32_t *)((struct kvpool_put_block *)ents + c->n);
				break;
			case KVPOOL_OP_GET:
				c->r.get = ents;
				break;
			default:
				c->r.keys = ents;
				break;
			}
			if (p->r.op == KVPOOL_OP_MATCH) {
				if (!c->r.mopts.want)
					c->r.mopts.wait_ms = 0; /* nothing of it is wanted */
				else if (c->r.mopts.want == c->n)
					c->r.mopts.want = 0;    /* all of it: the default */
			}
			set_budget(cl, c, p->r.op == KVPOOL_OP_MATCH ? c->r.mopts.wait_ms : 0);
			if (post)
				kvcl_node_post_locked(c);
		}
	return 0;
}

/* ---- placement of one entry --------------------------------------------------------- */

/* Owners now (and, in a fallback epoch, previous owners) of key into e. */
static void place_entry(struct kvcl *cl, struct kvcl_parent *p, struct kvcl_entry *e,
			const uint8_t *key, int hot)
{
	size_t own[KVCL_MAX_REPLICAS], prev[KVCL_MAX_NODES], n_own, n_prev;

	e->cov = e->covp = e->covr = e->missed = e->asked = 0;
	e->st = 0;
	e->pending_removal = 0;
	e->hot = (uint8_t)hot;
	n_own = kvcl_place_owners(&cl->place, &p->view, key, hot, own);
	n_prev = kvcl_place_prev_owners(&cl->place, &p->view, key, hot, own, n_own, prev);
	e->moved = n_prev > 0;
	e->n_own = (uint8_t)n_own;
	for (size_t r = 0; r < n_own; r++)
		e->own[r] = (uint8_t)own[r];
	/* where to read it, in order: a hot block's owners from the one this
	 * request reads (rotating), then its previous owners */
	e->n_alt = 0;
	for (size_t r = 0; r < n_own && e->n_alt < KVCL_MAX_ALT; r++)
		e->alt[e->n_alt++] = (uint8_t)own[(r + p->id) % n_own];
	for (size_t r = 0; r < n_prev && e->n_alt < KVCL_MAX_ALT; r++)
		e->alt[e->n_alt++] = (uint8_t)prev[r];
	e->next_alt = 0;
}

/* Is view index j among e's owners now? */
static int is_owner(const struct kvcl_entry *e, size_t j)
{
	for (size_t r = 0; r < e->n_own; r++)
		if (e->own[r] == j)
			return 1;
	return 0;
}

/* The first member of key's ranking not asked yet and not down: where a
 * share that could not reach its node goes next. -1 when none. */
static int next_member(const struct kvcl_parent *p, const struct kvcl_entry *e, const uint8_t *key)
{
	size_t rank[KVCL_MAX_NODES], n = kvcl_place_ranked(&p->view, key, p->view.n, rank);

	for (size_t r = 0; r < n; r++)
		if (!(e->asked & BIT(rank[r])) && !p->view.node[rank[r]]->down)
			return (int)rank[r];
	return -1;
}

static const uint8_t *entry_key(const struct kvcl_parent *p, size_t i)
{
	switch (p->r.op) {
	case KVPOOL_OP_PUT:
		return p->r.put[i].key;
	case KVPOOL_OP_GET:
		return p->r.get[i].key;
	default:
		return p->r.keys[i];
	}
}

/* ---- split ---------------------------------------------------------------------------- */

static int split_put(struct kvcl *cl, struct kvcl_parent *p, struct pairs *pv)
{

	for (size_t i = 0; i < p->r.count; i++) {
		struct kvcl_entry *e = &p->ent[i];
		const uint8_t *key = p->r.put[i].key;
		size_t first;

		place_entry(cl, p, e, key, kvcl_hot_is(&cl->place.hot, key));
		e->st = 1; /* no owner has answered yet */
		if (!e->n_own) {
			cl->puts_nowhere++;
			e->st = -EHOSTDOWN;
			continue;
		}
		/* its first member is down: the block goes to the next one */
		if (kvcl_place_ranked(&p->view, key, 1, &first) && first != e->own[0]) {
			cl->redirected_puts++;
			p->view.node[e->own[0]]->puts_redirected++;
		}
		for (size_t r = 0; r < e->n_own; r++)
			push(pv, i, e->own[r], 0);
	}
	return pv->err ? pv->err : post_pairs(cl, p, pv->v, pv->n, 0);
}

/* GET and EXISTS: the first place of each block. */
static int split_read(struct kvcl *cl, struct kvcl_parent *p, struct pairs *pv)
{

	for (size_t i = 0; i < p->r.count; i++) {
		struct kvcl_entry *e = &p->ent[i];
		const uint8_t *key = entry_key(p, i);

		place_entry(cl, p, e, key, kvcl_hot_is(&cl->place.hot, key));
		e->st = -ENOENT; /* no node: a miss */
		if (!e->n_alt)
			continue;
		push(pv, i, e->alt[e->next_alt++], 0);
	}
	return pv->err ? pv->err : post_pairs(cl, p, pv->v, pv->n, 0);
}

static int split_delete(struct kvcl *cl, struct kvcl_parent *p, struct pairs *pv)
{

	for (size_t i = 0; i < p->r.count; i++) {
		struct kvcl_entry *e = &p->ent[i];
		const uint8_t *key = p->r.keys[i];
		size_t where[KVCL_MAX_REPLICAS * 3], k = 0, ranked[KVCL_MAX_REPLICAS];
		size_t m = kvcl_place_ranked(&p->view, key, cl->place.replicas, ranked);

		place_entry(cl, p, e, key, 1);
		e->st = -ENOENT;
		/* everywhere it may be: its first R members, up or not, its
		 * owners now (a redirect may have put it there) and before */
		for (size_t r = 0; r < m; r++)
			where[k++] = ranked[r];
		for (size_t r = 0; r < e->n_alt; r++)
			where[k++] = e->alt[r];
		for (size_t a = 0; a < k; a++) {
			int dup = 0;

			for (size_t b = 0; b < a; b++)
				dup |= where[b] == where[a];
			if (dup)
				continue;
			if (!p->view.up[where[a]]) {
				/* down: keep it for when the node is back */
				kvcl_removal_add_locked(cl, p->view.node[where[a]], KVPOOL_OP_DELETE, NULL,
							(const uint8_t(*)[KVPOOL_KEY_BYTES])key, 1);
				e->pending_removal = 1;
				continue;
			}
			push(pv, i, where[a], 0);
		}
	}
	return pv->err ? pv->err : post_pairs(cl, p, pv->v, pv->n, 0);
}

static int split_match(struct kvcl *cl, struct kvcl_parent *p, struct pairs *pv)
{
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = p->r.keys;

	p->hot_prefix = kvcl_hot_learn(&cl->place.hot, chain, p->r.count);
	for (size_t i = 0; i < p->r.count; i++) {
		struct kvcl_entry *e = &p->ent[i];

		place_entry(cl, p, e, chain[i], i < p->hot_prefix);
		if (!e->hot && !e->moved) {
			if (e->n_own)
				push(pv, i, e->own[0], 0);
			continue;
		}
		for (size_t r = 0; r < e->n_alt; r++)
			push(pv, i, e->alt[r], 1);
	}
	return pv->err ? pv->err : post_pairs(cl, p, pv->v, pv->n, 0);
}

/* Whole-pool calls: a child on every member. A PING or STATS share has
 * the probe's bound (the budget, at least KVCL_PROBE_MIN_MS): a health
 * check must not wait a whole timeout for a stopped node. */
static int split_all(struct kvcl *cl, struct kvcl_parent *p)
{
	uint32_t bound = cl->budget_ms > KVCL_PROBE_MIN_MS ? cl->budget_ms : KVCL_PROBE_MIN_MS;

	for (size_t j = 0; j < p->view.n; j++) {
		struct kvcl_child *c = kvcl_child_new(p, p->view.node[j], 0);

		if (!c)
			return -ENOMEM;
		c->vj = (int)j;
		if ((p->r.op == KVC_OP_PING || p->r.op == KVC_OP_STATS) && cl->budget_ms &&
		    kvc_now_ms() + bound < c->r.deadline_ms)
			c->r.deadline_ms = kvc_now_ms() + bound;
	}
	return 0;
}

int kvcl_split_post_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	int op = p->r.op, rc = 0;
	struct pairs pv = { 0 };

	kvcl_view_take_locked(cl, &p->view);
	kvcl_place_observe(&cl->place, &p->view, kvc_now_ms());
	if (kvcl_is_batch(op) && p->r.count) {
		pv.cap = p->r.count + 16;
		pv.v = malloc(pv.cap * sizeof(*pv.v));
		if (!pv.v)
			rc = -ENOMEM;
	}
	if (!rc) {
		switch (op) {
		case KVPOOL_OP_PUT:
			rc = split_put(cl, p, &pv);
			break;
		case KVPOOL_OP_GET:
		case KVPOOL_OP_EXISTS:
			rc = split_read(cl, p, &pv);
			break;
		case KVPOOL_OP_DELETE:
			rc = split_delete(cl, p, &pv);
			break;
		case KVPOOL_OP_MATCH:
			rc = split_match(cl, p, &pv);
			break;
		default:
			rc = split_all(cl, p);
			break;
		}
	}
	free(pv.v);
	if (rc) {
		/* Children not posted yet: count them as done, with the error. */
		for (struct kvcl_child *c = p->children; c; c = c->sibling) {
			c->state = CH_DONE;
			p->holds--;
			p->pending--;
		}
		if (p->st && op != KVPOOL_OP_MATCH)
			for (size_t i = 0; i < p->r.count; i++)
				p->st[i] = rc;
		p->share_err = rc;
		p->res.status = rc;
	}
	for (struct kvcl_child *c = p->children; !rc && c; c = c->sibling)
		kvcl_node_post_locked(c);
	if (!p->pending)
		kvcl_parent_complete_locked(cl, p);
	if (rc)
		p->res.status = rc;
	return 0;
}

/* ---- merge ------------------------------------------------------------------------------ */

/* A node's MATCH answer: which of its keys its runs cover, which it said
 * missing, the flags of every node, the smallest lease and retention. */
static void merge_match(struct kvcl_parent *p, const struct kvcl_child *c, int ok)
{
	const struct kvpool_match_result *r = &c->res.match;
	struct kvpool_match_result *m = &p->res.match;
	size_t matched = ok ? r->matched : 0, present = ok ? r->present : 0;
	size_t retained = ok ? r->retained : 0;
	uint64_t bit = BIT(c->vj);

	if (c->r.op == KVPOOL_OP_EXISTS) {
		/* a second request asked as EXISTS (post_pairs): per key */
		for (size_t k = 0; k < c->n && ok; k++) {
			struct kvcl_entry *e = &p->ent[c->perm[k]];

			if (c->st[k] == 0)
				e->cov |= bit, e->covp |= bit;
			else if (c->st[k] == -ENOENT)
				e->missed |= bit;
		}
		return;
	}
	if (present < matched)
		present = matched;
	for (size_t k = 0; k < c->n; k++) {
		struct kvcl_entry *e = &p->ent[c->perm[k]];

		if (k < matched)
			e->cov |= bit;
		if (k < present)
			e->covp |= bit;
		if (k < retained)
			e->covr |= bit;
		if (ok && k == present)
			e->missed |= bit;
	}
	if (!ok)
		return;
	m->flags |= r->flags;
	if (!c->amb && r->lease_ms && (!m->lease_ms || r->lease_ms < m->lease_ms))
		m->lease_ms = r->lease_ms;
	if (r->retain_ms && (!m->retain_ms || r->retain_ms < m->retain_ms))
		m->retain_ms = r->retain_ms;
}

static void merge_put(struct kvcl *cl, struct kvcl_parent *p, struct kvcl_child *c, int conn,
		      struct pair *retry, size_t *n_retry)
{
	for (size_t k = 0; k < c->n; k++) {
		size_t i = c->perm[k];
		struct kvcl_entry *e = &p->ent[i];
		int s = c->st[k];

		if (!conn) {
			if (s == 0 || e->st == 1 || e->st == -EHOSTDOWN)
				e->st = s;
			if (p->r.flags && (s == 0 || !p->r.flags[i]))
				p->r.flags[i] = c->r.flags[k];
			continue;
		}
		/* its node could not take it: the next one by score (once per node) */
		{
			int j = next_member(p, e, p->r.put[i].key);

			if (j >= 0) {
				retry[(*n_retry)++] = (struct pair){ .i = i, .j = (uint8_t)j };
				cl->redirected_puts++;
				p->view.node[j]->puts_redirected++;
			} else if (e->st == 1) {
				e->st = -EHOSTDOWN;
			}
		}
	}
}

static void merge_read(struct kvcl *cl, struct kvcl_parent *p, struct kvcl_child *c, int conn,
		       struct pair *retry, size_t *n_retry)
{
	int op = p->r.op;

	for (size_t k = 0; k < c->n; k++) {
		size_t i = c->perm[k];
		struct kvcl_entry *e = &p->ent[i];
		int s = conn ? -ENOENT : c->st[k];

		if (s == 0 || s == -EMSGSIZE) {
			e->st = s;
			if (op == KVPOOL_OP_GET)
				p->r.get[i].length = c->r.get[k].length;
			if (!is_owner(e, (size_t)c->vj)) {
				if (e->moved)
					cl->fallback_hits++;
				if (op == KVPOOL_OP_GET && s == 0)
					copy_locked(cl, p, i, c->vj);
			} else if (op == KVPOOL_OP_GET && s == 0 && (e->missed & ~BIT(c->vj))) {
				copy_locked(cl, p, i, c->vj); /* a replica said missing */
			}
			continue;
		}
		if (s != -ENOENT) {
			e->st = s; /* refused, bad request: as on one node */
			continue;
		}
		if (!conn)
			e->missed |= BIT(c->vj);
		/* not there (or no answer): the next place it may be */
		while (e->next_alt < e->n_alt && p->view.node[e->alt[e->next_alt]]->down)
			e->next_alt++;
		if (e->next_alt < e->n_alt)
			retry[(*n_retry)++] = (struct pair){ .i = i, .j = e->alt[e->next_alt++] };
	}
}

static void merge_delete(struct kvcl *cl, struct kvcl_parent *p, struct kvcl_child *c, int conn)
{
	if (conn) {
		kvcl_removal_add_locked(cl, c->node, KVPOOL_OP_DELETE, NULL, c->r.keys, c->n);
		for (size_t k = 0; k < c->n; k++)
			p->ent[c->perm[k]].pending_removal = 1;
		return;
	}
	for (size_t k = 0; k < c->n; k++) {
		struct kvcl_entry *e = &p->ent[c->perm[k]];
		int s = c->st[k];

		if (s == 0)
			e->st = 0;
		else if (s != -ENOENT && e->st == -ENOENT)
			e->st = s;
	}
}

/* Stop waiting for p's waiting MATCH children (cl->lock held; the caller
 * completes p when nothing is pending any more). A child parked at its
 * node is let go by the node's thread, which drops that connection once
 * only such children are on it (the node forgets a waiter whose client
 * left; a request sent behind a parked MATCH would wait for it); one
 * being submitted right now is let go by child_submit. */
static void end_waits_locked(struct kvcl_parent *p)
{
	p->wait_ended = 1;
	for (struct kvcl_child *c = p->children; c; c = c->sibling) {
		if (!c->r.mopts.wait_ms || c->state == CH_DONE)
			continue;
		if (c->state == CH_SUBMITTING) {
			c->ended = 1;
			continue;
		}
		if (c->state == CH_ENGINE)
			kvcl_node_ended_locked(c);
		c->state = CH_DONE;
		p->pending--;
	}
}

void kvcl_waits_follow_locked(struct kvcl *cl)
{
	struct kvcl_view *v = NULL;

	for (struct kvcl_parent *p = cl->parents, *next; p; p = next) {
		size_t want = p->r.mopts.want ? p->r.mopts.want : p->r.count, moved = 0;
		int waiting = 0;

		next = p->next;
		if (p->done || p->cancelled || p->wait_ended || p->r.op != KVPOOL_OP_MATCH ||
		    !p->r.mopts.wait_ms)
			continue;
		for (struct kvcl_child *c = p->children; c; c = c->sibling)
			waiting |= c->r.mopts.wait_ms && c->state != CH_DONE;
		if (!waiting)
			continue;
		if (!v) {
			v = malloc(sizeof(*v));
			if (!v)
				return;
			kvcl_view_take_locked(cl, v);
		}
		for (size_t i = 0; i < want && i < p->r.count && !moved; i++) {
			const struct kvcl_entry *e = &p->ent[i];
			size_t own[KVCL_MAX_REPLICAS], n;

			if (e->cov)
				continue;
			n = kvcl_place_owners(&cl->place, v, p->r.keys[i], e->hot, own);
			moved = !n || !e->n_own || v->node[own[0]] != p->view.node[e->own[0]];
		}
		if (!moved)
			continue;
		end_waits_locked(p);
		if (!p->pending)
			kvcl_parent_complete_locked(cl, p);
	}
	free(v);
}

void kvcl_child_merge_locked(struct kvcl *cl, struct kvcl_child *c)
{
	struct kvcl_parent *p = c->p;
	struct kvcl_node *n = c->node;
	int s = c->res.status, conn = kvcl_is_conn_error(s), op;
	struct pair *retry = NULL;
	size_t n_retry = 0;

	if (!p) {
		kvcl_job_done_locked(cl, c);
		return;
	}
	op = p->r.op;
	n->calls++;
	/* a share that failed as a whole (a miss or a block already stored is
	 * an answer, not an error) */
	if (conn || (s && s != -ENOENT && s != -EEXIST && s != -ECANCELED))
		n->errors++;
	if (!p->cancelled && c->res.msg && !p->res.msg) {
		/* the refusal's words, with the node that said them */
		size_t len = strlen(n->name) + strlen(c->res.msg) + 3;

		p->res.msg = malloc(len);
		if (p->res.msg)
			snprintf(p->res.msg, len, "%s: %s", n->name, c->res.msg);
	}
	if (!p->cancelled && s && !conn && !p->share_err && op != KVPOOL_OP_PUT &&
	    op != KVPOOL_OP_GET)
		p->share_err = s;
	if (p->cancelled || !kvcl_is_batch(op))
		goto out;
	if (conn && (op == KVPOOL_OP_GET || op == KVPOOL_OP_EXISTS))
		n->misses_from_errors += c->n;
	if (op == KVPOOL_OP_MATCH) {
		merge_match(p, c, !s);
		/* a node of the wait lost: its part never comes, so the others
		 * stop waiting too and the answer says the wait ended */
		if (s && c->r.mopts.wait_ms)
			end_waits_locked(p);
		goto out;
	}
	if (op == KVPOOL_OP_DELETE) {
		merge_delete(cl, p, c, conn);
		goto out;
	}
	retry = malloc(c->n * sizeof(*retry));
	if (!retry) {
		for (size_t k = 0; k < c->n && conn; k++)
			if (p->ent[c->perm[k]].st == 1)
				p->ent[c->perm[k]].st = op == KVPOOL_OP_PUT ? -EHOSTDOWN : -ENOENT;
		goto out;
	}
	if (op == KVPOOL_OP_PUT)
		merge_put(cl, p, c, conn, retry, &n_retry);
	else
		merge_read(cl, p, c, conn, retry, &n_retry);
	if (n_retry && post_pairs(cl, p, retry, n_retry, 1))
		for (size_t k = 0; k < n_retry; k++)
			if (p->ent[retry[k].i].st == 1)
				p->ent[retry[k].i].st = -ENOMEM;
	free(retry);
out:
	if (--p->pending == 0)
		kvcl_parent_complete_locked(cl, p);
}

/* ---- finish ------------------------------------------------------------------------------ */

void kvcl_match_finish_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	struct kvpool_match_result *m = &p->res.match;
	size_t count = p->r.count, i;
	uint64_t moved = 0, only_prev = 0;

	for (i = 0; i < count && p->ent[i].cov; i++) {
		struct kvcl_entry *e = &p->ent[i];
		uint64_t own = 0;

		for (size_t r = 0; r < e->n_own; r++)
			own |= BIT(e->own[r]);
		if (e->moved) {
			moved++;
			if (!(e->cov & own)) {
				only_prev++;
				cl->fallback_hits++;
			}
		}
	}
	m->matched = i;
	for (i = 0; i < count && p->ent[i].covp; i++)
		;
	m->present = i;
	for (i = 0; i < count && p->ent[i].covr; i++)
		;
	m->retained = i < m->matched ? i : m->matched;
	if (!m->matched)
		m->lease_ms = 0;
	/* as a single node answers (PROTOCOL.md 14.1): no retention granted
	 * over the leading run, no retain_ms, even where a node further
	 * along retained its own part */
	if (!m->retained)
		m->retain_ms = 0;
	/* short because a wait was ended (never only WAITED: that reads as
	 * complete) */
	if (p->wait_ended && m->matched < (p->r.mopts.want ? p->r.mopts.want : count))
		m->flags |= KVPOOL_MATCH_WAITED | KVPOOL_MATCH_WAIT_ENDED;
	kvcl_place_epoch_note(&cl->place, moved, only_prev);
	copy_matched_locked(cl, p);
	if (p->r.mres)
		*p->r.mres = *m;
}

/* PUT, GET, EXISTS, DELETE: each entry's status, the call's result. */
void kvcl_batch_finish_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	int first = 0, pending = 0;

	(void)cl;
	for (size_t i = 0; i < p->r.count; i++) {
		struct kvcl_entry *e = &p->ent[i];
		int st = e->st;

		if (p->r.op == KVPOOL_OP_PUT && st == 1)
			st = -EHOSTDOWN;
		if (p->r.op == KVPOOL_OP_DELETE && e->pending_removal) {
			st = -EINPROGRESS;
			pending = 1;
		}
		if (p->st)
			p->st[i] = st;
		if (st && !first)
			first = st;
	}
	if (p->r.op == KVPOOL_OP_PUT || p->r.op == KVPOOL_OP_GET)
		p->res.status = first;
	else if (pending && !p->share_err)
		p->share_err = -EINPROGRESS;
}

/* A node leases the leading run of what it was asked, which can reach
 * past the chain's end (held keys after a missing one). Nobody will GET
 * those, so their leases would pin blocks until they run out and crowd
 * the node's cache: end them now with a GET that asks for no bytes (each
 * answers -EMSGSIZE; a GET that finds a leased block ends its lease).
 * Best effort, detached. */
/* ---- background copies -------------------------------------------------------------------- */

/* A copy of block `key` from node `from` to node `to`, at `stage`: 0 asks
 * its size (a GET for no bytes), 1 its bytes (into buf, len), 2 PUTs them.
 * Bounded: KVCL_COPY_MAX copies and KVCL_COPY_MAX_BYTES in flight; what
 * does not fit is dropped (counted). Detached; the node threads carry it
 * on (kvcl_job_done_locked). */
static void copy_post_locked(struct kvcl *cl, struct kvcl_node *from, struct kvcl_node *to,
			     const uint8_t *key, uint8_t *buf, uint64_t len, int stage)
{
	struct kvcl_child *c;

	if (stage == 0 && (cl->copy_inflight >= KVCL_COPY_MAX || to->down || from->down)) {
		cl->copies_dropped++;
		return;
	}
	c = kvcl_child_new(NULL, stage == 2 ? to : from, 0);
	if (!c) {
		free(buf);
		cl->copies_dropped++;
		if (stage)
			cl->copy_inflight--;
		cl->copy_inflight_bytes -= stage ? len : 0;
		return;
	}
	if (stage == 0)
		cl->copy_inflight++;
	c->job = JOB_COPY;
	c->copy_to = to;
	c->copy_stage = stage;
	c->own_buf = buf;
	c->len = len;
	memcpy(c->copy_key, key, KVPOOL_KEY_BYTES);
	c->copy_iov = (struct iovec){ buf, stage ? len : 0 };
	c->st = &c->copy_st;
	c->r = (struct kvc_req){ .statuses = c->st, .count = 1, .tag = (uint64_t)(uintptr_t)c,
				 .deadline_ms = kvc_deadline_ms(cl->timeout_ms ?
					cl->timeout_ms : KVPOOL_DEFAULT_TIMEOUT_MS) };
	if (stage == 2) {
		c->copy_put = (struct kvpool_put_block){ .key = c->copy_key, .iov = &c->copy_iov,
							 .iovcnt = 1 };
		c->r.op = KVPOOL_OP_PUT;
		c->r.put = &c->copy_put;
		c->r.flags = &c->copy_flags;
	} else {
		c->copy_get = (struct kvpool_get_block){ .key = c->copy_key, .iov = &c->copy_iov,
							 .iovcnt = 1 };
		c->r.op = KVPOOL_OP_GET;
		c->r.get = &c->copy_get;
	}
	kvcl_node_post_locked(c);
}

/* Block i of GET p was read from view node `from`; its owners that said
 * missing get a copy of the bytes it returned. */
static void copy_locked(struct kvcl *cl, struct kvcl_parent *p, size_t i, int from)
{
	const struct kvpool_get_block *g = &p->r.get[i];
	struct kvcl_entry *e = &p->ent[i];
	uint64_t len = g->length;

	for (size_t r = 0; r < e->n_own; r++) {
		size_t to = e->own[r], off = 0;
		uint8_t *buf;

		if ((int)to == from || !(e->missed & BIT(to)) || p->view.node[to]->down)
			continue;
		if (cl->copy_inflight >= KVCL_COPY_MAX ||
		    cl->copy_inflight_bytes + len > KVCL_COPY_MAX_BYTES ||
		    !(buf = malloc(len ? len : 1))) {
			cl->copies_dropped++;
			continue;
		}
		for (int v = 0; v < g->iovcnt && off < len; v++) {
			size_t take = g->iov[v].iov_len < len - off ? g->iov[v].iov_len : len - off;

			memcpy(buf + off, g->iov[v].iov_base, take);
			off += take;
		}
		cl->copy_inflight++;
		cl->copy_inflight_bytes += len;
		e->missed &= ~BIT(to);
		copy_post_locked(cl, p->view.node[from], p->view.node[to], g->key, buf, len, 2);
	}
}

/* A MATCH found keys away from owners that said missing (a previous
 * owner, another replica): copy them there in the background. */
static void copy_matched_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	for (size_t i = 0; i < p->res.match.matched; i++) {
		struct kvcl_entry *e = &p->ent[i];
		int from = -1;

		if (!e->hot && !e->moved)
			continue;
		for (size_t j = 0; j < p->view.n && from < 0; j++)
			if (e->cov & BIT(j))
				from = (int)j;
		for (size_t r = 0; r < e->n_own && from >= 0; r++)
			if ((e->missed & BIT(e->own[r])) && !(e->cov & BIT(e->own[r])))
				copy_post_locked(cl, p->view.node[from], p->view.node[e->own[r]],
						 p->r.keys[i], NULL, 0, 0);
	}
}

void kvcl_job_done_locked(struct kvcl *cl, struct kvcl_child *c)
{
	int s = c->res.status;

	switch (c->job) {
	case JOB_COPY:
		if (c->copy_stage == 0 && s == -EMSGSIZE && c->copy_get.length &&
		    cl->copy_inflight_bytes + c->copy_get.length <= KVCL_COPY_MAX_BYTES) {
			uint64_t len = c->copy_get.length;
			uint8_t *buf = malloc(len);

			if (buf) {
				cl->copy_inflight_bytes += len;
				copy_post_locked(cl, c->node, c->copy_to, c->copy_key, buf, len, 1);
				break;
			}
		}
		if (c->copy_stage == 1 && s == 0 && c->copy_get.length == c->len) {
			copy_post_locked(cl, c->node, c->copy_to, c->copy_key, c->own_buf, c->len, 2);
			c->own_buf = NULL; /* the PUT has it now */
			break;
		}
		cl->copy_inflight--;
		cl->copy_inflight_bytes -= c->copy_stage ? c->len : 0;
		if (c->copy_stage == 2 && s == 0 && c->copy_st == 0) {
			cl->copies++;
			cl->copy_bytes += c->len;
		} else {
			cl->copies_dropped++;
		}
		break;
	case JOB_REMOVAL: {
		struct kvcl_removal *rm = c->removal, **pp = &cl->removals;

		rm->posted = 0;
		if (kvcl_is_conn_error(s))
			break; /* again when the node is back */
		while (*pp && *pp != rm)
			pp = &(*pp)->next;
		if (*pp)
			*pp = rm->next;
		free(rm->keys);
		free(rm);
		break;
	}
	default:
		break;
	}
}

/* ---- the backend ------------------------------------------------------------------------ */

/* Whole-pool results: what the nodes said, put together. A node that
 * could not be reached keeps the drop for when it is back: the call says
 * -EINPROGRESS (the nodes that answered have dropped it). */
static int finish_drop(struct kvcl *cl, const struct kvcl_parent *p, struct kvc_result *res)
{
	size_t ok = 0, n = 0, unreached = 0;
	int err = 0;

	res->u64 = 0;
	for (const struct kvcl_child *c = p->children; c; c = c->sibling, n++) {
		int s = c->res.status == -ENOENT ? 0 : c->res.status; /* never held it: nothing */

		if (s == 0) {
			ok++;
			res->u64 += c->res.status ? 0 : c->res.u64;
		} else if (kvcl_is_conn_error(s)) {
			pthread_mutex_lock(&cl->lock);
			kvcl_removal_add_locked(cl, c->node, KVC_OP_DROP, p->r.ns ? p->r.ns : cl->ns,
						NULL, 0);
			pthread_mutex_unlock(&cl->lock);
			unreached++;
		} else if (!err) {
			err = s;
		}
	}
	if (err)
		return err; /* e.g. -EACCES: the same on every node */
	if (unreached)
		return -EINPROGRESS;
	return ok || !n ? 0 : -EHOSTDOWN;
}

static int finish_limits(const struct kvcl_parent *p, struct kvc_result *res, int ping)
{
	struct kvpool_limits m = { 0 };
	int err = 0, first = 1;

	res->u64 = 0;
	for (const struct kvcl_child *c = p->children; c; c = c->sibling) {
		const struct kvpool_limits *l = &c->res.limits;

		if (c->res.status) {
			err = err ? err : c->res.status;
			continue;
		}
		if (ping) {
			res->u64 = c->res.u64 > res->u64 ? c->res.u64 : res->u64;
			first = 0;
			continue;
		}
		if (first) {
			m = *l;
			m.rdma_port = 0;
			first = 0;
			continue;
		}
		/* What every node accepts: the smallest of each limit. */
#define KVCL_MIN(f) (m.f = l->f < m.f ? l->f : m.f)
		KVCL_MIN(max_block_bytes);
		KVCL_MIN(max_batch_blocks);
		KVCL_MIN(max_frame_bytes);
		KVCL_MIN(max_lease_ms);
		KVCL_MIN(max_inflight_put_bytes);
		KVCL_MIN(protocol_version);
		KVCL_MIN(max_match_wait_ms);
		KVCL_MIN(max_retain_ms);
#undef KVCL_MIN
	}
	/* a ping is healthy only when every node answered */
	if (ping)
		return !p->view.n ? -EHOSTDOWN : err ? -EHOSTDOWN : 0;
	if (first)
		return p->view.n ? err : -ECONNREFUSED;
	res->limits = m;
	return 0;
}

int kvcl_finish_admin(struct kvcl *cl, struct kvcl_parent *p, struct kvc_result *res)
{
	switch (p->r.op) {
	case KVC_OP_STATS:
		return kvcl_stats_doc(cl, p, &res->json);
	case KVC_OP_DROP:
		return finish_drop(cl, p, res);
	case KVC_OP_PING:
		return finish_limits(p, res, 1);
	default:
		return finish_limits(p, res, 0);
	}
}
