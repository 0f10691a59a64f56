/*
 * proto.h - kvpool wire protocol (versions 1 and 2): frame and message
 * layouts, opcodes, status codes, and a bounds-checked encoder/decoder.
 *
 * PROTOCOL.md in this folder is the specification; this header is its C
 * rendering. Nothing here does I/O or allocates: every function works on
 * caller-provided byte buffers, so the same code serves kvpoold, libkvpool
 * and the fuzz targets.
 *
 * Conventions
 *  1. All integers on the wire are fixed-width little-endian.
 *  2. A frame is a 32-byte header, then `body_bytes` of body (the message's
 *     fixed fields and per-block entries), then `payload_bytes` of payload
 *     (block bytes: PUT requests and GET replies only).
 *  3. Functions return 0 or a negative errno. Out-parameters are written
 *     only on success, unless a function says otherwise.
 *  4. Decoded structures may point into the input buffer ("borrowed"): they
 *     stay valid only as long as that buffer does.
 *  5. A `limits` argument may be NULL: then only the protocol's own rules
 *     are checked, not configured limits (a client before its HELLO reply).
 *  6. Every function may be called from any thread: there is no state.
 *  7. Versions. A body's layout depends on the version in its frame's
 *     header (PROTOCOL.md section 14 lists what version 2 changes). The
 *     functions that read or write a layout that differs take that version
 *     (`version`: 1 or 2; 0 is taken as 1) or read it from a decoded
 *     struct proto_batch; the older functions without it keep the v1
 *     layout, so v1 code builds and behaves as before.
 */
#ifndef KVPOOL_PROTO_H
#define KVPOOL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_MAGIC 0x4C50564Bu /* bytes 'K' 'V' 'P' 'L' on the wire */
#define PROTO_VERSION_1 1
#define PROTO_VERSION_2 2
/* The header version of every HELLO (its layout is frozen, so that any
 * server reads it) and of every frame on a version-1 connection. */
#define PROTO_VERSION PROTO_VERSION_1
#define PROTO_VERSION_MIN PROTO_VERSION_1
#define PROTO_VERSION_MAX PROTO_VERSION_2
#define PROTO_HEADER_BYTES 32
#define PROTO_KEY_BYTES 32
#define PROTO_NAME_MAX_BYTES 255  /* namespace names */
#define PROTO_TOKEN_MAX_BYTES 1024 /* auth tokens */

/* Header flags. */
#define PROTO_FLAG_REPLY 0x0001u

enum proto_op {
	PROTO_OP_NONE = 0, /* only in a connection-level error reply (not tied
			      to a request: garbage, bad version, too many
			      connections); the connection then closes */
	PROTO_OP_HELLO = 1,
	PROTO_OP_PUT = 2,
	PROTO_OP_GET = 3,
	PROTO_OP_EXISTS = 4,
	PROTO_OP_MATCH = 5,
	PROTO_OP_DELETE = 6,
	PROTO_OP_DROP_NAMESPACE = 7,
	PROTO_OP_STATS = 8,
	PROTO_OP_PING = 9,
};
#define PROTO_OP_MAX PROTO_OP_PING

/* Status codes: one table, each maps to exactly one errno (see
 * proto_status_to_errno). OK and EXISTS both mean success. */
enum proto_status {
	PROTO_STATUS_OK = 0,
	PROTO_STATUS_EXISTS = 1,       /* already stored: success, nothing new stored */
	PROTO_STATUS_NOT_FOUND = 2,    /* ENOENT */
	PROTO_STATUS_NO_PARENT = 3,    /* ENOLINK: parent of a non-first block not stored */
	PROTO_STATUS_FULL = 4,         /* ENOSPC: nothing evictable */
	PROTO_STATUS_QUOTA = 5,        /* EDQUOT */
	PROTO_STATUS_BUSY = 6,         /* EAGAIN: retry later */
	PROTO_STATUS_TOO_LARGE = 7,    /* EMSGSIZE */
	PROTO_STATUS_DENIED = 8,       /* EACCES */
	PROTO_STATUS_BAD_REQUEST = 9,  /* EPROTO */
	PROTO_STATUS_IO = 10,          /* EIO */
	PROTO_STATUS_UNSUPPORTED = 11, /* EOPNOTSUPP */
	PROTO_STATUS_BAD_CHECKSUM = 12,/* EBADMSG */
};
#define PROTO_STATUS_MAX PROTO_STATUS_BAD_CHECKSUM

