/*
 * test_client.c - libkvpool: URL parsing, kvpool_strerror, checksums, and
 * the client against the fake server of fake_server.h speaking protocol v1
 * (and v2: the _ex calls) on a loopback port (status mapping, splitting and pipelining, protocol
 * errors, checksum mismatch, timeouts, reconnects, local refusals, bad
 * scatter-gather lists, the length of a block too large for its buffer).
 */
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "fake_server.h"
#include "kvpool.h"
#include "lib/api/testing.h"
#include "lib/url.h"
#include "proto.h"

/* Regions registered with a handle (what the test sees of its table). */
static size_t n_regions(const struct kvpool_client *c)
{
	struct kvc_engine_info i;

	kvc_info(c, &i);
	return i.n_regions;
}

/* ---- fixture: a fake server and a client connected to it ------------------ */

struct env {
	struct fake fk;
	struct kvpool_client *c;
	char url[64];
};

static int env_open(struct env *e, const struct proto_hello_reply *limits, int mode)
{
	struct kvpool_options opts = { .token = "secret", .timeout_ms = 3000 };

	memset(e, 0, sizeof(*e));
	e->fk.limits = *limits;
	atomic_store(&e->fk.mode, mode);
	fake_start(&e->fk, 0);
	snprintf(e->url, sizeof(e->url), "tcp://127.0.0.1:%u", (unsigned)e->fk.port);
	return kvpool_connect(e->url, "test-ns", &opts, &e->c);
}

static void env_close(struct env *e)
{
	kvpool_close(e->c);
	fake_stop(&e->fk);
	fake_release(&e->fk);
}

static int setup(void **state)
{
	struct env *e = malloc(sizeof(*e));

	if (!e || env_open(e, &fake_default_limits, MODE_NORMAL)) {
		free(e);
		return -1;
	}
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	env_close(*state);
	free(*state);
	return 0;
}

/* A deterministic key and payload for block i. */
static void make_key(uint8_t key[KVPOOL_KEY_BYTES], int i)
{
	memset(key, 0, KVPOOL_KEY_BYTES);
	key[0] = 0xAB;
	key[1] = (uint8_t)i;
	key[31] = (uint8_t)(i * 7 + 1);
}

static void fill_payload(uint8_t *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + (size_t)seed * 17 + (i >> 8));
}

/* Put `count` contiguous blocks of `len` bytes, keys make_key(base + i). */
static int put_simple(struct kvpool_client *c, int base, int count, size_t len, int *st)
{
	struct kvpool_put_block b[32];
	struct iovec iov[32];
	uint8_t keys[32][KVPOOL_KEY_BYTES];
	uint8_t *data = malloc(len * (size_t)count + 1);
	int rc;

	assert_true(count <= 32);
	for (int i = 0; i < count; i++) {
		make_key(keys[i], base + i);
		fill_payload(data + len * (size_t)i, len, base + i);
		iov[i] = (struct iovec){ .iov_base = data + len * (size_t)i, .iov_len = len };
		b[i] = (struct kvpool_put_block){ .key = keys[i], .parent = i ? keys[i - 1] : NULL,
						  .iov = &iov[i], .iovcnt = 1 };
	}
	rc = kvpool_put(c, b, (size_t)count, st);
	free(data);
	return rc;
}

static double elapsed_ms(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* ---- pure functions ------------------------------------------------------- */

static void test_url_good(void **state)
{
	struct kvc_url u;

	(void)state;
	assert_int_equal(kvc_url_parse("tcp://localhost:7471", &u), 0);
	assert_string_equal(u.host, "localhost");
	assert_int_equal(u.port, 7471);
	assert_string_equal(u.port_str, "7471");
	assert_int_equal(kvc_url_parse("tcp://10.1.2.3", &u), 0);
	assert_string_equal(u.host, "10.1.2.3");
	assert_int_equal(u.port, 7470);
	assert_int_equal(kvc_url_parse("tcp://[::1]:9000", &u), 0);
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 9000);
	assert_int_equal(kvc_url_parse("tcp://[fe80::1%eth0]", &u), 0);
	assert_string_equal(u.host, "fe80::1%eth0");
	assert_int_equal(u.port, 7470);
	assert_int_equal(kvc_url_parse("TCP://pool-01.example.com:65535", &u), 0);
	assert_string_equal(u.host, "pool-01.example.com");
	assert_int_equal(u.port, 65535);
	assert_int_equal(u.transport, KVC_TRANSPORT_TCP);
}

static void test_url_bad(void **state)
{
	static const char *const invalid[] = {
		"", "tcp://", "tcp://:7470", "tcp://host:", "tcp://host:0", "tcp://host:65536",
		"tcp://host:12x", "tcp://host:-1", "tcp://[::1", "tcp://[]:1", "tcp://[1.2.3.4]",
		"tcp://::1:7470", "tcp://host:7470/path", "tcp://host name", "host:7470",
		"//host:7470", "tcp:/host", "tcp://host:99999999999999999999",
	};
	static const char *const unsupported[] = {
		"http://host:80", "rdmax://host", "aut://host",
	};
	struct kvc_url u = { .port = 4242 };

	(void)state;
	for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++)
		if (kvc_url_parse(invalid[i], &u) != -EINVAL)
			fail_msg("'%s' not refused with -EINVAL", invalid[i]);
	for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
		assert_int_equal(kvc_url_parse(unsupported[i], &u), -EOPNOTSUPP);
	assert_int_equal(kvc_url_parse(NULL, &u), -EINVAL);
	assert_int_equal(u.port, 4242); /* untouched on error */
}

/* rdma:// defaults to the RDMA port, auto:// to the TCP port. */
static void test_url_rdma_auto(void **state)
{
	struct kvc_url u;

	(void)state;
	assert_int_equal(kvc_url_parse("rdma://10.0.0.1", &u), 0);
	assert_int_equal(u.transport, KVC_TRANSPORT_RDMA);
	assert_int_equal(u.port, KVC_URL_DEFAULT_RDMA_PORT);
	assert_int_equal(kvc_url_parse("RDMA://[fe80::1]:9000", &u), 0);
	assert_string_equal(u.host, "fe80::1");
	assert_int_equal(u.port, 9000);
	assert_int_equal(kvc_url_parse("auto://host", &u), 0);
	assert_int_equal(u.transport, KVC_TRANSPORT_AUTO);
	assert_int_equal(u.port, KVC_URL_DEFAULT_PORT);
	assert_string_equal(u.port_str, "7470");
	assert_int_equal(kvc_url_parse("rdma://host:0", &u), -EINVAL);
}

/* Every errno the library can return has its own description. */
static void test_strerror(void **state)
{
	static const int shared[] = { ECONNREFUSED, ECONNRESET, ETIMEDOUT, EPIPE, EPROTO,
				      EACCES, ENOMEM, EINVAL, EOPNOTSUPP, ENOENT, ENODEV };
	const char *unknown = kvpool_strerror(-123456);

	(void)state;
	assert_string_equal(unknown, "unknown error");
	assert_non_null(kvpool_strerror(0));
	assert_string_not_equal(kvpool_strerror(0), unknown);
	for (uint16_t s = 0; s <= PROTO_STATUS_MAX; s++) {
		int err = proto_status_to_errno(s);

		assert_non_null(kvpool_strerror(err));
		if (err && strcmp(kvpool_strerror(err), unknown) == 0)
			fail_msg("status %s (%d) has no description", proto_status_name(s), err);
		for (uint16_t t = 0; t < s; t++)
			if (proto_status_to_errno(t) != err && proto_status_to_errno(t) &&
			    err && strcmp(kvpool_strerror(proto_status_to_errno(t)),
					  kvpool_strerror(err)) == 0)
				fail_msg("statuses %u and %u share a description", t, s);
	}
	/* A miss is the common case: it reads as one, nothing more. */
	assert_string_equal(kvpool_strerror(-ENOENT), "not found");
	for (size_t i = 0; i < sizeof(shared) / sizeof(shared[0]); i++) {
		assert_string_not_equal(kvpool_strerror(-shared[i]), unknown);
		assert_string_equal(kvpool_strerror(shared[i]), kvpool_strerror(-shared[i]));
	}
}

