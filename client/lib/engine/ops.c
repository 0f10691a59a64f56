/*
 * ops.c - the rules of each opcode, written once for every request of the
 * engine (sync or async, TCP or RDMA, one node or a cluster's node): which
 * entries go, how they are cut into frames, how an entry is encoded, what
 * a reply means, how a GET's bytes are checked, and what a pass that met
 * BUSY does next.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "lib/checksum.h"
#include "lib/clock.h"

static int is_batch(int op)
{
	return op >= KVPOOL_OP_PUT && op <= KVPOOL_OP_DELETE;
}

/* Buffers the peer reads or writes itself (message peers, PUT and GET). */
static int with_descs(const struct kvc_engine *e, int op)
{
	return e->s.link.t->message_mode && (op == KVPOOL_OP_PUT || op == KVPOOL_OP_GET);
}

uint8_t kvc_ops_wire_op(int op)
{
	switch (op) {
	case KVPOOL_OP_PUT:
		return PROTO_OP_PUT;
	case KVPOOL_OP_GET:
		return PROTO_OP_GET;
	case KVPOOL_OP_EXISTS:
		return PROTO_OP_EXISTS;
	case KVPOOL_OP_MATCH:
		return PROTO_OP_MATCH;
	case KVPOOL_OP_DELETE:
		return PROTO_OP_DELETE;
	case KVC_OP_STATS:
		return PROTO_OP_STATS;
	case KVC_OP_DROP:
		return PROTO_OP_DROP_NAMESPACE;
	default:
		return PROTO_OP_PING;
	}
}

static int key_is_zero(const uint8_t *key)
{
	static const uint8_t zero[KVPOOL_KEY_BYTES];

	return memcmp(key, zero, KVPOOL_KEY_BYTES) == 0;
}

static int first_error(const int *st, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (st[i])
			return st[i];
	return 0;
}

/* The entry's iovecs: a PUT block's or a GET block's. */
static void entry_iov(const struct kvc_slot *s, size_t idx, const struct iovec **iov, int *iovcnt)
{
	if (s->r.op == KVPOOL_OP_PUT) {
		*iov = s->r.put[idx].iov;
		*iovcnt = s->r.put[idx].iovcnt;
	} else {
		*iov = s->r.get[idx].iov;
		*iovcnt = s->r.get[idx].iovcnt;
	}
}

/* Scratch for a request of `count` entries: one word and one map entry
 * each, and statuses when the caller gave none. Kept for reuse. */
static int slot_scratch(struct kvc_slot *s, size_t count, int *statuses)
{
	size_t need;

	if (count > SIZE_MAX / 32)
		return -ENOMEM;
	need = count * (sizeof(size_t) + sizeof(uint64_t) + sizeof(int)) + 16;
	if (need > s->mem_bytes) {
		void *p = realloc(s->mem, need);

		if (!p)
			return -ENOMEM;
		s->mem = p;
		s->mem_bytes = need;
	}
	s->words = s->mem;
	s->sent = (size_t *)(s->words + count);
	s->st = statuses ? statuses : (int *)(s->sent + count);
	return 0;
}

/* MATCH: what is wanted and how long it may wait (a want above count
 * never gets here: the API refuses it -EINVAL). A waiting MATCH (v2) has
 * the handle's timeout plus wait_ms. */
static int match_begin(struct kvc_engine *e, struct kvc_slot *s)
{
	const struct kvpool_match_opts *o = &s->r.mopts;
	size_t count = s->r.count;

	s->want = o->want && o->want <= count ? o->want :
		  count < UINT32_MAX ? (uint32_t)count : UINT32_MAX;
	if (o->want > count)
		return -EINVAL;
	if (o->wait_ms && kvc_session_version(&e->s) >= PROTO_VERSION_2) {
		s->wait_end_ms = kvc_now_ms() + o->wait_ms;
		if (!s->r.deadline_ms) /* a deadline given (a cluster's) has it already */
			s->deadline_ms += o->wait_ms;
	}
	return 0;
}

