/*
 * srv_consts.c - the constants that proto/ (the wire) and storage/ (the
 * pool) must agree on, tied together when the server is built. The server
 * is where one becomes the other: keys and names from the wire go to the
 * pool as they are, and a GET or EXISTS reports the pool's tier as the
 * wire's. (client/lib/client.h ties libkvpool's KVPOOL_KEY_BYTES to the
 * wire's in the same way.) No code.
 */
#include "proto.h"
#include "store.h"

_Static_assert(STORE_KEY_BYTES == PROTO_KEY_BYTES, "a pool key is a wire key");
_Static_assert(STORE_NAME_MAX_BYTES == PROTO_NAME_MAX_BYTES,
	       "the pool takes every namespace name the wire can carry, and no longer one");
_Static_assert(STORE_TIER_DRAM == PROTO_TIER_DRAM && STORE_TIER_NVME == PROTO_TIER_NVME,
	       "store_ref.tier goes on the wire as it is");
_Static_assert(STORE_MATCH_LEASE_CUT == PROTO_MATCH_LEASE_CUT &&
		       STORE_MATCH_RETAIN_BUDGET == PROTO_MATCH_RETAIN_BUDGET &&
		       STORE_MATCH_RETAIN_CLAMPED == PROTO_MATCH_RETAIN_CLAMPED,
	       "store_match_res.flags go into the MATCH reply as they are");
_Static_assert(STORE_PUT_RETAINED == PROTO_PUT_RETAINED &&
		       STORE_PUT_RETAIN_BUDGET == PROTO_PUT_RETAIN_BUDGET &&
		       STORE_PUT_RETAIN_CLAMPED == PROTO_PUT_RETAIN_CLAMPED,
	       "store_retain_res.flags go into the PUT result as they are");
