/*
 * srv_get.c - GET: look up and pin every block (promoting from NVMe
 * where needed), then let the transport send the blocks and the reply.
 * See srv_get.h.
 */
#include "srv_get.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "srv_conn.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

/* Make room for `count` GET slots. Errors: -ENOMEM. */
static int gets_reserve(struct srv_conn *c, uint32_t count)
{
	struct srv_get_slot *p;

	if (count <= c->gets_cap)
		return 0;
	p = realloc(c->gets, (size_t)count * sizeof(*p));
	if (!p)
		return -ENOMEM;
	c->gets = p;
	c->gets_cap = count;
	return 0;
}

/* Settle slot g with the store's answer rc (0: g->ref is filled and
 * pinned). A slot keeps its pin only when its bytes are to be sent (OK):
 * a block larger than the entry's buffer is TOO_LARGE with its size (the
 * store pinned nothing), a miss (also a failed NVMe read, which the store
 * counted as corrupt) is NOT_FOUND, no DRAM room to promote into is BUSY
 * for this block only. */
static void get_settle(struct srv_conn *c, struct srv_get_slot *g, int rc)
{
	struct srv_stats *ss = &c->w->stats;

	if (rc == -EMSGSIZE) {
		/* the store answered the size alone (g->ref.length, tier):
		 * nothing pinned, and the connection's lease stays */
		g->status = PROTO_STATUS_TOO_LARGE;
		/* max_length 0 only asks the block's size (a client with no
		 * buffer yet, e.g. the Python get_many): not a refusal */
		if (g->max_length)
			srv_stats_count_status(ss, PROTO_STATUS_TOO_LARGE);
		return;
	}
	if (rc < 0) {
		memset(&g->ref, 0, sizeof(g->ref));
		g->status = proto_status_from_errno(rc);
		if (g->status == PROTO_STATUS_NOT_FOUND)
			srv_stats_add(ss, SRV_C_get_misses, 1);
		else
			srv_stats_count_status(ss, g->status);
		return;
	}
	/* a hit is a block sent: a size query or a too small buffer is
	 * answered without the bytes, and the client asks again */
	srv_stats_add(ss, SRV_C_get_hits, 1);
	g->status = PROTO_STATUS_OK;
	c->get_payload += g->ref.length;
	srv_stats_add(ss, SRV_C_get_bytes, g->ref.length);
}

/* Look up and pin every entry. Blocks in DRAM are settled at once; for a
 * block only on NVMe the store starts a promotion and reports to
 * srv_worker_get_done later (c->get_pending counts them). */
static void get_lookup(struct srv_conn *c, const struct proto_batch *b)
{
	struct store *st = c->w->srv->store;
	uint64_t room;

	c->get_count = b->count;
	c->get_payload = 0;
	c->get_pending = 0;
	for (uint32_t i = 0; i < b->count; i++) {
		struct srv_get_slot *g = &c->gets[i];
		struct proto_get_entry e;
		int rc;

		proto_get_entry_decode(b, i, &e);
		/* zeroed first: on a failed promotion the store leaves it alone */
		memset(g, 0, sizeof(*g));
		g->max_length = e.max_length;
		/* The bytes go into the peer's buffer for the entry, if the
		 * transport has one (RDMA: the described buffer). */
		if (c->ops->entry_room && c->ops->entry_room(c, i, &room) && room < g->max_length)
			g->max_length = room;
		g->c = c;
		/* a block larger than the buffer is answered with its size
		 * and keeps its lease (a size query, then the fetch) */
		rc = store_get_fit_async(st, c->ns_id, e.key, g->max_length, c->lessee, &g->ref,
					 srv_worker_get_done, g);
		if (rc == -EINPROGRESS)
			c->get_pending++; /* g belongs to the store until its done call */
		else
			get_settle(c, g, rc);
	}
}

