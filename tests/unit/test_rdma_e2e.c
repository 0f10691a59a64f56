/*
 * test_rdma_e2e.c - libkvpool against kvpoold over RDMA, both in this
 * process on the loopback fake fabric (fake_verbs.h): kvpoold (srv_run
 * on a thread, srv_rdma_test_ops) and a kvpool handle (kvc_rdma_test_ops).
 * rdma:// and auto:// (TCP HELLO, then RDMA) put and get byte for byte
 * from registered memory (zero copy) and from other memory (staging),
 * the server's RDMA counters agree, and a failed RDMA READ makes nothing
 * visible while the handle reconnects and goes on; a failed WRITE fails
 * the get and releases the server's pins; a too-small GET buffer, MATCH
 * with a lease, and a PUT batch split at rdmx_max_batch. No device is used;
 * this is not a hardware test. In an RDMA=0 build there is nothing to run.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cmocka.h>

#include "rdmx.h"

#ifndef KVPOOL_RDMA

static void test_not_built(void **state)
{
	(void)state;
	assert_false(rdmx_built());
	skip();
}

/* Skipped as a whole (exit 77, as tests/run.sh expects). */
int main(void)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_not_built) };
	int failed = cmocka_run_group_tests(tests, NULL, NULL);

	return failed ? failed : 77;
}

#else /* KVPOOL_RDMA */

#include "conf.h"
#include "fake_verbs.h"
#include "kvpool.h"
#include "lib/api/testing.h"
#include "lib/net/rdma.h"
#include "srv_rdma.h"
#include "srv_server.h"

/* Is the handle on RDMA (lib/api/testing.h)? */
static int on_rdma(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i.transport && !strcmp(i.transport, "rdma");
}

#define F fake_verbs
#define N_BLOCKS 40u
#define REGION_BYTES (8u << 20)

static pthread_t srv_thread;
static int srv_rc = -1;
static uint16_t tcp_port;

static void *srv_thread_main(void *arg)
{
	srv_rc = srv_run(arg, 0, NULL);
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

/* kvpoold on a thread: TCP on a free port, RDMA through the loopback fake
 * fabric, which libkvpool uses too. */
static int group_setup(void **state)
{
	static struct conf c;

	(void)state;
	fake_verbs_reset();
	F.loopback = 1;
	srv_rdma_test_ops = &fake_verbs_ops;
	kvc_rdma_test_ops = &fake_verbs_ops;
	conf_defaults(&c);
	snprintf(c.listen, sizeof(c.listen), "127.0.0.1");
	tcp_port = free_port();
	c.port = tcp_port;
	c.admin_port = 0;
	c.threads = 2;
	c.dram_capacity_bytes = 64ull << 20;
	c.log_level = SRV_LOG_ERROR;
	if (!tcp_port || pthread_create(&srv_thread, NULL, srv_thread_main, &c))
		return -1;
	return 0;
}

/* SIGTERM; kvpoold returns 0 and nothing of the fake fabric is left. */
static int group_teardown(void **state)
{
	(void)state;
	kill(getpid(), SIGTERM);
	pthread_join(srv_thread, NULL);
	srv_rdma_test_ops = NULL;
	kvc_rdma_test_ops = NULL;
	if (srv_rc != 0 || F.live != 0) {
		fprintf(stderr, "srv_run returned %d, %d fake objects alive\n", srv_rc, F.live);
		return -1;
	}
	return 0;
}

/* Connect to url (retrying while kvpoold starts). */
static struct kvpool_client *connect_or_fail(const char *url, const char *ns)
{
	struct kvpool_options opts = { .timeout_ms = 3000 };
	struct kvpool_client *c = NULL;
	int rc = -1;

	for (int i = 0; i < 500 && rc; i++) {
		rc = kvpool_connect(url, ns, &opts, &c);
		if (rc)
			usleep(10000);
	}
	assert_int_equal(rc, 0);
	return c;
}

static void key_of(uint8_t key[KVPOOL_KEY_BYTES], uint32_t seed)
{
	for (int i = 0; i < KVPOOL_KEY_BYTES; i++)
		key[i] = (uint8_t)(seed * 37 + i * 11 + 5);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 13 + seed * 29 + (i >> 11));
}

