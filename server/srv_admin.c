/*
 * srv_admin.c - the admin HTTP server: /metrics, /healthz, /stats on a
 * thread and event base of its own.
 */
#include "srv_admin.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>

#include "proto.h"
#include "srv_lifecycle.h"
#include "srv_log.h"
#include "srv_metrics.h"
#include "srv_server.h"
#include "srv_snapshot.h"
#include "srv_stats.h"
#include "store.h"

#define ADMIN_BACKLOG 64
#define ADMIN_TIMEOUT_S 10          /* a request not read or written by then is dropped */
#define ADMIN_MAX_CONNS 16          /* open admin connections (taken from the 64 descriptors
				     * kvpoold keeps aside); accepting pauses beyond */
#define ADMIN_PAUSE_MS 100          /* accept() failed (EMFILE...): pause this long */
#define ADMIN_CAP_CHECK_MS 200      /* at the cap: look for a closed connection this often */
#define ADMIN_MAX_HEADERS_BYTES 16384
#define ADMIN_MAX_BODY_BYTES 4096   /* GET has no body; anything more is junk */

struct srv_admin {
	struct srv *s;
	struct event_base *base;    /* admin thread only, once it runs */
	struct evhttp *http;
	int stop_fd;                /* eventfd: the main thread asks the thread to end */
	struct event *ev_stop;
	pthread_t thread;
	int started;
	/* Connection cap and accept errors (admin thread only once it runs). */
	struct evconnlistener *lis;
	uint16_t port;              /* admin port, to count its connections */
	struct event *ev_cap_check; /* while cap_paused: has one closed? */
	int cap_paused;             /* accepting paused: conns reached the cap */
	int err_paused;             /* accepting paused: accept() failed */
	struct event *ev_resume;    /* ends err_paused */
	struct srv_ratelimit log_rl; /* accept failure lines */
	uint64_t accept_errors, cap_pauses;
};

static const char *state_name(int st)
{
	switch (st) {
	case SRV_STATE_SERVING:
		return "serving";
	case SRV_STATE_DRAINING:
		return "draining";
	default:
		return "starting";
	}
}

/* ---- replies ------------------------------------------------------------ */

/* Send buf (may be NULL: empty body) with a status and a content type.
 * Monitoring must never see a cached figure: no-store. */
static void reply(struct evhttp_request *req, int code, const char *reason,
		  const char *content_type, struct evbuffer *buf)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", content_type);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_send_reply(req, code, reason, buf);
}

