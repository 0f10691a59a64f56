/*
 * srv_request.c - dispatch and every request but PUT, GET and MATCH
 * (srv_put.c, srv_get.c, srv_match.c): HELLO, EXISTS, DELETE,
 * DROP_NAMESPACE, STATS, PING.
 */
#include "srv_request.h"

#include <errno.h>
#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "srv_auth.h"
#include "srv_tenant.h"
#include "srv_get.h"
#include "srv_clock.h"
#include "srv_log.h"
#include "srv_match.h"
#include "srv_put.h"
#include "srv_server.h"
#include "srv_snapshot.h"
#include "srv_worker.h"
#include "store.h"

/* Queue an error reply for the current request. The log line quotes the
 * body, except a HELLO's (srv_conn_quote_body). */
#define reply_err(c, status, ...) srv_conn_reply_error((c), (status), SRV_QUOTE_BODY, __VA_ARGS__)

/* Map an error-reply result to the next state: the request is done. */
static enum srv_next done(int rc)
{
	return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
}

/* Queue a reply with a fixed body of n bytes from src. */
static int reply_fixed(struct srv_conn *c, const uint8_t *src, uint32_t n)
{
	uint8_t *body;

	if (srv_conn_reply_begin(c, PROTO_STATUS_OK, n, 0, &body) < 0)
		return -ENOMEM;
	if (n)
		memcpy(body, src, n);
	srv_conn_reply_commit(c, n);
	return 0;
}


/* ---- HELLO ---------------------------------------------------------- */

/* Fill the HELLO reply with this server's limits, in the layout of
 * `version`; returns its bytes. */
static uint32_t hello_limits(const struct srv *s, uint16_t version,
			     uint8_t out[PROTO_HELLO_REPLY_MAX_BYTES])
{
	struct proto_hello_reply r = {
		.version = version,
		.rdma_port = s->rdma.port, /* nonzero only while RDMA is served */
		.max_batch_blocks = s->conf.max_batch_blocks,
		.max_block_bytes = s->conf.max_block_bytes,
		.max_frame_bytes = s->conf.max_frame_bytes,
		.max_lease_ms = s->conf.max_lease_ms,
		.max_inflight_put_bytes = s->conf.max_inflight_put_bytes,
		.server_flags = 0,
		.max_match_wait_ms = s->conf.max_match_wait_ms,
		.max_retain_ms = s->conf.max_retain_ms,
	};

	proto_hello_reply_encode(&r, out);
	return (uint32_t)proto_hello_reply_bytes(version);
}

/* Apply the tokens file's quota (if any) to namespace ns_id; `created`:
 * this connection's PUT created it. */
static void ns_quota_apply(struct srv_conn *c, uint32_t ns_id, bool created)
{
	struct srv_auth *a = c->w->srv->auth;

	if (a)
		(void)store_namespace_quota(c->w->srv->store, ns_id,
					    srv_auth_quota(a, c->ns_name, strlen(c->ns_name)));
	/* counted against its creator only (after a warm restart the NVMe
	 * index names it); a tenant that merely binds an existing namespace
	 * is charged nothing for it (blocks are billed to whoever writes
	 * them, srv_put.c) */
	if (c->tenant && c->may_write && created)
		(void)store_namespace_tenant(c->w->srv->store, ns_id, c->tenant);
}

void srv_conn_ns_attach(struct srv_conn *c)
{
	struct store *st = c->w->srv->store;
	size_t len = strlen(c->ns_name);
	uint32_t id;

	if (!c->hello_done || c->ns_id)
		return;
	if (store_namespace_find(st, c->ns_name, len, &id) < 0)
		return;
	/* it exists: take the connection's reference (should it vanish in
	 * between, this creates it, as a PUT would) */
	if (store_namespace_id(st, c->ns_name, len, &id) < 0)
		return;
	ns_quota_apply(c, id, false);
	c->ns_id = id;
}

/* How many namespaces the connection's tenant created (and that exist
 * now): a namespace counts against its creator only, so namespaces that
 * another token (or the operator's) made under the same grants take
 * nothing from this one. Without a tenant (no memory for one at HELLO):
 * the namespaces its grants cover, O(namespaces). */
