/*
 * nvme_io.c - the NVMe tier's directory: lock, format version, segment
 * files, and aligned reads and writes on them (storage/nvme/NVME.md).
 *
 * Open order: the directory must exist and be writable, then LOCK is
 * flock()ed, then a probe file proves writes work and tells whether the
 * filesystem takes O_DIRECT, then FORMAT is checked (or written on a fresh
 * directory), then the segment files are opened and sized. Each step names
 * the path it failed on in `why`.
 *
 * I/O: one fd per segment, shared by every thread (pread/pwritev carry
 * their own offset). Short transfers and EINTR are retried; with O_DIRECT
 * a retry restarts at the last 4 KiB boundary reached, so every call the
 * kernel sees stays aligned.
 */
#include "nvme_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define FORMAT_PREFIX "kvpool-nvme "
#define SEGMENT_DIR "segments"
#define SEGMENT_NAME_DIGITS 8
#define PROBE_NAME ".probe"
/* iovecs handed to one pwritev call; longer vectors take several calls */
#define IOV_BATCH 64
/* calls in a row that move no whole 4 KiB page before giving up */
#define MAX_STALLS 8

struct store_nvme_io {
	char *dir;                 /* copied at open */
	int dir_fd;
	int lock_fd;               /* holds the flock */
	int *seg_fd;               /* segment_count fds */
	uint64_t *seg_had;         /* per segment: bytes its file held at open */
	bool fresh;                /* FORMAT was written by this open: nothing to lose */
	uint32_t segment_count;
	uint64_t segment_bytes;
	bool direct;
	store_log_fn log;
	void *log_arg;
};

/* printf into why[0..why_len) when the caller gave room for it. */
static void set_why(char *why, size_t why_len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;

	if (!why || !why_len)
		return;
	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
}

/* One log line through the store's log function, if any. */
static void io_log(const struct store_nvme_io *io, enum store_log_level level,
		   const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void io_log(const struct store_nvme_io *io, enum store_log_level level,
		   const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!io->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	io->log(io->log_arg, level, msg);
}

/* "<dir>/<name>" into buf; -EINVAL when it does not fit. */
static int join_path(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);

	return n < 0 || (size_t)n >= len ? -EINVAL : 0;
}

/* The directory exists, is a directory and looks writable. access() is
 * only the first check: root passes it everywhere except on a read-only
 * filesystem, so probe_dir() writes a real file afterwards. */
static int check_dir(const char *dir, char *why, size_t why_len)
{
	struct stat st;

	if (stat(dir, &st) < 0) {
		int err = errno;

		set_why(why, why_len, "nvme dir %s cannot be used: %s", dir, strerror(err));
		return err == ENOTDIR ? -ENOTDIR : err == EACCES ? -EACCES : -ENOENT;
	}
	if (!S_ISDIR(st.st_mode)) {
		set_why(why, why_len, "nvme dir %s is not a directory", dir);
		return -ENOTDIR;
	}
	if (access(dir, W_OK | X_OK) < 0) {
		int err = errno;

		set_why(why, why_len, "nvme dir %s is not writable: %s", dir, strerror(err));
		return -EACCES;
	}
	return 0;
}

/* Open <dir>/LOCK and take an exclusive flock on it, without waiting: a
 * second kvpoold (or a second open in this process: flock conflicts
 * between open file descriptions) gets -EBUSY. */
static int take_lock(struct store_nvme_io *io, char *why, size_t why_len)
{
	char path[PATH_MAX];
	int fd;

	if (join_path(path, sizeof(path), io->dir, "LOCK")) {
		set_why(why, why_len, "nvme dir %s: path too long", io->dir);
		return -EINVAL;
	}
	fd = openat(io->dir_fd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		int err = errno;

		set_why(why, why_len, "cannot create %s: %s", path, strerror(err));
		return err == ENOSPC || err == EDQUOT ? -ENOSPC : -EACCES;
	}
	while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int err = errno;

		if (err == EINTR)
			continue;
		close(fd);
		if (err == EWOULDBLOCK) {
			set_why(why, why_len, "nvme dir %s is in use: %s is locked by another process",
				io->dir, path);
			return -EBUSY;
		}
		set_why(why, why_len, "cannot lock %s: %s", path, strerror(err));
		return -EIO;
	}
	io->lock_fd = fd;
	return 0;
}

