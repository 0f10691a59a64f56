/*
 * promote.c - NVMe -> DRAM for a GET of an NVMe-only block, on an I/O
 * thread.
 *
 * store_get_async (get.c, through store_promo_join_locked) queues a
 * promotion holding a ref on the block, or joins the one queued or running for it. A worker then:
 *  1. under the lock, allocates the block's pages (dropping clean copies;
 *     -EAGAIN when only dirty ones remain), and counts itself a reader of
 *     the segment, so the segment is not reused while it reads;
 *  2. without the lock, reads the extent straight into the arena and
 *     verifies the xxh3-64 taken when the block entered the pool;
 *  3. under the lock, installs the DRAM copy (clean) and pins it once per
 *     waiter - or, on a checksum mismatch or read error, counts it, and
 *     removes the block with its descendants from both tiers (their
 *     records are deleted), so wrong bytes never reach a client;
 *  4. without the lock, calls each waiter's done callback once.
 * A block removed while it was read gets -ENOENT and its pages back.
 */
#include <errno.h>
#include <stdlib.h>

#include "nvme_io.h"
#include "proto_xxh3.h"
#include "tier_impl.h"

/* Bucket of block b in the promotions-in-flight table. */
static struct store_promo **promo_bucket(const struct store_tier *t, const struct store_block *b)
{
	uint64_t h = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull;

	return (struct store_promo **)&t->promo_by_block[(h >> 40) % STORE_PROMO_BUCKETS];
}

struct store_promo *store_promo_find_locked(const struct store_tier *t,
					    const struct store_block *b)
{
	struct store_promo *p = *promo_bucket(t, b);

	while (p && p->block != b)
		p = p->hnext;
	return p;
}

void store_promo_add_locked(struct store_tier *t, struct store_promo *p)
{
	struct store_promo **head = promo_bucket(t, p->block);

	p->hnext = *head;
	*head = p;
	p->block->promoting = 1;
}

/* Promotion p has ended: out of the table, its block unmarked. */
static void promo_del_locked(struct store_tier *t, struct store_promo *p)
{
	struct store_promo **pp = promo_bucket(t, p->block);

	while (*pp != p)
		pp = &(*pp)->hnext;
	*pp = p->hnext;
	p->block->promoting = 0;
}

/* Count the outcome for each waiter and pin the block once per waiter
 * when it succeeded. Returns the waiter list (now the caller's). */
static struct store_waiter *settle_waiters_locked(struct store *s, struct store_promo *p,
						  int status)
{
	struct store_block *b = p->block;

	for (struct store_waiter *w = p->waiters; w; w = w->next) {
		struct store_ns *ns = store_ns_find_locked(s, w->ns_id);

		if (status == 0) {
			b->refs++;
			if (ns)
				ns->get_hits++;
		} else if (status == -ENOENT && ns) {
			ns->get_misses++;
		}
	}
	return p->waiters;
}

/* End promotion p with status: waiters counted, the promotion's ref
 * dropped; the callbacks run without the lock, then p is freed. */
static void finish_locked(struct store *s, struct store_promo *p, int status)
{
	struct store_tier *t = s->tier;
	struct store_block *b = p->block;
	struct store_waiter *w = settle_waiters_locked(s, p, status);

	promo_del_locked(t, p);
	store_block_unpin_locked(s, b);
	pthread_mutex_unlock(&s->lock);
	while (w) {
		struct store_waiter *next = w->next;

		if (status == 0) {
			w->out->block = b;
			w->out->data = store_arena_ptr(s->arena, b->first_page);
			w->out->length = store_block_length(b);
			w->out->checksum = store_block_checksum(b);
			w->out->tier = STORE_TIER_NVME;
		}
		w->done(w->arg, status);
		free(w);
		w = next;
	}
	free(p);
	store_lock(s);
	/* counted down only now, so store_drain returns after the callbacks */
	if (--t->promos == 0)
		pthread_cond_broadcast(&t->idle);
}

/* The DRAM copy read for b is good: b has both copies now (clean). */
static void install_locked(struct store *s, struct store_promo *p)
{
	struct store_tier *t = s->tier;
	struct store_block *b = p->block;

	b->first_page = p->first_page;
	b->in_dram = 1;
	s->used_bytes += store_extent_bytes(b);
	s->payload_bytes += store_block_length(b);
	s->dram_blocks++;
	t->promotions++;
	t->promoted_bytes += store_block_length(b);
	store_lru_sync_locked(s, b);
}

