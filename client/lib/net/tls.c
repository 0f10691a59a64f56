/*
 * tls.c - the TLS peer (tls.h): OpenSSL over a non-blocking TCP socket.
 *
 * A stream peer like TCP: send hands the iovecs to SSL_write one after
 * the other (partial writes on: a full socket returns what was taken),
 * recv fills them with SSL_read. Decrypted bytes can wait inside OpenSSL
 * while the socket is empty; the link then keeps an eventfd readable, so
 * that the engine's poll returns and reads them (pollfds).
 */
#include "tls.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "kvpool.h"
#include "lib/clock.h"
#include "frame.h"

struct kvc_tls_ctx {
	atomic_uint refs;
	SSL_CTX *ctx;
	uint32_t flags; /* KVPOOL_TLS_* */
};

/* One link's session. */
struct tls_link {
	SSL *ssl;
	int efd;       /* readable while decrypted bytes wait in ssl */
	int efd_set;
};

/* Say why in kvpool_last_server_message: "what: OpenSSL's reason". */
static void say(const char *what)
{
	char msg[512], reason[256] = "";
	unsigned long e, first = 0;

	while ((e = ERR_get_error()) != 0)
		if (!first)
			first = e;
	if (first)
		ERR_error_string_n(first, reason, sizeof(reason));
	snprintf(msg, sizeof(msg), "%s%s%s", what, reason[0] ? ": " : "", reason);
	kvc_frame_set_last_message(msg);
}

/* The environment's value for a setting left NULL ("" counts as unset). */
static const char *from_env(const char *v, const char *name)
{
	if (v && v[0])
		return v;
	v = getenv(name);
	return v && v[0] ? v : NULL;
}

