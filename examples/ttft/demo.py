#!/usr/bin/env python3
"""Time to first token with and without kvpool, on a reference Llama
decoder: two node processes (node.py) share one kvpool server.

Sweep mode: node A prefills a long random prompt and puts its blocks;
node B gets prompts made of the first P tokens of it plus a new suffix and
serves each twice: cold (pool off: prefill everything) and warm (MATCH,
GET into its KV cache, prefill the suffix). It checks that both give the
same first-token logits (max abs diff <= 1e-3) and the same greedy tokens,
and that a prefix whose tail was evicted still gives the same output.

Trace mode: the first N requests of a Mooncake trace, as real prompts
(each hash id is a fixed random block of token ids), alternating between
the two nodes, with and without the pool.

It prints the report, writes it as JSON and draws TTFT against prefix
length as a PNG. examples/ttft/run.sh (make demo-ttft) starts the server
and runs this with the defaults.
"""

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402

TOLERANCE = 1e-3
CHECK_PREFIX, CHECK_SUFFIX = 1024, 100    # the correctness run; the tail from 5/8 on is evicted
TRACE_HASH_TOKENS = 512    # tokens per hash id in the Mooncake traces
FLOOR_PAIRS = 5            # warm and floor runs taken in turns, per prefix


class NodeProc:
    """A node.py child process, driven over its stdin/stdout."""

    def __init__(self, name, cfg, url, cache_blocks, threads=2, env=None, prefix=(),
                 timeout_s=10.0):
        cmd = list(prefix) + [sys.executable, os.path.join(HERE, "node.py"), "--name", name,
                              "--url", url or "", "--cache-blocks", str(cache_blocks),
                              "--threads", str(threads), "--timeout", str(timeout_s)] \
            + M.model_argv(cfg)
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.hello = self._reply()

    def _reply(self):
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise RuntimeError("node %s exited (status %s) without answering" % (self.name, rc))
        return json.loads(line)

    def request(self, tokens, use_pool, put=False, decode=0, logits_out=None, resident_blocks=0,
                async_put=False, load_policy="always"):
        self.proc.stdin.write(json.dumps(dict(op="request", tokens=list(tokens),
                                              use_pool=use_pool, put=put, decode=decode,
                                              logits_out=logits_out,
                                              resident_blocks=resident_blocks,
                                              async_put=async_put,
                                              load_policy=load_policy)) + "\n")
        self.proc.stdin.flush()
        r = self._reply()
        if not r.get("ok"):
            raise RuntimeError("node %s: %s" % (self.name, r.get("error")))
        return r

    def flush(self):
        """Wait for the node's background puts; returns its put counts."""
        self.proc.stdin.write(json.dumps(dict(op="flush")) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def load(self, tokens, repeats):
        self.proc.stdin.write(json.dumps(dict(op="load", tokens=list(tokens),
                                              repeats=repeats)) + "\n")
        self.proc.stdin.flush()
        r = self._reply()
        if not r.get("ok"):
            raise RuntimeError("node %s: %s" % (self.name, r.get("error")))
        return r

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps(dict(op="quit")) + "\n")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def random_tokens(n, vocab, seed):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def max_abs_diff(path_a, path_b):
    import torch
    a, b = torch.load(path_a), torch.load(path_b)
    return float((a - b).abs().max())


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def p90(xs):
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]


def check_pair(b, prompt, tmp, tag, decode, warm_repeats=1, cold=None):
    """Node b serves `prompt` cold (no pool) and warm (pool); returns
    (cold reply, [warm replies], max abs logit diff, tokens equal)."""
    fc = os.path.join(tmp, tag + "-cold.pt")
    fw = os.path.join(tmp, tag + "-warm.pt")
    if cold is None:
        cold = b.request(prompt, use_pool=False, decode=decode, logits_out=fc)
        cold["logits_path"] = fc
    warms = [b.request(prompt, use_pool=True, decode=decode, logits_out=fw)
             for _ in range(warm_repeats)]
    diff = max_abs_diff(cold["logits_path"], fw)
    same = all(w["tokens"] == cold["tokens"] for w in warms)
    return cold, warms, diff, same


def correctness(a, b, cfg, prefix_tokens, suffix_tokens, tmp, decode=16, pool=None,
                evict_at=None):
    """The checks the test runs (tiny model) and the demo prints: A puts a
    prefix; B serves prefix+suffix cold and warm; then, with `pool` (a
    kvpool.Client on the same namespace) and evict_at, the chain's tail from
    block evict_at on is removed and B serves it warm again. Returns a dict."""
    bt = cfg.block_tokens
    prefix = random_tokens(prefix_tokens, cfg.vocab, 1)
    prompt = prefix + random_tokens(suffix_tokens, cfg.vocab, 2)
    ra = a.request(prefix, use_pool=False, put=True)
    cold, warms, diff, same = check_pair(b, prompt, tmp, "check", decode)
    out = dict(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
               a_put_blocks=ra["put_blocks"], expected_blocks=prefix_tokens // bt,
               loaded_blocks=warms[0]["loaded_blocks"], computed_tokens=warms[0]["computed_tokens"],
               max_abs_diff=diff, tokens_equal=same, tokens=cold["tokens"],
               cold_loaded_blocks=cold["loaded_blocks"], pool_error=warms[0]["pool_error"])
    if pool is not None and evict_at is not None:
        import kvpool
        keys = kvpool.block_hashes(prefix, bt)
        pool.delete(keys[evict_at])        # drops the block and every descendant
        _, w2, diff2, same2 = check_pair(b, prompt, tmp, "evicted", decode, cold=cold)
        out["evicted"] = dict(kept_blocks=evict_at, loaded_blocks=w2[0]["loaded_blocks"],
                              computed_tokens=w2[0]["computed_tokens"],
                              max_abs_diff=diff2, tokens_equal=same2)
    return out


