/*
 * demote.c - the demoter: writes dirty DRAM copies, least recently used
 * first, to the active segment, so that the put path can always make room
 * by dropping clean copies (evict.c).
 *
 * A round runs on one I/O thread at a time (tier->demoter_busy) and:
 *  1. under the lock, picks up to DEMOTE_MAX_BLOCKS dirty blocks (at most
 *     batch_bytes), reserves consecutive ranges of the active segment for
 *     them and pins them (a ref keeps their pages; demoting keeps them out
 *     of the DIRTY heap); blocks that nvme_admission=reused turns away are
 *     evicted here instead, when they are leaves and DRAM is short of
 *     room (one at a time, LRU first, until the watermark is met);
 *  2. without the lock, names new namespaces in the index, writes the
 *     extents with one pwritev straight from the arena, then commits their
 *     records and the queued record deletes in one RocksDB batch (payload
 *     before metadata: NVME.md);
 *  3. under the lock, attaches the NVMe copies (now clean), or, for a
 *     block removed meanwhile, queues the delete of its fresh record.
 * A failed write marks the tier unhealthy and backs off; the blocks stay
 * dirty. When the active segment is full it is sealed and a free one
 * activated; taking the last free segment makes the next round reclaim
 * the oldest sealed one into it (reclaim.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "nvme_index.h"
#include "nvme_io.h"
#include "tier_impl.h"

#define DEMOTE_MAX_BLOCKS 256u
#define STALL_RETRY_MS 100u

/* One block of a demotion batch. */
struct demote_item {
	struct store_block *b;
	uint32_t seg;
	uint64_t off;
	uint32_t disk_id;
};

/* A namespace the batch records under a new disk id. */
struct demote_name {
	uint32_t disk_id;
	uint32_t len;
	uint64_t owner; /* the creator's tenant key, 0 = none */
	char name[STORE_NAME_MAX_BYTES];
};

/* Everything a batch carries across the unlocked part. */
struct demote_batch {
	struct demote_item items[DEMOTE_MAX_BLOCKS];
	struct store_nvme_rec recs[DEMOTE_MAX_BLOCKS];
	struct iovec iov[DEMOTE_MAX_BLOCKS];
	struct demote_name *names;
	uint32_t n, nnames;
	uint64_t bytes;
	struct store_del *dels;
	size_t ndels;
	bool fail_write;          /* test hook: this write fails */
	bool dels_written;        /* the deletes went out although the batch failed */
};

bool store_demote_wanted_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	uint64_t avail;

	if (t->draining || t->stop || store_now_ms() < t->retry_at_ms || t->index_failed)
		return false;
	if (t->nfree == 0 && t->active != STORE_SEG_NONE && s->lru[STORE_LRU_DIRTY].len)
		return true;
	if (s->lru[STORE_LRU_DIRTY].len == 0)
		return false;
	if (t->demote_all || t->want_demote)
		return true;
	avail = store_arena_free_pages(s->arena) + s->clean_pages;
	return avail < t->low_pages;
}

/* ---- segments ---- */

/* Seal the active segment and activate a free one. Returns false when no
 * segment is free. */
static bool switch_active_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	if (t->active != STORE_SEG_NONE) {
		t->segs[t->active].state = STORE_SEG_SEALED;
		t->active = STORE_SEG_NONE;
	}
	for (uint32_t i = 0; i < t->nseg; i++) {
		struct store_seg *sg = &t->segs[i];

		if (sg->state != STORE_SEG_FREE)
			continue;
		sg->state = STORE_SEG_ACTIVE;
		sg->fill_bytes = 0;
		sg->seq = ++t->next_seq;
		t->active = i;
		t->nfree--;
		return true;
	}
	return false;
}

/* ---- picking ---- */

/* The disk id of namespace ns, assigning one (and noting that the batch
 * must record its name) the first time. false without memory. */
