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
#include "lib/api/testing.h"
#include "lib/clock.h"
#include "lib/net/rdma.h"

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

/* What the test sees inside a handle (lib/api/testing.h). */
static struct kvc_engine_info info(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i;
}

static int on_rdma(const struct kvpool_client *c)
{
	const char *t = info(c).transport;

	return t && !strcmp(t, "rdma");
}

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
	assert_null(info(e->c).stage);
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
	assert_non_null(info(e->c).stage);
	lo = (uintptr_t)info(e->c).stage;
	hi = lo + info(e->c).stage_bytes;
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
	assert_int_equal(info(e->c).max_wire_frames, 2); /* zero copy: pipelined */
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
	assert_int_equal(info(e->c).stage_bytes, 4 * BLOCK_BYTES);
	assert_int_equal(e->fs.msgs[PROTO_OP_PUT], 3);
	assert_int_equal(get_n(e->c, dst, n, bytes, 2000), 0);
	assert_int_equal(e->fs.msgs[PROTO_OP_GET], 3);
	assert_memory_equal(src, dst, n * bytes);
	assert_int_equal(info(e->c).max_wire_frames, 1); /* staged frames go alone */
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
	assert_int_equal(info(e->c).rdma_connects, 2);
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
	assert_null(kvc_region_find(e->c, buf, 1)->mr);
	assert_int_equal(put_n(e->c, buf, 2, 4096, 40), 0);
	assert_non_null(kvc_region_find(e->c, buf, 1)->mr);
	assert_null(info(e->c).stage);
	/* A registration the fake refuses: the error, and no region. */
	F.reg_mr_errno = EPERM;
	assert_int_equal(kvpool_register(e->c, other, sizeof(other)), -EPERM);
	F.reg_mr_errno = 0;
	assert_int_equal(kvpool_unregister(e->c, other), -ENOENT);
	assert_int_equal(kvpool_unregister(e->c, buf), 0);
}

/* ---- asynchronous calls ------------------------------------------------- */

/* One completion, waited for. */
static struct kvpool_completion one_completion(struct kvpool_client *c)
{
	struct kvpool_completion comp;

	assert_int_equal(kvpool_poll(c, &comp, 1, 5000), 1);
	return comp;
}

/* Submits return at once on RDMA, requests are in flight, and cancel
 * works where it can: a GET through staging on the wire (the server
 * writes only into the handle's staging buffer) and one not sent yet are
 * cancelled; a GET whose buffer the server was given (a registered
 * region) cannot be, -EINPROGRESS, and completes as usual (here: its
 * timeout, the server's WRITE being held in the fabric). The buffers of
 * cancelled requests are never written; the next call reconnects. */
static void test_async_cancel(void **state)
{
	struct env *e = *state;
	static uint8_t data[BLOCK_BYTES], reg[BLOCK_BYTES], st2[BLOCK_BYTES], st3[BLOCK_BYTES];
	uint8_t key[KVPOOL_KEY_BYTES];
	struct iovec io[3] = { { reg, sizeof(reg) }, { st2, sizeof(st2) }, { st3, sizeof(st3) } };
	struct kvpool_get_block gb[3];
	struct kvpool_completion comp;
	uint64_t id[3];
	int gets, st[3];

	fill(data, sizeof(data), 70);
	key_of(key, 70);
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_register(e->c, reg, sizeof(reg)), 0);
	memset(st2, 0xa5, sizeof(st2));
	memset(st3, 0xa5, sizeof(st3));
	for (int i = 0; i < 3; i++)
		gb[i] = (struct kvpool_get_block){ .key = key, .iov = &io[i], .iovcnt = 1 };
	kvpool_set_timeout(e->c, 600);
	gets = e->fs.msgs[PROTO_OP_GET];
	F.xfer_hold = 1; /* the server's WRITEs never complete: no replies */
	assert_int_equal(kvpool_submit_get(e->c, &gb[0], 1, &st[0], 0, &id[0]), 0);
	assert_int_equal(kvpool_submit_get(e->c, &gb[1], 1, &st[1], 1, &id[1]), 0);
	assert_int_equal(kvpool_submit_get(e->c, &gb[2], 1, &st[2], 2, &id[2]), 0);
	assert_int_equal(kvpool_inflight(e->c), 3);
	/* The first two are on the wire (the server queues the second behind
	 * the first's transfer); the third waits for the staging buffer. */
	for (int i = 0; i < 2000 && e->fs.max_queued < 1; i++)
		usleep(1000);
	assert_int_equal(e->fs.msgs[PROTO_OP_GET], gets + 1);
	assert_int_equal(e->fs.max_queued, 1);
	assert_int_equal(kvpool_cancel(e->c, id[0]), -EINPROGRESS);
	assert_int_equal(kvpool_cancel(e->c, id[2]), 0);
	assert_int_equal(kvpool_cancel(e->c, id[1]), 0);
	assert_int_equal(kvpool_cancel(e->c, id[1]), -ENOENT);
	comp = one_completion(e->c);
	assert_int_equal(comp.id, id[2]);
	assert_int_equal(comp.status, -ECANCELED);
	comp = one_completion(e->c);
	assert_int_equal(comp.id, id[1]);
	assert_int_equal(comp.status, -ECANCELED);
	comp = one_completion(e->c);
	assert_int_equal(comp.id, id[0]);
	assert_int_equal(comp.status, -ETIMEDOUT);
	assert_int_equal(e->fs.max_queued, 1); /* the third never went */
	for (size_t i = 0; i < sizeof(st2); i++)
		assert_true(st2[i] == 0xa5 && st3[i] == 0xa5);
	F.xfer_hold = 0;
	assert_int_equal(kvpool_get(e->c, &gb[1], 1, NULL), 0);
	assert_memory_equal(st2, data, sizeof(data));
	assert_int_equal(kvpool_unregister(e->c, reg), 0);
}

