/*
 * store.h - the pool itself: block index, DRAM arena, eviction, leases.
 *
 * No networking here and nothing of ours but storage/ headers: this module
 * builds and is unit-tested alone.
 *
 * Model
 *  - A block is identified by (namespace id, 32-byte block hash). It is
 *    immutable; a put of a stored key stores nothing (-EEXIST, a success).
 *  - Each block records its parent hash (32 zero bytes for a prompt's first
 *    block). Invariant: a block is present only if its stored parent is
 *    present ("no holes"). Eviction therefore only picks blocks that no
 *    resident block names as parent, least recently used first; DELETE and
 *    a failed checksum remove the block's descendants too.
 *  - Payload bytes live in one arena of dram_capacity bytes allocated at
 *    open; each payload starts on a 4 KiB boundary. The index and block
 *    headers live outside the arena (reported as index_bytes).
 *  - A PUT is two-phase: store_put_begin reserves arena space and returns
 *    where the caller writes the bytes; store_put_commit verifies the
 *    checksum (xxh3-64, seed 0) and makes the block visible. Until commit
 *    nothing is visible; store_put_abort frees the reservation.
 *  - A GET pins the block (a reference) until store_release, so the bytes
 *    can be sent from the arena without a copy; a pinned block is never
 *    evicted or reused.
 *  - A lease pins matched blocks for lease_ms on behalf of one connection
 *    (a "lessee"). A block's lease pin ends when a GET through the same
 *    lessee returns it, when lease_ms runs out (store_tick), or when the
 *    lessee is freed, whichever comes first.
 *
 * Threads: every function is thread-safe (one internal mutex; critical
 * sections never copy payload bytes). Functions return 0 or a negative
 * errno; out-parameters are written only on success.
 */
#ifndef KVPOOL_STORE_H
#define KVPOOL_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_BYTES 32
#define STORE_PAGE_BYTES 4096
#define STORE_NAME_MAX_BYTES 255

struct store;         /* the pool */
struct store_block;   /* one block (reservation or visible); opaque */
struct store_lessee;  /* lease holder, one per connection */

struct store_config {
	uint64_t dram_capacity_bytes;    /* arena; rounded down to 4 KiB; 4 KiB .. ~8 TiB */
	uint64_t max_block_bytes;        /* largest payload accepted */
	uint64_t max_inflight_put_bytes; /* reserved by uncommitted puts; 0 = no limit */
	uint32_t max_lease_ms;           /* lease_ms above this is capped */
};

/* Allocate the arena and an empty index.
 * Errors: -EINVAL (capacity < 4 KiB or > 2^31 - 1 pages, max_block_bytes == 0),
 *         -ENOMEM (arena or index allocation failed). */
int store_open(const struct store_config *cfg, struct store **out);

/* Fault in arena bytes [offset, offset + bytes) so that puts landing there
 * later do not pay for the kernel's page zeroing on the hot path (here
 * zeroing ran at ~0.4 GB/s, slower than the wire). Safe while the pool
 * serves: it never changes stored bytes, and takes no lock. A daemon calls
 * it chunk by chunk from a background thread at start-up; afterwards the
 * whole arena is committed memory. Returns the bytes populated, 0 when
 * offset is past the arena or the kernel cannot populate (< 5.14). */
uint64_t store_prefault(struct store *s, uint64_t offset, uint64_t bytes);

/* Free everything. Accepts NULL. Every reference and reservation must have
 * been released or aborted first; lessees are freed with it. */
void store_close(struct store *s);

/* Namespaces a pool holds at most: each costs index memory, a line in
 * STATS, and HELLO from any client may create one. */
#define STORE_MAX_NAMESPACES 4096

/* Find the namespace called name[0..name_len) or create it, and take a
 * user reference on it (one per bound connection), dropped with
 * store_namespace_release. Ids are 1, 2, ... in creation order and are not
 * reused while anything refers to the old namespace. A hash lookup: O(1),
 * the name is hashed outside the lock.
 * At STORE_MAX_NAMESPACES a new name reclaims the oldest namespace that
 * has no users, no visible blocks and no uncommitted puts: it is
 * forgotten (name, id and counters) and the new name gets a fresh id; a
 * later HELLO of the forgotten name creates a fresh, empty namespace.
 * Errors: -EINVAL (name_len 0 or > STORE_NAME_MAX_BYTES), -ENOMEM,
 *         -EDQUOT (STORE_MAX_NAMESPACES exist, none reclaimable, and this
 *         is a new name). */
