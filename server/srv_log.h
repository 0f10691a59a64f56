/*
 * srv_log.h - kvpoold logging: timestamped, levelled lines on stderr, and a
 * sanitizer for dumping untrusted bytes from the wire.
 *
 * Messages are lowercase and, for a connection, start with "conn ID PEER:".
 * The level is checked before any formatting happens (the macro below), so
 * a disabled debug line costs one comparison.
 *
 * Threads: srv_log_set_level is called once by the main thread before any
 * other thread starts; everything else may be called from any thread. Each
 * line is written with one write(2), so lines from different threads do not
 * interleave.
 */
#ifndef KVPOOL_SRV_LOG_H
#define KVPOOL_SRV_LOG_H

#include <stddef.h>

enum srv_log_level { SRV_LOG_ERROR = 0, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };

/* The current level; lines above it are dropped. Set once at start. */
extern int srv_log_level;

/* Set the level (enum srv_log_level; values out of range are clamped). */
void srv_log_set_level(int level);

/* Format and write one line "YYYY-mm-ddTHH:MM:SS.mmmZ LEVEL message\n" to
 * stderr. Lines longer than 2 KiB are truncated. Use srv_log() instead. */
void srv_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define srv_log(level, ...)                                                     \
	do {                                                                    \
		if ((level) <= srv_log_level)                                   \
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

#endif /* KVPOOL_SRV_LOG_H */
