/*
 * cli_admin.c - operator subcommands: `kvpool health` (for scripts and a
 * container HEALTHCHECK) and `kvpool drop-namespace NAME`.
 */
#include "cli.h"
#include "cli_opts.h"
#include "cli_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEALTH_TIMEOUT_MS 5000
#define HTTP_MAX_REPLY_BYTES 65536
#define ADMIN_DEFAULT_PORT "7471"

enum { OPT_ADMIN = CLI_OPT_FIRST_LOCAL };

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait for `events` on fd until the deadline (CLOCK_MONOTONIC ms).
 * Returns 0, or -ETIMEDOUT. */
static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	uint64_t now = now_ms();
	int n;

	do {
		n = poll(&p, 1, now < deadline_ms ? (int)(deadline_ms - now) : 0);
		now = now_ms();
	} while (n < 0 && errno == EINTR);
	return n > 0 ? 0 : -ETIMEDOUT;
}

/* Split "http://HOST:PORT", "HOST:PORT", "[V6]:PORT" or "HOST" (port
 * 7471) into host[] and port[]. Returns 0 or -EINVAL. */
int cli_admin_parse_url(const char *url, char *host, size_t host_len, char *port, size_t port_len)
{
	const char *p = url, *colon, *end;
	size_t n;

	if (!strncasecmp(p, "http://", 7))
		p += 7;
	end = p + strcspn(p, "/");
	if (*p == '[') {
		const char *close = memchr(p, ']', (size_t)(end - p));

		if (!close)
			return -EINVAL;
		n = (size_t)(close - p - 1);
		colon = close + 1 < end && close[1] == ':' ? close + 1 : NULL;
		if (!colon && close + 1 != end)
			return -EINVAL;
		p++;
	} else {
		colon = memchr(p, ':', (size_t)(end - p));
		n = (size_t)((colon ? colon : end) - p);
	}
	if (n == 0 || n >= host_len)
		return -EINVAL;
	memcpy(host, p, n);
	host[n] = '\0';
	if (!colon) {
		snprintf(port, port_len, "%s", ADMIN_DEFAULT_PORT);
		return 0;
	}
	n = (size_t)(end - colon - 1);
	if (n == 0 || n >= port_len || strspn(colon + 1, "0123456789") < n)
		return -EINVAL;
	memcpy(port, colon + 1, n);
	port[n] = '\0';
	return 0;
}

/* Connect a TCP socket to host:port before the deadline. Returns the fd
 * or -errno (-ENOENT: the name does not resolve). */
static int tcp_connect(const char *host, const char *port, uint64_t deadline_ms)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
	int fd, err = 0;
	socklen_t len = sizeof(err);

	if (getaddrinfo(host, port, &hints, &ai))
		return -ENOENT;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		err = -errno;
		freeaddrinfo(ai);
		return err;
	}
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)
		err = -errno;
	else if (wait_fd(fd, POLLOUT, deadline_ms))
		err = -ETIMEDOUT;
	else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err)
		err = -(err ? err : errno);
	freeaddrinfo(ai);
	if (err) {
		close(fd);
		return err;
	}
	return fd;
}

/* GET path from the admin server at host:port (HTTP/1.0, the server
 * closes after its reply). *status gets the HTTP status and body[0..cap)
 * the start of the body, NUL-terminated. Returns 0 or -errno
 * (-ETIMEDOUT, -EPROTO for a reply that is not HTTP). */
