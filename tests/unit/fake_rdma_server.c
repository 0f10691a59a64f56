/*
 * fake_rdma_server.c - the fake RDMA kvpoold of fake_rdma_server.h: test
 * code, kept compact. One thread polls the listener, the worker and every
 * connection (as kvpoold's event loop would on their fds).
 */
#ifdef KVPOOL_RDMA

#include "fake_rdma_server.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "fake_verbs.h"

/* One connection and the request it is working on (one at a time). */
struct frs_conn {
	struct fake_rdma_server *fs;
	struct rdmx_conn *c;
	int slot;
	uint8_t op;
	uint64_t request_id;
	uint32_t count;
	struct proto_put_entry put[FRS_MAX_DESCS];
	uint64_t off[FRS_MAX_DESCS];
	struct proto_result res[FRS_MAX_DESCS];
	struct rdmx_xfer_item items[FRS_MAX_DESCS];
	int busy;                                /* a request is being answered */
	uint8_t q[RDMX_MSG_DEPTH][RDMX_MSG_MAX_BYTES]; /* requests waiting, oldest first */
	size_t q_bytes[RDMX_MSG_DEPTH];
	int q_len;
};

static void handle(struct frs_conn *fc, const uint8_t *msg, size_t bytes);

static struct proto_limits limits_of(const struct fake_rdma_server *fs)
{
	return (struct proto_limits){ .max_frame_bytes = RDMX_MSG_MAX_BYTES,
				      .max_batch_blocks = FRS_MAX_DESCS,
				      .max_block_bytes = fs->limits.max_block_bytes };
}

/* Send a reply: header, then body[0..body_bytes). */
static void reply(struct frs_conn *fc, uint16_t status, const void *body, uint32_t body_bytes,
		  uint64_t payload_bytes)
{
	static uint8_t msg[RDMX_MSG_MAX_BYTES];
	struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = fc->op,
				  .flags = PROTO_FLAG_REPLY, .status = status,
				  .body_bytes = body_bytes, .request_id = fc->request_id,
				  .payload_bytes = payload_bytes };

	proto_header_encode(&h, msg);
	memcpy(msg + PROTO_HEADER_BYTES, body, body_bytes);
	fc->busy = 0;
	if (rdmx_conn_send(fc->c, msg, PROTO_HEADER_BYTES + body_bytes)) {
		rdmx_conn_close(fc->c, "reply could not be sent");
		return;
	}
	/* Answer what queued up behind this one, until one starts a transfer. */
	while (fc->q_len && !fc->busy && rdmx_conn_state(fc->c) == RDMX_CONN_ESTABLISHED) {
		static uint8_t m[RDMX_MSG_MAX_BYTES];
		size_t n = fc->q_bytes[0];

		memcpy(m, fc->q[0], n);
		fc->q_len--;
		memmove(fc->q[0], fc->q[1], (size_t)fc->q_len * RDMX_MSG_MAX_BYTES);
		memmove(&fc->q_bytes[0], &fc->q_bytes[1], (size_t)fc->q_len * sizeof(size_t));
		handle(fc, m, n);
	}
}

/* Reply with the per-entry results of the request in progress. */
static void reply_results(struct frs_conn *fc)
{
	static uint8_t body[PROTO_BATCH_PREFIX_BYTES + FRS_MAX_DESCS * PROTO_RESULT_ENTRY_BYTES];
	uint64_t payload = 0;

	proto_batch_encode_prefix(body, fc->count, 0);
	for (uint32_t i = 0; i < fc->count; i++) {
		proto_result_encode(body, i, &fc->res[i]);
		if (fc->op == PROTO_OP_GET && fc->res[i].status == PROTO_STATUS_OK)
			payload += fc->res[i].length;
	}
	reply(fc, PROTO_STATUS_OK, body,
	      (uint32_t)proto_batch_body_bytes(fc->count, PROTO_RESULT_ENTRY_BYTES), payload);
}

