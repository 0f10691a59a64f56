/*
 * index_recover.h - file-level helpers for opening a possibly damaged
 * NVMe index (index_recover.c; the policy is tier.c's and NVME.md's
 * "Index damage"). Internal to storage/nvme/. Plain POSIX file calls, no
 * locking: store_open's thread only, before the index is opened (survey,
 * keep) or after it is closed (quarantine).
 */
#ifndef KVPOOL_STORE_INDEX_RECOVER_H
#define KVPOOL_STORE_INDEX_RECOVER_H

#include <stddef.h>
#include <stdint.h>

/* Read the framing of every write-ahead log file (*.log) in RocksDB
 * directory `dir` and return in *max_seq the highest sequence number any
 * write batch in them ends at (0: none), in *files how many were read.
 * Unreadable files are skipped. 0, or -errno of opendir (a missing
 * directory is 0 with nothing found). */
int store_index_wal_survey(const char *dir, uint64_t *max_seq, uint32_t *files);

/* Hard-link every *.log file of `dir` into directory `keep` (created,
 * mode 0700), so that the files RocksDB replays and deletes survive as
 * evidence. Returns how many were linked, or -errno (opendir, mkdir). */
int store_index_wal_keep(const char *dir, const char *keep);

/* Remove what store_index_wal_keep made (no loss: nothing to keep). */
void store_index_wal_forget(const char *keep);

/* Rename directory `dir` aside, to "<dir>.damaged-<UTC stamp>[-N]"; the
 * name goes to aside. 0, or -errno of rename (e.g. -EROFS), -EEXIST. */
int store_index_quarantine(const char *dir, char *aside, size_t aside_len);

#endif /* KVPOOL_STORE_INDEX_RECOVER_H */
