#!/usr/bin/env python3
"""Prefill -> decode hand-off through kvpool: the reference decoder of
examples/ttft in three processes, a router (this script), a prefill node
and a decode node (pd_node.py), against one kvpoold that this script
starts (and restarts, for one of the failure cases).

The router sends each prompt to both nodes at once. The prefill node
computes it chunk by chunk and PUTs each chunk's blocks; the decode node
sends one MATCH that waits (wait_ms, want = every full block of the
prompt), so the server answers it when the last PUT commits; it then GETs
the blocks into its own KV cache, computes the last token and decodes.

Checked on every run: the decode node's output equals a single node doing
both (its own run with the pool off): first-token logits within 1e-3 (max
abs), 16 identical greedy tokens; and one MATCH per decode request (the
server's MATCH count). Measured at each prompt length (default 1k, 2k, 4k
and 8k tokens): prefill time (request received -> last PUT acknowledged),
hand-off time (last PUT acknowledged -> the decode node's first token),
the decode node's TTFT (router sends -> first token) against the single
node's, the KV bytes moved and the GET rate. `kvpool bench` PUT and GET
at the same block size, in the same run, give what moving the 4k prompt's
bytes through the pool costs. Three failures, each printed with its
outcome: the prefill node killed mid-prompt, the decode node never
arriving, kvpoold restarted during a wait.

A JSON report and a picture go where --json and --png say
(examples/pd/run.sh: build/pd/).
"""

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ttft"))
import model as M  # noqa: E402

