/*
 * test_client_rdma.c - libkvpool's RDMA data path against the fake RDMA
 * server of fake_rdma_server.h over the loopback fake verbs: rdma:// put
 * and get byte-exact from registered buffers (zero copy: the server is
 * given the caller's addresses) and from unregistered ones (staging),
 * batches split at rdmx_max_batch and at the staging buffer's size, a
 * corrupted GET, a block too large for its buffer, a silent server
 * (timeout), a failed READ and a dropped connection (an error within
 * the timeout, then a reconnect), pipelining (zero-copy frames) and its
 * absence (staged frames), kvpool_register/unregister on RDMA, and
 * auto:// moving to RDMA or staying on TCP (said once). In an RDMA=0
 * build only the stub's answer to rdma:// is tested.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvpool.h"
#include "lib/client.h"
#include "lib/conn.h"

#ifdef KVPOOL_RDMA

#include "fake_rdma_server.h"
#include "fake_server.h"
#include "fake_verbs.h"

#define F fake_verbs
#define BLOCK_BYTES 4096u
#define URL "rdma://127.0.0.1:7472"

static const struct proto_hello_reply frs_limits = {
	.version = 1,
	.max_batch_blocks = 2048,
	.max_block_bytes = 16 * 1024,
	.max_frame_bytes = 1 << 20,
	.max_lease_ms = 5000,
};

struct env {
	struct fake_rdma_server fs;
	struct kvpool_client *c;
};

/* Loopback fake fabric, the fake RDMA server on 7472, an rdma:// handle. */
static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct kvpool_options opts = { .timeout_ms = 2000 };

	fake_verbs_reset();
	F.loopback = 1;
	kvc_rdma_test_ops = &fake_verbs_ops;
	kvc_rdma_stage_max_bytes = KVC_RDMA_STAGE_BYTES;
	e->fs.limits = frs_limits;
	e->fs.port = 7472;
	frs_start(&e->fs);
	assert_int_equal(kvpool_connect(URL, "ns-rdma", &opts, &e->c), 0);
	*state = e;
	return 0;
}

/* Close everything; nothing of the fake fabric may be left allocated. */
static int teardown(void **state)
{
	struct env *e = *state;

	kvpool_close(e->c);
	frs_stop(&e->fs);
	assert_int_equal(F.live, 0);
	kvc_rdma_test_ops = NULL;
	kvc_rdma_stage_max_bytes = KVC_RDMA_STAGE_BYTES;
	free(e);
	return 0;
}

static void fill(uint8_t *p, size_t n, unsigned int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 8));
}

static void key_of(uint8_t key[KVPOOL_KEY_BYTES], unsigned int i)
{
	memset(key, 0, KVPOOL_KEY_BYTES);
	memcpy(key, &i, sizeof(i));
	key[31] = 0x5a;
}

/* Put n blocks of `bytes` from src[i * bytes] (one iovec each). */
static int put_n(struct kvpool_client *c, uint8_t *src, size_t n, size_t bytes, unsigned int k0)
{
	uint8_t (*keys)[KVPOOL_KEY_BYTES] = calloc(n, KVPOOL_KEY_BYTES);
	struct iovec *iov = calloc(n, sizeof(*iov));
	struct kvpool_put_block *b = calloc(n, sizeof(*b));
	int rc;

	for (size_t i = 0; i < n; i++) {
		key_of(keys[i], k0 + (unsigned int)i);
		iov[i] = (struct iovec){ src + i * bytes, bytes };
		b[i] = (struct kvpool_put_block){ .key = keys[i], .iov = &iov[i], .iovcnt = 1 };
	}
	rc = kvpool_put(c, b, n, NULL);
	free(b);
	free(iov);
	free(keys);
	return rc;
}

