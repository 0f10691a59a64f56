/*
 * cli_replay.c - `kvpool replay`: drive a pool with a request trace the way
 * an inference engine would (MATCH the prompt's chain, GET the matched
 * blocks, PUT the rest), check every byte that comes back, and report hit
 * ratios, throughput and latency.
 *
 * Threads: the main thread loads the trace, connects, starts --concurrency
 * workers (each with its own client handle) and, on a terminal, draws the
 * progress line. Workers take requests in timestamp order from a shared
 * atomic counter; each keeps its own counters, summed after the join.
 */
#include "cli.h"
#include "cli_opts.h"
#include "cli_stats.h"
#include "payload.h"
#include "replay.h"
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REPLAY_DEFAULT_BLOCK_BYTES (64ULL << 10)
#define REPLAY_DEFAULT_BLOCK_TOKENS 512
#define REPLAY_DEFAULT_LEASE_MS 5000
#define REPLAY_MAX_CONCURRENCY 1024
#define REPLAY_BATCH_BYTES (64ULL << 20)   /* payload per GET/PUT call, at most */
#define REPLAY_PROGRESS_NS 200000000LL     /* progress redraw period: 5/s */
#define REPLAY_BUSY_RETRIES 5              /* a put or get answered BUSY is retried */
#define REPLAY_BUSY_BACKOFF_MS 1           /* after 1, 2, 4, 8, 16 ms */
#define REPLAY_MAX_WAIT_NS 1e18            /* --time-scale waits: at most ~31 years */

enum {
	OPT_BLOCK_BYTES = CLI_OPT_FIRST_LOCAL,
	OPT_BLOCK_TOKENS,
	OPT_CONCURRENCY,
	OPT_TIME_SCALE,
	OPT_LEASE_MS,
	OPT_LIMIT,
	OPT_JSON,
	OPT_KEEP_NAMESPACE,
};

/* What the command line asked for. */
struct replay_cfg {
	struct cli_conn conn;
	const char *trace_path;
	uint64_t block_bytes;
	uint64_t block_tokens;
	unsigned int concurrency;
	double time_scale;       /* 0: as fast as possible */
	uint32_t lease_ms;
	size_t limit;            /* requests; 0: all */
	bool json;
	bool keep_namespace;     /* do not drop the namespace first */
};

/* State shared by the workers and the progress line. */
struct replay_shared {
	const struct replay_cfg *cfg;
	const struct cli_trace *trace;
	struct timespec start;
	atomic_size_t next;              /* next request to take */
	atomic_uint_fast64_t done;       /* requests finished */
	atomic_uint_fast64_t refs;       /* their block refs */
	atomic_uint_fast64_t hits;       /* their byte-exact blocks */
	atomic_uint_fast64_t bytes;      /* payload bytes moved */
	atomic_uint running;             /* workers still running */
	atomic_bool failed;              /* a worker hit an error: all stop */
	pthread_mutex_t err_lock;
	char err[320];                   /* the first worker error */
};

/* One worker: a client handle, batch buffers, its own counters. */
struct replay_worker {
	struct replay_shared *sh;
	struct kvpool_client *c;
	pthread_t thread;
	size_t batch_blocks;             /* blocks per GET/PUT call */
	uint8_t *buf;                    /* batch_blocks * block_bytes */
	struct iovec *iov;
	struct kvpool_get_block *gets;
	struct kvpool_put_block *puts;
	int *st;
	struct cli_replay_counts counts;
	double end_s;                    /* when it finished, since start */
};

/* Nanoseconds from a to b. */
static int64_t ns_between(const struct timespec *a, const struct timespec *b)
{
	return (int64_t)(b->tv_sec - a->tv_sec) * 1000000000LL + (b->tv_nsec - a->tv_nsec);
}

/* The smaller of a and b. */
static inline size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}


/* Record the first worker error and make every worker stop. */
__attribute__((format(printf, 2, 3)))
static void replay_fail(struct replay_shared *sh, const char *fmt, ...)
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

/* Is `err` a per-block outcome of GET (as opposed to a failed call)? */
static bool get_block_error(int err)
{
	return err == -ENOENT || err == -EMSGSIZE || err == -EBADMSG || err == -EIO;
}

/* Is `err` a per-block outcome of PUT (as opposed to a failed call)? */
static bool put_block_error(int err)
{
	return err == -ENOLINK || err == -EMSGSIZE || err == -ENOSPC || err == -EAGAIN ||
	       err == -EBADMSG || err == -EDQUOT || err == -EIO;
}

