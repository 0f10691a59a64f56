/*
 * test_etcd_register.c - kvpoold's registration in etcd (server/
 * srv_etcd.c) and the membership a cluster handle follows when etcd
 * misbehaves, with Debian's etcd-server and real kvpoold processes on
 * free loopback ports:
 *
 *  - a record deleted by hand while its lease lives is written again
 *    (before: kvpoold kept renewing the lease of a record that was gone
 *    and went on saying registered: true)
 *  - a second kvpoold started with the same --node-name neither takes
 *    the first one's record nor deletes it when it stops (before: it
 *    overwrote the record, and its clean stop deleted it); a node
 *    restarted after a crash takes its own stale record back at once
 *  - a loopback advertise address is warned about
 *  - etcd wiped while nodes and a client run: the nodes register again
 *    and the client's membership follows, including a node that joins
 *    afterwards (before: the client's watch waited for a revision the
 *    new store had not reached, for good)
 *  - three etcd members named in the URL: the member in use stops, the
 *    nodes stay registered and the client still sees a node join
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "etcd.h"
#include "etcd_proc.h"
#include "harness.h"

#define LEASE_S "2"

extern char **environ;

static const char *const base_flags[] = {
	"--dram-capacity", "16MiB", "--max-block-bytes", "1MiB", "--threads", "1",
	"--log-level", "warn", "--rdma-port", "0", "--drain-timeout-ms", "1000", NULL,
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

static void need_etcd_and_kvpoold(void)
{
	if (!getenv("KVPOOLD"))
		harness_skip("KVPOOLD is not set");
	if (!etcd_proc_available())
		harness_skip("etcd is not installed (apt-get install etcd-server)");
}

/* Flags of a node registered as `name` in cluster "test" at `endpoints`. */
struct node_flags {
	char url[256], name[32];
	const char *argv[24];
};

static void flags_for(struct node_flags *f, const char *endpoints, const char *name)
{
	size_t k = 0;

	snprintf(f->url, sizeof(f->url), "etcd://%s/test", endpoints);
	snprintf(f->name, sizeof(f->name), "%s", name);
	for (size_t i = 0; base_flags[i]; i++)
		f->argv[k++] = base_flags[i];
	f->argv[k++] = "--cluster";
	f->argv[k++] = f->url;
	f->argv[k++] = "--node-name";
	f->argv[k++] = f->name;
	f->argv[k++] = "--cluster-lease-s";
	f->argv[k++] = LEASE_S;
	f->argv[k] = NULL;
}

/* The record of node `name` (its port, its lease), or 0 when absent. */
static int record_port(const char *endpoints, const char *name, int64_t *lease)
{
	char key[128];
	struct kvc_etcd *e;
	struct kvc_etcd_kv kv;
	int port = 0;

	snprintf(key, sizeof(key), "kvpool/test/nodes/%s", name);
	assert_int_equal(kvc_etcd_open(endpoints, 2000, &e), 0);
	if (kvc_etcd_get(e, key, &kv) == 0) {
		struct json_object *o = json_tokener_parse((const char *)kv.value), *p;

		if (o && json_object_object_get_ex(o, "port", &p))
			port = json_object_get_int(p);
		json_object_put(o);
		if (lease)
			*lease = kv.lease;
		kvc_etcd_kv_free(&kv);
	}
	kvc_etcd_close(e);
	return port;
}

static int wait_record(const char *endpoints, const char *name, int port, int max_ms)
{
	uint64_t end = now_ms() + (uint64_t)max_ms;
	int got;

	while ((got = record_port(endpoints, name, NULL)) != port && now_ms() < end)
		sleep_ms(100);
	return got;
}

/* The server's own "cluster" stats object, as a copy. */
static struct json_object *node_cluster(const struct harness_server *s)
{
	struct kvpool_client *c;
	struct json_object *doc, *v, *out;

	assert_int_equal(harness_client(s, "reg", &c), 0);
	assert_int_equal(harness_stats(c, NULL, &doc), 0);
	assert_true(json_object_object_get_ex(doc, "cluster", &v));
	out = json_object_get(v);
	json_object_put(doc);
	kvpool_close(c);
	return out;
}

static int64_t field_i64(struct json_object *o, const char *name)
{
	struct json_object *v;

	assert_true(json_object_object_get_ex(o, name, &v));
	return json_object_get_int64(v);
}

