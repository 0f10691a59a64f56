#!/usr/bin/env python3
"""Simulate block placements of a kvpool cluster on request traces.

Replays JSON Lines traces with per-block hash ids (the Mooncake format that
`kvpool replay` reads) the way an engine drives the pool - MATCH the
prompt's chain, GET the matched run, PUT the rest - against several nodes
whose capacities add up to one node's, and against that one node. Keys are
chained as `kvpool replay` chains them (key_0 = SHA-256(id_0 LE64),
key_i = SHA-256(key_{i-1} || id_i LE64)), so the rendezvous scores are
those of the real keys (kvpool.placement, the twin of client/lib/hrw.c).

Each node is what kvpoold's DRAM store does, per block of equal size:
eviction takes the least recently used block that has no child stored on
the same node (chain-tail first); MATCH touches the leading run of the keys
it was asked, GET touches what it returns, a PUT of a stored key answers
EXISTS without touching it, and a PUT whose parent must be on the node but
is not answers ENOLINK (not stored). A MATCH sent to one node gets that
node's leading run over its keys of the chain, so past a node's first
missing key the client learns nothing from it: the chain's match is the
first position whose node says missing. Keys that may be missing at one
node while present at another (hot blocks asked at every replica, keys
whose owners changed asked at the new and the previous owners) go to each
of those nodes in a second MATCH of the same round, so a gap among them
does not hide the node's other keys; a block found at one node and known
missing at one of its owners is copied there (the background copy).

Placements:
  seg D          segments of D blocks placed by their first block's key;
                 a segment's first block stored as a root, the rest under
                 their parents (today's cluster client, D = 32)
  block          every block on the first node of its own key's ranking,
                 stored as a root on its node
  block-link     the same, but a block whose parent's owner is the same
                 node is stored under its parent (tail-first eviction
                 inside runs that happen to share a node)
  hotpos H       block, plus blocks at chain positions < H on the first R
                 nodes of their ranking; each request reads them from one
                 of the R (rotating per request)
  hotkids C      block, plus blocks that already have >= C distinct
                 children on R nodes
  hotbranch C    block, plus every block at or above a block that has
                 >= C distinct children (the whole shared prefix, e.g. all
                 blocks of a system prompt) on R nodes
                 (hotkids and hotbranch count the children seen in the
                 trace so far: what one client seeing every request
                 learns from its MATCHes)

Scenarios, three nodes n0..n2 (a fourth, n3, joins):
  30%            one pass from empty, total capacity 30% of the distinct
                 blocks (the working set): hit ratio, and per node the
                 block operations (MATCH keys + GET + PUT blocks), the
                 calls and the bytes (GET + PUT payload) moved
  100%           capacity = the working set: the second pass's hit ratio
                 (one node hits everything)
  loss           after the 100% passes a node is lost (each of the three
                 in turn; the mean is printed): the next pass's hit ratio
                 and the one after it (refill)
  join           after the 100% passes n3 joins (same capacity as each):
                 the next pass without and with the previous-owner
                 fallback (keys whose owners changed are asked at their new
                 and previous owners; a block found at a previous owner is
                 a hit and is copied to the new one)
  stranded       after the 30% pass: the share of stored block copies
                 that no MATCH can reach (an ancestor is missing)
  hot            the share of distinct blocks that are hot after it

Usage:
  tests/bench/placement_sim.py [--trace PATH ...] [--system-prompt-blocks N ...]
      [--placements seg32,seg8,...] [--json]
By default: the bundled Mooncake trace as it is and with every request
prefixed by a shared system prompt of 1 and of 4 blocks.
"""

