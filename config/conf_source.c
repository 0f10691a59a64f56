/*
 * conf_source.c - where kvpoold's settings come from: INI files (libinih),
 * command-line flags, KVPOOL_* environment variables, and conf_load, which
 * applies them in order (default < file < env < flag) and validates.
 */
#include "conf_impl.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#include <ini.h>

/* ---- INI files ------------------------------------------------------------
 * Parsed by libinih (ini_parse_stream) from the reader below, which hands
 * inih one whole line per call, so inih's line numbers are the file's, and
 * cleans it first so that inih's build options do not show through:
 *   - a UTF-8 byte order mark on line 1 and leading blanks are dropped
 *     (indented keys are plain keys, not inih continuation lines);
 *   - a comment line becomes empty, and an inline comment - a '#' or ';'
 *     after a blank, the same for both (inih knows only ';') - is cut off
 *     with the blanks before it;
 *   - a line inih cannot take whole is refused, not split: more bytes
 *     besides its "\n" or "\r\n" than inih's buffer holds with its NUL
 *     (199 in Debian's build, INI_MAX_LINE 200). So is a NUL byte, and a
 *     section line with text after its ']' (inih would ignore the text).
 * The handler adds the rest: keys only in [kvpoold] or before any section,
 * each key once per file. The first error found stops the reading.
 */

struct load_ctx {
	struct conf *conf;      /* the copy being filled */
	const char *path;
	FILE *fp;
	int lineno;             /* of the line last handed to inih */
	int set_on[CONF_SETTINGS_MAX]; /* line that set each setting, 0 if none */
	int err_line;           /* first line with an error, 0 if none */
	int rc;                 /* its error */
	char err[512];          /* its message */
};

/* Record the error of the current line, if it is the first. */
__attribute__((format(printf, 3, 4)))
static void load_fail(struct load_ctx *ctx, int rc, const char *fmt, ...)
{
	va_list ap;

	if (ctx->err_line)
		return;
	ctx->err_line = ctx->lineno;
	ctx->rc = rc;
	va_start(ap, fmt);
	vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
	va_end(ap);
}

static void load_syntax_error(struct load_ctx *ctx)
{
	load_fail(ctx, -EINVAL, "%s:%d: syntax error (expected 'key = value' or '[" CONF_SECTION
		  "]')", ctx->path, ctx->lineno);
}

/* Read the next line of fp into buf[0..cap) without its "\n" or "\r\n",
 * NUL-terminated. Returns its length in bytes, or cap if it does not fit
 * (reading stops right there, so an endless line such as /dev/zero's
 * fails at once; buf keeps its start), or -1 at the end of the file or on
 * a read error. Sets *nul if the line holds a NUL. */
static long read_line(FILE *fp, char *buf, size_t cap, bool *nul)
{
	size_t len = 0;
	int ch, next;

	while ((ch = getc(fp)) != EOF && ch != '\n') {
		if (ch == '\r') {
			next = getc(fp);
			if (next == '\n' || next == EOF)
				break;
			ungetc(next, fp);
		}
		if (len + 1 < cap)
			buf[len] = (char)ch;
		len++;
		*nul |= ch == '\0';
		if (len == cap)
			break; /* too long: the caller refuses the line */
	}
	if (ch == EOF && len == 0)
		return -1;
	buf[len < cap ? len : cap - 1] = '\0';
	return (long)len;
}

/* Cut an inline comment ('#' or ';' after a blank) and the blanks before
 * it, and trailing blanks, off text, which starts with no blank. */
static void strip_comment(char *text)
{
	size_t n;

	for (char *p = text + 1; *text && *p; p++) {
		if ((*p == '#' || *p == ';') && (p[-1] == ' ' || p[-1] == '\t')) {
			*p = '\0';
			break;
		}
	}
	n = strlen(text);
	while (n && isspace((unsigned char)text[n - 1]))
		text[--n] = '\0';
}

/* inih reader: the next line, cleaned (see above), or NULL at the end of
 * the file or after the first error. */