int kvc_ops_begin(struct kvc_engine *e, struct kvc_slot *s)
{
	const struct kvc_req *r = &s->r;
	uint64_t max_block = e->s.limits.max_block_bytes;

	s->n_sent = 0;
	if (r->op == KVC_OP_LIMITS) {
		s->res.limits = e->s.limits;
		return 1;
	}
	if (!is_batch(r->op))
		return kvc_ops_plan(e, s);
	if (r->op == KVPOOL_OP_PUT && r->flags && r->count)
		memset(r->flags, 0, r->count * sizeof(*r->flags));
	if (r->op == KVPOOL_OP_MATCH && match_begin(e, s))
		return -EINVAL;
	if (r->count == 0) {
		if (r->op == KVPOOL_OP_MATCH && r->mres)
			*r->mres = s->res.match; /* nothing asked: nothing matched */
		return 1;
	}
	if (slot_scratch(s, r->count, r->statuses))
		return -ENOMEM;
	for (size_t i = 0; i < r->count; i++) {
		if (r->op == KVPOOL_OP_PUT) {
			uint64_t bytes = kvc_iov_bytes(r->put[i].iov, r->put[i].iovcnt);

			/* Refused here, never sent: empty, or more than the server takes. */
			s->words[i] = bytes;
			s->st[i] = bytes == 0 || bytes > max_block ? -EMSGSIZE : 0;
			if (s->st[i])
				continue;
		} else if (r->op == KVPOOL_OP_GET) {
			s->words[i] = kvc_iov_bytes(r->get[i].iov, r->get[i].iovcnt);
			/* A descriptor (and a staging slot) holds no more than the
			 * largest block the server stores. */
			if (with_descs(e, r->op) && s->words[i] > max_block)
				s->words[i] = max_block;
		}
		s->sent[s->n_sent++] = i;
	}
	if (r->op != KVPOOL_OP_MATCH && s->n_sent == 0) {
		s->res.status = first_error(s->st, r->count);
		return 1;
	}
	return kvc_ops_plan(e, s);
}

int kvc_ops_plan(struct kvc_engine *e, struct kvc_slot *s)
{
	const struct kvpool_limits *lim = &e->s.limits;
	const struct kvc_link *l = &e->s.link;
	int op = s->r.op, descs = with_descs(e, op);
	uint32_t eb = is_batch(op) ? proto_request_entry_bytes(kvc_ops_wire_op(op)) : 1;
	size_t prefix = op == KVPOOL_OP_MATCH ?
			proto_match_body_bytes(kvc_session_version(&e->s), 0) : PROTO_BATCH_PREFIX_BYTES;
	size_t cap = (lim->max_frame_bytes - PROTO_HEADER_BYTES - prefix) / eb;
	uint64_t pay_cap = lim->max_inflight_put_bytes ? lim->max_inflight_put_bytes : UINT64_MAX;
	uint64_t stage_cap = descs ? l->t->stage_capacity(l, lim->max_block_bytes) : 0;
	size_t total = op == KVPOOL_OP_MATCH ? s->r.count - s->match_done : s->n_sent;

	s->busy = 0;
	s->refused = 0;
	s->frames_left = 0;
	if (!is_batch(op)) {
		s->frames_left = 1;
		return kvc_frame_queue(e, s, 0, 0, 0) ? 0 : -ENOMEM;
	}
	if (cap > lim->max_batch_blocks)
		cap = lim->max_batch_blocks;
	if (l->t->message_mode && cap > l->t->max_batch(eb))
		cap = l->t->max_batch(eb);
	if (cap == 0)
		cap = 1;
	for (size_t first = 0; first < total;) {
		uint64_t pay = 0, staged = 0;
		struct kvc_frame *f;
		size_t n = 0;

		while (n < cap && first + n < total) {
			size_t idx = op == KVPOOL_OP_MATCH ? 0 : s->sent[first + n];
			uint64_t pb = op == KVPOOL_OP_PUT ? s->words[idx] : 0, sb = 0;

			if (n > 0 && (pay >= pay_cap || pb > pay_cap - pay))
				break;
			if (descs) {
				const struct iovec *iov;
				int iovcnt;

				entry_iov(s, idx, &iov, &iovcnt);
				sb = l->t->stage_need(l, iov, iovcnt, s->words[idx]);
				if (n > 0 && sb > stage_cap - staged)
					break;
			}
			pay += pb;
			staged += sb;
			n++;
		}
		f = kvc_frame_queue(e, s, first, n, pay);
		if (!f)
			return -ENOMEM;
		f->stage_bytes = staged;
		s->frames_left++;
		s->match_n = n;
		first += n;
		if (op == KVPOOL_OP_MATCH)
			break; /* one chunk at a time: the next only if this one matched whole */
	}
	return 0;
}

