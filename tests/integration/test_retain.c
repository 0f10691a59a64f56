/*
 * test_retain.c - retention through a real kvpoold (protocol v2): a chain
 * put with retain_ms survives a flood of 20x DRAM of unretained chains
 * (the same chain without it does not); after retain_ms it is evictable
 * again; a retention past max_retained_bytes keeps the leading blocks
 * within the budget and reports the rest; a second tenant's retained
 * blocks survive a first tenant's flood and its own retentions; MATCH
 * with retain_ms refreshes; a lease and a retention together; DELETE and
 * drop of retained blocks; a PUT of a stored key extends; a warm restart
 * keeps deadlines; a cluster handle retains on every owner; bad input
 * (retain_ms of 2^32 - 1, a tokens-file budget that does not parse); the
 * requesting token pays for a retention (a read-only reader, a shared
 * namespace) and a budget lowered by SIGHUP binds open connections; the
 * pool-wide max_retained_total_bytes without a tokens file.
 * STATS is checked beside every behaviour.
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
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <json-c/json.h>
#include <openssl/evp.h>

#include "harness.h"

#define KIB 1024u
#define BLOCK (64 * KIB)
#define DRAM_MIB 16u
#define FLOOD_BATCH 32

#define TOK_A "retain-tenant-a-token-0123456789"
#define TOK_B "retain-tenant-b-token-0123456789"

static struct {
	struct harness_server srv;   /* DRAM only, no tokens */
	uint8_t *buf;                /* FLOOD_BATCH blocks */
	char dir[256];               /* scratch: tokens files, NVMe */
	uint64_t flood_id;
} g;

static const char *const plain_flags[] = {
	"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
	"--max-retain-ms", "60000", "--max-retained-bytes", "2MiB", "--log-level", "warn", NULL,
};

static int group_setup(void **state)
{
	(void)state;
	g.buf = malloc((size_t)FLOOD_BATCH * BLOCK);
	if (!g.buf || harness_tmpdir("retain", g.dir, sizeof(g.dir)))
		return -1;
	return harness_group_start(&g.srv, plain_flags);
}

static int group_teardown(void **state)
{
	(void)state;
	harness_kill(&g.srv);
	harness_rm_rf(g.dir);
	free(g.buf);
	return 0;
}

static struct kvpool_client *client_tok(const struct harness_server *s, const char *ns,
					const char *token)
{
	struct kvpool_options o = { .token = token, .timeout_ms = 10000 };
	struct kvpool_client *c = NULL;
	int rc;

	harness_need_server(s);
	rc = kvpool_connect(s->url, ns, &o, &c);
	if (rc)
		fail_msg("connect %s: %s", s->url, kvpool_strerror(rc));
	return c;
}

/* Put the chain tag/first.. (n blocks, each the child of the one
 * before) with retain_ms; flags[i] (may be NULL) receives block i's
 * retention bits. Every put must succeed. */
static void put_chain(struct kvpool_client *c, const char *tag, uint64_t first, uint32_t n,
		      uint32_t retain_ms, uint32_t *flags)
{
	struct kvpool_put_block *b = calloc(n, sizeof(*b));
	uint8_t (*keys)[32] = calloc(n, 32);
	struct iovec *iov = calloc(n, sizeof(*iov));
	uint8_t *data = malloc((size_t)n * BLOCK);
	int *st = calloc(n, sizeof(*st));
	int rc;

	assert_non_null(b);
	assert_non_null(keys);
	assert_non_null(iov);
	assert_non_null(data);
	assert_non_null(st);
	for (uint32_t i = 0; i < n; i++) {
		harness_key(keys[i], tag, first + i);
		harness_fill(data + (size_t)i * BLOCK, BLOCK, harness_key_seed(keys[i]));
		iov[i] = (struct iovec){ data + (size_t)i * BLOCK, BLOCK };
		b[i] = (struct kvpool_put_block){ .key = keys[i], .parent = i ? keys[i - 1] : NULL,
						  .iov = &iov[i], .iovcnt = 1,
						  .retain_ms = retain_ms };
	}
	rc = kvpool_put_ex(c, b, n, st, flags);
	if (rc)
		fail_msg("put of %s/%llu..: %s", tag, (unsigned long long)first, kvpool_strerror(rc));
	free(b);
	free(keys);
	free(iov);
	free(data);
	free(st);
}

/* Leading blocks of chain tag/first.. (n long) that the pool holds,
 * with opts (may be NULL); *res (may be NULL) gets the whole answer. */
