/*
 * replay.h - what `kvpool replay` measures and how it reports it. Shared by
 * cli_replay.c (the run) and replay_report.c (the report).
 */
#ifndef KVPOOL_CLI_REPLAY_H
#define KVPOOL_CLI_REPLAY_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* Operations whose latency is measured, one call each. */
enum cli_replay_op {
	CLI_REPLAY_MATCH,
	CLI_REPLAY_GET,
	CLI_REPLAY_PUT,
	CLI_REPLAY_NOPS,
};

/* Latency samples of one operation, in microseconds. */
struct cli_lat {
	uint32_t *us;   /* malloc'd */
	size_t n, cap;
};

/* Record one sample (clamped to UINT32_MAX us). Returns 0 or -ENOMEM. */
int cli_lat_add(struct cli_lat *l, uint64_t us);

/* Append every sample of `from` to `into`. Returns 0 or -ENOMEM. */
int cli_lat_merge(struct cli_lat *into, const struct cli_lat *from);

/* The p-quantile (0 < p <= 1, nearest rank) of the samples in
 * microseconds; 0 when there are none. Sorts l->us in place. */
uint64_t cli_lat_quantile(struct cli_lat *l, double p);

/* Free the samples. Accepts NULL. */
void cli_lat_release(struct cli_lat *l);

/* CLOCK_MONOTONIC now (kvpool replay and kvpool bench time with it). */
struct timespec cli_now(void);

/* Record the microseconds from t0 (a cli_now) to now as one sample.
 * Returns 0 or -ENOMEM. */
int cli_lat_since(struct cli_lat *l, struct timespec t0);

/* Evaluate `call` (an int expression: a libkvpool call), record how long
 * it took in *lat, and yield its value, or -ENOMEM when the sample could
 * not be stored. One definition for replay and bench. */
#define CLI_LAT_TIMED(lat, call)                                               \
	({                                                                     \
		struct timespec t0_ = cli_now();                               \
		int rc_ = (call);                                              \
		if (cli_lat_since((lat), t0_))                                 \
			rc_ = -ENOMEM;                                         \
		rc_;                                                           \
	})

/* Per-errno counters, indexed by the positive errno (last slot: others). */
#define CLI_REPLAY_ERRNO_SLOTS 160

/* What one worker (or the sum of all) counted. */
struct cli_replay_counts {
	uint64_t requests;      /* requests replayed */
	uint64_t block_refs;    /* keys in those requests */
	uint64_t hits;          /* blocks GET returned byte-exact */
	uint64_t returned;      /* blocks GET returned (exact or not): the
				 * client's count of server GET hits */
	uint64_t wrong;         /* returned but not the key's bytes (or a
				 * checksum or size mismatch) */
	uint64_t get_misses;    /* matched, yet GET did not return them */
	uint64_t blocks_put;    /* blocks PUT accepted (stored or already there) */
	uint64_t bytes_put;     /* payload bytes of those */
	uint64_t bytes_got;     /* payload bytes GET returned */
	uint64_t put_retries;   /* blocks sent again after the server was busy */
	uint64_t get_retries;   /* blocks asked again after the server was busy
				 * (no DRAM room yet to read them back from NVMe) */
	uint64_t lease_cuts;    /* MATCH answers whose lease was cut to the run that fits
				 * the leased-bytes bound (protocol v2: LEASE_CUT) */
	uint64_t lease_cut_blocks; /* blocks present past those cuts (put again) */
	uint64_t put_errors[CLI_REPLAY_ERRNO_SLOTS];
	uint64_t get_errors[CLI_REPLAY_ERRNO_SLOTS];  /* besides misses */
	uint64_t match_errors[CLI_REPLAY_ERRNO_SLOTS]; /* MATCHes refused as a whole
				 * (QUOTA, FULL, BUSY): replayed as misses */
	struct cli_lat lat[CLI_REPLAY_NOPS];
};

/* Count one per-block error (a negative errno) in a table. */
void cli_replay_count_errno(uint64_t *table, int err);

/* The sum of an errno table. */
uint64_t cli_replay_errno_total(const uint64_t *table);

/* Add `from` to `into` (samples are appended). Returns 0 or -ENOMEM. */
int cli_replay_counts_add(struct cli_replay_counts *into, const struct cli_replay_counts *from);

/* Free the samples of a counts. Accepts NULL. */
void cli_replay_counts_release(struct cli_replay_counts *c);

/* Everything the report shows. */
struct cli_replay_report {
	const char *trace_path;
	const char *url;
	const char *ns;
	uint64_t block_bytes;
	uint64_t block_tokens;  /* tokens per block, for prefill tokens saved */
	unsigned int concurrency;
	uint64_t ideal_hits;    /* infinite-cache hits over the same refs */
	uint64_t server_get_hits; /* namespace get_hits, after - before */
	uint64_t evictions;     /* server-wide, after - before */
	bool namespace_dropped; /* the namespace was emptied before the run */
	uint64_t dropped_blocks; /* blocks that emptying removed */
	double wall_s;
	struct cli_replay_counts counts; /* sum over workers */
};

/* Print the report as one compact JSON line (the figures' keys are
 * documented in `kvpool replay --help`). Returns 0 or -ENOMEM. */
int cli_replay_print_json(FILE *f, struct cli_replay_report *r);

/* Print the report for a person. Its first lines say whether the
 * namespace was emptied first (and warn when it was not), and warn when
 * blocks could not be put. */
void cli_replay_print_text(FILE *f, struct cli_replay_report *r);

#endif /* KVPOOL_CLI_REPLAY_H */
