/*
 * fake_server.c - a small fake kvpoold for unit tests (see fake_server.h).
 */
#include "fake_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

const struct proto_hello_reply fake_default_limits = {
	.version = 1,
	.max_batch_blocks = 4,
	.max_block_bytes = 64 * 1024,
	.max_frame_bytes = 64 * 1024,
	.max_lease_ms = 5000,
	.max_inflight_put_bytes = 0,
};

struct frame {
	struct proto_header h;
	uint8_t *body;
	uint8_t *payload;
};

/* The header version of the replies the serving thread sends: the one of
 * the request being answered (1 before and for HELLO). */
static __thread uint8_t reply_version = PROTO_VERSION;

static int read_full(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t r = read(fd, p, n);

		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t r = send(fd, p, n, MSG_NOSIGNAL);

		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static void frame_free(struct frame *f)
{
	free(f->body);
	free(f->payload);
	f->body = f->payload = NULL;
}

/* Read one request frame; -1 on EOF or garbage. */
static int read_frame(int fd, struct frame *f)
{
	uint8_t hdr[PROTO_HEADER_BYTES];

	memset(f, 0, sizeof(*f));
	if (read_full(fd, hdr, sizeof(hdr)) || proto_header_decode(hdr, 0, NULL, &f->h))
		return -1;
	f->body = malloc(f->h.body_bytes + 1);
	f->payload = malloc(f->h.payload_bytes + 1);
	if (!f->body || !f->payload || read_full(fd, f->body, f->h.body_bytes) ||
	    read_full(fd, f->payload, f->h.payload_bytes)) {
		frame_free(f);
		return -1;
	}
	return 0;
}

static int send_reply(int fd, uint8_t op, uint64_t id, uint16_t status, const void *body,
		      size_t body_bytes, const void *payload, uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = reply_version,
		.opcode = op,
		.flags = PROTO_FLAG_REPLY,
		.status = status,
		.body_bytes = (uint32_t)body_bytes,
		.request_id = id,
		.payload_bytes = payload_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];

	proto_header_encode(&h, hdr);
	if (write_full(fd, hdr, sizeof(hdr)) || write_full(fd, body, body_bytes))
		return -1;
	return write_full(fd, payload, payload_bytes);
}

static int send_error(int fd, uint8_t op, uint64_t id, uint16_t status, const char *msg)
{
	uint8_t body[PROTO_ERROR_FIXED_BYTES + 256];
	size_t n = proto_error_body_bytes(strlen(msg));

	if (proto_error_encode(msg, strlen(msg), body, sizeof(body)))
		return -1;
	return send_reply(fd, op, id, status, body, n, NULL, 0);
}

/* The block stored under key, or NULL. Called with fk->lock held. */
static struct fake_block *fake_find(struct fake *fk, const uint8_t *key)
{
	for (int i = 0; i < fk->n_blocks; i++)
		if (memcmp(fk->blocks[i].key, key, PROTO_KEY_BYTES) == 0)
			return &fk->blocks[i];
	return NULL;
}

static uint64_t reply_id(struct fake *fk, const struct frame *f)
{
	return atomic_load(&fk->mode) == MODE_WRONG_ID ? f->h.request_id + 1 : f->h.request_id;
}

/* Store one PUT block unless present; returns its result status. Called
 * with fk->lock held. */
static uint16_t fake_store(struct fake *fk, const struct proto_put_entry *e, const uint8_t *data)
{
	struct fake_block *b;
	int busy = atomic_load(&fk->busy_puts);

	if (XXH3_64bits(data, e->length) != e->checksum)
		return PROTO_STATUS_BAD_CHECKSUM;
	if (fake_find(fk, e->key))
		return PROTO_STATUS_EXISTS;
	if (atomic_load(&fk->check_parents) && (e->flags & PROTO_PUT_HAS_PARENT) &&
	    !fake_find(fk, e->parent))
		return PROTO_STATUS_NO_PARENT;
	if (busy > 0) {
		atomic_store(&fk->busy_puts, busy - 1);
		return PROTO_STATUS_BUSY;
	}
	if (fk->n_blocks == FAKE_MAX_BLOCKS)
		return PROTO_STATUS_FULL;
	b = &fk->blocks[fk->n_blocks++];
	memcpy(b->key, e->key, PROTO_KEY_BYTES);
	b->data = malloc(e->length);
	memcpy(b->data, data, e->length);
	b->len = e->length;
	return PROTO_STATUS_OK;
}