/* A whole-pool request's frame: header and a name body (or none). */
static int encode_admin(struct kvc_engine *e, struct kvc_frame *f)
{
	const struct kvc_req *r = &f->s->r;
	size_t len = r->ns ? strlen(r->ns) : 0, body = 0;

	if (r->op != KVC_OP_PING)
		body = proto_name_body_bytes((uint16_t)len);
	if (kvc_grow((void **)&e->tx_buf, &e->tx_buf_cap, PROTO_HEADER_BYTES + body + 8, 1) ||
	    kvc_grow((void **)&e->tx_iov, &e->tx_iov_cap, 1, sizeof(struct iovec)))
		return -ENOMEM;
	if (body && proto_name_encode(r->ns, (uint16_t)len, e->tx_buf + PROTO_HEADER_BYTES, body))
		return -ENOMEM;
	kvc_frame_request(e->tx_buf, kvc_session_version(&e->s), kvc_ops_wire_op(r->op),
			  f->wire_id, (uint32_t)body, 0);
	e->tx_iov[0] = (struct iovec){ e->tx_buf, PROTO_HEADER_BYTES + body };
	e->tx_iov_n = 1;
	return 0;
}

/* Encode one PUT entry; the checksum is computed here, one frame at a
 * time, so the bytes are still in cache when they are sent. A parent of
 * 32 zero bytes is the index's "no parent" and is sent as none. */
static void encode_put(const struct kvc_slot *s, size_t idx, uint8_t *body, uint32_t j,
		       uint8_t version)
{
	const struct kvpool_put_block *b = &s->r.put[idx];
	struct proto_put_entry pe;

	memset(&pe, 0, sizeof(pe));
	memcpy(pe.key, b->key, PROTO_KEY_BYTES);
	if (b->parent && !key_is_zero(b->parent)) {
		memcpy(pe.parent, b->parent, PROTO_KEY_BYTES);
		pe.flags = PROTO_PUT_HAS_PARENT;
	}
	pe.length = s->words[idx];
	pe.checksum = kvc_checksum_prefix(b->iov, b->iovcnt, pe.length);
	pe.retain_ms = b->retain_ms; /* v1: not sent */
	proto_put_entry_encode_v(body, j, version, &pe);
}

/* The options one MATCH frame carries: the frame asks keys first..+n of
 * the chain; it waits only for its own share of what is wanted, within
 * what is left of the call's wait. */
static struct proto_match_opts match_frame_opts(const struct kvc_slot *s, size_t first, size_t n)
{
	struct proto_match_opts o = { .retain_ms = s->r.mopts.retain_ms };
	uint64_t now = kvc_now_ms();

	if (s->want > first && s->wait_end_ms > now) {
		o.want = s->want - first < n ? (uint32_t)(s->want - first) : (uint32_t)n;
		o.wait_ms = (uint32_t)(s->wait_end_ms - now);
	}
	return o;
}

