/*
 * fuzz_frame.c - fuzz target: the frame decoder of proto/, one target for
 * every opcode, requests and replies.
 *
 * Input: one selector byte, then a byte stream read as frames the way a
 * receiver reads them: a 32-byte header, body_bytes of body, then
 * payload_bytes of payload (each cut short where the input ends).
 * Selector bit 0: 0 = requests (as kvpoold decodes them), 1 = replies (as
 * libkvpool does). Bits 1-2: the limits the decoders enforce (none, the
 * server's defaults, the smallest legal ones, the widest).
 *
 * Bodies are decoded in the layout of their header's version (1 or 2).
 * Each body is copied into a buffer of exactly its size, so a decoder
 * that reads one byte too far trips AddressSanitizer. Beyond "no crash",
 * the target checks properties that must hold whatever the bytes:
 *  - whatever decodes re-encodes to the same bytes (one meaning, one
 *    encoding), for headers, entries, HELLO, names, error bodies...;
 *  - a decoded header and batch respect the limits they were checked
 *    against;
 *  - a PUT batch that passes proto_put_batch_check has lengths in
 *    1..max_block_bytes that add up exactly to payload_bytes;
 *  - the status table maps every status to an errno and back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "proto.h"

#define MAX_FRAMES 64

static const struct proto_limits limit_table[4] = {
	{ 0, 0, 0 }, /* unused: index 0 means no limits */
	{ .max_frame_bytes = 1u << 20, .max_batch_blocks = 1024, .max_block_bytes = 64ull << 20 },
	{ .max_frame_bytes = PROTO_HEADER_BYTES + PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES,
	  .max_batch_blocks = 1, .max_block_bytes = 1 },
	{ .max_frame_bytes = UINT32_MAX, .max_batch_blocks = UINT32_MAX,
	  .max_block_bytes = UINT64_MAX },
};

/* ---- requests ------------------------------------------------------------ */

static void check_hello(const uint8_t *body, size_t n)
{
	struct proto_hello h;
	uint8_t *again;

	if (proto_hello_decode(body, n, &h))
		return;
	FUZZ_CHECK(proto_hello_body_bytes(&h) == n);
	FUZZ_CHECK(h.ns_len >= 1 && h.ns_len <= PROTO_NAME_MAX_BYTES);
	FUZZ_CHECK(h.token_len <= PROTO_TOKEN_MAX_BYTES);
	FUZZ_CHECK(h.min_version >= 1 && h.min_version <= h.max_version);
	again = malloc(n);
	FUZZ_CHECK(again);
	FUZZ_CHECK(proto_hello_encode(&h, again, n) == 0);
	FUZZ_CHECK(memcmp(again, body, n) == 0);
	free(again);
}

/* Decode a batch body of entries of entry_bytes; on success the count and
 * size agree with the body and the limits. */
static int decode_batch(const uint8_t *body, size_t n, uint32_t entry_bytes, uint8_t version,
			const struct proto_limits *lim, struct proto_batch *b)
{
	int rc = proto_batch_decode_v(body, n, entry_bytes, version, lim, b);

	FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
	if (rc)
		return rc;
	FUZZ_CHECK(b->count >= 1);
	FUZZ_CHECK(proto_batch_body_bytes(b->count, entry_bytes) == n);
	FUZZ_CHECK(!lim || b->count <= lim->max_batch_blocks);
	FUZZ_CHECK(b->entries == body + PROTO_BATCH_PREFIX_BYTES);
	FUZZ_CHECK(b->version == (version ? version : 1));
	return 0;
}

/* Every PUT entry re-encodes to its bytes; a batch that passes the check
 * has lengths that add up to the payload. */
