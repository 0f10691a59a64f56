/*
 * test_cluster.c - libkvpool over several kvpoold nodes (client/lib/
 * cluster.c, membership.c) and kvpoold's etcd registration (server/
 * srv_etcd.c), with real processes on loopback: three kvpoold, and
 * Debian's etcd for the membership tests.
 *
 *  - placement: each block lands on the HRW owner of its own key, stored
 *    there with no parent; any handle finds any key
 *  - the bundled trace replayed over three nodes whose capacities add up
 *    to one node's (96 MiB = 3 x 32 MiB, 16 KiB blocks): hit ratio within
 *    0.01 of the single node's, 0 wrong
 *  - a node SIGKILLed mid-run: 0 wrong blocks, no call fails (misses
 *    only); the hit ratio recovers once it is back, empty (printed)
 *  - etcd: nodes register and leave; etcd stopped: clients keep serving
 *    from the last membership; a node added once etcd is back is seen
 *    within 2 lease periods
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "etcd_proc.h"
#include "harness.h"
#include "etcd.h"

#define N_NODES 3
#define W_CHAINS 60
#define W_BLOCKS 80
#define W_BYTES 1024
#define LEASE_S 2

static const char *const node_flags[] = {
	"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1",
	"--log-level", "warn", "--rdma-port", "0",
	"--drain-timeout-ms", "1000", NULL,
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- a small engine-like workload ---------------------------------------- */

struct workload {
	uint8_t keys[W_CHAINS][W_BLOCKS][32];
	uint8_t buf[W_BLOCKS][W_BYTES];
	int st[W_BLOCKS];
};

struct pass {
	uint64_t refs, hits, wrong, call_errors, put_errors;
};

static void payload(const uint8_t *key, uint8_t *out)
{
	for (size_t i = 0; i < W_BYTES; i++)
		out[i] = (uint8_t)(key[i % 32] ^ (i * 131));
}

static void workload_init(struct workload *w, const char *tag)
{
	for (int c = 0; c < W_CHAINS; c++)
		for (int b = 0; b < W_BLOCKS; b++)
			harness_key(w->keys[c][b], tag, (uint64_t)c * 1000 + (uint64_t)b);
}

/* One request on chain c: MATCH, GET the matched run (verify), PUT the
 * rest with parents. */
static void one_request(struct kvpool_client *cl, struct workload *w, int c, struct pass *p)
{
	struct kvpool_get_block gb[W_BLOCKS];
	struct kvpool_put_block pb[W_BLOCKS];
	struct iovec iov[W_BLOCKS];
	size_t m = 0;
	int rc;

	p->refs += W_BLOCKS;
	rc = kvpool_match(cl, w->keys[c], W_BLOCKS, 2000, &m);
	if (rc) {
		p->call_errors++;
		fprintf(stderr, "match: %s\n", kvpool_strerror(rc));
		return;
	}
	for (size_t i = 0; i < m; i++) {
		memset(w->buf[i], 0, W_BYTES);
		iov[i] = (struct iovec){ w->buf[i], W_BYTES };
		gb[i] = (struct kvpool_get_block){ .key = w->keys[c][i], .iov = &iov[i], .iovcnt = 1 };
	}
	rc = m ? kvpool_get(cl, gb, m, w->st) : 0;
	if (rc && rc != -ENOENT) {
		p->call_errors++;
		fprintf(stderr, "get: %s\n", kvpool_strerror(rc));
	}
	size_t from = m;
	for (size_t i = 0; i < m; i++) {
		uint8_t want[W_BYTES];

		if (w->st[i]) {
			from = i;
			break;
		}
		payload(w->keys[c][i], want);
		if (gb[i].length != W_BYTES || memcmp(want, w->buf[i], W_BYTES) != 0) {
			p->wrong++;
			continue;
		}
		p->hits++;
	}
	for (size_t i = from; i < W_BLOCKS; i++) {
		payload(w->keys[c][i], w->buf[i]);
		iov[i] = (struct iovec){ w->buf[i], W_BYTES };
		pb[i] = (struct kvpool_put_block){ .key = w->keys[c][i],
						   .parent = i ? w->keys[c][i - 1] : NULL,
						   .iov = &iov[i], .iovcnt = 1 };
	}
	if (from < W_BLOCKS) {
		rc = kvpool_put(cl, pb + from, W_BLOCKS - from, w->st + from);
		if (rc) {
			p->put_errors++;
			fprintf(stderr, "put: %s\n", kvpool_strerror(rc));
		}
	}
}

