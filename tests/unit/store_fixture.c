/*
 * store_fixture.c - helpers the storage tests share (store_fixture.h).
 */
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "debug/store_debug.h"
#include "store_fixture.h"

void key_of(uint64_t id, uint8_t key[STORE_KEY_BYTES])
{
	for (int i = 0; i < 4; i++) {
		uint64_t w = mix64(id * 4 + (uint64_t)i + 1);

		memcpy(key + 8 * i, &w, 8);
	}
	key[0] |= 1;
}

uint64_t len_of(uint64_t id)
{
	return 5 * 1024 + mix64(id) % (15 * 1024) + 1;
}

void sleep_ms(unsigned int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) == -1)
		;
}

void assert_check(struct store *s)
{
	char why[256];

	if (store_check(s, why, sizeof(why)))
		fail_msg("store_check: %s", why);
}

struct store_stats stats_of(struct store *s)
{
	struct store_stats st;

	store_stats(s, &st);
	return st;
}

void store_fixture_open(const struct store_config *cfg, struct store **s, const char *ns_name,
			uint32_t *ns_id)
{
	char why[256] = "";
	int rc = store_open(cfg, s, why, sizeof(why));

	if (rc)
		fail_msg("store_open: %d %s", rc, why);
	assert_non_null(*s);
	if (ns_name)
		assert_int_equal(store_namespace_id(*s, ns_name, strlen(ns_name), ns_id), 0);
}

void store_fixture_close(struct store **s, uint32_t ns_id)
{
	if (ns_id)
		store_namespace_release(*s, ns_id);
	store_close(*s);
	*s = NULL;
}

void store_fixture_tmpdir(char *dir, size_t cap, const char *prefix)
{
	snprintf(dir, cap, "/tmp/%s-XXXXXX", prefix);
	assert_non_null(mkdtemp(dir));
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void store_fixture_rmdir(const char *dir)
{
	if (dir[0])
		nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
