/*
 * cli_bench.c - `kvpool bench`: PUT, GET, EXISTS and MATCH throughput and
 * latency against a running kvpoold, every GET block checked byte by byte.
 *
 * Threads: the main thread parses, connects a control handle, and starts
 * --connections workers, each with its own client handle. For every phase
 * (one operation at one block size) the main thread bumps a generation
 * number and waits until every worker has run calls until the phase's
 * deadline or its share of --count; each worker keeps its own counters and
 * latency samples, which the main thread sums once the phase is over.
 */
#include "bench.h"
#include "cli.h"
#include "replay.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define BENCH_PUT_RETRIES 8          /* a block refused as BUSY is sent again */
#define BENCH_PRELOAD_BYTES (256ULL << 20) /* blocks put for a GET without PUT */
#define BENCH_CHAIN_PHASE UINT32_MAX /* key phase of the MATCH chain */
#define BENCH_CHAIN_CONN UINT32_MAX

/* What the workers run next. */
struct phase {
	enum cli_bench_op op;
	size_t size_idx;        /* PUT, GET: index into opts->sizes */
	uint64_t per_worker;    /* untimed preload: blocks per worker; else 0 */
	bool quit;              /* no phase: the workers return */
};

/* State shared by the main thread and the workers. */
struct bench_shared {
	const struct cli_bench_opts *o;
	struct cli_bench_src src;
	uint64_t nonce;                 /* tags this run's keys */
	uint64_t capacity_bytes;        /* the server's DRAM arena */
	uint8_t (*chain)[KVPOOL_KEY_BYTES];
	struct phase ph;
	pthread_mutex_t lock;           /* guards ph, gen and running */
	pthread_cond_t go, done;        /* a phase starts; the last worker ended it */
	uint64_t gen;                   /* phases started so far */
	uint32_t running;               /* workers still in the current phase */
	atomic_bool failed;             /* a worker hit an error: all stop */
	pthread_mutex_t err_lock;
	char err[320];                  /* the first worker error */
};

/* One worker's counters for one phase. */
struct counts {
	uint64_t blocks, calls, misses, wrong, errors, retries, verified_bytes;
	uint64_t lease_cuts, refused; /* MATCH: leases cut, answers QUOTA/FULL */
	struct cli_lat lat;
	struct timespec start, end;
};

/* One worker: a client handle, its call arrays and buffers. */
struct bench_worker {
	struct bench_shared *sh;
	uint32_t index;
	struct kvpool_client *c;
	pthread_t thread;
	bool started;
	uint8_t (*keys)[KVPOOL_KEY_BYTES];  /* batch */
	struct iovec *iov;                   /* 2 per block */
	struct kvpool_put_block *puts;
	struct kvpool_get_block *gets;
	int *st;
	uint8_t *buf;                        /* batch * largest size, GET */
	uint64_t buf_bytes;
	uint64_t put_seq[CLI_BENCH_MAX_SIZES];  /* keys put so far per size */
	uint64_t get_cursor;
	struct counts n;
};

enum {
	OPT_SIZES = CLI_OPT_FIRST_LOCAL,
	OPT_OPS,
	OPT_BATCH,
	OPT_DEPTH,
	OPT_CONNECTIONS,
	OPT_DURATION,
	OPT_COUNT,
	OPT_CHAIN,
	OPT_LEASE_MS,
	OPT_SOURCE_BYTES,
	OPT_JSON,
	OPT_KEEP_NAMESPACE,
	OPT_ASYNC,
	OPT_INFLIGHT,
};

static const char bench_usage[] =
	"usage: kvpool bench [--sizes LIST] [--ops LIST] [--batch N] [--connections N]\n"
	"                    [--duration S | --count N] [--chain N] [--json] [options]\n"
	"\n"
	"Measure PUT, GET, EXISTS and MATCH against a running kvpoold: blocks/s,\n"
	"GB/s (10^9 payload bytes per second) and p50/p99/p99.9 latency per call.\n"
	"Every block GET returns is compared byte by byte with what was put (a\n"
	"block's payload is its key followed by a window of a large pseudo-random\n"
	"buffer chosen by the key); a wrong byte makes the exit status 2.\n"
	"\n"
	"For each size: PUT of new blocks, then GET of the newest blocks each\n"
	"connection put (as many as fit in half the server's DRAM arena). Then\n"
	"EXISTS of keys of the last size, then MATCH of one chain of --chain\n"
	"blocks of 4 KiB: matches/s end to end and the server's own MATCH time\n"
	"(STATS latency_us.match, over every MATCH since the server started).\n"
	"The namespace is emptied before and after the run (--keep-namespace: not).\n"
	"\n"
	"Pipelining: a libkvpool call waits for its reply, so each connection has\n"
	"one call in flight. The blocks of a call travel as one request frame (up\n"
	"to the server's max_batch_blocks), so --batch is the number of blocks in\n"
	"flight per connection: the counterpart of redis-benchmark -P and of\n"
	"tests/bench/wire --depth. --depth is another name for --batch.\n"
	"\n"
	"  --sizes LIST        block sizes, comma-separated, each 1 B..1 GiB\n"
	"                      (default 64KiB,256KiB,1MiB,4MiB,16MiB)\n"
	"  --ops LIST          put,get,exists,match or all (default all)\n"
	"  --batch N           blocks per call, 1..65536 (default 1)\n"
	"  --depth N           the same as --batch\n"
	"  --connections N     threads, one connection each, 1..256 (default 1)\n"
	"  --duration S        seconds per phase (default 2)\n"
	"  --count N           instead: blocks per phase over all connections\n"
	"                      (EXISTS: keys; MATCH: chain matches)\n"
	"  --chain N           blocks in the MATCH chain, 1..65536 (default 1000)\n"
	"  --lease-ms N        each MATCH asks for a lease of N ms on what it\n"
	"                      matched (0..3600000, default 0: no lease)\n"
	"  --source-bytes SIZE payload source buffer (default 1GiB, at least the\n"
	"                      largest size; 1MiB..64GiB)\n"
	"  --json              one JSON line: url, namespace, connections, batch,\n"
	"                      duration_s, count, results[] (op, block_bytes, blocks,\n"
	"                      calls, seconds, blocks_per_s, gbps, p50_us, p99_us,\n"
	"                      p999_us, misses, wrong, errors, retries; MATCH also\n"
	"                      chain_blocks, matches_per_s, lease_cuts (matches whose\n"
	"                      lease was cut to what the leased-bytes bound holds),\n"
	"                      refused (answered QUOTA, FULL or BUSY: counted as\n"
	"                      short matches, not a failure), server_p50_us,\n"
	"                      server_p99_us, server_p999_us), verified_blocks,\n"
	"                      verified_bytes\n"
	"  --keep-namespace    do not empty the namespace before and after\n"
	"  --async             drive the asynchronous API from each connection's\n"
	"                      thread: --inflight requests of --batch blocks in\n"
	"                      flight (kvpool_submit_*, kvpool_poll); latency is per\n"
	"                      request, submit to completion\n"
	"  --inflight N        with --async: requests in flight per connection,\n"
	"                      1..1024 (default 8)\n"
	CLI_COMMON_HELP
	"\n"
	"The default namespace is \"kvpool-bench\". Exit 0 when every block came\n"
	"back right and no call failed, 2 otherwise (GET misses alone are not a\n"
	"failure: they are reported).\n";

