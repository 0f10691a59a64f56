/*
 * batch.c - frame splitting and request pipelining for batch operations.
 */
#include "batch.h"

#include <errno.h>

/* One request frame sent and not yet answered. */
struct frame {
	uint64_t request_id;
	size_t first, n;
	uint64_t payload_bytes;
	int staged;             /* RDMA: uses the staging buffer */
};

/* Frames in flight, oldest first (a ring). */
struct pipeline {
	struct frame q[KVC_PIPELINE_FRAMES];
	size_t head, len;
	uint64_t payload_bytes; /* PUT payload of the frames in flight */
	int staged;             /* RDMA: a frame in flight uses the staging buffer */
};

/* Most bytes of payload one frame (and the frames in flight together)
 * should carry: the server answers BUSY beyond its in-flight put limit. */
static uint64_t payload_cap(const struct kvpool_client *c)
{
	return c->limits.max_inflight_put_bytes ? c->limits.max_inflight_put_bytes : UINT64_MAX;
}

/* Does the batch carry descriptors (a PUT or GET on RDMA)? */
static int with_descs(const struct kvpool_client *c, const struct kvc_batch *b)
{
	return c->rdma && b->ops->describe;
}

/* Plan the frame that starts at entry `first`: how many entries it takes
 * (at least one), its payload bytes, its iovec count (with the two
 * iovecs of header and body) and (RDMA) whether it uses staging. */
static size_t plan_frame(const struct kvpool_client *c, const struct kvc_batch *b, size_t first,
			 uint64_t *payload_bytes, size_t *iovcnt, int *staged)
{
	size_t cap = (c->limits.max_frame_bytes - PROTO_HEADER_BYTES - PROTO_BATCH_PREFIX_BYTES) /
		     b->entry_bytes;
	uint64_t pay = 0, pay_cap = payload_cap(c), stage_used = 0;
	size_t n = 0, iov = 2;

	if (c->rdma && cap > rdmx_max_batch(b->entry_bytes))
		cap = rdmx_max_batch(b->entry_bytes);
	if (cap > c->limits.max_batch_blocks)
		cap = c->limits.max_batch_blocks;
	if (cap > b->count - first)
		cap = b->count - first;
	if (cap == 0)
		cap = 1;
	while (n < cap) {
		uint64_t pb = b->ops->payload_bytes ? b->ops->payload_bytes(b->ctx, first + n) : 0;

		if (n > 0 && (pay >= pay_cap || pb > pay_cap - pay))
			break;
		if (with_descs(c, b)) {
			uint64_t sb = b->ops->stage_bytes(b->ctx, c, first + n);

			if (n > 0 && sb > c->stage_bytes - stage_used)
				break;
			stage_used += sb;
		}
		pay += pb;
		if (b->ops->payload_iovcnt)
			iov += b->ops->payload_iovcnt(b->ctx, first + n);
		n++;
	}
	*payload_bytes = pay;
	*iovcnt = iov;
	*staged = stage_used > 0;
	return n;
}

/* RDMA: encode the frame of entries f->first..+f->n with one descriptor
 * per entry after the body, staging what is not in a registered region,
 * and send it as one message. */
static int send_frame_descs(struct kvpool_client *c, const struct kvc_batch *b,
			    const struct frame *f, uint64_t deadline_ms)
{
	size_t body_bytes = proto_batch_body_bytes((uint32_t)f->n, b->entry_bytes);
	uint8_t *descs;
	uint64_t off = 0;
	struct rdmx_desc d;
	int rc;

	rc = kvc_wbuf_reserve(c, body_bytes + f->n * RDMX_DESC_BYTES);
	if (!rc)
		rc = kvc_iov_reserve(c, 3);
	if (rc)
		return kvc_stream_error(c, rc);
	descs = c->wbuf + body_bytes;
	proto_batch_encode_prefix(c->wbuf, (uint32_t)f->n, b->aux);
	for (size_t i = 0; i < f->n; i++) {
		b->ops->encode(b->ctx, f->first + i, c->wbuf, (uint32_t)i);
		b->ops->describe(b->ctx, c, f->first + i, off, &d);
		rdmx_desc_encode(&d, descs + i * RDMX_DESC_BYTES);
		off += b->ops->stage_bytes(b->ctx, c, f->first + i);
	}
	c->iov[2].iov_base = descs;
	c->iov[2].iov_len = f->n * RDMX_DESC_BYTES;
	return kvc_send_request(c, b->op, f->request_id, c->wbuf, body_bytes, c->iov, 3,
				f->payload_bytes, deadline_ms);
}

