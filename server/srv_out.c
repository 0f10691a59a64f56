/*
 * srv_out.c - a TCP connection's output queue: buffer bytes and arena
 * blocks, in order, written with writev.
 */
#include "srv_out.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "store.h"

/* iovecs per writev: a GET batch of many small blocks in one call. */
#define OUT_IOV_MAX 64
/* writev calls per srv_out_write while the socket takes all it is given. */
#define OUT_WRITES_MAX 4
/* First sizes of the buffer and the segment array; they then double. */
#define OUT_FIRST_BYTES (4u * 1024)
#define OUT_FIRST_SEGS 64u

void srv_out_init(struct srv_out *o, struct store *store)
{
	memset(o, 0, sizeof(*o));
	o->store = store;
}

/* Make room for one more segment at the tail. Errors: -ENOMEM. */
static int segs_room(struct srv_out *o)
{
	uint32_t cap;
	struct srv_out_seg *ns;

	if (o->tail < o->segs_cap)
		return 0;
	if (o->segs_cap > UINT32_MAX / 2)
		return -ENOMEM;
	cap = o->segs_cap ? o->segs_cap * 2 : OUT_FIRST_SEGS;
	ns = realloc(o->segs, (size_t)cap * sizeof(*ns));
	if (!ns)
		return -ENOMEM;
	o->segs = ns;
	o->segs_cap = cap;
	return 0;
}

int srv_out_reserve(struct srv_out *o, size_t n, uint8_t **p)
{
	size_t cap = o->buf_cap ? o->buf_cap : OUT_FIRST_BYTES;
	uint8_t *nb;

	if (n > SIZE_MAX / 2 - o->buf_len || segs_room(o) < 0)
		return -ENOMEM;
	if (o->buf_len + n > o->buf_cap) {
		while (cap < o->buf_len + n)
			cap *= 2;
		/* BYTES segments hold offsets, so the buffer may move. */
		nb = realloc(o->buf, cap);
		if (!nb)
			return -ENOMEM;
		o->buf = nb;
		o->buf_cap = cap;
	}
	*p = o->buf + o->buf_len;
	return 0;
}

void srv_out_commit(struct srv_out *o, size_t n)
{
	struct srv_out_seg *last = o->tail > o->head ? &o->segs[o->tail - 1] : NULL;

	if (!n)
		return;
	/* Buffer bytes right after the last buffer segment: one iovec.
	 * Otherwise srv_out_reserve made room for a segment. */
	if (last && !last->block && last->off + last->len == o->buf_len)
		last->len += n;
	else
		o->segs[o->tail++] = (struct srv_out_seg){ .off = o->buf_len, .len = n };
	o->buf_len += n;
	o->bytes += n;
}

int srv_out_block(struct srv_out *o, const uint8_t *data, uint64_t len, struct store_block *block)
{
	int rc = segs_room(o);

	/* Nothing to send (or no room): the pin goes back at once. An empty
	 * segment would sit in the queue with nothing to write it out. */
	if (rc < 0 || len == 0) {
		store_release(o->store, block);
		return rc;
	}
	o->segs[o->tail++] = (struct srv_out_seg){ .data = data, .len = len, .block = block };
	o->bytes += len;
	return 0;
}

/* The queue is empty: start again at the front of the buffer, giving
 * back what a burst grew beyond the keep sizes. */
static void out_reset(struct srv_out *o)
{
	o->head = o->tail = 0;
	o->buf_len = 0;
	if (o->buf_cap > SRV_OUT_KEEP_BYTES) {
		free(o->buf);
		o->buf = NULL;
		o->buf_cap = 0;
	}
	if (o->segs_cap > SRV_OUT_KEEP_SEGS) {
		free(o->segs);
		o->segs = NULL;
		o->segs_cap = 0;
	}
}

/* Account n written bytes to the segments in order, releasing the pin of
 * each block written whole. */
static void out_advance(struct srv_out *o, uint64_t n)
{
	o->bytes -= n;
	while (n && o->head < o->tail) {
		struct srv_out_seg *s = &o->segs[o->head];

		if (n < s->len) {
			if (s->block)
				s->data += n;
			else
				s->off += n;
			s->len -= n;
			return;
		}
		n -= s->len;
		if (s->block)
			store_release(o->store, s->block);
		s->block = NULL;
		o->head++;
	}
	if (o->head == o->tail)
		out_reset(o);
}

/* Fill iov with the first segments. Returns the iovec count; *want
 * receives their bytes. */
static int out_iov(const struct srv_out *o, struct iovec *iov, size_t *want)
{
	int n = 0;

	*want = 0;
	for (uint32_t i = o->head; i < o->tail && n < OUT_IOV_MAX; i++, n++) {
		const struct srv_out_seg *s = &o->segs[i];

		iov[n].iov_base = (void *)(s->block ? s->data : o->buf + s->off);
		iov[n].iov_len = s->len;
		*want += s->len;
	}
	return n;
}

/* srv_out_writev_fn of a socket. */
static long sock_writev(void *arg, const struct iovec *iov, int n)
{
	ssize_t w = writev(*(const int *)arg, iov, n);

	return w < 0 ? -errno : (long)w;
}

long srv_out_write(struct srv_out *o, int fd)
{
	return srv_out_write_fn(o, sock_writev, &fd);
}

long srv_out_write_fn(struct srv_out *o, srv_out_writev_fn fn, void *arg)
{
	struct iovec iov[OUT_IOV_MAX];
	long total = 0;

	for (int round = 0; round < OUT_WRITES_MAX && o->head < o->tail; round++) {
		size_t want;
		int n = out_iov(o, iov, &want);
		long w = fn(arg, iov, n);

		if (w < 0)
			return total ? total : w;
		out_advance(o, (uint64_t)w);
		total += w;
		if ((size_t)w < want)
			break; /* the socket is full */
	}
	return total;
}

void srv_out_free(struct srv_out *o)
{
	for (uint32_t i = o->head; i < o->tail; i++)
		if (o->segs[i].block)
			store_release(o->store, o->segs[i].block);
	free(o->buf);
	free(o->segs);
	srv_out_init(o, o->store);
}
