/*
 * proto.c - kvpool wire protocol encoder/decoder (versions 1 and 2).
 *
 * Every decoder checks each length against the bytes it was given before
 * reading, in 64-bit arithmetic that cannot overflow, and writes its
 * out-parameters only once everything checked out (proto_header_decode is
 * the documented exception). No I/O, no allocation, no state.
 */
#include "proto.h"

#include <errno.h>
#include <string.h>

/* Byte offsets of the header fields (see PROTOCOL.md, "Frame header"). */
#define HDR_MAGIC 0
#define HDR_VERSION 4
#define HDR_OPCODE 5
#define HDR_FLAGS 6
#define HDR_STATUS 8
#define HDR_RESERVED 10
#define HDR_BODY_BYTES 12
#define HDR_REQUEST_ID 16
#define HDR_PAYLOAD_BYTES 24

/* Offsets inside a PUT entry. */
#define PUT_KEY 0
#define PUT_PARENT 32
#define PUT_LENGTH 64
#define PUT_CHECKSUM 72
#define PUT_FLAGS 80
#define PUT_RESERVED 84  /* v1; v2: retain_ms */
#define PUT_RETAIN_MS 84

/* Offsets inside a result entry. */
#define RES_STATUS 0
#define RES_TIER 2
#define RES_RESERVED8 3   /* v1; v2: flags */
#define RES_RESERVED32 4  /* v1; v2: retain_ms */
#define RES_FLAGS 3
#define RES_RETAIN_MS 4
#define RES_LENGTH 8
#define RES_CHECKSUM 16

/* Offsets inside the HELLO reply body. */
#define HR_VERSION 0
#define HR_RDMA_PORT 2
#define HR_MAX_BATCH 4
#define HR_MAX_BLOCK 8
#define HR_MAX_FRAME 16
#define HR_MAX_LEASE 20
#define HR_MAX_INFLIGHT 24
#define HR_SERVER_FLAGS 32
#define HR_MAX_MATCH_WAIT 40 /* v2 */
#define HR_MAX_RETAIN 44     /* v2 */

/* Offsets inside a v2 MATCH request's options (from the body's start). */
#define MO_WAIT_MS 8
#define MO_WANT 12
#define MO_RETAIN_MS 16
#define MO_RESERVED 20

/* Offsets inside a v2 MATCH reply. */
#define MR_MATCHED 0
#define MR_LEASE_MS 4
#define MR_FLAGS 8
#define MR_PRESENT 12
#define MR_RETAINED 16
#define MR_RETAIN_MS 20

/* Smallest useful frame: a header and a PUT batch of one entry. */
#define MIN_USEFUL_FRAME_BYTES \
	(PROTO_HEADER_BYTES + PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES)

#define NAME_FIXED_BYTES 4 /* u16 name_len, u16 reserved */

/* ---- helpers ------------------------------------------------------------ */

bool proto_name_valid(const char *name, size_t len)
{
	if (!name || len == 0 || len > PROTO_NAME_MAX_BYTES)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (ch < 0x21 || ch > 0x7e)
			return false;
	}
	return true;
}

static int all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* A version range as carried in HELLO and error bodies: 1 <= min <= max. */
static int version_range_valid(uint16_t min_version, uint16_t max_version)
{
	return min_version >= 1 && min_version <= max_version;
}

/* The largest payload a frame may announce: one batch of maximal blocks,
 * saturating instead of overflowing. */
static uint64_t max_payload_bytes(const struct proto_limits *limits)
{
	if (limits->max_block_bytes &&
	    limits->max_batch_blocks > UINT64_MAX / limits->max_block_bytes)
		return UINT64_MAX;
	return (uint64_t)limits->max_batch_blocks * limits->max_block_bytes;
}

/* Does this frame carry block bytes after its body? */
static int frame_has_payload(uint8_t op, int is_reply, uint16_t status)
{
	if (is_reply)
		return op == PROTO_OP_GET &&
		       (status == PROTO_STATUS_OK || status == PROTO_STATUS_EXISTS);
	return op == PROTO_OP_PUT;
}

/* A layout version a decoder accepts: 0 (read as 1), 1 or 2. */
static int layout_version_valid(uint8_t version)
{
	return version <= PROTO_VERSION_MAX;
}

static int is_v2(uint8_t version)
{
	return version >= PROTO_VERSION_2;
}

static int status_is_success(uint16_t status)
{
	return status == PROTO_STATUS_OK || status == PROTO_STATUS_EXISTS;
}

/* ---- header ------------------------------------------------------------- */

