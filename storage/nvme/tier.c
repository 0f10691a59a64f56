/*
 * tier.c - the NVMe tier's life: geometry, opening (files, index, rebuild),
 * the I/O worker threads, drain and close, attaching and detaching a
 * block's NVMe copy, the queue of RocksDB record deletes, and what the
 * DRAM core asks of the tier (nvme/tier.h: room, statistics, dropping a
 * namespace's records).
 *
 * Workers: nvme_io_threads threads share one loop. Each turn takes, in
 * order: a queued promotion (promote.c); a demotion round if one is
 * wanted and no other worker is the demoter (demote.c; only the demoter
 * writes segments and records, so records are written in one order);
 * queued record deletes. They sleep on tier->wake otherwise.
 */
#include <sys/stat.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "index_recover.h"
#include "nvme_index.h"
#include "nvme_io.h"
#include "tier_impl.h"

#define DEFAULT_SEGMENT_BYTES (256ull << 20)
#define MAX_BATCH_BYTES (16ull << 20)
#define DEFAULT_IO_THREADS 2u
#define MAX_IO_THREADS 64u
#define BACKOFF_MS 1000u
#define IDLE_WAIT_MS 200u

/* ---- state shared with the put path ---- */

bool store_tier_fallback_locked(const struct store *s)
{
	const struct store_tier *t = s->tier;

	return !t || !t->healthy || t->draining || t->stop || t->stalled;
}

void store_tier_kick_locked(struct store *s)
{
	pthread_cond_broadcast(&s->tier->wake);
}

bool store_tier_may_recover_locked(const struct store *s)
{
	const struct store_tier *t = s->tier;

	return t->healthy && !t->draining && !t->stop && !t->reclaim_stuck;
}

bool store_tier_request_demote_locked(struct store *s)
{
	if (!s->lru[STORE_LRU_DIRTY].len && !s->tier->demoter_busy)
		return false;
	s->tier->want_demote = true;
	store_tier_kick_locked(s);
	return true;
}

void store_tier_attach_locked(struct store *s, struct store_block *b, uint32_t seg, uint64_t off)
{
	struct store_tier *t = s->tier;
	struct store_seg *sg = &t->segs[seg];

	b->on_nvme = 1;
	b->seg = seg;
	b->seg_page = (uint32_t)(off / STORE_PAGE_BYTES); /* 4 KiB aligned */
	store_ring_add_tail(s, &sg->blocks, b, STORE_RING_SEG);
	sg->live_bytes += store_extent_bytes(b);
	t->nvme_blocks++;
	t->nvme_payload_bytes += store_block_length(b);
	store_block_ns(s, b)->nvme_blocks++;
	store_lru_sync_locked(s, b);
}

void store_tier_queue_del_locked(struct store *s, uint32_t disk_id, const uint8_t *key,
				 uint32_t seg)
{
	struct store_tier *t = s->tier;
	struct store_del *d;

	if (t->ndels == t->dels_cap) {
		size_t cap = t->dels_cap ? t->dels_cap * 2 : 256;
		struct store_del *n = realloc(t->dels, cap * sizeof(*n));

		/* without memory the record stays: a later read of the
		 * reused range fails its checksum, never returns wrong bytes */
		if (!n)
			return;
		t->dels = n;
		t->dels_cap = cap;
	}
	d = &t->dels[t->ndels++];
	d->disk_id = disk_id;
	memcpy(d->key, key, STORE_KEY_BYTES);
	d->seg = seg;
	if (seg != STORE_SEG_NONE)
		t->segs[seg].pending_dels++;
}

