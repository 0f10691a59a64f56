/*
 * srv_events.h - KV events for KV-aware routers: a publisher thread that
 * sends what the pool stores and drops over ZeroMQ in vLLM's KV-event
 * wire format (docs/events.md has the exact layout).
 *
 * Data path: the store calls srv_events_hook under its lock
 * (store_set_event_hook); the hook copies the event into a bounded
 * single-producer ring (the store lock serialises producers) and never
 * waits. When the ring is full the event is dropped and counted, and the
 * next batch started is flagged (topic frame "<topic>.<namespace> resync").
 *
 * Publisher thread: takes events off the ring, groups them into batches
 * of one namespace (at most SRV_EVENTS_BATCH_EVENTS events, at most
 * SRV_EVENTS_BATCH_MS old), numbers batches 0, 1, 2, ... without gaps
 * from each start, sends each as three frames (topic, 8-byte big-endian
 * sequence, msgpack EventBatch) on a PUB socket, keeps the last
 * `buffer_batches` for replay, and answers replay requests on a ROUTER
 * socket.
 *
 * Replay is bounded per peer: one answer in flight per peer (a second
 * request meanwhile is answered with the end marker alone, right after
 * the answer in flight), at most
 * SRV_EVENTS_REPLAY_PEERS answers in flight (when all are taken, one
 * whose peer has read nothing for SRV_EVENTS_REPLAY_STALL_MS gives its
 * slot to a new request), at most
 * SRV_EVENTS_REPLAY_WINDOW unread messages queued per peer (an answer
 * waits while its peer does not read), at most replay_max_bytes of
 * batches in one answer (then the end marker: ask again from the next
 * sequence). Answers are sent a few batches per peer per turn of the
 * publisher's loop, after the live events of that turn, so a replay flood
 * never holds up or drops live events.
 */
#ifndef KVPOOL_SRV_EVENTS_H
#define KVPOOL_SRV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "store.h"

#define SRV_EVENTS_BATCH_EVENTS 1000 /* a batch is sent at this many events */
#define SRV_EVENTS_BATCH_MS 10       /* or when its first event is this old */
/* The medium named in every event: the pool is host memory outside the
 * engine's GPU, named as vLLM's offloading connector names its CPU tier
 * (vLLM >= 0.11, vllm/v1/kv_offload/mediums.py). */
#define SRV_EVENTS_MEDIUM "CPU"
/* Replay answers in flight at once (one per peer); more requests get the
 * end marker at once. */
#define SRV_EVENTS_REPLAY_PEERS 32
/* An answer whose peer has read nothing for this long (ms) gives its slot
 * up to a new request when all SRV_EVENTS_REPLAY_PEERS are taken. */
#define SRV_EVENTS_REPLAY_STALL_MS 1000
/* Unread replay messages kvpoold queues for one peer (the ROUTER's
 * high-water mark): at most this many batches held per peer that does not
 * read. */
#define SRV_EVENTS_REPLAY_WINDOW 4
/* Batches sent per peer per turn of the publisher's loop. */
#define SRV_EVENTS_REPLAY_STEP 8
/* Suffix of the topic frame of a batch that follows dropped events. */
#define SRV_EVENTS_RESYNC_SUFFIX " resync"

struct srv_events_config {
	const char *endpoint;        /* PUB bind address, e.g. "tcp://127.0.0.1:5557"; required */
	const char *replay_endpoint; /* ROUTER bind address; NULL or "" = no replay */
	const char *topic;           /* topic prefix, e.g. "kvpool"; non-empty */
	uint32_t buffer_batches;     /* batches kept for replay, >= 1 */
	uint32_t queue_events;       /* ring capacity in events, >= 1 */
	uint32_t block_size;         /* tokens per block, the events' block_size field */
	uint64_t replay_max_bytes;   /* batch bytes one replay answer carries at most
				      * (at least one batch); 0 = no bound */
};

