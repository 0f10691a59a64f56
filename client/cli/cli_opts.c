/*
 * cli_opts.c - shared options, value parsers and exit codes of the kvpool CLI.
 */
#include "cli_opts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proto.h"

void cli_conn_init(struct cli_conn *conn, const char *default_ns)
{
	const char *env = getenv("KVPOOL_URL");

	/* --server wins over KVPOOL_URL, which wins over the default */
	conn->url = env && *env ? env : KVPOOL_DEFAULT_URL;
	conn->ns = default_ns;
	conn->timeout_ms = 0;
}

bool cli_ns_valid(const char *ns)
{
	return ns && proto_name_valid(ns, strlen(ns));
}

int cli_conn_opt(struct cli_conn *conn, const char *prog, int opt, const char *arg)
{
	uint64_t v;

	switch (opt) {
	case CLI_OPT_SERVER:
		conn->url = arg;
		return 1;
	case CLI_OPT_NAMESPACE:
		/* Said now, before any file is read or any server is asked. */
		if (!cli_ns_valid(arg)) {
			fprintf(stderr, "%s: bad --namespace \"%.300s\": " CLI_NS_RULE "\n", prog,
				arg);
			return -EINVAL;
		}
		conn->ns = arg;
		return 1;
	case CLI_OPT_TIMEOUT_MS:
		if (cli_parse_u64(arg, 1, UINT32_MAX, &v)) {
			fprintf(stderr, "%s: --timeout-ms wants milliseconds in 1..%u, not '%s'\n",
				prog, UINT32_MAX, arg);
			return -EINVAL;
		}
		conn->timeout_ms = (uint32_t)v;
		return 1;
	}
	return 0;
}

/* kvpool_connect says -EINVAL for a bad URL or namespace (the CLI sends no
 * token), -EOPNOTSUPP for an unknown scheme, a server speaking another
 * protocol version or an rdma:// connection this build cannot make, and
 * -ENOENT only when the host name does not resolve: each gets its own
 * words here. */
#define CLI_URL_FORMS "tcp://, tls://, rdma:// or auto:// then host[:port], a node list " \
	"(tcp://a:7470,b:7470) or etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER"

/* Why a node list is refused, in words, or NULL when nothing is seen. */
static const char *node_list_problem(const char *url, char *buf, size_t len)
{
	char scheme[16] = "tcp://", hosts[64][128];
	const char *p = url;
	size_t n = 0;

	if (strstr(url, ",,") || url[strlen(url) - 1] == ',' || url[0] == ',')
		return "an empty entry in the node list";
	while (*p && n < 64) {
		size_t k = strcspn(p, ",");
		const char *sep = memmem(p, k, "://", 3);
		const char *host = sep ? sep + 3 : p;
		size_t hl = k - (size_t)(host - p);

		if (sep) {
			size_t sl = (size_t)(sep - p) + 3;

			if (sl >= sizeof(scheme))
				return "an unknown scheme in the node list";
			if (n == 0) {
				snprintf(scheme, sizeof(scheme), "%.*s", (int)sl, p);
			} else if (strlen(scheme) != sl || strncasecmp(scheme, p, sl) != 0) {
				snprintf(buf, len, "it mixes %s and %.*s: every node must use the same "
					 "scheme", scheme, (int)sl, p);
				return buf;
			}
		}
		if (!strncasecmp(scheme, "etcd://", 7))
			return "etcd:// names one cluster, not a node of a list";
		snprintf(hosts[n], sizeof(hosts[n]), "%.*s", (int)(hl < 127 ? hl : 127), host);
		for (size_t i = 0; i < n; i++)
			if (!strcasecmp(hosts[i], hosts[n])) {
				snprintf(buf, len, "node %.127s is listed twice", hosts[n]);
				return buf;
			}
		n++;
		p += k + (p[k] == ',');
	}
	return NULL;
}

bool cli_is_cluster_url(const char *url)
{
	return url && (strchr(url, ',') || strncasecmp(url, "etcd://", 7) == 0);
}

