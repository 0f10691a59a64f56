/*
 * kvpool.h - libkvpool, the client library of the kvpool KV-cache pool.
 *
 * If it is not in this header, it is not API.
 *
 * Conventions
 *  1. Handles are opaque (struct kvpool_client). Constructors return 0 and
 *     write the handle; destructors accept NULL.
 *  2. Every function returns 0 on success or a negative errno; the errors a
 *     function can return are listed with it. kvpool_strerror() describes
 *     every value. Out-parameters are written only on success unless a
 *     function says otherwise (per-block status arrays are always written).
 *  3. Keys (block hashes) are opaque 32-byte strings. Shorter hashes are
 *     zero-padded by the caller. A block's parent is the key of the block
 *     before it in its prompt, or NULL for a prompt's first block.
 *  4. Sizes are in bytes, times in milliseconds, unless a name says so.
 *  5. Pointers passed in are borrowed for the duration of the call only,
 *     unless a function says otherwise.
 *  6. Threads: every call may be made from several threads at once on one
 *     handle (each takes the handle's lock; a call that waits for the
 *     server releases it meanwhile), except kvpool_close, which must not
 *     overlap any other call on the handle. Different handles are
 *     independent. kvpool_block_hashes and kvpool_strerror may be called
 *     from any thread. See "Asynchronous API", Threads.
 *  7. Every call that talks to the server blocks until its reply arrives or
 *     its timeout (kvpool_set_timeout) expires; the timeout bounds the whole
 *     call, including a reconnect and every frame of a split batch. After
 *     a connection error (-ECONNRESET, -ETIMEDOUT, -EPIPE, -EPROTO) the
 *     handle is disconnected; the next call reconnects (and says HELLO
 *     again) before it does its work. A connection the server closed while
 *     the handle was idle (idle timeout, restart) is noticed at the start
 *     of the next call and replaced before any request is sent, so that
 *     call does not fail because of it.
 *
 * Errors shared by every call that talks to the server:
 *   -ECONNREFUSED  the server is not listening (connect or reconnect failed)
 *   -ECONNRESET    the connection broke during the call
 *   -EPIPE         the server closed the connection while we were sending
 *   -ETIMEDOUT     no complete reply within the timeout
 *   -EPROTO        the server sent something that is not protocol v1 or v2,
 *                  or refused the request as malformed (BAD_REQUEST)
 *   -EACCES        the token does not allow the namespace (DENIED)
 *   -ENOMEM        allocation failed
 *   -EAGAIN        the server turned the connection away as busy (e.g. at
 *                  its connection limit) on every try (see Backpressure)
 *
 * Wire status -> errno (per block, and for whole requests):
 *   OK, EXISTS -> 0; NOT_FOUND -> -ENOENT; NO_PARENT -> -ENOLINK;
 *   FULL -> -ENOSPC; QUOTA -> -EDQUOT; BUSY -> -EAGAIN;
 *   TOO_LARGE -> -EMSGSIZE; DENIED -> -EACCES; BAD_REQUEST -> -EPROTO;
 *   IO -> -EIO; UNSUPPORTED -> -EOPNOTSUPP; BAD_CHECKSUM -> -EBADMSG.
 *
 * Backpressure. The server says BUSY when it cannot take a request now
 * but will soon: a PUT block over its in-flight put bytes, a connection
 * over its connection limit (later servers: full I/O queues). Every call
 * retries by itself whatever was answered BUSY - only those blocks or
 * keys, with the in-call children of a BUSY block that came back -ENOLINK
 * because of it - after a wait that starts at KVPOOL_BUSY_FIRST_WAIT_MS
 * and doubles up to KVPOOL_BUSY_MAX_WAIT_MS, each wait drawn uniformly
 * from its upper half (jitter, so that clients refused together do not
 * return together). It stops after KVPOOL_BUSY_TRIES tries in all
 * (kvpool_set_busy_tries) or when the next wait would end past the call's
 * timeout, and then reports -EAGAIN for what is left. With the defaults a
 * call waits at most 5 + 10 + 20 + 40 + 80 + 160 + 250 = 565 ms for BUSY.
 * Every other status goes to the caller at once: FULL (-ENOSPC: nothing
 * evictable; retrying soon will not help), TOO_LARGE (-EMSGSIZE), DENIED
 * (-EACCES), QUOTA (-EDQUOT)...
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVPOOL_KEY_BYTES 32
#define KVPOOL_DEFAULT_URL "tcp://127.0.0.1:7470"
#define KVPOOL_DEFAULT_TIMEOUT_MS 10000
#define KVPOOL_BUSY_TRIES 8           /* tries of what the server answers BUSY, in all */
#define KVPOOL_BUSY_FIRST_WAIT_MS 5   /* wait before the second try */
#define KVPOOL_BUSY_MAX_WAIT_MS 250   /* longest wait between two tries */

struct kvpool_client;

/* Options for kvpool_connect. Zero-initialise, then set what you need.
 *
 * TLS (tls:// URLs, and the tls:// members of a cluster): each file is a
 * PEM file read at kvpool_connect; NULL takes the environment's
 * KVPOOL_TLS_CA, KVPOOL_TLS_CERT, KVPOOL_TLS_KEY, and without those the
 * system's trust store and no client certificate. The server's
 * certificate chain is always verified, and by default it must name the
 * URL's host (a DNS name or IP address in its subjectAltName).
 * The TLS fields made the struct larger (kvpool_put_block and
 * kvpool_limits grew too), so the library's SONAME is libkvpool.so.1
 * (Debian: libkvpool1): a program built against libkvpool.so.0 is refused
 * by the dynamic loader instead of running with the old layout; rebuild
 * it against this header. */
struct kvpool_options {
	const char *token;    /* auth token, NUL-terminated; NULL for none. Copied. */
	uint32_t timeout_ms;  /* per-call timeout; 0 = KVPOOL_DEFAULT_TIMEOUT_MS */
	uint32_t tls_flags;   /* KVPOOL_TLS_* */
	const char *tls_ca_file;   /* CA certificates the server's must chain to */
	const char *tls_cert_file; /* this client's certificate (mutual TLS), with... */
	const char *tls_key_file;  /* ...its private key */
};