/* Sleep for ms milliseconds. */
static void sleep_ms(unsigned int ms)
{
	struct timespec t = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

/* Score one returned (or failed) GET block; true if the GET must stop here
 * (the block is missing and is to be put again). */
static bool get_score(struct replay_worker *w, const struct kvpool_get_block *g, int st)
{
	struct cli_replay_counts *c = &w->counts;
	uint64_t bb = w->sh->cfg->block_bytes;

	if (st == 0) {
		c->returned++;
		c->bytes_got += g->length;
		if (g->length == bb && cli_payload_check(g->key, g->iov->iov_base, bb))
			c->hits++;
		else
			c->wrong++;
		return false;
	}
	if (st == -EBADMSG || st == -EMSGSIZE) {
		/* corrupted on the way, or another size under this key */
		c->returned += st == -EBADMSG;
		c->wrong++;
		return false;
	}
	if (st == -ENOENT)
		c->get_misses++;
	else
		cli_replay_count_errno(c->get_errors, st);
	return true;
}

/* GET the batch w->gets[0..n). Blocks the server answers BUSY (a block
 * on NVMe only, with no DRAM room yet to read it into: the demoter is
 * making some) are asked again - only they, each run of consecutive BUSY
 * blocks in one call, so a block already received is never fetched (and
 * counted by the server) twice - up to REPLAY_BUSY_RETRIES times with a
 * doubling backoff; a block still BUSY after that counts as a get error.
 * Returns 0 or the -errno of a call that failed as a whole. */
static int get_batch(struct replay_worker *w, size_t n)
{
	unsigned int backoff_ms = REPLAY_BUSY_BACKOFF_MS;
	int rc;

	rc = CLI_LAT_TIMED(&w->counts.lat[CLI_REPLAY_GET], kvpool_get(w->c, w->gets, n, w->st));
	if (rc && rc != -EAGAIN && !get_block_error(rc))
		return rc;
	for (int retry = 0; retry < REPLAY_BUSY_RETRIES; retry++) {
		size_t busy = 0;

		for (size_t k = 0; k < n; k++)
			busy += w->st[k] == -EAGAIN;
		if (!busy)
			return 0;
		w->counts.get_retries += busy;
		sleep_ms(backoff_ms);
		backoff_ms *= 2;
		for (size_t k = 0, e; k < n; k = e) {
			if (w->st[k] != -EAGAIN) {
				e = k + 1;
				continue;
			}
			for (e = k; e < n && w->st[e] == -EAGAIN; e++)
				;
			rc = CLI_LAT_TIMED(&w->counts.lat[CLI_REPLAY_GET],
					   kvpool_get(w->c, w->gets + k, e - k, w->st + k));
			if (rc && rc != -EAGAIN && !get_block_error(rc))
				return rc;
		}
	}
	return 0;
}

/* GET the first `matched` blocks of a request in batches. Returns the index
 * of the first block to put (matched, or the first miss), or -errno when a
 * call failed. */
static ssize_t replay_get(struct replay_worker *w, const struct cli_trace_req *r, size_t matched)
{
	uint64_t bb = w->sh->cfg->block_bytes;

	for (size_t j = 0; j < matched; j += w->batch_blocks) {
		size_t n = min_size(matched - j, w->batch_blocks);
		int rc;

		for (size_t k = 0; k < n; k++) {
			w->iov[k].iov_base = w->buf + k * bb;
			w->iov[k].iov_len = bb;
			w->gets[k] = (struct kvpool_get_block){ .key = r->keys[j + k],
								.iov = &w->iov[k],
								.iovcnt = 1 };
		}
		rc = get_batch(w, n);
		if (rc && !get_block_error(rc))
			return rc;
		for (size_t k = 0; k < n; k++) {
			if (get_score(w, &w->gets[k], w->st[k])) {
				/* count the rest of this batch, put from the miss on */
				for (size_t m = k + 1; m < n; m++)
					get_score(w, &w->gets[m], w->st[m]);
				return (ssize_t)(j + k);
			}
		}
	}
	return (ssize_t)matched;
}

/* The first block of w->st[from..n) the server was too busy to take, or n. */
static size_t first_busy(const struct replay_worker *w, size_t from, size_t n)
{
	while (from < n && w->st[from] != -EAGAIN)
		from++;
	return from;
}

/* PUT the batch w->puts[0..n), retrying from the first block the server
 * turned away as busy (in-flight put bytes at its limit: a moment's wait
 * fixes it) up to REPLAY_BUSY_RETRIES times with a doubling backoff. The
 * blocks after a busy one are sent again too, as they may have been
 * refused for want of it as their parent; any that were stored come back
 * as already there. w->st[0..n) ends with each block's last status.
 * Returns 0 or -errno when a call failed. */
static int put_batch(struct replay_worker *w, size_t n)
{
	unsigned int backoff_ms = REPLAY_BUSY_BACKOFF_MS;
	size_t from = 0;
	int rc;

	for (int retry = 0;; retry++) {
		rc = CLI_LAT_TIMED(&w->counts.lat[CLI_REPLAY_PUT],
				   kvpool_put(w->c, w->puts + from, n - from, w->st + from));
		if (rc && !put_block_error(rc))
			return rc;
		from = first_busy(w, from, n);
		if (from == n || retry == REPLAY_BUSY_RETRIES)
			return 0;
		w->counts.put_retries += n - from;
		sleep_ms(backoff_ms);
		backoff_ms *= 2;
	}
}

/* PUT blocks [from, n) of a request in batches, each with its parent.
 * Stops after a batch with a refused block (the ones after it could only
 * fail for want of their parent). Returns 0 or -errno when a call failed. */
static int replay_put(struct replay_worker *w, const struct cli_trace_req *r, size_t from)
{
	uint64_t bb = w->sh->cfg->block_bytes;
	struct cli_replay_counts *c = &w->counts;

	for (size_t j = from; j < r->n_hash_ids; j += w->batch_blocks) {
		size_t n = min_size(r->n_hash_ids - j, w->batch_blocks);
		bool refused = false;
		int rc;

		for (size_t k = 0; k < n; k++) {
			const uint8_t *key = r->keys[j + k];

			cli_payload_fill(key, w->buf + k * bb, bb);
			w->iov[k].iov_base = w->buf + k * bb;
			w->iov[k].iov_len = bb;
			w->puts[k] = (struct kvpool_put_block){
				.key = key,
				.parent = j + k ? r->keys[j + k - 1] : NULL,
				.iov = &w->iov[k],
				.iovcnt = 1,
			};
		}
		rc = put_batch(w, n);
		if (rc)
			return rc;
		for (size_t k = 0; k < n; k++) {
			if (w->st[k]) {
				cli_replay_count_errno(c->put_errors, w->st[k]);
				refused = true;
				continue;
			}
			c->blocks_put++;
			c->bytes_put += bb;
		}
		if (refused)
			break;
	}
	return 0;
}

/* Wait until request r is due under --time-scale. */
static void replay_pace(struct replay_worker *w, const struct cli_trace_req *r)
{
	const struct replay_shared *sh = w->sh;
	double offset_ms = r->timestamp_ms - sh->trace->reqs[0].timestamp_ms;
	struct timespec due = sh->start;
	double wait_ns;
	int64_t ns;

	if (sh->cfg->time_scale <= 0 || offset_ms <= 0)
		return;
	/* A tiny --time-scale must not overflow the conversion. */
	wait_ns = offset_ms / sh->cfg->time_scale * 1e6;
	ns = (int64_t)(wait_ns < REPLAY_MAX_WAIT_NS ? wait_ns : REPLAY_MAX_WAIT_NS);
	due.tv_sec += ns / 1000000000LL;
	due.tv_nsec += ns % 1000000000LL;
	if (due.tv_nsec >= 1000000000L) {
		due.tv_sec++;
		due.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR)
		;
}

/* Replay one request: MATCH (with a lease), GET the matched prefix, PUT the
 * rest. Returns 0 or -errno with the failing op in *op. */
static int replay_request(struct replay_worker *w, const struct cli_trace_req *r,
			  const char **op)
{
	struct cli_replay_counts *c = &w->counts;
	uint64_t hits0 = c->hits, moved0 = c->bytes_put + c->bytes_got;
	struct kvpool_match_opts mo = { .lease_ms = w->sh->cfg->lease_ms };
	struct kvpool_match_result mr = { 0 };
	size_t matched = 0;
	ssize_t from;
	int rc = 0;

	if (r->n_hash_ids) {
		*op = "match";
		rc = CLI_LAT_TIMED(&w->counts.lat[CLI_REPLAY_MATCH],
				   kvpool_match_ex(w->c, r->keys, r->n_hash_ids, &mo, &mr));
		if (rc == -EDQUOT || rc == -ENOSPC || rc == -EAGAIN) {
			/* refused as a whole for a limit (a kvpoold before the
			 * lease cut said QUOTA for a lease over its bound):
			 * a miss to count, as an engine would take it */
			cli_replay_count_errno(c->match_errors, rc);
			rc = 0;
		} else if (rc) {
			return rc;
		} else {
			matched = mr.matched;
			if (mr.flags & KVPOOL_MATCH_LEASE_CUT) {
				c->lease_cuts++;
				c->lease_cut_blocks += mr.present - mr.matched;
			}
		}
		*op = "get";
		from = replay_get(w, r, matched);
		if (from < 0)
			return (int)from;
		*op = "put";
		rc = replay_put(w, r, (size_t)from);
		if (rc)
			return rc;
	}
	c->requests++;
	c->block_refs += r->n_hash_ids;
	atomic_fetch_add(&w->sh->refs, r->n_hash_ids);
	atomic_fetch_add(&w->sh->hits, c->hits - hits0);
	atomic_fetch_add(&w->sh->bytes, c->bytes_put + c->bytes_got - moved0);
	atomic_fetch_add(&w->sh->done, 1);
	return 0;
}

/* Worker thread: take requests in order until none are left or one fails. */
static void *replay_worker_main(void *arg)
{
	struct replay_worker *w = arg;
	struct replay_shared *sh = w->sh;
	struct timespec end;

	while (!atomic_load(&sh->failed)) {
		size_t i = atomic_fetch_add(&sh->next, 1);
		const struct cli_trace_req *r;
		const char *op = "";
		int rc;

		if (i >= sh->trace->n_reqs)
			break;
		r = &sh->trace->reqs[i];
		replay_pace(w, r);
		rc = replay_request(w, r, &op);
		if (rc)
			replay_fail(sh, "request at line %zu: %s: %s", r->line, op,
				    kvpool_strerror(rc));
	}
	end = cli_now();
	w->end_s = (double)ns_between(&sh->start, &end) / 1e9;
	atomic_fetch_sub(&sh->running, 1);
	return NULL;
}

/* Allocate a worker's batch buffers. Returns 0 or -ENOMEM. */
static int worker_alloc(struct replay_worker *w, size_t batch_blocks, uint64_t block_bytes)
{
	size_t bytes = batch_blocks * block_bytes;

	w->batch_blocks = batch_blocks;
	bytes = (bytes + 4095) & ~(size_t)4095;
	w->buf = aligned_alloc(4096, bytes);
	w->iov = calloc(batch_blocks, sizeof(*w->iov));
	w->gets = calloc(batch_blocks, sizeof(*w->gets));
	w->puts = calloc(batch_blocks, sizeof(*w->puts));
	w->st = calloc(batch_blocks, sizeof(*w->st));
	if (!w->buf || !w->iov || !w->gets || !w->puts || !w->st)
		return -ENOMEM;
	return 0;
}

/* Free a worker's buffers, counters and handle. Accepts NULL. */
static void worker_release(struct replay_worker *w)
{
	if (!w)
		return;
	kvpool_close(w->c);
	free(w->buf);
	free(w->iov);
	free(w->gets);
	free(w->puts);
	free(w->st);
	cli_replay_counts_release(&w->counts);
}

/* Blocks per GET/PUT call: REPLAY_BATCH_BYTES of payload, at least one,
 * at most the longest request. */
static size_t batch_blocks(const struct cli_trace *t, uint64_t block_bytes)
{
	size_t longest = 1, n = (size_t)(REPLAY_BATCH_BYTES / block_bytes);

	for (size_t i = 0; i < t->n_reqs; i++)
		if (t->reqs[i].n_hash_ids > longest)
			longest = t->reqs[i].n_hash_ids;
	n = n < 1 ? 1 : n;
	return n < longest ? n : longest;
}

/* Redraw the progress line: requests, hit ratio, GB/s, time left. */
static void progress_draw(struct replay_shared *sh)
{
	uint64_t done = atomic_load(&sh->done), refs = atomic_load(&sh->refs);
	uint64_t total = sh->trace->n_reqs;
	struct timespec t = cli_now();
	double el = (double)ns_between(&sh->start, &t) / 1e9;
	double eta = done ? el * (double)(total - done) / (double)done : 0;

	char left[32] = "--:--";

	if (done)
		snprintf(left, sizeof(left), "%d:%02d", (int)(eta / 60), (int)eta % 60);
	fprintf(stderr, "\r\033[Kreplay: %" PRIu64 "/%" PRIu64 " requests, hit ratio %.4f, "
		"%.2f GB/s, %s left",
		done, total, refs ? (double)atomic_load(&sh->hits) / (double)refs : 0.0,
		el > 0 ? (double)atomic_load(&sh->bytes) / el / 1e9 : 0.0, left);
	fflush(stderr);
}

/* Start the workers, draw progress on a terminal, join them. Returns 0, or
 * -errno if a thread could not start (workers started are joined). */
static int replay_run(struct replay_shared *sh, struct replay_worker *ws, unsigned int n)
{
	bool tty = isatty(STDERR_FILENO);
	unsigned int started;
	int rc = 0;

	sh->start = cli_now();
	atomic_store(&sh->running, n);
	for (started = 0; started < n; started++) {
		rc = -pthread_create(&ws[started].thread, NULL, replay_worker_main, &ws[started]);
		if (rc) {
			atomic_fetch_sub(&sh->running, n - started);
			replay_fail(sh, "cannot start a worker thread: %s", strerror(-rc));
			break;
		}
	}
	while (tty && atomic_load(&sh->running)) {
		struct timespec nap = { 0, REPLAY_PROGRESS_NS };

		progress_draw(sh);
		nanosleep(&nap, NULL);
	}
	if (tty)
		fputs("\r\033[K", stderr);
	for (unsigned int i = 0; i < started; i++)
		pthread_join(ws[i].thread, NULL);
	return rc;
}

static const char replay_usage[] =
	"usage: kvpool replay [options] TRACE\n"
	"\n"
	"Replay a request trace (JSON Lines, Mooncake FAST'25 format: timestamp in ms,\n"
	"input_length, output_length, hash_ids) against the pool, in timestamp order.\n"
	"Hash ids are chained into block keys: key_0 = SHA-256(id_0 as uint64 LE),\n"
	"key_i = SHA-256(key_{i-1} || id_i as uint64 LE). Per request: MATCH the\n"
	"chain with a lease, GET the matched blocks and check every byte (payloads\n"
	"are derived from their keys), PUT the rest, each with its parent.\n"
	"\n"
	"  --block-bytes N     payload bytes per block; units ok (default 64KiB)\n"
	"  --block-tokens N    tokens per block, for prefill tokens saved (default 512)\n"
	"  --concurrency N     connections, one thread each (default 1)\n"
	"  --time-scale X      0: as fast as possible (default); X > 0: honour the\n"
	"                      timestamps divided by X\n"
	"  --lease-ms N        lease on matched blocks (default 5000)\n"
	"  --limit N           replay only the first N requests\n"
	"  --keep-namespace    do not drop the namespace first (the figures then\n"
	"                      include whatever it held before the run)\n"
	"  --json              print the report as one JSON line on stdout\n"
	CLI_COMMON_HELP
	"\n"
	"Default namespace: replay. A replay's figures only mean something on an\n"
	"empty namespace, so replay first drops every block of its namespace (other\n"
	"namespaces are untouched) and says how many it dropped, unless\n"
	"--keep-namespace is given: do not point it at a namespace whose blocks you\n"
	"want to keep. A put the server turns away as busy is retried 5 times (after\n"
	"1, 2, 4, 8, 16 ms) before it counts as a put error; put errors are warned\n"
	"about on stderr.\n"
	"\n"
	"The report gives requests, block_refs, hit_ratio (blocks GET returned\n"
	"byte-exact / block refs), ideal_hit_ratio (infinite cache), server_get_hits\n"
	"(the namespace's get_hits during the run) beside client_get_hits,\n"
	"prefill_tokens_saved, wrong_blocks, evictions, blocks_put, put_retries,\n"
	"put_errors, lease_cuts and lease_cut_blocks (MATCHes whose lease the server\n"
	"cut to the run that fits its leased-bytes bound, and the blocks past the\n"
	"cut: put again), match_errors (MATCHes refused as a whole - QUOTA, FULL,\n"
	"BUSY - replayed as misses, not an abort), namespace_dropped and\n"
	"dropped_blocks, gbps (payload bytes put +\n"
	"got / wall seconds / 1e9), wall_s and latency_us p50/p99 per op. Exit 0\n"
	"when no block came back wrong (put errors do not change that), 1 when one\n"
	"did, 2 on an error.\n";

/* Apply one of replay's own options. Returns 1, 0 (not ours) or -EINVAL. */
static int replay_opt(struct replay_cfg *cfg, const char *prog, int opt, const char *arg)
{
	uint64_t v;

	switch (opt) {
	case OPT_BLOCK_BYTES:
		if (cli_parse_size(arg, &cfg->block_bytes) || !cfg->block_bytes ||
		    cfg->block_bytes > (1ULL << 32))
			goto bad;
		return 1;
	case OPT_BLOCK_TOKENS:
		if (cli_parse_u64(arg, 1, UINT32_MAX, &cfg->block_tokens))
			goto bad;
		return 1;
	case OPT_CONCURRENCY:
		if (cli_parse_u64(arg, 1, REPLAY_MAX_CONCURRENCY, &v))
			goto bad;
		cfg->concurrency = (unsigned int)v;
		return 1;
	case OPT_TIME_SCALE:
		if (cli_parse_nonneg_double(arg, &cfg->time_scale))
			goto bad;
		return 1;
	case OPT_LEASE_MS:
		if (cli_parse_u64(arg, 0, UINT32_MAX, &v))
			goto bad;
		cfg->lease_ms = (uint32_t)v;
		return 1;
	case OPT_LIMIT:
		if (cli_parse_u64(arg, 1, SIZE_MAX, &v))
			goto bad;
		cfg->limit = (size_t)v;
		return 1;
	case OPT_JSON:
		cfg->json = true;
		return 1;
	case OPT_KEEP_NAMESPACE:
		cfg->keep_namespace = true;
		return 1;
	}
	return 0;
bad:
	cli_usage_error(prog, "bad value '%s' for --%s", arg,
			opt == OPT_BLOCK_BYTES ? "block-bytes (1 B .. 4 GiB)" :
			opt == OPT_BLOCK_TOKENS ? "block-tokens" :
			opt == OPT_CONCURRENCY ? "concurrency (1..1024)" :
			opt == OPT_TIME_SCALE ? "time-scale" :
			opt == OPT_LEASE_MS ? "lease-ms" : "limit");
	return -EINVAL;
}

/* Parse replay's command line into *cfg. Returns -1 to go on, or an exit
 * code to return now. */
static int replay_parse(int argc, char **argv, struct replay_cfg *cfg)
{
	static const struct option longopts[] = {
		CLI_COMMON_LONGOPTS,
		{ "block-bytes", required_argument, NULL, OPT_BLOCK_BYTES },
		{ "block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS },
		{ "concurrency", required_argument, NULL, OPT_CONCURRENCY },
		{ "time-scale", required_argument, NULL, OPT_TIME_SCALE },
		{ "lease-ms", required_argument, NULL, OPT_LEASE_MS },
		{ "limit", required_argument, NULL, OPT_LIMIT },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "keep-namespace", no_argument, NULL, OPT_KEEP_NAMESPACE },
		{ NULL, 0, NULL, 0 },
	};
	const char *prog = argv[0];
	int opt, rc;

	*cfg = (struct replay_cfg){ .block_bytes = REPLAY_DEFAULT_BLOCK_BYTES,
				    .block_tokens = REPLAY_DEFAULT_BLOCK_TOKENS,
				    .concurrency = 1,
				    .lease_ms = REPLAY_DEFAULT_LEASE_MS };
	cli_conn_init(&cfg->conn, "replay");
	optind = 0;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		rc = cli_conn_opt(&cfg->conn, prog, opt, optarg);
		if (rc == 0)
			rc = replay_opt(cfg, prog, opt, optarg);
		if (rc < 0)
			return CLI_EXIT_ERROR;
		if (rc)
			continue;
		if (opt == 'h') {
			fputs(replay_usage, stdout);
			return CLI_EXIT_OK;
		}
		return cli_try_help(prog);
	}
	if (argc - optind != 1)
		return cli_usage_error(prog, "want exactly one TRACE file");
	cfg->trace_path = argv[optind];
	return -1;
}

