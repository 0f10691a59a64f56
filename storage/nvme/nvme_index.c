/*
 * nvme_index.c - the NVMe tier's durable index in RocksDB (C API).
 *
 * Keys (storage/nvme/NVME.md has the byte layouts):
 *   'b' + be32 disk id + 32-byte hash   one block record (fixed-size value)
 *   'n' + be32 disk id                  namespace name
 *   'm' + "next_ns"                     next disk id, le32
 *   'd' + be32 disk id                  tombstone: this namespace was dropped
 * Big-endian ids make a namespace's records one contiguous key range, so
 * dropping a namespace is a single DeleteRange and a scan returns records
 * grouped by namespace.
 *
 * Options: WAL on, writes unsynced, no compression (values are hashes and
 * offsets: nothing to gain), create_if_missing. Every RocksDB error string
 * is logged here and freed; callers see -EBADMSG when RocksDB reported
 * corruption, else -EIO.
 */
#include "nvme_index.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rocksdb/c.h>

#define KEY_BLOCK 'b'
#define KEY_NS 'n'
#define KEY_META 'm'
#define KEY_DROPPED 'd'
#define KEY_OWNER 'o'
#define BLOCK_KEY_BYTES (1 + 4 + STORE_KEY_BYTES)
#define NS_KEY_BYTES (1 + 4)
static const char next_ns_key[] = { KEY_META, 'n', 'e', 'x', 't', '_', 'n', 's' };
/* Scan bounds. RocksDB keeps a pointer to an iterator's upper bound, not a
 * copy, so they live in static storage. */
static const char block_lo = KEY_BLOCK, block_hi = KEY_BLOCK + 1;
static const char ns_lo = KEY_NS, ns_hi = KEY_NS + 1;
static const char dropped_lo = KEY_DROPPED, dropped_hi = KEY_DROPPED + 1;

/* Block record value (NVME.md "Block record value"): format 1, 72 bytes,
 * for a block without a retention; format 2, 80 bytes, the same and the
 * retention's deadline, for a retained one; format 3, 88 bytes, format 2
 * (deadline 0 when none) and the writer's tenant key, for a block that
 * has a writer. All three are read. */
#define REC_FORMAT 1
#define REC_BYTES 72
#define REC_FORMAT_RETAINED 2
#define REC_BYTES_RETAINED 80
#define REC_FORMAT_TENANT 3
#define REC_BYTES_TENANT 88
#define REC_OFF_RETAIN_UNTIL 72
#define REC_OFF_TENANT 80
#define REC_OFF_FORMAT 0
#define REC_OFF_HAS_PARENT 1
#define REC_OFF_SEGMENT 4
#define REC_OFF_OFFSET 8
#define REC_OFF_LENGTH 16
#define REC_OFF_CHECKSUM 24
#define REC_OFF_LAST_USE 32
#define REC_OFF_PARENT 40

struct store_nvme_index {
	rocksdb_t *db;
	rocksdb_options_t *opts;
	rocksdb_writeoptions_t *wopts;
	rocksdb_writeoptions_t *wopts_sync; /* namespace drops: synced */
	rocksdb_readoptions_t *ropts;
	pthread_mutex_t ns_lock; /* serialises ns_put's read-modify-write of next_ns */
	/* Serialises every write, and the check of `failed` with it: once the
	 * filesystem refused a write-ahead log write, RocksDB's log writer
	 * aborts the process (an assertion) at the next write or sync, so
	 * none is made: the index is read-only until the next start. */
	pthread_mutex_t write_lock;
	bool failed;
	store_log_fn log;
	void *log_arg;
};

