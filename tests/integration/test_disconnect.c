/*
 * test_disconnect.c - PUTs whose connection dies half way leave nothing
 * visible and leak no arena space; a stalled payload is cut off
 * payload_timeout_ms after its header, a steady one that is whole by then
 * is not.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define BIG_BYTES (4u << 20)
#define ROUNDS 20

static struct {
	struct harness_server srv;
	struct harness_server srv2; /* test_payload_timeout's own server */
	struct harness_server srv3; /* test_idle_timeout's own server */
	struct harness_server srv4; /* test_inflight_busy's own server */
	struct kvpool_client *c; /* namespace "disc" */
	uint8_t *payload;        /* BIG_BYTES */
} g;

static int group_setup(void **state)
{
	(void)state;
	g.payload = malloc(BIG_BYTES);
	if (!g.payload)
		return -1;
	harness_fill(g.payload, BIG_BYTES, 99);
	if (harness_group_start(&g.srv, harness_default_flags))
		return -1;
	return harness_group_client(&g.srv, "disc", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	harness_kill(&g.srv2);
	harness_kill(&g.srv3);
	harness_kill(&g.srv4);
	free(g.payload);
	return 0;
}

/* Close with a RST instead of a FIN (SO_LINGER 0). */
static void close_abortive(int fd)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };

	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

/* Bytes of payload sent before the connection dies, per round. */
static int64_t cut_of_round(int round)
{
	static const int64_t cuts[] = {
		1 << 20, 0, 1, 4095, 4096, (2 << 20) + 7, BIG_BYTES - 1, -1, 65536, 3 << 20,
	};

	return cuts[round % (int)(sizeof(cuts) / sizeof(cuts[0]))];
}

/* One PUT announcing 4 MiB that dies after `cut` payload bytes (-1: in the
 * middle of the header). */
static void put_and_vanish(const uint8_t key[32], int64_t cut, int abortive, int check_inflight)
{
	int fd = harness_raw_session_or_fail(g.srv.port, "disc", NULL);

	if (cut < 0) {
		uint8_t hdr[PROTO_HEADER_BYTES];
		struct proto_header h = {
			.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PUT,
			.body_bytes = PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES,
			.request_id = 2, .payload_bytes = BIG_BYTES,
		};

		proto_header_encode(&h, hdr);
		assert_int_equal(harness_send_all(fd, hdr, 10), 0);
	} else {
		assert_int_equal(harness_raw_put(fd, 2, key, NULL, g.payload, BIG_BYTES,
						 harness_xxh3(g.payload, BIG_BYTES), (uint64_t)cut),
				 0);
	}
	if (check_inflight) {
		/* The server reserved the whole block while its bytes arrive. */
		uint64_t inflight = harness_wait_stat_at_least_or_fail(
			g.c, "tiers.dram.inflight_put_bytes", BIG_BYTES, 3000);

		assert_true(inflight >= BIG_BYTES);
		harness_check_absent_or_fail(g.c, key);
	}
	if (abortive)
		close_abortive(fd);
	else
		close(fd);
}

static void test_disconnect_mid_payload(void **state)
{
	uint64_t used0, blocks0, inflight, used;
	uint8_t key[32];

	(void)state;
	harness_need_server(&g.srv);
	used0 = harness_stat_or_fail(g.c, "tiers.dram.used_bytes");
	blocks0 = harness_stat_or_fail(g.c, "tiers.dram.blocks");
	for (int round = 0; round < ROUNDS; round++) {
		harness_key(key, "disc", (uint64_t)round);
		put_and_vanish(key, cut_of_round(round), round % 2, round == 0);
		inflight = harness_wait_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes", 0, 3000);
		if (inflight != 0)
			fail_msg("round %d: inflight_put_bytes stays %llu after disconnect", round,
				 (unsigned long long)inflight);
		used = harness_stat_or_fail(g.c, "tiers.dram.used_bytes");
		if (used != used0)
			fail_msg("round %d: used_bytes %llu, was %llu", round,
				 (unsigned long long)used, (unsigned long long)used0);
		harness_check_absent_or_fail(g.c, key);
	}
	assert_int_equal(harness_ns_stat_or_fail(g.c, "disc", "blocks"), 0);
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.blocks"), blocks0);
	assert_int_equal(harness_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes"), 0);

	/* And the space is really free: a full put of the same size works. */
	harness_key(key, "disc-after", 0);
	assert_int_equal(kvpool_put_bytes(g.c, key, NULL, g.payload, BIG_BYTES), 0);
	harness_check_block_or_fail(g.c, key, g.payload, BIG_BYTES);
}

/* A batch of three where the connection dies inside the second block:
 * the third never becomes visible, and a visible first block is whole. */
static void test_disconnect_mid_batch(void **state)
{
	enum { N = 3, LEN = 1 << 20 };
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + N * PROTO_PUT_ENTRY_BYTES];
	uint8_t keys[N][32];
	int fd, st[N];

	(void)state;
	harness_need_server(&g.srv);
	proto_batch_encode_prefix(body, N, 0);
	for (int i = 0; i < N; i++) {
		struct proto_put_entry e = { .length = LEN };

		harness_key(keys[i], "disc-batch", (uint64_t)i);
		memcpy(e.key, keys[i], 32);
		e.checksum = harness_xxh3(g.payload + (size_t)i * LEN, LEN);
		proto_put_entry_encode(body, (uint32_t)i, &e);
	}
	fd = harness_raw_session_or_fail(g.srv.port, "disc", NULL);
	{
		/* Announce all three blocks, send one and a half. */
		struct proto_header h = {
			.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PUT,
			.body_bytes = sizeof(body), .request_id = 5, .payload_bytes = N * LEN,
		};
		uint8_t hdr[PROTO_HEADER_BYTES];

		proto_header_encode(&h, hdr);
		assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
		assert_int_equal(harness_send_all(fd, body, sizeof(body)), 0);
		assert_int_equal(harness_send_all(fd, g.payload, LEN + LEN / 2), 0);
	}
	/* No reply may come for a frame whose payload has not all arrived. */
	{
		struct harness_frame f;

		assert_int_equal(harness_read_frame(fd, 200, &f), -ETIMEDOUT);
	}
	close(fd);
	assert_int_equal(harness_wait_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes", 0, 3000),
			 0);
	assert_int_equal(kvpool_exists(g.c, (const uint8_t(*)[32])keys, N, st), 0);
	assert_int_equal(st[1], -ENOENT);
	assert_int_equal(st[2], -ENOENT);
	if (st[0] == 0) {
		harness_check_block_or_fail(g.c, keys[0], g.payload, LEN);
		assert_int_equal(kvpool_delete(g.c, (const uint8_t(*)[32])keys[0], 1, NULL), 0);
	} else {
		assert_int_equal(st[0], -ENOENT);
	}
}

