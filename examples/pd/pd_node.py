#!/usr/bin/env python3
"""A prefill node or a decode node of a disaggregated deployment ("a GPU
node", here a CPU process), handing KV from prefill to decode through
kvpool. The model, its paged KV cache and the block layout are those of
the TTFT demo (examples/ttft/model.py): a block's payload is kv[slot],
byte for byte.

The driver (pd_demo.py, the router) starts one of each and sends each
request as one JSON line on stdin; the node answers with one JSON line on
stdout (logs go to stderr). Times are time.monotonic() (CLOCK_MONOTONIC,
one clock for every process of the machine), so the router can line up
what the two nodes did.

Prefill node (--role prefill):
    {"op": "prefill", "id": ..., "tokens": [...], "chunk": 1024, "progress": false}
  prefills the prompt chunk by chunk and, after each chunk, puts the full
  blocks it completed (put_chain, with parents, straight from kv[slot]);
  the decode side waiting on the pool is woken by the PUT that completes
  its run. Once the last PUT is acknowledged the node frees the request's
  cache slots at once: it never waits for the decode side. With
  "progress", a line {"event": "chunk", "blocks_put": N, "t": ...} follows
  each chunk's PUT (the router uses it to kill the node mid-prompt).
  Reply: {"ok", "t_recv", "t_compute_done", "t_last_put_ack", "t_freed",
  "compute_s", "put_s", "put_blocks", "put_bytes", "chunks", "pool_error"}.

Decode node (--role decode):
    {"op": "decode", "id": ..., "tokens": [...], "wait_ms": W, "decode": 16,
     "logits_out": "/path/or/null"}
  one MATCH of the prompt's full blocks that waits up to W ms for all of
  them (want = all; the server answers as soon as the PUT that completes
  the run is committed, or with the shorter run when W passes), GET of
  the matched blocks into its cache, then the rest of the prompt computed
  (only the last token when every block arrived: its logits give the
  first token), then greedy decoding. A pool that fails, answers short or
  ends the wait (server restart) only means more to compute, never a
  failed request.
  Reply: {"ok", "t_recv", "t_match_done", "t_loaded", "t_first",
  "matched", "present", "flags", "flag_names", "loaded_blocks",
  "loaded_bytes", "match_s", "load_s", "compute_s", "computed_tokens",
  "tokens", "decode_step_s", "pool_error"}.
    {"op": "local", "tokens": [...], "decode": 16, "logits_out": ...}
  the same request served by this node alone, no pool: one node doing
  prefill and decode (the reference). Reply: {"ok", "ttft_s", "tokens",
  "decode_step_s"}.

    {"op": "quit"}
"""

import argparse
import array
import json
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ttft"))
import model as M  # noqa: E402

import kvpool  # noqa: E402  (PYTHONPATH: client/python)

LEASE_MS = 5000


def log(name, msg):
    print("pd node %s: %s" % (name, msg), file=sys.stderr, flush=True)


def emit(obj):
    print(json.dumps(obj), flush=True)


def flag_names(flags):
    names = []
    for n in ("WAITED", "WAIT_TIMEOUT", "WAIT_REFUSED", "WAIT_CLAMPED", "WAIT_ENDED",
              "LEASE_CUT"):
        if flags & getattr(kvpool, "MATCH_" + n, 0):
            names.append(n)
    return names


