/*
 * nvme_index.h - the NVMe tier's durable index, kept in RocksDB (C API):
 * one record per block with an NVMe copy, and the namespace table.
 *
 * Internal to storage/. RocksDB types, options and error strings never
 * leave nvme_index.c: errors come back as -errno, and the text RocksDB
 * gave is logged through the store's log function. Wherever a function
 * below lists -EIO, it returns -EBADMSG instead when RocksDB reported
 * corruption (a checksum or format failure in its own files).
 *
 * Durability: the write-ahead log is on and unsynced (a process crash
 * loses nothing written; a machine crash may lose the last writes, which
 * is acceptable for a cache). Removals that a client is told about are
 * synced: ns_drop syncs itself, and the store calls store_nvme_index_sync
 * after a DELETE's record deletes. Every function here is one atomic
 * RocksDB write or a read.
 *
 * Namespace ids here are "disk ids": numbered 1, 2, ... by the store,
 * never reused within a directory (the next one is kept in the index),
 * independent of the in-memory ids store_namespace_id hands out.
 *
 * Threads: every function may be called from any thread (RocksDB's own
 * locking); open and close from one.
 */
#ifndef KVPOOL_NVME_INDEX_H
#define KVPOOL_NVME_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

struct store_nvme_index;

/* RocksDB's write buffer (memtable) size; each write-ahead log file is
 * preallocated at 1.1 times it, about 8.8 MiB. */
#define STORE_NVME_INDEX_WRITE_BUFFER_BYTES (8u << 20)

/* What the index keeps of one block on NVMe. Encoded little-endian in a
 * fixed-size value (storage/nvme/NVME.md); key = disk ns id (big-endian, so a
 * namespace's blocks sort together) + block hash. */
struct store_nvme_rec {
	uint32_t ns_disk_id;
	uint8_t key[STORE_KEY_BYTES];
	uint8_t parent[STORE_KEY_BYTES]; /* zeros when has_parent == 0 */
	uint8_t has_parent;
	uint32_t segment;                /* segment file number */
	uint64_t offset;                 /* bytes into the segment, 4 KiB aligned */
	uint64_t length;                 /* payload bytes (the extent is rounded up to 4 KiB) */
	uint64_t checksum;               /* xxh3-64 taken when the block entered the pool */
	uint64_t last_use;               /* use stamp when written: aging epoch << 32 | last_use
					  * (store_use_stamp; restores LRU order) */
	uint64_t retain_until_ms;        /* CLOCK_REALTIME ms until which the block is
					  * retained; 0 = not retained (a record of value
					  * format 1 reads as 0) */
	uint64_t tenant_key;             /* the writer's store_tenant key; 0 = none
					  * (value formats 1 and 2) */
};

/* Open or create the RocksDB database at `path` (a directory). Creates it
 * when missing. Errors: -EBADMSG (RocksDB says its files are damaged: a
 * corrupt or missing CURRENT, MANIFEST or table file), -EIO (RocksDB
 * refused otherwise: locked, read-only, full, out of file descriptors);
 * the reason goes to why and to the log; -ENOMEM. */
int store_nvme_index_open(const char *path, store_log_fn log, void *log_arg,
			  struct store_nvme_index **out, char *why, size_t why_len);

/* Close and free. Accepts NULL. */
void store_nvme_index_close(struct store_nvme_index *ix);

/* Write `n` block records (n >= 1) and delete `ndel` records named by
 * (del_ns[i], del_keys[i]) in one atomic batch: a demotion or a segment
 * reclaim commits its new records and drops the old ones together.
 * The deletions apply first, so a key both deleted and written keeps its
 * new record. del_ns/del_keys may be NULL when ndel == 0.
 * Errors: -EIO, -ENOMEM, -EINVAL (a NULL array with a non-zero count). */
