/*
 * nodes.c - a thread per node drives the node's engine (cluster_impl.h):
 * it takes the children posted to the node's inbox, connects the engine
 * when needed, submits them, and polls the engine, merging each finished
 * child into its parent. So N nodes' sends, receives and checksums run
 * on N threads, as librdkafka runs a thread per broker connection.
 *
 * A node whose engine could not connect, or that lost a request to a
 * connection error or to the call's budget, is down: placement skips it
 * and the children it still gets (whole-pool calls) fail at once with its
 * last error. Its thread probes it in the background - a fresh
 * connection and HELLO - after a back-off that starts at KVCL_RETRY_MS and
 * doubles to KVCL_RETRY_MAX_MS while the probes fail; calls never push
 * the probe back (a busy client once kept a restarted node "down" for
 * good that way). When a probe answers, the node is up again, and the
 * removals it missed (DELETE, DROP_NAMESPACE) are sent to it first. A
 * node that left the membership, or whose address changed, gets its
 * engine closed once nothing of it is in flight.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cluster_impl.h"
#include "lib/clock.h"
#include "lib/net/frame.h"

#define NODE_POLL_BATCH 64

void kvcl_node_post_locked(struct kvcl_child *c)
{
	struct kvcl_node *n = c->node;
	uint64_t one = 1;

	c->next = NULL;
	c->state = CH_QUEUED;
	if (n->inbox_tail)
		n->inbox_tail->next = c;
	else
		n->inbox = c;
	n->inbox_tail = c;
	if (write(n->wake_fd, &one, sizeof(one)) < 0) {
		/* the counter is already nonzero: the thread wakes anyway */
	}
}

void kvcl_node_ended_locked(struct kvcl_child *c)
{
	uint64_t one = 1;

	c->ended = 1;
	c->node->ended_children++;
	if (write(c->node->wake_fd, &one, sizeof(one)) < 0) {
		/* the counter is already nonzero: the thread wakes anyway */
	}
}

/* Only ended waits are on node n's engine: they sit parked at the node,
 * and whatever is sent next would wait behind them. Drop the connection
 * (the node forgets waiters whose client left) and them with it; the next
 * child gets a fresh engine (cl->lock held). */
static void node_flush_ended_locked(struct kvcl *cl, struct kvcl_node *n)
{
	if (!n->e || !n->ended_children || n->ended_children != n->engine_children)
		return;
	kvc_engine_close(n->e);
	n->e = NULL;
	n->engine_children = n->ended_children = 0;
	for (struct kvcl_parent *p = cl->parents, *next; p; p = next) {
		struct kvcl_child *last = NULL;

		next = p->next; /* p may be freed below */
		for (struct kvcl_child *c = p->children; c; c = c->sibling) {
			if (c->node != n || c->ended != 1)
				continue;
			c->ended = 2;
			if (last)
				p->holds--;
			last = c;
		}
		if (last)
			kvcl_child_drop_locked(cl, last); /* the last hold: may free p */
	}
}

void kvcl_node_failed_locked(struct kvcl_node *n, int rc)
{
	n->reachable = 0;
	n->last_error = rc;
	n->last_msg[0] = '\0';
	if (n->down)
		return; /* the probe's time stands: calls do not put it off */
	n->down = 1;
	n->downs++;
	n->backoff_ms = KVCL_RETRY_MS;
	n->retry_at_ms = kvc_now_ms() + n->backoff_ms;
}

void kvcl_node_up_locked(struct kvcl_node *n)
{
	n->down = 0;
	n->backoff_ms = 0;
	n->retry_at_ms = 0;
	n->reachable = 1;
	n->last_error = 0;
	n->last_msg[0] = '\0';
}