char *cli_connect_error(const struct cli_conn *conn, int err, char *buf, size_t len)
{
	const char *url = conn->url ? conn->url : "";
	const char *ns = conn->ns ? conn->ns : "";
	bool known = strncasecmp(url, "tcp://", 6) == 0 || strncasecmp(url, "rdma://", 7) == 0 ||
		     strncasecmp(url, "auto://", 7) == 0 || strncasecmp(url, "tls://", 6) == 0;
	bool etcd = strncasecmp(url, "etcd://", 7) == 0, list = !etcd && strchr(url, ',');
	char why[256];

	if (err == -EINVAL && !cli_ns_valid(conn->ns)) {
		snprintf(buf, len, "bad namespace \"%.300s\": " CLI_NS_RULE, ns);
	} else if (etcd && err == -EINVAL) {
		snprintf(buf, len, "bad etcd URL: expected etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER "
			 "(CLUSTER: 1..64 of A-Z a-z 0-9 . _ -; up to 8 etcd members), got '%.300s'",
			 url);
	} else if (etcd && err == -ENXIO) {
		const char *name = strchr(url + 7, '/');

		snprintf(buf, len, "no kvpoold is registered in etcd under kvpool/%.80s/nodes/ "
			 "(%.300s): check the cluster name, and that the nodes run with --cluster "
			 "%.300s", name ? name + 1 : "?", url, url);
	} else if (list && (err == -EINVAL || err == -EOPNOTSUPP || err == -E2BIG)) {
		const char *p = err == -E2BIG ? "more than 64 nodes" :
						node_list_problem(url, why, sizeof(why));

		snprintf(buf, len, "bad node list%s%s: expected " CLI_URL_FORMS ", got '%.300s'",
			 p ? ": " : "", p ? p : "", url);
	} else if (err == -EINVAL && kvpool_last_server_message()[0]) {
		/* the URL parsed; what failed is named by libkvpool (a TLS CA,
		 * certificate or key file that does not load, a key that does
		 * not match its certificate) */
		snprintf(buf, len, "cannot connect to %.300s: %.400s", url,
			 kvpool_last_server_message());
	} else if (err == -EINVAL || (err == -EOPNOTSUPP && !known && !etcd && !list)) {
		snprintf(buf, len, "bad URL: expected " CLI_URL_FORMS "%s, got '%.300s'",
			 err == -EOPNOTSUPP ? " (unknown scheme)" : "", url);
	} else if (err == -ENOENT) {
		snprintf(buf, len, "cannot connect to %.300s: host name does not resolve", url);
	} else if (kvpool_last_server_message()[0]) {
		/* the server's own reason, word for word */
		snprintf(buf, len, "%.300s (namespace \"%.300s\"): %.400s", url, ns,
			 kvpool_last_server_message());
	} else {
		snprintf(buf, len, "cannot connect to %.300s (namespace \"%.300s\"): %s", url, ns,
			 kvpool_strerror(err));
	}
	return buf;
}

/* The auth token comes from the environment (KVPOOL_TOKEN), not from a
 * flag, so that it never shows in ps or a shell history. */
int cli_connect(const struct cli_conn *conn, const char *prog, struct kvpool_client **out)
{
	struct kvpool_options opts = { .timeout_ms = conn->timeout_ms };
	const char *token = getenv("KVPOOL_TOKEN");
	char why[768];
	int rc;

	if (token && *token) {
		if (strlen(token) > 1024) {
			fprintf(stderr, "%s: KVPOOL_TOKEN is longer than 1024 bytes\n", prog);
			return -EINVAL;
		}
		opts.token = token;
	}
	rc = kvpool_connect(conn->url, conn->ns, &opts, out);
	if (rc)
		fprintf(stderr, "%s: %s\n", prog, cli_connect_error(conn, rc, why, sizeof(why)));
	return rc;
}