void store_tier_rec_fill_locked(const struct store *s, const struct store_block *b,
				uint32_t disk_id, uint32_t seg, uint64_t off,
				struct store_nvme_rec *r)
{
	memset(r, 0, sizeof(*r));
	r->ns_disk_id = disk_id;
	memcpy(r->key, b->node.key, STORE_KEY_BYTES);
	if (b->parent_id) { /* a visible block's parent is its parent_id */
		r->has_parent = 1;
		memcpy(r->parent, store_parent(s, b)->node.key, STORE_KEY_BYTES);
	}
	r->segment = seg;
	r->offset = off;
	r->length = store_block_length(b);
	r->checksum = store_block_checksum(b);
	r->last_use = store_use_stamp(s, b);
	r->retain_until_ms = store_retain_wall_until_locked(s, b);
	if (b->tenant_id)
		r->tenant_key = store_block_tenant(s, b)->key;
}

void store_tier_retain_changed_locked(struct store *s, struct store_block *b)
{
	struct store_tier *t = s->tier;

	if (b->retain_dirty)
		return; /* queued already: the rewrite reads the deadline then */
	if (t->nrupd == t->rupd_cap) {
		size_t cap = t->rupd_cap ? t->rupd_cap * 2 : 256;
		uint32_t *n = realloc(t->rupd, cap * sizeof(*n));

		/* without memory the record keeps its older deadline: after a
		 * restart the block is retained less long, never wrongly */
		if (!n)
			return;
		t->rupd = n;
		t->rupd_cap = cap;
	}
	t->rupd[t->nrupd++] = store_slab_id(b);
	b->retain_dirty = 1;
	store_tier_kick_locked(s);
}

void store_tier_detach_locked(struct store *s, struct store_block *b)
{
	struct store_tier *t = s->tier;
	struct store_seg *sg = &t->segs[b->seg];
	struct store_ns *ns = store_block_ns(s, b);

	store_ring_del(s, &sg->blocks, b, STORE_RING_SEG);
	sg->live_bytes -= store_extent_bytes(b);
	t->nvme_blocks--;
	t->nvme_payload_bytes -= store_block_length(b);
	ns->nvme_blocks--;
	b->on_nvme = 0;
	store_tier_queue_del_locked(s, ns->disk_id, b->node.key, b->seg);
	/* a sealed segment left with no block frees (and punches) at once
	 * rather than waiting to be the oldest at a reclaim (one being
	 * reclaimed is FREEING already) */
	if (sg->state == STORE_SEG_SEALED && sg->live_bytes == 0)
		sg->state = STORE_SEG_FREEING;
	store_tier_seg_settle_locked(s, b->seg);
	store_lru_sync_locked(s, b);
}

void store_tier_seg_settle_locked(struct store *s, uint32_t seg)
{
	struct store_tier *t = s->tier;
	struct store_seg *sg = &t->segs[seg];

	if (sg->state != STORE_SEG_FREEING || sg->readers || sg->pending_dels || sg->live_bytes ||
	    sg->punch)
		return;
	/* FREE only once its bytes went back to the filesystem: a segment
	 * reused first would lose its new bytes to the punch */
	sg->punch = 1;
	t->npunch++;
	pthread_cond_broadcast(&t->wake);
}

void store_tier_punch_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	for (uint32_t i = 0; i < t->nseg && t->npunch; i++) {
		struct store_seg *sg = &t->segs[i];

		if (!sg->punch)
			continue;
		pthread_mutex_unlock(&s->lock);
		(void)store_nvme_io_discard(t->io, i); /* best effort */
		store_lock(s);
		sg->punch = 0;
		t->npunch--;
		if (sg->state != STORE_SEG_FREEING || sg->readers || sg->pending_dels ||
		    sg->live_bytes)
			continue; /* taken back meanwhile (an aborted reclaim) */
		sg->state = STORE_SEG_FREE;
		sg->fill_bytes = 0;
		t->nfree++;
		pthread_cond_broadcast(&t->idle);
	}
}

/* ---- record deletes and index commits ---- */

void store_tier_take_dels_locked(struct store *s, struct store_del **dels, size_t *n)
{
	struct store_tier *t = s->tier;

	*dels = t->dels;
	*n = t->ndels;
	t->dels = NULL;
	t->ndels = 0;
	t->dels_cap = 0;
}