static uint32_t tenant_namespaces(struct srv_conn *c)
{
	struct store *st = c->w->srv->store;
	struct store_ns_stats n;
	uint32_t count = 0;

	if (c->tenant)
		return store_tenant_namespaces(st, c->tenant);
	for (uint32_t i = 0; i < STORE_MAX_NAMESPACES && store_ns_stats(st, i, &n) == 0; i++)
		if (srv_auth_access(c->w->srv->auth, c->token_digest, n.name, strlen(n.name)) !=
		    SRV_ACCESS_NONE)
			count++;
	return count;
}

uint16_t srv_conn_ns_create(struct srv_conn *c, char *msg, size_t cap)
{
	struct store *st = c->w->srv->store;
	uint32_t limit = c->w->srv->conf.tenant_max_namespaces, have, id;
	int rc;

	srv_conn_ns_attach(c);
	if (c->ns_id)
		return PROTO_STATUS_OK;
	if (c->w->srv->auth && limit && !srv_auth_grants_all(c->w->srv->auth, c->token_digest) &&
	    (have = tenant_namespaces(c)) >= limit) {
		snprintf(msg, cap, "namespace %s not created: the token already has %u namespaces "
			 "(tenant_max_namespaces %u)", c->ns_name, have, limit);
		return PROTO_STATUS_QUOTA;
	}
	rc = store_namespace_id(st, c->ns_name, strlen(c->ns_name), &id);
	if (rc == -EDQUOT) {
		snprintf(msg, cap, "namespace %s not created: the server holds its maximum of %d "
			 "namespaces", c->ns_name, STORE_MAX_NAMESPACES);
		return PROTO_STATUS_QUOTA;
	}
	if (rc < 0) {
		snprintf(msg, cap, "namespace %s not created: %s", c->ns_name, strerror(-rc));
		return proto_status_from_errno(rc);
	}
	ns_quota_apply(c, id, true);
	c->ns_id = id;
	return PROTO_STATUS_OK;
}

uint64_t srv_tenant_retain_budget(const struct srv *s, const uint8_t *digest)
{
	uint64_t bytes;

	if (s->auth && srv_auth_retain_budget(s->auth, digest, &bytes) == 0)
		return bytes;
	return s->conf.max_retained_bytes ? s->conf.max_retained_bytes
					  : s->conf.dram_capacity_bytes / 4;
}

static void rebudget_one(const uint8_t digest[32], struct store_tenant *t, void *arg)
{
	struct srv *s = arg;

	store_tenant_retain_budget(s->store, t, srv_tenant_retain_budget(s, digest));
}

void srv_tenants_retain_rebudget(struct srv *s)
{
	if (s->tenants)
		srv_tenants_foreach(s->tenants, rebudget_one, s);
}

/* bytes in MiB for a log line */
static double mib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

void srv_retain_budget_warn(struct srv *s, const char *what)
{
	uint64_t cap = s->conf.dram_capacity_bytes;
	uint64_t dflt = s->conf.max_retained_bytes ? s->conf.max_retained_bytes : cap / 4;
	uint64_t total = s->conf.max_retained_total_bytes ? s->conf.max_retained_total_bytes
							  : cap / 2;
	uint64_t sum, largest;
	uint32_t n;

	if (!s->conf.max_retain_ms)
		return;
	if (total >= cap)
		srv_warn("%smax_retained_total_bytes (%.1f MiB) is dram_capacity (%.1f MiB) or "
			 "more: retained blocks may fill the pool, and ordinary PUTs then answer "
			 "FULL until retentions expire", what, mib(total), mib(cap));
	if (!s->auth) {
		if (dflt >= cap)
			srv_warn("%smax_retained_bytes (%.1f MiB per namespace) is dram_capacity "
				 "(%.1f MiB) or more: one namespace may retain up to the pool-wide "
				 "bound (%.1f MiB)", what, mib(dflt), mib(cap),
				 mib(total < cap ? total : cap));
		return;
	}
	srv_auth_retain_budgets(s->auth, dflt, &sum, &largest, &n);
	if (largest >= cap)
		srv_warn("%sa token's retention budget (%.1f MiB) is dram_capacity (%.1f MiB) or "
			 "more: that tenant alone may retain up to the pool-wide bound (%.1f MiB)",
			 what, mib(largest), mib(cap), mib(total < cap ? total : cap));
	else if (sum >= cap)
		srv_warn("%sthe retention budgets of the %u tokens add up to %.1f MiB, "
			 "dram_capacity (%.1f MiB) or more: together they may retain up to the "
			 "pool-wide bound (%.1f MiB) and refuse each other's retentions",
			 what, n, mib(sum), mib(cap), mib(total < cap ? total : cap));
}

