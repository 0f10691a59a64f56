/*
 * match_wait.c - wake-up latency of a MATCH that waits for blocks
 * (PROTOCOL.md, MATCH wait_ms), against a running kvpoold on loopback:
 *
 *   match_wait --port P [--parked N] [--rounds R] [--conns C] [--block-bytes B]
 *
 * N MATCHes (protocol v2, want 1, wait_ms 60 s) are kept parked, each for
 * a block of its own, spread over C connections. Each round then:
 *   A (baseline): PUT one block nobody waits for; time from sending the
 *     PUT to its reply (the PUT round trip);
 *   B (wake): PUT the block the oldest parked MATCH waits for; time from
 *     sending the PUT to that MATCH's reply on its own connection; park a
 *     new MATCH in its place, so that N stay parked.
 * A and B alternate, so both see the same machine load. The server's own
 * figure, from the commit of the block to the waiting MATCH's reply
 * queued, is read from STATS (ops.match.waits.wake_us) after the rounds,
 * and the server's MATCH count is checked against the MATCHes sent: one
 * MATCH per waiting request, nothing polled.
 *
 * Prints p50, p99 and max of A and B (client side, microseconds) and the
 * server's p50/p99/p999; --json prints one JSON object.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "proto.h"
#include "proto_xxh3.h"

#define MAX_CONNS 256

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "match_wait: %s: %s\n", what, strerror(err));
	exit(1);
}

static int tcp_connect(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (fd < 0)
		die("socket", errno);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("connect", errno);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("send", errno);
		}
		p += n;
		len -= (size_t)n;
	}
}

static void recv_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n == 0)
			die("recv", ECONNRESET);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("recv", errno);
		}
		p += n;
		len -= (size_t)n;
	}
}

/* Send one frame (header version `version`). */
static void send_frame(int fd, uint8_t version, uint8_t op, uint64_t id, const void *body,
		       uint32_t body_bytes, const void *payload, uint64_t payload_bytes)
{
	struct proto_header h = {
		.magic = PROTO_MAGIC, .version = version, .opcode = op, .body_bytes = body_bytes,
		.request_id = id, .payload_bytes = payload_bytes,
	};
	uint8_t hdr[PROTO_HEADER_BYTES];

	proto_header_encode(&h, hdr);
	send_all(fd, hdr, sizeof(hdr));
	if (body_bytes)
		send_all(fd, body, body_bytes);
	if (payload_bytes)
		send_all(fd, payload, payload_bytes);
}

/* Read one reply frame: header into *h, body into body[0..cap). */
static void read_reply(int fd, struct proto_header *h, uint8_t *body, size_t cap)
{
	uint8_t hdr[PROTO_HEADER_BYTES];

	recv_all(fd, hdr, sizeof(hdr));
	if (proto_header_decode(hdr, 1, NULL, h) < 0)
		die("reply header", EPROTO);
	if (h->body_bytes > cap || h->payload_bytes)
		die("reply size", EMSGSIZE);
	recv_all(fd, body, h->body_bytes);
	if (h->status != PROTO_STATUS_OK)
		die("reply status", EPROTO);
}

static void hello(int fd, const char *ns)
{
	struct proto_hello hl = {
		.min_version = PROTO_VERSION_MIN, .max_version = PROTO_VERSION_MAX,
		.ns = ns, .ns_len = (uint16_t)strlen(ns),
	};
	uint8_t body[PROTO_HELLO_FIXED_BYTES + PROTO_NAME_MAX_BYTES], reply[256];
	struct proto_hello_reply r;
	struct proto_header h;

	if (proto_hello_encode(&hl, body, sizeof(body)) < 0)
		die("hello", EINVAL);
	send_frame(fd, PROTO_VERSION, PROTO_OP_HELLO, 1, body,
		   (uint32_t)proto_hello_body_bytes(&hl), NULL, 0);
	read_reply(fd, &h, reply, sizeof(reply));
	if (proto_hello_reply_decode(reply, h.body_bytes, &r) < 0 || r.version < PROTO_VERSION_2)
		die("hello: the server does not speak protocol v2", EPROTONOSUPPORT);
}

/* Key of block number n (a single-block chain of its own). */
static void key_of(uint64_t run, uint64_t n, uint8_t key[32])
{
	uint64_t v[4] = { 0x6d617463685f7761ull, run, n, 0x9e3779b97f4a7c15ull * (n + 1) };

	memcpy(key, v, 32);
}

