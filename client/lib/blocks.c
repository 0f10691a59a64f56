/*
 * blocks.c - kvpool_put and kvpool_get: batched, pipelined block transfer
 * straight between the socket and the caller's scatter-gather lists (TCP),
 * or described to the server, which moves the bytes with RDMA READ/WRITE:
 * in place when the buffer is one iovec inside a registered region, else
 * through the handle's staging buffer (RDMA; see conn_rdma.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "batch.h"
#include "checksum.h"
#include "client.h"
#include "cluster.h"
#include "rdmx.h"

/* Per-call state of a PUT. Entries sent are a subset of the blocks:
 * blocks refused locally (empty or too large) are not sent. */
struct put_call {
	const struct kvpool_put_block *blocks;
	uint8_t version;  /* of the frames: the handle's */
	uint32_t *flags;  /* per block KVPOOL_PUT_* (the caller's), or NULL */
	int *st;          /* per block */
	size_t *sent;     /* entry -> block index */
	uint64_t *bytes;  /* per block payload bytes */
};

/* Per-call state of a GET. Entries sent are a subset of the blocks: all
 * of them at first, then those answered BUSY. */
struct get_call {
	struct kvpool_get_block *blocks;
	int *st;          /* per block */
	uint64_t *cap;    /* per block buffer bytes */
	size_t *sent;     /* entry -> block index */
};

/* Scratch arrays of a call in one allocation: two arrays of `count`
 * 64-bit words (a, b), then `count` ints of statuses when the caller gave
 * no status array. */
struct call_mem {
	void *mem;
	int *st;
	uint64_t *a, *b;
};

static int call_mem_alloc(struct call_mem *m, size_t count, int *statuses)
{
	size_t words;

	if (count > SIZE_MAX / 32)
		return -ENOMEM;
	words = 2 * count + (statuses ? 0 : (count * sizeof(int) + 7) / 8);
	m->mem = malloc(words * sizeof(uint64_t));
	if (!m->mem)
		return -ENOMEM;
	m->a = m->mem;
	m->b = m->a + count;
	m->st = statuses ? statuses : (int *)(m->b + count);
	return 0;
}

/* Write err into every status; returns err. */
static int fill_status(int *st, size_t count, int err)
{
	for (size_t i = 0; st && i < count; i++)
		st[i] = err;
	return err;
}

/* The first nonzero status, or 0. */
static int first_error(const int *st, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (st[i])
			return st[i];
	return 0;
}

/* Start a put or get call of count blocks: (re)connect and allocate its
 * scratch. Returns 0, or an error already written to every status. */
static int call_start(struct kvpool_client *c, size_t count, int *statuses, struct call_mem *m,
		      uint64_t *deadline_ms)
{
	int rc = kvc_begin(c, deadline_ms);

	if (rc)
		return fill_status(statuses, count, rc);
	if (call_mem_alloc(m, count, statuses))
		return fill_status(statuses, count, -ENOMEM);
	return 0;
}

/* List for another pass the blocks of a call answered BUSY (into the
 * call's entry -> block map); returns how many. */
typedef size_t (*busy_select_fn)(void *ctx, size_t count);

/* Run the call's batch, and again over what was answered BUSY with
 * backoff (kvpool.h, Backpressure); free its scratch, and return 0 or the
 * first error (a whole-call error goes into every status). */
static int call_finish(struct kvpool_client *c, struct kvc_batch *b, uint64_t deadline_ms,
		       struct call_mem *m, size_t count, busy_select_fn busy_select)
{
	struct kvc_backoff bo;
	int rc;

	kvc_backoff_start(&bo, c);
	for (;;) {
		rc = kvc_batch_run(c, b, deadline_ms);
		if (rc)
			break;
		b->count = busy_select(b->ctx, count);
		if (!b->count || !kvc_backoff_again(&bo, c, deadline_ms))
			break;
	}
	if (rc)
		fill_status(m->st, count, rc);
	else
		rc = first_error(m->st, count);
	free(m->mem);
	return rc;
}

static int key_is_zero(const uint8_t *key)
{
	for (int i = 0; i < KVPOOL_KEY_BYTES; i++)
		if (key[i])
			return 0;
	return 1;
}

