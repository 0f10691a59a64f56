/*
 * cluster.c - the cluster backend (cluster.h, cluster_impl.h): parent
 * requests and their children, and the backend entry points; how each
 * call splits and merges is split.c's, node threads are nodes.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "cluster_impl.h"
#include "lib/clock.h"
#include "lib/net/frame.h"
#include "proto.h"

int kvcl_is_conn_error(int rc)
{
	return rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EPIPE || rc == -ETIMEDOUT ||
	       rc == -EPROTO || rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -ENOTCONN ||
	       rc == -ECONNABORTED || rc == -EOPNOTSUPP;
}

int kvcl_is_batch(int op)
{
	return op >= KVPOOL_OP_PUT && op <= KVPOOL_OP_DELETE;
}

void kvcl_view_take_locked(struct kvcl *cl, struct kvcl_view *v)
{
	struct timespec ts;
	uint64_t wall_ms;

	clock_gettime(CLOCK_REALTIME, &ts);
	wall_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	v->n = 0;
	v->n_up = 0;
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvcl_node *n = cl->nodes[i];

		if (!n->member)
			continue;
		v->node[v->n] = n;
		v->seed[v->n] = n->seed;
		v->name[v->n] = n->name;
		v->up[v->n] = !n->down;
		/* a record from the future (clocks apart) is a member just registered */
		v->age_ms[v->n] = !n->registered_ms ? UINT64_MAX
			: wall_ms > n->registered_ms ? wall_ms - n->registered_ms : 0;
		v->n_up += !n->down;
		v->n++;
	}
}

/* ---- parents and children ------------------------------------------------------------ */

/* A parent and `scratch` bytes for its entries (not zeroed: split writes
 * every entry). The scratch of the last parent freed is kept for the next
 * one (the cluster's lock held): a MATCH of 1,000 keys needs ~75 KB, and
 * fetching it from the allocator each call cost more than the split. */
static struct kvcl_parent *parent_new(struct kvcl *cl, const struct kvc_req *r, int internal,
				      size_t scratch)
{
	struct kvcl_parent *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	if (scratch <= cl->spare_bytes) {
		p->mem = cl->spare;
		p->mem_bytes = cl->spare_bytes;
		cl->spare = NULL;
		cl->spare_bytes = 0;
	} else if (scratch) {
		p->mem = malloc(scratch);
		p->mem_bytes = scratch;
		if (!p->mem) {
			free(p);
			return NULL;
		}
	}
	p->r = *r;
	p->internal = internal;
	p->st = r->statuses;
	p->id = ++cl->seq;
	p->next = cl->parents;
	if (p->next)
		p->next->prev = p;
	cl->parents = p;
	/* a waiting MATCH may take wait_ms longer (a v1 node answers at once) */
	if (!r->deadline_ms)
		p->r.deadline_ms = kvc_deadline_ms(cl->timeout_ms ? cl->timeout_ms
							  : KVPOOL_DEFAULT_TIMEOUT_MS) +
				   (r->op == KVPOOL_OP_MATCH ? r->mopts.wait_ms : 0);
	return p;
}

static void parent_free(struct kvcl *cl, struct kvcl_parent *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		cl->parents = p->next;
	if (p->next)
		p->next->prev = p->prev;
	while (p->children) {
		struct kvcl_child *c = p->children;

		p->children = c->sibling;
		kvc_result_clear(&c->res);
		free(c);
	}
	kvc_result_clear(&p->res);
	if (p->mem_bytes > cl->spare_bytes) {
		free(cl->spare);
		cl->spare = p->mem;
		cl->spare_bytes = p->mem_bytes;
	} else {
		free(p->mem);
	}
	free(p);
}

/* Free p once its caller is done with it and no node thread holds a child. */
static void parent_maybe_free(struct kvcl *cl, struct kvcl_parent *p)
{
	if (p->polled && p->holds == 0)
		parent_free(cl, p);
}

struct kvcl_child *kvcl_child_new(struct kvcl_parent *p, struct kvcl_node *n, size_t bytes)
{
	struct kvcl_child *c = calloc(1, sizeof(*c) + bytes);

