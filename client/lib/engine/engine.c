/*
 * engine.c - the request engine's core (engine.h, engine_impl.h): slots
 * and frames, timers, progress, connecting, starting requests, and the
 * backend entry points; the link's I/O and waiting are io.c's.
 *
 * No thread is started: progress() runs inside the engine's calls, under
 * its lock, and never blocks. A thread that waits (a blocking call for
 * its own request, poll for any) releases the lock in poll(2) on the
 * link's descriptors and the eventfd; the eventfd is kept readable while
 * completions wait and is poked to wake waiters when something changed
 * for them. kvpool_event_fd is an epoll descriptor holding the eventfd,
 * the link's descriptors and a timerfd for the next deadline or retry.
 *
 * Connecting blocks; it runs with the lock released and e->connecting set,
 * so that polls and cancels of other threads go on meanwhile (they leave
 * the link alone) and submits wait for it.
 *
 * Memory. Slots and frames are kept for reuse, with their scratch, so a
 * steady stream of requests of similar sizes allocates nothing. A
 * request's buffers are the caller's: the payload is sent from them and a
 * GET's bytes are read into them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_impl.h"
#include "lib/clock.h"

int kvc_grow(void **buf, size_t *cap, size_t need, size_t size)
{
	size_t n = *cap ? *cap : 16;
	void *p;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	p = realloc(*buf, n * size);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

static int is_batch(int op)
{
	return op >= KVPOOL_OP_PUT && op <= KVPOOL_OP_DELETE;
}

int kvc_eng_up(const struct kvc_engine *e)
{
	return !e->connecting && kvc_session_connected(&e->s);
}

/* ---- slots and frames ------------------------------------------------------------- */

static struct kvc_slot *slot_get(struct kvc_engine *e)
{
	struct kvc_slot *s = e->free_slots;

	if (s) {
		e->free_slots = s->next;
	} else {
		if (!(s = calloc(1, sizeof(*s))))
			return NULL;
		s->all_next = e->all_slots;
		e->all_slots = s;
	}
	s->next = s->prev = NULL;
	return s;
}

static void slot_put(struct kvc_engine *e, struct kvc_slot *s)
{
	kvc_result_clear(&s->res);
	s->state = SLOT_FREE;
	s->next = e->free_slots;
	e->free_slots = s;
}

static void active_remove(struct kvc_engine *e, struct kvc_slot *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		e->active_head = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->next = s->prev = NULL;
}

void kvc_slot_release(struct kvc_engine *e, struct kvc_slot *s)
{
	if (s->state != SLOT_DONE || !s->polled || s->wire)
		return;
	if (!s->internal)
		e->used--;
	slot_put(e, s);
}

void kvc_slot_complete(struct kvc_engine *e, struct kvc_slot *s, int status)
{
	s->res.status = status;
	s->state = SLOT_DONE;
	s->retry_at_ms = 0;
	e->active--;
	active_remove(e, s);
	if (s->internal) {
		e->poke = 1; /* its caller may wait in kvc_io_wait */
		return;
	}
	if (e->done_tail)
		e->done_tail->next = s;
	else
		e->done_head = s;
	e->done_tail = s;
	e->done_len++;
}

void kvc_slot_fail(struct kvc_engine *e, struct kvc_slot *s, int err)
{
	if (is_batch(s->r.op) && s->r.op != KVPOOL_OP_MATCH)
		for (size_t i = 0; i < s->r.count; i++)
			s->st[i] = err;
	kvc_slot_complete(e, s, err);
}

void kvc_slot_retry(struct kvc_engine *e, struct kvc_slot *s, int status)
{
	uint32_t wait_ms;

	if (s->n_sent && kvc_backoff_next(&s->bo, s->deadline_ms, &wait_ms)) {
		e->s.busy_retries++;
		s->retry_at_ms = kvc_now_ms() + wait_ms;
		if (s->retry_at_ms < e->next_timer_ms)
			e->next_timer_ms = s->retry_at_ms;
		return;
	}
	kvc_slot_complete(e, s, status);
}

struct kvc_frame *kvc_frame_queue(struct kvc_engine *e, struct kvc_slot *s, size_t first,
				  size_t n, uint64_t payload_bytes)
{
	struct kvc_frame *f = e->free_frames;

	if (f)
		e->free_frames = f->next;
	else if (!(f = malloc(sizeof(*f))))
		return NULL;
	*f = (struct kvc_frame){ .s = s, .first = first, .n = n, .payload_bytes = payload_bytes };
	if (e->sq_tail)
		e->sq_tail->next = f;
	else
		e->sq_head = f;
	e->sq_tail = f;
	return f;
}

