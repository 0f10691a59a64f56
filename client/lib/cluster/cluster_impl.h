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
 * Failures. A node that cannot be reached (refused, reset, timed out: a
 * connection error) is not an error: its share of a GET, EXISTS or
 * DELETE is a miss (-ENOENT), of a MATCH a short run, and its share of a
 * PUT is dropped (status 0: a cache may lose a block; a later GET is a
 * miss), counted per node. It is down for KVCL_RETRY_MS (or until etcd
 * says it rejoined): its shares fail at once meanwhile. Any other error
 * of a share (-EACCES, -EINVAL, -ENOMEM...) is the status of every block
 * of that share, as it would be on one node.
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
#define KVCL_RETRY_MS 1000       /* a node that failed is tried again after this */
#define KVCL_ETCD_TIMEOUT_MS 2000

struct kvcl;
struct kvcl_parent;

enum kvcl_child_state { CH_QUEUED, CH_SUBMITTING, CH_ENGINE, CH_DONE };
enum kvcl_child_kind { CHILD_REQ, CHILD_REG, CHILD_UNREG };

/* One node's share of a call (or a registration passed to the node). */
struct kvcl_child {
	struct kvcl_child *next;        /* in its node's inbox */
	struct kvcl_child *sibling;     /* in its parent's list */
	struct kvcl_parent *p;          /* NULL: detached (lease release, registration) */
	struct kvcl_node *node;
	enum kvcl_child_kind kind;
	enum kvcl_child_state state;
	int cancel;                     /* its parent was cancelled while it was submitted */
	uint64_t engine_id;
	struct kvc_req r;               /* on the node's engine (arrays in mem) */
	size_t n;                       /* entries (MATCH: runs) */
	size_t *perm;                   /* entry (run) -> the parent's entry (run) */
	int *st;                        /* per entry */
	struct kvc_result res;          /* when done */
	const void *buf;                /* CHILD_REG / CHILD_UNREG */
	size_t len;
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
	struct kvc_req r;               /* the caller's request */
	int *st;                        /* r.statuses or own */
	size_t pending;                 /* children not done */
	size_t holds;                   /* children node threads still hold */
	struct kvcl_child *children;
	int share_err;                  /* first share error that is not a lost node */
	struct kvc_result res;
	/* MATCH: runs of the chain */
	size_t n_runs;
	size_t *run_at, *run_len;
	size_t *run_m, *run_p, *run_r;  /* matched, present, retained per run */
	int *run_own;
	struct kvcl_view view;          /* the members it was split over */
	void *mem;
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

	struct kvc_engine *e;           /* made and replaced by the node thread, under cl->lock */
	pthread_t thread;
	int has_thread;
	int wake_fd;                    /* eventfd: the inbox has work, or quit */
	struct kvcl_child *inbox, *inbox_tail;
	int engine_children;            /* children on the engine now */
	int quit;

	/* state and counters, under cl->lock */
	int reachable;                  /* the last request reached it */
	uint64_t retry_at_ms;           /* down until then */
	int last_error;                 /* its -errno, 0 when none */
	char last_msg[1025];            /* the refusal message that came with it, or "" */
	uint64_t calls, errors, misses_from_errors, puts_dropped;
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
/* MATCH: the chain's leading run from its runs' results; ends the leases
 * a node took past the chain's first short run. */
void kvcl_match_finish_locked(struct kvcl *cl, struct kvcl_parent *p);
/* A whole-pool call's result from its children (after it completed;
 * cl->lock not held). */
int kvcl_finish_admin(struct kvcl *cl, struct kvcl_parent *p, struct kvc_result *res);

/* ---- nodes.c ---- */

/* Start node n's thread (cl->lock held). Errors: -errno of pthread/eventfd. */
int kvcl_node_start(struct kvcl_node *n);
/* Stop and join n's thread, close its engine, free what its inbox holds. */
void kvcl_node_stop(struct kvcl_node *n);
/* Queue child c on its node and wake the node (cl->lock held). */
void kvcl_node_post_locked(struct kvcl_child *c);
/* Node n could not be reached: down for KVCL_RETRY_MS (cl->lock held). */
void kvcl_node_failed_locked(struct kvcl_node *n, int rc);

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