void proto_header_encode(const struct proto_header *h, uint8_t out[PROTO_HEADER_BYTES])
{
	proto_put_u32(out + HDR_MAGIC, h->magic);
	out[HDR_VERSION] = h->version;
	out[HDR_OPCODE] = h->opcode;
	proto_put_u16(out + HDR_FLAGS, h->flags);
	proto_put_u16(out + HDR_STATUS, h->status);
	proto_put_u16(out + HDR_RESERVED, 0);
	proto_put_u32(out + HDR_BODY_BYTES, h->body_bytes);
	proto_put_u64(out + HDR_REQUEST_ID, h->request_id);
	proto_put_u64(out + HDR_PAYLOAD_BYTES, h->payload_bytes);
}

/* Rules that hold whatever the limits: reserved bits, direction, status. */
static int header_check_fields(const uint8_t in[PROTO_HEADER_BYTES], int is_reply,
			       const struct proto_header *h)
{
	if (proto_get_u16(in + HDR_RESERVED) != 0)
		return -EPROTO;
	if (h->flags & ~PROTO_FLAG_REPLY)
		return -EPROTO;
	if (!!(h->flags & PROTO_FLAG_REPLY) != !!is_reply)
		return -EPROTO;
	if (!is_reply && h->status != 0)
		return -EPROTO;
	if (is_reply && h->status > PROTO_STATUS_MAX)
		return -EPROTO;
	/* An error reply echoes the request's opcode, known to us or not. */
	if (h->opcode > PROTO_OP_MAX && !(is_reply && !status_is_success(h->status)))
		return -EOPNOTSUPP;
	if (h->opcode == PROTO_OP_NONE && (!is_reply || status_is_success(h->status)))
		return -EOPNOTSUPP;
	return 0;
}

/* Configured limits: frame size and announced payload. */
static int header_check_limits(const struct proto_header *h, const struct proto_limits *limits)
{
	if (!limits)
		return 0;
	if ((uint64_t)PROTO_HEADER_BYTES + h->body_bytes > limits->max_frame_bytes)
		return -EMSGSIZE;
	if (h->payload_bytes > max_payload_bytes(limits))
		return -EMSGSIZE;
	return 0;
}

int proto_header_decode(const uint8_t in[PROTO_HEADER_BYTES], int is_reply,
			const struct proto_limits *limits, struct proto_header *out)
{
	int err;

	if (proto_get_u32(in + HDR_MAGIC) != PROTO_MAGIC)
		return -EPROTO;

	out->magic = PROTO_MAGIC;
	out->version = in[HDR_VERSION];
	out->opcode = in[HDR_OPCODE];
	out->flags = proto_get_u16(in + HDR_FLAGS);
	out->status = proto_get_u16(in + HDR_STATUS);
	out->body_bytes = proto_get_u32(in + HDR_BODY_BYTES);
	out->request_id = proto_get_u64(in + HDR_REQUEST_ID);
	out->payload_bytes = proto_get_u64(in + HDR_PAYLOAD_BYTES);

	if (out->version < PROTO_VERSION_MIN || out->version > PROTO_VERSION_MAX)
		return -EPROTONOSUPPORT;
	err = header_check_fields(in, is_reply, out);
	if (err)
		return err;
	err = header_check_limits(out, limits);
	if (err)
		return err;
	if (out->payload_bytes && !frame_has_payload(out->opcode, is_reply, out->status))
		return -EBADMSG;
	return 0;
}

/* ---- batches ------------------------------------------------------------ */

uint32_t proto_request_entry_bytes(uint8_t op)
{
	switch (op) {
	case PROTO_OP_PUT:
		return PROTO_PUT_ENTRY_BYTES;
	case PROTO_OP_GET:
		return PROTO_GET_ENTRY_BYTES;
	case PROTO_OP_EXISTS:
	case PROTO_OP_MATCH:
	case PROTO_OP_DELETE:
		return PROTO_KEY_ENTRY_BYTES;
	default:
		return 0;
	}
}

size_t proto_batch_body_bytes(uint32_t count, uint32_t entry_bytes)
{
	return PROTO_BATCH_PREFIX_BYTES + (size_t)count * entry_bytes;
}

/* Reserved bytes of one entry, for the entry kinds that have them in
 * this version (v2 turns them into fields, checked by the entry decoders). */
