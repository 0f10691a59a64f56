/*
 * test_auth.c - tokens and tenants against a real kvpoold with a tokens
 * file: HELLO without a valid token is DENIED and closed, a token binds
 * only its namespace prefixes, a read-only token cannot PUT, DELETE or
 * DROP, and a namespace over its quota evicts its own blocks first, then
 * answers QUOTA. Also the start-up refusals: a tokens file others may
 * read, a bad line (named by file:line), a missing file.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "harness.h"

#define TOK_RW "team-a-rw-0123456789abcdef"
#define TOK_RO "team-a-ro-0123456789abcdef"
#define TOK_ALL "admin-all-0123456789abcdef"

static const char tokens_text[] =
	"# kvpool tokens for test_auth\n"
	"[tokens]\n"
	TOK_RW "  rw  team-a/ shared/   # team-b/ has its own token; * is the admin's\n"
	TOK_RO "\tro\tteam-a/\r\n"
	TOK_ALL " rw *\n"
	"\n"
	"[quota]\n"
	"team-a/quota = 64KiB\n"
	"pfx/* = 32 KiB\n"
	"pfx/big = 0\n";

static struct {
	struct harness_server srv;
	char dir[256];
	char tokens[300];
	const char *flags[16];
} g;

/* Write text to path with mode (exactly: umask does not apply). */
static int write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -errno;
	fputs(text, f);
	if (fclose(f) != 0 || chmod(path, mode) != 0)
		return -errno;
	return 0;
}

static int group_setup(void **state)
{
	const char *const *d = harness_default_flags;
	int n = 0;

	(void)state;
	if (harness_tmpdir("auth", g.dir, sizeof(g.dir)) < 0)
		return -1;
	snprintf(g.tokens, sizeof(g.tokens), "%s/tokens", g.dir);
	if (write_file(g.tokens, tokens_text, 0600) < 0)
		return -1;
	while (*d && n < 12)
		g.flags[n++] = *d++;
	g.flags[n++] = "--tokens-file";
	g.flags[n++] = g.tokens;
	g.flags[n] = NULL;
	return harness_group_start(&g.srv, g.flags);
}

static int group_teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	harness_rm_rf(g.dir);
	return 0;
}

/* Connect with a token (NULL for none). */
static int connect_tok(const char *ns, const char *token, struct kvpool_client **out)
{
	struct kvpool_options o = { .token = token, .timeout_ms = 10000 };

	return kvpool_connect(g.srv.url, ns, &o, out);
}

static struct kvpool_client *client_or_fail(const char *ns, const char *token)
{
	struct kvpool_client *c = NULL;

	assert_int_equal(connect_tok(ns, token, &c), 0);
	return c;
}

/* Raw HELLO with a token; returns the reply (the caller frees it). */
static void raw_hello(int fd, const char *ns, const char *token, struct harness_frame *f)
{
	struct proto_hello h = {
		.min_version = PROTO_VERSION_MIN, .max_version = PROTO_VERSION_MAX,
		.ns = ns, .ns_len = (uint16_t)strlen(ns),
		.token = token, .token_len = token ? (uint16_t)strlen(token) : 0,
	};
	uint8_t body[PROTO_HELLO_FIXED_BYTES + PROTO_NAME_MAX_BYTES + PROTO_TOKEN_MAX_BYTES];

	assert_int_equal(proto_hello_encode(&h, body, sizeof(body)), 0);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_HELLO, 7, body,
					    (uint32_t)proto_hello_body_bytes(&h), NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, 5000, f), 0);
}

/* A HELLO refused: DENIED with `want` in its message; the connection
 * stays open and unbound: a request other than HELLO or PING still gets
 * "hello required", and a good HELLO then works. */
static void check_hello_denied(const char *ns, const char *token, const char *want)
{
	struct harness_frame f;
	char msg[512];
	int fd = -1;

	assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
	raw_hello(fd, ns, token, &f);
	assert_int_equal(f.h.status, PROTO_STATUS_DENIED);
	assert_int_equal(f.h.request_id, 7);
	assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
	if (!strstr(msg, want))
		fail_msg("denial message \"%s\" lacks \"%s\"", msg, want);
	harness_frame_free(&f);
	assert_int_equal(harness_send_frame(fd, PROTO_OP_STATS, 8, "\0\0\0\0", 4, NULL, 0), 0);
	assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_BAD_REQUEST);
	harness_frame_free(&f);
	raw_hello(fd, "team-a/m", TOK_RW, &f);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	close(fd);
}

static void test_hello_needs_token(void **state)
{
	struct kvpool_client *c = NULL;

	(void)state;
	harness_need_server(&g.srv);
	check_hello_denied("team-a/m", NULL, "requires a token");
	assert_int_equal(connect_tok("team-a/m", NULL, &c), -EACCES);
	assert_null(c);
	/* PING needs no HELLO, so health checks work without a token */
	{
		struct harness_frame f;
		int fd = -1;

		assert_int_equal(harness_raw_connect(g.srv.port, &fd), 0);
		assert_int_equal(harness_send_frame(fd, PROTO_OP_PING, 3, NULL, 0, NULL, 0), 0);
		assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
		assert_int_equal(f.h.status, PROTO_STATUS_OK);
		harness_frame_free(&f);
		close(fd);
	}
}

static void test_unknown_token(void **state)
{
	struct kvpool_client *c = NULL;

	(void)state;
	harness_need_server(&g.srv);
	check_hello_denied("team-a/m", "team-a-rw-0123456789abcdeX", "unknown token");
	/* a prefix of a real token is no token */
	check_hello_denied("team-a/m", "team-a-rw-0123456789abcde", "unknown token");
	assert_int_equal(connect_tok("team-a/m", TOK_RW "x", &c), -EACCES);
}