/* Connect the control handle and check the block size against the server's
 * limit. Returns 0 or an exit code. */
static int replay_control(const struct replay_cfg *cfg, const char *prog,
			  struct kvpool_client **out)
{
	struct kvpool_limits lim;
	int rc;

	if (cli_connect(&cfg->conn, prog, out))
		return CLI_EXIT_ERROR;
	rc = kvpool_get_limits(*out, &lim);
	if (rc) {
		fprintf(stderr, "%s: %s\n", prog, kvpool_strerror(rc));
		goto out_close;
	}
	if (lim.max_block_bytes && cfg->block_bytes > lim.max_block_bytes) {
		fprintf(stderr, "%s: --block-bytes %" PRIu64 " is above the server's "
			"max_block_bytes %" PRIu64 "\n", prog, cfg->block_bytes,
			lim.max_block_bytes);
		goto out_close;
	}
	return 0;
out_close:
	kvpool_close(*out);
	*out = NULL;
	return CLI_EXIT_ERROR;
}

/* Empty the namespace unless --keep-namespace: what a previous run left
 * there (perhaps blocks of another size) would make this run's figures
 * meaningless. Only this namespace is touched. Returns 0 or an exit code. */
static int replay_empty_namespace(const struct replay_cfg *cfg, const char *prog,
				  struct kvpool_client *ctl, struct cli_replay_report *rep)
{
	int rc;

