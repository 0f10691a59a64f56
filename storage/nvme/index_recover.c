/*
 * index_recover.c - what the tier does around opening its RocksDB index
 * when the index may be damaged (storage/nvme/NVME.md, "Index damage"):
 * survey the write-ahead log files before RocksDB replays them (the
 * highest sequence number written), keep hard links to them as evidence
 * while it does, and rename a damaged index aside.
 *
 * The survey reads the log files' framing only: 32 KiB blocks of physical
 * records, each a 7-byte header (checksum 4, length 2 little-endian, type
 * 1; 11 bytes for the recyclable types 5..8) then its payload; a logical
 * record that starts in a record of type FULL or FIRST begins with a
 * write batch header (sequence number le64, operation count le32). No
 * checksum is verified: the survey asks how far the log was written, and
 * RocksDB's own replay says how far it could be read. A value that does
 * not fit the sequence seen so far (a damaged length skews the framing)
 * is ignored. No RocksDB type is used here.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "index_recover.h"

#define WAL_BLOCK 32768u
#define HDR 7u
#define HDR_RECYCLABLE 11u
#define MAX_PLAUSIBLE_GAP (1ull << 24)

static int has_suffix(const char *name, const char *suffix)
{
	size_t n = strlen(name), k = strlen(suffix);

	return n > k && strcmp(name + n - k, suffix) == 0;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One batch header seen: fold its last sequence number into *max. */
static void batch_seen(const uint8_t *p, uint64_t *prev, uint64_t *max)
{
	uint64_t seq = le64(p);
	uint32_t count = le32(p + 8);

	if (count == 0 || count > MAX_PLAUSIBLE_GAP || seq == 0 || seq > UINT64_MAX / 2)
		return;
	if (*prev && (seq < *prev || seq - *prev > MAX_PLAUSIBLE_GAP))
		return;
	*prev = seq;
	if (seq + count - 1 > *max)
		*max = seq + count - 1;
}

/* The highest sequence number in one log file (0 if none). */
static uint64_t survey_file(int fd)
{
	uint8_t *blk = malloc(WAL_BLOCK);
	uint64_t prev = 0, max = 0;
	ssize_t got;

	if (!blk)
		return 0;
	for (off_t at = 0;; at += WAL_BLOCK) {
		size_t off = 0;

		got = pread(fd, blk, WAL_BLOCK, at);
		if (got <= 0)
			break;
		while (off + HDR <= (size_t)got) {
			uint32_t len = (uint32_t)blk[off + 4] | (uint32_t)blk[off + 5] << 8;
			uint8_t type = blk[off + 6];
			size_t hs = type >= 5 && type <= 8 ? HDR_RECYCLABLE : HDR;

			if (type == 0 && len == 0)
				break; /* block trailer or preallocated space */
			if (off + hs + len > (size_t)got)
				break;
			if ((type == 1 || type == 2 || type == 5 || type == 6) && len >= 12)
				batch_seen(blk + off + hs, &prev, &max);
			off += hs + len;
		}
		if (got < (ssize_t)WAL_BLOCK)
			break;
	}
	free(blk);
	return max;
}

int store_index_wal_survey(const char *dir, uint64_t *max_seq, uint32_t *files)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	*max_seq = 0;
	*files = 0;
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while ((e = readdir(d))) {
		char path[4096];
		uint64_t m;
		int fd;

		if (!has_suffix(e->d_name, ".log"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		m = survey_file(fd);
		close(fd);
		(*files)++;
		if (m > *max_seq)
			*max_seq = m;
	}
	closedir(d);
	return 0;
}

int store_index_wal_keep(const char *dir, const char *keep)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int linked = 0;

	if (!d)
		return errno == ENOENT ? 0 : -errno;
	if (mkdir(keep, 0700) && errno != EEXIST) {
		int rc = -errno;

		closedir(d);
		return rc;
	}
	while ((e = readdir(d))) {
		char from[4096], to[4096];

		if (!has_suffix(e->d_name, ".log"))
			continue;
		snprintf(from, sizeof(from), "%s/%s", dir, e->d_name);
		snprintf(to, sizeof(to), "%s/%s", keep, e->d_name);
		if (link(from, to) == 0)
			linked++;
	}
	closedir(d);
	return linked;
}

void store_index_wal_forget(const char *keep)
{
	DIR *d = opendir(keep);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char path[4096];

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", keep, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(keep);
}

int store_index_quarantine(const char *dir, char *aside, size_t aside_len)
{
	time_t now = time(NULL);
	struct tm tm;
	char stamp[32];

	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
	for (int i = 0; i < 100; i++) {
		if (i)
			snprintf(aside, aside_len, "%s.damaged-%s-%d", dir, stamp, i);
		else
			snprintf(aside, aside_len, "%s.damaged-%s", dir, stamp);
		if (access(aside, F_OK) == 0)
			continue;
		if (rename(dir, aside) == 0)
			return 0;
		return -errno;
	}
	return -EEXIST;
}