/* A pass over every chain; `mid` (may be NULL) is called halfway. */
static struct pass run_pass(struct kvpool_client *cl, struct workload *w, void (*mid)(void *),
			    void *arg)
{
	struct pass p = { 0 };

	for (int c = 0; c < W_CHAINS; c++) {
		if (mid && c == W_CHAINS / 2)
			mid(arg);
		one_request(cl, w, c, &p);
	}
	return p;
}

static double ratio(const struct pass *p)
{
	return p->refs ? (double)p->hits / (double)p->refs : 0;
}

static void assert_clean(const struct pass *p)
{
	assert_int_equal(p->wrong, 0);
	assert_int_equal(p->call_errors, 0);
	assert_int_equal(p->put_errors, 0);
}

/* ---- nodes ----------------------------------------------------------------- */

struct nodes {
	struct harness_server s[N_NODES + 1];
	char list[256];
};

static void nodes_start(struct nodes *n, size_t count, const char *const *flags)
{
	size_t len = 0;

	memset(n, 0, sizeof(*n));
	for (size_t i = 0; i < count; i++) {
		int rc = harness_start(&n->s[i], flags);

		if (rc == -ENOENT)
			harness_skip("KVPOOLD is not set");
		assert_int_equal(rc, 0);
		len += (size_t)snprintf(n->list + len, sizeof(n->list) - len, "%s127.0.0.1:%u",
					i ? "," : "tcp://", n->s[i].port);
	}
	/* kvpoold under valgrind answers slowly: no node is skipped for that */
	if (harness_valgrind())
		strncat(n->list, "?budget_ms=30000", sizeof(n->list) - strlen(n->list) - 1);
}

static void nodes_stop(struct nodes *n)
{
	for (size_t i = 0; i < N_NODES + 1; i++)
		if (n->s[i].pid)
			assert_int_equal(harness_stop(&n->s[i]), 0);
}

static uint64_t node_blocks(const struct harness_server *s, const char *ns)
{
	struct kvpool_client *c;
	uint64_t v = 0;

	assert_int_equal(harness_client(s, ns, &c), 0);
	v = harness_stat_or_fail(c, "blocks");
	kvpool_close(c);
	return v;
}

/* ---- tests ------------------------------------------------------------------- */

