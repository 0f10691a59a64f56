/*
 * store.h - the pool itself: block index, DRAM arena, eviction, leases.
 *
 * No networking here and nothing of ours but storage/ headers (and proto/'s
 * header-only checksum helper, proto_xxh3.h): this module builds and is
 * unit-tested alone. The rooms of storage/ are listed in storage/README.md.
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
 *  - A retention keeps a block (and its stored ancestors: no holes) from
 *    eviction until a deadline, within a budget per tenant or namespace
 *    (store_retain, store_put_commit_retain, store_match_ex).
 *  - A lease pins matched blocks for lease_ms on behalf of one connection
 *    (a "lessee"). A block's lease pin ends when a GET through the same
 *    lessee returns its bytes (a GET that only learns its size, or whose
 *    buffer is too small, leaves the lease alone: store_get_fit_async),
 *    when lease_ms runs out (store_tick), or when the lessee is freed,
 *    whichever comes first.
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
/* Where a block's bytes came from or lie (store_ref.tier,
 * store_exists_where); the wire's PROTO_TIER_* values, which the server
 * checks at build time (server/srv_consts.c). */
#define STORE_TIER_DRAM 1
#define STORE_TIER_NVME 2

struct store;         /* the pool */
struct store_block;   /* one block (reservation or visible); opaque */
struct store_lessee;  /* lease holder, one per connection */

/* Which blocks the NVMe tier takes when DRAM must make room. */
enum store_admission {
	STORE_ADMIT_ALL = 0,    /* every block leaving DRAM is demoted */
	STORE_ADMIT_REUSED = 1, /* only blocks used (GET or MATCH) at least once after their put;
				 * the others are evicted (a block with stored children is
				 * demoted anyway: no holes) */
};

/* Log levels given to store_config.log. */
enum store_log_level { STORE_LOG_ERR = 0, STORE_LOG_WARN, STORE_LOG_INFO, STORE_LOG_DEBUG };

/* Where storage/ writes log lines: msg is one line without a newline,
 * lowercase, valid only during the call. Called from any store thread
 * (callers' threads and the store's I/O threads), without the store lock.
 * Repeated I/O errors are rate-limited by the store before they get here. */
typedef void (*store_log_fn)(void *arg, enum store_log_level level, const char *msg);

struct store_config {
	uint64_t dram_capacity_bytes;    /* arena; rounded down to 4 KiB; 4 KiB .. ~8 TiB */
	uint64_t max_block_bytes;        /* largest payload accepted */
	uint64_t max_inflight_put_bytes; /* reserved by uncommitted puts; 0 = no limit */
	uint32_t max_lease_ms;           /* lease_ms above this is capped */
	/* Retention (store_retain): retain_ms above max_retain_ms is capped
	 * (0 = no retention is ever granted); max_retained_bytes is the
	 * payload bytes each namespace that is charged to no tenant may
	 * retain, and a new tenant's budget (store_tenant_retain_budget);
	 * 0 = none may be retained. max_retained_total_bytes bounds the
	 * payload bytes retained in the whole pool, whoever holds them, so
	 * that ordinary blocks always have room (0 = no pool-wide bound). */
	uint32_t max_retain_ms;
	uint64_t max_retained_bytes;
	uint64_t max_retained_total_bytes;

	/* NVMe tier (storage/nvme/NVME.md). NULL or "" = no NVMe tier, and every
	 * nvme_* field below is ignored. */
	const char *nvme_dir;            /* an existing, writable directory; copied at open */
	uint64_t nvme_capacity_bytes;    /* segment file bytes at most; >= 2 segments */
	uint64_t nvme_segment_bytes;     /* 0 = 256 MiB, lowered to capacity / 8 when that is
					  * smaller (4 KiB multiple, >= max_block_bytes rounded up,
					  * < 16 TiB) */
	uint32_t nvme_io_threads;        /* demotion/promotion threads; 0 = 2 */
	enum store_admission nvme_admission;

	store_log_fn log;                /* NULL = no log lines */
	void *log_arg;
};

/* Allocate the arena and an empty index. With an NVMe tier, also lock the
 * directory, check its format version, open the segment files and the
 * RocksDB index, rebuild the index of every block on NVMe (dropping and
 * counting orphans), and start the I/O threads; this can take seconds
 * (rebuild_ms in store_stats). why[0..why_len) (may be NULL) receives a
 * one-line reason on failure, naming the path.
 * Errors: -EINVAL (capacity < 4 KiB or > 2^31 - 1 pages, max_block_bytes == 0,
 *                  nvme_capacity below two segments),
 *         -ENOMEM (arena or index allocation failed),
 *         -ENOENT / -ENOTDIR (nvme_dir missing or not a directory),
 *         -EACCES (nvme_dir not writable),
 *         -EBUSY (nvme_dir locked by another process),
 *         -EPROTONOSUPPORT (nvme_dir holds an on-disk format this build cannot read),
 *         -EIO (the segment files or the RocksDB index cannot be opened or read). */