/* kvpool_options.tls_flags: do not check that the server's certificate
 * names the URL's host (its chain is still verified). For a test rig or
 * an address no certificate names; not for a shared network. */
#define KVPOOL_TLS_NO_VERIFY_HOSTNAME 0x1u

/* What the server told us in its HELLO reply. */
struct kvpool_limits {
	uint64_t max_block_bytes;      /* largest block the server accepts */
	uint32_t max_batch_blocks;     /* blocks per request frame */
	uint32_t max_frame_bytes;      /* header + body of one frame */
	uint32_t max_lease_ms;         /* leases are capped to this */
	uint16_t rdma_port;            /* 0: the server does not serve RDMA */
	uint16_t protocol_version;     /* the version the connection uses: 1 or 2 */
	uint64_t max_inflight_put_bytes;
	uint32_t max_match_wait_ms;    /* a MATCH's wait_ms is cut to this (ms);
					  0 from a v1 server (it never waits) */
	uint32_t max_retain_ms;        /* retain_ms is cut to this (ms); 0 from a
					  v1 server (it never retains) */
};

/* Constructor. Connect to `url` ("tcp://host:port"; host may be a name, an
 * IPv4 address or a bracketed IPv6 address) and bind the connection to
 * namespace `ns` (NUL-terminated, 1..255 bytes; copied).
 * `opts` may be NULL. Blocks up to the timeout.
 * Also "auto://host:port" (the TCP port): TCP first, then RDMA when the
 * server's HELLO reply offers it (rdma_port) and an RDMA connection, its
 * memory registrations and a HELLO over it all work; otherwise it stays
 * on TCP. Which one it uses is said on stderr, once (again only if it
 * changes at a later reconnect; handles of one process that would print
 * the same line print it once). "rdma://host[:port]" (default port 7472)
 * uses rdma_cm only. On RDMA, put/get behave as on TCP: the server moves
 * the bytes with RDMA READ/WRITE, in place for buffers inside a
 * registered region (kvpool_register), through a staging buffer the
 * handle registers once per connection otherwise.
 * "tls://host:port" speaks TLS (1.2 or later, OpenSSL, kernel TLS where
 * the kernel offers it) to the server's data port, with the settings of
 * struct kvpool_options (above). A handshake that fails - a certificate
 * not signed by a trusted CA, expired, or not naming the host; a client
 * certificate the server refuses; a server without TLS - answers -EPROTO
 * with the reason in kvpool_last_server_message ("tls handshake with
 * host:7470 failed: the server's certificate is refused: certificate has
 * expired"). A plaintext tcp:// client of a server with tls_only gets
 * -EACCES ("this port requires TLS (tls_only): connect with a tls://
 * URL"). RDMA carries no TLS.
 * Errors: -EINVAL (bad URL, empty or too long namespace, a namespace byte
 *   outside printable ASCII 0x21..0x7e, token too long; TLS files that do
 *   not load, with the reason in kvpool_last_server_message),
 *   -EPROTO (tls://: the handshake failed, above),
 *   -EOPNOTSUPP (a scheme other than tcp://, tls://, auto:// or rdma://, rdma://
 *   in a build without RDMA, or the server speaks no protocol version we
 *   do), -EPERM / -ENOMEM (rdma://: memory registration refused, e.g. a
 *   too small RLIMIT_MEMLOCK), -ENODEV
 *   (rdma:// and no RDMA device), -ENOENT (host name does not
 *   resolve), and the shared connection errors above.
 *
 * Several nodes (docs/cluster.md): a comma-separated list,
 * "tcp://a:7470,b:7470,c:7470" or "tls://a:7470,b:7470" (one scheme for
 * all: the first's applies to the others, and another scheme on a later
 * entry is refused; each node once: two entries for one address, even
 * spelled differently, are refused), or
 * "etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER" (etcd's v3 JSON gateway,
 * up to 8 members; a node whose record says "tls": true is reached over
 * tls://; the nodes are the records under
 * kvpool/CLUSTER/nodes/) make a cluster handle: every call below then
 * works on the whole pool. Placement is per block: each block lives on
 * the node with the highest rendezvous score for its own key
 * (kvpool_hrw_rank), a hot block - a prefix the handle saw shared by many
 * chains - on the first KVPOOL_HOT_REPLICAS, so any handle finds any key
 * (one-shot commands too). A query after the URL sets the handle's
 * cluster settings: "?budget_ms=N" (how long a node may take to answer
 * its share of a MATCH or GET before that share counts as misses and the
 * node is skipped; default 200, 0 = the call's timeout), "hot_replicas=R"
 * (1..4, default 2; 1 = no hot copies), "hot_children=C" (distinct
 * continuations that make a shared prefix hot, default 32; 0 = never),
 * "fallback_ms=N" (how long, at most, keys whose owners changed are also
 * asked at their previous owners; default 600000), joined by '&'. Node
 * names are "host:port" for a list and the record's name for etcd. A
 * cluster handle runs one thread per node, which drives that node's
 * connection (the per-node parts of a call run in parallel on them:
 * sending, receiving and checksums) and probes it in the background
 * while it is down, and, for etcd, one thread that watches the
 * membership; they end in kvpool_close (which may then take up to a
 * second: the watch notices its stop on libcurl's next progress call).
 * Every call of this header works on a cluster handle, the asynchronous
 * ones included; kvpool_register reaches every node's connection. A node
 * that cannot be reached, or does not answer within the budget, is not an
 * error: its share of a GET or EXISTS is asked of the next place the block
 * may be, else a miss (-ENOENT); of a MATCH the chain stops there; its
 * share of a PUT goes to the next node by score (a block no node could
 * take is -EHOSTDOWN, never "stored"); its share of a DELETE or
 * DROP_NAMESPACE is kept and finished when it is back (those calls say
 * -EINPROGRESS meanwhile); the node is skipped until a background probe
 * finds it answering again. Any other error of a node's share (e.g.
 * -EACCES: it refused HELLO for the namespace) is the status of every
 * block of that share, as on one node. Errors: for a list, the first
 * node's error when none answers; -EINVAL (a bad list or query, see
 * above); for etcd, -ECONNREFUSED / -ETIMEDOUT / -EPROTO when etcd
 * cannot be read at connect (once connected, an unreachable etcd keeps
 * the last membership and says so in kvpool_stats' "cluster" object),
 * -ENXIO when no node is registered under CLUSTER after a 2 s grace (a
 * typo would otherwise make an empty pool); -E2BIG (more than 64 nodes). */
