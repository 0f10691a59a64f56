/*
 * hash.c - kvpool_block_hashes: chained SHA-256 block hashes of a token
 * sequence (OpenSSL EVP).
 */
#include <errno.h>
#include <openssl/evp.h>

#include "kvpool.h"

#define TOKEN_CHUNK 256 /* tokens serialised per digest update */

/* Feed `n` token ids to the digest as uint32 little-endian. */
static int digest_tokens(EVP_MD_CTX *ctx, const uint32_t *tokens, size_t n)
{
	uint8_t buf[TOKEN_CHUNK * 4];

	while (n) {
		size_t k = n < TOKEN_CHUNK ? n : TOKEN_CHUNK;

		for (size_t i = 0; i < k; i++) {
			buf[4 * i] = (uint8_t)tokens[i];
			buf[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
			buf[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
			buf[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
		}
		if (!EVP_DigestUpdate(ctx, buf, k * 4))
			return -ENOMEM;
		tokens += k;
		n -= k;
	}
	return 0;
}

/* Hash one block: SHA-256(parent? || tokens || extra?) into out. */
static int hash_block(EVP_MD_CTX *ctx, const uint8_t *parent, const uint32_t *tokens, size_t n,
		      const void *extra, size_t extra_len, uint8_t out[KVPOOL_KEY_BYTES])
{
	unsigned int len = 0;

	if (!EVP_DigestInit_ex(ctx, EVP_sha256(), NULL))
		return -ENOMEM;
	if (parent && !EVP_DigestUpdate(ctx, parent, KVPOOL_KEY_BYTES))
		return -ENOMEM;
	if (digest_tokens(ctx, tokens, n))
		return -ENOMEM;
	if (extra_len && !EVP_DigestUpdate(ctx, extra, extra_len))
		return -ENOMEM;
	if (!EVP_DigestFinal_ex(ctx, out, &len) || len != KVPOOL_KEY_BYTES)
		return -ENOMEM;
	return 0;
}

int kvpool_block_hashes(const uint32_t *tokens, size_t n_tokens, size_t block_tokens,
			const uint8_t *parent, const void *extra, size_t extra_len,
			void *out, size_t out_cap, size_t *n_out)
{
	uint8_t (*hashes)[KVPOOL_KEY_BYTES] = out;
	size_t blocks;
	EVP_MD_CTX *ctx;
	int rc = 0;

	if (block_tokens == 0 || !n_out || (n_tokens && !tokens) || (extra_len && !extra))
		return -EINVAL;
	blocks = n_tokens / block_tokens;
	if (blocks && !out)
		return -EINVAL;
	if (out_cap < blocks)
		return -ENOSPC;
	ctx = EVP_MD_CTX_new();
	if (!ctx)
		return -ENOMEM;
	/* Extra bytes go into the first block of a prompt only; a block that
	 * continues a chain (parent given) carries them through its parent. */
	for (size_t i = 0; i < blocks && !rc; i++) {
		const uint8_t *prev = i ? hashes[i - 1] : parent;
		int first = !prev;

		rc = hash_block(ctx, prev, tokens + i * block_tokens, block_tokens,
				first ? extra : NULL, first ? extra_len : 0, hashes[i]);
	}
	EVP_MD_CTX_free(ctx);
	if (rc)
		return rc;
	*n_out = blocks;
	return 0;
}
