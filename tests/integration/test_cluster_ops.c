/*
 * test_cluster_ops.c - what a fresh-clone test found when it tried to
 * break the cluster client (issue 27, items 5 and 6), each against real
 * kvpoold processes (and Debian's etcd) on loopback:
 *
 *  - a busy client uses a node again once it is back (it used to push the
 *    retry back on every call and dropped PUT shares as stored)
 *  - a PUT whose owner is down goes to the next node by score (counted);
 *    a share that reaches no node says so, never "stored"
 *  - DROP_NAMESPACE and DELETE that did not reach a node say so, and the
 *    handle finishes them when the node is back
 *  - ping and health report per node and fail when one is unreachable
 *  - etcd://HOST/typo (no node registered) is an error at connect, after a
 *    short grace; an empty membership later is an error in the stats
 *  - more than 64 nodes in a list is refused loudly; more than 64
 *    registered in etcd: the first 64 by name are used, the rest named
 *  - STATS on a cluster does not sum pid, protocol, uptime
 *  - a node list with mixed schemes, or one node twice (even spelled
 *    differently), is refused
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

#include "etcd.h"
#include "etcd_proc.h"
#include "harness.h"

#define BB 512

/* argv prefix: run the rest with its stderr into the captured stdout */
#define WITH_STDERR (char *)"/bin/sh", (char *)"-c", (char *)"exec \"$0\" \"$@\" 2>&1"

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

struct nodes {
	struct harness_server s[3];
	char list[256];
	char names[3][32];
	const char *name[3];
};

static void nodes_start(struct nodes *n)
{
	size_t len = 0;

	memset(n, 0, sizeof(*n));
	for (size_t i = 0; i < 3; i++) {
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
	for (size_t i = 0; i < 3; i++)
		if (n->s[i].pid)
			harness_kill(&n->s[i]);
}

static int owner_of(const struct nodes *n, const uint8_t *key)
{
	return kvpool_hrw_owner(key, n->name, 3);
}

/* count keys tagged `tag` whose owner is node `which`, into keys[]. */
static size_t keys_owned_by(const struct nodes *n, int which, const char *tag, size_t want,
			    uint8_t (*keys)[32])
{
	size_t got = 0;

	for (uint64_t i = 0; got < want; i++) {
		harness_key(keys[got], tag, i);
		if (owner_of(n, keys[got]) == which)
			got++;
	}
	return got;
}

static int put_keys(struct kvpool_client *cl, uint8_t (*keys)[32], size_t n, int *st)
{
	struct kvpool_put_block pb[64];
	struct iovec iov[64];
	static uint8_t buf[64][BB];

	assert_true(n <= 64);
	for (size_t i = 0; i < n; i++) {
		harness_fill(buf[i], BB, harness_key_seed(keys[i]));
		iov[i] = (struct iovec){ buf[i], BB };
		pb[i] = (struct kvpool_put_block){ .key = keys[i], .iov = &iov[i], .iovcnt = 1 };
	}
	return kvpool_put(cl, pb, n, st);
}

static size_t present(const struct harness_server *s, const char *ns, uint8_t (*keys)[32],
		      size_t n)
{
	struct kvpool_client *c;
	int st[64];
	size_t k = 0;

	assert_int_equal(harness_client(s, ns, &c), 0);
	assert_int_equal(kvpool_exists(c, keys, n, st), 0);
	for (size_t i = 0; i < n; i++)
		k += st[i] == 0;
	kvpool_close(c);
	return k;
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

/* ---- tests ---------------------------------------------------------------------- */

/* A node killed and started again on its port: a client that calls every
 * few milliseconds uses it again within the back-off (the retry used to
 * move a second later on every call, for good). */
static void test_busy_client_retries(void **state)
{
	struct nodes n;
	struct kvpool_client *cl;
	uint8_t keys[16][32];
	int st[16], victim = 1;
	uint64_t t0, back_ms = 0, i = 0;
	uint16_t port;

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: its time bounds do not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "busy", NULL, &cl), 0);
	keys_owned_by(&n, victim, "busy", 16, keys);
	port = n.s[victim].port;
	harness_kill(&n.s[victim]);
	/* PUTs while it is down go to the next node: stored, not dropped */
	assert_int_equal(put_keys(cl, keys, 16, st), 0);
	assert_int_equal(put_keys(cl, keys, 16, st), 0);
	for (int k = 0; k < 16; k++)
		assert_int_equal(st[k], 0);
	assert_true(cl_counter(cl, "redirected_puts") >= 16);
	assert_int_equal(harness_start_on_port(&n.s[victim], port, node_flags), 0);
	/* busy: a PUT every few milliseconds, each of a key the restarted node
	 * owns, until one lands there */
	t0 = now_ms();
	while (now_ms() - t0 < 15000) {
		uint8_t k[1][32];

		for (;;) {
			harness_key(k[0], "busy-probe", i++);
			if (owner_of(&n, k[0]) == victim)
				break;
		}
		put_keys(cl, k, 1, st);
		if (present(&n.s[victim], "busy", k, 1) == 1) {
			back_ms = now_ms() - t0;
			break;
		}
		sleep_ms(5);
	}
	printf("a busy client used the restarted node again after %" PRIu64 " ms\n", back_ms);
	assert_true(back_ms > 0 && back_ms < 6000);
	kvpool_close(cl);
	nodes_stop(&n);
}

