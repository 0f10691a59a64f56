/*
 * test_bad_input.c - malformed and hostile input over raw sockets. Each case
 * gets a clear error (or, where the stream cannot be parsed any more, a
 * closed connection), nothing is stored, and a second, well-behaved client
 * keeps working after every case.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define MAX_BLOCK (1u << 20)
#define MAX_FRAME (64u << 10)
#define REPLY_MS 5000

static struct {
	struct harness_server srv;
	struct kvpool_client *good; /* namespace "good" */
	uint64_t good_n;            /* keys put by the good client so far */
} g;

static int group_setup(void **state)
{
	static const char *const flags[] = {
		"--dram-capacity", "64MiB", "--max-block-bytes", "1MiB", "--max-frame-bytes", "64KiB",
		"--max-batch-blocks", "64", "--threads", "2", "--log-level", "error", NULL,
	};

	(void)state;
	if (harness_group_start(&g.srv, flags))
		return -1;
	return harness_group_client(&g.srv, "good", &g.good);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.good);
	harness_kill(&g.srv);
	return 0;
}

/* The well-behaved client: a fresh put and a byte-exact get, and a ping. */
static void assert_server_serves(void)
{
	uint8_t key[32], data[5000];

	assert_int_equal(kill(g.srv.pid, 0), 0);
	harness_key(key, "good", g.good_n);
	harness_fill(data, sizeof(data), 1000 + g.good_n);
	g.good_n++;
	assert_int_equal(kvpool_put_bytes(g.good, key, NULL, data, sizeof(data)), 0);
	harness_check_block_or_fail(g.good, key, data, sizeof(data));
	assert_int_equal(kvpool_ping(g.good, NULL), 0);
}

/* Read one reply or notice the close. Returns 1 with *f filled, or 0 when
 * the server closed the connection; fails the test on a timeout or a reply
 * that is not protocol v1. */
static int reply_or_close(int fd, struct harness_frame *f)
{
	int err = harness_read_frame(fd, REPLY_MS, f);

	if (err == -ECONNRESET)
		return 0;
	if (err)
		fail_msg("expected a reply or a close, got %s", strerror(-err));
	return 1;
}

/* Read one reply that must be there: an error with status `status`, and
 * return its message in msg. */
static void expect_error(int fd, uint64_t id, uint16_t status, char *msg, size_t cap)
{
	struct harness_frame f;
	int err = harness_read_frame(fd, REPLY_MS, &f);

	if (err)
		fail_msg("expected a %s reply, got %s", proto_status_name(status), strerror(-err));
	if (f.h.status != status)
		fail_msg("expected %s, got %s", proto_status_name(status),
			 proto_status_name(f.h.status));
	assert_int_equal(f.h.request_id, id);
	assert_int_equal(harness_error_message(&f, msg, cap, NULL, NULL), 0);
	assert_true(strlen(msg) > 0);
	harness_frame_free(&f);
}

/* A message names a limit: by its setting name or by its value. */
static void assert_names_limit(const char *msg, const char *name, uint64_t value)
{
	char num[32];

	snprintf(num, sizeof(num), "%llu", (unsigned long long)value);
	if (!strstr(msg, name) && !strstr(msg, num))
		fail_msg("message \"%s\" names neither %s nor %s", msg, name, num);
}

