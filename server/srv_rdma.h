/*
 * srv_rdma.h - kvpoold and the RDMA transport (rdma/): at start-up, open
 * the rdma_cm listener and register the arena once; when that fails, log
 * why and serve TCP only. When it works, the main thread takes connection
 * requests and hands them to the workers round robin (each worker has its
 * own rdmx_worker: rdma_cm channel and work-request budget), and requests
 * are served on them (srv_rdma_conn.h). The outcome is reported in STATS
 * ("rdma") and in the HELLO reply's rdma_port.
 */
#ifndef KVPOOL_SRV_RDMA_H
#define KVPOOL_SRV_RDMA_H

#include <stdbool.h>
#include <stdint.h>

#include "rdmx.h"

struct srv;
struct srv_worker;
struct rdmx_ops;
struct event;

/* What STATS says about RDMA. Written by the main thread before the
 * workers start; read-only afterwards (but `listener` and `ev_accept`,
 * which the main thread keeps using). */
struct srv_rdma_state {
	bool built;                      /* RDMA=1 build */
	bool available;                  /* serving RDMA on port */
	uint16_t port;                   /* rdma_port when available, else 0 */
	char reason[RDMX_REASON_BYTES];  /* why not available ("" when it is) */
	struct rdmx_listener *listener;  /* open while available */
	struct event *ev_accept;         /* EV_READ on the listener's fd; main base */
};

/* Tests: the verbs/rdma_cm table srv_run passes to srv_rdma_open (NULL,
 * the default: the real library). Set it before srv_run() to run kvpoold
 * in-process on a fake fabric. */
extern const struct rdmx_ops *srv_rdma_test_ops;

/* Main thread, after store_open: try to serve RDMA on conf.rdma_port with
 * `ops` (NULL: the real library). Never fails kvpoold: on any failure it
 * logs one line ("rdma unavailable: <why>; serving tcp only"), fills
 * st->reason and leaves st->available false. On success the listener
 * stays open, st->available is true and st->port is rdma_port. */
void srv_rdma_open(struct srv *s, struct srv_rdma_state *st, const struct rdmx_ops *ops);

/* Main thread, after every worker is initialised and before any starts:
 * open each worker's rdmx_worker and its CM event. If one cannot be
 * opened, RDMA is made unavailable (logged, listener closed) and kvpoold
 * serves TCP only. No-op when RDMA is not available. */
void srv_rdma_workers_open(struct srv *s);

/* Free worker w's CM event and rdmx_worker (its connections must be
 * gone). Main thread after the worker stopped; safe without RDMA. */
void srv_rdma_worker_close(struct srv_worker *w);

/* Main thread, once the workers run: take connection requests (an EV_READ
 * event on the listener's fd in s->base), hand each to the next worker,
 * counting it against max_connections like a TCP connection (over the
 * limit it is refused and counted as rejected). Errors: -ENOMEM (the
 * event could not be added). No-op without RDMA. */
int srv_rdma_start(struct srv *s);

/* Main thread: take no more connection requests (drain, shutdown).
 * Idempotent. */
void srv_rdma_stop_accepting(struct srv *s);

/* Main thread, at shutdown after the workers stopped (their connections
 * and rdma_workers are gone): close the listener (deregisters the arena).
 * Safe when nothing was opened. */
void srv_rdma_close(struct srv_rdma_state *st);

#endif /* KVPOOL_SRV_RDMA_H */
