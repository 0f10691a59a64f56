/*
 * srv_conn.h - one client connection on a worker thread, whatever its
 * transport: the session (HELLO state, namespace, lessee), the request in
 * hand (header and body checks, then dispatch to srv_request.c), replies
 * and error replies, timeouts, and closing. No socket and no queue pair
 * here: the transport (srv_transport.h; srv_tcp.c, srv_rdma_conn.c)
 * moves the bytes and calls in.
 *
 * A request body is checked against what its opcode can need
 * (srv_conn_body_max) before any of it is buffered. A frame must arrive
 * whole within payload_timeout_ms of its first header byte. Replies go
 * out in request order through the transport's reply operations.
 * A connection is touched only by the worker thread that owns it.
 *
 * A GET whose blocks must first be read from NVMe parks the connection
 * (SRV_CONN_WAIT): no further request is read until every promotion has
 * reported back through the worker's completion queue, so replies stay in
 * request order. A connection closed meanwhile becomes a zombie, freed
 * when its last promotion reports.
 *
 * A MATCH that waits for blocks (srv_mwait.h) is parked without stopping
 * the connection: further MATCHes are read and queued behind it, and any
 * other request is held, unhandled, until every MATCH before it has been
 * answered.
 */
#ifndef KVPOOL_SRV_CONN_H
#define KVPOOL_SRV_CONN_H

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"
#include "srv_out.h"
#include "srv_transport.h"
#include "store.h"

struct srv_worker;
struct srv_rconn;
struct srv_mw;
struct store_block;
struct XXH3_state_s;
struct store_lessee;
struct store_tenant;
struct event;
struct evbuffer;

enum srv_conn_state {
	SRV_CONN_HEADER,  /* reading the 32-byte frame header */
	SRV_CONN_BODY,    /* reading body_bytes into the body buffer */
	SRV_CONN_PAYLOAD, /* reading PUT payload into reservations */
	SRV_CONN_SKIP,    /* discarding skip_bytes, then HEADER */
	SRV_CONN_CLOSING, /* reply queued; flush, then drain input until EOF */
	SRV_CONN_WAIT,    /* a GET waits for NVMe reads; nothing is read meanwhile */
};

/* One PUT block of the request being received. */
struct srv_put_slot {
	struct proto_put_entry e;
	struct store_block *block; /* live reservation, or NULL */
	uint8_t *dst;              /* where its bytes go; NULL: discard */
	uint64_t sum;              /* xxh3-64 of the bytes at dst, if hashed */
	uint8_t hashed;            /* every byte was hashed as it arrived */
	uint16_t status;           /* enum proto_status once known */
};

/* One GET entry of the request being answered. */
struct srv_get_slot {
	struct store_ref ref;      /* ref.block is NULL unless its bytes are sent */
	uint64_t max_length;       /* the entry's buffer size */
	uint16_t status;
	/* While a promotion runs (store_get_async said -EINPROGRESS): */
	struct srv_conn *c;        /* the connection the slot belongs to */
	struct srv_get_slot *done_next; /* link in the worker's completion queue */
	int done_status;           /* what the store's done callback said */
};

/* Where a TCP connection stands with TLS (srv_conn.tls_phase). */
enum srv_tls_phase {
	SRV_TLS_PLAIN = 0, /* plaintext (no TLS on the server, or the client chose it) */
	SRV_TLS_SNIFF,     /* TLS on the server: waiting for the first byte to tell */
	SRV_TLS_HANDSHAKE, /* a ClientHello came: handshake in progress */
	SRV_TLS_UP,        /* every byte goes through c->tls */
};

/* Why a session lost its grant at a tokens-file reload (srv_conn.revoked):
 * every request but PING is refused from then on. */
#define SRV_REVOKED_TOKEN 1     /* the token is no longer in the file */
#define SRV_REVOKED_NAMESPACE 2 /* its grants no longer cover the namespace */

/* Stop reading requests while the output holds more than this many bytes
 * or this many replies (counted since the output was last empty). */
#define SRV_OUT_MAX_BYTES (64ull << 20)
#define SRV_OUT_MAX_REPLIES 64

