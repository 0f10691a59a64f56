/*
 * rebuild.c - warm restart: make every block on NVMe matchable again from
 * the RocksDB index, at store_open, before any thread runs.
 *
 *  1. Namespaces: scan the table; a name recorded under several disk ids
 *     keeps the highest (the newest) and the others are dropped on disk.
 *  2. Records: scan them all. A record is dropped (deleted) when its
 *     namespace is unknown, its extent is not inside a segment of this
 *     geometry, its length is 0 or above max_block_bytes, or its extent
 *     overlaps another record's (which of the two is right cannot be
 *     known; both go).
 *  3. Blocks: each valid record becomes an NVMe-only block with its
 *     last_use (halved once per aging pass between the record's epoch and
 *     the newest record's, store_use_unstamp); parents are linked; every block not reachable from a
 *     first block (its parent, or an ancestor's, did not survive: it was
 *     in DRAM only, or dropped above) is an orphan: dropped and counted
 *     (orphans_dropped). So the no-holes rule holds from the first request.
 *  4. Segments: a segment holding blocks is sealed, filled up to its last
 *     extent, aged by its newest use stamp; the others are free.
 *  5. The dropped records are deleted; namespaces left with no block are
 *     dropped on disk (one range delete each).
 * rebuild_ms and rebuild_blocks time and count it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvme_index.h"
#include "nvme_io.h"
#include "tier_impl.h"

/* A namespace of the disk table. */
struct rb_ns {
	uint32_t disk_id;
	uint32_t len;
	char name[STORE_NAME_MAX_BYTES];
	bool dropped;            /* an older id of a name recorded again */
	uint64_t owner;          /* its creator's tenant key, 0 = none recorded */
	struct store_ns *ns;     /* created with its first surviving block */
};

struct rebuild {
	struct store *s;
	struct rb_ns *nss;
	size_t nns, nss_cap;
	struct store_nvme_rec *recs;
	size_t nrecs, recs_cap;
	uint8_t *bad;            /* per record: dropped */
	struct store_block **blocks; /* per record: its block, or NULL */
	uint64_t invalid, orphans, kept;
	uint64_t retained;           /* blocks whose retention was still running */
	uint64_t retain_expired;     /* blocks whose retention deadline had passed */
	uint64_t lost;               /* records in segment files missing or short at open */
	uint32_t first_lost_seg;
	uint32_t epoch;              /* newest aging epoch of a record (store_use_stamp) */
};

/* Grow *arr (elements of size `size`) to hold one more. */
static int grow(void **arr, size_t *cap, size_t n, size_t size)
{
	void *p;
	size_t c;

	if (n < *cap)
		return 0;
	c = *cap ? *cap * 2 : 1024;
	p = realloc(*arr, c * size);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = c;
	return 0;
}

static int on_ns(void *arg, uint32_t disk_id, const char *name, size_t name_len)
{
	struct rebuild *rb = arg;
	struct rb_ns *e;

	if (name_len == 0 || name_len > STORE_NAME_MAX_BYTES)
		return 0;
	if (grow((void **)&rb->nss, &rb->nss_cap, rb->nns, sizeof(*rb->nss)))
		return -ENOMEM;
	e = &rb->nss[rb->nns++];
	memset(e, 0, sizeof(*e));
	e->disk_id = disk_id;
	e->len = (uint32_t)name_len;
	memcpy(e->name, name, name_len);
	/* unreadable: the namespace is charged to nobody, as before */
	(void)store_nvme_index_ns_owner(rb->s->tier->ix, disk_id, &e->owner);
	return 0;
}

static int on_rec(void *arg, const struct store_nvme_rec *rec)
{
	struct rebuild *rb = arg;

	if (grow((void **)&rb->recs, &rb->recs_cap, rb->nrecs, sizeof(*rb->recs)))
		return -ENOMEM;
	rb->recs[rb->nrecs++] = *rec;
	if (rec->last_use >> 32 > rb->epoch)
		rb->epoch = (uint32_t)(rec->last_use >> 32);
	return 0;
}

/* Mark older disk ids of a name recorded again as dropped (the scan came
 * in disk id order, so a later entry is newer). */
