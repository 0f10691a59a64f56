/*
 * test_events.c - KV events: the store's event hook (what the pool
 * reports, in order), the publisher's msgpack encoder (exact bytes of
 * vLLM's EventBatch layout) and its single-producer ring.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include <event2/buffer.h>

#include "srv_events.h"
#include "srv_metrics.h"
#include "srv_stats.h"
#include "store.h"
#include "store_fixture.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)

/* ---- store hook ------------------------------------------------------------ */

struct seen {
	int kind;
	uint8_t key[STORE_KEY_BYTES];
	int has_parent;
	uint8_t parent[STORE_KEY_BYTES];
	uint8_t announce;
	char ns[32];
};

struct recorder {
	struct seen ev[256];
	size_t n;
};

static void record(void *arg, const struct store_event *e)
{
	struct recorder *r = arg;
	struct seen *s;

	assert_true(r->n < 256);
	s = &r->ev[r->n++];
	memset(s, 0, sizeof(*s));
	s->kind = e->kind;
	if (e->key)
		memcpy(s->key, e->key, STORE_KEY_BYTES);
	s->has_parent = e->parent != NULL;
	if (e->parent)
		memcpy(s->parent, e->parent, STORE_KEY_BYTES);
	s->announce = e->announce;
	assert_true(e->ns_name_len < sizeof(s->ns));
	memcpy(s->ns, e->ns_name, e->ns_name_len);
}

static int put_id(struct store *s, uint32_t ns, uint64_t id, uint64_t parent_id, uint64_t len)
{
	uint8_t key[STORE_KEY_BYTES], parent[STORE_KEY_BYTES];
	struct store_block *b;
	void *dst;
	uint8_t *buf = malloc(len);
	int rc;

	assert_non_null(buf);
	memset(buf, (int)id, len);
	key_of(id, key);
	if (parent_id)
		key_of(parent_id, parent);
	rc = store_put_begin(s, ns, key, parent_id ? parent : NULL, 0, len, XXH3_64bits(buf, len),
			     &b, &dst);
	if (rc == 0) {
		memcpy(dst, buf, len);
		rc = store_put_commit(s, b);
	}
	free(buf);
	return rc;
}

static void assert_ev(const struct seen *s, int kind, uint64_t id, uint64_t parent_id)
{
	uint8_t key[STORE_KEY_BYTES];

	assert_int_equal(s->kind, kind);
	if (kind == STORE_EVENT_CLEARED)
		return;
	key_of(id, key);
	assert_memory_equal(s->key, key, STORE_KEY_BYTES);
	if (kind != STORE_EVENT_STORED)
		return;
	assert_int_equal(s->has_parent, parent_id != 0);
	if (parent_id) {
		key_of(parent_id, key);
		assert_memory_equal(s->parent, key, STORE_KEY_BYTES);
	}
}

