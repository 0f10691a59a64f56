/*
 * test_config.c - unit tests of kvpoold settings (config/).
 *
 * Size parsing (good and bad), every rejection path of conf_set, INI files
 * with file:line in their messages, flags in both forms, precedence
 * flag > env > file > default, cross-setting validation, --help and the
 * shipped example config; the NVMe tier's settings and their rules;
 * booleans, KVPOOL_* variables, SIGHUP reload and the JSON of STATS.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "conf.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define TIB (1ull << 40)

/* Every key, in table order. */
static const char *const keys[] = {
	"listen", "port", "threads", "dram_capacity", "max_block_bytes", "max_batch_blocks",
	"max_frame_bytes", "max_lease_ms", "max_match_wait_ms", "max_retain_ms", "max_connections", "idle_timeout_ms",
	"payload_timeout_ms", "max_inflight_put_bytes", "log_level", "nvme_dir", "nvme_capacity",
	"nvme_admission", "nvme_segment_size", "nvme_io_threads", "rdma_port", "admin_port",
	"tokens_file", "tenant_max_namespaces", "tenant_max_bytes", "tenant_max_leased_bytes",
	"max_conn_leased_bytes", "max_retained_bytes", "max_retained_total_bytes",
	"max_conn_match_waits", "tenant_max_match_waits", "max_match_wait_bytes",
	"allow_unauthenticated", "tls_cert_file", "tls_key_file",
	"tls_client_ca_file", "tls_only", "allow_plaintext_tokens", "tls_allow_rdma",
	"drain_timeout_ms", "nvme_drain_ms",
	"kv_events_endpoint",
	"kv_events_replay_endpoint", "kv_events_topic", "kv_events_buffer", "kv_events_queue",
	"kv_events_block_size", "kv_events_replay_max_bytes", "cluster", "node_name",
	"advertise_address", "cluster_lease_s",
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

/* ---- helpers ------------------------------------------------------------ */

struct tmpfile {
	char path[64];
};

/* Write len bytes of text to a new temporary file. */
static void tmp_write_bytes(struct tmpfile *t, const char *text, size_t len)
{
	int fd;

	snprintf(t->path, sizeof(t->path), "/tmp/kvpool-conf-XXXXXX");
	fd = mkstemp(t->path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

/* Write text to a new temporary file. */
static void tmp_write(struct tmpfile *t, const char *text)
{
	tmp_write_bytes(t, text, strlen(text));
}

static void tmp_remove(struct tmpfile *t)
{
	assert_int_equal(unlink(t->path), 0);
}

static uint32_t cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 256 ? 256 : (uint32_t)n;
}

/* conf_print into a string (caller frees). */
static char *print_conf(const struct conf *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	conf_print(c, f);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void assert_contains(const char *haystack, const char *needle)
{
	if (!strstr(haystack, needle))
		fail_msg("'%s' does not contain '%s'", haystack, needle);
}

/* Run conf_from_args on a NULL-terminated list (argv[0] added). */
static int run_args(struct conf *c, int *help, char *err, size_t err_len, ...)
{
	char *argv[32] = { "kvpoold" };
	int argc = 1;
	va_list ap;

	va_start(ap, err_len);
	for (char *a; (a = va_arg(ap, char *)) != NULL;) {
		assert_true(argc < 31);
		argv[argc++] = a;
	}
	va_end(ap);
	return conf_from_args(c, argc, argv, help, err, err_len);
}

/* ---- defaults ----------------------------------------------------------- */

static void test_defaults(void **state)
{
	struct conf c;
	char err[256];

	(void)state;
	memset(&c, 0xab, sizeof(c));
	conf_defaults(&c);
	assert_string_equal(c.listen, "127.0.0.1");
	assert_int_equal(c.port, 7470);
	assert_int_equal(c.threads, cores());
	assert_true(c.dram_capacity_bytes == GIB);
	assert_true(c.max_block_bytes == 64 * MIB);
	assert_int_equal(c.max_batch_blocks, 1024);
	assert_int_equal(c.max_frame_bytes, MIB);
	assert_true(c.max_frame_bytes >= 32 + 8 + 88 * c.max_batch_blocks);
	assert_int_equal(c.max_lease_ms, 5000);
	assert_int_equal(c.max_connections, 1024);
	assert_int_equal(c.idle_timeout_ms, 300000);
	assert_int_equal(c.payload_timeout_ms, 10000);
	assert_true(c.max_inflight_put_bytes == 512 * MIB);
	assert_int_equal(c.log_level, CONF_LOG_INFO);
	/* no NVMe tier unless asked for */
	assert_string_equal(c.nvme_dir, "");
	assert_true(c.nvme_capacity_bytes == 0);
	assert_int_equal(c.nvme_admission, CONF_ADMIT_ALL);
	assert_true(c.nvme_segment_bytes == 0);
	assert_int_equal(c.nvme_io_threads, 0);
	assert_int_equal(c.admin_port, 7471);
	assert_string_equal(c.tokens_file, "");
	assert_int_equal(c.allow_unauthenticated, 0);
	assert_int_equal(c.drain_timeout_ms, 10000);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
}

/* conf_print writes text that conf_set reads back to the same settings. */
static void test_print_roundtrip(void **state)
{
	struct conf c, d;
	char err[256], *text, *again, *save = NULL;
	size_t lines = 0;

	(void)state;
	conf_defaults(&c);
	assert_int_equal(conf_set(&c, "dram_capacity", "1.5GiB", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "max_block_bytes", "4097", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "log_level", "debug", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "listen", "::1", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "nvme_dir", "/mnt/nvme 0/kv", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "nvme_capacity", "1.5TiB", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "nvme_admission", "reused", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "nvme_segment_size", "64MiB", "t", err, sizeof(err)), 0);
	text = print_conf(&c);
	assert_contains(text, "dram_capacity 1536MiB\n");
	assert_contains(text, "nvme_dir /mnt/nvme 0/kv\n");
	assert_contains(text, "nvme_capacity 1536GiB\n");
	assert_contains(text, "nvme_admission reused\n");
	assert_contains(text, "nvme_segment_size 64MiB\n");
	assert_contains(text, "nvme_io_threads 0\n");
	assert_contains(text, "max_block_bytes 4097\n");
	assert_contains(text, "log_level debug\n");
	assert_contains(text, "listen ::1\n");

	conf_defaults(&d);
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *sp = strchr(line, ' ');

		assert_non_null(sp);
		*sp = '\0';
		assert_string_equal(line, keys[lines]);
		assert_int_equal(conf_set(&d, line, sp + 1, "print", err, sizeof(err)), 0);
		lines++;
	}
	assert_int_equal(lines, N_KEYS);
	free(text);
	text = print_conf(&c);
	again = print_conf(&d);
	assert_string_equal(text, again);
	assert_true(d.dram_capacity_bytes == 3 * GIB / 2);
	assert_string_equal(d.nvme_dir, "/mnt/nvme 0/kv");
	assert_int_equal(d.nvme_admission, CONF_ADMIT_REUSED);
	free(text);
	free(again);
}

/* ---- sizes -------------------------------------------------------------- */

static void test_size_good(void **state)
{
	static const struct { const char *text; uint64_t want; } cases[] = {
		{ "0", 0 }, { "1", 1 }, { "4096", 4096 }, { "007", 7 },
		{ "1B", 1 }, { "1b", 1 }, { "12 B", 12 },
		{ "1KB", 1000 }, { "1kb", 1000 }, { "1Kb", 1000 }, { "1MB", 1000000 },
		{ "1GB", 1000000000ull }, { "1TB", 1000000000000ull },
		{ "1KiB", KIB }, { "1kib", KIB }, { "1KIB", KIB }, { "1MiB", MIB },
		{ "4GiB", 4 * GIB }, { "4gib", 4 * GIB }, { "2TiB", 2 * TIB },
		{ "1.5GiB", 3 * GIB / 2 }, { "0.5KiB", 512 }, { "1.25MB", 1250000 },
		{ "0.1KB", 100 }, { "2.0GB", 2000000000ull },
		{ "4 GiB", 4 * GIB }, { " 4GiB ", 4 * GIB }, { "\t64MiB\t", 64 * MIB },
		/* fractions are rounded down to a whole byte */
		{ "1.0001KB", 1000 }, { "1.9999KiB", 2047 },
		{ "3.99999999999999999999999GB", 3999999999ull },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215TiB", 16777215ull * TIB },
		{ "15.99999TiB", 17592175049299ull },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 12345;
		int rc = conf_parse_size(cases[i].text, &v);

		if (rc != 0 || v != cases[i].want)
			fail_msg("'%s': rc %d value %llu, want %llu", cases[i].text, rc,
				 (unsigned long long)v, (unsigned long long)cases[i].want);
	}
}

static void test_size_bad(void **state)
{
	static const struct { const char *text; int err; } cases[] = {
		{ "", -EINVAL }, { "   ", -EINVAL },
		{ "-1", -EINVAL }, { "-1GiB", -EINVAL }, { " -0", -EINVAL },
		{ "abc", -EINVAL }, { "GiB", -EINVAL }, { "+5", -EINVAL }, { ".5GiB", -EINVAL },
		{ "1.5", -EINVAL }, { "1.5B", -EINVAL }, /* a fraction of a byte */
		{ "1.GiB", -EINVAL }, { "1..5GiB", -EINVAL }, { "1.5.5GiB", -EINVAL },
		{ "4XB", -EINVAL }, { "4G", -EINVAL }, { "4K", -EINVAL }, { "4 bytes", -EINVAL },
		{ "4PiB", -EINVAL }, { "4GiBs", -EINVAL }, { "4iB", -EINVAL },
		{ "4 GiB x", -EINVAL }, { "4GiB2", -EINVAL }, { "4GiB;", -EINVAL },
		{ "0x10", -EINVAL }, { "1e9", -EINVAL }, { "nan", -EINVAL }, { "inf", -EINVAL },
		{ "1,5GiB", -EINVAL }, { "4 G iB", -EINVAL },
		{ "18446744073709551616", -ERANGE },
		{ "99999999999999999999999", -ERANGE },
		{ "16777216TiB", -ERANGE }, { "17179869184GiB", -ERANGE },
		{ "18446744073709551615KB", -ERANGE }, { "16777215.99999999TiB", 0 },
		{ "18446744073.709551616GB", -ERANGE },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 777;
		int rc = conf_parse_size(cases[i].text, &v);

		if (rc != cases[i].err)
			fail_msg("'%s': rc %d, want %d", cases[i].text, rc, cases[i].err);
		if (rc)
			assert_true(v == 777); /* untouched on error */
	}
	uint64_t v;
	assert_int_equal(conf_parse_size(NULL, &v), -EINVAL);
}

/* ---- conf_set ----------------------------------------------------------- */

struct set_case {
	const char *key, *value;
	int err;           /* expected return */
	const char *reason; /* substring of the message */
};

static void test_set_rejections(void **state)
{
	static char long_name[300], long_path[4200];
	const struct set_case cases[] = {
		{ "bogus", "1", -ENOENT, "unknown key 'bogus'" },
		{ "Port", "1", -ENOENT, "unknown key" },
		{ "", "1", -ENOENT, "unknown key" },
		{ "port", "abc", -EINVAL, "not a whole number" },
		{ "port", "", -EINVAL, "empty" },
		{ "port", "-1", -EINVAL, "negative" },
		{ "port", "74 70", -EINVAL, "not a whole number" },
		{ "port", "7k", -EINVAL, "not a whole number" },
		{ "port", "1.5", -EINVAL, "not a whole number" },
		{ "port", "0", -ERANGE, "out of range 1..65535" },
		{ "port", "65536", -ERANGE, "out of range 1..65535" },
		{ "port", "4294967296", -ERANGE, "32 bits" },
		{ "threads", "257", -ERANGE, "out of range 0..256 (0 = one per core)" },
		{ "max_batch_blocks", "0", -ERANGE, "out of range 1..65536" },
		{ "max_batch_blocks", "65537", -ERANGE, "out of range" },
		{ "max_connections", "0", -ERANGE, "out of range" },
		{ "max_lease_ms", "3600001", -ERANGE, "out of range 0..3600000" },
		{ "idle_timeout_ms", "86400001", -ERANGE, "out of range" },
		{ "payload_timeout_ms", "9", -ERANGE, "out of range 10..3600000" },
		{ "dram_capacity", "1048575", -ERANGE, "out of range 1MiB..4TiB" },
		{ "dram_capacity", "512KiB", -ERANGE, "out of range" },
		{ "dram_capacity", "4097GiB", -ERANGE, "out of range 1MiB..4TiB" },
		{ "dram_capacity", "4398046511105", -ERANGE, "out of range" }, /* 4TiB + 1 */
		{ "dram_capacity", "257TiB", -ERANGE, "out of range" },
		{ "dram_capacity", "-4GiB", -EINVAL, "negative" },
		{ "dram_capacity", "4XB", -EINVAL, "unknown unit 'XB'" },
		{ "dram_capacity", "4GiB junk", -EINVAL, "trailing" },
		{ "dram_capacity", "99999999999999999999GiB", -ERANGE, "64 bits" },
		{ "max_block_bytes", "0", -ERANGE, "out of range 1..4GiB" },
		{ "max_block_bytes", "4.5GiB", -ERANGE, "out of range" },
		{ "max_frame_bytes", "4095", -ERANGE, "out of range 4KiB..1GiB" },
		{ "max_frame_bytes", "2GiB", -ERANGE, "out of range" },
		{ "max_frame_bytes", "8GiB", -ERANGE, "out of range" }, /* would wrap a u32 */
		{ "max_inflight_put_bytes", "0", -ERANGE, "out of range" },
		{ "log_level", "verbose", -EINVAL, "unknown log level" },
		{ "log_level", "", -EINVAL, "unknown log level" },
		{ "log_level", "2", -EINVAL, "unknown log level" },
		{ "listen", "", -ERANGE, "length 0" },
		{ "listen", "a b", -EINVAL, "spaces" },
		{ "listen", "a\tb", -EINVAL, "spaces" },
		{ "listen", "a\x01", -EINVAL, "control" },
		{ "listen", long_name, -ERANGE, "length 256" },
		{ "port", NULL, -EINVAL, "missing value" },
		{ "nvme_dir", "/a\tb", -EINVAL, "control characters" },
		{ "nvme_dir", "/a\nb", -EINVAL, "control characters" },
		{ "nvme_dir", long_path, -ERANGE, "length 4096" },
		{ "nvme_capacity", "-1GiB", -EINVAL, "negative" },
		{ "nvme_capacity", "1025TiB", -ERANGE, "out of range 0..1024TiB" },
		{ "nvme_capacity", "10 GiBs", -EINVAL, "unknown unit" },
		{ "nvme_admission", "some", -EINVAL, "unknown admission (use all or reused)" },
		{ "nvme_admission", "", -EINVAL, "unknown admission" },
		{ "nvme_admission", "1", -EINVAL, "unknown admission" },
		{ "nvme_segment_size", "17GiB", -ERANGE, "out of range 0..16GiB" },
		{ "nvme_segment_size", "x", -EINVAL, "not a number" },
		{ "nvme_io_threads", "65", -ERANGE, "out of range 0..64" },
		{ "nvme_io_threads", "2k", -EINVAL, "not a whole number" },
	};
	struct conf c, before;
	char err[512];

	(void)state;
	memset(long_name, 'h', 256);
	memset(long_path, 'p', 4096);
	conf_defaults(&c);
	before = c;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc;

		err[0] = '\0';
		rc = conf_set(&c, cases[i].key, cases[i].value, "src.conf:42", err, sizeof(err));
		if (rc != cases[i].err)
			fail_msg("%s = '%s': rc %d, want %d (%s)", cases[i].key,
				 cases[i].value ? cases[i].value : "(null)", rc, cases[i].err, err);
		assert_contains(err, "src.conf:42: ");
		assert_contains(err, cases[i].reason);
		if (rc != -ENOENT)
			assert_contains(err, cases[i].key); /* names the key */
		/* a rejected value changes nothing */
		assert_memory_equal(&c, &before, sizeof(c));
	}
	/* err may be NULL */
	assert_int_equal(conf_set(&c, "port", "x", "s", NULL, 0), -EINVAL);
	assert_int_equal(conf_set(&c, NULL, "1", "s", err, sizeof(err)), -ENOENT);
}

static void test_set_accepts(void **state)
{
	struct conf c;
	char err[256];

	(void)state;
	conf_defaults(&c);
	assert_int_equal(conf_set(&c, "port", " 8080 ", "s", err, sizeof(err)), 0);
	assert_int_equal(c.port, 8080);
	assert_int_equal(conf_set(&c, "port", "65535", "s", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "port", "1", "s", err, sizeof(err)), 0);
	assert_int_equal(c.port, 1);
	assert_int_equal(conf_set(&c, "threads", "256", "s", err, sizeof(err)), 0);
	assert_int_equal(c.threads, 256);
	assert_int_equal(conf_set(&c, "threads", "0", "s", err, sizeof(err)), 0);
	assert_int_equal(c.threads, cores()); /* 0 = number of cores */
	assert_int_equal(conf_set(&c, "max_frame_bytes", "1GiB", "s", err, sizeof(err)), 0);
	assert_int_equal(c.max_frame_bytes, (uint32_t)GIB);
	assert_int_equal(conf_set(&c, "max_frame_bytes", "4KiB", "s", err, sizeof(err)), 0);
	assert_int_equal(c.max_frame_bytes, 4096);
	assert_int_equal(conf_set(&c, "dram_capacity", "1MiB", "s", err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == MIB);
	assert_int_equal(conf_set(&c, "dram_capacity", "4TiB", "s", err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == 4 * TIB);
	assert_int_equal(conf_set(&c, "max_lease_ms", "0", "s", err, sizeof(err)), 0);
	assert_int_equal(c.max_lease_ms, 0);
	assert_int_equal(conf_set(&c, "idle_timeout_ms", "0", "s", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "log_level", "WARN", "s", err, sizeof(err)), 0);
	assert_int_equal(c.log_level, CONF_LOG_WARN);
	assert_int_equal(conf_set(&c, "log_level", "error", "s", err, sizeof(err)), 0);
	assert_int_equal(c.log_level, CONF_LOG_ERROR);
	assert_int_equal(conf_set(&c, "listen", "0.0.0.0", "s", err, sizeof(err)), 0);
	assert_string_equal(c.listen, "0.0.0.0");

	char name[256];
	memset(name, 'n', 255);
	name[255] = '\0';
	assert_int_equal(conf_set(&c, "listen", name, "s", err, sizeof(err)), 0);
	assert_int_equal(strlen(c.listen), 255);

	/* the NVMe settings */
	assert_int_equal(conf_set(&c, "nvme_dir", "/srv/kv pool/nvme", "s", err, sizeof(err)), 0);
	assert_string_equal(c.nvme_dir, "/srv/kv pool/nvme"); /* blanks inside a path are fine */
	assert_int_equal(conf_set(&c, "nvme_dir", "", "s", err, sizeof(err)), 0);
	assert_string_equal(c.nvme_dir, ""); /* unset again */
	char path[4096];
	memset(path, 'd', 4095);
	path[4095] = '\0';
	assert_int_equal(conf_set(&c, "nvme_dir", path, "s", err, sizeof(err)), 0);
	assert_int_equal(strlen(c.nvme_dir), 4095);
	assert_int_equal(conf_set(&c, "nvme_capacity", "2TB", "s", err, sizeof(err)), 0);
	assert_true(c.nvme_capacity_bytes == 2000000000000ull);
	assert_int_equal(conf_set(&c, "nvme_capacity", "1024TiB", "s", err, sizeof(err)), 0);
	assert_true(c.nvme_capacity_bytes == 1024 * TIB);
	assert_int_equal(conf_set(&c, "nvme_admission", "REUSED", "s", err, sizeof(err)), 0);
	assert_int_equal(c.nvme_admission, CONF_ADMIT_REUSED);
	assert_int_equal(conf_set(&c, "nvme_admission", "all", "s", err, sizeof(err)), 0);
	assert_int_equal(c.nvme_admission, CONF_ADMIT_ALL);
	assert_int_equal(conf_set(&c, "nvme_segment_size", "16GiB", "s", err, sizeof(err)), 0);
	assert_true(c.nvme_segment_bytes == 16 * GIB);
	assert_int_equal(conf_set(&c, "nvme_segment_size", "0", "s", err, sizeof(err)), 0);
	assert_true(c.nvme_segment_bytes == 0);
	assert_int_equal(conf_set(&c, "nvme_io_threads", "64", "s", err, sizeof(err)), 0);
	assert_int_equal(c.nvme_io_threads, 64);
	assert_int_equal(conf_set(&c, "nvme_io_threads", "0", "s", err, sizeof(err)), 0);
	assert_int_equal(c.nvme_io_threads, 0); /* 0 stays 0: the store's default */
}

/* ---- conf_validate ------------------------------------------------------ */

static void test_validate(void **state)
{
	struct conf c;
	char err[512];

	(void)state;
	conf_defaults(&c);
	c.max_block_bytes = 2 * GIB;
	c.max_inflight_put_bytes = 4 * GIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "max_block_bytes (2GiB)");
	assert_contains(err, "dram_capacity (1GiB)");
	c.max_block_bytes = GIB; /* equal is fine */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	/* rdma_port: default 7472, must differ from port, 0 turns RDMA off. */
	assert_int_equal(c.rdma_port, 7472);
	c.rdma_port = c.port;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "rdma_port (7470) must differ from port");
	c.rdma_port = c.admin_port;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "rdma_port (7471) must differ from admin_port");
	c.rdma_port = 0;
	c.admin_port = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.admin_port = 7471;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.rdma_port = 7472;
	/* admin_port shares the listen address with port; 0 turns it off */
	c.admin_port = c.port;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "admin_port (7470) must differ from port");
	c.admin_port = c.rdma_port;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "rdma_port (7472) must differ from admin_port");
	c.admin_port = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.admin_port = 7471;

	conf_defaults(&c);
	c.max_inflight_put_bytes = 64 * MIB - 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "max_inflight_put_bytes");
	assert_contains(err, "max_block_bytes (64MiB)");
	c.max_inflight_put_bytes = 64 * MIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);

	/* a full PUT batch must fit in a frame: 32 + 8 + 88 * blocks */
	conf_defaults(&c);
	c.max_batch_blocks = 1000;
	c.max_frame_bytes = 32 + 8 + 88 * 1000;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.max_frame_bytes--;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "max_frame_bytes");
	assert_contains(err, "max_batch_blocks (1000)");
	assert_contains(err, "88040");
	c.max_batch_blocks = 65536;
	c.max_frame_bytes = 4 * MIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);

	/* ranges, for a struct filled by hand */
	conf_defaults(&c);
	c.port = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "port");
	conf_defaults(&c);
	c.threads = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "threads");
	conf_defaults(&c);
	c.log_level = 7;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "log_level");
	conf_defaults(&c);
	c.max_frame_bytes = 1024;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "max_frame_bytes");
	conf_defaults(&c);
	c.dram_capacity_bytes = 4 * TIB + 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "dram_capacity");
	conf_defaults(&c);
	memset(c.listen, 'x', sizeof(c.listen)); /* not NUL-terminated */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "listen");
	conf_defaults(&c);
	c.listen[0] = '\0';
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
}