import argparse
import hashlib
import heapq
import json
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _load_placement():
    """kvpool/placement.py by path: pure Python, no libkvpool needed."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "kvpool_placement", os.path.join(ROOT, "client", "python", "kvpool", "placement.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


placement = _load_placement()

NODE_NAMES = ["n0", "n1", "n2", "n3"]
SYSTEM_PROMPT_ID0 = 0xFFFFFFFF00000000  # ids of the shared blocks: outside both traces' ranges
HOT_REPLICAS = 2


# ---- the trace ----------------------------------------------------------------

class Trace:
    """Chains of interned block ids; per id: parent id (-1), position, and
    the ranking of the four node names for its key."""

    def __init__(self, path, system_prompt_blocks=0, limit=0):
        reqs = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f):
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                reqs.append((float(r["timestamp"]), n, [int(x) for x in r["hash_ids"]]))
        reqs.sort()
        if limit:
            reqs = reqs[:limit]
        prefix = [SYSTEM_PROMPT_ID0 + j for j in range(system_prompt_blocks)]
        ids_of = {}
        self.parent, self.pos, self.rank = [], [], []
        ranker = placement.Ranker(NODE_NAMES)
        self.chains = []
        for _, _, hid in reqs:
            key = b""
            chain = []
            for i, h in enumerate(prefix + hid):
                key = hashlib.sha256(key + struct.pack("<Q", h)).digest()
                k = ids_of.get(key)
                if k is None:
                    k = len(self.parent)
                    ids_of[key] = k
                    self.parent.append(chain[-1] if chain else -1)
                    self.pos.append(i)
                    self.rank.append(tuple(ranker.ranked(key)))
                chain.append(k)
            self.chains.append(chain)
        self.distinct = len(self.parent)
        self.refs = sum(len(c) for c in self.chains)
        self._seg = {}

    def seg_start(self, D):
        """Per id: the id of the first block of its segment of D."""
        if D not in self._seg:
            s = [0] * self.distinct
            for k in range(self.distinct):
                j = k
                for _ in range(self.pos[k] % D):
                    j = self.parent[j]
                s[k] = j
            self._seg[D] = s
        return self._seg[D]


# ---- one node: kvpoold's DRAM store, in blocks ---------------------------------

class Node:
    __slots__ = ("cap", "t", "kids", "par", "heap")

    def __init__(self, cap):
        self.cap = cap
        self.t = {}       # stored id -> last use
        self.kids = {}    # id -> children stored under it on this node (> 0 only)
        self.par = {}     # id -> the parent it is stored under here
        self.heap = []    # (last use, id), stale entries skipped

    def copy(self):
        n = Node(self.cap)
        n.t = dict(self.t)
        n.kids = dict(self.kids)
        n.par = dict(self.par)
        n.heap = list(self.heap)
        return n

    def touch(self, k, clock):
        self.t[k] = clock
        if k not in self.kids:
            heapq.heappush(self.heap, (clock, k))

    def _evict(self):
        h, t, kids = self.heap, self.t, self.kids
        while h:
            ts, k = heapq.heappop(h)
            if t.get(k) != ts or k in kids:
                continue
            del t[k]
            p = self.par.pop(k, None)
            if p is not None:
                kids[p] -= 1
                if not kids[p]:
                    del kids[p]
                    heapq.heappush(h, (t[p], p))
            return True
        return False

    def insert(self, k, parent, clock):
        """Store k (under parent when not None). False: ENOLINK or full."""
        if parent is not None and parent not in self.t:
            return False
        while len(self.t) >= self.cap:
            if not self._evict():
                return False
        if parent is not None and parent not in self.t:
            return False  # the parent itself was the victim
        self.t[k] = clock
        if parent is not None:
            self.par[k] = parent
            self.kids[parent] = self.kids.get(parent, 0) + 1
        heapq.heappush(self.heap, (clock, k))
        if len(self.heap) > 4 * len(self.t) + 4096:
            self.heap = [(ts, x) for x, ts in self.t.items() if x not in self.kids]
            heapq.heapify(self.heap)
        return True


# ---- placements ---------------------------------------------------------------

class Placement:
    """owners(k, live, kids_seen) -> node indices that hold k (best first);
    link(k, node) -> the parent id k is stored under on node, or None."""
    hot_any = False
    hot_branch = 0

    def __init__(self, name, tr):
        self.name, self.tr = name, tr

    def first(self, rank, live, count=1):
        out = [n for n in rank if n in live]
        return out[:count]

    def link(self, k, node, live, kids_seen):
        return None


class Seg(Placement):
    def __init__(self, tr, D):
        super().__init__("seg %d" % D, tr)
        self.D, self.start = D, tr.seg_start(D)

    def owners(self, k, live, kids_seen):
        return self.first(self.tr.rank[self.start[k]], live)

    def link(self, k, node, live, kids_seen):
        return None if self.tr.pos[k] % self.D == 0 else self.tr.parent[k]


class Block(Placement):
    def __init__(self, tr, name="block", hot_positions=0, hot_kids=0, link=False, hot_any=True,
                 hot_branch=0):
        super().__init__(name, tr)
        self.hot_positions, self.hot_kids, self.do_link = hot_positions, hot_kids, link
        self.hot_any, self.hot_branch = hot_any, hot_branch

    def replicas(self, k, kids_seen):
        if self.tr.pos[k] < self.hot_positions:
            return HOT_REPLICAS
        if self.hot_kids and kids_seen.get(k, 0) >= self.hot_kids:
            return HOT_REPLICAS
        if self.hot_branch and k in kids_seen.hot:
            return HOT_REPLICAS
        return 1

    def owners(self, k, live, kids_seen):
        return self.first(self.tr.rank[k], live, self.replicas(k, kids_seen))

    def link(self, k, node, live, kids_seen):
        p = self.tr.parent[k]
        if not self.do_link or p < 0:
            return None
        return p if node in self.owners(p, live, kids_seen) else None


def make_placements(tr, which):
    out = []
    for w in which:
        if w.startswith("seg"):
            out.append(Seg(tr, int(w[3:])))
        elif w == "block":
            out.append(Block(tr))
        elif w == "block-link":
            out.append(Block(tr, "block-link", link=True))
        elif w.startswith("hotpos") and w.endswith("one"):
            out.append(Block(tr, "block, hot pos<%s x%d, read one" % (w[6:-3], HOT_REPLICAS),
                             hot_positions=int(w[6:-3]), hot_any=False))
        elif w.startswith("hotpos"):
            out.append(Block(tr, "block, hot pos<%s x%d" % (w[6:], HOT_REPLICAS),
                             hot_positions=int(w[6:])))
        elif w.startswith("hotbranch"):
            out.append(Block(tr, "block, hot branch>=%s x%d" % (w[9:], HOT_REPLICAS),
                             hot_branch=int(w[9:])))
        elif w.startswith("hotkids"):
            out.append(Block(tr, "block, hot kids>=%s x%d" % (w[7:], HOT_REPLICAS),
                             hot_kids=int(w[7:])))
        else:
            raise SystemExit("unknown placement %r" % w)
    return out


# ---- the pool --------------------------------------------------------------------

class KidsSeen(dict):
    """id -> distinct children seen so far; .hot: ids at or above a block
    with >= branch children (the chain up to every branching point)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.hot = set()

    def copy(self):
        c = KidsSeen(self)
        c.hot = set(self.hot)
        return c


