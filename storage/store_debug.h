/*
 * store_debug.h - test hooks for storage/ (unit tests only; the server
 * never includes this).
 */
#ifndef KVPOOL_STORE_DEBUG_H
#define KVPOOL_STORE_DEBUG_H

#include <stdint.h>

#include "store.h"

/* Remove the visible block (ns_id, key) WITHOUT its descendants, leaving
 * them in the pool with a missing parent: a deliberate hole, so a test can
 * show that store_check reports it. The pool stays memory-safe (it can be
 * used and closed) but its invariants are broken from then on.
 * Errors: -ENOENT (no such visible block). */
int store_debug_remove_one(struct store *s, uint32_t ns_id, const uint8_t key[STORE_KEY_BYTES]);

#endif /* KVPOOL_STORE_DEBUG_H */
