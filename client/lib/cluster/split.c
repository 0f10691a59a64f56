/*
 * split.c - how each call of a cluster handle splits into node children
 * and how their results merge back (cluster_impl.h).
 *
 * Split. Each block or key is placed (placement.h) and the call's entries
 * are grouped by owner: one child per owner, in the call's order. A PUT
 * block that starts a run on its owner goes there with no parent. A
 * MATCH sends each node the concatenation of its runs of the chain, in
 * chain order: the node's leading run over that concatenation says which
 * of its runs are whole and where the first short one stops, which is all
 * the chain needs (its leading run ends at the first short run). Whole-pool
 * calls (STATS, PING, DROP_NAMESPACE, limits, connect) have a child on
 * every member.
 *
 * Merge. A child's statuses go to the parent's entries; a node that could
 * not be reached costs misses (GET, EXISTS, DELETE: -ENOENT; MATCH: a
 * short run) or a dropped PUT share (status 0), any other share error is
 * the status of its every entry (cluster_impl.h, Failures).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "lib/clock.h"

/* The chain's leading run from per-run counts run[]; *stop receives the
 * first short run (n_runs when none). */
static size_t leading(const struct kvcl_parent *p, const size_t *run, size_t *stop)
{
	size_t total = 0;

	*stop = p->n_runs;
	for (size_t u = 0; u < p->n_runs; u++) {
		total += run[u];
		if (run[u] < p->run_len[u]) {
			*stop = u;
			break;
		}
	}
	return total;
}

void kvcl_match_finish_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	struct kvpool_match_result *m = &p->res.match;
	size_t stop, stop_p, stop_r;

	m->matched = leading(p, p->run_m, &stop);
	m->present = leading(p, p->run_p, &stop_p);
	m->retained = leading(p, p->run_r, &stop_r);
	if (!m->matched)
		m->lease_ms = 0;
	if (p->r.mres)
		*p->r.mres = *m;
	/* A node leases the leading run of what it was asked, which can reach
	 * past the chain's first short run (held runs after a missing one).
	 * Nobody will GET those; their leases run their term: no request ends
	 * a lease but a GET that returns the block (a GET that asks for no
	 * bytes is a size query, which keeps it: PROTOCOL.md 6.3). */
	(void)cl;
}

/* Spread a node's leading run m over its runs of the chain, in order,
 * into run[]. */
static void match_spread(struct kvcl_parent *p, const struct kvcl_child *c, size_t m, size_t *run)
{
	for (size_t k = 0; k < c->n; k++) {
		size_t u = c->perm[k], len = p->run_len[u];

		run[u] = m < len ? m : len;
		m = run[u] < len ? 0 : m - len;
	}
}

/* A node's MATCH answer into the chain's: leading runs per run, the flags
 * of every node, the smallest lease and retention granted. */
static void match_merge(struct kvcl_parent *p, const struct kvcl_child *c, int ok)
{
	const struct kvpool_match_result *r = &c->res.match;
	struct kvpool_match_result *m = &p->res.match;

	match_spread(p, c, ok ? r->matched : 0, p->run_m);
	match_spread(p, c, ok ? r->present : 0, p->run_p);
	match_spread(p, c, ok ? r->retained : 0, p->run_r);
	if (!ok)
		return;
	m->flags |= r->flags;
	if (r->lease_ms && (!m->lease_ms || r->lease_ms < m->lease_ms))
		m->lease_ms = r->lease_ms;
	if (r->retain_ms && (!m->retain_ms || r->retain_ms < m->retain_ms))
		m->retain_ms = r->retain_ms;
}

