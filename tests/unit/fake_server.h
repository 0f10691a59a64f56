/*
 * fake_server.h - a small fake kvpoold for the unit tests of libkvpool and
 * of the kvpool CLI: protocol v1 on a loopback port (v2 when its limits
 * say version 2), one thread per connection, blocks kept in memory in one
 * store (whatever the namespace).
 *
 * It answers HELLO, PUT, GET, EXISTS, DELETE, MATCH, DROP_NAMESPACE, STATS
 * and PING the way the real server does, and its modes misbehave on
 * purpose (wrong ids, truncated or corrupted replies, silence, BUSY...)
 * so that the client's error paths can be driven.
 *
 * Threads: the test thread starts and stops it; the counters are atomics
 * or are read once the requests under test have been answered (a client
 * call returns only after its reply).
 */
#ifndef KVPOOL_TEST_FAKE_SERVER_H
#define KVPOOL_TEST_FAKE_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "proto.h"

enum fake_mode {
	MODE_NORMAL,
	MODE_STATUSES,      /* PUT/EXISTS results take statuses from a table */
	MODE_WRONG_ID,      /* replies echo a wrong request id */
	MODE_TRUNCATE_GET,  /* GET reply stops half way through its payload */
	MODE_CORRUPT_GET,   /* GET reply flips a payload byte */
	MODE_SILENT,        /* requests after HELLO get no reply */
	MODE_CLOSE,         /* the next request closes the connection */
	MODE_REFUSE,        /* batch requests get a whole-request BUSY */
	MODE_HOLD,          /* read `hold` requests before answering any */
	MODE_HELLO_DENIED,  /* HELLO answered DENIED */
	MODE_HELLO_OLD,     /* HELLO answered UNSUPPORTED */
	MODE_GET_TOO_LARGE, /* GET answers every stored block TOO_LARGE */
	MODE_HOLD_REVERSE,  /* as MODE_HOLD, then answers them newest first */
};

#define FAKE_MAX_BLOCKS 1024
#define FAKE_MAX_CONNS 64
#define FAKE_MAX_HOLD 8
#define FAKE_CAPACITY_BYTES (4 << 20) /* tiers.dram.capacity_bytes in STATS */
#define FAKE_BUSY_MESSAGE "in-flight put bytes at limit"

struct fake_block {
	uint8_t key[PROTO_KEY_BYTES];
	uint8_t *data;
	uint64_t len;
};

struct fake;

/* One accepted connection and the thread that serves it. */
struct fake_conn {
	struct fake *fk;
	int fd;             /* -1 once the serving thread has closed it */
	pthread_t thr;
};

struct fake {
	int lfd;
	uint16_t port;
	pthread_t thr;                      /* accepts connections */
	pthread_mutex_t lock;               /* everything below that is not atomic */
	atomic_int mode;
	atomic_int connections;             /* accepted so far */
	atomic_int frames[PROTO_OP_MAX + 1];/* requests received, per opcode */
	atomic_int put_blocks;              /* PUT entries received */
	atomic_int busy_puts;               /* answer the next N PUT entries BUSY */
	atomic_int refuse_next;             /* refuse the next N batch requests BUSY */
	atomic_int busy_connects;           /* turn the next N connections away BUSY */
	atomic_int check_parents;           /* PUT: NO_PARENT when the parent is not stored */
	atomic_int get_hits;                /* GET entries found (as the server counts) */
	int hold;                           /* MODE_HOLD: requests to read first */
	struct proto_hello_reply limits;    /* sent in HELLO replies; version is the
					       highest the fake speaks (1 or 2) */
	/* Protocol v2 (limits.version 2): what the fake answers, and what it
	 * was last asked, so that tests see the library's encoding. */
	uint8_t put_flags;                  /* PUT results: flags of every OK/EXISTS block */
	uint32_t put_retain_ms;             /* ... and their retain_ms */
	struct proto_match_reply match_v2;  /* MATCH: flags, retained and retain_ms sent */
	uint32_t match_cut;                 /* MATCH: answer this many fewer than present
					       (with match_v2.flags LEASE_CUT) */
	uint32_t last_put_retain_ms;        /* retain_ms of the last PUT entry received */
	uint8_t last_match_version;         /* header version of the last MATCH */
	uint32_t last_match_count;          /* its keys */
	struct proto_match_opts last_match_opts; /* its options (zero in v1) */
	uint32_t last_match_lease_ms;
	char hello_ns[PROTO_NAME_MAX_BYTES + 1];  /* of the last HELLO */
	char hello_token[64];
	uint16_t status_table[PROTO_STATUS_MAX + 1];
	int n_status;
	int status_next;   /* MODE_STATUSES: next table entry to answer with */
	struct fake_block blocks[FAKE_MAX_BLOCKS];
	int n_blocks;
	struct fake_conn conns[FAKE_MAX_CONNS];
	int n_conns;
};

/* Limits the tests start from: 4 blocks per frame, 64 KiB blocks. */
extern const struct proto_hello_reply fake_default_limits;

/* Listen on 127.0.0.1:port (0: any free port; fk->port receives it) and
 * serve in threads. fk must be zeroed or stopped, with limits and mode
 * set. Fails the running test if the socket cannot be set up. */
void fake_start(struct fake *fk, uint16_t port);

/* Stop serving: close the listener and every connection, join every
 * thread. The stored blocks are kept (fake_release frees them). */
void fake_stop(struct fake *fk);

/* Free the stored blocks. Call after fake_stop. */
void fake_release(struct fake *fk);

#endif /* KVPOOL_TEST_FAKE_SERVER_H */
