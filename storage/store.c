/*
 * store.c - opening and closing the pool, namespaces, statistics.
 *
 * The other rooms of storage/ are listed in storage/README.md; core.h
 * describes the structures and the lock rule.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core.h"
#include "nvme/tier.h"

#define INITIAL_BUCKETS 1024u
/* Index buckets at open: one per 64 KiB of arena (16 pages), so pools of
 * typical block sizes never rehash under the lock while filling. */
#define PAGES_PER_BUCKET 16u

uint64_t store_pages_of(uint64_t length)
{
	return length / STORE_PAGE_BYTES + (length % STORE_PAGE_BYTES != 0);
}

struct store_ns *store_ns_find_locked(struct store *s, uint32_t ns_id)
{
	struct store_ns *ns = s->ns_by_id[ns_id & (STORE_NS_BUCKETS - 1)];

	while (ns && ns->ns_id != ns_id)
		ns = ns->id_next;
	return ns;
}

struct store_block *store_find_locked(struct store *s, uint32_t ns_id,
				      const uint8_t key[STORE_KEY_BYTES])
{
	struct store_index_node *n = store_index_find(&s->index, ns_id, key);

	return n ? store_container_of(n, struct store_block, node) : NULL;
}

/* The index names blocks by their header ids (32 bits, not 64). */
static struct store_index_node *index_node(void *arg, uint32_t id)
{
	return &store_slab_ptr(&((struct store *)arg)->slab, id)->node;
}

static uint32_t index_id(void *arg, const struct store_index_node *n)
{
	(void)arg;
	return store_slab_id(store_container_of(n, struct store_block, node));
}

static struct store_index_node *index_node_racy(void *arg, uint32_t id)
{
	struct store_block *b = store_slab_ptr_racy(&((struct store *)arg)->slab, id);

	return b ? &b->node : NULL;
}

static void index_quiesce(void *arg)
{
	store_quiesce(arg);
}

static const struct store_index_ops index_ops = {
	.node = index_node,
	.id = index_id,
	.node_racy = index_node_racy,
	.quiesce = index_quiesce,
};

/* Pools opened in this process so far: a pool's serial names it for the
 * thread-local MATCH log cache (match.c), where an address could repeat. */
static uint64_t pools_opened;

/* Validate the configuration; the arena gets whole pages only. */
static int check_config(const struct store_config *cfg, uint64_t *pages)
{
	uint64_t n = cfg->dram_capacity_bytes / STORE_PAGE_BYTES;

	if (n == 0 || n > STORE_ARENA_MAX_PAGES || cfg->max_block_bytes == 0)
		return -EINVAL;
	*pages = n;
	return 0;
}

/* Empty lists and counters of a new pool. */
static void init_lists(struct store *s)
{
	store_list_init(&s->lessees);
	store_list_init(&s->tenants);
	store_list_init(&s->expiry);
	store_list_init(&s->lease_pool);
}

/* Free every namespace and block header (store_close, failed open);
 * pages go with the arena. */
static void free_all_blocks(struct store *s)
{
	for (uint32_t i = 0; i < s->nns; i++)
		free(s->ns[i]);
	s->reserved = 0;
	s->zombies = 0;
	store_slab_destroy(&s->slab);
	free(s->ns);
	s->ns = NULL;
	s->nns = 0;
}

