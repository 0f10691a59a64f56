/*
 * srv_lifecycle.c - systemd readiness and watchdog, SIGHUP reload, the
 * SIGTERM/SIGINT drain, and protected mode (see srv_lifecycle.h).
 */
#include "srv_lifecycle.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <systemd/sd-daemon.h>

#include "srv_auth.h"
#include "srv_clock.h"
#include "srv_fdlimit.h"
#include "srv_log.h"
#include "srv_request.h"
#include "srv_server.h"
#include "srv_tls.h"
#include "srv_worker.h"

/* How often the drain looks at the workers. */
#define DRAIN_CHECK_MS 10

int srv_state(const struct srv *s)
{
	return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
}

static void set_state(struct srv *s, int state)
{
	__atomic_store_n(&s->state, state, __ATOMIC_RELEASE);
}

/* ---- protected mode -------------------------------------------------------- */

static bool addr_is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)sa;

		return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;

		return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
	}
	return false;
}

int srv_listen_is_loopback(const char *listen)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int loopback = 1;

	if (!listen || getaddrinfo(listen, NULL, &hints, &ai) != 0)
		return 0;
	for (struct addrinfo *p = ai; p; p = p->ai_next)
		if (!addr_is_loopback(p->ai_addr))
			loopback = 0;
	freeaddrinfo(ai);
	return ai ? loopback : 0;
}

int srv_protected_check(const struct conf *c, int *warn, char *err, size_t err_len)
{
	*warn = 0;
	if (c->tokens_file[0] && !srv_listen_is_loopback(c->listen) && !c->tls_cert_file[0] &&
	    !c->allow_plaintext_tokens) {
		snprintf(err, err_len,
			 "listen %s is not a loopback address and tokens_file is set, but there is "
			 "no TLS: tokens would cross the network in the clear; set tls_cert_file and "
			 "tls_key_file, or allow_plaintext_tokens = true on a trusted network",
			 c->listen);
		return -EPERM;
	}
	if (c->tokens_file[0] || srv_listen_is_loopback(c->listen))
		return 0;
	if (c->allow_unauthenticated) {
		*warn = 1;
		return 0;
	}
	snprintf(err, err_len,
		 "protected mode: listen %s is not a loopback address and no tokens_file is set; "
		 "set tokens_file, or allow_unauthenticated = true to serve every client "
		 "without authentication", c->listen);
	return -EPERM;
}

/* ---- what the settings name must exist -------------------------------------- */

/* listen must resolve, as listen_start will resolve it (passive, TCP). */
static int check_listen(const struct conf *c, char *err, size_t err_len)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(c->listen, NULL, &hints, &ai);

	if (rc) {
		snprintf(err, err_len, "listen: %s is not an address or a host name that resolves "
			 "(%s)", c->listen, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
		return -EINVAL;
	}
	freeaddrinfo(ai);
	return 0;
}

/* nvme_dir, when set, must be an existing directory this process may
 * write in (the store creates its files there). */
static int check_nvme_dir(const struct conf *c, char *err, size_t err_len)
{
	struct stat st;

	if (!c->nvme_dir[0])
		return 0;
	if (stat(c->nvme_dir, &st) < 0) {
		int e = errno;

		snprintf(err, err_len, "nvme_dir: %s: %s", c->nvme_dir,
			 e == ENOENT ? "does not exist (create it first)" : "cannot be read");
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, err_len, "nvme_dir: %s: is not a directory", c->nvme_dir);
		return -ENOTDIR;
	}
	if (access(c->nvme_dir, W_OK | X_OK) < 0) {
		snprintf(err, err_len, "nvme_dir: %s: is not writable by this user", c->nvme_dir);
		return -EACCES;
	}
	return 0;
}

/* The TLS files, when set, must load: once here, so that a missing or bad
 * file is a bad setting, not a failed start. An expired certificate loads
 * (kvpoold warns when it starts). */
static int check_tls(const struct conf *c, char *err, size_t err_len)
{
	struct srv_tls_ctx *x = NULL;
	char warn[512];
	int rc;

	if (!srv_tls_configured(c))
		return 0;
	rc = srv_tls_ctx_open(c, &x, warn, sizeof(warn), err, err_len);
	srv_tls_ctx_free(x);
	return rc;
}