/* Decode a PUT and store its blocks; *out receives the results body. */
static int put_results(struct fake *fk, const struct frame *f, uint8_t **out, size_t *out_bytes)
{
	struct proto_batch b;
	uint64_t off = 0;
	uint8_t *res;

	if (proto_batch_decode_v(f->body, f->h.body_bytes, PROTO_PUT_ENTRY_BYTES, f->h.version, NULL,
				 &b))
		return -1;
	*out_bytes = proto_batch_body_bytes(b.count, PROTO_RESULT_ENTRY_BYTES);
	res = calloc(1, *out_bytes);
	proto_batch_encode_prefix(res, b.count, 0);
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_put_entry e;
		struct proto_result r = { .tier = PROTO_TIER_DRAM };

		if (proto_put_entry_decode(&b, i, &e) || off + e.length > f->h.payload_bytes) {
			free(res);
			return -1;
		}
		r.status = fake_store(fk, &e, f->payload + off);
		if (atomic_load(&fk->mode) == MODE_STATUSES)
			r.status = fk->status_table[fk->status_next++ % fk->n_status];
		r.length = e.length;
		r.checksum = e.checksum;
		fk->last_put_retain_ms = e.retain_ms;
		if (r.status == PROTO_STATUS_OK || r.status == PROTO_STATUS_EXISTS) {
			r.flags = fk->put_flags;
			r.retain_ms = fk->put_retain_ms;
		}
		proto_result_encode_v(res, i, f->h.version, &r);
		off += e.length;
		atomic_fetch_add(&fk->put_blocks, 1);
	}
	*out = res;
	return 0;
}

static int handle_put(struct fake *fk, int fd, const struct frame *f)
{
	size_t out_bytes = 0;
	uint8_t *out = NULL;
	int rc;

	pthread_mutex_lock(&fk->lock);
	rc = put_results(fk, f, &out, &out_bytes);
	pthread_mutex_unlock(&fk->lock);
	if (rc)
		return -1;
	rc = send_reply(fd, PROTO_OP_PUT, reply_id(fk, f), PROTO_STATUS_OK, out, out_bytes, NULL, 0);
	free(out);
	return rc;
}

/* Results and payload of a GET, built under the lock. As the real server
 * does, a block too large for the buffer is answered TOO_LARGE with its
 * length. */
static void get_results(struct fake *fk, const struct proto_batch *b, uint8_t *out,
			uint8_t *payload, uint64_t *total)
{
	*total = 0;
	for (uint32_t i = 0; i < b->count; i++) {
		struct proto_result r = { .status = PROTO_STATUS_NOT_FOUND };
		struct proto_get_entry e;
		struct fake_block *blk;

		proto_get_entry_decode(b, i, &e);
		blk = fake_find(fk, e.key);
		if (blk)
			atomic_fetch_add(&fk->get_hits, 1);
		if (blk && (blk->len > e.max_length ||
			    atomic_load(&fk->mode) == MODE_GET_TOO_LARGE)) {
			r = (struct proto_result){ .status = PROTO_STATUS_TOO_LARGE,
						   .tier = PROTO_TIER_DRAM, .length = blk->len };
		} else if (blk) {
			r = (struct proto_result){ .status = PROTO_STATUS_OK, .tier = PROTO_TIER_DRAM,
						   .length = blk->len,
						   .checksum = XXH3_64bits(blk->data, blk->len) };
			memcpy(payload + *total, blk->data, blk->len);
			*total += blk->len;
		}
		proto_result_encode(out, i, &r);
	}
}

