/*
 * index.c - chained hash table keyed by (namespace id, block hash).
 */
#include "index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

/* Bucket of (ns_id, key). Keys come from clients: honest ones send
 * SHA-256 outputs, but a hostile one can send keys that agree in any
 * bytes it likes, so the whole key is hashed with a seed drawn at start-up
 * (xxh3-64), and no chosen key set lands in one bucket. */
static uint64_t bucket_of(const struct store_index *ix, uint32_t ns_id,
			  const uint8_t key[STORE_INDEX_KEY_BYTES])
{
	uint64_t seed = ix->seed ^ ((uint64_t)ns_id * 0x9e3779b97f4a7c15ull);

	return XXH3_64bits_withSeed(key, STORE_INDEX_KEY_BYTES, seed) & (ix->nbuckets - 1);
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

int store_index_init(struct store_index *ix, uint64_t nbuckets,
		     const struct store_index_ops *ops, void *arg)
{
	uint64_t n = round_pow2(nbuckets);

	ix->buckets = calloc(n, sizeof(*ix->buckets));
	if (!ix->buckets)
		return -ENOMEM;
	ix->nbuckets = n;
	ix->count = 0;
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
	free(ix->buckets);
	ix->buckets = NULL;
	ix->nbuckets = 0;
	ix->count = 0;
}

struct store_index_node *store_index_find(const struct store_index *ix, uint32_t ns_id,
					  const uint8_t key[STORE_INDEX_KEY_BYTES])
{
	uint32_t id = ix->buckets[bucket_of(ix, ns_id, key)];

	while (id) {
		struct store_index_node *n = node_of(ix, id);

		if (n->ns_id == ns_id && memcmp(n->key, key, STORE_INDEX_KEY_BYTES) == 0)
			return n;
		id = n->next;
	}
	return NULL;
}

void store_index_insert(struct store_index *ix, struct store_index_node *n)
{
	uint32_t *head = &ix->buckets[bucket_of(ix, n->ns_id, n->key)];

	n->next = *head;
	*head = ix->ops->id(ix->arg, n);
	ix->count++;
}

int store_index_remove(struct store_index *ix, struct store_index_node *n)
{
	uint32_t *pp = &ix->buckets[bucket_of(ix, n->ns_id, n->key)];
	uint32_t id = ix->ops->id(ix->arg, n);

	while (*pp && *pp != id)
		pp = &node_of(ix, *pp)->next;
	if (!*pp)
		return -ENOENT;
	*pp = n->next;
	n->next = 0;
	ix->count--;
	return 0;
}

int store_index_reserve(struct store_index *ix, uint64_t count)
{
	struct store_index old = *ix;
	uint64_t n;

	if (count <= ix->nbuckets)
		return 0;
	n = round_pow2(count);
	ix->buckets = calloc(n, sizeof(*ix->buckets));
	if (!ix->buckets) {
		*ix = old;
		return -ENOMEM;
	}
	ix->nbuckets = n;
	ix->count = 0;
	for (uint64_t i = 0; i < old.nbuckets; i++) {
		uint32_t id = old.buckets[i];

		while (id) {
			struct store_index_node *node = node_of(ix, id);

			id = node->next;
			store_index_insert(ix, node);
		}
	}
	free(old.buckets);
	return 0;
}

uint64_t store_index_bytes(const struct store_index *ix)
{
	return ix->nbuckets * sizeof(*ix->buckets);
}