/* Every -E... that kvpool.h lists (read from the header itself, so a value
 * added there without a description fails here) has a description of its
 * own: -EPERM, -EINPROGRESS and -E2BIG used to read "unknown error". */
static void test_strerror_covers_the_header(void **state)
{
	static const struct { const char *name; int value; } known[] = {
		{ "E2BIG", E2BIG }, { "EACCES", EACCES }, { "EAGAIN", EAGAIN },
		{ "EBADMSG", EBADMSG }, { "EBUSY", EBUSY }, { "ECANCELED", ECANCELED },
		{ "ECONNREFUSED", ECONNREFUSED }, { "ECONNRESET", ECONNRESET },
		{ "EDQUOT", EDQUOT }, { "EEXIST", EEXIST }, { "EINPROGRESS", EINPROGRESS },
		{ "EINVAL", EINVAL }, { "EIO", EIO }, { "EMFILE", EMFILE },
		{ "EMSGSIZE", EMSGSIZE }, { "ENODEV", ENODEV }, { "ENOENT", ENOENT },
		{ "ENOLINK", ENOLINK }, { "ENOMEM", ENOMEM }, { "ENOSPC", ENOSPC },
		{ "EOPNOTSUPP", EOPNOTSUPP }, { "EPERM", EPERM }, { "EPIPE", EPIPE },
		{ "EPROTO", EPROTO }, { "ETIMEDOUT", ETIMEDOUT }, { "ENOTCONN", ENOTCONN },
		{ "EHOSTDOWN", EHOSTDOWN }, { "ENXIO", ENXIO },
	};
	FILE *f = fopen("client/kvpool.h", "r");
	char line[1024];
	int seen = 0;

	(void)state;
	assert_non_null(f); /* the tests run from the source tree's root */
	while (fgets(line, sizeof(line), f)) {
		for (char *p = line; (p = strstr(p, "-E")) != NULL; p += 2) {
			char name[32];
			size_t n = 0;
			size_t i;

			while (n + 1 < sizeof(name) && ((p[1 + n] >= 'A' && p[1 + n] <= 'Z') ||
							(p[1 + n] >= '0' && p[1 + n] <= '9')))
				name[n] = p[1 + n], n++;
			name[n] = '\0';
			if (n < 2)
				continue;
			for (i = 0; i < sizeof(known) / sizeof(known[0]); i++)
				if (strcmp(known[i].name, name) == 0)
					break;
			if (i == sizeof(known) / sizeof(known[0]))
				fail_msg("kvpool.h lists -%s: add it to this test's table", name);
			if (strcmp(kvpool_strerror(-known[i].value), "unknown error") == 0)
				fail_msg("kvpool_strerror(-%s) is \"unknown error\"", name);
			seen++;
		}
	}
	fclose(f);
	assert_true(seen > 20);
	/* a full local queue and a server's BUSY share -EAGAIN: the words
	 * name both, the local one with what to do */
	assert_non_null(strstr(kvpool_strerror(-EAGAIN), "max_inflight"));
	assert_non_null(strstr(kvpool_strerror(-EAGAIN), "poll some first"));
}

/* The checksum over a scatter-gather list equals that of the same bytes
 * contiguous, however they are split (empty pieces included). */
static void test_checksum_iov(void **state)
{
	static uint8_t buf[10007];
	struct iovec iov[8];
	uint64_t whole;

	(void)state;
	fill_payload(buf, sizeof(buf), 3);
	whole = XXH3_64bits(buf, sizeof(buf));
	iov[0] = (struct iovec){ buf, sizeof(buf) };
	assert_true(kvpool_checksum(iov, 1) == whole);
	iov[0] = (struct iovec){ buf, 1 };
	iov[1] = (struct iovec){ buf + 1, 0 };
	iov[2] = (struct iovec){ buf + 1, 4095 };
	iov[3] = (struct iovec){ buf + 4096, 3 };
	iov[4] = (struct iovec){ buf + 4099, sizeof(buf) - 4099 };
	iov[5] = (struct iovec){ NULL, 0 };
	assert_true(kvpool_checksum(iov, 6) == whole);
	buf[5000] ^= 0x80;
	assert_true(kvpool_checksum(iov, 6) != whole);
	assert_true(kvpool_checksum(NULL, 0) == XXH3_64bits(NULL, 0));
}

static void test_connect_errors(void **state)
{
	struct kvpool_options opts = { .timeout_ms = 2000 };
	struct kvpool_client *c = (struct kvpool_client *)0x1;
	char long_ns[300], long_token[1100];
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	char url[64];
	int fd, rc;

	(void)state;
	memset(long_ns, 'n', sizeof(long_ns) - 1);
	long_ns[256] = '\0';
	memset(long_token, 't', sizeof(long_token) - 1);
	long_token[sizeof(long_token) - 1] = '\0';
	assert_int_equal(kvpool_connect(NULL, "ns", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect(KVPOOL_DEFAULT_URL, "", NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect(KVPOOL_DEFAULT_URL, long_ns, NULL, &c), -EINVAL);
	assert_int_equal(kvpool_connect(KVPOOL_DEFAULT_URL, "a b", NULL, &c), -EINVAL);
	opts.token = long_token;
	assert_int_equal(kvpool_connect(KVPOOL_DEFAULT_URL, "ns", &opts, &c), -EINVAL);
	opts.token = NULL;
	/* rdma:// here: no device (or RDMA=0), so no handle. */
	rc = kvpool_connect("rdma://127.0.0.1", "ns", &opts, &c);
	assert_true(rc == -EOPNOTSUPP || rc == -ENODEV);
	assert_ptr_equal(c, (struct kvpool_client *)0x1);
	assert_int_equal(kvpool_connect("tcp://", "ns", &opts, &c), -EINVAL);
	assert_int_equal(kvpool_connect("tcp://no-such-host.invalid:1", "ns", &opts, &c), -ENOENT);
	/* A port nobody listens on: bind one, note it, close it. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
	assert_int_equal(kvpool_connect(url, "ns", &opts, &c), -ECONNREFUSED);
	assert_ptr_equal(c, (struct kvpool_client *)0x1); /* untouched on error */
	kvpool_close(NULL);
}

/* ---- against the fake server --------------------------------------------- */

/* HELLO carries namespace and token; the reply's limits are adopted. */
static void test_hello_limits(void **state)
{
	struct env *e = *state;
	struct kvpool_limits l;

	assert_int_equal(kvpool_get_limits(e->c, &l), 0);
	assert_int_equal(l.max_batch_blocks, 4);
	assert_int_equal(l.max_block_bytes, 64 * 1024);
	assert_int_equal(l.max_frame_bytes, 64 * 1024);
	assert_int_equal(l.max_lease_ms, 5000);
	assert_int_equal(l.protocol_version, 1);
	assert_string_equal(e->fk.hello_ns, "test-ns");
	assert_string_equal(e->fk.hello_token, "secret");
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_HELLO]), 1);
}

static void test_hello_refused(void **state)
{
	struct env e;

	(void)state;
	assert_int_equal(env_open(&e, &fake_default_limits, MODE_HELLO_DENIED), -EACCES);
	e.c = NULL;
	env_close(&e);
	assert_int_equal(env_open(&e, &fake_default_limits, MODE_HELLO_OLD), -EOPNOTSUPP);
	e.c = NULL;
	env_close(&e);
}

/* Ten chained blocks, each in three pieces, go in three frames (4 per
 * frame) and come back byte-exact into differently split buffers. */
