/*
 * engine_impl.h - the request engine's state, shared by engine.c (the
 * machinery: slots, queues, the link's I/O, timers, waiting) and ops.c
 * (the rules of each opcode). Nothing outside engine/ includes it.
 *
 * Model. A request is a slot. Its entries are cut into frames within the
 * server's limits (entries and bytes per frame, PUT payload in flight;
 * message peers also entries per message and staging bytes); its frames
 * go to one send queue shared by all requests, are written to the link as
 * far as it takes them, then wait on the wire queue for their replies,
 * matched by request id (the server answers in request order). When every
 * frame of a pass is answered the request finishes, or, when some of it
 * was answered BUSY, starts another pass over that after a backoff wait
 * kept as a timer. A MATCH sends one chunk of its chain at a time.
 *
 * Lock rule: every function declared here runs with e->lock held, and
 * never while e->connecting (the link is then the connecting thread's).
 */
#ifndef KVC_ENGINE_IMPL_H
#define KVC_ENGINE_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

#include "engine.h"
#include "lib/backoff.h"
#include "lib/net/session.h"

enum kvc_slot_state { SLOT_FREE, SLOT_ACTIVE, SLOT_DONE };
enum kvc_rx_state { RX_HDR, RX_BODY, RX_PAYLOAD, RX_DISCARD };

struct kvc_slot;

/* One request frame: entries s->sent[first..first+n) of the current pass
 * (MATCH: keys match_done + first ..; whole-pool requests: one frame). */
struct kvc_frame {
	struct kvc_slot *s;
	struct kvc_frame *next;     /* in the send queue or the wire queue */
	uint64_t wire_id;
	size_t first, n;
	uint64_t payload_bytes;     /* PUT payload */
	uint64_t stage_bytes;       /* message peers: staging it uses (0: none) */
	int direct;                 /* message peers: describes caller memory */
	uint64_t sent_us;           /* when it was encoded (PING's round trip) */
};

struct kvc_slot {
	struct kvc_slot *next, *prev; /* active list; free list and done queue use next */
	struct kvc_slot *all_next;  /* every slot the engine made (freed at close) */
	enum kvc_slot_state state;
	int internal;               /* a blocking call's: never handed to poll */
	int polled;                 /* handed out (or its call returned) */
	uint64_t id;
	struct kvc_req r;
	int *st;                    /* per entry: r.statuses or own */

	void *mem;                  /* scratch kept for reuse: words, sent, own statuses */
	size_t mem_bytes;
	uint64_t *words;            /* PUT: payload bytes; GET: buffer bytes */
	size_t *sent;               /* entry -> block index, this pass */
	size_t n_sent;
	size_t frames_left;         /* frames of this pass not answered yet */
	size_t wire;                /* frames being sent or awaiting a reply */

	size_t match_done;          /* MATCH: keys of the chunks answered whole */
	size_t match_n;             /* MATCH: keys of the chunk in flight */
	struct proto_match_reply mrep; /* MATCH: that chunk's answer */
	struct kvpool_match_result macc; /* MATCH: folded over the chunks so far */
	uint32_t want;              /* MATCH: leading keys wanted (1..count) */
	uint64_t wait_end_ms;       /* MATCH: when its wait ends (0: none) */
	int refused;                /* first whole-frame error other than BUSY */
	int busy;                   /* a frame of this pass was refused BUSY */
	struct kvc_backoff bo;
	uint64_t deadline_ms;
	uint64_t retry_at_ms;       /* 0: no retry pending */
	struct kvc_result res;
};

struct kvc_engine {
	pthread_mutex_t lock;
	pthread_cond_t conn_cond;   /* connecting ended */
	int connecting;             /* a thread connects with the lock released */
	struct kvc_session s;

	uint32_t max;               /* public requests at most */
	uint32_t used;              /* public slots not FREE */
	uint32_t active;            /* slots ACTIVE */
	uint64_t seq;               /* last request id handed out */
	struct kvc_slot *active_head, *free_slots, *all_slots;
	struct kvc_slot *done_head, *done_tail; /* finished public requests, oldest first */
	struct kvc_frame *free_frames;        /* frames kept for reuse */
	uint32_t done_len;
	uint64_t next_timer_ms;     /* no deadline or retry before this */
	int poke;                   /* an internal request finished: wake waiters */

	struct kvc_frame *sq_head, *sq_tail;  /* to send */
	struct kvc_frame *tx;                 /* being sent (stream peers) */
	int tx_answered;                      /* its reply came early */
	int tx_blocked;                       /* the link took no more */
	uint8_t *tx_buf;
	size_t tx_buf_cap;
	struct iovec *tx_iov;
	size_t tx_iov_cap, tx_iov_i, tx_iov_n;
	uint64_t tx_zero_left;                /* payload replaced by zeros */
	struct kvc_frame *wq_head, *wq_tail;  /* sent, awaiting a reply */
	uint64_t wire_put_bytes;
	size_t wire_frames, max_wire_frames;
	int stage_busy;                       /* a staged frame awaits its reply */

	enum kvc_rx_state rx;
	uint8_t rx_hdr[PROTO_HEADER_BYTES];
	size_t rx_off;
	struct proto_header rx_h;
	uint8_t *rx_buf;                      /* stream: a body; message: a whole reply */
	size_t rx_buf_cap;
	struct kvc_frame *rx_frame;           /* the GET whose payload is read */
	struct proto_batch rx_batch;
	struct iovec *rx_iov;
	size_t rx_iov_cap, rx_iov_i, rx_iov_n;
	uint64_t rx_left;                     /* RX_DISCARD: bytes to drop */
	uint8_t *sink;