struct srv_events_stats {
	uint64_t produced;        /* events the store reported */
	uint64_t published;       /* of them, sent in a batch */
	uint64_t dropped;         /* of them, dropped: the ring was full */
	uint64_t queued;          /* of them, not yet sent (in the ring or an open batch) */
	uint64_t batches;         /* batches sent = the next sequence number */
	uint64_t resync_batches;  /* batches sent with the resync flag */
	uint64_t replay_requests; /* replay requests answered */
	uint64_t replayed_batches;/* batches sent in those answers */
	uint64_t replay_errors;   /* malformed replay requests (ignored) */
	uint64_t replay_refused;  /* requests answered with the end marker alone: the
				   * peer had an answer in flight, or too many peers had */
	uint64_t replay_truncated;/* answers cut at replay_max_bytes */
	uint64_t replay_stalled;  /* answers dropped for a new request: every slot was
				   * taken and their peer had read nothing for
				   * SRV_EVENTS_REPLAY_STALL_MS */
};

struct srv_events;

/* Bind the sockets and start the publisher thread. err[0..err_len)
 * receives a one-line reason on failure (naming the endpoint).
 * Errors: -EINVAL (bad config, or an endpoint zmq cannot bind: the
 * message says why), -EADDRINUSE, -ENOMEM, or another -errno from zmq or
 * pthread_create. Main thread. */
int srv_events_open(const struct srv_events_config *cfg, struct srv_events **out, char *err,
		    size_t err_len);

/* The store_event_fn to install with store_set_event_hook(store,
 * srv_events_hook, ev). Copies *e into the ring or drops it (never waits),
 * except for announce events, which wait for room (start-up only).
 * Called under the store lock only (one producer at a time). */
void srv_events_hook(void *arg, const struct store_event *e);

/* Current counters. Any thread; relaxed reads (figures may be a moment
 * apart from each other, but published + dropped + queued = produced
 * once the stream is idle). */
void srv_events_stats(struct srv_events *ev, struct srv_events_stats *out);

/* Send what is queued, stop the thread, close the sockets, free. The
 * hook must have been removed first (store_set_event_hook(s, NULL, NULL)).
 * Accepts NULL. Main thread. */
void srv_events_close(struct srv_events *ev);

/* ---- the encoder (pure; exposed for tests) ---- */

/* One block event as a batch holds it. */
struct srv_event_rec {
	uint8_t kind;          /* enum store_event_kind */
	uint8_t has_parent;    /* STORED: parent is valid */
	uint8_t key[STORE_KEY_BYTES];
	uint8_t parent[STORE_KEY_BYTES];
};

/* Append one EventBatch, msgpack-encoded as vLLM's msgspec encoder does
 * (array_like, omit_defaults, tagged events), to *buf: [ts, [events]].
 * Consecutive STORED records each naming the previous one as parent (a
 * chain) become one BlockStored with several block_hashes; consecutive
 * REMOVED records become one BlockRemoved; CLEARED -> ["AllBlocksCleared"].
 * Returns the number of events written, or -ENOMEM. */
int srv_events_encode(msgpack_sbuffer *buf, double ts, const struct srv_event_rec *recs,
		      size_t n, uint32_t block_size, const char *medium);

/* The 8-byte big-endian form of seq (vLLM's sequence frame). */
void srv_events_seq_bytes(int64_t seq, uint8_t out[8]);

/* ---- the ring (exposed for tests) ---- */

/* A ring entry: one event and its namespace's name. */
struct srv_event_entry {
	struct srv_event_rec rec;
	uint32_t ns_id;
	uint16_t name_len;
	char name[STORE_NAME_MAX_BYTES];
};

/* A bounded single-producer single-consumer ring of cap entries. */
struct srv_event_ring {
	struct srv_event_entry *slots;
	uint64_t cap;
	uint64_t head;    /* next slot the producer writes; producer stores (release) */
	uint64_t tail;    /* next slot the consumer reads; consumer stores (release) */
};

/* Allocate a ring of cap (>= 1) entries. Errors: -EINVAL, -ENOMEM. */
int srv_event_ring_init(struct srv_event_ring *r, uint64_t cap);
void srv_event_ring_free(struct srv_event_ring *r);
/* Producer: copy *e in. Returns 0, or -ENOSPC when full (nothing written). */
int srv_event_ring_push(struct srv_event_ring *r, const struct srv_event_entry *e);
/* Consumer: the oldest entry, or NULL when empty; valid until
 * srv_event_ring_pop. */
const struct srv_event_entry *srv_event_ring_peek(struct srv_event_ring *r);
/* Consumer: drop the entry peek returned. */
void srv_event_ring_pop(struct srv_event_ring *r);

#endif /* KVPOOL_SRV_EVENTS_H */
