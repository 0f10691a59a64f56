/*
 * etcd.c - etcd v3 JSON gateway client (see etcd.h), shared by kvpoold
 * and libkvpool: each unary call is
 * one HTTP POST of a JSON body to http://ENDPOINT/v3/..., parsed with
 * json-c; the watch is one long POST whose reply is a stream of JSON
 * objects, one per line, parsed as they arrive.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"

#define ETCD_REPLY_MAX_BYTES (16u << 20) /* a unary reply larger than this is -EPROTO */
#define ETCD_GRPC_NOT_FOUND 5            /* gRPC status code etcd reports for a missing lease */
#define ETCD_BASE_BYTES (KVC_ETCD_ENDPOINT_MAX_BYTES + 16)

struct kvc_etcd {
	CURL *curl;
	char base[KVC_ETCD_MAX_ENDPOINTS][ETCD_BASE_BYTES]; /* "http://host:port" each */
	size_t n_base;
	size_t cur;                   /* the endpoint that answered last */
	uint32_t timeout_ms;
	uint64_t cluster_id;          /* from the last reply's header; 0 = none yet */
	uint64_t failovers;
};

/* A growing reply buffer (NUL-terminated). */
struct buf {
	char *p;
	size_t len, cap;
	int too_big;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_init_rc;

static void curl_init_once(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -ENOMEM;
}

/* Split "host[:port][,host[:port]...]" into "http://host:port" bases.
 * Returns how many, or -EINVAL (empty item, too many, a forbidden byte). */
static int parse_endpoints(const char *list, char (*base)[ETCD_BASE_BYTES])
{
	size_t n = 0, len = strlen(list);
	const char *p = list;

	if (len == 0 || len > KVC_ETCD_ENDPOINT_MAX_BYTES || strpbrk(list, "/ \t\r\n?#@"))
		return -EINVAL;
	for (;;) {
		size_t k = strcspn(p, ",");
		const char *rb;
		char item[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];

		if (k == 0 || n == KVC_ETCD_MAX_ENDPOINTS)
			return -EINVAL;
		memcpy(item, p, k);
		item[k] = 0;
		if (item[0] == ':' || (item[0] == '[' && !strchr(item, ']')))
			return -EINVAL;
		rb = strrchr(item, ']');
		snprintf(base[n++], ETCD_BASE_BYTES, "http://%s%s", item,
			 strchr(rb ? rb : item, ':') ? "" : ":2379");
		p += k;
		if (!*p)
			break;
		p++;
	}
	return (int)n;
}

int kvc_etcd_open(const char *endpoint, uint32_t timeout_ms, struct kvc_etcd **out)
{
	struct kvc_etcd *e;
	int n;

	if (!endpoint || !out)
		return -EINVAL;
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_rc)
		return curl_init_rc;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	n = parse_endpoints(endpoint, e->base);
	if (n < 0) {
		free(e);
		return n;
	}
	e->n_base = (size_t)n;
	e->curl = curl_easy_init();
	if (!e->curl) {
		free(e);
		return -ENOMEM;
	}
	e->timeout_ms = timeout_ms ? timeout_ms : 2000;
	*out = e;
	return 0;
}

size_t kvc_etcd_endpoints(const struct kvc_etcd *e)
{
	return e ? e->n_base : 0;
}

const char *kvc_etcd_current(const struct kvc_etcd *e)
{
	return e ? e->base[e->cur] + 7 : "";
}

uint64_t kvc_etcd_failovers(const struct kvc_etcd *e)
{
	return e ? e->failovers : 0;
}

void kvc_etcd_close(struct kvc_etcd *e)
{
	if (!e)
		return;
	curl_easy_cleanup(e->curl);
	free(e);
}

/* ---- base64 and JSON helpers --------------------------------------------- */

static char *b64_encode(const void *data, size_t len)
{
	char *s = malloc(4 * ((len + 2) / 3) + 1);

	if (s)
		EVP_EncodeBlock((unsigned char *)s, data, (int)len);
	return s;
}

