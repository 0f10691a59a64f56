/*
 * srv_lifecycle.h - kvpoold's life as a service: systemd readiness and
 * watchdog (sd_notify), SIGHUP reload of the reloadable settings, the
 * SIGTERM/SIGINT drain, and protected mode.
 *
 * Threads: everything here runs on the main thread, from its event base,
 * except srv_state (any thread) and the pure functions.
 */
#ifndef KVPOOL_SRV_LIFECYCLE_H
#define KVPOOL_SRV_LIFECYCLE_H

#include <stddef.h>

#include "conf.h"

struct srv;

/* What the server is doing, for /healthz and logs. */
enum srv_state {
	SRV_STATE_STARTING = 0, /* pool opening (NVMe rebuild), ports not yet open */
	SRV_STATE_SERVING = 1,  /* listening, READY=1 sent */
	SRV_STATE_DRAINING = 2, /* SIGTERM/SIGINT: no more accepts, requests finishing */
};

/* The current enum srv_state of s. Any thread (atomic load). */
int srv_state(const struct srv *s);

/* Is `listen` (an address or host name, as the setting) loopback only:
 * every address it resolves to in 127.0.0.0/8 or ::1? Returns 1 or 0;
 * an address that does not resolve counts as not loopback (0). */
int srv_listen_is_loopback(const char *listen);

/* Protected mode: a listen address that is not loopback with no
 * tokens_file needs allow_unauthenticated = true. Returns 0 when c may
 * start, or -EPERM with a message naming the settings in err[0..err_len).
 * *warn is set to 1 when c starts unprotected on purpose (the caller logs
 * a warning), else 0. Resolves c->listen (srv_listen_is_loopback). */
int srv_protected_check(const struct conf *c, int *warn, char *err, size_t err_len);

/* What the settings name must exist before start-up begins, so that it
 * is reported as a bad setting: listen resolves (as the listener will
 * resolve it), nvme_dir (if set) is an existing directory this user may
 * write in, tokens_file (if set) loads (srv_auth_load, then freed).
 * Returns 0, or a negative errno with a lowercase message naming the
 * setting in err[0..err_len): -EINVAL (listen), -ENOENT, -ENOTDIR,
 * -EACCES or another stat errno (nvme_dir), srv_auth_load's errors
 * (tokens_file). Main thread; it may block on name resolution. */
int srv_check_paths(const struct conf *c, char *err, size_t err_len);

/* Main thread, once the ports listen (after the NVMe rebuild, which
 * store_open does): state SERVING, sd_notify READY=1 with a STATUS line,
 * and, when systemd asks for it (WATCHDOG_USEC), a timer that sends
 * WATCHDOG=1 every half period from the main event loop. Errors: -ENOMEM
 * (timer). Without NOTIFY_SOCKET the notifications are no-ops. */
int srv_lifecycle_ready(struct srv *s);

/* Main thread, on SIGTERM or SIGINT: the first signal sends STOPPING=1,
 * closes the listener, and lets every worker finish the requests it has
 * read (srv_worker_drain_begin); when none is left, or after
 * drain_timeout_ms, the main loop ends and shutdown closes the rest. A
 * second signal ends the loop at once. */
void srv_lifecycle_stop(struct srv *s, int sig);

/* Main thread, on SIGHUP: read every source again (conf_load with the
 * process's argv and environment), log each changed setting, apply the
 * reloadable ones (log_level, max_connections, idle_timeout_ms,
 * payload_timeout_ms, drain_timeout_ms, max_match_wait_ms,
 * max_conn_match_waits, tenant_max_match_waits, max_match_wait_bytes,
 * tokens_file) and keep the
 * others until a restart. With a tokens file, every worker is then asked
 * to answer the waiting MATCHes whose token's grant changed
 * (srv_worker_recheck_waits). A configuration that does not load is
 * logged and changes nothing. */
void srv_lifecycle_reload(struct srv *s);

/* Free what srv_lifecycle_ready and srv_lifecycle_stop set up (timers).
 * Main thread, after the loop ends. */
void srv_lifecycle_free(struct srv *s);

/* The effective settings of s as the JSON object of conf_json, copied
 * under the lock that SIGHUP takes to change them. Any thread. Returns a
 * malloc'd NUL-terminated string (the caller frees it), or NULL when out
 * of memory. */
char *srv_settings_json(struct srv *s);

#endif /* KVPOOL_SRV_LIFECYCLE_H */