static void test_namespace_denied(void **state)
{
	struct kvpool_client *c = NULL;

	(void)state;
	harness_need_server(&g.srv);
	/* the words of the inline comment above grant nothing (issue 20) */
	check_hello_denied("team-b/m", TOK_RW, "does not grant namespace team-b/m");
	check_hello_denied("other", TOK_RW, "does not grant namespace other");
	/* "team-a" without the slash is not under the prefix "team-a/" */
	check_hello_denied("team-a", TOK_RW, "does not grant");
	check_hello_denied("shared/x", TOK_RO, "does not grant");
	assert_int_equal(connect_tok("team-b/m", TOK_RW, &c), -EACCES);
	c = client_or_fail("shared/x", TOK_RW);
	/* STATS of one namespace: only of a granted one */
	{
		char *json = NULL;

		assert_int_equal(kvpool_stats(c, "team-b/m", &json), -EACCES);
		assert_null(json);
		assert_int_equal(kvpool_stats(c, "team-a/m", &json), 0);
		kvpool_free(json);
	}
	kvpool_close(c);
	c = client_or_fail("team-b/anything", TOK_ALL);
	kvpool_close(c);
}

static void test_rw_and_ro(void **state)
{
	struct kvpool_client *rw, *ro;
	uint8_t key[32], key2[32], data[5000], got[5000];
	uint64_t len = 0, dropped = 0;
	int st = 0;

	(void)state;
	harness_need_server(&g.srv);
	rw = client_or_fail("team-a/m", TOK_RW);
	ro = client_or_fail("team-a/m", TOK_RO);
	harness_key(key, "ro", 1);
	harness_key(key2, "ro", 2);
	harness_fill(data, sizeof(data), 1);
	assert_int_equal(kvpool_put_bytes(rw, key, NULL, data, sizeof(data)), 0);
	/* ro reads */
	assert_int_equal(kvpool_get_bytes(ro, key, got, sizeof(got), &len), 0);
	assert_int_equal(len, sizeof(data));
	assert_memory_equal(got, data, sizeof(data));
	/* ro cannot write, delete or drop; the connection stays usable */
	assert_int_equal(kvpool_put_bytes(ro, key2, key, data, sizeof(data)), -EACCES);
	assert_int_equal(kvpool_delete(ro, key, 1, &st), -EACCES);
	assert_int_equal(kvpool_drop_namespace(ro, NULL, NULL), -EACCES);
	assert_int_equal(kvpool_drop_namespace(ro, "team-a/m", NULL), -EACCES);
	assert_int_equal(kvpool_exists(ro, key, 1, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(kvpool_exists(ro, key2, 1, &st), 0);
	assert_int_equal(st, -ENOENT);
	harness_check_block_or_fail(rw, key, data, sizeof(data));
	/* rw drops by name only what its token grants read-write */
	assert_int_equal(kvpool_drop_namespace(rw, "team-b/m", NULL), -EACCES);
	assert_int_equal(kvpool_drop_namespace(rw, "team-a/m", &dropped), 0);
	assert_int_equal(dropped, 1);
	assert_int_equal(kvpool_get_bytes(ro, key, got, sizeof(got), &len), -ENOENT);
	kvpool_close(ro);
	kvpool_close(rw);
}

/* Put n blocks of `bytes` each (tag, 1..n) as first blocks; statuses of
 * every put into st[]. */
static void put_many(struct kvpool_client *c, const char *tag, int n, size_t bytes, int *st)
{
	uint8_t key[32];
	uint8_t *data = malloc(bytes);

	assert_non_null(data);
	for (int i = 0; i < n; i++) {
		harness_key(key, tag, (uint64_t)i + 1);
		harness_fill(data, bytes, (uint64_t)i + 1);
		st[i] = kvpool_put_bytes(c, key, NULL, data, bytes);
	}
	free(data);
}

static void test_quota(void **state)
{
	struct kvpool_client *q, *other;
	uint8_t key[32], data[8192];
	int st[16];

	(void)state;
	harness_need_server(&g.srv);
	q = client_or_fail("team-a/quota", TOK_RW);
	other = client_or_fail("team-a/other", TOK_RW);
	put_many(other, "other", 4, 8192, st);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], 0);
	/* 16 x 8 KiB into 64 KiB: every put succeeds by evicting older ones
	 * of the same namespace */
	put_many(q, "q", 16, 8192, st);
	for (int i = 0; i < 16; i++)
		assert_int_equal(st[i], 0);
	assert_true(harness_ns_stat_or_fail(q, "team-a/quota", "bytes") <= 64 * 1024);
	assert_int_equal(harness_ns_stat_or_fail(q, "team-a/quota", "blocks"), 8);
	assert_int_equal(harness_ns_stat_or_fail(q, "team-a/quota", "evictions"), 8);
	/* the newest stayed, the oldest went */
	harness_key(key, "q", 16);
	harness_fill(data, sizeof(data), 16);
	harness_check_block_or_fail(q, key, data, sizeof(data));
	harness_key(key, "q", 1);
	harness_check_absent_or_fail(q, key);
	/* the neighbour namespace lost nothing */
	assert_int_equal(harness_ns_stat_or_fail(other, "team-a/other", "blocks"), 4);
	assert_int_equal(harness_ns_stat_or_fail(other, "team-a/other", "evictions"), 0);
	/* a block larger than the quota: QUOTA, and nothing was evicted for it */
	{
		size_t big = 80 * 1024;
		uint8_t *b = calloc(1, big);

		assert_non_null(b);
		harness_key(key, "q", 100);
		assert_int_equal(kvpool_put_bytes(q, key, NULL, b, big), -EDQUOT);
		free(b);
	}
	assert_int_equal(harness_ns_stat_or_fail(q, "team-a/quota", "blocks"), 8);
	kvpool_close(other);
	kvpool_close(q);
}

/* A namespace under a quota prefix gets that quota; an exact line of 0
 * takes it away again. */
static void test_quota_prefix(void **state)
{
	struct kvpool_client *c;
	uint8_t key[32];
	size_t bytes = 40 * 1024;
	uint8_t *data = calloc(1, bytes);

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	harness_key(key, "pfx", 1);
	c = client_or_fail("pfx/small", TOK_ALL);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, bytes), -EDQUOT);
	kvpool_close(c);
	c = client_or_fail("pfx/big", TOK_ALL);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, bytes), 0);
	kvpool_close(c);
	free(data);
}

/* Issue 20 item 3: one token may not fill the namespace table. With
 * --tenant-max-namespaces 3, TOK_RW's fourth namespace is refused at its
 * first PUT (HELLO, PING and STATS still work); namespaces it already has
 * stay writable; a "*" token is exempt. */