# ---- sweep ---------------------------------------------------------------------

def sweep(a, b, cfg, prefixes, suffix, decode, warm_repeats, tmp, say):
    """TTFT cold/warm per prefix length. The prefixes are leading parts of
    one long prompt that node A prefilled once: a P-token prefix is the
    first P / block_tokens blocks of that chain."""
    base = random_tokens(max(prefixes), cfg.vocab, 10)
    ra = a.request(base, use_pool=False, put=True)
    say("node A: prefilled %d tokens in %.2f s, put %d blocks (%.1f MB) in %.3f s"
        % (len(base), ra["ttft_s"], ra["put_blocks"], ra["put_blocks"] * cfg.block_bytes / 1e6,
           ra["put_s"]))
    rows = []
    for p in prefixes:
        prompt = base[:p] + random_tokens(suffix, cfg.vocab, 100 + p)
        cold, warms, diff, same = check_pair(b, prompt, tmp, "p%d" % p, decode, warm_repeats)
        w = min(warms, key=lambda r: r["ttft_s"])
        load_s = median([r["load_s"] for r in warms])
        # the compute floor: the same prompt with the prefix's KV already in
        # B's cache (each warm run just put it there): only the suffix runs.
        # Floor and warm runs alternate, so that both see the same load.
        floors, paired, pool_part = [], [], []
        for _ in range(max(warm_repeats, FLOOR_PAIRS)):
            wr = b.request(prompt, use_pool=True)
            paired.append(wr["ttft_s"])
            pool_part.append(wr["hash_s"] + wr["match_s"] + wr["load_s"])
            floors.append(b.request(prompt, use_pool=False,
                                    resident_blocks=w["loaded_blocks"])["ttft_s"])
        row = dict(prefix_tokens=p, suffix_tokens=suffix, prompt_tokens=len(prompt),
                   ttft_cold_s=cold["ttft_s"], ttft_warm_s=median([r["ttft_s"] for r in warms]),
                   ttft_warm_best_s=w["ttft_s"], warm_prefill_s=w["prefill_s"],
                   match_s=median([r["match_s"] for r in warms]), load_s=load_s,
                   loaded_blocks=w["loaded_blocks"], loaded_bytes=w["loaded_bytes"],
                   load_gbps=w["loaded_bytes"] / load_s / 1e9 if load_s > 0 else 0.0,
                   prefill_tok_s=len(prompt) / cold["prefill_s"],
                   floor_s=median(floors), warm_paired_s=median(paired),
                   floor_best_s=min(floors), warm_paired_best_s=min(paired),
                   pool_part_s=median(pool_part),
                   max_abs_diff=diff, tokens_equal=same, pool_error=w["pool_error"])
        row["ratio"] = row["ttft_warm_s"] / row["ttft_cold_s"]
        rows.append(row)
        say("  prefix %5d: cold %7.3f s  warm %6.3f s  (%.3fx)  floor %6.3f s  loaded %d blocks "
            "%6.1f MB at %5.2f GB/s  max|dlogit| %.1e  tokens %s"
            % (p, row["ttft_cold_s"], row["ttft_warm_s"], row["ratio"], row["floor_s"],
               row["loaded_blocks"], row["loaded_bytes"] / 1e6, row["load_gbps"], diff,
               "same" if same else "DIFFER"))
    return rows, base


def break_even(b, cfg, base, suffix, rows, lengths, repeats, say):
    """Below which prefix length loading does not pay: from the formula
    (fixed cost of MATCH + GET over the per-token gain) and measured (cold
    against warm at short prefixes)."""
    s_tok = median([r["prefill_tok_s"] for r in rows])          # tokens/s, cold prefill
    gbps = median([r["load_gbps"] for r in rows if r["load_gbps"] > 0])
    per_tok_load = cfg.kv_bytes_per_token / (gbps * 1e9)
    per_tok_compute = 1.0 / s_tok
    measured = []
    for p in lengths:
        prompt = base[:p] + random_tokens(suffix, cfg.vocab, 500 + p)
        cold = [b.request(prompt, use_pool=False)["ttft_s"] for _ in range(repeats)]
        warm = [b.request(prompt, use_pool=True) for _ in range(repeats)]
        measured.append(dict(prefix_tokens=p, ttft_cold_s=median(cold),
                             ttft_warm_s=median([w["ttft_s"] for w in warm]),
                             fixed_s=median([w["hash_s"] + w["match_s"] for w in warm]),
                             loaded_blocks=warm[0]["loaded_blocks"]))
    fixed = median([m["fixed_s"] for m in measured])
    gain = per_tok_compute - per_tok_load
    formula = fixed / gain if gain > 0 else float("inf")
    below = [m["prefix_tokens"] for m in measured if m["ttft_warm_s"] >= m["ttft_cold_s"]]
    above = [m["prefix_tokens"] for m in measured if m["ttft_warm_s"] < m["ttft_cold_s"]]
    out = dict(prefill_tok_s=s_tok, load_gbps=gbps, kv_bytes_per_token=cfg.kv_bytes_per_token,
               fixed_cost_s=fixed, formula_tokens=formula,
               measured_first_winning_prefix=min(above) if above else None,
               measured_losing_prefixes=below, points=measured,
               block_tokens=cfg.block_tokens)
    won = out["measured_first_winning_prefix"]
    say("break-even: loading pays when P * (1/S - b/BW) > t_fixed, i.e. P > t_fixed / (1/S - b/BW)"
        " = %.2e s / (1/%.0f tok/s - %d B / %.2f GB/s) = %.2f tokens (formula; loading works a "
        "block of %d tokens at a time); measured: %s"
        % (fixed, s_tok, cfg.kv_bytes_per_token, gbps, formula, cfg.block_tokens,
           ("the shortest prefix tried that is faster warm is %d tokens" % won) if won else
           "no prefix tried (%s tokens) was faster warm" % "/".join(str(x) for x in lengths)))
    return out


