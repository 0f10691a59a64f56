/*
 * test_admin.c - srv_admin's states on a server struct of our own (no
 * workers): /healthz 503 "starting" before the pool is open, 200 once
 * serving, 503 "draining" after; /metrics and /stats 503 only while
 * starting (the state is the server's, srv_state). And srv_metrics: histogram edges and label escaping.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "srv_admin.h"
#include "srv_lifecycle.h"
#include "srv_metrics.h"
#include "srv_server.h"
#include "store.h"

/* A free loopback port. */
static uint16_t free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

/* GET path from 127.0.0.1:port; the status, and the body in body[cap]. */
static int http_get(uint16_t port, const char *path, char *body, size_t cap)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	static char buf[1 << 20];
	size_t have = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1, n;
	char req[256];
	char *sep;

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
	assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		assert_int_equal(poll(&p, 1, 5000), 1);
		r = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
		assert_true(r >= 0);
		if (r == 0)
			break;
		have += (size_t)r;
	}
	close(fd);
	buf[have] = '\0';
	assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &status), 1);
	sep = strstr(buf, "\r\n\r\n");
	assert_non_null(sep);
	snprintf(body, cap, "%s", sep + 4);
	return status;
}

static void test_admin_states(void **state)
{
	struct store_config sc = { .dram_capacity_bytes = 4 << 20, .max_block_bytes = 1 << 20,
				   .max_inflight_put_bytes = 1 << 20, .max_lease_ms = 1000 };
	struct srv *s = calloc(1, sizeof(*s));
	struct srv_admin *a = NULL;
	uint16_t port = free_port();
	char body[4096];

	(void)state;
	assert_non_null(s);
	assert_int_equal(srv_admin_start(s, "127.0.0.1", port, &a), 0);
	assert_non_null(a);
	/* Starting: the pool is not open; nothing reads it. */
	assert_int_equal(http_get(port, "/healthz", body, sizeof(body)), 503);
	assert_string_equal(body, "starting\n");
	assert_int_equal(http_get(port, "/metrics", body, sizeof(body)), 503);
	assert_int_equal(http_get(port, "/stats", body, sizeof(body)), 503);
	/* Serving: a pool, no workers. */
	assert_int_equal(store_open(&sc, &s->store, NULL, 0), 0);
	__atomic_store_n(&s->state, SRV_STATE_SERVING, __ATOMIC_RELEASE);
	assert_int_equal(http_get(port, "/healthz", body, sizeof(body)), 200);
	assert_string_equal(body, "serving\n");
	assert_int_equal(http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "kvpool_tier_capacity_bytes{tier=\"dram\"} 4194304\n"));
	assert_int_equal(http_get(port, "/stats", body, sizeof(body)), 200);
	assert_non_null(strstr(body, "\"capacity_bytes\":4194304"));
	/* Draining: unhealthy, figures still served. */
	__atomic_store_n(&s->state, SRV_STATE_DRAINING, __ATOMIC_RELEASE);
	assert_int_equal(http_get(port, "/healthz", body, sizeof(body)), 503);
	assert_string_equal(body, "draining\n");
	assert_int_equal(http_get(port, "/stats", body, sizeof(body)), 200);
	srv_admin_stop(a);
	store_close(s->store);
	free(s);
}

/* The port is taken: start fails with the bind error, and port 0 is off. */
static void test_admin_bind(void **state)
{
	struct srv s = { 0 };
	struct srv_admin *a = NULL, *b = (struct srv_admin *)&s;
	uint16_t port = free_port();

	(void)state;
	assert_int_equal(srv_admin_start(&s, "127.0.0.1", port, &a), 0);
	assert_int_equal(srv_admin_start(&s, "127.0.0.1", port, &b), -EADDRINUSE);
	assert_ptr_equal(b, (struct srv_admin *)&s);
	srv_admin_stop(a);
	assert_int_equal(srv_admin_start(&s, "127.0.0.1", 0, &b), 0);
	assert_null(b);
	assert_int_equal(srv_admin_start(&s, "no.such.host.invalid", port, &b), -EINVAL);
	srv_admin_stop(NULL);
}

/* Cumulative counts at power-of-two bounds are exact. */
static void test_hist_below(void **state)
{
	struct srv_hist h = { 0 };

	(void)state;
	srv_hist_record(&h, 7);
	srv_hist_record(&h, 8);
	srv_hist_record(&h, 15);
	srv_hist_record(&h, 16);
	srv_hist_record(&h, 1023);
	srv_hist_record(&h, 1024);
	assert_int_equal(srv_metrics_hist_below(&h, 8), 1);
	assert_int_equal(srv_metrics_hist_below(&h, 16), 3);
	assert_int_equal(srv_metrics_hist_below(&h, 32), 4);
	assert_int_equal(srv_metrics_hist_below(&h, 1024), 5);
	assert_int_equal(srv_metrics_hist_below(&h, 2048), 6);
	assert_int_equal(h.sum_us, 7 + 8 + 15 + 16 + 1023 + 1024);
}

/* Namespace names are escaped as label values; the histogram has its
 * +Inf bucket, sum and count. */
static void test_metrics_text(void **state)
{
	struct srv_stats *ops = calloc(1, sizeof(*ops));
	struct store_stats st = { .capacity_bytes = 1 };
	struct store_ns_stats ns = { .name = "a\"b\\c", .blocks = 3 };
	struct srv_stats_doc d = { .version = "0.1.0", .protocol = 1, .ops = ops, .store = &st,
				   .ns = &ns, .ns_count = 1 };
	struct evbuffer *out = evbuffer_new();
	char *text;

	(void)state;
	assert_non_null(ops);
	srv_hist_record(&ops->lat[SRV_LAT_GET], 100);
	srv_hist_record(&ops->lat[SRV_LAT_GET], 3000000);
	assert_int_equal(srv_metrics_write(&d, out), 0);
	assert_int_equal(evbuffer_add(out, "", 1), 0);
	text = (char *)evbuffer_pullup(out, -1);
	assert_non_null(strstr(text, "kvpool_namespace_blocks{namespace=\"a\\\"b\\\\c\"} 3\n"));
	assert_non_null(strstr(text, "# TYPE kvpool_request_duration_seconds histogram\n"));
	assert_non_null(strstr(text, "kvpool_request_duration_seconds_bucket{op=\"get\",le=\"0.000128\"} 1\n"));
	assert_non_null(strstr(text, "kvpool_request_duration_seconds_bucket{op=\"get\",le=\"4.194304\"} 2\n"));
	assert_non_null(strstr(text, "kvpool_request_duration_seconds_bucket{op=\"get\",le=\"+Inf\"} 2\n"));
	assert_non_null(strstr(text, "kvpool_request_duration_seconds_sum{op=\"get\"} 3.000100\n"));
	assert_non_null(strstr(text, "kvpool_nvme_enabled 0\n"));
	assert_null(strstr(text, "tier=\"nvme\""));
	evbuffer_free(out);
	free(ops);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_admin_states),
		cmocka_unit_test(test_admin_bind),
		cmocka_unit_test(test_hist_below),
		cmocka_unit_test(test_metrics_text),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
