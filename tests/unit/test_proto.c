/*
 * test_proto.c - unit tests of the wire protocol codec (proto/).
 *
 * Round trips of every message, every malformed frame and body giving its
 * documented error, the status/errno table both ways, the names, and the
 * worked example of PROTOCOL.md byte for byte.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "proto.h"

static const struct proto_limits limits = {
	.max_frame_bytes = 4096,
	.max_batch_blocks = 16,
	.max_block_bytes = 1 << 20,
};

/* ---- helpers ------------------------------------------------------------ */

static void fill_key(uint8_t key[PROTO_KEY_BYTES], uint8_t seed)
{
	for (int i = 0; i < PROTO_KEY_BYTES; i++)
		key[i] = (uint8_t)(seed * 31 + i + 1);
}

static struct proto_header request_header(uint8_t op, uint32_t body_bytes, uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = PROTO_VERSION,
		.opcode = op,
		.body_bytes = body_bytes,
		.request_id = 0x1122334455667788ull,
		.payload_bytes = payload_bytes,
	};
	return h;
}

static struct proto_header reply_header(uint8_t op, uint16_t status, uint32_t body_bytes,
					uint64_t payload_bytes)
{
	struct proto_header h = request_header(op, body_bytes, payload_bytes);

	h.flags = PROTO_FLAG_REPLY;
	h.status = status;
	return h;
}

/* Encode h and decode it again. */
static int header_roundtrip(const struct proto_header *h, int is_reply,
			    const struct proto_limits *l, struct proto_header *out)
{
	uint8_t buf[PROTO_HEADER_BYTES];

	proto_header_encode(h, buf);
	return proto_header_decode(buf, is_reply, l, out);
}

/* Build a PUT body of n entries with lengths[i]; entry i > 0 has entry
 * i-1 as its parent. Returns the body bytes written. */
static size_t build_put_body(uint8_t *body, uint32_t n, const uint64_t *lengths)
{
	proto_batch_encode_prefix(body, n, 0);
	for (uint32_t i = 0; i < n; i++) {
		struct proto_put_entry e = { .length = lengths[i], .checksum = 1000 + i };

		fill_key(e.key, (uint8_t)i);
		if (i > 0) {
			fill_key(e.parent, (uint8_t)(i - 1));
			e.flags = PROTO_PUT_HAS_PARENT;
		}
		proto_put_entry_encode(body, i, &e);
	}
	return proto_batch_body_bytes(n, PROTO_PUT_ENTRY_BYTES);
}

static size_t build_key_body(uint8_t *body, uint32_t n, uint32_t aux)
{
	uint8_t key[PROTO_KEY_BYTES];

	proto_batch_encode_prefix(body, n, aux);
	for (uint32_t i = 0; i < n; i++) {
		fill_key(key, (uint8_t)i);
		proto_key_entry_encode(body, i, key);
	}
	return proto_batch_body_bytes(n, PROTO_KEY_ENTRY_BYTES);
}

static size_t hex_decode(const char *hex, uint8_t *out, size_t cap)
{
	size_t n = 0;

	while (*hex) {
		unsigned int byte;

		if (*hex == ' ' || *hex == '\n') {
			hex++;
			continue;
		}
		assert_true(n < cap);
		assert_int_equal(sscanf(hex, "%2x", &byte), 1);
		out[n++] = (uint8_t)byte;
		hex += 2;
	}
	return n;
}

/* ---- header ------------------------------------------------------------- */

static void test_header_roundtrip_every_op(void **state)
{
	(void)state;
	for (uint8_t op = PROTO_OP_HELLO; op <= PROTO_OP_MAX; op++) {
		struct proto_header h = request_header(op, 100, op == PROTO_OP_PUT ? 4096 : 0);
		struct proto_header out;

		assert_int_equal(header_roundtrip(&h, 0, &limits, &out), 0);
		assert_int_equal(out.magic, PROTO_MAGIC);
		assert_int_equal(out.version, 1);
		assert_int_equal(out.opcode, op);
		assert_int_equal(out.flags, 0);
		assert_int_equal(out.status, 0);
		assert_int_equal(out.body_bytes, 100);
		assert_true(out.request_id == 0x1122334455667788ull);
		assert_true(out.payload_bytes == h.payload_bytes);

		for (uint16_t st = 0; st <= PROTO_STATUS_MAX; st++) {
			int ok_get = op == PROTO_OP_GET && st == PROTO_STATUS_OK;
			struct proto_header r = reply_header(op, st, 40, ok_get ? 77 : 0);

			assert_int_equal(header_roundtrip(&r, 1, &limits, &out), 0);
			assert_int_equal(out.flags, PROTO_FLAG_REPLY);
			assert_int_equal(out.status, st);
			assert_int_equal(out.opcode, op);
			assert_true(out.payload_bytes == r.payload_bytes);
		}
	}
}

static void test_header_layout(void **state)
{
	struct proto_header h = request_header(PROTO_OP_PUT, 0x01020304, 0x0a0b0c0d0e0f1011ull);
	uint8_t buf[PROTO_HEADER_BYTES];
	static const uint8_t want[PROTO_HEADER_BYTES] = {
		'K', 'V', 'P', 'L', 1, 2, 0, 0, 0, 0, 0, 0, 0x04, 0x03, 0x02, 0x01,
		0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
		0x11, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a,
	};

	(void)state;
	memset(buf, 0xee, sizeof(buf));
	proto_header_encode(&h, buf);
	assert_memory_equal(buf, want, sizeof(want));
}

static void test_header_bad_magic(void **state)
{
	struct proto_header h = request_header(PROTO_OP_PING, 0, 0), out;
	uint8_t buf[PROTO_HEADER_BYTES];

	(void)state;
	for (int i = 0; i < 4; i++) {
		proto_header_encode(&h, buf);
		buf[i] ^= 0x20;
		memset(&out, 0xa5, sizeof(out));
		assert_int_equal(proto_header_decode(buf, 0, &limits, &out), -EPROTO);
		/* documented: nothing is written for a bad magic */
		assert_int_equal(out.opcode, 0xa5);
	}
	memset(buf, 0, sizeof(buf));
	assert_int_equal(proto_header_decode(buf, 0, &limits, &out), -EPROTO);
}

static void test_header_wrong_version(void **state)
{
	static const uint8_t versions[] = { 0, 3, 255 };
	struct proto_header out;

	(void)state;
	for (size_t i = 0; i < sizeof(versions); i++) {
		struct proto_header h = request_header(PROTO_OP_HELLO, 16, 0);

		h.version = versions[i];
		assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EPROTONOSUPPORT);
		/* still decoded, so the error reply can echo them */
		assert_int_equal(out.opcode, PROTO_OP_HELLO);
		assert_true(out.request_id == h.request_id);
		assert_int_equal(out.version, versions[i]);
	}
}

static void test_header_reserved_and_flags(void **state)
{
	struct proto_header h = request_header(PROTO_OP_PING, 0, 0), out;
	uint8_t buf[PROTO_HEADER_BYTES];

	(void)state;
	for (int off = 10; off < 12; off++) {
		proto_header_encode(&h, buf);
		buf[off] = 1;
		assert_int_equal(proto_header_decode(buf, 0, &limits, &out), -EPROTO);
		assert_true(out.request_id == h.request_id);
	}

	h.flags = 0x0002; /* unknown flag bit */
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EPROTO);
	h.flags = 0x8000 | PROTO_FLAG_REPLY;
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EPROTO);

	h.flags = PROTO_FLAG_REPLY; /* a reply where a request was expected */
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EPROTO);
	h.flags = 0; /* a request where a reply was expected */
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EPROTO);

	h.status = PROTO_STATUS_BUSY; /* requests carry status 0 */
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EPROTO);

	h = reply_header(PROTO_OP_PING, PROTO_STATUS_MAX + 1, 0, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EPROTO);
	h.status = 0xffff;
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EPROTO);
}

static void test_header_unknown_opcode(void **state)
{
	static const uint8_t ops[] = { PROTO_OP_MAX + 1, 0x7f, 0xff };
	struct proto_header h, out;

	(void)state;
	for (size_t i = 0; i < sizeof(ops); i++) {
		h = request_header(ops[i], 0, 0);
		assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EOPNOTSUPP);
		assert_int_equal(out.opcode, ops[i]);
		h = reply_header(ops[i], PROTO_STATUS_OK, 0, 0);
		assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EOPNOTSUPP);
		/* the UNSUPPORTED reply to it echoes the opcode and must decode */
		h = reply_header(ops[i], PROTO_STATUS_UNSUPPORTED, 8, 0);
		assert_int_equal(header_roundtrip(&h, 1, &limits, &out), 0);
		assert_int_equal(out.opcode, ops[i]);
	}

	/* opcode 0: only a connection-level error reply */
	h = request_header(PROTO_OP_NONE, 0, 0);
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EOPNOTSUPP);
	h = reply_header(PROTO_OP_NONE, PROTO_STATUS_OK, 8, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EOPNOTSUPP);
	h = reply_header(PROTO_OP_NONE, PROTO_STATUS_EXISTS, 8, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EOPNOTSUPP);
	h = reply_header(PROTO_OP_NONE, PROTO_STATUS_BAD_REQUEST, 8, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), 0);
	h = reply_header(PROTO_OP_NONE, PROTO_STATUS_BUSY, 8, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), 0);
}

