/*
 * srv_auth.h - tokens and tenants: which token may bind which namespaces,
 * read-only or read-write, and the byte quota of each namespace.
 *
 * The tokens file (setting tokens_file) is a text file that group and
 * others may neither read nor write (mode 0600 or 0400; anything else is
 * refused, like ssh refuses a readable private key). Format:
 *
 *   # a comment                 (also ';'; blank lines are ignored)
 *   [tokens]                      (the section lines start with; optional)
 *   TOKEN  ACCESS  GRANT [GRANT ...]   # a comment
 *   [quota]
 *   NAMESPACE = SIZE              (exact name)
 *   PREFIX* = SIZE                (each namespace starting with PREFIX)
 *
 * Comments follow kvpool.conf's rules: a line whose first non-blank byte
 * is '#' or ';' is a comment, and a '#' or ';' after a blank starts one
 * that runs to the end of the line. So no token, grant or name may start
 * with '#' or ';' (inside a word they are plain bytes). A UTF-8 byte
 * order mark on line 1 and "\r\n" line ends are taken.
 *
 * TOKEN: 16..1024 bytes of printable ASCII 0x21..0x7e, each token on one
 * line only. ACCESS: "rw" (every request) or "ro" (no PUT, DELETE or
 * DROP_NAMESPACE), for every grant of the line. After ACCESS, among the
 * grants, a word "max_retained_bytes=SIZE" (SIZE as below; once per
 * line) sets that token's retention budget instead of the
 * max_retained_bytes setting (0: the token may not retain). GRANT, one of:
 *   NAME       exactly the namespace NAME;
 *   PREFIX/    every namespace starting with PREFIX/: a grant that ends
 *              in a separator, one of / : . - _ , is a prefix;
 *   PREFIX*    every namespace starting with PREFIX, whatever follows
 *              ("team-a*" opens "team-ab" too: say so on purpose);
 *   *          every namespace.
 * '*' anywhere else in a grant is refused. (Before, every grant was a raw
 * prefix: files whose grants end in a separator or are "*" mean what they
 * meant; a bare "team-a" now grants only the namespace "team-a", which is
 * narrower, never wider; write "team-a*" for the old meaning.)
 * A prefix grant of one token that covers a grant of another token is
 * allowed but listed by srv_auth_each_warning (kvpoold logs it at load).
 * SIZE: bytes with an optional unit as every size setting
 * (64MiB, 2GB), 0 for no quota; the quota counts the payload bytes a
 * namespace holds in either tier. For a name matched by several quota
 * lines the exact line wins, then the longest prefix.
 *
 * Tokens are kept only as SHA-256 digests and looked up by comparing the
 * digest of the offered token with every stored digest (CRYPTO_memcmp, no
 * early exit), so the time taken says nothing about which bytes matched.
 *
 * Threads: srv_auth_load/free on the main thread; srv_auth_reload on the
 * main thread while workers run; every other function from any thread
 * (a read lock guards the table against a concurrent reload).
 */
#ifndef KVPOOL_SRV_AUTH_H
#define KVPOOL_SRV_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_AUTH_DIGEST_BYTES 32
#define SRV_AUTH_TOKEN_MIN_BYTES 16

/* What a token may do in one namespace. */
enum srv_access {
	SRV_ACCESS_NONE = 0, /* namespace not granted (or unknown token) */
	SRV_ACCESS_RO = 1,   /* GET, EXISTS, MATCH, STATS, PING */
	SRV_ACCESS_RW = 2,   /* everything */
};

struct srv_auth;

/* Read and check the tokens file at path; *out is freed with
 * srv_auth_free. err[0..err_len) receives a one-line reason on failure,
 * naming the file (and "file:line" for a bad line).
 * Errors: -errno of open/fstat/read (-ENOENT, -EACCES, ...),
 *   -EPERM (not a regular file, or group/others may read or write it),
 *   -EINVAL (a bad line: unknown section, token too short/long or with a
 *   byte outside 0x21..0x7e, a token given twice, ACCESS not ro/rw, no
 *   grant, a grant over 255 bytes or with a '*' not at its end, a bad
 *   quota name, a bad size, a bad or repeated max_retained_bytes=, a
 *   grant that contains '=' or starts with max_retained_bytes in any
 *   case (a mistyped budget: "max_retained_bytes = 1MiB"); a NUL byte), -EFBIG (file over 16 MiB), -ENOMEM. */
