/*
 * test_rdma.c - rdma/ against fake verbs and rdma_cm (struct rdmx_ops):
 * descriptors, the listener and its arena registration, accepting onto a
 * worker, the connection state machine, completion handling (status
 * first), the work-request bounds and pipelining, every failure and
 * teardown path. No device is needed. In an RDMA=0 build only the
 * descriptor codec and the stub's -EOPNOTSUPP are tested.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "rdmx.h"

/* ---- descriptors (both builds) --------------------------------------- */

static void test_desc_layout(void **state)
{
	struct rdmx_desc d = { .addr = 0x1122334455667788ull, .rkey = 0xa1b2c3d4, .length = 4096 }, e;
	uint8_t b[RDMX_DESC_BYTES];
	static const uint8_t want[RDMX_DESC_BYTES] = { 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
						       0xd4, 0xc3, 0xb2, 0xa1, 0x00, 0x10, 0x00, 0x00 };

	(void)state;
	rdmx_desc_encode(&d, b);
	assert_memory_equal(b, want, sizeof(want)); /* little-endian, as PROTOCOL.md 13 */
	rdmx_desc_decode(b, &e);
	assert_true(e.addr == d.addr && e.rkey == d.rkey && e.length == d.length);
}

static void test_msg_descs(void **state)
{
	static uint8_t msg[RDMX_MSG_MAX_BYTES + 64];
	struct proto_header h = { .body_bytes = 8 + 2 * PROTO_GET_ENTRY_BYTES };
	const uint8_t *d = NULL;
	size_t n = rdmx_msg_bytes(&h, 2);

	(void)state;
	assert_int_equal(n, 32 + 88 + 32);
	assert_int_equal(rdmx_msg_descs(msg, n, &h, 2, &d), 0);
	assert_ptr_equal(d, msg + 32 + h.body_bytes);
	assert_int_equal(rdmx_msg_descs(msg, n - 1, &h, 2, &d), -EPROTO);
	assert_int_equal(rdmx_msg_descs(msg, n + 16, &h, 2, &d), -EPROTO);
	h.body_bytes = RDMX_MSG_MAX_BYTES;
	assert_int_equal(rdmx_msg_descs(msg, sizeof(msg), &h, 1, &d), -EMSGSIZE);
	/* The largest batch fits, one more does not. */
	uint32_t m = rdmx_max_batch(PROTO_PUT_ENTRY_BYTES);
	h.body_bytes = (uint32_t)proto_batch_body_bytes(m, PROTO_PUT_ENTRY_BYTES);
	assert_true(rdmx_msg_bytes(&h, m) <= RDMX_MSG_MAX_BYTES);
	h.body_bytes = (uint32_t)proto_batch_body_bytes(m + 1, PROTO_PUT_ENTRY_BYTES);
	assert_true(rdmx_msg_bytes(&h, m + 1) > RDMX_MSG_MAX_BYTES);
}

#ifndef KVPOOL_RDMA