void kvc_frame_free(struct kvc_engine *e, struct kvc_frame *f)
{
	f->next = e->free_frames;
	e->free_frames = f;
}

/* Take the frames of s out of the send queue (they were never sent). */
void kvc_sendq_remove(struct kvc_engine *e, struct kvc_slot *s)
{
	struct kvc_frame **pp = &e->sq_head;

	e->sq_tail = NULL;
	while (*pp) {
		struct kvc_frame *f = *pp;

		if (f->s == s) {
			*pp = f->next;
			kvc_frame_free(e, f);
			continue;
		}
		e->sq_tail = f;
		pp = &f->next;
	}
}

/* A frame left the wire: account for it and free it. */
void kvc_frame_off_wire(struct kvc_engine *e, struct kvc_frame *f)
{
	e->wire_put_bytes -= f->payload_bytes;
	e->wire_frames--;
	if (f->stage_bytes)
		e->stage_busy = 0;
	f->s->wire--;
	kvc_frame_free(e, f);
}

void kvc_frame_answered(struct kvc_engine *e, struct kvc_frame *f)
{
	struct kvc_slot *s = f->s;

	if (f == e->tx) {
		e->tx_answered = 1; /* still being sent: dropped when its bytes are out */
	} else {
		struct kvc_frame **pp = &e->wq_head, *prev = NULL;

		while (*pp != f) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		*pp = f->next;
		if (e->wq_tail == f)
			e->wq_tail = prev;
		kvc_frame_off_wire(e, f);
	}
	if (s->state != SLOT_ACTIVE) {
		kvc_slot_release(e, s);
		return;
	}
	if (--s->frames_left == 0)
		kvc_ops_pass_done(e, s);
}

/* Deadlines and BUSY retries that are due. */
static void timers(struct kvc_engine *e, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	struct kvc_slot *s, *nx;

	if (now < e->next_timer_ms || !e->active)
		return;
	for (s = e->active_head; s; s = nx) {
		nx = s->next;
		if (now >= s->deadline_ms) {
			kvc_io_detach(e, s);
			kvc_slot_fail(e, s, -ETIMEDOUT);
			if (s->wire) {
				/* The server owes it a reply past its timeout. */
				kvc_io_fail_all(e, -ECONNRESET);
				e->next_timer_ms = 0;
				return;
			}
			continue;
		}
		if (s->retry_at_ms && now >= s->retry_at_ms) {
			s->retry_at_ms = 0;
			if (kvc_ops_plan(e, s)) {
				kvc_sendq_remove(e, s);
				kvc_slot_fail(e, s, -ENOMEM);
				continue;
			}
		}
		if (s->deadline_ms < next)
			next = s->deadline_ms;
		if (s->retry_at_ms && s->retry_at_ms < next)
			next = s->retry_at_ms;
	}
	e->next_timer_ms = next;
}

static int connect_locked(struct kvc_engine *e, uint64_t deadline_ms);

/* Everything that can be done now without waiting. rx: also read what
 * has arrived (a submit skips that when nothing was on the wire before
 * it: no reply can be waiting, and the read would only cost a syscall). */
static void progress_rx(struct kvc_engine *e, int rx)
{
	uint64_t now = kvc_now_ms();

	if (e->connecting)
		return;
	kvc_io_tfd_ack(e, now);
	timers(e, now);
	/* Retries due on a connection the server closed while they waited. */
	if (e->sq_head && !kvc_session_connected(&e->s)) {
		int rc = connect_locked(e, kvc_deadline_ms(kvc_session_timeout(&e->s)));

		if (rc)
			kvc_io_fail_all(e, rc);
	}
	if (!kvc_eng_up(e) || kvc_io_tx(e) || !rx || kvc_io_rx(e))
		return;
	/* Replies may have freed room for PUT payload, or retries are due. */
	if (e->sq_head && !e->tx)
		kvc_io_tx(e);
}

static void progress(struct kvc_engine *e)
{
	progress_rx(e, 1);
}

/* ---- connecting and starting requests -------------------------------------------- */

/* Connect with the lock released (e->connecting keeps the link the
 * connecting thread's); a thread that finds another connecting waits for
 * it. Drops an idle connection that went stale first. */