int store_namespace_id(struct store *s, const char *name, size_t name_len, uint32_t *ns_id);

/* Drop one user reference taken by store_namespace_id (the connection
 * that said HELLO is closing). Call it once per successful
 * store_namespace_id; an unknown ns_id or one without users is ignored. */
void store_namespace_release(struct store *s, uint32_t ns_id);

/* Find the namespace called name[0..name_len) without creating it (for
 * a STATS request naming one). Allocates nothing and takes no reference:
 * the id may stop naming a namespace once it is reclaimed.
 * Errors: -EINVAL (name_len 0 or > STORE_NAME_MAX_BYTES), -ENOENT. */
int store_namespace_find(struct store *s, const char *name, size_t name_len, uint32_t *ns_id);

/* Remove every block of a namespace (the namespace itself stays, empty).
 * Blocks still referenced by a GET in flight disappear from the index at
 * once and their bytes are freed at their last store_release.
 * *blocks and *bytes (either may be NULL) receive what was removed.
 * Errors: -ENOENT (unknown ns_id). */
int store_drop_namespace(struct store *s, uint32_t ns_id, uint64_t *blocks, uint64_t *bytes);

/* ---- PUT ---------------------------------------------------------------- */

/* The parent is an earlier block of the same PUT batch, committed before
 * this one: skip the parent check at begin, do it at commit. */
#define STORE_PUT_PARENT_IN_BATCH 0x1u

/* Reserve length bytes for block (ns_id, key) whose parent is `parent`
 * (NULL, or 32 zero bytes, for a first block). On 0, *out is the
 * reservation and *dst the 4 KiB-aligned place (length bytes) where the
 * caller writes the payload; the reservation counts against
 * max_inflight_put_bytes until commit or abort. The parent (if any) is
 * pinned until then. May evict.
 * Errors:
 *   -EEXIST    key already stored: success, nothing reserved
 *   -ENOLINK   parent given, not stored, and not STORE_PUT_PARENT_IN_BATCH
 *   -EINVAL    length 0, or unknown ns_id
 *   -EMSGSIZE  length > max_block_bytes or > the arena
 *   -EAGAIN    reserving would exceed max_inflight_put_bytes (retry later)
 *   -ENOSPC    not enough space even after evicting everything evictable
 *              (what was evicted on the way stays evicted)
 *   -ENOMEM    no memory for the block header */
int store_put_begin(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    const uint8_t *parent, uint32_t flags, uint64_t length, uint64_t checksum,
		    struct store_block **out, void **dst);

/* Verify the payload's checksum and make the block visible. Always
 * consumes the reservation (on error its space is freed).
 * Errors:
 *   -EEXIST    a concurrent put of the same key committed first: success,
 *              this copy is dropped
 *   -EBADMSG   checksum mismatch (counted in checksum_errors)
 *   -ENOLINK   the parent is not stored (STORE_PUT_PARENT_IN_BATCH case) */
int store_put_commit(struct store *s, struct store_block *b);

/* Drop a reservation (connection died, payload timed out). Consumes it. */
void store_put_abort(struct store *s, struct store_block *b);

/* ---- GET, EXISTS, MATCH, DELETE ---------------------------------------- */

struct store_ref {
	struct store_block *block; /* pass to store_release */
	const void *data;          /* length bytes, valid until store_release */
	uint64_t length;
	uint64_t checksum;         /* xxh3-64 taken when the block arrived */
	uint8_t tier;              /* 1 = DRAM (values as enum proto_tier) */
};

/* Look up and pin a visible block, count a hit or miss, and mark it used.
 * If `lessee` (may be NULL) holds a lease on it, that lease pin ends.
 * Errors: -ENOENT (miss or unknown ns_id). */
int store_get(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
	      struct store_lessee *lessee, struct store_ref *out);