static void check_put(const uint8_t *body, size_t n, uint8_t version, uint64_t payload_bytes,
		      const struct proto_limits *lim)
{
	uint8_t again[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES];
	struct proto_batch b;
	uint32_t bad = UINT32_MAX;
	uint64_t sum = 0;
	int rc, all_valid = 1;

	if (decode_batch(body, n, PROTO_PUT_ENTRY_BYTES, version, lim, &b))
		return;
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_put_entry e;

		if (proto_put_entry_decode(&b, i, &e)) {
			all_valid = 0;
			continue;
		}
		FUZZ_CHECK(!!(e.flags & PROTO_PUT_HAS_PARENT) ==
			   !!memcmp(e.parent, (uint8_t[PROTO_KEY_BYTES]){ 0 }, PROTO_KEY_BYTES));
		FUZZ_CHECK(b.version >= 2 || e.retain_ms == 0);
		proto_put_entry_encode_v(again, 0, b.version, &e);
		FUZZ_CHECK(memcmp(again + PROTO_BATCH_PREFIX_BYTES,
				  b.entries + (size_t)i * PROTO_PUT_ENTRY_BYTES,
				  PROTO_PUT_ENTRY_BYTES) == 0);
	}
	rc = proto_put_batch_check(&b, payload_bytes, lim, &bad);
	FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
	if (rc) {
		FUZZ_CHECK(bad < b.count);
		return;
	}
	FUZZ_CHECK(all_valid);
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_put_entry e;

		FUZZ_CHECK(proto_put_entry_decode(&b, i, &e) == 0);
		FUZZ_CHECK(e.length >= 1);
		FUZZ_CHECK(!lim || e.length <= lim->max_block_bytes);
		FUZZ_CHECK(e.length <= UINT64_MAX - sum);
		sum += e.length;
	}
	FUZZ_CHECK(sum == payload_bytes);
}

static void check_get(const uint8_t *body, size_t n, const struct proto_limits *lim)
{
	uint8_t again[PROTO_BATCH_PREFIX_BYTES + PROTO_GET_ENTRY_BYTES];
	struct proto_batch b;

	if (decode_batch(body, n, PROTO_GET_ENTRY_BYTES, 1, lim, &b))
		return;
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_get_entry e;

		proto_get_entry_decode(&b, i, &e);
		proto_get_entry_encode(again, 0, &e);
		FUZZ_CHECK(memcmp(again + PROTO_BATCH_PREFIX_BYTES,
				  b.entries + (size_t)i * PROTO_GET_ENTRY_BYTES,
				  PROTO_GET_ENTRY_BYTES) == 0);
	}
}

static void check_keys(const uint8_t *body, size_t n, const struct proto_limits *lim)
{
	uint8_t again[PROTO_BATCH_PREFIX_BYTES + PROTO_KEY_ENTRY_BYTES];
	struct proto_batch b;

	if (decode_batch(body, n, PROTO_KEY_ENTRY_BYTES, 1, lim, &b))
		return;
	for (uint32_t i = 0; i < b.count; i++) {
		proto_key_entry_encode(again, 0, proto_key_entry(&b, i));
		FUZZ_CHECK(memcmp(again + PROTO_BATCH_PREFIX_BYTES,
				  b.entries + (size_t)i * PROTO_KEY_ENTRY_BYTES,
				  PROTO_KEY_ENTRY_BYTES) == 0);
	}
}

/* A MATCH request in its version's layout: options (v2) and keys
 * re-encode to the same bytes; want never passes the count. */
static void check_match(const uint8_t *body, size_t n, uint8_t version,
			const struct proto_limits *lim)
{
	struct proto_match_req m;
	uint8_t *again;
	int rc = proto_match_decode(body, n, version, lim, &m);

	FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
	if (rc)
		return;
	FUZZ_CHECK(m.keys.count >= 1 && m.opts.want <= m.keys.count);
	FUZZ_CHECK(!lim || m.keys.count <= lim->max_batch_blocks);
	FUZZ_CHECK(proto_match_body_bytes(version, m.keys.count) == n);
	FUZZ_CHECK(version >= 2 || (!m.opts.wait_ms && !m.opts.want && !m.opts.retain_ms));
	again = malloc(n);
	FUZZ_CHECK(again);
	proto_match_encode_prefix(again, version, m.keys.count, m.lease_ms, &m.opts);
	for (uint32_t i = 0; i < m.keys.count; i++)
		proto_match_key_encode(again, version, i, proto_key_entry(&m.keys, i));
	FUZZ_CHECK(memcmp(again, body, n) == 0);
	free(again);
}

static void check_name(const uint8_t *body, size_t n)
{
	uint8_t again[4 + PROTO_NAME_MAX_BYTES];
	const char *name;
	uint16_t len;

	if (proto_name_decode(body, n, &name, &len))
		return;
	FUZZ_CHECK(len <= PROTO_NAME_MAX_BYTES);
	FUZZ_CHECK(proto_name_body_bytes(len) == n);
	FUZZ_CHECK((len == 0) == (name == NULL));
	FUZZ_CHECK(proto_name_encode(name, len, again, sizeof(again)) == 0);
	FUZZ_CHECK(memcmp(again, body, n) == 0);
}

