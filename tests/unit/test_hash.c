/*
 * test_hash.c - kvpool_block_hashes against tests/data/hash_vectors.json,
 * chain continuation through a parent hash, and argument errors.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "kvpool.h"

/* One vector of the file, decoded. */
struct vector {
	const char *name;
	size_t block_tokens;
	uint32_t *tokens;
	size_t n_tokens;
	uint8_t extra[64];
	size_t extra_len;
	uint8_t (*hashes)[KVPOOL_KEY_BYTES];
	size_t n_hashes;
};

struct vectors {
	struct json_object *doc;
	struct vector *v;
	size_t n;
};

/* Decode hex (even length, lowercase or uppercase) into out; returns bytes or -1. */
static int unhex(const char *hex, uint8_t *out, size_t cap)
{
	size_t len = strlen(hex);

	if (len % 2 || len / 2 > cap)
		return -1;
	for (size_t i = 0; i < len / 2; i++) {
		unsigned int b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1)
			return -1;
		out[i] = (uint8_t)b;
	}
	return (int)(len / 2);
}

static const char *data_path(char *buf, size_t cap)
{
	const char *dir = getenv("KVPOOL_TEST_DATA");

	snprintf(buf, cap, "%s/hash_vectors.json", dir && *dir ? dir : "tests/data");
	return buf;
}

/* Fill one vector from its JSON object; fails the test on a malformed file. */
static void decode_vector(struct json_object *o, struct vector *v)
{
	struct json_object *f, *toks, *hashes;

	assert_true(json_object_object_get_ex(o, "name", &f));
	v->name = json_object_get_string(f);
	assert_true(json_object_object_get_ex(o, "block_size_tokens", &f));
	v->block_tokens = (size_t)json_object_get_int64(f);
	assert_true(json_object_object_get_ex(o, "token_ids", &toks));
	v->n_tokens = json_object_array_length(toks);
	v->tokens = calloc(v->n_tokens + 1, sizeof(uint32_t));
	assert_non_null(v->tokens);
	for (size_t i = 0; i < v->n_tokens; i++)
		v->tokens[i] = (uint32_t)json_object_get_int64(json_object_array_get_idx(toks, i));
	assert_true(json_object_object_get_ex(o, "extra_hex", &f));
	assert_true(unhex(json_object_get_string(f), v->extra, sizeof(v->extra)) >= 0);
	v->extra_len = strlen(json_object_get_string(f)) / 2;
	assert_true(json_object_object_get_ex(o, "block_hashes_hex", &hashes));
	v->n_hashes = json_object_array_length(hashes);
	v->hashes = calloc(v->n_hashes + 1, KVPOOL_KEY_BYTES);
	assert_non_null(v->hashes);
	for (size_t i = 0; i < v->n_hashes; i++) {
		const char *h = json_object_get_string(json_object_array_get_idx(hashes, i));

		assert_int_equal(unhex(h, v->hashes[i], KVPOOL_KEY_BYTES), KVPOOL_KEY_BYTES);
	}
}

static int load_vectors(void **state)
{
	struct vectors *vs = calloc(1, sizeof(*vs));
	struct json_object *arr;
	char path[4096];

	if (!vs)
		return -1;
	vs->doc = json_object_from_file(data_path(path, sizeof(path)));
	if (!vs->doc) {
		fprintf(stderr, "cannot read %s (set KVPOOL_TEST_DATA)\n", path);
		free(vs);
		return -1;
	}
	if (!json_object_object_get_ex(vs->doc, "vectors", &arr))
		return -1;
	vs->n = json_object_array_length(arr);
	vs->v = calloc(vs->n, sizeof(*vs->v));
	if (!vs->v)
		return -1;
	for (size_t i = 0; i < vs->n; i++)
		decode_vector(json_object_array_get_idx(arr, i), &vs->v[i]);
	*state = vs;
	return 0;
}

static int free_vectors(void **state)
{
	struct vectors *vs = *state;

	for (size_t i = 0; vs && i < vs->n; i++) {
		free(vs->v[i].tokens);
		free(vs->v[i].hashes);
	}
	if (vs) {
		free(vs->v);
		json_object_put(vs->doc);
	}
	free(vs);
	return 0;
}

/* Every vector in the file gives exactly its hashes. */
static void test_vectors(void **state)
{
	struct vectors *vs = *state;

	assert_true(vs->n >= 7);
	for (size_t i = 0; i < vs->n; i++) {
		struct vector *v = &vs->v[i];
		uint8_t out[16][KVPOOL_KEY_BYTES];
		size_t n_out = 999;

		assert_true(v->n_hashes <= 16);
		assert_int_equal(kvpool_block_hashes(v->tokens, v->n_tokens, v->block_tokens, NULL,
						     v->extra_len ? v->extra : NULL, v->extra_len,
						     out, 16, &n_out), 0);
		if (n_out != v->n_hashes)
			fail_msg("vector '%s': %zu hashes, expected %zu", v->name, n_out, v->n_hashes);
		for (size_t k = 0; k < n_out; k++)
			if (memcmp(out[k], v->hashes[k], KVPOOL_KEY_BYTES))
				fail_msg("vector '%s': block %zu differs", v->name, k);
	}
}