/* Decode base64 into a malloc'd buffer (NUL added); -1 on bad input. */
static int b64_decode(const char *s, uint8_t **out, size_t *out_len)
{
	size_t n = strlen(s), pad = 0;
	uint8_t *p;
	int got;

	if (n % 4)
		return -1;
	p = malloc(n / 4 * 3 + 1);
	if (!p)
		return -1;
	got = n ? EVP_DecodeBlock(p, (const unsigned char *)s, (int)n) : 0;
	if (got < 0) {
		free(p);
		return -1;
	}
	if (n && s[n - 1] == '=')
		pad++;
	if (n > 1 && s[n - 2] == '=')
		pad++;
	*out_len = (size_t)got - pad;
	p[*out_len] = 0;
	*out = p;
	return 0;
}

/* An int64 field sent as a JSON string (or number); 0 when absent. */
static int64_t json_i64(struct json_object *o, const char *field)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, field, &v))
		return 0;
	if (json_object_is_type(v, json_type_string))
		return strtoll(json_object_get_string(v), NULL, 10);
	return json_object_get_int64(v);
}

static int add_b64(struct json_object *o, const char *field, const void *data, size_t len)
{
	char *s = b64_encode(data, len);

	if (!s)
		return -ENOMEM;
	json_object_object_add(o, field, json_object_new_string(s));
	free(s);
	return 0;
}

static int add_i64(struct json_object *o, const char *field, int64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRId64, v);
	json_object_object_add(o, field, json_object_new_string(s));
	return 0;
}

/* The end of the key range of everything that starts with prefix: the
 * prefix with its last byte below 0xff incremented (bytes after it dropped). */
static int prefix_end(const char *prefix, uint8_t *end, size_t *end_len)
{
	size_t n = strlen(prefix);

	memcpy(end, prefix, n);
	while (n > 0 && end[n - 1] == 0xff)
		n--;
	if (n == 0) {
		end[0] = 0; /* "\0": every key */
		*end_len = 1;
		return 0;
	}
	end[n - 1]++;
	*end_len = n;
	return 0;
}

/* Decode one "kv" object of a reply into kv (owned strings). */
static int decode_kv(struct json_object *o, struct kvc_etcd_kv *kv)
{
	struct json_object *k, *v;
	uint8_t *key = NULL;
	size_t key_len;

	memset(kv, 0, sizeof(*kv));
	if (!json_object_object_get_ex(o, "key", &k) || b64_decode(json_object_get_string(k),
								   &key, &key_len))
		return -EPROTO;
	if (memchr(key, 0, key_len)) {
		free(key);
		return -EPROTO;
	}
	kv->key = (char *)key;
	if (json_object_object_get_ex(o, "value", &v)) {
		if (b64_decode(json_object_get_string(v), &kv->value, &kv->value_len)) {
			free(kv->key);
			return -EPROTO;
		}
	} else {
		kv->value = calloc(1, 1);
		if (!kv->value) {
			free(kv->key);
			return -ENOMEM;
		}
	}
	kv->mod_revision = json_i64(o, "mod_revision");
	kv->lease = json_i64(o, "lease");
	return 0;
}

/* ---- HTTP ------------------------------------------------------------------ */

static size_t collect(char *data, size_t size, size_t nmemb, void *arg)
{
	struct buf *b = arg;
	size_t n = size * nmemb;

	if (b->len + n + 1 > ETCD_REPLY_MAX_BYTES) {
		b->too_big = 1;
		return 0;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p)
			return 0;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = 0;
	return n;
}

static int curl_errno(CURLcode rc)
{
	switch (rc) {
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_GOT_NOTHING:
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_PARTIAL_FILE:
		return -ECONNREFUSED;
	default:
		return -EPROTO;
	}
}

/* Common options of one POST of `body` to endpoint `which` + path. */
static void setup_post(struct kvc_etcd *e, size_t which, const char *path, const char *body,
		       char *url, size_t url_cap, struct curl_slist *hdrs)
{
	snprintf(url, url_cap, "%s%s", e->base[which], path);
	curl_easy_reset(e->curl);
	curl_easy_setopt(e->curl, CURLOPT_URL, url);
	curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
	curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http");
	curl_easy_setopt(e->curl, CURLOPT_NOPROXY, "*");
}

/* Note the cluster id a reply's header carries (etcd replaced by another
 * cluster shows up as a new id). */
static void note_header(struct kvc_etcd *e, struct json_object *o)
{
	struct json_object *hdr, *v;

	if (json_object_object_get_ex(o, "header", &hdr) &&
	    json_object_object_get_ex(hdr, "cluster_id", &v))
		e->cluster_id = strtoull(json_object_get_string(v), NULL, 10);
}

