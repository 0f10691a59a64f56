/*
 * srv_request.h - request dispatch: HELLO, GET, EXISTS, MATCH, DELETE,
 * DROP_NAMESPACE, STATS, PING on a worker thread (PUT is in srv_put.h).
 */
#ifndef KVPOOL_SRV_REQUEST_H
#define KVPOOL_SRV_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include "srv_conn.h"

/* Handle the request whose header is c->hdr and whose body is
 * c->body[0..hdr.body_bytes), queueing its reply (replies go out in
 * request order). Returns what the input state machine does next; for
 * SRV_NEXT_SKIP, c->skip_bytes is set. Worker thread only. */
enum srv_next srv_request_dispatch(struct srv_conn *c);

/* A promotion started for GET slot g (store_get_async said -EINPROGRESS)
 * has ended with g->done_status. Fills in the slot's result; once the
 * last pending slot of its GET is in, queues the whole reply and resumes
 * the connection (srv_conn_request_done). For a zombie connection it only
 * releases the block and, at the last slot, frees the connection.
 * Worker thread (the main thread once the worker has stopped). */
void srv_request_get_done(struct srv_get_slot *g);

/* RDMA: every OK block of the GET being answered has been written into
 * its client buffer: queue the results (payload_bytes = the OK lengths,
 * no payload bytes follow), release every pin and record the latency.
 * Errors: -ENOMEM (the pins are released all the same). Worker thread. */
int srv_request_get_answer(struct srv_conn *c);

/* Release every pin still held by the GET being answered (its WRITE
 * failed or the connection closed). Worker thread. */
void srv_request_get_release(struct srv_conn *c);

/* Is name[0..len) a valid namespace name: 1..255 bytes of printable ASCII
 * 0x21..0x7e (no spaces, no control bytes)? */
bool srv_ns_name_valid(const char *name, size_t len);

#endif /* KVPOOL_SRV_REQUEST_H */
