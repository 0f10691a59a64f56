/*
 * checksum.c - xxh3-64 over scatter-gather lists, the checksum the
 * protocol carries for every block.
 */
#include "checksum.h"
#include "kvpool.h"
/* XXH3_state_t on the stack (no allocation), AVX2 / AVX-512 entry points */
#include "proto_xxh3.h"

uint64_t kvc_iov_bytes(const struct iovec *iov, int iovcnt)
{
	uint64_t n = 0;

	for (int i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}

uint64_t kvc_checksum_prefix(const struct iovec *iov, int iovcnt, uint64_t bytes)
{
	XXH3_state_t st;

	if (iovcnt == 1 || (iovcnt > 1 && iov[0].iov_len >= bytes)) {
		size_t n = iov[0].iov_len < bytes ? iov[0].iov_len : (size_t)bytes;

		return XXH3_64bits(iov[0].iov_base, n);
	}
	XXH3_64bits_reset(&st);
	for (int i = 0; i < iovcnt && bytes; i++) {
		size_t n = iov[i].iov_len < bytes ? iov[i].iov_len : (size_t)bytes;

		XXH3_64bits_update(&st, iov[i].iov_base, n);
		bytes -= n;
	}
	return XXH3_64bits_digest(&st);
}

uint64_t kvpool_checksum(const struct iovec *iov, int iovcnt)
{
	if (!iov || iovcnt < 1)
		return XXH3_64bits(NULL, 0);
	return kvc_checksum_prefix(iov, iovcnt, UINT64_MAX);
}