int store_open(const struct store_config *cfg, struct store **out, char *why, size_t why_len);

/* Wait until every promotion started by store_get_async has called its
 * done callback, and stop starting new ones (store_get_async then answers
 * from DRAM only; NVMe-only blocks count as misses). Demotions stop at a
 * block boundary: a block is either fully demoted and indexed or not at
 * all. For shutdown, before the caller releases its last references and
 * calls store_close. */
void store_drain(struct store *s);

/* For a planned restart: write the pool's DRAM-only blocks to NVMe,
 * retained ones first, then hottest (most recently used) first, each
 * after its DRAM-only ancestors
 * (so that what is written is reachable at the next start), for at most
 * timeout_ms; nvme_admission does not apply. Call after the last put and
 * before store_drain; the pool keeps serving meanwhile. *kept (may be
 * NULL) receives the blocks written by this call, *left (may be NULL)
 * those still DRAM-only. Blocks the caller (waits on the demoter).
 * Returns 0 (none left), -ETIMEDOUT (time ran out first), -EIO (the tier
 * cannot take writes: a write failed, or no segment can be freed),
 * -ENODEV (no NVMe tier). */
int store_keep_dram(struct store *s, uint64_t timeout_ms, uint64_t *kept, uint64_t *left);

/* Fault in arena bytes [offset, offset + bytes) so that puts landing there
 * later do not pay for the kernel's page zeroing on the hot path (here
 * zeroing ran at ~0.4 GB/s, slower than the wire). Safe while the pool
 * serves: it never changes stored bytes, and takes no lock. A daemon calls
 * it chunk by chunk from a background thread at start-up; afterwards the
 * whole arena is committed memory. Returns the bytes populated, 0 when
 * offset is past the arena or the kernel cannot populate (< 5.14). */
uint64_t store_prefault(struct store *s, uint64_t offset, uint64_t bytes);

/* The arena as one region: *base (its first payload byte) and *bytes
 * (every page of it), fixed from store_open to store_close. For a
 * transport that registers the whole arena with a NIC once (rdma/).
 * Every block's bytes (put_begin's dst, a ref's data) lie inside it.
 * Cannot fail; takes no lock. */
void store_arena_region(const struct store *s, void **base, uint64_t *bytes);

/* Stop the I/O threads (as store_drain), close the NVMe tier's files and
 * free everything. Accepts NULL. Every reference and reservation must have
 * been released or aborted first; lessees are freed with it. What is on
 * NVMe stays there for the next open; DRAM-only blocks are gone. */
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

/* Forget namespace ns_id now (name, id, counters, quota), as a reclaim
 * at STORE_MAX_NAMESPACES would, if it has no users, no visible blocks
 * and no uncommitted puts; e.g. one that only a waiting MATCH created,
 * once its connection is gone. O(namespaces).
 * Errors: -ENOENT (no such namespace), -EBUSY (in use or not empty:
 * nothing changes). */
int store_namespace_forget(struct store *s, uint32_t ns_id);

/* Find the namespace called name[0..name_len) without creating it (for
 * a STATS request naming one). Allocates nothing and takes no reference:
 * the id may stop naming a namespace once it is reclaimed.
 * Errors: -EINVAL (name_len 0 or > STORE_NAME_MAX_BYTES), -ENOENT. */
int store_namespace_find(struct store *s, const char *name, size_t name_len, uint32_t *ns_id);

/* Limit namespace ns_id to quota_bytes of payload: its visible blocks
 * (either tier) plus its uncommitted puts; 0 = no limit (the default).
 * A store_put_begin that would go over first evicts the namespace's own
 * least recently used blocks that nothing depends on (no stored children,
 * no GET in flight, no lease), from both tiers, and answers -EDQUOT only
 * when that is not enough. Each such eviction scans the namespace's
 * blocks: O(blocks of the namespace). Lowering a quota evicts nothing by
 * itself; the next put does. The quota is forgotten if the namespace is
 * reclaimed. Errors: -ENOENT (unknown ns_id). */
int store_namespace_quota(struct store *s, uint32_t ns_id, uint64_t quota_bytes);

/* ---- tenants --------------------------------------------------------------
 * A tenant is who is billed: every block is charged to the tenant that
 * wrote it (store_put_begin_for; visible + reserved payload bytes, in
 * whatever namespace), every namespace to the tenant that created it
 * (store_namespace_tenant), every lease to its lessee's tenant. Limits:
 * max_bytes of payload over the blocks it wrote (a store_put_begin_for
 * that would pass it first evicts the least recently used leaves it wrote
 * in the namespace being written, then fails -EDQUOT; another tenant's
 * blocks are never evicted for it), and max_leased_bytes of leased blocks
 * over all its lessees (store_match). 0 means no limit. */
