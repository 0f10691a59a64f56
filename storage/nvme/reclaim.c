/*
 * reclaim.c - NVMe space comes back a segment at a time: the oldest sealed
 * segment (passing over those that retained blocks fill, which wait for
 * their retentions) is emptied and becomes free.
 *
 * Its blocks are sorted, under the lock, into
 *  - blocks that must stay: with visible children (no holes), refs (a GET
 *    or I/O in flight), lease pins, a retention, or a promotion pending;
 *  - blocks used recently (last_use in the newer half of the range from
 *    the segment's oldest use to now), up to half a segment of them so
 *    every reclaim frees at least half a segment of room;
 *  - the rest, which leave NVMe: a block with a DRAM copy becomes dirty
 *    again, an NVMe-only one (a leaf, by the first rule) leaves the pool.
 * The first two kinds are rewritten into the active segment (from DRAM
 * when they have a copy there, else read back and checksum-verified
 * first); rewritten_bytes counts them. One RocksDB batch then moves their
 * records and deletes the others' (deletes apply first, NVME.md), and
 * only after that - and after every read of the segment has ended
 * (readers) - is the segment free for reuse.
 *
 * A segment whose kept blocks would fill most of it - interior blocks of
 * long chains whose children live in later segments - first loses its
 * cold subtrees (evict_cold_subtrees_locked): without that, a tier full
 * of chain interiors could never be reclaimed and would stall for good.
 *
 * The demoter reclaims right after it activates the last free segment,
 * so the target is empty and holds a whole segment's blocks. A block that
 * does not fit (no active segment, after a restart with none free) stays,
 * and the segment stays sealed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "nvme_index.h"
#include "nvme_io.h"
#include "tier_impl.h"
#include "proto_xxh3.h"

/* One block rewritten by the reclaim. */
struct move {
	struct store_block *b;
	uint64_t old_off, new_off, ext;
	uint32_t disk_id;
	bool from_dram;
	int status;        /* 0 moved; -EBADMSG / -EIO the old copy is bad; 1 not written */
};

struct reclaim {
	uint32_t seg, target;
	struct move *moves;
	struct store_nvme_rec *recs;
	size_t n, nrecs;
	struct store_del *dels;
	size_t ndels;
	uint64_t bounce_bytes;
	bool aborted;      /* a block that must stay found no room */
	int write_rc;
};

uint32_t store_tier_oldest_sealed(const struct store_tier *t)
{
	uint32_t best = STORE_SEG_NONE;

	for (uint32_t i = 0; i < t->nseg; i++) {
		const struct store_seg *sg = &t->segs[i];

		if (sg->state == STORE_SEG_SEALED &&
		    (best == STORE_SEG_NONE || sg->seq < t->segs[best].seq))
			best = i;
	}
	return best;
}

/* Extent bytes of segment sg's retained blocks. */
static uint64_t retained_bytes_locked(const struct store *s, const struct store_seg *sg)
{
	uint64_t bytes = 0;

	for (uint32_t id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG)) {
		const struct store_block *b = store_blk(s, id);

		if (b->retained)
			bytes += store_extent_bytes(b);
	}
	return bytes;
}

static int cmp_seq(const void *a, const void *b, void *arg)
{
	const struct store_tier *t = arg;
	uint64_t x = t->segs[*(const uint32_t *)a].seq, y = t->segs[*(const uint32_t *)b].seq;

	return (x > y) - (x < y);
}

/* The segment to reclaim: the oldest sealed one, unless retained blocks
 * fill most of it (rewriting them would free next to nothing, and as
 * they stay until their deadlines the tier would stall on it for that
 * long): then the oldest sealed one they do not fill. Retained blocks
 * thus gather in segments that wait, and every other segment keeps
 * cycling. Only when every sealed segment is mostly retained is the
 * oldest returned (the reclaim then stalls, and DRAM evicts unretained
 * leaves meanwhile). The oldest costs one scan of its blocks; the others
 * are looked at only when it is mostly retained. */
