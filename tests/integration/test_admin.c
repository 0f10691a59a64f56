/*
 * test_admin.c - the admin HTTP server of a real kvpoold (with an NVMe
 * tier, so every metric family shows): /healthz, /stats and /metrics
 * after a scripted workload, promtool accepting /metrics, exact agreement
 * of `kvpool stats --json`, /stats and /metrics, the health and
 * drop-namespace subcommands, and /healthz while the server drains.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
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
#include <json-c/json.h>

#include "harness.h"

#define BLOCK_BYTES (64 * 1024)
#define CHAIN_BLOCKS 96         /* per namespace: 2 x 6 MiB against 4 MiB of DRAM */
#define HTTP_TIMEOUT_MS 5000

static struct harness_server srv;
static char nvme_dir[256];
static char admin_port_text[16];
static uint16_t admin_port;
static const char *flags[] = {
	"--dram-capacity", "4MiB", "--max-block-bytes", "256KiB", "--threads", "2",
	"--log-level", "warn", "--nvme-dir", nvme_dir, "--nvme-capacity", "64MiB",
	"--nvme-segment-size", "2MiB", "--admin-port", admin_port_text, NULL,
};

/* ---- a small HTTP client ---------------------------------------------------- */

struct http_reply {
	int status;
	char *body;     /* malloc'd, NUL-terminated */
};

/* A free loopback port (bound, read back and released). */
static int free_port(uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0), err = 0;

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		err = -errno;
	else
		*port = ntohs(sa.sin_port);
	close(fd);
	return err;
}

/* Send `method path` (HTTP/1.0) to the admin port and read the whole
 * reply. Errors: -errno of connect/send/recv, -ETIMEDOUT, -EPROTO. */
static int http_request(const char *method, const char *path, struct http_reply *out)
{
	char req[512], *buf = NULL, *sep;
	size_t have = 0, cap = 0;
	int fd, n, err = harness_raw_connect(admin_port, &fd);
	uint64_t deadline = harness_now_ms() + HTTP_TIMEOUT_MS;

	if (err)
		return err;
	n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method, path);
	err = harness_send_all(fd, req, (size_t)n);
	while (!err) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (have + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap = cap ? cap * 2 : 65536);

			if (!nb) {
				err = -ENOMEM;
				break;
			}
			buf = nb;
		}
		if (poll(&p, 1, (int)(deadline - harness_now_ms())) <= 0 ||
		    harness_now_ms() >= deadline) {
			err = -ETIMEDOUT;
			break;
		}
		r = recv(fd, buf + have, cap - have - 1, 0);
		if (r == 0)
			break;
		if (r < 0)
			err = -errno;
		else
			have += (size_t)r;
	}
	close(fd);
	if (!err && (!buf || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1))
		err = -EPROTO;
	if (!err) {
		buf[have] = '\0';
		sep = strstr(buf, "\r\n\r\n");
		if (!sep)
			err = -EPROTO;
		else
			out->body = strdup(sep + 4);
	}
	free(buf);
	if (!err && !out->body)
		err = -ENOMEM;
	return err;
}

/* GET path, failing the test on a transport error. */
static struct http_reply get_or_fail(const char *path)
{
	struct http_reply r = { 0 };

	assert_int_equal(http_request("GET", path, &r), 0);
	return r;
}

/* ---- fixtures ------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	if (harness_tmpdir("admin", nvme_dir, sizeof(nvme_dir)) < 0 || free_port(&admin_port) < 0)
		return -1;
	snprintf(admin_port_text, sizeof(admin_port_text), "%u", admin_port);
	return harness_group_start(&srv, flags);
}

static int group_teardown(void **state)
{
	(void)state;
	harness_kill(&srv);
	harness_rm_rf(nvme_dir);
	return 0;
}

/* ---- the scripted workload -------------------------------------------------- */

/* Put a chain of CHAIN_BLOCKS in ns (demotions follow: DRAM is small),
 * then get every block and some that are not there, ask EXISTS and
 * MATCH, put the first block again (EXISTS result), delete the tail. */