void store_tier_dels_done_locked(struct store *s, const struct store_del *dels, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (dels[i].seg == STORE_SEG_NONE)
			continue;
		s->tier->segs[dels[i].seg].pending_dels--;
		store_tier_seg_settle_locked(s, dels[i].seg);
	}
}

void store_tier_dels_requeue_locked(struct store *s, const struct store_del *dels, size_t n)
{
	struct store_tier *t = s->tier;

	for (size_t i = 0; i < n; i++) {
		size_t before = t->ndels;

		/* the segment's pending count moves with the entry */
		store_tier_queue_del_locked(s, dels[i].disk_id, dels[i].key, STORE_SEG_NONE);
		if (t->ndels > before) {
			t->dels[before].seg = dels[i].seg;
		} else if (dels[i].seg != STORE_SEG_NONE) {
			t->segs[dels[i].seg].pending_dels--;
			store_tier_seg_settle_locked(s, dels[i].seg);
		}
	}
}

void store_tier_queue_drop_locked(struct store *s, uint32_t disk_id)
{
	struct store_tier *t = s->tier;

	if (t->ndrops == t->drops_cap) {
		size_t cap = t->drops_cap ? t->drops_cap * 2 : 16;
		uint32_t *n = realloc(t->drops, cap * sizeof(*n));

		if (!n) {
			store_log(s, STORE_LOG_ERR, "nvme: out of memory: the drop of namespace "
				  "disk id %u is not retried", disk_id);
			return;
		}
		t->drops = n;
		t->drops_cap = cap;
	}
	t->drops[t->ndrops++] = disk_id;
}

/* Retry the namespace drops that failed, oldest first, until one fails. */
static void retry_drops_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	while (t->ndrops) {
		uint32_t id = t->drops[0];
		int rc;

		pthread_mutex_unlock(&s->lock);
		rc = store_nvme_index_ns_drop(t->ix, id);
		store_lock(s);
		if (rc) {
			store_tier_write_failed_locked(s);
			return;
		}
		memmove(t->drops, t->drops + 1, (t->ndrops - 1) * sizeof(*t->drops));
		t->ndrops--;
	}
}

void store_tier_write_failed_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	t->healthy = false;
	if (!t->index_failed && store_nvme_index_failed(t->ix))
		t->index_failed = true;
	t->write_errors++;
	t->retry_at_ms = store_now_ms() + t->backoff_ms;
}

int store_tier_room_for(struct store *s, uint64_t bytes)
{
	uint64_t free_bytes;

	if (store_nvme_io_free_bytes(s->tier->io, &free_bytes))
		return -EIO;
	return free_bytes < bytes + STORE_TIER_FS_RESERVE_BYTES ? -ENOSPC : 0;
}

int store_tier_index_commit(struct store *s, const struct store_nvme_rec *recs, size_t n,
			    const struct store_del *dels, size_t ndels)
{
	struct store_tier *t = s->tier;
	uint32_t *ns_ids = NULL;
	uint8_t (*keys)[STORE_KEY_BYTES] = NULL;
	int rc = 0;

	if (ndels) {
		ns_ids = malloc(ndels * sizeof(*ns_ids));
		keys = malloc(ndels * sizeof(*keys));
		if (!ns_ids || !keys) {
			rc = -ENOMEM;
			goto out_free;
		}
		for (size_t i = 0; i < ndels; i++) {
			ns_ids[i] = dels[i].disk_id;
			memcpy(keys[i], dels[i].key, STORE_KEY_BYTES);
		}
	}
	if (n || ndels)
		rc = store_nvme_index_write(t->ix, recs, n, ns_ids,
					    (const uint8_t (*)[STORE_KEY_BYTES])keys, ndels);
out_free:
	free(ns_ids);
	free(keys);
	return rc;
}

/* ---- workers ---- */