static void assert_ping_works(int fd, uint64_t id)
{
	struct harness_frame f;

	assert_int_equal(harness_send_frame(fd, PROTO_OP_PING, id, NULL, 0, NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.request_id, id);
	assert_int_equal(f.h.opcode, PROTO_OP_PING);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
}

static void assert_absent(const char *ns, const uint8_t key[32])
{
	struct kvpool_client *c = NULL;

	assert_int_equal(harness_client(&g.srv, ns, &c), 0);
	harness_check_absent_or_fail(c, key);
	kvpool_close(c);
}

/* ---- cases ------------------------------------------------------------------- */

/* Random bytes, before and after HELLO: BAD_REQUEST or a close, and then
 * the connection is closed. */
static void test_garbage(void **state)
{
	uint8_t junk[4096];

	(void)state;
	harness_need_server(&g.srv);
	for (int after_hello = 0; after_hello < 2; after_hello++) {
		struct harness_frame f;
		int fd;

		harness_fill(junk, sizeof(junk), 0xBAD0 + (uint64_t)after_hello);
		junk[0] = 'X'; /* never the magic */
		if (after_hello) {
			fd = harness_raw_session_or_fail(g.srv.port, "bad-garbage", NULL);
		} else {
			fd = -1;
			assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
		}
		harness_send_all(fd, junk, sizeof(junk)); /* may fail once it hangs up */
		if (reply_or_close(fd, &f)) {
			assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
			harness_frame_free(&f);
		}
		assert_int_equal(harness_wait_closed(fd, REPLY_MS), 0);
		close(fd);
		assert_server_serves();
	}
}

/* Random headers with the right magic and version, and random bodies: the
 * server may answer or hang up, but it keeps serving. */
static void test_random_frames(void **state)
{
	(void)state;
	harness_need_server(&g.srv);
	for (uint64_t i = 0; i < 40; i++) {
		uint8_t junk[PROTO_HEADER_BYTES + 512];
		struct harness_frame f;
		int fd = harness_raw_session_or_fail(g.srv.port, "bad-random", NULL);

		harness_fill(junk, sizeof(junk), 0xF00D + i);
		proto_put_u32(junk, PROTO_MAGIC);
		junk[4] = PROTO_VERSION;
		junk[5] = (uint8_t)(i % 12); /* known and unknown opcodes */
		junk[6] = 0;
		junk[7] = 0;
		junk[8] = 0;
		junk[9] = 0;
		if (i % 2) {
			/* Small plausible sizes, so the body and payload may fit. */
			proto_put_u32(junk + 12, (uint32_t)(i * 7 % 400));
			proto_put_u64(junk + 24, i % 4 ? 0 : i * 3);
		}
		harness_send_all(fd, junk, sizeof(junk));
		/* Anything goes but silence forever: read until timeout or close. */
		for (int n = 0; n < 4 && harness_read_frame(fd, 300, &f) == 0; n++)
			harness_frame_free(&f);
		close(fd);
	}
	assert_server_serves();
}

static void test_wrong_magic(void **state)
{
	uint8_t hdr[PROTO_HEADER_BYTES];
	struct proto_header h = {
		.magic = 0x5858584Bu, .version = PROTO_VERSION, .opcode = PROTO_OP_PING,
		.request_id = 4,
	};
	struct harness_frame f;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	proto_header_encode(&h, hdr);
	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
	if (reply_or_close(fd, &f)) {
		/* A connection-level error: opcode NONE, request id 0. */
		assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
		assert_int_equal(f.h.opcode, 0);
		assert_int_equal(f.h.request_id, 0);
		harness_frame_free(&f);
	}
	assert_int_equal(harness_wait_closed(fd, REPLY_MS), 0);
	close(fd);
	assert_server_serves();
}

/* HELLO in a version we do not speak: UNSUPPORTED naming the supported
 * versions, then the connection closes. Twice: the header's version, and
 * the versions offered in the HELLO body. */
static void test_wrong_version(void **state)
{
	(void)state;
	harness_need_server(&g.srv);
	for (int in_body = 0; in_body < 2; in_body++) {
		struct proto_hello hello = {
			.min_version = in_body ? PROTO_VERSION_MAX + 1 : 1,
			.max_version = in_body ? PROTO_VERSION_MAX + 4 : 1,
			.ns = "bad-version", .ns_len = 11,
		};
		uint8_t buf[PROTO_HEADER_BYTES + 64];
		size_t body_bytes = proto_hello_body_bytes(&hello);
		struct proto_header h = {
			.magic = PROTO_MAGIC, .version = in_body ? PROTO_VERSION : PROTO_VERSION_MAX + 1,
			.opcode = PROTO_OP_HELLO, .body_bytes = (uint32_t)body_bytes, .request_id = 6,
		};
		struct harness_frame f;
		uint16_t lo = 0, hi = 0;
		char msg[1100];
		int fd = -1;

		proto_header_encode(&h, buf);
		assert_int_equal(proto_hello_encode(&hello, buf + PROTO_HEADER_BYTES, 64), 0);
		assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
		assert_int_equal(harness_send_all(fd, buf, PROTO_HEADER_BYTES + body_bytes), 0);
		assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
		assert_int_equal(f.h.status, PROTO_STATUS_UNSUPPORTED);
		assert_int_equal(f.h.request_id, 6);
		assert_int_equal(harness_error_message(&f, msg, sizeof(msg), &lo, &hi), 0);
		harness_frame_free(&f);
		assert_int_equal(lo, PROTO_VERSION_MIN);
		assert_int_equal(hi, PROTO_VERSION_MAX);
		assert_non_null(strchr(msg, '0' + PROTO_VERSION_MAX));
		assert_int_equal(harness_wait_closed(fd, REPLY_MS), 0);
		close(fd);
		assert_server_serves();
	}
}

/* An unknown opcode (with and without a body) gets UNSUPPORTED and the
 * connection keeps working. */
static void test_unknown_opcode(void **state)
{
	uint8_t body[16] = { 0 };
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	fd = harness_raw_session_or_fail(g.srv.port, "bad-opcode", NULL);
	assert_int_equal(harness_send_frame(fd, 200, 77, NULL, 0, NULL, 0), 0);
	expect_error(fd, 77, PROTO_STATUS_UNSUPPORTED, msg, sizeof(msg));
	assert_ping_works(fd, 78);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_MAX + 1, 79, body, sizeof(body), NULL, 0),
			 0);
	expect_error(fd, 79, PROTO_STATUS_UNSUPPORTED, msg, sizeof(msg));
	assert_ping_works(fd, 80);
	close(fd);
	assert_server_serves();
}

