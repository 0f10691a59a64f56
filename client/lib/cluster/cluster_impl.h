/*
 * cluster_impl.h - the parts of a cluster handle, shared by cluster.c
 * (the backend: parent requests, how each call splits and merges),
 * nodes.c (node threads driving node engines), membership.c (who the
 * nodes are), placement.c (which node holds a block) and stats.c (the
 * STATS document). Nothing outside cluster/ includes it.
 *
 * Requests. A call is a parent (struct kvcl_parent); its children (struct
 * kvcl_child), one per node that owns part of it, are requests on that
 * node's engine. A child is queued on its node's inbox; the node's thread
 * submits it to the node's engine, drives the engine, and when the child
 * completes merges its results into the parent under cl->lock. The parent
 * completes when its last child does: a blocking call's caller is woken
 * (done_cond), an asynchronous one goes to the completion queue and the
 * cluster's eventfd. One fan-out mechanism for every call.
 *
 * Failures. A node that cannot be reached (refused, reset, or past the
 * call's budget: a connection error) is not an error: its share of a GET
 * or EXISTS is asked of the next place the block may be, else a miss
 * (-ENOENT); of a MATCH a short run; its share of a PUT goes to the next
 * node by score (a block no node could take is -EHOSTDOWN); its share of
 * a DELETE or DROP_NAMESPACE is kept and finished when the node is back
 * (-EINPROGRESS meanwhile). The node is down from then on: placement
 * skips it (its blocks go to, and are read from, the next node by score),
 * its shares of whole-pool calls fail at once, and its thread probes it in
 * the background after a back-off that doubles (KVCL_RETRY_MS up to
 * KVCL_RETRY_MAX_MS) - no caller ever waits for a down node, and a busy
 * caller does not put the probe off. Any other error of a share (-EACCES,
 * -EINVAL, -ENOMEM...) is the status of every block of that share, as it
 * would be on one node.
 *
 * Lock rule: cl->lock guards the membership, the placement table, every
 * parent and child, the inboxes and the node states. Lock order: cl->lock
 * before an engine's lock (a node thread calls its engine without
 * cl->lock).
 */
#ifndef KVC_CLUSTER_IMPL_H
#define KVC_CLUSTER_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "etcd.h"
#include "lib/net/regions.h"
#include "lib/net/tls_ctx.h"
#include "placement.h"

#define KVCL_NAME_MAX_BYTES 128
#define KVCL_RETRY_MS 1000       /* a node that failed is probed again after this... */
#define KVCL_RETRY_MAX_MS 30000  /* ...doubling up to this while it keeps failing */
#define KVCL_PROBE_MIN_MS 1000   /* a probe's HELLO waits at least this long */
#define KVCL_ETCD_TIMEOUT_MS 2000
#define KVCL_DEFAULT_BUDGET_MS 200 /* MATCH and GET: a node's share is a miss after this */
#define KVCL_EMPTY_GRACE_MS 2000 /* etcd: an empty membership at connect is an error after this */
#define KVCL_COPY_MAX_BYTES (64u << 20) /* background copies in flight at most... */
#define KVCL_COPY_MAX 256        /* ...and blocks */
#define KVCL_MAX_ALT 6           /* places a GET or EXISTS asks for one block, at most */

struct kvcl;
struct kvcl_parent;

enum kvcl_child_state { CH_QUEUED, CH_SUBMITTING, CH_ENGINE, CH_DONE };
enum kvcl_child_kind { CHILD_REQ, CHILD_REG, CHILD_UNREG };
/* What a detached child is for (p == NULL). */
enum kvcl_child_job { JOB_NONE, JOB_COPY, JOB_REMOVAL };

struct kvcl_removal;

/* Per entry of a data call: a block, a key, a chain position. */
struct kvcl_entry {
	uint64_t cov, covp, covr;       /* MATCH: view bits whose run covers it (matched,
					 * present, retained) */
	uint64_t missed;                /* view bits that answered it missing */
	uint64_t asked;                 /* view bits it was sent to */
	uint8_t alt[KVCL_MAX_ALT];      /* GET/EXISTS/PUT: where to ask, in order */
	uint8_t n_alt, next_alt;
	uint8_t own[KVCL_MAX_REPLICAS]; /* its owners now (view indices) */
	uint8_t n_own;
	uint8_t hot, moved;
	int st;                         /* its outcome so far */
	int pending_removal;            /* DELETE: a node that could not be reached */
};

