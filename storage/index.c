/*
 * index.c - chained hash table keyed by (namespace id, block hash).
 */
#include "index.h"

#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

/* Bucket of (ns_id, key). Keys come from clients: honest ones send
 * SHA-256 outputs, but a hostile one can send keys that agree in any
 * bytes it likes, so the whole key is hashed with a seed drawn at start-up
 * (xxh3-64), and no chosen key set lands in one bucket. */
static uint64_t bucket_of(const struct store_index *ix, const struct store_index_table *t,
			  uint32_t ns_id, const uint8_t key[STORE_INDEX_KEY_BYTES])
{
	uint64_t seed = ix->seed ^ ((uint64_t)ns_id * 0x9e3779b97f4a7c15ull);

	return XXH3_64bits_withSeed(key, STORE_INDEX_KEY_BYTES, seed) & t->mask;
}

/* A seed nobody outside the process can guess: getrandom, or the clock and
 * an address when the kernel has no entropy call. */
static uint64_t random_seed(void)
{
	uint64_t seed;
	struct timespec ts;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
		return seed;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&seed;
}

static uint64_t round_pow2(uint64_t n)
{
	uint64_t p = 16;

	while (p < n && p < (1ull << 62))
		p <<= 1;
	return p;
}

/* A zeroed table of n (a power of two) buckets, or NULL. */
static struct store_index_table *table_new(uint64_t n)
{
	struct store_index_table *t;

	if (n > (SIZE_MAX - sizeof(*t)) / sizeof(t->buckets[0]))
		return NULL;
	t = calloc(1, sizeof(*t) + n * sizeof(t->buckets[0]));
	if (t)
		t->mask = n - 1;
	return t;
}

int store_index_init(struct store_index *ix, uint64_t nbuckets,
		     const struct store_index_ops *ops, void *arg)
{
	struct store_index_table *t = table_new(round_pow2(nbuckets));

	if (!t)
		return -ENOMEM;
	ix->table = t;
	ix->count = 0;
	ix->seq = 0;
	ix->seed = random_seed();
	ix->ops = ops;
	ix->arg = arg;
	return 0;
}

static struct store_index_node *node_of(const struct store_index *ix, uint32_t id)
{
	return ix->ops->node(ix->arg, id);
}

void store_index_destroy(struct store_index *ix)
{
	free(ix->table);
	ix->table = NULL;
	ix->count = 0;
}

struct store_index_node *store_index_find(const struct store_index *ix, uint32_t ns_id,
					  const uint8_t key[STORE_INDEX_KEY_BYTES])
{
	uint32_t id = ix->table->buckets[bucket_of(ix, ix->table, ns_id, key)];

	while (id) {
		struct store_index_node *n = node_of(ix, id);

		if (n->ns_id == ns_id && memcmp(n->key, key, STORE_INDEX_KEY_BYTES) == 0)
			return n;
		id = n->next;
	}
	return NULL;
}

/* Steps of a racy walk between two looks at seq: honest chains are about
 * one node long (load factor <= 1, seeded hash), so a walk this long is
 * almost surely one that a concurrent change sent astray. */
#define RACY_STEPS 64u

int store_index_find_racy(const struct store_index *ix, int64_t seq, uint32_t ns_id,
			  const uint8_t key[STORE_INDEX_KEY_BYTES], uint32_t *id_out)
{
	const struct store_index_table *t = __atomic_load_n(&ix->table, __ATOMIC_ACQUIRE);
	uint32_t id = __atomic_load_n(&t->buckets[bucket_of(ix, t, ns_id, key)], __ATOMIC_RELAXED);
	uint32_t steps = 0;

	while (id) {
		struct store_index_node *n = ix->ops->node_racy(ix->arg, id);

		if (!n)
			return -EAGAIN;
		if (__atomic_load_n(&n->ns_id, __ATOMIC_RELAXED) == ns_id &&
		    memcmp(n->key, key, STORE_INDEX_KEY_BYTES) == 0)
			break;
		id = __atomic_load_n(&n->next, __ATOMIC_RELAXED);
		if (++steps % RACY_STEPS == 0 &&
		    __atomic_load_n(&ix->seq, __ATOMIC_ACQUIRE) != (uint64_t)seq)
			return -EAGAIN;
	}
	*id_out = id;
	return 0;
}

/* Tell the CPU this is a spin-wait loop. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

int64_t store_index_read_begin(const struct store_index *ix, uint32_t spins)
{
	for (uint32_t i = 0;; i++) {
		uint64_t seq = __atomic_load_n(&ix->seq, __ATOMIC_ACQUIRE);

		if (!(seq & 1))
			return (int64_t)(seq & INT64_MAX);
		if (i == spins)
			return -EBUSY;
		cpu_relax();
	}
}

/* Link node n (id) at the head of its chain in t. Chain links are
 * written with relaxed atomic stores: racy readers load them. */
static void link_node(const struct store_index *ix, struct store_index_table *t,
		      struct store_index_node *n, uint32_t id)
{
	uint32_t *head = &t->buckets[bucket_of(ix, t, n->ns_id, n->key)];

	__atomic_store_n(&n->next, *head, __ATOMIC_RELAXED);
	__atomic_store_n(head, id, __ATOMIC_RELAXED);
}

void store_index_insert(struct store_index *ix, struct store_index_node *n)
{
	assert(store_index_writing(ix));
	link_node(ix, ix->table, n, ix->ops->id(ix->arg, n));
	ix->count++;
}

int store_index_remove(struct store_index *ix, struct store_index_node *n)
{
	uint32_t *pp = &ix->table->buckets[bucket_of(ix, ix->table, n->ns_id, n->key)];
	uint32_t id = ix->ops->id(ix->arg, n);

	assert(store_index_writing(ix));
	while (*pp && *pp != id)
		pp = &node_of(ix, *pp)->next;
	if (!*pp)
		return -ENOENT;
	__atomic_store_n(pp, n->next, __ATOMIC_RELAXED);
	n->next = 0;
	ix->count--;
	return 0;
}

int store_index_reserve(struct store_index *ix, uint64_t count)
{
	struct store_index_table *old = ix->table, *t;

	if (count <= store_index_buckets(ix))
		return 0;
	assert(store_index_writing(ix));
	t = table_new(round_pow2(count));
	if (!t)
		return -ENOMEM;
	for (uint64_t i = 0; i <= old->mask; i++) {
		uint32_t id = old->buckets[i];

		while (id) {
			struct store_index_node *node = node_of(ix, id);

			id = node->next;
			link_node(ix, t, node, ix->ops->id(ix->arg, node));
		}
	}
	__atomic_store_n(&ix->table, t, __ATOMIC_RELEASE);
	ix->ops->quiesce(ix->arg);
	free(old);
	return 0;
}

uint64_t store_index_bytes(const struct store_index *ix)
{
	return sizeof(*ix->table) + store_index_buckets(ix) * sizeof(ix->table->buckets[0]);
}