static void test_placement(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl, *direct[N_NODES];
	const char *names[N_NODES];
	char namebuf[N_NODES][32];
	struct pass p;
	uint64_t total = 0;

	(void)state;
	nodes_start(&n, N_NODES, node_flags);
	workload_init(&w, "placement");
	assert_int_equal(kvpool_connect(n.list, "place", NULL, &cl), 0);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_int_equal(p.hits, 0);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_int_equal(p.hits, p.refs); /* everything fits: all hits */
	for (int i = 0; i < N_NODES; i++) {
		snprintf(namebuf[i], sizeof(namebuf[i]), "127.0.0.1:%u", n.s[i].port);
		names[i] = namebuf[i];
		assert_int_equal(harness_client(&n.s[i], "place", &direct[i]), 0);
		uint64_t b = node_blocks(&n.s[i], "place");

		printf("node %s holds %" PRIu64 " blocks\n", names[i], b);
		assert_true(b > 0);
		total += b;
	}
	assert_int_equal(total, (uint64_t)W_CHAINS * W_BLOCKS);
	/* Each block is on the HRW owner of its own key, matchable there on
	 * its own (stored with no parent), and nowhere else. */
	for (int c = 0; c < W_CHAINS; c++)
		for (int b = 0; b < W_BLOCKS; b++) {
			size_t m = 99;
			int o = kvpool_hrw_owner(w.keys[c][b], names, N_NODES);

			assert_true(o >= 0);
			for (int i = 0; i < N_NODES; i++) {
				assert_int_equal(kvpool_match(direct[i], w.keys[c][b], 1, 0, &m), 0);
				assert_int_equal(m, i == o ? 1 : 0);
			}
		}
	/* Cluster stats: summed blocks, three nodes with their shares. */
	{
		struct json_object *doc, *cj, *nodes;
		double share_sum = 0;

		assert_int_equal(harness_stats(cl, NULL, &doc), 0);
		assert_int_equal(harness_stat_or_fail(cl, "blocks"), total);
		assert_true(json_object_object_get_ex(doc, "cluster", &cj));
		assert_true(json_object_object_get_ex(cj, "nodes", &nodes));
		assert_int_equal(json_object_array_length(nodes), N_NODES);
		for (int i = 0; i < N_NODES; i++) {
			struct json_object *x = json_object_array_get_idx(nodes, i), *v;

			assert_true(json_object_object_get_ex(x, "up", &v));
			assert_true(json_object_get_boolean(v));
			assert_true(json_object_object_get_ex(x, "share", &v));
			assert_true(json_object_get_double(v) > 0.2 && json_object_get_double(v) < 0.45);
			share_sum += json_object_get_double(v);
		}
		assert_true(share_sum > 0.999 && share_sum < 1.001);
		json_object_put(doc);
	}
	/* A key no one put is a miss; a PUT under a parent this handle never
	 * saw is placed by its own key (a one-shot command can do it) and
	 * found by any handle; bad arguments -EINVAL. */
	{
		uint8_t k[32], parent[32], b[8] = { 0 }, back[8];
		struct kvpool_client *other;
		int st = 0;

		harness_key(k, "never", 1);
		harness_key(parent, "never", 2);
		assert_int_equal(kvpool_get_bytes(cl, k, b, sizeof(b), NULL), -ENOENT);
		assert_int_equal(kvpool_exists(cl, k, 1, &st), 0);
		assert_int_equal(st, -ENOENT);
		memcpy(b, "1234567", 8);
		assert_int_equal(kvpool_put_bytes(cl, k, parent, b, sizeof(b)), 0);
		assert_int_equal(kvpool_connect(n.list, "place", NULL, &other), 0);
		assert_int_equal(kvpool_get_bytes(other, k, back, sizeof(back), NULL), 0);
		assert_memory_equal(back, b, sizeof(b));
		kvpool_close(other);
		assert_int_equal(kvpool_put(cl, NULL, 1, NULL), -EINVAL);
		assert_int_equal(kvpool_set_segment_blocks(cl, 70000), -EINVAL);
		assert_int_equal(kvpool_set_segment_blocks(direct[0], 16), -EOPNOTSUPP);
		/* The asynchronous calls work on cluster handles (they answered
		 * -EOPNOTSUPP until the cluster became a backend of its own):
		 * a chain's MATCH over its three nodes completes in poll. */
		uint64_t id = 0;
		struct kvpool_completion comp;

		assert_int_equal(kvpool_submit_match(cl, w.keys[0], W_BLOCKS, 0, 7, &id), 0);
		assert_int_equal(kvpool_poll(cl, &comp, 1, 5000), 1);
		assert_int_equal(comp.id, id);
		assert_int_equal(comp.tag, 7);
		assert_int_equal(comp.status, 0);
		assert_int_equal(comp.matched, W_BLOCKS);
		assert_true(kvpool_event_fd(cl) >= 0);
	}
	for (int i = 0; i < N_NODES; i++)
		kvpool_close(direct[i]);
	kvpool_close(cl);
	nodes_stop(&n);
}

