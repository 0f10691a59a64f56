/*
 * srv_rdma_conn.h - the RDMA transport of kvpoold (srv_transport.h): the
 * glue between rdma/'s connection (SEND/RECV control messages, READ and
 * WRITE transfers) and the session and request handlers (srv_conn.c,
 * srv_put.c, srv_get.c), which reach it only through its operations.
 *
 * An RDMA connection is a struct srv_conn whose transport state (`rdma`)
 * is private to srv_rdma_conn.c and which has no socket: it sits in the
 * worker's connection list like a TCP one (drain, idle timeout, shutdown
 * and max_connections treat both alike). Each control message is one
 * request frame plus, for PUT and GET, one descriptor per entry
 * (PROTOCOL.md section 13), decoded here (entry_room). A message is
 * copied out of its RECV buffer into a per-connection queue (at most
 * RDMX_MSG_DEPTH) and the requests are handled in order, one at a time;
 * each reply goes out as one SEND.
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

/* libevent callback of a worker's rdma_cm event channel fd (arg: the
 * struct srv_worker): handle every pending CM event. */
void srv_rconn_cm_cb(int fd, short what, void *arg);

#endif /* KVPOOL_SRV_RDMA_CONN_H */
