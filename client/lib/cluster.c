/*
 * cluster.c - data calls of a cluster handle (see cluster.h and
 * docs/cluster.md).
 *
 * Placement. A chain is cut into segments of D blocks (segment k: blocks
 * k*D .. k*D+D-1); segment k lives on the member with the highest HRW
 * score for the key of its first block (hrw.c). A segment's first block
 * is stored with no parent on its owner, so each node keeps the no-holes
 * rule for what it holds.
 *
 * Chain positions. PUT, GET, EXISTS and DELETE name blocks by key only,
 * so the handle remembers, per key it has seen, its position in its chain
 * and the first key of its segment: a MATCH teaches it every key of the
 * chain (a MATCH is always given a chain from its first block), a PUT
 * every block it stores (a block with no parent is position 0; any other
 * is one past its parent). The table holds KVCL_POS_SLOTS entries (72
 * bytes each), KVCL_POS_WAYS-way set-associative, the oldest entry of a
 * set making room for a new key. A block whose position
 * the handle does not know cannot be placed: GET, EXISTS and DELETE answer
 * -ENOENT (a miss) for it and PUT -ENOLINK (its parent is not known), and
 * the stats count it ("unplaced_blocks"). Engines MATCH before they load
 * and store, so in practice every key is known.
 *
 * One round. Each call groups its blocks by owner and submits each
 * node's share on that node's handle with the asynchronous API
 * (kvpool_submit_put/_get/_exists/_delete), then polls every node until
 * all have completed (submit_round): the nodes are asked in parallel from
 * the caller's thread, one request in flight per node. MATCH
 * sends each node the concatenation of the segments it owns, in chain
 * order: the server's leading run over that concatenation says which of
 * them are whole and where the first short one stops, which is all the
 * chain needs (the leading run ends at the first short segment); it is
 * sent to every node before any reply is read (match_round). The
 * whole-pool calls (STATS, DROP_NAMESPACE, PING, limits, connect) run on
 * a thread per node (run_jobs).
 *
 * Failures. A node that cannot be reached (refused, reset, timed out) is
 * not an error: its share of a GET/EXISTS/DELETE is -ENOENT, of a MATCH
 * a short segment, and its share of a PUT is dropped (status 0: a cache
 * may lose a block; a later GET is a miss), counted per node. It is tried
 * again KVCL_RETRY_MS later, or as soon as etcd says it (re)joined.
 */
#include <errno.h>
#include <poll.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "cluster.h"
#include "hrw.h"

#define SHARE_SAMPLES 10000

struct kvcl_pos {
	uint8_t key[KVPOOL_KEY_BYTES];
	uint8_t seg[KVPOOL_KEY_BYTES];
	uint32_t pos;
	uint32_t stamp;          /* 0: empty; else when last written (newer is larger) */
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* ---- chain positions ------------------------------------------------------- */

/* The table is set-associative: KVCL_POS_WAYS entries per set, the
 * oldest written one replaced, so a key just learned survives the rest
 * of its call and the next ones. */
static struct kvcl_pos *pos_set(struct kvcl *cl, const uint8_t *key)
{
	size_t set = (le64(key) ^ le64(key + 8)) & (KVCL_POS_SLOTS / KVCL_POS_WAYS - 1);

	return &cl->pos[set * KVCL_POS_WAYS];
}

static void pos_put(struct kvcl *cl, const uint8_t *key, uint32_t pos, const uint8_t *seg)
{
	struct kvcl_pos *set = pos_set(cl, key), *p = &set[0];

	for (size_t w = 0; w < KVCL_POS_WAYS; w++) {
		if (set[w].stamp && memcmp(set[w].key, key, KVPOOL_KEY_BYTES) == 0) {
			p = &set[w];
			break;
		}
		if (set[w].stamp < p->stamp)
			p = &set[w];
	}
	if (++cl->pos_clock == 0) { /* wrapped: forget every age */
		for (size_t i = 0; i < KVCL_POS_SLOTS; i++)
			cl->pos[i].stamp = cl->pos[i].stamp ? 1 : 0;
		cl->pos_clock = 2;
	}
	memmove(p->seg, seg, KVPOOL_KEY_BYTES);
	memcpy(p->key, key, KVPOOL_KEY_BYTES);
	p->pos = pos;
	p->stamp = cl->pos_clock;
}

static const struct kvcl_pos *pos_get(struct kvcl *cl, const uint8_t *key)
{
	const struct kvcl_pos *set = pos_set(cl, key);

	for (size_t w = 0; w < KVCL_POS_WAYS; w++)
		if (set[w].stamp && memcmp(set[w].key, key, KVPOOL_KEY_BYTES) == 0)
			return &set[w];
	return NULL;
}

/* ---- the membership a call uses -------------------------------------------- */

struct view {
	struct kvcl_node *node[KVCL_MAX_NODES];
	uint64_t seed[KVCL_MAX_NODES];
	const char *name[KVCL_MAX_NODES];
	size_t n;
};

/* Copy the current members; close the handles of nodes that left. */
static void view_take(struct kvcl *cl, struct view *v)
{
	struct kvpool_client *gone[KVCL_MAX_NODES];
	size_t n_gone = 0;

	v->n = 0;
	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvcl_node *n = cl->nodes[i];

		if (n->member) {
			v->node[v->n] = n;
			v->seed[v->n] = n->seed;
			v->name[v->n] = n->name;
			v->n++;
		} else if (n->h) {
			gone[n_gone++] = n->h;
			n->h = NULL;
		}
	}
	pthread_mutex_unlock(&cl->lock);
	for (size_t i = 0; i < n_gone; i++)
		kvpool_close(gone[i]);
}

static int view_owner(const struct view *v, const uint8_t *seg_key)
{
	return kvc_hrw_owner(seg_key, v->seed, v->name, NULL, v->n);
}

/* ---- per-node work --------------------------------------------------------- */

enum part_op {
	PART_NONE, PART_CONNECT, PART_PUT, PART_GET, PART_EXISTS, PART_DELETE, PART_MATCH,
	PART_DROP, PART_STATS, PART_PING, PART_LIMITS,
};

