/*
 * srv_conn.c - a client connection: input state machine, output flushing,
 * backpressure, timeouts and reply framing.
 */
#include "srv_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "srv_clock.h"
#include "srv_log.h"
#include "srv_put.h"
#include "srv_rdma_conn.h"
#include "srv_request.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

/* Reads per readiness callback before yielding to other connections. */
#define PUMP_MAX_READS 64
/* A body buffer larger than this is freed after its request. */
#define BODY_KEEP_BYTES (256u * 1024)
/* The first allocation for a body; it then doubles as bytes arrive. */
#define BODY_FIRST_BYTES (16u * 1024)
/* How long a connection that got a fatal error reply may linger, draining
 * input so that the reply is not destroyed by a reset. */
#define CLOSING_LINGER_MS 1000

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);
static void conn_write_cb(evutil_socket_t fd, short what, void *arg);

static void conn_set_reading(struct srv_conn *c, int on)
{
	if (on == c->reading)
		return;
	if (on)
		event_add(c->ev_read, NULL);
	else
		event_del(c->ev_read);
	c->reading = on;
}

static void conn_set_writing(struct srv_conn *c, int on)
{
	if (on == c->writing)
		return;
	if (on)
		event_add(c->ev_write, NULL);
	else
		event_del(c->ev_write);
	c->writing = on;
}

uint64_t srv_conn_out_bytes(const struct srv_conn *c)
{
	return c->rdma ? evbuffer_get_length(c->out) : srv_out_bytes(&c->tx);
}

/* Is the output over the backpressure marks? */
static int conn_out_full(const struct srv_conn *c)
{
	return srv_conn_out_bytes(c) > SRV_OUT_MAX_BYTES ||
	       c->replies_queued >= SRV_OUT_MAX_REPLIES;
}

