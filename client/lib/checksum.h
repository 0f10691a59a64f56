/*
 * checksum.h - block checksums over scatter-gather lists (internal to
 * libkvpool; kvpool_checksum is the public form).
 */
#ifndef KVC_CHECKSUM_H
#define KVC_CHECKSUM_H

#include <stdint.h>
#include <sys/uio.h>

/* Total bytes of iov[0..iovcnt). iovcnt < 1 gives 0. Cannot fail. */
uint64_t kvc_iov_bytes(const struct iovec *iov, int iovcnt);

/* xxh3-64 (seed 0) of the first `bytes` bytes of iov[0..iovcnt) (all of
 * them if the list holds fewer). Cannot fail. */
uint64_t kvc_checksum_prefix(const struct iovec *iov, int iovcnt, uint64_t bytes);

#endif /* KVC_CHECKSUM_H */