int store_open(const struct store_config *cfg, struct store **out, char *why, size_t why_len)
{
	struct store *s;
	uint64_t pages;
	int rc;

	rc = check_config(cfg, &pages);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->next_ns_id = 1;
	s->capacity_bytes = pages * STORE_PAGE_BYTES;
	init_lists(s);
	rc = store_arena_open(pages, &s->arena);
	if (rc)
		goto out_free;
	rc = store_index_init(&s->index, pages / PAGES_PER_BUCKET > INITIAL_BUCKETS ?
					 pages / PAGES_PER_BUCKET : INITIAL_BUCKETS,
			      &index_ops, s);
	if (rc)
		goto out_close_arena;
	rc = store_slab_init(&s->slab);
	if (rc)
		goto out_destroy_index;
	s->slab.quiesce = index_quiesce;
	s->slab.quiesce_arg = s;
	s->serial = __atomic_add_fetch(&pools_opened, 1, __ATOMIC_RELAXED);
	rc = store_lru_reserve_locked(s, INITIAL_BUCKETS);
	if (rc)
		goto out_free_heap;
	/* the lease table exists from the start, so a lease MATCH logged
	 * (match.c) can always be granted: growing it later is optional */
	rc = store_lease_reserve_locked(s, 0);
	if (rc)
		goto out_free_heap;
	rc = -pthread_mutex_init(&s->lock, NULL);
	if (rc)
		goto out_free_heap;
	if (cfg->nvme_dir && cfg->nvme_dir[0]) {
		rc = store_tier_open(s, why, why_len);
		if (rc)
			goto out_free_blocks;
	}
	*out = s;
	return 0;

out_free_blocks:
	free_all_blocks(s); /* the slab too */
	pthread_mutex_destroy(&s->lock);
out_free_heap:
	free(s->lease_by_block);
	for (int k = 0; k < STORE_LRU_KINDS; k++)
		free(s->lru[k].v);
	store_slab_destroy(&s->slab);
out_destroy_index:
	store_index_destroy(&s->index);
out_close_arena:
	store_arena_close(s->arena);
out_free:
	free(s);
	return rc;
}

void store_drain(struct store *s)
{
	if (s->tier)
		store_tier_drain(s);
}

uint64_t store_prefault(struct store *s, uint64_t offset, uint64_t bytes)
{
	return store_arena_prefault(s->arena, offset, bytes);
}