/* The payload bytes a GET can need: every found block that fits. */
static uint64_t get_payload_cap(struct fake *fk, const struct proto_batch *b)
{
	uint64_t cap = 1;

	for (uint32_t i = 0; i < b->count; i++) {
		struct proto_get_entry e;
		struct fake_block *blk;

		proto_get_entry_decode(b, i, &e);
		blk = fake_find(fk, e.key);
		if (blk)
			cap += blk->len;
	}
	return cap;
}

/* Send a GET reply whose payload stops half way, as a server that died. */
static void send_truncated_get(int fd, const struct frame *f, const uint8_t *out,
			       uint32_t body_bytes, const uint8_t *payload, uint64_t total)
{
	struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION,
				  .opcode = PROTO_OP_GET, .flags = PROTO_FLAG_REPLY,
				  .body_bytes = body_bytes, .request_id = f->h.request_id,
				  .payload_bytes = total };
	uint8_t hdr[PROTO_HEADER_BYTES];

	proto_header_encode(&h, hdr);
	write_full(fd, hdr, sizeof(hdr));
	write_full(fd, out, body_bytes);
	write_full(fd, payload, total / 2);
}

/* Answer a GET; modes may corrupt or truncate the payload. */
static int handle_get(struct fake *fk, int fd, const struct frame *f)
{
	int mode = atomic_load(&fk->mode);
	uint8_t *out, *payload;
	uint64_t total = 0;
	uint32_t body_bytes;
	struct proto_batch b;
	int rc;

	if (proto_batch_decode(f->body, f->h.body_bytes, PROTO_GET_ENTRY_BYTES, NULL, &b))
		return -1;
	body_bytes = (uint32_t)proto_batch_body_bytes(b.count, PROTO_RESULT_ENTRY_BYTES);
	out = calloc(1, body_bytes);
	proto_batch_encode_prefix(out, b.count, 0);
	pthread_mutex_lock(&fk->lock);
	payload = malloc(get_payload_cap(fk, &b));
	get_results(fk, &b, out, payload, &total);
	pthread_mutex_unlock(&fk->lock);
	if (mode == MODE_CORRUPT_GET && total)
		payload[0] ^= 0x01;
	if (mode == MODE_TRUNCATE_GET) {
		send_truncated_get(fd, f, out, body_bytes, payload, total);
		rc = -1; /* then close */
	} else {
		rc = send_reply(fd, PROTO_OP_GET, reply_id(fk, f), PROTO_STATUS_OK, out, body_bytes,
				payload, total);
	}
	free(out);
	free(payload);
	return rc;
}

/* EXISTS and DELETE: one result per key. */
static int handle_keys(struct fake *fk, int fd, const struct frame *f)
{
	struct proto_batch b;
	uint8_t *out;
	int rc;

	if (proto_batch_decode(f->body, f->h.body_bytes, PROTO_KEY_ENTRY_BYTES, NULL, &b))
		return -1;
	out = calloc(1, proto_batch_body_bytes(b.count, PROTO_RESULT_ENTRY_BYTES));
	proto_batch_encode_prefix(out, b.count, 0);
	pthread_mutex_lock(&fk->lock);
	for (uint32_t i = 0; i < b.count; i++) {
		struct fake_block *blk = fake_find(fk, proto_key_entry(&b, i));
		struct proto_result r = { .status = blk ? PROTO_STATUS_OK : PROTO_STATUS_NOT_FOUND };

		if (blk) {
			r.tier = PROTO_TIER_DRAM;
			r.length = blk->len;
		}
		if (f->h.opcode == PROTO_OP_EXISTS && atomic_load(&fk->mode) == MODE_STATUSES)
			r.status = fk->status_table[fk->status_next++ % fk->n_status];
		if (blk && f->h.opcode == PROTO_OP_DELETE) {
			free(blk->data);
			*blk = fk->blocks[--fk->n_blocks];
		}
		proto_result_encode(out, i, &r);
	}
	pthread_mutex_unlock(&fk->lock);
	rc = send_reply(fd, f->h.opcode, reply_id(fk, f), PROTO_STATUS_OK, out,
			proto_batch_body_bytes(b.count, PROTO_RESULT_ENTRY_BYTES), NULL, 0);
	free(out);
	return rc;
}