/* Where a block lives, as reported in per-block results. */
enum proto_tier {
	PROTO_TIER_NONE = 0,
	PROTO_TIER_DRAM = 1,
	PROTO_TIER_NVME = 2,
};

/* PUT entry flags. */
#define PROTO_PUT_HAS_PARENT 0x00000001u

/* PUT result flags (v2; result entry offset 3). */
#define PROTO_PUT_RETAINED 0x01u       /* a retention was taken (retain_ms > 0) */
#define PROTO_PUT_RETAIN_BUDGET 0x02u  /* retention asked, refused for the budget;
					  the block is stored without it */
#define PROTO_PUT_RETAIN_CLAMPED 0x04u /* retain_ms was cut to max_retain_ms */
#define PROTO_PUT_RESULT_FLAGS 0x07u   /* every bit defined */

/* MATCH reply flags (v2; MATCH reply offset 8). */
#define PROTO_MATCH_LEASE_CUT 0x001u      /* the lease of the present run would pass a
					     leased-bytes bound: matched is the longest
					     leading run whose lease fits */
#define PROTO_MATCH_WAITED 0x002u         /* parked: fewer than `want` were present */
#define PROTO_MATCH_WAIT_TIMEOUT 0x004u   /* answered because wait_ms passed */
#define PROTO_MATCH_WAIT_REFUSED 0x008u   /* a waiting limit was reached: answered at once */
#define PROTO_MATCH_WAIT_CLAMPED 0x010u   /* wait_ms was cut to max_match_wait_ms */
#define PROTO_MATCH_WAIT_ENDED 0x020u     /* the server ended the wait early */
#define PROTO_MATCH_RETAIN_BUDGET 0x040u  /* retention refused for the budget */
#define PROTO_MATCH_RETAIN_CLAMPED 0x080u /* retain_ms was cut to max_retain_ms */
#define PROTO_MATCH_FLAGS 0x0ffu          /* every bit defined */

/* The 32-byte frame header. Layout (byte offset: field):
 *   0: magic u32 | 4: version u8 | 5: opcode u8 | 6: flags u16 |
 *   8: status u16 | 10: reserved u16 (0) | 12: body_bytes u32 |
 *  16: request_id u64 | 24: payload_bytes u64 */
struct proto_header {
	uint32_t magic;
	uint8_t version;
	uint8_t opcode;
	uint16_t flags;
	uint16_t status;        /* requests: 0; replies: whole-request status */
	uint32_t body_bytes;    /* bytes of body after the header */
	uint64_t request_id;    /* chosen by the client, echoed in the reply */
	uint64_t payload_bytes; /* bytes of block payload after the body */
};

/* Limits a decoder enforces. A server fills these from its configuration;
 * a client from the server's HELLO reply. */
struct proto_limits {
	uint32_t max_frame_bytes;  /* header + body; payload not included */
	uint32_t max_batch_blocks; /* entries per batch message */
	uint64_t max_block_bytes;  /* one block's payload */
};

/* Byte sizes of the fixed parts of messages. */
#define PROTO_BATCH_PREFIX_BYTES 8  /* u32 count, u32 aux */
#define PROTO_PUT_ENTRY_BYTES 88    /* key 32, parent 32, length u64, checksum u64, flags u32, reserved u32 */
#define PROTO_GET_ENTRY_BYTES 40    /* key 32, max_length u64 */
#define PROTO_KEY_ENTRY_BYTES 32    /* EXISTS, MATCH, DELETE */
#define PROTO_RESULT_ENTRY_BYTES 24 /* status u16, tier u8, flags u8 (v1 reserved),
				       retain_ms u32 (v1 reserved), length u64, checksum u64 */