class Node:
    """A model, its paged KV cache and a pool connection."""

    def __init__(self, name, role, cfg, cache_blocks, url, timeout_s):
        self.name = name
        self.role = role
        self.cfg = cfg
        self.model = M.Model(cfg)
        self.cache = self.model.new_cache(cache_blocks)
        perm = list(range(cache_blocks))
        random.Random(name).shuffle(perm)           # a paged allocator's scattered slots
        self.table = torch.tensor(perm, dtype=torch.int64)
        self._slots = perm
        self._views = [self.cache[i] for i in range(cache_blocks)]
        self.url = url
        self.timeout_s = timeout_s
        self.pool = None
        self.pool_error = None
        self._connect()

    def _connect(self):
        if not self.url:
            return
        try:
            self.pool = kvpool.Client(self.url, self.cfg.namespace(), timeout=self.timeout_s)
            self.pool_error = None
        except kvpool.Error as e:
            self.pool = None
            self.pool_error = "pool unavailable: %s" % e
            log(self.name, self.pool_error)

    def _views_of(self, first, last):
        return [self._views[self._slots[i]] for i in range(first, last)]

    def _check(self, tokens, decode):
        c = self.cfg
        if not tokens:
            raise ValueError("empty prompt")
        need = (len(tokens) + max(decode, 1) + c.block_tokens - 1) // c.block_tokens
        if need > self.cache.shape[0]:
            raise ValueError("prompt of %d tokens + %d decoded needs %d blocks; the cache has %d"
                             % (len(tokens), decode, need, self.cache.shape[0]))
        if any((not isinstance(t, int)) or t < 0 or t >= c.vocab for t in tokens):
            raise ValueError("token ids must be ints in 0..%d" % (c.vocab - 1))

    # ---- prefill -----------------------------------------------------------

    def prefill(self, tokens, chunk, progress):
        self._check(tokens, 0)
        c = self.cfg
        bt = c.block_tokens
        n = len(tokens)
        t_recv = time.monotonic()
        if chunk < bt or chunk % bt:
            raise ValueError("chunk must be a multiple of block_tokens (%d)" % bt)
        keys = kvpool.block_hashes(array.array("I", tokens), bt)   # the full blocks
        ids = torch.tensor(tokens, dtype=torch.int64)
        r = dict(ok=True, t_recv=t_recv, compute_s=0.0, put_s=0.0, put_blocks=0, put_bytes=0,
                 chunks=0, pool_error=None, t_last_put_ack=None)
        if self.pool is None:
            self._connect()
        put_upto = 0
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            t0 = time.monotonic()
            self.model.forward(self.cache, self.table, ids[s:e], s)
            r["compute_s"] += time.monotonic() - t0
            r["chunks"] += 1
            done = e // bt                                   # full blocks computed so far
            if self.pool is not None and done > put_upto:
                t0 = time.monotonic()
                try:
                    st = self.pool.put_chain(keys[put_upto:done], self._views_of(put_upto, done),
                                             parent=keys[put_upto - 1] if put_upto else None)
                    ok = sum(1 for x in st if x == 0)
                    r["put_blocks"] += ok
                    if ok < len(st):
                        r["pool_error"] = "put: %d of %d blocks refused (%s)" % (
                            len(st) - ok, len(st),
                            kvpool.strerror(next(x for x in st if x != 0)))
                except kvpool.Error as ex:
                    r["pool_error"] = "put failed: %s" % ex
                t1 = time.monotonic()
                r["put_s"] += t1 - t0
                r["t_last_put_ack"] = t1
                put_upto = done
                if progress:
                    emit(dict(event="chunk", blocks_put=r["put_blocks"], t=t1))
        r["t_compute_done"] = time.monotonic()
        r["put_bytes"] = r["put_blocks"] * c.block_bytes
        # the request's slots are free now: the pool has its blocks, and
        # nobody is waited for (a GPU engine would hand them back here)
        r["t_freed"] = time.monotonic()
        if r["t_last_put_ack"] is None:
            r["t_last_put_ack"] = r["t_compute_done"]
        return r

    # ---- decode ------------------------------------------------------------

    def _match_load(self, keys, want, wait_ms, r):
        """One MATCH that waits, then GET into the cache. Returns the
        leading blocks in place."""
        if self.pool is None:
            self._connect()
        if self.pool is None or want == 0:
            r["pool_error"] = r["pool_error"] or self.pool_error
            return 0
        try:
            t0 = time.monotonic()
            m = self.pool.match_detail(keys[:want], lease_ms=LEASE_MS, wait_ms=wait_ms)
            t1 = time.monotonic()
            r.update(matched=m.matched, present=m.present, flags=m.flags,
                     flag_names=flag_names(m.flags), match_s=t1 - t0, t_match_done=t1)
            got = self.pool.get_into_many(keys[:m.matched], self._views_of(0, m.matched)) \
                if m.matched else []
            t2 = time.monotonic()
        except kvpool.Error as e:
            r["pool_error"] = "match/get failed: %s" % e
            r["t_match_done"] = time.monotonic()
            return 0
        loaded = 0
        while loaded < len(got) and got[loaded] == self.cfg.block_bytes:
            loaded += 1
        if loaded < r["matched"]:
            r["pool_error"] = "block %d of %d not loaded: computing from there" % (
                loaded, r["matched"])
        r.update(load_s=t2 - t1, t_loaded=t2, loaded_blocks=loaded,
                 loaded_bytes=loaded * self.cfg.block_bytes)
        return loaded

    def _decode_steps(self, logits, n, decode, r):
        """Greedy tokens after the first; the median step time."""
        out = [int(torch.argmax(logits))]
        steps = []
        pos = n
        while len(out) < decode:
            t0 = time.monotonic()
            lg = self.model.forward(self.cache, self.table, torch.tensor([out[-1]]), pos)
            steps.append(time.monotonic() - t0)
            out.append(int(torch.argmax(lg)))
            pos += 1
        r["tokens"] = out
        r["decode_step_s"] = sorted(steps)[len(steps) // 2] if steps else 0.0

    def decode(self, tokens, wait_ms, decode, logits_out):
        self._check(tokens, decode)
        c = self.cfg
        bt = c.block_tokens
        n = len(tokens)
        r = dict(ok=True, t_recv=time.monotonic(), matched=0, present=0, flags=0, flag_names=[],
                 loaded_blocks=0, loaded_bytes=0, match_s=0.0, load_s=0.0, pool_error=None)
        keys = kvpool.block_hashes(array.array("I", tokens), bt)
        loaded = self._match_load(keys, len(keys), wait_ms, r)
        r.setdefault("t_match_done", time.monotonic())
        r.setdefault("t_loaded", r["t_match_done"])
        # every block arrived: the last token is computed again for its
        # logits (its K/V are rewritten with the same values)
        start = min(loaded * bt, n - 1)
        ids = torch.tensor(tokens, dtype=torch.int64)
        t0 = time.monotonic()
        logits = self.model.forward(self.cache, self.table, ids[start:], start)
        first = int(torch.argmax(logits))
        r["t_first"] = time.monotonic()
        r.update(compute_s=r["t_first"] - t0, computed_tokens=n - start, first_token=first)
        self._decode_steps(logits, n, decode, r)
        if logits_out:
            torch.save(logits, logits_out)
        return r

    def local(self, tokens, decode, logits_out):
        """One node doing both: a cold prefill of the whole prompt (no
        pool), the first token, then decoding."""
        self._check(tokens, decode)
        t0 = time.monotonic()
        logits = self.model.forward(self.cache, self.table,
                                    torch.tensor(tokens, dtype=torch.int64), 0)
        r = dict(ok=True, ttft_s=time.monotonic() - t0)
        self._decode_steps(logits, len(tokens), decode, r)
        if logits_out:
            torch.save(logits, logits_out)
        return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", required=True, choices=("prefill", "decode"))
    ap.add_argument("--name", default="", help="node name (logs, slot shuffle)")
    ap.add_argument("--url", default="", help="kvpool server")
    ap.add_argument("--cache-blocks", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="pool call timeout, seconds (a waiting MATCH gets wait_ms more)")
    M.add_model_args(ap)
    args = ap.parse_args(argv)
    try:
        cfg = M.config_from_args(args)
    except ValueError as e:
        ap.error(str(e))
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    node = Node(args.name or args.role, args.role, cfg, args.cache_blocks, args.url,
                args.timeout)
    blas, blas_path = M.blas_library()
    emit(dict(ok=True, ready=True, role=args.role, pid=os.getpid(), namespace=cfg.namespace(),
              block_bytes=cfg.block_bytes, blas=blas, blas_path=blas_path,
              threads=torch.get_num_threads(), pool_error=node.pool_error))
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                break
            tokens = list(req.get("tokens", []))
            if op == "prefill" and args.role == "prefill":
                rep = node.prefill(tokens, int(req.get("chunk", 1024)), bool(req.get("progress")))
            elif op == "decode" and args.role == "decode":
                rep = node.decode(tokens, int(req.get("wait_ms", 0)), int(req.get("decode", 16)),
                                  req.get("logits_out"))
            elif op == "local":
                rep = node.local(tokens, int(req.get("decode", 16)), req.get("logits_out"))
            else:
                raise ValueError("op %r is not one a %s node serves" % (op, args.role))
            rep["id"] = req.get("id")
        except (ValueError, KeyError, TypeError) as e:
            rep = dict(ok=False, id=None, error="%s: %s" % (type(e).__name__, e))
        emit(rep)
    if node.pool is not None:
        node.pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