	rep->namespace_dropped = false;
	rep->dropped_blocks = 0;
	if (cfg->keep_namespace)
		return 0;
	rc = kvpool_drop_namespace(ctl, NULL, &rep->dropped_blocks);
	if (rc) {
		fprintf(stderr, "%s: dropping namespace \"%s\" first: %s\n", prog, cfg->conn.ns,
			kvpool_strerror(rc));
		return CLI_EXIT_ERROR;
	}
	rep->namespace_dropped = true;
	return 0;
}

/* Connect and allocate every worker. Returns 0 or an exit code. */
static int workers_setup(struct replay_shared *sh, struct replay_worker *ws, const char *prog)
{
	const struct replay_cfg *cfg = sh->cfg;
	size_t batch = batch_blocks(sh->trace, cfg->block_bytes);

	for (unsigned int i = 0; i < cfg->concurrency; i++) {
		ws[i].sh = sh;
		if (worker_alloc(&ws[i], batch, cfg->block_bytes)) {
			fprintf(stderr, "%s: out of memory for %zu blocks of %" PRIu64
				" bytes per connection\n", prog, batch, cfg->block_bytes);
			return CLI_EXIT_ERROR;
		}
		if (cli_connect(&cfg->conn, prog, &ws[i].c))
			return CLI_EXIT_ERROR;
		/* put_batch retries BUSY itself and counts it (put_retries). */
		kvpool_set_busy_tries(ws[i].c, 1);
	}
	return 0;
}

