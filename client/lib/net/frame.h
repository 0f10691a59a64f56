/*
 * frame.h - the framing libkvpool shares between its transports and its
 * engine (internal): request headers, the checks of a reply header, the
 * decoding of an error reply, and the thread-local copy of the server's
 * last refusal message (kvpool_last_server_message).
 *
 * Threads: pure functions; the last-message copy is per thread.
 */
#ifndef KVC_FRAME_H
#define KVC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"
#include "proto.h"

/* Keys go on the wire as the caller gives them (server/srv_consts.c ties
 * the wire's to the pool's). */
_Static_assert(KVPOOL_KEY_BYTES == PROTO_KEY_BYTES, "a libkvpool key is a wire key");

#define KVC_MESSAGE_MAX_BYTES 1024            /* server error messages kept */
#define KVC_REPLY_BODY_MAX_BYTES (64u << 20) /* largest reply body accepted */

/* Encode a request header of protocol `version` (HELLO: PROTO_VERSION;
 * every other request: the version the connection agreed). */
void kvc_frame_request(uint8_t hdr[PROTO_HEADER_BYTES], uint8_t version, uint8_t op,
		       uint64_t request_id, uint32_t body_bytes, uint64_t payload_bytes);

/* Decode and check a reply header against the limits replies are held to.
 * Errors: -EOPNOTSUPP (another protocol version), -EPROTO (anything else
 * wrong, a body over KVC_REPLY_BODY_MAX_BYTES). */
int kvc_frame_reply(const uint8_t hdr[PROTO_HEADER_BYTES], const struct proto_limits *lim,
		    struct proto_header *h);

/* Is h an error reply (a status other than OK and EXISTS)? */
int kvc_frame_is_error(const struct proto_header *h);

/* Decode the error reply h + body: *err receives the whole-request status
 * as -errno, msg (KVC_MESSAGE_MAX_BYTES + 1 bytes) the server's message,
 * *reconnect 1 when the server may close after it (BAD_REQUEST,
 * UNSUPPORTED; unchanged otherwise). Errors: -EPROTO (malformed). */
int kvc_frame_error(const struct proto_header *h, const uint8_t *body, int *err, char *msg,
		    int *reconnect);

/* Set the calling thread's kvpool_last_server_message (NULL: ""). */
void kvc_frame_set_last_message(const char *msg);

/* Set it to msg only when msg has words and it holds none yet: a poll
 * that returns several completions keeps the first refusal's words (the
 * poll clears it first). */
void kvc_frame_first_message(const char *msg);

#endif /* KVC_FRAME_H */