/* A short plain-text reply: one line. */
static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *fmt,
		       ...) __attribute__((format(printf, 4, 5)));

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *fmt,
		       ...)
{
	struct evbuffer *buf = evbuffer_new();
	va_list ap;

	if (!buf) {
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	va_start(ap, fmt);
	evbuffer_add_vprintf(buf, fmt, ap);
	va_end(ap);
	reply(req, code, reason, "text/plain; charset=utf-8", buf);
	evbuffer_free(buf);
}

/* /metrics and /stats need the pool and the workers: 503 until the
 * server serves. Returns 1 when a 503 went out. */
static int not_ready(struct srv_admin *a, struct evhttp_request *req)
{
	int st = srv_state(a->s);

	if (st != SRV_STATE_STARTING)
		return 0;
	reply_text(req, HTTP_SERVUNAVAIL, "Service Unavailable", "%s\n", state_name(st));
	return 1;
}

/* ---- endpoints ------------------------------------------------------------ */

/* 200 "serving" (with a note when the NVMe tier is failing writes: the
 * pool still serves, from DRAM alone), 503 "starting" or "draining". */
static void get_healthz(struct srv_admin *a, struct evhttp_request *req)
{
	int st = srv_state(a->s);
	struct store_stats ss;

	if (st != SRV_STATE_SERVING) {
		reply_text(req, HTTP_SERVUNAVAIL, "Service Unavailable", "%s\n", state_name(st));
		return;
	}
	store_stats(a->s->store, &ss);
	if (ss.nvme_enabled && !ss.nvme_healthy)
		reply_text(req, HTTP_OK, "OK", "serving; nvme tier unhealthy (writes failing, "
			   "DRAM only)\n");
	else
		reply_text(req, HTTP_OK, "OK", "serving\n");
}

/* Render a snapshot (one namespace when name_len > 0) with fn into a
 * buffer and send it; 500 when memory runs out. */
static void send_snapshot(struct srv_admin *a, struct evhttp_request *req, const char *name,
			  uint16_t name_len, const char *content_type,
			  int (*fn)(const struct srv_stats_doc *, struct evbuffer *))
{
	struct srv_snapshot *snap = NULL;
	struct evbuffer *buf = evbuffer_new();
	int rc = buf ? srv_snapshot_take(a->s, name, name_len, &snap) : -ENOMEM;

	if (rc == 0)
		rc = fn(&snap->doc, buf);
	srv_snapshot_free(snap);
	if (rc == 0)
		reply(req, HTTP_OK, "OK", content_type, buf);
	else
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
	if (buf)
		evbuffer_free(buf);
}

/* The STATS document; ?namespace=NAME (URL-encoded) for one namespace,
 * as a STATS request with that name. */
static void get_stats(struct srv_admin *a, struct evhttp_request *req, const char *query)
{
	struct evkeyvalq q = { 0 };
	const char *name = NULL;

	if (not_ready(a, req))
		return;
	TAILQ_INIT(&q);
	if (query && evhttp_parse_query_str(query, &q) < 0) {
		reply_text(req, HTTP_BADREQUEST, "Bad Request", "malformed query string\n");
		goto out_clear;
	}
	name = evhttp_find_header(&q, "namespace");
	if (name && !proto_name_valid(name, strlen(name))) {
		reply_text(req, HTTP_BADREQUEST, "Bad Request",
			   "namespace must be 1..255 printable ASCII characters without spaces\n");
		goto out_clear;
	}
	send_snapshot(a, req, name, name ? (uint16_t)strlen(name) : 0, "application/json",
		      srv_stats_json);
out_clear:
	evhttp_clear_headers(&q);
}

static void get_metrics(struct srv_admin *a, struct evhttp_request *req)
{
	if (not_ready(a, req))
		return;
	send_snapshot(a, req, NULL, 0, SRV_METRICS_CONTENT_TYPE, srv_metrics_write);
}

/* Every request: route by path. evhttp answers methods other than GET
 * and HEAD with 501 itself (evhttp_set_allowed_methods). */
static void admin_request(struct evhttp_request *req, void *arg)
{
	struct srv_admin *a = arg;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;

	if (!path || !*path)
		path = "/";
	if (!strcmp(path, "/metrics"))
		get_metrics(a, req);
	else if (!strcmp(path, "/healthz"))
		get_healthz(a, req);
	else if (!strcmp(path, "/stats"))
		get_stats(a, req, evhttp_uri_get_query(uri));
	else if (!strcmp(path, "/"))
		reply_text(req, HTTP_OK, "OK", "kvpoold %s admin: /metrics /healthz /stats\n",
			   SRV_VERSION);
	else
		reply_text(req, HTTP_NOTFOUND, "Not Found",
			   "no such page; try /metrics, /healthz or /stats\n");
}

/* ---- connection cap and accept errors --------------------------------------- */

/* Accept again when neither the cap nor an accept error holds it back. */
static void admin_accept_maybe_resume(struct srv_admin *a)
{
	if (!a->cap_paused && !a->err_paused && a->lis)
		evconnlistener_enable(a->lis);
}

/* Open admin connections: the sockets of this process bound to the admin
 * port, less the listener. libevent 2.1's evhttp neither caps nor counts
 * its connections and tells nothing when one that never sent a whole
 * request is closed, so they are counted from the descriptors; this runs
 * only when a connection is accepted and while accepting is paused. */
static uint32_t admin_count_conns(const struct srv_admin *a)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	uint32_t n = 0;

	if (!d)
		return 0; /* no /proc: no cap rather than no admin port */
	while ((e = readdir(d))) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		int fd = atoi(e->d_name), listening = 0;
		socklen_t ol = sizeof(listening);
		uint16_t port;

		if (fd <= 2 || fd == dirfd(d) ||
		    getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
			continue;
		if (ss.ss_family == AF_INET)
			port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		else if (ss.ss_family == AF_INET6)
			port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		else
			continue;
		if (port != a->port ||
		    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) < 0 || listening)
			continue;
		n++;
	}
	closedir(d);
	return n;
}

/* While paused at the cap: resume once a connection went. */
static void admin_cap_check_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_admin *a = arg;

	(void)fd;
	(void)what;
	if (!a->cap_paused || admin_count_conns(a) >= ADMIN_MAX_CONNS)
		return;
	a->cap_paused = 0;
	event_del(a->ev_cap_check);
	admin_accept_maybe_resume(a);
}

