/*
 * srv_rdma_conn.c - requests over RDMA connections: the message queue,
 * the PUT READ and GET WRITE transfers, replies by SEND, and teardown.
 * See srv_rdma_conn.h.
 */
#include "srv_rdma_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "rdmx.h"
#include "srv_clock.h"
#include "srv_get.h"
#include "srv_log.h"
#include "srv_put.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

/* What the request being handled waits for. */
enum rconn_stage {
	RCONN_IDLE,      /* nothing: the next queued message may be handled */
	RCONN_PROMOTE,   /* a GET waits for NVMe promotions */
	RCONN_PUT_READ,  /* the RDMA READ of a PUT's blocks */
	RCONN_GET_WRITE, /* the RDMA WRITE of a GET's blocks */
};

/* A control message copied out of its RECV buffer. */
struct rconn_msg {
	uint8_t *data;
	uint32_t bytes;
};

struct srv_rconn {
	struct srv_conn *c;
	struct rdmx_conn *conn;         /* NULL once on_close ran */
	struct event *ev_cq;            /* the completion channel fd */
	struct rconn_msg q[RDMX_MSG_DEPTH];
	uint32_t q_head, q_count;
	struct rconn_msg cur;           /* the request being handled (owned) */
	const uint8_t *descs;           /* its descriptors (RDMX_DESC_BYTES each, one
					 * per entry; in cur), or NULL */
	struct evbuffer *out;           /* the reply being built, sent as one SEND */
	enum rconn_stage stage;
	int xfer_done;                  /* the transfer of `stage` completed */
	uint64_t xfer_bytes;            /* bytes of that transfer */
	struct rdmx_xfer_item *items;
	uint32_t items_cap;
	int in_cb;                      /* c must outlive the current callback */
	int closed;                     /* on_close ran: free at the end of it */
	int close_level;
	char close_reason[96];
};

static void rconn_pump(struct srv_conn *c);
static const struct srv_transport rconn_ops;

/* ---- teardown ----------------------------------------------------------- */

/* Free what the transport part holds and release c (srv_conn_release). */
static void rconn_final(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;

	srv_log(r->close_level, "conn %" PRIu64 " %s: closed: %s%s", c->id, c->peer,
		r->close_reason, c->get_pending ? " (freed once its nvme reads end)" : "");
	if (r->ev_cq)
		event_free(r->ev_cq);
	for (uint32_t i = 0; i < r->q_count; i++)
		free(r->q[(r->q_head + i) % RDMX_MSG_DEPTH].data);
	free(r->cur.data);
	free(r->items);
	evbuffer_free(r->out);
	c->rdma = NULL;
	srv_put_free(c);
	free(r);
	srv_stats_add(&c->w->stats, SRV_C_rdma_conns_current, (uint64_t)-1);
	srv_conn_release(c);
}

/* rdmx_conn_cbs.on_close: the QP is destroyed, so no DMA can touch the
 * reservations or pinned blocks any more: give them back. */
static void rconn_on_close(struct rdmx_conn *rc, const char *reason, void *arg)
{
	struct srv_conn *c = arg;
	struct srv_rconn *r = c->rdma;

	(void)rc;
	r->conn = NULL;
	r->closed = 1;
	if (!r->close_reason[0])
		snprintf(r->close_reason, sizeof(r->close_reason), "%s", reason);
	if ((r->stage == RCONN_PUT_READ || r->stage == RCONN_GET_WRITE) && !r->xfer_done)
		srv_stats_add(&c->w->stats, SRV_C_rdma_xfer_errors, 1);
	srv_put_abort(c);
	if (r->stage == RCONN_GET_WRITE)
		srv_get_release(c);
	r->stage = RCONN_IDLE;
	if (!r->in_cb)
		rconn_final(c);
}

/* Close the connection (from our own code): on_close follows at once,
 * or at the end of the completion callback running now. */
