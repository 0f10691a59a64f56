/*
 * srv_out.h - the output queue of a TCP connection: reply headers and
 * bodies in a per-connection byte buffer, GET payloads straight from the
 * arena, written in order with writev.
 *
 * Every reply byte of a TCP connection goes through its srv_out, so
 * replies leave in the order they were queued. Small bytes (headers,
 * result bodies, error bodies, the STATS document) are appended to one
 * buffer; a GET block is queued as a pointer into the arena with the
 * block's pin (store_ref.block), which the queue releases exactly once:
 * when the block's last byte was written, or when the queue is dropped
 * (connection closed with bytes unsent).
 *
 * The buffer and the segment array grow on first use and are then kept,
 * so a steady state of same-shaped requests allocates nothing; they are
 * given back when the queue empties after a burst that made them larger
 * than SRV_OUT_KEEP_BYTES / SRV_OUT_KEEP_SEGS. A queue is touched only by
 * the worker thread that owns its connection.
 */
#ifndef KVPOOL_SRV_OUT_H
#define KVPOOL_SRV_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct store;
struct store_block;

/* Buffer bytes and segments kept across an empty queue. */
#define SRV_OUT_KEEP_BYTES (256u * 1024)
#define SRV_OUT_KEEP_SEGS 4096u

/* One run of output bytes: buffer bytes [off, off + len) when block is
 * NULL, else len bytes at data in the arena, pinned by block. */
struct srv_out_seg {
	const uint8_t *data;
	uint64_t off;
	uint64_t len;              /* bytes not yet written */
	struct store_block *block; /* released once written or dropped */
};

struct srv_out {
	struct store *store;       /* where block pins go back */
	uint8_t *buf;              /* buf_len bytes queued or being written */
	size_t buf_len, buf_cap;
	struct srv_out_seg *segs;  /* segs[head..tail) wait, in order */
	uint32_t head, tail, segs_cap;
	uint64_t bytes;            /* bytes queued and not yet written */
};

/* Start an empty queue whose pins go back to `store`. Allocates nothing. */
void srv_out_init(struct srv_out *o, struct store *store);

/* Bytes queued and not yet written. */
static inline uint64_t srv_out_bytes(const struct srv_out *o)
{
	return o->bytes;
}

/* Reserve n contiguous buffer bytes at the tail, and room to queue them;
 * *p points at them until the next call on o. Nothing is queued before
 * srv_out_commit. Errors: -ENOMEM (nothing queued). */
int srv_out_reserve(struct srv_out *o, size_t n, uint8_t **p);

/* Queue the first n bytes of the space srv_out_reserve just returned (n
 * no larger than reserved). Cannot fail. */
void srv_out_commit(struct srv_out *o, size_t n);

/* Queue len bytes at data, pinned by `block`: the queue owns the pin from
 * now on, also on error, where it is released at once (as when len is 0:
 * nothing is queued). Errors: -ENOMEM. */
int srv_out_block(struct srv_out *o, const uint8_t *data, uint64_t len, struct store_block *block);

/* Write what the socket fd takes now, in order, with writev; releases
 * the pins of blocks written whole. Returns bytes written (0 when nothing
 * was queued), or -errno of writev (-EAGAIN: the socket is full). */
long srv_out_write(struct srv_out *o, int fd);

/* A writer of iov[0..n) in order for srv_out_write_fn: returns the bytes
 * it took (> 0, fewer when it is full), or -errno (-EAGAIN: none now). */
typedef long (*srv_out_writev_fn)(void *arg, const struct iovec *iov, int n);

/* srv_out_write through `fn` (a TLS session's writer) instead of
 * writev(2) on a socket; the next call starts again at the first byte not
 * taken. Same results. */
long srv_out_write_fn(struct srv_out *o, srv_out_writev_fn fn, void *arg);

/* Drop everything queued, releasing every pin still held, and free the
 * buffers. The queue is empty and reusable afterwards. Accepts a queue
 * that was only initialised. */
void srv_out_free(struct srv_out *o);

#endif /* KVPOOL_SRV_OUT_H */
