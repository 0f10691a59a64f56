/*
 * test_cluster_async.c - a cluster handle as libkvpool's second backend
 * (client/lib/cluster/: parent requests with children on node engines,
 * node threads), against real kvpoold nodes on loopback:
 *
 *  - a bad scatter-gather list ({NULL, 8}) is -EINVAL for PUT and GET and
 *    their submits, before anything is sent, as on one node (a cluster
 *    handle answered 0 and stored nothing, or reported a GET of nothing as
 *    a hit)
 *  - a node that refuses HELLO with -EACCES: every block of its share says
 *    -EACCES, for PUT, GET and EXISTS (its PUT share was reported stored);
 *    the message names the node, STATS says "refused" (not down) and
 *    counts its errors, and `kvpool ping` lists it as refused and fails
 *  - the asynchronous calls on three nodes (-EOPNOTSUPP before): in
 *    order, out of order (a stopped node's request finishes after a later
 *    one), cancel (a stopped node's GET: its buffers are never written), a
 *    node killed with requests in flight (its shares are misses and
 *    dropped PUTs, nothing hangs), all waited for on the event fd with
 *    poll(2)
 *  - cancel touches only the cancelled requests: rounds of one-block GETs
 *    over three nodes, every third cancelled, every other one completes,
 *    each exactly once
 *  - kvpool_close with requests in flight (dropped at once)
 *  - kvpool_stats, kvpool_ping and kvpool_drop_namespace while
 *    asynchronous requests are in flight
 *  - kvpool_register on a cluster handle (the regions go to every node)
 *  - sync and async calls on one cluster handle from several threads at
 *    once (make test-tsan runs this program under ThreadSanitizer)
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>
#include <dirent.h>

#include "harness.h"

#define N_NODES 3
#define N_KEYS 48
#define BYTES 4096
#define TOKEN "cluster-test-token-0123456789"

static const char *const node_flags[] = {
	"--dram-capacity", "32MiB", "--max-block-bytes", "1MiB", "--threads", "1",
	"--log-level", "error", "--rdma-port", "0", "--drain-timeout-ms", "1000", NULL,
};

struct nodes {
	struct harness_server s[N_NODES];
	char list[256];
	char name_buf[N_NODES][32];
	const char *name[N_NODES];
	char dir[256];
	const char *flags[N_NODES][24];
};

/* Start count nodes; node `refusing` (or -1) with a tokens file that
 * grants TOKEN only namespaces under "other/". */
static void nodes_start(struct nodes *n, size_t count, int refusing)
{
	size_t len = 0;
	char tokens[300];

	memset(n, 0, sizeof(*n));
	if (refusing >= 0) {
		FILE *f;

		assert_int_equal(harness_tmpdir("cluster-async", n->dir, sizeof(n->dir)), 0);
		snprintf(tokens, sizeof(tokens), "%s/tokens", n->dir);
		f = fopen(tokens, "w");
		assert_non_null(f);
		fputs("[tokens]\n" TOKEN " rw other/\n", f);
		fclose(f);
		assert_int_equal(chmod(tokens, 0600), 0);
	}
	for (size_t i = 0; i < count; i++) {
		size_t k = 0;
		int rc;

		for (const char *const *fl = node_flags; *fl; fl++)
			n->flags[i][k++] = *fl;
		if ((int)i == refusing) {
			n->flags[i][k++] = "--tokens-file";
			n->flags[i][k++] = strdup(tokens);
		}
		n->flags[i][k] = NULL;
		rc = harness_start(&n->s[i], n->flags[i]);
		if (rc == -ENOENT)
			harness_skip("KVPOOLD is not set");
		assert_int_equal(rc, 0);
		snprintf(n->name_buf[i], sizeof(n->name_buf[i]), "127.0.0.1:%u", n->s[i].port);
		n->name[i] = n->name_buf[i];
		len += (size_t)snprintf(n->list + len, sizeof(n->list) - len, "%s127.0.0.1:%u",
					i ? "," : "tcp://", n->s[i].port);
	}
}

static void nodes_stop(struct nodes *n, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		if (n->s[i].pid)
			assert_int_equal(harness_stop(&n->s[i]), 0);
		for (int k = 0; n->flags[i][k]; k++)
			if (!strcmp(n->flags[i][k], "--tokens-file")) {
				free((void *)n->flags[i][k + 1]);
				break;
			}
	}
	if (n->dir[0])
		harness_rm_rf(n->dir);
}

