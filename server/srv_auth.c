/*
 * srv_auth.c - the tokens file: load, check, look up (srv_auth.h).
 */
#include "srv_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "conf.h"
#include "proto.h"
#include "srv_log.h"

#define AUTH_FILE_MAX_BYTES (16u << 20)
#define AUTH_WARNINGS_MAX 32
/* A grant word ending in one of these is a prefix (README's "team-a/"). */
#define AUTH_SEPARATORS "/:.-_"

/* A namespace grant: an exact name, or a prefix ("" for "*"). */
struct auth_grant {
	char *text; /* NUL-terminated */
	size_t len;
	bool is_prefix;
	unsigned line; /* of the tokens file, for warnings */
};

struct auth_token {
	uint8_t digest[SRV_AUTH_DIGEST_BYTES];
	enum srv_access access;
	struct auth_grant *grants;
	uint32_t ngrants;
	bool has_retain_budget;       /* max_retained_bytes=SIZE on its line */
	uint64_t max_retained_bytes;
};

/* A token option word: "max_retained_bytes=SIZE" (srv_auth.h). */
#define AUTH_OPT_RETAIN "max_retained_bytes="


struct auth_quota {
	char *name; /* exact name, or the prefix without its '*' */
	size_t len;
	bool is_prefix;
	uint64_t bytes;
};

/* One loaded file: immutable once built, swapped whole by a reload. */
struct auth_table {
	struct auth_token *tokens;
	uint32_t ntokens, tokens_cap;
	struct auth_quota *quotas;
	uint32_t nquotas, quotas_cap;
	char **warnings; /* one line each, AUTH_WARNINGS_MAX at most */
	uint32_t nwarnings;
	uint32_t warnings_dropped; /* found beyond AUTH_WARNINGS_MAX */
	uint32_t exact_grants;     /* grants of exactly one name */
};

struct srv_auth {
	pthread_rwlock_t lock; /* guards t against srv_auth_reload */
	struct auth_table *t;
	uint64_t generation;   /* tables loaded since the first (atomic) */
};

/* Where the parser is, for messages. */
struct auth_parse {
	const char *path;
	unsigned line;
	char *err;
	size_t err_len;
	struct auth_table *t;
};

static int perr(struct auth_parse *p, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Write "path:line: message" into p->err and return rc. */
static int perr(struct auth_parse *p, int rc, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->err_len)
		snprintf(p->err, p->err_len, "%s:%u: %s", p->path, p->line, msg);
	return rc;
}

static void table_free(struct auth_table *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->ntokens; i++) {
		for (uint32_t j = 0; j < t->tokens[i].ngrants; j++)
			free(t->tokens[i].grants[j].text);
		free(t->tokens[i].grants);
	}
	for (uint32_t i = 0; i < t->nwarnings; i++)
		free(t->warnings[i]);
	free(t->warnings);
	free(t->tokens);
	for (uint32_t i = 0; i < t->nquotas; i++)
		free(t->quotas[i].name);
	free(t->quotas);
	free(t);
}

void srv_auth_digest(const void *token, size_t len, uint8_t digest[SRV_AUTH_DIGEST_BYTES])
{
	unsigned int n = 0;

	if (!EVP_Digest(token, len, digest, &n, EVP_sha256(), NULL) || n != SRV_AUTH_DIGEST_BYTES)
		abort(); /* libcrypto without SHA-256: nothing sensible to do */
}

/* Is every byte of s[0..len) printable ASCII without blanks? */
static bool printable(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
			return false;
	return true;
}

/* The token with this digest, or NULL. Compares with every token, each
 * comparison constant time, and never stops early. */
static const struct auth_token *token_find(const struct auth_table *t, const uint8_t *digest)
{
	const struct auth_token *found = NULL;

	for (uint32_t i = 0; i < t->ntokens; i++)
		if (CRYPTO_memcmp(t->tokens[i].digest, digest, SRV_AUTH_DIGEST_BYTES) == 0)
			found = &t->tokens[i];
	return found;
}

/* Split the next blank-separated word off *cur; NULL at the end. */
static char *next_word(char **cur)
{
	char *s = *cur, *w;

	while (*s == ' ' || *s == '\t')
		s++;
	if (!*s) {
		*cur = s;
		return NULL;
	}
	w = s;
	while (*s && *s != ' ' && *s != '\t')
		s++;
	if (*s)
		*s++ = '\0';
	*cur = s;
	return w;
}