int kvpool_connect(const char *url, const char *ns, const struct kvpool_options *opts,
		   struct kvpool_client **out);

/* Destructor. Closes the connection and frees the handle. Accepts NULL. */
void kvpool_close(struct kvpool_client *c);

/* Set the per-call timeout in milliseconds (0 = default). Cannot fail. */
void kvpool_set_timeout(struct kvpool_client *c, uint32_t timeout_ms);

/* Copy the server's limits (learned at HELLO) into *out. Reconnects if
 * needed. Errors: the shared connection errors. */
int kvpool_get_limits(struct kvpool_client *c, struct kvpool_limits *out);

/* How many tries a call gives what the server answers BUSY (see
 * Backpressure): 1 = never retry (BUSY comes back as -EAGAIN at once),
 * 0 = KVPOOL_BUSY_TRIES. Cannot fail. */
void kvpool_set_busy_tries(struct kvpool_client *c, uint32_t tries);

/* What a handle has been through since kvpool_connect. */
struct kvpool_counters {
	uint64_t connects;        /* connections that completed HELLO */
	uint64_t reconnects;      /* of those, the ones after the first (after a
				     connection error, a server restart, an
				     idle connection the server closed) */
	uint64_t busy_retries;    /* tries repeated because of BUSY */
	uint64_t checksum_errors; /* GET blocks whose bytes failed verification */
};

/* Copy the handle's counters into *out. Does not talk to the server.
 * Errors: -EINVAL (NULL arguments). */
int kvpool_get_counters(const struct kvpool_client *c, struct kvpool_counters *out);

/* ---- blocks ------------------------------------------------------------- */

/* One block to put. The payload is the concatenation of iov[0..iovcnt):
 * a scatter-gather list, so per-layer KV slices need no staging copy.
 * An entry may be empty ({NULL, 0}); an entry with iov_len > 0 needs a
 * non-NULL iov_base. All pointers are borrowed for the call. */
struct kvpool_put_block {
	const uint8_t *key;    /* KVPOOL_KEY_BYTES */
	const uint8_t *parent; /* KVPOOL_KEY_BYTES, or NULL for a first block
				  (32 zero bytes mean the same as NULL) */
	const struct iovec *iov;
	int iovcnt;            /* >= 1 */
	uint32_t retain_ms;    /* 0: an ordinary block. > 0: ask the server not
				  to evict it for retain_ms after it is stored
				  (or, if already stored, to extend its
				  retention), capped at max_retain_ms and
				  subject to the server's retention budget:
				  see kvpool_put_ex. Ignored by a v1 server. */
};

/* Put `count` blocks (any count: batches larger than the server's
 * max_batch_blocks are split into several frames and pipelined). The
 * client computes each block's xxh3-64 checksum; the server verifies it.
 * A key already stored is a success (stored content is never replaced);
 * the call cannot tell it from a new store: ask kvpool_exists first if it
 * matters (another client may still store the key in between).
 * statuses[i] (array of count; may be NULL) receives 0 or -errno per block:
 *   -ENOLINK   parent not stored (nothing stored for that block)
 *   -EMSGSIZE  block larger than the server's max_block_bytes (refused
 *              locally, not sent) or an empty block
 *   -ENOSPC    pool full, nothing evictable
 *   -EAGAIN    server busy (in-flight put bytes at limit) on every try
 *              (see Backpressure)
 *   -EBADMSG   the server received bytes that do not match the checksum
 *   -EHOSTDOWN cluster handle: every node that may hold the block is down
 *              or lost the connection (nothing stored)
 *   -EDQUOT, -EIO, -EACCES
 * On a cluster handle a parent is not sent: every block is stored as a
 * chain's first block on its node (docs/cluster.md), so -ENOLINK does not
 * occur there.
 * Returns 0 if every block succeeded, otherwise the first block's error
 * (or a whole-call error, which is then also in every statuses[i]).
 * Errors: -EINVAL (a NULL key or iov, iovcnt < 1, an iovec with a NULL
 *   iov_base and iov_len > 0, or iovec lengths whose sum overflows 64 bits;
 *   checked for every block before anything is sent, the connection is
 *   kept), per-block errors, shared errors. */
int kvpool_put(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
	       int *statuses);

/* Per-block retention outcome of kvpool_put_ex (the wire's PUT result
 * flags, PROTOCOL.md section 14). */
#define KVPOOL_PUT_RETAINED 0x01u       /* a retention was taken */
#define KVPOOL_PUT_RETAIN_BUDGET 0x02u  /* asked, refused for the retention
					   budget: the block is stored without it */
#define KVPOOL_PUT_RETAIN_CLAMPED 0x04u /* retain_ms was cut to max_retain_ms */

/* kvpool_put, plus flags[i] (array of count; may be NULL) receiving each
 * block's KVPOOL_PUT_* bits: 0 for a block that asked no retention
 * (retain_ms 0), failed, or was put through a server that speaks
 * protocol v1 only (which ignores retain_ms). A retention refused is not
 * an error: the block's status stays 0. flags[] is always written (0
 * where nothing is known), like statuses. Same arguments, blocking,
 * threads and errors as kvpool_put. */
int kvpool_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks, size_t count,
		  int *statuses, uint32_t *flags);

/* One block to get into caller memory: the block's bytes are scattered
 * over iov[0..iovcnt) in order (entries with iov_len > 0 need a non-NULL
 * iov_base). `length` receives the block's size. */