/* A number from the server's STATS document: the value after `key`. */
static uint64_t stat_of(struct kvpool_client *c, const char *key)
{
	char *doc = NULL, *p;
	uint64_t v;

	assert_int_equal(kvpool_stats(c, NULL, &doc), 0);
	p = strstr(doc, key);
	assert_non_null(p);
	v = strtoull(p + strlen(key), NULL, 10);
	kvpool_free(doc);
	return v;
}

/* Block i's length: 1 byte .. ~200 KiB, varied. */
static size_t block_len(uint32_t i)
{
	return 1 + (size_t)i * 5003 % (200u << 10);
}

/* Put N_BLOCKS blocks from `src` (registered or not), get them back into
 * `dst`, compare; the server's READ and WRITE byte counters grow by the
 * total. */
static void roundtrip(struct kvpool_client *c, uint8_t *src, uint8_t *dst, uint32_t seed)
{
	static uint8_t keys[N_BLOCKS][KVPOOL_KEY_BYTES];
	static struct iovec piov[N_BLOCKS], giov[N_BLOCKS];
	static struct kvpool_put_block pb[N_BLOCKS];
	static struct kvpool_get_block gb[N_BLOCKS];
	int st[N_BLOCKS];
	uint64_t read0 = stat_of(c, "\"bytes_read\":"), written0 = stat_of(c, "\"bytes_written\":");
	size_t off = 0;

	for (uint32_t i = 0; i < N_BLOCKS; i++) {
		size_t n = block_len(i);

		key_of(keys[i], seed + i);
		fill(src + off, n, seed + i);
		piov[i] = (struct iovec){ src + off, n };
		giov[i] = (struct iovec){ dst + off, n };
		pb[i] = (struct kvpool_put_block){ .key = keys[i], .iov = &piov[i], .iovcnt = 1 };
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
		off += n;
	}
	assert_true(off <= REGION_BYTES / 2);
	memset(dst, 0, off);
	assert_int_equal(kvpool_put(c, pb, N_BLOCKS, st), 0);
	assert_int_equal(kvpool_get(c, gb, N_BLOCKS, st), 0);
	for (uint32_t i = 0; i < N_BLOCKS; i++)
		assert_int_equal(gb[i].length, block_len(i));
	assert_memory_equal(dst, src, off);
	assert_int_equal(stat_of(c, "\"bytes_read\":") - read0, off);
	assert_int_equal(stat_of(c, "\"bytes_written\":") - written0, off);
}

/* rdma://: from and into a registered region (zero copy), then from and
 * into plain heap memory (libkvpool's staging buffer). */
static void test_rdma_url(void **state)
{
	uint8_t *region = malloc(REGION_BYTES), *heap = malloc(REGION_BYTES);
	struct kvpool_client *c;

	(void)state;
	assert_non_null(region);
	assert_non_null(heap);
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e");
	assert_true(on_rdma(c));
	assert_int_equal(kvpool_register(c, region, REGION_BYTES), 0);
	roundtrip(c, region, region + REGION_BYTES / 2, 100);
	roundtrip(c, heap, heap + REGION_BYTES / 2, 200);
	assert_true(stat_of(c, "\"rdma\":{\"built\":true,\"available\":true,\"port\":7472,"
			       "\"reason\":\"\",\"connections\":{\"current\":") >= 1);
	assert_int_equal(kvpool_unregister(c, region), 0);
	kvpool_close(c);
	free(region);
	free(heap);
}

/* auto://: HELLO over TCP offers kvpoold's rdma_port, the handle moves to
 * RDMA and its blocks travel by READ/WRITE. */