static int connect_locked(struct kvc_engine *e, uint64_t deadline_ms)
{
	int rc;

	while (e->connecting)
		pthread_cond_wait(&e->conn_cond, &e->lock);
	if (!e->tx && !e->wq_head)
		kvc_session_check(&e->s);
	if (kvc_session_connected(&e->s))
		return 0;
	kvc_io_disconnect(e);
	e->connecting = 1;
	pthread_mutex_unlock(&e->lock);
	rc = kvc_session_connect(&e->s, deadline_ms);
	pthread_mutex_lock(&e->lock);
	e->connecting = 0;
	pthread_cond_broadcast(&e->conn_cond);
	e->poke = 1;
	return rc;
}

/* The latest end of a waiting MATCH whose frames are ahead on the
 * connection (being sent, awaiting their reply, or queued), cancelled
 * ones included: the server answers nothing sent after them before it
 * answers them. 0 when there is none. */
static uint64_t waits_ahead_end(const struct kvc_engine *e)
{
	const struct kvc_frame *lists[3] = { e->tx, e->wq_head, e->sq_head };
	uint64_t end = 0;

	for (int i = 0; i < 3; i++)
		for (const struct kvc_frame *f = lists[i]; f; f = i ? f->next : NULL)
			if (f->s->wait_end_ms > end)
				end = f->s->wait_end_ms;
	return end;
}

/* A request queued behind waiting MATCHes cannot be answered before they
 * are: its deadline (its own timeout, counted from now) starts when the
 * last of their waits ends, as PROTOCOL.md 14.3 asks of a pipelining
 * client. Without it a call behind a wait longer than the timeout would
 * time out, close the connection and so end the wait it queued behind. */
static uint64_t behind_waits(const struct kvc_engine *e, uint64_t deadline_ms)
{
	uint64_t now = kvc_now_ms(), end = waits_ahead_end(e);

	if (end > now && deadline_ms > now && deadline_ms < end + (deadline_ms - now))
		deadline_ms = end + (deadline_ms - now);
	return deadline_ms;
}

/* Start request r in slot s: connect first when nothing is on the wire
 * (a connection the server closed while idle is replaced before anything
 * is sent), then its first pass. */
static int start_locked(struct kvc_engine *e, struct kvc_slot *s, const struct kvc_req *r,
			int internal, int flags)
{
	int had_wire = e->wq_head || e->tx, rc;

	if (!internal && e->used >= e->max)
		return -EAGAIN;
	if (!had_wire) {
		if ((flags & KVC_SUBMIT_NOCONNECT) && !kvc_eng_up(e))
			return -ENOTCONN;
		rc = connect_locked(e, kvc_deadline_ms(kvc_session_timeout(&e->s)));
		if (rc)
			return rc;
		if (!internal && e->used >= e->max)
			return -EAGAIN; /* others took the room while we kvc_eng_up */
	}
	*s = (struct kvc_slot){ .all_next = s->all_next, .mem = s->mem, .mem_bytes = s->mem_bytes,
				.r = *r, .internal = internal, .st = r->statuses };
	s->deadline_ms = r->deadline_ms ? r->deadline_ms
					: kvc_deadline_ms(kvc_session_timeout(&e->s));
	s->deadline_ms = behind_waits(e, s->deadline_ms);
	kvc_backoff_start(&s->bo, e->s.busy_tries, (uintptr_t)s);
	s->state = SLOT_ACTIVE;
	s->next = e->active_head;
	if (s->next)
		s->next->prev = s;
	e->active_head = s;
	e->active++;
	if (s->deadline_ms < e->next_timer_ms)
		e->next_timer_ms = s->deadline_ms;
	rc = kvc_ops_begin(e, s);
	if (rc < 0) {
		kvc_sendq_remove(e, s);
		active_remove(e, s);
		e->active--;
		return rc;
	}
	if (rc == 1)
		kvc_slot_complete(e, s, s->res.status);
	if (!internal)
		e->used++;
	s->id = ++e->seq;
	progress_rx(e, had_wire);
	return 0;
}

/* ---- the backend -------------------------------------------------------------------- */

int kvc_engine_open(const char *url, const char *ns, const char *token, uint32_t timeout_ms,
		    struct kvc_tls_ctx *tls, struct kvc_engine **out)
{
	struct kvc_engine *e = calloc(1, sizeof(*e));
	int rc;

