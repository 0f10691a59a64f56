/*
 * cli_ops.c - the debugging subcommands: put, get, exists, match, delete,
 * ping. One call each to libkvpool; results are printed one per line.
 */
#include "cli.h"
#include "cli_key.h"
#include "cli_opts.h"
#include "cli_stats.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Options beyond the shared ones. */
enum {
	OPT_PARENT = CLI_OPT_FIRST_LOCAL,
	OPT_LEASE_MS,
	OPT_RETAIN_MS,
	OPT_WAIT_MS,
	OPT_WANT,
};

/* Parse a millisecond option's value (0 .. 2^32-1) into *out; prints why
 * a bad one is refused. Returns 1 or -EINVAL. */
static int ms_opt(const char *prog, const char *name, const char *arg, uint32_t *out)
{
	uint64_t v;

	if (cli_parse_u64(arg, 0, UINT32_MAX, &v)) {
		cli_usage_error(prog, "%s wants milliseconds (0..%u), not '%s'", name, UINT32_MAX,
				arg);
		return -EINVAL;
	}
	*out = (uint32_t)v;
	return 1;
}

/* Append ", WORD" (or "WORD" first) to buf[0..len). */
static void add_word(char *buf, size_t len, const char *word)
{
	size_t used = strlen(buf);

	snprintf(buf + used, len - used, "%s%s", used ? ", " : "", word);
}

/* The retention outcome of a put that asked retain_ms (> 0), in words. */
static void retention_words(uint32_t flags, uint32_t asked, uint16_t version, char *buf,
			    size_t len)
{
	buf[0] = '\0';
	if (version < 2) {
		snprintf(buf, len, "retention not asked: the server speaks protocol 1 only");
		return;
	}
	if (flags & KVPOOL_PUT_RETAINED)
		snprintf(buf, len, "retained");
	else if (flags & KVPOOL_PUT_RETAIN_BUDGET)
		snprintf(buf, len, "not retained: over the retention budget");
	else
		snprintf(buf, len, "not retained (%u ms asked)", asked);
	if (flags & KVPOOL_PUT_RETAIN_CLAMPED)
		add_word(buf, len, "cut to the server's max_retain_ms");
}

/* Parse argv[first..argc) as keys into a malloc'd array (*keys, *n).
 * Prints the offending argument on failure and returns CLI_EXIT_ERROR. */
static int parse_keys(const char *prog, int argc, char **argv, int first,
		      uint8_t (**keys)[KVPOOL_KEY_BYTES], size_t *n)
{
	size_t count = argc > first ? (size_t)(argc - first) : 0;
	uint8_t (*k)[KVPOOL_KEY_BYTES];

	if (!count)
		return cli_usage_error(prog, "no KEY given");
	k = calloc(count, sizeof(*k));
	if (!k) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return CLI_EXIT_ERROR;
	}
	for (size_t i = 0; i < count; i++) {
		if (cli_key_parse(argv[first + i], k[i])) {
			free(k);
			return cli_usage_error(prog, "bad key '%s': want 64 hex digits or text:STRING",
					       argv[first + i]);
		}
	}
	*keys = k;
	*n = count;
	return CLI_EXIT_OK;
}

/* Print "PROG: what: reason" for a failed library call; its exit code. */
static int call_failed(const char *prog, const char *what, int err)
{
	fprintf(stderr, "%s: %s: %s\n", prog, what,
		err == -ENOENT ? "not in the pool" : cli_reason(err));
	return cli_exit_code(err);
}

/* Read all of f, at most max bytes, into a malloc'd buffer. Returns 0,
 * -EFBIG when f holds more than max bytes (nothing returned), or -errno. */
static int read_all(FILE *f, size_t max, uint8_t **data, size_t *len)
{
	size_t cap = 1 << 16, n = 0, got;
	uint8_t *buf = malloc(cap), *nbuf;

	if (!buf)
		return -ENOMEM;
	while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n > max) {
			free(buf);
			return -EFBIG;
		}
		if (n < cap)
			continue;
		nbuf = realloc(buf, cap * 2);
		if (!nbuf) {
			free(buf);
			return -ENOMEM;
		}
		buf = nbuf;
		cap *= 2;
	}
	if (ferror(f)) {
		int err = errno ? errno : EIO;

		free(buf);
		return -err;
	}
	*data = buf;
	*len = n;
	return 0;
}