static bool disk_id_locked(struct store *s, struct store_ns *ns, struct demote_batch *db)
{
	struct demote_name *nm;

	if (!ns->disk_id) {
		ns->disk_id = s->tier->next_disk_id++;
		ns->disk_named = false;
	}
	if (ns->disk_named)
		return true;
	for (uint32_t i = 0; i < db->nnames; i++)
		if (db->names[i].disk_id == ns->disk_id)
			return true;
	if (!db->names) {
		db->names = malloc(DEMOTE_MAX_BLOCKS * sizeof(*db->names));
		if (!db->names)
			return false;
	}
	nm = &db->names[db->nnames++];
	nm->disk_id = ns->disk_id;
	nm->len = ns->name_len;
	nm->owner = ns->tenant ? ns->tenant->key : 0;
	memcpy(nm->name, ns->name, ns->name_len);
	return true;
}

/* Is DRAM below the demoter's low watermark (free + clean pages)? */
static bool room_needed_locked(const struct store *s)
{
	return store_arena_free_pages(s->arena) + s->clean_pages < s->tier->low_pages;
}

enum admit { ADMIT_DEMOTE, ADMIT_EVICTED, ADMIT_KEEP };

/* nvme_admission=reused turns away a block not used since its put; a
 * leaf then leaves the pool, anything else is demoted anyway (no holes).
 * A turned-away leaf is evicted only while DRAM is short of room, one
 * at a time in LRU order (the DIRTY heap's order), as a DRAM-only pool
 * evicts; once the watermark is met it stays (ADMIT_KEEP: the round
 * stops), unless every dirty block must go (the test hook). */
static enum admit admission_locked(struct store *s, struct store_block *b)
{
	if (s->cfg.nvme_admission != STORE_ADMIT_REUSED || s->tier->hot)
		return ADMIT_DEMOTE;
	store_wr_begin(s); /* a MATCH may have used or leased b meanwhile */
	if (b->reused || !store_block_evictable(b)) {
		store_wr_end(s);
		return ADMIT_DEMOTE;
	}
	if (!room_needed_locked(s)) {
		store_wr_end(s);
		return s->tier->demote_all ? ADMIT_DEMOTE : ADMIT_KEEP;
	}
	s->tier->admission_rejections++;
	s->evictions++;
	store_block_ns(s, b)->evictions++;
	store_block_remove_locked(s, b);
	store_wr_end(s);
	return ADMIT_EVICTED;
}

/* Add b to the batch at the active segment's fill point and pin it. */
static void take_locked(struct store *s, struct demote_batch *db, struct store_block *b)
{
	struct store_tier *t = s->tier;
	struct store_seg *sg = &t->segs[t->active];
	struct demote_item *it = &db->items[db->n];
	struct store_nvme_rec *r = &db->recs[db->n];

	it->b = b;
	it->seg = t->active;
	it->off = sg->fill_bytes;
	it->disk_id = store_block_ns(s, b)->disk_id;
	store_tier_rec_fill_locked(s, b, it->disk_id, it->seg, it->off, r);
	db->iov[db->n].iov_base = store_arena_ptr(s->arena, b->first_page);
	db->iov[db->n].iov_len = store_extent_bytes(b);
	sg->fill_bytes += store_extent_bytes(b);
	db->bytes += store_extent_bytes(b);
	db->n++;
	b->demoting = 1;
	b->refs++;
	store_lru_sync_locked(s, b);
}

static bool is_dirty(const struct store_block *b)
{
	return store_lru_slot(b, STORE_LRU_DIRTY) != STORE_HEAP_NONE;
}

/* store_keep_dram's order: the topmost dirty ancestor of the hottest
 * block still dirty (a child taken before its parent would be an orphan
 * at the next start if the time ran out between them). Falls back to the
 * DIRTY heap's order once the list is used up (blocks put meanwhile). */