/* tokens_file, when set, must load: read it once here and drop it, so
 * that a missing or bad file is a bad setting, not a failed start. */
static int check_tokens_file(const struct conf *c, char *err, size_t err_len)
{
	struct srv_auth *auth = NULL;
	char why[400] = "";
	int rc;

	if (!c->tokens_file[0])
		return 0;
	rc = srv_auth_load(c->tokens_file, &auth, why, sizeof(why));
	if (rc < 0) {
		if (rc == -ENOENT)
			snprintf(err, err_len, "tokens_file: %s: does not exist", c->tokens_file);
		else
			snprintf(err, err_len, "tokens_file: %s", why[0] ? why : strerror(-rc));
		return rc;
	}
	srv_auth_free(auth);
	return 0;
}

int srv_check_paths(const struct conf *c, char *err, size_t err_len)
{
	int rc = check_listen(c, err, err_len);

	if (!rc)
		rc = check_nvme_dir(c, err, err_len);
	if (!rc)
		rc = check_tokens_file(c, err, err_len);
	if (!rc)
		rc = check_tls(c, err, err_len);
	return rc;
}

/* ---- readiness and watchdog ---------------------------------------------- */

static void watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	/* Sent from the main loop: a wedged loop stops the pings. */
	sd_notify(0, "WATCHDOG=1");
}

static int watchdog_start(struct srv *s)
{
	uint64_t usec = 0, half;
	struct timeval tv;

	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	half = usec / 2 ? usec / 2 : 1;
	tv.tv_sec = (time_t)(half / 1000000);
	tv.tv_usec = (suseconds_t)(half % 1000000);
	s->ev_watchdog = event_new(s->base, -1, EV_PERSIST, watchdog_cb, s);
	if (!s->ev_watchdog || event_add(s->ev_watchdog, &tv) < 0)
		return -ENOMEM;
	sd_notify(0, "WATCHDOG=1");
	srv_info("systemd watchdog: pinging every %" PRIu64 " ms", half / 1000);
	return 0;
}

int srv_lifecycle_ready(struct srv *s)
{
	set_state(s, SRV_STATE_SERVING);
	sd_notifyf(0, "READY=1\nSTATUS=serving on %s port %u\nMAINPID=%lu", s->conf.listen,
		   s->conf.port, (unsigned long)getpid());
	return watchdog_start(s);
}

/* ---- drain ------------------------------------------------------------- */

/* Requests still being received or answered, summed over workers;
 * UINT64_MAX while a worker has not looked yet. */
static uint64_t drain_busy(struct srv *s)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < s->n_workers; i++) {
		uint32_t n = srv_worker_busy(&s->workers[i]);

		if (n == UINT32_MAX)
			return UINT64_MAX;
		total += n;
	}
	return total;
}

static void drain_check_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;
	uint64_t busy = drain_busy(s), now = srv_now_ms();

	(void)fd;
	(void)what;
	if (busy == 0) {
		srv_info("drained in %" PRIu64 " ms", now - s->drain_start_ms);
		event_base_loopbreak(s->base);
		return;
	}
	if (now < s->drain_start_ms + s->drain_timeout_ms)
		return;
	if (busy == UINT64_MAX)
		srv_warn("drain_timeout_ms (%" PRIu64 ") passed before every worker answered; "
			 "closing every connection", s->drain_timeout_ms);
	else
		srv_warn("drain_timeout_ms (%" PRIu64 ") passed with %" PRIu64 " connections "
			 "still busy; closing them", s->drain_timeout_ms, busy);
	event_base_loopbreak(s->base);
}