static int handle_match(struct fake *fk, int fd, const struct frame *f)
{
	uint8_t out[PROTO_MATCH_REPLY_MAX_BYTES];
	struct proto_match_reply r;
	struct proto_match_req q;
	uint32_t m = 0;

	if (proto_match_decode(f->body, f->h.body_bytes, f->h.version, NULL, &q))
		return send_error(fd, PROTO_OP_MATCH, f->h.request_id, PROTO_STATUS_BAD_REQUEST,
				  "malformed MATCH");
	pthread_mutex_lock(&fk->lock);
	while (m < q.keys.count && fake_find(fk, proto_key_entry(&q.keys, m)))
		m++;
	fk->last_match_version = f->h.version;
	fk->last_match_count = q.keys.count;
	fk->last_match_opts = q.opts;
	fk->last_match_lease_ms = q.lease_ms;
	r = (struct proto_match_reply){ .matched = m, .lease_ms = m ? q.lease_ms : 0, .present = m };
	if (f->h.version >= PROTO_VERSION_2) {
		/* a configured LEASE_CUT shortens what was present */
		uint32_t cut = fk->match_cut < m ? fk->match_cut : m;

		r.flags = fk->match_v2.flags;
		r.matched = m - cut;
		r.lease_ms = r.matched ? q.lease_ms : 0;
		r.retained = fk->match_v2.retained < m ? fk->match_v2.retained : m;
		r.retain_ms = r.retained ? fk->match_v2.retain_ms : 0;
	}
	pthread_mutex_unlock(&fk->lock);
	proto_match_reply_encode_v(f->h.version, &r, out);
	return send_reply(fd, PROTO_OP_MATCH, reply_id(fk, f), PROTO_STATUS_OK, out,
			  proto_match_reply_bytes(f->h.version), NULL, 0);
}

static int handle_hello(struct fake *fk, int fd, const struct frame *f)
{
	uint8_t out[PROTO_HELLO_REPLY_MAX_BYTES];
	struct proto_hello_reply r;
	struct proto_hello h;
	int mode = atomic_load(&fk->mode);

	if (proto_hello_decode(f->body, f->h.body_bytes, &h))
		return -1;
	pthread_mutex_lock(&fk->lock);
	memcpy(fk->hello_ns, h.ns, h.ns_len);
	fk->hello_ns[h.ns_len] = '\0';
	snprintf(fk->hello_token, sizeof(fk->hello_token), "%.*s", (int)h.token_len,
		 h.token ? h.token : "");
	pthread_mutex_unlock(&fk->lock);
	if (mode == MODE_HELLO_DENIED)
		return send_error(fd, PROTO_OP_HELLO, f->h.request_id, PROTO_STATUS_DENIED,
				  "token does not allow this namespace");
	if (mode == MODE_HELLO_OLD) {
		send_error(fd, PROTO_OP_HELLO, f->h.request_id, PROTO_STATUS_UNSUPPORTED,
			   "protocol version not supported");
		return -1;
	}
	/* the highest version both speak (a v1 fake: 1) */
	r = fk->limits;
	if (h.max_version < r.version)
		r.version = h.max_version;
	proto_hello_reply_encode(&r, out);
	return send_reply(fd, PROTO_OP_HELLO, f->h.request_id, PROTO_STATUS_OK, out,
			  proto_hello_reply_bytes(r.version), NULL, 0);
}

/* Drop every block (the fake has one store for all namespaces). */
static int handle_drop(struct fake *fk, int fd, const struct frame *f)
{
	uint8_t drop[PROTO_DROP_REPLY_BYTES];
	uint64_t bytes = 0;

	pthread_mutex_lock(&fk->lock);
	for (int i = 0; i < fk->n_blocks; i++) {
		bytes += fk->blocks[i].len;
		free(fk->blocks[i].data);
	}
	proto_drop_reply_encode((uint64_t)fk->n_blocks, bytes, drop);
	fk->n_blocks = 0;
	pthread_mutex_unlock(&fk->lock);
	return send_reply(fd, PROTO_OP_DROP_NAMESPACE, reply_id(fk, f), PROTO_STATUS_OK, drop,
			  sizeof(drop), NULL, 0);
}