/* Bind the connection to its namespace's name and create its lessee.
 * The namespace itself is not created here: a HELLO from a health check,
 * STATS or DROP must not fill the namespace table (PROTOCOL.md 6.1); it
 * is taken if it exists, else created by the first PUT. */
static int hello_bind(struct srv_conn *c, const struct proto_hello *h)
{
	struct store *st = c->w->srv->store;

	struct srv *s = c->w->srv;

	if (!c->lessee) {
		c->lessee = store_lessee_new(st);
		if (!c->lessee)
			return -ENOMEM;
	}
	/* with auth, the token's tenant: billed for the bytes it writes, the
	 * namespaces it creates and its connections' leases, under shared
	 * bounds */
	c->tenant = s->tenants ? srv_tenant_get(s->tenants, st, c->token_digest,
						s->conf.tenant_max_bytes,
						s->tenant_max_leased_bytes) : NULL;
	if (c->tenant)
		store_tenant_retain_budget(st, c->tenant, srv_tenant_retain_budget(s, c->token_digest));
	store_lessee_limit(st, c->lessee, s->conn_max_leased_bytes, c->tenant);
	c->ns_id = 0;
	memcpy(c->ns_name, h->ns, h->ns_len);
	c->ns_name[h->ns_len] = '\0';
	c->hello_done = 1;
	srv_conn_ns_attach(c);
	return 0;
}

/* With a tokens file: check the token and what it grants in the
 * namespace; remember both for later requests. Without one every
 * connection may write. Returns 0 (go on), 1 (a DENIED reply is queued;
 * the connection stays open and unbound, PROTOCOL.md 6.1) or -ENOMEM. */
static int hello_auth(struct srv_conn *c, const struct proto_hello *h)
{
	struct srv_auth *a = c->w->srv->auth;
	enum srv_access access;
	int rc;

	if (!a) {
		if (h->token_len)
			srv_debug("conn %" PRIu64 " %s: token of %u bytes ignored (auth not configured)",
				  c->id, c->peer, h->token_len);
		c->may_write = 1;
		return 0;
	}
	/* a token that crossed a network in the clear is refused, so that a
	 * deployment that forgot TLS finds out at once (the token is spent:
	 * rotate it) */
	if (h->token_len && c->tls_phase != SRV_TLS_UP && !c->peer_loopback &&
	    !c->w->srv->conf.allow_plaintext_tokens) {
		srv_stats_add(&c->w->stats, SRV_C_tls_token_refused, 1);
		rc = reply_err(c, PROTO_STATUS_DENIED, "hello refused: a token over plaintext from "
			       "a non-loopback peer; connect with tls:// (or set "
			       "allow_plaintext_tokens on a trusted network)");
		return rc < 0 ? -ENOMEM : 1;
	}
	srv_auth_digest(h->token, h->token_len, c->token_digest);
	c->auth_gen = srv_auth_generation(a); /* before the check: see auth_recheck */
	access = srv_auth_access(a, c->token_digest, h->ns, h->ns_len);
	if (access != SRV_ACCESS_NONE) {
		c->may_write = access == SRV_ACCESS_RW;
		return 0;
	}
	if (h->token_len == 0 || !srv_auth_known(a, c->token_digest))
		rc = reply_err(c, PROTO_STATUS_DENIED, "hello refused: %s",
			       h->token_len ? "unknown token" : "this server requires a token");
	else
		rc = reply_err(c, PROTO_STATUS_DENIED, "hello refused: the token does not grant "
			       "namespace %.*s", (int)h->ns_len, h->ns);
	return rc < 0 ? -ENOMEM : 1;
}