static void test_put_get_split(void **state)
{
	struct env *e = *state;
	enum { N = 10, LEN = 3000 };
	static uint8_t src[N][LEN], dst[N][LEN + 100];
	uint8_t keys[N][KVPOOL_KEY_BYTES];
	struct iovec piov[N][3], giov[N][2];
	struct kvpool_put_block pb[N];
	struct kvpool_get_block gb[N];
	int st[N];

	for (int i = 0; i < N; i++) {
		make_key(keys[i], i);
		fill_payload(src[i], LEN, i);
		piov[i][0] = (struct iovec){ src[i], 100 };
		piov[i][1] = (struct iovec){ src[i] + 100, 1000 };
		piov[i][2] = (struct iovec){ src[i] + 1100, LEN - 1100 };
		pb[i] = (struct kvpool_put_block){ keys[i], i ? keys[i - 1] : NULL, piov[i], 3, 0 };
		giov[i][0] = (struct iovec){ dst[i], 7 };
		giov[i][1] = (struct iovec){ dst[i] + 7, sizeof(dst[i]) - 7 };
		gb[i] = (struct kvpool_get_block){ keys[i], giov[i], 2, 0 };
	}
	assert_int_equal(kvpool_put(e->c, pb, N, st), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 3);
	assert_int_equal(atomic_load(&e->fk.put_blocks), N);
	assert_int_equal(kvpool_get(e->c, gb, N, st), 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_GET]), 3);
	for (int i = 0; i < N; i++) {
		assert_int_equal(st[i], 0);
		assert_int_equal(gb[i].length, LEN);
		assert_memory_equal(dst[i], src[i], LEN);
	}
	/* A put of stored keys is a success ("already stored"). */
	assert_int_equal(kvpool_put(e->c, pb, N, NULL), 0);
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* Frames are pipelined: the server reads three requests before it
 * answers the first, which only works if the client does not wait. */
static void test_pipelining(void **state)
{
	struct env *e = *state;
	int st[10];

	e->fk.hold = 3;
	atomic_store(&e->fk.mode, MODE_HOLD);
	assert_int_equal(put_simple(e->c, 0, 10, 500, st), 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 3);
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* A frame's payload stays within the server's in-flight put bytes. */
static void test_inflight_split(void **state)
{
	struct proto_hello_reply lim = fake_default_limits;
	struct env e;
	int st[8];

	(void)state;
	lim.max_inflight_put_bytes = 3000;
	assert_int_equal(env_open(&e, &lim, MODE_NORMAL), 0);
	assert_int_equal(put_simple(e.c, 0, 8, 1000, st), 0);
	assert_int_equal(atomic_load(&e.fk.frames[PROTO_OP_PUT]), 3); /* 3 + 3 + 2 */
	assert_int_equal(atomic_load(&e.fk.put_blocks), 8);
	env_close(&e);
}

/* Every wire status maps to its errno, per block. */
static void test_status_mapping(void **state)
{
	static const int expect[PROTO_STATUS_MAX + 1] = {
		0, 0, -ENOENT, -ENOLINK, -ENOSPC, -EDQUOT, -EAGAIN, -EMSGSIZE,
		-EACCES, -EPROTO, -EIO, -EOPNOTSUPP, -EBADMSG,
	};
	struct env *e = *state;
	enum { N = PROTO_STATUS_MAX + 1 };
	uint8_t keys[N][KVPOOL_KEY_BYTES];
	int st[N];

	/* Mapping only: BUSY is not retried here (test_busy_* do that). */
	kvpool_set_busy_tries(e->c, 1);
	for (int i = 0; i < N; i++) {
		e->fk.status_table[i] = (uint16_t)i;
		make_key(keys[i], i);
	}
	e->fk.n_status = N;
	atomic_store(&e->fk.mode, MODE_STATUSES);
	assert_int_equal(put_simple(e->c, 0, N, 64, st), -ENOENT);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], expect[i]);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 4);
	memset(st, 0x55, sizeof(st));
	e->fk.status_next = 0;
	assert_int_equal(kvpool_exists(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])keys, N, st), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(st[i], expect[i]);
	assert_true(kvc_connected(e->c));
}

/* A whole-request error reply sets every block of its frames; the
 * connection stays usable and the server's message is kept. */
