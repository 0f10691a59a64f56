/*
 * srv_hist.c - log-bucketed latency histogram.
 */
#include "srv_hist.h"

#include <math.h>

#define SUB (1u << SRV_HIST_SUB_BITS)

/* Relaxed atomic access: the single writer never needs a locked add. */
static inline uint64_t load(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void store(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

unsigned srv_hist_bucket(uint64_t value_us)
{
	unsigned exp, sub;

	if (value_us < SUB)
		return (unsigned)value_us;
	exp = 63u - (unsigned)__builtin_clzll(value_us);
	if (exp >= SRV_HIST_MAX_EXP)
		return SRV_HIST_BUCKETS - 1;
	sub = (unsigned)(value_us >> (exp - SRV_HIST_SUB_BITS)) & (SUB - 1);
	return SUB + (exp - SRV_HIST_SUB_BITS) * SUB + sub;
}

uint64_t srv_hist_bucket_max(unsigned index)
{
	unsigned exp, sub;
	uint64_t width;

	if (index < SUB)
		return index;
	if (index >= SRV_HIST_BUCKETS - 1)
		return UINT64_MAX;
	exp = (index - SUB) / SUB + SRV_HIST_SUB_BITS;
	sub = (index - SUB) % SUB;
	width = 1ull << (exp - SRV_HIST_SUB_BITS);
	return (SUB + sub) * width + width - 1;
}

void srv_hist_record(struct srv_hist *h, uint64_t value_us)
{
	unsigned b = srv_hist_bucket(value_us);

	store(&h->buckets[b], load(&h->buckets[b]) + 1);
	store(&h->count, load(&h->count) + 1);
	store(&h->sum_us, load(&h->sum_us) + value_us);
	if (value_us > load(&h->max_us))
		store(&h->max_us, value_us);
}

void srv_hist_merge(struct srv_hist *dst, const struct srv_hist *src)
{
	uint64_t count = 0, m;

	for (unsigned i = 0; i < SRV_HIST_BUCKETS; i++) {
		uint64_t v = load(&src->buckets[i]);

		dst->buckets[i] += v;
		count += v;
	}
	/* Count from the buckets, so the total matches what was summed even
	 * while the owner keeps recording. */
	dst->count += count;
	dst->sum_us += load(&src->sum_us);
	m = load(&src->max_us);
	if (m > dst->max_us)
		dst->max_us = m;
}

uint64_t srv_hist_percentile(const struct srv_hist *h, double q)
{
	uint64_t count = h->count, rank, seen = 0;

	if (count == 0)
		return 0;
	if (!(q > 0))
		q = 0;
	if (q > 1)
		q = 1;
	rank = (uint64_t)ceil(q * (double)count);
	if (rank == 0)
		rank = 1;
	if (rank > count)
		rank = count;
	for (unsigned i = 0; i < SRV_HIST_BUCKETS; i++) {
		seen += h->buckets[i];
		if (seen >= rank) {
			uint64_t v = srv_hist_bucket_max(i);

			return v < h->max_us ? v : h->max_us;
		}
	}
	return h->max_us;
}
