/*
 * nvme_hooks.c - the NVMe tier's test hooks (store_debug.h): demote
 * everything, wait for idle workers, fail or park writes, where a block
 * lies on disk. Built into the test library only.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "debug/store_debug.h"
#include "nvme/tier_impl.h"

#define DEBUG_WAIT_MAX_MS 10000u

int store_debug_nvme_demote_all(struct store *s)
{
	uint64_t deadline = store_now_ms() + DEBUG_WAIT_MAX_MS;
	struct store_tier *t = s->tier;
	int rc = 0;

	if (!t)
		return -ENODEV;
	store_lock(s);
	t->demote_all++;
	store_tier_kick_locked(s);
	for (;;) {
		uint64_t now = store_now_ms();

		if (!t->demoter_busy && s->lru[STORE_LRU_DIRTY].len == 0)
			break;
		/* a failed write backs off: report it rather than wait */
		if ((!t->demoter_busy && !t->healthy && now < t->retry_at_ms) || now > deadline) {
			rc = -EIO;
			break;
		}
		store_tier_wait_ms_locked(s, &t->idle, 20);
	}
	t->demote_all--;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int store_debug_nvme_hold(struct store *s, int hold)
{
	uint64_t deadline = store_now_ms() + DEBUG_WAIT_MAX_MS;
	struct store_tier *t = s->tier;
	int rc = 0;

	if (!t)
		return -ENODEV;
	store_lock(s);
	if (hold) {
		t->hold = true;
		t->demote_all++;
		store_tier_kick_locked(s);
		while (!t->held && !rc) {
			store_tier_wait_ms_locked(s, &t->idle, 20);
			if (store_now_ms() > deadline)
				rc = -ETIMEDOUT;
		}
	} else {
		t->hold = false;
		t->demote_all--;
		store_tier_kick_locked(s);
		while ((t->held || t->demoter_busy) && store_now_ms() < deadline)
			store_tier_wait_ms_locked(s, &t->idle, 20);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Is there anything for the workers to do (or being done)? */
static bool busy_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	return t->promos || t->demoter_busy || store_demote_wanted_locked(s) ||
	       store_tier_dels_due_locked(s) || t->npunch;
}

void store_debug_nvme_wait_idle(struct store *s)
{
	uint64_t deadline = store_now_ms() + DEBUG_WAIT_MAX_MS;

	if (!s->tier)
		return;
	store_lock(s);
	while (busy_locked(s) && store_now_ms() < deadline) {
		store_tier_kick_locked(s);
		store_tier_wait_ms_locked(s, &s->tier->idle, 20);
	}
	pthread_mutex_unlock(&s->lock);
}

void store_debug_nvme_fail_writes(struct store *s, uint32_t count)
{
	if (!s->tier)
		return;
	store_lock(s);
	s->tier->fail_writes = count;
	pthread_mutex_unlock(&s->lock);
}

void store_debug_nvme_backoff(struct store *s, uint64_t ms)
{
	if (!s->tier)
		return;
	store_lock(s);
	s->tier->backoff_ms = ms;
	pthread_mutex_unlock(&s->lock);
}

int store_debug_nvme_where(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			   uint32_t *segment, uint64_t *offset, int *in_dram)
{
	struct store_block *b;
	int rc = -ENOENT;

	store_lock(s);
	b = store_find_locked(s, ns_id, key);
	if (b && b->on_nvme) {
		*segment = b->seg;
		*offset = store_seg_off(b);
		if (in_dram)
			*in_dram = b->in_dram;
		rc = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int store_debug_drop_dram(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES])
{
	struct store_block *b;
	int rc = 0;

	store_lock(s);
	b = store_find_locked(s, ns_id, key);
	if (!b)
		rc = -ENOENT;
	else if (store_lru_slot(b, STORE_LRU_CLEAN) == STORE_HEAP_NONE || !s->tier)
		rc = -EBUSY;
	else
		store_block_drop_dram_locked(s, b);
	pthread_mutex_unlock(&s->lock);
	return rc;
}