/* Sleep on tier->wake for at most ms milliseconds (CLOCK_MONOTONIC). */
void store_tier_wait_ms_locked(struct store *s, pthread_cond_t *cv, uint64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(cv, &s->lock, &ts);
}

/* Take the demoter role for fn (one thread at a time writes to disk). */
static void as_demoter_locked(struct store *s, void (*fn)(struct store *s))
{
	struct store_tier *t = s->tier;

	t->demoter_busy = true;
	fn(s);
	t->demoter_busy = false;
	pthread_cond_broadcast(&t->idle);
}

bool store_tier_dels_due_locked(const struct store *s)
{
	const struct store_tier *t = s->tier;

	return (t->ndels || t->ndrops || t->nrupd) && !t->demoter_busy &&
	       store_now_ms() >= t->retry_at_ms && !t->index_failed;
}

/* The demoter role's background index work: failed drops, then deletes. */
static void flush_all_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	retry_drops_locked(s);
	if (t->ndels && !t->ndrops)
		store_tier_flush_dels_locked(s);
	if (t->nrupd && !t->ndrops)
		store_tier_flush_retains_locked(s);
}

static void *worker_main(void *arg)
{
	struct store *s = arg;
	struct store_tier *t = s->tier;

	store_lock(s);
	while (!t->stop) {
		if (!store_list_empty(&t->promo_queue)) {
			struct store_promo *p = store_container_of(t->promo_queue.next,
								   struct store_promo, link);

			store_list_del(&p->link);
			store_promo_run_locked(s, p);
			continue;
		}
		if (!t->demoter_busy && store_demote_wanted_locked(s)) {
			as_demoter_locked(s, store_demote_round_locked);
			continue;
		}
		if (t->npunch && !t->demoter_busy) {
			as_demoter_locked(s, store_tier_punch_locked);
			continue;
		}
		if (store_tier_dels_due_locked(s)) {
			as_demoter_locked(s, flush_all_locked);
			continue;
		}
		store_tier_wait_ms_locked(s, &t->wake, IDLE_WAIT_MS);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- geometry and opening ---- */

/* Segment size and count from the configuration (store.h rules).
 * Errors: -EINVAL (fewer than two segments, or segments of 16 TiB or more). */
static int geometry(const struct store_config *cfg, uint64_t *seg_bytes, uint32_t *nseg)
{
	uint64_t max_ext = store_pages_of(cfg->max_block_bytes) * STORE_PAGE_BYTES;
	uint64_t seg = cfg->nvme_segment_bytes, n;

	if (seg == 0) {
		seg = DEFAULT_SEGMENT_BYTES;
		if (cfg->nvme_capacity_bytes / 8 < seg)
			seg = cfg->nvme_capacity_bytes / 8;
	}
	seg -= seg % STORE_PAGE_BYTES;
	if (seg < max_ext)
		seg = max_ext;
	if (seg == 0 || seg / STORE_PAGE_BYTES > UINT32_MAX)
		return -EINVAL; /* block headers hold offsets in 32-bit pages */
	n = cfg->nvme_capacity_bytes / seg;
	if (n < 2 || n > UINT32_MAX - 1)
		return -EINVAL;
	*seg_bytes = seg;
	*nseg = (uint32_t)n;
	return 0;
}

static void set_why(char *why, size_t why_len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;

	if (!why || !why_len)
		return;
	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
}

/* The tier header with its segments and condition variables. */
static struct store_tier *tier_new(uint64_t seg_bytes, uint32_t nseg)
{
	struct store_tier *t = calloc(1, sizeof(*t));
	pthread_condattr_t ca;

	if (!t)
		return NULL;
	t->segs = calloc(nseg, sizeof(*t->segs));
	if (!t->segs) {
		free(t);
		return NULL;
	}
	for (uint32_t i = 0; i < nseg; i++)
	t->segment_bytes = seg_bytes;
	t->nseg = nseg;
	t->nfree = nseg;
	t->active = STORE_SEG_NONE;
	t->healthy = true;
	t->backoff_ms = BACKOFF_MS;
	store_list_init(&t->promo_queue);
	store_list_init(&t->promo_running);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->wake, &ca);
	pthread_cond_init(&t->idle, &ca);
	pthread_condattr_destroy(&ca);
	return t;
}

static void tier_free(struct store_tier *t)
{
	store_nvme_index_close(t->ix);
	store_nvme_io_close(t->io);
	pthread_cond_destroy(&t->wake);
	pthread_cond_destroy(&t->idle);
	free(t->threads);
	free(t->dels);
	free(t->drops);
	free(t->rupd);
	free(t->hot);
	free(t->segs);
	free(t);
}

/* Move a damaged index aside (with the log files as found, when kept)
 * and open a fresh, empty one in its place. `what` says why, for the
 * log. 0, or the error of the rename or of the fresh open. */
static int quarantine_index(struct store *s, struct store_tier *t, const char *path,
			    const char *keep, const char *what, char *why, size_t why_len)
{
	char aside[4096], wal[4200];
	int rc;

	store_nvme_index_close(t->ix);
	t->ix = NULL;
	rc = store_index_quarantine(path, aside, sizeof(aside));
	if (rc) {
		set_why(why, why_len, "%s: the nvme index is damaged (%s) and cannot be moved "
			"aside (%s)", path, what, strerror(-rc));
		return rc;
	}
	if (keep && access(keep, F_OK) == 0) {
		snprintf(wal, sizeof(wal), "%s/wal-as-found", aside);
		if (rename(keep, wal))
			store_index_wal_forget(keep);
	}
	t->index_quarantined++;
	store_log(s, STORE_LOG_ERR, "nvme index %s is damaged (%s): moved aside to %s, kept for "
		  "inspection; the nvme tier starts empty and dram serves as usual", path, what,
		  aside);
	return store_nvme_index_open(path, s->cfg.log, s->cfg.log_arg, &t->ix, why, why_len);
}

/* Open the RocksDB index at path (NVME.md "Index damage"): survey its
 * write-ahead log first and keep links to it while RocksDB replays it;
 * a damaged database, or a log whose replay stopped short of what was
 * written, is moved aside and the tier starts empty. */
static int open_index(struct store *s, struct store_tier *t, const char *path, char *why,
		      size_t why_len)
{
	size_t keep_len = strlen(path) + sizeof(".wal-kept");
	uint64_t written = 0, replayed;
	uint32_t files = 0;
	char *keep = malloc(keep_len);
	char what[160];
	int rc;

	if (!keep)
		return -ENOMEM;
	snprintf(keep, keep_len, "%s.wal-kept", path);
	store_index_wal_forget(keep); /* left by a crash during an earlier open */
	if (store_index_wal_survey(path, &written, &files) == 0 && files)
		(void)store_index_wal_keep(path, keep);
	rc = store_nvme_index_open(path, s->cfg.log, s->cfg.log_arg, &t->ix, why, why_len);
	if (rc == -EBADMSG) {
		snprintf(what, sizeof(what), "rocksdb cannot open it");
		rc = quarantine_index(s, t, path, keep, what, why, why_len);
	} else if (rc == 0 && written > (replayed = store_nvme_index_last_seq(t->ix))) {
		/* A replay that stopped early may have dropped a synced delete
		 * after an earlier put: what it kept cannot be trusted. */
		t->index_records_lost = written - replayed;
		snprintf(what, sizeof(what), "its write-ahead log was damaged: %llu index records "
			 "after sequence %llu were lost", (unsigned long long)t->index_records_lost,
			 (unsigned long long)replayed);
		rc = quarantine_index(s, t, path, keep, what, why, why_len);
	}
	store_index_wal_forget(keep);
	free(keep);
	return rc;
}

/* Open the segment files and the RocksDB index under cfg.nvme_dir. */
static int open_files(struct store *s, struct store_tier *t, char *why, size_t why_len)
{
	const struct store_config *cfg = &s->cfg;
	size_t len = strlen(cfg->nvme_dir) + sizeof("/index");
	char *path;
	int rc;

	rc = store_nvme_io_open(cfg->nvme_dir, t->segment_bytes, t->nseg, cfg->log, cfg->log_arg,
				&t->io, why, why_len);
	if (rc)
		return rc;
	path = malloc(len);
	if (!path)
		return -ENOMEM;
	snprintf(path, len, "%s/index", cfg->nvme_dir);
	rc = open_index(s, t, path, why, why_len);
	/* RocksDB makes its directory with the umask's mode (kvpoold sets
	 * 077); owner only, as the segments (best effort) */
	if (rc == 0)
		(void)chmod(path, 0700);
	if (rc == 0)
		rc = store_nvme_index_next_ns_id(t->ix, &t->next_disk_id);
	if (rc == -EBADMSG) {
		rc = quarantine_index(s, t, path, NULL, "its next namespace id cannot be read",
				      why, why_len);
		if (rc == 0)
			rc = store_nvme_index_next_ns_id(t->ix, &t->next_disk_id);
	}
	if (rc && why && !why[0])
		set_why(why, why_len, "%s: cannot read the index's next namespace id",
			cfg->nvme_dir);
	free(path);
	return rc;
}

/* The rebuild could not read the index through (a damaged table file
 * RocksDB found only now): move it aside, start empty, rebuild again. */
static int rebuild_after_damage(struct store *s, struct store_tier *t, char *why, size_t why_len)
{
	size_t len = strlen(s->cfg.nvme_dir) + sizeof("/index");
	char *path = malloc(len);
	int rc;

	if (!path)
		return -ENOMEM;
	snprintf(path, len, "%s/index", s->cfg.nvme_dir);
	rc = quarantine_index(s, t, path, NULL, "reading it through failed", why, why_len);
	free(path);
	if (rc == 0)
		rc = store_nvme_index_next_ns_id(t->ix, &t->next_disk_id);
	if (rc == 0)
		rc = store_rebuild(s, why, why_len);
	return rc;
}

/* Demotion thresholds from the arena size and the largest block. */
static void set_thresholds(struct store *s, struct store_tier *t)
{
	uint64_t pages = store_arena_pages(s->arena);
	uint64_t max_pages = store_pages_of(s->cfg.max_block_bytes);
	uint64_t low = pages / 4;

	if (low < 2 * max_pages)
		low = 2 * max_pages;
	if (low > pages)
		low = pages;
	t->low_pages = low;
	t->batch_bytes = t->segment_bytes / 4 < MAX_BATCH_BYTES ? t->segment_bytes / 4
								 : MAX_BATCH_BYTES;
}

static int start_threads(struct store *s, struct store_tier *t)
{
	uint32_t n = s->cfg.nvme_io_threads ? s->cfg.nvme_io_threads : DEFAULT_IO_THREADS;

	if (n > MAX_IO_THREADS)
		n = MAX_IO_THREADS;
	t->threads = calloc(n, sizeof(*t->threads));
	if (!t->threads)
		return -ENOMEM;
	for (; t->nthreads < n; t->nthreads++) {
		int rc = pthread_create(&t->threads[t->nthreads], NULL, worker_main, s);

		/* EAGAIN: out of threads or memory for a stack (store_open's -ENOMEM) */
		if (rc)
			return -ENOMEM;
	}
	return 0;
}

/* Stop and join the worker threads (none may be mid-round: drained). */
static void stop_threads(struct store *s)
{
	struct store_tier *t = s->tier;

	store_lock(s);
	t->stop = true;
	pthread_cond_broadcast(&t->wake);
	pthread_mutex_unlock(&s->lock);
	for (uint32_t i = 0; i < t->nthreads; i++)
		pthread_join(t->threads[i], NULL);
	t->nthreads = 0;
}

int store_tier_open(struct store *s, char *why, size_t why_len)
{
	struct store_tier *t;
	uint64_t seg_bytes;
	uint32_t nseg;
	int rc;

	rc = geometry(&s->cfg, &seg_bytes, &nseg);
	if (rc) {
		set_why(why, why_len, "%s: nvme_capacity holds fewer than two segments",
			s->cfg.nvme_dir);
		return rc;
	}
	/* before a header per segment is allocated: a huge capacity fails
	 * here, not after thousands of files */
	rc = store_nvme_io_check_fds(s->cfg.nvme_dir, seg_bytes, nseg, why, why_len);
	if (rc)
		return rc;
	t = tier_new(seg_bytes, nseg);
	if (!t)
		return -ENOMEM;
	rc = open_files(s, t, why, why_len);
	if (rc)
		goto out_free;
	s->tier = t;
	set_thresholds(s, t);
	rc = store_lru_reserve_locked(s, 1024);
	if (rc)
		goto out_unset;
	rc = store_rebuild(s, why, why_len);
	if (rc == -EBADMSG)
		rc = rebuild_after_damage(s, t, why, why_len);
	if (rc)
		goto out_unset;
	rc = start_threads(s, t);
	if (rc) {
		set_why(why, why_len, "%s: cannot start the nvme i/o threads", s->cfg.nvme_dir);
		goto out_stop;
	}
	return 0;

out_stop:
	stop_threads(s);
out_unset:
	s->tier = NULL;
out_free:
	tier_free(t);
	return rc;
}

/* store_keep_dram's order: retained blocks first (the pool promised to
 * keep them: when the time runs out, ordinary blocks are the ones lost),
 * then hottest first (descending last use). Each block is written after
 * its DRAM-only ancestors (next_hot_locked), which a retained block's
 * are retained too, so a retained chain is written from its head. */
static int hotter_first(const void *a, const void *b)
{
	const struct store_block *x = *(struct store_block *const *)a;
	const struct store_block *y = *(struct store_block *const *)b;

	if (x->retained != y->retained)
		return x->retained ? -1 : 1;
	return x->last_use > y->last_use ? -1 : x->last_use < y->last_use;
}

int store_keep_dram(struct store *s, uint64_t timeout_ms, uint64_t *kept, uint64_t *left)
{
	struct store_tier *t = s->tier;
	uint64_t deadline = store_now_ms() + timeout_ms, before;
	struct store_heap *dirty;
	int rc = 0;

	if (kept)
		*kept = 0;
	if (!t) {
		if (left)
			*left = s->dram_blocks;
		return -ENODEV;
	}
	store_lock(s);
	dirty = &s->lru[STORE_LRU_DIRTY];
	before = t->demotions;
	if (!t->hot && dirty->len) {
		/* without memory for the list: the LRU order */
		t->hot = malloc(dirty->len * sizeof(*t->hot));
		if (t->hot) {
			for (uint64_t i = 0; i < dirty->len; i++)
				t->hot[i] = store_slab_ptr(&s->slab, dirty->v[i]);
			t->nhot = dirty->len;
			t->hot_next = 0;
			qsort(t->hot, t->nhot, sizeof(*t->hot), hotter_first);
		}
	}
	t->demote_all++;
	store_tier_kick_locked(s);
	for (;;) {
		uint64_t now = store_now_ms();

		if (dirty->len == 0 && !t->demoter_busy)
			break;
		if (!t->demoter_busy && ((!t->healthy && now < t->retry_at_ms) || t->reclaim_stuck ||
					 t->index_failed)) {
			rc = -EIO;
			break;
		}
		if (now >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		store_tier_wait_ms_locked(s, &t->idle, deadline - now < 20 ? deadline - now : 20);
	}
	t->demote_all--;
	/* the batch in flight still reads the list */
	while (t->demoter_busy)
		store_tier_wait_ms_locked(s, &t->idle, 20);
	free(t->hot);
	t->hot = NULL;
	t->nhot = t->hot_next = 0;
	if (kept)
		*kept = t->demotions - before;
	if (left)
		*left = dirty->len;
	if (rc == 0 && dirty->len)
		rc = -ETIMEDOUT;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void store_tier_drain(struct store *s)
{
	struct store_tier *t = s->tier;

	store_lock(s);
	t->draining = true;
	pthread_cond_broadcast(&t->wake);
	while (t->promos || t->demoter_busy)
		store_tier_wait_ms_locked(s, &t->idle, IDLE_WAIT_MS);
	pthread_mutex_unlock(&s->lock);
}

void store_tier_close(struct store *s)
{
	struct store_tier *t = s->tier;

	store_tier_drain(s);
	stop_threads(s);
	store_lock(s);
	/* what was removed must not come back at the next open */
	retry_drops_locked(s);
	if (t->ndels)
		store_tier_flush_dels_locked(s);
	/* deadlines extended since their records were written */
	if (t->nrupd && !t->index_failed)
		store_tier_flush_retains_locked(s);
	store_tier_punch_locked(s);
	if (t->ndrops || t->ndels)
		store_log(s, STORE_LOG_ERR, "nvme: closing with %zu namespace drops and %zu record "
			  "deletes not written to the index: those blocks may come back at the next "
			  "start", t->ndrops, t->ndels);
	pthread_mutex_unlock(&s->lock);
	s->tier = NULL;
	tier_free(t);
}

/* ---- statistics and namespaces (nvme/tier.h) ---- */

void store_tier_stats_locked(const struct store *s, struct store_stats *st)
{
	const struct store_tier *t = s->tier;
	uint64_t segs_used = t->nseg - t->nfree;

	st->used_bytes += t->promo_bytes;
	st->nvme_enabled = 1;
	st->nvme_direct_io = store_nvme_io_direct(t->io);
	st->nvme_healthy = t->healthy;
	st->nvme_capacity_bytes = (uint64_t)t->nseg * t->segment_bytes;
	st->nvme_segment_bytes = t->segment_bytes;
	st->nvme_used_bytes = segs_used * t->segment_bytes;
	st->nvme_payload_bytes = t->nvme_payload_bytes;
	st->nvme_blocks = t->nvme_blocks;
	st->demotions = t->demotions;
	st->demoted_bytes = t->demoted_bytes;
	st->promotions = t->promotions;
	st->promoted_bytes = t->promoted_bytes;
	st->nvme_bytes_written = t->bytes_written;
	st->nvme_bytes_read = t->bytes_read;
	st->rewritten_bytes = t->rewritten_bytes;
	st->segments_reclaimed = t->segments_reclaimed;
	st->admission_rejections = t->admission_rejections;
	st->nvme_evictions = t->evictions;
	st->corrupt_blocks = t->corrupt_blocks;
	st->nvme_read_errors = t->read_errors;
	st->nvme_write_errors = t->write_errors;
	st->rebuild_ms = t->rebuild_ms;
	st->rebuild_blocks = t->rebuild_blocks;
	st->orphans_dropped = t->orphans_dropped;
	st->rebuild_truncated = t->rebuild_truncated;
	st->index_records_lost = t->index_records_lost;
	st->index_quarantined = t->index_quarantined;
}

int store_tier_ns_drop(struct store *s, uint32_t disk_id)
{
	int rc = store_nvme_index_ns_drop(s->tier->ix, disk_id);

	if (!rc)
		return 0;
	store_log(s, STORE_LOG_ERR, "nvme: dropping namespace %u on disk failed (%d); "
		  "retried in the background", disk_id, rc);
	store_lock(s);
	store_tier_write_failed_locked(s);
	store_tier_queue_drop_locked(s, disk_id);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void store_tier_removed_locked(struct store *s, const struct store_block *b)
{
	if (b->on_nvme || b->demoting)
		s->tier->disk_removals++;
}

uint64_t store_tier_disk_removals_locked(const struct store *s)
{
	return s->tier ? s->tier->disk_removals : 0;
}
