/*
 * nvme_io.h - the NVMe tier's files: the directory lock, the format
 * version, and the segment files that hold payload bytes.
 *
 * Internal to storage/ (never included outside it). Knows nothing of
 * blocks: the store decides what goes where; this file only moves
 * 4 KiB-aligned byte ranges between memory and segment files.
 *
 * Directory layout (storage/nvme/NVME.md):
 *   <dir>/LOCK            flock()ed for the life of the process
 *   <dir>/FORMAT          "kvpool-nvme <version>\n"
 *   <dir>/segments/NNNNNNNN  segment files, fixed size, numbered 0..count-1
 *   <dir>/index/          the RocksDB index (nvme_index.h)
 *
 * Threads: read and write may run from several threads at once (pread /
 * pwrite on shared fds); open and close from one.
 */
#ifndef KVPOOL_NVME_IO_H
#define KVPOOL_NVME_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "store.h"

#define STORE_NVME_FORMAT_VERSION 1
#define STORE_NVME_ALIGN_BYTES 4096

struct store_nvme_io;

/* Lock `dir`, check or write its FORMAT file, and open (creating or
 * resizing as needed) `segment_count` segment files of `segment_bytes`
 * each. Probes O_DIRECT on a segment; where the filesystem refuses it
 * (tmpfs, some overlays), uses buffered I/O and logs that once through
 * log(log_arg, STORE_LOG_WARN, ...). Segment files beyond segment_count
 * (a smaller capacity than last time) are deleted, with a warning; the
 * caller drops their index records. Before any segment file is created
 * the open checks that segment_count + STORE_NVME_SPARE_FDS descriptors
 * fit the process's limit (raising the soft limit up to the hard one)
 * and that the filesystem's free space plus what the existing segment
 * files hold covers segment_count * segment_bytes. why[0..why_len) (may
 * be NULL) receives a one-line reason naming the path on failure.
 * Errors: -EINVAL (segment_bytes not a 4 KiB multiple or 0, count < 2),
 *   -ENOENT / -ENOTDIR (dir), -EACCES (dir not writable), -EBUSY (LOCK
 *   held by another process), -EPROTONOSUPPORT (FORMAT names another
 *   version or is unreadable), -EMFILE (too many segments for the fd
 *   limit), -ENOSPC (the capacity does not fit the filesystem), -ENOMEM,
 *   -EIO / -ENOSPC (creating files). */
/* Descriptors kept free beside one per segment: RocksDB's files, the
 * server's sockets. */
#define STORE_NVME_SPARE_FDS 256u

int store_nvme_io_open(const char *dir, uint64_t segment_bytes, uint32_t segment_count,
		       store_log_fn log, void *log_arg, struct store_nvme_io **out,
		       char *why, size_t why_len);

/* The fd check of store_nvme_io_open alone, for a caller that wants it
 * before allocating anything per segment: may this process keep
 * segment_count + STORE_NVME_SPARE_FDS descriptors open (the soft limit
 * is raised towards the hard one if needed)? dir names the directory in
 * why. 0 or -EMFILE. */
int store_nvme_io_check_fds(const char *dir, uint64_t segment_bytes, uint32_t segment_count,
			    char *why, size_t why_len);

/* Bytes segment n's file held when the directory was opened: 0 when the
 * file was missing, less than a segment when it had been truncated, the
 * segment size for a directory this open wrote fresh. An index record
 * reaching past it names bytes that are gone. 0 for n out of range. */
uint64_t store_nvme_io_segment_had(const struct store_nvme_io *io, uint32_t n);

/* Close the files and release the lock. Accepts NULL. */
void store_nvme_io_close(struct store_nvme_io *io);

/* true when O_DIRECT is in use. */
bool store_nvme_io_direct(const struct store_nvme_io *io);

/* Write iov[0..iovcnt) to segment `segment` at byte `offset`, wholly or
 * not at all (a short write is retried; a failure leaves the range's old
 * contents undefined). offset, every iov_base and iov_len are 4 KiB
 * aligned (O_DIRECT's rule; arena extents satisfy it); the range lies
 * inside the segment. Does not fsync (a cache: the page cache or the
 * device's own ordering is enough; metadata is committed after this
 * returns). Errors: -EINVAL (misaligned or out of range), -ENOSPC, -EIO. */
int store_nvme_io_writev(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
			 const struct iovec *iov, int iovcnt);

/* Read `bytes` (4 KiB multiple) at `offset` of segment `segment` into buf
 * (4 KiB aligned). Errors: -EINVAL (misaligned or out of range), -EIO
 * (read error or short read). */
int store_nvme_io_read(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
		       void *buf, uint64_t bytes);

/* Bytes the filesystem holding the directory has free for us (statvfs
 * f_bavail * f_frsize). Segment files are sparse, so a write may need
 * new space; the store checks this before writing so that a full disk is
 * met here, not inside RocksDB (whose write-ahead log, once a write failed
 * for want of space, cannot be closed cleanly). Errors: -EIO. */
int store_nvme_io_free_bytes(struct store_nvme_io *io, uint64_t *out);

/* Tell the filesystem a segment's bytes are no longer needed
 * (fallocate PUNCH_HOLE where supported; nothing otherwise). Best effort:
 * returns 0 or -errno, and the segment stays usable either way. */
int store_nvme_io_discard(struct store_nvme_io *io, uint32_t segment);

#endif /* KVPOOL_NVME_IO_H */
