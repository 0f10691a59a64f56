/*
 * frame.c - request headers, reply-header checks, error replies, and the
 * thread's last server message (frame.h).
 */
#include "frame.h"

#include <errno.h>
#include <string.h>

void kvc_frame_request(uint8_t hdr[PROTO_HEADER_BYTES], uint8_t version, uint8_t op,
		       uint64_t request_id, uint32_t body_bytes, uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC,
		.version = version,
		.opcode = op,
		.body_bytes = body_bytes,
		.request_id = request_id,
		.payload_bytes = payload_bytes,
	};

	proto_header_encode(&h, hdr);
}

int kvc_frame_reply(const uint8_t hdr[PROTO_HEADER_BYTES], const struct proto_limits *lim,
		    struct proto_header *h)
{
	int rc = proto_header_decode(hdr, 1, lim, h);

	if (rc)
		return rc == -EPROTONOSUPPORT ? -EOPNOTSUPP : -EPROTO;
	if (h->body_bytes > KVC_REPLY_BODY_MAX_BYTES)
		return -EPROTO;
	return 0;
}

int kvc_frame_is_error(const struct proto_header *h)
{
	return h->status != PROTO_STATUS_OK && h->status != PROTO_STATUS_EXISTS;
}

int kvc_frame_error(const struct proto_header *h, const uint8_t *body, int *err, char *msg,
		    int *reconnect)
{
	uint16_t min_v, max_v;
	const char *text;
	uint32_t text_bytes;
	int e;

	if (h->payload_bytes ||
	    proto_error_decode(body, h->body_bytes, &min_v, &max_v, &text, &text_bytes))
		return -EPROTO;
	if (text_bytes > KVC_MESSAGE_MAX_BYTES)
		text_bytes = KVC_MESSAGE_MAX_BYTES;
	memcpy(msg, text, text_bytes);
	msg[text_bytes] = '\0';
	/* After these the server may close: start afresh at the next call. */
	if (h->status == PROTO_STATUS_BAD_REQUEST || h->status == PROTO_STATUS_UNSUPPORTED)
		*reconnect = 1;
	e = proto_status_to_errno(h->status);
	*err = e ? e : -EPROTO;
	return 0;
}

/* The last refusal handed to this thread, for kvpool_last_server_message
 * (kvpool_connect has no handle to keep it in). */
static __thread char last_server_message[KVC_MESSAGE_MAX_BYTES + 1];

void kvc_frame_set_last_message(const char *msg)
{
	size_t n = msg ? strnlen(msg, KVC_MESSAGE_MAX_BYTES) : 0;

	memcpy(last_server_message, msg ? msg : "", n);
	last_server_message[n] = '\0';
}

void kvc_frame_first_message(const char *msg)
{
	if (msg && msg[0] && !last_server_message[0])
		kvc_frame_set_last_message(msg);
}

const char *kvpool_last_server_message(void)
{
	return last_server_message;
}
