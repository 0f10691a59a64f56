/*
 * test_arena.c - the page extent allocator of storage/: exact fits,
 * coalescing, fragmentation figure, no overlap under mixed random sizes,
 * and no false "full".
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

#include "arena.h"

#define PAGE 4096u

static void assert_arena_ok(const struct store_arena *a)
{
	char why[256];
	int rc = store_arena_check(a, why, sizeof(why));

	if (rc)
		fail_msg("arena check: %s", why);
}

static double fragmentation(const struct store_arena *a)
{
	uint64_t free_pages = store_arena_free_pages(a);

	if (!free_pages)
		return 0.0;
	return 1.0 - (double)store_arena_largest_free(a) / (double)free_pages;
}

static void test_open_invalid(void **state)
{
	struct store_arena *a = (struct store_arena *)0x1;

	(void)state;
	assert_int_equal(store_arena_open(0, &a), -EINVAL);
	assert_int_equal(store_arena_open((uint64_t)STORE_ARENA_MAX_PAGES + 1, &a), -EINVAL);
	assert_ptr_equal(a, (struct store_arena *)0x1);
	store_arena_close(NULL);
}

static void test_whole_arena(void **state)
{
	struct store_arena *a;
	uint32_t first = 99, again;

	(void)state;
	assert_int_equal(store_arena_open(16, &a), 0);
	assert_int_equal(store_arena_pages(a), 16);
	assert_int_equal(store_arena_free_pages(a), 16);
	assert_int_equal(store_arena_largest_free(a), 16);
	assert_true(store_arena_meta_bytes(a) >= 16 * 12);
	assert_int_equal(store_arena_alloc(a, 0, &first), -EINVAL);
	assert_int_equal(store_arena_alloc(a, 17, &first), -ENOSPC);
	assert_int_equal(store_arena_alloc(a, 16, &first), 0);
	assert_int_equal(first, 0);
	assert_int_equal(store_arena_free_pages(a), 0);
	assert_int_equal(store_arena_largest_free(a), 0);
	again = 77;
	assert_int_equal(store_arena_alloc(a, 1, &again), -ENOSPC);
	assert_int_equal(again, 77);
	assert_arena_ok(a);
	assert_int_equal(store_arena_free(a, 0), 0);
	assert_int_equal(store_arena_free_extents(a), 1);
	assert_arena_ok(a);
	/* payload pages are usable memory, 4 KiB aligned */
	assert_int_equal((uintptr_t)store_arena_ptr(a, 3) % PAGE, 0);
	memset(store_arena_ptr(a, 0), 0xab, 16 * PAGE);
	store_arena_close(a);
}

static void test_coalesce(void **state)
{
	struct store_arena *a;
	uint32_t pa, pb, pc, pd;

	(void)state;
	assert_int_equal(store_arena_open(64, &a), 0);
	assert_int_equal(store_arena_alloc(a, 3, &pa), 0);
	assert_int_equal(store_arena_alloc(a, 5, &pb), 0);
	assert_int_equal(store_arena_alloc(a, 7, &pc), 0);
	assert_int_equal(store_arena_alloc(a, 49, &pd), 0);
	assert_int_equal(pa, 0);
	assert_int_equal(pb, 3);
	assert_int_equal(pc, 8);
	assert_int_equal(pd, 15);
	assert_int_equal(store_arena_free(a, pa), 0);
	assert_int_equal(store_arena_free(a, pc), 0);
	assert_int_equal(store_arena_free_extents(a), 2);
	assert_int_equal(store_arena_largest_free(a), 7);
	assert_arena_ok(a);
	/* freeing the middle merges left and right neighbours */
	assert_int_equal(store_arena_free(a, pb), 0);
	assert_int_equal(store_arena_free_extents(a), 1);
	assert_int_equal(store_arena_largest_free(a), 15);
	assert_arena_ok(a);
	assert_int_equal(store_arena_free(a, pd), 0);
	assert_int_equal(store_arena_free_extents(a), 1);
	assert_int_equal(store_arena_largest_free(a), 64);
	assert_arena_ok(a);
	store_arena_close(a);
}