/* One POST of `body` to endpoint `which`; *reply as for call(). */
static int call_one(struct kvc_etcd *e, size_t which, const char *path, const char *body,
		    struct json_object **reply)
{
	char url[ETCD_BASE_BYTES + 64];
	struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	struct buf b = { 0 };
	struct json_object *o, *err;
	CURLcode rc;
	long status = 0;
	int ret = 0;

	if (!hdrs)
		return -ENOMEM;
	setup_post(e, which, path, body, url, sizeof(url), hdrs);
	curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
	curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, &b);
	rc = curl_easy_perform(e->curl);
	curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(hdrs);
	if (rc != CURLE_OK) {
		ret = b.too_big ? -EPROTO : rc == CURLE_WRITE_ERROR ? -ENOMEM : curl_errno(rc);
		goto out;
	}
	o = b.p ? json_tokener_parse(b.p) : NULL;
	if (!o || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		ret = -EPROTO;
		goto out;
	}
	if (json_object_object_get_ex(o, "error", &err) || status != 200) {
		ret = json_i64(o, "code") == ETCD_GRPC_NOT_FOUND ? -ENOENT : -EPROTO;
		json_object_put(o);
		goto out;
	}
	note_header(e, o);
	*reply = o;
out:
	free(b.p);
	return ret;
}

/* POST req (consumed) to path on the endpoint that answered last; when it
 * cannot be reached (refused, timed out), on each other endpoint in turn.
 * *reply receives the parsed JSON object (caller puts it). An etcd error
 * object becomes -ENOENT (not found) or -EPROTO. */
static int call(struct kvc_etcd *e, const char *path, struct json_object *req,
		struct json_object **reply)
{
	const char *body;
	int rc = -ECONNREFUSED;

	if (!req)
		return -ENOMEM;
	body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	for (size_t i = 0; i < e->n_base; i++) {
		size_t which = (e->cur + i) % e->n_base;

		rc = call_one(e, which, path, body, reply);
		if (rc != -ECONNREFUSED && rc != -ETIMEDOUT) {
			if (which != e->cur) {
				e->cur = which;
				e->failovers++;
			}
			break;
		}
	}
	json_object_put(req);
	return rc;
}

/* ---- unary calls ------------------------------------------------------------ */

int kvc_etcd_range_prefix(struct kvc_etcd *e, const char *prefix, struct kvc_etcd_kv **kvs,
			  size_t *n, int64_t *revision)
{
	struct json_object *req, *reply = NULL, *hdr, *arr;
	uint8_t end[KVC_ETCD_ENDPOINT_MAX_BYTES + 256];
	size_t end_len, count = 0;
	struct kvc_etcd_kv *out = NULL;
	int rc;

	if (!e || !prefix || !*prefix || strlen(prefix) > sizeof(end) || !kvs || !n || !revision)
		return -EINVAL;
	prefix_end(prefix, end, &end_len);
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	if (add_b64(req, "key", prefix, strlen(prefix)) || add_b64(req, "range_end", end, end_len)) {
		json_object_put(req);
		return -ENOMEM;
	}
	rc = call(e, "/v3/kv/range", req, &reply);
	if (rc)
		return rc;
	if (!json_object_object_get_ex(reply, "header", &hdr)) {
		rc = -EPROTO;
		goto out;
	}
	if (json_object_object_get_ex(reply, "kvs", &arr)) {
		size_t len = json_object_array_length(arr);

		out = len ? calloc(len, sizeof(*out)) : NULL;
		if (len && !out) {
			rc = -ENOMEM;
			goto out;
		}
		for (; count < len; count++) {
			rc = decode_kv(json_object_array_get_idx(arr, count), &out[count]);
			if (rc) {
				kvc_etcd_kvs_free(out, count);
				goto out;
			}
		}
	}
	*revision = json_i64(hdr, "revision");
	*kvs = out;
	*n = count;
out:
	json_object_put(reply);
	return rc;
}

void kvc_etcd_kvs_free(struct kvc_etcd_kv *kvs, size_t n)
{
	if (!kvs)
		return;
	for (size_t i = 0; i < n; i++) {
		free(kvs[i].key);
		free(kvs[i].value);
	}
	free(kvs);
}

