/*
 * test_auth.c - the tokens-file parser and its grants (server/srv_auth.c),
 * from memory through srv_auth_parse: comments follow kvpool.conf's rules
 * (an inline comment never becomes a grant), grants are exact names,
 * prefixes that end in a separator, PREFIX* or *, and a prefix grant that
 * covers another token's grant is warned about.
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

#include "srv_auth.h"

#define TOK_A "tenant-a-token-0123456789"
#define TOK_B "tenant-b-token-0123456789"
#define TOK_C "tenant-c-token-0123456789"

static struct srv_auth *parse_ok(const char *text)
{
	struct srv_auth *a = NULL;
	char err[512] = "";
	int rc = srv_auth_parse("tokens", text, strlen(text), &a, err, sizeof(err));

	if (rc != 0)
		fail_msg("tokens file refused (%d): %s", rc, err);
	return a;
}

/* The refusal of text: rc and a message that holds want. */
static void parse_refused(const char *text, int want_rc, const char *want)
{
	struct srv_auth *a = NULL;
	char err[512] = "";

	assert_int_equal(srv_auth_parse("tokens", text, strlen(text), &a, err, sizeof(err)), want_rc);
	assert_null(a);
	if (!strstr(err, want))
		fail_msg("message \"%s\" lacks \"%s\"", err, want);
}

static enum srv_access access_of(struct srv_auth *a, const char *token, const char *ns)
{
	uint8_t d[SRV_AUTH_DIGEST_BYTES];

	srv_auth_digest(token, strlen(token), d);
	return srv_auth_access(a, d, ns, strlen(ns));
}

/* Issue 20 item 1: the words of an inline comment are no grants. */
static void test_inline_comment_is_no_grant(void **state)
{
	struct srv_auth *a;
	uint32_t tokens = 0;

	(void)state;
	a = parse_ok(TOK_A " rw tenantA # tenant B gets its own token * below\n"
		     TOK_B " ro tenantB\t; tenantA * too\n"
		     "  # an indented comment " TOK_C " rw *\n"
		     "; a semicolon comment " TOK_C " rw *\n");
	srv_auth_counts(a, &tokens, NULL);
	assert_int_equal(tokens, 2);
	assert_int_equal(access_of(a, TOK_A, "tenantA"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "tenantB"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_A, "tenant"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_A, "anything"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_B, "tenantB"), SRV_ACCESS_RO);
	assert_int_equal(access_of(a, TOK_B, "tenantA"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_C, "tenantA"), SRV_ACCESS_NONE);
	srv_auth_free(a);
}

/* '#' and ';' inside a word are bytes of it, as in kvpool.conf. */
static void test_hash_inside_word(void **state)
{
	struct srv_auth *a;

	(void)state;
	a = parse_ok("\xef\xbb\xbf" TOK_A " rw team#1/ x;y\r\n");
	assert_int_equal(access_of(a, TOK_A, "team#1/m"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "x;y"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "team"), SRV_ACCESS_NONE);
	srv_auth_free(a);
}

/* A comment leaves a line without grants: refused, with file:line. */
static void test_comment_only_grants_refused(void **state)
{
	(void)state;
	parse_refused("# header\n" TOK_A " rw #tenantA\n", -EINVAL, "tokens:2: token without");
	parse_refused(TOK_A " # rw tenantA\n", -EINVAL, "tokens:1: expected \"TOKEN ro|rw");
}

/* Quota lines take comments too. */
static void test_quota_comment(void **state)
{
	struct srv_auth *a;

	(void)state;
	a = parse_ok("[quota]  # sizes\nns = 1MiB # was 2MiB\npfx/* = 64KiB ;x\n");
	assert_int_equal(srv_auth_quota(a, "ns", 2), 1u << 20);
	srv_auth_free(a);
	/* "64KiB;x" is one word: not a size */
	parse_refused("[quota]\npfx/* = 64KiB;x\n", -EINVAL, "tokens:2: bad quota size");
}

