/*
 * test_store_faults.c - the error paths of storage/, driven by failing
 * the Nth call of what storage/ calls out to. The binary is linked with
 * -Wl,--wrap= for the allocators (malloc, calloc, realloc, posix_memalign,
 * mmap, strdup), pthread_create, the RocksDB C calls of nvme_index.c and
 * store_nvme_io_writev/read (Makefile, UNIT_LIBS_store_faults); each
 * __wrap_ below fails on demand once armed, and otherwise calls the real
 * function. Most tests sweep: fail call 1, then call 2, ... of an
 * operation until a run in which no injected failure fired, so every
 * failure point on the path is hit once. After each failure: the
 * documented error, store_check() passes, nothing is partially visible,
 * and (ASan build) LeakSanitizer finds no leak at exit.
 *
 * Ladders covered:
 *  test_open_dram        store_open out_free / out_close_arena /
 *                        out_destroy_index / out_free_heap;
 *                        store_arena_open out_free / out_unmap_base
 *  test_open_nvme_fresh  + store_open out_free_blocks; store_tier_open
 *                        out_free / out_unset / out_stop (pthread_create);
 *                        tier_new; open_files; store_nvme_io_open
 *                        (io_new, probe_page) out_close;
 *                        store_nvme_index_open out_free / out_nomem / the
 *                        rocksdb_open failure; rebuild's scans (iterator
 *                        creation, iterator errors)
 *  test_open_nvme_rebuild store_rebuild on a directory with blocks, a
 *                        dropped namespace and an orphan: grow() of both
 *                        scans, build() bad/blocks, check_places,
 *                        make_blocks_locked (heap, block_of) with
 *                        unbuild_locked, mark_reachable_locked,
 *                        delete_dropped (ns_drop and record deletes failing)
 *  test_namespace        store_namespace_id: ns_new, ns_append_locked's
 *                        table growth
 *  test_put              store_put_begin: the header, reserve_room_locked
 *                        (heap growth; index growth is best effort)
 *  test_lease            store_lessee_new; store_match's lease records
 *                        (store_lease_reserve_locked): nothing leased
 *  test_get_async        promo_join_locked (waiter, promotion record);
 *                        a failed promotion read (bad_copy_locked)
 *  test_demote_rocksdb   demote write_batch: the namespace record and the
 *                        block records' batch failing in RocksDB: blocks
 *                        stay dirty and readable, no record on disk
 *  test_demote_io        demote write_batch: the segment write failing;
 *                        demote_batch_locked's batch allocation failing
 *  test_drop_namespace   store_drop_namespace with the RocksDB range
 *                        delete failing: -EIO (not acknowledged), the
 *                        drop is retried and holds after a restart
 *  test_flush_dels       store_tier_persist_removals_locked: a DELETE
 *                        whose record deletes fail in RocksDB answers
 *                        -EIO; they are requeued and written later
 *  test_reclaim_bounce   reclaim_io's bounce buffer failing: the reclaim
 *                        backs off, blocks that must stay stay readable
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <xxhash.h>

#include <cmocka.h>
#include <rocksdb/c.h>

#include "nvme/nvme_index.h"
#include "nvme/nvme_io.h"
#include "store.h"
#include "debug/store_debug.h"
#include "store_fixture.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* ---- fault injection ---- */

enum fault_kind {
	F_MALLOC = 1u << 0,
	F_CALLOC = 1u << 1,
	F_REALLOC = 1u << 2,
	F_MEMALIGN = 1u << 3,
	F_MMAP = 1u << 4,
	F_STRDUP = 1u << 5,
	F_THREAD = 1u << 6,
	F_RDB_OPEN = 1u << 7,
	F_RDB_WRITE = 1u << 8,
	F_RDB_DELETE = 1u << 9,
	F_RDB_GET = 1u << 10,
	F_RDB_ITER = 1u << 11,
	F_RDB_ITER_ERR = 1u << 12,
	F_RDB_BATCH = 1u << 13,
	F_RDB_OPTS = 1u << 14,
	F_IO_WRITE = 1u << 15,
	F_IO_READ = 1u << 16,
};
#define F_ALLOC (F_MALLOC | F_CALLOC | F_REALLOC | F_MEMALIGN | F_MMAP | F_STRDUP)
#define F_ALL 0x1ffffu

/* Which threads an armed fault counts: the one that armed it, or the others
 * (the store's I/O threads). */
enum fault_who { FAULT_SELF, FAULT_OTHERS };

static struct {
	unsigned int mask;
	long nth, count;   /* calls nth .. nth + count - 1 fail */
	enum fault_who who;
	pthread_t owner;
	long calls, fired;
	int armed;
} fault;

/* Fail calls nth .. nth + count - 1 of the kinds in mask made by `who`. */
static void fault_arm(unsigned int mask, long nth, long count, enum fault_who who)
{
	__atomic_store_n(&fault.armed, 0, __ATOMIC_SEQ_CST);
	fault.mask = mask;
	fault.nth = nth;
	fault.count = count;
	fault.who = who;
	fault.owner = pthread_self();
	fault.calls = 0;
	fault.fired = 0;
	__atomic_store_n(&fault.armed, 1, __ATOMIC_SEQ_CST);
}

