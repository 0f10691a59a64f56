/*
 * rdmx_ops.h - the table of function pointers through which rdma/ makes
 * every libibverbs and librdmacm call.
 *
 * Why a table: in Debian 12's rdma-core headers the data-path verbs
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are
 * static inline and ibv_reg_mr is a macro, so neither --wrap nor symbol
 * interposition can reach them. Code in rdma/ therefore never calls a verb
 * directly: it calls ops->post_send(...) and so on. rdmx_ops_real (in
 * rdmx_ops_real.c) points at the real library; the unit tests pass a table
 * of fakes that can fail any call and complete work requests with any
 * status.
 *
 * Every member has the signature and the error convention of the library
 * call it stands for (librdmacm calls return -1 and set errno; verbs that
 * return int return an errno value, or -1 with errno for the ibv_get_*
 * calls; constructors return NULL and set errno). rdma/ turns them into
 * negative errnos at the call site (rdmx_errno).
 *
 * Only built with KVPOOL_RDMA (make RDMA=1): it needs the rdma-core headers.
 */
#ifndef KVPOOL_RDMX_OPS_H
#define KVPOOL_RDMX_OPS_H

#ifdef KVPOOL_RDMA

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct rdmx_ops {
	/* Devices (rdma_get_devices / rdma_free_devices). */
	struct ibv_context **(*get_devices)(int *num_devices);
	void (*free_devices)(struct ibv_context **list);
	/* Connection manager. */
	struct rdma_event_channel *(*create_event_channel)(void);
	void (*destroy_event_channel)(struct rdma_event_channel *ch);
	int (*create_id)(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *context,
			 enum rdma_port_space ps);
	int (*destroy_id)(struct rdma_cm_id *id);
	int (*bind_addr)(struct rdma_cm_id *id, struct sockaddr *addr);
	int (*listen)(struct rdma_cm_id *id, int backlog);
	int (*resolve_addr)(struct rdma_cm_id *id, struct sockaddr *src, struct sockaddr *dst,
			    int timeout_ms);
	int (*resolve_route)(struct rdma_cm_id *id, int timeout_ms);
	int (*connect)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*accept)(struct rdma_cm_id *id, struct rdma_conn_param *param);
	int (*reject)(struct rdma_cm_id *id, const void *private_data, uint8_t len);
	int (*disconnect)(struct rdma_cm_id *id);
	int (*migrate_id)(struct rdma_cm_id *id, struct rdma_event_channel *ch);
	int (*get_cm_event)(struct rdma_event_channel *ch, struct rdma_cm_event **event);
	int (*ack_cm_event)(struct rdma_cm_event *event);
	int (*create_qp)(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	void (*destroy_qp)(struct rdma_cm_id *id);
	/* Verbs: protection domains and memory regions. */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	/* Verbs: completion channels and queues. */
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *ch, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	/* Verbs: the data path. */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
};

/* The real libibverbs/librdmacm calls. */
extern const struct rdmx_ops rdmx_ops_real;

#endif /* KVPOOL_RDMA */
#endif /* KVPOOL_RDMX_OPS_H */
