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

/* Is name[0..len) a valid namespace name: 1..255 bytes of printable ASCII
 * 0x21..0x7e (no spaces, no control bytes)? */
bool srv_ns_name_valid(const char *name, size_t len);

#endif /* KVPOOL_SRV_REQUEST_H */
