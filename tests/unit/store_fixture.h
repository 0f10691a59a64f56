/*
 * store_fixture.h - helpers the storage tests share (test_store.c,
 * test_tier.c, test_store_faults.c; store_fixture.c, linked into each):
 * keys by number, a pool opened or checked with cmocka assertions, a
 * scratch directory for an NVMe tier. Every function fails the running
 * cmocka test on an error rather than returning it.
 */
#ifndef KVPOOL_TEST_STORE_FIXTURE_H
#define KVPOOL_TEST_STORE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* splitmix64's finaliser of z + the golden gamma: well-mixed 64 bits
 * from a counter (the same function in every storage test, so that a
 * test's keys and payloads do not change with where it lives). Inline:
 * payload fills call it every 8 bytes, inside timed loops. */
static inline uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Key number id: 32 pseudo-random bytes (mix64 of id * 4 + 1 .. 4), never
 * all zero, distinct for distinct ids. */
void key_of(uint64_t id, uint8_t key[STORE_KEY_BYTES]);

/* Payload length of block id: 5..20 KiB (from mix64 of id), never a
 * multiple of the 4 KiB page. */
uint64_t len_of(uint64_t id);

/* Sleep ms milliseconds (restarted when a signal interrupts it). */
void sleep_ms(unsigned int ms);

/* Fail the test with store_check's reason unless every invariant holds. */
void assert_check(struct store *s);

/* store_stats of s, by value. */
struct store_stats stats_of(struct store *s);

/* Open a pool with *cfg into *s (the test fails with store_open's error
 * and reason otherwise) and, when ns_name is not NULL, take namespace
 * ns_name's id into *ns_id (released by store_fixture_close). */
void store_fixture_open(const struct store_config *cfg, struct store **s, const char *ns_name,
			uint32_t *ns_id);

/* Release namespace ns_id (0: none taken) and close *s; *s becomes NULL. */
void store_fixture_close(struct store **s, uint32_t ns_id);

/* A fresh directory /tmp/<prefix>-XXXXXX, its path in dir[0..cap). */
void store_fixture_tmpdir(char *dir, size_t cap, const char *prefix);

/* Remove dir and everything under it (no symlink followed); no-op for "". */
void store_fixture_rmdir(const char *dir);

#endif /* KVPOOL_TEST_STORE_FIXTURE_H */