static size_t match_chain(struct kvpool_client *c, const char *tag, uint64_t first, uint32_t n,
			  const struct kvpool_match_opts *o, struct kvpool_match_result *res)
{
	uint8_t (*keys)[32] = calloc(n, 32);
	struct kvpool_match_result r;
	int rc;

	assert_non_null(keys);
	for (uint32_t i = 0; i < n; i++)
		harness_key(keys[i], tag, first + i);
	rc = kvpool_match_ex(c, keys, n, o, &r);
	if (rc)
		fail_msg("match: %s", kvpool_strerror(rc));
	free(keys);
	if (res)
		*res = r;
	return r.matched;
}

/* Unretained chains of FLOOD_BATCH blocks in c's namespace until `bytes`
 * were put. A put the pool refuses as FULL counts in the return value; a
 * BUSY one (an NVMe tier still demoting) is skipped; any other error
 * fails the test. */
static uint64_t flood(struct kvpool_client *c, uint64_t bytes)
{
	struct kvpool_put_block b[FLOOD_BATCH];
	struct iovec iov[FLOOD_BATCH];
	uint8_t keys[FLOOD_BATCH][32];
	int st[FLOOD_BATCH];
	uint64_t full = 0;

	for (uint64_t done = 0; done < bytes; done += (uint64_t)FLOOD_BATCH * BLOCK) {
		for (int i = 0; i < FLOOD_BATCH; i++) {
			harness_key(keys[i], "flood", g.flood_id++);
			harness_fill(g.buf + (size_t)i * BLOCK, 64, g.flood_id);
			iov[i] = (struct iovec){ g.buf + (size_t)i * BLOCK, BLOCK };
			b[i] = (struct kvpool_put_block){ .key = keys[i],
							  .parent = i ? keys[i - 1] : NULL,
							  .iov = &iov[i], .iovcnt = 1 };
		}
		(void)kvpool_put(c, b, FLOOD_BATCH, st);
		for (int i = 0; i < FLOOD_BATCH; i++) {
			if (st[i] == -ENOSPC)
				full++;
			else if (st[i] == -EAGAIN)
				harness_sleep_ms(1); /* an NVMe tier's demoter makes room */
			else if (st[i] && st[i] != -ENOLINK)
				fail_msg("flood put: %s", kvpool_strerror(st[i]));
		}
	}
	return full;
}

static uint64_t ns_stat(struct kvpool_client *c, const char *ns, const char *field)
{
	return harness_ns_stat_or_fail(c, ns, field);
}

/* ---- survival, expiry ---------------------------------------------------- */

/* A chain put with retain_ms survives 20x DRAM of unretained chains; the
 * same chain put without it does not. */
