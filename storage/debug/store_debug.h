/*
 * store_debug.h - the invariant checker and the test hooks of storage/
 * (storage/debug/: built into $(BUILD)/libstoretest.a, which only tests
 * and benchmarks link; kvpoold has none of it).
 */
#ifndef KVPOOL_STORE_DEBUG_H
#define KVPOOL_STORE_DEBUG_H

#include <stdint.h>

#include "store.h"

/* Verify every invariant: no holes, child counts, LRU membership, arena
 * and byte accounting, used + inflight + free = capacity, the namespace
 * name table. Returns 0, or -EFAULT with a reason in
 * why[0..why_len) (may be NULL). For tests; takes the lock; O(blocks). */
int store_check(struct store *s, char *why, size_t why_len);

/* Remove the visible block (ns_id, key) WITHOUT its descendants, leaving
 * them in the pool with a missing parent: a deliberate hole, so a test can
 * show that store_check reports it. The pool stays memory-safe (it can be
 * used and closed) but its invariants are broken from then on.
 * Errors: -ENOENT (no such visible block). */
int store_debug_remove_one(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES]);

/* Call fn(arg) from every eviction pass, with the store lock held, just
 * before the pass looks at what MATCHes logged (NULL: no hook). A test
 * runs a lock-free MATCH from another thread there, in the window where
 * its lease must still be seen. */
void store_debug_evict_hook(struct store *s, void (*fn)(void *arg), void *arg);

/* ---- the use clock (block.h: 32 bits, aged near UINT32_MAX) ---- */

/* Move the pool's use clock forward to `clock`, so that the use after
 * clock == UINT32_MAX runs the aging pass first. Blocks keep their
 * last_use. Errors: -EINVAL (clock is behind the current one: later uses
 * would look older than earlier ones). */
int store_debug_clock_set(struct store *s, uint32_t clock);

/* The use clock now, and how many aging passes it has had (restored from
 * the NVMe records at a restart). */
void store_debug_clock(struct store *s, uint32_t *clock, uint32_t *epoch);

/* The last_use of visible block (ns_id, key): the clock at its last put,
 * GET or MATCH, halved by each aging pass since. Errors: -ENOENT. */
int store_debug_last_use(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			 uint32_t *last_use);

/* How long visible block (ns_id, key) stays retained, in ms from now
 * (0: not retained, or its deadline passed and the next tick ends it).
 * Errors: -ENOENT. */
int store_debug_retained_ms(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			    uint64_t *left_ms);

/* ---- NVMe tier ---- */

/* Demote every dirty DRAM block now, whatever the watermark, and wait
 * until none is left. Errors: -ENODEV (no NVMe tier), -EIO (writes fail
 * or the tier is stalled: blocks stay dirty). */
int store_debug_nvme_demote_all(struct store *s);

/* Wait (up to 10 s) until the tier's threads have nothing to do: no
 * promotion queued or running, no demotion round wanted or running, no
 * record delete queued. No-op without a tier. */
void store_debug_nvme_wait_idle(struct store *s);

/* Make the next `count` demotion batches fail as a full disk would
 * (-ENOSPC), before anything is written. */
void store_debug_nvme_fail_writes(struct store *s, uint32_t count);

/* hold 1: demote every dirty block but park the demoter after it picked
 * its batch, before it writes, and return once it is parked; hold 0: let
 * it go on and wait until it is idle. Errors: -ENODEV (no tier),
 * -ETIMEDOUT (no batch within 10 s). */
int store_debug_nvme_hold(struct store *s, int hold);

/* Back-off after a failed write, in ms (default 1000). */
void store_debug_nvme_backoff(struct store *s, uint64_t ms);

/* Where the NVMe copy of visible block (ns_id, key) lies; *in_dram (may
 * be NULL) says whether it also has a DRAM copy.
 * Errors: -ENOENT (no such visible block, or not on NVMe). */
int store_debug_nvme_where(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			   uint32_t *segment, uint64_t *offset, int *in_dram);

/* Drop the clean DRAM copy of visible block (ns_id, key), so that the
 * next GET reads it from NVMe. Errors: -ENOENT (no such block),
 * -EBUSY (no clean, unpinned, unleased DRAM copy). */
int store_debug_drop_dram(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES]);

#endif /* KVPOOL_STORE_DEBUG_H */