int cli_admin_http_get(const char *host, const char *port, const char *path, uint32_t timeout_ms,
		       int *status, char *body, size_t cap)
{
	uint64_t deadline = now_ms() + timeout_ms;
	char *buf = malloc(HTTP_MAX_REPLY_BYTES + 1), req[512], *sep;
	size_t have = 0;
	int fd, n, code, rc = 0;
	ssize_t r;

	if (!buf)
		return -ENOMEM;
	fd = tcp_connect(host, port, deadline);
	if (fd < 0) {
		free(buf);
		return fd;
	}
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n",
		     path, host);
	if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
		rc = -EIO;
	while (rc == 0 && have < HTTP_MAX_REPLY_BYTES) {
		if (wait_fd(fd, POLLIN, deadline)) {
			rc = -ETIMEDOUT;
			break;
		}
		r = recv(fd, buf + have, HTTP_MAX_REPLY_BYTES - have, 0);
		if (r == 0)
			break;
		if (r < 0 && errno != EINTR && errno != EAGAIN)
			rc = -errno;
		if (r > 0)
			have += (size_t)r;
	}
	close(fd);
	buf[have] = '\0';
	if (rc == 0 && (sscanf(buf, "HTTP/1.%*d %d", &code) != 1 || !(sep = strstr(buf, "\r\n\r\n"))))
		rc = -EPROTO;
	if (rc == 0) {
		*status = code;
		snprintf(body, cap, "%s", sep + 4);
	}
	free(buf);
	return rc;
}

/* ---- kvpool health --------------------------------------------------------- */

static const char health_usage[] =
	"usage: kvpool health [--server URL | --admin HOST:PORT] [--timeout-ms N]\n"
	"\n"
	"Exit 0 when the pool serves, 1 otherwise (also when it cannot be\n"
	"reached), for scripts and container health checks.\n"
	"\n"
	"By default it connects to the data port and sends a PING (a server that\n"
	"requires a token and refuses the HELLO still counts: it answered).\n"
	"With --admin it asks the admin HTTP server's /healthz instead, which also\n"
	"says 503 while the pool starts (NVMe rebuild) or drains.\n"
	"\n"
	"  --admin HOST:PORT   admin HTTP address (http:// optional; port 7471 by default)\n"
	CLI_COMMON_HELP;

/* /healthz: 200 is healthy. */
static int health_admin(const char *prog, const char *admin, uint32_t timeout_ms)
{
	char host[256], port[16], body[256];
	int status = 0, rc;

	if (cli_admin_parse_url(admin, host, sizeof(host), port, sizeof(port))) {
		fprintf(stderr, "%s: bad --admin '%s': want HOST:PORT\n", prog, admin);
		return 1;
	}
	rc = cli_admin_http_get(host, port, "/healthz", timeout_ms, &status, body, sizeof(body));
	if (rc) {
		printf("unhealthy: cannot reach http://%s:%s/healthz: %s\n", host, port,
		       rc == -ENOENT ? "host name does not resolve" : strerror(-rc));
		return 1;
	}
	body[strcspn(body, "\r\n")] = '\0';
	printf("%s: %s (HTTP %d)\n", status == 200 ? "healthy" : "unhealthy", body, status);
	return status == 200 ? 0 : 1;
}

/* The data port: a HELLO and a PING answered. */
static int health_data(const struct cli_conn *conn, uint32_t timeout_ms)
{
	struct kvpool_options opts = { .timeout_ms = timeout_ms };
	struct kvpool_client *c;
	uint64_t rtt_us = 0;
	char why[768];
	int rc = kvpool_connect(conn->url, conn->ns, &opts, &c);

	if (rc == -EACCES) {
		printf("healthy: %s answers (hello refused without a token)\n", conn->url);
		return 0;
	}
	if (rc) {
		printf("unhealthy: %s\n", cli_connect_error(conn, rc, why, sizeof(why)));
		return 1;
	}
	rc = kvpool_ping(c, &rtt_us);
	if (cli_is_cluster_url(conn->url) && (rc == 0 || rc == -EHOSTDOWN)) {
		/* every node must answer: a pool with a node down is not healthy */
		char *json = NULL;
		int down = -1;

		if (kvpool_stats(c, NULL, &json) == 0) {
			printf("%s: %s\n", rc ? "unhealthy" : "healthy", conn->url);
			down = cli_cluster_nodes_report(stdout, json, "  ");
			kvpool_free(json);
		}
		kvpool_close(c);
		if (rc || down != 0) {
			if (down < 0)
				printf("unhealthy: %s: %s\n", conn->url, kvpool_strerror(rc));
			return 1;
		}
		printf("every node answers; slowest round trip %" PRIu64 " us\n", rtt_us);
		return 0;
	}
	kvpool_close(c);
	if (rc) {
		printf("unhealthy: %s: ping failed: %s\n", conn->url, kvpool_strerror(rc));
		return 1;
	}
	printf("healthy: %s answers in %" PRIu64 " us\n", conn->url, rtt_us);
	return 0;
}

