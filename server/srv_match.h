/*
 * srv_match.h - MATCH on a worker thread: decode a v1 or v2 request
 * (PROTOCOL.md 6.5 and 14) into one struct, answer it through one
 * function that asks the store and encodes the reply in the request's
 * version.
 *
 * A MATCH that waits: srv_match_start decodes and validates, then hands
 * the request to srv_mwait_match (srv_mwait.h), which answers it at once
 * through srv_match_answer, or parks it (with a copy of its keys) and
 * answers it through srv_match_answer when the run is complete, wait_ms
 * passed, or the wait ended; the lease and retention are taken then.
 */
#ifndef KVPOOL_SRV_MATCH_H
#define KVPOOL_SRV_MATCH_H

#include <stdint.h>

#include "srv_conn.h"

/* One MATCH request, decoded from either version. */
struct srv_match_req {
	const uint8_t (*keys)[PROTO_KEY_BYTES]; /* borrowed from c->body: count keys */
	uint32_t count;     /* 1..max_batch_blocks */
	uint32_t lease_ms;  /* as asked (the store caps it at max_lease_ms) */
	uint32_t wait_ms;   /* v2: as asked, cut to max_match_wait_ms; v1: 0 */
	uint32_t want;      /* leading keys wanted, 1..count (0 on the wire = count) */
	uint32_t retain_ms; /* v2: as asked (the store caps it); v1: 0 */
	uint32_t flags;     /* reply flags decided before answering:
			       PROTO_MATCH_WAIT_CLAMPED; a waiter adds WAITED,
			       WAIT_TIMEOUT, WAIT_REFUSED, WAIT_ENDED */
	uint8_t version;    /* of the request: the reply's layout (1: 8 bytes, 2: 24) */
};

/* Decode the MATCH request in c->body (header c->hdr) into *req.
 * Malformed requests are answered here: BAD_REQUEST (count 0, body_bytes
 * not 8 + 32 * count in v1 or 24 + 32 * count in v2, nonzero reserved
 * option bytes, want > count) or TOO_LARGE (count > max_batch_blocks),
 * each with a message naming what is wrong.
 * Returns 0 (decoded: answer it), 1 (an error reply was queued), or
 * -ENOMEM. Worker thread. */
int srv_match_decode(struct srv_conn *c, struct srv_match_req *req);

/* Answer req now: one store call (store_match_ex: lease, retention; a
 * namespace not created yet matches nothing), the MATCH counters and
 * latency, then the reply in req->version's layout (v1: matched and
 * lease_ms; v2: all six fields, flags = req->flags | the store's). A lease
 * over the connection's or tenant's bound is never refused: the store
 * answers the longest leading run whose lease fits (v2: LEASE_CUT, and
 * present > matched; v1: the shorter matched alone).
 * Returns what the input state machine does next (SRV_NEXT_HEADER, or
 * SRV_NEXT_ABORT when the reply could not be queued). Worker thread. */
enum srv_next srv_match_answer(struct srv_conn *c, const struct srv_match_req *req);

/* The MATCH request of c: count it, decode it, answer it. */
enum srv_next srv_match_start(struct srv_conn *c);

#endif /* KVPOOL_SRV_MATCH_H */
