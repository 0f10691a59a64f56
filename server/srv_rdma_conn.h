/*
 * srv_rdma_conn.h - a client connection over RDMA on a worker thread: the
 * glue between rdma/'s connection (SEND/RECV control messages, READ and
 * WRITE transfers) and the request handlers of srv_request.c / srv_put.c.
 *
 * An RDMA connection is a struct srv_conn with c->rdma set and no socket:
 * it sits in the worker's connection list like a TCP one (drain, idle
 * timeout, shutdown and max_connections treat both alike). Each control
 * message is one request frame plus, for PUT and GET, one descriptor per
 * entry (PROTOCOL.md section 13). A message is copied out of its RECV
 * buffer into a per-connection queue (at most RDMX_MSG_DEPTH) and the
 * requests are handled in order, one at a time; each reply goes out as
 * one SEND.
 *  - PUT: srv_put_start validates and reserves (descriptor lengths must
 *    equal the blocks'), one RDMA READ pulls every reserved block into the
 *    arena, then srv_put_finish commits (verifying the checksums) and
 *    replies. A READ that fails closes the connection; on_close, after the
 *    QP is gone, aborts every reservation: nothing becomes visible.
 *  - GET: pinned as over TCP (promotions from NVMe included), one RDMA
 *    WRITE pushes every OK block into its descriptor's buffer, the reply
 *    is sent once the WRITE completed, then the pins are released (also
 *    when the connection fails).
 *
 * Everything here runs on the connection's worker thread.
 */
#ifndef KVPOOL_SRV_RDMA_CONN_H
#define KVPOOL_SRV_RDMA_CONN_H

#include <stdint.h>

#include "srv_conn.h"

struct srv_worker;
struct event;

/* Accept connection request `req` (from rdmx_listener_take, already
 * counted in conn_current by the main thread) as connection `id` on
 * worker w (whose w->rdma is open). On error the request is refused and
 * destroyed, the connection count given back.
 * Errors: -ENOMEM, or the -errno of rdmx_conn_accept. */
int srv_rconn_open(struct srv_worker *w, void *req, uint64_t id);

/* Close the RDMA connection c now (srv_conn_close calls this for c->rdma
 * connections): tear the QP down, abort PUT reservations, release GET
 * pins, then free c (or keep it as a zombie while NVMe promotions are
 * pending). `reason` is logged at `level`. */
void srv_rconn_close(struct srv_conn *c, int level, const char *reason);

/* The GET of c has every slot settled: start the RDMA WRITE of its OK
 * blocks. Returns SRV_NEXT_WAIT (the reply follows the WRITE's
 * completion), SRV_NEXT_HEADER (nothing to write: the reply is queued) or
 * SRV_NEXT_ABORT (the pins are released; the connection must close). */
enum srv_next srv_rconn_get_write(struct srv_conn *c);

/* A request of c that parked (SRV_NEXT_WAIT: NVMe promotions) is done:
 * continue with `next` and handle the queued messages. May close c. */
void srv_rconn_request_done(struct srv_conn *c, enum srv_next next);

/* Draining: is c between requests with nothing queued or unsent? */
int srv_rconn_idle(const struct srv_conn *c);

/* libevent callback of a worker's rdma_cm event channel fd (arg: the
 * struct srv_worker): handle every pending CM event. */
void srv_rconn_cm_cb(int fd, short what, void *arg);

#endif /* KVPOOL_SRV_RDMA_CONN_H */