static void workload(const char *ns, const char *tag)
{
	static uint8_t keys[CHAIN_BLOCKS + 8][32];
	uint8_t *buf = malloc(BLOCK_BYTES);
	struct kvpool_client *c;
	size_t matched = 0;
	int st[8];

	assert_non_null(buf);
	assert_int_equal(harness_client(&srv, ns, &c), 0);
	for (uint32_t i = 0; i < CHAIN_BLOCKS + 8; i++)
		harness_key(keys[i], tag, i);
	for (uint32_t i = 0; i < CHAIN_BLOCKS; i++) {
		struct iovec iov = { .iov_base = buf, .iov_len = BLOCK_BYTES };
		struct kvpool_put_block b = { .key = keys[i], .parent = i ? keys[i - 1] : NULL,
					      .iov = &iov, .iovcnt = 1 };

		int rc;

		harness_fill(buf, BLOCK_BYTES, harness_key_seed(keys[i]));
		/* BUSY while demotions free DRAM: counted, and retried. */
		for (int tries = 0; (rc = kvpool_put(c, &b, 1, NULL)) == -EAGAIN && tries < 500; tries++)
			harness_sleep_ms(10);
		assert_int_equal(rc, 0);
	}
	for (uint32_t i = 0; i < CHAIN_BLOCKS; i += 3) {
		uint8_t *got = malloc(BLOCK_BYTES);
		uint64_t len = 0;
		int rc;

		assert_non_null(got);
		harness_fill(buf, BLOCK_BYTES, harness_key_seed(keys[i]));
		/* A block on NVMe may find no DRAM to promote into: BUSY, retried. */
		for (int tries = 0; (rc = kvpool_get_bytes(c, keys[i], got, BLOCK_BYTES, &len)) == -EAGAIN &&
				    tries < 500; tries++)
			harness_sleep_ms(10);
		assert_int_equal(rc, 0);
		assert_int_equal(len, BLOCK_BYTES);
		assert_memory_equal(got, buf, BLOCK_BYTES);
		free(got);
	}
	assert_int_equal(kvpool_get_bytes(c, keys[CHAIN_BLOCKS + 1], buf, BLOCK_BYTES, NULL), -ENOENT);
	assert_int_equal(kvpool_exists(c, keys[CHAIN_BLOCKS - 4], 8, st), 0);
	assert_int_equal(kvpool_match(c, keys, CHAIN_BLOCKS + 4, 0, &matched), 0);
	assert_int_equal(matched, CHAIN_BLOCKS);
	harness_fill(buf, BLOCK_BYTES, harness_key_seed(keys[0]));
	assert_int_equal(kvpool_put_bytes(c, keys[0], NULL, buf, BLOCK_BYTES), 0);
	assert_int_equal(kvpool_delete(c, keys[CHAIN_BLOCKS - 2], 1, NULL), 0);
	assert_int_equal(kvpool_ping(c, NULL), 0);
	kvpool_close(c);
	free(buf);
}

/* Wait until /stats stops moving (demotions run in the background and
 * the clients' connections close asynchronously): two documents 300 ms
 * apart equal but for uptime. Returns the last, parsed. */
static struct json_object *settled_stats_or_fail(void)
{
	struct json_object *prev = NULL, *doc;

	for (int i = 0; i < 100; i++) {
		struct http_reply r = get_or_fail("/stats");

		assert_int_equal(r.status, 200);
		doc = json_tokener_parse(r.body);
		free(r.body);
		assert_non_null(doc);
		json_object_object_del(doc, "uptime_s");
		if (prev && json_object_equal(prev, doc) &&
		    harness_json_u64_or_fail(doc, "connections.current") == 0) {
			json_object_put(prev);
			return doc;
		}
		json_object_put(prev);
		prev = doc;
		harness_sleep_ms(300);
	}
	fail_msg("/stats never settled");
	return NULL;
}

/* ---- the metrics text ---------------------------------------------------------- */

struct sample {
	char *key;     /* name{labels} as written */
	double value;
	int used;      /* matched against the JSON */
};

struct samples {
	struct sample *s;
	size_t n;
};

/* Parse every sample line (not comments) of the exposition text. */
static void parse_metrics_or_fail(const char *text, struct samples *out)
{
	const char *p = text;

	memset(out, 0, sizeof(*out));
	while (*p) {
		const char *eol = strchr(p, '\n'), *sp;

		if (!eol)
			eol = p + strlen(p);
		if (*p != '#' && eol > p) {
			sp = eol;
			while (sp > p && sp[-1] != ' ')
				sp--;
			assert_true(sp > p + 1);
			out->s = realloc(out->s, (out->n + 1) * sizeof(*out->s));
			assert_non_null(out->s);
			out->s[out->n].key = strndup(p, (size_t)(sp - 1 - p));
			out->s[out->n].value = strtod(sp, NULL);
			out->s[out->n].used = 0;
			out->n++;
		}
		p = *eol ? eol + 1 : eol;
	}
}

static void samples_free(struct samples *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->s[i].key);
	free(m->s);
}

/* The value of sample `key`; fails the test when it is missing. */
static double sample_or_fail(struct samples *m, const char *key)
{
	for (size_t i = 0; i < m->n; i++) {
		if (!strcmp(m->s[i].key, key)) {
			m->s[i].used = 1;
			return m->s[i].value;
		}
	}
	fail_msg("metric %s missing", key);
	return 0;
}