void store_arena_region(const struct store *s, void **base, uint64_t *bytes)
{
	*base = store_arena_ptr(s->arena, 0);
	*bytes = (uint64_t)store_arena_pages(s->arena) * STORE_PAGE_BYTES;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (s->tier)
		store_tier_close(s);
	store_lock(s);
	store_lease_free_all_locked(s);
	pthread_mutex_unlock(&s->lock);
	while (!store_list_empty(&s->tenants)) {
		struct store_tenant *t = store_container_of(s->tenants.next, struct store_tenant, link);

		store_list_del(&t->link);
		free(t);
	}
	free(s->tenant_by_id);
	store_match_free_logs(s);
	store_retain_free(s);
	free_all_blocks(s);
	for (int k = 0; k < STORE_LRU_KINDS; k++)
		free(s->lru[k].v);
	store_index_destroy(&s->index);
	store_arena_close(s->arena);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* ---- namespaces ----
 * Names are found through a chained hash table of STORE_NS_BUCKETS
 * buckets (xxh3-64 of the name, taken before the lock): with at most
 * STORE_MAX_NAMESPACES names a lookup under the lock compares about four
 * hashes and one name, instead of up to 4096 names. */

static uint64_t name_hash(const char *name, size_t len)
{
	return XXH3_64bits(name, len);
}

static struct store_ns **name_bucket(struct store *s, uint64_t hash)
{
	return &s->ns_by_name[hash & (STORE_NS_BUCKETS - 1)];
}

static struct store_ns *ns_by_name_locked(struct store *s, uint64_t hash, const char *name,
					  size_t len)
{
	for (struct store_ns *ns = *name_bucket(s, hash); ns; ns = ns->name_next)
		if (ns->name_hash == hash && ns->name_len == len && memcmp(ns->name, name, len) == 0)
			return ns;
	return NULL;
}

/* A fresh id: 1, 2, ... and, after 2^32 - 1 of them, the smallest
 * following id no live namespace holds (0 is never an id). A reclaimed
 * namespace had no users, blocks or reservations, so its old id is
 * referred to by nothing. */
static uint32_t ns_next_id_locked(struct store *s)
{
	uint32_t id;

	do {
		id = s->next_ns_id++;
	} while (id == 0 || store_ns_find_locked(s, id));
	return id;
}

/* Unlink `ns` from the chain starting at *head, where `next` is the offset
 * of its chain pointer. */
static void ns_unchain(struct store_ns **head, struct store_ns *ns, size_t next)
{
	struct store_ns **pp = head;

	while (*pp != ns)
		pp = (struct store_ns **)(void *)((char *)*pp + next);
	*pp = *(struct store_ns **)(void *)((char *)ns + next);
}

static int ns_unused(const struct store_ns *ns)
{
	return ns->users == 0 && ns->nblocks == 0 && ns->reservations == 0;
}

static void ns_forget_locked(struct store *s, uint32_t i);

/* Free one namespace with no users, no visible blocks and no reservations
 * (the oldest such), keeping the creation order of the others.
 * Errors: -EDQUOT (none qualifies). */
static int ns_reclaim_locked(struct store *s)
{
	uint32_t i;

	for (i = 0; i < s->nns; i++)
		if (ns_unused(s->ns[i]))
			break;
	if (i == s->nns)
		return -EDQUOT;
	ns_forget_locked(s, i);
	return 0;
}

/* Forget namespace s->ns[i] (unused): name, id and counters. */
static void ns_forget_locked(struct store *s, uint32_t i)
{
	struct store_ns *ns = s->ns[i];

	store_wr_begin(s);
	ns_unchain(name_bucket(s, ns->name_hash), ns, offsetof(struct store_ns, name_next));
	ns_unchain(&s->ns_by_id[ns->ns_id & (STORE_NS_BUCKETS - 1)], ns,
		   offsetof(struct store_ns, id_next));
	store_wr_end(s);
	if (ns->tenant)
		ns->tenant->namespaces--;
	memmove(&s->ns[i], &s->ns[i + 1], (s->nns - i - 1) * sizeof(*s->ns));
	s->nns--;
	store_quiesce(s); /* a lock-free MATCH may be reading it (match.c) */
	free(ns);
}

int store_namespace_forget(struct store *s, uint32_t ns_id)
{
	int rc = -ENOENT;

	store_lock(s);
	for (uint32_t i = 0; i < s->nns; i++) {
		if (s->ns[i]->ns_id != ns_id)
			continue;
		rc = -EBUSY;
		if (ns_unused(s->ns[i])) {
			ns_forget_locked(s, i);
			rc = 0;
		}
		break;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Append namespace `ns` (already filled) to the table and both hashes,
 * reclaiming an unused empty namespace at the cap. Errors: -EDQUOT (table
 * full of namespaces in use), -ENOMEM. */
static int ns_append_locked(struct store *s, struct store_ns *ns)
{
	struct store_ns **bucket = name_bucket(s, ns->name_hash);
	struct store_ns **by_id;
	int rc;

	if (s->nns >= STORE_MAX_NAMESPACES) {
		rc = ns_reclaim_locked(s);
		if (rc)
			return rc;
	}
	if (s->nns == s->ns_cap) {
		uint32_t cap = s->ns_cap ? s->ns_cap * 2 : 8;
		struct store_ns **t = realloc(s->ns, cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		s->ns = t;
		s->ns_cap = cap;
	}
	s->ns[s->nns++] = ns;
	ns->ns_id = ns_next_id_locked(s);
	ns->name_next = *bucket;
	*bucket = ns;
	by_id = &s->ns_by_id[ns->ns_id & (STORE_NS_BUCKETS - 1)];
	ns->id_next = *by_id;
	store_wr_begin(s); /* lock-free MATCH reads ns_by_id (match.c) */
	__atomic_store_n(by_id, ns, __ATOMIC_RELEASE);
	store_wr_end(s);
	return 0;
}

/* Look a name up under the lock; *ns_id written when found. */
static int ns_lookup(struct store *s, uint64_t hash, const char *name, size_t len,
		     uint32_t *ns_id)
{
	struct store_ns *ns;

	store_lock(s);
	ns = ns_by_name_locked(s, hash, name, len);
	if (ns)
		*ns_id = ns->ns_id;
	pthread_mutex_unlock(&s->lock);
	return ns ? 0 : -ENOENT;
}

int store_namespace_find(struct store *s, const char *name, size_t name_len, uint32_t *ns_id)
{
	if (name_len == 0 || name_len > STORE_NAME_MAX_BYTES)
		return -EINVAL;
	return ns_lookup(s, name_hash(name, name_len), name, name_len, ns_id);
}

/* A new namespace header for name (not in any table yet), or NULL. */
static struct store_ns *ns_new(const char *name, size_t len, uint64_t hash)
{
	struct store_ns *ns = calloc(1, sizeof(*ns));

	if (!ns)
		return NULL;
	memcpy(ns->name, name, len);
	ns->name_len = (uint32_t)len;
	ns->name_hash = hash;
	return ns;
}

int store_ns_get_locked(struct store *s, const char *name, size_t len, struct store_ns **out)
{
	uint64_t hash = name_hash(name, len);
	struct store_ns *ns = ns_by_name_locked(s, hash, name, len);
	int rc;

	if (!ns) {
		ns = ns_new(name, len, hash);
		if (!ns)
			return -ENOMEM;
		rc = ns_append_locked(s, ns);
		if (rc) {
			free(ns);
			return rc;
		}
	}
	*out = ns;
	return 0;
}

/* Take a user reference on an existing name; *ns_id written when found.
 * Errors: -ENOENT. */
static int ns_ref(struct store *s, uint64_t hash, const char *name, size_t len,
		  uint32_t *ns_id)
{
	struct store_ns *ns;

	store_lock(s);
	ns = ns_by_name_locked(s, hash, name, len);
	if (ns) {
		ns->users++;
		*ns_id = ns->ns_id;
	}
	pthread_mutex_unlock(&s->lock);
	return ns ? 0 : -ENOENT;
}

/* Existing names are found without allocating; a new one is allocated
 * outside the lock and the name looked up again under it, since another
 * thread may have created it meanwhile. */
int store_namespace_id(struct store *s, const char *name, size_t name_len, uint32_t *ns_id)
{
	struct store_ns *ns, *fresh;
	uint64_t hash;
	int rc = 0;

	if (name_len == 0 || name_len > STORE_NAME_MAX_BYTES)
		return -EINVAL;
	hash = name_hash(name, name_len);
	if (ns_ref(s, hash, name, name_len, ns_id) == 0)
		return 0;
	fresh = ns_new(name, name_len, hash);
	if (!fresh)
		return -ENOMEM;

	store_lock(s);
	ns = ns_by_name_locked(s, hash, name, name_len);
	if (!ns) {
		rc = ns_append_locked(s, fresh);
		ns = rc ? NULL : fresh;
		fresh = rc ? fresh : NULL;
	}
	if (ns) {
		ns->users++;
		*ns_id = ns->ns_id;
	}
	pthread_mutex_unlock(&s->lock);
	free(fresh);
	return rc;
}

void store_namespace_release(struct store *s, uint32_t ns_id)
{
	struct store_ns *ns;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	if (ns && ns->users)
		ns->users--;
	pthread_mutex_unlock(&s->lock);
}

int store_namespace_quota(struct store *s, uint32_t ns_id, uint64_t quota_bytes)
{
	struct store_ns *ns;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	if (ns)
		ns->quota_bytes = quota_bytes;
	pthread_mutex_unlock(&s->lock);
	return ns ? 0 : -ENOENT;
}

int store_namespace_tenant(struct store *s, uint32_t ns_id, struct store_tenant *t)
{
	struct store_ns *ns;
	int rc = 0;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	if (!ns)
		rc = -EINVAL;
	else if (!ns->tenant && t) {
		ns->tenant = t;
		t->namespaces++;
		/* blocks charged to nobody (rebuilt from records that name no
		 * writer) stay so: billing them to whoever binds the namespace
		 * first would charge a tenant for bytes it never wrote */
		store_retain_ns_to_tenant_locked(s, ns);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int store_drop_namespace(struct store *s, uint32_t ns_id, uint64_t *blocks, uint64_t *bytes)
{
	struct store_ns *ns;
	uint64_t nblocks = 0, nbytes = 0;
	uint32_t disk_id;
	int rc = 0;

	store_lock(s);
	ns = store_ns_find_locked(s, ns_id);
	if (!ns) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	/* remove whole trees from their roots: each tree is walked once;
	 * the event hook hears one CLEARED instead of a REMOVED per block */
	s->events_quiet = true;
	while (ns->blocks) {
		struct store_block *b = store_blk(s, ns->blocks);

		while (b->parent_id)
			b = store_parent(s, b);
		nblocks += store_block_remove_tree_locked(s, b, &nbytes);
	}
	s->events_quiet = false;
	store_event_cleared_locked(s, ns);
	/* the namespace's next demotion gets a fresh disk id, so records of
	 * the old one written by a demotion in flight are never read again */
	disk_id = ns->disk_id;
	ns->disk_id = 0;
	ns->disk_named = false;
	pthread_mutex_unlock(&s->lock);
	if (disk_id && s->tier)
		rc = store_tier_ns_drop(s, disk_id);
	if (blocks)
		*blocks = nblocks;
	if (bytes)
		*bytes = nbytes;
	return rc;
}

/* ---- statistics ---- */

/* Memory held outside the arena: index, headers, heap, leases, tables. */
static uint64_t index_bytes_locked(const struct store *s)
{
	return sizeof(*s) + s->nmlogs * sizeof(struct store_mlog) + store_index_bytes(&s->index) + store_slab_bytes(&s->slab) +
	       (s->lru[0].cap + s->lru[1].cap + s->lru[2].cap) * sizeof(*s->lru[0].v) +
	       s->lease_records * sizeof(struct store_lease) +
	       s->lease_buckets * sizeof(*s->lease_by_block) +
	       s->nlessees * sizeof(struct store_lessee) + store_retain_mem_bytes(s) +
	       s->ns_cap * sizeof(*s->ns) + s->nns * sizeof(struct store_ns) +
	       store_arena_meta_bytes(s->arena);
}

void store_stats(struct store *s, struct store_stats *out)
{
	struct store_stats st = { 0 };

	uint64_t now = store_now_ms();

	store_lock(s);
	store_lease_expire_locked(s, now);
	store_retain_expire_locked(s, now);
	st.capacity_bytes = s->capacity_bytes;
	st.used_bytes = s->used_bytes;
	st.pinned_removed_bytes = s->zombie_bytes;
	st.payload_bytes = s->payload_bytes;
	st.inflight_put_bytes = s->inflight_bytes;
	st.free_bytes = store_arena_free_pages(s->arena) * STORE_PAGE_BYTES;
	st.largest_free_bytes = (uint64_t)store_arena_largest_free(s->arena) * STORE_PAGE_BYTES;
	st.index_bytes = index_bytes_locked(s);
	st.blocks = s->blocks;
	st.evictions = s->evictions;
	st.evict_passes = s->evict_passes;
	st.evict_pass_max_us = s->evict_pass_max_us;
	st.leases_active = s->leases_active;
	st.checksum_errors = s->checksum_errors;
	st.namespaces = s->nns;
	st.dram_blocks = s->dram_blocks;
	st.retained_blocks = s->retain.blocks;
	st.retained_bytes = s->retain.bytes;
	st.retain_refused = s->retain.refused;
	st.retain_expired = s->retain.expired;
	if (s->tier)
		store_tier_stats_locked(s, &st);
	pthread_mutex_unlock(&s->lock);
	if (st.free_bytes)
		st.fragmentation = 1.0 - (double)st.largest_free_bytes / (double)st.free_bytes;
	*out = st;
}

int store_ns_stats(struct store *s, uint32_t index, struct store_ns_stats *out)
{
	struct store_ns *ns;
	uint64_t budget;

	store_lock(s);
	store_retain_expire_locked(s, store_now_ms());
	if (index >= s->nns) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	ns = s->ns[index];
	memset(out, 0, sizeof(*out));
	memcpy(out->name, ns->name, ns->name_len);
	out->ns_id = ns->ns_id;
	out->blocks = ns->nblocks;
	out->bytes = ns->bytes;
	out->puts = ns->puts;
	out->put_exists = ns->put_exists;
	out->put_errors = ns->put_errors;
	out->get_hits = ns->get_hits;
	out->get_misses = ns->get_misses;
	out->exists_hits = ns->exists_hits;
	out->exists_misses = ns->exists_misses;
	out->match_requests = ns->match_requests;
	out->match_blocks_queried = ns->match_blocks_queried;
	out->match_blocks_matched = ns->match_blocks_matched;
	out->evictions = ns->evictions;
	out->deletes = ns->deletes;
	out->nvme_blocks = ns->nvme_blocks;
	(void)store_retain_holder_locked(s, ns, &budget);
	out->retained_blocks = ns->racct.blocks;
	out->retained_bytes = ns->racct.bytes;
	out->retain_budget_bytes = budget;
	out->retain_refused = ns->racct.refused;
	out->retain_expired = ns->racct.expired;
	out->retain_tenant = ns->tenant != NULL;
	pthread_mutex_unlock(&s->lock);
	return 0;
}
