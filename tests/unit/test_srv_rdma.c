/*
 * test_srv_rdma.c - kvpoold serving requests over RDMA, in process: the
 * server (srv_run) runs on a thread with srv_rdma_test_ops set to the
 * loopback fake fabric (fake_verbs.h), and a raw client made of
 * rdmx_client_connect / reg / call sends protocol frames with their
 * remote-buffer descriptors (PROTOCOL.md section 13). Covers HELLO's
 * rdma_port, PUT by RDMA READ and GET by RDMA WRITE byte for byte, failed
 * READs and WRITEs (nothing visible, reservations and pins released,
 * other connections served), malformed messages, and a client leaving in
 * the middle of a READ, more than RDMX_MSG_DEPTH requests outstanding, and
 * messages that do not decode as a header. In an RDMA=0 build there is nothing to run.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "rdmx.h"

#ifndef KVPOOL_RDMA

static void test_not_built(void **state)
{
	(void)state;
	assert_false(rdmx_built());
	skip();
}

/* Nothing to serve without the transport: skipped as a whole (exit 77,
 * as tests/run.sh expects), unless the build claims RDMA after all. */
int main(void)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_not_built) };
	int failed = cmocka_run_group_tests(tests, NULL, NULL);

	return failed ? failed : 77;
}

#else /* KVPOOL_RDMA */

#include <xxhash.h>

#include "conf.h"
#include "fake_verbs.h"
#include "proto.h"
#include "srv_rdma.h"
#include "srv_server.h"

#define F fake_verbs
#define CALL_MS 3000
#define BIG_BYTES (1u << 20)
#define MAX_BATCH 128u /* entries per PUT/GET the helpers send */

static const struct proto_limits lim = {
	.max_frame_bytes = 1u << 30, .max_batch_blocks = 1u << 20, .max_block_bytes = 1ull << 40,
};

static pthread_t srv_thread;
static int srv_rc = -1;
static uint16_t tcp_port;
static uint64_t next_req_id = 1;

static void *srv_thread_main(void *arg)
{
	const struct conf *c = arg;

	srv_rc = srv_run(c, 0, NULL);
	return NULL;
}

/* A TCP port nobody listens on now (the kernel's pick). */
static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static char nvme_dir[64];
static uint32_t max_conns;        /* 0: the default */
static struct cli *leftover;      /* open while kvpoold shuts down */

/* Start kvpoold on a thread: TCP on a free port, no admin port, RDMA
 * through the loopback fake; with_nvme: a small DRAM tier over an NVMe
 * tier in a temporary directory, so that GETs wait for promotions. */
static int server_start(int with_nvme)
{
	static struct conf c;

	fake_verbs_reset();
	F.loopback = 1;
	srv_rdma_test_ops = &fake_verbs_ops;
	conf_defaults(&c);
	snprintf(c.listen, sizeof(c.listen), "127.0.0.1");
	tcp_port = free_port();
	if (!tcp_port)
		return -1;
	c.port = tcp_port;
	c.admin_port = 0;
	c.threads = 2;
	c.dram_capacity_bytes = 64ull << 20;
	c.log_level = SRV_LOG_ERROR;
	if (max_conns)
		c.max_connections = max_conns;
	if (with_nvme) {
		snprintf(nvme_dir, sizeof(nvme_dir), "/tmp/kvpool-srv-rdma-XXXXXX");
		if (!mkdtemp(nvme_dir))
			return -1;
		snprintf(c.nvme_dir, sizeof(c.nvme_dir), "%s", nvme_dir);
		c.dram_capacity_bytes = 8ull << 20;
		c.max_block_bytes = 256 << 10;
		c.nvme_capacity_bytes = 64ull << 20;
		c.nvme_segment_bytes = 2ull << 20;
		c.nvme_io_threads = 2;
	}
	if (pthread_create(&srv_thread, NULL, srv_thread_main, &c))
		return -1;
	return 0;
}

static int group_setup(void **state)
{
	(void)state;
	return server_start(0);
}

static int nvme_group_setup(void **state)
{
	(void)state;
	return server_start(1);
}

/* ---- a raw client ----------------------------------------------------- */

struct cli {
	struct rdmx_client *rc;
	struct rdmx_client_mr *mr;
	uint8_t *buf;          /* registered: PUT sources, GET destinations */
	size_t buf_bytes;
	uint8_t reply[RDMX_MSG_MAX_BYTES];
	size_t reply_bytes;
	struct proto_header rh; /* the last reply's header */
};

/* How long a test waits for kvpoold to start or to free a connection
 * slot: generous, since a loaded 2-core machine (builds, other suites)
 * can take seconds to fault the arena in and schedule the workers; the
 * integration harness waits as long. Passing tests never wait that long. */
#define STARTUP_WAIT_MS 30000

static uint64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Connect (retrying while kvpoold starts) and register buf_bytes. */
static void cli_open(struct cli *c, size_t buf_bytes)
{
	uint64_t end = mono_ms() + STARTUP_WAIT_MS;
	int rc = -1;

	memset(c, 0, sizeof(*c));
	while (rc && mono_ms() < end) {
		rc = rdmx_client_connect("127.0.0.1", RDMX_DEFAULT_PORT, 1000, &fake_verbs_ops,
					 &c->rc);
		if (rc)
			usleep(10000);
	}
	assert_int_equal(rc, 0);
	c->buf = calloc(1, buf_bytes);
	assert_non_null(c->buf);
	c->buf_bytes = buf_bytes;
	assert_int_equal(rdmx_client_reg(c->rc, c->buf, buf_bytes, &c->mr), 0);
}

static void cli_close(struct cli *c)
{
	rdmx_client_dereg(c->rc, c->mr);
	rdmx_client_close(c->rc);
	free(c->buf);
	c->rc = NULL;
}

/* Send one message: header (opcode, body, payload_bytes), then the body,
 * then n descriptors. Returns rdmx_client_call's result; the reply's
 * header is decoded into c->rh. */
static int cli_call(struct cli *c, uint8_t op, const uint8_t *body, uint32_t body_bytes,
		    uint64_t payload_bytes, const struct rdmx_desc *d, uint32_t n, size_t extra)
{
	static uint8_t msg[RDMX_MSG_MAX_BYTES];
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = op,
		.body_bytes = body_bytes, .request_id = next_req_id++, .payload_bytes = payload_bytes,
	};
	size_t len = PROTO_HEADER_BYTES + body_bytes;
	int rc;

	proto_header_encode(&h, msg);
	if (body_bytes)
		memcpy(msg + PROTO_HEADER_BYTES, body, body_bytes);
	for (uint32_t i = 0; i < n; i++, len += RDMX_DESC_BYTES)
		rdmx_desc_encode(&d[i], msg + len);
	memset(msg + len, 0, extra);
	len += extra;
	rc = rdmx_client_call(c->rc, msg, len, c->reply, sizeof(c->reply), &c->reply_bytes,
			      CALL_MS);
	if (rc == 0) {
		assert_true(c->reply_bytes >= PROTO_HEADER_BYTES);
		assert_int_equal(proto_header_decode(c->reply, 1, &lim, &c->rh), 0);
		assert_int_equal(c->rh.request_id, h.request_id);
		assert_int_equal(c->reply_bytes, PROTO_HEADER_BYTES + c->rh.body_bytes);
	}
	return rc;
}