/* Issue 29: a token's own retention budget, max_retained_bytes=SIZE
 * among its grants; a bad or repeated one is refused with file:line. */
static void test_retain_budget_override(void **state)
{
	uint8_t da[SRV_AUTH_DIGEST_BYTES], db[SRV_AUTH_DIGEST_BYTES], dc[SRV_AUTH_DIGEST_BYTES];
	struct srv_auth *a;
	uint64_t bytes = 77;

	(void)state;
	a = parse_ok("[tokens]\n" TOK_A " rw max_retained_bytes=2GiB team-a/  # budget\n"
		     TOK_B " rw team-b/ max_retained_bytes=0\n" TOK_C " ro team-c/\n");
	srv_auth_digest(TOK_A, strlen(TOK_A), da);
	srv_auth_digest(TOK_B, strlen(TOK_B), db);
	srv_auth_digest(TOK_C, strlen(TOK_C), dc);
	assert_int_equal(srv_auth_retain_budget(a, da, &bytes), 0);
	assert_int_equal(bytes, 2ull << 30);
	assert_int_equal(srv_auth_retain_budget(a, db, &bytes), 0);
	assert_int_equal(bytes, 0);
	bytes = 77;
	assert_int_equal(srv_auth_retain_budget(a, dc, &bytes), -ENOENT);
	assert_int_equal(bytes, 77);
	/* the option is no grant */
	assert_int_equal(access_of(a, TOK_A, "team-a/x"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "max_retained_bytes=2GiB"), SRV_ACCESS_NONE);
	srv_auth_free(a);
	parse_refused("# tokens\n\n" TOK_A " rw team-a/ max_retained_bytes=lots\n", -EINVAL,
		      "tokens:3: bad max_retained_bytes \"lots\"");
	parse_refused(TOK_A " rw team-a/ max_retained_bytes=-1GiB\n", -EINVAL,
		      "tokens:1: bad max_retained_bytes");
	parse_refused(TOK_A " rw team-a/ max_retained_bytes=\n", -EINVAL,
		      "tokens:1: bad max_retained_bytes");
	parse_refused(TOK_A " rw max_retained_bytes=1GiB a/ max_retained_bytes=2GiB\n", -EINVAL,
		      "tokens:1: max_retained_bytes given twice");
	/* an option alone grants nothing */
	parse_refused(TOK_A " rw max_retained_bytes=1GiB\n", -EINVAL,
		      "tokens:1: token without a namespace grant");
}

/* A mistyped budget is refused with file:line instead of becoming
 * namespace grants (and leaving the token on the default budget): INI
 * style with blanks, a bare keyword, upper case, any grant with '='. The
 * sum of the budgets is what the start-up warning adds up. */
static void test_retain_budget_typos(void **state)
{
	struct srv_auth *a;
	uint64_t sum = 0, largest = 0;
	uint32_t n = 0;

	(void)state;
	parse_refused("[tokens]\n" TOK_A " rw z/ max_retained_bytes = 1MiB\n", -EINVAL,
		      "tokens:2: \"max_retained_bytes\" is not a namespace grant");
	parse_refused(TOK_A " rw z/ max_retained_bytes\n", -EINVAL,
		      "tokens:1: \"max_retained_bytes\" is not a namespace grant");
	parse_refused(TOK_A " rw z/ MAX_RETAINED_BYTES=1MiB\n", -EINVAL,
		      "tokens:1: \"MAX_RETAINED_BYTES=1MiB\" is not a namespace grant");
	parse_refused(TOK_A " rw z/ Max_Retained_Bytes=1MiB\n", -EINVAL, "tokens:1:");
	parse_refused(TOK_A " rw z/ max_retain_bytes=1MiB\n", -EINVAL,
		      "tokens:1: \"max_retain_bytes=1MiB\" is not a namespace grant");
	parse_refused(TOK_A " rw z/ =\n", -EINVAL, "tokens:1: \"=\" is not a namespace grant");
	a = parse_ok(TOK_A " rw max_retained_bytes=1MiB a/\n" TOK_B " ro b/\n"
		     TOK_C " rw max_retained_bytes=3MiB c/\n");
	srv_auth_retain_budgets(a, 2u << 20, &sum, &largest, &n);
	assert_int_equal(n, 3);
	assert_int_equal(sum, 6u << 20);
	assert_int_equal(largest, 3u << 20);
	srv_auth_free(a);
}