/* ---- options ----------------------------------------------------------- */

int cli_bench_parse_sizes(const char *list, uint64_t *sizes, size_t cap, size_t *n)
{
	uint64_t got[CLI_BENCH_MAX_SIZES];
	size_t count = 0, cap_here = cap < CLI_BENCH_MAX_SIZES ? cap : CLI_BENCH_MAX_SIZES;
	const char *p = list;
	char item[64];

	if (!list || !*list)
		return -EINVAL;
	for (;;) {
		size_t len = strcspn(p, ",");
		uint64_t v;

		if (len == 0 || len >= sizeof(item))
			return -EINVAL;
		memcpy(item, p, len);
		item[len] = '\0';
		if (cli_parse_size(item, &v) || v < CLI_BENCH_MIN_BLOCK_BYTES ||
		    v > CLI_BENCH_MAX_BLOCK_BYTES)
			return -EINVAL;
		for (size_t i = 0; i < count; i++)
			if (got[i] == v)
				return -EINVAL;
		if (count == cap_here)
			return -E2BIG;
		got[count++] = v;
		if (!p[len])
			break;
		p += len + 1;
	}
	memcpy(sizes, got, count * sizeof(*got));
	*n = count;
	return 0;
}

int cli_bench_parse_ops(const char *list, unsigned int *mask)
{
	unsigned int m = 0;
	const char *p = list;

	if (!list || !*list)
		return -EINVAL;
	for (;;) {
		size_t len = strcspn(p, ",");
		bool known = false;

		if (len == 3 && !strncmp(p, "all", 3)) {
			m |= (1u << CLI_BENCH_NOPS) - 1;
			known = true;
		}
		for (int op = 0; op < CLI_BENCH_NOPS; op++) {
			const char *name = cli_bench_op_name(op);

			if (len == strlen(name) && !strncmp(p, name, len)) {
				m |= 1u << op;
				known = true;
			}
		}
		if (!known)
			return -EINVAL;
		if (!p[len])
			break;
		p += len + 1;
	}
	*mask = m;
	return 0;
}

/* Say what is wrong with the value of one option; -EINVAL. */
static int bad_value(const char *prog, const char *opt, const char *arg, const char *want)
{
	cli_usage_error(prog, "bad value '%s' for --%s: want %s", arg, opt, want);
	return -EINVAL;
}

/* Apply one of bench's own options. Returns 1, 0 (not ours) or -EINVAL.
 * `batch_opt` remembers which of --batch / --depth set the batch first. */
static int bench_opt(struct cli_bench_opts *o, const char *prog, int opt, const char *arg,
		     int *batch_opt)
{
	uint64_t v;
	int rc;

	switch (opt) {
	case OPT_SIZES:
		rc = cli_bench_parse_sizes(arg, o->sizes, CLI_BENCH_MAX_SIZES, &o->n_sizes);
		if (rc == -E2BIG)
			return bad_value(prog, "sizes", arg, "at most 16 sizes");
		if (rc)
			return bad_value(prog, "sizes", arg,
					 "distinct sizes of 1 B..1 GiB separated by commas, "
					 "e.g. 64KiB,1MiB");
		return 1;
	case OPT_OPS:
		if (cli_bench_parse_ops(arg, &o->ops))
			return bad_value(prog, "ops", arg, "put,get,exists,match or all");
		return 1;
	case OPT_BATCH:
	case OPT_DEPTH:
		if (cli_parse_u64(arg, 1, CLI_BENCH_MAX_BATCH, &v))
			return bad_value(prog, opt == OPT_BATCH ? "batch" : "depth", arg,
					 "blocks per call, 1..65536");
		if (*batch_opt && *batch_opt != opt && v != o->batch) {
			cli_usage_error(prog, "--batch and --depth are the same setting; "
				       "they cannot differ");
			return -EINVAL;
		}
		*batch_opt = opt;
		o->batch = (uint32_t)v;
		return 1;
	case OPT_CONNECTIONS:
		if (cli_parse_u64(arg, 1, CLI_BENCH_MAX_CONNECTIONS, &v))
			return bad_value(prog, "connections", arg, "1..256");
		o->connections = (uint32_t)v;
		return 1;
	case OPT_DURATION:
		if (cli_parse_nonneg_double(arg, &o->duration_s) || o->duration_s < 0.001 ||
		    o->duration_s > CLI_BENCH_MAX_DURATION_S)
			return bad_value(prog, "duration", arg, "seconds, 0.001..3600");
		return 1;
	case OPT_COUNT:
		if (cli_parse_u64(arg, 1, UINT64_MAX / 2, &o->count))
			return bad_value(prog, "count", arg, "a positive number of blocks");
		return 1;
	case OPT_CHAIN:
		if (cli_parse_u64(arg, 1, CLI_BENCH_MAX_CHAIN, &v))
			return bad_value(prog, "chain", arg, "blocks, 1..65536");
		o->chain = (uint32_t)v;
		return 1;
	case OPT_LEASE_MS:
		if (cli_parse_u64(arg, 0, 3600000, &v))
			return bad_value(prog, "lease-ms", arg, "milliseconds, 0..3600000");
		o->lease_ms = (uint32_t)v;
		return 1;
	case OPT_SOURCE_BYTES:
		if (cli_parse_size(arg, &o->source_bytes) ||
		    o->source_bytes < CLI_BENCH_MIN_SOURCE_BYTES ||
		    o->source_bytes > CLI_BENCH_MAX_SOURCE_BYTES)
			return bad_value(prog, "source-bytes", arg, "a size of 1MiB..64GiB");
		return 1;
	case OPT_JSON:
		o->json = true;
		return 1;
	case OPT_KEEP_NAMESPACE:
		o->keep_namespace = true;
		return 1;
	case OPT_ASYNC:
		o->async = true;
		return 1;
	case OPT_INFLIGHT:
		if (cli_parse_u64(arg, 1, CLI_BENCH_MAX_INFLIGHT, &v))
			return bad_value(prog, "inflight", arg, "requests, 1..1024");
		o->inflight = (uint32_t)v;
		return 1;
	}
	return 0;
}