/* The option loop of these subcommands. `local` handles the subcommand's
 * own options: it returns 1 when it applied one, 0 when `opt` is not its
 * own, or -EINVAL after printing why a value is bad; it may be NULL.
 * Returns -1 to go on, or the exit code to return now (help printed, bad
 * option). */
static int parse_opts(int argc, char **argv, const char *usage, const struct option *longopts,
		      const char *shortopts, struct cli_conn *conn,
		      int (*local)(int opt, const char *arg, void *ctx), void *ctx)
{
	const char *prog = argv[0];
	int opt, rc;

	optind = 0;
	while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		rc = cli_conn_opt(conn, prog, opt, optarg);
		if (rc == 0 && local)
			rc = local(opt, optarg, ctx);
		if (rc < 0)
			return CLI_EXIT_ERROR;
		if (rc)
			continue;
		if (opt == 'h') {
			fputs(usage, stdout);
			return CLI_EXIT_OK;
		}
		return cli_try_help(prog);
	}
	return -1;
}

/* ---- put --------------------------------------------------------------- */

static const char put_usage[] =
	"usage: kvpool put KEY [--parent KEY] [--retain-ms MS] (FILE | -) [--server URL]\n"
	"                  [--namespace NS]\n"
	"\n"
	"Store the bytes of FILE (- for standard input) as block KEY. KEY and the\n"
	"parent are 64 hex digits or text:STRING (SHA-256 of STRING). A block with a\n"
	"parent is refused unless the parent is stored. A key already stored is a\n"
	"success that stores nothing: it prints \"already stored\". (That is checked\n"
	"just before the put; a block another client stores in between is reported\n"
	"as stored.) Exit 1 when the server refuses the block, e.g. when it is larger\n"
	"than the server's max_block_bytes.\n"
	"\n"
	"  --parent KEY        the block before this one in its prompt\n"
	"  --retain-ms MS      ask the server to keep the block MS milliseconds from\n"
	"                      eviction (protocol 2; capped at the server's\n"
	"                      max_retain_ms, within its retention budget); also\n"
	"                      extends the retention of a block already stored. The\n"
	"                      outcome is printed: retained, or why not\n"
	CLI_COMMON_HELP;

struct put_args {
	const char *parent;
	uint32_t retain_ms;
};

/* put's own options. */
static int put_opt(int opt, const char *arg, void *ctx)
{
	struct put_args *a = ctx;

	if (opt == OPT_RETAIN_MS)
		return ms_opt("kvpool put", "--retain-ms", arg, &a->retain_ms);
	if (opt != OPT_PARENT)
		return 0;
	a->parent = arg;
	return 1;
}

/* Read the payload named by `path` ("-": stdin), at most max bytes: more
 * cannot be a block of this server. */
static int put_read(const char *prog, const char *path, uint64_t max, uint8_t **data,
		    size_t *len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	int rc;

	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
		return CLI_EXIT_ERROR;
	}
	errno = 0;
	rc = read_all(f, max < SIZE_MAX ? (size_t)max : SIZE_MAX, data, len);
	if (f != stdin)
		fclose(f);
	if (rc == -EFBIG) {
		fprintf(stderr, "%s: %s holds more than the server's max_block_bytes %" PRIu64
			"\n", prog, path, max);
		return cli_exit_code(-EMSGSIZE);
	}
	if (rc) {
		fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(-rc));
		return CLI_EXIT_ERROR;
	}
	if (!*len) {
		free(*data);
		fprintf(stderr, "%s: %s is empty: a block needs at least one byte\n", prog, path);
		return CLI_EXIT_ERROR;
	}
	return CLI_EXIT_OK;
}

/* Store data[0..len) as block `key` unless the pool holds it already, and
 * say which. The library's put cannot tell a new block from one already
 * stored, so EXISTS is asked first; another client may store the key in
 * between, and then this says "stored" for a block it did not write,
 * which is harmless: the content under a key never changes. A block
 * above the server's limit is named with that limit. Returns the exit
 * code. */
