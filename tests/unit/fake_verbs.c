/*
 * fake_verbs.c - the fake rdmx_ops of fake_verbs.h: recording mode for
 * step-by-step tests, loopback mode for an in-process fabric.
 */
#ifdef KVPOOL_RDMA

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fake_verbs.h"

#define QMAX FAKE_VERBS_QMAX
#define CM_QMAX 64

struct fake_verbs fake_verbs;
#define F fake_verbs

struct fake_ch {
	struct rdma_event_channel ch;
	struct rdma_cm_event *q[CM_QMAX];
	int n;
};

struct fake_id {
	struct rdma_cm_id id;
	struct fake_id *peer;     /* loopback: the other end of the connection */
	int disconnected;
};

struct fake_cq {
	struct ibv_cq cq;
	struct ibv_wc q[QMAX];
	int head, n;
};

struct fake_comp {
	struct ibv_comp_channel ch;
	struct fake_cq *cq;       /* the CQ created on it (one per channel here) */
};

struct fake_recv {
	uint64_t wr_id;
	void *addr;
	uint32_t length;
};

struct fake_qp {
	struct ibv_qp qp;
	struct fake_qp *peer;
	struct fake_cq *scq, *rcq;
	struct fake_recv r[QMAX];
	int rhead, rn;
	int error;                /* an error completion happened: later WRs flush */
};

struct fake_mr {
	struct ibv_mr mr;
	int access;
	struct fake_mr *next;
};

static pthread_mutex_t lock;
static pthread_once_t lock_once = PTHREAD_ONCE_INIT;
static struct fake_id *listener;  /* loopback: the listening id */
static struct fake_mr *mrs;       /* registered MRs, for rkey checks */
static uint32_t next_key;

static void lock_init(void)
{
	pthread_mutexattr_t a;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&lock, &a);
	pthread_mutexattr_destroy(&a);
}

static void fv_lock(void)
{
	pthread_once(&lock_once, lock_init);
	pthread_mutex_lock(&lock);
}

static void fv_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

void fake_verbs_reset(void)
{
	fv_lock();
	memset(&F, 0, sizeof(F));
	F.n_devices = 1;
	listener = NULL;
	mrs = NULL;
	next_key = 0;
	fv_unlock();
}

/* Count the call; 1 when this one must fail (errno set). */
static int failing(void)
{
	if (++F.calls == F.fail_at) {
		errno = ENOMEM;
		return 1;
	}
	return 0;
}

static void signal_fd(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow in a test */
	}
}

static int drain_fd(int fd)
{
	uint64_t v;

	return read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v);
}

void fake_verbs_push_cm(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
			struct rdma_cm_id *id)
{
	struct fake_ch *c = (struct fake_ch *)ch;
	struct rdma_cm_event *ev = calloc(1, sizeof(*ev));

	fv_lock();
	ev->event = type;
	ev->id = id;
	ev->listen_id = listener ? &listener->id : NULL;
	ev->param.conn.responder_resources = 16;
	ev->param.conn.initiator_depth = 16;
	if (c->n < CM_QMAX)
		c->q[c->n++] = ev;
	else
		free(ev);
	signal_fd(ch->fd);
	fv_unlock();
}

/* Queue a completion of kind op on cq and wake its channel. */
static void push_wc_op(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
		       uint32_t byte_len, enum ibv_wc_opcode op)
{
	struct fake_cq *f = (struct fake_cq *)cq;
	struct ibv_wc *wc;

	fv_lock();
	if (f->n < QMAX) {
		wc = &f->q[(f->head + f->n++) % QMAX];
		memset(wc, 0, sizeof(*wc));
		wc->wr_id = wr_id;
		wc->status = status;
		wc->byte_len = byte_len;
		wc->opcode = op;
	}
	if (cq->channel)
		signal_fd(cq->channel->fd);
	fv_unlock();
}

void fake_verbs_push_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
			uint32_t byte_len)
{
	push_wc_op(cq, wr_id, status, byte_len, IBV_WC_SEND);
}

