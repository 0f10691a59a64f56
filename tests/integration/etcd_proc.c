/*
 * etcd_proc.c - run etcd for a test (see etcd_proc.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd_proc.h"

static const char *etcd_bin(void)
{
	const char *b = getenv("KVPOOL_ETCD");

	return b && *b ? b : "etcd";
}

int etcd_proc_available(void)
{
	const char *b = etcd_bin();
	const char *path;
	char buf[1024];

	if (strchr(b, '/'))
		return access(b, X_OK) == 0;
	path = getenv("PATH");
	if (!path)
		path = "/usr/bin:/bin";
	while (*path) {
		size_t n = strcspn(path, ":");

		snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, b);
		if (access(buf, X_OK) == 0)
			return 1;
		path += n + (path[n] == ':');
	}
	return 0;
}

uint16_t etcd_proc_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	if (fd < 0)
		return 0;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static int answers(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
	char req[160], rep[256];
	ssize_t n;

	if (fd < 0)
		return 0;
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (ok) {
		struct timeval tv = { .tv_sec = 1 };

		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		snprintf(req, sizeof(req), "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
		ok = write(fd, req, strlen(req)) == (ssize_t)strlen(req);
		n = ok ? read(fd, rep, sizeof(rep) - 1) : -1;
		ok = n > 0;
		if (ok) {
			rep[n] = 0;
			ok = strstr(rep, " 200 ") != NULL;
		}
	}
	close(fd);
	return ok;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Fork and exec etcd; 0 or -errno. */
static int spawn(struct etcd_proc *e)
{
	char data[96], lc[64], lp[64], ic[96], log[96];
	const char *name = e->name[0] ? e->name : "kvpooltest";
	pid_t parent = getpid();

	snprintf(e->endpoint, sizeof(e->endpoint), "127.0.0.1:%u", e->client_port);
	snprintf(data, sizeof(data), "%s/data", e->dir);
	snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
	snprintf(lc, sizeof(lc), "http://127.0.0.1:%u", e->client_port);
	snprintf(lp, sizeof(lp), "http://127.0.0.1:%u", e->peer_port);
	snprintf(ic, sizeof(ic), "%s=http://127.0.0.1:%u", name, e->peer_port);
	e->pid = fork();
	if (e->pid < 0) {
		e->pid = 0;
		return -errno;
	}
	if (e->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp(etcd_bin(), etcd_bin(), "--name", name, "--data-dir", data,
		       "--listen-client-urls", lc, "--advertise-client-urls", lc,
		       "--listen-peer-urls", lp, "--initial-advertise-peer-urls", lp,
		       "--initial-cluster", e->cluster[0] ? e->cluster : ic,
		       "--initial-cluster-token", e->token[0] ? e->token : e->dir + 5,
		       "--log-level", "error", (char *)NULL);
		_exit(127);
	}
	return 0;
}

/* Wait until it answers /health (up to 15 s). */
static int wait_ready(struct etcd_proc *e)
{
	for (int i = 0; i < 150; i++) {
		int st;

		if (answers(e->client_port))
			return 0;
		if (waitpid(e->pid, &st, WNOHANG) == e->pid) {
			e->pid = 0;
			fprintf(stderr, "etcd_proc: etcd exited at start (see %s/etcd.log)\n", e->dir);
			return -ECHILD;
		}
		sleep_ms(100);
	}
	kill(e->pid, SIGKILL);
	waitpid(e->pid, NULL, 0);
	e->pid = 0;
	return -ETIMEDOUT;
}

/* Data dir and ports on first use. */
static int prepare(struct etcd_proc *e)
{
	if (!e->dir[0]) {
		snprintf(e->dir, sizeof(e->dir), "/tmp/kvpool-etcd-XXXXXX");
		if (!mkdtemp(e->dir))
			return -errno;
	}
	if (!e->client_port) {
		e->client_port = etcd_proc_free_port();
		e->peer_port = etcd_proc_free_port();
		if (!e->client_port || !e->peer_port || e->client_port == e->peer_port)
			return -EADDRINUSE;
	}
	return 0;
}