int srv_conn_open(struct srv_worker *w, int fd, uint64_t id, const char *peer)
{
	struct srv_conn *c = calloc(1, sizeof(*c));

	if (!c)
		goto out_close_fd;
	c->w = w;
	c->id = id;
	c->fd = fd;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	srv_out_init(&c->tx, w->srv->store);
	c->ev_read = event_new(w->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
	c->ev_write = event_new(w->base, fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
	if (!c->ev_read || !c->ev_write)
		goto out_free_conn;
	c->state = SRV_CONN_HEADER;
	c->last_active_ms = srv_now_ms();
	c->next = w->conns;
	if (w->conns)
		w->conns->prev = c;
	w->conns = c;
	w->n_conns++;
	conn_set_reading(c, 1);
	srv_debug("conn %" PRIu64 " %s: open on worker %u", id, c->peer, w->index);
	return 0;

out_free_conn:
	if (c->ev_write)
		event_free(c->ev_write);
	if (c->ev_read)
		event_free(c->ev_read);
	free(c);
out_close_fd:
	close(fd);
	__atomic_fetch_sub(&w->srv->conn_current, 1, __ATOMIC_RELAXED);
	srv_err("conn %" PRIu64 " %s: out of memory, dropped", id, peer);
	return -ENOMEM;
}

/* Unlink c from list *head (the worker's connections or zombies). */
static void conn_unlink(struct srv_conn **head, struct srv_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

/* What outlives the socket while promotions are pending: the lessee
 * (the store may still end a lease pin through it), the namespace
 * reference, the GET slots the store fills, and c itself. */
static void conn_free_rest(struct srv_conn *c)
{
	struct store *s = c->w->srv->store;

	store_lessee_free(s, c->lessee);
	/* balances the reference HELLO took on the namespace */
	if (c->hello_done)
		store_namespace_release(s, c->ns_id);
	free(c->body);
	srv_put_free(c);
	free(c->gets);
	free(c);
}

void srv_conn_close(struct srv_conn *c, int level, const char *reason)
{
	if (c->rdma) {
		srv_rconn_close(c, level, reason);
		return;
	}

	srv_log(level, "conn %" PRIu64 " %s: closed: %s%s", c->id, c->peer, reason,
		c->get_pending ? " (freed once its nvme reads end)" : "");
	srv_put_abort(c);
	event_free(c->ev_read);
	event_free(c->ev_write);
	c->ev_read = c->ev_write = NULL;
	/* Dropping queued output releases the pins of GET blocks not sent. */
	srv_out_free(&c->tx);
	close(c->fd);
	c->fd = -1;
	srv_conn_release(c);
}

void srv_conn_zombie_free(struct srv_conn *c)
{
	/* The GET's blocks that were in DRAM at once are still pinned in
	 * their slots (the promoted ones were released as they reported). */
	for (uint32_t i = 0; i < c->get_count; i++) {
		if (c->gets[i].ref.block)
			store_release(c->w->srv->store, c->gets[i].ref.block);
		c->gets[i].ref.block = NULL;
	}
	conn_unlink(&c->w->zombies, c);
	conn_free_rest(c);
}

void srv_conn_release(struct srv_conn *c)
{
	struct srv_worker *w = c->w;

	conn_unlink(&w->conns, c);
	w->n_conns--;
	__atomic_fetch_sub(&w->srv->conn_current, 1, __ATOMIC_RELAXED);
	if (!c->get_pending) {
		conn_free_rest(c);
		return;
	}
	c->zombie = 1;
	c->next = w->zombies;
	if (w->zombies)
		w->zombies->prev = c;
	w->zombies = c;
}

int srv_conn_check_timeouts(struct srv_conn *c, uint64_t now_ms)
{
	const struct conf *cf = &c->w->srv->conf;
	/* SIGHUP may change these while workers run: atomic loads */
	uint32_t payload_ms = __atomic_load_n(&cf->payload_timeout_ms, __ATOMIC_RELAXED);
	uint32_t idle_ms = __atomic_load_n(&cf->idle_timeout_ms, __ATOMIC_RELAXED);
	uint64_t quiet_ms = now_ms > c->last_active_ms ? now_ms - c->last_active_ms : 0;
	uint64_t frame_ms = now_ms > c->frame_start_ms ? now_ms - c->frame_start_ms : 0;
	char why[128];

	if (c->state == SRV_CONN_CLOSING) {
		if (now_ms - c->closing_since_ms < CLOSING_LINGER_MS)
			return 0;
		srv_conn_close(c, SRV_LOG_DEBUG, "after fatal error reply");
		return 1;
	}
	/* A frame being received: a deadline, not an inactivity timer, so a
	 * peer trickling bytes cannot hold its reservations (or the PUT
	 * in-flight budget) for longer than payload_timeout_ms. A GET waiting
	 * for NVMe reads is the server's wait, not the peer's. */
	if (!c->peer_eof && c->state != SRV_CONN_WAIT &&
	    (c->state != SRV_CONN_HEADER || c->hdr_have)) {
		if (!payload_ms || frame_ms < payload_ms)
			return 0;
		snprintf(why, sizeof(why),
			 "frame not received whole %" PRIu64 " ms after its header (payload_timeout_ms %u)",
			 frame_ms, payload_ms);
		srv_conn_close(c, SRV_LOG_DEBUG, why);
		return 1;
	}
	/* Replies waiting: the peer must keep reading them. */
	if (srv_conn_out_bytes(c)) {
		if (!payload_ms || quiet_ms < payload_ms)
			return 0;
		snprintf(why, sizeof(why), "replies unread for %" PRIu64 " ms (payload_timeout_ms %u)",
			 quiet_ms, payload_ms);
		srv_conn_close(c, SRV_LOG_DEBUG, why);
		return 1;
	}
	if (!idle_ms || quiet_ms < idle_ms)
		return 0;
	snprintf(why, sizeof(why), "idle for %" PRIu64 " ms (idle_timeout_ms %u)", quiet_ms,
		 idle_ms);
	srv_conn_close(c, SRV_LOG_DEBUG, why);
	return 1;
}

/* ---- replies --------------------------------------------------------- */

int srv_conn_reply_begin(struct srv_conn *c, uint16_t status, uint32_t body_bytes,
			 uint64_t payload_bytes, uint8_t **body)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = PROTO_VERSION,
		.opcode = c->hdr.opcode,
		.flags = PROTO_FLAG_REPLY,
		.status = status,
		.body_bytes = body_bytes,
		.request_id = c->hdr.request_id,
		.payload_bytes = payload_bytes,
	};
	uint32_t bytes = PROTO_HEADER_BYTES + body_bytes;
	struct evbuffer_iovec v;

	if (body_bytes > UINT32_MAX - PROTO_HEADER_BYTES)
		return -ENOMEM;
	if (c->rdma) {
		if (evbuffer_reserve_space(c->out, bytes, &v, 1) < 1)
			return -ENOMEM;
		c->reply_base = v.iov_base;
	} else if (srv_out_reserve(&c->tx, bytes, &c->reply_base) < 0) {
		return -ENOMEM;
	}
	proto_header_encode(&h, c->reply_base);
	*body = body_bytes ? c->reply_base + PROTO_HEADER_BYTES : NULL;
	return 0;
}

void srv_conn_reply_commit(struct srv_conn *c, uint32_t body_bytes)
{
	struct evbuffer_iovec v = {
		.iov_base = c->reply_base,
		.iov_len = (size_t)PROTO_HEADER_BYTES + body_bytes,
	};

	if (c->rdma)
		evbuffer_commit_space(c->out, &v, 1);
	else
		srv_out_commit(&c->tx, v.iov_len);
	c->reply_base = NULL;
	c->replies_queued++;
}

int srv_conn_reply_block(struct srv_conn *c, const uint8_t *data, uint64_t len,
			 struct store_block *block)
{
	return srv_out_block(&c->tx, data, len, block);
}

int srv_conn_reply_buffer(struct srv_conn *c, uint16_t status, struct evbuffer *body)
{
	size_t len = evbuffer_get_length(body);
	uint8_t *p;

	if (len > UINT32_MAX - PROTO_HEADER_BYTES)
		return -EMSGSIZE;
	if (!c->rdma) {
		/* A rare, small reply: copied into the output buffer, so
		 * that all TCP output is one queue in request order. */
		if (srv_conn_reply_begin(c, status, (uint32_t)len, 0, &p) < 0)
			return -ENOMEM;
		if (len && evbuffer_remove(body, p, len) != (ev_ssize_t)len)
			return -ENOMEM; /* not committed: nothing was queued */
		srv_conn_reply_commit(c, (uint32_t)len);
		return 0;
	}
	if (srv_conn_reply_begin(c, status, 0, 0, &p) < 0)
		return -ENOMEM;
	/* Patch body_bytes into the header just reserved, then move the body. */
	proto_put_u32(c->reply_base + 12, (uint32_t)len);
	srv_conn_reply_commit(c, 0);
	if (evbuffer_add_buffer(c->out, body) < 0)
		return -ENOMEM;
	return 0;
}

size_t srv_conn_quote_body(const struct proto_header *h, const uint8_t *body, size_t body_bytes,
			   char *out, size_t cap)
{
	static const char prefix[] = "body: ";
	int m;

	if (cap == 0)
		return 0;
	out[0] = '\0';
	if (h->opcode == PROTO_OP_HELLO) {
		/* The body holds the auth token: never log it, not even part. */
		m = snprintf(out, cap, "header only: opcode %u, body_bytes %u, payload_bytes %" PRIu64,
			     h->opcode, h->body_bytes, h->payload_bytes);
		return m < 0 ? 0 : ((size_t)m < cap ? (size_t)m : cap - 1);
	}
	if (!body || !body_bytes || cap <= sizeof(prefix))
		return 0;
	memcpy(out, prefix, sizeof(prefix));
	return sizeof(prefix) - 1 +
	       srv_log_sanitize(body, body_bytes < SRV_QUOTE_BODY_BYTES ? body_bytes :
									 SRV_QUOTE_BODY_BYTES,
				out + sizeof(prefix) - 1, cap - (sizeof(prefix) - 1));
}

/* Log the protocol error `msg` of the current request at warn level,
 * within the worker's per-second budget of such lines. */
static void conn_log_error(struct srv_conn *c, uint16_t status, enum srv_quote quote,
			   const char *msg)
{
	static const char hprefix[] = "header: ";
	char text[4 * PROTO_HEADER_BYTES + 4 * SRV_QUOTE_BODY_BYTES + 16];
	struct srv_worker *w = c->w;
	uint64_t suppressed;
	bool ok;

	if (SRV_LOG_WARN > __atomic_load_n(&srv_log_level, __ATOMIC_RELAXED))
		return;
	ok = srv_ratelimit_allow(&w->proto_log, srv_now_ms(), &suppressed);
	if (suppressed)
		srv_warn("worker %u: %" PRIu64 " protocol error messages suppressed", w->index,
			 suppressed);
	if (!ok)
		return;
	text[0] = '\0';
	if (quote == SRV_QUOTE_HEADER && c->hdr_have) {
		memcpy(text, hprefix, sizeof(hprefix));
		srv_log_sanitize(c->hdr_raw, c->hdr_have, text + sizeof(hprefix) - 1,
				 sizeof(text) - (sizeof(hprefix) - 1));
	} else if (quote == SRV_QUOTE_BODY) {
		srv_conn_quote_body(&c->hdr, c->body,
				    c->body_have < c->hdr.body_bytes ? c->body_have : c->hdr.body_bytes,
				    text, sizeof(text));
	}
	srv_warn("conn %" PRIu64 " %s: %s request %" PRIu64 ": %s: %s%s%s", c->id, c->peer,
		 proto_op_name(c->hdr.opcode), c->hdr.request_id, proto_status_name(status), msg,
		 text[0] ? "; " : "", text);
}

int srv_conn_reply_error(struct srv_conn *c, uint16_t status, enum srv_quote quote,
			 const char *fmt, ...)
{
	char msg[512];
	size_t msg_bytes;
	uint32_t body_bytes;
	uint8_t *body;
	va_list ap;
	int m;

	va_start(ap, fmt);
	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	msg_bytes = m < 0 ? 0 : ((size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1);
	conn_log_error(c, status, quote, msg);
	srv_stats_count_status(&c->w->stats, status);
	body_bytes = (uint32_t)proto_error_body_bytes(msg_bytes);
	if (srv_conn_reply_begin(c, status, body_bytes, 0, &body) < 0)
		return -ENOMEM;
	proto_error_encode(msg, msg_bytes, body, body_bytes);
	srv_conn_reply_commit(c, body_bytes);
	return 0;
}

uint32_t srv_conn_body_max(uint8_t opcode, const struct proto_limits *l)
{
	uint64_t entry_bytes = proto_request_entry_bytes(opcode), max;

	switch (opcode) {
	case PROTO_OP_HELLO:
		max = PROTO_HELLO_FIXED_BYTES + PROTO_NAME_MAX_BYTES + PROTO_TOKEN_MAX_BYTES;
		break;
	case PROTO_OP_DROP_NAMESPACE:
	case PROTO_OP_STATS:
		max = proto_name_body_bytes(PROTO_NAME_MAX_BYTES);
		break;
	default:
		/* PING, and opcodes without a batch body, carry nothing. */
		max = entry_bytes ? PROTO_BATCH_PREFIX_BYTES + entry_bytes * l->max_batch_blocks : 0;
		break;
	}
	return max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
}

/* Make room for the next body bytes. The buffer grows with what has
 * arrived (BODY_FIRST_BYTES, then doubling, up to body_bytes), so a peer
 * that announces a large body and sends little of it costs little memory.
 * Errors: -ENOMEM. */
static int body_grow(struct srv_conn *c)
{
	uint32_t cap;
	uint8_t *p;

	if (c->body_have < c->body_cap)
		return 0;
	if (c->body_cap < BODY_FIRST_BYTES)
		cap = BODY_FIRST_BYTES;
	else
		cap = c->body_cap > UINT32_MAX / 2 ? UINT32_MAX : c->body_cap * 2;
	if (cap > c->hdr.body_bytes)
		cap = c->hdr.body_bytes;
	p = realloc(c->body, cap);
	if (!p)
		return -ENOMEM;
	c->body = p;
	c->body_cap = cap;
	return 0;
}

/* ---- input ----------------------------------------------------------- */

/* Limit on payload_bytes the header decoder applies, for messages. */
static uint64_t payload_limit(const struct proto_limits *l)
{
	if (l->max_block_bytes && l->max_batch_blocks > UINT64_MAX / l->max_block_bytes)
		return UINT64_MAX;
	return (uint64_t)l->max_batch_blocks * l->max_block_bytes;
}

/* Which rule of a decoded header (good magic and version) failed with
 * -EPROTO, for the message. */
static const char *header_field_error(const struct srv_conn *c)
{
	if (proto_get_u16(c->hdr_raw + 10) != 0)
		return "reserved header field nonzero";
	if (c->hdr.flags & ~PROTO_FLAG_REPLY)
		return "unknown flag bits set";
	if (c->hdr.flags & PROTO_FLAG_REPLY)
		return "reply flag set on a request";
	return "nonzero status on a request";
}

/* The first four bytes are not the magic (checked as soon as they are in,
 * so that a short probe such as an HTTP request is answered at once): a
 * connection-level error reply, then close. The log line shows those four
 * bytes only (as a little-endian u32, like PROTO_MAGIC), never the rest of
 * the header: a client framing bug can put a token there. */
static enum srv_next on_bad_magic(struct srv_conn *c)
{
	uint32_t magic = proto_get_u32(c->hdr_raw);
	int err;

	memset(&c->hdr, 0, sizeof(c->hdr)); /* opcode 0, request_id 0 */
	err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_NONE,
				   "bad magic 0x%08" PRIx32 ": not a kvpool frame", magic);
	return err ? SRV_NEXT_ABORT : SRV_NEXT_CLOSE;
}

/* Discard the rest of the current frame (body and payload) after its
 * error reply was queued with result err. */
static enum srv_next skip_frame(struct srv_conn *c, int err)
{
	uint64_t skip = c->hdr.body_bytes + c->hdr.payload_bytes;

	/* A payload length near 2^64 cannot be skipped in practice; saturate
	 * and let payload_timeout_ms end it. */
	c->skip_bytes = skip < c->hdr.payload_bytes ? UINT64_MAX : skip;
	return err ? SRV_NEXT_ABORT : SRV_NEXT_SKIP;
}

/* Answer a header the decoder refused (rc < 0), per PROTOCOL.md 7.2/7.3:
 * a bad magic, an unknown version or opcode 0 closes the connection;
 * after any other failure the frame's length is known, so its body and
 * payload are discarded and the next frame is read. */
static enum srv_next on_bad_header(struct srv_conn *c, int rc)
{
	const struct proto_limits *l = &c->w->srv->limits;
	uint64_t frame_bytes = (uint64_t)PROTO_HEADER_BYTES + c->hdr.body_bytes;
	int err;

	if (rc == -EPROTO && proto_get_u32(c->hdr_raw) != PROTO_MAGIC)
		return on_bad_magic(c);
	if (rc == -EPROTONOSUPPORT) {
		err = srv_conn_reply_error(c, PROTO_STATUS_UNSUPPORTED, SRV_QUOTE_HEADER,
					   "protocol version %u not supported; supported versions %d..%d",
					   c->hdr.version, PROTO_VERSION_MIN, PROTO_VERSION_MAX);
		return err ? SRV_NEXT_ABORT : SRV_NEXT_CLOSE;
	}
	if (rc == -EOPNOTSUPP && c->hdr.opcode == PROTO_OP_NONE) {
		/* The reply echoes opcode 0, which the client must take as a
		 * connection-level error: the server closes too. */
		err = srv_conn_reply_error(c, PROTO_STATUS_UNSUPPORTED, SRV_QUOTE_HEADER,
					   "opcode 0 is not a request; closing");
		return err ? SRV_NEXT_ABORT : SRV_NEXT_CLOSE;
	}
	switch (rc) {
	case -EOPNOTSUPP:
		err = srv_conn_reply_error(c, PROTO_STATUS_UNSUPPORTED, SRV_QUOTE_HEADER,
					   "unknown opcode %u", c->hdr.opcode);
		break;
	case -EMSGSIZE:
		if (frame_bytes > l->max_frame_bytes)
			err = srv_conn_reply_error(c, PROTO_STATUS_TOO_LARGE, SRV_QUOTE_HEADER,
						   "frame of %" PRIu64 " bytes exceeds max_frame_bytes %u",
						   frame_bytes, l->max_frame_bytes);
		else
			err = srv_conn_reply_error(c, PROTO_STATUS_TOO_LARGE, SRV_QUOTE_HEADER,
						   "payload of %" PRIu64 " bytes exceeds max_batch_blocks %u"
						   " * max_block_bytes %" PRIu64 " (%" PRIu64 ")",
						   c->hdr.payload_bytes, l->max_batch_blocks,
						   l->max_block_bytes, payload_limit(l));
		break;
	case -EBADMSG:
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					   "%s request carries no payload (payload_bytes %" PRIu64 ")",
					   proto_op_name(c->hdr.opcode), c->hdr.payload_bytes);
		break;
	default:
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER, "%s",
					   header_field_error(c));
		break;
	}
	return skip_frame(c, err);
}