/* A cluster handle of two rdma:// nodes (both reach the one fake server
 * here, as two connections): kvpool_register on the cluster reaches
 * every node's connection, so PUT and GET describe the caller's own
 * addresses to the server on both (zero copy; a node without the region
 * would describe its staging buffer), and the bytes come back exact. */
static void test_cluster_register(void **state)
{
	struct env *e = *state;
	enum { NB = 16 };
	static uint8_t src[NB * BLOCK_BYTES], dst[NB * BLOCK_BYTES];
	struct kvpool_options opts = { .timeout_ms = 2000 };
	struct kvpool_client *cl = NULL;
	const char *names[2] = { "127.0.0.1:7472", "127.0.0.2:7472" };
	int on[2] = { 0, 0 }, descs;

	fill(src, sizeof(src), 80);
	assert_int_equal(kvpool_connect("rdma://127.0.0.1:7472,127.0.0.2:7472", "ns-cl", &opts,
					&cl), 0);
	assert_int_equal(kvpool_register(cl, src, sizeof(src)), 0);
	assert_int_equal(kvpool_register(cl, dst, sizeof(dst)), 0);
	descs = e->fs.n_desc;
	assert_int_equal(put_n(cl, src, NB, BLOCK_BYTES, 800), 0);
	assert_int_equal(get_n(cl, dst, NB, BLOCK_BYTES, 800), 0);
	assert_memory_equal(src, dst, sizeof(src));
	assert_int_equal(e->fs.n_desc, descs + 2 * NB);
	for (int i = descs; i < descs + 2 * NB; i++) {
		uint64_t a = e->fs.desc_addr[i];
		int in_src = a >= (uint64_t)(uintptr_t)src && a < (uint64_t)(uintptr_t)(src + sizeof(src));
		int in_dst = a >= (uint64_t)(uintptr_t)dst && a < (uint64_t)(uintptr_t)(dst + sizeof(dst));

		assert_true(in_src || in_dst);
	}
	for (unsigned int i = 0; i < NB; i++) {
		uint8_t key[KVPOOL_KEY_BYTES];

		key_of(key, 800 + i);
		on[kvpool_hrw_owner(key, names, 2)]++;
	}
	assert_true(on[0] > 0 && on[1] > 0); /* both nodes took part */
	assert_int_equal(e->fs.accepted, 3);   /* the setup's handle, then one per node */
	kvpool_close(cl);
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
	assert_true(on_rdma(c));
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
	assert_int_equal(info(c).limits.max_batch_blocks, frs_limits.max_batch_blocks);
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
	assert_false(on_rdma(c));
	assert_true(info(c).fd >= 0);
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
		RDMA_TEST(test_async_cancel),
		RDMA_TEST(test_cluster_register),
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
