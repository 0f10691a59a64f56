/*
 * test_cluster_placement.c - per-block placement of the cluster backend
 * (client/lib/cluster/placement.c): owners are the ranking's first usable
 * nodes (kvpool_hrw_rank), a hot block has R of them, a node that is down
 * is skipped; a change of the usable nodes opens a fallback epoch whose
 * previous owners are those of the set before it; the epoch ends when the
 * new owners are warm, at the next change, or after its time.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "kvpool.h"
#include "lib/cluster/placement.h"
#include "lib/hrw.h"

static const char *const names[4] = { "node-a", "node-b", "node-c", "node-d" };
static int fake_nodes[4]; /* stand-ins for struct kvcl_node pointers */

static void view(struct kvcl_view *v, size_t n, const unsigned char *up)
{
	memset(v, 0, sizeof(*v));
	for (size_t j = 0; j < n; j++) {
		v->seed[j] = kvc_hrw_node_seed(names[j]);
		v->name[j] = names[j];
		v->node[j] = (struct kvcl_node *)&fake_nodes[j];
		v->up[j] = up ? up[j] : 1;
		v->age_ms[j] = UINT64_MAX; /* a static list: no registration time */
		v->n_up += v->up[j];
	}
	v->n = n;
}

static void key_of(uint32_t i, uint8_t k[32])
{
	SHA256((const unsigned char *)&i, sizeof(i), k);
}

static void test_owners(void **state)
{
	struct kvcl_place pl;
	struct kvcl_view v;
	unsigned char up[3] = { 1, 1, 1 };

	(void)state;
	assert_int_equal(kvcl_place_init(&pl, 2, 32, 1000), 0);
	view(&v, 3, up);
	for (uint32_t i = 0; i < 200; i++) {
		uint8_t k[32];
		size_t own[4], rank[4], got;

		key_of(i, k);
		assert_int_equal(kvpool_hrw_rank(k, names, 3, rank, 3), 3);
		assert_int_equal(kvcl_place_owners(&pl, &v, k, 0, own), 1);
		assert_int_equal(own[0], rank[0]);
		assert_int_equal(kvcl_place_owners(&pl, &v, k, 1, own), 2);
		assert_int_equal(own[0], rank[0]);
		assert_int_equal(own[1], rank[1]);
		/* the owner down: the next node of the ranking */
		up[rank[0]] = 0;
		view(&v, 3, up);
		got = kvcl_place_owners(&pl, &v, k, 0, own);
		assert_int_equal(got, 1);
		assert_int_equal(own[0], rank[1]);
		/* every node down: none */
		memset(up, 0, sizeof(up));
		view(&v, 3, up);
		assert_int_equal(kvcl_place_owners(&pl, &v, k, 1, own), 0);
		memset(up, 1, sizeof(up));
		view(&v, 3, up);
	}
	kvcl_place_free(&pl);
	assert_int_equal(kvcl_place_init(&pl, 0, 32, 0), -EINVAL);
	assert_int_equal(kvcl_place_init(&pl, KVCL_MAX_REPLICAS + 1, 32, 0), -EINVAL);
}

static void test_fallback_epoch(void **state)
{
	struct kvcl_place pl;
	struct kvcl_view v3, v4;
	size_t moved = 0, checked = 0;

	(void)state;
	assert_int_equal(kvcl_place_init(&pl, 2, 32, 1000), 0);
	view(&v3, 3, NULL);
	view(&v4, 4, NULL);
	kvcl_place_observe(&pl, &v3, 0);
	assert_false(kvcl_place_in_epoch(&pl));
	kvcl_place_observe(&pl, &v3, 10); /* no change */
	assert_false(kvcl_place_in_epoch(&pl));
	kvcl_place_observe(&pl, &v4, 20); /* node-d joins */
	assert_true(kvcl_place_in_epoch(&pl));
	for (uint32_t i = 0; i < 2000; i++) {
		uint8_t k[32];
		size_t own[2], prev[8], n_prev, old;

		key_of(i, k);
		kvcl_place_owners(&pl, &v4, k, 0, own);
		n_prev = kvcl_place_prev_owners(&pl, &v4, k, 0, own, 1, prev);
		old = (size_t)kvpool_hrw_owner(k, names, 3);
		if (own[0] == old) {
			assert_int_equal(n_prev, 0); /* it did not move */
		} else {
			assert_int_equal(own[0], 3); /* HRW: only to the new node */
			assert_int_equal(n_prev, 1);
			assert_int_equal(prev[0], old);
			moved++;
		}
		checked++;
	}
	assert_true(moved > checked / 6 && moved < checked / 3);
	/* warm: of KVCL_WARM_SAMPLE keys asked before, under 1% only there */
	kvcl_place_epoch_note(&pl, KVCL_WARM_SAMPLE, KVCL_WARM_SAMPLE / 10);
	assert_true(kvcl_place_in_epoch(&pl));
	kvcl_place_epoch_note(&pl, KVCL_WARM_SAMPLE, 3);
	assert_false(kvcl_place_in_epoch(&pl));
	/* a node going down opens one again; its time runs out */
	{
		unsigned char up[4] = { 1, 0, 1, 1 };
		struct kvcl_view vd;

		view(&vd, 4, up);
		kvcl_place_observe(&pl, &vd, 100);
		assert_true(kvcl_place_in_epoch(&pl));
		assert_int_equal(pl.n_prev, 4);
		kvcl_place_observe(&pl, &vd, 100 + 999);
		assert_true(kvcl_place_in_epoch(&pl));
		kvcl_place_observe(&pl, &vd, 100 + 1000);
		assert_false(kvcl_place_in_epoch(&pl));
	}
	kvcl_place_free(&pl);
}