struct kvpool_get_block {
	const uint8_t *key;    /* KVPOOL_KEY_BYTES, borrowed */
	const struct iovec *iov;
	int iovcnt;            /* >= 1 */
	uint64_t length;       /* out: bytes written (block size) on success;
				  also written on -EMSGSIZE, see kvpool_get */
};

/* Get `count` blocks into caller buffers (pipelined like kvpool_put).
 * Every block's checksum is verified on receipt; a mismatch is -EBADMSG
 * and the buffer's content is then undefined (never reported as data).
 * statuses[i] (may be NULL) receives 0 or -errno per block:
 *   -ENOENT    not in the pool (a miss)
 *   -EMSGSIZE  the block is larger than its buffers: nothing is written to
 *              the buffers, but (the one exception to convention 2)
 *              blocks[i].length receives the block's size, so the caller
 *              can retry with that much room; 0 if the server did not
 *              report it
 *   -EBADMSG   checksum mismatch on receipt
 *   -EAGAIN    the server was busy on every try (see Backpressure)
 *   -EIO
 * blocks[i].length is left alone for any other error.
 * Returns 0 if every block was returned, else the first block's error.
 * Errors: -EINVAL (a NULL key or iov, iovcnt < 1, an iovec with a NULL
 *   iov_base and iov_len > 0, or iovec lengths whose sum overflows 64 bits;
 *   checked for every block before anything is sent, the connection is
 *   kept), per-block errors, shared errors. */
int kvpool_get(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
	       int *statuses);

/* Convenience: put one contiguous block. Same errors as kvpool_put. */
int kvpool_put_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES],
		     const uint8_t *parent, const void *data, size_t length);

/* Convenience: get one block into buf[0..cap); *length (may be NULL)
 * receives its size. On -EMSGSIZE (cap too small) *length also receives
 * the block's size when the server reported it, so a caller can retry
 * with a buffer that large; buf = NULL with cap = 0 asks for just that.
 * Same errors as kvpool_get (-EINVAL also for buf = NULL with cap > 0). */
int kvpool_get_bytes(struct kvpool_client *c, const uint8_t key[KVPOOL_KEY_BYTES], void *buf,
		     size_t cap, uint64_t *length);

/* Which of the count keys are stored? keys: count * KVPOOL_KEY_BYTES
 * contiguous bytes (e.g. a uint8_t [n][KVPOOL_KEY_BYTES] array: any
 * pointer converts without a cast). statuses[i] (required) receives 0
 * (present) or -ENOENT. Returns 0 when the call worked, whatever the
 * per-key results. Errors: -EINVAL (NULL arguments), shared errors. */
int kvpool_exists(struct kvpool_client *c, const void *keys, size_t count,
		  int *statuses);

/* Prefix match over a prefix-hash chain (keys: count * KVPOOL_KEY_BYTES
 * contiguous bytes, the chain in order): *matched receives the number of
 * leading keys the pool holds (0..count), in one round trip per
 * max_batch_blocks keys. With lease_ms > 0 the matched blocks are pinned
 * for this handle's connection for lease_ms (capped by the server's
 * max_lease_ms) or until a kvpool_get on this handle returns them, so a
 * get that follows cannot miss because of eviction.
 * Errors: -EINVAL, shared errors. */
int kvpool_match(struct kvpool_client *c, const void *keys, size_t count,
		 uint32_t lease_ms, size_t *matched);

/* Options of kvpool_match_ex. Zero-initialise, then set what you need
 * (all zero: kvpool_match without a lease). */
struct kvpool_match_opts {
	uint32_t lease_ms;  /* > 0: lease the matched blocks (as kvpool_match) */
	uint32_t wait_ms;   /* > 0: if fewer than `want` leading blocks are
			       present, let the server wait up to this long
			       (capped at max_match_wait_ms) for PUTs that
			       complete them, then answer what is present */
	uint32_t want;      /* leading blocks needed; 0 = count; above count
			       is -EINVAL (refused before anything is sent) */
	uint32_t retain_ms; /* > 0: extend the matched run's retention to at
			       least this long from now (capped at
			       max_retain_ms, within the retention budget) */
};

/* Flags of kvpool_match_result (the wire's MATCH flags). */
#define KVPOOL_MATCH_LEASE_CUT 0x001u      /* a lease of the whole present run
					      would pass the connection's or tenant's
					      leased-bytes bound: matched is the
					      longest leading run whose lease fits */
#define KVPOOL_MATCH_WAITED 0x002u         /* the server waited (fewer than want present) */
#define KVPOOL_MATCH_WAIT_TIMEOUT 0x004u   /* answered because wait_ms passed */
#define KVPOOL_MATCH_WAIT_REFUSED 0x008u   /* the server's limit on waiting MATCHes was
					      reached: answered at once */
#define KVPOOL_MATCH_WAIT_CLAMPED 0x010u   /* wait_ms was cut to max_match_wait_ms */
#define KVPOOL_MATCH_WAIT_ENDED 0x020u     /* the server ended the wait early (namespace
					      dropped, reload, shutdown) */
#define KVPOOL_MATCH_RETAIN_BUDGET 0x040u  /* retention refused (in part) for the budget */
#define KVPOOL_MATCH_RETAIN_CLAMPED 0x080u /* retain_ms was cut to max_retain_ms */

/* What kvpool_match_ex answers. */
struct kvpool_match_result {
	size_t matched;     /* leading blocks matched (leased, when a lease was asked) */
	size_t present;     /* leading blocks present when answered: >= matched,
			       > matched only with KVPOOL_MATCH_LEASE_CUT */
	size_t retained;    /* leading blocks whose retention was set or extended */
	uint32_t lease_ms;  /* lease granted (0: none) */
	uint32_t retain_ms; /* retention granted (0: none) */
	uint32_t flags;     /* KVPOOL_MATCH_* */
};

