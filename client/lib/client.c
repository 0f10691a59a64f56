/*
 * client.c - libkvpool handles: connect, HELLO, reconnect, and the framing
 * of one request and one reply.
 */
#include "client.h"
#include "cluster.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "conn.h"
#include "rdmx.h"

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

static uint32_t call_timeout_ms(const struct kvpool_client *c)
{
	return c->timeout_ms ? c->timeout_ms : KVPOOL_DEFAULT_TIMEOUT_MS;
}

void kvc_disconnect(struct kvpool_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	kvc_rdma_close(c);
	c->reconnect_next = 0;
	kvc_async_disconnected(c);
}

int kvc_stream_error(struct kvpool_client *c, int err)
{
	kvc_disconnect(c);
	return err;
}

uint64_t kvc_next_request_id(struct kvpool_client *c)
{
	if (c->next_request_id == 0)
		c->next_request_id = 1;
	return c->next_request_id++;
}

/* Grow *buf to hold at least `need` elements of `size` bytes. */
static int grow(void **buf, size_t *cap, size_t need, size_t size)
{
	size_t n = *cap ? *cap : 16;
	void *p;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	p = realloc(*buf, n * size);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

int kvc_iov_reserve(struct kvpool_client *c, size_t n)
{
	return grow((void **)&c->iov, &c->iov_cap, n, sizeof(struct iovec));
}

int kvc_wbuf_reserve(struct kvpool_client *c, size_t bytes)
{
	return grow((void **)&c->wbuf, &c->wbuf_cap, bytes, 1);
}

static int rbuf_reserve(struct kvpool_client *c, size_t bytes)
{
	return grow((void **)&c->rbuf, &c->rbuf_cap, bytes, 1);
}

int kvc_send_request(struct kvpool_client *c, uint8_t op, uint64_t request_id, const void *body,
		     size_t body_bytes, struct iovec *iov, size_t iovcnt, uint64_t payload_bytes,
		     uint64_t deadline_ms)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = op == PROTO_OP_HELLO ? PROTO_VERSION : kvc_version(c),
		.opcode = op,
		.body_bytes = (uint32_t)body_bytes,
		.request_id = request_id,
		.payload_bytes = payload_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];
	int rc;

	if (c->rdma) {
		proto_header_encode(&h, hdr);
		return kvc_rdma_send(c, hdr, body, body_bytes, iov + 2, iovcnt - 2);
	}
	if (c->fd < 0)
		return -ECONNRESET;
	proto_header_encode(&h, hdr);
	iov[0].iov_base = hdr;
	iov[0].iov_len = sizeof(hdr);
	iov[1].iov_base = (void *)body;
	iov[1].iov_len = body_bytes;
	rc = kvc_conn_sendv(c->fd, iov, iovcnt, deadline_ms);
	if (rc)
		return kvc_stream_error(c, rc);
	return 0;
}

/* The last error message a server sent to this thread, for
 * kvpool_last_server_message (kvpool_connect has no handle to keep it). */
static __thread char last_server_message[KVC_MESSAGE_MAX_BYTES + 1];

const char *kvpool_last_server_message(void)
{
	return last_server_message;
}

/* Decode an error reply's body, keep its message, and set r->err to the
 * whole-request status as -errno. Errors: -EPROTO (malformed error body). */
static int error_reply(struct kvpool_client *c, struct kvc_reply *r)
{
	uint16_t min_v, max_v;
	const char *msg;
	uint32_t msg_bytes;
	int err;

	if (r->h.payload_bytes)
		return -EPROTO;
	if (proto_error_decode(r->body, r->body_bytes, &min_v, &max_v, &msg, &msg_bytes))
		return -EPROTO;
	if (msg_bytes > KVC_MESSAGE_MAX_BYTES)
		msg_bytes = KVC_MESSAGE_MAX_BYTES;
	if (msg_bytes)
		memcpy(c->server_message, msg, msg_bytes);
	c->server_message[msg_bytes] = '\0';
	memcpy(last_server_message, c->server_message, msg_bytes + 1);
	err = proto_status_to_errno(r->h.status);
	/* After these the server may close: start afresh at the next call. */
	if (r->h.status == PROTO_STATUS_BAD_REQUEST || r->h.status == PROTO_STATUS_UNSUPPORTED)
		c->reconnect_next = 1;
	r->err = err ? err : -EPROTO;
	return 0;
}