/* Sum the workers' counters into the report, with the run's wall time. */
static int report_collect(struct cli_replay_report *rep, struct replay_worker *ws,
			  unsigned int n)
{
	rep->wall_s = 0;
	for (unsigned int i = 0; i < n; i++) {
		if (cli_replay_counts_add(&rep->counts, &ws[i].counts))
			return -ENOMEM;
		if (ws[i].end_s > rep->wall_s)
			rep->wall_s = ws[i].end_s;
	}
	return 0;
}

/* Read the namespace and eviction counters, saying why on failure. */
static int read_counters(struct kvpool_client *c, const char *prog, const char *ns,
			 struct cli_stats_counters *out)
{
	int rc = cli_stats_counters(c, ns, out);

	if (rc)
		fprintf(stderr, "%s: stats: %s\n", prog, kvpool_strerror(rc));
	return rc;
}

/* Run the loaded trace: counters before, the workers, counters after, the
 * report. Returns the exit code. */
static int replay_trace(const struct replay_cfg *cfg, const char *prog, struct cli_trace *t,
			struct cli_replay_report *rep)
{
	struct replay_shared sh = { .cfg = cfg, .trace = t };
	struct cli_stats_counters before, after;
	struct kvpool_client *ctl = NULL;
	struct replay_worker *ws;
	int rc;