static struct ibv_context **f_get_devices(int *n)
{
	struct ibv_context **r = NULL;

	fv_lock();
	if (!failing()) {
		*n = F.n_devices;
		F.devs[0] = &F.ctx;
		F.live++;
		r = F.devs;
	}
	fv_unlock();
	return r;
}

static void f_free_devices(struct ibv_context **l)
{
	(void)l;
	fv_lock();
	F.live--;
	fv_unlock();
}

static struct rdma_event_channel *f_create_event_channel(void)
{
	struct fake_ch *c = NULL;

	fv_lock();
	if (!failing()) {
		c = calloc(1, sizeof(*c));
		c->ch.fd = eventfd(0, EFD_NONBLOCK);
		F.live++;
	}
	fv_unlock();
	return c ? &c->ch : NULL;
}

static void f_destroy_event_channel(struct rdma_event_channel *ch)
{
	struct fake_ch *c = (struct fake_ch *)ch;

	fv_lock();
	for (int i = 0; i < c->n; i++)
		free(c->q[i]);
	close(ch->fd);
	free(c);
	F.live--;
	fv_unlock();
}

struct rdma_cm_id *fake_verbs_new_id(struct rdma_event_channel *ch, void *ctx)
{
	struct fake_id *id = calloc(1, sizeof(*id));

	fv_lock();
	id->id.channel = ch;
	id->id.context = ctx;
	id->id.verbs = &F.ctx;
	F.live++;
	fv_unlock();
	return &id->id;
}

static int f_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx,
		       enum rdma_port_space ps)
{
	int rc = -1;

	(void)ps;
	fv_lock();
	if (!failing()) {
		*id = fake_verbs_new_id(ch, ctx);
		(*id)->verbs = NULL; /* as an unbound id */
		rc = 0;
	}
	fv_unlock();
	return rc;
}

/* Drop the events still queued for id, as the kernel does when an id is
 * destroyed. */
static void purge_events(struct rdma_cm_id *id)
{
	struct fake_ch *c = (struct fake_ch *)id->channel;
	int k = 0;

	if (!c)
		return;
	for (int i = 0; i < c->n; i++) {
		if (c->q[i]->id == id)
			free(c->q[i]);
		else
			c->q[k++] = c->q[i];
	}
	c->n = k;
}

static int f_destroy_id(struct rdma_cm_id *id)
{
	struct fake_id *f = (struct fake_id *)id;

	fv_lock();
	purge_events(id);
	if (f->peer)
		f->peer->peer = NULL;
	if (listener == f)
		listener = NULL;
	free(f);
	F.live--;
	fv_unlock();
	return 0;
}

static int f_bind_addr(struct rdma_cm_id *id, struct sockaddr *a)
{
	int rc = -1;

	(void)a;
	fv_lock();
	if (!failing()) {
		id->verbs = NULL; /* loopback address: no device known; the listener takes the first */
		rc = 0;
	}
	fv_unlock();
	return rc;
}

static int f_listen(struct rdma_cm_id *id, int b)
{
	int rc = -1;

	(void)b;
	fv_lock();
	if (!failing()) {
		listener = (struct fake_id *)id;
		rc = 0;
	}
	fv_unlock();
	return rc;
}

static int f_resolve_addr(struct rdma_cm_id *id, struct sockaddr *s, struct sockaddr *d, int t)
{
	int rc = -1;

	(void)s; (void)d; (void)t;
	fv_lock();
	if (!failing()) {
		id->verbs = &F.ctx;
		if (F.loopback)
			fake_verbs_push_cm(id->channel, RDMA_CM_EVENT_ADDR_RESOLVED, id);
		rc = 0;
	}
	fv_unlock();
	return rc;
}

static int f_resolve_route(struct rdma_cm_id *id, int t)
{
	int rc = -1;

	(void)t;
	fv_lock();
	if (!failing()) {
		if (F.loopback)
			fake_verbs_push_cm(id->channel, RDMA_CM_EVENT_ROUTE_RESOLVED, id);
		rc = 0;
	}
	fv_unlock();
	return rc;
}