/* Get n blocks into dst[i * bytes]; every length must come back `bytes`. */
static int get_n(struct kvpool_client *c, uint8_t *dst, size_t n, size_t bytes, unsigned int k0)
{
	uint8_t (*keys)[KVPOOL_KEY_BYTES] = calloc(n, KVPOOL_KEY_BYTES);
	struct iovec *iov = calloc(n, sizeof(*iov));
	struct kvpool_get_block *b = calloc(n, sizeof(*b));
	int rc;

	for (size_t i = 0; i < n; i++) {
		key_of(keys[i], k0 + (unsigned int)i);
		iov[i] = (struct iovec){ dst + i * bytes, bytes };
		b[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &iov[i], .iovcnt = 1 };
	}
	rc = kvpool_get(c, b, n, NULL);
	for (size_t i = 0; rc == 0 && i < n; i++)
		assert_int_equal(b[i].length, bytes);
	free(b);
	free(iov);
	free(keys);
	return rc;
}

/* Registered buffers: the server is given the caller's own addresses (no
 * staging buffer is ever made) and the bytes come back exact. */
static void test_registered_zero_copy(void **state)
{
	struct env *e = *state;
	size_t n = 8, bytes = BLOCK_BYTES;
	uint8_t *src = malloc(n * bytes), *dst = calloc(n, bytes);

	fill(src, n * bytes, 1);
	assert_int_equal(kvpool_register(e->c, src, n * bytes), 0);
	assert_int_equal(kvpool_register(e->c, dst, n * bytes), 0);
	assert_int_equal(put_n(e->c, src, n, bytes, 100), 0);
	assert_int_equal(get_n(e->c, dst, n, bytes, 100), 0);
	assert_memory_equal(src, dst, n * bytes);
	for (size_t i = 0; i < n; i++) {
		uint8_t key[KVPOOL_KEY_BYTES];

		key_of(key, 100 + (unsigned int)i);
		assert_true(frs_has(&e->fs, key, src + i * bytes, bytes));
		assert_true(e->fs.desc_addr[i] == (uint64_t)(uintptr_t)(src + i * bytes));
		assert_true(e->fs.desc_addr[n + i] == (uint64_t)(uintptr_t)(dst + i * bytes));
	}
	assert_null(e->c->stage);
	assert_int_equal(e->fs.msgs[PROTO_OP_PUT], 1);
	assert_int_equal(e->fs.msgs[PROTO_OP_GET], 1);
	assert_int_equal(e->fs.read_bytes, n * bytes);
	assert_int_equal(e->fs.write_bytes, n * bytes);
	assert_int_equal(kvpool_unregister(e->c, src), 0);
	assert_int_equal(kvpool_unregister(e->c, dst), 0);
	free(src);
	free(dst);
}

/* Unregistered buffers, a PUT from two iovecs and a GET into two: the
 * server is given staging addresses, the bytes still come back exact. */
static void test_unregistered_staging(void **state)
{
	struct env *e = *state;
	uint8_t a[1000], b[3000], out1[2500], out2[1500], key[KVPOOL_KEY_BYTES];
	struct iovec in[2] = { { a, sizeof(a) }, { b, sizeof(b) } };
	struct iovec out[2] = { { out1, sizeof(out1) }, { out2, sizeof(out2) } };
	struct kvpool_put_block pb = { .key = key, .iov = in, .iovcnt = 2 };
	struct kvpool_get_block gb = { .key = key, .iov = out, .iovcnt = 2 };
	uintptr_t lo, hi;

	fill(a, sizeof(a), 2);
	fill(b, sizeof(b), 3);
	key_of(key, 7);
	assert_int_equal(kvpool_put(e->c, &pb, 1, NULL), 0);
	assert_int_equal(kvpool_get(e->c, &gb, 1, NULL), 0);
	assert_int_equal(gb.length, 4000);
	assert_memory_equal(out1, a, sizeof(a));
	assert_memory_equal(out1 + sizeof(a), b, sizeof(out1) - sizeof(a));
	assert_memory_equal(out2, b + sizeof(out1) - sizeof(a), 4000 - sizeof(out1));
	assert_non_null(e->c->stage);
	lo = (uintptr_t)e->c->stage;
	hi = lo + e->c->stage_bytes;
	assert_int_equal(e->fs.n_desc, 2);
	for (int i = 0; i < 2; i++)
		assert_true(e->fs.desc_addr[i] >= lo && e->fs.desc_addr[i] < hi);
	/* One block through kvpool_put_bytes / kvpool_get_bytes as well. */
	uint8_t small[100], back[200];
	uint64_t len = 0;

	fill(small, sizeof(small), 4);
	key_of(key, 8);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, small, sizeof(small)), 0);
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), 0);
	assert_int_equal(len, sizeof(small));
	assert_memory_equal(back, small, sizeof(small));
	/* A missing key: NOT_FOUND as on TCP. */
	key_of(key, 9);
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), -ENOENT);
}

