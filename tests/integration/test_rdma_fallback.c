/*
 * test_rdma_fallback.c - a real kvpoold on a machine without a usable
 * RDMA device (or built with RDMA=0): it starts, serves TCP, and says in
 * STATS and in `kvpool stats` that RDMA is unavailable and why; an
 * auto:// client falls back to TCP and put/get work unchanged, into
 * registered memory too; an rdma:// client gets an error, not a hang.
 * On a machine where RDMA is served these tests skip
 * (tests/rdma/run-on-device.sh covers that case).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "harness.h"
#include "rdmx.h"

static struct {
	struct harness_server srv;
	struct kvpool_client *c;
} g;

static int group_setup(void **state)
{
	(void)state;
	if (harness_group_start(&g.srv, harness_default_flags))
		return 0;
	return harness_group_client(&g.srv, "rdma-fallback", &g.c);
}

static int group_teardown(void **state)
{
	(void)state;
	kvpool_close(g.c);
	harness_kill(&g.srv);
	return 0;
}

/* The "rdma" object of STATS, and skip when RDMA is actually served. */
static struct json_object *rdma_stats(struct json_object **doc)
{
	struct json_object *r, *avail;

	assert_int_equal(harness_stats(g.c, NULL, doc), 0);
	assert_true(json_object_object_get_ex(*doc, "rdma", &r));
	assert_true(json_object_object_get_ex(r, "available", &avail));
	if (json_object_get_boolean(avail)) {
		json_object_put(*doc);
		harness_skip("rdma is served here: see tests/rdma/run-on-device.sh");
	}
	return r;
}

static void test_stats_says_why(void **state)
{
	struct json_object *doc, *r, *v;
	struct kvpool_limits lim;

	(void)state;
	harness_need_server(&g.srv);
	r = rdma_stats(&doc);
	assert_true(json_object_object_get_ex(r, "built", &v));
	assert_int_equal(json_object_get_boolean(v), rdmx_built());
	assert_true(json_object_object_get_ex(r, "port", &v));
	assert_int_equal(json_object_get_int(v), 0);
	assert_true(json_object_object_get_ex(r, "reason", &v));
	assert_true(strlen(json_object_get_string(v)) > 0);
	if (!rdmx_built())
		assert_non_null(strstr(json_object_get_string(v), "without RDMA"));
	json_object_put(doc);
	/* HELLO offers no RDMA port. */
	assert_int_equal(kvpool_get_limits(g.c, &lim), 0);
	assert_int_equal(lim.rdma_port, 0);
}

static void test_cli_stats(void **state)
{
	const char *cli = getenv("KVPOOL_CLI");
	char cmd[512], line[512];
	int found = 0;
	FILE *p;

	(void)state;
	harness_need_server(&g.srv);
	if (!cli)
		harness_skip("kvpool CLI not built (is KVPOOL_CLI set?)");
	snprintf(cmd, sizeof(cmd), "%s stats --server %s 2>&1", cli, g.srv.url);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (fgets(line, sizeof(line), p))
		if (strncmp(line, "rdma: unavailable (", 19) == 0)
			found = 1;
	assert_int_equal(pclose(p), 0);
	assert_true(found);
}

/* auto:// stays on TCP: put and get work, into registered memory too. */
static void test_auto_falls_back(void **state)
{
	struct kvpool_options opts = { .timeout_ms = 5000 };
	struct kvpool_client *c = NULL;
	uint8_t key[32], data[8192], *buf = malloc(sizeof(data));
	uint64_t len = 0;
	char url[96];

	(void)state;
	harness_need_server(&g.srv);
	assert_non_null(buf);
	snprintf(url, sizeof(url), "auto://127.0.0.1:%u", g.srv.port);
	assert_int_equal(kvpool_connect(url, "rdma-fallback", &opts, &c), 0);
	harness_key(key, "auto", 1);
	harness_fill(data, sizeof(data), 7);
	assert_int_equal(kvpool_register(c, buf, sizeof(data)), 0);
	assert_int_equal(kvpool_put_bytes(c, key, NULL, data, sizeof(data)), 0);
	memset(buf, 0, sizeof(data));
	assert_int_equal(kvpool_get_bytes(c, key, buf, sizeof(data), &len), 0);
	assert_int_equal(len, sizeof(data));
	assert_memory_equal(buf, data, sizeof(data));
	assert_int_equal(kvpool_unregister(c, buf), 0);
	kvpool_close(c);
	free(buf);
}

/* rdma:// without a usable device: an error at connect, quickly. */
static void test_rdma_url_fails(void **state)
{
	struct kvpool_options opts = { .timeout_ms = 2000 };
	struct kvpool_client *c = NULL;
	int rc;

	(void)state;
	harness_need_server(&g.srv);
	rc = kvpool_connect("rdma://127.0.0.1:7472", "rdma-fallback", &opts, &c);
	assert_true(rc < 0);
	assert_null(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stats_says_why),
		cmocka_unit_test(test_cli_stats),
		cmocka_unit_test(test_auto_falls_back),
		cmocka_unit_test(test_rdma_url_fails),
		HARNESS_CLEAN_SHUTDOWN_TEST(&g.srv),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