/* A handle whose first call comes after a node joined (etcd records say
 * how long ago each member registered): the older members are the
 * previous view, so the keys the young node took are also asked there. */
static void test_first_call_after_a_join(void **state)
{
	struct kvcl_place pl;
	struct kvcl_view v4;
	size_t moved = 0;

	(void)state;
	assert_int_equal(kvcl_place_init(&pl, 2, 32, 10000), 0);
	view(&v4, 4, NULL);
	for (size_t j = 0; j < 3; j++)
		v4.age_ms[j] = 3600000; /* an hour */
	v4.age_ms[3] = 4000;            /* node-d registered 4 s ago */
	kvcl_place_observe(&pl, &v4, 500);
	assert_true(kvcl_place_in_epoch(&pl));
	assert_int_equal(pl.n_prev, 3);
	for (uint32_t i = 0; i < 1000; i++) {
		uint8_t k[32];
		size_t own[2], prev[8], n_prev, old;

		key_of(i, k);
		kvcl_place_owners(&pl, &v4, k, 0, own);
		n_prev = kvcl_place_prev_owners(&pl, &v4, k, 0, own, 1, prev);
		old = (size_t)kvpool_hrw_owner(k, names, 3);
		if (own[0] == old) {
			assert_int_equal(n_prev, 0);
		} else {
			assert_int_equal(own[0], 3);
			assert_int_equal(n_prev, 1);
			assert_int_equal(prev[0], old);
			moved++;
		}
	}
	assert_true(moved > 100);
	/* its time is counted from node-d's registration: 10 s - 4 s */
	kvcl_place_observe(&pl, &v4, 500 + 5999);
	assert_true(kvcl_place_in_epoch(&pl));
	kvcl_place_observe(&pl, &v4, 500 + 6000);
	assert_false(kvcl_place_in_epoch(&pl));
	kvcl_place_free(&pl);

	/* every member young (a pool just started), every one old, or the
	 * ages unknown (a static list): nothing to fall back to */
	for (int c = 0; c < 3; c++) {
		assert_int_equal(kvcl_place_init(&pl, 2, 32, 10000), 0);
		view(&v4, 4, NULL);
		for (size_t j = 0; j < 4; j++)
			v4.age_ms[j] = c == 0 ? 1000 : c == 1 ? 3600000 : UINT64_MAX;
		kvcl_place_observe(&pl, &v4, 0);
		assert_false(kvcl_place_in_epoch(&pl));
		kvcl_place_free(&pl);
	}
	/* a young member that is down is not a join this handle can use */
	{
		unsigned char up[4] = { 1, 1, 1, 0 };

		assert_int_equal(kvcl_place_init(&pl, 2, 32, 10000), 0);
		view(&v4, 4, up);
		for (size_t j = 0; j < 3; j++)
			v4.age_ms[j] = 3600000;
		v4.age_ms[3] = 10;
		kvcl_place_observe(&pl, &v4, 0);
		assert_false(kvcl_place_in_epoch(&pl));
		kvcl_place_free(&pl);
	}
}

static void test_shares(void **state)
{
	struct kvcl_place pl;
	struct kvcl_view v;
	double share[4], sum = 0;
	unsigned char up[4] = { 1, 1, 0, 1 };

	(void)state;
	assert_int_equal(kvcl_place_init(&pl, 1, 0, 0), 0);
	view(&v, 4, up);
	kvcl_place_shares(&pl, &v, share);
	for (int j = 0; j < 4; j++)
		sum += share[j];
	assert_true(sum > 0.999 && sum < 1.001);
	assert_true(share[2] == 0); /* down: owns nothing */
	for (int j = 0; j < 4; j++)
		if (j != 2)
			assert_true(share[j] > 0.28 && share[j] < 0.39);
	kvcl_place_free(&pl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_owners),
		cmocka_unit_test(test_fallback_epoch),
		cmocka_unit_test(test_first_call_after_a_join),
		cmocka_unit_test(test_shares),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