/* The header announces more body than its opcode can need: refuse it
 * before buffering any of it, then discard the frame. */
static enum srv_next on_body_too_large(struct srv_conn *c, uint32_t max)
{
	const struct proto_limits *l = &c->w->srv->limits;
	const char *op = proto_op_name(c->hdr.opcode);
	uint32_t entry_bytes = proto_request_entry_bytes(c->hdr.opcode);
	int err;

	if (c->hdr.opcode == PROTO_OP_PING)
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					   "ping body must be empty");
	else if (entry_bytes)
		err = srv_conn_reply_error(c, PROTO_STATUS_TOO_LARGE, SRV_QUOTE_HEADER,
					   "%s body of %u bytes exceeds 8 + %u * max_batch_blocks %u (%u)",
					   op, c->hdr.body_bytes, entry_bytes, l->max_batch_blocks, max);
	else
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					   "%s body of %u bytes exceeds the %u bytes it can need", op,
					   c->hdr.body_bytes, max);
	return skip_frame(c, err);
}

/* The header is complete: decode it and start on the body. */
static enum srv_next on_header(struct srv_conn *c)
{
	const struct srv *s = c->w->srv;
	uint32_t max;
	int rc;

	memset(&c->hdr, 0, sizeof(c->hdr));
	c->body_have = 0;
	rc = proto_header_decode(c->hdr_raw, 0, &s->limits, &c->hdr);
	if (rc < 0)
		return on_bad_header(c, rc);
	max = srv_conn_body_max(c->hdr.opcode, &s->limits);
	if (c->hdr.body_bytes > max)
		return on_body_too_large(c, max);
	if (c->hdr.body_bytes == 0) {
		c->req_start_us = srv_now_us();
		return srv_request_dispatch(c);
	}
	return SRV_NEXT_BODY;
}