static int entry_reserved_clear(const uint8_t *e, uint32_t entry_bytes, uint8_t version)
{
	if (is_v2(version))
		return 1;
	if (entry_bytes == PROTO_PUT_ENTRY_BYTES)
		return proto_get_u32(e + PUT_RESERVED) == 0;
	if (entry_bytes == PROTO_RESULT_ENTRY_BYTES)
		return e[RES_RESERVED8] == 0 && proto_get_u32(e + RES_RESERVED32) == 0;
	return 1;
}

/* The batch prefix and its count, the first checks of every batch body. */
static int batch_count(const uint8_t *body, size_t body_bytes, const struct proto_limits *limits,
		       uint32_t *count)
{
	if (body_bytes < PROTO_BATCH_PREFIX_BYTES)
		return -EPROTO;
	*count = proto_get_u32(body);
	if (*count == 0)
		return -EPROTO;
	if (limits && *count > limits->max_batch_blocks)
		return -EMSGSIZE;
	return 0;
}

int proto_batch_decode_v(const uint8_t *body, size_t body_bytes, uint32_t entry_bytes,
			 uint8_t version, const struct proto_limits *limits,
			 struct proto_batch *out)
{
	uint32_t count;
	int rc;

	if (entry_bytes == 0)
		return -EINVAL;
	rc = batch_count(body, body_bytes, limits, &count);
	if (rc)
		return rc;
	/* count * entry_bytes fits easily in 64 bits: both are 32-bit. */
	if ((uint64_t)body_bytes != PROTO_BATCH_PREFIX_BYTES + (uint64_t)count * entry_bytes)
		return -EPROTO;
	if (!layout_version_valid(version))
		return -EPROTO;
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *e = body + PROTO_BATCH_PREFIX_BYTES + (size_t)i * entry_bytes;

		if (!entry_reserved_clear(e, entry_bytes, version))
			return -EPROTO;
	}
	out->count = count;
	out->aux = proto_get_u32(body + 4);
	out->entries = body + PROTO_BATCH_PREFIX_BYTES;
	out->entry_bytes = entry_bytes;
	out->version = version ? version : PROTO_VERSION_1;
	return 0;
}

int proto_batch_decode(const uint8_t *body, size_t body_bytes, uint32_t entry_bytes,
		       const struct proto_limits *limits, struct proto_batch *out)
{
	return proto_batch_decode_v(body, body_bytes, entry_bytes, PROTO_VERSION_1, limits, out);
}

void proto_batch_encode_prefix(uint8_t *body, uint32_t count, uint32_t aux)
{
	proto_put_u32(body, count);
	proto_put_u32(body + 4, aux);
}

static const uint8_t *entry_at(const struct proto_batch *b, uint32_t i)
{
	return b->entries + (size_t)i * b->entry_bytes;
}

static uint8_t *entry_out(uint8_t *body, uint32_t i, uint32_t entry_bytes)
{
	return body + PROTO_BATCH_PREFIX_BYTES + (size_t)i * entry_bytes;
}

/* ---- PUT entries -------------------------------------------------------- */

/* One meaning, one encoding: a parent is present exactly when the flag
 * says so, and a present parent is never the all-zero "no parent" key.
 * In v1 the word at offset 84 is reserved; in v2 it is retain_ms, any
 * value (the server caps it). */
static int put_entry_valid(const uint8_t *e, uint8_t version)
{
	uint32_t flags = proto_get_u32(e + PUT_FLAGS);
	int parent_zero = all_zero(e + PUT_PARENT, PROTO_KEY_BYTES);

	if (flags & ~PROTO_PUT_HAS_PARENT)
		return 0;
	if (!is_v2(version) && proto_get_u32(e + PUT_RESERVED) != 0)
		return 0;
	if ((flags & PROTO_PUT_HAS_PARENT) ? parent_zero : !parent_zero)
		return 0;
	return 1;
}

int proto_put_entry_decode(const struct proto_batch *b, uint32_t i, struct proto_put_entry *out)
{
	const uint8_t *e = entry_at(b, i);

	if (!put_entry_valid(e, b->version))
		return -EPROTO;
	memcpy(out->key, e + PUT_KEY, PROTO_KEY_BYTES);
	memcpy(out->parent, e + PUT_PARENT, PROTO_KEY_BYTES);
	out->length = proto_get_u64(e + PUT_LENGTH);
	out->checksum = proto_get_u64(e + PUT_CHECKSUM);
	out->flags = proto_get_u32(e + PUT_FLAGS);
	out->retain_ms = is_v2(b->version) ? proto_get_u32(e + PUT_RETAIN_MS) : 0;
	return 0;
}

