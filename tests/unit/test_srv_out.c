/*
 * test_srv_out.c - unit tests of the TCP output queue (srv_out.c): order,
 * pins released exactly once, buffers kept between requests. (Moved from
 * test_server.c.)
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "proto.h"
#include "srv_out.h"
#include "store.h"

/* ---- TCP output queue ------------------------------------------------------ */

#define OUT_BLOCK_BYTES (256u * 1024)

/* A store holding blocks "a" and "b" (OUT_BLOCK_BYTES each, bytes i + seed). */
static struct store *out_store(uint32_t *ns_id)
{
	struct store_config cfg = {
		.dram_capacity_bytes = 8u << 20,
		.max_block_bytes = 1u << 20,
		.max_inflight_put_bytes = 4u << 20,
	};
	static uint8_t data[OUT_BLOCK_BYTES];
	struct store *st = NULL;

	assert_int_equal(store_open(&cfg, &st, NULL, 0), 0);
	assert_int_equal(store_namespace_id(st, "out", 3, ns_id), 0);
	for (int k = 0; k < 2; k++) {
		uint8_t key[STORE_KEY_BYTES] = { (uint8_t)('a' + k) };
		struct store_block *b;
		void *dst;

		for (size_t i = 0; i < sizeof(data); i++)
			data[i] = (uint8_t)(i * 7 + (size_t)k);
		assert_int_equal(store_put_begin(st, *ns_id, key, NULL, 0, sizeof(data),
						 XXH3_64bits(data, sizeof(data)), &b, &dst), 0);
		memcpy(dst, data, sizeof(data));
		assert_int_equal(store_put_commit(st, b), 0);
	}
	return st;
}

/* Pin block 'a' + k, then delete it: its bytes are freed at the last
 * release, which pinned_removed_bytes shows. */
static struct store_ref out_pin_deleted(struct store *st, uint32_t ns_id, int k)
{
	uint8_t key[STORE_KEY_BYTES] = { (uint8_t)('a' + k) };
	struct store_ref r;
	uint64_t removed = 0;

	assert_int_equal(store_get(st, ns_id, key, NULL, &r), 0);
	assert_int_equal(store_delete(st, ns_id, key, &removed), 0);
	return r;
}

static uint64_t out_pinned_removed(struct store *st)
{
	struct store_stats ss;

	store_stats(st, &ss);
	return ss.pinned_removed_bytes;
}

/* Queue `text` as reply bytes. */
static void out_text(struct srv_out *o, const char *text)
{
	uint8_t *p;

	assert_int_equal(srv_out_reserve(o, strlen(text) + 10, &p), 0);
	memcpy(p, text, strlen(text));
	srv_out_commit(o, strlen(text));
}

/* Bytes, blocks and bytes leave in the order queued, through a socket
 * that takes them a little at a time; each block's pin is released once,
 * when its last byte is written. */
static void test_out_order_and_pins(void **state)
{
	static uint8_t got[2 * OUT_BLOCK_BYTES + 64];
	struct store_ref ra, rb;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;
	size_t have = 0, written = 0, want = 2 * OUT_BLOCK_BYTES + 9;
	int sv[2], sndbuf = 16384;

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	rb = out_pin_deleted(st, ns_id, 1);
	assert_true(out_pinned_removed(st) >= 2 * OUT_BLOCK_BYTES);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	srv_out_init(&o, st);
	out_text(&o, "hdr");
	assert_int_equal(srv_out_block(&o, ra.data, ra.length, ra.block), 0);
	out_text(&o, "mi");
	out_text(&o, "d"); /* joins "mi": one segment */
	assert_int_equal(srv_out_block(&o, rb.data, rb.length, rb.block), 0);
	out_text(&o, "end");
	assert_int_equal(o.tail - o.head, 5);
	assert_int_equal(srv_out_bytes(&o), want);
	while (have < want) {
		long w = srv_out_write(&o, sv[0]);
		ssize_t n;

		assert_true(w > 0 || w == -EAGAIN);
		written += w > 0 ? (size_t)w : 0;
		/* Block a is released once its last byte is out, not before. */
		if (written < 3 + OUT_BLOCK_BYTES)
			assert_true(out_pinned_removed(st) >= 2 * OUT_BLOCK_BYTES);
		else if (written < want - 3)
			assert_true(out_pinned_removed(st) < 2 * OUT_BLOCK_BYTES &&
				    out_pinned_removed(st) >= OUT_BLOCK_BYTES);
		n = read(sv[1], got + have, sizeof(got) - have);
		assert_true(n > 0);
		have += (size_t)n;
	}
	assert_int_equal(written, want);
	assert_int_equal(have, want);
	assert_int_equal(srv_out_bytes(&o), 0);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_memory_equal(got, "hdr", 3);
	for (size_t i = 0; i < OUT_BLOCK_BYTES; i += 4099) {
		assert_int_equal(got[3 + i], (uint8_t)(i * 7));
		assert_int_equal(got[6 + OUT_BLOCK_BYTES + i], (uint8_t)(i * 7 + 1));
	}
	assert_memory_equal(got + 3 + OUT_BLOCK_BYTES, "mid", 3);
	assert_memory_equal(got + want - 3, "end", 3);
	assert_int_equal(srv_out_write(&o, sv[0]), 0);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
	store_close(st);
}

