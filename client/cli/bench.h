/*
 * bench.h - what `kvpool bench` measures, how it parses its command line,
 * the blocks it moves and how it reports. Shared by cli_bench.c (the run),
 * bench_data.c (keys and payloads) and bench_report.c (the report).
 *
 * Pipelining: a libkvpool call blocks until its reply, so one connection
 * has one call in flight; a call of N blocks is one request frame (when N
 * is within the server's max_batch_blocks). The blocks per call (--batch,
 * alias --depth) are therefore the blocks in flight per connection, the
 * unit `redis-benchmark -P` and tests/bench/wire's depth are compared with.
 * With --async each connection's thread keeps --inflight requests of
 * --batch blocks in flight with kvpool_submit_* and kvpool_poll; latency
 * is then per request, from submit to the poll that returned it.
 *
 * Pure functions unless they say otherwise; any thread.
 */
#ifndef KVPOOL_CLI_BENCH_H
#define KVPOOL_CLI_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>

#include "cli_opts.h"
#include "kvpool.h"

#define CLI_BENCH_MAX_SIZES 16
#define CLI_BENCH_MIN_BLOCK_BYTES 1ULL
#define CLI_BENCH_MAX_BLOCK_BYTES (1ULL << 30)       /* 1 GiB */
#define CLI_BENCH_MAX_CONNECTIONS 256
#define CLI_BENCH_MAX_BATCH 65536
#define CLI_BENCH_MAX_CHAIN 65536
#define CLI_BENCH_DEFAULT_CHAIN 1000
#define CLI_BENCH_DEFAULT_DURATION_S 2.0
#define CLI_BENCH_MAX_DURATION_S 3600.0
#define CLI_BENCH_DEFAULT_SOURCE_BYTES (1ULL << 30)  /* 1 GiB, as tests/bench/wire */
#define CLI_BENCH_MIN_SOURCE_BYTES (1ULL << 20)
#define CLI_BENCH_MAX_SOURCE_BYTES (64ULL << 30)
#define CLI_BENCH_CHAIN_BLOCK_BYTES 4096ULL          /* MATCH chain blocks */
#define CLI_BENCH_DEFAULT_INFLIGHT 8                 /* --async requests in flight */
#define CLI_BENCH_MAX_INFLIGHT 1024

/* Operations, as bits of cli_bench_opts.ops. */
enum cli_bench_op {
	CLI_BENCH_PUT,
	CLI_BENCH_GET,
	CLI_BENCH_EXISTS,
	CLI_BENCH_MATCH,
	CLI_BENCH_NOPS,
};

/* "put", "get", "exists", "match". */
const char *cli_bench_op_name(enum cli_bench_op op);

/* What the command line asked for. Strings are borrowed from argv. */
struct cli_bench_opts {
	struct cli_conn conn;
	uint64_t sizes[CLI_BENCH_MAX_SIZES];  /* block sizes, in the order given */
	size_t n_sizes;
	unsigned int ops;          /* 1 << enum cli_bench_op */
	uint32_t batch;            /* blocks (keys) per call = in flight per connection */
	uint32_t connections;      /* threads, one client handle each */
	double duration_s;         /* per phase; used when count == 0 */
	uint64_t count;            /* blocks (MATCH: chain matches) per phase, all
				      connections together; 0: run for duration_s */
	uint32_t chain;            /* blocks in the MATCH chain */
	uint32_t lease_ms;         /* lease each MATCH asks for (0: none) */
	uint64_t source_bytes;     /* payload source buffer */
	bool json;
	bool keep_namespace;       /* do not drop the namespace before and after */
	bool async;                /* drive the asynchronous API (kvpool_submit_*) */
	uint32_t inflight;         /* --async: requests of `batch` blocks in flight
				      per connection */
};

/* Parse a comma-separated list of block sizes ("64KiB,1MiB", units as
 * cli_parse_size) into sizes[0..cap); *n receives the count. Each must be
 * within CLI_BENCH_MIN_BLOCK_BYTES..CLI_BENCH_MAX_BLOCK_BYTES and appear
 * once. Returns 0, -EINVAL (empty list or item, bad number or unit, a size
 * out of range, a repeated size) or -E2BIG (more than cap sizes). Nothing
 * is written on failure. */
int cli_bench_parse_sizes(const char *list, uint64_t *sizes, size_t cap, size_t *n);

/* Parse a comma-separated list of operation names (put, get, exists,
 * match, or all) into a bit mask. Returns 0 or -EINVAL (empty, unknown
 * name). *mask is written only on success. */
int cli_bench_parse_ops(const char *list, unsigned int *mask);

