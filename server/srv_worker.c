/*
 * srv_worker.c - worker threads: their event loop, the hand-off queue from
 * the main thread, the completion queue from the store's I/O threads, and
 * the timeout sweep.
 */
#include "srv_worker.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "srv_clock.h"
#include "srv_conn.h"
#include "srv_get.h"
#include "srv_log.h"
#include "srv_mwait.h"
#include "srv_rdma_conn.h"
#include "srv_server.h"
#include "srv_tcp.h"
#include "store.h"

/* A socket on its way from the main thread to a worker. */
struct srv_handoff {
	struct srv_handoff *next;
	void *rdma_req;   /* an RDMA connection request (fd is then -1), or NULL */
	int fd;
	uint64_t id;
	char peer[64];
};

/* Period of the timeout sweep: fine enough for the shortest timeout. */
static uint32_t sweep_period_ms(const struct conf *c)
{
	uint32_t p = 100;

	if (c->payload_timeout_ms && c->payload_timeout_ms / 4 < p)
		p = c->payload_timeout_ms / 4;
	if (c->idle_timeout_ms && c->idle_timeout_ms / 4 < p)
		p = c->idle_timeout_ms / 4;
	return p < 10 ? 10 : p;
}

/* Draining: close the idle connections and publish how many are left. */
static void drain_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_worker *w = arg;
	struct srv_conn *c, *next;
	uint32_t busy = 0;

	(void)fd;
	(void)what;
	for (c = w->conns; c; c = next) {
		next = c->next;
		if (c->ops->idle(c) && !c->mw_count)
			srv_conn_close(c, SRV_LOG_DEBUG, "server draining");
		else
			busy++;
	}
	__atomic_store_n(&w->busy, busy, __ATOMIC_RELEASE);
}

/* Start the drain timer (every 5 ms) and look once right now. */
static void drain_start(struct srv_worker *w)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = 5000 };

	if (w->ev_drain)
		return;
	/* waiting MATCHes are answered now: their connections can go idle */
	srv_mwait_worker_drain(w);
	w->ev_drain = event_new(w->base, -1, EV_PERSIST, drain_cb, w);
	if (!w->ev_drain || event_add(w->ev_drain, &tv) < 0) {
		/* no timer: close everything now rather than never */
		while (w->conns)
			srv_conn_close(w->conns, SRV_LOG_DEBUG, "server draining");
		__atomic_store_n(&w->busy, 0, __ATOMIC_RELEASE);
		return;
	}
	drain_cb(-1, 0, w);
}

/* Close every connection (shutdown). */
static void close_all(struct srv_worker *w, const char *reason)
{
	while (w->conns)
		srv_conn_close(w->conns, SRV_LOG_DEBUG, reason);
}

/* Hand every finished promotion in list g to its connection. */
static void done_run(struct srv_get_slot *g)
{
	struct srv_get_slot *next;

	for (; g; g = next) {
		next = g->done_next;
		g->done_next = NULL;
		srv_get_done(g);
	}
}

/* A queued socket or RDMA request nobody will serve (shutdown): close or
 * refuse it and give its connection count back. */
static void handoff_drop(struct srv_worker *w, struct srv_handoff *h)
{
	if (h->rdma_req)
		rdmx_listener_refuse(w->srv->rdma.listener, h->rdma_req);
	else
		close(h->fd);
	__atomic_fetch_sub(&w->srv->conn_current, 1, __ATOMIC_RELAXED);
}

/* Take the queued sockets and finished promotions; on stop, close every
 * connection and leave the loop. */