/* Loopback: a connect reaches the listener as a new id, or is rejected. */
static int f_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct fake_id *f = (struct fake_id *)id, *srv;
	int rc = -1;

	(void)p;
	fv_lock();
	if (!failing()) {
		rc = 0;
		if (F.loopback && listener) {
			srv = (struct fake_id *)fake_verbs_new_id(listener->id.channel, NULL);
			srv->peer = f;
			f->peer = srv;
			fake_verbs_push_cm(listener->id.channel, RDMA_CM_EVENT_CONNECT_REQUEST, &srv->id);
		} else if (F.loopback) {
			fake_verbs_push_cm(id->channel, RDMA_CM_EVENT_REJECTED, id);
		}
	}
	fv_unlock();
	return rc;
}

static void pair_qps(struct fake_id *a, struct fake_id *b)
{
	struct fake_qp *qa = (struct fake_qp *)a->id.qp, *qb = (struct fake_qp *)b->id.qp;

	if (qa && qb) {
		qa->peer = qb;
		qb->peer = qa;
	}
}

static int f_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct fake_id *f = (struct fake_id *)id;
	int rc = -1;

	(void)p;
	fv_lock();
	if (!failing()) {
		rc = 0;
		if (F.loopback && f->peer) {
			pair_qps(f, f->peer);
			fake_verbs_push_cm(id->channel, RDMA_CM_EVENT_ESTABLISHED, id);
			fake_verbs_push_cm(f->peer->id.channel, RDMA_CM_EVENT_ESTABLISHED, &f->peer->id);
		}
	}
	fv_unlock();
	return rc;
}

static int f_reject(struct rdma_cm_id *id, const void *d, uint8_t l)
{
	struct fake_id *f = (struct fake_id *)id;

	(void)d; (void)l;
	fv_lock();
	F.rejects++;
	if (F.loopback && f->peer) {
		fake_verbs_push_cm(f->peer->id.channel, RDMA_CM_EVENT_REJECTED, &f->peer->id);
		f->peer->peer = NULL;
		f->peer = NULL;
	}
	fv_unlock();
	return 0;
}

static void unpair(struct fake_id *f)
{
	struct fake_qp *q = (struct fake_qp *)f->id.qp;

	if (q && q->peer) {
		q->peer->peer = NULL;
		q->peer = NULL;
	}
}

static int f_disconnect(struct rdma_cm_id *id)
{
	struct fake_id *f = (struct fake_id *)id;

	fv_lock();
	F.disconnects++;
	if (F.loopback && !f->disconnected) {
		f->disconnected = 1;
		unpair(f);
		fake_verbs_push_cm(id->channel, RDMA_CM_EVENT_DISCONNECTED, id);
		if (f->peer && !f->peer->disconnected) {
			f->peer->disconnected = 1;
			fake_verbs_push_cm(f->peer->id.channel, RDMA_CM_EVENT_DISCONNECTED,
					   &f->peer->id);
		}
	}
	fv_unlock();
	return 0;
}

static int f_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch)
{
	int rc = -1;

	fv_lock();
	if (!failing()) {
		id->channel = ch;
		rc = 0;
	}
	fv_unlock();
	return rc;
}

static int f_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev)
{
	struct fake_ch *c = (struct fake_ch *)ch;
	int rc = 0;

	fv_lock();
	if (c->n == 0) {
		drain_fd(ch->fd);
		errno = EAGAIN;
		rc = -1;
	} else {
		*ev = c->q[0];
		memmove(c->q, c->q + 1, (size_t)--c->n * sizeof(c->q[0]));
		if (c->n == 0)
			drain_fd(ch->fd);
	}
	fv_unlock();
	return rc;
}

static int f_ack_cm_event(struct rdma_cm_event *ev)
{
	free(ev);
	return 0;
}

