/*
 * srv_worker.h - a worker thread: one event base (no locking), the
 * connections handed to it, and its own counters.
 *
 * The main thread hands accepted sockets over through a small queue
 * protected by the worker's mutex and wakes the worker with an eventfd.
 * The store's I/O threads report finished promotions (GET of a block on
 * NVMe) the same way: a second queue under the same mutex, the same
 * eventfd. Everything else in struct srv_worker belongs to the worker
 * thread, except `stats`, which other workers read (relaxed atomics) for
 * STATS.
 */
#ifndef KVPOOL_SRV_WORKER_H
#define KVPOOL_SRV_WORKER_H

#include <pthread.h>
#include <stdint.h>

#include "srv_log.h"
#include "srv_stats.h"

struct srv;
struct srv_conn;
struct srv_handoff;
struct srv_get_slot;
struct mw_sub;
struct event;
struct event_base;
struct rdmx_worker;

#define SRV_CACHE_LINE_BYTES 64
#define SRV_SCRATCH_BYTES (256u * 1024) /* sink for refused PUT payload bytes */
/* Protocol-error log lines one worker writes per second at most. */
#define SRV_PROTO_LOG_PER_SEC 20

struct srv_worker {
	struct srv *srv;
	uint32_t index;
	pthread_t thread;
	int started;
	struct event_base *base;
	int notify_fd;                  /* eventfd: the main thread writes, we read */
	struct event *ev_notify;
	struct event *ev_sweep;         /* periodic timeout check of connections */
	/* Shared with the main thread, under `lock`. */
	pthread_mutex_t lock;
	struct srv_handoff *queue_head, *queue_tail;
	int stop;
	int drain;                      /* SIGTERM: close connections once idle */
	/* Written by this worker, read by main (atomic): connections still
	 * busy while draining; UINT32_MAX until the worker has looked. */
	uint32_t busy;
	/* Shared with the store's I/O threads, under `lock`: finished
	 * promotions (a stack; order does not matter). */
	struct srv_get_slot *done_head;
	int mw_recheck;                 /* SIGHUP: look at waiting MATCHes' grants */
	/* Shared with the store's event hook, under the MATCH-wait index's
	 * lock (srv_mwait.c): keys committed that this worker's waiting
	 * MATCHes wait for. */
	struct mw_sub *mw_woken;
	/* Worker thread only. */
	struct srv_conn *conns;         /* doubly linked list */
	uint32_t n_conns;
	struct srv_conn *zombies;       /* closed, promotions pending; doubly linked */
	struct event *ev_drain;         /* while draining: close idle connections */
	uint8_t *scratch;               /* SRV_SCRATCH_BYTES */
	/* RDMA (srv_rdma.c): this worker's rdma_cm channel and WR budget,
	 * opened on the main thread before the worker starts; NULL when RDMA
	 * is not served. Its connections are in `conns` (over the RDMA transport). */
	struct rdmx_worker *rdma;
	struct event *ev_rdma_cm;       /* rdmx_worker_fd, EV_READ */
	struct srv_ratelimit proto_log; /* protocol-error log lines */
	struct srv_conn *mw_ready;      /* connections with a MATCH to answer (one pass) */
	int mw_draining;                /* waiting MATCHes are answered at once */
	/* Written by this worker only; read by any worker for STATS. On
	 * cache lines of their own (the workers array is allocated 64-byte
	 * aligned), so that counting never invalidates a line that another
	 * worker reads on its hot path, such as the next worker's srv and base. */
	struct srv_stats stats __attribute__((aligned(SRV_CACHE_LINE_BYTES)));
} __attribute__((aligned(SRV_CACHE_LINE_BYTES)));

/* Set up worker `index` of `s` (base, eventfd, events, scratch) on the
 * main thread. Errors: -ENOMEM, or -errno from eventfd. On error the
 * worker holds nothing and srv_worker_destroy is still safe. */
int srv_worker_init(struct srv_worker *w, struct srv *s, uint32_t index);

/* Start the thread. It counts itself into s->ready before serving.
 * Errors: -errno from pthread_create. */
int srv_worker_start(struct srv_worker *w);

/* Main thread: queue socket fd (connection `id`, peer text) for the
 * worker and wake it. Ownership of fd passes to the worker on success.
 * Errors: -ENOMEM (fd still the caller's). */
int srv_worker_hand(struct srv_worker *w, int fd, uint64_t id, const char *peer);

/* Main thread: queue RDMA connection request `req` (from
 * rdmx_listener_take; the worker must have w->rdma) as connection `id`
 * and wake the worker, which accepts it (srv_rconn_open). Ownership of
 * req passes to the worker on success. Errors: -ENOMEM (req still the
 * caller's). */
int srv_worker_hand_rdma(struct srv_worker *w, void *req, uint64_t id);

/* Main thread: ask the worker to close every connection and exit, then
 * wait for it. No-op for a worker that never started. Connections with
 * promotions pending stay as zombies until srv_worker_drain. */
void srv_worker_stop(struct srv_worker *w);

/* Main thread: ask the worker to drain: from now on it closes each
 * connection as soon as it is idle (no frame partly received, no reply
 * waiting for NVMe or unsent), and publishes how many are still busy
 * (srv_worker_busy). New sockets handed to it are closed when idle too. */
void srv_worker_drain_begin(struct srv_worker *w);

/* Any thread: connections of w still busy after srv_worker_drain_begin,
 * or UINT32_MAX until the worker has counted them once. */
uint32_t srv_worker_busy(struct srv_worker *w);

/* store_get_done_fn for store_get_async: arg is the struct srv_get_slot
 * whose promotion ended. Records the status, queues the slot for its
 * connection's worker and wakes the worker. Any thread; never blocks
 * beyond the worker's queue mutex. */
void srv_worker_get_done(void *arg, int status);

/* Wake the worker's event loop (its eventfd), from any thread, after
 * queueing something it looks at in notify: a finished promotion, a
 * committed key its waiting MATCHes wait for (srv_mwait.c). A write(2);
 * never blocks. */
void srv_worker_wake(struct srv_worker *w);

/* Main thread, after SIGHUP reloaded the tokens: ask the worker to look
 * at its waiting MATCHes' grants (srv_mwait_worker_recheck) and wake it.
 * No-op for a worker that never started. */
void srv_worker_recheck_waits(struct srv_worker *w);

/* Main thread, after srv_worker_stop and store_drain (so every promotion
 * has reported): handle what is left in the completion queue, which
 * releases the blocks promoted for zombies and frees them. */
void srv_worker_drain(struct srv_worker *w);

/* Free what srv_worker_init set up (after srv_worker_stop). Accepts a
 * zeroed or half-initialised worker. */
void srv_worker_destroy(struct srv_worker *w);

#endif /* KVPOOL_SRV_WORKER_H */
