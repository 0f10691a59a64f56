/*
 * check.c - store_check, the invariant checker used by the tests, and the
 * DRAM core's test hooks (store_debug.h): one that breaks an invariant on
 * purpose, the eviction hook, the use clock. Built into the test library
 * only (storage/debug/).
 *
 * Checked: every visible block is indexed, its stored parent is visible
 * and lists it as a child (no holes), every block with a parent link is on
 * that parent's child ring and nothing else is, lease counts match their
 * lists, heap membership equals evictability and the heap is ordered,
 * reservations and zombies are accounted, leases are ordered and counted,
 * every allocated arena extent belongs to exactly one block or running
 * promotion, the bytes add up to the capacity (used + in-flight puts +
 * promotions + free, where used counts removed blocks until their last
 * release), and the namespace name table holds every namespace once.
 * With an NVMe tier, also: every visible block has a copy in some tier,
 * the CLEAN and DIRTY heaps hold exactly their blocks, per-tier block and
 * byte totals, and every segment's block list, live bytes and extents
 * (inside its fill, no overlaps) agree with the blocks that point at it.
 * Retentions: a retained block has exactly one record and every record
 * names a retained visible block, its parent is retained at least as
 * long (no holes), the deadline heap is ordered, and the retained blocks
 * and bytes add up per namespace, per tenant and for the pool.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "debug/store_debug.h"
#include "nvme/tier_impl.h"

struct extent {
	uint32_t first, pages;
};

/* Per-tier totals of the visible blocks. */
struct tally {
	uint64_t blocks, payload, dram_blocks, dram_used, dram_payload, nvme_blocks, nvme_payload;
	uint64_t retained, retained_bytes;
	uint64_t children, linked; /* on their parents' rings; with a parent_id */
};

struct checker {
	struct store *s;
	struct tally tally;
	char *why;
	size_t why_len;
	struct extent *ext; /* one per block header */
	uint64_t next_ext, ext_cap;
};

/* Record the reason and return -EFAULT. */
static int fail(struct checker *c, const char *fmt, ...)
{
	va_list ap;

	if (c->why && c->why_len) {
		va_start(ap, fmt);
		vsnprintf(c->why, c->why_len, fmt, ap);
		va_end(ap);
	}
	return -EFAULT;
}

static const char *hex8(const uint8_t *key, char buf[17])
{
	for (int i = 0; i < 8; i++)
		snprintf(buf + 2 * i, 3, "%02x", key[i]);
	return buf;
}

static int add_extent(struct checker *c, uint32_t first, uint32_t pages)
{
	if (c->next_ext >= c->ext_cap)
		return fail(c, "more block headers than counted");
	c->ext[c->next_ext].first = first;
	c->ext[c->next_ext].pages = pages;
	c->next_ext++;
	return 0;
}

/* Ring `head` of headers linked at `off` is well formed - each member's
 * neighbours point back at it, at most `limit` members, all headers in
 * use - and has *count members. */
static int ring_ok(struct checker *c, uint32_t head, size_t off, uint64_t limit,
		   const char *what, uint64_t *count)
{
	const struct store *s = c->s;
	uint64_t n = 0;

	for (uint32_t id = head; id; id = store_ring_next(s, head, id, off)) {
		const struct store_ring *r = store_ring_at(s, id, off);

		if (++n > limit)
			return fail(c, "%s ring holds more than %llu blocks", what,
				    (unsigned long long)limit);
		if (!r->next || !r->prev || store_ring_at(s, r->next, off)->prev != id ||
		    store_ring_at(s, r->prev, off)->next != id)
			return fail(c, "%s ring broken", what);
	}
	*count = n;
	return 0;
}

static uint64_t list_len(const struct store_list *h)
{
	uint64_t n = 0;

	for (const struct store_list *p = h->next; p != h; p = p->next)
		n++;
	return n;
}

/* The parent link of visible block b: no holes. */
static int check_parent(struct checker *c, const struct store_block *b)
{
	struct store_block *p;
	char k[17];

	if (!b->has_parent)
		return b->parent_id ? fail(c, "first block %s has a parent link",
					   hex8(b->node.key, k)) : 0;
	p = store_parent(c->s, b);
	if (!p)
		return fail(c, "hole: parent of block %s is not stored", hex8(b->node.key, k));
	/* the parent key is the parent's node.key: it must be the stored block of
	 * that key in the same namespace */
	if (p->state != STORE_BLOCK_VISIBLE || p->node.ns_id != b->node.ns_id ||
	    store_find_locked(c->s, p->node.ns_id, p->node.key) != p)
		return fail(c, "block %s linked to the wrong parent", hex8(b->node.key, k));
	return 0;
}

