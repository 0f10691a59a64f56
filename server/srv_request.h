/*
 * srv_request.h - request dispatch: HELLO, EXISTS, MATCH, DELETE,
 * DROP_NAMESPACE, STATS, PING on a worker thread (PUT is in srv_put.h,
 * GET in srv_get.h).
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

/* With a tokens file reloaded since c's token was last checked, check it
 * again against c's namespace: a token no longer granting it revokes the
 * session (its leases end) and the request in c->hdr is answered DENIED
 * with the reason; one narrowed to read-only may no longer write. Called
 * for every request and for a waiting MATCH before it is answered, so
 * that a wait across a revoking reload learns nothing and leases nothing.
 * Returns 0 (go on), or 1 with *next set after the refusal (c->skip_bytes
 * set to the request's payload). Worker thread. */
int srv_request_auth_recheck(struct srv_conn *c, enum srv_next *next);

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

/* The retention budget of the token with this digest: its line's
 * max_retained_bytes=, else the setting (0 = a quarter of the arena).
 * Any thread (reads s->conf and the tokens table under their locks). */
struct srv;
uint64_t srv_tenant_retain_budget(const struct srv *s, const uint8_t *digest);

/* Set every known tenant's retention budget from the tokens file now
 * loaded (a SIGHUP): a lowered budget binds the tenant's next retention
 * on every connection, open ones included. Main thread. */
void srv_tenants_retain_rebudget(struct srv *s);

/* Log a warning when one retention budget, or the sum of the tokens'
 * budgets, reaches the pool's capacity (dram_capacity), and say what
 * max_retained_total_bytes keeps for ordinary blocks. `what` prefixes
 * the lines ("" at start, "sighup: "). Main thread. */
void srv_retain_budget_warn(struct srv *s, const char *what);

#endif /* KVPOOL_SRV_REQUEST_H */