struct srv_conn {
	struct srv_worker *w;
	struct srv_conn *prev, *next; /* the worker's list */
	uint64_t id;
	char peer[64];                /* "addr:port", "[addr]:port" or "rdma" */
	const struct srv_transport *ops; /* its transport */
	/* TCP (srv_tcp.c only; fd -1 and the rest unused over RDMA). */
	int fd;
	struct event *ev_read;        /* EV_READ | EV_PERSIST */
	struct event *ev_write;       /* EV_WRITE | EV_PERSIST, while output waits */
	struct srv_out tx;            /* every reply byte, in order */
	int reading, writing;         /* whether ev_read / ev_write are added */
	int wr_shut;                  /* shutdown(SHUT_WR) done (CLOSING) */
	enum srv_conn_state state;
	int peer_eof;                 /* peer closed its side: flush, then close */
	uint64_t last_active_ms;      /* last byte read or written */
	uint64_t frame_start_ms;      /* first header byte of the frame being read */
	uint64_t closing_since_ms;
	/* Input. */
	uint8_t hdr_raw[PROTO_HEADER_BYTES];
	uint32_t hdr_have;
	struct proto_header hdr;      /* the request being handled */
	uint8_t *body;                /* body_cap bytes; grows as the body arrives */
	uint32_t body_cap, body_have;
	uint64_t skip_bytes;
	uint64_t req_start_us;        /* request fully received */
	/* PUT in progress (SRV_CONN_PAYLOAD). */
	struct srv_put_slot *slots;
	uint32_t slots_cap, put_count, put_cur;
	uint64_t put_off;             /* bytes of slots[put_cur] received */
	struct XXH3_state_s *put_hash; /* running xxh3 of slots[put_cur] (TCP;
				       * allocated at the first PUT) */
	/* GET: pins taken before the reply is queued. */
	struct srv_get_slot *gets;
	uint32_t gets_cap;
	uint32_t get_count;           /* entries of the GET being answered */
	uint32_t get_pending;         /* promotions not yet handled (SRV_CONN_WAIT) */
	uint64_t get_payload;         /* bytes of the OK entries so far */
	int zombie;                   /* closed while get_pending > 0 */
	/* Session. */
	int hello_done;
	uint16_t version;             /* protocol version HELLO agreed (0 before) */
	uint32_t ns_id;
	char ns_name[PROTO_NAME_MAX_BYTES + 1];
	uint8_t may_write;            /* PUT/DELETE/DROP allowed (rw token, or no auth) */
	uint8_t ns_made_by_wait;      /* a waiting MATCH of this connection created
					 ns_id: forgotten at close if still empty */
	uint8_t token_digest[32];     /* SHA-256 of the HELLO token (with auth) */
	uint64_t auth_gen;            /* srv_auth_generation the token was checked at */
	uint8_t revoked;              /* SRV_REVOKED_*: a reload took the token's grant away */
	struct store_lessee *lessee;
	struct store_tenant *tenant;  /* the token's (with auth), NULL without */
	/* Output accounting. */
	uint32_t replies_queued;      /* since the output was last empty */
	uint8_t *reply_base;          /* space reserved by srv_conn_reply_begin */
	/* TLS (srv_tcp.c through srv_tls.h): the session, NULL in plaintext. */
	struct srv_tls *tls;
	uint8_t tls_phase;            /* enum srv_tls_phase */
	uint8_t peer_loopback;        /* the peer's address is a loopback one */
	/* RDMA (srv_rdma_conn.c only; NULL over TCP): the queue pair, the
	 * message queue, the reply being built, the transfer in progress. */
	struct srv_rconn *rdma;
	/* MATCHes queued on the connection, in request order (srv_mwait.c):
	 * parked ones waiting for blocks, and those waiting for their turn. */
	struct srv_mw *mw_head, *mw_tail;
	uint32_t mw_count;            /* queued */
	uint32_t mw_waiting;          /* of them, parked (max_conn_match_waits) */
	uint8_t mw_held;              /* a request held behind them: its header
				       * (hdr_raw, 1) or its whole frame (2) */
	uint8_t mw_listed;            /* on its worker's mw_ready list */
	uint8_t mw_in_cycle;          /* srv_mwait_match is running for it */
	struct srv_conn *mw_ready_next;
};

/* Start connection c (zeroed by the caller) as connection `id` from
 * `peer` on worker w over transport `ops`: reading a header, active now.
 * Cannot fail. */
void srv_conn_init(struct srv_conn *c, struct srv_worker *w, uint64_t id, const char *peer,
		   const struct srv_transport *ops);

/* Put c in its worker's connection list (drain, timeouts and shutdown
 * walk it). Cannot fail. */
void srv_conn_attach(struct srv_conn *c);

