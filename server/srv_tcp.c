/*
 * srv_tcp.c - the TCP transport: a connection's socket, its read and write
 * events, the input state machine (HEADER -> BODY -> PAYLOAD | SKIP),
 * the output queue written with writev, backpressure, and the PUT payload
 * read straight into the arena. See srv_tcp.h.
 *
 * With TLS on the server (srv_tls.h) a connection starts by telling TLS
 * from plaintext on its first byte (SNIFF), then runs the handshake, and
 * from then on every byte goes through its session: reads with
 * srv_tls_read, writes with srv_tls_writev - or, when the kernel took the
 * session's send side (kernel TLS), with the same writev as plaintext.
 */
#include "srv_tcp.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "srv_clock.h"
#include "srv_conn.h"
#include "srv_get.h"
#include "srv_log.h"
#include "srv_put.h"
#include "srv_server.h"
#include "srv_tls.h"
#include "srv_worker.h"
#include "store.h"

/* Reads per readiness callback before yielding to other connections. */
#define PUMP_MAX_READS 64
/* A body buffer larger than this is freed after its request. */
#define BODY_KEEP_BYTES (256u * 1024)
/* The first allocation for a body; it then doubles as bytes arrive. */
#define BODY_FIRST_BYTES (16u * 1024)
/* iovecs per readv of a PUT payload: enough to take many small blocks in
 * one call. */
#define PUT_IOV_MAX 64

static void conn_read_cb(evutil_socket_t fd, short what, void *arg);
static void conn_write_cb(evutil_socket_t fd, short what, void *arg);
static const struct srv_transport tcp_ops;

/* Decrypted bytes wait inside the TLS session while the socket may be
 * empty: the read event would not fire for them, so fire it now. */
static void tls_repump(struct srv_conn *c)
{
	if (c->tls && c->reading && c->tls_phase == SRV_TLS_UP && srv_tls_pending(c->tls))
		event_active(c->ev_read, EV_READ, 1);
}

static void conn_set_reading(struct srv_conn *c, int on)
{
	if (on == c->reading)
		return;
	if (on)
		event_add(c->ev_read, NULL);
	else
		event_del(c->ev_read);
	c->reading = on;
	tls_repump(c);
}

