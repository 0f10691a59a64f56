/*
 * tier.h - what the DRAM core of storage/ calls of the NVMe tier (the
 * only header of storage/nvme/ that files outside it include). s->tier
 * is NULL without a tier; every function here but store_tier_open wants
 * one unless it says otherwise. *_locked: s->lock held.
 */
#ifndef KVPOOL_STORE_TIER_H
#define KVPOOL_STORE_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

struct store;
struct store_block;
struct store_lessee;

/* Open the NVMe tier of s (cfg.nvme_dir set): files, index, rebuild,
 * threads. Errors: as store_open. */
int store_tier_open(struct store *s, char *why, size_t why_len);
/* Stop promotions and demotions (store_drain). */
void store_tier_drain(struct store *s);
/* Drain, join the threads, write pending deletes, close files. */
void store_tier_close(struct store *s);
/* Is the tier unable to take demotions now (absent, unhealthy, drained,
 * stalled)? Then DRAM makes room by evicting. */
bool store_tier_fallback_locked(const struct store *s);
/* Wake the workers (demotion wanted, promotion queued). */
void store_tier_kick_locked(struct store *s);
/* Detach b's NVMe copy and queue its record's delete. */
void store_tier_detach_locked(struct store *s, struct store_block *b);
/* Falling back now (store_tier_fallback_locked), may the tier take
 * demotions again soon: healthy, not drained, and its last reclaim was
 * not stuck on blocks that must all stay? Then a put that finds no leaf
 * to evict waits (BUSY) rather than failing (FULL). */
bool store_tier_may_recover_locked(const struct store *s);
/* DRAM wants room: ask the demoter for a round if one can give it (dirty
 * blocks wait, or a round is running), and wake it. Returns whether a
 * round was asked for (false: demotion cannot help). */
bool store_tier_request_demote_locked(struct store *s);

/* b's retention deadline changed while it has an NVMe record (or a
 * demotion is writing one): queue a rewrite of its record with the new
 * deadline, written by the tier's thread soon after (and at close). */
void store_tier_retain_changed_locked(struct store *s, struct store_block *b);

/* ---- GET of a block whose only copy is on NVMe (promote.c) ---- */
/* Can an NVMe-only block be promoted now? False without a tier and after
 * store_drain. */
bool store_tier_can_promote_locked(const struct store *s);
/* Start a promotion of NVMe-only block b, or join the one running, for
 * this waiter: done(arg, status) is called from an I/O thread with *out
 * filled when it ends. Errors: -ENOMEM (nothing started or joined). */
int store_promo_join_locked(struct store *s, struct store_block *b, uint32_t ns_id,
			    struct store_ref *out, store_get_done_fn done, void *arg);

/* ---- statistics and namespaces ---- */
/* Fill the NVMe fields of *st (store_stats) and add the arena bytes that
 * running promotions hold to st->used_bytes. */
void store_tier_stats_locked(const struct store *s, struct store_stats *st);
/* Delete the index records of namespace disk id disk_id and tombstone the
 * id, synced (DROP_NAMESPACE; the lock not held). Errors: -EIO (logged;
 * the tier is marked unhealthy and retries the drop in the background and
 * at close). */
int store_tier_ns_drop(struct store *s, uint32_t disk_id);

/* ---- durable removals (DELETE) ---- */
/* b is leaving the pool (store_block_remove_locked, before its NVMe copy
 * is detached): count it when it has an NVMe copy or a demotion in flight. */
void store_tier_removed_locked(struct store *s, const struct store_block *b);
/* How many such removals so far (0 without a tier): a DELETE that moved
 * it must call store_tier_persist_removals_locked before it answers. */
uint64_t store_tier_disk_removals_locked(const struct store *s);
/* Make the removals so far durable: wait for the demoter's batch or
 * reclaim in flight (it queues the delete of any record it wrote for a
 * block removed meanwhile), then write every queued record delete in one
 * batch and sync the index log, in the demoter role, on the caller's
 * thread; the lock is released meanwhile. 0, or -EIO (the deletes stay
 * queued and the tier is marked unhealthy). */
int store_tier_persist_removals_locked(struct store *s);

#endif /* KVPOOL_STORE_TIER_H */
