/*
 * srv_limits.h - what the host lets kvpoold use, checked at start-up and
 * on SIGHUP: physical memory and the cgroup v2 memory limit against
 * dram_capacity, and RLIMIT_NOFILE against max_connections.
 */
#ifndef KVPOOL_SRV_LIMITS_H
#define KVPOOL_SRV_LIMITS_H

#include <stddef.h>
#include <stdint.h>

struct srv;

/* Main thread: set s->conn_limit from conf.max_connections and the
 * RLIMIT_NOFILE limit, raising the soft limit as far as needed (up to the
 * hard limit); when that is still short, warn and serve fewer
 * connections. At start-up and after SIGHUP. Cannot fail. */
void srv_conn_limit_update(struct srv *s);

/* Refuse a dram_capacity larger than the memory this process may use: the
 * smaller of the host's physical memory (phys_bytes) and its cgroup v2
 * memory limit (cgroup_bytes); 0 for either means unknown or no limit,
 * which passes. Returns 0, or -ENOMEM with a message in err[0..err_len)
 * naming dram_capacity, the limit and where it came from ("physical
 * memory" or "cgroup memory.max N"). The arena is faulted in whole at
 * start-up, so a larger one would only end in the OOM killer. Pure. */
int srv_check_dram(uint64_t dram_capacity_bytes, uint64_t phys_bytes, uint64_t cgroup_bytes,
		   char *err, size_t err_len);

/* The host's physical memory in bytes (sysconf _SC_PHYS_PAGES times the
 * page size), 0 when unknown. */
uint64_t srv_phys_bytes(void);

/* Where the cgroup v2 memory limit is read from. */
#define SRV_CGROUP_MEMORY_MAX "/sys/fs/cgroup/memory.max"

/* Parse the text of a cgroup v2 memory.max file: a decimal byte count or
 * "max" (no limit: *bytes = 0), optionally followed by one newline.
 * Returns 0, or -EINVAL for anything else (*bytes untouched). Pure. */
int srv_parse_memory_max(const char *text, uint64_t *bytes);

/* The cgroup v2 memory limit in bytes from SRV_CGROUP_MEMORY_MAX; 0 when
 * there is none ("max"), no such file (cgroup v1, no cgroup filesystem) or
 * it cannot be read or parsed. */
uint64_t srv_cgroup_memory_max(void);

/* File descriptors kept aside from connections: the listener, eventfds,
 * the log, and slack. */
#define SRV_RESERVED_FDS 64

/* Connections that fit in nofile file descriptors (the RLIMIT_NOFILE soft
 * limit): max_connections when nofile >= max_connections +
 * SRV_RESERVED_FDS, otherwise nofile - SRV_RESERVED_FDS (at least 1). Pure. */
uint32_t srv_conn_limit(uint32_t max_connections, uint64_t nofile);

#endif /* KVPOOL_SRV_LIMITS_H */