static void test_stub(void **state)
{
	struct rdmx_listener_config cfg = { .listen = "127.0.0.1", .port = 7472 };
	struct rdmx_listener *l = NULL;
	struct rdmx_client *c = NULL;
	char why[RDMX_REASON_BYTES] = "";

	(void)state;
	assert_false(rdmx_built());
	assert_int_equal(rdmx_listener_open(&cfg, &l, why, sizeof(why)), -EOPNOTSUPP);
	assert_null(l);
	assert_non_null(strstr(why, "without RDMA"));
	assert_int_equal(rdmx_client_connect("127.0.0.1", 7472, 100, NULL, &c), -EOPNOTSUPP);
	assert_null(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_desc_layout),
		cmocka_unit_test(test_msg_descs),
		cmocka_unit_test(test_stub),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* KVPOOL_RDMA */

#include "fake_verbs.h"
#include "rdmx_impl.h"

/* ---- the fakes (fake_verbs.c, recording mode) ---------------------- */

#define F fake_verbs
#define QMAX FAKE_VERBS_QMAX
#define fake_ops fake_verbs_ops
#define new_id fake_verbs_new_id
#define push_cm fake_verbs_push_cm

/* Queue a completion on c's CQ. */
static void push_wc(struct rdmx_conn *c, uint64_t wr_id, enum ibv_wc_status st, uint32_t bytes)
{
	fake_verbs_push_wc(c->cq, wr_id, st, bytes);
}

/* ---- fixture: a listener over a small arena --------------------------- */

static uint8_t arena[1 << 20];

struct rec {
	int msgs, xfer_done, closed;
	size_t last_bytes;
	char reason[128];
};

static void cb_msg(struct rdmx_conn *c, const uint8_t *m, size_t n, void *arg)
{
	struct rec *r = arg;

	(void)c; (void)m;
	r->msgs++;
	r->last_bytes = n;
}
static void cb_xfer(struct rdmx_conn *c, int st, void *arg)
{
	(void)c;
	assert_int_equal(st, 0);
	((struct rec *)arg)->xfer_done++;
}
static void cb_close(struct rdmx_conn *c, const char *why, void *arg)
{
	struct rec *r = arg;

	(void)c;
	r->closed++;
	snprintf(r->reason, sizeof(r->reason), "%s", why);
}
static const struct rdmx_conn_cbs cbs = { cb_msg, cb_xfer, cb_close };

static int reset(void **state)
{
	(void)state;
	fake_verbs_reset();
	return 0;
}

static int open_listener(struct rdmx_listener **l, char *why, size_t len)
{
	struct rdmx_listener_config cfg = { .listen = "127.0.0.1", .port = 7472, .arena = arena,
					    .arena_bytes = sizeof(arena), .ops = &fake_ops };

	return rdmx_listener_open(&cfg, l, why, len);
}

/* Listener + worker + one accepted, established connection. */
static void setup_conn(struct rdmx_listener **l, struct rdmx_worker **w, struct rdmx_conn **c,
		       struct rec *r)
{
	void *req = NULL;

	assert_int_equal(open_listener(l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(*l, w), 0);
	push_cm((*l)->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id((*l)->ch, NULL));
	assert_int_equal(rdmx_listener_take(*l, &req), 1);
	assert_int_equal(rdmx_conn_accept(*w, req, &cbs, r, c), 0);
	assert_int_equal(rdmx_conn_state(*c), RDMX_CONN_CONNECTING);
	push_cm((*w)->ch, RDMA_CM_EVENT_ESTABLISHED, (*c)->id);
	rdmx_worker_cm_events(*w);
	assert_int_equal(rdmx_conn_state(*c), RDMX_CONN_ESTABLISHED);
}

/* ---- listener --------------------------------------------------------- */

static void test_no_device(void **state)
{
	struct rdmx_listener *l = NULL;
	char why[RDMX_REASON_BYTES] = "";

	(void)state;
	F.n_devices = 0;
	assert_int_equal(open_listener(&l, why, sizeof(why)), -ENODEV);
	assert_null(l);
	assert_non_null(strstr(why, "no RDMA device"));
	assert_int_equal(F.live, 0);
}

/* Every call of the listener's setup can fail: each failure is reported
 * with a reason, leaves nothing allocated, and the arena registration's
 * failure names RLIMIT_MEMLOCK or the arena. */
static void test_listener_every_failure(void **state)
{
	struct rdmx_listener *l;
	char why[RDMX_REASON_BYTES];
	int k, rc;

	(void)state;
	for (k = 1;; k++) {
		reset(NULL);
		F.fail_at = k;
		l = NULL;
		why[0] = '\0';
		rc = open_listener(&l, why, sizeof(why));
		if (rc == 0)
			break;
		assert_null(l);
		assert_true(why[0] != '\0');
		assert_int_equal(F.live, 0);
	}
	assert_true(k > 6); /* devices, channel, id, bind, listen, pd, mr */
	/* The last step that could fail was the arena registration. */
	rdmx_listener_close(l);
	reset(NULL);
	F.fail_at = k - 1;
	assert_int_equal(open_listener(&l, why, sizeof(why)), -ENOMEM);
	assert_non_null(strstr(why, "cannot register the 1048576-byte arena"));
	assert_int_equal(F.live, 0);
}

static void test_arena_mr_has_no_remote_access(void **state)
{
	struct rdmx_listener *l;

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_ptr_equal(l->arena_mr->addr, arena);
	assert_int_equal(l->arena_mr->length, sizeof(arena));
	assert_int_equal(l->arena_mr->rkey, 0); /* registered without remote access */
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* ---- accept and the state machine -------------------------------------- */

static void test_accept_establish_close(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };

	(void)state;
	setup_conn(&l, &w, &c, &r);
	assert_int_equal(F.posted_recv, RDMX_MSG_DEPTH);
	assert_int_equal(F.last_qp_cap.max_send_wr, RDMX_QP_MAX_XFER + RDMX_MSG_DEPTH);
	assert_true(rdmx_conn_fd(c) >= 0);
	/* The peer leaves. */
	push_cm(w->ch, RDMA_CM_EVENT_DISCONNECTED, c->id);
	rdmx_worker_cm_events(w);
	assert_int_equal(r.closed, 1);
	assert_string_equal(r.reason, "peer disconnected");
	assert_null(w->conns);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* Every step of accepting can fail: the request is rejected, everything
 * set up for it is undone, the listener and worker are undisturbed. */
static void test_accept_every_failure(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };
	void *req;
	int k, rc, base;

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(l, &w), 0);
	base = F.live;
	for (k = 1;; k++) {
		push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
		assert_int_equal(rdmx_listener_take(l, &req), 1);
		F.rejects = 0;
		F.fail_at = F.calls + k;
		c = NULL;
		rc = rdmx_conn_accept(w, req, &cbs, &r, &c);
		F.fail_at = 0;
		if (rc == 0)
			break;
		assert_null(c);
		assert_int_equal(F.rejects, 1);
		assert_int_equal(F.live, base);
		assert_null(w->conns);
	}
	assert_true(k > 8); /* migrate, channel, cq, arm, qp, mr, recvs..., accept */
	assert_int_equal(r.closed, 0); /* a refused request never reports on_close */
	rdmx_conn_close(c, "test");
	assert_int_equal(r.closed, 1);
	assert_int_equal(F.live, base);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* A request on another device than the arena's is refused. */
static void test_accept_other_device(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c = NULL;
	struct ibv_context other;
	struct rdma_cm_id *id;
	void *req;

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(l, &w), 0);
	id = new_id(l->ch, NULL);
	id->verbs = &other;
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, id);
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_int_equal(rdmx_conn_accept(w, req, &cbs, NULL, &c), -ENODEV);
	assert_null(c);
	assert_int_equal(F.rejects, 1);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* Events other than a connection request are acknowledged and skipped. */
static void test_listener_take(void **state)
{
	struct rdmx_listener *l;
	void *req = NULL;

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_int_equal(rdmx_listener_take(l, &req), 0);
	push_cm(l->ch, RDMA_CM_EVENT_TIMEWAIT_EXIT, NULL);
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_non_null(req);
	rdmx_listener_refuse(l, req);
	assert_int_equal(F.rejects, 1);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* ---- messages and completions ------------------------------------------- */

static void test_recv_and_send(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };
	uint8_t big[RDMX_MSG_MAX_BYTES + 1] = { 0 };

	(void)state;
	setup_conn(&l, &w, &c, &r);
	push_wc(c, RDMX_WR_ID(RDMX_WR_RECV, 3), IBV_WC_SUCCESS, 72);
	rdmx_conn_completions(c);
	assert_int_equal(r.msgs, 1);
	assert_int_equal(r.last_bytes, 72);
	assert_int_equal(F.posted_recv, RDMX_MSG_DEPTH + 1); /* reposted */
	/* Sends: bounded by the send buffers, freed by their completions. */
	assert_int_equal(rdmx_conn_send(c, big, sizeof(big)), -EMSGSIZE);
	for (uint32_t i = 0; i < RDMX_MSG_DEPTH; i++)
		assert_int_equal(rdmx_conn_send(c, big, 100), 0);
	assert_int_equal(rdmx_conn_send(c, big, 100), -EAGAIN);
	push_wc(c, RDMX_WR_ID(RDMX_WR_SEND, 0), IBV_WC_SUCCESS, 0);
	rdmx_conn_completions(c);
	assert_int_equal(rdmx_conn_send(c, big, 100), 0);
	rdmx_conn_close(c, "done");
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

static void test_send_before_established(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c = NULL;
	struct rec r = { 0 };
	void *req;
	struct rdmx_xfer_item it = { arena, 10, 0x1000, 5 };

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(l, &w), 0);
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_int_equal(rdmx_conn_accept(w, req, &cbs, &r, &c), 0);
	assert_int_equal(rdmx_conn_send(c, "x", 1), -ENOTCONN);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, &it, 1), -ENOTCONN);
	/* The connection fails before it is established. */
	push_cm(w->ch, RDMA_CM_EVENT_CONNECT_ERROR, c->id);
	rdmx_worker_cm_events(w);
	assert_int_equal(r.closed, 1);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* An error completion of a RECV or SEND closes the connection; its
 * status is checked before anything else (the message is not delivered). */
