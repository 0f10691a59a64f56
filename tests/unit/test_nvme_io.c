/*
 * test_nvme_io.c - the NVMe tier's directory and segment files: lock,
 * format version, unusable directories, argument checks, aligned write /
 * read round trips, persistence across reopen, capacity changes, discard,
 * and the retry paths (EINTR, short transfers) and error mapping
 * (ENOSPC, EIO) forced through -Wl,--wrap of openat, pwritev and pread.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "nvme/nvme_io.h"

#define PAGE 4096u
#define SEG_BYTES (1u << 20)
#define SEG_COUNT 4u

/* ---- fault injection through --wrap ------------------------------------ */

int __real_openat(int dirfd, const char *path, int flags, ...);
ssize_t __real_pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset);
ssize_t __real_pread(int fd, void *buf, size_t count, off_t offset);

static struct {
	int refuse_direct;      /* openat with O_DIRECT fails with EINVAL */
	int write_eintr;        /* next pwritev calls fail with EINTR */
	int write_errno;        /* next pwritev fails with this errno (once) */
	size_t write_short;     /* next pwritev writes at most this many bytes (once) */
	size_t write_extra;     /* ...and claims this many more (a partial page under O_DIRECT) */
	int read_eintr;
	int read_errno;
	size_t read_short;
	int write_calls, read_calls;
} fault;

int __wrap_openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;

	if (flags & (O_CREAT | O_TMPFILE)) {
		va_list ap;

		va_start(ap, flags);
		mode = (mode_t)va_arg(ap, int);
		va_end(ap);
	}
	if (fault.refuse_direct && (flags & O_DIRECT)) {
		errno = EINVAL;
		return -1;
	}
	return __real_openat(dirfd, path, flags, mode);
}

ssize_t __wrap_pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
	struct iovec cut[64];
	size_t left;
	ssize_t w;
	int n;

	fault.write_calls++;
	if (fault.write_eintr) {
		fault.write_eintr--;
		errno = EINTR;
		return -1;
	}
	if (fault.write_errno) {
		errno = fault.write_errno;
		fault.write_errno = 0;
		return -1;
	}
	if (!fault.write_short)
		return __real_pwritev(fd, iov, iovcnt, offset);
	/* write only the first write_short bytes */
	left = fault.write_short;
	fault.write_short = 0;
	for (n = 0; n < iovcnt && n < 64 && left; n++) {
		cut[n] = iov[n];
		if (cut[n].iov_len > left)
			cut[n].iov_len = left;
		left -= cut[n].iov_len;
	}
	w = __real_pwritev(fd, cut, n, offset);
	if (w > 0) {
		w += (ssize_t)fault.write_extra;
		fault.write_extra = 0;
	}
	return w;
}

ssize_t __wrap_pread(int fd, void *buf, size_t count, off_t offset)
{
	fault.read_calls++;
	if (fault.read_eintr) {
		fault.read_eintr--;
		errno = EINTR;
		return -1;
	}
	if (fault.read_errno) {
		errno = fault.read_errno;
		fault.read_errno = 0;
		return -1;
	}
	if (fault.read_short && count > fault.read_short) {
		count = fault.read_short;
		fault.read_short = 0;
	}
	return __real_pread(fd, buf, count, offset);
}

/* ---- fixtures ------------------------------------------------------------ */

struct fixture {
	char root[64];   /* mkdtemp directory, removed at teardown */
	char dir[128];   /* root/nvme: the tier's directory */
	int warns;
	char last_log[512];
};