int store_nvme_index_write(struct store_nvme_index *ix, const struct store_nvme_rec *recs,
			   size_t n, const uint32_t *del_ns,
			   const uint8_t (*del_keys)[STORE_KEY_BYTES], size_t ndel);

/* Delete one block's record (absent is not an error). Errors: -EIO. */
int store_nvme_index_delete(struct store_nvme_index *ix, uint32_t ns_disk_id,
			    const uint8_t key[STORE_KEY_BYTES]);

/* Did the filesystem refuse a write of the index's log (RocksDB "IO
 * error")? Then every write function returns -EIO without calling
 * RocksDB (whose log writer would abort the process at the next write),
 * reads still work, and store_nvme_index_close leaves the database open
 * for the life of the process. Any thread. */
bool store_nvme_index_failed(struct store_nvme_index *ix);

/* The sequence number of the last write the database holds (after an
 * open: the last one its write-ahead log replay reached). */
uint64_t store_nvme_index_last_seq(struct store_nvme_index *ix);

/* Make every write returned so far durable (sync the write-ahead log):
 * a DELETE is answered only after its record deletes are synced. Blocks
 * the caller for one device flush. Errors: -EIO. */
int store_nvme_index_sync(struct store_nvme_index *ix);

/* Record namespace `name` (1..255 bytes) under disk id ns_disk_id and set
 * the next disk id to at least ns_disk_id + 1, atomically.
 * Errors: -EIO, -ENOMEM, -EINVAL (name length, or id 0 or UINT32_MAX). */
int store_nvme_index_ns_put(struct store_nvme_index *ix, uint32_t ns_disk_id,
			    const char *name, size_t name_len);

/* store_nvme_index_ns_put, and (owner not 0) record the key of the
 * tenant that created the namespace in the same write, so that a warm
 * restart charges the namespace to it again. Same errors. */
int store_nvme_index_ns_put_owned(struct store_nvme_index *ix, uint32_t ns_disk_id,
				  const char *name, size_t name_len, uint64_t owner);

/* The creator's key recorded for namespace ns_disk_id, or 0 in *owner
 * when none was. Errors: -EIO. */
int store_nvme_index_ns_owner(struct store_nvme_index *ix, uint32_t ns_disk_id, uint64_t *owner);

/* Forget namespace ns_disk_id and every block record under it, in one
 * atomic, synced write (a range delete, plus a tombstone for the id and
 * the next disk id moved past it), so a drop holds after a crash or a
 * power loss once this returns, even when a demotion in flight still
 * writes a name or records under the id afterwards: ns_scan ignores a
 * tombstoned id for good. Blocks the caller for one log sync.
 * Errors: -EIO, -ENOMEM, -EINVAL (id 0). */
int store_nvme_index_ns_drop(struct store_nvme_index *ix, uint32_t ns_disk_id);

/* The next unused disk id (1 for a new index). Errors: -EIO. */
int store_nvme_index_next_ns_id(struct store_nvme_index *ix, uint32_t *out);

/* Call fn for every namespace that has no tombstone, in disk id order. fn's name is not
 * NUL-terminated and is valid during the call. A non-zero return from fn
 * stops the scan and is returned. Errors: -EIO, or fn's value. */
typedef int (*store_nvme_ns_fn)(void *arg, uint32_t ns_disk_id, const char *name,
				size_t name_len);
int store_nvme_index_ns_scan(struct store_nvme_index *ix, store_nvme_ns_fn fn, void *arg);

/* Call fn for every block record, in (disk id, key) order. A record that
 * does not decode (wrong size) is skipped and counted in *bad (may be
 * NULL). A non-zero return from fn stops the scan and is returned.
 * Errors: -EIO, or fn's value. */
typedef int (*store_nvme_rec_fn)(void *arg, const struct store_nvme_rec *rec);
int store_nvme_index_scan(struct store_nvme_index *ix, store_nvme_rec_fn fn, void *arg,
			  uint64_t *bad);

#endif /* KVPOOL_NVME_INDEX_H */