/* evhttp's bufferevent for each accepted connection (a plain socket one):
 * the hook where a new connection is seen. At the cap, accepting pauses
 * until one closes (checked every ADMIN_CAP_CHECK_MS); further clients
 * wait in the kernel's backlog and time out there, not in our
 * descriptors. */
static struct bufferevent *admin_bev(struct event_base *base, void *arg)
{
	struct srv_admin *a = arg;
	struct timeval tv = { .tv_sec = 0, .tv_usec = ADMIN_CAP_CHECK_MS * 1000 };
	uint64_t suppressed = 0;

	if (!a->cap_paused && admin_count_conns(a) >= ADMIN_MAX_CONNS) {
		a->cap_paused = 1;
		a->cap_pauses++;
		evconnlistener_disable(a->lis);
		if (event_add(a->ev_cap_check, &tv) < 0) {
			a->cap_paused = 0; /* no timer: never stay paused */
			admin_accept_maybe_resume(a);
		} else if (srv_ratelimit_allow(&a->log_rl, srv_now_ms(), &suppressed)) {
			srv_warn("admin: %d connections open: not accepting more until one closes",
				 ADMIN_MAX_CONNS);
		}
	}
	return bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
}

static void admin_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_admin *a = arg;

	(void)fd;
	(void)what;
	a->err_paused = 0;
	admin_accept_maybe_resume(a);
}

/* The listener's callback argument is evhttp's (evhttp_bind_listener
 * sets it), so the error callback finds its srv_admin here. */
static pthread_mutex_t admins_lock = PTHREAD_MUTEX_INITIALIZER;
static struct srv_admin *admins[16];

static void admin_register(struct srv_admin *a, int on)
{
	pthread_mutex_lock(&admins_lock);
	for (size_t i = 0; i < sizeof(admins) / sizeof(admins[0]); i++) {
		if (on && !admins[i]) {
			admins[i] = a;
			break;
		}
		if (!on && admins[i] == a)
			admins[i] = NULL;
	}
	pthread_mutex_unlock(&admins_lock);
}

static struct srv_admin *admin_of_listener(const struct evconnlistener *lis)
{
	struct srv_admin *a = NULL;

	pthread_mutex_lock(&admins_lock);
	for (size_t i = 0; i < sizeof(admins) / sizeof(admins[0]) && !a; i++)
		if (admins[i] && admins[i]->lis == lis)
			a = admins[i];
	pthread_mutex_unlock(&admins_lock);
	return a;
}

/* accept() failed (out of descriptors, most likely): an enabled listener
 * would fail again at once, forever; pause it and say so once a second. */
static void admin_accept_error(struct evconnlistener *lis, void *arg)
{
	struct srv_admin *a = admin_of_listener(lis);
	struct timeval tv = { .tv_sec = 0, .tv_usec = ADMIN_PAUSE_MS * 1000 };
	int err = EVUTIL_SOCKET_ERROR();
	uint64_t suppressed = 0;

	(void)arg; /* evhttp's */
	if (!a) {
		evconnlistener_disable(lis); /* cannot happen: never spin */
		return;
	}
	a->accept_errors++;
	if (srv_ratelimit_allow(&a->log_rl, srv_now_ms(), &suppressed))
		srv_warn("admin: accept failed: %s; pausing %d ms (%" PRIu64 " more such failures "
			 "not logged)", strerror(err), ADMIN_PAUSE_MS, suppressed);
	evconnlistener_disable(lis);
	a->err_paused = 1;
	if (!a->ev_resume || evtimer_add(a->ev_resume, &tv) < 0) {
		a->err_paused = 0;
		admin_accept_maybe_resume(a);
	}
}

/* ---- thread, start and stop ------------------------------------------------ */

static void stop_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_admin *a = arg;
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		srv_warn("admin: eventfd read: %s", strerror(errno));
	event_base_loopbreak(a->base);
}

static void *admin_main(void *arg)
{
	struct srv_admin *a = arg;

	event_base_dispatch(a->base);
	return NULL;
}