/* A chain stored, its tail evicted, a DELETE of a subtree, a drop. */
static void test_hook_order(void **state)
{
	struct store_config cfg = { .dram_capacity_bytes = 1 * MIB, .max_block_bytes = 1 * MIB };
	struct recorder r = { .n = 0 };
	struct store *s;
	uint32_t ns;
	uint64_t removed, blocks;

	(void)state;
	store_fixture_open(&cfg, &s, "ev", &ns);
	store_set_event_hook(s, record, &r);
	assert_int_equal(r.n, 0); /* nothing stored yet: nothing announced */
	for (uint64_t i = 1; i <= 10; i++)
		assert_int_equal(put_id(s, ns, i, i - 1, 64 * KIB), 0);
	assert_int_equal(put_id(s, ns, 3, 2, 64 * KIB), -EEXIST); /* nothing new */
	assert_int_equal(r.n, 10);
	for (uint64_t i = 1; i <= 10; i++)
		assert_ev(&r.ev[i - 1], STORE_EVENT_STORED, i, i - 1);
	assert_string_equal(r.ev[0].ns, "ev");
	assert_int_equal(r.ev[0].announce, 0);
	/* 160 of 256 pages used: 128 more evict the two LRU leaves, 10 then 9 */
	assert_int_equal(put_id(s, ns, 100, 0, 512 * KIB), 0);
	assert_int_equal(r.n, 13);
	assert_ev(&r.ev[10], STORE_EVENT_REMOVED, 10, 0);
	assert_ev(&r.ev[11], STORE_EVENT_REMOVED, 9, 0);
	assert_ev(&r.ev[12], STORE_EVENT_STORED, 100, 0);
	/* DELETE of 5: the subtree 5..8, leaves first */
	assert_int_equal(store_delete(s, ns, (uint8_t[STORE_KEY_BYTES]){ 0 }, NULL), -ENOENT);
	{
		uint8_t k5[STORE_KEY_BYTES];

		key_of(5, k5);
		assert_int_equal(store_delete(s, ns, k5, &removed), 0);
	}
	assert_int_equal(removed, 4);
	assert_int_equal(r.n, 17);
	for (int i = 0; i < 4; i++)
		assert_ev(&r.ev[13 + i], STORE_EVENT_REMOVED, 8 - (uint64_t)i, 0);
	/* the drop: one CLEARED, no REMOVED per block */
	assert_int_equal(store_drop_namespace(s, ns, &blocks, NULL), 0);
	assert_int_equal(blocks, 5);
	assert_int_equal(r.n, 18);
	assert_ev(&r.ev[17], STORE_EVENT_CLEARED, 0, 0);
	assert_string_equal(r.ev[17].ns, "ev");
	/* unhooked: silence */
	store_set_event_hook(s, NULL, NULL);
	assert_int_equal(put_id(s, ns, 200, 0, 4 * KIB), 0);
	assert_int_equal(r.n, 18);
	store_fixture_close(&s, ns);
}

/* Installing the hook announces what is stored, parents first, once. */
static void test_hook_announce(void **state)
{
	struct store_config cfg = { .dram_capacity_bytes = 4 * MIB, .max_block_bytes = 1 * MIB };
	struct recorder r = { .n = 0 };
	struct store *s;
	uint32_t ns;
	int pos[20] = { 0 };

	(void)state;
	store_fixture_open(&cfg, &s, "ann", &ns);
	/* a tree: 1 -> 2 -> 3, 1 -> 4 -> 5, 4 -> 6; and a lone 7; stored
	 * children before ... in an order where children follow their parents
	 * in the namespace's ring only by chance: put 7 first */
	assert_int_equal(put_id(s, ns, 7, 0, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 1, 0, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 4, 1, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 2, 1, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 6, 4, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 3, 2, 4 * KIB), 0);
	assert_int_equal(put_id(s, ns, 5, 4, 4 * KIB), 0);
	store_set_event_hook(s, record, &r);
	assert_int_equal(r.n, 7);
	for (size_t i = 0; i < r.n; i++) {
		uint8_t key[STORE_KEY_BYTES];

		assert_int_equal(r.ev[i].kind, STORE_EVENT_STORED);
		assert_int_equal(r.ev[i].announce, 1);
		for (uint64_t id = 1; id <= 7; id++) {
			key_of(id, key);
			if (memcmp(key, r.ev[i].key, STORE_KEY_BYTES) == 0) {
				assert_int_equal(pos[id], 0); /* once */
				pos[id] = (int)i + 1;
			}
		}
	}
	for (int id = 1; id <= 7; id++)
		assert_true(pos[id] > 0);
	/* parents before children */
	assert_true(pos[1] < pos[2] && pos[2] < pos[3]);
	assert_true(pos[1] < pos[4] && pos[4] < pos[5] && pos[4] < pos[6]);
	assert_ev(&r.ev[pos[3] - 1], STORE_EVENT_STORED, 3, 2);
	assert_ev(&r.ev[pos[7] - 1], STORE_EVENT_STORED, 7, 0);
	store_set_event_hook(s, NULL, NULL);
	store_fixture_close(&s, ns);
}