/* Children of visible block b point back at it; they are counted, so
 * that check_visible_all can see every linked child is on a ring. */
static int check_children(struct checker *c, const struct store_block *b)
{
	const struct store *s = c->s;
	uint64_t n;
	char k[17];
	int rc = ring_ok(c, b->first_child, STORE_RING_SIBLING, s->blocks, "child", &n);

	if (rc)
		return rc;
	for (uint32_t id = b->first_child; id;
	     id = store_ring_next(s, b->first_child, id, STORE_RING_SIBLING)) {
		const struct store_block *ch = store_blk(s, id);

		if (store_parent(s, ch) != b || ch->state != STORE_BLOCK_VISIBLE)
			return fail(c, "child list of %s holds a stranger", hex8(b->node.key, k));
	}
	c->tally.children += n;
	return 0;
}

/* b is marked leased exactly when the table of leases by block holds a
 * lease on it (check_leases sees that every lease there is in its bucket). */
static int check_block_leases(struct checker *c, const struct store_block *b)
{
	uint64_t n = 0;
	char k[17];

	if (c->s->lease_buckets)
		for (const struct store_lease *r = *store_lease_bucket(c->s, b); r; r = r->by_block)
			n += r->block == b;
	if ((n != 0) != b->leased)
		return fail(c, "block %s marked leased %d, leases %llu", hex8(b->node.key, k),
			    b->leased, (unsigned long long)n);
	return 0;
}

/* Heap membership of b in every heap kept. */
static int check_membership(struct checker *c, const struct store_block *b)
{
	int kinds = c->s->tier ? STORE_LRU_KINDS : 1;
	char k[17];

	for (int kind = 0; kind < kinds; kind++) {
		bool in = store_lru_slot(b, kind) != STORE_HEAP_NONE;
		bool want = store_lru_member(c->s, b, (enum store_lru_kind)kind);

		if (in != want)
			return fail(c, "block %s: in LRU heap %d: %d, belongs: %d",
				    hex8(b->node.key, k), kind, in, want);
	}
	return 0;
}

/* The tier fields of visible block b: a copy somewhere, its NVMe place,
 * I/O in flight only where it can be. */
static int check_copies(struct checker *c, const struct store_block *b)
{
	const struct store_tier *t = c->s->tier;
	char k[17];

	if (!b->in_dram && !b->on_nvme)
		return fail(c, "block %s has no copy in any tier", hex8(b->node.key, k));
	if (!t && (!b->in_dram || b->on_nvme || b->demoting || b->promoting))
		return fail(c, "block %s: tier state without a tier", hex8(b->node.key, k));
	if (b->demoting && (!b->in_dram || b->on_nvme || !b->refs))
		return fail(c, "block %s demoting in bad state", hex8(b->node.key, k));
	if (b->promoting && (b->in_dram || !b->on_nvme || !b->refs ||
			     !store_promo_find_locked(t, b)))
		return fail(c, "block %s promoting in bad state", hex8(b->node.key, k));
	if (!b->on_nvme)
		return 0;
	if (b->seg >= t->nseg || t->segs[b->seg].state == STORE_SEG_FREE)
		return fail(c, "block %s on a free or unknown segment", hex8(b->node.key, k));
	if (store_seg_off(b) + store_extent_bytes(b) > t->segs[b->seg].fill_bytes)
		return fail(c, "block %s extent beyond its segment's fill", hex8(b->node.key, k));
	return 0;
}

/* A retained block has a record and its parent one at least as long. */
static int check_block_retention(struct checker *c, const struct store_block *b)
{
	uint64_t until = store_retain_until_locked(c->s, b);
	const struct store_block *p = store_parent(c->s, b);
	char k[17];

	if (b->retained != (until != 0))
		return fail(c, "block %s retained %u but has %s record", hex8(b->node.key, k),
			    b->retained, until ? "a" : "no");
	if (until && p && store_retain_until_locked(c->s, p) < until)
		return fail(c, "block %s retained longer than its parent (a hole when it expires)",
			    hex8(b->node.key, k));
	return 0;
}