	pthread_mutex_init(&sh.err_lock, NULL);
	ws = calloc(cfg->concurrency, sizeof(*ws));
	if (!ws) {
		fprintf(stderr, "%s: out of memory\n", prog);
		rc = CLI_EXIT_ERROR;
		goto out_mutex;
	}
	rc = replay_control(cfg, prog, &ctl);
	if (rc)
		goto out_workers;
	rc = replay_empty_namespace(cfg, prog, ctl, rep);
	if (rc)
		goto out_workers;
	rc = workers_setup(&sh, ws, prog);
	if (rc || read_counters(ctl, prog, cfg->conn.ns, &before)) {
		rc = CLI_EXIT_ERROR;
		goto out_workers;
	}
	replay_run(&sh, ws, cfg->concurrency);
	if (sh.err[0]) {
		fprintf(stderr, "%s: %s\n", prog, sh.err);
		rc = CLI_EXIT_ERROR;
		goto out_workers;
	}
	if (read_counters(ctl, prog, cfg->conn.ns, &after) ||
	    report_collect(rep, ws, cfg->concurrency)) {
		rc = CLI_EXIT_ERROR;
		goto out_workers;
	}
	rep->server_get_hits = after.ns_get_hits - before.ns_get_hits;
	rep->evictions = after.evictions - before.evictions;
	rc = CLI_EXIT_OK;
out_workers:
	for (unsigned int i = 0; ws && i < cfg->concurrency; i++)
		worker_release(&ws[i]);
	free(ws);
	kvpool_close(ctl);
out_mutex:
	pthread_mutex_destroy(&sh.err_lock);
	return rc;
}