static void test_header_frame_too_large(void **state)
{
	struct proto_header h, out;

	(void)state;
	h = request_header(PROTO_OP_GET, limits.max_frame_bytes - PROTO_HEADER_BYTES, 0);
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), 0);
	h.body_bytes++;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EMSGSIZE);
	/* 32 + 0xffffffff must not wrap around to a small value */
	h.body_bytes = UINT32_MAX;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EMSGSIZE);
	h.body_bytes = UINT32_MAX - PROTO_HEADER_BYTES + 1;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EMSGSIZE);
	assert_true(out.request_id == h.request_id);

	/* replies are held to the same limit */
	h = reply_header(PROTO_OP_STATS, PROTO_STATUS_OK, limits.max_frame_bytes, 0);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EMSGSIZE);
}

static void test_header_payload_limit(void **state)
{
	uint64_t max_payload = (uint64_t)limits.max_batch_blocks * limits.max_block_bytes;
	struct proto_limits huge = { .max_frame_bytes = 4096, .max_batch_blocks = 8,
				     .max_block_bytes = UINT64_MAX / 2 };
	struct proto_header h, out;

	(void)state;
	h = request_header(PROTO_OP_PUT, 96, max_payload);
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), 0);
	h.payload_bytes = max_payload + 1;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EMSGSIZE);
	h.payload_bytes = UINT64_MAX;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), -EMSGSIZE);

	h = reply_header(PROTO_OP_GET, PROTO_STATUS_OK, 32, max_payload + 1);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EMSGSIZE);

	/* batch * block overflows 64 bits: the bound saturates, no wrap */
	h = request_header(PROTO_OP_PUT, 96, UINT64_MAX);
	assert_int_equal(header_roundtrip(&h, 0, &huge, &out), 0);
}

static void test_header_payload_on_op_without_one(void **state)
{
	struct proto_header h, out;

	(void)state;
	for (uint8_t op = PROTO_OP_HELLO; op <= PROTO_OP_MAX; op++) {
		h = request_header(op, 8, 1);
		assert_int_equal(header_roundtrip(&h, 0, &limits, &out),
				 op == PROTO_OP_PUT ? 0 : -EBADMSG);
		h = reply_header(op, PROTO_STATUS_OK, 8, 1);
		assert_int_equal(header_roundtrip(&h, 1, &limits, &out),
				 op == PROTO_OP_GET ? 0 : -EBADMSG);
	}
	/* an error reply carries an error body only */
	h = reply_header(PROTO_OP_GET, PROTO_STATUS_TOO_LARGE, 8, 1);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EBADMSG);
	h = reply_header(PROTO_OP_NONE, PROTO_STATUS_BAD_REQUEST, 8, 1);
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), -EBADMSG);
}

static void test_header_null_limits(void **state)
{
	struct proto_header h = request_header(PROTO_OP_PUT, UINT32_MAX, UINT64_MAX), out;

	(void)state;
	assert_int_equal(header_roundtrip(&h, 0, NULL, &out), 0);
	assert_int_equal(out.body_bytes, UINT32_MAX);
	/* protocol rules still apply */
	h.opcode = PROTO_OP_GET;
	assert_int_equal(header_roundtrip(&h, 0, NULL, &out), -EBADMSG);
}

/* ---- batches ------------------------------------------------------------ */

static void test_request_entry_bytes(void **state)
{
	(void)state;
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_PUT), 88);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_GET), 40);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_EXISTS), 32);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_MATCH), 32);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_DELETE), 32);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_HELLO), 0);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_DROP_NAMESPACE), 0);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_STATS), 0);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_PING), 0);
	assert_int_equal(proto_request_entry_bytes(PROTO_OP_NONE), 0);
	assert_int_equal(proto_request_entry_bytes(200), 0);
	assert_int_equal(proto_batch_body_bytes(3, 88), 8 + 264);
	assert_true(proto_batch_body_bytes(UINT32_MAX, 88) == 8 + (size_t)UINT32_MAX * 88);
}

static void test_put_roundtrip(void **state)
{
	static const uint64_t lengths[] = { 10, 1, 1 << 20 };
	uint8_t body[8 + 3 * 88];
	size_t n = build_put_body(body, 3, lengths);
	struct proto_batch b;

	(void)state;
	assert_int_equal(n, sizeof(body));
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), 0);
	assert_int_equal(b.count, 3);
	assert_int_equal(b.aux, 0);
	assert_int_equal(b.entry_bytes, 88);
	assert_ptr_equal(b.entries, body + 8);
	for (uint32_t i = 0; i < 3; i++) {
		struct proto_put_entry e;
		uint8_t key[PROTO_KEY_BYTES], parent[PROTO_KEY_BYTES] = { 0 };

		assert_int_equal(proto_put_entry_decode(&b, i, &e), 0);
		fill_key(key, (uint8_t)i);
		if (i > 0)
			fill_key(parent, (uint8_t)(i - 1));
		assert_memory_equal(e.key, key, PROTO_KEY_BYTES);
		assert_memory_equal(e.parent, parent, PROTO_KEY_BYTES);
		assert_true(e.length == lengths[i]);
		assert_true(e.checksum == 1000 + i);
		assert_int_equal(e.flags, i > 0 ? PROTO_PUT_HAS_PARENT : 0);
	}
	uint32_t bad = 99;
	assert_int_equal(proto_put_batch_check(&b, 11 + (1 << 20), &limits, &bad), 0);
	assert_int_equal(bad, 99); /* untouched on success */
}

static void test_get_roundtrip(void **state)
{
	uint8_t body[8 + 2 * 40];
	struct proto_batch b;
	struct proto_get_entry in[2], out;

	(void)state;
	proto_batch_encode_prefix(body, 2, 0);
	for (uint32_t i = 0; i < 2; i++) {
		fill_key(in[i].key, (uint8_t)(40 + i));
		in[i].max_length = i ? UINT64_MAX : 4096;
		proto_get_entry_encode(body, i, &in[i]);
	}
	assert_int_equal(proto_batch_decode(body, sizeof(body), proto_request_entry_bytes(PROTO_OP_GET),
					    &limits, &b), 0);
	assert_int_equal(b.count, 2);
	for (uint32_t i = 0; i < 2; i++) {
		proto_get_entry_decode(&b, i, &out);
		assert_memory_equal(out.key, in[i].key, PROTO_KEY_BYTES);
		assert_true(out.max_length == in[i].max_length);
	}
}

static void test_key_batch_roundtrip(void **state)
{
	static const uint8_t ops[] = { PROTO_OP_EXISTS, PROTO_OP_MATCH, PROTO_OP_DELETE };
	uint8_t body[8 + 5 * 32];

	(void)state;
	for (size_t k = 0; k < sizeof(ops); k++) {
		uint32_t aux = ops[k] == PROTO_OP_MATCH ? 2500 : 0;
		size_t n = build_key_body(body, 5, aux);
		struct proto_batch b;

		assert_int_equal(proto_batch_decode(body, n, proto_request_entry_bytes(ops[k]),
						    &limits, &b), 0);
		assert_int_equal(b.count, 5);
		assert_int_equal(b.aux, aux);
		for (uint32_t i = 0; i < 5; i++) {
			uint8_t key[PROTO_KEY_BYTES];

			fill_key(key, (uint8_t)i);
			assert_memory_equal(proto_key_entry(&b, i), key, PROTO_KEY_BYTES);
		}
	}
}

static void test_result_roundtrip(void **state)
{
	const struct proto_result in[] = {
		{ PROTO_STATUS_OK, PROTO_TIER_DRAM, 4096, 0xdeadbeefcafef00dull, 0, 0 },
		{ PROTO_STATUS_EXISTS, PROTO_TIER_NONE, 7, 9, 0, 0 },
		{ PROTO_STATUS_NOT_FOUND, PROTO_TIER_NONE, 0, 0, 0, 0 },
		{ PROTO_STATUS_TOO_LARGE, PROTO_TIER_NVME, UINT64_MAX, 0, 0, 0 },
		{ PROTO_STATUS_BAD_CHECKSUM, PROTO_TIER_NONE, 0, 0, 0, 0 },
	};
	uint8_t body[8 + 5 * 24];
	struct proto_batch b;

	(void)state;
	memset(body, 0xff, sizeof(body)); /* the encoder must clear reserved bytes */
	proto_batch_encode_prefix(body, 5, 0);
	for (uint32_t i = 0; i < 5; i++)
		proto_result_encode(body, i, &in[i]);
	assert_int_equal(proto_batch_decode(body, sizeof(body), PROTO_RESULT_ENTRY_BYTES, &limits, &b), 0);
	for (uint32_t i = 0; i < 5; i++) {
		struct proto_result out;

		assert_int_equal(proto_result_decode(&b, i, &out), 0);
		assert_int_equal(out.status, in[i].status);
		assert_int_equal(out.tier, in[i].tier);
		assert_true(out.length == in[i].length);
		assert_true(out.checksum == in[i].checksum);
	}
}

static void test_batch_truncated(void **state)
{
	static const uint64_t lengths[] = { 1, 2, 3 };
	uint8_t body[8 + 3 * 88];
	size_t n = build_put_body(body, 3, lengths);
	struct proto_batch b;

	(void)state;
	/* every proper prefix of a valid body is rejected */
	for (size_t len = 0; len < n; len++) {
		uint8_t *copy = malloc(len ? len : 1);

		assert_non_null(copy);
		memcpy(copy, body, len);
		assert_int_equal(proto_batch_decode(copy, len, 88, &limits, &b), -EPROTO);
		free(copy);
	}
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), 0);
}

