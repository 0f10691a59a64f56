/*
 * fuzz_tls.c - fuzz target: kvpoold's TLS handshake path (server/srv_tls.c)
 * with bad bytes where a ClientHello belongs.
 *
 * Once per process the target makes a self-signed certificate and key (an
 * EC key, written to a temporary directory) and a server context from
 * them with srv_tls_ctx_open, as kvpoold does. Each input is the byte
 * stream a client sends: it is written into one end of a socket pair
 * (then that end is shut for writing, as a client that stops), and the
 * server session on the other end runs the handshake as the TCP transport
 * does - srv_tls_handshake until it completes, fails or waits for bytes
 * that will never come - then, if it completed, reads with srv_tls_read
 * until the stream ends. What the server writes back is drained.
 *
 * Checked, whatever the bytes:
 *  - srv_tls_handshake returns only 0, -EAGAIN, -EPROTO or -ECONNRESET,
 *    and a failure comes with a reason (the text kvpoold logs);
 *  - it ends: a handshake that waits for more than the input holds says
 *    -EAGAIN (waiting to read), never spins;
 *  - after a failure or the end of the stream nothing is left pending,
 *    and srv_tls_read returns 0, -EAGAIN or -EPROTO only;
 *  - the session frees cleanly (AddressSanitizer and LeakSanitizer watch).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "conf.h"
#include "fuzz.h"
#include "srv_tls.h"

/* Bytes of one input used (a socket pair holds more than this). */
#define TLS_MAX_INPUT (48u * 1024)
/* Handshake or read steps per input, far more than any real exchange. */
#define MAX_STEPS 64

static struct srv_tls_ctx *ctx;

/* Write a self-signed certificate and its key under a fresh directory,
 * and point conf at them. */
static void make_identity(struct conf *c)
{
	char dir[] = "/tmp/kvpool-fuzz-tls-XXXXXX";
	EVP_PKEY *key = EVP_EC_gen("prime256v1");
	X509 *cert = X509_new();
	FILE *f;

	FUZZ_CHECK(key && cert && mkdtemp(dir));
	X509_set_version(cert, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
	X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
	X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
	X509_set_pubkey(cert, key);
	X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
				   (const unsigned char *)"kvpool-fuzz", -1, -1, 0);
	X509_set_issuer_name(cert, X509_get_subject_name(cert));
	FUZZ_CHECK(X509_sign(cert, key, EVP_sha256()) > 0);
	snprintf(c->tls_cert_file, sizeof(c->tls_cert_file), "%s/cert.pem", dir);
	snprintf(c->tls_key_file, sizeof(c->tls_key_file), "%s/key.pem", dir);
	f = fopen(c->tls_cert_file, "w");
	FUZZ_CHECK(f && PEM_write_X509(f, cert) == 1);
	fclose(f);
	f = fopen(c->tls_key_file, "w");
	FUZZ_CHECK(f && PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) == 1);
	fclose(f);
	FUZZ_CHECK(chmod(c->tls_key_file, 0600) == 0);
	X509_free(cert);
	EVP_PKEY_free(key);
}

static void setup(void)
{
	static struct conf c; /* large: not on the stack */
	char warn[256], err[512];

	make_identity(&c);
	FUZZ_CHECK(srv_tls_ctx_open(&c, &ctx, warn, sizeof(warn), err, sizeof(err)) == 0);
	/* the files were read: nothing needs them any more */
	unlink(c.tls_cert_file);
	unlink(c.tls_key_file);
	*strrchr(c.tls_key_file, '/') = '\0';
	rmdir(c.tls_key_file);
}

/* Read and drop what the server wrote to the client's end. */
static void drain(int fd)
{
	char buf[4096];

	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct srv_tls *t = NULL;
	char why[256] = "";
	int sv[2], rc = -EAGAIN, steps = 0;
	bool want_write = false;
	size_t n = size < TLS_MAX_INPUT ? size : TLS_MAX_INPUT;
	uint8_t buf[2048];

	if (!ctx)
		setup();
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	FUZZ_CHECK(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
	FUZZ_CHECK(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
	FUZZ_CHECK(n == 0 || write(sv[1], data, n) == (ssize_t)n);
	shutdown(sv[1], SHUT_WR);
	FUZZ_CHECK(srv_tls_new(ctx, sv[0], &t) == 0);
	for (; steps < MAX_STEPS; steps++) {
		why[0] = '\0';
		rc = srv_tls_handshake(t, &want_write, why, sizeof(why));
		drain(sv[1]);
		FUZZ_CHECK(rc == 0 || rc == -EAGAIN || rc == -EPROTO || rc == -ECONNRESET);
		if (rc != -EAGAIN)
			break;
		/* all the client's bytes are in: waiting now means waiting forever */
		if (!want_write)
			break;
	}
	FUZZ_CHECK(steps < MAX_STEPS);
	if (rc == -EPROTO || rc == -ECONNRESET)
		FUZZ_CHECK(why[0] != '\0');
	if (rc == 0) {
		long r = 1;

		for (int i = 0; i < MAX_STEPS && r > 0; i++)
			r = srv_tls_read(t, buf, sizeof(buf));
		FUZZ_CHECK(r == 0 || r == -EAGAIN || r == -EPROTO);
	}
	srv_tls_free(t);
	close(sv[0]);
	close(sv[1]);
	return 0;
}