/* Everything about one visible block. */
static int check_visible(struct checker *c, const struct store_ns *ns, const struct store_block *b)
{
	char k[17];
	int rc;

	if (b->state != STORE_BLOCK_VISIBLE || b->node.ns_id != ns->ns_id)
		return fail(c, "block %s on namespace list in bad state", hex8(b->node.key, k));
	if (store_find_locked(c->s, ns->ns_id, b->node.key) != b)
		return fail(c, "block %s not in the index", hex8(b->node.key, k));
	if (b->pages == 0 || b->pad_bytes >= STORE_PAGE_BYTES)
		return fail(c, "block %s extent size wrong", hex8(b->node.key, k));
	if (b->last_use > c->s->clock)
		return fail(c, "block %s used at %u, after the clock %u", hex8(b->node.key, k),
			    b->last_use, c->s->clock);
	rc = check_membership(c, b);
	if (!rc)
		rc = check_copies(c, b);
	if (!rc)
		rc = check_parent(c, b);
	if (!rc)
		rc = check_children(c, b);
	if (!rc)
		rc = check_block_leases(c, b);
	if (!rc)
		rc = check_block_retention(c, b);
	if (!rc && b->in_dram)
		rc = add_extent(c, b->first_page, b->pages);
	return rc;
}

/* Add visible block b to the per-tier totals. */
static void tally_add(struct tally *t, const struct store_block *b)
{
	t->blocks++;
	t->linked += b->parent_id != 0;
	t->payload += store_block_length(b);
	if (b->retained) {
		t->retained++;
		t->retained_bytes += store_block_length(b);
	}
	if (b->in_dram) {
		t->dram_blocks++;
		t->dram_used += store_extent_bytes(b);
		t->dram_payload += store_block_length(b);
	}
	if (b->on_nvme) {
		t->nvme_blocks++;
		t->nvme_payload += store_block_length(b);
	}
}

/* Exactly the headers in use have a state (free ones 0): the aging pass
 * (store_lru_age_locked) tells them apart by it. */
static int check_slab_states(struct checker *c)
{
	const struct store_slab *sl = &c->s->slab;
	uint64_t used = 0;

	for (uint32_t ch = 0; ch < sl->nchunks; ch++) {
		uint32_t count;
		const struct store_block *b = store_slab_chunk(sl, ch, &count);

		for (uint32_t i = 0; i < count; i++)
			used += b[i].state != 0;
	}
	if (used != sl->live)
		return fail(c, "%llu block headers have a state, %llu in use",
			    (unsigned long long)used, (unsigned long long)sl->live);
	return 0;
}