static void test_tenant_namespace_limit(void **state)
{
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", g.tokens,
				"--tenant-max-namespaces", "3", NULL };
	struct harness_server srv = { 0 };
	struct kvpool_client *c;
	uint8_t key[32] = { 1 }, data[100] = { 2 };
	uint64_t rtt = 0;
	char ns[32], *json = NULL;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&srv, flags), 0);
	for (int i = 1; i <= 4; i++) {
		struct kvpool_options o = { .token = TOK_RW, .timeout_ms = 10000 };

		snprintf(ns, sizeof(ns), "team-a/n%d", i);
		assert_int_equal(kvpool_connect(srv.url, ns, &o, &c), 0);
		assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)),
				 i <= 3 ? 0 : -EDQUOT);
		assert_int_equal(kvpool_ping(c, &rtt), 0);
		assert_int_equal(kvpool_stats(c, ns, &json), 0);
		kvpool_free(json);
		json = NULL;
		kvpool_close(c);
	}
	{
		struct kvpool_options o = { .token = TOK_RW, .timeout_ms = 10000 };
		uint8_t key2[32] = { 3 };

		/* an existing namespace of the token still takes puts */
		assert_int_equal(kvpool_connect(srv.url, "team-a/n2", &o, &c), 0);
		assert_int_equal(kvpool_put_bytes(c, key2, NULL, data, sizeof(data)), 0);
		kvpool_close(c);
		/* a token that grants "*" is not limited */
		o.token = TOK_ALL;
		for (int i = 1; i <= 5; i++) {
			snprintf(ns, sizeof(ns), "admin/n%d", i);
			assert_int_equal(kvpool_connect(srv.url, ns, &o, &c), 0);
			assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
			kvpool_close(c);
		}
	}
	assert_int_equal(harness_stop(&srv), 0);
}

/* Issue 20 items 4 and 5: tenant_max_bytes covers all of a token's
 * namespaces, and tenant_max_leased_bytes all of its connections' leases;
 * another token is not held back by either. */
static void test_tenant_bytes_and_leases(void **state)
{
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", g.tokens,
				"--tenant-max-bytes", "100KiB", "--tenant-max-leased-bytes", "64KiB",
				"--max-lease-ms", "60000", NULL };
	struct kvpool_options rw = { .token = TOK_RW, .timeout_ms = 10000 };
	struct kvpool_options all = { .token = TOK_ALL, .timeout_ms = 10000 };
	struct harness_server srv = { 0 };
	struct kvpool_client *a1, *a2, *x;
	uint8_t k1[32], k2[32], k3[32], *data = calloc(1, 40 * 1024);
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(data);
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(kvpool_connect(srv.url, "team-a/b1", &rw, &a1), 0);
	assert_int_equal(kvpool_connect(srv.url, "team-a/b2", &rw, &a2), 0);
	assert_int_equal(kvpool_connect(srv.url, "other/x", &all, &x), 0);
	harness_key(k1, "tb", 1);
	harness_key(k2, "tb", 2);
	harness_key(k3, "tb", 3);
	/* 2 x 40 KiB in b1, then 40 KiB more in b2 would pass 100 KiB: b2
	 * has nothing of its own to evict, and b1's blocks are not b2's */
	assert_int_equal(kvpool_put_bytes(a1, k1, NULL, data, 40 * 1024), 0);
	assert_int_equal(kvpool_put_bytes(a1, k2, NULL, data, 40 * 1024), 0);
	assert_int_equal(kvpool_put_bytes(a2, k3, NULL, data, 40 * 1024), -EDQUOT);
	assert_int_equal(kvpool_put_bytes(a2, k3, NULL, data, 16 * 1024), 0);
	/* the other token is not limited by team-a's bytes */
	for (int i = 0; i < 4; i++) {
		uint8_t k[32];

		harness_key(k, "tbx", (uint64_t)i);
		assert_int_equal(kvpool_put_bytes(x, k, NULL, data, 40 * 1024), 0);
	}
	/* leases: a1 leases 40 KiB; a2 may not add 16 KiB + ... past 64 KiB */
	assert_int_equal(kvpool_match(a1, (const uint8_t(*)[32])k1, 1, 60000, &matched), 0);
	assert_int_equal(matched, 1);
	assert_int_equal(kvpool_match(a1, (const uint8_t(*)[32])k2, 1, 60000, &matched), 0);
	assert_int_equal(matched, 0); /* the lease does not fit: cut to nothing */
	assert_int_equal(kvpool_match(a2, (const uint8_t(*)[32])k3, 1, 60000, &matched), 0);
	/* closing a1 ends its lease: room for a2's next. The server ends it
	 * when it handles the close, which may come after the new
	 * connection's MATCH (another thread): retry for up to 5 s */
	kvpool_close(a1);
	assert_int_equal(kvpool_connect(srv.url, "team-a/b1", &rw, &a1), 0);
	{
		int rc = -EDQUOT;

		for (int i = 0; i < 500 && rc == -EDQUOT; i++) {
			rc = kvpool_match(a1, (const uint8_t(*)[32])k2, 1, 60000, &matched);
			if (rc == -EDQUOT)
				usleep(10 * 1000);
		}
		assert_int_equal(rc, 0);
	}
	kvpool_close(a1);
	kvpool_close(a2);
	kvpool_close(x);
	free(data);
	assert_int_equal(harness_stop(&srv), 0);
}

#define TOK_BILL_A "bill-a-0123456789abcdef"
#define TOK_BILL_B "bill-b-0123456789abcdef"
#define TOK_BILL_OP "bill-op-0123456789abcdef"

/* Connect to srv in ns with token, failing the test otherwise. */
static struct kvpool_client *bill_client(const struct harness_server *srv, const char *ns,
					 const char *token)
{
	struct kvpool_options o = { .token = token, .timeout_ms = 10000 };
	struct kvpool_client *c = NULL;

	assert_int_equal(kvpool_connect(srv->url, ns, &o, &c), 0);
	return c;
}