static void test_bad_urls(void **state)
{
	struct kvpool_client *c = NULL;

	(void)state;
	assert_int_equal(kvpool_connect("tcp://127.0.0.1:1,", "x", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect("tcp://127.0.0.1:1,,127.0.0.1:2", "x", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect("tcp://127.0.0.1:1,127.0.0.1:99999", "x", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect("etcd://127.0.0.1:1", "x", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect("etcd://127.0.0.1:1/bad name", "x", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect("tcp://127.0.0.1:1,127.0.0.1:2", "bad ns", NULL, &c),
			 -EINVAL);
	/* nothing listens: refused like one node; etcd not there: refused */
	assert_int_equal(kvpool_connect("tcp://127.0.0.1:1,127.0.0.1:2", "x", NULL, &c),
			 -ECONNREFUSED);
	assert_int_equal(kvpool_connect("etcd://127.0.0.1:1/c", "x", NULL, &c), -ECONNREFUSED);
	assert_null(c);
}

static void kill_node(void *arg)
{
	struct harness_server *s = arg;

	harness_kill(s); /* SIGKILL, mid-pass */
}

static void test_node_killed(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl;
	struct pass warm, dip, still, back1, back2;
	uint16_t port;

	(void)state;
	nodes_start(&n, N_NODES, node_flags);
	workload_init(&w, "killed");
	assert_int_equal(kvpool_connect(n.list, "kill", NULL, &cl), 0);
	run_pass(cl, &w, NULL, NULL);
	warm = run_pass(cl, &w, NULL, NULL);
	port = n.s[1].port;
	dip = run_pass(cl, &w, kill_node, &n.s[1]);
	still = run_pass(cl, &w, NULL, NULL);
	assert_int_equal(harness_start_on_port(&n.s[1], port, node_flags), 0); /* back, empty */
	sleep_ms(1100); /* the client tries a failed node again after a second */
	back1 = run_pass(cl, &w, NULL, NULL);
	back2 = run_pass(cl, &w, NULL, NULL);
	printf("node killed mid-pass: hit ratio warm %.3f, pass with the kill %.3f, while down "
	       "%.3f, back empty %.3f, then %.3f\n", ratio(&warm), ratio(&dip), ratio(&still),
	       ratio(&back1), ratio(&back2));
	assert_clean(&warm);
	assert_clean(&dip);
	assert_clean(&still);
	assert_clean(&back1);
	assert_clean(&back2);
	assert_true(ratio(&warm) > 0.99);
	assert_true(ratio(&still) < 0.9);  /* its blocks, and those after them in each chain, miss */
	assert_true(ratio(&still) > 0.05); /* the others still hit */
	assert_true(ratio(&back2) > 0.99); /* recovered */
	kvpool_close(cl);
	nodes_stop(&n);
}

/* ---- etcd ------------------------------------------------------------------- */

struct etcd_node_flags {
	char url[96], name[32];
	const char *argv[20];
};

static void etcd_flags_on(struct etcd_node_flags *f, const struct etcd_proc *e, const char *name,
			  const char *const *base)
{
	size_t k = 0;

	snprintf(f->url, sizeof(f->url), "etcd://%s/test", e->endpoint);
	snprintf(f->name, sizeof(f->name), "%s", name);
	for (size_t i = 0; base[i]; i++)
		f->argv[k++] = base[i];
	f->argv[k++] = "--cluster";
	f->argv[k++] = f->url;
	f->argv[k++] = "--node-name";
	f->argv[k++] = f->name;
	f->argv[k++] = "--cluster-lease-s";
	f->argv[k++] = "2";
	f->argv[k] = NULL;
}

static void etcd_flags(struct etcd_node_flags *f, const struct etcd_proc *e, const char *name)
{
	etcd_flags_on(f, e, name, node_flags);
}

/* Members the cluster handle sees, and whether etcd is reachable to it. */
static size_t members(struct kvpool_client *cl, int *etcd_reachable)
{
	struct json_object *doc, *cj, *v;
	size_t n;

	assert_int_equal(harness_stats(cl, NULL, &doc), 0);
	assert_true(json_object_object_get_ex(doc, "cluster", &cj));
	assert_true(json_object_object_get_ex(cj, "nodes", &v));
	n = json_object_array_length(v);
	if (etcd_reachable) {
		struct json_object *e;

		assert_true(json_object_object_get_ex(cj, "etcd", &e));
		assert_true(json_object_object_get_ex(e, "reachable", &v));
		*etcd_reachable = json_object_get_boolean(v);
	}
	json_object_put(doc);
	return n;
}

static size_t etcd_records(const struct etcd_proc *e)
{
	struct kvc_etcd *c;
	struct kvc_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t rev;

	assert_int_equal(kvc_etcd_open(e->endpoint, 2000, &c), 0);
	if (kvc_etcd_range_prefix(c, "kvpool/test/nodes/", &kvs, &n, &rev))
		n = 0;
	kvc_etcd_kvs_free(kvs, n);
	kvc_etcd_close(c);
	return n;
}

static void wait_for(size_t (*fn)(struct kvpool_client *, int *), struct kvpool_client *cl,
		     size_t want, int max_ms)
{
	uint64_t end = now_ms() + (uint64_t)max_ms;

	while (fn(cl, NULL) != want && now_ms() < end)
		sleep_ms(100);
	assert_int_equal(fn(cl, NULL), want);
}

static void test_etcd_membership(void **state)
{
	static struct workload w;
	static struct etcd_node_flags f[N_NODES + 1];
	struct etcd_proc e = { 0 };
	struct nodes n;
	struct kvpool_client *cl;
	struct pass p;
	char url[96];
	int reachable = -1;
	uint64_t t0, seen_ms;

	(void)state;
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (harness_valgrind()) {
		printf("not under valgrind: its lease-period bounds do not hold at valgrind's pace\n");
		return;
	}
	assert_int_equal(etcd_proc_start(&e), 0);
	memset(&n, 0, sizeof(n));
	for (int i = 0; i < N_NODES; i++) {
		char name[16];

		snprintf(name, sizeof(name), "n%d", i);
		etcd_flags(&f[i], &e, name);
		assert_int_equal(harness_start(&n.s[i], f[i].argv), 0);
	}
	for (int i = 0; i < 50 && etcd_records(&e) != N_NODES; i++)
		sleep_ms(100);
	assert_int_equal(etcd_records(&e), N_NODES);
	snprintf(url, sizeof(url), "etcd://%s/test", e.endpoint);
	assert_int_equal(kvpool_connect(url, "etcdns", NULL, &cl), 0);
	assert_int_equal(members(cl, &reachable), N_NODES);
	assert_true(reachable);
	workload_init(&w, "etcd");
	run_pass(cl, &w, NULL, NULL);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_int_equal(p.hits, p.refs);

	/* etcd goes away: the handle keeps its members and keeps serving. */
	etcd_proc_stop(&e);
	sleep_ms(700);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_int_equal(p.hits, p.refs);
	assert_int_equal(members(cl, &reachable), N_NODES);
	assert_false(reachable);
	{
		/* kvpoold says it too, in its own stats, and keeps serving */
		struct kvpool_client *d;
		struct json_object *doc, *v;

		assert_int_equal(harness_client(&n.s[0], "etcdns", &d), 0);
		assert_int_equal(harness_stats(d, NULL, &doc), 0);
		assert_true(json_object_object_get_ex(doc, "cluster", &v));
		assert_true(json_object_object_get_ex(v, "key", &v));
		assert_string_equal(json_object_get_string(v), "kvpool/test/nodes/n0");
		for (int i = 0; i < 30; i++) {
			json_object_put(doc);
			assert_int_equal(harness_stats(d, NULL, &doc), 0);
			json_object_object_get_ex(doc, "cluster", &v);
			json_object_object_get_ex(v, "failures", &v);
			if (json_object_get_int64(v) > 0)
				break;
			sleep_ms(100);
		}
		assert_true(json_object_get_int64(v) > 0);
		json_object_put(doc);
		kvpool_close(d);
	}
	printf("etcd stopped: %zu members kept, hit ratio %.3f\n", (size_t)N_NODES, ratio(&p));

	/* etcd back, a fourth node joins: seen within 2 lease periods. */
	assert_int_equal(etcd_proc_start(&e), 0);
	etcd_flags(&f[N_NODES], &e, "n3");
	t0 = now_ms();
	assert_int_equal(harness_start(&n.s[N_NODES], f[N_NODES].argv), 0);
	wait_for(members, cl, N_NODES + 1, 2 * LEASE_S * 1000);
	seen_ms = now_ms() - t0;
	printf("a node added after etcd came back was seen in %" PRIu64 " ms (bound %d ms)\n",
	       seen_ms, 2 * LEASE_S * 1000);
	members(cl, &reachable);
	assert_true(reachable);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_true(ratio(&p) > 0.95); /* its keys found at their previous owners */

	/* A clean stop deletes the record: the node leaves the membership. */
	assert_int_equal(harness_stop(&n.s[N_NODES]), 0);
	wait_for(members, cl, N_NODES, 2000);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	kvpool_close(cl);
	nodes_stop(&n);
	etcd_proc_destroy(&e);
}

/* The bundled trace, one node of capacity C against three of C/3. */
static double replay_hit_ratio(const char *url, uint64_t *wrong)
{
	const char *cli = getenv("KVPOOL_CLI"), *data = getenv("KVPOOL_TEST_DATA");
	char trace[512], *out = NULL;
	/* --lease-ms 0: leases end by time, which would make the figures
	 * depend on this machine's load; the comparison is of placement. */
	char *argv[] = { (char *)cli, "replay", "--json", "--block-bytes", "16KiB", "--lease-ms",
			 "0", "--server", (char *)url, "--namespace", "parity", trace, NULL };
	struct json_object *doc, *v;
	int status = -1;
	double r;

	if (!cli)
		harness_skip("KVPOOL_CLI is not set");
	snprintf(trace, sizeof(trace), "%s/synthetic_trace.jsonl", data ? data : "tests/data");
	assert_int_equal(harness_run(argv, 120000, &out, &status), 0);
	assert_int_equal(status, 0);
	doc = json_tokener_parse(out);
	assert_non_null(doc);
	assert_true(json_object_object_get_ex(doc, "hit_ratio", &v));
	r = json_object_get_double(v);
	assert_true(json_object_object_get_ex(doc, "wrong_blocks", &v));
	*wrong = (uint64_t)json_object_get_int64(v);
	json_object_put(doc);
	free(out);
	return r;
}

static void test_replay_parity(void **state)
{
	static const char *const one[] = { "--dram-capacity", "96MiB", "--max-block-bytes", "1MiB",
					   "--threads", "1", "--log-level", "warn",
					   "--rdma-port", "0", NULL };
	static const char *const third[] = { "--dram-capacity", "32MiB", "--max-block-bytes",
					     "1MiB", "--threads", "1", "--log-level", "warn",
					     "--rdma-port", "0", NULL };
	static struct etcd_node_flags f[N_NODES];
	struct harness_server single = { 0 };
	struct etcd_proc e = { 0 };
	struct nodes n;
	char url[96];
	uint64_t wrong1 = 1, wrong3 = 1;
	double r1, r3;

	(void)state;
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (harness_valgrind()) {
		printf("not under valgrind: two replays of the whole trace take too long there\n");
		return;
	}
	assert_int_equal(harness_start(&single, one), 0);
	r1 = replay_hit_ratio(single.url, &wrong1);
	assert_int_equal(harness_stop(&single), 0);
	/* The nodes get fixed names through etcd (a static list names them
	 * by their free ports, which would move the placement run to run). */
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(etcd_proc_start(&e), 0);
	memset(&n, 0, sizeof(n));
	for (int i = 0; i < N_NODES; i++) {
		char name[16];

		snprintf(name, sizeof(name), "n%d", i);
		etcd_flags_on(&f[i], &e, name, third);
		assert_int_equal(harness_start(&n.s[i], f[i].argv), 0);
	}
	for (int i = 0; i < 50 && etcd_records(&e) != N_NODES; i++)
		sleep_ms(100);
	assert_int_equal(etcd_records(&e), N_NODES);
	snprintf(url, sizeof(url), "etcd://%s/test", e.endpoint);
	r3 = replay_hit_ratio(url, &wrong3);
	nodes_stop(&n);
	etcd_proc_destroy(&e);
	printf("bundled trace, 16 KiB blocks: hit ratio %.4f on one node of 96 MiB, %.4f on "
	       "three of 32 MiB (difference %+.4f)\n", r1, r3, r3 - r1);
	assert_int_equal(wrong1, 0);
	assert_int_equal(wrong3, 0);
	assert_true(r1 > 0.1);
	assert_true(r3 > r1 - 0.01 && r3 < r1 + 0.01);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_urls),
		cmocka_unit_test(test_placement),
		cmocka_unit_test(test_node_killed),
		cmocka_unit_test(test_etcd_membership),
		cmocka_unit_test(test_replay_parity),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