class Pool:
    def __init__(self, pl, caps, live):
        self.pl, self.tr = pl, pl.tr
        self.nodes = {i: Node(c) for i, c in caps.items()}
        self.live = set(live)
        self.prev_live = None        # the membership before a change (fallback epoch)
        self.clock = 0
        self.kids_seen = KidsSeen()  # id -> distinct children seen (the hot oracles)
        self.seen = set()
        self.reset_counters()

    def copy(self):
        p = Pool.__new__(Pool)
        p.pl, p.tr = self.pl, self.tr
        p.nodes = {i: n.copy() for i, n in self.nodes.items()}
        p.live, p.prev_live, p.clock = set(self.live), self.prev_live, self.clock
        p.kids_seen, p.seen = self.kids_seen.copy(), set(self.seen)
        p.reset_counters()
        return p

    def reset_counters(self):
        self.hits = self.refs = self.copies = self.enolink = 0
        self.ops = {i: 0 for i in range(len(NODE_NAMES))}
        self.calls = dict(self.ops)
        self.bytes = dict(self.ops)

    def tick(self):
        self.clock += 1
        return self.clock

    def request(self, r, chain):
        tr, pl, nodes, live, ks = self.tr, self.pl, self.nodes, self.live, self.kids_seen
        L = len(chain)
        self.refs += L
        own = [pl.owners(k, live, ks) for k in chain]
        read = [o[r % len(o)] for o in own]  # a hot block: one replica per request
        prev = None
        if self.prev_live is not None:
            prev = [pl.owners(k, self.prev_live, ks) for k in chain]
        # MATCH: each node gets the keys only it holds (in chain order) in
        # one request, and the keys that may be elsewhere as well - hot
        # blocks (every replica is asked) and, in a fallback epoch, blocks
        # whose owners changed (asked at the new and the previous owners) -
        # in a second request of the same round, so a replica or an owner
        # that lacks one of those does not hide the rest of its answer.
        # Each request is answered with its leading run, touched; a key is
        # known present where a run covers it.
        amb = [None] * L
        lists = {}
        for p, k in enumerate(chain):
            o = own[p]
            if prev is not None and set(prev[p]) != set(o):
                amb[p] = list(o) + [x for x in prev[p] if x in live and x not in o]
            elif len(o) > 1:
                amb[p] = list(o)
            if amb[p] is None:
                lists.setdefault(o[0], ([], []))[0].append(p)
            else:
                for x in amb[p]:
                    lists.setdefault(x, ([], []))[1].append(p)
        covered = [[] for _ in range(L)]
        missing_at = [[] for _ in range(L)]
        for n, parts in lists.items():
            node = nodes[n]
            for part in parts:
                if not part:
                    continue
                self.calls[n] += 1
                self.ops[n] += len(part)
                for p in part:
                    k = chain[p]
                    if k not in node.t:
                        missing_at[p].append(n)
                        break
                    node.touch(k, self.tick())
                    covered[p].append(n)
        where = [None] * L
        m = L
        for p in range(L):
            c = covered[p]
            if not c:
                m = p
                break
            where[p] = read[p] if read[p] in c else c[0]
        # GET the matched run (from where each block was found); a block
        # found away from one of its owners, known to be missing there, is
        # copied to it now (the background copy).
        got = set()
        for p in range(m):
            n, k = where[p], chain[p]
            nodes[n].touch(k, self.tick())
            self.ops[n] += 1
            self.bytes[n] += 1
            got.add(n)
            for o in missing_at[p]:
                if o in own[p] and k not in nodes[o].t:
                    self.copies += 1
                    nodes[o].insert(k, pl.link(k, o, live, ks), self.tick())
        for n in got:
            self.calls[n] += 1
        self.hits += m
        # PUT the rest to every owner.
        put = set()
        for p in range(m, L):
            k = chain[p]
            for o in own[p]:
                self.ops[o] += 1
                self.bytes[o] += 1
                put.add(o)
                if k in nodes[o].t:
                    continue  # EXISTS
                if not nodes[o].insert(k, pl.link(k, o, live, ks), self.tick()):
                    self.enolink += 1
        for n in put:
            self.calls[n] += 1
        for k in chain:
            if k not in self.seen:
                self.seen.add(k)
                pk = tr.parent[k]
                if pk >= 0:
                    ks[pk] = ks.get(pk, 0) + 1
                    if pl.hot_branch and ks[pk] >= pl.hot_branch:
                        while pk >= 0 and pk not in ks.hot:
                            ks.hot.add(pk)
                            pk = tr.parent[pk]

    def run_pass(self):
        self.reset_counters()
        for r, c in enumerate(self.tr.chains):
            self.request(r, c)
        return self.hits / self.refs

    def stranded(self):
        """Share of stored copies whose chain no MATCH can reach."""
        tr, pl, ks = self.tr, self.pl, self.kids_seen
        reach = {}

        def ok(k):
            path = []
            while k >= 0 and k not in reach:
                path.append(k)
                k = tr.parent[k]
            v = reach.get(k, True) if k >= 0 else True
            for x in reversed(path):
                v = v and any(x in self.nodes[o].t for o in pl.owners(x, self.live, ks))
                reach[x] = v
            return reach[path[0]] if path else v

        total = bad = 0
        for i in self.live:
            for k in self.nodes[i].t:
                total += 1
                bad += not ok(k)
        return bad / total if total else 0.0

    def shares(self, what):
        v = [what[i] for i in sorted(self.live)]
        s = sum(v) or 1
        return [x / s for x in v]