int kvc_etcd_put(struct kvc_etcd *e, const char *key, const void *value, size_t len,
		 int64_t lease)
{
	struct json_object *req, *reply = NULL;
	int rc;

	if (!e || !key || !*key || (!value && len))
		return -EINVAL;
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	if (add_b64(req, "key", key, strlen(key)) || add_b64(req, "value", value ? value : "", len)) {
		json_object_put(req);
		return -ENOMEM;
	}
	if (lease)
		add_i64(req, "lease", lease);
	rc = call(e, "/v3/kv/put", req, &reply);
	json_object_put(reply);
	return rc;
}

int kvc_etcd_delete(struct kvc_etcd *e, const char *key, int64_t *deleted)
{
	struct json_object *req, *reply = NULL;
	int rc;

	if (!e || !key || !*key)
		return -EINVAL;
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	if (add_b64(req, "key", key, strlen(key))) {
		json_object_put(req);
		return -ENOMEM;
	}
	rc = call(e, "/v3/kv/deleterange", req, &reply);
	if (!rc && deleted)
		*deleted = json_i64(reply, "deleted");
	json_object_put(reply);
	return rc;
}

/* One txn: compare (array, consumed), then success ops (array, consumed),
 * no failure ops. *succeeded: whether the compare held. */
static int txn(struct kvc_etcd *e, struct json_object *compare, struct json_object *success,
	       int *succeeded)
{
	struct json_object *req = json_object_new_object(), *reply = NULL, *v;
	int rc;

	if (!req || !compare || !success) {
		json_object_put(req);
		json_object_put(compare);
		json_object_put(success);
		return -ENOMEM;
	}
	json_object_object_add(req, "compare", compare);
	json_object_object_add(req, "success", success);
	rc = call(e, "/v3/kv/txn", req, &reply);
	if (rc)
		return rc;
	*succeeded = json_object_object_get_ex(reply, "succeeded", &v) && json_object_get_boolean(v);
	json_object_put(reply);
	return 0;
}

/* {"key": key, "result": "EQUAL", "target": target, field: value} */
static struct json_object *cmp_eq(const char *key, const char *target, const char *field,
				  int64_t value)
{
	struct json_object *c = json_object_new_object();

	if (!c || add_b64(c, "key", key, strlen(key))) {
		json_object_put(c);
		return NULL;
	}
	json_object_object_add(c, "result", json_object_new_string("EQUAL"));
	json_object_object_add(c, "target", json_object_new_string(target));
	add_i64(c, field, value);
	return c;
}

int kvc_etcd_get(struct kvc_etcd *e, const char *key, struct kvc_etcd_kv *out)
{
	struct json_object *req, *reply = NULL, *arr;
	int rc;

	if (!e || !key || !*key || !out)
		return -EINVAL;
	req = json_object_new_object();
	if (!req || add_b64(req, "key", key, strlen(key))) {
		json_object_put(req);
		return -ENOMEM;
	}
	rc = call(e, "/v3/kv/range", req, &reply);
	if (rc)
		return rc;
	if (!json_object_object_get_ex(reply, "kvs", &arr) || json_object_array_length(arr) == 0)
		rc = -ENOENT;
	else
		rc = decode_kv(json_object_array_get_idx(arr, 0), out);
	json_object_put(reply);
	return rc;
}

void kvc_etcd_kv_free(struct kvc_etcd_kv *kv)
{
	if (!kv)
		return;
	free(kv->key);
	free(kv->value);
	memset(kv, 0, sizeof(*kv));
}

int kvc_etcd_put_if(struct kvc_etcd *e, const char *key, const void *value, size_t len,
		    int64_t lease, int64_t mod_revision)
{
	struct json_object *cmp, *ok, *op, *put;
	int rc, done = 0;

	if (!e || !key || !*key || (!value && len) || mod_revision < 0)
		return -EINVAL;
	cmp = json_object_new_array();
	ok = json_object_new_array();
	op = json_object_new_object();
	put = json_object_new_object();
	if (!cmp || !ok || !op || !put || add_b64(put, "key", key, strlen(key)) ||
	    add_b64(put, "value", value ? value : "", len)) {
		json_object_put(cmp);
		json_object_put(ok);
		json_object_put(op);
		json_object_put(put);
		return -ENOMEM;
	}
	/* a key that does not exist compares as mod_revision 0 */
	json_object_array_add(cmp, cmp_eq(key, "MOD", "mod_revision", mod_revision));
	if (lease)
		add_i64(put, "lease", lease);
	json_object_object_add(op, "request_put", put);
	json_object_array_add(ok, op);
	rc = txn(e, cmp, ok, &done);
	if (rc)
		return rc;
	return done ? 0 : -EEXIST;
}

