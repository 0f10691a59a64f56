/*
 * test_put_stream.c - the server hashes PUT payloads as they arrive, read
 * by read, so a block split over many small reads (and reads spanning the
 * end of one block and the start of the next) must hash to exactly the
 * bytes sent: a flipped first or last byte of a multi-MiB block is
 * BAD_CHECKSUM, the blocks around it are stored byte-exact, and refused
 * blocks read into the scratch buffer do not disturb the next block's sum.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define MIB (1024u * 1024u)
#define REPLY_MS 20000
#define MAX_BLOCKS 64

static struct {
	struct harness_server srv;
	struct kvpool_client *c; /* namespace "pstream" */
} g;

static int group_setup(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "128MiB", "--max-block-bytes", "8MiB", "--threads", "2",
		"--log-level", "error", "--drain-timeout-ms", "2000", NULL,
	};

	(void)state;
	if (harness_group_start(&g.srv, flags))
		return -1;
	return harness_group_client(&g.srv, "pstream", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	return 0;
}

/* One PUT batch as the test builds it: block i is lens[i] bytes of
 * payload starting at offs[i]; sums[i] is the checksum announced. */
struct batch {
	uint32_t n;
	uint8_t keys[MAX_BLOCKS][32];
	uint64_t lens[MAX_BLOCKS], offs[MAX_BLOCKS], sums[MAX_BLOCKS];
	uint8_t *payload;
	uint64_t total;
};

/* Append a block of len bytes (seeded by its index) under key tag/n; its
 * announced checksum is that of the bytes as generated, so a later flip
 * in b->payload makes it wrong. */
static void batch_add(struct batch *b, const char *tag, uint64_t n, uint64_t len)
{
	uint32_t i = b->n++;

	assert_true(b->n <= MAX_BLOCKS);
	b->payload = realloc(b->payload, b->total + len);
	assert_non_null(b->payload);
	harness_key(b->keys[i], tag, n);
	b->lens[i] = len;
	b->offs[i] = b->total;
	harness_fill(b->payload + b->total, len, 7000 + n);
	b->sums[i] = harness_xxh3(b->payload + b->total, len);
	b->total += len;
}

/* Write buf in chunks of uneven sizes (1 byte to 64 KiB + 1, around the
 * xxh3 stripe and block sizes), pausing now and then so the server sees
 * many partial reads rather than one. */
static void send_trickle(int fd, const uint8_t *buf, uint64_t len)
{
	static const size_t sizes[] = { 1, 63, 64, 65, 255, 256, 1023, 1024, 4093, 65537 };
	uint64_t off = 0;

	for (unsigned k = 0; off < len; k++) {
		size_t chunk = sizes[k % (sizeof(sizes) / sizeof(sizes[0]))];

		if (chunk > len - off)
			chunk = (size_t)(len - off);
		assert_int_equal(harness_send_all(fd, buf + off, chunk), 0);
		off += chunk;
		if (k % 16 == 15)
			harness_sleep_ms(1);
	}
}

/* Send batch b as one PUT on a fresh session of namespace "pstream"
 * (payload trickled, or in one write), and write each block's status
 * into st. */
static void batch_put(const struct batch *b, int trickle, uint16_t *st)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + MAX_BLOCKS * PROTO_PUT_ENTRY_BYTES];
	uint32_t body_bytes = PROTO_BATCH_PREFIX_BYTES + b->n * PROTO_PUT_ENTRY_BYTES;
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PUT,
		.body_bytes = body_bytes, .request_id = 42, .payload_bytes = b->total,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];
	struct harness_frame f;
	struct proto_result res;
	int fd, one = 1;

	proto_batch_encode_prefix(body, b->n, 0);
	for (uint32_t i = 0; i < b->n; i++) {
		struct proto_put_entry e = { .length = b->lens[i], .checksum = b->sums[i] };

		memcpy(e.key, b->keys[i], 32);
		proto_put_entry_encode(body, i, &e);
	}
	proto_header_encode(&h, hdr);
	fd = harness_raw_session_or_fail(g.srv.port, "pstream", NULL);
	assert_int_equal(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), 0);
	assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
	assert_int_equal(harness_send_all(fd, body, body_bytes), 0);
	if (trickle)
		send_trickle(fd, b->payload, b->total);
	else
		assert_int_equal(harness_send_all(fd, b->payload, b->total), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.request_id, 42);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	for (uint32_t i = 0; i < b->n; i++) {
		assert_int_equal(harness_reply_result(&f, i, &res), 0);
		st[i] = res.status;
	}
	harness_frame_free(&f);
	close(fd);
}

/* Block i of b is stored with exactly the bytes generated for it. */
static void assert_block_stored(const struct batch *b, uint32_t i)
{
	harness_check_block_or_fail(g.c, b->keys[i], b->payload + b->offs[i], b->lens[i]);
}

static void batch_free(struct batch *b)
{
	free(b->payload);
	b->payload = NULL;
}