/* Every namespace's blocks, and the pool-wide totals they add up to. */
static int check_visible_all(struct checker *c)
{
	struct store *s = c->s;
	struct tally *t = &c->tally;
	int rc;

	for (uint32_t i = 0; i < s->nns; i++) {
		struct store_ns *ns = s->ns[i];
		uint64_t nb = t->blocks, bytes = t->payload, nvme = t->nvme_blocks, n;
		uint64_t rb = t->retained, rbytes = t->retained_bytes;

		rc = ring_ok(c, ns->blocks, STORE_RING_LINK, s->blocks, "namespace", &n);
		if (rc)
			return rc;
		for (uint32_t id = ns->blocks; id;
		     id = store_ring_next(s, ns->blocks, id, STORE_RING_LINK)) {
			struct store_block *b = store_blk(s, id);

			rc = check_visible(c, ns, b);
			if (rc)
				return rc;
			tally_add(t, b);
		}
		if (t->blocks - nb != ns->nblocks || t->payload - bytes != ns->bytes ||
		    t->nvme_blocks - nvme != ns->nvme_blocks)
			return fail(c, "namespace %s totals wrong", ns->name);
		if (t->retained - rb != ns->racct.blocks || t->retained_bytes - rbytes != ns->racct.bytes)
			return fail(c, "namespace %s retains %llu blocks, counted %llu", ns->name,
				    (unsigned long long)(t->retained - rb),
				    (unsigned long long)ns->racct.blocks);
	}
	if (t->retained != s->retain.blocks || t->retained_bytes != s->retain.bytes ||
	    t->retained != s->retain.used)
		return fail(c, "retained blocks %llu, counted %llu, records %u",
			    (unsigned long long)t->retained, (unsigned long long)s->retain.blocks,
			    s->retain.used);
	if (t->blocks != s->blocks || t->blocks != s->index.count)
		return fail(c, "visible blocks %llu, counted %llu, indexed %llu",
			    (unsigned long long)t->blocks, (unsigned long long)s->blocks,
			    (unsigned long long)s->index.count);
	if (t->children != t->linked)
		return fail(c, "%llu blocks have a parent, %llu are on their parents' child lists",
			    (unsigned long long)t->linked, (unsigned long long)t->children);
	if (t->dram_blocks != s->dram_blocks)
		return fail(c, "dram blocks %llu, counted %llu", (unsigned long long)t->dram_blocks,
			    (unsigned long long)s->dram_blocks);
	if (t->dram_used + s->zombie_bytes != s->used_bytes || t->dram_payload != s->payload_bytes)
		return fail(c, "used or payload bytes wrong: visible %llu + removed %llu, used %llu",
			    (unsigned long long)t->dram_used, (unsigned long long)s->zombie_bytes,
			    (unsigned long long)s->used_bytes);
	if (s->tier && (t->nvme_blocks != s->tier->nvme_blocks ||
			t->nvme_payload != s->tier->nvme_payload_bytes))
		return fail(c, "nvme blocks %llu (counted %llu) or payload bytes wrong",
			    (unsigned long long)t->nvme_blocks,
			    (unsigned long long)s->tier->nvme_blocks);
	return 0;
}

static bool out_of_heaps(const struct store_block *b)
{
	for (int k = 0; k < STORE_LRU_KINDS; k++)
		if (store_lru_slot(b, k) != STORE_HEAP_NONE)
			return false;
	return true;
}

/* Reservations and zombies: states, pins, byte totals. */
static int check_hidden(struct checker *c)
{
	struct store *s = c->s;
	uint64_t nres = 0, nz = 0, inflight = 0, zbytes = 0, n;
	int rc;

	rc = ring_ok(c, s->reserved, STORE_RING_LINK, s->nreserved, "reservation", &n);
	if (!rc)
		rc = ring_ok(c, s->zombies, STORE_RING_LINK, s->nzombies, "removed block", &n);
	if (rc)
		return rc;
	for (uint32_t id = s->reserved; id;
	     id = store_ring_next(s, s->reserved, id, STORE_RING_LINK)) {
		struct store_block *b = store_blk(s, id);

		if (b->state != STORE_BLOCK_RESERVED || !out_of_heaps(b) || b->in_dram ||
		    b->on_nvme)
			return fail(c, "reservation in bad state");
		if (b->parent_id && store_parent(s, b)->refs == 0)
			return fail(c, "reservation's parent not pinned");
		if (!store_block_ns(s, b) || store_block_ns(s, b)->reservations == 0)
			return fail(c, "reservation's namespace wrong or not counting it");
		inflight += (uint64_t)b->pages * STORE_PAGE_BYTES;
		nres++;
		rc = b->in_dram || b->state == STORE_BLOCK_RESERVED ?
			add_extent(c, b->first_page, b->pages) : 0;
		if (rc)
			return rc;
	}
	for (uint32_t id = s->zombies; id; id = store_ring_next(s, s->zombies, id, STORE_RING_LINK)) {
		struct store_block *b = store_blk(s, id);

		if (b->state != STORE_BLOCK_REMOVED || b->refs == 0 || b->leased ||
		    !out_of_heaps(b) || b->on_nvme)
			return fail(c, "removed block in bad state");
		zbytes += b->in_dram ? store_extent_bytes(b) : 0;
		nz++;
		rc = b->in_dram || b->state == STORE_BLOCK_RESERVED ?
			add_extent(c, b->first_page, b->pages) : 0;
		if (rc)
			return rc;
	}
	if (nres != s->nreserved || inflight != s->inflight_bytes)
		return fail(c, "in-flight puts wrong: %llu bytes counted, %llu held",
			    (unsigned long long)s->inflight_bytes, (unsigned long long)inflight);
	if (nz != s->nzombies || zbytes != s->zombie_bytes)
		return fail(c, "removed-but-referenced totals wrong");
	if (s->slab.live != s->blocks + nres + nz)
		return fail(c, "%llu block headers in use, %llu visible, reserved or removed",
			    (unsigned long long)s->slab.live,
			    (unsigned long long)(s->blocks + nres + nz));
	return check_slab_states(c);
}

