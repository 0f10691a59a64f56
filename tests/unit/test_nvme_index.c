/*
 * test_nvme_index.c - the NVMe tier's RocksDB index: record encoding round
 * trip, writes and deletes in one batch, scan order, namespaces and their
 * atomic drop, the next disk id across reopen, records that do not decode,
 * and open errors. Corrupt entries are planted with RocksDB's own C API.
 */
#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <rocksdb/c.h>

#include "nvme/nvme_index.h"

#define MAX_SEEN 64

struct fixture {
	char root[64];
	char path[128];  /* root/index */
	int errors;      /* ERR log lines */
	struct store_nvme_index *ix;
};

/* What a scan delivered. */
struct seen {
	struct store_nvme_rec rec[MAX_SEEN];
	size_t n;
	size_t stop_after; /* return 7 after this many (0 = never) */
};

struct seen_ns {
	uint32_t id[MAX_SEEN];
	char name[MAX_SEEN][STORE_NAME_MAX_BYTES + 1];
	size_t n;
};

static void capture_log(void *arg, enum store_log_level level, const char *msg)
{
	struct fixture *f = arg;

	(void)msg;
	if (level == STORE_LOG_ERR)
		f->errors++;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void reopen(struct fixture *f)
{
	char why[256] = "";
	int rc;

	store_nvme_index_close(f->ix);
	f->ix = NULL;
	rc = store_nvme_index_open(f->path, capture_log, f, &f->ix, why, sizeof(why));
	if (rc)
		fail_msg("open %s: %d %s", f->path, rc, why);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	snprintf(f->root, sizeof(f->root), "/tmp/kvpool-nvme-index-XXXXXX");
	if (!mkdtemp(f->root))
		return -1;
	snprintf(f->path, sizeof(f->path), "%s/index", f->root);
	if (store_nvme_index_open(f->path, capture_log, f, &f->ix, NULL, 0))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	store_nvme_index_close(f->ix);
	nftw(f->root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	return 0;
}

/* A record whose every field depends on (ns, k) and uses high bytes, so a
 * byte-order or offset mistake in the encoding shows. */
static struct store_nvme_rec make_rec(uint32_t ns, uint8_t k, int has_parent)
{
	struct store_nvme_rec r;

	memset(&r, 0, sizeof(r));
	r.ns_disk_id = ns;
	memset(r.key, k, sizeof(r.key));
	r.key[31] = (uint8_t)(k ^ 0x5a);
	r.has_parent = (uint8_t)has_parent;
	if (has_parent) {
		memset(r.parent, (uint8_t)(k + 1), sizeof(r.parent));
		r.parent[0] = 0xee;
	}
	r.segment = 0x01020300u + k;
	r.offset = 0x0000001234560000ull + (uint64_t)k * 4096;
	r.length = 0x00000000f0000001ull + k;
	r.checksum = 0xfedcba9876543210ull ^ ns ^ k;
	r.last_use = 0x8000000000000000ull | ((uint64_t)ns << 32) | k;
	return r;
}

static void assert_rec_equal(const struct store_nvme_rec *a, const struct store_nvme_rec *b)
{
	assert_int_equal(a->ns_disk_id, b->ns_disk_id);
	assert_memory_equal(a->key, b->key, STORE_KEY_BYTES);
	assert_int_equal(a->has_parent, b->has_parent);
	assert_memory_equal(a->parent, b->parent, STORE_KEY_BYTES);
	assert_int_equal(a->segment, b->segment);
	assert_int_equal(a->offset, b->offset);
	assert_int_equal(a->length, b->length);
	assert_int_equal(a->checksum, b->checksum);
	assert_int_equal(a->last_use, b->last_use);
	assert_int_equal(a->retain_until_ms, b->retain_until_ms);
	assert_int_equal(a->tenant_key, b->tenant_key);
}

static int collect(void *arg, const struct store_nvme_rec *rec)
{
	struct seen *s = arg;

	if (s->n >= MAX_SEEN)
		return -E2BIG;
	s->rec[s->n++] = *rec;
	if (s->stop_after && s->n == s->stop_after)
		return 7;
	return 0;
}

static int collect_ns(void *arg, uint32_t id, const char *name, size_t len)
{
	struct seen_ns *s = arg;

	if (s->n >= MAX_SEEN)
		return -E2BIG;
	s->id[s->n] = id;
	memcpy(s->name[s->n], name, len);
	s->name[s->n][len] = 0;
	s->n++;
	return 0;
}

static void scan(struct fixture *f, struct seen *s, uint64_t expect_bad)
{
	uint64_t bad = 999;

	memset(s, 0, sizeof(*s));
	assert_int_equal(store_nvme_index_scan(f->ix, collect, s, &bad), 0);
	assert_int_equal(bad, expect_bad);
}

static void put_recs(struct fixture *f, const struct store_nvme_rec *recs, size_t n)
{
	assert_int_equal(store_nvme_index_write(f->ix, recs, n, NULL, NULL, 0), 0);
}

/* ---- tests --------------------------------------------------------------- */

static void test_empty(void **state)
{
	struct fixture *f = *state;
	struct seen s;
	struct seen_ns ns = { .n = 0 };
	uint32_t next = 0;

	scan(f, &s, 0);
	assert_int_equal(s.n, 0);
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 0);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 1);
	store_nvme_index_close(NULL);
}