static int put_checked(const char *prog, struct kvpool_client *c, const uint8_t *key,
		       const uint8_t *parent, const uint8_t *data, size_t len, uint32_t retain_ms)
{
	char hex[CLI_KEY_HEX_BYTES], nbytes[32], words[160];
	struct iovec iov = { (void *)data, len };
	struct kvpool_put_block pb = { .key = key, .parent = parent, .iov = &iov, .iovcnt = 1,
				       .retain_ms = retain_ms };
	struct kvpool_limits lim;
	uint32_t flags = 0;
	int rc, st, exists;

	cli_key_hex(key, hex);
	rc = kvpool_get_limits(c, &lim);
	if (rc)
		return call_failed(prog, "limits", rc);
	if (lim.max_block_bytes && len > lim.max_block_bytes) {
		fprintf(stderr, "%s: %s: block of %zu bytes exceeds the server's max_block_bytes %"
			PRIu64 "\n", prog, hex, len, lim.max_block_bytes);
		return cli_exit_code(-EMSGSIZE);
	}
	rc = kvpool_exists(c, key, 1, &st);
	if (rc)
		return call_failed(prog, hex, rc);
	exists = st == 0;
	if (exists && !retain_ms) {
		printf("%s already stored (nothing written)\n", hex);
		return CLI_EXIT_OK;
	}
	/* with a retention, a stored block is put again: that extends it */
	rc = kvpool_put_ex(c, &pb, 1, NULL, &flags);
	if (rc == -EMSGSIZE) {
		/* Within max_block_bytes, yet more than the server can hold. */
		fprintf(stderr, "%s: %s: block of %zu bytes refused as too large by the server "
			"(its max_block_bytes is %" PRIu64 ", but a block must also fit its "
			"memory)\n", prog, hex, len, lim.max_block_bytes);
		return cli_exit_code(rc);
	}
	if (rc)
		return call_failed(prog, hex, rc);
	if (!retain_ms) {
		printf("%s stored (%s)\n", hex, cli_fmt_bytes(len, nbytes, sizeof(nbytes)));
		return CLI_EXIT_OK;
	}
	retention_words(flags, retain_ms, lim.protocol_version, words, sizeof(words));
	if (exists)
		printf("%s already stored (nothing written); %s\n", hex, words);
	else
		printf("%s stored (%s); %s\n", hex, cli_fmt_bytes(len, nbytes, sizeof(nbytes)),
		       words);
	return CLI_EXIT_OK;
}

int cli_put_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "parent", required_argument, NULL, OPT_PARENT },
		{ "retain-ms", required_argument, NULL, OPT_RETAIN_MS },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	uint8_t key[KVPOOL_KEY_BYTES], parent[KVPOOL_KEY_BYTES], *data = NULL;
	struct put_args a = { 0 };
	struct kvpool_limits lim;
	struct kvpool_client *c;
	struct cli_conn conn;
	size_t len = 0;
	int rc;

	cli_conn_init(&conn, "default");
	rc = parse_opts(argc, argv, put_usage, longopts, "h", &conn, put_opt, &a);
	if (rc >= 0)
		return rc;
	if (argc - optind != 2)
		return cli_usage_error(prog, "want KEY and FILE (or -)");
	if (cli_key_parse(argv[optind], key))
		return cli_usage_error(prog, "bad key '%s'", argv[optind]);
	if (a.parent && cli_key_parse(a.parent, parent))
		return cli_usage_error(prog, "bad parent key '%s'", a.parent);
	/* Connect first: the server's max_block_bytes bounds what is read. */
	rc = cli_connect(&conn, prog, &c);
	if (rc)
		return cli_connect_exit_code(rc);
	rc = kvpool_get_limits(c, &lim);
	if (rc) {
		kvpool_close(c);
		return call_failed(prog, "limits", rc);
	}
	rc = put_read(prog, argv[optind + 1], lim.max_block_bytes, &data, &len);
	if (rc) {
		kvpool_close(c);
		return rc;
	}
	rc = put_checked(prog, c, key, a.parent ? parent : NULL, data, len, a.retain_ms);
	kvpool_close(c);
	free(data);
	return rc;
}

/* ---- get --------------------------------------------------------------- */

static const char get_usage[] =
	"usage: kvpool get KEY [-o FILE] [--server URL] [--namespace NS]\n"
	"\n"
	"Write the bytes of block KEY to FILE (default: standard output).\n"
	"Exit 1 when the block is not in the pool (FILE is then not created).\n"
	"\n"
	"  -o, --output FILE   write the block here\n"
	CLI_COMMON_HELP;