enum srv_next srv_conn_frame(struct srv_conn *c, const uint8_t *frame, size_t bytes)
{
	enum srv_next next;

	memcpy(c->hdr_raw, frame, PROTO_HEADER_BYTES);
	c->hdr_have = PROTO_HEADER_BYTES;
	c->frame_start_ms = srv_now_ms();
	next = on_header(c);
	if (next != SRV_NEXT_BODY)
		return next;
	if (bytes - PROTO_HEADER_BYTES < c->hdr.body_bytes)
		return srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					    "message shorter than its body") < 0 ? SRV_NEXT_ABORT :
										   SRV_NEXT_SKIP;
	if (c->body_cap < c->hdr.body_bytes) {
		uint8_t *p = realloc(c->body, c->hdr.body_bytes);

		if (!p)
			return SRV_NEXT_ABORT;
		c->body = p;
		c->body_cap = c->hdr.body_bytes;
	}
	memcpy(c->body, frame + PROTO_HEADER_BYTES, c->hdr.body_bytes);
	c->body_have = c->hdr.body_bytes;
	c->req_start_us = srv_now_us();
	return srv_request_dispatch(c);
}

/* Move the state machine on after a header or a request. Returns -1 when
 * the connection must be closed now. */
static int conn_next(struct srv_conn *c, enum srv_next next)
{
	switch (next) {
	case SRV_NEXT_BODY:
		c->state = SRV_CONN_BODY;
		return 0;
	case SRV_NEXT_PAYLOAD:
		c->state = SRV_CONN_PAYLOAD;
		return 0;
	case SRV_NEXT_SKIP:
		if (c->skip_bytes) {
			c->state = SRV_CONN_SKIP;
			return 0;
		}
		break;
	case SRV_NEXT_HEADER:
		break;
	case SRV_NEXT_CLOSE:
		c->state = SRV_CONN_CLOSING;
		c->closing_since_ms = srv_now_ms();
		return 0;
	case SRV_NEXT_WAIT:
		/* Replies stay in request order: read nothing more until the
		 * GET's promotions are in (srv_conn_request_done). */
		c->state = SRV_CONN_WAIT;
		conn_set_reading(c, 0);
		return 0;
	case SRV_NEXT_ABORT:
	default:
		return -1;
	}
	c->state = SRV_CONN_HEADER;
	c->hdr_have = 0;
	if (c->body_cap > BODY_KEEP_BYTES) {
		free(c->body);
		c->body = NULL;
		c->body_cap = 0;
	}
	/* Between requests is the only place we pause: never mid-frame. */
	if (conn_out_full(c))
		conn_set_reading(c, 0);
	return 0;
}

