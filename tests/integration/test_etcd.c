/*
 * test_etcd.c - libkvpool's etcd v3 JSON-gateway client (etcd/etcd.c)
 * against a real etcd (Debian's etcd-server) on free loopback ports: range
 * by prefix, put with and without a lease, lease grant / keepalive /
 * revoke / expiry, delete, a prefix watch that resumes after etcd went
 * away, and the errors of bad arguments and an unreachable etcd; the
 * conditional writes (put if unchanged, delete if under a lease); a watch
 * that learns its revision is gone (compacted, or etcd wiped: it would
 * otherwise wait for a revision the new store has not reached); several
 * endpoints, one of them dead, and a three-member etcd losing the member
 * in use.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "etcd_proc.h"
#include "harness.h"
#include "etcd.h"

static struct etcd_proc etcd;

static int group_setup(void **state)
{
	(void)state;
	if (!etcd_proc_available())
		return 0; /* tests skip (fail under CI) */
	if (etcd_proc_start(&etcd)) {
		fprintf(stderr, "test_etcd: etcd did not start\n");
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	etcd_proc_destroy(&etcd);
	return 0;
}

static struct kvc_etcd *open_or_fail(void)
{
	struct kvc_etcd *e = NULL;

	if (!etcd.pid)
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(kvc_etcd_open(etcd.endpoint, 3000, &e), 0);
	return e;
}