/* cluster and node_name: what etcd registration and placement can use. */
static void test_validate_cluster(void **state)
{
	static const char *const bad_urls[] = {
		"http://h:2379/c", "etcd://h:2379", "etcd:///c", "etcd://h/", "etcd://h/a b",
		"etcd://h/a/b", "etcd://h/caf\xc3\xa9",
	};
	struct conf c;
	char err[512];

	(void)state;
	conf_defaults(&c);
	strcpy(c.cluster, "etcd://127.0.0.1:2379/prod-1.a_b");
	strcpy(c.node_name, "kv-1.rack:7");
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	strcpy(c.cluster, "etcd://etcd/x");
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++) {
		conf_defaults(&c);
		strcpy(c.cluster, bad_urls[i]);
		assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
		assert_contains(err, "cluster");
	}
	conf_defaults(&c);
	strcpy(c.node_name, "a/b");
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "node_name 'a/b'");
	conf_defaults(&c);
	assert_int_equal(conf_set(&c, "cluster_lease_s", "1", "--cluster-lease-s", err,
				  sizeof(err)), -ERANGE);
	assert_int_equal(conf_set(&c, "cluster_lease_s", "2", "--cluster-lease-s", err,
				  sizeof(err)), 0);
	assert_int_equal(c.cluster_lease_s, 2);
}

