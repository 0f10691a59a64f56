/*
 * index_bytes.c - index memory per block: store N blocks (default one
 * million) in a pool and divide what the index holds by N.
 *
 *   index_bytes [N] [--chain LEN] [--aging]
 *
 * Blocks are 1 byte each (one 4 KiB arena page, never written: the arena
 * is reserved, not touched), so a million fit in a 4 GiB arena of virtual
 * memory. With --chain LEN the blocks form chains of LEN (each the child
 * of the one before), which exercises the parent links; without, they are
 * all first blocks.
 *
 * Prints three figures, and the same as one JSON line:
 *  - the store's own count (store_stats.index_bytes, which adds up the
 *    sizes of its tables and block header chunks), per block;
 *  - the malloc heap the pool allocated while the blocks went in
 *    (mallinfo2: tables and their allocator overhead; block headers come
 *    from the store's own mapped chunks, not from malloc), per block;
 *  - the process's resident memory growth meanwhile (VmRSS: everything
 *    touched, headers and tables alike; the arena's pages never are), per
 *    block.
 *
 * With --aging it also times the pass that halves every header's use
 * count when the 32-bit use clock is about to wrap (storage/block.h):
 * the clock is moved to UINT32_MAX and a MATCH of one block, which runs
 * the pass, is timed; the best of 5 is printed, and added to the JSON as
 * aging_pass_ms.
 */
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "store.h"
#include "debug/store_debug.h"

#define AGING_RUNS 5

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A well-mixed, distinct key for block i. */
static void make_key(uint64_t i, uint8_t key[STORE_KEY_BYTES])
{
	uint64_t w[4];

	for (int k = 0; k < 4; k++)
		w[k] = mix64(i * 4 + (uint64_t)k + 1);
	memcpy(key, w, sizeof(w));
}

/* Resident bytes of this process outside the pool's arena (whose pages
 * the checksum reads may fault in), from /proc/self/smaps; 0 if unreadable. */
static uint64_t resident_bytes(struct store *s)
{
	unsigned long long start = 0, end = 0, kb;
	uint64_t total = 0, arena_bytes;
	char line[512];
	bool in_arena = false;
	void *base;
	FILE *f = fopen("/proc/self/smaps", "r");

	if (!f)
		return 0;
	store_arena_region(s, &base, &arena_bytes);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx-%llx ", &start, &end) == 2) { /* a mapping's first line */
			in_arena = start < (uintptr_t)base + arena_bytes && end > (uintptr_t)base;
			continue;
		}
		if (!in_arena && sscanf(line, "Rss: %llu kB", &kb) == 1)
			total += (uint64_t)kb * 1024;
	}
	fclose(f);
	return total;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Milliseconds of the fastest of AGING_RUNS aging passes over the pool
 * (each: the clock at UINT32_MAX, then one MATCH of block 0), or a
 * negative -errno. */
static double time_aging_ms(struct store *s, uint32_t ns)
{
	uint8_t key[1][STORE_KEY_BYTES];
	double best = -1;

	make_key(0, key[0]);
	for (int r = 0; r < AGING_RUNS; r++) {
		uint32_t matched = 0, clock, epoch;
		double t0, ms;
		int rc = store_debug_clock_set(s, UINT32_MAX);

		if (!rc)
			rc = store_match(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])key, 1, 0, NULL,
					 &matched, NULL);
		/* the first MATCH above only warms up; time the next pass */
		if (!rc)
			rc = store_debug_clock_set(s, UINT32_MAX);
		if (rc)
			return rc;
		t0 = now_s();
		rc = store_match(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])key, 1, 0, NULL,
				 &matched, NULL);
		ms = (now_s() - t0) * 1e3;
		store_debug_clock(s, &clock, &epoch);
		if (rc || matched != 1 || clock > UINT32_MAX / 2 + 1)
			return rc ? rc : -EPROTO;
		if (best < 0 || ms < best)
			best = ms;
	}
	return best;
}

