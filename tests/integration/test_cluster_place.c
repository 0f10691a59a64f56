/*
 * test_cluster_place.c - per-block placement over real kvpoold nodes on
 * loopback (docs/cluster.md): balance and hit ratio on a trace whose
 * requests share a system prompt, a node joining a warm pool, a node
 * killed mid-pass, a node stopped (SIGSTOP) and continued, and one-shot
 * CLI commands that find keys another process put.
 *
 * Thresholds are issue 27's: the busiest node moves <= 1.25x the mean
 * bytes and the hit ratio is within 0.005 of one node of the same total
 * capacity at 30% of the working set; a join costs <= 0.02 of hit ratio
 * on the next pass; a kill fails no call and the shared prefix keeps
 * hitting; a stopped node costs only its share, within the call budget.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
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

#include "etcd.h"
#include "etcd_proc.h"
#include "harness.h"

#define PREFIX 4      /* blocks of the shared system prompt */
#define CHAINS 48     /* conversations: more than the 32 continuations that make it hot */
#define LEN 24        /* blocks per conversation, prompt included */
#define BB 1024       /* block bytes */
#define BUDGET_MS 200 /* the default per-call budget of MATCH and GET */

static const char *const node_flags[] = {
	"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1",
	"--log-level", "error", "--rdma-port", "0", "--drain-timeout-ms", "1000", NULL,
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

/* ---- a chat-like workload: every conversation starts with the prompt ---- */

struct workload {
	uint8_t keys[CHAINS][LEN][32];
	uint8_t buf[LEN][BB];
	int st[LEN];
};

struct pass {
	uint64_t refs, hits, wrong, call_errors, put_errors, prefix_hits, requests;
	uint64_t worst_ms[3]; /* MATCH, GET, PUT */
};

static void payload(const uint8_t *key, uint8_t *out)
{
	harness_fill(out, BB, harness_key_seed(key));
}

static void workload_init(struct workload *w, const char *tag)
{
	for (int c = 0; c < CHAINS; c++)
		for (int b = 0; b < LEN; b++) {
			if (b < PREFIX)
				harness_key(w->keys[c][b], "system-prompt", (uint64_t)b);
			else
				harness_key(w->keys[c][b], tag, (uint64_t)c * 1000 + (uint64_t)b);
		}
}

static void took(struct pass *p, int op, uint64_t t0)
{
	uint64_t d = now_ms() - t0;

	if (d > p->worst_ms[op])
		p->worst_ms[op] = d;
}

/* One request on conversation c: MATCH, GET the matched run (checked
 * byte for byte), PUT the rest. */
static void one_request(struct kvpool_client *cl, struct workload *w, int c, struct pass *p)
{
	struct kvpool_get_block gb[LEN];
	struct kvpool_put_block pb[LEN];
	struct iovec iov[LEN];
	size_t m = 0, from;
	uint64_t t0;
	int rc;

	p->requests++;
	p->refs += LEN;
	t0 = now_ms();
	rc = kvpool_match(cl, w->keys[c], LEN, 2000, &m);
	took(p, 0, t0);
	if (rc) {
		p->call_errors++;
		fprintf(stderr, "match: %s\n", kvpool_strerror(rc));
		return;
	}
	for (size_t i = 0; i < m; i++) {
		memset(w->buf[i], 0, BB);
		iov[i] = (struct iovec){ w->buf[i], BB };
		gb[i] = (struct kvpool_get_block){ .key = w->keys[c][i], .iov = &iov[i], .iovcnt = 1 };
	}
	t0 = now_ms();
	rc = m ? kvpool_get(cl, gb, m, w->st) : 0;
	took(p, 1, t0);
	if (rc && rc != -ENOENT) {
		p->call_errors++;
		fprintf(stderr, "get: %s\n", kvpool_strerror(rc));
	}
	from = m;
	for (size_t i = 0; i < m; i++) {
		uint8_t want[BB];

		if (w->st[i]) {
			from = i;
			break;
		}
		payload(w->keys[c][i], want);
		if (gb[i].length != BB || memcmp(want, w->buf[i], BB) != 0) {
			p->wrong++;
			continue;
		}
		p->hits++;
		if (i < PREFIX)
			p->prefix_hits++;
	}
	for (size_t i = from; i < LEN; i++) {
		payload(w->keys[c][i], w->buf[i]);
		iov[i] = (struct iovec){ w->buf[i], BB };
		pb[i] = (struct kvpool_put_block){ .key = w->keys[c][i],
						   .parent = i ? w->keys[c][i - 1] : NULL,
						   .iov = &iov[i], .iovcnt = 1 };
	}
	if (from < LEN) {
		t0 = now_ms();
		rc = kvpool_put(cl, pb + from, LEN - from, w->st + from);
		took(p, 2, t0);
		if (rc && rc != -EHOSTDOWN) {
			p->put_errors++;
			fprintf(stderr, "put: %s\n", kvpool_strerror(rc));
		}
	}
}

static struct pass run_pass(struct kvpool_client *cl, struct workload *w, void (*mid)(void *),
			    void *arg)
{
	struct pass p = { 0 };

	for (int c = 0; c < CHAINS; c++) {
		if (mid && c == CHAINS / 2)
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

/* ---- nodes ------------------------------------------------------------------- */

struct nodes {
	struct harness_server s[4];
	size_t n;
	char list[256];
	char names[4][32];
	const char *name[4];
};

static void nodes_start(struct nodes *n, size_t count)
{
	size_t len = 0;

	memset(n, 0, sizeof(*n));
	n->n = count;
	for (size_t i = 0; i < count; i++) {
		int rc = harness_start(&n->s[i], node_flags);

		if (rc == -ENOENT)
			harness_skip("KVPOOLD is not set");
		assert_int_equal(rc, 0);
		snprintf(n->names[i], sizeof(n->names[i]), "127.0.0.1:%u", n->s[i].port);
		n->name[i] = n->names[i];
		len += (size_t)snprintf(n->list + len, sizeof(n->list) - len, "%s%s",
					i ? "," : "tcp://", n->names[i]);
	}
	/* kvpoold under valgrind answers slowly: no node is skipped for that */
	if (harness_valgrind())
		strncat(n->list, "?budget_ms=30000", sizeof(n->list) - strlen(n->list) - 1);
}

static void nodes_stop(struct nodes *n)
{
	for (size_t i = 0; i < 4; i++)
		if (n->s[i].pid)
			harness_kill(&n->s[i]);
}

/* The node (index into n->name) that owns key; rank 0 is the owner. */
static int rank_of(const struct nodes *n, const uint8_t *key, size_t r)
{
	size_t out[4];

	assert_int_equal(kvpool_hrw_rank(key, n->name, n->n, out, r + 1), (int)(r + 1));
	return (int)out[r];
}

static struct json_object *cluster_obj(struct kvpool_client *cl, struct json_object **doc)
{
	struct json_object *c;

	assert_int_equal(harness_stats(cl, NULL, doc), 0);
	assert_true(json_object_object_get_ex(*doc, "cluster", &c));
	return c;
}

static int64_t cl_counter(struct kvpool_client *cl, const char *name)
{
	struct json_object *doc, *c = cluster_obj(cl, &doc), *v;
	int64_t x;

	assert_true(json_object_object_get_ex(c, name, &v));
	x = json_object_get_int64(v);
	json_object_put(doc);
	return x;
}

static uint64_t node_u64(const struct harness_server *s, const char *ns, const char *path)
{
	struct kvpool_client *c;
	uint64_t v;

	assert_int_equal(harness_client(s, ns, &c), 0);
	v = harness_stat_or_fail(c, path);
	kvpool_close(c);
	return v;
}

/* ---- tests ----------------------------------------------------------------------- */

/* Every block sits on the first node of its own key's ranking, a hot one
 * on the first two; any node's answer for a key it does not own is a
 * miss. */
static void test_placement_per_block(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl, *direct[3];
	struct pass p;

	(void)state;
	nodes_start(&n, 3);
	workload_init(&w, "place");
	assert_int_equal(kvpool_connect(n.list, "place", NULL, &cl), 0);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	p = run_pass(cl, &w, NULL, NULL);
	assert_clean(&p);
	assert_int_equal(p.hits, p.refs);
	p = run_pass(cl, &w, NULL, NULL); /* hot copies made by now */
	assert_clean(&p);
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_client(&n.s[i], "place", &direct[i]), 0);
	for (int c = 0; c < CHAINS; c++)
		for (int b = 0; b < LEN; b++) {
			int o = rank_of(&n, w.keys[c][b], 0), o2 = rank_of(&n, w.keys[c][b], 1);

			for (int i = 0; i < 3; i++) {
				int st = -1;

				assert_int_equal(kvpool_exists(direct[i], w.keys[c][b], 1, &st), 0);
				if (i == o || (b < PREFIX && i == o2))
					assert_int_equal(st, 0);
				else
					assert_int_equal(st, -ENOENT);
			}
		}
	/* stored as roots: each is matchable on its own at its owner */
	{
		size_t m = 0;

		assert_int_equal(kvpool_match(direct[rank_of(&n, w.keys[5][10], 0)], w.keys[5][10], 1,
					      0, &m), 0);
		assert_int_equal(m, 1);
	}
	assert_true(cl_counter(cl, "hot_blocks") >= PREFIX);
	for (int i = 0; i < 3; i++)
		kvpool_close(direct[i]);
	kvpool_close(cl);
	nodes_stop(&n);
}

/* Another process put a chain; one-shot CLI commands on the cluster URL
 * find its keys (they place by key alone). */
static void test_cli_one_shot(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl;
	char hex[65], out_path[64] = "/tmp/kvpool-oneshot-XXXXXX", *out = NULL;
	int status = -1, fd;

	(void)state;
	if (!cli)
		harness_skip("KVPOOL_CLI is not set");
	nodes_start(&n, 3);
	workload_init(&w, "oneshot");
	assert_int_equal(kvpool_connect(n.list, "shot", NULL, &cl), 0);
	run_pass(cl, &w, NULL, NULL);
	kvpool_close(cl);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", w.keys[7][13][i]);
	{
		char *argv[] = { (char *)cli, "exists", "--server", n.list, "--namespace", "shot", hex,
				 NULL };

		assert_int_equal(harness_run(argv, 20000, &out, &status), 0);
		assert_int_equal(status, 0);
		free(out);
	}
	fd = mkstemp(out_path);
	assert_true(fd >= 0);
	close(fd);
	{
		char *argv[] = { (char *)cli, "get", "--server", n.list, "--namespace", "shot", "-o",
				 out_path, hex, NULL };
		uint8_t want[BB], got[BB + 1];
		FILE *f;

		assert_int_equal(harness_run(argv, 20000, &out, &status), 0);
		assert_int_equal(status, 0);
		free(out);
		f = fopen(out_path, "rb");
		assert_non_null(f);
		assert_int_equal(fread(got, 1, sizeof(got), f), BB);
		fclose(f);
		payload(w.keys[7][13], want);
		assert_memory_equal(got, want, BB);
	}
	unlink(out_path);
	{
		char *argv[] = { (char *)cli, "delete", "--server", n.list, "--namespace", "shot", hex,
				 NULL };
		char *again[] = { (char *)cli, "exists", "--server", n.list, "--namespace", "shot", hex,
				  NULL };

		assert_int_equal(harness_run(argv, 20000, &out, &status), 0);
		assert_int_equal(status, 0);
		free(out);
		assert_int_equal(harness_run(again, 20000, &out, &status), 0);
		assert_int_equal(status, 1); /* gone */
		free(out);
	}
	nodes_stop(&n);
}

static void kill_node(void *arg)
{
	harness_kill(arg); /* SIGKILL, mid-pass */
}

/* Whether the cluster handle counts the node on port up (its STATS says
 * so); polls for at most ms. */
static bool wait_node_up(struct kvpool_client *cl, uint16_t port, int ms)
{
	char tail[16];

	snprintf(tail, sizeof(tail), ":%u", port);
	for (int waited = 0; waited <= ms; waited += 200) {
		struct json_object *doc, *c, *nodes, *v;
		bool up = false;

		if (harness_stats(cl, NULL, &doc) == 0) {
			if (json_object_object_get_ex(doc, "cluster", &c) &&
			    json_object_object_get_ex(c, "nodes", &nodes)) {
				for (size_t i = 0; i < json_object_array_length(nodes); i++) {
					struct json_object *m = json_object_array_get_idx(nodes, i);
					const char *url;

					if (!json_object_object_get_ex(m, "url", &v))
						continue;
					url = json_object_get_string(v);
					if (strlen(url) >= strlen(tail) &&
					    !strcmp(url + strlen(url) - strlen(tail), tail) &&
					    json_object_object_get_ex(m, "up", &v))
						up = json_object_get_boolean(v);
				}
			}
			json_object_put(doc);
		}
		if (up)
			return true;
		sleep_ms(200);
	}
	return false;
}

static void test_node_killed(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl;
	struct pass warm, dip, down, back1, back2;
	uint16_t port;
	int victim;

	(void)state;
	nodes_start(&n, 3);
	workload_init(&w, "killed");
	assert_int_equal(kvpool_connect(n.list, "kill", NULL, &cl), 0);
	run_pass(cl, &w, NULL, NULL);
	run_pass(cl, &w, NULL, NULL);
	warm = run_pass(cl, &w, NULL, NULL);
	/* the node that owns the prompt's first block */
	victim = rank_of(&n, w.keys[0][0], 0);
	port = n.s[victim].port;
	dip = run_pass(cl, &w, kill_node, &n.s[victim]);
	down = run_pass(cl, &w, NULL, NULL);
	printf("node killed: hit ratio warm %.3f, pass with the kill %.3f, next %.3f; prompt hits "
	       "%" PRIu64 "/%" PRIu64 " while down\n", ratio(&warm), ratio(&dip), ratio(&down),
	       down.prefix_hits, down.requests * PREFIX);
	assert_clean(&warm);
	assert_clean(&dip);
	assert_clean(&down);
	assert_true(ratio(&warm) > 0.99);
	/* the prompt is on two nodes: it keeps hitting with one of them gone */
	assert_int_equal(down.prefix_hits, down.requests * PREFIX);
	assert_int_equal(harness_start_on_port(&n.s[victim], port, node_flags), 0); /* back, empty */
	back1 = run_pass(cl, &w, NULL, NULL);
	sleep_ms(1200); /* past the back-off of a node that failed */
	/* under valgrind the restarted kvpoold answers its first probes
	 * slowly: the refill must find it up, or its blocks go elsewhere */
	assert_true(wait_node_up(cl, port, harness_valgrind() ? 60000 : 10000));
	back1 = run_pass(cl, &w, NULL, NULL);
	back2 = run_pass(cl, &w, NULL, NULL);
	printf("back empty: refill pass %.3f, then %.3f\n", ratio(&back1), ratio(&back2));
	assert_clean(&back1);
	assert_clean(&back2);
	assert_true(ratio(&back2) > 0.99); /* the refill restored it */
	assert_true(node_u64(&n.s[victim], "kill", "blocks") > 0); /* and uses it again */
	kvpool_close(cl);
	nodes_stop(&n);
}

/* A node stopped (SIGSTOP): calls come back within the budget with its
 * share as misses, it is skipped meanwhile, and used again after
 * SIGCONT. */
static void test_node_stopped(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *cl;
	struct pass warm, stopped, again, cont;
	int victim;
	uint64_t slack = 600;

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: the 200 ms budget does not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n, 3);
	workload_init(&w, "stopped");
	assert_int_equal(kvpool_connect(n.list, "stop", NULL, &cl), 0);
	run_pass(cl, &w, NULL, NULL);
	warm = run_pass(cl, &w, NULL, NULL);
	assert_true(ratio(&warm) > 0.99);
	victim = rank_of(&n, w.keys[3][LEN - 1], 0);
	assert_int_equal(kill(n.s[victim].pid, SIGSTOP), 0);
	stopped = run_pass(cl, &w, NULL, NULL);
	again = run_pass(cl, &w, NULL, NULL);
	printf("node stopped: hit ratio %.3f then %.3f; worst call MATCH %" PRIu64 " ms, GET %" PRIu64
	       " ms, PUT %" PRIu64 " ms (budget %d ms)\n", ratio(&stopped), ratio(&again),
	       stopped.worst_ms[0], stopped.worst_ms[1], stopped.worst_ms[2], BUDGET_MS);
	assert_clean(&stopped);
	assert_clean(&again);
	assert_true(stopped.worst_ms[0] <= BUDGET_MS + slack);
	assert_true(stopped.worst_ms[1] <= BUDGET_MS + slack);
	assert_true(again.worst_ms[0] <= BUDGET_MS + slack);
	assert_true(ratio(&stopped) > 0.05); /* the other nodes' shares still hit */
	assert_true(cl_counter(cl, "budget_expired") > 0);
	assert_int_equal(kill(n.s[victim].pid, SIGCONT), 0);
	sleep_ms(2500); /* its back-off ends; it answers again */
	run_pass(cl, &w, NULL, NULL);
	cont = run_pass(cl, &w, NULL, NULL);
	printf("after SIGCONT: hit ratio %.3f\n", ratio(&cont));
	assert_clean(&cont);
	assert_true(ratio(&cont) > 0.99);
	kvpool_close(cl);
	nodes_stop(&n);
}

/* ---- with fixed names (etcd): join, and the shared-prompt replay -------------- */

struct etcd_node {
	char url[128], name[16];
	const char *argv[24];
};

static void etcd_node_flags(struct etcd_node *f, const struct etcd_proc *e, const char *name,
			    const char *capacity)
{
	size_t k = 0;
	static const char *const base[] = { "--max-block-bytes", "1MiB", "--threads", "1",
					    "--log-level", "error", "--rdma-port", "0",
					    "--cluster-lease-s", "2", NULL };

	snprintf(f->url, sizeof(f->url), "etcd://%s/test", e->endpoint);
	snprintf(f->name, sizeof(f->name), "%s", name);
	for (size_t i = 0; base[i]; i++)
		f->argv[k++] = base[i];
	f->argv[k++] = "--dram-capacity";
	f->argv[k++] = capacity;
	f->argv[k++] = "--cluster";
	f->argv[k++] = f->url;
	f->argv[k++] = "--node-name";
	f->argv[k++] = f->name;
	f->argv[k] = NULL;
}

static size_t members(struct kvpool_client *cl)
{
	struct json_object *doc, *c = cluster_obj(cl, &doc), *v;
	size_t n;

	assert_true(json_object_object_get_ex(c, "nodes", &v));
	n = json_object_array_length(v);
	json_object_put(doc);
	return n;
}

static void test_join(void **state)
{
	static struct workload w;
	static struct etcd_node f[4];
	struct etcd_proc e = { 0 };
	struct harness_server s[4] = { { 0 } };
	struct kvpool_client *cl;
	struct pass warm, joined, after;
	char url[128];
	uint64_t t_start;
	int64_t fresh_hits = -1;

	(void)state;
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(etcd_proc_start(&e), 0);
	t_start = now_ms();
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "j%d", i);
		etcd_node_flags(&f[i], &e, name, "16MiB");
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
	}
	/* a generous budget: this measures a join, not a loaded machine's
	 * pauses (test_node_stopped measures the budget) */
	snprintf(url, sizeof(url), "etcd://%s/test?budget_ms=5000", e.endpoint);
	assert_int_equal(kvpool_connect(url, "join", NULL, &cl), 0);
	for (int i = 0; i < 50 && members(cl) != 3; i++)
		sleep_ms(100);
	assert_int_equal(members(cl), 3);
	workload_init(&w, "join");
	run_pass(cl, &w, NULL, NULL);
	warm = run_pass(cl, &w, NULL, NULL);
	/* the three are seconds old (records carry whole seconds) when the
	 * fourth registers */
	while (now_ms() - t_start < 4500)
		sleep_ms(100);
	etcd_node_flags(&f[3], &e, "j3", "16MiB");
	assert_int_equal(harness_start(&s[3], f[3].argv), 0);
	for (int i = 0; i < 80 && members(cl) != 4; i++)
		sleep_ms(100);
	assert_int_equal(members(cl), 4);
	if (!harness_valgrind()) {
		/* A process that connects after the join has not seen it: the
		 * records' ages tell it the fourth node is new (younger than
		 * fallback_ms, here 2.5 s; the others are older), so it asks
		 * the keys the fourth took at their previous owners too. A
		 * MATCH-only pass: it changes nothing. */
		struct kvpool_client *fresh;
		uint64_t refs = 0, hit = 0;

		snprintf(url, sizeof(url), "etcd://%s/test?budget_ms=5000&fallback_ms=2500",
			 e.endpoint);
		assert_int_equal(kvpool_connect(url, "join", NULL, &fresh), 0);
		for (int c = 0; c < CHAINS; c++) {
			size_t m = 0;

			assert_int_equal(kvpool_match(fresh, w.keys[c], LEN, 0, &m), 0);
			hit += m;
			refs += LEN;
		}
		fresh_hits = cl_counter(fresh, "fallback_hits");
		printf("a process connected after the join: MATCH hit ratio %.4f, fallback hits "
		       "%" PRId64 "\n", (double)hit / (double)refs, fresh_hits);
		assert_true((double)hit / (double)refs >= ratio(&warm) - 0.02);
		assert_true(fresh_hits > 0); /* found at the previous owners */
		kvpool_close(fresh);
	}
	joined = run_pass(cl, &w, NULL, NULL);
	sleep_ms(300); /* background copies land */
	after = run_pass(cl, &w, NULL, NULL);
	printf("a fourth node joined a warm pool: hit ratio %.4f before, %.4f on the next pass, "
	       "%.4f after; fallback hits %" PRId64 ", copies %" PRId64 "\n", ratio(&warm),
	       ratio(&joined), ratio(&after), cl_counter(cl, "fallback_hits"),
	       cl_counter(cl, "copies"));
	assert_clean(&warm);
	assert_clean(&joined);
	assert_clean(&after);
	assert_true(ratio(&warm) > 0.99);
	assert_true(ratio(&joined) >= ratio(&warm) - 0.02);
	assert_true(ratio(&after) >= ratio(&warm) - 0.02);
	/* the moved blocks were found at their previous owners (by this
	 * handle, or first by the process connected after the join, whose
	 * MATCH copied them to the fourth node already) */
	assert_true(cl_counter(cl, "fallback_hits") > 0 || fresh_hits > 0);
	assert_true(node_u64(&s[3], "join", "blocks") > 0); /* copied to it */
	kvpool_close(cl);
	for (int i = 0; i < 4; i++)
		assert_int_equal(harness_stop(&s[i]), 0);
	etcd_proc_destroy(&e);
}