/* A scatter-gather list the library may read or write: at least one
 * entry, no NULL base under a nonzero length (checked here so that a bad
 * list is -EINVAL before anything is sent, rather than a crash in the
 * checksum or a failed recv that costs the connection), and a total that
 * fits in 64 bits. */
static int iov_valid(const struct iovec *iov, int iovcnt)
{
	uint64_t total = 0;

	if (!iov || iovcnt < 1)
		return 0;
	for (int i = 0; i < iovcnt; i++) {
		if (!iov[i].iov_base && iov[i].iov_len)
			return 0;
		if (iov[i].iov_len > UINT64_MAX - total)
			return 0;
		total += iov[i].iov_len;
	}
	return 1;
}

/* ---- PUT ---------------------------------------------------------------- */

/* Encode one PUT entry; the checksum is computed here, one frame at a
 * time, so the bytes are still in cache when they are sent. A parent of
 * 32 zero bytes is the index's "no parent" and is sent as none. */
static void put_encode(void *ctx, size_t i, uint8_t *body, uint32_t j)
{
	struct put_call *pc = ctx;
	const struct kvpool_put_block *b = &pc->blocks[pc->sent[i]];
	struct proto_put_entry e;

	memset(&e, 0, sizeof(e));
	memcpy(e.key, b->key, PROTO_KEY_BYTES);
	if (b->parent && !key_is_zero(b->parent)) {
		memcpy(e.parent, b->parent, PROTO_KEY_BYTES);
		e.flags = PROTO_PUT_HAS_PARENT;
	}
	e.length = pc->bytes[pc->sent[i]];
	e.checksum = kvc_checksum_prefix(b->iov, b->iovcnt, e.length);
	e.retain_ms = b->retain_ms; /* v1: not sent */
	proto_put_entry_encode_v(body, j, pc->version, &e);
}

static uint64_t put_payload_bytes(void *ctx, size_t i)
{
	struct put_call *pc = ctx;

	return pc->bytes[pc->sent[i]];
}

static size_t put_payload_iovcnt(void *ctx, size_t i)
{
	struct put_call *pc = ctx;

	return (size_t)pc->blocks[pc->sent[i]].iovcnt;
}

/* The caller's iovecs go to sendmsg as they are: no staging copy. */
static void put_payload_iov(void *ctx, size_t i, struct iovec *iov)
{
	struct put_call *pc = ctx;
	const struct kvpool_put_block *b = &pc->blocks[pc->sent[i]];

	memcpy(iov, b->iov, (size_t)b->iovcnt * sizeof(*iov));
}

static int put_results(void *ctx, struct kvpool_client *c, size_t first, size_t n,
		       const struct proto_batch *b, uint64_t payload_bytes, uint64_t deadline_ms)
{
	struct put_call *pc = ctx;
	struct proto_result r;

	(void)deadline_ms;
	if (payload_bytes)
		return kvc_stream_error(c, -EPROTO);
	for (size_t j = 0; j < n; j++) {
		if (proto_result_decode(b, (uint32_t)j, &r))
			return kvc_stream_error(c, -EPROTO);
		pc->st[pc->sent[first + j]] = proto_status_to_errno(r.status);
		if (pc->flags)
			pc->flags[pc->sent[first + j]] = r.flags;
	}
	return 0;
}

static void put_refused(void *ctx, size_t first, size_t n, int err)
{
	struct put_call *pc = ctx;

	for (size_t j = 0; j < n; j++)
		pc->st[pc->sent[first + j]] = err;
}

/* RDMA: the registered region holding buffer iov[0..iovcnt) of `bytes`
 * bytes when it can be described as it is (one iovec, all of it inside a
 * region registered on the connection), else NULL. */
static const struct kvc_region *direct_region(const struct kvpool_client *c,
					      const struct iovec *iov, int iovcnt, uint64_t bytes)
{
	const struct kvc_region *r;

	if (iovcnt != 1 || bytes > UINT32_MAX || bytes > iov[0].iov_len)
		return NULL;
	r = kvc_region_find(c, iov[0].iov_base, (size_t)bytes);
	return r && r->mr ? r : NULL;
}

/* Copy the first `bytes` bytes of iov[0..iovcnt) into dst. */
static void gather(uint8_t *dst, const struct iovec *iov, int iovcnt, uint64_t bytes)
{
	for (int i = 0; i < iovcnt && bytes; i++) {
		size_t n = iov[i].iov_len < bytes ? iov[i].iov_len : (size_t)bytes;

		memcpy(dst, iov[i].iov_base, n);
		dst += n;
		bytes -= n;
	}
}