static void send_match(int fd, uint64_t id, const uint8_t key[32], uint32_t wait_ms)
{
	struct proto_match_opts o = { .wait_ms = wait_ms, .want = 1 };
	uint8_t body[PROTO_MATCH_V2_PREFIX_BYTES + PROTO_KEY_BYTES];

	proto_match_encode_prefix(body, PROTO_VERSION_2, 1, 0, &o);
	proto_match_key_encode(body, PROTO_VERSION_2, 0, key);
	send_frame(fd, PROTO_VERSION_2, PROTO_OP_MATCH, id, body, sizeof(body), NULL, 0);
}

static void send_put(int fd, uint64_t id, const uint8_t key[32], const uint8_t *data,
		     uint64_t len)
{
	uint8_t body[PROTO_BATCH_PREFIX_BYTES + PROTO_PUT_ENTRY_BYTES];
	struct proto_put_entry e = { .length = len, .checksum = XXH3_64bits(data, len) };

	memcpy(e.key, key, 32);
	proto_batch_encode_prefix(body, 1, 0);
	proto_put_entry_encode(body, 0, &e);
	send_frame(fd, PROTO_VERSION, PROTO_OP_PUT, id, body, sizeof(body), data, len);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, size_t n, double q)
{
	size_t i = (size_t)(q * (double)n + 0.999999);

	if (!n)
		return 0;
	return v[i ? (i > n ? n - 1 : i - 1) : 0];
}

/* The STATS document of the connection's server (raw STATS request). */
static struct json_object *stats(int fd)
{
	uint8_t body[4] = { 0 }, hdr[PROTO_HEADER_BYTES];
	struct proto_header h;
	struct json_object *doc;
	char *text;

	send_frame(fd, PROTO_VERSION, PROTO_OP_STATS, 99, body, sizeof(body), NULL, 0);
	recv_all(fd, hdr, sizeof(hdr));
	if (proto_header_decode(hdr, 1, NULL, &h) < 0 || h.status != PROTO_STATUS_OK)
		die("stats", EPROTO);
	text = malloc(h.body_bytes + 1);
	if (!text)
		die("stats", ENOMEM);
	recv_all(fd, text, h.body_bytes);
	text[h.body_bytes] = '\0';
	doc = json_tokener_parse(text);
	free(text);
	if (!doc)
		die("stats: not JSON", EPROTO);
	return doc;
}