static struct frs_block *find(struct fake_rdma_server *fs, const uint8_t *key)
{
	for (int i = 0; i < fs->n_blocks; i++)
		if (!memcmp(fs->blocks[i].key, key, PROTO_KEY_BYTES))
			return &fs->blocks[i];
	return NULL;
}

static void note_desc(struct fake_rdma_server *fs, const struct rdmx_desc *d)
{
	int n = atomic_fetch_add(&fs->n_desc, 1);

	if (n < FRS_MAX_DESCS)
		fs->desc_addr[n] = d->addr;
}

/* PUT: room in the arena for every block, then one READ of them all. */
static void on_put(struct frs_conn *fc, const struct proto_batch *b, const uint8_t *descs)
{
	struct fake_rdma_server *fs = fc->fs;
	uint64_t total = 0;
	struct rdmx_desc d;

	for (uint32_t i = 0; i < b->count; i++) {
		assert_int_equal(proto_put_entry_decode(b, i, &fc->put[i]), 0);
		total += fc->put[i].length;
	}
	if (fs->arena_used + total > FRS_ARENA_BYTES) { /* start the arena over */
		fs->arena_used = 0;
		fs->n_blocks = 0;
	}
	for (uint32_t i = 0; i < b->count; i++) {
		rdmx_desc_decode(descs + i * RDMX_DESC_BYTES, &d);
		note_desc(fs, &d);
		assert_int_equal(d.length, fc->put[i].length);
		fc->off[i] = fs->arena_used;
		fs->arena_used += d.length;
		fc->items[i] = (struct rdmx_xfer_item){ fs->arena + fc->off[i], d.length, d.addr,
							d.rkey };
	}
	atomic_fetch_add(&fs->put_blocks, (int)b->count);
	if (rdmx_conn_xfer(fc->c, RDMX_XFER_READ, fc->items, b->count))
		rdmx_conn_close(fc->c, "read could not start");
}

/* PUT after its READ: check each block and store it. */
static void put_done(struct frs_conn *fc)
{
	struct fake_rdma_server *fs = fc->fs;

	for (uint32_t i = 0; i < fc->count; i++) {
		const struct proto_put_entry *e = &fc->put[i];
		uint64_t sum = XXH3_64bits(fs->arena + fc->off[i], e->length);
		struct frs_block *blk = find(fs, e->key);

		atomic_fetch_add(&fs->read_bytes, e->length);
		fc->res[i] = (struct proto_result){ .status = PROTO_STATUS_BAD_CHECKSUM };
		if (sum != e->checksum)
			continue;
		if (!blk && fs->n_blocks < FRS_MAX_BLOCKS)
			blk = &fs->blocks[fs->n_blocks++];
		if (!blk)
			continue;
		*blk = (struct frs_block){ .off = fc->off[i], .len = e->length, .checksum = sum };
		memcpy(blk->key, e->key, PROTO_KEY_BYTES);
		fc->res[i] = (struct proto_result){ .status = PROTO_STATUS_OK,
						    .tier = PROTO_TIER_DRAM, .length = e->length,
						    .checksum = sum };
	}
	reply_results(fc);
}