/* Has every thread of process pid stopped (state T in /proc)? */
static int all_stopped(pid_t pid)
{
	char path[64], st[600];
	int stopped = 1, seen = 0;
	struct dirent *d;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((d = readdir(dir))) {
		char *rp;
		FILE *f;

		if (d->d_name[0] == '.')
			continue;
		snprintf(st, sizeof(st), "%s/%s/stat", path, d->d_name);
		f = fopen(st, "r");
		if (!f)
			continue;
		if (fgets(st, sizeof(st), f) && (rp = strrchr(st, ')')) && rp[2] != 'T')
			stopped = 0;
		fclose(f);
		seen++;
	}
	closedir(dir);
	return stopped && seen;
}

/* SIGSTOP a node and wait until it has stopped (a signal is delivered
 * asynchronously: a running node may still answer a request meanwhile). */
static void stop_node(struct harness_server *s)
{
	assert_int_equal(kill(s->pid, SIGSTOP), 0);
	for (int i = 0; i < 2000 && !all_stopped(s->pid); i++)
		harness_sleep_ms(1);
	assert_true(all_stopped(s->pid));
}

/* The node that holds a block (per-block placement: its own key's owner). */
static int owner(const struct nodes *n, size_t count, const uint8_t *key)
{
	return kvpool_hrw_owner(key, n->name, count);
}

/* The next completion, waiting on the event fd with poll(2) between
 * kvpool_poll calls with timeout 0, as an event loop does. */
static struct kvpool_completion next_done(struct kvpool_client *c, int efd)
{
	struct pollfd p = { .fd = efd, .events = POLLIN };
	struct kvpool_completion comp;
	uint64_t end = harness_now_ms() + 10000;

	while (harness_now_ms() < end) {
		if (kvpool_poll(c, &comp, 1, 0) == 1)
			return comp;
		assert_true(poll(&p, 1, 1000) >= 0);
	}
	fail_msg("no completion within 10 s");
	return comp;
}

/* ---- arguments and refusals ------------------------------------------------------ */

static void test_bad_iovec(void **state)
{
	static uint8_t data[64], back[64];
	struct iovec good = { data, sizeof(data) }, bad = { NULL, 8 }, into = { back, sizeof(back) };
	uint8_t k0[32], k1[32];
	struct kvpool_put_block pb[2] = { { k0, NULL, &good, 1, 0 }, { k1, k0, &bad, 1, 0 } };
	struct kvpool_get_block gb[2] = { { k0, &into, 1, 0 }, { k1, &bad, 1, 0 } };
	struct kvpool_client *cl, *direct;
	struct nodes n;
	uint64_t id = 0, len = 0;
	int st[2] = { 5, 5 };

	(void)state;
	nodes_start(&n, 2, -1);
	harness_key(k0, "bad-iov", 0);
	harness_key(k1, "bad-iov", 1);
	harness_fill(data, sizeof(data), 1);
	assert_int_equal(kvpool_connect(n.list, "bad-iov", NULL, &cl), 0);
	assert_int_equal(kvpool_put(cl, pb, 2, st), -EINVAL);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(st[1], -EINVAL);
	assert_int_equal(kvpool_submit_put(cl, pb, 2, st, 0, &id), -EINVAL);
	st[0] = st[1] = 5;
	assert_int_equal(kvpool_get(cl, gb, 2, st), -EINVAL);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(st[1], -EINVAL);
	assert_int_equal(kvpool_submit_get(cl, gb, 2, st, 0, &id), -EINVAL);
	/* Nothing was sent: no node holds a block. */
	for (int i = 0; i < 2; i++) {
		assert_int_equal(harness_client(&n.s[i], "bad-iov", &direct), 0);
		assert_int_equal(harness_ns_stat_or_fail(direct, "bad-iov", "blocks"), 0);
		kvpool_close(direct);
	}
	/* The handle still works. */
	assert_int_equal(kvpool_put(cl, pb, 1, NULL), 0);
	assert_int_equal(kvpool_get_bytes(cl, k0, back, sizeof(back), &len), 0);
	assert_memory_equal(back, data, sizeof(data));
	kvpool_close(cl);
	nodes_stop(&n, 2);
}