/* Records come back field for field, in (disk id, key) order whatever the
 * write order; ids compare as big-endian numbers. */
static void test_round_trip_and_order(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[5] = {
		make_rec(0x100, 9, 1), make_rec(2, 0x80, 0), make_rec(2, 3, 1),
		make_rec(0x100, 1, 0), make_rec(1, 0xff, 1),
	};
	const int order[5] = { 4, 2, 1, 3, 0 };
	struct seen s;
	int i;

	put_recs(f, recs, 2);
	put_recs(f, recs + 2, 3);
	scan(f, &s, 0);
	assert_int_equal(s.n, 5);
	for (i = 0; i < 5; i++)
		assert_rec_equal(&s.rec[i], &recs[order[i]]);
	/* a record without parent keeps zeros there */
	assert_int_equal(s.rec[2].has_parent, 0);
	assert_int_equal(s.rec[2].parent[0], 0);

	/* a non-zero return from fn stops the scan and is returned */
	memset(&s, 0, sizeof(s));
	s.stop_after = 2;
	assert_int_equal(store_nvme_index_scan(f->ix, collect, &s, NULL), 7);
	assert_int_equal(s.n, 2);
}

/* A demotion or reclaim writes new records and deletes old ones in one
 * call; a key both deleted and written keeps its new record. */
static void test_write_and_delete_in_one_batch(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec old[3] = { make_rec(1, 1, 0), make_rec(1, 2, 1), make_rec(1, 3, 1) };
	struct store_nvme_rec fresh[2] = { make_rec(1, 4, 1), make_rec(1, 3, 1) };
	uint32_t del_ns[3] = { 1, 1, 1 };
	uint8_t del_keys[3][STORE_KEY_BYTES];
	struct seen s;

	put_recs(f, old, 3);
	fresh[1].segment = 77; /* key 3 moves: rewritten by a reclaim */
	fresh[1].offset = 8192;
	memcpy(del_keys[0], old[0].key, STORE_KEY_BYTES);
	memcpy(del_keys[1], old[2].key, STORE_KEY_BYTES);
	memset(del_keys[2], 0x42, STORE_KEY_BYTES); /* absent: not an error */
	assert_int_equal(store_nvme_index_write(f->ix, fresh, 2, del_ns,
						(const uint8_t (*)[STORE_KEY_BYTES])del_keys, 3), 0);
	scan(f, &s, 0);
	assert_int_equal(s.n, 3);
	assert_rec_equal(&s.rec[0], &old[1]);
	assert_rec_equal(&s.rec[1], &fresh[1]);
	assert_rec_equal(&s.rec[2], &fresh[0]);

	/* a batch of deletions only */
	memcpy(del_keys[0], old[1].key, STORE_KEY_BYTES);
	assert_int_equal(store_nvme_index_write(f->ix, NULL, 0, del_ns,
						(const uint8_t (*)[STORE_KEY_BYTES])del_keys, 1), 0);
	scan(f, &s, 0);
	assert_int_equal(s.n, 2);

	/* one-record delete, absent or present */
	assert_int_equal(store_nvme_index_delete(f->ix, 1, fresh[0].key), 0);
	assert_int_equal(store_nvme_index_delete(f->ix, 1, fresh[0].key), 0);
	assert_int_equal(store_nvme_index_delete(f->ix, 9, fresh[1].key), 0); /* other ns */
	scan(f, &s, 0);
	assert_int_equal(s.n, 1);
	assert_rec_equal(&s.rec[0], &fresh[1]);
	assert_int_equal(f->errors, 0);
}