void proto_put_entry_encode_v(uint8_t *body, uint32_t i, uint8_t version,
			      const struct proto_put_entry *e)
{
	uint8_t *p = entry_out(body, i, PROTO_PUT_ENTRY_BYTES);

	memcpy(p + PUT_KEY, e->key, PROTO_KEY_BYTES);
	memcpy(p + PUT_PARENT, e->parent, PROTO_KEY_BYTES);
	proto_put_u64(p + PUT_LENGTH, e->length);
	proto_put_u64(p + PUT_CHECKSUM, e->checksum);
	proto_put_u32(p + PUT_FLAGS, e->flags);
	proto_put_u32(p + PUT_RETAIN_MS, is_v2(version) ? e->retain_ms : 0);
}

void proto_put_entry_encode(uint8_t *body, uint32_t i, const struct proto_put_entry *e)
{
	proto_put_entry_encode_v(body, i, PROTO_VERSION_1, e);
}

/* Walk the entries in order; the first bad one decides the error. The
 * running sum is compared before adding, so it can never overflow: a sum
 * that would pass payload_bytes (a u64) is caught at the entry doing it. */
int proto_put_batch_check(const struct proto_batch *b, uint64_t payload_bytes,
			  const struct proto_limits *limits, uint32_t *bad_index)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < b->count; i++) {
		const uint8_t *e = entry_at(b, i);
		uint64_t length = proto_get_u64(e + PUT_LENGTH);
		int err = 0;

		if (!put_entry_valid(e, b->version) || length == 0)
			err = -EPROTO;
		else if (limits && length > limits->max_block_bytes)
			err = -EMSGSIZE;
		else if (length > payload_bytes - sum)
			err = -EPROTO;
		if (err) {
			*bad_index = i;
			return err;
		}
		sum += length;
	}
	if (sum != payload_bytes) {
		*bad_index = b->count ? b->count - 1 : 0;
		return -EPROTO;
	}
	return 0;
}

/* ---- GET and key entries ------------------------------------------------ */

void proto_get_entry_decode(const struct proto_batch *b, uint32_t i, struct proto_get_entry *out)
{
	const uint8_t *e = entry_at(b, i);

	memcpy(out->key, e, PROTO_KEY_BYTES);
	out->max_length = proto_get_u64(e + PROTO_KEY_BYTES);
}

void proto_get_entry_encode(uint8_t *body, uint32_t i, const struct proto_get_entry *e)
{
	uint8_t *p = entry_out(body, i, PROTO_GET_ENTRY_BYTES);

	memcpy(p, e->key, PROTO_KEY_BYTES);
	proto_put_u64(p + PROTO_KEY_BYTES, e->max_length);
}

const uint8_t *proto_key_entry(const struct proto_batch *b, uint32_t i)
{
	return entry_at(b, i);
}

void proto_key_entry_encode(uint8_t *body, uint32_t i, const uint8_t key[PROTO_KEY_BYTES])
{
	memcpy(entry_out(body, i, PROTO_KEY_ENTRY_BYTES), key, PROTO_KEY_BYTES);
}

/* ---- result entries ----------------------------------------------------- */

/* A v2 result's flags and retain_ms say the same thing: a retention
 * was granted exactly when RETAINED is set and retain_ms is nonzero. */
static int result_v2_valid(uint8_t flags, uint32_t retain_ms)
{
	if (flags & ~PROTO_PUT_RESULT_FLAGS)
		return 0;
	return !(flags & PROTO_PUT_RETAINED) == !retain_ms;
}

int proto_result_decode(const struct proto_batch *b, uint32_t i, struct proto_result *out)
{
	const uint8_t *e = entry_at(b, i);
	uint16_t status = proto_get_u16(e + RES_STATUS);
	uint8_t flags = 0;
	uint32_t retain_ms = 0;

	if (!entry_reserved_clear(e, PROTO_RESULT_ENTRY_BYTES, b->version))
		return -EPROTO;
	if (status > PROTO_STATUS_MAX || e[RES_TIER] > PROTO_TIER_NVME)
		return -EPROTO;
	if (is_v2(b->version)) {
		flags = e[RES_FLAGS];
		retain_ms = proto_get_u32(e + RES_RETAIN_MS);
		if (!result_v2_valid(flags, retain_ms))
			return -EPROTO;
	}
	out->status = status;
	out->tier = e[RES_TIER];
	out->flags = flags;
	out->retain_ms = retain_ms;
	out->length = proto_get_u64(e + RES_LENGTH);
	out->checksum = proto_get_u64(e + RES_CHECKSUM);
	return 0;
}

