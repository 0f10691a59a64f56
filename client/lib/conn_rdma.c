/*
 * conn_rdma.c - the RDMA side of a handle: rdma:// and auto:// URLs, the
 * RDMA connection's memory registrations and its control messages.
 *
 * rdma:// connects with rdma_cm only and says HELLO over it. auto://
 * connects over TCP and says HELLO; when the reply's rdma_port is nonzero
 * the handle connects RDMA to that port, says HELLO there (same namespace
 * and token) and moves its requests to it; any failure leaves it on TCP.
 * Either way the outcome is said on stderr when it changes.
 *
 * On RDMA every request is one SEND of a protocol frame; a PUT or GET
 * request carries one remote-buffer descriptor per entry after its body
 * (PROTOCOL.md section 13) and the server moves the bytes with RDMA
 * READ/WRITE. Buffers inside a kvpool_register'ed region are described
 * as they are (zero copy); other buffers go through a staging buffer the
 * handle allocates and registers once per RDMA connection, when it is
 * first needed (size: kvc_rdma_stage_max_bytes, KVC_RDMA_STAGE_BYTES =
 * 64 MiB, but never less than the server's max_block_bytes, so that one
 * block always fits; batches that need more are sent in pieces).
 *
 * Batch frames on RDMA are pipelined like TCP's, up to KVC_PIPELINE_FRAMES
 * (4, inside the protocol's 8 outstanding messages), except that a frame
 * using the staging buffer goes alone (batch.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "client.h"
#include "conn.h"
#include "rdmx.h"

const struct rdmx_ops *kvc_rdma_test_ops;
size_t kvc_rdma_stage_max_bytes = KVC_RDMA_STAGE_BYTES;

/* Milliseconds left until deadline_ms (at least 1). */
static uint32_t left_ms(uint64_t deadline_ms)
{
	uint64_t now = kvc_now_ms();

	if (deadline_ms <= now + 1)
		return 1;
	return deadline_ms - now > UINT32_MAX ? UINT32_MAX : (uint32_t)(deadline_ms - now);
}

void kvc_rdma_close(struct kvpool_client *c)
{
	if (!c->rdma)
		return;
	/* Memory registrations first: once they are gone no late READ or
	 * WRITE of the server (after a timeout) can reach the caller's
	 * memory, and the protection domain can go with the connection. */
	for (size_t i = 0; i < c->n_regions; i++) {
		rdmx_client_dereg(c->rdma, c->regions[i].mr);
		c->regions[i].mr = NULL;
	}
	rdmx_client_dereg(c->rdma, c->stage_mr);
	c->stage_mr = NULL;
	free(c->stage);
	c->stage = NULL;
	c->stage_bytes = 0;
	rdmx_client_close(c->rdma);
	c->rdma = NULL;
}

int kvc_rdma_reg_regions(struct kvpool_client *c)
{
	for (size_t i = 0; i < c->n_regions; i++) {
		struct kvc_region *r = &c->regions[i];
		int rc;

		if (r->mr)
			continue;
		rc = rdmx_client_reg(c->rdma, (void *)r->start, r->len_bytes, &r->mr);
		if (rc)
			return rc;
	}
	return 0;
}

int kvc_rdma_stage(struct kvpool_client *c)
{
	size_t bytes = kvc_rdma_stage_max_bytes;
	int rc;

	if (c->stage_mr)
		return 0;
	if (bytes < c->limits.max_block_bytes)
		bytes = c->limits.max_block_bytes > SIZE_MAX ? SIZE_MAX :
			(size_t)c->limits.max_block_bytes;
	c->stage = malloc(bytes);
	if (!c->stage)
		return -ENOMEM;
	rc = rdmx_client_reg(c->rdma, c->stage, bytes, &c->stage_mr);
	if (rc) {
		free(c->stage);
		c->stage = NULL;
		return rc;
	}
	c->stage_bytes = bytes;
	return 0;
}

/* What an RDMA HELLO may change, kept to restore the TCP connection's
 * state when moving fails. */
struct tcp_state {
	int fd;
	struct kvpool_limits limits;
	struct proto_limits reply_limits;
	int reconnect_next;
};