/* Check a reply header against the request it should answer. */
static int check_reply_header(struct kvpool_client *c, const uint8_t *hdr, uint8_t op,
			      uint64_t request_id, struct kvc_reply *r)
{
	int rc = proto_header_decode(hdr, 1, &c->reply_limits, &r->h);

	if (rc)
		return rc == -EPROTONOSUPPORT ? -EOPNOTSUPP : -EPROTO;
	if (r->h.opcode != PROTO_OP_NONE &&
	    (r->h.opcode != op || r->h.request_id != request_id))
		return -EPROTO;
	if (r->h.body_bytes > KVC_REPLY_BODY_MAX_BYTES)
		return -EPROTO;
	return 0;
}

/* RDMA: the reply is one message, header then body (a GET's bytes are
 * already in the buffers described to the server: no payload follows). */
static int recv_reply_rdma(struct kvpool_client *c, uint8_t op, uint64_t request_id,
			   uint64_t deadline_ms, struct kvc_reply *r)
{
	const uint8_t *msg;
	size_t bytes;
	int rc;

	rc = kvc_rdma_recv(c, deadline_ms, &msg, &bytes);
	if (rc)
		return rc;
	rc = check_reply_header(c, msg, op, request_id, r);
	if (!rc && bytes != PROTO_HEADER_BYTES + (size_t)r->h.body_bytes)
		rc = -EPROTO;
	if (rc)
		return kvc_stream_error(c, rc);
	r->body = msg + PROTO_HEADER_BYTES;
	return 0;
}

/* TCP: the header, then the body (the payload is left unread). */
static int recv_reply_tcp(struct kvpool_client *c, uint8_t op, uint64_t request_id,
			  uint64_t deadline_ms, struct kvc_reply *r)
{
	uint8_t hdr[PROTO_HEADER_BYTES];
	int rc;

	if (c->fd < 0)
		return -ECONNRESET;
	rc = kvc_conn_recv(c->fd, hdr, sizeof(hdr), deadline_ms);
	if (rc)
		return kvc_stream_error(c, rc);
	rc = check_reply_header(c, hdr, op, request_id, r);
	if (rc)
		return kvc_stream_error(c, rc);
	rc = rbuf_reserve(c, r->h.body_bytes ? r->h.body_bytes : 1);
	if (rc)
		return kvc_stream_error(c, rc);
	rc = kvc_conn_recv(c->fd, c->rbuf, r->h.body_bytes, deadline_ms);
	if (rc)
		return kvc_stream_error(c, rc);
	r->body = c->rbuf;
	return 0;
}

int kvc_recv_reply(struct kvpool_client *c, uint8_t op, uint64_t request_id,
		   uint64_t deadline_ms, struct kvc_reply *r)
{
	int rc;

	if (c->rdma)
		rc = recv_reply_rdma(c, op, request_id, deadline_ms, r);
	else
		rc = recv_reply_tcp(c, op, request_id, deadline_ms, r);
	if (rc)
		return rc;
	r->body_bytes = r->h.body_bytes;
	r->err = 0;
	if (r->h.status != PROTO_STATUS_OK && r->h.status != PROTO_STATUS_EXISTS &&
	    error_reply(c, r))
		return kvc_stream_error(c, -EPROTO);
	/* A connection-level error (opcode NONE): the server closes. */
	if (r->h.opcode == PROTO_OP_NONE)
		return kvc_stream_error(c, r->err ? r->err : -EPROTO);
	return 0;
}

int kvc_recv_payload(struct kvpool_client *c, struct iovec *iov, size_t iovcnt,
		     uint64_t deadline_ms)
{
	int rc;

	if (c->rdma) /* RDMA replies carry no payload: a caller's mistake */
		return kvc_stream_error(c, -EPROTO);
	if (c->fd < 0)
		return -ECONNRESET;
	rc = kvc_conn_recvv(c->fd, iov, iovcnt, deadline_ms);
	if (rc)
		return kvc_stream_error(c, rc);
	return 0;
}