	if (!e)
		return -ENOMEM;
	rc = kvc_session_init(&e->s, url, ns, token, timeout_ms, tls);
	if (rc) {
		kvc_session_free(&e->s);
		free(e);
		return rc;
	}
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->conn_cond, NULL);
	e->max = KVPOOL_DEFAULT_MAX_INFLIGHT;
	e->efd = e->epfd = e->tfd = -1;
	e->next_timer_ms = UINT64_MAX;
	*out = e;
	return 0;
}

int kvc_engine_connect(struct kvc_engine *e)
{
	int rc;

	pthread_mutex_lock(&e->lock);
	rc = connect_locked(e, kvc_deadline_ms(kvc_session_timeout(&e->s)));
	kvc_io_unlock(e);
	return rc;
}

static void slots_free(struct kvc_slot *s)
{
	while (s) {
		struct kvc_slot *nx = s->all_next;

		kvc_result_clear(&s->res);
		free(s->mem);
		free(s);
		s = nx;
	}
}

static void frames_free(struct kvc_frame *f)
{
	while (f) {
		struct kvc_frame *nx = f->next;

		free(f);
		f = nx;
	}
}

void kvc_engine_close(struct kvc_engine *e)
{
	if (!e)
		return;
	frames_free(e->sq_head);
	frames_free(e->wq_head);
	free(e->tx);
	frames_free(e->free_frames);
	slots_free(e->all_slots);
	kvc_session_free(&e->s);
	free(e->tx_buf);
	free(e->tx_iov);
	free(e->rx_buf);
	free(e->rx_iov);
	free(e->sink);
	if (e->efd >= 0)
		close(e->efd);
	if (e->epfd >= 0)
		close(e->epfd);
	if (e->tfd >= 0)
		close(e->tfd);
	pthread_cond_destroy(&e->conn_cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

void kvc_result_clear(struct kvc_result *res)
{
	free(res->json);
	free(res->msg);
	res->json = NULL;
	res->msg = NULL;
}

static int engine_call(void *be, const struct kvc_req *r, struct kvc_result *res)
{
	struct kvc_engine *e = be;
	struct kvc_slot *s;
	int rc;

	kvc_frame_set_last_message(NULL);
	pthread_mutex_lock(&e->lock);
	s = slot_get(e);
	rc = s ? start_locked(e, s, r, 1, 0) : -ENOMEM;
	if (rc) {
		if (s)
			slot_put(e, s);
		kvc_io_unlock(e);
		/* Not started: the statuses say why, as for a request that failed. */
		if (is_batch(r->op) && r->op != KVPOOL_OP_MATCH)
			for (size_t i = 0; r->statuses && i < r->count; i++)
				r->statuses[i] = rc;
		return res->status = rc;
	}
	while (s->state == SLOT_ACTIVE) {
		progress(e);
		if (s->state != SLOT_ACTIVE)
			break;
		kvc_io_wait(e, kvc_io_wait_ms(e, 0, 1));
	}
	*res = s->res;
	s->res.json = s->res.msg = NULL;
	s->polled = 1;
	kvc_slot_release(e, s);
	kvc_io_unlock(e);
	if (res->msg)
		kvc_frame_set_last_message(res->msg);
	return res->status;
}

int kvc_engine_submit(struct kvc_engine *e, const struct kvc_req *r, int flags, uint64_t *id)
{
	struct kvc_slot *s;
	int rc;

	pthread_mutex_lock(&e->lock);
	s = slot_get(e);
	rc = s ? start_locked(e, s, r, 0, flags) : -ENOMEM;
	if (rc && s)
		slot_put(e, s);
	if (!rc) {
		*id = s->id;
		e->poke = 1; /* a poller waits: let it look at the new work */
	}
	kvc_io_unlock(e);
	return rc;
}

static int engine_submit(void *be, const struct kvc_req *r, uint64_t *id)
{
	return kvc_engine_submit(be, r, 0, id);
}

/* Hand out up to max completions (full results into done[], or just the
 * completion into out[] with the message set for this thread). */
static int pop(struct kvc_engine *e, struct kvpool_completion *out, struct kvc_done *done, int max)
{
	int n = 0;

	while (n < max && e->done_head) {
		struct kvc_slot *s = e->done_head;
		struct kvpool_completion c = {
			.id = s->id, .tag = s->r.tag, .op = s->r.op, .status = s->res.status,
			.count = s->r.count, .matched = s->res.match.matched,
		};

		e->done_head = s->next;
		if (!e->done_head)
			e->done_tail = NULL;
		e->done_len--;
		s->next = NULL;
		if (done) {
			done[n] = (struct kvc_done){ .c = c, .res = s->res };
			s->res.json = s->res.msg = NULL;
		} else {
			out[n] = c;
			kvc_frame_first_message(s->res.msg);
		}
		n++;
		s->polled = 1;
		kvc_slot_release(e, s);
	}
	return n;
}

static int engine_poll(void *be, struct kvpool_completion *out, int max, int timeout_ms)
{
	struct kvc_engine *e = be;
	uint64_t end_ms = timeout_ms > 0 ? kvc_now_ms() + (uint64_t)timeout_ms : 0;
	int n;

	pthread_mutex_lock(&e->lock);
	for (;;) {
		progress(e);
		n = pop(e, out, NULL, max);
		if (n || timeout_ms == 0)
			break;
		/* Nothing can finish: do not wait for what will never come. */
		if (!e->active && !e->done_len && !e->connecting)
			break;
		if (timeout_ms > 0 && kvc_now_ms() >= end_ms)
			break;
		kvc_io_wait(e, kvc_io_wait_ms(e, end_ms, timeout_ms < 0));
	}
	kvc_io_unlock(e);
	return n;
}

int kvc_engine_poll_ex(struct kvc_engine *e, struct kvc_done *out, int max)
{
	int n;

	pthread_mutex_lock(&e->lock);
	progress(e);
	n = pop(e, NULL, out, max);
	kvc_io_unlock(e);
	return n;
}

/* Does a frame of s describe caller memory to the server right now? */
static int described(const struct kvc_engine *e, const struct kvc_slot *s)
{
	for (const struct kvc_frame *f = e->wq_head; f; f = f->next)
		if (f->s == s && f->direct)
			return 1;
	return 0;
}

/* A waiting MATCH that was cancelled: the protocol cannot tell the
 * server to stop waiting, and until it answers, nothing sent after it on
 * the connection is answered. When nothing else of the handle is on the
 * wire or active, close the connection (the server then drops the wait;
 * the next call reconnects); otherwise its reply is read and dropped when
 * it comes, and the requests behind it keep their deadlines, which
 * already cover its wait. */
static void cancel_wait(struct kvc_engine *e, struct kvc_slot *s)
{
	if (!s->wire || s->wait_end_ms <= kvc_now_ms() || e->active || e->sq_head ||
	    (e->tx && e->tx->s != s))
		return;
	for (const struct kvc_frame *f = e->wq_head; f; f = f->next)
		if (f->s != s)
			return;
	kvc_io_fail_all(e, -ECONNRESET); /* fails no request: none is active */
}

static int engine_cancel(void *be, uint64_t id)
{
	struct kvc_engine *e = be;
	int rc = -ENOENT;

	pthread_mutex_lock(&e->lock);
	for (struct kvc_slot *s = e->active_head; id && s; s = s->next) {
		if (s->id != id || s->internal)
			continue;
		if (described(e, s)) {
			/* RDMA: the server may still READ or WRITE its buffers. */
			rc = -EINPROGRESS;
			break;
		}
		kvc_io_detach(e, s);
		kvc_slot_complete(e, s, -ECANCELED);
		cancel_wait(e, s);
		rc = 0;
		break;
	}
	kvc_io_unlock(e);
	return rc;
}

static uint32_t engine_inflight(void *be)
{
	struct kvc_engine *e = be;
	uint32_t n;

	pthread_mutex_lock(&e->lock);
	n = e->used;
	pthread_mutex_unlock(&e->lock);
	return n;
}

static int engine_set_max_inflight(void *be, uint32_t max)
{
	struct kvc_engine *e = be;
	int rc = 0;

	pthread_mutex_lock(&e->lock);
	if (e->used || e->active || e->tx || e->wq_head)
		rc = -EBUSY;
	else
		e->max = max ? max : KVPOOL_DEFAULT_MAX_INFLIGHT;
	pthread_mutex_unlock(&e->lock);
	return rc;
}

static void engine_set_timeout(void *be, uint32_t timeout_ms)
{
	struct kvc_engine *e = be;

	pthread_mutex_lock(&e->lock);
	e->s.timeout_ms = timeout_ms;
	pthread_mutex_unlock(&e->lock);
}

static void engine_set_busy_tries(void *be, uint32_t tries)
{
	struct kvc_engine *e = be;

	pthread_mutex_lock(&e->lock);
	e->s.busy_tries = tries;
	pthread_mutex_unlock(&e->lock);
}

static int engine_get_limits(void *be, struct kvpool_limits *out)
{
	struct kvc_engine *e = be;
	int rc = 0;

	pthread_mutex_lock(&e->lock);
	if (!e->tx && !e->wq_head)
		rc = connect_locked(e, kvc_deadline_ms(kvc_session_timeout(&e->s)));
	if (!rc)
		*out = e->s.limits;
	kvc_io_unlock(e);
	return rc;
}

static void engine_get_counters(void *be, struct kvpool_counters *out)
{
	struct kvc_engine *e = be;

	pthread_mutex_lock(&e->lock);
	*out = (struct kvpool_counters){
		.connects = e->s.connects,
		.reconnects = e->s.connects ? e->s.connects - 1 : 0,
		.busy_retries = e->s.busy_retries,
		.checksum_errors = e->s.checksum_errors,
	};
	pthread_mutex_unlock(&e->lock);
}

static int engine_reg(void *be, const void *buf, size_t len)
{
	struct kvc_engine *e = be;
	size_t at;
	int rc;

	pthread_mutex_lock(&e->lock);
	while (e->connecting)
		pthread_cond_wait(&e->conn_cond, &e->lock);
	rc = kvc_regions_add(&e->s.regions, buf, len, &at);
	if (!rc && kvc_session_connected(&e->s) && e->s.link.t->reg) {
		rc = e->s.link.t->reg(&e->s.link, &e->s.regions.r[at]);
		if (rc)
			kvc_regions_remove(&e->s.regions, at);
	}
	pthread_mutex_unlock(&e->lock);
	return rc;
}

static int engine_unreg(void *be, const void *buf)
{
	struct kvc_engine *e = be;
	long i;

	pthread_mutex_lock(&e->lock);
	while (e->connecting)
		pthread_cond_wait(&e->conn_cond, &e->lock);
	i = kvc_regions_index(&e->s.regions, buf);
	if (i >= 0) {
		if (e->s.regions.r[i].mr && kvc_session_connected(&e->s))
			e->s.link.t->dereg(&e->s.link, &e->s.regions.r[i]);
		kvc_regions_remove(&e->s.regions, (size_t)i);
	}
	pthread_mutex_unlock(&e->lock);
	return i >= 0 ? 0 : (int)i;
}

static void engine_close(void *be)
{
	kvc_engine_close(be);
}

const struct kvc_backend kvc_engine_backend = {
	.call = engine_call,
	.submit = engine_submit,
	.poll = engine_poll,
	.cancel = engine_cancel,
	.event_fd = kvc_io_event_fd,
	.inflight = engine_inflight,
	.set_max_inflight = engine_set_max_inflight,
	.set_timeout = engine_set_timeout,
	.set_busy_tries = engine_set_busy_tries,
	.get_limits = engine_get_limits,
	.get_counters = engine_get_counters,
	.reg = engine_reg,
	.unreg = engine_unreg,
	.close = engine_close,
};

/* ---- test hooks ------------------------------------------------------------------------ */

void kvc_engine_info(struct kvc_engine *e, struct kvc_engine_info *out)
{
	pthread_mutex_lock(&e->lock);
	*out = (struct kvc_engine_info){
		.transport = kvc_eng_up(e) ? e->s.link.t->name : NULL,
		.fd = kvc_eng_up(e) ? e->s.link.fd : -1,
		.rdma_connects = e->s.rdma_connects,
		.max_wire_frames = e->max_wire_frames,
		.n_regions = e->s.regions.n,
		.limits = e->s.limits,
		.checksum_errors = e->s.checksum_errors,
		.server_message = e->s.server_message,
	};
	if (kvc_eng_up(e) && e->s.link.t->stage_info)
		e->s.link.t->stage_info(&e->s.link, &out->stage, &out->stage_bytes);
	pthread_mutex_unlock(&e->lock);
}

void kvc_engine_disconnect(struct kvc_engine *e)
{
	pthread_mutex_lock(&e->lock);
	if (!e->connecting) {
		if (e->tx || e->wq_head)
			kvc_io_fail_all(e, -ECONNRESET);
		else
			kvc_io_disconnect(e);
	}
	kvc_io_unlock(e);
}

const struct kvc_region *kvc_engine_region(struct kvc_engine *e, const void *buf, size_t len)
{
	const struct kvc_region *g;

	pthread_mutex_lock(&e->lock);
	g = kvc_regions_find(&e->s.regions, buf, len);
	pthread_mutex_unlock(&e->lock);
	return g;
}