TOLERANCE = 1e-3


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    """kvpoold on a loopback port, started (and restarted) by the router."""

    def __init__(self, binary, cli, extra, log_path):
        self.binary, self.cli, self.extra, self.log_path = binary, cli, extra, log_path
        self.port = None
        self.proc = None

    @property
    def url(self):
        return "tcp://127.0.0.1:%d" % self.port

    def start(self, port=None):
        for _ in range(8):
            self.port = port or free_port()
            log = open(self.log_path, "a")
            self.proc = subprocess.Popen(
                [self.binary, "--listen", "127.0.0.1", "--port", str(self.port),
                 "--admin-port", "0", "--rdma-port", "0"] + self.extra,
                stdout=log, stderr=log)
            log.close()
            for _ in range(100):
                if self.proc.poll() is not None:
                    break
                r = subprocess.run([self.cli, "ping", "--server", self.url],
                                   capture_output=True)
                if r.returncode == 0:
                    return
                time.sleep(0.1)
            self.stop()
            if port:
                time.sleep(0.2)      # the same port: let the old one go
        raise RuntimeError("kvpoold did not start; see %s" % self.log_path)

    def stop(self):
        """SIGTERM: the server drains (waiting MATCHes are answered) and exits."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        self.proc = None
        return rc


class NodeProc:
    """A pd_node.py child, driven over stdin/stdout."""

    def __init__(self, role, cfg, url, cache_blocks, threads, name=None):
        self.role = role
        self.args = (cfg, url, cache_blocks, threads, name)
        self._spawn()

    def _spawn(self):
        cfg, url, cache_blocks, threads, name = self.args
        cmd = [sys.executable, os.path.join(HERE, "pd_node.py"), "--role", self.role,
               "--name", name or self.role, "--url", url, "--cache-blocks", str(cache_blocks),
               "--threads", str(threads)] + M.model_argv(cfg)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.hello = self.read()
        if self.hello.get("pool_error"):
            raise RuntimeError("%s node: %s" % (self.role, self.hello["pool_error"]))

    def send(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise RuntimeError("%s node exited (status %s) without answering" % (self.role, rc))
        return json.loads(line)

    def reply(self):
        """The next reply, skipping progress events."""
        while True:
            r = self.read()
            if "event" in r:
                continue
            if not r.get("ok"):
                raise RuntimeError("%s node: %s" % (self.role, r.get("error")))
            return r

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def respawn(self):
        self._spawn()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def random_tokens(n, vocab, seed):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def max_abs_diff(a, b):
    import torch
    return float((torch.load(a) - torch.load(b)).abs().max())


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def reference(dec, prompt, decode, path):
    """One node doing both (the decode node, pool off)."""
    dec.send(op="local", tokens=prompt, decode=decode, logits_out=path)
    return dec.reply()


def hand_off(pre, dec, prompt, chunk, wait_ms, decode, path):
    """The router sends the prompt to both nodes at once; returns both
    replies and the send time."""
    t_send = time.monotonic()
    pre.send(op="prefill", tokens=prompt, chunk=chunk)
    dec.send(op="decode", tokens=prompt, wait_ms=wait_ms, decode=decode, logits_out=path)
    rp = pre.reply()
    rd = dec.reply()
    return t_send, rp, rd


def measure(pre, dec, cfg, p, args, tmp, pool, say, seed):
    prompt = random_tokens(p, cfg.vocab, seed)
    f_ref = os.path.join(tmp, "ref-%d.pt" % p)
    f_pd = os.path.join(tmp, "pd-%d.pt" % p)
    pool.drop_namespace()
    req0 = pool.stats()["ops"]["match"]["requests"]
    # which goes first alternates, so both see the same machine
    if seed % 2:
        ref = reference(dec, prompt, args.decode, f_ref)
        t_send, rp, rd = hand_off(pre, dec, prompt, args.chunk, args.wait_ms, args.decode, f_pd)
    else:
        t_send, rp, rd = hand_off(pre, dec, prompt, args.chunk, args.wait_ms, args.decode, f_pd)
        ref = reference(dec, prompt, args.decode, f_ref)
    matches = pool.stats()["ops"]["match"]["requests"] - req0
    diff = max_abs_diff(f_ref, f_pd)
    row = dict(prompt_tokens=p, blocks=p // cfg.block_tokens,
               prefill_s=rp["t_last_put_ack"] - rp["t_recv"],
               prefill_compute_s=rp["compute_s"], prefill_put_s=rp["put_s"],
               prefill_chunks=rp["chunks"], put_blocks=rp["put_blocks"],
               handoff_s=rd["t_first"] - rp["t_last_put_ack"],
               wake_s=rd["t_match_done"] - rp["t_last_put_ack"],
               load_s=rd["load_s"], last_token_s=rd["compute_s"],
               decode_ttft_s=rd["t_first"] - t_send, single_ttft_s=ref["ttft_s"],
               decode_step_s=rd["decode_step_s"], matched=rd["matched"],
               flags=rd["flag_names"], loaded_blocks=rd["loaded_blocks"],
               bytes_moved=rd["loaded_bytes"],
               get_gbps=rd["loaded_bytes"] / rd["load_s"] / 1e9 if rd["load_s"] > 0 else 0.0,
               put_gbps=rp["put_bytes"] / rp["put_s"] / 1e9 if rp["put_s"] > 0 else 0.0,
               freed_after_ack_s=rp["t_freed"] - rp["t_last_put_ack"],
               max_abs_diff=diff, tokens_equal=rd["tokens"] == ref["tokens"],
               match_requests=matches,
               pool_error=rd["pool_error"] or rp["pool_error"])
    row["no_idle_gap"] = row["decode_ttft_s"] <= (row["prefill_s"] + row["handoff_s"]
                                                  + row["decode_step_s"])
    say("  %5d tokens: prefill %6.3f s  hand-off %6.1f ms (wake %.2f ms, GET %.1f ms, last "
        "token %.1f ms)  decode TTFT %6.3f s vs one node %6.3f s  %5.1f MB at %.2f GB/s  "
        "max|dlogit| %.1e  tokens %s  MATCHes %d"
        % (p, row["prefill_s"], 1e3 * row["handoff_s"], 1e3 * row["wake_s"],
           1e3 * row["load_s"], 1e3 * row["last_token_s"], row["decode_ttft_s"],
           row["single_ttft_s"], row["bytes_moved"] / 1e6, row["get_gbps"], diff,
           "same" if row["tokens_equal"] else "DIFFER", matches))
    return row


def c_bench(cli, url, block_bytes, batch, calls):
    """`kvpool bench` PUT and GET GB/s at the demo's block size, one 4k
    prompt's blocks per call."""
    cmd = [cli, "bench", "--server", url, "--sizes", str(block_bytes), "--ops", "put,get",
           "--batch", str(batch), "--count", str(batch * calls), "--source-bytes", "64MiB",
           "--namespace", "pd-demo-bench", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        raise RuntimeError("kvpool bench failed (%d): %s" % (r.returncode, r.stderr.strip()))
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    res = {x["op"]: x["gbps"] for x in doc["results"]}
    return dict(command=" ".join(cmd), put_gbps=res["put"], get_gbps=res["get"])


# ---- the failures -------------------------------------------------------------------

def fail_prefill_killed(pre, dec, cfg, args, tmp, say):
    """The prefill node dies after its first chunk's PUT: the decode node's
    MATCH is answered when its wait ends, with the blocks that arrived; it
    computes the rest. Output equal, no hang."""
    p = args.fail_tokens
    prompt = random_tokens(p, cfg.vocab, 900)
    f_ref, f_pd = os.path.join(tmp, "kill-ref.pt"), os.path.join(tmp, "kill-pd.pt")
    ref = reference(dec, prompt, args.decode, f_ref)
    t_send = time.monotonic()
    pre.send(op="prefill", tokens=prompt, chunk=args.fail_chunk, progress=True)
    dec.send(op="decode", tokens=prompt, wait_ms=args.fail_wait_ms, decode=args.decode,
             logits_out=f_pd)
    ev = pre.read()                        # the first chunk's PUT is acknowledged
    pre.kill()
    t_kill = time.monotonic()
    rd = dec.reply()
    diff = max_abs_diff(f_ref, f_pd)
    out = dict(prompt_tokens=p, blocks=p // cfg.block_tokens, killed_after_blocks=ev["blocks_put"],
               killed_at_s=t_kill - t_send, decode_answered_s=rd["t_match_done"] - t_send,
               wait_ms=args.fail_wait_ms, matched=rd["matched"], flags=rd["flag_names"],
               loaded_blocks=rd["loaded_blocks"], computed_tokens=rd["computed_tokens"],
               decode_ttft_s=rd["t_first"] - t_send, max_abs_diff=diff,
               tokens_equal=rd["tokens"] == ref["tokens"])
    out["ok"] = (out["tokens_equal"] and diff <= TOLERANCE
                 and out["loaded_blocks"] == out["killed_after_blocks"])
    out["outcome"] = ("prefill node killed %.2f s in, after %d of %d blocks were put; the decode "
                      "node's MATCH was answered %.2f s after the request (wait_ms %d, flags %s) "
                      "with %d blocks, it loaded them and computed the other %d tokens: first "
                      "token %.2f s after the request, 16 tokens %s, max|dlogit| %.1e; no hang"
                      % (out["killed_at_s"], out["killed_after_blocks"], out["blocks"],
                         out["decode_answered_s"], args.fail_wait_ms, "|".join(out["flags"]),
                         out["matched"], out["computed_tokens"], out["decode_ttft_s"],
                         "same" if out["tokens_equal"] else "DIFFER", diff))
    say("  1. " + out["outcome"])
    pre.respawn()
    return out


def fail_decode_absent(pre, dec, cfg, args, tmp, pool, say):
    """The decode node never comes: the prefill node frees its slots as
    soon as its last PUT is acknowledged, and the blocks stay in the pool
    (a decode node that comes late finds them without waiting)."""
    import array
    import kvpool
    p = args.fail_tokens
    prompt = random_tokens(p, cfg.vocab, 901)
    keys = kvpool.block_hashes(array.array("I", prompt), cfg.block_tokens)
    pre.send(op="prefill", tokens=prompt, chunk=args.chunk)
    rp = pre.reply()
    held = sum(1 for x in pool.exists_many(keys) if x)
    f_ref, f_late = os.path.join(tmp, "late-ref.pt"), os.path.join(tmp, "late.pt")
    dec.send(op="decode", tokens=prompt, wait_ms=args.wait_ms, decode=args.decode,
             logits_out=f_late)
    rd = dec.reply()
    ref = reference(dec, prompt, args.decode, f_ref)
    diff = max_abs_diff(f_ref, f_late)
    out = dict(prompt_tokens=p, blocks=len(keys), put_blocks=rp["put_blocks"],
               freed_after_ack_ms=1e3 * (rp["t_freed"] - rp["t_last_put_ack"]),
               pool_holds_blocks=held, late_decode_flags=rd["flag_names"],
               late_decode_loaded=rd["loaded_blocks"], late_decode_match_ms=1e3 * rd["match_s"],
               max_abs_diff=diff, tokens_equal=rd["tokens"] == ref["tokens"])
    out["ok"] = (out["put_blocks"] == out["blocks"] and out["late_decode_loaded"] == out["blocks"]
                 and "WAITED" not in out["late_decode_flags"] and out["tokens_equal"]
                 and diff <= TOLERANCE)
    out["outcome"] = ("no decode node: the prefill node put %d blocks and freed its slots %.2f ms "
                      "after its last PUT was acknowledged, waiting for nobody; the pool holds "
                      "%s of them; a decode node arriving later matched all %d at once (%.1f ms, "
                      "flags %s), 16 tokens %s"
                      % (out["put_blocks"], out["freed_after_ack_ms"],
                         "all %d" % held if held == out["blocks"] else held,
                         out["late_decode_loaded"], out["late_decode_match_ms"],
                         "|".join(out["late_decode_flags"]) or "none",
                         "same" if out["tokens_equal"] else "DIFFER"))
    say("  2. " + out["outcome"])
    return out


def fail_server_restart(pre, dec, cfg, args, tmp, server, pool_of, say):
    """kvpoold restarts while the decode node waits: its MATCH is answered
    by the drain (WAIT_ENDED, nothing matched) or fails; either way it is a
    miss and the node computes everything. The next hand-off works again."""
    p = args.fail_tokens
    prompt = random_tokens(p, cfg.vocab, 902)
    f_ref, f_pd = os.path.join(tmp, "rs-ref.pt"), os.path.join(tmp, "rs.pt")
    ref = reference(dec, prompt, args.decode, f_ref)
    pool = pool_of()
    t_send = time.monotonic()
    dec.send(op="decode", tokens=prompt, wait_ms=args.wait_ms, decode=args.decode,
             logits_out=f_pd)
    deadline = time.monotonic() + 10
    while pool.stats()["ops"]["match"]["waits"]["waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    pool.close()
    t_stop = time.monotonic()
    rc = server.stop()
    server.start(server.port)
    t_up = time.monotonic()
    rd = dec.reply()
    diff = max_abs_diff(f_ref, f_pd)
    # the next hand-off, on the restarted server
    nxt = random_tokens(p, cfg.vocab, 903)
    _, rp2, rd2 = hand_off(pre, dec, nxt, args.chunk, args.wait_ms, args.decode,
                           os.path.join(tmp, "rs-next.pt"))
    out = dict(prompt_tokens=p, server_exit=rc, restart_s=t_up - t_stop,
               decode_answered_s=rd["t_match_done"] - t_send, waited_before_stop_s=t_stop - t_send,
               flags=rd["flag_names"], matched=rd["matched"], pool_error=rd["pool_error"],
               computed_tokens=rd["computed_tokens"], max_abs_diff=diff,
               tokens_equal=rd["tokens"] == ref["tokens"],
               next_handoff_ms=1e3 * (rd2["t_first"] - rp2["t_last_put_ack"]),
               next_loaded_blocks=rd2["loaded_blocks"], next_blocks=p // cfg.block_tokens)
    out["ok"] = (out["matched"] == 0 and out["computed_tokens"] == p and out["tokens_equal"]
                 and diff <= TOLERANCE and out["next_loaded_blocks"] == out["next_blocks"])
    how = ("its MATCH was answered by the drain %.2f s after the request (flags %s)"
           % (out["decode_answered_s"], "|".join(out["flags"]))
           if out["flags"] else "its MATCH failed (%s)" % out["pool_error"])
    out["outcome"] = ("kvpoold restarted (SIGTERM, exit %s, up again in %.2f s) while the decode "
                      "node waited: %s; a miss, so it computed all %d tokens, 16 tokens %s, "
                      "max|dlogit| %.1e; the next hand-off on the restarted server loaded %d of "
                      "%d blocks, hand-off %.1f ms"
                      % (rc, out["restart_s"], how, out["computed_tokens"],
                         "same" if out["tokens_equal"] else "DIFFER", diff,
                         out["next_loaded_blocks"], out["next_blocks"], out["next_handoff_ms"]))
    say("  3. " + out["outcome"])
    return out


# ---- report -------------------------------------------------------------------------

def table(rows):
    lines = ["| prompt | prefill (s) | hand-off (ms) | decode TTFT (s) | one node TTFT (s) | "
             "one decode step (ms) | KV moved (MB) | GET (GB/s) | max abs dlogit | 16 tokens |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append("| %d | %.3f | %.1f | %.3f | %.3f | %.1f | %.1f | %.2f | %.1e | %s |"
                     % (r["prompt_tokens"], r["prefill_s"], 1e3 * r["handoff_s"],
                        r["decode_ttft_s"], r["single_ttft_s"], 1e3 * r["decode_step_s"],
                        r["bytes_moved"] / 1e6, r["get_gbps"], r["max_abs_diff"],
                        "same" if r["tokens_equal"] else "DIFFER"))
    return "\n".join(lines)


def plot(rows, bench, path, title):
    """Left: the decode node's TTFT (prefill node's time + hand-off) next
    to one node's. Right: the hand-off in ms, split into the pool's part
    (the MATCH's wake-up and the GET) and the first token's computation,
    with 1.2 x (PUT + GET of the prompt's bytes at kvpool bench speed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    xs = list(range(len(rows)))
    labels = [str(r["prompt_tokens"]) for r in rows]
    pre = [r["prefill_s"] for r in rows]
    ho = [r["handoff_s"] for r in rows]
    ax.bar([x - 0.2 for x in xs], pre, 0.4, label="prefill node: request -> last PUT acked")
    ax.bar([x - 0.2 for x in xs], ho, 0.4, bottom=pre, label="hand-off (right)")
    ax.bar([x + 0.2 for x in xs], [r["single_ttft_s"] for r in rows], 0.4,
           label="one node doing both (no pool)", color="grey")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    pool = [1e3 * max(0.0, r["handoff_s"] - r["last_token_s"]) for r in rows]
    comp = [1e3 * r["last_token_s"] for r in rows]
    ax2.bar(xs, pool, 0.5, label="pool: MATCH wake-up + GET")
    ax2.bar(xs, comp, 0.5, bottom=pool, label="decode node computes the first token")
    if bench:
        per_byte = 1 / (bench["put_gbps"] * 1e9) + 1 / (bench["get_gbps"] * 1e9)
        ax2.plot(xs, [1.2e3 * r["blocks"] * (bench["bytes"] / max(1, rows_blocks(rows)))
                      * per_byte for r in rows], "k_", markersize=30, mew=2,
                 label="1.2 x (PUT + GET of the prompt at kvpool bench speed)")
    ax2.set_xticks(xs)
    ax2.set_xticklabels(labels)
    ax2.set_xlabel("prompt tokens")
    ax2.set_ylabel("hand-off (ms): last PUT acked -> first token")
    ax2.set_title("the hand-off, split", fontsize=9)
    ax2.legend(fontsize=8)
    ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows_blocks(rows):
    """Blocks of the prompt kvpool bench was sized for (the 4k one, else the last)."""
    four = [r for r in rows if r["prompt_tokens"] == 4096] or rows[-1:]
    return four[0]["blocks"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvpoold", required=True, help="the kvpoold binary")
    ap.add_argument("--kvpool-cli", required=True, help="the kvpool CLI (ping, bench)")
    ap.add_argument("--prompts", default="1024,2048,4096,8192", help="prompt lengths (tokens)")
    ap.add_argument("--chunk", type=int, default=1024,
                    help="prefill chunk (tokens); each chunk's blocks are PUT after it")
    ap.add_argument("--wait-ms", type=int, default=30000,
                    help="the decode node's MATCH wait bound (pd_wait_ms)")
    ap.add_argument("--decode", type=int, default=16, help="greedy tokens compared")
    ap.add_argument("--fail-tokens", type=int, default=1024, help="prompt of the failure cases")
    ap.add_argument("--fail-chunk", type=int, default=256,
                    help="prefill chunk in the killed-prefill case")
    ap.add_argument("--fail-wait-ms", type=int, default=2000,
                    help="decode wait bound in the killed-prefill case")
    ap.add_argument("--no-failures", action="store_true", help="skip the three failure cases")
    ap.add_argument("--bench-calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dram", default="1GiB", help="kvpoold dram_capacity")
    ap.add_argument("--json", default="pd.json")
    ap.add_argument("--png", default="pd.png")
    ap.add_argument("--server-log", default=os.path.join(tempfile.gettempdir(), "kvpoold-pd.log"))
    M.add_model_args(ap)
    args = ap.parse_args(argv)
    cfg = M.config_from_args(args)
    prompts = [int(x) for x in args.prompts.split(",") if x]
    if not prompts or min(prompts) < cfg.block_tokens or args.chunk % cfg.block_tokens \
            or args.fail_chunk % cfg.block_tokens:
        ap.error("--prompts must be >= block_tokens; --chunk and --fail-chunk multiples of it")
    say = lambda s: print(s, flush=True)  # noqa: E731

    import kvpool
    t_all = time.perf_counter()
    server = Server(args.kvpoold, args.kvpool_cli,
                    ["--dram-capacity", args.dram, "--threads", "2", "--log-level", "warn"],
                    args.server_log)
    server.start()
    pool_of = lambda: kvpool.Client(server.url, cfg.namespace())  # noqa: E731
    longest = max(prompts + [args.fail_tokens])
    blocks = (longest + args.decode) // cfg.block_tokens + 2
    pre = NodeProc("prefill", cfg, server.url, blocks, args.threads)
    dec = NodeProc("decode", cfg, server.url, blocks, args.threads)
    report = dict(config=cfg.as_dict(), namespace=cfg.namespace(), block_bytes=cfg.block_bytes,
                  kv_bytes_per_token=cfg.kv_bytes_per_token, chunk=args.chunk,
                  wait_ms=args.wait_ms, blas=pre.hello["blas"], torch_threads=pre.hello["threads"],
                  load_average_start=os.getloadavg()[0])
    say("== reference Llama decoder (examples/ttft): %d layers, hidden %d, %d/%d heads x %d, "
        "%s; KV %d B/token, blocks of %d tokens = %d B; prefill in chunks of %d tokens, each "
        "chunk's blocks PUT after it; the decode node's MATCH waits up to %d ms"
        % (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dtype,
           cfg.kv_bytes_per_token, cfg.block_tokens, cfg.block_bytes, args.chunk, args.wait_ms))
    say("   router, prefill node (pid %d), decode node (pid %d), kvpoold on %s; torch %d threads "
        "each, BLAS %s" % (pre.hello["pid"], dec.hello["pid"], server.url, pre.hello["threads"],
                           pre.hello["blas"]))
    rows, fails, ok = [], {}, True
    try:
        with tempfile.TemporaryDirectory(prefix="pd-") as tmp:
            pool = pool_of()
            for n in (pre, dec):       # warm-up: weights and buffers touched once
                n.send(op="local", tokens=random_tokens(64, cfg.vocab, 3), decode=2)
                n.reply()
            say("== hand-off at %s-token prompts (router -> both nodes at once)"
                % "/".join(str(p) for p in prompts))
            for i, p in enumerate(prompts):
                rows.append(measure(pre, dec, cfg, p, args, tmp, pool, say, 10 + i))
            report["sweep"] = rows
            four = [r for r in rows if r["prompt_tokens"] == 4096] or rows[-1:]
            ref_row = four[0]
            say("== kvpool bench PUT and GET of %d-byte blocks, %d per call (the %d-token "
                "prompt's), twice" % (cfg.block_bytes, ref_row["blocks"], ref_row["prompt_tokens"]))
            benches = [c_bench(args.kvpool_cli, server.url, cfg.block_bytes, ref_row["blocks"],
                               args.bench_calls) for _ in range(2)]
            put_gbps = median([b["put_gbps"] for b in benches])
            get_gbps = median([b["get_gbps"] for b in benches])
            nbytes = ref_row["blocks"] * cfg.block_bytes
            pool_s = nbytes / (put_gbps * 1e9) + nbytes / (get_gbps * 1e9)
            report["bench"] = dict(command=benches[0]["command"], put_gbps=put_gbps,
                                   get_gbps=get_gbps, samples=benches, bytes=nbytes,
                                   put_plus_get_s=pool_s)
            moved = max(0.0, ref_row["handoff_s"] - ref_row["last_token_s"])
            report["target_handoff"] = dict(
                prompt_tokens=ref_row["prompt_tokens"], handoff_s=ref_row["handoff_s"],
                bound_s=1.2 * pool_s, met=ref_row["handoff_s"] <= 1.2 * pool_s,
                wake_plus_get_s=moved, wake_plus_get_met=moved <= 1.2 * pool_s,
                first_token_compute_s=ref_row["last_token_s"])
            say("  PUT %.2f GB/s, GET %.2f GB/s: moving the %d-token prompt's %.1f MB through "
                "the pool takes %.1f ms" % (put_gbps, get_gbps, ref_row["prompt_tokens"],
                                            nbytes / 1e6, 1e3 * pool_s))
            pool.drop_namespace()
            if not args.no_failures:
                say("== failures (%d-token prompts)" % args.fail_tokens)
                fails["prefill_killed"] = fail_prefill_killed(pre, dec, cfg, args, tmp, say)
                pool.drop_namespace()
                fails["decode_absent"] = fail_decode_absent(pre, dec, cfg, args, tmp, pool, say)
                pool.drop_namespace()
                pool.close()
                fails["server_restart"] = fail_server_restart(pre, dec, cfg, args, tmp, server,
                                                              pool_of, say)
                report["failures"] = fails
                ok = all(f["ok"] for f in fails.values())
    finally:
        pre.close()
        dec.close()
        server.stop()
    report["target_no_idle_gap"] = all(r["no_idle_gap"] for r in rows)
    report["one_match_per_request"] = all(r["match_requests"] == 1 for r in rows)
    report["elapsed_s"] = time.perf_counter() - t_all
    report["load_average_end"] = os.getloadavg()[0]
    th = report["target_handoff"]
    say("")
    say("== prefill -> decode through kvpool, measured on this machine (%d CPUs, load average "
        "%.1f at the start, %.1f at the end: other work shares them)"
        % (os.cpu_count() or 0, report["load_average_start"], report["load_average_end"]))
    say(table(rows))
    say("target: hand-off at %d tokens <= 1.2 x (PUT + GET of its %.1f MB at kvpool bench speed "
        "= %.1f ms) = %.1f ms: %.1f ms (%s); of it, the pool's part (wake-up + GET) %.1f ms "
        "(%s), the rest the decode node computing the first token (%.1f ms, one decode step)"
        % (th["prompt_tokens"], report["bench"]["bytes"] / 1e6,
           1e3 * report["bench"]["put_plus_get_s"], 1e3 * th["bound_s"], 1e3 * th["handoff_s"],
           "met" if th["met"] else "NOT met", 1e3 * th["wake_plus_get_s"],
           "within the bound" if th["wake_plus_get_met"] else "over the bound",
           1e3 * th["first_token_compute_s"]))
    say("target: decode TTFT <= prefill + hand-off + one decode step at every length: %s"
        % ("met" if report["target_no_idle_gap"] else "NOT met"))
    say("one MATCH per decode request (the server's MATCH count): %s"
        % ("yes" if report["one_match_per_request"] else
           "NO: %s" % [r["match_requests"] for r in rows]))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    plot(rows, report.get("bench"), args.png, "prefill -> decode through kvpool: reference "
         "Llama (%d layers, hidden %d), CPU, loopback" % (cfg.layers, cfg.hidden))
    say("wrote %s and %s (%.0f s in all)" % (args.json, args.png, report["elapsed_s"]))
    ok = ok and all(r["tokens_equal"] and r["max_abs_diff"] <= TOLERANCE
                    and r["loaded_blocks"] == r["blocks"] for r in rows) \
        and report["one_match_per_request"]
    if not ok:
        say("CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
