/*
 * srv_server.c - kvpoold's main thread: start-up, the listener and the
 * round-robin hand-off to workers, max_connections, signals, the lease
 * tick, and shutdown.
 */
#include "srv_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "srv_auth.h"
#include "srv_etcd.h"
#include "srv_fdlimit.h"
#include "srv_tenant.h"
#include "srv_tls.h"
#include "srv_admin.h"
#include "srv_events.h"
#include "srv_lifecycle.h"
#include "srv_log.h"
#include "srv_request.h"
#include "srv_mwait.h"
#include "srv_prefault.h"
#include "srv_worker.h"
#include "store.h"

#define TICK_MS 100
#define LISTEN_BACKLOG 1024
/* Rejected sockets drained at once before we just close them. */
#define LINGER_MAX 64
#define LINGER_MS 1000
/* Pause after accept fails for lack of descriptors or memory. */
#define ACCEPT_PAUSE_MS 100
#define MAX_THREADS 256

/* A rejected socket: the BUSY reply is sent, input is drained until the
 * peer closes, so the reply is not lost to a reset. */
struct srv_linger {
	struct srv_linger *prev, *next;
	struct srv *s;
	struct event *ev;
	int fd;
};

/* "1.2.3.4:5" or "[::1]:5". */
static void format_peer(const struct sockaddr *sa, char *buf, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(buf, cap, "[%s]:%u", host, ntohs(a->sin6_port));
	} else if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(buf, cap, "%s:%u", host, ntohs(a->sin_port));
	} else {
		snprintf(buf, cap, "unknown");
	}
}

/* ---- max_connections: reject with a connection-level BUSY reply ----- */

static void linger_free(struct srv_linger *l)
{
	if (l->prev)
		l->prev->next = l->next;
	else
		l->s->lingers = l->next;
	if (l->next)
		l->next->prev = l->prev;
	event_free(l->ev);
	close(l->fd);
	l->s->lingering--;
	free(l);
}

static void linger_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_linger *l = arg;
	char buf[4096];
	ssize_t n;

	if (!(what & EV_TIMEOUT)) {
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
			return;
	}
	linger_free(l);
}

/* Encode the connection-level BUSY reply into buf; returns its length. */
static size_t busy_frame(const struct srv *s, uint8_t *buf, size_t cap)
{
	char msg[96];
	int m = s->conn_limit < s->conf.max_connections ?
			snprintf(msg, sizeof(msg), "connection limit (%u, RLIMIT_NOFILE) reached",
				 s->conn_limit) :
			snprintf(msg, sizeof(msg), "max_connections (%u) reached",
				 s->conf.max_connections);
	size_t body = proto_error_body_bytes((size_t)m);
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = PROTO_VERSION,
		.opcode = PROTO_OP_NONE,
		.flags = PROTO_FLAG_REPLY,
		.status = PROTO_STATUS_BUSY,
		.body_bytes = (uint32_t)body,
	};

	proto_header_encode(&h, buf);
	proto_error_encode(msg, (size_t)m, buf + PROTO_HEADER_BYTES, cap - PROTO_HEADER_BYTES);
	return PROTO_HEADER_BYTES + body;
}

