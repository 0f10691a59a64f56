/*
 * session.h - what one connection to one kvpoold is about, whatever its
 * transport (internal): the URL, namespace and token, the connection
 * (a kvc_link of the peer the URL names), HELLO and the limits it
 * adopted, reconnecting (with backoff when the server turns us away
 * BUSY), auto:// moving to RDMA, the registered memory, and the counters
 * kvpool_get_counters reports.
 *
 * Connecting blocks (up to a deadline); everything else here does not.
 * HELLO is said here, the same way on every transport.
 *
 * Threads: one at a time (the engine's lock, or its connecting flag).
 */
#ifndef KVC_SESSION_H
#define KVC_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "kvpool.h"
#include "lib/url.h"
#include "proto.h"
#include "regions.h"
#include "transport.h"

struct kvc_tls_ctx;
struct kvc_session {
	struct kvc_url url;
	char ns[PROTO_NAME_MAX_BYTES + 1];
	uint16_t ns_len;
	char *token;                    /* NULL when none */
	uint16_t token_len;
	uint32_t timeout_ms;            /* 0 = KVPOOL_DEFAULT_TIMEOUT_MS */
	uint32_t busy_tries;            /* 0 = KVPOOL_BUSY_TRIES */
	struct kvc_tls_ctx *tls;        /* tls://: the handle's TLS settings (a reference) */

	struct kvc_link link;           /* link.t NULL when disconnected */
	struct kvc_regions regions;     /* kvpool_register'ed memory */
	struct kvpool_limits limits;    /* from the last HELLO reply */
	struct proto_limits reply_limits; /* what replies are checked against */
	int reconnect_next;             /* drop the connection before the next request */
	uint64_t next_request_id;

	uint64_t connects;              /* connections that completed HELLO */
	uint64_t rdma_connects;         /* of those, over RDMA */
	uint64_t busy_retries;          /* tries repeated after BUSY */
	uint64_t checksum_errors;       /* GET blocks that failed verification */
	char server_message[KVC_MESSAGE_MAX_BYTES + 1]; /* the last refusal's words */
	int transport_logged;           /* auto://: last outcome said (0, KVC_TRANSPORT_*) */

	uint8_t *buf;                   /* HELLO scratch */
	size_t buf_cap;
};

/* Set up a session (nothing is connected). The strings are copied; tls
 * (may be NULL; needed for a tls:// URL) gets a reference of the
 * session's. Errors: -EINVAL (bad URL, a namespace that is not 1..255
 * printable ASCII bytes, a token over PROTO_TOKEN_MAX_BYTES, a tls:// URL
 * without tls), -EOPNOTSUPP (a scheme other than tcp://, tls://, rdma://,
 * auto://), -ENOMEM. On error nothing is left to free. */
int kvc_session_init(struct kvc_session *s, const char *url, const char *ns, const char *token,
		     uint32_t timeout_ms, struct kvc_tls_ctx *tls);

/* Disconnect and free what the session holds (not s itself). */
void kvc_session_free(struct kvc_session *s);

/* The per-request timeout in ms (the default for 0). */
uint32_t kvc_session_timeout(const struct kvc_session *s);

/* Is the session connected? */
int kvc_session_connected(const struct kvc_session *s);

/* Before requests go on an idle connection: drop it when the server
 * asked for a fresh one or it went stale (the server closed it while
 * idle), so that the request does not fail because of it. Never blocks. */
void kvc_session_check(struct kvc_session *s);

/* Connect and say HELLO (auto://: then move to RDMA when offered), with
 * backoff while the server turns the connection away BUSY, before
 * deadline_ms. Blocks. On error the session is left disconnected.
 * Errors: the shared connection errors of kvpool.h, -EOPNOTSUPP
 * (protocol version; rdma:// without RDMA), -EACCES (HELLO refused),
 * -ENOENT (host does not resolve), -ENODEV/-EPERM (rdma://). */
int kvc_session_connect(struct kvc_session *s, uint64_t deadline_ms);

/* Close the connection (if any); the next kvc_session_connect opens one. */
void kvc_session_disconnect(struct kvc_session *s);

/* A fresh request id (never 0). */
uint64_t kvc_session_request_id(struct kvc_session *s);

/* The protocol version the connection's requests carry: the one HELLO
 * agreed (1 or 2; 1 before any HELLO). */
uint8_t kvc_session_version(const struct kvc_session *s);

/* Test hook: the highest protocol version HELLO offers (0, the default:
 * PROTO_VERSION_MAX), so that tests can play a v1 client against a v2
 * server. Set it before connecting. Not exported by libkvpool.so. */
extern uint16_t kvc_test_max_version;

#endif /* KVC_SESSION_H */