void kvcl_removal_add_locked(struct kvcl *cl, struct kvcl_node *n, int op, const char *ns,
			     const uint8_t (*keys)[KVPOOL_KEY_BYTES], size_t n_keys)
{
	struct kvcl_removal *rm = calloc(1, sizeof(*rm)), **tail = &cl->removals;

	if (!rm)
		return;
	rm->node = n;
	rm->op = op;
	if (ns)
		snprintf(rm->ns, sizeof(rm->ns), "%s", ns);
	if (n_keys) {
		rm->keys = malloc(n_keys * KVPOOL_KEY_BYTES);
		if (!rm->keys) {
			free(rm);
			return;
		}
		memcpy(rm->keys, keys, n_keys * KVPOOL_KEY_BYTES);
		rm->n = n_keys;
	}
	while (*tail)
		tail = &(*tail)->next;
	*tail = rm;
}

size_t kvcl_removals_pending_locked(const struct kvcl *cl)
{
	size_t n = 0;

	for (const struct kvcl_removal *rm = cl->removals; rm; rm = rm->next)
		n++;
	return n;
}

/* Send node n the removals it missed (cl->lock held; n is up). */
static void post_removals_locked(struct kvcl *cl, struct kvcl_node *n)
{
	for (struct kvcl_removal *rm = cl->removals; rm; rm = rm->next) {
		struct kvcl_child *c;

		if (rm->node != n || rm->posted)
			continue;
		c = kvcl_child_new(NULL, n, rm->n * sizeof(int) + 8);
		if (!c)
			return;
		c->job = JOB_REMOVAL;
		c->removal = rm;
		c->st = (int *)(c + 1);
		c->r = (struct kvc_req){ .op = rm->op == KVC_OP_DROP ? KVC_OP_DROP : KVPOOL_OP_DELETE,
					 .keys = (const uint8_t(*)[KVPOOL_KEY_BYTES])rm->keys,
					 .count = rm->n, .statuses = c->st,
					 .ns = rm->op == KVC_OP_DROP ? rm->ns : NULL,
					 .tag = (uint64_t)(uintptr_t)c,
					 .deadline_ms = kvc_deadline_ms(cl->timeout_ms ? cl->timeout_ms
									: KVPOOL_DEFAULT_TIMEOUT_MS) };
		rm->posted = 1;
		kvcl_node_post_locked(c);
	}
}

/* Child c is finished with err before reaching the engine (with the
 * node's refusal message, if it gave one). */
static void child_fail_locked(struct kvcl *cl, struct kvcl_child *c, int err)
{
	if (c->state != CH_DONE) {
		c->state = CH_DONE;
		c->res.status = err;
		if (c->node->last_msg[0] && !c->res.msg)
			c->res.msg = strdup(c->node->last_msg);
		for (size_t i = 0; c->st && c->r.op != KVPOOL_OP_MATCH && i < c->r.count; i++)
			c->st[i] = err;
		kvcl_child_merge_locked(cl, c);
	}
	kvcl_child_drop_locked(cl, c);
}

/* The engine finished child c (done's results are moved into it). */
static void child_done_locked(struct kvcl *cl, struct kvcl_node *n, struct kvc_done *d)
{
	struct kvcl_child *c = (struct kvcl_child *)(uintptr_t)d->c.tag;
	int s = d->c.status;

	n->engine_children--;
	if (c->ended == 1) {
		n->ended_children--;
		c->ended = 2;
	}
	if (c->state == CH_DONE) { /* cancelled: its parent no longer waits for it */
		kvc_result_clear(&d->res);
		kvcl_child_drop_locked(cl, c);
		return;
	}
	c->state = CH_DONE;
	c->res = d->res;
	if (s == -ETIMEDOUT) {
		n->budget_expired++;
		cl->budget_expired++;
	}
	if (kvcl_is_conn_error(s)) {
		kvcl_node_failed_locked(n, s);
	} else {
		n->reachable = 1;
		n->last_error = 0;
	}
	kvcl_child_merge_locked(cl, c);
	kvcl_child_drop_locked(cl, c);
}

