/*
 * sync.c - the blocking calls of kvpool.h. Each is the same three steps,
 * with nothing per transport and nothing per backend: check the arguments
 * (args.c), then the backend's call, which submits the request and waits
 * for it (engine/engine.c on one node, cluster/cluster.c on several).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "proto.h"

/* Write err into every status; returns err. */
static int fill(int *st, size_t count, int err)
{
	for (size_t i = 0; st && i < count; i++)
		st[i] = err;
	return err;
}

/* A data call: check, then call (count 0 is done at once). MATCH: *mres
 * (required) is written on success. */
static int data_call(struct kvpool_client *c, struct kvc_req *r, struct kvpool_match_result *mres)
{
	struct kvc_result res = { 0 };
	int rc;

	if (r->flags && r->count)
		memset(r->flags, 0, r->count * sizeof(*r->flags)); /* always written */
	if (!c)
		rc = -EINVAL;
	else
		rc = kvc_req_check(r);
	if (rc) {
		if (r->op != KVPOOL_OP_MATCH)
			fill(r->statuses, r->count, rc);
		return rc;
	}
	if (r->count == 0) {
		if (mres)
			*mres = res.match;
		return 0;
	}
	rc = c->ops->call(c->be, r, &res);
	if (rc == 0 && mres)
		*mres = res.match;
	kvc_result_clear(&res);
	return rc;
}

int kvpool_put(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
	       int *statuses)
{
	return kvpool_put_ex(c, blocks, count, statuses, NULL);
}

int kvpool_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		  int *statuses, uint32_t *flags)
{
	struct kvc_req r = { .op = KVPOOL_OP_PUT, .put = blocks, .count = count,
			     .statuses = statuses, .flags = flags };

	return data_call(c, &r, NULL);
}

int kvpool_get(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
	       int *statuses)
{
	struct kvc_req r = { .op = KVPOOL_OP_GET, .get = blocks, .count = count,
			     .statuses = statuses };

	return data_call(c, &r, NULL);
}

int kvpool_put_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES],
		     const uint8_t *parent, const void *data, size_t length)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = length };
	struct kvpool_put_block b = { .key = key, .parent = parent, .iov = &iov, .iovcnt = 1 };

	if (!data && length)
		return -EINVAL;
	return kvpool_put(c, &b, 1, NULL);
}

int kvpool_get_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES], void *buf,
		     size_t cap, uint64_t *length)
{
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct kvpool_get_block b = { .key = key, .iov = &iov, .iovcnt = 1 };
	int rc;

	if (!buf && cap)
		return -EINVAL;
	rc = kvpool_get(c, &b, 1, NULL);
	/* b.length is 0 unless the block's size is known (see kvpool.h). */
	if (length && (rc == 0 || (rc == -EMSGSIZE && b.length)))
		*length = b.length;
	return rc;
}

int kvpool_exists(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	struct kvc_req r = { .op = KVPOOL_OP_EXISTS, .keys = keys, .count = count,
			     .statuses = statuses };

	return data_call(c, &r, NULL);
}

int kvpool_delete(struct kvpool_client *c, const void *keys, size_t count, int *statuses)
{
	struct kvc_req r = { .op = KVPOOL_OP_DELETE, .keys = keys, .count = count,
			     .statuses = statuses };

	return data_call(c, &r, NULL);
}

int kvpool_match(struct kvpool_client *c, const void *keys, size_t count, uint32_t lease_ms,
		 size_t *matched)
{
	struct kvpool_match_opts o = { .lease_ms = lease_ms };
	struct kvpool_match_result res;
	int rc;

	if (!matched)
		return -EINVAL;
	rc = kvpool_match_ex(c, keys, count, &o, &res);
	if (rc == 0)
		*matched = res.matched;
	return rc;
}

int kvpool_match_ex(struct kvpool_client *c, const void *keys, size_t count,
		    const struct kvpool_match_opts *opts, struct kvpool_match_result *out)
{
	struct kvc_req r = { .op = KVPOOL_OP_MATCH, .keys = keys, .count = count };

	if (!out)
		return -EINVAL;
	if (opts)
		r.mopts = *opts;
	return data_call(c, &r, out);
}

/* A whole-pool call: name checked, then the backend's call. */
static int admin_call(struct kvpool_client *c, int op, const char *ns, struct kvc_result *res)
{
	struct kvc_req r = { .op = op, .ns = ns };

	memset(res, 0, sizeof(*res));
	if (!c || (ns && !proto_name_valid(ns, strlen(ns))))
		return -EINVAL;
	return c->ops->call(c->be, &r, res);
}

int kvpool_drop_namespace(struct kvpool_client *c, const char *ns, uint64_t *blocks)
{
	struct kvc_result res;
	int rc = admin_call(c, KVC_OP_DROP, ns, &res);

	if (rc == 0 && blocks)
		*blocks = res.u64;
	kvc_result_clear(&res);
	return rc;
}

int kvpool_stats(struct kvpool_client *c, const char *ns, char **json)
{
	struct kvc_result res;
	int rc;

	if (!json)
		return -EINVAL;
	rc = admin_call(c, KVC_OP_STATS, ns, &res);
	if (rc == 0) {
		*json = res.json;
		res.json = NULL;
	}
	kvc_result_clear(&res);
	return rc;
}

int kvpool_ping(struct kvpool_client *c, uint64_t *rtt_us)
{
	struct kvc_result res;
	int rc = admin_call(c, KVC_OP_PING, NULL, &res);

	if (rc == 0 && rtt_us)
		*rtt_us = res.u64;
	kvc_result_clear(&res);
	return rc;
}

void kvpool_free(void *p)
{
	free(p);
}