# ---- trace ---------------------------------------------------------------------

def window_reuse(recs):
    """Of the block references of recs (trace records, in order), the share
    that continue a prefix seen earlier among recs: the hit ratio an empty
    pool would reach on them (the trace's hash ids are prefix-chained)."""
    seen, hit, total = set(), 0, 0
    for r in recs:
        m = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            m += 1
        hit += m
        total += len(r["hash_ids"])
        seen.update(r["hash_ids"])
    return hit / total if total else 0.0


def choose_window(path, n, step=10):
    """Where prefixes recur: of the n-request windows starting every `step`
    requests, the one whose reuse (window_reuse) is highest, the earliest
    among equals. Returns (start, its reuse, the median window's, the first
    window's)."""
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    scores = [(window_reuse(recs[i:i + n]), i) for i in range(0, max(1, len(recs) - n + 1), step)]
    best = max(scores, key=lambda x: (x[0], -x[1]))
    return best[1], best[0], statistics.median([x[0] for x in scores]), scores[0][0]


def trace_prompts(path, n, tokens_per_hash, vocab, start=0):
    """Requests start..start+n-1 of a Mooncake trace as token-id prompts:
    hash id h stands for a fixed random block of tokens_per_hash ids
    (seeded by h), and input lengths are scaled by tokens_per_hash / 512."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if len(out) >= n:
                break
            if i < start:
                continue
            rec = json.loads(line)
            length = max(1, round(rec["input_length"] * tokens_per_hash / TRACE_HASH_TOKENS))
            toks = []
            for h in rec["hash_ids"]:
                toks += random_tokens(tokens_per_hash, vocab, ("hash", h).__repr__())
            out.append(dict(tokens=toks[:length], hash_ids=len(rec["hash_ids"])))
    return out


def fit_budget(prompts, rows, left_s, say):
    """The leading prompts whose replay (each prefilled twice at worst) the
    time left allows, at the sweep's slowest short-prompt prefill speed."""
    speed = min(r["prefill_tok_s"] for r in rows if r["prompt_tokens"] <= 2304) \
        if any(r["prompt_tokens"] <= 2304 for r in rows) else min(r["prefill_tok_s"] for r in rows)
    spent, n = 0.0, 0
    for p in prompts:
        spent += 2 * len(p["tokens"]) / speed
        if spent > left_s:
            break
        n += 1
    if n < len(prompts):
        say("== trace: %d of %d requests fit in the %.0f s left of --budget-s (prefill at %.0f "
            "tokens/s); replaying those" % (n, len(prompts), max(left_s, 0), speed))
    return prompts[:n]


def trace(nodes, prompts, say):
    """Replay: request i goes to node i % 2, which serves it twice: without
    the pool (full prefill) and with it (MATCH + GET, prefill the rest, put
    what was computed). Pairing the two runs in time keeps the comparison
    fair on a busy machine. The put runs on the node's put thread from a
    copy taken after the first token, as an engine offloads KV: neither
    this request's TTFT nor the next request waits for it."""
    without, with_, saved, total, hits = [], [], 0, 0, 0
    for i, p in enumerate(prompts):
        node = nodes[i % 2]
        if i % 2:   # which of the pair runs first alternates (caches, allocator warmth)
            r1 = node.request(p["tokens"], use_pool=True, put=True, async_put=True)
            r0 = node.request(p["tokens"], use_pool=False)
        else:
            r0 = node.request(p["tokens"], use_pool=False)
            r1 = node.request(p["tokens"], use_pool=True, put=True, async_put=True)
        without.append(r0["ttft_s"])
        with_.append(r1["ttft_s"])
        saved += len(p["tokens"]) - r1["computed_tokens"]
        total += len(p["tokens"])
        hits += r1["loaded_blocks"] > 0
    for n in nodes:
        n.flush()
    worse = [w / o for w, o in zip(with_, without) if w > o]
    out = dict(requests=len(prompts), prompt_tokens=total, prefill_tokens_saved=saved,
               saved_fraction=saved / total if total else 0.0, requests_with_hit=hits,
               ttft_without_mean_s=statistics.mean(without), ttft_without_p90_s=p90(without),
               ttft_with_mean_s=statistics.mean(with_), ttft_with_p90_s=p90(with_),
               requests_slower_with_pool=len(worse),
               worst_slowdown=max(worse) if worse else 1.0,
               ttft_without_s=without, ttft_with_s=with_)
    out["pool_never_worse"] = (out["ttft_with_mean_s"] <= out["ttft_without_mean_s"]
                               and out["ttft_with_p90_s"] <= out["ttft_without_p90_s"])
    say("trace: %d requests, %d prompt tokens; %d requests hit the pool; prefill tokens saved "
        "%d (%.1f%%)" % (out["requests"], total, hits, saved, 100 * out["saved_fraction"]))
    say("  TTFT without pool: mean %.3f s  p90 %.3f s" % (out["ttft_without_mean_s"],
                                                        out["ttft_without_p90_s"]))
    say("  TTFT with pool:    mean %.3f s  p90 %.3f s" % (out["ttft_with_mean_s"],
                                                        out["ttft_with_p90_s"]))
    say("  pool never worse (mean and p90): %s; requests slower with the pool: %d of %d "
        "(worst %.2fx: a miss costs its hashing and MATCH, and the machine's noise)"
        % ("yes" if out["pool_never_worse"] else "NO", out["requests_slower_with_pool"],
           out["requests"], out["worst_slowdown"]))
    return out