void proto_result_encode_v(uint8_t *body, uint32_t i, uint8_t version,
			   const struct proto_result *r)
{
	uint8_t *p = entry_out(body, i, PROTO_RESULT_ENTRY_BYTES);
	int v2 = is_v2(version);

	proto_put_u16(p + RES_STATUS, r->status);
	p[RES_TIER] = r->tier;
	p[RES_FLAGS] = v2 ? r->flags : 0;
	proto_put_u32(p + RES_RETAIN_MS, v2 ? r->retain_ms : 0);
	proto_put_u64(p + RES_LENGTH, r->length);
	proto_put_u64(p + RES_CHECKSUM, r->checksum);
}

void proto_result_encode(uint8_t *body, uint32_t i, const struct proto_result *r)
{
	proto_result_encode_v(body, i, PROTO_VERSION_1, r);
}

/* ---- MATCH requests ------------------------------------------------------- */

static size_t match_prefix_bytes(uint8_t version)
{
	return is_v2(version) ? PROTO_MATCH_V2_PREFIX_BYTES : PROTO_BATCH_PREFIX_BYTES;
}

size_t proto_match_body_bytes(uint8_t version, uint32_t count)
{
	return match_prefix_bytes(version) + (size_t)count * PROTO_KEY_ENTRY_BYTES;
}

void proto_match_encode_prefix(uint8_t *body, uint8_t version, uint32_t count, uint32_t lease_ms,
			       const struct proto_match_opts *opts)
{
	static const struct proto_match_opts none;

	if (!opts)
		opts = &none;
	proto_batch_encode_prefix(body, count, lease_ms);
	if (!is_v2(version))
		return;
	proto_put_u32(body + MO_WAIT_MS, opts->wait_ms);
	proto_put_u32(body + MO_WANT, opts->want);
	proto_put_u32(body + MO_RETAIN_MS, opts->retain_ms);
	proto_put_u32(body + MO_RESERVED, 0);
}

void proto_match_key_encode(uint8_t *body, uint8_t version, uint32_t i,
			    const uint8_t key[PROTO_KEY_BYTES])
{
	memcpy(body + match_prefix_bytes(version) + (size_t)i * PROTO_KEY_ENTRY_BYTES, key,
	       PROTO_KEY_BYTES);
}

int proto_match_decode(const uint8_t *body, size_t body_bytes, uint8_t version,
		       const struct proto_limits *limits, struct proto_match_req *out)
{
	struct proto_match_req m;
	uint32_t count;
	int rc = batch_count(body, body_bytes, limits, &count);

	memset(&m, 0, sizeof(m));
	if (rc)
		return rc;
	if (!layout_version_valid(version) ||
	    (uint64_t)body_bytes != match_prefix_bytes(version) + (uint64_t)count * PROTO_KEY_ENTRY_BYTES)
		return -EPROTO;
	if (is_v2(version)) {
		m.opts.wait_ms = proto_get_u32(body + MO_WAIT_MS);
		m.opts.want = proto_get_u32(body + MO_WANT);
		m.opts.retain_ms = proto_get_u32(body + MO_RETAIN_MS);
		if (proto_get_u32(body + MO_RESERVED) != 0 || m.opts.want > count)
			return -EPROTO;
	}
	m.keys.count = count;
	m.keys.aux = proto_get_u32(body + 4);
	m.keys.entries = body + match_prefix_bytes(version);
	m.keys.entry_bytes = PROTO_KEY_ENTRY_BYTES;
	m.keys.version = version ? version : PROTO_VERSION_1;
	m.lease_ms = m.keys.aux;
	*out = m;
	return 0;
}

/* ---- HELLO -------------------------------------------------------------- */

size_t proto_hello_body_bytes(const struct proto_hello *h)
{
	return PROTO_HELLO_FIXED_BYTES + (size_t)h->ns_len + h->token_len;
}

/* The rules HELLO fields obey, shared by encoder (-EINVAL) and decoder
 * (-EPROTO). */
static int hello_fields_valid(const struct proto_hello *h)
{
	if (!version_range_valid(h->min_version, h->max_version))
		return 0;
	if (!proto_name_valid(h->ns, h->ns_len))
		return 0;
	if (h->token_len > PROTO_TOKEN_MAX_BYTES || (h->token_len && !h->token))
		return 0;
	return 1;
}