/* A number (integer, double or boolean) at a dotted path of doc. */
static double json_number_or_fail(struct json_object *doc, const char *path)
{
	char buf[512], *save = NULL;
	struct json_object *o = doc;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save))
		if (!json_object_object_get_ex(o, k, &o))
			fail_msg("%s missing from /stats", path);
	if (json_object_is_type(o, json_type_boolean))
		return json_object_get_boolean(o) ? 1 : 0;
	if (json_object_is_type(o, json_type_int))
		return (double)json_object_get_uint64(o);
	assert_true(json_object_is_type(o, json_type_double));
	return json_object_get_double(o);
}

/* Assert metric `key` equals the JSON figure at path divided by divisor.
 * A division, not a product with 1/divisor: 9 / 1000.0 is the double
 * nearest 0.009, as parsed from the metric text, but 9 * 0.001 is not. */
static void agree(struct samples *m, struct json_object *doc, const char *key, const char *path,
		  double divisor)
{
	double want = json_number_or_fail(doc, path) / divisor, got = sample_or_fail(m, key);

	if (got != want)
		fail_msg("%s = %.6f but /stats %s = %.6f", key, got, path, want);
}

/* Every metric against /stats, then: no sample left unchecked but the
 * histograms and the three with no JSON twin. */
static void metrics_agree_or_fail(struct samples *m, struct json_object *doc)
{
	static const char *const top[][2] = {
		{ "kvpool_connections", "connections.current" },
		{ "kvpool_connections_accepted_total", "connections.total" },
		{ "kvpool_connections_rejected_total", "connections.rejected" },
		{ "kvpool_dram_free_bytes", "tiers.dram.free_bytes" },
		{ "kvpool_dram_largest_free_bytes", "tiers.dram.largest_free_bytes" },
		{ "kvpool_dram_fragmentation_ratio", "tiers.dram.fragmentation" },
		{ "kvpool_dram_inflight_put_bytes", "tiers.dram.inflight_put_bytes" },
		{ "kvpool_dram_evict_passes_total", "tiers.dram.evict_passes" },
		{ "kvpool_blocks", "blocks" },
		{ "kvpool_index_bytes", "index_bytes" },
		{ "kvpool_evictions_total", "evictions" },
		{ "kvpool_leases_active", "leases_active" },
		{ "kvpool_checksum_errors_total", "checksum_errors" },
		{ "kvpool_put_blocks_total", "ops.put.blocks" },
		{ "kvpool_put_results_total{result=\"ok\"}", "ops.put.ok" },
		{ "kvpool_put_results_total{result=\"exists\"}", "ops.put.exists" },
		{ "kvpool_put_results_total{result=\"error\"}", "ops.put.errors" },
		{ "kvpool_put_payload_bytes_total", "ops.put.bytes" },
		{ "kvpool_get_blocks_total{result=\"hit\"}", "ops.get.hits" },
		{ "kvpool_get_blocks_total{result=\"miss\"}", "ops.get.misses" },
		{ "kvpool_get_payload_bytes_total", "ops.get.bytes" },
		{ "kvpool_exists_blocks_total{result=\"hit\"}", "ops.exists.hits" },
		{ "kvpool_exists_blocks_total{result=\"miss\"}", "ops.exists.misses" },
		{ "kvpool_match_blocks_queried_total", "ops.match.blocks_queried" },
		{ "kvpool_match_blocks_matched_total", "ops.match.blocks_matched" },
		{ "kvpool_delete_blocks_total", "ops.delete.blocks" },
		{ "kvpool_nvme_enabled", "tiers.nvme.enabled" },
		{ "kvpool_nvme_healthy", "tiers.nvme.healthy" },
		{ "kvpool_nvme_direct_io", "tiers.nvme.direct_io" },
		{ "kvpool_nvme_segment_bytes", "tiers.nvme.segment_bytes" },
		{ "kvpool_nvme_demotions_total", "tiers.nvme.demotions" },
		{ "kvpool_nvme_demoted_bytes_total", "tiers.nvme.demoted_bytes" },
		{ "kvpool_nvme_promotions_total", "tiers.nvme.promotions" },
		{ "kvpool_nvme_promoted_bytes_total", "tiers.nvme.promoted_bytes" },
		{ "kvpool_nvme_written_bytes_total", "tiers.nvme.bytes_written" },
		{ "kvpool_nvme_read_bytes_total", "tiers.nvme.bytes_read" },
		{ "kvpool_nvme_rewritten_bytes_total", "tiers.nvme.rewritten_bytes" },
		{ "kvpool_nvme_segments_reclaimed_total", "tiers.nvme.segments_reclaimed" },
		{ "kvpool_nvme_admission_rejections_total", "tiers.nvme.admission_rejections" },
		{ "kvpool_nvme_evictions_total", "tiers.nvme.evictions" },
		{ "kvpool_nvme_corrupt_blocks_total", "tiers.nvme.corrupt_blocks" },
		{ "kvpool_nvme_read_errors_total", "tiers.nvme.read_errors" },
		{ "kvpool_nvme_write_errors_total", "tiers.nvme.write_errors" },
		{ "kvpool_nvme_rebuild_blocks", "tiers.nvme.rebuild_blocks" },
		{ "kvpool_nvme_rebuild_orphans_dropped", "tiers.nvme.orphans_dropped" },
		{ "kvpool_nvme_rebuild_truncated", "tiers.nvme.rebuild_truncated" },
		{ "kvpool_nvme_index_records_lost", "tiers.nvme.index_records_lost" },
		{ "kvpool_nvme_index_quarantined", "tiers.nvme.index_quarantined" },
		{ "kvpool_rdma_connections", "rdma.connections.current" },
		{ "kvpool_rdma_connections_total", "rdma.connections.total" },
		{ "kvpool_rdma_read_bytes_total", "rdma.bytes_read" },
		{ "kvpool_rdma_written_bytes_total", "rdma.bytes_written" },
		{ "kvpool_rdma_transfer_errors_total", "rdma.transfer_errors" },
		{ "kvpool_retained_blocks", "retention.retained_blocks" },
		{ "kvpool_retained_bytes", "retention.retained_bytes" },
		{ "kvpool_retain_refused_total", "retention.refused" },
		{ "kvpool_retain_expired_total", "retention.expired" },
		{ "kvpool_max_retained_bytes", "retention.max_retained_bytes" },
		{ "kvpool_match_waiting", "ops.match.waits.waiting" },
		{ "kvpool_match_wait_bytes", "ops.match.waits.bytes" },
		{ "kvpool_match_waits_total", "ops.match.waits.started" },
		{ "kvpool_match_wait_results_total{result=\"complete\"}", "ops.match.waits.complete" },
		{ "kvpool_match_wait_results_total{result=\"timeout\"}", "ops.match.waits.timeout" },
		{ "kvpool_match_wait_results_total{result=\"refused\"}", "ops.match.waits.refused" },
		{ "kvpool_match_wait_results_total{result=\"ended\"}", "ops.match.waits.ended" },
		{ "kvpool_match_wait_clamped_total", "ops.match.waits.clamped" },
	};
	static const char *const tiers[] = { "capacity_bytes", "used_bytes", "payload_bytes", "blocks" };
	static const char *const ops[] = { "put", "get", "exists", "match", "delete", "ping", "stats" };
	static const char *const errs[] = { "bad_request", "too_large", "busy", "full" };
	static const char *const ns_fields[][2] = {
		{ "blocks", "blocks" }, { "nvme_blocks", "nvme_blocks" }, { "payload_bytes", "bytes" },
		{ "put_results_total{result=\"ok\"}", "puts" },
		{ "put_results_total{result=\"exists\"}", "put_exists" },
		{ "put_results_total{result=\"error\"}", "put_errors" },
		{ "get_blocks_total{result=\"hit\"}", "get_hits" },
		{ "get_blocks_total{result=\"miss\"}", "get_misses" },
		{ "exists_blocks_total{result=\"hit\"}", "exists_hits" },
		{ "exists_blocks_total{result=\"miss\"}", "exists_misses" },
		{ "match_requests_total", "match_requests" },
		{ "match_blocks_queried_total", "match_blocks_queried" },
		{ "match_blocks_matched_total", "match_blocks_matched" },
		{ "evictions_total", "evictions" }, { "deleted_blocks_total", "deletes" },
		{ "retained_blocks", "retained_blocks" }, { "retained_bytes", "retained_bytes" },
		{ "retain_budget_bytes", "retain_budget_bytes" },
		{ "retain_refused_total", "retain_refused" },
		{ "retain_expired_total", "retain_expired" },
	};
	struct json_object *nss;
	char key[512], path[512];
	size_t n_ns = 0;

	for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
		agree(m, doc, top[i][0], top[i][1], 1);
	agree(m, doc, "kvpool_nvme_rebuild_seconds", "tiers.nvme.rebuild_ms", 1000);
	agree(m, doc, "kvpool_dram_evict_pass_max_seconds", "tiers.dram.evict_pass_max_us", 1000000);
	for (size_t i = 0; i < 4; i++) {
		static const char *const t[] = { "dram", "nvme" };

		for (size_t j = 0; j < 2; j++) {
			snprintf(key, sizeof(key), "kvpool_tier_%s{tier=\"%s\"}", tiers[i], t[j]);
			snprintf(path, sizeof(path), "tiers.%s.%s", t[j], tiers[i]);
			agree(m, doc, key, path, 1);
		}
	}
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		snprintf(key, sizeof(key), "kvpool_requests_total{op=\"%s\"}", ops[i]);
		snprintf(path, sizeof(path), "ops.%s.requests", ops[i]);
		agree(m, doc, key, path, 1);
	}
	for (size_t i = 0; i < 4; i++) {
		snprintf(key, sizeof(key), "kvpool_errors_total{status=\"%s\"}", errs[i]);
		snprintf(path, sizeof(path), "ops.errors.%s", errs[i]);
		agree(m, doc, key, path, 1);
	}
	assert_true(json_object_object_get_ex(doc, "namespaces", &nss));
	json_object_object_foreach(nss, name, v) {
		(void)v;
		n_ns++;
		for (size_t i = 0; i < sizeof(ns_fields) / sizeof(ns_fields[0]); i++) {
			const char *f = ns_fields[i][0], *brace = strchr(f, '{');

			if (brace)
				snprintf(key, sizeof(key), "kvpool_namespace_%.*s{namespace=\"%s\",%s",
					 (int)(brace - f), f, name, brace + 1);
			else
				snprintf(key, sizeof(key), "kvpool_namespace_%s{namespace=\"%s\"}", f, name);
			snprintf(path, sizeof(path), "namespaces.%s.%s", name, ns_fields[i][1]);
			agree(m, doc, key, path, 1);
		}
	}
	assert_true(sample_or_fail(m, "kvpool_namespaces") == (double)n_ns);
	sample_or_fail(m, "kvpool_uptime_seconds");
	sample_or_fail(m, "kvpool_build_info{version=\"" KVPOOL_VERSION "\",protocol=\"2\"}");
	for (size_t i = 0; i < m->n; i++)
		if (!m->s[i].used && strncmp(m->s[i].key, "kvpool_request_duration_seconds", 31) &&
		    strncmp(m->s[i].key, "kvpool_match_wake_seconds", 25))
			fail_msg("metric %s is not checked against /stats", m->s[i].key);
}

