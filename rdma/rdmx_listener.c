/*
 * rdmx_listener.c - kvpoold's side of rdma_cm: the listener with the
 * arena's one memory region (main thread), per-worker event channels, and
 * accepting a connection onto a worker.
 */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "rdmx_impl.h"

#define LISTEN_BACKLOG 128

/* Write a one-line reason, with errno text, into why. */
__attribute__((format(printf, 4, 5)))
static void set_why(char *why, size_t why_len, int err, const char *fmt, ...)
{
	char msg[RDMX_REASON_BYTES];
	va_list ap;

	if (!why || !why_len)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (err)
		snprintf(why, why_len, "%s: %s", msg, strerror(-err));
	else
		snprintf(why, why_len, "%s", msg);
}

/* Bind l->id to listen:port. */
static int bind_listen(struct rdmx_listener *l, const char *listen, uint16_t port, char *why,
		       size_t why_len)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *ai = NULL;
	char service[8];
	int rc;

	snprintf(service, sizeof(service), "%u", port);
	if (getaddrinfo(listen, service, &hints, &ai) || !ai) {
		set_why(why, why_len, 0, "cannot resolve listen address %s", listen);
		return -EINVAL;
	}
	rc = l->ops->bind_addr(l->id, ai->ai_addr) ? rdmx_errno() : 0;
	freeaddrinfo(ai);
	if (rc) {
		set_why(why, why_len, rc, "cannot bind rdma_cm to %s port %u", listen, port);
		return rc;
	}
	if (l->ops->listen(l->id, LISTEN_BACKLOG)) {
		rc = rdmx_errno();
		set_why(why, why_len, rc, "cannot listen on rdma port %u", port);
		return rc;
	}
	return 0;
}

/* Register the whole arena once. Local access only: the server reads it
 * for WRITEs and the NIC writes it for READs that the server posts; no
 * remote access flag, so its rkey is worthless to anyone. */
static int arena_register(struct rdmx_listener *l, void *arena, uint64_t bytes, char *why,
			  size_t why_len)
{
	struct rlimit rl;
	int rc;

	l->arena_mr = l->ops->reg_mr(l->pd, arena, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (l->arena_mr)
		return 0;
	rc = rdmx_errno();
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		set_why(why, why_len, rc,
			"cannot register the %llu-byte arena with the NIC (RLIMIT_MEMLOCK is %llu bytes; "
			"raise ulimit -l)", (unsigned long long)bytes, (unsigned long long)rl.rlim_cur);
	else
		set_why(why, why_len, rc, "cannot register the %llu-byte arena with the NIC",
			(unsigned long long)bytes);
	return rc;
}

int rdmx_listener_open(const struct rdmx_listener_config *cfg, struct rdmx_listener **out,
		       char *why, size_t why_len)
{
	struct rdmx_listener *l = calloc(1, sizeof(*l));
	struct ibv_context *ctx;
	int n = 0, rc;

	if (!l) {
		set_why(why, why_len, -ENOMEM, "rdma listener");
		return -ENOMEM;
	}
	l->ops = cfg->ops ? cfg->ops : &rdmx_ops_real;
	l->devices = l->ops->get_devices(&n);
	if (!l->devices || n <= 0) {
		set_why(why, why_len, 0, "no RDMA device found (no RDMA NIC, or no kernel RDMA support)");
		rc = -ENODEV;
		goto out_close;
	}
	l->ch = l->ops->create_event_channel();
	if (!l->ch) {
		rc = rdmx_errno();
		set_why(why, why_len, rc, "cannot open the rdma_cm event channel");
		goto out_close;
	}
	rc = rdmx_set_nonblock(l->ch->fd);
	if (rc) {
		set_why(why, why_len, rc, "cannot make the rdma_cm channel non-blocking");
		goto out_close;
	}
	if (l->ops->create_id(l->ch, &l->id, l, RDMA_PS_TCP)) {
		rc = rdmx_errno();
		l->id = NULL;
		set_why(why, why_len, rc, "cannot create an rdma_cm id");
		goto out_close;
	}
	rc = bind_listen(l, cfg->listen, cfg->port, why, why_len);
	if (rc)
		goto out_close;
	/* Bound to a device's address, the id knows its device; bound to
	 * loopback or a wildcard it does not: use the first device. */
	ctx = l->id->verbs ? l->id->verbs : l->devices[0];
	l->pd = l->ops->alloc_pd(ctx);
	if (!l->pd) {
		rc = rdmx_errno();
		set_why(why, why_len, rc, "cannot allocate a protection domain");
		goto out_close;
	}
	rc = arena_register(l, cfg->arena, cfg->arena_bytes, why, why_len);
	if (rc)
		goto out_close;
	*out = l;
	return 0;

out_close:
	rdmx_listener_close(l);
	return rc;
}

void rdmx_listener_close(struct rdmx_listener *l)
{
	if (!l)
		return;
	if (l->arena_mr)
		l->ops->dereg_mr(l->arena_mr);
	if (l->pd)
		l->ops->dealloc_pd(l->pd);
	if (l->id)
		l->ops->destroy_id(l->id);
	if (l->ch)
		l->ops->destroy_event_channel(l->ch);
	if (l->devices)
		l->ops->free_devices(l->devices);
	free(l);
}

int rdmx_listener_fd(const struct rdmx_listener *l)
{
	return l->ch->fd;
}

int rdmx_listener_take(struct rdmx_listener *l, void **req)
{
	struct rdma_cm_event *ev;
	struct rdmx_request *r;

	for (;;) {
		if (l->ops->get_cm_event(l->ch, &ev))
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : rdmx_errno();
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			l->ops->ack_cm_event(ev);
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r) {
			struct rdma_cm_id *id = ev->id;

			l->ops->ack_cm_event(ev);
			l->ops->reject(id, NULL, 0);
			l->ops->destroy_id(id);
			return -ENOMEM;
		}
		r->id = ev->id;
		r->responder_resources = ev->param.conn.responder_resources;
		r->initiator_depth = ev->param.conn.initiator_depth;
		l->ops->ack_cm_event(ev);
		*req = r;
		return 1;
	}
}