/* The checks that involve more than one option. Returns -1 or 2. */
static int bench_check(const struct cli_bench_opts *o, const char *prog, bool duration_set)
{
	uint64_t largest = 0;

	if (duration_set && o->count)
		return cli_usage_error(prog, "--duration and --count exclude each other");
	if (o->inflight && !o->async)
		return cli_usage_error(prog, "--inflight needs --async");
	for (size_t i = 0; i < o->n_sizes; i++)
		largest = o->sizes[i] > largest ? o->sizes[i] : largest;
	if ((o->ops & (1u << CLI_BENCH_MATCH)) && largest < CLI_BENCH_CHAIN_BLOCK_BYTES)
		largest = CLI_BENCH_CHAIN_BLOCK_BYTES;
	if (largest > o->source_bytes)
		return cli_usage_error(prog, "--source-bytes %" PRIu64 " is smaller than the "
				       "largest block (%" PRIu64 " bytes)", o->source_bytes,
				       largest);
	return -1;
}

int cli_bench_parse_args(int argc, char **argv, struct cli_bench_opts *o)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "sizes", required_argument, NULL, OPT_SIZES },
		{ "ops", required_argument, NULL, OPT_OPS },
		{ "batch", required_argument, NULL, OPT_BATCH },
		{ "depth", required_argument, NULL, OPT_DEPTH },
		{ "connections", required_argument, NULL, OPT_CONNECTIONS },
		{ "duration", required_argument, NULL, OPT_DURATION },
		{ "count", required_argument, NULL, OPT_COUNT },
		{ "chain", required_argument, NULL, OPT_CHAIN },
		{ "lease-ms", required_argument, NULL, OPT_LEASE_MS },
		{ "source-bytes", required_argument, NULL, OPT_SOURCE_BYTES },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "keep-namespace", no_argument, NULL, OPT_KEEP_NAMESPACE },
		{ "async", no_argument, NULL, OPT_ASYNC },
		{ "inflight", required_argument, NULL, OPT_INFLIGHT },
		{ NULL, 0, NULL, 0 },
	};
	static const uint64_t default_sizes[] = { 64ULL << 10, 256ULL << 10, 1ULL << 20,
						  4ULL << 20, 16ULL << 20 };
	const char *prog = argv[0];
	bool duration_set = false;
	int opt, rc, batch_opt = 0;

	*o = (struct cli_bench_opts){ .ops = (1u << CLI_BENCH_NOPS) - 1, .batch = 1,
				      .connections = 1,
				      .duration_s = CLI_BENCH_DEFAULT_DURATION_S,
				      .chain = CLI_BENCH_DEFAULT_CHAIN,
				      .source_bytes = CLI_BENCH_DEFAULT_SOURCE_BYTES };
	memcpy(o->sizes, default_sizes, sizeof(default_sizes));
	o->n_sizes = sizeof(default_sizes) / sizeof(default_sizes[0]);
	cli_conn_init(&o->conn, "kvpool-bench");
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		rc = cli_conn_opt(&o->conn, prog, opt, optarg);
		if (rc == 0)
			rc = bench_opt(o, prog, opt, optarg, &batch_opt);
		if (rc < 0)
			return CLI_EXIT_ERROR;
		duration_set |= opt == OPT_DURATION;
		if (rc)
			continue;
		if (opt == 'h') {
			fputs(bench_usage, stdout);
			return CLI_EXIT_OK;
		}
		return cli_try_help(prog);
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	rc = bench_check(o, prog, duration_set);
	if (o->async && !o->inflight)
		o->inflight = CLI_BENCH_DEFAULT_INFLIGHT;
	return rc;
}

/* ---- the workers ---------------------------------------------------------- */