int kvc_ops_encode(struct kvc_engine *e, struct kvc_frame *f)
{
	struct kvc_slot *s = f->s;
	struct kvc_link *l = &e->s.link;
	int op = s->r.op, descs = with_descs(e, op), stream = !l->t->message_mode;
	uint8_t v = kvc_session_version(&e->s);
	uint32_t eb;
	size_t body_bytes, desc_bytes, iovs = 1;
	uint64_t off = 0;
	uint8_t *body;

	f->wire_id = kvc_session_request_id(&e->s);
	f->sent_us = kvc_now_us();
	if (!is_batch(op))
		return encode_admin(e, f);
	eb = proto_request_entry_bytes(kvc_ops_wire_op(op));
	body_bytes = op == KVPOOL_OP_MATCH ? proto_match_body_bytes(v, (uint32_t)f->n) :
					     proto_batch_body_bytes((uint32_t)f->n, eb);
	desc_bytes = descs ? f->n * l->t->desc_bytes : 0;
	if (op == KVPOOL_OP_PUT && stream)
		for (size_t i = 0; i < f->n; i++)
			iovs += (size_t)s->r.put[s->sent[f->first + i]].iovcnt;
	if (kvc_grow((void **)&e->tx_buf, &e->tx_buf_cap, PROTO_HEADER_BYTES + body_bytes + desc_bytes,
		     1) ||
	    kvc_grow((void **)&e->tx_iov, &e->tx_iov_cap, iovs, sizeof(struct iovec)))
		return -ENOMEM;
	kvc_frame_request(e->tx_buf, v, kvc_ops_wire_op(op), f->wire_id, (uint32_t)body_bytes,
			  f->payload_bytes);
	body = e->tx_buf + PROTO_HEADER_BYTES;
	if (op == KVPOOL_OP_MATCH) {
		struct proto_match_opts o = match_frame_opts(s, s->match_done + f->first, f->n);

		/* a v1 server cannot wait or retain: the options are dropped */
		proto_match_encode_prefix(body, v, (uint32_t)f->n, s->r.mopts.lease_ms, &o);
	} else {
		proto_batch_encode_prefix(body, (uint32_t)f->n, 0);
	}
	e->tx_iov[0] = (struct iovec){ e->tx_buf, PROTO_HEADER_BYTES + body_bytes + desc_bytes };
	e->tx_iov_n = 1;
	f->direct = 0;
	for (size_t i = 0; i < f->n; i++) {
		size_t idx = op == KVPOOL_OP_MATCH ? s->match_done + f->first + i : s->sent[f->first + i];

		if (op == KVPOOL_OP_PUT) {
			encode_put(s, idx, body, (uint32_t)i, v);
			if (stream) {
				const struct kvpool_put_block *b = &s->r.put[idx];

				/* The caller's iovecs go to the socket as they are. */
				memcpy(e->tx_iov + e->tx_iov_n, b->iov, (size_t)b->iovcnt * sizeof(*b->iov));
				e->tx_iov_n += (size_t)b->iovcnt;
			}
		} else if (op == KVPOOL_OP_GET) {
			struct proto_get_entry ge;

			memcpy(ge.key, s->r.get[idx].key, PROTO_KEY_BYTES);
			ge.max_length = s->words[idx];
			proto_get_entry_encode(body, (uint32_t)i, &ge);
		} else if (op == KVPOOL_OP_MATCH) {
			proto_match_key_encode(body, v, (uint32_t)i, s->r.keys[idx]);
		} else {
			proto_key_entry_encode(body, (uint32_t)i, s->r.keys[idx]);
		}
		if (descs) {
			const struct iovec *iov;
			int iovcnt;
			uint64_t sb;

			entry_iov(s, idx, &iov, &iovcnt);
			sb = l->t->stage_need(l, iov, iovcnt, s->words[idx]);
			l->t->describe(l, iov, iovcnt, s->words[idx], op == KVPOOL_OP_PUT, off,
				       body + body_bytes + i * l->t->desc_bytes);
			f->direct |= sb == 0;
			off += sb;
		}
	}
	return 0;
}

/* ---- replies ---------------------------------------------------------------------- */

/* A frame refused as a whole with err (an error reply). */
static void frame_refused(struct kvc_slot *s, struct kvc_frame *f, int err)
{
	int op = s->r.op;

	if (is_batch(op) && op != KVPOOL_OP_MATCH)
		for (size_t j = 0; j < f->n; j++)
			s->st[s->sent[f->first + j]] = err;
	if (err == -EAGAIN && (op == KVPOOL_OP_EXISTS || op == KVPOOL_OP_DELETE))
		s->busy = 1;
	else if (!s->refused)
		s->refused = err;
}