/* get's own option. */
static int get_opt(int opt, const char *arg, void *ctx)
{
	if (opt != 'o')
		return 0;
	*(const char **)ctx = arg;
	return 1;
}

/* Write data[0..len) to path ("-" or NULL: stdout). */
static int write_out(const char *prog, const char *path, const void *data, size_t len)
{
	bool to_stdout = !path || !strcmp(path, "-");
	FILE *f = to_stdout ? stdout : fopen(path, "wb");
	bool ok;

	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", prog, path, strerror(errno));
		return CLI_EXIT_ERROR;
	}
	ok = fwrite(data, 1, len, f) == len;
	ok = (to_stdout ? fflush(f) : fclose(f)) == 0 && ok;
	if (!ok) {
		fprintf(stderr, "%s: writing %s: %s\n", prog, to_stdout ? "output" : path,
			strerror(errno));
		return CLI_EXIT_ERROR;
	}
	return CLI_EXIT_OK;
}

/* A GET that missed: on a cluster whose nodes did not all answer the
 * block may be on one of them (a cluster counts a silent owner's share as
 * a miss), so name them and exit 2 rather than "not in the pool". */
static int get_missed(const char *prog, struct kvpool_client *c, const char *hex)
{
	char *json = NULL;
	int down = 0;

	if (kvpool_stats(c, NULL, &json) == 0)
		down = cli_cluster_down_report(NULL, json, "");
	if (down > 0) {
		fprintf(stderr, "%s: %s: not found on the nodes that answered; it may be on "
			"a node that did not:\n", prog, hex);
		cli_cluster_down_report(stderr, json, "  ");
	}
	kvpool_free(json);
	return down > 0 ? CLI_EXIT_ERROR : call_failed(prog, hex, -ENOENT);
}

/* Get one block into a buffer as large as the server's largest block. */
static int get_block(const char *prog, struct kvpool_client *c, const uint8_t *key,
		     uint8_t **data, uint64_t *len)
{
	struct kvpool_limits lim;
	char hex[CLI_KEY_HEX_BYTES];
	uint8_t *buf;
	int rc;

	rc = kvpool_get_limits(c, &lim);
	if (rc)
		return call_failed(prog, "limits", rc);
	if (!lim.max_block_bytes || lim.max_block_bytes > SIZE_MAX / 2)
		lim.max_block_bytes = 64ULL << 20;
	buf = malloc(lim.max_block_bytes);
	if (!buf) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return CLI_EXIT_ERROR;
	}
	rc = kvpool_get_bytes(c, key, buf, lim.max_block_bytes, len);
	if (rc) {
		free(buf);
		if (rc == -ENOENT)
			return get_missed(prog, c, cli_key_hex(key, hex));
		return call_failed(prog, cli_key_hex(key, hex), rc);
	}
	*data = buf;
	return CLI_EXIT_OK;
}

int cli_get_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "output", required_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0], *out_path = NULL;
	uint8_t key[KVPOOL_KEY_BYTES], *data = NULL;
	struct kvpool_client *c;
	struct cli_conn conn;
	uint64_t len;
	int rc;

	cli_conn_init(&conn, "default");
	rc = parse_opts(argc, argv, get_usage, longopts, "ho:", &conn, get_opt, &out_path);
	if (rc >= 0)
		return rc;
	if (argc - optind != 1)
		return cli_usage_error(prog, "want exactly one KEY");
	if (cli_key_parse(argv[optind], key))
		return cli_usage_error(prog, "bad key '%s'", argv[optind]);
	rc = cli_connect(&conn, prog, &c);
	if (rc)
		return cli_connect_exit_code(rc);
	rc = get_block(prog, c, key, &data, &len);
	kvpool_close(c);
	if (rc)
		return rc;
	rc = write_out(prog, out_path, data, len);
	free(data);
	return rc;
}

/* ---- exists, delete: one status per key --------------------------------- */

static const char exists_usage[] =
	"usage: kvpool exists KEY... [--server URL] [--namespace NS]\n"
	"\n"
	"Say for each KEY whether the pool holds it. Exit 1 if any is missing.\n"
	"\n"
	CLI_COMMON_HELP;