/* A fallback epoch whose previous owners never held the blocks: a
 * client saw two nodes, a third joined, and then the chains were put. The
 * previous owners lack every block put since (they are asked too, as
 * moved keys), and the shared prompt is hot: a gap at one node must not
 * hide the keys it holds after that gap (it did with a MATCH as the
 * second request: the warm pass hit 0.083, every chain stopping inside
 * the prompt, until the epoch ended). With these names the prompt's
 * third block has its two replicas on j0 and j1, and each of them is
 * also a previous owner of an earlier prompt block it never got. */
static void test_epoch_gaps_hide_nothing(void **state)
{
	static struct workload w;
	static struct etcd_node f[3];
	struct etcd_proc e = { 0 };
	struct harness_server s[3] = { { 0 } };
	struct kvpool_client *cl;
	struct json_object *doc, *c, *fb, *v;
	struct pass fill, warm;
	char url[96];

	(void)state;
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(etcd_proc_start(&e), 0);
	for (int i = 0; i < 2; i++) {
		char name[16];

		snprintf(name, sizeof(name), "j%d", i);
		etcd_node_flags(&f[i], &e, name, "16MiB");
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
	}
	snprintf(url, sizeof(url), "etcd://%s/test?budget_ms=5000", e.endpoint);
	assert_int_equal(kvpool_connect(url, "gaps", NULL, &cl), 0);
	for (int i = 0; i < 50 && members(cl) != 2; i++)
		sleep_ms(100);
	assert_int_equal(members(cl), 2); /* its placement saw two */
	etcd_node_flags(&f[2], &e, "j2", "16MiB");
	assert_int_equal(harness_start(&s[2], f[2].argv), 0);
	for (int i = 0; i < 80 && members(cl) != 3; i++)
		sleep_ms(100);
	assert_int_equal(members(cl), 3);
	c = cluster_obj(cl, &doc);
	assert_true(json_object_object_get_ex(c, "fallback", &fb));
	assert_true(json_object_object_get_ex(fb, "active", &v));
	assert_true(json_object_get_boolean(v)); /* an epoch, two previous nodes */
	json_object_put(doc);
	workload_init(&w, "gaps");
	fill = run_pass(cl, &w, NULL, NULL);
	warm = run_pass(cl, &w, NULL, NULL);
	printf("blocks put in a fallback epoch: hit ratio %.4f on the next pass\n", ratio(&warm));
	assert_clean(&fill);
	assert_clean(&warm);
	assert_true(ratio(&warm) > 0.99);
	kvpool_close(cl);
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_stop(&s[i]), 0);
	etcd_proc_destroy(&e);
}