/* The wake-up histogram: buckets never decrease, +Inf equals _count. */
static void wake_histogram_sane_or_fail(const struct samples *m)
{
	double last = 0, inf_v = -1, count_v = -2;

	for (size_t i = 0; i < m->n; i++) {
		if (!strncmp(m->s[i].key, "kvpool_match_wake_seconds_bucket{", 33)) {
			assert_true(m->s[i].value >= last);
			last = m->s[i].value;
		}
		if (!strcmp(m->s[i].key, "kvpool_match_wake_seconds_bucket{le=\"+Inf\"}"))
			inf_v = m->s[i].value;
		if (!strcmp(m->s[i].key, "kvpool_match_wake_seconds_count"))
			count_v = m->s[i].value;
	}
	assert_true(inf_v == count_v);
	assert_true(inf_v == last);
}

/* Each histogram: buckets never decrease, +Inf equals _count. */
static void histograms_sane_or_fail(const struct samples *m)
{
	static const char *const ops[] = { "put", "get", "exists", "match" };

	for (size_t o = 0; o < 4; o++) {
		char prefix[128], inf[160], count[160];
		double last = 0, inf_v = -1, count_v = -2;

		snprintf(prefix, sizeof(prefix), "kvpool_request_duration_seconds_bucket{op=\"%s\",", ops[o]);
		snprintf(inf, sizeof(inf), "%sle=\"+Inf\"}", prefix);
		snprintf(count, sizeof(count), "kvpool_request_duration_seconds_count{op=\"%s\"}", ops[o]);
		for (size_t i = 0; i < m->n; i++) {
			if (!strncmp(m->s[i].key, prefix, strlen(prefix))) {
				assert_true(m->s[i].value >= last);
				last = m->s[i].value;
			}
			if (!strcmp(m->s[i].key, inf))
				inf_v = m->s[i].value;
			if (!strcmp(m->s[i].key, count))
				count_v = m->s[i].value;
		}
		assert_true(inf_v == count_v);
		assert_true(inf_v == last);
	}
}

