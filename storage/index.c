/*
 * index.c - chained hash table keyed by (namespace id, block hash).
 */
#include "index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bucket of (ns_id, key): the key's first 8 bytes are already uniform
 * (SHA-256); mixing in ns_id with a 64-bit finalizer keeps equal hashes in
 * different namespaces apart. */
static uint64_t bucket_of(const struct store_index *ix, uint32_t ns_id,
			  const uint8_t key[STORE_INDEX_KEY_BYTES])
{
	uint64_t h;

	memcpy(&h, key, sizeof(h));
	h ^= (uint64_t)ns_id * 0x9e3779b97f4a7c15ull;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h & (ix->nbuckets - 1);
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
	struct store_index_node **pp = &ix->buckets[bucket_of(ix, n->ns_id, n->key)];

	for (; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			n->next = NULL;
			ix->count--;
			return 0;
		}
	}
	return -ENOENT;
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
