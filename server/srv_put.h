/*
 * srv_put.h - PUT on a worker thread: reserve arena space for every block,
 * receive the payload straight into it, commit in order, reply.
 *
 * Over TCP each block's xxh3 is computed chunk by chunk right after each
 * readv, while the bytes are in cache, and handed to the store at commit
 * (store_put_commit_hashed) instead of reading the block a second time.
 *
 * Blocks that are refused at reservation (EXISTS, BUSY, FULL, NO_PARENT,
 * ...) have their bytes read into the worker's scratch buffer and
 * dropped. Nothing becomes visible before the whole payload has arrived:
 * commits happen in block order after the last byte, so a connection that
 * dies half way leaves nothing visible (srv_put_abort).
 */
#ifndef KVPOOL_SRV_PUT_H
#define KVPOOL_SRV_PUT_H

#include "srv_conn.h"

/* The PUT body is in c->body: validate it and reserve every block. Over
 * RDMA (c->rdma_descs set) each descriptor's length must equal its
 * block's length, else BAD_REQUEST and nothing is reserved.
 * Returns SRV_NEXT_PAYLOAD to receive the payload, or SRV_NEXT_SKIP after
 * queueing a whole-request error reply (the payload is then discarded),
 * or SRV_NEXT_ABORT. */
enum srv_next srv_put_start(struct srv_conn *c);

/* Every byte of the PUT in progress is in its reservation (the payload
 * was read, or an RDMA READ completed): commit the blocks in order (each
 * commit verifies the checksum) and queue the reply with per-block
 * results; the latency counted is from start_us. Errors: -ENOMEM (the
 * reply could not be queued; the reservations are then aborted). */
int srv_put_finish(struct srv_conn *c, uint64_t start_us);

/* Read what is available of the payload (one readv). *want receives the
 * bytes asked for. Returns the bytes read (> 0), 0 on EOF, or -errno
 * (-EAGAIN: nothing to read now; -ENOMEM: the reply could not be queued).
 * When the last byte has arrived it commits every block, queues the reply
 * and sets *done to 1 (else 0). */
long srv_put_read(struct srv_conn *c, size_t *want, int *done);

/* Abort every reservation of the PUT in progress (connection closing).
 * Safe when no PUT is in progress. */
void srv_put_abort(struct srv_conn *c);

/* Free c's PUT receive state (slots, hash state) when c itself is freed,
 * after srv_put_abort. Safe when c never saw a PUT. */
void srv_put_free(struct srv_conn *c);

#endif /* KVPOOL_SRV_PUT_H */