/* "1.2.3.4:5" or "[::1]:5" of the bound socket fd. */
static void bound_name(int fd, char *buf, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[NI_MAXHOST], port[NI_MAXSERV];

	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0 ||
	    getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, cap, "?");
		return;
	}
	snprintf(buf, cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* Bind listen:port as the data port is bound (REUSEADDR, CLOEXEC) and
 * hand the socket to evhttp. */
static int admin_bind(struct srv_admin *a, const char *listen, uint16_t port)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	struct evconnlistener *lis;
	char port_text[16], where[300];
	int rc;

	snprintf(port_text, sizeof(port_text), "%u", port);
	rc = getaddrinfo(listen, port_text, &hints, &ai);
	if (rc) {
		srv_err("admin: cannot resolve listen address %s: %s", listen, gai_strerror(rc));
		return -EINVAL;
	}
	lis = evconnlistener_new_bind(a->base, NULL, NULL,
				      LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
				      ADMIN_BACKLOG, ai->ai_addr, (int)ai->ai_addrlen);
	rc = lis ? 0 : -errno;
	freeaddrinfo(ai);
	if (rc < 0) {
		srv_err("cannot listen on %s admin_port %u (the admin HTTP port): %s%s", listen, port,
			strerror(-rc),
			rc == -EADDRINUSE ? "; set admin_port to a free port, or 0 for no admin HTTP"
					  : "");
		return rc;
	}
	if (!evhttp_bind_listener(a->http, lis)) {
		evconnlistener_free(lis);
		return -ENOMEM;
	}
	a->lis = lis;
	a->port = port;
	admin_register(a, 1);
	evconnlistener_set_error_cb(lis, admin_accept_error);
	bound_name(evconnlistener_get_fd(lis), where, sizeof(where));
	srv_info("admin http on %s (/metrics /healthz /stats)", where);
	return 0;
}

/* The admin's event base, evhttp and stop event. */
static int admin_init(struct srv_admin *a)
{
	struct event_config *cfg = event_config_new();

	if (cfg) {
		event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
		a->base = event_base_new_with_config(cfg);
		event_config_free(cfg);
	}
	if (!a->base)
		return -ENOMEM;
	a->http = evhttp_new(a->base);
	if (!a->http)
		return -ENOMEM;
	evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_timeout(a->http, ADMIN_TIMEOUT_S);
	evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEADERS_BYTES);
	evhttp_set_max_body_size(a->http, ADMIN_MAX_BODY_BYTES);
	evhttp_set_gencb(a->http, admin_request, a);
	evhttp_set_bevcb(a->http, admin_bev, a);
	a->log_rl.per_sec = 1;
	a->ev_resume = evtimer_new(a->base, admin_resume_cb, a);
	a->ev_cap_check = event_new(a->base, -1, EV_PERSIST, admin_cap_check_cb, a);
	if (!a->ev_resume || !a->ev_cap_check)
		return -ENOMEM;
	a->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a->stop_fd < 0)
		return -errno;
	a->ev_stop = event_new(a->base, a->stop_fd, EV_READ | EV_PERSIST, stop_cb, a);
	if (!a->ev_stop || event_add(a->ev_stop, NULL) < 0)
		return -ENOMEM;
	return 0;
}

/* Start the thread with every signal blocked: the main thread's event
 * base handles them. */
static int admin_thread_start(struct srv_admin *a)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&a->thread, NULL, admin_main, a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		return -rc;
	a->started = 1;
	return 0;
}

int srv_admin_start(struct srv *s, const char *listen, uint16_t port, struct srv_admin **out)
{
	struct srv_admin *a;
	int rc;

	if (port == 0) {
		*out = NULL;
		return 0;
	}
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->s = s;
	a->stop_fd = -1;
	rc = admin_init(a);
	if (rc == 0) {
		/* admin_bind logs its own failures, naming the address. */
		rc = admin_bind(a, listen, port);
		if (rc < 0)
			goto out_stop;
		rc = admin_thread_start(a);
	}
	if (rc < 0) {
		srv_err("admin: cannot start: %s", strerror(-rc));
		goto out_stop;
	}
	*out = a;
	return 0;

out_stop:
	srv_admin_stop(a);
	return rc;
}

void srv_admin_stop(struct srv_admin *a)
{
	uint64_t one = 1;

	if (!a)
		return;
	if (a->started) {
		if (write(a->stop_fd, &one, sizeof(one)) < 0)
			srv_err("admin: eventfd write: %s", strerror(errno));
		pthread_join(a->thread, NULL);
	}
	admin_register(a, 0);
	if (a->http)
		evhttp_free(a->http);
	if (a->ev_resume)
		event_free(a->ev_resume);
	if (a->ev_cap_check)
		event_free(a->ev_cap_check);
	if (a->ev_stop)
		event_free(a->ev_stop);
	if (a->stop_fd >= 0)
		close(a->stop_fd);
	if (a->base)
		event_base_free(a->base);
	free(a);
}