/* Each LRU heap holds only its members, each at its slot, ordered; the
 * CLEAN heap's pages are counted. */
static int check_heap(struct checker *c)
{
	struct store *s = c->s;
	int kinds = s->tier ? STORE_LRU_KINDS : 1;
	uint64_t clean_pages = 0;

	for (int k = 0; k < kinds; k++) {
		const struct store_heap *h = &s->lru[k];

		for (uint64_t i = 0; i < h->len; i++) {
			struct store_block *b = store_slab_ptr(&s->slab, h->v[i]);

			if (store_lru_slot(b, k) != i || !store_lru_member(s, b, (enum store_lru_kind)k))
				return fail(c, "LRU heap %d slot %llu wrong", k, (unsigned long long)i);
			if (i && store_slab_ptr(&s->slab, h->v[(i - 1) / 2])->last_use > b->last_use)
				return fail(c, "LRU heap %d out of order at %llu", k,
					    (unsigned long long)i);
			if (k == STORE_LRU_CLEAN)
				clean_pages += b->pages;
		}
	}
	if (clean_pages != s->clean_pages)
		return fail(c, "clean pages %llu, counted %llu", (unsigned long long)clean_pages,
			    (unsigned long long)s->clean_pages);
	return 0;
}

/* Expiry list ascending over live blocks; counts agree with lessees and
 * with the table of leases by block, where each lease is in its block's
 * bucket. */
static int check_leases(struct checker *c)
{
	struct store *s = c->s;
	uint64_t n = 0, by_lessee = 0, prev = 0, by_block = 0;

	for (uint64_t i = 0; i < s->lease_buckets; i++) {
		for (struct store_lease *r = s->lease_by_block[i]; r; r = r->by_block) {
			if (store_lease_bucket(s, r->block) != &s->lease_by_block[i])
				return fail(c, "lease in the wrong bucket of the table by block");
			if (++by_block > s->leases_active)
				return fail(c, "table of leases by block holds more than %llu",
					    (unsigned long long)s->leases_active);
		}
	}
	if (by_block != s->leases_active)
		return fail(c, "table of leases by block holds %llu of %llu",
			    (unsigned long long)by_block, (unsigned long long)s->leases_active);

	for (struct store_list *p = s->expiry.next; p != &s->expiry; p = p->next) {
		struct store_lease *r = store_container_of(p, struct store_lease, by_expiry);

		if (r->expiry_ms < prev)
			return fail(c, "lease expiry list out of order");
		if (r->block->state != STORE_BLOCK_VISIBLE)
			return fail(c, "lease on a block that is not visible");
		prev = r->expiry_ms;
		n++;
	}
	for (struct store_list *p = s->lessees.next; p != &s->lessees; p = p->next)
		by_lessee += list_len(&store_container_of(p, struct store_lessee, link)->leases);
	if (n != s->leases_active || by_lessee != n)
		return fail(c, "leases_active %llu, listed %llu, by lessee %llu",
			    (unsigned long long)s->leases_active, (unsigned long long)n,
			    (unsigned long long)by_lessee);
	if (list_len(&s->lease_pool) != s->lease_spare ||
	    s->lease_spare + n != s->lease_records)
		return fail(c, "lease record pool miscounted");
	return 0;
}

static int cmp_extent(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	return (x->first > y->first) - (x->first < y->first);
}

