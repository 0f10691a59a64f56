/*
 * async.c - the asynchronous calls of kvpool.h: the same argument checks
 * as their synchronous twins (args.c), then the backend's submit, poll,
 * cancel and event descriptor. One node or a cluster, TCP or RDMA: the
 * backend decides, nothing here does.
 */
#include <errno.h>

#include "handle.h"
#include "lib/net/frame.h"

static int submit(struct kvpool_client *c, const struct kvc_req *r, uint64_t *id)
{
	int rc;

	kvc_frame_set_last_message(NULL); /* "" unless this call meets a refusal */
	if (!c || !id)
		return -EINVAL;
	rc = kvc_req_check(r);
	return rc ? rc : c->ops->submit(c->be, r, id);
}

int kvpool_submit_put(struct kvpool_client *c, const struct kvpool_put_block *blocks,
		      size_t count, int *statuses, uint64_t tag, uint64_t *id)
{
	return kvpool_submit_put_ex(c, blocks, count, statuses, NULL, tag, id);
}

int kvpool_submit_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks,
			 size_t count, int *statuses, uint32_t *flags, uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_PUT, .put = blocks, .count = count,
			     .statuses = statuses, .flags = flags, .tag = tag };

	return submit(c, &r, id);
}

int kvpool_submit_get(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
		      int *statuses, uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_GET, .get = blocks, .count = count,
			     .statuses = statuses, .tag = tag };

	return submit(c, &r, id);
}

int kvpool_submit_exists(struct kvpool_client *c, const void *keys, size_t count, int *statuses,
			 uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_EXISTS, .keys = keys, .count = count,
			     .statuses = statuses, .tag = tag };

	return submit(c, &r, id);
}

int kvpool_submit_match(struct kvpool_client *c, const void *keys, size_t count,
			uint32_t lease_ms, uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_MATCH, .keys = keys, .count = count,
			     .mopts = { .lease_ms = lease_ms }, .tag = tag };

	return submit(c, &r, id);
}

int kvpool_submit_match_ex(struct kvpool_client *c, const void *keys, size_t count,
			   const struct kvpool_match_opts *opts, struct kvpool_match_result *out,
			   uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_MATCH, .keys = keys, .count = count, .mres = out,
			     .tag = tag };

	if (!out)
		return -EINVAL;
	if (opts)
		r.mopts = *opts;
	return submit(c, &r, id);
}

int kvpool_submit_delete(struct kvpool_client *c, const void *keys, size_t count,
			 int *statuses, uint64_t tag, uint64_t *id)
{
	struct kvc_req r = { .op = KVPOOL_OP_DELETE, .keys = keys, .count = count,
			     .statuses = statuses, .tag = tag };

	return submit(c, &r, id);
}

int kvpool_poll(struct kvpool_client *c, struct kvpool_completion *out, int max, int timeout_ms)
{
	/* "" unless a completion returned now carries a refusal; the
	 * backends keep the first of the batch */
	kvc_frame_set_last_message(NULL);
	if (!c || !out || max < 1 || timeout_ms < -1)
		return -EINVAL;
	return c->ops->poll(c->be, out, max, timeout_ms);
}

int kvpool_cancel(struct kvpool_client *c, uint64_t id)
{
	return c ? c->ops->cancel(c->be, id) : -EINVAL;
}

int kvpool_event_fd(struct kvpool_client *c)
{
	return c ? c->ops->event_fd(c->be) : -EINVAL;
}

uint32_t kvpool_inflight(struct kvpool_client *c)
{
	return c ? c->ops->inflight(c->be) : 0;
}

int kvpool_set_max_inflight(struct kvpool_client *c, uint32_t max)
{
	if (!c || max > KVPOOL_MAX_INFLIGHT_LIMIT)
		return -EINVAL;
	return c->ops->set_max_inflight(c->be, max);
}
