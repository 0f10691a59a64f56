/*
 * etcd.h - a small client of etcd's v3 JSON gateway (etcd 3.4 serves it
 * under /v3/), on libcurl and json-c. Internal to libkvpool; kvpoold links
 * it too (its registration, server/srv_etcd.c).
 *
 * Only what kvpool needs: range by prefix, get one key, put (optionally
 * under a lease, optionally only if the key is unchanged), delete
 * (optionally only if the key is under a given lease), lease grant /
 * keepalive (one renewal per call) / revoke, and a prefix watch from a
 * revision. Keys and values are base64 on the wire and int64s are JSON
 * strings; both are hidden here. The conditional forms are one etcd
 * transaction each (POST /v3/kv/txn), so nothing can change between the
 * compare and the write.
 *
 * Several endpoints. A handle may name several members of one etcd
 * cluster ("a:2379,b:2379,c:2379"): each call goes to the member that
 * answered last and, when that one cannot be reached (refused, host
 * unknown, timed out), to each other member in turn before failing; a
 * watch does the same when it connects.
 *
 * Errors (every call): -EINVAL (bad arguments), -ENOMEM, -ECONNREFUSED
 * (no endpoint reachable: connect refused, host unknown, connection
 * dropped before a reply), -ETIMEDOUT (no reply within the handle's
 * timeout from the last endpoint tried), -EPROTO (HTTP status other than
 * 200, a reply that is not the JSON expected, or an etcd error other than
 * those listed per call).
 *
 * Threads: one handle, one thread at a time (it owns one curl easy
 * handle). A watch blocks its thread: give it a handle of its own.
 */
#ifndef KVC_ETCD_H
#define KVC_ETCD_H

#include <stddef.h>
#include <stdint.h>

#define KVC_ETCD_DEFAULT_PORT 2379
#define KVC_ETCD_ENDPOINT_MAX_BYTES 300 /* the whole endpoint list */
#define KVC_ETCD_MAX_ENDPOINTS 8

struct kvc_etcd;

/* One key and its value as read from etcd (all owned by the array). */
struct kvc_etcd_kv {
	char *key;           /* NUL-terminated */
	uint8_t *value;      /* value_len bytes, plus a NUL after them */
	size_t value_len;
	int64_t mod_revision;
	int64_t lease;       /* 0 when none */
};

enum kvc_etcd_event {
	KVC_ETCD_PUT = 0,
	KVC_ETCD_DELETE = 1,
	KVC_ETCD_WATCHING = 2, /* the watch is established (kv is NULL) */
};

/* Constructor. endpoint: "host:port" or "host" (port 2379), no scheme
 * (http:// is added), or up to KVC_ETCD_MAX_ENDPOINTS of them separated by
 * commas (members of one etcd cluster); copied. timeout_ms bounds each
 * unary call on one endpoint (connect included) and each watch's connect.
 * Errors: -EINVAL (empty, too long, an empty item, more than
 * KVC_ETCD_MAX_ENDPOINTS items, '/', '@', '?', '#' or blanks), -ENOMEM.
 * Does not talk to etcd. */
int kvc_etcd_open(const char *endpoint, uint32_t timeout_ms, struct kvc_etcd **out);

/* How many endpoints the handle has (0 for NULL). Pure. */
size_t kvc_etcd_endpoints(const struct kvc_etcd *e);

/* "host:port" of the endpoint calls go to now ("" for NULL). Valid while
 * the handle lives; the handle's thread only. */
const char *kvc_etcd_current(const struct kvc_etcd *e);

/* How many times a call or watch moved to another endpoint. */
uint64_t kvc_etcd_failovers(const struct kvc_etcd *e);

/* Destructor; accepts NULL. */
void kvc_etcd_close(struct kvc_etcd *e);

/* Every key starting with `prefix` (NUL-terminated, non-empty), sorted by
 * key. *kvs (malloc'd array of *n, free with kvc_etcd_kvs_free; NULL when
 * *n is 0) and *revision (the store's revision the read saw: watch from
 * revision + 1 to miss nothing) are written on success. */
int kvc_etcd_range_prefix(struct kvc_etcd *e, const char *prefix, struct kvc_etcd_kv **kvs,
			  size_t *n, int64_t *revision);

/* Free what kvc_etcd_range_prefix returned; accepts NULL. */
void kvc_etcd_kvs_free(struct kvc_etcd_kv *kvs, size_t n);

/* Read exactly `key` into *out (free with kvc_etcd_kv_free): value,
 * mod_revision, lease. Errors: also -ENOENT (no such key). */
int kvc_etcd_get(struct kvc_etcd *e, const char *key, struct kvc_etcd_kv *out);