/* One node's share of a call (or a registration passed to the node). */
struct kvcl_child {
	struct kvcl_child *next;        /* in its node's inbox */
	struct kvcl_child *sibling;     /* in its parent's list */
	struct kvcl_parent *p;          /* NULL: detached (lease release, registration) */
	struct kvcl_node *node;
	enum kvcl_child_kind kind;
	enum kvcl_child_state state;
	int cancel;                     /* its parent was cancelled while it was submitted */
	int ended;                      /* a waiting MATCH ended early: 1 its parent let
					 * go of it while it sat on its node's engine
					 * (parked at the node: the node thread drops
					 * the connection for it), 2 dropped since */
	uint64_t engine_id;
	struct kvc_req r;               /* on the node's engine (arrays in mem) */
	size_t n;                       /* entries (MATCH: runs) */
	size_t *perm;                   /* entry (run) -> the parent's entry (run) */
	int *st;                        /* per entry */
	struct kvc_result res;          /* when done */
	const void *buf;                /* CHILD_REG / CHILD_UNREG */
	size_t len;
	int vj;                         /* its node's index in the parent's view */
	int amb;                        /* MATCH: keys that may be elsewhere too */
	enum kvcl_child_job job;        /* detached: a background copy, a removal */
	void *own_buf;                  /* freed with the child (a copy's bytes) */
	struct kvcl_removal *removal;   /* JOB_REMOVAL: what it finishes */
	struct kvcl_node *copy_to;      /* JOB_COPY: where the block goes */
	int copy_stage;                 /* JOB_COPY: 0 its size, 1 its bytes, 2 the PUT */
	uint8_t copy_key[KVPOOL_KEY_BYTES];
	struct iovec copy_iov;
	struct kvpool_get_block copy_get;
	struct kvpool_put_block copy_put;
	int copy_st;
	uint32_t copy_flags;
};

/* A DELETE or DROP_NAMESPACE that did not reach a node: finished by the
 * node's thread when the node answers again (under cl->lock). */
struct kvcl_removal {
	struct kvcl_removal *next;
	struct kvcl_node *node;
	int op;                         /* KVPOOL_OP_DELETE or KVC_OP_DROP */
	char ns[256];                   /* DROP */
	size_t n;                       /* DELETE: keys */
	uint8_t (*keys)[KVPOOL_KEY_BYTES];
	int posted;                     /* a child carries it now */
};

/* One call on the cluster. */
struct kvcl_parent {
	struct kvcl_parent *next, *prev; /* every parent (cl->parents) */
	struct kvcl_parent *done_next;  /* the completion queue */
	uint64_t id;
	int internal;                   /* a blocking call's */
	int done;                       /* completed */
	int polled;                     /* handed out, or its call returned */
	int cancelled;
	int wait_ended;                 /* MATCH: its waits were ended early (a node of the
					 * wait lost, the membership changed): WAIT_ENDED */
	struct kvc_req r;               /* the caller's request */
	int *st;                        /* r.statuses or own */
	size_t pending;                 /* children not done */
	size_t holds;                   /* children node threads still hold */
	struct kvcl_child *children;
	int share_err;                  /* first share error that is not a lost node */
	struct kvc_result res;
	struct kvcl_entry *ent;         /* data calls: one per entry */
	int *own_st;                    /* statuses when the caller gave none */
	size_t hot_prefix;              /* MATCH: leading keys that are hot */
	struct kvcl_view view;          /* the members it was split over */
	void *mem;                      /* entries' scratch (not zeroed), mem_bytes long */
	size_t mem_bytes;
};

/* One node: its name (placement hashes it), address, engine and thread. */
struct kvcl_node {
	struct kvcl *cl;
	char name[KVCL_NAME_MAX_BYTES + 1];
	uint64_t seed;                  /* kvc_hrw_node_seed(name) */
	char url[320];                  /* tcp://address:port; under cl->lock */
	int url_changed;                /* under cl->lock: a new engine before the next child */
	int member;                     /* under cl->lock: in the current membership */
	char record[512];               /* the etcd record (JSON), "" for static lists */
	uint64_t registered_ms;         /* under cl->lock: the record's start_epoch_ms (wall
					 * clock, ms since 1970), 0 when unknown (static lists) */