/* body_bytes over max_frame_bytes: TOO_LARGE naming the limit. */
static void test_frame_too_large(void **state)
{
	struct proto_hello_reply limits;
	uint8_t hdr[PROTO_HEADER_BYTES];
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_EXISTS,
		.request_id = 8,
	};
	uint64_t too_large0;
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	too_large0 = harness_stat_or_fail(g.good, "ops.errors.too_large");
	fd = harness_raw_session_or_fail(g.srv.port, "bad-frame", &limits);
	assert_int_equal(limits.max_frame_bytes, MAX_FRAME);
	h.body_bytes = limits.max_frame_bytes; /* + 32 header bytes: over */
	proto_header_encode(&h, hdr);
	assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
	expect_error(fd, 8, PROTO_STATUS_TOO_LARGE, msg, sizeof(msg));
	assert_names_limit(msg, "max_frame_bytes", MAX_FRAME);
	/* The header was readable: the server skips the body and goes on. */
	{
		uint8_t *zeros = calloc(1, MAX_FRAME);

		assert_non_null(zeros);
		assert_int_equal(harness_send_all(fd, zeros, MAX_FRAME), 0);
		free(zeros);
	}
	assert_ping_works(fd, 81);
	close(fd);
	assert_true(harness_stat_or_fail(g.good, "ops.errors.too_large") > too_large0);
	assert_server_serves();
}

/* A block over max_block_bytes: TOO_LARGE naming the limit, nothing stored. */
static void test_block_too_large(void **state)
{
	const uint64_t len = MAX_BLOCK + 1;
	struct proto_hello_reply limits;
	uint8_t key[32], *data;
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	data = malloc(len);
	assert_non_null(data);
	harness_fill(data, len, 3);
	harness_key(key, "bad-block", 0);
	fd = harness_raw_session_or_fail(g.srv.port, "bad-block", &limits);
	assert_int_equal(limits.max_block_bytes, MAX_BLOCK);
	/* Header and body first: the refusal must not wait for the payload. */
	assert_int_equal(harness_raw_put(fd, 9, key, NULL, data, len, harness_xxh3(data, len), 0),
			 0);
	expect_error(fd, 9, PROTO_STATUS_TOO_LARGE, msg, sizeof(msg));
	assert_names_limit(msg, "max_block_bytes", MAX_BLOCK);
	/* The server discards the payload and keeps the connection. */
	assert_int_equal(harness_send_all(fd, data, len), 0);
	assert_ping_works(fd, 82);
	close(fd);
	free(data);
	assert_absent("bad-block", key);
	assert_server_serves();
}

/* PUT entries whose lengths do not add up to payload_bytes. */
static void test_lying_lengths(void **state)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + 2 * PROTO_PUT_ENTRY_BYTES], data[3000];
	uint8_t keys[2][32];
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(data, sizeof(data), 4);
	proto_batch_encode_prefix(body, 2, 0);
	for (int i = 0; i < 2; i++) {
		struct proto_put_entry e = { .length = 1000 };

		harness_key(keys[i], "bad-lie", (uint64_t)i);
		memcpy(e.key, keys[i], 32);
		e.checksum = harness_xxh3(data + 1000 * i, 1000);
		proto_put_entry_encode(body, (uint32_t)i, &e);
	}
	fd = harness_raw_session_or_fail(g.srv.port, "bad-lie", NULL);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_PUT, 10, body, sizeof(body), data,
					    sizeof(data)),
			 0);
	expect_error(fd, 10, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
	assert_ping_works(fd, 83);
	close(fd);
	assert_absent("bad-lie", keys[0]);
	assert_absent("bad-lie", keys[1]);
	assert_server_serves();
}

