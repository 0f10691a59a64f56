/*
 * async.c - the asynchronous core of libkvpool: kvpool_submit_*,
 * kvpool_poll, kvpool_event_fd, kvpool_cancel (kvpool.h, "Asynchronous
 * API").
 *
 * Model. A handle has a fixed table of request slots (max_inflight, plus
 * one kept for a synchronous call made while asynchronous ones run). A
 * request is cut into frames like a synchronous call (batch.c's rules:
 * entries per frame, bytes per frame, PUT payload in flight); its frames
 * go to one send queue shared by all requests, are written to the
 * non-blocking socket as far as it takes them, and then wait on the wire
 * queue for their replies, which are matched by request id. A request
 * whose frames are all answered either finishes (its completion goes to
 * the completion ring) or, when some blocks were answered BUSY, starts
 * another pass over those after a backoff wait, kept as a timer.
 *
 * No thread is started: progress() runs inside submit, poll and cancel,
 * under the handle's lock, and never blocks. kvpool_poll waits with the
 * lock released in poll(2) on the socket and the eventfd; the eventfd
 * is kept readable while completions wait (and poked to wake a waiting
 * poller). kvpool_event_fd is an epoll descriptor holding both.
 *
 * Memory. Slots keep their scratch (entry maps, per-block words, frames)
 * between requests, so a steady stream of requests of similar sizes
 * allocates nothing. The buffers of a request are the caller's: the
 * payload is sent from them and a GET's bytes are read into them.
 *
 * Lock rule: functions whose names end in _locked, and every static
 * function below that takes a struct kvpool_client, run with k->lock
 * held.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "checksum.h"
#include "client.h"
#include "conn.h"

#define KVA_SINK_BYTES (64u << 10) /* discarded GET payload is read in these */

enum slot_state { SLOT_FREE, SLOT_ACTIVE, SLOT_DONE };
enum rx_state { RX_HDR, RX_BODY, RX_PAYLOAD, RX_DISCARD };

struct kva_slot;

/* One request frame: entries s->sent[first..first+n) of the current pass. */
struct kva_frame {
	struct kva_slot *s;
	struct kva_frame *next;   /* in the send queue or the wire queue */
	uint64_t wire_id;
	size_t first, n;
	uint64_t payload_bytes;   /* PUT payload */
};

struct kva_slot {
	enum slot_state state;
	int internal;             /* a synchronous call's: not returned by poll */
	int polled;               /* its completion was handed out */
	int op;                   /* enum kvpool_op */
	uint64_t id, tag;
	size_t count;
	const struct kvpool_put_block *put;
	struct kvpool_get_block *get;
	const uint8_t (*keys)[KVPOOL_KEY_BYTES];
	int *st;                  /* per block/key: the caller's or own_st */
	uint32_t lease_ms;
	uint32_t *flags;          /* PUT: per block KVPOOL_PUT_* (the caller's), or NULL */
	struct kvpool_match_opts mopts;    /* MATCH: wait_ms, want, retain_ms */
	struct kvpool_match_result *mres;  /* MATCH: the caller's result, or NULL */
	struct kvpool_match_result macc;   /* MATCH: folded over the chunks so far */
	uint32_t want;            /* MATCH: leading keys wanted (1..count) */
	uint64_t wait_end_ms;     /* MATCH: when the wait ends (0: no wait) */

	void *mem;                /* scratch: sent map, words, own statuses */
	size_t mem_bytes;
	size_t *sent;             /* entry -> block index */
	uint64_t *words;          /* PUT: payload bytes; GET: buffer bytes */
	size_t n_sent;
	struct kva_frame *frames;
	size_t frames_cap, n_frames;
	size_t frames_left;       /* frames of this pass not answered yet */
	size_t wire;              /* frames being sent or awaiting a reply */

	size_t match_done;        /* MATCH: leading keys matched so far */
	int refused;              /* first whole-frame error other than BUSY */
	int busy;                 /* a frame of this pass was refused BUSY */
	struct kvc_backoff bo;
	uint64_t deadline_ms;
	uint64_t retry_at_ms;     /* 0: no retry pending */
	int status;
	size_t matched;
};

struct kva {
	pthread_mutex_t lock;
	uint32_t max;             /* slots for callers (one more is internal) */
	struct kva_slot *slots;
	uint32_t used;            /* caller slots not FREE */
	uint32_t active;          /* slots ACTIVE (internal included) */
	uint64_t seq;             /* last request id handed out */
	uint32_t *done;           /* completion ring of slot indices */
	uint32_t done_head, done_len;
	uint64_t next_timer_ms;   /* no deadline or retry before this */

	struct kva_frame *sq_head, *sq_tail;  /* to send */
	struct kva_frame *tx;                 /* being sent */
	int tx_answered;                      /* its reply came early */
	int tx_blocked;                       /* the socket took no more */
	uint8_t *tx_buf;
	size_t tx_buf_cap;
	struct iovec *tx_iov;
	size_t tx_iov_cap, tx_iov_i, tx_iov_n;
	uint64_t tx_zero_left;                /* payload replaced by zeros */
	struct kva_frame *wq_head, *wq_tail;  /* sent, awaiting a reply */
	uint64_t wire_put_bytes;

	enum rx_state rx;
	uint8_t rx_hdr[PROTO_HEADER_BYTES];
	size_t rx_off;
	struct proto_header rx_h;
	uint8_t *rx_body;
	size_t rx_body_cap;
	struct kva_frame *rx_frame;
	struct proto_batch rx_batch;
	struct iovec *rx_iov;
	size_t rx_iov_cap, rx_iov_i, rx_iov_n;
	uint64_t rx_left;                     /* RX_DISCARD: bytes to drop */
	uint8_t *sink;

	int efd;                  /* eventfd, -1 until needed */
	int efd_set;              /* its counter is nonzero */
	int epfd;                 /* kvpool_event_fd, -1 until asked for */
	int ep_sock;              /* socket registered in epfd, -1 none */
	int tfd;                  /* timerfd in epfd: due deadlines and retries */
	uint64_t tfd_armed_ms;    /* when it fires; 0 = disarmed */
	uint32_t ep_events;
	int waiters;              /* threads waiting in kvpool_poll */
};

static const uint8_t zeros[4096];

/* ---- small helpers --------------------------------------------------------- */

static int grow(void **buf, size_t *cap, size_t need, size_t size)
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

static int key_is_zero(const uint8_t *key)
{
	for (int i = 0; i < KVPOOL_KEY_BYTES; i++)
		if (key[i])
			return 0;
	return 1;
}

static uint32_t timeout_of(const struct kvpool_client *c)
{
	return c->timeout_ms ? c->timeout_ms : KVPOOL_DEFAULT_TIMEOUT_MS;
}

static uint8_t wire_op(int op)
{
	switch (op) {
	case KVPOOL_OP_PUT:
		return PROTO_OP_PUT;
	case KVPOOL_OP_GET:
		return PROTO_OP_GET;
	case KVPOOL_OP_EXISTS:
		return PROTO_OP_EXISTS;
	case KVPOOL_OP_MATCH:
		return PROTO_OP_MATCH;
	default:
		return PROTO_OP_DELETE;
	}
}

static void fill(int *st, size_t count, int err)
{
	for (size_t i = 0; st && i < count; i++)
		st[i] = err;
}

static int first_error(const int *st, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (st[i])
			return st[i];
	return 0;
}

/* ---- the eventfd and the epoll descriptor ---------------------------------- */

static int efd_open(struct kva *k)
{
	if (k->efd >= 0)
		return 0;
	k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (k->efd < 0)
		return errno == EMFILE || errno == ENFILE ? -EMFILE : -ENOMEM;
	k->efd_set = 0;
	return 0;
}

static void efd_raise(struct kva *k)
{
	uint64_t one = 1;

	if (k->efd < 0 || k->efd_set)
		return;
	if (write(k->efd, &one, sizeof(one)) == sizeof(one))
		k->efd_set = 1;
}

