/*
 * errors.c - kvpool_strerror: one English line for every value the
 * library returns.
 */
#include <errno.h>

#include "kvpool.h"

const char *kvpool_strerror(int err)
{
	switch (err < 0 ? -err : err) {
	case 0:
		return "success";
	case ENOENT:
		return "not found";
	case ENOLINK:
		return "parent block not stored; nothing stored";
	case ENOSPC:
		return "pool full, nothing evictable (or output array too small)";
	case EDQUOT:
		return "quota exceeded: a namespace, token or lease limit (the server says which)";
	case EAGAIN:
		return "busy: the server asked to retry later (from kvpool_submit_*: too many "
		       "requests in flight on this handle (max_inflight): poll some first)";
	case EMSGSIZE:
		return "block too large, empty, or larger than its buffer";
	case EACCES:
		return "access denied: the token does not allow this namespace";
	case EPROTO:
		return "protocol error or malformed request";
	case EIO:
		return "server I/O error";
	case EOPNOTSUPP:
		return "not supported (URL scheme, protocol version, or rdma:// in this build)";
	case ENODEV:
		return "no RDMA device (rdma:// needs one)";
	case EBADMSG:
		return "checksum mismatch: block bytes corrupted";
	case EINVAL:
		return "invalid argument";
	case ENOMEM:
		return "out of memory";
	case ECONNREFUSED:
		return "connection refused: server not reachable";
	case ECONNRESET:
		return "connection lost";
	case EPIPE:
		return "connection closed by the server";
	case ETIMEDOUT:
		return "timed out";
	case EEXIST:
		return "memory region overlaps one already registered";
	case EPROTONOSUPPORT:
		return "protocol version not supported";
	case ECANCELED:
		return "request cancelled";
	case EBUSY:
		return "asynchronous requests are in flight";
	case EMFILE:
		return "too many open files";
	case EHOSTDOWN:
		return "no node could take it: every node that may hold it is down (not stored)";
	case ENXIO:
		return "no pool node is registered under that cluster name";
	case EPERM:
		return "operation not permitted (rdma://: memory registration refused, "
		       "e.g. RLIMIT_MEMLOCK too small)";
	case EINPROGRESS:
		return "in progress: not finished yet (a cancel the server may still carry out "
		       "(RDMA; the request completes as usual), or a removal finished when an "
		       "unreachable node is back)";
	case E2BIG:
		return "too many nodes: a handle uses at most 64";
	case ENOTCONN:
		return "not connected";
	default:
		return "unknown error";
	}
}