static uint32_t pick_segment_locked(const struct store *s)
{
	const struct store_tier *t = s->tier;
	uint32_t oldest = store_tier_oldest_sealed(t), *order, n = 0, pick = oldest;

	if (oldest == STORE_SEG_NONE ||
	    retained_bytes_locked(s, &t->segs[oldest]) <= t->segment_bytes / 4 * 3)
		return oldest;
	order = malloc(t->nseg * sizeof(*order));
	if (!order)
		return oldest;
	for (uint32_t i = 0; i < t->nseg; i++)
		if (t->segs[i].state == STORE_SEG_SEALED && i != oldest)
			order[n++] = i;
	qsort_r(order, n, sizeof(*order), cmp_seq, (void *)t);
	for (uint32_t k = 0; k < n; k++) {
		if (retained_bytes_locked(s, &t->segs[order[k]]) <= t->segment_bytes / 4 * 3) {
			pick = order[k];
			break;
		}
	}
	free(order);
	return pick;
}

static bool must_stay(const struct store_block *b)
{
	return store_has_children(b) || b->refs || b->leased || b->promoting || b->retained;
}

/* Bytes of segment sg whose blocks the chain rule (or a pin) keeps. When
 * they fill most of it, a reclaim would rewrite nearly a whole segment to
 * gain little (in a prefix tree most blocks have children): its cold
 * subtrees go first, and if what stays still fills most of it the caller
 * stalls the tier for a moment (puts get BUSY, DRAM evicts leaves). */
static uint64_t stay_bytes_locked(const struct store *s, const struct store_seg *sg)
{
	uint64_t bytes = 0;

	for (uint32_t id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG)) {
		const struct store_block *b = store_blk(s, id);

		if (must_stay(b))
			bytes += store_extent_bytes(b);
	}
	return bytes;
}

/* The use clock value above which a block of segment sg counts as recent.
 * Retained blocks stay whatever their age, and are left out: one retained
 * long ago (e.g. rebuilt at a restart and rewritten forward since) would
 * otherwise pull the cut back until every other block looked recent and
 * no cold subtree could ever go. */
static uint64_t recent_cut(const struct store *s, const struct store_seg *sg)
{
	uint64_t oldest = s->clock;

	for (uint32_t id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG)) {
		const struct store_block *b = store_blk(s, id);

		if (!b->retained && b->last_use < oldest)
			oldest = b->last_use;
	}
	return oldest + (s->clock - oldest) / 2;
}

/* Whether the subtree rooted at root may leave the pool now: no block in
 * it is pinned (a GET, an I/O, a child reservation, a lease, a
 * promotion) or was used after `cut`. Iterative pre-order walk: chains
 * are thousands deep. */
static bool subtree_cold_locked(const struct store *s, const struct store_block *root,
				uint64_t cut)
{
	const struct store_block *cur = root;

	for (;;) {
		if (cur->refs || cur->leased || cur->promoting || cur->retained ||
		    cur->last_use > cut)
			return false;
		if (cur->first_child) {
			cur = store_blk(s, cur->first_child);
			continue;
		}
		/* climb to the first ancestor (below root) with a next sibling */
		for (;;) {
			const struct store_block *p;
			uint32_t next;

			if (cur == root)
				return true;
			p = store_parent(s, cur);
			next = store_ring_next(s, p->first_child, store_slab_id(cur),
					       STORE_RING_SIBLING);
			if (next) {
				cur = store_blk(s, next);
				break;
			}
			cur = p;
		}
	}
}

/* Is b kept in segment sg by its children alone, and cold? */
static bool cold_interior(const struct store_block *b, uint64_t cut)
{
	return store_has_children(b) && !b->refs && !b->leased && !b->promoting &&
	       !b->retained && b->last_use <= cut;
}

