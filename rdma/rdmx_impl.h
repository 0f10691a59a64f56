/*
 * rdmx_impl.h - rdma/'s internal structures, shared by rdmx_conn.c,
 * rdmx_listener.c and rdmx_client.c (and looked into by the unit tests).
 * Not used outside rdma/ and tests/unit/test_rdma.c.
 */
#ifndef KVPOOL_RDMX_IMPL_H
#define KVPOOL_RDMX_IMPL_H

#include "rdmx.h"
#include "rdmx_ops.h"

/* wr_id = kind << 56 | slot. */
enum rdmx_wr_kind { RDMX_WR_RECV = 1, RDMX_WR_SEND = 2, RDMX_WR_XFER = 3 };
#define RDMX_WR_ID(kind, slot) (((uint64_t)(kind) << 56) | (uint64_t)(slot))
#define RDMX_WR_KIND(id) ((unsigned int)((id) >> 56))
#define RDMX_WR_SLOT(id) ((uint32_t)((id) & 0xffffffffu))

struct rdmx_listener {
	const struct rdmx_ops *ops;
	struct ibv_context **devices;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_mr *arena_mr;
};

struct rdmx_worker {
	struct rdmx_listener *l;
	struct rdma_event_channel *ch;
	struct rdmx_budget budget;
	struct rdmx_conn *conns; /* doubly linked */
};

/* A connection request taken from the listener. */
struct rdmx_request {
	struct rdma_cm_id *id;
	uint8_t responder_resources, initiator_depth; /* the client's */
};

struct rdmx_conn {
	const struct rdmx_ops *ops;
	enum rdmx_conn_state state;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;              /* the listener's (server) or own (client) */
	struct ibv_comp_channel *comp;
	struct ibv_cq *cq;
	int qp_created;
	uint8_t *msgs;                  /* RDMX_MSG_DEPTH recv buffers, then as many send buffers */
	struct ibv_mr *msg_mr;
	uint32_t send_busy;             /* bit i: send buffer i in flight */
	unsigned int cq_events;         /* CQ events not yet acknowledged */
	/* Server side. */
	struct rdmx_worker *w;
	struct rdmx_conn *prev, *next;  /* w->conns */
	const struct rdmx_conn_cbs *cbs;
	void *arg;
	struct rdmx_budget *budget;
	int in_completions;             /* rdmx_conn_completions is running */
	const char *close_reason;       /* close requested from a callback */
	/* The transfer in progress. */
	struct rdmx_xfer_item *items;
	uint32_t n_items, next_item, done_items, outstanding;
	enum rdmx_xfer_op op;
	int xfer_active;
	/* Client side: the last message received (RDMX_WR_RECV completion). */
	int recv_ready;
	uint32_t recv_slot, recv_bytes;
	int send_done;
};

/* -errno of a failed librdmacm call (-1 and errno), never 0. */
int rdmx_errno(void);

/* Receive / send buffer i of c. */
uint8_t *rdmx_recv_buf(struct rdmx_conn *c, uint32_t i);
uint8_t *rdmx_send_buf(struct rdmx_conn *c, uint32_t i);

/* Create the completion channel, CQ (armed), QP on c->id and c->pd, the
 * message buffers and their MR, and post every RECV. On error, what was
 * set up is undone (rdmx_conn_teardown) and -errno returned; why says
 * which step failed. */
int rdmx_conn_setup_qp(struct rdmx_conn *c, const char **why);

/* Undo rdmx_conn_setup_qp and destroy c->id, in reverse order of setup:
 * disconnect (when connected), QP, message MR and buffers, CQ (after
 * acknowledging its events), completion channel, id. Idempotent. */
void rdmx_conn_teardown(struct rdmx_conn *c);

/* Post RECV i. */
int rdmx_conn_post_recv(struct rdmx_conn *c, uint32_t i);

/* Handle one work completion: status first, then by kind. Returns 0, or
 * -EIO when the completion carried an error status (c is then in
 * RDMX_CONN_ERROR). */
int rdmx_conn_handle_wc(struct rdmx_conn *c, const struct ibv_wc *wc);

/* Set a file descriptor non-blocking. */
int rdmx_set_nonblock(int fd);

#endif /* KVPOOL_RDMX_IMPL_H */