static int field_bool(struct json_object *o, const char *name)
{
	struct json_object *v;

	assert_true(json_object_object_get_ex(o, name, &v));
	return json_object_get_boolean(v);
}

static void field_str(struct json_object *o, const char *name, char *buf, size_t cap)
{
	struct json_object *v;

	assert_true(json_object_object_get_ex(o, name, &v));
	snprintf(buf, cap, "%s", json_object_get_string(v));
}

/* Members a cluster handle sees. */
static size_t members(struct kvpool_client *cl)
{
	struct json_object *doc, *cj, *v;
	size_t n;

	assert_int_equal(harness_stats(cl, NULL, &doc), 0);
	assert_true(json_object_object_get_ex(doc, "cluster", &cj));
	assert_true(json_object_object_get_ex(cj, "nodes", &v));
	n = json_object_array_length(v);
	json_object_put(doc);
	return n;
}

static size_t wait_members(struct kvpool_client *cl, size_t want, int max_ms)
{
	uint64_t end = now_ms() + (uint64_t)max_ms;
	size_t n;

	while ((n = members(cl)) != want && now_ms() < end)
		sleep_ms(100);
	return n;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_record_deleted(void **state)
{
	struct etcd_proc e = { 0 };
	struct harness_server s = { 0 };
	struct node_flags f;
	struct json_object *c;
	struct kvc_etcd *k;
	int64_t deleted = 0, lease1 = 0, lease2 = 0;
	uint64_t t0;

	(void)state;
	need_etcd_and_kvpoold();
	assert_int_equal(etcd_proc_start(&e), 0);
	flags_for(&f, e.endpoint, "del0");
	assert_int_equal(harness_start(&s, f.argv), 0);
	assert_int_equal(wait_record(e.endpoint, "del0", s.port, 5000), s.port);
	record_port(e.endpoint, "del0", &lease1);
	/* someone deletes the record; the lease lives on */
	assert_int_equal(kvc_etcd_open(e.endpoint, 2000, &k), 0);
	assert_int_equal(kvc_etcd_delete(k, "kvpool/test/nodes/del0", &deleted), 0);
	assert_int_equal(deleted, 1);
	kvc_etcd_close(k);
	t0 = now_ms();
	/* checked at every renewal (a third of the 2 s lease) */
	assert_int_equal(wait_record(e.endpoint, "del0", s.port, 4000), s.port);
	printf("a deleted record was back after %" PRIu64 " ms\n", now_ms() - t0);
	record_port(e.endpoint, "del0", &lease2);
	assert_int_equal(lease2, lease1); /* under the same, living lease */
	c = node_cluster(&s);
	assert_true(field_bool(c, "registered"));
	assert_true(field_i64(c, "reregistrations") >= 1);
	{
		char hex[24], want[24];

		field_str(c, "lease", hex, sizeof(hex));
		snprintf(want, sizeof(want), "%" PRIx64, (uint64_t)lease1);
		assert_string_equal(hex, want);
	}
	json_object_put(c);
	/* a clean stop removes it */
	assert_int_equal(harness_stop(&s), 0);
	assert_int_equal(record_port(e.endpoint, "del0", NULL), 0);
	etcd_proc_destroy(&e);
}

static void test_same_name(void **state)
{
	struct etcd_proc e = { 0 };
	struct harness_server a = { 0 }, b = { 0 };
	struct node_flags f;
	struct json_object *c;
	char text[256];
	uint16_t port_a;
	uint64_t t0;

	(void)state;
	need_etcd_and_kvpoold();
	assert_int_equal(etcd_proc_start(&e), 0);
	flags_for(&f, e.endpoint, "dup");
	assert_int_equal(harness_start(&a, f.argv), 0);
	assert_int_equal(wait_record(e.endpoint, "dup", a.port, 5000), a.port);
	/* a second node under the same name (another port: another node) */
	assert_int_equal(harness_start(&b, f.argv), 0);
	sleep_ms(1500);
	assert_int_equal(record_port(e.endpoint, "dup", NULL), a.port);
	c = node_cluster(&b);
	assert_false(field_bool(c, "registered"));
	field_str(c, "state", text, sizeof(text));
	assert_string_equal(text, "name in use by another node");
	field_str(c, "last_error", text, sizeof(text));
	printf("second node with the same name: %s\n", text);
	assert_non_null(strstr(text, "another node"));
	json_object_put(c);
	c = node_cluster(&a);
	assert_true(field_bool(c, "registered"));
	json_object_put(c);
	/* its clean stop leaves the first one's record alone */
	assert_int_equal(harness_stop(&b), 0);
	assert_int_equal(record_port(e.endpoint, "dup", NULL), a.port);
	sleep_ms(1000); /* and the first keeps it (renewals read it back) */
	assert_int_equal(record_port(e.endpoint, "dup", NULL), a.port);

	/* The first node crashes (its record stays until the lease ends) and
	 * comes back on the same address and port: it takes its own stale
	 * record back at once instead of waiting for the lease. */
	port_a = a.port;
	harness_kill(&a);
	assert_int_equal(record_port(e.endpoint, "dup", NULL), port_a);
	t0 = now_ms();
	assert_int_equal(harness_start_on_port(&a, port_a, f.argv), 0);
	for (;;) {
		c = node_cluster(&a);
		if (field_bool(c, "registered") || now_ms() - t0 > 5000)
			break;
		json_object_put(c);
		sleep_ms(50);
	}
	assert_true(field_bool(c, "registered"));
	json_object_put(c);
	printf("a node restarted on its own address registered again after %" PRIu64 " ms "
	       "(lease %s s)\n", now_ms() - t0, LEASE_S);
	assert_true(now_ms() - t0 < 1900);
	assert_int_equal(harness_stop(&a), 0);
	assert_int_equal(record_port(e.endpoint, "dup", NULL), 0);
	etcd_proc_destroy(&e);
}

/* kvpoold's log when it registers 127.0.0.1 (spawned here, stderr kept). */
static void test_loopback_warning(void **state)
{
	struct etcd_proc e = { 0 };
	char url[96], port[8], logpath[] = "/tmp/kvpool-reg-log-XXXXXX", buf[8192];
	const char *kvpoold = getenv("KVPOOLD");
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int fd, st;
	ssize_t n;

	(void)state;
	need_etcd_and_kvpoold();
	assert_int_equal(etcd_proc_start(&e), 0);
	fd = mkstemp(logpath);
	assert_true(fd >= 0);
	snprintf(url, sizeof(url), "etcd://%s/test", e.endpoint);
	snprintf(port, sizeof(port), "%u", etcd_proc_free_port());
	{
		char *argv[] = { (char *)kvpoold, "--listen", "127.0.0.1", "--port", port,
				 "--admin-port", "0", "--rdma-port", "0", "--dram-capacity", "16MiB",
				 "--max-block-bytes", "1MiB", "--threads", "1", "--log-level", "warn",
				 "--cluster", url, "--node-name", "loop0", NULL };

		posix_spawn_file_actions_init(&fa);
		posix_spawn_file_actions_adddup2(&fa, fd, 2);
		assert_int_equal(posix_spawn(&pid, kvpoold, &fa, NULL, argv, environ), 0);
		posix_spawn_file_actions_destroy(&fa);
	}
	assert_int_equal(wait_record(e.endpoint, "loop0", atoi(port), 5000), atoi(port));
	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	unlink(logpath);
	assert_true(n > 0);
	buf[n] = 0;
	assert_non_null(strstr(buf, "127.0.0.1 is a loopback address"));
	etcd_proc_destroy(&e);
}

static void test_etcd_wiped(void **state)
{
	struct etcd_proc e = { 0 };
	struct harness_server s[4] = { { 0 } };
	static struct node_flags f[4];
	struct kvpool_client *cl;
	struct json_object *c;
	char url[96];
	uint64_t t0;

	(void)state;
	need_etcd_and_kvpoold();
	if (harness_valgrind()) {
		printf("not under valgrind: its lease-period bounds do not hold at valgrind's pace\n");
		return;
	}
	assert_int_equal(etcd_proc_start(&e), 0);
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "w%d", i);
		flags_for(&f[i], e.endpoint, name);
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
		assert_int_equal(wait_record(e.endpoint, name, s[i].port, 5000), s[i].port);
	}
	snprintf(url, sizeof(url), "etcd://%s/test", e.endpoint);
	assert_int_equal(kvpool_connect(url, "reg", NULL, &cl), 0);
	assert_int_equal(members(cl), 3);
	/* Some history under the prefix the client watches, so the revision
	 * it resumes from is well past what the new store will reach. */
	{
		struct kvc_etcd *k;

		assert_int_equal(kvc_etcd_open(e.endpoint, 2000, &k), 0);
		for (int i = 0; i < 20; i++) {
			assert_int_equal(kvc_etcd_put(k, "kvpool/test/nodes/zz", "x", 1, 0), 0);
			assert_int_equal(kvc_etcd_delete(k, "kvpool/test/nodes/zz", NULL), 0);
		}
		kvc_etcd_close(k);
		sleep_ms(300); /* the client has applied them */
	}
	t0 = now_ms();
	assert_int_equal(etcd_proc_wipe(&e), 0);
	/* the nodes find their leases gone and register afresh */
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "w%d", i);
		assert_int_equal(wait_record(e.endpoint, name, s[i].port, 6000), s[i].port);
	}
	printf("etcd wiped: the three nodes registered again within %" PRIu64 " ms\n",
	       now_ms() - t0);
	c = node_cluster(&s[0]);
	assert_true(field_bool(c, "registered"));
	json_object_put(c);
	/* the client follows the new store: a fourth node is seen */
	flags_for(&f[3], e.endpoint, "w3");
	t0 = now_ms();
	assert_int_equal(harness_start(&s[3], f[3].argv), 0);
	assert_int_equal(wait_members(cl, 4, 8000), 4);
	printf("after the wipe, a node that joined was seen in %" PRIu64 " ms\n", now_ms() - t0);
	/* and one that leaves */
	assert_int_equal(harness_stop(&s[3]), 0);
	assert_int_equal(wait_members(cl, 3, 5000), 3);
	kvpool_close(cl);
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_stop(&s[i]), 0);
	etcd_proc_destroy(&e);
}

