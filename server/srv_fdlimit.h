/*
 * srv_fdlimit.h - file descriptors against max_connections: kvpoold raises
 * its RLIMIT_NOFILE soft limit as far as max_connections needs (up to the
 * hard limit) at start-up and on SIGHUP, and serves fewer connections
 * when that is still short.
 */
#ifndef KVPOOL_SRV_FDLIMIT_H
#define KVPOOL_SRV_FDLIMIT_H

#include <stdint.h>

struct srv;

/* File descriptors kept aside from connections: the listener, eventfds,
 * the log, and slack. */
#define SRV_RESERVED_FDS 64

/* Connections that fit in nofile file descriptors (the RLIMIT_NOFILE soft
 * limit): max_connections when nofile >= max_connections +
 * SRV_RESERVED_FDS, otherwise nofile - SRV_RESERVED_FDS (at least 1). Pure. */
uint32_t srv_conn_limit(uint32_t max_connections, uint64_t nofile);

/* Main thread: set s->conn_limit from conf.max_connections and the
 * RLIMIT_NOFILE limit, raising the soft limit as far as needed (up to the
 * hard limit); when that is still short, warn and serve fewer
 * connections. At start-up and after SIGHUP. Cannot fail. */
void srv_conn_limit_update(struct srv *s);

#endif /* KVPOOL_SRV_FDLIMIT_H */
