/*
 * backoff.c - bounded exponential backoff with jitter for BUSY replies.
 */
#include "backoff.h"

#include <errno.h>
#include <time.h>

#include "conn.h"

/* splitmix64: cheap, well mixed, enough for jitter. */
static uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

void kvc_backoff_start(struct kvc_backoff *b, const struct kvpool_client *c)
{
	b->tries = 1;
	b->max_tries = c->busy_tries ? c->busy_tries : KVPOOL_BUSY_TRIES;
	b->wait_ms = KVPOOL_BUSY_FIRST_WAIT_MS;
	/* Clients that were refused together should not come back together:
	 * seed from the clock and the handle. */
	b->rng = kvc_now_us() ^ (uint64_t)(uintptr_t)c;
}

int kvc_backoff_next(struct kvc_backoff *b, struct kvpool_client *c, uint64_t deadline_ms,
		     uint32_t *wait_ms)
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
	c->busy_retries++;
	*wait_ms = wait;
	return 1;
}

int kvc_backoff_again(struct kvc_backoff *b, struct kvpool_client *c, uint64_t deadline_ms)
{
	uint32_t wait;

	if (!kvc_backoff_next(b, c, deadline_ms, &wait))
		return 0;
	sleep_ms(wait);
	return 1;
}
