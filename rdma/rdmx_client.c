/*
 * rdmx_client.c - libkvpool's side of rdma_cm: connect, register caller
 * memory for the server's READs and WRITEs, and one control message out,
 * one reply in (the client never posts READ or WRITE itself).
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdmx_impl.h"

struct rdmx_client {
	struct rdmx_conn conn;
	struct rdma_event_channel *ch;
	struct ibv_context **devices;
};

struct rdmx_client_mr {
	struct ibv_mr *mr;
};

/* Milliseconds of CLOCK_MONOTONIC. */
static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait until fd is readable or deadline_ms passes. */
static int wait_fd(int fd, uint64_t deadline_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint64_t now = now_ms();
	int rc;

	if (now >= deadline_ms)
		return -ETIMEDOUT;
	rc = poll(&p, 1, (int)(deadline_ms - now));
	if (rc < 0)
		return errno == EINTR ? 0 : -errno;
	return rc == 0 ? -ETIMEDOUT : 0;
}

/* Wait for CM event `want` on the client's channel. */
static int wait_cm(struct rdmx_client *cl, enum rdma_cm_event_type want, uint64_t deadline_ms)
{
	const struct rdmx_ops *ops = cl->conn.ops;
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type got;
	int status;

	for (;;) {
		if (ops->get_cm_event(cl->ch, &ev) == 0)
			break;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return rdmx_errno();
		int rc = wait_fd(cl->ch->fd, deadline_ms);

		if (rc)
			return rc;
	}
	got = ev->event;
	status = ev->status;
	ops->ack_cm_event(ev);
	if (got == want)
		return 0;
	if (got == RDMA_CM_EVENT_REJECTED)
		return -ECONNREFUSED;
	if (got == RDMA_CM_EVENT_ADDR_ERROR || got == RDMA_CM_EVENT_ROUTE_ERROR ||
	    got == RDMA_CM_EVENT_UNREACHABLE)
		return -EHOSTUNREACH;
	return status < 0 ? status : -ECONNRESET;
}

/* Resolve host:port and the route to it. */
static int resolve(struct rdmx_client *cl, const char *host, uint16_t port, uint32_t timeout_ms,
		   uint64_t deadline_ms)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	char service[8];
	int rc;

	snprintf(service, sizeof(service), "%u", port);
	if (getaddrinfo(host, service, &hints, &ai) || !ai)
		return -ENOENT;
	rc = cl->conn.ops->resolve_addr(cl->conn.id, NULL, ai->ai_addr, (int)timeout_ms) ?
	     rdmx_errno() : 0;
	freeaddrinfo(ai);
	if (rc == 0)
		rc = wait_cm(cl, RDMA_CM_EVENT_ADDR_RESOLVED, deadline_ms);
	if (rc == 0)
		rc = cl->conn.ops->resolve_route(cl->conn.id, (int)timeout_ms) ? rdmx_errno() : 0;
	if (rc == 0)
		rc = wait_cm(cl, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline_ms);
	return rc;
}

int rdmx_client_connect(const char *host, uint16_t port, uint32_t timeout_ms,
			const struct rdmx_ops *ops, struct rdmx_client **out)
{
	struct rdmx_client *cl = calloc(1, sizeof(*cl));
	struct rdma_conn_param param = { 0 };
	uint64_t deadline_ms = now_ms() + timeout_ms;
	const char *why = NULL;
	int n = 0, rc;

	if (!cl)
		return -ENOMEM;
	cl->conn.ops = ops ? ops : &rdmx_ops_real;
	cl->devices = cl->conn.ops->get_devices(&n);
	if (!cl->devices || n <= 0) {
		rc = -ENODEV;
		goto out_close;
	}
	cl->ch = cl->conn.ops->create_event_channel();
	if (!cl->ch) {
		rc = rdmx_errno();
		goto out_close;
	}
	rc = rdmx_set_nonblock(cl->ch->fd);
	if (rc)
		goto out_close;
	if (cl->conn.ops->create_id(cl->ch, &cl->conn.id, cl, RDMA_PS_TCP)) {
		rc = rdmx_errno();
		cl->conn.id = NULL;
		goto out_close;
	}
	cl->conn.state = RDMX_CONN_RESOLVING;
	rc = resolve(cl, host, port, timeout_ms, deadline_ms);
	if (rc)
		goto out_close;
	cl->conn.pd = cl->conn.ops->alloc_pd(cl->conn.id->verbs);
	if (!cl->conn.pd) {
		rc = rdmx_errno();
		goto out_close;
	}
	rc = rdmx_conn_setup_qp(&cl->conn, &why);
	if (rc)
		goto out_close;
	/* The server READs from us: let it have reads in flight. */
	param.responder_resources = 16;
	param.initiator_depth = 0;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	cl->conn.state = RDMX_CONN_CONNECTING;
	if (cl->conn.ops->connect(cl->conn.id, &param)) {
		rc = rdmx_errno();
		goto out_close;
	}
	rc = wait_cm(cl, RDMA_CM_EVENT_ESTABLISHED, deadline_ms);
	if (rc)
		goto out_close;
	cl->conn.state = RDMX_CONN_ESTABLISHED;
	*out = cl;
	return 0;

out_close:
	rdmx_client_close(cl);
	return rc;
}