static void capture_log(void *arg, enum store_log_level level, const char *msg)
{
	struct fixture *f = arg;

	if (level == STORE_LOG_WARN)
		f->warns++;
	snprintf(f->last_log, sizeof(f->last_log), "%s", msg);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	memset(&fault, 0, sizeof(fault));
	snprintf(f->root, sizeof(f->root), "/tmp/kvpool-nvme-io-XXXXXX");
	if (!mkdtemp(f->root))
		return -1;
	snprintf(f->dir, sizeof(f->dir), "%s/nvme", f->root);
	if (mkdir(f->dir, 0755) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	chmod(f->root, 0700);
	chmod(f->dir, 0755);
	nftw(f->root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	memset(&fault, 0, sizeof(fault));
	return 0;
}

static struct store_nvme_io *open_ok(struct fixture *f, uint64_t seg_bytes, uint32_t count)
{
	struct store_nvme_io *io = NULL;
	char why[256] = "";
	int rc = store_nvme_io_open(f->dir, seg_bytes, count, capture_log, f, &io, why,
				    sizeof(why));

	if (rc)
		fail_msg("open %s: %d %s", f->dir, rc, why);
	return io;
}

static int open_rc(const char *dir, char *why, size_t why_len)
{
	struct store_nvme_io *io = (struct store_nvme_io *)0x1;
	int rc = store_nvme_io_open(dir, SEG_BYTES, SEG_COUNT, NULL, NULL, &io, why, why_len);

	if (rc == 0)
		store_nvme_io_close(io);
	else
		assert_ptr_equal(io, (struct store_nvme_io *)0x1); /* untouched on failure */
	return rc;
}

static void write_file(const char *path, const char *text)
{
	FILE *fp = fopen(path, "w");

	assert_non_null(fp);
	assert_int_equal(fputs(text, fp) >= 0, 1);
	assert_int_equal(fclose(fp), 0);
}

static void *aligned(size_t bytes)
{
	void *p = NULL;

	assert_int_equal(posix_memalign(&p, PAGE, bytes), 0);
	return p;
}

/* Deterministic bytes that differ by position, segment and offset. */
static void fill(uint8_t *p, size_t bytes, uint32_t seg, uint64_t off)
{
	size_t i;

	for (i = 0; i < bytes; i++)
		p[i] = (uint8_t)((off + i) * 131u + seg * 7u + ((off + i) >> 12));
}

static void assert_filled(const uint8_t *p, size_t bytes, uint32_t seg, uint64_t off)
{
	uint8_t *want = malloc(bytes);

	assert_non_null(want);
	fill(want, bytes, seg, off);
	assert_memory_equal(p, want, bytes);
	free(want);
}

/* Write `bytes` of pattern at (seg, off) as one iovec. */
static int write_pattern(struct store_nvme_io *io, uint32_t seg, uint64_t off, size_t bytes)
{
	uint8_t *buf = aligned(bytes);
	struct iovec iov = { buf, bytes };
	int rc;

	fill(buf, bytes, seg, off);
	rc = store_nvme_io_writev(io, seg, off, &iov, 1);
	free(buf);
	return rc;
}

/* Read `bytes` at (seg, off) and check the pattern. */
static void check_pattern(struct store_nvme_io *io, uint32_t seg, uint64_t off, size_t bytes)
{
	uint8_t *buf = aligned(bytes);

	assert_int_equal(store_nvme_io_read(io, seg, off, buf, bytes), 0);
	assert_filled(buf, bytes, seg, off);
	free(buf);
}

static char *path_in(const struct fixture *f, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", f->dir, name);
	return buf;
}

/* Does the test directory's filesystem accept O_DIRECT (ext4: yes; tmpfs
 * since Linux 6.6)? */
static bool fs_takes_direct(const struct fixture *f)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/direct-check", f->root);
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
	if (fd < 0)
		return false;
	close(fd);
	unlink(path);
	return true;
}

/* ---- opening ------------------------------------------------------------- */

static void test_open_invalid_args(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = (struct store_nvme_io *)0x1;

	assert_int_equal(store_nvme_io_open(f->dir, 0, 4, NULL, NULL, &io, NULL, 0), -EINVAL);
	assert_int_equal(store_nvme_io_open(f->dir, PAGE + 512, 4, NULL, NULL, &io, NULL, 0),
			 -EINVAL);
	assert_int_equal(store_nvme_io_open(f->dir, SEG_BYTES, 1, NULL, NULL, &io, NULL, 0),
			 -EINVAL);
	assert_int_equal(store_nvme_io_open("", SEG_BYTES, 4, NULL, NULL, &io, NULL, 0), -EINVAL);
	assert_ptr_equal(io, (struct store_nvme_io *)0x1);
	store_nvme_io_close(NULL);
}

static void test_fresh_dir_layout(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	char path[256], text[64] = "";
	struct stat st;
	FILE *fp;
	uint32_t n;

	fp = fopen(path_in(f, "FORMAT", path, sizeof(path)), "r");
	assert_non_null(fp);
	assert_non_null(fgets(text, sizeof(text), fp));
	fclose(fp);
	assert_string_equal(text, "kvpool-nvme 1\n");
	for (n = 0; n < SEG_COUNT; n++) {
		char name[64];

		snprintf(name, sizeof(name), "segments/%08u", n);
		assert_int_equal(stat(path_in(f, name, path, sizeof(path)), &st), 0);
		assert_int_equal(st.st_size, SEG_BYTES);
		/* sparse: ftruncate, not fallocate */
		assert_true((uint64_t)st.st_blocks * 512 < SEG_BYTES);
	}
	path_in(f, "segments/00000004", path, sizeof(path));
	assert_int_equal(stat(path, &st), -1);
	/* the probe file is gone */
	assert_int_equal(stat(path_in(f, ".probe", path, sizeof(path)), &st), -1);
	/* O_DIRECT is used exactly where the filesystem takes it, and only
	 * the fallback is logged */
	assert_int_equal(store_nvme_io_direct(io), fs_takes_direct(f));
	assert_int_equal(f->warns, store_nvme_io_direct(io) ? 0 : 1);
	store_nvme_io_close(io);
}

static void test_missing_and_not_dir(void **state)
{
	struct fixture *f = *state;
	char path[256], why[256] = "";

	snprintf(path, sizeof(path), "%s/absent", f->root);
	assert_int_equal(open_rc(path, why, sizeof(why)), -ENOENT);
	assert_non_null(strstr(why, path));

	/* a regular file, and a path through a regular file */
	snprintf(path, sizeof(path), "%s/file", f->root);
	write_file(path, "x");
	why[0] = 0;
	assert_int_equal(open_rc(path, why, sizeof(why)), -ENOTDIR);
	assert_non_null(strstr(why, path));
	snprintf(path, sizeof(path), "%s/file/sub", f->root);
	assert_int_equal(open_rc(path, why, sizeof(why)), -ENOTDIR);
	assert_non_null(strstr(why, path));
}

/* Run open in a child process that gave up root for `nobody`: root
 * bypasses permission bits, so this is how a root test run sees them.
 * Returns the child's open() result, or 1 when privileges could not be
 * dropped. */
static int open_as_nobody(const char *dir)
{
	int status;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		struct store_nvme_io *io;
		int rc;

		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(1);
		rc = store_nvme_io_open(dir, SEG_BYTES, SEG_COUNT, NULL, NULL, &io, NULL, 0);
		_exit(rc == -EACCES ? 0 : rc == 0 ? 2 : 3);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	switch (WEXITSTATUS(status)) {
	case 0:
		return -EACCES;
	case 1:
		return 1;
	case 2:
		return 0;
	default:
		return -EIO;
	}
}

static void test_unwritable_dir(void **state)
{
	struct fixture *f = *state;
	char why[256] = "";
	int rc;

	if (geteuid() != 0) {
		assert_int_equal(chmod(f->dir, 0555), 0);
		assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EACCES);
		assert_non_null(strstr(why, f->dir));
		assert_non_null(strstr(why, "not writable"));
		return;
	}
	/* root: a root-owned 0755 directory as seen by nobody */
	assert_int_equal(chmod(f->root, 0755), 0);
	rc = open_as_nobody(f->dir);
	if (rc == 1)
		skip();
	assert_int_equal(rc, -EACCES);
	/* and root itself can use it */
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), 0);
}