static void test_whole_request_error(void **state)
{
	struct env *e = *state;
	int st[6];

	atomic_store(&e->fk.mode, MODE_REFUSE);
	assert_int_equal(put_simple(e->c, 0, 6, 100, st), -EAGAIN);
	for (int i = 0; i < 6; i++)
		assert_int_equal(st[i], -EAGAIN);
	assert_string_equal(kvc_server_message(e->c), FAKE_BUSY_MESSAGE);
	assert_true(kvc_connected(e->c));
	atomic_store(&e->fk.mode, MODE_NORMAL);
	assert_int_equal(kvpool_ping(e->c, NULL), 0);
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* ---- backpressure: BUSY is retried with backoff, the rest is not -------- */

static struct kvpool_counters counters(struct kvpool_client *c)
{
	struct kvpool_counters k;

	assert_int_equal(kvpool_get_counters(c, &k), 0);
	return k;
}

/* A block answered BUSY three times is sent a fourth time and stored; the
 * call succeeds and the handle counts three retries. */
static void test_busy_put_retried(void **state)
{
	struct env *e = *state;
	int st[1] = { 1 };

	atomic_store(&e->fk.busy_puts, 3);
	assert_int_equal(put_simple(e->c, 0, 1, 500, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 4);
	assert_int_equal(e->fk.n_blocks, 1);
	assert_int_equal(counters(e->c).busy_retries, 3);
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* Only what was BUSY is sent again, with the in-call children that came
 * back NO_PARENT because of it; blocks already stored are not resent. */
static void test_busy_retries_children(void **state)
{
	struct env *e = *state;
	int st[6];

	atomic_store(&e->fk.check_parents, 1);
	assert_int_equal(put_simple(e->c, 0, 2, 300, st), 0); /* blocks 0, 1 stored */
	/* Blocks 0..5: 0 and 1 are there; 2 is BUSY, so 3..5 are NO_PARENT. */
	atomic_store(&e->fk.busy_puts, 1);
	assert_int_equal(put_simple(e->c, 0, 6, 300, st), 0);
	for (int i = 0; i < 6; i++)
		assert_int_equal(st[i], 0);
	/* 2 + 6 entries, then 2..5 again. */
	assert_int_equal(atomic_load(&e->fk.put_blocks), 2 + 6 + 4);
	assert_int_equal(e->fk.n_blocks, 6);
	assert_int_equal(counters(e->c).busy_retries, 1);
}

/* A server busy for good: KVPOOL_BUSY_TRIES tries with growing waits
 * (each in the upper half of 5, 10, ... 250 ms), then -EAGAIN; with
 * kvpool_set_busy_tries(1), -EAGAIN at once. */
static void test_busy_gives_up(void **state)
{
	struct env *e = *state;
	struct timespec t0;
	int st[2];
	double ms;

	atomic_store(&e->fk.busy_puts, 1000000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(put_simple(e->c, 0, 2, 100, st), -EAGAIN);
	ms = elapsed_ms(&t0);
	assert_int_equal(st[0], -EAGAIN);
	assert_int_equal(st[1], -EAGAIN);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), KVPOOL_BUSY_TRIES);
	assert_int_equal(counters(e->c).busy_retries, KVPOOL_BUSY_TRIES - 1);
	/* Waits of at least 2+5+10+20+40+80+125 ms, at most 565 ms. */
	assert_true(ms >= 280 && ms < 2000);

	kvpool_set_busy_tries(e->c, 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(put_simple(e->c, 0, 2, 100, st), -EAGAIN);
	assert_true(elapsed_ms(&t0) < 200);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), KVPOOL_BUSY_TRIES + 1);
	assert_int_equal(counters(e->c).busy_retries, KVPOOL_BUSY_TRIES - 1);
	assert_true(kvc_connected(e->c));
}

/* Retries never take a call past its timeout. All KVPOOL_BUSY_TRIES
 * tries would wait at least ~280 ms between them (each wait is at least
 * half its nominal 5, 10, ... 250 ms), so with a 150 ms timeout fewer
 * tries than that prove the deadline stopped them; the elapsed bound has
 * room for a loaded machine's scheduling delays. */
static void test_busy_within_timeout(void **state)
{
	struct env *e = *state;
	struct timespec t0;
	int st[1];

	kvpool_set_timeout(e->c, 150);
	atomic_store(&e->fk.busy_puts, 1000000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(put_simple(e->c, 0, 1, 100, st), -EAGAIN);
	assert_true(elapsed_ms(&t0) < 150 + 350);
	assert_true(atomic_load(&e->fk.frames[PROTO_OP_PUT]) < KVPOOL_BUSY_TRIES);
	assert_true(atomic_load(&e->fk.frames[PROTO_OP_PUT]) >= 2);
}

/* A whole request refused BUSY is sent again, for every batch call:
 * GET, EXISTS, MATCH and DELETE. */
static void test_busy_whole_requests_retried(void **state)
{
	struct env *e = *state;
	uint8_t keys[3][KVPOOL_KEY_BYTES], buf[3][400];
	struct kvpool_get_block gb[3];
	struct iovec iov[3];
	int st[3];
	size_t m = 0;

	assert_int_equal(put_simple(e->c, 0, 3, 400, st), 0);
	for (int i = 0; i < 3; i++) {
		make_key(keys[i], i);
		iov[i] = (struct iovec){ buf[i], sizeof(buf[i]) };
		gb[i] = (struct kvpool_get_block){ keys[i], &iov[i], 1, 0 };
	}
	atomic_store(&e->fk.refuse_next, 2);
	assert_int_equal(kvpool_get(e->c, gb, 3, st), 0);
	for (int i = 0; i < 3; i++) {
		uint8_t want[400];

		fill_payload(want, sizeof(want), i);
		assert_int_equal(st[i], 0);
		assert_memory_equal(buf[i], want, sizeof(want));
	}
	atomic_store(&e->fk.refuse_next, 1);
	assert_int_equal(kvpool_exists(e->c, keys, 3, st), 0);
	assert_int_equal(st[2], 0);
	atomic_store(&e->fk.refuse_next, 1);
	assert_int_equal(kvpool_match(e->c, keys, 3, 0, &m), 0);
	assert_int_equal(m, 3);
	atomic_store(&e->fk.refuse_next, 1);
	assert_int_equal(kvpool_delete(e->c, keys, 3, st), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(st[i], 0); /* not NOT_FOUND: each deleted once */
	assert_int_equal(e->fk.n_blocks, 0);
	assert_int_equal(counters(e->c).busy_retries, 5);
	/* Busy for good: -EAGAIN for the call and each key. */
	atomic_store(&e->fk.refuse_next, 1000000);
	assert_int_equal(kvpool_exists(e->c, keys, 3, st), -EAGAIN);
	assert_int_equal(st[0], -EAGAIN);
	assert_int_equal(kvpool_match(e->c, keys, 3, 0, &m), -EAGAIN);
	atomic_store(&e->fk.refuse_next, 0);
}

/* FULL, TOO_LARGE, DENIED and QUOTA go to the caller at once. */
static void test_busy_only_is_retried(void **state)
{
	static const uint16_t table[4] = { PROTO_STATUS_FULL, PROTO_STATUS_TOO_LARGE,
					   PROTO_STATUS_DENIED, PROTO_STATUS_QUOTA };
	struct env *e = *state;
	int st[4];

	memcpy(e->fk.status_table, table, sizeof(table));
	e->fk.n_status = 4;
	atomic_store(&e->fk.mode, MODE_STATUSES);
	assert_int_equal(put_simple(e->c, 0, 4, 64, st), -ENOSPC);
	assert_int_equal(st[0], -ENOSPC);
	assert_int_equal(st[1], -EMSGSIZE);
	assert_int_equal(st[2], -EACCES);
	assert_int_equal(st[3], -EDQUOT);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 1);
	assert_int_equal(counters(e->c).busy_retries, 0);
}

/* A server at its connection limit (connection-level BUSY, then close)
 * is dialled again with backoff; the handle ends up connected once. */
static void test_busy_connect_retried(void **state)
{
	struct kvpool_options opts = { .timeout_ms = 3000 };
	struct kvpool_counters k;
	struct kvpool_client *c = NULL;
	struct env e;

	(void)state;
	assert_int_equal(env_open(&e, &fake_default_limits, MODE_NORMAL), 0);
	atomic_store(&e.fk.busy_connects, 2);
	assert_int_equal(kvpool_connect(e.url, "busy-ns", &opts, &c), 0);
	assert_int_equal(kvpool_ping(c, NULL), 0);
	assert_int_equal(kvpool_get_counters(c, &k), 0);
	assert_int_equal(k.connects, 1);
	assert_int_equal(k.reconnects, 0);
	assert_int_equal(k.busy_retries, 2);
	assert_int_equal(atomic_load(&e.fk.connections), 1 + 3);
	kvpool_close(c);
	/* Turned away every time: -EAGAIN, within the timeout. */
	atomic_store(&e.fk.busy_connects, 1000);
	kvpool_set_busy_tries(e.c, 3);
	kvpool_set_timeout(e.c, 3000);
	atomic_store(&e.fk.mode, MODE_CLOSE);
	assert_true(kvpool_ping(e.c, NULL) < 0); /* the old connection is closed */
	assert_int_equal(kvpool_ping(e.c, NULL), -EAGAIN);
	assert_int_equal(kvpool_get_counters(NULL, &k), -EINVAL);
	env_close(&e);
}

/* A reply with the wrong request id is a protocol error; the handle
 * disconnects and the next call reconnects. */
static void test_wrong_request_id(void **state)
{
	struct env *e = *state;
	uint64_t rtt = 0;
	int st[2];

	atomic_store(&e->fk.mode, MODE_WRONG_ID);
	assert_int_equal(kvpool_ping(e->c, NULL), -EPROTO);
	assert_false(kvc_connected(e->c));
	assert_int_equal(put_simple(e->c, 0, 2, 100, st), -EPROTO);
	assert_int_equal(st[0], -EPROTO);
	assert_int_equal(st[1], -EPROTO);
	atomic_store(&e->fk.mode, MODE_NORMAL);
	assert_int_equal(kvpool_ping(e->c, &rtt), 0);
	assert_true(rtt > 0);
	assert_int_equal(atomic_load(&e->fk.connections), 3);
}

/* A GET reply cut short is an error, never data. */
static void test_truncated_reply(void **state)
{
	struct env *e = *state;
	uint8_t key[KVPOOL_KEY_BYTES], buf[4096];
	uint64_t len = 12345;
	int st[1];

	assert_int_equal(put_simple(e->c, 0, 1, 2000, st), 0);
	make_key(key, 0);
	atomic_store(&e->fk.mode, MODE_TRUNCATE_GET);
	assert_int_equal(kvpool_get_bytes(e->c, key, buf, sizeof(buf), &len), -ECONNRESET);
	assert_int_equal(len, 12345);
	assert_false(kvc_connected(e->c));
	atomic_store(&e->fk.mode, MODE_NORMAL);
	assert_int_equal(kvpool_get_bytes(e->c, key, buf, sizeof(buf), &len), 0);
	assert_int_equal(len, 2000);
}

/* Bytes that do not match their checksum are -EBADMSG and counted. */
static void test_checksum_mismatch(void **state)
{
	struct env *e = *state;
	uint8_t keys[2][KVPOOL_KEY_BYTES], buf[2][1000];
	struct iovec iov[2] = { { buf[0], 1000 }, { buf[1], 1000 } };
	struct kvpool_get_block gb[2] = { { keys[0], &iov[0], 1, 0 }, { keys[1], &iov[1], 1, 0 } };
	int st[2];

	assert_int_equal(put_simple(e->c, 0, 2, 1000, st), 0);
	make_key(keys[0], 0);
	make_key(keys[1], 1);
	atomic_store(&e->fk.mode, MODE_CORRUPT_GET);
	assert_int_equal(kvpool_get(e->c, gb, 2, st), -EBADMSG);
	assert_int_equal(st[0], -EBADMSG);
	assert_int_equal(st[1], 0);
	assert_int_equal(gb[0].length, 0);
	assert_int_equal(gb[1].length, 1000);
	assert_int_equal(kvc_checksum_errors(e->c), 1);
	assert_true(kvc_connected(e->c));
}

/* A silent server gives -ETIMEDOUT within the per-call timeout. */
static void test_timeout(void **state)
{
	struct env *e = *state;
	struct timespec t0;
	size_t matched = 99;
	uint8_t key[1][KVPOOL_KEY_BYTES];
	double ms;

	make_key(key[0], 0);
	kvpool_set_timeout(e->c, 200);
	atomic_store(&e->fk.mode, MODE_SILENT);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(kvpool_ping(e->c, NULL), -ETIMEDOUT);
	ms = elapsed_ms(&t0);
	assert_true(ms >= 190 && ms < 2000);
	assert_false(kvc_connected(e->c));
	assert_int_equal(kvpool_match(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])key, 1, 0, &matched),
			 -ETIMEDOUT);
	assert_int_equal(matched, 99);
	atomic_store(&e->fk.mode, MODE_NORMAL);
	assert_int_equal(kvpool_ping(e->c, NULL), 0);
}

