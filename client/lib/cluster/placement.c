/*
 * placement.c - chain positions and HRW segment owners (placement.h).
 */
#include "placement.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/hrw.h"

#define SHARE_SAMPLES 10000

struct kvcl_pos {
	uint8_t key[KVPOOL_KEY_BYTES];
	uint8_t run[KVPOOL_KEY_BYTES];
	uint32_t pos;
	uint32_t stamp;          /* 0: empty; else when last written (newer is larger) */
};

int kvcl_place_init(struct kvcl_place *pl)
{
	pl->segment_blocks = KVPOOL_SEGMENT_BLOCKS;
	pl->pos = calloc(KVCL_POS_SLOTS, sizeof(*pl->pos));
	return pl->pos ? 0 : -ENOMEM;
}

void kvcl_place_free(struct kvcl_place *pl)
{
	free(pl->pos);
	pl->pos = NULL;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static int key_is_zero(const uint8_t *k)
{
	static const uint8_t zero[KVPOOL_KEY_BYTES];

	return !k || memcmp(k, zero, KVPOOL_KEY_BYTES) == 0;
}

/* The table is set-associative: KVCL_POS_WAYS entries per set, the
 * oldest written one replaced, so a key just learned survives the rest
 * of its call and the next ones. */
static struct kvcl_pos *pos_set(const struct kvcl_place *pl, const uint8_t *key)
{
	size_t set = (le64(key) ^ le64(key + 8)) & (KVCL_POS_SLOTS / KVCL_POS_WAYS - 1);

	return &pl->pos[set * KVCL_POS_WAYS];
}

static void pos_put(struct kvcl_place *pl, const uint8_t *key, uint32_t pos, const uint8_t *run)
{
	struct kvcl_pos *set = pos_set(pl, key), *p = &set[0];

	for (size_t w = 0; w < KVCL_POS_WAYS; w++) {
		if (set[w].stamp && memcmp(set[w].key, key, KVPOOL_KEY_BYTES) == 0) {
			p = &set[w];
			break;
		}
		if (set[w].stamp < p->stamp)
			p = &set[w];
	}
	if (++pl->clock == 0) { /* wrapped: forget every age */
		for (size_t i = 0; i < KVCL_POS_SLOTS; i++)
			pl->pos[i].stamp = pl->pos[i].stamp ? 1 : 0;
		pl->clock = 2;
	}
	memmove(p->run, run, KVPOOL_KEY_BYTES);
	memcpy(p->key, key, KVPOOL_KEY_BYTES);
	p->pos = pos;
	p->stamp = pl->clock;
}

static const struct kvcl_pos *pos_get(const struct kvcl_place *pl, const uint8_t *key)
{
	const struct kvcl_pos *set = pos_set(pl, key);

	for (size_t w = 0; w < KVCL_POS_WAYS; w++)
		if (set[w].stamp && memcmp(set[w].key, key, KVPOOL_KEY_BYTES) == 0)
			return &set[w];
	return NULL;
}

void kvcl_place_chain_loc(const struct kvcl_place *pl, const uint8_t (*chain)[KVPOOL_KEY_BYTES],
			  size_t i, struct kvcl_loc *out)
{
	out->pos = (uint32_t)i;
	memcpy(out->run, chain[i - i % pl->segment_blocks], KVPOOL_KEY_BYTES);
}

void kvcl_place_learn_chain(struct kvcl_place *pl, const uint8_t (*chain)[KVPOOL_KEY_BYTES],
			    size_t count)
{
	const size_t D = pl->segment_blocks;

	for (size_t i = 0; i < count; i++)
		pos_put(pl, chain[i], (uint32_t)i, chain[i - i % D]);
}

int kvcl_place_put(struct kvcl_place *pl, const uint8_t *key, const uint8_t *parent,
		   struct kvcl_loc *out)
{
	const struct kvcl_pos *pp = NULL;

	out->pos = 0;
	if (!key_is_zero(parent)) {
		pp = pos_get(pl, parent);
		if (!pp) {
			pl->unplaced++; /* unplaced: its parent's place is unknown */
			return -ENOLINK;
		}
		out->pos = pp->pos + 1;
	}
	/* copied first: pos_put below may take pp's slot */
	memcpy(out->run, out->pos % pl->segment_blocks && pp ? pp->run : key, KVPOOL_KEY_BYTES);
	pos_put(pl, key, out->pos, out->run);
	return 0;
}

int kvcl_place_find(struct kvcl_place *pl, const uint8_t *key, struct kvcl_loc *out)
{
	const struct kvcl_pos *p = pos_get(pl, key);

	if (!p) {
		pl->unplaced++;
		return -ENOENT;
	}
	out->pos = p->pos;
	memcpy(out->run, p->run, KVPOOL_KEY_BYTES);
	return 0;
}

int kvcl_place_starts_run(const struct kvcl_place *pl, const struct kvcl_loc *loc)
{
	return loc->pos % pl->segment_blocks == 0;
}

int kvcl_place_owner(const struct kvcl_place *pl, const struct kvcl_view *v,
		     const struct kvcl_loc *loc)
{
	(void)pl;
	return kvc_hrw_owner(loc->run, v->seed, v->name, NULL, v->n);
}

void kvcl_place_shares(const struct kvcl_place *pl, const struct kvcl_view *v, double *share)
{
	size_t cnt[KVCL_MAX_NODES] = { 0 };
	struct kvcl_loc loc = { .pos = 0 };

	for (uint64_t i = 0; i < SHARE_SAMPLES && v->n; i++) {
		uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL;

		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ULL;
		x ^= x >> 29;
		memset(loc.run, 0, sizeof(loc.run));
		memcpy(loc.run, &x, sizeof(x));
		cnt[kvcl_place_owner(pl, v, &loc)]++;
	}
	for (size_t j = 0; j < v->n; j++)
		share[j] = (double)cnt[j] / SHARE_SAMPLES;
}