int kvc_rdma_open(struct kvpool_client *c, const char *host, uint16_t port,
		  uint64_t deadline_ms)
{
	struct tcp_state keep = { c->fd, c->limits, c->reply_limits, c->reconnect_next };
	struct rdmx_client *r = NULL;
	int rc;

	if (!c->rmsg) {
		c->rmsg = malloc(RDMX_MSG_MAX_BYTES);
		if (!c->rmsg)
			return -ENOMEM;
	}
	rc = rdmx_client_connect(host, port, left_ms(deadline_ms), kvc_rdma_test_ops, &r);
	if (rc)
		return rc;
	/* The TCP connection (auto://) is set aside while HELLO runs on RDMA. */
	c->fd = -1;
	c->rdma = r;
	rc = kvc_rdma_reg_regions(c);
	if (rc == 0)
		rc = kvc_hello(c, deadline_ms);
	if (rc) {
		kvc_rdma_close(c);
		c->fd = keep.fd;
		c->limits = keep.limits;
		c->reply_limits = keep.reply_limits;
		c->reconnect_next = keep.reconnect_next;
		return rc;
	}
	if (keep.fd >= 0)
		close(keep.fd);
	c->rdma_connects++;
	return 0;
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

void kvc_auto_transport(struct kvpool_client *c, uint64_t deadline_ms)
{
	uint16_t port = c->limits.rdma_port;
	int rc = 0, outcome;
	char line[512];

	if (port)
		rc = kvc_rdma_open(c, c->url.host, port, deadline_ms);
	outcome = port && rc == 0 ? KVC_TRANSPORT_RDMA : KVC_TRANSPORT_TCP;
	if (c->transport_logged == outcome)
		return;
	c->transport_logged = outcome;
	if (outcome == KVC_TRANSPORT_RDMA)
		snprintf(line, sizeof(line), "libkvpool: auto://%s:%u: using rdma on port %u\n",
			 c->url.host, c->url.port, port);
	else if (port == 0)
		snprintf(line, sizeof(line),
			 "libkvpool: auto://%s:%u: the server does not serve rdma; using tcp\n",
			 c->url.host, c->url.port);
	else
		snprintf(line, sizeof(line),
			 "libkvpool: auto://%s:%u: rdma port %u unusable (%s); using tcp\n",
			 c->url.host, c->url.port, port, kvpool_strerror(rc));
	say_once(line);
}

int kvc_rdma_send(struct kvpool_client *c, const uint8_t *hdr, const void *body,
		  size_t body_bytes, const struct iovec *iov, size_t iovcnt)
{
	size_t n = PROTO_HEADER_BYTES + body_bytes;
	int rc;

	for (size_t i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	if (n > RDMX_MSG_MAX_BYTES)
		return kvc_stream_error(c, -EMSGSIZE);
	memcpy(c->rmsg, hdr, PROTO_HEADER_BYTES);
	n = PROTO_HEADER_BYTES;
	if (body_bytes)
		memcpy(c->rmsg + n, body, body_bytes);
	n += body_bytes;
	for (size_t i = 0; i < iovcnt; i++) {
		memcpy(c->rmsg + n, iov[i].iov_base, iov[i].iov_len);
		n += iov[i].iov_len;
	}
	rc = rdmx_client_send(c->rdma, c->rmsg, n);
	if (rc)
		return kvc_stream_error(c, rc == -EMSGSIZE ? -EMSGSIZE : -ECONNRESET);
	return 0;
}

int kvc_rdma_recv(struct kvpool_client *c, uint64_t deadline_ms, const uint8_t **msg,
		  size_t *msg_bytes)
{
	size_t n = 0;
	int rc;

	if (c->rbuf_cap < RDMX_MSG_MAX_BYTES) {
		uint8_t *p = realloc(c->rbuf, RDMX_MSG_MAX_BYTES);

		if (!p)
			return kvc_stream_error(c, -ENOMEM);
		c->rbuf = p;
		c->rbuf_cap = RDMX_MSG_MAX_BYTES;
	}
	rc = rdmx_client_recv(c->rdma, c->rbuf, c->rbuf_cap, &n, left_ms(deadline_ms));
	if (rc == -ENOBUFS)
		rc = -EPROTO;
	else if (rc && rc != -ETIMEDOUT)
		rc = -ECONNRESET;
	if (!rc && n < PROTO_HEADER_BYTES)
		rc = -EPROTO;
	if (rc)
		return kvc_stream_error(c, rc);
	*msg = c->rbuf;
	*msg_bytes = n;
	return 0;
}
