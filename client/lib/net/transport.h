/*
 * transport.h - the one operations table behind which libkvpool's
 * transports are peers (internal). The session opens a link with the peer
 * its URL names; the engine drives every link the same way and never
 * asks which peer it is. The same idea as server/srv_transport.h, and as
 * libcurl's connection filters or Valkey's ConnectionType.
 *
 * Two kinds of peer:
 *  - stream (TCP, and TLS over a TCP socket, tls.h): send and recv move
 *    bytes of one byte stream; a request is header, body and payload in
 *    sequence, a reply likewise (a GET's payload is read straight into
 *    the caller's buffers).
 *  - message (RDMA): send takes one whole request message (header, body,
 *    one 16-byte descriptor per PUT/GET entry) or nothing, recv gives one
 *    whole reply message; the peer moves block bytes itself (the server
 *    READs and WRITEs the described buffers). Buffers outside a
 *    registered region are described through the link's staging buffer.
 *
 * Every call is non-blocking except open. Errors are normalised to the
 * set kvpool.h documents: -EAGAIN (nothing can move now), -ECONNRESET,
 * -EPIPE, -ETIMEDOUT, -ENOMEM, -EMSGSIZE (message too large), -EPROTO
 * (a message that cannot be a reply).
 *
 * Threads: a link belongs to its session; callers serialise.
 */
#ifndef KVC_TRANSPORT_H
#define KVC_TRANSPORT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "regions.h"

#define KVC_LINK_MAX_FDS 2

struct kvc_transport_ops;
struct kvc_tls_ctx;

/* One connection. Zero-initialised (t NULL) when closed. */
struct kvc_link {
	const struct kvc_transport_ops *t; /* the peer, NULL when closed */
	int fd;                        /* stream peers: the socket (-1 otherwise) */
	void *priv;                    /* the peer's own state */
	struct kvc_regions *rg;        /* the session's registered memory (borrowed) */
	struct kvc_tls_ctx *tls;       /* the TLS peer's settings (borrowed; NULL elsewhere) */
};

struct kvc_transport_ops {
	const char *name;              /* "tcp", "tls", "rdma" */
	int message_mode;              /* 0: stream, 1: message (above) */
	uint32_t max_wire_frames;      /* requests awaiting replies at most (0: no bound) */
	size_t message_max_bytes;      /* message peers: largest message either way */
	size_t desc_bytes;             /* message peers: bytes of one buffer descriptor */

	/* Connect to host:port before deadline_ms (CLOCK_MONOTONIC ms) and
	 * make what the link needs (RDMA: register every region of l->rg).
	 * On error nothing is left open. */
	int (*open)(struct kvc_link *l, const char *host, uint16_t port, uint64_t deadline_ms);
	/* Close and free (RDMA: registrations first). Accepts a closed link. */
	void (*close)(struct kvc_link *l);
	/* 1 when an idle link can no longer be used (the peer closed it,
	 * it failed, or unsolicited bytes wait). Never blocks. */
	int (*stale)(struct kvc_link *l);
	/* Stream: send what the link takes now from iov[0..n), returning the
	 * bytes taken (> 0), -EAGAIN or an error. Message: send the whole
	 * of iov[0..n) as one message, returning its size, -EAGAIN (no send
	 * buffer free now) or an error. */
	ssize_t (*send)(struct kvc_link *l, const struct iovec *iov, size_t n);
	/* Stream: read what has arrived into iov[0..n): bytes (> 0), -EAGAIN,
	 * or an error (-ECONNRESET for EOF). Message: the next whole message
	 * into iov[0] (its size), -EAGAIN, or an error. */
	ssize_t (*recv)(struct kvc_link *l, const struct iovec *iov, size_t n);
	/* The descriptors to wait on (poll(2) style) for recv, and for send
	 * when want_send; returns how many (1..KVC_LINK_MAX_FDS). */
	int (*pollfds)(const struct kvc_link *l, int want_send, struct pollfd *p);

	/* ---- message peers only (NULL for stream peers) ---- */
	/* Entries of entry_bytes a request message may carry. */
	uint32_t (*max_batch)(uint32_t entry_bytes);
	/* Staging bytes a buffer of `bytes` in iov[0..iovcnt) needs (0: it is
	 * described as it is, being one iovec inside a registered region). */
	uint64_t (*stage_need)(const struct kvc_link *l, const struct iovec *iov, int iovcnt,
			       uint64_t bytes);
	/* The staging buffer's size once made (at least min_bytes). */
	uint64_t (*stage_capacity)(const struct kvc_link *l, uint64_t min_bytes);
	/* Make the staging buffer (once per link). Errors: -ENOMEM, the
	 * registration's. */
	int (*stage_ready)(struct kvc_link *l, uint64_t min_bytes);
	/* Write the descriptor of buffer iov[0..iovcnt) of `bytes` into
	 * desc (RDMX_DESC_BYTES): as it is, or staging from stage_off on (a
	 * PUT's bytes are copied there now). */
	void (*describe)(struct kvc_link *l, const struct iovec *iov, int iovcnt, uint64_t bytes,
			 int put, uint64_t stage_off, uint8_t *desc);
	/* Copy `bytes` from staging at stage_off into iov[0..iovcnt). */
	void (*unstage)(struct kvc_link *l, uint64_t stage_off, const struct iovec *iov, int iovcnt,
			uint64_t bytes);
	/* Test hook: the staging buffer (NULL, 0 when none). */
	void (*stage_info)(const struct kvc_link *l, void **stage, size_t *bytes);
	/* Register / deregister region r on the link (r->mr). */
	int (*reg)(struct kvc_link *l, struct kvc_region *r);
	void (*dereg)(struct kvc_link *l, struct kvc_region *r);
};

/* The peers. */
extern const struct kvc_transport_ops kvc_tcp_transport;
extern const struct kvc_transport_ops kvc_tls_transport;  /* tls.h */
extern const struct kvc_transport_ops kvc_rdma_transport;

#endif /* KVC_TRANSPORT_H */