/* Seconds from a to b. */
static double secs_between(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

/* Record the first worker error and make every worker stop. */
__attribute__((format(printf, 2, 3)))
static void bench_fail(struct bench_shared *sh, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&sh->err_lock);
	if (!sh->err[0]) {
		va_start(ap, fmt);
		vsnprintf(sh->err, sizeof(sh->err), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&sh->err_lock);
	atomic_store(&sh->failed, true);
}

/* Is err a failure of the call as a whole (the connection), rather than
 * of one block? */
static bool call_error(int err)
{
	switch (err) {
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -EPIPE:
	case -ETIMEDOUT:
	case -EPROTO:
	case -ENOMEM:
	case -EINVAL:
		return true;
	}
	return false;
}

/* Time one library call into the worker's latency samples, and count it
 * (a sample that cannot be stored yields -ENOMEM, a call error). */
#define TIMED(w, call) ((w)->n.calls++, CLI_LAT_TIMED(&(w)->n.lat, call))

/* Put blocks seq .. seq+n-1 of size index s. Blocks refused as BUSY are
 * sent again (the in-flight limit is shared by every connection). */
static int do_put(struct bench_worker *w, size_t s, uint64_t seq, size_t n)
{
	struct bench_shared *sh = w->sh;
	uint64_t len = sh->o->sizes[s];
	size_t todo = n;

	for (size_t i = 0; i < n; i++) {
		cli_bench_key(sh->nonce, w->index, (uint32_t)s, seq + i, w->keys[i]);
		cli_bench_block_iov(&sh->src, w->keys[i], len, &w->iov[2 * i]);
		w->puts[i] = (struct kvpool_put_block){ .key = w->keys[i],
							.iov = &w->iov[2 * i], .iovcnt = 2 };
	}
	for (int attempt = 0; todo; attempt++) {
		size_t busy = 0;
		int rc = TIMED(w, kvpool_put(w->c, w->puts, todo, w->st));

		if (rc && call_error(rc)) {
			bench_fail(sh, "put: %s", kvpool_strerror(rc));
			return rc;
		}
		for (size_t i = 0; i < todo; i++) {
			if (w->st[i] == 0)
				w->n.blocks++;
			else if (w->st[i] == -EAGAIN && attempt < BENCH_PUT_RETRIES)
				w->puts[busy++] = w->puts[i];
			else
				w->n.errors++;
		}
		w->n.retries += busy;
		todo = busy;
		if (todo)
			usleep(1000u << (attempt < 6 ? attempt : 6));
	}
	return 0;
}

/* Blocks of size index s one connection may expect the pool to keep: its
 * share of half the DRAM arena (at least 1). */
static uint64_t keep_budget(const struct bench_shared *sh, size_t s)
{
	uint64_t slot = (sh->o->sizes[s] + 4095) / 4096 * 4096;
	uint64_t budget = sh->capacity_bytes / 2 / sh->o->connections / slot;

	return budget ? budget : 1;
}

/* The newest keys of size index s this worker put: [first, first + n). */
static void get_window(const struct bench_worker *w, size_t s, uint64_t *first, uint64_t *n)
{
	uint64_t budget = keep_budget(w->sh, s);

	*n = w->put_seq[s] < budget ? w->put_seq[s] : budget;
	*first = w->put_seq[s] - *n;
}

/* Score one block GET returned (or did not). */
static void get_score(struct bench_worker *w, size_t i, uint64_t len)
{
	int st = w->st[i];

	if (st == 0 && w->gets[i].length == len &&
	    cli_bench_block_check(&w->sh->src, w->keys[i], w->buf + i * len, len)) {
		w->n.blocks++;
		w->n.verified_bytes += len;
	} else if (st == 0 || st == -EBADMSG) {
		w->n.wrong++;
	} else if (st == -ENOENT) {
		w->n.misses++;
	} else {
		w->n.errors++;
	}
}

/* Get n blocks of size index s, cycling over this worker's newest keys. */
static int do_get(struct bench_worker *w, size_t s, size_t n)
{
	struct bench_shared *sh = w->sh;
	uint64_t len = sh->o->sizes[s], first, span;
	int rc;

	get_window(w, s, &first, &span);
	if (!span) {
		bench_fail(sh, "get: no block of %" PRIu64 " bytes was put", len);
		return -ENOENT;
	}
	for (size_t i = 0; i < n; i++) {
		cli_bench_key(sh->nonce, w->index, (uint32_t)s, first + w->get_cursor++ % span,
			      w->keys[i]);
		w->iov[i] = (struct iovec){ .iov_base = w->buf + i * len, .iov_len = len };
		w->gets[i] = (struct kvpool_get_block){ .key = w->keys[i], .iov = &w->iov[i],
							.iovcnt = 1 };
	}
	rc = TIMED(w, kvpool_get(w->c, w->gets, n, w->st));
	if (rc && call_error(rc)) {
		bench_fail(sh, "get: %s", kvpool_strerror(rc));
		return rc;
	}
	for (size_t i = 0; i < n; i++)
		get_score(w, i, len);
	return 0;
}

/* Ask whether n keys of the last size are stored. */
static int do_exists(struct bench_worker *w, size_t n)
{
	struct bench_shared *sh = w->sh;
	size_t s = sh->o->n_sizes - 1;
	uint64_t first, span;
	int rc;

	get_window(w, s, &first, &span);
	for (size_t i = 0; i < n; i++)
		cli_bench_key(sh->nonce, w->index, (uint32_t)s,
			      first + (span ? w->get_cursor++ % span : i), w->keys[i]);
	rc = TIMED(w, kvpool_exists(w->c, w->keys, n, w->st));
	if (rc) {
		bench_fail(sh, "exists: %s", kvpool_strerror(rc));
		return rc;
	}
	for (size_t i = 0; i < n; i++) {
		w->n.blocks++;
		if (w->st[i] == -ENOENT)
			w->n.misses++;
		else if (w->st[i])
			w->n.errors++;
	}
	return 0;
}

/* A MATCH the server refused as a whole for a limit (a kvpoold before the
 * lease cut answered QUOTA for a lease over its bound; FULL, BUSY): a
 * short match to count, not a failure of the run. */
static bool match_refusal(int err)
{
	return err == -EDQUOT || err == -ENOSPC || err == -EAGAIN;
}

/* Match the whole chain once. A lease cut (the lease of the whole chain
 * would pass the connection's or tenant's bound: the server answered the
 * run whose lease fits) and a refusal count as short matches, and are
 * counted apart. */
static int do_match(struct bench_worker *w)
{
	struct bench_shared *sh = w->sh;
	struct kvpool_match_opts mo = { .lease_ms = sh->o->lease_ms };
	struct kvpool_match_result mr = { 0 };
	int rc = TIMED(w, kvpool_match_ex(w->c, sh->chain, sh->o->chain, &mo, &mr));

	if (rc && match_refusal(rc)) {
		w->n.refused++;
		w->n.misses++;
		return 0;
	}
	if (rc) {
		bench_fail(sh, "match: %s", kvpool_strerror(rc));
		return rc;
	}
	w->n.blocks += mr.matched;
	if (mr.flags & KVPOOL_MATCH_LEASE_CUT)
		w->n.lease_cuts++;
	if (mr.matched != sh->o->chain)
		w->n.misses++;
	return 0;
}

/* This worker's share of a count spread over every connection. */
static uint64_t share(uint64_t count, uint32_t workers, uint32_t index)
{
	return count / workers + (index < count % workers ? 1 : 0);
}

/* Run one call of the current phase with up to `left` units; returns the
 * units done (blocks, keys or 1 match) or 0 after a failure. */
static uint64_t phase_step(struct bench_worker *w, uint64_t left)
{
	const struct phase *ph = &w->sh->ph;
	size_t n = left < w->sh->o->batch ? (size_t)left : w->sh->o->batch;
	int rc;

	switch (ph->op) {
	case CLI_BENCH_PUT:
		rc = do_put(w, ph->size_idx, w->put_seq[ph->size_idx], n);
		w->put_seq[ph->size_idx] += n;
		break;
	case CLI_BENCH_GET:
		rc = do_get(w, ph->size_idx, n);
		break;
	case CLI_BENCH_EXISTS:
		rc = do_exists(w, n);
		break;
	case CLI_BENCH_MATCH:
	default:
		rc = do_match(w);
		n = 1;
		break;
	}
	return rc ? 0 : n;
}

/* Run the current phase: calls until the deadline or this worker's share
 * of --count (a preload: ph->per_worker blocks). */
static void phase_run(struct bench_worker *w)
{
	struct bench_shared *sh = w->sh;
	const struct cli_bench_opts *o = sh->o;
	uint64_t left = sh->ph.per_worker ? sh->ph.per_worker :
			o->count ? share(o->count, o->connections, w->index) : UINT64_MAX;
	bool timed = !sh->ph.per_worker && !o->count;
	double limit_s = o->duration_s;

	w->n.start = cli_now();
	while (left && !atomic_load_explicit(&sh->failed, memory_order_relaxed)) {
		uint64_t done = phase_step(w, left);

		if (!done)
			break;
		if (!timed) {
			left -= done;
		} else {
			struct timespec t = cli_now();

			if (secs_between(&w->n.start, &t) >= limit_s)
				break;
		}
	}
	w->n.end = cli_now();
}

/* ---- --async: requests in flight from one thread ------------------------- */

/* Slot j of the worker's arrays: blocks j * batch .. (j + 1) * batch - 1. */
struct async_slot {
	bool busy;
	size_t n;               /* blocks (keys) of the request */
	struct timespec t0;     /* submit */
	struct kvpool_match_result mr; /* MATCH: the library's until polled */
};

/* Fill and submit the request of slot j: n units of the current phase.
 * Returns 0 or the submit's error. */
static int async_submit(struct bench_worker *w, struct async_slot *sl, uint32_t j, size_t n)
{
	struct bench_shared *sh = w->sh;
	const struct phase *ph = &sh->ph;
	size_t b = (size_t)j * sh->o->batch, s = ph->size_idx;
	uint64_t len = sh->o->sizes[s], id, first, span;

	switch (ph->op) {
	case CLI_BENCH_PUT:
		for (size_t i = 0; i < n; i++) {
			cli_bench_key(sh->nonce, w->index, (uint32_t)s, w->put_seq[s]++, w->keys[b + i]);
			cli_bench_block_iov(&sh->src, w->keys[b + i], len, &w->iov[2 * (b + i)]);
			w->puts[b + i] = (struct kvpool_put_block){
				.key = w->keys[b + i], .iov = &w->iov[2 * (b + i)], .iovcnt = 2 };
		}
		sl->t0 = cli_now();
		return kvpool_submit_put(w->c, &w->puts[b], n, &w->st[b], j, &id);
	case CLI_BENCH_GET:
		get_window(w, s, &first, &span);
		if (!span)
			return -ENOENT;
		for (size_t i = 0; i < n; i++) {
			cli_bench_key(sh->nonce, w->index, (uint32_t)s,
				      first + w->get_cursor++ % span, w->keys[b + i]);
			w->iov[b + i] = (struct iovec){ .iov_base = w->buf + (b + i) * len,
						       .iov_len = len };
			w->gets[b + i] = (struct kvpool_get_block){
				.key = w->keys[b + i], .iov = &w->iov[b + i], .iovcnt = 1 };
		}
		sl->t0 = cli_now();
		return kvpool_submit_get(w->c, &w->gets[b], n, &w->st[b], j, &id);
	case CLI_BENCH_EXISTS:
		s = sh->o->n_sizes - 1;
		get_window(w, s, &first, &span);
		for (size_t i = 0; i < n; i++)
			cli_bench_key(sh->nonce, w->index, (uint32_t)s,
				      first + (span ? w->get_cursor++ % span : i), w->keys[b + i]);
		sl->t0 = cli_now();
		return kvpool_submit_exists(w->c, w->keys[b], n, &w->st[b], j, &id);
	case CLI_BENCH_MATCH:
	default: {
		struct kvpool_match_opts mo = { .lease_ms = sh->o->lease_ms };

		sl->t0 = cli_now();
		return kvpool_submit_match_ex(w->c, sh->chain, sh->o->chain, &mo, &sl->mr, j, &id);
	}
	}
}

/* Score a finished request as the synchronous calls are scored. */
static int async_score(struct bench_worker *w, struct async_slot *sl, uint32_t j,
		       const struct kvpool_completion *cp)
{
	struct bench_shared *sh = w->sh;
	size_t b = (size_t)j * sh->o->batch;
	const char *what = cli_bench_op_name(sh->ph.op);

	w->n.calls++;
	if (cli_lat_since(&w->n.lat, sl->t0))
		cp = NULL;
	if (cp && sh->ph.op == CLI_BENCH_MATCH && match_refusal(cp->status)) {
		w->n.refused++;
		w->n.misses++;
		return 0;
	}
	if (!cp || (cp->status && call_error(cp->status)) ||
	    (cp->status && (sh->ph.op == CLI_BENCH_EXISTS || sh->ph.op == CLI_BENCH_MATCH))) {
		int err = cp ? cp->status : -ENOMEM;

		bench_fail(sh, "%s: %s", what, kvpool_strerror(err));
		return err;
	}
	for (size_t i = 0; i < sl->n && sh->ph.op == CLI_BENCH_PUT; i++) {
		if (w->st[b + i] == 0)
			w->n.blocks++;
		else if (w->st[b + i] == -EAGAIN)
			w->n.retries++; /* BUSY after the library's own retries: not stored */
		else
			w->n.errors++;
	}
	for (size_t i = 0; i < sl->n && sh->ph.op == CLI_BENCH_GET; i++)
		get_score(w, b + i, sh->o->sizes[sh->ph.size_idx]);
	for (size_t i = 0; i < sl->n && sh->ph.op == CLI_BENCH_EXISTS; i++) {
		w->n.blocks++;
		if (w->st[b + i] == -ENOENT)
			w->n.misses++;
		else if (w->st[b + i])
			w->n.errors++;
	}
	if (sh->ph.op == CLI_BENCH_MATCH) {
		w->n.blocks += cp->matched;
		if (sl->mr.flags & KVPOOL_MATCH_LEASE_CUT)
			w->n.lease_cuts++;
		if (cp->matched != sh->o->chain)
			w->n.misses++;
	}
	return 0;
}

/* phase_run for --async: keep --inflight requests in flight until the
 * deadline or the share of --count is submitted, then drain. */
static void phase_run_async(struct bench_worker *w)
{
	struct bench_shared *sh = w->sh;
	const struct cli_bench_opts *o = sh->o;
	uint64_t left = sh->ph.per_worker ? sh->ph.per_worker :
			o->count ? share(o->count, o->connections, w->index) : UINT64_MAX;
	bool timed = !sh->ph.per_worker && !o->count, stop = false;
	struct async_slot sl[CLI_BENCH_MAX_INFLIGHT];
	struct kvpool_completion comp[CLI_BENCH_MAX_INFLIGHT];
	uint32_t busy = 0;

	memset(sl, 0, sizeof(sl[0]) * o->inflight);
	w->n.start = cli_now();
	for (;;) {
		for (uint32_t j = 0; j < o->inflight && !stop && left; j++) {
			size_t n = sh->ph.op == CLI_BENCH_MATCH ? 1 :
				   left < o->batch ? (size_t)left : o->batch;
			int rc;

			if (sl[j].busy)
				continue;
			sl[j].n = n;
			rc = async_submit(w, &sl[j], j, n);
			if (rc) {
				bench_fail(sh, "%s: submit: %s", cli_bench_op_name(sh->ph.op),
					   kvpool_strerror(rc));
				stop = true;
				break;
			}
			sl[j].busy = true;
			busy++;
			if (!timed)
				left -= n;
		}
		if (!busy)
			break;
		int got = kvpool_poll(w->c, comp, (int)o->inflight, -1);

		for (int i = 0; i < got; i++) {
			uint32_t j = (uint32_t)comp[i].tag;

			sl[j].busy = false;
			busy--;
			if (async_score(w, &sl[j], j, &comp[i]))
				stop = true;
		}
		if (got < 0 || atomic_load_explicit(&sh->failed, memory_order_relaxed))
			stop = true;
		if (timed && !stop) {
			struct timespec t = cli_now();

			stop = secs_between(&w->n.start, &t) >= o->duration_s;
		}
		if (got < 0 && busy) {
			bench_fail(sh, "poll: %s", kvpool_strerror(got));
			break;
		}
	}
	w->n.end = cli_now();
}

static void *bench_worker_main(void *arg)
{
	struct bench_worker *w = arg;
	struct bench_shared *sh = w->sh;
	uint64_t seen = 0;
	bool quit;

	for (;;) {
		pthread_mutex_lock(&sh->lock);
		while (sh->gen == seen)
			pthread_cond_wait(&sh->go, &sh->lock);
		seen = sh->gen;
		quit = sh->ph.quit;
		pthread_mutex_unlock(&sh->lock);
		if (quit)
			break;
		if (sh->o->async)
			phase_run_async(w);
		else
			phase_run(w);
		pthread_mutex_lock(&sh->lock);
		if (--sh->running == 0)
			pthread_cond_signal(&sh->done);
		pthread_mutex_unlock(&sh->lock);
	}
	return NULL;
}

/* Start phase *ph on every started worker and wait until all are done
 * (ph->quit: tell them to return instead). Main thread. */
static void phase_broadcast(struct bench_shared *sh, const struct phase *ph, uint32_t workers)
{
	pthread_mutex_lock(&sh->lock);
	sh->ph = *ph;
	sh->running = ph->quit ? 0 : workers;
	sh->gen++;
	pthread_cond_broadcast(&sh->go);
	while (sh->running)
		pthread_cond_wait(&sh->done, &sh->lock);
	pthread_mutex_unlock(&sh->lock);
}

/* ---- setup ----------------------------------------------------------- */

/* Allocate a worker's arrays and its GET buffers (faulted in, so that
 * page faults are not measured). Returns 0 or -ENOMEM. */
static int worker_alloc(struct bench_worker *w, uint32_t batch, uint64_t largest)
{
	w->keys = calloc(batch, sizeof(*w->keys));
	w->iov = calloc(2 * (size_t)batch, sizeof(*w->iov));
	w->puts = calloc(batch, sizeof(*w->puts));
	w->gets = calloc(batch, sizeof(*w->gets));
	w->st = calloc(batch, sizeof(*w->st));
	if (!w->keys || !w->iov || !w->puts || !w->gets || !w->st)
		return -ENOMEM;
	if (largest > SIZE_MAX / batch)
		return -ENOMEM;
	w->buf_bytes = (uint64_t)batch * largest;
	w->buf = cli_bench_map(w->buf_bytes);
	return w->buf ? 0 : -ENOMEM;
}

static void worker_release(struct bench_worker *w)
{
	kvpool_close(w->c);
	free(w->keys);
	free(w->iov);
	free(w->puts);
	free(w->gets);
	free(w->st);
	cli_bench_unmap(w->buf, w->buf_bytes);
	cli_lat_release(&w->n.lat);
}

/* Largest block any phase moves through a worker's GET buffers. */
static uint64_t largest_size(const struct cli_bench_opts *o)
{
	uint64_t m = 0;

	for (size_t i = 0; i < o->n_sizes; i++)
		m = o->sizes[i] > m ? o->sizes[i] : m;
	return m;
}

/* A random tag for this run's keys: runs never see each other's blocks. */
static uint64_t run_nonce(void)
{
	struct timespec t = cli_now();
	uint64_t v;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 32) ^ (uint64_t)getpid();
	return v;
}

