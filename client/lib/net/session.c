/*
 * session.c - connect, HELLO, reconnect and auto:// (session.h).
 *
 * auto:// connects over TCP and says HELLO; when the reply's rdma_port is
 * nonzero the session opens an RDMA link to that port, says HELLO there
 * (same namespace and token) and moves to it; any failure leaves it on
 * TCP. Either way the outcome is said on stderr when it changes.
 */
#include "session.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tls.h"
#include "lib/backoff.h"
#include "lib/clock.h"
#include "proto_xxh3.h"

/* Limits used to read the HELLO reply, before the server has told us its own. */
static const struct proto_limits bootstrap_limits = {
	.max_frame_bytes = PROTO_HEADER_BYTES + PROTO_ERROR_FIXED_BYTES + KVC_MESSAGE_MAX_BYTES +
			   PROTO_HELLO_REPLY_MAX_BYTES,
	.max_batch_blocks = 1,
	.max_block_bytes = 1,
};

uint16_t kvc_test_max_version;

/* Smallest frame limit that still lets a client send one entry of any batch. */
#define MIN_SERVER_FRAME_BYTES (PROTO_HEADER_BYTES + PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES)

int kvc_session_init(struct kvc_session *s, const char *url, const char *ns, const char *token,
		     uint32_t timeout_ms, struct kvc_tls_ctx *tls)
{
	size_t ns_len = strlen(ns), token_len = token ? strlen(token) : 0;
	int rc;

	memset(s, 0, sizeof(*s));
	s->link.fd = -1;
	s->link.rg = &s->regions;
	s->next_request_id = 1;
	if (!proto_name_valid(ns, ns_len) || token_len > PROTO_TOKEN_MAX_BYTES)
		return -EINVAL;
	rc = kvc_url_parse(url, &s->url);
	if (rc)
		return rc;
	if (s->url.transport == KVC_TRANSPORT_TLS && !tls)
		return -EINVAL;
	s->tls = kvc_tls_ctx_ref(tls);
	memcpy(s->ns, ns, ns_len + 1);
	s->ns_len = (uint16_t)ns_len;
	if (token_len) {
		s->token = strdup(token);
		if (!s->token)
			return -ENOMEM;
		s->token_len = (uint16_t)token_len;
	}
	s->timeout_ms = timeout_ms;
	return 0;
}

void kvc_session_free(struct kvc_session *s)
{
	kvc_session_disconnect(s);
	kvc_regions_free(&s->regions);
	free(s->token);
	free(s->buf);
	kvc_tls_ctx_unref(s->tls);
	s->tls = NULL;
	s->token = NULL;
	s->buf = NULL;
}

uint32_t kvc_session_timeout(const struct kvc_session *s)
{
	return s->timeout_ms ? s->timeout_ms : KVPOOL_DEFAULT_TIMEOUT_MS;
}

int kvc_session_connected(const struct kvc_session *s)
{
	return s->link.t != NULL;
}

static void link_close(struct kvc_link *l)
{
	if (l->t)
		l->t->close(l);
	l->t = NULL;
	l->fd = -1;
	l->priv = NULL;
}

void kvc_session_disconnect(struct kvc_session *s)
{
	link_close(&s->link);
	s->reconnect_next = 0;
}

void kvc_session_check(struct kvc_session *s)
{
	if (s->link.t && (s->reconnect_next || s->link.t->stale(&s->link)))
		kvc_session_disconnect(s);
}

uint8_t kvc_session_version(const struct kvc_session *s)
{
	return s->limits.protocol_version >= PROTO_VERSION_2 ? PROTO_VERSION_2 : PROTO_VERSION_1;
}

uint64_t kvc_session_request_id(struct kvc_session *s)
{
	if (s->next_request_id == 0)
		s->next_request_id = 1;
	return s->next_request_id++;
}

/* ---- blocking exchanges on a link (HELLO only) -------------------------------- */

/* Wait until l can move data (send: want_send) or deadline_ms passes. */
static int link_wait(struct kvc_link *l, int want_send, uint64_t deadline_ms)
{
	struct pollfd p[KVC_LINK_MAX_FDS];
	int n = l->t->pollfds(l, want_send, p), ms, rc;

	for (;;) {
		ms = kvc_ms_until(deadline_ms);
		if (ms == 0)
			return -ETIMEDOUT;
		rc = poll(p, (nfds_t)n, ms);
		if (rc > 0)
			return 0;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return errno == ENOMEM ? -ENOMEM : -ECONNRESET;
	}
}