static void test_auto_moves_to_rdma(void **state)
{
	uint8_t *heap = malloc(REGION_BYTES);
	struct kvpool_limits lim;
	struct kvpool_client *c;
	char url[64];

	(void)state;
	assert_non_null(heap);
	snprintf(url, sizeof(url), "auto://127.0.0.1:%u", tcp_port);
	c = connect_or_fail(url, "e2e-auto");
	assert_true(on_rdma(c));
	assert_int_equal(kvpool_get_limits(c, &lim), 0);
	assert_int_equal(lim.rdma_port, 7472);
	roundtrip(c, heap, heap + REGION_BYTES / 2, 300);
	kvpool_close(c);
	free(heap);
}

/* The server's READ of a PUT fails: the call fails, nothing of it is
 * visible, and the handle reconnects for the next call, which works. */
static void test_failed_read_nothing_visible(void **state)
{
	static uint8_t data[100000];
	uint8_t key[KVPOOL_KEY_BYTES];
	struct kvpool_client *c;
	int st = 0;

	(void)state;
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-fail");
	fill(data, sizeof(data), 7);
	key_of(key, 900);
	F.xfer_status = IBV_WC_REM_OP_ERR;
	F.xfer_status_at = F.posted_xfer + 1;
	assert_true(kvpool_put_bytes(c, key, NULL, data, sizeof(data)) < 0);
	F.xfer_status_at = 0;
	assert_int_equal(kvpool_exists(c, key, 1, &st), 0);
	assert_int_equal(st, -ENOENT);
	assert_int_equal(stat_of(c, "\"inflight_put_bytes\":"), 0);
	assert_true(stat_of(c, "\"transfer_errors\":") >= 1);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_exists(c, key, 1, &st), 0);
	assert_int_equal(st, 0);
	kvpool_close(c);
}

/* A GET into a buffer one byte too small: -EMSGSIZE with the block's real
 * length (the server's TOO_LARGE), nothing written; then with room, the
 * bytes. */
static void test_get_small_buffer(void **state)
{
	static uint8_t data[5000], out[5000];
	uint8_t key[KVPOOL_KEY_BYTES];
	struct kvpool_client *c;
	uint64_t len = 0;

	(void)state;
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-small");
	fill(data, sizeof(data), 11);
	key_of(key, 1100);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	memset(out, 0xee, sizeof(out));
	assert_int_equal(kvpool_get_bytes(c, key, out, sizeof(out) - 1, &len), -EMSGSIZE);
	assert_int_equal(len, sizeof(data));
	for (size_t i = 0; i < sizeof(out); i++)
		assert_int_equal(out[i], 0xee);
	len = 0;
	assert_int_equal(kvpool_get_bytes(c, key, out, sizeof(out), &len), 0);
	assert_int_equal(len, sizeof(data));
	assert_memory_equal(out, data, sizeof(data));
	kvpool_close(c);
}

/* MATCH with a lease over RDMA: the leading stored keys of a chain match,
 * their lease pins are counted, and a GET on the handle returns them. */
static void test_match_lease(void **state)
{
	static uint8_t data[3][3000], out[3000];
	uint8_t keys[4][KVPOOL_KEY_BYTES];
	struct kvpool_client *c;
	size_t matched = 99;
	uint64_t leases0;

	(void)state;
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-match");
	for (uint32_t i = 0; i < 4; i++)
		key_of(keys[i], 1200 + i);
	for (uint32_t i = 0; i < 3; i++) {
		fill(data[i], sizeof(data[i]), 1200 + i);
		assert_int_equal(kvpool_put_bytes(c, keys[i], i ? keys[i - 1] : NULL, data[i],
						  sizeof(data[i])), 0);
	}
	leases0 = stat_of(c, "\"leases_active\":");
	assert_int_equal(kvpool_match(c, keys, 4, 2000, &matched), 0);
	assert_int_equal(matched, 3);
	assert_int_equal(stat_of(c, "\"leases_active\":"), leases0 + 3);
	for (uint32_t i = 0; i < 3; i++) {
		uint64_t len = 0;

		assert_int_equal(kvpool_get_bytes(c, keys[i], out, sizeof(out), &len), 0);
		assert_int_equal(len, sizeof(data[i]));
		assert_memory_equal(out, data[i], sizeof(data[i]));
	}
	assert_int_equal(stat_of(c, "\"leases_active\":"), leases0);
	/* Nothing of the chain past its third key. */
	assert_int_equal(kvpool_match(c, keys[3], 1, 0, &matched), 0);
	assert_int_equal(matched, 0);
	kvpool_close(c);
}