/* The bundled trace with every request prefixed by one shared block,
 * written next to the test's other temporary files. */
static void shared_prompt_trace(const char *src, const char *dst)
{
	FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
	char *line = NULL;
	size_t cap = 0;

	assert_non_null(in);
	assert_non_null(out);
	while (getline(&line, &cap, in) > 0) {
		char *ids = strstr(line, "\"hash_ids\": [");

		if (!ids) {
			fputs(line, out);
			continue;
		}
		ids += strlen("\"hash_ids\": [");
		/* an id no request of the trace uses (they are small integers) */
		fprintf(out, "%.*s18446744069414584320, %s", (int)(ids - line), line, ids);
	}
	free(line);
	fclose(in);
	assert_int_equal(fclose(out), 0);
}

/* kvpool replay of `trace` against url: hit ratio and wrong blocks. */
static double replay(const char *url, const char *trace, uint64_t *wrong)
{
	const char *cli = getenv("KVPOOL_CLI");
	char *out = NULL;
	char *argv[] = { (char *)cli, "replay", "--json", "--block-bytes", "4KiB", "--lease-ms", "0",
			 "--concurrency", "1", "--server", (char *)url, "--namespace", "shared",
			 (char *)trace, NULL };
	struct json_object *doc, *v;
	int status = -1;
	double r;

	assert_int_equal(harness_run(argv, 600000, &out, &status), 0);
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

static void test_shared_prompt_balance(void **state)
{
	/* 30% of the 43,925 distinct blocks of the derived trace, 4 KiB each:
	 * 13,176 blocks, 3 x 4,392 */
	static const char *const one[] = { "--dram-capacity", "52704KiB", "--max-block-bytes",
					   "1MiB", "--threads", "1", "--log-level", "error",
					   "--rdma-port", "0", NULL };
	static struct etcd_node f[3];
	const char *data = getenv("KVPOOL_TEST_DATA");
	struct harness_server single = { 0 }, s[3] = { { 0 } };
	struct etcd_proc e = { 0 };
	struct kvpool_client *cl;
	char src[512], trace[] = "/tmp/kvpool-shared-prompt-XXXXXX", url[96];
	uint64_t wrong1 = 1, wrong3 = 1, bytes[3], sum = 0, busiest = 0;
	double r1, r3;
	int fd;

	(void)state;
	if (!getenv("KVPOOLD") || !getenv("KVPOOL_CLI"))
		harness_skip("KVPOOLD or KVPOOL_CLI is not set");
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	if (harness_valgrind()) {
		printf("not under valgrind: two replays of the whole trace take too long there\n");
		return;
	}
	snprintf(src, sizeof(src), "%s/synthetic_trace.jsonl", data ? data : "tests/data");
	fd = mkstemp(trace);
	assert_true(fd >= 0);
	close(fd);
	shared_prompt_trace(src, trace);
	assert_int_equal(harness_start(&single, one), 0);
	r1 = replay(single.url, trace, &wrong1);
	assert_int_equal(harness_stop(&single), 0);
	/* fixed node names (etcd), so the placement does not move with the ports */
	assert_int_equal(etcd_proc_start(&e), 0);
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "n%d", i);
		etcd_node_flags(&f[i], &e, name, "17568KiB");
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
	}
	/* a generous budget: on a loaded two-core machine a node that takes
	 * 200 ms would be skipped for a second, which is not what this
	 * measures (test_node_stopped does) */
	snprintf(url, sizeof(url), "etcd://%s/test?budget_ms=5000", e.endpoint);
	assert_int_equal(kvpool_connect(url, "shared", NULL, &cl), 0);
	for (int i = 0; i < 50 && members(cl) != 3; i++)
		sleep_ms(100);
	assert_int_equal(members(cl), 3);
	kvpool_close(cl);
	r3 = replay(url, trace, &wrong3);
	for (int i = 0; i < 3; i++) {
		bytes[i] = node_u64(&s[i], "shared", "ops.put.bytes") +
			   node_u64(&s[i], "shared", "ops.get.bytes");
		sum += bytes[i];
		busiest = bytes[i] > busiest ? bytes[i] : busiest;
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_stop(&s[i]), 0);
	etcd_proc_destroy(&e);
	unlink(trace);
	printf("shared 1-block prompt, 30%% of the working set, 4 KiB blocks: hit ratio %.4f on one "
	       "node, %.4f on three (difference %+.4f); bytes per node %.1f / %.1f / %.1f MiB, "
	       "busiest %.3fx the mean\n", r1, r3, r3 - r1, bytes[0] / 1048576.0,
	       bytes[1] / 1048576.0, bytes[2] / 1048576.0, (double)busiest * 3 / (double)sum);
	assert_int_equal(wrong1, 0);
	assert_int_equal(wrong3, 0);
	assert_true(r1 > 0.1);
	assert_true(r3 >= r1 - 0.005);
	assert_true((double)busiest * 3 <= 1.25 * (double)sum);
}

