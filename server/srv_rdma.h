/*
 * srv_rdma.h - kvpoold and the RDMA transport (rdma/): at start-up, open
 * the rdma_cm listener and register the arena once; when that fails, log
 * why and serve TCP only. The outcome is reported in STATS ("rdma") and,
 * when RDMA is served, in the HELLO reply's rdma_port.
 */
#ifndef KVPOOL_SRV_RDMA_H
#define KVPOOL_SRV_RDMA_H

#include <stdbool.h>
#include <stdint.h>

#include "rdma.h"

struct srv;
struct rdma_ops;

/* What STATS says about RDMA. Written by the main thread before the
 * workers start; read-only afterwards. */
struct srv_rdma_state {
	bool built;                      /* RDMA=1 build */
	bool available;                  /* serving RDMA on port */
	uint16_t port;                   /* rdma_port when available, else 0 */
	char reason[RDMA_REASON_BYTES];  /* why not available ("" when it is) */
	struct rdma_listener *listener;
};

/* Main thread, after store_open: try to serve RDMA on conf.rdma_port with
 * `ops` (NULL: the real library). Never fails kvpoold: on any failure it
 * logs one line ("rdma unavailable: <why>; serving tcp only"), fills
 * st->reason and leaves st->available false. */
void srv_rdma_open(struct srv *s, struct srv_rdma_state *st, const struct rdma_ops *ops);

/* Main thread, at shutdown after the workers stopped: close the listener
 * (deregisters the arena). Safe when nothing was opened. */
void srv_rdma_close(struct srv_rdma_state *st);

#endif /* KVPOOL_SRV_RDMA_H */
