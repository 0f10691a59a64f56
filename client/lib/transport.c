/*
 * transport.c - which transport a handle uses: rdma:// and auto:// URLs.
 *
 * auto:// connects over TCP and says HELLO; the reply's rdma_port tells
 * whether the server serves RDMA. The handle then moves to RDMA when it
 * can, else stays on TCP and says why on stderr once. The RDMA data path
 * of libkvpool (PUT/GET messages with remote-buffer descriptors) is not
 * built yet, so today every auto:// handle stays on TCP and rdma:// fails
 * once it knows whether an RDMA connection could be made at all.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "conn.h"
#include "rdma.h"

/* Milliseconds left until deadline_ms (at least 1). */
static uint32_t left_ms(uint64_t deadline_ms)
{
	uint64_t now = kvc_now_ms();

	return deadline_ms > now + 1 ? (uint32_t)(deadline_ms - now) : 1;
}

/* Try an rdma_cm connection to host:port; 0 if one could be made (it is
 * closed again: there is no data path to hand it to yet). */
static int rdma_probe(const char *host, uint16_t port, uint64_t deadline_ms)
{
	struct rdma_client *r = NULL;
	int rc = rdma_client_connect(host, port, left_ms(deadline_ms), NULL, &r);

	if (rc == 0)
		rdma_client_close(r);
	return rc;
}

int kvc_rdma_open(struct kvpool_client *c, uint64_t deadline_ms)
{
	int rc = rdma_probe(c->url.host, c->url.port, deadline_ms);

	if (rc)
		return rc;
	return -EOPNOTSUPP;
}

void kvc_auto_transport(struct kvpool_client *c, uint64_t deadline_ms)
{
	uint16_t port = c->limits.rdma_port;
	int rc;

	if (c->transport_logged)
		return;
	c->transport_logged = 1;
	if (port == 0) {
		fprintf(stderr, "libkvpool: auto://%s:%u: the server does not serve rdma; using tcp\n",
			c->url.host, c->url.port);
		return;
	}
	rc = rdma_probe(c->url.host, port, deadline_ms);
	if (rc)
		fprintf(stderr, "libkvpool: auto://%s:%u: rdma port %u unusable (%s); using tcp\n",
			c->url.host, c->url.port, port, kvpool_strerror(rc));
	else
		fprintf(stderr, "libkvpool: auto://%s:%u: rdma reachable on port %u, but this "
			"libkvpool has no rdma data path yet; using tcp\n", c->url.host, c->url.port,
			port);
}