	if (!c)
		return NULL;
	c->p = p;
	c->node = n;
	c->kind = CHILD_REQ;
	if (p) {
		c->sibling = p->children;
		p->children = c;
		p->pending++;
		p->holds++;
		c->r.deadline_ms = p->r.deadline_ms;
		c->r.op = p->r.op;
		c->r.mopts = p->r.mopts;
		c->r.ns = p->r.ns;
	}
	c->r.tag = (uint64_t)(uintptr_t)c;
	if (!p) {
		c->sibling = n->cl->detached;
		n->cl->detached = c;
	}
	return c;
}

void kvcl_child_drop_locked(struct kvcl *cl, struct kvcl_child *c)
{
	struct kvcl_parent *p = c->p;

	if (!p) {
		struct kvcl_child **pp = &cl->detached;

		while (*pp != c)
			pp = &(*pp)->sibling;
		*pp = c->sibling;
		kvc_result_clear(&c->res);
		free(c->own_buf);
		free(c);
		return;
	}
	p->holds--;
	parent_maybe_free(cl, p);
}

/* The last child is in (or none was needed): the parent's outcome. */
void kvcl_parent_complete_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	int op = p->r.op;

	if (p->done)
		return; /* once: it is on the completion queue already */
	if (p->cancelled)
		p->res.status = -ECANCELED;
	else if (op == KVPOOL_OP_MATCH && !p->share_err)
		kvcl_match_finish_locked(cl, p);
	else if (kvcl_is_batch(op) && op != KVPOOL_OP_MATCH && !p->res.status)
		kvcl_batch_finish_locked(cl, p);
	if (!p->cancelled && (op == KVPOOL_OP_EXISTS || op == KVPOOL_OP_DELETE ||
			      op == KVPOOL_OP_MATCH))
		p->res.status = p->share_err;
	p->done = 1;
	if (!p->internal) {
		if (cl->done_tail)
			cl->done_tail->done_next = p;
		else
			cl->done_head = p;
		cl->done_tail = p;
		cl->done_len++;
		if (cl->efd >= 0 && !cl->efd_set) {
			uint64_t one = 1;

			if (write(cl->efd, &one, sizeof(one)) == sizeof(one))
				cl->efd_set = 1;
		}
	}
	pthread_cond_broadcast(&cl->done_cond);
}

/* A new parent for r, split and posted. */
static int submit_locked(struct kvcl *cl, const struct kvc_req *r, int internal,
			 struct kvcl_parent **out)
{
	size_t count = kvcl_is_batch(r->op) ? r->count : 0, scratch;
	struct kvcl_parent *p;

	/* want > count: an argument error (kvc_req_check refuses it first) */
	if (r->op == KVPOOL_OP_MATCH && r->mopts.want > r->count)
		return -EINVAL;
	if (r->op == KVPOOL_OP_PUT && r->flags && r->count)
		memset(r->flags, 0, r->count * sizeof(*r->flags)); /* always written */
	/* per entry its placement state and a status of our own */
	scratch = count * (sizeof(struct kvcl_entry) + sizeof(int)) + 64;
	p = parent_new(cl, r, internal, scratch);
	if (!p)
		return -ENOMEM;
	p->ent = p->mem;
	p->own_st = (int *)(p->ent + count);
	if (!p->st)
		p->st = p->own_st;
	if (!internal)
		cl->used++;
	*out = p;
	return kvcl_split_post_locked(cl, p);
}

static int cl_call(void *be, const struct kvc_req *r, struct kvc_result *res)
{
	struct kvcl *cl = be;
	struct kvcl_parent *p;
	int rc;

	kvc_frame_set_last_message(NULL);
	memset(res, 0, sizeof(*res));
	pthread_mutex_lock(&cl->lock);
	rc = submit_locked(cl, r, 1, &p);
	if (rc) {
		pthread_mutex_unlock(&cl->lock);
		return res->status = rc;
	}
	while (!p->done)
		pthread_cond_wait(&cl->done_cond, &cl->lock);
	*res = p->res;
	p->res.json = p->res.msg = NULL;
	pthread_mutex_unlock(&cl->lock);
	/* The children are the caller's now: no node thread touches them. */
	if (!kvcl_is_batch(r->op) && !res->status)
		res->status = kvcl_finish_admin(cl, p, res);
	pthread_mutex_lock(&cl->lock);
	p->polled = 1;
	parent_maybe_free(cl, p);
	pthread_mutex_unlock(&cl->lock);
	if (res->msg)
		kvc_frame_set_last_message(res->msg);
	return res->status;
}