	int efd, efd_set;           /* eventfd: completions wait, or a poke */
	int epfd;                   /* kvc_engine_event_fd, -1 until asked for */
	int tfd;                    /* timerfd in epfd: due deadlines and retries */
	uint64_t tfd_armed_ms;
	int ep_fd[KVC_LINK_MAX_FDS];/* link descriptors in epfd */
	uint32_t ep_ev[KVC_LINK_MAX_FDS];
	int ep_n;
	int waiters;                /* threads waiting with the lock released */
};

/* ---- engine.c, for ops.c and io.c ---- */

/* Connected, and not being connected by another thread? */
int kvc_eng_up(const struct kvc_engine *e);
/* Free a finished slot once handed out and its frames are off the wire. */
void kvc_slot_release(struct kvc_engine *e, struct kvc_slot *s);
/* Keep frame f for reuse. */
void kvc_frame_free(struct kvc_engine *e, struct kvc_frame *f);
/* A frame left the wire: account for it and free it. */
void kvc_frame_off_wire(struct kvc_engine *e, struct kvc_frame *f);
/* Take the frames of s out of the send queue (never sent). */
void kvc_sendq_remove(struct kvc_engine *e, struct kvc_slot *s);

int kvc_grow(void **buf, size_t *cap, size_t need, size_t size);
/* A frame of s (first, n, payload), at the tail of the send queue. NULL
 * when out of memory. */
struct kvc_frame *kvc_frame_queue(struct kvc_engine *e, struct kvc_slot *s, size_t first,
				  size_t n, uint64_t payload_bytes);
/* The request is over for its caller (frames may still be on the wire). */
void kvc_slot_complete(struct kvc_engine *e, struct kvc_slot *s, int status);
/* Finish with err written into every status (not MATCH's, nor admin's). */
void kvc_slot_fail(struct kvc_engine *e, struct kvc_slot *s, int err);
/* Another pass over s->sent[0..n_sent) after a backoff wait, when a try
 * is left; else complete with status. */
void kvc_slot_retry(struct kvc_engine *e, struct kvc_slot *s, int status);
/* Frame f is answered (its payload read, if any); it may still be the
 * frame being sent (its reply came early), which the sender then drops. */
void kvc_frame_answered(struct kvc_engine *e, struct kvc_frame *f);

/* ---- io.c, for engine.c ---- */

/* Release the lock with the eventfd, the epoll set and the timer in step. */
void kvc_io_unlock(struct kvc_engine *e);
/* Close the connection (the epoll set forgets its descriptors). */
void kvc_io_disconnect(struct kvc_engine *e);
/* The connection can no longer be trusted: drop every frame, close it,
 * and finish every active request with err. */
void kvc_io_fail_all(struct kvc_engine *e, int err);
/* Send / receive what the link takes / has now. 0 or a connection error
 * (after kvc_io_fail_all). */
int kvc_io_tx(struct kvc_engine *e);
int kvc_io_rx(struct kvc_engine *e);
/* Cancel or time out s: its memory is no longer touched (frames not sent
 * are dropped, one being sent goes on with zeros, replies owed are read
 * and dropped). */
void kvc_io_detach(struct kvc_engine *e, struct kvc_slot *s);
/* Wait (lock released) until the link or the eventfd is ready, at most
 * wait_ms (-1: no limit); the wait for a caller's limit or the next timer. */
void kvc_io_wait(struct kvc_engine *e, int wait_ms);
int kvc_io_wait_ms(const struct kvc_engine *e, uint64_t end_ms, int forever);
/* Read the timerfd once it fired; raise the eventfd. */
void kvc_io_tfd_ack(struct kvc_engine *e, uint64_t now);
void kvc_io_efd_raise(struct kvc_engine *e);
/* The backend's event_fd. */
int kvc_io_event_fd(void *be);

/* ---- ops.c, for engine.c ---- */

uint8_t kvc_ops_wire_op(int op);
/* Set s up for its first pass; 1 when it is already complete
 * (s->res.status), 0 when frames are queued, -ENOMEM. */
int kvc_ops_begin(struct kvc_engine *e, struct kvc_slot *s);
/* Queue the frames of s's next pass. Errors: -ENOMEM. */
int kvc_ops_plan(struct kvc_engine *e, struct kvc_slot *s);
/* Encode f into e->tx_buf and e->tx_iov[0..tx_iov_n). Errors: -ENOMEM. */
int kvc_ops_encode(struct kvc_engine *e, struct kvc_frame *f);
/* The reply to f is in (e->rx_h; body; err: an error reply's status):
 * act on it; a GET's payload is then read by the engine (e->rx).
 * Returns 0 or a stream error. */
int kvc_ops_reply(struct kvc_engine *e, struct kvc_frame *f, int err, const uint8_t *body);
/* A GET frame's bytes are all in place: verify them. */
void kvc_ops_get_done(struct kvc_engine *e, struct kvc_frame *f);
/* Every frame of the pass is answered: next pass, or complete. */
void kvc_ops_pass_done(struct kvc_engine *e, struct kvc_slot *s);

#endif /* KVC_ENGINE_IMPL_H */