static void rconn_abort(struct srv_conn *c, int level, const char *reason)
{
	struct srv_rconn *r = c->rdma;

	if (!r->conn)
		return;
	if (!r->close_reason[0]) {
		r->close_level = level;
		snprintf(r->close_reason, sizeof(r->close_reason), "%s", reason);
	}
	/* Off the event base before the completion channel's fd closes. */
	if (r->ev_cq)
		event_del(r->ev_cq);
	rdmx_conn_close(r->conn, reason);
}

/* srv_transport.close. */
static void rconn_close(struct srv_conn *c, int level, const char *reason)
{
	struct srv_rconn *r = c->rdma;
	int nested = r->in_cb;

	r->in_cb = 1;
	rconn_abort(c, level, reason);
	r->in_cb = nested;
	if (!nested && r->closed)
		rconn_final(c);
}

/* ---- engine callbacks ------------------------------------------------------ */

/* rdmx_conn_cbs.on_msg: queue a copy (msg is valid during the call only). */
static void rconn_on_msg(struct rdmx_conn *rc, const uint8_t *msg, size_t bytes, void *arg)
{
	struct srv_conn *c = arg;
	struct srv_rconn *r = c->rdma;
	struct rconn_msg *m;

	c->last_active_ms = srv_now_ms();
	if (c->state == SRV_CONN_CLOSING)
		return; /* after a fatal error reply: drained, never answered */
	if (r->q_count + (r->cur.data != NULL) >= RDMX_MSG_DEPTH) {
		/* The peer ignored its credit (PROTOCOL.md section 13): the
		 * request in hand is outstanding too, so this is one more
		 * than RDMX_MSG_DEPTH. */
		snprintf(r->close_reason, sizeof(r->close_reason),
			 "more than %u requests outstanding", RDMX_MSG_DEPTH);
		r->close_level = SRV_LOG_WARN;
		rdmx_conn_close(rc, r->close_reason);
		return;
	}
	m = &r->q[(r->q_head + r->q_count) % RDMX_MSG_DEPTH];
	m->data = malloc(bytes ? bytes : 1);
	if (!m->data) {
		snprintf(r->close_reason, sizeof(r->close_reason), "out of memory");
		r->close_level = SRV_LOG_WARN;
		rdmx_conn_close(rc, r->close_reason);
		return;
	}
	memcpy(m->data, msg, bytes);
	m->bytes = (uint32_t)bytes;
	r->q_count++;
}

/* rdmx_conn_cbs.on_xfer_done: only success reaches here (a failure closes
 * the connection); the request moves on in rconn_pump. */
static void rconn_on_xfer_done(struct rdmx_conn *rc, int status, void *arg)
{
	struct srv_conn *c = arg;
	struct srv_rconn *r = c->rdma;

	(void)rc;
	if (status)
		return;
	r->xfer_done = 1;
	c->last_active_ms = srv_now_ms();
	srv_stats_add(&c->w->stats, r->stage == RCONN_PUT_READ ? SRV_C_rdma_bytes_read :
								  SRV_C_rdma_bytes_written, r->xfer_bytes);
}

static const struct rdmx_conn_cbs rconn_cbs = {
	.on_msg = rconn_on_msg,
	.on_xfer_done = rconn_on_xfer_done,
	.on_close = rconn_on_close,
};

/* The completion channel is readable: completions first, then whatever
 * they made possible. */
static void rconn_cq_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;
	struct srv_rconn *r = c->rdma;

	(void)fd;
	(void)what;
	r->in_cb = 1;
	rdmx_conn_completions(r->conn);
	if (!r->closed)
		rconn_pump(c);
	r->in_cb = 0;
	if (r->closed)
		rconn_final(c);
}

void srv_rconn_cm_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_worker *w = arg;

	(void)fd;
	(void)what;
	rdmx_worker_cm_events(w->rdma);
}

/* ---- replies ----------------------------------------------------------------- */

