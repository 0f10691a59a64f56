/*
 * cli.h - the subcommands of the kvpool command-line tool.
 *
 * Each takes the arguments after "kvpool" (argv[0] is "kvpool SUB", used in
 * messages), parses its own options, does its work and returns the process
 * exit code: 0 success, 1 a miss or a refusal, 2 an error (see cli_opts.h).
 * Single-threaded callers only (they use getopt).
 */
#ifndef KVPOOL_CLI_H
#define KVPOOL_CLI_H

#include <stddef.h>
#include <stdint.h>

int cli_stats_main(int argc, char **argv);   /* cli_stats.c */
int cli_put_main(int argc, char **argv);     /* cli_ops.c ... */
int cli_get_main(int argc, char **argv);
int cli_exists_main(int argc, char **argv);
int cli_match_main(int argc, char **argv);
int cli_delete_main(int argc, char **argv);
int cli_ping_main(int argc, char **argv);
int cli_replay_main(int argc, char **argv);  /* cli_replay.c */
int cli_bench_main(int argc, char **argv);   /* cli_bench.c */
int cli_health_main(int argc, char **argv);  /* cli_admin.c */
int cli_drop_main(int argc, char **argv);

/* Split an admin HTTP address ("http://HOST:PORT", "HOST:PORT",
 * "[V6]:PORT", or "HOST" for port 7471) into host[0..host_len) and
 * port[0..port_len). Pure. Returns 0 or -EINVAL. */
int cli_admin_parse_url(const char *url, char *host, size_t host_len, char *port,
			size_t port_len);

/* GET path (HTTP/1.0) from the admin server host:port within timeout_ms:
 * *status receives the HTTP status, body[0..cap) the start of the body
 * (NUL-terminated; replies are read up to 64 KiB). Blocks. Returns 0,
 * -ENOENT (host does not resolve), -ETIMEDOUT, -EPROTO (not an HTTP
 * reply), -ENOMEM or the -errno of connect/recv. */
int cli_admin_http_get(const char *host, const char *port, const char *path, uint32_t timeout_ms,
		       int *status, char *body, size_t cap);

#endif /* KVPOOL_CLI_H */
