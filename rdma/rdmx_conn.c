/*
 * rdmx_conn.c - one RDMA connection: its QP, CQ and completion channel,
 * the ring of control-message buffers, completion handling, and the
 * bounded, pipelined READ/WRITE transfers of the server.
 *
 * Setup order (undone in reverse by rdmx_conn_teardown): completion
 * channel, CQ (armed), QP, message buffers and their MR, RECVs posted;
 * then the caller accepts or connects.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "rdmx_impl.h"

#define CQ_DRAIN_BATCH 16
#define CQ_ACK_EVERY 64

bool rdmx_built(void)
{
	return true;
}

int rdmx_errno(void)
{
	return errno > 0 ? -errno : -EIO;
}

int rdmx_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

uint8_t *rdmx_recv_buf(struct rdmx_conn *c, uint32_t i)
{
	return c->msgs + (size_t)i * RDMX_MSG_MAX_BYTES;
}

uint8_t *rdmx_send_buf(struct rdmx_conn *c, uint32_t i)
{
	return c->msgs + (size_t)(RDMX_MSG_DEPTH + i) * RDMX_MSG_MAX_BYTES;
}

int rdmx_conn_post_recv(struct rdmx_conn *c, uint32_t i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)rdmx_recv_buf(c, i),
		.length = RDMX_MSG_MAX_BYTES,
		.lkey = c->msg_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = RDMX_WR_ID(RDMX_WR_RECV, i), .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;
	int rc = c->ops->post_recv(c->id->qp, &wr, &bad);

	return rc ? -abs(rc) : 0;
}

/* The QP's capacities: every transfer WR and every send buffer may be in
 * flight at once, plus one RECV per receive buffer. */
static void qp_attr(struct rdmx_conn *c, struct ibv_qp_init_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->send_cq = c->cq;
	a->recv_cq = c->cq;
	a->qp_type = IBV_QPT_RC;
	a->cap.max_send_wr = RDMX_QP_MAX_XFER + RDMX_MSG_DEPTH;
	a->cap.max_recv_wr = RDMX_MSG_DEPTH;
	a->cap.max_send_sge = 1;
	a->cap.max_recv_sge = 1;
}

/* Allocate and register the message buffers. */
static int msgs_setup(struct rdmx_conn *c)
{
	size_t bytes = (size_t)2 * RDMX_MSG_DEPTH * RDMX_MSG_MAX_BYTES;

	c->msgs = malloc(bytes);
	if (!c->msgs)
		return -ENOMEM;
	c->msg_mr = c->ops->reg_mr(c->pd, c->msgs, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!c->msg_mr)
		return rdmx_errno();
	return 0;
}

int rdmx_conn_setup_qp(struct rdmx_conn *c, const char **why)
{
	struct ibv_context *ctx = c->id->verbs;
	struct ibv_qp_init_attr attr;
	int cqe = RDMX_QP_MAX_XFER + 2 * RDMX_MSG_DEPTH;
	int rc;

	c->comp = c->ops->create_comp_channel(ctx);
	if (!c->comp) {
		*why = "cannot create a completion channel";
		rc = rdmx_errno();
		goto out_teardown;
	}
	rc = rdmx_set_nonblock(c->comp->fd);
	if (rc) {
		*why = "cannot make the completion channel non-blocking";
		goto out_teardown;
	}
	c->cq = c->ops->create_cq(ctx, cqe, c, c->comp, 0);
	if (!c->cq) {
		*why = "cannot create a completion queue";
		rc = rdmx_errno();
		goto out_teardown;
	}
	rc = c->ops->req_notify_cq(c->cq, 0);
	if (rc) {
		*why = "cannot arm the completion queue";
		rc = -abs(rc);
		goto out_teardown;
	}
	qp_attr(c, &attr);
	if (c->ops->create_qp(c->id, c->pd, &attr)) {
		*why = "cannot create the queue pair";
		rc = rdmx_errno();
		goto out_teardown;
	}
	c->qp_created = 1;
	rc = msgs_setup(c);
	if (rc) {
		*why = "cannot register the message buffers";
		goto out_teardown;
	}
	for (uint32_t i = 0; i < RDMX_MSG_DEPTH; i++) {
		rc = rdmx_conn_post_recv(c, i);
		if (rc) {
			*why = "cannot post a receive";
			goto out_teardown;
		}
	}
	return 0;

out_teardown:
	rdmx_conn_teardown(c);
	return rc;
}