static void test_survives_flood(void **state)
{
	struct kvpool_client *c, *f;
	uint32_t flags[16];

	(void)state;
	c = client_tok(&g.srv, "ret-survive", NULL);
	f = client_tok(&g.srv, "ret-survive-flood", NULL);
	put_chain(c, "kept", 0, 16, 60000, flags);
	for (int i = 0; i < 16; i++)
		assert_int_equal(flags[i], KVPOOL_PUT_RETAINED);
	put_chain(c, "plain", 0, 16, 0, flags);
	assert_int_equal(flags[0], 0);
	assert_int_equal(ns_stat(c, "ret-survive", "retained_blocks"), 16);
	assert_int_equal(ns_stat(c, "ret-survive", "retained_bytes"), 16 * BLOCK);
	assert_int_equal(flood(f, 20ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(c, "kept", 0, 16, NULL, NULL), 16);
	assert_int_equal(match_chain(c, "plain", 0, 16, NULL, NULL), 0);
	assert_true(harness_stat_or_fail(c, "evictions") > 0);
	assert_int_equal(harness_stat_or_fail(c, "retention.retained_blocks"), 16);
	kvpool_drop_namespace(c, "ret-survive", NULL);
	kvpool_close(c);
	kvpool_close(f);
}

/* After retain_ms the chain is ordinary again: a flood takes it, and
 * STATS counts the expiries. The retention is short; a flood that took
 * nearly as long (valgrind) does not check the survival (test_survives
 * does), only the expiry. */
#define EXPIRE_MS 1000
static void test_expires(void **state)
{
	struct kvpool_client *c;
	uint64_t before, t0, t;

	(void)state;
	c = client_tok(&g.srv, "ret-expire", NULL);
	before = harness_stat_or_fail(c, "retention.expired");
	t0 = harness_now_ms();
	put_chain(c, "short", 0, 8, EXPIRE_MS, NULL);
	assert_int_equal(flood(c, 2ull * DRAM_MIB << 20), 0);
	t = harness_now_ms();
	if (t - t0 < EXPIRE_MS - 200)
		assert_int_equal(match_chain(c, "short", 0, 8, NULL, NULL), 8);
	else
		print_message("expires: the flood took %llu ms of the %d ms retention: "
			      "survival not checked\n", (unsigned long long)(t - t0), EXPIRE_MS);
	t = harness_now_ms();
	if (t - t0 < EXPIRE_MS + 100)
		harness_sleep_ms((uint32_t)(EXPIRE_MS + 100 - (t - t0)));
	assert_int_equal(harness_wait_stat_or_fail(c, "retention.expired", before + 8, 2000),
			 before + 8);
	assert_int_equal(ns_stat(c, "ret-expire", "retain_expired"), 8);
	assert_int_equal(ns_stat(c, "ret-expire", "retained_blocks"), 0);
	assert_int_equal(flood(c, 2ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(c, "short", 0, 8, NULL, NULL), 0);
	kvpool_drop_namespace(c, "ret-expire", NULL);
	kvpool_close(c);
}

/* ---- budget, clamp ---------------------------------------------------------- */

/* Past max_retained_bytes (2 MiB = 32 blocks): the leading 32 blocks are
 * retained, the other 8 stored without it and reported. */
static void test_budget(void **state)
{
	struct kvpool_client *c;
	uint32_t flags[40];

	(void)state;
	c = client_tok(&g.srv, "ret-budget", NULL);
	put_chain(c, "long", 0, 40, 60000, flags);
	for (int i = 0; i < 40; i++)
		assert_int_equal(flags[i], i < 32 ? KVPOOL_PUT_RETAINED : KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(ns_stat(c, "ret-budget", "retained_blocks"), 32);
	assert_int_equal(ns_stat(c, "ret-budget", "retain_refused"), 8);
	assert_int_equal(ns_stat(c, "ret-budget", "retain_budget_bytes"), 2u << 20);
	assert_int_equal(flood(c, 20ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(c, "long", 0, 40, NULL, NULL), 32);
	kvpool_drop_namespace(c, "ret-budget", NULL);
	kvpool_close(c);
}

/* retain_ms of 2^32 - 1 (what -1 becomes in the unsigned field) is cut to
 * max_retain_ms and the reply says so, for PUT and for MATCH. */
static void test_clamped(void **state)
{
	struct kvpool_match_opts o = { .retain_ms = UINT32_MAX };
	struct kvpool_match_result r;
	struct kvpool_client *c;
	uint32_t flags[2];

	(void)state;
	c = client_tok(&g.srv, "ret-clamp", NULL);
	put_chain(c, "huge", 0, 2, UINT32_MAX, flags);
	assert_int_equal(flags[0], KVPOOL_PUT_RETAINED | KVPOOL_PUT_RETAIN_CLAMPED);
	assert_int_equal(match_chain(c, "huge", 0, 2, &o, &r), 2);
	assert_int_equal(r.retained, 2);
	assert_int_equal(r.retain_ms, 60000);
	assert_int_equal(r.flags, KVPOOL_MATCH_RETAIN_CLAMPED);
	kvpool_drop_namespace(c, "ret-clamp", NULL);
	kvpool_close(c);
}

/* ---- refresh ---------------------------------------------------------------- */

/* MATCH with retain_ms extends the matched run; a PUT of a stored key
 * with retain_ms extends it too. */
static void test_match_refresh(void **state)
{
	struct kvpool_match_opts o = { .retain_ms = 5000 };
	struct kvpool_match_result r;
	struct kvpool_client *c;
	uint32_t flags[4];

	(void)state;
	c = client_tok(&g.srv, "ret-refresh", NULL);
	put_chain(c, "ref", 0, 8, 300, NULL);
	assert_int_equal(match_chain(c, "ref", 0, 10, &o, &r), 8);
	assert_int_equal(r.present, 8);
	assert_int_equal(r.retained, 8);
	assert_int_equal(r.retain_ms, 5000);
	assert_int_equal(r.flags, 0);
	/* a PUT of stored keys (EXISTS) with retain_ms: the same refresh */
	put_chain(c, "ref2", 0, 4, 300, NULL);
	put_chain(c, "ref2", 0, 4, 5000, flags);
	assert_int_equal(flags[3], KVPOOL_PUT_RETAINED);
	harness_sleep_ms(400); /* the puts' 300 ms are over, the refreshes' are not */
	assert_int_equal(flood(c, 10ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(c, "ref", 0, 8, NULL, NULL), 8);
	assert_int_equal(match_chain(c, "ref2", 0, 4, NULL, NULL), 4);
	kvpool_drop_namespace(c, "ret-refresh", NULL);
	kvpool_close(c);
}

/* A lease and a retention on one MATCH: both granted; the lease ends with
 * the connection, the retention keeps the blocks. */
static void test_lease_and_retention(void **state)
{
	struct kvpool_match_opts o = { .lease_ms = 3000, .retain_ms = 10000 };
	struct kvpool_match_result r;
	struct kvpool_client *c, *d;

	(void)state;
	c = client_tok(&g.srv, "ret-lease", NULL);
	d = client_tok(&g.srv, "ret-lease", NULL);
	put_chain(c, "both", 0, 6, 0, NULL);
	assert_int_equal(match_chain(c, "both", 0, 6, &o, &r), 6);
	assert_int_equal(r.lease_ms, 3000);
	assert_int_equal(r.retained, 6);
	assert_int_equal(harness_stat_or_fail(d, "leases_active"), 6);
	kvpool_close(c);
	assert_int_equal(harness_wait_stat_or_fail(d, "leases_active", 0, 5000), 0);
	assert_int_equal(flood(d, 10ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(d, "both", 0, 6, NULL, NULL), 6);
	kvpool_drop_namespace(d, "ret-lease", NULL);
	kvpool_close(d);
}

/* DELETE and DROP_NAMESPACE remove retained blocks as any other, and
 * give their budget back. */
static void test_delete_and_drop(void **state)
{
	struct kvpool_client *c;
	uint8_t key[32];
	int st;

	(void)state;
	c = client_tok(&g.srv, "ret-delete", NULL);
	put_chain(c, "del", 0, 6, 60000, NULL);
	harness_key(key, "del", 2);
	assert_int_equal(kvpool_delete(c, key, 1, &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(ns_stat(c, "ret-delete", "retained_blocks"), 2);
	assert_int_equal(match_chain(c, "del", 0, 6, NULL, NULL), 2);
	put_chain(c, "del2", 0, 30, 60000, NULL);
	assert_int_equal(kvpool_drop_namespace(c, "ret-delete", NULL), 0);
	assert_int_equal(ns_stat(c, "ret-delete", "retained_blocks"), 0);
	assert_int_equal(ns_stat(c, "ret-delete", "retained_bytes"), 0);
	/* the whole budget (32 blocks) is free again */
	{
		uint32_t flags[32];

		put_chain(c, "del3", 0, 32, 60000, flags);
		assert_int_equal(flags[31], KVPOOL_PUT_RETAINED);
	}
	kvpool_drop_namespace(c, "ret-delete", NULL);
	kvpool_close(c);
}

/* ---- tenants ---------------------------------------------------------------- */

/* A tenant's name in STATS: the first 12 hex digits of its token's
 * SHA-256 (docs/security.md). */
static void tenant_id(const char *token, char id[13])
{
	uint8_t d[EVP_MAX_MD_SIZE];
	unsigned int n = 0;

	assert_true(EVP_Digest(token, strlen(token), d, &n, EVP_sha256(), NULL));
	for (int i = 0; i < 6; i++)
		snprintf(id + 2 * i, 3, "%02x", d[i]);
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f) == 0 && chmod(path, 0600) == 0 ? 0 : -1;
}

/* With a tokens file: tenant A (its own budget of 512 KiB, 8 blocks) and
 * tenant B (the setting's 2 MiB). B's retained blocks survive A's flood
 * and A's retentions; A's stay within its budget and survive too. */
static void test_tenants(void **state)
{
	static const char text[] =
		"[tokens]\n"
		TOK_A " rw max_retained_bytes=512KiB ta/\n"
		TOK_B " rw tb/\n";
	struct harness_server srv = { 0 };
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
		"--max-retain-ms", "60000", "--max-retained-bytes", "2MiB", "--log-level", "warn",
		"--tokens-file", NULL, NULL,
	};
	char path[300];
	struct kvpool_client *a, *a2, *b;
	struct json_object *doc;
	uint32_t fa[12], fb[16];
	char id[13], key[64];

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens", g.dir);
	assert_int_equal(write_file(path, text), 0);
	flags[13] = path;
	assert_int_equal(harness_start(&srv, flags), 0);
	a = client_tok(&srv, "ta/one", TOK_A);
	a2 = client_tok(&srv, "ta/two", TOK_A);
	b = client_tok(&srv, "tb/x", TOK_B);
	put_chain(b, "b", 0, 16, 60000, fb);
	assert_int_equal(fb[15], KVPOOL_PUT_RETAINED);
	/* A's budget spans its namespaces: 6 + 2 fit, then refused */
	put_chain(a, "a", 0, 6, 60000, fa);
	put_chain(a2, "a", 100, 6, 60000, fa);
	assert_int_equal(fa[1], KVPOOL_PUT_RETAINED);
	assert_int_equal(fa[2], KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(flood(a, 20ull * DRAM_MIB << 20), 0);
	assert_int_equal(match_chain(b, "b", 0, 16, NULL, NULL), 16);
	assert_int_equal(match_chain(a, "a", 0, 6, NULL, NULL), 6);
	assert_int_equal(match_chain(a2, "a", 100, 6, NULL, NULL), 2);
	/* STATS: one row per tenant, named by the head of its token's digest;
	 * a token sees its own row only */
	assert_int_equal(harness_stats(a, NULL, &doc), 0);
	tenant_id(TOK_A, id);
	snprintf(key, sizeof(key), "tenants.%s.retained_blocks", id);
	assert_int_equal(harness_json_u64_or_fail(doc, key), 8);
	snprintf(key, sizeof(key), "tenants.%s.retain_budget_bytes", id);
	assert_int_equal(harness_json_u64_or_fail(doc, key), 512 * KIB);
	snprintf(key, sizeof(key), "tenants.%s.retain_refused", id);
	assert_int_equal(harness_json_u64_or_fail(doc, key), 4);
	assert_int_equal(json_object_object_length(json_object_object_get(doc, "tenants")), 1);
	json_object_put(doc);
	assert_int_equal(harness_stats(b, NULL, &doc), 0);
	tenant_id(TOK_B, id);
	snprintf(key, sizeof(key), "tenants.%s.retained_blocks", id);
	assert_int_equal(harness_json_u64_or_fail(doc, key), 16);
	snprintf(key, sizeof(key), "tenants.%s.retain_budget_bytes", id);
	assert_int_equal(harness_json_u64_or_fail(doc, key), 2u << 20);
	assert_int_equal(json_object_object_length(json_object_object_get(doc, "tenants")), 1);
	json_object_put(doc);
	assert_int_equal(harness_stats(a, NULL, &doc), 0);
	assert_int_equal(harness_json_u64_or_fail(doc, "namespaces.ta/two.retain_budget_bytes"),
			 512 * KIB);
	json_object_put(doc);
	kvpool_close(a);
	kvpool_close(a2);
	kvpool_close(b);
	assert_int_equal(harness_stop(&srv), 0);
}

#define TOK_R "retain-reader-r-token-0123456789"
#define TOK_ADM "retain-operator-token-0123456789"

/* How many rows "tenants" of c's STATS has. */
static int tenant_rows(struct kvpool_client *c)
{
	struct json_object *doc;
	int n;

	assert_int_equal(harness_stats(c, NULL, &doc), 0);
	n = json_object_object_length(json_object_object_get(doc, "tenants"));
	json_object_put(doc);
	return n;
}

/* tenants.<id of token>.<field> of a STATS document */
static uint64_t tenant_stat(struct kvpool_client *c, const char *token, const char *field)
{
	struct json_object *doc;
	char id[13], key[96];
	uint64_t v;

	assert_int_equal(harness_stats(c, NULL, &doc), 0);
	tenant_id(token, id);
	snprintf(key, sizeof(key), "tenants.%s.%s", id, field);
	v = harness_json_u64_or_fail(doc, key);
	json_object_put(doc);
	return v;
}

/* A retention is charged to the token whose request asks for it: a
 * read-only token MATCH-retaining a writer's blocks spends its own
 * budget, and the writer keeps its whole budget; a writer at its budget
 * cannot retain in a shared namespace another tenant created. A budget
 * lowered by SIGHUP binds the tenant's connection that is already open. */
static void test_requester_pays(void **state)
{
	static const char text[] =
		"[tokens]\n"
		TOK_A " rw max_retained_bytes=512KiB ta/ shared/\n"
		TOK_B " rw max_retained_bytes=512KiB tb/ shared/\n"
		TOK_R " ro max_retained_bytes=256KiB ta/\n"
		TOK_ADM " ro *\n";
	static const char lowered[] =
		"[tokens]\n"
		TOK_A " rw max_retained_bytes=512KiB ta/ shared/\n"
		TOK_B " rw max_retained_bytes=64KiB tb/ shared/\n"
		TOK_R " ro max_retained_bytes=256KiB ta/\n"
		TOK_ADM " ro *\n";
	struct harness_server srv = { 0 };
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
		"--max-retain-ms", "60000", "--log-level", "warn", "--tokens-file", NULL, NULL,
	};
	struct kvpool_match_opts o = { .retain_ms = 60000 };
	struct kvpool_match_result r;
	struct kvpool_client *a, *ash, *b, *bsh, *rd, *adm;
	uint32_t f[8];
	char path[300];
	int i;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/tokens-pays", g.dir);
	assert_int_equal(write_file(path, text), 0);
	flags[11] = path;
	assert_int_equal(harness_start(&srv, flags), 0);
	a = client_tok(&srv, "ta/1", TOK_A);
	rd = client_tok(&srv, "ta/1", TOK_R);
	put_chain(a, "w", 0, 8, 0, NULL);
	/* the reader retains the writer's chain: 4 blocks fit its 256 KiB */
	assert_int_equal(match_chain(rd, "w", 0, 8, &o, &r), 8);
	assert_int_equal(r.retained, 4);
	assert_int_equal(r.retain_ms, 60000);
	assert_int_equal(r.flags, KVPOOL_MATCH_RETAIN_BUDGET);
	assert_int_equal(tenant_stat(rd, TOK_R, "retained_bytes"), 256 * KIB);
	assert_int_equal(tenant_stat(a, TOK_A, "retained_bytes"), 0);
	/* the writer's own chain: its whole budget (8 blocks) is there */
	put_chain(a, "own", 0, 8, 60000, f);
	for (i = 0; i < 8; i++)
		assert_int_equal(f[i], KVPOOL_PUT_RETAINED);
	assert_int_equal(tenant_stat(a, TOK_A, "retained_bytes"), 512 * KIB);
	assert_int_equal(tenant_stat(a, TOK_A, "retain_refused"), 0);
	/* B creates shared/y; A, at its budget, retains nothing there, on
	 * B's budget or anyone's */
	bsh = client_tok(&srv, "shared/y", TOK_B);
	ash = client_tok(&srv, "shared/y", TOK_A);
	put_chain(bsh, "sh", 0, 4, 0, NULL);
	put_chain(ash, "sh", 0, 4, 60000, f); /* EXISTS: a refresh */
	assert_int_equal(f[0], KVPOOL_PUT_RETAIN_BUDGET);
	put_chain(ash, "sh", 10, 2, 60000, f);
	assert_int_equal(f[0], KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(f[1], KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(tenant_stat(bsh, TOK_B, "retained_bytes"), 0);
	assert_int_equal(ns_stat(bsh, "shared/y", "retained_blocks"), 0);
	/* B's budget lowered to one block: its open connection is bound */
	b = client_tok(&srv, "tb/1", TOK_B);
	assert_int_equal(write_file(path, lowered), 0);
	assert_int_equal(kill(srv.pid, SIGHUP), 0);
	for (i = 0; i < 250 && tenant_stat(bsh, TOK_B, "retain_budget_bytes") != 64 * KIB; i++)
		harness_sleep_ms(20);
	assert_int_equal(tenant_stat(bsh, TOK_B, "retain_budget_bytes"), 64 * KIB);
	put_chain(b, "low", 0, 3, 60000, f);
	assert_int_equal(f[0], KVPOOL_PUT_RETAINED);
	assert_int_equal(f[1], KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(f[2], KVPOOL_PUT_RETAIN_BUDGET);
	assert_int_equal(tenant_stat(bsh, TOK_B, "retained_bytes"), 64 * KIB);
	/* a token sees its own tenant row; a "*" token every one */
	assert_int_equal(tenant_rows(rd), 1);
	assert_int_equal(tenant_rows(b), 1);
	adm = client_tok(&srv, "ta/1", TOK_ADM);
	assert_int_equal(tenant_rows(adm), 4);
	assert_int_equal(tenant_stat(adm, TOK_R, "retained_bytes"), 256 * KIB);
	kvpool_close(adm);
	kvpool_close(a);
	kvpool_close(ash);
	kvpool_close(b);
	kvpool_close(bsh);
	kvpool_close(rd);
	assert_int_equal(harness_stop(&srv), 0);
}

/* Without a tokens file, namespaces are free to create: the pool-wide
 * max_retained_total_bytes (default half of DRAM) keeps ordinary PUTs
 * from answering FULL however many namespaces retain. */
static void test_pool_wide_cap(void **state)
{
	struct harness_server srv = { 0 };
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
		"--max-retain-ms", "60000", "--log-level", "warn", NULL,
	};
	struct kvpool_client *c[6], *v;
	uint32_t f[64];
	char ns[32];
	uint64_t granted = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_int_equal(harness_start(&srv, flags), 0);
	for (int n = 0; n < 6; n++) {
		snprintf(ns, sizeof(ns), "cap-%d", n);
		c[n] = client_tok(&srv, ns, NULL);
		/* each namespace's budget is a quarter of DRAM: 64 blocks */
		put_chain(c[n], ns, 0, 40, 60000, f);
		for (int i = 0; i < 40; i++)
			granted += f[i] == KVPOOL_PUT_RETAINED;
	}
	assert_int_equal(granted, 128); /* 8 MiB: half of DRAM */
	assert_int_equal(harness_stat_or_fail(c[0], "retention.retained_bytes"), 8u << 20);
	v = client_tok(&srv, "victim", NULL);
	assert_int_equal(flood(v, 4ull * DRAM_MIB << 20), 0);
	for (int n = 0; n < 6; n++)
		kvpool_close(c[n]);
	kvpool_close(v);
	assert_int_equal(harness_stop(&srv), 0);
}

/* A tokens-file budget that does not parse stops kvpoold with file:line. */
static void test_bad_token_budget(void **state)
{
	const char *flags[] = { "--dram-capacity", "16MiB", "--max-block-bytes", "64KiB",
				"--threads", "1", "--tokens-file", NULL, NULL };
	char path[300], *err = NULL;
	int status = 0;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(path, sizeof(path), "%s/bad-tokens", g.dir);
	assert_int_equal(write_file(path, "# tokens\n" TOK_A " rw max_retained_bytes=lots ta/\n"), 0);
	flags[7] = path;
	assert_int_equal(harness_start_fail(flags, 10000, &status, &err), 0);
	assert_int_equal(status, 2);
	if (!strstr(err, "bad-tokens:2: bad max_retained_bytes \"lots\""))
		fail_msg("kvpoold said: %s", err);
	free(err);
}

/* ---- several nodes ----------------------------------------------------------- */

/* A cluster handle (a node list) retains on every owner: a chain of 8
 * segments spread over three nodes is retained block by block where each
 * block lives, and a MATCH with retain_ms through the handle refreshes
 * the whole run on all of them. */
static void test_cluster_retains_on_every_owner(void **state)
{
	enum { NODES = 3, BLOCKS = 256 };
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "1",
		"--max-retain-ms", "60000", "--max-retained-bytes", "16MiB", "--log-level", "warn",
		NULL,
	};
	struct harness_server srv[NODES] = { { 0 } };
	struct kvpool_match_opts o = { .retain_ms = 30000 };
	struct kvpool_match_result r;
	struct kvpool_client *cl, *d;
	char list[256];
	uint32_t *f = calloc(BLOCKS, sizeof(*f));
	uint64_t total = 0;
	int holding = 0;

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(f);
	for (int i = 0; i < NODES; i++)
		assert_int_equal(harness_start(&srv[i], flags), 0);
	snprintf(list, sizeof(list), "tcp://127.0.0.1:%u,127.0.0.1:%u,127.0.0.1:%u", srv[0].port,
		 srv[1].port, srv[2].port);
	assert_int_equal(kvpool_connect(list, "ret-cluster", NULL, &cl), 0);
	put_chain(cl, "cl", 0, BLOCKS, 60000, f);
	for (int i = 0; i < BLOCKS; i++)
		assert_int_equal(f[i], KVPOOL_PUT_RETAINED);
	for (int i = 0; i < NODES; i++) {
		uint64_t n;

		d = client_tok(&srv[i], "ret-cluster", NULL);
		n = ns_stat(d, "ret-cluster", "retained_blocks");
		assert_int_equal(n, ns_stat(d, "ret-cluster", "blocks"));
		holding += n > 0;
		total += n;
		kvpool_close(d);
	}
	assert_int_equal(total, BLOCKS);
	assert_true(holding >= 2);
	assert_int_equal(match_chain(cl, "cl", 0, BLOCKS, &o, &r), BLOCKS);
	assert_int_equal(r.retained, BLOCKS);
	assert_int_equal(r.retain_ms, 30000);
	kvpool_close(cl);
	for (int i = 0; i < NODES; i++)
		assert_int_equal(harness_stop(&srv[i]), 0);
	free(f);
}

/* The index of the node of srv[0..n) that holds block tag/id. */
static int holder_of(struct harness_server *srv, int n, const char *ns, const char *tag,
		     uint64_t id)
{
	uint8_t key[32];
	int found = -1;

	harness_key(key, tag, id);
	for (int i = 0; i < n; i++) {
		struct kvpool_client *d = client_tok(&srv[i], ns, NULL);
		size_t matched = 0;

		assert_int_equal(kvpool_match(d, (const uint8_t(*)[32])key, 1, 0, &matched), 0);
		if (matched)
			found = i;
		kvpool_close(d);
	}
	assert_true(found >= 0);
	return found;
}

/* A cluster MATCH whose leading block's node refuses the retention for
 * its budget answers retained 0 with retain_ms 0 and RETAIN_BUDGET, as
 * one node would (PROTOCOL.md 14.1), even where another node retained
 * its own later blocks. */
static void test_cluster_merged_reply(void **state)
{
	enum { NODES = 2, BLOCKS = 16 };
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "1",
		"--max-retain-ms", "60000", "--max-retained-bytes", "256KiB", "--log-level", "warn",
		NULL,
	};
	struct harness_server srv[NODES] = { { 0 } };
	struct kvpool_match_opts o = { .retain_ms = 30000 };
	struct kvpool_match_result r;
	struct kvpool_client *cl, *d;
	char list[128];
	int head;

	(void)state;
	harness_need_server(&g.srv);
	for (int i = 0; i < NODES; i++)
		assert_int_equal(harness_start(&srv[i], flags), 0);
	snprintf(list, sizeof(list), "tcp://127.0.0.1:%u,127.0.0.1:%u", srv[0].port,
		 srv[1].port);
	assert_int_equal(kvpool_connect(list, "ret-merge", NULL, &cl), 0);
	put_chain(cl, "mg", 0, BLOCKS, 0, NULL);
	/* the head's node spends its whole budget on other blocks */
	head = holder_of(srv, NODES, "ret-merge", "mg", 0);
	d = client_tok(&srv[head], "ret-merge", NULL);
	put_chain(d, "fill", 0, 4, 60000, NULL);
	assert_int_equal(ns_stat(d, "ret-merge", "retained_blocks"), 4);
	kvpool_close(d);
	assert_int_equal(match_chain(cl, "mg", 0, BLOCKS, &o, &r), BLOCKS);
	assert_int_equal(r.retained, 0);
	assert_int_equal(r.retain_ms, 0);
	assert_true(r.flags & KVPOOL_MATCH_RETAIN_BUDGET);
	kvpool_close(cl);
	for (int i = 0; i < NODES; i++)
		assert_int_equal(harness_stop(&srv[i]), 0);
}

/* ---- warm restart ---------------------------------------------------------- */

/* With an NVMe tier, retention deadlines survive a restart: the retained
 * chain is back, still retained (STATS), and survives a flood; a chain
 * whose retention ran out before the restart is back unretained. */
static void test_restart_keeps_deadlines(void **state)
{
	struct harness_server srv = { 0 };
	char nvme[300];
	const char *flags[] = {
		"--dram-capacity", "16MiB", "--max-block-bytes", "64KiB", "--threads", "2",
		"--max-retain-ms", "600000", "--max-retained-bytes", "4MiB", "--log-level", "warn",
		"--nvme-dir", NULL, "--nvme-capacity", "64MiB", "--nvme-segment-size", "4MiB", NULL,
	};
	struct kvpool_client *c;
	uint16_t port;

	(void)state;
	harness_need_server(&g.srv);
	snprintf(nvme, sizeof(nvme), "%s/nvme", g.dir);
	assert_int_equal(mkdir(nvme, 0700), 0);
	flags[13] = nvme;
	assert_int_equal(harness_start(&srv, flags), 0);
	c = client_tok(&srv, "ret-restart", NULL);
	put_chain(c, "kept", 0, 12, 600000, NULL);
	put_chain(c, "gone", 0, 4, 200, NULL);
	put_chain(c, "plain", 0, 4, 0, NULL);
	harness_sleep_ms(300);
	kvpool_close(c);
	port = srv.port;
	/* SIGTERM: nvme_drain_ms writes the DRAM-only blocks to NVMe */
	assert_int_equal(harness_stop(&srv), 0);
	assert_int_equal(harness_start_on_port(&srv, port, flags), 0);
	c = client_tok(&srv, "ret-restart", NULL);
	assert_int_equal(match_chain(c, "kept", 0, 12, NULL, NULL), 12);
	assert_int_equal(match_chain(c, "gone", 0, 4, NULL, NULL), 4);
	assert_int_equal(ns_stat(c, "ret-restart", "retained_blocks"), 12);
	assert_int_equal(flood(c, 3ull * 80 << 20), 0); /* 3x DRAM + NVMe */
	assert_int_equal(match_chain(c, "kept", 0, 12, NULL, NULL), 12);
	assert_int_equal(match_chain(c, "gone", 0, 4, NULL, NULL), 0);
	kvpool_close(c);
	assert_int_equal(harness_stop(&srv), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_survives_flood),
		cmocka_unit_test(test_expires),
		cmocka_unit_test(test_budget),
		cmocka_unit_test(test_clamped),
		cmocka_unit_test(test_match_refresh),
		cmocka_unit_test(test_lease_and_retention),
		cmocka_unit_test(test_delete_and_drop),
		cmocka_unit_test(test_tenants),
		cmocka_unit_test(test_bad_token_budget),
		cmocka_unit_test(test_requester_pays),
		cmocka_unit_test(test_pool_wide_cap),
		cmocka_unit_test(test_restart_keeps_deadlines),
		cmocka_unit_test(test_cluster_retains_on_every_owner),
		cmocka_unit_test(test_cluster_merged_reply),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