	struct kvc_engine *e;           /* made and replaced by the node thread, under cl->lock */
	pthread_t thread;
	int has_thread;
	int wake_fd;                    /* eventfd: the inbox has work, or quit */
	struct kvcl_child *inbox, *inbox_tail;
	int engine_children;            /* children on the engine now */
	int ended_children;             /* of which ended waits (kvcl_child.ended 1) */
	int quit;

	/* state and counters, under cl->lock */
	int reachable;                  /* the last request reached it */
	int down;                       /* skipped by placement until a probe answers */
	uint64_t retry_at_ms;           /* when down: the next probe */
	uint64_t backoff_ms;            /* when down: the wait before that probe */
	int last_error;                 /* its -errno, 0 when none */
	char last_msg[1025];            /* the refusal message that came with it, or "" */
	uint64_t calls, errors, misses_from_errors, puts_dropped, puts_redirected;
	uint64_t budget_expired, probes, downs;
};

struct kvcl {
	char ns[256];
	char *token;
	struct kvc_tls_ctx *tls;        /* tls:// nodes' settings (a reference), or NULL */
	uint32_t timeout_ms, busy_tries;

	pthread_mutex_t lock;
	pthread_cond_t done_cond;       /* a parent completed */
	pthread_cond_t child_cond;      /* a child left CH_SUBMITTING */
	struct kvcl_node *nodes[KVCL_MAX_NODES]; /* every node ever seen; freed at close */
	size_t n_nodes;
	uint64_t epoch;                 /* membership changes seen */
	struct kvcl_place place;
	/* settings (URL query: budget_ms, hot_replicas, hot_children, fallback_ms) */
	uint32_t budget_ms;
	/* counters, under lock */
	uint64_t fallback_hits, copies, copies_dropped, copy_bytes, redirected_puts;
	uint64_t budget_expired, puts_nowhere;
	uint64_t copy_inflight_bytes, copy_inflight;
	struct kvcl_removal *removals;  /* not finished yet */
	void *spare;                    /* the last freed parent's scratch, for the next */
	size_t spare_bytes;
	size_t ignored_nodes;           /* etcd: registered past KVCL_MAX_NODES */
	char ignored_name[KVCL_NAME_MAX_BYTES + 1];
	struct kvc_regions regions;     /* kvpool_register'ed memory, passed to every node */

	/* requests */
	uint64_t seq;
	uint32_t max, used;             /* public parents at most / not yet freed */
	struct kvcl_parent *parents;    /* every parent not freed */
	struct kvcl_child *detached;    /* children without a parent, not freed */
	struct kvcl_parent *done_head, *done_tail;
	uint32_t done_len;
	int efd, efd_set;               /* kvpool_event_fd: readable while completions wait */

	/* etcd (endpoint[0] 0 for a static list) */
	char endpoint[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];
	char cluster[KVC_ETCD_CLUSTER_MAX_BYTES + 1];
	char prefix[128];
	int etcd_reachable;             /* under lock */
	char etcd_error[128];           /* under lock */
	uint64_t etcd_failures, etcd_resumes; /* under lock */
	int64_t etcd_revision;          /* under lock */
	pthread_t watch_thread;
	int has_watch;
	volatile int stop;
};

/* ---- cluster.c ---- */

/* Is rc a node that could not be reached (not the request's fault)? */
int kvcl_is_conn_error(int rc);
/* Copy the current members into v (under cl->lock). */
void kvcl_view_take_locked(struct kvcl *cl, struct kvcl_view *v);
/* A child of p (NULL: detached) for node n with `bytes` of scratch after
 * it; linked into p's list. NULL when out of memory. */
struct kvcl_child *kvcl_child_new(struct kvcl_parent *p, struct kvcl_node *n, size_t bytes);
/* A child is done (status, res taken): merge it into its parent (under
 * cl->lock). */