/* A number at a dotted path of a JSON document; -ENOENT when missing. */
static int json_u64(struct json_object *doc, const char *const *path, uint64_t *out)
{
	struct json_object *o = doc;

	for (; *path; path++)
		if (!json_object_object_get_ex(o, *path, &o))
			return -ENOENT;
	if (!json_object_is_type(o, json_type_int))
		return -ENOENT;
	*out = json_object_get_uint64(o);
	return 0;
}

/* Fetch STATS and pick the numbers at `paths` (NULL-terminated paths,
 * a NULL path ends the list) into out[]. Returns 0 or -errno. */
static int stats_pick(struct kvpool_client *c, const char *const *const *paths, uint64_t *out)
{
	struct json_object *doc;
	char *json;
	int rc = kvpool_stats(c, NULL, &json);

	if (rc)
		return rc;
	doc = json_tokener_parse(json);
	kvpool_free(json);
	if (!doc)
		return -EPROTO;
	for (size_t i = 0; paths[i] && !rc; i++)
		rc = json_u64(doc, paths[i], &out[i]);
	json_object_put(doc);
	return rc ? -EPROTO : 0;
}

/* Connect the control handle, check the sizes against the server's
 * limits, and learn the arena's size. Returns 0 or an exit code. */
static int bench_control(struct bench_shared *sh, const char *prog, struct kvpool_client **out)
{
	static const char *const cap_path[] = { "tiers", "dram", "capacity_bytes", NULL };
	static const char *const *const paths[] = { cap_path, NULL };
	const struct cli_bench_opts *o = sh->o;
	struct kvpool_limits lim;
	int rc;

	if (cli_connect(&o->conn, prog, out))
		return CLI_EXIT_ERROR;
	rc = kvpool_get_limits(*out, &lim);
	if (!rc)
		rc = stats_pick(*out, paths, &sh->capacity_bytes);
	if (rc) {
		fprintf(stderr, "%s: %s\n", prog, kvpool_strerror(rc));
		return CLI_EXIT_ERROR;
	}
	for (size_t i = 0; i < o->n_sizes; i++) {
		if (lim.max_block_bytes && o->sizes[i] > lim.max_block_bytes) {
			fprintf(stderr, "%s: block size %" PRIu64 " is above the server's "
				"max_block_bytes %" PRIu64 "\n", prog, o->sizes[i],
				lim.max_block_bytes);
			return CLI_EXIT_ERROR;
		}
	}
	return 0;
}