static struct store_block *next_hot_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	struct store_block *b, *p;

	while (t->hot_next < t->nhot && !is_dirty(t->hot[t->hot_next]))
		t->hot_next++;
	if (t->hot_next == t->nhot)
		return store_slab_ptr(&s->slab, s->lru[STORE_LRU_DIRTY].v[0]);
	b = t->hot[t->hot_next];
	while ((p = store_parent(s, b)) && is_dirty(p))
		b = p;
	return b;
}

/* Fill the batch from the DIRTY heap. Returns false when the round must
 * end without writing (a segment switch took the last free segment, or
 * no segment is free). */
static bool pick_locked(struct store *s, struct demote_batch *db)
{
	struct store_tier *t = s->tier;
	struct store_heap *dirty = &s->lru[STORE_LRU_DIRTY];

	while (db->n < DEMOTE_MAX_BLOCKS && db->bytes < t->batch_bytes && dirty->len) {
		struct store_block *b = t->hot ? next_hot_locked(s)
					       : store_slab_ptr(&s->slab, dirty->v[0]);
		uint64_t ext = store_extent_bytes(b);

		enum admit a = admission_locked(s, b);

		if (a == ADMIT_EVICTED)
			continue;
		if (a == ADMIT_KEEP)
			break;
		if (t->active == STORE_SEG_NONE ||
		    t->segs[t->active].fill_bytes + ext > t->segment_bytes) {
			if (db->n)
				break;
			if (!switch_active_locked(s)) {
				t->stalled = true;
				return false;
			}
			if (t->nfree == 0)
				return false; /* reclaim into the fresh segment first */
			continue;
		}
		if (!disk_id_locked(s, store_block_ns(s, b), db)) {
			t->retry_at_ms = store_now_ms() + STALL_RETRY_MS;
			break;
		}
		take_locked(s, db, b);
	}
	return db->n > 0;
}

/* ---- record deletes ---- */

/* Write the queued record deletes in one batch (synced when sync, so
 * that they hold through a power loss). Requeued on failure. 0 or -EIO. */
static int flush_dels_locked(struct store *s, bool sync)
{
	struct store_del *dels;
	size_t n;
	int rc;

	store_tier_take_dels_locked(s, &dels, &n);
	pthread_mutex_unlock(&s->lock);
	rc = store_tier_index_commit(s, NULL, 0, dels, n);
	if (!rc && sync)
		rc = store_nvme_index_sync(s->tier->ix);
	if (rc)
		store_log_limited(s, &s->tier->rl_write, STORE_LOG_ERR,
				  "nvme: deleting %zu index records failed (%d)", n, rc);
	store_lock(s);
	if (rc) {
		store_tier_dels_requeue_locked(s, dels, n);
		store_tier_write_failed_locked(s);
	} else {
		store_tier_dels_done_locked(s, dels, n);
	}
	free(dels);
	return rc;
}

void store_tier_flush_dels_locked(struct store *s)
{
	(void)flush_dels_locked(s, false);
}

/* Records rewritten per round at most, so one round holds the demoter
 * role (and its memory) for a bounded time. */
#define RETAIN_FLUSH_MAX 4096u

/* Take up to RETAIN_FLUSH_MAX queued blocks that still have a record and
 * fill their records (new deadline) into recs; ids[] keeps which blocks.
 * Returns how many. */
static size_t take_retains_locked(struct store *s, struct store_nvme_rec *recs, uint32_t *ids)
{
	struct store_tier *t = s->tier;
	size_t n = 0, k = 0;

	for (; k < t->nrupd && n < RETAIN_FLUSH_MAX; k++) {
		struct store_block *b = store_blk(s, t->rupd[k]);

		if (b->state != STORE_BLOCK_VISIBLE || !b->retain_dirty)
			continue; /* gone, or taken by an earlier entry of the queue */
		b->retain_dirty = 0;
		if (!b->on_nvme)
			continue; /* its next demotion writes the deadline */
		store_tier_rec_fill_locked(s, b, store_block_ns(s, b)->disk_id, b->seg,
					   store_seg_off(b), &recs[n]);
		ids[n++] = t->rupd[k];
	}
	memmove(t->rupd, t->rupd + k, (t->nrupd - k) * sizeof(*t->rupd));
	t->nrupd -= k;
	return n;
}