struct store_tenant;

/* A new tenant, owned by the store and freed by store_close (there is no
 * other destructor: namespaces outlive connections). NULL on -ENOMEM. */
struct store_tenant *store_tenant_new(struct store *s, uint64_t max_bytes,
				      uint64_t max_leased_bytes);

/* The tenant known by `key` (a stable name of whoever is billed, e.g. the
 * first 8 bytes of a token's digest; not 0), with these limits: the one
 * an earlier call or a warm restart made (blocks and namespaces rebuilt
 * from NVMe whose records name this key are charged to it, so a restart
 * keeps every block billed to its writer and every namespace to its
 * creator), else a new one. key 0: as store_tenant_new. The key is kept
 * in the NVMe index with the blocks the tenant writes and the namespaces
 * it creates. Owned by the store. NULL on -ENOMEM. */
struct store_tenant *store_tenant_new_keyed(struct store *s, uint64_t key, uint64_t max_bytes,
					    uint64_t max_leased_bytes);

/* Change a tenant's limits; lowering them evicts nothing and ends no lease
 * by itself. Cannot fail. */
void store_tenant_limits(struct store *s, struct store_tenant *t, uint64_t max_bytes,
			 uint64_t max_leased_bytes);

/* A tenant's payload bytes (of the blocks it wrote) and leased bytes now
 * (either may be NULL). */
void store_tenant_usage(struct store *s, const struct store_tenant *t, uint64_t *bytes,
			uint64_t *leased_bytes);

/* How many namespaces are charged to tenant t now (store_namespace_tenant;
 * a reclaimed namespace counts no more). Cannot fail. */
uint32_t store_tenant_namespaces(struct store *s, const struct store_tenant *t);

/* Charge namespace ns_id to tenant t - its creator - if it is charged to
 * none yet (a namespace keeps its first tenant until it is reclaimed): it
 * counts in store_tenant_namespaces(t). Call it only for the tenant that
 * created the namespace. No block is charged by this: every block stays
 * charged to its writer (blocks rebuilt from NVMe records that name no
 * writer stay charged to nobody). t NULL: no-op.
 * Errors: -EINVAL (unknown ns_id). */
int store_namespace_tenant(struct store *s, uint32_t ns_id, struct store_tenant *t);

/* Remove every block of a namespace (the namespace itself stays, empty),
 * from both tiers; on NVMe the drop is recorded and the index log synced
 * before this returns (one atomic write with a tombstone for the old disk
 * id, which nothing written under it later can outlive), so it holds
 * after a restart, a crash of the process or a power loss. Blocks for
 * that sync when the namespace had reached NVMe.
 * Blocks still referenced by a GET in flight disappear from the index at
 * once and their bytes are freed at their last store_release.
 * *blocks and *bytes (either may be NULL) receive what was removed.
 * Errors: -ENOENT (unknown ns_id); -EIO (removed from memory, but the
 * drop could not be written to the NVMe index: the tier is marked
 * unhealthy and retries it in the background, and at close). */
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
 * pinned until then. May evict (with an NVMe tier: drops clean DRAM
 * copies, and evicts only while the tier cannot take blocks).
 * Errors:
 *   -EEXIST    key already stored: success, nothing reserved
 *   -ENOLINK   parent given, not stored, and not STORE_PUT_PARENT_IN_BATCH
 *   -EINVAL    length 0, or unknown ns_id
 *   -EMSGSIZE  length > max_block_bytes or > the arena
 *   -EAGAIN    reserving would exceed max_inflight_put_bytes, or (NVMe tier)
 *              the room is held by dirty DRAM copies the demoter has yet to
 *              write (it is woken; retry later)
 *   -ENOSPC    not enough space even after evicting everything evictable
 *              (what was evicted on the way stays evicted)
 *   -EDQUOT    length more bytes would exceed the namespace's quota even
 *              after evicting within it (store_namespace_quota; what was
 *              evicted on the way stays evicted)
 *   -ENOMEM    no memory for the block header */
int store_put_begin(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    const uint8_t *parent, uint32_t flags, uint64_t length, uint64_t checksum,
		    struct store_block **out, void **dst);

/* store_put_begin on behalf of tenant `writer`: the block's bytes are
 * charged to it (also while reserved) and count against its max_bytes;
 * to make room under that limit only leaves of namespace ns_id that it
 * wrote are evicted. writer NULL: the namespace's tenant, if any
 * (store_namespace_tenant), which is what store_put_begin does. Same
 * errors as store_put_begin (-EDQUOT also for the writer's max_bytes). */
int store_put_begin_for(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			const uint8_t *parent, uint32_t flags, uint64_t length, uint64_t checksum,
			struct store_tenant *writer, struct store_block **out, void **dst);

