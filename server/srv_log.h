/*
 * srv_log.h - kvpoold logging: timestamped, levelled lines on stderr, and a
 * sanitizer for dumping untrusted bytes from the wire.
 *
 * Messages are lowercase and, for a connection, start with "conn ID PEER:".
 * The level is checked before any formatting happens (the macro below), so
 * a disabled debug line costs one comparison.
 *
 * Threads: srv_log_set_level is called by the main thread, at start and on
 * SIGHUP (the level is an atomic); everything else may be called from any
 * thread. Each
 * line is written with one write(2), so lines from different threads do not
 * interleave.
 */
#ifndef KVPOOL_SRV_LOG_H
#define KVPOOL_SRV_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum srv_log_level { SRV_LOG_ERROR = 0, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };

/* The current level; lines above it are dropped. Read and written with
 * relaxed atomics (SIGHUP changes it while workers log). */
extern int srv_log_level;

/* Set the level (enum srv_log_level; values out of range are clamped). */
void srv_log_set_level(int level);

/* Format and write one line "YYYY-mm-ddTHH:MM:SS.mmmZ LEVEL message\n" to
 * stderr. Lines longer than 2 KiB are truncated. Use srv_log() instead. */
void srv_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define srv_log(level, ...)                                                     \
	do {                                                                    \
		if ((level) <= __atomic_load_n(&srv_log_level, __ATOMIC_RELAXED)) \
			srv_log_write((level), __VA_ARGS__);                    \
	} while (0)

#define srv_err(...) srv_log(SRV_LOG_ERROR, __VA_ARGS__)
#define srv_warn(...) srv_log(SRV_LOG_WARN, __VA_ARGS__)
#define srv_info(...) srv_log(SRV_LOG_INFO, __VA_ARGS__)
#define srv_debug(...) srv_log(SRV_LOG_DEBUG, __VA_ARGS__)

/* Render in[0..in_bytes) as printable ASCII into out (capacity out_cap,
 * always NUL-terminated when out_cap > 0): bytes 0x20..0x7e except '\\'
 * are copied, '\\' becomes "\\\\", anything else "\\xHH". When the result
 * does not fit, it is cut at an escape boundary and ends with "...".
 * Returns the length written (excluding the NUL). Cannot fail. */
size_t srv_log_sanitize(const void *in, size_t in_bytes, char *out, size_t out_cap);

/* A cap on how many lines of one kind (a worker's protocol errors) are
 * written per second, so that a hostile client cannot fill the disk with
 * log. Windows are 1000 ms long and start at the first line after the
 * previous one ended. Pure: the caller passes the time, so tests can
 * drive the clock. Not thread-safe: one owner (a worker thread). */
struct srv_ratelimit {
	uint32_t per_sec;     /* lines allowed per window; set before use */
	uint32_t used;        /* lines allowed in the current window */
	uint64_t window_ms;   /* start of the current window */
	uint64_t suppressed;  /* lines refused in the current window */
};

/* May a line be written at now_ms (milliseconds of any monotonic clock)?
 * When a new window begins, *suppressed receives the number of lines the
 * window that just ended refused (the caller writes one "N ... messages
 * suppressed" line for them, before its own); otherwise 0. */
bool srv_ratelimit_allow(struct srv_ratelimit *rl, uint64_t now_ms, uint64_t *suppressed);

/* End the current window if it is over and return the lines it refused
 * (0 if none, or if the window is still running). Called from a periodic
 * timer, so that a burst is reported even when no line follows it. */
uint64_t srv_ratelimit_flush(struct srv_ratelimit *rl, uint64_t now_ms);

#endif /* KVPOOL_SRV_LOG_H */
