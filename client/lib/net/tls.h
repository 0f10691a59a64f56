/*
 * tls.h - the TLS peer of libkvpool's transports (internal): a stream
 * peer (transport.h) like TCP, over a TCP socket, with OpenSSL. Its
 * settings, the handle's context, are in tls_ctx.h.
 */
#ifndef KVC_TLS_H
#define KVC_TLS_H

#include "tls_ctx.h"
#include "transport.h"

/* The TLS peer. Its open needs l->tls (the session's context). */
extern const struct kvc_transport_ops kvc_tls_transport;

#endif /* KVC_TLS_H */
