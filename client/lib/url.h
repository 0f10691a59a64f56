/*
 * url.h - parse libkvpool server URLs (internal to libkvpool).
 *
 * Accepted forms: tcp://HOST[:PORT], tls://HOST[:PORT] (TLS on the same
 * data port), rdma://HOST[:PORT] and auto://HOST[:PORT], where HOST is a
 * host name, a dotted IPv4 address or a bracketed IPv6 address ("[::1]"),
 * and PORT is 1..65535 (default KVC_URL_DEFAULT_PORT, or
 * KVC_URL_DEFAULT_RDMA_PORT for rdma://; auto:// names the TCP port).
 * Other schemes are refused with -EOPNOTSUPP.
 */
#ifndef KVC_URL_H
#define KVC_URL_H

#include <stdint.h>

#define KVC_URL_DEFAULT_PORT 7470
#define KVC_URL_DEFAULT_RDMA_PORT 7472
#define KVC_URL_HOST_MAX_BYTES 255

enum kvc_transport {
	KVC_TRANSPORT_TCP = 1,
	KVC_TRANSPORT_RDMA = 2, /* rdma://: rdma_cm only */
	KVC_TRANSPORT_AUTO = 3, /* auto://: TCP first, RDMA when the HELLO reply offers it */
	KVC_TRANSPORT_TLS = 4,  /* tls://: TLS over TCP (net/tls.h) */
};

struct kvc_url {
	enum kvc_transport transport;
	char host[KVC_URL_HOST_MAX_BYTES + 1]; /* NUL-terminated, brackets removed */
	uint16_t port;
	char port_str[6];                      /* the port in decimal, for getaddrinfo */
};

/* Parse `url` (NUL-terminated) into *out. Pure: no name resolution.
 * Errors: -EINVAL (NULL, malformed, empty host, bad port, trailing
 * characters, host longer than KVC_URL_HOST_MAX_BYTES), -EOPNOTSUPP (a
 * well-formed "scheme://" other than tcp, tls, rdma or auto). *out is written only on success. */
int kvc_url_parse(const char *url, struct kvc_url *out);

#endif /* KVC_URL_H */