/* Send what the handlers queued in r->out as one message. A reply over
 * RDMX_MSG_MAX_BYTES (only STATS can be) is replaced by a TOO_LARGE
 * error. Returns 0 (sent or nothing to send), 1 (every send buffer is in
 * flight: retried on the next completion) or -1 (the connection is
 * closing). */
static int rconn_flush(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;
	size_t len = evbuffer_get_length(r->out);
	int rc;

	if (!len)
		return 0;
	if (len > RDMX_MSG_MAX_BYTES) {
		evbuffer_drain(r->out, len);
		if (srv_conn_reply_error(c, PROTO_STATUS_TOO_LARGE, SRV_QUOTE_NONE,
					 "reply of %zu bytes exceeds the rdma message limit of %u "
					 "bytes; ask for one namespace, or over tcp", len,
					 RDMX_MSG_MAX_BYTES) < 0) {
			rconn_abort(c, SRV_LOG_WARN, "aborted: out of memory");
			return -1;
		}
		len = evbuffer_get_length(r->out);
	}
	rc = rdmx_conn_send(r->conn, evbuffer_pullup(r->out, -1), len);
	if (rc == -EAGAIN)
		return 1;
	if (rc < 0) {
		rconn_abort(c, SRV_LOG_DEBUG, "cannot send a reply");
		return -1;
	}
	evbuffer_drain(r->out, len);
	c->replies_queued = 0;
	c->last_active_ms = srv_now_ms();
	return 0;
}

/* ---- requests ----------------------------------------------------------------- */

/* Room for n transfer items. Errors: -ENOMEM. */
static int items_reserve(struct srv_rconn *r, uint32_t n)
{
	struct rdmx_xfer_item *p;

	if (n <= r->items_cap)
		return 0;
	p = realloc(r->items, (size_t)n * sizeof(*p));
	if (!p)
		return -ENOMEM;
	r->items = p;
	r->items_cap = n;
	return 0;
}

/* Start transfer `op` of r->items[0..n) for stage `stage`. */
static int rconn_xfer(struct srv_rconn *r, enum rdmx_xfer_op op, uint32_t n, uint64_t bytes,
		      enum rconn_stage stage)
{
	int rc = rdmx_conn_xfer(r->conn, op, r->items, n);

	if (rc < 0)
		return rc;
	r->stage = stage;
	r->xfer_done = 0;
	r->xfer_bytes = bytes;
	return 0;
}

/* The PUT's blocks are reserved: READ every reserved one from its
 * descriptor. Refused blocks (EXISTS, BUSY, ...) are not read. */
static enum srv_next put_read(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;
	uint64_t bytes = 0;
	uint32_t n = 0;

	if (items_reserve(r, c->put_count) < 0) {
		srv_put_abort(c);
		return SRV_NEXT_ABORT;
	}
	for (uint32_t i = 0; i < c->put_count; i++) {
		const struct srv_put_slot *sl = &c->slots[i];
		struct rdmx_desc d;

		if (!sl->dst)
			continue;
		rdmx_desc_decode(r->descs + (size_t)i * RDMX_DESC_BYTES, &d);
		r->items[n++] = (struct rdmx_xfer_item){ .local = sl->dst, .length = d.length,
							 .remote_addr = d.addr, .rkey = d.rkey };
		bytes += d.length;
	}
	if (n == 0)
		return srv_put_finish(c, c->req_start_us) < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	if (rconn_xfer(r, RDMX_XFER_READ, n, bytes, RCONN_PUT_READ) < 0) {
		srv_stats_add(&c->w->stats, SRV_C_rdma_xfer_errors, 1);
		srv_put_abort(c);
		return SRV_NEXT_ABORT;
	}
	return SRV_NEXT_WAIT;
}

/* srv_transport.get_send: the GET of c has every slot settled: start the
 * RDMA WRITE of its OK blocks. Returns SRV_NEXT_WAIT (the reply follows
 * the WRITE's completion), SRV_NEXT_HEADER (nothing to write: the reply
 * is queued) or SRV_NEXT_ABORT (the pins are released; the connection
 * must close). */
