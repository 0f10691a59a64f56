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

/* HELLO names a namespace but does not create it (a health check, STATS
 * or DROP must not fill the namespace table). srv_conn_ns_attach takes
 * the connection's reference on it once it exists (c->ns_id stays 0
 * until then, and GET, EXISTS, MATCH and DELETE miss); call it before
 * using c->ns_id. Cannot fail. Worker thread. */
void srv_conn_ns_attach(struct srv_conn *c);

/* Attach, or create the namespace for a PUT: refused when the token's
 * grants already cover tenant_max_namespaces namespaces (tokens that
 * grant "*" are exempt; racing creations on several workers may pass the
 * limit by up to threads - 1) or when the server holds its maximum.
 * Returns PROTO_STATUS_OK, or the status (QUOTA, or the store error's)
 * with a one-line reason in msg[0..cap). Worker thread. */
uint16_t srv_conn_ns_create(struct srv_conn *c, char *msg, size_t cap);

#endif /* KVPOOL_SRV_REQUEST_H */