/* Empty the bench's namespace (unless --keep-namespace). */
static int bench_drop(const struct cli_bench_opts *o, const char *prog, struct kvpool_client *c)
{
	int rc;

	if (o->keep_namespace)
		return 0;
	rc = kvpool_drop_namespace(c, NULL, NULL);
	if (rc)
		fprintf(stderr, "%s: emptying namespace \"%s\": %s\n", prog, o->conn.ns,
			kvpool_strerror(rc));
	return rc;
}

/* Put the MATCH chain: CLI_BENCH_CHAIN_BLOCK_BYTES blocks, each the child
 * of the one before. Returns 0 or an exit code. */
static int chain_put(struct bench_shared *sh, const char *prog, struct kvpool_client *c)
{
	uint32_t n = sh->o->chain;
	struct kvpool_put_block *puts = calloc(n, sizeof(*puts));
	struct iovec *iov = calloc(2 * (size_t)n, sizeof(*iov));
	int rc = -ENOMEM;

	sh->chain = calloc(n, sizeof(*sh->chain));
	if (!puts || !iov || !sh->chain)
		goto out_free;
	for (uint32_t i = 0; i < n; i++) {
		cli_bench_key(sh->nonce, BENCH_CHAIN_CONN, BENCH_CHAIN_PHASE, i, sh->chain[i]);
		cli_bench_block_iov(&sh->src, sh->chain[i], CLI_BENCH_CHAIN_BLOCK_BYTES,
				    &iov[2 * i]);
		puts[i] = (struct kvpool_put_block){ .key = sh->chain[i],
						     .parent = i ? sh->chain[i - 1] : NULL,
						     .iov = &iov[2 * i], .iovcnt = 2 };
	}
	rc = kvpool_put(c, puts, n, NULL);
out_free:
	free(puts);
	free(iov);
	if (rc)
		fprintf(stderr, "%s: putting the %u-block MATCH chain: %s\n", prog, n,
			kvpool_strerror(rc));
	return rc ? CLI_EXIT_ERROR : 0;
}

