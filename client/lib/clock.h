/*
 * clock.h - libkvpool's one clock: CLOCK_MONOTONIC in milliseconds and
 * microseconds, and absolute deadlines on it (internal).
 *
 * Threads: any. Cannot fail.
 */
#ifndef KVC_CLOCK_H
#define KVC_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Current CLOCK_MONOTONIC time in microseconds. */
static inline uint64_t kvc_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Current CLOCK_MONOTONIC time in milliseconds. */
static inline uint64_t kvc_now_ms(void)
{
	return kvc_now_us() / 1000u;
}

/* Absolute deadline `timeout_ms` from now. */
static inline uint64_t kvc_deadline_ms(uint32_t timeout_ms)
{
	return kvc_now_ms() + timeout_ms;
}

/* Milliseconds from now until deadline_ms, for poll(2): 0 when it has
 * passed, INT32_MAX at most; UINT64_MAX (no deadline) gives -1. */
static inline int kvc_ms_until(uint64_t deadline_ms)
{
	uint64_t now;

	if (deadline_ms == UINT64_MAX)
		return -1;
	now = kvc_now_ms();
	if (deadline_ms <= now)
		return 0;
	return deadline_ms - now > INT32_MAX ? INT32_MAX : (int)(deadline_ms - now);
}

#endif /* KVC_CLOCK_H */