static void test_namespaces_and_drop(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[7] = {
		make_rec(1, 1, 0), make_rec(1, 2, 1), make_rec(2, 1, 0), make_rec(2, 2, 1),
		make_rec(2, 0xff, 1), make_rec(3, 0, 0), make_rec(UINT32_MAX, 5, 0),
	};
	struct seen_ns ns;
	struct seen s;
	uint32_t next = 0;
	size_t i;

	assert_int_equal(store_nvme_index_ns_put(f->ix, 3, "gamma", 5), 0);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, "alpha/model-a", 13), 0);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 2, "beta", 4), 0);
	put_recs(f, recs, 7);

	memset(&ns, 0, sizeof(ns));
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 3);
	assert_int_equal(ns.id[0], 1);
	assert_string_equal(ns.name[0], "alpha/model-a");
	assert_int_equal(ns.id[1], 2);
	assert_string_equal(ns.name[1], "beta");
	assert_int_equal(ns.id[2], 3);
	assert_string_equal(ns.name[2], "gamma");

	/* dropping 2 removes its name and exactly its records */
	assert_int_equal(store_nvme_index_ns_drop(f->ix, 2), 0);
	memset(&ns, 0, sizeof(ns));
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 2);
	assert_int_equal(ns.id[0], 1);
	assert_int_equal(ns.id[1], 3);
	scan(f, &s, 0);
	assert_int_equal(s.n, 4);
	assert_rec_equal(&s.rec[0], &recs[0]);
	assert_rec_equal(&s.rec[1], &recs[1]);
	assert_rec_equal(&s.rec[2], &recs[5]);
	assert_rec_equal(&s.rec[3], &recs[6]);

	/* the last possible id's range ends at the key class's end */
	assert_int_equal(store_nvme_index_ns_drop(f->ix, UINT32_MAX), 0);
	scan(f, &s, 0);
	assert_int_equal(s.n, 3);
	/* dropping an empty or unknown namespace is fine */
	assert_int_equal(store_nvme_index_ns_drop(f->ix, 77), 0);

	/* and it all holds after a reopen; ids are never handed out again */
	reopen(f);
	scan(f, &s, 0);
	assert_int_equal(s.n, 3);
	for (i = 0; i < s.n; i++)
		assert_int_not_equal(s.rec[i].ns_disk_id, 2);
	memset(&ns, 0, sizeof(ns));
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 2);
	/* the drop of 77 (an id the store may have handed out in memory
	 * without recording it yet) moved next_ns past it */
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 78);
}

static void test_ns_put_invalid(void **state)
{
	struct fixture *f = *state;
	char long_name[STORE_NAME_MAX_BYTES + 1];
	uint32_t next = 0;

	memset(long_name, 'x', sizeof(long_name));
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, "a", 0), -EINVAL);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, long_name, sizeof(long_name)), -EINVAL);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 0, "a", 1), -EINVAL);
	assert_int_equal(store_nvme_index_ns_put(f->ix, UINT32_MAX, "a", 1), -EINVAL);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, long_name, STORE_NAME_MAX_BYTES), 0);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 2);
}

static void test_next_ns_id_persists(void **state)
{
	struct fixture *f = *state;
	struct seen_ns ns;
	uint32_t next = 0;

	assert_int_equal(store_nvme_index_ns_put(f->ix, 5, "five", 4), 0);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 6);
	/* a lower id never moves it back */
	assert_int_equal(store_nvme_index_ns_put(f->ix, 3, "three", 5), 0);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 6);
	/* nor does dropping */
	assert_int_equal(store_nvme_index_ns_drop(f->ix, 5), 0);
	reopen(f);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), 0);
	assert_int_equal(next, 6);
	/* re-recording an id renames it */
	assert_int_equal(store_nvme_index_ns_put(f->ix, 3, "drei", 4), 0);
	memset(&ns, 0, sizeof(ns));
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 1);
	assert_string_equal(ns.name[0], "drei");
}

/* Write raw key/value pairs with RocksDB itself (the index closed). */
static void raw_put(struct fixture *f, const void *k, size_t klen, const void *v, size_t vlen)
{
	rocksdb_options_t *o = rocksdb_options_create();
	rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
	char *err = NULL;
	rocksdb_t *db;

	store_nvme_index_close(f->ix);
	f->ix = NULL;
	db = rocksdb_open(o, f->path, &err);
	assert_null(err);
	rocksdb_put(db, wo, k, klen, v, vlen, &err);
	assert_null(err);
	rocksdb_close(db);
	rocksdb_writeoptions_destroy(wo);
	rocksdb_options_destroy(o);
	reopen(f);
}

