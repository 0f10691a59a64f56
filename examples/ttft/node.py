#!/usr/bin/env python3
"""One inference node ("a GPU node", here a CPU process) running the
reference decoder with kvpool as its shared prefix cache.

The driver (demo.py) starts two of these and sends each request as one JSON
line on stdin; the node answers with one JSON line on stdout (logs go to
stderr). A request:

    {"op": "request", "tokens": [...], "use_pool": true, "put": true,
     "decode": 16, "logits_out": "/path/or/null", "resident_blocks": 0,
     "async_put": false, "load_policy": "always"}
    {"op": "load", "tokens": [...], "repeats": 5}   (the load path alone)
    {"op": "flush"}    (wait for the puts still in flight)
    {"op": "quit"}

resident_blocks > 0 times the compute floor: the prompt's first
resident_blocks blocks are taken as already in this node's KV cache (the
driver sends it right after a request that loaded or computed them), so
nothing is hashed, matched or loaded, and only the rest is prefilled.
async_put: the put of step 4 runs on the node's put thread, from a copy of
the blocks taken right after the first token (as an engine offloads KV in
the background), so the reply, and the next request, do not wait for it.
load_policy: "always" loads every matched block; "never" matches but
loads nothing; "estimate" loads the matched prefix only when the node's
LoadEstimator (the engine adapters' own, kvpool._adapters.policy, fed with
this node's GET and prefill timings) expects its load to beat
recomputing it.

What the node does with it, as an engine would:
  1. block hashes of the prompt's full blocks (kvpool.block_hashes on the
     token ids);
  2. use_pool: MATCH the chain with a lease, then GET the matched blocks
     straight into its preallocated KV cache (get_into_many into kv[slot]:
     no copies; see model.py for the layout). The block holding the
     prompt's last token is never loaded: that token is computed, since its
     logits give the first token;
  3. prefill the rest of the prompt and take the first token (argmax):
     TTFT ends here;
  4. put: store the full blocks it computed (put_chain from kv[slot], with
     their parents), after the first token, as an engine's offload does;
  5. decode: greedy tokens after the first (for correctness checks).

Every pool failure (server gone, miss despite the lease, a bad block) turns
into computing more, never into a failed request: the reply says what
happened in "pool_error".

The reply: {"ok": true, "ttft_s", "hash_s", "match_s", "load_s",
"prefill_s", "put_s", "prompt_tokens", "matched_blocks", "loaded_blocks",
"loaded_bytes", "computed_tokens", "put_blocks", "tokens", "pool_error"},
or {"ok": false, "error": "..."} for a request that could not be served
(bad input).
"""

import argparse
import array
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402

import kvpool  # noqa: E402  (PYTHONPATH: client/python)
# the engine adapters' load estimator (loads a hit only when it pays)
from kvpool._adapters.policy import LoadEstimator  # noqa: E402

LEASE_MS = 5000


def log(name, msg):
    print("node %s: %s" % (name, msg), file=sys.stderr, flush=True)


class Putter:
    """The node's put thread: puts staged blocks with its own pool
    connection (a libkvpool handle serves one thread at a time), one batch
    after another, so a request never waits for the put of the one before."""

    def __init__(self, node):
        import queue
        import threading
        self.node = node
        self.q = queue.Queue()
        self.puts = self.errors = 0
        self.pool = None
        self.t = threading.Thread(target=self._run, name="put-" + node.name, daemon=True)
        self.t.start()

    def submit(self, keys, staged, parent):
        self.q.put((keys, staged, parent))

    def _run(self):
        while True:
            keys, staged, parent = self.q.get()
            try:
                if self.pool is None:
                    self.pool = kvpool.Client(self.node.url, self.node.cfg.namespace(),
                                              timeout=self.node.timeout_s)
                st = self.pool.put_chain(keys, [staged[i] for i in range(len(keys))],
                                         parent=parent)
                self.puts += sum(1 for x in st if x == 0)
                if any(x != 0 for x in st):
                    self.errors += 1
            except kvpool.Error as e:
                self.errors += 1
                self.pool = None
                log(self.node.name, "background put failed: %s" % e)
            finally:
                self.q.task_done()

    def flush(self):
        self.q.join()
        return dict(ok=True, puts=self.puts, errors=self.errors)