void rdmx_client_close(struct rdmx_client *cl)
{
	const struct rdmx_ops *ops;

	if (!cl)
		return;
	ops = cl->conn.ops;
	/* QP, buffers, CQ, channel and id; then the PD, which they all used. */
	rdmx_conn_teardown(&cl->conn);
	if (cl->conn.pd)
		ops->dealloc_pd(cl->conn.pd);
	if (cl->ch)
		ops->destroy_event_channel(cl->ch);
	if (cl->devices)
		ops->free_devices(cl->devices);
	free(cl);
}

int rdmx_client_reg(struct rdmx_client *cl, void *buf, size_t len, struct rdmx_client_mr **out)
{
	struct rdmx_client_mr *m;

	if (!cl || !buf || !len)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->mr = cl->conn.ops->reg_mr(cl->conn.pd, buf, len,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				     IBV_ACCESS_REMOTE_WRITE);
	if (!m->mr) {
		int rc = rdmx_errno();

		free(m);
		return rc;
	}
	*out = m;
	return 0;
}

uint32_t rdmx_client_mr_rkey(const struct rdmx_client_mr *m)
{
	return m->mr->rkey;
}

void rdmx_client_dereg(struct rdmx_client *cl, struct rdmx_client_mr *m)
{
	if (!m)
		return;
	cl->conn.ops->dereg_mr(m->mr);
	free(m);
}

/* Take the CM events pending on the client's channel (never blocks): a
 * DISCONNECTED (the server left or dropped us) or any error event fails
 * the connection. Returns 0 or -ECONNRESET. */
static int check_cm(struct rdmx_client *cl)
{
	const struct rdmx_ops *ops = cl->conn.ops;
	struct rdma_cm_event *ev;

	while (ops->get_cm_event(cl->ch, &ev) == 0) {
		enum rdma_cm_event_type got = ev->event;

		ops->ack_cm_event(ev);
		if (got == RDMA_CM_EVENT_DISCONNECTED || got == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    got == RDMA_CM_EVENT_TIMEWAIT_EXIT || got == RDMA_CM_EVENT_CONNECT_ERROR ||
		    got == RDMA_CM_EVENT_UNREACHABLE)
			cl->conn.state = RDMX_CONN_ERROR;
	}
	return cl->conn.state == RDMX_CONN_ESTABLISHED ? 0 : -ECONNRESET;
}

/* Take completions from the CQ one at a time until it is empty or a
 * message is in: with several requests outstanding, later replies stay
 * in the CQ until the caller has taken this one (the connection keeps
 * one received message at a time). Returns the number of completions
 * handled, or -ECONNRESET (an error completion or a verbs failure). */
static int drain_cq(struct rdmx_conn *c)
{
	struct ibv_wc wc;
	int handled = 0;

	while (!c->recv_ready) {
		int n = c->ops->poll_cq(c->cq, 1, &wc);

		if (n < 0) {
			c->state = RDMX_CONN_ERROR;
			return -ECONNRESET;
		}
		if (n == 0)
			break;
		if (rdmx_conn_handle_wc(c, &wc))
			return -ECONNRESET;
		handled++;
	}
	return handled;
}

/* Wait until the completion channel or the CM channel is readable, or
 * the deadline passes. */
static int wait_either(struct rdmx_client *cl, uint64_t deadline_ms)
{
	struct pollfd p[2] = { { .fd = cl->conn.comp->fd, .events = POLLIN },
			       { .fd = cl->ch->fd, .events = POLLIN } };
	uint64_t now = now_ms();
	int rc;

	if (now >= deadline_ms)
		return -ETIMEDOUT;
	rc = poll(p, 2, (int)(deadline_ms - now));
	if (rc < 0)
		return errno == EINTR ? 0 : -errno;
	return rc == 0 ? -ETIMEDOUT : 0;
}

/* Service the CQ (and watch the CM channel for the server leaving) until
 * a reply message is in or the deadline passes. */
