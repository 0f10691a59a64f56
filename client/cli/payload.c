/*
 * payload.c - key-derived block payloads (fill and check).
 */
#include "payload.h"

#include <string.h>

#define GOLDEN 0x9e3779b97f4a7c15ULL

/* Fold the whole key into one seed, so keys that share a prefix differ. */
static uint64_t payload_seed(const uint8_t *key)
{
	uint64_t seed = 0, w;

	for (int i = 0; i < KVPOOL_KEY_BYTES; i += 8) {
		memcpy(&w, key + i, sizeof(w));
		seed = (seed ^ w) * GOLDEN + (uint64_t)i;
	}
	return seed;
}

/* Word `i` of the stream: splitmix64's output function applied to
 * seed + (i + 1) * golden, so any word can be computed on its own. */
static inline uint64_t payload_word(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * GOLDEN;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Store w little-endian in 8 bytes at p. */
static inline void store_le64(uint8_t *p, uint64_t w)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(p, &w, sizeof(w));
#else
	for (int b = 0; b < 8; b++)
		p[b] = (uint8_t)(w >> (8 * b));
#endif
}

/* Load a little-endian 64-bit word from p. */
static inline uint64_t load_le64(const uint8_t *p)
{
	uint64_t w;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(&w, p, sizeof(w));
#else
	w = 0;
	for (int b = 7; b >= 0; b--)
		w = (w << 8) | p[b];
#endif
	return w;
}

void cli_payload_fill(const uint8_t *key, void *buf, size_t len_bytes)
{
	uint64_t seed = payload_seed(key), words = len_bytes / 8, i;
	uint8_t *p = buf, tail[8];

	for (i = 0; i < words; i++)
		store_le64(p + 8 * i, payload_word(seed, i));
	if (len_bytes % 8) {
		store_le64(tail, payload_word(seed, words));
		memcpy(p + 8 * words, tail, len_bytes % 8);
	}
}

bool cli_payload_check(const uint8_t *key, const void *buf, size_t len_bytes)
{
	uint64_t seed = payload_seed(key), words = len_bytes / 8, i, diff = 0;
	const uint8_t *p = buf;
	uint8_t tail[8];

	/* Accumulate differences and test once per 4 KiB: no branch per word. */
	for (i = 0; i < words; i++) {
		diff |= load_le64(p + 8 * i) ^ payload_word(seed, i);
		if ((i & 511) == 511 && diff)
			return false;
	}
	if (diff)
		return false;
	if (len_bytes % 8) {
		store_le64(tail, payload_word(seed, words));
		return !memcmp(p + 8 * words, tail, len_bytes % 8);
	}
	return true;
}