/* ---- encoding ------------------------------------------------------------ */

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_le32(uint8_t *p, uint32_t v)
{
	int i;

	for (i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* 'b' + be32 id + hash. */
static void block_key(uint8_t k[BLOCK_KEY_BYTES], uint32_t ns_disk_id,
		      const uint8_t key[STORE_KEY_BYTES])
{
	k[0] = KEY_BLOCK;
	put_be32(k + 1, ns_disk_id);
	memcpy(k + 5, key, STORE_KEY_BYTES);
}

/* 'n' + be32 id. */
static void ns_key(uint8_t k[NS_KEY_BYTES], uint32_t ns_disk_id)
{
	k[0] = KEY_NS;
	put_be32(k + 1, ns_disk_id);
}

/* The value of a block record, REC_BYTES, (retained) REC_BYTES_RETAINED
 * or (with a writer) REC_BYTES_TENANT long; reserved bytes are zero.
 * Returns its size. */
static size_t encode_rec(uint8_t v[REC_BYTES_TENANT], const struct store_nvme_rec *r)
{
	memset(v, 0, REC_BYTES_TENANT);
	v[REC_OFF_FORMAT] = r->tenant_key ? REC_FORMAT_TENANT :
			    r->retain_until_ms ? REC_FORMAT_RETAINED : REC_FORMAT;
	v[REC_OFF_HAS_PARENT] = r->has_parent ? 1 : 0;
	put_le32(v + REC_OFF_SEGMENT, r->segment);
	put_le64(v + REC_OFF_OFFSET, r->offset);
	put_le64(v + REC_OFF_LENGTH, r->length);
	put_le64(v + REC_OFF_CHECKSUM, r->checksum);
	put_le64(v + REC_OFF_LAST_USE, r->last_use);
	if (r->has_parent)
		memcpy(v + REC_OFF_PARENT, r->parent, STORE_KEY_BYTES);
	if (!r->retain_until_ms && !r->tenant_key)
		return REC_BYTES;
	put_le64(v + REC_OFF_RETAIN_UNTIL, r->retain_until_ms);
	if (!r->tenant_key)
		return REC_BYTES_RETAINED;
	put_le64(v + REC_OFF_TENANT, r->tenant_key);
	return REC_BYTES_TENANT;
}

/* Decode a block record from its key and value; -EBADMSG when either is
 * not what this build writes (size, value format, has_parent flag). */
static int decode_rec(const uint8_t *k, size_t klen, const uint8_t *v, size_t vlen,
		      struct store_nvme_rec *r)
{
	bool plain = vlen == REC_BYTES && v[REC_OFF_FORMAT] == REC_FORMAT;
	bool retained = vlen == REC_BYTES_RETAINED && v[REC_OFF_FORMAT] == REC_FORMAT_RETAINED;
	bool tenant = vlen == REC_BYTES_TENANT && v[REC_OFF_FORMAT] == REC_FORMAT_TENANT;

	if (klen != BLOCK_KEY_BYTES || k[0] != KEY_BLOCK || !(plain || retained || tenant) ||
	    v[REC_OFF_HAS_PARENT] > 1)
		return -EBADMSG;
	memset(r, 0, sizeof(*r));
	r->ns_disk_id = get_be32(k + 1);
	memcpy(r->key, k + 5, STORE_KEY_BYTES);
	r->has_parent = v[REC_OFF_HAS_PARENT];
	if (r->has_parent)
		memcpy(r->parent, v + REC_OFF_PARENT, STORE_KEY_BYTES);
	r->segment = get_le32(v + REC_OFF_SEGMENT);
	r->offset = get_le64(v + REC_OFF_OFFSET);
	r->length = get_le64(v + REC_OFF_LENGTH);
	r->checksum = get_le64(v + REC_OFF_CHECKSUM);
	r->last_use = get_le64(v + REC_OFF_LAST_USE);
	if (retained || tenant)
		r->retain_until_ms = get_le64(v + REC_OFF_RETAIN_UNTIL);
	if (tenant)
		r->tenant_key = get_le64(v + REC_OFF_TENANT);
	return 0;
}

/* ---- errors -------------------------------------------------------------- */

/* One log line through the store's log function, if any. */
static void ix_log(const struct store_nvme_index *ix, enum store_log_level level,
		   const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ix_log(const struct store_nvme_index *ix, enum store_log_level level,
		   const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!ix->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ix->log(ix->log_arg, level, msg);
}

/* Turn a RocksDB error string into -EBADMSG (RocksDB says "Corruption":
 * a checksum or format failure in its files) or -EIO (anything else):
 * log it (naming what we were doing), free it. 0 when there was no error. */
static int rdb_error(const struct store_nvme_index *ix, char *err, const char *what)
{
	int rc;

	if (!err)
		return 0;
	ix_log(ix, STORE_LOG_ERR, "nvme index: %s failed: %s", what, err);
	rc = strstr(err, "Corruption") ? -EBADMSG : -EIO;
	rocksdb_free(err);
	return rc;
}

/* After a failed write (ix->write_lock held): a RocksDB "IO error" is the
 * filesystem refusing the log (read-only, EIO, full): no more writes. */
static int write_error_locked(struct store_nvme_index *ix, char *err, const char *what)
{
	if (err && strncmp(err, "IO error", 8) == 0 && !ix->failed) {
		ix->failed = true;
		ix_log(ix, STORE_LOG_ERR, "nvme index: the filesystem refused a write of its log; "
		       "the index takes no more writes until kvpoold restarts (the nvme tier "
		       "stays unhealthy, dram serves, nvme copies stay readable)");
	}
	return rdb_error(ix, err, what);
}

/* Commit a write batch (WAL on; synced when sync) and free it. */
static int commit_opt(struct store_nvme_index *ix, rocksdb_writebatch_t *wb, bool sync,
		      const char *what)
{
	char *err = NULL;
	int rc = -EIO;

	pthread_mutex_lock(&ix->write_lock);
	if (!ix->failed) {
		rocksdb_write(ix->db, sync ? ix->wopts_sync : ix->wopts, wb, &err);
		rc = write_error_locked(ix, err, what);
	}
	pthread_mutex_unlock(&ix->write_lock);
	rocksdb_writebatch_destroy(wb);
	return rc;
}

/* Commit a write batch unsynced and free it. */
static int commit(struct store_nvme_index *ix, rocksdb_writebatch_t *wb, const char *what)
{
	return commit_opt(ix, wb, false, what);
}

/* ---- open / close -------------------------------------------------------- */

/* Options for a small index of fixed-size records. */
static rocksdb_options_t *index_options(void)
{
	rocksdb_options_t *o = rocksdb_options_create();

	if (!o)
		return NULL;
	rocksdb_options_set_create_if_missing(o, 1);
	rocksdb_options_set_compression(o, rocksdb_no_compression);
	rocksdb_options_set_bottommost_compression(o, rocksdb_no_compression);
	rocksdb_options_set_keep_log_file_num(o, 4);
	rocksdb_options_set_max_log_file_size(o, 8u << 20);
	/* RocksDB preallocates each write-ahead log file at 1.1 times the
	 * write buffer (72 MiB with its 64 MiB default): a small buffer keeps
	 * that well inside STORE_TIER_FS_RESERVE_BYTES (tier_impl.h), and an
	 * index of 72-byte records needs no more */
	rocksdb_options_set_write_buffer_size(o, STORE_NVME_INDEX_WRITE_BUFFER_BYTES);
	rocksdb_options_increase_parallelism(o, 2);
	/* RocksDB's info LOG lives in the index directory: when that
	 * filesystem refuses writes, a second line logged through a writer
	 * that already failed aborts the process (an assertion in RocksDB's
	 * file writer, kept in release builds), and an I/O error is logged at
	 * ERROR. So only FATAL lines are written; every RocksDB error string
	 * reaches kvpoold's own log through rdb_error instead. */
	rocksdb_options_set_info_log_level(o, 4 /* FATAL_LEVEL */);
	return o;
}

/* Databases whose log writer failed: closing one would abort in
 * RocksDB's log writer, so it is left open for the life of the process
 * (and kept reachable here, so leak checkers do not count it). */
static rocksdb_t *abandoned[16];
static unsigned nabandoned;
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

/* Free what a (possibly half-built) index holds. */
static void ix_free(struct store_nvme_index *ix)
{
	if (ix->db && ix->failed) {
		pthread_mutex_lock(&abandoned_lock);
		if (nabandoned < sizeof(abandoned) / sizeof(abandoned[0]))
			abandoned[nabandoned++] = ix->db;
		pthread_mutex_unlock(&abandoned_lock);
		ix->db = NULL;
	}
	if (ix->db)
		rocksdb_close(ix->db);
	if (ix->ropts)
		rocksdb_readoptions_destroy(ix->ropts);
	if (ix->wopts)
		rocksdb_writeoptions_destroy(ix->wopts);
	if (ix->wopts_sync)
		rocksdb_writeoptions_destroy(ix->wopts_sync);
	if (ix->opts)
		rocksdb_options_destroy(ix->opts);
	pthread_mutex_destroy(&ix->ns_lock);
	pthread_mutex_destroy(&ix->write_lock);
	free(ix);
}

/* Does RocksDB's open error say the files are damaged (rather than
 * locked, read-only, full or out of file descriptors)? */
static bool open_error_is_damage(const char *err)
{
	static const char *const transient[] = { "lock", "Read-only", "No space",
						 "Too many open files", "Permission denied" };

	for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
		if (strstr(err, transient[i]))
			return false;
	return strstr(err, "Corruption") || strstr(err, "Invalid argument") ||
	       strstr(err, "MANIFEST") || strstr(err, "CURRENT") || strstr(err, "No such file");
}

int store_nvme_index_open(const char *path, store_log_fn log, void *log_arg,
			  struct store_nvme_index **out, char *why, size_t why_len)
{
	struct store_nvme_index *ix = calloc(1, sizeof(*ix));
	char *err = NULL;

	if (!ix)
		goto out_nomem;
	pthread_mutex_init(&ix->ns_lock, NULL);
	pthread_mutex_init(&ix->write_lock, NULL);
	ix->log = log;
	ix->log_arg = log_arg;
	ix->opts = index_options();
	ix->wopts = rocksdb_writeoptions_create();
	ix->wopts_sync = rocksdb_writeoptions_create();
	ix->ropts = rocksdb_readoptions_create();
	if (!ix->opts || !ix->wopts || !ix->wopts_sync || !ix->ropts)
		goto out_free;
	rocksdb_writeoptions_set_sync(ix->wopts, 0);
	rocksdb_writeoptions_disable_WAL(ix->wopts, 0);
	rocksdb_writeoptions_set_sync(ix->wopts_sync, 1);
	rocksdb_writeoptions_disable_WAL(ix->wopts_sync, 0);
	ix->db = rocksdb_open(ix->opts, path, &err);
	if (err) {
		int rc = open_error_is_damage(err) ? -EBADMSG : -EIO;

		if (why && why_len)
			snprintf(why, why_len, "cannot open the nvme index %s: %s", path, err);
		rdb_error(ix, err, "open");
		ix->db = NULL;
		ix_free(ix);
		return rc;
	}
	*out = ix;
	return 0;
out_free:
	ix_free(ix);
out_nomem:
	if (why && why_len)
		snprintf(why, why_len, "cannot open the nvme index %s: out of memory", path);
	return -ENOMEM;
}

void store_nvme_index_close(struct store_nvme_index *ix)
{
	if (ix)
		ix_free(ix);
}

/* ---- block records ------------------------------------------------------- */

int store_nvme_index_write(struct store_nvme_index *ix, const struct store_nvme_rec *recs,
			   size_t n, const uint32_t *del_ns,
			   const uint8_t (*del_keys)[STORE_KEY_BYTES], size_t ndel)
{
	rocksdb_writebatch_t *wb;
	uint8_t k[BLOCK_KEY_BYTES], v[REC_BYTES_TENANT];
	size_t i;

	if ((n && !recs) || (ndel && (!del_ns || !del_keys)))
		return -EINVAL;
	wb = rocksdb_writebatch_create();
	if (!wb)
		return -ENOMEM;
	/* deletions first: a key both deleted and written keeps its new record */
	for (i = 0; i < ndel; i++) {
		block_key(k, del_ns[i], del_keys[i]);
		rocksdb_writebatch_delete(wb, (const char *)k, sizeof(k));
	}
	for (i = 0; i < n; i++) {
		size_t vlen;

		block_key(k, recs[i].ns_disk_id, recs[i].key);
		vlen = encode_rec(v, &recs[i]);
		rocksdb_writebatch_put(wb, (const char *)k, sizeof(k), (const char *)v, vlen);
	}
	return commit(ix, wb, "writing block records");
}

int store_nvme_index_delete(struct store_nvme_index *ix, uint32_t ns_disk_id,
			    const uint8_t key[STORE_KEY_BYTES])
{
	uint8_t k[BLOCK_KEY_BYTES];
	char *err = NULL;

	int rc = -EIO;

	block_key(k, ns_disk_id, key);
	pthread_mutex_lock(&ix->write_lock);
	if (!ix->failed) {
		rocksdb_delete(ix->db, ix->wopts, (const char *)k, sizeof(k), &err);
		rc = write_error_locked(ix, err, "deleting a block record");
	}
	pthread_mutex_unlock(&ix->write_lock);
	return rc;
}

bool store_nvme_index_failed(struct store_nvme_index *ix)
{
	bool failed;

	pthread_mutex_lock(&ix->write_lock);
	failed = ix->failed;
	pthread_mutex_unlock(&ix->write_lock);
	return failed;
}

uint64_t store_nvme_index_last_seq(struct store_nvme_index *ix)
{
	return rocksdb_get_latest_sequence_number(ix->db);
}

int store_nvme_index_sync(struct store_nvme_index *ix)
{
	char *err = NULL;
	int rc = -EIO;

	pthread_mutex_lock(&ix->write_lock);
	if (!ix->failed) {
		rocksdb_flush_wal(ix->db, 1, &err);
		rc = write_error_locked(ix, err, "syncing the write-ahead log");
	}
	pthread_mutex_unlock(&ix->write_lock);
	return rc;
}

/* ---- namespaces ---------------------------------------------------------- */

/* Read next_ns; 1 when absent (a new index). */
static int read_next_ns(struct store_nvme_index *ix, uint32_t *out)
{
	char *err = NULL, *val;
	size_t len = 0;
	int rc = 0;

	val = rocksdb_get(ix->db, ix->ropts, next_ns_key, sizeof(next_ns_key), &len, &err);
	if (err)
		return rdb_error(ix, err, "reading next_ns");
	if (!val) {
		*out = 1;
		return 0;
	}
	if (len == 4 && get_le32((const uint8_t *)val) != 0) {
		*out = get_le32((const uint8_t *)val);
	} else {
		ix_log(ix, STORE_LOG_ERR, "nvme index: next_ns holds %zu bytes, not a le32 id", len);
		rc = -EIO;
	}
	rocksdb_free(val);
	return rc;
}

int store_nvme_index_next_ns_id(struct store_nvme_index *ix, uint32_t *out)
{
	uint32_t next;
	int rc;

	pthread_mutex_lock(&ix->ns_lock);
	rc = read_next_ns(ix, &next);
	pthread_mutex_unlock(&ix->ns_lock);
	if (!rc)
		*out = next;
	return rc;
}

/* 'o' + be32 id: the key of a namespace's creator. */
static void owner_key(uint8_t k[NS_KEY_BYTES], uint32_t ns_disk_id)
{
	k[0] = KEY_OWNER;
	put_be32(k + 1, ns_disk_id);
}

int store_nvme_index_ns_put(struct store_nvme_index *ix, uint32_t ns_disk_id,
			    const char *name, size_t name_len)
{
	return store_nvme_index_ns_put_owned(ix, ns_disk_id, name, name_len, 0);
}

int store_nvme_index_ns_owner(struct store_nvme_index *ix, uint32_t ns_disk_id, uint64_t *owner)
{
	uint8_t k[NS_KEY_BYTES];
	char *err = NULL, *v;
	size_t vlen = 0;

	*owner = 0;
	owner_key(k, ns_disk_id);
	v = rocksdb_get(ix->db, ix->ropts, (const char *)k, sizeof(k), &vlen, &err);
	if (err) {
		ix_log(ix, STORE_LOG_ERR, "nvme index: reading a namespace's creator: %s", err);
		rocksdb_free(err);
		return -EIO;
	}
	if (v && vlen == 8)
		*owner = get_le64((const uint8_t *)v);
	rocksdb_free(v);
	return 0;
}

int store_nvme_index_ns_put_owned(struct store_nvme_index *ix, uint32_t ns_disk_id,
				  const char *name, size_t name_len, uint64_t owner)
{
	rocksdb_writebatch_t *wb;
	uint8_t k[NS_KEY_BYTES], v[4], ov[8];
	uint32_t next;
	int rc;

	if (!name || name_len == 0 || name_len > STORE_NAME_MAX_BYTES || ns_disk_id == 0 ||
	    ns_disk_id == UINT32_MAX)
		return -EINVAL;
	pthread_mutex_lock(&ix->ns_lock);
	rc = read_next_ns(ix, &next);
	if (rc)
		goto out_unlock;
	wb = rocksdb_writebatch_create();
	if (!wb) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	ns_key(k, ns_disk_id);
	rocksdb_writebatch_put(wb, (const char *)k, sizeof(k), name, name_len);
	if (owner) {
		owner_key(k, ns_disk_id);
		put_le64(ov, owner);
		rocksdb_writebatch_put(wb, (const char *)k, sizeof(k), (const char *)ov, sizeof(ov));
	}
	if (next <= ns_disk_id) {
		put_le32(v, ns_disk_id + 1);
		rocksdb_writebatch_put(wb, next_ns_key, sizeof(next_ns_key), (const char *)v,
				       sizeof(v));
	}
	rc = commit(ix, wb, "recording a namespace");
out_unlock:
	pthread_mutex_unlock(&ix->ns_lock);
	return rc;
}

int store_nvme_index_ns_drop(struct store_nvme_index *ix, uint32_t ns_disk_id)
{
	rocksdb_writebatch_t *wb;
	uint8_t from[5], to[5], k[NS_KEY_BYTES], d[NS_KEY_BYTES], v[4];
	uint32_t next;
	int rc;

	if (ns_disk_id == 0)
		return -EINVAL;
	pthread_mutex_lock(&ix->ns_lock);
	rc = read_next_ns(ix, &next);
	if (rc)
		goto out_unlock;
	wb = rocksdb_writebatch_create();
	if (!wb) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	from[0] = KEY_BLOCK;
	put_be32(from + 1, ns_disk_id);
	if (ns_disk_id < UINT32_MAX) {
		to[0] = KEY_BLOCK;
		put_be32(to + 1, ns_disk_id + 1);
	} else {
		to[0] = KEY_BLOCK + 1; /* past every 'b' key */
		memset(to + 1, 0, 4);
	}
	rocksdb_writebatch_delete_range(wb, (const char *)from, sizeof(from), (const char *)to,
					sizeof(to));
	ns_key(k, ns_disk_id);
	rocksdb_writebatch_delete(wb, (const char *)k, sizeof(k));
	owner_key(k, ns_disk_id);
	rocksdb_writebatch_delete(wb, (const char *)k, sizeof(k));
	/* The tombstone outlives whatever a demotion in flight still writes
	 * under this id (a name, records): the scans ignore them all. */
	d[0] = KEY_DROPPED;
	put_be32(d + 1, ns_disk_id);
	rocksdb_writebatch_put(wb, (const char *)d, sizeof(d), "", 0);
	if (next <= ns_disk_id && ns_disk_id < UINT32_MAX) {
		put_le32(v, ns_disk_id + 1); /* the id is never handed out again */
		rocksdb_writebatch_put(wb, next_ns_key, sizeof(next_ns_key), (const char *)v,
				       sizeof(v));
	}
	rc = commit_opt(ix, wb, true, "dropping a namespace");
out_unlock:
	pthread_mutex_unlock(&ix->ns_lock);
	return rc;
}

/* ---- scans --------------------------------------------------------------- */

/* An iterator over keys [lo, hi) (one key class, one-byte bounds in
 * static storage); NULL without memory. */
static rocksdb_iterator_t *range_iter(struct store_nvme_index *ix, rocksdb_readoptions_t **ro,
				      const char *lo, const char *hi)
{
	rocksdb_iterator_t *it;

	*ro = rocksdb_readoptions_create();
	if (!*ro)
		return NULL;
	rocksdb_readoptions_set_iterate_upper_bound(*ro, hi, 1);
	rocksdb_readoptions_set_fill_cache(*ro, 0);
	it = rocksdb_create_iterator(ix->db, *ro);
	if (!it) {
		rocksdb_readoptions_destroy(*ro);
		return NULL;
	}
	rocksdb_iter_seek(it, lo, 1);
	return it;
}

/* Finish a scan: the iterator's own error (if any) wins over rc == 0. */
static int end_iter(struct store_nvme_index *ix, rocksdb_iterator_t *it, rocksdb_readoptions_t *ro,
		    int rc, const char *what)
{
	char *err = NULL;

	rocksdb_iter_get_error(it, &err);
	rocksdb_iter_destroy(it);
	rocksdb_readoptions_destroy(ro);
	if (err) {
		int e = rdb_error(ix, err, what);

		return rc ? rc : e;
	}
	return rc;
}

/* The tombstoned disk ids, ascending (RocksDB's key order), in a
 * malloc'd array (*ids NULL when there are none). Errors: -EIO, -ENOMEM. */
static int dropped_ids(struct store_nvme_index *ix, uint32_t **ids, size_t *n)
{
	rocksdb_readoptions_t *ro;
	rocksdb_iterator_t *it;
	size_t cap = 0;
	int rc = 0;

	*ids = NULL;
	*n = 0;
	it = range_iter(ix, &ro, &dropped_lo, &dropped_hi);
	if (!it)
		return -ENOMEM;
	for (; !rc && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
		size_t klen;
		const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);

		if (klen != NS_KEY_BYTES)
			continue;
		if (*n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			uint32_t *m = realloc(*ids, ncap * sizeof(*m));

			if (!m) {
				rc = -ENOMEM;
				break;
			}
			*ids = m;
			cap = ncap;
		}
		(*ids)[(*n)++] = get_be32(k + 1);
	}
	rc = end_iter(ix, it, ro, rc, "scanning namespace tombstones");
	if (rc) {
		free(*ids);
		*ids = NULL;
		*n = 0;
	}
	return rc;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int store_nvme_index_ns_scan(struct store_nvme_index *ix, store_nvme_ns_fn fn, void *arg)
{
	rocksdb_readoptions_t *ro;
	rocksdb_iterator_t *it;
	uint32_t *dropped;
	size_t ndropped;
	int rc;

	rc = dropped_ids(ix, &dropped, &ndropped);
	if (rc)
		return rc;
	it = range_iter(ix, &ro, &ns_lo, &ns_hi);
	if (!it) {
		free(dropped);
		return -ENOMEM;
	}
	for (; !rc && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
		size_t klen, vlen;
		const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
		const char *v = rocksdb_iter_value(it, &vlen);
		uint32_t id;

		if (klen != NS_KEY_BYTES || vlen == 0 || vlen > STORE_NAME_MAX_BYTES) {
			ix_log(ix, STORE_LOG_WARN, "nvme index: skipping a malformed namespace entry");
			continue;
		}
		id = get_be32(k + 1);
		/* named again by a demotion that raced the drop: still dropped */
		if (ndropped && bsearch(&id, dropped, ndropped, sizeof(*dropped), cmp_u32))
			continue;
		rc = fn(arg, id, v, vlen);
	}
	free(dropped);
	return end_iter(ix, it, ro, rc, "scanning namespaces");
}

int store_nvme_index_scan(struct store_nvme_index *ix, store_nvme_rec_fn fn, void *arg,
			  uint64_t *bad)
{
	rocksdb_readoptions_t *ro;
	rocksdb_iterator_t *it;
	struct store_nvme_rec rec;
	uint64_t nbad = 0;
	int rc = 0;

	it = range_iter(ix, &ro, &block_lo, &block_hi);
	if (!it)
		return -ENOMEM;
	for (; !rc && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
		size_t klen, vlen;
		const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
		const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);

		if (decode_rec(k, klen, v, vlen, &rec)) {
			nbad++;
			continue;
		}
		rc = fn(arg, &rec);
	}
	rc = end_iter(ix, it, ro, rc, "scanning block records");
	if (!rc && bad)
		*bad = nbad;
	return rc;
}