static void test_share_refused(void **state)
{
	static uint8_t data[N_KEYS][256], back[N_KEYS][256];
	uint8_t keys[N_KEYS][32];
	struct kvpool_put_block pb[N_KEYS];
	struct kvpool_get_block gb[N_KEYS];
	struct iovec iov[N_KEYS], giov[N_KEYS];
	struct kvpool_options opts = { .token = TOKEN };
	struct kvpool_client *cl;
	struct nodes n;
	int st[N_KEYS], own[N_KEYS], refused = 0, rc;

	(void)state;
	nodes_start(&n, N_NODES, 1);
	assert_int_equal(kvpool_connect(n.list, "acc-test", &opts, &cl), 0);
	for (int i = 0; i < N_KEYS; i++) {
		harness_key(keys[i], "acc", (uint64_t)i);
		harness_fill(data[i], sizeof(data[i]), (uint64_t)i);
		iov[i] = (struct iovec){ data[i], sizeof(data[i]) };
		giov[i] = (struct iovec){ back[i], sizeof(back[i]) };
		pb[i] = (struct kvpool_put_block){ keys[i], NULL, &iov[i], 1, 0 };
		gb[i] = (struct kvpool_get_block){ keys[i], &giov[i], 1, 0 };
		own[i] = owner(&n, N_NODES, keys[i]);
		refused += own[i] == 1;
	}
	assert_true(refused > 0 && refused < N_KEYS);
	/* The first block's error: some block of node 1's share comes first
	 * or later, either way the call says -EACCES. */
	rc = kvpool_put(cl, pb, N_KEYS, st);
	assert_int_equal(rc, -EACCES);
	for (int i = 0; i < N_KEYS; i++)
		assert_int_equal(st[i], own[i] == 1 ? -EACCES : 0);
	/* the node's words, after the node's name */
	assert_true(strlen(kvpool_last_server_message()) > strlen(n.name[1]) + 2);
	assert_memory_equal(kvpool_last_server_message(), n.name[1], strlen(n.name[1]));
	assert_memory_equal(kvpool_last_server_message() + strlen(n.name[1]), ": ", 2);
	rc = kvpool_get(cl, gb, N_KEYS, st);
	assert_int_equal(rc, -EACCES);
	for (int i = 0; i < N_KEYS; i++) {
		assert_int_equal(st[i], own[i] == 1 ? -EACCES : 0);
		if (own[i] != 1)
			assert_memory_equal(back[i], data[i], sizeof(data[i]));
	}
	assert_int_equal(kvpool_exists(cl, keys, N_KEYS, st), -EACCES);
	for (int i = 0; i < N_KEYS; i++)
		assert_int_equal(st[i], own[i] == 1 ? -EACCES : 0);
	/* STATS: the refusing node answers, so it is "refused" (not down),
	 * with its words, and its failed shares are counted as errors */
	{
		char *json = NULL;
		struct json_object *doc, *cl_o, *nodes, *v;

		assert_int_equal(kvpool_stats(cl, NULL, &json), 0);
		doc = json_tokener_parse(json);
		assert_non_null(doc);
		assert_true(json_object_object_get_ex(doc, "cluster", &cl_o));
		assert_true(json_object_object_get_ex(cl_o, "nodes", &nodes));
		for (size_t i = 0; i < json_object_array_length(nodes); i++) {
			struct json_object *x = json_object_array_get_idx(nodes, i);
			const char *name = json_object_get_string(json_object_object_get(x, "name"));
			int refusing = !strcmp(name, n.name[1]);

			assert_true(json_object_object_get_ex(x, "state", &v));
			assert_string_equal(json_object_get_string(v), refusing ? "refused" : "up");
			assert_true(json_object_object_get_ex(x, "errors", &v));
			if (refusing) {
				assert_true(json_object_get_int64(v) >= 3); /* put, get, exists */
				assert_true(json_object_object_get_ex(x, "error", &v));
				assert_non_null(strstr(json_object_get_string(v), "hello refused"));
			} else {
				assert_int_equal(json_object_get_int64(v), 0);
			}
		}
		json_object_put(doc);
		kvpool_free(json);
	}
	/* kvpool ping names the node that refuses, as refused, and fails */
	if (getenv("KVPOOL_CLI") && access(getenv("KVPOOL_CLI"), X_OK) == 0) {
		/* (no token: that node refuses HELLO, the others answer) */
		char *argv[] = { (char *)getenv("KVPOOL_CLI"), "ping", "--server", n.list,
				 "--namespace", "acc-test", NULL };
		char *out = NULL, line[128];
		int status = -1;

		assert_int_equal(harness_run(argv, 20000, &out, &status), 0);
		assert_int_not_equal(status, 0);
		snprintf(line, sizeof(line), "%s", n.name[1]);
		assert_non_null(strstr(out, line));
		assert_non_null(strstr(out, "REFUSED"));
		assert_null(strstr(out, "DOWN"));
		free(out);
	}
	kvpool_close(cl);
	nodes_stop(&n, N_NODES);
}

