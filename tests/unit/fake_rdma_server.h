/*
 * fake_rdma_server.h - a small fake kvpoold RDMA endpoint for the unit
 * tests of libkvpool's RDMA path: one thread running rdma/'s listener,
 * worker and connections over the loopback fake verbs (fake_verbs.h),
 * decoding request messages with proto/ and keeping blocks in its arena.
 *
 * It answers HELLO, PUT and GET as PROTOCOL.md section 13 says: a PUT's
 * bytes are pulled with RDMA READ from the client's descriptors into the
 * arena, and are checked and stored only once the READ has completed; a
 * GET's bytes are pushed with RDMA WRITE into the client's descriptors
 * before the reply is sent. Other requests are answered UNSUPPORTED.
 * Requests that arrive while a transfer runs are queued (up to
 * RDMX_MSG_DEPTH, the client's credit) and answered in order.
 *
 * Threads: the test thread starts and stops it; the counters are atomics,
 * read after the client call under test has returned.
 */
#ifndef KVPOOL_TEST_FAKE_RDMA_SERVER_H
#define KVPOOL_TEST_FAKE_RDMA_SERVER_H

#ifdef KVPOOL_RDMA

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "proto.h"
#include "rdmx.h"

#define FRS_ARENA_BYTES (4u << 20)
#define FRS_MAX_BLOCKS 2048
#define FRS_MAX_CONNS 8
#define FRS_MAX_DESCS 2048

struct frs_block {
	uint8_t key[PROTO_KEY_BYTES];
	uint64_t off, len, checksum;
};

struct frs_conn;

struct fake_rdma_server {
	/* Settings (before frs_start). */
	struct proto_hello_reply limits;    /* sent in HELLO replies */
	uint16_t port;                      /* rdma_port to listen on */
	/* Misbehaviour (any time). */
	atomic_int corrupt_get;             /* GET results carry a wrong checksum */
	atomic_int drop_next;               /* close the connection at the next PUT/GET */
	atomic_int drop_idle;               /* close every connection now, between requests */
	atomic_int silent;                  /* PUT/GET requests get no answer at all */

	/* Observations. */
	atomic_int accepted, closed;        /* connections */
	atomic_int msgs[PROTO_OP_MAX + 1];  /* request messages, per opcode */
	atomic_int put_blocks, get_blocks;  /* entries received */
	atomic_uint_fast64_t read_bytes, write_bytes; /* moved by completed transfers */
	uint64_t desc_addr[FRS_MAX_DESCS];  /* addresses of the descriptors received, */
	atomic_int n_desc;                  /* ... in order (the first FRS_MAX_DESCS) */
	atomic_int max_queued;              /* most requests waiting behind a transfer */
	char hello_ns[PROTO_NAME_MAX_BYTES + 1];

	/* Internal. */
	struct rdmx_listener *l;
	struct rdmx_worker *w;
	struct frs_conn *conns[FRS_MAX_CONNS];
	pthread_t thr;
	atomic_int stop;
	uint8_t *arena;
	uint64_t arena_used;
	struct frs_block blocks[FRS_MAX_BLOCKS];
	int n_blocks;
};

/* Open the listener on 127.0.0.1:fs->port with the loopback fake (the
 * caller has called fake_verbs_reset() and set loopback) and serve in a
 * thread. Fails the running test if it cannot. */
void frs_start(struct fake_rdma_server *fs);

/* Stop: join the thread, close every connection, the worker and the
 * listener, free the arena. */
void frs_stop(struct fake_rdma_server *fs);

/* Did a stored block's bytes equal data[0..len)? (For byte-exact checks.) */
int frs_has(const struct fake_rdma_server *fs, const uint8_t key[PROTO_KEY_BYTES],
	    const void *data, uint64_t len);

#endif /* KVPOOL_RDMA */
#endif /* KVPOOL_TEST_FAKE_RDMA_SERVER_H */