void rdmx_conn_teardown(struct rdmx_conn *c)
{
	if (c->id && (c->state == RDMX_CONN_ESTABLISHED || c->state == RDMX_CONN_ERROR))
		c->ops->disconnect(c->id);
	else if (c->id && c->cbs && c->state == RDMX_CONN_IDLE)
		c->ops->reject(c->id, NULL, 0); /* a request we never accepted */
	if (c->qp_created)
		c->ops->destroy_qp(c->id);
	c->qp_created = 0;
	if (c->msg_mr)
		c->ops->dereg_mr(c->msg_mr);
	c->msg_mr = NULL;
	free(c->msgs);
	c->msgs = NULL;
	if (c->cq) {
		if (c->cq_events)
			c->ops->ack_cq_events(c->cq, c->cq_events);
		c->cq_events = 0;
		c->ops->destroy_cq(c->cq);
	}
	c->cq = NULL;
	if (c->comp)
		c->ops->destroy_comp_channel(c->comp);
	c->comp = NULL;
	if (c->id)
		c->ops->destroy_id(c->id);
	c->id = NULL;
	/* The QP is gone: its outstanding work requests will never complete. */
	if (c->budget)
		c->budget->outstanding -= c->outstanding;
	c->outstanding = 0;
	c->state = RDMX_CONN_CLOSED;
}

int rdmx_conn_fd(const struct rdmx_conn *c)
{
	return c->comp ? c->comp->fd : -1;
}

enum rdmx_conn_state rdmx_conn_state(const struct rdmx_conn *c)
{
	return c->state;
}

uint32_t rdmx_conn_outstanding(const struct rdmx_conn *c)
{
	return c->outstanding;
}

int rdmx_conn_send(struct rdmx_conn *c, const void *msg, size_t bytes)
{
	struct ibv_send_wr wr = { 0 }, *bad = NULL;
	struct ibv_sge sge;
	uint32_t i;
	int rc;

	if (bytes == 0 || bytes > RDMX_MSG_MAX_BYTES)
		return -EMSGSIZE;
	if (c->state != RDMX_CONN_ESTABLISHED)
		return -ENOTCONN;
	for (i = 0; i < RDMX_MSG_DEPTH && (c->send_busy & (1u << i)); i++)
		;
	if (i == RDMX_MSG_DEPTH)
		return -EAGAIN;
	memcpy(rdmx_send_buf(c, i), msg, bytes);
	sge = (struct ibv_sge){ .addr = (uintptr_t)rdmx_send_buf(c, i), .length = (uint32_t)bytes,
				.lkey = c->msg_mr->lkey };
	wr.wr_id = RDMX_WR_ID(RDMX_WR_SEND, i);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	rc = c->ops->post_send(c->id->qp, &wr, &bad);
	if (rc)
		return -abs(rc);
	c->send_busy |= 1u << i;
	return 0;
}

/* Post transfer items while the QP and the worker have room. */
static int xfer_post(struct rdmx_conn *c)
{
	while (c->xfer_active && c->next_item < c->n_items && c->outstanding < RDMX_QP_MAX_XFER &&
	       c->budget->outstanding < c->budget->max) {
		const struct rdmx_xfer_item *it = &c->items[c->next_item];
		struct ibv_sge sge = { .addr = (uintptr_t)it->local, .length = it->length,
				       .lkey = c->w->l->arena_mr->lkey };
		struct ibv_send_wr wr = { 0 }, *bad = NULL;
		int rc;

		wr.wr_id = RDMX_WR_ID(RDMX_WR_XFER, c->next_item);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = c->op == RDMX_XFER_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = it->remote_addr;
		wr.wr.rdma.rkey = it->rkey;
		rc = c->ops->post_send(c->id->qp, &wr, &bad);
		if (rc)
			return -abs(rc);
		c->next_item++;
		c->outstanding++;
		c->budget->outstanding++;
	}
	return 0;
}

