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

/* Memory the index keeps for each block with a copy on the NVMe tier: its
 * block header (116 bytes), hash bucket and heap slots in the store's
 * tables. Measured: STATS index_bytes grows by 141 bytes per block and
 * resident memory by 153 at 700,000 NVMe blocks; rounded up for the
 * tables' doubling and allocator rounding. tests/python/test_nvme_index.py
 * fails when a block costs more. */
#define SRV_NVME_INDEX_BYTES_PER_BLOCK 160u

/* The smallest extent a block takes on the NVMe tier (its payload rounded
 * up to 4 KiB): a full tier of nvme_capacity holds at most
 * nvme_capacity / SRV_NVME_MIN_EXTENT blocks. */
#define SRV_NVME_MIN_EXTENT 4096u

/* Index memory of a full NVMe tier of nvme_capacity_bytes at its smallest
 * blocks: nvme_capacity / SRV_NVME_MIN_EXTENT * SRV_NVME_INDEX_BYTES_PER_BLOCK
 * bytes (e.g. 4000 MiB for 100 GiB). Pure. */
uint64_t srv_nvme_index_bytes(uint64_t nvme_capacity_bytes);

/* Whether the memory limit (as for srv_check_dram_room: the smaller known
 * of phys_bytes and cgroup_bytes) also holds the NVMe tier's index at
 * nvme_capacity_bytes (0: no tier) beside dram_capacity_bytes and
 * srv_dram_headroom: limit - dram_capacity - headroom >=
 * srv_nvme_index_bytes(nvme_capacity). Returns 0 when it does, when there
 * is no tier or no known limit; 1 when it does not, with a warning in
 * msg[0..msg_len) that names the index at the smallest blocks, the room
 * left, the smallest average block size whose full tier fits, and the
 * limit, dram_capacity or nvme_capacity that would hold any block size.
 * kvpoold warns and starts (blocks are usually far larger than 4 KiB; it
 * cannot know their size). Pure. */
int srv_check_nvme_index_room(uint64_t dram_capacity_bytes, uint64_t nvme_capacity_bytes,
			      uint64_t phys_bytes, uint64_t cgroup_bytes,
			      const char *cgroup_source, char *msg, size_t msg_len);

#endif /* KVPOOL_SRV_MEMLIMIT_H */