static int f_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct fake_qp *q;
	int rc = -1;

	(void)pd;
	fv_lock();
	if (!failing()) {
		q = calloc(1, sizeof(*q));
		q->scq = (struct fake_cq *)a->send_cq;
		q->rcq = (struct fake_cq *)a->recv_cq;
		q->qp.send_cq = a->send_cq;
		q->qp.recv_cq = a->recv_cq;
		F.last_qp_cap = a->cap;
		id->qp = &q->qp;
		F.live++;
		rc = 0;
	}
	fv_unlock();
	return rc;
}

static void f_destroy_qp(struct rdma_cm_id *id)
{
	struct fake_qp *q = (struct fake_qp *)id->qp;

	fv_lock();
	if (q && q->peer)
		q->peer->peer = NULL;
	free(q);
	id->qp = NULL;
	F.live--;
	fv_unlock();
}

static struct ibv_pd *f_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = NULL;

	fv_lock();
	if (!failing()) {
		pd = calloc(1, sizeof(*pd));
		pd->context = ctx;
		F.live++;
	}
	fv_unlock();
	return pd;
}

static int f_dealloc_pd(struct ibv_pd *pd)
{
	fv_lock();
	free(pd);
	F.live--;
	fv_unlock();
	return 0;
}

static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	struct fake_mr *m = NULL;

	fv_lock();
	if (F.reg_mr_errno) {
		F.calls++;
		errno = F.reg_mr_errno;
	} else if (!failing()) {
		m = calloc(1, sizeof(*m));
		m->mr.pd = pd;
		m->mr.addr = addr;
		m->mr.length = len;
		m->mr.lkey = 0x100 + ++next_key;
		/* Only memory registered for remote access gets an rkey. */
		m->mr.rkey = (access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) ?
			     0x10000 + next_key : 0;
		m->access = access;
		m->next = mrs;
		mrs = m;
		F.live++;
	}
	fv_unlock();
	return m ? &m->mr : NULL;
}

static int f_dereg_mr(struct ibv_mr *mr)
{
	struct fake_mr **p;

	fv_lock();
	for (p = &mrs; *p; p = &(*p)->next)
		if (&(*p)->mr == mr) {
			*p = (*p)->next;
			break;
		}
	free(mr);
	F.live--;
	fv_unlock();
	return 0;
}

static struct ibv_comp_channel *f_create_comp_channel(struct ibv_context *ctx)
{
	struct fake_comp *c = NULL;

	fv_lock();
	if (!failing()) {
		c = calloc(1, sizeof(*c));
		c->ch.context = ctx;
		c->ch.fd = eventfd(0, EFD_NONBLOCK);
		F.live++;
	}
	fv_unlock();
	return c ? &c->ch : NULL;
}

static int f_destroy_comp_channel(struct ibv_comp_channel *c)
{
	fv_lock();
	close(c->fd);
	free(c);
	F.live--;
	fv_unlock();
	return 0;
}

static struct ibv_cq *f_create_cq(struct ibv_context *ctx, int cqe, void *cctx,
				  struct ibv_comp_channel *ch, int v)
{
	struct fake_cq *cq = NULL;

	(void)cqe; (void)v;
	fv_lock();
	if (!failing()) {
		cq = calloc(1, sizeof(*cq));
		cq->cq.context = ctx;
		cq->cq.cq_context = cctx;
		cq->cq.channel = ch;
		if (ch)
			((struct fake_comp *)ch)->cq = cq;
		F.live++;
	}
	fv_unlock();
	return cq ? &cq->cq : NULL;
}

static int f_destroy_cq(struct ibv_cq *cq)
{
	fv_lock();
	if (cq->channel)
		((struct fake_comp *)cq->channel)->cq = NULL;
	free(cq);
	F.live--;
	fv_unlock();
	return 0;
}

static int f_req_notify_cq(struct ibv_cq *cq, int s)
{
	int rc;

	(void)cq; (void)s;
	fv_lock();
	rc = failing() ? ENOMEM : 0;
	fv_unlock();
	return rc;
}

