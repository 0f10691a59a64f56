/*
 * srv_tls.c - TLS contexts and sessions with OpenSSL (srv_tls.h).
 */
#include "srv_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "conf.h"

struct srv_tls_ctx {
	pthread_mutex_t lock; /* guards ctx against a reload */
	SSL_CTX *ctx;         /* the current one: new sessions take a reference */
};

struct srv_tls {
	SSL *ssl;
	bool up;              /* handshake done */
};

bool srv_tls_configured(const struct conf *c)
{
	return c->tls_cert_file[0] != '\0';
}

bool srv_tls_only(const struct conf *c, bool listen_loopback)
{
	if (c->tls_only == CONF_TLS_ONLY_ON)
		return true;
	if (c->tls_only == CONF_TLS_ONLY_OFF || !srv_tls_configured(c))
		return false;
	return !listen_loopback;
}

/* The oldest OpenSSL error left on this thread's queue, as text ("" when
 * there is none); the queue is emptied. */
static void ssl_errors(char *buf, size_t len)
{
	unsigned long e, first = 0;

	while ((e = ERR_get_error()) != 0)
		if (!first)
			first = e;
	buf[0] = '\0';
	if (first) {
		const char *r = ERR_reason_error_string(first);

		if (r)
			snprintf(buf, len, "%s", r);
		else
			ERR_error_string_n(first, buf, len);
	}
}

/* A key file others may read, or group or others may write, is refused
 * (as ssh and PostgreSQL refuse such keys). Errors: -EPERM, -errno. */
static int key_mode_check(const char *path, char *err, size_t err_len)
{
	struct stat st;

	if (stat(path, &st) < 0) {
		int e = errno;

		snprintf(err, err_len, "tls_key_file %s: %s", path, strerror(e));
		return -EINVAL;
	}
	if (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) {
		snprintf(err, err_len, "tls_key_file %s: mode %04o lets %s; chmod 600 it (or 640 "
			 "with the group of the user kvpoold runs as)", path,
			 (unsigned)(st.st_mode & 07777),
			 st.st_mode & S_IROTH ? "others read the private key" :
						"group or others write the private key");
		return -EPERM;
	}
	return 0;
}

/* Is cert within its validity period now? */
static bool cert_valid_now(X509 *cert)
{
	return X509_cmp_current_time(X509_get0_notAfter(cert)) >= 0 &&
	       X509_cmp_current_time(X509_get0_notBefore(cert)) <= 0;
}

/* Warn in warn[] when cert is expired or not yet valid. */
static void validity_warning(X509 *cert, const char *path, char *warn, size_t warn_len)
{
	const ASN1_TIME *before = X509_get0_notBefore(cert), *after = X509_get0_notAfter(cert);

	if (X509_cmp_current_time(after) < 0)
		snprintf(warn, warn_len, "tls_cert_file %s expired: clients will refuse it until "
			 "a renewed certificate is installed (SIGHUP reloads it)", path);
	else if (X509_cmp_current_time(before) > 0)
		snprintf(warn, warn_len, "tls_cert_file %s is not valid yet: clients will refuse "
			 "it until then", path);
}

/* A new SSL_CTX from c's files. Errors as srv_tls_ctx_open. */
static int ctx_make(const struct conf *c, SSL_CTX **out, char *warn, size_t warn_len, char *err,
		    size_t err_len)
{
	char why[256];
	SSL_CTX *ctx;
	int rc;

	warn[0] = '\0';
	ERR_clear_error();
	rc = key_mode_check(c->tls_key_file, err, err_len);
	if (rc)
		return rc;
	ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		snprintf(err, err_len, "tls: out of memory");
		return -ENOMEM;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	/* kernel TLS where the kernel has it; renegotiation never; a peer
	 * that drops the connection without close_notify is an EOF */
	SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS | SSL_OP_NO_RENEGOTIATION |
				 SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF);
	/* the output queue resumes a partial write at the first byte not
	 * taken, possibly at a new address (its buffer may grow) */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
			      SSL_MODE_RELEASE_BUFFERS);
	/* connections are long-lived: no session tickets to issue */
	SSL_CTX_set_num_tickets(ctx, 0);
	if (SSL_CTX_use_certificate_chain_file(ctx, c->tls_cert_file) != 1) {
		ssl_errors(why, sizeof(why));
		snprintf(err, err_len, "tls_cert_file %s: cannot load the certificate: %s",
			 c->tls_cert_file, why);
		goto out_free;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, c->tls_key_file, SSL_FILETYPE_PEM) != 1) {
		ssl_errors(why, sizeof(why));
		if (strstr(why, "mismatch"))
			snprintf(err, err_len, "tls_key_file %s does not match tls_cert_file %s (%s)",
				 c->tls_key_file, c->tls_cert_file, why);
		else
			snprintf(err, err_len, "tls_key_file %s: cannot load the private key: %s",
				 c->tls_key_file, why);
		goto out_free;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ssl_errors(why, sizeof(why));
		snprintf(err, err_len, "tls_key_file %s does not match tls_cert_file %s: %s",
			 c->tls_key_file, c->tls_cert_file, why);
		goto out_free;
	}
	if (c->tls_client_ca_file[0]) {
		STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(c->tls_client_ca_file);

		if (!names ||
		    SSL_CTX_load_verify_locations(ctx, c->tls_client_ca_file, NULL) != 1) {
			ssl_errors(why, sizeof(why));
			snprintf(err, err_len, "tls_client_ca_file %s: cannot load the CA "
				 "certificates: %s", c->tls_client_ca_file,
				 why[0] ? why : "no certificate in it");
			if (names)
				sk_X509_NAME_pop_free(names, X509_NAME_free);
			goto out_free;
		}
		SSL_CTX_set_client_CA_list(ctx, names);
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	}
	validity_warning(SSL_CTX_get0_certificate(ctx), c->tls_cert_file, warn, warn_len);
	*out = ctx;
	return 0;