static char *load_read_line(char *str, int num, void *stream)
{
	struct load_ctx *ctx = stream;
	bool nul = false;
	char *text, *close;
	long len;

	if (ctx->err_line || num < 2)
		return NULL;
	len = read_line(ctx->fp, str, (size_t)num, &nul);
	if (len < 0)
		return NULL;
	ctx->lineno++;
	if (len >= num) {
		load_fail(ctx, -EINVAL, "%s:%d: line longer than %d bytes", ctx->path, ctx->lineno,
			  num - 1);
		return NULL;
	}
	if (nul) {
		load_fail(ctx, -EINVAL, "%s:%d: NUL byte in line", ctx->path, ctx->lineno);
		return NULL;
	}
	text = str;
	if (ctx->lineno == 1 && strncmp(text, "\xef\xbb\xbf", 3) == 0)
		text += 3; /* UTF-8 byte order mark */
	text = (char *)conf_skip_space(text);
	if (*text == '#' || *text == ';')
		*text = '\0';
	strip_comment(text);
	close = strchr(text, ']');
	if (*text == '[' && (!close || close[1] != '\0')) {
		load_syntax_error(ctx);
		return NULL;
	}
	memmove(str, text, strlen(text) + 1);
	return str;
}

/* "kvpoold" in any case, blanks around it allowed; "" is the top level. */
static bool section_is_ours(const char *section)
{
	const char *p = conf_skip_space(section);
	size_t n = strlen(p);

	while (n && isspace((unsigned char)p[n - 1]))
		n--;
	return n == 0 || (n == strlen(CONF_SECTION) && strncasecmp(p, CONF_SECTION, n) == 0);
}

/* inih handler: apply one "key = value" of the current line. Returns 1,
 * or 0 with the error recorded. */
static int load_handle(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *ctx = user;
	const struct conf_setting *s;
	char source[300], msg[512];
	int rc;

	if (ctx->err_line)
		return 1; /* already failed: report the first error only */
	if (!name[0]) {
		load_syntax_error(ctx);
		return 0;
	}
	snprintf(source, sizeof(source), "%s:%d", ctx->path, ctx->lineno);
	if (!section_is_ours(section)) {
		load_fail(ctx, -ENOENT, "%s: unknown section [%.64s] (use [" CONF_SECTION
			  "] or none)", source, section);
		return 0;
	}
	s = conf_find(name);
	if (s && ctx->set_on[s - conf_settings]) {
		load_fail(ctx, -EINVAL, "%s: %s: already set on line %d (one line per key)", source,
			  s->name, ctx->set_on[s - conf_settings]);
		return 0;
	}
	rc = conf_set(ctx->conf, name, value, source, msg, sizeof(msg));
	if (rc) {
		load_fail(ctx, rc, "%s", msg);
		return 0;
	}
	ctx->set_on[s - conf_settings] = ctx->lineno; /* s is set: conf_set knew the key */
	return 1;
}

/* Parse the file into *tmp. inih goes on after a syntax error and returns
 * the first such line; ours (from the reader or the handler) may come
 * first or later: the earlier line wins. */
