/*
 * tier_impl.h - the NVMe tier's structures and its files' functions
 * (internal to storage/nvme/; the DRAM core uses nvme/tier.h only).
 * Lock rules as in core.h: *_locked functions expect s->lock held.
 */
#ifndef KVPOOL_STORE_TIER_IMPL_H
#define KVPOOL_STORE_TIER_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "nvme/nvme_index.h"
#include "nvme/tier.h"

struct store_nvme_io;
struct store_nvme_index;

enum store_seg_state {
	STORE_SEG_FREE = 0,  /* no record points into it; may be reused */
	STORE_SEG_ACTIVE,    /* demotions append to it */
	STORE_SEG_SEALED,    /* full or left; holds blocks until reclaimed */
	STORE_SEG_FREEING,   /* reclaimed; FREE once readers and pending deletes are 0 */
};

/* One segment file: its fill pointer and the blocks it holds. */
struct store_seg {
	uint8_t state;            /* enum store_seg_state */
	uint64_t fill_bytes;      /* bytes handed out to writes since it was freed */
	uint64_t live_bytes;      /* extent bytes of blocks whose NVMe copy is here */
	uint64_t seq;             /* age: higher = activated later */
	uint32_t readers;         /* reads in flight (promotions, reclaim) */
	uint32_t pending_dels;    /* queued record deletes of ranges here */
	uint32_t blocks;          /* ring of the blocks here (struct store_block.seg_link) */
	uint8_t punch;            /* FREEING, settled: its hole punch is due before FREE */
};

/* A RocksDB record to delete: the block left NVMe (or never should have
 * reached it). Until the delete is written, its segment is not reused. */
struct store_del {
	uint32_t disk_id;
	uint8_t key[STORE_KEY_BYTES];
	uint32_t seg;             /* segment whose range it protects */
};

/* One caller waiting for a promotion. */
struct store_waiter {
	struct store_waiter *next;
	store_get_done_fn done;
	void *arg;
	struct store_ref *out;
	uint32_t ns_id;
};

/* A promotion: NVMe -> DRAM for one block, shared by its waiters. */
struct store_promo {
	struct store_block *block;   /* holds a ref on it */
	struct store_promo *hnext;   /* chain in tier->promo_by_block */
	struct store_list link;      /* tier->promo_queue, then tier->promo_running */
	struct store_waiter *waiters;
	uint32_t first_page;         /* arena extent being filled (when has_pages) */
	bool has_pages;
};

/* Buckets of the promotions-in-flight table (struct store_tier). */
#define STORE_PROMO_BUCKETS 256u

struct store_tier {
	struct store_nvme_io *io;
	struct store_nvme_index *ix;
	uint64_t segment_bytes;
	uint32_t nseg;
	struct store_seg *segs;
	uint32_t active;             /* segment demotions append to, or STORE_SEG_NONE */
	uint32_t nfree;
	uint64_t next_seq;
	uint32_t next_disk_id;
	uint64_t low_pages;          /* demote while free + clean pages are below this */
	uint64_t batch_bytes;        /* one demotion write at most */
	uint64_t backoff_ms;         /* after a failed write */

	pthread_t *threads;
	uint32_t nthreads;
	pthread_cond_t wake;         /* workers sleep on it */
	pthread_cond_t idle;         /* drain and test hooks wait on it */
	bool stop, draining, demoter_busy, want_demote, stalled;
	/* The last reclaim found its segment full of blocks that must stay
	 * and could evict no cold subtree: nothing will change by waiting, so
	 * a put that finds no leaf gets FULL, not BUSY. */
	bool reclaim_stuck;
	bool healthy;
	/* the index's log write failed: no index write until a restart
	 * (store_nvme_index_failed), so no demotion either */
	bool index_failed;
	uint64_t retry_at_ms;        /* no demotion before this (back-off) */
	uint64_t demote_all;         /* test hook: demote every dirty block */
	/* store_keep_dram: the dirty blocks, hottest first; the demoter
	 * takes them in this order (ancestors first) instead of LRU order,
	 * and admission does not apply */
	struct store_block **hot;
	size_t nhot, hot_next;
	uint32_t fail_writes;        /* test hook: fail this many writes */
	bool hold, held;             /* test hook: park the demoter before its write */