void kvcl_child_merge_locked(struct kvcl *cl, struct kvcl_child *c)
{
	struct kvcl_parent *p = c->p;
	struct kvcl_node *n = c->node;
	int s = c->res.status, conn = kvcl_is_conn_error(s), op;

	(void)cl;
	if (!p)
		return;
	op = p->r.op;
	n->calls++;
	if (conn)
		n->errors++;
	if (!p->cancelled && c->res.msg && !p->res.msg) {
		p->res.msg = c->res.msg;
		c->res.msg = NULL;
	}
	if (!p->cancelled && s && !conn && !p->share_err && op != KVPOOL_OP_PUT &&
	    op != KVPOOL_OP_GET)
		p->share_err = s;
	if (p->cancelled || !kvcl_is_batch(op))
		goto out;
	if (conn && op == KVPOOL_OP_PUT)
		n->puts_dropped += c->n;
	else if (conn && op != KVPOOL_OP_MATCH)
		n->misses_from_errors += c->n;
	if (op == KVPOOL_OP_MATCH) {
		match_merge(p, c, !s);
		goto out;
	}
	for (size_t k = 0; k < c->n; k++) {
		size_t i = c->perm[k];
		int st = conn ? (op == KVPOOL_OP_PUT ? 0 : -ENOENT) : c->st[k];

		if (p->st)
			p->st[i] = st;
		if (op == KVPOOL_OP_PUT && p->r.flags)
			p->r.flags[i] = conn ? 0 : c->r.flags[k];
		if (op == KVPOOL_OP_GET && (st == 0 || st == -EMSGSIZE))
			p->r.get[i].length = c->r.get[k].length;
	}
out:
	if (--p->pending == 0)
		kvcl_parent_complete_locked(cl, p);
}

/* ---- split ------------------------------------------------------------------------- */

/* Children for entries whose owners are own[0..count) (-1: none), one per
 * owner, each with `each` bytes of scratch per entry after its perm and
 * statuses; their perm lists their entries in call order. Returns 0 or
 * -ENOMEM (children made so far stay on p and are posted as they are:
 * the caller fails p). */
static int group(struct kvcl_parent *p, const int *own, size_t count, size_t each,
		 struct kvcl_child **by_node)
{
	size_t cnt[KVCL_MAX_NODES] = { 0 };

	for (size_t i = 0; i < count; i++)
		if (own[i] >= 0)
			cnt[own[i]]++;
	for (size_t j = 0; j < p->view.n; j++) {
		struct kvcl_child *c;

		by_node[j] = NULL;
		if (!cnt[j])
			continue;
		c = kvcl_child_new(p, p->view.node[j], cnt[j] * (sizeof(size_t) + sizeof(int) + each) + 8);
		if (!c)
			return -ENOMEM;
		c->perm = (size_t *)(c + 1);
		c->st = (int *)(c->perm + cnt[j]);
		c->r.statuses = c->st;
		by_node[j] = c;
	}
	for (size_t i = 0; i < count; i++) {
		struct kvcl_child *c = own[i] >= 0 ? by_node[own[i]] : NULL;

		if (c)
			c->perm[c->n++] = i;
	}
	return 0;
}

/* Where a child's per-entry scratch starts (after perm and statuses). */
static void *child_entries(struct kvcl_child *c, size_t count)
{
	return (uint8_t *)(c->st + count) + (8 - ((uintptr_t)(c->st + count) & 7)) % 8;
}

static int split_put(struct kvcl *cl, struct kvcl_parent *p, int *own)
{
	struct kvcl_child *by[KVCL_MAX_NODES];
	const struct kvpool_put_block *blocks = p->r.put;
	size_t count = p->r.count;
	unsigned char *starts = (unsigned char *)(own + count);
	int rc;

	for (size_t i = 0; i < count; i++) {
		struct kvcl_loc loc;

		own[i] = -1;
		p->st[i] = 0;
		if (kvcl_place_put(&cl->place, blocks[i].key, blocks[i].parent, &loc)) {
			p->st[i] = -ENOLINK; /* unplaced: its parent's place is unknown */
			continue;
		}
		starts[i] = (unsigned char)kvcl_place_starts_run(&cl->place, &loc);
		own[i] = kvcl_place_owner(&cl->place, &p->view, &loc); /* -1: no node, dropped */
	}
	rc = group(p, own, count, sizeof(struct kvpool_put_block) + sizeof(uint32_t), by);
	for (size_t j = 0; j < p->view.n && !rc; j++) {
		struct kvcl_child *c = by[j];
		struct kvpool_put_block *pb;

		if (!c)
			continue;
		pb = child_entries(c, c->n);
		c->r.flags = (uint32_t *)(pb + c->n);
		for (size_t k = 0; k < c->n; k++) {
			pb[k] = blocks[c->perm[k]];
			if (starts[c->perm[k]])
				pb[k].parent = NULL; /* a run's first block: no parent on its owner */
		}
		c->r.put = pb;
		c->r.count = c->n;
	}
	return rc;
}