/* ---- encoder ------------------------------------------------------------------ */

struct bytes {
	uint8_t b[1024];
	size_t n;
};

static void put_bytes(struct bytes *w, const void *p, size_t n)
{
	assert_true(w->n + n <= sizeof(w->b));
	memcpy(w->b + w->n, p, n);
	w->n += n;
}

static void put_byte(struct bytes *w, uint8_t v)
{
	put_bytes(w, &v, 1);
}

/* fixstr (< 32 bytes) */
static void put_fixstr(struct bytes *w, const char *s)
{
	put_byte(w, (uint8_t)(0xa0 | strlen(s)));
	put_bytes(w, s, strlen(s));
}

static void put_hash(struct bytes *w, uint8_t fill)
{
	uint8_t h[32];

	memset(h, fill, sizeof(h));
	put_byte(w, 0xc4); /* bin 8 */
	put_byte(w, 32);
	put_bytes(w, h, 32);
}

static struct srv_event_rec rec(int kind, uint8_t key, int parent)
{
	struct srv_event_rec r;

	memset(&r, 0, sizeof(r));
	r.kind = (uint8_t)kind;
	memset(r.key, key, STORE_KEY_BYTES);
	r.has_parent = parent >= 0;
	if (parent >= 0)
		memset(r.parent, parent, STORE_KEY_BYTES);
	return r;
}

static void assert_encoded(const struct srv_event_rec *recs, size_t n, int want_events,
			   const struct bytes *want)
{
	msgpack_sbuffer sb;

	msgpack_sbuffer_init(&sb);
	assert_int_equal(srv_events_encode(&sb, 1.5, recs, n, 16, "CPU"), want_events);
	assert_int_equal(sb.size, want->n);
	assert_memory_equal(sb.data, want->b, want->n);
	msgpack_sbuffer_destroy(&sb);
}

/* [ts, [events]]: the ts as float 64, then the events array. */
static void put_batch_head(struct bytes *w, uint8_t events)
{
	static const uint8_t ts[] = { 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0 }; /* 1.5 */

	put_byte(w, 0x92);
	put_bytes(w, ts, sizeof(ts));
	put_byte(w, (uint8_t)(0x90 | events));
}

static void test_encode_stored_chain(void **state)
{
	/* a chain 0x11 -> 0x22 -> 0x33 with no parent: one BlockStored */
	struct srv_event_rec r[] = { rec(STORE_EVENT_STORED, 0x11, -1),
				     rec(STORE_EVENT_STORED, 0x22, 0x11),
				     rec(STORE_EVENT_STORED, 0x33, 0x22) };
	struct bytes w = { .n = 0 };

	(void)state;
	put_batch_head(&w, 1);
	put_byte(&w, 0x98); /* tag + 7 fields */
	put_fixstr(&w, "BlockStored");
	put_byte(&w, 0x93);
	put_hash(&w, 0x11);
	put_hash(&w, 0x22);
	put_hash(&w, 0x33);
	put_byte(&w, 0xc0); /* parent_block_hash: nil */
	put_byte(&w, 0x90); /* token_ids: [] */
	put_byte(&w, 0x10); /* block_size 16 */
	put_byte(&w, 0xc0); /* lora_id */
	put_fixstr(&w, "CPU");
	put_byte(&w, 0xc0); /* lora_name */
	assert_encoded(r, 3, 1, &w);
}