static void dedupe_names(struct rebuild *rb)
{
	for (size_t i = 0; i < rb->nns; i++)
		for (size_t j = i + 1; j < rb->nns && !rb->nss[i].dropped; j++)
			if (rb->nss[i].len == rb->nss[j].len &&
			    memcmp(rb->nss[i].name, rb->nss[j].name, rb->nss[i].len) == 0)
				rb->nss[i].dropped = true;
}

/* The live table entry for disk_id (entries are in disk id order). */
static struct rb_ns *ns_of(struct rebuild *rb, uint32_t disk_id)
{
	size_t lo = 0, hi = rb->nns;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (rb->nss[mid].disk_id < disk_id)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < rb->nns && rb->nss[lo].disk_id == disk_id && !rb->nss[lo].dropped)
		return &rb->nss[lo];
	return NULL;
}

/* Is the record's extent inside this geometry, its length acceptable? */
static bool rec_fits(const struct store *s, const struct store_nvme_rec *r)
{
	const struct store_tier *t = s->tier;
	uint64_t ext = store_pages_of(r->length) * STORE_PAGE_BYTES;

	return r->length && r->length <= s->cfg.max_block_bytes &&
	       store_pages_of(r->length) <= store_arena_pages(s->arena) &&
	       r->segment < t->nseg && r->offset % STORE_PAGE_BYTES == 0 &&
	       r->offset <= t->segment_bytes && ext <= t->segment_bytes - r->offset;
}

static const struct store_nvme_rec *sort_recs;