int kvc_tls_ctx_new(const char *ca_file, const char *cert_file, const char *key_file,
		    uint32_t flags, struct kvc_tls_ctx **out)
{
	struct kvc_tls_ctx *x;
	char what[600];

	ca_file = from_env(ca_file, "KVPOOL_TLS_CA");
	cert_file = from_env(cert_file, "KVPOOL_TLS_CERT");
	key_file = from_env(key_file, "KVPOOL_TLS_KEY");
	if (!!cert_file != !!key_file) {
		kvc_frame_set_last_message(cert_file ? "tls: a client certificate without its key "
						       "(KVPOOL_TLS_KEY, tls_key_file)" :
						       "tls: a client key without its certificate "
						       "(KVPOOL_TLS_CERT, tls_cert_file)");
		return -EINVAL;
	}
	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	ERR_clear_error();
	x->ctx = SSL_CTX_new(TLS_client_method());
	if (!x->ctx) {
		free(x);
		return -ENOMEM;
	}
	atomic_init(&x->refs, 1);
	x->flags = flags;
	SSL_CTX_set_min_proto_version(x->ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(x->ctx, SSL_OP_ENABLE_KTLS | SSL_OP_NO_RENEGOTIATION |
				    SSL_OP_IGNORE_UNEXPECTED_EOF);
	/* the engine resumes a partial write at the first byte not taken */
	SSL_CTX_set_mode(x->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
				 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
	SSL_CTX_set_verify(x->ctx, SSL_VERIFY_PEER, NULL);
	if (ca_file ? SSL_CTX_load_verify_locations(x->ctx, ca_file, NULL) != 1 :
		      SSL_CTX_set_default_verify_paths(x->ctx) != 1) {
		snprintf(what, sizeof(what), "tls: cannot load the CA certificates %s",
			 ca_file ? ca_file : "of the system");
		goto out_fail;
	}
	if (cert_file && SSL_CTX_use_certificate_chain_file(x->ctx, cert_file) != 1) {
		snprintf(what, sizeof(what), "tls: cannot load the client certificate %s",
			 cert_file);
		goto out_fail;
	}
	if (key_file && (SSL_CTX_use_PrivateKey_file(x->ctx, key_file, SSL_FILETYPE_PEM) != 1 ||
			 SSL_CTX_check_private_key(x->ctx) != 1)) {
		snprintf(what, sizeof(what), "tls: cannot use the client key %s with %s", key_file,
			 cert_file);
		goto out_fail;
	}
	*out = x;
	return 0;

out_fail:
	say(what);
	SSL_CTX_free(x->ctx);
	free(x);
	return -EINVAL;
}

struct kvc_tls_ctx *kvc_tls_ctx_ref(struct kvc_tls_ctx *x)
{
	if (x)
		atomic_fetch_add(&x->refs, 1);
	return x;
}

void kvc_tls_ctx_unref(struct kvc_tls_ctx *x)
{
	if (!x || atomic_fetch_sub(&x->refs, 1) != 1)
		return;
	SSL_CTX_free(x->ctx);
	free(x);
}

/* Keep the eventfd readable exactly while OpenSSL holds decrypted bytes. */
static void pending_sync(struct tls_link *t)
{
	int want = SSL_pending(t->ssl) > 0;
	uint64_t v = 1;

	if (want == t->efd_set || t->efd < 0)
		return;
	if (want)
		t->efd_set = write(t->efd, &v, sizeof(v)) == sizeof(v);
	else
		t->efd_set = !(read(t->efd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN);
}

static void tls_close(struct kvc_link *l)
{
	struct tls_link *t = l->priv;

	if (t) {
		if (SSL_is_init_finished(t->ssl)) {
			ERR_clear_error();
			(void)SSL_shutdown(t->ssl); /* close_notify, if the socket takes it */
		}
		SSL_free(t->ssl);
		if (t->efd >= 0)
			close(t->efd);
		free(t);
		l->priv = NULL;
	}
	ERR_clear_error();
	kvc_tcp_transport.close(l);
}

/* Is host an IP address (no SNI for those)? */
static int is_ip(const char *host)
{
	unsigned char buf[16];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Run the handshake on the connected socket before the deadline.
 * Errors: -EPROTO (refused: why is said), -ETIMEDOUT, -ECONNRESET. */
static int handshake(struct kvc_link *l, struct tls_link *t, const char *host, uint16_t port,
		     uint64_t deadline_ms)
{
	char what[400];

	for (;;) {
		struct pollfd p = { .fd = l->fd };
		int rc, e;

		ERR_clear_error();
		rc = SSL_connect(t->ssl);
		if (rc == 1)
			return 0;
		e = SSL_get_error(t->ssl, rc);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			p.events = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
			do
				rc = poll(&p, 1, kvc_ms_until(deadline_ms));
			while (rc < 0 && errno == EINTR);
			if (rc == 0) {
				snprintf(what, sizeof(what), "tls handshake with %s:%u timed out", host,
					 port);
				kvc_frame_set_last_message(what);
				return -ETIMEDOUT;
			}
			continue;
		}
		if (SSL_get_verify_result(t->ssl) != X509_V_OK) {
			snprintf(what, sizeof(what), "tls handshake with %s:%u failed: the server's "
				 "certificate is refused: %s", host, port,
				 X509_verify_cert_error_string(SSL_get_verify_result(t->ssl)));
			ERR_clear_error();
			kvc_frame_set_last_message(what);
			return -EPROTO;
		}
		snprintf(what, sizeof(what), "tls handshake with %s:%u failed", host, port);
		if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_WRONG_VERSION_NUMBER) {
			/* what came back is not TLS: a kvpool frame, most likely */
			snprintf(what, sizeof(what), "tls handshake with %s:%u failed: the server "
				 "does not speak TLS on this port (kvpoold without tls_cert_file: "
				 "use tcp://)", host, port);
			ERR_clear_error();
			kvc_frame_set_last_message(what);
			return -EPROTO;
		}
		if (ERR_peek_error() == 0) {
			snprintf(what, sizeof(what), "tls handshake with %s:%u failed: the server "
				 "closed the connection (a server without TLS, or one that refused "
				 "this client's certificate)", host, port);
			kvc_frame_set_last_message(what);
			return -EPROTO;
		}
		say(what);
		return -EPROTO;
	}
}

static int tls_open(struct kvc_link *l, const char *host, uint16_t port, uint64_t deadline_ms)
{
	struct kvc_tls_ctx *x = l->tls;
	struct tls_link *t;
	int rc;

	if (!x)
		return -EINVAL;
	rc = kvc_tcp_transport.open(l, host, port, deadline_ms);
	if (rc)
		return rc;
	t = calloc(1, sizeof(*t));
	if (!t) {
		kvc_tcp_transport.close(l);
		return -ENOMEM;
	}
	t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	l->priv = t;
	t->ssl = SSL_new(x->ctx);
	if (t->efd < 0 || !t->ssl || SSL_set_fd(t->ssl, l->fd) != 1) {
		tls_close(l);
		return -ENOMEM;
	}
	if (!is_ip(host))
		SSL_set_tlsext_host_name(t->ssl, host);
	if (!(x->flags & KVPOOL_TLS_NO_VERIFY_HOSTNAME) && SSL_set1_host(t->ssl, host) != 1) {
		tls_close(l);
		return -ENOMEM;
	}
	rc = handshake(l, t, host, port, deadline_ms);
	if (rc)
		tls_close(l);
	return rc;
}

/* Map a failed SSL_read or SSL_write. */
static ssize_t io_error(struct tls_link *t, int rc)
{
	int e = SSL_get_error(t->ssl, rc);

	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
		return -EAGAIN;
	if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == EPIPE) {
		ERR_clear_error();
		return -EPIPE;
	}
	if (e == SSL_ERROR_SSL) {
		/* an alert from the server (TLS 1.3 sends "certificate
		 * required" after the client's side of the handshake is
		 * done, so it arrives on the first read) or a bad record */
		say("tls: the session with the server failed");
		return -EPROTO;
	}
	ERR_clear_error();
	return e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ? -ECONNRESET : -EPROTO;
}

static ssize_t tls_send(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	struct tls_link *t = l->priv;
	ssize_t total = 0;

	for (size_t i = 0; i < n; i++) {
		size_t w = 0;
		int rc;

		if (!iov[i].iov_len)
			continue;
		ERR_clear_error();
		rc = SSL_write_ex(t->ssl, iov[i].iov_base, iov[i].iov_len, &w);
		if (rc != 1) {
			ssize_t err = io_error(t, rc);

			return total ? total : err;
		}
		total += (ssize_t)w;
		if (w < iov[i].iov_len)
			break;
	}
	return total;
}

static ssize_t tls_recv(struct kvc_link *l, const struct iovec *iov, size_t n)
{
	struct tls_link *t = l->priv;
	ssize_t total = 0;

	for (size_t i = 0; i < n; i++) {
		size_t r = 0;
		int rc;

		if (!iov[i].iov_len)
			continue;
		ERR_clear_error();
		rc = SSL_read_ex(t->ssl, iov[i].iov_base, iov[i].iov_len, &r);
		if (rc != 1) {
			ssize_t err = io_error(t, rc);

			pending_sync(t);
			return total ? total : err;
		}
		total += (ssize_t)r;
		if (r < iov[i].iov_len)
			break; /* the record ended */
	}
	pending_sync(t);
	return total;
}

/* Idle: bytes waiting inside OpenSSL or on the socket mean the server
 * closed (close_notify, an alert) or sent something unsolicited. */
static int tls_stale(struct kvc_link *l)
{
	struct tls_link *t = l->priv;

	return SSL_pending(t->ssl) > 0 || kvc_tcp_transport.stale(l);
}

static int tls_pollfds(const struct kvc_link *l, int want_send, struct pollfd *p)
{
	const struct tls_link *t = l->priv;

	p[0] = (struct pollfd){ .fd = l->fd, .events = POLLIN | (want_send ? POLLOUT : 0) };
	if (t->efd < 0)
		return 1;
	p[1] = (struct pollfd){ .fd = t->efd, .events = POLLIN };
	return 2;
}

const struct kvc_transport_ops kvc_tls_transport = {
	.name = "tls",
	.open = tls_open,
	.close = tls_close,
	.stale = tls_stale,
	.send = tls_send,
	.recv = tls_recv,
	.pollfds = tls_pollfds,
};