/* One node's share of a call. */
struct part {
	enum part_op op;
	size_t n;
	struct kvpool_put_block *pb;
	struct kvpool_get_block *gb;
	const uint8_t *keys;        /* n keys */
	int *st;                    /* n statuses */
	uint32_t *flags;            /* PUT: n KVPOOL_PUT_* words, or NULL */
	uint32_t lease_ms;
	size_t matched;
	struct kvpool_match_opts mopts;   /* MATCH: this node's options */
	struct kvpool_match_result mres;  /* MATCH: this node's answer */
	const char *ns;
	uint64_t u64;               /* DROP blocks, PING rtt */
	char *json;                 /* STATS */
	struct kvpool_limits limits;
	int rc;                     /* whole-share result */
};

static int is_conn_error(int rc)
{
	return rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EPIPE || rc == -ETIMEDOUT ||
	       rc == -EPROTO || rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -ENOTCONN ||
	       rc == -ECONNABORTED || rc == -EOPNOTSUPP;
}

static void node_failed(struct kvcl_node *n, int rc)
{
	if (n->h) {
		kvpool_close(n->h);
		n->h = NULL;
	}
	n->reachable = 0;
	n->last_error = rc;
	n->retry_at_ms = now_ms() + KVCL_RETRY_MS;
}

/* Make sure the node has a connected handle (node thread or caller). */
static int node_ready(struct kvcl *cl, struct kvcl_node *n)
{
	struct kvpool_options o = { .token = cl->token, .timeout_ms = cl->timeout_ms };
	char url[sizeof(n->url)];
	int changed, rc;

	pthread_mutex_lock(&cl->lock);
	memcpy(url, n->url, sizeof(url));
	changed = n->url_changed;
	n->url_changed = 0;
	pthread_mutex_unlock(&cl->lock);
	if (changed && n->h) {
		kvpool_close(n->h);
		n->h = NULL;
		n->retry_at_ms = 0;
	}
	if (n->h)
		return 0;
	if (now_ms() < n->retry_at_ms)
		return n->last_error ? n->last_error : -ECONNREFUSED;
	rc = kvpool_connect(url, cl->ns, &o, &n->h);
	if (rc) {
		n->h = NULL;
		node_failed(n, rc);
		return rc;
	}
	kvpool_set_busy_tries(n->h, cl->busy_tries);
	n->reachable = 1;
	n->last_error = 0;
	return 0;
}

static int part_run(struct kvcl *cl, struct kvcl_node *n, void *arg)
{
	struct part *p = arg;
	int rc = node_ready(cl, n);

	if (rc)
		return p->rc = rc;
	switch (p->op) {
	case PART_PUT:
		rc = kvpool_put(n->h, p->pb, p->n, p->st);
		break;
	case PART_GET:
		rc = kvpool_get(n->h, p->gb, p->n, p->st);
		break;
	case PART_EXISTS:
		rc = kvpool_exists(n->h, p->keys, p->n, p->st);
		break;
	case PART_DELETE:
		rc = kvpool_delete(n->h, p->keys, p->n, p->st);
		break;
	case PART_MATCH:
		rc = kvpool_match_ex(n->h, p->keys, p->n, &p->mopts, &p->mres);
		p->matched = rc ? 0 : p->mres.matched;
		break;
	case PART_DROP:
		rc = kvpool_drop_namespace(n->h, p->ns, &p->u64);
		break;
	case PART_STATS:
		rc = kvpool_stats(n->h, p->ns, &p->json);
		break;
	case PART_PING:
		rc = kvpool_ping(n->h, &p->u64);
		break;
	case PART_LIMITS:
		rc = kvpool_get_limits(n->h, &p->limits);
		break;
	case PART_NONE:
	case PART_CONNECT:
		rc = 0;
		break;
	}
	if (is_conn_error(rc))
		node_failed(n, rc);
	return p->rc = rc;
}

/* The data calls' round on the asynchronous API (kvpool_submit_*,
 * kvpool_poll): submit every node's part, then poll every node until each
 * has completed - one thread, one request in flight per node, no thread
 * hand-off. A part that cannot be submitted (node unreachable) keeps its
 * error in rc, like a failed synchronous call. */
static void submit_round(struct kvcl *cl, const struct view *v, struct part *parts)
{
	struct pollfd pfd[KVCL_MAX_NODES];
	unsigned char pending[KVCL_MAX_NODES] = { 0 };
	size_t left = 0;

	for (size_t j = 0; j < v->n; j++) {
		struct part *p = &parts[j];
		struct kvcl_node *n = v->node[j];
		uint64_t id = 0;
		int rc;

		if (p->op == PART_NONE)
			continue;
		n->calls++;
		rc = node_ready(cl, n);
		if (rc == 0) {
			switch (p->op) {
			case PART_PUT:
				rc = kvpool_submit_put_ex(n->h, p->pb, p->n, p->st, p->flags, j, &id);
				break;
			case PART_GET:
				rc = kvpool_submit_get(n->h, p->gb, p->n, p->st, j, &id);
				break;
			case PART_EXISTS:
				rc = kvpool_submit_exists(n->h, p->keys, p->n, p->st, j, &id);
				break;
			default:
				rc = kvpool_submit_delete(n->h, p->keys, p->n, p->st, j, &id);
				break;
			}
		}
		if (rc) {
			p->rc = rc;
			if (is_conn_error(rc))
				node_failed(n, rc);
			continue;
		}
		pending[j] = 1;
		left++;
	}
	while (left) {
		nfds_t k = 0;

		for (size_t j = 0; j < v->n; j++) {
			struct kvpool_completion comp;

			if (!pending[j])
				continue;
			if (kvpool_poll(v->node[j]->h, &comp, 1, 0) == 1) {
				parts[j].rc = comp.status;
				pending[j] = 0;
				left--;
				if (is_conn_error(comp.status))
					node_failed(v->node[j], comp.status);
				continue;
			}
			pfd[k].fd = kvpool_event_fd(v->node[j]->h);
			pfd[k].events = POLLIN;
			k++;
		}
		if (left)
			poll(pfd, k, 100);
	}
}

/* Run parts[i] on v->node[i] for every i with parts[i].op set: all but
 * one on their node threads, one on this thread, and wait for all. */
static void run_jobs(struct kvcl *cl, const struct view *v, struct part *parts)
{
	int inline_i = -1;

	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < v->n; i++) {
		if (parts[i].op == PART_NONE)
			continue;
		if (inline_i < 0) {
			inline_i = (int)i;
			continue;
		}
		v->node[i]->job = part_run;
		v->node[i]->job_arg = &parts[i];
		cl->jobs_pending++;
	}
	if (cl->jobs_pending)
		pthread_cond_broadcast(&cl->job_cond);
	pthread_mutex_unlock(&cl->lock);
	if (inline_i >= 0)
		part_run(cl, v->node[inline_i], &parts[inline_i]);
	pthread_mutex_lock(&cl->lock);
	while (cl->jobs_pending)
		pthread_cond_wait(&cl->done_cond, &cl->lock);
	pthread_mutex_unlock(&cl->lock);
	for (size_t i = 0; i < v->n; i++)
		if (parts[i].op != PART_NONE)
			v->node[i]->calls++;
}