/* Unpin a block returned by store_get. Any thread; accepts NULL. */
void store_release(struct store *s, struct store_block *b);

/* Is the block visible? Counts an exists hit or miss; not a use.
 * *length may be NULL. Errors: -ENOENT. */
int store_exists(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *length);

/* Prefix match: *matched = number of leading keys[0..count) stored. Marks
 * every matched block used. With lease_ms > 0 (capped at max_lease_ms) and
 * a lessee, pins the matched blocks; *lease_ms_granted (may be NULL)
 * receives the capped value (0 when nothing was leased). A lessee holds
 * at most one lease per block; matching it again extends it.
 * Errors: -EINVAL (unknown ns_id), -ENOMEM (no memory for lease records;
 * nothing was leased or marked used). */
int store_match(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		uint32_t count, uint32_t lease_ms, struct store_lessee *lessee,
		uint32_t *matched, uint32_t *lease_ms_granted);

/* Remove a block and all its resident descendants. *removed (may be NULL)
 * receives the number of blocks removed. Pinned blocks leave the index at
 * once; their bytes are freed at their last release. Errors: -ENOENT. */
int store_delete(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *removed);

/* ---- leases -------------------------------------------------------------- */

/* A lease holder for one connection. Returns NULL on allocation failure. */
struct store_lessee *store_lessee_new(struct store *s);
/* End every lease the lessee holds and free it. Accepts NULL. */
void store_lessee_free(struct store *s, struct store_lessee *l);

/* End leases whose time has run out (CLOCK_MONOTONIC). Call it every
 * ~100 ms; returns the number of lease pins ended. */
uint64_t store_tick(struct store *s);

/* ---- statistics -------------------------------------------------------- */

struct store_stats {
	uint64_t capacity_bytes;       /* arena size */
	/* arena bytes (4 KiB rounded) of committed blocks whose pages are
	 * not free yet: visible blocks, plus removed blocks a GET still pins
	 * (pinned_removed_bytes). used + inflight_put + free = capacity. */
	uint64_t used_bytes;
	uint64_t pinned_removed_bytes; /* of used_bytes: deleted/evicted, freed at last release */
	uint64_t payload_bytes;        /* payload bytes of visible blocks */
	uint64_t inflight_put_bytes;   /* arena bytes reserved by uncommitted puts */
	uint64_t free_bytes;
	uint64_t largest_free_bytes;   /* largest contiguous free extent */
	double fragmentation;          /* 1 - largest_free / free (0 when free == 0) */
	uint64_t index_bytes;          /* memory of index and block headers, outside the arena */
	uint64_t blocks;               /* visible blocks */
	uint64_t evictions;
	uint64_t leases_active;        /* lease pins held now */
	uint64_t checksum_errors;
	uint32_t namespaces;           /* held now (not reclaimed), <= STORE_MAX_NAMESPACES */
};

struct store_ns_stats {
	char name[STORE_NAME_MAX_BYTES + 1]; /* NUL-terminated */
	uint32_t ns_id;
	uint64_t blocks, bytes;              /* visible blocks and their payload bytes */
	uint64_t puts, put_exists, put_errors; /* blocks stored; -EEXIST; other refusals */
	uint64_t get_hits, get_misses;
	uint64_t exists_hits, exists_misses;
	uint64_t match_requests, match_blocks_queried, match_blocks_matched;
	uint64_t evictions, deletes;         /* deletes: blocks removed by store_delete */
};

void store_stats(struct store *s, struct store_stats *out);
/* Namespace number `index` (0 .. stats.namespaces-1, in creation order;
 * indexes shift down when an older namespace is reclaimed).
 * Errors: -ENOENT past the end. */
int store_ns_stats(struct store *s, uint32_t index, struct store_ns_stats *out);

/* Verify every invariant: no holes, child counts, LRU membership, arena
 * and byte accounting, used + inflight + free = capacity, the namespace
 * name table. Returns 0, or -EFAULT with a reason in
 * why[0..why_len) (may be NULL). For tests; takes the lock; O(blocks). */
int store_check(struct store *s, char *why, size_t why_len);

#endif /* KVPOOL_STORE_H */
