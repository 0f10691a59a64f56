/*
 * cluster.h - one libkvpool handle over several kvpoold nodes (internal;
 * the public side is kvpool_connect's node-list and etcd:// URLs in
 * kvpool.h, and docs/cluster.md).
 *
 * A cluster handle is a struct kvpool_client whose `cluster` member is
 * set; every public data call on it comes here (one line at the top of
 * each). It holds one ordinary handle per node (struct kvcl_node), each
 * driven by a thread of its own, so that the per-node parts of a call run
 * in parallel: one round for MATCH, PUT, GET, EXISTS and DELETE. The
 * membership is a static list, or etcd's kvpool/<cluster>/nodes/ prefix,
 * read at connect and then followed by a watch thread (membership.c).
 *
 * Threads: like any handle, one caller thread at a time. Inside, each node
 * thread uses only its node's handle, and only while the caller waits for
 * it; the watch thread changes the membership under cl->lock, which the
 * caller takes only to copy it at the start of a call.
 */
#ifndef KVC_CLUSTER_H
#define KVC_CLUSTER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "kvpool.h"

#define KVCL_MAX_NODES 64
#define KVCL_NAME_MAX_BYTES 128
#define KVCL_RETRY_MS 1000       /* a node that failed is tried again after this */
#define KVCL_POS_SLOTS (1u << 16) /* chain positions remembered (see cluster.c) */
#define KVCL_POS_WAYS 8
#define KVCL_ETCD_TIMEOUT_MS 2000

struct kvcl;

/* One node: its name (placement hashes it), address, handle and thread. */
struct kvcl_node {
	struct kvcl *cl;
	char name[KVCL_NAME_MAX_BYTES + 1];
	uint64_t seed;              /* kvc_hrw_node_seed(name) */
	char url[320];              /* tcp://address:port; under cl->lock */
	int url_changed;            /* under cl->lock: reconnect before the next job */
	int member;                 /* under cl->lock: in the current membership */
	char record[512];           /* the etcd record (JSON), "" for static lists */

	struct kvpool_client *h;    /* the node's own handle; node thread or caller */
	uint64_t retry_at_ms;       /* do not try to connect before this */
	int reachable;              /* the last call reached it */
	int last_error;             /* its -errno, 0 when none */

	/* its thread and the one job it may hold */
	pthread_t thread;
	int has_thread;
	int (*job)(struct kvcl *cl, struct kvcl_node *n, void *arg);
	void *job_arg;
	int job_rc;
	int quit;

	/* per-node counters (caller thread) */
	uint64_t calls, errors, misses_from_errors, puts_dropped;
};

struct kvcl {
	struct kvpool_client *owner;       /* the public handle */
	char ns[256];
	char *token;
	uint32_t timeout_ms, busy_tries;
	uint32_t segment_blocks;           /* D */

	pthread_mutex_t lock;              /* membership, node jobs, etcd state */
	pthread_cond_t job_cond;           /* a node has a job / quit */
	pthread_cond_t done_cond;          /* a job finished */
	unsigned int jobs_pending;
	struct kvcl_node *nodes[KVCL_MAX_NODES]; /* every node ever seen; never freed before close */
	size_t n_nodes;
	uint64_t epoch;                    /* membership changes seen */

	/* etcd (NULL endpoint[0] for a static list) */
	char endpoint[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];
	char cluster[KVC_ETCD_CLUSTER_MAX_BYTES + 1];
	char prefix[128];
	int etcd_reachable;                /* under lock */
	char etcd_error[128];              /* under lock */
	uint64_t etcd_failures, etcd_resumes; /* under lock */
	int64_t etcd_revision;             /* under lock */
	pthread_t watch_thread;
	int has_watch;
	volatile int stop;

	/* chain positions: key -> (position, first key of its segment) */
	struct kvcl_pos *pos;
	uint32_t pos_clock;

	/* per-call scratch, grown as needed and reused (caller thread) */
	void *scratch;
	size_t scratch_bytes;

	/* counters */
	uint64_t unplaced;                 /* blocks whose chain position was unknown */
};

/* kvpool_connect for a node list ("tcp://a:7470,b:7470"; scheme on the
 * first or on each) or "etcd://HOST[:PORT]/CLUSTER". Returns 0 with *out
 * a cluster handle. Errors: -EINVAL (bad URL or namespace), -ENOMEM,
 * -ECONNREFUSED / -ETIMEDOUT / -EPROTO (etcd could not be read at
 * connect), -E2BIG (more than KVCL_MAX_NODES nodes). */
int kvcl_connect(const char *url, const char *ns, const struct kvpool_options *opts,
		 struct kvpool_client **out);

/* Is `url` a cluster URL (a comma, or etcd://)? */
int kvcl_is_cluster_url(const char *url);

void kvcl_close(struct kvcl *cl);
void kvcl_set_timeout(struct kvcl *cl, uint32_t timeout_ms);
void kvcl_set_busy_tries(struct kvcl *cl, uint32_t tries);
int kvcl_get_limits(struct kvcl *cl, struct kvpool_limits *out);
int kvcl_get_counters(const struct kvcl *cl, struct kvpool_counters *out);
/* flags (may be NULL): per block KVPOOL_PUT_* (kvpool_put_ex). */
int kvcl_put(struct kvcl *cl, const struct kvpool_put_block *blocks, size_t count,
	     int *statuses, uint32_t *flags);
int kvcl_get(struct kvcl *cl, struct kvpool_get_block *blocks, size_t count, int *statuses);
int kvcl_exists(struct kvcl *cl, const void *keys, size_t count, int *statuses);
int kvcl_delete(struct kvcl *cl, const void *keys, size_t count, int *statuses);
int kvcl_match(struct kvcl *cl, const void *keys, size_t count, uint32_t lease_ms,
	       size_t *matched);
/* kvpool_match_ex on the pool: every owner of the chain's segments is
 * asked in one round, each waiting (wait_ms) for its own part of want;
 * the result is the chain's (present and retained leading runs, flags of
 * every node, the smallest lease and retention granted). opts may be
 * NULL. Errors: as kvcl_match, -EPROTO (want > count). */
int kvcl_match_ex(struct kvcl *cl, const void *keys, size_t count,
		  const struct kvpool_match_opts *opts, struct kvpool_match_result *out);
int kvcl_drop_namespace(struct kvcl *cl, const char *ns, uint64_t *blocks);
int kvcl_stats(struct kvcl *cl, const char *ns, char **json);
int kvcl_ping(struct kvcl *cl, uint64_t *rtt_us);

/* ---- membership.c ---------------------------------------------------------- */

/* Parse a static node list into nodes (all members). Errors: -EINVAL, -E2BIG,
 * -ENOMEM. */
int kvcl_static_members(struct kvcl *cl, const char *list);

/* Read the etcd prefix, apply it, start the watch thread. Errors: those
 * of kvc_etcd_range_prefix and pthread_create. */
int kvcl_etcd_start(struct kvcl *cl);

/* Stop the watch thread (if any). */
void kvcl_etcd_stop(struct kvcl *cl);

/* Find or add the node `name` (under cl->lock). NULL when the table is
 * full or out of memory. Starts its thread. */
struct kvcl_node *kvcl_node_get_locked(struct kvcl *cl, const char *name);

#endif /* KVC_CLUSTER_H */
