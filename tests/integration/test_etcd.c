/*
 * test_etcd.c - libkvpool's etcd v3 JSON-gateway client (etcd/etcd.c)
 * against a real etcd (Debian's etcd-server) on free loopback ports: range
 * by prefix, put with and without a lease, lease grant / keepalive /
 * revoke / expiry, delete, a prefix watch that resumes after etcd went
 * away, and the errors of bad arguments and an unreachable etcd.
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
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