static enum srv_next rconn_get_write(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;
	uint64_t bytes = 0;
	uint32_t n = 0;

	if (items_reserve(r, c->get_count) < 0) {
		srv_get_release(c);
		return SRV_NEXT_ABORT;
	}
	for (uint32_t i = 0; i < c->get_count; i++) {
		const struct srv_get_slot *g = &c->gets[i];
		struct rdmx_desc d;

		if (!g->ref.block)
			continue;
		rdmx_desc_decode(r->descs + (size_t)i * RDMX_DESC_BYTES, &d);
		r->items[n++] = (struct rdmx_xfer_item){ .local = (void *)g->ref.data,
							 .length = (uint32_t)g->ref.length,
							 .remote_addr = d.addr, .rkey = d.rkey };
		bytes += g->ref.length;
	}
	if (n == 0)
		return srv_get_answer(c) < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	if (rconn_xfer(r, RDMX_XFER_WRITE, n, bytes, RCONN_GET_WRITE) < 0) {
		srv_stats_add(&c->w->stats, SRV_C_rdma_xfer_errors, 1);
		srv_get_release(c);
		return SRV_NEXT_ABORT;
	}
	return SRV_NEXT_WAIT;
}

/* The request in hand is answered (or refused): forget its message. */
static void request_end(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;

	free(r->cur.data);
	r->cur.data = NULL;
	r->descs = NULL;
	c->hdr_have = 0;
	r->stage = RCONN_IDLE;
}

/* Move on after a handler returned `next`. Returns 0 when the next
 * message may be handled, 1 when the request waits, -1 when closing. */
static int rconn_next(struct srv_conn *c, enum srv_next next)
{
	struct srv_rconn *r = c->rdma;

	if (next == SRV_NEXT_PAYLOAD)
		next = put_read(c);
	switch (next) {
	case SRV_NEXT_WAIT:
		if (r->stage == RCONN_IDLE)
			r->stage = RCONN_PROMOTE;
		c->state = SRV_CONN_WAIT;
		return 1;
	case SRV_NEXT_HEADER:
	case SRV_NEXT_SKIP:
		request_end(c);
		c->state = SRV_CONN_HEADER;
		return 0;
	case SRV_NEXT_CLOSE:
		/* A fatal error reply: send it, then the linger of
		 * srv_conn_check_timeouts closes the connection. */
		request_end(c);
		c->state = SRV_CONN_CLOSING;
		c->closing_since_ms = srv_now_ms();
		return 0;
	case SRV_NEXT_ABORT:
	default:
		request_end(c);
		rconn_abort(c, SRV_LOG_WARN, "aborted: out of memory or transfer not started");
		return -1;
	}
}

/* Is the message m[0..n) exactly 32 + body_bytes (+ 16 * count for PUT
 * and GET) bytes? Sets r->descs for PUT and GET. A header that does
 * not decode passes: srv_conn_frame answers it. */
static int msg_size_ok(struct srv_conn *c, const uint8_t *m, size_t n)
{
	const struct proto_limits *l = &c->w->srv->limits;
	struct srv_rconn *r = c->rdma;
	struct proto_header h;
	const uint8_t *descs;
	uint32_t count = 0;

	r->descs = NULL;
	if (proto_header_decode(m, 0, l, &h) < 0)
		return 1;
	if (h.opcode != PROTO_OP_PUT && h.opcode != PROTO_OP_GET)
		return n == PROTO_HEADER_BYTES + (size_t)h.body_bytes;
	if (h.body_bytes >= sizeof(uint32_t) && n >= PROTO_HEADER_BYTES + sizeof(uint32_t))
		count = proto_get_u32(m + PROTO_HEADER_BYTES);
	if (rdmx_msg_descs(m, n, &h, count, &descs) < 0)
		return 0;
	r->descs = descs;
	return 1;
}