/* Write one aligned page to fd at offset 0 and read it back; -errno of
 * the first call that fails (EINVAL: O_DIRECT refused at I/O time). */
static int probe_page(int fd)
{
	void *page;
	int rc = 0;

	if (posix_memalign(&page, STORE_NVME_ALIGN_BYTES, STORE_NVME_ALIGN_BYTES))
		return -ENOMEM;
	memset(page, 0x5a, STORE_NVME_ALIGN_BYTES);
	errno = 0;
	if (pwrite(fd, page, STORE_NVME_ALIGN_BYTES, 0) != STORE_NVME_ALIGN_BYTES)
		rc = errno ? -errno : -EIO;
	else if (pread(fd, page, STORE_NVME_ALIGN_BYTES, 0) != STORE_NVME_ALIGN_BYTES)
		rc = errno ? -errno : -EIO;
	free(page);
	return rc;
}

/* Create, write and remove a probe file in the directory: proves writes
 * really work (root passes access(), a full or read-only filesystem does
 * not pass this) and finds out whether O_DIRECT is accepted, both at
 * open() and at I/O time. Sets io->direct. */
static int probe_dir(struct store_nvme_io *io, char *why, size_t why_len)
{
	int fd, rc;

	io->direct = true;
	errno = 0;
	fd = openat(io->dir_fd, PROBE_NAME, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
	if (fd < 0 && errno == EINVAL) {
		io->direct = false;
		fd = openat(io->dir_fd, PROBE_NAME, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	}
	if (fd < 0) {
		int err = errno;

		set_why(why, why_len, "nvme dir %s is not writable: cannot create %s/%s: %s",
			io->dir, io->dir, PROBE_NAME, strerror(err));
		return err == ENOSPC || err == EDQUOT ? -ENOSPC : -EACCES;
	}
	rc = probe_page(fd);
	if (rc == -EINVAL && io->direct) {
		/* the open took O_DIRECT but the filesystem refuses the I/O */
		io->direct = false;
		if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) == 0)
			rc = probe_page(fd);
	}
	close(fd);
	unlinkat(io->dir_fd, PROBE_NAME, 0);
	if (rc) {
		set_why(why, why_len, "nvme dir %s is not writable: writing %s/%s: %s",
			io->dir, io->dir, PROBE_NAME, strerror(-rc));
		return rc == -ENOSPC || rc == -EDQUOT ? -ENOSPC : rc == -ENOMEM ? -ENOMEM : -EACCES;
	}
	if (!io->direct)
		io_log(io, STORE_LOG_WARN,
		       "nvme dir %s: the filesystem refuses o_direct, using buffered i/o", io->dir);
	return 0;
}

/* Parse a FORMAT file's bytes: 0 and *version when they read
 * "kvpool-nvme <decimal>\n" exactly, -EPROTONOSUPPORT otherwise. */
static int parse_format(const char *buf, size_t len, unsigned long *version)
{
	size_t plen = strlen(FORMAT_PREFIX), i;
	unsigned long v = 0;

	if (len < plen + 2 || memcmp(buf, FORMAT_PREFIX, plen) || buf[len - 1] != '\n')
		return -EPROTONOSUPPORT;
	for (i = plen; i < len - 1; i++) {
		if (buf[i] < '0' || buf[i] > '9' || v > 1000000)
			return -EPROTONOSUPPORT;
		v = v * 10 + (unsigned long)(buf[i] - '0');
	}
	*version = v;
	return 0;
}

/* Check an existing FORMAT file: this build reads exactly its own version
 * and never guesses at another. */