/* read(2) returning -errno instead of -1. */
static long sys_read(int fd, void *buf, size_t len)
{
	ssize_t n = read(fd, buf, len);

	return n < 0 ? -errno : (long)n;
}

/* One read step in the current state, then whatever the bytes complete.
 * Returns bytes read (> 0), 0 on EOF, or -errno (-EAGAIN: nothing to read;
 * -ENOMEM: the request could not be answered). *want receives how many
 * bytes were asked for. */
static long conn_read_step(struct srv_conn *c, size_t *want)
{
	uint8_t *scratch = c->w->scratch;
	int done = 0;
	long n;

	switch (c->state) {
	case SRV_CONN_HEADER:
		*want = PROTO_HEADER_BYTES - c->hdr_have;
		n = sys_read(c->fd, c->hdr_raw + c->hdr_have, *want);
		if (n <= 0)
			return n;
		if (c->hdr_have == 0)
			c->frame_start_ms = srv_now_ms(); /* the frame's deadline starts */
		c->hdr_have += (uint32_t)n;
		if (c->hdr_have == PROTO_HEADER_BYTES)
			return conn_next(c, on_header(c)) < 0 ? -ENOMEM : n;
		if (c->hdr_have >= sizeof(uint32_t) && proto_get_u32(c->hdr_raw) != PROTO_MAGIC)
			return conn_next(c, on_bad_magic(c)) < 0 ? -ENOMEM : n;
		return n;
	case SRV_CONN_BODY:
		if (body_grow(c) < 0)
			return -ENOMEM;
		*want = (c->body_cap < c->hdr.body_bytes ? c->body_cap : c->hdr.body_bytes) -
			c->body_have;
		n = sys_read(c->fd, c->body + c->body_have, *want);
		if (n > 0 && (c->body_have += (uint32_t)n) == c->hdr.body_bytes) {
			c->req_start_us = srv_now_us();
			return conn_next(c, srv_request_dispatch(c)) < 0 ? -ENOMEM : n;
		}
		return n;
	case SRV_CONN_PAYLOAD:
		n = srv_put_read(c, want, &done);
		if (n > 0 && done)
			conn_next(c, SRV_NEXT_HEADER);
		return n;
	case SRV_CONN_SKIP:
		*want = c->skip_bytes < SRV_SCRATCH_BYTES ? c->skip_bytes : SRV_SCRATCH_BYTES;
		n = sys_read(c->fd, scratch, *want);
		if (n > 0 && (c->skip_bytes -= (uint64_t)n) == 0)
			conn_next(c, SRV_NEXT_HEADER);
		return n;
	case SRV_CONN_WAIT:
		/* Not reading (conn_next); a level-triggered event already
		 * dispatched in this round may still land here. */
		return -EAGAIN;
	case SRV_CONN_CLOSING:
	default:
		*want = SRV_SCRATCH_BYTES;
		return sys_read(c->fd, scratch, *want);
	}
}