/* Copy `bytes` bytes of src into the first bytes of iov[0..iovcnt). */
static void scatter(const uint8_t *src, const struct iovec *iov, int iovcnt, uint64_t bytes)
{
	for (int i = 0; i < iovcnt && bytes; i++) {
		size_t n = iov[i].iov_len < bytes ? iov[i].iov_len : (size_t)bytes;

		memcpy(iov[i].iov_base, src, n);
		src += n;
		bytes -= n;
	}
}

static uint64_t put_stage_bytes(void *ctx, const struct kvpool_client *c, size_t i)
{
	struct put_call *pc = ctx;
	const struct kvpool_put_block *b = &pc->blocks[pc->sent[i]];
	uint64_t bytes = pc->bytes[pc->sent[i]];

	return direct_region(c, b->iov, b->iovcnt, bytes) ? 0 : bytes;
}

/* The server READs the block from where it is, or from the staging copy. */
static void put_describe(void *ctx, struct kvpool_client *c, size_t i, uint64_t stage_off,
			 struct rdmx_desc *d)
{
	struct put_call *pc = ctx;
	const struct kvpool_put_block *b = &pc->blocks[pc->sent[i]];
	uint64_t bytes = pc->bytes[pc->sent[i]];
	const struct kvc_region *r = direct_region(c, b->iov, b->iovcnt, bytes);

	d->length = (uint32_t)bytes;
	if (r) {
		d->addr = (uint64_t)(uintptr_t)b->iov[0].iov_base;
		d->rkey = rdmx_client_mr_rkey(r->mr);
		return;
	}
	gather(c->stage + stage_off, b->iov, b->iovcnt, bytes);
	d->addr = (uint64_t)(uintptr_t)(c->stage + stage_off);
	d->rkey = rdmx_client_mr_rkey(c->stage_mr);
}

static const struct kvc_batch_ops put_ops = {
	.stage_bytes = put_stage_bytes,
	.describe = put_describe,
	.encode = put_encode,
	.payload_bytes = put_payload_bytes,
	.payload_iovcnt = put_payload_iovcnt,
	.payload_iov = put_payload_iov,
	.results = put_results,
	.refused = put_refused,
};

int kvc_put_blocks_valid(const struct kvpool_put_block *blocks, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (!blocks[i].key || !iov_valid(blocks[i].iov, blocks[i].iovcnt))
			return 0;
	return 1;
}

/* Refuse empty and oversize blocks locally; list the others to send.
 * Returns how many are to be sent. */
static size_t put_select(struct put_call *pc, size_t count, uint64_t max_block_bytes)
{
	size_t n = 0;

	for (size_t k = 0; k < count; k++) {
		const struct kvpool_put_block *b = &pc->blocks[k];

		pc->bytes[k] = kvc_iov_bytes(b->iov, b->iovcnt);
		if (pc->bytes[k] == 0 || pc->bytes[k] > max_block_bytes) {
			pc->st[k] = -EMSGSIZE;
			continue;
		}
		pc->st[k] = 0;
		pc->sent[n++] = k;
	}
	return n;
}

/* Is `parent` the key of one of the first n blocks listed in pc->sent? */
static int parent_listed(const struct put_call *pc, size_t n, const uint8_t *parent)
{
	if (!parent || key_is_zero(parent))
		return 0;
	for (size_t j = 0; j < n; j++)
		if (!memcmp(pc->blocks[pc->sent[j]].key, parent, KVPOOL_KEY_BYTES))
			return 1;
	return 0;
}

/* After a pass: list the blocks answered BUSY, and the blocks refused
 * NO_PARENT whose parent is one of those (in the same call, it was not
 * stored only because it was busy), in call order so parents go first.
 * Their statuses stay as they are until a next pass answers them. */
static size_t put_busy_select(void *ctx, size_t count)
{
	struct put_call *pc = ctx;
	size_t n = 0;

	for (size_t k = 0; k < count; k++)
		if (pc->st[k] == -EAGAIN ||
		    (pc->st[k] == -ENOLINK && n && parent_listed(pc, n, pc->blocks[k].parent)))
			pc->sent[n++] = k;
	return n;
}