/* Check the limits a server announced and adopt them. */
static int adopt_limits(struct kvpool_client *c, const struct proto_hello_reply *hr)
{
	if (hr->version < PROTO_VERSION_MIN || hr->version > PROTO_VERSION_MAX)
		return -EOPNOTSUPP;
	if (hr->max_batch_blocks < 1 || hr->max_block_bytes < 1 ||
	    hr->max_frame_bytes < MIN_SERVER_FRAME_BYTES)
		return -EPROTO;
	c->limits = (struct kvpool_limits){
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
	c->reply_limits.max_batch_blocks = hr->max_batch_blocks;
	c->reply_limits.max_block_bytes = hr->max_block_bytes;
	c->reply_limits.max_frame_bytes = hr->max_frame_bytes > PROTO_HEADER_BYTES + KVC_REPLY_BODY_MAX_BYTES ?
					  hr->max_frame_bytes : PROTO_HEADER_BYTES + KVC_REPLY_BODY_MAX_BYTES;
	return 0;
}

int kvc_hello(struct kvpool_client *c, uint64_t deadline_ms)
{
	struct proto_hello h = {
		.min_version = PROTO_VERSION_MIN,
		.max_version = kvc_test_max_version ? kvc_test_max_version : PROTO_VERSION_MAX,
		.ns = c->ns,
		.ns_len = c->ns_len,
		.token = c->token,
		.token_len = c->token_len,
	};
	struct proto_hello_reply hr;
	struct kvc_reply r;
	struct iovec iov[2];
	size_t body_bytes = proto_hello_body_bytes(&h);
	uint64_t id = kvc_next_request_id(c);
	int rc;

	rc = kvc_wbuf_reserve(c, body_bytes);
	if (rc)
		return rc;
	rc = proto_hello_encode(&h, c->wbuf, c->wbuf_cap);
	if (rc)
		return rc == -ENOSPC ? -ENOMEM : -EINVAL;
	c->reply_limits = bootstrap_limits;
	rc = kvc_send_request(c, PROTO_OP_HELLO, id, c->wbuf, body_bytes, iov, 2, 0, deadline_ms);
	if (rc)
		return rc;
	rc = kvc_recv_reply(c, PROTO_OP_HELLO, id, deadline_ms, &r);
	if (rc)
		return rc;
	if (r.err)
		return r.err;
	if (proto_hello_reply_decode(r.body, r.body_bytes, &hr))
		return -EPROTO;
	return adopt_limits(c, &hr);
}

/* Connect and say HELLO once (rdma://: over rdma_cm; otherwise TCP). On
 * error the handle is left disconnected. */
static int connect_once(struct kvpool_client *c, uint64_t deadline_ms)
{
	int rc;

	if (c->url.transport == KVC_TRANSPORT_RDMA) {
		rc = kvc_rdma_open(c, c->url.host, c->url.port, deadline_ms);
		if (rc == 0)
			c->connects++;
		return rc;
	}
	rc = kvc_conn_open(c->url.host, c->url.port_str, deadline_ms, &c->fd);
	if (rc) {
		c->fd = -1;
		return rc;
	}
	rc = kvc_hello(c, deadline_ms);
	if (rc) {
		kvc_disconnect(c);
		return rc;
	}
	c->connects++;
	return 0;
}

int kvc_begin(struct kvpool_client *c, uint64_t *deadline_ms)
{
	struct kvc_backoff bo;
	int rc;

	*deadline_ms = kvc_deadline_ms(call_timeout_ms(c));
	/* Asynchronous frames on the wire: the connection is theirs. */
	if (kvc_async_busy(c))
		return -EBUSY;
	c->server_message[0] = '\0';
	last_server_message[0] = '\0';
	if (c->reconnect_next || (c->fd >= 0 && kvc_conn_stale(c->fd)) ||
	    (c->rdma && !rdmx_client_ok(c->rdma)))
		kvc_disconnect(c);
	if (kvc_connected(c))
		return 0;
	/* -EAGAIN: turned away BUSY (at its connection limit). */
	kvc_backoff_start(&bo, c);
	do
		rc = connect_once(c, *deadline_ms);
	while (rc == -EAGAIN && kvc_backoff_again(&bo, c, *deadline_ms));
	if (rc == 0 && c->url.transport == KVC_TRANSPORT_AUTO)
		kvc_auto_transport(c, *deadline_ms);
	return rc;
}

int kvpool_connect(const char *url, const char *ns, const struct kvpool_options *opts,
		   struct kvpool_client **out)
{
	struct kvpool_client *c;
	size_t ns_len, token_len = 0;
	uint64_t deadline_ms;
	int rc;

	last_server_message[0] = '\0';
	if (!url || !ns || !out)
		return -EINVAL;
	if (kvcl_is_cluster_url(url))
		return kvcl_connect(url, ns, opts, out);
	ns_len = strlen(ns);
	if (!proto_name_valid(ns, ns_len))
		return -EINVAL;
	if (opts && opts->token) {
		token_len = strlen(opts->token);
		if (token_len > PROTO_TOKEN_MAX_BYTES)
			return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	c->next_request_id = 1;
	rc = kvc_async_new(c);
	if (rc) {
		free(c);
		return rc;
	}
	rc = kvc_url_parse(url, &c->url);
	if (rc)
		goto out_free;
	memcpy(c->ns, ns, ns_len + 1);
	c->ns_len = (uint16_t)ns_len;
	if (token_len) {
		c->token = strdup(opts->token);
		if (!c->token) {
			rc = -ENOMEM;
			goto out_free;
		}
		c->token_len = (uint16_t)token_len;
	}
	c->timeout_ms = opts ? opts->timeout_ms : 0;
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		goto out_free;
	*out = c;
	return 0;

out_free:
	kvpool_close(c);
	return rc;
}

void kvpool_close(struct kvpool_client *c)
{
	if (!c)
		return;
	if (c->cluster) {
		kvcl_close(c->cluster);
		kvc_regions_free(c);
		free(c);
		return;
	}
	kvc_disconnect(c);
	free(c->token);
	free(c->rbuf);
	free(c->wbuf);
	free(c->iov);
	free(c->rmsg);
	kvc_regions_free(c);
	kvc_async_free(c);
	free(c);
}

void kvpool_set_timeout(struct kvpool_client *c, uint32_t timeout_ms)
{
	if (c && c->cluster)
		kvcl_set_timeout(c->cluster, timeout_ms);
	if (c)
		c->timeout_ms = timeout_ms;
}

int kvpool_get_limits(struct kvpool_client *c, struct kvpool_limits *out)
{
	uint64_t deadline_ms;
	int rc;

	if (!c || !out)
		return -EINVAL;
	if (c->cluster)
		return kvcl_get_limits(c->cluster, out);
	if (kvc_async_busy(c)) { /* connected, limits known */
		*out = c->limits;
		return 0;
	}
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		return rc;
	*out = c->limits;
	return 0;
}

const char *kvc_server_message(const struct kvpool_client *c)
{
	return c->server_message;
}

uint64_t kvc_checksum_errors(const struct kvpool_client *c)
{
	return c->checksum_errors;
}

void kvpool_set_busy_tries(struct kvpool_client *c, uint32_t tries)
{
	if (c && c->cluster)
		kvcl_set_busy_tries(c->cluster, tries);
	if (c)
		c->busy_tries = tries;
}

int kvpool_get_counters(const struct kvpool_client *c, struct kvpool_counters *out)
{
	if (!c || !out)
		return -EINVAL;
	if (c->cluster)
		return kvcl_get_counters(c->cluster, out);
	*out = (struct kvpool_counters){
		.connects = c->connects,
		.reconnects = c->connects ? c->connects - 1 : 0,
		.busy_retries = c->busy_retries,
		.checksum_errors = c->checksum_errors,
	};
	return 0;
}

int kvc_connected(const struct kvpool_client *c)
{
	return c->fd >= 0 || c->rdma != NULL;
}