/* Check a GET reply against its frame: OK blocks fit their buffers and
 * their lengths add up to the payload; a TOO_LARGE block's reported
 * length (0: not reported) does not fit, so a caller that retries with
 * that many bytes cannot be told TOO_LARGE forever. *iovs receives the
 * iovecs needed to scatter the payload (0 for a cancelled request, whose
 * memory is no longer touched). */
static int get_check(const struct kvc_slot *s, const struct kvc_frame *f,
		     const struct proto_batch *b, uint64_t payload, size_t *iovs)
{
	int active = s->state == SLOT_ACTIVE; /* else the caller's blocks are not read */

	struct proto_result res;
	uint64_t total = 0;

	*iovs = 0;
	for (size_t j = 0; j < f->n; j++) {
		size_t idx = s->sent[f->first + j];

		if (proto_result_decode(b, (uint32_t)j, &res))
			return -EPROTO;
		if (res.status == PROTO_STATUS_TOO_LARGE && res.length && res.length <= s->words[idx])
			return -EPROTO;
		if (res.status != PROTO_STATUS_OK)
			continue;
		if (res.length == 0 || res.length > s->words[idx] || res.length > payload - total)
			return -EPROTO;
		total += res.length;
		if (active)
			*iovs += (size_t)s->r.get[idx].iovcnt;
	}
	return total == payload ? 0 : -EPROTO;
}

/* Stream peers: the scatter list of a GET reply's payload, straight into
 * the caller's buffers (e->rx_iov). */
static int get_scatter(struct kvc_engine *e, const struct kvc_slot *s, const struct kvc_frame *f,
		       size_t iovs)
{
	struct proto_result res;

	if (kvc_grow((void **)&e->rx_iov, &e->rx_iov_cap, iovs ? iovs : 1, sizeof(struct iovec)))
		return -ENOMEM;
	e->rx_iov_n = 0;
	e->rx_iov_i = 0;
	for (size_t j = 0; j < f->n; j++) {
		const struct kvpool_get_block *blk = &s->r.get[s->sent[f->first + j]];
		uint64_t left;

		proto_result_decode(&e->rx_batch, (uint32_t)j, &res);
		if (res.status != PROTO_STATUS_OK)
			continue;
		left = res.length;
		for (int i = 0; i < blk->iovcnt && left; i++) {
			size_t len = blk->iov[i].iov_len < left ? blk->iov[i].iov_len : (size_t)left;

			e->rx_iov[e->rx_iov_n++] = (struct iovec){ blk->iov[i].iov_base, len };
			left -= len;
		}
	}
	return 0;
}

/* Message peers: the bytes are in place; copy the staged ones out to the
 * caller's buffers (the staging offsets of kvc_ops_encode). */
static void get_unstage(struct kvc_engine *e, const struct kvc_slot *s, const struct kvc_frame *f)
{
	struct kvc_link *l = &e->s.link;
	struct proto_result res;
	uint64_t off = 0;

	for (size_t j = 0; j < f->n; j++) {
		size_t idx = s->sent[f->first + j];
		const struct kvpool_get_block *blk = &s->r.get[idx];
		uint64_t sb = l->t->stage_need(l, blk->iov, blk->iovcnt, s->words[idx]);

		proto_result_decode(&e->rx_batch, (uint32_t)j, &res);
		if (sb && res.status == PROTO_STATUS_OK)
			l->t->unstage(l, off, blk->iov, blk->iovcnt, res.length);
		off += sb;
	}
}