static void test_bad_free(void **state)
{
	struct store_arena *a;
	uint32_t p;

	(void)state;
	assert_int_equal(store_arena_open(32, &a), 0);
	assert_int_equal(store_arena_alloc(a, 4, &p), 0);
	assert_int_equal(store_arena_free(a, 32), -EINVAL);  /* out of range */
	assert_int_equal(store_arena_free(a, 4), -EINVAL);   /* free extent */
	assert_int_equal(store_arena_free(a, p), 0);
	assert_int_equal(store_arena_free(a, p), -EINVAL);   /* double free */
	assert_int_equal(store_arena_free_pages(a), 32);
	assert_arena_ok(a);
	store_arena_close(a);
}

/* A checkerboard of one-page holes: free = n/2 pages, largest = 1. */
static void test_fragmentation_figure(void **state)
{
	enum { N = 64 };
	struct store_arena *a;
	uint32_t p[N], two;

	(void)state;
	assert_int_equal(store_arena_open(N, &a), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(store_arena_alloc(a, 1, &p[i]), 0);
	for (int i = 0; i < N; i += 2)
		assert_int_equal(store_arena_free(a, p[i]), 0);
	assert_int_equal(store_arena_free_pages(a), N / 2);
	assert_int_equal(store_arena_largest_free(a), 1);
	assert_true(fragmentation(a) > 1.0 - 1.0 / (N / 2) - 1e-9);
	assert_true(fragmentation(a) < 1.0 - 1.0 / (N / 2) + 1e-9);
	assert_int_equal(store_arena_alloc(a, 2, &two), -ENOSPC);
	assert_arena_ok(a);
	for (int i = 1; i < N; i += 2)
		assert_int_equal(store_arena_free(a, p[i]), 0);
	assert_int_equal(store_arena_free_extents(a), 1);
	assert_true(fragmentation(a) == 0.0);
	assert_arena_ok(a);
	store_arena_close(a);
}

/* Within one size class the fitting hole is found, not the tail. */
static void test_fit_within_class(void **state)
{
	struct store_arena *a;
	uint32_t h16, x, h17, y, p, q;

	(void)state;
	assert_int_equal(store_arena_open(40, &a), 0);
	assert_int_equal(store_arena_alloc(a, 16, &h16), 0);
	assert_int_equal(store_arena_alloc(a, 1, &x), 0);
	assert_int_equal(store_arena_alloc(a, 17, &h17), 0);
	assert_int_equal(store_arena_alloc(a, 6, &y), 0);
	assert_int_equal(store_arena_free(a, h16), 0);
	assert_int_equal(store_arena_free(a, h17), 0);
	/* 16 and 17 pages share a size class; asking 17 must pick the 17 */
	assert_int_equal(store_arena_alloc(a, 17, &p), 0);
	assert_int_equal(p, h17);
	assert_int_equal(store_arena_alloc(a, 16, &q), 0);
	assert_int_equal(q, h16);
	assert_int_equal(store_arena_free_pages(a), 0);
	assert_arena_ok(a);
	store_arena_close(a);
}

/* Same-size extents tile the arena completely, also after churn. */
static void test_same_size_fill(void **state)
{
	static const uint32_t sizes[] = { 1, 3, 16, 25, 100, 256, 333 };
	enum { N = 8192 };

	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t k = sizes[i], *ext = calloc(N, sizeof(*ext)), count = 0, refill = 0;
		struct store_arena *a;

		assert_non_null(ext);
		assert_int_equal(store_arena_open(N, &a), 0);
		while (store_arena_alloc(a, k, &ext[count]) == 0)
			count++;
		assert_int_equal(count, N / k);
		/* free every other extent, then allocate the same size again */
		for (uint32_t j = 0; j < count; j += 2)
			assert_int_equal(store_arena_free(a, ext[j]), 0);
		for (uint32_t j = 0; j < count; j += 2)
			if (store_arena_alloc(a, k, &ext[j]) == 0)
				refill++;
		assert_int_equal(refill, (count + 1) / 2);
		assert_true(store_arena_free_pages(a) < k);
		assert_arena_ok(a);
		store_arena_close(a);
		free(ext);
	}
}

struct live {
	uint32_t first, pages;
	uint64_t tag;
};

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Mostly small extents, some medium, a few large. */
static uint32_t random_pages(void)
{
	uint64_t r = rnd() % 100;

	if (r < 70)
		return 1 + (uint32_t)(rnd() % 8);
	if (r < 95)
		return 9 + (uint32_t)(rnd() % 120);
	return 129 + (uint32_t)(rnd() % 600);
}