/* ---- asynchronous calls on three nodes --------------------------------------------- */

struct world {
	struct nodes n;
	struct kvpool_client *cl;
	int efd;
	uint8_t keys[N_KEYS][32];
	uint8_t data[N_KEYS][BYTES];
	uint8_t back[N_KEYS][BYTES];
	struct iovec giov[N_KEYS];
	struct kvpool_get_block gb[N_KEYS];
	int st[N_KEYS];
	int own[N_KEYS];
	/* per node: its keys' indices */
	int idx[N_NODES][N_KEYS];
	int cnt[N_NODES];
};

static void world_open(struct world *w)
{
	struct kvpool_put_block pb[N_KEYS];
	struct iovec iov[N_KEYS];

	memset(w, 0, sizeof(*w));
	nodes_start(&w->n, N_NODES, -1);
	assert_int_equal(kvpool_connect(w->n.list, "cl-async", NULL, &w->cl), 0);
	w->efd = kvpool_event_fd(w->cl);
	assert_true(w->efd >= 0);
	for (int i = 0; i < N_KEYS; i++) {
		harness_key(w->keys[i], "cl-async", (uint64_t)i);
		harness_fill(w->data[i], BYTES, (uint64_t)i + 100);
		iov[i] = (struct iovec){ w->data[i], BYTES };
		pb[i] = (struct kvpool_put_block){ w->keys[i], NULL, &iov[i], 1, 0 };
		w->own[i] = owner(&w->n, N_NODES, w->keys[i]);
		w->idx[w->own[i]][w->cnt[w->own[i]]++] = i;
	}
	for (int j = 0; j < N_NODES; j++)
		assert_true(w->cnt[j] > 0);
	assert_int_equal(kvpool_put(w->cl, pb, N_KEYS, NULL), 0);
}

/* Blocks of node j into gb[j's first .. ], one request. */
static uint64_t submit_node_get(struct world *w, int j, uint64_t tag, uint8_t fill)
{
	struct kvpool_get_block *g = &w->gb[w->idx[j][0]];
	uint64_t id = 0;

	/* node j's blocks, contiguous in a scratch array of its own */
	static struct kvpool_get_block by[N_NODES][N_KEYS];
	static int stn[N_NODES][N_KEYS];

	(void)g;
	for (int k = 0; k < w->cnt[j]; k++) {
		int i = w->idx[j][k];

		memset(w->back[i], fill, BYTES);
		w->giov[i] = (struct iovec){ w->back[i], BYTES };
		by[j][k] = (struct kvpool_get_block){ w->keys[i], &w->giov[i], 1, 0 };
	}
	assert_int_equal(kvpool_submit_get(w->cl, by[j], (size_t)w->cnt[j], stn[j], tag, &id), 0);
	return id;
}

static void check_node_bytes(struct world *w, int j)
{
	for (int k = 0; k < w->cnt[j]; k++) {
		int i = w->idx[j][k];

		assert_memory_equal(w->back[i], w->data[i], BYTES);
	}
}