static void test_lock_busy(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	char why[256] = "";
	int status;
	pid_t pid;

	/* a second open in this process: flock conflicts across open files */
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EBUSY);
	assert_non_null(strstr(why, f->dir));
	assert_non_null(strstr(why, "LOCK"));

	/* another process */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(open_rc(f->dir, NULL, 0) == -EBUSY ? 0 : 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);

	/* closing releases it */
	store_nvme_io_close(io);
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), 0);
}

static void test_wrong_format(void **state)
{
	struct fixture *f = *state;
	char path[256], why[256] = "";

	store_nvme_io_close(open_ok(f, SEG_BYTES, SEG_COUNT));
	path_in(f, "FORMAT", path, sizeof(path));

	write_file(path, "kvpool-nvme 2\n");
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EPROTONOSUPPORT);
	assert_non_null(strstr(why, "version 2"));
	assert_non_null(strstr(why, "version 1"));
	assert_non_null(strstr(why, f->dir));

	write_file(path, "kvpool-nvme 1"); /* no newline: not exactly ours */
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EPROTONOSUPPORT);
	write_file(path, "something else\n");
	why[0] = 0;
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EPROTONOSUPPORT);
	assert_non_null(strstr(why, "FORMAT"));
	write_file(path, "");
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EPROTONOSUPPORT);

	/* segments but no FORMAT: refuse to guess */
	assert_int_equal(unlink(path), 0);
	why[0] = 0;
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), -EPROTONOSUPPORT);
	assert_non_null(strstr(why, "no FORMAT"));

	/* the right text again opens */
	write_file(path, "kvpool-nvme 1\n");
	assert_int_equal(open_rc(f->dir, why, sizeof(why)), 0);
}