/* Scratch memory for one call (reused between calls). */
static void *scratch(struct kvcl *cl, size_t bytes)
{
	if (bytes > cl->scratch_bytes) {
		void *p = realloc(cl->scratch, bytes);

		if (!p)
			return NULL;
		cl->scratch = p;
		cl->scratch_bytes = bytes;
	}
	return cl->scratch;
}

/* Group item i (owner own[i], -1 = unplaced) by owner: perm[] lists the
 * items node by node, in their order; start[j], cnt[j] per node. */
static void group(const int *own, size_t count, size_t n_nodes, size_t *perm, size_t *start,
		  size_t *cnt)
{
	size_t fill[KVCL_MAX_NODES];

	memset(cnt, 0, n_nodes * sizeof(*cnt));
	for (size_t i = 0; i < count; i++)
		if (own[i] >= 0)
			cnt[own[i]]++;
	for (size_t j = 0, s = 0; j < n_nodes; j++) {
		start[j] = s;
		fill[j] = s;
		s += cnt[j];
	}
	for (size_t i = 0; i < count; i++)
		if (own[i] >= 0)
			perm[fill[own[i]]++] = i;
}

/* ---- MATCH ------------------------------------------------------------------ */

/* MATCH in two halves on one node's handle, so that a call sends to every
 * node before it waits for any (one request in flight per node; no thread
 * hand-off on this path, which is what a MATCH's latency is made of).
 * match_send: -E2BIG when the keys need more than one frame (the caller
 * then uses the node's thread and kvpool_match). */
static int match_send(struct kvcl *cl, struct kvcl_node *n, const struct part *p,
		      uint64_t *deadline_ms, uint64_t *id)
{
	struct kvpool_client *h;
	struct proto_match_opts o;
	struct iovec iov[2];
	size_t body;
	int rc = node_ready(cl, n);

	if (rc)
		return rc;
	h = n->h;
	rc = kvc_begin(h, deadline_ms);
	if (rc)
		return rc;
	if (p->n > kvc_match_chunk(h))
		return -E2BIG;
	o = kvc_match_frame_opts(0, (uint32_t)p->n, p->mopts.want, p->mopts.wait_ms,
				 p->mopts.retain_ms);
	if (kvc_version(h) >= PROTO_VERSION_2)
		*deadline_ms += o.wait_ms; /* the node may wait that much longer */
	rc = kvc_match_encode(h, p->keys, p->n, p->lease_ms, &o, &body);
	if (rc)
		return rc;
	*id = kvc_next_request_id(h);
	return kvc_send_request(h, PROTO_OP_MATCH, *id, h->wbuf, body, iov, 2, 0, *deadline_ms);
}

static int match_recv(struct kvpool_client *h, uint64_t id, uint64_t deadline_ms,
		      struct part *p)
{
	struct proto_match_reply m;
	struct kvc_reply r;
	int rc = kvc_recv_reply(h, PROTO_OP_MATCH, id, deadline_ms, &r);

	if (rc)
		return rc;
	if (r.err)
		return r.err;
	if (kvc_match_reply(r.h.version, r.body, r.body_bytes, p->n, &m))
		return kvc_stream_error(h, -EPROTO);
	p->mres = (struct kvpool_match_result){ 0 };
	kvc_match_fold(&p->mres, 0, p->n, &m);
	p->matched = p->mres.matched;
	return 0;
}

/* Ask every node its part of a MATCH: all sends, then all replies; parts
 * that cannot go that way (several frames, BUSY) go through run_jobs. */
static void match_round(struct kvcl *cl, const struct view *v, struct part *parts)
{
	uint64_t id[KVCL_MAX_NODES], deadline[KVCL_MAX_NODES];
	int sent[KVCL_MAX_NODES], later = 0;
	struct part rest[KVCL_MAX_NODES];

	for (size_t j = 0; j < v->n; j++) {
		int rc;

		sent[j] = 0;
		if (parts[j].op != PART_MATCH)
			continue;
		rc = match_send(cl, v->node[j], &parts[j], &deadline[j], &id[j]);
		v->node[j]->calls++;
		if (rc == 0)
			sent[j] = 1;
		else if (rc == -E2BIG)
			later = 1;
		else
			parts[j].rc = rc;
		if (rc && rc != -E2BIG) {
			if (is_conn_error(rc))
				node_failed(v->node[j], rc);
			parts[j].op = PART_NONE;
		}
	}
	for (size_t j = 0; j < v->n; j++) {
		int rc;

		if (!sent[j])
			continue;
		rc = match_recv(v->node[j]->h, id[j], deadline[j], &parts[j]);
		if (rc == -EAGAIN) {
			later = 1; /* BUSY: kvpool_match retries it with backoff */
			continue;
		}
		parts[j].rc = rc;
		if (is_conn_error(rc))
			node_failed(v->node[j], rc);
		parts[j].op = PART_NONE;
	}
	if (!later)
		return;
	for (size_t j = 0; j < v->n; j++)
		rest[j] = parts[j]; /* what is left still has op PART_MATCH */
	run_jobs(cl, v, rest);
	for (size_t j = 0; j < v->n; j++)
		if (rest[j].op == PART_MATCH) {
			parts[j].rc = rest[j].rc;
			parts[j].matched = rest[j].matched;
			parts[j].mres = rest[j].mres;
		}
}

/* A node leases the leading run of what it was asked, which can reach
 * past the chain's first short segment (held segments after a missing
 * one). Nobody will GET those, so their leases would pin blocks until
 * they run out and crowd the node's cache: end them now with a GET that
 * asks for no bytes (each answers -EMSGSIZE; a GET that finds a leased
 * block ends its lease). Only for chains that stopped early; best effort. */