/* Every node that could hold a block is down: its status says so. */
static void test_put_nowhere_is_not_stored(void **state)
{
	struct nodes n;
	struct kvpool_client *cl;
	uint8_t keys[4][32];
	int st[4];

	(void)state;
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "nowhere", NULL, &cl), 0);
	for (int i = 0; i < 3; i++)
		harness_kill(&n.s[i]);
	for (int i = 0; i < 4; i++)
		harness_key(keys[i], "nowhere", (uint64_t)i);
	assert_int_equal(put_keys(cl, keys, 4, st), -EHOSTDOWN);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], -EHOSTDOWN);
	kvpool_close(cl);
	nodes_stop(&n);
}

static void test_drop_and_delete_unreached(void **state)
{
	struct nodes n;
	struct kvpool_client *cl;
	uint8_t keys[8][32], other[8][32];
	int st[8], victim = 2;
	uint64_t blocks = 0, t0;
	uint16_t port;

	(void)state;
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "drop", NULL, &cl), 0);
	keys_owned_by(&n, victim, "drop", 8, keys);
	keys_owned_by(&n, 0, "keep", 8, other);
	assert_int_equal(put_keys(cl, keys, 8, st), 0);
	assert_int_equal(put_keys(cl, other, 8, st), 0);
	assert_int_equal(present(&n.s[victim], "drop", keys, 8), 8);
	/* the node is stopped, not killed: it keeps its blocks */
	assert_int_equal(kill(n.s[victim].pid, SIGSTOP), 0);
	assert_int_equal(kvpool_delete(cl, keys, 4, st), -EINPROGRESS);
	for (int i = 0; i < 4; i++)
		assert_int_equal(st[i], -EINPROGRESS);
	assert_int_equal(kvpool_drop_namespace(cl, "drop", &blocks), -EINPROGRESS);
	assert_true(cl_counter(cl, "pending_removals") >= 2);
	port = n.s[victim].port;
	(void)port;
	assert_int_equal(kill(n.s[victim].pid, SIGCONT), 0);
	/* the handle finishes both when the node answers again */
	t0 = now_ms();
	while (cl_counter(cl, "pending_removals") > 0 && now_ms() - t0 < 10000) {
		uint8_t k[1][32];

		harness_key(k[0], "drop-probe", now_ms());
		put_keys(cl, k, 1, st);
		sleep_ms(50);
	}
	assert_int_equal(cl_counter(cl, "pending_removals"), 0);
	assert_int_equal(present(&n.s[victim], "drop", keys, 8), 0);
	assert_int_equal(present(&n.s[0], "drop", other, 8), 0); /* the reachable ones at once */
	kvpool_close(cl);
	nodes_stop(&n);
}