static void reject(struct srv *s, int fd, const char *peer)
{
	uint8_t frame[PROTO_HEADER_BYTES + 128];
	size_t len = busy_frame(s, frame, sizeof(frame));
	struct srv_linger *l = NULL;
	uint64_t suppressed;
	struct timeval tv = { .tv_sec = LINGER_MS / 1000, .tv_usec = (LINGER_MS % 1000) * 1000 };

	__atomic_fetch_add(&s->conn_rejected, 1, __ATOMIC_RELAXED);
	/* One line a second: a client storm must not flood the log. */
	if (srv_ratelimit_allow(&s->reject_log, srv_now_ms(), &suppressed))
		srv_info("connection from %s rejected: connection limit (%u) reached (%" PRIu64
			 " more rejections not logged)", peer, s->conn_limit, suppressed);
	/* A fresh socket's send buffer takes a few dozen bytes at once. */
	if (send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		goto out_close;
	if (s->lingering >= LINGER_MAX)
		goto out_close;
	shutdown(fd, SHUT_WR);
	l = calloc(1, sizeof(*l));
	if (!l)
		goto out_close;
	l->s = s;
	l->fd = fd;
	l->ev = event_new(s->base, fd, EV_READ | EV_PERSIST, linger_cb, l);
	if (!l->ev || event_add(l->ev, &tv) < 0)
		goto out_free;
	l->next = s->lingers;
	if (s->lingers)
		s->lingers->prev = l;
	s->lingers = l;
	s->lingering++;
	return;

out_free:
	if (l->ev)
		event_free(l->ev);
	free(l);
out_close:
	close(fd);
}

/* ---- accepting ----------------------------------------------------------- */

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
		      int socklen, void *arg)
{
	struct srv *s = arg;
	struct srv_worker *w;
	char peer[64];
	int one = 1;
	uint64_t id;

	(void)lis;
	(void)socklen;
	format_peer(sa, peer, sizeof(peer));
	if (__atomic_load_n(&s->conn_current, __ATOMIC_RELAXED) >= s->conn_limit) {
		reject(s, fd, peer);
		return;
	}
	/* Replies are small and latency matters: no Nagle delay. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	__atomic_fetch_add(&s->conn_current, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->conn_total, 1, __ATOMIC_RELAXED);
	id = ++s->next_conn_id;
	w = &s->workers[s->next_worker++ % s->n_workers];
	if (srv_worker_hand(w, fd, id, peer) < 0) {
		srv_err("conn %" PRIu64 " %s: out of memory, dropped", id, peer);
		close(fd);
		__atomic_fetch_sub(&s->conn_current, 1, __ATOMIC_RELAXED);
	}
}

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;

	(void)fd;
	(void)what;
	evconnlistener_enable(s->listener);
}

/* accept() failed: out of descriptors or memory would make the listener
 * spin, so pause it briefly. */
static void accept_error_cb(struct evconnlistener *lis, void *arg)
{
	struct srv *s = arg;
	struct timeval tv = { .tv_sec = 0, .tv_usec = ACCEPT_PAUSE_MS * 1000 };
	int err = EVUTIL_SOCKET_ERROR();

	uint64_t suppressed;

	/* Running out of descriptors repeats every pause: one line a second. */
	if (srv_ratelimit_allow(&s->accept_log, srv_now_ms(), &suppressed))
		srv_warn("accept failed: %s; pausing %d ms (%" PRIu64 " more such failures"
			 " not logged)", strerror(err), ACCEPT_PAUSE_MS, suppressed);
	evconnlistener_disable(lis);
	if (!s->ev_accept_resume)
		s->ev_accept_resume = evtimer_new(s->base, accept_resume_cb, s);
	if (s->ev_accept_resume)
		evtimer_add(s->ev_accept_resume, &tv);
	else
		evconnlistener_enable(lis);
}

/* Bind and listen on conf.listen:conf.port (IPv4 or IPv6). */
static int listen_start(struct srv *s)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_UNSPEC,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *ai = NULL;
	struct sockaddr_storage bound;
	socklen_t bound_len = sizeof(bound);
	char port[16], where[300];
	int rc;

	snprintf(port, sizeof(port), "%u", s->conf.port);
	rc = getaddrinfo(s->conf.listen, port, &hints, &ai);
	if (rc) {
		srv_err("cannot resolve listen address %s: %s", s->conf.listen, gai_strerror(rc));
		return -EINVAL;
	}
	s->listener = evconnlistener_new_bind(s->base, accept_cb, s,
					      LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE |
						      LEV_OPT_CLOSE_ON_EXEC,
					      LISTEN_BACKLOG, ai->ai_addr, (int)ai->ai_addrlen);
	rc = s->listener ? 0 : -errno;
	freeaddrinfo(ai);
	if (rc < 0) {
		srv_err("cannot listen on %s port %u (the data port, setting port): %s%s",
			s->conf.listen, s->conf.port, strerror(-rc),
			rc == -EADDRINUSE ? "; kvpoold uses up to three ports: port (data, 7470), "
					    "admin_port (HTTP, 7471; 0 = off) and rdma_port (7472; "
					    "0 = off): choose free ones" : "");
		return rc;
	}
	evconnlistener_set_error_cb(s->listener, accept_error_cb);
	if (getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&bound,
			&bound_len) == 0)
		format_peer((struct sockaddr *)&bound, where, sizeof(where));
	else
		snprintf(where, sizeof(where), "%s:%u", s->conf.listen, s->conf.port);
	srv_info("kvpoold %s listening on %s (%u workers, dram_capacity %" PRIu64 " bytes)",
		 SRV_VERSION, where, s->n_workers, s->conf.dram_capacity_bytes);
	return 0;
}

