/*
 * fuzz_auth.c - fuzz target: the tokens-file parser (server/srv_auth.c,
 * srv_auth_parse), as the config target fuzzes kvpool.conf's.
 *
 * Every input is parsed as a tokens file, and so is a copy of it with an
 * inline comment full of would-be grants (" # * tenant ...") added to the
 * end of every line. Checked:
 *  1. a refusal is -EINVAL or -ENOMEM with a message naming the file;
 *  2. the comments change nothing: both load or both are refused (with the
 *     same error), and when they load they hold the same numbers of
 *     tokens, quotas and exact grants, and give every token of the input
 *     (the first word of each line) the same access, and every name the
 *     same quota, for each word of the input taken as a namespace and for
 *     names no grant of the input could mean;
 *  3. a token the input does not hold gets no access; both list as many
 *     warnings.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "srv_auth.h"
#include "srv_log.h"

#define MAX_WORDS 48
#define COMMENT " # * tenant tenantB team-b/ x;y *"

/* The input with COMMENT before the end of every line (before a "\r"
 * right before a "\n": the parser drops it with the "\n"). */
static char *with_comments(const uint8_t *data, size_t size, size_t *out_len)
{
	size_t cap = size + 1, n = 0, add = strlen(COMMENT);
	char *out;

	for (size_t i = 0; i < size; i++)
		cap += data[i] == '\n' ? add : 0;
	cap += add;
	out = malloc(cap);
	FUZZ_CHECK(out);
	for (size_t i = 0; i <= size; i++) {
		bool end = i == size || data[i] == '\n';

		if (end) {
			size_t cr = i < size && n && out[n - 1] == '\r' ? 1 : 0;

			n -= cr;
			memcpy(out + n, COMMENT, add);
			n += add;
			if (cr)
				out[n++] = '\r';
		}
		if (i < size)
			out[n++] = (char)data[i];
	}
	*out_len = n;
	return out;
}

/* Blank-separated words of data[0..size), each NUL-terminated (free()). */
static int words_of(const uint8_t *data, size_t size, char **buf, char *w[MAX_WORDS],
		    bool first_only_of_line)
{
	char *t = malloc(size + 1);
	int n = 0;
	bool line_start = true;

	FUZZ_CHECK(t);
	memcpy(t, data, size);
	t[size] = '\0';
	for (size_t i = 0; i < size && n < MAX_WORDS;) {
		char c = t[i];

		if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\0') {
			if (c == '\n')
				line_start = true;
			t[i++] = '\0';
			continue;
		}
		if (!first_only_of_line || line_start)
			w[n++] = t + i;
		line_start = false;
		while (i < size && t[i] != ' ' && t[i] != '\t' && t[i] != '\r' && t[i] != '\n' &&
		       t[i] != '\0')
			i++;
	}
	*buf = t;
	return n;
}

static enum srv_access access_of(struct srv_auth *a, const char *token, const char *ns)
{
	uint8_t d[SRV_AUTH_DIGEST_BYTES];

	srv_auth_digest(token, strlen(token), d);
	return srv_auth_access(a, d, ns, strlen(ns));
}

static void count_warning(void *arg, const char *line)
{
	FUZZ_CHECK(line && line[0]);
	(*(unsigned *)arg)++;
}

/* The two tables mean the same for the input's tokens and names. */
static void check_same(struct srv_auth *a, struct srv_auth *b, const uint8_t *data, size_t size)
{
	static const char *const extra[] = { "tenant", "tenantB", "team-b/x", "x;y",
					     "zz-no-grant-of-the-input", "*" };
	char *tbuf, *nbuf, *tok[MAX_WORDS], *ns[MAX_WORDS];
	int nt = words_of(data, size, &tbuf, tok, true);
	int nn = words_of(data, size, &nbuf, ns, false);
	uint32_t ta, qa, tb, qb;
	unsigned warn_a = 0, warn_b = 0;

	srv_auth_counts(a, &ta, &qa);
	srv_auth_counts(b, &tb, &qb);
	FUZZ_CHECK(ta == tb && qa == qb);
	FUZZ_CHECK(srv_auth_exact_grants(a) == srv_auth_exact_grants(b));
	srv_auth_each_warning(a, count_warning, &warn_a);
	srv_auth_each_warning(b, count_warning, &warn_b);
	FUZZ_CHECK(warn_a == warn_b);
	for (int i = 0; i < nt; i++) {
		for (int j = 0; j < nn; j++)
			FUZZ_CHECK(access_of(a, tok[i], ns[j]) == access_of(b, tok[i], ns[j]));
		for (size_t j = 0; j < sizeof(extra) / sizeof(extra[0]); j++)
			FUZZ_CHECK(access_of(a, tok[i], extra[j]) == access_of(b, tok[i], extra[j]));
	}
	for (int j = 0; j < nn; j++)
		FUZZ_CHECK(srv_auth_quota(a, ns[j], strlen(ns[j])) ==
			   srv_auth_quota(b, ns[j], strlen(ns[j])));
	/* a token the input does not hold opens nothing */
	if (!memmem(data, size, "zz-not-a-token-0123", 19))
		FUZZ_CHECK(access_of(a, "zz-not-a-token-0123", "x") == SRV_ACCESS_NONE);
	free(tbuf);
	free(nbuf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct srv_auth *a = NULL, *b = NULL;
	char err_a[512] = "", err_b[512] = "";
	size_t clen = 0;
	char *commented;
	int ra, rb;

	srv_log_set_level(SRV_LOG_ERROR);
	ra = srv_auth_parse("fuzz", data, size, &a, err_a, sizeof(err_a));
	if (ra) {
		FUZZ_CHECK(ra == -EINVAL || ra == -ENOMEM);
		FUZZ_CHECK(a == NULL);
		FUZZ_CHECK(ra == -ENOMEM || strncmp(err_a, "fuzz:", 5) == 0);
	}
	commented = with_comments(data, size, &clen);
	rb = srv_auth_parse("fuzz", commented, clen, &b, err_b, sizeof(err_b));
	FUZZ_CHECK(ra == rb);
	if (ra == 0)
		check_same(a, b, data, size);
	free(commented);
	srv_auth_free(a);
	srv_auth_free(b);
	return 0;
}
