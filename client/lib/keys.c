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
#include "conn.h"

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

uint8_t kvc_version(const struct kvpool_client *c)
{
	return c->limits.protocol_version >= PROTO_VERSION_2 ? PROTO_VERSION_2 : PROTO_VERSION_1;
}

size_t kvc_match_chunk(const struct kvpool_client *c)
{
	size_t prefix = proto_match_body_bytes(kvc_version(c), 0);
	size_t n = (c->limits.max_frame_bytes - PROTO_HEADER_BYTES - prefix) / PROTO_KEY_ENTRY_BYTES;

	return n < c->limits.max_batch_blocks ? n : c->limits.max_batch_blocks;
}

struct proto_match_opts kvc_match_frame_opts(uint32_t first, uint32_t n, uint32_t want_total,
					     uint32_t wait_left_ms, uint32_t retain_ms)
{
	struct proto_match_opts o = { .retain_ms = retain_ms };

	/* Keys of this frame among the wanted ones; none: no wait. */
	if (want_total > first && wait_left_ms) {
		o.want = want_total - first < n ? want_total - first : n;
		o.wait_ms = wait_left_ms;
	}
	return o;
}

int kvc_match_encode(struct kvpool_client *c, const uint8_t *keys, size_t n, uint32_t lease_ms,
		     const struct proto_match_opts *o, size_t *body_bytes)
{
	uint8_t v = kvc_version(c);
	size_t bytes = proto_match_body_bytes(v, (uint32_t)n);
	int rc = kvc_wbuf_reserve(c, bytes);

	if (rc)
		return rc;
	/* a v1 server cannot wait or retain: the options are dropped */
	proto_match_encode_prefix(c->wbuf, v, (uint32_t)n, lease_ms, o);
	for (size_t i = 0; i < n; i++)
		proto_match_key_encode(c->wbuf, v, (uint32_t)i, keys + i * KVPOOL_KEY_BYTES);
	*body_bytes = bytes;
	return 0;
}

int kvc_match_reply(uint8_t version, const uint8_t *body, size_t body_bytes, size_t n,
		    struct proto_match_reply *out)
{
	if (proto_match_reply_decode_v(body, body_bytes, version, out) || out->present > n)
		return -EPROTO;
	return 0;
}

int kvc_match_fold(struct kvpool_match_result *acc, size_t first, size_t n,
		   const struct proto_match_reply *r)
{
	acc->matched = first + r->matched;
	acc->present = first + r->present;
	/* leading blocks: a frame's count adds only to a whole run before it */
	if (acc->retained == first)
		acc->retained = first + r->retained;
	if (r->lease_ms && (!acc->lease_ms || r->lease_ms < acc->lease_ms))
		acc->lease_ms = r->lease_ms;
	if (r->retain_ms && (!acc->retain_ms || r->retain_ms < acc->retain_ms))
		acc->retain_ms = r->retain_ms;
	acc->flags |= r->flags;
	return r->matched == n;
}

/* One MATCH round trip over keys[0..n): the frame of a chain starting at
 * `first`. Returns 0, a whole-request error, or a stream error. */
static int match_once(struct kvpool_client *c, const uint8_t (*keys)[KVPOOL_KEY_BYTES], size_t n,
		      uint32_t lease_ms, const struct proto_match_opts *o, uint64_t deadline_ms,
		      struct proto_match_reply *out)
{
	uint64_t id = kvc_next_request_id(c);
	struct kvc_reply r;
	struct iovec iov[2];
	size_t body_bytes;
	int rc;

	rc = kvc_match_encode(c, keys[0], n, lease_ms, o, &body_bytes);
	if (rc)
		return rc;
	rc = kvc_send_request(c, PROTO_OP_MATCH, id, c->wbuf, body_bytes, iov, 2, 0, deadline_ms);
	if (rc)
		return rc;
	rc = kvc_recv_reply(c, PROTO_OP_MATCH, id, deadline_ms, &r);
	if (rc)
		return rc;
	if (r.err)
		return r.err;
	if (kvc_match_reply(r.h.version, r.body, r.body_bytes, n, out))
		return kvc_stream_error(c, -EPROTO);
	return 0;
}