static const char delete_usage[] =
	"usage: kvpool delete KEY... [--server URL] [--namespace NS]\n"
	"\n"
	"Remove each KEY and every block stored after it in its chain.\n"
	"Exit 1 if any KEY was not in the pool.\n"
	"\n"
	CLI_COMMON_HELP;

typedef int (*keys_call_fn)(struct kvpool_client *c, const void *keys,
			    size_t count, int *statuses);

/* Run a per-key call (exists or delete) and print one line per key with
 * `yes` or `no` (for -ENOENT) or the error. */
static int keys_cmd(int argc, char **argv, const char *usage, keys_call_fn call,
		    const char *yes, const char *no)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	uint8_t (*keys)[KVPOOL_KEY_BYTES];
	char hex[CLI_KEY_HEX_BYTES];
	struct kvpool_client *c;
	struct cli_conn conn;
	int rc, *st, exit_code = CLI_EXIT_OK;
	size_t n;

	cli_conn_init(&conn, "default");
	rc = parse_opts(argc, argv, usage, longopts, "h", &conn, NULL, NULL);
	if (rc >= 0)
		return rc;
	rc = parse_keys(prog, argc, argv, optind, &keys, &n);
	if (rc)
		return rc;
	st = calloc(n, sizeof(*st));
	rc = st ? cli_connect(&conn, prog, &c) : -ENOMEM;
	if (rc) {
		if (!st)
			fprintf(stderr, "%s: out of memory\n", prog);
		free(st);
		free(keys);
		return st ? cli_connect_exit_code(rc) : CLI_EXIT_ERROR;
	}
	rc = call(c, keys, n, st);
	kvpool_close(c);
	if (rc && rc != -EINPROGRESS) {
		exit_code = call_failed(prog, "request failed", rc);
		goto out_free;
	}
	for (size_t i = 0; i < n; i++) {
		cli_key_hex(keys[i], hex);
		if (!st[i]) {
			printf("%s %s\n", hex, yes);
		} else if (st[i] == -EINPROGRESS) {
			/* a node that may hold it did not answer; this process ends, so
			 * the handle cannot finish it there */
			printf("%s not %s everywhere: a node that may hold it did not answer; run it "
			       "again when the node is back\n", hex, yes);
			exit_code = CLI_EXIT_ERROR;
		} else if (st[i] == -ENOENT) {
			printf("%s %s\n", hex, no);
			exit_code = exit_code == CLI_EXIT_OK ? CLI_EXIT_MISS : exit_code;
		} else {
			printf("%s error: %s\n", hex, cli_strerror(st[i]));
			exit_code = CLI_EXIT_ERROR;
		}
	}
out_free:
	free(st);
	free(keys);
	return exit_code;
}

int cli_exists_main(int argc, char **argv)
{
	return keys_cmd(argc, argv, exists_usage, kvpool_exists, "present", "missing");
}

int cli_delete_main(int argc, char **argv)
{
	return keys_cmd(argc, argv, delete_usage, kvpool_delete, "deleted", "not found");
}

/* ---- match ------------------------------------------------------------- */

static const char match_usage[] =
	"usage: kvpool match KEY... [--lease-ms N] [--wait-ms MS] [--want N] [--retain-ms MS]\n"
	"                    [--server URL] [--namespace NS]\n"
	"\n"
	"Prefix match: how many leading KEYs of the chain KEY... the pool holds.\n"
	"Exit 1 unless the first N keys (--want; default all) are held.\n"
	"\n"
	"  --lease-ms N        pin the matched blocks for N ms (default 0: no lease)\n"
	"  --wait-ms MS        if fewer than N leading blocks are there, let the server\n"
	"                      wait up to MS ms for puts that complete them, then\n"
	"                      answer what is there (protocol 2; capped at the\n"
	"                      server's max_match_wait_ms). The call may take\n"
	"                      --timeout-ms plus MS\n"
	"  --want N            leading blocks needed (1..number of KEYs; default all)\n"
	"  --retain-ms MS      extend the matched blocks' retention to MS ms from now\n"
	"                      (protocol 2; capped at the server's max_retain_ms)\n"
	"\n"
	"With any of the last three, or when the server says more than the match,\n"
	"a second line gives the blocks present, the lease and retention granted,\n"
	"and the server's flags in words (lease cut, waited, wait timed out, wait\n"
	"refused, wait cut, wait ended, retention over budget, retention cut).\n"
	CLI_COMMON_HELP;