/* The NVMe rules apply only with nvme_dir: a capacity, a segment of whole
 * pages that holds the largest block, and two segments in the capacity. */
/* kv events: the settings from the three sources, the defaults, and the
 * replay endpoint's rules. */
static void test_kv_events_settings(void **state)
{
	struct conf c;
	char err[512];
	char *env[] = { "KVPOOL_KV_EVENTS_TOPIC=pool-a", "KVPOOL_KV_EVENTS_QUEUE=10", NULL };
	struct tmpfile t;
	int help;

	(void)state;
	conf_defaults(&c);
	assert_string_equal(c.kv_events_endpoint, "");
	assert_string_equal(c.kv_events_replay_endpoint, "");
	assert_string_equal(c.kv_events_topic, "kvpool");
	assert_int_equal(c.kv_events_buffer, 1000);
	assert_int_equal(c.kv_events_queue, 65536);
	assert_int_equal(c.kv_events_block_size, 16);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	tmp_write(&t, "kv_events_endpoint = tcp://127.0.0.1:5557\nkv_events_buffer = 5\n");
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	tmp_remove(&t);
	assert_int_equal(conf_from_env(&c, env, NULL, err, sizeof(err)), 0);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--kv-events-replay-endpoint",
				  "tcp://127.0.0.1:5558", "--kv-events-block-size=32", NULL),
			 0);
	assert_string_equal(c.kv_events_endpoint, "tcp://127.0.0.1:5557");
	assert_string_equal(c.kv_events_replay_endpoint, "tcp://127.0.0.1:5558");
	assert_string_equal(c.kv_events_topic, "pool-a");
	assert_int_equal(c.kv_events_buffer, 5);
	assert_int_equal(c.kv_events_queue, 10);
	assert_int_equal(c.kv_events_block_size, 32);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	/* a replay endpoint needs the PUB endpoint, and another address */
	strcpy(c.kv_events_replay_endpoint, c.kv_events_endpoint);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "kv_events_replay_endpoint must differ from kv_events_endpoint");
	c.kv_events_endpoint[0] = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "needs kv_events_endpoint");
	/* ranges and an empty topic */
	assert_int_equal(conf_set(&c, "kv_events_buffer", "0", "t", err, sizeof(err)), -ERANGE);
	assert_int_equal(conf_set(&c, "kv_events_queue", "0", "t", err, sizeof(err)), -ERANGE);
	assert_true(conf_set(&c, "kv_events_topic", "", "t", err, sizeof(err)) < 0);
	assert_true(conf_set(&c, "kv_events_topic", "a b", "t", err, sizeof(err)) < 0);
}