static int f_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
	struct fake_comp *c = (struct fake_comp *)ch;
	int rc = -1;

	fv_lock();
	if (c->cq && drain_fd(ch->fd)) {
		*cq = &c->cq->cq;
		*ctx = c->cq->cq.cq_context;
		rc = 0;
	} else {
		errno = EAGAIN;
	}
	fv_unlock();
	return rc;
}

static void f_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	(void)cq; (void)n;
}

static int f_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct fake_cq *f = (struct fake_cq *)cq;
	int n = 0;

	fv_lock();
	while (n < num && f->n) {
		wc[n++] = f->q[f->head];
		f->head = (f->head + 1) % QMAX;
		f->n--;
	}
	fv_unlock();
	return n;
}

/* Loopback: complete wr on q's send CQ with status st (and mark the QP
 * failed when st is an error, as RC does). */
static void complete(struct fake_qp *q, const struct ibv_send_wr *wr, enum ibv_wc_status st,
		     enum ibv_wc_opcode op, uint32_t bytes)
{
	if (st != IBV_WC_SUCCESS)
		q->error = 1;
	else if (!(wr->send_flags & IBV_SEND_SIGNALED))
		return;
	push_wc_op(&q->scq->cq, wr->wr_id, st, bytes, op);
}

static uint32_t sge_bytes(const struct ibv_send_wr *wr)
{
	uint32_t n = 0;

	for (int i = 0; i < wr->num_sge; i++)
		n += wr->sg_list[i].length;
	return n;
}

/* The registered MR covering [addr, addr + len) with rkey and access, or
 * NULL. */
static struct fake_mr *find_remote(uint64_t addr, uint32_t len, uint32_t rkey, int access)
{
	for (struct fake_mr *m = mrs; m; m = m->next) {
		uint64_t base = (uint64_t)(uintptr_t)m->mr.addr;

		if (m->mr.rkey == rkey && rkey != 0 && (m->access & access) && addr >= base &&
		    addr + len <= base + m->mr.length)
			return m;
	}
	return NULL;
}