static void test_batch_count_lies(void **state)
{
	static const uint64_t lengths[] = { 1, 2, 3 };
	uint8_t body[8 + 3 * 88];
	size_t n = build_put_body(body, 3, lengths);
	struct proto_batch b;

	(void)state;
	memset(&b, 0x5a, sizeof(b));
	proto_put_u32(body, 4); /* claims more entries than the body holds */
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), -EPROTO);
	assert_int_equal(b.count, 0x5a5a5a5a); /* untouched on error */
	proto_put_u32(body, 2); /* claims fewer: trailing bytes */
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), -EPROTO);
	proto_put_u32(body, 0);
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), -EPROTO);
	assert_int_equal(proto_batch_decode(body, 8, 88, &limits, &b), -EPROTO);
	/* the right count, but body_bytes lies by one either way */
	proto_put_u32(body, 3);
	assert_int_equal(proto_batch_decode(body, n - 1, 88, &limits, &b), -EPROTO);
	assert_int_equal(proto_batch_decode(body, n, 87, &limits, &b), -EPROTO);
	assert_int_equal(proto_batch_decode(body, n, 0, &limits, &b), -EINVAL);
}

static void test_batch_absurd_counts(void **state)
{
	uint8_t body[8 + 17 * 32];
	struct proto_batch b;
	size_t n;

	(void)state;
	n = build_key_body(body, limits.max_batch_blocks, 0);
	assert_int_equal(proto_batch_decode(body, n, 32, &limits, &b), 0);
	n = build_key_body(body, limits.max_batch_blocks + 1, 0);
	assert_int_equal(proto_batch_decode(body, n, 32, &limits, &b), -EMSGSIZE);

	proto_put_u32(body, UINT32_MAX);
	assert_int_equal(proto_batch_decode(body, n, 32, &limits, &b), -EMSGSIZE);
	assert_int_equal(proto_batch_decode(body, 8, 88, &limits, &b), -EMSGSIZE);
	/* without limits the count is checked against the bytes, with no
	 * overflow in count * entry_bytes */
	assert_int_equal(proto_batch_decode(body, n, 32, NULL, &b), -EPROTO);
	assert_int_equal(proto_batch_decode(body, n, UINT32_MAX, NULL, &b), -EPROTO);
	proto_put_u32(body, 0x80000000u);
	assert_int_equal(proto_batch_decode(body, n, 88, NULL, &b), -EPROTO);
}

static void test_batch_reserved_nonzero(void **state)
{
	static const uint64_t lengths[] = { 5, 6 };
	uint8_t body[8 + 2 * 88];
	uint8_t res[8 + 24];
	struct proto_batch b;
	struct proto_result r = { PROTO_STATUS_OK, PROTO_TIER_DRAM, 1, 2, 0, 0 };
	size_t n;

	(void)state;
	for (int off = 84; off < 88; off++) {
		n = build_put_body(body, 2, lengths);
		body[8 + 88 + off] = 0x01; /* entry 1's reserved u32 */
		assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), -EPROTO);
	}

	static const int res_reserved[] = { 3, 4, 5, 6, 7 };
	for (size_t k = 0; k < 5; k++) {
		proto_batch_encode_prefix(res, 1, 0);
		proto_result_encode(res, 0, &r);
		assert_int_equal(proto_batch_decode(res, sizeof(res), 24, &limits, &b), 0);
		res[8 + res_reserved[k]] = 0x80;
		assert_int_equal(proto_batch_decode(res, sizeof(res), 24, &limits, &b), -EPROTO);
		/* the entry decoder checks too, for callers that skip the batch check */
		b.count = 1;
		b.entries = res + 8;
		b.entry_bytes = 24;
		assert_int_equal(proto_result_decode(&b, 0, &r), -EPROTO);
	}
}

static void test_result_unknown_values(void **state)
{
	uint8_t res[8 + 24];
	struct proto_batch b;
	struct proto_result r = { PROTO_STATUS_OK, PROTO_TIER_DRAM, 1, 2, 0, 0 }, out;

	(void)state;
	proto_batch_encode_prefix(res, 1, 0);
	r.status = PROTO_STATUS_MAX + 1;
	proto_result_encode(res, 0, &r);
	assert_int_equal(proto_batch_decode(res, sizeof(res), 24, &limits, &b), 0);
	memset(&out, 0x33, sizeof(out));
	assert_int_equal(proto_result_decode(&b, 0, &out), -EPROTO);
	assert_int_equal(out.status, 0x3333);
	r.status = PROTO_STATUS_OK;
	r.tier = PROTO_TIER_NVME + 1;
	proto_result_encode(res, 0, &r);
	assert_int_equal(proto_result_decode(&b, 0, &out), -EPROTO);
}

static void test_put_entry_flags_and_parent(void **state)
{
	static const uint64_t lengths[] = { 5, 6, 7 };
	uint8_t body[8 + 3 * 88];
	struct proto_batch b;
	struct proto_put_entry e;
	uint32_t bad;
	size_t n;

	(void)state;
	/* unknown flag bit on entry 2 */
	n = build_put_body(body, 3, lengths);
	assert_int_equal(proto_batch_decode(body, n, 88, &limits, &b), 0);
	proto_put_u32(body + 8 + 2 * 88 + 80, PROTO_PUT_HAS_PARENT | 0x2);
	assert_int_equal(proto_put_entry_decode(&b, 2, &e), -EPROTO);
	assert_int_equal(proto_put_batch_check(&b, 18, &limits, &bad), -EPROTO);
	assert_int_equal(bad, 2);

	/* a parent without HAS_PARENT */
	n = build_put_body(body, 3, lengths);
	proto_put_u32(body + 8 + 1 * 88 + 80, 0);
	assert_int_equal(proto_put_entry_decode(&b, 1, &e), -EPROTO);
	assert_int_equal(proto_put_batch_check(&b, 18, &limits, &bad), -EPROTO);
	assert_int_equal(bad, 1);

	/* HAS_PARENT with the all-zero "no parent" key */
	n = build_put_body(body, 3, lengths);
	proto_put_u32(body + 8 + 80, PROTO_PUT_HAS_PARENT);
	assert_int_equal(proto_put_entry_decode(&b, 0, &e), -EPROTO);
	assert_int_equal(proto_put_batch_check(&b, 18, &limits, &bad), -EPROTO);
	assert_int_equal(bad, 0);

	/* reserved u32 nonzero, seen by the entry decoder too */
	n = build_put_body(body, 3, lengths);
	proto_put_u32(body + 8 + 88 + 84, 1);
	assert_int_equal(proto_put_entry_decode(&b, 1, &e), -EPROTO);
	(void)n;
}

static void test_put_check_lengths(void **state)
{
	uint8_t body[8 + 3 * 88];
	struct proto_batch b;
	uint32_t bad;

	(void)state;
	{ /* a zero-length block */
		const uint64_t l[] = { 5, 0, 7 };

		build_put_body(body, 3, l);
		assert_int_equal(proto_batch_decode(body, sizeof(body), 88, &limits, &b), 0);
		assert_int_equal(proto_put_batch_check(&b, 12, &limits, &bad), -EPROTO);
		assert_int_equal(bad, 1);
	}
	{ /* an oversize block; exactly max_block_bytes is fine */
		const uint64_t l[] = { limits.max_block_bytes, limits.max_block_bytes + 1, 1 };

		build_put_body(body, 3, l);
		assert_int_equal(proto_batch_decode(body, sizeof(body), 88, &limits, &b), 0);
		assert_int_equal(proto_put_batch_check(&b, 2 * limits.max_block_bytes + 2, &limits, &bad),
				 -EMSGSIZE);
		assert_int_equal(bad, 1);
		/* without limits only the sum matters */
		assert_int_equal(proto_put_batch_check(&b, 2 * limits.max_block_bytes + 2, NULL, &bad), 0);
	}
	{ /* lengths that do not add up to payload_bytes */
		const uint64_t l[] = { 5, 6, 7 };

		build_put_body(body, 3, l);
		assert_int_equal(proto_batch_decode(body, sizeof(body), 88, &limits, &b), 0);
		assert_int_equal(proto_put_batch_check(&b, 18, &limits, &bad), 0);
		assert_int_equal(proto_put_batch_check(&b, 19, &limits, &bad), -EPROTO);
		assert_int_equal(bad, 2); /* short: the last entry */
		assert_int_equal(proto_put_batch_check(&b, 17, &limits, &bad), -EPROTO);
		assert_int_equal(bad, 2);
		assert_int_equal(proto_put_batch_check(&b, 10, &limits, &bad), -EPROTO);
		assert_int_equal(bad, 1); /* the entry that passes the total */
		assert_int_equal(proto_put_batch_check(&b, 0, &limits, &bad), -EPROTO);
		assert_int_equal(bad, 0);
	}
	{ /* lengths whose sum overflows 64 bits to exactly payload_bytes */
		const uint64_t l[] = { UINT64_MAX, 2, 3 };

		build_put_body(body, 3, l);
		assert_int_equal(proto_batch_decode(body, sizeof(body), 88, NULL, &b), 0);
		/* UINT64_MAX + 2 + 3 wraps to 4 */
		assert_int_equal(proto_put_batch_check(&b, 4, NULL, &bad), -EPROTO);
		assert_int_equal(bad, 0);
		assert_int_equal(proto_put_batch_check(&b, UINT64_MAX, NULL, &bad), -EPROTO);
		assert_int_equal(bad, 1);
	}
}

/* ---- HELLO -------------------------------------------------------------- */