/* Free what kvc_etcd_get wrote (and zero it); accepts NULL. */
void kvc_etcd_kv_free(struct kvc_etcd_kv *kv);

/* Put key = value[0..len) under lease `lease` (0: none). Errors: also
 * -ENOENT (the lease does not exist or expired). */
int kvc_etcd_put(struct kvc_etcd *e, const char *key, const void *value, size_t len,
		 int64_t lease);

/* Put as kvc_etcd_put, but only if the key's mod_revision is still
 * `mod_revision` (0: only if the key does not exist), in one transaction.
 * Errors: also -EEXIST (the key changed, or exists when 0 was given:
 * nothing written), -ENOENT (the lease does not exist). */
int kvc_etcd_put_if(struct kvc_etcd *e, const char *key, const void *value, size_t len,
		    int64_t lease, int64_t mod_revision);

/* Delete `key` (exactly that key). *deleted (may be NULL): 0 or 1. */
int kvc_etcd_delete(struct kvc_etcd *e, const char *key, int64_t *deleted);

/* Delete `key` only if it is attached to lease `lease` (nonzero), in one
 * transaction: a record another process put under its own lease stays.
 * *deleted (may be NULL): 1 when deleted, 0 when the key was absent or
 * under another lease. */
int kvc_etcd_delete_if_lease(struct kvc_etcd *e, const char *key, int64_t lease,
			     int64_t *deleted);

/* Grant a lease of ttl_s seconds (>= 1); *id receives it. */
int kvc_etcd_lease_grant(struct kvc_etcd *e, int64_t ttl_s, int64_t *id);

/* Renew lease `id` once. *ttl_s (may be NULL) receives the seconds it now
 * has. Errors: also -ENOENT (the lease expired or never existed). */
int kvc_etcd_lease_keepalive(struct kvc_etcd *e, int64_t id, int64_t *ttl_s);

/* Revoke lease `id` (its keys go). Errors: also -ENOENT (no such lease). */
int kvc_etcd_lease_revoke(struct kvc_etcd *e, int64_t id);

/* Called by kvc_etcd_watch_prefix for each event, in revision order,
 * and once with KVC_ETCD_WATCHING (kv NULL) when etcd has set the watch
 * up. kv is valid for the call only. A nonzero return stops the watch (the
 * watch then returns that value). */
typedef int (*kvc_etcd_watch_fn)(void *arg, enum kvc_etcd_event type,
				 const struct kvc_etcd_kv *kv);

/* Watch every key under `prefix` from revision `start_revision` (>= 1),
 * blocking, until `*stop` becomes nonzero (checked whenever libcurl calls
 * its progress function: about once a second on an idle stream, so a stop
 * takes up to ~1 s; returns 0), `fn` returns nonzero (returns that), or the stream ends.
 * *next_revision is always written: the revision to resume from (one past
 * the last event delivered, or start_revision if none), so a dropped
 * watch loses nothing when it is started again from there.
 * Errors: -ECONNRESET (the stream broke or etcd closed it), -ESTALE (the
 * start revision was compacted, or the store is behind it - etcd was
 * wiped or replaced - or its cluster id changed since this handle's last
 * reply: read the prefix again, then watch from the revision of that
 * read + 1), and the shared errors (connect, on every endpoint). */
int kvc_etcd_watch_prefix(struct kvc_etcd *e, const char *prefix, int64_t start_revision,
			  kvc_etcd_watch_fn fn, void *arg, const volatile int *stop,
			  int64_t *next_revision);

/* ---- the kvpool layout in etcd ------------------------------------------ */

/* Node records live under "kvpool/<cluster>/nodes/<node name>". */
#define KVC_ETCD_NODES_FMT "kvpool/%s/nodes/"
#define KVC_ETCD_CLUSTER_MAX_BYTES 64

/* Split "etcd://HOST[:PORT][,HOST[:PORT]...]/CLUSTER" into endpoint
 * ("HOST[:PORT][,...]", what kvc_etcd_open takes) and cluster (1..64
 * bytes of [A-Za-z0-9._-]), NUL-terminated, into buffers of endpoint_cap
 * and cluster_cap bytes. Pure.
 * Errors: -EINVAL (another scheme, no host, an empty host in the list,
 * more than KVC_ETCD_MAX_ENDPOINTS hosts, a bad cluster name, too long for
 * the buffers), -ENOMEM; nothing is written then. */
int kvc_etcd_url_parse(const char *url, char *endpoint, size_t endpoint_cap, char *cluster,
		       size_t cluster_cap);

#endif /* KVC_ETCD_H */
