/*
 * cli_opts.h - command-line conventions shared by every kvpool subcommand:
 * the connection options (--server, --namespace, --timeout-ms, --help), value
 * parsers (sizes with units, bounded integers) and exit codes.
 *
 * Exit codes: CLI_EXIT_OK (0) success, CLI_EXIT_MISS (1) a miss or a
 * refusal by the server, CLI_EXIT_ERROR (2) an error (bad usage, connection
 * failure, bad input).
 *
 * Single-threaded use (command-line parsing); cli_parse_* are pure.
 */
#ifndef KVPOOL_CLI_OPTS_H
#define KVPOOL_CLI_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

enum {
	CLI_EXIT_OK = 0,
	CLI_EXIT_MISS = 1,
	CLI_EXIT_ERROR = 2,
};

/* Long-option codes of the shared options (beyond any char). */
enum {
	CLI_OPT_SERVER = 0x100,
	CLI_OPT_NAMESPACE,
	CLI_OPT_TIMEOUT_MS,
	CLI_OPT_FIRST_LOCAL,  /* subcommands number their own options from here */
};

/* The shared entries of every subcommand's `struct option` array. */
#define CLI_COMMON_LONGOPTS                                                   \
	{ "server", required_argument, NULL, CLI_OPT_SERVER },                \
	{ "namespace", required_argument, NULL, CLI_OPT_NAMESPACE },          \
	{ "timeout-ms", required_argument, NULL, CLI_OPT_TIMEOUT_MS },        \
	{ "help", no_argument, NULL, 'h' }

/* Usage text of the shared options, for --help screens. */
#define CLI_COMMON_HELP                                                               \
	"  --server URL        pool server (default " KVPOOL_DEFAULT_URL "); several\n" \
	"                      nodes: tcp://a:7470,b:7470 or etcd://HOST:2379/CLUSTER\n" \
	"  --namespace NS      namespace, 1..255 printable ASCII bytes\n"             \
	"  --timeout-ms N      per-call timeout in milliseconds (default 10000)\n"   \
	"  -h, --help          show this help\n"

/* Where and how a subcommand connects. Strings are borrowed from argv. */
struct cli_conn {
	const char *url;
	const char *ns;
	uint32_t timeout_ms;   /* 0: the library's default */
};

/* Defaults: KVPOOL_DEFAULT_URL, namespace `default_ns`, library timeout. */
void cli_conn_init(struct cli_conn *conn, const char *default_ns);

/* The rule for namespace names, as messages state it. */
#define CLI_NS_RULE "namespace must be 1..255 printable ASCII characters without spaces"

/* Does `ns` follow CLI_NS_RULE (bytes 0x21..0x7e)? Pure; NULL is not. */
bool cli_ns_valid(const char *ns);

/* Apply one shared option `opt` with argument `arg` (from getopt_long).
 * Returns 1 if it was a shared option and was applied, 0 if `opt` is not a
 * shared option, or -EINVAL after printing "PROG: reason" for a bad value
 * (a --namespace that breaks CLI_NS_RULE, a bad --timeout-ms). */
int cli_conn_opt(struct cli_conn *conn, const char *prog, int opt, const char *arg);

/* Say for a person why connecting as `conn` failed with `err` (a result of
 * kvpool_connect) into buf[0..len), truncated to fit:
 *   -EINVAL with a bad namespace   "bad namespace \"NS\": " CLI_NS_RULE
 *   -EINVAL on an etcd:// URL      "bad etcd URL: expected etcd://HOST[:PORT][,...]/CLUSTER..."
 *   -ENXIO on an etcd:// URL       "no kvpoold is registered in etcd under kvpool/CLUSTER/nodes/..."
 *   -EINVAL, -EOPNOTSUPP, -E2BIG on a node list
 *                                  "bad node list: WHY: expected ..." (WHY: an empty entry,
 *                                  mixed schemes, a node listed twice, more than 64 nodes)
 *   -EINVAL otherwise, and -EOPNOTSUPP for a URL not starting tcp://
 *                                  "bad URL: expected tcp://, rdma:// or auto://..., a node
 *                                  list (...) or etcd://..., got 'URL'"
 *   -ENOENT                        "cannot connect to URL: host name does not resolve"
 *   anything else                  "cannot connect to URL (namespace \"NS\"): "
 *                                  and kvpool_strerror(err)
 * Pure. Returns buf. */