/* GET: one WRITE of every block found, the reply once it completed. */
static void on_get(struct frs_conn *fc, const struct proto_batch *b, const uint8_t *descs)
{
	struct fake_rdma_server *fs = fc->fs;
	struct proto_get_entry e;
	struct rdmx_desc d;
	uint32_t n = 0;

	for (uint32_t i = 0; i < b->count; i++) {
		struct frs_block *blk;

		proto_get_entry_decode(b, i, &e);
		rdmx_desc_decode(descs + i * RDMX_DESC_BYTES, &d);
		note_desc(fs, &d);
		assert_int_equal(d.length, e.max_length);
		blk = find(fs, e.key);
		fc->res[i] = (struct proto_result){ .status = PROTO_STATUS_NOT_FOUND };
		if (!blk)
			continue;
		if (blk->len > d.length) {
			fc->res[i] = (struct proto_result){ .status = PROTO_STATUS_TOO_LARGE,
							    .length = blk->len };
			continue;
		}
		fc->res[i] = (struct proto_result){ .status = PROTO_STATUS_OK,
						    .tier = PROTO_TIER_DRAM, .length = blk->len,
						    .checksum = blk->checksum ^ (fs->corrupt_get ? 1 : 0) };
		fc->items[n++] = (struct rdmx_xfer_item){ fs->arena + blk->off, (uint32_t)blk->len,
							  d.addr, d.rkey };
		atomic_fetch_add(&fs->write_bytes, blk->len);
	}
	atomic_fetch_add(&fs->get_blocks, (int)b->count);
	if (n == 0)
		reply_results(fc);
	else if (rdmx_conn_xfer(fc->c, RDMX_XFER_WRITE, fc->items, n))
		rdmx_conn_close(fc->c, "write could not start");
}

static void on_hello(struct frs_conn *fc, const uint8_t *body, uint32_t body_bytes)
{
	uint8_t out[PROTO_HELLO_REPLY_BYTES];
	struct proto_hello h;

	assert_int_equal(proto_hello_decode(body, body_bytes, &h), 0);
	memcpy(fc->fs->hello_ns, h.ns, h.ns_len);
	fc->fs->hello_ns[h.ns_len] = '\0';
	proto_hello_reply_encode(&fc->fs->limits, out);
	reply(fc, PROTO_STATUS_OK, out, sizeof(out), 0);
}

/* A request message: queue it behind the one being answered, if any. */
static void on_msg(struct rdmx_conn *c, const uint8_t *msg, size_t bytes, void *arg)
{
	struct frs_conn *fc = arg;
	int q;

	(void)c;
	if (!fc->busy) {
		handle(fc, msg, bytes);
		return;
	}
	assert_true(fc->q_len < (int)RDMX_MSG_DEPTH);
	memcpy(fc->q[fc->q_len], msg, bytes);
	fc->q_bytes[fc->q_len++] = bytes;
	q = atomic_load(&fc->fs->max_queued);
	if (fc->q_len > q)
		atomic_store(&fc->fs->max_queued, fc->q_len);
}

/* Answer one request: decode with proto/, dispatch on the opcode. */
static void handle(struct frs_conn *fc, const uint8_t *msg, size_t bytes)
{
	struct rdmx_conn *c = fc->c;
	struct proto_limits lim = limits_of(fc->fs);
	struct proto_header h;
	struct proto_batch b;
	const uint8_t *descs;

	assert_true(bytes >= PROTO_HEADER_BYTES);
	assert_int_equal(proto_header_decode(msg, 0, &lim, &h), 0);
	atomic_fetch_add(&fc->fs->msgs[h.opcode], 1);
	fc->op = h.opcode;
	fc->request_id = h.request_id;
	fc->busy = 1;
	if (h.opcode == PROTO_OP_HELLO) {
		on_hello(fc, msg + PROTO_HEADER_BYTES, h.body_bytes);
		return;
	}
	if (h.opcode != PROTO_OP_PUT && h.opcode != PROTO_OP_GET) {
		reply(fc, PROTO_STATUS_UNSUPPORTED, NULL, 0, 0);
		return;
	}
	if (fc->fs->silent)
		return; /* busy for good: later requests queue behind it */
	if (atomic_exchange(&fc->fs->drop_next, 0)) {
		rdmx_conn_close(c, "dropped by the test");
		return;
	}
	assert_int_equal(proto_batch_decode(msg + PROTO_HEADER_BYTES, h.body_bytes,
					    proto_request_entry_bytes(h.opcode), &lim, &b), 0);
	assert_int_equal(rdmx_msg_descs(msg, bytes, &h, b.count, &descs), 0);
	fc->count = b.count;
	if (h.opcode == PROTO_OP_PUT)
		on_put(fc, &b, descs);
	else
		on_get(fc, &b, descs);
}