/* Parse one grant word w (see srv_auth.h) and append it to token tk.
 * Errors: -EINVAL (message in p->err), -ENOMEM. */
static int token_add_grant(struct auth_parse *p, struct auth_token *tk, const char *w)
{
	size_t len = strlen(w);
	struct auth_grant *g;
	const char *star = strchr(w, '*');
	bool is_prefix;

	if (len > PROTO_NAME_MAX_BYTES)
		return perr(p, -EINVAL, "grant longer than %d bytes", PROTO_NAME_MAX_BYTES);
	/* a mistyped option must not become a namespace grant (and leave the
	 * token on the default budget): "max_retained_bytes = 1MiB",
	 * "MAX_RETAINED_BYTES=1MiB", a bare keyword, any other "x=y" */
	if (strncasecmp(w, "max_retained_bytes", strlen("max_retained_bytes")) == 0 ||
	    strchr(w, '='))
		return perr(p, -EINVAL, "\"%s\" is not a namespace grant: a budget is written "
			    "max_retained_bytes=SIZE as one word, in lower case (and a grant "
			    "may not contain '=')", w);
	if (star && star != w + len - 1)
		return perr(p, -EINVAL, "grant \"%s\": '*' may only end a grant (PREFIX* or *)", w);
	is_prefix = star || strchr(AUTH_SEPARATORS, w[len - 1]);
	if (star)
		len--;
	g = realloc(tk->grants, (tk->ngrants + 1) * sizeof(*g));
	if (!g)
		return perr(p, -ENOMEM, "out of memory");
	tk->grants = g;
	g = &g[tk->ngrants];
	g->text = strndup(w, len);
	if (!g->text)
		return perr(p, -ENOMEM, "out of memory");
	g->len = len;
	g->is_prefix = is_prefix;
	g->line = p->line;
	tk->ngrants++;
	if (!is_prefix)
		p->t->exact_grants++;
	return 0;
}

/* "max_retained_bytes=SIZE" on a token's line: the payload bytes that
 * token's tenant may hold retained, instead of the max_retained_bytes
 * setting. Errors: -EINVAL (message in p->err). */
static int token_retain_option(struct auth_parse *p, struct auth_token *tk, const char *size)
{
	uint64_t bytes;

	if (tk->has_retain_budget)
		return perr(p, -EINVAL, "max_retained_bytes given twice for one token");
	if (conf_parse_size(size, &bytes) < 0)
		return perr(p, -EINVAL, "bad max_retained_bytes \"%s\" (bytes, or a number with KB, "
			    "MiB, GiB...; 0 = this token may not retain)", size);
	tk->has_retain_budget = true;
	tk->max_retained_bytes = bytes;
	return 0;
}