void store_tier_flush_retains_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	struct store_nvme_rec *recs = malloc(RETAIN_FLUSH_MAX * sizeof(*recs));
	uint32_t *ids = malloc(RETAIN_FLUSH_MAX * sizeof(*ids));
	size_t n;
	int rc;

	if (!recs || !ids) {
		free(recs);
		free(ids);
		return; /* they stay queued */
	}
	n = take_retains_locked(s, recs, ids);
	if (n) {
		/* nothing else writes records meanwhile (the demoter role), and
		 * a block removed meanwhile has its record delete queued after
		 * this write: it cannot come back */
		pthread_mutex_unlock(&s->lock);
		rc = store_tier_index_commit(s, recs, n, NULL, 0);
		if (rc)
			store_log_limited(s, &t->rl_write, STORE_LOG_ERR,
					  "nvme: rewriting %zu index records with new retention "
					  "deadlines failed (%d)", n, rc);
		store_lock(s);
		if (rc) {
			store_tier_write_failed_locked(s);
			for (size_t i = 0; i < n; i++) {
				struct store_block *b = store_blk(s, ids[i]);

				if (b->state == STORE_BLOCK_VISIBLE && b->retained && b->on_nvme)
					store_tier_retain_changed_locked(s, b);
			}
		}
	}
	free(recs);
	free(ids);
}

int store_tier_persist_removals_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	int rc;

	/* A batch or a reclaim in flight may hold a block just removed:
	 * when it ends it queues the delete of the record it wrote. (A
	 * demoter parked by the test hook is not waited for.) */
	while (t->demoter_busy && !t->held)
		pthread_cond_wait(&t->idle, &s->lock);
	if (t->demoter_busy)
		return 0;
	t->demoter_busy = true;
	rc = flush_dels_locked(s, true);
	t->demoter_busy = false;
	pthread_cond_broadcast(&t->idle);
	return rc;
}

/* ---- the write ---- */

/* Name new namespaces, write the extents, commit records and deletes.
 * Called without the lock. Returns 0 or -errno. */
static int write_batch(struct store *s, struct demote_batch *db)
{
	struct store_tier *t = s->tier;
	int rc = store_tier_room_for(s, db->bytes);

	if (rc == -ENOSPC && db->ndels) {
		/* The payload does not fit, but the record deletes must go out
		 * anyway: they are what frees (and punches) segments, so a full
		 * disk can recover. The reserve is there for index writes. */
		db->dels_written = store_tier_index_commit(s, NULL, 0, db->dels, db->ndels) == 0;
		return rc;
	}
	for (uint32_t i = 0; i < db->nnames && !rc; i++)
		rc = store_nvme_index_ns_put_owned(t->ix, db->names[i].disk_id, db->names[i].name,
						   db->names[i].len, db->names[i].owner);
	if (rc)
		return rc;
	if (db->fail_write)
		return -ENOSPC;
	rc = store_nvme_io_writev(t->io, db->items[0].seg, db->items[0].off, db->iov, (int)db->n);
	if (rc)
		return rc;
	return store_tier_index_commit(s, db->recs, db->n, db->dels, db->ndels);
}

/* A named disk id is recorded: mark its namespace (if still using it). */
static void mark_named_locked(struct store *s, uint32_t disk_id)
{
	for (uint32_t i = 0; i < s->nns; i++)
		if (s->ns[i]->disk_id == disk_id)
			s->ns[i]->disk_named = true;
}

