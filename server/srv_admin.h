/*
 * srv_admin.h - kvpoold's admin HTTP server (libevent evhttp) on
 * admin_port, for operators and monitoring:
 *
 *   GET /metrics   the STATS figures in Prometheus text (srv_metrics.h)
 *   GET /healthz   200 "serving"; 503 "starting" or "draining"
 *   GET /stats     the STATS document, byte for byte what the STATS
 *                  opcode answers; ?namespace=NAME for one namespace
 *
 * Other methods than GET and HEAD get 501 (evhttp's answer), other paths 404.
 *
 * It runs on a thread of its own with its own event base, so it answers
 * while the main thread is still opening the pool (an NVMe rebuild can
 * take seconds: /healthz says 503 "starting" meanwhile) and while the
 * server drains. The state is the server's (srv_state, srv_lifecycle.h);
 * /metrics and /stats answer 503 while it is STARTING.
 *
 * Threads: srv_admin_start and srv_admin_stop are called by the main
 * thread. The admin thread reads struct srv beyond its state only in
 * states SERVING and DRAINING, which the main thread enters after the
 * store is open and the workers run, and calls srv_admin_stop before
 * they are freed.
 */
#ifndef KVPOOL_SRV_ADMIN_H
#define KVPOOL_SRV_ADMIN_H

#include <stdint.h>

struct srv;
struct srv_admin;

/* Bind the admin HTTP server to listen:port (the data port's address,
 * with SO_REUSEADDR like it) and start its thread, in state STARTING.
 * port 0 turns the admin server off: *out = NULL and 0 is returned.
 * s is borrowed until srv_admin_stop. Errors (logged): -EINVAL (listen
 * does not resolve), -EADDRINUSE and other bind errors, -ENOMEM, -errno
 * of eventfd or pthread_create. *out is written only on success. */
int srv_admin_start(struct srv *s, const char *listen, uint16_t port, struct srv_admin **out);

/* Stop the thread, close the port and free everything; requests in
 * progress are cut. Accepts NULL. */
void srv_admin_stop(struct srv_admin *a);

#endif /* KVPOOL_SRV_ADMIN_H */