static void test_validate_nvme(void **state)
{
	struct conf c;
	char err[512];

	(void)state;
	conf_defaults(&c);
	c.nvme_segment_bytes = 4097; /* ignored: no NVMe tier */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	/* a capacity without a directory would silently serve DRAM only */
	c.nvme_capacity_bytes = GIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_capacity (1GiB) needs nvme_dir");
	c.nvme_capacity_bytes = 0;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);

	conf_defaults(&c);
	strcpy(c.nvme_dir, "/tmp");
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_capacity must be set when nvme_dir is set");
	c.nvme_capacity_bytes = 64 * GIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);

	/* automatic segments: two blocks of max_block_bytes (64MiB) at least */
	c.nvme_capacity_bytes = 128 * MIB - 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_capacity (134217727) must hold two segments");
	assert_contains(err, "max_block_bytes (64MiB");
	c.nvme_capacity_bytes = 128 * MIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.max_block_bytes = 64 * MIB + 1; /* 64MiB + 4KiB in pages */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "65540KiB in 4KiB pages");

	/* explicit segments */
	conf_defaults(&c);
	strcpy(c.nvme_dir, "/tmp");
	c.max_block_bytes = MIB;
	c.nvme_capacity_bytes = 8 * MIB;
	c.nvme_segment_bytes = 4 * MIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.nvme_segment_bytes = 4 * MIB + 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_segment_size (4194305) must be a multiple of 4KiB");
	c.nvme_segment_bytes = MIB - 4 * KIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_segment_size (1020KiB) must hold a block of max_block_bytes (1MiB");
	c.nvme_segment_bytes = MIB; /* exactly one block */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	c.nvme_segment_bytes = 4 * MIB + 4 * KIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_capacity (8MiB) must hold two segments of nvme_segment_size (4100KiB)");
	assert_true(c.dram_capacity_bytes == GIB);

	/* a rejection leaves everything as it was, the capacity too */
	c.dram_capacity_bytes = GIB + 10;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_true(c.dram_capacity_bytes == GIB + 10);

	/* ranges, for a struct filled by hand */
	conf_defaults(&c);
	c.nvme_admission = 2;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_admission");
	conf_defaults(&c);
	c.nvme_io_threads = 65;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_io_threads");
	conf_defaults(&c);
	memset(c.nvme_dir, 'x', sizeof(c.nvme_dir)); /* not NUL-terminated */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "nvme_dir");
}

/* The NVMe settings from a file and from flags, flags winning. */
static void test_nvme_file_and_flags(void **state)
{
	struct tmpfile t;
	struct conf c;
	char err[512];
	int help = -1;

	(void)state;
	tmp_write(&t, "[kvpoold]\nnvme_dir = /var/lib/kv pool   # the SSD\nnvme_capacity = 2TiB\n"
		      "nvme_admission = reused\nnvme_segment_size = 128MiB\nnvme_io_threads = 4\n");
	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--config", t.path,
				  "--nvme-capacity", "1TiB", "--nvme-io-threads=3", NULL), 0);
	assert_string_equal(c.nvme_dir, "/var/lib/kv pool");
	assert_true(c.nvme_capacity_bytes == TIB);
	assert_int_equal(c.nvme_admission, CONF_ADMIT_REUSED);
	assert_true(c.nvme_segment_bytes == 128 * MIB);
	assert_int_equal(c.nvme_io_threads, 3);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);

	/* a flag can unset the directory the file set */
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--config", t.path, "--nvme-dir=",
				  NULL), 0);
	assert_string_equal(c.nvme_dir, "");
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--nvme-admission", "most", NULL),
			 -EINVAL);
	assert_contains(err, "--nvme-admission: nvme_admission: unknown admission");
	tmp_remove(&t);

	tmp_write(&t, "nvme_dir = /a\nnvme_dir = /b\n");
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), -EINVAL);
	assert_contains(err, ":2: nvme_dir: already set on line 1");
	tmp_remove(&t);
}

/* dram_capacity is rounded down to 4 KiB and written back, on success
 * only; max_block_bytes, rounded up to 4 KiB, must fit in it. */
static void test_validate_rounding(void **state)
{
	struct conf c;
	char err[512];

	(void)state;
	conf_defaults(&c);
	c.max_block_bytes = MIB;
	c.dram_capacity_bytes = MIB + 100;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == MIB);
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0); /* idempotent */
	assert_true(c.dram_capacity_bytes == MIB);
	c.dram_capacity_bytes = 3 * GIB + 4095;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == 3 * GIB);
	c.dram_capacity_bytes = 4 * TIB - 1; /* the largest, rounded too */
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == 4 * TIB - 4 * KIB);

	/* 1 MiB + 1 byte takes 257 pages: more than 1 MiB + 4095 rounds to */
	conf_defaults(&c);
	c.dram_capacity_bytes = MIB + 4095;
	c.max_block_bytes = MIB + 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "max_block_bytes (1048577, 1028KiB in 4KiB pages)");
	assert_contains(err, "dram_capacity (1MiB)");
	assert_true(c.dram_capacity_bytes == MIB + 4095); /* unchanged on error */
	c.dram_capacity_bytes = MIB + 4096;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == MIB + 4096);
	/* a block of exactly the rounded capacity fits */
	c.dram_capacity_bytes = 2 * MIB + 10;
	c.max_block_bytes = 2 * MIB;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), 0);
	assert_true(c.dram_capacity_bytes == 2 * MIB);
	/* an error from another rule leaves the capacity as given too */
	c.dram_capacity_bytes = 2 * MIB + 10;
	c.max_inflight_put_bytes = 1;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_true(c.dram_capacity_bytes == 2 * MIB + 10);
}

/* ---- INI files ---------------------------------------------------------- */

static void test_file_load(void **state)
{
	struct tmpfile t;
	struct conf c;
	char err[512];

	(void)state;
	tmp_write(&t,
		  "# a comment\n"
		  "; another\n"
		  "listen = 0.0.0.0\n"
		  "\n"
		  "[kvpoold]\n"
		  "  port = 9000\n"        /* indented keys are plain keys */
		  "\tthreads = 3\n"
		  "dram_capacity = 1.5GiB\r\n" /* CRLF */
		  "max_block_bytes=8MiB\n"
		  "max_batch_blocks : 512\n"
		  "log_level = Debug ; inline comment\n"
		  "max_inflight_put_bytes = 1GB\n");
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_string_equal(c.listen, "0.0.0.0");
	assert_int_equal(c.port, 9000);
	assert_int_equal(c.threads, 3);
	assert_true(c.dram_capacity_bytes == 3 * GIB / 2);
	assert_true(c.max_block_bytes == 8 * MIB);
	assert_int_equal(c.max_batch_blocks, 512);
	assert_int_equal(c.log_level, CONF_LOG_DEBUG);
	assert_true(c.max_inflight_put_bytes == 1000000000ull);
	assert_int_equal(c.max_lease_ms, 5000); /* untouched keys keep their value */
	tmp_remove(&t);

	/* threads = 0 in the file means the number of cores */
	tmp_write(&t, "threads = 0\n");
	c.threads = 7;
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_int_equal(c.threads, cores());
	tmp_remove(&t);

	/* an empty file changes nothing */
	tmp_write(&t, "");
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_int_equal(c.threads, cores());
	tmp_remove(&t);

	/* '#' and ';' behave alike: whole-line and inline (after a blank) */
	tmp_write(&t,
		  "\xef\xbb\xbf# after a byte order mark\n"
		  "[kvpoold] # section comment\n"
		  "   ; indented comment\n"
		  "\t# tab-indented comment\n"
		  "port = 7471 # hash comment\n"
		  "threads = 5 ; semicolon comment\n"
		  "max_lease_ms = 100\t#tab then hash\n"
		  "max_connections = 99\t;tab then semicolon\n"
		  "listen = a;b\n"          /* no blank before: part of the value */
		  "max_batch_blocks = 7 #\n"
		  "idle_timeout_ms = 5 ;; twice # mixed\n");
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_int_equal(c.port, 7471);
	assert_int_equal(c.threads, 5);
	assert_int_equal(c.max_lease_ms, 100);
	assert_int_equal(c.max_connections, 99);
	assert_string_equal(c.listen, "a;b");
	assert_int_equal(c.max_batch_blocks, 7);
	assert_int_equal(c.idle_timeout_ms, 5);
	tmp_remove(&t);

	/* the section name in any case, blanks inside the brackets allowed */
	tmp_write(&t, "[ KvPoold ]\nport = 7472\n");
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_int_equal(c.port, 7472);
	tmp_remove(&t);
}

/* Shapes of a long line: each is written at an exact length. */
enum line_shape {
	LINE_VALUE,     /* "listen=xxx...": the value fills the line */
	LINE_COMMENTED, /* "listen = xyz #ccc...": an inline comment fills it */
	LINE_INDENTED,  /* blanks, then "listen = xyz" */
	LINE_COMMENT,   /* "; ccc..." */
	LINE_SECTION,   /* "[kvpoold]\t#ccc..." */
	N_SHAPES
};

/* Fill buf with one line of exactly len bytes (no line end) of a shape. */
static void make_line(char *buf, enum line_shape shape, size_t len)
{
	static const char *const heads[] = { "listen=", "listen = xyz #", "", "; ",
					     "[kvpoold]\t#" };
	size_t n = strlen(heads[shape]);

	assert_true(len >= n + 12);
	memcpy(buf, heads[shape], n);
	memset(buf + n, shape == LINE_VALUE ? 'x' : shape == LINE_INDENTED ? ' ' : 'c', len - n);
	if (shape == LINE_INDENTED)
		memcpy(buf + len - 12, "listen = xyz", 12);
	buf[len] = '\0';
}

/* The listen a line of that shape and length sets; NULL if none. */
static const char *line_listen(enum line_shape shape, size_t len, char *buf)
{
	if (shape == LINE_VALUE) {
		memset(buf, 'x', len - 7);
		buf[len - 7] = '\0';
		return buf;
	}
	return shape == LINE_COMMENTED || shape == LINE_INDENTED ? "xyz" : NULL;
}

