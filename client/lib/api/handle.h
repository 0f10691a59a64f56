/*
 * handle.h - the public handle (internal to libkvpool's api/ layer): a
 * backend chosen once at kvpool_connect, an engine for one node or a
 * cluster over one engine per node, and the one copy of kvpool.h's
 * argument rules.
 */
#ifndef KVC_HANDLE_H
#define KVC_HANDLE_H

#include "kvpool.h"
#include "lib/engine/engine.h"

struct kvpool_client {
	const struct kvc_backend *ops;
	void *be;        /* struct kvc_engine or struct kvcl */
	int cluster;     /* be is a cluster */
};

/* kvpool.h's argument rules for a request, once for the blocking calls,
 * their asynchronous twins and both backends: 0, or -EINVAL (NULL arrays
 * with a nonzero count, a block without a key, a scatter-gather list the
 * library cannot use: no entry, a NULL base under a nonzero length,
 * lengths whose sum overflows 64 bits; EXISTS without statuses). */
int kvc_req_check(const struct kvc_req *r);

#endif /* KVC_HANDLE_H */