/* kvpool_match with options: a lease, a bounded wait for blocks that are
 * still being put (prefill -> decode hand-off), and a retention refresh.
 * keys: count * KVPOOL_KEY_BYTES contiguous bytes, the chain in order;
 * opts may be NULL (all zero); *out (required) is written on success.
 * With wait_ms > 0 the call may block until `want` leading blocks are
 * present or the server's wait ends, so its deadline is the handle's
 * timeout plus wait_ms. A timeout of the wait is not an error: the call
 * answers 0 with what is present (a shorter match, flags
 * KVPOOL_MATCH_WAITED | KVPOOL_MATCH_WAIT_TIMEOUT). Chains longer than
 * one frame are asked frame by frame, each frame asked only if the one
 * before matched whole; each frame waits for its share of want within
 * what is left of wait_ms. A server that speaks protocol v1 only
 * (kvpool_limits.protocol_version 1) is sent none of wait_ms, want and
 * retain_ms: it answers at once, with present = matched, retained 0 and
 * flags 0. A cluster handle asks every node that owns part of the chain
 * in one round, each waiting for its own part of want; when one of them
 * is lost during the wait, or the membership changes so that a missing
 * wanted block has another owner, the wait ends at once and the call
 * answers what is present, flags KVPOOL_MATCH_WAITED |
 * KVPOOL_MATCH_WAIT_ENDED: ask again (docs/cluster.md, "Waiting MATCH").
 * Threads, blocking and errors as kvpool_match, plus -EINVAL when want >
 * count or out is NULL (checked before anything is sent; the connection
 * is kept, on every kind of handle), and -EDQUOT when a lease over the
 * connection's or tenant's leased-bytes bound is refused (only kvpoold
 * before the lease cut: now such a MATCH answers the longest leading run
 * whose lease fits, with KVPOOL_MATCH_LEASE_CUT and present > matched). */
int kvpool_match_ex(struct kvpool_client *c, const void *keys, size_t count,
		    const struct kvpool_match_opts *opts, struct kvpool_match_result *out);

/* Remove blocks and their descendants (keys: count * KVPOOL_KEY_BYTES
 * contiguous bytes). statuses[i] (may be NULL): 0 or -ENOENT, and on a
 * cluster handle -EINPROGRESS: a node that may hold the block could not be
 * reached; the handle deletes it there when the node answers again
 * (kvpool_stats: cluster.pending_removals), unless it is closed first.
 * Returns 0 when the call worked, -EINPROGRESS when some block is
 * pending. Errors: -EINVAL, shared. */
int kvpool_delete(struct kvpool_client *c, const void *keys, size_t count,
		  int *statuses);

/* Drop every block of namespace `ns` (NULL: this handle's namespace).
 * *blocks (may be NULL) receives how many were dropped. On a cluster
 * handle, when a node could not be reached the others have dropped theirs
 * and the call answers -EINPROGRESS: the handle drops it on that node when
 * the node answers again (cluster.pending_removals), unless it is closed
 * first - then run it again. Errors: -EINVAL (name too long),
 * -EINPROGRESS, shared errors. */
int kvpool_drop_namespace(struct kvpool_client *c, const char *ns, uint64_t *blocks);

/* Server statistics as a NUL-terminated JSON document (keys in
 * PROTOCOL.md). ns: NULL for all namespaces, or one name. *json is
 * malloc'd: the caller frees it with kvpool_free.
 * Errors: -EINVAL, shared errors. */
int kvpool_stats(struct kvpool_client *c, const char *ns, char **json);

/* Round trip to the server. *rtt_us (may be NULL) receives the round-trip
 * time in microseconds (a cluster: the slowest node's). On a cluster
 * handle every member is asked; -EHOSTDOWN when one of them is down or
 * did not answer (kvpool_stats' cluster.nodes says which).
 * Errors: shared errors, -EHOSTDOWN. */
int kvpool_ping(struct kvpool_client *c, uint64_t *rtt_us);

/* Free memory returned by this library. Accepts NULL. */
void kvpool_free(void *p);

/* ---- memory registration ----------------------------------------------- */

/* Register buf[0..len) with the handle: memory the caller will put from
 * and get into many times (a KV-cache arena, a staging pool), declared
 * once up front. On RDMA this is memory the NIC is given access to (the
 * server may READ and WRITE it, only where a put/get describes it),
 * registered once so that no call pays for it: a put or get whose block
 * is one iovec inside a registered region moves without a copy; other
 * buffers go through the handle's staging buffer.
 * On TCP this call does no more than check the arguments and record the
 * region: nothing is pinned, nothing is sent. Regions recorded on TCP, or
 * kept across a reconnect, are registered when an RDMA connection is
 * made. Put/get work the same on registered and unregistered memory
 * (registration is never required).
 * The memory is borrowed until kvpool_unregister(c, buf) or
 * kvpool_close(c); the caller keeps it allocated until then. Does not
 * block; does not talk to the server.
 * Errors: -EINVAL (c or buf NULL, len 0, or buf + len past the end of
 *   the address space), -EEXIST (the range overlaps a region already
 *   registered with this handle, e.g. the same buffer twice),
 *   -ENOMEM (the region table could not grow), and on RDMA the
 *   registration's -ENOMEM / -EPERM (RLIMIT_MEMLOCK too small); the
 *   region is then not recorded.
 * A cluster handle records the region and passes it to every node's
 * connection, in order with the requests that follow (nodes that join
 * later get it too); a node whose RDMA registration fails moves those
 * buffers through its staging buffer instead (no error is returned). */
int kvpool_register(struct kvpool_client *c, const void *buf, size_t len);

/* Forget the region registered at `buf` (the exact start address given to
 * kvpool_register; the whole region goes; on RDMA it is deregistered).
 * Does not block.
 * Errors: -EINVAL (c or buf NULL), -ENOENT (no region starts at buf). */
int kvpool_unregister(struct kvpool_client *c, const void *buf);

