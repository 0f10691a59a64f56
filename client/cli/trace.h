/*
 * trace.h - request traces for `kvpool replay`.
 *
 * A trace is JSON Lines in the format of the Mooncake FAST'25 traces: one
 * object per request with "timestamp" (milliseconds, 0..1e15; a number or a
 * numeric string), "input_length" and "output_length" (tokens) and
 * "hash_ids" (an array of integers in 0..2^64-1, one per block of input
 * tokens). Other keys are ignored.
 *
 * Hash ids are chained into 32-byte block keys the way prompts chain their
 * block hashes: key_0 = SHA-256(id_0 as uint64 LE) and
 * key_i = SHA-256(key_{i-1} || id_i as uint64 LE), so the i-th key commits to
 * every id before it and traces whose ids are per-block content hashes still
 * give distinct chains.
 *
 * Nothing here talks to a server; every function may be called from any
 * thread on its own objects.
 */
#ifndef KVPOOL_CLI_TRACE_H
#define KVPOOL_CLI_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool.h"

/* One request of a trace. */
struct cli_trace_req {
	double timestamp_ms;           /* arrival time, trace units (ms) */
	uint64_t input_tokens;         /* "input_length" */
	uint64_t output_tokens;        /* "output_length" */
	uint64_t *hash_ids;            /* malloc'd, n_hash_ids entries (NULL if 0) */
	size_t n_hash_ids;
	size_t line;                   /* 1-based line number in its file (0: none) */
	uint8_t (*keys)[KVPOOL_KEY_BYTES]; /* chained keys, n_hash_ids of them;
					    * points into its cli_trace; NULL
					    * until the trace is built, and
					    * when n_hash_ids is 0 */
};

/* A whole trace, sorted by timestamp (stable: equal timestamps keep file
 * order), with every request's chained keys computed. */
struct cli_trace {
	struct cli_trace_req *reqs;
	size_t n_reqs;
	uint64_t n_refs;               /* sum of n_hash_ids: block references */
	uint8_t (*keys)[KVPOOL_KEY_BYTES]; /* n_refs keys; reqs[i].keys point here */
};

/* Parse one trace line (line[0..len), no NUL needed; a trailing newline or
 * whitespace is allowed) into *out. On success out->hash_ids is malloc'd and
 * out->line and out->keys are 0/NULL; free it with cli_trace_req_release().
 * Pure: it reads nothing but its arguments.
 * Returns 0, or -EINVAL with a one-line reason in err[0..errlen) (truncated
 * JSON, not an object, a missing field, a wrong type, a negative or
 * non-integer length or id, an integer beyond 2^64-1, a timestamp that is no
 * finite number, negative, or beyond 1e15 ms), or -ENOMEM. *out is written
 * only on success. */
int cli_trace_parse_line(const char *line, size_t len, struct cli_trace_req *out, char *err,
			 size_t errlen);

/* Free what cli_trace_parse_line() allocated in *req. Accepts NULL. */
void cli_trace_req_release(struct cli_trace_req *req);

/* Read a trace from `f` (`name` is used in messages only), skipping blank
 * lines, sort it by timestamp, keep the first `limit` requests (0: all) and
 * chain their keys. The file is read to its end.
 * Returns 0, or -EINVAL (a malformed line: err says "NAME:LINE: reason"),
 * -EIO (read error), -ENOMEM. *out is written only on success; free it with
 * cli_trace_destroy(). */
int cli_trace_read(FILE *f, const char *name, size_t limit, struct cli_trace *out, char *err,
		   size_t errlen);

/* Open and read the trace at `path` (see cli_trace_read). An unopenable file
 * is its -errno, with the reason in err. */
int cli_trace_load(const char *path, size_t limit, struct cli_trace *out, char *err,
		   size_t errlen);

/* Free a trace's requests and keys. Accepts NULL and a zeroed trace. */
void cli_trace_destroy(struct cli_trace *t);

/* Chain hash ids into keys: out[i] = SHA-256(out[i-1] || ids[i] as uint64
 * LE), with no parent bytes for i = 0. out has room for n keys.
 * Returns 0, or -EIO if the digest could not be computed. */
int cli_trace_chain_keys(const uint64_t *ids, size_t n, uint8_t (*out)[KVPOOL_KEY_BYTES]);

/* The infinite-cache ideal: for each request in trace order, the number of
 * its leading keys that appeared in any earlier request; *hits receives their
 * sum. Divided by t->n_refs this is the best hit ratio any pool can reach.
 * Returns 0 or -ENOMEM (*hits untouched). */
int cli_trace_ideal_hits(const struct cli_trace *t, uint64_t *hits);

#endif /* KVPOOL_CLI_TRACE_H */