/* Multiplier of a size unit (case-insensitive), 0 if unknown. "" is bytes. */
static uint64_t size_unit(const char *u)
{
	static const char *const names[] = { "K", "M", "G", "T", "P" };
	uint64_t dec = 1000, bin = 1024;

	if (!*u || !strcasecmp(u, "B"))
		return 1;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char d[4], b[4];

		snprintf(d, sizeof(d), "%sB", names[i]);
		snprintf(b, sizeof(b), "%siB", names[i]);
		if (!strcasecmp(u, d))
			return dec;
		if (!strcasecmp(u, b))
			return bin;
		dec *= 1000;
		bin *= 1024;
	}
	return 0;
}

/* Exact integer arithmetic: whole part and up to 18 fraction digits. */
int cli_parse_size(const char *s, uint64_t *out_bytes)
{
	uint64_t whole = 0, frac = 0, frac_scale = 1, mult, bytes, frac_bytes;
	const char *p = s;
	int digits = 0;

	if (!s)
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++, digits++) {
		uint64_t d = (uint64_t)(*p - '0');

		if (whole > UINT64_MAX / 10 || whole * 10 > UINT64_MAX - d)
			return -ERANGE;
		whole = whole * 10 + d;
	}
	if (*p == '.') {
		for (p++; isdigit((unsigned char)*p); p++, digits++) {
			if (frac_scale >= 1000000000000000000ULL)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
			frac_scale *= 10;
		}
	}
	if (!digits)
		return -EINVAL;
	while (*p == ' ')
		p++;
	mult = size_unit(p);
	if (!mult)
		return -EINVAL;
	if (whole > UINT64_MAX / mult)
		return -ERANGE;
	bytes = whole * mult;
	/* frac / frac_scale * mult must be a whole number of bytes */
	if (frac) {
		unsigned __int128 fb = (unsigned __int128)frac * mult;

		if (fb % frac_scale)
			return -EINVAL;
		frac_bytes = (uint64_t)(fb / frac_scale);
		if (bytes > UINT64_MAX - frac_bytes)
			return -ERANGE;
		bytes += frac_bytes;
	}
	*out_bytes = bytes;
	return 0;
}

int cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int cli_parse_nonneg_double(const char *s, double *out)
{
	char *end;
	double d;

	if (!s || !(isdigit((unsigned char)s[0]) || s[0] == '.'))
		return -EINVAL;
	errno = 0;
	d = strtod(s, &end);
	if (*end || errno || !isfinite(d) || d < 0)
		return -EINVAL;
	*out = d;
	return 0;
}

char *cli_fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)bytes;
	int u = -1;

	if (bytes < 1024) {
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
		return buf;
	}
	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, v < 10 ? "%.2f %s" : "%.1f %s", v, units[u]);
	return buf;
}

const char *cli_strerror(int err)
{
	if (err == -ENOSPC)
		return "pool full: nothing evictable (retained, leased or in-flight blocks fill it)";
	return kvpool_strerror(err);
}

const char *cli_reason(int err)
{
	const char *m = kvpool_last_server_message();

	return err && m[0] ? m : cli_strerror(err);
}

int cli_connect_exit_code(int err)
{
	/* the server answered and refused: as the same refusal on a call */
	if (err == -EACCES || err == -EDQUOT || err == -EAGAIN)
		return CLI_EXIT_MISS;
	return err ? CLI_EXIT_ERROR : CLI_EXIT_OK;
}

int cli_exit_code(int err)
{
	switch (err) {
	case 0:
		return CLI_EXIT_OK;
	case -ENOENT:
	case -ENOLINK:
	case -ENOSPC:
	case -EDQUOT:
	case -EAGAIN:
	case -EMSGSIZE:
	case -EACCES:
		return CLI_EXIT_MISS;
	}
	return CLI_EXIT_ERROR;
}

int cli_usage_error(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s --help'.\n", prog);
	return CLI_EXIT_ERROR;
}

int cli_try_help(const char *prog)
{
	fprintf(stderr, "Try '%s --help'.\n", prog);
	return CLI_EXIT_ERROR;
}