/* The CLI's drop-namespace and stats on a cluster with a node down:
 * non-zero exit, naming it. */
static void test_cli_drop_unreached(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	struct nodes n;
	char *out = NULL;
	int status = -1;

	(void)state;
	if (!cli)
		harness_skip("KVPOOL_CLI is not set");
	nodes_start(&n);
	harness_kill(&n.s[1]);
	{
		char *argv[] = { (char *)cli, "drop-namespace", "--server", n.list, "x", NULL };

		assert_int_equal(harness_run(argv, 30000, &out, &status), 0);
		printf("drop-namespace with a node down: exit %d, said: %s", status, out);
		assert_true(status != 0);
		free(out);
	}
	{
		/* stats (without --cluster) sums the answering nodes: it says
		 * which did not, and fails */
		char *argv[] = { WITH_STDERR, (char *)cli, "stats", "--server", n.list, NULL };

		assert_int_equal(harness_run(argv, 30000, &out, &status), 0);
		printf("stats with a node down: exit %d\n", status);
		assert_true(status != 0);
		assert_non_null(strstr(out, n.names[1]));
		free(out);
	}
	nodes_stop(&n);
}

/* A node that is frozen (SIGSTOP) when a NEW handle connects: the
 * connect, and each call after it, come back within the budget (not the
 * call timeout, 10 s), with the node down; a DELETE or DROP_NAMESPACE
 * that did not reach it is pending (-EINPROGRESS), never plain success or
 * "not found"; the CLI's get of a block it owns names it. */
static void test_new_handle_frozen_node(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	struct nodes n;
	struct kvpool_client *w, *cl;
	uint8_t keys[4][32];
	int st[4], victim = 1;
	uint64_t blocks = 0, t0, dt;

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: its time bounds do not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "fz", NULL, &w), 0);
	keys_owned_by(&n, victim, "fz", 4, keys);
	assert_int_equal(put_keys(w, keys, 4, st), 0);
	kvpool_close(w);
	assert_int_equal(kill(n.s[victim].pid, SIGSTOP), 0);
	sleep_ms(50);
	t0 = now_ms();
	assert_int_equal(kvpool_connect(n.list, "fz", NULL, &cl), 0);
	dt = now_ms() - t0;
	printf("connect with a frozen node: %" PRIu64 " ms\n", dt);
	assert_true(dt < 2500);
	t0 = now_ms();
	assert_int_equal(kvpool_delete(cl, keys, 2, st), -EINPROGRESS);
	assert_int_equal(st[0], -EINPROGRESS);
	assert_int_equal(kvpool_drop_namespace(cl, "fz", &blocks), -EINPROGRESS);
	dt = now_ms() - t0;
	printf("delete + drop with a frozen node: %" PRIu64 " ms\n", dt);
	assert_true(dt < 2500);
	kvpool_close(cl);
	if (cli) {
		char key[80], *out = NULL;
		int status = -1;
		char *get[] = { WITH_STDERR, (char *)cli, "get", "--server", n.list, "--namespace", "fz",
				key, "-o", "/dev/null", NULL };
		char *drop[] = { WITH_STDERR, (char *)cli, "drop-namespace", "--server", n.list,
				 "fz", NULL };

		for (int i = 0; i < 32; i++)
			snprintf(key + 2 * i, 3, "%02x", keys[3][i]);
		t0 = now_ms();
		assert_int_equal(harness_run(get, 30000, &out, &status), 0);
		printf("kvpool get, owner frozen (exit %d, %" PRIu64 " ms): %s", status,
		       now_ms() - t0, out);
		assert_true(status != 0);
		assert_non_null(strstr(out, n.names[victim]));
		assert_true(now_ms() - t0 < 5000);
		free(out);
		assert_int_equal(harness_run(drop, 30000, &out, &status), 0);
		printf("kvpool drop-namespace, a node frozen (exit %d): %s", status, out);
		assert_true(status != 0);
		assert_non_null(strstr(out, n.names[victim]));
		free(out);
	}
	assert_int_equal(kill(n.s[victim].pid, SIGCONT), 0);
	nodes_stop(&n);
}