/* The server closes the connection: the call fails, the next reconnects. */
static void test_reconnect_after_close(void **state)
{
	struct env *e = *state;
	int rc;

	assert_int_equal(counters(e->c).reconnects, 0);
	atomic_store(&e->fk.mode, MODE_CLOSE);
	rc = kvpool_ping(e->c, NULL);
	assert_true(rc == -ECONNRESET || rc == -EPIPE);
	assert_int_equal(kvpool_ping(e->c, NULL), 0);
	assert_int_equal(atomic_load(&e->fk.connections), 2);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_HELLO]), 2);
	assert_int_equal(counters(e->c).connects, 2);
	assert_int_equal(counters(e->c).reconnects, 1);
}

/* After a server restart a call fails fast and a later one reconnects. */
static void test_server_restart(void **state)
{
	struct env *e = *state;
	uint16_t port = e->fk.port;
	struct timespec t0;
	int rc;

	assert_int_equal(kvpool_ping(e->c, NULL), 0);
	fake_stop(&e->fk);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = kvpool_ping(e->c, NULL);
	assert_true(rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNREFUSED);
	assert_int_equal(kvpool_ping(e->c, NULL), -ECONNREFUSED);
	assert_true(elapsed_ms(&t0) < 1000);
	fake_start(&e->fk, port);
	assert_int_equal(kvpool_ping(e->c, NULL), 0);
	assert_true(kvc_connected(e->c));
}

/* Oversize and empty blocks are refused locally and never sent. */
static void test_local_refusal(void **state)
{
	struct proto_hello_reply lim = fake_default_limits;
	static uint8_t big[2048], small[100];
	uint8_t keys[3][KVPOOL_KEY_BYTES];
	struct iovec iov[3] = { { big, sizeof(big) }, { small, 0 }, { small, sizeof(small) } };
	struct kvpool_put_block pb[3];
	struct env e;
	int st[3];

	(void)state;
	lim.max_block_bytes = 1024;
	assert_int_equal(env_open(&e, &lim, MODE_NORMAL), 0);
	for (int i = 0; i < 3; i++) {
		make_key(keys[i], i);
		pb[i] = (struct kvpool_put_block){ keys[i], NULL, &iov[i], 1, 0 };
	}
	assert_int_equal(kvpool_put(e.c, pb, 1, st), -EMSGSIZE);
	assert_int_equal(st[0], -EMSGSIZE);
	assert_int_equal(atomic_load(&e.fk.frames[PROTO_OP_PUT]), 0);
	assert_int_equal(kvpool_put(e.c, pb, 3, st), -EMSGSIZE);
	assert_int_equal(st[0], -EMSGSIZE);
	assert_int_equal(st[1], -EMSGSIZE);
	assert_int_equal(st[2], 0);
	assert_int_equal(atomic_load(&e.fk.put_blocks), 1);
	assert_true(kvc_connected(e.c));
	env_close(&e);
}

/* A miss leaves the length alone; a buffer too small for a block is
 * -EMSGSIZE with the block's real length, so the caller can retry. */
static void test_get_miss_and_small_buffer(void **state)
{
	struct env *e = *state;
	uint8_t keys[2][KVPOOL_KEY_BYTES], buf[2][1000];
	struct iovec iov[2] = { { buf[0], 1000 }, { buf[1], 10 } };
	struct kvpool_get_block gb[2] = { { keys[0], &iov[0], 1, 0 }, { keys[1], &iov[1], 1, 0 } };
	uint64_t len = 7;
	int st[2];

	assert_int_equal(put_simple(e->c, 0, 2, 1000, st), 0);
	make_key(keys[0], 5);
	assert_int_equal(kvpool_get_bytes(e->c, keys[0], buf[0], sizeof(buf[0]), &len), -ENOENT);
	assert_int_equal(len, 7);
	make_key(keys[0], 0);
	assert_int_equal(kvpool_get_bytes(e->c, keys[0], buf[0], 999, &len), -EMSGSIZE);
	assert_int_equal(len, 1000);
	/* No buffer at all: just ask for the length. */
	len = 7;
	assert_int_equal(kvpool_get_bytes(e->c, keys[0], NULL, 0, &len), -EMSGSIZE);
	assert_int_equal(len, 1000);
	assert_int_equal(kvpool_get_bytes(e->c, keys[0], buf[0], len, &len), 0);
	assert_int_equal(len, 1000);
	/* In a batch: the block that fits comes back, the other says its size. */
	make_key(keys[1], 1);
	assert_int_equal(kvpool_get(e->c, gb, 2, st), -EMSGSIZE);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -EMSGSIZE);
	assert_int_equal(gb[0].length, 1000);
	assert_int_equal(gb[1].length, 1000);
	assert_true(kvc_connected(e->c));
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* A server that calls a block too large for a buffer it fits in would
 * send a caller retrying with the reported length round forever: it is a
 * protocol error. */
static void test_too_large_that_fits(void **state)
{
	struct env *e = *state;
	uint8_t key[KVPOOL_KEY_BYTES], buf[1000];
	uint64_t len = 7;
	int st[1];

	assert_int_equal(put_simple(e->c, 0, 1, 1000, st), 0);
	make_key(key, 0);
	atomic_store(&e->fk.mode, MODE_GET_TOO_LARGE);
	assert_int_equal(kvpool_get_bytes(e->c, key, buf, sizeof(buf), &len), -EPROTO);
	assert_int_equal(len, 7);
	assert_false(kvc_connected(e->c));
	/* Told the truth (too large for 999 bytes), it is an ordinary -EMSGSIZE. */
	assert_int_equal(kvpool_get_bytes(e->c, key, buf, 999, &len), -EMSGSIZE);
	assert_int_equal(len, 1000);
	assert_true(kvc_connected(e->c));
}

/* MATCH goes chunk by chunk and stops after a partial chunk. */
static void test_match_chunks(void **state)
{
	struct env *e = *state;
	uint8_t keys[10][KVPOOL_KEY_BYTES];
	size_t matched = 0;
	int st[6];

	assert_int_equal(put_simple(e->c, 0, 6, 10, st), 0);
	for (int i = 0; i < 10; i++)
		make_key(keys[i], i);
	assert_int_equal(kvpool_match(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])keys, 10, 100,
				      &matched), 0);
	assert_int_equal(matched, 6);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 2);
	assert_int_equal(kvpool_match(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])keys + 6, 4, 0,
				      &matched), 0);
	assert_int_equal(matched, 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 3);
	make_key(keys[1], 99); /* chain broken in the first chunk: one frame only */
	assert_int_equal(kvpool_match(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])keys, 10, 0,
				      &matched), 0);
	assert_int_equal(matched, 1);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 4);
}

static void test_exists_delete_stats_drop(void **state)
{
	struct env *e = *state;
	uint8_t keys[5][KVPOOL_KEY_BYTES];
	const uint8_t(*k)[KVPOOL_KEY_BYTES] = (const uint8_t(*)[KVPOOL_KEY_BYTES])keys;
	uint64_t dropped = 0;
	char *json = NULL;
	int st[5];

	assert_int_equal(put_simple(e->c, 0, 3, 10, st), 0);
	for (int i = 0; i < 5; i++)
		make_key(keys[i], i);
	assert_int_equal(kvpool_exists(e->c, k, 5, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[2], 0);
	assert_int_equal(st[3], -ENOENT);
	assert_int_equal(st[4], -ENOENT);
	assert_int_equal(kvpool_delete(e->c, k + 2, 2, st), 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], -ENOENT);
	assert_int_equal(kvpool_delete(e->c, k + 2, 1, NULL), 0);
	assert_int_equal(kvpool_stats(e->c, NULL, &json), 0);
	assert_non_null(strstr(json, "\"test-ns\":{\"blocks\":2,"));
	kvpool_free(json);
	assert_int_equal(kvpool_stats(e->c, "bad name", &json), -EINVAL);
	assert_int_equal(kvpool_drop_namespace(e->c, NULL, &dropped), 0);
	assert_int_equal(dropped, 2);
	assert_int_equal(kvpool_exists(e->c, k, 1, st), 0);
	assert_int_equal(st[0], -ENOENT);
}

