/*
 * rdma_stub.c - the RDMA transport of an RDMA=0 build: every call that
 * would need a device answers -EOPNOTSUPP, so kvpoold and libkvpool serve
 * and use TCP only and say why.
 */
#include <errno.h>
#include <stdio.h>

#include "rdma.h"

#define STUB_REASON "built without RDMA support (make RDMA=0)"

bool rdma_built(void)
{
	return false;
}

int rdma_listener_open(const struct rdma_listener_config *cfg, struct rdma_listener **out,
		       char *why, size_t why_len)
{
	(void)cfg;
	(void)out;
	if (why && why_len)
		snprintf(why, why_len, "%s", STUB_REASON);
	return -EOPNOTSUPP;
}

void rdma_listener_close(struct rdma_listener *l)
{
	(void)l;
}

int rdma_listener_fd(const struct rdma_listener *l)
{
	(void)l;
	return -1;
}

int rdma_listener_take(struct rdma_listener *l, void **req)
{
	(void)l;
	(void)req;
	return -EOPNOTSUPP;
}

void rdma_listener_refuse(struct rdma_listener *l, void *req)
{
	(void)l;
	(void)req;
}

int rdma_worker_open(struct rdma_listener *l, struct rdma_worker **out)
{
	(void)l;
	(void)out;
	return -EOPNOTSUPP;
}

void rdma_worker_close(struct rdma_worker *w)
{
	(void)w;
}

int rdma_worker_fd(const struct rdma_worker *w)
{
	(void)w;
	return -1;
}

struct rdma_budget *rdma_worker_budget(struct rdma_worker *w)
{
	(void)w;
	return NULL;
}

void rdma_worker_cm_events(struct rdma_worker *w)
{
	(void)w;
}

int rdma_conn_accept(struct rdma_worker *w, void *req, const struct rdma_conn_cbs *cbs,
		     void *arg, struct rdma_conn **out)
{
	(void)w;
	(void)req;
	(void)cbs;
	(void)arg;
	(void)out;
	return -EOPNOTSUPP;
}

int rdma_conn_fd(const struct rdma_conn *c)
{
	(void)c;
	return -1;
}

enum rdma_conn_state rdma_conn_state(const struct rdma_conn *c)
{
	(void)c;
	return RDMA_CONN_CLOSED;
}

void rdma_conn_completions(struct rdma_conn *c)
{
	(void)c;
}

int rdma_conn_send(struct rdma_conn *c, const void *msg, size_t bytes)
{
	(void)c;
	(void)msg;
	(void)bytes;
	return -EOPNOTSUPP;
}

int rdma_conn_xfer(struct rdma_conn *c, enum rdma_xfer_op op, const struct rdma_xfer_item *items,
		   uint32_t n)
{
	(void)c;
	(void)op;
	(void)items;
	(void)n;
	return -EOPNOTSUPP;
}

void rdma_conn_close(struct rdma_conn *c, const char *reason)
{
	(void)c;
	(void)reason;
}

uint32_t rdma_conn_outstanding(const struct rdma_conn *c)
{
	(void)c;
	return 0;
}

int rdma_client_connect(const char *host, uint16_t port, uint32_t timeout_ms,
			const struct rdma_ops *ops, struct rdma_client **out)
{
	(void)host;
	(void)port;
	(void)timeout_ms;
	(void)ops;
	(void)out;
	return -EOPNOTSUPP;
}

void rdma_client_close(struct rdma_client *c)
{
	(void)c;
}

int rdma_client_reg(struct rdma_client *c, void *buf, size_t len, struct rdma_client_mr **out)
{
	(void)c;
	(void)buf;
	(void)len;
	(void)out;
	return -EOPNOTSUPP;
}

uint32_t rdma_client_mr_rkey(const struct rdma_client_mr *mr)
{
	(void)mr;
	return 0;
}

void rdma_client_dereg(struct rdma_client *c, struct rdma_client_mr *mr)
{
	(void)c;
	(void)mr;
}

int rdma_client_call(struct rdma_client *c, const void *msg, size_t msg_bytes, void *buf,
		     size_t cap, size_t *bytes, uint32_t timeout_ms)
{
	(void)c;
	(void)msg;
	(void)msg_bytes;
	(void)buf;
	(void)cap;
	(void)bytes;
	(void)timeout_ms;
	return -EOPNOTSUPP;
}

int rdma_client_send(struct rdma_client *c, const void *msg, size_t msg_bytes)
{
	(void)c;
	(void)msg;
	(void)msg_bytes;
	return -EOPNOTSUPP;
}

int rdma_client_recv(struct rdma_client *c, void *buf, size_t cap, size_t *bytes,
		     uint32_t timeout_ms)
{
	(void)c;
	(void)buf;
	(void)cap;
	(void)bytes;
	(void)timeout_ms;
	return -EOPNOTSUPP;
}

bool rdma_client_ok(struct rdma_client *c)
{
	(void)c;
	return false;
}