/* Hashing blocks 2..n with parent = hash of block 1 continues the chain,
 * also when the first block took extra bytes. */
static void test_parent_continuation(void **state)
{
	struct vectors *vs = *state;
	int checked = 0;

	for (size_t i = 0; i < vs->n; i++) {
		struct vector *v = &vs->v[i];
		uint8_t out[16][KVPOOL_KEY_BYTES];
		size_t n_out = 0;

		if (v->n_hashes < 2)
			continue;
		assert_int_equal(kvpool_block_hashes(v->tokens + v->block_tokens,
						     v->n_tokens - v->block_tokens, v->block_tokens,
						     v->hashes[0], v->extra, v->extra_len, out, 16,
						     &n_out), 0);
		assert_int_equal(n_out, v->n_hashes - 1);
		for (size_t k = 0; k < n_out; k++)
			assert_memory_equal(out[k], v->hashes[k + 1], KVPOOL_KEY_BYTES);
		checked++;
	}
	assert_true(checked >= 3);
}

/* Extra bytes change the first hash and, through the chain, every later one. */
static void test_extra_changes_chain(void **state)
{
	struct vectors *vs = *state;
	const struct vector *v = &vs->v[1]; /* three blocks, no extra */
	uint8_t plain[3][KVPOOL_KEY_BYTES], salted[3][KVPOOL_KEY_BYTES];
	size_t n = 0;

	assert_int_equal(v->n_hashes, 3);
	assert_int_equal(kvpool_block_hashes(v->tokens, v->n_tokens, v->block_tokens, NULL, NULL, 0,
					     plain, 3, &n), 0);
	assert_int_equal(kvpool_block_hashes(v->tokens, v->n_tokens, v->block_tokens, NULL, "s", 1,
					     salted, 3, &n), 0);
	for (int k = 0; k < 3; k++)
		assert_memory_not_equal(plain[k], salted[k], KVPOOL_KEY_BYTES);
}

/* Too small an output array: -ENOSPC, nothing written. */
static void test_enospc(void **state)
{
	struct vectors *vs = *state;
	const struct vector *v = &vs->v[1];
	uint8_t out[2][KVPOOL_KEY_BYTES], zero[2][KVPOOL_KEY_BYTES];
	size_t n_out = 77;

	memset(out, 0, sizeof(out));
	memset(zero, 0, sizeof(zero));
	assert_int_equal(kvpool_block_hashes(v->tokens, v->n_tokens, v->block_tokens, NULL, NULL, 0,
					     out, 2, &n_out), -ENOSPC);
	assert_int_equal(n_out, 77);
	assert_memory_equal(out, zero, sizeof(out));
}

/* Invalid arguments: -EINVAL; fewer tokens than a block: zero hashes. */
static void test_einval_and_partial(void **state)
{
	uint32_t tokens[4] = { 1, 2, 3, 4 };
	uint8_t out[4][KVPOOL_KEY_BYTES];
	size_t n_out = 5;

	(void)state;
	assert_int_equal(kvpool_block_hashes(tokens, 4, 0, NULL, NULL, 0, out, 4, &n_out), -EINVAL);
	assert_int_equal(kvpool_block_hashes(NULL, 4, 2, NULL, NULL, 0, out, 4, &n_out), -EINVAL);
	assert_int_equal(kvpool_block_hashes(tokens, 4, 2, NULL, NULL, 0, out, 4, NULL), -EINVAL);
	assert_int_equal(kvpool_block_hashes(tokens, 4, 2, NULL, NULL, 3, out, 4, &n_out), -EINVAL);
	assert_int_equal(kvpool_block_hashes(tokens, 4, 2, NULL, NULL, 0, NULL, 4, &n_out), -EINVAL);
	assert_int_equal(n_out, 5);
	assert_int_equal(kvpool_block_hashes(tokens, 3, 4, NULL, NULL, 0, NULL, 0, &n_out), 0);
	assert_int_equal(n_out, 0);
	assert_int_equal(kvpool_block_hashes(NULL, 0, 16, NULL, NULL, 0, NULL, 0, &n_out), 0);
	assert_int_equal(n_out, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors),
		cmocka_unit_test(test_parent_continuation),
		cmocka_unit_test(test_extra_changes_chain),
		cmocka_unit_test(test_enospc),
		cmocka_unit_test(test_einval_and_partial),
	};

	return cmocka_run_group_tests(tests, load_vectors, free_vectors);
}