/* ---- workers ------------------------------------------------------------- */

/* Start every worker and wait until all of them run their loops. */
static int workers_start(struct srv *s)
{
	uint32_t n = s->conf.threads;
	int rc;

	if (n == 0) {
		long cores = sysconf(_SC_NPROCESSORS_ONLN);

		n = cores > 0 ? (uint32_t)cores : 1;
	}
	if (n > MAX_THREADS)
		n = MAX_THREADS;
	/* Cache-line aligned, so each worker's counters have their lines. */
	s->workers = aligned_alloc(SRV_CACHE_LINE_BYTES, n * sizeof(*s->workers));
	if (!s->workers)
		return -ENOMEM;
	memset(s->workers, 0, n * sizeof(*s->workers));
	for (uint32_t i = 0; i < n; i++) {
		s->n_workers = i + 1;
		rc = srv_worker_init(&s->workers[i], s, i);
		if (rc < 0) {
			srv_err("cannot start worker %u: %s", i, strerror(-rc));
			return rc;
		}
	}
	/* Every worker's RDMA context, before any worker reads s->rdma. */
	srv_rdma_workers_open(s);
	for (uint32_t i = 0; i < n; i++) {
		rc = srv_worker_start(&s->workers[i]);
		if (rc < 0) {
			srv_err("cannot start worker %u: %s", i, strerror(-rc));
			return rc;
		}
	}
	pthread_mutex_lock(&s->ready_lock);
	while (s->ready < n)
		pthread_cond_wait(&s->ready_cond, &s->ready_lock);
	pthread_mutex_unlock(&s->ready_lock);
	return 0;
}

/* A stop by signal, with an NVMe tier: write the DRAM-only blocks to NVMe
 * (hottest first) for at most nvme_drain_ms, so the restart finds them. */
static void keep_dram(struct srv *s)
{
	uint64_t kept = 0, left = 0, t0 = srv_now_ms();
	int rc;

	if (!s->conf.nvme_dir[0] || !s->conf.nvme_drain_ms)
		return;
	rc = store_keep_dram(s->store, s->conf.nvme_drain_ms, &kept, &left);
	if (rc == -ENODEV)
		return;
	if (rc == 0)
		srv_info("nvme: kept %" PRIu64 " dram-only blocks on nvme for the restart "
			 "(%" PRIu64 " ms)", kept, srv_now_ms() - t0);
	else
		srv_warn("nvme: kept %" PRIu64 " dram-only blocks on nvme for the restart; %" PRIu64
			 " are lost (%s)", kept, left,
			 rc == -ETIMEDOUT ? "nvme_drain_ms ran out" : "the tier cannot take writes");
}

/* Stop every worker (each closes its connections), let the store finish
 * the promotions in flight (their done callbacks land in the workers'
 * queues), hand those back, which frees the connections that waited for
 * them, and only then free the workers. */
static void workers_stop(struct srv *s)
{
	for (uint32_t i = 0; i < s->n_workers; i++)
		srv_worker_stop(&s->workers[i]);
	if (s->store && s->stop_signal)
		keep_dram(s);
	if (s->store)
		store_drain(s->store);
	for (uint32_t i = 0; i < s->n_workers; i++)
		srv_worker_drain(&s->workers[i]);
	for (uint32_t i = 0; i < s->n_workers; i++)
		srv_worker_destroy(&s->workers[i]);
	free(s->workers);
	s->workers = NULL;
	s->n_workers = 0;
}

/* ---- signals and the tick ------------------------------------------------ */

/* SIGTERM, SIGINT: drain, then stop (srv_lifecycle_stop). */
static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	srv_lifecycle_stop(arg, (int)sig);
}

/* SIGHUP: reload the reloadable settings. */
static void sighup_cb(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	srv_lifecycle_reload(arg);
}

/* Expire leases that ran out. */
static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv *s = arg;

	(void)fd;
	(void)what;
	store_tick(s->store);
}