static void test_async_three_nodes(void **state)
{
	static struct world w;
	struct kvpool_completion c;
	uint64_t id[3];

	(void)state;
	world_open(&w);
	/* In order: one GET per node, all three complete right. */
	for (int j = 0; j < N_NODES; j++)
		id[j] = submit_node_get(&w, j, (uint64_t)j, 0);
	assert_int_equal(kvpool_inflight(w.cl), N_NODES);
	for (int j = 0; j < N_NODES; j++) {
		c = next_done(w.cl, w.efd);
		assert_int_equal(c.status, 0);
		assert_true(c.id == id[c.tag]);
	}
	for (int j = 0; j < N_NODES; j++)
		check_node_bytes(&w, j);
	assert_int_equal(kvpool_inflight(w.cl), 0);
	/* Out of order: node 0 stopped, its request finishes after node 1's. */
	stop_node(&w.n.s[0]);
	id[0] = submit_node_get(&w, 0, 10, 0);
	id[1] = submit_node_get(&w, 1, 11, 0);
	c = next_done(w.cl, w.efd);
	assert_int_equal(c.id, id[1]);
	assert_int_equal(c.status, 0);
	check_node_bytes(&w, 1);
	assert_int_equal(kvpool_poll(w.cl, &c, 1, 100), 0); /* node 0's is still out */
	assert_int_equal(kill(w.n.s[0].pid, SIGCONT), 0);
	c = next_done(w.cl, w.efd);
	assert_int_equal(c.id, id[0]);
	assert_int_equal(c.status, 0);
	check_node_bytes(&w, 0);
	/* Cancel: node 0 stopped; its GET is cancelled, its buffers are never
	 * written, even after the node answers. */
	stop_node(&w.n.s[0]);
	id[0] = submit_node_get(&w, 0, 20, 0xa5);
	harness_sleep_ms(50);
	assert_int_equal(kvpool_cancel(w.cl, id[0]), 0);
	assert_int_equal(kvpool_cancel(w.cl, id[0]), -ENOENT);
	c = next_done(w.cl, w.efd);
	assert_int_equal(c.id, id[0]);
	assert_int_equal(c.status, -ECANCELED);
	assert_int_equal(kill(w.n.s[0].pid, SIGCONT), 0);
	harness_sleep_ms(300);
	for (int k = 0; k < w.cnt[0]; k++)
		for (int b = 0; b < BYTES; b++)
			assert_int_equal(w.back[w.idx[0][k]][b], 0xa5);
	id[0] = submit_node_get(&w, 0, 21, 0);
	c = next_done(w.cl, w.efd);
	assert_int_equal(c.status, 0);
	check_node_bytes(&w, 0);
	/* A node killed with requests in flight: its GET share is a miss, its
	 * PUT share dropped, the other node's request is whole; nothing hangs. */
	{
		uint8_t nk[8][32], nd[8][64];
		struct kvpool_put_block pb[8];
		struct iovec piov[8];
		int pst[8], np = 0, stn[N_KEYS];
		uint64_t pid, t0;
		struct kvpool_get_block g[N_KEYS];

		for (uint64_t i = 0; np < 8 && i < 1000; i++) {
			harness_key(nk[np], "to-kill", i);
			if (owner(&w.n, N_NODES, nk[np]) != 2)
				continue;
			piov[np] = (struct iovec){ nd[np], sizeof(nd[np]) };
			pb[np] = (struct kvpool_put_block){ nk[np], NULL, &piov[np], 1, 0 };
			np++;
		}
		assert_int_equal(np, 8);
		for (int k = 0; k < w.cnt[2]; k++) {
			int i = w.idx[2][k];

			w.giov[i] = (struct iovec){ w.back[i], BYTES };
			g[k] = (struct kvpool_get_block){ w.keys[i], &w.giov[i], 1, 0 };
		}
		stop_node(&w.n.s[2]);
		assert_int_equal(kvpool_submit_get(w.cl, g, (size_t)w.cnt[2], stn, 30, &id[2]), 0);
		assert_int_equal(kvpool_submit_put(w.cl, pb, 8, pst, 31, &pid), 0);
		id[1] = submit_node_get(&w, 1, 32, 0);
		harness_sleep_ms(50);
		t0 = harness_now_ms();
		harness_kill(&w.n.s[2]);
		for (int k = 0; k < 3; k++) {
			c = next_done(w.cl, w.efd);
			if (c.tag == 30) {
				assert_int_equal(c.status, -ENOENT);
				for (int q = 0; q < w.cnt[2]; q++)
					assert_int_equal(stn[q], -ENOENT);
			} else if (c.tag == 31) {
				assert_int_equal(c.status, 0);
				for (int q = 0; q < 8; q++)
					assert_int_equal(pst[q], 0);
			} else {
				assert_int_equal(c.tag, 32);
				assert_int_equal(c.status, 0);
				check_node_bytes(&w, 1);
			}
		}
		assert_true(harness_now_ms() - t0 < 5000);
	}
	kvpool_close(w.cl);
	nodes_stop(&w.n, 2);
}