static void test_bad_records_counted(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[2] = { make_rec(4, 1, 1), make_rec(4, 9, 0) };
	uint8_t k[1 + 4 + STORE_KEY_BYTES] = { 'b', 0, 0, 0, 4 };
	uint8_t v[72] = { 0 };
	uint8_t short_key[10] = { 'b', 0, 0, 0, 4, 1 };
	struct seen s;

	put_recs(f, recs, 2);
	/* wrong value size */
	memset(k + 5, 5, STORE_KEY_BYTES);
	raw_put(f, k, sizeof(k), v, 10);
	/* right size, unknown value format byte */
	memset(k + 5, 6, STORE_KEY_BYTES);
	v[0] = 2;
	raw_put(f, k, sizeof(k), v, sizeof(v));
	/* right size and format, has_parent not 0 or 1 */
	memset(k + 5, 7, STORE_KEY_BYTES);
	v[0] = 1;
	v[1] = 3;
	raw_put(f, k, sizeof(k), v, sizeof(v));
	/* a 'b' key of the wrong length */
	v[1] = 0;
	raw_put(f, short_key, sizeof(short_key), v, sizeof(v));

	scan(f, &s, 4);
	assert_int_equal(s.n, 2);
	assert_rec_equal(&s.rec[0], &recs[0]);
	assert_rec_equal(&s.rec[1], &recs[1]);
	/* namespaces and meta keys are not block records */
	assert_int_equal(store_nvme_index_ns_put(f->ix, 4, "four", 4), 0);
	scan(f, &s, 4);
	assert_int_equal(s.n, 2);
}

/* The size of the value stored under a block's key, read with RocksDB
 * itself (the index closed meanwhile). */
static size_t raw_value_len(struct fixture *f, const struct store_nvme_rec *r)
{
	uint8_t k[1 + 4 + STORE_KEY_BYTES] = { 'b' };
	rocksdb_options_t *o = rocksdb_options_create();
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	char *err = NULL, *v;
	size_t len = 0;
	rocksdb_t *db;

	k[1] = (uint8_t)(r->ns_disk_id >> 24);
	k[2] = (uint8_t)(r->ns_disk_id >> 16);
	k[3] = (uint8_t)(r->ns_disk_id >> 8);
	k[4] = (uint8_t)r->ns_disk_id;
	memcpy(k + 5, r->key, STORE_KEY_BYTES);
	store_nvme_index_close(f->ix);
	f->ix = NULL;
	db = rocksdb_open(o, f->path, &err);
	assert_null(err);
	v = rocksdb_get(db, ro, (const char *)k, sizeof(k), &len, &err);
	assert_null(err);
	assert_non_null(v);
	rocksdb_free(v);
	rocksdb_close(db);
	rocksdb_readoptions_destroy(ro);
	rocksdb_options_destroy(o);
	reopen(f);
	return len;
}

/* Retention deadlines: a retained block's record is value format 2 (80
 * bytes: format 1's layout and the deadline); an unretained one stays
 * format 1 (72 bytes), byte for byte what older builds write and read;
 * a format-1 record written by an older build reads as unretained. */
static void test_retention_records(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[2] = { make_rec(2, 1, 1), make_rec(2, 2, 0) };
	uint8_t k[1 + 4 + STORE_KEY_BYTES] = { 'b', 0, 0, 0, 2 };
	uint8_t v[80] = { 1 };
	struct seen s;

	recs[1].retain_until_ms = 0x0000018f12345678ull;
	put_recs(f, recs, 2);
	assert_int_equal(raw_value_len(f, &recs[0]), 72);
	assert_int_equal(raw_value_len(f, &recs[1]), 80);
	scan(f, &s, 0);
	assert_int_equal(s.n, 2);
	assert_rec_equal(&s.rec[0], &recs[0]);
	assert_rec_equal(&s.rec[1], &recs[1]);
	/* an older build's record: format 1, 72 bytes */
	memset(k + 5, 9, STORE_KEY_BYTES);
	v[16] = 7; /* length 7 */
	raw_put(f, k, sizeof(k), v, 72);
	/* 80 bytes under format 1, and format 2 with 72 bytes, are not ours */
	memset(k + 5, 10, STORE_KEY_BYTES);
	raw_put(f, k, sizeof(k), v, 80);
	memset(k + 5, 11, STORE_KEY_BYTES);
	v[0] = 2;
	raw_put(f, k, sizeof(k), v, 72);
	scan(f, &s, 2);
	assert_int_equal(s.n, 3);
	assert_int_equal(s.rec[2].key[0], 9);
	assert_int_equal(s.rec[2].length, 7);
	assert_int_equal(s.rec[2].retain_until_ms, 0);
	/* rewritten without a deadline, a record goes back to format 1 */
	recs[1].retain_until_ms = 0;
	put_recs(f, &recs[1], 1);
	assert_int_equal(raw_value_len(f, &recs[1]), 72);
}

