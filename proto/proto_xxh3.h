/*
 * proto_xxh3.h - the block checksum's hash, chosen in one place: xxh3-64
 * (PROTOCOL.md: the client computes it on PUT, the server verifies it on
 * arrival and whenever bytes come back from NVMe, GET returns it).
 *
 * Header only, and nothing of proto/ is linked for it: the client, the
 * server and storage/ include it (tests/deps_rules.txt allows storage this
 * one header of proto/). It includes libxxhash with its static-linking
 * declarations (XXH3_state_t may live on the stack) and, on x86-64 where
 * the library installs them, the AVX2 / AVX-512 entry points picked at
 * run time by the CPU (xxh_x86dispatch.h renames XXH3_64bits and the
 * streaming calls to them). The plain entry points are SSE2 and several
 * times slower on long payloads; the digests are the same.
 */
#ifndef KVPOOL_PROTO_XXH3_H
#define KVPOOL_PROTO_XXH3_H

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY
#endif
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#endif /* KVPOOL_PROTO_XXH3_H */