/* Stamp the first and last 8 bytes of every page with the owner's tag. */
static void stamp(struct store_arena *a, const struct live *l)
{
	for (uint32_t p = 0; p < l->pages; p++) {
		uint8_t *page = store_arena_ptr(a, l->first + p);

		memcpy(page, &l->tag, 8);
		memcpy(page + PAGE - 8, &l->tag, 8);
	}
}

static void verify(struct store_arena *a, const struct live *l)
{
	for (uint32_t p = 0; p < l->pages; p++) {
		uint8_t *page = store_arena_ptr(a, l->first + p);
		uint64_t head, tail;

		memcpy(&head, page, 8);
		memcpy(&tail, page + PAGE - 8, 8);
		assert_true(head == l->tag && tail == l->tag);
	}
}

static void test_mixed_random(void **state)
{
	enum { PAGES = 4096, OPS = 20000, MAXLIVE = 4096 };
	struct live *live = calloc(MAXLIVE, sizeof(*live));
	uint64_t live_pages = 0, fails = 0, frag_fails = 0, used_sum = 0;
	double frag_sum = 0, frag_max = 0;
	struct store_arena *a;
	uint32_t nlive = 0;

	(void)state;
	assert_non_null(live);
	rng_state = 12345;
	assert_int_equal(store_arena_open(PAGES, &a), 0);
	for (int op = 0; op < OPS; op++) {
		bool do_alloc = nlive == 0 || (nlive < MAXLIVE && rnd() % 100 < 55);

		if (do_alloc) {
			struct live l = { .pages = random_pages(), .tag = rnd() };

			if (store_arena_alloc(a, l.pages, &l.first) == 0) {
				stamp(a, &l);
				live[nlive++] = l;
				live_pages += l.pages;
			} else {
				/* "full" only when no free extent is large enough */
				assert_true(store_arena_largest_free(a) < l.pages);
				fails++;
				if (store_arena_free_pages(a) >= l.pages)
					frag_fails++;
			}
		} else {
			uint32_t i = (uint32_t)(rnd() % nlive);

			verify(a, &live[i]);
			assert_int_equal(store_arena_free(a, live[i].first), 0);
			live_pages -= live[i].pages;
			live[i] = live[--nlive];
		}
		assert_int_equal(store_arena_free_pages(a), PAGES - live_pages);
		frag_sum += fragmentation(a);
		used_sum += live_pages;
		if (fragmentation(a) > frag_max)
			frag_max = fragmentation(a);
		if (op % 500 == 0) {
			assert_arena_ok(a);
			for (uint32_t i = 0; i < nlive; i++)
				verify(a, &live[i]);
		}
	}
	printf("arena mixed: %d ops, mean use %.3f, %llu failed allocs (%llu with enough free "
	       "pages), fragmentation mean %.3f max %.3f\n", OPS,
	       (double)used_sum / OPS / PAGES, (unsigned long long)fails,
	       (unsigned long long)frag_fails, frag_sum / OPS, frag_max);
	assert_true(frag_max >= 0.0 && frag_max < 1.0);
	/* free all in random order: back to one extent */
	while (nlive) {
		uint32_t i = (uint32_t)(rnd() % nlive);

		verify(a, &live[i]);
		assert_int_equal(store_arena_free(a, live[i].first), 0);
		live[i] = live[--nlive];
	}
	assert_int_equal(store_arena_free_pages(a), PAGES);
	assert_int_equal(store_arena_free_extents(a), 1);
	assert_int_equal(store_arena_largest_free(a), PAGES);
	assert_true(fragmentation(a) == 0.0);
	assert_arena_ok(a);
	store_arena_close(a);
	free(live);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_invalid),
		cmocka_unit_test(test_whole_arena),
		cmocka_unit_test(test_coalesce),
		cmocka_unit_test(test_bad_free),
		cmocka_unit_test(test_fragmentation_figure),
		cmocka_unit_test(test_fit_within_class),
		cmocka_unit_test(test_same_size_fill),
		cmocka_unit_test(test_mixed_random),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