static void efd_clear(struct kva *k)
{
	uint64_t v;

	if (k->efd < 0 || !k->efd_set)
		return;
	if (read(k->efd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
		k->efd_set = 0;
}

/* Keep the socket's registration in the epoll set in step with what
 * progress needs: input always, output while a frame waits on it. */
static void ep_sync(struct kvpool_client *c)
{
	struct kva *k = c->async;
	uint32_t want = EPOLLIN | (k->tx_blocked ? EPOLLOUT : 0);
	struct epoll_event ev = { .events = want };

	if (k->epfd < 0)
		return;
	if (c->fd != k->ep_sock) {
		k->ep_sock = -1;
		if (c->fd < 0)
			return;
		ev.data.fd = c->fd;
		if (epoll_ctl(k->epfd, EPOLL_CTL_ADD, c->fd, &ev) == 0 ||
		    (errno == EEXIST && epoll_ctl(k->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)) {
			k->ep_sock = c->fd;
			k->ep_events = want;
		}
		return;
	}
	if (c->fd >= 0 && want != k->ep_events) {
		ev.data.fd = c->fd;
		if (epoll_ctl(k->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
			k->ep_events = want;
	}
}

/* With an event fd in use, the timerfd in it fires when the next deadline
 * or BUSY retry is due, so that a caller waiting on the descriptor alone
 * calls kvpool_poll in time. */
static void tfd_sync(struct kva *k)
{
	uint64_t want = k->active && k->next_timer_ms != UINT64_MAX ? k->next_timer_ms : 0;
	struct itimerspec its = { { 0, 0 }, { 0, 0 } };

	if (k->tfd < 0 || want == k->tfd_armed_ms)
		return;
	if (want) {
		/* CLOCK_MONOTONIC milliseconds, as kvc_now_ms; 0 would disarm */
		its.it_value.tv_sec = (time_t)(want / 1000);
		its.it_value.tv_nsec = (long)(want % 1000) * 1000000 + 1;
	}
	if (timerfd_settime(k->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
		k->tfd_armed_ms = want;
}

/* A timerfd that fired stays readable until read: read it once due. */
static void tfd_ack(struct kva *k, uint64_t now)
{
	uint64_t v;

	if (k->tfd < 0 || !k->tfd_armed_ms || now < k->tfd_armed_ms)
		return;
	if (read(k->tfd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
		k->tfd_armed_ms = 0;
}

/* Before the lock is released: the eventfd says whether completions wait. */
static void unlock_sync(struct kvpool_client *c)
{
	struct kva *k = c->async;

	tfd_sync(k);
	if (k->done_len)
		efd_raise(k);
	else if (!k->waiters)
		efd_clear(k);
	ep_sync(c);
	pthread_mutex_unlock(&k->lock);
}

/* ---- slots ------------------------------------------------------------------ */

static uint32_t n_slots(const struct kva *k)
{
	return k->max + 1; /* the last one is the internal slot */
}

static int slots_alloc(struct kva *k)
{
	if (k->slots)
		return 0;
	k->slots = calloc(n_slots(k), sizeof(*k->slots));
	k->done = calloc(n_slots(k), sizeof(*k->done));
	if (!k->slots || !k->done) {
		free(k->slots);
		free(k->done);
		k->slots = NULL;
		k->done = NULL;
		return -ENOMEM;
	}
	return 0;
}

static void slot_release_if_idle(struct kva *k, struct kva_slot *s)
{
	if (s->state != SLOT_DONE || !s->polled || s->wire)
		return;
	s->state = SLOT_FREE;
	if (!s->internal)
		k->used--;
}

/* Scratch for a request of `count` entries: the entry map, one word per
 * entry, and statuses when the caller gave none. */
static int slot_scratch(struct kva_slot *s, size_t count, int *statuses)
{
	size_t need;

	if (count > SIZE_MAX / 32)
		return -ENOMEM;
	need = count * (sizeof(size_t) + sizeof(uint64_t) + sizeof(int)) + 16;
	if (need > s->mem_bytes) {
		void *p = realloc(s->mem, need);

		if (!p)
			return -ENOMEM;
		s->mem = p;
		s->mem_bytes = need;
	}
	s->words = s->mem;
	s->sent = (size_t *)(s->words + count);
	s->st = statuses ? statuses : (int *)(s->sent + count);
	return 0;
}

/* The request is over for its caller (frames of a cancelled or timed-out
 * request may still be on the wire: the slot waits for them). */
static void slot_complete(struct kvpool_client *c, struct kva_slot *s, int status)
{
	struct kva *k = c->async;

	s->status = status;
	s->state = SLOT_DONE;
	s->retry_at_ms = 0;
	k->active--;
	if (!s->internal) {
		k->done[(k->done_head + k->done_len) % n_slots(k)] = (uint32_t)(s - k->slots);
		k->done_len++;
	}
}

/* Finish with a whole-request error, written into every status as the
 * synchronous twins do. */
static void slot_fail(struct kvpool_client *c, struct kva_slot *s, int err)
{
	if (s->op != KVPOOL_OP_MATCH)
		fill(s->st, s->count, err);
	slot_complete(c, s, err);
}

/* Take the frames of s out of the send queue (they were never sent). */
static void sendq_remove(struct kva *k, struct kva_slot *s)
{
	struct kva_frame **pp = &k->sq_head;

	k->sq_tail = NULL;
	while (*pp) {
		if ((*pp)->s == s) {
			*pp = (*pp)->next;
			continue;
		}
		k->sq_tail = *pp;
		pp = &(*pp)->next;
	}
}

/* ---- passes: frames of one try over the entries listed in s->sent ------------ */

static uint32_t entry_bytes(int op)
{
	return proto_request_entry_bytes(wire_op(op));
}

static struct kva_frame *frame_add(struct kva_slot *s, size_t first, size_t n, uint64_t pay)
{
	struct kva_frame *f;

	if (grow((void **)&s->frames, &s->frames_cap, s->n_frames + 1, sizeof(*s->frames)))
		return NULL;
	f = &s->frames[s->n_frames++];
	*f = (struct kva_frame){ .s = s, .first = first, .n = n, .payload_bytes = pay };
	return f;
}

/* Cut s->sent[0..n_sent) (MATCH: the next chunk of the chain) into frames
 * and queue them. Returns 0 or -ENOMEM. */
static int pass_start(struct kvpool_client *c, struct kva_slot *s)
{
	struct kva *k = c->async;
	size_t cap = s->op == KVPOOL_OP_MATCH ? kvc_match_chunk(c) :
		     (c->limits.max_frame_bytes - PROTO_HEADER_BYTES - PROTO_BATCH_PREFIX_BYTES) /
		     entry_bytes(s->op);
	uint64_t pay_cap = c->limits.max_inflight_put_bytes ? c->limits.max_inflight_put_bytes
							    : UINT64_MAX;
	size_t total = s->n_sent;

	if (cap > c->limits.max_batch_blocks)
		cap = c->limits.max_batch_blocks;
	if (cap == 0)
		cap = 1;
	s->n_frames = 0;
	s->busy = 0;
	if (s->op == KVPOOL_OP_MATCH)
		total = s->count - s->match_done;
	for (size_t first = 0; first < total;) {
		size_t n = 0;
		uint64_t pay = 0;

		while (n < cap && first + n < total) {
			uint64_t pb = s->op == KVPOOL_OP_PUT ? s->words[s->sent[first + n]] : 0;

			if (n > 0 && (pay >= pay_cap || pb > pay_cap - pay))
				break;
			pay += pb;
			n++;
		}
		if (!frame_add(s, first, n, pay))
			return -ENOMEM;
		first += n;
		if (s->op == KVPOOL_OP_MATCH)
			break; /* one chunk at a time: the next only if this one matched whole */
	}
	s->frames_left = s->n_frames;
	for (size_t i = 0; i < s->n_frames; i++) {
		struct kva_frame *f = &s->frames[i];

		f->next = NULL;
		if (k->sq_tail)
			k->sq_tail->next = f;
		else
			k->sq_head = f;
		k->sq_tail = f;
	}
	return 0;
}

/* Plan a retry of what was answered BUSY, or finish the request. */
static void retry_or_complete(struct kvpool_client *c, struct kva_slot *s, int status)
{
	struct kva *k = c->async;
	uint32_t wait_ms;

	if (s->n_sent && kvc_backoff_next(&s->bo, c, s->deadline_ms, &wait_ms)) {
		s->retry_at_ms = kvc_now_ms() + wait_ms;
		if (s->retry_at_ms < k->next_timer_ms)
			k->next_timer_ms = s->retry_at_ms;
		return;
	}
	slot_complete(c, s, status);
}

/* Is `parent` the key of one of the first n blocks listed in s->sent? */
static int parent_listed(const struct kva_slot *s, size_t n, const uint8_t *parent)
{
	if (!parent || key_is_zero(parent))
		return 0;
	for (size_t j = 0; j < n; j++)
		if (!memcmp(s->put[s->sent[j]].key, parent, KVPOOL_KEY_BYTES))
			return 1;
	return 0;
}

/* Every frame of the pass is answered: decide what comes next, with the
 * rules of the synchronous twins (blocks.c, keys.c). */
static void pass_done(struct kvpool_client *c, struct kva_slot *s)
{
	size_t n = 0;

	switch (s->op) {
	case KVPOOL_OP_PUT:
		for (size_t k = 0; k < s->count; k++)
			if (s->st[k] == -EAGAIN ||
			    (s->st[k] == -ENOLINK && n && parent_listed(s, n, s->put[k].parent)))
				s->sent[n++] = k;
		s->n_sent = n;
		retry_or_complete(c, s, first_error(s->st, s->count));
		return;
	case KVPOOL_OP_GET:
		for (size_t k = 0; k < s->count; k++)
			if (s->st[k] == -EAGAIN)
				s->sent[n++] = k;
		s->n_sent = n;
		retry_or_complete(c, s, first_error(s->st, s->count));
		return;
	case KVPOOL_OP_EXISTS:
	case KVPOOL_OP_DELETE: {
		int busy = s->busy;

		for (size_t k = 0; k < s->count; k++)
			if (s->st[k] == -EAGAIN)
				s->sent[n++] = k;
		s->n_sent = n;
		retry_or_complete(c, s, s->refused ? s->refused : busy ? -EAGAIN : 0);
		return;
	}
	default: /* MATCH: frames_left is 0 and s->status holds this chunk's outcome */
		return;
	}
}

/* ---- connection failure -------------------------------------------------------- */

/* The connection is gone or can no longer be trusted: drop every frame,
 * close it, and finish every active request with err. */
static void fail_all(struct kvpool_client *c, int err)
{
	struct kva *k = c->async;

	k->sq_head = k->sq_tail = NULL;
	k->tx = NULL;
	k->tx_blocked = 0;
	k->tx_zero_left = 0;
	k->wq_head = k->wq_tail = NULL;
	k->wire_put_bytes = 0;
	k->rx = RX_HDR;
	k->rx_off = 0;
	k->rx_frame = NULL;
	kvc_disconnect(c);
	for (uint32_t i = 0; k->slots && i < n_slots(k); i++) {
		struct kva_slot *s = &k->slots[i];

		s->wire = 0;
		if (s->state == SLOT_ACTIVE)
			slot_fail(c, s, err);
		else
			slot_release_if_idle(k, s);
	}
}

/* ---- sending ------------------------------------------------------------------ */

/* Encode frame f (header, body, payload iovecs) into the transmit state. */
static int tx_encode(struct kvpool_client *c, struct kva_frame *f)
{
	struct kva *k = c->async;
	struct kva_slot *s = f->s;
	uint32_t eb = entry_bytes(s->op);
	uint8_t v = kvc_version(c);
	size_t body_bytes = s->op == KVPOOL_OP_MATCH ? proto_match_body_bytes(v, (uint32_t)f->n) :
						       proto_batch_body_bytes((uint32_t)f->n, eb);
	size_t iovs = 1;
	uint8_t *body;
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = v,
		.opcode = wire_op(s->op),
		.body_bytes = (uint32_t)body_bytes,
		.payload_bytes = f->payload_bytes,
	};

	if (s->op == KVPOOL_OP_PUT)
		for (size_t i = 0; i < f->n; i++)
			iovs += (size_t)s->put[s->sent[f->first + i]].iovcnt;
	if (grow((void **)&k->tx_buf, &k->tx_buf_cap, PROTO_HEADER_BYTES + body_bytes, 1) ||
	    grow((void **)&k->tx_iov, &k->tx_iov_cap, iovs, sizeof(struct iovec)))
		return -ENOMEM;
	f->wire_id = kvc_next_request_id(c);
	h.request_id = f->wire_id;
	proto_header_encode(&h, k->tx_buf);
	body = k->tx_buf + PROTO_HEADER_BYTES;
	if (s->op == KVPOOL_OP_MATCH) {
		uint64_t now = kvc_now_ms();
		uint32_t left = s->wait_end_ms > now ? (uint32_t)(s->wait_end_ms - now) : 0;
		struct proto_match_opts o = kvc_match_frame_opts((uint32_t)s->match_done,
								 (uint32_t)f->n, s->want, left,
								 s->mopts.retain_ms);

		if (s->mopts.want > s->count)
			o.want = s->mopts.want; /* refused BAD_REQUEST, with the server's reason */
		proto_match_encode_prefix(body, v, (uint32_t)f->n, s->lease_ms, &o);
	} else {
		proto_batch_encode_prefix(body, (uint32_t)f->n, 0);
	}
	k->tx_iov[0] = (struct iovec){ k->tx_buf, PROTO_HEADER_BYTES + body_bytes };
	k->tx_iov_n = 1;
	for (size_t i = 0; i < f->n; i++) {
		size_t idx = s->op == KVPOOL_OP_MATCH ? s->match_done + f->first + i
						      : s->sent[f->first + i];

		if (s->op == KVPOOL_OP_PUT) {
			const struct kvpool_put_block *b = &s->put[idx];
			struct proto_put_entry e;

			memset(&e, 0, sizeof(e));
			memcpy(e.key, b->key, PROTO_KEY_BYTES);
			if (b->parent && !key_is_zero(b->parent)) {
				memcpy(e.parent, b->parent, PROTO_KEY_BYTES);
				e.flags = PROTO_PUT_HAS_PARENT;
			}
			e.length = s->words[idx];
			e.checksum = kvc_checksum_prefix(b->iov, b->iovcnt, e.length);
			e.retain_ms = b->retain_ms; /* v1: not sent */
			proto_put_entry_encode_v(body, (uint32_t)i, v, &e);
			memcpy(k->tx_iov + k->tx_iov_n, b->iov, (size_t)b->iovcnt * sizeof(*b->iov));
			k->tx_iov_n += (size_t)b->iovcnt;
		} else if (s->op == KVPOOL_OP_GET) {
			struct proto_get_entry e;

			memcpy(e.key, s->get[idx].key, PROTO_KEY_BYTES);
			e.max_length = s->words[idx];
			proto_get_entry_encode(body, (uint32_t)i, &e);
		} else if (s->op == KVPOOL_OP_MATCH) {
			proto_match_key_encode(body, v, (uint32_t)i, s->keys[idx]);
		} else {
			proto_key_entry_encode(body, (uint32_t)i, s->keys[idx]);
		}
	}
	k->tx_iov_i = 0;
	k->tx_zero_left = 0;
	k->tx_answered = 0;
	return 0;
}

/* The caller's payload buffers may no longer be read: whatever of the
 * payload is not sent yet goes as zeros (the stream stays in step; the
 * server refuses the block by its checksum). */
static void tx_detach(struct kva *k)
{
	/* tx_iov[0] is our header and body; entries from 1 on are the
	 * caller's payload, entry tx_iov_i possibly partly sent. */
	size_t from = k->tx_iov_i > 1 ? k->tx_iov_i : 1;
	uint64_t left = 0;

	for (size_t i = from; i < k->tx_iov_n; i++)
		left += k->tx_iov[i].iov_len;
	if (from < k->tx_iov_n)
		k->tx_iov_n = from;
	k->tx_zero_left += left;
}

/* Move frames from the send queue to the socket while it takes bytes.
 * Returns 0 or a connection error (after fail_all). */
static int tx_progress(struct kvpool_client *c)
{
	struct kva *k = c->async;
	uint64_t pay_cap = c->limits.max_inflight_put_bytes ? c->limits.max_inflight_put_bytes
							    : UINT64_MAX;
	ssize_t n = 0;
	int rc;

	k->tx_blocked = 0;
	while (c->fd >= 0) {
		if (!k->tx) {
			struct kva_frame *f = k->sq_head;

			if (!f)
				return 0;
			/* The server answers BUSY beyond its in-flight put bytes. */
			if (f->payload_bytes && k->wire_put_bytes &&
			    f->payload_bytes > pay_cap - (k->wire_put_bytes < pay_cap ?
							  k->wire_put_bytes : pay_cap))
				return 0;
			rc = tx_encode(c, f);
			if (rc) {
				fail_all(c, rc);
				return rc;
			}
			k->sq_head = f->next;
			if (!k->sq_head)
				k->sq_tail = NULL;
			f->next = NULL;
			k->tx = f;
			f->s->wire++;
			k->wire_put_bytes += f->payload_bytes;
		}
		if (k->tx_iov_i < k->tx_iov_n) {
			n = kvc_conn_try_sendv(c->fd, k->tx_iov + k->tx_iov_i, k->tx_iov_n - k->tx_iov_i);
			if (n >= 0) {
				size_t m = (size_t)n;

				while (k->tx_iov_i < k->tx_iov_n && m >= k->tx_iov[k->tx_iov_i].iov_len)
					m -= k->tx_iov[k->tx_iov_i++].iov_len;
				if (m) {
					k->tx_iov[k->tx_iov_i].iov_base =
						(uint8_t *)k->tx_iov[k->tx_iov_i].iov_base + m;
					k->tx_iov[k->tx_iov_i].iov_len -= m;
				}
				continue;
			}
		} else if (k->tx_zero_left) {
			struct iovec z = { (void *)zeros, k->tx_zero_left < sizeof(zeros) ?
							  (size_t)k->tx_zero_left : sizeof(zeros) };

			n = kvc_conn_try_sendv(c->fd, &z, 1);
			if (n >= 0) {
				k->tx_zero_left -= (uint64_t)n;
				continue;
			}
		} else {
			/* Whole frame sent: it waits for its reply (unless it came). */
			struct kva_frame *f = k->tx;

			k->tx = NULL;
			if (k->tx_answered) {
				k->wire_put_bytes -= f->payload_bytes;
				f->s->wire--;
				slot_release_if_idle(k, f->s);
				continue;
			}
			if (k->wq_tail)
				k->wq_tail->next = f;
			else
				k->wq_head = f;
			k->wq_tail = f;
			continue;
		}
		if (n == -EAGAIN) {
			k->tx_blocked = 1;
			return 0;
		}
		fail_all(c, (int)n);
		return (int)n;
	}
	return 0;
}

/* ---- receiving ---------------------------------------------------------------- */

/* The frame a reply with request id `id` answers. The server answers in
 * request order (PROTOCOL.md, Pipelining), so that is the oldest frame on
 * the wire queue, or the one being sent when none waits (a server may
 * refuse a frame before it has read all of it); anything else is a
 * broken stream (NULL). */
static struct kva_frame *rx_find(struct kva *k, uint64_t id, int *is_tx)
{
	*is_tx = 0;
	if (k->wq_head)
		return k->wq_head->wire_id == id ? k->wq_head : NULL;
	if (k->tx && k->tx->wire_id == id) {
		*is_tx = 1;
		return k->tx;
	}
	return NULL;
}

/* Frame f is fully answered (its payload read, if any). */
static void frame_answered(struct kvpool_client *c, struct kva_frame *f, int is_tx)
{
	struct kva *k = c->async;
	struct kva_slot *s = f->s;

	if (is_tx) {
		/* still being sent: tx_progress lets it go when the bytes are out */
		k->tx_answered = 1;
	} else {
		struct kva_frame **pp = &k->wq_head, *prev = NULL;

		while (*pp != f) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		*pp = f->next;
		if (k->wq_tail == f)
			k->wq_tail = prev;
		k->wire_put_bytes -= f->payload_bytes;
		s->wire--;
	}
	if (s->state != SLOT_ACTIVE) {
		slot_release_if_idle(k, s);
		return;
	}
	if (--s->frames_left == 0)
		pass_done(c, s);
}

/* A frame refused as a whole with err (an error reply). */
static void frame_refused(struct kva_slot *s, struct kva_frame *f, int err)
{
	if (s->op == KVPOOL_OP_MATCH) {
		s->refused = err;
		return;
	}
	for (size_t j = 0; j < f->n; j++)
		s->st[s->sent[f->first + j]] = err;
	if (s->op == KVPOOL_OP_EXISTS || s->op == KVPOOL_OP_DELETE) {
		if (err == -EAGAIN)
			s->busy = 1;
		else if (!s->refused)
			s->refused = err;
	}
}

/* MATCH: one chunk answered (or refused); go on, retry, or finish. */
static void match_step(struct kvpool_client *c, struct kva_slot *s, struct kva_frame *f,
		       int err, const struct proto_match_reply *r)
{
	s->refused = 0;
	if (err == -EAGAIN) {
		uint32_t wait_ms;

		if (kvc_backoff_next(&s->bo, c, s->deadline_ms, &wait_ms)) {
			s->retry_at_ms = kvc_now_ms() + wait_ms;
			if (s->retry_at_ms < c->async->next_timer_ms)
				c->async->next_timer_ms = s->retry_at_ms;
			return;
		}
	}
	if (!err && s->mopts.want > s->count)
		err = -EPROTO; /* a server that let want > count pass */
	if (err) {
		slot_complete(c, s, err);
		return;
	}
	if (kvc_match_fold(&s->macc, s->match_done, f->n, r) && s->match_done + f->n < s->count) {
		s->match_done += f->n;
		if (pass_start(c, s))
			slot_complete(c, s, -ENOMEM);
		return;
	}
	s->match_done = s->macc.matched;
	s->matched = s->macc.matched;
	if (s->mres)
		*s->mres = s->macc;
	slot_complete(c, s, 0);
}

/* Check a GET reply against its frame and build the scatter list of its
 * payload into the caller's buffers (rx_iov). */
static int get_plan(struct kva *k, struct kva_slot *s, struct kva_frame *f, uint64_t payload)
{
	const struct proto_batch *b = &k->rx_batch;
	struct proto_result r;
	uint64_t total = 0;
	size_t iovs = 0;

	for (size_t j = 0; j < f->n; j++) {
		size_t idx = s->sent[f->first + j];

		if (proto_result_decode(b, (uint32_t)j, &r))
			return -EPROTO;
		if (r.status == PROTO_STATUS_TOO_LARGE && r.length && r.length <= s->words[idx])
			return -EPROTO;
		if (r.status != PROTO_STATUS_OK)
			continue;
		if (r.length == 0 || r.length > s->words[idx] || r.length > payload - total)
			return -EPROTO;
		total += r.length;
		iovs += (size_t)s->get[idx].iovcnt;
	}
	if (total != payload)
		return -EPROTO;
	if (s->state != SLOT_ACTIVE)
		return 0; /* cancelled: the bytes are read and dropped */
	if (grow((void **)&k->rx_iov, &k->rx_iov_cap, iovs ? iovs : 1, sizeof(struct iovec)))
		return -ENOMEM;
	k->rx_iov_n = 0;
	for (size_t j = 0; j < f->n; j++) {
		const struct kvpool_get_block *blk = &s->get[s->sent[f->first + j]];
		uint64_t left;

		proto_result_decode(b, (uint32_t)j, &r);
		if (r.status != PROTO_STATUS_OK)
			continue;
		left = r.length;
		for (int i = 0; i < blk->iovcnt && left; i++) {
			size_t len = blk->iov[i].iov_len < left ? blk->iov[i].iov_len : (size_t)left;

			k->rx_iov[k->rx_iov_n++] = (struct iovec){ blk->iov[i].iov_base, len };
			left -= len;
		}
	}
	k->rx_iov_i = 0;
	return 0;
}

/* Every byte of a GET frame is in place: verify and set the statuses. */
static void get_verify(struct kvpool_client *c, struct kva_slot *s, struct kva_frame *f)
{
	const struct proto_batch *b = &c->async->rx_batch;
	struct proto_result r;

	for (size_t j = 0; j < f->n; j++) {
		size_t idx = s->sent[f->first + j];
		struct kvpool_get_block *blk = &s->get[idx];
		int err;

		proto_result_decode(b, (uint32_t)j, &r);
		if (r.status == PROTO_STATUS_TOO_LARGE)
			blk->length = r.length;
		if (r.status != PROTO_STATUS_OK) {
			err = proto_status_to_errno(r.status);
			s->st[idx] = err ? err : -EPROTO;
			continue;
		}
		if (kvc_checksum_prefix(blk->iov, blk->iovcnt, r.length) != r.checksum) {
			c->checksum_errors++;
			s->st[idx] = -EBADMSG;
			continue;
		}
		blk->length = r.length;
		s->st[idx] = 0;
	}
}

/* Decode an error reply body (message kept, as kvc_recv_reply does). */
static int rx_error_reply(struct kvpool_client *c, int *err)
{
	struct kva *k = c->async;
	uint16_t min_v, max_v;
	const char *msg;
	uint32_t msg_bytes;
	int e;

	if (k->rx_h.payload_bytes ||
	    proto_error_decode(k->rx_body, k->rx_h.body_bytes, &min_v, &max_v, &msg, &msg_bytes))
		return -EPROTO;
	if (msg_bytes > KVC_MESSAGE_MAX_BYTES)
		msg_bytes = KVC_MESSAGE_MAX_BYTES;
	if (msg_bytes)
		memcpy(c->server_message, msg, msg_bytes);
	c->server_message[msg_bytes] = '\0';
	if (k->rx_h.status == PROTO_STATUS_BAD_REQUEST || k->rx_h.status == PROTO_STATUS_UNSUPPORTED)
		c->reconnect_next = 1;
	e = proto_status_to_errno(k->rx_h.status);
	*err = e ? e : -EPROTO;
	return 0;
}

/* A reply's header and body are in: hand it to its frame. Returns 0, or
 * a stream error for the caller to fail everything with. */
static int rx_reply(struct kvpool_client *c)
{
	struct kva *k = c->async;
	struct kva_frame *f;
	struct kva_slot *s;
	int is_tx, err = 0, rc;

	if (k->rx_h.status != PROTO_STATUS_OK && k->rx_h.status != PROTO_STATUS_EXISTS) {
		if (rx_error_reply(c, &err))
			return -EPROTO;
		if (k->rx_h.opcode == PROTO_OP_NONE)
			return err; /* connection-level: the server closes */
	}
	f = rx_find(k, k->rx_h.request_id, &is_tx);
	if (!f)
		return -EPROTO;
	s = f->s;
	if (k->rx_h.opcode != wire_op(s->op))
		return -EPROTO;
	if (is_tx)
		tx_detach(k);
	if (err) {
		if (s->state == SLOT_ACTIVE)
			frame_refused(s, f, err);
		frame_answered(c, f, is_tx);
		if (s->state == SLOT_ACTIVE && s->op == KVPOOL_OP_MATCH && s->frames_left == 0)
			match_step(c, s, f, s->refused, NULL);
		return 0;
	}
	if (s->op == KVPOOL_OP_MATCH) {
		struct proto_match_reply mr;

		if (kvc_match_reply(k->rx_h.version, k->rx_body, k->rx_h.body_bytes, f->n, &mr))
			return -EPROTO;
		frame_answered(c, f, is_tx);
		if (s->state == SLOT_ACTIVE)
			match_step(c, s, f, 0, &mr);
		return 0;
	}
	if (proto_batch_decode_v(k->rx_body, k->rx_h.body_bytes, PROTO_RESULT_ENTRY_BYTES,
				 k->rx_h.version, &c->reply_limits, &k->rx_batch) ||
	    k->rx_batch.count != f->n)
		return -EPROTO;
	if (s->op != KVPOOL_OP_GET) {
		struct proto_result r;

		if (k->rx_h.payload_bytes)
			return -EPROTO;
		for (size_t j = 0; j < f->n; j++) {
			if (proto_result_decode(&k->rx_batch, (uint32_t)j, &r))
				return -EPROTO;
			if (s->state != SLOT_ACTIVE)
				continue;
			s->st[s->sent[f->first + j]] = proto_status_to_errno(r.status);
			if (s->flags)
				s->flags[s->sent[f->first + j]] = r.flags;
		}
		frame_answered(c, f, is_tx);
		return 0;
	}
	rc = get_plan(k, s, f, k->rx_h.payload_bytes);
	if (rc)
		return rc;
	k->rx_frame = f;
	if (s->state != SLOT_ACTIVE) {
		k->rx_left = k->rx_h.payload_bytes;
		k->rx = RX_DISCARD;
	} else {
		k->rx = RX_PAYLOAD;
	}
	return 0;
}

/* The payload of rx_frame is all read (into the caller's buffers, or
 * dropped when its request was cancelled meanwhile). */
static void rx_payload_done(struct kvpool_client *c)
{
	struct kva *k = c->async;
	struct kva_frame *f = k->rx_frame;
	int is_tx;

	k->rx_frame = NULL;
	k->rx = RX_HDR;
	k->rx_off = 0;
	if (f->s->state == SLOT_ACTIVE)
		get_verify(c, f->s, f);
	rx_find(k, f->wire_id, &is_tx);
	frame_answered(c, f, is_tx);
}

/* Read whatever has arrived and act on it. Returns 0 or a connection
 * error (after fail_all). */
static int rx_progress(struct kvpool_client *c)
{
	struct kva *k = c->async;
	ssize_t n = 0;
	int rc;

	while (c->fd >= 0) {
		struct iovec one;

		switch (k->rx) {
		case RX_HDR:
			if (!k->wq_head && !k->tx) {
				/* Nothing owed: a readable socket means the server closed
				 * it (or it broke). With an event fd in use, drop it now,
				 * so that the descriptor does not stay readable. */
				if (k->epfd >= 0 && kvc_conn_stale(c->fd))
					kvc_disconnect(c);
				return 0;
			}
			one = (struct iovec){ k->rx_hdr + k->rx_off, PROTO_HEADER_BYTES - k->rx_off };
			n = kvc_conn_try_recvv(c->fd, &one, 1);
			if (n < 0)
				break;
			k->rx_off += (size_t)n;
			if (k->rx_off < PROTO_HEADER_BYTES)
				continue;
			rc = proto_header_decode(k->rx_hdr, 1, &c->reply_limits, &k->rx_h);
			if (rc) {
				rc = rc == -EPROTONOSUPPORT ? -EOPNOTSUPP : -EPROTO;
				goto fail;
			}
			if (k->rx_h.body_bytes > KVC_REPLY_BODY_MAX_BYTES) {
				rc = -EPROTO;
				goto fail;
			}
			if (grow((void **)&k->rx_body, &k->rx_body_cap,
				 k->rx_h.body_bytes ? k->rx_h.body_bytes : 1, 1)) {
				rc = -ENOMEM;
				goto fail;
			}
			k->rx_off = 0;
			k->rx = RX_BODY;
			continue;
		case RX_BODY:
			if (k->rx_off < k->rx_h.body_bytes) {
				one = (struct iovec){ k->rx_body + k->rx_off,
						      k->rx_h.body_bytes - k->rx_off };
				n = kvc_conn_try_recvv(c->fd, &one, 1);
				if (n < 0)
					break;
				k->rx_off += (size_t)n;
				continue;
			}
			k->rx = RX_HDR;
			k->rx_off = 0;
			rc = rx_reply(c);
			if (rc)
				goto fail;
			if (k->rx == RX_PAYLOAD && k->rx_iov_n == 0)
				rx_payload_done(c);
			if (k->rx == RX_DISCARD && k->rx_left == 0)
				rx_payload_done(c);
			continue;
		case RX_PAYLOAD:
			n = kvc_conn_try_recvv(c->fd, k->rx_iov + k->rx_iov_i, k->rx_iov_n - k->rx_iov_i);
			if (n < 0)
				break;
			{
				size_t m = (size_t)n;

				while (k->rx_iov_i < k->rx_iov_n && m >= k->rx_iov[k->rx_iov_i].iov_len)
					m -= k->rx_iov[k->rx_iov_i++].iov_len;
				if (m) {
					k->rx_iov[k->rx_iov_i].iov_base =
						(uint8_t *)k->rx_iov[k->rx_iov_i].iov_base + m;
					k->rx_iov[k->rx_iov_i].iov_len -= m;
				}
			}
			if (k->rx_iov_i == k->rx_iov_n)
				rx_payload_done(c);
			continue;
		case RX_DISCARD:
			if (!k->sink && !(k->sink = malloc(KVA_SINK_BYTES))) {
				rc = -ENOMEM;
				goto fail;
			}
			one = (struct iovec){ k->sink, k->rx_left < KVA_SINK_BYTES ?
							(size_t)k->rx_left : KVA_SINK_BYTES };
			n = kvc_conn_try_recvv(c->fd, &one, 1);
			if (n < 0)
				break;
			k->rx_left -= (uint64_t)n;
			if (k->rx_left == 0)
				rx_payload_done(c);
			continue;
		}
		if (n == -EAGAIN)
			return 0;
		rc = (int)n;
		goto fail;
	}
	return 0;
fail:
	fail_all(c, rc);
	return rc;
}

/* Cancel or time out: the caller's memory is no longer touched. Frames of
 * s still in the send queue are dropped; one being sent continues with
 * zeros; replies still owed are read and dropped (the slot stays taken
 * until they are in). */
static void slot_detach(struct kva *k, struct kva_slot *s)
{
	sendq_remove(k, s);
	if (k->tx && k->tx->s == s)
		tx_detach(k);
	if (k->rx == RX_PAYLOAD && k->rx_frame && k->rx_frame->s == s) {
		uint64_t left = 0;

		for (size_t i = k->rx_iov_i; i < k->rx_iov_n; i++)
			left += k->rx_iov[i].iov_len;
		k->rx_left = left;
		k->rx = RX_DISCARD;
	}
}

/* Deadlines and BUSY retries that are due. */
static void timers(struct kvpool_client *c, uint64_t now)
{
	struct kva *k = c->async;
	uint64_t next = UINT64_MAX;

	if (now < k->next_timer_ms || !k->active)
		return;
	for (uint32_t i = 0; i < n_slots(k); i++) {
		struct kva_slot *s = &k->slots[i];

		if (s->state != SLOT_ACTIVE)
			continue;
		if (now >= s->deadline_ms) {
			if (s->wire) {
				/* The server owes it a reply past its timeout. */
				slot_detach(k, s);
				slot_fail(c, s, -ETIMEDOUT);
				fail_all(c, -ECONNRESET);
				k->next_timer_ms = 0;
				return;
			}
			slot_detach(k, s);
			slot_fail(c, s, -ETIMEDOUT);
			continue;
		}
		if (s->retry_at_ms && now >= s->retry_at_ms) {
			s->retry_at_ms = 0;
			if (pass_start(c, s)) {
				slot_fail(c, s, -ENOMEM);
				continue;
			}
		}
		if (s->deadline_ms < next)
			next = s->deadline_ms;
		if (s->retry_at_ms && s->retry_at_ms < next)
			next = s->retry_at_ms;
	}
	k->next_timer_ms = next;
}

/* Everything that can be done now without waiting. rx: also read what
 * has arrived (a submit skips that when nothing was on the wire before
 * it: no reply can be waiting, and the read would only cost a syscall). */
static void progress_rx(struct kvpool_client *c, int rx)
{
	struct kva *k = c->async;

	uint64_t now = kvc_now_ms();

	if (!k->slots)
		return;
	tfd_ack(k, now);
	timers(c, now);
	if (c->fd < 0)
		return;
	if (tx_progress(c))
		return;
	if (!rx)
		return;
	if (rx_progress(c))
		return;
	/* Replies may have freed room for PUT payload, or BUSY retries are due. */
	if (k->sq_head && !k->tx)
		tx_progress(c);
}

static void progress(struct kvpool_client *c)
{
	progress_rx(c, 1);
}

/* ---- public entry points ------------------------------------------------------- */

int kvc_async_new(struct kvpool_client *c)
{
	struct kva *k = calloc(1, sizeof(*k));

	if (!k)
		return -ENOMEM;
	if (pthread_mutex_init(&k->lock, NULL)) {
		free(k);
		return -ENOMEM;
	}
	k->max = KVPOOL_DEFAULT_MAX_INFLIGHT;
	k->efd = -1;
	k->epfd = -1;
	k->ep_sock = -1;
	k->tfd = -1;
	k->next_timer_ms = UINT64_MAX;
	c->async = k;
	return 0;
}

void kvc_async_free(struct kvpool_client *c)
{
	struct kva *k = c->async;

	if (!k)
		return;
	for (uint32_t i = 0; k->slots && i < n_slots(k); i++) {
		free(k->slots[i].mem);
		free(k->slots[i].frames);
	}
	free(k->slots);
	free(k->done);
	free(k->tx_buf);
	free(k->tx_iov);
	free(k->rx_body);
	free(k->rx_iov);
	free(k->sink);
	if (k->efd >= 0)
		close(k->efd);
	if (k->epfd >= 0)
		close(k->epfd);
	if (k->tfd >= 0)
		close(k->tfd);
	pthread_mutex_destroy(&k->lock);
	free(k);
	c->async = NULL;
}

void kvc_async_disconnected(struct kvpool_client *c)
{
	if (c->async)
		c->async->ep_sock = -1; /* closing the socket took it out of the epoll set */
}

int kvc_async_busy(const struct kvpool_client *c)
{
	const struct kva *k = c->async;

	return k && (k->active || k->tx || k->wq_head);
}

int kvpool_set_max_inflight(struct kvpool_client *c, uint32_t max)
{
	struct kva *k;
	int rc = 0;

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || max > KVPOOL_MAX_INFLIGHT_LIMIT)
		return -EINVAL;
	k = c->async;
	pthread_mutex_lock(&k->lock);
	if (k->used || k->active || k->tx || k->wq_head) {
		rc = -EBUSY;
	} else if (k->slots) {
		for (uint32_t i = 0; i < n_slots(k); i++) {
			free(k->slots[i].mem);
			free(k->slots[i].frames);
		}
		free(k->slots);
		free(k->done);
		k->slots = NULL;
		k->done = NULL;
	}
	if (!rc) {
		k->max = max ? max : KVPOOL_DEFAULT_MAX_INFLIGHT;
		k->done_head = k->done_len = 0;
	}
	pthread_mutex_unlock(&k->lock);
	return rc;
}

uint32_t kvpool_inflight(struct kvpool_client *c)
{
	uint32_t n;

	if (!c)
		return 0;
	pthread_mutex_lock(&c->async->lock);
	n = c->async->used;
	pthread_mutex_unlock(&c->async->lock);
	return n;
}

/* What a submit carries, whatever its op. */
struct submit_args {
	int op;
	const struct kvpool_put_block *put;
	struct kvpool_get_block *get;
	const void *keys;
	size_t count;
	int *statuses;
	uint32_t lease_ms;
	uint32_t *flags;                      /* PUT, may be NULL */
	const struct kvpool_match_opts *mopts;/* MATCH, may be NULL */
	struct kvpool_match_result *mres;     /* MATCH, may be NULL */
};

/* RDMA: run the request as its synchronous twin right here. */
static int run_inline(struct kvpool_client *c, struct kva_slot *s, const struct submit_args *a)
{
	struct kvpool_match_opts o = { .lease_ms = a->lease_ms };
	struct kvpool_match_result r;
	int rc;

	switch (a->op) {
	case KVPOOL_OP_PUT:
		return kvc_put_sync_ex(c, a->put, a->count, a->statuses, a->flags);
	case KVPOOL_OP_GET:
		return kvc_get_sync(c, a->get, a->count, a->statuses);
	case KVPOOL_OP_EXISTS:
		return kvc_exists_sync(c, a->keys, a->count, a->statuses);
	case KVPOOL_OP_MATCH:
		if (a->mopts)
			o = *a->mopts;
		rc = kvc_match_sync_ex(c, a->keys, a->count, &o, &r);
		if (rc == 0) {
			s->matched = r.matched;
			if (a->mres)
				*a->mres = r;
		}
		return rc;
	default:
		return kvc_delete_sync(c, a->keys, a->count, a->statuses);
	}
}

/* Fill slot s for request a and queue its first pass (or finish it at
 * once when nothing is to be sent). */
static int slot_start(struct kvpool_client *c, struct kva_slot *s, const struct submit_args *a)
{
	struct kva *k = c->async;
	int rc;

	s->op = a->op;
	s->count = a->count;
	s->put = a->put;
	s->get = a->get;
	s->keys = a->keys;
	s->lease_ms = a->lease_ms;
	s->flags = a->flags;
	s->mopts = a->mopts ? *a->mopts : (struct kvpool_match_opts){ .lease_ms = a->lease_ms };
	s->lease_ms = s->mopts.lease_ms;
	s->mres = a->mres;
	s->macc = (struct kvpool_match_result){ 0 };
	s->want = s->mopts.want && s->mopts.want <= a->count ? s->mopts.want :
		  a->count < UINT32_MAX ? (uint32_t)a->count : UINT32_MAX;
	s->wait_end_ms = 0;
	if (s->flags && a->count)
		memset(s->flags, 0, a->count * sizeof(*s->flags));
	s->match_done = 0;
	s->matched = 0;
	s->refused = 0;
	s->busy = 0;
	s->retry_at_ms = 0;
	s->wire = 0;
	s->polled = 0;
	s->n_frames = 0;
	s->deadline_ms = kvc_deadline_ms(timeout_of(c));
	if (a->op == KVPOOL_OP_MATCH && s->mopts.wait_ms && kvc_version(c) >= PROTO_VERSION_2) {
		/* a waiting MATCH may take that much longer */
		s->wait_end_ms = kvc_now_ms() + s->mopts.wait_ms;
		s->deadline_ms += s->mopts.wait_ms;
	}
	rc = slot_scratch(s, a->count, a->statuses);
	if (rc)
		return rc;
	kvc_backoff_start(&s->bo, c);
	if (c->rdma) {
		/* Before the slot counts as active: the twin checks that the
		 * connection carries nothing asynchronous. */
		rc = run_inline(c, s, a);
		s->state = SLOT_ACTIVE;
		k->active++;
		slot_complete(c, s, rc);
		return 0;
	}
	s->state = SLOT_ACTIVE;
	k->active++;
	if (s->deadline_ms < k->next_timer_ms)
		k->next_timer_ms = s->deadline_ms;
	s->n_sent = 0;
	for (size_t i = 0; i < a->count; i++) {
		if (a->op == KVPOOL_OP_PUT) {
			uint64_t bytes = kvc_iov_bytes(a->put[i].iov, a->put[i].iovcnt);

			s->words[i] = bytes;
			if (bytes == 0 || bytes > c->limits.max_block_bytes) {
				s->st[i] = -EMSGSIZE;
				continue;
			}
			s->st[i] = 0;
		} else if (a->op == KVPOOL_OP_GET) {
			s->words[i] = kvc_iov_bytes(a->get[i].iov, a->get[i].iovcnt);
		}
		s->sent[s->n_sent++] = i;
	}
	if (a->op == KVPOOL_OP_MATCH && a->count == 0 && s->mres)
		*s->mres = s->macc; /* nothing asked: nothing matched */
	if (a->count == 0 || (a->op != KVPOOL_OP_MATCH && s->n_sent == 0)) {
		slot_complete(c, s, a->op == KVPOOL_OP_PUT ? first_error(s->st, s->count) : 0);
		return 0;
	}
	rc = pass_start(c, s);
	if (rc) {
		sendq_remove(k, s);
		s->state = SLOT_FREE;
		k->active--;
		return rc;
	}
	return 0;
}

/* Common part of every submit (arguments already checked). internal: a
 * synchronous call's request (the spare slot; not returned by poll). */
static int submit(struct kvpool_client *c, const struct submit_args *a, int internal,
		  uint64_t tag, uint64_t *id, struct kva_slot **out)
{
	struct kva *k = c->async;
	struct kva_slot *s = NULL;
	uint64_t deadline_ms;
	int rc, had_wire;

	rc = slots_alloc(k);
	if (rc)
		return rc;
	if (internal) {
		s = &k->slots[k->max];
		if (s->state != SLOT_FREE)
			return -EBUSY;
	} else {
		if (k->used >= k->max)
			return -EAGAIN;
		for (uint32_t i = 0; i < k->max; i++)
			if (k->slots[i].state == SLOT_FREE) {
				s = &k->slots[i];
				break;
			}
		if (!s)
			return -EAGAIN;
	}
	had_wire = k->wq_head || k->tx;
	/* (Re)connect only while the connection carries nothing of ours. */
	if (!kvc_async_busy(c)) {
		rc = kvc_begin(c, &deadline_ms);
		if (rc)
			return rc;
	}
	/* want > count: a v2 server refuses it with its reason; a v1 server
	 * cannot, so it is refused here (as kvc_match_sync_ex does) */
	if (a->op == KVPOOL_OP_MATCH && a->mopts && a->mopts->want > a->count &&
	    kvc_version(c) < PROTO_VERSION_2 && !c->rdma)
		return -EPROTO;
	s->internal = internal;
	rc = slot_start(c, s, a);
	if (rc)
		return rc;
	if (!internal)
		k->used++;
	s->id = ++k->seq;
	s->tag = tag;
	*id = s->id;
	if (out)
		*out = s;
	progress_rx(c, had_wire);
	if (k->waiters)
		efd_raise(k); /* a poller waits: let it look at the new work */
	return 0;
}

static int submit_public(struct kvpool_client *c, const struct submit_args *a, uint64_t tag,
			 uint64_t *id)
{
	int rc;

	pthread_mutex_lock(&c->async->lock);
	rc = submit(c, a, 0, tag, id, NULL);
	unlock_sync(c);
	return rc;
}

int kvpool_submit_put(struct kvpool_client *c, const struct kvpool_put_block *blocks,
		      size_t count, int *statuses, uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_PUT, .put = blocks, .count = count,
				 .statuses = statuses };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && !blocks) || !kvc_put_blocks_valid(blocks, count))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_put_ex(struct kvpool_client *c, const struct kvpool_put_block *blocks,
			 size_t count, int *statuses, uint32_t *flags, uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_PUT, .put = blocks, .count = count,
				 .statuses = statuses, .flags = flags };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && !blocks) || !kvc_put_blocks_valid(blocks, count))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_get(struct kvpool_client *c, struct kvpool_get_block *blocks, size_t count,
		      int *statuses, uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_GET, .get = blocks, .count = count,
				 .statuses = statuses };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && !blocks) || !kvc_get_blocks_valid(blocks, count))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_exists(struct kvpool_client *c, const void *keys, size_t count, int *statuses,
			 uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_EXISTS, .keys = keys, .count = count,
				 .statuses = statuses };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && (!keys || !statuses)))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_match(struct kvpool_client *c, const void *keys, size_t count,
			uint32_t lease_ms, uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_MATCH, .keys = keys, .count = count,
				 .lease_ms = lease_ms };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && !keys))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_match_ex(struct kvpool_client *c, const void *keys, size_t count,
			   const struct kvpool_match_opts *opts, struct kvpool_match_result *out,
			   uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_MATCH, .keys = keys, .count = count,
				 .lease_ms = opts ? opts->lease_ms : 0, .mopts = opts,
				 .mres = out };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || !out || (count && !keys))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