void rdmx_listener_refuse(struct rdmx_listener *l, void *req)
{
	struct rdmx_request *r = req;

	if (!r)
		return;
	l->ops->reject(r->id, NULL, 0);
	l->ops->destroy_id(r->id);
	free(r);
}

int rdmx_worker_open(struct rdmx_listener *l, struct rdmx_worker **out)
{
	struct rdmx_worker *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return -ENOMEM;
	w->l = l;
	w->budget.max = RDMX_WORKER_MAX_XFER;
	w->ch = l->ops->create_event_channel();
	if (!w->ch) {
		rc = rdmx_errno();
		goto out_free;
	}
	rc = rdmx_set_nonblock(w->ch->fd);
	if (rc)
		goto out_destroy_channel;
	*out = w;
	return 0;

out_destroy_channel:
	l->ops->destroy_event_channel(w->ch);
out_free:
	free(w);
	return rc;
}

void rdmx_worker_close(struct rdmx_worker *w)
{
	if (!w)
		return;
	while (w->conns)
		rdmx_conn_close(w->conns, "server shutting down");
	w->l->ops->destroy_event_channel(w->ch);
	free(w);
}

int rdmx_worker_fd(const struct rdmx_worker *w)
{
	return w->ch->fd;
}

struct rdmx_budget *rdmx_worker_budget(struct rdmx_worker *w)
{
	return &w->budget;
}

/* Refuse request r after a failed accept step. */
static void accept_refuse(struct rdmx_worker *w, struct rdmx_request *r)
{
	rdmx_listener_refuse(w->l, r);
}

int rdmx_conn_accept(struct rdmx_worker *w, void *req, const struct rdmx_conn_cbs *cbs,
		     void *arg, struct rdmx_conn **out)
{
	struct rdmx_request *r = req;
	struct rdma_conn_param param = { 0 };
	struct rdmx_conn *c;
	const char *why = NULL;
	int rc;

	if (r->id->verbs != w->l->pd->context) {
		accept_refuse(w, r); /* the arena MR lives on another device */
		return -ENODEV;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		accept_refuse(w, r);
		return -ENOMEM;
	}
	c->ops = w->l->ops;
	c->w = w;
	c->pd = w->l->pd;
	c->budget = &w->budget;
	c->cbs = cbs;
	c->arg = arg;
	if (c->ops->migrate_id(r->id, w->ch)) {
		rc = rdmx_errno();
		goto out_refuse;
	}
	c->id = r->id;
	c->id->context = c;
	rc = rdmx_conn_setup_qp(c, &why);
	if (rc) {
		/* setup_qp destroyed the id: only the request struct is left. */
		free(r);
		free(c);
		return rc;
	}
	/* We initiate READs up to what the client lets us have in flight. */
	param.initiator_depth = r->responder_resources;
	param.responder_resources = r->initiator_depth;
	param.rnr_retry_count = 7;
	c->state = RDMX_CONN_CONNECTING;
	if (c->ops->accept(c->id, &param)) {
		rc = rdmx_errno();
		c->ops->reject(c->id, NULL, 0);
		rdmx_conn_teardown(c);
		free(r);
		free(c);
		return rc;
	}
	free(r);
	c->next = w->conns;
	if (w->conns)
		w->conns->prev = c;
	w->conns = c;
	*out = c;
	return 0;

out_refuse:
	accept_refuse(w, r);
	free(c);
	return rc;
}

/* What a CM event means for an accepted connection. */
static void conn_cm_event(struct rdmx_conn *c, enum rdma_cm_event_type type)
{
	switch (type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->state == RDMX_CONN_CONNECTING)
			c->state = RDMX_CONN_ESTABLISHED;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		rdmx_conn_close(c, "peer disconnected");
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		rdmx_conn_close(c, "RDMA device removed");
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_REJECTED:
		rdmx_conn_close(c, "connection failed before it was established");
		break;
	default:
		break;
	}
}

void rdmx_worker_cm_events(struct rdmx_worker *w)
{
	struct rdma_cm_event *ev;

	while (w->l->ops->get_cm_event(w->ch, &ev) == 0) {
		struct rdmx_conn *c = ev->id ? ev->id->context : NULL;
		enum rdma_cm_event_type type = ev->event;

		/* Acknowledge first: destroying an id waits for its events. */
		w->l->ops->ack_cm_event(ev);
		if (c)
			conn_cm_event(c, type);
	}
}
