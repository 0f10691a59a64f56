/*
 * rdma.c - the RDMA peer (transport.h), a message peer over rdma/'s
 * client side: one SEND per request (header, body, one remote-buffer
 * descriptor per PUT/GET entry, PROTOCOL.md section 13), one message per
 * reply; the server moves block bytes with RDMA READ (PUT) and WRITE
 * (GET).
 *
 * Buffers inside a kvpool_register'ed region are described as they are
 * (zero copy): every region of the session is registered when the link
 * opens and as it is added. Other buffers go through a staging buffer the
 * link allocates and registers once, when first needed (size:
 * kvc_rdma_stage_max_bytes, KVC_RDMA_STAGE_BYTES = 64 MiB, but never less
 * than the server's max_block_bytes, so that one block always fits; the
 * engine sends no more staged entries in one request than it holds, and
 * one staged request at a time).
 *
 * Closing deregisters the memory first: once the registrations are gone
 * no late READ or WRITE of the server (after a timeout) can reach the
 * caller's memory, and the protection domain goes with the connection.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/clock.h"
#include "rdma.h"
#include "rdmx.h"
#include "transport.h"

const struct rdmx_ops *kvc_rdma_test_ops;
size_t kvc_rdma_stage_max_bytes = KVC_RDMA_STAGE_BYTES;

struct rdma_link {
	struct rdmx_client *c;
	uint8_t *msg;                 /* one request message (RDMX_MSG_MAX_BYTES) */
	uint8_t *stage;               /* staging for unregistered buffers, or NULL */
	size_t stage_bytes;
	struct rdmx_client_mr *stage_mr;
};

static struct rdma_link *rl_of(const struct kvc_link *l)
{
	return l->priv;
}

static void rdma_close(struct kvc_link *l)
{
	struct rdma_link *r = rl_of(l);

	if (!r)
		return;
	for (size_t i = 0; l->rg && i < l->rg->n; i++) {
		rdmx_client_dereg(r->c, l->rg->r[i].mr);
		l->rg->r[i].mr = NULL;
	}
	rdmx_client_dereg(r->c, r->stage_mr);
	free(r->stage);
	rdmx_client_close(r->c);
	free(r->msg);
	free(r);
	l->priv = NULL;
}

static int rdma_reg(struct kvc_link *l, struct kvc_region *g)
{
	return rdmx_client_reg(rl_of(l)->c, (void *)g->start, g->len_bytes,
			       (struct rdmx_client_mr **)&g->mr);
}

static void rdma_dereg(struct kvc_link *l, struct kvc_region *g)
{
	rdmx_client_dereg(rl_of(l)->c, g->mr);
	g->mr = NULL;
}

static int rdma_open(struct kvc_link *l, const char *host, uint16_t port, uint64_t deadline_ms)
{
	struct rdma_link *r = calloc(1, sizeof(*r));
	int left = kvc_ms_until(deadline_ms), rc;

	if (!r || !(r->msg = malloc(RDMX_MSG_MAX_BYTES))) {
		free(r);
		return -ENOMEM;
	}
	rc = rdmx_client_connect(host, port, left > 0 ? (uint32_t)left : 1, kvc_rdma_test_ops, &r->c);
	if (rc) {
		free(r->msg);
		free(r);
		return rc;
	}
	l->priv = r;
	l->fd = -1;
	for (size_t i = 0; l->rg && i < l->rg->n && !rc; i++)
		if (!l->rg->r[i].mr)
			rc = rdma_reg(l, &l->rg->r[i]);
	if (rc)
		rdma_close(l);
	return rc;
}

static int rdma_stale(struct kvc_link *l)
{
	return !rdmx_client_ok(rl_of(l)->c);
}

static ssize_t rdma_send(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	struct rdma_link *r = rl_of(l);
	size_t bytes = 0;
	int rc;

	for (size_t i = 0; i < n; i++) {
		if (iov[i].iov_len > RDMX_MSG_MAX_BYTES - bytes)
			return -EMSGSIZE;
		memcpy(r->msg + bytes, iov[i].iov_base, iov[i].iov_len);
		bytes += iov[i].iov_len;
	}
	rc = rdmx_client_send(r->c, r->msg, bytes);
	if (rc == 0)
		return (ssize_t)bytes;
	return rc == -EAGAIN || rc == -EMSGSIZE ? rc : -ECONNRESET;
}

static ssize_t rdma_recv(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	size_t bytes = 0;
	int rc;

	(void)n;
	rc = rdmx_client_try_recv(rl_of(l)->c, iov[0].iov_base, iov[0].iov_len, &bytes);
	if (rc == -EAGAIN)
		return -EAGAIN;
	if (rc == -ENOBUFS)
		return -EPROTO;
	if (rc)
		return -ECONNRESET;
	return (ssize_t)bytes;
}

static int rdma_pollfds(const struct kvc_link *l, int want_send, struct pollfd *p)
{
	int fds[2];

	(void)want_send; /* send room comes back as a completion, on fds[0] */
	rdmx_client_fds(rl_of(l)->c, fds);
	p[0] = (struct pollfd){ .fd = fds[0], .events = POLLIN };
	p[1] = (struct pollfd){ .fd = fds[1], .events = POLLIN };
	return 2;
}