#define PROTO_HELLO_FIXED_BYTES 8   /* min_version u16, max_version u16, ns_len u16, token_len u16 */
#define PROTO_HELLO_REPLY_BYTES 40  /* v1 */
#define PROTO_HELLO_REPLY_V2_BYTES 48 /* v2: v1's 40, max_match_wait_ms u32, max_retain_ms u32 */
#define PROTO_HELLO_REPLY_MAX_BYTES PROTO_HELLO_REPLY_V2_BYTES
#define PROTO_MATCH_REPLY_BYTES 8   /* v1: matched u32, lease_ms u32 */
#define PROTO_MATCH_REPLY_V2_BYTES 24 /* v2: matched, lease_ms, flags, present, retained,
					 retain_ms (u32 each) */
#define PROTO_MATCH_REPLY_MAX_BYTES PROTO_MATCH_REPLY_V2_BYTES
#define PROTO_MATCH_OPTS_BYTES 16   /* v2 MATCH request: wait_ms, want, retain_ms, reserved */
#define PROTO_MATCH_V2_PREFIX_BYTES (PROTO_BATCH_PREFIX_BYTES + PROTO_MATCH_OPTS_BYTES)
#define PROTO_DROP_REPLY_BYTES 16   /* blocks u64, bytes u64 */
#define PROTO_ERROR_FIXED_BYTES 8   /* min_version u16, max_version u16, message_bytes u32 */
#define PROTO_ERROR_MESSAGE_MAX_BYTES 1024

/* ---- header ---------------------------------------------------------- */

/* Write `h` into out[0..31]. Cannot fail. */
void proto_header_encode(const struct proto_header *h, uint8_t out[PROTO_HEADER_BYTES]);

/* Decode in[0..31] into *out and check it against `limits`.
 * *out is written even on error (except -EPROTO for a bad magic), so a
 * server can still echo the request id and opcode in its error reply.
 * Checks run in this order; the first failing one is returned.
 * Errors:
 *   -EPROTO           bad magic
 *   -EPROTONOSUPPORT  version outside PROTO_VERSION_MIN..MAX
 *   -EPROTO           nonzero reserved field, flag bits other than REPLY,
 *                     REPLY flag set where a request was expected
 *                     (is_reply == 0) or missing where a reply was expected
 *                     (is_reply == 1), nonzero status in a request, status
 *                     above PROTO_STATUS_MAX in a reply
 *   -EOPNOTSUPP       opcode unknown (PROTO_OP_NONE and unknown opcodes
 *                     are accepted only in a reply whose status is neither
 *                     OK nor EXISTS: an error reply echoes the opcode of the
 *                     request it refuses)
 *   -EMSGSIZE         header + body_bytes > limits->max_frame_bytes, or
 *                     payload_bytes > max_batch_blocks * max_block_bytes
 *   -EBADMSG          payload_bytes nonzero on a frame that carries none
 *                     (anything but a PUT request or a successful GET
 *                     reply). A server answers this one BAD_REQUEST, not
 *                     BAD_CHECKSUM.
 */
int proto_header_decode(const uint8_t in[PROTO_HEADER_BYTES], int is_reply,
			const struct proto_limits *limits, struct proto_header *out);

/* ---- batch messages (PUT, GET, EXISTS, MATCH, DELETE requests; per-block
 * results in replies) ---------------------------------------------------
 * Body: u32 count, u32 aux, then count fixed-size entries. aux is lease_ms
 * for MATCH and 0 elsewhere. A v2 MATCH request has 16 bytes of options
 * between the prefix and the keys: decode it with proto_match_decode. */

struct proto_batch {
	uint32_t count;
	uint32_t aux;
	const uint8_t *entries; /* borrowed from the decoded body */
	uint32_t entry_bytes;
	uint8_t version;        /* layout of the entries: 1 or 2 (0 reads as 1) */
};

/* Entry size in bytes of a request batch of `op` (PUT 88, GET 40,
 * EXISTS/MATCH/DELETE 32), or 0 if `op` carries no batch. The same in
 * both versions. */
uint32_t proto_request_entry_bytes(uint8_t op);

/* Body bytes of a batch of `count` entries of `entry_bytes` each (not a
 * v2 MATCH request: proto_match_body_bytes). */
size_t proto_batch_body_bytes(uint32_t count, uint32_t entry_bytes);

/* Decode a v1 batch body of `body_bytes` bytes with entries of
 * `entry_bytes`: proto_batch_decode_v with version 1. */