/* Room for one more token in t. Errors: -ENOMEM. */
static int tokens_grow(struct auth_table *t)
{
	struct auth_token *v;
	uint32_t cap = t->tokens_cap ? 2 * t->tokens_cap : 8;

	if (t->ntokens < t->tokens_cap)
		return 0;
	v = realloc(t->tokens, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	t->tokens = v;
	t->tokens_cap = cap;
	return 0;
}

/* "TOKEN ACCESS PREFIX [PREFIX...]" (already cut into words at *cur). */
static int parse_token_line(struct auth_parse *p, char *line)
{
	char *cur = line, *tok = next_word(&cur), *acc = next_word(&cur), *w;
	size_t len = strlen(tok);
	struct auth_token *tk;

	if (len < SRV_AUTH_TOKEN_MIN_BYTES || len > PROTO_TOKEN_MAX_BYTES)
		return perr(p, -EINVAL, "token of %zu bytes: tokens have %d..%d bytes", len,
			    SRV_AUTH_TOKEN_MIN_BYTES, PROTO_TOKEN_MAX_BYTES);
	if (!acc || (strcmp(acc, "ro") && strcmp(acc, "rw")))
		return perr(p, -EINVAL, "expected \"TOKEN ro|rw GRANT...\": access must be ro or rw");
	if (tokens_grow(p->t) < 0)
		return perr(p, -ENOMEM, "out of memory");
	tk = &p->t->tokens[p->t->ntokens];
	memset(tk, 0, sizeof(*tk));
	srv_auth_digest(tok, len, tk->digest);
	if (token_find(p->t, tk->digest))
		return perr(p, -EINVAL, "token given twice");
	tk->access = acc[1] == 'w' ? SRV_ACCESS_RW : SRV_ACCESS_RO;
	p->t->ntokens++; /* owned by the table from here, freed with it */
	while ((w = next_word(&cur))) {
		int rc = strncmp(w, AUTH_OPT_RETAIN, strlen(AUTH_OPT_RETAIN)) == 0
				 ? token_retain_option(p, tk, w + strlen(AUTH_OPT_RETAIN))
				 : token_add_grant(p, tk, w);

		if (rc < 0)
			return rc;
	}
	if (!tk->ngrants)
		return perr(p, -EINVAL, "token without a namespace grant (\"*\" grants every namespace)");
	return 0;
}

/* Trim blanks at both ends of s in place. */
static char *trim(char *s)
{
	size_t n;

	while (*s == ' ' || *s == '\t')
		s++;
	n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = '\0';
	return s;
}

/* "NAME = SIZE" or "PREFIX* = SIZE". */
static int parse_quota_line(struct auth_parse *p, char *line)
{
	char *eq = strrchr(line, '='), *name, *size;
	struct auth_table *t = p->t;
	struct auth_quota *q;
	uint64_t bytes;
	size_t len;

	if (!eq)
		return perr(p, -EINVAL, "expected \"NAMESPACE = SIZE\" or \"PREFIX* = SIZE\"");
	*eq = '\0';
	name = trim(line);
	size = trim(eq + 1);
	len = strlen(name);
	if (len == 0 || len > PROTO_NAME_MAX_BYTES || !printable(name, len))
		return perr(p, -EINVAL, "bad namespace name: 1..255 bytes of 0x21..0x7e");
	if (conf_parse_size(size, &bytes) < 0)
		return perr(p, -EINVAL, "bad quota size \"%s\" (bytes, or a number with KB, MiB, GiB...)",
			    size);
	if (t->nquotas == t->quotas_cap) {
		uint32_t cap = t->quotas_cap ? 2 * t->quotas_cap : 8;

		q = realloc(t->quotas, cap * sizeof(*q));
		if (!q)
			return perr(p, -ENOMEM, "out of memory");
		t->quotas = q;
		t->quotas_cap = cap;
	}
	q = &t->quotas[t->nquotas];
	q->is_prefix = name[len - 1] == '*';
	q->len = q->is_prefix ? len - 1 : len;
	q->name = strndup(name, q->len);
	if (!q->name)
		return perr(p, -ENOMEM, "out of memory");
	q->bytes = bytes;
	t->nquotas++;
	return 0;
}

/* Cut a comment off s in place, by kvpool.conf's rules: a line whose
 * first non-blank byte is '#' or ';' is all comment, and so is the rest
 * of a line from a '#' or ';' that follows a blank. */
static void cut_comment(char *s)
{
	for (char *c = s; *c; c++) {
		if ((*c == '#' || *c == ';') && (c == s || c[-1] == ' ' || c[-1] == '\t')) {
			*c = '\0';
			return;
		}
	}
}

/* One line of the file (NUL-terminated, line end removed). */
static int parse_line(struct auth_parse *p, char *line, bool *in_quota)
{
	char *s = trim(line);

	cut_comment(s);
	s = trim(s);
	if (!*s)
		return 0;
	if (*s == '[') {
		if (!strcmp(s, "[tokens]"))
			*in_quota = false;
		else if (!strcmp(s, "[quota]"))
			*in_quota = true;
		else
			return perr(p, -EINVAL, "unknown section %s: [tokens] or [quota]", s);
		return 0;
	}
	return *in_quota ? parse_quota_line(p, s) : parse_token_line(p, s);
}

/* Parse text[0..len) (NUL-terminated) into p->t. */
static int parse_text(struct auth_parse *p, char *text, size_t len)
{
	bool in_quota = false;
	char *line = text;
	int rc;

	if (memchr(text, '\0', len))
		return perr(p, -EINVAL, "NUL byte in the file");
	if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
		line += 3; /* a UTF-8 byte order mark, as kvpool.conf allows */
	while (line && *line) {
		char *nl = strchr(line, '\n');

		p->line++;
		if (nl)
			*nl = '\0';
		if (nl && nl > line && nl[-1] == '\r')
			nl[-1] = '\0';
		rc = parse_line(p, line, &in_quota);
		if (rc < 0)
			return rc;
		line = nl ? nl + 1 : NULL;
	}
	return 0;
}

/* Check the open file's type and mode; read it whole into *text. */
static int read_checked(int fd, const char *path, char **text, size_t *len, char *err,
			size_t err_len)
{
	struct stat st;
	size_t have = 0;
	char *buf;

	if (fstat(fd, &st) < 0) {
		snprintf(err, err_len, "tokens_file %s: %s", path, strerror(errno));
		return -errno;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, err_len, "tokens_file %s is not a regular file", path);
		return -EPERM;
	}
	if (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
		snprintf(err, err_len,
			 "tokens_file %s has mode %04o: group and others must not read or write it "
			 "(chmod 600)", path, (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	if (st.st_size > AUTH_FILE_MAX_BYTES) {
		snprintf(err, err_len, "tokens_file %s is larger than 16 MiB", path);
		return -EFBIG;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		return -ENOMEM;
	while (have < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + have, (size_t)st.st_size - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* shrank meanwhile: parse what is there */
		have += (size_t)n;
	}
	buf[have] = '\0';
	*text = buf;
	*len = have;
	return 0;
}

/* Add one warning line to t (dropped, but counted, past the cap). */
static void warn_add(struct auth_table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn_add(struct auth_table *t, const char *fmt, ...)
{
	char **v;
	char *line = NULL;
	va_list ap;

	if (t->nwarnings == AUTH_WARNINGS_MAX) {
		t->warnings_dropped++;
		return;
	}
	va_start(ap, fmt);
	if (vasprintf(&line, fmt, ap) < 0)
		line = NULL;
	va_end(ap);
	v = line ? realloc(t->warnings, (t->nwarnings + 1) * sizeof(*v)) : NULL;
	if (!v) {
		free(line);
		t->warnings_dropped++;
		return;
	}
	t->warnings = v;
	v[t->nwarnings++] = line;
}

/* The "*" that shows a prefix grant as written: "" for an exact name or
 * a prefix that ends in a separator. */
static const char *grant_star(const struct auth_grant *g)
{
	if (!g->is_prefix || (g->len && strchr(AUTH_SEPARATORS, g->text[g->len - 1])))
		return "";
	return "*";
}

struct grant_ref {
	const struct auth_grant *g;
	uint32_t token;
};

/* Sort grants by text, a prefix before an exact name of the same text. */
static int grant_ref_cmp(const void *a, const void *b)
{
	const struct auth_grant *x = ((const struct grant_ref *)a)->g;
	const struct auth_grant *y = ((const struct grant_ref *)b)->g;
	size_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->text, y->text, n);

	if (c)
		return c;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return (int)y->is_prefix - (int)x->is_prefix;
}

/* Does tk hold prefix grant p too (the two share everything under it)? */
static bool token_has_prefix(const struct auth_token *tk, const struct auth_grant *p)
{
	for (uint32_t i = 0; i < tk->ngrants; i++)
		if (tk->grants[i].is_prefix && tk->grants[i].len == p->len &&
		    memcmp(tk->grants[i].text, p->text, p->len) == 0)
			return true;
	return false;
}

/* Warn about each prefix grant (other than "*") that covers a grant of
 * another token: "team-a*" of one token opens "team-ab/" of another.
 * Two tokens with the very same prefix share it on purpose (a tenant's
 * rw and ro tokens): neither that prefix nor what lies under it is
 * warned about. Sorting puts every grant a
 * prefix covers right after it, so this is O(n log n + overlaps). */
static void warn_overlaps(struct auth_table *t, const char *path)
{
	struct grant_ref *v;
	size_t n = 0, k = 0, steps = 0;

	for (uint32_t i = 0; i < t->ntokens; i++)
		n += t->tokens[i].ngrants;
	if (n < 2)
		return;
	v = malloc(n * sizeof(*v));
	if (!v)
		return; /* the warnings are advice: without memory, none */
	for (uint32_t i = 0; i < t->ntokens; i++)
		for (uint32_t j = 0; j < t->tokens[i].ngrants; j++)
			v[k++] = (struct grant_ref){ &t->tokens[i].grants[j], i };
	qsort(v, n, sizeof(*v), grant_ref_cmp);
	for (size_t i = 0; i < n && steps < (1u << 22); i++) {
		const struct auth_grant *p = v[i].g;

		if (!p->is_prefix || p->len == 0)
			continue;
		for (size_t j = i + 1; j < n && steps < (1u << 22); j++, steps++) {
			const struct auth_grant *g = v[j].g;

			if (g->len < p->len || memcmp(g->text, p->text, p->len) != 0)
				break;
			if (v[j].token == v[i].token || (g->is_prefix && g->len == p->len) ||
			    token_has_prefix(&t->tokens[v[j].token], p))
				continue;
			warn_add(t, "tokens_file %s:%u: grant \"%s%s\" also covers \"%s%s\" of the "
				 "token on line %u: that token's namespaces are open to both", path,
				 p->line, p->text, grant_star(p), g->text, grant_star(g), g->line);
		}
	}
	free(v);
}

/* Parse text[0..len) (which need not be NUL-terminated) into a new table,
 * naming the file `path` in messages. */
static int table_parse(const char *path, const char *text, size_t len, struct auth_table **out,
		       char *err, size_t err_len)
{
	struct auth_parse p = { .path = path, .err = err, .err_len = err_len };
	char *copy = malloc(len + 1);
	int rc;

	if (!copy)
		return -ENOMEM;
	memcpy(copy, text, len);
	copy[len] = '\0';
	p.t = calloc(1, sizeof(*p.t));
	if (!p.t) {
		free(copy);
		return -ENOMEM;
	}
	rc = parse_text(&p, copy, len);
	free(copy);
	if (rc < 0) {
		table_free(p.t);
		return rc;
	}
	warn_overlaps(p.t, path);
	*out = p.t;
	return 0;
}

/* Load path into a new table. */
static int table_load(const char *path, struct auth_table **out, char *err, size_t err_len)
{
	char *text = NULL;
	size_t len = 0;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, err_len, "cannot open tokens_file %s: %s", path, strerror(-rc));
		return rc;
	}
	rc = read_checked(fd, path, &text, &len, err, err_len);
	close(fd);
	if (rc < 0)
		return rc;
	rc = table_parse(path, text, len, out, err, err_len);
	free(text);
	return rc;
}

/* Wrap a new table in a handle. */
static int auth_wrap(struct auth_table *t, struct srv_auth **out)
{
	struct srv_auth *a = calloc(1, sizeof(*a));

	if (!a) {
		table_free(t);
		return -ENOMEM;
	}
	a->t = t;
	pthread_rwlock_init(&a->lock, NULL);
	*out = a;
	return 0;
}

int srv_auth_load(const char *path, struct srv_auth **out, char *err, size_t err_len)
{
	struct auth_table *t = NULL;
	int rc = table_load(path, &t, err, err_len);

	return rc < 0 ? rc : auth_wrap(t, out);
}

int srv_auth_parse(const char *name, const void *text, size_t len, struct srv_auth **out,
		   char *err, size_t err_len)
{
	struct auth_table *t = NULL;
	int rc = table_parse(name, text, len, &t, err, err_len);

	return rc < 0 ? rc : auth_wrap(t, out);
}

void srv_auth_each_warning(struct srv_auth *a, void (*fn)(void *arg, const char *line), void *arg)
{
	char more[96];

	pthread_rwlock_rdlock(&a->lock);
	for (uint32_t i = 0; i < a->t->nwarnings; i++)
		fn(arg, a->t->warnings[i]);
	if (a->t->warnings_dropped) {
		snprintf(more, sizeof(more), "tokens_file: %u more overlapping grants not listed",
			 a->t->warnings_dropped);
		fn(arg, more);
	}
	pthread_rwlock_unlock(&a->lock);
}

uint32_t srv_auth_exact_grants(struct srv_auth *a)
{
	uint32_t n;

	pthread_rwlock_rdlock(&a->lock);
	n = a->t->exact_grants;
	pthread_rwlock_unlock(&a->lock);
	return n;
}

int srv_auth_reload(struct srv_auth *a, const char *path, uint32_t *tokens, uint32_t *quotas,
		    char *err, size_t err_len)
{
	struct auth_table *t, *old;
	int rc = table_load(path, &t, err, err_len);

	if (rc < 0)
		return rc;
	pthread_rwlock_wrlock(&a->lock);
	old = a->t;
	a->t = t;
	/* after the swap: a reader that sees the new generation asks the
	 * new table (or a newer one) */
	__atomic_add_fetch(&a->generation, 1, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&a->lock);
	table_free(old);
	if (tokens)
		*tokens = t->ntokens;
	if (quotas)
		*quotas = t->nquotas;
	return 0;
}

uint64_t srv_auth_generation(const struct srv_auth *a)
{
	return __atomic_load_n(&a->generation, __ATOMIC_ACQUIRE);
}

void srv_auth_free(struct srv_auth *a)
{
	if (!a)
		return;
	table_free(a->t);
	pthread_rwlock_destroy(&a->lock);
	free(a);
}

int srv_auth_known(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES])
{
	int known;

	pthread_rwlock_rdlock(&a->lock);
	known = token_find(a->t, digest) != NULL;
	pthread_rwlock_unlock(&a->lock);
	return known;
}

int srv_auth_retain_budget(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES],
			   uint64_t *bytes)
{
	const struct auth_token *tk;
	int rc = -ENOENT;

	pthread_rwlock_rdlock(&a->lock);
	tk = token_find(a->t, digest);
	if (tk && tk->has_retain_budget) {
		*bytes = tk->max_retained_bytes;
		rc = 0;
	}
	pthread_rwlock_unlock(&a->lock);
	return rc;
}

