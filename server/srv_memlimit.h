/*
 * srv_memlimit.h - the memory this process may use, as start-up checks
 * see it: the host's physical memory, the cgroup limits that
 * /proc/self/cgroup leads to (cgroup v2 memory.max and v1
 * memory.limit_in_bytes, of the process's cgroup and every ancestor), and
 * the room dram_capacity must leave below the smaller of the two for the
 * index and the process. One check: a dram_capacity that passes it fits
 * in memory with room to spare.
 *
 * Threads: any; these read files and keep no state.
 */
#ifndef KVPOOL_SRV_MEMLIMIT_H
#define KVPOOL_SRV_MEMLIMIT_H

#include <stddef.h>
#include <stdint.h>

/* The host's physical memory in bytes (sysconf _SC_PHYS_PAGES times the
 * page size), 0 when unknown. */
uint64_t srv_phys_bytes(void);

/* Parse the text of a cgroup limit file: a decimal byte count or "max"
 * (no limit: *bytes = 0), optionally followed by one newline.
 * Returns 0, or -EINVAL for anything else (*bytes untouched). Pure. */
int srv_parse_memory_max(const char *text, uint64_t *bytes);

/* The smallest memory limit of this process's cgroups: for each line of
 * proc_cgroup ("/proc/self/cgroup"), a v2 line "0::PATH" is looked up
 * under root ("/sys/fs/cgroup"; "root/unified" too, for hybrid hosts) as
 * PATH/memory.max, and a v1 line naming the memory controller under
 * root/memory as PATH/memory.limit_in_bytes, each for PATH and every
 * ancestor up to the root (a nested cgroup, such as a systemd service
 * with MemoryMax=, is bounded by its parents too). "max" and v1's
 * "unlimited" (values >= 2^62) are no limit. source[0..source_len)
 * receives the file that set the limit ("" when none). Returns the limit
 * in bytes, 0 when there is none or nothing could be read. */
uint64_t srv_cgroup_memory_limit(const char *proc_cgroup, const char *root, char *source,
				 size_t source_len);

/* Bytes dram_capacity must leave free below a memory limit of limit_bytes
 * for the index, the connections' buffers and the process itself:
 * 64 MiB + limit / 32 (e.g. 576 MiB of 16 GiB). Pure. */
uint64_t srv_dram_headroom(uint64_t limit_bytes);

/* Refuse a dram_capacity that leaves less than srv_dram_headroom of the
 * memory limit: the smaller known of phys_bytes and cgroup_bytes (0 for
 * either: unknown or no limit; both 0 passes). cgroup_source names the
 * cgroup file for the message (may be NULL). Returns 0, or -ENOMEM with a
 * message in err[0..err_len) naming dram_capacity, the limit, where it
 * came from, the room left and the largest dram_capacity that fits.
 * Pure. */
int srv_check_dram_room(uint64_t dram_capacity_bytes, uint64_t phys_bytes,
			uint64_t cgroup_bytes, const char *cgroup_source, char *err,
			size_t err_len);

#endif /* KVPOOL_SRV_MEMLIMIT_H */