int proto_hello_encode(const struct proto_hello *h, uint8_t *body, size_t cap)
{
	if (!hello_fields_valid(h))
		return -EINVAL;
	if (cap < proto_hello_body_bytes(h))
		return -ENOSPC;
	proto_put_u16(body, h->min_version);
	proto_put_u16(body + 2, h->max_version);
	proto_put_u16(body + 4, h->ns_len);
	proto_put_u16(body + 6, h->token_len);
	memcpy(body + PROTO_HELLO_FIXED_BYTES, h->ns, h->ns_len);
	if (h->token_len)
		memcpy(body + PROTO_HELLO_FIXED_BYTES + h->ns_len, h->token, h->token_len);
	return 0;
}

int proto_hello_decode(const uint8_t *body, size_t body_bytes, struct proto_hello *out)
{
	struct proto_hello h;

	if (body_bytes < PROTO_HELLO_FIXED_BYTES)
		return -EPROTO;
	h.min_version = proto_get_u16(body);
	h.max_version = proto_get_u16(body + 2);
	h.ns_len = proto_get_u16(body + 4);
	h.token_len = proto_get_u16(body + 6);
	if (body_bytes != proto_hello_body_bytes(&h))
		return -EPROTO;
	h.ns = (const char *)body + PROTO_HELLO_FIXED_BYTES;
	h.token = h.token_len ? h.ns + h.ns_len : NULL;
	if (!hello_fields_valid(&h))
		return -EPROTO;
	*out = h;
	return 0;
}

size_t proto_hello_reply_bytes(uint16_t version)
{
	return version >= PROTO_VERSION_2 ? PROTO_HELLO_REPLY_V2_BYTES : PROTO_HELLO_REPLY_BYTES;
}

void proto_hello_reply_encode(const struct proto_hello_reply *r, uint8_t *body)
{
	proto_put_u16(body + HR_VERSION, r->version);
	proto_put_u16(body + HR_RDMA_PORT, r->rdma_port);
	proto_put_u32(body + HR_MAX_BATCH, r->max_batch_blocks);
	proto_put_u64(body + HR_MAX_BLOCK, r->max_block_bytes);
	proto_put_u32(body + HR_MAX_FRAME, r->max_frame_bytes);
	proto_put_u32(body + HR_MAX_LEASE, r->max_lease_ms);
	proto_put_u64(body + HR_MAX_INFLIGHT, r->max_inflight_put_bytes);
	proto_put_u64(body + HR_SERVER_FLAGS, r->server_flags);
	if (r->version < PROTO_VERSION_2)
		return;
	proto_put_u32(body + HR_MAX_MATCH_WAIT, r->max_match_wait_ms);
	proto_put_u32(body + HR_MAX_RETAIN, r->max_retain_ms);
}

int proto_hello_reply_decode(const uint8_t *body, size_t body_bytes, struct proto_hello_reply *out)
{
	struct proto_hello_reply r = { 0 };

	if (body_bytes < PROTO_HELLO_REPLY_BYTES)
		return -EPROTO;
	r.version = proto_get_u16(body + HR_VERSION);
	if (r.version < PROTO_VERSION_MIN || r.version > PROTO_VERSION_MAX ||
	    body_bytes != proto_hello_reply_bytes(r.version))
		return -EPROTO;
	r.rdma_port = proto_get_u16(body + HR_RDMA_PORT);
	r.max_batch_blocks = proto_get_u32(body + HR_MAX_BATCH);
	r.max_block_bytes = proto_get_u64(body + HR_MAX_BLOCK);
	r.max_frame_bytes = proto_get_u32(body + HR_MAX_FRAME);
	r.max_lease_ms = proto_get_u32(body + HR_MAX_LEASE);
	r.max_inflight_put_bytes = proto_get_u64(body + HR_MAX_INFLIGHT);
	r.server_flags = proto_get_u64(body + HR_SERVER_FLAGS);
	if (r.version >= PROTO_VERSION_2) {
		r.max_match_wait_ms = proto_get_u32(body + HR_MAX_MATCH_WAIT);
		r.max_retain_ms = proto_get_u32(body + HR_MAX_RETAIN);
	}
	if (r.server_flags != 0 || r.max_batch_blocks == 0 || r.max_block_bytes == 0)
		return -EPROTO;
	if (r.max_frame_bytes < MIN_USEFUL_FRAME_BYTES)
		return -EPROTO;
	*out = r;
	return 0;
}

/* ---- MATCH, DROP_NAMESPACE, STATS ---------------------------------------- */

void proto_match_reply_encode(uint32_t matched, uint32_t lease_ms, uint8_t body[PROTO_MATCH_REPLY_BYTES])
{
	proto_put_u32(body, matched);
	proto_put_u32(body + 4, lease_ms);
}