class Node:
    """A model, its paged KV cache and (optionally) a pool connection."""

    def __init__(self, name, cfg, cache_blocks, url, timeout_s):
        self.name = name
        self._putter = None     # the background put thread (async_put), made at first use
        self.cfg = cfg
        self.model = M.Model(cfg)
        self.cache = self.model.new_cache(cache_blocks)
        # This node's block table order: a fixed shuffle of its slots, so
        # that a request's blocks are scattered through the cache as in a
        # real paged allocator (and loaded blocks land in arbitrary slots).
        perm = list(range(cache_blocks))
        random.Random(name).shuffle(perm)
        self.table = torch.tensor(perm, dtype=torch.int64)
        self._slots = perm
        # kv[slot] of every slot, made once: each is the payload buffer of
        # whatever block sits in that slot (contiguous; pinned per call).
        self._views = [self.cache[i] for i in range(cache_blocks)]
        self.url = url
        self.timeout_s = timeout_s
        self.estimator = LoadEstimator()
        self.pool = None
        self.pool_error = None
        if url:
            self._connect()

    def _connect(self):
        try:
            self.pool = kvpool.Client(self.url, self.cfg.namespace(), timeout=self.timeout_s)
            self.pool_error = None
        except kvpool.Error as e:
            self.pool = None
            self.pool_error = "pool unavailable: %s" % e
            log(self.name, self.pool_error)

    def _slot_views(self, first, last):
        """kv[slot] of the request's blocks first..last-1: the payload buffers."""
        return [self._views[self._slots[i]] for i in range(first, last)]

    def _load(self, keys, usable, r, policy="always", prompt_tokens=0):
        """MATCH + GET into the cache; returns how many leading blocks are in
        place. Fills r's match/load fields. policy: "always" loads what
        matched, "never" loads nothing (after the MATCH, to report it),
        "estimate" asks the load estimator how much is worth loading."""
        if self.pool is None and self.url:
            self._connect()                 # the server may be back
        if self.pool is None or usable == 0:
            if self.pool_error:
                r["pool_error"] = self.pool_error
            return 0
        try:
            t0 = time.perf_counter()
            matched = self.pool.match(keys[:usable], lease_ms=LEASE_MS)
            want = matched
            if policy == "never":
                want = 0
            elif policy == "estimate":
                want, r["decision"] = self.estimator.decide(
                    matched, self.cfg.block_bytes, self.cfg.block_tokens)
            t1 = time.perf_counter()
            got = self.pool.get_into_many(keys[:want], self._slot_views(0, want)) \
                if want else []
            t2 = time.perf_counter()
        except kvpool.Error as e:
            r["pool_error"] = "match/get failed: %s" % e
            return 0
        if want:
            self.estimator.record_load(want * self.cfg.block_bytes, t2 - t1)
        loaded = 0
        while loaded < len(got) and got[loaded] == self.cfg.block_bytes:
            loaded += 1
        if loaded < want:
            bad = got[loaded]
            r["pool_error"] = ("block %d of %d not loaded (%s): computing from there"
                               % (loaded, want, kvpool.strerror(bad) if bad < 0
                                  else "%d bytes, expected %d" % (bad, self.cfg.block_bytes)))
        r.update(matched_blocks=matched, match_s=t1 - t0, load_s=t2 - t1,
                 loaded_bytes=loaded * self.cfg.block_bytes)
        return loaded

    def _put(self, keys, first, r):
        """Store the prompt's full blocks first.. (computed here) with parents."""
        if self.pool is None or first >= len(keys):
            return
        t0 = time.perf_counter()
        try:
            st = self.pool.put_chain(keys[first:], self._slot_views(first, len(keys)),
                                     parent=keys[first - 1] if first else None)
        except kvpool.Error as e:
            r["pool_error"] = "put failed: %s" % e
            return
        r["put_s"] = time.perf_counter() - t0
        r["put_blocks"] = sum(1 for s in st if s == 0)
        if r["put_blocks"] < len(st):
            bad = next(s for s in st if s != 0)
            r["pool_error"] = "put: %d of %d blocks refused (%s)" % (
                len(st) - r["put_blocks"], len(st), kvpool.strerror(bad))

    def _put_async(self, keys, first, r):
        """Copy the prompt's computed full blocks first.. out of the cache
        and hand them to the put thread: the caller goes on at once (the
        slots may be reused by the next request; the copy may not)."""
        if self.pool is None or first >= len(keys):
            return
        t0 = time.perf_counter()
        staged = torch.stack(self._slot_views(first, len(keys)))
        if self._putter is None:
            self._putter = Putter(self)
        self._putter.submit(keys[first:], staged, keys[first - 1] if first else None)
        r["put_s"] = time.perf_counter() - t0      # the copy only: the put runs on
        r["put_blocks"] = len(keys) - first        # (queued; its errors are logged)

    def flush(self):
        """Wait until the put thread has nothing left to do."""
        return self._putter.flush() if self._putter else dict(ok=True, puts=0, errors=0)

    def load_only(self, tokens, repeats):
        """MATCH + GET of the prompt's blocks into the cache, `repeats`
        times, nothing computed: the load path alone, for the bandwidth
        comparison with `kvpool bench`. Returns per-repeat times."""
        keys = kvpool.block_hashes(array.array("I", tokens), self.cfg.block_tokens)
        usable = min(len(keys), (len(tokens) - 1) // self.cfg.block_tokens)
        out = dict(ok=True, match_s=[], load_s=[], loaded_blocks=0, pool_error=None)
        for _ in range(repeats):
            r = dict(pool_error=None)
            out["loaded_blocks"] = self._load(keys, usable, r)
            out["match_s"].append(r.get("match_s", 0.0))
            out["load_s"].append(r.get("load_s", 0.0))
            out["pool_error"] = out["pool_error"] or r["pool_error"]
        out["loaded_bytes"] = out["loaded_blocks"] * self.cfg.block_bytes
        return out

    def request(self, tokens, use_pool, put, decode, logits_out, resident_blocks=0,
                async_put=False, load_policy="always"):
        c = self.cfg
        bt = c.block_tokens
        n = len(tokens)
        if n < 1:
            raise ValueError("empty prompt")
        need_blocks = (n + max(decode, 1) + bt - 1) // bt
        if need_blocks > self.cache.shape[0]:
            raise ValueError("prompt of %d tokens + %d decoded needs %d blocks; the cache has %d"
                             % (n, decode, need_blocks, self.cache.shape[0]))
        if any((not isinstance(t, int)) or t < 0 or t >= c.vocab for t in tokens):
            raise ValueError("token ids must be ints in 0..%d" % (c.vocab - 1))
        if load_policy not in ("always", "never", "estimate"):
            raise ValueError("load_policy must be always, never or estimate")
        if resident_blocks < 0 or resident_blocks > (n - 1) // bt or (resident_blocks and use_pool):
            raise ValueError("resident_blocks must be 0..%d (the last token is computed), and "
                             "without use_pool" % ((n - 1) // bt))
        r = dict(ok=True, prompt_tokens=n, matched_blocks=0, loaded_blocks=0, loaded_bytes=0,
                 hash_s=0.0, match_s=0.0, load_s=0.0, put_s=0.0, put_blocks=0,
                 pool_error=None)
        t_start = time.perf_counter()
        ids = torch.tensor(tokens, dtype=torch.int64)
        keys = []
        loaded = 0
        if use_pool or put:
            keys = kvpool.block_hashes(array.array("I", tokens), bt)
            r["hash_s"] = time.perf_counter() - t_start
        if use_pool:
            usable = min(len(keys), (n - 1) // bt)      # the last token is always computed
            loaded = self._load(keys, usable, r, load_policy, n)
        start = (loaded or resident_blocks) * bt
        t_pre = time.perf_counter()
        logits = self.model.forward(self.cache, self.table, ids[start:], start)
        first = int(torch.argmax(logits))
        t_end = time.perf_counter()
        r.update(ttft_s=t_end - t_start, prefill_s=t_end - t_pre, loaded_blocks=loaded,
                 computed_tokens=n - start, first_token=first)
        self.estimator.record_prefill(n - start, t_end - t_pre, n)
        r["estimate"] = self.estimator.state()
        if put and async_put:
            self._put_async(keys, loaded, r)
        elif put:
            self._put(keys, loaded, r)
        r["tokens"] = self.model.greedy(self.cache, self.table, logits, n, decode) \
            if decode > 0 else [first]
        if logits_out:
            torch.save(logits, logits_out)
        return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="A", help="node name (logs, slot shuffle)")
    ap.add_argument("--url", default="", help="kvpool server; empty: no pool")
    ap.add_argument("--cache-blocks", type=int, default=1024,
                    help="KV cache slots preallocated (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--timeout", type=float, default=10.0, help="pool call timeout, seconds")
    M.add_model_args(ap)
    args = ap.parse_args(argv)
    try:
        cfg = M.config_from_args(args)
    except ValueError as e:
        ap.error(str(e))
    if args.cache_blocks < 1:
        ap.error("--cache-blocks must be >= 1")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    node = Node(args.name, cfg, args.cache_blocks, args.url, args.timeout)
    blas, blas_path = M.blas_library()
    hello = dict(ok=True, ready=True, name=args.name, namespace=cfg.namespace(),
                 block_bytes=cfg.block_bytes, blas=blas, blas_path=blas_path,
                 threads=torch.get_num_threads(), pool_error=node.pool_error)
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                break
            if op == "load":
                rep = node.load_only(list(req["tokens"]), int(req.get("repeats", 1)))
                print(json.dumps(rep), flush=True)
                continue
            if op == "flush":
                print(json.dumps(node.flush()), flush=True)
                continue
            if op != "request":
                raise ValueError("unknown op %r" % (op,))
            rep = node.request(list(req["tokens"]), bool(req.get("use_pool")),
                               bool(req.get("put")), int(req.get("decode", 0)),
                               req.get("logits_out"), int(req.get("resident_blocks", 0)),
                               bool(req.get("async_put")),
                               str(req.get("load_policy", "always")))
        except (ValueError, KeyError, TypeError) as e:
            rep = dict(ok=False, error="%s: %s" % (type(e).__name__, e))
        print(json.dumps(rep), flush=True)
    node.flush()                      # puts still in flight go out before the exit
    if node.pool is not None:
        node.pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