static int cmp_place(const void *a, const void *b)
{
	const struct store_nvme_rec *x = &sort_recs[*(const size_t *)a];
	const struct store_nvme_rec *y = &sort_recs[*(const size_t *)b];

	if (x->segment != y->segment)
		return x->segment < y->segment ? -1 : 1;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Mark invalid records and every record whose extent overlaps another.
 * Errors: -ENOMEM. */
static int check_places(struct rebuild *rb)
{
	size_t *ord = malloc((rb->nrecs + 1) * sizeof(*ord)), n = 0;
	uint64_t end = 0;
	size_t last = 0;
	uint32_t seg = UINT32_MAX;

	if (!ord)
		return -ENOMEM;
	for (size_t i = 0; i < rb->nrecs; i++) {
		if (!ns_of(rb, rb->recs[i].ns_disk_id) || !rec_fits(rb->s, &rb->recs[i])) {
			rb->bad[i] = 1;
			rb->invalid++;
			continue;
		}
		if (rb->recs[i].offset + store_pages_of(rb->recs[i].length) * STORE_PAGE_BYTES >
		    store_nvme_io_segment_had(rb->s->tier->io, rb->recs[i].segment)) {
			if (rb->lost++ == 0)
				rb->first_lost_seg = rb->recs[i].segment;
			rb->bad[i] = 1;
			rb->invalid++;
			continue;
		}
		ord[n++] = i;
	}
	sort_recs = rb->recs;
	qsort(ord, n, sizeof(*ord), cmp_place);
	for (size_t k = 0; k < n; k++) {
		const struct store_nvme_rec *r = &rb->recs[ord[k]];
		uint64_t ext = store_pages_of(r->length) * STORE_PAGE_BYTES;

		if (r->segment == seg && r->offset < end) {
			rb->invalid += !rb->bad[ord[k]] + !rb->bad[last];
			rb->bad[ord[k]] = 1;
			rb->bad[last] = 1;
		}
		if (r->segment != seg || r->offset + ext > end) {
			end = r->offset + ext;
			last = ord[k];
		}
		seg = r->segment;
	}
	free(ord);
	return 0;
}

/* A new NVMe-only block for record r in namespace ns (not linked yet). */
static struct store_block *block_of_locked(struct store *s, const struct store_nvme_rec *r,
					   struct store_ns *ns)
{
	struct store_block *b = store_slab_alloc(&s->slab);

	if (!b)
		return NULL;
	b->node.ns_id = ns->ns_id;
	memcpy(b->node.key, r->key, STORE_KEY_BYTES);
	b->has_parent = r->has_parent; /* resolved from r->parent by mark_reachable_locked */
	b->state = STORE_BLOCK_VISIBLE;
	store_block_set_length(b, r->length);
	store_block_set_checksum(b, r->checksum);
	b->last_use = store_use_unstamp(r->last_use, s->clock_epoch);
	b->heap_idx[0] = STORE_HEAP_NONE;
	b->heap_idx[1] = STORE_HEAP_NONE;
	return b;
}

/* The in-memory namespace of table entry e, created at its first block.
 * Errors: -ENOMEM, -EDQUOT (store_ns_get_locked). */
static int live_ns_locked(struct store *s, struct rb_ns *e, struct store_ns **out)
{
	int rc;

	if (!e->ns) {
		rc = store_ns_get_locked(s, e->name, e->len, &e->ns);
		if (rc)
			return rc;
		e->ns->disk_id = e->disk_id;
		e->ns->disk_named = true;
	}
	*out = e->ns;
	return 0;
}

/* Index a block for every valid record. Errors: -ENOMEM. */
static int make_blocks_locked(struct rebuild *rb)
{
	struct store *s = rb->s;
	int rc = store_lru_reserve_locked(s, rb->nrecs + 1);

	if (rc)
		return rc;
	(void)store_index_reserve(&s->index, rb->nrecs);
	for (size_t i = 0; i < rb->nrecs; i++) {
		const struct store_nvme_rec *r = &rb->recs[i];
		struct store_ns *ns;
		struct store_block *b;

		if (rb->bad[i])
			continue;
		/* check_places dropped records of unknown namespaces. Without
		 * memory the open fails: dropping (deleting) the records of a
		 * namespace that could not be created would lose them for good */
		rc = live_ns_locked(s, ns_of(rb, r->ns_disk_id), &ns);
		if (rc == -ENOMEM)
			return rc;
		if (rc || store_find_locked(s, ns->ns_id, r->key)) {
			rb->bad[i] = 1;
			rb->invalid++;
			continue;
		}
		b = block_of_locked(s, r, ns);
		if (!b)
			return -ENOMEM;
		store_index_insert(&s->index, &b->node);
		rb->blocks[i] = b;
	}
	return 0;
}

/* Link every block to its parent, then mark what a first block reaches
 * (iteratively: chains can be long). Errors: -ENOMEM. */
static int mark_reachable_locked(struct rebuild *rb)
{
	struct store *s = rb->s;
	struct store_block **stack = malloc((rb->nrecs + 1) * sizeof(*stack));
	size_t top = 0;

	if (!stack)
		return -ENOMEM;
	for (size_t i = 0; i < rb->nrecs; i++) {
		struct store_block *b = rb->blocks[i], *p;

		if (!b)
			continue;
		if (!b->has_parent) {
			b->mark = 1;
			stack[top++] = b;
			continue;
		}
		p = store_find_locked(s, b->node.ns_id, rb->recs[i].parent);
		if (p) {
			store_set_parent(b, p);
			store_child_add(s, p, b);
		}
	}
	while (top) {
		struct store_block *b = stack[--top];

		for (uint32_t id = b->first_child; id;
		     id = store_ring_next(s, b->first_child, id, STORE_RING_SIBLING)) {
			struct store_block *ch = store_blk(s, id);

			if (!ch->mark) {
				ch->mark = 1;
				stack[top++] = ch;
			}
		}
	}
	free(stack);
	return 0;
}

/* Free the unreachable blocks (orphans); publish the others. */
static void publish_locked(struct rebuild *rb)
{
	struct store *s = rb->s;
	struct store_tier *t = s->tier;

	for (size_t i = 0; i < rb->nrecs; i++) {
		struct store_block *b = rb->blocks[i];

		if (!b || b->mark)
			continue;
		/* an orphan's parent, if any, is an orphan too: nothing kept
		 * points at it */
		(void)store_index_remove(&s->index, &b->node);
		store_slab_free(&s->slab, b);
		rb->blocks[i] = NULL;
		rb->orphans++;
	}
	for (size_t i = 0; i < rb->nrecs; i++) {
		struct store_block *b = rb->blocks[i];
		const struct store_nvme_rec *r = &rb->recs[i];
		struct store_seg *sg;
		struct store_ns *ns;

		if (!b)
			continue;
		ns = store_block_ns(s, b);
		b->mark = 0;
		store_ring_add_tail(s, &ns->blocks, b, STORE_RING_LINK);
		ns->nblocks++;
		ns->bytes += store_block_length(b);
		s->blocks++;
		store_tier_attach_locked(s, b, r->segment, r->offset);
		sg = &t->segs[r->segment];
		if (sg->state == STORE_SEG_FREE) {
			sg->state = STORE_SEG_SEALED;
			t->nfree--;
		}
		if (r->offset + store_extent_bytes(b) > sg->fill_bytes)
			sg->fill_bytes = r->offset + store_extent_bytes(b);
		if (r->last_use > sg->seq)
			sg->seq = r->last_use;
		if (r->last_use > t->next_seq)
			t->next_seq = r->last_use;
		if (b->last_use > s->clock)
			s->clock = b->last_use;
		rb->kept++;
	}
	/* billing: each namespace to the tenant that created it, each block
	 * to the one that wrote it, as their records say (a tenant made here
	 * is taken over by the first connection whose token has its key,
	 * store_tenant_new_keyed); without memory, or for records that name
	 * none, charged to nobody */
	for (size_t i = 0; i < rb->nns; i++) {
		struct rb_ns *e = &rb->nss[i];
		struct store_tenant *tn;

		if (!e->ns || !e->owner || e->ns->tenant)
			continue;
		tn = store_tenant_of_key_locked(s, e->owner);
		if (tn) {
			e->ns->tenant = tn;
			tn->namespaces++;
		}
	}
	for (size_t i = 0; i < rb->nrecs; i++) {
		struct store_block *b = rb->blocks[i];
		struct store_tenant *tn;

		if (!b || !rb->recs[i].tenant_key)
			continue;
		tn = store_tenant_of_key_locked(s, rb->recs[i].tenant_key);
		if (tn) {
			b->tenant_id = tn->id;
			tn->bytes += store_block_length(b);
		}
	}
	/* retentions, once every kept block is linked (a retention walks up
	 * its chain); granted before, so no budget applies: they are
	 * charged to the namespace, and to its tenant once one binds it */
	for (size_t i = 0; i < rb->nrecs; i++) {
		struct store_block *b = rb->blocks[i];
		uint64_t until;

		if (!b || !rb->recs[i].retain_until_ms)
			continue;
		until = store_retain_until_from_wall(s, rb->recs[i].retain_until_ms);
		if (!until) {
			/* its deadline passed before this start (while kvpoold
			 * was down, mostly): counted as an expiry */
			store_retain_count_expired_locked(s, b);
			rb->retain_expired++;
		} else if (store_retain_block_locked(s, b, until, false, NULL) == STORE_RETAIN_OK) {
			rb->retained++;
		}
	}
}

/* Delete dropped records, and drop on disk the namespaces with no block
 * left (one range delete each). Without the lock; no thread runs yet. */
static int delete_dropped(struct rebuild *rb)
{
	struct store_tier *t = rb->s->tier;
	int rc = 0;

	for (size_t i = 0; i < rb->nns && !rc; i++) {
		struct rb_ns *e = &rb->nss[i];

		if (e->dropped || !e->ns || e->ns->nblocks == 0) {
			rc = store_nvme_index_ns_drop(t->ix, e->disk_id);
			if (e->ns && e->ns->disk_id == e->disk_id)
				e->ns->disk_id = 0;
			e->dropped = true;
		}
	}
	for (size_t i = 0; i < rb->nrecs && !rc; i++) {
		const struct store_nvme_rec *r = &rb->recs[i];
		const struct rb_ns *e;

		if (rb->blocks[i])
			continue;
		e = ns_of(rb, r->ns_disk_id);
		if (!e) {
			/* a dropped or unknown namespace: its range may still hold
			 * records of an id never recorded in the table */
			bool listed = false;

			for (size_t j = 0; j < rb->nns && !listed; j++)
				listed = rb->nss[j].disk_id == r->ns_disk_id;
			if (listed)
				continue;
		}
		rc = store_nvme_index_delete(t->ix, r->ns_disk_id, r->key);
	}
	return rc;
}

/* A build that failed half way: forget the blocks made so far. */
static void unbuild_locked(struct rebuild *rb)
{
	for (size_t i = 0; i < rb->nrecs; i++) {
		if (!rb->blocks[i])
			continue;
		(void)store_index_remove(&rb->s->index, &rb->blocks[i]->node);
		store_slab_free(&rb->s->slab, rb->blocks[i]);
		rb->blocks[i] = NULL;
	}
}

static void rebuild_free(struct rebuild *rb)
{
	free(rb->nss);
	free(rb->recs);
	free(rb->bad);
	free(rb->blocks);
}

/* Scan, validate and build (steps 1-4). Errors: -EIO, -ENOMEM. */
static int build(struct rebuild *rb)
{
	struct store *s = rb->s;
	uint64_t undecodable = 0;
	int rc;

	rc = store_nvme_index_ns_scan(s->tier->ix, on_ns, rb);
	if (!rc)
		rc = store_nvme_index_scan(s->tier->ix, on_rec, rb, &undecodable);
	if (rc)
		return rc; /* -EBADMSG: RocksDB found damage reading it through */
	rb->invalid += undecodable;
	dedupe_names(rb);
	rb->bad = calloc(rb->nrecs + 1, 1);
	rb->blocks = calloc(rb->nrecs + 1, sizeof(*rb->blocks));
	if (!rb->bad || !rb->blocks)
		return -ENOMEM;
	rc = check_places(rb);
	if (rc)
		return rc;
	store_lock(s);
	/* last_use of records from older epochs is halved once per pass since */
	s->clock_epoch = rb->epoch;
	rc = make_blocks_locked(rb);
	if (!rc)
		rc = mark_reachable_locked(rb);
	if (!rc)
		publish_locked(rb);
	else
		unbuild_locked(rb);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int store_rebuild(struct store *s, char *why, size_t why_len)
{
	struct rebuild rb = { .s = s };
	uint64_t start = store_now_ms(), ms;
	char rate[64];
	int rc;

	/* store_open, before any reader: one write section for the index's
	 * changes (core.h) */
	store_wr_begin(s);
	rc = build(&rb);
	if (rc == 0)
		rc = delete_dropped(&rb);
	if (rc)
		rebuild_free(&rb);
	store_wr_end(s);
	if (rc) {
		/* blocks built so far are freed with the namespaces by store_open */
		if (why && why_len)
			snprintf(why, why_len, "%s: rebuilding the nvme index failed (%d)",
				 s->cfg.nvme_dir, rc);
		return rc == -ENOMEM || rc == -EBADMSG ? rc : -EIO;
	}
	ms = store_now_ms() - start;
	s->tier->rebuild_ms = ms;
	s->tier->rebuild_blocks = rb.kept;
	s->tier->orphans_dropped = rb.orphans;
	s->tier->rebuild_truncated = rb.lost;
	snprintf(rate, sizeof(rate), ms ? "in %llu ms (%llu blocks/s)" : "in under 1 ms",
		 (unsigned long long)ms, (unsigned long long)(ms ? rb.kept * 1000 / ms : 0));
	store_log(s, STORE_LOG_INFO,
		  "nvme rebuild: %llu blocks %s, %llu orphans dropped, %llu bad records dropped, "
		  "%llu retentions still running, %llu found expired",
		  (unsigned long long)rb.kept, rate, (unsigned long long)rb.orphans,
		  (unsigned long long)rb.invalid, (unsigned long long)rb.retained,
		  (unsigned long long)rb.retain_expired);
	if (rb.lost)
		store_log(s, STORE_LOG_WARN,
			  "nvme rebuild: %llu records point into segment files that were missing or "
			  "truncated at start (first: segment %u); those blocks are dropped",
			  (unsigned long long)rb.lost, rb.first_lost_seg);
	rebuild_free(&rb);
	return 0;
}