static void test_hello_roundtrip(void **state)
{
	const char *token = "s3cr3t token\x01\xff";
	struct proto_hello h = { 1, 3, "llama-3-8b/tp2/r0", 17, token, 14 }, out;
	uint8_t body[8 + 17 + 14];

	(void)state;
	assert_int_equal(proto_hello_body_bytes(&h), sizeof(body));
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	assert_int_equal(proto_get_u16(body + 4), 17);
	assert_int_equal(proto_hello_decode(body, sizeof(body), &out), 0);
	assert_int_equal(out.min_version, 1);
	assert_int_equal(out.max_version, 3);
	assert_int_equal(out.ns_len, 17);
	assert_memory_equal(out.ns, "llama-3-8b/tp2/r0", 17);
	assert_ptr_equal(out.ns, (const char *)body + 8); /* borrowed */
	assert_int_equal(out.token_len, 14);
	assert_memory_equal(out.token, token, 14);

	/* no token; longest name; longest token */
	char name[PROTO_NAME_MAX_BYTES];
	static char tok[PROTO_TOKEN_MAX_BYTES];
	static uint8_t big[8 + PROTO_NAME_MAX_BYTES + PROTO_TOKEN_MAX_BYTES];

	memset(name, '~', sizeof(name));
	memset(tok, 0, sizeof(tok));
	h = (struct proto_hello){ 1, 1, name, PROTO_NAME_MAX_BYTES, NULL, 0 };
	assert_int_equal(proto_hello_encode(&h, big, sizeof(big)), 0);
	assert_int_equal(proto_hello_decode(big, proto_hello_body_bytes(&h), &out), 0);
	assert_null(out.token);
	assert_int_equal(out.token_len, 0);
	h.token = tok;
	h.token_len = PROTO_TOKEN_MAX_BYTES;
	assert_int_equal(proto_hello_encode(&h, big, sizeof(big)), 0);
	assert_int_equal(proto_hello_decode(big, sizeof(big), &out), 0);
	assert_int_equal(out.token_len, PROTO_TOKEN_MAX_BYTES);
}

static void test_hello_encode_errors(void **state)
{
	static char tok[PROTO_TOKEN_MAX_BYTES + 1];
	char name[PROTO_NAME_MAX_BYTES + 1];
	uint8_t body[2048];
	struct proto_hello h;

	(void)state;
	memset(name, 'a', sizeof(name));
	h = (struct proto_hello){ 1, 1, name, 0, NULL, 0 };
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.ns_len = PROTO_NAME_MAX_BYTES + 1;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.ns_len = 4;
	h.token = tok;
	h.token_len = PROTO_TOKEN_MAX_BYTES + 1;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.token = NULL;
	h.token_len = 3;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.token_len = 0;
	h.ns = NULL;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.ns = name;

	static const char bad_chars[] = { ' ', 0x7f, '\0', '\n', (char)0x80, (char)0xff };
	for (size_t i = 0; i < sizeof(bad_chars); i++) {
		char ns[4] = { 'a', 'b', bad_chars[i], 'c' };

		h.ns = ns;
		assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	}
	h.ns = name;
	h.min_version = 0;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.min_version = 3;
	h.max_version = 2;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), -EINVAL);
	h.min_version = h.max_version = 1;
	assert_int_equal(proto_hello_encode(&h, body, 8 + 3), -ENOSPC);
	assert_int_equal(proto_hello_encode(&h, body, 8 + 4), 0);
}

static void test_hello_decode_errors(void **state)
{
	struct proto_hello h = { 1, 1, "tenant-a", 8, "tok", 3 }, out;
	uint8_t body[8 + 8 + 3 + 1] = { 0 };
	size_t n = proto_hello_body_bytes(&h);

	(void)state;
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	for (size_t len = 0; len < n; len++)
		assert_int_equal(proto_hello_decode(body, len, &out), -EPROTO);
	assert_int_equal(proto_hello_decode(body, n + 1, &out), -EPROTO); /* trailing byte */
	assert_int_equal(proto_hello_decode(body, n, &out), 0);

	/* lengths that lie: name length taken from the token */
	proto_put_u16(body + 4, 9);
	proto_put_u16(body + 6, 2);
	assert_int_equal(proto_hello_decode(body, n, &out), 0); /* adds up... */
	assert_int_equal(out.ns_len, 9);
	proto_put_u16(body + 6, 3);
	assert_int_equal(proto_hello_decode(body, n, &out), -EPROTO); /* ...this does not */

	/* name length 0 and over 255 (the body made to match) */
	static uint8_t big[8 + 256 + 1];
	memset(big, 'x', sizeof(big));
	proto_put_u16(big, 1);
	proto_put_u16(big + 2, 1);
	proto_put_u16(big + 4, 0);
	proto_put_u16(big + 6, 1);
	assert_int_equal(proto_hello_decode(big, 9, &out), -EPROTO);
	proto_put_u16(big + 4, 256);
	proto_put_u16(big + 6, 0);
	assert_int_equal(proto_hello_decode(big, 8 + 256, &out), -EPROTO);
	proto_put_u16(big + 4, 255);
	assert_int_equal(proto_hello_decode(big, 8 + 255, &out), 0);

	/* token length over 1024 */
	static uint8_t huge[8 + 1 + 1025];
	memset(huge, 'y', sizeof(huge));
	proto_put_u16(huge, 1);
	proto_put_u16(huge + 2, 1);
	proto_put_u16(huge + 4, 1);
	proto_put_u16(huge + 6, 1025);
	assert_int_equal(proto_hello_decode(huge, sizeof(huge), &out), -EPROTO);

	/* a space in the name; versions */
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	body[8 + 3] = ' ';
	assert_int_equal(proto_hello_decode(body, n, &out), -EPROTO);
	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	proto_put_u16(body, 0);
	assert_int_equal(proto_hello_decode(body, n, &out), -EPROTO);
	proto_put_u16(body, 5);
	proto_put_u16(body + 2, 4);
	memset(&out, 0x77, sizeof(out));
	assert_int_equal(proto_hello_decode(body, n, &out), -EPROTO);
	assert_int_equal(out.min_version, 0x7777); /* untouched */
	/* a range that does not include 1 still decodes: negotiation is the
	 * server's job (UNSUPPORTED) */
	proto_put_u16(body, 2);
	proto_put_u16(body + 2, 9);
	assert_int_equal(proto_hello_decode(body, n, &out), 0);
	assert_int_equal(out.min_version, 2);
}

static void test_hello_reply(void **state)
{
	const struct proto_hello_reply in = {
		.version = 1, .rdma_port = 7471, .max_batch_blocks = 1024,
		.max_block_bytes = 64ull << 20, .max_frame_bytes = 4u << 20,
		.max_lease_ms = 5000, .max_inflight_put_bytes = 512ull << 20,
	};
	struct proto_hello_reply out, bad;
	uint8_t body[PROTO_HELLO_REPLY_MAX_BYTES];

	(void)state;
	proto_hello_reply_encode(&in, body);
	assert_int_equal(proto_get_u16(body + 2), 7471);
	assert_int_equal(proto_get_u32(body + 16), 4u << 20);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), 0);
	assert_memory_equal(&out, &in, sizeof(in));

	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES - 1, &out), -EPROTO);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES + 1, &out), -EPROTO);

	bad = in;
	bad.version = 3; /* no such version */
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad.version = 0;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad = in;
	bad.server_flags = 1;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad = in;
	bad.max_batch_blocks = 0;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad = in;
	bad.max_block_bytes = 0;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad = in;
	bad.max_frame_bytes = 32 + 8 + 88 - 1;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), -EPROTO);
	bad.max_frame_bytes++;
	proto_hello_reply_encode(&bad, body);
	assert_int_equal(proto_hello_reply_decode(body, PROTO_HELLO_REPLY_BYTES, &out), 0);
}

/* ---- protocol version 2 --------------------------------------------------- */

static void test_header_v2_accepted(void **state)
{
	struct proto_header h = request_header(PROTO_OP_MATCH, 24 + 32, 0), out;

	(void)state;
	h.version = PROTO_VERSION_2;
	assert_int_equal(header_roundtrip(&h, 0, &limits, &out), 0);
	assert_int_equal(out.version, 2);
	h = reply_header(PROTO_OP_MATCH, PROTO_STATUS_OK, 24, 0);
	h.version = PROTO_VERSION_2;
	assert_int_equal(header_roundtrip(&h, 1, &limits, &out), 0);
	assert_int_equal(PROTO_VERSION, 1); /* HELLO's header version is frozen */
	assert_int_equal(PROTO_VERSION_MIN, 1);
	assert_int_equal(PROTO_VERSION_MAX, 2);
}

