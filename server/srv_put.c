/*
 * srv_put.c - PUT: reserve, receive straight into the arena, commit. The
 * transport fetches the bytes (srv_transport.h); nothing here reads a
 * socket or posts a transfer.
 */
#include "srv_put.h"
#include "srv_request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include "proto_xxh3.h" /* XXH3 entry points, AVX2 / AVX-512 where the CPU has them */

#include "srv_clock.h"
#include "srv_server.h"
#include "srv_worker.h"
#include "store.h"

/* Make room for `count` slots. Errors: -ENOMEM. */
static int slots_reserve(struct srv_conn *c, uint32_t count)
{
	struct srv_put_slot *p;

	if (count <= c->slots_cap)
		return 0;
	p = realloc(c->slots, (size_t)count * sizeof(*p));
	if (!p)
		return -ENOMEM;
	c->slots = p;
	c->slots_cap = count;
	return 0;
}

/* Where the payload passes through the CPU (TCP: put_hashes) it is
 * hashed as it arrives: the connection's XXH3 state, allocated at its
 * first PUT (XXH3_createState mallocs 576 bytes, 64-aligned: once per
 * connection, not per request). RDMA READs land without us seeing them,
 * so the store hashes those at commit. Errors: -ENOMEM. */
static int hash_state_get(struct srv_conn *c)
{
	if (!c->ops->put_hashes || c->put_hash)
		return 0;
	c->put_hash = XXH3_createState();
	return c->put_hash ? 0 : -ENOMEM;
}

/* Index of the earlier block of this batch whose key is slot i's parent,
 * or -1. The parent is usually the block just before, so look there
 * first. */
static long parent_in_batch(const struct srv_conn *c, uint32_t i)
{
	const uint8_t *parent = c->slots[i].e.parent;

	if (!(c->slots[i].e.flags & PROTO_PUT_HAS_PARENT))
		return -1;
	for (uint32_t j = i; j-- > 0;)
		if (!memcmp(c->slots[j].e.key, parent, PROTO_KEY_BYTES))
			return j;
	return -1;
}

/* Reserve arena space for slot i, or record why it is refused. A block
 * whose in-batch parent was refused cannot be stored: NO_PARENT without
 * asking the store. A parent still being received is checked at commit
 * (STORE_PUT_PARENT_IN_BATCH). */
static void slot_begin(struct srv_conn *c, uint32_t i)
{
	struct srv_put_slot *sl = &c->slots[i];
	struct store *s = c->w->srv->store;
	const uint8_t *parent = sl->e.flags & PROTO_PUT_HAS_PARENT ? sl->e.parent : NULL;
	long j = parent_in_batch(c, i);
	uint32_t flags = 0;
	void *dst;
	int rc;

	sl->block = NULL;
	sl->dst = NULL;
	sl->hashed = 0;
	if (j >= 0) {
		uint16_t ps = c->slots[j].status;

		if (ps != PROTO_STATUS_OK && ps != PROTO_STATUS_EXISTS) {
			sl->status = PROTO_STATUS_NO_PARENT;
			return;
		}
		if (c->slots[j].block)
			flags = STORE_PUT_PARENT_IN_BATCH;
	}
	/* charged to the writer's tenant, whoever created the namespace */
	rc = store_put_begin_for(s, c->ns_id, sl->e.key, parent, flags, sl->e.length,
				 sl->e.checksum, c->tenant, &sl->block, &dst);
	if (rc == 0) {
		sl->dst = dst;
		sl->status = PROTO_STATUS_OK;
	} else {
		sl->status = rc == -EEXIST ? PROTO_STATUS_EXISTS : proto_status_from_errno(rc);
	}
}

/* Did every one of the count slots get QUOTA (no reservation held)? Then
 * msg says which limit: the token's tenant_max_bytes, or the namespace's
 * [quota]. */