/* ---- a MATCH that waits, over every owner in one round --------------------------- */

struct waiter {
	struct kvpool_client *cl;
	const uint8_t (*chain)[32];
	size_t count;
	struct kvpool_match_opts opts;
	struct kvpool_match_result res;
	int rc;
	uint64_t took_ms;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	uint64_t t0 = now_ms();

	w->rc = kvpool_match_ex(w->cl, w->chain, w->count, &w->opts, &w->res);
	w->took_ms = now_ms() - t0;
	return NULL;
}

static void test_match_waits_on_every_owner(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *consumer, *producer;
	struct waiter wt = { 0 };
	pthread_t t;
	int owners[3] = { 0 };

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: the waits' bounds do not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n, 3);
	workload_init(&w, "wait");
	for (int b = 0; b < LEN; b++)
		owners[rank_of(&n, w.keys[1][b], 0)] = 1;
	assert_true(owners[0] + owners[1] + owners[2] >= 2); /* the chain spans nodes */
	assert_int_equal(kvpool_connect(n.list, "wait", NULL, &consumer), 0);
	assert_int_equal(kvpool_connect(n.list, "wait", NULL, &producer), 0);
	wt = (struct waiter){ .cl = consumer, .chain = (const uint8_t(*)[32])w.keys[1], .count = LEN,
			      .opts = { .wait_ms = 8000, .want = LEN } };
	assert_int_equal(pthread_create(&t, NULL, wait_thread, &wt), 0);
	sleep_ms(400);
	{
		struct pass p = { 0 };

		/* the producer computes the chain and stores it (the consumer is
		 * parked on each node meanwhile) */
		one_request(producer, &w, 1, &p);
		assert_clean(&p);
	}
	pthread_join(t, NULL);
	printf("a MATCH waiting for %d blocks on %d nodes answered after %" PRIu64 " ms: matched "
	       "%zu, flags 0x%x\n", LEN, owners[0] + owners[1] + owners[2], wt.took_ms,
	       wt.res.matched, wt.res.flags);
	assert_int_equal(wt.rc, 0);
	assert_int_equal(wt.res.matched, LEN);
	assert_true(wt.res.flags & KVPOOL_MATCH_WAITED);
	assert_false(wt.res.flags & KVPOOL_MATCH_WAIT_TIMEOUT);
	assert_true(wt.took_ms >= 300 && wt.took_ms < 8000);
	/* nothing comes: answered when the wait ends */
	wt = (struct waiter){ .cl = consumer, .chain = (const uint8_t(*)[32])w.keys[2][PREFIX],
			      .count = LEN - PREFIX, .opts = { .wait_ms = 1500, .want = LEN - PREFIX } };
	assert_int_equal(pthread_create(&t, NULL, wait_thread, &wt), 0);
	pthread_join(t, NULL);
	assert_int_equal(wt.rc, 0);
	assert_int_equal(wt.res.matched, 0); /* nobody stored it */
	assert_true(wt.res.flags & KVPOOL_MATCH_WAIT_TIMEOUT);
	assert_true(wt.took_ms >= 1000 && wt.took_ms < 4000);
	kvpool_close(producer);
	kvpool_close(consumer);
	nodes_stop(&n);
}

