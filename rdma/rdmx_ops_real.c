/*
 * rdmx_ops_real.c - struct rdmx_ops filled with the real library calls.
 *
 * The inline verbs and the ibv_reg_mr macro get small out-of-line
 * wrappers here so that their address can be taken.
 */
#include "rdmx_ops.h"

static struct ibv_mr *real_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

static int real_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

static int real_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

static int real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

static int real_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

const struct rdmx_ops rdmx_ops_real = {
	.get_devices = rdma_get_devices,
	.free_devices = rdma_free_devices,
	.create_event_channel = rdma_create_event_channel,
	.destroy_event_channel = rdma_destroy_event_channel,
	.create_id = rdma_create_id,
	.destroy_id = rdma_destroy_id,
	.bind_addr = rdma_bind_addr,
	.listen = rdma_listen,
	.resolve_addr = rdma_resolve_addr,
	.resolve_route = rdma_resolve_route,
	.connect = rdma_connect,
	.accept = rdma_accept,
	.reject = rdma_reject,
	.disconnect = rdma_disconnect,
	.migrate_id = rdma_migrate_id,
	.get_cm_event = rdma_get_cm_event,
	.ack_cm_event = rdma_ack_cm_event,
	.create_qp = rdma_create_qp,
	.destroy_qp = rdma_destroy_qp,
	.alloc_pd = ibv_alloc_pd,
	.dealloc_pd = ibv_dealloc_pd,
	.reg_mr = real_reg_mr,
	.dereg_mr = ibv_dereg_mr,
	.create_comp_channel = ibv_create_comp_channel,
	.destroy_comp_channel = ibv_destroy_comp_channel,
	.create_cq = ibv_create_cq,
	.destroy_cq = ibv_destroy_cq,
	.req_notify_cq = real_req_notify_cq,
	.get_cq_event = ibv_get_cq_event,
	.ack_cq_events = ibv_ack_cq_events,
	.poll_cq = real_poll_cq,
	.post_send = real_post_send,
	.post_recv = real_post_recv,
};