static void test_error_completion_recv(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };

	(void)state;
	setup_conn(&l, &w, &c, &r);
	push_wc(c, RDMX_WR_ID(RDMX_WR_RECV, 0), IBV_WC_LOC_LEN_ERR, 72);
	rdmx_conn_completions(c);
	assert_int_equal(r.msgs, 0);
	assert_int_equal(r.closed, 1);
	assert_non_null(strstr(r.reason, "length"));
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* ---- transfers: bounds, pipelining, errors -------------------------------- */

static void fill_items(struct rdmx_xfer_item *it, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		it[i] = (struct rdmx_xfer_item){ arena + i * 4096, 4096, 0x10000 + i * 4096ull, 0x55 };
}

/* Complete the first n outstanding transfer WRs (in posting order). */
static void complete_xfers(struct rdmx_conn *c, int *next_id, int n, enum ibv_wc_status st)
{
	for (int i = 0; i < n; i++)
		push_wc(c, F.xfer_ids[(*next_id)++ % QMAX], st, 0);
	rdmx_conn_completions(c);
}

static void test_xfer_pipelined(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };
	struct rdmx_xfer_item it[100];
	int next = 0;

	(void)state;
	setup_conn(&l, &w, &c, &r);
	fill_items(it, 100);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, it, 100), 0);
	assert_int_equal(F.posted_xfer, RDMX_QP_MAX_XFER); /* bounded per QP */
	assert_int_equal(rdmx_conn_outstanding(c), RDMX_QP_MAX_XFER);
	assert_int_equal(F.last_wr.opcode, IBV_WR_RDMA_READ);
	assert_int_equal(F.last_wr.wr.rdma.rkey, 0x55);
	assert_int_equal(F.last_wr.sg_list->lkey, l->arena_mr->lkey);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, it, 1), -EBUSY);
	complete_xfers(c, &next, 10, IBV_WC_SUCCESS);
	assert_int_equal(F.posted_xfer, RDMX_QP_MAX_XFER + 10); /* refilled, not refused */
	assert_int_equal(rdmx_conn_outstanding(c), RDMX_QP_MAX_XFER);
	while (next < 100)
		complete_xfers(c, &next, (int)rdmx_conn_outstanding(c), IBV_WC_SUCCESS);
	assert_int_equal(r.xfer_done, 1);
	assert_int_equal(F.posted_xfer, 100);
	assert_int_equal(rdmx_conn_outstanding(c), 0);
	assert_int_equal(w->budget.outstanding, 0);
	/* WRITE next, the connection is free again. */
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_WRITE, it, 2), 0);
	assert_int_equal(F.last_wr.opcode, IBV_WR_RDMA_WRITE);
	complete_xfers(c, &next, 2, IBV_WC_SUCCESS);
	assert_int_equal(r.xfer_done, 2);
	rdmx_conn_close(c, "done");
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* The per-worker bound is shared: a second connection waits for the
 * budget the first gives back, and gets it without a completion of its own. */