/* Zero count flags (NULL: none). */
static void flags_clear(uint32_t *flags, size_t count)
{
	if (flags && count)
		memset(flags, 0, count * sizeof(*flags));
}

int kvc_put_sync(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		 int *statuses)
{
	return kvc_put_sync_ex(c, blocks, count, statuses, NULL);
}

int kvc_put_sync_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		    int *statuses, uint32_t *flags)
{
	struct put_call pc = { .blocks = blocks, .flags = flags };
	struct kvc_batch b = {
		.op = PROTO_OP_PUT,
		.entry_bytes = PROTO_PUT_ENTRY_BYTES,
		.ops = &put_ops,
		.ctx = &pc,
	};
	struct call_mem m;
	uint64_t deadline_ms;
	int rc;

	flags_clear(flags, count);
	if (c && c->cluster)
		return kvcl_put(c->cluster, blocks, count, statuses, flags);
	if (!c || (count && !blocks) || !kvc_put_blocks_valid(blocks, count))
		return fill_status(statuses, count, -EINVAL);
	if (count == 0)
		return 0;
	rc = call_start(c, count, statuses, &m, &deadline_ms);
	if (rc)
		return rc;
	pc.version = kvc_version(c);
	pc.st = m.st;
	pc.sent = (size_t *)m.a;
	pc.bytes = m.b;
	b.count = put_select(&pc, count, c->limits.max_block_bytes);
	return call_finish(c, &b, deadline_ms, &m, count, put_busy_select);
}

/* Asynchronous requests in flight: this call queues behind them. */
int kvpool_put(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
	       int *statuses)
{
	return kvpool_put_ex(c, blocks, count, statuses, NULL);
}

int kvpool_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		  int *statuses, uint32_t *flags)
{
	if (c && count && blocks && kvc_async_busy(c)) {
		flags_clear(flags, count);
		if (!kvc_put_blocks_valid(blocks, count))
			return fill_status(statuses, count, -EINVAL);
		return kvc_async_call_ex(c, KVPOOL_OP_PUT, blocks, count, statuses, flags, NULL, NULL);
	}
	return kvc_put_sync_ex(c, blocks, count, statuses, flags);
}

int kvpool_put_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES],
		     const uint8_t *parent, const void *data, size_t length)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = length };
	struct kvpool_put_block b = { .key = key, .parent = parent, .iov = &iov, .iovcnt = 1 };

	if (!data && length)
		return -EINVAL;
	return kvpool_put(c, &b, 1, NULL);
}

/* ---- GET ---------------------------------------------------------------- */

static void get_encode(void *ctx, size_t i, uint8_t *body, uint32_t j)
{
	struct get_call *gc = ctx;
	struct proto_get_entry e;

	memcpy(e.key, gc->blocks[gc->sent[i]].key, PROTO_KEY_BYTES);
	e.max_length = gc->cap[gc->sent[i]];
	proto_get_entry_encode(body, j, &e);
}

/* Check a GET reply's results against the request: OK blocks fit their
 * buffers and their lengths add up to the payload; a TOO_LARGE block's
 * reported length (0: not reported) does not fit, so a caller that
 * retries with that many bytes cannot be told TOO_LARGE forever.
 * *iovcnt receives the iovecs needed to scatter the payload. */
static int get_check(struct get_call *gc, size_t first, size_t n, const struct proto_batch *b,
		     uint64_t payload_bytes, size_t *iovcnt)
{
	struct proto_result r;
	uint64_t total = 0;
	size_t iov = 0;

	for (size_t j = 0; j < n; j++) {
		size_t k = gc->sent[first + j];

		if (proto_result_decode(b, (uint32_t)j, &r))
			return -EPROTO;
		if (r.status == PROTO_STATUS_TOO_LARGE && r.length && r.length <= gc->cap[k])
			return -EPROTO;
		if (r.status != PROTO_STATUS_OK)
			continue;
		if (r.length == 0 || r.length > gc->cap[k] || r.length > payload_bytes - total)
			return -EPROTO;
		total += r.length;
		iov += (size_t)gc->blocks[k].iovcnt;
	}
	if (total != payload_bytes)
		return -EPROTO;
	*iovcnt = iov;
	return 0;
}