/* A zero-length block is malformed. */
static void test_empty_block(void **state)
{
	uint8_t key[32];
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "bad-empty", 0);
	fd = harness_raw_session_or_fail(g.srv.port, "bad-empty", NULL);
	assert_int_equal(harness_raw_put(fd, 11, key, NULL, NULL, 0, 0, 0), 0);
	expect_error(fd, 11, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
	assert_ping_works(fd, 84);
	close(fd);
	assert_absent("bad-empty", key);
	assert_server_serves();
}

/* Batch counts of 0xFFFFFFFF with a small body: an error, not an
 * allocation of billions of entries. */
static void test_absurd_count(void **state)
{
	static const uint8_t ops[] = { PROTO_OP_PUT, PROTO_OP_GET, PROTO_OP_EXISTS,
				       PROTO_OP_MATCH, PROTO_OP_DELETE };

	(void)state;
	harness_need_server(&g.srv);
	for (size_t i = 0; i < sizeof(ops); i++) {
		uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES] = { 0 };
		uint32_t body_bytes = PROTO_BATCH_PREFIX_BYTES + proto_request_entry_bytes(ops[i]);
		struct harness_frame f;
		int fd = harness_raw_session_or_fail(g.srv.port, "bad-count", NULL);

		proto_batch_encode_prefix(body, 0xFFFFFFFFu, 0);
		assert_int_equal(harness_send_frame(fd, ops[i], 12, body, body_bytes, NULL, 0), 0);
		assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
		if (f.h.status != PROTO_STATUS_BAD_REQUEST && f.h.status != PROTO_STATUS_TOO_LARGE)
			fail_msg("%s with count 0xFFFFFFFF: status %s", proto_op_name(ops[i]),
				 proto_status_name(f.h.status));
		assert_int_equal(f.h.request_id, 12);
		harness_frame_free(&f);
		assert_ping_works(fd, 85);
		close(fd);
	}
	assert_server_serves();
}

/* Anything but HELLO or PING first is refused, and the connection stays. */
static void test_op_before_hello(void **state)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_KEY_ENTRY_BYTES], key[32];
	struct harness_frame f;
	int fd = -1;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "before-hello", 0);
	proto_batch_encode_prefix(body, 1, 0);
	proto_key_entry_encode(body, 0, key);
	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_EXISTS, 13, body, sizeof(body), NULL, 0),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
	assert_int_equal(f.h.request_id, 13);
	harness_frame_free(&f);
	/* PING is allowed before HELLO, and the connection can still say HELLO. */
	assert_ping_works(fd, 86);
	assert_int_equal(harness_raw_hello(fd, "bad-late-hello", NULL), 0);
	close(fd);
	assert_server_serves();
}

/* Header fields that are wrong but leave the stream parseable: the
 * request gets BAD_REQUEST and the connection goes on (section 7.2). */