struct match_args {
	struct kvpool_match_opts o;
	int v2_asked;       /* --wait-ms, --want or --retain-ms given */
};

/* match's own options. */
static int match_opt(int opt, const char *arg, void *ctx)
{
	struct match_args *a = ctx;
	uint64_t v;

	switch (opt) {
	case OPT_LEASE_MS:
		return ms_opt("kvpool match", "--lease-ms", arg, &a->o.lease_ms);
	case OPT_WAIT_MS:
		a->v2_asked = 1;
		return ms_opt("kvpool match", "--wait-ms", arg, &a->o.wait_ms);
	case OPT_RETAIN_MS:
		a->v2_asked = 1;
		return ms_opt("kvpool match", "--retain-ms", arg, &a->o.retain_ms);
	case OPT_WANT:
		if (cli_parse_u64(arg, 1, UINT32_MAX, &v)) {
			cli_usage_error("kvpool match", "--want wants a count of blocks (1 or more), "
					"not '%s'", arg);
			return -EINVAL;
		}
		a->v2_asked = 1;
		a->o.want = (uint32_t)v;
		return 1;
	default:
		return 0;
	}
}

/* The MATCH flags in words, into buf[0..len) ("none" when 0). */
static void match_flag_words(uint32_t flags, char *buf, size_t len)
{
	static const struct {
		uint32_t bit;
		const char *word;
	} names[] = {
		{ KVPOOL_MATCH_LEASE_CUT, "lease cut" },
		{ KVPOOL_MATCH_WAITED, "waited" },
		{ KVPOOL_MATCH_WAIT_TIMEOUT, "wait timed out" },
		{ KVPOOL_MATCH_WAIT_REFUSED, "wait refused" },
		{ KVPOOL_MATCH_WAIT_CLAMPED, "wait cut to max_match_wait_ms" },
		{ KVPOOL_MATCH_WAIT_ENDED, "wait ended by the server" },
		{ KVPOOL_MATCH_RETAIN_BUDGET, "retention over budget" },
		{ KVPOOL_MATCH_RETAIN_CLAMPED, "retention cut to max_retain_ms" },
	};

	buf[0] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (flags & names[i].bit)
			add_word(buf, len, names[i].word);
	if (!buf[0])
		snprintf(buf, len, "none");
}

/* The second line of `kvpool match`: what the server said beyond the run. */
static void match_print_detail(const struct kvpool_match_result *r, uint16_t version)
{
	char words[256];

	if (version < 2) {
		printf("server speaks protocol 1 only: --wait-ms, --want and --retain-ms were "
		       "not sent\n");
		return;
	}
	match_flag_words(r->flags, words, sizeof(words));
	printf("present %zu, lease %u ms, retained %zu for %u ms, flags: %s\n", r->present,
	       r->lease_ms, r->retained, r->retain_ms, words);
}

int cli_match_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "lease-ms", required_argument, NULL, OPT_LEASE_MS },
		{ "wait-ms", required_argument, NULL, OPT_WAIT_MS },
		{ "want", required_argument, NULL, OPT_WANT },
		{ "retain-ms", required_argument, NULL, OPT_RETAIN_MS },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	uint8_t (*keys)[KVPOOL_KEY_BYTES];
	struct kvpool_match_result r;
	struct match_args a = { { 0 }, 0 };
	struct kvpool_limits lim = { 0 };
	struct kvpool_client *c;
	struct cli_conn conn;
	size_t n, want;
	int rc;

	cli_conn_init(&conn, "default");
	rc = parse_opts(argc, argv, match_usage, longopts, "h", &conn, match_opt, &a);
	if (rc >= 0)
		return rc;
	rc = parse_keys(prog, argc, argv, optind, &keys, &n);
	if (rc)
		return rc;
	if (a.o.want > n) {
		free(keys);
		return cli_usage_error(prog, "--want %u is more than the %zu keys given", a.o.want,
				       n);
	}
	want = a.o.want ? a.o.want : n;
	rc = cli_connect(&conn, prog, &c);
	if (rc) {
		free(keys);
		return cli_connect_exit_code(rc);
	}
	/* The limits (the protocol version, for the detail line) are read
	 * before the match: a server that answers a wait and then closes (a
	 * drain on SIGTERM) must not turn that answer into a connection error. */
	rc = kvpool_get_limits(c, &lim);
	if (rc == 0)
		rc = kvpool_match_ex(c, keys, n, &a.o, &r);
	kvpool_close(c);
	free(keys);
	if (rc)
		return call_failed(prog, "match", rc);
	printf("matched %zu of %zu\n", r.matched, n);
	if (a.v2_asked || r.flags || r.present != r.matched || r.retained)
		match_print_detail(&r, lim.protocol_version);
	return r.matched >= want ? CLI_EXIT_OK : CLI_EXIT_MISS;
}

