/*
 * conn_tcp.c - TCP sockets with poll-based deadlines for libkvpool.
 */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

uint64_t kvc_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t kvc_now_ms(void)
{
	return kvc_now_us() / 1000u;
}

uint64_t kvc_deadline_ms(uint32_t timeout_ms)
{
	return kvc_now_ms() + timeout_ms;
}

/* Wait until fd is ready for `events` or the deadline passes. Readiness
 * includes errors and hang-ups: the following syscall reports those. */
static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
	struct pollfd p = { .fd = fd, .events = events };

	for (;;) {
		uint64_t now = kvc_now_ms();
		uint64_t left = deadline_ms > now ? deadline_ms - now : 0;
		int rc;

		if (left == 0)
			return -ETIMEDOUT;
		rc = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (rc > 0)
			return 0;
		if (rc < 0 && errno != EINTR)
			return errno == ENOMEM ? -ENOMEM : -ECONNRESET;
	}
}

/* Map a send/recv errno onto the documented set. */
static int io_errno(int err)
{
	switch (err) {
	case EPIPE:
		return -EPIPE;
	case ENOMEM:
	case ENOBUFS:
		return -ENOMEM;
	case ETIMEDOUT:
		return -ETIMEDOUT;
	default:
		return -ECONNRESET;
	}
}

/* Set the options every kvpool connection wants. */
static void tune_socket(int fd)
{
	int one = 1;

	/* Best effort: a connection without NODELAY still works, only slower. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Connect one non-blocking socket to `ai` before the deadline. */
static int connect_one(const struct addrinfo *ai, uint64_t deadline_ms, int *fd_out)
{
	socklen_t len = sizeof(int);
	int fd, err = 0, rc;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		return errno == ENOMEM || errno == ENOBUFS ? -ENOMEM : -ECONNREFUSED;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			err = errno;
			goto out_close;
		}
		rc = wait_fd(fd, POLLOUT, deadline_ms);
		if (rc) {
			close(fd);
			return rc;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err)
			goto out_close;
	}
	tune_socket(fd);
	*fd_out = fd;
	return 0;

out_close:
	close(fd);
	if (err == ETIMEDOUT)
		return -ETIMEDOUT;
	return err == ENOMEM || err == ENOBUFS ? -ENOMEM : -ECONNREFUSED;
}

/* Map a getaddrinfo failure onto the documented set. */
static int gai_errno(int gai)
{
	if (gai == EAI_MEMORY)
		return -ENOMEM;
	return -ENOENT;
}

/* Between calls nothing should arrive: a readable socket means the peer
 * closed it (EOF or error) or sent something unsolicited, such as an error
 * frame before an idle close. Either way the stream is stale. */
int kvc_conn_stale(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) != 0;
}

int kvc_conn_open(const char *host, const char *port, uint64_t deadline_ms, int *fd_out)
{
	struct addrinfo hints, *res, *ai;
	int rc = -ECONNREFUSED, gai;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
	gai = getaddrinfo(host, port, &hints, &res);
	if (gai == EAI_ADDRFAMILY || gai == EAI_NONAME) {
		/* AI_ADDRCONFIG hides loopback-only families: ask once more without. */
		hints.ai_flags = AI_NUMERICSERV;
		gai = getaddrinfo(host, port, &hints, &res);
	}
	if (gai)
		return gai_errno(gai);
	for (ai = res; ai; ai = ai->ai_next) {
		rc = connect_one(ai, deadline_ms, fd_out);
		if (rc == 0 || rc == -ETIMEDOUT || rc == -ENOMEM)
			break;
	}
	freeaddrinfo(res);
	return rc;
}

/* Drop fully transferred entries and advance into a partial one. */
static void iov_advance(struct iovec **iov, size_t *iovcnt, size_t n)
{
	while (*iovcnt && n >= (*iov)->iov_len) {
		n -= (*iov)->iov_len;
		(*iov)++;
		(*iovcnt)--;
	}
	if (*iovcnt && n) {
		(*iov)->iov_base = (char *)(*iov)->iov_base + n;
		(*iov)->iov_len -= n;
	}
}

int kvc_conn_sendv(int fd, struct iovec *iov, size_t iovcnt, uint64_t deadline_ms)
{
	iov_advance(&iov, &iovcnt, 0);
	while (iovcnt) {
		struct msghdr msg = { .msg_iov = iov,
				      .msg_iovlen = iovcnt > (size_t)IOV_MAX ? (size_t)IOV_MAX : iovcnt };
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		int rc;

		if (n >= 0) {
			iov_advance(&iov, &iovcnt, (size_t)n);
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return io_errno(errno);
		rc = wait_fd(fd, POLLOUT, deadline_ms);
		if (rc)
			return rc;
	}
	return 0;
}

int kvc_conn_recvv(int fd, struct iovec *iov, size_t iovcnt, uint64_t deadline_ms)
{
	iov_advance(&iov, &iovcnt, 0);
	while (iovcnt) {
		ssize_t n = readv(fd, iov, iovcnt > (size_t)IOV_MAX ? IOV_MAX : (int)iovcnt);
		int rc;

		if (n > 0) {
			iov_advance(&iov, &iovcnt, (size_t)n);
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return io_errno(errno);
		rc = wait_fd(fd, POLLIN, deadline_ms);
		if (rc)
			return rc;
	}
	return 0;
}

int kvc_conn_recv(int fd, void *buf, size_t len, uint64_t deadline_ms)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };

	return kvc_conn_recvv(fd, &iov, 1, deadline_ms);
}

/* One non-blocking sendmsg of iov[0..iovcnt) (at most IOV_MAX entries). */
ssize_t kvc_conn_try_sendv(int fd, const struct iovec *iov, size_t iovcnt)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov,
			      .msg_iovlen = iovcnt > (size_t)IOV_MAX ? (size_t)IOV_MAX : iovcnt };

	for (;;) {
		ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n >= 0)
			return n;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return io_errno(errno);
	}
}

/* One non-blocking readv into iov[0..iovcnt) (at most IOV_MAX entries). */
ssize_t kvc_conn_try_recvv(int fd, const struct iovec *iov, size_t iovcnt)
{
	for (;;) {
		ssize_t n = readv(fd, iov, iovcnt > (size_t)IOV_MAX ? IOV_MAX : (int)iovcnt);

		if (n > 0)
			return n;
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return io_errno(errno);
	}
}