static int split_get(struct kvcl *cl, struct kvcl_parent *p, int *own)
{
	struct kvcl_child *by[KVCL_MAX_NODES];
	size_t count = p->r.count;
	int rc;

	for (size_t i = 0; i < count; i++) {
		struct kvcl_loc loc;

		own[i] = -1;
		p->st[i] = -ENOENT; /* unplaced, or no node: a miss */
		if (p->view.n && kvcl_place_find(&cl->place, p->r.get[i].key, &loc) == 0)
			own[i] = kvcl_place_owner(&cl->place, &p->view, &loc);
	}
	rc = group(p, own, count, sizeof(struct kvpool_get_block), by);
	for (size_t j = 0; j < p->view.n && !rc; j++) {
		struct kvcl_child *c = by[j];
		struct kvpool_get_block *gb;

		if (!c)
			continue;
		gb = child_entries(c, c->n);
		for (size_t k = 0; k < c->n; k++) {
			gb[k] = p->r.get[c->perm[k]];
			gb[k].length = 0;
		}
		c->r.get = gb;
		c->r.count = c->n;
	}
	return rc;
}

/* EXISTS and DELETE: keys by owner. */
static int split_keys(struct kvcl *cl, struct kvcl_parent *p, int *own)
{
	struct kvcl_child *by[KVCL_MAX_NODES];
	size_t count = p->r.count;
	int rc;

	for (size_t i = 0; i < count; i++) {
		struct kvcl_loc loc;

		own[i] = -1;
		if (p->st)
			p->st[i] = -ENOENT;
		if (p->view.n && kvcl_place_find(&cl->place, p->r.keys[i], &loc) == 0)
			own[i] = kvcl_place_owner(&cl->place, &p->view, &loc);
	}
	rc = group(p, own, count, KVPOOL_KEY_BYTES, by);
	for (size_t j = 0; j < p->view.n && !rc; j++) {
		struct kvcl_child *c = by[j];
		uint8_t (*kb)[KVPOOL_KEY_BYTES];

		if (!c)
			continue;
		kb = child_entries(c, c->n);
		for (size_t k = 0; k < c->n; k++)
			memcpy(kb[k], p->r.keys[c->perm[k]], KVPOOL_KEY_BYTES);
		c->r.keys = (const uint8_t(*)[KVPOOL_KEY_BYTES])kb;
		c->r.count = c->n;
	}
	return rc;
}

/* MATCH: the chain's runs by owner; each node gets its runs' keys
 * concatenated in chain order. */