static int events_start(struct srv *s)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = TICK_MS * 1000 };

	s->ev_sigterm = evsignal_new(s->base, SIGTERM, signal_cb, s);
	s->ev_sigint = evsignal_new(s->base, SIGINT, signal_cb, s);
	s->ev_sighup = evsignal_new(s->base, SIGHUP, sighup_cb, s);
	s->ev_tick = event_new(s->base, -1, EV_PERSIST, tick_cb, s);
	if (!s->ev_sigterm || !s->ev_sigint || !s->ev_sighup || !s->ev_tick)
		return -ENOMEM;
	if (evsignal_add(s->ev_sigterm, NULL) < 0 || evsignal_add(s->ev_sigint, NULL) < 0 ||
	    evsignal_add(s->ev_sighup, NULL) < 0 || event_add(s->ev_tick, &tv) < 0)
		return -ENOMEM;
	return 0;
}

static void events_free(struct srv *s)
{
	if (s->ev_tick)
		event_free(s->ev_tick);
	if (s->ev_sighup)
		event_free(s->ev_sighup);
	if (s->ev_sigint)
		event_free(s->ev_sigint);
	if (s->ev_sigterm)
		event_free(s->ev_sigterm);
	if (s->ev_accept_resume)
		event_free(s->ev_accept_resume);
	s->ev_accept_resume = NULL;
	while (s->lingers)
		linger_free(s->lingers);
}

/* ---- start and stop -------------------------------------------------------- */

/* store_log_fn: the store's lines go to our log at the matching level. */
static void store_log(void *arg, enum store_log_level level, const char *msg)
{
	static const int levels[] = {
		[STORE_LOG_ERR] = SRV_LOG_ERROR, [STORE_LOG_WARN] = SRV_LOG_WARN,
		[STORE_LOG_INFO] = SRV_LOG_INFO, [STORE_LOG_DEBUG] = SRV_LOG_DEBUG,
	};

	(void)arg;
	srv_log((unsigned int)level <= STORE_LOG_DEBUG ? levels[level] : SRV_LOG_DEBUG, "%s", msg);
}

/* The store's settings from ours. */
static void pool_config(const struct conf *c, struct store_config *sc)
{
	*sc = (struct store_config){
		.dram_capacity_bytes = c->dram_capacity_bytes,
		.max_block_bytes = c->max_block_bytes,
		.max_inflight_put_bytes = c->max_inflight_put_bytes,
		.max_lease_ms = c->max_lease_ms,
		.max_retain_ms = c->max_retain_ms,
		/* per namespace, and each tenant's unless its token sets one */
		.max_retained_bytes = c->max_retained_bytes ? c->max_retained_bytes :
							      c->dram_capacity_bytes / 4,
		/* the whole pool, so that ordinary blocks always have room */
		.max_retained_total_bytes = c->max_retained_total_bytes
						    ? c->max_retained_total_bytes
						    : c->dram_capacity_bytes / 2,
		.nvme_dir = c->nvme_dir[0] ? c->nvme_dir : NULL,
		.nvme_capacity_bytes = c->nvme_capacity_bytes,
		.nvme_segment_bytes = c->nvme_segment_bytes,
		.nvme_io_threads = c->nvme_io_threads,
		.nvme_admission = c->nvme_admission == CONF_ADMIT_REUSED ? STORE_ADMIT_REUSED :
									  STORE_ADMIT_ALL,
		.log = store_log,
	};
}

/* After a warm start: what the rebuild found, and a warning when the
 * filesystem cannot hold nvme_capacity (the tier would meet ENOSPC and
 * fall back to DRAM only; better to know at start). */