/* Fail naming the first path where a and b differ (objects: same keys,
 * members equal; anything else: json_object_equal). */
static void json_same_or_fail(struct json_object *a, struct json_object *b, const char *path)
{
	char sub[512];

	if (json_object_is_type(a, json_type_object) && json_object_is_type(b, json_type_object)) {
		json_object_object_foreach(a, k, va) {
			struct json_object *vb;

			snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", k);
			if (!json_object_object_get_ex(b, k, &vb))
				fail_msg("%s: only in kvpool stats --json", sub);
			json_same_or_fail(va, vb, sub);
		}
		if (json_object_object_length(a) != json_object_object_length(b))
			fail_msg("%s: /stats has keys kvpool stats --json has not", path);
		return;
	}
	if (!json_object_equal(a, b))
		fail_msg("%s: kvpool stats --json says %s, /stats %s", path,
			 json_object_to_json_string(a), json_object_to_json_string(b));
}

/* ---- tests ----------------------------------------------------------------------- */

static void test_healthz_serving(void **state)
{
	struct http_reply r;

	(void)state;
	harness_need_server(&srv);
	r = get_or_fail("/healthz");
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body, "serving\n");
	free(r.body);
}

static void test_http_errors(void **state)
{
	struct http_reply r = { 0 };

	(void)state;
	harness_need_server(&srv);
	r = get_or_fail("/nope");
	assert_int_equal(r.status, 404);
	free(r.body);
	r = get_or_fail("/stats?namespace=a%20b");
	assert_int_equal(r.status, 400);
	free(r.body);
	r = get_or_fail("/");
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "/metrics"));
	free(r.body);
	memset(&r, 0, sizeof(r));
	assert_int_equal(http_request("POST", "/stats", &r), 0);
	assert_true(r.status == 405 || r.status == 501);
	free(r.body);
}

