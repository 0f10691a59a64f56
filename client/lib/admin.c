/*
 * admin.c - whole-pool calls: kvpool_drop_namespace, kvpool_stats,
 * kvpool_ping, and kvpool_free.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "cluster.h"
#include "conn.h"

/* One round trip of a request with a body and no payload. On success *r
 * holds the reply (r->err may carry a whole-request error). */
static int round_trip(struct kvpool_client *c, uint8_t op, const void *body, size_t body_bytes,
		      uint64_t deadline_ms, struct kvc_reply *r)
{
	uint64_t id = kvc_next_request_id(c);
	struct iovec iov[2];
	int rc;

	rc = kvc_send_request(c, op, id, body, body_bytes, iov, 2, 0, deadline_ms);
	if (rc)
		return rc;
	return kvc_recv_reply(c, op, id, deadline_ms, r);
}

/* Check an optional namespace argument; *len receives its length (0 for NULL). */
static int name_arg(const char *ns, uint16_t *len)
{
	size_t n = ns ? strlen(ns) : 0;

	if (ns && !proto_name_valid(ns, n))
		return -EINVAL;
	*len = (uint16_t)n;
	return 0;
}

/* A request whose body is one name (DROP_NAMESPACE, STATS). */
static int name_request(struct kvpool_client *c, uint8_t op, const char *ns, struct kvc_reply *r)
{
	uint8_t body[4 + PROTO_NAME_MAX_BYTES];
	uint64_t deadline_ms;
	uint16_t len;
	int rc;

	rc = name_arg(ns, &len);
	if (rc)
		return rc;
	rc = proto_name_encode(ns, len, body, sizeof(body));
	if (rc)
		return -EINVAL;
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		return rc;
	rc = round_trip(c, op, body, proto_name_body_bytes(len), deadline_ms, r);
	if (rc)
		return rc;
	return r->err;
}

int kvpool_drop_namespace(struct kvpool_client *c, const char *ns, uint64_t *blocks)
{
	struct kvc_reply r;
	uint64_t n, bytes;
	int rc;

	if (!c)
		return -EINVAL;
	if (c->cluster)
		return kvcl_drop_namespace(c->cluster, ns, blocks);
	rc = name_request(c, PROTO_OP_DROP_NAMESPACE, ns, &r);
	if (rc)
		return rc;
	if (proto_drop_reply_decode(r.body, r.body_bytes, &n, &bytes))
		return kvc_stream_error(c, -EPROTO);
	if (blocks)
		*blocks = n;
	return 0;
}

int kvpool_stats(struct kvpool_client *c, const char *ns, char **json)
{
	struct kvc_reply r;
	char *doc;
	int rc;

	if (!c || !json)
		return -EINVAL;
	if (c->cluster)
		return kvcl_stats(c->cluster, ns, json);
	rc = name_request(c, PROTO_OP_STATS, ns, &r);
	if (rc)
		return rc;
	doc = malloc(r.body_bytes + 1);
	if (!doc)
		return -ENOMEM;
	memcpy(doc, r.body, r.body_bytes);
	doc[r.body_bytes] = '\0';
	*json = doc;
	return 0;
}

int kvpool_ping(struct kvpool_client *c, uint64_t *rtt_us)
{
	struct kvc_reply r;
	uint64_t deadline_ms, t0;
	int rc;

	if (!c)
		return -EINVAL;
	if (c->cluster)
		return kvcl_ping(c->cluster, rtt_us);
	rc = kvc_begin(c, &deadline_ms);
	if (rc)
		return rc;
	t0 = kvc_now_us();
	rc = round_trip(c, PROTO_OP_PING, NULL, 0, deadline_ms, &r);
	if (rc)
		return rc;
	if (r.err)
		return r.err;
	if (rtt_us)
		*rtt_us = kvc_now_us() - t0;
	return 0;
}

void kvpool_free(void *p)
{
	free(p);
}
