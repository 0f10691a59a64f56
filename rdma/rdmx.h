/*
 * rdmx.h - kvpool's RDMA transport (librdmacm + libibverbs), used by
 * kvpoold (server/srv_rdma.c) and libkvpool (client/lib/conn_rdma.c).
 *
 * Model (see rdma/README.md and proto/PROTOCOL.md section 13)
 *  - Connections are made with rdma_cm on their own port (rdma_port,
 *    default 7472). Each has its own RC queue pair, completion queue and
 *    completion channel. Control messages (protocol frames, the same
 *    proto/ codec as TCP) travel by SEND/RECV through a small ring of
 *    pre-registered message buffers.
 *  - Block bytes never travel in messages: the server pulls a PUT's bytes
 *    with RDMA READ from the client's registered buffers straight into its
 *    arena, and pushes a GET's bytes with RDMA WRITE from the arena into
 *    the client's buffers. Only the server posts READ/WRITE; the server's
 *    own memory is registered without any remote access, so no client ever
 *    holds an rkey to it.
 *  - Work requests are bounded per QP (RDMX_QP_MAX_XFER) and per worker
 *    (struct rdmx_budget); a transfer larger than the bound is posted in
 *    pieces as completions come back (pipelined, never refused).
 *  - Completions are handled status first: any status other than success
 *    puts the connection in RDMX_CONN_ERROR; the transfer in progress
 *    reports -EIO and the connection is torn down (QP, CQ, channel, id, in
 *    reverse order of setup).
 *
 * Every libibverbs/librdmacm call goes through a struct rdmx_ops
 * (rdmx_ops.h). A NULL ops argument means the real library.
 *
 * Built with RDMA=0 (no rdma-core headers) every function here that
 * would touch a device returns -EOPNOTSUPP with the reason "built without
 * RDMA support"; the descriptor codec works in both builds.
 *
 * Functions return 0 or a negative errno; out-parameters are written only
 * on success. Threads: a listener belongs to kvpoold's main thread, a
 * worker context and its connections to one worker thread; a client
 * connection to the thread using its kvpool handle. Nothing here locks.
 */
