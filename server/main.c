/*
 * main.c - kvpoold: parse the settings, then serve (srv_run).
 *
 * Exit status: 0 after a clean shutdown (SIGTERM, SIGINT) or --help /
 * --version; 2 for a bad setting (including a dram_capacity larger than
 * the host's physical memory or its cgroup v2 memory limit, and a
 * non-loopback listen address with neither tokens_file nor
 * allow_unauthenticated: protected mode; a listen address that does not
 * resolve; an nvme_dir that is missing, not a directory or not writable;
 * a tokens_file that is missing or does not load); 1 when start-up fails
 * (a port in use, an nvme_dir locked by another kvpoold or holding an
 * unknown format, out of memory).
 */
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "proto.h"
#include "srv_lifecycle.h"
#include "srv_log.h"
#include "srv_memlimit.h"
#include "srv_server.h"

/* --version and --help are answered before the settings are parsed, so
 * they work whatever else is on the command line. */
static int early_flag(int argc, char **argv, const char *name)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], name))
			return 1;
	return 0;
}

/* Add to err where the setting it starts with ("listen: ...",
 * "tokens_file: ...") or `key` came from: "(listen from --listen)". */
static void name_source(char *err, size_t err_len, const char *key)
{
	char name[64];
	size_t n = strcspn(err, ": (");
	const char *src;

	if (!key) {
		if (n == 0 || n >= sizeof(name))
			return;
		memcpy(name, err, n);
		name[n] = '\0';
		key = name;
	}
	src = conf_source(key);
	if (src && strlen(err) + strlen(key) + strlen(src) + 16 < err_len)
		snprintf(err + strlen(err), err_len - strlen(err), " (%s from %s)", key, src);
}

/* Take --print-config out of argv (the settings parser does not know it);
 * returns whether it was there. */
static int take_print_config(int *argc, char **argv)
{
	int found = 0, n = 1;

	for (int i = 1; i < *argc; i++) {
		if (!strcmp(argv[i], "--print-config"))
			found = 1;
		else
			argv[n++] = argv[i];
	}
	argv[n] = NULL;
	*argc = n;
	return found;
}

/* The checks of the settings against this host, each naming the setting
 * and where it came from: dram_capacity against the memory limit (the
 * cgroups /proc/self/cgroup leads to, v1 or v2, nested ones included, or
 * physical memory), the paths, and protected mode. Returns 0, or -1 with
 * the message in err. */
static int check_settings(const struct conf *c, int *unprotected, char *err, size_t err_len)
{
	char cg_source[600] = "";
	uint64_t cg_bytes;

	cg_bytes = srv_cgroup_memory_limit("/proc/self/cgroup", "/sys/fs/cgroup", cg_source,
					   sizeof(cg_source));
	if (srv_check_dram_room(c->dram_capacity_bytes, srv_phys_bytes(), cg_bytes,
				cg_source[0] ? cg_source : NULL, err, err_len) < 0) {
		name_source(err, err_len, "dram_capacity");
		return -1;
	}
	if (srv_check_paths(c, err, err_len) < 0) {
		name_source(err, err_len, NULL);
		return -1;
	}
	if (srv_protected_check(c, unprotected, err, err_len) < 0) {
		name_source(err, err_len, "listen");
		return -1;
	}
	return 0;
}

/* Warn when the memory limit cannot hold the index of a full NVMe tier
 * beside dram_capacity (srv_check_nvme_index_room): a warning, since
 * blocks are rarely as small as 4 KiB. */
static void warn_nvme_index(const struct conf *c)
{
	char cg_source[600] = "", msg[1400];
	uint64_t cg_bytes;

	if (!c->nvme_dir[0])
		return;
	cg_bytes = srv_cgroup_memory_limit("/proc/self/cgroup", "/sys/fs/cgroup", cg_source,
					   sizeof(cg_source));
	if (srv_check_nvme_index_room(c->dram_capacity_bytes, c->nvme_capacity_bytes,
				      srv_phys_bytes(), cg_bytes, cg_source[0] ? cg_source : NULL,
				      msg, sizeof(msg)))
		srv_warn("%s", msg);
}

int main(int argc, char **argv)
{
	struct conf c;
	char err[512];
	int help = 0, unprotected = 0, print_config;

	/* Everything kvpoold creates (NVMe segments, the RocksDB index) holds
	 * tenants' data: owner only, whatever umask it was started with. */
	umask(077);
	if (early_flag(argc, argv, "--version")) {
		printf("kvpoold %s (protocol %d..%d)\n", SRV_VERSION, PROTO_VERSION_MIN,
		       PROTO_VERSION_MAX);
		return 0;
	}
	if (early_flag(argc, argv, "--help") || early_flag(argc, argv, "-h")) {
		conf_usage(stdout);
		return 0;
	}
	/* --print-config: the effective settings (defaults, --config files,
	 * KVPOOL_* and flags) as "key value" lines, then exit; for scripts
	 * such as the container's health check */
	print_config = take_print_config(&argc, argv);
	if (conf_load(&c, argc, argv, environ, stderr, &help, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpoold: %s\n", err);
		return 2;
	}
	if (print_config && !help) {
		conf_print(&c, stdout);
		return 0;
	}
	if (!help && check_settings(&c, &unprotected, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpoold: %s\n", err);
		return 2;
	}
	if (help) {
		conf_usage(stdout);
		return 0;
	}
	srv_log_set_level(c.log_level);
	warn_nvme_index(&c);
	if (unprotected)
		srv_warn("listening on %s without authentication (allow_unauthenticated = true, no "
			 "tokens_file): every client that reaches port %u may read and write every "
			 "namespace", c.listen, c.port);
	return srv_run(&c, argc, argv) < 0 ? 1 : 0;
}