static void test_bad_header_fields(void **state)
{
	uint8_t pad[16] = { 0 };
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	fd = harness_raw_session_or_fail(g.srv.port, "bad-fields", NULL);
	for (int kind = 0; kind < 5; kind++) {
		struct proto_header h = {
			.magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = PROTO_OP_PING,
			.request_id = 40 + (uint64_t)kind,
		};
		uint8_t hdr[PROTO_HEADER_BYTES];

		if (kind == 2)
			h.flags = PROTO_FLAG_REPLY;      /* a "reply" sent as a request */
		if (kind == 3)
			h.status = PROTO_STATUS_NOT_FOUND; /* status on a request */
		if (kind == 4)
			h.body_bytes = sizeof(pad);      /* PING with a body */
		proto_header_encode(&h, hdr);
		if (kind == 0)
			proto_put_u16(hdr + 10, 1);      /* reserved */
		if (kind == 1)
			proto_put_u64(hdr + 24, 10);     /* payload on a PING */
		assert_int_equal(harness_send_all(fd, hdr, sizeof(hdr)), 0);
		if (kind == 1)
			assert_int_equal(harness_send_all(fd, pad, 10), 0);
		if (kind == 4)
			assert_int_equal(harness_send_all(fd, pad, sizeof(pad)), 0);
		expect_error(fd, 40 + (uint64_t)kind, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
		assert_ping_works(fd, 50 + (uint64_t)kind);
	}
	close(fd);
	assert_server_serves();
}

/* A PUT entry whose parent does not agree with its HAS_PARENT flag. */
static void test_inconsistent_parent(void **state)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES], data[100], key[32];
	struct proto_put_entry e = { .length = sizeof(data) };
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	harness_fill(data, sizeof(data), 8);
	harness_key(key, "bad-parent", 0);
	memcpy(e.key, key, 32);
	e.checksum = harness_xxh3(data, sizeof(data));
	fd = harness_raw_session_or_fail(g.srv.port, "bad-parent", NULL);
	for (int kind = 0; kind < 2; kind++) {
		memset(e.parent, kind ? 0 : 0x11, 32); /* nonzero without flag; zero with */
		e.flags = kind ? PROTO_PUT_HAS_PARENT : 0;
		proto_batch_encode_prefix(body, 1, 0);
		proto_put_entry_encode(body, 0, &e);
		assert_int_equal(harness_send_frame(fd, PROTO_OP_PUT, 60 + (uint64_t)kind, body,
						    sizeof(body), data, sizeof(data)),
				 0);
		expect_error(fd, 60 + (uint64_t)kind, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
	}
	assert_ping_works(fd, 62);
	close(fd);
	assert_absent("bad-parent", key);
	assert_server_serves();
}