/* Handle the next queued message. Returns as rconn_next. */
static int rconn_handle(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;
	const uint8_t *m;
	size_t n;
	int err;

	r->cur = r->q[r->q_head];
	r->q[r->q_head].data = NULL;
	r->q_head = (r->q_head + 1) % RDMX_MSG_DEPTH;
	r->q_count--;
	m = r->cur.data;
	n = r->cur.bytes;
	if (n < PROTO_HEADER_BYTES) {
		request_end(c);
		rconn_abort(c, SRV_LOG_DEBUG, "message shorter than a frame header");
		return -1;
	}
	if (!msg_size_ok(c, m, n)) {
		proto_header_decode(m, 0, &c->w->srv->limits, &c->hdr);
		memcpy(c->hdr_raw, m, PROTO_HEADER_BYTES);
		c->hdr_have = PROTO_HEADER_BYTES;
		if (c->hdr.opcode == PROTO_OP_PUT)
			srv_stats_add(&c->w->stats, SRV_C_put_requests, 1);
		else if (c->hdr.opcode == PROTO_OP_GET)
			srv_stats_add(&c->w->stats, SRV_C_get_requests, 1);
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					   "rdma message of %zu bytes is not 32 + body_bytes + 16 * "
					   "count (PROTOCOL.md section 13)", n);
		return rconn_next(c, err < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER);
	}
	return rconn_next(c, srv_conn_frame(c, m, n));
}

/* Finish the transfer that completed: commit the PUT or answer the GET. */
static int rconn_xfer_finish(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;
	int rc;

	if (r->stage == RCONN_PUT_READ)
		rc = srv_put_finish(c, c->req_start_us);
	else
		rc = srv_get_answer(c);
	r->stage = RCONN_IDLE;
	return rconn_next(c, rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER);
}

/* Send the pending reply, finish a completed transfer, then handle queued
 * messages one at a time until one has to wait. */
static void rconn_pump(struct srv_conn *c)
{
	struct srv_rconn *r = c->rdma;

	while (!r->closed) {
		if (rconn_flush(c))
			return;
		if ((r->stage == RCONN_PUT_READ || r->stage == RCONN_GET_WRITE) && r->xfer_done) {
			if (rconn_xfer_finish(c) < 0)
				return;
			continue;
		}
		if (r->stage != RCONN_IDLE || c->state == SRV_CONN_CLOSING || !r->q_count)
			return;
		if (rconn_handle(c) < 0)
			return;
	}
}

/* srv_transport.request_done: the request that parked (SRV_NEXT_WAIT:
 * NVMe promotions) is done: continue with `next`, then handle the queued
 * messages. May close c. */
static void rconn_request_done(struct srv_conn *c, enum srv_next next)
{
	struct srv_rconn *r = c->rdma;
	int nested = r->in_cb;

	r->in_cb = 1;
	/* get_finish ran before this call: it may have started the WRITE
	 * (stage GET_WRITE), which must not be forgotten. */
	if (r->stage == RCONN_PROMOTE)
		r->stage = RCONN_IDLE;
	if (rconn_next(c, next) >= 0)
		rconn_pump(c);
	r->in_cb = nested;
	if (!nested && r->closed)
		rconn_final(c);
}

/* srv_transport.idle: between requests with nothing queued or unsent? */
static bool rconn_idle(const struct srv_conn *c)
{
	const struct srv_rconn *r = c->rdma;

	if (r->stage != RCONN_IDLE || r->q_count || evbuffer_get_length(r->out))
		return false;
	return c->state == SRV_CONN_HEADER || c->state == SRV_CONN_CLOSING;
}

/* ---- the transport's operations ------------------------------------------ */

