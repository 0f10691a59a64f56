/*
 * trace.c - parse, sort and chain request traces; the infinite-cache ideal.
 */
#include "trace.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <openssl/evp.h>

/* Format a parse error into err[0..errlen) and return -EINVAL. */
__attribute__((format(printf, 3, 4)))
static int trace_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Is every byte of s[0..len) JSON whitespace? */
static bool all_space(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return false;
	return true;
}

/* Does the integer literal s[0..n) (optional '-', then digits) lie outside
 * [-2^63, 2^64-1]? json-c saturates such numbers silently, so they are
 * caught on the text. */
static bool int_literal_overflows(const char *s, size_t n)
{
	static const char u64_max[] = "18446744073709551615";
	static const char i64_min_abs[] = "9223372036854775808";
	const char *limit = u64_max;

	if (n && s[0] == '-') {
		limit = i64_min_abs;
		s++;
		n--;
	}
	while (n > 1 && s[0] == '0') {
		s++;
		n--;
	}
	if (n != strlen(limit))
		return n > strlen(limit);
	return memcmp(s, limit, n) > 0;
}

/* Scan valid JSON text for integer literals out of 64-bit range, skipping
 * strings. Returns the column (1-based) of the first one, or 0. */
static size_t find_int_overflow(const char *s, size_t len)
{
	size_t i = 0;

	while (i < len) {
		if (s[i] == '"') {
			for (i++; i < len && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			i++;
		} else if (s[i] == '-' || isdigit((unsigned char)s[i])) {
			size_t start = i, end;
			bool integral = true;

			for (i++; i < len && (isdigit((unsigned char)s[i]) ||
					 (s[i] && strchr(".eE+-", s[i]))); i++)
				if (!isdigit((unsigned char)s[i]))
					integral = false;
			end = i;
			if (integral && int_literal_overflows(s + start, end - start))
				return start + 1;
		} else {
			i++;
		}
	}
	return 0;
}

/* Parse `text` (valid JSON, len bytes) into a json-c tree; *out owns it. */
static int parse_json(const char *line, size_t len, struct json_object **out, char *err,
		      size_t errlen)
{
	struct json_tokener *tok;
	struct json_object *obj = NULL;
	enum json_tokener_error jerr;
	size_t end, col;

	if (len > INT32_MAX)
		return trace_err(err, errlen, "line too long");
	tok = json_tokener_new();
	if (!tok)
		return -ENOMEM;
	obj = json_tokener_parse_ex(tok, line, (int)len);
	jerr = json_tokener_get_error(tok);
	end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (jerr == json_tokener_continue || (!obj && jerr == json_tokener_success)) {
		json_object_put(obj);
		return trace_err(err, errlen, "truncated JSON (the line ends inside a value)");
	}
	if (jerr != json_tokener_success)
		return trace_err(err, errlen, "invalid JSON at column %zu: %s", end + 1,
				 json_tokener_error_desc(jerr));
	if (!all_space(line + end, len - end)) {
		json_object_put(obj);
		return trace_err(err, errlen, "unexpected text after the JSON value at column %zu",
				 end + 1);
	}
	col = find_int_overflow(line, end);
	if (col) {
		json_object_put(obj);
		return trace_err(err, errlen, "integer out of 64-bit range at column %zu", col);
	}
	*out = obj;
	return 0;
}

/* Name of a json-c type for messages. */
static const char *type_name(struct json_object *v)
{
	switch (json_object_get_type(v)) {
	case json_type_null: return "null";
	case json_type_boolean: return "a boolean";
	case json_type_double: return "a fractional number";
	case json_type_int: return "an integer";
	case json_type_object: return "an object";
	case json_type_array: return "an array";
	case json_type_string: return "a string";
	}
	return "unknown";
}

/* Read a non-negative integer (0..2^64-1) from v; `what` names it. */
static int get_u64(struct json_object *v, const char *what, uint64_t *out, char *err,
		   size_t errlen)
{
	if (!json_object_is_type(v, json_type_int))
		return trace_err(err, errlen, "%s must be a non-negative integer, not %s", what,
				 type_name(v));
	if (json_object_get_int64(v) < 0)
		return trace_err(err, errlen, "%s must be a non-negative integer, not %" PRId64,
				 what, json_object_get_int64(v));
	*out = json_object_get_uint64(v);
	return 0;
}

/* Timestamps beyond this (ms, ~31,700 years) are not a trace's times:
 * they would only overflow the pacing arithmetic. */
#define TRACE_MAX_TIMESTAMP_MS 1e15

/* Read "timestamp": a number, or a string holding one, in milliseconds
 * from 0 to TRACE_MAX_TIMESTAMP_MS. */
static int get_timestamp(struct json_object *v, double *out, char *err, size_t errlen)
{
	const char *s;
	char *end;
	double d;

	switch (json_object_get_type(v)) {
	case json_type_int:
		d = (double)json_object_get_int64(v);
		if (d >= 0x1p63)
			d = (double)json_object_get_uint64(v);
		break;
	case json_type_double:
		d = json_object_get_double(v);
		break;
	case json_type_string:
		s = json_object_get_string(v);
		errno = 0;
		d = strtod(s, &end);
		if (end == s || !all_space(end, strlen(end)) || isspace((unsigned char)s[0]) ||
		    errno == ERANGE)
			return trace_err(err, errlen, "timestamp \"%.40s\" is not a number", s);
		break;
	default:
		return trace_err(err, errlen, "timestamp must be a number or a numeric string, not %s",
				 type_name(v));
	}
	if (!isfinite(d))
		return trace_err(err, errlen, "timestamp must be a finite number, not %g", d);
	if (d < 0)
		return trace_err(err, errlen, "timestamp %g is negative: want milliseconds "
				 "from 0 to 1e15", d);
	if (d > TRACE_MAX_TIMESTAMP_MS)
		return trace_err(err, errlen, "timestamp %g is absurd: want milliseconds "
				 "from 0 to 1e15", d);
	*out = d;
	return 0;
}

/* Look up a required member of obj. */
static int get_member(struct json_object *obj, const char *key, struct json_object **v,
		      char *err, size_t errlen)
{
	if (!json_object_object_get_ex(obj, key, v))
		return trace_err(err, errlen, "missing \"%s\"", key);
	return 0;
}

/* Copy the "hash_ids" array into a malloc'd array of uint64. */
static int get_hash_ids(struct json_object *arr, uint64_t **ids, size_t *n, char *err,
			size_t errlen)
{
	size_t count, i;
	uint64_t *out = NULL;
	char what[48];
	int rc;

	if (!json_object_is_type(arr, json_type_array))
		return trace_err(err, errlen, "hash_ids must be an array, not %s", type_name(arr));
	count = json_object_array_length(arr);
	if (count) {
		out = malloc(count * sizeof(*out));
		if (!out)
			return -ENOMEM;
	}
	for (i = 0; i < count; i++) {
		snprintf(what, sizeof(what), "hash_ids[%zu]", i);
		rc = get_u64(json_object_array_get_idx(arr, i), what, &out[i], err, errlen);
		if (rc) {
			free(out);
			return rc;
		}
	}
	*ids = out;
	*n = count;
	return 0;
}

/* Fill *req from a parsed line object; on failure nothing is left allocated. */
static int req_from_object(struct json_object *obj, struct cli_trace_req *req, char *err,
			   size_t errlen)
{
	struct json_object *ts, *in, *outl, *ids;
	int rc;

	if (!json_object_is_type(obj, json_type_object))
		return trace_err(err, errlen, "not a JSON object (got %s)", type_name(obj));
	rc = get_member(obj, "timestamp", &ts, err, errlen);
	rc = rc ?: get_member(obj, "input_length", &in, err, errlen);
	rc = rc ?: get_member(obj, "output_length", &outl, err, errlen);
	rc = rc ?: get_member(obj, "hash_ids", &ids, err, errlen);
	rc = rc ?: get_timestamp(ts, &req->timestamp_ms, err, errlen);
	rc = rc ?: get_u64(in, "input_length", &req->input_tokens, err, errlen);
	rc = rc ?: get_u64(outl, "output_length", &req->output_tokens, err, errlen);
	rc = rc ?: get_hash_ids(ids, &req->hash_ids, &req->n_hash_ids, err, errlen);
	return rc;
}

int cli_trace_parse_line(const char *line, size_t len, struct cli_trace_req *out, char *err,
			 size_t errlen)
{
	struct cli_trace_req req = { 0 };
	struct json_object *obj = NULL;
	int rc;

	if (!line || all_space(line, len))
		return trace_err(err, errlen, "empty line");
	rc = parse_json(line, len, &obj, err, errlen);
	if (rc)
		return rc;
	rc = req_from_object(obj, &req, err, errlen);
	json_object_put(obj);
	if (rc)
		return rc;
	*out = req;
	return 0;
}

void cli_trace_req_release(struct cli_trace_req *req)
{
	if (!req)
		return;
	free(req->hash_ids);
	req->hash_ids = NULL;
	req->n_hash_ids = 0;
}

void cli_trace_destroy(struct cli_trace *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n_reqs; i++)
		cli_trace_req_release(&t->reqs[i]);
	free(t->reqs);
	free(t->keys);
	memset(t, 0, sizeof(*t));
}