/* A v2 PUT entry carries retain_ms at offset 84; v1 keeps it reserved. */
static void test_put_entry_v2(void **state)
{
	struct proto_put_entry e = { .length = 5, .checksum = 7, .retain_ms = 60000 }, out;
	uint8_t body[8 + 88];
	struct proto_batch b;
	uint32_t bad = 9;

	(void)state;
	fill_key(e.key, 1);
	proto_batch_encode_prefix(body, 1, 0);
	proto_put_entry_encode_v(body, 0, PROTO_VERSION_2, &e);
	assert_int_equal(proto_get_u32(body + 8 + 84), 60000);
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 88, 2, &limits, &b), 0);
	assert_int_equal(b.version, 2);
	assert_int_equal(proto_put_entry_decode(&b, 0, &out), 0);
	assert_int_equal(out.retain_ms, 60000);
	assert_memory_equal(out.key, e.key, PROTO_KEY_BYTES);
	assert_int_equal(proto_put_batch_check(&b, 5, &limits, &bad), 0);
	/* the same bytes are malformed in v1: offset 84 is reserved there */
	assert_int_equal(proto_batch_decode(body, sizeof(body), 88, &limits, &b), -EPROTO);
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 88, 1, &limits, &b), -EPROTO);
	b.version = 1; /* a batch whose entries were not checked: the entry checks say it too */
	assert_int_equal(proto_put_entry_decode(&b, 0, &out), -EPROTO);
	assert_int_equal(proto_put_batch_check(&b, 5, &limits, &bad), -EPROTO);
	assert_int_equal(bad, 0);
	/* v1 encoders drop retain_ms; a v1 entry decodes with retain_ms 0 */
	proto_put_entry_encode(body, 0, &e);
	assert_int_equal(proto_get_u32(body + 8 + 84), 0);
	proto_put_entry_encode_v(body, 0, PROTO_VERSION_1, &e);
	assert_int_equal(proto_get_u32(body + 8 + 84), 0);
	assert_int_equal(proto_batch_decode(body, sizeof(body), 88, &limits, &b), 0);
	assert_int_equal(b.version, 1);
	out.retain_ms = 1;
	assert_int_equal(proto_put_entry_decode(&b, 0, &out), 0);
	assert_int_equal(out.retain_ms, 0);
	/* other v2 rules still hold: unknown flags, inconsistent parent */
	e.flags = 2;
	proto_put_entry_encode_v(body, 0, PROTO_VERSION_2, &e);
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 88, 2, &limits, &b), 0);
	assert_int_equal(proto_put_entry_decode(&b, 0, &out), -EPROTO);
	e.flags = PROTO_PUT_HAS_PARENT; /* with an all-zero parent */
	proto_put_entry_encode_v(body, 0, PROTO_VERSION_2, &e);
	assert_int_equal(proto_put_entry_decode(&b, 0, &out), -EPROTO);
	/* a layout version nobody speaks */
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 88, 3, &limits, &b), -EPROTO);
}

/* A v2 result carries flags (offset 3) and retain_ms (offset 4). */
static void test_result_v2(void **state)
{
	struct proto_result r = { PROTO_STATUS_OK, PROTO_TIER_DRAM, 5, 7, 0, 0 }, out;
	uint8_t body[8 + 24];
	struct proto_batch b;

	(void)state;
	proto_batch_encode_prefix(body, 1, 0);
	r.flags = PROTO_PUT_RETAINED | PROTO_PUT_RETAIN_CLAMPED;
	r.retain_ms = 86400000;
	proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
	assert_int_equal(body[8 + 3], PROTO_PUT_RETAINED | PROTO_PUT_RETAIN_CLAMPED);
	assert_int_equal(proto_get_u32(body + 8 + 4), 86400000);
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 24, 2, &limits, &b), 0);
	assert_int_equal(proto_result_decode(&b, 0, &out), 0);
	assert_int_equal(out.flags, r.flags);
	assert_int_equal(out.retain_ms, r.retain_ms);
	assert_int_equal(out.length, 5);
	assert_int_equal(out.checksum, 7);
	/* reserved in v1 */
	assert_int_equal(proto_batch_decode(body, sizeof(body), 24, &limits, &b), -EPROTO);
	/* budget refusal: a flag without a retention is consistent */
	r.flags = PROTO_PUT_RETAIN_BUDGET;
	r.retain_ms = 0;
	proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
	assert_int_equal(proto_batch_decode_v(body, sizeof(body), 24, 2, &limits, &b), 0);
	assert_int_equal(proto_result_decode(&b, 0, &out), 0);
	assert_int_equal(out.flags, PROTO_PUT_RETAIN_BUDGET);
	/* RETAINED and retain_ms disagree; an unknown bit */
	r.flags = PROTO_PUT_RETAINED;
	proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
	assert_int_equal(proto_result_decode(&b, 0, &out), -EPROTO);
	r.flags = 0;
	r.retain_ms = 10;
	proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
	assert_int_equal(proto_result_decode(&b, 0, &out), -EPROTO);
	r.flags = 0x08;
	r.retain_ms = 0;
	proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
	assert_int_equal(proto_result_decode(&b, 0, &out), -EPROTO);
	/* v1 encoders write zeros there, whatever the struct says */
	r.flags = PROTO_PUT_RETAINED;
	r.retain_ms = 10;
	proto_result_encode(body, 0, &r);
	assert_int_equal(body[8 + 3], 0);
	assert_int_equal(proto_get_u32(body + 8 + 4), 0);
	proto_result_encode_v(body, 0, PROTO_VERSION_1, &r);
	assert_int_equal(proto_get_u32(body + 8 + 4), 0);
	assert_int_equal(proto_batch_decode(body, sizeof(body), 24, &limits, &b), 0);
	assert_int_equal(proto_result_decode(&b, 0, &out), 0);
	assert_int_equal(out.flags, 0);
	assert_int_equal(out.retain_ms, 0);
}

/* Build a MATCH request of n keys in `version` into body; returns its bytes. */
static size_t match_body(uint8_t *body, uint8_t version, uint32_t n, uint32_t lease_ms,
			 const struct proto_match_opts *o)
{
	proto_match_encode_prefix(body, version, n, lease_ms, o);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t key[PROTO_KEY_BYTES];

		fill_key(key, (uint8_t)i);
		proto_match_key_encode(body, version, i, key);
	}
	return proto_match_body_bytes(version, n);
}

static void test_match_request_v1_v2(void **state)
{
	const struct proto_match_opts o = { .wait_ms = 2500, .want = 2, .retain_ms = 60000 };
	uint8_t body[24 + 32 * 20], key[PROTO_KEY_BYTES];
	struct proto_match_req m;
	size_t n;

	(void)state;
	assert_int_equal(proto_match_body_bytes(1, 3), 8 + 3 * 32);
	assert_int_equal(proto_match_body_bytes(0, 3), 8 + 3 * 32);
	assert_int_equal(proto_match_body_bytes(2, 3), 24 + 3 * 32);
	/* v2: options after the prefix, keys from offset 24 */
	n = match_body(body, 2, 3, 1000, &o);
	assert_int_equal(n, 24 + 96);
	assert_int_equal(proto_get_u32(body + 8), 2500);
	assert_int_equal(proto_get_u32(body + 12), 2);
	assert_int_equal(proto_get_u32(body + 16), 60000);
	assert_int_equal(proto_get_u32(body + 20), 0);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), 0);
	assert_int_equal(m.keys.count, 3);
	assert_int_equal(m.lease_ms, 1000);
	assert_int_equal(m.keys.aux, 1000);
	assert_int_equal(m.keys.version, 2);
	assert_int_equal(m.opts.wait_ms, 2500);
	assert_int_equal(m.opts.want, 2);
	assert_int_equal(m.opts.retain_ms, 60000);
	fill_key(key, 2);
	assert_memory_equal(proto_key_entry(&m.keys, 2), key, PROTO_KEY_BYTES);
	/* v1 still decodes, options zero; its options are not sent */
	n = match_body(body, 1, 3, 7, &o);
	assert_int_equal(n, 8 + 96);
	assert_int_equal(proto_match_decode(body, n, 1, &limits, &m), 0);
	assert_int_equal(m.keys.count, 3);
	assert_int_equal(m.lease_ms, 7);
	assert_int_equal(m.opts.wait_ms, 0);
	assert_int_equal(m.opts.want, 0);
	assert_int_equal(m.opts.retain_ms, 0);
	fill_key(key, 1);
	assert_memory_equal(proto_key_entry(&m.keys, 1), key, PROTO_KEY_BYTES);
	assert_int_equal(proto_match_decode(body, n, 0, &limits, &m), 0); /* 0 reads as 1 */
	/* a v1 body read as v2 and a v2 body read as v1: wrong body_bytes */
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), -EPROTO);
	n = match_body(body, 2, 3, 7, NULL);
	assert_int_equal(proto_get_u32(body + 8) | proto_get_u32(body + 12), 0);
	assert_int_equal(proto_match_decode(body, n, 1, &limits, &m), -EPROTO);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), 0);
	assert_int_equal(m.opts.want, 0); /* 0 = count, left to the server */
	/* v2 body_bytes one off either way */
	assert_int_equal(proto_match_decode(body, n - 1, 2, &limits, &m), -EPROTO);
	assert_int_equal(proto_match_decode(body, n + 1, 2, &limits, &m), -EPROTO);
	/* want == count is fine; want > count is not */
	proto_put_u32(body + 12, 3);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), 0);
	proto_put_u32(body + 12, 4);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), -EPROTO);
	proto_put_u32(body + 12, UINT32_MAX);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), -EPROTO);
	proto_put_u32(body + 12, 1);
	/* reserved option word */
	proto_put_u32(body + 20, 1);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), -EPROTO);
	proto_put_u32(body + 20, 0);
	/* any wait and retention are well-formed (the server caps them) */
	proto_put_u32(body + 8, UINT32_MAX);
	proto_put_u32(body + 16, UINT32_MAX);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), 0);
	assert_true(m.opts.wait_ms == UINT32_MAX && m.opts.retain_ms == UINT32_MAX);
	/* count 0, count over the limit, short bodies, unknown version */
	proto_put_u32(body, 0);
	assert_int_equal(proto_match_decode(body, 24, 2, &limits, &m), -EPROTO);
	n = match_body(body, 2, 17, 0, NULL);
	assert_int_equal(proto_match_decode(body, n, 2, &limits, &m), -EMSGSIZE);
	assert_int_equal(proto_match_decode(body, n, 2, NULL, &m), 0);
	n = match_body(body, 2, 1, 0, NULL);
	for (size_t len = 0; len < n; len++)
		assert_int_equal(proto_match_decode(body, len, 2, &limits, &m), -EPROTO);
	assert_int_equal(proto_match_decode(body, n, 3, &limits, &m), -EPROTO);
	m.keys.count = 99; /* out is written only on success */
	assert_int_equal(proto_match_decode(body, n - 1, 2, &limits, &m), -EPROTO);
	assert_int_equal(m.keys.count, 99);
}

