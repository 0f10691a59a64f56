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

#define SRV_VERSION "0.1.0"

struct event_base;
struct evconnlistener;
struct event;
struct store;
struct srv_worker;
struct srv_linger;

struct srv {
	struct conf conf;             /* read-only once workers run */
	struct proto_limits limits;   /* decoder limits from conf */
	struct store *store;          /* thread-safe on its own */
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
};

/* Run kvpoold with settings `c` (already validated): open the pool, start
 * the workers, listen, serve until SIGTERM or SIGINT, then shut down
 * cleanly. SIGHUP is logged and otherwise ignored (no reload yet);
 * SIGUSR1 and SIGUSR2 are ignored. Called by main() on the main thread; blocks until shutdown.
 * Returns 0 after a clean shutdown, or a negative errno when start-up
 * failed (the reason is logged): -EADDRINUSE and other bind errors,
 * -ENOMEM, -EINVAL (listen address does not resolve). */
int srv_main(const struct conf *c);

/* Refuse a dram_capacity larger than the host's physical memory
 * (phys_bytes; 0 when unknown, which passes): returns 0, or -ENOMEM with a
 * message naming both in err[0..err_len). The arena is faulted in whole at
 * start-up, so a larger one would only end in the OOM killer. Pure. */
int srv_check_dram(uint64_t dram_capacity_bytes, uint64_t phys_bytes, char *err, size_t err_len);

/* The host's physical memory in bytes (sysconf _SC_PHYS_PAGES times the
 * page size), 0 when unknown. */
uint64_t srv_phys_bytes(void);

/* Milliseconds of CLOCK_MONOTONIC_COARSE (cheap; ~4 ms resolution). Any
 * thread. */
uint64_t srv_now_ms(void);

/* Microseconds of CLOCK_MONOTONIC. Any thread. */
uint64_t srv_now_us(void);

#endif /* KVPOOL_SRV_SERVER_H */
