/*
 * test_hrw.c - rendezvous placement (client/lib/hrw.c): the shared vectors
 * of tests/data/hrw_vectors.json (scores, owners and whole rankings; the
 * Python binding checks the same file), balance over 3 and 4 nodes, what
 * adding a 4th node moves, the ranking's tie-break and skipped nodes, and
 * argument errors of the public functions.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>
#include <openssl/sha.h>

#include "lib/hrw.h"
#include "kvpool.h"

#define BALANCE_SEGMENTS 10000

static void unhex32(const char *hex, uint8_t out[32])
{
	assert_int_equal(strlen(hex), 64);
	for (int i = 0; i < 32; i++) {
		unsigned int b;

		assert_int_equal(sscanf(hex + 2 * i, "%2x", &b), 1);
		out[i] = (uint8_t)b;
	}
}

static void test_vectors(void **state)
{
	char path[1024];
	const char *dir = getenv("KVPOOL_TEST_DATA");
	struct json_object *doc, *nodes, *vecs;
	const char *names[16];
	size_t n_names, n_vec;

	(void)state;
	snprintf(path, sizeof(path), "%s/hrw_vectors.json", dir && *dir ? dir : "tests/data");
	doc = json_object_from_file(path);
	assert_non_null(doc);
	assert_true(json_object_object_get_ex(doc, "nodes", &nodes));
	assert_true(json_object_object_get_ex(doc, "vectors", &vecs));
	n_names = json_object_array_length(nodes);
	assert_true(n_names >= 4 && n_names <= 16);
	for (size_t i = 0; i < n_names; i++)
		names[i] = json_object_get_string(json_object_array_get_idx(nodes, i));
	n_vec = json_object_array_length(vecs);
	assert_true(n_vec >= 10);
	for (size_t v = 0; v < n_vec; v++) {
		struct json_object *o = json_object_array_get_idx(vecs, v), *x;
		uint8_t key[32];
		static const struct { const char *field; size_t n; } owners[] = {
			{ "owner_of_3", 3 }, { "owner_of_4", 4 }, { "owner_of_6", 6 } };

		assert_true(json_object_object_get_ex(o, "key_hex", &x));
		unhex32(json_object_get_string(x), key);
		assert_true(json_object_object_get_ex(o, "scores", &x));
		for (size_t i = 0; i < n_names; i++) {
			const char *want = json_object_get_string(json_object_array_get_idx(x, i));
			char got[32];

			snprintf(got, sizeof(got), "%" PRIu64, kvpool_hrw_score(key, names[i]));
			assert_string_equal(got, want);
		}
		for (size_t k = 0; k < 3; k++) {
			assert_true(json_object_object_get_ex(o, owners[k].field, &x));
			assert_int_equal(kvpool_hrw_owner(key, names, owners[k].n),
					 json_object_get_int(x));
		}
		for (size_t k = 0; k < 3; k++) {
			static const char *const field[] = { "ranking_of_3", "ranking_of_4",
							     "ranking_of_6" };
			size_t n = owners[k].n, got[16];

			assert_true(json_object_object_get_ex(o, field[k], &x));
			assert_int_equal(json_object_array_length(x), n);
			/* the whole ranking, and every prefix of it */
			for (size_t want = 1; want <= n; want++) {
				assert_int_equal(kvpool_hrw_rank(key, names, n, got, want), (int)want);
				for (size_t i = 0; i < want; i++)
					assert_int_equal(got[i],
							 json_object_get_int(json_object_array_get_idx(x, i)));
			}
			assert_int_equal(kvpool_hrw_rank(key, names, n, got, n + 5), (int)n);
		}
	}
	json_object_put(doc);
}

/* The first-block key of segment i of the balance set: SHA-256 of its index. */
static void segment_key(uint32_t i, uint8_t key[32])
{
	uint8_t in[4] = { (uint8_t)i, (uint8_t)(i >> 8), (uint8_t)(i >> 16), (uint8_t)(i >> 24) };

	SHA256(in, sizeof(in), key);
}

static void test_balance_and_moves(void **state)
{
	const char *names[4] = { "node-a", "node-b", "node-c", "node-d" };
	uint64_t seeds[4];
	size_t share3[3] = { 0 }, share4[4] = { 0 }, moved = 0;

	(void)state;
	for (int i = 0; i < 4; i++)
		seeds[i] = kvc_hrw_node_seed(names[i]);
	for (uint32_t s = 0; s < BALANCE_SEGMENTS; s++) {
		uint8_t key[32];
		int o3, o4;

		segment_key(s, key);
		o3 = kvc_hrw_owner(key, seeds, names, NULL, 3);
		o4 = kvc_hrw_owner(key, seeds, names, NULL, 4);
		assert_true(o3 >= 0 && o3 < 3);
		assert_true(o4 >= 0 && o4 < 4);
		assert_int_equal(o3, kvpool_hrw_owner(key, names, 3));
		share3[o3]++;
		share4[o4]++;
		if (o4 != o3) {
			assert_int_equal(o4, 3); /* HRW: only moves to the new node */
			moved++;
		}
	}
	for (int i = 0; i < 3; i++) {
		printf("3 nodes: %s owns %zu of %d\n", names[i], share3[i], BALANCE_SEGMENTS);
		assert_true(share3[i] >= BALANCE_SEGMENTS / 3 * 0.9);
		assert_true(share3[i] <= BALANCE_SEGMENTS / 3 * 1.1);
	}
	for (int i = 0; i < 4; i++) {
		printf("4 nodes: %s owns %zu of %d\n", names[i], share4[i], BALANCE_SEGMENTS);
		assert_true(share4[i] >= BALANCE_SEGMENTS / 4 * 0.9);
		assert_true(share4[i] <= BALANCE_SEGMENTS / 4 * 1.1);
	}
	printf("adding the 4th node moved %zu of %d (bound %d)\n", moved, BALANCE_SEGMENTS,
	       (int)(BALANCE_SEGMENTS * 1.2 / 4));
	assert_true(moved <= BALANCE_SEGMENTS * 1.2 / 4);
	assert_true(moved > 0);
}