/* A new engine for node n, with the cluster's settings and regions. */
static struct kvc_engine *node_engine(struct kvcl *cl, const char *url, int *err)
{
	struct kvc_engine *e;

	*err = kvc_engine_open(url, cl->ns, cl->token, cl->timeout_ms, cl->tls, &e);
	if (*err)
		return NULL;
	kvc_engine_backend.set_max_inflight(e, KVPOOL_MAX_INFLIGHT_LIMIT);
	kvc_engine_backend.set_busy_tries(e, cl->busy_tries);
	pthread_mutex_lock(&cl->lock);
	for (size_t i = 0; i < cl->regions.n; i++)
		(void)kvc_engine_backend.reg(e, (const void *)cl->regions.r[i].start,
					     cl->regions.r[i].len_bytes);
	pthread_mutex_unlock(&cl->lock);
	return e;
}

/* Connect node n's engine e, its HELLO bounded like a probe's (the
 * budget, at least KVCL_PROBE_MIN_MS, when the URL did not turn the budget
 * off) rather than by the call timeout: a node that is frozen (SIGSTOP, a
 * stalled machine) accepts the TCP connection and never answers, and
 * every new handle would otherwise wait the whole timeout for it. The
 * floor keeps a first connect (a TLS handshake, a loaded machine) from
 * marking a healthy node down. Past the bound the node is down like any
 * node that does not answer, and its thread probes it in the background. */
static int node_connect(struct kvcl *cl, struct kvc_engine *e)
{
	uint32_t timeout, bound;
	int rc;

	pthread_mutex_lock(&cl->lock);
	timeout = cl->timeout_ms ? cl->timeout_ms : KVPOOL_DEFAULT_TIMEOUT_MS;
	bound = cl->budget_ms > KVCL_PROBE_MIN_MS ? cl->budget_ms : KVCL_PROBE_MIN_MS;
	if (!cl->budget_ms || bound > timeout)
		bound = timeout;
	pthread_mutex_unlock(&cl->lock);
	kvc_engine_backend.set_timeout(e, bound);
	rc = kvc_engine_connect(e);
	pthread_mutex_lock(&cl->lock);
	kvc_engine_backend.set_timeout(e, cl->timeout_ms);
	pthread_mutex_unlock(&cl->lock);
	return rc;
}

/* Hand child c to node n's engine. */
static void child_submit(struct kvcl *cl, struct kvcl_node *n, struct kvcl_child *c)
{
	uint64_t id = 0;
	int rc;

	pthread_mutex_lock(&cl->lock);
	if (c->state == CH_DONE) { /* cancelled while queued */
		kvcl_child_drop_locked(cl, c);
		pthread_mutex_unlock(&cl->lock);
		return;
	}
	c->state = CH_SUBMITTING;
	pthread_mutex_unlock(&cl->lock);
	rc = kvc_engine_submit(n->e, &c->r, KVC_SUBMIT_NOCONNECT, &id);
	pthread_mutex_lock(&cl->lock);
	if (rc == 0) {
		c->state = CH_ENGINE;
		c->engine_id = id;
		n->engine_children++;
		if (c->ended && c->p) {
			/* its parent stopped waiting for it meanwhile */
			kvcl_node_ended_locked(c);
			c->state = CH_DONE;
			if (--c->p->pending == 0)
				kvcl_parent_complete_locked(cl, c->p);
		}
	} else {
		if (kvcl_is_conn_error(rc))
			kvcl_node_failed_locked(n, rc);
		c->state = CH_QUEUED;
		child_fail_locked(cl, c, rc);
	}
	pthread_cond_broadcast(&cl->child_cond);
	pthread_mutex_unlock(&cl->lock);
}

