/*
 * client.h - the libkvpool handle and its request/reply plumbing
 * (internal to libkvpool; the public API is kvpool.h).
 *
 * A handle owns at most one TCP connection. Every public call starts with
 * kvc_begin(), which fixes the call's deadline and (re)connects and says
 * HELLO when the handle is disconnected. The rule for errors is simple:
 * any function here that returns a stream error (the bytes on the
 * connection can no longer be trusted or read in step) has already closed
 * the connection, so the next call reconnects.
 *
 * Threads: like the public handle, one thread at a time.
 */
#ifndef KVC_CLIENT_H
#define KVC_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvpool.h"
#include "proto.h"
#include "url.h"

#define KVC_MESSAGE_MAX_BYTES 1024            /* server error messages kept */
#define KVC_REPLY_BODY_MAX_BYTES (64u << 20) /* largest reply body accepted */

/* One caller memory region given to kvpool_register (borrowed). */
struct kvc_region {
	uintptr_t start;
	size_t len_bytes;
};

struct kvpool_client {
	struct kvc_url url;
	char ns[PROTO_NAME_MAX_BYTES + 1];
	uint16_t ns_len;
	char *token;                    /* NULL when none */
	uint16_t token_len;
	uint32_t timeout_ms;            /* 0 = KVPOOL_DEFAULT_TIMEOUT_MS */

	int fd;                         /* -1 when disconnected */
	int reconnect_next;             /* drop the connection at the next call */
	uint64_t next_request_id;
	struct kvpool_limits limits;    /* from the last HELLO reply */
	struct proto_limits reply_limits; /* what replies are checked against */

	uint8_t *rbuf;                  /* reply bodies */
	size_t rbuf_cap;
	uint8_t *wbuf;                  /* request bodies */
	size_t wbuf_cap;
	struct iovec *iov;              /* scratch scatter-gather lists */
	size_t iov_cap;

	char server_message[KVC_MESSAGE_MAX_BYTES + 1];
	uint64_t checksum_errors;       /* GET blocks that failed verification */
	uint32_t busy_tries;            /* tries of a BUSY request; 0 = KVPOOL_BUSY_TRIES */
	uint64_t busy_retries;          /* tries repeated after BUSY */
	uint64_t connects;              /* connections that completed HELLO */

	struct kvc_region *regions;     /* kvpool_register'ed memory, sorted by start */
	size_t n_regions;
	size_t regions_cap;

	int transport_logged;           /* auto://: the TCP-or-RDMA outcome was logged */
};

/* A reply read by kvc_recv_reply. body points into the handle's reply
 * buffer and stays valid until the next kvc_recv_reply on the handle. */
struct kvc_reply {
	struct proto_header h;
	const uint8_t *body;
	size_t body_bytes;
	int err;   /* 0, or the whole-request status as -errno (error reply) */
};

/* Start a call: compute its absolute deadline from the handle's timeout
 * and make sure the handle is connected and has said HELLO. A server that
 * turns the connection away BUSY is tried again with backoff (backoff.h).
 * Errors: the shared connection errors of kvpool.h, -EOPNOTSUPP and
 * -EACCES from HELLO. */
int kvc_begin(struct kvpool_client *c, uint64_t *deadline_ms);

/* Close the connection (if any); the next kvc_begin reconnects. */
void kvc_disconnect(struct kvpool_client *c);

/* Close the connection and return `err` (for stream errors found by
 * callers, e.g. a reply whose contents do not match the request). */
int kvc_stream_error(struct kvpool_client *c, int err);

/* A fresh request id (never 0). */
uint64_t kvc_next_request_id(struct kvpool_client *c);

/* Send one request frame: header (op, request_id, body_bytes,
 * payload_bytes), the body, then the payload described by
 * iov[2..iovcnt). iov[0] and iov[1] are filled in here; the whole array is
 * scratch afterwards. payload_bytes must equal the bytes of iov[2..).
 * Errors (connection closed): -ETIMEDOUT, -EPIPE, -ECONNRESET, -ENOMEM. */
int kvc_send_request(struct kvpool_client *c, uint8_t op, uint64_t request_id, const void *body,
		     size_t body_bytes, struct iovec *iov, size_t iovcnt, uint64_t payload_bytes,
		     uint64_t deadline_ms);

/* Read the next reply's header and body and check that it answers
 * request `request_id` of opcode `op`. The payload (GET) is left unread.
 * An error reply (header status other than OK/EXISTS) is a success of this
 * function with r->err set; its message is kept (kvc_server_message).
 * Errors (connection closed): -EPROTO (not protocol v1, wrong id or op,
 * malformed error body), -EOPNOTSUPP (another protocol version),
 * -ETIMEDOUT, -ECONNRESET, -ENOMEM, or the status of a connection-level
 * error reply (opcode NONE, after which the server closes) as -errno. */
int kvc_recv_reply(struct kvpool_client *c, uint8_t op, uint64_t request_id,
		   uint64_t deadline_ms, struct kvc_reply *r);

/* Read exactly the payload bytes described by iov[0..iovcnt) (scratch,
 * as for kvc_conn_recvv). Errors (connection closed): -ETIMEDOUT,
 * -ECONNRESET, -ENOMEM. */
int kvc_recv_payload(struct kvpool_client *c, struct iovec *iov, size_t iovcnt,
		     uint64_t deadline_ms);

/* Make room for `n` entries in the handle's scratch iovec array /
 * `bytes` in its request-body buffer. Errors: -ENOMEM. */
int kvc_iov_reserve(struct kvpool_client *c, size_t n);
int kvc_wbuf_reserve(struct kvpool_client *c, size_t bytes);

/* The message of the last error reply from the server ("" if none).
 * Valid until the next call on the handle. */
const char *kvc_server_message(const struct kvpool_client *c);

/* GET blocks whose bytes failed checksum verification on this handle. */
uint64_t kvc_checksum_errors(const struct kvpool_client *c);

/* Is the handle connected now? (For tests and diagnostics.) */
int kvc_connected(const struct kvpool_client *c);

/* The registered region that holds all of buf[0..len), or NULL (the
 * lookup a transport uses to pick its zero-copy path). Cannot fail. */
const struct kvc_region *kvc_region_find(const struct kvpool_client *c, const void *buf,
					 size_t len);

/* Forget every registered region (kvpool_close). */
void kvc_regions_free(struct kvpool_client *c);

/* rdma:// (transport.c): connect with rdma_cm to the URL's host and port.
 * Errors: -EOPNOTSUPP (a build without RDMA, or this library's RDMA data
 * path, which is not built yet), -ENODEV (no RDMA device), and the errors
 * of rdma_client_connect. */
int kvc_rdma_open(struct kvpool_client *c, uint64_t deadline_ms);

/* auto:// (transport.c), after a successful HELLO over TCP: move to RDMA
 * when the server offers it (rdma_port) and it can be used; otherwise
 * stay on TCP and say why on stderr, once per handle. Cannot fail. */
void kvc_auto_transport(struct kvpool_client *c, uint64_t deadline_ms);

#endif /* KVC_CLIENT_H */