/* A second server with --payload-timeout-ms 500. */
static void test_payload_timeout(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "32MiB", "--max-block-bytes", "4MiB", "--threads", "2",
		"--log-level", "warn", "--payload-timeout-ms", "500", NULL,
	};
	struct harness_server *srv = &g.srv2;
	struct kvpool_client *c = NULL;
	uint8_t key[32], slow_key[32];
	uint64_t t0, elapsed;
	struct harness_frame f;
	struct proto_result res;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(srv, flags), 0);
	assert_int_equal(harness_client(srv, "disc-timeout", &c), 0);

	/* Half a payload, then silence: the server hangs up. */
	harness_key(key, "disc-timeout", 0);
	fd = harness_raw_session_or_fail(srv->port, "disc-timeout", NULL);
	assert_int_equal(harness_raw_put(fd, 9, key, NULL, g.payload, BIG_BYTES,
					 harness_xxh3(g.payload, BIG_BYTES), BIG_BYTES / 2),
			 0);
	t0 = harness_now_ms();
	assert_int_equal(harness_wait_closed(fd, 5000), 0);
	elapsed = harness_now_ms() - t0;
	close(fd);
	assert_true(elapsed >= 300);
	assert_true(elapsed < 5000);
	assert_int_equal(harness_wait_stat_or_fail(c, "tiers.dram.inflight_put_bytes", 0, 3000), 0);
	assert_int_equal(harness_stat_or_fail(c, "tiers.dram.used_bytes"), 0);
	harness_check_absent_or_fail(c, key);

	/* A steady payload that is whole within the deadline (a chunk every
	 * 25 ms, 200 ms in all, against 500 ms) is not cut off. */
	harness_key(slow_key, "disc-slow", 0);
	fd = harness_raw_session_or_fail(srv->port, "disc-timeout", NULL);
	assert_int_equal(harness_raw_put(fd, 10, slow_key, NULL, g.payload, 1 << 20,
					 harness_xxh3(g.payload, 1 << 20), 0),
			 0);
	for (int i = 0; i < 8; i++) {
		harness_sleep_ms(25);
		assert_int_equal(harness_send_all(fd, g.payload + (size_t)i * (128 << 10), 128 << 10),
				 0);
	}
	assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
	assert_int_equal(f.h.request_id, 10);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(harness_reply_result(&f, 0, &res), 0);
	assert_int_equal(res.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	close(fd);
	harness_check_block_or_fail(c, slow_key, g.payload, 1 << 20);

	kvpool_close(c);
	assert_int_equal(harness_stop(srv), 0);
}

/* --idle-timeout-ms 400: a silent connection is closed without a reply,
 * one that keeps talking is not, and the library gets over the close. */
