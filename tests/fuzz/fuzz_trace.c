/*
 * fuzz_trace.c - fuzz target: the trace parser of `kvpool replay`
 * (client/cli/trace.c).
 *
 * Every input is used two ways:
 *  1. as one line: cli_trace_parse_line on a buffer of exactly the input's
 *     size (no NUL after it, so a read past the line trips ASan). A line
 *     that parses obeys the header's promises (finite timestamp in
 *     0..1e15, ids present iff counted), and printed back as JSON it parses
 *     to the same request;
 *  2. as a whole trace file: cli_trace_read from a memory stream. A trace
 *     that reads is sorted by timestamp, its block references add up, and
 *     its ideal hits never exceed them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "cli/trace.h"

#define MAX_TIMESTAMP_MS 1e15

/* Print a parsed request as a trace line (malloc'd). */
static char *req_to_json(const struct cli_trace_req *r, size_t *len)
{
	char *text = NULL;
	FILE *out = open_memstream(&text, len);

	FUZZ_CHECK(out);
	fprintf(out, "{\"timestamp\": %.17g, \"input_length\": %" PRIu64
		", \"output_length\": %" PRIu64 ", \"hash_ids\": [",
		r->timestamp_ms, r->input_tokens, r->output_tokens);
	for (size_t i = 0; i < r->n_hash_ids; i++)
		fprintf(out, "%s%" PRIu64, i ? ", " : "", r->hash_ids[i]);
	fprintf(out, "]}\n");
	FUZZ_CHECK(fclose(out) == 0);
	return text;
}

static void check_line(const uint8_t *data, size_t size)
{
	struct cli_trace_req r, back;
	char err[256] = "", *line, *json;
	size_t len;
	int rc;

	line = malloc(size);
	FUZZ_CHECK(line || !size);
	if (size)
		memcpy(line, data, size);
	rc = cli_trace_parse_line(line, size, &r, err, sizeof(err));
	free(line);
	if (rc) {
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
		FUZZ_CHECK(rc != -EINVAL || err[0] != '\0');
		return;
	}
	FUZZ_CHECK(r.timestamp_ms >= 0 && r.timestamp_ms <= MAX_TIMESTAMP_MS);
	FUZZ_CHECK((r.n_hash_ids == 0) == (r.hash_ids == NULL));
	FUZZ_CHECK(r.line == 0 && r.keys == NULL);
	json = req_to_json(&r, &len);
	rc = cli_trace_parse_line(json, len, &back, err, sizeof(err));
	if (rc)
		fprintf(stderr, "printed line does not parse back: %s\n%s", err, json);
	FUZZ_CHECK(rc == 0);
	FUZZ_CHECK(back.timestamp_ms == r.timestamp_ms);
	FUZZ_CHECK(back.input_tokens == r.input_tokens && back.output_tokens == r.output_tokens);
	FUZZ_CHECK(back.n_hash_ids == r.n_hash_ids);
	FUZZ_CHECK(r.n_hash_ids == 0 ||
		   memcmp(back.hash_ids, r.hash_ids, r.n_hash_ids * sizeof(uint64_t)) == 0);
	free(json);
	cli_trace_req_release(&back);
	cli_trace_req_release(&r);
}

static void check_file(const uint8_t *data, size_t size)
{
	struct cli_trace t;
	char err[512] = "";
	uint64_t refs = 0, hits = 0;
	FILE *f;
	int rc;

	if (!size)
		return;
	f = fmemopen((void *)data, size, "r");
	FUZZ_CHECK(f);
	rc = cli_trace_read(f, "fuzz", 0, &t, err, sizeof(err));
	fclose(f);
	if (rc) {
		FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM || rc == -EIO);
		return;
	}
	for (size_t i = 0; i < t.n_reqs; i++) {
		const struct cli_trace_req *r = &t.reqs[i];

		FUZZ_CHECK(i == 0 || t.reqs[i - 1].timestamp_ms <= r->timestamp_ms);
		FUZZ_CHECK(r->line >= 1);
		FUZZ_CHECK(r->n_hash_ids == 0 || r->keys != NULL);
		refs += r->n_hash_ids;
	}
	FUZZ_CHECK(refs == t.n_refs);
	FUZZ_CHECK(cli_trace_ideal_hits(&t, &hits) == 0);
	FUZZ_CHECK(hits <= t.n_refs);
	cli_trace_destroy(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_line(data, size);
	check_file(data, size);
	return 0;
}
