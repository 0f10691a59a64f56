/*
 * backoff.c - bounded exponential backoff with jitter for BUSY replies.
 */
#include "backoff.h"

#include "clock.h"
#include "kvpool.h"

/* splitmix64: cheap, well mixed, enough for jitter. */
static uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void kvc_backoff_start(struct kvc_backoff *b, uint32_t max_tries, uint64_t seed)
{
	b->tries = 1;
	b->max_tries = max_tries ? max_tries : KVPOOL_BUSY_TRIES;
	b->wait_ms = KVPOOL_BUSY_FIRST_WAIT_MS;
	/* Clients refused together should not come back together: seed from
	 * the clock and the caller's seed. */
	b->rng = kvc_now_us() ^ seed;
}

int kvc_backoff_next(struct kvc_backoff *b, uint64_t deadline_ms, uint32_t *wait_ms)
{
	uint32_t half = b->wait_ms / 2, wait;

	if (b->tries >= b->max_tries)
		return 0;
	/* Uniform in [wait/2, wait]: spread out, yet never much shorter. */
	wait = half + (uint32_t)(next_random(&b->rng) % (b->wait_ms - half + 1));
	if (kvc_now_ms() + wait >= deadline_ms)
		return 0;
	b->tries++;
	b->wait_ms = b->wait_ms >= KVPOOL_BUSY_MAX_WAIT_MS / 2 ? KVPOOL_BUSY_MAX_WAIT_MS
							       : b->wait_ms * 2;
	*wait_ms = wait;
	return 1;
}