static void nvme_report(struct srv *s)
{
	struct store_stats st;
	struct statvfs fs;
	uint64_t room;

	store_stats(s->store, &st);
	if (!st.nvme_enabled)
		return;
	/* a rate over less than 1 ms means nothing: not printed then (the
	 * storage's own rebuild line does the same) */
	if (st.rebuild_ms)
		srv_info("nvme tier: %" PRIu64 " blocks rebuilt in %" PRIu64 " ms (%" PRIu64
			 " blocks/s), %" PRIu64 " orphans dropped", st.rebuild_blocks,
			 st.rebuild_ms, st.rebuild_blocks * 1000 / st.rebuild_ms,
			 st.orphans_dropped);
	else
		srv_info("nvme tier: %" PRIu64 " blocks rebuilt in under 1 ms, %" PRIu64
			 " orphans dropped", st.rebuild_blocks, st.orphans_dropped);
	if (statvfs(s->conf.nvme_dir, &fs) < 0)
		return;
	room = (uint64_t)fs.f_bavail * fs.f_frsize + st.nvme_used_bytes;
	if (room < st.nvme_capacity_bytes)
		srv_warn("nvme_capacity (%" PRIu64 " bytes) exceeds the free space of %s plus what "
			 "the tier holds (%" PRIu64 " bytes): when the disk fills, the tier stops "
			 "taking blocks and puts fall back to DRAM only", st.nvme_capacity_bytes,
			 s->conf.nvme_dir, room);
}

/* Load tokens_file, if set: from then on HELLO needs a valid token
 * (srv_auth.h). A bad file stops the start, naming the file and line. */
static int auth_open(struct srv *s)
{
	char err[512] = "";
	int rc;

	if (!s->conf.tokens_file[0])
		return 0;
	rc = srv_auth_load(s->conf.tokens_file, &s->auth, err, sizeof(err));
	if (rc < 0) {
		srv_err("%s", err[0] ? err : strerror(-rc));
		return rc;
	}
	srv_auth_log_loaded(s->auth, "", s->conf.tokens_file);
	s->tenants = srv_tenants_new();
	if (!s->tenants)
		return -ENOMEM;
	return 0;
}

/* TLS on the data port when tls_cert_file is set: load the certificate,
 * key and client CA (srv_check_paths loaded them once already, so a
 * failure here is a file changed meanwhile), and decide tls_only. */
static int tls_open(struct srv *s)
{
	char warn[512] = "", err[512] = "", what[400];
	int rc;

	s->tls_only = srv_tls_only(&s->conf, srv_listen_is_loopback(s->conf.listen));
	if (!srv_tls_configured(&s->conf))
		return 0;
	rc = srv_tls_ctx_open(&s->conf, &s->tls, warn, sizeof(warn), err, sizeof(err));
	if (rc < 0) {
		srv_err("%s", err);
		return rc;
	}
	if (warn[0])
		srv_warn("%s", warn);
	srv_tls_ctx_describe(s->tls, what, sizeof(what));
	srv_info("tls: %s; %s%s; kernel tls asked for (used per connection when the kernel "
		 "has it: STATS tls.kernel_tls)", what,
		 s->tls_only ? "plaintext clients refused (tls_only)" :
			       "plaintext clients served too (tls_only false)",
		 s->conf.tls_client_ca_file[0] ? "; client certificates required" : "");
	return 0;
}

/* Start the KV-event publisher when kv_events_endpoint is set, and hook it
 * to the pool: what the pool holds already (blocks rebuilt from NVMe) is
 * announced first, once. */
static int kv_events_open(struct srv *s)
{
	struct srv_events_config ec = {
		.endpoint = s->conf.kv_events_endpoint,
		.replay_endpoint = s->conf.kv_events_replay_endpoint,
		.topic = s->conf.kv_events_topic,
		.buffer_batches = s->conf.kv_events_buffer,
		.queue_events = s->conf.kv_events_queue,
		.block_size = s->conf.kv_events_block_size,
		.replay_max_bytes = s->conf.kv_events_replay_max_bytes,
	};
	char why[512] = "";
	int rc;

	if (!s->conf.kv_events_endpoint[0])
		return 0;
	rc = srv_events_open(&ec, &s->kv_events, why, sizeof(why));
	if (rc < 0) {
		s->kv_events = NULL;
		srv_err("cannot start kv events: %s", why[0] ? why : strerror(-rc));
		return rc;
	}
	srv_info("kv events: publishing on %s%s%s, topic %s", s->conf.kv_events_endpoint,
		 s->conf.kv_events_replay_endpoint[0] ? ", replay on " : "",
		 s->conf.kv_events_replay_endpoint, s->conf.kv_events_topic);
	return 0;
}

/* The store's event hook (store lock held, any thread): the MATCH waits
 * first (a wake-up is what a waiting decode node is timed by), then the
 * KV-event publisher. */