static int wait_reply(struct rdmx_client *cl, uint64_t deadline_ms)
{
	struct rdmx_conn *c = &cl->conn;
	struct ibv_cq *cq;
	void *ctx;
	int n, rc;

	for (;;) {
		n = drain_cq(c);
		if (n < 0)
			return n;
		if (c->recv_ready)
			return 0;
		if (n > 0)
			continue;
		rc = check_cm(cl);
		if (rc)
			return rc;
		if (c->ops->req_notify_cq(c->cq, 0)) {
			c->state = RDMX_CONN_ERROR;
			return -ECONNRESET;
		}
		n = drain_cq(c); /* a completion may have raced the arm */
		if (n < 0)
			return n;
		if (c->recv_ready)
			return 0;
		if (n > 0)
			continue;
		rc = wait_either(cl, deadline_ms);
		if (rc)
			return rc;
		if (c->ops->get_cq_event(c->comp, &cq, &ctx) == 0)
			c->cq_events++;
		if (c->cq_events >= 16) {
			c->ops->ack_cq_events(c->cq, c->cq_events);
			c->cq_events = 0;
		}
	}
}

int rdmx_client_send(struct rdmx_client *cl, const void *msg, size_t msg_bytes)
{
	struct rdmx_conn *c = &cl->conn;
	int rc = check_cm(cl);

	if (rc)
		return rc;
	rc = rdmx_conn_send(c, msg, msg_bytes);
	if (rc == -EAGAIN) {
		/* Every send buffer in flight: reap SEND completions and retry. */
		rc = drain_cq(c);
		if (rc < 0)
			return rc;
		rc = rdmx_conn_send(c, msg, msg_bytes);
	}
	if (rc == -ENOTCONN || (rc < 0 && rc != -EMSGSIZE && rc != -EAGAIN)) {
		c->state = RDMX_CONN_ERROR;
		return -ECONNRESET;
	}
	return rc;
}

/* The message the CQ delivered (c->recv_ready): copy it out and post its
 * receive buffer again. */
static int take_message(struct rdmx_conn *c, void *buf, size_t cap, size_t *bytes)
{
	int rc = 0;

	c->recv_ready = 0;
	if (c->recv_bytes > cap) {
		rc = -ENOBUFS;
	} else {
		memcpy(buf, rdmx_recv_buf(c, c->recv_slot), c->recv_bytes);
		*bytes = c->recv_bytes;
	}
	if (rdmx_conn_post_recv(c, c->recv_slot)) {
		c->state = RDMX_CONN_ERROR;
		return -ECONNRESET;
	}
	return rc;
}

int rdmx_client_recv(struct rdmx_client *cl, void *buf, size_t cap, size_t *bytes,
		     uint32_t timeout_ms)
{
	int rc = wait_reply(cl, now_ms() + timeout_ms);

	if (rc)
		return rc;
	return take_message(&cl->conn, buf, cap, bytes);
}

int rdmx_client_try_recv(struct rdmx_client *cl, void *buf, size_t cap, size_t *bytes)
{
	struct rdmx_conn *c = &cl->conn;
	struct ibv_cq *cq;
	void *ctx;
	int n, rc;

	/* Take the channel's events (its fd is non-blocking), so that it is
	 * readable again only for completions that come after this. */
	while (c->ops->get_cq_event(c->comp, &cq, &ctx) == 0)
		if (++c->cq_events >= 16) {
			c->ops->ack_cq_events(c->cq, c->cq_events);
			c->cq_events = 0;
		}
	n = drain_cq(c);
	if (n < 0)
		return n;
	if (!c->recv_ready) {
		rc = check_cm(cl);
		if (rc)
			return rc;
		if (c->ops->req_notify_cq(c->cq, 0)) {
			c->state = RDMX_CONN_ERROR;
			return -ECONNRESET;
		}
		n = drain_cq(c); /* a completion may have raced the arm */
		if (n < 0)
			return n;
		if (!c->recv_ready)
			return -EAGAIN;
	}
	return take_message(c, buf, cap, bytes);
}

int rdmx_client_fds(const struct rdmx_client *cl, int fds[2])
{
	fds[0] = cl->conn.comp->fd;
	fds[1] = cl->ch->fd;
	return 0;
}

int rdmx_client_call(struct rdmx_client *cl, const void *msg, size_t msg_bytes, void *buf,
		     size_t cap, size_t *bytes, uint32_t timeout_ms)
{
	int rc = rdmx_client_send(cl, msg, msg_bytes);

	if (rc)
		return rc;
	return rdmx_client_recv(cl, buf, cap, bytes, timeout_ms);
}

bool rdmx_client_ok(struct rdmx_client *cl)
{
	return cl && check_cm(cl) == 0;
}