int kvpool_submit_delete(struct kvpool_client *c, const void *keys, size_t count,
			 int *statuses, uint64_t tag, uint64_t *id)
{
	struct submit_args a = { .op = KVPOOL_OP_DELETE, .keys = keys, .count = count,
				 .statuses = statuses };

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !id || (count && !keys))
		return -EINVAL;
	return submit_public(c, &a, tag, id);
}

/* Hand out up to max completions. */
static int pop_completions(struct kva *k, struct kvpool_completion *out, int max)
{
	int n = 0;

	while (n < max && k->done_len) {
		struct kva_slot *s = &k->slots[k->done[k->done_head]];

		k->done_head = (k->done_head + 1) % n_slots(k);
		k->done_len--;
		out[n++] = (struct kvpool_completion){
			.id = s->id, .tag = s->tag, .op = s->op, .status = s->status,
			.count = s->count, .matched = s->matched,
		};
		s->polled = 1;
		slot_release_if_idle(k, s);
	}
	return n;
}

/* Wait (lock released) until the socket or the eventfd is ready, at most
 * wait_ms (-1: no limit). */
static void wait_io(struct kvpool_client *c, int wait_ms)
{
	struct kva *k = c->async;
	struct pollfd p[2];
	nfds_t n = 0;

	if (efd_open(k) == 0)
		p[n++] = (struct pollfd){ .fd = k->efd, .events = POLLIN };
	if (c->fd >= 0)
		p[n++] = (struct pollfd){ .fd = c->fd,
					  .events = POLLIN | (k->tx_blocked ? POLLOUT : 0) };
	k->waiters++;
	ep_sync(c);
	pthread_mutex_unlock(&k->lock);
	(void)poll(p, n, wait_ms);
	pthread_mutex_lock(&k->lock);
	k->waiters--;
	if (n && p[0].fd == k->efd && (p[0].revents & POLLIN) && !k->done_len)
		efd_clear(k); /* a poke: it has served its purpose */
}