/* The NVMe copy of b is bad (err -EBADMSG: checksum, else read error):
 * count it and remove b and its descendants from both tiers. */
static void bad_copy_locked(struct store *s, struct store_block *b, int err)
{
	if (err == -EBADMSG)
		s->tier->corrupt_blocks++;
	else
		s->tier->read_errors++;
	if (b->state == STORE_BLOCK_VISIBLE)
		store_block_remove_tree_locked(s, b, NULL);
}

/* Read and verify the extent (without the lock). Returns 0, -EBADMSG or
 * the read's error. */
static int read_verify(struct store *s, uint32_t seg, uint64_t off, void *dst, uint64_t ext,
		       uint64_t length, uint64_t checksum)
{
	int rc = store_nvme_io_read(s->tier->io, seg, off, dst, ext);

	if (rc)
		return rc;
	return XXH3_64bits(dst, length) == checksum ? 0 : -EBADMSG;
}

static void log_bad(struct store *s, uint32_t seg, uint64_t off, int err)
{
	struct store_tier *t = s->tier;

	if (err == -EBADMSG)
		store_log_limited(s, &t->rl_corrupt, STORE_LOG_ERR,
				  "nvme: block at segment %u offset %llu failed its checksum; "
				  "removed with its descendants (a miss, not wrong data)",
				  seg, (unsigned long long)off);
	else
		store_log_limited(s, &t->rl_read, STORE_LOG_ERR,
				  "nvme: read of segment %u offset %llu failed (%d); "
				  "block removed with its descendants", seg,
				  (unsigned long long)off, err);
}

void store_promo_run_locked(struct store *s, struct store_promo *p)
{
	struct store_tier *t = s->tier;
	struct store_block *b = p->block;
	uint64_t ext = store_extent_bytes(b), length = store_block_length(b), off;
	uint64_t checksum = store_block_checksum(b);
	uint32_t seg;
	int err;

	if (b->state != STORE_BLOCK_VISIBLE || !b->on_nvme) {
		finish_locked(s, p, -ENOENT);
		return;
	}
	err = store_alloc_room_locked(s, b->pages, &p->first_page);
	if (err) {
		finish_locked(s, p, -EAGAIN);
		return;
	}
	p->has_pages = true;
	t->promo_bytes += ext;
	store_list_add_tail(&t->promo_running, &p->link);
	seg = b->seg;
	off = store_seg_off(b);
	t->segs[seg].readers++;
	pthread_mutex_unlock(&s->lock);

	err = read_verify(s, seg, off, store_arena_ptr(s->arena, p->first_page), ext, length,
			  checksum);
	if (err)
		log_bad(s, seg, off, err);

	store_lock(s);
	t->segs[seg].readers--;
	store_tier_seg_settle_locked(s, seg);
	store_list_del(&p->link);
	t->promo_bytes -= ext;
	p->has_pages = false;
	if (err != -EIO)
		t->bytes_read += ext;
	if (err == 0 && b->state == STORE_BLOCK_VISIBLE) {
		install_locked(s, p);
		finish_locked(s, p, 0);
		return;
	}
	(void)store_arena_free(s->arena, p->first_page);
	if (err)
		bad_copy_locked(s, b, err);
	finish_locked(s, p, -ENOENT);
}

/* ---- GET of an NVMe-only block (nvme/tier.h) ---- */

int store_promo_join_locked(struct store *s, struct store_block *b, uint32_t ns_id,
			     struct store_ref *out, store_get_done_fn done, void *arg)
{
	struct store_waiter *w = malloc(sizeof(*w));
	struct store_promo *p = b->promoting ? store_promo_find_locked(s->tier, b) : NULL;

	if (!w)
		return -ENOMEM;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p) {
			free(w);
			return -ENOMEM;
		}
		p->block = b;
		store_promo_add_locked(s->tier, p);
		b->refs++;
		store_lru_sync_locked(s, b);
		store_list_add_tail(&s->tier->promo_queue, &p->link);
		s->tier->promos++;
		store_tier_kick_locked(s);
	}
	w->done = done;
	w->arg = arg;
	w->out = out;
	w->ns_id = ns_id;
	w->next = p->waiters;
	p->waiters = w;
	return 0;
}

bool store_tier_can_promote_locked(const struct store *s)
{
	return s->tier && !s->tier->draining && !s->tier->stop;
}