/* Stop failing; returns how many calls failed. */
static long fault_disarm(void)
{
	__atomic_store_n(&fault.armed, 0, __ATOMIC_SEQ_CST);
	return __atomic_load_n(&fault.fired, __ATOMIC_SEQ_CST);
}

static bool should_fail(unsigned int kind)
{
	long n;

	if (!__atomic_load_n(&fault.armed, __ATOMIC_SEQ_CST) || !(fault.mask & kind))
		return false;
	if ((fault.who == FAULT_SELF) != (pthread_equal(pthread_self(), fault.owner) != 0))
		return false;
	n = __atomic_add_fetch(&fault.calls, 1, __ATOMIC_SEQ_CST);
	if (n < fault.nth || n - fault.nth >= fault.count)
		return false;
	__atomic_add_fetch(&fault.fired, 1, __ATOMIC_SEQ_CST);
	return true;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
char *__real_strdup(const char *s);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg);

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n)
{
	return should_fail(F_MALLOC) ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
	return should_fail(F_CALLOC) ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n)
{
	return should_fail(F_REALLOC) ? NULL : __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
	return should_fail(F_MEMALIGN) ? ENOMEM : __real_posix_memalign(p, align, n);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (should_fail(F_MMAP)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return __real_mmap(addr, len, prot, flags, fd, off);
}

char *__wrap_strdup(const char *s);
char *__wrap_strdup(const char *s)
{
	return should_fail(F_STRDUP) ? NULL : __real_strdup(s);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg)
{
	return should_fail(F_THREAD) ? EAGAIN : __real_pthread_create(t, attr, fn, arg);
}

/* A RocksDB error string, freed by the caller with rocksdb_free (free). */
static char *rdb_err(void)
{
	return __real_strdup("injected failure");
}

rocksdb_t *__real_rocksdb_open(const rocksdb_options_t *o, const char *name, char **err);
rocksdb_t *__wrap_rocksdb_open(const rocksdb_options_t *o, const char *name, char **err);
rocksdb_t *__wrap_rocksdb_open(const rocksdb_options_t *o, const char *name, char **err)
{
	if (should_fail(F_RDB_OPEN)) {
		*err = rdb_err();
		return NULL;
	}
	return __real_rocksdb_open(o, name, err);
}

void __real_rocksdb_write(rocksdb_t *db, const rocksdb_writeoptions_t *o,
			  rocksdb_writebatch_t *wb, char **err);
void __wrap_rocksdb_write(rocksdb_t *db, const rocksdb_writeoptions_t *o,
			  rocksdb_writebatch_t *wb, char **err);
void __wrap_rocksdb_write(rocksdb_t *db, const rocksdb_writeoptions_t *o,
			  rocksdb_writebatch_t *wb, char **err)
{
	if (should_fail(F_RDB_WRITE)) {
		*err = rdb_err();
		return;
	}
	__real_rocksdb_write(db, o, wb, err);
}

void __real_rocksdb_delete(rocksdb_t *db, const rocksdb_writeoptions_t *o, const char *k,
			   size_t klen, char **err);
void __wrap_rocksdb_delete(rocksdb_t *db, const rocksdb_writeoptions_t *o, const char *k,
			   size_t klen, char **err);
void __wrap_rocksdb_delete(rocksdb_t *db, const rocksdb_writeoptions_t *o, const char *k,
			   size_t klen, char **err)
{
	if (should_fail(F_RDB_DELETE)) {
		*err = rdb_err();
		return;
	}
	__real_rocksdb_delete(db, o, k, klen, err);
}

char *__real_rocksdb_get(rocksdb_t *db, const rocksdb_readoptions_t *o, const char *k,
			 size_t klen, size_t *vlen, char **err);
char *__wrap_rocksdb_get(rocksdb_t *db, const rocksdb_readoptions_t *o, const char *k,
			 size_t klen, size_t *vlen, char **err);
char *__wrap_rocksdb_get(rocksdb_t *db, const rocksdb_readoptions_t *o, const char *k,
			 size_t klen, size_t *vlen, char **err)
{
	if (should_fail(F_RDB_GET)) {
		*err = rdb_err();
		return NULL;
	}
	return __real_rocksdb_get(db, o, k, klen, vlen, err);
}

rocksdb_iterator_t *__real_rocksdb_create_iterator(rocksdb_t *db, const rocksdb_readoptions_t *o);
rocksdb_iterator_t *__wrap_rocksdb_create_iterator(rocksdb_t *db, const rocksdb_readoptions_t *o);
rocksdb_iterator_t *__wrap_rocksdb_create_iterator(rocksdb_t *db, const rocksdb_readoptions_t *o)
{
	return should_fail(F_RDB_ITER) ? NULL : __real_rocksdb_create_iterator(db, o);
}

void __real_rocksdb_iter_get_error(const rocksdb_iterator_t *it, char **err);
void __wrap_rocksdb_iter_get_error(const rocksdb_iterator_t *it, char **err);
void __wrap_rocksdb_iter_get_error(const rocksdb_iterator_t *it, char **err)
{
	__real_rocksdb_iter_get_error(it, err);
	if (!*err && should_fail(F_RDB_ITER_ERR))
		*err = rdb_err();
}

rocksdb_writebatch_t *__real_rocksdb_writebatch_create(void);
rocksdb_writebatch_t *__wrap_rocksdb_writebatch_create(void);
rocksdb_writebatch_t *__wrap_rocksdb_writebatch_create(void)
{
	return should_fail(F_RDB_BATCH) ? NULL : __real_rocksdb_writebatch_create();
}

rocksdb_options_t *__real_rocksdb_options_create(void);
rocksdb_options_t *__wrap_rocksdb_options_create(void);
rocksdb_options_t *__wrap_rocksdb_options_create(void)
{
	return should_fail(F_RDB_OPTS) ? NULL : __real_rocksdb_options_create();
}

rocksdb_writeoptions_t *__real_rocksdb_writeoptions_create(void);
rocksdb_writeoptions_t *__wrap_rocksdb_writeoptions_create(void);
rocksdb_writeoptions_t *__wrap_rocksdb_writeoptions_create(void)
{
	return should_fail(F_RDB_OPTS) ? NULL : __real_rocksdb_writeoptions_create();
}

rocksdb_readoptions_t *__real_rocksdb_readoptions_create(void);
rocksdb_readoptions_t *__wrap_rocksdb_readoptions_create(void);
rocksdb_readoptions_t *__wrap_rocksdb_readoptions_create(void)
{
	return should_fail(F_RDB_OPTS) ? NULL : __real_rocksdb_readoptions_create();
}

int __real_store_nvme_io_writev(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
				const struct iovec *iov, int iovcnt);
int __wrap_store_nvme_io_writev(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
				const struct iovec *iov, int iovcnt);
int __wrap_store_nvme_io_writev(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
				const struct iovec *iov, int iovcnt)
{
	if (should_fail(F_IO_WRITE))
		return -EIO;
	return __real_store_nvme_io_writev(io, segment, offset, iov, iovcnt);
}

int __real_store_nvme_io_read(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
			      void *buf, uint64_t bytes);
int __wrap_store_nvme_io_read(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
			      void *buf, uint64_t bytes);
int __wrap_store_nvme_io_read(struct store_nvme_io *io, uint32_t segment, uint64_t offset,
			      void *buf, uint64_t bytes)
{
	if (should_fail(F_IO_READ))
		return -EIO;
	return __real_store_nvme_io_read(io, segment, offset, buf, bytes);
}

/* ---- helpers ---- */

/* Payload of block id, derived from it so a wrong block shows. */
static void fill_payload(void *dst, uint64_t len, uint64_t id)
{
	uint8_t *p = dst;

	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)mix64(id * 1000003u + i / 8) ^ (uint8_t)i;
}