void kvcl_child_merge_locked(struct kvcl *cl, struct kvcl_child *c);
/* A node thread lets go of child c (under cl->lock). */
void kvcl_child_drop_locked(struct kvcl *cl, struct kvcl_child *c);
/* Is op a data request (enum kvpool_op)? */
int kvcl_is_batch(int op);
/* p's last child is in (or it needed none): its outcome, to the caller. */
void kvcl_parent_complete_locked(struct kvcl *cl, struct kvcl_parent *p);

/* ---- split.c ---- */

/* Make parent p's children and post them; complete it at once when it
 * needs none. On -ENOMEM, p completes with it (its statuses say so). */
int kvcl_split_post_locked(struct kvcl *cl, struct kvcl_parent *p);
/* MATCH: the chain's leading run from its keys' coverage; ends the leases
 * a node took past the chain's end. */
void kvcl_match_finish_locked(struct kvcl *cl, struct kvcl_parent *p);
/* PUT, GET, EXISTS, DELETE: each entry's final status, the call's result
 * (under cl->lock). */
void kvcl_batch_finish_locked(struct kvcl *cl, struct kvcl_parent *p);
/* A whole-pool call's result from its children (after it completed;
 * cl->lock not held). */
int kvcl_finish_admin(struct kvcl *cl, struct kvcl_parent *p, struct kvc_result *res);
/* A detached child (a copy, a removal) finished (under cl->lock). */
void kvcl_job_done_locked(struct kvcl *cl, struct kvcl_child *c);
/* The membership changed (under cl->lock): every waiting MATCH a key of
 * whose wanted, not yet present run now has another owner stops waiting
 * and answers what it has, flagged WAIT_ENDED, so that its caller asks
 * again where the blocks now go (docs/cluster.md, "Waiting MATCH"). */
void kvcl_waits_follow_locked(struct kvcl *cl);

/* ---- nodes.c ---- */

/* Start node n's thread (cl->lock held). Errors: -errno of pthread/eventfd. */
int kvcl_node_start(struct kvcl_node *n);
/* Stop and join n's thread, close its engine, free what its inbox holds. */
void kvcl_node_stop(struct kvcl_node *n);
/* Child c, on its node's engine, is no longer waited for (a waiting
 * MATCH ended early): the node's thread drops the connection once only
 * such children are on it (cl->lock held). */
void kvcl_node_ended_locked(struct kvcl_child *c);
/* Queue child c on its node and wake the node (cl->lock held). */
void kvcl_node_post_locked(struct kvcl_child *c);
/* Node n could not be reached: down, probed after a back-off (cl->lock
 * held). A node already down keeps its probe time. */
void kvcl_node_failed_locked(struct kvcl_node *n, int rc);
/* Node n is (back) in service: not down, no back-off (cl->lock held). */
void kvcl_node_up_locked(struct kvcl_node *n);
/* Keep a removal for node n, to be finished when it is back (cl->lock
 * held). keys: n_keys keys (copied) for a DELETE; ns for a DROP. */
void kvcl_removal_add_locked(struct kvcl *cl, struct kvcl_node *n, int op, const char *ns,
			     const uint8_t (*keys)[KVPOOL_KEY_BYTES], size_t n_keys);
/* Removals still waiting (cl->lock held). */
size_t kvcl_removals_pending_locked(const struct kvcl *cl);

/* ---- membership.c ---- */

/* Parse a static node list into nodes (all members). Errors: -EINVAL,
 * -E2BIG, -ENOMEM. */
int kvcl_static_members(struct kvcl *cl, const char *list);
/* Read the etcd prefix, apply it, start the watch thread. Errors: those
 * of kvc_etcd_range_prefix and pthread_create. */
int kvcl_etcd_start(struct kvcl *cl);
/* Stop the watch thread (if any). */
void kvcl_etcd_stop(struct kvcl *cl);
/* Find or add the node `name` (under cl->lock), starting its thread. NULL
 * when the table is full or out of memory. */
struct kvcl_node *kvcl_node_get_locked(struct kvcl *cl, const char *name);

/* ---- stats.c ---- */

/* The STATS document of a cluster: the nodes' documents (children of p,
 * in view order) summed, plus the "cluster" object. Errors: -ENOMEM. */
int kvcl_stats_doc(struct kvcl *cl, const struct kvcl_parent *p, char **json);

#endif /* KVC_CLUSTER_IMPL_H */