static void test_worker_budget(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *a, *b;
	struct rec ra = { 0 }, rb = { 0 };
	struct rdmx_xfer_item it[40];
	void *req;
	int next = 0;

	(void)state;
	setup_conn(&l, &w, &a, &ra);
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_int_equal(rdmx_conn_accept(w, req, &cbs, &rb, &b), 0);
	push_cm(w->ch, RDMA_CM_EVENT_ESTABLISHED, b->id);
	rdmx_worker_cm_events(w);
	w->budget.max = 40;
	fill_items(it, 40);
	assert_int_equal(rdmx_conn_xfer(a, RDMX_XFER_WRITE, it, 40), 0);
	assert_int_equal(rdmx_conn_outstanding(a), RDMX_QP_MAX_XFER);
	assert_int_equal(rdmx_conn_xfer(b, RDMX_XFER_WRITE, it, 40), 0);
	assert_int_equal(rdmx_conn_outstanding(b), 40 - RDMX_QP_MAX_XFER);
	assert_int_equal(w->budget.outstanding, 40);
	complete_xfers(a, &next, 5, IBV_WC_SUCCESS);
	/* a refilled first (5 back, 5 posted), b got nothing yet. */
	assert_int_equal(w->budget.outstanding, 40);
	/* a closes: its budget returns, b is kicked on the next event. */
	rdmx_conn_close(a, "bye");
	assert_int_equal(w->budget.outstanding, 40 - RDMX_QP_MAX_XFER);
	rdmx_conn_completions(b);
	assert_int_equal(rdmx_conn_outstanding(b), RDMX_QP_MAX_XFER);
	assert_int_equal(w->budget.outstanding, RDMX_QP_MAX_XFER);
	rdmx_worker_close(w);
	assert_int_equal(rb.closed, 1);
	assert_string_equal(rb.reason, "server shutting down");
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* A READ that completes in error: no on_xfer_done, the connection is torn
 * down (QP first) before on_close, every WR's budget is given back, and a
 * second connection is undisturbed. */
static void test_xfer_error(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *a, *b;
	struct rec ra = { 0 }, rb = { 0 };
	struct rdmx_xfer_item it[8];
	void *req;
	int next = 0;

	(void)state;
	setup_conn(&l, &w, &a, &ra);
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_int_equal(rdmx_conn_accept(w, req, &cbs, &rb, &b), 0);
	push_cm(w->ch, RDMA_CM_EVENT_ESTABLISHED, b->id);
	rdmx_worker_cm_events(w);
	fill_items(it, 8);
	assert_int_equal(rdmx_conn_xfer(a, RDMX_XFER_READ, it, 8), 0);
	complete_xfers(a, &next, 1, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(ra.xfer_done, 0);
	assert_int_equal(ra.closed, 1);
	assert_non_null(strstr(ra.reason, "access"));
	assert_int_equal(w->budget.outstanding, 0);
	assert_ptr_equal(w->conns, b);
	assert_int_equal(rdmx_conn_state(b), RDMX_CONN_ESTABLISHED);
	assert_int_equal(rb.closed, 0);
	assert_int_equal(rdmx_conn_send(b, "ok", 2), 0);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* Posting fails half way: the caller is told, the connection is failed
 * and closed on its next event. Items outside the arena MR are refused. */
static void test_xfer_post_failure(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	struct rec r = { 0 };
	struct rdmx_xfer_item it[8];
	uint8_t outside[16];
	struct rdmx_xfer_item bad = { outside, 16, 0x1000, 1 };
	struct rdmx_xfer_item over = { arena + sizeof(arena) - 8, 16, 0x1000, 1 };

	(void)state;
	setup_conn(&l, &w, &c, &r);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, &bad, 1), -EINVAL);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, &over, 1), -EINVAL);
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, it, 0), -EINVAL);
	fill_items(it, 8);
	F.fail_post_send_at_xfer = 3;
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, it, 8), -EINVAL);
	assert_int_equal(rdmx_conn_state(c), RDMX_CONN_ERROR);
	assert_int_equal(w->budget.outstanding, 2);
	rdmx_conn_completions(c);
	assert_int_equal(r.closed, 1);
	assert_int_equal(r.xfer_done, 0);
	assert_int_equal(w->budget.outstanding, 0);
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* Closing from inside a callback is deferred until the drain ends. */
static struct rdmx_conn *close_me;
static void cb_msg_close(struct rdmx_conn *c, const uint8_t *m, size_t n, void *arg)
{
	(void)m; (void)n; (void)arg;
	close_me = c;
	rdmx_conn_close(c, "closed by the handler");
}
static const struct rdmx_conn_cbs cbs_close = { cb_msg_close, cb_xfer, cb_close };