static uint64_t jget(struct json_object *doc, const char *path)
{
	char buf[128], *save = NULL;
	struct json_object *o = doc;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *t = strtok_r(buf, ".", &save); t; t = strtok_r(NULL, ".", &save))
		if (!json_object_object_get_ex(o, t, &o))
			die(path, ENOENT);
	return (uint64_t)json_object_get_int64(o);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "port", required_argument, NULL, 'p' }, { "parked", required_argument, NULL, 'n' },
		{ "rounds", required_argument, NULL, 'r' }, { "conns", required_argument, NULL, 'c' },
		{ "block-bytes", required_argument, NULL, 'b' }, { "json", no_argument, NULL, 'j' },
		{ NULL, 0, NULL, 0 },
	};
	uint32_t parked = 1000, rounds = 2000, conns = 10;
	uint64_t block = 4096, run = (uint64_t)now_us(), match_sent = 0, req0, req1, waiting;
	uint64_t *ta, *tb, id = 100;
	struct json_object *doc;
	uint16_t port = 0;
	int fds[MAX_CONNS], pfd, sfd, opt;
	bool json = false;
	uint8_t *data, reply[256], key[32];
	struct proto_header h;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': port = (uint16_t)atoi(optarg); break;
		case 'n': parked = (uint32_t)atoi(optarg); break;
		case 'r': rounds = (uint32_t)atoi(optarg); break;
		case 'c': conns = (uint32_t)atoi(optarg); break;
		case 'b': block = strtoull(optarg, NULL, 0); break;
		case 'j': json = true; break;
		default:
			fprintf(stderr, "usage: match_wait --port P [--parked N] [--rounds R] "
				"[--conns C] [--block-bytes B] [--json]\n");
			return 2;
		}
	}
	if (!port || !conns || conns > MAX_CONNS || parked % conns || !rounds || !block) {
		fprintf(stderr, "match_wait: --port is required; --parked must be a multiple of "
			"--conns (1..%d); --rounds and --block-bytes > 0\n", MAX_CONNS);
		return 2;
	}
	data = malloc(block);
	ta = calloc(rounds, sizeof(*ta));
	tb = calloc(rounds, sizeof(*tb));
	if (!data || !ta || !tb)
		die("malloc", ENOMEM);
	for (uint64_t i = 0; i < block; i++)
		data[i] = (uint8_t)(i * 131 + 7);
	pfd = tcp_connect(port);
	hello(pfd, "match-wait-bench");
	sfd = tcp_connect(port);
	hello(sfd, "match-wait-bench");
	doc = stats(sfd);
	req0 = jget(doc, "ops.match.requests");
	json_object_put(doc);
	for (uint32_t i = 0; i < conns; i++) {
		fds[i] = tcp_connect(port);
		hello(fds[i], "match-wait-bench");
	}
	/* MATCH j waits for block j, on connection j % conns */
	for (uint32_t j = 0; j < parked; j++) {
		key_of(run, j, key);
		send_match(fds[j % conns], j, key, 60000);
		match_sent++;
	}
	/* wait until every one is parked */
	for (int tries = 0;; tries++) {
		doc = stats(sfd);
		waiting = jget(doc, "ops.match.waits.waiting");
		json_object_put(doc);
		if (waiting >= parked)
			break;
		if (tries > 500)
			die("the MATCHes did not all park", ETIMEDOUT);
		usleep(10000);
	}
	for (uint32_t r = 0; r < rounds; r++) {
		uint32_t c = r % conns;
		uint64_t t0;

		/* A: a PUT nobody waits for */
		key_of(run ^ 0xa5a5, r, key);
		t0 = now_us();
		send_put(pfd, id++, key, data, block);
		read_reply(pfd, &h, reply, sizeof(reply));
		ta[r] = now_us() - t0;
		/* B: the PUT that completes the oldest parked MATCH */
		key_of(run, r, key);
		t0 = now_us();
		send_put(pfd, id++, key, data, block);
		read_reply(fds[c], &h, reply, sizeof(reply));
		tb[r] = now_us() - t0;
		if (h.opcode != PROTO_OP_MATCH || h.request_id != r)
			die("match reply out of order", EPROTO);
		read_reply(pfd, &h, reply, sizeof(reply)); /* the PUT's */
		/* keep `parked` parked: the next one goes on the same connection */
		key_of(run, (uint64_t)parked + r, key);
		send_match(fds[c], (uint64_t)parked + r, key, 60000);
		match_sent++;
	}
	doc = stats(sfd);
	req1 = jget(doc, "ops.match.requests");
	qsort(ta, rounds, sizeof(*ta), cmp_u64);
	qsort(tb, rounds, sizeof(*tb), cmp_u64);
	if (json) {
		printf("{\"parked\":%u,\"rounds\":%u,\"conns\":%u,\"block_bytes\":%llu,"
		       "\"put_rtt_us\":{\"p50\":%llu,\"p99\":%llu,\"max\":%llu},"
		       "\"put_to_wake_us\":{\"p50\":%llu,\"p99\":%llu,\"max\":%llu},"
		       "\"server_wake_us\":{\"p50\":%llu,\"p99\":%llu,\"p999\":%llu},"
		       "\"match_requests\":%llu,\"match_sent\":%llu}\n",
		       parked, rounds, conns, (unsigned long long)block,
		       (unsigned long long)pct(ta, rounds, 0.5), (unsigned long long)pct(ta, rounds, 0.99),
		       (unsigned long long)ta[rounds - 1],
		       (unsigned long long)pct(tb, rounds, 0.5), (unsigned long long)pct(tb, rounds, 0.99),
		       (unsigned long long)tb[rounds - 1],
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p50"),
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p99"),
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p999"),
		       (unsigned long long)(req1 - req0), (unsigned long long)match_sent);
	} else {
		printf("%u MATCHes parked on %u connections, %u rounds, %llu-byte blocks\n", parked,
		       conns, rounds, (unsigned long long)block);
		printf("  A  PUT round trip (nobody waits)        p50 %6llu us  p99 %6llu us  max %6llu us\n",
		       (unsigned long long)pct(ta, rounds, 0.5), (unsigned long long)pct(ta, rounds, 0.99),
		       (unsigned long long)ta[rounds - 1]);
		printf("  B  PUT sent -> waiting MATCH's reply    p50 %6llu us  p99 %6llu us  max %6llu us\n",
		       (unsigned long long)pct(tb, rounds, 0.5), (unsigned long long)pct(tb, rounds, 0.99),
		       (unsigned long long)tb[rounds - 1]);
		printf("  server: commit -> reply queued          p50 %6llu us  p99 %6llu us  p999 %6llu us\n",
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p50"),
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p99"),
		       (unsigned long long)jget(doc, "ops.match.waits.wake_us.p999"));
		printf("  MATCH requests counted by the server: %llu for %llu sent (one per waiting "
		       "request)\n", (unsigned long long)(req1 - req0), (unsigned long long)match_sent);
	}
	json_object_put(doc);
	for (uint32_t i = 0; i < conns; i++)
		close(fds[i]);
	close(pfd);
	close(sfd);
	free(data);
	free(ta);
	free(tb);
	return req1 - req0 == match_sent ? 0 : 1;
}