/* A segment that the chain rule fills (interior blocks whose children
 * live elsewhere) would never be reclaimed: evict its cold subtrees
 * instead - each a block of sg that only its children keep, taken with
 * every descendant, when nothing in the subtree is pinned or was used in
 * the newer half of sg's use range. Prefix trees are used from the root
 * down (MATCH touches every matched block), so a cold interior block
 * heads a cold subtree. Only the topmost such block of a path is taken,
 * so subtrees never overlap. Returns the blocks evicted (0 also when
 * out of memory: the segment then stays as it was). */
static uint64_t evict_cold_subtrees_locked(struct store *s, struct store_seg *sg)
{
	uint64_t cut = recent_cut(s, sg), n = 0, evicted = 0;
	uint32_t id, *roots, nroots = 0;

	for (id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG))
		n++;
	roots = malloc((n + 1) * sizeof(*roots));
	if (!roots)
		return 0;
	for (id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG))
		store_blk(s, id)->mark = cold_interior(store_blk(s, id), cut);
	for (id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG)) {
		struct store_block *b = store_blk(s, id), *up;

		if (!b->mark)
			continue;
		for (up = store_parent(s, b); up && !(up->mark && up->on_nvme && up->seg ==
						      (uint32_t)(sg - s->tier->segs));
		     up = store_parent(s, up))
			;
		if (!up && subtree_cold_locked(s, b, cut))
			roots[nroots++] = id;
	}
	for (id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG))
		store_blk(s, id)->mark = 0;
	for (uint32_t i = 0; i < nroots; i++) {
		struct store_block *b = store_blk(s, roots[i]);
		struct store_ns *ns = store_block_ns(s, b);
		uint64_t k = store_block_remove_tree_locked(s, b, NULL);

		s->evictions += k;
		ns->evictions += k;
		s->tier->evictions += k;
		evicted += k;
	}
	free(roots);
	return evicted;
}

/* b leaves NVMe: dirty again if it is in DRAM, else out of the pool. */
static void drop_locked(struct store *s, struct store_block *b)
{
	s->tier->evictions++;
	if (b->in_dram) {
		store_tier_detach_locked(s, b);
		return;
	}
	s->evictions++;
	store_block_ns(s, b)->evictions++;
	store_block_remove_locked(s, b);
}

/* Plan a rewrite of b into the target and pin it. */
static void plan_move_locked(struct store *s, struct reclaim *rc, struct store_block *b)
{
	struct store_seg *tg = &s->tier->segs[rc->target];
	struct move *m = &rc->moves[rc->n];
	struct store_nvme_rec *r = &rc->recs[rc->n];

	m->b = b;
	m->ext = store_extent_bytes(b);
	m->old_off = store_seg_off(b);
	m->new_off = tg->fill_bytes;
	m->disk_id = store_block_ns(s, b)->disk_id;
	m->from_dram = b->in_dram;
	m->status = 1;
	store_tier_rec_fill_locked(s, b, m->disk_id, rc->target, m->new_off, r);
	tg->fill_bytes += m->ext;
	if (!m->from_dram && m->ext > rc->bounce_bytes)
		rc->bounce_bytes = m->ext;
	b->refs++;
	store_lru_sync_locked(s, b);
	rc->n++;
}

