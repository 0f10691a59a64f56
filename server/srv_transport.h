/*
 * srv_transport.h - the operations every kvpoold transport implements:
 * TCP (srv_tcp.c) and RDMA (srv_rdma_conn.c).
 *
 * A connection (struct srv_conn, srv_conn.h) points at its transport's
 * table (c->ops). The session code (srv_conn.c: header and body checks,
 * replies, timeouts, closing) and the request handlers (srv_request.c,
 * srv_put.c, srv_get.c) reach the transport only through this table, so
 * they never name a socket, an event or an RDMA queue pair, and the
 * dependencies point one way: transport -> session -> handlers.
 *
 * Replies: the session frames a reply (header, body) into space the
 * transport reserved (reply_reserve / reply_commit); GET block bytes and
 * large bodies are added by reference (reply_block, reply_buffer). The
 * transport sends them in request order.
 *
 * Per request, the transport says where PUT bytes come from and where GET
 * bytes go: entry_room (the size of the peer's buffer for entry i, from
 * the descriptor an RDMA request carries), put_hashes (whether PUT bytes
 * pass through the CPU, so they are hashed as they arrive) and get_send
 * (send the settled GET: its blocks queued behind the reply over TCP,
 * written by RDMA WRITE before the reply over RDMA). PUT payload bytes
 * are fetched by the transport itself when a handler answers
 * SRV_NEXT_PAYLOAD (readv over TCP, RDMA READ over RDMA).
 *
 * Every operation runs on the connection's worker thread.
 */
#ifndef KVPOOL_SRV_TRANSPORT_H
#define KVPOOL_SRV_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

struct srv_conn;
struct store_block;
struct evbuffer;

/* What a connection does after a request was handled: the answer of the
 * session and the handlers to the transport. */
enum srv_next {
	SRV_NEXT_HEADER,  /* the request is done; read the next header */
	SRV_NEXT_PAYLOAD, /* fetch the PUT payload into its reservations
			   * (srv_put.h), then srv_put_finish */
	SRV_NEXT_SKIP,    /* discard c->skip_bytes, then read the next header */
	SRV_NEXT_CLOSE,   /* the stream cannot be parsed: flush replies, close */
	SRV_NEXT_ABORT,   /* close at once (I/O error, no memory) */
	SRV_NEXT_BODY,    /* header decoded: receive body_bytes into c->body
			   * (srv_conn_header only) */
	SRV_NEXT_WAIT,    /* the reply waits for promotions or a transfer: stop
			   * reading until the request is done */
};

struct srv_transport {
	/* ---- replies ---- */

	/* Reserve `bytes` of contiguous space at the end of the output for
	 * one reply (header and body); *p receives it. Nothing else is
	 * queued before reply_commit. Errors: -ENOMEM. */
	int (*reply_reserve)(struct srv_conn *c, uint32_t bytes, uint8_t **p);
	/* Queue the first `bytes` of the space p that reply_reserve returned
	 * last. Cannot fail. */
	void (*reply_commit)(struct srv_conn *c, uint8_t *p, uint32_t bytes);
	/* Queue len bytes of a GET block at data after what is queued; the
	 * output owns the pin `block` from now on, also on error, and
	 * releases it once the bytes are sent or dropped. Errors: -ENOMEM,
	 * -EOPNOTSUPP (a transport whose GET bytes do not follow the reply;
	 * the pin is released). */
	int (*reply_block)(struct srv_conn *c, const uint8_t *data, uint64_t len,
			   struct store_block *block);
	/* Queue all of `body` (left empty) after what is queued: moved or
	 * copied. Errors: -ENOMEM. */
	int (*reply_buffer)(struct srv_conn *c, struct evbuffer *body);
	/* Bytes queued and not yet sent. */
	uint64_t (*pending)(const struct srv_conn *c);

	/* ---- the request cycle ---- */

	/* The request c parked on (SRV_NEXT_WAIT: NVMe promotions) is
	 * answered: move on by `next` as if the handler had returned it,
	 * send, and handle further input. May close c. */
	void (*request_done)(struct srv_conn *c, enum srv_next next);
	/* Draining: is c between requests with nothing left to send? A
	 * connection closing after a fatal reply counts once its output is
	 * out. */
	bool (*idle)(const struct srv_conn *c);
	/* Close now: release the transport (socket, queue pair, output and
	 * the pins it holds), abort the PUT in progress, log `reason` at
	 * `level`, then srv_conn_release. c may be freed on return. */
	void (*close)(struct srv_conn *c, int level, const char *reason);
	/* Replies were queued outside the request cycle (a parked MATCH
	 * answered while the connection reads on, srv_mwait.h): send them.
	 * May close c. NULL for a transport that parks the whole connection
	 * while a MATCH waits (SRV_NEXT_WAIT, then request_done). */
	void (*kick)(struct srv_conn *c);
	/* The request whose header waits in c->hdr_raw, held behind parked
	 * MATCHes (srv_mwait_hold_header), may now be handled: decode it
	 * (srv_conn_header) and go on as its answer says. May close c.
	 * Needed only with kick. */
	void (*resume)(struct srv_conn *c);

	/* ---- where the bytes of the request in hand come from and go ---- */

	/* PUT bytes pass through the CPU as they arrive (TCP), so srv_put.c
	 * hashes them on the way; otherwise the store hashes at commit. */
	bool put_hashes;
	/* The size of the peer's buffer for entry i (< the batch's count) of
	 * the PUT or GET in hand: an RDMA descriptor's length. Returns 1 with
	 * *bytes set, or 0 when entry i has none. NULL for a transport whose
	 * bytes travel in the stream (TCP). */
	int (*entry_room)(const struct srv_conn *c, uint32_t i, uint64_t *bytes);
	/* The GET in hand has every slot settled (srv_get.h): send the OK
	 * blocks and the reply. Returns SRV_NEXT_HEADER (reply queued),
	 * SRV_NEXT_WAIT (the reply follows a transfer; the transport calls
	 * srv_get_answer when it completes) or SRV_NEXT_ABORT (the pins are
	 * released; the connection must close). */
	enum srv_next (*get_send)(struct srv_conn *c);
};

#endif /* KVPOOL_SRV_TRANSPORT_H */