def single_node(tr, frac):
    """One node of the whole capacity (linked, as kvpoold stores a chain)."""
    pl = Seg(tr, 1 << 30)
    pool = Pool(pl, {0: max(1, int(frac * tr.distinct))}, [0])
    return pool


def three(tr, pl, frac):
    cap = max(1, int(frac * tr.distinct / 3))
    return Pool(pl, {0: cap, 1: cap, 2: cap, 3: cap}, [0, 1, 2])


def evaluate(tr, pl, scenarios):
    res = {"placement": pl.name}
    t0 = time.time()
    p30 = three(tr, pl, 0.30)
    res["hit30"] = p30.run_pass()
    res["ops_share"] = p30.shares(p30.ops)
    res["calls_share"] = p30.shares(p30.calls)
    res["bytes_share"] = p30.shares(p30.bytes)
    res["bytes_max_over_mean"] = max(res["bytes_share"]) * 3
    res["enolink30"] = p30.enolink
    res["hot_share30"] = (len(p30.kids_seen.hot) if pl.hot_branch else
                          sum(1 for k in range(tr.distinct) if len(pl.owners(k, p30.live, p30.kids_seen)) > 1)
                          ) / tr.distinct
    res["stranded30"] = p30.stranded()
    p100 = three(tr, pl, 1.0)
    p100.run_pass()
    res["hit100"] = p100.run_pass()
    p110 = three(tr, pl, 1.1)
    p110.run_pass()
    res["hit110"] = p110.run_pass()
    if "loss" in scenarios:
        loss, refill = [], []
        for lost in range(3):
            q = p110.copy()
            q.live.discard(lost)
            q.nodes[lost] = Node(q.nodes[lost].cap)
            loss.append(q.run_pass())
            refill.append(q.run_pass())
        res["loss"] = sum(loss) / 3
        res["loss_worst"] = min(loss)
        res["refill"] = sum(refill) / 3
    if "join" in scenarios:
        q = p110.copy()
        q.live.add(3)
        res["join"] = q.run_pass()
        q = p110.copy()
        q.prev_live = set(q.live)
        q.live.add(3)
        res["join_fallback"] = q.run_pass()
        res["join_copies"] = q.copies
    res["seconds"] = time.time() - t0
    return res