static void test_fresh_dir_with_other_files(void **state)
{
	struct fixture *f = *state;
	char path[256];

	/* a mount point's lost+found is not a reason to refuse */
	assert_int_equal(mkdir(path_in(f, "lost+found", path, sizeof(path)), 0700), 0);
	store_nvme_io_close(open_ok(f, SEG_BYTES, SEG_COUNT));
}

static void test_buffered_fallback(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io;

	fault.refuse_direct = 1;
	io = open_ok(f, SEG_BYTES, SEG_COUNT);
	assert_false(store_nvme_io_direct(io));
	assert_int_equal(f->warns, 1);
	assert_non_null(strstr(f->last_log, "o_direct"));
	assert_non_null(strstr(f->last_log, f->dir));
	/* buffered I/O still round-trips */
	assert_int_equal(write_pattern(io, 1, 8 * PAGE, 3 * PAGE), 0);
	check_pattern(io, 1, 8 * PAGE, 3 * PAGE);
	store_nvme_io_close(io);
}

/* ---- I/O ----------------------------------------------------------------- */

static void test_misaligned_args(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	uint8_t *buf = aligned(4 * PAGE);
	struct iovec iov = { buf, PAGE };
	struct iovec odd_base = { buf + 512, PAGE };
	struct iovec odd_len = { buf, PAGE + 1 };
	struct iovec two[2] = { { buf, PAGE }, { buf + PAGE + 8, PAGE } };
	struct iovec empty = { buf, 0 };

	fault.write_calls = 0;
	fault.read_calls = 0; /* the open's probe read */
	assert_int_equal(store_nvme_io_writev(io, 0, 100, &iov, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, 0, &odd_base, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, 0, &odd_len, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, 0, two, 2), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, 0, &empty, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, 0, &iov, 0), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, SEG_COUNT, 0, &iov, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, SEG_BYTES, &iov, 1), -EINVAL);
	iov.iov_len = 2 * PAGE; /* crosses the segment's end */
	assert_int_equal(store_nvme_io_writev(io, 0, SEG_BYTES - PAGE, &iov, 1), -EINVAL);
	assert_int_equal(store_nvme_io_writev(io, 0, UINT64_MAX - PAGE + 1, &iov, 1), -EINVAL);

	assert_int_equal(store_nvme_io_read(io, 0, 100, buf, PAGE), -EINVAL);
	assert_int_equal(store_nvme_io_read(io, 0, 0, buf + 8, PAGE), -EINVAL);
	assert_int_equal(store_nvme_io_read(io, 0, 0, buf, PAGE - 1), -EINVAL);
	assert_int_equal(store_nvme_io_read(io, 0, 0, buf, 0), -EINVAL);
	assert_int_equal(store_nvme_io_read(io, SEG_COUNT, 0, buf, PAGE), -EINVAL);
	assert_int_equal(store_nvme_io_read(io, 1, SEG_BYTES - PAGE, buf, 2 * PAGE), -EINVAL);
	assert_int_equal(store_nvme_io_discard(io, SEG_COUNT), -EINVAL);
	/* nothing was written by any of them */
	assert_int_equal(fault.write_calls, 0);
	assert_int_equal(fault.read_calls, 0);
	free(buf);
	store_nvme_io_close(io);
}