/* A batch over rdmx_max_batch goes as two messages; a staged batch over
 * the staging buffer goes in pieces of what it holds. */
static void test_batch_split(void **state)
{
	struct env *e = *state;
	size_t n = rdmx_max_batch(PROTO_PUT_ENTRY_BYTES) + 10, bytes = 64;
	size_t g = rdmx_max_batch(PROTO_GET_ENTRY_BYTES) + 1;
	uint8_t *src = malloc(g * bytes), *dst = calloc(g, bytes);

	fill(src, g * bytes, 5);
	assert_int_equal(kvpool_register(e->c, src, g * bytes), 0);
	assert_int_equal(kvpool_register(e->c, dst, g * bytes), 0);
	assert_int_equal(put_n(e->c, src, n, bytes, 1000), 0);
	assert_int_equal(e->fs.msgs[PROTO_OP_PUT], 2);
	assert_int_equal(e->c->max_frames_in_flight, 2); /* zero copy: pipelined */
	assert_int_equal(put_n(e->c, src + n * bytes, g - n, bytes, 1000 + (unsigned int)n), 0);
	assert_int_equal(get_n(e->c, dst, g, bytes, 1000), 0);
	assert_int_equal(e->fs.msgs[PROTO_OP_GET], 2);
	assert_memory_equal(src, dst, g * bytes);
	assert_int_equal(e->fs.put_blocks, g);
	assert_int_equal(e->fs.get_blocks, g);
	free(src);
	free(dst);
}

/* Staging smaller than the batch: 10 blocks of 4 KiB through a 16 KiB
 * staging buffer go as 3 messages (4 + 4 + 2). */
static void test_staging_pieces(void **state)
{
	struct env *e = *state;
	size_t n = 10, bytes = BLOCK_BYTES;
	uint8_t *src = malloc(n * bytes), *dst = calloc(n, bytes);

	/* A new connection picks the new size up. */
	kvc_rdma_stage_max_bytes = 4 * BLOCK_BYTES;
	e->fs.limits.max_block_bytes = BLOCK_BYTES;
	kvc_disconnect(e->c);
	fill(src, n * bytes, 6);
	assert_int_equal(put_n(e->c, src, n, bytes, 2000), 0);
	assert_int_equal(e->c->stage_bytes, 4 * BLOCK_BYTES);
	assert_int_equal(e->fs.msgs[PROTO_OP_PUT], 3);
	assert_int_equal(get_n(e->c, dst, n, bytes, 2000), 0);
	assert_int_equal(e->fs.msgs[PROTO_OP_GET], 3);
	assert_memory_equal(src, dst, n * bytes);
	assert_int_equal(e->c->max_frames_in_flight, 1); /* staged frames go alone */
	free(src);
	free(dst);
}

/* The server reports a checksum that does not match the bytes written:
 * -EBADMSG and the handle's checksum error counter, as on TCP. */
static void test_corrupt_get(void **state)
{
	struct env *e = *state;
	uint8_t data[2048], back[2048] = { 0 }, key[KVPOOL_KEY_BYTES];
	struct kvpool_counters k;
	uint64_t len = 0;

	fill(data, sizeof(data), 7);
	key_of(key, 11);
	assert_int_equal(kvpool_register(e->c, back, sizeof(back)), 0);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	e->fs.corrupt_get = 1;
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), -EBADMSG);
	assert_int_equal(kvpool_get_counters(e->c, &k), 0);
	assert_int_equal(k.checksum_errors, 1);
	e->fs.corrupt_get = 0;
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
}

/* A call that failed on RDMA: the error came back well inside the
 * timeout, and the next call reconnects and works. */
