/*
 * srv_tcp.h - the TCP transport of kvpoold (srv_transport.h): one socket
 * per connection on its worker's event base.
 *
 * Input is read with read()/readv() into the 32-byte header buffer and a
 * body buffer that grows with the bytes that arrive, never past what the
 * opcode can need (srv_conn_body_max); PUT payload bytes go straight into
 * the arena (srv_put_iov) and are hashed as they land. Output is the
 * connection's srv_out queue, written with writev: reply bytes from its
 * buffer, GET payloads straight from the arena, each block pinned until
 * its bytes are written. Reading stops between requests while the output
 * is over the backpressure marks (srv_conn_out_full).
 */
#ifndef KVPOOL_SRV_TCP_H
#define KVPOOL_SRV_TCP_H

#include <stdint.h>

struct srv_worker;

/* Worker thread: adopt socket fd as connection `id` from `peer` and start
 * reading. On error the fd is closed and the connection count given
 * back. Errors: -ENOMEM. */
int srv_tcp_open(struct srv_worker *w, int fd, uint64_t id, const char *peer);

#endif /* KVPOOL_SRV_TCP_H */
