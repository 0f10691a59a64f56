/*
 * keys.c - key-only batch calls: kvpool_exists, kvpool_match, kvpool_delete.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "batch.h"
#include "client.h"
#include "cluster.h"

/* Per-call state of EXISTS and DELETE. Entries sent are a subset of the
 * keys: all of them at first, then those answered BUSY. */
struct keys_call {
	const uint8_t (*keys)[KVPOOL_KEY_BYTES];
	int *st;
	size_t *sent; /* entry -> key index */
	int refused;  /* first whole-request error other than BUSY, 0 if none */
	int busy;     /* a frame of the last pass was refused BUSY */
};

static void keys_encode(void *ctx, size_t i, uint8_t *body, uint32_t j)
{
	struct keys_call *kc = ctx;

	proto_key_entry_encode(body, j, kc->keys[kc->sent[i]]);
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
		kc->st[kc->sent[first + j]] = proto_status_to_errno(r.status);
	}
	return 0;
}

static void keys_refused(void *ctx, size_t first, size_t n, int err)
{
	struct keys_call *kc = ctx;

	for (size_t j = 0; j < n; j++)
		kc->st[kc->sent[first + j]] = err;
	if (err == -EAGAIN)
		kc->busy = 1;
	else if (!kc->refused)
		kc->refused = err;
}

/* List the keys answered BUSY for another pass; returns how many. */
static size_t keys_busy_select(struct keys_call *kc, size_t count)
{
	size_t n = 0;

	for (size_t k = 0; k < count; k++)
		if (kc->st[k] == -EAGAIN)
			kc->sent[n++] = k;
	return n;
}

static const struct kvc_batch_ops keys_ops = {
	.encode = keys_encode,
	.results = keys_results,
	.refused = keys_refused,
};

/* Run an EXISTS or DELETE batch, and again over the keys answered BUSY
 * (a whole frame refused, or one key) with backoff. statuses must hold
 * count ints. Returns 0 when every frame was answered with results, else
 * the first whole-request error (-EAGAIN when a frame was still refused
 * BUSY at the last try) or the connection error (then in every status). */
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
	struct kvc_backoff bo;
	uint64_t deadline_ms;
	int rc;

	if (count > SIZE_MAX / sizeof(*kc.sent))
		return -ENOMEM;
	kc.sent = malloc(count * sizeof(*kc.sent));
	if (!kc.sent)
		return -ENOMEM;
	for (size_t i = 0; i < count; i++)
		kc.sent[i] = i;
	rc = kvc_begin(c, &deadline_ms);
	kvc_backoff_start(&bo, c);
	while (!rc) {
		kc.busy = 0;
		rc = kvc_batch_run(c, &b, deadline_ms);
		if (rc)
			break;
		b.count = keys_busy_select(&kc, count);
		if (!b.count || !kvc_backoff_again(&bo, c, deadline_ms))
			break;
	}
	free(kc.sent);
	if (rc) {
		for (size_t i = 0; i < count; i++)
			statuses[i] = rc;
		return rc;
	}
	if (kc.refused)
		return kc.refused;
	return kc.busy ? -EAGAIN : 0; /* keys still refused BUSY after the last try */
}

int kvc_exists_sync(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	if (c && c->cluster)
		return kvcl_exists(c->cluster, keys, count, statuses);
	if (!c || (count && (!keys || !statuses)))
		return -EINVAL;
	if (count == 0)
		return 0;
	return keys_batch(c, PROTO_OP_EXISTS, keys, count, statuses);
}

int kvc_delete_sync(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	int *st = statuses;
	int rc;

	if (c && c->cluster)
		return kvcl_delete(c->cluster, keys, count, statuses);
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

int kvc_match_sync(struct kvpool_client *c, const void *keys, size_t count, uint32_t lease_ms,
		   size_t *matched)
{
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = keys;
	struct kvc_backoff bo;
	uint64_t deadline_ms;
	size_t total = 0, chunk;
	int rc;

	if (c && c->cluster)
		return kvcl_match(c->cluster, keys, count, lease_ms, matched);
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
	kvc_backoff_start(&bo, c);
	/* A later chunk can only extend the prefix if this one matched whole. */
	while (total < count) {
		size_t n = count - total < chunk ? count - total : chunk, m = 0;

		rc = match_once(c, chain + total, n, lease_ms, deadline_ms, &m);
		if (rc == -EAGAIN && kvc_backoff_again(&bo, c, deadline_ms))
			continue;
		if (rc)
			return rc;
		total += m;
		if (m < n)
			break;
	}
	*matched = total;
	return 0;
}

/* The public calls: with asynchronous requests in flight, they queue
 * behind those (async.c), otherwise they run as above. */
int kvpool_exists(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	if (c && count && keys && statuses && kvc_async_busy(c))
		return kvc_async_call(c, KVPOOL_OP_EXISTS, keys, count, statuses, 0, NULL);
	return kvc_exists_sync(c, keys, count, statuses);
}

int kvpool_delete(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	if (c && count && keys && kvc_async_busy(c))
		return kvc_async_call(c, KVPOOL_OP_DELETE, keys, count, statuses, 0, NULL);
	return kvc_delete_sync(c, keys, count, statuses);
}

int kvpool_match(struct kvpool_client *c, const void *keys, size_t count, uint32_t lease_ms,
		 size_t *matched)
{
	if (c && count && keys && matched && kvc_async_busy(c))
		return kvc_async_call(c, KVPOOL_OP_MATCH, keys, count, NULL, lease_ms, matched);
	return kvc_match_sync(c, keys, count, lease_ms, matched);
}