/* How long to wait for: the caller's limit or the next timer. */
static int wait_for(const struct kva *k, uint64_t end_ms, int forever)
{
	uint64_t now = kvc_now_ms(), until = forever ? UINT64_MAX : end_ms;

	if (k->next_timer_ms < until)
		until = k->next_timer_ms;
	if (until == UINT64_MAX)
		return -1;
	if (until <= now)
		return 0;
	return until - now > INT_MAX ? INT_MAX : (int)(until - now);
}

int kvpool_poll(struct kvpool_client *c, struct kvpool_completion *out, int max, int timeout_ms)
{
	struct kva *k;
	uint64_t end_ms;
	int n;

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c || !out || max < 1 || timeout_ms < -1)
		return -EINVAL;
	k = c->async;
	end_ms = timeout_ms > 0 ? kvc_now_ms() + (uint64_t)timeout_ms : 0;
	pthread_mutex_lock(&k->lock);
	for (;;) {
		progress(c);
		n = k->slots ? pop_completions(k, out, max) : 0;
		if (n || timeout_ms == 0 || !k->slots)
			break;
		/* Nothing can finish: do not wait for what will never come. */
		if (!k->active && !k->done_len)
			break;
		if (timeout_ms > 0 && kvc_now_ms() >= end_ms)
			break;
		wait_io(c, wait_for(k, end_ms, timeout_ms < 0));
	}
	unlock_sync(c);
	return n;
}