/* Put block (tag, n) of `bytes` as a first block; returns the status. */
static int bill_put(struct kvpool_client *c, const char *tag, uint64_t n, size_t bytes)
{
	static uint8_t data[64 * 1024];
	uint8_t key[32];

	harness_key(key, tag, n);
	harness_fill(data, bytes, n);
	return kvpool_put_bytes(c, key, NULL, data, bytes);
}

/* Issue 28 item 4: tenants cannot deny each other through shared grants.
 * Bytes written into a namespace are billed to the writer's tenant, not
 * to the namespace's creator: B filling a namespace A created neither
 * makes A's own PUTs answer QUOTA nor evicts A's blocks, and B's own
 * limit evicts only B's blocks. Namespaces count against the tenant that
 * created them: the ones the operator's "*" token or B creates under A's
 * grants take nothing from A's tenant_max_namespaces. */
static void test_tenant_billing(void **state)
{
	static const char text[] =
		TOK_BILL_A " rw shared/ a/\n"
		TOK_BILL_B " rw shared/\n"
		TOK_BILL_OP " rw *\n";
	char path[300];
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", path,
				"--tenant-max-bytes", "100KiB", "--tenant-max-namespaces", "3", NULL };
	struct harness_server srv = { 0 };
	struct kvpool_client *a_shared, *a_own, *b_shared, *c;
	uint8_t key[32];
	int st = 0;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens-bill", g.dir);
	assert_int_equal(write_file(path, text, 0600), 0);
	assert_int_equal(harness_start(&srv, flags), 0);
	/* A creates shared/x (16 KiB) and a/own */
	a_shared = bill_client(&srv, "shared/x", TOK_BILL_A);
	assert_int_equal(bill_put(a_shared, "bill-a", 0, 16 * 1024), 0);
	/* B writes 80 KiB into A's namespace: billed to B */
	b_shared = bill_client(&srv, "shared/x", TOK_BILL_B);
	for (uint64_t i = 0; i < 5; i++)
		assert_int_equal(bill_put(b_shared, "bill-b", i, 16 * 1024), 0);
	/* A's own PUTs still fit A's 100 KiB: 16 + 64 KiB */
	a_own = bill_client(&srv, "a/own", TOK_BILL_A);
	for (uint64_t i = 1; i <= 4; i++)
		assert_int_equal(bill_put(a_own, "bill-a", i, 16 * 1024), 0);
	/* B past its own 100 KiB evicts its own oldest block, never A's */
	assert_int_equal(bill_put(b_shared, "bill-b", 5, 16 * 1024), 0);
	assert_int_equal(bill_put(b_shared, "bill-b", 6, 16 * 1024), 0);
	harness_key(key, "bill-a", 0);
	assert_int_equal(kvpool_exists(b_shared, key, 1, &st), 0);
	assert_int_equal(st, 0);
	harness_key(key, "bill-b", 0);
	assert_int_equal(kvpool_exists(b_shared, key, 1, &st), 0);
	assert_int_equal(st, -ENOENT);
	/* A past its own limit: A's block in a/own goes, not B's */
	assert_int_equal(bill_put(a_own, "bill-a", 5, 16 * 1024), 0);
	assert_int_equal(bill_put(a_own, "bill-a", 6, 16 * 1024), 0);
	harness_key(key, "bill-b", 1);
	assert_int_equal(kvpool_exists(b_shared, key, 1, &st), 0);
	assert_int_equal(st, 0);

	/* the operator and B make namespaces under A's grants */
	c = bill_client(&srv, "a/op1", TOK_BILL_OP);
	assert_int_equal(bill_put(c, "bill-op", 1, 1024), 0);
	kvpool_close(c);
	c = bill_client(&srv, "a/op2", TOK_BILL_OP);
	assert_int_equal(bill_put(c, "bill-op", 2, 1024), 0);
	kvpool_close(c);
	c = bill_client(&srv, "shared/b1", TOK_BILL_B);
	assert_int_equal(bill_put(c, "bill-b2", 1, 1024), 0);
	kvpool_close(c);
	/* A has created 2 (shared/x, a/own): a third is allowed, a fourth not */
	c = bill_client(&srv, "a/own2", TOK_BILL_A);
	assert_int_equal(bill_put(c, "bill-a2", 1, 1024), 0);
	kvpool_close(c);
	c = bill_client(&srv, "a/own3", TOK_BILL_A);
	assert_int_equal(bill_put(c, "bill-a2", 2, 1024), -EDQUOT);
	if (!strstr(kvpool_last_server_message(), "already has 3 namespaces"))
		fail_msg("namespace refusal says \"%s\"", kvpool_last_server_message());
	kvpool_close(c);
	kvpool_close(a_shared);
	kvpool_close(a_own);
	kvpool_close(b_shared);
	assert_int_equal(harness_stop(&srv), 0);
	unlink(path);
}

/* A PUT in a fresh namespace ns by token: its status, and the refusal's
 * message must hold `want` (when not NULL). */
static int bill_put_new(const struct harness_server *srv, const char *ns, const char *token,
			const char *tag, uint64_t n, const char *want)
{
	struct kvpool_client *c = bill_client(srv, ns, token);
	int rc = bill_put(c, tag, n, 1024);

	if (want && !strstr(kvpool_last_server_message(), want))
		fail_msg("refusal in %s says \"%s\", not \"%s\"", ns,
			 kvpool_last_server_message(), want);
	kvpool_close(c);
	return rc;
}

/* Tester finding F3: a warm restart keeps the billing. Blocks rebuilt
 * from NVMe stay charged to the tenant that wrote them and namespaces to
 * the one that created them (the NVMe index records the tenant's key);
 * a tenant that only binds a shared namespace after the restart is
 * charged nothing for it. Before, B binding shared/x first was billed
 * for A's and B's blocks there (locked out of its own namespaces with
 * QUOTA) and counted as its creator, while A's namespace count restarted
 * from zero. */