static void cli_hello(struct cli *c, const char *ns, uint16_t *rdma_port)
{
	struct proto_hello h = { .min_version = 1, .max_version = 1, .ns = ns,
				 .ns_len = (uint16_t)strlen(ns) };
	struct proto_hello_reply r;
	uint8_t body[512];
	size_t n = proto_hello_body_bytes(&h);

	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	assert_int_equal(cli_call(c, PROTO_OP_HELLO, body, (uint32_t)n, 0, NULL, 0, 0), 0);
	assert_int_equal(c->rh.status, PROTO_STATUS_OK);
	assert_int_equal(proto_hello_reply_decode(c->reply + PROTO_HEADER_BYTES, c->rh.body_bytes,
						  &r), 0);
	if (rdma_port)
		*rdma_port = r.rdma_port;
}

/* Status of result i of the last reply (a batch of results). */
static uint16_t result_status(struct cli *c, uint32_t i, struct proto_result *out)
{
	struct proto_batch b;
	struct proto_result r;

	assert_int_equal(c->rh.status, PROTO_STATUS_OK);
	assert_int_equal(proto_batch_decode(c->reply + PROTO_HEADER_BYTES, c->rh.body_bytes,
					    PROTO_RESULT_ENTRY_BYTES, &lim, &b), 0);
	assert_true(i < b.count);
	assert_int_equal(proto_result_decode(&b, i, &r), 0);
	if (out)
		*out = r;
	return r.status;
}

static void key_of(uint8_t key[PROTO_KEY_BYTES], uint32_t seed)
{
	for (int i = 0; i < PROTO_KEY_BYTES; i++)
		key[i] = (uint8_t)(seed * 131 + i * 7 + 1);
}

/* Fill src[i] with a pattern of seed. */
static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed * 17 + (i >> 9));
}

/* PUT n blocks: block i is `len[i]` bytes at c->buf + off[i], key seed
 * keys[i]. desc_len_delta changes descriptor 0's length (0: right). */
static int cli_put(struct cli *c, uint32_t n, const uint32_t *keys, const size_t *off,
		   const uint32_t *len, int desc_len_delta, uint32_t rkey_xor)
{
	static uint8_t body[8 + MAX_BATCH * PROTO_PUT_ENTRY_BYTES];
	static struct rdmx_desc d[MAX_BATCH];
	uint64_t payload = 0;

	assert_true(n <= MAX_BATCH);
	proto_batch_encode_prefix(body, n, 0);
	for (uint32_t i = 0; i < n; i++) {
		struct proto_put_entry e = { .length = len[i] };

		key_of(e.key, keys[i]);
		e.checksum = XXH3_64bits(c->buf + off[i], len[i]);
		proto_put_entry_encode(body, i, &e);
		d[i] = (struct rdmx_desc){ (uint64_t)(uintptr_t)(c->buf + off[i]),
					   rdmx_client_mr_rkey(c->mr) ^ rkey_xor, len[i] };
		payload += len[i];
	}
	d[0].length = (uint32_t)((int)d[0].length + desc_len_delta);
	return cli_call(c, PROTO_OP_PUT, body, (uint32_t)proto_batch_body_bytes(n, PROTO_PUT_ENTRY_BYTES),
			payload, d, n, 0);
}

/* GET n blocks into c->buf + off[i], buffers of cap[i] bytes. */
static int cli_get(struct cli *c, uint32_t n, const uint32_t *keys, const size_t *off,
		   const uint32_t *cap)
{
	static uint8_t body[8 + MAX_BATCH * PROTO_GET_ENTRY_BYTES];
	static struct rdmx_desc d[MAX_BATCH];

	assert_true(n <= MAX_BATCH);
	proto_batch_encode_prefix(body, n, 0);
	for (uint32_t i = 0; i < n; i++) {
		struct proto_get_entry e = { .max_length = cap[i] };

		key_of(e.key, keys[i]);
		proto_get_entry_encode(body, i, &e);
		d[i] = (struct rdmx_desc){ (uint64_t)(uintptr_t)(c->buf + off[i]),
					   rdmx_client_mr_rkey(c->mr), cap[i] };
	}
	return cli_call(c, PROTO_OP_GET, body, (uint32_t)proto_batch_body_bytes(n, PROTO_GET_ENTRY_BYTES),
			0, d, n, 0);
}

/* EXISTS or DELETE of one key: its result status. */
static uint16_t cli_key_op(struct cli *c, uint8_t op, uint32_t key)
{
	uint8_t body[8 + PROTO_KEY_ENTRY_BYTES], k[PROTO_KEY_BYTES];

	proto_batch_encode_prefix(body, 1, 0);
	key_of(k, key);
	proto_key_entry_encode(body, 0, k);
	assert_int_equal(cli_call(c, op, body, sizeof(body), 0, NULL, 0, 0), 0);
	return result_status(c, 0, NULL);
}

/* A number from the STATS document: the value after `key` (e.g.
 * "\"inflight_put_bytes\":"), first occurrence. */
static uint64_t cli_stat(struct cli *c, const char *key)
{
	uint8_t body[4];
	char *doc, *p;
	uint64_t v;

	assert_int_equal(proto_name_encode("", 0, body, sizeof(body)), 0);
	assert_int_equal(cli_call(c, PROTO_OP_STATS, body, (uint32_t)proto_name_body_bytes(0), 0,
				  NULL, 0, 0), 0);
	assert_int_equal(c->rh.status, PROTO_STATUS_OK);
	doc = strndup((const char *)c->reply + PROTO_HEADER_BYTES, c->rh.body_bytes);
	assert_non_null(doc);
	p = strstr(doc, key);
	assert_non_null(p);
	v = strtoull(p + strlen(key), NULL, 10);
	free(doc);
	return v;
}

/* cli_stat(c, key) once it equals want, polling for up to 5 s: a closed
 * connection is torn down by its own worker, which may run after the
 * worker answering c. Returns the last value read. */
static uint64_t cli_stat_wait(struct cli *c, const char *key, uint64_t want)
{
	uint64_t v = cli_stat(c, key);

	for (int i = 0; i < 500 && v != want; i++) {
		usleep(10000);
		v = cli_stat(c, key);
	}
	return v;
}

/* SIGTERM: kvpoold drains, closes its RDMA connections, the workers'
 * contexts and the listener, and returns 0 with every fake object freed. */
