/*
 * srv_memlimit.c - physical memory, cgroup memory limits and
 * dram_capacity's room (srv_memlimit.h).
 */
#include "srv_memlimit.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Is a cgroup v1 limit a real one? v1 says "no limit" with a huge number
 * (PAGE_COUNTER_MAX pages: 9223372036854771712 on x86-64). */
#define SRV_CGROUP_V1_UNLIMITED (1ull << 62)

uint64_t srv_phys_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || page_bytes <= 0)
		return 0;
	return (uint64_t)pages * (uint64_t)page_bytes;
}

int srv_parse_memory_max(const char *text, uint64_t *bytes)
{
	unsigned long long v;
	char *end;

	if (!strcmp(text, "max") || !strcmp(text, "max\n")) {
		*bytes = 0;
		return 0;
	}
	if (*text < '0' || *text > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, 10);
	if (errno || (*end && strcmp(end, "\n")))
		return -EINVAL;
	*bytes = v;
	return 0;
}

/* Read one limit file: a byte count (v1 or v2) or "max". Returns the
 * limit, 0 when none or unreadable. */
static uint64_t cgroup_read_limit(const char *path)
{
	char text[64];
	uint64_t bytes = 0;
	size_t n;
	FILE *fp = fopen(path, "r");

	if (!fp)
		return 0;
	n = fread(text, 1, sizeof(text) - 1, fp);
	fclose(fp);
	text[n] = '\0';
	if (srv_parse_memory_max(text, &bytes) < 0 || bytes >= SRV_CGROUP_V1_UNLIMITED)
		return 0;
	return bytes;
}

/* The smallest limit in file `name` of the cgroup dir/path and each of its
 * ancestors up to dir itself (a nested cgroup - systemd's MemoryMax= on a
 * service - is bounded by its parents too). *best and source are updated
 * when a smaller one is found. */
static void cgroup_walk(const char *dir, const char *path, const char *name, uint64_t *best,
			char *source, size_t source_len)
{
	char p[PATH_MAX], file[PATH_MAX + 64];

	snprintf(p, sizeof(p), "%s", path);
	for (;;) {
		size_t len = strlen(p);
		uint64_t v;
		char *slash;

		while (len > 1 && p[len - 1] == '/')
			p[--len] = '\0';
		snprintf(file, sizeof(file), "%s%s/%s", dir, strcmp(p, "/") ? p : "", name);
		v = cgroup_read_limit(file);
		if (v && (!*best || v < *best)) {
			*best = v;
			if (source_len)
				snprintf(source, source_len, "%s", file);
		}
		if (!strcmp(p, "/") || !p[0])
			break;
		slash = strrchr(p, '/');
		if (!slash)
			break;
		if (slash == p)
			p[1] = '\0';
		else
			*slash = '\0';
	}
}

/* Does the v1 controller list (the second field) name "memory"? */
static bool v1_has_memory(const char *controllers, size_t len)
{
	const char *c = controllers, *end = controllers + len;

	while (c < end) {
		const char *comma = memchr(c, ',', (size_t)(end - c));
		size_t n = comma ? (size_t)(comma - c) : (size_t)(end - c);

		if (n == 6 && !memcmp(c, "memory", 6))
			return true;
		c += n + 1;
	}
	return false;
}

uint64_t srv_cgroup_memory_limit(const char *proc_cgroup, const char *root, char *source,
				 size_t source_len)
{
	char line[PATH_MAX + 128], dir[PATH_MAX];
	uint64_t best = 0;
	FILE *fp = fopen(proc_cgroup, "r");

	if (source_len)
		source[0] = '\0';
	if (!fp)
		return 0;
	while (fgets(line, sizeof(line), fp)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *path;

		if (!c2)
			continue;
		path = c2 + 1;
		path[strcspn(path, "\n")] = '\0';
		if (path[0] != '/')
			continue;
		if (c2 == c1 + 1 && !strncmp(line, "0:", 2)) {
			/* v2: the unified hierarchy, mounted at root (pure v2) or at
			 * root/unified (hybrid) */
			cgroup_walk(root, path, "memory.max", &best, source, source_len);
			snprintf(dir, sizeof(dir), "%s/unified", root);
			cgroup_walk(dir, path, "memory.max", &best, source, source_len);
		} else if (v1_has_memory(c1 + 1, (size_t)(c2 - c1 - 1))) {
			snprintf(dir, sizeof(dir), "%s/memory", root);
			cgroup_walk(dir, path, "memory.limit_in_bytes", &best, source, source_len);
		}
	}
	fclose(fp);
	return best;
}

/* "the cgroup memory limit in FILE" or "this host's physical memory". */
static void limit_name(bool by_cgroup, const char *cgroup_source, char *where, size_t len)
{
	if (by_cgroup)
		snprintf(where, len, "the cgroup memory limit%s%s", cgroup_source ? " in " : "",
			 cgroup_source ? cgroup_source : "");
	else
		snprintf(where, len, "this host's physical memory");
}