/* Allocated arena extents, in address order, are exactly the blocks'. */
static int check_arena_owners(struct checker *c)
{
	struct store *s = c->s;
	uint64_t i = 0, free_bytes, promo;
	uint32_t page = 0, n;
	bool is_free;

	qsort(c->ext, c->next_ext, sizeof(*c->ext), cmp_extent);
	while (store_arena_extent(s->arena, page, &n, &is_free) == 0) {
		if (!is_free) {
			if (i >= c->next_ext || c->ext[i].first != page || c->ext[i].pages != n)
				return fail(c, "arena extent at page %u owned by no block", page);
			i++;
		}
		page += n;
	}
	if (i != c->next_ext)
		return fail(c, "%llu blocks own no arena extent",
			    (unsigned long long)(c->next_ext - i));
	free_bytes = store_arena_free_pages(s->arena) * STORE_PAGE_BYTES;
	promo = s->tier ? s->tier->promo_bytes : 0;
	if (s->used_bytes + s->inflight_bytes + promo + free_bytes != s->capacity_bytes)
		return fail(c, "used %llu + in-flight %llu + promoting %llu + free %llu != "
			    "capacity %llu",
			    (unsigned long long)s->used_bytes, (unsigned long long)s->inflight_bytes,
			    (unsigned long long)promo, (unsigned long long)free_bytes,
			    (unsigned long long)s->capacity_bytes);
	if (s->payload_bytes > s->used_bytes || s->used_bytes > s->capacity_bytes)
		return fail(c, "capacity exceeded");
	return 0;
}

/* Every namespace is in the name table once, in its own bucket, and
 * found by its id; no more than STORE_MAX_NAMESPACES; the namespaces'
 * reservation counts add up to the reservations. */
static int check_names(struct checker *c)
{
	struct store *s = c->s;
	uint64_t chained = 0, by_id = 0, reservations = 0;

	if (s->nns > STORE_MAX_NAMESPACES || s->nns > s->ns_cap)
		return fail(c, "%u namespaces, table of %u", s->nns, s->ns_cap);
	for (uint32_t i = 0; i < STORE_NS_BUCKETS; i++) {
		for (struct store_ns *ns = s->ns_by_name[i]; ns; ns = ns->name_next) {
			if ((ns->name_hash & (STORE_NS_BUCKETS - 1)) != i)
				return fail(c, "namespace %s in the wrong name bucket", ns->name);
			if (ns->ns_id == 0 || store_ns_find_locked(s, ns->ns_id) != ns)
				return fail(c, "namespace %s has a bad id", ns->name);
			if (++chained > s->nns)
				return fail(c, "name table holds more than %u namespaces", s->nns);
		}
		for (struct store_ns *ns = s->ns_by_id[i]; ns; ns = ns->id_next) {
			if ((ns->ns_id & (STORE_NS_BUCKETS - 1)) != i)
				return fail(c, "namespace %s in the wrong id bucket", ns->name);
			if (++by_id > s->nns)
				return fail(c, "id table holds more than %u namespaces", s->nns);
		}
	}
	if (chained != s->nns || by_id != s->nns)
		return fail(c, "name table holds %llu, id table %llu of %u namespaces",
			    (unsigned long long)chained, (unsigned long long)by_id, s->nns);
	for (uint32_t i = 0; i < s->nns; i++) {
		if (store_ns_find_locked(s, s->ns[i]->ns_id) != s->ns[i])
			return fail(c, "namespace %u of the table not found by id", i);
		reservations += s->ns[i]->reservations;
	}
	if (reservations != s->nreserved)
		return fail(c, "namespaces count %llu reservations, pool %llu",
			    (unsigned long long)reservations, (unsigned long long)s->nreserved);
	return 0;
}

/* Running promotions own their arena extents. */
static int check_promotions(struct checker *c)
{
	struct store_tier *t = c->s->tier;
	uint64_t bytes = 0, n = 0;
	int rc;

	for (struct store_list *p = t->promo_running.next; p != &t->promo_running; p = p->next) {
		struct store_promo *pr = store_container_of(p, struct store_promo, link);

		if (!pr->has_pages || !pr->block->promoting ||
		    store_promo_find_locked(t, pr->block) != pr)
			return fail(c, "running promotion in bad state");
		rc = add_extent(c, pr->first_page, pr->block->pages);
		if (rc)
			return rc;
		bytes += store_extent_bytes(pr->block);
		n++;
	}
	if (bytes != t->promo_bytes || n > t->promos)
		return fail(c, "promotion bytes %llu, counted %llu", (unsigned long long)bytes,
			    (unsigned long long)t->promo_bytes);
	return 0;
}

/* Where one NVMe copy lies in its segment. */
struct place {
	uint64_t off, ext;
};

static int cmp_place(const void *a, const void *b)
{
	const struct place *x = a, *y = b;

	return (x->off > y->off) - (x->off < y->off);
}