static void test_ping_and_health_per_node(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	struct nodes n;
	struct kvpool_client *cl;
	uint64_t rtt = 0, t0;
	char *out = NULL;
	int status = -1;

	(void)state;
	if (harness_valgrind()) {
		printf("not under valgrind: its time bounds do not hold at valgrind's pace\n");
		return;
	}
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "ping", NULL, &cl), 0);
	assert_int_equal(kvpool_ping(cl, &rtt), 0);
	assert_int_equal(kill(n.s[2].pid, SIGSTOP), 0); /* frozen */
	t0 = now_ms();
	assert_int_equal(kvpool_ping(cl, &rtt), -EHOSTDOWN);
	assert_true(now_ms() - t0 < 3000);
	if (cli) {
		char *ping[] = { (char *)cli, "ping", "--server", n.list, NULL };
		char *health[] = { (char *)cli, "health", "--server", n.list, NULL };

		assert_int_equal(harness_run(ping, 30000, &out, &status), 0);
		printf("kvpool ping, one node frozen (exit %d):\n%s", status, out);
		assert_true(status != 0);
		assert_non_null(strstr(out, n.names[2]));
		free(out);
		assert_int_equal(harness_run(health, 30000, &out, &status), 0);
		printf("kvpool health (exit %d):\n%s", status, out);
		assert_true(status != 0);
		assert_non_null(strstr(out, "unhealthy"));
		assert_non_null(strstr(out, n.names[2]));
		free(out);
	}
	assert_int_equal(kill(n.s[2].pid, SIGCONT), 0);
	harness_kill(&n.s[0]); /* dead */
	assert_int_equal(kvpool_ping(cl, &rtt), -EHOSTDOWN);
	kvpool_close(cl);
	nodes_stop(&n);
}

static void test_etcd_empty_membership(void **state)
{
	struct etcd_proc e = { 0 };
	struct kvpool_client *cl = NULL;
	char url[96];
	uint64_t t0;

	(void)state;
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(etcd_proc_start(&e), 0);
	snprintf(url, sizeof(url), "etcd://%s/typo", e.endpoint);
	t0 = now_ms();
	assert_int_equal(kvpool_connect(url, "x", NULL, &cl), -ENXIO);
	printf("etcd://.../typo refused after %" PRIu64 " ms\n", now_ms() - t0);
	assert_true(now_ms() - t0 < 5000);
	assert_null(cl);
	etcd_proc_destroy(&e);
}

static void test_node_limit(void **state)
{
	char list[8192];
	size_t len = 0;
	struct kvpool_client *cl = NULL;

	(void)state;
	for (int i = 0; i < 65; i++)
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s127.0.0.1:%d",
					i ? "," : "tcp://", 20000 + i);
	assert_int_equal(kvpool_connect(list, "x", NULL, &cl), -E2BIG);
	assert_null(cl);
	/* and through etcd: 65 registered nodes refuse the connect too */
	if (etcd_proc_available()) {
		struct etcd_proc e = { 0 };
		struct kvc_etcd *k;
		char url[96];

		assert_int_equal(etcd_proc_start(&e), 0);
		assert_int_equal(kvc_etcd_open(e.endpoint, 2000, &k), 0);
		for (int i = 0; i < 65; i++) {
			char key[64], val[128];

			snprintf(key, sizeof(key), "kvpool/big/nodes/b%d", i);
			snprintf(val, sizeof(val), "{\"name\":\"b%d\",\"address\":\"127.0.0.1\","
				 "\"port\":%d}", i, 20000 + i);
			assert_int_equal(kvc_etcd_put(k, key, val, strlen(val), 0), 0);
		}
		kvc_etcd_close(k);
		snprintf(url, sizeof(url), "etcd://%s/big", e.endpoint);
		/* not refused (that locked every new client out): the first 64
		 * by name are used, and the stats name the one left out (b9 is
		 * last in byte order) */
		assert_int_equal(kvpool_connect(url, "x", NULL, &cl), 0);
		assert_int_equal(cl_counter(cl, "ignored_nodes"), 1);
		{
			struct json_object *doc, *c = cluster_obj(cl, &doc), *v;

			assert_true(json_object_object_get_ex(c, "error", &v));
			printf("65 registered: %s\n", json_object_get_string(v));
			assert_non_null(strstr(json_object_get_string(v), "b9"));
			json_object_put(doc);
		}
		kvpool_close(cl);
		etcd_proc_destroy(&e);
	}
}