static void test_idle_timeout(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "warn", "--idle-timeout-ms", "400", NULL,
	};
	struct harness_server *srv = &g.srv3;
	struct kvpool_client *c = NULL;
	uint64_t t0, elapsed;
	int quiet = -1, chatty = -1, rc;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(srv, flags), 0);
	quiet = harness_raw_session_or_fail(srv->port, "disc-idle", NULL);
	chatty = harness_raw_session_or_fail(srv->port, "disc-idle", NULL);
	t0 = harness_now_ms();
	/* chatty pings every 100 ms for 1.2 s: never idle for 400 ms. */
	for (int i = 0; i < 12; i++) {
		struct harness_frame f;

		harness_sleep_ms(100);
		assert_int_equal(harness_send_frame(chatty, PROTO_OP_PING, (uint64_t)i, NULL, 0, NULL,
						    0),
				 0);
		assert_int_equal(harness_read_frame(chatty, 2000, &f), 0);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		harness_frame_free(&f);
	}
	/* quiet was closed by now, without a reply. */
	assert_int_equal(harness_wait_closed(quiet, 3000), 0);
	elapsed = harness_now_ms() - t0;
	assert_true(elapsed >= 300);
	close(quiet);
	close(chatty);

	/* The library: idle past the timeout, then a call fails fast or
	 * works, and the next one works. */
	assert_int_equal(harness_client(srv, "disc-idle", &c), 0);
	assert_int_equal(kvpool_ping(c, NULL), 0);
	harness_sleep_ms(800);
	t0 = harness_now_ms();
	rc = kvpool_ping(c, NULL);
	assert_true(harness_now_ms() - t0 < 2000);
	if (rc)
		assert_int_equal(kvpool_ping(c, NULL), 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(srv), 0);
}

/* --max-inflight-put-bytes 2MiB: with two 1 MiB payloads half received,
 * a third PUT gets BUSY on each of libkvpool's KVPOOL_BUSY_TRIES tries,
 * then -EAGAIN, and stores nothing; it works once they are done. */
static void test_inflight_busy(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "2",
		"--log-level", "warn", "--max-inflight-put-bytes", "2MiB", NULL,
	};
	const uint64_t len = 1 << 20;
	struct harness_server *srv = &g.srv4;
	struct kvpool_client *c = NULL;
	uint8_t keys[2][32], key[32], small[4096];
	uint64_t busy0;
	int fds[2] = { -1, -1 }, st = 1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(srv, flags), 0);
	assert_int_equal(harness_client(srv, "disc-busy", &c), 0);
	busy0 = harness_stat_or_fail(c, "ops.errors.busy");
	for (int i = 0; i < 2; i++) {
		harness_key(keys[i], "disc-busy-slow", (uint64_t)i);
		fds[i] = harness_raw_session_or_fail(srv->port, "disc-busy", NULL);
		assert_int_equal(harness_raw_put(fds[i], 40, keys[i], NULL, g.payload, len,
						 harness_xxh3(g.payload, len), len / 2),
				 0);
	}
	assert_int_equal(harness_wait_stat_or_fail(c, "tiers.dram.inflight_put_bytes", 2 * len, 3000),
			 2 * len);

	harness_key(key, "disc-busy", 0);
	harness_fill(small, sizeof(small), 12);
	{
		struct iovec iov = { .iov_base = small, .iov_len = sizeof(small) };
		struct kvpool_put_block pb = { .key = key, .iov = &iov, .iovcnt = 1 };

		assert_int_equal(kvpool_put(c, &pb, 1, &st), -EAGAIN);
		assert_int_equal(st, -EAGAIN);
	}
	harness_check_absent_or_fail(c, key);
	assert_int_equal(harness_stat_or_fail(c, "ops.errors.busy") - busy0, KVPOOL_BUSY_TRIES);

	/* The slow ones finish; then there is budget again. */
	for (int i = 0; i < 2; i++) {
		struct harness_frame f;
		struct proto_result res;

		assert_int_equal(harness_send_all(fds[i], g.payload + len / 2, len - len / 2), 0);
		assert_int_equal(harness_read_frame(fds[i], 5000, &f), 0);
		assert_int_equal(harness_reply_result(&f, 0, &res), 0);
		assert_int_equal(res.status, PROTO_STATUS_OK);
		harness_frame_free(&f);
		close(fds[i]);
	}
	assert_int_equal(harness_wait_stat_or_fail(c, "tiers.dram.inflight_put_bytes", 0, 3000), 0);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, small, sizeof(small)), 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(srv), 0);
}

/* SIGTERM while a PUT payload is stalled: the server still exits 0 in
 * time, and the half block does not hold it. */
static void test_clean_shutdown(void **state)
{
	uint8_t key[32];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "disc-shutdown", 0);
	fd = harness_raw_session_or_fail(g.srv.port, "disc", NULL);
	assert_int_equal(harness_raw_put(fd, 30, key, NULL, g.payload, BIG_BYTES,
					 harness_xxh3(g.payload, BIG_BYTES), BIG_BYTES / 3),
			 0);
	assert_int_equal(harness_stop(&g.srv), 0);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_disconnect_mid_payload),
		cmocka_unit_test(test_disconnect_mid_batch),
		cmocka_unit_test(test_payload_timeout),
		cmocka_unit_test(test_idle_timeout),
		cmocka_unit_test(test_inflight_busy),
		cmocka_unit_test(test_clean_shutdown),
	};

	return cmocka_run_group_tests_name("integ_disconnect", tests, group_setup, group_teardown);
}