static void quiet_log(void *arg, enum store_log_level level, const char *msg)
{
	(void)arg;
	if (getenv("FAULTS_LOG"))
		fprintf(stderr, "log %d: %s\n", level, msg);
}

/* A pool (NVMe tier in dir when dir != NULL) and its namespace "model". */
struct pool {
	char dir[64];
	struct store_config cfg;
	struct store *s;
	uint32_t ns;
};

static void config_of(struct store_config *cfg, const char *dir, uint64_t dram_bytes)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->dram_capacity_bytes = dram_bytes;
	cfg->max_block_bytes = 64 * KIB;
	cfg->max_lease_ms = 5000;
	cfg->log = quiet_log;
	if (dir) {
		cfg->nvme_dir = dir;
		cfg->nvme_capacity_bytes = 8 * MIB;
		cfg->nvme_segment_bytes = MIB;
		cfg->nvme_io_threads = 2;
	}
}

static void pool_open(struct pool *p)
{
	store_fixture_open(&p->cfg, &p->s, "model", &p->ns);
}

static void pool_close(struct pool *p)
{
	store_fixture_close(&p->s, p->ns);
}

static struct pool *pool_new(bool nvme, uint64_t dram_bytes)
{
	struct pool *p = calloc(1, sizeof(*p));

	assert_non_null(p);
	if (nvme)
		store_fixture_tmpdir(p->dir, sizeof(p->dir), "kvpool-faults");
	config_of(&p->cfg, nvme ? p->dir : NULL, dram_bytes);
	pool_open(p);
	return p;
}

static int teardown(void **state)
{
	struct pool *p = *state;

	fault_disarm();
	if (!p)
		return 0;
	if (p->s)
		pool_close(p);
	if (p->dir[0])
		store_fixture_rmdir(p->dir);
	free(p);
	*state = NULL;
	return 0;
}

/* Put block id below parent_id (0: none), retrying -EAGAIN. */
static int put_id(struct pool *p, uint64_t id, uint64_t parent_id)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES], buf[20 * KIB + 1];
	uint64_t len = len_of(id);
	struct store_block *b;
	void *dst;
	int rc;

	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	fill_payload(buf, len, id);
	for (int tries = 0;; tries++) {
		rc = store_put_begin(p->s, p->ns, key, parent_id ? parent : NULL, 0, len,
				     XXH3_64bits(buf, len), &b, &dst);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc == 0) {
		memcpy(dst, buf, len);
		rc = store_put_commit(p->s, b);
	}
	return rc;
}

/* The bytes of ref are block id's. */
static void assert_block(const struct store_ref *ref, uint64_t id)
{
	uint8_t want[20 * KIB + 1];

	assert_int_equal(ref->length, len_of(id));
	fill_payload(want, ref->length, id);
	assert_memory_equal(ref->data, want, ref->length);
}

