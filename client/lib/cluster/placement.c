/*
 * placement.c - per-block rendezvous owners, hot copies and the fallback
 * epoch (placement.h).
 */
#include "placement.h"

#include <errno.h>
#include <string.h>

#include "lib/hrw.h"

#define SHARE_SAMPLES 10000

int kvcl_place_init(struct kvcl_place *pl, uint32_t replicas, uint32_t hot_children,
		    uint64_t fallback_ms)
{
	memset(pl, 0, sizeof(*pl));
	if (replicas < 1 || replicas > KVCL_MAX_REPLICAS)
		return -EINVAL;
	pl->replicas = replicas;
	pl->fallback_ms = fallback_ms;
	return kvcl_hot_init(&pl->hot, replicas > 1 ? hot_children : 0);
}

void kvcl_place_free(struct kvcl_place *pl)
{
	kvcl_hot_free(&pl->hot);
}

/* The first call of a handle: members that registered less than
 * fallback_ms ago beside older ones are a change this handle did not see;
 * the older usable members become the previous view. */
static void inherit_epoch(struct kvcl_place *pl, const struct kvcl_view *v, uint64_t now_ms)
{
	uint64_t youngest = UINT64_MAX;
	size_t n_old = 0, n_young = 0;

	for (size_t j = 0; j < v->n; j++) {
		if (!v->up[j])
			continue;
		if (v->age_ms[j] < pl->fallback_ms) {
			n_young++;
			youngest = v->age_ms[j] < youngest ? v->age_ms[j] : youngest;
			continue;
		}
		pl->prev[n_old] = v->node[j];
		pl->prev_seed[n_old] = v->seed[j];
		pl->prev_name[n_old] = v->name[j];
		n_old++;
	}
	if (!n_young || !n_old)
		return;
	pl->n_prev = n_old;
	pl->fallback = 1;
	pl->fallback_until_ms = now_ms + (pl->fallback_ms - youngest);
	pl->epoch_asked = pl->epoch_only_prev = 0;
}

void kvcl_place_observe(struct kvcl_place *pl, const struct kvcl_view *v, uint64_t now_ms)
{
	struct kvcl_node *cur[KVCL_MAX_NODES];
	uint64_t seed[KVCL_MAX_NODES];
	const char *name[KVCL_MAX_NODES];
	size_t n = 0;
	int same;

	for (size_t j = 0; j < v->n; j++)
		if (v->up[j]) {
			seed[n] = v->seed[j];
			name[n] = v->name[j];
			cur[n++] = v->node[j];
		}
	same = pl->have_last && n == pl->n_last;
	for (size_t i = 0; same && i < n; i++) {
		size_t k = 0;

		while (k < pl->n_last && pl->last[k] != cur[i])
			k++;
		same = k < pl->n_last;
	}
	if (!same && pl->have_last) {
		pl->changes++;
		memcpy(pl->prev, pl->last, pl->n_last * sizeof(pl->last[0]));
		memcpy(pl->prev_seed, pl->last_seed, pl->n_last * sizeof(pl->last_seed[0]));
		memcpy(pl->prev_name, pl->last_name, pl->n_last * sizeof(pl->last_name[0]));
		pl->n_prev = pl->n_last;
		pl->fallback = pl->n_prev > 0 && pl->fallback_ms > 0;
		pl->fallback_until_ms = now_ms + pl->fallback_ms;
		pl->epoch_asked = pl->epoch_only_prev = 0;
	}
	if (!pl->have_last && pl->fallback_ms > 0)
		inherit_epoch(pl, v, now_ms);
	if (!same) {
		memcpy(pl->last, cur, n * sizeof(cur[0]));
		memcpy(pl->last_seed, seed, n * sizeof(seed[0]));
		memcpy(pl->last_name, name, n * sizeof(name[0]));
		pl->n_last = n;
		pl->have_last = 1;
	}
	if (pl->fallback && now_ms >= pl->fallback_until_ms)
		pl->fallback = 0;
}

int kvcl_place_in_epoch(const struct kvcl_place *pl)
{
	return pl->fallback;
}

size_t kvcl_place_owners(const struct kvcl_place *pl, const struct kvcl_view *v,
			 const uint8_t *key, int hot, size_t *out)
{
	return kvc_hrw_rank(key, v->seed, v->name, v->up, v->n, out, hot ? pl->replicas : 1);
}

size_t kvcl_place_ranked(const struct kvcl_view *v, const uint8_t *key, size_t k, size_t *out)
{
	return kvc_hrw_rank(key, v->seed, v->name, NULL, v->n, out, k);
}

size_t kvcl_place_prev_owners(const struct kvcl_place *pl, const struct kvcl_view *v,
			      const uint8_t *key, int hot, const size_t *cur, size_t n_cur,
			      size_t *out)
{
	size_t rank[KVCL_MAX_REPLICAS], got, n = 0;

	if (!pl->fallback)
		return 0;
	got = kvc_hrw_rank(key, pl->prev_seed, pl->prev_name, NULL, pl->n_prev, rank,
			   hot ? pl->replicas : 1);
	for (size_t r = 0; r < got; r++) {
		struct kvcl_node *node = pl->prev[rank[r]];

		for (size_t j = 0; j < v->n; j++) {
			int mine = 0;

			if (v->node[j] != node || !v->up[j])
				continue;
			for (size_t c = 0; c < n_cur; c++)
				mine |= cur[c] == j;
			if (!mine)
				out[n++] = j;
		}
	}
	return n;
}

void kvcl_place_epoch_note(struct kvcl_place *pl, uint64_t asked, uint64_t only_prev)
{
	if (!pl->fallback)
		return;
	pl->epoch_asked += asked;
	pl->epoch_only_prev += only_prev;
	if (pl->epoch_asked >= KVCL_WARM_SAMPLE) {
		/* warm: the new owners answer nearly everything themselves */
		if (pl->epoch_only_prev * 100 < pl->epoch_asked)
			pl->fallback = 0;
		pl->epoch_asked = pl->epoch_only_prev = 0;
	}
}

void kvcl_place_shares(const struct kvcl_place *pl, const struct kvcl_view *v, double *share)
{
	size_t cnt[KVCL_MAX_NODES] = { 0 };

	for (uint64_t i = 0; i < SHARE_SAMPLES && v->n_up; i++) {
		uint8_t key[KVPOOL_KEY_BYTES] = { 0 };
		uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ULL;
		size_t o;

		x ^= x >> 31;
		x *= 0xbf58476d1ce4e5b9ULL;
		x ^= x >> 29;
		memcpy(key, &x, sizeof(x));
		if (kvcl_place_owners(pl, v, key, 0, &o))
			cnt[o]++;
	}
	for (size_t j = 0; j < v->n; j++)
		share[j] = v->n_up ? (double)cnt[j] / SHARE_SAMPLES : 0;
}