static void test_close_in_callback(void **state)
{
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c = NULL;
	struct rec r = { 0 };
	void *req;

	(void)state;
	assert_int_equal(open_listener(&l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(l, &w), 0);
	push_cm(l->ch, RDMA_CM_EVENT_CONNECT_REQUEST, new_id(l->ch, NULL));
	assert_int_equal(rdmx_listener_take(l, &req), 1);
	assert_int_equal(rdmx_conn_accept(w, req, &cbs_close, &r, &c), 0);
	push_cm(w->ch, RDMA_CM_EVENT_ESTABLISHED, c->id);
	rdmx_worker_cm_events(w);
	push_wc(c, RDMX_WR_ID(RDMX_WR_RECV, 0), IBV_WC_SUCCESS, 8);
	push_wc(c, RDMX_WR_ID(RDMX_WR_RECV, 1), IBV_WC_SUCCESS, 8);
	rdmx_conn_completions(c);
	assert_ptr_equal(close_me, c);
	assert_int_equal(r.closed, 1);
	assert_string_equal(r.reason, "closed by the handler");
	rdmx_worker_close(w);
	rdmx_listener_close(l);
	assert_int_equal(F.live, 0);
}

/* ---- client ------------------------------------------------------------- */

static void test_client_no_device(void **state)
{
	struct rdmx_client *c = NULL;

	(void)state;
	F.n_devices = 0;
	assert_int_equal(rdmx_client_connect("127.0.0.1", 7472, 100, &fake_ops, &c), -ENODEV);
	assert_null(c);
	assert_int_equal(F.live, 0);
}

/* The server rejects: -ECONNREFUSED, nothing left. Every earlier step
 * failing leaves nothing either. */
static void test_client_connect_paths(void **state)
{
	struct rdmx_client *c = NULL;
	int k, rc;

	(void)state;
	for (k = 1; k < 40; k++) {
		reset(NULL);
		F.fail_at = k;
		rc = rdmx_client_connect("127.0.0.1", 7472, 50, &fake_ops, &c);
		/* Without queued CM events the wait times out once the
		 * failing step is past the resolve calls. */
		assert_true(rc < 0);
		assert_null(c);
		assert_int_equal(F.live, 0);
	}
}


/* ---- loopback: client and server through the in-process fake fabric ---- */

struct loop_srv {
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct rdmx_conn *c;
	int xfer_status, closed;
	volatile int stop;
};

/* Server side: a READ of the described client buffer into the arena,
 * then a one-byte reply carrying the transfer's status. */
static void loop_msg(struct rdmx_conn *c, const uint8_t *m, size_t n, void *arg)
{
	struct rdmx_desc d;
	struct rdmx_xfer_item it;

	(void)arg;
	assert_int_equal(n, RDMX_DESC_BYTES);
	rdmx_desc_decode(m, &d);
	it = (struct rdmx_xfer_item){ arena, d.length, d.addr, d.rkey };
	assert_int_equal(rdmx_conn_xfer(c, RDMX_XFER_READ, &it, 1), 0);
}
static void loop_xfer(struct rdmx_conn *c, int st, void *arg)
{
	uint8_t reply = st == 0 ? 'k' : 'e';

	((struct loop_srv *)arg)->xfer_status = st;
	assert_int_equal(rdmx_conn_send(c, &reply, 1), 0);
}
static void loop_close(struct rdmx_conn *c, const char *why, void *arg)
{
	struct loop_srv *ls = arg;

	(void)c; (void)why;
	ls->closed++;
	ls->c = NULL;
}
static const struct rdmx_conn_cbs loop_cbs = { loop_msg, loop_xfer, loop_close };

static void *loop_server(void *arg)
{
	struct loop_srv *ls = arg;
	void *req;

	while (!ls->stop) {
		if (rdmx_listener_take(ls->l, &req) == 1)
			assert_int_equal(rdmx_conn_accept(ls->w, req, &loop_cbs, ls, &ls->c), 0);
		rdmx_worker_cm_events(ls->w);
		if (ls->c)
			rdmx_conn_completions(ls->c);
		usleep(200);
	}
	return NULL;
}

/* A client connects, registers a buffer and describes it; the server pulls
 * it with RDMA READ into the arena and replies; a wrong rkey fails the
 * READ and the server's connection goes down, the client's call fails,
 * and nothing is left allocated. */
static void test_loopback_read(void **state)
{
	static uint8_t block[64 * 1024];
	struct loop_srv ls = { 0 };
	struct rdmx_client *cl = NULL;
	struct rdmx_client_mr *mr = NULL;
	struct rdmx_desc d;
	uint8_t msg[RDMX_DESC_BYTES], reply[8];
	size_t got = 0;
	pthread_t th;

	(void)state;
	F.loopback = 1;
	for (size_t i = 0; i < sizeof(block); i++)
		block[i] = (uint8_t)(i * 7 + 3);
	memset(arena, 0, sizeof(block));
	assert_int_equal(open_listener(&ls.l, NULL, 0), 0);
	assert_int_equal(rdmx_worker_open(ls.l, &ls.w), 0);
	assert_int_equal(pthread_create(&th, NULL, loop_server, &ls), 0);

	assert_int_equal(rdmx_client_connect("127.0.0.1", 7472, 2000, &fake_ops, &cl), 0);
	assert_int_equal(rdmx_client_reg(cl, block, sizeof(block), &mr), 0);
	d = (struct rdmx_desc){ (uint64_t)(uintptr_t)block, rdmx_client_mr_rkey(mr), sizeof(block) };
	rdmx_desc_encode(&d, msg);
	assert_int_equal(rdmx_client_call(cl, msg, sizeof(msg), reply, sizeof(reply), &got, 2000), 0);
	assert_int_equal(got, 1);
	assert_int_equal(reply[0], 'k');
	assert_memory_equal(arena, block, sizeof(block));
	assert_int_equal(F.xfer_bytes, sizeof(block));

	/* A descriptor whose rkey is not the region's: remote access error. */
	d.rkey ^= 0x7;
	rdmx_desc_encode(&d, msg);
	assert_true(rdmx_client_call(cl, msg, sizeof(msg), reply, sizeof(reply), &got, 500) < 0);
	for (int i = 0; i < 2000 && !ls.closed; i++)
		usleep(1000);
	assert_int_equal(ls.closed, 1);
	assert_int_equal(ls.xfer_status, 0); /* failures reach on_close, not on_xfer_done */

	ls.stop = 1;
	pthread_join(th, NULL);
	rdmx_client_dereg(cl, mr);
	rdmx_client_close(cl);
	rdmx_worker_close(ls.w);
	rdmx_listener_close(ls.l);
	assert_int_equal(F.live, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_desc_layout),
		cmocka_unit_test(test_msg_descs),
		cmocka_unit_test_setup(test_no_device, reset),
		cmocka_unit_test_setup(test_listener_every_failure, reset),
		cmocka_unit_test_setup(test_arena_mr_has_no_remote_access, reset),
		cmocka_unit_test_setup(test_accept_establish_close, reset),
		cmocka_unit_test_setup(test_accept_every_failure, reset),
		cmocka_unit_test_setup(test_accept_other_device, reset),
		cmocka_unit_test_setup(test_listener_take, reset),
		cmocka_unit_test_setup(test_recv_and_send, reset),
		cmocka_unit_test_setup(test_send_before_established, reset),
		cmocka_unit_test_setup(test_error_completion_recv, reset),
		cmocka_unit_test_setup(test_xfer_pipelined, reset),
		cmocka_unit_test_setup(test_worker_budget, reset),
		cmocka_unit_test_setup(test_xfer_error, reset),
		cmocka_unit_test_setup(test_xfer_post_failure, reset),
		cmocka_unit_test_setup(test_close_in_callback, reset),
		cmocka_unit_test_setup(test_client_no_device, reset),
		cmocka_unit_test_setup(test_client_connect_paths, reset),
		cmocka_unit_test_setup(test_loopback_read, reset),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif /* KVPOOL_RDMA */