/* Write at several segments and offsets (one iovec, several, more than
 * one pwritev call can take), read back, and check that untouched bytes
 * stayed zero. */
static void test_round_trip(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	uint8_t *seg = aligned(SEG_BYTES), *zero = calloc(1, SEG_BYTES);
	uint8_t *many = aligned(100 * PAGE), *parts = aligned(6 * PAGE);
	struct iovec iov[100];
	int i;

	assert_non_null(zero);
	assert_int_equal(write_pattern(io, 0, 0, 16 * PAGE), 0);
	assert_int_equal(write_pattern(io, 3, SEG_BYTES - 2 * PAGE, 2 * PAGE), 0);
	/* three iovecs of 1, 2 and 3 pages, not adjacent in memory order */
	fill(parts, 6 * PAGE, 1, PAGE);
	iov[0] = (struct iovec){ parts, PAGE };
	iov[1] = (struct iovec){ parts + PAGE, 2 * PAGE };
	iov[2] = (struct iovec){ parts + 3 * PAGE, 3 * PAGE };
	assert_int_equal(store_nvme_io_writev(io, 1, PAGE, iov, 3), 0);
	/* 100 one-page iovecs: more than one pwritev call */
	fill(many, 100 * PAGE, 2, 64 * PAGE);
	for (i = 0; i < 100; i++)
		iov[i] = (struct iovec){ many + (size_t)i * PAGE, PAGE };
	fault.write_calls = 0;
	assert_int_equal(store_nvme_io_writev(io, 2, 64 * PAGE, iov, 100), 0);
	assert_true(fault.write_calls >= 2);

	check_pattern(io, 0, 0, 16 * PAGE);
	check_pattern(io, 0, 4 * PAGE, PAGE); /* a slice of a write */
	check_pattern(io, 1, PAGE, 6 * PAGE);
	check_pattern(io, 2, 64 * PAGE, 100 * PAGE);
	check_pattern(io, 3, SEG_BYTES - 2 * PAGE, 2 * PAGE);

	/* everything else is still zero */
	assert_int_equal(store_nvme_io_read(io, 1, 0, seg, SEG_BYTES), 0);
	assert_memory_equal(seg, zero, PAGE);
	assert_memory_equal(seg + 7 * PAGE, zero, SEG_BYTES - 7 * PAGE);
	assert_int_equal(store_nvme_io_read(io, 3, 0, seg, SEG_BYTES), 0);
	assert_memory_equal(seg, zero, SEG_BYTES - 2 * PAGE);
	free(seg);
	free(zero);
	free(many);
	free(parts);
	store_nvme_io_close(io);
}