/* ---- asynchronous API ---------------------------------------------------
 *
 * Every data call has an asynchronous twin: kvpool_submit_put/_get/_exists/
 * _match/_delete return at once with a request id; kvpool_poll hands back
 * finished requests; kvpool_event_fd gives a descriptor to wait on with
 * poll(2), epoll, select or an asyncio loop.
 *
 * Ownership. From a successful submit until its completion has been
 * returned by kvpool_poll (or kvpool_cancel returned 0), the library owns
 * the request's memory: the blocks array, every iov array and payload
 * buffer it points to, the keys and the statuses array. The caller keeps
 * them allocated and neither reads nor writes them in that time (a GET's
 * buffers hold partial data while it runs). Once the completion is
 * polled, nothing of the request is touched again.
 *
 * Results. A completion's status is what the synchronous twin would have
 * returned; per-block results are in the statuses array and (GET) in
 * blocks[i].length, with the same values as the twin. A GET block is
 * reported 0 only once all its bytes are in the caller's buffers and
 * their xxh3-64 checksum matched the server's; a block whose bytes did
 * not arrive whole is never 0.
 *
 * Inside. Every call, synchronous or not, is a request of the handle's
 * one request engine: a synchronous call is its twin submitted and waited
 * for. Requests are pipelined on the handle's one connection, each frame
 * with its own request id, which its reply must echo (the server answers
 * in request order; a reply out of that order is a broken stream,
 * -EPROTO). Completions come in whatever order requests finish: a request
 * that waits for a BUSY retry, or has more frames, finishes after later
 * ones. Batches are split into frames within the server's limits; blocks
 * answered BUSY are tried again with the backoff of "Backpressure", the
 * wait being spent in kvpool_poll rather than sleeping; MATCH leases
 * (lease_ms) work as in kvpool_match. A one-node handle starts no thread:
 * all I/O happens inside kvpool_submit_* (sending what the connection
 * takes at once, reading what has arrived) and kvpool_poll (which waits
 * for the connection). A caller that does not poll makes no progress
 * beyond what its submits do. On a cluster handle the node threads make
 * the progress, and completions of different nodes come in any order.
 *
 * RDMA. On an RDMA connection (rdma://, or auto:// after moving) the
 * asynchronous calls are as asynchronous as on TCP: a submit returns with
 * its request in flight (up to 4 requests pipelined; one that needs the
 * staging buffer has it to itself). kvpool_cancel cannot stop a request
 * whose buffers were described to the server as they are (one iovec
 * inside a registered region) once it is sent, since the server may still
 * READ or WRITE them: it answers -EINPROGRESS and the request completes as
 * usual.
 *
 * Connection errors. When the connection breaks (the server closed or
 * reset it, a frame could not be parsed, a connection-level error reply),
 * every request in flight completes with that error (-ECONNRESET, -EPIPE,
 * -EPROTO, ...), which is also written to each of its statuses; buffers of
 * a GET may hold partial data but no block of it is reported 0. The
 * connection is then closed; the next submit reconnects (and may block up
 * to the timeout while it does, as a synchronous call would).
 *
 * Timeouts. Each request has the handle's timeout (kvpool_set_timeout) from
 * its submit, covering its BUSY retries; a request submitted behind
 * waiting MATCHes still owed a reply on the connection (the server answers
 * it only after them) has its timeout from the end of the last of their
 * waits, so that a call made while a wait is parked (kvpool_ping,
 * kvpool_stats, a put...) neither times out nor, by closing the
 * connection, ends that wait. A request whose timeout passes
 * before any of its frames went on the wire (or while it waits to retry)
 * completes with -ETIMEDOUT alone. One whose timeout passes while the
 * server owes it a reply completes with -ETIMEDOUT and closes the
 * connection (as a timeout does in the synchronous calls): every other
 * request in flight then completes with -ECONNRESET.
 *
 * Threads. Every call may be made from several threads at once on one
 * handle (convention 6): they take the handle's lock (kvpool_poll and the
 * synchronous calls release it while they wait). A synchronous call made
 * while asynchronous requests are in flight is queued behind them on the
 * same connection (it does not steal their completions), kvpool_stats,
 * kvpool_ping and kvpool_drop_namespace included. kvpool_close must not
 * overlap another call; with requests in flight it drops them: no
 * completion comes, and no buffer is touched after it returns.
 *
 * Refusals. kvpool_poll sets the calling thread's
 * kvpool_last_server_message to the server's words for the refusal of
 * the first completion it returns that carries any, and to "" when none
 * of them does (a submit sets "" unless its own reconnect is refused). To
 * read the words of every refused request, poll one completion at a time
 * (max 1).
 *
 * Sizing max_inflight. Each request in flight holds one slot (a few
 * hundred bytes plus per-block scratch kept for reuse). Enough requests
 * must be in flight to cover the round trip: about bandwidth x round-trip
 * time / bytes per request. Eight 1 MiB requests keep a 10 GB/s link busy
 * at ~0.8 ms round trips; small GETs want more. The bound only protects
 * memory and the server's queue: the server still answers BUSY beyond
 * its own limits (those blocks are retried as usual). A cancelled request
 * whose frames the server still has to answer keeps its slot until then.
 */

#define KVPOOL_DEFAULT_MAX_INFLIGHT 64  /* async requests in flight per handle */
#define KVPOOL_MAX_INFLIGHT_LIMIT 65536 /* largest value kvpool_set_max_inflight takes */

enum kvpool_op {
	KVPOOL_OP_PUT = 1,
	KVPOOL_OP_GET,
	KVPOOL_OP_EXISTS,
	KVPOOL_OP_MATCH,
	KVPOOL_OP_DELETE,
};

/* One finished request, as kvpool_poll returns it. */
struct kvpool_completion {
	uint64_t id;     /* what submit wrote to *id (never 0) */
	uint64_t tag;    /* the caller's tag from submit */
	int op;          /* enum kvpool_op */
	int status;      /* 0 or -errno: what the synchronous twin would return;
			    -ECANCELED after kvpool_cancel */
	size_t count;    /* blocks/keys in the request */
	size_t matched;  /* MATCH: leading run held; 0 otherwise */
};

/* Bound the number of asynchronous requests in flight on the handle
 * (0 = KVPOOL_DEFAULT_MAX_INFLIGHT). A request counts from its submit until
 * its completion is polled (and, if cancelled, until the server has
 * answered its frames). Does not block, does not talk to the server.
 * Thread-safe (see Threads).
 * Errors: -EINVAL (c NULL, max > KVPOOL_MAX_INFLIGHT_LIMIT), -EBUSY
 *   (requests are in flight or completions wait to be polled),
 *   -ENOMEM. */
