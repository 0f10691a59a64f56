/*
 * event.c - the event hook (store_set_event_hook): what the pool tells a
 * KV-event publisher. The hook is called under the store lock, so events
 * arrive one at a time in the order the pool changed; the publisher
 * (server/srv_events.c) queues them without waiting.
 */
#include "core.h"

static void emit_block(struct store *s, const struct store_block *b, enum store_event_kind kind,
		       uint8_t announce)
{
	const struct store_ns *ns = store_ns_find_locked(s, b->node.ns_id);
	const struct store_block *p = store_blk(s, b->parent_id);
	struct store_event ev = {
		.kind = kind,
		.ns_id = b->node.ns_id,
		.ns_name = ns ? ns->name : "",
		.ns_name_len = ns ? ns->name_len : 0,
		.key = b->node.key,
		.parent = p ? p->node.key : NULL,
		.length = store_block_length(b),
		.tier = b->in_dram ? STORE_TIER_DRAM : STORE_TIER_NVME,
		.announce = announce,
	};

	s->event_fn(s->event_arg, &ev);
}

void store_event_block_locked(struct store *s, const struct store_block *b,
			      enum store_event_kind kind)
{
	if (!s->event_fn || (kind == STORE_EVENT_REMOVED && s->events_quiet))
		return;
	emit_block(s, b, kind, 0);
}

void store_event_cleared_locked(struct store *s, const struct store_ns *ns)
{
	struct store_event ev = {
		.kind = STORE_EVENT_CLEARED,
		.ns_id = ns->ns_id,
		.ns_name = ns->name,
		.ns_name_len = ns->name_len,
	};

	if (s->event_fn)
		s->event_fn(s->event_arg, &ev);
}

/* Announce root and its visible descendants, parents first (pre-order,
 * without recursion: chains can be thousands deep). */
static void announce_tree(struct store *s, struct store_block *root)
{
	struct store_block *cur = root;

	emit_block(s, cur, STORE_EVENT_STORED, 1);
	for (;;) {
		if (cur->first_child) {
			cur = store_blk(s, cur->first_child);
			emit_block(s, cur, STORE_EVENT_STORED, 1);
			continue;
		}
		for (;;) {
			struct store_block *p;
			uint32_t next;

			if (cur == root)
				return;
			p = store_parent(s, cur);
			next = store_ring_next(s, p->first_child, store_slab_id(cur),
					       STORE_RING_SIBLING);
			if (next) {
				cur = store_blk(s, next);
				emit_block(s, cur, STORE_EVENT_STORED, 1);
				break;
			}
			cur = p;
		}
	}
}

void store_set_event_hook(struct store *s, store_event_fn fn, void *arg)
{
	store_lock(s);
	s->event_fn = fn;
	s->event_arg = arg;
	for (uint32_t i = 0; fn && i < s->nns; i++) {
		struct store_ns *ns = s->ns[i];
		uint32_t id = ns->blocks;

		while (id) {
			struct store_block *b = store_blk(s, id);

			if (!b->parent_id)
				announce_tree(s, b);
			id = store_ring_next(s, ns->blocks, id, STORE_RING_LINK);
		}
	}
	pthread_mutex_unlock(&s->lock);
}
