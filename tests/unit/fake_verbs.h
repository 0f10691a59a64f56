/*
 * fake_verbs.h - a fake libibverbs/librdmacm (struct rdmx_ops) for the
 * unit tests of rdma/, server/srv_rdma*.c and libkvpool's RDMA path. No
 * device and no kernel support are needed.
 *
 * Two modes, chosen per test:
 *  - Recording (the default): every call is counted and may be made to
 *    fail (fail_at: the N-th call of any op fails with ENOMEM). SENDs and
 *    READ/WRITE work requests are recorded and never complete by
 *    themselves: the test queues CM events (fake_verbs_push_cm) and
 *    completions (fake_verbs_push_wc) itself.
 *  - Loopback (fake_verbs.loopback = 1 before the ids are made): an
 *    in-process imitation of a fabric. rdma_connect to a listening id
 *    queues CONNECT_REQUEST on the listener's channel; rdma_accept pairs
 *    the two queue pairs and queues ESTABLISHED on both sides; a SEND is
 *    copied into the peer's oldest posted receive; RDMA READ/WRITE copy
 *    between the local address and the remote one (same process) after
 *    checking the rkey against a registered MR with the right remote
 *    access and range, else they complete with IBV_WC_REM_ACCESS_ERR;
 *    rdma_disconnect queues DISCONNECTED on both sides. Completions write
 *    the completion channel's eventfd and CM events the event channel's,
 *    so poll() and event loops wake as with the real library. Safe to
 *    use from two threads (one lock around every fake op).
 *
 * Fault injection in both modes: fail_at (above), fail_post_send_at_xfer
 * (the N-th READ/WRITE post returns EINVAL), xfer_status_at /
 * xfer_status (loopback: the N-th READ/WRITE completes with that status
 * and moves no bytes), xfer_hold (loopback: READ/WRITEs never complete).
 *
 * reg_mr_errno (both modes): every memory registration fails with that
 * errno, as with a too small RLIMIT_MEMLOCK.
 *
 * Built only with KVPOOL_RDMA (rdma-core headers present).
 */
#ifndef KVPOOL_FAKE_VERBS_H
#define KVPOOL_FAKE_VERBS_H

#ifdef KVPOOL_RDMA

#include <stdint.h>

#include "rdmx_ops.h"

#define FAKE_VERBS_QMAX 512

struct fake_verbs {
	/* Settings (tests write them after fake_verbs_reset). */
	int fail_at;                /* fail the call with this number (0: none) */
	int reg_mr_errno;           /* nonzero: every ibv_reg_mr fails with this errno
				     * (e.g. EPERM, as a too small RLIMIT_MEMLOCK does) */
	int n_devices;              /* devices rdma_get_devices reports (1 after reset) */
	int loopback;               /* 1: loopback mode (above) */
	int fail_post_send_at_xfer; /* fail the READ/WRITE post with this ordinal */
	int xfer_status_at;         /* loopback: complete this READ/WRITE ordinal with ... */
	int xfer_status;            /* ... this enum ibv_wc_status */
	int xfer_hold;              /* loopback: READ/WRITEs posted while set never
				     * complete (a transfer stuck in the fabric) */

	/* Observations. */
	int calls;                  /* ops calls so far */
	int live;                   /* fake objects alive (0 when all are freed) */
	int posted_recv, posted_send, posted_xfer, rejects, disconnects;
	uint64_t xfer_bytes;        /* loopback: bytes moved by READ/WRITE */
	int held_xfers;             /* loopback: READ/WRITEs swallowed by xfer_hold */
	struct ibv_send_wr last_wr; /* the last work request posted (sg_list not kept) */
	struct ibv_qp_cap last_qp_cap; /* capabilities asked of the last QP created */
	uint64_t xfer_ids[FAKE_VERBS_QMAX]; /* wr_ids of READ/WRITEs, in post order */
	int n_xfer_ids;

	/* Internal. */
	struct ibv_context ctx;
	struct ibv_context *devs[2];
};

extern struct fake_verbs fake_verbs;
extern const struct rdmx_ops fake_verbs_ops;

/* Forget everything (the caller frees what it still holds first):
 * recording mode, one device, no failures. */
void fake_verbs_reset(void);

/* A new cm id on channel ch with context ctx, as a CONNECT_REQUEST would
 * carry (bound to the fake device). Freed by rdma_destroy_id. */
struct rdma_cm_id *fake_verbs_new_id(struct rdma_event_channel *ch, void *ctx);

/* Queue a CM event of `type` for `id` on channel ch. */
void fake_verbs_push_cm(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
			struct rdma_cm_id *id);

/* Queue a completion on cq. */
void fake_verbs_push_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
			uint32_t byte_len);

#endif /* KVPOOL_RDMA */
#endif /* KVPOOL_FAKE_VERBS_H */