/* Log level and text for a connection the peer closed: debug, as every
 * per-connection open and close line (many short-lived connections must
 * not flood the log). */
static const char *eof_reason(const struct srv_conn *c, int *level)
{
	*level = SRV_LOG_DEBUG;
	if (c->state == SRV_CONN_CLOSING)
		return "peer closed after fatal error";
	if (c->state == SRV_CONN_HEADER && c->hdr_have == 0)
		return "peer closed";
	return c->state == SRV_CONN_PAYLOAD ? "peer closed mid-payload" : "peer closed mid-frame";
}

/* Read and handle input until the socket is drained, reading is paused,
 * or the per-callback budget is spent. Returns 1 if c was closed. */
static int conn_pump(struct srv_conn *c)
{
	char why[96];
	const char *reason;
	int level;

	for (int i = 0; i < PUMP_MAX_READS && c->reading; i++) {
		size_t want = 0;
		long n = conn_read_step(c, &want);

		if (n == -EAGAIN || n == -EINTR)
			return 0;
		if (n == 0) {
			reason = eof_reason(c, &level);
			if (!srv_out_bytes(&c->tx)) {
				srv_conn_close(c, level, reason);
				return 1;
			}
			/* Replies are still queued (a half-closed peer may wait
			 * for them): stop reading, close once they are out. */
			srv_log(level, "conn %" PRIu64 " %s: %s; flushing replies", c->id, c->peer,
				reason);
			srv_put_abort(c);
			c->peer_eof = 1;
			conn_set_reading(c, 0);
			return 0;
		}
		if (n < 0) {
			snprintf(why, sizeof(why), "%s: %s", n == -ENOMEM ? "aborted" : "read error",
				 strerror((int)-n));
			srv_conn_close(c, n == -ENOMEM ? SRV_LOG_WARN : SRV_LOG_DEBUG, why);
			return 1;
		}
		c->last_active_ms = srv_now_ms();
		if ((size_t)n < want)
			return 0; /* the socket is most likely empty now */
	}
	return 0;
}