/* Describe where each OK block's bytes go: the first r.length bytes of
 * its caller's iovecs. Returns the number of iovecs written. */
static size_t get_scatter(struct get_call *gc, size_t first, size_t n, const struct proto_batch *b,
			  struct iovec *iov)
{
	struct proto_result r;
	size_t k = 0;

	for (size_t j = 0; j < n; j++) {
		const struct kvpool_get_block *blk = &gc->blocks[gc->sent[first + j]];
		uint64_t left;

		proto_result_decode(b, (uint32_t)j, &r);
		if (r.status != PROTO_STATUS_OK)
			continue;
		left = r.length;
		for (int i = 0; i < blk->iovcnt && left; i++) {
			size_t len = blk->iov[i].iov_len < left ? blk->iov[i].iov_len : (size_t)left;

			iov[k].iov_base = blk->iov[i].iov_base;
			iov[k++].iov_len = len;
			left -= len;
		}
	}
	return k;
}

/* Verify each OK block's bytes against the server's checksum and set the
 * per-block statuses of the frame. A block too large for its buffers
 * gets its real length, so that the caller can retry with room for it. */
static void get_verify(struct get_call *gc, struct kvpool_client *c, size_t first, size_t n,
		       const struct proto_batch *b)
{
	struct proto_result r;

	for (size_t j = 0; j < n; j++) {
		size_t k = gc->sent[first + j];
		struct kvpool_get_block *blk = &gc->blocks[k];
		int err;

		proto_result_decode(b, (uint32_t)j, &r);
		if (r.status == PROTO_STATUS_TOO_LARGE)
			blk->length = r.length;
		if (r.status != PROTO_STATUS_OK) {
			err = proto_status_to_errno(r.status);
			/* Success without bytes makes no sense for a GET. */
			gc->st[k] = err ? err : -EPROTO;
			continue;
		}
		if (kvc_checksum_prefix(blk->iov, blk->iovcnt, r.length) != r.checksum) {
			c->checksum_errors++;
			gc->st[k] = -EBADMSG;
			continue;
		}
		blk->length = r.length;
		gc->st[k] = 0;
	}
}

static uint64_t get_stage_bytes(void *ctx, const struct kvpool_client *c, size_t i)
{
	struct get_call *gc = ctx;
	const struct kvpool_get_block *b = &gc->blocks[gc->sent[i]];
	uint64_t cap = gc->cap[gc->sent[i]];

	return direct_region(c, b->iov, b->iovcnt, cap) ? 0 : cap;
}

/* The server WRITEs the block into the caller's buffer, or into staging. */
static void get_describe(void *ctx, struct kvpool_client *c, size_t i, uint64_t stage_off,
			 struct rdmx_desc *d)
{
	struct get_call *gc = ctx;
	const struct kvpool_get_block *b = &gc->blocks[gc->sent[i]];
	uint64_t cap = gc->cap[gc->sent[i]];
	const struct kvc_region *r = direct_region(c, b->iov, b->iovcnt, cap);

	d->length = (uint32_t)cap;
	if (r) {
		d->addr = (uint64_t)(uintptr_t)b->iov[0].iov_base;
		d->rkey = rdmx_client_mr_rkey(r->mr);
		return;
	}
	d->addr = (uint64_t)(uintptr_t)(c->stage + stage_off);
	d->rkey = rdmx_client_mr_rkey(c->stage_mr);
}

/* RDMA: the OK blocks' bytes are in place; copy the staged ones out to
 * the caller's buffers (same staging offsets as when described). */
static void get_unstage(struct get_call *gc, struct kvpool_client *c, size_t first, size_t n,
			const struct proto_batch *b)
{
	struct proto_result r;
	uint64_t off = 0;

	for (size_t j = 0; j < n; j++) {
		const struct kvpool_get_block *blk = &gc->blocks[gc->sent[first + j]];
		uint64_t sb = get_stage_bytes(gc, c, first + j);

		proto_result_decode(b, (uint32_t)j, &r);
		if (sb && r.status == PROTO_STATUS_OK)
			scatter(c->stage + off, blk->iov, blk->iovcnt, r.length);
		off += sb;
	}
}

/* Read a GET reply's payload straight into the caller's buffers (TCP),
 * or take the bytes the server wrote (RDMA). */