/* A second HELLO is refused and the connection keeps its namespace. */
static void test_second_hello(void **state)
{
	struct proto_hello hello = {
		.min_version = 1, .max_version = 1, .ns = "bad-hello-2", .ns_len = 11,
	};
	uint8_t body[64], key[32], data[300];
	struct harness_frame f;
	struct proto_result res;
	char msg[1100];
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	fd = harness_raw_session_or_fail(g.srv.port, "bad-hello-1", NULL);
	assert_int_equal(proto_hello_encode(&hello, body, sizeof(body)), 0);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_HELLO, 70, body,
					    (uint32_t)proto_hello_body_bytes(&hello), NULL, 0),
			 0);
	expect_error(fd, 70, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
	harness_key(key, "bad-hello", 0);
	harness_fill(data, sizeof(data), 9);
	assert_int_equal(harness_raw_put(fd, 71, key, NULL, data, sizeof(data),
					 harness_xxh3(data, sizeof(data)), sizeof(data)),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(harness_reply_result(&f, 0, &res), 0);
	assert_int_equal(res.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	close(fd);
	assert_absent("bad-hello-2", key);
	{
		struct kvpool_client *c = NULL;
		int st = 1;

		assert_int_equal(harness_client(&g.srv, "bad-hello-1", &c), 0);
		assert_int_equal(kvpool_exists(c, (const uint8_t(*)[32])key, 1, &st), 0);
		assert_int_equal(st, 0);
		kvpool_close(c);
	}
	assert_server_serves();
}

/* Namespace names outside printable ASCII 0x21..0x7e are BAD_REQUEST. */
static void test_bad_namespace(void **state)
{
	static const char *const names[] = { "has space", "tab\there", "del\x7f" };

	(void)state;
	harness_need_server(&g.srv);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		uint16_t ns_len = (uint16_t)strlen(names[i]);
		uint8_t body[64];
		struct kvpool_client *c = NULL;
		char msg[1100];
		int fd = -1, rc;

		/* By hand: our encoder refuses such names. */
		proto_put_u16(body, 1);
		proto_put_u16(body + 2, 1);
		proto_put_u16(body + 4, ns_len);
		proto_put_u16(body + 6, 0);
		memcpy(body + PROTO_HELLO_FIXED_BYTES, names[i], ns_len);
		assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
		assert_int_equal(harness_send_frame(fd, PROTO_OP_HELLO, 14, body,
						    PROTO_HELLO_FIXED_BYTES + ns_len, NULL, 0),
				 0);
		expect_error(fd, 14, PROTO_STATUS_BAD_REQUEST, msg, sizeof(msg));
		/* The connection stays open for a corrected HELLO. */
		assert_int_equal(harness_raw_hello(fd, "bad-ns-fixed", NULL), 0);
		close(fd);
		rc = kvpool_connect(g.srv.url, names[i], NULL, &c);
		if (rc != -EINVAL && rc != -EPROTO)
			fail_msg("kvpool_connect with namespace \"%s\": %s", names[i],
				 kvpool_strerror(rc));
	}
	assert_server_serves();
}

/* Wrong checksum: per-block BAD_CHECKSUM, nothing stored, counted; the
 * connection and the other blocks of the batch are fine. */
static void test_bad_checksum(void **state)
{
	enum { N = 3, LEN = 20000 };
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + N * PROTO_PUT_ENTRY_BYTES], keys[N][32];
	uint8_t *data = malloc(N * LEN);
	uint64_t errors0;
	struct harness_frame f;
	struct proto_result res;
	struct kvpool_client *c = NULL;
	int fd, st[N];

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	harness_fill(data, N * LEN, 5);
	errors0 = harness_stat_or_fail(g.good, "checksum_errors");
	proto_batch_encode_prefix(body, N, 0);
	for (int i = 0; i < N; i++) {
		struct proto_put_entry e = { .length = LEN };

		harness_key(keys[i], "bad-sum", (uint64_t)i);
		memcpy(e.key, keys[i], 32);
		e.checksum = harness_xxh3(data + i * LEN, LEN) ^ (i == 1 ? 1 : 0);
		proto_put_entry_encode(body, (uint32_t)i, &e);
	}
	fd = harness_raw_session_or_fail(g.srv.port, "bad-sum", NULL);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_PUT, 15, body, sizeof(body), data,
					    N * LEN),
			 0);
	assert_int_equal(harness_read_frame(fd, REPLY_MS, &f), 0);
	assert_int_equal(f.h.request_id, 15);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	for (uint32_t i = 0; i < N; i++) {
		assert_int_equal(harness_reply_result(&f, i, &res), 0);
		assert_int_equal(res.status, i == 1 ? PROTO_STATUS_BAD_CHECKSUM : PROTO_STATUS_OK);
	}
	harness_frame_free(&f);
	assert_ping_works(fd, 16);
	close(fd);

	assert_int_equal(harness_client(&g.srv, "bad-sum", &c), 0);
	assert_int_equal(kvpool_exists(c, (const uint8_t(*)[32])keys, N, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -ENOENT);
	assert_int_equal(st[2], 0);
	kvpool_close(c);
	assert_int_equal(harness_stat_or_fail(g.good, "checksum_errors") - errors0, 1);
	assert_int_equal(harness_wait_stat_or_fail(g.good, "tiers.dram.inflight_put_bytes", 0, 2000),
			 0);
	free(data);
	assert_server_serves();
}

/* The library refuses a block over the HELLO limit, and an empty one,
 * without asking the server. */
static void test_library_refuses_locally(void **state)
{
	struct kvpool_limits limits;
	uint64_t puts0, too_large0;
	uint8_t key[32], *data;
	struct iovec iov = { 0 };
	struct kvpool_put_block pb;
	int st = 1;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(kvpool_get_limits(g.good, &limits), 0);
	assert_int_equal(limits.max_block_bytes, MAX_BLOCK);
	assert_int_equal(limits.max_frame_bytes, MAX_FRAME);
	assert_int_equal(limits.max_batch_blocks, 64);
	assert_int_equal(limits.protocol_version, PROTO_VERSION_MAX);
	assert_int_equal(limits.max_match_wait_ms, 30000);
	assert_int_equal(limits.max_retain_ms, 86400000);
	puts0 = harness_stat_or_fail(g.good, "ops.put.requests");
	too_large0 = harness_stat_or_fail(g.good, "ops.errors.too_large");

	data = malloc(MAX_BLOCK + 1);
	assert_non_null(data);
	harness_fill(data, MAX_BLOCK + 1, 6);
	harness_key(key, "local-refusal", 0);
	assert_int_equal(kvpool_put_bytes(g.good, key, NULL, data, MAX_BLOCK + 1), -EMSGSIZE);
	iov.iov_base = data;
	pb = (struct kvpool_put_block){ .key = key, .iov = &iov, .iovcnt = 1 };
	assert_int_equal(kvpool_put(g.good, &pb, 1, &st), -EMSGSIZE);
	assert_int_equal(st, -EMSGSIZE);
	free(data);

	assert_int_equal(harness_stat_or_fail(g.good, "ops.put.requests"), puts0);
	assert_int_equal(harness_stat_or_fail(g.good, "ops.errors.too_large"), too_large0);
	assert_server_serves();
}