/* Commit the batch under the lock after write_batch returned rc. */
static void commit_locked(struct store *s, struct demote_batch *db, int rc)
{
	struct store_tier *t = s->tier;

	if (rc) {
		struct store_seg *sg = &t->segs[db->items[0].seg];

		if (db->dels_written)
			store_tier_dels_done_locked(s, db->dels, db->ndels);
		else
			store_tier_dels_requeue_locked(s, db->dels, db->ndels);
		store_tier_write_failed_locked(s);
		/* nothing was written: give the batch's range back (only the
		 * demoter hands out ranges), so failures do not seal empty
		 * segments */
		if (t->active == db->items[0].seg &&
		    sg->fill_bytes == db->items[db->n - 1].off +
				      db->iov[db->n - 1].iov_len)
			sg->fill_bytes = db->items[0].off;
	} else {
		store_tier_dels_done_locked(s, db->dels, db->ndels);
		for (uint32_t i = 0; i < db->nnames; i++)
			mark_named_locked(s, db->names[i].disk_id);
		t->bytes_written += db->bytes;
		t->healthy = true;
		t->stalled = false;
	}
	for (uint32_t i = 0; i < db->n; i++) {
		struct demote_item *it = &db->items[i];
		struct store_block *b = it->b;

		b->demoting = 0;
		if (rc == 0 && b->state == STORE_BLOCK_REMOVED) {
			/* deleted while written: its fresh record must go */
			store_tier_queue_del_locked(s, it->disk_id, b->node.key, it->seg);
		} else if (rc == 0) {
			store_tier_attach_locked(s, b, it->seg, it->off);
			t->demotions++;
			t->demoted_bytes += store_block_length(b);
		}
		store_block_unpin_locked(s, b);
	}
}

/* Pick, write and commit one batch. */
static void demote_batch_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	struct demote_batch *db = calloc(1, sizeof(*db));
	int rc;

	if (!db)
		return;
	if (!pick_locked(s, db)) {
		if (t->stalled)
			t->retry_at_ms = store_now_ms() + STALL_RETRY_MS;
		goto out_free;
	}
	if (t->fail_writes) {
		t->fail_writes--;
		db->fail_write = true;
	}
	while (t->hold) {
		/* test hook: a picked batch waits here, its blocks pinned */
		t->held = true;
		pthread_cond_broadcast(&t->idle);
		pthread_cond_wait(&t->wake, &s->lock);
	}
	t->held = false;
	store_tier_take_dels_locked(s, &db->dels, &db->ndels);
	pthread_mutex_unlock(&s->lock);
	rc = write_batch(s, db);
	if (rc)
		store_log_limited(s, &t->rl_write, STORE_LOG_ERR,
				  "nvme: demotion of %u blocks to segment %u failed (%d); "
				  "the tier backs off and dram evicts meanwhile",
				  db->n, db->items[0].seg, rc);
	store_lock(s);
	commit_locked(s, db, rc);
out_free:
	free(db->dels);
	free(db->names);
	free(db);
}

void store_demote_round_locked(struct store *s)
{
	struct store_tier *t = s->tier;

	t->want_demote = false;
	if (t->npunch) {
		store_tier_punch_locked(s); /* freed segments first */
		return;
	}
	if (!s->lru[STORE_LRU_DIRTY].len && !t->demote_all)
		return; /* nothing waits to be demoted: no reclaim either */
	if (t->nfree == 0 && store_tier_oldest_sealed(t) != STORE_SEG_NONE) {
		uint64_t rewritten = t->rewritten_bytes;

		/* A reclaim that had to rewrite most of its segment (blocks whose
		 * children are still stored and were used recently, or pinned)
		 * freed little: stall for a moment rather than keep rewriting
		 * segments while puts wait. Cold subtrees already went inside
		 * the reclaim; DRAM evicts leaves meanwhile (the stalled
		 * fallback), and puts that find no leaf get BUSY. */
		if (store_reclaim_locked(s) ||
		    t->rewritten_bytes - rewritten > t->segment_bytes / 4 * 3) {
			t->stalled = true;
			t->retry_at_ms = store_now_ms() + STALL_RETRY_MS;
		}
		return;
	}
	if (t->nfree == 0 && t->ndels) {
		/* segments wait for their deletes before they are free */
		store_tier_flush_dels_locked(s);
		return;
	}
	demote_batch_locked(s);
}