/* Print the report and pick the exit code: 1 when any block came back
 * wrong. */
static int replay_report(const struct replay_cfg *cfg, const char *prog,
			 struct cli_replay_report *rep)
{
	uint64_t put_errors = cli_replay_errno_total(rep->counts.put_errors);

	/* Not an exit status (the data that came back was right), but the hit
	 * ratios are lower than the pool would give: say so where a script's
	 * log shows it. */
	if (put_errors)
		fprintf(stderr, "%s: warning: %" PRIu64 " block%s could not be put (see put_errors "
			"in the report): the hit ratios are lower than the pool could give\n", prog,
			put_errors, put_errors == 1 ? "" : "s");
	/* A cluster handle ends the leases it took past a chain's first short
	 * segment with GETs that return no bytes (docs/cluster.md); the
	 * servers count those as hits too, so there only fewer is a warning. */
	bool cluster = strchr(cfg->conn.url, ',') || strncmp(cfg->conn.url, "etcd://", 7) == 0;

	if (cluster ? rep->server_get_hits < rep->counts.returned
		    : rep->server_get_hits != rep->counts.returned)
		fprintf(stderr, "%s: warning: the server counted %" PRIu64 " get hits in namespace "
			"\"%s\" but this client got %" PRIu64 " blocks (another client in the "
			"namespace?)\n", prog, rep->server_get_hits, cfg->conn.ns,
			rep->counts.returned);
	if (cfg->json) {
		if (cli_replay_print_json(stdout, rep)) {
			fprintf(stderr, "%s: out of memory\n", prog);
			return CLI_EXIT_ERROR;
		}
	} else {
		cli_replay_print_text(stdout, rep);
	}
	if (fflush(stdout)) {
		fprintf(stderr, "%s: writing the report: %s\n", prog, strerror(errno));
		return CLI_EXIT_ERROR;
	}
	return rep->counts.wrong ? CLI_EXIT_MISS : CLI_EXIT_OK;
}