/* Work through the children taken from the inbox, in order. */
static void node_run(struct kvcl *cl, struct kvcl_node *n, struct kvcl_child *list)
{
	char url[sizeof(n->url)];
	int down, err, reqs = 0;

	for (struct kvcl_child *c = list; c; c = c->next)
		reqs |= c->kind == CHILD_REQ;
	pthread_mutex_lock(&cl->lock);
	down = n->down;
	err = n->last_error ? n->last_error : -ECONNREFUSED;
	memcpy(url, n->url, sizeof(url));
	pthread_mutex_unlock(&cl->lock);
	if (!down && !n->e) {
		struct kvc_engine *e = node_engine(cl, url, &err);

		pthread_mutex_lock(&cl->lock);
		n->e = e;
		n->url_changed = 0;
		if (!e)
			kvcl_node_failed_locked(n, err);
		pthread_mutex_unlock(&cl->lock);
		down = !e;
	}
	if (!down && reqs) {
		int rc;

		/* a failed TLS handshake says why in this thread's message */
		kvc_frame_set_last_message(NULL);
		rc = node_connect(cl, n->e);
		if (rc) {
			struct kvc_engine_info info;

			kvc_engine_info(n->e, &info); /* a HELLO refusal's words */
			if (!info.server_message[0])
				info.server_message = kvpool_last_server_message();
			pthread_mutex_lock(&cl->lock);
			if (kvcl_is_conn_error(rc)) {
				kvcl_node_failed_locked(n, rc);
			} else {
				/* it answers and refuses (-EACCES): not down, its
				 * shares say so */
				n->reachable = 1;
				n->last_error = rc;
			}
			snprintf(n->last_msg, sizeof(n->last_msg), "%s", info.server_message);
			pthread_mutex_unlock(&cl->lock);
			down = 1;
			err = rc;
		}
	}
	while (list) {
		struct kvcl_child *c = list;

		list = c->next;
		if (c->kind != CHILD_REQ) {
			if (n->e && c->kind == CHILD_REG)
				(void)kvc_engine_backend.reg(n->e, c->buf, c->len);
			else if (n->e)
				(void)kvc_engine_backend.unreg(n->e, c->buf);
			pthread_mutex_lock(&cl->lock);
			kvcl_child_drop_locked(cl, c);
			pthread_mutex_unlock(&cl->lock);
		} else if (down || kvc_now_ms() >= c->r.deadline_ms) {
			pthread_mutex_lock(&cl->lock);
			child_fail_locked(cl, c, down ? err : -ETIMEDOUT);
			pthread_mutex_unlock(&cl->lock);
		} else {
			child_submit(cl, n, c);
		}
	}
}

/* Close the engine of a node that left or moved, once nothing of it is in
 * flight (the next child makes a new one). */
static void node_idle_locked(struct kvcl_node *n)
{
	if (!n->e || n->engine_children || n->inbox || (n->member && !n->url_changed))
		return;
	kvc_engine_close(n->e);
	n->e = NULL;
	n->url_changed = 0;
	n->retry_at_ms = 0;
}

/* Wait (cl->lock released) for the inbox, the engine, or the next probe. */
static void node_wait(struct kvcl *cl, struct kvcl_node *n)
{
	struct pollfd p[2] = { { .fd = n->wake_fd, .events = POLLIN } };
	uint64_t now = kvc_now_ms();
	int timeout = -1;
	nfds_t k = 1;

	if (n->e) {
		int fd = kvc_engine_backend.event_fd(n->e);

		if (fd >= 0)
			p[k++] = (struct pollfd){ .fd = fd, .events = POLLIN };
	}
	if (n->down && n->member)
		timeout = n->retry_at_ms > now ? (int)(n->retry_at_ms - now) : 0;
	pthread_mutex_unlock(&cl->lock);
	(void)poll(p, k, timeout);
	pthread_mutex_lock(&cl->lock);
}

/* Node n is down and its probe is due (cl->lock held, released while
 * probing): a fresh connection and HELLO, apart from the node's engine,
 * with a short timeout. */
