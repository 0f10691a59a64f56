/*
 * bench_data.c - the keys and payloads of `kvpool bench`.
 *
 * A payload must be checkable byte by byte on GET, yet generating it per
 * PUT would cost the client as much CPU as sending it. So every payload is
 * the key (32 bytes, which makes it unique) followed by a window of one
 * large pseudo-random source buffer, at an offset derived from the key:
 * PUT sends it from the source with no copy, GET compares with memcmp.
 */
#include "bench.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "payload.h"

#define GOLDEN 0x9e3779b97f4a7c15ULL
#define WINDOW_ALIGN 64  /* windows start on a cache line */

/* splitmix64's finaliser: a bijection of 64-bit words. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void *cli_bench_map(uint64_t bytes)
{
	void *p;

	if (!bytes || bytes > SIZE_MAX)
		return NULL;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, bytes, MADV_HUGEPAGE);
	memset(p, 0, bytes); /* faulted in now, not while measuring */
	return p;
}

void cli_bench_unmap(void *p, uint64_t bytes)
{
	if (p)
		munmap(p, bytes);
}

int cli_bench_src_init(struct cli_bench_src *src, uint64_t bytes)
{
	static const uint8_t seed_key[KVPOOL_KEY_BYTES] = "kvpool bench payload source";
	uint8_t *buf;

	if (bytes < WINDOW_ALIGN)
		return -ENOMEM;
	buf = cli_bench_map(bytes);
	if (!buf)
		return -ENOMEM;
	cli_payload_fill(seed_key, buf, bytes);
	src->buf = buf;
	src->bytes = bytes;
	return 0;
}

void cli_bench_src_release(struct cli_bench_src *src)
{
	cli_bench_unmap(src->buf, src->bytes);
	src->buf = NULL;
	src->bytes = 0;
}

/* Invertible: word 0 gives c, word 1 then a (so the nonce), word 2 then b
 * (so conn and phase), and c with b gives seq. */
void cli_bench_key(uint64_t nonce, uint32_t conn, uint32_t phase, uint64_t seq,
		   uint8_t key[KVPOOL_KEY_BYTES])
{
	uint64_t a = mix64(nonce + GOLDEN);
	uint64_t b = mix64((((uint64_t)conn << 32) | phase) ^ a);
	uint64_t c = mix64(seq ^ b);
	uint64_t w[4];

	w[0] = c;
	w[1] = mix64(c ^ a);
	w[2] = mix64(w[1] ^ b);
	w[3] = mix64(w[2] + GOLDEN);
	memcpy(key, w, sizeof(w));
}

/* Where the window of a block of `len` bytes starts in the source. */
static uint64_t window_offset(const struct cli_bench_src *src, const uint8_t *key,
			      uint64_t window)
{
	uint64_t slots = (src->bytes - window) / WINDOW_ALIGN + 1, w;

	memcpy(&w, key + 8, sizeof(w));
	return (mix64(w) % slots) * WINDOW_ALIGN;
}

void cli_bench_block_iov(const struct cli_bench_src *src, const uint8_t *key, uint64_t len,
			 struct iovec iov[2])
{
	uint64_t head = len < KVPOOL_KEY_BYTES ? len : KVPOOL_KEY_BYTES;
	uint64_t window = len - head;

	iov[0].iov_base = (void *)key;
	iov[0].iov_len = head;
	iov[1].iov_base = window ? src->buf + window_offset(src, key, window) : NULL;
	iov[1].iov_len = window;
}

bool cli_bench_block_check(const struct cli_bench_src *src, const uint8_t *key, const void *buf,
			   uint64_t len)
{
	struct iovec iov[2];
	const uint8_t *p = buf;

	if (len > src->bytes)
		return false;
	cli_bench_block_iov(src, key, len, iov);
	if (memcmp(p, iov[0].iov_base, iov[0].iov_len))
		return false;
	return !iov[1].iov_len || !memcmp(p + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
}