/* ---- ping -------------------------------------------------------------- */

static const char ping_usage[] =
	"usage: kvpool ping [--server URL] [--namespace NS]\n"
	"\n"
	"Check that the server answers, and print the round-trip time. On a\n"
	"cluster URL every node is asked and listed (up, or DOWN and why); the\n"
	"exit code is non-zero when any node does not answer, and 1 when the\n"
	"server answers but refuses this client (a token it does not take, a\n"
	"tls_only port reached without tls://); a server that only asks for a\n"
	"token when none is set is a pong (exit 0).\n"
	"\n"
	CLI_COMMON_HELP;

int cli_ping_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	struct kvpool_client *c;
	struct cli_conn conn;
	uint64_t rtt_us;
	int rc;

	cli_conn_init(&conn, "default");
	rc = parse_opts(argc, argv, ping_usage, longopts, "h", &conn, NULL, NULL);
	if (rc >= 0)
		return rc;
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	{
		struct kvpool_options opts = { .timeout_ms = conn.timeout_ms };
		const char *token = getenv("KVPOOL_TOKEN");
		struct timespec t0, t1;

		opts.token = token && *token ? token : NULL;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = kvpool_connect(conn.url, conn.ns, &opts, &c);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		/* PING needs no token: a server that refuses the HELLO has
		 * answered all the same. Without a token, "requires a token" is
		 * what a liveness check expects (exit 0); any other refusal - a
		 * token it does not take, a tls_only port reached in plaintext,
		 * a token sent in plaintext - means this client's settings do
		 * not work there: exit 1, as for any refusal. */
		if (rc == -EACCES) {
			bool liveness = !opts.token &&
					strstr(kvpool_last_server_message(), "requires a token");

			rtt_us = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000 +
					    (t1.tv_nsec - t0.tv_nsec) / 1000);
			printf("pong from %s: %" PRIu64 " us (connect and hello; the hello was "
			       "refused: %s)\n", conn.url, rtt_us, cli_reason(rc));
			if (liveness)
				return CLI_EXIT_OK;
			fprintf(stderr, "%s: %s answers but refuses this client: %s\n", prog, conn.url,
				cli_reason(rc));
			return CLI_EXIT_MISS;
		}
		if (rc) {
			char why[768];

			fprintf(stderr, "%s: %s\n", prog, cli_connect_error(&conn, rc, why, sizeof(why)));
			return cli_connect_exit_code(rc);
		}
	}
	rc = kvpool_ping(c, &rtt_us);
	if (cli_is_cluster_url(conn.url) && (rc == 0 || rc == -EHOSTDOWN)) {
		/* a pool of several nodes: each node, and fail if one is down */
		char *json = NULL;
		int down = -1;

		if (kvpool_stats(c, NULL, &json) == 0) {
			printf("%s %s:\n", rc ? "not every node of" : "pong from every node of",
			       conn.url);
			down = cli_cluster_nodes_report(stdout, json, "  ");
			kvpool_free(json);
		}
		kvpool_close(c);
		if (rc || down != 0) {
			fprintf(stderr, "%s: %s: %s\n", prog, conn.url,
				down > 0 ? "some nodes are down or refuse (listed above)"
					 : kvpool_strerror(rc));
			return CLI_EXIT_ERROR;
		}
		printf("slowest round trip %" PRIu64 " us\n", rtt_us);
		return CLI_EXIT_OK;
	}
	kvpool_close(c);
	if (rc)
		return call_failed(prog, "ping", rc);
	printf("pong from %s: %" PRIu64 " us\n", conn.url, rtt_us);
	return CLI_EXIT_OK;
}