/* Release the pins of slots from..count-1 (the reply could not be queued). */
static void get_release(struct srv_conn *c, uint32_t from, uint32_t count)
{
	for (uint32_t i = from; i < count; i++) {
		if (c->gets[i].ref.block)
			store_release(c->w->srv->store, c->gets[i].ref.block);
		c->gets[i].ref.block = NULL;
	}
}

/* Queue the GET's result entries (payload_bytes = payload), no payload.
 * Errors: -ENOMEM. */
static int get_results(struct srv_conn *c, uint32_t count, uint64_t payload)
{
	uint32_t body_bytes;
	uint8_t *body;

	if (srv_conn_results_begin(c, count, payload, &body, &body_bytes) < 0)
		return -ENOMEM;
	for (uint32_t i = 0; i < count; i++) {
		const struct srv_get_slot *g = &c->gets[i];
		struct proto_result res = { .status = g->status };

		if (g->status == PROTO_STATUS_OK || g->status == PROTO_STATUS_TOO_LARGE) {
			res.tier = g->ref.tier;
			res.length = g->ref.length;
			res.checksum = g->status == PROTO_STATUS_OK ? g->ref.checksum : 0;
		}
		proto_result_encode(body, i, &res);
	}
	srv_conn_reply_commit(c, body_bytes);
	return 0;
}

/* Encode the GET results and queue the OK blocks' bytes straight from the
 * arena; the output releases each pin once its bytes are written (or the
 * output is dropped). */
static int get_reply(struct srv_conn *c, uint32_t count, uint64_t payload)
{
	uint32_t i;

	if (get_results(c, count, payload) < 0)
		goto out_release;
	for (i = 0; i < count; i++) {
		struct store_ref *r = &c->gets[i].ref;
		struct store_block *b = r->block;

		if (!b)
			continue;
		/* The output owns the pin from here, also on failure. */
		r->block = NULL;
		if (srv_conn_reply_block(c, r->data, r->length, b) < 0)
			goto out_release_from;
	}
	return 0;

out_release:
	i = 0;
out_release_from:
	/* A half-queued reply breaks the stream: the caller closes. */
	get_release(c, i, count);
	return -ENOMEM;
}

enum srv_next srv_get_reply(struct srv_conn *c)
{
	if (get_reply(c, c->get_count, c->get_payload) < 0)
		return SRV_NEXT_ABORT;
	srv_conn_lat_record(c, SRV_LAT_GET);
	return SRV_NEXT_HEADER;
}

/* Every slot of the GET is settled: the transport sends the blocks and
 * the reply (the latency, promotions included, is recorded with it). */
static enum srv_next get_finish(struct srv_conn *c)
{
	return c->ops->get_send(c);
}

enum srv_next srv_get_start(struct srv_conn *c, const struct proto_batch *b)
{
	if (gets_reserve(c, b->count) < 0)
		return SRV_NEXT_ABORT;
	get_lookup(c, b);
	/* The slots the store still owns are settled by srv_get_done. */
	if (c->get_pending)
		return SRV_NEXT_WAIT;
	return get_finish(c);
}

int srv_get_answer(struct srv_conn *c)
{
	int rc = get_results(c, c->get_count, c->get_payload);

	srv_get_release(c);
	if (rc == 0)
		srv_conn_lat_record(c, SRV_LAT_GET);
	return rc;
}

void srv_get_release(struct srv_conn *c)
{
	get_release(c, 0, c->get_count);
}

void srv_get_done(struct srv_get_slot *g)
{
	struct srv_conn *c = g->c;

	if (c->zombie) {
		/* Nobody to answer: give the promoted block back. */
		if (g->done_status == 0)
			store_release(c->w->srv->store, g->ref.block);
		g->ref.block = NULL;
		if (--c->get_pending == 0)
			srv_conn_zombie_free(c);
		return;
	}
	get_settle(c, g, g->done_status);
	if (--c->get_pending == 0)
		srv_conn_request_done(c, get_finish(c));
}