static int load_into(struct conf *tmp, const char *path, char *err, size_t err_len)
{
	struct load_ctx ctx = { .conf = tmp, .path = path };
	int ret, rc = 0;

	ctx.fp = fopen(path, "r");
	if (!ctx.fp) {
		rc = -errno;
		conf_err(err, err_len, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	{
		struct stat st;

		if (fstat(fileno(ctx.fp), &st) == 0 && S_ISDIR(st.st_mode)) {
			fclose(ctx.fp);
			conf_err(err, err_len, "%s: is a directory: the configuration is a file "
				"(e.g. %s/kvpool.conf)", path, path);
			return -EISDIR;
		}
	}
	ret = ini_parse_stream(load_read_line, &ctx, load_handle, &ctx);
	if (ferror(ctx.fp)) {
		rc = -EIO;
		conf_err(err, err_len, "%s: read error", path);
	} else if (ret < 0) {
		rc = -ENOMEM;
		conf_err(err, err_len, "%s: out of memory", path);
	} else if (ret > 0 && (!ctx.err_line || ret < ctx.err_line)) {
		rc = -EINVAL;
		conf_err(err, err_len, "%s:%d: syntax error (expected 'key = value' or '[" CONF_SECTION
			"]')", path, ret);
	} else if (ctx.err_line) {
		rc = ctx.rc;
		conf_err(err, err_len, "%s", ctx.err);
	}
	fclose(ctx.fp);
	return rc;
}

int conf_load_file(struct conf *c, const char *path, char *err, size_t err_len)
{
	struct conf tmp = *c;
	int rc;

	if (!path) {
		conf_err(err, err_len, "no configuration file given");
		return -EINVAL;
	}
	rc = load_into(&tmp, path, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	return 0;
}

/* ---- command line ----------------------------------------------------------- */

struct flag {
	const char *arg;   /* the argument as typed */
	char key[64];      /* setting name: dashes turned into underscores */
	size_t name_len;   /* bytes of "--name" in arg */
	const char *value; /* NULL for --help */
};

static int unknown_flag(const char *arg, size_t len, char *err, size_t err_len)
{
	conf_err(err, err_len, "unknown flag %.*s (see --help)", (int)(len > 64 ? 64 : len), arg);
	return -ENOENT;
}

/* Read the flag at argv[*i] (and its value, which may be the next
 * argument) and advance *i past them. Errors: -ENOENT (unknown flag),
 * -EINVAL (not a flag, a missing value, a value given to --help). */
static int next_flag(int argc, char **argv, int *i, struct flag *f, char *err, size_t err_len)
{
	const char *arg = argv[*i], *eq;
	size_t len;

	if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0' || arg[2] == '-') {
		conf_err(err, err_len, "unexpected argument '%.64s' (settings are --key value)", arg);
		return -EINVAL;
	}
	eq = strchr(arg, '=');
	len = eq ? (size_t)(eq - arg) : strlen(arg);
	f->arg = arg;
	f->name_len = len;
	if (len - 2 >= sizeof(f->key) || memchr(arg + 2, '_', len - 2))
		return unknown_flag(arg, len, err, err_len);
	for (size_t k = 2; k < len; k++)
		f->key[k - 2] = arg[k] == '-' ? '_' : arg[k];
	f->key[len - 2] = '\0';
	/* known before looking for a value: "--bogus" last is unknown, not short */
	if (strcmp(f->key, "help") && strcmp(f->key, "config") && !conf_find(f->key))
		return unknown_flag(arg, len, err, err_len);
	(*i)++;
	if (strcmp(f->key, "help") == 0) {
		if (eq) {
			conf_err(err, err_len, "--help takes no value");
			return -EINVAL;
		}
		f->value = NULL;
		return 0;
	}
	if (eq) {
		f->value = eq + 1;
		return 0;
	}
	if (*i >= argc || strncmp(argv[*i], "--", 2) == 0) {
		conf_err(err, err_len, "%s: missing value", arg);
		return -EINVAL;
	}
	f->value = argv[(*i)++];
	return 0;
}

/* First pass: syntax of every flag, --help, and the --config files. */
static int args_load_configs(struct conf *tmp, int argc, char **argv, int *help, char *err,
			     size_t err_len)
{
	struct flag f;
	int rc;

	/* a value never starts with "--", so any "--help" is the flag */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0) {
			*help = 1;
			return 0;
		}
	}
	*help = 0;
	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
	}
	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
		if (strcmp(f.key, "config") == 0) {
			rc = load_into(tmp, f.value, err, err_len);
			if (rc)
				return rc;
		}
	}
	return 0;
}

/* Second pass: every other flag, on top of the files. */
static int args_apply_flags(struct conf *tmp, int argc, char **argv, char *err, size_t err_len)
{
	char source[80];
	struct flag f;
	int rc;

	for (int i = 1; i < argc;) {
		rc = next_flag(argc, argv, &i, &f, err, err_len);
		if (rc)
			return rc;
		if (strcmp(f.key, "config") == 0)
			continue;
		snprintf(source, sizeof(source), "%.*s", (int)f.name_len, f.arg);
		rc = conf_set(tmp, f.key, f.value, source, err, err_len);
		if (rc)
			return rc;
	}
	return 0;
}

