/*
 * conn.h - blocking-with-deadline TCP socket I/O for libkvpool (internal).
 *
 * Sockets are non-blocking; every call waits with poll() until an absolute
 * deadline on CLOCK_MONOTONIC (milliseconds, see kvc_deadline_ms). Nothing
 * here knows about the protocol. Errors are normalised to the small set
 * libkvpool documents:
 *   -ETIMEDOUT     the deadline passed
 *   -ECONNRESET    the peer closed or reset the connection, or another
 *                  socket error broke the stream
 *   -EPIPE         the peer no longer reads (write after close)
 *   -ECONNREFUSED  connect failed on every resolved address
 *   -ENOENT        the host name does not resolve
 *   -ENOMEM        out of memory (kernel buffers or resolver)
 * Threads: functions work on the fd given and keep no state.
 */
#ifndef KVC_CONN_H
#define KVC_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Current CLOCK_MONOTONIC time in milliseconds. */
uint64_t kvc_now_ms(void);

/* Current CLOCK_MONOTONIC time in microseconds. */
uint64_t kvc_now_us(void);

/* Absolute deadline `timeout_ms` from now. */
uint64_t kvc_deadline_ms(uint32_t timeout_ms);

/* 1 if an idle connection is no longer usable: the peer closed it, it
 * failed, or unsolicited bytes are waiting. Never blocks. */
int kvc_conn_stale(int fd);

/* Resolve host:port (getaddrinfo, numeric port), connect a non-blocking
 * TCP socket to the first address that accepts before `deadline_ms`, and
 * set TCP_NODELAY and close-on-exec. *fd_out receives the socket.
 * Errors: -ENOENT (does not resolve), -ECONNREFUSED, -ETIMEDOUT, -ENOMEM. */
int kvc_conn_open(const char *host, const char *port, uint64_t deadline_ms, int *fd_out);

/* Send every byte described by iov[0..iovcnt) with sendmsg(MSG_NOSIGNAL)
 * (no SIGPIPE), any number of entries (split at IOV_MAX). The array is
 * used as scratch: its entries are advanced past sent bytes, the buffers
 * they point to are only read.
 * Errors: -ETIMEDOUT, -EPIPE, -ECONNRESET, -ENOMEM. */
int kvc_conn_sendv(int fd, struct iovec *iov, size_t iovcnt, uint64_t deadline_ms);

/* Receive exactly `len` bytes into buf.
 * Errors: -ETIMEDOUT, -ECONNRESET (EOF before `len` bytes, or reset), -ENOMEM. */
int kvc_conn_recv(int fd, void *buf, size_t len, uint64_t deadline_ms);

/* Receive exactly the bytes described by iov[0..iovcnt) with readv, any
 * number of entries; the array is used as scratch like kvc_conn_sendv.
 * Errors: as kvc_conn_recv. */
int kvc_conn_recvv(int fd, struct iovec *iov, size_t iovcnt, uint64_t deadline_ms);

/* Non-blocking, one syscall each (the asynchronous core, async.c): send
 * from / read into iov[0..iovcnt) (the first IOV_MAX entries) what the
 * socket takes or has now. Return the bytes moved (> 0; 0 only for an
 * empty list on send), -EAGAIN when nothing can move now, or an error
 * of the set above (-ECONNRESET also for EOF on read). */
ssize_t kvc_conn_try_sendv(int fd, const struct iovec *iov, size_t iovcnt);
ssize_t kvc_conn_try_recvv(int fd, const struct iovec *iov, size_t iovcnt);

#endif /* KVC_CONN_H */