/* Refuse a write (PUT, DELETE, DROP_NAMESPACE) on a read-only session. */
static int deny_write(struct srv_conn *c, const char *ns, size_t ns_len)
{
	return reply_err(c, PROTO_STATUS_DENIED, "%s refused: the token is read-only in namespace %.*s",
			 proto_op_name(c->hdr.opcode), (int)ns_len, ns);
}

static enum srv_next op_hello(struct srv_conn *c)
{
	const struct srv *s = c->w->srv;
	uint8_t reply[PROTO_HELLO_REPLY_MAX_BYTES];
	struct proto_hello h;
	uint16_t version;
	uint32_t n;
	int rc;

	if (c->hello_done)
		return done(reply_err(c, PROTO_STATUS_BAD_REQUEST, "hello already done"));
	if (proto_hello_decode(c->body, c->hdr.body_bytes, &h) < 0) {
		uint16_t ns_len = c->hdr.body_bytes >= 8 ? proto_get_u16(c->body + 4) : 0;

		if (c->hdr.body_bytes >= 8u + ns_len &&
		    !proto_name_valid((const char *)c->body + 8, ns_len))
			return done(reply_err(c, PROTO_STATUS_BAD_REQUEST,
					      "bad namespace name: 1..255 bytes of 0x21..0x7e"));
		return done(reply_err(c, PROTO_STATUS_BAD_REQUEST,
				      "malformed hello: version range, lengths or token"));
	}
	if (h.max_version < PROTO_VERSION_MIN || h.min_version > PROTO_VERSION_MAX) {
		rc = reply_err(c, PROTO_STATUS_UNSUPPORTED,
			       "no common protocol version: client speaks %u..%u, server %d..%d",
			       h.min_version, h.max_version, PROTO_VERSION_MIN, PROTO_VERSION_MAX);
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_CLOSE;
	}
	rc = hello_auth(c, &h);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	rc = hello_bind(c, &h);
	if (rc < 0)
		return done(reply_err(c, proto_status_from_errno(rc), "cannot bind namespace: %s",
				      strerror(-rc)));
	version = h.max_version < PROTO_VERSION_MAX ? h.max_version : PROTO_VERSION_MAX;
	c->version = version;
	n = hello_limits(s, version, reply);
	srv_debug("conn %" PRIu64 " %s: hello namespace %s version %u", c->id, c->peer,
		  c->ns_name, version);
	return done(reply_fixed(c, reply, n));
}

/* ---- batches ---------------------------------------------------------- */

/* Decode the current request's batch body, answering malformed ones.
 * Returns 0, or 1 when an error reply was queued, or -ENOMEM. */
static int batch_decode(struct srv_conn *c, struct proto_batch *b, int aux_allowed)
{
	const struct proto_limits *l = &c->w->srv->limits;
	uint32_t entry_bytes = proto_request_entry_bytes(c->hdr.opcode);
	int rc = proto_batch_decode(c->body, c->hdr.body_bytes, entry_bytes, l, b);

	if (rc == -EMSGSIZE)
		rc = reply_err(c, PROTO_STATUS_TOO_LARGE, "batch of %u entries exceeds max_batch_blocks %u",
			       proto_get_u32(c->body), l->max_batch_blocks);
	else if (rc < 0)
		rc = reply_err(c, PROTO_STATUS_BAD_REQUEST,
			       "malformed %s batch: count 0 or body_bytes not 8 + count * %u",
			       proto_op_name(c->hdr.opcode), entry_bytes);
	else if (b->aux && !aux_allowed)
		rc = reply_err(c, PROTO_STATUS_BAD_REQUEST, "aux must be 0 for %s",
			       proto_op_name(c->hdr.opcode));
	else
		return 0;
	return rc < 0 ? -ENOMEM : 1;
}


/* ---- GET (srv_get.c) ------------------------------------------------------ */

static enum srv_next op_get(struct srv_conn *c)
{
	struct proto_batch b;
	int rc = batch_decode(c, &b, 0);