static void check_recovers(struct env *e, uint64_t t0, int rc)
{
	uint8_t data[512], back[512], key[KVPOOL_KEY_BYTES];
	struct kvpool_counters k;
	uint64_t len = 0;

	assert_true(rc == -ECONNRESET || rc == -EPIPE);
	assert_true(kvc_now_ms() - t0 < 1500);
	assert_false(kvc_connected(e->c));
	fill(data, sizeof(data), 9);
	key_of(key, 21);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
	assert_int_equal(kvpool_get_counters(e->c, &k), 0);
	assert_int_equal(k.reconnects, 1);
	assert_int_equal(e->fs.accepted, 2);
	assert_int_equal(e->c->rdma_connects, 2);
}

/* The server's READ of a PUT fails: nothing stored, the connection goes,
 * the call fails fast, the next one reconnects. */
static void test_read_fails(void **state)
{
	struct env *e = *state;
	uint8_t data[1024], key[KVPOOL_KEY_BYTES];
	uint64_t t0 = kvc_now_ms();
	int rc;

	fill(data, sizeof(data), 10);
	key_of(key, 20);
	F.xfer_status_at = F.posted_xfer + 1;
	F.xfer_status = IBV_WC_REM_ACCESS_ERR;
	rc = kvpool_put_bytes(e->c, key, NULL, data, sizeof(data));
	assert_false(frs_has(&e->fs, key, data, sizeof(data)));
	check_recovers(e, t0, rc);
}

/* The server drops the connection in the middle of a GET request. */
static void test_drop_mid_request(void **state)
{
	struct env *e = *state;
	uint8_t back[256], key[KVPOOL_KEY_BYTES];
	uint64_t len = 0, t0;

	key_of(key, 30);
	e->fs.drop_next = 1;
	t0 = kvc_now_ms();
	check_recovers(e, t0, kvpool_get_bytes(e->c, key, back, sizeof(back), &len));
}

/* A block larger than the GET buffer: -EMSGSIZE with its real length,
 * nothing written past the buffer, as on TCP. */
static void test_get_too_large(void **state)
{
	struct env *e = *state;
	uint8_t data[3000], back[1000 + 16], key[KVPOOL_KEY_BYTES];
	uint64_t len = 0;

	fill(data, sizeof(data), 14);
	memset(back, 0xee, sizeof(back));
	key_of(key, 40);
	assert_int_equal(kvpool_register(e->c, back, sizeof(back)), 0);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_get_bytes(e->c, key, back, 1000, &len), -EMSGSIZE);
	assert_int_equal(len, sizeof(data));
	for (size_t i = 0; i < sizeof(back); i++)
		assert_int_equal(back[i], 0xee);
}

/* A server that never answers: -ETIMEDOUT after the handle's timeout,
 * not before and not much after; the next call reconnects. */
static void test_timeout(void **state)
{
	struct env *e = *state;
	uint8_t data[500], key[KVPOOL_KEY_BYTES];
	uint64_t t0, took;

	fill(data, sizeof(data), 15);
	key_of(key, 41);
	kvpool_set_timeout(e->c, 300);
	e->fs.silent = 1;
	t0 = kvc_now_ms();
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), -ETIMEDOUT);
	took = kvc_now_ms() - t0;
	assert_true(took >= 290 && took < 1500);
	assert_false(kvc_connected(e->c));
	e->fs.silent = 0;
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	assert_true(frs_has(&e->fs, key, data, sizeof(data)));
	assert_int_equal(e->fs.accepted, 2);
}

/* The server closes the connection between two calls: the next call
 * notices before sending (as a TCP client notices a closed socket),
 * reconnects and works, without an error. */