/* Write "port = 1", the line, then "max_lease_ms = 77" (before the line
 * when it has no line end). Returns the line's number. */
static int write_long_line(struct tmpfile *t, const char *line, const char *end)
{
	char *text = malloc(strlen(line) + 64);
	int lineno = 2;

	assert_non_null(text);
	if (end[0]) {
		sprintf(text, "port = 1\n%s%smax_lease_ms = 77\n", line, end);
	} else {
		sprintf(text, "port = 1\nmax_lease_ms = 77\n%s", line);
		lineno = 3;
	}
	tmp_write(t, text);
	free(text);
	return lineno;
}

/* libinih (Debian: INI_MAX_LINE 200) takes lines of up to 199 bytes
 * besides the line end: they are read whole, whatever their shape, and
 * the next line is a line of its own. Longer ones are refused with
 * file:line, not split. The longest listen a file can hold is 192 bytes;
 * the flag takes up to 255. */
static void test_file_long_lines(void **state)
{
	static const size_t ok_lens[] = { 150, 198, 199 };
	static const size_t bad_lens[] = { 200, 201, 255, 5000 };
	static const char *const ends[] = { "\n", "\r\n", "" };
	static char line[5100], listen[300], flag[320];
	struct tmpfile t;
	struct conf c;
	char err[512], where[128];
	const char *want;
	int lineno, help;

	(void)state;
	for (int shape = 0; shape < N_SHAPES; shape++) {
		for (size_t i = 0; i < sizeof(ok_lens) / sizeof(ok_lens[0]); i++) {
			for (size_t e = 0; e < 3; e++) {
				make_line(line, shape, ok_lens[i]);
				write_long_line(&t, line, ends[e]);
				conf_defaults(&c);
				if (conf_load_file(&c, t.path, err, sizeof(err)) != 0)
					fail_msg("shape %d, %zu bytes, end %zu: %s", shape, ok_lens[i],
						 e, err);
				want = line_listen(shape, ok_lens[i], listen);
				assert_string_equal(c.listen, want ? want : "127.0.0.1");
				assert_int_equal(c.port, 1);
				assert_int_equal(c.max_lease_ms, 77);
				tmp_remove(&t);
			}
		}
		for (size_t i = 0; i < sizeof(bad_lens) / sizeof(bad_lens[0]); i++) {
			for (size_t e = 0; e < 3; e++) {
				make_line(line, shape, bad_lens[i]);
				lineno = write_long_line(&t, line, ends[e]);
				conf_defaults(&c);
				assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)),
						 -EINVAL);
				snprintf(where, sizeof(where), "%s:%d: line longer than 199 bytes",
					 t.path, lineno);
				assert_contains(err, where);
				assert_string_equal(c.listen, "127.0.0.1");
				assert_int_equal(c.port, 7470);
				tmp_remove(&t);
			}
		}
	}
	/* LINE_VALUE at 199 bytes above: a 192-byte listen, the longest */
	make_line(line, LINE_VALUE, 199);
	write_long_line(&t, line, "\n");
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), 0);
	assert_int_equal(strlen(c.listen), 192);
	tmp_remove(&t);

	/* a listen too long for a file line goes by flag */
	memset(listen, 'y', 255);
	listen[255] = '\0';
	snprintf(flag, sizeof(flag), "--listen=%s", listen);
	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), flag, NULL), 0);
	assert_string_equal(c.listen, listen);
}

/* A NUL byte in a line is refused with file:line (inih would stop there). */
static void test_file_nul_byte(void **state)
{
	static const char text[] = "port = 1\nthreads = 2\0junk\nmax_lease_ms = 3\n";
	struct tmpfile t;
	struct conf c;
	char err[512], where[128];

	(void)state;
	tmp_write_bytes(&t, text, sizeof(text) - 1);
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, t.path, err, sizeof(err)), -EINVAL);
	snprintf(where, sizeof(where), "%s:2: NUL byte in line", t.path);
	assert_contains(err, where);
	assert_int_equal(c.port, 7470);
	tmp_remove(&t);
}

/* An endless line (/dev/zero: NUL bytes, no newline) fails at the line
 * limit at once, rather than reading on for the end of the line. */
static void test_file_endless_line(void **state)
{
	struct timespec t0, t1;
	struct conf c;
	char err[512];
	long ms;

	(void)state;
	conf_defaults(&c);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(conf_load_file(&c, "/dev/zero", err, sizeof(err)), -EINVAL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	assert_true(ms < 1000);
	assert_contains(err, "/dev/zero:1: line longer than 199 bytes");
	assert_int_equal(c.port, 7470);
}

struct file_case {
	const char *text;
	int err;
	int line;
	const char *reason;
};

static void test_file_errors(void **state)
{
	static char long_line[400], long_listen[400];
	const struct file_case cases[] = {
		{ "port = 1\nthreads = 2\nbogus = 3\n", -ENOENT, 3, "unknown key 'bogus'" },
		{ "threads = 1\n\n\n\nport = 70000\n", -ERANGE, 5, "port: out of range" },
		{ "dram_capacity = -1\n", -EINVAL, 1, "dram_capacity: negative" },
		{ "dram_capacity = 4XB\n", -EINVAL, 1, "unknown unit" },
		{ "dram_capacity = 99999999999999999999999\n", -ERANGE, 1, "64 bits" },
		/* a comment character with no blank before it is part of the value */
		{ "dram_capacity = 4GiB# comment\n", -EINVAL, 1, "trailing" },
		{ "dram_capacity = 4GiB; comment\n", -EINVAL, 1, "trailing" },
		{ "port = 7470;x\n", -EINVAL, 1, "port: not a whole number" },
		/* each key once per file, naming the earlier line */
		{ "port = 1\nthreads = 2\n[kvpoold]\nport = 2\n", -EINVAL, 4,
		  "port: already set on line 1" },
		{ "# c\nlog_level = info\nlog_level = info\n", -EINVAL, 3,
		  "log_level: already set on line 2" },
		{ "[kvpoold] junk\n", -EINVAL, 1, "syntax error" },
		{ "= 5\n", -EINVAL, 1, "syntax error" },
		{ "  : 5\n", -EINVAL, 1, "syntax error" },
		{ "port = 1\nthreads\n", -EINVAL, 2, "syntax error" },
		{ "[kvpoold\nport = 1\n", -EINVAL, 1, "syntax error" },
		{ "[other]\nport = 1\n", -ENOENT, 2, "unknown section [other]" },
		{ "log_level = loud\n", -EINVAL, 1, "log_level: unknown log level" },
		{ "port =\n", -EINVAL, 1, "port: empty" },
		{ long_line, -EINVAL, 2, "line longer than 199 bytes" },
		/* a listen too long for a file line: refused as a line */
		{ long_listen, -EINVAL, 1, "line longer than 199 bytes" },
		/* the first bad line wins, whatever the kind of error */
		{ "port = 1\nnonsense\nport = 0\n", -EINVAL, 2, "syntax error" },
		{ "port = 0\nnonsense\n", -ERANGE, 1, "out of range" },
		{ "a = 1\nb = 2\n", -ENOENT, 1, "unknown key 'a'" },
	};

	(void)state;
	/* line 2 is 200 bytes: one too many for libinih */
	memset(long_line, 0, sizeof(long_line));
	strcpy(long_line, "port = 1\nlisten = x #");
	memset(long_line + strlen(long_line), 'c', 200 - strlen("listen = x #"));
	strcat(long_line, "\nport = 2\n");
	/* a 309-byte line: "listen = " and 300 bytes */
	memset(long_listen, 0, sizeof(long_listen));
	strcpy(long_listen, "listen = ");
	memset(long_listen + strlen(long_listen), 'x', 300);
	strcat(long_listen, "\n");

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct tmpfile t;
		struct conf c, before;
		char err[512], where[128];
		int rc;

		tmp_write(&t, cases[i].text);
		conf_defaults(&c);
		before = c;
		err[0] = '\0';
		rc = conf_load_file(&c, t.path, err, sizeof(err));
		if (rc != cases[i].err)
			fail_msg("case %zu: rc %d, want %d (%s)", i, rc, cases[i].err, err);
		snprintf(where, sizeof(where), "%s:%d: ", t.path, cases[i].line);
		assert_contains(err, where);
		assert_contains(err, cases[i].reason);
		/* nothing applied from a file with an error */
		assert_memory_equal(&c, &before, sizeof(c));
		tmp_remove(&t);
	}
}

static void test_file_missing(void **state)
{
	struct conf c;
	char err[512];

	(void)state;
	conf_defaults(&c);
	assert_int_equal(conf_load_file(&c, "/nonexistent/kvpool.conf", err, sizeof(err)), -ENOENT);
	assert_contains(err, "/nonexistent/kvpool.conf");
	assert_contains(err, "cannot open");
	assert_int_equal(conf_load_file(&c, NULL, err, sizeof(err)), -EINVAL);
	assert_int_equal(conf_load_file(&c, "/", err, sizeof(err)) < 0, 1); /* a directory */
}

/* ---- command line ------------------------------------------------------- */