static void test_match_reply_v2(void **state)
{
	const struct proto_match_reply in = {
		.matched = 5, .lease_ms = 5000,
		.flags = PROTO_MATCH_LEASE_CUT | PROTO_MATCH_WAITED | PROTO_MATCH_RETAIN_CLAMPED,
		.present = 9, .retained = 9, .retain_ms = 3600000,
	};
	struct proto_match_reply out, bad;
	uint8_t body[PROTO_MATCH_REPLY_MAX_BYTES];
	uint32_t m, lease;

	(void)state;
	assert_int_equal(proto_match_reply_bytes(1), 8);
	assert_int_equal(proto_match_reply_bytes(2), 24);
	proto_match_reply_encode_v(2, &in, body);
	assert_int_equal(proto_get_u32(body + 8), in.flags);
	assert_int_equal(proto_get_u32(body + 12), 9);
	assert_int_equal(proto_get_u32(body + 20), 3600000);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), 0);
	assert_memory_equal(&out, &in, sizeof(in));
	assert_int_equal(proto_match_reply_decode_v(body, 23, 2, &out), -EPROTO);
	assert_int_equal(proto_match_reply_decode_v(body, 25, 2, &out), -EPROTO);
	assert_int_equal(proto_match_reply_decode_v(body, 8, 2, &out), -EPROTO);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 3, &out), -EPROTO);
	/* v1: 8 bytes, the same first two words; present = matched */
	memset(body, 0xee, sizeof(body));
	proto_match_reply_encode_v(1, &in, body);
	assert_int_equal(body[8], 0xee); /* nothing past the v1 layout */
	assert_int_equal(proto_match_reply_decode_v(body, 8, 1, &out), 0);
	assert_int_equal(out.matched, 5);
	assert_int_equal(out.lease_ms, 5000);
	assert_int_equal(out.present, 5);
	assert_int_equal(out.flags | out.retained | out.retain_ms, 0);
	assert_int_equal(proto_match_reply_decode(body, 8, &m, &lease), 0);
	assert_int_equal(m, 5);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 1, &out), -EPROTO);
	/* what a v2 reply must agree with */
	bad = in;
	bad.flags = 0x100;
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	bad = in;
	bad.present = 4; /* < matched */
	bad.retained = 4;
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	bad = in;
	bad.flags = 0; /* present > matched without LEASE_CUT */
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	bad = in;
	bad.retained = 10; /* > present */
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	bad = in;
	bad.retain_ms = 0; /* retained without a retention */
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	bad = in;
	bad.retained = 0; /* a retention of nothing */
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), -EPROTO);
	/* a plain answer, as a server without wait and retention gives it */
	bad = (struct proto_match_reply){ .matched = 3, .lease_ms = 0, .present = 3 };
	proto_match_reply_encode_v(2, &bad, body);
	assert_int_equal(proto_match_reply_decode_v(body, 24, 2, &out), 0);
	assert_memory_equal(&out, &bad, sizeof(bad));
}

static void test_hello_reply_v2(void **state)
{
	const struct proto_hello_reply in = {
		.version = 2, .rdma_port = 0, .max_batch_blocks = 1024,
		.max_block_bytes = 64ull << 20, .max_frame_bytes = 1u << 20,
		.max_lease_ms = 5000, .max_inflight_put_bytes = 512ull << 20,
		.max_match_wait_ms = 30000, .max_retain_ms = 86400000,
	};
	struct proto_hello_reply out, v1;
	uint8_t body[PROTO_HELLO_REPLY_MAX_BYTES + 8];

	(void)state;
	assert_int_equal(proto_hello_reply_bytes(1), 40);
	assert_int_equal(proto_hello_reply_bytes(2), 48);
	proto_hello_reply_encode(&in, body);
	assert_int_equal(proto_get_u32(body + 40), 30000);
	assert_int_equal(proto_get_u32(body + 44), 86400000);
	assert_int_equal(proto_hello_reply_decode(body, 48, &out), 0);
	assert_memory_equal(&out, &in, sizeof(in));
	/* the version field says the layout: a v2 reply of 40 bytes, or a v1
	 * reply of 48, is malformed */
	assert_int_equal(proto_hello_reply_decode(body, 40, &out), -EPROTO);
	assert_int_equal(proto_hello_reply_decode(body, 47, &out), -EPROTO);
	assert_int_equal(proto_hello_reply_decode(body, 49, &out), -EPROTO);
	v1 = in;
	v1.version = 1;
	memset(body, 0xee, sizeof(body));
	proto_hello_reply_encode(&v1, body);
	assert_int_equal(body[40], 0xee); /* v1 writes 40 bytes only */
	assert_int_equal(proto_hello_reply_decode(body, 48, &out), -EPROTO);
	assert_int_equal(proto_hello_reply_decode(body, 40, &out), 0);
	assert_int_equal(out.version, 1);
	assert_int_equal(out.max_match_wait_ms, 0);
	assert_int_equal(out.max_retain_ms, 0);
	assert_int_equal(out.max_lease_ms, 5000);
	assert_int_equal(proto_hello_reply_decode(body, 12, &out), -EPROTO);
}

/* ---- MATCH, DROP, names, STATS ------------------------------------------ */

static void test_match_and_drop_replies(void **state)
{
	uint8_t m[PROTO_MATCH_REPLY_BYTES], d[PROTO_DROP_REPLY_BYTES];
	uint32_t matched = 0, lease = 0;
	uint64_t blocks = 0, bytes = 0;

	(void)state;
	proto_match_reply_encode(17, 5000, m);
	assert_int_equal(proto_match_reply_decode(m, sizeof(m), &matched, &lease), 0);
	assert_int_equal(matched, 17);
	assert_int_equal(lease, 5000);
	matched = lease = 1;
	assert_int_equal(proto_match_reply_decode(m, 7, &matched, &lease), -EPROTO);
	assert_int_equal(proto_match_reply_decode(m, 9, &matched, &lease), -EPROTO);
	assert_int_equal(matched, 1);

	proto_drop_reply_encode(UINT64_MAX, 123456789012ull, d);
	assert_int_equal(proto_drop_reply_decode(d, sizeof(d), &blocks, &bytes), 0);
	assert_true(blocks == UINT64_MAX);
	assert_true(bytes == 123456789012ull);
	blocks = 3;
	assert_int_equal(proto_drop_reply_decode(d, 15, &blocks, &bytes), -EPROTO);
	assert_int_equal(proto_drop_reply_decode(d, 0, &blocks, &bytes), -EPROTO);
	assert_true(blocks == 3);
}

/* The one namespace-name rule: 1..255 bytes of 0x21..0x7e. */
static void test_name_valid(void **state)
{
	char longest[PROTO_NAME_MAX_BYTES + 1];

	(void)state;
	memset(longest, '~', sizeof(longest));
	assert_true(proto_name_valid("llama3-8b/bf16/tp2:r0", 21));
	assert_true(proto_name_valid("!", 1));
	assert_true(proto_name_valid(longest, PROTO_NAME_MAX_BYTES));
	assert_false(proto_name_valid(longest, PROTO_NAME_MAX_BYTES + 1));
	assert_false(proto_name_valid("", 0));
	assert_false(proto_name_valid(NULL, 3));
	assert_false(proto_name_valid("a b", 3));
	assert_false(proto_name_valid("a\x7f", 2));
	assert_false(proto_name_valid("a\tb", 3));
	assert_false(proto_name_valid("caf\xc3\xa9", 5));
	assert_false(proto_name_valid("a\0b", 3));
	/* only len bytes count: a valid prefix of a longer string */
	assert_true(proto_name_valid("ab cd", 2));
}

static void test_name_body(void **state)
{
	static uint8_t body[4 + 256];
	char name[256];
	const char *out = "x";
	uint16_t len = 9;

	(void)state;
	/* empty name: "this namespace" / "all namespaces" */
	assert_int_equal(proto_name_body_bytes(0), 4);
	assert_int_equal(proto_name_encode(NULL, 0, body, 4), 0);
	assert_int_equal(proto_name_decode(body, 4, &out, &len), 0);
	assert_null(out);
	assert_int_equal(len, 0);

	memset(name, 'n', sizeof(name));
	assert_int_equal(proto_name_encode(name, 255, body, sizeof(body)), 0);
	assert_int_equal(proto_name_decode(body, 4 + 255, &out, &len), 0);
	assert_int_equal(len, 255);
	assert_ptr_equal(out, (const char *)body + 4);

	assert_int_equal(proto_name_encode(name, 256, body, sizeof(body)), -EINVAL);
	assert_int_equal(proto_name_encode(NULL, 3, body, sizeof(body)), -EINVAL);
	assert_int_equal(proto_name_encode("a b", 3, body, sizeof(body)), -EINVAL);
	assert_int_equal(proto_name_encode("abc", 3, body, 6), -ENOSPC);
	assert_int_equal(proto_name_encode("abc", 3, body, 7), 0);

	/* truncated, lengths that lie, reserved, bad bytes, too long */
	for (size_t l = 0; l < 7; l++)
		assert_int_equal(proto_name_decode(body, l, &out, &len), -EPROTO);
	assert_int_equal(proto_name_decode(body, 8, &out, &len), -EPROTO);
	assert_int_equal(proto_name_decode(body, 7, &out, &len), 0);
	proto_put_u16(body + 2, 1);
	assert_int_equal(proto_name_decode(body, 7, &out, &len), -EPROTO);
	proto_put_u16(body + 2, 0);
	body[5] = '\t';
	len = 42;
	assert_int_equal(proto_name_decode(body, 7, &out, &len), -EPROTO);
	assert_int_equal(len, 42);
	memset(body + 4, 'z', 256);
	proto_put_u16(body, 256);
	assert_int_equal(proto_name_decode(body, 4 + 256, &out, &len), -EPROTO);
}