out_free:
	SSL_CTX_free(ctx);
	ERR_clear_error();
	return -EINVAL;
}

int srv_tls_ctx_open(const struct conf *c, struct srv_tls_ctx **out, char *warn, size_t warn_len,
		     char *err, size_t err_len)
{
	struct srv_tls_ctx *x = calloc(1, sizeof(*x));
	int rc;

	if (!x) {
		snprintf(err, err_len, "tls: out of memory");
		return -ENOMEM;
	}
	rc = ctx_make(c, &x->ctx, warn, warn_len, err, err_len);
	if (rc) {
		free(x);
		return rc;
	}
	pthread_mutex_init(&x->lock, NULL);
	*out = x;
	return 0;
}

int srv_tls_ctx_reload(struct srv_tls_ctx *x, const struct conf *c, char *warn, size_t warn_len,
		       char *err, size_t err_len)
{
	SSL_CTX *ctx, *old;
	int rc = ctx_make(c, &ctx, warn, warn_len, err, err_len);
	X509 *now_cert, *new_cert;
	bool keep = false;

	if (rc)
		return rc;
	/* an expired (or not yet valid) certificate does not replace one
	 * that is valid: every new client would refuse the server. Start-up
	 * takes one, so that a renewal can be installed with SIGHUP; so does
	 * a reload whose current certificate is no better. */
	new_cert = SSL_CTX_get0_certificate(ctx);
	pthread_mutex_lock(&x->lock);
	now_cert = SSL_CTX_get0_certificate(x->ctx);
	if (new_cert && now_cert && !cert_valid_now(new_cert) && cert_valid_now(now_cert)) {
		snprintf(err, err_len, "tls_cert_file %s %s, and the certificate in use is "
			 "valid: install a valid one", c->tls_cert_file,
			 X509_cmp_current_time(X509_get0_notAfter(new_cert)) < 0 ?
				"has expired" : "is not valid yet");
		keep = true;
	}
	pthread_mutex_unlock(&x->lock);
	if (keep) {
		SSL_CTX_free(ctx);
		warn[0] = '\0';
		return -EKEYEXPIRED;
	}
	pthread_mutex_lock(&x->lock);
	old = x->ctx;
	x->ctx = ctx;
	pthread_mutex_unlock(&x->lock);
	/* sessions made from it hold their own references */
	SSL_CTX_free(old);
	return 0;
}

void srv_tls_ctx_describe(struct srv_tls_ctx *x, char *buf, size_t len)
{
	char subject[256] = "?", until[64] = "?";
	X509 *cert;
	BIO *b;

	pthread_mutex_lock(&x->lock);
	cert = SSL_CTX_get0_certificate(x->ctx);
	if (cert) {
		X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof(subject));
		b = BIO_new(BIO_s_mem());
		if (b && ASN1_TIME_print(b, X509_get0_notAfter(cert)) == 1) {
			int n = BIO_read(b, until, sizeof(until) - 1);

			until[n > 0 ? n : 0] = '\0';
		}
		BIO_free(b);
	}
	pthread_mutex_unlock(&x->lock);
	snprintf(buf, len, "certificate %s, valid until %s", subject, until);
}