static void test_encode_mixed(void **state)
{
	/* STORED 0x44 under 0x99 (a parent hash), STORED 0x55 whose parent is
	 * not 0x44 (a new event), two REMOVED (one event), CLEARED */
	struct srv_event_rec r[] = { rec(STORE_EVENT_STORED, 0x44, 0x99),
				     rec(STORE_EVENT_STORED, 0x55, 0x98),
				     rec(STORE_EVENT_REMOVED, 0x66, -1),
				     rec(STORE_EVENT_REMOVED, 0x77, -1),
				     rec(STORE_EVENT_CLEARED, 0, -1),
				     rec(STORE_EVENT_CLEARED, 0, -1) };
	struct bytes w = { .n = 0 };

	(void)state;
	put_batch_head(&w, 5);
	for (int i = 0; i < 2; i++) {
		put_byte(&w, 0x98);
		put_fixstr(&w, "BlockStored");
		put_byte(&w, 0x91);
		put_hash(&w, i ? 0x55 : 0x44);
		put_hash(&w, i ? 0x98 : 0x99);
		put_byte(&w, 0x90);
		put_byte(&w, 0x10);
		put_byte(&w, 0xc0);
		put_fixstr(&w, "CPU");
		put_byte(&w, 0xc0);
	}
	put_byte(&w, 0x93);
	put_fixstr(&w, "BlockRemoved");
	put_byte(&w, 0x92);
	put_hash(&w, 0x66);
	put_hash(&w, 0x77);
	put_fixstr(&w, "CPU");
	for (int i = 0; i < 2; i++) { /* never merged */
		put_byte(&w, 0x91);
		put_byte(&w, 0xb0); /* "AllBlocksCleared": 16 bytes */
		put_bytes(&w, "AllBlocksCleared", 16);
	}
	assert_encoded(r, 6, 5, &w);
}

static void test_encode_empty_and_seq(void **state)
{
	struct bytes w = { .n = 0 };
	uint8_t seq[8];
	static const uint8_t seq_258[8] = { 0, 0, 0, 0, 0, 0, 1, 2 };
	static const uint8_t seq_end[8] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

	(void)state;
	put_batch_head(&w, 0);
	assert_encoded(NULL, 0, 0, &w);
	srv_events_seq_bytes(258, seq);
	assert_memory_equal(seq, seq_258, 8);
	srv_events_seq_bytes(-1, seq);
	assert_memory_equal(seq, seq_end, 8);
}

/* ---- ring ------------------------------------------------------------------ */

static struct srv_event_entry entry(uint32_t n)
{
	struct srv_event_entry e;

	memset(&e, 0, sizeof(e));
	e.rec.kind = STORE_EVENT_STORED;
	memcpy(e.rec.key, &n, sizeof(n));
	e.ns_id = n;
	e.name_len = 2;
	memcpy(e.name, "ns", 2);
	return e;
}

static void test_ring_bounds(void **state)
{
	struct srv_event_ring r;
	struct srv_event_entry e;
	const struct srv_event_entry *p;

	(void)state;
	assert_int_equal(srv_event_ring_init(&r, 0), -EINVAL);
	assert_int_equal(srv_event_ring_init(&r, 3), 0);
	assert_null(srv_event_ring_peek(&r));
	for (uint32_t round = 0; round < 5; round++) { /* wraps around */
		for (uint32_t i = 0; i < 3; i++) {
			e = entry(round * 10 + i);
			assert_int_equal(srv_event_ring_push(&r, &e), 0);
		}
		e = entry(99);
		assert_int_equal(srv_event_ring_push(&r, &e), -ENOSPC); /* full: nothing written */
		for (uint32_t i = 0; i < 3; i++) {
			p = srv_event_ring_peek(&r);
			assert_non_null(p);
			assert_int_equal(p->ns_id, round * 10 + i);
			assert_memory_equal(p->name, "ns", 2);
			srv_event_ring_pop(&r);
		}
		assert_null(srv_event_ring_peek(&r));
	}
	srv_event_ring_free(&r);
}

#define RING_N 200000u