static void release_leases(struct kvcl *cl, const struct view *v,
			   const uint8_t (*chain)[KVPOOL_KEY_BYTES], size_t count, size_t stop,
			   const size_t *seg_m, const int *own)
{
	const size_t D = cl->segment_blocks, n_seg = (count + D - 1) / D;
	struct part parts[KVCL_MAX_NODES];
	struct iovec none = { NULL, 0 };
	struct kvpool_get_block *gb;
	size_t n = 0, at[KVCL_MAX_NODES] = { 0 };
	int *st;

	for (size_t s = stop + 1; s < n_seg; s++)
		n += seg_m[s];
	if (!n)
		return;
	gb = malloc(n * sizeof(*gb));
	st = malloc(n * sizeof(*st));
	if (!gb || !st)
		goto out;
	memset(parts, 0, v->n * sizeof(parts[0]));
	for (size_t s = stop + 1; s < n_seg; s++)
		if (seg_m[s] && own[s] >= 0)
			parts[own[s]].n += seg_m[s];
	for (size_t j = 0, k = 0; j < v->n; j++) {
		parts[j].gb = gb + k;
		parts[j].st = st + k;
		parts[j].op = parts[j].n ? PART_GET : PART_NONE;
		at[j] = k;
		k += parts[j].n;
	}
	for (size_t s = stop + 1; s < n_seg; s++)
		for (size_t i = 0; i < seg_m[s] && own[s] >= 0; i++)
			gb[at[own[s]]++] = (struct kvpool_get_block){ .key = chain[s * D + i],
								      .iov = &none, .iovcnt = 1 };
	run_jobs(cl, v, parts);
out:
	free(gb);
	free(st);
}

/* Spread a node's leading run `m` (of its segments, concatenated in chain
 * order) over those segments: seg[s] receives how much of segment s it
 * covers, up to its first short one. */
static void spread(size_t m, const size_t *perm, size_t first, size_t cnt, size_t n_seg,
		   size_t count, size_t D, size_t *seg)
{
	for (size_t p = first; p < first + cnt; p++) {
		size_t s = perm[p], len = s + 1 < n_seg ? D : count - s * D;

		seg[s] = m < len ? m : len;
		m -= seg[s];
		if (seg[s] < len)
			m = 0;
	}
}

/* The chain's leading run from per-segment runs; *stop receives the first
 * short segment (n_seg when none). */
static size_t leading(const size_t *seg, size_t n_seg, size_t count, size_t D, size_t *stop)
{
	size_t total = 0;

	*stop = n_seg;
	for (size_t s = 0; s < n_seg; s++) {
		size_t len = s + 1 < n_seg ? D : count - s * D;

		total += seg[s];
		if (seg[s] < len) {
			*stop = s;
			break;
		}
	}
	return total;
}

int kvcl_match(struct kvcl *cl, const void *keys, size_t count, uint32_t lease_ms,
	       size_t *matched)
{
	struct kvpool_match_opts o = { .lease_ms = lease_ms };
	struct kvpool_match_result r;
	int rc;

	if (!matched)
		return -EINVAL;
	*matched = 0;
	rc = kvcl_match_ex(cl, keys, count, &o, &r);
	if (rc == 0)
		*matched = r.matched;
	return rc;
}

int kvcl_match_ex(struct kvcl *cl, const void *keys, size_t count,
		  const struct kvpool_match_opts *opts, struct kvpool_match_result *out)
{
	static const struct kvpool_match_opts none;
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = keys;
	const size_t D = cl->segment_blocks;
	size_t n_seg, *perm, *seg_m, *seg_p, *seg_r, start[KVCL_MAX_NODES], cnt[KVCL_MAX_NODES];
	struct kvpool_match_result res = { 0 };
	struct part parts[KVCL_MAX_NODES];
	uint8_t (*kb)[KVPOOL_KEY_BYTES];
	size_t want, stop, stop_p, stop_r;
	struct view v;
	int *own;
	char *mem;

	if (!out || (count && !keys))
		return -EINVAL;
	if (!opts)
		opts = &none;
	if (opts->want > count)
		return -EPROTO; /* as a server answers want > count (BAD_REQUEST) */
	if (count == 0) {
		*out = res;
		return 0;
	}
	want = opts->want ? opts->want : count;
	for (size_t i = 0; i < count; i++)
		pos_put(cl, chain[i], (uint32_t)i, chain[i - i % D]);
	view_take(cl, &v);
	if (v.n == 0) {
		*out = res;
		return 0;
	}
	n_seg = (count + D - 1) / D;
	mem = scratch(cl, n_seg * (sizeof(int) + 4 * sizeof(size_t)) + count * KVPOOL_KEY_BYTES);
	if (!mem)
		return -ENOMEM;
	kb = (void *)mem;
	perm = (size_t *)(mem + count * KVPOOL_KEY_BYTES);
	seg_m = perm + n_seg;
	seg_p = seg_m + n_seg;
	seg_r = seg_p + n_seg;
	own = (int *)(seg_r + n_seg);
	for (size_t s = 0; s < n_seg; s++)
		own[s] = view_owner(&v, chain[s * D]);
	group(own, n_seg, v.n, perm, start, cnt);
	/* Node j's keys: its segments, concatenated in chain order; its share
	 * of want: those of its keys among the chain's first `want`. */
	memset(parts, 0, v.n * sizeof(parts[0]));
	for (size_t j = 0, k = 0; j < v.n; j++) {
		size_t node_want = 0;

		parts[j].keys = kb[k];
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++) {
			size_t s = perm[p], len = s + 1 < n_seg ? D : count - s * D;

			memcpy(kb[k], chain[s * D], len * KVPOOL_KEY_BYTES);
			k += len;
			parts[j].n += len;
			if (s * D < want)
				node_want += want - s * D < len ? want - s * D : len;
		}
		if (parts[j].n) {
			parts[j].op = PART_MATCH;
			parts[j].lease_ms = opts->lease_ms;
			parts[j].mopts = (struct kvpool_match_opts){
				.lease_ms = opts->lease_ms,
				.wait_ms = node_want ? opts->wait_ms : 0,
				.want = (uint32_t)node_want,
				.retain_ms = opts->retain_ms,
			};
		}
	}
	match_round(cl, &v, parts);
	/* Each node's leading runs say how much of each of its segments is
	 * matched, present and retained, up to its first short one; later
	 * ones do not matter. */
	for (size_t j = 0; j < v.n; j++) {
		const struct kvpool_match_result *r = &parts[j].mres;
		int ok = !parts[j].rc;

		if (parts[j].rc)
			v.node[j]->errors++;
		spread(ok ? parts[j].matched : 0, perm, start[j], cnt[j], n_seg, count, D, seg_m);
		spread(ok ? r->present : 0, perm, start[j], cnt[j], n_seg, count, D, seg_p);
		spread(ok ? r->retained : 0, perm, start[j], cnt[j], n_seg, count, D, seg_r);
		if (!ok || !cnt[j])
			continue;
		res.flags |= r->flags;
		if (r->lease_ms && (!res.lease_ms || r->lease_ms < res.lease_ms))
			res.lease_ms = r->lease_ms;
		if (r->retain_ms && (!res.retain_ms || r->retain_ms < res.retain_ms))
			res.retain_ms = r->retain_ms;
	}
	res.matched = leading(seg_m, n_seg, count, D, &stop);
	res.present = leading(seg_p, n_seg, count, D, &stop_p);
	res.retained = leading(seg_r, n_seg, count, D, &stop_r);
	if (!res.matched)
		res.lease_ms = 0;
	*out = res;
	if (opts->lease_ms && stop + 1 < n_seg)
		release_leases(cl, &v, chain, count, stop, seg_m, own);
	return 0;
}