static void on_xfer_done(struct rdmx_conn *c, int status, void *arg)
{
	struct frs_conn *fc = arg;

	(void)c;
	assert_int_equal(status, 0); /* failures come through on_close */
	if (fc->op == PROTO_OP_PUT)
		put_done(fc);
	else
		reply_results(fc);
}

static void on_close(struct rdmx_conn *c, const char *reason, void *arg)
{
	struct frs_conn *fc = arg;

	(void)c;
	(void)reason;
	atomic_fetch_add(&fc->fs->closed, 1);
	fc->fs->conns[fc->slot] = NULL;
	free(fc);
}

static const struct rdmx_conn_cbs frs_cbs = { on_msg, on_xfer_done, on_close };

/* Accept a connection request into a free slot (refuse it when full). */
static void take(struct fake_rdma_server *fs, void *req)
{
	struct frs_conn *fc = calloc(1, sizeof(*fc));
	int slot = 0;

	while (slot < FRS_MAX_CONNS && fs->conns[slot])
		slot++;
	if (!fc || slot == FRS_MAX_CONNS) {
		free(fc);
		rdmx_listener_refuse(fs->l, req);
		return;
	}
	fc->fs = fs;
	fc->slot = slot;
	if (rdmx_conn_accept(fs->w, req, &frs_cbs, fc, &fc->c)) {
		free(fc);
		return;
	}
	fs->conns[slot] = fc;
	atomic_fetch_add(&fs->accepted, 1);
}

static void *serve(void *arg)
{
	struct fake_rdma_server *fs = arg;
	void *req;

	while (!fs->stop) {
		while (rdmx_listener_take(fs->l, &req) == 1)
			take(fs, req);
		rdmx_worker_cm_events(fs->w);
		if (atomic_exchange(&fs->drop_idle, 0))
			for (int i = 0; i < FRS_MAX_CONNS; i++)
				if (fs->conns[i])
					rdmx_conn_close(fs->conns[i]->c, "dropped by the test");
		for (int i = 0; i < FRS_MAX_CONNS; i++)
			if (fs->conns[i])
				rdmx_conn_completions(fs->conns[i]->c);
		usleep(100);
	}
	return NULL;
}

void frs_start(struct fake_rdma_server *fs)
{
	struct rdmx_listener_config cfg = { .listen = "127.0.0.1", .port = fs->port,
					    .ops = &fake_verbs_ops };
	char why[RDMX_REASON_BYTES];

	fs->arena = calloc(1, FRS_ARENA_BYTES);
	assert_non_null(fs->arena);
	cfg.arena = fs->arena;
	cfg.arena_bytes = FRS_ARENA_BYTES;
	assert_int_equal(rdmx_listener_open(&cfg, &fs->l, why, sizeof(why)), 0);
	assert_int_equal(rdmx_worker_open(fs->l, &fs->w), 0);
	fs->stop = 0;
	assert_int_equal(pthread_create(&fs->thr, NULL, serve, fs), 0);
}

void frs_stop(struct fake_rdma_server *fs)
{
	fs->stop = 1;
	pthread_join(fs->thr, NULL);
	for (int i = 0; i < FRS_MAX_CONNS; i++)
		if (fs->conns[i])
			rdmx_conn_close(fs->conns[i]->c, "server stops");
	rdmx_worker_close(fs->w);
	rdmx_listener_close(fs->l);
	free(fs->arena);
	fs->arena = NULL;
}

int frs_has(const struct fake_rdma_server *fs, const uint8_t key[PROTO_KEY_BYTES],
	    const void *data, uint64_t len)
{
	for (int i = 0; i < fs->n_blocks; i++)
		if (!memcmp(fs->blocks[i].key, key, PROTO_KEY_BYTES))
			return fs->blocks[i].len == len &&
			       !memcmp(fs->arena + fs->blocks[i].off, data, len);
	return 0;
}

#endif /* KVPOOL_RDMA */