int kvpool_event_fd(struct kvpool_client *c)
{
	struct kva *k;
	int rc = 0;

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c)
		return -EINVAL;
	k = c->async;
	pthread_mutex_lock(&k->lock);
	if (k->epfd < 0) {
		rc = efd_open(k);
		if (!rc) {
			struct epoll_event ev = { .events = EPOLLIN, .data.fd = k->efd };

			k->epfd = epoll_create1(EPOLL_CLOEXEC);
			k->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
			if (k->epfd < 0 || k->tfd < 0)
				rc = errno == EMFILE || errno == ENFILE ? -EMFILE : -ENOMEM;
			if (!rc && epoll_ctl(k->epfd, EPOLL_CTL_ADD, k->efd, &ev))
				rc = -ENOMEM;
			ev.data.fd = k->tfd;
			if (!rc && epoll_ctl(k->epfd, EPOLL_CTL_ADD, k->tfd, &ev))
				rc = -ENOMEM;
			if (rc) {
				if (k->epfd >= 0)
					close(k->epfd);
				if (k->tfd >= 0)
					close(k->tfd);
				k->epfd = k->tfd = -1;
			}
			k->tfd_armed_ms = 0;
			k->ep_sock = -1;
		}
	}
	if (!rc)
		rc = k->epfd;
	unlock_sync(c);
	return rc;
}