void srv_lifecycle_stop(struct srv *s, int sig)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = DRAIN_CHECK_MS * 1000 };
	const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";

	s->stop_signal = sig;
	if (srv_state(s) == SRV_STATE_DRAINING) {
		srv_info("received %s again: stopping without waiting", name);
		event_base_loopbreak(s->base);
		return;
	}
	set_state(s, SRV_STATE_DRAINING);
	sd_notify(0, "STOPPING=1\nSTATUS=draining");
	s->drain_start_ms = srv_now_ms();
	s->drain_timeout_ms = __atomic_load_n(&s->conf.drain_timeout_ms, __ATOMIC_RELAXED);
	/* No more connections: close the port at once, so clients fail over. */
	if (s->listener) {
		evconnlistener_free(s->listener);
		s->listener = NULL;
	}
	srv_rdma_stop_accepting(s);
	srv_info("received %s: no longer accepting; draining requests in flight "
		 "(drain_timeout_ms %" PRIu64 ")", name, s->drain_timeout_ms);
	for (uint32_t i = 0; i < s->n_workers; i++)
		srv_worker_drain_begin(&s->workers[i]);
	s->ev_drain = event_new(s->base, -1, EV_PERSIST, drain_check_cb, s);
	if (!s->ev_drain || event_add(s->ev_drain, &tv) < 0) {
		srv_warn("cannot start the drain timer; stopping now");
		event_base_loopbreak(s->base);
	}
}

/* ---- reload ---------------------------------------------------------------- */

/* conf_change_fn: one line per changed setting. */
static void log_change(void *arg, const char *name, const char *old_value,
		       const char *new_value, int applied)
{
	(void)arg;
	if (applied)
		srv_info("sighup: %s changed from '%s' to '%s'", name, old_value, new_value);
	else
		srv_warn("sighup: %s changed from '%s' to '%s' but needs a restart; still '%s'",
			 name, old_value, new_value, old_value);
}

/* tokens_file: turning authentication on or off changes what every
 * connection may do, so only a restart does it; a new path or new file
 * contents are read now. Returns 0, or -1 when next must keep the old
 * path (the file did not load, or auth would be switched). */
static int reload_tokens(struct srv *s, const char *path)
{
	uint32_t tokens = 0, quotas = 0;
	char err[512] = "";

	if (!!s->conf.tokens_file[0] != !!path[0]) {
		srv_warn("sighup: tokens_file changed from '%s' to '%s' but turning authentication "
			 "%s needs a restart", s->conf.tokens_file, path, path[0] ? "on" : "off");
		return -1;
	}
	if (!path[0] || !s->auth)
		return 0;
	if (srv_auth_reload(s->auth, path, &tokens, &quotas, err, sizeof(err)) < 0) {
		srv_err("sighup: tokens not reloaded, the old ones stay: %s", err);
		return -1;
	}
	(void)tokens;
	(void)quotas;
	srv_auth_log_loaded(s->auth, "sighup: ", path);
	/* budgets are per tenant: a changed one binds open connections too */
	srv_tenants_retain_rebudget(s);
	return 0;
}

/* The TLS files: turning TLS on or off takes a restart (tls_only and the
 * sniffing of every connection depend on it); new paths or new contents
 * are loaded now, and used by the connections that start from now on -
 * those open keep their sessions. Returns 0, or -1 when next must keep
 * the old paths (the files did not load, or TLS would be switched). */
static int reload_tls(struct srv *s, struct conf *next)
{
	char warn[512] = "", err[512] = "", what[400];

	if (!!s->tls != srv_tls_configured(next)) {
		srv_warn("sighup: tls_cert_file changed from '%s' to '%s' but turning TLS %s needs "
			 "a restart", s->conf.tls_cert_file, next->tls_cert_file,
			 s->tls ? "off" : "on");
		return -1;
	}
	if (!s->tls)
		return 0;
	if (srv_tls_ctx_reload(s->tls, next, warn, sizeof(warn), err, sizeof(err)) < 0) {
		srv_err("sighup: tls certificate not reloaded, the old one stays: %s", err);
		return -1;
	}
	/* a config-management slip must not drop client authentication
	 * unnoticed: say so at warn level */
	if (s->conf.tls_client_ca_file[0] && !next->tls_client_ca_file[0])
		srv_warn("sighup: tls_client_ca_file removed: mutual TLS is OFF from now on, new "
			 "clients need no certificate (was '%s')", s->conf.tls_client_ca_file);
	if (warn[0])
		srv_warn("sighup: %s", warn);
	srv_tls_ctx_describe(s->tls, what, sizeof(what));
	srv_info("sighup: tls reloaded: %s (new connections; open ones keep theirs)", what);
	return 0;
}