void srv_auth_retain_budgets(struct srv_auth *a, uint64_t dflt, uint64_t *sum,
			     uint64_t *largest, uint32_t *ntokens)
{
	uint64_t total = 0, top = 0;

	pthread_rwlock_rdlock(&a->lock);
	for (uint32_t i = 0; i < a->t->ntokens; i++) {
		const struct auth_token *tk = &a->t->tokens[i];
		uint64_t b = tk->has_retain_budget ? tk->max_retained_bytes : dflt;

		total = b > UINT64_MAX - total ? UINT64_MAX : total + b;
		if (b > top)
			top = b;
	}
	*ntokens = a->t->ntokens;
	pthread_rwlock_unlock(&a->lock);
	*sum = total;
	*largest = top;
}

bool srv_auth_grants_all(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES])
{
	const struct auth_token *tk;
	bool all = false;

	pthread_rwlock_rdlock(&a->lock);
	tk = token_find(a->t, digest);
	for (uint32_t i = 0; tk && i < tk->ngrants; i++)
		all |= tk->grants[i].is_prefix && tk->grants[i].len == 0;
	pthread_rwlock_unlock(&a->lock);
	return all;
}

/* Does name start with prefix p? */
static bool prefix_of(const char *p, size_t plen, const char *name, size_t len)
{
	return plen <= len && memcmp(p, name, plen) == 0;
}

