/*
 * rofs.c - an LD_PRELOAD library that turns one directory read-only while
 * a program runs, as an ext4 error remounting the filesystem would: once
 * the file named by ROFS_TRIGGER exists, every write-like call on a file
 * under ROFS_DIR (by its path, or by the path /proc/self/fd gives an fd)
 * fails with EROFS. Used by tests/integration/test_nvme_crash.c against
 * kvpoold's nvme_dir (the segment files and RocksDB's own files).
 *
 * Wrapped: open/openat (for writing or creating), write, pwrite, writev,
 * pwritev, fsync, fdatasync, sync_file_range, fallocate, ftruncate,
 * rename, unlink, mkdir. Reads are left alone. Built without sanitizers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Is the trigger there? (checked on every call: the test creates it
 * while the program runs) */
static int armed(void)
{
	const char *t = getenv("ROFS_TRIGGER");
	struct stat sb;

	return t && stat(t, &sb) == 0;
}

static int under_dir(const char *path)
{
	const char *d = getenv("ROFS_DIR");
	size_t n;

	if (!d || !path)
		return 0;
	n = strlen(d);
	return strncmp(path, d, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

static int fd_under_dir(int fd)
{
	char link[64], path[4096];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	return under_dir(path);
}

#define REAL(name) static __typeof__(name) *real_##name; \
	if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

#define REFUSE_FD(fd) do { if (armed() && fd_under_dir(fd)) { errno = EROFS; return -1; } } while (0)
#define REFUSE_PATH(p) do { if (armed() && under_dir(p)) { errno = EROFS; return -1; } } while (0)

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;
	REAL(open);

	va_start(ap, flags);
	if (flags & (O_CREAT | O_TMPFILE))
		mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC))
		REFUSE_PATH(path);
	return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;
	REAL(open64);

	va_start(ap, flags);
	if (flags & (O_CREAT | O_TMPFILE))
		mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC))
		REFUSE_PATH(path);
	return real_open64(path, flags, mode);
}

ssize_t write(int fd, const void *buf, size_t n)
{
	REAL(write);
	REFUSE_FD(fd);
	return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	REAL(pwrite);
	REFUSE_FD(fd);
	return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	REAL(pwrite64);
	REFUSE_FD(fd);
	return real_pwrite64(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	REAL(writev);
	REFUSE_FD(fd);
	return real_writev(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	REAL(pwritev);
	REFUSE_FD(fd);
	return real_pwritev(fd, iov, cnt, off);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
{
	REAL(pwritev64);
	REFUSE_FD(fd);
	return real_pwritev64(fd, iov, cnt, off);
}

int fsync(int fd)
{
	REAL(fsync);
	REFUSE_FD(fd);
	return real_fsync(fd);
}

int fdatasync(int fd)
{
	REAL(fdatasync);
	REFUSE_FD(fd);
	return real_fdatasync(fd);
}

int sync_file_range(int fd, off_t off, off_t n, unsigned int flags)
{
	REAL(sync_file_range);
	REFUSE_FD(fd);
	return real_sync_file_range(fd, off, n, flags);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	REAL(fallocate);
	REFUSE_FD(fd);
	return real_fallocate(fd, mode, off, len);
}

int fallocate64(int fd, int mode, off_t off, off_t len)
{
	REAL(fallocate64);
	REFUSE_FD(fd);
	return real_fallocate64(fd, mode, off, len);
}

int ftruncate(int fd, off_t len)
{
	REAL(ftruncate);
	REFUSE_FD(fd);
	return real_ftruncate(fd, len);
}

int rename(const char *from, const char *to)
{
	REAL(rename);
	REFUSE_PATH(from);
	REFUSE_PATH(to);
	return real_rename(from, to);
}

int unlink(const char *path)
{
	REAL(unlink);
	REFUSE_PATH(path);
	return real_unlink(path);
}

int mkdir(const char *path, mode_t mode)
{
	REAL(mkdir);
	REFUSE_PATH(path);
	return real_mkdir(path, mode);
}
