/*
 * srv_mwait.h - MATCHes that wait for blocks (PROTOCOL.md, MATCH wait_ms
 * and want): the server's index of waiting MATCHes, fed by the store's
 * STORED and CLEARED events, and each connection's queue of MATCHes
 * parked or answered in turn.
 *
 * A MATCH that asks to wait (wait_ms > 0) while fewer than `want`
 * leading keys are present is parked: no thread, no polling. Its copy of
 * the keys waits in the index under the first missing key (namespace,
 * key). When a PUT commits that key, the store's event hook (called with
 * the store lock held, on whatever thread commits) moves the waiters of
 * that key to their workers and wakes them: one hash lookup per
 * committed block, and one list splice per worker that has waiters on
 * the key, however many waiters there are. The worker looks again from
 * where the run had got to (store_present: no effect on the pool) and
 * either answers, or parks the MATCH under its next missing key. A timer
 * per waiter (the worker's event loop) answers it when wait_ms passes.
 * Leases and the reply are taken when it answers, through the same
 * answering code as any MATCH.
 *
 * Order: replies leave in request order. A connection whose MATCH is
 * parked reads on (TCP): further MATCHes are parked too (or, without a
 * wait, queued to be answered in turn), each waiting on its own; any
 * other request is held (not handled, nothing more read) until every
 * MATCH before it has been answered. A transport without `kick`
 * (srv_transport.h; RDMA) parks the whole connection instead
 * (SRV_NEXT_WAIT): one waiting MATCH at a time.
 *
 * What ends a wait: the run becomes complete (answered with WAITED), wait_ms
 * passes (WAITED | WAIT_TIMEOUT), the namespace is dropped, a SIGHUP
 * changes what the connection's token grants in its namespace, or the
 * server starts draining (WAITED | WAIT_ENDED); the connection closing
 * (the waiters are freed, nothing is answered). A DELETE or an eviction
 * of a block of the run ends nothing: the run is not complete, the MATCH
 * keeps waiting (its next wake-up looks again from the first key).
 * Limits: wait_ms is cut to max_match_wait_ms (WAIT_CLAMPED); a MATCH
 * over max_conn_match_waits or tenant_max_match_waits waiting MATCHes, or
 * whose keys would take all waits past max_match_wait_bytes, is answered
 * without waiting (WAIT_REFUSED).
 *
 * Threads and locks: a waiter belongs to its connection's worker, which
 * alone creates, answers and frees it. The index (hash of waited keys,
 * namespace records, per-token counts, each worker's list of woken keys)
 * is shared, under one mutex. Lock order: the store's lock, then this
 * one (the hook takes it while the store lock is held); nothing calls
 * into the store, libevent or the kernel while holding it (the eventfd
 * write that wakes a worker comes after unlocking). See THREADS.md.
 */
#ifndef KVPOOL_SRV_MWAIT_H
#define KVPOOL_SRV_MWAIT_H

#include <stdbool.h>
#include <stdint.h>

#include "srv_match.h"
#include "srv_transport.h"
#include "store.h"

struct srv;
struct srv_conn;
struct srv_worker;
struct srv_mwait;
struct srv_mw;

/* A new, empty index for server s (s->workers need not exist yet).
 * NULL on -ENOMEM. Main thread. */
struct srv_mwait *srv_mwait_new(struct srv *s);

/* Free the index. Every worker has stopped and every connection is
 * closed (so no waiter is left). Accepts NULL. Main thread. */
void srv_mwait_free(struct srv_mwait *mw);

/* The store's event hook part (store_event_fn contract: store lock held,
 * any thread, never blocks): STORED (not an announce) wakes the waiters
 * of that key, CLEARED ends every wait in that namespace. Cheap when
 * nothing waits (one atomic load). */
void srv_mwait_hook(struct srv_mwait *mw, const struct store_event *e);

/* MATCHes waiting now in the whole server (any thread). */
uint64_t srv_mwait_waiting(const struct srv_mwait *mw);

/* Bytes the parked MATCHes hold now (records and keys; what
 * max_match_wait_bytes bounds). 0 for NULL. Any thread. */
uint64_t srv_mwait_bytes(const struct srv_mwait *mw);

/* The MATCH in hand on c (decoded into r by srv_match_decode, its keys
 * borrowed from c->body; c->hdr is its header): answer it now
 * (srv_match_answer), park it, or queue it behind the MATCHes already
 * queued on c. A parked or queued MATCH keeps a copy of r and its keys
 * and is answered later through srv_match_answer, with c->hdr set to its
 * request's header and r->flags telling how its wait ended.
 * Returns what the transport does next: SRV_NEXT_HEADER (answered, or
 * parked while the connection reads on), SRV_NEXT_WAIT (parked, and the
 * transport has no `kick`: it resumes through srv_conn_request_done when
 * the MATCH is answered), SRV_NEXT_ABORT (no memory for the reply).
 * Counts the MATCH's wait counters. Worker thread. */
enum srv_next srv_mwait_match(struct srv_conn *c, const struct srv_match_req *r);

/* Is the request whose header is in c->hdr_raw to be held behind c's
 * queued MATCHes? True, and it is held (the caller returns
 * SRV_NEXT_WAIT), when c has MATCHes queued and this frame is not a
 * well-formed MATCH header, or the queue is full; it is handled once
 * the last queued MATCH is answered (srv_transport.resume). Worker
 * thread. */
bool srv_mwait_hold_header(struct srv_conn *c);

/* The MATCH frame in hand (header and body read) is not one to queue
 * (its body does not decode): hold it until c's queued MATCHes are
 * answered, then handle it again (its error reply then goes out in
 * order). Returns SRV_NEXT_WAIT. Only when c has MATCHes queued.
 * Worker thread. */
enum srv_next srv_mwait_hold_frame(struct srv_conn *c);

/* Does c have MATCHes queued (parked, or waiting for their turn)? */
static inline bool srv_mwait_pending(const struct srv_conn *c);

/* c is closing: free its queued MATCHes (unparked, nothing answered).
 * Worker thread (srv_conn_release). */
void srv_mwait_conn_free(struct srv_conn *c);

/* Worker w was woken: handle the keys committed for its waiters. Cheap
 * when there are none. Worker thread (notify_cb). */
void srv_mwait_worker_run(struct srv_worker *w);

/* The server drains (SIGTERM): answer every MATCH waiting on w now
 * (WAIT_ENDED); MATCHes that come later are answered at once. Worker
 * thread. */
void srv_mwait_worker_drain(struct srv_worker *w);

/* SIGHUP reloaded the tokens: answer now (WAIT_ENDED) the waiting
 * MATCHes of every connection of w whose token no longer grants its
 * namespace as it did at HELLO; the others keep waiting. Worker thread. */
void srv_mwait_worker_recheck(struct srv_worker *w);

#include "srv_conn.h"

static inline bool srv_mwait_pending(const struct srv_conn *c)
{
	return c->mw_count != 0;
}

#endif /* KVPOOL_SRV_MWAIT_H */
