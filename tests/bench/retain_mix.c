/*
 * retain_mix.c - the retention target of issue 29: a few shared system
 * prompts that every request starts with, beside a scan of one-off long
 * documents of 10x the DRAM arena, with and without retention of the
 * prompts; prints the prompts' prefix-match hit ratio for both.
 *
 *   retain_mix [--dram MiB] [--prompts N] [--prompt-blocks N] [--doc-blocks N]
 *              [--scan-x X] [--gaps LIST] [--json]
 *
 * The pool is storage/ itself (libstore, DRAM only), so the figure is the
 * policy's, not the network's. Blocks are 64 KiB. The workload, per gap G
 * of LIST (MiB of scanned documents between two requests; default
 * 4,16,32,48,64,128):
 *  - a scan writes one-off documents (chains of --doc-blocks blocks, no
 *    block ever seen again, never retained) until --scan-x times the
 *    arena has been written;
 *  - after every G MiB of scan, a request arrives: it picks the next of
 *    --prompts system prompts (round robin; chains of --prompt-blocks
 *    blocks), MATCHes its chain followed by 4 blocks of its own user
 *    text, then PUTs what was missing. With retention the prompt's
 *    blocks are PUT with retain_ms (1 hour) and the MATCH asks retain_ms
 *    too (refresh on hit), as an engine adapter with "retain the first K
 *    blocks" does; the user text is never retained.
 * Hit ratio: prompt blocks matched / prompt blocks asked, over every
 * request but each prompt's first (cold) one.
 *
 * A gap whose prompt reuse distance (prompts x G) is below the arena
 * keeps the prompts under plain LRU too; past it, LRU loses them to the
 * scan and only retention keeps them. The budget is the default, a
 * quarter of the arena; the prompts take an eighth.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "store.h"

#define BLOCK_BYTES (64u << 10)
#define USER_BLOCKS 4u
#define RETAIN_MS 3600000u
#define MAX_CHAIN 1024u

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void make_key(uint64_t id, uint8_t key[STORE_KEY_BYTES])
{
	uint64_t w[4];

	for (int k = 0; k < 4; k++)
		w[k] = mix64(id * 4 + (uint64_t)k + 1);
	memcpy(key, w, sizeof(w));
}

struct opts {
	uint64_t dram_mib;
	uint32_t prompts, prompt_blocks, doc_blocks;
	double scan_x;
	uint64_t gaps[16];
	uint32_t ngaps;
	bool json;
};

struct result {
	uint64_t asked, matched; /* prompt blocks, warm requests only */
	uint64_t requests, refused;
	uint64_t evictions;
	double seconds;
};

static const uint8_t *g_payload; /* one block of bytes, shared by every put */
static uint64_t g_sum;

/* PUT keys[from..n) (chain: each the child of the one before), with
 * retain_ms for the first `retain_n` of them. Counts refusals. */
static void put_chain(struct store *s, uint32_t ns, uint8_t (*keys)[STORE_KEY_BYTES],
		      uint32_t from, uint32_t n, uint32_t retain_n, uint32_t retain_ms,
		      struct result *r)
{
	for (uint32_t i = from; i < n; i++) {
		struct store_retain_res rr;
		struct store_block *b;
		void *dst;
		uint32_t ms = i < retain_n ? retain_ms : 0;
		int rc = store_put_begin(s, ns, keys[i], i ? keys[i - 1] : NULL, 0, BLOCK_BYTES,
					 g_sum, &b, &dst);

		if (rc == -EEXIST) {
			if (ms)
				(void)store_put_retain(s, ns, keys[i], ms, NULL);
			continue;
		}
		if (rc) {
			r->refused++;
			return; /* the rest of the chain has no parent */
		}
		memcpy(dst, g_payload, BLOCK_BYTES);
		rc = store_put_commit_retain(s, b, &g_sum, ms, &rr);
		if (rc && rc != -EEXIST) {
			r->refused++;
			return;
		}
	}
}

