/*
 * args.c - the one copy of kvpool.h's argument rules (handle.h). A bad
 * request is -EINVAL before anything is sent and the connection is kept.
 */
#include <errno.h>
#include <stdint.h>

#include "handle.h"

/* A scatter-gather list the library may read or write: at least one
 * entry, no NULL base under a nonzero length (else a crash in the
 * checksum, or a failed read that costs the connection), and a total that
 * fits in 64 bits. */
static int iov_valid(const struct iovec *iov, int iovcnt)
{
	uint64_t total = 0;

	if (!iov || iovcnt < 1)
		return 0;
	for (int i = 0; i < iovcnt; i++) {
		if (!iov[i].iov_base && iov[i].iov_len)
			return 0;
		if (iov[i].iov_len > UINT64_MAX - total)
			return 0;
		total += iov[i].iov_len;
	}
	return 1;
}

int kvc_req_check(const struct kvc_req *r)
{
	switch (r->op) {
	case KVPOOL_OP_PUT:
		if (r->count && !r->put)
			return -EINVAL;
		for (size_t i = 0; i < r->count; i++)
			if (!r->put[i].key || !iov_valid(r->put[i].iov, r->put[i].iovcnt))
				return -EINVAL;
		return 0;
	case KVPOOL_OP_GET:
		if (r->count && !r->get)
			return -EINVAL;
		for (size_t i = 0; i < r->count; i++)
			if (!r->get[i].key || !iov_valid(r->get[i].iov, r->get[i].iovcnt))
				return -EINVAL;
		return 0;
	case KVPOOL_OP_EXISTS:
		return r->count && (!r->keys || !r->statuses) ? -EINVAL : 0;
	case KVPOOL_OP_MATCH:
		/* want above count: an argument error the library can see (the
		 * server would refuse it BAD_REQUEST, a cluster's nodes could not) */
		if (r->mopts.want > r->count)
			return -EINVAL;
		return r->count && !r->keys ? -EINVAL : 0;
	case KVPOOL_OP_DELETE:
		return r->count && !r->keys ? -EINVAL : 0;
	default:
		return -EINVAL;
	}
}