int kvpool_set_max_inflight(struct kvpool_client *c, uint32_t max);

/* Requests on the handle from submit until their completion is polled
 * (what counts against max_inflight). 0 for NULL. Thread-safe. */
uint32_t kvpool_inflight(struct kvpool_client *c);

/* Submit the asynchronous twin of kvpool_put / kvpool_get / kvpool_exists /
 * kvpool_match / kvpool_delete (same arguments, same checks, same
 * per-block results). Each returns at once (on a one-node handle, after
 * a reconnect when it is disconnected) with 0 and *id (never 0), or -errno and
 * nothing submitted, nothing written to the statuses.
 * Ownership: see "Ownership" above; statuses may be NULL where the twin
 * allows it (put, get, delete), exists requires it. tag is the caller's
 * own, returned in the completion.
 * count 0 is accepted: it completes at once with status 0.
 * Errors: -EINVAL (the twin's checks; id NULL), -EAGAIN (max_inflight
 *   requests already in flight: poll some first), -ENOMEM, and the shared
 *   connection errors when the handle had to reconnect and could not.
 *   Errors met later (on the wire, from the server) come in the completion.
 * Thread-safe (see Threads). */
int kvpool_submit_put(struct kvpool_client *c, const struct kvpool_put_block *blocks,
		      size_t count, int *statuses, uint64_t tag, uint64_t *id);
int kvpool_submit_get(struct kvpool_client *c, struct kvpool_get_block *blocks,
		      size_t count, int *statuses, uint64_t tag, uint64_t *id);
int kvpool_submit_exists(struct kvpool_client *c, const void *keys, size_t count,
			 int *statuses, uint64_t tag, uint64_t *id);
/* MATCH: the leading run is the completion's `matched`. */
int kvpool_submit_match(struct kvpool_client *c, const void *keys, size_t count,
			uint32_t lease_ms, uint64_t tag, uint64_t *id);
int kvpool_submit_delete(struct kvpool_client *c, const void *keys, size_t count,
			 int *statuses, uint64_t tag, uint64_t *id);
/* The asynchronous twins of kvpool_put_ex and kvpool_match_ex. flags
 * (put, may be NULL) and *out (match, required) belong to the library
 * until the completion is polled, like the statuses; *out is written
 * when the request finishes with status 0 (the completion's `matched`
 * then equals out->matched). A waiting MATCH (wait_ms > 0) has the
 * handle's timeout plus wait_ms; while the server holds it, the requests
 * submitted after it on the handle are answered after it (the server
 * answers a connection's requests in order), and their timeouts count
 * from the end of its wait (see Timeouts). Same checks, threads and
 * errors as kvpool_submit_put / kvpool_submit_match, plus -EINVAL for a
 * NULL out. */
int kvpool_submit_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks,
			 size_t count, int *statuses, uint32_t *flags, uint64_t tag, uint64_t *id);
int kvpool_submit_match_ex(struct kvpool_client *c, const void *keys, size_t count,
			   const struct kvpool_match_opts *opts, struct kvpool_match_result *out,
			   uint64_t tag, uint64_t *id);

/* Make progress and copy up to `max` finished requests into out[0..max),
 * oldest finished first. Waits up to timeout_ms for the first one
 * (0 = do not wait, -1 = forever; with nothing in flight it returns 0 at
 * once rather than wait forever). Each completion is returned once; after
 * it, its request's memory is the caller's again.
 * Returns the number written (0 on timeout), or -EINVAL (c or out NULL,
 * max < 1, timeout_ms < -1). Thread-safe (see Threads); blocks only while
 * waiting, with the handle's lock released. */
int kvpool_poll(struct kvpool_client *c, struct kvpool_completion *out, int max,
		int timeout_ms);

/* A file descriptor, owned by the handle (do not read or close it), that
 * is readable while completions wait to be polled, or while the
 * connection has I/O ready so that kvpool_poll(c, out, n, 0) makes
 * progress. Wait on it for readability, then call kvpool_poll with
 * timeout 0; it stays valid, the same number, until kvpool_close (one
 * node: an epoll descriptor that holds the handle's eventfd, its
 * connection's descriptors, and a timerfd that fires when a request's
 * timeout or BUSY retry is due, so waiting on this descriptor alone never
 * stalls a request; a cluster: an eventfd, the node threads making the
 * progress).
 * Returns the descriptor, or -EINVAL (c NULL), -ENOMEM / -EMFILE (it could
 * not be created). Thread-safe. */
int kvpool_event_fd(struct kvpool_client *c);

/* Cancel request `id`. After 0 the request's memory is no longer touched
 * (a PUT frame already half sent is completed on the wire with zero bytes,
 * which the server refuses by checksum; a GET's bytes still in flight are
 * read and dropped) and its completion, status -ECANCELED, will be
 * returned by kvpool_poll (statuses and lengths are left as they were).
 * Errors: -EINVAL (c NULL), -ENOENT (no such request in flight: unknown,
 *   or already finished; its completion, if not polled yet, still comes),
 *   -EINPROGRESS (RDMA: the server was given the request's buffers and may
 *   still move bytes; the request completes as usual, on a cluster handle
 *   with -ECANCELED when part of it was cancelled; until then its memory
 *   is the library's). A waiting MATCH (wait_ms > 0) cannot be withdrawn
 *   from the server, which answers nothing sent after it on the connection
 *   before it answers it: when nothing else of the handle is in flight, the
 *   library closes the connection (the server drops the wait; the next
 *   call reconnects, counted in kvpool_counters.reconnects); otherwise the
 *   requests behind it are answered when its wait ends (at the latest
 *   wait_ms after its submit), within their deadlines, which cover it.
 *   Does not block (on a cluster handle it may wait
 *   the few microseconds a node thread needs to hand a part of the request
 *   to its connection). Thread-safe. */
int kvpool_cancel(struct kvpool_client *c, uint64_t id);

/* ---- helpers -------------------------------------------------------------- */