static void test_tenant_billing_restart(void **state)
{
	static const char text[] =
		TOK_BILL_A " rw shared/ a/\n"
		TOK_BILL_B " rw shared/ b/\n"
		TOK_BILL_OP " rw *\n";
	char path[300], nvdir[300];
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", path,
				"--tenant-max-bytes", "100KiB", "--tenant-max-namespaces", "2",
				"--nvme-dir", nvdir, "--nvme-capacity", "64MiB",
				"--nvme-segment-size", "2MiB", NULL };
	struct harness_server srv = { 0 };
	struct kvpool_client *a, *b;
	uint8_t key[32];
	int st = -1;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens-bill-restart", g.dir);
	snprintf(nvdir, sizeof(nvdir), "%s/nvme-bill", g.dir);
	assert_int_equal(write_file(path, text, 0600), 0);
	assert_int_equal(mkdir(nvdir, 0700), 0);
	assert_int_equal(harness_start(&srv, flags), 0);
	/* A creates shared/x with 64 KiB, B adds 64 KiB; A creates a/own */
	a = bill_client(&srv, "shared/x", TOK_BILL_A);
	b = bill_client(&srv, "shared/x", TOK_BILL_B);
	for (uint64_t i = 0; i < 4; i++) {
		assert_int_equal(bill_put(a, "rb-a", i, 16 * 1024), 0);
		assert_int_equal(bill_put(b, "rb-b", i, 16 * 1024), 0);
	}
	kvpool_close(a);
	kvpool_close(b);
	assert_int_equal(bill_put_new(&srv, "a/own", TOK_BILL_A, "rb-a", 9, NULL), 0);
	assert_int_equal(harness_stop(&srv), 0); /* drains DRAM to NVMe */

	assert_int_equal(harness_start(&srv, flags), 0);
	/* B binds the shared namespace first, read-write, and writes nothing
	 * there: its own 64 KiB are billed to it, A's are not */
	b = bill_client(&srv, "shared/x", TOK_BILL_B);
	harness_key(key, "rb-a", 3);
	assert_int_equal(kvpool_exists(b, key, 1, &st), 0);
	assert_int_equal(st, 0); /* the blocks did survive the restart */
	/* 64 + 2 x 16 KiB fit B's 100 KiB; billed for 128 KiB it got QUOTA */
	assert_int_equal(bill_put_new(&srv, "b/own", TOK_BILL_B, "rb-b", 10, NULL), 0);
	assert_int_equal(bill_put_new(&srv, "b/two", TOK_BILL_B, "rb-b", 11, NULL), 0);
	/* binding shared/x made B no creator: b/own and b/two are its 2 */
	assert_int_equal(bill_put_new(&srv, "b/three", TOK_BILL_B, "rb-b", 12,
				      "already has 2 namespaces"), -EDQUOT);
	/* A still created 2 (shared/x, a/own): a third is refused */
	assert_int_equal(bill_put_new(&srv, "a/third", TOK_BILL_A, "rb-a", 13,
				      "already has 2 namespaces"), -EDQUOT);
	/* STATS shows each tenant's billed bytes and namespaces (F4): A 64 +
	 * 1 KiB in 2, B 64 + 2 x 1 KiB in 2 */
	{
		struct kvpool_client *op = bill_client(&srv, "shared/x", TOK_BILL_OP);
		struct json_object *doc, *tenants;
		int seen_a = 0, seen_b = 0;

		assert_int_equal(harness_stats(op, NULL, &doc), 0);
		assert_true(json_object_object_get_ex(doc, "tenants", &tenants));
		json_object_object_foreach(tenants, id, t) {
			uint64_t billed = harness_json_u64_or_fail(t, "billed_bytes");
			uint64_t nss = harness_json_u64_or_fail(t, "namespaces");

			(void)id;
			seen_a += billed == 65 * 1024 && nss == 2;
			seen_b += billed == 66 * 1024 && nss == 2;
		}
		json_object_put(doc);
		assert_int_equal(seen_a, 1);
		assert_int_equal(seen_b, 1);
		kvpool_close(op);
	}
	/* a PUT past tenant_max_bytes says which limit (F4): B has 66 KiB */
	{
		struct kvpool_client *c = bill_client(&srv, "b/own", TOK_BILL_B);

		assert_int_equal(bill_put(c, "rb-b", 20, 40 * 1024), -EDQUOT);
		if (!strstr(kvpool_last_server_message(), "tenant_max_bytes 102400: the token "
			    "has written"))
			fail_msg("tenant QUOTA says \"%s\"", kvpool_last_server_message());
		kvpool_close(c);
	}
	kvpool_close(b);
	assert_int_equal(harness_stop(&srv), 0);
	harness_rm_rf(nvdir);
	unlink(path);
}

#define TOK_GONE "rev-gone-0123456789abcdef"
#define TOK_NARROW "rev-narrow-0123456789abcdef"
#define TOK_MOVED "rev-moved-0123456789abcdef"
#define TOK_STAY "rev-stay-0123456789abcdef"

/* A raw session bound with a token; fails the test unless HELLO is OK. */
static int raw_session(uint16_t port, const char *ns, const char *token)
{
	struct harness_frame f;
	int fd = -1;

	assert_int_equal(harness_raw_connect(port, &fd), 0);
	raw_hello(fd, ns, token, &f);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	return fd;
}

/* Send a one-key GET on fd and expect DENIED whose message holds `want`;
 * the session stays refused (a second request too), and open so that
 * the client reads why. */
static void check_revoked(int fd, const uint8_t key[32], const char *want)
{
	struct harness_frame f;
	char msg[512];

	for (uint64_t id = 41; id <= 42; id++) {
		assert_int_equal(harness_raw_get(fd, id, (const uint8_t(*)[32])key, 1, 4096, 5000,
						 &f), 0);
		assert_int_equal(f.h.status, PROTO_STATUS_DENIED);
		assert_int_equal(f.h.request_id, id);
		assert_int_equal(harness_error_message(&f, msg, sizeof(msg), NULL, NULL), 0);
		if (!strstr(msg, want))
			fail_msg("revocation message \"%s\" lacks \"%s\"", msg, want);
		harness_frame_free(&f);
	}
	close(fd);
}

/* Tester finding F2: a MATCH waiting (wait_ms) when a SIGHUP revokes its
 * token is answered DENIED with the reason, not with what the namespace
 * holds, and takes no lease. Before, the reload ended the wait with a
 * real answer (matched 1, WAITED|WAIT_ENDED) and a new lease. */