/* Close the connection now (its transport's close): abort PUT
 * reservations, drop queued output (releasing the pins of GET blocks not
 * yet sent), release the transport, then srv_conn_release. `reason` is
 * logged at `level`. While promotions are pending (get_pending > 0) the
 * connection leaves the worker's list at once, but the connection, its
 * GET slots, its lessee and its namespace reference stay until the last
 * promotion is handled (srv_conn_zombie_free). */
void srv_conn_close(struct srv_conn *c, int level, const char *reason);

/* Free a zombie (closed with promotions pending) once get_pending is 0:
 * its lessee, namespace reference, buffers and itself. Worker thread, or
 * the main thread once the worker has stopped. */
void srv_conn_zombie_free(struct srv_conn *c);

/* The last step of a transport's close (its socket or queue pair, output
 * and PUT state already released): leave the worker's list, give the
 * connection count back, and free c, or keep it as a zombie while
 * promotions are pending (as srv_conn_close). Worker thread. */
void srv_conn_release(struct srv_conn *c);

/* The request the connection parked on (SRV_NEXT_WAIT) is answered: move
 * the state machine on by `next`, as if the request handler had returned
 * it, flush the output and resume reading (the transport's request_done).
 * May close c. Worker thread. */
void srv_conn_request_done(struct srv_conn *c, enum srv_next next);

/* The 32 header bytes of a request are in c->hdr_raw: decode and check
 * them, answering a bad header (PROTOCOL.md 7.2/7.3), and dispatch a
 * request without a body. Returns SRV_NEXT_BODY when the transport must
 * now receive hdr.body_bytes into c->body, else what to do next. */
enum srv_next srv_conn_header(struct srv_conn *c);

/* The first four bytes in c->hdr_raw (hdr_have >= 4) are not the magic:
 * a connection-level error reply, answered as soon as they are in so that
 * a short probe (an HTTP request) is answered at once. Returns
 * SRV_NEXT_CLOSE or SRV_NEXT_ABORT. */
enum srv_next srv_conn_bad_magic(struct srv_conn *c);

/* A plaintext client on a port with tls_only: a connection-level error
 * reply (DENIED, "this port requires TLS ...") before any frame is read,
 * counted and logged. Returns SRV_NEXT_CLOSE or SRV_NEXT_ABORT. */
enum srv_next srv_conn_refuse_plaintext(struct srv_conn *c);

/* The whole body of the request in hand is in c->body: dispatch it
 * (srv_request.c) and return what to do next. */
enum srv_next srv_conn_body_done(struct srv_conn *c);

/* Handle one whole request frame already in memory (an RDMA control
 * message without its descriptors): frame[0..bytes), bytes >= 32. Decodes
 * and checks the header exactly as for a frame read from a socket
 * (answering a bad one), then copies body_bytes of body (the caller made
 * sure they are there) and dispatches. Returns what the TCP input state
 * machine would do next (SRV_NEXT_SKIP and SRV_NEXT_PAYLOAD mean nothing
 * is read: the caller decides). Worker thread. */
enum srv_next srv_conn_frame(struct srv_conn *c, const uint8_t *frame, size_t bytes);

/* Check deadlines against now_ms and close the connection when one has
 * passed: a frame not received whole within payload_timeout_ms of its
 * first header byte (however steadily its bytes trickle in), replies the
 * peer has not read from for payload_timeout_ms, idle_timeout_ms without
 * a byte, the linger after a fatal error reply. Returns 1 if the
 * connection was closed (c is then gone), else 0. */
int srv_conn_check_timeouts(struct srv_conn *c, uint64_t now_ms);

/* Queue a reply header (echoing c->hdr's opcode and request id) and
 * reserve body_bytes of contiguous space for its body, returned in *body
 * (NULL when body_bytes is 0). The caller fills the body and calls
 * srv_conn_reply_commit before queueing anything else. The space is the
 * transport's (reply_reserve): over TCP in the connection's output
 * buffer, which allocates only while it grows. Errors: -ENOMEM. */
int srv_conn_reply_begin(struct srv_conn *c, uint16_t status, uint32_t body_bytes,
			 uint64_t payload_bytes, uint8_t **body);

/* Commit the header and body_bytes of the body reserved by
 * srv_conn_reply_begin. Cannot fail (begin made the room). */
void srv_conn_reply_commit(struct srv_conn *c, uint32_t body_bytes);