/* ---- error bodies ------------------------------------------------------- */

static void test_error_body(void **state)
{
	const char *msg = "frame of 8388640 bytes exceeds max_frame_bytes 4194304";
	size_t mlen = strlen(msg);
	static uint8_t body[8 + PROTO_ERROR_MESSAGE_MAX_BYTES + 1];
	static char big[PROTO_ERROR_MESSAGE_MAX_BYTES + 1];
	uint16_t vmin = 0, vmax = 0;
	const char *out = NULL;
	uint32_t olen = 0;

	(void)state;
	assert_int_equal(proto_error_body_bytes(mlen), 8 + mlen);
	assert_int_equal(proto_error_encode(msg, mlen, body, sizeof(body)), 0);
	assert_int_equal(proto_error_decode(body, 8 + mlen, &vmin, &vmax, &out, &olen), 0);
	assert_int_equal(vmin, PROTO_VERSION_MIN);
	assert_int_equal(vmax, PROTO_VERSION_MAX);
	assert_int_equal(olen, mlen);
	assert_memory_equal(out, msg, mlen);

	assert_int_equal(proto_error_encode(NULL, 0, body, 8), 0);
	assert_int_equal(proto_error_decode(body, 8, &vmin, &vmax, &out, &olen), 0);
	assert_null(out);
	assert_int_equal(olen, 0);

	memset(big, 'm', sizeof(big));
	assert_int_equal(proto_error_encode(big, PROTO_ERROR_MESSAGE_MAX_BYTES, body, sizeof(body)), 0);
	assert_int_equal(proto_error_encode(big, sizeof(big), body, sizeof(body)), -EINVAL);
	assert_int_equal(proto_error_encode(NULL, 1, body, sizeof(body)), -EINVAL);
	assert_int_equal(proto_error_encode(msg, mlen, body, 8 + mlen - 1), -ENOSPC);

	/* decode: truncated, lengths that lie, too long, bad versions */
	assert_int_equal(proto_error_encode(msg, mlen, body, sizeof(body)), 0);
	for (size_t l = 0; l < 8 + mlen; l++)
		assert_int_equal(proto_error_decode(body, l, &vmin, &vmax, &out, &olen), -EPROTO);
	assert_int_equal(proto_error_decode(body, 9 + mlen, &vmin, &vmax, &out, &olen), -EPROTO);
	proto_put_u32(body + 4, UINT32_MAX);
	assert_int_equal(proto_error_decode(body, 8 + mlen, &vmin, &vmax, &out, &olen), -EPROTO);
	proto_put_u32(body + 4, PROTO_ERROR_MESSAGE_MAX_BYTES + 1);
	assert_int_equal(proto_error_decode(body, sizeof(body), &vmin, &vmax, &out, &olen), -EPROTO);
	proto_put_u32(body + 4, (uint32_t)mlen);
	proto_put_u16(body, 0);
	assert_int_equal(proto_error_decode(body, 8 + mlen, &vmin, &vmax, &out, &olen), -EPROTO);
	proto_put_u16(body, 2);
	proto_put_u16(body + 2, 1);
	vmin = 99;
	assert_int_equal(proto_error_decode(body, 8 + mlen, &vmin, &vmax, &out, &olen), -EPROTO);
	assert_int_equal(vmin, 99);
}

/* ---- tables ------------------------------------------------------------- */

static void test_status_errno_table(void **state)
{
	static const struct { uint16_t status; int err; const char *name; } table[] = {
		{ PROTO_STATUS_OK, 0, "OK" },
		{ PROTO_STATUS_EXISTS, 0, "EXISTS" },
		{ PROTO_STATUS_NOT_FOUND, ENOENT, "NOT_FOUND" },
		{ PROTO_STATUS_NO_PARENT, ENOLINK, "NO_PARENT" },
		{ PROTO_STATUS_FULL, ENOSPC, "FULL" },
		{ PROTO_STATUS_QUOTA, EDQUOT, "QUOTA" },
		{ PROTO_STATUS_BUSY, EAGAIN, "BUSY" },
		{ PROTO_STATUS_TOO_LARGE, EMSGSIZE, "TOO_LARGE" },
		{ PROTO_STATUS_DENIED, EACCES, "DENIED" },
		{ PROTO_STATUS_BAD_REQUEST, EPROTO, "BAD_REQUEST" },
		{ PROTO_STATUS_IO, EIO, "IO" },
		{ PROTO_STATUS_UNSUPPORTED, EOPNOTSUPP, "UNSUPPORTED" },
		{ PROTO_STATUS_BAD_CHECKSUM, EBADMSG, "BAD_CHECKSUM" },
	};

	(void)state;
	assert_int_equal(sizeof(table) / sizeof(table[0]), PROTO_STATUS_MAX + 1);
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		assert_int_equal(table[i].status, i);
		assert_int_equal(proto_status_to_errno(table[i].status), -table[i].err);
		assert_string_equal(proto_status_name(table[i].status), table[i].name);
		if (table[i].status == PROTO_STATUS_EXISTS)
			continue; /* 0 maps back to OK */
		assert_int_equal(proto_status_from_errno(-table[i].err), table[i].status);
		assert_int_equal(proto_status_from_errno(table[i].err), table[i].status);
	}
	assert_int_equal(proto_status_to_errno(PROTO_STATUS_MAX + 1), -EPROTO);
	assert_int_equal(proto_status_to_errno(0xffff), -EPROTO);
	assert_int_equal(proto_status_from_errno(-EEXIST), PROTO_STATUS_EXISTS);
	assert_int_equal(proto_status_from_errno(-EPROTONOSUPPORT), PROTO_STATUS_UNSUPPORTED);
	assert_int_equal(proto_status_from_errno(-EINVAL), PROTO_STATUS_IO);
	assert_int_equal(proto_status_from_errno(-ENOMEM), PROTO_STATUS_IO);
	assert_int_equal(proto_status_from_errno(-12345), PROTO_STATUS_IO);
}

static void test_names(void **state)
{
	static const char *const ops[] = { "NONE", "HELLO", "PUT", "GET", "EXISTS", "MATCH",
					   "DELETE", "DROP_NAMESPACE", "STATS", "PING" };

	(void)state;
	for (uint8_t op = 0; op <= PROTO_OP_MAX; op++)
		assert_string_equal(proto_op_name(op), ops[op]);
	assert_string_equal(proto_op_name(PROTO_OP_MAX + 1), "UNKNOWN");
	assert_string_equal(proto_op_name(255), "UNKNOWN");
	assert_string_equal(proto_status_name(PROTO_STATUS_MAX + 1), "UNKNOWN");
	assert_string_equal(proto_status_name(0xffff), "UNKNOWN");
}

/* ---- the worked example of PROTOCOL.md ---------------------------------- */

static const char example_put_hex[] =
	"4b56504c0102000000000000b80000000700000000000000110000000000000002000000000000005d85"
	"718ec594b982c252d0279e5966ffca33a5eaf2a455038d3ab331fde70cea00000000000000000000000000"
	"000000000000000000000000000000000000000b0000000000000011a7e902c659fcdb0000000000000000"
	"4681c0107c38f402cd1bc30b0b09a65202dba31f98269d9d7f63f5e0dea6901a5d85718ec594b982c252d0"
	"279e5966ffca33a5eaf2a455038d3ab331fde70cea06000000000000003a084b0511425830010000000000"
	"0000666972737420626c6f636b7365636f6e64";

static const char example_reply_hex[] =
	"4b56504c0102010000000000380000000700000000000000000000000000000002000000000000000000"
	"0100000000000b0000000000000011a7e902c659fcdb000001000000000006000000000000003a084b05"
	"11425830";

static void example_keys(uint8_t k0[32], uint8_t k1[32])
{
	hex_decode("5d85718ec594b982c252d0279e5966ffca33a5eaf2a455038d3ab331fde70cea", k0, 32);
	hex_decode("4681c0107c38f402cd1bc30b0b09a65202dba31f98269d9d7f63f5e0dea6901a", k1, 32);
}