void srv_tls_ctx_free(struct srv_tls_ctx *x)
{
	if (!x)
		return;
	SSL_CTX_free(x->ctx);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

int srv_tls_new(struct srv_tls_ctx *x, int fd, struct srv_tls **out)
{
	struct srv_tls *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	pthread_mutex_lock(&x->lock);
	t->ssl = SSL_new(x->ctx); /* takes its own reference on the context */
	pthread_mutex_unlock(&x->lock);
	if (!t->ssl || SSL_set_fd(t->ssl, fd) != 1) {
		SSL_free(t->ssl);
		free(t);
		ERR_clear_error();
		return -ENOMEM;
	}
	SSL_set_accept_state(t->ssl);
	*out = t;
	return 0;
}

/* Why the handshake failed, in words: the certificate check of the
 * peer's certificate, or OpenSSL's reason (alerts the peer sent read
 * "sslv3 alert bad certificate", "tlsv1 alert unknown ca"). */
static void handshake_why(struct srv_tls *t, char *why, size_t why_len)
{
	long v = SSL_get_verify_result(t->ssl);
	char reason[200];

	ssl_errors(reason, sizeof(reason));
	if (v != X509_V_OK)
		snprintf(why, why_len, "client certificate refused: %s",
			 X509_verify_cert_error_string(v));
	else if (reason[0])
		snprintf(why, why_len, "%s", reason);
	else
		snprintf(why, why_len, "the peer closed the connection");
}

int srv_tls_handshake(struct srv_tls *t, bool *want_write, char *why, size_t why_len)
{
	int rc, e;

	ERR_clear_error();
	rc = SSL_do_handshake(t->ssl);
	if (rc == 1) {
		t->up = true;
		return 0;
	}
	e = SSL_get_error(t->ssl, rc);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		*want_write = e == SSL_ERROR_WANT_WRITE;
		return -EAGAIN;
	}
	if ((e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN) && ERR_peek_error() == 0) {
		snprintf(why, why_len, "the peer closed the connection during the handshake%s%s",
			 errno && e == SSL_ERROR_SYSCALL ? ": " : "",
			 errno && e == SSL_ERROR_SYSCALL ? strerror(errno) : "");
		return -ECONNRESET;
	}
	handshake_why(t, why, why_len);
	return -EPROTO;
}

bool srv_tls_pending(struct srv_tls *t)
{
	return t->up && SSL_pending(t->ssl) > 0;
}

/* Map a failed SSL_read/SSL_write (rc <= 0) to -errno. */
static long io_error(struct srv_tls *t, int rc, bool reading)
{
	int e = SSL_get_error(t->ssl, rc);

	switch (e) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE:
		return -EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		ERR_clear_error();
		return reading ? 0 : -EPIPE;
	case SSL_ERROR_SYSCALL:
		if (ERR_peek_error() == 0) {
			int err = errno;

			if (reading && (err == 0 || err == ECONNRESET))
				return 0;
			return err == EAGAIN || err == EINTR ? -EAGAIN : -(err ? err : EPIPE);
		}
		ERR_clear_error();
		return -EPROTO;
	default:
		ERR_clear_error();
		return -EPROTO;
	}
}

long srv_tls_read(struct srv_tls *t, void *buf, size_t len)
{
	size_t n = 0;
	int rc;

	ERR_clear_error();
	rc = SSL_read_ex(t->ssl, buf, len, &n);
	if (rc == 1)
		return (long)n;
	return io_error(t, rc, true);
}

long srv_tls_readv(struct srv_tls *t, const struct iovec *iov, int n)
{
	long total = 0;

	for (int i = 0; i < n; i++) {
		long r;

		if (iov[i].iov_len == 0)
			continue;
		r = srv_tls_read(t, iov[i].iov_base, iov[i].iov_len);
		if (r <= 0)
			return total ? total : r;
		total += r;
		if ((size_t)r < iov[i].iov_len)
			break; /* the record ended: what follows is not here yet */
	}
	return total;
}

long srv_tls_writev(struct srv_tls *t, const struct iovec *iov, int n)
{
	long total = 0;

	for (int i = 0; i < n; i++) {
		size_t w = 0;
		int rc;

		if (iov[i].iov_len == 0)
			continue;
		ERR_clear_error();
		rc = SSL_write_ex(t->ssl, iov[i].iov_base, iov[i].iov_len, &w);
		if (rc != 1) {
			long err = io_error(t, rc, false);

			return total ? total : err;
		}
		total += (long)w;
		if (w < iov[i].iov_len)
			break; /* partial: the socket is full */
	}
	return total;
}

bool srv_tls_ktls_send(struct srv_tls *t)
{
	return t->up && BIO_get_ktls_send(SSL_get_wbio(t->ssl));
}

bool srv_tls_ktls_recv(struct srv_tls *t)
{
	return t->up && BIO_get_ktls_recv(SSL_get_rbio(t->ssl));
}

void srv_tls_describe(struct srv_tls *t, char *buf, size_t len)
{
	snprintf(buf, len, "%s %s", SSL_get_version(t->ssl), SSL_get_cipher_name(t->ssl));
}

void srv_tls_close_notify(struct srv_tls *t)
{
	if (!t->up || (SSL_get_shutdown(t->ssl) & SSL_SENT_SHUTDOWN))
		return;
	/* a non-blocking socket may not take it: never wait */
	ERR_clear_error();
	(void)SSL_shutdown(t->ssl);
	ERR_clear_error();
}

void srv_tls_free(struct srv_tls *t)
{
	if (!t)
		return;
	srv_tls_close_notify(t);
	SSL_free(t->ssl);
	free(t);
}
