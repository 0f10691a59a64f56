/*
 * io.c - the request engine's link I/O (engine_impl.h): frames out of the
 * send queue onto the link as far as it takes them, replies in and to
 * their frames (stream peers: header, body and a GET's payload straight
 * into the caller's buffers; message peers: one whole reply message),
 * the connection failing as a whole, and waiting: the eventfd, the epoll
 * descriptor kvpool_event_fd hands out, and the timerfd in it.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "engine_impl.h"
#include "lib/clock.h"

#define KVC_SINK_BYTES (64u << 10) /* discarded GET payload is read in these */

static const uint8_t zeros[4096];

/* ---- the eventfd, the epoll descriptor, the timerfd ------------------------------ */

static int efd_open(struct kvc_engine *e)
{
	if (e->efd >= 0)
		return 0;
	e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->efd < 0)
		return errno == EMFILE || errno == ENFILE ? -EMFILE : -ENOMEM;
	e->efd_set = 0;
	return 0;
}

void kvc_io_efd_raise(struct kvc_engine *e)
{
	uint64_t one = 1;

	if (e->efd < 0 || e->efd_set)
		return;
	if (write(e->efd, &one, sizeof(one)) == sizeof(one))
		e->efd_set = 1;
}

static void efd_clear(struct kvc_engine *e)
{
	uint64_t v;

	if (e->efd < 0 || !e->efd_set)
		return;
	if (read(e->efd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
		e->efd_set = 0;
}

/* Keep the link's registrations in the epoll set in step with what
 * progress needs: input always, output while a frame waits on it. */
static void ep_sync(struct kvc_engine *e)
{
	struct pollfd p[KVC_LINK_MAX_FDS];
	int n = 0;

	if (e->epfd < 0)
		return;
	if (kvc_eng_up(e))
		n = e->s.link.t->pollfds(&e->s.link, e->tx_blocked, p);
	for (int i = 0; i < e->ep_n; i++) {
		int keep = 0;

		for (int j = 0; j < n; j++)
			keep |= p[j].fd == e->ep_fd[i];
		if (!keep)
			(void)epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->ep_fd[i], NULL);
	}
	for (int j = 0; j < n; j++) {
		struct epoll_event ev = { .events = 0, .data.fd = p[j].fd };
		int i;

		ev.events = (p[j].events & POLLIN ? EPOLLIN : 0) | (p[j].events & POLLOUT ? EPOLLOUT : 0);
		for (i = 0; i < e->ep_n && e->ep_fd[i] != p[j].fd; i++)
			;
		if (i < e->ep_n && e->ep_ev[i] == ev.events)
			continue;
		if (epoll_ctl(e->epfd, EPOLL_CTL_MOD, p[j].fd, &ev) && errno == ENOENT)
			(void)epoll_ctl(e->epfd, EPOLL_CTL_ADD, p[j].fd, &ev);
	}
	for (int j = 0; j < n; j++) {
		e->ep_fd[j] = p[j].fd;
		e->ep_ev[j] = (p[j].events & POLLIN ? EPOLLIN : 0) | (p[j].events & POLLOUT ? EPOLLOUT : 0);
	}
	e->ep_n = n;
}

/* With an event fd in use, the timerfd in it fires when the next deadline
 * or BUSY retry is due, so that a caller waiting on the descriptor alone
 * calls poll in time. */
static void tfd_sync(struct kvc_engine *e)
{
	uint64_t want = e->active && e->next_timer_ms != UINT64_MAX ? e->next_timer_ms : 0;
	struct itimerspec its = { { 0, 0 }, { 0, 0 } };

	if (e->tfd < 0 || want == e->tfd_armed_ms)
		return;
	if (want) {
		/* CLOCK_MONOTONIC milliseconds, as kvc_now_ms; 0 would disarm */
		its.it_value.tv_sec = (time_t)(want / 1000);
		its.it_value.tv_nsec = (long)(want % 1000) * 1000000 + 1;
	}
	if (timerfd_settime(e->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
		e->tfd_armed_ms = want;
}

/* A timerfd that fired stays readable until read: read it once due. */
void kvc_io_tfd_ack(struct kvc_engine *e, uint64_t now)
{
	uint64_t v;

	if (e->tfd < 0 || !e->tfd_armed_ms || now < e->tfd_armed_ms)
		return;
	if (read(e->tfd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
		e->tfd_armed_ms = 0;
}

/* Before the lock is released: the eventfd says whether completions wait
 * (or pokes the waiters), the epoll set and timer are in step. */
void kvc_io_unlock(struct kvc_engine *e)
{
	tfd_sync(e);
	if (e->done_len || (e->poke && e->waiters))
		kvc_io_efd_raise(e);
	else if (!e->waiters)
		efd_clear(e);
	e->poke = 0;
	ep_sync(e);
	pthread_mutex_unlock(&e->lock);
}

/* ---- connection failure ------------------------------------------------------------ */

void kvc_io_disconnect(struct kvc_engine *e)
{
	kvc_session_disconnect(&e->s);
	e->ep_n = 0; /* closing the descriptors took them out of the epoll set */
}

/* The connection is gone or can no longer be trusted: drop every frame,
 * close it, and finish every active request with err. */
void kvc_io_fail_all(struct kvc_engine *e, int err)
{
	struct kvc_frame *lists[3] = { e->sq_head, e->tx, e->wq_head };

	for (int i = 0; i < 3; i++)
		while (lists[i]) {
			struct kvc_frame *f = lists[i];

			lists[i] = i == 1 ? NULL : f->next;
			if (i > 0) {
				f->s->wire--;
				kvc_slot_release(e, f->s);
			}
			kvc_frame_free(e, f);
		}
	e->sq_head = e->sq_tail = e->wq_head = e->wq_tail = e->tx = NULL;
	e->tx_blocked = 0;
	e->tx_zero_left = 0;
	e->wire_put_bytes = 0;
	e->wire_frames = 0;
	e->stage_busy = 0;
	e->rx = RX_HDR;
	e->rx_off = 0;
	e->rx_frame = NULL;
	kvc_io_disconnect(e);
	while (e->active_head)
		kvc_slot_fail(e, e->active_head, err);
}

/* ---- sending -------------------------------------------------------------------------- */

/* The caller's payload buffers may no longer be read: whatever of the
 * payload is not sent yet goes as zeros (the stream stays in step; the
 * server refuses the block by its checksum). */
static void tx_detach(struct kvc_engine *e)
{
	/* tx_iov[0] is our header and body; entries from 1 on are the
	 * caller's payload, entry tx_iov_i possibly partly sent. */
	size_t from = e->tx_iov_i > 1 ? e->tx_iov_i : 1;
	uint64_t left = 0;

	for (size_t i = from; i < e->tx_iov_n; i++)
		left += e->tx_iov[i].iov_len;
	if (from < e->tx_iov_n)
		e->tx_iov_n = from;
	e->tx_zero_left += left;
}

/* May the next queued frame go on the wire now? */
static int tx_may_start(struct kvc_engine *e, const struct kvc_frame *f)
{
	uint64_t cap = e->s.limits.max_inflight_put_bytes ? e->s.limits.max_inflight_put_bytes
							  : UINT64_MAX;
	uint32_t max_wire = e->s.link.t->max_wire_frames;

	/* The server answers BUSY beyond its in-flight put bytes. */
	if (f->payload_bytes && e->wire_put_bytes &&
	    f->payload_bytes > cap - (e->wire_put_bytes < cap ? e->wire_put_bytes : cap))
		return 0;
	if (max_wire && e->wire_frames >= max_wire)
		return 0;
	/* A staged frame has the whole staging buffer. */
	return !f->stage_bytes || !e->stage_busy;
}

/* Take the next frame off the send queue and encode it. Returns 1 when
 * one is ready in e->tx, 0 when none may go now, or a connection error
 * (after kvc_io_fail_all). */
static int tx_start(struct kvc_engine *e)
{
	struct kvc_frame *f = e->sq_head;
	int rc;

	while (f && f->stage_bytes && tx_may_start(e, f)) {
		/* The staging buffer is made when first needed; if it cannot
		 * be, the request fails and the connection stays. */
		rc = e->s.link.t->stage_ready(&e->s.link, e->s.limits.max_block_bytes);
		if (rc == 0)
			break;
		kvc_sendq_remove(e, f->s);
		kvc_slot_fail(e, f->s, rc);
		f = e->sq_head;
	}
	if (!f || !tx_may_start(e, f))
		return 0;
	rc = kvc_ops_encode(e, f);
	if (rc) {
		kvc_io_fail_all(e, rc);
		return rc;
	}
	e->sq_head = f->next;
	if (!e->sq_head)
		e->sq_tail = NULL;
	f->next = NULL;
	e->tx = f;
	e->tx_iov_i = 0;
	e->tx_zero_left = 0;
	e->tx_answered = 0;
	f->s->wire++;
	e->wire_put_bytes += f->payload_bytes;
	e->wire_frames++;
	if (e->wire_frames > e->max_wire_frames)
		e->max_wire_frames = e->wire_frames;
	if (f->stage_bytes)
		e->stage_busy = 1;
	return 1;
}

/* The frame being sent is all out: it waits for its reply (unless that
 * came already). */
static void tx_done(struct kvc_engine *e)
{
	struct kvc_frame *f = e->tx;

	e->tx = NULL;
	if (e->tx_answered) {
		struct kvc_slot *s = f->s;

		kvc_frame_off_wire(e, f);
		kvc_slot_release(e, s);
		return;
	}
	if (e->wq_tail)
		e->wq_tail->next = f;
	else
		e->wq_head = f;
	e->wq_tail = f;
}

/* Move frames from the send queue to the link while it takes them.
 * Returns 0 or a connection error (after kvc_io_fail_all). */
int kvc_io_tx(struct kvc_engine *e)
{
	struct kvc_link *l = &e->s.link;
	ssize_t n = 0;
	int rc;

	e->tx_blocked = 0;
	while (kvc_eng_up(e)) {
		if (!e->tx) {
			rc = tx_start(e);
			if (rc <= 0)
				return rc;
		}
		if (l->t->message_mode) {
			n = l->t->send(l, e->tx_iov, e->tx_iov_n);
			if (n >= 0) {
				tx_done(e);
				continue;
			}
		} else if (e->tx_iov_i < e->tx_iov_n) {
			n = l->t->send(l, e->tx_iov + e->tx_iov_i, e->tx_iov_n - e->tx_iov_i);
			if (n >= 0) {
				size_t m = (size_t)n;

				while (e->tx_iov_i < e->tx_iov_n && m >= e->tx_iov[e->tx_iov_i].iov_len)
					m -= e->tx_iov[e->tx_iov_i++].iov_len;
				if (m) {
					e->tx_iov[e->tx_iov_i].iov_base =
						(uint8_t *)e->tx_iov[e->tx_iov_i].iov_base + m;
					e->tx_iov[e->tx_iov_i].iov_len -= m;
				}
				continue;
			}
		} else if (e->tx_zero_left) {
			struct iovec z = { (void *)zeros, e->tx_zero_left < sizeof(zeros) ?
							  (size_t)e->tx_zero_left : sizeof(zeros) };

			n = l->t->send(l, &z, 1);
			if (n >= 0) {
				e->tx_zero_left -= (uint64_t)n;
				continue;
			}
		} else {
			tx_done(e);
			continue;
		}
		if (n == -EAGAIN) {
			e->tx_blocked = 1;
			return 0;
		}
		kvc_io_fail_all(e, (int)n);
		return (int)n;
	}
	return 0;
}

/* ---- receiving ------------------------------------------------------------------------ */

/* The frame a reply with request id `id` answers. The server answers in
 * request order (PROTOCOL.md, Pipelining), so that is the oldest frame on
 * the wire queue, or the one being sent when none waits (a server may
 * refuse a frame before it has read all of it); anything else is a
 * broken stream (NULL). */
static struct kvc_frame *rx_find(struct kvc_engine *e, uint64_t id)
{
	if (e->wq_head)
		return e->wq_head->wire_id == id ? e->wq_head : NULL;
	if (e->tx && e->tx->wire_id == id)
		return e->tx;
	return NULL;
}

/* A reply's header (e->rx_h) and body are in: hand it to its frame.
 * Returns 0, or a stream error for the caller to fail everything with. */
static int rx_reply(struct kvc_engine *e, const uint8_t *body)
{
	struct proto_header *h = &e->rx_h;
	struct kvc_frame *f;
	int err = 0;

	if (kvc_frame_is_error(h)) {
		if (kvc_frame_error(h, body, &err, e->s.server_message, &e->s.reconnect_next))
			return -EPROTO;
		if (h->opcode == PROTO_OP_NONE)
			return err; /* connection-level: the server closes */
	}
	f = rx_find(e, h->request_id);
	if (!f || h->opcode != kvc_ops_wire_op(f->s->r.op))
		return -EPROTO;
	if (f == e->tx)
		tx_detach(e);
	return kvc_ops_reply(e, f, err, body);
}

/* The payload of rx_frame is all read (into the caller's buffers, or
 * dropped when its request was cancelled meanwhile). */
static void rx_payload_done(struct kvc_engine *e)
{
	struct kvc_frame *f = e->rx_frame;

	e->rx_frame = NULL;
	e->rx = RX_HDR;
	e->rx_off = 0;
	if (f->s->state == SLOT_ACTIVE)
		kvc_ops_get_done(e, f);
	else
		kvc_frame_answered(e, f);
}

/* Nothing owed: a readable link means the server closed it (or it broke).
 * With an event fd in use, drop it now, so that the descriptor does not
 * stay readable. */
static void rx_idle(struct kvc_engine *e)
{
	if (e->epfd >= 0 && e->s.link.t->stale(&e->s.link))
		kvc_io_disconnect(e);
}

/* Message peers: each reply is one message. */
static int rx_messages(struct kvc_engine *e)
{
	struct kvc_link *l = &e->s.link;
	size_t cap = l->t->message_max_bytes;
	int rc;

	if (kvc_grow((void **)&e->rx_buf, &e->rx_buf_cap, cap, 1))
		return -ENOMEM;
	while (kvc_eng_up(e)) {
		struct iovec iov = { e->rx_buf, cap };
		ssize_t n;

		if (!e->wq_head) {
			rx_idle(e);
			return 0;
		}
		n = l->t->recv(l, &iov, 1);
		if (n == -EAGAIN)
			return 0;
		if (n < 0)
			return (int)n;
		if ((size_t)n < PROTO_HEADER_BYTES)
			return -EPROTO;
		rc = kvc_frame_reply(e->rx_buf, &e->s.reply_limits, &e->rx_h);
		if (!rc && (size_t)n != PROTO_HEADER_BYTES + e->rx_h.body_bytes)
			rc = -EPROTO;
		if (!rc)
			rc = rx_reply(e, e->rx_buf + PROTO_HEADER_BYTES);
		if (rc)
			return rc;
	}
	return 0;
}

/* Advance an iovec array past n bytes. */
static void iov_advance(struct iovec *iov, size_t *i, size_t cnt, size_t n)
{
	while (*i < cnt && n >= iov[*i].iov_len)
		n -= iov[(*i)++].iov_len;
	if (n) {
		iov[*i].iov_base = (uint8_t *)iov[*i].iov_base + n;
		iov[*i].iov_len -= n;
	}
}

/* Stream peers: one step of the reply state machine, reading what the
 * link has. Returns 1 after a step, 0 when nothing can be read now, or a
 * stream error. */
static int rx_step(struct kvc_engine *e)
{
	struct kvc_link *l = &e->s.link;
	struct iovec one;
	ssize_t n;
	int rc;

	switch (e->rx) {
	case RX_HDR:
		one = (struct iovec){ e->rx_hdr + e->rx_off, PROTO_HEADER_BYTES - e->rx_off };
		n = l->t->recv(l, &one, 1);
		if (n < 0)
			return n == -EAGAIN ? 0 : (int)n;
		e->rx_off += (size_t)n;
		if (e->rx_off < PROTO_HEADER_BYTES)
			return 1;
		rc = kvc_frame_reply(e->rx_hdr, &e->s.reply_limits, &e->rx_h);
		if (!rc && kvc_grow((void **)&e->rx_buf, &e->rx_buf_cap,
				    e->rx_h.body_bytes ? e->rx_h.body_bytes : 1, 1))
			rc = -ENOMEM;
		if (rc)
			return rc;
		e->rx_off = 0;
		e->rx = RX_BODY;
		return 1;
	case RX_BODY:
		if (e->rx_off < e->rx_h.body_bytes) {
			one = (struct iovec){ e->rx_buf + e->rx_off, e->rx_h.body_bytes - e->rx_off };
			n = l->t->recv(l, &one, 1);
			if (n < 0)
				return n == -EAGAIN ? 0 : (int)n;
			e->rx_off += (size_t)n;
			return 1;
		}
		e->rx = RX_HDR;
		e->rx_off = 0;
		rc = rx_reply(e, e->rx_buf);
		if (rc)
			return rc;
		if ((e->rx == RX_PAYLOAD && e->rx_iov_n == 0) || (e->rx == RX_DISCARD && !e->rx_left))
			rx_payload_done(e);
		return 1;
	case RX_PAYLOAD:
		n = l->t->recv(l, e->rx_iov + e->rx_iov_i, e->rx_iov_n - e->rx_iov_i);
		if (n < 0)
			return n == -EAGAIN ? 0 : (int)n;
		iov_advance(e->rx_iov, &e->rx_iov_i, e->rx_iov_n, (size_t)n);
		if (e->rx_iov_i == e->rx_iov_n)
			rx_payload_done(e);
		return 1;
	default: /* RX_DISCARD */
		if (!e->sink && !(e->sink = malloc(KVC_SINK_BYTES)))
			return -ENOMEM;
		one = (struct iovec){ e->sink, e->rx_left < KVC_SINK_BYTES ? (size_t)e->rx_left
									  : KVC_SINK_BYTES };
		n = l->t->recv(l, &one, 1);
		if (n < 0)
			return n == -EAGAIN ? 0 : (int)n;
		e->rx_left -= (uint64_t)n;
		if (e->rx_left == 0)
			rx_payload_done(e);
		return 1;
	}
}

/* Read whatever has arrived and act on it. Returns 0 or a connection
 * error (after kvc_io_fail_all). */
int kvc_io_rx(struct kvc_engine *e)
{
	int rc = 0;

	if (e->s.link.t->message_mode) {
		rc = rx_messages(e);
	} else {
		while (kvc_eng_up(e)) {
			if (e->rx == RX_HDR && e->rx_off == 0 && !e->wq_head && !e->tx) {
				rx_idle(e);
				return 0;
			}
			rc = rx_step(e);
			if (rc <= 0)
				break;
		}
	}
	if (rc < 0)
		kvc_io_fail_all(e, rc);
	return rc < 0 ? rc : 0;
}

/* Cancel or time out: the caller's memory is no longer touched. Frames of
 * s still in the send queue are dropped; one being sent continues with
 * zeros; replies still owed are read and dropped (the slot stays taken
 * until they are in). */
void kvc_io_detach(struct kvc_engine *e, struct kvc_slot *s)
{
	kvc_sendq_remove(e, s);
	if (e->tx && e->tx->s == s)
		tx_detach(e);
	if (e->rx == RX_PAYLOAD && e->rx_frame && e->rx_frame->s == s) {
		uint64_t left = 0;

		for (size_t i = e->rx_iov_i; i < e->rx_iov_n; i++)
			left += e->rx_iov[i].iov_len;
		e->rx_left = left;
		e->rx = RX_DISCARD;
	}
}

/* Wait (lock released) until the link or the eventfd is ready, at most
 * wait_ms (-1: no limit). */
void kvc_io_wait(struct kvc_engine *e, int wait_ms)
{
	struct pollfd p[1 + KVC_LINK_MAX_FDS];
	nfds_t n = 0;

	if (efd_open(e) == 0)
		p[n++] = (struct pollfd){ .fd = e->efd, .events = POLLIN };
	if (kvc_eng_up(e))
		n += (nfds_t)e->s.link.t->pollfds(&e->s.link, e->tx_blocked, p + n);
	e->waiters++;
	ep_sync(e);
	pthread_mutex_unlock(&e->lock);
	(void)poll(p, n, wait_ms);
	pthread_mutex_lock(&e->lock);
	e->waiters--;
	if (n && p[0].fd == e->efd && (p[0].revents & POLLIN) && !e->done_len)
		efd_clear(e); /* a poke: it has served its purpose */
}

/* How long to wait for: the caller's limit or the next timer. */
int kvc_io_wait_ms(const struct kvc_engine *e, uint64_t end_ms, int forever)
{
	uint64_t until = forever ? UINT64_MAX : end_ms;

	if (e->next_timer_ms < until)
		until = e->next_timer_ms;
	return kvc_ms_until(until);
}

int kvc_io_event_fd(void *be)
{
	struct kvc_engine *e = be;
	int rc = 0;

	pthread_mutex_lock(&e->lock);
	if (e->epfd < 0) {
		rc = efd_open(e);
		if (!rc) {
			struct epoll_event ev = { .events = EPOLLIN, .data.fd = e->efd };

			e->epfd = epoll_create1(EPOLL_CLOEXEC);
			e->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
			if (e->epfd < 0 || e->tfd < 0)
				rc = errno == EMFILE || errno == ENFILE ? -EMFILE : -ENOMEM;
			if (!rc && epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->efd, &ev))
				rc = -ENOMEM;
			ev.data.fd = e->tfd;
			if (!rc && epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->tfd, &ev))
				rc = -ENOMEM;
			if (rc) {
				if (e->epfd >= 0)
					close(e->epfd);
				if (e->tfd >= 0)
					close(e->tfd);
				e->epfd = e->tfd = -1;
			}
			e->tfd_armed_ms = 0;
			e->ep_n = 0;
		}
	}
	if (!rc)
		rc = e->epfd;
	kvc_io_unlock(e);
	return rc;
}