static int rconn_reply_reserve(struct srv_conn *c, uint32_t bytes, uint8_t **p)
{
	struct evbuffer_iovec v;

	if (evbuffer_reserve_space(c->rdma->out, bytes, &v, 1) < 1)
		return -ENOMEM;
	*p = v.iov_base;
	return 0;
}

static void rconn_reply_commit(struct srv_conn *c, uint8_t *p, uint32_t bytes)
{
	struct evbuffer_iovec v = { .iov_base = p, .iov_len = bytes };

	evbuffer_commit_space(c->rdma->out, &v, 1);
}

/* GET bytes go by RDMA WRITE, never behind a reply. */
static int rconn_reply_block(struct srv_conn *c, const uint8_t *data, uint64_t len,
			     struct store_block *block)
{
	(void)data;
	(void)len;
	store_release(c->w->srv->store, block);
	return -EOPNOTSUPP;
}

static int rconn_reply_buffer(struct srv_conn *c, struct evbuffer *body)
{
	return evbuffer_add_buffer(c->rdma->out, body) < 0 ? -ENOMEM : 0;
}

static uint64_t rconn_pending(const struct srv_conn *c)
{
	return evbuffer_get_length(c->rdma->out);
}

/* The descriptor of entry i: where its bytes come from (PUT) or go (GET). */
static int rconn_entry_room(const struct srv_conn *c, uint32_t i, uint64_t *bytes)
{
	struct rdmx_desc d;

	if (!c->rdma->descs)
		return 0;
	rdmx_desc_decode(c->rdma->descs + (size_t)i * RDMX_DESC_BYTES, &d);
	*bytes = d.length;
	return 1;
}

static const struct srv_transport rconn_ops = {
	.reply_reserve = rconn_reply_reserve,
	.reply_commit = rconn_reply_commit,
	.reply_block = rconn_reply_block,
	.reply_buffer = rconn_reply_buffer,
	.pending = rconn_pending,
	.request_done = rconn_request_done,
	.idle = rconn_idle,
	.close = rconn_close,
	/* READs land without the CPU: the store hashes at commit. */
	.put_hashes = false,
	.entry_room = rconn_entry_room,
	.get_send = rconn_get_write,
};

/* ---- accept ------------------------------------------------------------------ */

int srv_rconn_open(struct srv_worker *w, void *req, uint64_t id)
{
	struct srv_conn *c = calloc(1, sizeof(*c));
	struct srv_rconn *r = calloc(1, sizeof(*r));
	int rc = -ENOMEM;

	if (!c || !r || !(r->out = evbuffer_new()))
		goto out_refuse;
	srv_conn_init(c, w, id, "rdma", &rconn_ops);
	c->rdma = r;
	r->c = c;
	r->close_level = SRV_LOG_DEBUG;
	rc = rdmx_conn_accept(w->rdma, req, &rconn_cbs, c, &r->conn);
	if (rc < 0)
		goto out_free; /* the request is refused and gone */
	srv_conn_attach(c);
	srv_stats_add(&w->stats, SRV_C_rdma_conns_current, 1);
	srv_stats_add(&w->stats, SRV_C_rdma_conns_total, 1);
	r->ev_cq = event_new(w->base, rdmx_conn_fd(r->conn), EV_READ | EV_PERSIST, rconn_cq_cb, c);
	if (!r->ev_cq || event_add(r->ev_cq, NULL) < 0) {
		rconn_close(c, SRV_LOG_WARN, "out of memory");
		return -ENOMEM;
	}
	srv_debug("conn %" PRIu64 " %s: open on worker %u", id, c->peer, w->index);
	return 0;

out_refuse:
	rdmx_listener_refuse(w->srv->rdma.listener, req);
out_free:
	if (r && r->out)
		evbuffer_free(r->out);
	free(r);
	free(c);
	__atomic_fetch_sub(&w->srv->conn_current, 1, __ATOMIC_RELAXED);
	srv_warn("conn %" PRIu64 " rdma: not accepted: %s", id, strerror(-rc));
	return rc;
}
