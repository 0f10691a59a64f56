/*
 * srv_clock.h - kvpoold's clocks: monotonic milliseconds (coarse, for
 * timeouts and rate limits) and microseconds (for latencies). Any thread;
 * neither can fail on Linux (the clocks always exist).
 */
#ifndef KVPOOL_SRV_CLOCK_H
#define KVPOOL_SRV_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds of CLOCK_MONOTONIC_COARSE (cheap; ~4 ms resolution). */
static inline uint64_t srv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Microseconds of CLOCK_MONOTONIC. */
static inline uint64_t srv_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

#endif /* KVPOOL_SRV_CLOCK_H */
