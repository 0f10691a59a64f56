/*
 * srv_server.h - kvpoold's main thread: configuration, the pool, the
 * listener, signals, the lease tick, and the worker threads.
 *
 * The main thread owns struct srv and its event base. Workers read the
 * configuration, the limits and the store pointer (all fixed before they
 * start) and update the connection counters with atomics. See THREADS.md.
 */
#ifndef KVPOOL_SRV_SERVER_H
#define KVPOOL_SRV_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "proto.h"
#include "srv_clock.h"
#include "srv_log.h"
#include "srv_rdma.h"

#define SRV_VERSION "0.1.1"

struct event_base;
struct evconnlistener;
struct event;
struct store;
struct srv_auth;
struct srv_tls_ctx;
struct srv_admin;
struct srv_worker;
struct srv_linger;
struct srv_events;
struct srv_mwait;

struct srv {
	struct conf conf;             /* written by the main thread only: SIGHUP
				       * changes the reloadable settings under
				       * conf_lock with atomic stores; other threads
				       * read those with atomic loads, or copy the
				       * struct under conf_lock */
	pthread_mutex_t conf_lock;
	int argc;                     /* kvpoold's arguments, read again on SIGHUP */
	char **argv;
	int state;                    /* enum srv_state (srv_lifecycle.h); atomic */
	struct event *ev_drain;       /* SIGTERM/SIGINT drain check; main thread */
	struct event *ev_watchdog;    /* systemd WATCHDOG=1 pings; main thread */
	uint64_t drain_start_ms, drain_timeout_ms;
	struct proto_limits limits;   /* decoder limits from conf */
	struct store *store;          /* thread-safe on its own */
	struct srv_auth *auth;        /* tokens_file, NULL without; thread-safe on its own */
	struct srv_tenants *tenants;  /* with auth: a store_tenant per token (srv_tenant.h) */
	uint64_t conn_max_leased_bytes;   /* max_conn_leased_bytes, 0 resolved */
	uint64_t tenant_max_leased_bytes; /* tenant_max_leased_bytes, 0 resolved */
	struct srv_admin *admin;      /* admin HTTP (srv_admin.h), NULL when off */
	struct srv_events *kv_events; /* KV-event publisher (srv_events.h), NULL when off;
				       * fixed from pool_open to shutdown */
	struct srv_mwait *mwait;      /* MATCHes waiting for blocks (srv_mwait.h); fixed
				       * from pool_open to shutdown */
	struct event_base *base;      /* main thread only */
	struct evconnlistener *listener;
	struct event *ev_sigterm, *ev_sigint, *ev_sighup, *ev_tick;
	struct srv_worker *workers;   /* n_workers of them */
	uint32_t n_workers;
	uint32_t next_worker;         /* round robin; main thread only */
	uint64_t next_conn_id;        /* main thread only */
	uint32_t lingering;           /* rejected sockets being drained; main thread */
	struct srv_linger *lingers;   /* their list; main thread */
	struct event *ev_accept_resume; /* re-enables accept after EMFILE */
	struct srv_ratelimit accept_log; /* "accept failed" lines; main thread */
	struct srv_ratelimit reject_log; /* connection rejected lines; main thread */
	uint32_t conn_limit;          /* max_connections, or fewer for RLIMIT_NOFILE */
	uint64_t start_ms;            /* CLOCK_MONOTONIC at start */
	/* Connection counts: atomics (main thread adds, workers subtract). */
	uint64_t conn_current, conn_total, conn_rejected;
	/* Start-up handshake: workers count themselves in. */
	pthread_mutex_t ready_lock;
	pthread_cond_t ready_cond;
	uint32_t ready;
	int stop_signal;              /* the signal that stopped us, 0 if none */
	/* Background fault-in of the arena at start-up (store_prefault). */
	pthread_t prefault_thread;
	int prefault_running;         /* main thread only */
	int prefault_stop;            /* atomic: main sets, prefault thread reads */
	struct srv_rdma_state rdma;   /* RDMA transport or why not; fixed before workers start */
	struct srv_etcd *etcd;        /* cluster registration (srv_etcd.c), NULL when standalone */
	struct srv_tls_ctx *tls;      /* TLS on the data port (srv_tls.h), NULL when off;
				       * thread-safe on its own (SIGHUP replaces its files) */
	int tls_only;                 /* plaintext clients are refused (srv_tls_only) */
};

/* Run kvpoold with settings `c` (already validated), which came from
 * argv[0..argc) and the environment (conf_load): open the pool, start the
 * workers, listen, tell systemd READY=1, serve until SIGTERM or SIGINT,
 * drain (srv_lifecycle.h), then shut down cleanly. SIGHUP reloads the
 * reloadable settings from the same arguments and environment; SIGUSR1
 * and SIGUSR2 are ignored. argv must outlive the call (argc 0 and argv NULL:
 * SIGHUP then reads defaults and environment only, as tests run it).
 * Called by main() on the main thread; blocks until shutdown. Returns 0 after a clean
 * shutdown, or a negative errno when start-up failed (the reason is
 * logged): -EADDRINUSE and other bind errors, -ENOMEM, -EINVAL (listen
 * address does not resolve). */
int srv_run(const struct conf *c, int argc, char **argv);

#endif /* KVPOOL_SRV_SERVER_H */