int proto_match_reply_decode(const uint8_t *body, size_t body_bytes, uint32_t *matched, uint32_t *lease_ms)
{
	if (body_bytes != PROTO_MATCH_REPLY_BYTES)
		return -EPROTO;
	*matched = proto_get_u32(body);
	*lease_ms = proto_get_u32(body + 4);
	return 0;
}

size_t proto_match_reply_bytes(uint8_t version)
{
	return is_v2(version) ? PROTO_MATCH_REPLY_V2_BYTES : PROTO_MATCH_REPLY_BYTES;
}

void proto_match_reply_encode_v(uint8_t version, const struct proto_match_reply *r, uint8_t *body)
{
	proto_put_u32(body + MR_MATCHED, r->matched);
	proto_put_u32(body + MR_LEASE_MS, r->lease_ms);
	if (!is_v2(version))
		return;
	proto_put_u32(body + MR_FLAGS, r->flags);
	proto_put_u32(body + MR_PRESENT, r->present);
	proto_put_u32(body + MR_RETAINED, r->retained);
	proto_put_u32(body + MR_RETAIN_MS, r->retain_ms);
}

int proto_match_reply_decode_v(const uint8_t *body, size_t body_bytes, uint8_t version,
			       struct proto_match_reply *out)
{
	struct proto_match_reply r = { 0 };

	if (!layout_version_valid(version) || body_bytes != proto_match_reply_bytes(version))
		return -EPROTO;
	r.matched = proto_get_u32(body + MR_MATCHED);
	r.lease_ms = proto_get_u32(body + MR_LEASE_MS);
	r.present = r.matched;
	if (is_v2(version)) {
		r.flags = proto_get_u32(body + MR_FLAGS);
		r.present = proto_get_u32(body + MR_PRESENT);
		r.retained = proto_get_u32(body + MR_RETAINED);
		r.retain_ms = proto_get_u32(body + MR_RETAIN_MS);
		if (r.flags & ~PROTO_MATCH_FLAGS)
			return -EPROTO;
		if (r.present < r.matched ||
		    (r.present > r.matched && !(r.flags & PROTO_MATCH_LEASE_CUT)))
			return -EPROTO;
		if (r.retained > r.present || !r.retained != !r.retain_ms)
			return -EPROTO;
	}
	*out = r;
	return 0;
}

size_t proto_name_body_bytes(uint16_t name_len)
{
	return NAME_FIXED_BYTES + (size_t)name_len;
}

int proto_name_encode(const char *name, uint16_t name_len, uint8_t *body, size_t cap)
{
	if (name_len && !proto_name_valid(name, name_len))
		return -EINVAL;
	if (cap < proto_name_body_bytes(name_len))
		return -ENOSPC;
	proto_put_u16(body, name_len);
	proto_put_u16(body + 2, 0);
	if (name_len)
		memcpy(body + NAME_FIXED_BYTES, name, name_len);
	return 0;
}

int proto_name_decode(const uint8_t *body, size_t body_bytes, const char **name, uint16_t *name_len)
{
	uint16_t len;
	const char *p;

	if (body_bytes < NAME_FIXED_BYTES)
		return -EPROTO;
	len = proto_get_u16(body);
	if (proto_get_u16(body + 2) != 0 || len > PROTO_NAME_MAX_BYTES)
		return -EPROTO;
	if (body_bytes != proto_name_body_bytes(len))
		return -EPROTO;
	p = (const char *)body + NAME_FIXED_BYTES;
	if (len && !proto_name_valid(p, len))
		return -EPROTO;
	*name = len ? p : NULL;
	*name_len = len;
	return 0;
}

void proto_drop_reply_encode(uint64_t blocks, uint64_t bytes, uint8_t body[PROTO_DROP_REPLY_BYTES])
{
	proto_put_u64(body, blocks);
	proto_put_u64(body + 8, bytes);
}

int proto_drop_reply_decode(const uint8_t *body, size_t body_bytes, uint64_t *blocks, uint64_t *bytes)
{
	if (body_bytes != PROTO_DROP_REPLY_BYTES)
		return -EPROTO;
	*blocks = proto_get_u64(body);
	*bytes = proto_get_u64(body + 8);
	return 0;
}

/* ---- error bodies ------------------------------------------------------- */

size_t proto_error_body_bytes(size_t message_bytes)
{
	return PROTO_ERROR_FIXED_BYTES + message_bytes;
}

