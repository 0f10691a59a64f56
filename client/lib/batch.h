/*
 * batch.h - split a batch of entries into request frames and pipeline
 * them on one connection (internal to libkvpool).
 *
 * A batch of `count` entries of one opcode is cut into frames that respect
 * the server's limits (entries per frame, header + body bytes per frame,
 * and for PUT the payload bytes the server lets be in flight). Up to
 * KVC_PIPELINE_FRAMES frames are sent before the oldest reply is read;
 * replies are read in request order and each must echo its request id.
 * The opcode-specific parts (entry encoding, payload, reply handling) are
 * callbacks.
 *
 * On RDMA (c->rdma) a frame takes at most rdmx_max_batch() entries, and a
 * PUT or GET frame carries one remote-buffer descriptor per entry instead
 * of a payload (PROTOCOL.md section 13). Entries whose buffer is not in a
 * registered region are staged; a frame takes no more of them than the
 * staging buffer holds, and a frame that stages goes alone (nothing else
 * in flight), so that it has the whole staging buffer. Frames without
 * staging are pipelined as on TCP.
 */
#ifndef KVC_BATCH_H
#define KVC_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "client.h"
#include "rdmx.h"

#define KVC_PIPELINE_FRAMES 4 /* TCP and RDMA (<= RDMX_MSG_DEPTH) */

struct kvc_batch_ops {
	/* Write entry i as entry j of the batch body that starts at `body`. */
	void (*encode)(void *ctx, size_t i, uint8_t *body, uint32_t j);
	/* Payload bytes entry i sends after the body (NULL: none). */
	uint64_t (*payload_bytes)(void *ctx, size_t i);
	/* Number of iovecs of entry i's payload, and write them to iov. */
	size_t (*payload_iovcnt)(void *ctx, size_t i);
	void (*payload_iov)(void *ctx, size_t i, struct iovec *iov);
	/* Handle the results of entries first..first+n-1 (b->count == n
	 * already checked) and read the reply's payload_bytes of payload.
	 * Returns 0, or a stream error after kvc_stream_error(). */
	int (*results)(void *ctx, struct kvpool_client *c, size_t first, size_t n,
		       const struct proto_batch *b, uint64_t payload_bytes, uint64_t deadline_ms);
	/* The server refused the whole frame first..first+n-1 with `err`. */
	void (*refused)(void *ctx, size_t first, size_t n, int err);
	/* RDMA (NULL: the opcode has no descriptors): bytes of the staging
	 * buffer entry i needs (0: its buffer is described as it is). */
	uint64_t (*stage_bytes)(void *ctx, const struct kvpool_client *c, size_t i);
	/* RDMA: write entry i's descriptor; a staged entry uses the staging
	 * buffer from byte stage_off on (a PUT copies its bytes there). */
	void (*describe)(void *ctx, struct kvpool_client *c, size_t i, uint64_t stage_off,
			 struct rdmx_desc *d);
};

struct kvc_batch {
	uint8_t op;
	uint32_t entry_bytes;  /* proto_request_entry_bytes(op) */
	uint32_t aux;          /* batch prefix aux field */
	size_t count;          /* entries 0..count-1 */
	const struct kvc_batch_ops *ops;
	void *ctx;
};

/* Send every entry of `b` and hand every reply to its callbacks.
 * The handle must be connected (kvc_begin).
 * Errors (connection closed; some frames may have been answered):
 *   -EPROTO, -ETIMEDOUT, -ECONNRESET, -EPIPE, -ENOMEM, -EOPNOTSUPP;
 *   on RDMA also the staging buffer's -ENOMEM / registration errors
 *   (connection kept, nothing sent). */
int kvc_batch_run(struct kvpool_client *c, const struct kvc_batch *b, uint64_t deadline_ms);

#endif /* KVC_BATCH_H */