	srv_stats_add(&c->w->stats, SRV_C_get_requests, 1);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	return srv_get_start(c, &b);
}

/* ---- EXISTS, MATCH, DELETE --------------------------------------------- */

/* One key of an EXISTS or DELETE batch: ask the store, count, and fill
 * the key's result. */
typedef void (*key_op_fn)(struct srv_conn *c, const uint8_t *key, struct proto_result *res);

/* Decode a batch of keys, answer each with `fn`, and queue the results.
 * `requests` is the op's request counter; the latency of a batch answered
 * is recorded under `lat` unless it is negative. */
static enum srv_next keys_op(struct srv_conn *c, enum srv_counter requests, key_op_fn fn, int lat)
{
	struct proto_batch b;
	uint32_t body_bytes;
	uint8_t *body;
	int rc = batch_decode(c, &b, 0);

	srv_stats_add(&c->w->stats, requests, 1);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	if (srv_conn_results_begin(c, b.count, 0, &body, &body_bytes) < 0)
		return SRV_NEXT_ABORT;
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_result res = { 0 };

		fn(c, proto_key_entry(&b, i), &res);
		proto_result_encode(body, i, &res);
	}
	srv_conn_reply_commit(c, body_bytes);
	if (lat >= 0)
		srv_conn_lat_record(c, lat);
	return SRV_NEXT_HEADER;
}

static void exists_one(struct srv_conn *c, const uint8_t *key, struct proto_result *res)
{
	uint64_t length;
	uint8_t tier;
	int rc = store_exists_where(c->w->srv->store, c->ns_id, key, &length, &tier);

	res->status = proto_status_from_errno(rc);
	if (rc == 0) {
		res->tier = tier == STORE_TIER_NVME ? PROTO_TIER_NVME : PROTO_TIER_DRAM;
		res->length = length;
	}
	srv_stats_add(&c->w->stats, rc == 0 ? SRV_C_exists_hits : SRV_C_exists_misses, 1);
}

static enum srv_next op_exists(struct srv_conn *c)
{
	return keys_op(c, SRV_C_exists_requests, exists_one, SRV_LAT_EXISTS);
}

/* DELETE: every key of the batch in one store call, so that a batch of
 * blocks on NVMe costs one synced index write, not one per key. */
static enum srv_next op_delete(struct srv_conn *c)
{
	uint8_t (*keys)[STORE_KEY_BYTES];
	uint64_t removed = 0;
	struct proto_batch b;
	uint32_t body_bytes;
	uint8_t *body;
	int *st, rc;

	srv_stats_add(&c->w->stats, SRV_C_delete_requests, 1);
	if (!c->may_write)
		return done(deny_write(c, c->ns_name, strlen(c->ns_name)));
	rc = batch_decode(c, &b, 0);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	keys = malloc((b.count ? b.count : 1) * sizeof(*keys));
	st = malloc((b.count ? b.count : 1) * sizeof(*st));
	if (!keys || !st || srv_conn_results_begin(c, b.count, 0, &body, &body_bytes) < 0) {
		free(keys);
		free(st);
		return SRV_NEXT_ABORT;
	}
	for (uint32_t i = 0; i < b.count; i++)
		memcpy(keys[i], proto_key_entry(&b, i), STORE_KEY_BYTES);
	(void)store_delete_many(c->w->srv->store, c->ns_id, (const uint8_t (*)[STORE_KEY_BYTES])keys,
				b.count, st, &removed);
	for (uint32_t i = 0; i < b.count; i++) {
		struct proto_result res = { .status = proto_status_from_errno(st[i]) };

		proto_result_encode(body, i, &res);
	}
	srv_stats_add(&c->w->stats, SRV_C_delete_blocks, removed);
	free(keys);
	free(st);
	srv_conn_reply_commit(c, body_bytes);
	return SRV_NEXT_HEADER;
}

/* ---- DROP_NAMESPACE, STATS, PING ---------------------------------------- */

/* Decode a name body; answers malformed ones. Returns 0, 1 when an error
 * reply was queued, or -ENOMEM. */