/* kvpool_close with requests in flight on a stopped node drops them at
 * once (no completion, no wait for the node's timeout); the node's
 * buffers are never written afterwards (ASan and valgrind see the rest). */
/* Cancel on a cluster handle touches only the cancelled request. Rounds of
 * 64 one-block GETs spread over the three nodes, every third cancelled
 * right after the submits (while node threads are still handing them to
 * their engines): every other request completes with its bytes, each id
 * exactly once, and the handle ends with nothing in flight. (A cancel that
 * waited for a child being submitted completed its parent a second time if
 * the node finished the child meanwhile: the parent was queued twice, the
 * completion queue lost the others' completions for good, and the event
 * fd stayed readable while kvpool_poll found nothing.) */
#define C_KEYS 64
#define C_ROUNDS 150
static void test_cancel_others_complete(void **state)
{
	static uint8_t keys[C_KEYS][32], data[C_KEYS][BYTES], back[C_KEYS][BYTES];
	struct iovec piov[C_KEYS], giov[C_KEYS];
	struct kvpool_put_block pb[C_KEYS];
	struct kvpool_get_block gb[C_KEYS];
	int st[C_KEYS], per_node[N_NODES] = { 0 };
	struct nodes n;

	(void)state;
	nodes_start(&n, N_NODES, -1);
	for (int i = 0; i < C_KEYS; i++) {
		harness_key(keys[i], "cl-cancel", (uint64_t)i);
		harness_fill(data[i], BYTES, (uint64_t)i + 7);
		piov[i] = (struct iovec){ data[i], BYTES };
		pb[i] = (struct kvpool_put_block){ keys[i], NULL, &piov[i], 1, 0 };
		per_node[owner(&n, N_NODES, keys[i])]++;
	}
	for (int j = 0; j < N_NODES; j++)
		assert_true(per_node[j] > 0);
	for (int r = 0; r < C_ROUNDS; r++) {
		struct kvpool_client *c;
		uint64_t ids[C_KEYS], end;
		int seen[C_KEYS] = { 0 }, got = 0, efd;

		/* a fresh handle each round: its node threads connect and submit
		 * while the cancels come */
		assert_int_equal(kvpool_connect(n.list, "cl-cancel", NULL, &c), 0);
		efd = kvpool_event_fd(c);
		assert_true(efd >= 0);
		if (r == 0)
			assert_int_equal(kvpool_put(c, pb, C_KEYS, NULL), 0);
		for (int i = 0; i < C_KEYS; i++) {
			memset(back[i], 0, BYTES);
			giov[i] = (struct iovec){ back[i], BYTES };
			gb[i] = (struct kvpool_get_block){ keys[i], &giov[i], 1, 0 };
			assert_int_equal(kvpool_submit_get(c, &gb[i], 1, &st[i], (uint64_t)i, &ids[i]),
					 0);
		}
		for (int i = 0; i < C_KEYS; i += 3) {
			int rc = kvpool_cancel(c, ids[i]);

			/* -ENOENT: it had completed already */
			assert_true(rc == 0 || rc == -ENOENT);
		}
		end = harness_now_ms() + 15000; /* past the handle's 10 s timeout */
		while (got < C_KEYS && harness_now_ms() < end) {
			struct pollfd p = { .fd = efd, .events = POLLIN };
			struct kvpool_completion cp[C_KEYS];
			int k;

			assert_true(poll(&p, 1, 1000) >= 0);
			k = kvpool_poll(c, cp, C_KEYS, 0);
			assert_true(k >= 0);
			for (int x = 0; x < k; x++) {
				int i = (int)cp[x].tag;

				assert_true(i >= 0 && i < C_KEYS);
				assert_int_equal(cp[x].id, ids[i]);
				if (seen[i]++)
					fail_msg("round %d: request %d completed twice", r, i);
				if (i % 3 && cp[x].status != 0)
					fail_msg("round %d: request %d (not cancelled): status %d", r,
						 i, cp[x].status);
				if (i % 3 == 0)
					assert_true(cp[x].status == -ECANCELED || cp[x].status == 0);
				if (cp[x].status == 0)
					assert_memory_equal(back[i], data[i], BYTES);
			}
			got += k;
		}
		if (got < C_KEYS)
			fail_msg("round %d: %d of %d completions after 15 s, %u in flight", r, got,
				 C_KEYS, kvpool_inflight(c));
		assert_int_equal(kvpool_inflight(c), 0);
		kvpool_close(c);
	}
	nodes_stop(&n, N_NODES);
}