static void test_several_etcd_members(void **state)
{
	struct etcd_proc m[3];
	struct harness_server s[3] = { { 0 } };
	static struct node_flags f[3];
	struct kvpool_client *cl;
	struct json_object *c;
	char list[160], url[200], used[64];
	int stopped = -1;

	(void)state;
	need_etcd_and_kvpoold();
	if (harness_valgrind()) {
		printf("not under valgrind: its lease-period bounds do not hold at valgrind's pace\n");
		return;
	}
	assert_int_equal(etcd_proc_start_cluster(m, 3), 0);
	etcd_proc_endpoints(m, 3, list, sizeof(list));
	for (int i = 0; i < 2; i++) {
		char name[16];

		snprintf(name, sizeof(name), "m%d", i);
		flags_for(&f[i], list, name);
		assert_int_equal(harness_start(&s[i], f[i].argv), 0);
		assert_int_equal(wait_record(list, name, s[i].port, 5000), s[i].port);
	}
	snprintf(url, sizeof(url), "etcd://%s/test", list);
	assert_int_equal(kvpool_connect(url, "reg", NULL, &cl), 0);
	assert_int_equal(members(cl), 2);
	/* stop the member node m0 talks to */
	c = node_cluster(&s[0]);
	field_str(c, "endpoint", used, sizeof(used));
	json_object_put(c);
	for (int i = 0; i < 3; i++)
		if (!strcmp(m[i].endpoint, used))
			stopped = i;
	assert_true(stopped >= 0);
	etcd_proc_stop(&m[stopped]);
	/* two lease periods later both nodes are still registered */
	sleep_ms(4500);
	for (int i = 0; i < 2; i++) {
		char name[16];

		snprintf(name, sizeof(name), "m%d", i);
		assert_int_equal(record_port(list, name, NULL), s[i].port);
		c = node_cluster(&s[i]);
		assert_true(field_bool(c, "registered"));
		field_str(c, "endpoint", used, sizeof(used));
		assert_string_not_equal(used, m[stopped].endpoint);
		json_object_put(c);
	}
	assert_int_equal(members(cl), 2);
	/* and the client still follows: a third node joins */
	flags_for(&f[2], list, "m2");
	assert_int_equal(harness_start(&s[2], f[2].argv), 0);
	assert_int_equal(wait_members(cl, 3, 8000), 3);
	kvpool_close(cl);
	for (int i = 0; i < 3; i++)
		assert_int_equal(harness_stop(&s[i]), 0);
	for (int i = 0; i < 3; i++)
		etcd_proc_destroy(&m[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_record_deleted),
		cmocka_unit_test(test_same_name),
		cmocka_unit_test(test_loopback_warning),
		cmocka_unit_test(test_etcd_wiped),
		cmocka_unit_test(test_several_etcd_members),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