/* Queue len bytes of a GET block at data after the reply queued last
 * (the transport's reply_block); the output owns the pin (`block`) from
 * now on, also on error, and releases it once the bytes are written or
 * dropped. Errors: -ENOMEM, -EOPNOTSUPP (a transport that writes GET
 * bytes elsewhere). */
int srv_conn_reply_block(struct srv_conn *c, const uint8_t *data, uint64_t len,
			 struct store_block *block);

/* Bytes queued on c's output and not yet sent (the transport's pending). */
uint64_t srv_conn_out_bytes(const struct srv_conn *c);

/* Is the output over the backpressure marks (SRV_OUT_MAX_BYTES or
 * SRV_OUT_MAX_REPLIES)? Then no further request is read for now. */
bool srv_conn_out_full(const struct srv_conn *c);

/* Queue a reply whose body is all of `body` (e.g. the STATS document),
 * which is left empty: moved over RDMA, copied into the output buffer
 * over TCP. Errors: -EMSGSIZE (over 4 GiB), -ENOMEM (the connection must
 * close: the header may be queued without its body). */
int srv_conn_reply_buffer(struct srv_conn *c, uint16_t status, struct evbuffer *body);

/* Queue the header and batch prefix of a reply of `count` result entries
 * (PROTO_RESULT_ENTRY_BYTES each) announcing payload_bytes; *body points
 * at the batch body to fill, *body_bytes receives its size. The caller
 * encodes the entries and calls srv_conn_reply_commit. Errors: -ENOMEM. */
int srv_conn_results_begin(struct srv_conn *c, uint32_t count, uint64_t payload_bytes,
			   uint8_t **body, uint32_t *body_bytes);

/* Record the latency of the request in hand, from its arrival
 * (req_start_us) to now, under `op` (enum srv_lat_op). */
void srv_conn_lat_record(struct srv_conn *c, int op);

/* What the log line of a protocol error quotes of the offending input. */
enum srv_quote {
	SRV_QUOTE_NONE,
	SRV_QUOTE_HEADER, /* the header bytes received (c->hdr_raw) */
	SRV_QUOTE_BODY,   /* the body received, as srv_conn_quote_body renders it */
};

/* Queue an error reply (status, message formatted from fmt) for the
 * current request and count it. Also logs one line at warn level quoting
 * the input as `quote` says, unless the worker already wrote
 * SRV_PROTO_LOG_PER_SEC such lines this second (then the line is counted
 * and reported as suppressed later). Errors: -ENOMEM. */
int srv_conn_reply_error(struct srv_conn *c, uint16_t status, enum srv_quote quote,
			 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Bytes of a request body quoted in a protocol-error log line. */
#define SRV_QUOTE_BODY_BYTES 64

/* Render into out (capacity cap, always NUL-terminated when cap > 0) what
 * a protocol-error log line may show of a request with header h whose
 * received body is body[0..body_bytes): for a HELLO only its header fields
 * ("header only: ..."), never the body, which carries the auth token; for
 * any other opcode "body: " and its first SRV_QUOTE_BODY_BYTES bytes,
 * sanitized (srv_log_sanitize); "" when there is no body. Pure. Returns
 * the length written. */
size_t srv_conn_quote_body(const struct proto_header *h, const uint8_t *body, size_t body_bytes,
			   char *out, size_t cap);

/* The largest body_bytes a request of `opcode` can legitimately have under
 * limits l: 8 + entry size * max_batch_blocks for batch requests, 8 + 255
 * + 1024 for HELLO, 4 + 255 for DROP_NAMESPACE and STATS, 0 for PING and
 * unknown opcodes. A header announcing more is refused before any body
 * byte is buffered. Pure. */
uint32_t srv_conn_body_max(uint8_t opcode, const struct proto_limits *l);
/* srv_conn_body_max for a frame of protocol `version` (the header's): the
 * same, except a v2 MATCH, whose options take 16 bytes more
 * (24 + 32 * max_batch_blocks). Pure. */
uint32_t srv_conn_body_max_v(uint8_t opcode, uint8_t version, const struct proto_limits *l);

/* The header version of the reply to the current request: the request's
 * own once HELLO agreed a version (a client may send frames of any
 * version from 1 to the agreed one, PROTOCOL.md 6.1), 1 before that, for
 * HELLO itself and for a version the server does not speak. Pure. */
uint8_t srv_conn_reply_version(const struct srv_conn *c);

#endif /* KVPOOL_SRV_CONN_H */