/* The registered region holding buffer iov[0..iovcnt) of `bytes` bytes
 * when it can be described as it is (one iovec, all of it inside a region
 * registered on the link), else NULL. */
static const struct kvc_region *direct_region(const struct kvc_link *l, const struct iovec *iov,
					      int iovcnt, uint64_t bytes)
{
	const struct kvc_region *g;

	if (iovcnt != 1 || bytes > UINT32_MAX || bytes > iov[0].iov_len)
		return NULL;
	g = kvc_regions_find(l->rg, iov[0].iov_base, (size_t)bytes);
	return g && g->mr ? g : NULL;
}

static uint64_t rdma_stage_need(const struct kvc_link *l, const struct iovec *iov, int iovcnt,
				uint64_t bytes)
{
	return direct_region(l, iov, iovcnt, bytes) ? 0 : bytes;
}

static uint64_t rdma_stage_capacity(const struct kvc_link *l, uint64_t min_bytes)
{
	const struct rdma_link *r = rl_of(l);

	if (r->stage_mr)
		return r->stage_bytes;
	return min_bytes > kvc_rdma_stage_max_bytes ? min_bytes : kvc_rdma_stage_max_bytes;
}

static int rdma_stage_ready(struct kvc_link *l, uint64_t min_bytes)
{
	struct rdma_link *r = rl_of(l);
	uint64_t bytes = rdma_stage_capacity(l, min_bytes);
	int rc;

	if (r->stage_mr)
		return 0;
	if (bytes > SIZE_MAX)
		return -ENOMEM;
	r->stage = malloc((size_t)bytes);
	if (!r->stage)
		return -ENOMEM;
	rc = rdmx_client_reg(r->c, r->stage, (size_t)bytes, &r->stage_mr);
	if (rc) {
		free(r->stage);
		r->stage = NULL;
		r->stage_mr = NULL;
		return rc;
	}
	r->stage_bytes = (size_t)bytes;
	return 0;
}

/* Copy the first `bytes` bytes of iov[0..iovcnt) into dst, or back. */
static void copy_iov(uint8_t *flat, const struct iovec *iov, int iovcnt, uint64_t bytes,
		     int to_flat)
{
	for (int i = 0; i < iovcnt && bytes; i++) {
		size_t n = iov[i].iov_len < bytes ? iov[i].iov_len : (size_t)bytes;

		if (to_flat)
			memcpy(flat, iov[i].iov_base, n);
		else
			memcpy(iov[i].iov_base, flat, n);
		flat += n;
		bytes -= n;
	}
}

static void rdma_describe(struct kvc_link *l, const struct iovec *iov, int iovcnt, uint64_t bytes,
			  int put, uint64_t stage_off, uint8_t *desc)
{
	struct rdma_link *r = rl_of(l);
	const struct kvc_region *g = direct_region(l, iov, iovcnt, bytes);
	struct rdmx_desc d = { .length = (uint32_t)bytes };

	if (g) {
		d.addr = (uint64_t)(uintptr_t)iov[0].iov_base;
		d.rkey = rdmx_client_mr_rkey(g->mr);
	} else {
		if (put)
			copy_iov(r->stage + stage_off, iov, iovcnt, bytes, 1);
		d.addr = (uint64_t)(uintptr_t)(r->stage + stage_off);
		d.rkey = rdmx_client_mr_rkey(r->stage_mr);
	}
	rdmx_desc_encode(&d, desc);
}

static void rdma_unstage(struct kvc_link *l, uint64_t stage_off, const struct iovec *iov,
			 int iovcnt, uint64_t bytes)
{
	copy_iov(rl_of(l)->stage + stage_off, (struct iovec *)iov, iovcnt, bytes, 0);
}

static void rdma_stage_info(const struct kvc_link *l, void **stage, size_t *bytes)
{
	const struct rdma_link *r = rl_of(l);

	*stage = r ? r->stage : NULL;
	*bytes = r ? r->stage_bytes : 0;
}

const struct kvc_transport_ops kvc_rdma_transport = {
	.name = "rdma",
	.message_mode = 1,
	.max_wire_frames = KVC_RDMA_WIRE_FRAMES,
	.message_max_bytes = RDMX_MSG_MAX_BYTES,
	.desc_bytes = RDMX_DESC_BYTES,
	.open = rdma_open,
	.close = rdma_close,
	.stale = rdma_stale,
	.send = rdma_send,
	.recv = rdma_recv,
	.pollfds = rdma_pollfds,
	.max_batch = rdmx_max_batch,
	.stage_need = rdma_stage_need,
	.stage_capacity = rdma_stage_capacity,
	.stage_ready = rdma_stage_ready,
	.describe = rdma_describe,
	.unstage = rdma_unstage,
	.stage_info = rdma_stage_info,
	.reg = rdma_reg,
	.dereg = rdma_dereg,
};