int cli_replay_main(int argc, char **argv)
{
	const char *prog = argv[0];
	struct cli_replay_report rep = { 0 };
	struct cli_trace trace = { 0 };
	struct replay_cfg cfg;
	char err[512] = "";
	int rc;

	rc = replay_parse(argc, argv, &cfg);
	if (rc >= 0)
		return rc;
	rc = cli_trace_load(cfg.trace_path, cfg.limit, &trace, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: %s\n", prog, err[0] ? err : strerror(-rc));
		return CLI_EXIT_ERROR;
	}
	if (!trace.n_reqs) {
		fprintf(stderr, "%s: %s: no requests in the trace\n", prog, cfg.trace_path);
		rc = CLI_EXIT_ERROR;
		goto out_trace;
	}
	rep = (struct cli_replay_report){ .trace_path = cfg.trace_path, .url = cfg.conn.url,
					  .ns = cfg.conn.ns, .block_bytes = cfg.block_bytes,
					  .block_tokens = cfg.block_tokens,
					  .concurrency = cfg.concurrency };
	if (cli_trace_ideal_hits(&trace, &rep.ideal_hits)) {
		fprintf(stderr, "%s: out of memory\n", prog);
		rc = CLI_EXIT_ERROR;
		goto out_trace;
	}
	rc = replay_trace(&cfg, prog, &trace, &rep);
	if (rc == CLI_EXIT_OK)
		rc = replay_report(&cfg, prog, &rep);
	cli_replay_counts_release(&rep.counts);
out_trace:
	cli_trace_destroy(&trace);
	return rc;
}
