/*
 * srv_get.h - GET on a worker thread, the twin of srv_put.h: look up and
 * pin every entry, wait for NVMe promotions (the connection parks in
 * SRV_CONN_WAIT; replies stay in request order), then hand the settled
 * slots to the transport (srv_transport.get_send), which sends the OK
 * blocks' bytes and the reply: over TCP the bytes follow the reply
 * straight from the arena (srv_get_reply), over RDMA they are written
 * into the peer's buffers first and the reply follows (srv_get_answer).
 *
 * A slot keeps its pin only while its bytes are to be sent; every pin is
 * released once sent, or when the connection closes.
 */
#ifndef KVPOOL_SRV_GET_H
#define KVPOOL_SRV_GET_H

#include "srv_conn.h"

struct proto_batch;

/* Answer the GET in hand, whose decoded batch is b (count entries,
 * borrowed for the call): pin what is in DRAM, start promotions for what
 * is only on NVMe. Returns SRV_NEXT_WAIT while promotions are pending
 * (srv_get_done finishes the request), else what get_send returned.
 * Worker thread. */
enum srv_next srv_get_start(struct srv_conn *c, const struct proto_batch *b);

/* A promotion started for GET slot g (store_get_async said -EINPROGRESS)
 * has ended with g->done_status. Fills in the slot's result; once the
 * last pending slot of its GET is in, hands the GET to the transport and
 * resumes the connection (srv_conn_request_done). For a zombie connection
 * it only releases the block and, at the last slot, frees the connection.
 * Worker thread (the main thread once the worker has stopped). */
void srv_get_done(struct srv_get_slot *g);

/* get_send of a transport whose GET bytes follow the reply in its stream
 * (TCP): queue the results, then every OK block's bytes straight from the
 * arena (srv_conn_reply_block, which takes over the pins), and record the
 * latency. Returns SRV_NEXT_HEADER, or SRV_NEXT_ABORT (no memory; the
 * pins not handed over are released and the connection must close). */
enum srv_next srv_get_reply(struct srv_conn *c);

/* Every OK block of the GET in hand has been written into its peer
 * buffer (RDMA WRITE): queue the results (payload_bytes = the OK
 * lengths, no payload bytes follow), release every pin and record the
 * latency. Errors: -ENOMEM (the pins are released all the same). */
int srv_get_answer(struct srv_conn *c);

/* Release every pin still held by the GET in hand (its transfer failed or
 * the connection closed). Cannot fail. */
void srv_get_release(struct srv_conn *c);

#endif /* KVPOOL_SRV_GET_H */