/* Billing across a restart: a block with a writer is value format 3 (88
 * bytes: format 2's layout, the deadline 0 when none, then the writer's
 * tenant key), one without stays format 1 or 2; a namespace's creator key
 * is recorded with its name, read back, and forgotten with the drop. */
static void test_tenant_records(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[3] = { make_rec(4, 1, 0), make_rec(4, 2, 1), make_rec(4, 3, 1) };
	uint64_t owner = 1;
	struct seen s;

	recs[1].tenant_key = 0x1122334455667788ull;
	recs[2].tenant_key = 0x99;
	recs[2].retain_until_ms = 0x0000018f12345678ull;
	put_recs(f, recs, 3);
	assert_int_equal(raw_value_len(f, &recs[0]), 72);
	assert_int_equal(raw_value_len(f, &recs[1]), 88);
	assert_int_equal(raw_value_len(f, &recs[2]), 88);
	scan(f, &s, 0);
	assert_int_equal(s.n, 3);
	for (int i = 0; i < 3; i++)
		assert_rec_equal(&s.rec[i], &recs[i]);
	/* creators: recorded with the name, absent reads as 0 */
	assert_int_equal(store_nvme_index_ns_put_owned(f->ix, 4, "shared/x", 8, 0xabcdefull), 0);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 5, "nobody", 6), 0);
	assert_int_equal(store_nvme_index_ns_owner(f->ix, 4, &owner), 0);
	assert_int_equal(owner, 0xabcdefull);
	assert_int_equal(store_nvme_index_ns_owner(f->ix, 5, &owner), 0);
	assert_int_equal(owner, 0);
	assert_int_equal(store_nvme_index_ns_drop(f->ix, 4), 0);
	assert_int_equal(store_nvme_index_ns_owner(f->ix, 4, &owner), 0);
	assert_int_equal(owner, 0);
}

static void test_corrupt_next_ns(void **state)
{
	struct fixture *f = *state;
	const char key[] = "mnext_ns";
	uint32_t next = 1234;

	raw_put(f, key, sizeof(key) - 1, "abc", 3);
	assert_int_equal(store_nvme_index_next_ns_id(f->ix, &next), -EIO);
	assert_int_equal(next, 1234);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, "one", 3), -EIO);
	assert_true(f->errors >= 2);
}

static void test_reopen_keeps_everything(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_rec recs[40];
	struct seen s;
	struct seen_ns ns;
	int i;

	for (i = 0; i < 40; i++)
		recs[i] = make_rec(1 + (uint32_t)i / 10, (uint8_t)(i * 3), i % 2);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 1, "n1", 2), 0);
	assert_int_equal(store_nvme_index_ns_put(f->ix, 4, "n4", 2), 0);
	for (i = 0; i < 40; i += 8)
		put_recs(f, recs + i, 8);
	reopen(f);
	reopen(f);
	scan(f, &s, 0);
	assert_int_equal(s.n, 40);
	for (i = 0; i < 40; i++)
		assert_rec_equal(&s.rec[i], &recs[i]); /* already in key order */
	memset(&ns, 0, sizeof(ns));
	assert_int_equal(store_nvme_index_ns_scan(f->ix, collect_ns, &ns), 0);
	assert_int_equal(ns.n, 2);
	assert_string_equal(ns.name[1], "n4");
}

static void test_open_errors(void **state)
{
	struct fixture *f = *state;
	struct store_nvme_index *other = (struct store_nvme_index *)0x1;
	char path[256], why[512] = "";
	FILE *fp;

	/* the same database twice: RocksDB's own lock refuses */
	assert_int_equal(store_nvme_index_open(f->path, capture_log, f, &other, why,
					       sizeof(why)), -EIO);
	assert_ptr_equal(other, (struct store_nvme_index *)0x1);
	assert_non_null(strstr(why, f->path));
	assert_int_equal(f->errors, 1);

	/* a regular file where the directory should be */
	snprintf(path, sizeof(path), "%s/file", f->root);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);
	why[0] = 0;
	assert_int_equal(store_nvme_index_open(path, NULL, NULL, &other, why, sizeof(why)), -EIO);
	assert_non_null(strstr(why, path));
	assert_ptr_equal(other, (struct store_nvme_index *)0x1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_empty, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_and_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_and_delete_in_one_batch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_namespaces_and_drop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ns_put_invalid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_next_ns_id_persists, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_records_counted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tenant_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retention_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_next_ns, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen_keeps_everything, setup, teardown),
		cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