uint64_t srv_dram_headroom(uint64_t limit_bytes)
{
	return (64ull << 20) + limit_bytes / 32;
}

int srv_check_dram_room(uint64_t dram_capacity_bytes, uint64_t phys_bytes,
			uint64_t cgroup_bytes, const char *cgroup_source, char *err,
			size_t err_len)
{
	bool by_cgroup = cgroup_bytes && (!phys_bytes || cgroup_bytes < phys_bytes);
	uint64_t limit = by_cgroup ? cgroup_bytes : phys_bytes, room, most;
	char where[700];

	if (!limit)
		return 0;
	room = srv_dram_headroom(limit);
	if (dram_capacity_bytes <= limit && limit - dram_capacity_bytes >= room)
		return 0;
	most = limit > room ? limit - room : 0;
	limit_name(by_cgroup, cgroup_source, where, sizeof(where));
	snprintf(err, err_len,
		 "dram_capacity (%" PRIu64 " bytes) leaves less than %" PRIu64 " bytes of %s (%"
		 PRIu64 " bytes) for the index and the process: at most %" PRIu64 " bytes fit",
		 dram_capacity_bytes, room, where, limit, most);
	return -ENOMEM;
}

uint64_t srv_nvme_index_bytes(uint64_t nvme_capacity_bytes)
{
	return nvme_capacity_bytes / SRV_NVME_MIN_EXTENT * SRV_NVME_INDEX_BYTES_PER_BLOCK;
}

int srv_check_nvme_index_room(uint64_t dram_capacity_bytes, uint64_t nvme_capacity_bytes,
			      uint64_t phys_bytes, uint64_t cgroup_bytes,
			      const char *cgroup_source, char *msg, size_t msg_len)
{
	bool by_cgroup = cgroup_bytes && (!phys_bytes || cgroup_bytes < phys_bytes);
	uint64_t limit = by_cgroup ? cgroup_bytes : phys_bytes;
	uint64_t index = srv_nvme_index_bytes(nvme_capacity_bytes), head, room, fit, need;
	uint64_t min_block = 0, max_dram, max_nvme;
	char where[700], block[64], dram_alt[96] = "";

	if (!limit || !nvme_capacity_bytes)
		return 0;
	head = srv_dram_headroom(limit);
	room = limit > dram_capacity_bytes + head ? limit - dram_capacity_bytes - head : 0;
	if (room >= index)
		return 0;
	/* the blocks whose index fits, and the average size that many fill
	 * the tier with (extents are whole 4 KiB pages) */
	fit = room / SRV_NVME_INDEX_BYTES_PER_BLOCK;
	if (fit) {
		min_block = (nvme_capacity_bytes + fit - 1) / fit;
		min_block = (min_block + SRV_NVME_MIN_EXTENT - 1) / SRV_NVME_MIN_EXTENT *
			    SRV_NVME_MIN_EXTENT;
		snprintf(block, sizeof(block), "at least %" PRIu64 " bytes", min_block);
	} else {
		snprintf(block, sizeof(block), "more than nvme_capacity");
	}
	/* the smallest limit L with L - headroom(L) - dram_capacity >= index */
	need = (dram_capacity_bytes + index + (64ull << 20)) / 31 * 32;
	while (need - srv_dram_headroom(need) < dram_capacity_bytes + index)
		need += 4096;
	max_dram = limit > head + index ? limit - head - index : 0;
	max_nvme = fit * SRV_NVME_MIN_EXTENT;
	if (max_dram >= (1ull << 20)) /* dram_capacity's smallest value */
		snprintf(dram_alt, sizeof(dram_alt), " dram_capacity to %" PRIu64 " bytes or",
			 max_dram);
	limit_name(by_cgroup, cgroup_source, where, sizeof(where));
	snprintf(msg, msg_len,
		 "the NVMe tier's index may outgrow memory: nvme_capacity (%" PRIu64 " bytes) holds "
		 "up to %" PRIu64 " blocks of %u bytes, %u bytes of index each (%" PRIu64 " bytes), "
		 "but %s (%" PRIu64 " bytes) leaves %" PRIu64 " bytes beside dram_capacity (%" PRIu64
		 " bytes) and kvpoold's own %" PRIu64 " bytes: enough while the tier's blocks "
		 "average %s; to hold it at any block size, raise the limit to %" PRIu64 " bytes, "
		 "or lower%s nvme_capacity to %" PRIu64 " bytes",
		 nvme_capacity_bytes, nvme_capacity_bytes / SRV_NVME_MIN_EXTENT, SRV_NVME_MIN_EXTENT,
		 SRV_NVME_INDEX_BYTES_PER_BLOCK, index, where, limit, room, dram_capacity_bytes, head,
		 block, need, dram_alt, max_nvme);
	return 1;
}
