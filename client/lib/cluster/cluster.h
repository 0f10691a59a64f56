/*
 * cluster.h - one libkvpool handle over several kvpoold nodes (internal;
 * the public side is kvpool_connect's node-list and etcd:// URLs in
 * kvpool.h, and docs/cluster.md).
 *
 * A cluster is a second backend with the engine's interface (struct
 * kvc_backend, engine/engine.h): sync and async calls, cancel, the event
 * descriptor, registration. Each call is a parent request whose children
 * are requests on the node engines (one child per node that owns part of
 * the call); a thread per node drives its engine and posts the children's
 * completions back, so N nodes' receive and checksum work runs on N
 * cores. See cluster_impl.h for the parts.
 *
 * Threads: every call may be made from any thread at any time, as on a
 * one-node handle; kvpool_close must not overlap any other call.
 */
#ifndef KVC_CLUSTER_H
#define KVC_CLUSTER_H

#include <stdint.h>

#include "lib/engine/engine.h"

struct kvc_tls_ctx;
struct kvcl;

/* The cluster's backend table (be: a struct kvcl). */
extern const struct kvc_backend kvcl_backend;

/* Is `url` a cluster URL (a comma, or etcd://)? */
int kvcl_is_cluster_url(const char *url);

/* Open a cluster for a node list ("tcp://a:7470,b:7470"; scheme on the
 * first or on each) or "etcd://HOST[:PORT]/CLUSTER", namespace ns, token
 * (may be NULL), per-request timeout (0: the default), TLS settings for
 * tls:// nodes (may be NULL; the cluster takes a reference and gives one
 * to every node's engine); connects to every
 * member. Errors: -EINVAL (bad URL or namespace, token too long), -ENOMEM,
 * -ECONNREFUSED / -ETIMEDOUT / -EPROTO (etcd could not be read at
 * connect), -E2BIG (more than KVCL_MAX_NODES nodes), and for a list none
 * of whose nodes answers, the first node's error. */
int kvcl_open(const char *url, const char *ns, const char *token, uint32_t timeout_ms,
	      struct kvc_tls_ctx *tls, struct kvcl **out);

/* kvpool_set_segment_blocks. Errors: -EINVAL (more than 65536). */
int kvcl_set_segment_blocks(struct kvcl *cl, uint32_t blocks);

#endif /* KVC_CLUSTER_H */