static void test_invalid_args(void **state)
{
	struct env *e = *state;
	uint8_t key[KVPOOL_KEY_BYTES] = { 1 }, data[4] = { 0 };
	struct iovec iov = { data, sizeof(data) };
	struct kvpool_put_block pb[2] = { { key, NULL, &iov, 1, 0 }, { NULL, NULL, &iov, 1, 0 } };
	struct kvpool_get_block gb[1] = { { key, &iov, 0, 0 } };
	size_t matched;
	int st[2] = { 5, 5 };

	assert_int_equal(kvpool_put(e->c, pb, 2, st), -EINVAL);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(st[1], -EINVAL);
	assert_int_equal(kvpool_get(e->c, gb, 1, st), -EINVAL);
	assert_int_equal(kvpool_exists(e->c, (const uint8_t(*)[KVPOOL_KEY_BYTES])key, 1, NULL),
			 -EINVAL);
	assert_int_equal(kvpool_match(e->c, NULL, 1, 0, &matched), -EINVAL);
	assert_int_equal(kvpool_put(NULL, pb, 1, NULL), -EINVAL);
	assert_int_equal(kvpool_put(e->c, pb, 0, NULL), 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 0);
}

/* Scatter-gather lists the library cannot use are -EINVAL before anything
 * is sent, and the connection is kept: a NULL base under a nonzero
 * length (which crashed the checksum of a put and cost a get its
 * connection), and lengths whose sum overflows. */
static void test_invalid_iovecs(void **state)
{
	struct env *e = *state;
	uint8_t key[KVPOOL_KEY_BYTES], data[64] = { 1, 2, 3 };
	struct iovec null_base[2] = { { data, sizeof(data) }, { NULL, 100 } };
	struct iovec overflow[2] = { { data, SIZE_MAX }, { data, 2 } };
	struct iovec empty_piece[2] = { { data, sizeof(data) }, { NULL, 0 } };
	struct kvpool_put_block pb = { key, NULL, null_base, 2, 0 };
	struct kvpool_get_block gb = { key, &null_base[1], 1, 0 };
	uint64_t len = 7;
	int st[1] = { 5 };

	make_key(key, 0);
	assert_int_equal(kvpool_put(e->c, &pb, 1, st), -EINVAL);
	assert_int_equal(st[0], -EINVAL);
	pb.iov = overflow;
	assert_int_equal(kvpool_put(e->c, &pb, 1, NULL), -EINVAL);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_PUT]), 0);
	/* An empty piece with a NULL base is fine. */
	pb.iov = empty_piece;
	assert_int_equal(kvpool_put(e->c, &pb, 1, st), 0);
	assert_int_equal(kvpool_get(e->c, &gb, 1, st), -EINVAL);
	assert_int_equal(st[0], -EINVAL);
	assert_int_equal(gb.length, 0);
	gb.iov = overflow;
	gb.iovcnt = 2;
	assert_int_equal(kvpool_get(e->c, &gb, 1, NULL), -EINVAL);
	assert_int_equal(kvpool_get_bytes(e->c, key, NULL, 100, &len), -EINVAL);
	assert_int_equal(len, 7);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_GET]), 0);
	assert_true(kvc_connected(e->c));
	assert_int_equal(kvpool_get_bytes(e->c, key, data, sizeof(data), &len), 0);
	assert_int_equal(len, sizeof(data));
	assert_int_equal(atomic_load(&e->fk.connections), 1);
}

/* kvpool_register on TCP checks its arguments and keeps a table of
 * disjoint regions; nothing goes over the wire. */
static void test_register_args(void **state)
{
	struct env *e = *state;
	static uint8_t arena[4096];
	int frames_before = 0, frames_after = 0;

	for (int op = 0; op <= PROTO_OP_MAX; op++)
		frames_before += atomic_load(&e->fk.frames[op]);
	assert_int_equal(kvpool_register(NULL, arena, sizeof(arena)), -EINVAL);
	assert_int_equal(kvpool_register(e->c, NULL, sizeof(arena)), -EINVAL);
	assert_int_equal(kvpool_register(e->c, arena, 0), -EINVAL);
	/* A range that would run past the end of the address space. */
	assert_int_equal(kvpool_register(e->c, (void *)(UINTPTR_MAX - 15), 32), -EINVAL);
	assert_int_equal(kvpool_unregister(NULL, arena), -EINVAL);
	assert_int_equal(kvpool_unregister(e->c, NULL), -EINVAL);
	assert_int_equal(n_regions(e->c), 0);
	assert_int_equal(kvpool_register(e->c, arena, sizeof(arena)), 0);
	for (int op = 0; op <= PROTO_OP_MAX; op++)
		frames_after += atomic_load(&e->fk.frames[op]);
	assert_int_equal(frames_after, frames_before);
	assert_string_not_equal(kvpool_strerror(-EEXIST), kvpool_strerror(-123456));
}

/* Registering a range twice, or any overlap, is -EEXIST; unregistering
 * what was never registered (or not its start) is -ENOENT; a region can
 * be registered again once it is gone. */
static void test_register_table(void **state)
{
	struct env *e = *state;
	static uint8_t arena[3 * 4096];
	uint8_t *a = arena, *b = arena + 4096, *c = arena + 2 * 4096;

	assert_int_equal(kvpool_register(e->c, b, 4096), 0);
	assert_int_equal(kvpool_register(e->c, b, 4096), -EEXIST);   /* double */
	assert_int_equal(kvpool_register(e->c, b + 100, 10), -EEXIST); /* inside */
	assert_int_equal(kvpool_register(e->c, a + 4000, 200), -EEXIST); /* straddles start */
	assert_int_equal(kvpool_register(e->c, c - 1, 2), -EEXIST);  /* straddles end */
	assert_int_equal(kvpool_register(e->c, a, sizeof(arena)), -EEXIST); /* covers */
	/* Neighbours that touch but do not overlap are fine, in any order. */
	assert_int_equal(kvpool_register(e->c, c, 4096), 0);
	assert_int_equal(kvpool_register(e->c, a, 4096), 0);
	assert_int_equal(n_regions(e->c), 3);
	assert_non_null(kvc_region_find(e->c, b + 10, 100));
	assert_true(kvc_region_find(e->c, c, 4096)->start == (uintptr_t)c);
	assert_null(kvc_region_find(e->c, c + 4000, 200)); /* runs past the region */

	assert_int_equal(kvpool_unregister(e->c, b + 1), -ENOENT); /* not a start */
	assert_int_equal(kvpool_unregister(e->c, arena + sizeof(arena)), -ENOENT);
	assert_int_equal(kvpool_unregister(e->c, b), 0);
	assert_int_equal(kvpool_unregister(e->c, b), -ENOENT);  /* twice */
	assert_null(kvc_region_find(e->c, b + 10, 100));
	assert_int_equal(n_regions(e->c), 2);
	assert_int_equal(kvpool_register(e->c, b, 4096), 0);
	assert_int_equal(kvpool_unregister(e->c, a), 0);
	assert_int_equal(kvpool_unregister(e->c, b), 0);
	assert_int_equal(kvpool_unregister(e->c, c), 0);
	assert_int_equal(n_regions(e->c), 0);
}

/* Registered memory survives a reconnect and puts and gets through it
 * work as through any other memory; kvpool_close frees the table (ASan
 * would report a leak otherwise). */
static void test_register_use(void **state)
{
	struct env *e = *state;
	static uint8_t arena[2][8192], expect[8192];
	uint8_t key[KVPOOL_KEY_BYTES];
	uint64_t len = 0;

	for (int i = 0; i < 100; i++) /* grows the table past its first size */
		assert_int_equal(kvpool_register(e->c, &arena[0][i * 8], 8), 0);
	assert_int_equal(kvpool_register(e->c, arena[1], sizeof(arena[1])), 0);
	make_key(key, 77);
	fill_payload(arena[1], sizeof(arena[1]), 77);
	memcpy(expect, arena[1], sizeof(expect));
	assert_int_equal(kvpool_put_bytes(e->c, key, NULL, arena[1], sizeof(arena[1])), 0);
	atomic_store(&e->fk.mode, MODE_CLOSE);
	assert_true(kvpool_ping(e->c, NULL) < 0);
	atomic_store(&e->fk.mode, MODE_NORMAL);
	memset(arena[1], 0, sizeof(arena[1]));
	assert_int_equal(kvpool_get_bytes(e->c, key, arena[1], sizeof(arena[1]), &len), 0);
	assert_int_equal(len, sizeof(arena[1]));
	assert_memory_equal(arena[1], expect, sizeof(expect));
	assert_int_equal(n_regions(e->c), 101);
	assert_int_equal(kvpool_register(e->c, &arena[0][16], 8), -EEXIST);
}