static void test_args_forms(void **state)
{
	struct conf c;
	char err[512];
	int help = 5;

	(void)state;
	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--dram-capacity", "4GiB",
				  "--max-block-bytes=1MiB", "--log-level=debug", "--port", "1234",
				  "--listen=::", "--max-inflight-put-bytes", "2 GiB", NULL), 0);
	assert_int_equal(help, 0);
	assert_true(c.dram_capacity_bytes == 4 * GIB);
	assert_true(c.max_block_bytes == MIB);
	assert_int_equal(c.log_level, CONF_LOG_DEBUG);
	assert_int_equal(c.port, 1234);
	assert_string_equal(c.listen, "::");
	assert_true(c.max_inflight_put_bytes == 2 * GIB);

	/* no arguments: nothing changes */
	struct conf d = c;
	assert_int_equal(run_args(&c, &help, err, sizeof(err), NULL), 0);
	assert_memory_equal(&c, &d, sizeof(c));

	/* a later flag wins over an earlier one */
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--port", "1", "--port=2", NULL), 0);
	assert_int_equal(c.port, 2);
}

struct args_case {
	const char *argv[4];
	int err;
	const char *reason[3];
};

static void test_args_errors(void **state)
{
	const struct args_case cases[] = {
		{ { "--bogus", "1" }, -ENOENT, { "unknown flag --bogus " } },
		{ { "--bogus=1" }, -ENOENT, { "unknown flag --bogus " } },
		/* last, with no value after it: still unknown, not "missing value" */
		{ { "--bogus" }, -ENOENT, { "unknown flag --bogus " } },
		{ { "--port", "1", "--bogus" }, -ENOENT, { "unknown flag --bogus " } },
		{ { "--bogus", "--port", "1" }, -ENOENT, { "unknown flag --bogus " } },
		{ { "--config", "/nonexistent/x.conf", "--bogus" }, -ENOENT,
		  { "unknown flag --bogus " } }, /* before any file is read */
		{ { "--help=1" }, -EINVAL, { "--help takes no value" } },
		{ { "--help=" }, -EINVAL, { "--help takes no value" } },
		{ { "--dram_capacity", "1GiB" }, -ENOENT, { "unknown flag --dram_capacity" } },
		{ { "--port" }, -EINVAL, { "--port", "missing value" } },
		{ { "--port", "--threads", "2" }, -EINVAL, { "--port", "missing value" } },
		{ { "--config" }, -EINVAL, { "--config", "missing value" } },
		{ { "stray" }, -EINVAL, { "unexpected argument 'stray'" } },
		{ { "-p", "1" }, -EINVAL, { "unexpected argument '-p'" } },
		{ { "---port", "1" }, -EINVAL, { "unexpected argument" } },
		{ { "--" }, -EINVAL, { "unexpected argument '--'" } },
		{ { "--port", "1", "extra" }, -EINVAL, { "unexpected argument 'extra'" } },
		{ { "--port", "abc" }, -EINVAL, { "--port: ", "port: ", "not a whole number" } },
		{ { "--port=70000" }, -ERANGE, { "--port: ", "port: out of range" } },
		{ { "--dram-capacity", "4XB" }, -EINVAL, { "--dram-capacity: ", "dram_capacity",
							   "unknown unit" } },
		{ { "--dram-capacity=-1" }, -EINVAL, { "--dram-capacity", "negative" } },
		{ { "--threads", "300" }, -ERANGE, { "--threads", "out of range 0..256 (0 = one per core)" } },
		{ { "--listen=" }, -ERANGE, { "--listen", "length 0" } },
		{ { "--log-level", "chatty" }, -EINVAL, { "--log-level", "unknown log level" } },
		{ { "--config", "/nonexistent/x.conf" }, -ENOENT, { "/nonexistent/x.conf", "cannot open" } },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[5] = { "kvpoold" };
		int argc = 1, help = 9, rc;
		struct conf c, before;
		char err[512] = "";

		for (int k = 0; k < 4 && cases[i].argv[k]; k++)
			argv[argc++] = (char *)cases[i].argv[k];
		conf_defaults(&c);
		before = c;
		rc = conf_from_args(&c, argc, argv, &help, err, sizeof(err));
		if (rc != cases[i].err)
			fail_msg("case %zu (%s): rc %d, want %d (%s)", i, argv[1], rc, cases[i].err, err);
		for (int k = 0; k < 3 && cases[i].reason[k]; k++)
			assert_contains(err, cases[i].reason[k]);
		assert_memory_equal(&c, &before, sizeof(c)); /* nothing applied */
		assert_int_equal(help, 9);                    /* not written on error */
	}
}

static void test_args_help(void **state)
{
	struct conf c, before;
	char err[512];
	int help = 0;

	(void)state;
	conf_defaults(&c);
	before = c;
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--help", NULL), 0);
	assert_int_equal(help, 1);
	/* --help wins over bad settings around it, and applies nothing */
	help = 0;
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--port", "5", "--threads", "abc",
				  "--help", NULL), 0);
	assert_int_equal(help, 1);
	assert_memory_equal(&c, &before, sizeof(c));
	/* ... and over unknown flags and missing values */
	help = 0;
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--bogus", "--help", "--port",
				  NULL), 0);
	assert_int_equal(help, 1);
	assert_memory_equal(&c, &before, sizeof(c));
}

/* flag > file > default, whatever the order on the command line. */
static void test_precedence(void **state)
{
	struct tmpfile t1, t2;
	struct conf c;
	char err[512];
	int help;

	(void)state;
	tmp_write(&t1, "port = 8000\nthreads = 3\ndram_capacity = 2GiB\nlog_level = warn\n");
	tmp_write(&t2, "[kvpoold]\nthreads = 4\n");

	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--port", "9000", "--config",
				  t1.path, NULL), 0);
	assert_int_equal(c.port, 9000);                  /* flag over file */
	assert_int_equal(c.threads, 3);                  /* file over default */
	assert_true(c.dram_capacity_bytes == 2 * GIB);
	assert_int_equal(c.log_level, CONF_LOG_WARN);
	assert_int_equal(c.max_batch_blocks, 1024);      /* default */

	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--config=" , NULL), -ENOENT);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--config", t1.path,
				  "--log-level", "error", "--config", t2.path, NULL), 0);
	assert_int_equal(c.threads, 4);                  /* later file over earlier */
	assert_int_equal(c.port, 8000);
	assert_int_equal(c.log_level, CONF_LOG_ERROR);   /* flag over both */

	/* a bad file stops everything, with file:line */
	struct tmpfile bad;
	tmp_write(&bad, "port = 1\n\nmax_lease_ms = soon\n");
	conf_defaults(&c);
	assert_int_equal(run_args(&c, &help, err, sizeof(err), "--config", bad.path, "--port", "2",
				  NULL), -EINVAL);
	char where[128];
	snprintf(where, sizeof(where), "%s:3: max_lease_ms", bad.path);
	assert_contains(err, where);
	assert_int_equal(c.port, 7470);

	tmp_remove(&t1);
	tmp_remove(&t2);
	tmp_remove(&bad);
}

/* ---- booleans, environment, conf_load, reload, JSON ----------------------- */

static void test_bool(void **state)
{
	static const char *const yes[] = { "true", "TRUE", "yes", "On", "1" };
	static const char *const no[] = { "false", "False", "no", "OFF", "0" };
	static const char *const bad[] = { "", "2", "y", "truth", "-1", " true" };
	struct conf c;
	char err[256];

	(void)state;
	conf_defaults(&c);
	for (size_t i = 0; i < 5; i++) {
		c.allow_unauthenticated = 0;
		assert_int_equal(conf_set(&c, "allow_unauthenticated", yes[i], "t", err,
					  sizeof(err)), 0);
		assert_int_equal(c.allow_unauthenticated, 1);
		assert_int_equal(conf_set(&c, "allow_unauthenticated", no[i], "t", err,
					  sizeof(err)), 0);
		assert_int_equal(c.allow_unauthenticated, 0);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(conf_set(&c, "allow_unauthenticated", bad[i], "x.conf:4", err,
					  sizeof(err)), -EINVAL);
		assert_contains(err, "x.conf:4: allow_unauthenticated: not a boolean");
		assert_int_equal(c.allow_unauthenticated, 0);
	}
	/* a struct filled by hand with another value is refused */
	c.allow_unauthenticated = 2;
	assert_int_equal(conf_validate(&c, err, sizeof(err)), -EINVAL);
	assert_contains(err, "allow_unauthenticated");
}