/* One request: prompt p's chain and fresh user text. */
static void request(struct store *s, uint32_t ns, const struct opts *o, uint32_t p,
		    uint64_t *next_id, bool retain, bool warm, struct result *r)
{
	uint32_t n = o->prompt_blocks + USER_BLOCKS;
	uint8_t (*keys)[STORE_KEY_BYTES] = malloc(n * sizeof(*keys));
	struct store_match_opts mo = { .retain_ms = retain ? RETAIN_MS : 0 };
	struct store_match_res mr;

	for (uint32_t i = 0; i < o->prompt_blocks; i++)
		make_key(((uint64_t)p << 32) | i, keys[i]);
	for (uint32_t i = o->prompt_blocks; i < n; i++)
		make_key((*next_id)++, keys[i]);
	if (store_match_ex(s, ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, n, &mo, &mr) == 0 &&
	    warm) {
		r->asked += o->prompt_blocks;
		r->matched += mr.matched < o->prompt_blocks ? mr.matched : o->prompt_blocks;
	}
	put_chain(s, ns, keys, mr.matched, n, retain ? o->prompt_blocks : 0, RETAIN_MS, r);
	r->requests++;
	free(keys);
}

/* One run: the whole scan with requests every gap_mib. */
static int run(const struct opts *o, uint64_t gap_mib, bool retain, struct result *r)
{
	uint64_t dram = o->dram_mib << 20, scan = (uint64_t)(o->scan_x * (double)dram);
	struct store_config cfg = {
		.dram_capacity_bytes = dram,
		.max_block_bytes = BLOCK_BYTES,
		.max_retain_ms = 86400000,
		.max_retained_bytes = dram / 4,
	};
	uint8_t (*doc)[STORE_KEY_BYTES] = malloc(o->doc_blocks * sizeof(*doc));
	uint64_t next_id = 1ull << 62, written = 0, since = 0;
	bool *seen = calloc(o->prompts, sizeof(*seen));
	struct store_stats st;
	struct timespec t0, t1;
	struct store *s;
	uint32_t ns, p = 0;
	int rc = store_open(&cfg, &s, NULL, 0);

	if (rc)
		return rc;
	rc = store_namespace_id(s, "mix", 3, &ns);
	if (rc)
		return rc;
	memset(r, 0, sizeof(*r));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (written < scan) {
		for (uint32_t i = 0; i < o->doc_blocks; i++)
			make_key(next_id++, doc[i]);
		put_chain(s, ns, doc, 0, o->doc_blocks, 0, 0, r);
		written += (uint64_t)o->doc_blocks * BLOCK_BYTES;
		since += (uint64_t)o->doc_blocks * BLOCK_BYTES;
		while (since >= gap_mib << 20) {
			since -= gap_mib << 20;
			request(s, ns, o, p, &next_id, retain, seen[p], r);
			seen[p] = true;
			p = (p + 1) % o->prompts;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	store_stats(s, &st);
	r->evictions = st.evictions;
	r->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	store_namespace_release(s, ns);
	store_close(s);
	free(doc);
	free(seen);
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: retain_mix [--dram MiB] [--prompts N] [--prompt-blocks N] "
		"[--doc-blocks N] [--scan-x X] [--gaps MiB,MiB,...] [--json]\n");
	return 2;
}

static int parse(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){ .dram_mib = 256, .prompts = 4, .prompt_blocks = 32,
			    .doc_blocks = 64, .scan_x = 10.0,
			    .gaps = { 4, 16, 32, 48, 64, 128 }, .ngaps = 6 };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		char *end = NULL;

		if (!strcmp(a, "--json")) {
			o->json = true;
			continue;
		}
		if (!v)
			return usage();
		i++;
		if (!strcmp(a, "--dram"))
			o->dram_mib = strtoull(v, &end, 10);
		else if (!strcmp(a, "--prompts"))
			o->prompts = (uint32_t)strtoul(v, &end, 10);
		else if (!strcmp(a, "--prompt-blocks"))
			o->prompt_blocks = (uint32_t)strtoul(v, &end, 10);
		else if (!strcmp(a, "--doc-blocks"))
			o->doc_blocks = (uint32_t)strtoul(v, &end, 10);
		else if (!strcmp(a, "--scan-x"))
			o->scan_x = strtod(v, &end);
		else if (!strcmp(a, "--gaps")) {
			o->ngaps = 0;
			for (char *t = strtok((char *)v, ","); t && o->ngaps < 16; t = strtok(NULL, ","))
				o->gaps[o->ngaps++] = strtoull(t, NULL, 10);
			end = (char *)"";
		} else
			return usage();
		if (!end || *end)
			return usage();
	}
	if (o->dram_mib < 16 || !o->prompts || !o->prompt_blocks || o->prompt_blocks > MAX_CHAIN ||
	    !o->doc_blocks || o->doc_blocks > MAX_CHAIN || o->scan_x <= 0 || !o->ngaps ||
	    (uint64_t)o->prompts * o->prompt_blocks * BLOCK_BYTES > (o->dram_mib << 20) / 4)
		return usage();
	for (uint32_t g = 0; g < o->ngaps; g++)
		if (!o->gaps[g])
			return usage();
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	uint8_t *payload;
	int rc = parse(argc, argv, &o);

	if (rc)
		return rc;
	payload = malloc(BLOCK_BYTES);
	for (uint32_t i = 0; i < BLOCK_BYTES; i++)
		payload[i] = (uint8_t)mix64(i);
	g_payload = payload;
	g_sum = XXH3_64bits(payload, BLOCK_BYTES);
	if (!o.json)
		printf("retain_mix: %llu MiB DRAM, %u prompts x %u blocks of 64 KiB (retained: "
		       "%u MiB, budget %llu MiB), documents of %u blocks, scan %.0fx DRAM\n"
		       "%10s %14s %14s %12s %12s\n",
		       (unsigned long long)o.dram_mib, o.prompts, o.prompt_blocks,
		       o.prompts * o.prompt_blocks / 16, (unsigned long long)o.dram_mib / 4,
		       o.doc_blocks, o.scan_x, "gap MiB", "hit retained", "hit plain",
		       "requests", "reuse/DRAM");
	else
		printf("{\"dram_mib\":%llu,\"prompts\":%u,\"prompt_blocks\":%u,\"scan_x\":%.1f,"
		       "\"gaps\":[", (unsigned long long)o.dram_mib, o.prompts, o.prompt_blocks,
		       o.scan_x);
	for (uint32_t g = 0; g < o.ngaps; g++) {
		struct result with, without;

		if (run(&o, o.gaps[g], true, &with) || run(&o, o.gaps[g], false, &without)) {
			fprintf(stderr, "retain_mix: could not open a pool of %llu MiB\n",
				(unsigned long long)o.dram_mib);
			return 1;
		}
		if (!o.json)
			printf("%10llu %14.4f %14.4f %12llu %12.2f\n",
			       (unsigned long long)o.gaps[g],
			       with.asked ? (double)with.matched / (double)with.asked : 0.0,
			       without.asked ? (double)without.matched / (double)without.asked : 0.0,
			       (unsigned long long)with.requests,
			       (double)(o.gaps[g] * o.prompts) / (double)o.dram_mib);
		else
			printf("%s{\"gap_mib\":%llu,\"hit_retained\":%.4f,\"hit_plain\":%.4f,"
			       "\"requests\":%llu,\"refused_puts\":%llu}",
			       g ? "," : "", (unsigned long long)o.gaps[g],
			       with.asked ? (double)with.matched / (double)with.asked : 0.0,
			       without.asked ? (double)without.matched / (double)without.asked : 0.0,
			       (unsigned long long)with.requests,
			       (unsigned long long)(with.refused + without.refused));
	}
	if (o.json)
		printf("]}\n");
	free(payload);
	return 0;
}