static void test_drop_between_calls(void **state)
{
	struct env *e = *state;
	uint8_t data[700], back[700], key[KVPOOL_KEY_BYTES];
	struct kvpool_counters k;
	uint64_t len = 0;

	fill(data, sizeof(data), 13);
	key_of(key, 31);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	e->fs.drop_idle = 1;
	for (int i = 0; i < 2000 && e->fs.closed == 0; i++)
		usleep(1000);
	assert_int_equal(e->fs.closed, 1);
	assert_int_equal(kvpool_get_bytes(e->c, key, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
	assert_int_equal(kvpool_get_counters(e->c, &k), 0);
	assert_int_equal(k.reconnects, 1);
	assert_int_equal(e->fs.accepted, 2);
}

/* kvpool_register/unregister keep their errors on RDMA; each region is a
 * memory registration of the connection while it is registered. */
static void test_register_errors(void **state)
{
	struct env *e = *state;
	static uint8_t buf[8192], other[64];
	int live = F.live;

	assert_int_equal(kvpool_register(e->c, buf, 4096), 0);
	assert_int_equal(F.live, live + 1);
	assert_int_equal(kvpool_register(e->c, buf + 100, 10), -EEXIST);
	assert_int_equal(kvpool_register(e->c, buf, 4096), -EEXIST);
	assert_int_equal(kvpool_unregister(e->c, buf + 1), -ENOENT);
	assert_int_equal(kvpool_register(e->c, NULL, 10), -EINVAL);
	assert_int_equal(kvpool_unregister(e->c, buf), 0);
	assert_int_equal(F.live, live);
	assert_int_equal(kvpool_unregister(e->c, buf), -ENOENT);
	/* A region registered while disconnected is registered at connect. */
	kvc_disconnect(e->c);
	assert_int_equal(kvpool_register(e->c, buf, sizeof(buf)), 0);
	assert_null(e->c->regions[0].mr);
	assert_int_equal(put_n(e->c, buf, 2, 4096, 40), 0);
	assert_non_null(e->c->regions[0].mr);
	assert_null(e->c->stage);
	/* A registration the fake refuses: the error, and no region. */
	F.reg_mr_errno = EPERM;
	assert_int_equal(kvpool_register(e->c, other, sizeof(other)), -EPERM);
	F.reg_mr_errno = 0;
	assert_int_equal(kvpool_unregister(e->c, other), -ENOENT);
	assert_int_equal(kvpool_unregister(e->c, buf), 0);
}

/* ---- auto:// -------------------------------------------------------------- */

/* Run f with stderr going to a file; return how many lines it wrote that
 * start "libkvpool: auto://". */
static int count_auto_lines(FILE *log)
{
	char line[512];
	int n = 0;

	fflush(stderr);
	rewind(log);
	while (fgets(line, sizeof(line), log))
		if (!strncmp(line, "libkvpool: auto://", 18))
			n++;
	return n;
}

struct auto_env {
	struct fake fk;
	struct fake_rdma_server fs;
	FILE *log;
	int saved_stderr;
	char url[64];
};

static void auto_open(struct auto_env *a)
{
	fake_verbs_reset();
	F.loopback = 1;
	kvc_rdma_test_ops = &fake_verbs_ops;
	a->fs.limits = frs_limits;
	a->fs.port = 7472;
	frs_start(&a->fs);
	a->fk.limits = fake_default_limits;
	a->fk.limits.rdma_port = 7472;
	fake_start(&a->fk, 0);
	snprintf(a->url, sizeof(a->url), "auto://127.0.0.1:%u", a->fk.port);
	a->log = tmpfile();
	assert_non_null(a->log);
	fflush(stderr);
	a->saved_stderr = dup(2);
	assert_true(dup2(fileno(a->log), 2) >= 0);
}

static void auto_close(struct auto_env *a)
{
	fflush(stderr);
	dup2(a->saved_stderr, 2);
	close(a->saved_stderr);
	fclose(a->log);
	fake_stop(&a->fk);
	fake_release(&a->fk);
	frs_stop(&a->fs);
	assert_int_equal(F.live, 0);
	kvc_rdma_test_ops = NULL;
}

/* The HELLO reply offers rdma_port: the handle moves to RDMA, its
 * requests reach the RDMA server, not the TCP one. */
static void test_auto_moves_to_rdma(void **state)
{
	struct auto_env *a = calloc(1, sizeof(*a));
	struct kvpool_options opts = { .timeout_ms = 2000 };
	struct kvpool_client *c = NULL;
	uint8_t data[3000], back[3000], key[KVPOOL_KEY_BYTES];
	uint64_t len = 0;
	int lines;

	(void)state;
	auto_open(a);
	assert_int_equal(kvpool_connect(a->url, "ns-auto", &opts, &c), 0);
	assert_non_null(c->rdma);
	assert_int_equal(a->fs.msgs[PROTO_OP_HELLO], 1);
	assert_string_equal(a->fs.hello_ns, "ns-auto");
	fill(data, sizeof(data), 11);
	key_of(key, 50);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_get_bytes(c, key, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
	assert_int_equal(a->fs.msgs[PROTO_OP_PUT], 1);
	assert_int_equal(a->fs.msgs[PROTO_OP_GET], 1);
	assert_int_equal(a->fk.frames[PROTO_OP_PUT], 0);
	assert_int_equal(a->fk.frames[PROTO_OP_GET], 0);
	/* The limits are the RDMA server's now. */
	assert_int_equal(c->limits.max_batch_blocks, frs_limits.max_batch_blocks);
	/* Lost connection: TCP again, then RDMA again; said once. */
	kvc_disconnect(c);
	assert_int_equal(kvpool_get_bytes(c, key, back, sizeof(back), &len), 0);
	assert_int_equal(a->fk.connections, 2);
	assert_int_equal(a->fs.accepted, 2);
	kvpool_close(c);
	lines = count_auto_lines(a->log);
	auto_close(a);
	assert_int_equal(lines, 1);
	free(a);
}

/* Memory registration fails (RLIMIT_MEMLOCK): the handle stays on TCP,
 * says so once, also after a reconnect, and works. */
static void test_auto_registration_fails(void **state)
{
	struct auto_env *a = calloc(1, sizeof(*a));
	struct kvpool_options opts = { .timeout_ms = 2000 };
	struct kvpool_client *c = NULL;
	uint8_t data[3000], back[3000], key[KVPOOL_KEY_BYTES];
	uint64_t len = 0;
	char line[512] = "";
	int lines;

	(void)state;
	auto_open(a);
	F.reg_mr_errno = EPERM;
	assert_int_equal(kvpool_connect(a->url, "ns-auto", &opts, &c), 0);
	assert_null(c->rdma);
	assert_true(c->fd >= 0);
	fill(data, sizeof(data), 12);
	key_of(key, 60);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	kvc_disconnect(c);
	assert_int_equal(kvpool_get_bytes(c, key, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
	assert_int_equal(a->fk.frames[PROTO_OP_PUT], 1);
	assert_int_equal(a->fk.connections, 2);
	assert_int_equal(a->fs.accepted, 0);
	kvpool_close(c);
	F.reg_mr_errno = 0;
	lines = count_auto_lines(a->log);
	rewind(a->log);
	assert_non_null(fgets(line, sizeof(line), a->log));
	auto_close(a);
	assert_int_equal(lines, 1);
	assert_non_null(strstr(line, "using tcp"));
	free(a);
}

#define RDMA_TEST(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		RDMA_TEST(test_registered_zero_copy),
		RDMA_TEST(test_unregistered_staging),
		RDMA_TEST(test_batch_split),
		RDMA_TEST(test_staging_pieces),
		RDMA_TEST(test_corrupt_get),
		RDMA_TEST(test_read_fails),
		RDMA_TEST(test_drop_mid_request),
		RDMA_TEST(test_drop_between_calls),
		RDMA_TEST(test_get_too_large),
		RDMA_TEST(test_timeout),
		RDMA_TEST(test_register_errors),
		cmocka_unit_test(test_auto_moves_to_rdma),
		cmocka_unit_test(test_auto_registration_fails),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* !KVPOOL_RDMA */

/* Without RDMA, rdma:// is refused with -EOPNOTSUPP and no handle. */
static void test_rdma_url_stub(void **state)
{
	struct kvpool_client *c = (struct kvpool_client *)0x1;

	(void)state;
	assert_int_equal(kvpool_connect("rdma://127.0.0.1", "ns", NULL, &c), -EOPNOTSUPP);
	assert_ptr_equal(c, (struct kvpool_client *)0x1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rdma_url_stub),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* KVPOOL_RDMA */