/* Verify the payload's checksum and make the block visible. Always
 * consumes the reservation (on error its space is freed).
 * Errors:
 *   -EEXIST    a concurrent put of the same key committed first: success,
 *              this copy is dropped
 *   -EBADMSG   checksum mismatch (counted in checksum_errors)
 *   -ENOLINK   the parent is not stored (STORE_PUT_PARENT_IN_BATCH case) */
int store_put_commit(struct store *s, struct store_block *b);

/* store_put_commit for a caller that hashed the payload itself while
 * writing it (the TCP receive path hashes each chunk as it lands, while
 * the bytes are still in cache): sum is the xxh3-64 (seed 0) of the
 * length bytes the caller wrote at *dst, and is trusted to be that; it is
 * compared with the checksum given to store_put_begin instead of reading
 * the block again. Consumes the reservation like store_put_commit, with
 * the same errors (-EBADMSG: sum is not the checksum given at begin). */
int store_put_commit_hashed(struct store *s, struct store_block *b, uint64_t sum);

/* Drop a reservation (connection died, payload timed out). Consumes it. */
void store_put_abort(struct store *s, struct store_block *b);

/* ---- retention -------------------------------------------------------------
 * A retained block is not evicted before its deadline passes: eviction
 * takes unretained blocks only (chain tails first, least recently used
 * first), so when nothing else can go a PUT answers -ENOSPC rather than
 * break a retention. With an NVMe tier a retained block may still be
 * demoted (its DRAM copy dropped), and segment reclaim keeps it; its
 * deadline is kept in its NVMe record (CLOCK_REALTIME) and survives a
 * warm restart. Retaining a block retains its stored ancestors at least
 * as long (no holes). An expired retention makes the block ordinary
 * again (store_tick, and every eviction pass, end them). DELETE, a
 * namespace drop, a failed checksum remove a retained block as any other.
 *
 * Budget: a retention is charged to the tenant that asks for it (the
 * retainer of store_put_retain_by, store_put_commit_retain_by and
 * store_match_opts; NULL: the namespace's tenant), in whatever namespace:
 * the payload bytes a tenant retains may not pass its budget
 * (store_tenant_retain_budget, default cfg.max_retained_bytes). A
 * retention charged to no tenant counts against its namespace's
 * cfg.max_retained_bytes. A tenant that extends a retention another
 * holder set takes it over (and pays for it from then on); one that
 * asks for no longer than the deadline in force changes nothing and
 * pays nothing. The pool's retained bytes may not pass
 * cfg.max_retained_total_bytes (when not 0), whoever asks.
 * A retention that would pass it is refused (STORE_PUT_RETAIN_BUDGET), not
 * an error: the block stays stored, unretained. Extending a retention
 * costs nothing. A retention never evicts anything, so one tenant's
 * retentions never push out another tenant's retained blocks. */

/* Outcome bits of one block's retention: the wire's PUT result flags
 * (PROTO_PUT_*, checked at build time in server/srv_consts.c). */
#define STORE_PUT_RETAINED        0x01u /* retained (set or extended) for retain_ms */
#define STORE_PUT_RETAIN_BUDGET   0x02u /* asked, refused for the budget: stored without it */
#define STORE_PUT_RETAIN_CLAMPED  0x04u /* retain_ms was cut to max_retain_ms */

struct store_retain_res {
	uint32_t retain_ms; /* granted (0 when none was) */
	uint32_t flags;     /* STORE_PUT_RETAIN* bits */
};

/* Retain visible block (ns_id, key) for retain_ms from now (capped at
 * max_retain_ms; 0 = nothing asked, *out says 0): a block already
 * retained longer keeps its deadline. Its stored ancestors are retained
 * at least as long. *out (may be NULL) receives the outcome. For a PUT
 * whose key is already stored (-EEXIST) with retain_ms: the refresh.
 * Errors: -EINVAL (unknown ns_id), -ENOENT (not stored). Without memory
 * for a retention record the block is not retained (flags 0). */
int store_put_retain(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint32_t retain_ms, struct store_retain_res *out);
/* store_put_retain on behalf of tenant `by` (NULL: the namespace's
 * tenant), who is charged and bounded. Same errors. */
int store_put_retain_by(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			uint32_t retain_ms, struct store_tenant *by, struct store_retain_res *out);

/* store_put_commit (sum NULL) or store_put_commit_hashed (*sum) that
 * also retains the block for retain_ms (as store_retain) under the same
 * lock as its commit, so it is never evicted in between; on -EEXIST (a
 * concurrent put committed first) the stored block is retained instead.
 * *out (may be NULL) receives the outcome (all 0 on other errors).
 * Errors: as store_put_commit. */
int store_put_commit_retain(struct store *s, struct store_block *b, const uint64_t *sum,
			    uint32_t retain_ms, struct store_retain_res *out);
