/*
 * srv_conn.c - a client connection, whatever its transport: the request
 * header and body checks, dispatch, replies and error replies, timeouts,
 * and closing. The transports (srv_tcp.c, srv_rdma_conn.c) call in; this
 * file reaches them only through c->ops (srv_transport.h).
 */
#include "srv_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "srv_clock.h"
#include "srv_log.h"
#include "srv_mwait.h"
#include "srv_request.h"
#include "srv_server.h"
#include "srv_tls.h"
#include "srv_worker.h"
#include "store.h"

/* How long a connection that got a fatal error reply may linger, draining
 * input so that the reply is not destroyed by a reset. */
#define CLOSING_LINGER_MS 1000

uint64_t srv_conn_out_bytes(const struct srv_conn *c)
{
	return c->ops->pending(c);
}

bool srv_conn_out_full(const struct srv_conn *c)
{
	return srv_conn_out_bytes(c) > SRV_OUT_MAX_BYTES ||
	       c->replies_queued >= SRV_OUT_MAX_REPLIES;
}

void srv_conn_init(struct srv_conn *c, struct srv_worker *w, uint64_t id, const char *peer,
		   const struct srv_transport *ops)
{
	c->w = w;
	c->id = id;
	c->fd = -1;
	c->ops = ops;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	c->state = SRV_CONN_HEADER;
	c->last_active_ms = srv_now_ms();
}

void srv_conn_attach(struct srv_conn *c)
{
	struct srv_worker *w = c->w;

	c->next = w->conns;
	if (w->conns)
		w->conns->prev = c;
	w->conns = c;
	w->n_conns++;
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
	/* a namespace only this connection's waiting MATCHes created, and
	 * that nothing was put to: wait and leave nothing behind (a
	 * read-only token must not fill the namespace table) */
	if (c->ns_made_by_wait && c->ns_id)
		(void)store_namespace_forget(s, c->ns_id);
	free(c->body);
	free(c->gets);
	free(c);
}

void srv_conn_close(struct srv_conn *c, int level, const char *reason)
{
	c->ops->close(c, level, reason);
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

	srv_mwait_conn_free(c);
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
	    (c->state != SRV_CONN_HEADER || c->hdr_have || c->tls_phase == SRV_TLS_HANDSHAKE)) {
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
	/* Parked MATCHes: the reply is the server's to send, not idleness. */
	if (c->mw_count)
		return 0;
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
		.version = srv_conn_reply_version(c),
		.opcode = c->hdr.opcode,
		.flags = PROTO_FLAG_REPLY,
		.status = status,
		.body_bytes = body_bytes,
		.request_id = c->hdr.request_id,
		.payload_bytes = payload_bytes,
	};
	uint32_t bytes = PROTO_HEADER_BYTES + body_bytes;

	if (body_bytes > UINT32_MAX - PROTO_HEADER_BYTES)
		return -ENOMEM;
	if (c->ops->reply_reserve(c, bytes, &c->reply_base) < 0)
		return -ENOMEM;
	proto_header_encode(&h, c->reply_base);
	*body = body_bytes ? c->reply_base + PROTO_HEADER_BYTES : NULL;
	return 0;
}

void srv_conn_reply_commit(struct srv_conn *c, uint32_t body_bytes)
{
	c->ops->reply_commit(c, c->reply_base, PROTO_HEADER_BYTES + body_bytes);
	c->reply_base = NULL;
	c->replies_queued++;
}

int srv_conn_reply_block(struct srv_conn *c, const uint8_t *data, uint64_t len,
			 struct store_block *block)
{
	return c->ops->reply_block(c, data, len, block);
}

int srv_conn_reply_buffer(struct srv_conn *c, uint16_t status, struct evbuffer *body)
{
	size_t len = evbuffer_get_length(body);
	uint8_t *p;

	if (len > UINT32_MAX - PROTO_HEADER_BYTES)
		return -EMSGSIZE;
	if (srv_conn_reply_begin(c, status, 0, 0, &p) < 0)
		return -ENOMEM;
	/* Patch body_bytes into the header just reserved, then add the body
	 * (moved or copied by the transport, right behind it). */
	proto_put_u32(c->reply_base + 12, (uint32_t)len);
	srv_conn_reply_commit(c, 0);
	return len ? c->ops->reply_buffer(c, body) : 0;
}