int proto_batch_decode(const uint8_t *body, size_t body_bytes, uint32_t entry_bytes,
		       const struct proto_limits *limits, struct proto_batch *out);

/* Decode a batch body of protocol `version` (1 or 2; 0 reads as 1).
 * Reserved bytes are checked for the entry sizes that have them in that
 * version: in v1, a PUT entry's offset 84 and a result's offsets 3..7; in
 * v2 those bytes are fields (retain_ms, flags) and the entry decoders
 * check them. Checks run in the order listed.
 * Errors:
 *   -EINVAL    entry_bytes == 0 (a caller bug)
 *   -EPROTO    body shorter than the prefix, count == 0
 *   -EMSGSIZE  count > limits->max_batch_blocks
 *   -EPROTO    body_bytes not exactly 8 + count * entry_bytes, nonzero
 *              reserved bytes, a version other than 0, 1 or 2; nonzero
 *              aux where the op takes none is checked by the caller */
int proto_batch_decode_v(const uint8_t *body, size_t body_bytes, uint32_t entry_bytes,
			 uint8_t version, const struct proto_limits *limits,
			 struct proto_batch *out);

/* Write the batch prefix into body[0..7]. The caller then writes entries.
 * Cannot fail; `body` must hold proto_batch_body_bytes(count, ...). */
void proto_batch_encode_prefix(uint8_t *body, uint32_t count, uint32_t aux);

struct proto_put_entry {
	uint8_t key[PROTO_KEY_BYTES];
	uint8_t parent[PROTO_KEY_BYTES]; /* all zero when !(flags & HAS_PARENT) */
	uint64_t length;                 /* payload bytes of this block */
	uint64_t checksum;               /* xxh3-64, seed 0, of the payload */
	uint32_t flags;                  /* PROTO_PUT_HAS_PARENT */
	uint32_t retain_ms;              /* v2: keep the block this long after its
					    commit (0: an ordinary block); v1: 0 */
};

struct proto_get_entry {
	uint8_t key[PROTO_KEY_BYTES];
	uint64_t max_length; /* the client's buffer bytes; a bigger block is
				answered TOO_LARGE and not sent */
};

struct proto_result {
	uint16_t status;   /* enum proto_status */
	uint8_t tier;      /* enum proto_tier */
	uint64_t length;   /* GET: bytes that follow in the payload (status OK);
			      PUT/EXISTS: the stored block's length, else 0 */
	uint64_t checksum; /* GET/PUT: xxh3-64 of the stored bytes, else 0 */
	uint8_t flags;     /* v2 PUT results: PROTO_PUT_RETAINED...; else 0 */
	uint32_t retain_ms;/* v2 PUT results: retention granted (ms); else 0 */
};

/* Entry accessors. i must be < batch->count (not checked); encoders write
 * entry i of a batch body whose prefix starts at `body`. Entry decoders
 * follow b->version and return -EPROTO for nonzero reserved bytes (v1),
 * unknown flags, a PUT parent that is nonzero without
 * PROTO_PUT_HAS_PARENT or all zero with it, or a result with an unknown
 * status or tier; in v2 also a result with flag bits outside
 * PROTO_PUT_RESULT_FLAGS, or whose PROTO_PUT_RETAINED and nonzero
 * retain_ms disagree; else 0.
 * The encoders without a version write the v1 layout: a PUT entry's
 * retain_ms and a result's flags and retain_ms are not written (zeros go
 * on the wire). The _v encoders write them when version >= 2. */
int proto_put_entry_decode(const struct proto_batch *b, uint32_t i, struct proto_put_entry *out);
void proto_put_entry_encode(uint8_t *body, uint32_t i, const struct proto_put_entry *e);
void proto_put_entry_encode_v(uint8_t *body, uint32_t i, uint8_t version,
			      const struct proto_put_entry *e);
void proto_get_entry_decode(const struct proto_batch *b, uint32_t i, struct proto_get_entry *out);
void proto_get_entry_encode(uint8_t *body, uint32_t i, const struct proto_get_entry *e);
const uint8_t *proto_key_entry(const struct proto_batch *b, uint32_t i);
void proto_key_entry_encode(uint8_t *body, uint32_t i, const uint8_t key[PROTO_KEY_BYTES]);
int proto_result_decode(const struct proto_batch *b, uint32_t i, struct proto_result *out);
void proto_result_encode(uint8_t *body, uint32_t i, const struct proto_result *r);
void proto_result_encode_v(uint8_t *body, uint32_t i, uint8_t version,
			   const struct proto_result *r);