/* A node of a waiting MATCH lost mid-wait (issue 26 on a cluster): its
 * part never comes, so the call answers at once with what the others have,
 * flagged WAITED|WAIT_ENDED - never a short answer flagged only WAITED,
 * which reads as "woken, complete" (it answered matched 0, flags WAITED
 * once the producer had put the rest through its own handle). */
static void test_wait_node_lost(void **state)
{
	static struct workload w;
	struct nodes n;
	struct kvpool_client *consumer, *producer;
	struct waiter wt = { 0 };
	pthread_t t;
	int victim, spans = 0;

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: the waits' bounds do not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n, 3);
	workload_init(&w, "lost");
	victim = rank_of(&n, w.keys[5][0], 0);
	for (int b = 0; b < LEN; b++)
		spans |= rank_of(&n, w.keys[5][b], 0) != victim;
	assert_true(spans); /* the others wait for their part too */
	assert_int_equal(kvpool_connect(n.list, "lost", NULL, &consumer), 0);
	assert_int_equal(kvpool_connect(n.list, "lost", NULL, &producer), 0);
	wt = (struct waiter){ .cl = consumer, .chain = (const uint8_t(*)[32])w.keys[5], .count = LEN,
			      .opts = { .wait_ms = 8000, .want = LEN } };
	assert_int_equal(pthread_create(&t, NULL, wait_thread, &wt), 0);
	sleep_ms(400);
	harness_kill(&n.s[victim]);
	{
		struct pass p = { 0 };

		one_request(producer, &w, 5, &p); /* the rest comes, elsewhere */
	}
	pthread_join(t, NULL);
	printf("a node of a waiting MATCH killed: answered after %" PRIu64 " ms, matched %zu, "
	       "flags 0x%x\n", wt.took_ms, wt.res.matched, wt.res.flags);
	assert_int_equal(wt.rc, 0);
	assert_true(wt.res.matched < LEN);
	assert_true(wt.res.flags & KVPOOL_MATCH_WAITED);
	assert_true(wt.res.flags & KVPOOL_MATCH_WAIT_ENDED);
	assert_true(wt.took_ms < 6000); /* not the whole wait */
	kvpool_close(producer);
	kvpool_close(consumer);
	nodes_stop(&n);
}