int kvpool_cancel(struct kvpool_client *c, uint64_t id)
{
	struct kva *k;
	int rc = -ENOENT;

	if (c && c->cluster)
		return -EOPNOTSUPP; /* a cluster handle: synchronous calls only */
	if (!c)
		return -EINVAL;
	k = c->async;
	pthread_mutex_lock(&k->lock);
	for (uint32_t i = 0; id && k->slots && i < k->max; i++) {
		struct kva_slot *s = &k->slots[i];

		if (s->state != SLOT_ACTIVE || s->id != id)
			continue;
		slot_detach(k, s);
		slot_complete(c, s, -ECANCELED);
		rc = 0;
		break;
	}
	unlock_sync(c);
	return rc;
}

/* ---- synchronous calls while asynchronous ones run ----------------------------- */

int kvc_async_call(struct kvpool_client *c, int op, const void *blocks_or_keys, size_t count,
		   int *statuses, uint32_t lease_ms, size_t *matched)
{
	struct kvpool_match_opts o = { .lease_ms = lease_ms };
	struct kvpool_match_result r;
	int rc;

	if (op != KVPOOL_OP_MATCH)
		return kvc_async_call_ex(c, op, blocks_or_keys, count, statuses, NULL, NULL, NULL);
	rc = kvc_async_call_ex(c, op, blocks_or_keys, count, statuses, NULL, &o, &r);
	if (rc == 0 && matched)
		*matched = r.matched;
	return rc;
}