/* Check a decoded PUT batch against its header: every entry is valid (as
 * proto_put_entry_decode), every length is in 1..limits->max_block_bytes
 * and the lengths add up exactly to payload_bytes (without overflow). On
 * error *bad_index names the first offending entry: for a sum mismatch,
 * the entry that takes the sum past payload_bytes, or the last entry when
 * the lengths fall short. Errors: -EPROTO (zero length, bad flags or
 * parent, a v1 entry with nonzero reserved bytes, sum differs from
 * payload_bytes), -EMSGSIZE (a block over max_block_bytes). */
int proto_put_batch_check(const struct proto_batch *b, uint64_t payload_bytes,
			  const struct proto_limits *limits, uint32_t *bad_index);

/* ---- MATCH requests ------------------------------------------------------
 * v1: a batch of keys, aux = lease_ms.
 * v2: count u32, lease_ms u32, then the options (wait_ms u32, want u32,
 * retain_ms u32, reserved u32 = 0), then the keys from offset 24:
 * body_bytes = 24 + 32 * count. */

struct proto_match_opts {
	uint32_t wait_ms;   /* > 0: the server may wait up to this for `want` keys */
	uint32_t want;      /* leading keys wanted, 0 = count; never above count */
	uint32_t retain_ms; /* > 0: extend the matched run's retention */
};

struct proto_match_req {
	struct proto_batch keys;     /* count, aux = lease_ms, 32-byte key entries
					(proto_key_entry), version */
	uint32_t lease_ms;           /* = keys.aux */
	struct proto_match_opts opts;/* all zero in v1 */
};

/* Body bytes of a MATCH request of `count` keys in `version`. */
size_t proto_match_body_bytes(uint8_t version, uint32_t count);

/* Write a MATCH request's prefix (and in v2 its options; opts may be NULL
 * for none) into body, for `count` keys that the caller then writes with
 * proto_match_key_encode. In v1 the options are not sent: the caller drops
 * them (a v1 server cannot wait or retain). body must hold
 * proto_match_body_bytes(version, count). Cannot fail. */
void proto_match_encode_prefix(uint8_t *body, uint8_t version, uint32_t count, uint32_t lease_ms,
			       const struct proto_match_opts *opts);
void proto_match_key_encode(uint8_t *body, uint8_t version, uint32_t i,
			    const uint8_t key[PROTO_KEY_BYTES]);

/* Decode a MATCH request body of `version` (0 reads as 1). On success
 * out->keys.entries points at the keys (borrowed from body) and
 * out->opts.want is as sent (0 = count). Checks in this order:
 *   -EPROTO    body shorter than its prefix, count == 0
 *   -EMSGSIZE  count > limits->max_batch_blocks
 *   -EPROTO    body_bytes not exactly proto_match_body_bytes(version,
 *              count), nonzero reserved option bytes, want > count, a
 *              version other than 0, 1 or 2 */
int proto_match_decode(const uint8_t *body, size_t body_bytes, uint8_t version,
		       const struct proto_limits *limits, struct proto_match_req *out);

/* ---- HELLO ----------------------------------------------------------- */

struct proto_hello {
	uint16_t min_version, max_version; /* versions the client speaks */
	const char *ns;                    /* borrowed, not NUL-terminated */
	uint16_t ns_len;                   /* 1..PROTO_NAME_MAX_BYTES */
	const char *token;                 /* borrowed; may be NULL when len 0 */
	uint16_t token_len;                /* 0..PROTO_TOKEN_MAX_BYTES */
};

/* Body bytes of a HELLO request. */
size_t proto_hello_body_bytes(const struct proto_hello *h);
/* Encode into body (capacity cap). -EINVAL if ns_len or token_len is out
 * of range, the name has a byte outside 0x21..0x7e, a pointer is NULL with
 * a nonzero length, or the versions are 0 or min > max; -ENOSPC if cap is
 * too small. */