/* Loopback SEND: into the peer's oldest posted receive. */
static void loop_send(struct fake_qp *q, const struct ibv_send_wr *wr)
{
	struct fake_qp *p = q->peer;
	uint32_t bytes = sge_bytes(wr), off = 0;
	struct fake_recv *r;

	if (!p || q->error) {
		complete(q, wr, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
		return;
	}
	if (p->rn == 0) {
		complete(q, wr, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SEND, 0);
		return;
	}
	r = &p->r[p->rhead];
	p->rhead = (p->rhead + 1) % QMAX;
	p->rn--;
	if (bytes > r->length) {
		push_wc_op(&p->rcq->cq, r->wr_id, IBV_WC_LOC_LEN_ERR, 0, IBV_WC_RECV);
		complete(q, wr, IBV_WC_REM_INV_REQ_ERR, IBV_WC_SEND, 0);
		return;
	}
	for (int i = 0; i < wr->num_sge; i++) {
		memcpy((uint8_t *)r->addr + off, (void *)(uintptr_t)wr->sg_list[i].addr,
		       wr->sg_list[i].length);
		off += wr->sg_list[i].length;
	}
	push_wc_op(&p->rcq->cq, r->wr_id, IBV_WC_SUCCESS, bytes, IBV_WC_RECV);
	complete(q, wr, IBV_WC_SUCCESS, IBV_WC_SEND, bytes);
}

/* Loopback READ/WRITE: copy within the process after the rkey check. */
static void loop_xfer(struct fake_qp *q, const struct ibv_send_wr *wr)
{
	int read = wr->opcode == IBV_WR_RDMA_READ;
	enum ibv_wc_opcode op = read ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
	uint64_t raddr = wr->wr.rdma.remote_addr;
	uint32_t bytes = sge_bytes(wr);

	if (!q->peer || q->error) {
		complete(q, wr, IBV_WC_WR_FLUSH_ERR, op, 0);
		return;
	}
	if (F.xfer_status_at && F.posted_xfer == F.xfer_status_at) {
		complete(q, wr, (enum ibv_wc_status)F.xfer_status, op, 0);
		return;
	}
	if (F.xfer_hold) {
		F.held_xfers++;
		return;
	}
	if (!find_remote(raddr, bytes, wr->wr.rdma.rkey,
			 read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE)) {
		complete(q, wr, IBV_WC_REM_ACCESS_ERR, op, 0);
		return;
	}
	for (int i = 0; i < wr->num_sge; i++) {
		void *local = (void *)(uintptr_t)wr->sg_list[i].addr;
		void *remote = (void *)(uintptr_t)raddr;

		if (read)
			memcpy(local, remote, wr->sg_list[i].length);
		else
			memcpy(remote, local, wr->sg_list[i].length);
		raddr += wr->sg_list[i].length;
	}
	F.xfer_bytes += bytes;
	complete(q, wr, IBV_WC_SUCCESS, op, bytes);
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	int rc = 0;

	fv_lock();
	if (failing()) {
		*bad = wr;
		fv_unlock();
		return ENOMEM;
	}
	for (; wr; wr = wr->next) {
		F.last_wr = *wr;
		if (wr->opcode == IBV_WR_SEND) {
			F.posted_send++;
			if (F.loopback)
				loop_send(q, wr);
			continue;
		}
		if (F.fail_post_send_at_xfer && F.posted_xfer + 1 == F.fail_post_send_at_xfer) {
			*bad = wr;
			rc = EINVAL;
			break;
		}
		F.posted_xfer++;
		F.xfer_ids[F.n_xfer_ids++ % QMAX] = wr->wr_id;
		if (F.loopback)
			loop_xfer(q, wr);
	}
	fv_unlock();
	return rc;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fake_qp *q = (struct fake_qp *)qp;

	fv_lock();
	if (failing()) {
		*bad = wr;
		fv_unlock();
		return ENOMEM;
	}
	for (; wr; wr = wr->next) {
		F.posted_recv++;
		if (q->rn < QMAX && wr->num_sge == 1) {
			struct fake_recv *r = &q->r[(q->rhead + q->rn++) % QMAX];

			r->wr_id = wr->wr_id;
			r->addr = (void *)(uintptr_t)wr->sg_list[0].addr;
			r->length = wr->sg_list[0].length;
		}
	}
	fv_unlock();
	return 0;
}

const struct rdmx_ops fake_verbs_ops = {
	.get_devices = f_get_devices, .free_devices = f_free_devices,
	.create_event_channel = f_create_event_channel,
	.destroy_event_channel = f_destroy_event_channel,
	.create_id = f_create_id, .destroy_id = f_destroy_id, .bind_addr = f_bind_addr,
	.listen = f_listen, .resolve_addr = f_resolve_addr, .resolve_route = f_resolve_route,
	.connect = f_connect, .accept = f_accept, .reject = f_reject, .disconnect = f_disconnect,
	.migrate_id = f_migrate_id, .get_cm_event = f_get_cm_event, .ack_cm_event = f_ack_cm_event,
	.create_qp = f_create_qp, .destroy_qp = f_destroy_qp, .alloc_pd = f_alloc_pd,
	.dealloc_pd = f_dealloc_pd, .reg_mr = f_reg_mr, .dereg_mr = f_dereg_mr,
	.create_comp_channel = f_create_comp_channel,
	.destroy_comp_channel = f_destroy_comp_channel, .create_cq = f_create_cq,
	.destroy_cq = f_destroy_cq, .req_notify_cq = f_req_notify_cq,
	.get_cq_event = f_get_cq_event, .ack_cq_events = f_ack_cq_events, .poll_cq = f_poll_cq,
	.post_send = f_post_send, .post_recv = f_post_recv,
};

#endif /* KVPOOL_RDMA */