static int name_decode(struct srv_conn *c, const char **name, uint16_t *len)
{
	int rc;

	if (proto_name_decode(c->body, c->hdr.body_bytes, name, len) == 0)
		return 0;
	rc = reply_err(c, PROTO_STATUS_BAD_REQUEST,
		       "malformed name body: name of 0..255 bytes of 0x21..0x7e");
	return rc < 0 ? -ENOMEM : 1;
}

/* May this session drop namespace name[0..len) (len 0: its own)? Its
 * own needs a read-write token; another one needs a token that grants
 * that namespace read-write. Returns 0 (allowed), or 1 when a DENIED
 * reply saying why was queued, or -ENOMEM. */
static int drop_refused(struct srv_conn *c, const char *name, uint16_t len)
{
	struct srv_auth *a = c->w->srv->auth;
	enum srv_access access;

	if (len == 0) {
		if (c->may_write)
			return 0;
		return deny_write(c, c->ns_name, strlen(c->ns_name)) < 0 ? -ENOMEM : 1;
	}
	if (!a)
		return c->may_write ? 0 : (deny_write(c, name, len) < 0 ? -ENOMEM : 1);
	access = srv_auth_access(a, c->token_digest, name, len);
	if (access == SRV_ACCESS_RW)
		return 0;
	if (access == SRV_ACCESS_RO)
		return deny_write(c, name, len) < 0 ? -ENOMEM : 1;
	return reply_err(c, PROTO_STATUS_DENIED, "drop_namespace refused: the token does not "
			 "grant namespace %.*s", (int)len, name) < 0 ? -ENOMEM : 1;
}

static enum srv_next op_drop(struct srv_conn *c)
{
	struct store *st = c->w->srv->store;
	uint8_t reply[PROTO_DROP_REPLY_BYTES];
	uint64_t blocks = 0, bytes = 0;
	const char *name;
	uint16_t len;
	uint32_t ns_id = c->ns_id;
	int rc = name_decode(c, &name, &len);

	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	rc = drop_refused(c, name, len);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	/* By name: look it up, never create it (PROTOCOL.md 6.7). */
	if (len)
		rc = store_namespace_find(st, name, len, &ns_id);
	if (rc == 0)
		rc = store_drop_namespace(st, ns_id, &blocks, &bytes);
	if (rc < 0 && rc != -ENOENT)
		return done(reply_err(c, proto_status_from_errno(rc), "drop failed: %s",
				      strerror(-rc)));
	/* A namespace that does not exist is dropped trivially: OK, 0 and 0. */
	srv_log(rc == 0 ? SRV_LOG_INFO : SRV_LOG_DEBUG,
		"conn %" PRIu64 " %s: dropped namespace %.*s%s: %" PRIu64 " blocks, %" PRIu64 " bytes",
		c->id, c->peer, len ? (int)len : (int)strlen(c->ns_name), len ? name : c->ns_name,
		rc == 0 ? "" : " (no such namespace)", blocks, bytes);
	proto_drop_reply_encode(blocks, bytes, reply);
	return done(reply_fixed(c, reply, sizeof(reply)));
}

/* With a tokens file, a token sees its own tenant's row of "tenants"
 * only (what others retain, their budgets and refusals are theirs); a
 * token that grants "*" (an operator's) sees every row. */
static void stats_own_tenant(struct srv_conn *c, struct srv_snapshot *snap)
{
	struct srv_stats_doc *d = &snap->doc;
	char id[SRV_TENANT_ID_CHARS + 1];
	uint32_t kept = 0;

	if (!c->w->srv->auth || !d->tenants_on ||
	    srv_auth_grants_all(c->w->srv->auth, c->token_digest))
		return;
	for (int k = 0; k < SRV_TENANT_ID_CHARS / 2; k++)
		snprintf(id + 2 * k, 3, "%02x", c->token_digest[k]);
	for (uint32_t i = 0; i < d->tenant_count; i++)
		if (strcmp(snap->tenants[i].id, id) == 0)
			snap->tenants[kept++] = snap->tenants[i];
	d->tenant_count = kept;
}