static int group_teardown(void **state)
{
	(void)state;
	kill(getpid(), SIGTERM);
	pthread_join(srv_thread, NULL);
	srv_rdma_test_ops = NULL;
	if (leftover) {
		/* kvpoold closed its side: the client's call now fails. */
		uint8_t ping[PROTO_HEADER_BYTES], reply[64];
		struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION,
					  .opcode = PROTO_OP_PING, .request_id = 9 };
		size_t got;

		proto_header_encode(&h, ping);
		if (rdmx_client_call(leftover->rc, ping, sizeof(ping), reply, sizeof(reply), &got,
				     500) == 0) {
			fprintf(stderr, "a connection outlived kvpoold\n");
			return -1;
		}
		cli_close(leftover);
		free(leftover);
		leftover = NULL;
	}
	if (nvme_dir[0]) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", nvme_dir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", nvme_dir);
		nvme_dir[0] = '\0';
	}
	if (srv_rc != 0 || F.live != 0) {
		fprintf(stderr, "srv_run returned %d, %d fake objects alive\n", srv_rc, F.live);
		return -1;
	}
	srv_rc = -1;
	return 0;
}

/* ---- tests ---------------------------------------------------------------- */

/* HELLO over RDMA says RDMA is served, on which port; STATS agrees. */
static void test_hello_rdma_port(void **state)
{
	struct cli c;
	uint16_t port = 0;

	(void)state;
	cli_open(&c, 4096);
	cli_hello(&c, "hello", &port);
	assert_int_equal(port, RDMX_DEFAULT_PORT);
	assert_true(cli_stat(&c, "\"connections\":{\"current\":") >= 1);
	assert_true(cli_stat(&c, "\"rdma\":{\"built\":true,\"available\":true,\"port\":") ==
		    RDMX_DEFAULT_PORT);
	cli_close(&c);
}

/* PUT of 3 blocks (one of 1 MiB) pulled by READ, then GET pushed by WRITE
 * into other buffers: byte for byte the same, checksums as sent. */
static void test_put_get_roundtrip(void **state)
{
	const uint32_t keys[3] = { 101, 102, 103 }, len[3] = { 4096, BIG_BYTES, 777 };
	const size_t off[3] = { 0, 4096, 4096 + BIG_BYTES };
	const size_t goff[3] = { 2 * BIG_BYTES, 2 * BIG_BYTES + 8192, 4 * BIG_BYTES };
	const uint32_t gcap[3] = { 8192, 2 * BIG_BYTES, 4096 };
	uint64_t read0, written0;
	struct proto_result r;
	struct cli c;

	(void)state;
	cli_open(&c, 5 * BIG_BYTES);
	cli_hello(&c, "rt", NULL);
	for (int i = 0; i < 3; i++)
		fill(c.buf + off[i], len[i], (uint32_t)i + 1);
	read0 = cli_stat(&c, "\"bytes_read\":");
	written0 = cli_stat(&c, "\"bytes_written\":");

	assert_int_equal(cli_put(&c, 3, keys, off, len, 0, 0), 0);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(result_status(&c, i, NULL), PROTO_STATUS_OK);
	assert_int_equal(cli_stat(&c, "\"bytes_read\":") - read0, 4096 + BIG_BYTES + 777);
	/* The same again: EXISTS, and nothing is read. */
	assert_int_equal(cli_put(&c, 3, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&c, 1, NULL), PROTO_STATUS_EXISTS);
	assert_int_equal(cli_stat(&c, "\"bytes_read\":") - read0, 4096 + BIG_BYTES + 777);

	assert_int_equal(cli_get(&c, 3, keys, goff, gcap), 0);
	assert_int_equal(c.rh.payload_bytes, 4096 + BIG_BYTES + 777);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(result_status(&c, i, &r), PROTO_STATUS_OK);
		assert_int_equal(r.length, len[i]);
		assert_true(r.checksum == XXH3_64bits(c.buf + off[i], len[i]));
		assert_memory_equal(c.buf + goff[i], c.buf + off[i], len[i]);
	}
	assert_int_equal(cli_stat(&c, "\"bytes_written\":") - written0, 4096 + BIG_BYTES + 777);
	cli_close(&c);
}

/* A batch of 100 blocks, more than a QP may have in flight
 * (RDMX_QP_MAX_XFER): the READs and then the WRITEs are pipelined, and
 * every block arrives intact. */
static void test_pipelined_batch(void **state)
{
	enum { N = 100, LEN = 4096 };
	static uint32_t keys[N], len[N], cap[N];
	static size_t off[N], goff[N];
	int xfers;
	struct cli c;

	(void)state;
	assert_true(N > RDMX_QP_MAX_XFER);
	cli_open(&c, 2 * N * LEN);
	cli_hello(&c, "pipe", NULL);
	for (uint32_t i = 0; i < N; i++) {
		keys[i] = 2000 + i;
		len[i] = cap[i] = LEN;
		off[i] = (size_t)i * LEN;
		goff[i] = (size_t)(N + i) * LEN;
		fill(c.buf + off[i], LEN, 2000 + i);
	}
	xfers = F.posted_xfer;
	assert_int_equal(cli_put(&c, N, keys, off, len, 0, 0), 0);
	for (uint32_t i = 0; i < N; i++)
		assert_int_equal(result_status(&c, i, NULL), PROTO_STATUS_OK);
	assert_int_equal(cli_get(&c, N, keys, goff, cap), 0);
	for (uint32_t i = 0; i < N; i++)
		assert_int_equal(result_status(&c, i, NULL), PROTO_STATUS_OK);
	assert_memory_equal(c.buf + N * LEN, c.buf, N * LEN);
	assert_int_equal(F.posted_xfer - xfers, 2 * N);
	cli_close(&c);
}

/* A GET whose buffer is smaller than the block: TOO_LARGE for that block
 * only, nothing written into it; a missing key is NOT_FOUND. */
static void test_get_small_buffer(void **state)
{
	const uint32_t keys[2] = { 201, 299 }, len[1] = { 3000 };
	const size_t off[1] = { 0 }, goff[2] = { 8192, 16384 };
	const uint32_t gcap[2] = { 2999, 4096 };
	struct cli c;

	(void)state;
	cli_open(&c, 32768);
	cli_hello(&c, "small", NULL);
	fill(c.buf, 3000, 9);
	assert_int_equal(cli_put(&c, 1, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&c, 0, NULL), PROTO_STATUS_OK);
	assert_int_equal(cli_get(&c, 2, keys, goff, gcap), 0);
	assert_int_equal(result_status(&c, 0, NULL), PROTO_STATUS_TOO_LARGE);
	assert_int_equal(result_status(&c, 1, NULL), PROTO_STATUS_NOT_FOUND);
	assert_int_equal(c.rh.payload_bytes, 0);
	for (int i = 0; i < 3000; i++)
		assert_int_equal(c.buf[8192 + i], 0);
	cli_close(&c);
}

/* A READ that completes with an error: the connection goes, nothing of
 * the PUT is visible, no reservation is left, and the server serves a
 * new connection. `how`: 0 an error completion, 1 a wrong rkey. */