/* A STATS document with the few keys the clients read: evictions, the
 * DRAM capacity, MATCH latency (fixed), and blocks and get_hits of the
 * namespace asked for (or of the last HELLO). */
static int handle_stats(struct fake *fk, int fd, const struct frame *f)
{
	const char *name = NULL;
	uint16_t name_len = 0;
	char doc[768];
	int n;

	pthread_mutex_lock(&fk->lock);
	if (proto_name_decode(f->body, f->h.body_bytes, &name, &name_len) || !name_len) {
		name = fk->hello_ns;
		name_len = (uint16_t)strlen(fk->hello_ns);
	}
	n = snprintf(doc, sizeof(doc), "{\"version\":\"0.1.0\",\"protocol\":1,\"evictions\":0,"
		     "\"tiers\":{\"dram\":{\"capacity_bytes\":%d}},"
		     "\"latency_us\":{\"match\":{\"p50\":1,\"p99\":2,\"p999\":3}},"
		     "\"namespaces\":{\"%.*s\":{\"blocks\":%d,\"get_hits\":%d}}}",
		     FAKE_CAPACITY_BYTES, (int)name_len,
		     name, fk->n_blocks, atomic_load(&fk->get_hits));
	pthread_mutex_unlock(&fk->lock);
	return send_reply(fd, PROTO_OP_STATS, reply_id(fk, f), PROTO_STATUS_OK, doc, (size_t)n,
			  NULL, 0);
}

/* Answer one request; -1 closes the connection. */
static int fake_handle(struct fake *fk, int fd, const struct frame *f)
{
	int mode = atomic_load(&fk->mode);

	atomic_fetch_add(&fk->frames[f->h.opcode], 1);
	reply_version = f->h.opcode == PROTO_OP_HELLO ? PROTO_VERSION : f->h.version;
	if (f->h.opcode == PROTO_OP_HELLO)
		return handle_hello(fk, fd, f);
	if (mode == MODE_SILENT)
		return 0;
	if (mode == MODE_CLOSE) {
		atomic_store(&fk->mode, MODE_NORMAL);
		return -1;
	}
	if (mode == MODE_REFUSE && proto_request_entry_bytes(f->h.opcode))
		return send_error(fd, f->h.opcode, f->h.request_id, PROTO_STATUS_BUSY,
				  FAKE_BUSY_MESSAGE);
	if (proto_request_entry_bytes(f->h.opcode) && atomic_load(&fk->refuse_next) > 0) {
		atomic_fetch_sub(&fk->refuse_next, 1);
		return send_error(fd, f->h.opcode, f->h.request_id, PROTO_STATUS_BUSY,
				  FAKE_BUSY_MESSAGE);
	}
	switch (f->h.opcode) {
	case PROTO_OP_PUT:
		return handle_put(fk, fd, f);
	case PROTO_OP_GET:
		return handle_get(fk, fd, f);
	case PROTO_OP_EXISTS:
	case PROTO_OP_DELETE:
		return handle_keys(fk, fd, f);
	case PROTO_OP_MATCH:
		return handle_match(fk, fd, f);
	case PROTO_OP_DROP_NAMESPACE:
		return handle_drop(fk, fd, f);
	case PROTO_OP_STATS:
		return handle_stats(fk, fd, f);
	default:
		return send_reply(fd, f->h.opcode, reply_id(fk, f), PROTO_STATUS_OK, NULL, 0, NULL, 0);
	}
}