/* Write what the socket takes, and switch write interest and read
 * backpressure accordingly. Returns 1 if c was closed. */
static int conn_flush(struct srv_conn *c)
{
	char why[96];
	uint64_t len = srv_out_bytes(&c->tx);

	if (len) {
		long n = srv_out_write(&c->tx, c->fd);

		if (n < 0 && n != -EAGAIN && n != -EINTR) {
			snprintf(why, sizeof(why), "write error: %s", strerror((int)-n));
			srv_conn_close(c, SRV_LOG_DEBUG, why);
			return 1;
		}
		if (n > 0)
			c->last_active_ms = srv_now_ms();
		len = srv_out_bytes(&c->tx);
	}
	if (len == 0 && c->peer_eof) {
		srv_conn_close(c, SRV_LOG_DEBUG, "replies flushed after peer closed");
		return 1;
	}
	if (len == 0) {
		c->replies_queued = 0;
		conn_set_writing(c, 0);
		if (c->state == SRV_CONN_CLOSING && !c->wr_shut) {
			shutdown(c->fd, SHUT_WR);
			c->wr_shut = 1;
		}
	} else {
		conn_set_writing(c, 1);
	}
	if (c->peer_eof)
		conn_set_reading(c, 0);
	else if (c->state == SRV_CONN_CLOSING)
		conn_set_reading(c, 1); /* drain until the peer closes */
	else if (c->state == SRV_CONN_HEADER && !c->hdr_have)
		conn_set_reading(c, !conn_out_full(c));
	return 0;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;

	(void)fd;
	(void)what;
	if (conn_pump(c))
		return;
	conn_flush(c);
}

void srv_conn_request_done(struct srv_conn *c, enum srv_next next)
{
	char why[64];

	if (c->rdma) {
		srv_rconn_request_done(c, next);
		return;
	}
	if (conn_next(c, next) < 0) {
		snprintf(why, sizeof(why), "aborted: %s", strerror(ENOMEM));
		srv_conn_close(c, SRV_LOG_WARN, why);
		return;
	}
	/* Writes the reply and, in state HEADER, reads again: input that
	 * arrived meanwhile fires the level-triggered read event. */
	conn_flush(c);
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;

	(void)fd;
	(void)what;
	if (conn_flush(c))
		return;
	/* Reading may have resumed: input already buffered in the kernel is
	 * picked up by the (level-triggered) read event. */
}