static void *ring_consumer(void *arg)
{
	struct srv_event_ring *r = arg;
	uint32_t want = 0;

	while (want < RING_N) {
		const struct srv_event_entry *p = srv_event_ring_peek(r);
		uint32_t got;

		if (!p)
			continue;
		memcpy(&got, p->rec.key, sizeof(got));
		if (got != want || p->ns_id != want)
			return (void *)1;
		srv_event_ring_pop(r);
		want++;
	}
	return NULL;
}

/* One producer, one consumer thread: every entry arrives once, in order,
 * whole. */
static void test_ring_threads(void **state)
{
	struct srv_event_ring r;
	pthread_t t;
	void *bad;
	uint64_t full = 0;

	(void)state;
	assert_int_equal(srv_event_ring_init(&r, 7), 0);
	assert_int_equal(pthread_create(&t, NULL, ring_consumer, &r), 0);
	for (uint32_t i = 0; i < RING_N; i++) {
		struct srv_event_entry e = entry(i);

		while (srv_event_ring_push(&r, &e) == -ENOSPC)
			full++;
	}
	assert_int_equal(pthread_join(t, &bad), 0);
	assert_null(bad);
	srv_event_ring_free(&r);
}

/* ---- STATS and /metrics ------------------------------------------------------ */

static char *render(const struct srv_stats_doc *doc, int (*fn)(const struct srv_stats_doc *,
							       struct evbuffer *))
{
	struct evbuffer *b = evbuffer_new();
	size_t len;
	char *s;

	assert_non_null(b);
	assert_int_equal(fn(doc, b), 0);
	len = evbuffer_get_length(b);
	s = malloc(len + 1);
	assert_non_null(s);
	assert_int_equal(evbuffer_remove(b, s, len), (int)len);
	s[len] = '\0';
	evbuffer_free(b);
	return s;
}

static void test_stats_and_metrics(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_stats st;
	struct srv_events_stats ev = { .produced = 120, .published = 90, .dropped = 20,
				       .queued = 10, .batches = 7, .resync_batches = 2,
				       .replay_requests = 3, .replayed_batches = 11,
				       .replay_errors = 1, .replay_refused = 4,
				       .replay_truncated = 5, .replay_stalled = 6 };
	struct srv_stats_doc doc = { .version = "0.1.0", .protocol = 1, .ops = ops, .store = &st };
	char *s;

	(void)state;
	assert_non_null(ops);
	memset(&st, 0, sizeof(st));
	/* off: no object, no series */
	s = render(&doc, srv_stats_json);
	assert_null(strstr(s, "kv_events"));
	free(s);
	s = render(&doc, srv_metrics_write);
	assert_null(strstr(s, "kv_events"));
	free(s);
	doc.events = &ev;
	s = render(&doc, srv_stats_json);
	assert_non_null(strstr(s, "\"kv_events\":{\"enabled\":true,\"produced\":120,"
				  "\"published\":90,\"dropped\":20,\"queued\":10,\"batches\":7,"
				  "\"resync_batches\":2,\"replay_requests\":3,"
				  "\"replayed_batches\":11,\"replay_errors\":1,"
				  "\"replay_refused\":4,\"replay_truncated\":5,"
				  "\"replay_stalled\":6},"));
	free(s);
	s = render(&doc, srv_metrics_write);
	assert_non_null(strstr(s, "\n# TYPE kvpool_kv_events_dropped_total counter\n"
				  "kvpool_kv_events_dropped_total 20\n"));
	assert_non_null(strstr(s, "\nkvpool_kv_events_published_total 90\n"));
	assert_non_null(strstr(s, "\nkvpool_kv_events_replay_requests_total 3\n"));
	free(s);
	free(ops);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hook_order),
		cmocka_unit_test(test_hook_announce),
		cmocka_unit_test(test_encode_stored_chain),
		cmocka_unit_test(test_encode_mixed),
		cmocka_unit_test(test_encode_empty_and_seq),
		cmocka_unit_test(test_ring_bounds),
		cmocka_unit_test(test_ring_threads),
		cmocka_unit_test(test_stats_and_metrics),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
