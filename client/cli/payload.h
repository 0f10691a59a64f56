/*
 * payload.h - deterministic block payloads for `kvpool replay`.
 *
 * A replayed block's bytes are a function of its key and of the byte offset
 * only: a 64-bit seed folded from the whole 32-byte key drives a counter-mode
 * splitmix64 stream, one 64-bit word (stored little-endian) per 8 bytes. Any
 * reader can therefore check a block it got back without keeping a copy, and
 * a wrong block, a torn one (part of another key's bytes) or a single flipped
 * bit is detected. Both directions run at several GB/s per core.
 *
 * Pure functions; any thread.
 */
#ifndef KVPOOL_CLI_PAYLOAD_H
#define KVPOOL_CLI_PAYLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

/* Write the payload of `key` (KVPOOL_KEY_BYTES) into buf[0..len_bytes).
 * Cannot fail. */
void cli_payload_fill(const uint8_t *key, void *buf, size_t len_bytes);

/* Is buf[0..len_bytes) exactly the payload of `key` at that length? */
bool cli_payload_check(const uint8_t *key, const void *buf, size_t len_bytes);

#endif /* KVPOOL_CLI_PAYLOAD_H */