/* A request body, decoded as kvpoold decodes it for its opcode. */
static void check_request(const struct proto_header *h, const uint8_t *body, size_t n,
			  const struct proto_limits *lim)
{
	switch (h->opcode) {
	case PROTO_OP_HELLO:
		check_hello(body, n);
		break;
	case PROTO_OP_PUT:
		check_put(body, n, h->version, h->payload_bytes, lim);
		break;
	case PROTO_OP_GET:
		check_get(body, n, lim);
		break;
	case PROTO_OP_MATCH:
		check_match(body, n, h->version, lim);
		break;
	case PROTO_OP_EXISTS:
	case PROTO_OP_DELETE:
		FUZZ_CHECK(proto_request_entry_bytes(h->opcode) == PROTO_KEY_ENTRY_BYTES);
		check_keys(body, n, lim);
		break;
	case PROTO_OP_DROP_NAMESPACE:
	case PROTO_OP_STATS:
		check_name(body, n);
		break;
	default:
		break;
	}
}

/* ---- replies --------------------------------------------------------------- */

static void check_error(const uint8_t *body, size_t n)
{
	uint8_t again[PROTO_ERROR_FIXED_BYTES + PROTO_ERROR_MESSAGE_MAX_BYTES];
	uint16_t lo, hi;
	const char *msg;
	uint32_t len;

	if (proto_error_decode(body, n, &lo, &hi, &msg, &len))
		return;
	FUZZ_CHECK(lo >= 1 && lo <= hi);
	FUZZ_CHECK(len <= PROTO_ERROR_MESSAGE_MAX_BYTES);
	FUZZ_CHECK(proto_error_body_bytes(len) == n);
	FUZZ_CHECK((len == 0) == (msg == NULL));
	/* Our encoder always names our own versions. */
	if (lo != PROTO_VERSION_MIN || hi != PROTO_VERSION_MAX)
		return;
	FUZZ_CHECK(proto_error_encode(msg, len, again, sizeof(again)) == 0);
	FUZZ_CHECK(memcmp(again, body, n) == 0);
}

static void check_hello_reply(const uint8_t *body, size_t n)
{
	uint8_t again[PROTO_HELLO_REPLY_MAX_BYTES];
	struct proto_hello_reply r;

	if (proto_hello_reply_decode(body, n, &r))
		return;
	FUZZ_CHECK(n == proto_hello_reply_bytes(r.version));
	FUZZ_CHECK(r.version >= 2 || (!r.max_match_wait_ms && !r.max_retain_ms));
	FUZZ_CHECK(r.max_batch_blocks && r.max_block_bytes && !r.server_flags);
	proto_hello_reply_encode(&r, again);
	FUZZ_CHECK(memcmp(again, body, n) == 0);
}

static void check_results(const uint8_t *body, size_t n, uint8_t version,
			  const struct proto_limits *lim)
{
	uint8_t again[PROTO_BATCH_PREFIX_BYTES + PROTO_RESULT_ENTRY_BYTES];
	struct proto_batch b;

	if (decode_batch(body, n, PROTO_RESULT_ENTRY_BYTES, version, lim, &b))
		return;
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_result r;

		if (proto_result_decode(&b, i, &r))
			continue;
		FUZZ_CHECK(r.status <= PROTO_STATUS_MAX && r.tier <= PROTO_TIER_NVME);
		FUZZ_CHECK(!(r.flags & ~PROTO_PUT_RESULT_FLAGS));
		FUZZ_CHECK(!(r.flags & PROTO_PUT_RETAINED) == !r.retain_ms);
		proto_result_encode_v(again, 0, b.version, &r);
		FUZZ_CHECK(memcmp(again + PROTO_BATCH_PREFIX_BYTES,
				  b.entries + (size_t)i * PROTO_RESULT_ENTRY_BYTES,
				  PROTO_RESULT_ENTRY_BYTES) == 0);
	}
}