char *cli_connect_error(const struct cli_conn *conn, int err, char *buf, size_t len);

/* Is url a cluster URL (a node list, or etcd://)? Pure. */
bool cli_is_cluster_url(const char *url);

/* Connect as `conn` says, with the auth token in $KVPOOL_TOKEN if set
 * and not empty. On failure prints "PROG: " and the reason
 * (cli_connect_error) on stderr and returns the library's -errno (see
 * kvpool_connect), or -EINVAL for a KVPOOL_TOKEN over 1024 bytes; *out is
 * written only on success. */
int cli_connect(const struct cli_conn *conn, const char *prog, struct kvpool_client **out);

/* Parse a size: plain bytes or a number with a unit, decimals allowed:
 * B, KB/MB/GB/TB/PB (powers of 1000), KiB/MiB/GiB/TiB/PiB (powers of 1024);
 * units are case-insensitive ("64kib"). Examples: "4096", "64KiB", "1.5GiB".
 * Returns 0, -EINVAL (empty, negative, no digits, unknown unit, a fraction
 * of a byte) or -ERANGE (beyond 2^64-1). *out is written only on success. */
int cli_parse_size(const char *s, uint64_t *out_bytes);

/* Parse a decimal integer in [min, max]. Returns 0, -EINVAL (not a plain
 * decimal integer) or -ERANGE (outside [min, max]). */
int cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Parse a finite, non-negative decimal number. Returns 0 or -EINVAL. */
int cli_parse_nonneg_double(const char *s, double *out);

/* Format a byte count with a binary unit ("512 B", "64.0 KiB", "1.50 GiB")
 * into buf[0..len). Returns buf. Cannot fail (output is truncated to len). */
char *cli_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* Exit code for a library result: 0 -> CLI_EXIT_OK; a miss or a refusal
 * (-ENOENT, -ENOLINK, -ENOSPC, -EDQUOT, -EAGAIN, -EMSGSIZE, -EACCES) ->
 * CLI_EXIT_MISS; anything else -> CLI_EXIT_ERROR. */
int cli_exit_code(int err);

/* Exit code for a failed connect: a refusal by the server (-EACCES,
 * -EDQUOT, -EAGAIN) -> CLI_EXIT_MISS, as the same refusal on a call would
 * give; anything else (no server, bad URL, a name that does not resolve)
 * -> CLI_EXIT_ERROR; 0 -> CLI_EXIT_OK. */
int cli_connect_exit_code(int err);

/* Why a call failed with err: the server's own message for it when it
 * sent one (kvpool_last_server_message), else cli_strerror(err). Valid
 * until the thread's next library call. */
const char *cli_reason(int err);

/* kvpool_strerror(err) in the words a CLI user needs: -ENOSPC from a
 * request is the pool being full (kvpool_strerror also covers a
 * caller's output array, which the CLI never passes too small). Static
 * text; any thread. */
const char *cli_strerror(int err);

/* Print "PROG: MESSAGE\nTry 'PROG --help'." on stderr and return
 * CLI_EXIT_ERROR. */
__attribute__((format(printf, 2, 3)))
int cli_usage_error(const char *prog, const char *fmt, ...);

/* Print "Try 'PROG --help'." on stderr (after getopt has named a bad
 * option) and return CLI_EXIT_ERROR. */
int cli_try_help(const char *prog);

#endif /* KVPOOL_CLI_OPTS_H */