	/* promotions in flight by block (few: a table in the tier rather
	 * than a pointer in every block header) */
	struct store_promo *promo_by_block[STORE_PROMO_BUCKETS];
	struct store_list promo_queue;   /* promotions not started */
	struct store_list promo_running; /* promotions holding arena pages */
	uint64_t promos;                 /* queued + running */
	uint64_t promo_bytes;            /* arena bytes held by running promotions */

	struct store_del *dels;      /* record deletes not written yet */
	size_t ndels, dels_cap;
	uint32_t npunch;             /* segments waiting for their hole punch */
	uint32_t *drops;             /* namespace drops whose index write failed */
	size_t ndrops, drops_cap;
	/* blocks (slab ids) whose record must be rewritten with a new
	 * retention deadline (store_tier_retain_changed_locked); each has
	 * retain_dirty set while it waits here */
	uint32_t *rupd;
	size_t nrupd, rupd_cap;

	struct store_ratelimit rl_write, rl_read, rl_corrupt;

	/* counters (store_stats) */
	uint64_t nvme_blocks, nvme_payload_bytes;
	uint64_t demotions, demoted_bytes, promotions, promoted_bytes;
	uint64_t bytes_written, bytes_read, rewritten_bytes, segments_reclaimed;
	uint64_t admission_rejections, evictions, corrupt_blocks, read_errors, write_errors;
	/* blocks removed with an NVMe copy or a demotion in flight: a DELETE
	 * that moves it must make its removal durable before it answers */
	uint64_t disk_removals;
	uint64_t rebuild_ms, rebuild_blocks, orphans_dropped;
	uint64_t rebuild_truncated;   /* records the open dropped: their segment file was
				       * missing or cut short */
	uint64_t index_records_lost;  /* write-ahead log records the open's replay lost */
	uint64_t index_quarantined;   /* damaged indexes moved aside at this open */
};

#define STORE_SEG_NONE UINT32_MAX

/* Filesystem space a segment write must leave free: room for RocksDB's
 * log and flushes, which must never meet a full disk (nvme_io.h): two
 * preallocated write-ahead log files (a new one is created before the
 * old one goes, 1.1 x the write buffer each), two memtable flushes into
 * table files and a compaction's output of the same order, with margin. */
#define STORE_TIER_WAL_PREALLOC_BYTES (STORE_NVME_INDEX_WRITE_BUFFER_BYTES / 10 * 11)
#define STORE_TIER_FS_RESERVE_BYTES (64ull << 20)
_Static_assert(STORE_TIER_FS_RESERVE_BYTES >= 2 * STORE_TIER_WAL_PREALLOC_BYTES +
		       4ull * STORE_NVME_INDEX_WRITE_BUFFER_BYTES,
	       "the reserve must hold the index's log preallocation and flushes");

/* tier.c: may `bytes` more be written to the segment files and still leave
 * STORE_TIER_FS_RESERVE_BYTES free? 0, -ENOSPC, or -EIO (statvfs failed).
 * Without the lock. */
int store_tier_room_for(struct store *s, uint64_t bytes);

/* ---- tier.c: workers, demotion commits, record deletes ---- */
/* Sleep on cv for at most ms milliseconds (CLOCK_MONOTONIC), the lock
 * held (dropped while asleep). */
void store_tier_wait_ms_locked(struct store *s, pthread_cond_t *cv, uint64_t ms);
/* Are queued record deletes due (none written by a demoter now, not
 * backing off)? */
