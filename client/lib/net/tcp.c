/*
 * tcp.c - the TCP peer (transport.h): a non-blocking socket, TCP_NODELAY,
 * close-on-exec, no SIGPIPE. A stream peer: the engine reads a GET's
 * bytes straight into the caller's buffers with readv and sends a PUT's
 * from them with sendmsg.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/clock.h"
#include "transport.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* Map a socket errno onto the documented set. */
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

/* Connect one non-blocking socket to `ai` before the deadline. */
static int connect_one(const struct addrinfo *ai, uint64_t deadline_ms, int *fd_out)
{
	struct pollfd p = { .events = POLLOUT };
	socklen_t len = sizeof(int);
	int fd, err = 0, one = 1, rc;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		return errno == ENOMEM || errno == ENOBUFS ? -ENOMEM : -ECONNREFUSED;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			err = errno;
			goto out_close;
		}
		p.fd = fd;
		do
			rc = poll(&p, 1, kvc_ms_until(deadline_ms));
		while (rc < 0 && errno == EINTR);
		if (rc == 0) {
			close(fd);
			return -ETIMEDOUT;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err)
			goto out_close;
	}
	/* Best effort: a connection without NODELAY still works, only slower. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*fd_out = fd;
	return 0;

out_close:
	close(fd);
	if (err == ETIMEDOUT)
		return -ETIMEDOUT;
	return err == ENOMEM || err == ENOBUFS ? -ENOMEM : -ECONNREFUSED;
}

/* Resolve host:port (-ENOENT when it does not resolve) and connect to the
 * first address that accepts. */
static int tcp_open(struct kvc_link *l, const char *host, uint16_t port, uint64_t deadline_ms)
{
	struct addrinfo hints, *res, *ai;
	char port_str[8];
	int rc = -ECONNREFUSED, gai;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
	snprintf(port_str, sizeof(port_str), "%u", port);
	gai = getaddrinfo(host, port_str, &hints, &res);
	if (gai == EAI_ADDRFAMILY || gai == EAI_NONAME) {
		/* AI_ADDRCONFIG hides loopback-only families: ask once more without. */
		hints.ai_flags = AI_NUMERICSERV;
		gai = getaddrinfo(host, port_str, &hints, &res);
	}
	if (gai)
		return gai == EAI_MEMORY ? -ENOMEM : -ENOENT;
	for (ai = res; ai; ai = ai->ai_next) {
		rc = connect_one(ai, deadline_ms, &l->fd);
		if (rc == 0 || rc == -ETIMEDOUT || rc == -ENOMEM)
			break;
	}
	freeaddrinfo(res);
	if (rc)
		l->fd = -1;
	return rc;
}

static void tcp_close(struct kvc_link *l)
{
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
}

/* Between requests nothing should arrive: a readable socket means the
 * peer closed it (EOF or error) or sent something unsolicited, such as an
 * error frame before an idle close. Either way the stream is stale. */
static int tcp_stale(struct kvc_link *l)
{
	struct pollfd p = { .fd = l->fd, .events = POLLIN };

	return poll(&p, 1, 0) != 0;
}

static ssize_t tcp_send(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	struct msghdr msg = { .msg_iov = (struct iovec *)iov,
			      .msg_iovlen = n > (size_t)IOV_MAX ? (size_t)IOV_MAX : n };

	for (;;) {
		ssize_t k = sendmsg(l->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k >= 0)
			return k;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return io_errno(errno);
	}
}

static ssize_t tcp_recv(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	for (;;) {
		ssize_t k = readv(l->fd, iov, n > (size_t)IOV_MAX ? IOV_MAX : (int)n);

		if (k > 0)
			return k;
		if (k == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return io_errno(errno);
	}
}

static int tcp_pollfds(const struct kvc_link *l, int want_send, struct pollfd *p)
{
	p[0] = (struct pollfd){ .fd = l->fd, .events = POLLIN | (want_send ? POLLOUT : 0) };
	return 1;
}

const struct kvc_transport_ops kvc_tcp_transport = {
	.name = "tcp",
	.open = tcp_open,
	.close = tcp_close,
	.stale = tcp_stale,
	.send = tcp_send,
	.recv = tcp_recv,
	.pollfds = tcp_pollfds,
};
