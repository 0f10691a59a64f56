/*
 * hot.c - the hot-block table of a cluster handle (see hot.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hot.h"

struct kvcl_hot_ent {
	uint64_t key;                  /* 0: empty (a key folding to 0 is stored as 1) */
	uint16_t kids[KVCL_HOT_KIDS];  /* fingerprints of the last children seen */
	uint16_t n_kids;               /* distinct children counted (saturating) */
	uint8_t hot;
	uint8_t next_kid;              /* ring position in kids[] */
	uint32_t stamp;                /* last touched */
};

_Static_assert(sizeof(struct kvcl_hot_ent) == 32, "hot entries are 32 bytes");

/* The key's identity in the table: two of its words (keys are hashes). */
static uint64_t fold(const uint8_t *k)
{
	uint64_t a, b;

	memcpy(&a, k, 8);
	memcpy(&b, k + 8, 8);
	a ^= b * 0x9e3779b97f4a7c15ULL;
	return a ? a : 1;
}

static uint16_t fp16(const uint8_t *k)
{
	uint16_t v;

	memcpy(&v, k + 16, 2);
	return v ? v : 1;
}

int kvcl_hot_init(struct kvcl_hot *h, uint32_t threshold)
{
	memset(h, 0, sizeof(*h));
	h->ent = calloc(KVCL_HOT_SLOTS, sizeof(*h->ent));
	if (!h->ent)
		return -ENOMEM;
	h->threshold = threshold;
	return 0;
}

void kvcl_hot_free(struct kvcl_hot *h)
{
	free(h->ent);
	h->ent = NULL;
}

static struct kvcl_hot_ent *set_of(const struct kvcl_hot *h, uint64_t f)
{
	return &h->ent[(f >> 7) % (KVCL_HOT_SLOTS / KVCL_HOT_WAYS) * KVCL_HOT_WAYS];
}

static const struct kvcl_hot_ent *find(const struct kvcl_hot *h, const uint8_t *key)
{
	uint64_t f = fold(key);
	const struct kvcl_hot_ent *s = set_of(h, f);

	for (size_t w = 0; w < KVCL_HOT_WAYS; w++)
		if (s[w].key == f)
			return &s[w];
	return NULL;
}

/* The entry of key, made (replacing the least recently touched of its
 * set) when absent. */
static struct kvcl_hot_ent *get(struct kvcl_hot *h, const uint8_t *key)
{
	uint64_t f = fold(key);
	struct kvcl_hot_ent *s = set_of(h, f), *victim = &s[0];

	if (++h->clock == 0) { /* wrapped: every age starts again */
		for (size_t i = 0; i < KVCL_HOT_SLOTS; i++)
			h->ent[i].stamp = 0;
		h->clock = 1;
	}
	for (size_t w = 0; w < KVCL_HOT_WAYS; w++) {
		if (s[w].key == f) {
			s[w].stamp = h->clock;
			return &s[w];
		}
		if (!s[w].key || s[w].stamp < victim->stamp)
			victim = &s[w];
		if (!victim->key)
			break;
	}
	memset(victim, 0, sizeof(*victim));
	victim->key = f;
	victim->stamp = h->clock;
	return victim;
}

static void add_kid(struct kvcl_hot_ent *e, uint16_t kid)
{
	for (size_t i = 0; i < KVCL_HOT_KIDS; i++)
		if (e->kids[i] == kid)
			return;
	e->kids[e->next_kid] = kid;
	e->next_kid = (uint8_t)((e->next_kid + 1) % KVCL_HOT_KIDS);
	if (e->n_kids < UINT16_MAX)
		e->n_kids++;
}

size_t kvcl_hot_learn(struct kvcl_hot *h, const uint8_t (*chain)[KVPOOL_KEY_BYTES], size_t n)
{
	size_t hot_to = 0; /* one past the last hot key */

	if (!h->ent || !h->threshold)
		return 0;
	for (size_t i = 0; i < n; i++) {
		struct kvcl_hot_ent *e;

		if (i + 1 == n) {
			/* the chain's last key: no child here, only its mark */
			const struct kvcl_hot_ent *c = find(h, chain[i]);

			if (c && c->hot)
				hot_to = n;
			break;
		}
		e = get(h, chain[i]);
		add_kid(e, fp16(chain[i + 1]));
		if (e->hot || e->n_kids >= h->threshold)
			hot_to = i + 1;
	}
	for (size_t i = 0; i < hot_to; i++) {
		struct kvcl_hot_ent *e = get(h, chain[i]);

		if (!e->hot) {
			e->hot = 1;
			h->marked++;
		}
	}
	return hot_to;
}

int kvcl_hot_is(const struct kvcl_hot *h, const uint8_t key[KVPOOL_KEY_BYTES])
{
	const struct kvcl_hot_ent *e = h->ent ? find(h, key) : NULL;

	return e && e->hot;
}

uint32_t kvcl_hot_children(const struct kvcl_hot *h, const uint8_t key[KVPOOL_KEY_BYTES])
{
	const struct kvcl_hot_ent *e = h->ent ? find(h, key) : NULL;

	return e ? e->n_kids : 0;
}