static void test_worked_example_put(void **state)
{
	uint8_t want[256], frame[256] = { 0 };
	size_t want_len = hex_decode(example_put_hex, want, sizeof(want));
	struct proto_put_entry e0 = { .length = 11 }, e1 = { .length = 6, .flags = PROTO_PUT_HAS_PARENT };
	struct proto_header h = request_header(PROTO_OP_PUT, 8 + 2 * 88, 17), dh;
	struct proto_batch b;
	uint32_t bad;

	(void)state;
	assert_int_equal(want_len, 233);
	example_keys(e0.key, e1.key);
	memcpy(e1.parent, e0.key, 32);
	e0.checksum = XXH3_64bits("first block", 11);
	e1.checksum = XXH3_64bits("second", 6);
	assert_true(e0.checksum == 0xdbfc59c602e9a711ull);
	assert_true(e1.checksum == 0x30584211054b083aull);
	assert_true(XXH3_64bits("", 0) == 0x2d06800538d394c2ull);

	h.request_id = 7;
	proto_header_encode(&h, frame);
	proto_batch_encode_prefix(frame + 32, 2, 0);
	proto_put_entry_encode(frame + 32, 0, &e0);
	proto_put_entry_encode(frame + 32, 1, &e1);
	memcpy(frame + 32 + 184, "first blocksecond", 17);
	assert_memory_equal(frame, want, want_len);

	/* and it decodes back as the server would */
	assert_int_equal(proto_header_decode(want, 0, &limits, &dh), 0);
	assert_int_equal(dh.body_bytes, 184);
	assert_true(dh.payload_bytes == 17);
	assert_int_equal(proto_batch_decode(want + 32, dh.body_bytes, 88, &limits, &b), 0);
	assert_int_equal(proto_put_batch_check(&b, dh.payload_bytes, &limits, &bad), 0);
}

static void test_worked_example_reply(void **state)
{
	uint8_t want[128], frame[128];
	size_t want_len = hex_decode(example_reply_hex, want, sizeof(want));
	struct proto_header h = reply_header(PROTO_OP_PUT, PROTO_STATUS_OK, 8 + 2 * 24, 0), dh;
	struct proto_result r0 = { PROTO_STATUS_OK, PROTO_TIER_DRAM, 11, 0xdbfc59c602e9a711ull, 0, 0 };
	struct proto_result r1 = { PROTO_STATUS_OK, PROTO_TIER_DRAM, 6, 0x30584211054b083aull, 0, 0 };
	struct proto_batch b;
	struct proto_result out;

	(void)state;
	assert_int_equal(want_len, 88);
	h.request_id = 7;
	proto_header_encode(&h, frame);
	proto_batch_encode_prefix(frame + 32, 2, 0);
	proto_result_encode(frame + 32, 0, &r0);
	proto_result_encode(frame + 32, 1, &r1);
	assert_memory_equal(frame, want, want_len);

	assert_int_equal(proto_header_decode(want, 1, &limits, &dh), 0);
	assert_int_equal(proto_batch_decode(want + 32, dh.body_bytes, 24, &limits, &b), 0);
	assert_int_equal(proto_result_decode(&b, 1, &out), 0);
	assert_true(out.checksum == r1.checksum);
}

/* ---- robustness --------------------------------------------------------- */

/* Random bodies of random lengths, each in an exactly sized heap buffer,
 * through every decoder: under ASan any read past the end fails the run,
 * and every result must be 0 or one of the documented errors. */
static void test_random_bodies(void **state)
{
	uint32_t seed = 12345;
	unsigned int key_batches = 0, names = 0;

	(void)state;
	for (int iter = 0; iter < 20000; iter++) {
		size_t len;
		uint8_t *buf;

		seed = seed * 1103515245u + 12345u;
		len = (seed >> 8) % 300;
		buf = malloc(len ? len : 1);
		assert_non_null(buf);
		for (size_t i = 0; i < len; i++) {
			seed = seed * 1103515245u + 12345u;
			buf[i] = (uint8_t)(seed >> 16);
		}
		/* small counts and lengths now and then, so decodes succeed too */
		if (len >= 8 && (iter & 1)) {
			proto_put_u32(buf, (uint32_t)((len - 8) / 32));
			proto_put_u16(buf + 4, (uint16_t)(len > 9 ? 1 : 0));
		} else if (len >= 4 && len <= 4 + PROTO_NAME_MAX_BYTES && iter % 4 == 2) {
			proto_put_u16(buf, (uint16_t)(len - 4));
			proto_put_u16(buf + 2, 0);
			for (size_t i = 4; i < len; i++)
				buf[i] = (uint8_t)(0x21 + buf[i] % 94);
		}

		struct proto_batch b;
		struct proto_hello h;
		struct proto_hello_reply hr;
		const char *s;
		uint16_t u16a, u16b;
		uint32_t u32a, u32b;
		uint64_t u64a, u64b;
		int rc;

		rc = proto_batch_decode(buf, len, 32, &limits, &b);
		assert_true(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
		if (rc == 0) {
			key_batches++;
			for (uint32_t i = 0; i < b.count; i++)
				assert_non_null(proto_key_entry(&b, i));
		}
		rc = proto_batch_decode(buf, len, 88, NULL, &b);
		assert_true(rc == 0 || rc == -EPROTO);
		if (rc == 0) {
			struct proto_put_entry e;
			uint32_t bad;

			for (uint32_t i = 0; i < b.count; i++)
				(void)proto_put_entry_decode(&b, i, &e);
			rc = proto_put_batch_check(&b, len, &limits, &bad);
			assert_true(rc == 0 || ((rc == -EPROTO || rc == -EMSGSIZE) && bad < b.count));
		}
		rc = proto_batch_decode(buf, len, 24, NULL, &b);
		assert_true(rc == 0 || rc == -EPROTO);
		rc = proto_hello_decode(buf, len, &h);
		assert_true(rc == 0 || rc == -EPROTO);
		if (rc == 0)
			assert_true((const uint8_t *)h.ns + h.ns_len + h.token_len <= buf + len);
		rc = proto_hello_reply_decode(buf, len, &hr);
		assert_true(rc == 0 || rc == -EPROTO);
		rc = proto_name_decode(buf, len, &s, &u16a);
		assert_true(rc == 0 || rc == -EPROTO);
		names += rc == 0;
		rc = proto_error_decode(buf, len, &u16a, &u16b, &s, &u32a);
		assert_true(rc == 0 || rc == -EPROTO);
		rc = proto_match_reply_decode(buf, len, &u32a, &u32b);
		assert_true(rc == 0 || rc == -EPROTO);
		/* v2 layouts */
		{
			struct proto_match_reply mr;
			struct proto_match_req mq;
			struct proto_result r;

			rc = proto_match_reply_decode_v(buf, len, 2, &mr);
			assert_true(rc == 0 || rc == -EPROTO);
			if (rc == 0)
				assert_true(mr.present >= mr.matched && mr.retained <= mr.present);
			rc = proto_match_decode(buf, len, 2, &limits, &mq);
			assert_true(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
			if (rc == 0) {
				assert_true(mq.opts.want <= mq.keys.count);
				assert_true(proto_key_entry(&mq.keys, mq.keys.count - 1) + 32 <= buf + len);
			}
			rc = proto_batch_decode_v(buf, len, 24, 2, NULL, &b);
			assert_true(rc == 0 || rc == -EPROTO);
			for (uint32_t i = 0; rc == 0 && i < b.count; i++)
				if (proto_result_decode(&b, i, &r) == 0)
					assert_true(!(r.flags & ~PROTO_PUT_RESULT_FLAGS));
		}
		rc = proto_drop_reply_decode(buf, len, &u64a, &u64b);
		assert_true(rc == 0 || rc == -EPROTO);
		if (len >= PROTO_HEADER_BYTES) {
			struct proto_header hd;

			rc = proto_header_decode(buf, iter & 2, &limits, &hd);
			assert_true(rc <= 0);
		}
		free(buf);
	}
	/* the generator must reach the success paths too */
	assert_true(key_batches > 100);
	assert_true(names > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header_roundtrip_every_op),
		cmocka_unit_test(test_header_layout),
		cmocka_unit_test(test_header_bad_magic),
		cmocka_unit_test(test_header_wrong_version),
		cmocka_unit_test(test_header_reserved_and_flags),
		cmocka_unit_test(test_header_unknown_opcode),
		cmocka_unit_test(test_header_frame_too_large),
		cmocka_unit_test(test_header_payload_limit),
		cmocka_unit_test(test_header_payload_on_op_without_one),
		cmocka_unit_test(test_header_null_limits),
		cmocka_unit_test(test_request_entry_bytes),
		cmocka_unit_test(test_put_roundtrip),
		cmocka_unit_test(test_get_roundtrip),
		cmocka_unit_test(test_key_batch_roundtrip),
		cmocka_unit_test(test_result_roundtrip),
		cmocka_unit_test(test_batch_truncated),
		cmocka_unit_test(test_batch_count_lies),
		cmocka_unit_test(test_batch_absurd_counts),
		cmocka_unit_test(test_batch_reserved_nonzero),
		cmocka_unit_test(test_result_unknown_values),
		cmocka_unit_test(test_put_entry_flags_and_parent),
		cmocka_unit_test(test_put_check_lengths),
		cmocka_unit_test(test_hello_roundtrip),
		cmocka_unit_test(test_hello_encode_errors),
		cmocka_unit_test(test_hello_decode_errors),
		cmocka_unit_test(test_hello_reply),
		cmocka_unit_test(test_match_and_drop_replies),
		cmocka_unit_test(test_header_v2_accepted),
		cmocka_unit_test(test_put_entry_v2),
		cmocka_unit_test(test_result_v2),
		cmocka_unit_test(test_match_request_v1_v2),
		cmocka_unit_test(test_match_reply_v2),
		cmocka_unit_test(test_hello_reply_v2),
		cmocka_unit_test(test_name_valid),
		cmocka_unit_test(test_name_body),
		cmocka_unit_test(test_error_body),
		cmocka_unit_test(test_status_errno_table),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_worked_example_put),
		cmocka_unit_test(test_worked_example_reply),
		cmocka_unit_test(test_random_bodies),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
