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

int store_index_init(struct store_index *ix, uint64_t nbuckets)
{
	uint64_t n = round_pow2(nbuckets);

	ix->buckets = calloc(n, sizeof(*ix->buckets));
	if (!ix->buckets)
		return -ENOMEM;
	ix->nbuckets = n;
	ix->count = 0;
	ix->seed = random_seed();
	return 0;
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
	struct store_index_node *n = ix->buckets[bucket_of(ix, ns_id, key)];

	for (; n; n = n->next)
		if (n->ns_id == ns_id && memcmp(n->key, key, STORE_INDEX_KEY_BYTES) == 0)
			return n;
	return NULL;
}

void store_index_insert(struct store_index *ix, struct store_index_node *n)
{
	struct store_index_node **head = &ix->buckets[bucket_of(ix, n->ns_id, n->key)];

	n->next = *head;
	*head = n;
	ix->count++;
}

int store_index_remove(struct store_index *ix, struct store_index_node *n)
{
	struct store_index_node **head = &ix->buckets[bucket_of(ix, n->ns_id, n->key)];
	struct store_index_node *prev = NULL, *cur = *head;

	while (cur && cur != n) {
		prev = cur;
		cur = cur->next;
	}
	if (!cur)
		return -ENOENT;
	if (prev)
		prev->next = n->next;
	else
		*head = n->next;
	n->next = NULL;
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
		struct store_index_node *node = old.buckets[i], *next;

		for (; node; node = next) {
			next = node->next;
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