int proto_hello_encode(const struct proto_hello *h, uint8_t *body, size_t cap);
/* -EPROTO on lengths that do not add up or are out of range, a name byte
 * outside 0x21..0x7e, versions 0 or min > max. A version range that does
 * not meet ours is not a decode error (the server answers UNSUPPORTED). */
int proto_hello_decode(const uint8_t *body, size_t body_bytes, struct proto_hello *out);

struct proto_hello_reply {
	uint16_t version;          /* the version this connection will use; also
				      the layout of this reply (40 or 48 bytes) */
	uint16_t rdma_port;        /* 0: RDMA not served */
	uint32_t max_batch_blocks;
	uint64_t max_block_bytes;
	uint32_t max_frame_bytes;
	uint32_t max_lease_ms;
	uint64_t max_inflight_put_bytes;
	uint64_t server_flags;     /* reserved, 0 */
	uint32_t max_match_wait_ms;/* v2: a MATCH's wait_ms is cut to this; v1: 0 */
	uint32_t max_retain_ms;    /* v2: retain_ms is cut to this; v1: 0 */
};
/* Layout: version u16, rdma_port u16, max_batch_blocks u32,
 * max_block_bytes u64, max_frame_bytes u32, max_lease_ms u32,
 * max_inflight_put_bytes u64, server_flags u64 = 40 bytes (v1); v2 adds
 * max_match_wait_ms u32, max_retain_ms u32 = 48 bytes. */

/* Bytes of the HELLO reply of `version`: 40 for 1 (and 0), 48 from 2. */
size_t proto_hello_reply_bytes(uint16_t version);
/* Write the reply in the layout of r->version: body must hold
 * proto_hello_reply_bytes(r->version) bytes (PROTO_HELLO_REPLY_MAX_BYTES
 * always does). In v1 the two v2 fields are not written. */
void proto_hello_reply_encode(const struct proto_hello_reply *r, uint8_t *body);
/* -EPROTO if version is outside PROTO_VERSION_MIN..MAX or body_bytes is
 * not proto_hello_reply_bytes(version), server_flags nonzero, a zero
 * max_batch_blocks or max_block_bytes, or a max_frame_bytes too small for
 * one PUT entry (32 + 8 + 88). A v1 reply decodes with the v2 fields 0. */
int proto_hello_reply_decode(const uint8_t *body, size_t body_bytes, struct proto_hello_reply *out);

/* ---- MATCH reply, DROP_NAMESPACE, STATS -------------------------------- */

/* The MATCH reply. v1 carries matched and lease_ms only. */
struct proto_match_reply {
	uint32_t matched;   /* leading run answered (leased, when a lease was asked) */
	uint32_t lease_ms;  /* lease granted (0: none) */
	uint32_t flags;     /* PROTO_MATCH_* */
	uint32_t present;   /* leading run present when answered: >= matched, and
			       > matched only with PROTO_MATCH_LEASE_CUT */
	uint32_t retained;  /* leading blocks whose retention was set or extended,
			       <= present */
	uint32_t retain_ms; /* retention granted (0 when retained is 0) */
};

/* v1 only (8 bytes): kept for v1 code. */
void proto_match_reply_encode(uint32_t matched, uint32_t lease_ms, uint8_t body[PROTO_MATCH_REPLY_BYTES]);
/* -EPROTO if body_bytes != 8. */
int proto_match_reply_decode(const uint8_t *body, size_t body_bytes, uint32_t *matched, uint32_t *lease_ms);

/* Bytes of a MATCH reply of `version`: 8 for 1 (and 0), 24 from 2. */
size_t proto_match_reply_bytes(uint8_t version);
/* Write r in the layout of `version` (v1: matched and lease_ms only);
 * body must hold proto_match_reply_bytes(version). Cannot fail. */
void proto_match_reply_encode_v(uint8_t version, const struct proto_match_reply *r, uint8_t *body);
/* Decode a MATCH reply of `version`; a v1 reply gives present = matched
 * and the v2 fields 0. -EPROTO if body_bytes is not
 * proto_match_reply_bytes(version), a version other than 0, 1 or 2, and
 * in v2: flag bits outside PROTO_MATCH_FLAGS, present < matched, present
 * > matched without PROTO_MATCH_LEASE_CUT, retained > present, or
 * retained and retain_ms not both zero or both nonzero. The caller checks
 * the counts against the keys it sent. */
