/*
 * frame_seeds.c - write the seed corpus of fuzz_frame: one valid frame
 * (or stream of frames) per opcode, as requests and as replies, encoded
 * with proto/ itself so that the seeds follow the protocol.
 *
 * Usage: frame_seeds DIR (make fuzz-seeds writes tests/fuzz/corpus/frame).
 * Each file is the selector byte fuzz_frame.c reads first, then frames.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* Selector bits of fuzz_frame.c: bit 0 replies, bits 1-2 limits. */
#define SEL_REQUESTS_DEFAULT 0x02
#define SEL_REPLIES_DEFAULT 0x03
#define SEL_REQUESTS_NONE 0x00
#define SEL_REQUESTS_TINY 0x04
#define SEL_REPLIES_WIDE 0x07

/* A seed being built. */
struct seed {
	uint8_t buf[8192];
	size_t len;
};

static void seed_start(struct seed *s, uint8_t selector)
{
	s->buf[0] = selector;
	s->len = 1;
}

/* The header version of the frames add_frame writes. */
static uint8_t frame_version = PROTO_VERSION;

static void add_frame(struct seed *s, uint8_t op, int reply, uint16_t status, uint64_t id,
		      const void *body, uint32_t body_bytes, const void *payload,
		      uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = frame_version, .opcode = op,
		.flags = reply ? PROTO_FLAG_REPLY : 0, .status = status,
		.body_bytes = body_bytes, .request_id = id, .payload_bytes = payload_bytes,
	};

	if (s->len + PROTO_HEADER_BYTES + body_bytes + payload_bytes > sizeof(s->buf)) {
		fprintf(stderr, "frame_seeds: seed too big\n");
		exit(1);
	}
	proto_header_encode(&h, s->buf + s->len);
	s->len += PROTO_HEADER_BYTES;
	memcpy(s->buf + s->len, body, body_bytes);
	s->len += body_bytes;
	memcpy(s->buf + s->len, payload, payload_bytes);
	s->len += payload_bytes;
}