static void test_stats_not_summed(void **state)
{
	struct nodes n;
	struct kvpool_client *cl, *one;
	struct json_object *doc, *v;

	(void)state;
	nodes_start(&n);
	assert_int_equal(kvpool_connect(n.list, "st", NULL, &cl), 0);
	assert_int_equal(harness_client(&n.s[0], "st", &one), 0);
	assert_int_equal(harness_stats(cl, NULL, &doc), 0);
	/* counters add up; identity and time do not */
	assert_false(json_object_object_get_ex(doc, "pid", &v));
	assert_false(json_object_object_get_ex(doc, "uptime_s", &v));
	assert_true(json_object_object_get_ex(doc, "protocol", &v));
	assert_int_equal(json_object_get_int64(v), (int64_t)harness_stat_or_fail(one, "protocol"));
	json_object_put(doc);
	kvpool_close(one);
	kvpool_close(cl);
	nodes_stop(&n);
}

static void test_url_refusals(void **state)
{
	struct nodes n;
	struct kvpool_client *cl = NULL;
	char url[256];

	(void)state;
	nodes_start(&n);
	snprintf(url, sizeof(url), "tcp://%s,rdma://%s", n.names[0], n.names[1]);
	assert_int_equal(kvpool_connect(url, "u", NULL, &cl), -EINVAL);
	snprintf(url, sizeof(url), "tcp://%s,%s,%s", n.names[0], n.names[1], n.names[0]);
	assert_int_equal(kvpool_connect(url, "u", NULL, &cl), -EINVAL);
	/* one node under two spellings */
	snprintf(url, sizeof(url), "tcp://%s,localhost:%u", n.names[0], n.s[0].port);
	assert_int_equal(kvpool_connect(url, "u", NULL, &cl), -EINVAL);
	/* 0.0.0.0 reaches the same server as 127.0.0.1: refused, alone too */
	snprintf(url, sizeof(url), "tcp://%s,0.0.0.0:%u", n.names[0], n.s[0].port);
	assert_int_equal(kvpool_connect(url, "u", NULL, &cl), -EINVAL);
	snprintf(url, sizeof(url), "tcp://%s,0.0.0.0:%u", n.names[0], n.s[1].port);
	assert_int_equal(kvpool_connect(url, "u", NULL, &cl), -EINVAL);
	assert_null(cl);
	nodes_stop(&n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_busy_client_retries),
		cmocka_unit_test(test_put_nowhere_is_not_stored),
		cmocka_unit_test(test_drop_and_delete_unreached),
		cmocka_unit_test(test_cli_drop_unreached),
		cmocka_unit_test(test_new_handle_frozen_node),
		cmocka_unit_test(test_ping_and_health_per_node),
		cmocka_unit_test(test_etcd_empty_membership),
		cmocka_unit_test(test_node_limit),
		cmocka_unit_test(test_stats_not_summed),
		cmocka_unit_test(test_url_refusals),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
