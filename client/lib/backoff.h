/*
 * backoff.h - bounded exponential backoff with jitter, for requests the
 * server answers BUSY (internal to libkvpool; the policy is the one
 * kvpool.h documents under "Backpressure").
 *
 * One kvc_backoff serves one request: the first try is made at once;
 * after each BUSY answer kvc_backoff_next gives the wait before the next
 * try (the first is KVPOOL_BUSY_FIRST_WAIT_MS, each next one twice as
 * long up to KVPOOL_BUSY_MAX_WAIT_MS, each drawn uniformly from its upper
 * half), until the try limit is reached or the wait would end past the
 * request's deadline. The caller waits (an engine timer, or a sleep while
 * connecting) and counts the retry.
 *
 * Threads: a kvc_backoff belongs to the request that made it.
 */
#ifndef KVC_BACKOFF_H
#define KVC_BACKOFF_H

#include <stdint.h>

struct kvc_backoff {
	uint32_t tries;     /* tries made so far (the first included) */
	uint32_t max_tries; /* the limit, >= 1 */
	uint32_t wait_ms;   /* the next wait, before jitter */
	uint64_t rng;       /* jitter state */
};

/* Start the backoff of one request (its first try counts as made).
 * max_tries: 0 = KVPOOL_BUSY_TRIES. seed: anything that differs between
 * requests refused together (an address). Cannot fail. */
void kvc_backoff_start(struct kvc_backoff *b, uint32_t max_tries, uint64_t seed);

/* After a try answered BUSY: 1 and *wait_ms, the wait before the next
 * try (counted as made); or 0 when no try is left or the wait would end
 * past deadline_ms (CLOCK_MONOTONIC ms). */
int kvc_backoff_next(struct kvc_backoff *b, uint64_t deadline_ms, uint32_t *wait_ms);

#endif /* KVC_BACKOFF_H */