static int split_match(struct kvcl *cl, struct kvcl_parent *p)
{
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = p->r.keys;
	struct kvcl_child *by[KVCL_MAX_NODES];
	size_t count = p->r.count, keys[KVCL_MAX_NODES] = { 0 };
	size_t want = p->r.mopts.want ? p->r.mopts.want : count;
	int rc;

	kvcl_place_learn_chain(&cl->place, chain, count);
	p->n_runs = 0;
	for (size_t i = 0; i < count; i++) {
		struct kvcl_loc loc;

		kvcl_place_chain_loc(&cl->place, chain, i, &loc);
		if (i == 0 || kvcl_place_starts_run(&cl->place, &loc)) {
			size_t u = p->n_runs++;

			p->run_at[u] = i;
			p->run_len[u] = 0;
			p->run_m[u] = p->run_p[u] = p->run_r[u] = 0;
			p->run_own[u] = kvcl_place_owner(&cl->place, &p->view, &loc);
		}
		p->run_len[p->n_runs - 1]++;
	}
	for (size_t u = 0; u < p->n_runs; u++)
		if (p->run_own[u] >= 0)
			keys[p->run_own[u]] += p->run_len[u];
	/* Runs are the entries of the grouping; keys go after (sized per node). */
	for (size_t j = 0; j < p->view.n; j++) {
		by[j] = NULL;
		if (!keys[j])
			continue;
		by[j] = kvcl_child_new(p, p->view.node[j],
				       p->n_runs * sizeof(size_t) + 8 + keys[j] * KVPOOL_KEY_BYTES);
		if (!by[j])
			return -ENOMEM;
		by[j]->perm = (size_t *)(by[j] + 1);
		by[j]->r.keys = (const uint8_t(*)[KVPOOL_KEY_BYTES])(by[j]->perm + p->n_runs + 1);
		by[j]->r.mopts.want = 0; /* set below: this node's share */
	}
	rc = 0;
	for (size_t u = 0; u < p->n_runs; u++) {
		struct kvcl_child *c = p->run_own[u] >= 0 ? by[p->run_own[u]] : NULL;

		if (!c)
			continue;
		memcpy((uint8_t(*)[KVPOOL_KEY_BYTES])c->r.keys + c->r.count, chain[p->run_at[u]],
		       p->run_len[u] * KVPOOL_KEY_BYTES);
		c->r.count += p->run_len[u];
		c->perm[c->n++] = u;
		/* its share of want: its keys among the chain's first `want` */
		if (p->run_at[u] < want)
			c->r.mopts.want += (uint32_t)(want - p->run_at[u] < p->run_len[u] ?
						      want - p->run_at[u] : p->run_len[u]);
	}
	for (size_t j = 0; j < p->view.n; j++)
		if (by[j] && !by[j]->r.mopts.want)
			by[j]->r.mopts.wait_ms = 0; /* nothing of it is wanted: no wait */
	return rc;
}

/* Whole-pool calls: a child on every member. */
static int split_all(struct kvcl_parent *p)
{
	for (size_t j = 0; j < p->view.n; j++)
		if (!kvcl_child_new(p, p->view.node[j], 0))
			return -ENOMEM;
	return 0;
}

/* Make parent p's children and post them; complete it at once when it
 * needs none. On -ENOMEM, p is failed (its statuses say so). */
int kvcl_split_post_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	int op = p->r.op, rc;

	kvcl_view_take_locked(cl, &p->view);
	switch (op) {
	case KVPOOL_OP_PUT:
		rc = split_put(cl, p, (int *)p->run_own);
		break;
	case KVPOOL_OP_GET:
		rc = split_get(cl, p, (int *)p->run_own);
		break;
	case KVPOOL_OP_EXISTS:
	case KVPOOL_OP_DELETE:
		rc = split_keys(cl, p, (int *)p->run_own);
		break;
	case KVPOOL_OP_MATCH:
		rc = split_match(cl, p);
		break;
	default:
		rc = split_all(p);
		break;
	}
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

/* ---- the backend ------------------------------------------------------------------------ */

/* Whole-pool results: what the nodes said, put together. */
static int finish_drop(const struct kvcl_parent *p, struct kvc_result *res)
{
	size_t ok = 0, n = 0;
	int err = 0;

	res->u64 = 0;
	for (const struct kvcl_child *c = p->children; c; c = c->sibling, n++) {
		int s = c->res.status == -ENOENT ? 0 : c->res.status; /* never held it: nothing */

		if (s == 0) {
			ok++;
			res->u64 += c->res.status ? 0 : c->res.u64;
		} else if (!err || (kvcl_is_conn_error(err) && !kvcl_is_conn_error(s))) {
			err = s;
		}
	}
	if (err && !kvcl_is_conn_error(err))
		return err; /* e.g. -EACCES: the same on every node */
	return ok || !n ? 0 : err;
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
		return finish_drop(p, res);
	case KVC_OP_PING:
		return finish_limits(p, res, 1);
	default:
		return finish_limits(p, res, 0);
	}
}