/* One segment: its blocks point back at it, their extents sum to its live
 * bytes, lie inside its fill and do not overlap. pl has room for every
 * block on NVMe. */
static int check_segment(struct checker *c, uint32_t i, struct place *pl)
{
	const struct store *s = c->s;
	const struct store_tier *t = s->tier;
	const struct store_seg *sg = &t->segs[i];
	uint64_t live = 0, n = 0, len;
	int rc = ring_ok(c, sg->blocks, STORE_RING_SEG, c->tally.nvme_blocks, "segment", &len);

	if (rc)
		return rc;
	for (uint32_t id = sg->blocks; id; id = store_ring_next(s, sg->blocks, id, STORE_RING_SEG)) {
		const struct store_block *b = store_blk(s, id);

		if (b->state != STORE_BLOCK_VISIBLE || !b->on_nvme || b->seg != i)
			return fail(c, "segment %u lists a block that is not there", i);
		if (n >= c->tally.nvme_blocks)
			return fail(c, "segment %u lists more blocks than exist", i);
		pl[n].off = store_seg_off(b);
		pl[n].ext = store_extent_bytes(b);
		live += pl[n].ext;
		n++;
	}
	if (live != sg->live_bytes)
		return fail(c, "segment %u live bytes %llu, counted %llu", i,
			    (unsigned long long)live, (unsigned long long)sg->live_bytes);
	if (sg->state == STORE_SEG_FREE && (n || sg->readers || sg->pending_dels))
		return fail(c, "free segment %u still in use", i);
	if (sg->fill_bytes > t->segment_bytes)
		return fail(c, "segment %u filled past its end", i);
	qsort(pl, n, sizeof(*pl), cmp_place);
	for (uint64_t k = 0; k + 1 < n; k++)
		if (pl[k].off + pl[k].ext > pl[k + 1].off)
			return fail(c, "segment %u: extents overlap at %llu", i,
				    (unsigned long long)pl[k].off);
	return 0;
}

/* Every segment, the free count and the active one. */
static int check_segments(struct checker *c)
{
	const struct store_tier *t = c->s->tier;
	struct place *pl = malloc((c->tally.nvme_blocks + 1) * sizeof(*pl));
	uint64_t listed = 0;
	uint32_t nfree = 0;
	int rc = 0;

	if (!pl)
		return fail(c, "no memory to check");
	for (uint32_t i = 0; i < t->nseg && !rc; i++) {
		const struct store_seg *sg = &t->segs[i];

		nfree += sg->state == STORE_SEG_FREE;
		if ((sg->state == STORE_SEG_ACTIVE) != (t->active == i))
			rc = fail(c, "segment %u active state disagrees", i);
		if (!rc)
			rc = check_segment(c, i, pl);
		for (uint32_t id = sg->blocks; !rc && id;
		     id = store_ring_next(c->s, sg->blocks, id, STORE_RING_SEG))
			listed++;
	}
	free(pl);
	if (!rc && nfree != t->nfree)
		rc = fail(c, "free segments %u, counted %u", nfree, t->nfree);
	if (!rc && listed != c->tally.nvme_blocks)
		rc = fail(c, "segments list %llu blocks, %llu are on nvme",
			  (unsigned long long)listed, (unsigned long long)c->tally.nvme_blocks);
	return rc;
}

/* The deadline heap is ordered and each record knows its slot; each
 * tenant's retained figures are the sum of the records charged to it;
 * the pool stays within max_retained_total_bytes. */
