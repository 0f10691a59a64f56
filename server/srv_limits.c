/*
 * srv_limits.c - the host's limits on kvpoold: memory (physical, cgroup
 * v2 memory.max) against dram_capacity, RLIMIT_NOFILE against
 * max_connections. See srv_limits.h.
 */
#include "srv_limits.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "srv_log.h"
#include "srv_server.h"

int srv_check_dram(uint64_t dram_capacity_bytes, uint64_t phys_bytes, uint64_t cgroup_bytes,
		   char *err, size_t err_len)
{
	bool by_cgroup = cgroup_bytes && (!phys_bytes || cgroup_bytes < phys_bytes);

	if (by_cgroup && dram_capacity_bytes > cgroup_bytes) {
		snprintf(err, err_len,
			 "dram_capacity (%" PRIu64 " bytes) exceeds the memory limit of %" PRIu64
			 " bytes (cgroup memory.max %" PRIu64 ")", dram_capacity_bytes,
			 cgroup_bytes, cgroup_bytes);
		return -ENOMEM;
	}
	if (!phys_bytes || dram_capacity_bytes <= phys_bytes)
		return 0;
	snprintf(err, err_len,
		 "dram_capacity (%" PRIu64 " bytes) exceeds this host's physical memory (%" PRIu64
		 " bytes)", dram_capacity_bytes, phys_bytes);
	return -ENOMEM;
}

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

uint64_t srv_cgroup_memory_max(void)
{
	char text[64];
	uint64_t bytes;
	size_t n;
	FILE *fp = fopen(SRV_CGROUP_MEMORY_MAX, "r");

	if (!fp)
		return 0;
	n = fread(text, 1, sizeof(text) - 1, fp);
	fclose(fp);
	text[n] = '\0';
	return srv_parse_memory_max(text, &bytes) ? 0 : bytes;
}

uint32_t srv_conn_limit(uint32_t max_connections, uint64_t nofile)
{
	if (nofile >= (uint64_t)max_connections + SRV_RESERVED_FDS)
		return max_connections;
	return nofile > SRV_RESERVED_FDS ? (uint32_t)(nofile - SRV_RESERVED_FDS) : 1;
}

/* Make room for max_connections descriptors: raise the soft RLIMIT_NOFILE
 * as far as needed (up to the hard limit); if that is still short, warn
 * once and serve fewer connections (s->conn_limit). */
static void nofile_fit(struct srv *s)
{
	uint64_t need = (uint64_t)s->conf.max_connections + SRV_RESERVED_FDS;
	struct rlimit rl;

	s->conn_limit = s->conf.max_connections;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= need)
		return;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need)
		rl.rlim_cur = need;
	else
		rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0 && getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	s->conn_limit = srv_conn_limit(s->conf.max_connections, rl.rlim_cur);
	if (s->conn_limit < s->conf.max_connections)
		srv_warn("max_connections %u needs %" PRIu64 " file descriptors but RLIMIT_NOFILE is %"
			 PRIu64 "; serving at most %u connections", s->conf.max_connections, need,
			 (uint64_t)rl.rlim_cur, s->conn_limit);
}

void srv_conn_limit_update(struct srv *s)
{
	nofile_fit(s);
}