/* `kvpool stats --json`, /stats and /metrics agree exactly after a
 * workload in two namespaces. The CLI's document differs from /stats in
 * uptime and in its own connection (open, with index memory for its
 * lease holder), nothing else. */
static void test_agreement(void **state)
{
	char *out = NULL, url_arg[96];
	struct json_object *cli, *doc, *one;
	struct http_reply r;
	struct samples m;
	int status;

	(void)state;
	harness_need_server(&srv);
	workload("tenant-a", "a");
	workload("tenant-b", "b");
	json_object_put(settled_stats_or_fail());
	snprintf(url_arg, sizeof(url_arg), "%s", srv.url);
	{
		char *argv[] = { (char *)getenv("KVPOOL_CLI"), "stats", "--json", "--server", url_arg,
				 NULL };

		if (!argv[0])
			harness_skip("KVPOOL_CLI is not set");
		assert_int_equal(harness_run(argv, 10000, &out, &status), 0);
		assert_int_equal(status, 0);
	}
	cli = json_tokener_parse(out);
	free(out);
	assert_non_null(cli);
	doc = settled_stats_or_fail();
	r = get_or_fail("/metrics");
	assert_int_equal(r.status, 200);
	parse_metrics_or_fail(r.body, &m);
	free(r.body);
	/* The workload shows where it should. */
	assert_true(harness_json_u64_or_fail(doc, "tiers.nvme.demotions") > 0);
	assert_int_equal(harness_json_u64_or_fail(doc, "ops.put.exists"), 2);
	/* Every PUT block had BLOCK_BYTES, whatever its result (BUSY too). */
	assert_int_equal(harness_json_u64_or_fail(doc, "ops.put.bytes"),
			 BLOCK_BYTES * (harness_json_u64_or_fail(doc, "ops.put.ok") +
					harness_json_u64_or_fail(doc, "ops.put.exists") +
					harness_json_u64_or_fail(doc, "ops.put.errors")));
	assert_int_equal(harness_json_u64_or_fail(doc, "ops.put.ok"), 2 * CHAIN_BLOCKS);
	assert_int_equal(harness_json_u64_or_fail(doc, "namespaces.tenant-a.get_misses"), 1);
	metrics_agree_or_fail(&m, doc);
	histograms_sane_or_fail(&m);
	wake_histogram_sane_or_fail(&m);
	samples_free(&m);
	/* CLI vs /stats: the same but for uptime and its own connection. */
	assert_int_equal(harness_json_u64_or_fail(cli, "connections.current"), 1);
	json_object_object_del(cli, "uptime_s");
	assert_true(json_object_object_get_ex(cli, "connections", &one));
	json_object_object_add(one, "current", json_object_new_int64(0));
	/* Its connection's lease holder is index memory too, freed since. */
	assert_true(harness_json_u64_or_fail(cli, "index_bytes") >=
		    harness_json_u64_or_fail(doc, "index_bytes"));
	json_object_object_add(cli, "index_bytes",
			       json_object_new_int64((int64_t)harness_json_u64_or_fail(doc, "index_bytes")));
	json_same_or_fail(cli, doc, "");
	json_object_put(cli);
	json_object_put(doc);
}