/* Parse bench's command line into *o (defaults first). Prints usage
 * errors as the other subcommands do. Returns -1 to go on, or the exit
 * code to return now (--help: 0; a bad option or value: 2). Uses getopt:
 * single-threaded callers only. */
int cli_bench_parse_args(int argc, char **argv, struct cli_bench_opts *o);

/* ---- keys and payloads (bench_data.c) ------------------------------------- */

/* The source every payload is cut from: `bytes` of a fixed pseudo-random
 * stream, large enough that blocks sent from it do not stay in cache. */
struct cli_bench_src {
	uint8_t *buf;
	uint64_t bytes;
};

/* Anonymous memory of `bytes`, zeroed and faulted in, on huge pages where
 * the kernel gives them (copies to and from 4 KiB pages pay a TLB miss per
 * page; on some virtual machines that costs several times the copy).
 * Returns NULL on failure. Free with cli_bench_unmap. */
void *cli_bench_map(uint64_t bytes);

/* Free what cli_bench_map returned (NULL is ignored). */
void cli_bench_unmap(void *p, uint64_t bytes);

/* Allocate (cli_bench_map) and fill a source of `bytes` (>= 64). Returns
 * 0 or -ENOMEM. Not thread-safe for the same src. */
int cli_bench_src_init(struct cli_bench_src *src, uint64_t bytes);

/* Free the source. Accepts a zeroed one. */
void cli_bench_src_release(struct cli_bench_src *src);

/* Key of block `seq` of connection `conn` in phase `phase` of the run
 * whose random tag is `nonce`: distinct for distinct arguments (the
 * mapping is invertible), every byte well mixed. Cannot fail. */
void cli_bench_key(uint64_t nonce, uint32_t conn, uint32_t phase, uint64_t seq,
		   uint8_t key[KVPOOL_KEY_BYTES]);

/* The payload of a block is a function of its key: its first
 * min(len, 32) bytes are the key itself, the rest a window of the source
 * at an offset taken from the key. Writes the two iovecs that send it
 * (iov[1] may be empty) without copying. len must be at most
 * src->bytes. Cannot fail. */
void cli_bench_block_iov(const struct cli_bench_src *src, const uint8_t *key, uint64_t len,
			 struct iovec iov[2]);

/* Is buf[0..len) exactly the payload of `key` at that length? */
bool cli_bench_block_check(const struct cli_bench_src *src, const uint8_t *key, const void *buf,
			   uint64_t len);

/* ---- results (bench_report.c) ---------------------------------------------- */

/* One measured phase: one operation at one block size. */
struct cli_bench_result {
	enum cli_bench_op op;
	uint64_t block_bytes;     /* 0 for EXISTS and MATCH */
	uint64_t blocks;          /* blocks (keys) done right: PUT stored, GET
				     returned byte-exact, EXISTS answered, MATCH
				     chain blocks matched */
	uint64_t calls;           /* library calls (MATCH: chain matches) */
	double seconds;           /* wall time of the phase */
	uint64_t p50_us, p99_us, p999_us;  /* per call */
	uint64_t misses;          /* GET/EXISTS: keys not found; MATCH: short matches */
	uint64_t wrong;           /* GET: blocks not byte-exact (or -EBADMSG) */
	uint64_t errors;          /* other per-block errors */
	uint64_t retries;         /* PUT: blocks sent again after BUSY */
	uint64_t lease_cuts;      /* MATCH: answers whose lease was cut to the run that fits
				     the connection's or tenant's leased-bytes bound */
	uint64_t refused;         /* MATCH: answered QUOTA, FULL or BUSY as a whole (counted
				     as short matches; a kvpoold before the lease cut said
				     QUOTA for a lease over its bound) */
	/* MATCH only: the server's MATCH latency (STATS latency_us.match) */
	uint64_t server_p50_us, server_p99_us, server_p999_us;
	uint32_t chain;           /* MATCH only: blocks per chain */
};

/* The whole run. */
struct cli_bench_report {
	const struct cli_bench_opts *opts;
	struct cli_bench_result results[CLI_BENCH_MAX_SIZES * 2 + 2];
	size_t n_results;
	uint64_t verified_blocks, verified_bytes;  /* GET blocks checked byte by byte */
};

/* Blocks per second and GB/s (10^9 bytes per second) of a result; 0 when
 * it took no time. */
double cli_bench_blocks_per_s(const struct cli_bench_result *r);
double cli_bench_gbps(const struct cli_bench_result *r);

/* Print the report as a table for a person. */
void cli_bench_print_text(FILE *f, const struct cli_bench_report *rep);

/* Print the report as one compact JSON line (keys in `kvpool bench
 * --help`). Returns 0 or -ENOMEM. */
int cli_bench_print_json(FILE *f, const struct cli_bench_report *rep);

#endif /* KVPOOL_CLI_BENCH_H */
