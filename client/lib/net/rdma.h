/*
 * rdma.h - the RDMA peer's settings and test hooks (net/rdma.c; the peer
 * itself is kvc_rdma_transport in transport.h). Internal to libkvpool.
 */
#ifndef KVC_NET_RDMA_H
#define KVC_NET_RDMA_H

#include <stddef.h>

struct rdmx_ops;

#define KVC_RDMA_STAGE_BYTES (64u << 20) /* largest RDMA staging buffer */
#define KVC_RDMA_WIRE_FRAMES 4           /* requests in flight (<= RDMX_MSG_DEPTH) */

/* Test hook: the verbs/rdma_cm table libkvpool's RDMA connections use.
 * NULL (the default) means the real library; unit tests point it at the
 * loopback fake. Not exported by libkvpool.so. */
extern const struct rdmx_ops *kvc_rdma_test_ops;

/* Largest staging buffer a link registers (bytes; KVC_RDMA_STAGE_BYTES
 * unless a test lowers it). The buffer actually made is this, but never
 * less than the server's max_block_bytes. Read when the buffer is made. */
extern size_t kvc_rdma_stage_max_bytes;

#endif /* KVC_NET_RDMA_H */
