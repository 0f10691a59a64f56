/*
 * store_xxh3.h - xxh3-64 for storage/ (internal): libxxhash's AVX2 /
 * AVX-512 entry points, chosen at run time by the CPU, where the library
 * installs them (x86-64). Its plain entry points are SSE2 and several
 * times slower on long payloads; the digests are the same.
 */
#ifndef KVPOOL_STORE_XXH3_H
#define KVPOOL_STORE_XXH3_H

#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#endif /* KVPOOL_STORE_XXH3_H */