/* The server's WRITE of a GET fails: the get fails, the server releases
 * its pins (once the block is deleted its arena bytes are free again),
 * and the handle reconnects for the next call. */
static void test_failed_write_releases_pins(void **state)
{
	static uint8_t data[150000], out[150000];
	uint8_t key[KVPOOL_KEY_BYTES];
	struct kvpool_client *c;
	uint64_t used0, errs0, len = 0;
	int st = 1;

	(void)state;
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-wfail");
	fill(data, sizeof(data), 13);
	key_of(key, 1300);
	used0 = stat_of(c, "\"used_bytes\":");
	errs0 = stat_of(c, "\"transfer_errors\":");
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	assert_true(stat_of(c, "\"used_bytes\":") > used0);
	F.xfer_status = IBV_WC_REM_ACCESS_ERR;
	F.xfer_status_at = F.posted_xfer + 1;
	assert_true(kvpool_get_bytes(c, key, out, sizeof(out), &len) < 0);
	F.xfer_status_at = 0;
	/* The next call reconnects. */
	assert_int_equal(stat_of(c, "\"transfer_errors\":"), errs0 + 1);
	assert_int_equal(kvpool_delete(c, key, 1, &st), 0);
	assert_int_equal(st, 0);
	/* A pin still held would keep the deleted block's bytes in use. */
	for (int i = 0; i < 100 && stat_of(c, "\"used_bytes\":") != used0; i++)
		usleep(10000);
	assert_int_equal(stat_of(c, "\"used_bytes\":"), used0);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	memset(out, 0, sizeof(out));
	assert_int_equal(kvpool_get_bytes(c, key, out, sizeof(out), &len), 0);
	assert_memory_equal(out, data, sizeof(data));
	assert_true(on_rdma(c));
	kvpool_close(c);
}

/* A PUT of more blocks than one RDMA message can describe (629 PUT
 * entries) is split into two requests; every block reads back exact. */
static void test_put_batch_split(void **state)
{
	enum { BLK = 200 };
	uint32_t n = rdmx_max_batch(PROTO_PUT_ENTRY_BYTES) + 11;
	uint8_t (*keys)[KVPOOL_KEY_BYTES] = calloc(n, KVPOOL_KEY_BYTES);
	struct kvpool_put_block *pb = calloc(n, sizeof(*pb));
	struct kvpool_get_block *gb = calloc(n, sizeof(*gb));
	struct iovec *piov = calloc(n, sizeof(*piov)), *giov = calloc(n, sizeof(*giov));
	uint8_t *src = malloc((size_t)n * BLK), *dst = calloc(n, BLK);
	int *st = calloc(n, sizeof(*st));
	struct kvpool_client *c;
	uint64_t puts0, gets0;

	(void)state;
	assert_int_equal(rdmx_max_batch(PROTO_PUT_ENTRY_BYTES), 629);
	assert_true(keys && pb && gb && piov && giov && src && dst && st);
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-split");
	for (uint32_t i = 0; i < n; i++) {
		size_t len = 1 + (i * 7u) % BLK;

		key_of(keys[i], 5000 + i);
		memcpy(keys[i], &i, sizeof(i)); /* key_of repeats every 256 seeds */
		fill(src + (size_t)i * BLK, len, 5000 + i);
		piov[i] = (struct iovec){ src + (size_t)i * BLK, len };
		giov[i] = (struct iovec){ dst + (size_t)i * BLK, BLK };
		pb[i] = (struct kvpool_put_block){ .key = keys[i], .iov = &piov[i], .iovcnt = 1 };
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
	}
	puts0 = stat_of(c, "\"put\":{\"requests\":");
	gets0 = stat_of(c, "\"get\":{\"requests\":");
	assert_int_equal(kvpool_put(c, pb, n, st), 0);
	assert_int_equal(stat_of(c, "\"put\":{\"requests\":") - puts0, 2);
	assert_int_equal(kvpool_get(c, gb, n, st), 0);
	assert_int_equal(stat_of(c, "\"get\":{\"requests\":") - gets0, 1);
	for (uint32_t i = 0; i < n; i++) {
		assert_int_equal(st[i], 0);
		assert_int_equal(gb[i].length, piov[i].iov_len);
		assert_memory_equal(dst + (size_t)i * BLK, src + (size_t)i * BLK, piov[i].iov_len);
	}
	kvpool_close(c);
	free(keys);
	free(pb);
	free(gb);
	free(piov);
	free(giov);
	free(src);
	free(dst);
	free(st);
}