/* The server's MATCH latency percentiles, into the result. */
static void match_server_time(struct kvpool_client *c, struct cli_bench_result *r)
{
	static const char *const p50[] = { "latency_us", "match", "p50", NULL };
	static const char *const p99[] = { "latency_us", "match", "p99", NULL };
	static const char *const p999[] = { "latency_us", "match", "p999", NULL };
	static const char *const *const paths[] = { p50, p99, p999, NULL };
	uint64_t v[3];

	if (stats_pick(c, paths, v) == 0) {
		r->server_p50_us = v[0];
		r->server_p99_us = v[1];
		r->server_p999_us = v[2];
	}
}

/* ---- the run -------------------------------------------------------------- */

/* Everything the main thread holds during a run. */
struct bench_run {
	struct bench_shared sh;
	struct bench_worker *ws;
	uint32_t n_started;
	struct kvpool_client *ctl;
	struct cli_bench_report rep;
	const char *prog;
};

/* Run one phase on every worker and, unless it is a preload, add its
 * result to the report. Returns 0, or -1 when a worker failed. */
static int run_phase(struct bench_run *r, enum cli_bench_op op, size_t size_idx,
		     uint64_t per_worker)
{
	struct bench_shared *sh = &r->sh;
	struct cli_bench_result *res = &r->rep.results[r->rep.n_results];
	struct phase ph = { .op = op, .size_idx = size_idx, .per_worker = per_worker };
	struct cli_lat lat = { 0 };
	struct timespec t0 = { 0 }, t1 = { 0 };

	for (uint32_t i = 0; i < r->n_started; i++) {
		cli_lat_release(&r->ws[i].n.lat);
		r->ws[i].n = (struct counts){ 0 };
	}
	phase_broadcast(sh, &ph, r->n_started);
	if (atomic_load(&sh->failed))
		return -1;
	if (per_worker)
		return 0;
	*res = (struct cli_bench_result){ .op = op, .chain = op == CLI_BENCH_MATCH ? sh->o->chain : 0,
					  .block_bytes = op <= CLI_BENCH_GET ? sh->o->sizes[size_idx] : 0 };
	for (uint32_t i = 0; i < r->n_started; i++) {
		const struct counts *n = &r->ws[i].n;

		res->blocks += n->blocks;
		res->calls += n->calls;
		res->misses += n->misses;
		res->wrong += n->wrong;
		res->errors += n->errors;
		res->retries += n->retries;
		res->lease_cuts += n->lease_cuts;
		res->refused += n->refused;
		if (op == CLI_BENCH_GET) {
			r->rep.verified_blocks += n->blocks;
			r->rep.verified_bytes += n->verified_bytes;
		}
		if (i == 0 || secs_between(&n->start, &t0) > 0)
			t0 = n->start;
		if (i == 0 || secs_between(&t1, &n->end) > 0)
			t1 = n->end;
		if (cli_lat_merge(&lat, &n->lat)) {
			bench_fail(sh, "out of memory");
			cli_lat_release(&lat);
			return -1;
		}
	}
	res->seconds = secs_between(&t0, &t1);
	res->p50_us = cli_lat_quantile(&lat, 0.50);
	res->p99_us = cli_lat_quantile(&lat, 0.99);
	res->p999_us = cli_lat_quantile(&lat, 0.999);
	cli_lat_release(&lat);
	r->rep.n_results++;
	return 0;
}

/* Make sure every worker has put blocks of size index s: GET and EXISTS
 * need some. An untimed PUT of up to BENCH_PRELOAD_BYTES in all (at least
 * one call's worth), no more than the pool is expected to keep; a block
 * it could not put fails the run. */
static int ensure_blocks(struct bench_run *r, size_t s)
{
	const struct cli_bench_opts *o = r->sh.o;
	uint64_t per = BENCH_PRELOAD_BYTES / o->connections / o->sizes[s];
	uint64_t budget = keep_budget(&r->sh, s), errors = 0;
	uint32_t i;

	for (i = 0; i < r->n_started && r->ws[i].put_seq[s]; i++)
		;
	if (i == r->n_started)
		return 0;
	per = per > o->batch ? per : o->batch;
	if (run_phase(r, CLI_BENCH_PUT, s, per < budget ? per : budget))
		return -1;
	for (i = 0; i < r->n_started; i++)
		errors += r->ws[i].n.errors;
	if (errors) {
		bench_fail(&r->sh, "%" PRIu64 " blocks of %" PRIu64 " bytes could not be put "
			   "before GET", errors, o->sizes[s]);
		return -1;
	}
	return 0;
}

