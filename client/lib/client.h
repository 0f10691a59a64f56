/*
 * client.h - the libkvpool handle and its request/reply plumbing
 * (internal to libkvpool; the public API is kvpool.h).
 *
 * A handle owns at most one connection: TCP, or RDMA (rdma://, or auto://
 * once the server offered RDMA and it worked; see conn_rdma.c). Every
 * public call starts with
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

/* Keys go on the wire as the caller gives them (server/srv_consts.c ties
 * the wire's to the pool's). */
_Static_assert(KVPOOL_KEY_BYTES == PROTO_KEY_BYTES, "a libkvpool key is a wire key");

#define KVC_MESSAGE_MAX_BYTES 1024            /* server error messages kept */
#define KVC_REPLY_BODY_MAX_BYTES (64u << 20) /* largest reply body accepted */

#define KVC_RDMA_STAGE_BYTES (64u << 20) /* largest RDMA staging buffer (see conn_rdma.c) */

struct kva;
struct rdmx_client;
struct rdmx_client_mr;
struct rdmx_ops;
struct kvcl;

/* One caller memory region given to kvpool_register (borrowed). */
struct kvc_region {
	uintptr_t start;
	size_t len_bytes;
	struct rdmx_client_mr *mr; /* its registration on the RDMA connection, or NULL */
};

struct kvpool_client {
	struct kvc_url url;
	char ns[PROTO_NAME_MAX_BYTES + 1];
	uint16_t ns_len;
	char *token;                    /* NULL when none */
	uint16_t token_len;
	uint32_t timeout_ms;            /* 0 = KVPOOL_DEFAULT_TIMEOUT_MS */

	int fd;                         /* -1 when disconnected or on RDMA */
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

	int transport_logged;           /* auto://: last outcome logged (0, KVC_TRANSPORT_TCP/_RDMA) */

	/* RDMA (rdma://, or auto:// after moving): requests go by SEND over
	 * rdma instead of fd (fd is then -1). */
	struct rdmx_client *rdma;       /* NULL unless the handle is on RDMA */
	uint8_t *rmsg;                  /* one request message (RDMX_MSG_MAX_BYTES) */
	uint8_t *stage;                 /* staging for unregistered buffers, or NULL */
	size_t stage_bytes;
	struct rdmx_client_mr *stage_mr;
	uint64_t rdma_connects;         /* RDMA connections that completed HELLO */
	size_t max_frames_in_flight;    /* most batch frames seen in flight (diagnostics) */

	/* Several nodes (cluster.c): when set, this handle has no connection
	 * of its own and every public call goes to the cluster code. */
	struct kvcl *cluster;
	struct kva *async;              /* the asynchronous core (async.c); never NULL */
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
 * payload_bytes), the body, then the bytes described by iov[2..iovcnt).
 * On TCP those are the payload and payload_bytes must equal them; on
 * RDMA they are the PUT/GET descriptors, sent in the same message, and
 * payload_bytes is only announced (PROTOCOL.md section 13).
 * iov[0] and iov[1] are filled in here; the whole array is scratch
 * afterwards.
 * Errors (connection closed): -ETIMEDOUT, -EPIPE, -ECONNRESET, -ENOMEM,
 * and on RDMA -EMSGSIZE (the message would exceed RDMX_MSG_MAX_BYTES). */
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

/* Is the handle connected now (TCP or RDMA)? (For tests and diagnostics.) */
int kvc_connected(const struct kvpool_client *c);

/* The registered region that holds all of buf[0..len), or NULL (the
 * lookup a transport uses to pick its zero-copy path). Cannot fail. */
const struct kvc_region *kvc_region_find(const struct kvpool_client *c, const void *buf,
					 size_t len);

/* Forget every registered region (kvpool_close). */
void kvc_regions_free(struct kvpool_client *c);

/* Say HELLO on the handle's fresh connection (TCP or RDMA) and adopt the
 * server's limits. On error the caller closes the connection. */
