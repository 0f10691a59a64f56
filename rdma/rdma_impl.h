/*
 * rdma_impl.h - rdma/'s internal structures, shared by rdma_conn.c,
 * rdma_listener.c and rdma_client.c (and looked into by the unit tests).
 * Not used outside rdma/ and tests/unit/test_rdma.c.
 */
#ifndef KVPOOL_RDMA_IMPL_H
#define KVPOOL_RDMA_IMPL_H

#include "rdma.h"
#include "rdma_ops.h"

/* wr_id = kind << 56 | slot. */
enum rdma_wr_kind { RDMA_WR_RECV = 1, RDMA_WR_SEND = 2, RDMA_WR_XFER = 3 };
#define RDMA_WR_ID(kind, slot) (((uint64_t)(kind) << 56) | (uint64_t)(slot))
#define RDMA_WR_KIND(id) ((unsigned int)((id) >> 56))
#define RDMA_WR_SLOT(id) ((uint32_t)((id) & 0xffffffffu))

struct rdma_listener {
	const struct rdma_ops *ops;
	struct ibv_context **devices;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_mr *arena_mr;
};

struct rdma_worker {
	struct rdma_listener *l;
	struct rdma_event_channel *ch;
	struct rdma_budget budget;
	struct rdma_conn *conns; /* doubly linked */
};

/* A connection request taken from the listener. */
struct rdma_request {
	struct rdma_cm_id *id;
	uint8_t responder_resources, initiator_depth; /* the client's */
};

struct rdma_conn {
	const struct rdma_ops *ops;
	enum rdma_conn_state state;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;              /* the listener's (server) or own (client) */
	struct ibv_comp_channel *comp;
	struct ibv_cq *cq;
	int qp_created;
	uint8_t *msgs;                  /* RDMA_MSG_DEPTH recv buffers, then as many send buffers */
	struct ibv_mr *msg_mr;
	uint32_t send_busy;             /* bit i: send buffer i in flight */
	unsigned int cq_events;         /* CQ events not yet acknowledged */
	/* Server side. */
	struct rdma_worker *w;
	struct rdma_conn *prev, *next;  /* w->conns */
	const struct rdma_conn_cbs *cbs;
	void *arg;
	struct rdma_budget *budget;
	int in_completions;             /* rdma_conn_completions is running */
	const char *close_reason;       /* close requested from a callback */
	/* The transfer in progress. */
	struct rdma_xfer_item *items;
	uint32_t n_items, next_item, done_items, outstanding;
	enum rdma_xfer_op op;
	int xfer_active;
	/* Client side: the last message received (RDMA_WR_RECV completion). */
	int recv_ready;
	uint32_t recv_slot, recv_bytes;
	int send_done;
};

/* -errno of a failed librdmacm call (-1 and errno), never 0. */
int rdma_errno(void);

/* Receive / send buffer i of c. */
uint8_t *rdma_recv_buf(struct rdma_conn *c, uint32_t i);
uint8_t *rdma_send_buf(struct rdma_conn *c, uint32_t i);

/* Create the completion channel, CQ (armed), QP on c->id and c->pd, the
 * message buffers and their MR, and post every RECV. On error, what was
 * set up is undone (rdma_conn_teardown) and -errno returned; why says
 * which step failed. */
int rdma_conn_setup_qp(struct rdma_conn *c, const char **why);

/* Undo rdma_conn_setup_qp and destroy c->id, in reverse order of setup:
 * disconnect (when connected), QP, message MR and buffers, CQ (after
 * acknowledging its events), completion channel, id. Idempotent. */
void rdma_conn_teardown(struct rdma_conn *c);

/* Post RECV i. */
int rdma_conn_post_recv(struct rdma_conn *c, uint32_t i);

/* Handle one work completion: status first, then by kind. Returns 0, or
 * -EIO when the completion carried an error status (c is then in
 * RDMA_CONN_ERROR). */
int rdma_conn_handle_wc(struct rdma_conn *c, const struct ibv_wc *wc);

/* Set a file descriptor non-blocking. */
int rdma_set_nonblock(int fd);

#endif /* KVPOOL_RDMA_IMPL_H */