static void check_fixed_replies(uint8_t op, uint8_t version, const uint8_t *body, size_t n)
{
	uint8_t again[PROTO_MATCH_REPLY_MAX_BYTES];
	uint32_t matched, lease_ms;
	uint64_t blocks, bytes;
	struct proto_match_reply m;

	if (op == PROTO_OP_MATCH && proto_match_reply_decode(body, n, &matched, &lease_ms) == 0) {
		proto_match_reply_encode(matched, lease_ms, again);
		FUZZ_CHECK(n == PROTO_MATCH_REPLY_BYTES && memcmp(again, body, n) == 0);
	}
	if (op == PROTO_OP_MATCH && proto_match_reply_decode_v(body, n, version, &m) == 0) {
		FUZZ_CHECK(n == proto_match_reply_bytes(version));
		FUZZ_CHECK(m.present >= m.matched && m.retained <= m.present);
		FUZZ_CHECK(m.present == m.matched || (m.flags & PROTO_MATCH_LEASE_CUT));
		proto_match_reply_encode_v(version, &m, again);
		FUZZ_CHECK(memcmp(again, body, n) == 0);
	}
	if (op == PROTO_OP_DROP_NAMESPACE &&
	    proto_drop_reply_decode(body, n, &blocks, &bytes) == 0) {
		proto_drop_reply_encode(blocks, bytes, again);
		FUZZ_CHECK(n == PROTO_DROP_REPLY_BYTES && memcmp(again, body, n) == 0);
	}
}

/* A reply body, decoded as libkvpool decodes it. */
static void check_reply(const struct proto_header *h, const uint8_t *body, size_t n,
			const struct proto_limits *lim)
{
	if (h->status != PROTO_STATUS_OK && h->status != PROTO_STATUS_EXISTS) {
		check_error(body, n);
		return;
	}
	switch (h->opcode) {
	case PROTO_OP_HELLO:
		check_hello_reply(body, n);
		break;
	case PROTO_OP_PUT:
	case PROTO_OP_GET:
	case PROTO_OP_EXISTS:
	case PROTO_OP_DELETE:
		check_results(body, n, h->version, lim);
		break;
	default:
		check_fixed_replies(h->opcode, h->version, body, n);
		break;
	}
}

/* ---- headers and the stream ------------------------------------------------- */

/* Status and opcode tables are total and consistent. */
static void check_tables(const struct proto_header *h)
{
	int err = proto_status_to_errno(h->status);

	FUZZ_CHECK(proto_status_name(h->status) != NULL);
	FUZZ_CHECK(proto_op_name(h->opcode) != NULL);
	FUZZ_CHECK(err <= 0);
	if (h->status <= PROTO_STATUS_MAX && h->status != PROTO_STATUS_EXISTS)
		FUZZ_CHECK(proto_status_from_errno(err) == h->status);
}

/* Decode one header and check what a successful decode promises. */
static int check_header(const uint8_t *in, int is_reply, const struct proto_limits *lim,
			struct proto_header *h)
{
	uint8_t again[PROTO_HEADER_BYTES];
	int rc = proto_header_decode(in, is_reply, lim, h);

	FUZZ_CHECK(rc == 0 || rc == -EPROTO || rc == -EPROTONOSUPPORT || rc == -EOPNOTSUPP ||
		   rc == -EMSGSIZE || rc == -EBADMSG);
	if (rc)
		return rc;
	proto_header_encode(h, again);
	FUZZ_CHECK(memcmp(again, in, PROTO_HEADER_BYTES) == 0);
	FUZZ_CHECK(!!(h->flags & PROTO_FLAG_REPLY) == !!is_reply);
	FUZZ_CHECK(!lim || PROTO_HEADER_BYTES + (uint64_t)h->body_bytes <= lim->max_frame_bytes);
	check_tables(h);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct proto_limits *lim;
	int is_reply;

	if (size < 1)
		return 0;
	is_reply = data[0] & 1;
	lim = (data[0] >> 1) & 3 ? &limit_table[(data[0] >> 1) & 3] : NULL;
	data++;
	size--;
	for (int f = 0; f < MAX_FRAMES && size >= PROTO_HEADER_BYTES; f++) {
		struct proto_header h;
		uint8_t *body;
		size_t n;
		int rc;

		rc = check_header(data, is_reply, lim, &h);
		data += PROTO_HEADER_BYTES;
		size -= PROTO_HEADER_BYTES;
		if (rc == -EPROTO && proto_get_u32(data - PROTO_HEADER_BYTES) != PROTO_MAGIC)
			break; /* the stream cannot be parsed any further */
		n = h.body_bytes < size ? h.body_bytes : size;
		/* Exactly n bytes: a read past the body is an ASan error. */
		body = malloc(n);
		FUZZ_CHECK(body || !n);
		if (n)
			memcpy(body, data, n);
		if (rc == 0 && is_reply)
			check_reply(&h, body, n, lim);
		else if (rc == 0)
			check_request(&h, body, n, lim);
		free(body);
		data += n;
		size -= n;
		n = h.payload_bytes < size ? (size_t)h.payload_bytes : size;
		data += n;
		size -= n;
	}
	return 0;
}