static int get_results(void *ctx, struct kvpool_client *c, size_t first, size_t n,
		       const struct proto_batch *b, uint64_t payload_bytes, uint64_t deadline_ms)
{
	struct get_call *gc = ctx;
	size_t iovcnt, k;
	int rc;

	rc = get_check(gc, first, n, b, payload_bytes, &iovcnt);
	if (rc)
		return kvc_stream_error(c, rc);
	if (c->rdma) {
		get_unstage(gc, c, first, n, b);
		get_verify(gc, c, first, n, b);
		return 0;
	}
	rc = kvc_iov_reserve(c, iovcnt ? iovcnt : 1);
	if (rc)
		return kvc_stream_error(c, rc);
	k = get_scatter(gc, first, n, b, c->iov);
	rc = kvc_recv_payload(c, c->iov, k, deadline_ms);
	if (rc)
		return rc;
	get_verify(gc, c, first, n, b);
	return 0;
}

static void get_refused(void *ctx, size_t first, size_t n, int err)
{
	struct get_call *gc = ctx;

	for (size_t j = 0; j < n; j++)
		gc->st[gc->sent[first + j]] = err;
}

/* After a pass: list the blocks answered BUSY (a whole frame refused
 * BUSY, or a block the server could not read now). */
static size_t get_busy_select(void *ctx, size_t count)
{
	struct get_call *gc = ctx;
	size_t n = 0;

	for (size_t k = 0; k < count; k++)
		if (gc->st[k] == -EAGAIN)
			gc->sent[n++] = k;
	return n;
}

static const struct kvc_batch_ops get_ops = {
	.stage_bytes = get_stage_bytes,
	.describe = get_describe,
	.encode = get_encode,
	.results = get_results,
	.refused = get_refused,
};

int kvc_get_blocks_valid(const struct kvpool_get_block *blocks, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (!blocks[i].key || !iov_valid(blocks[i].iov, blocks[i].iovcnt))
			return 0;
	return 1;
}

int kvc_get_sync(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
		 int *statuses)
{
	struct get_call gc = { .blocks = blocks };
	struct kvc_batch b = {
		.op = PROTO_OP_GET,
		.entry_bytes = PROTO_GET_ENTRY_BYTES,
		.count = count,
		.ops = &get_ops,
		.ctx = &gc,
	};
	struct call_mem m;
	uint64_t deadline_ms;
	int rc;

	if (c && c->cluster)
		return kvcl_get(c->cluster, blocks, count, statuses);
	if (!c || (count && !blocks) || !kvc_get_blocks_valid(blocks, count))
		return fill_status(statuses, count, -EINVAL);
	if (count == 0)
		return 0;
	rc = call_start(c, count, statuses, &m, &deadline_ms);
	if (rc)
		return rc;
	gc.st = m.st;
	gc.cap = m.a;
	gc.sent = (size_t *)m.b;
	for (size_t i = 0; i < count; i++) {
		gc.cap[i] = kvc_iov_bytes(blocks[i].iov, blocks[i].iovcnt);
		/* RDMA: a descriptor (and a staging slot) holds no more than
		 * the largest block the server stores. */
		if (c->rdma && gc.cap[i] > c->limits.max_block_bytes)
			gc.cap[i] = c->limits.max_block_bytes;
		gc.sent[i] = i;
	}
	return call_finish(c, &b, deadline_ms, &m, count, get_busy_select);
}

int kvpool_get(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
	       int *statuses)
{
	if (c && count && blocks && kvc_async_busy(c)) {
		if (!kvc_get_blocks_valid(blocks, count))
			return fill_status(statuses, count, -EINVAL);
		return kvc_async_call(c, KVPOOL_OP_GET, blocks, count, statuses, 0, NULL);
	}
	return kvc_get_sync(c, blocks, count, statuses);
}

int kvpool_get_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES], void *buf,
		     size_t cap, uint64_t *length)
{
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct kvpool_get_block b = { .key = key, .iov = &iov, .iovcnt = 1 };
	int rc;

	if (!buf && cap)
		return -EINVAL;
	rc = kvpool_get(c, &b, 1, NULL);
	/* b.length is 0 unless the block's size is known (see kvpool.h). */
	if (length && (rc == 0 || (rc == -EMSGSIZE && b.length)))
		*length = b.length;
	return rc;
}
