/*
 * fuzz_config.c - fuzz target: kvpoold's configuration parsers in
 * config/: the size parser, conf_set, INI files and command lines.
 *
 * Every input is used four ways:
 *  1. as a size ("1.5GiB"): conf_parse_size of the text up to its first
 *     NUL; a size that parses prints back as plain bytes that parse to the
 *     same number;
 *  2. as an INI file, loaded with conf_load_file from a memory file; a
 *     file that loads prints (conf_print) as lines that conf_set takes back
 *     to the very same settings, and conf_validate, when it accepts them,
 *     leaves settings that obey its cross-setting rules;
 *  3. as one setting: the first line is the key, the rest the value;
 *  4. as a command line, one argument per line (--config flags are
 *     skipped: they would read files named by the input).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "conf.h"
#include "fuzz.h"

#define MAX_ARGS 32
#define PAGE_BYTES 4096ull

/* The defaults, computed once: conf_defaults asks the system for its
 * core count, which costs a file read. */
static const struct conf *defaults(void)
{
	static struct conf def;
	static int done;

	if (!done) {
		conf_defaults(&def);
		done = 1;
	}
	return &def;
}

/* A NUL-terminated copy of data[0..size) (free()). */
static char *text_copy(const uint8_t *data, size_t size)
{
	char *t = malloc(size + 1);

	FUZZ_CHECK(t);
	memcpy(t, data, size);
	t[size] = '\0';
	return t;
}

static int conf_equal(const struct conf *a, const struct conf *b)
{
	return strcmp(a->listen, b->listen) == 0 && a->port == b->port &&
	       a->threads == b->threads && a->dram_capacity_bytes == b->dram_capacity_bytes &&
	       a->max_block_bytes == b->max_block_bytes &&
	       a->max_batch_blocks == b->max_batch_blocks &&
	       a->max_frame_bytes == b->max_frame_bytes && a->max_lease_ms == b->max_lease_ms &&
	       a->max_connections == b->max_connections &&
	       a->idle_timeout_ms == b->idle_timeout_ms &&
	       a->payload_timeout_ms == b->payload_timeout_ms &&
	       a->max_inflight_put_bytes == b->max_inflight_put_bytes &&
	       a->log_level == b->log_level;
}

/* 1. sizes */
static void check_size(const char *text)
{
	char again[32];
	uint64_t v, w;

	if (conf_parse_size(text, &v))
		return;
	snprintf(again, sizeof(again), "%" PRIu64, v);
	FUZZ_CHECK(conf_parse_size(again, &w) == 0 && w == v);
	snprintf(again, sizeof(again), " %" PRIu64 " b ", v);
	FUZZ_CHECK(conf_parse_size(again, &w) == 0 && w == v);
}

/* conf_print's lines, fed back through conf_set, give the same settings. */
static void check_print_round_trip(const struct conf *c)
{
	struct conf back = *defaults();
	char *text = NULL, *save = NULL, err[512];
	size_t len = 0;
	FILE *out = open_memstream(&text, &len);

	FUZZ_CHECK(out);
	conf_print(c, out);
	FUZZ_CHECK(fclose(out) == 0);
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *sp = strchr(line, ' ');

		FUZZ_CHECK(sp);
		*sp = '\0';
		if (conf_set(&back, line, sp + 1, "print", err, sizeof(err))) {
			fprintf(stderr, "conf_print line not taken back: %s\n", err);
			FUZZ_CHECK(0);
		}
	}
	free(text);
	FUZZ_CHECK(conf_equal(&back, c));
}

/* conf_validate either refuses or leaves settings that obey its rules. */
static void check_validate(const struct conf *c)
{
	struct conf v = *c;
	char err[512];

	if (conf_validate(&v, err, sizeof(err))) {
		FUZZ_CHECK(err[0] != '\0');
		FUZZ_CHECK(conf_equal(&v, c));
		return;
	}
	FUZZ_CHECK(v.dram_capacity_bytes % PAGE_BYTES == 0);
	FUZZ_CHECK(v.dram_capacity_bytes <= c->dram_capacity_bytes);
	FUZZ_CHECK((v.max_block_bytes + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES <=
		   v.dram_capacity_bytes);
	FUZZ_CHECK(v.max_inflight_put_bytes >= v.max_block_bytes);
	FUZZ_CHECK(v.max_frame_bytes >= 32 + 8 + 88ull * v.max_batch_blocks);
}

/* 2. INI files, through a memory file the loader opens by path. */
static void check_file(const uint8_t *data, size_t size)
{
	static int fd = -1;
	static char path[64];
	struct conf c = *defaults(), before;
	char err[512] = "";
	int rc;

	if (fd < 0) {
		fd = memfd_create("fuzz-config", MFD_CLOEXEC);
		FUZZ_CHECK(fd >= 0);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	FUZZ_CHECK(ftruncate(fd, 0) == 0);
	FUZZ_CHECK(pwrite(fd, data, size, 0) == (ssize_t)size);
	before = c;
	rc = conf_load_file(&c, path, err, sizeof(err));
	if (rc) {
		FUZZ_CHECK(rc == -EINVAL || rc == -ERANGE || rc == -ENOENT);
		FUZZ_CHECK(err[0] != '\0');
		FUZZ_CHECK(conf_equal(&c, &before)); /* changed only on success */
		return;
	}
	check_print_round_trip(&c);
	check_validate(&c);
}

/* 3. one key and value */
static void check_set(char *text)
{
	struct conf c = *defaults(), before = c;
	char *nl = strchr(text, '\n'), err[512] = "";
	int rc;

	if (!nl)
		return;
	*nl = '\0';
	rc = conf_set(&c, text, nl + 1, "fuzz", err, sizeof(err));
	*nl = '\n';
	if (rc) {
		FUZZ_CHECK(rc == -EINVAL || rc == -ERANGE || rc == -ENOENT);
		FUZZ_CHECK(conf_equal(&c, &before));
		return;
	}
	check_print_round_trip(&c);
}

/* 4. a command line, one argument per line */
static void check_args(char *text)
{
	struct conf c = *defaults();
	char *argv[MAX_ARGS + 1], *save = NULL, err[512];
	int argc = 0, help = -1;

	argv[argc++] = "kvpoold";
	for (char *a = strtok_r(text, "\n", &save); a; a = strtok_r(NULL, "\n", &save)) {
		if (argc == MAX_ARGS || strncmp(a, "--config", 8) == 0)
			return;
		argv[argc++] = a;
	}
	argv[argc] = NULL;
	if (conf_from_args(&c, argc, argv, &help, err, sizeof(err)) == 0) {
		FUZZ_CHECK(help == 0 || help == 1);
		if (!help)
			check_validate(&c);
	} else {
		FUZZ_CHECK(help == -1);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = text_copy(data, size);

	check_size(text);
	check_file(data, size);
	check_set(text);
	check_args(text); /* last: it cuts text into arguments */
	free(text);
	return 0;
}