static void test_reopen_keeps_data(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);

	assert_int_equal(write_pattern(io, 0, 12 * PAGE, 5 * PAGE), 0);
	assert_int_equal(write_pattern(io, 3, 0, 32 * PAGE), 0);
	store_nvme_io_close(io);
	io = open_ok(f, SEG_BYTES, SEG_COUNT);
	check_pattern(io, 0, 12 * PAGE, 5 * PAGE);
	check_pattern(io, 3, 0, 32 * PAGE);
	store_nvme_io_close(io);
}

/* What each segment file held at open: everything in a fresh directory;
 * later, 0 for a deleted file and its length for a truncated one. */
static void test_segment_had(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	char path[256];

	assert_int_equal(store_nvme_io_segment_had(io, 1), SEG_BYTES);
	assert_int_equal(write_pattern(io, 0, 0, 4 * PAGE), 0);
	store_nvme_io_close(io);
	assert_int_equal(unlink(path_in(f, "segments/00000001", path, sizeof(path))), 0);
	assert_int_equal(truncate(path_in(f, "segments/00000002", path, sizeof(path)), 8 * PAGE), 0);
	io = open_ok(f, SEG_BYTES, SEG_COUNT);
	assert_int_equal(store_nvme_io_segment_had(io, 0), SEG_BYTES);
	assert_int_equal(store_nvme_io_segment_had(io, 1), 0);
	assert_int_equal(store_nvme_io_segment_had(io, 2), 8 * PAGE);
	assert_int_equal(store_nvme_io_segment_had(io, 3), SEG_BYTES);
	assert_int_equal(store_nvme_io_segment_had(io, SEG_COUNT), 0);
	check_pattern(io, 0, 0, 4 * PAGE);
	store_nvme_io_close(io);
	/* and the recreated files are full-size again */
	io = open_ok(f, SEG_BYTES, SEG_COUNT);
	assert_int_equal(store_nvme_io_segment_had(io, 1), SEG_BYTES);
	store_nvme_io_close(io);
}

static void test_capacity_change(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	char path[256];
	struct stat st;

	assert_int_equal(write_pattern(io, 1, 0, 4 * PAGE), 0);
	store_nvme_io_close(io);

	/* fewer segments: the extra files go, the kept ones keep their bytes */
	io = open_ok(f, SEG_BYTES, 2);
	assert_int_equal(stat(path_in(f, "segments/00000002", path, sizeof(path)), &st), -1);
	assert_int_equal(stat(path_in(f, "segments/00000003", path, sizeof(path)), &st), -1);
	check_pattern(io, 1, 0, 4 * PAGE);
	store_nvme_io_close(io);

	/* larger segments: files grow, bytes stay */
	io = open_ok(f, 2 * SEG_BYTES, 3);
	assert_int_equal(stat(path_in(f, "segments/00000001", path, sizeof(path)), &st), 0);
	assert_int_equal(st.st_size, 2 * SEG_BYTES);
	check_pattern(io, 1, 0, 4 * PAGE);
	assert_int_equal(write_pattern(io, 2, SEG_BYTES + PAGE, PAGE), 0);
	check_pattern(io, 2, SEG_BYTES + PAGE, PAGE);
	store_nvme_io_close(io);
}

static void test_discard(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	uint8_t *buf = aligned(8 * PAGE), *zero = calloc(1, 8 * PAGE);
	char path[256];
	struct stat st;
	int rc;

	assert_non_null(zero);
	assert_int_equal(write_pattern(io, 2, 0, 8 * PAGE), 0);
	assert_int_equal(write_pattern(io, 1, 0, 8 * PAGE), 0);
	rc = store_nvme_io_discard(io, 2);
	if (rc == -EOPNOTSUPP)
		skip();
	assert_int_equal(rc, 0);
	/* the segment reads as zeros, keeps its size, and is usable again */
	assert_int_equal(store_nvme_io_read(io, 2, 0, buf, 8 * PAGE), 0);
	assert_memory_equal(buf, zero, 8 * PAGE);
	assert_int_equal(stat(path_in(f, "segments/00000002", path, sizeof(path)), &st), 0);
	assert_int_equal(st.st_size, SEG_BYTES);
	check_pattern(io, 1, 0, 8 * PAGE); /* the neighbour is untouched */
	assert_int_equal(write_pattern(io, 2, PAGE, PAGE), 0);
	check_pattern(io, 2, PAGE, PAGE);
	free(buf);
	free(zero);
	store_nvme_io_close(io);
}