static int check_format(struct store_nvme_io *io, int fd, char *why, size_t why_len)
{
	char buf[64];
	unsigned long version;
	ssize_t n;

	do {
		n = pread(fd, buf, sizeof(buf), 0);
	} while (n < 0 && errno == EINTR);
	if (n < 0) {
		set_why(why, why_len, "cannot read %s/FORMAT: %s (this build reads format version %d)",
			io->dir, strerror(errno), STORE_NVME_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (parse_format(buf, (size_t)n, &version)) {
		set_why(why, why_len,
			"%s/FORMAT is not a kvpool-nvme format file; this build reads format version %d",
			io->dir, STORE_NVME_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (version != STORE_NVME_FORMAT_VERSION) {
		set_why(why, why_len,
			"nvme dir %s has on-disk format version %lu; this build reads version %d only",
			io->dir, version, STORE_NVME_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	return 0;
}

/* Does <dir>/<name> exist (as anything)? */
static bool dir_has(const struct store_nvme_io *io, const char *name)
{
	struct stat st;

	return fstatat(io->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Write FORMAT for a fresh directory: to a temporary name, synced, then
 * renamed, so a crash never leaves a half-written FORMAT behind. */
static int write_format(struct store_nvme_io *io, char *why, size_t why_len)
{
	char text[32];
	int fd, len, rc = 0;

	len = snprintf(text, sizeof(text), FORMAT_PREFIX "%d\n", STORE_NVME_FORMAT_VERSION);
	fd = openat(io->dir_fd, "FORMAT.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_why;
	}
	errno = 0;
	if (write(fd, text, (size_t)len) != len || fsync(fd) < 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	if (!rc && renameat(io->dir_fd, "FORMAT.tmp", io->dir_fd, "FORMAT") < 0)
		rc = -errno;
	if (!rc) {
		fsync(io->dir_fd);
		return 0;
	}
out_why:
	set_why(why, why_len, "cannot write %s/FORMAT: %s", io->dir, strerror(-rc));
	return rc == -ENOSPC || rc == -EDQUOT ? -ENOSPC : -EIO;
}

/* Check FORMAT, or write it when the directory is fresh. A directory that
 * already holds segments/ or index/ but no FORMAT is not ours to guess
 * at. Other files (lost+found on a mount point) are left alone. */
static int open_format(struct store_nvme_io *io, char *why, size_t why_len)
{
	int fd, rc;

	fd = openat(io->dir_fd, "FORMAT", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		rc = check_format(io, fd, why, why_len);
		close(fd);
		return rc;
	}
	if (errno != ENOENT) {
		set_why(why, why_len, "cannot open %s/FORMAT: %s (this build reads format version %d)",
			io->dir, strerror(errno), STORE_NVME_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (dir_has(io, SEGMENT_DIR) || dir_has(io, "index")) {
		set_why(why, why_len,
			"nvme dir %s holds segments or an index but no FORMAT file; "
			"refusing to guess its format (this build reads version %d)",
			io->dir, STORE_NVME_FORMAT_VERSION);
		return -EPROTONOSUPPORT;
	}
	io->fresh = true;
	return write_format(io, why, why_len);
}

/* Segment file name of number `n`: 8 decimal digits. */
static void segment_name(char *buf, size_t len, uint32_t n)
{
	snprintf(buf, len, SEGMENT_DIR "/%0*" PRIu32, SEGMENT_NAME_DIGITS, n);
}

/* -errno of a failed file creation or resize, as store_nvme_io_open
 * reports it. */
static int create_error(int err)
{
	if (err == ENOSPC || err == EDQUOT)
		return -ENOSPC;
	if (err == ENOMEM)
		return -ENOMEM;
	return -EIO;
}

/* Open segment n, creating it, and make it exactly segment_bytes long
 * (ftruncate: sparse, no space is taken until written). Remembers how many
 * bytes the file held before (0 when it was missing), so that index
 * records pointing past them are known to name bytes that are gone. */
static int open_segment(struct store_nvme_io *io, uint32_t n, char *why, size_t why_len)
{
	char name[32];
	struct stat st;
	int fd, err, flags = O_RDWR | O_CLOEXEC | (io->direct ? O_DIRECT : 0);

	segment_name(name, sizeof(name), n);
	fd = openat(io->dir_fd, name, flags);
	if (fd < 0 && errno == ENOENT)
		fd = openat(io->dir_fd, name, flags | O_CREAT, 0644);
	if (fd < 0) {
		err = errno;
		goto out_why;
	}
	if (fstat(fd, &st) < 0) {
		err = errno;
		goto out_close;
	}
	io->seg_had[n] = (uint64_t)st.st_size;
	if ((uint64_t)st.st_size != io->segment_bytes &&
	    ftruncate(fd, (off_t)io->segment_bytes) < 0) {
		err = errno;
		goto out_close;
	}
	io->seg_fd[n] = fd;
	return 0;
out_close:
	close(fd);
out_why:
	set_why(why, why_len, "cannot create segment file %s/%s: %s%s", io->dir, name,
		strerror(err), err == EMFILE || err == ENFILE ?
		" (one file per segment is kept open: raise the fd limit or the segment size)" : "");
	return create_error(err);
}

uint64_t store_nvme_io_segment_had(const struct store_nvme_io *io, uint32_t n)
{
	if (n >= io->segment_count)
		return 0;
	return io->fresh ? io->segment_bytes : io->seg_had[n];
}

/* Parse a segment file name; false for anything else in segments/. */
static bool parse_segment_name(const char *name, uint32_t *n)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < SEGMENT_NAME_DIGITS; i++) {
		if (name[i] < '0' || name[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(name[i] - '0');
	}
	if (name[i] || v > UINT32_MAX)
		return false;
	*n = (uint32_t)v;
	return true;
}

/* Delete segment files numbered segment_count and above: the capacity
 * shrank since the last open (the store drops their index records). */
static int trim_segments(struct store_nvme_io *io, int seg_dir_fd)
{
	int fd = dup(seg_dir_fd);
	struct dirent *de;
	DIR *d;
	uint32_t n, removed = 0;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d)) != NULL) {
		if (!parse_segment_name(de->d_name, &n) || n < io->segment_count)
			continue;
		removed += unlinkat(seg_dir_fd, de->d_name, 0) == 0;
	}
	closedir(d);
	if (removed)
		io_log(io, STORE_LOG_WARN,
		       "nvme dir %s: nvme_capacity shrank: removed %u segment files beyond the "
		       "new %u segments, and every block they held",
		       io->dir, removed, io->segment_count);
	return 0;
}

/* Bytes the existing segment files numbered below the count hold on disk
 * (the tier may reuse them), 0 when there is no segments/ yet. */
static uint64_t existing_segment_bytes(struct store_nvme_io *io)
{
	char name[32];
	uint64_t sum = 0;
	int fd = openat(io->dir_fd, SEGMENT_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	for (uint32_t n = 0; n < io->segment_count; n++) {
		struct stat sb;

		snprintf(name, sizeof(name), "%08" PRIu32, n);
		if (fstatat(fd, name, &sb, 0) == 0)
			sum += (uint64_t)sb.st_blocks * 512;
	}
	close(fd);
	return sum;
}

/* Before any segment file is created: the process may keep one file
 * descriptor per segment open (the soft limit is raised towards the hard
 * one if needed), and the filesystem has room for the whole capacity
 * (free space plus what existing segments already hold). Errors: -EMFILE,
 * -ENOSPC, with the figures in why. */
int store_nvme_io_check_fds(const char *dir, uint64_t segment_bytes, uint32_t segment_count,
			    char *why, size_t why_len)
{
	uint64_t need_fds = (uint64_t)segment_count + STORE_NVME_SPARE_FDS;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= need_fds)
		return 0;
	{
		struct rlimit up = rl;

		up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need_fds ? need_fds
										: rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			rl = up;
	}
	if (rl.rlim_cur >= need_fds)
		return 0;
	set_why(why, why_len, "nvme dir %s: %" PRIu32 " segments of %" PRIu64 " bytes need %" PRIu64
		" open files, but the limit is %llu: raise it (LimitNOFILE, ulimit -n), or use "
		"larger segments (nvme_segment_size) or a smaller nvme_capacity", dir,
		segment_count, segment_bytes, need_fds, (unsigned long long)rl.rlim_cur);
	return -EMFILE;
}

static int check_limits(struct store_nvme_io *io, char *why, size_t why_len)
{
	uint64_t capacity = (uint64_t)io->segment_count * io->segment_bytes, room;
	struct statvfs vfs;
	int rc = store_nvme_io_check_fds(io->dir, io->segment_bytes, io->segment_count, why,
					 why_len);

	if (rc)
		return rc;
	if (fstatvfs(io->dir_fd, &vfs) == 0) {
		room = (uint64_t)vfs.f_bavail * vfs.f_frsize + existing_segment_bytes(io);
		if (capacity > room) {
			set_why(why, why_len, "nvme dir %s: nvme_capacity (%" PRIu64 " bytes) is more "
				"than the filesystem can hold (%" PRIu64 " bytes free, counting "
				"existing segments): lower nvme_capacity or free space", io->dir,
				capacity, room);
			return -ENOSPC;
		}
	}
	return 0;
}

/* Create segments/ if needed, drop segment files past the count, and
 * open every segment. */
static int open_segments(struct store_nvme_io *io, char *why, size_t why_len)
{
	uint32_t n;
	int fd, rc, err;

	if (mkdirat(io->dir_fd, SEGMENT_DIR, 0755) < 0 && errno != EEXIST) {
		err = errno;
		set_why(why, why_len, "cannot create %s/%s: %s", io->dir, SEGMENT_DIR,
			strerror(err));
		return create_error(err);
	}
	fd = openat(io->dir_fd, SEGMENT_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		err = errno;
		set_why(why, why_len, "cannot open %s/%s: %s", io->dir, SEGMENT_DIR,
			strerror(err));
		return create_error(err);
	}
	trim_segments(io, fd);
	close(fd);
	for (n = 0; n < io->segment_count; n++) {
		rc = open_segment(io, n, why, why_len);
		if (rc)
			return rc;
	}
	return 0;
}

/* A handle with no files open yet. */
static struct store_nvme_io *io_new(const char *dir, uint64_t segment_bytes,
				    uint32_t segment_count, store_log_fn log, void *log_arg)
{
	struct store_nvme_io *io = calloc(1, sizeof(*io));
	uint32_t n;

	if (!io)
		return NULL;
	io->dir = strdup(dir);
	io->seg_fd = malloc(sizeof(*io->seg_fd) * segment_count);
	io->seg_had = calloc(segment_count, sizeof(*io->seg_had));
	if (!io->dir || !io->seg_fd || !io->seg_had) {
		free(io->dir);
		free(io->seg_fd);
		free(io->seg_had);
		free(io);
		return NULL;
	}
	for (n = 0; n < segment_count; n++)
		io->seg_fd[n] = -1;
	io->dir_fd = -1;
	io->lock_fd = -1;
	io->segment_bytes = segment_bytes;
	io->segment_count = segment_count;
	io->log = log;
	io->log_arg = log_arg;
	return io;
}

int store_nvme_io_open(const char *dir, uint64_t segment_bytes, uint32_t segment_count,
		       store_log_fn log, void *log_arg, struct store_nvme_io **out,
		       char *why, size_t why_len)
{
	struct store_nvme_io *io;
	int rc;

	if (!dir || !*dir || !segment_bytes || segment_bytes % STORE_NVME_ALIGN_BYTES ||
	    segment_bytes > (uint64_t)INT64_MAX / 2 || segment_count < 2) {
		set_why(why, why_len, "nvme: segment size must be a non-zero multiple of 4 KiB "
			"and there must be at least two segments");
		return -EINVAL;
	}
	rc = check_dir(dir, why, why_len);
	if (rc)
		return rc;
	io = io_new(dir, segment_bytes, segment_count, log, log_arg);
	if (!io) {
		set_why(why, why_len, "nvme dir %s: out of memory", dir);
		return -ENOMEM;
	}
	io->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (io->dir_fd < 0) {
		int err = errno;

		rc = err == ENOTDIR ? -ENOTDIR : err == ENOENT ? -ENOENT : -EACCES;
		set_why(why, why_len, "cannot open nvme dir %s: %s", dir, strerror(err));
		goto out_close;
	}
	rc = take_lock(io, why, why_len);
	if (!rc)
		rc = probe_dir(io, why, why_len);
	if (!rc)
		rc = check_limits(io, why, why_len);
	if (!rc)
		rc = open_format(io, why, why_len);
	if (!rc)
		rc = open_segments(io, why, why_len);
	if (rc)
		goto out_close;
	*out = io;
	return 0;
out_close:
	store_nvme_io_close(io);
	return rc;
}

void store_nvme_io_close(struct store_nvme_io *io)
{
	uint32_t n;

	if (!io)
		return;
	for (n = 0; n < io->segment_count; n++)
		if (io->seg_fd[n] >= 0)
			close(io->seg_fd[n]);
	if (io->lock_fd >= 0)
		close(io->lock_fd); /* releases the flock */
	if (io->dir_fd >= 0)
		close(io->dir_fd);
	free(io->seg_fd);
	free(io->seg_had);
	free(io->dir);
	free(io);
}

bool store_nvme_io_direct(const struct store_nvme_io *io)
{
	return io->direct;
}

/* Is [offset, offset + bytes) an aligned, non-empty range inside one
 * segment? */
static bool range_ok(const struct store_nvme_io *io, uint32_t segment, uint64_t offset,
		     uint64_t bytes)
{
	return segment < io->segment_count && bytes && offset % STORE_NVME_ALIGN_BYTES == 0 &&
	       bytes % STORE_NVME_ALIGN_BYTES == 0 && offset <= io->segment_bytes &&
	       bytes <= io->segment_bytes - offset;
}

/* Total bytes of an iovec array, or 0 when an element is misaligned. */
static uint64_t iov_aligned_bytes(const struct iovec *iov, int iovcnt)
{
	uint64_t total = 0;
	int i;

	for (i = 0; i < iovcnt; i++) {
		if ((uintptr_t)iov[i].iov_base % STORE_NVME_ALIGN_BYTES ||
		    iov[i].iov_len % STORE_NVME_ALIGN_BYTES)
			return 0;
		total += iov[i].iov_len;
	}
	return total;
}

/* How many bytes of a transfer count as done: with O_DIRECT only whole
 * pages, so the retry of a short transfer stays aligned (rewriting or
 * rereading the bytes of a partial page is harmless). */
static uint64_t progress(const struct store_nvme_io *io, uint64_t moved)
{
	return io->direct ? moved - moved % STORE_NVME_ALIGN_BYTES : moved;
}

/* -errno of a failed write, as store_nvme_io_writev reports it. */
static int write_error(int err)
{
	return err == ENOSPC || err == EDQUOT ? -ENOSPC : -EIO;
}

/* Fill batch[] with up to IOV_BATCH elements of iov[] starting `skip`
 * bytes into element *idx (skipping empty ones); returns the count. */
static int fill_batch(struct iovec *batch, const struct iovec *iov, int iovcnt, int idx,
		      uint64_t skip)
{
	int n = 0;

	for (; idx < iovcnt && n < IOV_BATCH; idx++) {
		if (iov[idx].iov_len <= skip) {
			skip -= iov[idx].iov_len;
			continue;
		}
		batch[n].iov_base = (uint8_t *)iov[idx].iov_base + skip;
		batch[n].iov_len = iov[idx].iov_len - skip;
		skip = 0;
		n++;
	}
	return n;
}

int store_nvme_io_writev(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
			 const struct iovec *iov, int iovcnt)
{
	struct iovec batch[IOV_BATCH];
	uint64_t total, done = 0, skip = 0;
	int idx = 0, stalls = 0, fd;

	if (!iov || iovcnt <= 0)
		return -EINVAL;
	total = iov_aligned_bytes(iov, iovcnt);
	if (!range_ok(io, segment, offset, total))
		return -EINVAL;
	fd = io->seg_fd[segment];
	while (done < total) {
		int n = fill_batch(batch, iov, iovcnt, idx, skip);
		ssize_t w = pwritev(fd, batch, n, (off_t)(offset + done));
		uint64_t step;

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return write_error(errno);
		}
		if (w == 0)
			return -EIO;
		step = progress(io, (uint64_t)w);
		if (!step && ++stalls > MAX_STALLS)
			return -EIO;
		if (step)
			stalls = 0;
		done += step;
		/* move the cursor (idx, skip) forward by step bytes */
		skip += step;
		while (idx < iovcnt && skip >= iov[idx].iov_len) {
			skip -= iov[idx].iov_len;
			idx++;
		}
	}
	return 0;
}

int store_nvme_io_read(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
		       void *buf, uint64_t bytes)
{
	uint64_t done = 0;
	int stalls = 0, fd;

	if (!buf || (uintptr_t)buf % STORE_NVME_ALIGN_BYTES || !range_ok(io, segment, offset, bytes))
		return -EINVAL;
	fd = io->seg_fd[segment];
	while (done < bytes) {
		ssize_t r = pread(fd, (uint8_t *)buf + done, bytes - done, (off_t)(offset + done));
		uint64_t step;

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -EIO;
		}
		if (r == 0)
			return -EIO; /* the file ends early: someone truncated it */
		step = progress(io, (uint64_t)r);
		if (!step && ++stalls > MAX_STALLS)
			return -EIO;
		if (step)
			stalls = 0;
		done += step;
	}
	return 0;
}

int store_nvme_io_discard(struct store_nvme_io *io, uint32_t segment)
{
	if (segment >= io->segment_count)
		return -EINVAL;
	if (fallocate(io->seg_fd[segment], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		      (off_t)io->segment_bytes) < 0)
		return -errno;
	return 0;
}

int store_nvme_io_free_bytes(struct store_nvme_io *io, uint64_t *out)
{
	struct statvfs sv;

	if (fstatvfs(io->dir_fd, &sv) < 0)
		return -EIO;
	*out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
	return 0;
}