int cli_health_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "admin", required_argument, NULL, OPT_ADMIN },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0], *admin = NULL;
	struct cli_conn conn;
	int opt, rc;

	cli_conn_init(&conn, "default");
	optind = 0;
	/* Exit 2 means "reserved" to container health checks: a usage
	 * mistake is unhealthy (1) too. */
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		rc = cli_conn_opt(&conn, prog, opt, optarg);
		if (rc < 0)
			return 1;
		if (rc)
			continue;
		if (opt == OPT_ADMIN) {
			admin = optarg;
		} else if (opt == 'h') {
			fputs(health_usage, stdout);
			return 0;
		} else {
			cli_try_help(prog);
			return 1;
		}
	}
	if (optind < argc) {
		cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
		return 1;
	}
	if (!conn.timeout_ms)
		conn.timeout_ms = HEALTH_TIMEOUT_MS;
	return admin ? health_admin(prog, admin, conn.timeout_ms) :
		       health_data(&conn, conn.timeout_ms);
}

/* ---- kvpool drop-namespace ---------------------------------------------------- */

static const char drop_usage[] =
	"usage: kvpool drop-namespace [options] NAME\n"
	"\n"
	"Remove every block of namespace NAME from the pool (both tiers); the\n"
	"namespace itself stays, empty. A namespace that does not exist is\n"
	"dropped trivially (0 blocks).\n"
	"\n"
	CLI_COMMON_HELP;

int cli_drop_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0], *name;
	struct kvpool_client *c;
	struct cli_conn conn;
	uint64_t blocks = 0;
	int opt, rc;

	cli_conn_init(&conn, "default");
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		rc = cli_conn_opt(&conn, prog, opt, optarg);
		if (rc < 0)
			return CLI_EXIT_ERROR;
		if (rc)
			continue;
		if (opt == 'h') {
			fputs(drop_usage, stdout);
			return CLI_EXIT_OK;
		}
		return cli_try_help(prog);
	}
	if (optind + 1 != argc)
		return cli_usage_error(prog, optind < argc ? "one NAME only" : "no NAME given");
	name = argv[optind];
	if (!cli_ns_valid(name))
		return cli_usage_error(prog, "bad NAME \"%.300s\": " CLI_NS_RULE, name);
	rc = cli_connect(&conn, prog, &c);
	if (rc)
		return cli_connect_exit_code(rc);
	rc = kvpool_drop_namespace(c, name, &blocks);
	if (rc == -EINPROGRESS) {
		/* a node of the pool did not answer: this process ends, so the
		 * handle cannot finish it there */
		char *json = NULL;

		fprintf(stderr, "%s: %s: dropped on the nodes that answered (%" PRIu64 " blocks), not "
			"on these - run it again when they are back:\n", prog, name, blocks);
		if (kvpool_stats(c, NULL, &json) == 0)
			cli_cluster_nodes_report(stderr, json, "  ");
		kvpool_free(json);
		kvpool_close(c);
		return CLI_EXIT_ERROR;
	}
	kvpool_close(c);
	if (rc) {
		fprintf(stderr, "%s: %s: %s\n", prog, name, cli_reason(rc));
		return cli_exit_code(rc);
	}
	printf("dropped namespace %s: %" PRIu64 " blocks\n", name, blocks);
	return CLI_EXIT_OK;
}