/* Render the STATS document into body. Errors: -ENOMEM. */
static int stats_render(struct srv_conn *c, const char *name, uint16_t len, struct evbuffer *body)
{
	struct srv_snapshot *snap;
	int rc = srv_snapshot_take(c->w->srv, name, len, &snap);

	if (rc < 0)
		return rc;
	stats_own_tenant(c, snap);
	rc = srv_stats_json(&snap->doc, body);
	srv_snapshot_free(snap);
	return rc;
}

/* The STATS document is the server's own text, bounded by the namespace
 * cap (~260 bytes each, ~1.1 MB at 4096), so it is not held to
 * max_frame_bytes, which bounds what the server accepts. */
#define SRV_STATS_MAX_BYTES (16u << 20)

static enum srv_next op_stats(struct srv_conn *c)
{
	uint32_t max_body = SRV_STATS_MAX_BYTES;
	struct evbuffer *body;
	const char *name;
	uint16_t len;
	int rc = name_decode(c, &name, &len);

	/* Counted first, so the document includes this request. */
	srv_stats_add(&c->w->stats, SRV_C_stats_requests, 1);
	if (rc)
		return rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_HEADER;
	/* With auth, one namespace's figures only if the token grants it. */
	if (len && c->w->srv->auth &&
	    srv_auth_access(c->w->srv->auth, c->token_digest, name, len) == SRV_ACCESS_NONE)
		return done(reply_err(c, PROTO_STATUS_DENIED,
				      "stats refused: the token does not grant namespace %.*s",
				      (int)len, name));
	body = evbuffer_new();
	if (!body)
		return SRV_NEXT_ABORT;
	rc = stats_render(c, name, len, body);
	if (rc == 0 && evbuffer_get_length(body) > max_body)
		rc = reply_err(c, PROTO_STATUS_TOO_LARGE,
			       "stats document of %zu bytes exceeds %u bytes; ask per namespace",
			       evbuffer_get_length(body), max_body);
	else if (rc == 0)
		rc = srv_conn_reply_buffer(c, PROTO_STATUS_OK, body);
	evbuffer_free(body);
	return done(rc);
}

static enum srv_next op_ping(struct srv_conn *c)
{
	srv_stats_add(&c->w->stats, SRV_C_ping_requests, 1);
	if (c->hdr.body_bytes)
		return done(reply_err(c, PROTO_STATUS_BAD_REQUEST, "ping body must be empty"));
	return done(reply_fixed(c, NULL, 0));
}

/* ---- dispatch ------------------------------------------------------------- */

/* The tokens file was reloaded since this session's token was checked:
 * check it again against the namespace it bound, so that a token removed
 * or narrowed by SIGHUP loses what it no longer grants at its next
 * request. Narrowed to read-only: writes are refused from now on. No
 * longer granted (token removed, or its grants no longer cover the
 * namespace): the session is revoked - its leases end now, and this and
 * every later request but PING are answered DENIED with the reason (a
 * PUT's payload is discarded). The socket stays open so that the client
 * reads the reason rather than a reset; it closes when the client does,
 * or after idle_timeout_ms. Returns 0 to go on, or 1 with *next set
 * after the refusal. */
