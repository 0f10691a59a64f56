/*
 * rdmx_stub.c - the RDMA transport of an RDMA=0 build: every call that
 * would need a device answers -EOPNOTSUPP, so kvpoold and libkvpool serve
 * and use TCP only and say why.
 */
#include <errno.h>
#include <stdio.h>

#include "rdmx.h"

#define STUB_REASON "built without RDMA support (make RDMA=0)"

bool rdmx_built(void)
{
	return false;
}

int rdmx_listener_open(const struct rdmx_listener_config *cfg, struct rdmx_listener **out,
		       char *why, size_t why_len)
{
	(void)cfg;
	(void)out;
	if (why && why_len)
		snprintf(why, why_len, "%s", STUB_REASON);
	return -EOPNOTSUPP;
}

void rdmx_listener_close(struct rdmx_listener *l)
{
	(void)l;
}

int rdmx_listener_fd(const struct rdmx_listener *l)
{
	(void)l;
	return -1;
}

int rdmx_listener_take(struct rdmx_listener *l, void **req)
{
	(void)l;
	(void)req;
	return -EOPNOTSUPP;
}

void rdmx_listener_refuse(struct rdmx_listener *l, void *req)
{
	(void)l;
	(void)req;
}

int rdmx_worker_open(struct rdmx_listener *l, struct rdmx_worker **out)
{
	(void)l;
	(void)out;
	return -EOPNOTSUPP;
}

void rdmx_worker_close(struct rdmx_worker *w)
{
	(void)w;
}

int rdmx_worker_fd(const struct rdmx_worker *w)
{
	(void)w;
	return -1;
}

struct rdmx_budget *rdmx_worker_budget(struct rdmx_worker *w)
{
	(void)w;
	return NULL;
}

void rdmx_worker_cm_events(struct rdmx_worker *w)
{
	(void)w;
}

int rdmx_conn_accept(struct rdmx_worker *w, void *req, const struct rdmx_conn_cbs *cbs,
		     void *arg, struct rdmx_conn **out)
{
	(void)w;
	(void)req;
	(void)cbs;
	(void)arg;
	(void)out;
	return -EOPNOTSUPP;
}

int rdmx_conn_fd(const struct rdmx_conn *c)
{
	(void)c;
	return -1;
}

enum rdmx_conn_state rdmx_conn_state(const struct rdmx_conn *c)
{
	(void)c;
	return RDMX_CONN_CLOSED;
}

void rdmx_conn_completions(struct rdmx_conn *c)
{
	(void)c;
}

int rdmx_conn_send(struct rdmx_conn *c, const void *msg, size_t bytes)
{
	(void)c;
	(void)msg;
	(void)bytes;
	return -EOPNOTSUPP;
}

int rdmx_conn_xfer(struct rdmx_conn *c, enum rdmx_xfer_op op, const struct rdmx_xfer_item *items,
		   uint32_t n)
{
	(void)c;
	(void)op;
	(void)items;
	(void)n;
	return -EOPNOTSUPP;
}

void rdmx_conn_close(struct rdmx_conn *c, const char *reason)
{
	(void)c;
	(void)reason;
}

uint32_t rdmx_conn_outstanding(const struct rdmx_conn *c)
{
	(void)c;
	return 0;
}

int rdmx_client_connect(const char *host, uint16_t port, uint32_t timeout_ms,
			const struct rdmx_ops *ops, struct rdmx_client **out)
{
	(void)host;
	(void)port;
	(void)timeout_ms;
	(void)ops;
	(void)out;
	return -EOPNOTSUPP;
}

void rdmx_client_close(struct rdmx_client *c)
{
	(void)c;
}

int rdmx_client_reg(struct rdmx_client *c, void *buf, size_t len, struct rdmx_client_mr **out)
{
	(void)c;
	(void)buf;
	(void)len;
	(void)out;
	return -EOPNOTSUPP;
}

uint32_t rdmx_client_mr_rkey(const struct rdmx_client_mr *mr)
{
	(void)mr;
	return 0;
}

void rdmx_client_dereg(struct rdmx_client *c, struct rdmx_client_mr *mr)
{
	(void)c;
	(void)mr;
}

int rdmx_client_call(struct rdmx_client *c, const void *msg, size_t msg_bytes, void *buf,
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

int rdmx_client_send(struct rdmx_client *c, const void *msg, size_t msg_bytes)
{
	(void)c;
	(void)msg;
	(void)msg_bytes;
	return -EOPNOTSUPP;
}

int rdmx_client_recv(struct rdmx_client *c, void *buf, size_t cap, size_t *bytes,
		     uint32_t timeout_ms)
{
	(void)c;
	(void)buf;
	(void)cap;
	(void)bytes;
	(void)timeout_ms;
	return -EOPNOTSUPP;
}

int rdmx_client_try_recv(struct rdmx_client *c, void *buf, size_t cap, size_t *bytes)
{
	(void)c;
	(void)buf;
	(void)cap;
	(void)bytes;
	return -EOPNOTSUPP;
}

int rdmx_client_fds(const struct rdmx_client *c, int fds[2])
{
	(void)c;
	(void)fds;
	return -EOPNOTSUPP;
}

bool rdmx_client_ok(struct rdmx_client *c)
{
	(void)c;
	return false;
}