/* Serve one connection until EOF or a handler asks to close. */
static void fake_serve(struct fake *fk, int fd)
{
	struct frame held[FAKE_MAX_HOLD];
	int n_held = 0, rc = 0;

	while (rc == 0) {
		struct frame f;

		if (read_frame(fd, &f))
			break;
		int mode = atomic_load(&fk->mode);

		if ((mode == MODE_HOLD || mode == MODE_HOLD_REVERSE) && f.h.opcode != PROTO_OP_HELLO) {
			held[n_held++] = f;
			if (n_held < fk->hold)
				continue;
			for (int i = 0; i < n_held; i++) {
				struct frame *h = &held[mode == MODE_HOLD_REVERSE ? n_held - 1 - i : i];

				if (rc == 0)
					rc = fake_handle(fk, fd, h);
			}
			for (int i = 0; i < n_held; i++)
				frame_free(&held[i]);
			n_held = 0;
			continue;
		}
		rc = fake_handle(fk, fd, &f);
		frame_free(&f);
	}
	for (int i = 0; i < n_held; i++)
		frame_free(&held[i]);
}

/* A connection's thread: serve it, then close it under the lock so that
 * fake_stop never shuts down a descriptor number already reused. */
static void *conn_main(void *arg)
{
	struct fake_conn *fc = arg;
	struct fake *fk = fc->fk;

	/* As kvpoold at its connection limit: a connection-level BUSY reply,
	 * then close. The HELLO is read first, so that closing does not
	 * reset the connection before the client has read the reply. */
	if (atomic_load(&fk->busy_connects) > 0) {
		struct frame f;

		atomic_fetch_sub(&fk->busy_connects, 1);
		if (read_frame(fc->fd, &f) == 0)
			frame_free(&f);
		send_error(fc->fd, PROTO_OP_NONE, 0, PROTO_STATUS_BUSY, "max_connections reached");
	} else {
		fake_serve(fk, fc->fd);
	}
	pthread_mutex_lock(&fk->lock);
	close(fc->fd);
	fc->fd = -1;
	pthread_mutex_unlock(&fk->lock);
	return NULL;
}

/* Accept connections, one thread each, until the listener is shut down. */
static void *accept_main(void *arg)
{
	struct fake *fk = arg;
	int one = 1;

	for (;;) {
		int fd = accept(fk->lfd, NULL, NULL);
		struct fake_conn *fc;

		if (fd < 0)
			break;
		/* Replies go out in several writes: do not let Nagle hold them. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pthread_mutex_lock(&fk->lock);
		if (fk->n_conns == FAKE_MAX_CONNS) {
			pthread_mutex_unlock(&fk->lock);
			close(fd);
			continue;
		}
		fc = &fk->conns[fk->n_conns];
		*fc = (struct fake_conn){ .fk = fk, .fd = fd };
		if (pthread_create(&fc->thr, NULL, conn_main, fc)) {
			close(fd);
		} else {
			fk->n_conns++;
			atomic_fetch_add(&fk->connections, 1);
		}
		pthread_mutex_unlock(&fk->lock);
	}
	return NULL;
}

void fake_start(struct fake *fk, uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int one = 1;

	pthread_mutex_init(&fk->lock, NULL);
	fk->n_conns = 0;
	fk->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fk->lfd >= 0);
	setsockopt(fk->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	assert_int_equal(bind(fk->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fk->lfd, 16), 0);
	assert_int_equal(getsockname(fk->lfd, (struct sockaddr *)&sa, &len), 0);
	fk->port = ntohs(sa.sin_port);
	assert_int_equal(pthread_create(&fk->thr, NULL, accept_main, fk), 0);
}

void fake_stop(struct fake *fk)
{
	shutdown(fk->lfd, SHUT_RDWR);
	pthread_join(fk->thr, NULL);
	close(fk->lfd);
	fk->lfd = -1;
	pthread_mutex_lock(&fk->lock);
	for (int i = 0; i < fk->n_conns; i++)
		if (fk->conns[i].fd >= 0)
			shutdown(fk->conns[i].fd, SHUT_RDWR);
	pthread_mutex_unlock(&fk->lock);
	for (int i = 0; i < fk->n_conns; i++)
		pthread_join(fk->conns[i].thr, NULL);
	fk->n_conns = 0;
	pthread_mutex_destroy(&fk->lock);
}

void fake_release(struct fake *fk)
{
	for (int i = 0; i < fk->n_blocks; i++)
		free(fk->blocks[i].data);
	fk->n_blocks = 0;
}