/* Publish the reloadable settings of `next` to the running server:
 * workers read the numbers with atomic loads; STATS copies the whole
 * struct under conf_lock. */
static void reload_publish(struct srv *s, const struct conf *next)
{
	pthread_mutex_lock(&s->conf_lock);
	__atomic_store_n(&s->conf.log_level, next->log_level, __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.max_connections, next->max_connections, __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.idle_timeout_ms, next->idle_timeout_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.payload_timeout_ms, next->payload_timeout_ms,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.drain_timeout_ms, next->drain_timeout_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.max_match_wait_ms, next->max_match_wait_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.max_conn_match_waits, next->max_conn_match_waits,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.tenant_max_match_waits, next->tenant_max_match_waits,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&s->conf.max_match_wait_bytes, next->max_match_wait_bytes,
			 __ATOMIC_RELAXED);
	memcpy(s->conf.tokens_file, next->tokens_file, sizeof(s->conf.tokens_file));
	memcpy(s->conf.tls_cert_file, next->tls_cert_file, sizeof(s->conf.tls_cert_file));
	memcpy(s->conf.tls_key_file, next->tls_key_file, sizeof(s->conf.tls_key_file));
	memcpy(s->conf.tls_client_ca_file, next->tls_client_ca_file,
	       sizeof(s->conf.tls_client_ca_file));
	pthread_mutex_unlock(&s->conf_lock);
	srv_log_set_level(next->log_level);
	srv_conn_limit_update(s);
}

void srv_lifecycle_reload(struct srv *s)
{
	struct conf next, cur = s->conf; /* only this thread writes s->conf */
	char err[512];
	int help = 0, applied;

	srv_info("received SIGHUP: reloading the configuration");
	if (conf_load(&next, s->argc, s->argv, environ, NULL, &help, err, sizeof(err)) < 0) {
		srv_err("sighup: configuration not reloaded, nothing changed: %s", err);
		return;
	}
	if (strcmp(next.tokens_file, cur.tokens_file) != 0 &&
	    reload_tokens(s, next.tokens_file) < 0)
		memcpy(next.tokens_file, cur.tokens_file, sizeof(next.tokens_file));
	else if (next.tokens_file[0] && strcmp(next.tokens_file, cur.tokens_file) == 0)
		reload_tokens(s, next.tokens_file); /* same path: its contents may be new */
	if (reload_tls(s, &next) < 0) {
		memcpy(next.tls_cert_file, cur.tls_cert_file, sizeof(next.tls_cert_file));
		memcpy(next.tls_key_file, cur.tls_key_file, sizeof(next.tls_key_file));
		memcpy(next.tls_client_ca_file, cur.tls_client_ca_file,
		       sizeof(next.tls_client_ca_file));
	}
	applied = conf_reload(&cur, &next, log_change, s);
	reload_publish(s, &cur);
	/* waiting MATCHes whose token's grant changed are answered now */
	for (uint32_t i = 0; s->auth && i < s->n_workers; i++)
		srv_worker_recheck_waits(&s->workers[i]);
	srv_retain_budget_warn(s, "sighup: ");
	srv_info("sighup: %d settings applied", applied);
}

/* ---- the rest -------------------------------------------------------------- */

void srv_lifecycle_free(struct srv *s)
{
	if (s->ev_drain)
		event_free(s->ev_drain);
	s->ev_drain = NULL;
	if (s->ev_watchdog)
		event_free(s->ev_watchdog);
	s->ev_watchdog = NULL;
}

char *srv_settings_json(struct srv *s)
{
	struct conf copy;
	size_t len;
	char *buf;

	pthread_mutex_lock(&s->conf_lock);
	copy = s->conf;
	pthread_mutex_unlock(&s->conf_lock);
	len = conf_json(&copy, NULL, 0);
	buf = malloc(len + 1);
	if (buf)
		conf_json(&copy, buf, len + 1);
	return buf;
}