/* Every phase the options ask for, in order. Returns 0 or -1. */
static int run_phases(struct bench_run *r)
{
	const struct cli_bench_opts *o = r->sh.o;
	bool want[CLI_BENCH_NOPS];

	for (int op = 0; op < CLI_BENCH_NOPS; op++)
		want[op] = o->ops & (1u << op);
	for (size_t s = 0; s < o->n_sizes; s++) {
		if (want[CLI_BENCH_PUT] && run_phase(r, CLI_BENCH_PUT, s, 0))
			return -1;
		if (want[CLI_BENCH_GET] && (ensure_blocks(r, s) || run_phase(r, CLI_BENCH_GET, s, 0)))
			return -1;
	}
	if (want[CLI_BENCH_EXISTS] &&
	    (ensure_blocks(r, o->n_sizes - 1) || run_phase(r, CLI_BENCH_EXISTS, 0, 0)))
		return -1;
	if (want[CLI_BENCH_MATCH]) {
		if (chain_put(&r->sh, r->prog, r->ctl))
			return -1;
		if (run_phase(r, CLI_BENCH_MATCH, 0, 0))
			return -1;
		match_server_time(r->ctl, &r->rep.results[r->rep.n_results - 1]);
	}
	return 0;
}

/* Allocate, connect and start every worker. Returns 0 or an exit code. */
static int workers_start(struct bench_run *r)
{
	const struct cli_bench_opts *o = r->sh.o;
	uint64_t largest = largest_size(o);

	r->ws = calloc(o->connections, sizeof(*r->ws));
	if (!r->ws)
		goto out_nomem;
	for (uint32_t i = 0; i < o->connections; i++) {
		struct bench_worker *w = &r->ws[i];

		w->sh = &r->sh;
		w->index = i;
		if (worker_alloc(w, o->batch * (o->async ? o->inflight : 1), largest))
			goto out_nomem;
		if (cli_connect(&o->conn, r->prog, &w->c))
			return CLI_EXIT_ERROR;
		if (o->async && o->inflight > KVPOOL_DEFAULT_MAX_INFLIGHT &&
		    kvpool_set_max_inflight(w->c, o->inflight)) {
			fprintf(stderr, "%s: cannot allow %u requests in flight\n", r->prog,
				o->inflight);
			return CLI_EXIT_ERROR;
		}
	}
	for (uint32_t i = 0; i < o->connections; i++) {
		if (pthread_create(&r->ws[i].thread, NULL, bench_worker_main, &r->ws[i])) {
			fprintf(stderr, "%s: cannot start thread %u\n", r->prog, i);
			return CLI_EXIT_ERROR;
		}
		r->n_started++;
	}
	return 0;
out_nomem:
	fprintf(stderr, "%s: out of memory for %u connections of %u blocks of %" PRIu64
		" bytes\n", r->prog, o->connections, o->batch, largest);
	return CLI_EXIT_ERROR;
}

/* Tell the workers to return, join them and free them. */
static void workers_stop(struct bench_run *r)
{
	static const struct phase quit = { .quit = true };

	phase_broadcast(&r->sh, &quit, r->n_started);
	for (uint32_t i = 0; i < r->n_started; i++)
		pthread_join(r->ws[i].thread, NULL);
	for (uint32_t i = 0; r->ws && i < r->sh.o->connections; i++)
		worker_release(&r->ws[i]);
	free(r->ws);
}

/* Print the report and pick the exit code. */
static int bench_report(struct bench_run *r)
{
	uint64_t wrong = 0, errors = 0, misses = 0;

	for (size_t i = 0; i < r->rep.n_results; i++) {
		wrong += r->rep.results[i].wrong;
		errors += r->rep.results[i].errors;
		misses += r->rep.results[i].misses;
	}
	if (r->sh.o->json) {
		if (cli_bench_print_json(stdout, &r->rep)) {
			fprintf(stderr, "%s: out of memory\n", r->prog);
			return CLI_EXIT_ERROR;
		}
	} else {
		cli_bench_print_text(stdout, &r->rep);
	}
	fflush(stdout);
	if (misses)
		fprintf(stderr, "%s: warning: %" PRIu64 " misses (evicted, or another client in "
			"namespace \"%s\"?)\n", r->prog, misses, r->sh.o->conn.ns);
	if (wrong || errors) {
		fprintf(stderr, "%s: FAILED: %" PRIu64 " blocks came back wrong, %" PRIu64
			" calls or blocks failed\n", r->prog, wrong, errors);
		return CLI_EXIT_ERROR;
	}
	return CLI_EXIT_OK;
}

/* Set up, run every phase, tear down. Returns the exit code. */
static int bench_run(struct bench_run *r)
{
	const struct cli_bench_opts *o = r->sh.o;
	int rc = bench_control(&r->sh, r->prog, &r->ctl);

	if (rc)
		return rc;
	if (bench_drop(o, r->prog, r->ctl))
		return CLI_EXIT_ERROR;
	if (cli_bench_src_init(&r->sh.src, o->source_bytes)) {
		fprintf(stderr, "%s: out of memory for a %" PRIu64 "-byte source buffer\n",
			r->prog, o->source_bytes);
		return CLI_EXIT_ERROR;
	}
	rc = workers_start(r);
	if (rc == 0 && run_phases(r)) {
		fprintf(stderr, "%s: %s\n", r->prog, r->sh.err[0] ? r->sh.err : "failed");
		rc = CLI_EXIT_ERROR;
	}
	workers_stop(r);
	if (bench_drop(o, r->prog, r->ctl) && !rc)
		rc = CLI_EXIT_ERROR;
	return rc ? rc : bench_report(r);
}

int cli_bench_main(int argc, char **argv)
{
	struct cli_bench_opts o;
	struct bench_run r = { .prog = argv[0] };
	int rc = cli_bench_parse_args(argc, argv, &o);

	if (rc >= 0)
		return rc;
	r.sh.o = &o;
	r.rep.opts = &o;
	r.sh.nonce = run_nonce();
	pthread_mutex_init(&r.sh.err_lock, NULL);
	pthread_mutex_init(&r.sh.lock, NULL);
	pthread_cond_init(&r.sh.go, NULL);
	pthread_cond_init(&r.sh.done, NULL);
	rc = bench_run(&r);
	pthread_cond_destroy(&r.sh.done);
	pthread_cond_destroy(&r.sh.go);
	pthread_mutex_destroy(&r.sh.lock);
	pthread_mutex_destroy(&r.sh.err_lock);
	cli_bench_src_release(&r.sh.src);
	free(r.sh.chain);
	kvpool_close(r.ctl);
	return rc;
}
