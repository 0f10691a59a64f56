/*
 * srv_rdma.c - start-up of the RDMA transport in kvpoold, and its
 * fallback to TCP.
 *
 * Serving requests over RDMA connections (SEND/RECV control messages,
 * READ for PUT, WRITE for GET) is not wired to the workers yet: when the
 * listener and the arena registration succeed, kvpoold says so, closes
 * the listener again and serves TCP only, so that no client is offered a
 * port that would not answer. See rdma/README.md.
 */
#include <stdio.h>
#include <string.h>

#include "srv_rdma.h"
#include "srv_server.h"
#include "store.h"

/* Record why RDMA is not served and log it once. */
static void unavailable(struct srv_rdma_state *st, const char *why)
{
	st->available = false;
	st->port = 0;
	snprintf(st->reason, sizeof(st->reason), "%s", why);
	srv_warn("rdma unavailable: %s; serving tcp only", st->reason);
}

void srv_rdma_open(struct srv *s, struct srv_rdma_state *st, const struct rdma_ops *ops)
{
	struct rdma_listener_config cfg = { 0 };
	char why[RDMA_REASON_BYTES] = "";
	int rc;

	memset(st, 0, sizeof(*st));
	st->built = rdma_built();
	if (s->conf.rdma_port == 0) {
		snprintf(st->reason, sizeof(st->reason), "rdma_port is 0");
		srv_info("rdma off (rdma_port 0); serving tcp only");
		return;
	}
	store_arena_region(s->store, &cfg.arena, &cfg.arena_bytes);
	cfg.listen = s->conf.listen;
	cfg.port = (uint16_t)s->conf.rdma_port;
	cfg.ops = ops;
	rc = rdma_listener_open(&cfg, &st->listener, why, sizeof(why));
	if (rc < 0) {
		st->listener = NULL;
		unavailable(st, why[0] ? why : strerror(-rc));
		return;
	}
	srv_info("rdma: listener on port %u ready, arena of %llu bytes registered once",
		 cfg.port, (unsigned long long)cfg.arena_bytes);
	rdma_listener_close(st->listener);
	st->listener = NULL;
	unavailable(st, "request serving over rdma is not wired to the workers in this build");
}

void srv_rdma_close(struct srv_rdma_state *st)
{
	rdma_listener_close(st->listener);
	st->listener = NULL;
	st->available = false;
}