static void test_retry_eintr_and_short(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);

	fault.write_eintr = 3;
	assert_int_equal(write_pattern(io, 0, 0, 8 * PAGE), 0);
	check_pattern(io, 0, 0, 8 * PAGE);

	/* the kernel wrote 3 pages and part of a 4th: the rest is rewritten
	 * from the last page boundary */
	fault.write_calls = 0;
	fault.write_short = 3 * PAGE;
	fault.write_extra = 100;
	assert_int_equal(write_pattern(io, 1, 4 * PAGE, 8 * PAGE), 0);
	assert_int_equal(fault.write_calls, 2);
	check_pattern(io, 1, 4 * PAGE, 8 * PAGE);

	fault.read_eintr = 2;
	fault.read_short = 2 * PAGE;
	fault.read_calls = 0;
	check_pattern(io, 1, 4 * PAGE, 8 * PAGE);
	assert_int_equal(fault.read_calls, 4);
	store_nvme_io_close(io);
}

static void test_buffered_short_unaligned(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io;

	fault.refuse_direct = 1;
	io = open_ok(f, SEG_BYTES, SEG_COUNT);
	/* buffered: an odd-sized partial write continues where it stopped */
	fault.write_short = PAGE + 777;
	fault.write_calls = 0;
	assert_int_equal(write_pattern(io, 3, 0, 4 * PAGE), 0);
	assert_int_equal(fault.write_calls, 2);
	fault.read_short = 1234;
	check_pattern(io, 3, 0, 4 * PAGE);
	store_nvme_io_close(io);
}

static void test_errors_passed_through(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_io *io = open_ok(f, SEG_BYTES, SEG_COUNT);
	uint8_t *buf = aligned(PAGE);
	char path[256];

	fault.write_errno = ENOSPC;
	assert_int_equal(write_pattern(io, 0, 0, PAGE), -ENOSPC);
	fault.write_errno = EDQUOT;
	assert_int_equal(write_pattern(io, 0, 0, PAGE), -ENOSPC);
	fault.write_errno = EIO;
	assert_int_equal(write_pattern(io, 0, 0, PAGE), -EIO);
	fault.read_errno = EIO;
	assert_int_equal(store_nvme_io_read(io, 0, 0, buf, PAGE), -EIO);
	/* the tier works again once the fault is gone */
	assert_int_equal(write_pattern(io, 0, 0, PAGE), 0);
	check_pattern(io, 0, 0, PAGE);

	/* a segment file cut short under us: reading past its end is -EIO */
	assert_int_equal(truncate(path_in(f, "segments/00000001", path, sizeof(path)), PAGE), 0);
	assert_int_equal(store_nvme_io_read(io, 1, 4 * PAGE, buf, PAGE), -EIO);
	free(buf);
	store_nvme_io_close(io);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_open_invalid_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fresh_dir_layout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_and_not_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unwritable_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lock_busy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_format, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fresh_dir_with_other_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_buffered_fallback, setup, teardown),
		cmocka_unit_test_setup_teardown(test_misaligned_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen_keeps_data, setup, teardown),
		cmocka_unit_test_setup_teardown(test_segment_had, setup, teardown),
		cmocka_unit_test_setup_teardown(test_capacity_change, setup, teardown),
		cmocka_unit_test_setup_teardown(test_discard, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retry_eintr_and_short, setup, teardown),
		cmocka_unit_test_setup_teardown(test_buffered_short_unaligned, setup, teardown),
		cmocka_unit_test_setup_teardown(test_errors_passed_through, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