static bool put_all_quota(struct srv_conn *c, uint32_t count, char *msg, size_t cap)
{
	uint64_t need = 0, billed = 0, max = c->w->srv->conf.tenant_max_bytes;

	for (uint32_t i = 0; i < count; i++) {
		if (c->slots[i].status != PROTO_STATUS_QUOTA)
			return false;
		need += c->slots[i].e.length;
	}
	if (c->tenant)
		store_tenant_usage(c->w->srv->store, c->tenant, &billed, NULL);
	if (c->tenant && max && billed + need > max)
		(void)snprintf(msg, cap, "tenant_max_bytes %" PRIu64 ": the token has written %"
			       PRIu64 " bytes and its own evictable blocks in %.100s cannot make "
			       "room for %" PRIu64 " more", max, billed, c->ns_name, need);
	else
		(void)snprintf(msg, cap, "namespace %.100s is at its [quota] and its evictable "
			       "blocks cannot make room for %" PRIu64 " bytes", c->ns_name, need);
	return true;
}

/* Refuse the whole request: error reply, then discard the payload. */
static enum srv_next put_refuse(struct srv_conn *c, uint16_t status, const char *msg,
				uint32_t index)
{
	int rc;

	if (index != UINT32_MAX)
		rc = srv_conn_reply_error(c, status, SRV_QUOTE_BODY, "block %u: %s", index, msg);
	else
		rc = srv_conn_reply_error(c, status, SRV_QUOTE_BODY, "%s", msg);
	srv_stats_add(&c->w->stats, SRV_C_put_errors, 1);
	c->skip_bytes = c->hdr.payload_bytes;
	return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_SKIP;
}

/* Decode every entry into the slots. Returns UINT32_MAX, or the index of
 * the first entry that does not decode. */
static uint32_t put_decode(struct srv_conn *c, const struct proto_batch *b)
{
	for (uint32_t i = 0; i < b->count; i++)
		if (proto_put_entry_decode(b, i, &c->slots[i].e) < 0)
			return i;
	return UINT32_MAX;
}

/* Where the transport has a buffer of the peer's per block (RDMA: a
 * descriptor), its size must be the block's length (PROTOCOL.md section
 * 13), checked before anything is reserved. Returns UINT32_MAX, or the
 * index of the first mismatch with the reason in msg. */
static uint32_t put_room_check(const struct srv_conn *c, uint32_t count, char *msg, size_t cap)
{
	uint64_t room;

	if (!c->ops->entry_room)
		return UINT32_MAX;
	for (uint32_t i = 0; i < count; i++) {
		if (c->ops->entry_room(c, i, &room) && room != c->slots[i].e.length) {
			snprintf(msg, cap, "descriptor length %" PRIu64 " is not the block length %"
				 PRIu64, room, c->slots[i].e.length);
			return i;
		}
	}
	return UINT32_MAX;
}

/* The first entry of a well-formed v1 PUT body whose offset 84 (v1:
 * reserved; v2: retain_ms) is not 0, or UINT32_MAX. */
static uint32_t v1_retain_entry(const uint8_t *body, size_t body_bytes)
{
	uint32_t count;

	if (body_bytes < PROTO_BATCH_PREFIX_BYTES)
		return UINT32_MAX;
	count = proto_get_u32(body);
	if ((uint64_t)body_bytes != PROTO_BATCH_PREFIX_BYTES +
				    (uint64_t)count * PROTO_PUT_ENTRY_BYTES)
		return UINT32_MAX;
	for (uint32_t i = 0; i < count; i++)
		if (proto_get_u32(body + PROTO_BATCH_PREFIX_BYTES +
				  (size_t)i * PROTO_PUT_ENTRY_BYTES + 84))
			return i;
	return UINT32_MAX;
}

enum srv_next srv_put_start(struct srv_conn *c)
{
	const struct proto_limits *l = &c->w->srv->limits;
	struct proto_batch b;
	uint32_t bad = 0;
	uint16_t status;
	char msg[400];
	int rc;

