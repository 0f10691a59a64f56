/*
 * test_srv_conn.c - unit tests of the transport-free session checks of
 * srv_conn.c and srv_request.c: what a protocol-error log line may quote
 * of a request, the per-opcode body bound, namespace name validation.
 * (Moved from test_server.c.)
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

#include "proto.h"
#include "srv_conn.h"
#include "srv_request.h"

/* ---- namespace names ------------------------------------------------------ */

static void test_ns_name_valid(void **state)
{
	char longest[PROTO_NAME_MAX_BYTES + 1];

	(void)state;
	memset(longest, 'n', sizeof(longest));
	assert_true(proto_name_valid("llama3-8b/bf16/tp2:r0", 21));
	assert_true(proto_name_valid("!", 1));
	assert_true(proto_name_valid("~", 1));
	assert_true(proto_name_valid(longest, PROTO_NAME_MAX_BYTES));
	assert_false(proto_name_valid(longest, PROTO_NAME_MAX_BYTES + 1));
	assert_false(proto_name_valid("", 0));
	assert_false(proto_name_valid("a b", 3));
	assert_false(proto_name_valid("a\x7f", 2));
	assert_false(proto_name_valid("a\tb", 3));
	assert_false(proto_name_valid("caf\xc3\xa9", 5));
	assert_false(proto_name_valid("a\0b", 3));
}

/* ---- what a protocol-error log line quotes ------------------------------------ */

static void test_quote_never_shows_hello_body(void **state)
{
	static const char token[] = "s3cret-token-value";
	struct proto_hello hello = {
		.min_version = 1, .max_version = 1, .ns = "tenant", .ns_len = 6,
		.token = token, .token_len = sizeof(token) - 1,
	};
	struct proto_header h = { .opcode = PROTO_OP_HELLO, .request_id = 3 };
	uint8_t body[64];
	char out[512];
	size_t n;

	(void)state;
	h.body_bytes = (uint32_t)proto_hello_body_bytes(&hello);
	assert_int_equal(proto_hello_encode(&hello, body, sizeof(body)), 0);
	/* Make it malformed (min > max), as a refused HELLO would be. */
	proto_put_u16(body, 9);
	n = srv_conn_quote_body(&h, body, h.body_bytes, out, sizeof(out));
	assert_int_equal(n, strlen(out));
	assert_null(strstr(out, "s3cret"));
	assert_null(strstr(out, "tenant"));
	assert_string_equal(out, "header only: opcode 1, body_bytes 32, payload_bytes 0");
}

static void test_quote_other_bodies_sanitized(void **state)
{
	struct proto_header h = { .opcode = PROTO_OP_EXISTS };
	uint8_t body[200];
	char out[512];

	(void)state;
	memset(body, 'k', sizeof(body));
	body[0] = 0x01;
	h.body_bytes = sizeof(body);
	srv_conn_quote_body(&h, body, sizeof(body), out, sizeof(out));
	/* "body: ", \x01, then 63 of the 'k's: SRV_QUOTE_BODY_BYTES in all. */
	assert_int_equal(strncmp(out, "body: \\x01kkk", 13), 0);
	assert_int_equal(strlen(out), 6 + 4 + SRV_QUOTE_BODY_BYTES - 1);
	/* No body, nothing to quote; a tiny buffer stays terminated. */
	assert_int_equal(srv_conn_quote_body(&h, NULL, 0, out, sizeof(out)), 0);
	assert_string_equal(out, "");
	assert_int_equal(srv_conn_quote_body(&h, body, sizeof(body), out, 4), 0);
	assert_string_equal(out, "");
}

/* ---- body bound per opcode ------------------------------------------------------ */

static void test_body_max_per_opcode(void **state)
{
	struct proto_limits l = { .max_frame_bytes = 4 << 20, .max_batch_blocks = 1024,
				  .max_block_bytes = 1 << 20 };

	(void)state;
	assert_int_equal(srv_conn_body_max(PROTO_OP_EXISTS, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_MATCH, &l), 8 + 32 * 1024);
	/* a v2 MATCH carries 16 bytes of options before its keys */
	assert_int_equal(srv_conn_body_max_v(PROTO_OP_MATCH, 2, &l), 24 + 32 * 1024);
	assert_int_equal(srv_conn_body_max_v(PROTO_OP_MATCH, 1, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max_v(PROTO_OP_PUT, 2, &l), 8 + 88 * 1024);
	assert_int_equal(srv_conn_body_max_v(PROTO_OP_HELLO, 2, &l), 8 + 255 + 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_DELETE, &l), 8 + 32 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_GET, &l), 8 + 40 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), 8 + 88 * 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_HELLO, &l), 8 + 255 + 1024);
	assert_int_equal(srv_conn_body_max(PROTO_OP_DROP_NAMESPACE, &l), 4 + 255);
	assert_int_equal(srv_conn_body_max(PROTO_OP_STATS, &l), 4 + 255);
	assert_int_equal(srv_conn_body_max(PROTO_OP_PING, &l), 0);
	assert_int_equal(srv_conn_body_max(PROTO_OP_NONE, &l), 0);
	assert_int_equal(srv_conn_body_max(200, &l), 0);
	l.max_batch_blocks = 65536;
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), 8 + 88 * 65536);
	l.max_batch_blocks = UINT32_MAX; /* saturates instead of wrapping */
	assert_int_equal(srv_conn_body_max(PROTO_OP_PUT, &l), UINT32_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ns_name_valid),
		cmocka_unit_test(test_quote_never_shows_hello_body),
		cmocka_unit_test(test_quote_other_bodies_sanitized),
		cmocka_unit_test(test_body_max_per_opcode),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
