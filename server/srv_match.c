/*
 * srv_match.c - MATCH: decode (v1 or v2) into struct srv_match_req, answer
 * through srv_match_answer (srv_match.h).
 */
#include "srv_match.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "srv_mwait.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

#define reply_err(c, status, ...) srv_conn_reply_error((c), (status), SRV_QUOTE_BODY, __VA_ARGS__)

/* 1 after an error reply was queued, -ENOMEM when it could not be. */
static int refused(int rc)
{
	return rc < 0 ? -ENOMEM : 1;
}

int srv_match_decode(struct srv_conn *c, struct srv_match_req *req)
{
	const struct srv *s = c->w->srv;
	const struct proto_limits *l = &s->limits;
	uint8_t version = c->hdr.version;
	/* SIGHUP may change it while workers run */
	uint32_t max_wait = __atomic_load_n(&s->conf.max_match_wait_ms, __ATOMIC_RELAXED);
	struct proto_match_req m;
	int rc = proto_match_decode(c->body, c->hdr.body_bytes, version, l, &m);

	if (rc == -EMSGSIZE)
		return refused(reply_err(c, PROTO_STATUS_TOO_LARGE,
					 "batch of %u entries exceeds max_batch_blocks %u",
					 proto_get_u32(c->body), l->max_batch_blocks));
	if (rc < 0 && version >= PROTO_VERSION_2 && c->hdr.body_bytes >= PROTO_MATCH_V2_PREFIX_BYTES &&
	    proto_match_body_bytes(version, proto_get_u32(c->body)) == c->hdr.body_bytes &&
	    proto_get_u32(c->body) != 0) {
		/* the layout is right: an option is wrong */
		if (proto_get_u32(c->body + 20) != 0)
			return refused(reply_err(c, PROTO_STATUS_BAD_REQUEST,
						 "malformed MATCH options: reserved field nonzero"));
		return refused(reply_err(c, PROTO_STATUS_BAD_REQUEST,
					 "MATCH want %u exceeds its %u keys", proto_get_u32(c->body + 12),
					 proto_get_u32(c->body)));
	}
	if (rc < 0)
		return refused(reply_err(c, PROTO_STATUS_BAD_REQUEST,
					 "malformed MATCH body: count 0 or body_bytes not %u + count * %u",
					 (unsigned)proto_match_body_bytes(version, 0),
					 PROTO_KEY_ENTRY_BYTES));
	*req = (struct srv_match_req){
		.keys = (const uint8_t(*)[PROTO_KEY_BYTES])m.keys.entries,
		.count = m.keys.count,
		.lease_ms = m.lease_ms,
		.wait_ms = m.opts.wait_ms,
		.want = m.opts.want ? m.opts.want : m.keys.count,
		.retain_ms = m.opts.retain_ms,
		.version = m.keys.version,
	};
	if (req->wait_ms > max_wait) {
		req->wait_ms = max_wait;
		req->flags |= PROTO_MATCH_WAIT_CLAMPED;
	}
	return 0;
}

enum srv_next srv_match_answer(struct srv_conn *c, const struct srv_match_req *req)
{
	struct store *st = c->w->srv->store;
	struct srv_stats *ss = &c->w->stats;
	struct store_match_opts o = {
		.lease_ms = req->lease_ms,
		.retain_ms = req->retain_ms,
		.lessee = c->lessee,
		/* the asker's tenant pays for the retention, whoever wrote the
		 * blocks or created the namespace (PROTOCOL.md 14.4) */
		.retainer = c->tenant,
	};
	struct store_match_res res = { 0 };
	uint8_t body[PROTO_MATCH_REPLY_MAX_BYTES];
	uint32_t n = (uint32_t)proto_match_reply_bytes(req->version);
	struct proto_match_reply r;
	uint8_t *out;
	int rc = 0;

	/* a namespace not created yet (srv_conn_ns_attach) holds nothing */
	if (c->ns_id)
		rc = store_match_ex(st, c->ns_id, (const uint8_t(*)[STORE_KEY_BYTES])req->keys,
				    req->count, &o, &res);
	if (rc < 0)
		return srv_conn_reply_error(c, proto_status_from_errno(rc), SRV_QUOTE_BODY,
					    "match failed: %s", strerror(-rc)) < 0 ?
			       SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	srv_stats_add(ss, SRV_C_match_blocks_queried, req->count);
	srv_stats_add(ss, SRV_C_match_blocks_matched, res.matched);
	r = (struct proto_match_reply){
		.matched = res.matched,
		.lease_ms = res.lease_ms,
		.flags = req->flags | res.flags,
		.present = res.present,
		.retained = res.retained,
		.retain_ms = res.retain_ms,
	};
	proto_match_reply_encode_v(req->version, &r, body);
	if (srv_conn_reply_begin(c, PROTO_STATUS_OK, n, 0, &out) < 0)
		return SRV_NEXT_ABORT;
	memcpy(out, body, n);
	srv_conn_reply_commit(c, n);
	/* a wait is not service time: a MATCH that waited for blocks has its
	 * wake-up latency recorded apart (srv_mwait.c) */
	if (!(r.flags & PROTO_MATCH_WAITED))
		srv_conn_lat_record(c, SRV_LAT_MATCH);
	return SRV_NEXT_HEADER;
}

enum srv_next srv_match_start(struct srv_conn *c)
{
	struct srv_match_req req;
	struct proto_match_req m;
	int rc;

	/* behind queued MATCHes a malformed one waits its turn, so that its
	 * error reply goes out in request order (srv_mwait.h) */
	if (srv_mwait_pending(c) &&
	    proto_match_decode(c->body, c->hdr.body_bytes, c->hdr.version, &c->w->srv->limits,
			       &m) < 0)
		return srv_mwait_hold_frame(c);
	srv_stats_add(&c->w->stats, SRV_C_match_requests, 1);
	rc = srv_match_decode(c, &req);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	/* answered now, or parked until its run is complete or its wait ends */
	return srv_mwait_match(c, &req);
}