/* Wait for the next completion of c through its event fd (kvpool_poll
 * with timeout 0 after each wake-up, as an event loop does). */
static struct kvpool_completion next_completion(struct kvpool_client *c, int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	struct kvpool_completion comp;

	for (int i = 0; i < 2000; i++) {
		if (kvpool_poll(c, &comp, 1, 0) == 1)
			return comp;
		assert_true(poll(&p, 1, 5000) >= 0);
	}
	fail_msg("no completion");
	return comp;
}

/* The asynchronous calls on RDMA are asynchronous (kvpool.h, "RDMA"; this
 * test asserted they ran in place inside submit before RDMA became a
 * transport of the one engine): a submit returns with its request in
 * flight, the event fd becomes readable when it completes, a GET and a
 * MATCH pipeline and complete in order, and the bytes are right. */
static void test_async_rdma(void **state)
{
	static uint8_t src[70000], dst[70000];
	uint8_t key[KVPOOL_KEY_BYTES];
	struct iovec piov = { src, sizeof(src) }, giov = { dst, sizeof(dst) };
	struct kvpool_put_block pb = { .key = key, .iov = &piov, .iovcnt = 1 };
	struct kvpool_get_block gb = { .key = key, .iov = &giov, .iovcnt = 1 };
	struct kvpool_completion comp;
	struct pollfd p = { .events = POLLIN };
	struct kvpool_client *c;
	uint64_t id;
	size_t one = 1;
	int st = 1;

	(void)state;
	c = connect_or_fail("rdma://127.0.0.1:7472", "e2e-async");
	assert_true(on_rdma(c));
	key_of(key, 900);
	fill(src, sizeof(src), 900);
	p.fd = kvpool_event_fd(c);
	assert_true(p.fd >= 0);
	assert_int_equal(kvpool_submit_put(c, &pb, 1, &st, 1, &id), 0);
	comp = next_completion(c, p.fd);
	assert_int_equal(comp.id, id);
	assert_int_equal(comp.status, 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvpool_submit_get(c, &gb, 1, &st, 2, &id), 0);
	assert_int_equal(kvpool_submit_match(c, key, one, 0, 3, &id), 0);
	assert_int_equal(kvpool_inflight(c), 2);
	comp = next_completion(c, p.fd);
	assert_int_equal(comp.tag, 2);
	assert_int_equal(comp.status, 0);
	assert_int_equal(gb.length, sizeof(src));
	assert_memory_equal(dst, src, sizeof(src));
	comp = next_completion(c, p.fd);
	assert_int_equal(comp.op, KVPOOL_OP_MATCH);
	assert_int_equal(comp.matched, 1);
	assert_int_equal(kvpool_inflight(c), 0);
	assert_int_equal(poll(&p, 1, 0), 0);
	kvpool_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rdma_url),
		cmocka_unit_test(test_async_rdma),
		cmocka_unit_test(test_auto_moves_to_rdma),
		cmocka_unit_test(test_failed_read_nothing_visible),
		cmocka_unit_test(test_get_small_buffer),
		cmocka_unit_test(test_match_lease),
		cmocka_unit_test(test_failed_write_releases_pins),
		cmocka_unit_test(test_put_batch_split),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

#endif /* KVPOOL_RDMA */