int conf_from_args(struct conf *c, int argc, char **argv, int *want_help, char *err,
		   size_t err_len)
{
	struct conf tmp = *c;
	int help, rc;

	rc = args_load_configs(&tmp, argc, argv, &help, err, err_len);
	if (rc)
		return rc;
	if (help) {
		*want_help = 1;
		return 0;
	}
	rc = args_apply_flags(&tmp, argc, argv, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	*want_help = 0;
	return 0;
}

/* ---- environment ------------------------------------------------------------
 * KVPOOL_<NAME>, the name in capitals ("KVPOOL_DRAM_CAPACITY"), for
 * containers. KVPOOL_CONFIG names a file read when no --config is given.
 * Other KVPOOL_ variables are not settings (the CLI and the tests use a
 * few): they are reported on `warn`, so that a misspelt setting is seen,
 * and otherwise ignored. */


/* The setting whose variable is name[0..len) (the part after KVPOOL_):
 * capitals, digits and '_' only. */
static const struct conf_setting *env_setting(const char *name, size_t len)
{
	char key[64];

	if (len == 0 || len >= sizeof(key))
		return NULL;
	for (size_t i = 0; i < len; i++) {
		if (islower((unsigned char)name[i]))
			return NULL;
		key[i] = (char)tolower((unsigned char)name[i]);
	}
	key[len] = '\0';
	return conf_find(key);
}

/* Variables of the client side and of kvpool's own scripts that share
 * the prefix: the CLI's token, the Python binding's library path, the
 * names the container entrypoint and the test runner give our programs. A container or a unit that sets
 * them for its health check must not see a warning at every start. */
static bool env_is_client_var(const char *var, size_t len)
{
	/* read by libkvpool and the CLI, or naming kvpool's own programs for
	 * the container entrypoint and the test runner: not typos of settings */
	static const char *const client_vars[] = {
		"KVPOOL_TOKEN", "KVPOOL_LIB", "KVPOOL_CLI", "KVPOOL_TEST_DATA", "KVPOOL_URL",
		"KVPOOL_HEALTH_FILE", "KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY",
		"KVPOOL_COPYCOUNT", "KVPOOL_FUZZ_DIR",
	};

	for (size_t i = 0; i < sizeof(client_vars) / sizeof(client_vars[0]); i++)
		if (len == strlen(client_vars[i]) && strncmp(var, client_vars[i], len) == 0)
			return true;
	return false;
}

int conf_from_env(struct conf *c, char *const *envp, FILE *warn, char *err, size_t err_len)
{
	struct conf tmp = *c;
	char source[96];
	int rc;

	if (!envp)
		return 0;
	for (char *const *e = envp; *e; e++) {
		const char *var = *e, *eq = strchr(var, '=');
		const struct conf_setting *s;
		size_t len;

		if (!eq || strncmp(var, ENV_PREFIX, strlen(ENV_PREFIX)) != 0)
			continue;
		len = (size_t)(eq - var);
		if (len == strlen(ENV_CONFIG) && strncmp(var, ENV_CONFIG, len) == 0)
			continue;
		if (env_is_client_var(var, len))
			continue;
		s = env_setting(var + strlen(ENV_PREFIX), len - strlen(ENV_PREFIX));
		if (!s) {
			if (warn)
				fprintf(warn, "kvpoold: ignoring environment variable %.*s: not a "
					"setting (see --help)\n", (int)(len > 64 ? 64 : len), var);
			continue;
		}
		snprintf(source, sizeof(source), "env %.*s", (int)(len > 64 ? 64 : len), var);
		rc = conf_set(&tmp, s->name, eq + 1, source, err, err_len);
		if (rc)
			return rc;
	}
	*c = tmp;
	return 0;
}

/* The value of KVPOOL_CONFIG in envp, NULL if unset or empty. */
static const char *env_config(char *const *envp)
{
	size_t n = strlen(ENV_CONFIG);

	for (char *const *e = envp; e && *e; e++)
		if (strncmp(*e, ENV_CONFIG, n) == 0 && (*e)[n] == '=' && (*e)[n + 1])
			return *e + n + 1;
	return NULL;
}

/* Is there a --config flag in argv (either form)? */
static bool args_have_config(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
			return true;
	return false;
}

int conf_load(struct conf *c, int argc, char **argv, char *const *envp, FILE *warn,
	      int *want_help, char *err, size_t err_len)
{
	struct conf tmp;
	const char *file;
	int help, rc;

	conf_defaults(&tmp);
	rc = args_load_configs(&tmp, argc, argv, &help, err, err_len);
	if (rc)
		return rc;
	if (help) {
		*want_help = 1;
		return 0;
	}
	file = env_config(envp);
	if (file && !args_have_config(argc, argv)) {
		rc = load_into(&tmp, file, err, err_len);
		if (rc)
			return rc;
	}
	rc = conf_from_env(&tmp, envp, warn, err, err_len);
	if (rc)
		return rc;
	rc = args_apply_flags(&tmp, argc, argv, err, err_len);
	if (rc)
		return rc;
	rc = conf_validate(&tmp, err, err_len);
	if (rc)
		return rc;
	*c = tmp;
	*want_help = 0;
	return 0;
}
