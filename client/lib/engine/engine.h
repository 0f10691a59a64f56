/*
 * engine.h - libkvpool's request engine (internal): the one place where
 * requests to one kvpoold are cut into frames, pipelined on its
 * connection, answered, retried after BUSY, timed out and completed. Every
 * call of a one-node handle runs here: an asynchronous call is a submit
 * and a poll, a blocking call is a submit and a wait (kvc_engine_call),
 * as libcurl's easy interface drives its multi engine. The engine starts
 * no thread; all I/O happens inside its calls, on whatever transport the
 * session's URL names (net/transport.h), stream or message.
 *
 * A cluster handle (cluster/cluster.h) is a second implementation of the
 * same interface (struct kvc_backend) over one engine per node.
 *
 * Threads: every function may be called from any thread at any time on one
 * engine (they take its lock); kvc_engine_close alone must not overlap
 * any other call.
 */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

struct kvc_tls_ctx;
struct kvc_engine;
struct kvc_region;

/* Whole-pool requests, beside enum kvpool_op's data requests. */
enum kvc_admin_op {
	KVC_OP_STATS = 16, /* the STATS document of ns (NULL: all) into json */
	KVC_OP_PING,       /* a round trip; u64 = its time in microseconds */
	KVC_OP_DROP,       /* DROP_NAMESPACE of ns (NULL: the handle's); u64 = blocks */
	KVC_OP_LIMITS,     /* connect if needed; limits = the server's */
};

/* One request, whatever its op. Pointers are the caller's and borrowed
 * until the request completes (kvpool.h, "Ownership"). */
struct kvc_req {
	int op;                                  /* enum kvpool_op or kvc_admin_op */
	const struct kvpool_put_block *put;      /* PUT */
	struct kvpool_get_block *get;            /* GET */
	const uint8_t (*keys)[KVPOOL_KEY_BYTES]; /* EXISTS, MATCH, DELETE */
	size_t count;
	int *statuses;                           /* may be NULL where kvpool.h allows */
	uint32_t *flags;                         /* PUT: per block KVPOOL_PUT_*, or NULL */
	struct kvpool_match_opts mopts;          /* MATCH: lease, wait, want, retention */
	struct kvpool_match_result *mres;        /* MATCH: written when it ends with 0, or NULL */
	const char *ns;                          /* STATS, DROP */
	uint64_t tag;                            /* returned in the completion */
	uint64_t deadline_ms;                    /* 0: the handle's timeout from submit */
};

/* What a finished request returns besides its statuses. */
struct kvc_result {
	int status;                  /* what the synchronous call returns */
	struct kvpool_match_result match; /* MATCH */
	uint64_t u64;                /* DROP: blocks dropped; PING: round trip (us) */
	char *json;                  /* STATS: the document, malloc'd, the caller's */
	struct kvpool_limits limits; /* LIMITS */
	char *msg;                   /* the server's refusal message, malloc'd, or NULL */
};

/* One finished request as kvc_engine_poll_ex returns it. */
struct kvc_done {
	struct kvpool_completion c;
	struct kvc_result res;
};

/* The operations a handle's backend provides (an engine, or a cluster):
 * the public API (api/) calls nothing else. */
struct kvc_backend {
	int (*call)(void *be, const struct kvc_req *r, struct kvc_result *res);
	int (*submit)(void *be, const struct kvc_req *r, uint64_t *id);
	int (*poll)(void *be, struct kvpool_completion *out, int max, int timeout_ms);
	int (*cancel)(void *be, uint64_t id);
	int (*event_fd)(void *be);
	uint32_t (*inflight)(void *be);
	int (*set_max_inflight)(void *be, uint32_t max);
	void (*set_timeout)(void *be, uint32_t timeout_ms);
	void (*set_busy_tries)(void *be, uint32_t tries);
	int (*get_limits)(void *be, struct kvpool_limits *out);
	void (*get_counters)(void *be, struct kvpool_counters *out);
	int (*reg)(void *be, const void *buf, size_t len);
	int (*unreg)(void *be, const void *buf);
	void (*close)(void *be);
};

/* The engine's backend table (be: a struct kvc_engine). */
extern const struct kvc_backend kvc_engine_backend;

/* Make an engine for url (tcp://, tls://, rdma://, auto://), namespace
 * ns, token (may be NULL), per-request timeout (0: the default) and TLS
 * settings (may be NULL; needed for tls://; the engine takes a
 * reference). Does not connect. Errors: those of kvc_session_init. */
int kvc_engine_open(const char *url, const char *ns, const char *token, uint32_t timeout_ms,
		    struct kvc_tls_ctx *tls, struct kvc_engine **out);

/* Connect now if not connected (blocks up to the timeout).
 * Errors: the shared connection errors, -EACCES, -EOPNOTSUPP. */
int kvc_engine_connect(struct kvc_engine *e);

/* Close the connection and free the engine. Requests in flight are
 * dropped: no completion comes and no buffer is touched after it
 * returns. Accepts NULL. */
void kvc_engine_close(struct kvc_engine *e);

/* Submit with flags; KVC_SUBMIT_NOCONNECT: do not connect, answer
 * -ENOTCONN instead when not connected (a cluster's node thread connects
 * first, so that submits stay short). Otherwise as the backend's submit. */
#define KVC_SUBMIT_NOCONNECT 1
int kvc_engine_submit(struct kvc_engine *e, const struct kvc_req *r, int flags, uint64_t *id);

/* Make progress without waiting and copy up to max finished requests,
 * with their full results (the caller owns res.json and res.msg).
 * Returns how many. */
int kvc_engine_poll_ex(struct kvc_engine *e, struct kvc_done *out, int max);

/* Free what a result owns (json, msg). */
void kvc_result_clear(struct kvc_result *res);

/* ---- test hooks and diagnostics (not exported by libkvpool.so) ---------- */

/* What tests look at inside an engine. */
struct kvc_engine_info {
	const char *transport;        /* "tcp", "rdma", or NULL when disconnected */
	int fd;                       /* the TCP socket, -1 otherwise */
	void *stage;                  /* RDMA staging buffer, or NULL */
	size_t stage_bytes;
	uint64_t rdma_connects;       /* connections over RDMA that completed HELLO */
	size_t max_wire_frames;       /* most frames seen awaiting replies at once */
	size_t n_regions;             /* registered regions */
	struct kvpool_limits limits;  /* the last HELLO's */
	uint64_t checksum_errors;
	const char *server_message;   /* the last refusal's words ("" if none) */
};
void kvc_engine_info(struct kvc_engine *e, struct kvc_engine_info *out);

/* Close the connection now (the next request reconnects). */
void kvc_engine_disconnect(struct kvc_engine *e);

/* The registered region holding all of buf[0..len) (its transport
 * registration in ->mr, NULL on TCP), or NULL. The pointer is valid until
 * the next register/unregister call. */
const struct kvc_region *kvc_engine_region(struct kvc_engine *e, const void *buf, size_t len);

#endif /* KVC_ENGINE_H */