void kvc_ops_get_done(struct kvc_engine *e, struct kvc_frame *f)
{
	struct kvc_slot *s = f->s;
	struct proto_result res;

	for (size_t j = 0; s->state == SLOT_ACTIVE && j < f->n; j++) {
		size_t idx = s->sent[f->first + j];
		struct kvpool_get_block *blk = &s->r.get[idx];
		int err;

		proto_result_decode(&e->rx_batch, (uint32_t)j, &res);
		if (res.status == PROTO_STATUS_TOO_LARGE)
			blk->length = res.length;
		if (res.status != PROTO_STATUS_OK) {
			/* Success without bytes makes no sense for a GET. */
			err = proto_status_to_errno(res.status);
			s->st[idx] = err ? err : -EPROTO;
			continue;
		}
		if (kvc_checksum_prefix(blk->iov, blk->iovcnt, res.length) != res.checksum) {
			e->s.checksum_errors++;
			s->st[idx] = -EBADMSG;
			continue;
		}
		blk->length = res.length;
		s->st[idx] = 0;
	}
	kvc_frame_answered(e, f);
}

/* A whole-pool request's reply. */
static int admin_reply(struct kvc_slot *s, const struct proto_header *h, const uint8_t *body)
{
	uint64_t n, bytes;

	switch (s->r.op) {
	case KVC_OP_STATS:
		s->res.json = malloc((size_t)h->body_bytes + 1);
		if (!s->res.json) {
			s->refused = -ENOMEM;
			return 0;
		}
		memcpy(s->res.json, body, h->body_bytes);
		s->res.json[h->body_bytes] = '\0';
		return 0;
	case KVC_OP_DROP:
		if (proto_drop_reply_decode(body, h->body_bytes, &n, &bytes))
			return -EPROTO;
		s->res.u64 = n;
		return 0;
	default: /* PING */
		s->res.u64 = kvc_now_us() - s->res.u64;
		return 0;
	}
}

int kvc_ops_reply(struct kvc_engine *e, struct kvc_frame *f, int err, const uint8_t *body)
{
	struct kvc_slot *s = f->s;
	const struct proto_header *h = &e->rx_h;
	int active = s->state == SLOT_ACTIVE, op = s->r.op, rc;
	size_t iovs;

	if (err) {
		if (active) {
			frame_refused(s, f, err);
			free(s->res.msg);
			s->res.msg = strdup(e->s.server_message);
		}
		kvc_frame_answered(e, f);
		return 0;
	}
	if (!is_batch(op)) {
		if (op == KVC_OP_PING)
			s->res.u64 = f->sent_us;
		rc = active ? admin_reply(s, h, body) : 0;
		if (rc)
			return rc;
		kvc_frame_answered(e, f);
		return 0;
	}
	if (op == KVPOOL_OP_MATCH) {
		if (proto_match_reply_decode_v(body, h->body_bytes, h->version, &s->mrep) ||
		    s->mrep.present > f->n)
			return -EPROTO;
		kvc_frame_answered(e, f);
		return 0;
	}
	if (proto_batch_decode_v(body, h->body_bytes, PROTO_RESULT_ENTRY_BYTES, h->version,
				 &e->s.reply_limits, &e->rx_batch) ||
	    e->rx_batch.count != f->n)
		return -EPROTO;
	if (op != KVPOOL_OP_GET) {
		struct proto_result res;

		if (h->payload_bytes)
			return -EPROTO;
		for (size_t j = 0; j < f->n; j++) {
			if (proto_result_decode(&e->rx_batch, (uint32_t)j, &res))
				return -EPROTO;
			if (!active)
				continue;
			s->st[s->sent[f->first + j]] = proto_status_to_errno(res.status);
			if (s->r.flags)
				s->r.flags[s->sent[f->first + j]] = res.flags;
		}
		kvc_frame_answered(e, f);
		return 0;
	}
	rc = get_check(s, f, &e->rx_batch, h->payload_bytes, &iovs);
	if (rc)
		return rc;
	if (e->s.link.t->message_mode) {
		if (active)
			get_unstage(e, s, f);
		kvc_ops_get_done(e, f);
		return 0;
	}
	e->rx_frame = f;
	if (!active) { /* cancelled: the bytes are read and dropped */
		e->rx_left = h->payload_bytes;
		e->rx = RX_DISCARD;
		return 0;
	}
	rc = get_scatter(e, s, f, iovs);
	if (rc)
		return rc;
	e->rx = RX_PAYLOAD;
	return 0;
}

/* ---- what comes after a pass ------------------------------------------------------- */