static void test_revocation_waiting_match(void **state)
{
	static const char before[] = TOK_GONE " rw rev/\n" TOK_STAY " rw rev/\n";
	static const char after[] = TOK_STAY " rw rev/\n";
	char path[300];
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", path,
				"--max-lease-ms", "60000", NULL };
	struct kvpool_options o_gone = { .token = TOK_GONE, .timeout_ms = 10000 };
	struct kvpool_options o_stay = { .token = TOK_STAY, .timeout_ms = 10000 };
	struct kvpool_match_opts mo = { .lease_ms = 30000, .wait_ms = 20000, .want = 2 };
	struct kvpool_match_result res;
	struct harness_server srv = { 0 };
	struct kvpool_client *gone, *waiter, *stay;
	struct kvpool_completion done;
	uint8_t keys[2][32], data[4096];
	uint64_t id = 0;
	int n = 0;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens-rev-wait", g.dir);
	assert_int_equal(write_file(path, before, 0600), 0);
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/w", &o_gone, &gone), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/w", &o_gone, &waiter), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/w", &o_stay, &stay), 0);
	harness_key(keys[0], "revw", 1);
	harness_key(keys[1], "revw", 2);
	harness_fill(data, sizeof(data), 1);
	assert_int_equal(kvpool_put_bytes(gone, keys[0], NULL, data, sizeof(data)), 0);
	/* only the first of the two is there: the MATCH waits */
	assert_int_equal(kvpool_submit_match_ex(waiter, keys, 2, &mo, &res, 1, &id), 0);
	for (int i = 0; i < 250 && harness_stat_or_fail(stay, "ops.match.waits.waiting") == 0; i++)
		harness_sleep_ms(20);
	assert_int_equal(harness_stat_or_fail(stay, "ops.match.waits.waiting"), 1);

	assert_int_equal(write_file(path, after, 0600), 0);
	assert_int_equal(kill(srv.pid, SIGHUP), 0);
	n = kvpool_poll(waiter, &done, 1, 10000);
	assert_int_equal(n, 1);
	assert_int_equal(done.status, -EACCES);
	if (!strstr(kvpool_last_server_message(), "the token was revoked"))
		fail_msg("the waiting MATCH was refused with \"%s\"", kvpool_last_server_message());
	assert_int_equal(done.matched, 0);
	assert_int_equal(harness_stat_or_fail(stay, "leases_active"), 0);
	kvpool_close(gone);
	kvpool_close(waiter);
	kvpool_close(stay);
	assert_int_equal(harness_stop(&srv), 0);
	unlink(path);
}

/* Issue 28 item 3: after a SIGHUP removes or narrows a token, the
 * connections that authenticated with it lose what it no longer grants
 * at their next request: a removed token (or one whose grants no longer
 * cover the namespace) gets DENIED from then on, its leases ended; one
 * narrowed to read-only keeps reading and may no longer write; DROP of a
 * namespace the token does not grant says so (not "read-only"). Other
 * tokens' connections are not disturbed. */
static void test_revocation(void **state)
{
	static const char before[] =
		TOK_GONE " rw rev/\n"
		TOK_NARROW " rw rev/ revx/\n"
		TOK_MOVED " rw rev/\n"
		TOK_STAY " rw rev/\n";
	static const char after[] =
		TOK_NARROW " ro rev/\n"
		TOK_MOVED " rw other/\n"
		TOK_STAY " rw rev/\n";
	char path[300], msg[512];
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--threads", "2", "--tokens-file", path, NULL };
	struct kvpool_options o_gone = { .token = TOK_GONE, .timeout_ms = 10000 };
	struct kvpool_options o_narrow = { .token = TOK_NARROW, .timeout_ms = 10000 };
	struct kvpool_options o_stay = { .token = TOK_STAY, .timeout_ms = 10000 };
	struct harness_server srv = { 0 };
	struct kvpool_client *gone, *narrow, *stay, *probe = NULL;
	uint8_t key[32], key2[32], data[4096], got[4096];
	uint64_t len = 0;
	int fd_gone, fd_moved, rc = 0, st = 0;
	size_t matched = 0;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens-rev", g.dir);
	assert_int_equal(write_file(path, before, 0600), 0);
	assert_int_equal(harness_start(&srv, flags), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/a", &o_gone, &gone), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/a", &o_narrow, &narrow), 0);
	assert_int_equal(kvpool_connect(srv.url, "rev/a", &o_stay, &stay), 0);
	fd_gone = raw_session(srv.port, "rev/a", TOK_GONE);
	fd_moved = raw_session(srv.port, "rev/a", TOK_MOVED);
	harness_key(key, "rev", 1);
	harness_key(key2, "rev", 2);
	harness_fill(data, sizeof(data), 3);
	assert_int_equal(kvpool_put_bytes(gone, key, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_put_bytes(narrow, key2, NULL, data, sizeof(data)), 0);
	assert_int_equal(kvpool_match(gone, (const uint8_t(*)[32])key, 1, 60000, &matched), 0);
	assert_int_equal(matched, 1);
	assert_int_equal(harness_stat_or_fail(stay, "leases_active"), 1);

	assert_int_equal(write_file(path, after, 0600), 0);
	assert_int_equal(kill(srv.pid, SIGHUP), 0);
	/* reloaded once a new session with the removed token is refused */
	for (int i = 0; i < 250; i++) {
		rc = kvpool_connect(srv.url, "rev/a", &o_gone, &probe);
		kvpool_close(probe);
		probe = NULL;
		if (rc == -EACCES)
			break;
		harness_sleep_ms(20);
	}
	assert_int_equal(rc, -EACCES);

	/* removed: the next request is refused, and every one after it */
	check_revoked(fd_gone, key, "the token was revoked");
	check_revoked(fd_moved, key, "no longer grants this namespace");
	assert_int_equal(kvpool_put_bytes(gone, key2, key, data, sizeof(data)), -EACCES);
	assert_int_equal(kvpool_get_bytes(gone, key, got, sizeof(got), &len), -EACCES);
	if (!strstr(kvpool_last_server_message(), "the token was revoked"))
		fail_msg("revoked GET refused with \"%s\"", kvpool_last_server_message());
	/* its lease ended with the revocation */
	assert_int_equal(harness_stat_or_fail(stay, "leases_active"), 0);
	/* narrowed to read-only: reads work, writes are refused as such */
	assert_int_equal(kvpool_get_bytes(narrow, key, got, sizeof(got), &len), 0);
	assert_memory_equal(got, data, sizeof(data));
	assert_int_equal(kvpool_put_bytes(narrow, key2, key, data, sizeof(data)), -EACCES);
	if (!strstr(kvpool_last_server_message(), "read-only"))
		fail_msg("narrowed PUT refused with \"%s\"", kvpool_last_server_message());
	assert_int_equal(kvpool_delete(narrow, key, 1, &st), -EACCES);
	assert_int_equal(kvpool_drop_namespace(narrow, NULL, NULL), -EACCES);
	/* DROP of a namespace the token no longer grants at all */
	assert_int_equal(kvpool_drop_namespace(narrow, "revx/b", NULL), -EACCES);
	snprintf(msg, sizeof(msg), "%s", kvpool_last_server_message());
	if (!strstr(msg, "does not grant") || strstr(msg, "read-only"))
		fail_msg("drop of an ungranted namespace refused with \"%s\"", msg);
	/* the token that stayed is not disturbed */
	harness_check_block_or_fail(stay, key, data, sizeof(data));
	assert_int_equal(kvpool_delete(stay, key, 1, &st), 0);
	kvpool_close(gone);
	kvpool_close(narrow);
	kvpool_close(stay);
	assert_int_equal(harness_stop(&srv), 0);
	unlink(path);
}