/* ---- PUT ------------------------------------------------------------------------ */

static int key_is_zero(const uint8_t *k)
{
	static const uint8_t zero[KVPOOL_KEY_BYTES];

	return !k || memcmp(k, zero, KVPOOL_KEY_BYTES) == 0;
}

int kvcl_put(struct kvcl *cl, const struct kvpool_put_block *blocks, size_t count,
	     int *statuses, uint32_t *flags)
{
	const size_t D = cl->segment_blocks;
	size_t *perm, start[KVCL_MAX_NODES], cnt[KVCL_MAX_NODES];
	struct part parts[KVCL_MAX_NODES];
	struct kvpool_put_block *pb;
	uint32_t *posv, *pfl;
	struct view v;
	int *own, *st, *pst, ret = 0;
	char *mem;

	if (count && !blocks)
		return -EINVAL;
	for (size_t i = 0; i < count; i++)
		if (!blocks[i].key || !blocks[i].iov || blocks[i].iovcnt < 1) {
			for (size_t k = 0; statuses && k < count; k++)
				statuses[k] = -EINVAL;
			return -EINVAL;
		}
	if (count == 0)
		return 0;
	view_take(cl, &v);
	/* pb[count] perm[count] own[count] st[count] pst[count] posv[count] pfl[count] */
	mem = scratch(cl, count * (sizeof(*pb) + sizeof(size_t) + 3 * sizeof(int) +
				   2 * sizeof(uint32_t)));
	if (!mem)
		return -ENOMEM;
	pb = (void *)mem;
	perm = (size_t *)(pb + count);
	own = (int *)(perm + count);
	st = own + count;
	pst = st + count;
	posv = (uint32_t *)(pst + count);
	pfl = posv + count;
	/* Position of each block: 0 with no parent, else one past its parent
	 * (known from an earlier call or from this batch). */
	for (size_t i = 0; i < count; i++) {
		const struct kvpool_put_block *b = &blocks[i];
		const struct kvcl_pos *pp = NULL;
		uint8_t seg[KVPOOL_KEY_BYTES];
		uint32_t pos = 0;

		own[i] = -1;
		st[i] = 0;
		if (!key_is_zero(b->parent)) {
			pp = pos_get(cl, b->parent);
			if (!pp) {
				st[i] = -ENOLINK; /* unplaced: its parent's place is unknown */
				cl->unplaced++;
				continue;
			}
			pos = pp->pos + 1;
		}
		/* copied first: pos_put below may take pp's slot */
		memcpy(seg, pos % D && pp ? pp->seg : b->key, sizeof(seg));
		pos_put(cl, b->key, pos, seg);
		posv[i] = pos;
		if (v.n)
			own[i] = view_owner(&v, seg);
		/* else: no node at all, the block is dropped (status 0) */
	}
	group(own, count, v.n, perm, start, cnt);
	memset(parts, 0, v.n * sizeof(parts[0]));
	for (size_t j = 0; j < v.n; j++) {
		parts[j].pb = pb + start[j];
		parts[j].st = pst + start[j];
		parts[j].flags = flags ? pfl + start[j] : NULL;
		parts[j].n = cnt[j];
		parts[j].op = cnt[j] ? PART_PUT : PART_NONE;
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++) {
			size_t i = perm[p];

			pb[p] = blocks[i];
			pst[p] = 0;
			if (posv[i] % D == 0)
				pb[p].parent = NULL; /* a segment's first block: no parent here */
		}
	}
	submit_round(cl, &v, parts);
	for (size_t j = 0; j < v.n; j++) {
		int conn = parts[j].rc && is_conn_error(parts[j].rc);

		if (!cnt[j])
			continue;
		if (conn) {
			v.node[j]->errors++;
			v.node[j]->puts_dropped += cnt[j];
		}
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++) {
			st[perm[p]] = conn ? 0 : pst[p];
			if (flags)
				flags[perm[p]] = conn ? 0 : pfl[p];
		}
	}
	for (size_t i = 0; i < count; i++) {
		if (statuses)
			statuses[i] = st[i];
		if (st[i] && !ret)
			ret = st[i];
	}
	return ret;
}

/* ---- GET, EXISTS, DELETE ------------------------------------------------------ */

/* The owner of a key by its remembered position, or -1 (unplaced). */
static int key_owner(struct kvcl *cl, const struct view *v, const uint8_t *key)
{
	const struct kvcl_pos *p = pos_get(cl, key);

	if (!p) {
		cl->unplaced++;
		return -1;
	}
	return view_owner(v, p->seg);
}