/* Dropping a queue with bytes unsent releases every pin it holds (once:
 * the store would trip over a second release), and leaves it reusable. */
static void test_out_free_releases_unsent(void **state)
{
	struct store_ref ra, rb;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;
	int sv[2];

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	rb = out_pin_deleted(st, ns_id, 1);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	srv_out_init(&o, st);
	out_text(&o, "hdr");
	assert_int_equal(srv_out_block(&o, ra.data, ra.length, ra.block), 0);
	assert_int_equal(srv_out_block(&o, rb.data, rb.length, rb.block), 0);
	/* Part of it written: the peer reads nothing, the socket fills. */
	assert_true(srv_out_write(&o, sv[0]) > 0);
	assert_true(srv_out_bytes(&o) > 0);
	assert_true(out_pinned_removed(st) > 0);
	srv_out_free(&o);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_int_equal(srv_out_bytes(&o), 0);
	srv_out_free(&o); /* twice, and on an empty queue: nothing happens */
	out_text(&o, "again");
	assert_int_equal(srv_out_bytes(&o), 5);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
	store_close(st);
}

/* An empty block queues nothing and its pin goes back at once. */
static void test_out_empty_block_released(void **state)
{
	struct store_ref ra;
	struct srv_out o;
	struct store *st;
	uint32_t ns_id;

	(void)state;
	st = out_store(&ns_id);
	ra = out_pin_deleted(st, ns_id, 0);
	assert_true(out_pinned_removed(st) > 0);
	srv_out_init(&o, st);
	assert_int_equal(srv_out_block(&o, ra.data, 0, ra.block), 0);
	assert_int_equal(out_pinned_removed(st), 0);
	assert_int_equal(srv_out_bytes(&o), 0);
	assert_int_equal(o.tail, o.head);
	srv_out_free(&o);
	store_close(st);
}

/* Once the queue empties, the next replies reuse the same buffer and
 * segment array (no allocation); a burst beyond the keep sizes gives its
 * memory back. */
static void test_out_buffers_kept(void **state)
{
	struct srv_out o;
	uint8_t *buf, *p;
	struct srv_out_seg *segs;
	int sv[2];
	char drain[4096];

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	srv_out_init(&o, NULL);
	out_text(&o, "first reply");
	buf = o.buf;
	segs = o.segs;
	assert_non_null(buf);
	assert_int_equal(srv_out_write(&o, sv[0]), 11);
	assert_int_equal(read(sv[1], drain, sizeof(drain)), 11);
	for (int i = 0; i < 100; i++) {
		out_text(&o, "same-shaped reply");
		assert_int_equal(srv_out_write(&o, sv[0]), 17);
		assert_int_equal(read(sv[1], drain, sizeof(drain)), 17);
		assert_ptr_equal(o.buf, buf);
		assert_ptr_equal(o.segs, segs);
	}
	assert_int_equal(srv_out_reserve(&o, SRV_OUT_KEEP_BYTES + 1, &p), 0);
	memset(p, 'x', 100);
	srv_out_commit(&o, 100);
	assert_true(o.buf_cap > SRV_OUT_KEEP_BYTES);
	assert_int_equal(srv_out_write(&o, sv[0]), 100);
	assert_null(o.buf);
	assert_int_equal(o.buf_cap, 0);
	srv_out_free(&o);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_out_order_and_pins),
		cmocka_unit_test(test_out_free_releases_unsent),
		cmocka_unit_test(test_out_empty_block_released),
		cmocka_unit_test(test_out_buffers_kept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
