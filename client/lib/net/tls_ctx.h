/*
 * tls_ctx.h - the TLS settings of a handle (internal): what the layers
 * above the transports (api/, cluster/) hold and pass down to the TLS
 * peer (tls.h) of libkvpool's transports: tls:// URLs,
 * kvpool over TLS on the server's one data port (the server tells a TLS
 * ClientHello from a plaintext frame by the first byte). A stream peer
 * (transport.h) like TCP, over a TCP socket, with OpenSSL.
 *
 * Settings (struct kvpool_options, else the environment):
 *   CA certificates   tls_ca_file, else $KVPOOL_TLS_CA, else the
 *                     system's trust store (OpenSSL's default paths)
 *   client identity   tls_cert_file + tls_key_file, else $KVPOOL_TLS_CERT
 *                     + $KVPOOL_TLS_KEY, else none (the server may require
 *                     one: tls_client_ca_file)
 *   host name check   on: the server's certificate must name the URL's
 *                     host (DNS name or IP address); KVPOOL_TLS_NO_VERIFY_HOSTNAME
 *                     turns it off (the chain is still verified)
 * TLS 1.2 or later; kernel TLS when the kernel and OpenSSL offer it.
 *
 * A handshake that fails (an untrusted or expired certificate, a host
 * name the certificate does not name, a client certificate the server
 * refuses, a server without TLS) fails the connect with -EPROTO and the
 * reason in kvpool_last_server_message ("tls handshake with HOST:PORT
 * failed: the server's certificate is refused: certificate has expired").
 *
 * Threads: a context is shared by the sessions of one handle (reference
 * counted, atomically); a link is used by its session's thread only.
 */
#ifndef KVC_TLS_CTX_H
#define KVC_TLS_CTX_H

#include <stdint.h>

/* The TLS settings of a handle: an OpenSSL client context, shared. */
struct kvc_tls_ctx;

/* Make the context: the CA certificates, the client certificate and key
 * (each NULL: from the environment, above), and flags (KVPOOL_TLS_*).
 * Strings are borrowed for the call (the files are read now).
 * Errors: -EINVAL (a file that does not load, a key that does not match
 * its certificate, a certificate without a key or the reverse: the reason
 * is in kvpool_last_server_message), -ENOMEM. */
int kvc_tls_ctx_new(const char *ca_file, const char *cert_file, const char *key_file,
		    uint32_t flags, struct kvc_tls_ctx **out);

/* Take one more reference; returns x. Accepts NULL. */
struct kvc_tls_ctx *kvc_tls_ctx_ref(struct kvc_tls_ctx *x);

/* Drop a reference; the last frees the context. Accepts NULL. */
void kvc_tls_ctx_unref(struct kvc_tls_ctx *x);

#endif /* KVC_TLS_CTX_H */
