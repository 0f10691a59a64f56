/*
 * backoff.h - bounded exponential backoff with jitter, for requests the
 * server answers BUSY (internal to libkvpool; the policy is the one
 * kvpool.h documents under "Backpressure").
 *
 * One kvc_backoff serves one call: the first try is made at once; after
 * each BUSY answer kvc_backoff_again sleeps the next wait (the first is
 * KVPOOL_BUSY_FIRST_WAIT_MS, each next one twice as long up to
 * KVPOOL_BUSY_MAX_WAIT_MS, each drawn uniformly from its upper half) and
 * allows another try, until the handle's try limit is reached or the
 * wait would end past the call's deadline.
 *
 * Threads: a kvc_backoff belongs to the call (and thread) that made it.
 */
#ifndef KVC_BACKOFF_H
#define KVC_BACKOFF_H

#include <stdint.h>

#include "client.h"

struct kvc_backoff {
	uint32_t tries;     /* tries made so far (the first included) */
	uint32_t max_tries; /* the handle's limit, >= 1 */
	uint32_t wait_ms;   /* the next wait, before jitter */
	uint64_t rng;       /* jitter state */
};

/* Start the backoff of one call on handle c (its first try counts as
 * made). Cannot fail. */
void kvc_backoff_start(struct kvc_backoff *b, const struct kvpool_client *c);

/* After a try answered BUSY: sleep the next wait and return 1 (try
 * again), or return 0 at once when the tries are used up or the wait
 * would end past deadline_ms (CLOCK_MONOTONIC ms). Counts the retry in
 * the handle's busy_retries. */
int kvc_backoff_again(struct kvc_backoff *b, struct kvpool_client *c, uint64_t deadline_ms);

/* The same decision without sleeping (the asynchronous core, which waits
 * in kvpool_poll instead): 1 and *wait_ms, the wait before the next try,
 * counted as made; or 0 when no try is left. */
int kvc_backoff_next(struct kvc_backoff *b, struct kvpool_client *c, uint64_t deadline_ms,
		     uint32_t *wait_ms);

#endif /* KVC_BACKOFF_H */