static int check_retentions(struct checker *c)
{
	const struct store_retain_tab *t = &c->s->retain;
	struct store *s = c->s;

	for (uint32_t k = 0; k < t->used; k++) {
		const struct store_retention *r = &t->recs[t->heap[k]];
		const struct store_block *b = store_blk(s, r->block_id);

		if (r->heap_idx != k)
			return fail(c, "retention record %u at heap slot %u says %u", t->heap[k], k,
				    r->heap_idx);
		if (k && t->recs[t->heap[(k - 1) / 2]].until_ms > r->until_ms)
			return fail(c, "retention heap out of order at slot %u", k);
		if (b->state != STORE_BLOCK_VISIBLE || !b->retained)
			return fail(c, "retention record %u names a block that is not retained",
				    t->heap[k]);
	}
	for (struct store_list *l = s->tenants.next; l != &s->tenants; l = l->next) {
		const struct store_tenant *tn = store_container_of(l, struct store_tenant, link);
		uint64_t blocks = 0, bytes = 0;

		for (uint32_t k = 0; k < t->used; k++) {
			const struct store_retention *r = &t->recs[t->heap[k]];

			if (r->tenant_id != tn->id)
				continue;
			blocks++;
			bytes += store_block_length(store_blk(s, r->block_id));
		}
		if (blocks != tn->racct.blocks || bytes != tn->racct.bytes)
			return fail(c, "a tenant retains %llu blocks, its records %llu",
				    (unsigned long long)tn->racct.blocks, (unsigned long long)blocks);
	}
	if (s->cfg.max_retained_total_bytes && t->bytes > s->cfg.max_retained_total_bytes)
		return fail(c, "%llu bytes retained, past max_retained_total_bytes %llu",
			    (unsigned long long)t->bytes,
			    (unsigned long long)s->cfg.max_retained_total_bytes);
	return 0;
}

static int check_locked(struct checker *c)
{
	int rc = store_arena_check(c->s->arena, c->why, c->why_len);

	if (!rc)
		rc = check_names(c);

	if (!rc)
		rc = check_visible_all(c);
	if (!rc)
		rc = check_hidden(c);
	if (!rc)
		rc = check_heap(c);
	if (!rc)
		rc = check_leases(c);
	if (!rc)
		rc = check_retentions(c);
	if (!rc && c->s->tier)
		rc = check_promotions(c);
	if (!rc && c->s->tier)
		rc = check_segments(c);
	if (!rc)
		rc = check_arena_owners(c);
	return rc;
}

int store_check(struct store *s, char *why, size_t why_len)
{
	struct checker c = { .s = s, .why = why, .why_len = why_len };
	int rc;

	store_lock(s);
	c.ext_cap = s->blocks + s->nreserved + s->nzombies + (s->tier ? s->tier->promos : 0);
	c.ext = malloc((c.ext_cap + 1) * sizeof(*c.ext));
	if (!c.ext)
		rc = fail(&c, "no memory to check");
	else
		rc = check_locked(&c);
	pthread_mutex_unlock(&s->lock);
	free(c.ext);
	if (rc == 0 && why && why_len)
		why[0] = '\0';
	return rc;
}

int store_debug_remove_one(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES])
{
	struct store_block *b;

	store_lock(s);
	b = store_find_locked(s, ns_id, key);
	if (!b) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	/* orphan the children: they keep their parent hash but lose the link */
	while (b->first_child) {
		struct store_block *ch = store_blk(s, b->first_child);

		store_child_del(s, b, ch);
		ch->parent_id = 0;
	}
	store_block_remove_locked(s, b);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void store_debug_evict_hook(struct store *s, void (*fn)(void *arg), void *arg)
{
	store_lock(s);
	s->evict_hook = fn;
	s->evict_hook_arg = arg;
	pthread_mutex_unlock(&s->lock);
}

int store_debug_clock_set(struct store *s, uint32_t clock)
{
	int rc = 0;

	store_lock(s);
	if (clock < s->clock)
		rc = -EINVAL;
	else
		s->clock = clock;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void store_debug_clock(struct store *s, uint32_t *clock, uint32_t *epoch)
{
	store_lock(s);
	*clock = s->clock;
	*epoch = s->clock_epoch;
	pthread_mutex_unlock(&s->lock);
}

int store_debug_last_use(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			 uint32_t *last_use)
{
	struct store_block *b;

	store_lock(s);
	b = store_find_locked(s, ns_id, key);
	if (b)
		*last_use = b->last_use;
	pthread_mutex_unlock(&s->lock);
	return b ? 0 : -ENOENT;
}

int store_debug_retained_ms(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			    uint64_t *left_ms)
{
	struct store_block *b;
	uint64_t until, now = store_now_ms();

	store_lock(s);
	b = store_find_locked(s, ns_id, key);
	until = b ? store_retain_until_locked(s, b) : 0;
	pthread_mutex_unlock(&s->lock);
	if (!b)
		return -ENOENT;
	*left_ms = until > now ? until - now : 0;
	return 0;
}