/* store_put_commit_retain whose retention is charged to, and bounded
 * by, tenant `by` (NULL: the namespace's tenant). Same errors. */
int store_put_commit_retain_by(struct store *s, struct store_block *b, const uint64_t *sum,
			       uint32_t retain_ms, struct store_tenant *by,
			       struct store_retain_res *out);

/* Set tenant t's retention budget: payload bytes it may hold retained,
 * over every namespace (0 = none). Lowering it ends no retention; new ones are refused
 * until retained bytes fall below it. Cannot fail. */
void store_tenant_retain_budget(struct store *s, struct store_tenant *t,
				uint64_t max_retained_bytes);

/* What a tenant or namespace retains, and its counters. */
struct store_retain_stats {
	uint64_t blocks, bytes;    /* retained now (payload bytes) */
	uint64_t budget_bytes;     /* the budget that bounds it */
	uint64_t refused;          /* blocks whose retention the budget refused */
	uint64_t expired;          /* retentions that ran out */
};

/* Tenant t's retention figures. Cannot fail. */
void store_tenant_retain_stats(struct store *s, const struct store_tenant *t,
			       struct store_retain_stats *out);

/* ---- GET, EXISTS, MATCH, DELETE ---------------------------------------- */

struct store_ref {
	struct store_block *block; /* pass to store_release */
	const void *data;          /* length bytes, valid until store_release */
	uint64_t length;
	uint64_t checksum;         /* xxh3-64 taken when the block arrived */
	uint8_t tier;              /* STORE_TIER_DRAM, or STORE_TIER_NVME: promoted for this GET */
};

/* Look up and pin a visible block, count a hit or miss, and mark it used.
 * If `lessee` (may be NULL) holds a lease on it, that lease pin ends.
 * A block only on NVMe is promoted first and this call WAITS for the
 * read (tools and tests; an event loop uses store_get_async).
 * Errors: -ENOENT (miss or unknown ns_id, or a failed NVMe read as for
 * store_get_async), -EAGAIN (no DRAM room to promote into). */
int store_get(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
	      struct store_lessee *lessee, struct store_ref *out);

/* Called once by store_get_async when a promotion ends, from a store I/O
 * thread, without the store lock. status 0: the block is in DRAM and
 * pinned, the caller's store_ref is filled (tier = 2: it came from NVMe).
 * Otherwise the store_ref is untouched and status is -ENOENT (the block
 * was removed meanwhile, or its NVMe copy failed its checksum or could not
 * be read: counted in corrupt_blocks / nvme_read_errors, and the block and
 * its descendants are gone from both tiers) or -EAGAIN (no DRAM room to
 * promote into right now: retry). The callback must not block; it may
 * call store_release. */
typedef void (*store_get_done_fn)(void *arg, int status);

/* store_get for an event loop: never waits on disk.
 * Returns 0 when the block is in DRAM (*out filled and pinned, done is
 * not called), -ENOENT on a miss, or -EINPROGRESS when the block is only
 * on NVMe: a promotion has started (or joined one already running for
 * the same block) and done(arg, status) will be called exactly once,
 * later, from another thread, filling *out first on success. *out must
 * stay valid until then. Hits, misses and the lease pin are counted and
 * ended as in store_get. After store_drain it never returns -EINPROGRESS
 * (an NVMe-only block answers -ENOENT). Errors: -ENOENT, -ENOMEM. */
int store_get_async(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		    struct store_lessee *lessee, struct store_ref *out,
		    store_get_done_fn done, void *arg);

/* store_get_async for a GET entry whose buffer holds max_length bytes.
 * A visible block longer than that is answered -EMSGSIZE: out->length
 * receives its size and out->tier where it lies (STORE_TIER_DRAM or
 * STORE_TIER_NVME), the rest of *out is zeroed, and nothing else
 * happens: the block is not pinned, promoted, marked used or counted as
 * a hit, and a lease `lessee` holds on it stays. So a client that asks
 * the sizes first (max_length 0) and then fetches keeps its lease until
 * the fetch: only a GET that returns the bytes ends a lease pin.
 * Otherwise exactly store_get_async (max_length UINT64_MAX is
 * store_get_async). Errors: -ENOENT, -ENOMEM, -EMSGSIZE (above). */
int store_get_fit_async(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
			uint64_t max_length, struct store_lessee *lessee, struct store_ref *out,
			store_get_done_fn done, void *arg);

/* Unpin a block returned by store_get. Any thread; accepts NULL. */
void store_release(struct store *s, struct store_block *b);

/* Is the block visible? Counts an exists hit or miss; not a use.
 * *length may be NULL. Errors: -ENOENT. */
int store_exists(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *length);

/* store_exists that also says where the block is: *tier = STORE_TIER_DRAM
 * when it has a DRAM copy (a GET answers at once), STORE_TIER_NVME when it
 * is only on NVMe (a GET reads it first). length and tier may be NULL. Errors: -ENOENT. */