#ifndef KVPOOL_RDMX_H
#define KVPOOL_RDMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define RDMX_DEFAULT_PORT 7472
#define RDMX_DESC_BYTES 16         /* addr u64, rkey u32, length u32 */
#define RDMX_MSG_MAX_BYTES 65536u  /* one control message (SEND), descriptors included */
#define RDMX_MSG_DEPTH 8u          /* RECVs posted per connection = control messages a
				    * peer may have outstanding (the client's credit) */
#define RDMX_QP_MAX_XFER 32u       /* READ/WRITE work requests outstanding per QP */
#define RDMX_WORKER_MAX_XFER 256u  /* ... and per worker, over all its connections */
#define RDMX_REASON_BYTES 256      /* why RDMA is unavailable, one line */

struct rdmx_ops;

/* ---- remote-buffer descriptors ----------------------------------------- */

/* One block's buffer in the client's registered memory. On the wire: 16
 * bytes, little-endian like every protocol integer: addr u64 at 0, rkey
 * u32 at 8, length u32 at 12. */
struct rdmx_desc {
	uint64_t addr;   /* virtual address in the client's process */
	uint32_t rkey;   /* of the client's memory region holding it */
	uint32_t length; /* bytes: a PUT block's length, a GET buffer's size */
};

/* Encode / decode one descriptor. Cannot fail. */
void rdmx_desc_encode(const struct rdmx_desc *d, uint8_t out[RDMX_DESC_BYTES]);
void rdmx_desc_decode(const uint8_t in[RDMX_DESC_BYTES], struct rdmx_desc *d);

/* Bytes of an RDMA control message carrying header h (its body) and, for
 * a PUT or GET request, one descriptor per entry: 32 + body_bytes +
 * count * 16. */
size_t rdmx_msg_bytes(const struct proto_header *h, uint32_t desc_count);

/* Find the descriptors of a PUT or GET request message msg[0..msg_bytes)
 * whose header is h and whose batch has `count` entries: *descs points at
 * the first one (borrowed from msg). Errors: -EPROTO (the message is not
 * exactly 32 + body_bytes + count * 16 bytes), -EMSGSIZE (it would exceed
 * RDMX_MSG_MAX_BYTES). */
int rdmx_msg_descs(const uint8_t *msg, size_t msg_bytes, const struct proto_header *h,
		   uint32_t count, const uint8_t **descs);

/* Largest batch of `entry_bytes` entries whose request message (header,
 * prefix, entries, one descriptor each) fits RDMX_MSG_MAX_BYTES. */
uint32_t rdmx_max_batch(uint32_t entry_bytes);

/* Whether this build has the real transport (RDMA=1). */
bool rdmx_built(void);

/* ---- work-request budget --------------------------------------------- */

/* READ/WRITE work requests outstanding over one worker's connections. */
struct rdmx_budget {
	uint32_t outstanding;
	uint32_t max;      /* RDMX_WORKER_MAX_XFER unless a test sets it */
};

/* ---- server: listener and per-worker context --------------------------- */

struct rdmx_listener;
struct rdmx_worker;
struct rdmx_conn;

struct rdmx_listener_config {
	const char *listen;        /* address to bind (IPv4/IPv6/name) */
	uint16_t port;             /* rdma_port */
	void *arena;               /* the store's arena: registered once, one MR */
	uint64_t arena_bytes;
	const struct rdmx_ops *ops; /* NULL: the real library */
};

/* Main thread: find a device, bind and listen on listen:port, allocate the
 * protection domain and register the whole arena once (local access only:
 * no rkey of it is ever given out). On failure why[0..why_len) says what
 * failed in one line and nothing is left allocated.
 * Errors: -EOPNOTSUPP (built with RDMA=0), -ENODEV (no RDMA device), -EINVAL
 * (address does not resolve), and the -errno of the step that failed
 * (creating the event channel, binding, listening, the PD, registering the
 * arena: -ENOMEM / -EPERM for a too small RLIMIT_MEMLOCK). */
int rdmx_listener_open(const struct rdmx_listener_config *cfg, struct rdmx_listener **out,
		       char *why, size_t why_len);

/* Close the listener: deregister the arena, free the PD, destroy the id and
 * the event channel, in reverse order of setup. Every worker context and
 * connection must be gone first. Accepts NULL. */
void rdmx_listener_close(struct rdmx_listener *l);

/* The listener's rdma_cm event channel fd (non-blocking), for an EV_READ
 * event in the main event base. */
int rdmx_listener_fd(const struct rdmx_listener *l);

/* Main thread, when rdmx_listener_fd is readable: take one connection
 * request. *req (opaque, the new rdma_cm id) goes to a worker's
 * rdmx_conn_accept, which owns it from then on; other events are
 * acknowledged and ignored. Returns 1 with *req set, 0 when there is
 * nothing (more) to take (-EAGAIN from the channel), or -errno. */
int rdmx_listener_take(struct rdmx_listener *l, void **req);

/* Refuse and destroy a request nobody will accept (shutdown, no memory). */
void rdmx_listener_refuse(struct rdmx_listener *l, void *req);

/* A worker thread's context: its own rdma_cm event channel (connections
 * are migrated onto it) and its work-request budget. Created on the main
 * thread before the worker starts; used by the worker only.
 * Errors: -EOPNOTSUPP (RDMA=0), -errno from the event channel. */
int rdmx_worker_open(struct rdmx_listener *l, struct rdmx_worker **out);
void rdmx_worker_close(struct rdmx_worker *w); /* accepts NULL; conns must be gone */
int rdmx_worker_fd(const struct rdmx_worker *w); /* its CM channel fd (non-blocking) */
struct rdmx_budget *rdmx_worker_budget(struct rdmx_worker *w);

/* Worker thread, when rdmx_worker_fd is readable: handle every pending CM
 * event (ESTABLISHED, DISCONNECTED, errors) of this worker's connections,
 * calling their callbacks. */
void rdmx_worker_cm_events(struct rdmx_worker *w);

/* ---- connections ------------------------------------------------------ */

enum rdmx_conn_state {
	RDMX_CONN_IDLE,         /* allocated, nothing set up */
	RDMX_CONN_RESOLVING,    /* client: address and route being resolved */
	RDMX_CONN_CONNECTING,   /* QP ready, accept/connect sent */
	RDMX_CONN_ESTABLISHED,  /* messages and transfers may flow */
	RDMX_CONN_ERROR,        /* a work request failed or the peer left */
	RDMX_CONN_CLOSED,       /* torn down */
};

enum rdmx_xfer_op { RDMX_XFER_READ, RDMX_XFER_WRITE };

/* One piece of a transfer: local bytes in the server's arena (covered by
 * the arena MR) and the client buffer they come from or go to. */
struct rdmx_xfer_item {
	void *local;
	uint32_t length;
	uint64_t remote_addr;
	uint32_t rkey;
};

/* Callbacks of a server connection; called on its worker thread. */
struct rdmx_conn_cbs {
	/* A control message arrived: msg[0..bytes) is valid during the call
	 * only. */
	void (*on_msg)(struct rdmx_conn *c, const uint8_t *msg, size_t bytes, void *arg);
	/* The transfer started by rdmx_conn_xfer ended: 0 when every item
	 * completed successfully, else -EIO (a work request failed; the
	 * connection is then in RDMX_CONN_ERROR and on_close follows). */
	void (*on_xfer_done)(struct rdmx_conn *c, int status, void *arg);
	/* The connection is gone (peer left, error, rdmx_conn_close): the QP
	 * is already destroyed, so no DMA into local memory can still
	 * happen, and the caller may release what the transfer used. c is
	 * freed after the call returns. */
	void (*on_close)(struct rdmx_conn *c, const char *reason, void *arg);
};

/* Worker thread: accept connection request `req` (from
 * rdmx_listener_take): migrate its id to the worker's channel, create the
 * completion channel, CQ and QP, register and post the message buffers,
 * then accept. The connection becomes ESTABLISHED on the CM event. On
 * error everything set up so far is undone in reverse order, the request
 * is rejected and destroyed, and *out is untouched.
 * Errors: -EOPNOTSUPP (RDMA=0), -ENOMEM, -errno of the failing step. */
int rdmx_conn_accept(struct rdmx_worker *w, void *req, const struct rdmx_conn_cbs *cbs,
		     void *arg, struct rdmx_conn **out);

/* The completion channel fd (non-blocking): add it as EV_READ. */
int rdmx_conn_fd(const struct rdmx_conn *c);

enum rdmx_conn_state rdmx_conn_state(const struct rdmx_conn *c);

/* Worker thread, when rdmx_conn_fd is readable: take the CQ event, re-arm,
 * drain the CQ (status first, then by kind), post what the budget now
 * allows, call the callbacks. May close c (on_close runs). */
void rdmx_conn_completions(struct rdmx_conn *c);

/* Send one control message (copied into a message buffer).
 * Errors: -EMSGSIZE (over RDMX_MSG_MAX_BYTES), -EAGAIN (every send buffer
 * is in flight), -ENOTCONN (not ESTABLISHED), -errno from posting. */
int rdmx_conn_send(struct rdmx_conn *c, const void *msg, size_t bytes);

/* Start a transfer of n items (one at a time per connection): READ pulls
 * remote -> local, WRITE pushes local -> remote. Items are posted as the
 * per-QP and per-worker bounds allow; on_xfer_done reports the end.
 * `items` is copied. Errors: -EBUSY (a transfer is in progress),
 * -ENOTCONN, -EINVAL (n == 0 or a local range outside the arena MR),
 * -ENOMEM. */
int rdmx_conn_xfer(struct rdmx_conn *c, enum rdmx_xfer_op op, const struct rdmx_xfer_item *items,
		   uint32_t n);

/* Tear the connection down now (reverse order of setup) and call on_close
 * with `reason`. Accepts NULL. */
void rdmx_conn_close(struct rdmx_conn *c, const char *reason);

/* Work requests of c outstanding now (READ/WRITE), for tests. */
uint32_t rdmx_conn_outstanding(const struct rdmx_conn *c);

/* ---- client ----------------------------------------------------------- */

struct rdmx_client;
struct rdmx_client_mr;

/* Connect to host:port with rdma_cm, blocking up to timeout_ms (address,
 * route, QP, message buffers, connect). Errors: -EOPNOTSUPP (RDMA=0),
 * -ENODEV (no RDMA device), -ETIMEDOUT, -ECONNREFUSED, -ENOENT (host does
 * not resolve), -ENOMEM, -errno of the failing step. */
int rdmx_client_connect(const char *host, uint16_t port, uint32_t timeout_ms,
			const struct rdmx_ops *ops, struct rdmx_client **out);

/* Disconnect and free. Deregister every rdmx_client_reg region first
 * (the protection domain is freed here). Accepts NULL. */
void rdmx_client_close(struct rdmx_client *c);

/* Register buf[0..len) for remote read and write by the server (the
 * server pulls PUT bytes from it and pushes GET bytes into it).
 * Errors: -ENOMEM / -EPERM (RLIMIT_MEMLOCK), -EINVAL, -EOPNOTSUPP. */
int rdmx_client_reg(struct rdmx_client *c, void *buf, size_t len, struct rdmx_client_mr **out);
uint32_t rdmx_client_mr_rkey(const struct rdmx_client_mr *mr);
void rdmx_client_dereg(struct rdmx_client *c, struct rdmx_client_mr *mr); /* accepts NULL */

/* Send one control message (copied: msg may be reused at once). Replies
 * are taken with rdmx_client_recv, in order; up to RDMX_MSG_DEPTH
 * messages may be outstanding. Fails with -ECONNRESET when the
 * server has left (a DISCONNECTED event is pending) or the send could not
 * be posted; the connection is then unusable (rdmx_client_ok is false).
 * Errors: -EMSGSIZE (over RDMX_MSG_MAX_BYTES), -EAGAIN (every send buffer
 * still in flight), -ECONNRESET. */
int rdmx_client_send(struct rdmx_client *c, const void *msg, size_t msg_bytes);

/* Wait up to timeout_ms for the next message from the server and copy it
 * into buf[0..cap); *bytes receives its length. Watches the CM channel
 * too, so a server that disconnects fails the wait at once.
 * Errors: -ETIMEDOUT, -ECONNRESET (error completion, or the server left),
 * -ENOBUFS (message larger than cap; it is dropped). */
int rdmx_client_recv(struct rdmx_client *c, void *buf, size_t cap, size_t *bytes,
		     uint32_t timeout_ms);

/* rdmx_client_recv without waiting, for an event loop: the next message
 * if one is in (0, *bytes), else -EAGAIN, having armed the completion
 * channel so that rdmx_client_fds become readable when one comes (or the
 * server leaves). Takes the pending channel events, so a loop that calls
 * it until -EAGAIN before waiting never spins. Reaps SEND completions,
 * making room for rdmx_client_send after its -EAGAIN.
 * Errors: -ECONNRESET (error completion, or the server left), -ENOBUFS
 * (message larger than cap; it is dropped). */
int rdmx_client_try_recv(struct rdmx_client *c, void *buf, size_t cap, size_t *bytes);

/* The two descriptors to wait on for readability with poll(2)/epoll:
 * fds[0] the completion channel, fds[1] the CM event channel. They stay
 * the same until rdmx_client_close. Returns 0 (-EOPNOTSUPP with RDMA=0). */
int rdmx_client_fds(const struct rdmx_client *c, int fds[2]);

/* Whether the connection is established and has seen no error; takes the
 * CM events pending first (never blocks), so a server that left between
 * calls is noticed here (as a TCP client notices a closed socket). */
bool rdmx_client_ok(struct rdmx_client *c);

/* Send one control message and wait for the next reply message into
 * buf[0..cap); *bytes receives its length. Blocks up to timeout_ms.
 * Errors: -EMSGSIZE, -ETIMEDOUT, -ECONNRESET (error completion or peer
 * gone), -ENOBUFS (reply larger than cap). */
int rdmx_client_call(struct rdmx_client *c, const void *msg, size_t msg_bytes, void *buf,
		     size_t cap, size_t *bytes, uint32_t timeout_ms);

#endif /* KVPOOL_RDMX_H */
