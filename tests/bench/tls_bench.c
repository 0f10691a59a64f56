/*
 * tls_bench.c - 1 MiB PUT and GET through kvpoold's data port with TLS
 * and in plaintext, against the same kvpoold in the same run.
 *
 *   tls_bench --port P --ca CA.pem [--host H] [--size BYTES] [--blocks N]
 *             [--rounds R] [--batch B] [--no-ktls]
 *
 * kvpoold must serve both (tls_cert_file set, tls_only false). Each round
 * runs a plaintext pass and a TLS pass, alternately first, on a fresh
 * connection each: N blocks of SIZE bytes (default 256 x 1 MiB) PUT in
 * requests of B blocks (default 4), then GET back in requests of B and
 * checked byte for byte (checksums are checked by the server on PUT; the
 * GET is compared with what was sent). Prints per pass GB/s (10^9 bytes/s)
 * of payload, then the medians over the rounds and the ratios TLS /
 * plaintext, and which TLS ran on the client (kernel or user space, read
 * back from OpenSSL after the handshake) - the server's side is in its
 * STATS (tls.kernel_tls). --no-ktls keeps the client in user space.
 *
 * The client side is a minimal kvpool client written from PROTOCOL.md
 * (HELLO, PUT, GET), so that libkvpool's own TLS is not needed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "proto.h"
#include "proto_xxh3.h"

struct conn {
	int fd;
	SSL *ssl; /* NULL: plaintext */
};

struct opts {
	const char *host, *ca;
	int port;
	uint64_t size;
	uint32_t blocks, rounds, batch;
	bool ktls;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	unsigned long e = ERR_get_error();

	fprintf(stderr, "tls_bench: %s%s%s\n", what, e ? ": " : "",
		e ? ERR_reason_error_string(e) : "");
	exit(1);
}

static void send_all(struct conn *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n;

		if (c->ssl) {
			size_t w = 0;

			if (SSL_write_ex(c->ssl, p, len, &w) != 1)
				die("SSL_write");
			n = (ssize_t)w;
		} else {
			n = send(c->fd, p, len, MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				die("send");
		}
		p += n;
		len -= (size_t)n;
	}
}

static void recv_all(struct conn *c, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n;

		if (c->ssl) {
			size_t r = 0;

			if (SSL_read_ex(c->ssl, p, len, &r) != 1)
				die("SSL_read");
			n = (ssize_t)r;
		} else {
			n = recv(c->fd, p, len, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				die("recv");
		}
		p += n;
		len -= (size_t)n;
	}
}

static void send_frame(struct conn *c, uint8_t op, uint64_t id, const void *body,
		       uint32_t body_bytes, uint64_t payload_bytes)
{
	struct proto_header h = { .magic = PROTO_MAGIC, .version = PROTO_VERSION, .opcode = op,
				  .body_bytes = body_bytes, .request_id = id,
				  .payload_bytes = payload_bytes };
	uint8_t hdr[PROTO_HEADER_BYTES];

	proto_header_encode(&h, hdr);
	send_all(c, hdr, sizeof(hdr));
	if (body_bytes)
		send_all(c, body, body_bytes);
}

/* Read one reply header and its body into body (cap bytes); returns the
 * header. The payload is left for the caller. */
static struct proto_header recv_reply(struct conn *c, uint8_t *body, size_t cap)
{
	uint8_t hdr[PROTO_HEADER_BYTES];
	struct proto_header h;

	recv_all(c, hdr, sizeof(hdr));
	if (proto_header_decode(hdr, 1, NULL, &h) || h.body_bytes > cap || h.status)
		die("bad or refused reply");
	recv_all(c, body, h.body_bytes);
	return h;
}

