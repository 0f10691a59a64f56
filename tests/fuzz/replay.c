/*
 * replay.c - run a fuzz target over its stored inputs as a cmocka test
 * group, without libFuzzer: one test per file of
 * $KVPOOL_FUZZ_DIR/corpus/<target>/ (the seed corpus, at least
 * FUZZ_MIN_SEEDS files) and of $KVPOOL_FUZZ_DIR/regress/<target>/ (inputs
 * that once crashed), where KVPOOL_FUZZ_DIR defaults to tests/fuzz.
 *
 * Built with the project's compiler and flags (and the sanitizers under
 * SAN=1), linked with one target; FUZZ_TARGET names it. A target that
 * crashes or fails one of its checks aborts the process, which the test
 * runner counts as a failure.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

#ifndef FUZZ_TARGET
#error "FUZZ_TARGET must name the target (frame, config, trace, auth)"
#endif

#define FUZZ_MIN_SEEDS 10
#define MAX_INPUTS 4096

/* One stored input: its path, which is also its test's name. */
struct input {
	char path[700];
};

static struct input inputs[MAX_INPUTS];
static size_t n_inputs, n_seeds;

/* Read a whole file into a buffer of exactly its size (NULL when empty). */
static uint8_t *read_file(const char *path, size_t *size)
{
	struct stat st;
	uint8_t *buf = NULL;
	FILE *f = fopen(path, "rb");

	assert_non_null(f);
	assert_int_equal(fstat(fileno(f), &st), 0);
	*size = (size_t)st.st_size;
	if (*size) {
		buf = malloc(*size);
		assert_non_null(buf);
		assert_int_equal(fread(buf, 1, *size, f), *size);
	}
	fclose(f);
	return buf;
}

/* One input through the target: it must return 0 (and not crash). */
static void test_input(void **state)
{
	const struct input *in = *state;
	size_t size = 0;
	uint8_t *data = read_file(in->path, &size);

	assert_int_equal(LLVMFuzzerTestOneInput(data, size), 0);
	free(data);
}

/* The seed corpus is there and big enough to start a fuzzer from. */
static void test_seed_count(void **state)
{
	(void)state;
	if (n_seeds < FUZZ_MIN_SEEDS)
		fail_msg("corpus/" FUZZ_TARGET " holds %zu inputs, want at least %d", n_seeds,
			 FUZZ_MIN_SEEDS);
}

static int by_path(const void *a, const void *b)
{
	return strcmp(((const struct input *)a)->path, ((const struct input *)b)->path);
}

/* Add every regular file of dir/sub/FUZZ_TARGET; returns how many. */
static size_t scan(const char *dir, const char *sub)
{
	char folder[400];
	struct dirent *de;
	size_t first = n_inputs;
	DIR *d;

	snprintf(folder, sizeof(folder), "%s/%s/%s", dir, sub, FUZZ_TARGET);
	d = opendir(folder);
	if (!d)
		return 0; /* a target may have no regression inputs yet */
	while ((de = readdir(d)) && n_inputs < MAX_INPUTS) {
		struct input *in = &inputs[n_inputs];
		struct stat st;

		if (de->d_name[0] == '.')
			continue;
		if (strlen(folder) + 1 + strlen(de->d_name) >= sizeof(in->path))
			continue;
		snprintf(in->path, sizeof(in->path), "%s/%s", folder, de->d_name);
		if (stat(in->path, &st) == 0 && S_ISREG(st.st_mode))
			n_inputs++;
	}
	closedir(d);
	qsort(inputs + first, n_inputs - first, sizeof(inputs[0]), by_path);
	return n_inputs - first;
}

int main(void)
{
	const char *dir = getenv("KVPOOL_FUZZ_DIR");
	struct CMUnitTest *tests;
	int rc;

	if (!dir || !*dir)
		dir = "tests/fuzz";
	n_seeds = scan(dir, "corpus");
	scan(dir, "regress");
	tests = calloc(n_inputs + 1, sizeof(*tests));
	if (!tests)
		return 1;
	tests[0] = (struct CMUnitTest){ .name = "seed_count", .test_func = test_seed_count };
	for (size_t i = 0; i < n_inputs; i++)
		tests[i + 1] = (struct CMUnitTest){ .name = inputs[i].path,
						    .test_func = test_input,
						    .initial_state = &inputs[i] };
	rc = _cmocka_run_group_tests("fuzz_" FUZZ_TARGET, tests, n_inputs + 1, NULL, NULL);
	free(tests);
	return rc;
}