/* ---- protocol v2 against the fake ---------------------------------------- */

/* A fake that speaks v2, with a small batch limit (4 keys per frame). */
static int setup_v2(void **state)
{
	struct proto_hello_reply lim = fake_default_limits;
	struct env *e = malloc(sizeof(*e));

	lim.version = 2;
	lim.max_match_wait_ms = 30000;
	lim.max_retain_ms = 86400000;
	if (!e || env_open(e, &lim, MODE_NORMAL)) {
		free(e);
		return -1;
	}
	*state = e;
	return 0;
}

/* Put the chain make_key(0..n-1), 100 bytes each. */
static void put_chain_of(struct env *e, int n)
{
	int st[32];

	assert_int_equal(put_simple(e->c, 0, n, 100, st), 0);
}

/* The options go on the wire as asked; every field of the v2 reply
 * reaches the caller (here made up by the fake: a cut lease, a wait, a
 * budget). */
static void test_v2_match_ex_fields(void **state)
{
	struct env *e = *state;
	struct kvpool_match_opts o = { .lease_ms = 100, .wait_ms = 5000, .want = 2, .retain_ms = 700 };
	struct kvpool_match_result r;
	struct kvpool_limits l;
	uint8_t keys[3][KVPOOL_KEY_BYTES];

	assert_int_equal(kvpool_get_limits(e->c, &l), 0);
	assert_int_equal(l.protocol_version, 2);
	assert_int_equal(l.max_match_wait_ms, 30000);
	assert_int_equal(l.max_retain_ms, 86400000);
	put_chain_of(e, 3);
	for (int i = 0; i < 3; i++)
		make_key(keys[i], i);
	e->fk.match_v2 = (struct proto_match_reply){
		.flags = PROTO_MATCH_LEASE_CUT | PROTO_MATCH_WAITED | PROTO_MATCH_RETAIN_BUDGET,
		.retained = 2, .retain_ms = 700,
	};
	e->fk.match_cut = 1;
	assert_int_equal(kvpool_match_ex(e->c, keys, 3, &o, &r), 0);
	assert_int_equal(e->fk.last_match_version, 2);
	assert_int_equal(e->fk.last_match_count, 3);
	assert_int_equal(e->fk.last_match_lease_ms, 100);
	assert_int_equal(e->fk.last_match_opts.want, 2);
	assert_int_equal(e->fk.last_match_opts.retain_ms, 700);
	/* what is left of the wait when the frame left: at most asked, not much less */
	assert_true(e->fk.last_match_opts.wait_ms <= 5000 && e->fk.last_match_opts.wait_ms > 4000);
	assert_int_equal(r.matched, 2);
	assert_int_equal(r.present, 3);
	assert_int_equal(r.retained, 2);
	assert_int_equal(r.retain_ms, 700);
	assert_int_equal(r.lease_ms, 100);
	assert_int_equal(r.flags, KVPOOL_MATCH_LEASE_CUT | KVPOOL_MATCH_WAITED |
				  KVPOOL_MATCH_RETAIN_BUDGET);
	/* kvpool_match is kvpool_match_ex with a lease only */
	e->fk.match_v2 = (struct proto_match_reply){ 0 };
	e->fk.match_cut = 0;
	{
		size_t m = 0;

		assert_int_equal(kvpool_match(e->c, keys, 3, 50, &m), 0);
		assert_int_equal(m, 3);
		assert_int_equal(e->fk.last_match_opts.wait_ms, 0);
		assert_int_equal(e->fk.last_match_opts.want, 0);
		assert_int_equal(e->fk.last_match_opts.retain_ms, 0);
		assert_int_equal(e->fk.last_match_lease_ms, 50);
	}
	/* want > count is an argument error: refused before anything is sent */
	o.want = 4;
	atomic_store(&e->fk.frames[PROTO_OP_MATCH], 0);
	assert_int_equal(kvpool_match_ex(e->c, keys, 3, &o, &r), -EINVAL);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 0);
	assert_int_equal(kvpool_match_ex(e->c, keys, 3, NULL, NULL), -EINVAL);
}

/* A chain of several frames: each frame waits only for its share of
 * want, within what is left of the wait; the answers are folded. */
static void test_v2_match_ex_frames(void **state)
{
	struct env *e = *state;
	struct kvpool_match_opts o = { .wait_ms = 5000, .want = 6, .retain_ms = 9 };
	struct kvpool_match_result r;
	uint8_t keys[10][KVPOOL_KEY_BYTES];

	put_chain_of(e, 10);
	for (int i = 0; i < 10; i++)
		make_key(keys[i], i);
	e->fk.match_v2 = (struct proto_match_reply){ .flags = PROTO_MATCH_WAITED, .retained = 4,
						      .retain_ms = 9 };
	assert_int_equal(kvpool_match_ex(e->c, keys, 10, &o, &r), 0);
	/* 4 + 4 + 2 keys; the last frame wants nothing and does not wait */
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 3);
	assert_int_equal(e->fk.last_match_count, 2);
	assert_int_equal(e->fk.last_match_opts.want, 0);
	assert_int_equal(e->fk.last_match_opts.wait_ms, 0);
	assert_int_equal(e->fk.last_match_opts.retain_ms, 9);
	assert_int_equal(r.matched, 10);
	assert_int_equal(r.present, 10);
	assert_int_equal(r.retained, 10);
	assert_int_equal(r.retain_ms, 9);
	assert_int_equal(r.flags, KVPOOL_MATCH_WAITED);
	/* a frame that retains only part: later frames do not add to the run */
	e->fk.match_v2.retained = 3;
	assert_int_equal(kvpool_match_ex(e->c, keys, 10, &o, &r), 0);
	assert_int_equal(r.matched, 10);
	assert_int_equal(r.retained, 3);
	/* a cut lease in the first frame stops the chain there */
	e->fk.match_v2 = (struct proto_match_reply){ .flags = PROTO_MATCH_LEASE_CUT };
	e->fk.match_cut = 1;
	atomic_store(&e->fk.frames[PROTO_OP_MATCH], 0);
	assert_int_equal(kvpool_match_ex(e->c, keys, 10, &o, &r), 0);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 1);
	assert_int_equal(r.matched, 3);
	assert_int_equal(r.present, 4);
	assert_true(r.flags & KVPOOL_MATCH_LEASE_CUT);
}

/* PUT results' flags reach kvpool_put_ex; retain_ms goes on the wire; a
 * result whose flags and retain_ms disagree is a broken stream. */