int kvc_etcd_delete_if_lease(struct kvc_etcd *e, const char *key, int64_t lease,
			     int64_t *deleted)
{
	struct json_object *cmp, *ok, *op, *del;
	int rc, done = 0;

	if (deleted)
		*deleted = 0;
	if (!e || !key || !*key || lease == 0)
		return -EINVAL;
	cmp = json_object_new_array();
	ok = json_object_new_array();
	op = json_object_new_object();
	del = json_object_new_object();
	if (!cmp || !ok || !op || !del || add_b64(del, "key", key, strlen(key))) {
		json_object_put(cmp);
		json_object_put(ok);
		json_object_put(op);
		json_object_put(del);
		return -ENOMEM;
	}
	json_object_array_add(cmp, cmp_eq(key, "LEASE", "lease", lease));
	json_object_object_add(op, "request_delete_range", del);
	json_object_array_add(ok, op);
	rc = txn(e, cmp, ok, &done);
	if (rc == 0 && deleted)
		*deleted = done;
	return rc;
}

int kvc_etcd_lease_grant(struct kvc_etcd *e, int64_t ttl_s, int64_t *id)
{
	struct json_object *req, *reply = NULL;
	int64_t got;
	int rc;

	if (!e || ttl_s < 1 || !id)
		return -EINVAL;
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	add_i64(req, "TTL", ttl_s);
	rc = call(e, "/v3/lease/grant", req, &reply);
	if (rc)
		return rc;
	got = json_i64(reply, "ID");
	json_object_put(reply);
	if (got == 0)
		return -EPROTO;
	*id = got;
	return 0;
}

int kvc_etcd_lease_keepalive(struct kvc_etcd *e, int64_t id, int64_t *ttl_s)
{
	struct json_object *req, *reply = NULL, *res;
	int64_t ttl;
	int rc;

	if (!e || id == 0)
		return -EINVAL;
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	add_i64(req, "ID", id);
	rc = call(e, "/v3/lease/keepalive", req, &reply);
	if (rc)
		return rc;
	/* One message of the keepalive stream: {"result": {..., "TTL": "10"}};
	 * an expired lease comes back without a TTL. */
	if (!json_object_object_get_ex(reply, "result", &res)) {
		json_object_put(reply);
		return -EPROTO;
	}
	ttl = json_i64(res, "TTL");
	json_object_put(reply);
	if (ttl <= 0)
		return -ENOENT;
	if (ttl_s)
		*ttl_s = ttl;
	return 0;
}

int kvc_etcd_lease_revoke(struct kvc_etcd *e, int64_t id)
{
	struct json_object *req, *reply = NULL;
	int rc;

	if (!e || id == 0)
		return -EINVAL;
	req = json_object_new_object();
	if (!req)
		return -ENOMEM;
	add_i64(req, "ID", id);
	rc = call(e, "/v3/lease/revoke", req, &reply);
	json_object_put(reply);
	return rc;
}

/* ---- watch -------------------------------------------------------------------- */

struct watch {
	struct buf line;              /* bytes of the message being received */
	struct kvc_etcd *e;
	int64_t start_revision;
	kvc_etcd_watch_fn fn;
	void *arg;
	const volatile int *stop;
	int64_t next_revision;
	int result;                   /* what stops the stream: fn's value, -ESTALE, -EPROTO */
	int stopped;                  /* *stop was seen */
};

/* One complete message of the stream: {"result": {"events": [...]}} or an
 * error. Returns 0 to go on, else the watch's result. */
