/*
 * testing.h - what libkvpool's tests look at inside a handle (internal;
 * not exported by libkvpool.so). One-node handles only, unless said.
 */
#ifndef KVC_TESTING_H
#define KVC_TESTING_H

#include <stddef.h>

#include "kvpool.h"
#include "lib/engine/engine.h"
#include "lib/net/regions.h"

/* Is the handle connected now (TCP or RDMA)? */
int kvc_connected(const struct kvpool_client *c);

/* Close the handle's connection now; the next call reconnects. */
void kvc_disconnect(struct kvpool_client *c);

/* The registered region that holds all of buf[0..len), or NULL. */
const struct kvc_region *kvc_region_find(const struct kvpool_client *c, const void *buf,
					 size_t len);

/* The message of the last error reply the handle received ("" if none). */
const char *kvc_server_message(const struct kvpool_client *c);

/* GET blocks whose bytes failed checksum verification on this handle. */
uint64_t kvc_checksum_errors(const struct kvpool_client *c);

/* The engine's state (engine.h). */
void kvc_info(const struct kvpool_client *c, struct kvc_engine_info *out);

#endif /* KVC_TESTING_H */