bool store_tier_dels_due_locked(const struct store *s);
/* Attach b's NVMe copy at (seg, off) (commit of a demotion or rewrite). */
void store_tier_attach_locked(struct store *s, struct store_block *b, uint32_t seg, uint64_t off);
/* Queue the delete of record (disk_id, key) that protects segment seg. */
void store_tier_queue_del_locked(struct store *s, uint32_t disk_id, const uint8_t *key,
				 uint32_t seg);
/* Segment seg lost a reader or a pending delete: free it if it can be. */
void store_tier_seg_settle_locked(struct store *s, uint32_t seg);
/* Take every queued delete (*dels is the caller's to free). */
void store_tier_take_dels_locked(struct store *s, struct store_del **dels, size_t *n);
/* The deletes are written: their segments may become free. */
void store_tier_dels_done_locked(struct store *s, const struct store_del *dels, size_t n);
/* The deletes were not written: queue them again. */
void store_tier_dels_requeue_locked(struct store *s, const struct store_del *dels, size_t n);
/* A write to the tier failed: unhealthy, counted, back off. */
void store_tier_write_failed_locked(struct store *s);
/* A namespace drop (disk id) could not be written: keep it, to retry with
 * the record deletes. Without memory it is lost (logged). */
void store_tier_queue_drop_locked(struct store *s, uint32_t disk_id);
/* Give the space of every segment whose punch is due back to the
 * filesystem (store_nvme_io_discard, without the lock), then make it
 * FREE. In the demoter role (nothing writes segments meanwhile). */
void store_tier_punch_locked(struct store *s);
/* The record of visible block b at (seg, off) under namespace disk id
 * disk_id: key, parent, length, checksum, use stamp, retention deadline. */
void store_tier_rec_fill_locked(const struct store *s, const struct store_block *b,
				uint32_t disk_id, uint32_t seg, uint64_t off,
				struct store_nvme_rec *r);
/* Rewrite the records of the blocks whose retention deadline changed
 * (demoter role). Drops and retakes the lock. */
void store_tier_flush_retains_locked(struct store *s);
/* Write records recs[0..n) and deletes dels[0..ndels) in one RocksDB
 * batch (deletes one by one when n == 0). Without the lock.
 * Errors: -EIO, -ENOMEM. */
struct store_nvme_rec;
int store_tier_index_commit(struct store *s, const struct store_nvme_rec *recs, size_t n,
			    const struct store_del *dels, size_t ndels);

/* ---- demote.c: the demoter (one worker at a time) ---- */
/* Is a demotion round wanted now? */
bool store_demote_wanted_locked(struct store *s);
/* One round: reclaim a segment or write one batch of dirty blocks.
 * Drops and retakes the lock. */
void store_demote_round_locked(struct store *s);
/* Write the queued record deletes (demoter role). Drops and retakes the lock. */
void store_tier_flush_dels_locked(struct store *s);

/* ---- reclaim.c ---- */
/* The sealed segment activated longest ago, or STORE_SEG_NONE. */
uint32_t store_tier_oldest_sealed(const struct store_tier *t);
/* Free the oldest sealed segment, rewriting the blocks that must stay
 * into the active one. Returns 0, or -EAGAIN when nothing could be freed.
 * Drops and retakes the lock. */
int store_reclaim_locked(struct store *s);

/* ---- promote.c ---- */
/* The promotion in flight for b, or NULL (look only when b->promoting). */
struct store_promo *store_promo_find_locked(const struct store_tier *t,
					    const struct store_block *b);
/* Start promotion p of p->block: in the table, the block marked. */
void store_promo_add_locked(struct store_tier *t, struct store_promo *p);
/* Run one queued promotion (I/O thread). Drops and retakes the lock. */
void store_promo_run_locked(struct store *s, struct store_promo *p);

/* ---- rebuild.c ---- */
/* Rebuild the index from the NVMe records (store_open, no threads yet). */
int store_rebuild(struct store *s, char *why, size_t why_len);

#endif /* KVPOOL_STORE_TIER_IMPL_H */