static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_worker *w = arg;
	struct srv_handoff *h, *next;
	struct srv_get_slot *done;
	uint64_t n;
	int stop, drain, recheck;

	(void)what;
	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		srv_warn("worker %u: eventfd read: %s", w->index, strerror(errno));
	pthread_mutex_lock(&w->lock);
	h = w->queue_head;
	w->queue_head = w->queue_tail = NULL;
	done = w->done_head;
	w->done_head = NULL;
	stop = w->stop;
	drain = w->drain;
	recheck = w->mw_recheck;
	w->mw_recheck = 0;
	pthread_mutex_unlock(&w->lock);
	done_run(done);
	srv_mwait_worker_run(w);
	if (recheck && !stop)
		srv_mwait_worker_recheck(w);
	for (; h; h = next) {
		next = h->next;
		if (stop)
			handoff_drop(w, h);
		else if (h->rdma_req)
			srv_rconn_open(w, h->rdma_req, h->id);
		else
			srv_tcp_open(w, h->fd, h->id, h->peer);
		free(h);
	}
	if (stop) {
		close_all(w, "server shutting down");
		event_base_loopbreak(w->base);
	} else if (drain) {
		drain_start(w);
	}
}

/* Close connections whose idle, frame or linger deadline has passed, and
 * report protocol-error log lines suppressed in the last second. */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
	struct srv_worker *w = arg;
	uint64_t now = srv_now_ms();
	uint64_t suppressed = srv_ratelimit_flush(&w->proto_log, now);
	struct srv_conn *c, *next;

	(void)fd;
	(void)what;
	if (suppressed)
		srv_warn("worker %u: %" PRIu64 " protocol error messages suppressed", w->index,
			 suppressed);
	for (c = w->conns; c; c = next) {
		next = c->next;
		srv_conn_check_timeouts(c, now);
	}
}

int srv_worker_init(struct srv_worker *w, struct srv *s, uint32_t index)
{
	struct event_config *cfg;
	struct timeval tv;
	uint32_t ms = sweep_period_ms(&s->conf);

	memset(w, 0, sizeof(*w));
	w->srv = s;
	w->index = index;
	w->notify_fd = -1;
	w->busy = UINT32_MAX;
	w->proto_log.per_sec = SRV_PROTO_LOG_PER_SEC;
	pthread_mutex_init(&w->lock, NULL);
	w->scratch = malloc(SRV_SCRATCH_BYTES);
	cfg = event_config_new();
	if (!w->scratch || !cfg)
		goto out_nomem;
	/* One thread per base: no locking inside libevent. */
	event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
	w->base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (!w->base)
		goto out_nomem;
	w->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->notify_fd < 0)
		return -errno;
	w->ev_notify = event_new(w->base, w->notify_fd, EV_READ | EV_PERSIST, notify_cb, w);
	w->ev_sweep = event_new(w->base, -1, EV_PERSIST, sweep_cb, w);
	if (!w->ev_notify || !w->ev_sweep)
		goto out_nomem;
	tv.tv_sec = ms / 1000;
	tv.tv_usec = (ms % 1000) * 1000;
	if (event_add(w->ev_notify, NULL) < 0 || event_add(w->ev_sweep, &tv) < 0)
		goto out_nomem;
	return 0;

out_nomem:
	return -ENOMEM;
}

/* Thread body: count ourselves in, then run the loop until stopped. */
static void *worker_main(void *arg)
{
	struct srv_worker *w = arg;
	struct srv *s = w->srv;
	char name[16];

	snprintf(name, sizeof(name), "kvpoold-w%u", w->index);
	pthread_setname_np(pthread_self(), name);
	pthread_mutex_lock(&s->ready_lock);
	s->ready++;
	pthread_cond_broadcast(&s->ready_cond);
	pthread_mutex_unlock(&s->ready_lock);
	event_base_dispatch(w->base);
	return NULL;
}

int srv_worker_start(struct srv_worker *w)
{
	sigset_t all, old;
	int rc;

	/* Signals are handled by the main thread's event base only. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rc = pthread_create(&w->thread, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		return -rc;
	w->started = 1;
	return 0;
}

void srv_worker_wake(struct srv_worker *w)
{
	uint64_t one = 1;

	if (write(w->notify_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		srv_err("worker %u: eventfd write: %s", w->index, strerror(errno));
}

void srv_worker_get_done(void *arg, int status)
{
	struct srv_get_slot *g = arg;
	struct srv_worker *w = g->c->w;
	int was_empty;

	g->done_status = status;
	pthread_mutex_lock(&w->lock);
	was_empty = !w->done_head;
	g->done_next = w->done_head;
	w->done_head = g;
	pthread_mutex_unlock(&w->lock);
	/* The worker takes the whole queue at once: only the first slot of a
	 * batch needs to wake it. */
	if (was_empty)
		srv_worker_wake(w);
}