/* What is left of a wait that ends at end_ms (0: none). */
static uint32_t wait_left(uint64_t end_ms)
{
	uint64_t now = kvc_now_ms();

	return end_ms > now ? (uint32_t)(end_ms - now) : 0;
}

int kvc_match_sync_ex(struct kvpool_client *c, const void *keys, size_t count,
		      const struct kvpool_match_opts *opts, struct kvpool_match_result *out)
{
	static const struct kvpool_match_opts none;
	const uint8_t (*chain)[KVPOOL_KEY_BYTES] = keys;
	struct kvpool_match_result acc = { 0 };
	struct kvc_backoff bo;
	uint64_t deadline_ms, wait_end = 0;
	size_t total = 0, chunk;
	uint32_t want;
	int rc;

	if (c && c->cluster)
		return kvcl_match_ex(c->cluster, keys, count, opts, out);
	if (!c || !out || (count && !keys))
		return -EINVAL;
	if (!opts)
		opts = &none;
	if (count == 0) {
		*out = acc;
		return 0;
	}
	want = opts->want ? opts->want : count < UINT32_MAX ? (uint32_t)count : UINT32_MAX;
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		return rc;
	/* want > count: the server refuses it BAD_REQUEST with its reason
	 * (sent as it is in the first frame); a v1 server cannot, so the
	 * library refuses it the same way */
	if (opts->want > count && kvc_version(c) < PROTO_VERSION_2)
		return -EPROTO;
	if (kvc_version(c) >= PROTO_VERSION_2 && opts->wait_ms) {
		wait_end = kvc_now_ms() + opts->wait_ms;
		deadline_ms += opts->wait_ms; /* the call may wait that much longer */
	}
	chunk = kvc_match_chunk(c);
	kvc_backoff_start(&bo, c);
	/* A later chunk can only extend the prefix if this one matched whole. */
	while (total < count) {
		size_t n = count - total < chunk ? count - total : chunk;
		struct proto_match_opts o = kvc_match_frame_opts((uint32_t)total, (uint32_t)n, want,
								 wait_left(wait_end), opts->retain_ms);
		struct proto_match_reply r;

		if (opts->want > count)
			o.want = opts->want;
		rc = match_once(c, chain + total, n, opts->lease_ms, &o, deadline_ms, &r);
		if (rc == -EAGAIN && kvc_backoff_again(&bo, c, deadline_ms))
			continue;
		if (rc)
			return rc;
		if (opts->want > count)
			return -EPROTO; /* a server that let it pass */
		if (!kvc_match_fold(&acc, total, n, &r))
			break;
		total += n;
	}
	*out = acc;
	return 0;
}

int kvc_match_sync(struct kvpool_client *c, const void *keys, size_t count, uint32_t lease_ms,
		   size_t *matched)
{
	struct kvpool_match_opts o = { .lease_ms = lease_ms };
	struct kvpool_match_result r;
	int rc;

	if (c && c->cluster)
		return kvcl_match(c->cluster, keys, count, lease_ms, matched);
	if (!matched)
		return -EINVAL;
	rc = kvc_match_sync_ex(c, keys, count, &o, &r);
	if (rc == 0)
		*matched = r.matched;
	return rc;
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

int kvpool_match_ex(struct kvpool_client *c, const void *keys, size_t count,
		    const struct kvpool_match_opts *opts, struct kvpool_match_result *out)
{
	if (c && count && keys && out && kvc_async_busy(c))
		return kvc_async_call_ex(c, KVPOOL_OP_MATCH, keys, count, NULL, NULL, opts, out);
	return kvc_match_sync_ex(c, keys, count, opts, out);
}
