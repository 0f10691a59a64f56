/*
 * handle.c - kvpool_connect picks the handle's backend once (a cluster
 * for a node list or an etcd:// URL, else one engine); every other call
 * here forwards to it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "lib/cluster/cluster.h"
#include "lib/net/frame.h"
#include "lib/net/tls_ctx.h"
#include "testing.h"

/* Does url name a TLS node, or may it (a cluster, whose members etcd
 * names later)? */
static int may_use_tls(const char *url)
{
	return strcasestr(url, "tls://") || kvcl_is_cluster_url(url);
}

int kvpool_connect(const char *url, const char *ns, const struct kvpool_options *opts,
		   struct kvpool_client **out)
{
	const char *token = opts ? opts->token : NULL;
	uint32_t timeout_ms = opts ? opts->timeout_ms : 0;
	struct kvc_tls_ctx *tls = NULL;
	struct kvpool_client *c;
	struct kvc_engine *e;
	int rc;

	kvc_frame_set_last_message(NULL);
	if (!url || !ns || !out)
		return -EINVAL;
	/* TLS settings are read once per handle: a cluster's nodes share them */
	if (may_use_tls(url)) {
		rc = kvc_tls_ctx_new(opts ? opts->tls_ca_file : NULL, opts ? opts->tls_cert_file : NULL,
				     opts ? opts->tls_key_file : NULL, opts ? opts->tls_flags : 0,
				     &tls);
		/* settings that do not load fail a handle that names a TLS node;
		 * an etcd cluster whose members are all plaintext works without */
		if (rc && (strcasestr(url, "tls://") || !kvcl_is_cluster_url(url)))
			return rc;
		if (rc)
			kvc_frame_set_last_message(NULL);
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		kvc_tls_ctx_unref(tls);
		return -ENOMEM;
	}
	if (kvcl_is_cluster_url(url)) {
		struct kvcl *cl;

		rc = kvcl_open(url, ns, token, timeout_ms, tls, &cl);
		c->ops = &kvcl_backend;
		c->be = cl;
		c->cluster = 1;
	} else {
		rc = kvc_engine_open(url, ns, token, timeout_ms, tls, &e);
		if (rc == 0) {
			rc = kvc_engine_connect(e);
			if (rc)
				kvc_engine_close(e);
		}
		c->ops = &kvc_engine_backend;
		c->be = e;
	}
	kvc_tls_ctx_unref(tls); /* the backend holds its own */
	if (rc) {
		free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void kvpool_close(struct kvpool_client *c)
{
	if (!c)
		return;
	c->ops->close(c->be);
	free(c);
}

void kvpool_set_timeout(struct kvpool_client *c, uint32_t timeout_ms)
{
	if (c)
		c->ops->set_timeout(c->be, timeout_ms);
}

void kvpool_set_busy_tries(struct kvpool_client *c, uint32_t tries)
{
	if (c)
		c->ops->set_busy_tries(c->be, tries);
}

int kvpool_get_limits(struct kvpool_client *c, struct kvpool_limits *out)
{
	if (!c || !out)
		return -EINVAL;
	return c->ops->get_limits(c->be, out);
}

int kvpool_get_counters(const struct kvpool_client *c, struct kvpool_counters *out)
{
	if (!c || !out)
		return -EINVAL;
	c->ops->get_counters(c->be, out);
	return 0;
}

int kvpool_register(struct kvpool_client *c, const void *buf, size_t len)
{
	if (!c)
		return -EINVAL;
	return c->ops->reg(c->be, buf, len);
}

int kvpool_unregister(struct kvpool_client *c, const void *buf)
{
	if (!c || !buf)
		return -EINVAL;
	return c->ops->unreg(c->be, buf);
}

int kvpool_set_segment_blocks(struct kvpool_client *c, uint32_t blocks)
{
	if (!c)
		return -EINVAL;
	if (!c->cluster)
		return -EOPNOTSUPP;
	return kvcl_set_segment_blocks(c->be, blocks);
}

/* ---- test hooks ------------------------------------------------------------------ */

void kvc_info(const struct kvpool_client *c, struct kvc_engine_info *out)
{
	kvc_engine_info(c->be, out);
}

int kvc_connected(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i.transport != NULL;
}

void kvc_disconnect(struct kvpool_client *c)
{
	kvc_engine_disconnect(c->be);
}

const struct kvc_region *kvc_region_find(const struct kvpool_client *c, const void *buf,
					 size_t len)
{
	return kvc_engine_region(c->be, buf, len);
}

const char *kvc_server_message(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i.server_message;
}

uint64_t kvc_checksum_errors(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i.checksum_errors;
}