/* A waiting MATCH on an etcd cluster follows a membership change: a node
 * that joins mid-wait owns some of the chain's blocks from then on (a
 * producer puts them there), so the wait answers at once, flagged
 * WAIT_ENDED, and the caller's next MATCH asks the new owners (it timed
 * out after the whole wait with half the chain, although every block had
 * arrived). */
static void test_wait_follows_join(void **state)
{
	static struct workload w;
	static struct etcd_node f[3];
	struct etcd_proc e = { 0 };
	struct harness_server s[3] = { { 0 } };
	struct kvpool_client *consumer, *producer;
	struct waiter wt = { 0 };
	const char *names[3] = { "w0", "w1", "w2" };
	char url[128];
	pthread_t t;
	int moves = 0;

	(void)state;
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	if (harness_valgrind()) {
		printf("not under valgrind: the waits' bounds do not hold at valgrind's pace\n");
		return;
	}
	workload_init(&w, "follow");
	for (int b = 0; b < LEN; b++)
		moves += kvpool_hrw_owner(w.keys[7][b], names, 3) == 2;
	assert_true(moves > 0); /* the third node takes some of the chain */
	assert_int_equal(etcd_proc_start(&e), 0);
	for (int i = 0; i < 2; i++) {
		etcd_node_flags(&f[i], &e, names[i], "16MiB");
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
	}
	snprintf(url, sizeof(url), "etcd://%s/test", e.endpoint);
	assert_int_equal(kvpool_connect(url, "follow", NULL, &consumer), 0);
	for (int i = 0; i < 50 && members(consumer) != 2; i++)
		sleep_ms(100);
	assert_int_equal(members(consumer), 2);
	wt = (struct waiter){ .cl = consumer, .chain = (const uint8_t(*)[32])w.keys[7], .count = LEN,
			      .opts = { .wait_ms = 15000, .want = LEN } };
	assert_int_equal(pthread_create(&t, NULL, wait_thread, &wt), 0);
	sleep_ms(400);
	etcd_node_flags(&f[2], &e, names[2], "16MiB");
	assert_int_equal(harness_start(&s[2], f[2].argv), 0);
	pthread_join(t, NULL);
	printf("a node joined during a waiting MATCH: answered after %" PRIu64 " ms, matched %zu, "
	       "flags 0x%x\n", wt.took_ms, wt.res.matched, wt.res.flags);
	assert_int_equal(wt.rc, 0);
	assert_true(wt.res.flags & KVPOOL_MATCH_WAIT_ENDED);
	assert_false(wt.res.flags & KVPOOL_MATCH_WAIT_TIMEOUT);
	assert_true(wt.took_ms < 10000);
	/* the producer stores the chain where it goes now; the caller's next
	 * MATCH finds all of it */
	assert_int_equal(kvpool_connect(url, "follow", NULL, &producer), 0);
	for (int i = 0; i < 50 && members(producer) != 3; i++)
		sleep_ms(100);
	{
		struct pass p = { 0 };

		one_request(producer, &w, 7, &p);
		assert_clean(&p);
	}
	wt = (struct waiter){ .cl = consumer, .chain = (const uint8_t(*)[32])w.keys[7], .count = LEN,
			      .opts = { .wait_ms = 3000, .want = LEN } };
	wait_thread(&wt);
	assert_int_equal(wt.rc, 0);
	assert_int_equal(wt.res.matched, LEN);
	kvpool_close(producer);
	kvpool_close(consumer);
	for (int i = 0; i < 3; i++)
		harness_kill(&s[i]);
	etcd_proc_destroy(&e);
}