static void test_close_in_flight(void **state)
{
	static struct world w;
	uint64_t t0;

	(void)state;
	world_open(&w);
	stop_node(&w.n.s[0]);
	submit_node_get(&w, 0, 1, 0xa5);
	submit_node_get(&w, 1, 2, 0);
	t0 = harness_now_ms();
	kvpool_close(w.cl);
	assert_true(harness_now_ms() - t0 < 2000);
	assert_int_equal(kill(w.n.s[0].pid, SIGCONT), 0);
	harness_sleep_ms(200);
	for (int k = 0; k < w.cnt[0]; k++)
		for (int b = 0; b < BYTES; b++)
			assert_int_equal(w.back[w.idx[0][k]][b], 0xa5);
	nodes_stop(&w.n, N_NODES);
}

/* Whole-pool calls while asynchronous requests are in flight: they run
 * beside them (they answered -EBUSY on one node), and the requests
 * complete as usual. */
static void test_admin_while_async(void **state)
{
	static struct world w;
	struct kvpool_completion c;
	uint64_t rtt = 0, dropped = 7;
	char *json = NULL;

	(void)state;
	world_open(&w);
	for (int j = 0; j < N_NODES; j++)
		submit_node_get(&w, j, (uint64_t)j, 0);
	assert_int_equal(kvpool_inflight(w.cl), N_NODES);
	assert_int_equal(kvpool_stats(w.cl, NULL, &json), 0);
	assert_non_null(strstr(json, "\"cluster\""));
	kvpool_free(json);
	assert_int_equal(kvpool_ping(w.cl, &rtt), 0);
	assert_true(rtt > 0);
	assert_int_equal(kvpool_drop_namespace(w.cl, "cl-async-other", &dropped), 0);
	assert_int_equal(dropped, 0);
	for (int j = 0; j < N_NODES; j++) {
		c = next_done(w.cl, w.efd);
		assert_int_equal(c.status, 0);
	}
	for (int j = 0; j < N_NODES; j++)
		check_node_bytes(&w, j);
	kvpool_close(w.cl);
	nodes_stop(&w.n, N_NODES);
}

/* kvpool_register on a cluster handle: the region reaches every node's
 * connection (on TCP that is bookkeeping, so what is checked is the
 * handle's own table and that calls through registered memory work on
 * every node; test_client_rdma.c checks the zero copy over RDMA). */
static void test_register(void **state)
{
	static struct world w;
	static uint8_t arena[N_KEYS * BYTES];

	(void)state;
	world_open(&w);
	assert_int_equal(kvpool_register(w.cl, arena, sizeof(arena)), 0);
	assert_int_equal(kvpool_register(w.cl, arena + 10, 10), -EEXIST);
	assert_int_equal(kvpool_register(w.cl, NULL, 10), -EINVAL);
	for (int i = 0; i < N_KEYS; i++) {
		w.giov[i] = (struct iovec){ arena + (size_t)i * BYTES, BYTES };
		w.gb[i] = (struct kvpool_get_block){ w.keys[i], &w.giov[i], 1, 0 };
	}
	assert_int_equal(kvpool_get(w.cl, w.gb, N_KEYS, w.st), 0);
	for (int i = 0; i < N_KEYS; i++)
		assert_memory_equal(arena + (size_t)i * BYTES, w.data[i], BYTES);
	assert_int_equal(kvpool_unregister(w.cl, arena + 1), -ENOENT);
	assert_int_equal(kvpool_unregister(w.cl, arena), 0);
	assert_int_equal(kvpool_unregister(w.cl, arena), -ENOENT);
	kvpool_close(w.cl);
	nodes_stop(&w.n, N_NODES);
}

/* ---- threads --------------------------------------------------------------------- */

#define T_ROUNDS 60
#define T_SYNC 2
#define T_ASYNC 2

struct tjob {
	struct world *w;
	int id;
	int bad;
	uint8_t back[T_ROUNDS][BYTES];
	struct iovec iov[T_ROUNDS];
	struct kvpool_get_block gb[T_ROUNDS];
	int st[T_ROUNDS];
	int key[T_ROUNDS];
};

static struct tjob jobs[T_SYNC + T_ASYNC];
static int t_polled, t_bad;