/* Chained block hashes of the full blocks of a token sequence:
 *   hash_i = SHA-256( hash_{i-1} (32 bytes; absent for i = 0 when parent is
 *            NULL) || tokens of block i as uint32 little-endian ||
 *            extra (only for i = 0 and only when parent is NULL) )
 * Without extra bytes this equals SGLang HiCache's chained page hash.
 * A trailing partial block is ignored.
 * tokens: n_tokens token ids; block_tokens: tokens per block (>= 1);
 * parent: NULL, or the 32-byte hash of the block before tokens[0];
 * extra/extra_len: LoRA id, tenant salt... (may be NULL/0);
 * out: room for out_cap hashes (out_cap * KVPOOL_KEY_BYTES bytes, e.g. a
 * uint8_t [out_cap][KVPOOL_KEY_BYTES] array); *n_out receives
 * n_tokens / block_tokens.
 * Errors: -EINVAL (block_tokens 0, NULL pointers with nonzero counts),
 *         -ENOSPC (out_cap < n_tokens / block_tokens; nothing written),
 *         -ENOMEM (the SHA-256 context could not be allocated). */
int kvpool_block_hashes(const uint32_t *tokens, size_t n_tokens, size_t block_tokens,
			const uint8_t *parent, const void *extra, size_t extra_len,
			void *out, size_t out_cap, size_t *n_out);

/* ---- several nodes: placement -------------------------------------------- */

/* A cluster handle (kvpool_connect with a node list or an etcd:// URL)
 * places each block on the node with the highest rendezvous (HRW) score
 * for (the block's key, node name), a hot block on the first
 * KVPOOL_HOT_REPLICAS of that ranking (docs/cluster.md, "Placement"). The
 * functions below expose the score and the ranking, e.g. for tools and
 * for the Python binding's tests. (Earlier versions placed segments of
 * KVPOOL_SEGMENT_BLOCKS blocks by their first key; the constant and
 * kvpool_set_segment_blocks remain for the callers of then.) */
#define KVPOOL_SEGMENT_BLOCKS 32
/* Nodes a hot block (one many chains share, e.g. a system prompt) is
 * written to under per-block placement (docs/cluster.md). */
#define KVPOOL_HOT_REPLICAS 2

/* The HRW score of `key` (KVPOOL_KEY_BYTES) on the node called node_name
 * (NUL-terminated): higher wins. Pure; any thread. Returns 0 for NULL
 * arguments (a real score may also be 0; pass valid arguments). */
uint64_t kvpool_hrw_score(const uint8_t key[KVPOOL_KEY_BYTES], const char *node_name);

/* The index (0..n-1) of the node among node_names[0..n) that owns block
 * `key`: the highest score, an equal score going to the smaller name
 * (strcmp). Pure; any thread.
 * Errors: -EINVAL (NULL key or array, a NULL name, n == 0). */
int kvpool_hrw_owner(const uint8_t key[KVPOOL_KEY_BYTES], const char *const *node_names,
		     size_t n);

/* The ranking of the nodes node_names[0..n) for `key`: their indices in
 * out[0..), highest score first, an equal score going to the smaller name
 * (strcmp); out[0] is kvpool_hrw_owner's answer. Writes the first
 * min(k, n, 64) indices and returns how many. Per-block placement puts a
 * block on out[0] of its own key's ranking, and a hot block on the first
 * KVPOOL_HOT_REPLICAS (docs/cluster.md); the ranking depends on the key
 * and the names only. Pure; any thread.
 * Errors: -EINVAL (NULL key, array or out, a NULL name, n == 0, k == 0). */
int kvpool_hrw_rank(const uint8_t key[KVPOOL_KEY_BYTES], const char *const *node_names,
		    size_t n, size_t *out, size_t k);

/* Kept for callers of the segment placement: placement is per block now,
 * the value is checked and ignored. kvpool_stats on a cluster handle
 * returns the nodes' documents summed (same keys as one server's; pid and
 * uptime_s left out, version and protocol as the nodes say when they all
 * agree, else "mixed", settings only in each node's own document) plus a
 * "cluster" object: membership ("static" or "etcd"), etcd (endpoint,
 * reachable, error, revision, failures, resumes), epoch, placement
 * ("block"), hot_replicas, hot_children, hot_blocks (keys this handle
 * marked hot), budget_ms, fallback (active, previous_nodes, changes,
 * fallback_ms), fallback_hits (blocks found only at a previous owner),
 * copies, copy_bytes, copies_dropped (background copies to new owners
 * and replicas), redirected_puts (blocks sent to the next node because
 * their owner was down), puts_nowhere, budget_expired, pending_removals,
 * ignored_nodes, error ("" or what is wrong: no member, every node down,
 * nodes past the limit), and nodes[] (name, url, up, state, error,
 * retry_in_ms, downs, probes, budget_expired, puts_redirected, share of
 * blocks, calls, errors, misses_from_errors, puts_dropped, stats: that
 * node's own document). Errors: -EINVAL (NULL, or more than 65536),
 * -EOPNOTSUPP (not a cluster handle). */
int kvpool_set_segment_blocks(struct kvpool_client *c, uint32_t blocks);

/* xxh3-64 (seed 0) of the concatenation of iov[0..iovcnt): the checksum the
 * protocol carries. Cannot fail. */
uint64_t kvpool_checksum(const struct iovec *iov, int iovcnt);

/* A static English description of any value this library returns
 * (0 and negative errnos). Never NULL. */
const char *kvpool_strerror(int err);

/* The server's own words for the last refusal this thread received: the
 * message of the last error reply (e.g. "hello refused: the token does
 * not grant namespace x", "put refused: the token is read-only in
 * namespace x"), through any handle or kvpool_connect; "" when the last
 * call got none (a timeout, a miss, a local error); after kvpool_poll,
 * the first refusal among the completions it returned (see "Refusals"
 * under the asynchronous API). On a cluster handle the words are those of
 * the first node that refused, after its name ("10.0.0.2:7470: hello
 * refused: ..."). Thread-local storage of the calling thread: valid until
 * that thread's next call into the library. Never NULL; cannot fail. Any
 * thread. */
const char *kvpool_last_server_message(void);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_H */