static void test_down_nodes_and_errors(void **state)
{
	const char *names[3] = { "x", "y", "z" };
	uint64_t seeds[3];
	unsigned char up[3] = { 1, 1, 1 };
	uint8_t key[32];

	(void)state;
	for (int i = 0; i < 3; i++)
		seeds[i] = kvc_hrw_node_seed(names[i]);
	segment_key(7, key);
	int o = kvc_hrw_owner(key, seeds, names, up, 3);
	up[o] = 0;
	int o2 = kvc_hrw_owner(key, seeds, names, up, 3);
	assert_true(o2 >= 0 && o2 != o);
	up[0] = up[1] = up[2] = 0;
	assert_int_equal(kvc_hrw_owner(key, seeds, names, up, 3), -1);
	assert_int_equal(kvc_hrw_owner(key, seeds, names, NULL, 0), -1);

	assert_int_equal(kvpool_hrw_owner(NULL, names, 3), -EINVAL);
	assert_int_equal(kvpool_hrw_owner(key, NULL, 3), -EINVAL);
	assert_int_equal(kvpool_hrw_owner(key, names, 0), -EINVAL);
	const char *with_null[2] = { "x", NULL };
	assert_int_equal(kvpool_hrw_owner(key, with_null, 2), -EINVAL);
	assert_int_equal(kvpool_hrw_score(NULL, "x"), 0);
	assert_int_equal(kvpool_hrw_score(key, NULL), 0);
	{
		size_t out[4];

		assert_int_equal(kvpool_hrw_rank(NULL, names, 3, out, 2), -EINVAL);
		assert_int_equal(kvpool_hrw_rank(key, NULL, 3, out, 2), -EINVAL);
		assert_int_equal(kvpool_hrw_rank(key, names, 0, out, 2), -EINVAL);
		assert_int_equal(kvpool_hrw_rank(key, names, 3, NULL, 2), -EINVAL);
		assert_int_equal(kvpool_hrw_rank(key, names, 3, out, 0), -EINVAL);
		assert_int_equal(kvpool_hrw_rank(key, with_null, 2, out, 2), -EINVAL);
	}
}

/* Equal scores (the same seed under two names) go to the smaller name;
 * nodes that are down are skipped, the rest keep their order. */
static void test_rank_ties_and_down(void **state)
{
	const char *names[5] = { "e", "b", "d", "a", "c" };
	uint64_t seeds[5] = { 7, 7, 7, 7, 7 };
	unsigned char up[5] = { 1, 1, 1, 1, 1 };
	uint8_t key[32];
	size_t out[5], full[5];

	(void)state;
	segment_key(3, key);
	assert_int_equal(kvc_hrw_rank(key, seeds, names, NULL, 5, out, 5), 5);
	assert_int_equal(out[0], 3); /* "a" */
	assert_int_equal(out[1], 1); /* "b" */
	assert_int_equal(out[2], 4); /* "c" */
	assert_int_equal(out[3], 2); /* "d" */
	assert_int_equal(out[4], 0); /* "e" */
	for (int i = 0; i < 5; i++)
		seeds[i] = kvc_hrw_node_seed(names[i]);
	assert_int_equal(kvc_hrw_rank(key, seeds, names, NULL, 5, full, 5), 5);
	assert_int_equal((int)full[0], kvc_hrw_owner(key, seeds, names, NULL, 5));
	up[full[0]] = 0;
	up[full[2]] = 0;
	assert_int_equal(kvc_hrw_rank(key, seeds, names, up, 5, out, 5), 3);
	assert_int_equal(out[0], full[1]);
	assert_int_equal(out[1], full[3]);
	assert_int_equal(out[2], full[4]);
	assert_int_equal(kvc_hrw_rank(key, seeds, names, up, 5, out, 1), 1);
	assert_int_equal(out[0], full[1]);
	memset(up, 0, sizeof(up));
	assert_int_equal(kvc_hrw_rank(key, seeds, names, up, 5, out, 2), 0);
	/* the second of a ranking also spreads evenly, and never repeats the first */
	{
		const char *n3[3] = { "node-a", "node-b", "node-c" };
		uint64_t s3[3];
		size_t second[3] = { 0 };

		for (int i = 0; i < 3; i++)
			s3[i] = kvc_hrw_node_seed(n3[i]);
		for (uint32_t i = 0; i < BALANCE_SEGMENTS; i++) {
			size_t r[2];

			segment_key(i, key);
			assert_int_equal(kvc_hrw_rank(key, s3, n3, NULL, 3, r, 2), 2);
			assert_true(r[0] != r[1]);
			second[r[1]]++;
		}
		for (int i = 0; i < 3; i++)
			assert_true(second[i] >= BALANCE_SEGMENTS / 3 * 0.9 &&
				    second[i] <= BALANCE_SEGMENTS / 3 * 1.1);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors),
		cmocka_unit_test(test_balance_and_moves),
		cmocka_unit_test(test_down_nodes_and_errors),
		cmocka_unit_test(test_rank_ties_and_down),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
