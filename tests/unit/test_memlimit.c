/*
 * test_memlimit.c - the memory limit kvpoold checks dram_capacity
 * against (server/srv_memlimit.c): cgroup v2 and v1 limits found from a
 * /proc/self/cgroup, nested ones included, on fake cgroup trees; the
 * room dram_capacity must leave for the index and the process, and which
 * of physical memory and the cgroup limit decides; the limit-file parser.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "srv_memlimit.h"

/* ---- memory limits from /proc/self/cgroup (issue 20 item 8) ---------------- */

/* Write text to dir/rel, making the directories on the way. */
static void tree_write(const char *dir, const char *rel, const char *text)
{
	char path[512], *slash;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	for (slash = strchr(path + strlen(dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		(void)mkdir(path, 0700);
		*slash = '/';
	}
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static uint64_t limit_of(const char *dir, char *source, size_t len)
{
	char proc[300], root[300];

	snprintf(proc, sizeof(proc), "%s/proc-cgroup", dir);
	snprintf(root, sizeof(root), "%s/sys", dir);
	return srv_cgroup_memory_limit(proc, root, source, len);
}

static void test_cgroup_limits(void **state)
{
	char dir[] = "/tmp/kvpool-cgroup-XXXXXX", src[600];

	(void)state;
	assert_non_null(mkdtemp(dir));
	/* v2 nested: systemd's MemoryMax= on the service, the root unlimited;
	 * the smallest of the service's cgroup and its ancestors counts */
	tree_write(dir, "proc-cgroup", "0::/system.slice/kvpoold.service\n");
	tree_write(dir, "sys/memory.max", "max\n");
	tree_write(dir, "sys/system.slice/memory.max", "8589934592\n");
	tree_write(dir, "sys/system.slice/kvpoold.service/memory.max", "1073741824\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 1073741824);
	assert_non_null(strstr(src, "sys/system.slice/kvpoold.service/memory.max"));
	/* a parent tighter than the child */
	tree_write(dir, "sys/system.slice/memory.max", "536870912\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 536870912);
	assert_non_null(strstr(src, "sys/system.slice/memory.max"));
	/* cgroup v1: memory.limit_in_bytes of the memory controller's path;
	 * its "unlimited" huge number is no limit */
	tree_write(dir, "proc-cgroup", "12:pids:/x\n4:memory:/docker/abc\n1:name=systemd:/y\n");
	tree_write(dir, "sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
	tree_write(dir, "sys/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 2147483648ull);
	assert_non_null(strstr(src, "sys/memory/docker/abc/memory.limit_in_bytes"));
	/* v1 with controllers joined: "cpu,memory" */
	tree_write(dir, "proc-cgroup", "3:cpu,memory:/docker/abc\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 2147483648ull);
	/* no limit anywhere; no such file */
	tree_write(dir, "proc-cgroup", "4:memory:/\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 0);
	assert_string_equal(src, "");
	tree_write(dir, "proc-cgroup", "0::/nowhere\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 0);
	/* hybrid: v2 under sys/unified */
	tree_write(dir, "proc-cgroup", "0::/svc\n");
	tree_write(dir, "sys/unified/svc/memory.max", "3221225472\n");
	assert_int_equal(limit_of(dir, src, sizeof(src)), 3221225472ull);
	{
		char proc[320];

		snprintf(proc, sizeof(proc), "%s/missing", dir);
		assert_int_equal(srv_cgroup_memory_limit(proc, dir, src, sizeof(src)), 0);
	}
	/* this process's own: whatever it is, it does not crash */
	(void)srv_cgroup_memory_limit("/proc/self/cgroup", "/sys/fs/cgroup", src, sizeof(src));
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		assert_int_equal(system(cmd), 0);
	}
}

/* dram_capacity at 100% of memory was accepted; now it must leave
 * srv_dram_headroom, and the message says how much fits. */
static void test_dram_room(void **state)
{
	const uint64_t g16 = 16ull << 30, room = srv_dram_headroom(16ull << 30);
	char err[800] = "";

	(void)state;
	assert_int_equal(room, (64ull << 20) + (512ull << 20));
	assert_int_equal(srv_check_dram_room(g16 - room, g16, 0, NULL, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram_room(g16, g16, 0, NULL, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity (17179869184 bytes) leaves less than"));
	assert_non_null(strstr(err, "physical memory"));
	assert_non_null(strstr(err, "at most 16575889408 bytes fit"));
	assert_int_equal(srv_check_dram_room(g16 - room + 1, g16, 0, NULL, err, sizeof(err)),
			 -ENOMEM);
	/* a cgroup limit below physical memory decides, named by its file */
	assert_int_equal(srv_check_dram_room(1ull << 30, g16, 1ull << 30,
					     "/sys/fs/cgroup/system.slice/kvpoold.service/memory.max",
					     err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "cgroup memory limit in /sys/fs/cgroup/system.slice/"
				    "kvpoold.service/memory.max (1073741824 bytes)"));
	assert_int_equal(srv_check_dram_room(512ull << 20, g16, 1ull << 30, NULL, err,
					     sizeof(err)), 0);
	/* unknown limits pass; a tiny limit leaves nothing that fits */
	assert_int_equal(srv_check_dram_room(1ull << 40, 0, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram_room(1ull << 20, 0, 32ull << 20, NULL, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "at most 0 bytes fit"));
}

/* The NVMe tier's index beside dram_capacity: deploy/kubernetes's pod
 * (8 GiB arena, 100 GiB tier) warns under a 9 GiB limit with the numbers
 * and the average block size that fits, and fits under 13 GiB. */
static void test_nvme_index_room(void **state)
{
	const uint64_t gib = 1ull << 30, d8 = 8 * gib, n100 = 100 * gib;
	const char *src = "/sys/fs/cgroup/kubepods/pod1/memory.max";
	char msg[1400] = "";
	uint64_t need;

	(void)state;
	/* 26,214,400 blocks of 4 KiB, 160 bytes each */
	assert_int_equal(srv_nvme_index_bytes(n100), 4194304000ull);
	assert_int_equal(srv_nvme_index_bytes(4095), 0);
	/* no tier, or no known limit: nothing to say */
	assert_int_equal(srv_check_nvme_index_room(d8, 0, 0, 9 * gib, src, msg, sizeof(msg)), 0);
	assert_int_equal(srv_check_nvme_index_room(d8, n100, 0, 0, NULL, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "");
	/* 9 GiB: 704,643,072 bytes left beside 8 GiB and 352 MiB, which
	 * hold 4,404,019 blocks: 100 GiB of them average 24,382 bytes,
	 * 24,576 in whole 4 KiB pages */
	assert_int_equal(srv_check_nvme_index_room(d8, n100, 24 * gib, 9 * gib, src, msg,
						   sizeof(msg)), 1);
	assert_non_null(strstr(msg, "nvme_capacity (107374182400 bytes) holds up to 26214400 "
				    "blocks of 4096 bytes, 160 bytes of index each (4194304000 bytes)"));
	assert_non_null(strstr(msg, "the cgroup memory limit in /sys/fs/cgroup/kubepods/pod1/"
				    "memory.max (9663676416 bytes) leaves 704643072 bytes beside "
				    "dram_capacity (8589934592 bytes) and kvpoold's own 369098752 bytes"));
	assert_non_null(strstr(msg, "average at least 24576 bytes"));
	assert_non_null(strstr(msg, "nvme_capacity to 18038861824 bytes"));
	/* the limit it names is the smallest that holds the index */
	assert_non_null(strstr(msg, "raise the limit to "));
	need = strtoull(strstr(msg, "raise the limit to ") + strlen("raise the limit to "), NULL, 10);
	assert_int_equal(srv_check_nvme_index_room(d8, n100, 0, need, NULL, msg, sizeof(msg)), 0);
	assert_int_equal(srv_check_nvme_index_room(d8, n100, 0, need - 4096, NULL, msg,
						   sizeof(msg)), 1);
	assert_true(need > 12 * gib && need <= 13 * gib);
	/* 13 GiB holds it (deploy/kubernetes/statefulset.yaml's limit) */
	assert_int_equal(srv_check_nvme_index_room(d8, n100, 24 * gib, 13 * gib, src, msg,
						   sizeof(msg)), 0);
	/* physical memory decides without a cgroup; dram_capacity that
	 * would have to go below its minimum is not offered */
	assert_int_equal(srv_check_nvme_index_room(gib, 1024 * gib, 2 * gib, 0, NULL, msg,
						   sizeof(msg)), 1);
	assert_non_null(strstr(msg, "this host's physical memory (2147483648 bytes)"));
	assert_null(strstr(msg, "lower dram_capacity"));
	assert_non_null(strstr(msg, "or lower nvme_capacity to "));
	/* no room at all beside the arena: no block size fits */
	assert_int_equal(srv_check_nvme_index_room(gib - srv_dram_headroom(gib), gib, gib, 0, NULL,
						   msg, sizeof(msg)), 1);
	assert_non_null(strstr(msg, "average more than nvme_capacity"));
	assert_non_null(strstr(msg, "nvme_capacity to 0 bytes"));
}

/* Which limit decides (moved from test_srv_limits.c, whose srv_check_dram
 * srv_check_dram_room replaced: the same cases, with the room it asks for):
 * the smaller of physical memory and the cgroup limit, and the message
 * names that one. */
static void test_which_limit(void **state)
{
	const uint64_t g16 = 16ull << 30, cg = 314572800;
	char err[800] = "";

	(void)state;
	assert_int_equal(srv_check_dram_room(1ull << 30, g16, 0, NULL, err, sizeof(err)), 0);
	assert_int_equal(srv_check_dram_room(1ull << 42, 0, 0, NULL, err, sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram_room(1ull << 42, g16, 0, NULL, err, sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "dram_capacity (4398046511104 bytes)"));
	assert_non_null(strstr(err, "physical memory (17179869184 bytes)"));
	/* the cgroup limit below physical memory decides: at its room passes,
	 * one byte more fails */
	memset(err, 0, sizeof(err));
	assert_int_equal(srv_check_dram_room(cg - srv_dram_headroom(cg), g16, cg, NULL, err,
					     sizeof(err)), 0);
	assert_string_equal(err, "");
	assert_int_equal(srv_check_dram_room(cg - srv_dram_headroom(cg) + 1, g16, cg, NULL, err,
					     sizeof(err)), -ENOMEM);
	assert_non_null(strstr(err, "cgroup memory limit (314572800 bytes)"));
	assert_null(strstr(err, "physical memory"));
	/* a cgroup limit above physical memory: physical memory decides */
	memset(err, 0, sizeof(err));
	assert_int_equal(srv_check_dram_room(1ull << 36, g16, 1ull << 40, NULL, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "physical memory (17179869184 bytes)"));
	assert_null(strstr(err, "cgroup"));
	/* physical memory unknown: the cgroup limit alone */
	assert_int_equal(srv_check_dram_room(1ull << 30, 0, 1ull << 29, NULL, err, sizeof(err)),
			 -ENOMEM);
	assert_non_null(strstr(err, "cgroup memory limit (536870912 bytes)"));
	assert_int_equal(srv_check_dram_room(1ull << 28, 0, 1ull << 29, NULL, err, sizeof(err)), 0);
	/* This host's figure is known and sane. */
	assert_true(srv_phys_bytes() >= (64ull << 20));
}

/* The parser of cgroup limit files (moved from test_srv_limits.c). */
static void test_parse_memory_max(void **state)
{
	uint64_t v = 7;

	(void)state;
	assert_int_equal(srv_parse_memory_max("max\n", &v), 0);
	assert_int_equal(v, 0);
	v = 7;
	assert_int_equal(srv_parse_memory_max("max", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(srv_parse_memory_max("314572800\n", &v), 0);
	assert_int_equal(v, 314572800);
	assert_int_equal(srv_parse_memory_max("18446744073709551615", &v), 0);
	assert_int_equal(v, UINT64_MAX);
	v = 7;
	assert_int_equal(srv_parse_memory_max("", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("-1\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("12x\n", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("1 2", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("99999999999999999999999", &v), -EINVAL);
	assert_int_equal(srv_parse_memory_max("maximum", &v), -EINVAL);
	assert_int_equal(v, 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cgroup_limits),
		cmocka_unit_test(test_dram_room),
		cmocka_unit_test(test_nvme_index_room),
		cmocka_unit_test(test_which_limit),
		cmocka_unit_test(test_parse_memory_max),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
