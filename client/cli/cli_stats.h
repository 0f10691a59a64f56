/*
 * cli_stats.h - reading the server's STATS document (JSON; keys in
 * proto/PROTOCOL.md).
 */
#ifndef KVPOOL_CLI_STATS_H
#define KVPOOL_CLI_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "kvpool.h"

/* The counters `kvpool replay` compares before and after a run. */
struct cli_stats_counters {
	uint64_t ns_get_hits;   /* namespaces.<ns>.get_hits (0: namespace absent) */
	uint64_t evictions;     /* evictions, whole server */
};

/* Pick the replay counters for namespace `ns` out of STATS JSON text.
 * Pure. Returns 0, or -EPROTO (not JSON, or "evictions" missing or not a
 * count). *out is written only on success. */
int cli_stats_parse_counters(const char *json, const char *ns, struct cli_stats_counters *out);

/* Ask the server for STATS of namespace `ns` and pick the replay counters.
 * Blocks like every library call. Returns 0, -EPROTO (a document without
 * the counters) or the library's errors (see kvpool_stats). */
int cli_stats_counters(struct kvpool_client *c, const char *ns, struct cli_stats_counters *out);

/* Write the human report of STATS JSON text to f: server, tiers (the
 * NVMe row and its activity only when tiers.nvme.enabled), operations,
 * latency, namespaces. A missing figure shows as "-". Returns 0, or
 * -EPROTO when json is not JSON (nothing written). */
int cli_stats_report(FILE *f, const char *json);

/* For a cluster handle's STATS JSON text: one line per node to f
 * ("  NAME  up" or "  NAME  DOWN: reason"), each after `indent`. Returns
 * how many nodes are not up (0: all answered), or -EPROTO when json is
 * not a cluster's document (nothing written). */
int cli_cluster_nodes_report(FILE *f, const char *json, const char *indent);

/* Of a cluster handle's STATS document json, write to f (may be NULL:
 * only count) one line per node that did not answer or refused ("NAME
 * why"), each after indent. Returns how many; 0 for a document without a
 * "cluster" object (one node) or that is not JSON. */
int cli_cluster_down_report(FILE *f, const char *json, const char *indent);

#endif /* KVPOOL_CLI_STATS_H */