static void test_env(void **state)
{
	char *env[] = {
		"PATH=/bin", "KVPOOL_PORT=7600", "KVPOOL_DRAM_CAPACITY=2GiB",
		"KVPOOL_NVME_DIR=/srv/kv pool", "KVPOOL_ALLOW_UNAUTHENTICATED=yes",
		"KVPOOL_CLI=/usr/bin/kvpool", "KVPOOL_PROT=7601", "KVPOOL_port=1",
		"KVPOOL_CONFIG=/nonexistent",
		"KVPOOL_=x", "KVPOOLD=/bin/kvpoold", "KVPOOL_TOKEN=secret", NULL,
	};
	char *bad_range[] = { "KVPOOL_PORT=7600", "KVPOOL_MAX_CONNECTIONS=0", NULL };
	char *bad_unit[] = { "KVPOOL_DRAM_CAPACITY=4 GiBs", NULL };
	char *bad_neg[] = { "KVPOOL_MAX_BLOCK_BYTES=-1", NULL };
	char *notes = NULL;
	size_t notes_len = 0;
	FILE *warn = open_memstream(&notes, &notes_len);
	struct conf c;
	char err[256];

	(void)state;
	assert_non_null(warn);
	conf_defaults(&c);
	assert_int_equal(conf_from_env(&c, env, warn, err, sizeof(err)), 0);
	assert_int_equal(fclose(warn), 0);
	assert_int_equal(c.port, 7600);
	assert_true(c.dram_capacity_bytes == 2 * GIB);
	assert_string_equal(c.nvme_dir, "/srv/kv pool");
	assert_int_equal(c.allow_unauthenticated, 1);
	/* not settings: reported (lower case included), never applied */
	assert_contains(notes, "ignoring environment variable KVPOOL_PROT: not a setting");
	assert_contains(notes, "ignoring environment variable KVPOOL_port:");
	assert_contains(notes, "ignoring environment variable KVPOOL_:");
	assert_null(strstr(notes, "KVPOOL_CONFIG"));
	assert_null(strstr(notes, "KVPOOL_TOKEN"));
	assert_null(strstr(notes, "KVPOOL_CLI")); /* names the CLI for scripts */
	assert_null(strstr(notes, "KVPOOLD"));
	assert_null(strstr(notes, "PATH"));
	free(notes);

	/* errors name the variable; nothing is applied */
	conf_defaults(&c);
	assert_int_equal(conf_from_env(&c, bad_range, NULL, err, sizeof(err)), -ERANGE);
	assert_contains(err, "env KVPOOL_MAX_CONNECTIONS: max_connections: out of range");
	assert_int_equal(c.port, 7470);
	assert_int_equal(conf_from_env(&c, bad_unit, NULL, err, sizeof(err)), -EINVAL);
	assert_contains(err, "env KVPOOL_DRAM_CAPACITY: dram_capacity: unknown unit 'GiBs'");
	assert_int_equal(conf_from_env(&c, bad_neg, NULL, err, sizeof(err)), -EINVAL);
	assert_contains(err, "env KVPOOL_MAX_BLOCK_BYTES: max_block_bytes: negative");
	assert_int_equal(conf_from_env(&c, NULL, NULL, err, sizeof(err)), 0);
}

/* conf_load: flag > env > file > default, KVPOOL_CONFIG, validation. */
static void test_load_precedence(void **state)
{
	struct tmpfile t, t2;
	char cfg[128];
	struct conf c;
	char err[512];
	int help = 7;

	(void)state;
	tmp_write(&t, "port = 8000\nthreads = 3\nidle_timeout_ms = 5\nlog_level = warn\n");
	tmp_write(&t2, "threads = 5\n");
	snprintf(cfg, sizeof(cfg), "KVPOOL_CONFIG=%s", t2.path);
	{
		char *argv[] = { "kvpoold", "--config", t.path, "--port", "9000", NULL };
		char *env[] = { "KVPOOL_PORT=8500", "KVPOOL_THREADS=2", cfg, NULL };

		memset(&c, 0, sizeof(c));
		assert_int_equal(conf_load(&c, 5, argv, env, NULL, &help, err, sizeof(err)), 0);
		assert_int_equal(help, 0);
		assert_int_equal(c.port, 9000);             /* flag over env and file */
		assert_int_equal(c.threads, 2);             /* env over file */
		assert_int_equal(c.idle_timeout_ms, 5);     /* file over default */
		assert_int_equal(c.log_level, CONF_LOG_WARN);
		assert_int_equal(c.max_batch_blocks, 1024); /* default */
	}
	{
		/* no --config: KVPOOL_CONFIG names the file */
		char *argv[] = { "kvpoold", NULL };
		char *env[] = { cfg, NULL };

		assert_int_equal(conf_load(&c, 1, argv, env, NULL, &help, err, sizeof(err)), 0);
		assert_int_equal(c.threads, 5);
		assert_int_equal(c.port, 7470);
	}
	{
		/* a bad variable stops the load and names its source */
		char *argv[] = { "kvpoold", "--port", "9000", NULL };
		char *env[] = { "KVPOOL_IDLE_TIMEOUT_MS=soon", NULL };

		c.port = 1;
		assert_int_equal(conf_load(&c, 3, argv, env, NULL, &help, err, sizeof(err)),
				 -EINVAL);
		assert_contains(err, "env KVPOOL_IDLE_TIMEOUT_MS: idle_timeout_ms: not a whole number");
		assert_int_equal(c.port, 1);
	}
	{
		/* and so does a cross-setting rule broken by the sum of sources */
		char *argv[] = { "kvpoold", "--max-block-bytes", "2GiB", NULL };
		char *env[] = { "KVPOOL_DRAM_CAPACITY=1GiB", NULL };

		assert_int_equal(conf_load(&c, 3, argv, env, NULL, &help, err, sizeof(err)),
				 -EINVAL);
		assert_contains(err, "max_block_bytes (2GiB) must not exceed dram_capacity (1GiB)");
	}
	{
		/* an nvme_capacity with nvme_dir left empty in the file is refused */
		struct tmpfile t3;
		char *argv[] = { "kvpoold", "--config", NULL, NULL };

		tmp_write(&t3, "nvme_dir =\nnvme_capacity = 1GiB\n");
		argv[2] = t3.path;
		c.port = 4;
		assert_int_equal(conf_load(&c, 3, argv, NULL, NULL, &help, err, sizeof(err)),
				 -EINVAL);
		assert_contains(err, "nvme_capacity (1GiB) needs nvme_dir");
		assert_int_equal(c.port, 4);
		tmp_remove(&t3);
	}
	{
		/* --help wins and applies nothing */
		char *argv[] = { "kvpoold", "--port", "1", "--help", NULL };

		c.port = 3;
		assert_int_equal(conf_load(&c, 4, argv, NULL, NULL, &help, err, sizeof(err)), 0);
		assert_int_equal(help, 1);
		assert_int_equal(c.port, 3);
	}
	{
		/* a missing KVPOOL_CONFIG file is an error with its name */
		char *argv[] = { "kvpoold", NULL };
		char *env[] = { "KVPOOL_CONFIG=/nonexistent/kvpool.conf", NULL };

		assert_int_equal(conf_load(&c, 1, argv, env, NULL, &help, err, sizeof(err)),
				 -ENOENT);
		assert_contains(err, "/nonexistent/kvpool.conf: cannot open");
	}
	tmp_remove(&t);
	tmp_remove(&t2);
}

struct change {
	char line[6][128];
	int n;
};

static void record_change(void *arg, const char *name, const char *old_value,
			  const char *new_value, int applied)
{
	struct change *ch = arg;

	assert_true(ch->n < 6);
	snprintf(ch->line[ch->n++], sizeof(ch->line[0]), "%s %s->%s %d", name, old_value,
		 new_value, applied);
}

