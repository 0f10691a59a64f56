/*
 * srv_events.c - the KV-event publisher (srv_events.h): the ring the
 * store's hook fills, the msgpack encoder (msgpack-c), and the thread
 * that batches, publishes on ZeroMQ PUB and answers replays on ROUTER.
 */
#include "srv_events.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <zmq.h>

#include "srv_log.h"

/* ---- ring ---------------------------------------------------------------- */

int srv_event_ring_init(struct srv_event_ring *r, uint64_t cap)
{
	memset(r, 0, sizeof(*r));
	if (cap == 0)
		return -EINVAL;
	r->slots = calloc(cap, sizeof(*r->slots));
	if (!r->slots)
		return -ENOMEM;
	r->cap = cap;
	return 0;
}

void srv_event_ring_free(struct srv_event_ring *r)
{
	free(r->slots);
	r->slots = NULL;
}

int srv_event_ring_push(struct srv_event_ring *r, const struct srv_event_entry *e)
{
	uint64_t head = __atomic_load_n(&r->head, __ATOMIC_RELAXED);
	uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	struct srv_event_entry *slot;

	if (head - tail >= r->cap)
		return -ENOSPC;
	slot = &r->slots[head % r->cap];
	slot->rec = e->rec;
	slot->ns_id = e->ns_id;
	slot->name_len = e->name_len;
	memcpy(slot->name, e->name, e->name_len);
	__atomic_store_n(&r->head, head + 1, __ATOMIC_RELEASE);
	return 0;
}

const struct srv_event_entry *srv_event_ring_peek(struct srv_event_ring *r)
{
	uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);

	if (__atomic_load_n(&r->head, __ATOMIC_ACQUIRE) == tail)
		return NULL;
	return &r->slots[tail % r->cap];
}

void srv_event_ring_pop(struct srv_event_ring *r)
{
	__atomic_store_n(&r->tail, __atomic_load_n(&r->tail, __ATOMIC_RELAXED) + 1,
			 __ATOMIC_RELEASE);
}

/* ---- encoder ------------------------------------------------------------- */

void srv_events_seq_bytes(int64_t seq, uint8_t out[8])
{
	uint64_t v = (uint64_t)seq;

	for (int i = 7; i >= 0; i--) {
		out[i] = (uint8_t)v;
		v >>= 8;
	}
}

static int pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

static int pack_hash(msgpack_packer *pk, const uint8_t *h)
{
	return msgpack_pack_bin(pk, STORE_KEY_BYTES) ||
	       msgpack_pack_bin_body(pk, h, STORE_KEY_BYTES);
}

/* Records [i, end) that form one event starting at i. */
static size_t run_end(const struct srv_event_rec *recs, size_t n, size_t i)
{
	size_t j = i + 1;

	if (recs[i].kind == STORE_EVENT_CLEARED)
		return j;
	while (j < n && recs[j].kind == recs[i].kind) {
		if (recs[i].kind == STORE_EVENT_STORED &&
		    (!recs[j].has_parent ||
		     memcmp(recs[j].parent, recs[j - 1].key, STORE_KEY_BYTES) != 0))
			break;
		j++;
	}
	return j;
}

int srv_events_encode(msgpack_sbuffer *buf, double ts, const struct srv_event_rec *recs,
		      size_t n, uint32_t block_size, const char *medium)
{
	msgpack_packer pk;
	size_t events = 0, len0 = buf->size;
	int rc = 0;

	for (size_t i = 0; i < n; i = run_end(recs, n, i))
		events++;
	msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
	/* EventBatch: ts, events; data_parallel_rank (default None) omitted */
	rc |= msgpack_pack_array(&pk, 2);
	rc |= msgpack_pack_double(&pk, ts);
	rc |= msgpack_pack_array(&pk, events);
	for (size_t i = 0; i < n && !rc;) {
		size_t end = run_end(recs, n, i);

		switch (recs[i].kind) {
		case STORE_EVENT_STORED:
			/* tag, block_hashes, parent_block_hash, token_ids,
			 * block_size, lora_id, medium, lora_name */
			rc |= msgpack_pack_array(&pk, 8);
			rc |= pack_str(&pk, "BlockStored");
			rc |= msgpack_pack_array(&pk, end - i);
			for (size_t k = i; k < end; k++)
				rc |= pack_hash(&pk, recs[k].key);
			if (recs[i].has_parent)
				rc |= pack_hash(&pk, recs[i].parent);
			else
				rc |= msgpack_pack_nil(&pk);
			rc |= msgpack_pack_array(&pk, 0);
			rc |= msgpack_pack_uint32(&pk, block_size);
			rc |= msgpack_pack_nil(&pk);
			rc |= pack_str(&pk, medium);
			rc |= msgpack_pack_nil(&pk);
			break;
		case STORE_EVENT_REMOVED:
			/* tag, block_hashes, medium */
			rc |= msgpack_pack_array(&pk, 3);
			rc |= pack_str(&pk, "BlockRemoved");
			rc |= msgpack_pack_array(&pk, end - i);
			for (size_t k = i; k < end; k++)
				rc |= pack_hash(&pk, recs[k].key);
			rc |= pack_str(&pk, medium);
			break;
		default:
			rc |= msgpack_pack_array(&pk, 1);
			rc |= pack_str(&pk, "AllBlocksCleared");
			break;
		}
		i = end;
	}
	if (rc) {
		buf->size = len0;
		return -ENOMEM;
	}
	return (int)events;
}