/* Run the CLI with KVPOOL_TOKEN set to token (NULL: unset); returns its
 * exit status. */
static int cli_with_token(const char *token, char *const argv[])
{
	char *out = NULL;
	int status = -1;

	if (token)
		setenv("KVPOOL_TOKEN", token, 1);
	else
		unsetenv("KVPOOL_TOKEN");
	assert_int_equal(harness_run(argv, 20000, &out, &status), 0);
	free(out);
	unsetenv("KVPOOL_TOKEN");
	return status;
}

/* The kvpool CLI takes its token from KVPOOL_TOKEN. */
static void test_cli_token(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	char data[300], got[300];

	(void)state;
	harness_need_server(&g.srv);
	if (!cli || access(cli, X_OK) != 0)
		harness_skip("KVPOOL_CLI is not set to the kvpool binary");
	snprintf(data, sizeof(data), "%s/cli-data", g.dir);
	snprintf(got, sizeof(got), "%s/cli-got", g.dir);
	assert_int_equal(write_file(data, "cli block bytes", 0600), 0);
	{
		char *put[] = { (char *)cli, "put", "text:cli-auth", data, "--server", g.srv.url,
				"--namespace", "team-a/cli", NULL };
		char *get[] = { (char *)cli, "get", "text:cli-auth", "-o", got, "--server",
				g.srv.url, "--namespace", "team-a/cli", NULL };

		assert_int_not_equal(cli_with_token(NULL, put), 0);
		assert_int_not_equal(cli_with_token(TOK_RO, put), 0);
		assert_int_equal(cli_with_token(TOK_RW, put), 0);
		assert_int_equal(cli_with_token(TOK_RO, get), 0);
		assert_int_not_equal(cli_with_token("wrong-token-0123456789", get), 0);
	}
	{
		FILE *f = fopen(got, "r");
		char buf[64] = "";

		assert_non_null(f);
		assert_non_null(fgets(buf, sizeof(buf), f));
		fclose(f);
		assert_string_equal(buf, "cli block bytes");
	}
}

/* Run `kvpool ARGS` through sh with stderr in the output, KVPOOL_TOKEN set
 * to token (NULL: unset); returns the exit status, *out the text. */
static int cli_sh(const char *token, const char *args, char **out)
{
	const char *cli = getenv("KVPOOL_CLI");
	char cmd[1024];
	char *argv[] = { "/bin/sh", "-c", cmd, NULL };
	int status = -1;

	snprintf(cmd, sizeof(cmd), "'%s' %s 2>&1", cli, args);
	if (token)
		setenv("KVPOOL_TOKEN", token, 1);
	else
		unsetenv("KVPOOL_TOKEN");
	assert_int_equal(harness_run(argv, 20000, out, &status), 0);
	unsetenv("KVPOOL_TOKEN");
	return status;
}

/* Issue 20 item 10: a refusal exits 1 at connect as on a PUT, with the
 * server's own reason; ping needs no token; KVPOOL_URL names the server;
 * kvpool --version says kvpoold's version. */
static void test_cli_refusals_and_conveniences(void **state)
{
	const char *cli = getenv("KVPOOL_CLI"), *kvpoold = getenv("KVPOOLD");
	char args[600], data[300], *out = NULL;

	(void)state;
	harness_need_server(&g.srv);
	if (!cli || access(cli, X_OK) != 0)
		harness_skip("KVPOOL_CLI is not set to the kvpool binary");
	snprintf(data, sizeof(data), "%s/cli-data2", g.dir);
	assert_int_equal(write_file(data, "x", 0600), 0);
	snprintf(args, sizeof(args), "put text:r1 '%s' --server %s --namespace team-a/cli2", data,
		 g.srv.url);
	assert_int_equal(cli_sh(NULL, args, &out), 1);
	if (!strstr(out, "this server requires a token"))
		fail_msg("no server reason: %s", out);
	free(out);
	assert_int_equal(cli_sh(TOK_RO, args, &out), 1);
	if (!strstr(out, "read-only in namespace team-a/cli2"))
		fail_msg("no server reason: %s", out);
	free(out);
	snprintf(args, sizeof(args), "put text:r1 '%s' --server %s --namespace team-b/x", data,
		 g.srv.url);
	assert_int_equal(cli_sh(TOK_RW, args, &out), 1);
	if (!strstr(out, "does not grant namespace team-b/x"))
		fail_msg("no server reason: %s", out);
	free(out);
	/* ping: no token needed */
	snprintf(args, sizeof(args), "ping --server %s", g.srv.url);
	assert_int_equal(cli_sh(NULL, args, &out), 0);
	assert_non_null(strstr(out, "pong from"));
	free(out);
	/* KVPOOL_URL instead of --server */
	setenv("KVPOOL_URL", g.srv.url, 1);
	assert_int_equal(cli_sh(TOK_RW, "ping --namespace team-a/m", &out), 0);
	unsetenv("KVPOOL_URL");
	assert_non_null(strstr(out, "pong from"));
	free(out);
	/* versions agree */
	{
		char *vd = NULL, *argv[] = { (char *)kvpoold, "--version", NULL };
		char want[64];
		int status = -1;

		assert_int_equal(harness_run(argv, 10000, &vd, &status), 0);
		assert_int_equal(status, 0);
		assert_int_equal(sscanf(vd, "kvpoold %63s", want), 1);
		free(vd);
		assert_int_equal(cli_sh(NULL, "--version", &out), 0);
		if (strncmp(out, "kvpool ", 7) || strncmp(out + 7, want, strlen(want)))
			fail_msg("kvpool --version: %s; kvpoold's is %s", out, want);
		free(out);
	}
}