static void put_read_fails(int how, uint32_t key0)
{
	const uint32_t keys[2] = { key0, key0 + 1 }, len[2] = { 65536, 100 };
	const size_t off[2] = { 0, 65536 };
	uint64_t errs0;
	struct cli c, d;

	cli_open(&d, 4096);
	cli_hello(&d, "readfail", NULL);
	errs0 = cli_stat(&d, "\"transfer_errors\":");

	cli_open(&c, 131072);
	cli_hello(&c, "readfail", NULL);
	fill(c.buf, 65536 + 100, key0);
	if (how == 0) {
		F.xfer_status = IBV_WC_REM_OP_ERR;
		F.xfer_status_at = F.posted_xfer + 2; /* the second block's READ */
	}
	assert_true(cli_put(&c, 2, keys, off, len, 0, how == 1 ? 0x5a : 0) < 0);
	F.xfer_status_at = 0;
	cli_close(&c);

	/* The other connection was not disturbed. */
	assert_int_equal(cli_key_op(&d, PROTO_OP_EXISTS, keys[0]), PROTO_STATUS_NOT_FOUND);
	assert_int_equal(cli_key_op(&d, PROTO_OP_EXISTS, keys[1]), PROTO_STATUS_NOT_FOUND);
	assert_int_equal(cli_stat_wait(&d, "\"inflight_put_bytes\":", 0), 0);
	assert_int_equal(cli_stat_wait(&d, "\"transfer_errors\":", errs0 + 1), errs0 + 1);
	/* And the same PUT works on a new connection. */
	cli_open(&c, 131072);
	cli_hello(&c, "readfail", NULL);
	fill(c.buf, 65536 + 100, key0);
	assert_int_equal(cli_put(&c, 2, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&c, 0, NULL), PROTO_STATUS_OK);
	assert_int_equal(result_status(&c, 1, NULL), PROTO_STATUS_OK);
	assert_int_equal(cli_key_op(&d, PROTO_OP_EXISTS, keys[1]), PROTO_STATUS_OK);
	cli_close(&c);
	cli_close(&d);
}

static void test_put_read_error(void **state)
{
	(void)state;
	put_read_fails(0, 300);
}

static void test_put_wrong_rkey(void **state)
{
	(void)state;
	put_read_fails(1, 400);
}

/* A GET whose WRITE fails: the connection goes and the pins are released:
 * once the block is deleted, the arena bytes it used are free again. */
static void test_get_write_fails_releases_pins(void **state)
{
	const uint32_t keys[1] = { 501 }, len[1] = { 200000 };
	const size_t off[1] = { 0 }, goff[1] = { 262144 };
	const uint32_t gcap[1] = { 262144 };
	uint64_t used0;
	struct cli c, d;

	(void)state;
	cli_open(&d, 4096);
	cli_hello(&d, "pins", NULL);
	used0 = cli_stat(&d, "\"used_bytes\":");

	cli_open(&c, 524288);
	cli_hello(&c, "pins", NULL);
	fill(c.buf, len[0], 5);
	assert_int_equal(cli_put(&c, 1, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&c, 0, NULL), PROTO_STATUS_OK);
	F.xfer_status = IBV_WC_REM_ACCESS_ERR;
	F.xfer_status_at = F.posted_xfer + 1;
	assert_true(cli_get(&c, 1, keys, goff, gcap) < 0);
	F.xfer_status_at = 0;
	cli_close(&c);

	assert_true(cli_stat(&d, "\"used_bytes\":") > used0);
	assert_int_equal(cli_key_op(&d, PROTO_OP_DELETE, keys[0]), PROTO_STATUS_OK);
	assert_int_equal(cli_key_op(&d, PROTO_OP_EXISTS, keys[0]), PROTO_STATUS_NOT_FOUND);
	/* A pin still held would keep the deleted block's bytes in use. */
	for (int i = 0; i < 100 && cli_stat(&d, "\"used_bytes\":") != used0; i++)
		usleep(10000);
	assert_int_equal(cli_stat(&d, "\"used_bytes\":"), used0);
	cli_close(&d);
}

/* Descriptor count or length not matching the entries: BAD_REQUEST,
 * nothing reserved, the connection stays usable. */