static void store_event(void *arg, const struct store_event *e)
{
	struct srv *s = arg;

	srv_mwait_hook(s->mwait, e);
	if (s->kv_events)
		srv_events_hook(s->kv_events, e);
}

/* Unhook the pool's events (every worker has stopped: no MATCH waits),
 * then stop the publisher (what is queued is sent first). */
static void kv_events_close(struct srv *s)
{
	if (s->store)
		store_set_event_hook(s->store, NULL, NULL);
	if (s->kv_events)
		srv_events_close(s->kv_events);
	s->kv_events = NULL;
	srv_mwait_free(s->mwait);
	s->mwait = NULL;
}

/* Open the pool; with an NVMe tier this rebuilds its index first, which
 * is why the ports open only afterwards (serve). */
static int pool_open(struct srv *s)
{
	struct store_config sc;
	char why[512] = "";
	int rc;

	pool_config(&s->conf, &sc);
	rc = store_open(&sc, &s->store, why, sizeof(why));
	if (rc < 0) {
		s->store = NULL;
		if (sc.nvme_dir)
			srv_err("cannot open the pool (dram_capacity %" PRIu64 " bytes, nvme_dir %s): %s",
				sc.dram_capacity_bytes, sc.nvme_dir, why[0] ? why : strerror(-rc));
		else
			srv_err("cannot open the pool (dram_capacity %" PRIu64 " bytes): %s",
				sc.dram_capacity_bytes, why[0] ? why : strerror(-rc));
		return rc;
	}
	nvme_report(s);
	s->mwait = srv_mwait_new(s);
	if (!s->mwait)
		return -ENOMEM;
	rc = kv_events_open(s);
	if (rc < 0)
		return rc;
	/* what the pool holds already (blocks rebuilt from NVMe) is announced
	 * to the publisher first, once */
	store_set_event_hook(s->store, store_event, s);
	srv_prefault_start(s);
	return 0;
}

/* Several nodes: register in the cluster's etcd (srv_etcd.c) once the
 * ports listen. A registration that cannot start is logged; the node
 * serves anyway. */
static void cluster_start(struct srv *s)
{
	struct srv_etcd_node n = {
		.cluster_url = s->conf.cluster, .node_name = s->conf.node_name,
		.address = s->conf.advertise_address, .listen = s->conf.listen,
		.port = (uint16_t)s->conf.port, .rdma_port = s->rdma.port,
		.admin_port = (uint16_t)s->conf.admin_port, .rdma = s->rdma.available,
		.tls = s->tls != NULL,
		.dram_capacity_bytes = s->conf.dram_capacity_bytes,
		.nvme_capacity_bytes = s->conf.nvme_dir[0] ? s->conf.nvme_capacity_bytes : 0,
		.lease_s = s->conf.cluster_lease_s,
	};
	int rc;

	if (!s->conf.cluster[0])
		return;
	rc = srv_etcd_start(&n, &s->etcd);
	if (rc)
		srv_err("cluster: cannot register in %s: %s; serving standalone", s->conf.cluster,
			strerror(-rc));
}

/* Serve until a signal: workers first (so the listener never hands a
 * socket to nobody), then the listener. */