int kvc_hello(struct kvpool_client *c, uint64_t deadline_ms);

/* Test hook: the highest protocol version HELLO offers (0, the default:
 * PROTO_VERSION_MAX), so that tests can play a v1 client against a v2
 * server. Set it before connecting. Not exported by libkvpool.so. */
extern uint16_t kvc_test_max_version;

/* ---- RDMA (conn_rdma.c) -------------------------------------------------- */

/* Test hook: the verbs/rdma_cm table libkvpool's RDMA connections use.
 * NULL (the default) means the real library; unit tests point it at the
 * loopback fake. Not exported by libkvpool.so. */
extern const struct rdmx_ops *kvc_rdma_test_ops;

/* Largest staging buffer a handle registers per RDMA connection (bytes;
 * KVC_RDMA_STAGE_BYTES unless a test lowers it). The buffer actually used
 * is this, but never less than the server's max_block_bytes. */
extern size_t kvc_rdma_stage_max_bytes;

/* rdma:// (and auto:// after a TCP HELLO): connect with rdma_cm to
 * host:port, register every region of the handle, say HELLO over it;
 * on success the handle's requests go over RDMA. On error nothing of the
 * RDMA connection is left and the handle is as before.
 * Errors: -EOPNOTSUPP (a build without RDMA), -ENODEV (no RDMA device),
 * the errors of rdmx_client_connect and rdmx_client_reg, and HELLO's. */
int kvc_rdma_open(struct kvpool_client *c, const char *host, uint16_t port,
		  uint64_t deadline_ms);

/* Close the RDMA connection: deregister the regions and the staging
 * buffer, then disconnect. Accepts a handle not on RDMA. */
void kvc_rdma_close(struct kvpool_client *c);

/* auto:// (conn_rdma.c), after a successful HELLO over TCP: move to RDMA
 * when the server offers it (rdma_port) and it can be used; otherwise
 * stay on TCP. The outcome is said on stderr when it differs from the one
 * said last (so once, as long as it does not change). Cannot fail. */
void kvc_auto_transport(struct kvpool_client *c, uint64_t deadline_ms);

/* Send a request message over RDMA: header (as kvc_send_request), body,
 * then the bytes of iov[0..iovcnt) (a PUT/GET request's descriptors).
 * Errors (connection closed): -EMSGSIZE, -ECONNRESET, -ENOMEM. */
int kvc_rdma_send(struct kvpool_client *c, const uint8_t *hdr, const void *body,
		  size_t body_bytes, const struct iovec *iov, size_t iovcnt);

/* Receive the next reply message over RDMA into the reply buffer: its
 * header is decoded by the caller from (*msg)[0..32), its body follows.
 * Errors (connection closed): -ETIMEDOUT, -ECONNRESET, -ENOMEM, -EPROTO. */
int kvc_rdma_recv(struct kvpool_client *c, uint64_t deadline_ms, const uint8_t **msg,
		  size_t *msg_bytes);

/* Register every region of the handle on its RDMA connection (those not
 * registered yet). Errors: those of rdmx_client_reg. */
int kvc_rdma_reg_regions(struct kvpool_client *c);

/* Make sure the staging buffer exists on this RDMA connection (allocated
 * and registered once per connection). Errors: -ENOMEM, rdmx_client_reg's. */
int kvc_rdma_stage(struct kvpool_client *c);

/* ---- the asynchronous core (async.c) ------------------------------------ */

/* Create / free a handle's asynchronous state (kvpool_connect / close).
 * kvc_async_new errors: -ENOMEM. kvc_async_free accepts a handle without. */
int kvc_async_new(struct kvpool_client *c);
void kvc_async_free(struct kvpool_client *c);

/* kvc_disconnect tells the core that the socket is gone. */
void kvc_async_disconnected(struct kvpool_client *c);

/* 1 while asynchronous requests run or their frames are on the wire: the
 * connection is not the synchronous path's to use (kvc_begin says -EBUSY;
 * the synchronous data calls go through kvc_async_call). */