/* Sort the segment's blocks into moves and drops. Errors: -ENOMEM. */
static int plan_locked(struct store *s, struct reclaim *rc)
{
	struct store_tier *t = s->tier;
	struct store_seg *sg = &t->segs[rc->seg];
	uint64_t cut = recent_cut(s, sg), budget = t->segment_bytes / 2, room = 0, count = 0;
	uint32_t id, next;

	for (id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG))
		count++;
	rc->moves = calloc(count + 1, sizeof(*rc->moves));
	rc->recs = calloc(count + 1, sizeof(*rc->recs));
	if (!rc->moves || !rc->recs)
		return -ENOMEM;
	if (rc->target != STORE_SEG_NONE)
		room = t->segment_bytes - t->segs[rc->target].fill_bytes;
	/* by count: dropping b takes it off the ring (maybe its head) */
	for (id = sg->blocks; count; id = next, count--) {
		struct store_block *b = store_blk(s, id);
		uint64_t ext = store_extent_bytes(b);
		bool stay = must_stay(b);
		bool recent = !stay && b->last_use > cut && budget >= ext;

		next = store_ring_at(s, id, STORE_RING_SEG)->next;
		if (!stay && !recent) {
			drop_locked(s, b);
			continue;
		}
		if (room < ext) {
			rc->aborted = stay;
			if (!stay)
				drop_locked(s, b);
			continue;
		}
		room -= ext;
		if (recent)
			budget -= ext;
		plan_move_locked(s, rc, b);
	}
	return 0;
}

/* Rewrite one block: from DRAM, or read back and verified. Without the lock. */
static int move_one(struct store *s, struct reclaim *rc, struct move *m, void *bounce)
{
	struct store_tier *t = s->tier;
	struct iovec iov = { .iov_len = m->ext };
	int err;

	if (m->from_dram) {
		iov.iov_base = store_arena_ptr(s->arena, m->b->first_page);
	} else {
		err = store_nvme_io_read(t->io, rc->seg, m->old_off, bounce, m->ext);
		if (err) {
			m->status = -EIO;
			return 0;
		}
		if (XXH3_64bits(bounce, store_block_length(m->b)) != store_block_checksum(m->b)) {
			m->status = -EBADMSG;
			return 0;
		}
		iov.iov_base = bounce;
	}
	err = store_tier_room_for(s, m->ext);
	if (!err)
		err = store_nvme_io_writev(t->io, rc->target, m->new_off, &iov, 1);
	if (err)
		return err;
	m->status = 0;
	return 0;
}

/* The I/O of a reclaim, without the lock: rewrites, then one index batch
 * with the moved records and the queued deletes. */
static void reclaim_io(struct store *s, struct reclaim *rc)
{
	void *bounce = NULL;
	size_t nrecs = 0;

	if (rc->bounce_bytes &&
	    posix_memalign(&bounce, STORE_NVME_ALIGN_BYTES, rc->bounce_bytes)) {
		rc->write_rc = -ENOMEM;
		return;
	}
	for (size_t i = 0; i < rc->n && !rc->write_rc; i++)
		rc->write_rc = move_one(s, rc, &rc->moves[i], bounce);
	free(bounce);
	for (size_t i = 0; i < rc->n; i++)
		if (rc->moves[i].status == 0)
			rc->recs[nrecs++] = rc->recs[i];
	if (!rc->write_rc && (nrecs || rc->ndels))
		rc->write_rc = store_tier_index_commit(s, rc->recs, nrecs, rc->dels, rc->ndels);
	if (rc->write_rc) {
		for (size_t i = 0; i < rc->n; i++)
			if (rc->moves[i].status == 0)
				rc->moves[i].status = 1;
	}
}

/* Log what the I/O found wrong (without the lock). */
static void log_failures(struct store *s, const struct reclaim *rc)
{
	struct store_tier *t = s->tier;

	for (size_t i = 0; i < rc->n; i++) {
		const struct move *m = &rc->moves[i];

		if (m->status == -EBADMSG)
			store_log_limited(s, &t->rl_corrupt, STORE_LOG_ERR,
					  "nvme: block at segment %u offset %llu failed its checksum "
					  "during reclaim; removed with its descendants",
					  rc->seg, (unsigned long long)m->old_off);
		else if (m->status == -EIO)
			store_log_limited(s, &t->rl_read, STORE_LOG_ERR,
					  "nvme: read of segment %u offset %llu failed during reclaim; "
					  "block removed with its descendants",
					  rc->seg, (unsigned long long)m->old_off);
	}
	if (rc->write_rc)
		store_log_limited(s, &t->rl_write, STORE_LOG_ERR,
				  "nvme: rewrite into segment %u failed (%d); the tier backs off",
				  rc->target, rc->write_rc);
}