int etcd_proc_start(struct etcd_proc *e)
{
	int rc;

	if (!etcd_proc_available())
		return -ENOENT;
	rc = prepare(e);
	if (rc == 0)
		rc = spawn(e);
	return rc ? rc : wait_ready(e);
}

int etcd_proc_wipe(struct etcd_proc *e)
{
	char cmd[128];

	etcd_proc_stop(e);
	if (e->dir[0] && strncmp(e->dir, "/tmp/kvpool-etcd-", 17) == 0) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s/data'", e->dir);
		if (system(cmd) != 0)
			return -EIO;
	}
	return etcd_proc_start(e);
}

int etcd_proc_start_cluster(struct etcd_proc *m, size_t n)
{
	char ic[512] = "";
	size_t len = 0;
	int rc = 0;

	if (n < 1 || n > 5)
		return -EINVAL;
	if (!etcd_proc_available())
		return -ENOENT;
	for (size_t i = 0; i < n && !rc; i++) {
		memset(&m[i], 0, sizeof(m[i]));
		snprintf(m[i].name, sizeof(m[i].name), "kvpooltest%zu", i);
		rc = prepare(&m[i]);
		if (rc == 0)
			len += (size_t)snprintf(ic + len, sizeof(ic) - len, "%skvpooltest%zu=http://127.0.0.1:%u",
						i ? "," : "", i, m[i].peer_port);
	}
	for (size_t i = 0; i < n && !rc; i++) {
		snprintf(m[i].cluster, sizeof(m[i].cluster), "%s", ic);
		/* one token for the whole cluster: the first member's dir */
		snprintf(m[i].token, sizeof(m[i].token), "%s", m[0].dir + 5);
		rc = spawn(&m[i]);
	}
	for (size_t i = 0; i < n && !rc; i++)
		rc = wait_ready(&m[i]);
	if (rc)
		for (size_t i = 0; i < n; i++)
			etcd_proc_destroy(&m[i]);
	return rc;
}

void etcd_proc_endpoints(const struct etcd_proc *m, size_t n, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = 0;
	for (size_t i = 0; i < n && len < cap; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "", m[i].endpoint);
}

int etcd_proc_post(const struct etcd_proc *e, const char *path, const char *json, char *out,
		   size_t cap)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(e->client_port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct timeval tv = { .tv_sec = 5 };
	char req[2048], rep[8192];
	size_t got = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = -EPROTO;
	const char *body;

	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		status = -errno;
		close(fd);
		return status;
	}
	snprintf(req, sizeof(req), "POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: "
		 "application/json\r\nContent-Length: %zu\r\n\r\n%s", path, strlen(json), json);
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -EIO;
	}
	for (;;) {
		ssize_t n = read(fd, rep + got, sizeof(rep) - 1 - got);

		if (n <= 0)
			break;
		got += (size_t)n;
		if (got == sizeof(rep) - 1)
			break;
	}
	close(fd);
	rep[got] = 0;
	if (sscanf(rep, "HTTP/%*s %d", &status) != 1)
		return -EPROTO;
	body = strstr(rep, "\r\n\r\n");
	if (out && cap) {
		snprintf(out, cap, "%s", body ? body + 4 : "");
	}
	return status;
}

void etcd_proc_stop(struct etcd_proc *e)
{
	if (!e->pid)
		return;
	kill(e->pid, SIGTERM);
	for (int i = 0; i < 50; i++) {
		if (waitpid(e->pid, NULL, WNOHANG) == e->pid) {
			e->pid = 0;
			return;
		}
		sleep_ms(100);
	}
	kill(e->pid, SIGKILL);
	waitpid(e->pid, NULL, 0);
	e->pid = 0;
}

void etcd_proc_destroy(struct etcd_proc *e)
{
	char cmd[128];

	etcd_proc_stop(e);
	if (e->dir[0] && strncmp(e->dir, "/tmp/kvpool-etcd-", 17) == 0) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "etcd_proc: could not remove %s\n", e->dir);
	}
	e->dir[0] = 0;
}