static void test_put_range_delete(void **state)
{
	struct kvc_etcd *e = open_or_fail();
	struct kvc_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t rev = 0, rev2 = 0, deleted = -1;

	(void)state;
	assert_int_equal(kvc_etcd_put(e, "t1/a/x", "one", 3, 0), 0);
	assert_int_equal(kvc_etcd_put(e, "t1/a/y", "two\0bin", 7, 0), 0);
	assert_int_equal(kvc_etcd_put(e, "t1/b", "other", 5, 0), 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t1/a/", &kvs, &n, &rev), 0);
	assert_int_equal(n, 2);
	assert_true(rev > 0);
	assert_string_equal(kvs[0].key, "t1/a/x");
	assert_int_equal(kvs[0].value_len, 3);
	assert_memory_equal(kvs[0].value, "one", 3);
	assert_string_equal(kvs[1].key, "t1/a/y");
	assert_int_equal(kvs[1].value_len, 7);
	assert_memory_equal(kvs[1].value, "two\0bin", 7);
	kvc_etcd_kvs_free(kvs, n);

	assert_int_equal(kvc_etcd_delete(e, "t1/a/x", &deleted), 0);
	assert_int_equal(deleted, 1);
	assert_int_equal(kvc_etcd_delete(e, "t1/a/x", &deleted), 0);
	assert_int_equal(deleted, 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t1/a/", &kvs, &n, &rev2), 0);
	assert_int_equal(n, 1);
	assert_true(rev2 > rev);
	kvc_etcd_kvs_free(kvs, n);
	assert_int_equal(kvc_etcd_range_prefix(e, "t1/none/", &kvs, &n, &rev2), 0);
	assert_int_equal(n, 0);
	assert_null(kvs);
	kvc_etcd_close(e);
}

static void test_leases(void **state)
{
	struct kvc_etcd *e = open_or_fail();
	struct kvc_etcd_kv *kvs = NULL;
	size_t n = 0;
	int64_t id = 0, ttl = 0, rev;

	(void)state;
	assert_int_equal(kvc_etcd_lease_grant(e, 10, &id), 0);
	assert_true(id != 0);
	assert_int_equal(kvc_etcd_put(e, "t2/leased", "v", 1, id), 0);
	assert_int_equal(kvc_etcd_lease_keepalive(e, id, &ttl), 0);
	assert_true(ttl > 0 && ttl <= 10);
	assert_int_equal(kvc_etcd_range_prefix(e, "t2/", &kvs, &n, &rev), 0);
	assert_int_equal(n, 1);
	assert_int_equal(kvs[0].lease, id);
	kvc_etcd_kvs_free(kvs, n);
	assert_int_equal(kvc_etcd_lease_revoke(e, id), 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t2/", &kvs, &n, &rev), 0);
	assert_int_equal(n, 0); /* revoking the lease removed its key */
	assert_int_equal(kvc_etcd_lease_keepalive(e, id, &ttl), -ENOENT);
	assert_int_equal(kvc_etcd_lease_revoke(e, id), -ENOENT);
	assert_int_equal(kvc_etcd_put(e, "t2/leased", "v", 1, id), -ENOENT);

	/* A lease that is not renewed expires (etcd's minimum TTL is ~5 s
	 * on a single member... a 1 s TTL is rounded up; wait for it). */
	assert_int_equal(kvc_etcd_lease_grant(e, 1, &id), 0);
	assert_int_equal(kvc_etcd_put(e, "t2/short", "v", 1, id), 0);
	for (int i = 0; i < 80; i++) {
		assert_int_equal(kvc_etcd_range_prefix(e, "t2/", &kvs, &n, &rev), 0);
		kvc_etcd_kvs_free(kvs, n);
		if (n == 0)
			break;
		usleep(100000);
	}
	assert_int_equal(n, 0);
	kvc_etcd_close(e);
}

struct watch_log {
	char keys[64][32];
	int types[64];
	int n;
	int watching;
	volatile int stop;
};

static int on_event(void *arg, enum kvc_etcd_event type, const struct kvc_etcd_kv *kv)
{
	struct watch_log *w = arg;

	if (type == KVC_ETCD_WATCHING) {
		assert_null(kv);
		w->watching++;
		return 0;
	}
	if (w->n < 64) {
		snprintf(w->keys[w->n], sizeof(w->keys[0]), "%s", kv->key);
		w->types[w->n] = type;
		w->n++;
	}
	return 0;
}

struct watch_run {
	struct kvc_etcd *e;
	int64_t from, next;
	int rc;
	struct watch_log *log;
};

static void *watch_thread(void *arg)
{
	struct watch_run *r = arg;

	r->rc = kvc_etcd_watch_prefix(r->e, "t3/", r->from, on_event, r->log, &r->log->stop,
				      &r->next);
	return NULL;
}

static void wait_events(struct watch_log *w, int n)
{
	for (int i = 0; i < 100 && w->n < n; i++)
		usleep(50000);
	assert_int_equal(w->n, n);
}

static void test_watch_and_resume(void **state)
{
	struct kvc_etcd *e = open_or_fail(), *we;
	struct watch_log log = { 0 };
	struct watch_run run = { 0 };
	struct kvc_etcd_kv *kvs;
	size_t n;
	int64_t rev;
	pthread_t t;

	(void)state;
	assert_int_equal(kvc_etcd_put(e, "t3/before", "0", 1, 0), 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t3/", &kvs, &n, &rev), 0);
	kvc_etcd_kvs_free(kvs, n);
	assert_int_equal(n, 1);
	assert_int_equal(kvc_etcd_open(etcd.endpoint, 3000, &we), 0);
	run = (struct watch_run){ .e = we, .from = rev + 1, .log = &log };
	assert_int_equal(pthread_create(&t, NULL, watch_thread, &run), 0);
	usleep(300000);
	assert_int_equal(kvc_etcd_put(e, "t3/a", "1", 1, 0), 0);
	assert_int_equal(kvc_etcd_put(e, "t3/b", "2", 1, 0), 0);
	assert_int_equal(kvc_etcd_put(e, "other", "x", 1, 0), 0); /* not under the prefix */
	assert_int_equal(kvc_etcd_delete(e, "t3/a", NULL), 0);
	wait_events(&log, 3);
	assert_int_equal(log.watching, 1);
	assert_string_equal(log.keys[0], "t3/a");
	assert_int_equal(log.types[0], KVC_ETCD_PUT);
	assert_string_equal(log.keys[1], "t3/b");
	assert_string_equal(log.keys[2], "t3/a");
	assert_int_equal(log.types[2], KVC_ETCD_DELETE);

	/* etcd goes away: the watch ends with -ECONNRESET and says where to
	 * resume; changes made while it was down are not lost. */
	etcd_proc_stop(&etcd);
	pthread_join(t, NULL);
	assert_int_equal(run.rc, -ECONNRESET);
	assert_true(run.next > run.from);
	assert_int_equal(etcd_proc_start(&etcd), 0);
	assert_int_equal(kvc_etcd_put(e, "t3/c", "3", 1, 0), 0);
	run.from = run.next;
	assert_int_equal(pthread_create(&t, NULL, watch_thread, &run), 0);
	wait_events(&log, 4);
	assert_int_equal(log.watching, 2);
	assert_string_equal(log.keys[3], "t3/c");
	log.stop = 1;
	pthread_join(t, NULL);
	assert_int_equal(run.rc, 0); /* stopped by the flag */
	kvc_etcd_close(we);
	kvc_etcd_close(e);
}


static void test_conditional(void **state)
{
	struct kvc_etcd *e = open_or_fail();
	struct kvc_etcd_kv kv;
	int64_t lease = 0, other = 0, deleted = -1;

	(void)state;
	assert_int_equal(kvc_etcd_get(e, "t5/k", &kv), -ENOENT);
	assert_int_equal(kvc_etcd_lease_grant(e, 10, &lease), 0);
	assert_int_equal(kvc_etcd_lease_grant(e, 10, &other), 0);
	/* put only if absent: once */
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v1", 2, lease, 0), 0);
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v2", 2, lease, 0), -EEXIST);
	assert_int_equal(kvc_etcd_get(e, "t5/k", &kv), 0);
	assert_string_equal((const char *)kv.value, "v1");
	assert_int_equal(kv.lease, lease);
	/* put only if unchanged since that read */
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v3", 2, other, kv.mod_revision), 0);
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v4", 2, other, kv.mod_revision), -EEXIST);
	kvc_etcd_kv_free(&kv);
	assert_int_equal(kvc_etcd_get(e, "t5/k", &kv), 0);
	assert_string_equal((const char *)kv.value, "v3");
	assert_int_equal(kv.lease, other);
	kvc_etcd_kv_free(&kv);
	kvc_etcd_kv_free(NULL);
	/* delete only under the given lease: the first lease's holder may
	 * not remove what the second put */
	assert_int_equal(kvc_etcd_delete_if_lease(e, "t5/k", lease, &deleted), 0);
	assert_int_equal(deleted, 0);
	assert_int_equal(kvc_etcd_get(e, "t5/k", &kv), 0);
	kvc_etcd_kv_free(&kv);
	assert_int_equal(kvc_etcd_delete_if_lease(e, "t5/k", other, &deleted), 0);
	assert_int_equal(deleted, 1);
	assert_int_equal(kvc_etcd_get(e, "t5/k", &kv), -ENOENT);
	assert_int_equal(kvc_etcd_delete_if_lease(e, "t5/k", other, &deleted), 0);
	assert_int_equal(deleted, 0);
	/* a lease that does not exist */
	assert_int_equal(kvc_etcd_lease_revoke(e, lease), 0);
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v", 1, lease, 0), -ENOENT);
	assert_int_equal(kvc_etcd_delete_if_lease(e, "t5/k", 0, NULL), -EINVAL);
	assert_int_equal(kvc_etcd_put_if(e, "", "v", 1, 0, 0), -EINVAL);
	assert_int_equal(kvc_etcd_put_if(e, "t5/k", "v", 1, 0, -1), -EINVAL);
	assert_int_equal(kvc_etcd_get(e, "", &kv), -EINVAL);
	kvc_etcd_lease_revoke(e, other);
	kvc_etcd_close(e);
}

static void test_endpoints(void **state)
{
	struct kvc_etcd *e = NULL;
	struct kvc_etcd_kv *kvs = NULL;
	char list[128], ep[400], cl[80];
	size_t n = 0;
	int64_t rev;

	(void)state;
	if (!etcd.pid)
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	/* a dead member first: calls move on to the live one and stay there */
	snprintf(list, sizeof(list), "127.0.0.1:%u,%s", etcd_proc_free_port(), etcd.endpoint);
	assert_int_equal(kvc_etcd_open(list, 2000, &e), 0);
	assert_int_equal(kvc_etcd_endpoints(e), 2);
	assert_int_equal(kvc_etcd_put(e, "t6/a", "1", 1, 0), 0);
	assert_int_equal(kvc_etcd_failovers(e), 1);
	assert_string_equal(kvc_etcd_current(e), etcd.endpoint);
	assert_int_equal(kvc_etcd_range_prefix(e, "t6/", &kvs, &n, &rev), 0);
	assert_int_equal(n, 1);
	kvc_etcd_kvs_free(kvs, n);
	assert_int_equal(kvc_etcd_failovers(e), 1);
	kvc_etcd_close(e);
	/* bad lists */
	e = NULL;
	assert_int_equal(kvc_etcd_open(",127.0.0.1:1", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open("127.0.0.1:1,", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open("a,,b", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open("a,b,c,d,e,f,g,h,i", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open("[::1", 1000, &e), -EINVAL);
	assert_null(e);
	assert_int_equal(kvc_etcd_open("a,b:1,[::1]:2379,c", 1000, &e), 0);
	assert_int_equal(kvc_etcd_endpoints(e), 4);
	kvc_etcd_close(e);
	assert_int_equal(kvc_etcd_url_parse("etcd://a:2379,b:2379,c/prod", ep, sizeof(ep), cl,
					    sizeof(cl)), 0);
	assert_string_equal(ep, "a:2379,b:2379,c");
	assert_string_equal(cl, "prod");
	assert_int_equal(kvc_etcd_url_parse("etcd://a:2379,,c/prod", ep, sizeof(ep), cl, sizeof(cl)),
			 -EINVAL);
	assert_int_equal(kvc_etcd_url_parse("etcd://a:2379,/prod", ep, sizeof(ep), cl, sizeof(cl)),
			 -EINVAL);
}

/* A watch whose start revision the store no longer has. */
static void test_watch_stale(void **state)
{
	struct kvc_etcd *e = open_or_fail(), *we;
	struct watch_log log = { 0 };
	volatile int stop = 0;
	struct kvc_etcd_kv *kvs;
	char body[160], reply[512];
	size_t n;
	int64_t rev, next = 0;
	uint64_t t0;

	(void)state;
	/* compacted past it: etcd says so at once */
	assert_int_equal(kvc_etcd_put(e, "t7/a", "1", 1, 0), 0);
	assert_int_equal(kvc_etcd_put(e, "t7/a", "2", 1, 0), 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t7/", &kvs, &n, &rev), 0);
	kvc_etcd_kvs_free(kvs, n);
	snprintf(body, sizeof(body), "{\"revision\":\"%lld\",\"physical\":true}", (long long)rev);
	assert_int_equal(etcd_proc_post(&etcd, "/v3/kv/compaction", body, reply, sizeof(reply)), 200);
	assert_int_equal(kvc_etcd_open(etcd.endpoint, 3000, &we), 0);
	assert_int_equal(kvc_etcd_watch_prefix(we, "t7/", rev - 1, on_event, &log, &stop, &next),
			 -ESTALE);
	/* etcd wiped (its revisions start again at 1): the watch would wait
	 * for revision rev + 1 forever; it says -ESTALE instead */
	kvc_etcd_close(e);
	assert_int_equal(etcd_proc_wipe(&etcd), 0);
	e = open_or_fail();
	t0 = (uint64_t)time(NULL);
	assert_int_equal(kvc_etcd_watch_prefix(we, "t7/", rev + 1, on_event, &log, &stop, &next),
			 -ESTALE);
	assert_true((uint64_t)time(NULL) - t0 < 5);
	assert_int_equal(log.n, 0);
	/* from the revision of a fresh read, it watches as usual */
	assert_int_equal(kvc_etcd_range_prefix(e, "t7/", &kvs, &n, &rev), 0);
	assert_int_equal(n, 0);
	kvc_etcd_kvs_free(kvs, n);
	{
		struct watch_run run = { .e = we, .from = rev + 1, .log = &log };
		pthread_t t;

		/* watch_thread watches t3/; use its prefix */
		assert_int_equal(pthread_create(&t, NULL, watch_thread, &run), 0);
		usleep(300000);
		assert_int_equal(kvc_etcd_put(e, "t3/after-wipe", "1", 1, 0), 0);
		wait_events(&log, 1);
		assert_string_equal(log.keys[0], "t3/after-wipe");
		log.stop = 1;
		pthread_join(t, NULL);
		assert_int_equal(run.rc, 0);
	}
	kvc_etcd_close(we);
	kvc_etcd_close(e);
}

/* Three etcd members; the one in use stops: calls and the watch go on
 * through another. */
static void test_cluster_failover(void **state)
{
	struct etcd_proc m[3];
	struct kvc_etcd *e, *we;
	struct watch_log log = { 0 };
	struct kvc_etcd_kv *kvs;
	char list[160];
	size_t n, used = 3;
	int64_t rev, lease = 0;

	(void)state;
	if (!etcd.pid)
		harness_skip("etcd is not installed (apt-get install etcd-server)");
	assert_int_equal(etcd_proc_start_cluster(m, 3), 0);
	etcd_proc_endpoints(m, 3, list, sizeof(list));
	assert_int_equal(kvc_etcd_open(list, 2000, &e), 0);
	assert_int_equal(kvc_etcd_open(list, 2000, &we), 0);
	assert_int_equal(kvc_etcd_lease_grant(e, 10, &lease), 0);
	assert_int_equal(kvc_etcd_put(e, "t3/one", "1", 1, lease), 0);
	assert_int_equal(kvc_etcd_range_prefix(e, "t3/", &kvs, &n, &rev), 0);
	kvc_etcd_kvs_free(kvs, n);
	assert_int_equal(n, 1);
	{
		struct watch_run run = { .e = we, .from = rev + 1, .log = &log };
		pthread_t t;

		assert_int_equal(pthread_create(&t, NULL, watch_thread, &run), 0);
		usleep(300000);
		for (size_t i = 0; i < 3; i++)
			if (!strcmp(kvc_etcd_current(e), m[i].endpoint))
				used = i;
		assert_true(used < 3);
		etcd_proc_stop(&m[used]); /* the member both handles use */
		pthread_join(t, NULL);
		assert_int_equal(run.rc, -ECONNRESET);
		/* the others still make a quorum */
		assert_int_equal(kvc_etcd_lease_keepalive(e, lease, NULL), 0);
		assert_int_equal(kvc_etcd_put(e, "t3/two", "2", 1, lease), 0);
		assert_true(kvc_etcd_failovers(e) >= 1);
		assert_string_not_equal(kvc_etcd_current(e), m[used].endpoint);
		run.from = run.next;
		assert_int_equal(pthread_create(&t, NULL, watch_thread, &run), 0);
		wait_events(&log, 1);
		assert_string_equal(log.keys[0], "t3/two");
		log.stop = 1;
		pthread_join(t, NULL);
		assert_true(kvc_etcd_failovers(we) >= 1);
	}
	kvc_etcd_close(we);
	kvc_etcd_close(e);
	for (size_t i = 0; i < 3; i++)
		etcd_proc_destroy(&m[i]);
}

static void test_errors(void **state)
{
	struct kvc_etcd *e = NULL, *dead = NULL;
	struct kvc_etcd_kv *kvs;
	size_t n;
	int64_t rev, id;
	volatile int stop = 0;

	(void)state;
	assert_int_equal(kvc_etcd_open("", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open("http://x:1", 1000, &e), -EINVAL);
	assert_int_equal(kvc_etcd_open(NULL, 1000, &e), -EINVAL);
	assert_null(e);
	/* nothing listens there */
	assert_int_equal(kvc_etcd_open("127.0.0.1:1", 1000, &dead), 0);
	assert_int_equal(kvc_etcd_range_prefix(dead, "x/", &kvs, &n, &rev), -ECONNREFUSED);
	assert_int_equal(kvc_etcd_lease_grant(dead, 10, &id), -ECONNREFUSED);
	assert_int_equal(kvc_etcd_watch_prefix(dead, "x/", 1, on_event, NULL, &stop, &rev),
			 -ECONNREFUSED);
	assert_int_equal(kvc_etcd_range_prefix(dead, "", &kvs, &n, &rev), -EINVAL);
	assert_int_equal(kvc_etcd_lease_grant(dead, 0, &id), -EINVAL);
	assert_int_equal(kvc_etcd_lease_keepalive(dead, 0, NULL), -EINVAL);
	assert_int_equal(kvc_etcd_put(dead, "", "v", 1, 0), -EINVAL);
	assert_int_equal(kvc_etcd_watch_prefix(dead, "x/", 0, on_event, NULL, &stop, &rev),
			 -EINVAL);
	kvc_etcd_close(dead);
	kvc_etcd_close(NULL);
	kvc_etcd_kvs_free(NULL, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_put_range_delete),
		cmocka_unit_test(test_leases),
		cmocka_unit_test(test_watch_and_resume),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_conditional),
		cmocka_unit_test(test_endpoints),
		cmocka_unit_test(test_watch_stale),
		cmocka_unit_test(test_cluster_failover),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