int kvc_async_call_ex(struct kvpool_client *c, int op, const void *blocks_or_keys, size_t count,
		      int *statuses, uint32_t *flags, const struct kvpool_match_opts *mopts,
		      struct kvpool_match_result *mres)
{
	struct kva *k = c->async;
	struct submit_args a = { .op = op, .count = count, .statuses = statuses,
				 .lease_ms = mopts ? mopts->lease_ms : 0, .flags = flags,
				 .mopts = mopts, .mres = mres };
	struct kva_slot *s;
	uint64_t id;
	int rc;

	if (op == KVPOOL_OP_PUT)
		a.put = blocks_or_keys;
	else if (op == KVPOOL_OP_GET)
		a.get = (struct kvpool_get_block *)blocks_or_keys;
	else
		a.keys = blocks_or_keys;
	pthread_mutex_lock(&k->lock);
	rc = submit(c, &a, 1, 0, &id, &s);
	if (rc) {
		unlock_sync(c);
		return rc;
	}
	while (s->state == SLOT_ACTIVE) {
		progress(c);
		if (s->state != SLOT_ACTIVE)
			break;
		wait_io(c, wait_for(k, 0, 1));
	}
	rc = s->status;
	s->polled = 1;
	slot_release_if_idle(k, s);
	unlock_sync(c);
	return rc;
}