/* Is the connected peer of fd on a loopback address? */
static bool peer_is_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
		return false;
	if (ss.ss_family == AF_INET)
		return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
	if (ss.ss_family == AF_INET6) {
		const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;

		return IN6_IS_ADDR_LOOPBACK(a) ||
		       (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	return ss.ss_family == AF_UNIX;
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

int srv_tcp_open(struct srv_worker *w, int fd, uint64_t id, const char *peer)
{
	struct srv_conn *c = calloc(1, sizeof(*c));

	if (!c)
		goto out_close_fd;
	srv_conn_init(c, w, id, peer, &tcp_ops);
	c->fd = fd;
	c->peer_loopback = peer_is_loopback(fd);
	if (w->srv->tls) {
		/* TLS or plaintext: the first byte will tell; a handshake
		 * must end within payload_timeout_ms of it */
		c->tls_phase = SRV_TLS_SNIFF;
	}
	srv_out_init(&c->tx, w->srv->store);
	c->ev_read = event_new(w->base, fd, EV_READ | EV_PERSIST, conn_read_cb, c);
	c->ev_write = event_new(w->base, fd, EV_WRITE | EV_PERSIST, conn_write_cb, c);
	if (!c->ev_read || !c->ev_write)
		goto out_free_conn;
	srv_conn_attach(c);
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

/* srv_transport.close: the socket and its events go, queued output is
 * dropped (releasing the pins of GET blocks not sent). */
static void tcp_close(struct srv_conn *c, int level, const char *reason)
{
	srv_log(level, "conn %" PRIu64 " %s: closed: %s%s", c->id, c->peer, reason,
		c->get_pending ? " (freed once its nvme reads end)" : "");
	srv_put_abort(c);
	srv_put_free(c);
	event_free(c->ev_read);
	event_free(c->ev_write);
	c->ev_read = c->ev_write = NULL;
	/* Dropping queued output releases the pins of GET blocks not sent. */
	srv_out_free(&c->tx);
	if (c->tls_phase == SRV_TLS_UP)
		srv_stats_add(&c->w->stats, SRV_C_tls_conns_current, (uint64_t)-1);
	srv_tls_free(c->tls);
	c->tls = NULL;
	close(c->fd);
	c->fd = -1;
	srv_conn_release(c);
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
	if (srv_conn_out_full(c))
		conn_set_reading(c, 0);
	return 0;
}

/* Read up to len bytes of the stream (through TLS when it is on):
 * > 0, 0 at EOF, or -errno (-EAGAIN: nothing now; -EPROTO: TLS broke). */
static long conn_recv(struct srv_conn *c, void *buf, size_t len)
{
	ssize_t n;

	if (c->tls)
		return srv_tls_read(c->tls, buf, len);
	n = read(c->fd, buf, len);
	return n < 0 ? -errno : (long)n;
}

/* readv(2) of the stream, through TLS when it is on. */
static long conn_recvv(struct srv_conn *c, const struct iovec *iov, int n)
{
	ssize_t r;

	if (c->tls)
		return srv_tls_readv(c->tls, iov, n);
	r = readv(c->fd, iov, n);
	return r < 0 ? -errno : (long)r;
}

/* srv_out's writer for a session OpenSSL encrypts in user space. */
static long tls_out_writev(void *arg, const struct iovec *iov, int n)
{
	return srv_tls_writev(arg, iov, n);
}

/* Write what the socket takes of c's output: straight from the queue with
 * writev in plaintext and when the kernel encrypts (kernel TLS), through
 * OpenSSL otherwise. */
static long conn_out_write(struct srv_conn *c)
{
	if (c->tls && !srv_tls_ktls_send(c->tls))
		return srv_out_write_fn(&c->tx, tls_out_writev, c->tls);
	return srv_out_write(&c->tx, c->fd);
}

/* Read what is available of the PUT payload (one readv) into the
 * reservations. *want receives the bytes asked for. Returns the bytes
 * read (> 0), 0 on EOF, or -errno (-EAGAIN: nothing to read now; -ENOMEM:
 * the reply could not be queued). When the last byte has arrived it
 * commits every block, queues the reply and sets *done to 1 (else 0). */
static long put_read(struct srv_conn *c, size_t *want, int *done)
{
	struct iovec iov[PUT_IOV_MAX];
	int n_iov = srv_put_iov(c, iov, PUT_IOV_MAX, want);
	ssize_t n;

	*done = 0;
	n = conn_recvv(c, iov, n_iov);
	if (n < 0)
		return n;
	if (n == 0)
		return 0;
	if (!srv_put_received(c, (uint64_t)n))
		return n;
	if (srv_put_finish(c, srv_now_us()) < 0)
		return -ENOMEM;
	*done = 1;
	return n;
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
		n = conn_recv(c, c->hdr_raw + c->hdr_have, *want);
		if (n <= 0)
			return n;
		if (c->hdr_have == 0)
			c->frame_start_ms = srv_now_ms(); /* the frame's deadline starts */
		c->hdr_have += (uint32_t)n;
		if (c->hdr_have == PROTO_HEADER_BYTES)
			return conn_next(c, srv_conn_header(c)) < 0 ? -ENOMEM : n;
		if (c->hdr_have >= sizeof(uint32_t) && proto_get_u32(c->hdr_raw) != PROTO_MAGIC)
			return conn_next(c, srv_conn_bad_magic(c)) < 0 ? -ENOMEM : n;
		return n;
	case SRV_CONN_BODY:
		if (body_grow(c) < 0)
			return -ENOMEM;
		*want = (c->body_cap < c->hdr.body_bytes ? c->body_cap : c->hdr.body_bytes) -
			c->body_have;
		n = conn_recv(c, c->body + c->body_have, *want);
		if (n > 0 && (c->body_have += (uint32_t)n) == c->hdr.body_bytes)
			return conn_next(c, srv_conn_body_done(c)) < 0 ? -ENOMEM : n;
		return n;
	case SRV_CONN_PAYLOAD:
		n = put_read(c, want, &done);
		if (n > 0 && done)
			conn_next(c, SRV_NEXT_HEADER);
		return n;
	case SRV_CONN_SKIP:
		*want = c->skip_bytes < SRV_SCRATCH_BYTES ? c->skip_bytes : SRV_SCRATCH_BYTES;
		n = conn_recv(c, scratch, *want);
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
		return conn_recv(c, scratch, *want);
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
				 n == -EPROTO && c->tls ? "bad TLS record or alert" : strerror((int)-n));
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
		long n = conn_out_write(c);

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
			if (c->tls)
				srv_tls_close_notify(c->tls);
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
		conn_set_reading(c, !srv_conn_out_full(c));
	return 0;
}

/* The handshake is done: count the session and say which TLS runs. */
static void tls_up(struct srv_conn *c)
{
	struct srv_stats *ss = &c->w->stats;
	bool ktx = srv_tls_ktls_send(c->tls), krx = srv_tls_ktls_recv(c->tls);
	char what[96];

	c->tls_phase = SRV_TLS_UP;
	srv_stats_add(ss, SRV_C_tls_conns_current, 1);
	srv_stats_add(ss, SRV_C_tls_conns_total, 1);
	if (ktx)
		srv_stats_add(ss, SRV_C_tls_ktls_send, 1);
	if (krx)
		srv_stats_add(ss, SRV_C_tls_ktls_recv, 1);
	srv_tls_describe(c->tls, what, sizeof(what));
	srv_debug("conn %" PRIu64 " %s: tls %s, kernel tls send %s, receive %s", c->id, c->peer,
		  what, ktx ? "yes" : "no (user space)", krx ? "yes" : "no (user space)");
}

/* The handshake failed: say why, then close the way a fatal error reply
 * does - the alert OpenSSL queued goes out, then a FIN, and what the peer
 * still sends is drained (closing at once would reset the connection and
 * could make the peer lose the alert that says why). */
static void tls_fail(struct srv_conn *c, int rc, const char *why)
{
	srv_stats_add(&c->w->stats, SRV_C_tls_handshake_errors, 1);
	srv_log(rc == -ECONNRESET ? SRV_LOG_DEBUG : SRV_LOG_INFO,
		"conn %" PRIu64 " %s: tls handshake failed: %s", c->id, c->peer, why);
	srv_tls_free(c->tls);
	c->tls = NULL;
	c->tls_phase = SRV_TLS_PLAIN; /* what follows is drained raw */
	conn_set_writing(c, 0);
	c->state = SRV_CONN_CLOSING;
	c->closing_since_ms = srv_now_ms();
	shutdown(c->fd, SHUT_WR);
	c->wr_shut = 1;
	conn_set_reading(c, 1);
}

/* Before the first frame of a server with TLS: tell TLS from plaintext by
 * the first byte, then run the handshake. Returns 0 when the connection
 * may go on reading frames (plaintext, or TLS up), 1 when it waits for
 * the socket or was closed. */
static int tls_start(struct srv_conn *c)
{
	char why[256];
	bool want_write = false;
	uint8_t first;
	ssize_t n;
	int rc;

	if (c->tls_phase == SRV_TLS_SNIFF) {
		n = recv(c->fd, &first, 1, MSG_PEEK);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return 1;
		if (n <= 0) {
			srv_conn_close(c, SRV_LOG_DEBUG, n == 0 ? "peer closed" : "read error");
			return 1;
		}
		c->frame_start_ms = srv_now_ms(); /* the handshake's deadline starts */
		if (first != SRV_TLS_HANDSHAKE_BYTE) {
			c->tls_phase = SRV_TLS_PLAIN;
			if (!c->w->srv->tls_only)
				return 0;
			srv_info("conn %" PRIu64 " %s: plaintext client refused (tls_only)", c->id,
				 c->peer);
			if (conn_next(c, srv_conn_refuse_plaintext(c)) < 0) {
				srv_conn_close(c, SRV_LOG_WARN, "aborted: out of memory");
				return 1;
			}
			conn_flush(c);
			return 1;
		}
		if (srv_tls_new(c->w->srv->tls, c->fd, &c->tls) < 0) {
			srv_conn_close(c, SRV_LOG_WARN, "aborted: no memory for a TLS session");
			return 1;
		}
		c->tls_phase = SRV_TLS_HANDSHAKE;
	}
	rc = srv_tls_handshake(c->tls, &want_write, why, sizeof(why));
	if (rc == -EAGAIN) {
		conn_set_writing(c, want_write);
		return 1;
	}
	if (rc < 0) {
		tls_fail(c, rc, why);
		return 1;
	}
	conn_set_writing(c, 0);
	tls_up(c);
	c->last_active_ms = srv_now_ms();
	return 0;
}

static void conn_read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;

	(void)fd;
	(void)what;
	if ((c->tls_phase == SRV_TLS_SNIFF || c->tls_phase == SRV_TLS_HANDSHAKE) && tls_start(c))
		return;
	if (conn_pump(c))
		return;
	if (conn_flush(c))
		return;
	tls_repump(c);
}

/* srv_transport.request_done. */
static void tcp_request_done(struct srv_conn *c, enum srv_next next)
{
	char why[64];

	if (conn_next(c, next) < 0) {
		snprintf(why, sizeof(why), "aborted: %s", strerror(ENOMEM));
		srv_conn_close(c, SRV_LOG_WARN, why);
		return;
	}
	/* Writes the reply and, in state HEADER, reads again: input that
	 * arrived meanwhile fires the level-triggered read event. */
	conn_flush(c);
}

/* srv_transport.kick: replies of parked MATCHes were queued. */
static void tcp_kick(struct srv_conn *c)
{
	conn_flush(c);
}

/* srv_transport.resume: the header held behind parked MATCHes. */
static void tcp_resume(struct srv_conn *c)
{
	if (conn_next(c, srv_conn_header(c)) < 0) {
		srv_conn_close(c, SRV_LOG_WARN, "aborted: out of memory");
		return;
	}
	/* the rest of its frame, if any, is read now */
	if (c->state == SRV_CONN_BODY || c->state == SRV_CONN_PAYLOAD || c->state == SRV_CONN_SKIP)
		conn_set_reading(c, 1);
	conn_flush(c);
}

static void conn_write_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;

	(void)fd;
	(void)what;
	if (c->tls_phase == SRV_TLS_HANDSHAKE) {
		if (tls_start(c))
			return;
		conn_read_cb(fd, EV_READ, c); /* a frame may have come with it */
		return;
	}
	if (conn_flush(c))
		return;
	/* Reading may have resumed: input already buffered in the kernel is
	 * picked up by the (level-triggered) read event. */
}