static struct conn conn_open(const struct opts *o, SSL_CTX *ctx)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)o->port) };
	struct conn c = { .fd = socket(AF_INET, SOCK_STREAM, 0) };
	int one = 1;

	if (c.fd < 0 || inet_pton(AF_INET, o->host, &a.sin_addr) != 1 ||
	    connect(c.fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect");
	setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (ctx) {
		c.ssl = SSL_new(ctx);
		if (!c.ssl || SSL_set_fd(c.ssl, c.fd) != 1 ||
		    SSL_set_tlsext_host_name(c.ssl, "localhost") != 1 ||
		    SSL_set1_host(c.ssl, "localhost") != 1 || SSL_connect(c.ssl) != 1)
			die("TLS handshake");
	}
	return c;
}

static void conn_close(struct conn *c)
{
	if (c->ssl) {
		SSL_shutdown(c->ssl);
		SSL_free(c->ssl);
	}
	close(c->fd);
}

static void hello(struct conn *c, const char *ns)
{
	struct proto_hello h = { .min_version = 1, .max_version = 1, .ns = ns,
				 .ns_len = (uint16_t)strlen(ns) };
	uint8_t body[512];
	size_t n = proto_hello_body_bytes(&h);

	if (proto_hello_encode(&h, body, sizeof(body)))
		die("hello encode");
	send_frame(c, PROTO_OP_HELLO, 1, body, (uint32_t)n, 0);
	recv_reply(c, body, sizeof(body));
}

static void key_of(uint8_t key[32], uint32_t round, bool tls, uint32_t i)
{
	memset(key, 0, 32);
	key[0] = 0x5a;
	memcpy(key + 1, &round, 4);
	key[5] = tls;
	memcpy(key + 6, &i, 4);
}

/* One pass: PUT then GET o->blocks blocks. *put_gbs, *get_gbs receive
 * the rates. */
static void pass(const struct opts *o, SSL_CTX *ctx, uint32_t round, uint8_t *data,
		 uint64_t sum, uint8_t *back, double *put_gbs, double *get_gbs, bool *ktx)
{
	struct conn c = conn_open(o, ctx);
	uint32_t b = o->batch;
	uint8_t *body = malloc(PROTO_BATCH_PREFIX_BYTES + (size_t)b * PROTO_PUT_ENTRY_BYTES);
	uint64_t id = 2;
	double t0;

	if (!body)
		die("malloc");
	*ktx = c.ssl && BIO_get_ktls_send(SSL_get_wbio(c.ssl));
	hello(&c, "tls-bench");
	t0 = now_s();
	for (uint32_t i = 0; i < o->blocks; i += b) {
		uint32_t n = o->blocks - i < b ? o->blocks - i : b;

		proto_batch_encode_prefix(body, n, 0);
		for (uint32_t k = 0; k < n; k++) {
			struct proto_put_entry e = { .length = o->size, .checksum = sum };

			key_of(e.key, round, c.ssl != NULL, i + k);
			proto_put_entry_encode(body, k, &e);
		}
		send_frame(&c, PROTO_OP_PUT, id++, body,
			   (uint32_t)proto_batch_body_bytes(n, PROTO_PUT_ENTRY_BYTES), n * o->size);
		for (uint32_t k = 0; k < n; k++)
			send_all(&c, data, o->size);
		recv_reply(&c, body, PROTO_BATCH_PREFIX_BYTES + (size_t)b * PROTO_PUT_ENTRY_BYTES);
	}
	*put_gbs = (double)o->blocks * (double)o->size / (now_s() - t0) / 1e9;
	t0 = now_s();
	for (uint32_t i = 0; i < o->blocks; i += b) {
		uint32_t n = o->blocks - i < b ? o->blocks - i : b;
		struct proto_header h;

		proto_batch_encode_prefix(body, n, 0);
		for (uint32_t k = 0; k < n; k++) {
			struct proto_get_entry e = { .max_length = o->size };

			key_of(e.key, round, c.ssl != NULL, i + k);
			proto_get_entry_encode(body, k, &e);
		}
		send_frame(&c, PROTO_OP_GET, id++, body,
			   (uint32_t)proto_batch_body_bytes(n, PROTO_GET_ENTRY_BYTES), 0);
		h = recv_reply(&c, body, PROTO_BATCH_PREFIX_BYTES + (size_t)b * PROTO_PUT_ENTRY_BYTES);
		if (h.payload_bytes != n * o->size)
			die("GET: a block is missing");
		for (uint32_t k = 0; k < n; k++) {
			recv_all(&c, back, o->size);
			if (memcmp(back, data, o->size))
				die("GET: wrong bytes");
		}
	}
	*get_gbs = (double)o->blocks * (double)o->size / (now_s() - t0) / 1e9;
	free(body);
	conn_close(&c);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, uint32_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "host", 1, 0, 'h' }, { "port", 1, 0, 'p' }, { "ca", 1, 0, 'c' },
		{ "size", 1, 0, 's' }, { "blocks", 1, 0, 'n' }, { "rounds", 1, 0, 'r' },
		{ "batch", 1, 0, 'b' }, { "no-ktls", 0, 0, 'k' }, { 0, 0, 0, 0 },
	};
	struct opts o = { .host = "127.0.0.1", .size = 1u << 20, .blocks = 256, .rounds = 5,
			  .batch = 4, .ktls = true };
	double pp[64], pg[64], tp[64], tg[64];
	bool ktx = false, any_ktx = false;
	uint8_t *data, *back;
	SSL_CTX *ctx;
	int ch;

	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'h': o.host = optarg; break;
		case 'p': o.port = atoi(optarg); break;
		case 'c': o.ca = optarg; break;
		case 's': o.size = strtoull(optarg, NULL, 10); break;
		case 'n': o.blocks = (uint32_t)atoi(optarg); break;
		case 'r': o.rounds = (uint32_t)atoi(optarg); break;
		case 'b': o.batch = (uint32_t)atoi(optarg); break;
		case 'k': o.ktls = false; break;
		default:
			fprintf(stderr, "usage: tls_bench --port P --ca CA.pem [--host H] [--size B] "
				"[--blocks N] [--rounds R] [--batch B] [--no-ktls]\n");
			return 2;
		}
	}
	if (!o.port || !o.ca || !o.size || !o.blocks || !o.batch || o.rounds < 1 || o.rounds > 64) {
		fprintf(stderr, "tls_bench: --port and --ca are needed; rounds 1..64\n");
		return 2;
	}
	ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx || SSL_CTX_load_verify_locations(ctx, o.ca, NULL) != 1)
		die("CA file");
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
	if (o.ktls)
		SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
	data = malloc(o.size);
	back = malloc(o.size);
	if (!data || !back)
		die("malloc");
	for (uint64_t i = 0; i < o.size; i++)
		data[i] = (uint8_t)(i * 131 + (i >> 12));
	for (uint32_t r = 0; r < o.rounds; r++) {
		uint64_t sum = XXH3_64bits(data, o.size);

		/* alternate which goes first: the machine's drift hits both */
		if (r % 2 == 0) {
			pass(&o, NULL, r, data, sum, back, &pp[r], &pg[r], &ktx);
			pass(&o, ctx, r, data, sum, back, &tp[r], &tg[r], &ktx);
		} else {
			pass(&o, ctx, r, data, sum, back, &tp[r], &tg[r], &ktx);
			pass(&o, NULL, r, data, sum, back, &pp[r], &pg[r], &ktx);
		}
		any_ktx |= ktx;
		printf("round %u: plaintext put %.3f get %.3f GB/s; tls put %.3f get %.3f GB/s\n", r,
		       pp[r], pg[r], tp[r], tg[r]);
	}
	{
		double mpp = median(pp, o.rounds), mpg = median(pg, o.rounds);
		double mtp = median(tp, o.rounds), mtg = median(tg, o.rounds);

		printf("median of %u rounds, %u x %llu-byte blocks, %u per request: plaintext put "
		       "%.3f get %.3f GB/s; tls put %.3f get %.3f GB/s; tls/plaintext put %.2f "
		       "get %.2f; client tls in %s\n",
		       o.rounds, o.blocks, (unsigned long long)o.size, o.batch, mpp, mpg, mtp, mtg,
		       mtp / mpp, mtg / mpg, any_ktx ? "the kernel (send)" : "user space");
	}
	SSL_CTX_free(ctx);
	free(data);
	free(back);
	return 0;
}
