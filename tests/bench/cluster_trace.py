#!/usr/bin/env python3
"""Several kvpoold nodes against one on request traces, in the same run.

Where tests/bench/placement_sim.py simulates placements, this replays the
traces against real kvpoold processes on loopback through libkvpool's
cluster backend (the Python binding), the way an engine drives the pool:
per request MATCH the chain (lease 2 s), GET the matched run (every byte
checked: payloads are derived from the keys), PUT the rest. Keys are
chained as `kvpool replay` chains them (key_0 = SHA-256(id_0 LE64),
key_i = SHA-256(key_{i-1} || id_i LE64)).

Traces: the bundled Mooncake trace as it is, and derived from it at run
time (nothing stored) with every request prefixed by a shared system
prompt of P blocks (--prompt-blocks: 1, and 40 - a hot prefix longer than
the 32-block segments of the old placement); any --trace FILE in the same
format (e.g. the GMI chat trace, which is not shipped).

For each trace (D distinct blocks, --block-bytes each):

  30%     one node of 0.3 D blocks, then three nodes of 0.1 D each (fresh
          processes, a node list): one pass from empty each. Hit ratio,
          and per node its share of block operations (MATCH keys + GET +
          PUT blocks) and of bytes (GET + PUT payload); the busiest node's
          bytes against the mean.
  110%    three nodes of 0.367 D each registered in etcd (fixed names),
          one long-lived client (the one whose handle sees the changes):
          fill pass, warm pass (one node of 1.1 D hits 1.0000 here), then
    slow    a node stopped (SIGSTOP) for a whole pass, through a second
            client with the default 200 ms budget: the pass's hit ratio,
            per-call p50/p99/max latency against the warm pass of the same
            client just before; after SIGCONT (and its back-off) the next
            pass's hit ratio
    join    a fourth node of the same size joins: MATCH-only passes by
            clients connected after the change, without a fallback
            (fallback_ms=0) and with one (the records' ages tell them the
            fourth node is new; fallback_ms is set between the ages, as if
            the pool had been up longer than the default 600 s), then the
            long-lived client's pass (fallback to previous owners,
            background copies), and the pass after it
    loss    a node SIGKILLed: the next pass, then the refill pass

Figures are printed one line per scenario (and --json). Not part of `make test`; the
tests (tests/integration/test_cluster_place.c) check the thresholds.

Usage:
  tests/bench/cluster_trace.py [--trace FILE ...] [--prompt-blocks 0,1,40]
      [--block-bytes 4096] [--limit N] [--scenarios 30,110] [--json]
  KVPOOL_LIB=/path/libkvpool.so picks another client library (e.g. an
  older build, for a placement baseline with the same servers).
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import kvpool  # noqa: E402

PROMPT_BASE = 0xFFFFFFFF00000000  # ids no bundled request uses (they are small)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_trace(path, prompt_blocks, limit):
    """Chains of keys (bytes), in timestamp order, and the distinct count."""
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            reqs.append((r.get("timestamp", n), n, r["hash_ids"]))
    reqs.sort()
    if limit:
        reqs = reqs[:limit]
    prompt = [PROMPT_BASE + j for j in range(prompt_blocks)]
    chains, seen = [], set()
    for _, _, ids in reqs:
        keys, prev = [], b""
        for i in prompt + list(ids):
            prev = hashlib.sha256(prev + struct.pack("<Q", i)).digest()
            keys.append(prev)
        chains.append(keys)
        seen.update(keys)
    return chains, len(seen)


def payload(key, bb):
    return (key * (bb // 32 + 1))[:bb]


class Pass:
    def __init__(self):
        self.refs = self.hits = self.wrong = self.errors = 0
        self.lat = {"match": [], "get": [], "put": []}

    def ratio(self):
        return self.hits / self.refs if self.refs else 0.0

    def q(self, op, p):
        v = sorted(self.lat[op])
        if not v:
            return float("nan")
        return v[min(len(v) - 1, int(p * len(v)))] * 1e3  # ms


def run_pass(cl, chains, bb, match_only=False):
    p = Pass()
    for keys in chains:
        p.refs += len(keys)
        t = time.perf_counter()
        try:
            m = cl.match(keys, lease_ms=0 if match_only else 2000)
        except kvpool.Error as e:
            p.errors += 1
            print("  match failed: %s" % e, file=sys.stderr)
            continue
        p.lat["match"].append(time.perf_counter() - t)
        if match_only:
            p.hits += m
            continue
        frm = m
        if m:
            t = time.perf_counter()
            try:
                got = cl.get_many(keys[:m])
            except kvpool.Error as e:
                p.errors += 1
                print("  get failed: %s" % e, file=sys.stderr)
                got = [-1] * m
            p.lat["get"].append(time.perf_counter() - t)
            for i, g in enumerate(got):
                if isinstance(g, int):
                    frm = i
                    break
                if g != payload(keys[i], bb):
                    p.wrong += 1
                    frm = i
                    break
                p.hits += 1
        if frm < len(keys):
            t = time.perf_counter()
            try:
                cl.put_chain(keys[frm:], [payload(k, bb) for k in keys[frm:]],
                             parent=keys[frm - 1] if frm else None)
            except kvpool.Error as e:
                p.errors += 1
                print("  put failed: %s" % e, file=sys.stderr)
            p.lat["put"].append(time.perf_counter() - t)
    return p


class Node:
    def __init__(self, build, capacity, tmp, cluster=None, name=None):
        self.port = free_port()
        self.capacity = capacity
        self.cluster, self.name = cluster, name
        self.log = open(os.path.join(tmp, "kvpoold-%d.log" % self.port), "w")
        self.argv = [os.path.join(build, "kvpoold"), "--listen", "127.0.0.1", "--port",
                     str(self.port), "--admin-port", "0", "--rdma-port", "0", "--threads", "1",
                     "--max-block-bytes", "1MiB", "--dram-capacity", str(capacity),
                     "--log-level", "error"]
        if cluster:
            self.argv += ["--cluster", cluster, "--node-name", name, "--cluster-lease-s", "2"]
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=self.log)
        self.url = "tcp://127.0.0.1:%d" % self.port
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("kvpoold on port %d did not start" % self.port)

    def stats(self):
        with kvpool.Client(self.url, "bench") as c:
            return c.stats()

    def moved(self):
        """(block operations, bytes) this node served."""
        o = self.stats()["ops"]
        ops = (o["match"]["blocks_queried"] + o["get"]["hits"] + o["get"]["misses"]
               + o["put"]["blocks"])
        return ops, o["put"]["bytes"] + o["get"]["bytes"]

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Etcd:
    def __init__(self, tmp):
        self.port, peer = free_port(), free_port()
        self.dir = tempfile.mkdtemp(prefix="etcd-", dir=tmp)
        lc, lp = "http://127.0.0.1:%d" % self.port, "http://127.0.0.1:%d" % peer
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", lc, "--advertise-client-urls", lc,
             "--listen-peer-urls", lp, "--initial-advertise-peer-urls", lp,
             "--initial-cluster", "bench=" + lp, "--log-level", "error"],
            stdout=self.log, stderr=self.log)
        for _ in range(150):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2):
                    time.sleep(0.3)
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def cluster_info(cl):
    return cl.stats().get("cluster", {})


def wait_members(cl, n, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        nodes = cluster_info(cl).get("nodes", [])
        if len([x for x in nodes if x.get("state", "up") == "up"]) == n:
            return True
        time.sleep(0.1)
    return False


def shares(nodes):
    moved = [n.moved() for n in nodes]
    ops = [m[0] for m in moved]
    byt = [m[1] for m in moved]
    so, sb = sum(ops) or 1, sum(byt) or 1
    return ([o / so for o in ops], [b / sb for b in byt],
            max(byt) * len(byt) / sb if sb else 0.0)


def scenario_30(build, tmp, chains, distinct, bb, budget):
    cap = int(0.3 * distinct) * bb
    out = {}
    one = Node(build, cap, tmp)
    try:
        with kvpool.Client(one.url, "bench") as cl:
            p1 = run_pass(cl, chains, bb)
    finally:
        one.stop()
    three = [Node(build, cap // 3, tmp) for _ in range(3)]
    try:
        url = "tcp://" + ",".join("127.0.0.1:%d" % n.port for n in three)
        with kvpool.Client(url + "?budget_ms=%d" % budget, "bench") as cl:
            p3 = run_pass(cl, chains, bb)
            expired = cluster_info(cl).get("budget_expired", 0)
        ops, byt, busiest = shares(three)
    finally:
        for n in three:
            n.stop()
    out.update(one_node=p1.ratio(), three_nodes=p3.ratio(), ops_share=ops, bytes_share=byt,
               busiest_bytes=busiest, wrong=p1.wrong + p3.wrong, errors=p1.errors + p3.errors,
               budget_expired=expired,
               match_p50_ms=(p1.q("match", 0.5), p3.q("match", 0.5)))
    return out


def scenario_110(build, tmp, chains, distinct, bb, budget):
    cap = int(1.1 * distinct / 3) * bb
    out = {"wrong": 0, "errors": 0}
    etcd = Etcd(tmp)
    url = "etcd://127.0.0.1:%d/bench" % etcd.port
    t_pool = time.time()
    nodes = [Node(build, cap, tmp, url, "n%d" % i) for i in range(3)]

    def tally(p):
        out["wrong"] += p.wrong
        out["errors"] += p.errors
        return p

    try:
        cl = kvpool.Client(url + "?budget_ms=%d" % budget, "bench")
        if not wait_members(cl, 3):
            raise RuntimeError("the client did not see three nodes")
        tally(run_pass(cl, chains, bb))
        out["warm"] = tally(run_pass(cl, chains, bb)).ratio()

        # a slow node, through a client with the default budget
        slow_cl = kvpool.Client(url, "bench")
        wait_members(slow_cl, 3)
        base = tally(run_pass(slow_cl, chains, bb))
        victim = nodes[1]
        victim.signal(signal.SIGSTOP)
        t = time.time()
        stopped = tally(run_pass(slow_cl, chains, bb))
        stopped_s = time.time() - t
        victim.signal(signal.SIGCONT)
        time.sleep(2.5)  # past the back-off: a probe finds it again
        after = tally(run_pass(slow_cl, chains, bb))
        ci = cluster_info(slow_cl)
        out["slow"] = {
            "base": base.ratio(), "stopped": stopped.ratio(), "after": after.ratio(),
            "stopped_pass_s": stopped_s,
            "lat_ms": {op: {"base": (base.q(op, 0.5), base.q(op, 0.99), base.q(op, 1.0)),
                            "stopped": (stopped.q(op, 0.5), stopped.q(op, 0.99),
                                        stopped.q(op, 1.0))}
                       for op in ("match", "get", "put")},
            "budget_expired": ci.get("budget_expired", 0),
        }
        slow_cl.close()
        # the stopped pass's misses were put again (on the next node by
        # score): warm the long-lived client's view again
        out["warm_again"] = tally(run_pass(cl, chains, bb)).ratio()

        # a fourth node joins
        t_join = time.time()
        nodes.append(Node(build, cap, tmp, url, "n3"))
        if not wait_members(cl, 4):
            raise RuntimeError("the client did not see the fourth node")
        # A process that connects now has not seen the join; it tells new
        # members by their registration age against fallback_ms (600 s by
        # default). These nodes are seconds old, so fallback_ms is set
        # between the ages of the three and of the fourth: as if the pool
        # had been up longer than fallback_ms when the fourth joined.
        now = time.time()
        fb_ms = int(((now - t_pool) + (now - t_join)) / 2 * 1000)
        out["join_fresh_fallback_ms"] = fb_ms
        with kvpool.Client(url + "?budget_ms=%d&fallback_ms=0" % budget, "bench") as fresh:
            wait_members(fresh, 4)
            out["join_fresh_nofallback"] = tally(run_pass(fresh, chains, bb,
                                                          match_only=True)).ratio()
        with kvpool.Client(url + "?budget_ms=%d&fallback_ms=%d" % (budget, fb_ms),
                           "bench") as fresh:
            wait_members(fresh, 4)
            out["join_fresh_match"] = tally(run_pass(fresh, chains, bb, match_only=True)).ratio()
        before = cluster_info(cl)
        out["join"] = tally(run_pass(cl, chains, bb)).ratio()
        time.sleep(0.5)
        out["join_next"] = tally(run_pass(cl, chains, bb)).ratio()
        ci = cluster_info(cl)
        out["join_fallback_hits"] = ci.get("fallback_hits", 0) - before.get("fallback_hits", 0)
        out["join_copies"] = ci.get("copies", 0) - before.get("copies", 0)

        # a node lost (SIGKILL), four -> three
        nodes[0].signal(signal.SIGKILL)
        nodes[0].proc.wait()
        out["loss"] = tally(run_pass(cl, chains, bb)).ratio()
        out["refill"] = tally(run_pass(cl, chains, bb)).ratio()
        ci = cluster_info(cl)
        out["redirected_puts"] = ci.get("redirected_puts", 0)
        cl.close()
    finally:
        for n in nodes:
            n.stop()
        etcd.stop()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--prompt-blocks", default="0,1,40",
                    help="shared prompt lengths derived from the bundled trace")
    ap.add_argument("--block-bytes", type=int, default=4096)
    ap.add_argument("--limit", type=int, default=0, help="first N requests of each trace")
    ap.add_argument("--scenarios", default="30,110")
    ap.add_argument("--budget-ms", type=int, default=2000,
                    help="budget of the clients that measure hit ratios (the slow-node "
                    "client keeps the default 200 ms)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if shutil.which("etcd") is None and "110" in a.scenarios:
        sys.exit("etcd is not installed (apt-get install etcd-server)")
    runs = []
    bundled = os.path.join(ROOT, "tests", "data", "synthetic_trace.jsonl")
    for pb in [int(x) for x in a.prompt_blocks.split(",") if x != ""]:
        name = "Mooncake" + (" + shared %d-block prompt" % pb if pb else "")
        runs.append((name, bundled, pb))
    for t in a.trace:
        runs.append((os.path.basename(t), t, 0))
    results = []
    tmp = tempfile.mkdtemp(prefix="kvpool-cluster-bench-")
    print("load %s, nproc %d, library %s" % (open("/proc/loadavg").read().split()[0],
                                             os.cpu_count(), os.environ.get("KVPOOL_LIB", "tree")))
    try:
        for name, path, pb in runs:
            chains, distinct = load_trace(path, pb, a.limit)
            refs = sum(len(c) for c in chains)
            r = {"trace": name, "requests": len(chains), "distinct": distinct, "refs": refs}
            print("\n## %s: %d requests, %d distinct blocks, %d block refs, %d B blocks"
                  % (name, len(chains), distinct, refs, a.block_bytes), flush=True)
            if "30" in a.scenarios.split(","):
                s = scenario_30(a.build, tmp, chains, distinct, a.block_bytes, a.budget_ms)
                r["30"] = s
                print("30%% of the working set: hit ratio one node %.4f, three nodes %.4f "
                      "(%+.4f); block ops per node %s; bytes per node %s, busiest %.2fx the "
                      "mean; MATCH p50 %.2f / %.2f ms; wrong %d, failed calls %d, budget "
                      "expired %d" % (s["one_node"], s["three_nodes"],
                                      s["three_nodes"] - s["one_node"],
                                      "/".join("%.2f" % x for x in s["ops_share"]),
                                      "/".join("%.2f" % x for x in s["bytes_share"]),
                                      s["busiest_bytes"], s["match_p50_ms"][0],
                                      s["match_p50_ms"][1], s["wrong"], s["errors"],
                                      s["budget_expired"]), flush=True)
            if "110" in a.scenarios.split(","):
                s = scenario_110(a.build, tmp, chains, distinct, a.block_bytes, a.budget_ms)
                r["110"] = s
                sl = s["slow"]
                print("110%%, three nodes: warm pass %.4f (one node of the same total: "
                      "1.0000)" % s["warm"])
                print("  slow node (SIGSTOP for a pass, 200 ms budget): hit ratio %.4f -> "
                      "%.4f while stopped (pass %.1f s), %.4f after SIGCONT; budget expired "
                      "%d" % (sl["base"], sl["stopped"], sl["stopped_pass_s"], sl["after"],
                              sl["budget_expired"]))
                for op in ("match", "get", "put"):
                    b, st = sl["lat_ms"][op]["base"], sl["lat_ms"][op]["stopped"]
                    print("    %-5s p50/p99/max ms: healthy %.2f / %.2f / %.1f, one node "
                          "stopped %.2f / %.2f / %.1f" % ((op,) + b + st))
                print("  join (3 -> 4): a client connected after it, MATCH-only pass %.4f "
                      "without a fallback, %.4f with one (fallback_ms %d); the warm client's "
                      "pass %.4f (before: %.4f), then %.4f; fallback hits %d, copies %d"
                      % (s["join_fresh_nofallback"], s["join_fresh_match"],
                         s["join_fresh_fallback_ms"], s["join"],
                         s["warm_again"],
                                     s["join_next"], s["join_fallback_hits"],
                                     s["join_copies"]))
                print("  loss (SIGKILL, 4 -> 3): next pass %.4f, refill pass %.4f; "
                      "redirected puts %d; wrong %d, failed calls %d"
                      % (s["loss"], s["refill"], s["redirected_puts"], s["wrong"],
                         s["errors"]), flush=True)
            results.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps(results))
    bad = sum(r.get(k, {}).get("wrong", 0) for r in results for k in ("30", "110"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
