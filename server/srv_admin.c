/*
 * srv_admin.c - the admin HTTP server: /metrics, /healthz, /stats on a
 * thread and event base of its own.
 */
#include "srv_admin.h"

#include <errno.h>
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
#define ADMIN_TIMEOUT_S 30          /* a request that takes longer is dropped */
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
		srv_err("cannot listen on %s admin_port %u: %s", listen, port, strerror(-rc));
		return rc;
	}
	if (!evhttp_bind_listener(a->http, lis)) {
		evconnlistener_free(lis);
		return -ENOMEM;
	}
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
	if (a->http)
		evhttp_free(a->http);
	if (a->ev_stop)
		event_free(a->ev_stop);
	if (a->stop_fd >= 0)
		close(a->stop_fd);
	if (a->base)
		event_base_free(a->base);
	free(a);
}
