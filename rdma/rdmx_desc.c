/*
 * rdmx_desc.c - remote-buffer descriptors and RDMA control-message sizes:
 * pure byte layout, built with and without RDMA support.
 */
#include <errno.h>

#include "rdmx.h"

void rdmx_desc_encode(const struct rdmx_desc *d, uint8_t out[RDMX_DESC_BYTES])
{
	proto_put_u64(out, d->addr);
	proto_put_u32(out + 8, d->rkey);
	proto_put_u32(out + 12, d->length);
}

void rdmx_desc_decode(const uint8_t in[RDMX_DESC_BYTES], struct rdmx_desc *d)
{
	d->addr = proto_get_u64(in);
	d->rkey = proto_get_u32(in + 8);
	d->length = proto_get_u32(in + 12);
}

size_t rdmx_msg_bytes(const struct proto_header *h, uint32_t desc_count)
{
	return PROTO_HEADER_BYTES + (size_t)h->body_bytes + (size_t)desc_count * RDMX_DESC_BYTES;
}

int rdmx_msg_descs(const uint8_t *msg, size_t msg_bytes, const struct proto_header *h,
		   uint32_t count, const uint8_t **descs)
{
	size_t want = rdmx_msg_bytes(h, count);

	if (want > RDMX_MSG_MAX_BYTES)
		return -EMSGSIZE;
	if (msg_bytes != want)
		return -EPROTO;
	*descs = msg + PROTO_HEADER_BYTES + h->body_bytes;
	return 0;
}

uint32_t rdmx_max_batch(uint32_t entry_bytes)
{
	return (RDMX_MSG_MAX_BYTES - PROTO_HEADER_BYTES - PROTO_BATCH_PREFIX_BYTES) /
	       (entry_bytes + RDMX_DESC_BYTES);
}
