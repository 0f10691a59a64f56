/*
 * wire.c - the wire limit over loopback TCP: what moving blocks costs with
 * no protocol, no index and no checksum, to hold kvpool's figures against.
 *
 *   wire [--sizes LIST] [--connections C] [--depth D] [--duration S]
 *        [--buffer-bytes B] [--json]
 *
 * For each size, C sender threads each connect to one of C receiver
 * threads in this process over 127.0.0.1. A sender writes messages of SIZE
 * bytes taken in turn from one shared buffer of at least 1 GiB (each
 * sender starts at its own offset and rotates through it, so what it sends
 * is not in cache); a receiver reads them into a buffer of D messages.
 * "Pipelining depth" D means messages in flight: the receiver answers each
 * whole message with one byte, and a sender waits while D messages are
 * unanswered (D = 0: a plain stream, no answers). kvpool bench's --batch
 * is the same unit (blocks in flight per connection).
 *
 * Prints per size the received payload rate in GB/s (10^9 bytes/s),
 * counting whole messages received within the measured window; --json
 * prints one JSON object per size instead.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WIRE_MAX_SIZES 16
#define WIRE_MAX_CONNECTIONS 256
#define WIRE_MIN_BUFFER_BYTES (1ULL << 30)

struct wire_opts {
	uint64_t sizes[WIRE_MAX_SIZES];
	int n_sizes;
	int connections;
	int depth;              /* messages in flight per connection; 0 = stream */
	double duration_s;
	uint64_t buffer_bytes;  /* sender buffer, >= 1 GiB */
	bool json;
};

/* One sender/receiver pair. */
struct wire_pair {
	const struct wire_opts *o;
	const uint8_t *src;     /* the shared sender buffer */
	uint64_t size;          /* message bytes */
	int index;
	int lfd;                /* listening socket (receivers accept on it) */
	uint16_t port;
	pthread_barrier_t *ready, *go; /* receivers ready; the window is set */
	struct timespec t0, t1; /* the measured window */
	uint64_t received;      /* whole messages received inside the window */
	int err;
};

static struct timespec now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t;
}

static double secs(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

/* Is t before the end of the window? */
static bool before(const struct timespec *t, const struct timespec *end)
{
	return secs(t, end) > 0;
}

/* Parse "64KiB", "1MiB", "4096": binary units only (the sizes compared). */
static int parse_size(const char *s, uint64_t *out)
{
	static const char *const units[] = { "", "KiB", "MiB", "GiB" };
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || !v)
		return -EINVAL;
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(end, units[i]))
			continue;
		if (v > (UINT64_MAX >> (10 * i)))
			return -ERANGE;
		*out = (uint64_t)v << (10 * i);
		return 0;
	}
	return -EINVAL;
}