int cli_trace_chain_keys(const uint64_t *ids, size_t n, uint8_t (*out)[KVPOOL_KEY_BYTES])
{
	uint8_t buf[KVPOOL_KEY_BYTES + 8];
	size_t off = 0;

	for (size_t i = 0; i < n; i++) {
		if (i) {
			memcpy(buf, out[i - 1], KVPOOL_KEY_BYTES);
			off = KVPOOL_KEY_BYTES;
		}
		for (int b = 0; b < 8; b++)
			buf[off + b] = (uint8_t)(ids[i] >> (8 * b));
		if (EVP_Digest(buf, off + 8, out[i], NULL, EVP_sha256(), NULL) != 1)
			return -EIO;
	}
	return 0;
}

/* Stable order by timestamp: ties keep their original (line) order. */
static int cmp_req(const void *a, const void *b)
{
	const struct cli_trace_req *x = a, *y = b;

	if (x->timestamp_ms != y->timestamp_ms)
		return x->timestamp_ms < y->timestamp_ms ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

/* Append one request to a growing array. */
static int push_req(struct cli_trace *t, size_t *cap, const struct cli_trace_req *req)
{
	if (t->n_reqs == *cap) {
		size_t ncap = *cap ? *cap * 2 : 1024;
		struct cli_trace_req *n = realloc(t->reqs, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		t->reqs = n;
		*cap = ncap;
	}
	t->reqs[t->n_reqs++] = *req;
	return 0;
}

/* Read every non-blank line of f into t->reqs, numbering lines from 1. */
static int read_lines(FILE *f, const char *name, struct cli_trace *t, char *err, size_t errlen)
{
	char *line = NULL, why[256];
	size_t linecap = 0, cap = 0, lineno = 0;
	struct cli_trace_req req;
	ssize_t n;
	int rc = 0;

	while ((n = getline(&line, &linecap, f)) >= 0) {
		lineno++;
		if (all_space(line, (size_t)n))
			continue;
		rc = cli_trace_parse_line(line, (size_t)n, &req, why, sizeof(why));
		if (rc == -EINVAL)
			trace_err(err, errlen, "%s:%zu: %s", name, lineno, why);
		if (rc)
			break;
		req.line = lineno;
		rc = push_req(t, &cap, &req);
		if (rc) {
			cli_trace_req_release(&req);
			break;
		}
	}
	if (!rc && ferror(f)) {
		trace_err(err, errlen, "%s: read error", name);
		rc = -EIO;
	}
	free(line);
	return rc;
}

/* Compute every request's chained keys into one array owned by t. */
static int chain_all(struct cli_trace *t)
{
	uint64_t off = 0;
	int rc;

	t->n_refs = 0;
	for (size_t i = 0; i < t->n_reqs; i++)
		t->n_refs += t->reqs[i].n_hash_ids;
	if (t->n_refs) {
		t->keys = malloc(t->n_refs * KVPOOL_KEY_BYTES);
		if (!t->keys)
			return -ENOMEM;
	}
	for (size_t i = 0; i < t->n_reqs; i++) {
		/* A request without ids keeps keys NULL: t->keys may be NULL,
		 * and even NULL + 0 is undefined behaviour. */
		if (!t->reqs[i].n_hash_ids)
			continue;
		t->reqs[i].keys = t->keys + off;
		rc = cli_trace_chain_keys(t->reqs[i].hash_ids, t->reqs[i].n_hash_ids,
					  t->reqs[i].keys);
		if (rc)
			return rc;
		off += t->reqs[i].n_hash_ids;
	}
	return 0;
}

int cli_trace_read(FILE *f, const char *name, size_t limit, struct cli_trace *out, char *err,
		   size_t errlen)
{
	struct cli_trace t = { 0 };
	int rc;

	rc = read_lines(f, name, &t, err, errlen);
	if (rc)
		goto out_destroy;
	if (t.n_reqs) /* an empty trace has reqs NULL, which qsort may not take */
		qsort(t.reqs, t.n_reqs, sizeof(*t.reqs), cmp_req);
	if (limit && limit < t.n_reqs) {
		for (size_t i = limit; i < t.n_reqs; i++)
			cli_trace_req_release(&t.reqs[i]);
		t.n_reqs = limit;
	}
	rc = chain_all(&t);
	if (rc)
		goto out_destroy;
	*out = t;
	return 0;

out_destroy:
	cli_trace_destroy(&t);
	return rc;
}

int cli_trace_load(const char *path, size_t limit, struct cli_trace *out, char *err,
		   size_t errlen)
{
	FILE *f = fopen(path, "r");
	int rc;

	if (!f) {
		rc = -errno;
		trace_err(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	rc = cli_trace_read(f, path, limit, out, err, errlen);
	fclose(f);
	return rc;
}

/* ---- infinite-cache ideal ---------------------------------------------- */

/* An open-addressing set of keys, storing indices (+1) into a key array. */
struct keyset {
	uint64_t *slots;  /* 0: empty, else index + 1 into keys */
	uint64_t mask;
	uint8_t (*keys)[KVPOOL_KEY_BYTES];
};

/* The slot where `key` is, or the empty slot where it would go. Keys are
 * SHA-256 digests, so their first 8 bytes are already a good hash. */
static uint64_t keyset_find(const struct keyset *s, const uint8_t *key)
{
	uint64_t h;

	memcpy(&h, key, sizeof(h));
	for (h &= s->mask;; h = (h + 1) & s->mask) {
		uint64_t v = s->slots[h];

		if (!v || !memcmp(s->keys[v - 1], key, KVPOOL_KEY_BYTES))
			return h;
	}
}

int cli_trace_ideal_hits(const struct cli_trace *t, uint64_t *hits)
{
	struct keyset s = { .keys = t->keys };
	uint64_t nslots = 16, total = 0, base = 0;

	while (nslots < 2 * t->n_refs)
		nslots *= 2;
	s.slots = calloc(nslots, sizeof(*s.slots));
	if (!s.slots)
		return -ENOMEM;
	s.mask = nslots - 1;
	for (size_t i = 0; i < t->n_reqs; i++) {
		size_t n = t->reqs[i].n_hash_ids, lead = 0;

		while (lead < n && s.slots[keyset_find(&s, t->keys[base + lead])])
			lead++;
		total += lead;
		for (size_t j = lead; j < n; j++) {
			uint64_t slot = keyset_find(&s, t->keys[base + j]);

			if (!s.slots[slot])
				s.slots[slot] = base + j + 1;
		}
		base += n;
	}
	free(s.slots);
	*hits = total;
	return 0;
}