static int watch_message(struct watch *w, const char *text)
{
	struct json_object *o = json_tokener_parse(text), *res, *events;
	int ret = 0;

	if (!o)
		return -EPROTO;
	if (!json_object_object_get_ex(o, "result", &res)) {
		ret = -ECONNRESET; /* {"error": ...}: the gateway ended the stream */
		goto out;
	}
	if (json_i64(res, "compact_revision") > 0) {
		ret = -ESTALE;
		goto out;
	}
	if (json_object_object_get_ex(res, "canceled", &events) && json_object_get_boolean(events)) {
		ret = -ECONNRESET;
		goto out;
	}
	if (json_object_object_get_ex(res, "created", &events) && json_object_get_boolean(events)) {
		struct json_object *hdr, *v;
		uint64_t id = 0;

		/* etcd watches a revision it has not reached yet without a word,
		 * so a store that is behind where we resume from (etcd wiped, or
		 * replaced by another cluster) would never send the events we
		 * wait for: read everything again instead. */
		if (json_object_object_get_ex(res, "header", &hdr)) {
			if (json_object_object_get_ex(hdr, "cluster_id", &v))
				id = strtoull(json_object_get_string(v), NULL, 10);
			if (json_object_object_get_ex(hdr, "revision", &v) &&
			    json_i64(hdr, "revision") + 1 < w->start_revision)
				ret = -ESTALE;
		}
		if (id && w->e->cluster_id && id != w->e->cluster_id)
			ret = -ESTALE;
		if (id)
			w->e->cluster_id = id;
		if (ret)
			goto out;
		ret = w->fn(w->arg, KVC_ETCD_WATCHING, NULL);
		if (ret)
			goto out;
	}
	if (!json_object_object_get_ex(res, "events", &events))
		goto out;
	for (size_t i = 0; i < json_object_array_length(events) && !ret; i++) {
		struct json_object *ev = json_object_array_get_idx(events, i), *kvo, *type;
		struct kvc_etcd_kv kv;
		enum kvc_etcd_event t = KVC_ETCD_PUT;

		if (!json_object_object_get_ex(ev, "kv", &kvo)) {
			ret = -EPROTO;
			break;
		}
		if (json_object_object_get_ex(ev, "type", &type) &&
		    strcmp(json_object_get_string(type), "DELETE") == 0)
			t = KVC_ETCD_DELETE;
		ret = decode_kv(kvo, &kv);
		if (ret)
			break;
		if (kv.mod_revision >= w->next_revision)
			w->next_revision = kv.mod_revision + 1;
		ret = w->fn(w->arg, t, &kv);
		free(kv.key);
		free(kv.value);
	}
out:
	json_object_put(o);
	return ret;
}

static size_t watch_data(char *data, size_t size, size_t nmemb, void *arg)
{
	struct watch *w = arg;
	size_t n = size * nmemb;

	for (size_t i = 0; i < n; i++) {
		char ch = data[i];

		if (ch == '\n') {
			int rc = 0;

			if (w->line.len)
				rc = watch_message(w, w->line.p);
			w->line.len = 0;
			if (rc) {
				w->result = rc;
				return 0; /* abort the transfer */
			}
			continue;
		}
		if (collect(&ch, 1, 1, &w->line) != 1) {
			w->result = -ENOMEM;
			return 0;
		}
	}
	return n;
}

static int watch_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	struct watch *w = arg;

	(void)a, (void)b, (void)c, (void)d;
	if (w->stop && __atomic_load_n(w->stop, __ATOMIC_ACQUIRE)) {
		w->stopped = 1;
		return 1;
	}
	return 0;
}

/* One watch on endpoint `which`: the curl code, w filled in. */
static CURLcode watch_on(struct kvc_etcd *e, size_t which, const char *body, struct watch *w)
{
	char url[ETCD_BASE_BYTES + 64];
	struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	CURLcode rc;

	if (!hdrs)
		return CURLE_OUT_OF_MEMORY;
	setup_post(e, which, "/v3/watch", body, url, sizeof(url), hdrs);
	curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, watch_data);
	curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, w);
	curl_easy_setopt(e->curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(e->curl, CURLOPT_XFERINFOFUNCTION, watch_progress);
	curl_easy_setopt(e->curl, CURLOPT_XFERINFODATA, w);
	/* A dead etcd host shows up as a broken stream within ~20 s. */
	curl_easy_setopt(e->curl, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e->curl, CURLOPT_TCP_KEEPIDLE, 10L);
	curl_easy_setopt(e->curl, CURLOPT_TCP_KEEPINTVL, 5L);
	rc = curl_easy_perform(e->curl);
	curl_slist_free_all(hdrs);
	return rc;
}