static void test_v2_put_ex_flags(void **state)
{
	struct env *e = *state;
	uint8_t key[2][KVPOOL_KEY_BYTES], data[64] = { 7 };
	struct iovec iov = { data, sizeof(data) };
	struct kvpool_put_block pb[2];
	uint32_t flags[2] = { 0xff, 0xff };
	int st[2];

	make_key(key[0], 40);
	make_key(key[1], 41);
	pb[0] = (struct kvpool_put_block){ .key = key[0], .iov = &iov, .iovcnt = 1,
					   .retain_ms = 123456 };
	pb[1] = (struct kvpool_put_block){ .key = key[1], .parent = key[0], .iov = &iov,
					   .iovcnt = 1 };
	e->fk.put_flags = PROTO_PUT_RETAINED | PROTO_PUT_RETAIN_CLAMPED;
	e->fk.put_retain_ms = 1000;
	assert_int_equal(kvpool_put_ex(e->c, pb, 2, st, flags), 0);
	assert_int_equal(e->fk.last_put_retain_ms, 0); /* the last entry asked none */
	assert_int_equal(flags[0], KVPOOL_PUT_RETAINED | KVPOOL_PUT_RETAIN_CLAMPED);
	assert_int_equal(flags[1], KVPOOL_PUT_RETAINED | KVPOOL_PUT_RETAIN_CLAMPED);
	assert_int_equal(kvpool_put_ex(e->c, pb, 1, st, flags), 0);
	assert_int_equal(e->fk.last_put_retain_ms, 123456);
	assert_int_equal(st[0], 0); /* EXISTS */
	/* asynchronous twin */
	{
		struct kvpool_completion comp;
		uint64_t id;

		flags[0] = flags[1] = 0;
		e->fk.put_flags = PROTO_PUT_RETAIN_BUDGET;
		e->fk.put_retain_ms = 0;
		assert_int_equal(kvpool_submit_put_ex(e->c, pb, 2, st, flags, 5, &id), 0);
		assert_int_equal(kvpool_poll(e->c, &comp, 1, 3000), 1);
		assert_int_equal(comp.status, 0);
		assert_int_equal(flags[0], KVPOOL_PUT_RETAIN_BUDGET);
		assert_int_equal(flags[1], KVPOOL_PUT_RETAIN_BUDGET);
	}
	/* RETAINED without a retention: not a valid reply */
	e->fk.put_flags = PROTO_PUT_RETAINED;
	e->fk.put_retain_ms = 0;
	assert_int_equal(kvpool_put_ex(e->c, pb, 1, st, flags), -EPROTO);
	assert_int_equal(flags[0], 0);
}

/* The asynchronous MATCH twin answers as the synchronous one. */
static void test_v2_submit_match_ex(void **state)
{
	struct env *e = *state;
	struct kvpool_match_opts o = { .lease_ms = 10, .want = 3, .wait_ms = 100 };
	struct kvpool_match_result r, rs;
	struct kvpool_completion comp;
	uint8_t keys[6][KVPOOL_KEY_BYTES];
	uint64_t id;

	put_chain_of(e, 5);
	for (int i = 0; i < 6; i++)
		make_key(keys[i], i);
	e->fk.match_v2 = (struct proto_match_reply){ .flags = PROTO_MATCH_WAIT_TIMEOUT |
								PROTO_MATCH_WAITED };
	memset(&r, 0xee, sizeof(r));
	assert_int_equal(kvpool_submit_match_ex(e->c, keys, 6, &o, &r, 77, &id), 0);
	assert_int_equal(kvpool_poll(e->c, &comp, 1, 3000), 1);
	assert_int_equal(comp.status, 0);
	assert_int_equal(comp.tag, 77);
	assert_int_equal(comp.matched, 5);
	assert_int_equal(kvpool_match_ex(e->c, keys, 6, &o, &rs), 0);
	assert_memory_equal(&r, &rs, sizeof(r));
	assert_int_equal(r.matched, 5);
	assert_int_equal(r.present, 5);
	assert_int_equal(r.flags, KVPOOL_MATCH_WAIT_TIMEOUT | KVPOOL_MATCH_WAITED);
	/* frames of 4 + 2 keys: the second wants none of the first 3 */
	assert_int_equal(e->fk.last_match_count, 2);
	assert_int_equal(e->fk.last_match_opts.want, 0);
	o.want = 7;
	assert_int_equal(kvpool_submit_match_ex(e->c, keys, 6, &o, &r, 78, &id), -EINVAL);
	assert_int_equal(kvpool_inflight(e->c), 0);
	assert_int_equal(kvpool_submit_match_ex(e->c, keys, 6, &o, NULL, 79, &id), -EINVAL);
}

/* Against a v1 server the options are not sent: the call answers at
 * once, flags 0, present = matched; want > count is refused locally. */
static void test_v1_server_drops_options(void **state)
{
	struct env *e = *state;
	struct kvpool_match_opts o = { .lease_ms = 9, .wait_ms = 5000, .want = 2, .retain_ms = 700 };
	struct kvpool_match_result r;
	struct kvpool_limits l;
	uint8_t keys[4][KVPOOL_KEY_BYTES], data[8] = { 1 };
	struct iovec iov = { data, sizeof(data) };
	struct kvpool_put_block pb;
	uint32_t flags = 0xff;
	int st = 1;

	assert_int_equal(kvpool_get_limits(e->c, &l), 0);
	assert_int_equal(l.protocol_version, 1);
	assert_int_equal(l.max_match_wait_ms, 0);
	assert_int_equal(l.max_retain_ms, 0);
	put_chain_of(e, 3);
	for (int i = 0; i < 4; i++)
		make_key(keys[i], i);
	e->fk.match_v2.flags = PROTO_MATCH_WAITED; /* not sent in v1 */
	assert_int_equal(kvpool_match_ex(e->c, keys, 4, &o, &r), 0);
	assert_int_equal(e->fk.last_match_version, 1);
	assert_int_equal(e->fk.last_match_lease_ms, 9);
	assert_int_equal(e->fk.last_match_opts.wait_ms | e->fk.last_match_opts.want |
				 e->fk.last_match_opts.retain_ms, 0);
	assert_int_equal(r.matched, 3);
	assert_int_equal(r.present, 3);
	assert_int_equal(r.flags, 0);
	assert_int_equal(r.retained, 0);
	assert_int_equal(r.lease_ms, 9);
	o.want = 5;
	atomic_store(&e->fk.frames[PROTO_OP_MATCH], 0);
	assert_int_equal(kvpool_match_ex(e->c, keys, 4, &o, &r), -EINVAL);
	assert_int_equal(atomic_load(&e->fk.frames[PROTO_OP_MATCH]), 0);
	pb = (struct kvpool_put_block){ .key = keys[3], .parent = keys[2], .iov = &iov,
					.iovcnt = 1, .retain_ms = 5000 };
	e->fk.put_flags = PROTO_PUT_RETAINED; /* a v1 reply cannot carry it */
	e->fk.put_retain_ms = 5;
	assert_int_equal(kvpool_put_ex(e->c, &pb, 1, &st, &flags), 0);
	assert_int_equal(st, 0);
	assert_int_equal(flags, 0);
	assert_int_equal(e->fk.last_put_retain_ms, 0);
}

#define FAKE_TEST(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_good),
		cmocka_unit_test(test_url_bad),
		cmocka_unit_test(test_url_rdma_auto),
		cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_strerror_covers_the_header),
		cmocka_unit_test(test_checksum_iov),
		cmocka_unit_test(test_connect_errors),
		FAKE_TEST(test_hello_limits),
		cmocka_unit_test(test_hello_refused),
		FAKE_TEST(test_put_get_split),
		FAKE_TEST(test_pipelining),
		cmocka_unit_test(test_inflight_split),
		FAKE_TEST(test_status_mapping),
		FAKE_TEST(test_whole_request_error),
		FAKE_TEST(test_busy_put_retried),
		FAKE_TEST(test_busy_retries_children),
		FAKE_TEST(test_busy_gives_up),
		FAKE_TEST(test_busy_within_timeout),
		FAKE_TEST(test_busy_whole_requests_retried),
		FAKE_TEST(test_busy_only_is_retried),
		cmocka_unit_test(test_busy_connect_retried),
		FAKE_TEST(test_wrong_request_id),
		FAKE_TEST(test_truncated_reply),
		FAKE_TEST(test_checksum_mismatch),
		FAKE_TEST(test_timeout),
		FAKE_TEST(test_reconnect_after_close),
		FAKE_TEST(test_server_restart),
		cmocka_unit_test(test_local_refusal),
		FAKE_TEST(test_get_miss_and_small_buffer),
		FAKE_TEST(test_too_large_that_fits),
		FAKE_TEST(test_invalid_iovecs),
		FAKE_TEST(test_match_chunks),
		FAKE_TEST(test_exists_delete_stats_drop),
		FAKE_TEST(test_invalid_args),
		FAKE_TEST(test_register_args),
		FAKE_TEST(test_register_table),
		FAKE_TEST(test_register_use),
		cmocka_unit_test_setup_teardown(test_v2_match_ex_fields, setup_v2, teardown),
		cmocka_unit_test_setup_teardown(test_v2_match_ex_frames, setup_v2, teardown),
		cmocka_unit_test_setup_teardown(test_v2_put_ex_flags, setup_v2, teardown),
		cmocka_unit_test_setup_teardown(test_v2_submit_match_ex, setup_v2, teardown),
		FAKE_TEST(test_v1_server_drops_options),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