/* Write all of buf to fd. Returns 0 or -errno. */
static int write_all(int fd, const uint8_t *buf, uint64_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		buf += n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* Sender: messages rotate through the shared buffer until the window
 * ends, at most o->depth unanswered. */
static void *sender_main(void *arg)
{
	struct wire_pair *p = arg;
	const struct wire_opts *o = p->o;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(p->port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	uint64_t slots = o->buffer_bytes / p->size;
	uint64_t slot = (uint64_t)p->index * (slots / (uint64_t)o->connections + 1);
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1, inflight = 0;
	uint8_t acks[256];

	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		p->err = -errno;
		goto out_close;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (;;) {
		struct timespec t = now();

		if (!before(&t, &p->t1))
			break;
		while (o->depth && inflight >= o->depth) {
			ssize_t n = recv(fd, acks, sizeof(acks), 0);

			if (n <= 0) {
				p->err = n < 0 ? -errno : -ECONNRESET;
				goto out_close;
			}
			inflight -= (int)n;
		}
		p->err = write_all(fd, p->src + (slot++ % slots) * p->size, p->size);
		if (p->err)
			goto out_close;
		inflight++;
	}
	shutdown(fd, SHUT_WR);
	/* Drain the answers until the receiver closes. */
	while (recv(fd, acks, sizeof(acks), 0) > 0)
		;
out_close:
	if (fd >= 0)
		close(fd);
	return NULL;
}

/* Receiver: read messages into a buffer of depth slots; answer each with
 * one byte; count those completed inside the window. */
static void *receiver_main(void *arg)
{
	struct wire_pair *p = arg;
	const struct wire_opts *o = p->o;
	uint64_t slots = o->depth ? (uint64_t)o->depth : 1, slot = 0, got = 0;
	uint64_t buf_bytes = slots * p->size;
	uint8_t *buf = mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			    -1, 0);
	uint8_t ack = 1;
	int fd = -1, one = 1;

	if (buf == MAP_FAILED) {
		buf = NULL;
	} else {
		(void)madvise(buf, buf_bytes, MADV_HUGEPAGE); /* as the sender's buffer */
		memset(buf, 0, buf_bytes); /* fault the pages in before the window */
	}
	pthread_barrier_wait(p->ready);
	pthread_barrier_wait(p->go);
	if (!buf) {
		p->err = -ENOMEM;
		goto out_free;
	}
	fd = accept(p->lfd, NULL, NULL);
	if (fd < 0) {
		p->err = -errno;
		goto out_free;
	}
	/* The answers are one byte each: Nagle would hold them back. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (;;) {
		ssize_t n = recv(fd, buf + slot * p->size + got, p->size - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (uint64_t)n;
		if (got < p->size)
			continue;
		got = 0;
		slot = (slot + 1) % slots;
		{
			struct timespec t = now();

			if (before(&t, &p->t1) && !before(&t, &p->t0))
				p->received++;
		}
		if (o->depth && send(fd, &ack, 1, MSG_NOSIGNAL) != 1)
			break;
	}
out_free:
	if (fd >= 0)
		close(fd);
	if (buf)
		munmap(buf, buf_bytes);
	return NULL;
}

/* A listening socket on 127.0.0.1, any port. Returns the fd or -errno. */
static int listen_any(uint16_t *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1024) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	*port = ntohs(a.sin_port);
	return fd;
}

/* t + s seconds. */
static struct timespec later(struct timespec t, double s)
{
	long ns = (long)(s * 1e9);

	t.tv_sec += ns / 1000000000L;
	t.tv_nsec += ns % 1000000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* Run one size: C pairs for the duration, after a warm-up of a tenth of
 * it that is not counted. Prints the result. Returns 0 or -errno. */
static int run_size(const struct wire_opts *o, const uint8_t *src, uint64_t size)
{
	struct wire_pair *p = calloc((size_t)o->connections, sizeof(*p));
	pthread_t *snd = calloc((size_t)o->connections, sizeof(*snd));
	pthread_t *rcv = calloc((size_t)o->connections, sizeof(*rcv));
	pthread_barrier_t ready, go;
	struct timespec t0;
	uint64_t msgs = 0;
	uint16_t port = 0;
	int lfd = listen_any(&port), err = 0;
	double gbps;

	if (!p || !snd || !rcv || lfd < 0) {
		err = lfd < 0 ? lfd : -ENOMEM;
		goto out_free;
	}
	pthread_barrier_init(&ready, NULL, (unsigned int)o->connections + 1);
	pthread_barrier_init(&go, NULL, (unsigned int)o->connections + 1);
	for (int i = 0; i < o->connections; i++) {
		p[i] = (struct wire_pair){ .o = o, .src = src, .size = size, .index = i, .lfd = lfd,
					   .port = port, .ready = &ready, .go = &go };
		pthread_create(&rcv[i], NULL, receiver_main, &p[i]);
	}
	/* The window starts once every receive buffer is faulted in. */
	pthread_barrier_wait(&ready);
	t0 = later(now(), o->duration_s / 10);
	for (int i = 0; i < o->connections; i++) {
		p[i].t0 = t0;
		p[i].t1 = later(t0, o->duration_s);
	}
	pthread_barrier_wait(&go);
	for (int i = 0; i < o->connections; i++)
		pthread_create(&snd[i], NULL, sender_main, &p[i]);
	for (int i = 0; i < o->connections; i++) {
		pthread_join(snd[i], NULL);
		pthread_join(rcv[i], NULL);
		msgs += p[i].received;
		if (p[i].err && !err)
			err = p[i].err;
	}
	pthread_barrier_destroy(&ready);
	pthread_barrier_destroy(&go);
	gbps = (double)msgs * (double)size / o->duration_s / 1e9;
	if (o->json)
		printf("{\"size_bytes\":%llu,\"connections\":%d,\"depth\":%d,\"seconds\":%.3f,"
		       "\"messages\":%llu,\"bytes\":%llu,\"gbps\":%.4f}\n",
		       (unsigned long long)size, o->connections, o->depth, o->duration_s,
		       (unsigned long long)msgs, (unsigned long long)(msgs * size), gbps);
	else
		printf("wire: %10llu B x %d connection%s, depth %d: %8.3f GB/s (%llu messages in "
		       "%.2f s)\n", (unsigned long long)size, o->connections,
		       o->connections == 1 ? "" : "s", o->depth, gbps, (unsigned long long)msgs,
		       o->duration_s);
	fflush(stdout);
out_free:
	if (lfd >= 0)
		close(lfd);
	free(p);
	free(snd);
	free(rcv);
	return err;
}

static const char usage[] =
	"usage: wire [--sizes LIST] [--connections C] [--depth D] [--duration S]\n"
	"            [--buffer-bytes B] [--json]\n"
	"  --sizes LIST      message sizes, comma-separated, B/KiB/MiB/GiB (default 1MiB)\n"
	"  --connections C   sender/receiver pairs, 1..256 (default 1)\n"
	"  --depth D         messages in flight per connection, 0 = stream (default 1)\n"
	"  --duration S      measured seconds per size (default 3)\n"
	"  --buffer-bytes B  sender buffer, at least 1GiB (default 1GiB)\n"
	"  --json            one JSON object per size\n";

/* Parse a comma-separated list of sizes into o. */
static int parse_sizes(const char *arg, struct wire_opts *o)
{
	char *copy = strdup(arg), *save = NULL;
	int rc = 0;

	if (!copy)
		return -ENOMEM;
	o->n_sizes = 0;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (o->n_sizes == WIRE_MAX_SIZES || parse_size(t, &o->sizes[o->n_sizes])) {
			rc = -EINVAL;
			break;
		}
		o->n_sizes++;
	}
	free(copy);
	return rc || !o->n_sizes ? -EINVAL : 0;
}

/* Parse the command line. Returns 0, or the exit code (usage printed). */
static int parse_args(int argc, char **argv, struct wire_opts *o)
{
	static const struct option longopts[] = {
		{ "sizes", required_argument, NULL, 's' },
		{ "connections", required_argument, NULL, 'c' },
		{ "depth", required_argument, NULL, 'd' },
		{ "duration", required_argument, NULL, 't' },
		{ "buffer-bytes", required_argument, NULL, 'b' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;
	char *end;

	*o = (struct wire_opts){ .sizes = { 1 << 20 }, .n_sizes = 1, .connections = 1,
				 .depth = 1, .duration_s = 3.0,
				 .buffer_bytes = WIRE_MIN_BUFFER_BYTES };
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (parse_sizes(optarg, o))
				goto bad;
			break;
		case 'c':
			o->connections = (int)strtol(optarg, &end, 10);
			if (*end || o->connections < 1 || o->connections > WIRE_MAX_CONNECTIONS)
				goto bad;
			break;
		case 'd':
			o->depth = (int)strtol(optarg, &end, 10);
			if (*end || o->depth < 0 || o->depth > 65536)
				goto bad;
			break;
		case 't':
			o->duration_s = strtod(optarg, &end);
			if (*end || !(o->duration_s >= 0.01 && o->duration_s <= 3600))
				goto bad;
			break;
		case 'b':
			if (parse_size(optarg, &o->buffer_bytes) ||
			    o->buffer_bytes < WIRE_MIN_BUFFER_BYTES)
				goto bad;
			break;
		case 'j':
			o->json = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			goto bad;
		}
	}
	for (int i = 0; i < o->n_sizes; i++)
		if (o->sizes[i] > o->buffer_bytes)
			goto bad;
	if (optind == argc)
		return -1;
bad:
	fprintf(stderr, "wire: bad arguments\n%s", usage);
	return 2;
}

int main(int argc, char **argv)
{
	struct wire_opts o;
	uint8_t *src;
	int rc = parse_args(argc, argv, &o);

	if (rc >= 0)
		return rc;
	src = mmap(NULL, o.buffer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		   0);
	if (src == MAP_FAILED) {
		perror("wire: mmap");
		return 1;
	}
	/* Huge pages where the kernel can: the pool's arena asks for them
	 * too, and with 4 KiB pages the sender pays a TLB miss per page. */
	(void)madvise(src, o.buffer_bytes, MADV_HUGEPAGE);
	/* Real pages with varied bytes: an untouched mapping reads as the
	 * shared zero page, which would sit in cache. */
	for (uint64_t i = 0; i < o.buffer_bytes; i += 8) {
		uint64_t v = (i + 1) * 0x9e3779b97f4a7c15ULL;

		memcpy(src + i, &v, sizeof(v));
	}
	for (int i = 0; i < o.n_sizes; i++) {
		int err = run_size(&o, src, o.sizes[i]);

		if (err) {
			fprintf(stderr, "wire: %s\n", strerror(-err));
			rc = 1;
		}
	}
	munmap(src, o.buffer_bytes);
	return rc < 0 ? 0 : rc;
}
