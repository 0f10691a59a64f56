/*
 * keys.c - key-only batch calls: kvpool_exists, kvpool_match, kvpool_delete.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "client.h"

/* Per-call state of EXISTS and DELETE. */
struct keys_call {
	const uint8_t (*keys)[KVPOOL_KEY_BYTES];
	int *st;
	int refused;  /* first whole-request error, 0 if none */
};

static void keys_encode(void *ctx, size_t i, uint8_t *body, uint32_t j)
{
	struct keys_call *kc = ctx;

	proto_key_entry_encode(body, j, kc->keys[i]);
}

static int keys_results(void *ctx, struct kvpool_client *c, size_t first, size_t n,
			const struct proto_batch *b, uint64_t payload_bytes, uint64_t deadline_ms)
{
	struct keys_call *kc = ctx;
	struct proto_result r;

	(void)deadline_ms;
	if (payload_bytes)
		return kvc_stream_error(c, -EPROTO);
	for (size_t j = 0; j < n; j++) {
		if (proto_result_decode(b, (uint32_t)j, &r))
			return kvc_stream_error(c, -EPROTO);
		kc->st[first + j] = proto_status_to_errno(r.status);
	}
	return 0;
}

static void keys_refused(void *ctx, size_t first, size_t n, int err)
{
	struct keys_call *kc = ctx;

	for (size_t j = 0; j < n; j++)
		kc->st[first + j] = err;
	if (!kc->refused)
		kc->refused = err;
}

static const struct kvc_batch_ops keys_ops = {
	.encode = keys_encode,
	.results = keys_results,
	.refused = keys_refused,
};

/* Run an EXISTS or DELETE batch. statuses must hold count ints.
 * Returns 0 when every frame was answered with results, else the first
 * whole-request error or the connection error (then in every status). */
static int keys_batch(struct kvpool_client *c, uint8_t op, const uint8_t (*keys)[KVPOOL_KEY_BYTES],
		      size_t count, int *statuses)
{
	struct keys_call kc = { .keys = keys, .st = statuses };
	struct kvc_batch b = {
		.op = op,
		.entry_bytes = PROTO_KEY_ENTRY_BYTES,
		.count = count,
		.ops = &keys_ops,
		.ctx = &kc,
	};
	uint64_t deadline_ms;
	int rc;

	rc = kvc_begin(c, &deadline_ms);
	if (!rc)
		rc = kvc_batch_run(c, &b, deadline_ms);
	if (rc) {
		for (size_t i = 0; i < count; i++)
			statuses[i] = rc;
		return rc;
	}
	return kc.refused;
}

int kvpool_exists(struct kvpool_client *c, const void *keys, size_t count,
		  int *statuses)
{
	if (!c || (count && (!keys || !statuses)))
		return -EINVAL;
	if (count == 0)
		return 0;
	return keys_batch(c, PROTO_OP_EXISTS, keys, count, statuses);
}

int kvpool_delete(struct kvpool_client *c, const void *keys, size_t count,
		  int *statuses)
{
	int *st = statuses;
	int rc;

	if (!c || (count && !keys))
		return -EINVAL;
	if (count == 0)
		return 0;
	if (!st) {
		st = calloc(count, sizeof(*st));
		if (!st)
			return -ENOMEM;
	}
	rc = keys_batch(c, PROTO_OP_DELETE, keys, count, st);
	if (st != statuses)
		free(st);
	return rc;
}

/* Keys per MATCH frame under the server's limits. */
static size_t match_chunk(const struct kvpool_client *c)
{
	size_t n = (c->limits.max_frame_bytes - PROTO_HEADER_BYTES - PROTO_BATCH_PREFIX_BYTES) /
		   PROTO_KEY_ENTRY_BYTES;

	return n < c->limits.max_batch_blocks ? n : c->limits.max_batch_blocks;
}

/* One MATCH round trip over keys[0..n). *matched receives the count of
 * leading keys held. Returns 0, a whole-request error, or a stream error. */
static int match_once(struct kvpool_client *c, const uint8_t (*keys)[KVPOOL_KEY_BYTES], size_t n,
		      uint32_t lease_ms, uint64_t deadline_ms, size_t *matched)
{
	size_t body_bytes = proto_batch_body_bytes((uint32_t)n, PROTO_KEY_ENTRY_BYTES);
	uint64_t id = kvc_next_request_id(c);
	uint32_t m, lease;
	struct kvc_reply r;
	struct iovec iov[2];
	int rc;

	rc = kvc_wbuf_reserve(c, body_bytes);
	if (rc)
		return rc;
	proto_batch_encode_prefix(c->wbuf, (uint32_t)n, lease_ms);
	for (size_t i = 0; i < n; i++)
		proto_key_entry_encode(c->wbuf, (uint32_t)i, keys[i]);
	rc = kvc_send_request(c, PROTO_OP_MATCH, id, c->wbuf, body_bytes, iov, 2, 0, deadline_ms);
	if (rc)
		return rc;
	rc = kvc_recv_reply(c, PROTO_OP_MATCH, id, deadline_ms, &r);
	if (rc)
		return rc;
	if (r.err)
		return r.err;
	if (proto_match_reply_decode(r.body, r.body_bytes, &m, &lease) || m > n)
		return kvc_stream_error(c, -EPROTO);
	*matched = m;
	return 0;
}

int kvpool_match(struct kvpool_client *c, const void *keys, size_t count,
		 uint32_t lease_ms, size_t *matched)
{
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = keys;
	uint64_t deadline_ms;
	size_t total = 0, chunk;
	int rc;

	if (!c || !matched || (count && !keys))
		return -EINVAL;
	if (count == 0) {
		*matched = 0;
		return 0;
	}
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		return rc;
	chunk = match_chunk(c);
	/* A later chunk can only extend the prefix if this one matched whole. */
	while (total < count) {
		size_t n = count - total < chunk ? count - total : chunk, m = 0;

		rc = match_once(c, chain + total, n, lease_ms, deadline_ms, &m);
		if (rc)
			return rc;
		total += m;
		if (m < n)
			break;
	}
	*matched = total;
	return 0;
}
