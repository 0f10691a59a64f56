/*
 * log.c - storage/'s log lines: through the pool's log callback
 * (store_config.log), plain or rate-limited (one line per second per
 * limiter, counting what it suppressed).
 */
#include <stdarg.h>
#include <stdio.h>

#include "core.h"

#define LOG_INTERVAL_MS 1000u

static void vlog(struct store *s, enum store_log_level level, const char *fmt, va_list ap)
{
	char msg[512];

	if (!s->cfg.log)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	s->cfg.log(s->cfg.log_arg, level, msg);
}

void store_log(struct store *s, enum store_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(s, level, fmt, ap);
	va_end(ap);
}

/* The limiter's fields are updated atomically without the store lock by
 * whichever thread logs; two threads racing may both print a line. */
void store_log_limited(struct store *s, struct store_ratelimit *rl, enum store_log_level level,
		       const char *fmt, ...)
{
	uint64_t now = store_now_ms(), last = __atomic_load_n(&rl->last_ms, __ATOMIC_RELAXED);
	uint64_t suppressed;
	char line[448];
	va_list ap;

	if (last && now - last < LOG_INTERVAL_MS) {
		__atomic_add_fetch(&rl->suppressed, 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_store_n(&rl->last_ms, now, __ATOMIC_RELAXED);
	suppressed = __atomic_exchange_n(&rl->suppressed, 0, __ATOMIC_RELAXED);
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (suppressed)
		store_log(s, level, "%s (%llu more like it suppressed)", line,
			  (unsigned long long)suppressed);
	else
		store_log(s, level, "%s", line);
}