/* The put left no reservation behind. */
static void assert_no_inflight(void)
{
	assert_int_equal(harness_wait_stat_or_fail(g.c, "tiers.dram.inflight_put_bytes", 0, 3000),
			 0);
}

/* The last byte of a 5 MiB block, trickled in after a 3 MiB block in the
 * same batch, is flipped: only that block fails its checksum. Sent again
 * intact (a new request on a new connection) it is stored. */
static void test_corrupt_last_byte(void **state)
{
	struct batch b = { 0 };
	uint64_t errors0;
	uint16_t st[MAX_BLOCKS];

	(void)state;
	harness_need_server(&g.srv);
	errors0 = harness_stat_or_fail(g.c, "checksum_errors");
	batch_add(&b, "last", 1, 3 * MIB + 1001);
	batch_add(&b, "last", 2, 5 * MIB + 7);
	b.payload[b.offs[1] + b.lens[1] - 1] ^= 0x01;
	batch_put(&b, 1, st);
	assert_int_equal(st[0], PROTO_STATUS_OK);
	assert_int_equal(st[1], PROTO_STATUS_BAD_CHECKSUM);
	assert_int_equal(harness_stat_or_fail(g.c, "checksum_errors") - errors0, 1);
	assert_block_stored(&b, 0);
	harness_check_absent_or_fail(g.c, b.keys[1]);
	assert_no_inflight();

	/* intact this time; block 0 is already stored */
	b.payload[b.offs[1] + b.lens[1] - 1] ^= 0x01;
	batch_put(&b, 1, st);
	assert_int_equal(st[0], PROTO_STATUS_EXISTS);
	assert_int_equal(st[1], PROTO_STATUS_OK);
	assert_block_stored(&b, 1);
	assert_int_equal(harness_stat_or_fail(g.c, "checksum_errors") - errors0, 1);
	assert_no_inflight();
	batch_free(&b);
}

/* The first byte of a 4 MiB block is flipped; before it in the batch, a
 * block already stored (EXISTS: its 300 KiB go to the scratch buffer, more
 * than one read's worth), after it a good 2 MiB block. */
static void test_corrupt_first_byte(void **state)
{
	struct batch b = { 0 };
	uint64_t errors0;
	uint16_t st[MAX_BLOCKS];

	(void)state;
	harness_need_server(&g.srv);
	batch_add(&b, "first", 1, 300 * 1024 + 5);
	batch_put(&b, 0, st);
	assert_int_equal(st[0], PROTO_STATUS_OK);
	errors0 = harness_stat_or_fail(g.c, "checksum_errors");
	batch_add(&b, "first", 2, 4 * MIB + 3);
	batch_add(&b, "first", 3, 2 * MIB + 9);
	b.payload[b.offs[1]] ^= 0x80;
	batch_put(&b, 1, st);
	assert_int_equal(st[0], PROTO_STATUS_EXISTS);
	assert_int_equal(st[1], PROTO_STATUS_BAD_CHECKSUM);
	assert_int_equal(st[2], PROTO_STATUS_OK);
	assert_int_equal(harness_stat_or_fail(g.c, "checksum_errors") - errors0, 1);
	assert_block_stored(&b, 0);
	harness_check_absent_or_fail(g.c, b.keys[1]);
	assert_block_stored(&b, 2);
	assert_no_inflight();
	batch_free(&b);
}

/* Many small blocks of odd sizes sent in one write, so one read holds the
 * end of a block and the starts of several others; block 17's last byte
 * and block 40's first byte are flipped. */
static void test_small_blocks_one_write(void **state)
{
	struct batch b = { 0 };
	uint64_t errors0;
	uint16_t st[MAX_BLOCKS];

	(void)state;
	harness_need_server(&g.srv);
	errors0 = harness_stat_or_fail(g.c, "checksum_errors");
	for (uint64_t i = 0; i < 48; i++)
		batch_add(&b, "small", i, 1 + i * 997);
	b.payload[b.offs[17] + b.lens[17] - 1] ^= 0x10;
	b.payload[b.offs[40]] ^= 0x02;
	batch_put(&b, 0, st);
	for (uint32_t i = 0; i < b.n; i++) {
		if (i == 17 || i == 40) {
			assert_int_equal(st[i], PROTO_STATUS_BAD_CHECKSUM);
			harness_check_absent_or_fail(g.c, b.keys[i]);
		} else {
			assert_int_equal(st[i], PROTO_STATUS_OK);
			assert_block_stored(&b, i);
		}
	}
	assert_int_equal(harness_stat_or_fail(g.c, "checksum_errors") - errors0, 2);
	assert_no_inflight();
	batch_free(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_corrupt_last_byte),
		cmocka_unit_test(test_corrupt_first_byte),
		cmocka_unit_test(test_small_blocks_one_write),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_put_stream", tests, group_setup,
					   group_teardown);
}