static void seed_write(const struct seed *s, const char *dir, const char *name)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(s->buf, 1, s->len, f) != s->len || fclose(f)) {
		fprintf(stderr, "frame_seeds: %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

static void key_of(uint8_t key[PROTO_KEY_BYTES], int n)
{
	for (int i = 0; i < PROTO_KEY_BYTES; i++)
		key[i] = (uint8_t)(n * 37 + i * 11 + 1);
}

/* ---- request bodies ------------------------------------------------------- */

static size_t hello_body(uint8_t *body, const char *ns, const char *token)
{
	struct proto_hello h = {
		.min_version = 1, .max_version = 1, .ns = ns, .ns_len = (uint16_t)strlen(ns),
		.token = token, .token_len = token ? (uint16_t)strlen(token) : 0,
	};

	if (proto_hello_encode(&h, body, 1024))
		exit(1);
	return proto_hello_body_bytes(&h);
}

/* A PUT of n chained blocks of the given lengths; the payload is 'a'.. */
static size_t put_body(uint8_t *body, int n, const uint64_t *lengths, uint8_t *payload,
		       uint64_t *payload_bytes)
{
	uint64_t off = 0;

	proto_batch_encode_prefix(body, (uint32_t)n, 0);
	for (int i = 0; i < n; i++) {
		struct proto_put_entry e = { .length = lengths[i] };

		key_of(e.key, i);
		if (i) {
			key_of(e.parent, i - 1);
			e.flags = PROTO_PUT_HAS_PARENT;
		}
		for (uint64_t k = 0; k < lengths[i]; k++)
			payload[off + k] = (uint8_t)('a' + (i + k) % 26);
		e.checksum = 0x1234567890abcdefull ^ (uint64_t)i;
		proto_put_entry_encode(body, (uint32_t)i, &e);
		off += lengths[i];
	}
	*payload_bytes = off;
	return proto_batch_body_bytes((uint32_t)n, PROTO_PUT_ENTRY_BYTES);
}

/* A v2 PUT of n chained blocks, each retained for retain_ms. */
static size_t put_body_v2(uint8_t *body, int n, const uint64_t *lengths, uint32_t retain_ms,
			  uint8_t *payload, uint64_t *payload_bytes)
{
	uint64_t off = 0;

	proto_batch_encode_prefix(body, (uint32_t)n, 0);
	for (int i = 0; i < n; i++) {
		struct proto_put_entry e = { .length = lengths[i], .retain_ms = retain_ms };

		key_of(e.key, i);
		if (i) {
			key_of(e.parent, i - 1);
			e.flags = PROTO_PUT_HAS_PARENT;
		}
		for (uint64_t k = 0; k < lengths[i]; k++)
			payload[off + k] = (uint8_t)('a' + (i + k) % 26);
		e.checksum = 0x1234567890abcdefull ^ (uint64_t)i;
		proto_put_entry_encode_v(body, (uint32_t)i, PROTO_VERSION_2, &e);
		off += lengths[i];
	}
	*payload_bytes = off;
	return proto_batch_body_bytes((uint32_t)n, PROTO_PUT_ENTRY_BYTES);
}

/* A v2 MATCH of n keys with options. */
static size_t match_v2_body(uint8_t *body, int n, uint32_t lease_ms,
			    const struct proto_match_opts *o)
{
	uint8_t key[PROTO_KEY_BYTES];

	proto_match_encode_prefix(body, PROTO_VERSION_2, (uint32_t)n, lease_ms, o);
	for (int i = 0; i < n; i++) {
		key_of(key, i);
		proto_match_key_encode(body, PROTO_VERSION_2, (uint32_t)i, key);
	}
	return proto_match_body_bytes(PROTO_VERSION_2, (uint32_t)n);
}

static size_t get_body(uint8_t *body, int n)
{
	proto_batch_encode_prefix(body, (uint32_t)n, 0);
	for (int i = 0; i < n; i++) {
		struct proto_get_entry e = { .max_length = 4096 };

		key_of(e.key, i);
		proto_get_entry_encode(body, (uint32_t)i, &e);
	}
	return proto_batch_body_bytes((uint32_t)n, PROTO_GET_ENTRY_BYTES);
}

static size_t keys_body(uint8_t *body, int n, uint32_t aux)
{
	uint8_t key[PROTO_KEY_BYTES];

	proto_batch_encode_prefix(body, (uint32_t)n, aux);
	for (int i = 0; i < n; i++) {
		key_of(key, i);
		proto_key_entry_encode(body, (uint32_t)i, key);
	}
	return proto_batch_body_bytes((uint32_t)n, PROTO_KEY_ENTRY_BYTES);
}

static size_t name_body(uint8_t *body, const char *name)
{
	uint16_t len = name ? (uint16_t)strlen(name) : 0;

	if (proto_name_encode(name, len, body, 512))
		exit(1);
	return proto_name_body_bytes(len);
}

/* ---- reply bodies ----------------------------------------------------------- */

static size_t results_body(uint8_t *body, int n, uint16_t status, uint64_t length)
{
	proto_batch_encode_prefix(body, (uint32_t)n, 0);
	for (int i = 0; i < n; i++) {
		struct proto_result r = { .status = status, .tier = PROTO_TIER_DRAM,
					  .length = length, .checksum = 0xfeedull + (uint64_t)i };

		proto_result_encode(body, (uint32_t)i, &r);
	}
	return proto_batch_body_bytes((uint32_t)n, PROTO_RESULT_ENTRY_BYTES);
}

static size_t error_body(uint8_t *body, const char *msg)
{
	if (proto_error_encode(msg, strlen(msg), body, 2048))
		exit(1);
	return proto_error_body_bytes(strlen(msg));
}

/* ---- the seeds --------------------------------------------------------------- */

static void write_requests(const char *dir)
{
	static const uint64_t lens[3] = { 11, 6, 300 }, one[1] = { 1 };
	uint8_t body[4096], payload[4096];
	uint64_t pay;
	struct seed s;
	size_t n;

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = hello_body(body, "demo", NULL);
	add_frame(&s, PROTO_OP_HELLO, 0, 0, 1, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-hello");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = hello_body(body, "llama3-70b/bf16/tp4/rank2/b16", "s3cret-token");
	add_frame(&s, PROTO_OP_HELLO, 0, 0, 1, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-hello-token");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = put_body(body, 3, lens, payload, &pay);
	add_frame(&s, PROTO_OP_PUT, 0, 0, 7, body, (uint32_t)n, payload, pay);
	seed_write(&s, dir, "req-put-chain");

	seed_start(&s, SEL_REQUESTS_TINY);
	n = put_body(body, 1, one, payload, &pay);
	add_frame(&s, PROTO_OP_PUT, 0, 0, 8, body, (uint32_t)n, payload, pay);
	seed_write(&s, dir, "req-put-tiny-limits");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = get_body(body, 3);
	add_frame(&s, PROTO_OP_GET, 0, 0, 9, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-get");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = keys_body(body, 2, 0);
	add_frame(&s, PROTO_OP_EXISTS, 0, 0, 10, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-exists");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = keys_body(body, 4, 5000);
	add_frame(&s, PROTO_OP_MATCH, 0, 0, 11, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-match-lease");

	seed_start(&s, SEL_REQUESTS_NONE);
	n = keys_body(body, 1, 0);
	add_frame(&s, PROTO_OP_DELETE, 0, 0, 12, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-delete-nolimits");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = name_body(body, "demo");
	add_frame(&s, PROTO_OP_DROP_NAMESPACE, 0, 0, 13, body, (uint32_t)n, NULL, 0);
	n = name_body(body, NULL);
	add_frame(&s, PROTO_OP_STATS, 0, 0, 14, body, (uint32_t)n, NULL, 0);
	n = name_body(body, "demo");
	add_frame(&s, PROTO_OP_STATS, 0, 0, 15, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "req-drop-stats");

	seed_start(&s, SEL_REQUESTS_DEFAULT);
	add_frame(&s, PROTO_OP_PING, 0, 0, 16, NULL, 0, NULL, 0);
	seed_write(&s, dir, "req-ping");

	/* A whole session on one connection. */
	seed_start(&s, SEL_REQUESTS_DEFAULT);
	n = hello_body(body, "session", NULL);
	add_frame(&s, PROTO_OP_HELLO, 0, 0, 1, body, (uint32_t)n, NULL, 0);
	n = put_body(body, 2, lens, payload, &pay);
	add_frame(&s, PROTO_OP_PUT, 0, 0, 2, body, (uint32_t)n, payload, pay);
	n = keys_body(body, 2, 1000);
	add_frame(&s, PROTO_OP_MATCH, 0, 0, 3, body, (uint32_t)n, NULL, 0);
	n = get_body(body, 2);
	add_frame(&s, PROTO_OP_GET, 0, 0, 4, body, (uint32_t)n, NULL, 0);
	add_frame(&s, PROTO_OP_PING, 0, 0, 5, NULL, 0, NULL, 0);
	seed_write(&s, dir, "req-session");

	/* protocol v2: a waiting MATCH with a retention, a PUT that retains,
	 * and a v2 session (HELLO's header stays version 1) */
	{
		const struct proto_match_opts wait = { .wait_ms = 2000, .want = 3, .retain_ms = 60000 };

		frame_version = PROTO_VERSION_2;
		seed_start(&s, SEL_REQUESTS_DEFAULT);
		n = match_v2_body(body, 4, 5000, &wait);
		add_frame(&s, PROTO_OP_MATCH, 0, 0, 21, body, (uint32_t)n, NULL, 0);
		seed_write(&s, dir, "req-match-v2-wait");

		seed_start(&s, SEL_REQUESTS_DEFAULT);
		n = put_body_v2(body, 3, lens, 3600000, payload, &pay);
		add_frame(&s, PROTO_OP_PUT, 0, 0, 22, body, (uint32_t)n, payload, pay);
		seed_write(&s, dir, "req-put-v2-retain");

		seed_start(&s, SEL_REQUESTS_DEFAULT);
		frame_version = PROTO_VERSION;
		n = hello_body(body, "session-v2", NULL);
		proto_put_u16(body + 2, PROTO_VERSION_2); /* max_version */
		add_frame(&s, PROTO_OP_HELLO, 0, 0, 1, body, (uint32_t)n, NULL, 0);
		frame_version = PROTO_VERSION_2;
		n = put_body_v2(body, 2, lens, 0, payload, &pay);
		add_frame(&s, PROTO_OP_PUT, 0, 0, 2, body, (uint32_t)n, payload, pay);
		n = match_v2_body(body, 2, 1000, NULL);
		add_frame(&s, PROTO_OP_MATCH, 0, 0, 3, body, (uint32_t)n, NULL, 0);
		frame_version = PROTO_VERSION; /* a v1 frame on a v2 connection */
		n = keys_body(body, 2, 1000);
		add_frame(&s, PROTO_OP_MATCH, 0, 0, 4, body, (uint32_t)n, NULL, 0);
		seed_write(&s, dir, "req-session-v2");
	}
}

static void write_replies(const char *dir)
{
	static const char stats[] = "{\"version\":\"0.1.0\",\"protocol\":1,\"pid\":1}";
	struct proto_hello_reply hr = {
		.version = 1, .max_batch_blocks = 1024, .max_block_bytes = 64ull << 20,
		.max_frame_bytes = 1u << 20, .max_lease_ms = 5000,
		.max_inflight_put_bytes = 512ull << 20,
	};
	uint8_t body[4096], payload[64];
	struct seed s;
	size_t n;

	seed_start(&s, SEL_REPLIES_DEFAULT);
	proto_hello_reply_encode(&hr, body);
	add_frame(&s, PROTO_OP_HELLO, 1, PROTO_STATUS_OK, 1, body, PROTO_HELLO_REPLY_BYTES, NULL,
		  0);
	seed_write(&s, dir, "rep-hello");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	n = results_body(body, 2, PROTO_STATUS_OK, 11);
	add_frame(&s, PROTO_OP_PUT, 1, PROTO_STATUS_OK, 7, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "rep-put");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	n = results_body(body, 2, PROTO_STATUS_OK, 16);
	memset(payload, 'x', 32);
	add_frame(&s, PROTO_OP_GET, 1, PROTO_STATUS_OK, 9, body, (uint32_t)n, payload, 32);
	seed_write(&s, dir, "rep-get-payload");

	seed_start(&s, SEL_REPLIES_WIDE);
	n = results_body(body, 3, PROTO_STATUS_NOT_FOUND, 0);
	add_frame(&s, PROTO_OP_EXISTS, 1, PROTO_STATUS_OK, 10, body, (uint32_t)n, NULL, 0);
	n = results_body(body, 1, PROTO_STATUS_OK, 0);
	add_frame(&s, PROTO_OP_DELETE, 1, PROTO_STATUS_OK, 12, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "rep-exists-delete");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	proto_match_reply_encode(3, 5000, body);
	add_frame(&s, PROTO_OP_MATCH, 1, PROTO_STATUS_OK, 11, body, PROTO_MATCH_REPLY_BYTES, NULL,
		  0);
	proto_drop_reply_encode(10, 4096, body);
	add_frame(&s, PROTO_OP_DROP_NAMESPACE, 1, PROTO_STATUS_OK, 13, body,
		  PROTO_DROP_REPLY_BYTES, NULL, 0);
	add_frame(&s, PROTO_OP_STATS, 1, PROTO_STATUS_OK, 14, stats, sizeof(stats) - 1, NULL, 0);
	add_frame(&s, PROTO_OP_PING, 1, PROTO_STATUS_OK, 16, NULL, 0, NULL, 0);
	seed_write(&s, dir, "rep-match-drop-stats-ping");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	n = error_body(body, "frame of 2097184 bytes exceeds max_frame_bytes 1048576");
	add_frame(&s, PROTO_OP_PUT, 1, PROTO_STATUS_TOO_LARGE, 20, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "rep-error-too-large");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	n = error_body(body, "max_connections 1024 reached");
	add_frame(&s, PROTO_OP_NONE, 1, PROTO_STATUS_BUSY, 0, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "rep-connection-busy");

	seed_start(&s, SEL_REPLIES_DEFAULT);
	n = error_body(body, "token does not grant namespace");
	add_frame(&s, PROTO_OP_HELLO, 1, PROTO_STATUS_DENIED, 1, body, (uint32_t)n, NULL, 0);
	n = results_body(body, 2, PROTO_STATUS_BUSY, 0);
	add_frame(&s, PROTO_OP_PUT, 1, PROTO_STATUS_OK, 2, body, (uint32_t)n, NULL, 0);
	n = results_body(body, 1, PROTO_STATUS_FULL, 0);
	add_frame(&s, PROTO_OP_PUT, 1, PROTO_STATUS_OK, 3, body, (uint32_t)n, NULL, 0);
	seed_write(&s, dir, "rep-denied-busy-full");

	/* protocol v2: the 48-byte HELLO reply, PUT results with retention
	 * flags, the 24-byte MATCH reply */
	{
		const struct proto_match_reply mr = {
			.matched = 3, .lease_ms = 5000,
			.flags = PROTO_MATCH_LEASE_CUT | PROTO_MATCH_WAITED | PROTO_MATCH_WAIT_TIMEOUT,
			.present = 4, .retained = 4, .retain_ms = 60000,
		};
		struct proto_result r = { .status = PROTO_STATUS_OK, .tier = PROTO_TIER_DRAM,
					  .length = 11, .checksum = 0xfeed,
					  .flags = PROTO_PUT_RETAINED | PROTO_PUT_RETAIN_CLAMPED,
					  .retain_ms = 86400000 };

		hr.version = PROTO_VERSION_2;
		hr.max_match_wait_ms = 30000;
		hr.max_retain_ms = 86400000;
		seed_start(&s, SEL_REPLIES_DEFAULT);
		proto_hello_reply_encode(&hr, body);
		add_frame(&s, PROTO_OP_HELLO, 1, PROTO_STATUS_OK, 1, body,
			  PROTO_HELLO_REPLY_V2_BYTES, NULL, 0);
		frame_version = PROTO_VERSION_2;
		proto_batch_encode_prefix(body, 2, 0);
		proto_result_encode_v(body, 0, PROTO_VERSION_2, &r);
		r.status = PROTO_STATUS_EXISTS;
		r.flags = PROTO_PUT_RETAIN_BUDGET;
		r.retain_ms = 0;
		proto_result_encode_v(body, 1, PROTO_VERSION_2, &r);
		add_frame(&s, PROTO_OP_PUT, 1, PROTO_STATUS_OK, 2, body,
			  (uint32_t)proto_batch_body_bytes(2, PROTO_RESULT_ENTRY_BYTES), NULL, 0);
		proto_match_reply_encode_v(PROTO_VERSION_2, &mr, body);
		add_frame(&s, PROTO_OP_MATCH, 1, PROTO_STATUS_OK, 3, body,
			  PROTO_MATCH_REPLY_V2_BYTES, NULL, 0);
		frame_version = PROTO_VERSION;
		seed_write(&s, dir, "rep-v2-hello-put-match");
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: frame_seeds DIR\n");
		return 2;
	}
	write_requests(argv[1]);
	write_replies(argv[1]);
	return 0;
}