/* RDMA: set up the staging buffer if some entry of the batch needs it. */
static int stage_if_needed(struct kvpool_client *c, const struct kvc_batch *b)
{
	for (size_t i = 0; i < b->count; i++)
		if (b->ops->stage_bytes(b->ctx, c, i))
			return kvc_rdma_stage(c);
	return 0;
}

/* Encode and send the frame of entries f->first..+f->n. */
static int send_frame(struct kvpool_client *c, const struct kvc_batch *b, const struct frame *f,
		      size_t iovcnt, uint64_t deadline_ms)
{
	size_t body_bytes = proto_batch_body_bytes((uint32_t)f->n, b->entry_bytes);
	size_t k = 2;
	int rc;

	if (with_descs(c, b))
		return send_frame_descs(c, b, f, deadline_ms);
	rc = kvc_wbuf_reserve(c, body_bytes);
	if (!rc)
		rc = kvc_iov_reserve(c, iovcnt);
	if (rc)
		return kvc_stream_error(c, rc);
	proto_batch_encode_prefix(c->wbuf, (uint32_t)f->n, b->aux);
	for (size_t i = 0; i < f->n; i++) {
		b->ops->encode(b->ctx, f->first + i, c->wbuf, (uint32_t)i);
		if (b->ops->payload_iov) {
			b->ops->payload_iov(b->ctx, f->first + i, c->iov + k);
			k += b->ops->payload_iovcnt(b->ctx, f->first + i);
		}
	}
	return kvc_send_request(c, b->op, f->request_id, c->wbuf, body_bytes, c->iov, k,
				f->payload_bytes, deadline_ms);
}

/* Read the reply to frame f and hand it to the batch's callbacks. */
static int recv_frame(struct kvpool_client *c, const struct kvc_batch *b, const struct frame *f,
		      uint64_t deadline_ms)
{
	struct proto_batch res;
	struct kvc_reply r;
	int rc;

	rc = kvc_recv_reply(c, b->op, f->request_id, deadline_ms, &r);
	if (rc)
		return rc;
	if (r.err) {
		b->ops->refused(b->ctx, f->first, f->n, r.err);
		return 0;
	}
	if (proto_batch_decode_v(r.body, r.body_bytes, PROTO_RESULT_ENTRY_BYTES, r.h.version,
				 &c->reply_limits, &res) ||
	    res.count != f->n)
		return kvc_stream_error(c, -EPROTO);
	return b->ops->results(b->ctx, c, f->first, f->n, &res, r.h.payload_bytes, deadline_ms);
}

int kvc_batch_run(struct kvpool_client *c, const struct kvc_batch *b, uint64_t deadline_ms)
{
	struct pipeline p = { .len = 0 };
	uint64_t cap = payload_cap(c);
	size_t next = 0;
	int rc;

	if (with_descs(c, b)) {
		rc = stage_if_needed(c, b);
		if (rc)
			return rc;
	}
	while (next < b->count || p.len) {
		if (next < b->count && p.len < KVC_PIPELINE_FRAMES) {
			struct frame f = { .first = next };
			size_t iovcnt;

			f.n = plan_frame(c, b, next, &f.payload_bytes, &iovcnt, &f.staged);
			if (p.len == 0 ||
			    (p.payload_bytes <= cap && f.payload_bytes <= cap - p.payload_bytes &&
			     !f.staged && !p.staged)) {
				f.request_id = kvc_next_request_id(c);
				rc = send_frame(c, b, &f, iovcnt, deadline_ms);
				if (rc)
					return rc;
				p.q[(p.head + p.len) % KVC_PIPELINE_FRAMES] = f;
				p.len++;
				p.payload_bytes += f.payload_bytes;
				p.staged = f.staged;
				if (p.len > c->max_frames_in_flight)
					c->max_frames_in_flight = p.len;
				next += f.n;
				continue;
			}
		}
		rc = recv_frame(c, b, &p.q[p.head], deadline_ms);
		if (rc)
			return rc;
		p.payload_bytes -= p.q[p.head].payload_bytes;
		p.staged = 0; /* a staging frame is always alone in flight */
		p.head = (p.head + 1) % KVC_PIPELINE_FRAMES;
		p.len--;
	}
	return 0;
}