static int cl_submit(void *be, const struct kvc_req *r, uint64_t *id)
{
	struct kvcl *cl = be;
	struct kvcl_parent *p;
	int rc;

	pthread_mutex_lock(&cl->lock);
	if (cl->used >= cl->max) {
		pthread_mutex_unlock(&cl->lock);
		return -EAGAIN;
	}
	rc = submit_locked(cl, r, 0, &p);
	if (!rc)
		*id = p->id;
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

static int pop_locked(struct kvcl *cl, struct kvpool_completion *out, int max)
{
	int n = 0;

	while (n < max && cl->done_head) {
		struct kvcl_parent *p = cl->done_head;

		cl->done_head = p->done_next;
		if (!cl->done_head)
			cl->done_tail = NULL;
		cl->done_len--;
		out[n++] = (struct kvpool_completion){
			.id = p->id, .tag = p->r.tag, .op = p->r.op, .status = p->res.status,
			.count = p->r.count, .matched = p->res.match.matched,
		};
		kvc_frame_first_message(p->res.msg);
		cl->used--;
		p->polled = 1;
		parent_maybe_free(cl, p);
	}
	if (!cl->done_len && cl->efd_set) {
		uint64_t v;

		if (read(cl->efd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
			cl->efd_set = 0;
	}
	return n;
}

static int cl_poll(void *be, struct kvpool_completion *out, int max, int timeout_ms)
{
	struct kvcl *cl = be;
	struct timespec end;
	int n;

	clock_gettime(CLOCK_REALTIME, &end);
	if (timeout_ms > 0) {
		end.tv_sec += timeout_ms / 1000;
		end.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (end.tv_nsec >= 1000000000) {
			end.tv_sec++;
			end.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&cl->lock);
	for (;;) {
		n = pop_locked(cl, out, max);
		/* Nothing in flight: do not wait for what will never come. */
		if (n || timeout_ms == 0 || cl->used == 0)
			break;
		if (timeout_ms < 0)
			pthread_cond_wait(&cl->done_cond, &cl->lock);
		else if (pthread_cond_timedwait(&cl->done_cond, &cl->lock, &end) == ETIMEDOUT) {
			n = pop_locked(cl, out, max);
			break;
		}
	}
	pthread_mutex_unlock(&cl->lock);
	return n;
}

static int cl_event_fd(void *be)
{
	struct kvcl *cl = be;
	int rc;

	pthread_mutex_lock(&cl->lock);
	if (cl->efd < 0) {
		cl->efd = eventfd(cl->done_len ? 1 : 0, EFD_NONBLOCK | EFD_CLOEXEC);
		cl->efd_set = cl->done_len > 0;
	}
	rc = cl->efd >= 0 ? cl->efd : (errno == EMFILE || errno == ENFILE ? -EMFILE : -ENOMEM);
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

/* Cancel every child of p that can be: queued ones are dropped, submitted
 * ones cancelled on their engine. Returns 0, or -EINPROGRESS when a child
 * could not be stopped (RDMA: the server may still move its bytes).
 * cl->lock is released while a child is being handed to its engine: its
 * node may finish it meanwhile, and with it p (the caller holds p). */
static int cancel_children_locked(struct kvcl *cl, struct kvcl_parent *p)
{
	int rc = 0;

	for (struct kvcl_child *c = p->children; c; c = c->sibling) {
		c->cancel = 1;
		while (c->state == CH_SUBMITTING)
			pthread_cond_wait(&cl->child_cond, &cl->lock);
		if (c->state == CH_ENGINE) {
			int k = kvc_engine_backend.cancel(c->node->e, c->engine_id);

			if (k == -EINPROGRESS) {
				rc = k;
				continue;
			}
		}
		if (c->state != CH_DONE) {
			c->state = CH_DONE;
			p->pending--;
		}
	}
	return rc;
}

static int cl_cancel(void *be, uint64_t id)
{
	struct kvcl *cl = be;
	struct kvcl_parent *p;
	int rc = -ENOENT;

	pthread_mutex_lock(&cl->lock);
	for (p = cl->parents; id && p; p = p->next)
		if (p->id == id && !p->internal && !p->done)
			break;
	if (p && id) {
		p->cancelled = 1;
		/* Held while cancel_children_locked waits with cl->lock released:
		 * another thread may poll p meanwhile. */
		p->holds++;
		rc = cancel_children_locked(cl, p);
		/* Its last child may have finished during that wait, completing p
		 * already: a second completion queued it twice, which lost the
		 * completions queued after it. */
		if (!p->pending && !p->done)
			kvcl_parent_complete_locked(cl, p);
		p->holds--;
		parent_maybe_free(cl, p);
	}
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

static uint32_t cl_inflight(void *be)
{
	struct kvcl *cl = be;
	uint32_t n;

	pthread_mutex_lock(&cl->lock);
	n = cl->used;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

static int cl_set_max_inflight(void *be, uint32_t max)
{
	struct kvcl *cl = be;
	int rc = 0;

	pthread_mutex_lock(&cl->lock);
	if (cl->used)
		rc = -EBUSY;
	else
		cl->max = max ? max : KVPOOL_DEFAULT_MAX_INFLIGHT;
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

static void cl_set_timeout(void *be, uint32_t timeout_ms)
{
	struct kvcl *cl = be;

	pthread_mutex_lock(&cl->lock);
	cl->timeout_ms = timeout_ms;
	for (size_t i = 0; i < cl->n_nodes; i++)
		if (cl->nodes[i]->e)
			kvc_engine_backend.set_timeout(cl->nodes[i]->e, timeout_ms);
	pthread_mutex_unlock(&cl->lock);
}

static void cl_set_busy_tries(void *be, uint32_t tries)
{
	struct kvcl *cl = be;

	pthread_mutex_lock(&cl->lock);
	cl->busy_tries = tries;
	for (size_t i = 0; i < cl->n_nodes; i++)
		if (cl->nodes[i]->e)
			kvc_engine_backend.set_busy_tries(cl->nodes[i]->e, tries);
	pthread_mutex_unlock(&cl->lock);
}

static int cl_get_limits(void *be, struct kvpool_limits *out)
{
	struct kvc_req r = { .op = KVC_OP_LIMITS };
	struct kvc_result res;
	int rc = cl_call(be, &r, &res);

	if (!rc)
		*out = res.limits;
	kvc_result_clear(&res);
	return rc;
}

static void cl_get_counters(void *be, struct kvpool_counters *out)
{
	struct kvcl *cl = be;
	struct kvpool_counters sum = { 0 };

	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvpool_counters k;

		if (!cl->nodes[i]->e)
			continue;
		kvc_engine_backend.get_counters(cl->nodes[i]->e, &k);
		sum.connects += k.connects;
		sum.reconnects += k.reconnects;
		sum.busy_retries += k.busy_retries;
		sum.checksum_errors += k.checksum_errors;
	}
	pthread_mutex_unlock(&cl->lock);
	*out = sum;
}

/* Pass a registration to every node (in order with its requests). */
static void post_regs_locked(struct kvcl *cl, enum kvcl_child_kind kind, const void *buf,
			     size_t len)
{
	for (size_t i = 0; i < cl->n_nodes; i++) {
		struct kvcl_child *c = kvcl_child_new(NULL, cl->nodes[i], 0);

		if (!c)
			continue; /* that node moves those buffers through staging */
		c->kind = kind;
		c->buf = buf;
		c->len = len;
		kvcl_node_post_locked(c);
	}
}

static int cl_reg(void *be, const void *buf, size_t len)
{
	struct kvcl *cl = be;
	size_t at;
	int rc;

	pthread_mutex_lock(&cl->lock);
	rc = kvc_regions_add(&cl->regions, buf, len, &at);
	if (!rc)
		post_regs_locked(cl, CHILD_REG, buf, len);
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

static int cl_unreg(void *be, const void *buf)
{
	struct kvcl *cl = be;
	long i;

	pthread_mutex_lock(&cl->lock);
	i = kvc_regions_index(&cl->regions, buf);
	if (i >= 0) {
		kvc_regions_remove(&cl->regions, (size_t)i);
		post_regs_locked(cl, CHILD_UNREG, buf, 0);
	}
	pthread_mutex_unlock(&cl->lock);
	return i >= 0 ? 0 : (int)i;
}

static void cl_close(void *be)
{
	struct kvcl *cl = be;

	if (!cl)
		return;
	kvcl_etcd_stop(cl);
	for (size_t i = 0; i < cl->n_nodes; i++)
		kvcl_node_stop(cl->nodes[i]);
	while (cl->parents)
		parent_free(cl, cl->parents);
	while (cl->detached) {
		struct kvcl_child *c = cl->detached;

		cl->detached = c->sibling;
		kvc_result_clear(&c->res);
		free(c->own_buf);
		free(c);
	}
	while (cl->removals) {
		struct kvcl_removal *rm = cl->removals;

		cl->removals = rm->next;
		free(rm->keys);
		free(rm);
	}
	for (size_t i = 0; i < cl->n_nodes; i++)
		free(cl->nodes[i]);
	if (cl->efd >= 0)
		close(cl->efd);
	kvc_regions_free(&cl->regions);
	kvcl_place_free(&cl->place);
	free(cl->spare);
	pthread_cond_destroy(&cl->child_cond);
	pthread_cond_destroy(&cl->done_cond);
	pthread_mutex_destroy(&cl->lock);
	free(cl->token);
	kvc_tls_ctx_unref(cl->tls);
	free(cl);
}

const struct kvc_backend kvcl_backend = {
	.call = cl_call,
	.submit = cl_submit,
	.poll = cl_poll,
	.cancel = cl_cancel,
	.event_fd = cl_event_fd,
	.inflight = cl_inflight,
	.set_max_inflight = cl_set_max_inflight,
	.set_timeout = cl_set_timeout,
	.set_busy_tries = cl_set_busy_tries,
	.get_limits = cl_get_limits,
	.get_counters = cl_get_counters,
	.reg = cl_reg,
	.unreg = cl_unreg,
	.close = cl_close,
};

/* ---- open ------------------------------------------------------------------------------ */

int kvcl_is_cluster_url(const char *url)
{
	return url && (strchr(url, ',') || strncmp(url, "etcd://", 7) == 0);
}

int kvcl_set_segment_blocks(struct kvcl *cl, uint32_t blocks)
{
	(void)cl; /* placement is per block now: kept for the callers of before */
	return blocks > 65536 ? -EINVAL : 0;
}

/* The settings of a cluster URL's query ("?budget_ms=100&hot_replicas=3"),
 * taken off the URL into url_out. Errors: -EINVAL (an unknown name, a
 * value out of range, too long). */
static int url_settings(const char *url, char *url_out, size_t cap, uint32_t *budget_ms,
			uint32_t *replicas, uint32_t *hot_children, uint64_t *fallback_ms)
{
	const char *q = strchr(url, '?');
	size_t base = q ? (size_t)(q - url) : strlen(url);
	char query[256];

	if (base + 1 > cap)
		return -EINVAL;
	memcpy(url_out, url, base);
	url_out[base] = '\0';
	if (!q)
		return 0;
	if (strlen(q + 1) >= sizeof(query) || !q[1])
		return -EINVAL;
	snprintf(query, sizeof(query), "%s", q + 1);
	for (char *save = NULL, *kv = strtok_r(query, "&", &save); kv;
	     kv = strtok_r(NULL, "&", &save)) {
		char *eq = strchr(kv, '='), *end;
		unsigned long long v;

		if (!eq || !eq[1])
			return -EINVAL;
		*eq = '\0';
		errno = 0;
		v = strtoull(eq + 1, &end, 10);
		if (errno || *end || eq[1] == '-')
			return -EINVAL;
		if (!strcmp(kv, "budget_ms") && v <= 3600000)
			*budget_ms = (uint32_t)v;
		else if (!strcmp(kv, "hot_replicas") && v >= 1 && v <= KVCL_MAX_REPLICAS)
			*replicas = (uint32_t)v;
		else if (!strcmp(kv, "hot_children") && v <= 65535)
			*hot_children = (uint32_t)v;
		else if (!strcmp(kv, "fallback_ms") && v <= 86400000ULL)
			*fallback_ms = v;
		else
			return -EINVAL;
	}
	return 0;
}

/* Members now (under no lock). */
static size_t members_now(struct kvcl *cl)
{
	size_t n = 0;

	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->n_nodes; i++)
		n += cl->nodes[i]->member != 0;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

int kvcl_open(const char *url, const char *ns, const char *token, uint32_t timeout_ms,
	      struct kvc_tls_ctx *tls, struct kvcl **out)
{
	struct kvc_req connect = { .op = KVC_OP_LIMITS };
	uint32_t budget_ms = KVCL_DEFAULT_BUDGET_MS, replicas = KVPOOL_HOT_REPLICAS;
	uint32_t hot_children = KVCL_HOT_DEFAULT_CHILDREN;
	uint64_t fallback_ms = KVCL_DEFAULT_FALLBACK_MS;
	char base[4096];
	struct kvc_result res;
	struct kvcl *cl;
	int rc;

	if (!proto_name_valid(ns, strlen(ns)) || (token && strlen(token) > PROTO_TOKEN_MAX_BYTES))
		return -EINVAL;
	rc = url_settings(url, base, sizeof(base), &budget_ms, &replicas, &hot_children,
			  &fallback_ms);
	if (rc)
		return rc;
	url = base;
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return -ENOMEM;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->done_cond, NULL);
	pthread_cond_init(&cl->child_cond, NULL);
	cl->efd = -1;
	cl->max = KVPOOL_DEFAULT_MAX_INFLIGHT;
	cl->timeout_ms = timeout_ms;
	cl->tls = kvc_tls_ctx_ref(tls);
	snprintf(cl->ns, sizeof(cl->ns), "%s", ns);
	cl->budget_ms = budget_ms;
	rc = kvcl_place_init(&cl->place, replicas, hot_children, fallback_ms);
	if (!rc && token && !(cl->token = strdup(token)))
		rc = -ENOMEM;
	if (!rc && strncmp(url, "etcd://", 7) == 0) {
		rc = kvc_etcd_url_parse(url, cl->endpoint, sizeof(cl->endpoint), cl->cluster,
					sizeof(cl->cluster));
		if (rc == 0)
			rc = kvcl_etcd_start(cl);
		/* No node registered under that name (a typo, or the nodes are
		 * starting): wait a little, then refuse rather than swallow. */
		for (uint64_t t0 = kvc_now_ms(); rc == 0 && !members_now(cl);) {
			if (kvc_now_ms() - t0 >= KVCL_EMPTY_GRACE_MS) {
				rc = -ENXIO;
				break;
			}
			nanosleep(&(struct timespec){ 0, 50 * 1000000L }, NULL);
		}
	} else if (!rc) {
		rc = kvcl_static_members(cl, url);
	}
	/* Connect to the members there are now. A list none of whose nodes
	 * answers is refused like one node; with etcd, nodes that are down
	 * are not errors (nodes come and go), but when none is reached
	 * because each refused the handshake or the session (-EPROTO: a TLS
	 * CA, certificate or key the nodes do not accept; -EACCES: the token,
	 * or a plaintext URL on a tls_only port), that is the caller's
	 * configuration: refused, with the first node's reason, rather than
	 * a handle whose every call misses. */
	if (!rc) {
		rc = cl_call(cl, &connect, &res);
		kvc_result_clear(&res);
		if (cl->endpoint[0] && rc != -EPROTO && rc != -EACCES)
			rc = 0;
	}
	if (rc) {
		cl_close(cl);
		return rc;
	}
	*out = cl;
	return 0;
}
