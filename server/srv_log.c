/*
 * srv_log.c - timestamped log lines on stderr and the wire-bytes sanitizer.
 */
#include "srv_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int srv_log_level = SRV_LOG_INFO;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

#define LINE_MAX_BYTES 2048

void srv_log_set_level(int level)
{
	if (level < SRV_LOG_ERROR)
		level = SRV_LOG_ERROR;
	if (level > SRV_LOG_DEBUG)
		level = SRV_LOG_DEBUG;
	__atomic_store_n(&srv_log_level, level, __ATOMIC_RELAXED);
}

/* Write the UTC wall-clock time with milliseconds into buf. */
static size_t format_time(char *buf, size_t cap)
{
	struct timespec ts;
	struct tm tm;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
	return n < cap ? n : cap - 1;
}

void srv_log_write(int level, const char *fmt, ...)
{
	char line[LINE_MAX_BYTES];
	size_t n;
	int m;
	va_list ap;

	if (level < SRV_LOG_ERROR || level > SRV_LOG_DEBUG)
		level = SRV_LOG_ERROR;
	n = format_time(line, sizeof(line));
	m = snprintf(line + n, sizeof(line) - n, " %s ", level_names[level]);
	if (m > 0)
		n += (size_t)m;
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	if (m > 0)
		n += (size_t)m;
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2; /* truncated: keep room for the newline */
	line[n++] = '\n';
	/* One write per line; a short write to stderr is not worth retrying. */
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}

/* Escape one byte into esc[0..3]; returns its length. */
static size_t escape_byte(unsigned char ch, char esc[4])
{
	static const char hex[] = "0123456789abcdef";

	if (ch == '\\') {
		esc[0] = '\\', esc[1] = '\\';
		return 2;
	}
	if (ch >= 0x20 && ch <= 0x7e) {
		esc[0] = (char)ch;
		return 1;
	}
	esc[0] = '\\', esc[1] = 'x', esc[2] = hex[ch >> 4], esc[3] = hex[ch & 15];
	return 4;
}

size_t srv_log_sanitize(const void *in, size_t in_bytes, char *out, size_t out_cap)
{
	const unsigned char *p = in;
	size_t total = 0, limit, n = 0, i, k;
	char esc[4];

	if (out_cap == 0)
		return 0;
	for (i = 0; i < in_bytes; i++)
		total += escape_byte(p[i], esc);
	/* Everything fits: no ellipsis needed. Else keep room for "...". */
	limit = total + 1 <= out_cap ? out_cap - 1 : (out_cap > 4 ? out_cap - 4 : 0);
	for (i = 0; i < in_bytes; i++) {
		k = escape_byte(p[i], esc);
		if (n + k > limit)
			break;
		memcpy(out + n, esc, k);
		n += k;
	}
	if (i < in_bytes && n + 3 < out_cap) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
	return n;
}

/* ---- rate limit ---------------------------------------------------------- */

#define RATELIMIT_WINDOW_MS 1000

/* Start a new window at now_ms if the current one is over (or the clock
 * went backwards); returns what the old window suppressed. */
static uint64_t ratelimit_roll(struct srv_ratelimit *rl, uint64_t now_ms)
{
	uint64_t n;

	if (now_ms >= rl->window_ms && now_ms - rl->window_ms < RATELIMIT_WINDOW_MS)
		return 0;
	n = rl->suppressed;
	rl->window_ms = now_ms;
	rl->used = 0;
	rl->suppressed = 0;
	return n;
}

bool srv_ratelimit_allow(struct srv_ratelimit *rl, uint64_t now_ms, uint64_t *suppressed)
{
	*suppressed = ratelimit_roll(rl, now_ms);
	if (rl->used < rl->per_sec) {
		rl->used++;
		return true;
	}
	rl->suppressed++;
	return false;
}

uint64_t srv_ratelimit_flush(struct srv_ratelimit *rl, uint64_t now_ms)
{
	/* An idle limiter has nothing to report: leave its window alone. */
	if (!rl->suppressed)
		return 0;
	return ratelimit_roll(rl, now_ms);
}