/* ---- publisher ----------------------------------------------------------- */

struct replay_slot {
	uint64_t seq;
	char *topic;
	size_t topic_len;
	char *payload;
	size_t payload_len;
};

/* One peer's replay answer in flight (one per peer at a time). */
struct replay_peer {
	zmq_msg_t id;          /* the peer's routing id (a copy); valid while active */
	bool active;
	uint64_t next;         /* next sequence number to send */
	uint64_t end;          /* batches that existed when it asked: send up to end - 1 */
	uint64_t bytes;        /* payload bytes sent in this answer */
	uint32_t extra_ends;   /* requests refused meanwhile: an end marker each, after it */
	uint64_t progress_ms;  /* when it started or last sent a message (mono_ms) */
};

struct srv_events {
	struct srv_events_config cfg;
	char *endpoint, *replay_endpoint, *topic;
	void *ctx, *pub, *router;
	struct srv_event_ring ring;
	pthread_t thread;
	bool started;
	int stop;                    /* atomic: main sets, publisher reads */
	int resync;                  /* atomic: producer sets on a drop, publisher clears */
	/* counters: producer (produced, dropped) and publisher (the rest), atomics */
	uint64_t produced, dropped, published, batches, resync_batches;
	uint64_t replay_requests, replayed_batches, replay_errors;
	uint64_t replay_refused, replay_truncated, replay_stalled;
	/* the open batch: publisher thread only */
	struct srv_event_rec *recs;
	size_t nrecs;
	uint32_t batch_ns;
	char batch_name[STORE_NAME_MAX_BYTES];
	uint16_t batch_name_len;
	bool batch_resync;
	uint64_t batch_start_ms;
	msgpack_sbuffer sbuf;
	/* replay buffer and answers in flight: publisher thread only */
	struct replay_slot *replay;
	uint64_t nreplay;            /* slots filled (<= buffer_batches) */
	struct replay_peer peers[SRV_EVENTS_REPLAY_PEERS];
	uint32_t npeers;             /* active ones */
};

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static double wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void count(uint64_t *c, uint64_t n)
{
	__atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

void srv_events_hook(void *arg, const struct store_event *e)
{
	struct srv_events *ev = arg;
	struct srv_event_entry ent;

	ent.rec.kind = (uint8_t)e->kind;
	ent.rec.has_parent = e->parent != NULL;
	if (e->key)
		memcpy(ent.rec.key, e->key, STORE_KEY_BYTES);
	else
		memset(ent.rec.key, 0, STORE_KEY_BYTES);
	if (e->parent)
		memcpy(ent.rec.parent, e->parent, STORE_KEY_BYTES);
	ent.ns_id = e->ns_id;
	ent.name_len = (uint16_t)(e->ns_name_len > STORE_NAME_MAX_BYTES ? STORE_NAME_MAX_BYTES
									 : e->ns_name_len);
	memcpy(ent.name, e->ns_name, ent.name_len);
	count(&ev->produced, 1);
	while (srv_event_ring_push(&ev->ring, &ent) < 0) {
		if (!e->announce || __atomic_load_n(&ev->stop, __ATOMIC_RELAXED)) {
			count(&ev->dropped, 1);
			__atomic_store_n(&ev->resync, 1, __ATOMIC_RELEASE);
			return;
		}
		/* start-up announce of what the pool holds: wait for room */
		struct timespec ts = { 0, 200000 };

		nanosleep(&ts, NULL);
	}
}

/* Keep batch seq (topic, payload) in the replay buffer, oldest out. */
static void replay_keep(struct srv_events *ev, uint64_t seq, const char *topic, size_t tlen,
			const char *payload, size_t plen)
{
	struct replay_slot *sl = &ev->replay[seq % ev->cfg.buffer_batches];
	char *t = malloc(tlen ? tlen : 1), *p = malloc(plen ? plen : 1);

	if (!t || !p) {
		free(t);
		free(p);
		t = p = NULL;
		tlen = plen = 0;
	} else {
		memcpy(t, topic, tlen);
		memcpy(p, payload, plen);
	}
	free(sl->topic);
	free(sl->payload);
	sl->seq = t ? seq : UINT64_MAX; /* UINT64_MAX: lost to memory, never replayed */
	sl->topic = t;
	sl->topic_len = tlen;
	sl->payload = p;
	sl->payload_len = plen;
	if (ev->nreplay < ev->cfg.buffer_batches)
		ev->nreplay++;
}

static void flush_batch(struct srv_events *ev)
{
	char topic[512];
	uint8_t seqb[8];
	uint64_t seq;
	size_t tlen;
	int n;

	if (!ev->nrecs)
		return;
	ev->sbuf.size = 0;
	n = srv_events_encode(&ev->sbuf, wall_s(), ev->recs, ev->nrecs, ev->cfg.block_size,
			      SRV_EVENTS_MEDIUM);
	if (n < 0) {
		/* no memory for the payload: these events are dropped */
		count(&ev->dropped, ev->nrecs);
		__atomic_store_n(&ev->resync, 1, __ATOMIC_RELEASE);
		ev->nrecs = 0;
		return;
	}
	tlen = (size_t)snprintf(topic, sizeof(topic), "%s.%.*s%s", ev->topic,
				(int)ev->batch_name_len, ev->batch_name,
				ev->batch_resync ? SRV_EVENTS_RESYNC_SUFFIX : "");
	seq = __atomic_load_n(&ev->batches, __ATOMIC_RELAXED);
	srv_events_seq_bytes((int64_t)seq, seqb);
	/* PUB never blocks: a slow subscriber loses messages at its high
	 * water mark (it can replay them) */
	(void)zmq_send(ev->pub, topic, tlen, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	(void)zmq_send(ev->pub, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
	(void)zmq_send(ev->pub, ev->sbuf.data, ev->sbuf.size, ZMQ_DONTWAIT);
	replay_keep(ev, seq, topic, tlen, ev->sbuf.data, ev->sbuf.size);
	count(&ev->published, ev->nrecs);
	if (ev->batch_resync)
		count(&ev->resync_batches, 1);
	__atomic_store_n(&ev->batches, seq + 1, __ATOMIC_RELAXED);
	ev->nrecs = 0;
}

/* Take what the ring holds into batches (sending full ones). */
static void drain_ring(struct srv_events *ev)
{
	const struct srv_event_entry *e;

	while ((e = srv_event_ring_peek(&ev->ring))) {
		if (ev->nrecs && e->ns_id != ev->batch_ns)
			flush_batch(ev);
		if (!ev->nrecs) {
			ev->batch_ns = e->ns_id;
			ev->batch_name_len = e->name_len;
			memcpy(ev->batch_name, e->name, e->name_len);
			ev->batch_resync = __atomic_exchange_n(&ev->resync, 0, __ATOMIC_ACQ_REL);
			ev->batch_start_ms = mono_ms();
		}
		ev->recs[ev->nrecs++] = e->rec;
		srv_event_ring_pop(&ev->ring);
		if (ev->nrecs == SRV_EVENTS_BATCH_EVENTS)
			flush_batch(ev);
	}
}

/* Send [identity, "", a, b] to a ROUTER peer without waiting. Returns 0,
 * -EAGAIN (the peer's window of unread messages is full: try later) or
 * -EHOSTUNREACH (the peer is gone). */
static int send_to(void *sock, const zmq_msg_t *id, const void *a, size_t alen, const void *b,
		   size_t blen)
{
	zmq_msg_t copy;

	zmq_msg_init(&copy);
	zmq_msg_copy(&copy, (zmq_msg_t *)id);
	if (zmq_msg_send(&copy, sock, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		int e = errno;

		zmq_msg_close(&copy);
		return e == EAGAIN ? -EAGAIN : -EHOSTUNREACH;
	}
	/* once the first frame is taken the message is taken whole */
	if (zmq_send(sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(sock, a, alen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
	    zmq_send(sock, b, blen, ZMQ_DONTWAIT) < 0)
		return -EHOSTUNREACH;
	return 0;
}

/* The active answer of the peer with routing id `id`, or NULL. */
static struct replay_peer *peer_find(struct srv_events *ev, zmq_msg_t *id)
{
	size_t len = zmq_msg_size(id);

	for (uint32_t i = 0; i < SRV_EVENTS_REPLAY_PEERS; i++) {
		struct replay_peer *p = &ev->peers[i];

		if (p->active && zmq_msg_size(&p->id) == len &&
		    memcmp(zmq_msg_data(&p->id), zmq_msg_data(id), len) == 0)
			return p;
	}
	return NULL;
}

static void peer_end(struct srv_events *ev, struct replay_peer *p)
{
	zmq_msg_close(&p->id);
	p->active = false;
	ev->npeers--;
}

/* Send the end marker alone (a refused request). Best effort. */
static void send_end(struct srv_events *ev, zmq_msg_t *id)
{
	uint8_t endb[8];

	srv_events_seq_bytes(-1, endb);
	(void)send_to(ev->router, id, endb, 8, "", 0);
}

/* Take one replay request off the ROUTER: [identity, "", start_seq (8
 * bytes BE)] as the ROUTER sees a REQ or DEALER peer. A malformed one is
 * counted and ignored; one from a peer whose answer is still in flight
 * gets the end marker alone right after that answer, and one beyond
 * SRV_EVENTS_REPLAY_PEERS answers in flight gets it at once (both counted
 * in replay_refused); else the peer's answer starts: the
 * buffered batches with seq >= start that exist now, sent by
 * replay_advance. Returns false when there was no request. */
static bool replay_accept(struct srv_events *ev)
{
	zmq_msg_t id, part;
	uint8_t start[8];
	size_t frames = 0, last_len = 0;
	int more = 1;
	uint64_t from = 0, next, oldest;
	struct replay_peer *p = NULL;

	zmq_msg_init(&id);
	if (zmq_msg_recv(&id, ev->router, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&id);
		return false;
	}
	more = zmq_msg_more(&id);
	while (more) {
		zmq_msg_init(&part);
		if (zmq_msg_recv(&part, ev->router, 0) < 0) {
			zmq_msg_close(&part);
			break;
		}
		last_len = zmq_msg_size(&part);
		if (last_len == 8)
			memcpy(start, zmq_msg_data(&part), 8);
		frames++;
		more = zmq_msg_more(&part);
		zmq_msg_close(&part);
	}
	if (frames == 0 || last_len != 8) {
		count(&ev->replay_errors, 1);
		zmq_msg_close(&id);
		return true;
	}
	p = peer_find(ev, &id);
	if (!p && ev->npeers == SRV_EVENTS_REPLAY_PEERS) {
		/* every slot is taken: the answer whose peer has read nothing
		 * for longest gives its slot up, if that is at least
		 * SRV_EVENTS_REPLAY_STALL_MS - so peers that ask and never
		 * read cannot hold replay from everyone else */
		struct replay_peer *stale = NULL;
		uint64_t now = mono_ms();

		for (uint32_t i = 0; i < SRV_EVENTS_REPLAY_PEERS; i++) {
			struct replay_peer *q = &ev->peers[i];

			if (q->active && now - q->progress_ms >= SRV_EVENTS_REPLAY_STALL_MS &&
			    (!stale || q->progress_ms < stale->progress_ms))
				stale = q;
		}
		if (stale) {
			count(&ev->replay_stalled, 1);
			peer_end(ev, stale);
		}
	}
	if (p || ev->npeers == SRV_EVENTS_REPLAY_PEERS) {
		count(&ev->replay_refused, 1);
		if (p)
			p->extra_ends++; /* its answer ends first: replies stay in order */
		else
			send_end(ev, &id);
		zmq_msg_close(&id);
		return true;
	}
	for (uint32_t i = 0; i < SRV_EVENTS_REPLAY_PEERS && !p; i++)
		if (!ev->peers[i].active)
			p = &ev->peers[i];
	for (int i = 0; i < 8; i++)
		from = from << 8 | start[i];
	next = __atomic_load_n(&ev->batches, __ATOMIC_RELAXED);
	oldest = next - ev->nreplay;
	if (from > (uint64_t)INT64_MAX)
		from = next; /* a negative start: nothing */
	zmq_msg_init(&p->id);
	zmq_msg_move(&p->id, &id);
	zmq_msg_close(&id);
	p->active = true;
	p->next = from < oldest ? oldest : from;
	p->end = next;
	p->bytes = 0;
	p->extra_ends = 0;
	p->progress_ms = mono_ms();
	ev->npeers++;
	count(&ev->replay_requests, 1);
	return true;
}

/* Send up to SRV_EVENTS_REPLAY_STEP more batches of peer p's answer, and
 * its end marker once it is complete or has carried replay_max_bytes.
 * Stops early, keeping its place, while the peer's window of unread
 * messages is full; drops the answer when the peer is gone. */
static void replay_advance(struct srv_events *ev, struct replay_peer *p)
{
	uint64_t oldest = __atomic_load_n(&ev->batches, __ATOMIC_RELAXED) - ev->nreplay;
	uint8_t seqb[8];
	int rc = 0;

	for (int k = 0; k < SRV_EVENTS_REPLAY_STEP && p->next < p->end; k++) {
		const struct replay_slot *sl;

		if (p->next < oldest)
			p->next = oldest; /* overwritten meanwhile: gone from the buffer */
		if (p->next >= p->end)
			break;
		sl = &ev->replay[p->next % ev->cfg.buffer_batches];
		if (sl->seq != p->next) {
			p->next++;
			continue;
		}
		if (p->bytes && ev->cfg.replay_max_bytes &&
		    p->bytes + sl->payload_len > ev->cfg.replay_max_bytes) {
			count(&ev->replay_truncated, 1);
			p->end = p->next; /* the rest: ask again from here */
			break;
		}
		srv_events_seq_bytes((int64_t)p->next, seqb);
		rc = send_to(ev->router, &p->id, seqb, 8, sl->payload, sl->payload_len);
		if (rc)
			break;
		p->bytes += sl->payload_len;
		p->next++;
		p->progress_ms = mono_ms();
		count(&ev->replayed_batches, 1);
	}
	/* the end marker, then one for each request refused meanwhile */
	while (rc == 0 && p->next >= p->end) {
		srv_events_seq_bytes(-1, seqb);
		rc = send_to(ev->router, &p->id, seqb, 8, "", 0);
		if (rc)
			break;
		if (!p->extra_ends) {
			peer_end(ev, p);
			return;
		}
		p->extra_ends--;
	}
	if (rc == -EHOSTUNREACH)
		peer_end(ev, p);
}

static void *publisher_main(void *arg)
{
	struct srv_events *ev = arg;
	zmq_pollitem_t items[1];
	int nitems = 0;

	if (ev->router) {
		items[0].socket = ev->router;
		items[0].fd = 0;
		items[0].events = ZMQ_POLLIN;
		nitems = 1;
	}
	for (;;) {
		bool stopping = __atomic_load_n(&ev->stop, __ATOMIC_ACQUIRE);
		/* answers in flight are pushed every millisecond or so */
		long timeout = ev->npeers ? 1 : 2;

		/* live events first, every turn: a replay never holds them up */
		drain_ring(ev);
		if (ev->nrecs && (stopping || mono_ms() - ev->batch_start_ms >= SRV_EVENTS_BATCH_MS))
			flush_batch(ev);
		if (stopping && !srv_event_ring_peek(&ev->ring))
			break;
		for (uint32_t i = 0; i < SRV_EVENTS_REPLAY_PEERS && ev->npeers; i++)
			if (ev->peers[i].active)
				replay_advance(ev, &ev->peers[i]);
		if (zmq_poll(items, nitems, timeout) > 0 && (items[0].revents & ZMQ_POLLIN)) {
			for (int k = 0; k < 64 && replay_accept(ev); k++)
				;
		}
	}
	for (uint32_t i = 0; i < SRV_EVENTS_REPLAY_PEERS; i++)
		if (ev->peers[i].active)
			peer_end(ev, &ev->peers[i]);
	return NULL;
}

/* endpoint is tcp://HOST:PORT with a HOST that is not an address or an
 * interface (zmq's bind refuses a host name with ENODEV): resolve HOST
 * (IPv4 first) and write tcp://ADDRESS:PORT into out. Returns 0, or
 * -ENOENT when it does not resolve (or endpoint is not of that form). */
static int resolve_tcp_endpoint(const char *endpoint, char *out, size_t out_len)
{
	static const int families[] = { AF_INET, AF_INET6 };
	char host[256];
	const char *h = endpoint + 6, *colon;
	size_t hlen;

	if (strncmp(endpoint, "tcp://", 6) != 0 || *h == '[')
		return -ENOENT;
	colon = strrchr(h, ':');
	if (!colon || (hlen = (size_t)(colon - h)) == 0 || hlen >= sizeof(host))
		return -ENOENT;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
		struct addrinfo hints = { .ai_family = families[f], .ai_socktype = SOCK_STREAM };
		struct addrinfo *ai = NULL;
		char addr[INET6_ADDRSTRLEN];
		const void *src;

		if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai)
			continue;
		src = ai->ai_family == AF_INET ?
			(const void *)&((const struct sockaddr_in *)ai->ai_addr)->sin_addr :
			(const void *)&((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
		if (!inet_ntop(ai->ai_family, src, addr, sizeof(addr))) {
			freeaddrinfo(ai);
			continue;
		}
		snprintf(out, out_len, ai->ai_family == AF_INET ? "tcp://%s%s" : "tcp://[%s]%s", addr,
			 colon);
		freeaddrinfo(ai);
		return 0;
	}
	return -ENOENT;
}

/* Create a socket of `type` and bind it to endpoint, for setting `what`.
 * IPv6 addresses are taken (ZMQ_IPV6); a tcp:// host name, which zmq
 * cannot bind, is resolved first (localhost -> 127.0.0.1) and the address
 * bound is logged. Errors, with err saying which and why: -EINVAL (not an
 * endpoint zmq binds: a host that does not resolve, an unknown interface,
 * a bad scheme), -EADDRINUSE, -errno of socket creation. */
static int bind_socket(void *ctx, int type, const char *endpoint, const char *what, void **out,
		       char *err, size_t err_len)
{
	void *sock = zmq_socket(ctx, type);
	int zero = 0, one = 1, hwm = 100000, rc, e;
	char resolved[300];

	if (!sock) {
		snprintf(err, err_len, "%s: cannot create a socket: %s", what, zmq_strerror(errno));
		return -errno;
	}
	zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(sock, ZMQ_IPV6, &one, sizeof(one));
	if (type == ZMQ_ROUTER) {
		/* a replay answer waits while its peer does not read, rather
		 * than piling up: a few unread messages per peer at most, and
		 * sends that say so (EAGAIN) or that the peer left */
		hwm = SRV_EVENTS_REPLAY_WINDOW;
		zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
	}
	zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
	rc = zmq_bind(sock, endpoint);
	e = errno;
	if (rc < 0 && e == ENODEV && resolve_tcp_endpoint(endpoint, resolved, sizeof(resolved)) == 0) {
		rc = zmq_bind(sock, resolved);
		e = errno;
		if (rc == 0)
			srv_info("%s %s: bound to %s (zmq binds addresses, not host names)", what,
				 endpoint, resolved);
	}
	if (rc < 0) {
		if (e == ENODEV && strncmp(endpoint, "tcp://", 6) == 0)
			snprintf(err, err_len, "%s %s: cannot bind: the host is neither an IP address, "
				 "an interface name, nor a host name that resolves (e.g. "
				 "tcp://127.0.0.1:5557, tcp://[::1]:5557, tcp://eth0:5557, "
				 "tcp://*:5557)", what, endpoint);
		else
			snprintf(err, err_len, "%s %s: cannot bind: %s", what, endpoint,
				 zmq_strerror(e));
		zmq_close(sock);
		return e == EADDRINUSE ? -EADDRINUSE : -EINVAL;
	}
	*out = sock;
	return 0;
}

static void events_free(struct srv_events *ev)
{
	if (ev->pub)
		zmq_close(ev->pub);
	if (ev->router)
		zmq_close(ev->router);
	if (ev->ctx)
		zmq_ctx_term(ev->ctx);
	for (uint64_t i = 0; ev->replay && i < ev->cfg.buffer_batches; i++) {
		free(ev->replay[i].topic);
		free(ev->replay[i].payload);
	}
	free(ev->replay);
	free(ev->recs);
	msgpack_sbuffer_destroy(&ev->sbuf);
	srv_event_ring_free(&ev->ring);
	free(ev->endpoint);
	free(ev->replay_endpoint);
	free(ev->topic);
	free(ev);
}

int srv_events_open(const struct srv_events_config *cfg, struct srv_events **out, char *err,
		    size_t err_len)
{
	struct srv_events *ev;
	int rc;

	if (!cfg->endpoint || !cfg->endpoint[0] || !cfg->topic || !cfg->topic[0] ||
	    cfg->buffer_batches == 0 || cfg->queue_events == 0) {
		snprintf(err, err_len, "kv events: endpoint, topic, buffer and queue must be set");
		return -EINVAL;
	}
	ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	msgpack_sbuffer_init(&ev->sbuf);
	ev->cfg = *cfg;
	ev->endpoint = strdup(cfg->endpoint);
	ev->replay_endpoint = cfg->replay_endpoint ? strdup(cfg->replay_endpoint) : NULL;
	ev->topic = strdup(cfg->topic);
	ev->recs = calloc(SRV_EVENTS_BATCH_EVENTS, sizeof(*ev->recs));
	ev->replay = calloc(cfg->buffer_batches, sizeof(*ev->replay));
	rc = srv_event_ring_init(&ev->ring, cfg->queue_events);
	if (rc == 0 && (!ev->endpoint || !ev->topic || !ev->recs || !ev->replay ||
			(cfg->replay_endpoint && !ev->replay_endpoint)))
		rc = -ENOMEM;
	if (rc == 0) {
		ev->ctx = zmq_ctx_new();
		if (!ev->ctx)
			rc = -ENOMEM;
	}
	if (rc == -ENOMEM)
		snprintf(err, err_len, "kv events: out of memory");
	if (rc == 0)
		rc = bind_socket(ev->ctx, ZMQ_PUB, ev->endpoint, "kv_events_endpoint", &ev->pub, err,
				 err_len);
	if (rc == 0 && ev->replay_endpoint && ev->replay_endpoint[0])
		rc = bind_socket(ev->ctx, ZMQ_ROUTER, ev->replay_endpoint,
				 "kv_events_replay_endpoint", &ev->router, err, err_len);
	if (rc == 0) {
		rc = -pthread_create(&ev->thread, NULL, publisher_main, ev);
		if (rc)
			snprintf(err, err_len, "kv events: cannot start the publisher thread: %s",
				 strerror(-rc));
	}
	if (rc) {
		events_free(ev);
		return rc;
	}
	ev->started = true;
	*out = ev;
	return 0;
}

void srv_events_stats(struct srv_events *ev, struct srv_events_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->produced = __atomic_load_n(&ev->produced, __ATOMIC_RELAXED);
	out->dropped = __atomic_load_n(&ev->dropped, __ATOMIC_RELAXED);
	out->published = __atomic_load_n(&ev->published, __ATOMIC_RELAXED);
	out->batches = __atomic_load_n(&ev->batches, __ATOMIC_RELAXED);
	out->resync_batches = __atomic_load_n(&ev->resync_batches, __ATOMIC_RELAXED);
	out->replay_requests = __atomic_load_n(&ev->replay_requests, __ATOMIC_RELAXED);
	out->replayed_batches = __atomic_load_n(&ev->replayed_batches, __ATOMIC_RELAXED);
	out->replay_errors = __atomic_load_n(&ev->replay_errors, __ATOMIC_RELAXED);
	out->replay_refused = __atomic_load_n(&ev->replay_refused, __ATOMIC_RELAXED);
	out->replay_truncated = __atomic_load_n(&ev->replay_truncated, __ATOMIC_RELAXED);
	out->replay_stalled = __atomic_load_n(&ev->replay_stalled, __ATOMIC_RELAXED);
	if (out->produced > out->published + out->dropped)
		out->queued = out->produced - out->published - out->dropped;
}

void srv_events_close(struct srv_events *ev)
{
	if (!ev)
		return;
	__atomic_store_n(&ev->stop, 1, __ATOMIC_RELEASE);
	if (ev->started)
		pthread_join(ev->thread, NULL);
	events_free(ev);
}
