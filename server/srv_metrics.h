/*
 * srv_metrics.h - the STATS figures in the Prometheus text exposition
 * format (version 0.0.4), served by the admin HTTP server at /metrics.
 *
 * Every family has HELP and TYPE lines and a kvpool_ name with its unit
 * (_bytes, _seconds, _ratio) and _total on counters. Per-namespace series
 * carry a `namespace` label; tiers a `tier` label; request latency is one
 * histogram per operation (label `op`). docs/operating.md ("Metrics")
 * lists every family.
 */
#ifndef KVPOOL_SRV_METRICS_H
#define KVPOOL_SRV_METRICS_H

#include <stdint.h>

#include "srv_stats.h"

struct evbuffer;

/* Content-Type of the text /metrics returns. */
#define SRV_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Upper bounds (le) of the latency histogram buckets, in microseconds:
 * powers of two from 8 us to 2^24 us (~16.8 s), then +Inf. Powers of two
 * are bucket edges of struct srv_hist, so each cumulative count is exact. */
#define SRV_METRICS_LE_MIN_SHIFT 3
#define SRV_METRICS_LE_MAX_SHIFT 24

/* Count of the values recorded in h that are below bound_us (a bucket of
 * h counts when its largest value is below bound_us). Pure. */
uint64_t srv_metrics_hist_below(const struct srv_hist *h, uint64_t bound_us);

/* Append every metric of doc to out (see docs/operating.md, "Metrics", for the list).
 * Namespace names are escaped as Prometheus label values. Pure apart from
 * writing out. Errors: -ENOMEM (the evbuffer could not grow; out may hold
 * part of the text). */
int srv_metrics_write(const struct srv_stats_doc *doc, struct evbuffer *out);

#endif /* KVPOOL_SRV_METRICS_H */