/* Move every byte of iov[0..n) (scratch) through send or recv. */
static int link_all(struct kvc_link *l, int send, struct iovec *iov, size_t n,
		    uint64_t deadline_ms)
{
	while (n) {
		ssize_t k = send ? l->t->send(l, iov, n) : l->t->recv(l, iov, n);

		if (k == -EAGAIN) {
			int rc = link_wait(l, send, deadline_ms);

			if (rc)
				return rc;
			continue;
		}
		if (k < 0)
			return (int)k;
		if (l->t->message_mode)
			return (int)k; /* a whole message (its size) */
		while (n && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

static int buf_reserve(struct kvc_session *s, size_t bytes)
{
	uint8_t *p;

	if (bytes <= s->buf_cap)
		return 0;
	p = realloc(s->buf, bytes);
	if (!p)
		return -ENOMEM;
	s->buf = p;
	s->buf_cap = bytes;
	return 0;
}

/* Read one reply on l into s->buf: *h its header, its body from
 * s->buf + PROTO_HEADER_BYTES. */
static int link_reply(struct kvc_session *s, struct kvc_link *l, uint64_t deadline_ms,
		      struct proto_header *h)
{
	size_t cap = l->t->message_mode ? l->t->message_max_bytes : PROTO_HEADER_BYTES;
	struct iovec iov;
	int rc, got;

	rc = buf_reserve(s, cap);
	if (rc)
		return rc;
	iov = (struct iovec){ s->buf, cap };
	got = link_all(l, 0, &iov, 1, deadline_ms);
	if (got < 0)
		return got;
	if (l->t->message_mode && (size_t)got < PROTO_HEADER_BYTES)
		return -EPROTO;
	rc = kvc_frame_reply(s->buf, &s->reply_limits, h);
	if (rc)
		return rc;
	if (l->t->message_mode)
		return (size_t)got == PROTO_HEADER_BYTES + h->body_bytes ? 0 : -EPROTO;
	rc = buf_reserve(s, PROTO_HEADER_BYTES + (size_t)h->body_bytes);
	if (rc)
		return rc;
	iov = (struct iovec){ s->buf + PROTO_HEADER_BYTES, h->body_bytes };
	return h->body_bytes ? link_all(l, 0, &iov, 1, deadline_ms) : 0;
}

/* Check the limits a server announced and adopt them. */
static int adopt_limits(struct kvc_session *s, const struct proto_hello_reply *hr)
{
	if (hr->version < PROTO_VERSION_MIN || hr->version > PROTO_VERSION_MAX)
		return -EOPNOTSUPP;
	if (hr->max_batch_blocks < 1 || hr->max_block_bytes < 1 ||
	    hr->max_frame_bytes < MIN_SERVER_FRAME_BYTES)
		return -EPROTO;
	s->limits = (struct kvpool_limits){
		.max_block_bytes = hr->max_block_bytes,
		.max_batch_blocks = hr->max_batch_blocks,
		.max_frame_bytes = hr->max_frame_bytes,
		.max_lease_ms = hr->max_lease_ms,
		.rdma_port = hr->rdma_port,
		.protocol_version = hr->version,
		.max_inflight_put_bytes = hr->max_inflight_put_bytes,
		.max_match_wait_ms = hr->max_match_wait_ms,
		.max_retain_ms = hr->max_retain_ms,
	};
	s->reply_limits.max_batch_blocks = hr->max_batch_blocks;
	s->reply_limits.max_block_bytes = hr->max_block_bytes;
	s->reply_limits.max_frame_bytes =
		hr->max_frame_bytes > PROTO_HEADER_BYTES + KVC_REPLY_BODY_MAX_BYTES ?
		hr->max_frame_bytes : PROTO_HEADER_BYTES + KVC_REPLY_BODY_MAX_BYTES;
	return 0;
}

/* Say HELLO on the fresh link l and adopt the server's limits. */
static int hello(struct kvc_session *s, struct kvc_link *l, uint64_t deadline_ms)
{
	struct proto_hello hl = {
		.min_version = PROTO_VERSION_MIN,
		.max_version = kvc_test_max_version ? kvc_test_max_version : PROTO_VERSION_MAX,
		.ns = s->ns,
		.ns_len = s->ns_len,
		.token = s->token,
		.token_len = s->token_len,
	};
	size_t body_bytes = proto_hello_body_bytes(&hl);
	uint64_t id = kvc_session_request_id(s);
	struct proto_hello_reply hr;
	struct proto_header h;
	struct iovec iov;
	int rc, err;

	rc = buf_reserve(s, PROTO_HEADER_BYTES + body_bytes);
	if (rc)
		return rc;
	kvc_frame_request(s->buf, PROTO_VERSION, PROTO_OP_HELLO, id, (uint32_t)body_bytes, 0);
	if (proto_hello_encode(&hl, s->buf + PROTO_HEADER_BYTES, body_bytes))
		return -EINVAL;
	iov = (struct iovec){ s->buf, PROTO_HEADER_BYTES + body_bytes };
	s->reply_limits = bootstrap_limits;
	rc = link_all(l, 1, &iov, 1, deadline_ms);
	if (rc < 0)
		return rc;
	rc = link_reply(s, l, deadline_ms, &h);
	if (rc)
		return rc;
	if (h.opcode != PROTO_OP_NONE && (h.opcode != PROTO_OP_HELLO || h.request_id != id))
		return -EPROTO;
	if (kvc_frame_is_error(&h)) {
		if (kvc_frame_error(&h, s->buf + PROTO_HEADER_BYTES, &err, s->server_message,
				    &s->reconnect_next))
			return -EPROTO;
		kvc_frame_set_last_message(s->server_message);
		return err;
	}
	if (h.opcode != PROTO_OP_HELLO ||
	    proto_hello_reply_decode(s->buf + PROTO_HEADER_BYTES, h.body_bytes, &hr))
		return -EPROTO;
	return adopt_limits(s, &hr);
}

/* Open a link of peer t to host:port and say HELLO on it. */
static int open_link(struct kvc_session *s, struct kvc_link *l, const struct kvc_transport_ops *t,
		     const char *host, uint16_t port, uint64_t deadline_ms)
{
	int rc;

	*l = (struct kvc_link){ .t = NULL, .fd = -1, .rg = &s->regions, .tls = s->tls };
	rc = t->open(l, host, port, deadline_ms);
	if (rc)
		return rc;
	l->t = t;
	rc = hello(s, l, deadline_ms);
	if (rc)
		link_close(l);
	return rc;
}

/* Print line on stderr unless it is the line this process printed last:
 * many handles to one server (kvpool bench --connections 8, a process's
 * worker threads) say the same thing once, not once each. */
static void say_once(const char *line)
{
	static _Atomic uint64_t last;
	uint64_t h = XXH3_64bits(line, strlen(line));

	if (atomic_exchange(&last, h) != h)
		fputs(line, stderr);
}

/* auto://, after a HELLO over TCP: move to RDMA when the server offers it
 * and it can be used; otherwise stay on TCP. Said on stderr when the
 * outcome differs from the one said last. Cannot fail. */
static void auto_transport(struct kvc_session *s, uint64_t deadline_ms)
{
	struct kvpool_limits tcp_limits = s->limits;
	struct proto_limits tcp_reply = s->reply_limits;
	uint16_t port = s->limits.rdma_port;
	struct kvc_link rl;
	int rc = 0, outcome;
	char line[512];

	if (port) {
		rc = open_link(s, &rl, &kvc_rdma_transport, s->url.host, port, deadline_ms);
		if (rc == 0) {
			link_close(&s->link);
			s->link = rl;
			s->rdma_connects++;
		} else {
			s->limits = tcp_limits;
			s->reply_limits = tcp_reply;
		}
	}
	outcome = port && rc == 0 ? KVC_TRANSPORT_RDMA : KVC_TRANSPORT_TCP;
	if (s->transport_logged == outcome)
		return;
	s->transport_logged = outcome;
	if (outcome == KVC_TRANSPORT_RDMA)
		snprintf(line, sizeof(line), "libkvpool: auto://%s:%u: using rdma on port %u\n",
			 s->url.host, s->url.port, port);
	else if (port == 0)
		snprintf(line, sizeof(line),
			 "libkvpool: auto://%s:%u: the server does not serve rdma; using tcp\n",
			 s->url.host, s->url.port);
	else
		snprintf(line, sizeof(line),
			 "libkvpool: auto://%s:%u: rdma port %u unusable (%s); using tcp\n",
			 s->url.host, s->url.port, port, kvpool_strerror(rc));
	say_once(line);
}

static void sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

int kvc_session_connect(struct kvc_session *s, uint64_t deadline_ms)
{
	int rdma = s->url.transport == KVC_TRANSPORT_RDMA;
	const struct kvc_transport_ops *t = rdma ? &kvc_rdma_transport :
					    s->url.transport == KVC_TRANSPORT_TLS ? &kvc_tls_transport :
					    &kvc_tcp_transport;
	struct kvc_backoff bo;
	uint32_t wait_ms;
	int rc;

	kvc_session_disconnect(s);
	s->server_message[0] = '\0';
	/* -EAGAIN: turned away BUSY (at its connection limit). */
	kvc_backoff_start(&bo, s->busy_tries, (uintptr_t)s);
	for (;;) {
		rc = open_link(s, &s->link, t, s->url.host, s->url.port, deadline_ms);
		if (rc != -EAGAIN || !kvc_backoff_next(&bo, deadline_ms, &wait_ms))
			break;
		s->busy_retries++;
		sleep_ms(wait_ms);
	}
	if (rc) {
		s->link = (struct kvc_link){ .t = NULL, .fd = -1, .rg = &s->regions, .tls = s->tls };
		return rc;
	}
	s->connects++;
	s->rdma_connects += rdma;
	if (s->url.transport == KVC_TRANSPORT_AUTO)
		auto_transport(s, deadline_ms);
	return 0;
}
