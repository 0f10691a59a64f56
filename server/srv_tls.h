/*
 * srv_tls.h - TLS on the data port (OpenSSL): the server's certificate,
 * key and client CA as one context that SIGHUP can replace, and each
 * connection's session. A layer under the TCP transport (srv_tcp.c): the
 * framing, backpressure and the output queue are the same for both; only
 * the bytes in and out pass through here.
 *
 * One port serves both: a TLS ClientHello starts with a handshake record
 * (0x16), kvpool's frames with the magic 'K' (0x4b), so the first byte
 * tells them apart (srv_tls_first_byte_is_tls). tls_only refuses the
 * plaintext ones.
 *
 * Kernel TLS: the context asks OpenSSL for it (SSL_OP_ENABLE_KTLS). When
 * the kernel has the tls module and the cipher suits it, OpenSSL hands the
 * session's keys to the kernel after the handshake; then the socket
 * encrypts what is written to it (srv_tls_ktls_send: the TCP transport
 * keeps writing GET blocks straight from the arena with writev, and the
 * kernel encrypts them without a copy in user space) and, for TLS 1.2 with
 * OpenSSL 3.0, decrypts what is read (SSL_read then reads through the
 * kernel). Otherwise OpenSSL encrypts in user space (srv_tls_writev).
 *
 * Threads: a context is made, reloaded and freed on the main thread;
 * srv_tls_new may be called from any worker at the same time as a reload
 * (a mutex guards the swap). A session is used by its connection's worker
 * only. OpenSSL's error queue is per thread; every call here clears it
 * first and consumes what it left.
 */
#ifndef KVPOOL_SRV_TLS_H
#define KVPOOL_SRV_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct conf;
struct srv_tls_ctx;
struct srv_tls;

/* The first byte of a TLS record carrying a handshake message (a
 * ClientHello); a kvpool frame starts with 'K' (PROTO_MAGIC). */
#define SRV_TLS_HANDSHAKE_BYTE 0x16

/* Is TLS configured (tls_cert_file set)? */
bool srv_tls_configured(const struct conf *c);

/* Is tls_only in force for c: "true", or "auto" with a certificate and a
 * listen address that is not loopback (listen_loopback says whether c's
 * listen address is, srv_listen_is_loopback)? */
bool srv_tls_only(const struct conf *c, bool listen_loopback);

/* Load tls_cert_file (a PEM chain, leaf first), tls_key_file (PEM; it
 * must match the certificate, and others may not read it nor group or
 * others write it) and tls_client_ca_file (PEM CAs; when set, clients
 * must present a certificate signed by one), and make the context
 * (TLS 1.2 or later, kernel TLS asked for, no session tickets). An
 * expired or not yet valid certificate loads, with a warning in *warn
 * (clients will refuse it; SIGHUP installs its replacement); *warn is ""
 * otherwise. err[0..err_len) receives a one-line reason naming the
 * setting and file on failure.
 * Errors: -EINVAL (a file that does not load: missing, unreadable, not
 * PEM, a key that does not match), -EPERM (key file mode), -ENOMEM. */
int srv_tls_ctx_open(const struct conf *c, struct srv_tls_ctx **out, char *warn, size_t warn_len,
		     char *err, size_t err_len);

/* Load c's files again (the paths may have changed) and, only when they
 * load, make new sessions use them; sessions already open keep theirs and
 * are not disturbed. Same errors and warnings as srv_tls_ctx_open (the old
 * context stays on error), and -EKEYEXPIRED: the new certificate is
 * expired or not yet valid while the one in use is valid (a reload never
 * swaps a working certificate for one every client refuses). Main thread. */
int srv_tls_ctx_reload(struct srv_tls_ctx *x, const struct conf *c, char *warn, size_t warn_len,
		       char *err, size_t err_len);

/* One line describing the current certificate (subject, expiry), for
 * logs. */
void srv_tls_ctx_describe(struct srv_tls_ctx *x, char *buf, size_t len);

/* Destructor (sessions still open keep what they use). Accepts NULL. */
void srv_tls_ctx_free(struct srv_tls_ctx *x);

/* A server session over the non-blocking socket fd (borrowed: the caller
 * closes it after srv_tls_free). Errors: -ENOMEM. */
int srv_tls_new(struct srv_tls_ctx *x, int fd, struct srv_tls **out);

/* Advance the handshake. Returns 0 when it is complete, -EAGAIN when it
 * waits for the socket (*want_write: it must be writable; else readable),
 * 0 is never returned twice. Errors: -EPROTO (the handshake failed: why
 * says how, e.g. "certificate verify failed", "peer sent alert unknown
 * ca", "no shared cipher"), -ECONNRESET (the peer closed during it). */
int srv_tls_handshake(struct srv_tls *t, bool *want_write, char *why, size_t why_len);

/* Decrypted bytes of the session's current record not read yet: the
 * socket may be empty while these wait, so a reader must not wait for it
 * to become readable. */
bool srv_tls_pending(struct srv_tls *t);

/* Read up to len bytes. Returns > 0, 0 at the peer's close (close_notify
 * or EOF), -EAGAIN (nothing now), -EPROTO (a bad record or alert; the
 * session is dead). */
long srv_tls_read(struct srv_tls *t, void *buf, size_t len);

/* srv_tls_read into iov[0..n) in order: returns the total read (which may
 * be less than asked), or as srv_tls_read when nothing was read. */
long srv_tls_readv(struct srv_tls *t, const struct iovec *iov, int n);

/* Encrypt and send iov[0..n) in order, with OpenSSL in user space (for a
 * session whose kernel does not send: !srv_tls_ktls_send). Returns the
 * bytes taken (> 0; a short count when the socket filled), -EAGAIN
 * (nothing taken), -EPIPE or -EPROTO. After -EAGAIN or a short count the
 * next call must start at the first byte not taken, at the same or a new
 * address, with at least as many bytes (the output queue does). */
long srv_tls_writev(struct srv_tls *t, const struct iovec *iov, int n);

/* After the handshake: does the kernel encrypt what is written to the
 * socket (then plain write/writev/sendfile on it send TLS records), and
 * decrypt what is read (srv_tls_read reads through it)? */
bool srv_tls_ktls_send(struct srv_tls *t);
bool srv_tls_ktls_recv(struct srv_tls *t);

/* "TLSv1.3 TLS_AES_256_GCM_SHA384" or similar, after the handshake. */
void srv_tls_describe(struct srv_tls *t, char *buf, size_t len);

/* Send close_notify now if the session is up and has not sent it (best
 * effort: a full socket drops it; never waits): the peer then reads a
 * clean end of the stream. */
void srv_tls_close_notify(struct srv_tls *t);

/* srv_tls_close_notify, then free the session. Accepts NULL. */
void srv_tls_free(struct srv_tls *t);

#endif /* KVPOOL_SRV_TLS_H */