static void test_reload(void **state)
{
	static const char *const reloadable[] = {
		"max_connections", "idle_timeout_ms", "payload_timeout_ms", "log_level",
		"tokens_file", "drain_timeout_ms", "max_match_wait_ms", "max_conn_match_waits",
		"tenant_max_match_waits", "max_match_wait_bytes", "tls_cert_file", "tls_key_file",
		"tls_client_ca_file",
	};
#define N_RELOADABLE (sizeof(reloadable) / sizeof(reloadable[0]))
	struct conf cur, next;
	struct change ch = { .n = 0 };
	char err[256];
	size_t n = 0;

	(void)state;
	for (size_t i = 0; i < N_KEYS; i++) {
		int r = conf_is_reloadable(keys[i]);

		assert_true(r == 0 || r == 1);
		n += (size_t)r;
	}
	assert_int_equal(n, N_RELOADABLE);
	for (size_t i = 0; i < N_RELOADABLE; i++)
		assert_int_equal(conf_is_reloadable(reloadable[i]), 1);
	assert_int_equal(conf_is_reloadable("port"), 0);
	assert_int_equal(conf_is_reloadable("bogus"), -ENOENT);
	assert_int_equal(conf_is_reloadable(NULL), -ENOENT);

	conf_defaults(&cur);
	next = cur;
	assert_int_equal(conf_reload(&cur, &next, record_change, &ch), 0);
	assert_int_equal(ch.n, 0);

	assert_int_equal(conf_set(&next, "port", "7600", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&next, "log_level", "debug", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&next, "idle_timeout_ms", "1000", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&next, "tokens_file", "/etc/kvpool/tokens", "t", err,
				  sizeof(err)), 0);
	assert_int_equal(conf_set(&next, "dram_capacity", "2GiB", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_reload(&cur, &next, record_change, &ch), 3);
	assert_int_equal(ch.n, 5);
	/* table order */
	assert_string_equal(ch.line[0], "port 7470->7600 0");
	assert_string_equal(ch.line[1], "dram_capacity 1GiB->2GiB 0");
	assert_string_equal(ch.line[2], "idle_timeout_ms 300000->1000 1");
	assert_string_equal(ch.line[3], "log_level info->debug 1");
	assert_string_equal(ch.line[4], "tokens_file ->/etc/kvpool/tokens 1");
	assert_int_equal(cur.port, 7470);
	assert_true(cur.dram_capacity_bytes == GIB);
	assert_int_equal(cur.idle_timeout_ms, 1000);
	assert_int_equal(cur.log_level, CONF_LOG_DEBUG);
	assert_string_equal(cur.tokens_file, "/etc/kvpool/tokens");
	/* a second reload finds only what needs a restart; fn may be NULL */
	assert_int_equal(conf_reload(&cur, &next, NULL, NULL), 0);
}

static void test_json(void **state)
{
	static const char json_head[] = "{\"listen\":\"127.0.0.1\",\"port\":7470,\"threads\":3,"
					"\"dram_capacity\":1073741824,";
	struct conf c;
	char err[256], small[16], *buf;
	size_t need;

	(void)state;
	conf_defaults(&c);
	assert_int_equal(conf_set(&c, "tokens_file", "/etc/a \"b\"\\c", "t", err, sizeof(err)), 0);
	assert_int_equal(conf_set(&c, "threads", "3", "t", err, sizeof(err)), 0);
	need = conf_json(&c, NULL, 0);
	assert_true(need > 100);
	buf = malloc(need + 1);
	assert_non_null(buf);
	assert_int_equal(conf_json(&c, buf, need + 1), need);
	assert_int_equal(strlen(buf), need);
	assert_true(strncmp(buf, json_head, strlen(json_head)) == 0);
	assert_contains(buf, "\"log_level\":\"info\"");
	assert_contains(buf, "\"nvme_dir\":\"\"");
	assert_contains(buf, "\"nvme_admission\":\"all\"");
	assert_contains(buf, "\"admin_port\":7471");
	assert_contains(buf, "\"tokens_file\":\"/etc/a \\\"b\\\"\\\\c\"");
	assert_contains(buf, "\"allow_unauthenticated\":false,\"tls_cert_file\":\"\",\"tls_key_file\":\"\","
			"\"tls_client_ca_file\":\"\",\"tls_only\":\"auto\",\"allow_plaintext_tokens\":false,"
			"\"tls_allow_rdma\":false,\"drain_timeout_ms\":10000,\"nvme_drain_ms\":10000,");
	assert_contains(buf, "\"kv_events_endpoint\":\"\",\"kv_events_replay_endpoint\":\"\",\"kv_events_topic\":\"kvpool\",\"kv_events_buffer\":1000,\"kv_events_queue\":65536,\"kv_events_block_size\":16,");
	assert_contains(buf, "\"cluster\":\"\",\"node_name\":\"\",\"advertise_address\":\"\","
			     "\"cluster_lease_s\":10}");
	for (size_t i = 0; i < N_KEYS; i++) {
		char key[64];

		snprintf(key, sizeof(key), "\"%s\":", keys[i]);
		assert_contains(buf, key);
	}
	/* cut short: NUL-terminated, same length returned */
	memset(small, 'x', sizeof(small));
	assert_int_equal(conf_json(&c, small, sizeof(small)), need);
	assert_string_equal(small, "{\"listen\":\"127.");
	free(buf);
}

/* ---- output and the shipped example ------------------------------------- */

static void test_usage_lists_every_setting(void **state)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	size_t defaults = 0, reloads = 0;

	(void)state;
	assert_non_null(f);
	conf_usage(f);
	assert_int_equal(fclose(f), 0);
	for (size_t i = 0; i < N_KEYS; i++) {
		char flag[64], env[64];

		snprintf(flag, sizeof(flag), "  --%s ", keys[i]);
		for (char *p = flag; *p; p++)
			if (*p == '_')
				*p = '-';
		assert_contains(buf, flag);
		/* the variable follows the metavar on the flag's line */
		snprintf(env, sizeof(env), ", KVPOOL_%s\n", keys[i]);
		for (char *p = env; *p; p++)
			if (*p >= 'a' && *p <= 'z')
				*p = (char)(*p - 'a' + 'A');
		assert_contains(buf, env);
	}
	for (const char *p = buf; (p = strstr(p, "(default ")) != NULL; p++)
		defaults++;
	assert_int_equal(defaults, N_KEYS);
	for (const char *p = buf; (p = strstr(p, "; SIGHUP reloads it)")) != NULL; p++)
		reloads++;
	assert_int_equal(reloads, 13); /* test_reload's list */
	assert_contains(buf, "--config FILE, KVPOOL_CONFIG\n");
	assert_contains(buf, "--help");
	assert_contains(buf, "(default 1GiB; 1MiB..4TiB)");
	assert_contains(buf, "(default 1MiB; 4KiB..1GiB)"); /* max_frame_bytes */
	/* threads: the table's 0, not this machine's core count */
	assert_contains(buf, "  --threads N, KVPOOL_THREADS\n      worker threads, each with its own "
			     "event loop (default 0 (one per online core); 0..256 threads)\n");
	assert_contains(buf, "(default 7470; 1..65535)");
	assert_contains(buf, "(default info; SIGHUP reloads it)");
	assert_contains(buf, "  --nvme-dir DIR, KVPOOL_NVME_DIR\n");
	assert_contains(buf, "unset = no NVMe tier (default unset)\n");
	assert_contains(buf, "required with nvme_dir (default 0; 0..1024TiB)\n");
	assert_contains(buf, "  --nvme-admission WHICH, KVPOOL_NVME_ADMISSION\n");
	assert_contains(buf, "(default all)\n");
	assert_contains(buf, "(default 0; 0..16GiB)\n"); /* nvme_segment_size */
	assert_contains(buf, "0 = 2 (default 0; 0..64 threads)\n"); /* nvme_io_threads */
	assert_contains(buf, "0 = off (default 7471; 0..65535)\n"); /* admin_port */
	/* rdma_port: a restart applies it (the listener registers the arena once) */
	assert_contains(buf, "  --rdma-port N, KVPOOL_RDMA_PORT\n");
	assert_contains(buf, "0 = TCP only (default 7472; 0..65535)\n");
	assert_contains(buf, "  --allow-unauthenticated BOOL, KVPOOL_ALLOW_UNAUTHENTICATED\n");
	assert_contains(buf, "(default false)\n");
	assert_contains(buf, "(default 10000; 0..3600000 ms; SIGHUP reloads it)\n");
	assert_contains(buf, "(default unset; SIGHUP reloads it)\n"); /* tokens_file */
	assert_contains(buf, "KiB");
	free(buf);
}

/* config/kvpool.conf lists every key, each at its default value. */
static void test_example_config(void **state)
{
	const char *data = getenv("KVPOOL_TEST_DATA");
	char path[4096];
	struct conf c, def;
	char err[512], *got, *want;
	FILE *f;
	char line[512];
	size_t seen = 0;

	(void)state;
	if (data)
		snprintf(path, sizeof(path), "%s/../../config/kvpool.conf", data);
	else
		snprintf(path, sizeof(path), "config/kvpool.conf");

	/* start far from the defaults, so every key must be in the file */
	conf_defaults(&c);
	assert_int_equal(conf_set(&c, "listen", "10.1.2.3", "t", err, sizeof(err)), 0);
	c.port = 1;
	c.threads = 255;
	c.dram_capacity_bytes = 3 * MIB;
	c.max_block_bytes = 7;
	c.max_batch_blocks = 9;
	c.max_frame_bytes = 5000;
	c.max_lease_ms = 11;
	c.max_connections = 13;
	c.idle_timeout_ms = 17;
	c.payload_timeout_ms = 19;
	c.max_inflight_put_bytes = 23;
	c.log_level = CONF_LOG_ERROR;
	strcpy(c.nvme_dir, "/elsewhere");
	c.nvme_capacity_bytes = 29;
	c.nvme_admission = CONF_ADMIT_REUSED;
	c.nvme_segment_bytes = 31;
	c.nvme_io_threads = 37;
	c.admin_port = 41;
	strcpy(c.tokens_file, "/etc/tokens");
	c.allow_unauthenticated = 1;
	c.drain_timeout_ms = 43;
	if (conf_load_file(&c, path, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	conf_defaults(&def);
	got = print_conf(&c);
	want = print_conf(&def);
	assert_string_equal(got, want);
	free(got);
	free(want);

	/* and each key appears exactly once */
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		for (size_t i = 0; i < N_KEYS; i++) {
			size_t n = strlen(keys[i]);

			if (strncmp(line, keys[i], n) == 0 && line[n] == ' ')
				seen++;
		}
	}
	fclose(f);
	assert_int_equal(seen, N_KEYS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_print_roundtrip),
		cmocka_unit_test(test_size_good),
		cmocka_unit_test(test_size_bad),
		cmocka_unit_test(test_set_rejections),
		cmocka_unit_test(test_set_accepts),
		cmocka_unit_test(test_validate),
		cmocka_unit_test(test_validate_rounding),
		cmocka_unit_test(test_kv_events_settings),
		cmocka_unit_test(test_validate_cluster),
		cmocka_unit_test(test_validate_nvme),
		cmocka_unit_test(test_nvme_file_and_flags),
		cmocka_unit_test(test_file_long_lines),
		cmocka_unit_test(test_file_nul_byte),
		cmocka_unit_test(test_file_endless_line),
		cmocka_unit_test(test_file_load),
		cmocka_unit_test(test_file_errors),
		cmocka_unit_test(test_file_missing),
		cmocka_unit_test(test_args_forms),
		cmocka_unit_test(test_args_errors),
		cmocka_unit_test(test_args_help),
		cmocka_unit_test(test_precedence),
		cmocka_unit_test(test_bool),
		cmocka_unit_test(test_env),
		cmocka_unit_test(test_load_precedence),
		cmocka_unit_test(test_reload),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_usage_lists_every_setting),
		cmocka_unit_test(test_example_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