def evaluate_single(tr):
    s30 = single_node(tr, 0.30)
    h30 = s30.run_pass()
    s100 = single_node(tr, 1.0)
    s100.run_pass()
    return {"placement": "one node", "hit30": h30, "hit100": s100.run_pass(), "hit110": 1.0}


def fmt_share(v):
    return "/".join("%.2f" % x for x in v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=None,
                    help="a JSONL trace (default: tests/data/synthetic_trace.jsonl)")
    ap.add_argument("--system-prompt-blocks", action="append", type=int, default=None,
                    help="also replay each trace with N shared leading blocks "
                         "(default: 0, 1 and 4)")
    ap.add_argument("--placements", default="seg32,seg8,seg4,block,block-link,hotpos1,hotpos4,"
                                            "hotkids4,hotbranch8,hotbranch32")
    ap.add_argument("--scenarios", default="loss,join")
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    traces = a.trace or [os.path.join(ROOT, "tests", "data", "synthetic_trace.jsonl")]
    sps = a.system_prompt_blocks if a.system_prompt_blocks is not None else [0, 1, 4]
    out = []
    for path in traces:
        for sp in sps:
            tr = Trace(path, sp, a.limit)
            label = "%s%s" % (os.path.basename(path),
                              " + shared %d-block prompt" % sp if sp else "")
            rows = [evaluate_single(tr)]
            for pl in make_placements(tr, a.placements.split(",")):
                rows.append(evaluate(tr, pl, a.scenarios.split(",")))
            out.append({"trace": label, "requests": len(tr.chains), "distinct_blocks": tr.distinct,
                        "block_refs": tr.refs, "rows": rows})
            if a.json:
                continue
            print("\n## %s: %d requests, %d distinct blocks, %d block refs, 3 nodes"
                  % (label, len(tr.chains), tr.distinct, tr.refs))
            print("| placement | hit 30% | 2nd pass at 100% | at 110% | block ops per node | "
                  "bytes: busiest/mean | after a loss (mean, worst) | refill | join | "
                  "join + fallback (copies) | stranded | hot |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                if "ops_share" not in r:
                    print("| %s | %.4f | %.4f | | | | | | | | | |" % (r["placement"], r["hit30"],
                                                                r["hit100"]))
                    continue
                print("| %s | %.4f | %.4f | %.4f | %s | %.2f | %s | %s | %s | %s | %.1f%% | %.1f%% |" % (
                    r["placement"], r["hit30"], r["hit100"], r["hit110"],
                    fmt_share(r["ops_share"]),
                    r["bytes_max_over_mean"],
                    "%.4f, %.4f" % (r["loss"], r["loss_worst"]) if "loss" in r else "",
                    "%.4f" % r["refill"] if "refill" in r else "",
                    "%.4f" % r["join"] if "join" in r else "",
                    "%.4f (%d)" % (r["join_fallback"], r["join_copies"])
                    if "join_fallback" in r else "",
                    100 * r["stranded30"], 100 * r["hot_share30"]))
            sys.stdout.flush()
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