enum srv_access srv_auth_access(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES],
				const char *ns, size_t ns_len)
{
	enum srv_access access = SRV_ACCESS_NONE;
	const struct auth_token *tk;

	pthread_rwlock_rdlock(&a->lock);
	tk = token_find(a->t, digest);
	for (uint32_t i = 0; tk && i < tk->ngrants; i++) {
		const struct auth_grant *g = &tk->grants[i];

		if (g->is_prefix ? prefix_of(g->text, g->len, ns, ns_len)
				 : g->len == ns_len && memcmp(g->text, ns, ns_len) == 0) {
			access = tk->access;
			break;
		}
	}
	pthread_rwlock_unlock(&a->lock);
	return access;
}

uint64_t srv_auth_quota(struct srv_auth *a, const char *ns, size_t ns_len)
{
	const struct auth_quota *best = NULL;
	uint64_t bytes;

	pthread_rwlock_rdlock(&a->lock);
	for (uint32_t i = 0; i < a->t->nquotas; i++) {
		const struct auth_quota *q = &a->t->quotas[i];

		if (!q->is_prefix && q->len == ns_len && !memcmp(q->name, ns, ns_len)) {
			best = q;
			break;
		}
		if (q->is_prefix && prefix_of(q->name, q->len, ns, ns_len) &&
		    (!best || q->len > best->len))
			best = q;
	}
	bytes = best ? best->bytes : 0;
	pthread_rwlock_unlock(&a->lock);
	return bytes;
}

void srv_auth_counts(struct srv_auth *a, uint32_t *tokens, uint32_t *quotas)
{
	pthread_rwlock_rdlock(&a->lock);
	if (tokens)
		*tokens = a->t->ntokens;
	if (quotas)
		*quotas = a->t->nquotas;
	pthread_rwlock_unlock(&a->lock);
}

static void log_warning(void *arg, const char *line)
{
	(void)arg;
	srv_warn("%s", line);
}

void srv_auth_log_loaded(struct srv_auth *a, const char *what, const char *path)
{
	uint32_t tokens = 0, quotas = 0, exact = srv_auth_exact_grants(a);

	srv_auth_counts(a, &tokens, &quotas);
	srv_info("%sauth: %u tokens and %u quotas from %s", what, tokens, quotas, path);
	if (exact)
		srv_info("%sauth: %u grants name exactly one namespace (a grant ending in one of "
			 "\"" AUTH_SEPARATORS "\" or '*' is a prefix; a bare name is no prefix any more)",
			 what, exact);
	srv_auth_each_warning(a, log_warning, NULL);
}