void srv_worker_drain(struct srv_worker *w)
{
	struct srv_get_slot *done;

	pthread_mutex_lock(&w->lock);
	done = w->done_head;
	w->done_head = NULL;
	pthread_mutex_unlock(&w->lock);
	done_run(done);
}

/* Link h at the tail of w's hand-off queue and wake the worker. */
static void handoff_push(struct srv_worker *w, struct srv_handoff *h)
{
	pthread_mutex_lock(&w->lock);
	if (w->queue_tail)
		w->queue_tail->next = h;
	else
		w->queue_head = h;
	w->queue_tail = h;
	pthread_mutex_unlock(&w->lock);
	srv_worker_wake(w);
}

int srv_worker_hand_rdma(struct srv_worker *w, void *req, uint64_t id)
{
	struct srv_handoff *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->rdma_req = req;
	h->fd = -1;
	h->id = id;
	snprintf(h->peer, sizeof(h->peer), "rdma");
	handoff_push(w, h);
	return 0;
}

int srv_worker_hand(struct srv_worker *w, int fd, uint64_t id, const char *peer)
{
	struct srv_handoff *h = malloc(sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->next = NULL;
	h->rdma_req = NULL;
	h->fd = fd;
	h->id = id;
	snprintf(h->peer, sizeof(h->peer), "%s", peer);
	handoff_push(w, h);
	return 0;
}

void srv_worker_stop(struct srv_worker *w)
{
	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = 1;
	pthread_mutex_unlock(&w->lock);
	srv_worker_wake(w);
	pthread_join(w->thread, NULL);
	w->started = 0;
}

void srv_worker_recheck_waits(struct srv_worker *w)
{
	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	w->mw_recheck = 1;
	pthread_mutex_unlock(&w->lock);
	srv_worker_wake(w);
}

void srv_worker_drain_begin(struct srv_worker *w)
{
	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	w->drain = 1;
	pthread_mutex_unlock(&w->lock);
	srv_worker_wake(w);
}

uint32_t srv_worker_busy(struct srv_worker *w)
{
	if (!w->started)
		return 0;
	return __atomic_load_n(&w->busy, __ATOMIC_ACQUIRE);
}

void srv_worker_destroy(struct srv_worker *w)
{
	struct srv_handoff *h, *next;

	/* A worker that never ran may still hold queued sockets. */
	for (h = w->queue_head; h; h = next) {
		next = h->next;
		handoff_drop(w, h);
		free(h);
	}
	w->queue_head = w->queue_tail = NULL;
	if (w->srv) {
		close_all(w, "server shutting down");
		srv_mwait_worker_run(w); /* frees keys woken for waiters now gone */
	}
	/* Its connections are gone: now the worker's rdma_cm channel. */
	srv_rdma_worker_close(w);
	/* Only a promotion that never reported (store_drain broke its word)
	 * leaves a zombie: freeing it could let the store write into freed
	 * memory, so it is left, and said. */
	if (w->zombies)
		srv_err("worker %u: connections still wait for nvme reads at exit; not freed",
			w->index);
	if (w->ev_drain)
		event_free(w->ev_drain);
	if (w->ev_sweep)
		event_free(w->ev_sweep);
	if (w->ev_notify)
		event_free(w->ev_notify);
	if (w->notify_fd >= 0)
		close(w->notify_fd);
	if (w->base)
		event_base_free(w->base);
	free(w->scratch);
	pthread_mutex_destroy(&w->lock);
	memset(w, 0, sizeof(*w));
	w->notify_fd = -1;
}