/* A GET with no buffer (max_length 0) asks the block's size: the server
 * answers TOO_LARGE with the length but does not count a refusal; a GET
 * whose buffer is one byte short is a refusal and counts once. */
static void test_get_size_query_is_not_refused(void **state)
{
	uint8_t key[32], data[1000], buf[999];
	uint64_t too_large0, len = 0;

	(void)state;
	harness_need_server(&g.srv);
	harness_key(key, "size-query", 0);
	harness_fill(data, sizeof(data), 7);
	assert_int_equal(kvpool_put_bytes(g.good, key, NULL, data, sizeof(data)), 0);
	too_large0 = harness_stat_or_fail(g.good, "ops.errors.too_large");

	assert_int_equal(kvpool_get_bytes(g.good, key, NULL, 0, &len), -EMSGSIZE);
	assert_int_equal(len, sizeof(data));
	assert_int_equal(harness_stat_or_fail(g.good, "ops.errors.too_large"), too_large0);

	len = 0;
	assert_int_equal(kvpool_get_bytes(g.good, key, buf, sizeof(buf), &len), -EMSGSIZE);
	assert_int_equal(len, sizeof(data));
	assert_int_equal(harness_stat_or_fail(g.good, "ops.errors.too_large"), too_large0 + 1);
}

/* Batches bigger than max_batch_blocks (64 here) are split by the library
 * into pipelined frames; a chain crossing frame boundaries still links. */
static void test_library_splits_batches(void **state)
{
	enum { N = 200, LEN = 1000 };
	static uint8_t keys[N][32], data[N][LEN], got[N][LEN];
	static struct iovec piov[N], giov[N];
	static struct kvpool_put_block pb[N];
	static struct kvpool_get_block gb[N];
	static int st[N];
	uint64_t puts0;
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < N; i++) {
		harness_key(keys[i], "split", (uint64_t)i);
		harness_fill(data[i], LEN, 700 + (uint64_t)i);
		piov[i] = (struct iovec){ .iov_base = data[i], .iov_len = LEN };
		giov[i] = (struct iovec){ .iov_base = got[i], .iov_len = LEN };
		pb[i] = (struct kvpool_put_block){
			.key = keys[i], .parent = i ? keys[i - 1] : NULL, .iov = &piov[i], .iovcnt = 1,
		};
		gb[i] = (struct kvpool_get_block){ .key = keys[i], .iov = &giov[i], .iovcnt = 1 };
	}
	puts0 = harness_stat_or_fail(g.good, "ops.put.requests");
	assert_int_equal(kvpool_put(g.good, pb, N, st), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(harness_stat_or_fail(g.good, "ops.put.requests") - puts0, (N + 63) / 64);
	assert_int_equal(kvpool_match(g.good, (const uint8_t(*)[32])keys, N, 0, &matched), 0);
	assert_int_equal(matched, N);
	assert_int_equal(kvpool_exists(g.good, (const uint8_t(*)[32])keys, N, st), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(kvpool_get(g.good, gb, N, st), 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(st[i], 0);
		assert_int_equal(gb[i].length, LEN);
		assert_memory_equal(got[i], data[i], LEN);
	}
	assert_server_serves();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_random_frames),
		cmocka_unit_test(test_wrong_magic),
		cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_unknown_opcode),
		cmocka_unit_test(test_frame_too_large),
		cmocka_unit_test(test_get_size_query_is_not_refused),
		cmocka_unit_test(test_block_too_large),
		cmocka_unit_test(test_lying_lengths),
		cmocka_unit_test(test_empty_block),
		cmocka_unit_test(test_absurd_count),
		cmocka_unit_test(test_op_before_hello),
		cmocka_unit_test(test_bad_namespace),
		cmocka_unit_test(test_bad_header_fields),
		cmocka_unit_test(test_inconsistent_parent),
		cmocka_unit_test(test_second_hello),
		cmocka_unit_test(test_bad_checksum),
		cmocka_unit_test(test_library_refuses_locally),
		cmocka_unit_test(test_library_splits_batches),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests_name("integ_bad_input", tests, group_setup, group_teardown);
}
