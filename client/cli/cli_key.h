/*
 * cli_key.h - block keys as typed on the command line.
 *
 * A key is 64 hex digits (the 32-byte block hash), or "text:STRING", which
 * stands for SHA-256 of STRING's bytes: handy for trying the pool by hand.
 * Pure functions; any thread.
 */
#ifndef KVPOOL_CLI_KEY_H
#define KVPOOL_CLI_KEY_H

#include <stdint.h>

#include "kvpool.h"

/* Hex text of a key plus its NUL. */
#define CLI_KEY_HEX_BYTES (2 * KVPOOL_KEY_BYTES + 1)

/* Parse `s` into out[0..KVPOOL_KEY_BYTES). Returns 0, or -EINVAL (not 64
 * hex digits nor "text:..."), or -EIO (the digest failed). out is written
 * only on success. */
int cli_key_parse(const char *s, uint8_t out[KVPOOL_KEY_BYTES]);

/* Write key's lowercase hex and a NUL into hex[0..CLI_KEY_HEX_BYTES).
 * Returns hex. Cannot fail. */
char *cli_key_hex(const uint8_t key[KVPOOL_KEY_BYTES], char hex[CLI_KEY_HEX_BYTES]);

#endif /* KVPOOL_CLI_KEY_H */