/* /metrics passes promtool's checks (Debian package prometheus). */
static void test_promtool(void **state)
{
	char path[300], *out = NULL, cmd[400];
	struct http_reply r;
	int status;
	FILE *f;

	(void)state;
	harness_need_server(&srv);
	if (system("command -v promtool >/dev/null 2>&1") != 0)
		harness_skip("promtool is not installed (apt-get install prometheus)");
	r = get_or_fail("/metrics");
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "namespace=\"tenant-a\""));
	snprintf(path, sizeof(path), "%s/metrics.txt", nvme_dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(r.body, f);
	fclose(f);
	free(r.body);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
	{
		char *argv[] = { "/bin/sh", "-c", cmd, NULL };

		assert_int_equal(harness_run(argv, 30000, &out, &status), 0);
	}
	/* promtool exits 0 and prints nothing when every lint passes. */
	if (status != 0 || out[0])
		fail_msg("promtool check metrics (exit %d):\n%s", status, out);
	free(out);
	unlink(path);
}

/* Every kvpool_ name in a query of docker/grafana-dashboard.json is a
 * family /metrics serves (with an NVMe tier, so all of them show). */
static void test_dashboard_metrics(void **state)
{
	const char *data = getenv("KVPOOL_TEST_DATA");
	char path[512], name[128];
	struct json_object *dash;
	struct http_reply r;
	FILE *f;
	char *text;
	long len;
	int names = 0;

	(void)state;
	harness_need_server(&srv);
	if (!data)
		harness_skip("KVPOOL_TEST_DATA is not set");
	snprintf(path, sizeof(path), "%s/../../docker/grafana-dashboard.json", data);
	f = fopen(path, "r");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)len + 1);
	assert_non_null(text);
	assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	dash = json_tokener_parse(text);
	assert_non_null(dash);
	json_object_put(dash);
	r = get_or_fail("/metrics");
	assert_int_equal(r.status, 200);
	for (const char *p = strstr(text, "kvpool_"); p; p = strstr(p + 1, "kvpool_")) {
		size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
		char line[160];

		if (n >= sizeof(name) || p[n] == '-')
			continue; /* the dashboard's uid, not a metric */
		memcpy(name, p, n);
		name[n] = '\0';
		snprintf(line, sizeof(line), "\n%s", name);
		if (!strstr(r.body, line))
			fail_msg("dashboard uses %s, which /metrics does not serve", name);
		names++;
	}
	assert_true(names >= 10);
	free(r.body);
	free(text);
}

/* Run the CLI with args; returns its exit status. */
static int run_cli(char *const *args, char **out)
{
	char *argv[16] = { (char *)getenv("KVPOOL_CLI") };
	int status, i;

	if (!argv[0])
		harness_skip("KVPOOL_CLI is not set");
	for (i = 0; args[i] && i < 14; i++)
		argv[i + 1] = args[i];
	argv[i + 1] = NULL;
	assert_int_equal(harness_run(argv, 20000, out, &status), 0);
	return status;
}

static void test_cli_health(void **state)
{
	char admin[64], *out = NULL;
	uint16_t dead;

	(void)state;
	harness_need_server(&srv);
	snprintf(admin, sizeof(admin), "127.0.0.1:%u", admin_port);
	assert_int_equal(run_cli((char *[]){ "health", "--server", srv.url, NULL }, &out), 0);
	assert_non_null(strstr(out, "healthy"));
	free(out);
	assert_int_equal(run_cli((char *[]){ "health", "--admin", admin, NULL }, &out), 0);
	assert_non_null(strstr(out, "serving"));
	free(out);
	/* Nobody listens on a port just released: unhealthy, exit 1. */
	assert_int_equal(free_port(&dead), 0);
	snprintf(admin, sizeof(admin), "tcp://127.0.0.1:%u", dead);
	assert_int_equal(run_cli((char *[]){ "health", "--server", admin, NULL }, &out), 1);
	assert_non_null(strstr(out, "unhealthy"));
	free(out);
	snprintf(admin, sizeof(admin), "127.0.0.1:%u", dead);
	assert_int_equal(run_cli((char *[]){ "health", "--admin", admin, NULL }, &out), 1);
	free(out);
	/* A usage mistake is unhealthy too, never 2 (reserved by HEALTHCHECK). */
	assert_int_equal(run_cli((char *[]){ "health", "--bogus", NULL }, &out), 1);
	free(out);
}