int proto_match_reply_decode_v(const uint8_t *body, size_t body_bytes, uint8_t version,
			       struct proto_match_reply *out);

/* The namespace-name rule, the one copy of it that the server, the
 * client library and the CLI check against: is name[0..len) 1 ..
 * PROTO_NAME_MAX_BYTES bytes of printable ASCII without blanks (0x21 ..
 * 0x7e), so that it can appear verbatim in logs, JSON keys and metric
 * labels? False for a NULL name. */
bool proto_name_valid(const char *name, size_t len);

/* DROP_NAMESPACE and STATS requests carry one name:
 * u16 name_len, u16 reserved(0), name bytes. name_len 0 means "the
 * connection's namespace" (DROP) or "all namespaces" (STATS). */
size_t proto_name_body_bytes(uint16_t name_len);
/* -EINVAL if name_len > PROTO_NAME_MAX_BYTES, name is NULL with a nonzero
 * length or has a byte outside 0x21..0x7e; -ENOSPC if cap is too small. */
int proto_name_encode(const char *name, uint16_t name_len, uint8_t *body, size_t cap);
/* *name is borrowed from body (NULL when *name_len is 0).
 * -EPROTO on a length mismatch, name_len > PROTO_NAME_MAX_BYTES, nonzero
 * reserved bytes or a name byte outside 0x21..0x7e. */
int proto_name_decode(const uint8_t *body, size_t body_bytes, const char **name, uint16_t *name_len);

void proto_drop_reply_encode(uint64_t blocks, uint64_t bytes, uint8_t body[PROTO_DROP_REPLY_BYTES]);
/* -EPROTO if body_bytes != 16. */
int proto_drop_reply_decode(const uint8_t *body, size_t body_bytes, uint64_t *blocks, uint64_t *bytes);

/* The STATS reply body is UTF-8 JSON text (no NUL); PROTOCOL.md lists its
 * keys. No codec is needed beyond the header. */

/* ---- error replies ------------------------------------------------------
 * A reply whose header status is not OK/EXISTS carries this body:
 * min_version u16, max_version u16 (the versions the server speaks),
 * message_bytes u32, message (UTF-8, not NUL-terminated, <= 1024 bytes). */
size_t proto_error_body_bytes(size_t message_bytes);
/* Encode an error body naming PROTO_VERSION_MIN..MAX. -EINVAL if
 * message_bytes > PROTO_ERROR_MESSAGE_MAX_BYTES (or message is NULL with
 * message_bytes > 0), -ENOSPC if cap < proto_error_body_bytes(). */
int proto_error_encode(const char *message, size_t message_bytes, uint8_t *body, size_t cap);
/* *message is borrowed from body (NULL when message_bytes is 0).
 * -EPROTO if body_bytes is not 8 + message_bytes, the message is over
 * PROTO_ERROR_MESSAGE_MAX_BYTES, or the versions are 0 or min > max. */
int proto_error_decode(const uint8_t *body, size_t body_bytes, uint16_t *min_version,
		       uint16_t *max_version, const char **message, uint32_t *message_bytes);

/* ---- status tables --------------------------------------------------- */

/* Map a status to 0 (OK, EXISTS) or a negative errno per the table above;
 * an unknown status maps to -EPROTO. */
int proto_status_to_errno(uint16_t status);
/* Inverse map for the errnos in the table (0 -> OK); also -EEXIST ->
 * EXISTS (the store's "already stored") and -EPROTONOSUPPORT ->
 * UNSUPPORTED. err may be negative or positive. Anything else -> IO. */
uint16_t proto_status_from_errno(int err);
/* "OK", "EXISTS", "NOT_FOUND", ...; "UNKNOWN" for out-of-range values. */
const char *proto_status_name(uint16_t status);
/* "HELLO", "PUT", ...; "UNKNOWN" for out-of-range values. */
const char *proto_op_name(uint8_t op);

/* ---- little-endian helpers (also used by transports) ------------------- */
static inline void proto_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void proto_put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void proto_put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t proto_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t proto_get_u32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline uint64_t proto_get_u64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

#endif /* KVPOOL_PROTO_H */