int srv_auth_load(const char *path, struct srv_auth **out, char *err, size_t err_len);

/* The retention budget the token with this digest sets on its line
 * (max_retained_bytes=SIZE) into *bytes. Errors: -ENOENT (unknown token,
 * or its line sets none: the max_retained_bytes setting applies). */
int srv_auth_retain_budget(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES],
			   uint64_t *bytes);

/* The sum of every token's retention budget (its line's
 * max_retained_bytes=, else dflt) into *sum, the largest into *largest
 * and the number of tokens into *ntokens: what the operator granted, to
 * warn when it reaches the pool's capacity. Cannot fail. */
void srv_auth_retain_budgets(struct srv_auth *a, uint64_t dflt, uint64_t *sum,
			     uint64_t *largest, uint32_t *ntokens);

/* The same from memory: text[0..len) (borrowed, need not end in NUL) is
 * parsed as a tokens file called name (used in messages only); no file
 * or mode is checked. Errors: -EINVAL, -ENOMEM as srv_auth_load. */
int srv_auth_parse(const char *name, const void *text, size_t len, struct srv_auth **out,
		   char *err, size_t err_len);

/* Call fn(arg, line) for each load-time warning of the current table (a
 * prefix grant that covers another token's grant), at most 32 and then one
 * line counting the rest. line is valid only during the call. fn runs
 * under the table's read lock: it must not call srv_auth_reload. */
void srv_auth_each_warning(struct srv_auth *a, void (*fn)(void *arg, const char *line), void *arg);

/* How many grants of the current table name exactly one namespace. */
uint32_t srv_auth_exact_grants(struct srv_auth *a);

/* Log (srv_log) what the current table holds, loaded from path: the
 * counts, the number of exact-name grants, and every warning; each line
 * starts with what ("" or "sighup: "). Cannot fail. */
void srv_auth_log_loaded(struct srv_auth *a, const char *what, const char *path);

/* Read path again and, only if it loads, replace a's table with it (the
 * old table stays on error). *tokens and *quotas (may be NULL) receive the
 * counts of the new table. Errors: as srv_auth_load. */
int srv_auth_reload(struct srv_auth *a, const char *path, uint32_t *tokens, uint32_t *quotas,
		    char *err, size_t err_len);

/* The table's generation: 0 for the table loaded at start, one more for
 * each srv_auth_reload that replaced it. A connection remembers the
 * generation it was checked against and checks its token again when it
 * changes (revocation). Any thread; cannot fail. */
uint64_t srv_auth_generation(const struct srv_auth *a);

/* Destructor. Accepts NULL. */
void srv_auth_free(struct srv_auth *a);

/* SHA-256 of token[0..len) into digest (the form a connection keeps).
 * Cannot fail (aborts only if libcrypto cannot compute SHA-256 at all). */
void srv_auth_digest(const void *token, size_t len, uint8_t digest[SRV_AUTH_DIGEST_BYTES]);

/* Is digest the digest of a known token? Constant time in the digest. */
int srv_auth_known(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES]);

/* What the token with this digest may do in namespace ns[0..ns_len):
 * SRV_ACCESS_NONE for an unknown token or a namespace none of its
 * grants covers. Constant time in the digest. */
enum srv_access srv_auth_access(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES],
				const char *ns, size_t ns_len);

/* Does the token with this digest hold the grant "*"? (false for an
 * unknown token) */
bool srv_auth_grants_all(struct srv_auth *a, const uint8_t digest[SRV_AUTH_DIGEST_BYTES]);

/* The quota of namespace ns[0..ns_len) in bytes, 0 for none. */
uint64_t srv_auth_quota(struct srv_auth *a, const char *ns, size_t ns_len);

/* Number of tokens and quota lines in the current table. */
void srv_auth_counts(struct srv_auth *a, uint32_t *tokens, uint32_t *quotas);

#endif /* KVPOOL_SRV_AUTH_H */