static void test_cli_drop_namespace(void **state)
{
	struct kvpool_client *c;
	char *out = NULL, query[64];
	uint8_t key[32];
	struct http_reply r;
	struct json_object *doc;

	(void)state;
	harness_need_server(&srv);
	assert_int_equal(harness_client(&srv, "dropme", &c), 0);
	for (uint32_t i = 0; i < 5; i++) {
		harness_key(key, "drop", i);
		assert_int_equal(kvpool_put_bytes(c, key, NULL, "x", 1), 0);
	}
	kvpool_close(c);
	assert_int_equal(run_cli((char *[]){ "drop-namespace", "--server", srv.url, "dropme", NULL },
				 &out), 0);
	assert_string_equal(out, "dropped namespace dropme: 5 blocks\n");
	free(out);
	snprintf(query, sizeof(query), "/stats?namespace=dropme");
	r = get_or_fail(query);
	assert_int_equal(r.status, 200);
	doc = json_tokener_parse(r.body);
	free(r.body);
	assert_non_null(doc);
	assert_int_equal(harness_json_u64_or_fail(doc, "namespaces.dropme.blocks"), 0);
	json_object_put(doc);
}

/* SIGTERM while a PUT's payload is still arriving: the server drains
 * (the admin port says 503 "draining"), the PUT completes, and the
 * server exits 0. Last: the server is gone after it. */
static void test_healthz_draining(void **state)
{
	static uint8_t data[4096];
	struct harness_frame f = { 0 };
	struct proto_result res;
	struct http_reply r = { 0 };
	uint8_t key[32];
	int fd, draining = 0;

	(void)state;
	harness_need_server(&srv);
	fd = harness_raw_session_or_fail(srv.port, "drain", NULL);
	harness_key(key, "drain", 0);
	harness_fill(data, sizeof(data), 7);
	assert_int_equal(harness_raw_put(fd, 1, key, NULL, data, sizeof(data),
					 harness_xxh3(data, sizeof(data)), 100), 0);
	harness_sleep_ms(100);
	assert_int_equal(kill(srv.pid, SIGTERM), 0);
	for (int i = 0; i < 100 && !draining; i++) {
		memset(&r, 0, sizeof(r));
		assert_int_equal(http_request("GET", "/healthz", &r), 0);
		draining = r.status == 503 && !strcmp(r.body, "draining\n");
		free(r.body);
		if (!draining)
			harness_sleep_ms(20);
	}
	assert_true(draining);
	assert_int_equal(harness_send_all(fd, data + 100, sizeof(data) - 100), 0);
	assert_int_equal(harness_read_frame(fd, 5000, &f), 0);
	assert_int_equal(f.h.status, PROTO_STATUS_OK);
	assert_int_equal(harness_reply_result(&f, 0, &res), 0);
	assert_int_equal(res.status, PROTO_STATUS_OK);
	harness_frame_free(&f);
	close(fd);
	assert_int_equal(harness_stop(&srv), 0);
}

/* Sockets kvpoold (pid) holds open now. */
static int socket_fds(pid_t pid)
{
	char dir[64], path[320], link[64];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	assert_non_null(d);
	while ((e = readdir(d))) {
		ssize_t len;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			n += strncmp(link, "socket:", 7) == 0;
		}
	}
	closedir(d);
	return n;
}

/* Issue 20 item 6: 100 clients that send half a request each hold at most
 * 16 admin connections (the rest wait in the backlog, not in kvpoold's
 * descriptors); once they go, /healthz answers again. */
static void test_admin_connection_cap(void **state)
{
	static const char half[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
	int fds[100], before, during = 0;

	(void)state;
	harness_need_server(&srv);
	before = socket_fds(srv.pid);
	for (int i = 0; i < 100; i++) {
		assert_int_equal(harness_raw_connect(admin_port, &fds[i]), 0);
		assert_int_equal(harness_send_all(fds[i], half, sizeof(half) - 1), 0);
	}
	for (int i = 0; i < 50 && during < before + 16; i++) {
		usleep(20 * 1000);
		during = socket_fds(srv.pid);
	}
	usleep(200 * 1000);
	during = socket_fds(srv.pid);
	if (during - before > 16 || during - before < 14)
		fail_msg("kvpoold holds %d admin sockets for 100 half requests; want 14..16",
			 during - before);
	for (int i = 0; i < 100; i++)
		close(fds[i]);
	{
		struct http_reply r = get_or_fail("/healthz");

		assert_int_equal(r.status, 200);
		free(r.body);
	}
	for (int i = 0; i < 100 && socket_fds(srv.pid) > before; i++)
		usleep(20 * 1000);
	assert_true(socket_fds(srv.pid) <= before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_healthz_serving),
		cmocka_unit_test(test_http_errors),
		cmocka_unit_test(test_agreement),
		cmocka_unit_test(test_promtool),
		cmocka_unit_test(test_dashboard_metrics),
		cmocka_unit_test(test_cli_health),
		cmocka_unit_test(test_cli_drop_namespace),
		cmocka_unit_test(test_admin_connection_cap),
		cmocka_unit_test(test_healthz_draining),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