static void node_probe_locked(struct kvcl *cl, struct kvcl_node *n)
{
	char url[sizeof(n->url)];
	struct kvc_engine *pe = NULL;
	uint32_t t = cl->budget_ms > KVCL_PROBE_MIN_MS ? cl->budget_ms : KVCL_PROBE_MIN_MS;
	int rc;

	memcpy(url, n->url, sizeof(url));
	n->probes++;
	pthread_mutex_unlock(&cl->lock);
	rc = kvc_engine_open(url, cl->ns, cl->token, t, cl->tls, &pe);
	if (!rc)
		rc = kvc_engine_connect(pe);
	kvc_engine_close(pe);
	pthread_mutex_lock(&cl->lock);
	if (rc == 0 || rc == -EACCES) {
		/* it answers (a refusal is the request's business, not the node's) */
		if (n->e && !n->engine_children) {
			kvc_engine_close(n->e); /* a fresh connection for what comes next */
			n->e = NULL;
		}
		kvcl_node_up_locked(n);
		post_removals_locked(cl, n);
		return;
	}
	n->last_error = rc;
	n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : KVCL_RETRY_MS;
	if (n->backoff_ms > KVCL_RETRY_MAX_MS)
		n->backoff_ms = KVCL_RETRY_MAX_MS;
	n->retry_at_ms = kvc_now_ms() + n->backoff_ms;
}

static void *node_thread(void *arg)
{
	struct kvcl_node *n = arg;
	struct kvcl *cl = n->cl;
	struct kvc_done done[NODE_POLL_BATCH];

	pthread_mutex_lock(&cl->lock);
	while (!n->quit) {
		struct kvcl_child *list;
		uint64_t v;
		int got;

		node_flush_ended_locked(cl, n); /* before anything is sent behind them */
		list = n->inbox;

		n->inbox = n->inbox_tail = NULL;
		pthread_mutex_unlock(&cl->lock);
		if (read(n->wake_fd, &v, sizeof(v)) < 0) {
			/* nothing posted since the last read */
		}
		if (list)
			node_run(cl, n, list);
		got = n->e ? kvc_engine_poll_ex(n->e, done, NODE_POLL_BATCH) : 0;
		pthread_mutex_lock(&cl->lock);
		for (int i = 0; i < got; i++)
			child_done_locked(cl, n, &done[i]);
		node_idle_locked(n);
		if (n->down && n->member && !n->quit && kvc_now_ms() >= n->retry_at_ms)
			node_probe_locked(cl, n);
		else if (!n->down && cl->removals)
			post_removals_locked(cl, n);
		if (!n->inbox && got < NODE_POLL_BATCH && !n->quit)
			node_wait(cl, n);
	}
	pthread_mutex_unlock(&cl->lock);
	return NULL;
}

int kvcl_node_start(struct kvcl_node *n)
{
	int rc;

	n->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (n->wake_fd < 0)
		return -errno;
	rc = -pthread_create(&n->thread, NULL, node_thread, n);
	if (rc) {
		close(n->wake_fd);
		n->wake_fd = -1;
		return rc;
	}
	n->has_thread = 1;
	return 0;
}

void kvcl_node_stop(struct kvcl_node *n)
{
	struct kvcl *cl = n->cl;
	uint64_t one = 1;

	pthread_mutex_lock(&cl->lock);
	n->quit = 1;
	if (n->wake_fd >= 0 && write(n->wake_fd, &one, sizeof(one)) < 0) {
		/* already readable */
	}
	pthread_mutex_unlock(&cl->lock);
	if (n->has_thread)
		pthread_join(n->thread, NULL);
	n->has_thread = 0;
	/* Requests in flight are dropped with the engine; their parents and
	 * detached children are freed by the cluster. */
	kvc_engine_close(n->e);
	n->e = NULL;
	if (n->wake_fd >= 0)
		close(n->wake_fd);
	n->wake_fd = -1;
}