int srv_request_auth_recheck(struct srv_conn *c, enum srv_next *next)
{
	struct srv_auth *a = c->w->srv->auth;
	uint64_t gen;
	enum srv_access access;
	int rc;

	if (!a)
		return 0;
	gen = srv_auth_generation(a);
	if (!c->revoked && gen != c->auth_gen) {
		access = srv_auth_access(a, c->token_digest, c->ns_name, strlen(c->ns_name));
		if (access == SRV_ACCESS_NONE) {
			c->revoked = srv_auth_known(a, c->token_digest) ? SRV_REVOKED_NAMESPACE :
									   SRV_REVOKED_TOKEN;
			srv_info("conn %" PRIu64 " %s: %s (tokens file reloaded): requests refused "
				 "from now on", c->id, c->peer, c->revoked == SRV_REVOKED_TOKEN ?
				 "token revoked" : "token no longer grants its namespace");
			store_lessee_free(c->w->srv->store, c->lessee);
			c->lessee = NULL;
		} else {
			if (c->may_write && access != SRV_ACCESS_RW)
				srv_info("conn %" PRIu64 " %s: token narrowed to read-only in "
					 "namespace %s (tokens file reloaded)", c->id, c->peer,
					 c->ns_name);
			c->may_write = access == SRV_ACCESS_RW;
			c->auth_gen = gen;
		}
	}
	if (!c->revoked)
		return 0;
	if (c->hdr.opcode == PROTO_OP_PUT) {
		srv_stats_add(&c->w->stats, SRV_C_put_requests, 1);
		srv_stats_add(&c->w->stats, SRV_C_put_errors, 1);
	}
	c->skip_bytes = c->hdr.payload_bytes;
	rc = reply_err(c, PROTO_STATUS_DENIED, "%s refused: %s (the tokens file was reloaded); "
		       "connect with a valid token", proto_op_name(c->hdr.opcode),
		       c->revoked == SRV_REVOKED_TOKEN ? "the token was revoked" :
							 "the token no longer grants this namespace");
	*next = rc < 0 ? SRV_NEXT_ABORT : SRV_NEXT_SKIP;
	return 1;
}

enum srv_next srv_request_dispatch(struct srv_conn *c)
{
	uint8_t op = c->hdr.opcode;

	if (!c->hello_done && op != PROTO_OP_HELLO && op != PROTO_OP_PING) {
		if (op == PROTO_OP_PUT)
			srv_stats_add(&c->w->stats, SRV_C_put_requests, 1);
		c->skip_bytes = c->hdr.payload_bytes;
		return reply_err(c, PROTO_STATUS_BAD_REQUEST, "hello required") < 0 ?
			       SRV_NEXT_ABORT : SRV_NEXT_SKIP;
	}
	/* Frames may carry any version from 1 to the one HELLO agreed: each
	 * body has its own header's layout, and so has the reply. */
	if (c->hello_done && c->hdr.version > c->version) {
		if (op == PROTO_OP_PUT)
			srv_stats_add(&c->w->stats, SRV_C_put_requests, 1);
		c->skip_bytes = c->hdr.payload_bytes;
		return reply_err(c, PROTO_STATUS_BAD_REQUEST,
				 "frame of protocol version %u on a connection that agreed version %u",
				 c->hdr.version, c->version) < 0 ? SRV_NEXT_ABORT : SRV_NEXT_SKIP;
	}
	if (c->hello_done && op != PROTO_OP_PING && c->w->srv->auth) {
		enum srv_next next;

		if (srv_request_auth_recheck(c, &next))
			return next;
	}
	switch (op) {
	case PROTO_OP_HELLO:
		return op_hello(c);
	case PROTO_OP_PUT:
		srv_stats_add(&c->w->stats, SRV_C_put_requests, 1);
		if (!c->may_write) {
			srv_stats_add(&c->w->stats, SRV_C_put_errors, 1);
			c->skip_bytes = c->hdr.payload_bytes;
			return deny_write(c, c->ns_name, strlen(c->ns_name)) < 0 ? SRV_NEXT_ABORT :
										   SRV_NEXT_SKIP;
		}
		return srv_put_start(c);
	case PROTO_OP_GET:
		srv_conn_ns_attach(c); /* created since HELLO? (else: misses) */
		return op_get(c);
	case PROTO_OP_EXISTS:
		srv_conn_ns_attach(c);
		return op_exists(c);
	case PROTO_OP_MATCH:
		srv_conn_ns_attach(c);
		return srv_match_start(c);
	case PROTO_OP_DELETE:
		srv_conn_ns_attach(c);
		return op_delete(c);
	case PROTO_OP_DROP_NAMESPACE:
		srv_conn_ns_attach(c);
		return op_drop(c);
	case PROTO_OP_STATS:
		return op_stats(c);
	case PROTO_OP_PING:
		return op_ping(c);
	default:
		/* The header decoder lets only known opcodes through. */
		return done(reply_err(c, PROTO_STATUS_UNSUPPORTED, "unknown opcode %u", op));
	}
}