/* Commit one move under the lock. */
static void commit_move_locked(struct store *s, struct reclaim *rc, struct move *m)
{
	struct store_tier *t = s->tier;
	struct store_block *b = m->b;

	if (m->status == 0) {
		t->rewritten_bytes += m->ext;
		t->bytes_written += m->ext;
		if (b->state == STORE_BLOCK_REMOVED) {
			store_tier_queue_del_locked(s, m->disk_id, b->node.key, rc->target);
		} else {
			store_ring_del(s, &t->segs[rc->seg].blocks, b, STORE_RING_SEG);
			t->segs[rc->seg].live_bytes -= m->ext;
			b->seg = rc->target;
			b->seg_page = (uint32_t)(m->new_off / STORE_PAGE_BYTES);
			store_ring_add_tail(s, &t->segs[rc->target].blocks, b, STORE_RING_SEG);
			t->segs[rc->target].live_bytes += m->ext;
		}
	} else if (m->status < 0) {
		if (m->status == -EBADMSG)
			t->corrupt_blocks++;
		else
			t->read_errors++;
		if (b->state == STORE_BLOCK_VISIBLE)
			store_block_remove_tree_locked(s, b, NULL);
	} else {
		rc->aborted = true;
	}
	if (!m->from_dram && (m->status == 0 || m->status == -EBADMSG))
		t->bytes_read += m->ext;
	store_block_unpin_locked(s, b);
}

int store_reclaim_locked(struct store *s)
{
	struct store_tier *t = s->tier;
	struct reclaim rc = { .seg = pick_segment_locked(s), .target = t->active };
	struct store_seg *sg;
	int err;

	if (rc.seg == STORE_SEG_NONE)
		return -EAGAIN;
	sg = &t->segs[rc.seg];
	t->reclaim_stuck = false;
	/* deciding what stays and what goes reads leases and recency: a
	 * write section, so MATCHes' logged intents count (core.h) */
	store_wr_begin(s);
	if (stay_bytes_locked(s, sg) > t->segment_bytes / 4 * 3) {
		uint64_t evicted = evict_cold_subtrees_locked(s, sg);

		if (evicted == 0 || stay_bytes_locked(s, sg) > t->segment_bytes / 4 * 3) {
			t->reclaim_stuck = evicted == 0;
			store_wr_end(s);
			return -EAGAIN; /* rewriting it would free little: not now */
		}
	}
	sg->state = STORE_SEG_FREEING;
	err = plan_locked(s, &rc);
	if (err) {
		/* the planned moves hold pins: give them back */
		for (size_t i = 0; i < rc.n; i++)
			store_block_unpin_locked(s, rc.moves[i].b);
		rc.aborted = true;
		store_wr_end(s);
		goto out_done;
	}
	store_wr_end(s);
	store_tier_take_dels_locked(s, &rc.dels, &rc.ndels);
	sg->readers++;
	pthread_mutex_unlock(&s->lock);
	reclaim_io(s, &rc);
	log_failures(s, &rc);
	store_lock(s);
	sg->readers--;
	if (rc.write_rc) {
		store_tier_dels_requeue_locked(s, rc.dels, rc.ndels);
		store_tier_write_failed_locked(s);
	} else {
		store_tier_dels_done_locked(s, rc.dels, rc.ndels);
	}
	for (size_t i = 0; i < rc.n; i++)
		commit_move_locked(s, &rc, &rc.moves[i]);
out_done:
	if (rc.aborted || sg->live_bytes) {
		sg->state = STORE_SEG_SEALED;
		rc.aborted = true;
	} else {
		t->segments_reclaimed++;
		store_tier_seg_settle_locked(s, rc.seg);
	}
	free(rc.moves);
	free(rc.recs);
	free(rc.dels);
	return rc.aborted ? -EAGAIN : 0;
}