/* Store block i (parent: block i-1 when chained). Returns 0 or -errno. */
static int put_one(struct store *s, uint32_t ns, uint64_t i, uint64_t chain, uint64_t checksum)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	bool has_parent = chain > 1 && i % chain != 0;
	struct store_block *b;
	void *dst;
	int rc;

	make_key(i, key);
	if (has_parent)
		make_key(i - 1, parent);
	rc = store_put_begin(s, ns, key, has_parent ? parent : NULL, 0, 1, checksum, &b, &dst);
	if (rc)
		return rc;
	return store_put_commit(s, b);
}

int main(int argc, char **argv)
{
	uint64_t n = 1000000, chain = 1, checksum;
	struct store_config cfg = { .max_block_bytes = 4096, .max_lease_ms = 1000 };
	struct store_stats empty, full;
	struct mallinfo2 m0, m1;
	uint64_t rss0, rss1;
	double heap, rss, aging_ms = -1;
	bool aging = false;
	struct store *s;
	uint8_t zero = 0;
	uint32_t ns;
	double t0, t1;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--chain") && i + 1 < argc)
			chain = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--aging"))
			aging = true;
		else
			n = strtoull(argv[i], NULL, 10);
	}
	if (!n || !chain) {
		fprintf(stderr, "usage: index_bytes [N] [--chain LEN] [--aging]\n");
		return 2;
	}
	cfg.dram_capacity_bytes = (n + 1024) * STORE_PAGE_BYTES;
	rc = store_open(&cfg, &s, NULL, 0);
	if (!rc)
		rc = store_namespace_id(s, "index-bytes", 11, &ns);
	if (rc) {
		fprintf(stderr, "index_bytes: cannot open the pool: %s\n", strerror(-rc));
		return 1;
	}
	store_stats(s, &empty);
	m0 = mallinfo2();
	rss0 = resident_bytes(s);
	checksum = XXH3_64bits(&zero, 1); /* an untouched arena page reads as zeros */
	t0 = now_s();
	for (uint64_t i = 0; i < n; i++) {
		rc = put_one(s, ns, i, chain, checksum);
		if (rc) {
			fprintf(stderr, "index_bytes: block %llu: %s\n", (unsigned long long)i,
				strerror(-rc));
			return 1;
		}
	}
	t1 = now_s();
	store_stats(s, &full);
	m1 = mallinfo2();
	rss1 = resident_bytes(s);
	if (aging) {
		aging_ms = time_aging_ms(s, ns);
		if (aging_ms < 0) {
			fprintf(stderr, "index_bytes: aging pass: %s\n", strerror((int)-aging_ms));
			return 1;
		}
	}
	heap = (double)(m1.uordblks + m1.hblkhd - m0.uordblks - m0.hblkhd) / (double)full.blocks;
	rss = (double)(rss1 - rss0) / (double)full.blocks;
	printf("blocks %llu (chains of %llu): store index_bytes %llu = %.1f bytes/block "
	       "(empty pool %llu); malloc heap %.1f bytes/block; resident %.1f bytes/block; "
	       "%.0f puts/s\n",
	       (unsigned long long)full.blocks, (unsigned long long)chain,
	       (unsigned long long)full.index_bytes,
	       (double)(full.index_bytes - empty.index_bytes) / (double)full.blocks,
	       (unsigned long long)empty.index_bytes, heap, rss, (double)n / (t1 - t0));
	if (aging)
		printf("aging pass (halve every use count) over %llu blocks: %.2f ms (best of %d)\n",
		       (unsigned long long)full.blocks, aging_ms, AGING_RUNS);
	printf("{\"blocks\":%llu,\"chain\":%llu,\"index_bytes\":%llu,\"index_bytes_empty\":%llu,"
	       "\"index_bytes_per_block\":%.1f,\"heap_bytes_per_block\":%.1f,"
	       "\"resident_bytes_per_block\":%.1f",
	       (unsigned long long)full.blocks, (unsigned long long)chain,
	       (unsigned long long)full.index_bytes, (unsigned long long)empty.index_bytes,
	       (double)(full.index_bytes - empty.index_bytes) / (double)full.blocks, heap, rss);
	if (aging)
		printf(",\"aging_pass_ms\":%.2f", aging_ms);
	printf("}\n");
	store_close(s);
	return 0;
}