int store_exists_where(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		       uint64_t *length, uint8_t *tier);

/* Prefix match: *matched = number of leading keys[0..count) stored. Marks
 * every matched block used. With lease_ms > 0 (capped at max_lease_ms) and
 * a lessee, pins the matched blocks; *lease_ms_granted (may be NULL)
 * receives the capped value (0 when nothing was leased). A lessee holds
 * at most one lease per block; matching it again extends it.
 *
 * Takes no lock on its usual path (storage/match.c): the lookups read the
 * index in seqlock read sections, one hash probe per key, and the marks,
 * lease pins and namespace counters are logged per thread and applied by
 * the next holder of the store lock, before any eviction decides. So a
 * block this call matched with a lease is never evicted before the lease
 * ends; its recency counts from when the log is applied (microseconds, at
 * most one store_tick later). A lessee must be used by one thread at a
 * time (a connection's worker), and freed by the thread that used it
 * last. Rare cases take the lock as before: more than 128 threads
 * matching, a MATCH of more than 16,383 keys, a log that stays full,
 * or a long write (e.g. dropping a large namespace) in progress.
 * A lease never makes MATCH fail: when the lease of the whole present run
 * would take the lessee or its tenant past its bound (store_lessee_limit),
 * *matched is the longest leading run whose lease fits, and only that run
 * is leased and marked used (the lease is "cut"; 0 when not even the first
 * block fits).
 * Errors: -EINVAL (unknown ns_id), -ENOMEM (no memory for lease records,
 * on the locked path; nothing was leased or marked used). On the lock-free
 * path a lease record that cannot be allocated when the log is applied
 * leaves that block unpinned, as if its lease had ended early. */
int store_match(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		uint32_t count, uint32_t lease_ms, struct store_lessee *lessee,
		uint32_t *matched, uint32_t *lease_ms_granted);

/* How many leading keys of keys[0..count) namespace ns_id holds now
 * (*present), with no effect at all: no use mark, no lease, no counter
 * (store_match does all three). For a caller that watches a chain fill
 * (a MATCH that waits) without disturbing eviction order or statistics.
 * Lock-free on its usual path, as store_match (one probe per key in
 * seqlock read sections); an unknown ns_id holds nothing (*present 0).
 * Any thread. Cannot fail: returns 0. */
int store_present(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		  uint32_t count, uint32_t *present);

/* MATCH with options (protocol v2, PROTOCOL.md section 14): the flags
 * of store_match_res. Their values are the wire's PROTO_MATCH_* flags,
 * which the server checks at build time (server/srv_consts.c). */
#define STORE_MATCH_LEASE_CUT 0x001u      /* the present run's lease would pass a bound:
					     matched is the longest leading run whose
					     lease fits (present > matched) */
#define STORE_MATCH_RETAIN_BUDGET 0x040u  /* retention refused for the budget */
#define STORE_MATCH_RETAIN_CLAMPED 0x080u /* retain_ms cut to the pool's maximum */

struct store_match_opts {
	uint32_t lease_ms;            /* 0: no lease; capped at max_lease_ms */
	uint32_t retain_ms;           /* 0: no retention; > 0: keep the matched run at
					 least this long from now (refresh on hit) */
	struct store_lessee *lessee;  /* who holds the lease; NULL: no lease */
	struct store_tenant *retainer; /* charged for the retention (store_put_retain_by);
					  NULL: the namespace's tenant */
};

struct store_match_res {
	uint32_t matched;   /* leading keys answered (leased, when a lease was granted) */
	uint32_t present;   /* leading keys stored: >= matched; > matched only with
			       STORE_MATCH_LEASE_CUT */
	uint32_t lease_ms;  /* lease granted: 0 when nothing was leased */
	uint32_t retained;  /* leading blocks whose retention was set or extended */
	uint32_t retain_ms; /* retention granted: 0 when retained is 0 */
	uint32_t flags;     /* STORE_MATCH_* */
};

/* store_match with options and a full result; store_match is this call
 * with lease_ms and lessee only. present is the leading run stored;
 * matched the run answered, shorter only with STORE_MATCH_LEASE_CUT (the
 * lease of the whole present run would pass the lessee's or its tenant's
 * bound: matched is the longest leading run whose lease fits). With
 * opts->retain_ms > 0 (capped at max_retain_ms: STORE_MATCH_RETAIN_CLAMPED)
 * the matched run is retained as store_put_retain does, leading blocks
 * first, as far as the budget allows (STORE_MATCH_RETAIN_BUDGET when it
 * stopped short; res->retained says how many, res->retain_ms what was
 * granted). A MATCH with retain_ms takes the store lock (budgets are
 * decided exactly) instead of the lock-free path, and matches and retains
 * under one hold of it. Same locking, threads and errors as store_match;
 * *res is written only on success. */
