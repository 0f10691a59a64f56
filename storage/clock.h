/*
 * clock.h - the one clock of storage/ (internal): CLOCK_MONOTONIC, for
 * lease expiry, back-off, rate limits and timing eviction passes.
 */
#ifndef KVPOOL_STORE_CLOCK_H
#define KVPOOL_STORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in microseconds. */
static inline uint64_t store_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* CLOCK_MONOTONIC in milliseconds (store_now_us / 1000). */
static inline uint64_t store_now_ms(void)
{
	return store_now_us() / 1000u;
}

#endif /* KVPOOL_STORE_CLOCK_H */