/* Run kvpoold with a tokens file of `text` and `mode`; it must refuse to
 * start, as a bad setting (exit 2), with `want` in its error output. */
static void check_start_refused(const char *text, mode_t mode, const char *want)
{
	char path[300], *err = NULL;
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1",
				"--tokens-file", path, NULL };
	int status = 0;

	snprintf(path, sizeof(path), "%s/bad-tokens", g.dir);
	if (text)
		assert_int_equal(write_file(path, text, mode), 0);
	else
		unlink(path);
	assert_int_equal(harness_start_fail(flags, 10000, &status, &err), 0);
	assert_non_null(err);
	if (status != 2)
		fail_msg("kvpoold exited %d, want 2: %s", status, err);
	if (!strstr(err, want))
		fail_msg("kvpoold said \"%s\", expected \"%s\"", err, want);
	free(err);
}

/* Start kvpoold with flags expecting it to refuse; its stderr must hold
 * want. */
static void check_refused_saying(const char *const *flags, const char *want)
{
	char *err = NULL;
	int status = 0;

	assert_int_equal(harness_start_fail(flags, 10000, &status, &err), 0);
	assert_non_null(err);
	assert_int_not_equal(status, 0);
	if (!strstr(err, want))
		fail_msg("kvpoold said \"%s\", expected \"%s\"", err, want);
	free(err);
}

/* Issue 20 item 10: start-up errors say where the bad setting came from,
 * --config on a directory says so, and a taken admin port is named. */
static void test_startup_errors_name_source(void **state)
{
	long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
	uint64_t phys = (uint64_t)pages * (uint64_t)page_bytes;
	char size[32], port[16];
	const char *bad_listen[] = { "--listen", "999.1.1.1", "--dram-capacity", "16MiB",
				 "--max-block-bytes", "1MiB", NULL };
	const char *dir[] = { "--config", g.dir, NULL };
	const char *dram[] = { "--dram-capacity", size, NULL };
	const char *admin[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "1MiB",
				"--admin-port", port, NULL };
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd;

	(void)state;
	harness_need_server(&g.srv);
	check_refused_saying(bad_listen, "(listen from --listen)");
	check_refused_saying(dir, "is a directory");
	if (phys + (1ull << 30) <= (4ull << 40)) {
		snprintf(size, sizeof(size), "%llu", (unsigned long long)(phys + (1ull << 30)));
		check_refused_saying(dram, "(dram_capacity from --dram-capacity)");
		/* all of memory leaves no room for the index and the process
		 * (item 8); a cgroup limit below it says "exceeds" first */
		snprintf(size, sizeof(size), "%llu", (unsigned long long)phys);
		{
			char *err = NULL;
			int status = 0;

			assert_int_equal(harness_start_fail(dram, 10000, &status, &err), 0);
			assert_int_equal(status, 2);
			if (!strstr(err, "leaves less than") && !strstr(err, "exceeds the memory limit"))
				fail_msg("kvpoold took all of memory: %s", err);
			free(err);
		}
	}
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	snprintf(port, sizeof(port), "%u", ntohs(sa.sin_port));
	{
		char want[96];

		snprintf(want, sizeof(want), "admin_port %s (the admin HTTP port)", port);
		check_refused_saying(admin, want);
	}
	close(fd);
}

static void test_start_refusals(void **state)
{
	(void)state;
	harness_need_server(&g.srv);
	check_start_refused(TOK_RW " rw a/\n", 0644, "mode 0644");
	check_start_refused(TOK_RW " rw a/\n", 0660, "chmod 600");
	check_start_refused(TOK_RW " rw a/\n", 0602, "group and others");
	check_start_refused("# ok\n" "short rw a/\n", 0600, "bad-tokens:2: token of 5 bytes");
	check_start_refused(TOK_RW " rx a/\n", 0600, "ro or rw");
	check_start_refused(TOK_RW " rw\n", 0600, "without a namespace grant");
	check_start_refused(TOK_RW " rw a/ # b/\n" TOK_ALL " rw x*y\n", 0600, "bad-tokens:2: grant \"x*y\"");
	check_start_refused(TOK_RW " rw a/\n" TOK_RW " ro b/\n", 0600, "bad-tokens:2: token given twice");
	check_start_refused("[quota]\nns = lots\n", 0600, "bad quota size");
	check_start_refused("[quotas]\n", 0600, "unknown section");
	check_start_refused(NULL, 0, "bad-tokens: does not exist");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_needs_token),
		cmocka_unit_test(test_unknown_token),
		cmocka_unit_test(test_namespace_denied),
		cmocka_unit_test(test_rw_and_ro),
		cmocka_unit_test(test_quota),
		cmocka_unit_test(test_quota_prefix),
		cmocka_unit_test(test_tenant_namespace_limit),
		cmocka_unit_test(test_tenant_bytes_and_leases),
		cmocka_unit_test(test_revocation),
		cmocka_unit_test(test_revocation_waiting_match),
		cmocka_unit_test(test_tenant_billing),
		cmocka_unit_test(test_tenant_billing_restart),
		cmocka_unit_test(test_cli_token),
		cmocka_unit_test(test_cli_refusals_and_conveniences),
		cmocka_unit_test(test_start_refusals),
		cmocka_unit_test(test_startup_errors_name_source),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
