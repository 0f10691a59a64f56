/*
 * hrw.c - the rendezvous (HRW) score of a key on a node, and the ranking
 * of nodes for a key (Thaler and Ravishankar, "Using name-based mappings
 * to increase hit rates", IEEE/ACM ToN 6(1), 1998: every client ranks the
 * nodes by a hash of (key, node) and agrees on the owner without talking).
 *
 * score(key, name) = fmix64( fold(key) XOR seed(name) )
 *   fold(key)  = the XOR of the key's four 64-bit little-endian words
 *   seed(name) = the first 8 bytes, little-endian, of SHA-256(name)
 *   fmix64     = MurmurHash3's 64-bit finaliser (xor-shift 33, multiply by
 *                0xff51afd7ed558ccd, xor-shift 33, multiply by
 *                0xc4ceb9fe1a85ec53, xor-shift 33): a bijection on 64 bits
 *                with full avalanche
 *
 * Why this hash:
 *  - Keys are already SHA-256 outputs (block hashes), so they need no
 *    further cryptographic mixing; what HRW needs is that, for a fixed key,
 *    the scores of different nodes behave like independent uniform draws.
 *    Node seeds are SHA-256 of the (stable) node name, so they are
 *    unrelated to each other, and fmix64 spreads any difference in its
 *    input over all 64 output bits. The balance test (test_hrw.c) checks
 *    the resulting shares.
 *  - fold() XORs all four words so that engine hashes shorter than 32
 *    bytes (zero-padded, kvpool.h convention 3) still place well.
 *  - It costs a few nanoseconds per (key, node): a MATCH of 1,000 blocks
 *    over 3 nodes scores 3,000 pairs. SHA-256 runs once per node per
 *    membership change, never per request.
 *  - It is small enough to write again in pure Python
 *    (kvpool/placement.py), so placement is the same in C and in the
 *    binding; tests/data/hrw_vectors.json holds shared vectors.
 */
#include <endian.h>
#include <errno.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

#include "hrw.h"
#include "kvpool.h"

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

/* The key's half of the score: its four words XORed. */
static uint64_t fold(const uint8_t key[32])
{
	return le64(key) ^ le64(key + 8) ^ le64(key + 16) ^ le64(key + 24);
}

static uint64_t fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	k ^= k >> 33;
	return k;
}

uint64_t kvc_hrw_node_seed(const char *name)
{
	uint8_t d[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)name, strlen(name), d);
	return le64(d);
}

uint64_t kvc_hrw_score_seeded(const uint8_t key[32], uint64_t node_seed)
{
	return fmix64(fold(key) ^ node_seed);
}

/* Does (s, name) rank before (bs, bname)? Higher score first, then the
 * smaller name. */
static int before(uint64_t s, const char *name, uint64_t bs, const char *bname)
{
	return s > bs || (s == bs && strcmp(name, bname) < 0);
}

size_t kvc_hrw_rank(const uint8_t key[32], const uint64_t *seeds, const char *const *names,
		    const unsigned char *up, size_t n, size_t *out, size_t k)
{
	uint64_t sc[KVC_HRW_RANK_MAX], f = fold(key);
	size_t got = 0;

	if (k > KVC_HRW_RANK_MAX)
		k = KVC_HRW_RANK_MAX;
	/* insertion into the k best so far: k is small (the replicas asked for) */
	for (size_t i = 0; i < n; i++) {
		uint64_t s;
		size_t at;

		if (up && !up[i])
			continue;
		s = fmix64(f ^ seeds[i]);
		at = got;
		while (at > 0 && before(s, names[i], sc[at - 1], names[out[at - 1]]))
			at--;
		if (at >= k)
			continue;
		if (got < k)
			got++;
		for (size_t j = got - 1; j > at; j--) {
			sc[j] = sc[j - 1];
			out[j] = out[j - 1];
		}
		sc[at] = s;
		out[at] = i;
	}
	return got;
}

int kvc_hrw_owner(const uint8_t key[32], const uint64_t *seeds, const char *const *names,
		  const unsigned char *up, size_t n)
{
	int best = -1;
	uint64_t best_score = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t s;

		if (up && !up[i])
			continue;
		s = kvc_hrw_score_seeded(key, seeds[i]);
		if (best < 0 || s > best_score ||
		    (s == best_score && strcmp(names[i], names[best]) < 0)) {
			best = (int)i;
			best_score = s;
		}
	}
	return best;
}

uint64_t kvpool_hrw_score(const uint8_t key[KVPOOL_KEY_BYTES], const char *node_name)
{
	if (!key || !node_name)
		return 0;
	return kvc_hrw_score_seeded(key, kvc_hrw_node_seed(node_name));
}

int kvpool_hrw_rank(const uint8_t key[KVPOOL_KEY_BYTES], const char *const *node_names,
		    size_t n, size_t *out, size_t k)
{
	uint64_t sc[KVC_HRW_RANK_MAX];
	size_t got = 0;

	if (!key || !node_names || !out || n == 0 || n > INT32_MAX || k == 0)
		return -EINVAL;
	if (k > KVC_HRW_RANK_MAX)
		k = KVC_HRW_RANK_MAX;
	for (size_t i = 0; i < n; i++) {
		uint64_t s;
		size_t at;

		if (!node_names[i])
			return -EINVAL;
		s = kvc_hrw_score_seeded(key, kvc_hrw_node_seed(node_names[i]));
		at = got;
		while (at > 0 && before(s, node_names[i], sc[at - 1], node_names[out[at - 1]]))
			at--;
		if (at >= k)
			continue;
		if (got < k)
			got++;
		for (size_t j = got - 1; j > at; j--) {
			sc[j] = sc[j - 1];
			out[j] = out[j - 1];
		}
		sc[at] = s;
		out[at] = i;
	}
	return (int)got;
}

int kvpool_hrw_owner(const uint8_t key[KVPOOL_KEY_BYTES], const char *const *node_names,
		     size_t n)
{
	int best = -1;
	uint64_t best_score = 0;

	if (!key || !node_names || n == 0 || n > INT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		uint64_t s;

		if (!node_names[i])
			return -EINVAL;
		s = kvc_hrw_score_seeded(key, kvc_hrw_node_seed(node_names[i]));
		if (best < 0 || s > best_score ||
		    (s == best_score && strcmp(node_names[i], node_names[best]) < 0)) {
			best = (int)i;
			best_score = s;
		}
	}
	return best;
}