/* Issue 20 item 2: exact names, separator-ended prefixes, PREFIX*, *. */
static void test_grant_forms(void **state)
{
	struct srv_auth *a;

	(void)state;
	a = parse_ok(TOK_A " rw tenantA team-a/ org:\n" TOK_B " rw glob* \n" TOK_C " ro *\n");
	assert_int_equal(access_of(a, TOK_A, "tenantA"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "tenantAB"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_A, "tenant"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_A, "team-a/m"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "team-a/"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_A, "team-ab"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_A, "org:x"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_B, "glob"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_B, "globber"), SRV_ACCESS_RW);
	assert_int_equal(access_of(a, TOK_B, "glo"), SRV_ACCESS_NONE);
	assert_int_equal(access_of(a, TOK_C, "anything/at:all"), SRV_ACCESS_RO);
	assert_int_equal(access_of(a, "not-a-token-0123456789", "tenantA"), SRV_ACCESS_NONE);
	assert_int_equal(srv_auth_exact_grants(a), 1);
	srv_auth_free(a);
	parse_refused(TOK_A " rw a*b\n", -EINVAL, "tokens:1: grant \"a*b\": '*' may only end");
	parse_refused(TOK_A " rw **\n", -EINVAL, "may only end");
}

struct warnings {
	int n;
	char text[4096];
};

static void collect(void *arg, const char *line)
{
	struct warnings *w = arg;
	size_t used = strlen(w->text);

	w->n++;
	snprintf(w->text + used, sizeof(w->text) - used, "%s\n", line);
}

static void warnings_of(const char *text, struct warnings *w)
{
	struct srv_auth *a = parse_ok(text);

	memset(w, 0, sizeof(*w));
	srv_auth_each_warning(a, collect, w);
	srv_auth_free(a);
}

/* A prefix grant covering another token's grant is warned about. */
static void test_overlap_warnings(void **state)
{
	struct warnings w;

	(void)state;
	warnings_of("# tenants\n" TOK_A " rw tenantA*\n" TOK_B " rw tenantAB other/\n", &w);
	assert_int_equal(w.n, 1);
	if (!strstr(w.text, "tokens:2: grant \"tenantA*\" also covers \"tenantAB\" of the token "
			    "on line 3"))
		fail_msg("warning: %s", w.text);
	warnings_of(TOK_A " rw team/\n" TOK_B " ro team/sub/\n", &w);
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.text, "\"team/\" also covers \"team/sub/\""));
	/* the same prefix shared (a tenant's rw and ro tokens), "*", and
	 * one token's own grants: no warning */
	warnings_of(TOK_A " rw team/ team/x\n" TOK_B " ro team/\n" TOK_C " rw *\n", &w);
	assert_int_equal(w.n, 0);
	/* many: capped, then counted */
	{
		char text[16384];
		size_t used = 0;

		used += (size_t)snprintf(text, sizeof(text), TOK_A " rw p/\n");
		for (int i = 0; i < 40; i++)
			used += (size_t)snprintf(text + used, sizeof(text) - used,
						 "token-number-%02d-0123456789 rw p/%d\n", i, i);
		warnings_of(text, &w);
		assert_int_equal(w.n, 33);
		assert_non_null(strstr(w.text, "8 more overlapping grants"));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inline_comment_is_no_grant),
		cmocka_unit_test(test_hash_inside_word),
		cmocka_unit_test(test_comment_only_grants_refused),
		cmocka_unit_test(test_quota_comment),
		cmocka_unit_test(test_grant_forms),
		cmocka_unit_test(test_retain_budget_override),
		cmocka_unit_test(test_retain_budget_typos),
		cmocka_unit_test(test_overlap_warnings),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