# ---- kvpool bench, GPU calculation, report ----------------------------------------

def c_bench(cli, url, block_bytes, batch, calls):
    """`kvpool bench` GET GB/s at the demo's block size and batch, `calls`
    calls per phase (a bounded count, so that its puts do not evict the
    demo's blocks from the server's DRAM)."""
    cmd = [cli, "bench", "--server", url, "--sizes", str(block_bytes), "--ops", "put,get",
           "--batch", str(batch), "--count", str(batch * calls), "--source-bytes", "64MiB",
           "--namespace", "ttft-demo-bench", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("kvpool bench failed (%d): %s" % (r.returncode, r.stderr.strip()))
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    get = [x for x in doc["results"] if x["op"] == "get"][0]
    return dict(command=" ".join(cmd), get_gbps=get["gbps"], block_bytes=block_bytes,
                batch=batch)


def bandwidth(b, args, cfg, base, rows, say):
    """The demo's load path alone (MATCH + get_into_many of the 4k-token
    prefix's blocks into node B's cache, 5 times) next to `kvpool bench`
    GET at the same block size and batch, twice each, interleaved so that
    both see the same machine load; medians are compared."""
    lengths = [r["prefix_tokens"] for r in rows]
    p = 4096 if 4096 in lengths else max(lengths)
    prompt = base[:p] + [0]
    demo, bench = [], []
    want = p // cfg.block_tokens
    for _ in range(2):
        r = b.load(prompt, 5)
        if r["loaded_blocks"] != want:
            raise RuntimeError("bandwidth: loaded %d blocks, expected %d (%s)"
                               % (r["loaded_blocks"], want, r["pool_error"]))
        demo += [r["loaded_bytes"] / s / 1e9 for s in r["load_s"]]
        cb = c_bench(args.kvpool_cli, args.url, cfg.block_bytes, want, args.bench_calls)
        bench.append(cb["get_gbps"])
    out = dict(command=cb["command"], block_bytes=cfg.block_bytes, batch=cb["batch"],
               prefix_tokens=p, demo_gbps=median(demo), bench_get_gbps=median(bench),
               demo_samples_gbps=demo, bench_samples_gbps=bench,
               sweep_in_request_gbps=[r["load_gbps"] for r in rows])
    out["demo_over_bench"] = out["demo_gbps"] / out["bench_get_gbps"]
    say("== load bandwidth: demo %.2f GB/s (MATCH + get_into_many of %d blocks of %d B into the "
        "KV cache, median of %d) vs kvpool bench GET %.2f GB/s (same block size, --batch %d, "
        "median of %d): %.2fx (target >= 0.8x)"
        % (out["demo_gbps"], cb["batch"], cfg.block_bytes, len(demo), out["bench_get_gbps"],
           cb["batch"], len(bench), out["demo_over_bench"]))
    return out


# ---- a pool slowed on purpose -----------------------------------------------------

def shape(netns, rate_bytes_s):
    """Shape the loopback of network namespace `netns` to rate_bytes_s
    (None: no shaping) with a token bucket (tc tbf). The loopback's MTU is
    64 KiB, so the bucket holds a few of its packets."""
    base = ["ip", "netns", "exec", netns, "tc", "qdisc"]
    if rate_bytes_s is None:
        subprocess.run(base + ["del", "dev", "lo", "root"], capture_output=True)
        return
    burst = max(256 << 10, int(rate_bytes_s / 50))
    r = subprocess.run(base + ["replace", "dev", "lo", "root", "tbf", "rate",
                               "%dbit" % int(rate_bytes_s * 8), "burst", str(burst),
                               "latency", "10s"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("tc: %s" % r.stderr.strip())


def throttled(args, cfg, cache_blocks, prefixes, bench_gbps, prefill_tok_s, say):
    """The pool in network namespace args.slow_netns, reached over its
    loopback shaped by tc to a tenth of kvpool bench's GET speed, then to
    half of what loading must reach to beat prefill here. Node B there
    serves each prefix three ways: never loading (the cold TTFT), always
    loading what matched, and as the adapter does (its estimator loads
    only when loading is expected to beat recomputing). Three warm-up
    requests that load at each speed let the estimator measure it first
    (an adapter in service learns the same from its loads and probes)."""
    pre = ["ip", "netns", "exec", args.slow_netns]
    # a GET of 8k tokens' KV takes tens of seconds at the slowest speed
    a = NodeProc("A-slow", cfg, args.slow_url, cache_blocks, args.threads, prefix=pre,
                 timeout_s=300)
    b = NodeProc("B-slow", cfg, args.slow_url, cache_blocks, args.threads, prefix=pre,
                 timeout_s=300)
    levels = [("a tenth of kvpool bench", bench_gbps * 1e9 / 10),
              ("loading 2x slower than prefill", cfg.kv_bytes_per_token * prefill_tok_s / 2)]
    out = []
    try:
        for n in (a, b):
            if n.hello.get("pool_error"):
                raise RuntimeError("node %s: %s" % (n.name, n.hello["pool_error"]))
        shape(args.slow_netns, None)
        base = random_tokens(max(prefixes), cfg.vocab, 20)
        a.request(base, use_pool=False, put=True)     # stored at full speed
        for name, rate in levels:
            shape(args.slow_netns, rate)
            for i in range(3):                        # the estimator learns this speed
                b.request(base[:512] + random_tokens(args.suffix, cfg.vocab, 900 + i),
                          use_pool=True, load_policy="always")
            rows = []
            for p in prefixes:
                prompt = base[:p] + random_tokens(args.suffix, cfg.vocab, 950 + p)
                r = {pol: b.request(prompt, use_pool=True, load_policy=pol)
                     for pol in ("never", "always", "estimate")}
                rows.append(dict(prefix_tokens=p, ttft_never_s=r["never"]["ttft_s"],
                                 ttft_always_s=r["always"]["ttft_s"],
                                 ttft_adapter_s=r["estimate"]["ttft_s"],
                                 adapter_loaded_blocks=r["estimate"]["loaded_blocks"],
                                 adapter_decision=r["estimate"].get("decision"),
                                 always_load_gbps=r["always"]["loaded_bytes"]
                                 / r["always"]["load_s"] / 1e9 if r["always"]["load_s"] else 0,
                                 estimate=r["estimate"]["estimate"]))
            out.append(dict(level=name, rate_bytes_s=rate, rows=rows))
            say("  pool at %.1f MB/s (%s):" % (rate / 1e6, name))
            for x in rows:
                say("    prefix %5d: never-load %6.3f s  always-load %6.3f s  adapter %6.3f s "
                    "(%s: %d blocks loaded)"
                    % (x["prefix_tokens"], x["ttft_never_s"], x["ttft_always_s"],
                       x["ttft_adapter_s"], x["adapter_decision"], x["adapter_loaded_blocks"]))
    finally:
        shape(args.slow_netns, None)
        a.close()
        b.close()
    best = [min(x["ttft_never_s"], x["ttft_always_s"]) for lv in out for x in lv["rows"]]
    adap = [x["ttft_adapter_s"] for lv in out for x in lv["rows"]]
    worst = max(a / b for a, b in zip(adap, best)) if best else float("nan")
    say("  adapter against the better of never/always: worst %.2fx over %d points"
        % (worst, len(best)))
    return dict(levels=out, adapter_over_best_worst=worst)


def floor_report(rows, bench_gbps, say):
    """Warm TTFT against what moving the bytes must cost at least: the
    compute floor (the same prompt with the prefix's KV already in the
    node's cache) plus the prefix's bytes at `kvpool bench` GET speed.
    Target: warm <= 1.2 x that, i.e. the pool adds next to nothing but the
    transfer. The warm path is the floor's computation plus the pool part
    (hashing, MATCH, GET into the cache), which the node times apart; on a
    machine shared with other work the computation varies by more than
    the whole pool part between runs, so the target is checked on floor +
    pool part (both medians), and the warm runs' own medians are shown
    beside it."""
    out = []
    for r in rows:
        transfer = r["loaded_bytes"] / (bench_gbps * 1e9) if bench_gbps > 0 else float("inf")
        expected = r["floor_s"] + transfer
        warm = r["floor_s"] + r["pool_part_s"]
        out.append(dict(prefix_tokens=r["prefix_tokens"], floor_s=r["floor_s"],
                        transfer_at_bench_s=transfer, pool_part_s=r["pool_part_s"],
                        expected_s=expected, warm_s=warm, ratio=warm / expected,
                        warm_measured_s=r["warm_paired_s"],
                        ratio_measured=r["warm_paired_s"] / expected))
    met = all(x["ratio"] <= 1.2 for x in out)
    say("== warm TTFT against the compute floor + the prefix's bytes at kvpool bench GET speed "
        "(%.2f GB/s); medians of %d warm and %d floor runs per prefix, taken in turns"
        % (bench_gbps, FLOOR_PAIRS, FLOOR_PAIRS))
    for x in out:
        say("  prefix %5d: floor %6.3f s; pool part %6.1f ms against %6.1f ms of bytes at bench "
            "speed: %.3f s against %.3f s = %.2fx  (the warm runs' own median %6.3f s: %.2fx)"
            % (x["prefix_tokens"], x["floor_s"], 1e3 * x["pool_part_s"],
               1e3 * x["transfer_at_bench_s"], x["warm_s"], x["expected_s"], x["ratio"],
               x["warm_measured_s"], x["ratio_measured"]))
    say("  target <= 1.2x at every prefix: %s" % ("met" if met else "NOT met"))
    return dict(bench_get_gbps=bench_gbps, rows=out, target_le_1_2=met)


def gpu_calculation(prefix, suffix, kv_bytes_per_token, prefill_tok_s, links_gbit):
    """CALCULATION, not a measurement: warm/cold TTFT on a GPU node if
    loading P tokens takes P*b/BW and prefill runs at S tokens/s:
    ratio = (P*b/BW + s/S) / ((P+s)/S). Attention's growth with length is
    ignored (it makes cold slower, so the real ratio is lower)."""
    out = []
    cold = (prefix + suffix) / prefill_tok_s
    for g in links_gbit:
        bw = g * 1e9 / 8
        warm = prefix * kv_bytes_per_token / bw + suffix / prefill_tok_s
        be = 0.0 if kv_bytes_per_token / bw < 1 / prefill_tok_s else float("inf")
        out.append(dict(link_gbit_s=g, load_s=prefix * kv_bytes_per_token / bw,
                        ttft_cold_s=cold, ttft_warm_s=warm, ratio=warm / cold,
                        load_faster_than_prefill_x=(1 / prefill_tok_s) / (kv_bytes_per_token / bw),
                        never_pays=be == float("inf")))
    return out


def plot(rows, trace_out, path, title, slow=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = 1 + bool(trace_out) + bool(slow)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels + 1, 4.2))
    axes = list(axes) if panels > 1 else [axes]
    ax = axes[0]
    xs = [r["prefix_tokens"] for r in rows]
    ax.plot(xs, [r["ttft_cold_s"] for r in rows], "o-", label="cold (pool off: full prefill)")
    ax.plot(xs, [r["ttft_warm_s"] for r in rows], "s-", label="warm (prefix loaded from kvpool)")
    for r in rows:
        ax.annotate("%.2fx" % r["ratio"], (r["prefix_tokens"], r["ttft_warm_s"]),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("shared prefix length (tokens), + %d-token suffix" % rows[0]["suffix_tokens"])
    ax.set_ylabel("time to first token (s)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if slow:
        ax3 = axes[-1]
        lv = slow["levels"][-1]
        xs3 = [x["prefix_tokens"] for x in lv["rows"]]
        ax3.plot(xs3, [x["ttft_never_s"] for x in lv["rows"]], "o-", label="never load (cold)")
        ax3.plot(xs3, [x["ttft_always_s"] for x in lv["rows"]], "s-", label="always load")
        ax3.plot(xs3, [x["ttft_adapter_s"] for x in lv["rows"]], "^--",
                 label="adapter (loads when it pays)")
        ax3.set_xscale("log", base=2)
        ax3.set_xticks(xs3)
        ax3.set_xticklabels([str(x) for x in xs3])
        ax3.set_xlabel("shared prefix length (tokens)")
        ax3.set_ylabel("TTFT (s)")
        ax3.set_title("pool slowed to %.1f MB/s (tc in a network namespace)"
                      % (lv["rate_bytes_s"] / 1e6), fontsize=9)
        ax3.grid(True, alpha=0.3)
        ax3.legend(fontsize=8)
    if trace_out:
        ax2 = axes[1]
        labels = ["mean", "p90"]
        wo = [trace_out["ttft_without_mean_s"], trace_out["ttft_without_p90_s"]]
        wi = [trace_out["ttft_with_mean_s"], trace_out["ttft_with_p90_s"]]
        x = range(len(labels))
        ax2.bar([i - 0.2 for i in x], wo, 0.4, label="without pool")
        ax2.bar([i + 0.2 for i in x], wi, 0.4, label="with pool")
        ax2.set_xticks(list(x))
        ax2.set_xticklabels(labels)
        ax2.set_ylabel("TTFT (s)")
        w = trace_out.get("window", dict(start=0))
        ax2.set_title("Mooncake trace, requests %d..%d (%.1f%% of prefill tokens saved)"
                      % (w["start"], w["start"] + trace_out["requests"] - 1,
                         100 * trace_out["saved_fraction"]), fontsize=9)
        ax2.legend(fontsize=8)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows):
    lines = ["| prefix | suffix | TTFT cold (s) | TTFT warm (s) | warm/cold | KV loaded (MB) "
             "| load (GB/s) | prefill (tok/s) | max abs dlogit | 16 tokens |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append("| %d | %d | %.3f | %.3f | %.3f | %.1f | %.2f | %.0f | %.1e | %s |"
                     % (r["prefix_tokens"], r["suffix_tokens"], r["ttft_cold_s"], r["ttft_warm_s"],
                        r["ratio"], r["loaded_bytes"] / 1e6, r["load_gbps"], r["prefill_tok_s"],
                        r["max_abs_diff"], "same" if r["tokens_equal"] else "DIFFER"))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="kvpool server, tcp://host:port")
    ap.add_argument("--prefixes", default="1024,2048,4096,8192")
    ap.add_argument("--suffix", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16, help="greedy tokens compared")
    ap.add_argument("--warm-repeats", type=int, default=3)
    ap.add_argument("--break-even-prefixes", default="16,32,64,128",
                    help="short prefixes timed for the measured break-even ('' skips)")
    ap.add_argument("--trace", default=os.path.join(HERE, "..", "..", "tests", "data",
                                                    "synthetic_trace.jsonl"))
    ap.add_argument("--trace-requests", type=int, default=50, help="0 skips the trace mode")
    ap.add_argument("--trace-window", default="auto",
                    help="first request of the replayed window; auto (default): the window of "
                    "--trace-requests requests, starting every 10, in which prefixes recur most")
    ap.add_argument("--trace-tokens-per-hash", type=int, default=16,
                    help="tokens per trace hash id (the trace has 512): the scale-down")
    ap.add_argument("--kvpool-cli", default="", help="kvpool CLI for the bench comparison")
    ap.add_argument("--bench-calls", type=int, default=10,
                    help="kvpool bench calls per phase, each of one 4k prefix's blocks")
    ap.add_argument("--gpu-prefill-tok-s", type=float, default=20000.0,
                    help="GPU prefill speed for the calculation (Llama-3-8B, one H100-class GPU)")
    ap.add_argument("--gpu-kv-bytes-per-token", type=int, default=131072,
                    help="Llama-3-8B bf16: 2 x 32 layers x 8 KV heads x 128 x 2 B")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="seconds for the whole demo: the trace mode replays only as many "
                    "requests as the time left allows (default %(default)s)")
    ap.add_argument("--slow-url", default="",
                    help="a second kvpool server, inside network namespace --slow-netns, for "
                    "the throttled panel ('' skips it)")
    ap.add_argument("--slow-netns", default="", help="its network namespace (ip netns)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="ttft.json")
    ap.add_argument("--png", default="ttft.png")
    M.add_model_args(ap)
    args = ap.parse_args(argv)
    cfg = M.config_from_args(args)
    prefixes = [int(x) for x in args.prefixes.split(",") if x]
    be_lengths = [int(x) for x in args.break_even_prefixes.split(",") if x]
    if not prefixes or min(prefixes) < cfg.block_tokens:
        ap.error("--prefixes: at least one, each >= block_tokens")
    say = lambda s: print(s, flush=True)  # noqa: E731

    import kvpool
    t_all = time.perf_counter()
    prompts, window = [], None
    if args.trace_requests > 0:
        if args.trace_window == "auto":
            start, reuse, med, first = choose_window(args.trace, args.trace_requests)
            window = dict(start=start, reuse=reuse, median_window_reuse=med,
                          first_window_reuse=first, chosen="auto")
        else:
            start = int(args.trace_window)
            window = dict(start=start, chosen="given")
        prompts = trace_prompts(args.trace, args.trace_requests, args.trace_tokens_per_hash,
                                cfg.vocab, start)
    longest = max([max(prefixes) + args.suffix, CHECK_PREFIX + CHECK_SUFFIX]
                  + [len(p["tokens"]) for p in prompts])
    cache_blocks = (longest + args.decode) // cfg.block_tokens + 2
    a = NodeProc("A", cfg, args.url, cache_blocks, args.threads)
    b = NodeProc("B", cfg, args.url, cache_blocks, args.threads)
    report = dict(config=cfg.as_dict(), namespace=cfg.namespace(), url=args.url,
                  kv_bytes_per_token=cfg.kv_bytes_per_token, block_bytes=cfg.block_bytes,
                  blas=a.hello["blas"], blas_path=a.hello["blas_path"],
                  torch_threads=a.hello["threads"], load_average_start=os.getloadavg()[0])
    say("== reference Llama decoder: %d layers, hidden %d, %d heads / %d KV heads x %d, ffn %d, "
        "vocab %d, %s; KV %d B/token, block %d tokens = %d B"
        % (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab,
           cfg.dtype, cfg.kv_bytes_per_token, cfg.block_tokens, cfg.block_bytes))
    say("   torch %d threads, BLAS: %s (%s)" % (a.hello["threads"], a.hello["blas"],
                                               a.hello["blas_path"]))
    for n in (a, b):
        if n.hello.get("pool_error"):
            raise SystemExit("node %s: %s" % (n.name, n.hello["pool_error"]))
    with kvpool.Client(args.url, cfg.namespace()) as pool, \
            tempfile.TemporaryDirectory(prefix="ttft-") as tmp:
        pool.drop_namespace()
        for n in (a, b):                  # warm-up: first-touch of weights and buffers
            n.request(random_tokens(64, cfg.vocab, 3), use_pool=False, decode=2)
        evict_at = max(1, CHECK_PREFIX // cfg.block_tokens * 5 // 8)
        say("== correctness (node A puts %d tokens; node B serves %d + %d cold and warm; "
            "then the chain's tail from block %d on is evicted)"
            % (CHECK_PREFIX, CHECK_PREFIX, CHECK_SUFFIX, evict_at))
        chk = correctness(a, b, cfg, CHECK_PREFIX, CHECK_SUFFIX, tmp, args.decode, pool,
                          evict_at=evict_at)
        report["correctness"] = chk
        say("  warm loaded %d of %d blocks; max |logit diff| %.2e (<= %g: %s); first %d greedy "
            "tokens %s" % (chk["loaded_blocks"], chk["expected_blocks"], chk["max_abs_diff"],
                           TOLERANCE, "ok" if chk["max_abs_diff"] <= TOLERANCE else "FAIL",
                           args.decode, "identical" if chk["tokens_equal"] else "DIFFER"))
        ev = chk["evicted"]
        say("  evicted tail: %d blocks left in the pool, %d loaded, %d tokens computed; max |logit "
            "diff| %.2e; tokens %s" % (ev["kept_blocks"], ev["loaded_blocks"],
                                       ev["computed_tokens"], ev["max_abs_diff"],
                                       "identical" if ev["tokens_equal"] else "DIFFER"))
        pool.drop_namespace()
        say("== sweep: %s-token prefixes + %d-token suffix (node A prefills, node B cold/warm)"
            % ("/".join(str(p) for p in prefixes), args.suffix))
        rows, base = sweep(a, b, cfg, prefixes, args.suffix, args.decode, args.warm_repeats,
                           tmp, say)
        report["sweep"] = rows
        if be_lengths:
            report["break_even"] = break_even(b, cfg, base, args.suffix, rows, be_lengths, 3, say)
        if args.kvpool_cli:
            report["bench"] = bandwidth(b, args, cfg, base, rows, say)
            report["floor"] = floor_report(rows, report["bench"]["bench_get_gbps"], say)
        t_panel = time.perf_counter()
        if args.slow_url and args.slow_netns and "bench" in report:
            say("== a pool slowed on purpose (network namespace %s, loopback shaped with tc "
                "tbf): the adapter's TTFT against never-load and always-load" % args.slow_netns)
            report["throttled"] = throttled(
                args, cfg, cache_blocks, prefixes, report["bench"]["bench_get_gbps"],
                median([r["prefill_tok_s"] for r in rows]), say)
        t_panel = time.perf_counter() - t_panel   # not charged to the trace's budget
        pool.drop_namespace()
        if prompts:
            prompts = fit_budget(prompts, rows,
                                 args.budget_s - (time.perf_counter() - t_all - t_panel), say)
            report["trace_budget_trimmed"] = len(prompts) < args.trace_requests
        if prompts:
            w = window
            say("== trace: requests %d..%d of %s, %d tokens per hash id (lengths x %d/512), "
                "alternating A/B" % (w["start"], w["start"] + len(prompts) - 1,
                                     os.path.basename(args.trace), args.trace_tokens_per_hash,
                                     args.trace_tokens_per_hash))
            if w["chosen"] == "auto":
                say("   the window: of the %d-request windows starting every 10 requests, the one "
                    "whose prompts reuse most blocks of earlier prompts in it (an empty pool at "
                    "its start would hit %.1f%% of its blocks; the median window %.1f%%, the "
                    "trace's first %d requests %.1f%%)"
                    % (args.trace_requests, 100 * w["reuse"], 100 * w["median_window_reuse"],
                       args.trace_requests, 100 * w["first_window_reuse"]))
            report["trace"] = trace((a, b), prompts, say)
            report["trace"]["tokens_per_hash"] = args.trace_tokens_per_hash
            report["trace"]["window"] = dict(w, requests=len(prompts))
            pool.drop_namespace()
    a.close()
    b.close()

    four = [r for r in rows if r["prefix_tokens"] == 4096]
    ref_row = four[0] if four else rows[-1]
    report["target_4k_ratio_le_0_2"] = ref_row["ratio"] <= 0.2
    report["gpu_calculation"] = dict(
        note="CALCULATION, not a measurement",
        prefix_tokens=4096, suffix_tokens=args.suffix, prefill_tok_s=args.gpu_prefill_tok_s,
        kv_bytes_per_token=args.gpu_kv_bytes_per_token,
        links=gpu_calculation(4096, args.suffix, args.gpu_kv_bytes_per_token,
                              args.gpu_prefill_tok_s, (100, 200, 400)))
    report["elapsed_s"] = time.perf_counter() - t_all
    report["load_average_end"] = os.getloadavg()[0]
    say("")
    say("== TTFT, measured on this machine (%s BLAS, %d threads; %d CPUs, 1-min load average "
        "%.1f at the start, %.1f at the end: other work shares them)"
        % (report["blas"], report["torch_threads"], os.cpu_count() or 0,
           report["load_average_start"], report["load_average_end"]))
    say(table(rows))
    say("target: warm <= 0.2x cold at a %d-token prefix: %.3fx (%s)"
        % (ref_row["prefix_tokens"], ref_row["ratio"],
           "met" if report["target_4k_ratio_le_0_2"] else "NOT met"))
    g = report["gpu_calculation"]
    say("")
    say("== CALCULATION (not measured): a GPU node, Llama-3-8B bf16 (%d B of KV per token), "
        "prefill %.0f tokens/s, %d-token prefix + %d suffix: ratio = (P*b/BW + s/S) / ((P+s)/S)"
        % (g["kv_bytes_per_token"], g["prefill_tok_s"], g["prefix_tokens"], g["suffix_tokens"]))
    for x in g["links"]:
        say("   %3d Gb/s link: load %.1f ms, prefill of the suffix %.1f ms, cold %.1f ms -> "
            "warm/cold %.2f" % (x["link_gbit_s"], 1e3 * x["load_s"],
                                1e3 * args.suffix / g["prefill_tok_s"], 1e3 * x["ttft_cold_s"],
                                x["ratio"]))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    plot(rows, report.get("trace"), args.png,
         "reference Llama (%d layers, hidden %d), CPU %d threads; kvpool over loopback TCP"
         % (cfg.layers, cfg.hidden, report["torch_threads"]), report.get("throttled"))
    say("")
    say("wrote %s and %s (%.0f s in all)" % (args.json, args.png, report["elapsed_s"]))
    ok = (chk["max_abs_diff"] <= TOLERANCE and chk["tokens_equal"]
          and chk["loaded_blocks"] == chk["expected_blocks"]
          and ev["max_abs_diff"] <= TOLERANCE and ev["tokens_equal"]
          and ev["loaded_blocks"] == ev["kept_blocks"]
          and all(r["max_abs_diff"] <= TOLERANCE and r["tokens_equal"] for r in rows))
    if not ok:
        say("CORRECTNESS CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