static int serve(struct srv *s)
{
	int rc = workers_start(s);

	if (rc == 0)
		rc = events_start(s);
	if (rc == 0)
		rc = listen_start(s);
	if (rc == 0)
		rc = srv_rdma_start(s);
	if (rc == 0)
		rc = srv_lifecycle_ready(s);
	if (rc < 0)
		return rc;
	cluster_start(s);
	event_base_dispatch(s->base);
	srv_etcd_leave(s->etcd); /* leave the cluster before the connections close */
	srv_info("shutting down (%s)", s->stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
	return 0;
}

/* libevent's own messages (a failing accept() in evhttp, a bad
 * bufferevent...) through our log, at most 10 lines a second from all
 * threads together, instead of libevent's unbounded stderr lines. */
static pthread_mutex_t libevent_log_lock = PTHREAD_MUTEX_INITIALIZER;
static struct srv_ratelimit libevent_log_rl = { .per_sec = 10 };

static void libevent_log(int severity, const char *msg)
{
	int level = severity >= EVENT_LOG_ERR ? SRV_LOG_ERROR :
		    severity == EVENT_LOG_WARN ? SRV_LOG_WARN :
		    severity == EVENT_LOG_MSG ? SRV_LOG_INFO : SRV_LOG_DEBUG;
	uint64_t suppressed = 0;
	bool allow;

	if (level > __atomic_load_n(&srv_log_level, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&libevent_log_lock);
	allow = srv_ratelimit_allow(&libevent_log_rl, srv_now_ms(), &suppressed);
	pthread_mutex_unlock(&libevent_log_lock);
	if (suppressed)
		srv_log(level, "libevent: %" PRIu64 " more messages not logged", suppressed);
	if (allow)
		srv_log(level, "libevent: %s", msg);
}

int srv_run(const struct conf *c, int argc, char **argv)
{
	struct srv *s = calloc(1, sizeof(*s));
	struct event_config *cfg;
	int rc = -ENOMEM;

	if (!s)
		return -ENOMEM;
	/* Signals whose default action would kill us: ignored from the start
	 * (SIGHUP gets its logging handler once the loop runs). */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGUSR1, SIG_IGN);
	signal(SIGUSR2, SIG_IGN);
	srv_log_set_level(c->log_level);
	event_set_log_callback(libevent_log);
	s->conf = *c;
	s->argc = argc;
	s->argv = argv;
	pthread_mutex_init(&s->conf_lock, NULL);
	s->limits.max_frame_bytes = c->max_frame_bytes;
	s->limits.max_batch_blocks = c->max_batch_blocks;
	s->limits.max_block_bytes = c->max_block_bytes;
	/* lease bounds: 0 means a quarter (connection) or half (tenant) of
	 * the arena, so that no one holder can pin all of DRAM */
	s->conn_max_leased_bytes = c->max_conn_leased_bytes ? c->max_conn_leased_bytes :
				   c->dram_capacity_bytes / 4;
	s->tenant_max_leased_bytes = c->tenant_max_leased_bytes ? c->tenant_max_leased_bytes :
				     c->dram_capacity_bytes / 2;
	/* a bound of the whole arena or more bounds nothing: the store then
	 * keeps leasing MATCHes on their lock-free path (store_lessee_limit) */
	if (s->conn_max_leased_bytes >= c->dram_capacity_bytes)
		s->conn_max_leased_bytes = 0;
	if (s->tenant_max_leased_bytes >= c->dram_capacity_bytes)
		s->tenant_max_leased_bytes = 0;
	s->start_ms = srv_now_ms();
	s->accept_log.per_sec = 1;
	s->reject_log.per_sec = 1;
	srv_conn_limit_update(s);
	pthread_mutex_init(&s->ready_lock, NULL);
	pthread_cond_init(&s->ready_cond, NULL);
	cfg = event_config_new();
	if (cfg) {
		event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
		s->base = event_base_new_with_config(cfg);
		event_config_free(cfg);
	}
	if (!s->base)
		goto out_free;
	/* The admin port answers (503 "starting") while the pool opens. */
	rc = srv_admin_start(s, s->conf.listen, (uint16_t)s->conf.admin_port, &s->admin);
	if (rc < 0)
		goto out_base;
	rc = auth_open(s);
	if (rc == 0)
		rc = tls_open(s);
	if (rc == 0)
		rc = pool_open(s);
	if (rc == 0)
		srv_retain_budget_warn(s, "");
	if (rc == 0)
		srv_rdma_open(s, &s->rdma, srv_rdma_test_ops);
	if (rc == 0)
		rc = serve(s);
	/* Stop accepting, close every connection, then free the pool. */
	if (s->listener)
		evconnlistener_free(s->listener);
	srv_rdma_stop_accepting(s);
	srv_admin_stop(s->admin);
	workers_stop(s);
	srv_etcd_free(s->etcd);
	srv_rdma_close(&s->rdma);
	events_free(s);
	srv_lifecycle_free(s);
	srv_prefault_stop(s);
	kv_events_close(s);
	srv_tenants_free(s->tenants);
	store_close(s->store);
	srv_auth_free(s->auth);
	srv_tls_ctx_free(s->tls);
out_base:
	event_base_free(s->base);
	if (rc == 0)
		srv_info("stopped");
out_free:
	pthread_cond_destroy(&s->ready_cond);
	pthread_mutex_destroy(&s->ready_lock);
	pthread_mutex_destroy(&s->conf_lock);
	free(s);
	return rc;
}