/* Is `parent` the key of one of the first n blocks listed in s->sent? */
static int parent_listed(const struct kvc_slot *s, size_t n, const uint8_t *parent)
{
	if (!parent || key_is_zero(parent))
		return 0;
	for (size_t j = 0; j < n; j++)
		if (!memcmp(s->r.put[s->sent[j]].key, parent, KVPOOL_KEY_BYTES))
			return 1;
	return 0;
}

/* Fold one MATCH chunk's answer (keys first..first+n of the chain) into
 * the call's result. Returns 1 when the next chunk is to be asked (this
 * one matched whole). */
static int match_fold(struct kvpool_match_result *acc, size_t first, size_t n,
		      const struct proto_match_reply *r)
{
	acc->matched = first + r->matched;
	acc->present = first + r->present;
	/* leading blocks: a chunk's count adds only to a whole run before it */
	if (acc->retained == first)
		acc->retained = first + r->retained;
	if (r->lease_ms && (!acc->lease_ms || r->lease_ms < acc->lease_ms))
		acc->lease_ms = r->lease_ms;
	if (r->retain_ms && (!acc->retain_ms || r->retain_ms < acc->retain_ms))
		acc->retain_ms = r->retain_ms;
	acc->flags |= r->flags;
	return r->matched == n;
}

/* MATCH: the chunk is answered (or refused): go on, retry, or finish. */
static void match_next(struct kvc_engine *e, struct kvc_slot *s)
{
	if (s->refused == -EAGAIN) {
		s->n_sent = 1; /* the same chunk, after the wait */
		kvc_slot_retry(e, s, -EAGAIN);
		return;
	}
	if (s->refused) {
		kvc_slot_complete(e, s, s->refused);
		return;
	}
	if (s->r.mopts.want > s->r.count) {
		kvc_slot_complete(e, s, -EPROTO); /* a server that let want > count pass */
		return;
	}
	/* A later chunk can only extend the prefix if this one matched whole. */
	if (match_fold(&s->macc, s->match_done, s->match_n, &s->mrep) &&
	    s->match_done + s->match_n < s->r.count) {
		s->match_done += s->match_n;
		if (kvc_ops_plan(e, s))
			kvc_slot_complete(e, s, -ENOMEM);
		return;
	}
	s->res.match = s->macc;
	if (s->r.mres)
		*s->r.mres = s->macc;
	kvc_slot_complete(e, s, 0);
}

/* Blocks of a PUT answered BUSY, and the blocks refused NO_PARENT whose
 * parent is one of those (in the same call, it was not stored only
 * because it was busy), go again, in call order so parents go first. The
 * other calls send again what was answered BUSY. */
void kvc_ops_pass_done(struct kvc_engine *e, struct kvc_slot *s)
{
	size_t n = 0;

	switch (s->r.op) {
	case KVPOOL_OP_PUT:
		for (size_t k = 0; k < s->r.count; k++)
			if (s->st[k] == -EAGAIN ||
			    (s->st[k] == -ENOLINK && n && parent_listed(s, n, s->r.put[k].parent)))
				s->sent[n++] = k;
		s->n_sent = n;
		kvc_slot_retry(e, s, first_error(s->st, s->r.count));
		return;
	case KVPOOL_OP_GET:
		for (size_t k = 0; k < s->r.count; k++)
			if (s->st[k] == -EAGAIN)
				s->sent[n++] = k;
		s->n_sent = n;
		kvc_slot_retry(e, s, first_error(s->st, s->r.count));
		return;
	case KVPOOL_OP_EXISTS:
	case KVPOOL_OP_DELETE: {
		int status = s->refused ? s->refused : s->busy ? -EAGAIN : 0;

		for (size_t k = 0; k < s->r.count; k++)
			if (s->st[k] == -EAGAIN)
				s->sent[n++] = k;
		s->n_sent = n;
		kvc_slot_retry(e, s, status);
		return;
	}
	case KVPOOL_OP_MATCH:
		match_next(e, s);
		return;
	default:
		kvc_slot_complete(e, s, s->refused);
		return;
	}
}