/* Blocking calls in a loop: PUT a chain of its own, MATCH it, GET it. */
static void *sync_worker(void *arg)
{
	struct tjob *t = arg;
	uint8_t keys[4][32], data[4][512], back[4][512];
	struct iovec iov[4], giov[4];
	struct kvpool_put_block pb[4];
	struct kvpool_get_block gb[4];
	int st[4];

	for (int r = 0; r < T_ROUNDS; r++) {
		size_t m = 0;

		for (int i = 0; i < 4; i++) {
			harness_key(keys[i], "tsync", (uint64_t)(t->id * 100000 + r * 10 + i));
			harness_fill(data[i], sizeof(data[i]), (uint64_t)(r * 4 + i));
			iov[i] = (struct iovec){ data[i], sizeof(data[i]) };
			giov[i] = (struct iovec){ back[i], sizeof(back[i]) };
			pb[i] = (struct kvpool_put_block){ keys[i], i ? keys[i - 1] : NULL, &iov[i], 1, 0 };
			gb[i] = (struct kvpool_get_block){ keys[i], &giov[i], 1, 0 };
		}
		if (kvpool_put(t->w->cl, pb, 4, st) || kvpool_match(t->w->cl, keys, 4, 0, &m) ||
		    m != 4 || kvpool_get(t->w->cl, gb, 4, st) || memcmp(back, data, sizeof(back)))
			t->bad++;
	}
	return NULL;
}

/* Asynchronous GETs of the world's blocks; the poller checks them. */
static void *submitter(void *arg)
{
	struct tjob *t = arg;

	for (int r = 0; r < T_ROUNDS; r++) {
		uint64_t id;
		int rc;

		t->key[r] = (t->id * 7 + r) % N_KEYS;
		t->iov[r] = (struct iovec){ t->back[r], BYTES };
		t->gb[r] = (struct kvpool_get_block){ t->w->keys[t->key[r]], &t->iov[r], 1, 0 };
		while ((rc = kvpool_submit_get(t->w->cl, &t->gb[r], 1, &t->st[r],
					       (uint64_t)t->id << 32 | (uint64_t)r, &id)) == -EAGAIN)
			harness_sleep_ms(1);
		if (rc)
			t->bad++;
	}
	return NULL;
}

static void *poller(void *arg)
{
	struct world *w = arg;
	uint64_t end = harness_now_ms() + 60000;

	while (t_polled < T_ASYNC * T_ROUNDS && harness_now_ms() < end) {
		struct kvpool_completion c[8];
		int n = kvpool_poll(w->cl, c, 8, 10);

		for (int k = 0; k < n; k++) {
			struct tjob *t = &jobs[c[k].tag >> 32];
			int r = (int)(c[k].tag & 0xffffffff);

			if (c[k].status || t->st[r] ||
			    memcmp(t->back[r], w->data[t->key[r]], BYTES))
				t_bad++;
		}
		t_polled += n > 0 ? n : 0;
	}
	return NULL;
}

/* Two threads making blocking calls, two submitting, one polling: one
 * cluster handle, no wrong byte, no failed call (and no race under
 * ThreadSanitizer). */
static void test_threads(void **state)
{
	static struct world w;
	pthread_t th[T_SYNC + T_ASYNC + 1];

	(void)state;
	world_open(&w);
	for (int i = 0; i < T_SYNC + T_ASYNC; i++) {
		jobs[i].w = &w;
		jobs[i].id = i;
		assert_int_equal(pthread_create(&th[i], NULL, i < T_SYNC ? sync_worker : submitter,
						&jobs[i]), 0);
	}
	assert_int_equal(pthread_create(&th[T_SYNC + T_ASYNC], NULL, poller, &w), 0);
	for (int i = 0; i <= T_SYNC + T_ASYNC; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < T_SYNC + T_ASYNC; i++)
		assert_int_equal(jobs[i].bad, 0);
	assert_int_equal(t_polled, T_ASYNC * T_ROUNDS);
	assert_int_equal(t_bad, 0);
	kvpool_close(w.cl);
	nodes_stop(&w.n, N_NODES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_iovec),
		cmocka_unit_test(test_share_refused),
		cmocka_unit_test(test_async_three_nodes),
		cmocka_unit_test(test_cancel_others_complete),
		cmocka_unit_test(test_close_in_flight),
		cmocka_unit_test(test_admin_while_async),
		cmocka_unit_test(test_register),
		cmocka_unit_test(test_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