/* Is local[0..length) inside the arena MR? */
static bool in_arena(const struct ibv_mr *mr, const void *local, uint32_t length)
{
	uintptr_t a = (uintptr_t)local, base = (uintptr_t)mr->addr;

	return a >= base && length <= mr->length && a - base <= mr->length - length;
}

int rdmx_conn_xfer(struct rdmx_conn *c, enum rdmx_xfer_op op, const struct rdmx_xfer_item *items,
		   uint32_t n)
{
	struct rdmx_xfer_item *copy;
	int rc;

	if (c->state != RDMX_CONN_ESTABLISHED)
		return -ENOTCONN;
	if (c->xfer_active)
		return -EBUSY;
	if (n == 0)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (items[i].length == 0 || !in_arena(c->w->l->arena_mr, items[i].local, items[i].length))
			return -EINVAL;
	copy = realloc(c->items, (size_t)n * sizeof(*copy));
	if (!copy)
		return -ENOMEM;
	memcpy(copy, items, (size_t)n * sizeof(*copy));
	c->items = copy;
	c->n_items = n;
	c->next_item = 0;
	c->done_items = 0;
	c->op = op;
	c->xfer_active = 1;
	rc = xfer_post(c);
	if (rc) {
		/* Nothing reports this transfer: the caller gets the error now
		 * and the connection is failed (items may be in flight). */
		c->xfer_active = 0;
		c->state = RDMX_CONN_ERROR;
		return rc;
	}
	return 0;
}

/* A RECV completed: hand the message up and post the buffer again. */
static int handle_recv(struct rdmx_conn *c, uint32_t slot, uint32_t bytes)
{
	if (slot >= RDMX_MSG_DEPTH)
		return -EIO;
	if (!c->cbs) { /* client: kept until rdmx_client_call takes it */
		c->recv_ready = 1;
		c->recv_slot = slot;
		c->recv_bytes = bytes;
		return 0;
	}
	/* A message can complete before the ESTABLISHED event is read from
	 * the CM channel (the two are not ordered): a successful receive
	 * proves the connection is up, so it is not dropped. */
	if (c->state == RDMX_CONN_CONNECTING)
		c->state = RDMX_CONN_ESTABLISHED;
	if (c->state == RDMX_CONN_ESTABLISHED)
		c->cbs->on_msg(c, rdmx_recv_buf(c, slot), bytes, c->arg);
	if (c->state == RDMX_CONN_CLOSED || c->state == RDMX_CONN_ERROR)
		return 0;
	return rdmx_conn_post_recv(c, slot);
}

int rdmx_conn_handle_wc(struct rdmx_conn *c, const struct ibv_wc *wc)
{
	unsigned int kind = RDMX_WR_KIND(wc->wr_id);
	uint32_t slot = RDMX_WR_SLOT(wc->wr_id);

	/* Whatever failed, the work request is no longer outstanding. */
	if (kind == RDMX_WR_SEND && slot < RDMX_MSG_DEPTH) {
		c->send_busy &= ~(1u << slot);
		c->send_done = 1;
	}
	if (kind == RDMX_WR_XFER && c->outstanding) {
		c->outstanding--;
		if (c->budget)
			c->budget->outstanding--;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		c->state = RDMX_CONN_ERROR;
		return -EIO;
	}
	switch (kind) {
	case RDMX_WR_RECV:
		if (handle_recv(c, slot, wc->byte_len)) {
			c->state = RDMX_CONN_ERROR;
			return -EIO;
		}
		return 0;
	case RDMX_WR_SEND:
		return 0;
	case RDMX_WR_XFER:
		c->done_items++;
		return 0;
	default:
		c->state = RDMX_CONN_ERROR;
		return -EIO;
	}
}