int srv_conn_results_begin(struct srv_conn *c, uint32_t count, uint64_t payload_bytes,
			   uint8_t **body, uint32_t *body_bytes)
{
	*body_bytes = (uint32_t)proto_batch_body_bytes(count, PROTO_RESULT_ENTRY_BYTES);
	if (srv_conn_reply_begin(c, PROTO_STATUS_OK, *body_bytes, payload_bytes, body) < 0)
		return -ENOMEM;
	proto_batch_encode_prefix(*body, count, 0);
	return 0;
}

void srv_conn_lat_record(struct srv_conn *c, int op)
{
	srv_hist_record(&c->w->stats.lat[op], srv_now_us() - c->req_start_us);
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

uint8_t srv_conn_reply_version(const struct srv_conn *c)
{
	uint8_t v = c->hdr.version;

	if (!c->hello_done || c->hdr.opcode == PROTO_OP_HELLO || v < PROTO_VERSION_MIN ||
	    v > c->version)
		return PROTO_VERSION_1;
	return v;
}

uint32_t srv_conn_body_max_v(uint8_t opcode, uint8_t version, const struct proto_limits *l)
{
	uint64_t max;

	if (opcode != PROTO_OP_MATCH || version < PROTO_VERSION_2)
		return srv_conn_body_max(opcode, l);
	max = proto_match_body_bytes(version, l->max_batch_blocks);
	return max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
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

/* The first four bytes are not the magic: a connection-level error
 * reply, then close. The log line shows those four
 * bytes only (as a little-endian u32, like PROTO_MAGIC), never the rest of
 * the header: a client framing bug can put a token there. */
enum srv_next srv_conn_bad_magic(struct srv_conn *c)
{
	uint32_t magic = proto_get_u32(c->hdr_raw);
	int err;

	memset(&c->hdr, 0, sizeof(c->hdr)); /* opcode 0, request_id 0 */
	if (c->hdr_raw[0] == SRV_TLS_HANDSHAKE_BYTE)
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_NONE,
					   "a TLS ClientHello, but this server has no TLS "
					   "(tls_cert_file is not set): connect with tcp://");
	else
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_NONE,
					   "bad magic 0x%08" PRIx32 ": not a kvpool frame", magic);
	return err ? SRV_NEXT_ABORT : SRV_NEXT_CLOSE;
}

enum srv_next srv_conn_refuse_plaintext(struct srv_conn *c)
{
	int err;

	memset(&c->hdr, 0, sizeof(c->hdr)); /* opcode 0, request_id 0 */
	srv_stats_add(&c->w->stats, SRV_C_tls_plaintext_refused, 1);
	err = srv_conn_reply_error(c, PROTO_STATUS_DENIED, SRV_QUOTE_NONE,
				   "this port requires TLS (tls_only): connect with a tls:// URL");
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
		return srv_conn_bad_magic(c);
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
					   "%s body of %u bytes exceeds %u + %u * max_batch_blocks %u (%u)",
					   op, c->hdr.body_bytes,
					   (uint32_t)(max - (uint64_t)entry_bytes * l->max_batch_blocks),
					   entry_bytes, l->max_batch_blocks, max);
	else
		err = srv_conn_reply_error(c, PROTO_STATUS_BAD_REQUEST, SRV_QUOTE_HEADER,
					   "%s body of %u bytes exceeds the %u bytes it can need", op,
					   c->hdr.body_bytes, max);
	return skip_frame(c, err);
}

enum srv_next srv_conn_header(struct srv_conn *c)
{
	const struct srv *s = c->w->srv;
	uint32_t max;
	int rc;

	/* Behind parked MATCHes only another MATCH goes on (srv_mwait.h). */
	if (srv_mwait_hold_header(c))
		return SRV_NEXT_WAIT;
	memset(&c->hdr, 0, sizeof(c->hdr));
	c->body_have = 0;
	rc = proto_header_decode(c->hdr_raw, 0, &s->limits, &c->hdr);
	if (rc < 0)
		return on_bad_header(c, rc);
	max = srv_conn_body_max_v(c->hdr.opcode, c->hdr.version, &s->limits);
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
	next = srv_conn_header(c);
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
	return srv_conn_body_done(c);
}

enum srv_next srv_conn_body_done(struct srv_conn *c)
{
	c->req_start_us = srv_now_us();
	return srv_request_dispatch(c);
}

void srv_conn_request_done(struct srv_conn *c, enum srv_next next)
{
	c->ops->request_done(c, next);
}