int kvcl_get(struct kvcl *cl, struct kvpool_get_block *blocks, size_t count, int *statuses)
{
	size_t *perm, start[KVCL_MAX_NODES], cnt[KVCL_MAX_NODES];
	struct part parts[KVCL_MAX_NODES];
	struct kvpool_get_block *gb;
	struct view v;
	int *own, *pst, *st, ret = 0;
	char *mem;

	if (count && !blocks)
		return -EINVAL;
	for (size_t i = 0; i < count; i++)
		if (!blocks[i].key || !blocks[i].iov || blocks[i].iovcnt < 1) {
			for (size_t k = 0; statuses && k < count; k++)
				statuses[k] = -EINVAL;
			return -EINVAL;
		}
	if (count == 0)
		return 0;
	view_take(cl, &v);
	/* gb[count] perm[count] own[count] pst[count] st[count] */
	mem = scratch(cl, count * (sizeof(*gb) + sizeof(size_t) + 3 * sizeof(int)));
	if (!mem)
		return -ENOMEM;
	gb = (void *)mem;
	perm = (size_t *)(gb + count);
	own = (int *)(perm + count);
	pst = own + count;
	st = pst + count;
	for (size_t i = 0; i < count; i++) {
		own[i] = v.n ? key_owner(cl, &v, blocks[i].key) : -1;
		st[i] = -ENOENT; /* unplaced, or no node: a miss */
	}
	group(own, count, v.n, perm, start, cnt);
	memset(parts, 0, v.n * sizeof(parts[0]));
	for (size_t j = 0; j < v.n; j++) {
		parts[j].gb = gb + start[j];
		parts[j].st = pst + start[j];
		parts[j].n = cnt[j];
		parts[j].op = cnt[j] ? PART_GET : PART_NONE;
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++)
			gb[p] = blocks[perm[p]];
	}
	submit_round(cl, &v, parts);
	for (size_t j = 0; j < v.n; j++) {
		int conn = parts[j].rc && is_conn_error(parts[j].rc);

		if (!cnt[j])
			continue;
		if (conn) {
			v.node[j]->errors++;
			v.node[j]->misses_from_errors += cnt[j];
		}
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++) {
			size_t i = perm[p];

			st[i] = conn ? -ENOENT : pst[p];
			if (st[i] == 0 || st[i] == -EMSGSIZE)
				blocks[i].length = gb[p].length;
		}
	}
	for (size_t i = 0; i < count; i++) {
		if (statuses)
			statuses[i] = st[i];
		if (st[i] && !ret)
			ret = st[i];
	}
	return ret;
}

/* EXISTS and DELETE: keys by owner; statuses per key. */
static int keys_call(struct kvcl *cl, enum part_op op, const void *keys, size_t count,
		     int *statuses)
{
	const uint8_t (*kk)[KVPOOL_KEY_BYTES] = keys;
	size_t *perm, start[KVCL_MAX_NODES], cnt[KVCL_MAX_NODES];
	struct part parts[KVCL_MAX_NODES];
	uint8_t (*kb)[KVPOOL_KEY_BYTES];
	struct view v;
	int *own, *pst;
	char *mem;

	view_take(cl, &v);
	mem = scratch(cl, count * (KVPOOL_KEY_BYTES + sizeof(size_t) + 2 * sizeof(int)));
	if (!mem)
		return -ENOMEM;
	kb = (void *)mem;
	perm = (size_t *)(mem + count * KVPOOL_KEY_BYTES);
	own = (int *)(perm + count);
	pst = own + count;
	for (size_t i = 0; i < count; i++)
		own[i] = v.n ? key_owner(cl, &v, kk[i]) : -1;
	group(own, count, v.n, perm, start, cnt);
	memset(parts, 0, v.n * sizeof(parts[0]));
	for (size_t j = 0; j < v.n; j++) {
		parts[j].keys = kb[start[j]];
		parts[j].st = pst + start[j];
		parts[j].n = cnt[j];
		parts[j].op = cnt[j] ? op : PART_NONE;
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++)
			memcpy(kb[p], kk[perm[p]], KVPOOL_KEY_BYTES);
	}
	submit_round(cl, &v, parts);
	for (size_t i = 0; i < count; i++)
		if (own[i] < 0 && statuses)
			statuses[i] = -ENOENT;
	for (size_t j = 0; j < v.n; j++) {
		int failed = parts[j].rc != 0;

		if (!cnt[j])
			continue;
		if (failed) {
			v.node[j]->errors++;
			v.node[j]->misses_from_errors += cnt[j];
		}
		for (size_t p = start[j]; p < start[j] + cnt[j]; p++)
			if (statuses)
				statuses[perm[p]] = failed ? -ENOENT : pst[p];
	}
	return 0;
}

int kvcl_exists(struct kvcl *cl, const void *keys, size_t count, int *statuses)
{
	if (count && (!keys || !statuses))
		return -EINVAL;
	return count ? keys_call(cl, PART_EXISTS, keys, count, statuses) : 0;
}

int kvcl_delete(struct kvcl *cl, const void *keys, size_t count, int *statuses)
{
	if (count && !keys)
		return -EINVAL;
	return count ? keys_call(cl, PART_DELETE, keys, count, statuses) : 0;
}

/* ---- whole-pool calls ----------------------------------------------------------- */

/* Run `op` on every member. Returns how many answered; *first_err the
 * first error (0 if none). */
static size_t all_nodes(struct kvcl *cl, struct view *v, struct part *parts, enum part_op op,
			const char *ns, int *first_err)
{
	size_t ok = 0;

	view_take(cl, v);
	memset(parts, 0, v->n * sizeof(parts[0]));
	for (size_t j = 0; j < v->n; j++) {
		parts[j].op = op;
		parts[j].ns = ns;
	}
	run_jobs(cl, v, parts);
	*first_err = 0;
	for (size_t j = 0; j < v->n; j++) {
		if (parts[j].rc == 0)
			ok++;
		else if (!*first_err)
			*first_err = parts[j].rc;
	}
	return ok;
}

int kvcl_drop_namespace(struct kvcl *cl, const char *ns, uint64_t *blocks)
{
	struct part parts[KVCL_MAX_NODES];
	struct view v;
	uint64_t total = 0;
	int err;
	size_t ok = all_nodes(cl, &v, parts, PART_DROP, ns, &err);

	/* A node that never held the namespace dropped nothing. */
	for (size_t j = 0; j < v.n; j++)
		if (parts[j].rc == -ENOENT) {
			parts[j].rc = 0;
			parts[j].u64 = 0;
			ok++;
		}
	if (err == -ENOENT)
		err = 0;
	for (size_t j = 0; j < v.n && !err; j++)
		err = parts[j].rc;
	if (err && !is_conn_error(err))
		return err; /* e.g. -EINVAL, -EACCES: the same on every node */
	if (!ok && v.n)
		return err;
	for (size_t j = 0; j < v.n; j++)
		total += parts[j].rc ? 0 : parts[j].u64;
	if (blocks)
		*blocks = total;
	return 0;
}

int kvcl_ping(struct kvcl *cl, uint64_t *rtt_us)
{
	struct part parts[KVCL_MAX_NODES];
	struct view v;
	uint64_t worst = 0;
	int err;
	size_t ok = all_nodes(cl, &v, parts, PART_PING, NULL, &err);

	if (!ok)
		return v.n ? err : -ECONNREFUSED;
	for (size_t j = 0; j < v.n; j++)
		if (!parts[j].rc && parts[j].u64 > worst)
			worst = parts[j].u64;
	if (rtt_us)
		*rtt_us = worst;
	return 0;
}