/* Take the CQ event (if any), acknowledge in batches, re-arm, then drain
 * the CQ. Returns 0 or -EIO (an error completion or a verbs failure). */
static int cq_service(struct rdmx_conn *c, const char **why)
{
	struct ibv_wc wc[CQ_DRAIN_BATCH];
	struct ibv_cq *cq;
	void *ctx;
	int n;

	if (c->ops->get_cq_event(c->comp, &cq, &ctx) == 0 && ++c->cq_events >= CQ_ACK_EVERY) {
		c->ops->ack_cq_events(c->cq, c->cq_events);
		c->cq_events = 0;
	}
	/* Re-arm before draining, so that a completion landing after the
	 * last poll still raises an event. */
	if (c->ops->req_notify_cq(c->cq, 0)) {
		*why = "cannot re-arm the completion queue";
		c->state = RDMX_CONN_ERROR;
		return -EIO;
	}
	do {
		n = c->ops->poll_cq(c->cq, CQ_DRAIN_BATCH, wc);
		if (n < 0) {
			*why = "polling the completion queue failed";
			c->state = RDMX_CONN_ERROR;
			return -EIO;
		}
		for (int i = 0; i < n; i++) {
			if (rdmx_conn_handle_wc(c, &wc[i])) {
				*why = wc[i].status != IBV_WC_SUCCESS ?
				       ibv_wc_status_str(wc[i].status) : "unexpected completion";
				return -EIO;
			}
			if (c->state == RDMX_CONN_CLOSED || c->close_reason)
				return 0;
		}
	} while (n == CQ_DRAIN_BATCH);
	return 0;
}

/* Other connections of the worker may wait for budget this one freed. */
static void kick_waiters(struct rdmx_worker *w, struct rdmx_conn *self)
{
	for (struct rdmx_conn *o = w->conns; o && w->budget.outstanding < w->budget.max; o = o->next)
		if (o != self && o->xfer_active && o->next_item < o->n_items &&
		    o->state == RDMX_CONN_ESTABLISHED && xfer_post(o))
			o->state = RDMX_CONN_ERROR; /* its next completion event closes it */
}

/* The transfer finished: report it (once). */
static void xfer_check_done(struct rdmx_conn *c)
{
	if (c->xfer_active && c->done_items == c->n_items) {
		c->xfer_active = 0;
		c->cbs->on_xfer_done(c, 0, c->arg);
	}
}

void rdmx_conn_completions(struct rdmx_conn *c)
{
	const char *why = NULL;
	int rc;

	c->in_completions = 1;
	rc = cq_service(c, &why);
	if (rc == 0 && c->state == RDMX_CONN_ESTABLISHED && !c->close_reason) {
		if (xfer_post(c)) {
			why = "cannot post a transfer";
			rc = -EIO;
		} else {
			xfer_check_done(c);
		}
	}
	c->in_completions = 0;
	if (c->w)
		kick_waiters(c->w, c);
	if (c->close_reason)
		rdmx_conn_close(c, c->close_reason);
	else if (rc || c->state == RDMX_CONN_ERROR)
		rdmx_conn_close(c, why ? why : "work request failed");
}

void rdmx_conn_close(struct rdmx_conn *c, const char *reason)
{
	struct rdmx_worker *w;

	if (!c)
		return;
	if (c->in_completions) {
		if (!c->close_reason)
			c->close_reason = reason;
		return;
	}
	w = c->w;
	rdmx_conn_teardown(c);
	if (w) {
		if (c->prev)
			c->prev->next = c->next;
		else
			w->conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
	}
	if (c->cbs)
		c->cbs->on_close(c, reason, c->arg);
	free(c->items);
	free(c);
}