/* Get block id byte-exact (retrying -EAGAIN); returns rc, *tier where from. */
static int get_id(struct pool *p, uint64_t id, uint8_t *tier)
{
	uint8_t key[STORE_KEY_BYTES];
	struct store_ref ref;
	int rc;

	key_of(id, key);
	for (int tries = 0;; tries++) {
		rc = store_get(p->s, p->ns, key, NULL, &ref);
		if (rc != -EAGAIN || tries > 5000)
			break;
		sleep_ms(1);
	}
	if (rc)
		return rc;
	assert_block(&ref, id);
	if (tier)
		*tier = ref.tier;
	store_release(p->s, ref.block);
	return 0;
}

static bool stored(struct pool *p, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	return store_exists(p->s, p->ns, key, NULL) == 0;
}

static void drop_dram(struct pool *p, uint64_t id)
{
	uint8_t key[STORE_KEY_BYTES];

	key_of(id, key);
	assert_int_equal(store_debug_drop_dram(p->s, p->ns, key), 0);
}

/* ---- store_open ---- */

/* Without an NVMe tier: every allocation of the open fails once. */
static void test_open_dram(void **state)
{
	struct store_config cfg;
	long n, failures = 0;

	(void)state;
	config_of(&cfg, NULL, 4 * MIB);
	for (n = 1;; n++) {
		struct store *s = (struct store *)0x1;
		int rc;

		fault_arm(F_ALLOC, n, 1, FAULT_SELF);
		rc = store_open(&cfg, &s, NULL, 0);
		if (!fault_disarm()) {
			assert_int_equal(rc, 0);
			assert_check(s);
			store_close(s);
			break;
		}
		if (rc == 0) {
			/* a best-effort allocation: the pool must still be sound */
			assert_check(s);
			store_close(s);
			continue;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_ptr_equal(s, (struct store *)0x1);
		failures++;
	}
	/* store, arena header, base map, meta map, index, heap */
	assert_true(failures >= 6);
}

/* After a failed open of dir, a clean open works (nothing left locked or
 * half-written) and holds exactly blocks `keep` (ids), byte-exact. */
static void assert_reopens(const char *dir, const uint64_t *keep, size_t nkeep,
			   const uint64_t *gone, size_t ngone)
{
	struct pool p = { 0 };

	snprintf(p.dir, sizeof(p.dir), "%s", dir);
	config_of(&p.cfg, p.dir, 2 * MIB);
	pool_open(&p);
	assert_check(p.s);
	for (size_t i = 0; i < nkeep; i++)
		assert_int_equal(get_id(&p, keep[i], NULL), 0);
	for (size_t i = 0; i < ngone; i++)
		assert_false(stored(&p, gone[i]));
	assert_int_equal(stats_of(p.s).blocks, nkeep);
	assert_check(p.s);
	pool_close(&p);
}

/* With an NVMe tier on a fresh directory: every allocation, RocksDB call
 * and thread creation of the open fails once (a fresh directory each
 * time, so the first-open path is the one swept). */
static void test_open_nvme_fresh(void **state)
{
	unsigned int seen = 0;
	long n;

	(void)state;
	for (n = 1;; n++) {
		struct store_config cfg;
		struct store *s = (struct store *)0x1;
		char dir[64], why[256] = "";
		int rc;

		store_fixture_tmpdir(dir, sizeof(dir), "kvpool-faults");
		config_of(&cfg, dir, 2 * MIB);
		fault_arm(F_ALL, n, 1, FAULT_SELF);
		rc = store_open(&cfg, &s, why, sizeof(why));
		if (!fault_disarm()) {
			assert_int_equal(rc, 0);
			assert_check(s);
			store_close(s);
			store_fixture_rmdir(dir);
			break;
		}
		if (rc == 0) {
			assert_check(s);
			store_close(s);
		} else {
			if (rc != -ENOMEM && rc != -EIO)
				fail_msg("call %ld: store_open %d (%s)", n, rc, why);
			assert_ptr_equal(s, (struct store *)0x1);
			seen |= rc == -ENOMEM ? 1u : 2u;
		}
		assert_reopens(dir, NULL, 0, NULL, 0);
		store_fixture_rmdir(dir);
	}
	assert_int_equal(seen, 3u);
	assert_true(n > 20);
}

/* A directory with chain 1 -> 2 -> 3, a sibling 4 of 2, record 2 deleted
 * (3 is an orphan), and a namespace "old" whose blocks are dropped in
 * memory but still listed on disk under an older id. */
static void make_rebuild_template(char *dir, size_t cap)
{
	struct pool p = { 0 };
	struct store_nvme_index *ix;
	uint8_t key[STORE_KEY_BYTES];
	char path[128];
	uint32_t other;

	store_fixture_tmpdir(dir, cap, "kvpool-faults");
	snprintf(p.dir, sizeof(p.dir), "%s", dir);
	config_of(&p.cfg, p.dir, 2 * MIB);
	pool_open(&p);
	assert_int_equal(put_id(&p, 1, 0), 0);
	assert_int_equal(put_id(&p, 2, 1), 0);
	assert_int_equal(put_id(&p, 3, 2), 0);
	assert_int_equal(put_id(&p, 4, 1), 0);
	assert_int_equal(store_namespace_id(p.s, "other", 5, &other), 0);
	assert_int_equal(store_debug_nvme_demote_all(p.s), 0);
	store_namespace_release(p.s, other);
	pool_close(&p);
	snprintf(path, sizeof(path), "%s/index", dir);
	assert_int_equal(store_nvme_index_open(path, NULL, NULL, &ix, NULL, 0), 0);
	key_of(2, key);
	assert_int_equal(store_nvme_index_delete(ix, 1, key), 0);
	/* a namespace with no block left and a record of an unknown one */
	assert_int_equal(store_nvme_index_ns_put(ix, 7, "empty", 5), 0);
	{
		struct store_nvme_rec r = { .ns_disk_id = 9, .segment = 0, .offset = 0,
					    .length = 4096 };

		key_of(99, r.key);
		assert_int_equal(store_nvme_index_write(ix, &r, 1, NULL, NULL, 0), 0);
	}
	store_nvme_index_close(ix);
}

/* Warm restart: every failure point of the rebuild, on a fresh copy of a
 * directory with blocks, an orphan, an empty namespace and a stray record. */
static void test_open_nvme_rebuild(void **state)
{
	static const uint64_t keep[] = { 1, 4 }, gone[] = { 2, 3 };
	char tmpl[64], cmd[256];
	long n, failures = 0;

	(void)state;
	make_rebuild_template(tmpl, sizeof(tmpl));
	for (n = 1;; n++) {
		struct store_config cfg;
		struct store *s = (struct store *)0x1;
		char dir[64], why[256] = "";
		int rc;

		store_fixture_tmpdir(dir, sizeof(dir), "kvpool-faults");
		snprintf(cmd, sizeof(cmd), "cp -a %s/. %s/", tmpl, dir);
		assert_int_equal(system(cmd), 0);
		config_of(&cfg, dir, 2 * MIB);
		fault_arm(F_ALL, n, 1, FAULT_SELF);
		rc = store_open(&cfg, &s, why, sizeof(why));
		if (!fault_disarm()) {
			assert_int_equal(rc, 0);
			assert_int_equal(stats_of(s).orphans_dropped, 1);
			assert_int_equal(stats_of(s).rebuild_blocks, 2);
			assert_check(s);
			store_close(s);
			store_fixture_rmdir(dir);
			break;
		}
		if (rc == 0) {
			assert_check(s);
			store_close(s);
		} else {
			if (rc != -ENOMEM && rc != -EIO)
				fail_msg("call %ld: store_open %d (%s)", n, rc, why);
			assert_ptr_equal(s, (struct store *)0x1);
			failures++;
		}
		if (getenv("FAULTS_LOG"))
			fprintf(stderr, "rebuild sweep: call %ld failed: %d %s\n", n, rc, why);
		assert_reopens(dir, keep, 2, gone, 2);
		store_fixture_rmdir(dir);
	}
	store_fixture_rmdir(tmpl);
	assert_true(failures > 20);
}

/* ---- namespaces, puts, leases ---- */

static void test_namespace(void **state)
{
	struct pool *p = pool_new(false, 4 * MIB);
	char name[16];
	uint32_t id;
	long n, failures = 0;

	*state = p;
	/* fill the table to its first capacity (8), so a new name grows it */
	for (int i = 1; i < 8; i++) {
		snprintf(name, sizeof(name), "ns-%d", i);
		assert_int_equal(store_namespace_id(p->s, name, strlen(name), &id), 0);
	}
	for (n = 1;; n++) {
		uint32_t before = stats_of(p->s).namespaces;
		int rc;

		fault_arm(F_ALLOC, n, 1, FAULT_SELF);
		rc = store_namespace_id(p->s, "fresh", 5, &id);
		if (!fault_disarm()) {
			assert_int_equal(rc, 0);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		failures++;
		assert_int_equal(store_namespace_find(p->s, "fresh", 5, &id), -ENOENT);
		assert_int_equal(stats_of(p->s).namespaces, before);
		assert_check(p->s);
	}
	assert_int_equal(failures, 2); /* the header, the table's growth */
	assert_int_equal(store_namespace_find(p->s, "fresh", 5, &id), 0);
	assert_check(p->s);
}

/* Every put's allocations fail once, across the heap's growth past 1024
 * headers: -ENOMEM, nothing reserved, nothing visible. */
static void test_put(void **state)
{
	struct pool *p = pool_new(false, 8 * MIB);
	long heap_failures = 0;

	*state = p;
	for (uint64_t id = 1; id <= 1100; id++) {
		uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES], buf[100];
		uint64_t parent_id = id % 8 == 1 ? 0 : id - 1;

		key_of(id, key);
		key_of(parent_id, parent);
		fill_payload(buf, sizeof(buf), id);
		/* the heap's growth alone first (a sweep's earlier failure
		 * point would let it grow) */
		{
			struct store_block *b = NULL;
			void *dst = NULL;
			int rc;

			fault_arm(F_REALLOC, 1, 1, FAULT_SELF);
			rc = store_put_begin(p->s, p->ns, key, parent_id ? parent : NULL, 0,
					     sizeof(buf), XXH3_64bits(buf, sizeof(buf)), &b, &dst);
			if (fault_disarm()) {
				assert_int_equal(rc, -ENOMEM);
				heap_failures++;
				assert_int_equal(store_exists(p->s, p->ns, key, NULL), -ENOENT);
				assert_int_equal(stats_of(p->s).inflight_put_bytes, 0);
				assert_check(p->s);
			} else {
				assert_int_equal(rc, 0);
				store_put_abort(p->s, b);
			}
		}
		for (long n = 1;; n++) {
			struct store_stats before = stats_of(p->s);
			struct store_block *b = NULL;
			void *dst = NULL;
			int rc;

			fault_arm(F_ALLOC, n, 1, FAULT_SELF);
			rc = store_put_begin(p->s, p->ns, key, parent_id ? parent : NULL, 0,
					     sizeof(buf), XXH3_64bits(buf, sizeof(buf)), &b, &dst);
			if (fault_disarm() && rc == 0) {
				/* a best-effort growth failed: sweep on past it */
				store_put_abort(p->s, b);
				continue;
			}
			if (rc == 0) {
				memcpy(dst, buf, sizeof(buf));
				assert_int_equal(store_put_commit(p->s, b), 0);
				break;
			}
			assert_int_equal(rc, -ENOMEM);
			assert_null(b);
			assert_int_equal(store_exists(p->s, p->ns, key, NULL), -ENOENT);
			assert_int_equal(stats_of(p->s).inflight_put_bytes, 0);
			assert_int_equal(stats_of(p->s).blocks, before.blocks);
			assert_int_equal(stats_of(p->s).free_bytes, before.free_bytes);
			if (id % 100 == 0)
				assert_check(p->s);
		}
	}
	assert_int_equal(heap_failures, 1);
	assert_int_equal(stats_of(p->s).blocks, 1100);
	assert_check(p->s);
}

static void test_lease(void **state)
{
	struct pool *p = pool_new(false, 4 * MIB);
	uint8_t keys[8][STORE_KEY_BYTES];
	struct store_lessee *l;
	struct store_ns_stats nss;
	uint32_t matched = 0, granted = 0;
	long n, failures = 0;

	*state = p;
	for (uint64_t id = 1; id <= 8; id++) {
		assert_int_equal(put_id(p, id, id - 1), 0);
		key_of(id, keys[id - 1]);
	}
	fault_arm(F_MALLOC, 1, 1, FAULT_SELF);
	l = store_lessee_new(p->s);
	assert_int_equal(fault_disarm(), 1);
	assert_null(l);
	l = store_lessee_new(p->s);
	assert_non_null(l);
	for (n = 1;; n++) {
		int rc;

		fault_arm(F_MALLOC, n, 1, FAULT_SELF);
		rc = store_match(p->s, p->ns, (const uint8_t (*)[STORE_KEY_BYTES])keys, 8, 1000, l,
				 &matched, &granted);
		if (!fault_disarm()) {
			assert_int_equal(rc, 0);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		failures++;
		assert_int_equal(stats_of(p->s).leases_active, 0);
		assert_int_equal(store_ns_stats(p->s, 0, &nss), 0);
		assert_int_equal(nss.match_requests, 0);
		assert_check(p->s);
	}
	/* records allocated before a failure stay spare: fewer each time */
	assert_true(failures >= 2);
	assert_int_equal(matched, 8);
	assert_int_equal(granted, 1000);
	assert_int_equal(stats_of(p->s).leases_active, 8);
	assert_check(p->s);
	store_lessee_free(p->s, l);
	assert_int_equal(stats_of(p->s).leases_active, 0);
}

/* ---- the NVMe tier's I/O paths ---- */

struct done_rec {
	pthread_mutex_t m;
	pthread_cond_t cv;
	int calls, status;
};

static void on_done(void *arg, int status)
{
	struct done_rec *d = arg;

	pthread_mutex_lock(&d->m);
	d->calls++;
	d->status = status;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->m);
}

static int wait_done(struct done_rec *d)
{
	pthread_mutex_lock(&d->m);
	while (!d->calls)
		pthread_cond_wait(&d->cv, &d->m);
	pthread_mutex_unlock(&d->m);
	return d->status;
}

/* GET of an NVMe-only block: the waiter and promotion records failing,
 * then the promotion's read failing. */
static void test_get_async(void **state)
{
	struct pool *p = pool_new(true, 2 * MIB);
	uint8_t key[STORE_KEY_BYTES];
	long n, failures = 0;

	*state = p;
	assert_int_equal(put_id(p, 1, 0), 0);
	assert_int_equal(put_id(p, 2, 1), 0);
	assert_int_equal(put_id(p, 3, 2), 0);
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	drop_dram(p, 3);
	drop_dram(p, 2);
	drop_dram(p, 1);
	key_of(1, key);
	for (n = 1;; n++) {
		struct done_rec d = { .m = PTHREAD_MUTEX_INITIALIZER,
				      .cv = PTHREAD_COND_INITIALIZER };
		struct store_ref ref;
		int rc;

		fault_arm(F_ALLOC, n, 1, FAULT_SELF);
		rc = store_get_async(p->s, p->ns, key, NULL, &ref, on_done, &d);
		if (!fault_disarm()) {
			assert_int_equal(rc, -EINPROGRESS);
			assert_int_equal(wait_done(&d), 0);
			assert_block(&ref, 1);
			assert_int_equal(ref.tier, 2);
			store_release(p->s, ref.block);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		failures++;
		store_debug_nvme_wait_idle(p->s);
		assert_int_equal(d.calls, 0);
		assert_int_equal(stats_of(p->s).promotions, 0);
		assert_true(stored(p, 1));
		assert_check(p->s);
	}
	assert_int_equal(failures, 2);
	/* the read of block 2 fails: a counted miss, 2 and 3 are gone */
	key_of(2, key);
	{
		struct done_rec d = { .m = PTHREAD_MUTEX_INITIALIZER,
				      .cv = PTHREAD_COND_INITIALIZER };
		struct store_ref ref;

		fault_arm(F_IO_READ, 1, 1, FAULT_OTHERS);
		assert_int_equal(store_get_async(p->s, p->ns, key, NULL, &ref, on_done, &d),
				 -EINPROGRESS);
		assert_int_equal(wait_done(&d), -ENOENT);
		assert_int_equal(fault_disarm(), 1);
	}
	store_debug_nvme_wait_idle(p->s);
	assert_int_equal(stats_of(p->s).nvme_read_errors, 1);
	assert_true(stored(p, 1));
	assert_false(stored(p, 2));
	assert_false(stored(p, 3));
	assert_check(p->s);
	/* and it stays gone after a restart */
	pool_close(p);
	pool_open(p);
	assert_int_equal(stats_of(p->s).blocks, 1);
	assert_int_equal(get_id(p, 1, NULL), 0);
	assert_check(p->s);
}

/* Blocks 1..n in chains of 5, all dirty in DRAM. */
static void put_chains(struct pool *p, uint64_t n)
{
	for (uint64_t id = 1; id <= n; id++)
		assert_int_equal(put_id(p, id, id % 5 == 1 ? 0 : id - 1), 0);
}

/* Every block 1..n readable byte-exact from DRAM, none on NVMe. */
static void assert_all_dirty(struct pool *p, uint64_t n)
{
	struct store_stats st = stats_of(p->s);

	assert_int_equal(st.nvme_blocks, 0);
	assert_int_equal(st.blocks, n);
	assert_int_equal(st.dram_blocks, n);
	for (uint64_t id = 1; id <= n; id++) {
		uint8_t tier = 0;

		assert_int_equal(get_id(p, id, &tier), 0);
		assert_int_equal(tier, 1);
	}
	assert_check(p->s);
}

/* The demoter's RocksDB writes fail: first the namespace record, then
 * (with every later write failing too) the block records' batch. */
static void test_demote_rocksdb(void **state)
{
	struct pool *p = pool_new(true, 2 * MIB);

	*state = p;
	store_debug_nvme_backoff(p->s, 20);
	put_chains(p, 20);
	/* 1: the namespace's name record */
	fault_arm(F_RDB_WRITE, 1, 1, FAULT_OTHERS);
	assert_int_equal(store_debug_nvme_demote_all(p->s), -EIO);
	assert_int_equal(fault_disarm(), 1);
	assert_true(stats_of(p->s).nvme_write_errors >= 1);
	assert_int_equal(stats_of(p->s).nvme_healthy, 0);
	assert_all_dirty(p, 20);
	/* 2: the name is recorded, the records' batch and all later writes fail */
	sleep_ms(30);
	fault_arm(F_RDB_WRITE, 2, LONG_MAX, FAULT_OTHERS);
	assert_int_equal(store_debug_nvme_demote_all(p->s), -EIO);
	assert_true(__atomic_load_n(&fault.fired, __ATOMIC_SEQ_CST) >= 1);
	assert_all_dirty(p, 20);
	store_namespace_release(p->s, p->ns);
	store_close(p->s);
	p->s = NULL;
	fault_disarm();
	/* no record reached the index: nothing comes back */
	pool_open(p);
	assert_int_equal(stats_of(p->s).rebuild_blocks, 0);
	assert_int_equal(stats_of(p->s).blocks, 0);
	assert_check(p->s);
	/* the tier works: a later demotion survives a restart */
	put_chains(p, 10);
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	pool_close(p);
	pool_open(p);
	assert_int_equal(stats_of(p->s).blocks, 10);
	for (uint64_t id = 1; id <= 10; id++)
		assert_int_equal(get_id(p, id, NULL), 0);
	assert_check(p->s);
}

/* The segment write fails, then the batch's own allocation: blocks stay
 * dirty; the next rounds demote them. */
static void test_demote_io(void **state)
{
	struct pool *p = pool_new(true, 2 * MIB);

	*state = p;
	store_debug_nvme_backoff(p->s, 20);
	put_chains(p, 20);
	fault_arm(F_IO_WRITE, 1, 1, FAULT_OTHERS);
	assert_int_equal(store_debug_nvme_demote_all(p->s), -EIO);
	assert_int_equal(fault_disarm(), 1);
	assert_all_dirty(p, 20);
	sleep_ms(30);
	fault_arm(F_CALLOC, 1, 1, FAULT_OTHERS);
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	assert_int_equal(fault_disarm(), 1);
	store_debug_nvme_wait_idle(p->s);
	assert_int_equal(stats_of(p->s).nvme_blocks, 20);
	assert_check(p->s);
	pool_close(p);
	pool_open(p);
	assert_int_equal(stats_of(p->s).blocks, 20);
	for (uint64_t id = 1; id <= 20; id++)
		assert_int_equal(get_id(p, id, NULL), 0);
	assert_check(p->s);
}

/* The namespace's range delete fails: the drop is not acknowledged
 * (-EIO), still holds in memory, and is retried (here: at close), so it
 * holds after a restart. */
static void test_drop_namespace(void **state)
{
	struct pool *p = pool_new(true, 2 * MIB);
	uint64_t blocks = 0, bytes = 0;

	*state = p;
	put_chains(p, 10);
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	store_debug_nvme_wait_idle(p->s);
	fault_arm(F_RDB_WRITE, 1, 1, FAULT_SELF);
	assert_int_equal(store_drop_namespace(p->s, p->ns, &blocks, &bytes), -EIO);
	assert_int_equal(fault_disarm(), 1);
	assert_int_equal(stats_of(p->s).nvme_healthy, 0);
	assert_int_equal(blocks, 10);
	for (uint64_t id = 1; id <= 10; id++)
		assert_false(stored(p, id));
	assert_check(p->s);
	pool_close(p);
	pool_open(p);
	assert_int_equal(stats_of(p->s).blocks, 0);
	assert_check(p->s);
}

/* Record deletes fail in RocksDB: the DELETE answers -EIO (its removal is
 * not durable yet), they are requeued and written once it works. */
static void test_flush_dels(void **state)
{
	struct pool *p = pool_new(true, 2 * MIB);
	uint8_t key[STORE_KEY_BYTES];

	*state = p;
	store_debug_nvme_backoff(p->s, 20);
	put_chains(p, 10);
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	store_debug_nvme_wait_idle(p->s);
	fault_arm(F_RDB_WRITE, 1, 1, FAULT_SELF);
	key_of(3, key);
	assert_int_equal(store_delete(p->s, p->ns, key, NULL), -EIO); /* 3, 4, 5 */
	assert_int_equal(fault_disarm(), 1);
	assert_true(stats_of(p->s).nvme_write_errors >= 1);
	sleep_ms(30);
	store_debug_nvme_wait_idle(p->s);
	assert_check(p->s);
	pool_close(p);
	pool_open(p);
	assert_int_equal(stats_of(p->s).blocks, 7);
	assert_int_equal(stats_of(p->s).orphans_dropped, 0);
	for (uint64_t id = 3; id <= 5; id++)
		assert_false(stored(p, id));
	assert_int_equal(get_id(p, 2, NULL), 0);
	assert_check(p->s);
}

/* A reclaim that must read blocks back (NVMe-only heads whose children a
 * GET pins) cannot get its bounce buffer: it backs off; every head stays readable. */
static void test_reclaim_bounce(void **state)
{
	struct pool *p = calloc(1, sizeof(*p));
	const uint64_t heads = 8;
	struct store_ref pins[8];
	uint64_t id = 100;
	long fired;

	assert_non_null(p);
	*state = p;
	store_fixture_tmpdir(p->dir, sizeof(p->dir), "kvpool-faults");
	config_of(&p->cfg, p->dir, 512 * KIB);
	p->cfg.nvme_capacity_bytes = 4 * MIB;
	pool_open(p);
	store_debug_nvme_backoff(p->s, 20);
	for (uint64_t h = 1; h <= heads; h++)
		assert_int_equal(put_id(p, h, 0), 0);
	for (uint64_t h = 1; h <= heads; h++) {
		uint8_t key[STORE_KEY_BYTES];

		assert_int_equal(put_id(p, 50 + h, h), 0);
		key_of(50 + h, key);
		assert_int_equal(store_get(p->s, p->ns, key, NULL, &pins[h - 1]), 0);
	}
	assert_int_equal(store_debug_nvme_demote_all(p->s), 0);
	fault_arm(F_MEMALIGN, 1, 1, FAULT_OTHERS);
	for (int i = 0; i < 1200 && !__atomic_load_n(&fault.fired, __ATOMIC_SEQ_CST); i++)
		assert_int_equal(put_id(p, id++, 0), 0);
	fired = fault_disarm();
	assert_int_equal(fired, 1);
	store_debug_nvme_wait_idle(p->s);
	assert_check(p->s);
	assert_true(stats_of(p->s).nvme_write_errors >= 1);
	for (uint64_t h = 1; h <= heads; h++) {
		assert_int_equal(get_id(p, h, NULL), 0);
		assert_int_equal(get_id(p, 50 + h, NULL), 0);
		store_release(p->s, pins[h - 1].block);
	}
	assert_check(p->s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_dram),
		cmocka_unit_test(test_open_nvme_fresh),
		cmocka_unit_test(test_open_nvme_rebuild),
		cmocka_unit_test_teardown(test_namespace, teardown),
		cmocka_unit_test_teardown(test_put, teardown),
		cmocka_unit_test_teardown(test_lease, teardown),
		cmocka_unit_test_teardown(test_get_async, teardown),
		cmocka_unit_test_teardown(test_demote_rocksdb, teardown),
		cmocka_unit_test_teardown(test_demote_io, teardown),
		cmocka_unit_test_teardown(test_drop_namespace, teardown),
		cmocka_unit_test_teardown(test_flush_dels, teardown),
		cmocka_unit_test_teardown(test_reclaim_bounce, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