	rc = proto_batch_decode_v(c->body, c->hdr.body_bytes, PROTO_PUT_ENTRY_BYTES, c->hdr.version,
				  l, &b);
	if (rc == -EMSGSIZE) {
		snprintf(msg, sizeof(msg), "batch of %u blocks exceeds max_batch_blocks %u",
			 proto_get_u32(c->body), l->max_batch_blocks);
		return put_refuse(c, PROTO_STATUS_TOO_LARGE, msg, UINT32_MAX);
	}
	if (rc == -EPROTO && c->hdr.version < 2 &&
	    (bad = v1_retain_entry(c->body, c->hdr.body_bytes)) != UINT32_MAX) {
		/* PROTOCOL.md 6.2: a refusal names the entry it is about */
		snprintf(msg, sizeof(msg), "entry %u: retain_ms (offset 84) is reserved in "
			 "protocol version 1 and must be 0; retain with version 2", bad);
		return put_refuse(c, PROTO_STATUS_BAD_REQUEST, msg, UINT32_MAX);
	}
	if (rc < 0 || b.aux != 0)
		return put_refuse(c, PROTO_STATUS_BAD_REQUEST, "malformed put batch", UINT32_MAX);
	rc = proto_put_batch_check(&b, c->hdr.payload_bytes, l, &bad);
	if (rc == -EMSGSIZE) {
		struct proto_put_entry e;

		proto_put_entry_decode(&b, bad, &e);
		snprintf(msg, sizeof(msg), "block %u of %" PRIu64 " bytes exceeds max_block_bytes %"
			 PRIu64, bad, e.length, l->max_block_bytes);
		return put_refuse(c, PROTO_STATUS_TOO_LARGE, msg, UINT32_MAX);
	}
	if (rc < 0)
		return put_refuse(c, PROTO_STATUS_BAD_REQUEST,
				  "zero length, bad flags, or lengths not adding up to payload_bytes",
				  bad);
	if (slots_reserve(c, b.count) < 0 || hash_state_get(c) < 0)
		return SRV_NEXT_ABORT;
	bad = put_decode(c, &b);
	if (bad != UINT32_MAX)
		return put_refuse(c, PROTO_STATUS_BAD_REQUEST, "nonzero reserved bytes or unknown flags",
				  bad);
	bad = put_room_check(c, b.count, msg, sizeof(msg));
	if (bad != UINT32_MAX)
		return put_refuse(c, PROTO_STATUS_BAD_REQUEST, msg, bad);
	/* the first PUT creates the namespace HELLO named */
	status = srv_conn_ns_create(c, msg, sizeof(msg));
	if (status != PROTO_STATUS_OK)
		return put_refuse(c, status, msg, UINT32_MAX);
	c->put_count = b.count;
	for (uint32_t i = 0; i < b.count; i++)
		slot_begin(c, i);
	/* every block refused for a byte limit: refuse the request with
	 * the reason (a batch's per-block statuses carry no text) */
	if (put_all_quota(c, b.count, msg, sizeof(msg)))
		return put_refuse(c, PROTO_STATUS_QUOTA, msg, UINT32_MAX);
	c->put_cur = 0;
	c->put_off = 0;
	return SRV_NEXT_PAYLOAD;
}

int srv_put_iov(struct srv_conn *c, struct iovec *iov, int max_iov, size_t *want)
{
	uint64_t off = c->put_off;
	int n = 0;

	*want = 0;
	for (uint32_t i = c->put_cur; i < c->put_count && n < max_iov; i++, off = 0) {
		struct srv_put_slot *sl = &c->slots[i];
		uint64_t left = sl->e.length - off;

		if (sl->dst) {
			iov[n].iov_base = sl->dst + off;
		} else {
			iov[n].iov_base = c->w->scratch;
			if (left > SRV_SCRATCH_BYTES)
				left = SRV_SCRATCH_BYTES;
		}
		iov[n].iov_len = left;
		*want += left;
		n++;
		if (!sl->dst && left == SRV_SCRATCH_BYTES)
			break; /* the rest of this block needs another read */
	}
	return n;
}

/* Feed the n bytes of the current block that just landed at put_off
 * into its running xxh3, while they are still in cache; keep the digest
 * once the block is whole. Bytes of refused blocks are not looked at. */
static void put_hash(struct srv_conn *c, struct srv_put_slot *sl, uint64_t n)
{
	if (!sl->dst)
		return;
	/* The state only fails on NULL arguments, which these are not. */
	if (c->put_off == 0)
		(void)XXH3_64bits_reset(c->put_hash);
	(void)XXH3_64bits_update(c->put_hash, sl->dst + c->put_off, n);
	if (c->put_off + n == sl->e.length) {
		sl->sum = XXH3_64bits_digest(c->put_hash);
		sl->hashed = 1;
	}
}

