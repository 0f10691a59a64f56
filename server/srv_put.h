/*
 * srv_put.h - PUT on a worker thread: reserve arena space for every block,
 * let the transport bring the payload straight into it, commit in order,
 * reply.
 *
 * Where the bytes pass through the CPU (TCP, srv_transport.put_hashes)
 * each block's xxh3 is computed chunk by chunk as the transport reports
 * them (srv_put_received), while they are in cache, and handed to the
 * store at commit (store_put_commit_hashed) instead of reading the block
 * a second time.
 *
 * Blocks that are refused at reservation (EXISTS, BUSY, FULL, NO_PARENT,
 * ...) have their bytes read into the worker's scratch buffer and
 * dropped. Nothing becomes visible before the whole payload has arrived:
 * commits happen in block order after the last byte, so a connection that
 * dies half way leaves nothing visible (srv_put_abort).
 */
#ifndef KVPOOL_SRV_PUT_H
#define KVPOOL_SRV_PUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "srv_conn.h"

struct iovec;

/* The PUT body is in c->body: validate it and reserve every block. Where
 * the transport has a buffer of the peer's per block (entry_room: an RDMA
 * descriptor) its size must equal the block's length, else BAD_REQUEST
 * and nothing is reserved. Returns SRV_NEXT_PAYLOAD for the transport to
 * fetch the payload (srv_put_iov / srv_put_received, or a transfer into
 * each slot's dst), then srv_put_finish; or SRV_NEXT_SKIP after
 * queueing a whole-request error reply (the payload is then discarded),
 * or SRV_NEXT_ABORT. */
enum srv_next srv_put_start(struct srv_conn *c);

/* Every byte of the PUT in progress is in its reservation (the payload
 * was read, or an RDMA READ completed): commit the blocks in order (each
 * commit verifies the checksum) and queue the reply with per-block
 * results; the latency counted is from start_us. Errors: -ENOMEM (the
 * reply could not be queued; the reservations are then aborted). */
int srv_put_finish(struct srv_conn *c, uint64_t start_us);

/* Fill iov[0..max_iov) with where the next payload bytes of the PUT in
 * progress go, from the current block on (the arena for reserved blocks;
 * the worker's scratch buffer, shared, for refused ones, whose bytes are
 * dropped). *want receives the bytes they cover. Returns the iovec count
 * (>= 1 while bytes are missing). Cannot fail. */
int srv_put_iov(struct srv_conn *c, struct iovec *iov, int max_iov, size_t *want);

/* n bytes have landed where srv_put_iov said: account them to the blocks
 * in order, hashing each byte once (put_hashes). Returns true when the
 * whole payload is in (then call srv_put_finish). Cannot fail. */
bool srv_put_received(struct srv_conn *c, uint64_t n);

/* Abort every reservation of the PUT in progress (connection closing).
 * Safe when no PUT is in progress. */
void srv_put_abort(struct srv_conn *c);

/* Free c's PUT receive state (slots, hash state) when its transport
 * closes, after srv_put_abort. Safe when c never saw a PUT. */
void srv_put_free(struct srv_conn *c);

#endif /* KVPOOL_SRV_PUT_H */