int store_match_ex(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		   uint32_t count, const struct store_match_opts *opts,
		   struct store_match_res *res);

/* Remove a block and all its resident descendants. *removed (may be NULL)
 * receives the number of blocks removed. Pinned blocks leave the index at
 * once; their bytes are freed at their last release. With an NVMe tier,
 * when any of them had an NVMe copy (or a demotion in flight), the call
 * returns only once their record deletes are written and the index log
 * is synced, so a crash or power loss after it cannot bring them back:
 * it blocks for one log sync, and for a demotion batch in flight.
 * Errors: -ENOENT; -EIO (the blocks are gone from memory, but their
 * removal could not be written to the NVMe index: it is retried, and the
 * tier is marked unhealthy meanwhile). */
int store_delete(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES],
		 uint64_t *removed);

/* store_delete of count keys (a DELETE request) with one durability step
 * for all of them: one record-delete write and one log sync, not one per
 * key. statuses[i] receives key i's result: 0 (removed with its
 * descendants), -ENOENT (absent, or removed earlier in this batch as a
 * descendant), or -EIO (removed from memory, but the batch's removal
 * could not be written to the NVMe index: retried, the tier marked
 * unhealthy). *removed (may be NULL) receives the blocks removed when no
 * status is -EIO. Returns 0, or -EINVAL (keys or statuses NULL with
 * count > 0). */
int store_delete_many(struct store *s, uint32_t ns_id, const uint8_t (*keys)[STORE_KEY_BYTES],
		      uint32_t count, int *statuses, uint64_t *removed);

/* ---- leases -------------------------------------------------------------- */

/* A lease holder for one connection. Returns NULL on allocation failure. */
struct store_lessee *store_lessee_new(struct store *s);
/* End every lease the lessee holds and free it. Accepts NULL. */
void store_lessee_free(struct store *s, struct store_lessee *l);

/* Bound what lessee l may lease: max_leased_bytes of payload (0 = no
 * bound), and, with t, t's max_leased_bytes over all of t's lessees. A
 * store_match with a lease that would take either past its bound answers
 * the longest leading run whose lease fits; blocks the lessee leases
 * already count once (matching them again only extends). A bounded
 * lessee's leasing MATCHes take the store lock (the check must be exact)
 * instead of the lock-free path. Call it from the lessee's thread.
 * Cannot fail. */
void store_lessee_limit(struct store *s, struct store_lessee *l, uint64_t max_leased_bytes,
			struct store_tenant *t);

/* Payload bytes of the blocks lessee l leases now. */
uint64_t store_lessee_leased_bytes(struct store *s, const struct store_lessee *l);

/* End leases whose time has run out (CLOCK_MONOTONIC). Call it every
 * ~100 ms; returns the number of lease pins ended. */
uint64_t store_tick(struct store *s);

/* ---- events (for a KV-event publisher; no networking here) ------------ */

enum store_event_kind {
	STORE_EVENT_STORED = 1,  /* a block became visible (a PUT's commit, or an announce) */
	STORE_EVENT_REMOVED = 2, /* a block left the pool: eviction (either tier, quota),
				  * DELETE (one event per block of the removed subtree, leaves
				  * first), a failed checksum on NVMe. Not demotion/promotion. */
	STORE_EVENT_CLEARED = 3, /* every block of namespace ns_id was dropped
				  * (store_drop_namespace); no REMOVED events for them */
};

struct store_event {
	enum store_event_kind kind;
	uint32_t ns_id;
	const char *ns_name;        /* the namespace's name, ns_name_len bytes, no NUL */
	uint32_t ns_name_len;
	const uint8_t *key;         /* STORED, REMOVED: STORE_KEY_BYTES; NULL for CLEARED */
	const uint8_t *parent;      /* STORED: the parent's key, NULL for a first block */
	uint64_t length;            /* STORED, REMOVED: payload bytes */
	uint8_t tier;               /* STORED: STORE_TIER_DRAM, or STORE_TIER_NVME (announce of
				     * a block only on NVMe) */
	uint8_t announce;           /* 1: from store_set_event_hook's walk of what is stored
				     * (a block rebuilt from NVMe at open, or any block present
				     * when the hook is set), not from a new PUT */
};

/* Called for every event, WITH the store lock held (so calls are
 * serialised: one at a time, in the order the pool changed), from
 * whichever thread changed the pool (a worker, an I/O thread). Every
 * pointer in *ev is valid only during the call. The function must not
 * block (except for announce events, see store_set_event_hook), must not
 * call into the store, and should be a few hundred nanoseconds at most:
 * every other store call waits for it. */
typedef void (*store_event_fn)(void *arg, const struct store_event *ev);