int kvc_async_busy(const struct kvpool_client *c);

/* A synchronous data call (op: enum kvpool_op) run through the
 * asynchronous core, queued behind the requests in flight; blocks until
 * it finishes. Returns what the twin returns; *matched for MATCH. */
int kvc_async_call(struct kvpool_client *c, int op, const void *blocks_or_keys, size_t count,
		   int *statuses, uint32_t lease_ms, size_t *matched);
/* kvc_async_call with the _ex twins' extras: PUT flags (may be NULL);
 * MATCH options (may be NULL) and result (required for MATCH). */
int kvc_async_call_ex(struct kvpool_client *c, int op, const void *blocks_or_keys, size_t count,
		      int *statuses, uint32_t *flags, const struct kvpool_match_opts *mopts,
		      struct kvpool_match_result *mres);

/* The synchronous data calls without the routing above (blocks.c,
 * keys.c): what kvpool_put etc. run when nothing asynchronous is in
 * flight, and what a submit runs in place on RDMA. */
int kvc_put_sync(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		 int *statuses);
int kvc_get_sync(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
		 int *statuses);
int kvc_exists_sync(struct kvpool_client *c, const void *keys, size_t count, int *statuses);
int kvc_delete_sync(struct kvpool_client *c, const void *keys, size_t count, int *statuses);
int kvc_match_sync(struct kvpool_client *c, const void *keys, size_t count, uint32_t lease_ms,
		   size_t *matched);
/* The _ex forms (kvpool_put_ex, kvpool_match_ex); the ones above call them. */
int kvc_put_sync_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		    int *statuses, uint32_t *flags);
int kvc_match_sync_ex(struct kvpool_client *c, const void *keys, size_t count,
		      const struct kvpool_match_opts *opts, struct kvpool_match_result *out);

/* ---- protocol version 2 (keys.c) ------------------------------------------ */

/* The version this handle's frames carry (after HELLO: the one agreed;
 * 1 before). */
uint8_t kvc_version(const struct kvpool_client *c);

/* Keys per MATCH frame under the handle's limits and version. */
size_t kvc_match_chunk(const struct kvpool_client *c);

/* The options one MATCH frame carries: the frame asks keys
 * first..first+n-1 of a chain (0-based), want_total leading keys of the
 * whole chain are wanted (1..count), wait_left_ms is what is left of the
 * call's wait. The frame waits only for its own share of want. */
struct proto_match_opts kvc_match_frame_opts(uint32_t first, uint32_t n, uint32_t want_total,
					     uint32_t wait_left_ms, uint32_t retain_ms);

/* Encode a MATCH request of keys[0..n) into the handle's write buffer
 * (c->wbuf) in the handle's version; *body_bytes receives its size.
 * Errors: -ENOMEM. */
int kvc_match_encode(struct kvpool_client *c, const uint8_t *keys, size_t n, uint32_t lease_ms,
		     const struct proto_match_opts *o, size_t *body_bytes);

/* Decode a MATCH reply body of protocol `version` (its header's) to a
 * frame of n keys. Errors: -EPROTO (malformed, or counts above n). */
int kvc_match_reply(uint8_t version, const uint8_t *body, size_t body_bytes, size_t n,
		    struct proto_match_reply *out);

/* Fold one MATCH frame's reply into the result of the whole call: first
 * is where the frame starts in the chain. Returns 1 when the next frame
 * is to be asked (this one matched whole), else 0. */
int kvc_match_fold(struct kvpool_match_result *acc, size_t first, size_t n,
		   const struct proto_match_reply *r);

/* The argument checks of kvpool_put / kvpool_get (blocks.c): 1 when every
 * block has a key and a valid scatter-gather list. */
int kvc_put_blocks_valid(const struct kvpool_put_block *blocks, size_t count);
int kvc_get_blocks_valid(const struct kvpool_get_block *blocks, size_t count);

#endif /* KVC_CLIENT_H */