int kvcl_get_limits(struct kvcl *cl, struct kvpool_limits *out)
{
	struct part parts[KVCL_MAX_NODES];
	struct kvpool_limits m = { 0 };
	struct view v;
	int err, first = 1;
	size_t ok;

	if (!out)
		return -EINVAL;
	ok = all_nodes(cl, &v, parts, PART_LIMITS, NULL, &err);
	if (!ok)
		return v.n ? err : -ECONNREFUSED;
	/* What every node accepts: the smallest of each limit. */
	for (size_t j = 0; j < v.n; j++) {
		const struct kvpool_limits *l = &parts[j].limits;

		if (parts[j].rc)
			continue;
		if (first) {
			m = *l;
			m.rdma_port = 0;
			first = 0;
			continue;
		}
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
	*out = m;
	return 0;
}

int kvcl_get_counters(const struct kvcl *cl, struct kvpool_counters *out)
{
	struct kvpool_counters sum = { 0 };

	if (!out)
		return -EINVAL;
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvpool_counters k;

		if (cl->nodes[i]->h && kvpool_get_counters(cl->nodes[i]->h, &k) == 0) {
			sum.connects += k.connects;
			sum.reconnects += k.reconnects;
			sum.busy_retries += k.busy_retries;
			sum.checksum_errors += k.checksum_errors;
		}
	}
	*out = sum;
	return 0;
}

/* The share of segments each member owns, from SHARE_SAMPLES keys. */
static void shares(const struct view *v, double *share)
{
	size_t cnt[KVCL_MAX_NODES] = { 0 };

	for (uint64_t i = 0; i < SHARE_SAMPLES && v->n; i++) {
		uint8_t key[KVPOOL_KEY_BYTES] = { 0 };
		uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL;

		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ULL;
		x ^= x >> 29;
		memcpy(key, &x, sizeof(x));
		cnt[view_owner(v, key)]++;
	}
	for (size_t j = 0; j < v->n; j++)
		share[j] = (double)cnt[j] / SHARE_SAMPLES;
}

/* Merge node STATS document `src` into `dst` (both objects): integers
 * add up, other numbers keep the largest (latency percentiles: an upper
 * bound), booleans OR, strings and arrays keep dst's, objects merge. */
static void stats_merge(struct json_object *dst, struct json_object *src)
{
	json_object_object_foreach(src, key, sv) {
		struct json_object *dv;

		if (!json_object_object_get_ex(dst, key, &dv)) {
			json_object_object_add(dst, key, json_object_get(sv));
			continue;
		}
		if (json_object_is_type(dv, json_type_object) &&
		    json_object_is_type(sv, json_type_object)) {
			stats_merge(dv, sv);
		} else if (json_object_is_type(dv, json_type_int) &&
			   json_object_is_type(sv, json_type_int)) {
			json_object_object_add(dst, key, json_object_new_int64(
						  json_object_get_int64(dv) + json_object_get_int64(sv)));
		} else if (json_object_is_type(dv, json_type_double) &&
			   json_object_is_type(sv, json_type_double)) {
			if (json_object_get_double(sv) > json_object_get_double(dv))
				json_object_object_add(dst, key, json_object_get(sv));
		} else if (json_object_is_type(dv, json_type_boolean) &&
			   json_object_is_type(sv, json_type_boolean)) {
			json_object_object_add(dst, key, json_object_new_boolean(
						  json_object_get_boolean(dv) ||
						  json_object_get_boolean(sv)));
		}
	}
}

/* After a merge: ratios again from their summed parts. */
static void stats_ratios(struct json_object *o)
{
	static const char *const r[][3] = {
		{ "hit_ratio", "blocks_matched", "blocks_queried" },
		{ "match_hit_ratio", "match_blocks_matched", "match_blocks_queried" },
	};
	struct json_object *a, *b;

	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
		if (json_object_object_get_ex(o, r[i][0], NULL) &&
		    json_object_object_get_ex(o, r[i][1], &a) &&
		    json_object_object_get_ex(o, r[i][2], &b)) {
			double den = (double)json_object_get_int64(b);

			json_object_object_add(o, r[i][0], json_object_new_double(
						  den > 0 ? (double)json_object_get_int64(a) / den : 0));
		}
	json_object_object_foreach(o, key, v) {
		(void)key;
		if (json_object_is_type(v, json_type_object))
			stats_ratios(v);
	}
}

int kvcl_stats(struct kvcl *cl, const char *ns, char **json)
{
	struct part parts[KVCL_MAX_NODES];
	double share[KVCL_MAX_NODES];
	struct json_object *o, *c, *nodes, *e;
	struct view v;
	int err;
	char *s;

	if (!json)
		return -EINVAL;
	all_nodes(cl, &v, parts, PART_STATS, ns, &err);
	shares(&v, share);
	o = json_object_new_object();
	c = json_object_new_object();
	nodes = json_object_new_array();
	if (!o || !c || !nodes) {
		json_object_put(o);
		json_object_put(c);
		json_object_put(nodes);
		for (size_t j = 0; j < v.n; j++)
			free(parts[j].json);
		return -ENOMEM;
	}
	/* The nodes' documents summed (same keys as one server's), plus "cluster". */
	for (size_t j = 0; j < v.n; j++) {
		struct json_object *d = parts[j].json ? json_tokener_parse(parts[j].json) : NULL;

		if (d && json_object_is_type(d, json_type_object))
			stats_merge(o, d);
		json_object_put(d);
	}
	stats_ratios(o);
	json_object_object_add(o, "cluster", c);
	pthread_mutex_lock(&cl->lock);
	json_object_object_add(c, "membership",
			       json_object_new_string(cl->endpoint[0] ? "etcd" : "static"));
	json_object_object_add(c, "epoch", json_object_new_int64((int64_t)cl->epoch));
	if (cl->endpoint[0]) {
		e = json_object_new_object();
		json_object_object_add(e, "endpoint", json_object_new_string(cl->endpoint));
		json_object_object_add(e, "cluster", json_object_new_string(cl->cluster));
		json_object_object_add(e, "reachable", json_object_new_boolean(cl->etcd_reachable));
		json_object_object_add(e, "error", json_object_new_string(cl->etcd_error));
		json_object_object_add(e, "revision", json_object_new_int64(cl->etcd_revision));
		json_object_object_add(e, "failures", json_object_new_int64((int64_t)cl->etcd_failures));
		json_object_object_add(e, "resumes", json_object_new_int64((int64_t)cl->etcd_resumes));
		json_object_object_add(c, "etcd", e);
	}
	pthread_mutex_unlock(&cl->lock);
	json_object_object_add(c, "segment_blocks", json_object_new_int((int)cl->segment_blocks));
	json_object_object_add(c, "unplaced_blocks", json_object_new_int64((int64_t)cl->unplaced));
	json_object_object_add(c, "nodes", nodes);
	for (size_t j = 0; j < v.n; j++) {
		struct kvcl_node *n = v.node[j];
		struct json_object *x = json_object_new_object(), *st = NULL;
		char url[sizeof(n->url)];

		pthread_mutex_lock(&cl->lock);
		memcpy(url, n->url, sizeof(url));
		pthread_mutex_unlock(&cl->lock);
		json_object_object_add(x, "name", json_object_new_string(n->name));
		json_object_object_add(x, "url", json_object_new_string(url));
		json_object_object_add(x, "up", json_object_new_boolean(parts[j].rc == 0));
		json_object_object_add(x, "error", json_object_new_string(
						     parts[j].rc ? kvpool_strerror(parts[j].rc) : ""));
		json_object_object_add(x, "share", json_object_new_double(share[j]));
		json_object_object_add(x, "calls", json_object_new_int64((int64_t)n->calls));
		json_object_object_add(x, "errors", json_object_new_int64((int64_t)n->errors));
		json_object_object_add(x, "misses_from_errors",
				       json_object_new_int64((int64_t)n->misses_from_errors));
		json_object_object_add(x, "puts_dropped", json_object_new_int64((int64_t)n->puts_dropped));
		if (parts[j].json)
			st = json_tokener_parse(parts[j].json);
		json_object_object_add(x, "stats", st);
		free(parts[j].json);
		json_object_array_add(nodes, x);
	}
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	if (!s)
		return -ENOMEM;
	*json = s;
	return 0;
}