/* ---- the transport's operations -------------------------------------- */

static int tcp_reply_reserve(struct srv_conn *c, uint32_t bytes, uint8_t **p)
{
	return srv_out_reserve(&c->tx, bytes, p);
}

static void tcp_reply_commit(struct srv_conn *c, uint8_t *p, uint32_t bytes)
{
	(void)p;
	srv_out_commit(&c->tx, bytes);
}

static int tcp_reply_block(struct srv_conn *c, const uint8_t *data, uint64_t len,
			   struct store_block *block)
{
	return srv_out_block(&c->tx, data, len, block);
}

/* A rare, small body (STATS): copied into the output buffer, so that all
 * TCP output is one queue in request order. */
static int tcp_reply_buffer(struct srv_conn *c, struct evbuffer *body)
{
	size_t len = evbuffer_get_length(body);
	uint8_t *p;

	if (srv_out_reserve(&c->tx, len, &p) < 0)
		return -ENOMEM;
	if (evbuffer_remove(body, p, len) != (ev_ssize_t)len)
		return -ENOMEM; /* not committed: nothing more was queued */
	srv_out_commit(&c->tx, len);
	return 0;
}

static uint64_t tcp_pending(const struct srv_conn *c)
{
	return srv_out_bytes(&c->tx);
}

static bool tcp_idle(const struct srv_conn *c)
{
	if (c->state == SRV_CONN_WAIT || srv_out_bytes(&c->tx))
		return false;
	if (c->state == SRV_CONN_CLOSING)
		return true;
	return c->state == SRV_CONN_HEADER && c->hdr_have == 0;
}

static const struct srv_transport tcp_ops = {
	.reply_reserve = tcp_reply_reserve,
	.reply_commit = tcp_reply_commit,
	.reply_block = tcp_reply_block,
	.reply_buffer = tcp_reply_buffer,
	.pending = tcp_pending,
	.request_done = tcp_request_done,
	.idle = tcp_idle,
	.close = tcp_close,
	/* A parked MATCH's reply goes out while the connection reads on. */
	.kick = tcp_kick,
	.resume = tcp_resume,
	/* PUT bytes pass through readv: hashed as they land. */
	.put_hashes = true,
	/* No buffers of the peer's: every byte travels in the stream. */
	.entry_room = NULL,
	/* GET bytes follow the reply from the arena (srv_out.h). */
	.get_send = srv_get_reply,
};