int proto_error_encode(const char *message, size_t message_bytes, uint8_t *body, size_t cap)
{
	if (message_bytes > PROTO_ERROR_MESSAGE_MAX_BYTES || (message_bytes && !message))
		return -EINVAL;
	if (cap < proto_error_body_bytes(message_bytes))
		return -ENOSPC;
	proto_put_u16(body, PROTO_VERSION_MIN);
	proto_put_u16(body + 2, PROTO_VERSION_MAX);
	proto_put_u32(body + 4, (uint32_t)message_bytes);
	if (message_bytes)
		memcpy(body + PROTO_ERROR_FIXED_BYTES, message, message_bytes);
	return 0;
}

int proto_error_decode(const uint8_t *body, size_t body_bytes, uint16_t *min_version,
		       uint16_t *max_version, const char **message, uint32_t *message_bytes)
{
	uint16_t vmin, vmax;
	uint32_t len;

	if (body_bytes < PROTO_ERROR_FIXED_BYTES)
		return -EPROTO;
	vmin = proto_get_u16(body);
	vmax = proto_get_u16(body + 2);
	len = proto_get_u32(body + 4);
	if (!version_range_valid(vmin, vmax) || len > PROTO_ERROR_MESSAGE_MAX_BYTES)
		return -EPROTO;
	if ((uint64_t)body_bytes != PROTO_ERROR_FIXED_BYTES + (uint64_t)len)
		return -EPROTO;
	*min_version = vmin;
	*max_version = vmax;
	*message = len ? (const char *)body + PROTO_ERROR_FIXED_BYTES : NULL;
	*message_bytes = len;
	return 0;
}

/* ---- status and op tables ----------------------------------------------- */

/* The one status table: name and errno (positive; 0 = success). */
static const struct {
	const char *name;
	int err;
} status_table[PROTO_STATUS_MAX + 1] = {
	[PROTO_STATUS_OK] = { "OK", 0 },
	[PROTO_STATUS_EXISTS] = { "EXISTS", 0 },
	[PROTO_STATUS_NOT_FOUND] = { "NOT_FOUND", ENOENT },
	[PROTO_STATUS_NO_PARENT] = { "NO_PARENT", ENOLINK },
	[PROTO_STATUS_FULL] = { "FULL", ENOSPC },
	[PROTO_STATUS_QUOTA] = { "QUOTA", EDQUOT },
	[PROTO_STATUS_BUSY] = { "BUSY", EAGAIN },
	[PROTO_STATUS_TOO_LARGE] = { "TOO_LARGE", EMSGSIZE },
	[PROTO_STATUS_DENIED] = { "DENIED", EACCES },
	[PROTO_STATUS_BAD_REQUEST] = { "BAD_REQUEST", EPROTO },
	[PROTO_STATUS_IO] = { "IO", EIO },
	[PROTO_STATUS_UNSUPPORTED] = { "UNSUPPORTED", EOPNOTSUPP },
	[PROTO_STATUS_BAD_CHECKSUM] = { "BAD_CHECKSUM", EBADMSG },
};

int proto_status_to_errno(uint16_t status)
{
	if (status > PROTO_STATUS_MAX)
		return -EPROTO;
	return -status_table[status].err;
}

uint16_t proto_status_from_errno(int err)
{
	if (err < 0)
		err = -err;
	if (err == 0)
		return PROTO_STATUS_OK;
	if (err == EEXIST)
		return PROTO_STATUS_EXISTS;
	if (err == EPROTONOSUPPORT)
		return PROTO_STATUS_UNSUPPORTED;
	for (uint16_t s = PROTO_STATUS_NOT_FOUND; s <= PROTO_STATUS_MAX; s++)
		if (status_table[s].err == err)
			return s;
	return PROTO_STATUS_IO;
}

const char *proto_status_name(uint16_t status)
{
	if (status > PROTO_STATUS_MAX)
		return "UNKNOWN";
	return status_table[status].name;
}

const char *proto_op_name(uint8_t op)
{
	static const char *const names[PROTO_OP_MAX + 1] = {
		[PROTO_OP_NONE] = "NONE",
		[PROTO_OP_HELLO] = "HELLO",
		[PROTO_OP_PUT] = "PUT",
		[PROTO_OP_GET] = "GET",
		[PROTO_OP_EXISTS] = "EXISTS",
		[PROTO_OP_MATCH] = "MATCH",
		[PROTO_OP_DELETE] = "DELETE",
		[PROTO_OP_DROP_NAMESPACE] = "DROP_NAMESPACE",
		[PROTO_OP_STATS] = "STATS",
		[PROTO_OP_PING] = "PING",
	};

	if (op > PROTO_OP_MAX)
		return "UNKNOWN";
	return names[op];
}
