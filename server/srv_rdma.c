/*
 * srv_rdma.c - the RDMA transport in kvpoold: start-up and fallback to
 * TCP, the per-worker contexts, and taking connection requests on the
 * main thread. Requests on the connections: srv_rdma_conn.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "srv_clock.h"
#include "srv_rdma.h"
#include "srv_rdma_conn.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

const struct rdmx_ops *srv_rdma_test_ops;

/* Record why RDMA is not served and log it once. */
static void unavailable(struct srv_rdma_state *st, const char *why)
{
	st->available = false;
	st->port = 0;
	snprintf(st->reason, sizeof(st->reason), "%s", why);
	srv_warn("rdma unavailable: %s; serving tcp only", st->reason);
}

void srv_rdma_open(struct srv *s, struct srv_rdma_state *st, const struct rdmx_ops *ops)
{
	struct rdmx_listener_config cfg = { 0 };
	char why[RDMX_REASON_BYTES] = "";
	int rc;

	memset(st, 0, sizeof(*st));
	st->built = rdmx_built();
	if (s->conf.rdma_port == 0) {
		snprintf(st->reason, sizeof(st->reason), "rdma_port is 0");
		srv_info("rdma off (rdma_port 0); serving tcp only");
		return;
	}
	if (s->tls_only && !s->conf.tls_allow_rdma) {
		/* RDMA carries no TLS: serving it would pass tls_only by */
		snprintf(st->reason, sizeof(st->reason),
			 "tls_only is in force and RDMA carries no TLS (tls_allow_rdma = true "
			 "serves it anyway)");
		srv_info("rdma off: %s; serving tcp with tls only", st->reason);
		return;
	}
	store_arena_region(s->store, &cfg.arena, &cfg.arena_bytes);
	cfg.listen = s->conf.listen;
	cfg.port = (uint16_t)s->conf.rdma_port;
	cfg.ops = ops;
	rc = rdmx_listener_open(&cfg, &st->listener, why, sizeof(why));
	if (rc < 0) {
		st->listener = NULL;
		unavailable(st, why[0] ? why : strerror(-rc));
		return;
	}
	st->available = true;
	st->port = cfg.port;
	srv_info("rdma: listening on port %u, arena of %llu bytes registered once",
		 cfg.port, (unsigned long long)cfg.arena_bytes);
}

void srv_rdma_worker_close(struct srv_worker *w)
{
	if (w->ev_rdma_cm)
		event_free(w->ev_rdma_cm);
	w->ev_rdma_cm = NULL;
	rdmx_worker_close(w->rdma);
	w->rdma = NULL;
}

/* Open worker w's rdmx_worker and add its CM fd to the worker's base. */
static int worker_open(struct srv *s, struct srv_worker *w)
{
	int rc = rdmx_worker_open(s->rdma.listener, &w->rdma);

	if (rc < 0) {
		w->rdma = NULL;
		return rc;
	}
	w->ev_rdma_cm = event_new(w->base, rdmx_worker_fd(w->rdma), EV_READ | EV_PERSIST,
				  srv_rconn_cm_cb, w);
	if (!w->ev_rdma_cm || event_add(w->ev_rdma_cm, NULL) < 0) {
		srv_rdma_worker_close(w);
		return -ENOMEM;
	}
	return 0;
}

void srv_rdma_workers_open(struct srv *s)
{
	char why[RDMX_REASON_BYTES];
	int rc = 0;
	uint32_t i;

	if (!s->rdma.available)
		return;
	for (i = 0; i < s->n_workers && rc == 0; i++)
		rc = worker_open(s, &s->workers[i]);
	if (rc == 0)
		return;
	for (i = 0; i < s->n_workers; i++)
		srv_rdma_worker_close(&s->workers[i]);
	rdmx_listener_close(s->rdma.listener);
	s->rdma.listener = NULL;
	snprintf(why, sizeof(why), "cannot open a worker's rdma_cm channel: %s", strerror(-rc));
	unavailable(&s->rdma, why);
}

/* Refuse request req: over max_connections or no memory to hand it. */
static void accept_refuse(struct srv *s, void *req, const char *why)
{
	uint64_t suppressed;

	rdmx_listener_refuse(s->rdma.listener, req);
	if (srv_ratelimit_allow(&s->reject_log, srv_now_ms(), &suppressed))
		srv_info("rdma connection rejected: %s (%" PRIu64 " more rejections not logged)",
			 why, suppressed);
}

/* The listener's channel is readable: take every connection request and
 * hand each to the next worker, round robin with the TCP ones. */
static void accept_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;
	void *req;
	uint64_t id;
	int rc;

	(void)fd;
	(void)what;
	while ((rc = rdmx_listener_take(s->rdma.listener, &req)) == 1) {
		if (__atomic_load_n(&s->conn_current, __ATOMIC_RELAXED) >= s->conn_limit) {
			__atomic_fetch_add(&s->conn_rejected, 1, __ATOMIC_RELAXED);
			accept_refuse(s, req, "connection limit reached");
			continue;
		}
		__atomic_fetch_add(&s->conn_current, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&s->conn_total, 1, __ATOMIC_RELAXED);
		id = ++s->next_conn_id;
		if (srv_worker_hand_rdma(&s->workers[s->next_worker++ % s->n_workers], req, id) < 0) {
			__atomic_fetch_sub(&s->conn_current, 1, __ATOMIC_RELAXED);
			accept_refuse(s, req, "out of memory");
		}
	}
	if (rc < 0)
		srv_warn("rdma: taking a connection request failed: %s", strerror(-rc));
}

int srv_rdma_start(struct srv *s)
{
	struct srv_rdma_state *st = &s->rdma;

	if (!st->available)
		return 0;
	st->ev_accept = event_new(s->base, rdmx_listener_fd(st->listener), EV_READ | EV_PERSIST,
				  accept_cb, s);
	if (!st->ev_accept || event_add(st->ev_accept, NULL) < 0)
		return -ENOMEM;
	return 0;
}

void srv_rdma_stop_accepting(struct srv *s)
{
	if (s->rdma.ev_accept)
		event_free(s->rdma.ev_accept);
	s->rdma.ev_accept = NULL;
}

void srv_rdma_close(struct srv_rdma_state *st)
{
	rdmx_listener_close(st->listener);
	st->listener = NULL;
	st->available = false;
}