bool srv_put_received(struct srv_conn *c, uint64_t n)
{
	while (n && c->put_cur < c->put_count) {
		struct srv_put_slot *sl = &c->slots[c->put_cur];
		uint64_t left = sl->e.length - c->put_off;

		put_hash(c, sl, n < left ? n : left);
		if (n < left) {
			c->put_off += n;
			return false;
		}
		n -= left;
		c->put_cur++;
		c->put_off = 0;
	}
	return c->put_cur >= c->put_count;
}

/* Commit slot i (if it holds a reservation) and write its result. */
static void put_commit_one(struct srv_conn *c, uint32_t i, uint8_t *body)
{
	struct srv_put_slot *sl = &c->slots[i];
	struct srv_stats *st = &c->w->stats;
	struct proto_result r = { 0 };
	struct store_retain_res rr = { 0, 0 };

	if (sl->block) {
		/* v2: the retention the entry asked for is taken under the
		 * commit's lock hold, so the block cannot be evicted between
		 * (on EXISTS, the stored block's retention is extended) */
		struct store *s = c->w->srv->store;
		int rc = store_put_commit_retain_by(s, sl->block, sl->hashed ? &sl->sum : NULL,
						    sl->e.retain_ms, c->tenant, &rr);

		sl->block = NULL;
		sl->dst = NULL;
		sl->status = rc == 0 ? PROTO_STATUS_OK :
			     rc == -EEXIST ? PROTO_STATUS_EXISTS : proto_status_from_errno(rc);
	} else if (sl->e.retain_ms && sl->status == PROTO_STATUS_EXISTS) {
		/* stored before this PUT: its retention is extended (a refresh) */
		if (store_put_retain_by(c->w->srv->store, c->ns_id, sl->e.key, sl->e.retain_ms,
					c->tenant, &rr))
			rr = (struct store_retain_res){ 0, 0 }; /* removed meanwhile */
	}
	r.status = sl->status;
	r.flags = (uint8_t)rr.flags;
	r.retain_ms = rr.retain_ms;
	/* Bytes in from the network, whatever became of the block. */
	srv_stats_add(st, SRV_C_put_bytes, sl->e.length);
	if (sl->status == PROTO_STATUS_OK || sl->status == PROTO_STATUS_EXISTS) {
		/* PROTOCOL.md 6.2: tier is reported for the copy just stored. */
		r.tier = sl->status == PROTO_STATUS_OK ? PROTO_TIER_DRAM : PROTO_TIER_NONE;
		r.length = sl->e.length;
		r.checksum = sl->e.checksum;
		srv_stats_add(st, sl->status == PROTO_STATUS_OK ? SRV_C_put_ok : SRV_C_put_exists, 1);
	} else {
		srv_stats_add(st, SRV_C_put_errors, 1);
		srv_stats_count_status(st, sl->status);
	}
	proto_result_encode_v(body, i, c->hdr.version, &r);
}

int srv_put_finish(struct srv_conn *c, uint64_t start_us)
{
	uint32_t body_bytes = (uint32_t)proto_batch_body_bytes(c->put_count,
							       PROTO_RESULT_ENTRY_BYTES);
	struct srv_stats *st = &c->w->stats;
	uint8_t *body;

	if (srv_conn_reply_begin(c, PROTO_STATUS_OK, body_bytes, 0, &body) < 0) {
		srv_put_abort(c);
		return -ENOMEM;
	}
	proto_batch_encode_prefix(body, c->put_count, 0);
	for (uint32_t i = 0; i < c->put_count; i++)
		put_commit_one(c, i, body);
	srv_conn_reply_commit(c, body_bytes);
	srv_stats_add(st, SRV_C_put_blocks, c->put_count);
	c->put_count = 0;
	srv_hist_record(&st->lat[SRV_LAT_PUT], srv_now_us() - start_us);
	return 0;
}

void srv_put_abort(struct srv_conn *c)
{
	struct store *s = c->w->srv->store;

	for (uint32_t i = 0; i < c->put_count; i++) {
		if (c->slots[i].block)
			store_put_abort(s, c->slots[i].block);
		c->slots[i].block = NULL;
	}
	c->put_count = 0;
}

void srv_put_free(struct srv_conn *c)
{
	free(c->slots);
	c->slots = NULL;
	c->slots_cap = 0;
	XXH3_freeState(c->put_hash);
	c->put_hash = NULL;
}