static void test_desc_mismatch(void **state)
{
	const uint32_t keys[2] = { 601, 602 }, len[2] = { 1000, 2000 };
	const size_t off[2] = { 0, 4096 };
	uint8_t body[8 + PROTO_GET_ENTRY_BYTES];
	struct proto_get_entry e = { .max_length = 100 };
	struct rdmx_desc dd = { 0 };
	struct cli c;

	(void)state;
	cli_open(&c, 8192);
	cli_hello(&c, "mismatch", NULL);
	fill(c.buf, 8192, 6);
	/* Descriptor length one byte short of the block. */
	assert_int_equal(cli_put(&c, 2, keys, off, len, -1, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_BAD_REQUEST);
	assert_int_equal(cli_key_op(&c, PROTO_OP_EXISTS, keys[1]), PROTO_STATUS_NOT_FOUND);
	assert_int_equal(cli_stat(&c, "\"inflight_put_bytes\":"), 0);
	/* A GET with one descriptor too few (and one too many). */
	proto_batch_encode_prefix(body, 1, 0);
	key_of(e.key, 601);
	proto_get_entry_encode(body, 0, &e);
	assert_int_equal(cli_call(&c, PROTO_OP_GET, body, sizeof(body), 0, NULL, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_BAD_REQUEST);
	assert_int_equal(cli_call(&c, PROTO_OP_GET, body, sizeof(body), 0, &dd, 1, RDMX_DESC_BYTES), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_BAD_REQUEST);
	/* A PING with trailing bytes. */
	assert_int_equal(cli_call(&c, PROTO_OP_PING, NULL, 0, 0, NULL, 0, 4), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_BAD_REQUEST);
	/* Still serving this connection. */
	assert_int_equal(cli_put(&c, 2, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&c, 1, NULL), PROTO_STATUS_OK);
	cli_close(&c);
}

/* A raw one-block PUT message over RDMA: len bytes of c's buffer, filled
 * from seed, described for the server to READ. */
#define PUT1_BODY_BYTES (8 + PROTO_PUT_ENTRY_BYTES)
#define PUT1_MSG_BYTES (32 + PUT1_BODY_BYTES + RDMX_DESC_BYTES)

static void put1_msg(struct cli *c, uint32_t key, uint32_t len, uint32_t seed,
		     uint64_t request_id, uint8_t msg[PUT1_MSG_BYTES])
{
	struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION,
				  .opcode = PROTO_OP_PUT, .body_bytes = PUT1_BODY_BYTES,
				  .request_id = request_id, .payload_bytes = len };
	struct proto_put_entry e = { .length = len };
	struct rdmx_desc d = { (uint64_t)(uintptr_t)c->buf, rdmx_client_mr_rkey(c->mr), len };

	fill(c->buf, len, seed);
	key_of(e.key, key);
	e.checksum = XXH3_64bits(c->buf, len);
	proto_header_encode(&h, msg);
	proto_batch_encode_prefix(msg + 32, 1, 0);
	proto_put_entry_encode(msg + 32, 0, &e);
	rdmx_desc_encode(&d, msg + 32 + PUT1_BODY_BYTES);
}

/* The client goes away while the server's READ of its PUT is in flight
 * (held in the fake fabric): the reservation is aborted once the QP is
 * gone, nothing is visible, and the server serves others. */
static void test_disconnect_mid_read(void **state)
{
	const uint32_t keys[1] = { 701 };
	uint8_t msg[PUT1_MSG_BYTES], reply[256];
	size_t got;
	int held;
	struct cli c, o;

	(void)state;
	cli_open(&c, 300000);
	cli_hello(&c, "gone", NULL);
	put1_msg(&c, keys[0], 300000, 7, 77, msg);
	held = F.held_xfers;
	F.xfer_hold = 1;
	assert_int_equal(rdmx_client_call(c.rc, msg, sizeof(msg), reply, sizeof(reply), &got, 300),
			 -ETIMEDOUT);
	assert_int_equal(F.held_xfers, held + 1);
	cli_close(&c);
	F.xfer_hold = 0;

	cli_open(&o, 4096);
	cli_hello(&o, "gone", NULL);
	assert_int_equal(cli_stat_wait(&o, "\"inflight_put_bytes\":", 0), 0);
	assert_int_equal(cli_key_op(&o, PROTO_OP_EXISTS, keys[0]), PROTO_STATUS_NOT_FOUND);
	cli_close(&o);
}

/* Without HELLO a PUT is refused and nothing is read; other requests work
 * as over TCP (PING, EXISTS, DELETE). */
static void test_hello_required(void **state)
{
	const uint32_t keys[1] = { 801 }, len[1] = { 64 };
	const size_t off[1] = { 0 };
	int xfers;
	struct cli c;

	(void)state;
	cli_open(&c, 4096);
	xfers = F.posted_xfer;
	assert_int_equal(cli_put(&c, 1, keys, off, len, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_BAD_REQUEST);
	assert_int_equal(F.posted_xfer, xfers);
	assert_int_equal(cli_call(&c, PROTO_OP_PING, NULL, 0, 0, NULL, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_OK);
	cli_hello(&c, "late", NULL);
	assert_int_equal(cli_key_op(&c, PROTO_OP_DELETE, keys[0]), PROTO_STATUS_NOT_FOUND);
	cli_close(&c);
}

/* HELLO for namespace ns over TCP on a new socket (closed again): the
 * reply's rdma_port. */
static uint16_t tcp_hello(const char *ns)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(tcp_port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct proto_hello h = { .min_version = 1, .max_version = 1, .ns = ns,
				 .ns_len = (uint16_t)strlen(ns) };
	struct proto_header ph = { .magic = PROTO_MAGIC, .version = PROTO_VERSION,
				   .opcode = PROTO_OP_HELLO, .request_id = 1 };
	uint8_t msg[32 + 512], in[32 + PROTO_HELLO_REPLY_BYTES];
	struct proto_hello_reply r;
	size_t got = 0;
	int fd = -1;

	ph.body_bytes = (uint32_t)proto_hello_body_bytes(&h);
	proto_header_encode(&ph, msg);
	assert_int_equal(proto_hello_encode(&h, msg + 32, sizeof(msg) - 32), 0);
	for (int i = 0; i < 500; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			break;
		close(fd);
		fd = -1;
		usleep(10000);
	}
	assert_true(fd >= 0);
	assert_int_equal(send(fd, msg, 32 + ph.body_bytes, 0), (ssize_t)(32 + ph.body_bytes));
	while (got < sizeof(in)) {
		ssize_t n = recv(fd, in + got, sizeof(in) - got, 0);

		assert_true(n > 0);
		got += (size_t)n;
	}
	close(fd);
	assert_int_equal(proto_header_decode(in, 1, &lim, &ph), 0);
	assert_int_equal(ph.status, PROTO_STATUS_OK);
	assert_int_equal(proto_hello_reply_decode(in + 32, ph.body_bytes, &r), 0);
	return r.rdma_port;
}

/* HELLO over TCP offers the RDMA port too. Then a STATS document over
 * 65536 bytes (many long namespace names) is refused TOO_LARGE over RDMA,
 * naming the limit, while one namespace's STATS still fits. Runs last: it
 * leaves the server's STATS too large for RDMA. */
static void test_tcp_hello_and_large_stats(void **state)
{
	char ns[201];
	uint8_t body[4 + 255];
	uint16_t min_v, max_v;
	const char *msg;
	uint32_t msg_bytes;
	char text[1100];
	struct cli c;

	(void)state;
	assert_int_equal(tcp_hello("tcp"), RDMX_DEFAULT_PORT);
	memset(ns, 'n', 200);
	ns[200] = '\0';
	for (unsigned int i = 0; i < 200; i++) {
		char tag[16];

		const uint32_t key = 1, len = 16;
		const size_t off = 0;

		snprintf(tag, sizeof(tag), "%07u", i);
		memcpy(ns, tag, 7);
		/* HELLO names a namespace; its first PUT creates it */
		cli_open(&c, 4096);
		cli_hello(&c, ns, NULL);
		assert_int_equal(cli_put(&c, 1, &key, &off, &len, 0, 0), 0);
		assert_int_equal(result_status(&c, 0, NULL), PROTO_STATUS_OK);
		cli_close(&c);
	}
	cli_open(&c, 4096);
	cli_hello(&c, "big", NULL);
	assert_int_equal(proto_name_encode("", 0, body, sizeof(body)), 0);
	assert_int_equal(cli_call(&c, PROTO_OP_STATS, body, (uint32_t)proto_name_body_bytes(0), 0,
				  NULL, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_TOO_LARGE);
	assert_int_equal(proto_error_decode(c.reply + 32, c.rh.body_bytes, &min_v, &max_v, &msg,
					    &msg_bytes), 0);
	snprintf(text, sizeof(text), "%.*s", (int)msg_bytes, msg);
	assert_non_null(strstr(text, "65536"));
	/* One namespace's figures fit; the connection still serves. */
	assert_int_equal(proto_name_encode("big", 3, body, sizeof(body)), 0);
	assert_int_equal(cli_call(&c, PROTO_OP_STATS, body, (uint32_t)proto_name_body_bytes(3), 0,
				  NULL, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_OK);
	cli_close(&c);
}

/* ---- with an NVMe tier: GETs that wait for promotions --------------------- */

#define SPILL_BLOCK (64u << 10)
#define SPILL_BATCH 8u
#define SPILL_BLOCKS 384u /* 24 MiB through an 8 MiB DRAM tier */

/* Block k's bytes (the same whenever asked). */
static void spill_fill(uint8_t *p, uint32_t k)
{
	fill(p, SPILL_BLOCK, 1000 + k);
}

/* PUT blocks first..first+SPILL_BATCH-1, retrying while DRAM is BUSY
 * (waiting for the demoter). */
static void spill_put(struct cli *c, uint32_t first)
{
	uint32_t keys[SPILL_BATCH], len[SPILL_BATCH];
	size_t off[SPILL_BATCH];
	int done = 0;

	for (uint32_t i = 0; i < SPILL_BATCH; i++) {
		keys[i] = 1000 + first + i;
		len[i] = SPILL_BLOCK;
		off[i] = (size_t)i * SPILL_BLOCK;
		spill_fill(c->buf + off[i], first + i);
	}
	for (int tries = 0; tries < 3000 && !done; tries++) {
		assert_int_equal(cli_put(c, SPILL_BATCH, keys, off, len, 0, 0), 0);
		done = 1;
		for (uint32_t i = 0; i < SPILL_BATCH; i++) {
			uint16_t st = result_status(c, i, NULL);

			assert_true(st == PROTO_STATUS_OK || st == PROTO_STATUS_EXISTS ||
				    st == PROTO_STATUS_BUSY);
			done &= st != PROTO_STATUS_BUSY;
		}
		if (!done)
			usleep(10000);
	}
	assert_true(done);
}

/* Blocks spilled to NVMe come back by RDMA WRITE after their promotion,
 * byte for byte, mixed in one GET with blocks still in DRAM; no pin or
 * reservation is left behind. */
static void test_get_after_promotion(void **state)
{
	uint32_t keys[SPILL_BATCH], cap[SPILL_BATCH];
	size_t goff[SPILL_BATCH];
	uint32_t from_nvme = 0, ok = 0;
	uint8_t *want;
	struct cli c;

	(void)state;
	cli_open(&c, 2 * SPILL_BATCH * SPILL_BLOCK);
	cli_hello(&c, "spill", NULL);
	for (uint32_t k = 0; k < SPILL_BLOCKS; k += SPILL_BATCH)
		spill_put(&c, k);
	assert_true(cli_stat(&c, "\"demotions\":") > 0);
	want = malloc(SPILL_BLOCK);
	assert_non_null(want);
	for (uint32_t round = 0; round < 4; round++) {
		for (uint32_t i = 0; i < SPILL_BATCH; i++) {
			/* the oldest blocks (on NVMe only) and the newest (in DRAM) */
			keys[i] = 1000 + (i < SPILL_BATCH - 2 ? round * SPILL_BATCH + i :
							      SPILL_BLOCKS - 1 - i);
			cap[i] = SPILL_BLOCK;
			goff[i] = (size_t)(SPILL_BATCH + i) * SPILL_BLOCK;
		}
		/* BUSY: no DRAM room to promote into right now (the demoter is
		 * making some; slow on a loaded machine): ask again */
		for (int tries = 0; tries < 500; tries++) {
			int busy = 0;

			memset(c.buf + SPILL_BATCH * SPILL_BLOCK, 0, SPILL_BATCH * SPILL_BLOCK);
			assert_int_equal(cli_get(&c, SPILL_BATCH, keys, goff, cap), 0);
			for (uint32_t i = 0; i < SPILL_BATCH; i++)
				busy += result_status(&c, i, NULL) == PROTO_STATUS_BUSY;
			if (!busy)
				break;
			usleep(10000);
		}
		for (uint32_t i = 0; i < SPILL_BATCH; i++) {
			struct proto_result r;
			uint16_t st = result_status(&c, i, &r);

			assert_int_equal(st, PROTO_STATUS_OK);
			spill_fill(want, keys[i] - 1000);
			assert_memory_equal(c.buf + goff[i], want, SPILL_BLOCK);
			from_nvme += r.tier == PROTO_TIER_NVME;
			ok++;
		}
	}
	free(want);
	assert_true(ok > 0);
	assert_true(from_nvme > 0);
	assert_true(cli_stat(&c, "\"promotions\":") >= from_nvme);
	assert_int_equal(cli_stat(&c, "\"inflight_put_bytes\":"), 0);
	cli_close(&c);
}

/* ---- max_connections and shutdown ---------------------------------------- */

static int limit_group_setup(void **state)
{
	(void)state;
	max_conns = 2;
	return server_start(0);
}

/* RDMA connections count against max_connections like TCP ones: over the
 * limit a connection request is refused and counted as rejected; once one
 * closes, a new one is taken. One connection stays open while kvpoold
 * shuts down (group_teardown): it is closed and everything freed. */
static void test_max_connections(void **state)
{
	struct cli a, b, *c;
	struct rdmx_client *x = NULL;
	int rc = 0;

	(void)state;
	cli_open(&a, 4096);
	cli_hello(&a, "limit", NULL);
	cli_open(&b, 4096);
	cli_hello(&b, "limit", NULL);
	assert_int_equal(cli_stat(&a, "\"connections\":{\"current\":"), 2);
	assert_int_equal(cli_stat(&a, "\"rdma\":{\"built\":true,\"available\":true,\"port\":7472,"
				  "\"reason\":\"\",\"connections\":{\"current\":"), 2);
	assert_true(rdmx_client_connect("127.0.0.1", RDMX_DEFAULT_PORT, 1000, &fake_verbs_ops, &x) < 0);
	assert_true(cli_stat(&a, "\"rejected\":") >= 1);
	cli_close(&b);
	/* The worker gives the slot back when it sees the disconnect. */
	for (uint64_t end = mono_ms() + STARTUP_WAIT_MS; mono_ms() < end;) {
		rc = rdmx_client_connect("127.0.0.1", RDMX_DEFAULT_PORT, 1000, &fake_verbs_ops, &x);
		if (rc == 0)
			break;
		usleep(10000);
	}
	assert_int_equal(rc, 0);
	rdmx_client_close(x);
	c = malloc(sizeof(*c));
	assert_non_null(c);
	for (uint64_t end = mono_ms() + STARTUP_WAIT_MS;
	     cli_stat(&a, "\"connections\":{\"current\":") != 1 && mono_ms() < end;)
		usleep(10000);
	cli_close(&a);
	cli_open(c, 4096);
	cli_hello(c, "limit", NULL);
	leftover = c;
}

/* Send a message of `bytes` bytes without waiting for its reply. */
static void cli_send_raw(struct cli *c, const uint8_t *msg, size_t bytes)
{
	assert_int_equal(rdmx_client_send(c->rc, msg, bytes), 0);
}

/* Wait for kvpoold to take `n` more messages: it reposts a receive for
 * each (the client posts none while it is not receiving). */
static void wait_taken(int posted0, int n)
{
	for (int i = 0; i < 300 && F.posted_recv < posted0 + n; i++)
		usleep(10000);
	assert_int_equal(F.posted_recv, posted0 + n);
}

/* Wait until the server has left connection c: true if it did within
 * ms milliseconds. */
static int server_left(struct cli *c, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (!rdmx_client_ok(c->rc))
			return 1;
		usleep(10000);
	}
	return !rdmx_client_ok(c->rc);
}

/* A PING message with request id `id`. */
static void ping_msg(uint8_t msg[PROTO_HEADER_BYTES], uint64_t id)
{
	struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION,
				  .opcode = PROTO_OP_PING, .request_id = id };

	proto_header_encode(&h, msg);
}

/* PROTOCOL.md section 13: a client with more than RDMX_MSG_DEPTH requests
 * outstanding is disconnected. A PUT whose READ is held keeps the server
 * busy; with it and 7 PINGs (8 outstanding) the connection stays, the 9th
 * request closes it, the PUT's reservation is aborted, and another
 * connection is served throughout. */
static void test_too_many_outstanding(void **state)
{
	const uint32_t keys[1] = { 1501 }, len[1] = { 100000 };
	uint8_t msg[PUT1_MSG_BYTES], ping[PROTO_HEADER_BYTES], reply[256];
	uint64_t conns0;
	struct cli c, o;
	size_t got;
	int posted0;

	(void)state;
	cli_open(&o, 4096);
	cli_hello(&o, "credit", NULL);
	cli_open(&c, 100000);
	cli_hello(&c, "credit", NULL);
	conns0 = cli_stat(&o, "\"connections\":{\"current\":");
	put1_msg(&c, keys[0], len[0], 15, 1, msg);

	F.xfer_hold = 1;
	posted0 = F.posted_recv;
	cli_send_raw(&c, msg, sizeof(msg));
	for (uint64_t i = 0; i < RDMX_MSG_DEPTH - 1; i++) {
		ping_msg(ping, 2 + i);
		cli_send_raw(&c, ping, sizeof(ping));
		wait_taken(posted0, (int)i + 2);
	}
	/* 8 outstanding: allowed, nothing answered yet (the PUT waits). */
	assert_false(server_left(&c, 200));
	assert_int_equal(rdmx_client_recv(c.rc, reply, sizeof(reply), &got, 100), -ETIMEDOUT);
	assert_int_equal(cli_key_op(&o, PROTO_OP_EXISTS, keys[0]), PROTO_STATUS_NOT_FOUND);
	assert_true(cli_stat(&o, "\"inflight_put_bytes\":") >= len[0]);
	/* The 9th: disconnected. */
	ping_msg(ping, 100);
	cli_send_raw(&c, ping, sizeof(ping));
	assert_true(server_left(&c, 3000));
	cli_close(&c);
	F.xfer_hold = 0;

	assert_int_equal(cli_stat_wait(&o, "\"inflight_put_bytes\":", 0), 0);
	for (int i = 0; i < 100 && cli_stat(&o, "\"connections\":{\"current\":") != conns0 - 1; i++)
		usleep(10000);
	assert_int_equal(cli_stat(&o, "\"connections\":{\"current\":"), conns0 - 1);
	assert_int_equal(cli_key_op(&o, PROTO_OP_EXISTS, keys[0]), PROTO_STATUS_NOT_FOUND);
	assert_int_equal(cli_call(&o, PROTO_OP_PING, NULL, 0, 0, NULL, 0, 0), 0);
	assert_int_equal(o.rh.status, PROTO_STATUS_OK);
	cli_close(&o);
}

/* Send msg[0..bytes) on a new connection and take the reply, decoded
 * into *rh; then the server closes the connection (section 7.3). */
static void fatal_reply(const uint8_t *msg, size_t bytes, struct proto_header *rh)
{
	uint8_t reply[2048];
	struct cli c;
	size_t got = 0;

	cli_open(&c, 4096);
	cli_hello(&c, "fatal", NULL);
	cli_send_raw(&c, msg, bytes);
	assert_int_equal(rdmx_client_recv(c.rc, reply, sizeof(reply), &got, CALL_MS), 0);
	assert_true(got >= PROTO_HEADER_BYTES);
	assert_int_equal(proto_header_decode(reply, 1, &lim, rh), 0);
	assert_int_equal(got, PROTO_HEADER_BYTES + rh->body_bytes);
	/* The connection closes shortly after the reply. */
	assert_true(server_left(&c, 3000));
	cli_close(&c);
}

/* Messages that do not decode as a header, or announce an unknown
 * version, are answered as over TCP (PROTOCOL.md sections 7.3 and 13):
 * wrong magic, a connection-level BAD_REQUEST (opcode 0, request_id 0);
 * an unknown version, UNSUPPORTED echoing opcode and request_id, naming
 * the versions spoken; opcode 0, UNSUPPORTED; each then closes. An
 * unknown opcode is UNSUPPORTED and the connection stays. */
static void test_undecodable_messages(void **state)
{
	uint8_t msg[PROTO_HEADER_BYTES];
	struct proto_header rh;
	uint16_t min_v = 0, max_v = 0;
	const char *text;
	uint32_t text_bytes;
	struct cli c;

	(void)state;
	ping_msg(msg, 4242);
	memcpy(msg, "GET ", 4);
	fatal_reply(msg, sizeof(msg), &rh);
	assert_int_equal(rh.opcode, PROTO_OP_NONE);
	assert_int_equal(rh.request_id, 0);
	assert_int_equal(rh.status, PROTO_STATUS_BAD_REQUEST);

	ping_msg(msg, 4243);
	msg[4] = PROTO_VERSION_MAX + 1;
	fatal_reply(msg, sizeof(msg), &rh);
	assert_int_equal(rh.opcode, PROTO_OP_PING);
	assert_int_equal(rh.request_id, 4243);
	assert_int_equal(rh.status, PROTO_STATUS_UNSUPPORTED);

	ping_msg(msg, 4244);
	msg[5] = PROTO_OP_NONE;
	fatal_reply(msg, sizeof(msg), &rh);
	assert_int_equal(rh.request_id, 4244);
	assert_int_equal(rh.status, PROTO_STATUS_UNSUPPORTED);

	/* An unknown opcode: UNSUPPORTED, the connection goes on. */
	cli_open(&c, 4096);
	cli_hello(&c, "fatal", NULL);
	ping_msg(msg, 4245);
	msg[5] = 0x7e;
	cli_send_raw(&c, msg, sizeof(msg));
	assert_int_equal(rdmx_client_recv(c.rc, c.reply, sizeof(c.reply), &c.reply_bytes, CALL_MS), 0);
	assert_int_equal(proto_header_decode(c.reply, 1, &lim, &rh), 0);
	assert_int_equal(rh.status, PROTO_STATUS_UNSUPPORTED);
	assert_int_equal(rh.request_id, 4245);
	assert_int_equal(proto_error_decode(c.reply + 32, rh.body_bytes, &min_v, &max_v, &text,
					    &text_bytes), 0);
	assert_true(text_bytes > 0);
	assert_false(server_left(&c, 100));
	assert_int_equal(cli_call(&c, PROTO_OP_PING, NULL, 0, 0, NULL, 0, 0), 0);
	assert_int_equal(c.rh.status, PROTO_STATUS_OK);
	cli_close(&c);
}

/* A MATCH that waits, over RDMA (server/srv_mwait.c): the transport has
 * no `kick`, so the waiting MATCH holds its connection (a PING sent after
 * it is answered after it); a PUT on another connection completes the
 * run and the MATCH is answered with it (WAITED), then the PING; one that
 * nothing completes is answered when wait_ms passes (WAIT_TIMEOUT). */
static void test_match_waits(void **state)
{
	const uint32_t keys[2] = { 1701, 1702 }, len[2] = { 4096, 4096 };
	const size_t off[2] = { 0, 4096 };
	struct proto_hello hl = { .min_version = 1, .max_version = 2, .ns = "wait",
				  .ns_len = 4 };
	struct proto_match_opts o = { .wait_ms = 10000, .want = 0 };
	struct proto_match_reply mr;
	struct proto_header h, rh;
	uint8_t msg[PROTO_HEADER_BYTES + PROTO_MATCH_V2_PREFIX_BYTES + 2 * PROTO_KEY_BYTES];
	uint8_t body[512], ping[PROTO_HEADER_BYTES], k[PROTO_KEY_BYTES];
	uint8_t reply[RDMX_MSG_MAX_BYTES];
	size_t got = 0;
	struct cli w, p;

	(void)state;
	cli_open(&w, 4096);
	assert_int_equal(proto_hello_encode(&hl, body, sizeof(body)), 0);
	assert_int_equal(cli_call(&w, PROTO_OP_HELLO, body, (uint32_t)proto_hello_body_bytes(&hl), 0,
				  NULL, 0, 0), 0);
	assert_int_equal(w.rh.status, PROTO_STATUS_OK);
	cli_open(&p, 8192);
	cli_hello(&p, "wait", NULL);
	/* the v2 MATCH of keys 1701, 1702, then a PING, without waiting */
	h = (struct proto_header){ .magic = PROTO_MAGIC, .version = PROTO_VERSION_2,
				   .opcode = PROTO_OP_MATCH,
				   .body_bytes = PROTO_MATCH_V2_PREFIX_BYTES + 2 * PROTO_KEY_BYTES,
				   .request_id = 501 };
	proto_header_encode(&h, msg);
	proto_match_encode_prefix(msg + PROTO_HEADER_BYTES, PROTO_VERSION_2, 2, 0, &o);
	for (uint32_t i = 0; i < 2; i++) {
		key_of(k, keys[i]);
		proto_match_key_encode(msg + PROTO_HEADER_BYTES, PROTO_VERSION_2, i, k);
	}
	cli_send_raw(&w, msg, sizeof(msg));
	ping_msg(ping, 502);
	cli_send_raw(&w, ping, sizeof(ping));
	assert_int_equal(cli_stat_wait(&p, "\"waiting\":", 1), 1);
	/* held: nothing answered, not even the PING */
	assert_int_equal(rdmx_client_recv(w.rc, reply, sizeof(reply), &got, 200), -ETIMEDOUT);
	fill(p.buf, 8192, 17);
	assert_int_equal(cli_put(&p, 2, keys, off, len, 0, 0), 0);
	assert_int_equal(result_status(&p, 1, NULL), PROTO_STATUS_OK);
	assert_int_equal(rdmx_client_recv(w.rc, reply, sizeof(reply), &got, CALL_MS), 0);
	assert_int_equal(proto_header_decode(reply, 1, &lim, &rh), 0);
	assert_int_equal(rh.request_id, 501);
	assert_int_equal(rh.status, PROTO_STATUS_OK);
	assert_int_equal(proto_match_reply_decode_v(reply + PROTO_HEADER_BYTES, rh.body_bytes,
						    PROTO_VERSION_2, &mr), 0);
	assert_int_equal(mr.matched, 2);
	assert_int_equal(mr.flags, PROTO_MATCH_WAITED);
	assert_int_equal(rdmx_client_recv(w.rc, reply, sizeof(reply), &got, CALL_MS), 0);
	assert_int_equal(proto_header_decode(reply, 1, &lim, &rh), 0);
	assert_int_equal(rh.request_id, 502);
	assert_int_equal(rh.opcode, PROTO_OP_PING);
	/* nothing completes this one: answered when 150 ms pass */
	o.wait_ms = 150;
	key_of(k, 1799);
	h.request_id = 503;
	h.body_bytes = PROTO_MATCH_V2_PREFIX_BYTES + PROTO_KEY_BYTES;
	proto_header_encode(&h, msg);
	proto_match_encode_prefix(msg + PROTO_HEADER_BYTES, PROTO_VERSION_2, 1, 0, &o);
	proto_match_key_encode(msg + PROTO_HEADER_BYTES, PROTO_VERSION_2, 0, k);
	cli_send_raw(&w, msg, PROTO_HEADER_BYTES + h.body_bytes);
	assert_int_equal(rdmx_client_recv(w.rc, reply, sizeof(reply), &got, CALL_MS), 0);
	assert_int_equal(proto_header_decode(reply, 1, &lim, &rh), 0);
	assert_int_equal(rh.request_id, 503);
	assert_int_equal(proto_match_reply_decode_v(reply + PROTO_HEADER_BYTES, rh.body_bytes,
						    PROTO_VERSION_2, &mr), 0);
	assert_int_equal(mr.matched, 0);
	assert_int_equal(mr.flags, PROTO_MATCH_WAITED | PROTO_MATCH_WAIT_TIMEOUT);
	assert_int_equal(cli_stat(&p, "\"waiting\":"), 0);
	cli_close(&w);
	cli_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_rdma_port),
		cmocka_unit_test(test_put_get_roundtrip),
		cmocka_unit_test(test_get_small_buffer),
		cmocka_unit_test(test_pipelined_batch),
		cmocka_unit_test(test_put_read_error),
		cmocka_unit_test(test_put_wrong_rkey),
		cmocka_unit_test(test_get_write_fails_releases_pins),
		cmocka_unit_test(test_desc_mismatch),
		cmocka_unit_test(test_disconnect_mid_read),
		cmocka_unit_test(test_hello_required),
		cmocka_unit_test(test_too_many_outstanding),
		cmocka_unit_test(test_undecodable_messages),
		cmocka_unit_test(test_match_waits),
		cmocka_unit_test(test_tcp_hello_and_large_stats),
	};

	const struct CMUnitTest nvme_tests[] = {
		cmocka_unit_test(test_get_after_promotion),
	};
	int failed = cmocka_run_group_tests_name("rdma", tests, group_setup, group_teardown);

	const struct CMUnitTest limit_tests[] = {
		cmocka_unit_test(test_max_connections),
	};
	failed += cmocka_run_group_tests_name("rdma_nvme", nvme_tests, nvme_group_setup,
					      group_teardown);
	failed += cmocka_run_group_tests_name("rdma_limit", limit_tests, limit_group_setup,
					      group_teardown);
	return failed;
}

#endif /* KVPOOL_RDMA */