/* ---- handle ---------------------------------------------------------------------- */

int kvcl_is_cluster_url(const char *url)
{
	return url && (strchr(url, ',') || strncmp(url, "etcd://", 7) == 0);
}

static int ns_ok(const char *ns)
{
	size_t n = strlen(ns);

	if (n == 0 || n > 255)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)ns[i] < 0x21 || (unsigned char)ns[i] > 0x7e)
			return 0;
	return 1;
}

int kvcl_connect(const char *url, const char *ns, const struct kvpool_options *opts,
		 struct kvpool_client **out)
{
	struct kvpool_client *c;
	struct kvcl *cl;
	int rc;

	if (!url || !ns || !out || !ns_ok(ns))
		return -EINVAL;
	if (opts && opts->token && strlen(opts->token) > PROTO_TOKEN_MAX_BYTES)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	cl = calloc(1, sizeof(*cl));
	if (cl)
		cl->pos = calloc(KVCL_POS_SLOTS, sizeof(*cl->pos));
	if (!c || !cl || !cl->pos) {
		free(c);
		if (cl)
			free(cl->pos);
		free(cl);
		return -ENOMEM;
	}
	c->fd = -1;
	c->cluster = cl;
	cl->owner = c;
	snprintf(cl->ns, sizeof(cl->ns), "%s", ns);
	cl->timeout_ms = opts ? opts->timeout_ms : 0;
	cl->segment_blocks = KVPOOL_SEGMENT_BLOCKS;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->job_cond, NULL);
	pthread_cond_init(&cl->done_cond, NULL);
	if (opts && opts->token) {
		cl->token = strdup(opts->token);
		if (!cl->token) {
			rc = -ENOMEM;
			goto out_close;
		}
	}
	if (strncmp(url, "etcd://", 7) == 0) {
		rc = kvc_etcd_url_parse(url, cl->endpoint, sizeof(cl->endpoint), cl->cluster,
					sizeof(cl->cluster));
		if (rc == 0)
			rc = kvcl_etcd_start(cl);
		if (rc)
			goto out_close;
		/* connect to the members there are now (failures are not errors) */
		{
			struct part parts[KVCL_MAX_NODES];
			struct view v;
			int err;

			all_nodes(cl, &v, parts, PART_CONNECT, NULL, &err);
		}
	} else {
		struct part parts[KVCL_MAX_NODES];
		struct view v;
		int err;

		rc = kvcl_static_members(cl, url);
		if (rc)
			goto out_close;
		/* A list none of whose nodes answers is refused like one node. */
		if (!all_nodes(cl, &v, parts, PART_CONNECT, NULL, &err)) {
			rc = err;
			goto out_close;
		}
	}
	*out = c;
	return 0;
out_close:
	kvcl_close(cl);
	free(c);
	return rc;
}

void kvcl_close(struct kvcl *cl)
{
	if (!cl)
		return;
	kvcl_etcd_stop(cl);
	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++)
		cl->nodes[i]->quit = 1;
	pthread_cond_broadcast(&cl->job_cond);
	pthread_mutex_unlock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvcl_node *n = cl->nodes[i];

		if (n->has_thread)
			pthread_join(n->thread, NULL);
		kvpool_close(n->h);
		free(n);
	}
	pthread_cond_destroy(&cl->done_cond);
	pthread_cond_destroy(&cl->job_cond);
	pthread_mutex_destroy(&cl->lock);
	free(cl->token);
	free(cl->pos);
	free(cl->scratch);
	free(cl);
}

void kvcl_set_timeout(struct kvcl *cl, uint32_t timeout_ms)
{
	cl->timeout_ms = timeout_ms;
	for (size_t i = 0; i < cl->n_nodes; i++)
		if (cl->nodes[i]->h)
			kvpool_set_timeout(cl->nodes[i]->h, timeout_ms);
}

void kvcl_set_busy_tries(struct kvcl *cl, uint32_t tries)
{
	cl->busy_tries = tries;
	for (size_t i = 0; i < cl->n_nodes; i++)
		if (cl->nodes[i]->h)
			kvpool_set_busy_tries(cl->nodes[i]->h, tries);
}

int kvpool_set_segment_blocks(struct kvpool_client *c, uint32_t blocks)
{
	if (!c || !c->cluster)
		return c ? -EOPNOTSUPP : -EINVAL;
	if (blocks == 0)
		blocks = KVPOOL_SEGMENT_BLOCKS;
	if (blocks > 65536)
		return -EINVAL;
	c->cluster->segment_blocks = blocks;
	return 0;
}