/* A cluster handle keeps no memory of where blocks went (Finding F2 of a
 * fresh-clone test: a bounded table of chain positions forgot blocks after
 * ~65,536 keys, or after 8 keys whose low bits collide, and then answered
 * misses and "parent block not stored" for stored blocks). Keys with
 * constant low bits, then 8,000 other blocks through the same handle:
 * every block is still found, and a PUT under the chain's last block is
 * taken. */
static void test_no_position_memory(void **state)
{
	enum { CHAIN = 48, OTHERS = 8000, BATCH = 1000 }; /* OTHERS: fits the nodes (no eviction) */
	static uint8_t chain[CHAIN][32], other[BATCH][32], one = 1;
	struct kvpool_put_block pb[BATCH];
	struct iovec iov = { &one, 1 };
	struct nodes n;
	struct kvpool_client *cl;
	int st[BATCH];
	uint8_t next[32];

	(void)state;
	nodes_start(&n, 3);
	assert_int_equal(kvpool_connect(n.list, "nopos", NULL, &cl), 0);
	for (int i = 0; i < CHAIN; i++) {
		memset(chain[i], 0, 32);
		chain[i][2] = (uint8_t)i; /* word0 ^ word1's low 13 bits all alike */
		chain[i][20] = 0x5a;
		pb[i] = (struct kvpool_put_block){ chain[i], i ? chain[i - 1] : NULL, &iov, 1, 0 };
	}
	assert_int_equal(kvpool_put(cl, pb, CHAIN, st), 0);
	assert_int_equal(kvpool_exists(cl, (const uint8_t(*)[32])chain, CHAIN, st), 0);
	for (int i = 0; i < CHAIN; i++)
		assert_int_equal(st[i], 0);
	for (int k = 0; k < OTHERS / BATCH; k++) {
		for (int i = 0; i < BATCH; i++) {
			harness_key(other[i], "nopos-other", (uint64_t)(k * BATCH + i));
			pb[i] = (struct kvpool_put_block){ other[i], NULL, &iov, 1, 0 };
		}
		assert_int_equal(kvpool_put(cl, pb, BATCH, st), 0);
	}
	assert_int_equal(kvpool_exists(cl, (const uint8_t(*)[32])chain, CHAIN, st), 0);
	for (int i = 0; i < CHAIN; i++)
		assert_int_equal(st[i], 0);
	harness_key(next, "nopos-next", 0);
	pb[0] = (struct kvpool_put_block){ next, chain[CHAIN - 1], &iov, 1, 0 };
	assert_int_equal(kvpool_put(cl, pb, 1, st), 0);
	assert_int_equal(st[0], 0);
	kvpool_close(cl);
	nodes_stop(&n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_placement_per_block),
		cmocka_unit_test(test_cli_one_shot),
		cmocka_unit_test(test_node_killed),
		cmocka_unit_test(test_node_stopped),
		cmocka_unit_test(test_join),
		cmocka_unit_test(test_epoch_gaps_hide_nothing),
		cmocka_unit_test(test_match_waits_on_every_owner),
		cmocka_unit_test(test_wait_node_lost),
		cmocka_unit_test(test_wait_follows_join),
		cmocka_unit_test(test_no_position_memory),
		cmocka_unit_test(test_shared_prompt_balance),
	};

	signal(SIGPIPE, SIG_IGN);
	if (getenv("CLUSTER_TEST_FILTER")) /* e.g. "test_wait_*": those tests alone */
		cmocka_set_test_filter(getenv("CLUSTER_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