/* Install (fn != NULL) or remove (fn == NULL) the event hook. When
 * installing, first calls fn once per visible block, announce = 1, each
 * namespace's blocks parents first (so a subscriber can check every
 * parent it is told about), under the store lock: blocks rebuilt from
 * NVMe at open are announced this way, exactly once. Call it at start-up
 * before serving (announce calls may wait for the consumer; nothing else
 * waits on the lock then) or at shutdown. Cannot fail; takes the lock. */
void store_set_event_hook(struct store *s, store_event_fn fn, void *arg);

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
	/* Passes that made room in DRAM for a put reservation or a promotion
	 * (expiring leases, then evicting or dropping clean copies until the
	 * allocation fits), and the longest one in microseconds, measured
	 * under the store lock: how long such a pass holds up other puts. */
	uint64_t evict_passes;
	uint64_t evict_pass_max_us;
	uint64_t leases_active;        /* lease pins held now */
	uint64_t checksum_errors;
	uint32_t namespaces;           /* held now (not reclaimed), <= STORE_MAX_NAMESPACES */
	/* Retention, pool-wide: blocks and payload bytes retained now,
	 * retentions refused for a budget (blocks), retentions expired. */
	uint64_t retained_blocks, retained_bytes, retain_refused, retain_expired;

	/* Tiers. `blocks` above counts visible blocks in either tier. */
	uint64_t dram_blocks;          /* blocks with a DRAM copy (== blocks without NVMe) */
	uint8_t nvme_enabled;          /* 0: every nvme_* field and counter below is 0 */
	uint8_t nvme_direct_io;        /* 1 = O_DIRECT, 0 = buffered fallback */
	uint8_t nvme_healthy;          /* 0 while writes fail (disk full, I/O errors) */
	uint64_t nvme_capacity_bytes;  /* segment bytes allowed */
	uint64_t nvme_segment_bytes;
	uint64_t nvme_used_bytes;      /* bytes of segments in use (holding blocks or being filled) */
	uint64_t nvme_payload_bytes;   /* payload bytes of blocks with an NVMe copy */
	uint64_t nvme_blocks;          /* blocks with an NVMe copy */
	uint64_t demotions, demoted_bytes;   /* blocks (payload bytes) written to NVMe from DRAM */
	uint64_t promotions, promoted_bytes; /* blocks (payload bytes) read back into DRAM */
	uint64_t nvme_bytes_written;   /* all segment bytes written (demotions + rewrites) */
	uint64_t nvme_bytes_read;
	uint64_t rewritten_bytes;      /* bytes rewritten by segment reclaim (write amplification) */
	uint64_t segments_reclaimed;
	uint64_t admission_rejections; /* blocks evicted from DRAM instead of demoted (nvme_admission) */
	uint64_t nvme_evictions;       /* blocks dropped from NVMe to make room */
	uint64_t corrupt_blocks;       /* NVMe copies that failed their checksum */
	uint64_t nvme_read_errors, nvme_write_errors;
	uint64_t rebuild_ms;           /* time the open's index rebuild took */
	uint64_t rebuild_blocks;       /* blocks made matchable again by it */
	uint64_t orphans_dropped;      /* blocks dropped by it: a stored ancestor did not survive */
	uint64_t rebuild_truncated;    /* blocks dropped by it: their segment file was missing or
					* cut short (their bytes are gone) */
	uint64_t index_records_lost;   /* index log records written but lost to damage (the
					* index was then moved aside: storage/nvme/NVME.md) */
	uint64_t index_quarantined;    /* damaged indexes moved aside at this start (0 or 1) */
};

struct store_ns_stats {
	char name[STORE_NAME_MAX_BYTES + 1]; /* NUL-terminated */
	uint32_t ns_id;
	uint64_t blocks, bytes;              /* visible blocks (either tier) and their payload bytes */
	uint64_t nvme_blocks;                /* of them, blocks with an NVMe copy */
	uint64_t puts, put_exists, put_errors; /* blocks stored; -EEXIST; other refusals */
	uint64_t get_hits, get_misses;
	uint64_t exists_hits, exists_misses;
	uint64_t match_requests, match_blocks_queried, match_blocks_matched;
	uint64_t evictions, deletes;         /* deletes: blocks removed by store_delete */
	/* Retention: this namespace's own figures; retain_budget_bytes is
	 * the budget that bounds it (its tenant's when it is charged to one,
	 * shared with the tenant's other namespaces). */
	uint64_t retained_blocks, retained_bytes, retain_budget_bytes;
	uint64_t retain_refused, retain_expired;
	uint8_t retain_tenant;               /* 1: charged to a tenant (budget is the tenant's) */
};

void store_stats(struct store *s, struct store_stats *out);
/* Namespace number `index` (0 .. stats.namespaces-1, in creation order;
 * indexes shift down when an older namespace is reclaimed).
 * Errors: -ENOENT past the end. */
int store_ns_stats(struct store *s, uint32_t index, struct store_ns_stats *out);

#endif /* KVPOOL_STORE_H */
