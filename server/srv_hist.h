/*
 * srv_hist.h - a log-bucketed latency histogram (microseconds).
 *
 * Values below 16 have a bucket each; above, every power of two is split
 * into 16 buckets, so a reported percentile is at most 1/16 (6.25%) above
 * the true value. Values of 2^40 us (~12 days) and more share the last
 * bucket.
 *
 * Threads: one writer per histogram (its worker thread) and any number of
 * readers. Fields are read and written with relaxed atomics, so a reader
 * summing another thread's histogram sees each counter whole, though not
 * a consistent snapshot across counters.
 */
#ifndef KVPOOL_SRV_HIST_H
#define KVPOOL_SRV_HIST_H

#include <stdint.h>

#define SRV_HIST_SUB_BITS 4
#define SRV_HIST_MAX_EXP 40
/* 16 exact buckets, 16 per power of two from 2^4 to 2^39, one overflow. */
#define SRV_HIST_BUCKETS ((1u << SRV_HIST_SUB_BITS) * (SRV_HIST_MAX_EXP - SRV_HIST_SUB_BITS + 1) + 1)

struct srv_hist {
	uint64_t buckets[SRV_HIST_BUCKETS];
	uint64_t count;
	uint64_t max_us;
	uint64_t sum_us;              /* of every value recorded (Prometheus _sum) */
};

/* Bucket index of value_us. Cannot fail. */
unsigned srv_hist_bucket(uint64_t value_us);

/* Largest value that falls into bucket `index` (index < SRV_HIST_BUCKETS). */
uint64_t srv_hist_bucket_max(unsigned index);

/* Count one value. Only the owning thread may call it. */
void srv_hist_record(struct srv_hist *h, uint64_t value_us);

/* Add every counter of src to dst. dst must be private to the caller; src
 * may be written concurrently by its owner. */
void srv_hist_merge(struct srv_hist *dst, const struct srv_hist *src);

/* The value at quantile q (0 < q <= 1, e.g. 0.999) of a private histogram
 * (e.g. one filled by srv_hist_merge): the upper bound of the
 * bucket holding the ceil(q * count)-th smallest value, capped at the
 * largest value recorded. 0 when the histogram is empty. */
uint64_t srv_hist_percentile(const struct srv_hist *h, double q);

#endif /* KVPOOL_SRV_HIST_H */