int kvc_etcd_watch_prefix(struct kvc_etcd *e, const char *prefix, int64_t start_revision,
			  kvc_etcd_watch_fn fn, void *arg, const volatile int *stop,
			  int64_t *next_revision)
{
	uint8_t end[KVC_ETCD_ENDPOINT_MAX_BYTES + 256];
	size_t end_len;
	struct json_object *req, *create;
	struct watch w = { .e = e, .start_revision = start_revision, .fn = fn, .arg = arg,
			   .stop = stop, .next_revision = start_revision };
	CURLcode rc = CURLE_COULDNT_CONNECT;
	const char *body;
	int ret;

	if (next_revision)
		*next_revision = start_revision;
	if (!e || !prefix || !*prefix || strlen(prefix) > sizeof(end) || start_revision < 1 ||
	    !fn || !next_revision)
		return -EINVAL;
	prefix_end(prefix, end, &end_len);
	req = json_object_new_object();
	create = json_object_new_object();
	if (!req || !create || add_b64(create, "key", prefix, strlen(prefix)) ||
	    add_b64(create, "range_end", end, end_len)) {
		json_object_put(req);
		json_object_put(create);
		return -ENOMEM;
	}
	add_i64(create, "start_revision", start_revision);
	json_object_object_add(req, "create_request", create);
	body = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	/* The endpoint that answered last, then the others while they cannot
	 * be connected to. */
	for (size_t i = 0; i < e->n_base; i++) {
		size_t which = (e->cur + i) % e->n_base;

		w.line.len = 0;
		rc = watch_on(e, which, body, &w);
		if (rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST &&
		    rc != CURLE_OPERATION_TIMEDOUT) {
			if (which != e->cur) {
				e->cur = which;
				e->failovers++;
			}
			break;
		}
		if (w.stopped || w.result)
			break;
	}
	json_object_put(req);
	free(w.line.p);
	*next_revision = w.next_revision;
	if (w.stopped)
		return 0;
	if (w.result)
		return w.result;
	if (rc == CURLE_OK)
		return -ECONNRESET; /* etcd ended the stream */
	ret = curl_errno(rc);
	return ret == -EPROTO || ret == -ECONNREFUSED ? (rc == CURLE_COULDNT_CONNECT ||
							 rc == CURLE_COULDNT_RESOLVE_HOST
							 ? -ECONNREFUSED : -ECONNRESET) : ret;
}

/* ---- etcd://HOST[:PORT]/CLUSTER --------------------------------------------- */

int kvc_etcd_url_parse(const char *url, char *endpoint, size_t endpoint_cap, char *cluster,
		       size_t cluster_cap)
{
	const char *host, *slash, *name;
	size_t host_len, name_len;

	if (!url || !endpoint || !cluster || strncmp(url, "etcd://", 7) != 0)
		return -EINVAL;
	host = url + 7;
	slash = strchr(host, '/');
	if (!slash || slash == host)
		return -EINVAL;
	host_len = (size_t)(slash - host);
	name = slash + 1;
	name_len = strlen(name);
	if (name_len == 0 || name_len > KVC_ETCD_CLUSTER_MAX_BYTES ||
	    host_len > KVC_ETCD_ENDPOINT_MAX_BYTES || host_len + 1 > endpoint_cap ||
	    name_len + 1 > cluster_cap || memchr(host, '@', host_len))
		return -EINVAL;
	{
		char list[KVC_ETCD_ENDPOINT_MAX_BYTES + 1];
		char (*base)[ETCD_BASE_BYTES] = malloc(KVC_ETCD_MAX_ENDPOINTS * sizeof(*base));
		int n;

		if (!base)
			return -ENOMEM;
		memcpy(list, host, host_len);
		list[host_len] = 0;
		n = parse_endpoints(list, base);
		free(base);
		if (n < 0)
			return n;
	}
	for (size_t i = 0; i < name_len; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= 'A' && name[i] <= 'Z') ||
		      (name[i] >= '0' && name[i] <= '9') || strchr("._-", name[i])))
			return -EINVAL;
	memcpy(endpoint, host, host_len);
	endpoint[host_len] = 0;
	memcpy(cluster, name, name_len + 1);
	return 0;
}
