"""STAND-IN of vLLM's scheduler loop around a KV connector, for the
connector's asynchronous paths (stores off the step, the prefill-to-decode
hand-off). Written from the contract of KVConnectorBase_V1 (its
docstrings at vllm-project/vllm 9aaf83ef and local-inference-lab/vllm
28be48fa) and the project's engine notes, not from vLLM's code:

- get_num_new_matched_tokens may answer None (ask again at a later step)
  or (n, True): the request then waits for its load with its blocks
  allocated and n tokens counted as computed, until every worker has
  reported it in finished_recving;
- block ids reported by get_block_ids_with_load_errors cut the request's
  computed tokens at its first such block; with kv_load_failure_policy
  "fail" the request then ends with an error, with "recompute" it
  computes the rest; a load whose computed tokens are cut to 0 has its
  blocks freed and the request is asked about again;
- a request whose every token was loaded recomputes its last one;
- request_finished answering True keeps the request's blocks until every
  worker has reported it in finished_sending; a request that ends while
  its load is still running keeps its blocks until finished_recving;
- the step after a request finishes names it in finished_req_ids;
  preempted requests are named in preempted_req_ids;
- every step runs the workers' connector hooks, also when nothing is
  scheduled (vLLM's kv_connector_no_forward): handle_preemptions,
  bind_connector_metadata, start_load_kv, per layer wait_for_layer_load
  and save_kv_layer, wait_for_save, get_finished(finished_req_ids),
  get_block_ids_with_load_errors, build_connector_worker_meta,
  clear_connector_metadata; their outputs, aggregated, go to the
  scheduler side's update_connector_output.

The KV a "forward pass" writes for token p is a function of (seed, rank,
layer, K/V, p, head, dim), so a test can tell loaded KV from computed KV.
"""

import time
from types import SimpleNamespace

from vllm_standin_scheduler import Blocks, aggregate


class Req:
    """The Request fields a connector reads, plus the loop's own state."""

    def __init__(self, req_id, tokens, hashes, params=None, max_tokens=1, ids=None):
        self.request_id = req_id
        self.prompt_token_ids = list(tokens)
        self.num_prompt_tokens = len(tokens)
        self.num_tokens = len(tokens)
        self.block_hashes = list(hashes)
        self.kv_transfer_params = params
        self.max_tokens = max_tokens
        self.status = SimpleNamespace(name="WAITING")
        self.num_computed_tokens = 0
        self.outputs = 0
        self.want_ids = ids           # the block ids to allocate (None: from the free list)
        self.block_ids = None         # one list per KV-cache group, once allocated
        self.load_failed = False
        self.finished_at = None
        self.result_params = None
        self.held = None              # request_finished's answer

    def finished(self):
        return self.status.name.startswith("FINISHED")


class Engine:
    """One vLLM instance (an Instance of test_vllm_connector: a scheduler-side
    connector, workers, KV caches) driven step by step."""

    def __init__(self, inst, seed, policy="recompute"):
        self.inst = inst
        self.seed = seed
        self.policy = policy
        self.block = inst.setup.block
        assert len(inst.kcc.kv_cache_groups) == 1, "one KV-cache group"
        self.free = list(range(1, inst.kcc.num_blocks))      # block 0: the null block
        self.reqs = {}
        self.waiting = []
        self.running = []
        self.remote = []            # waiting for their load
        self.finished_ids = set()   # finished since the last step
        self.recv_ready = set()
        self.counts = {"sending": {}, "recving": {}}
        self.events = []            # (what, req_id, detail)
        self.steps = 0
        self.on_free = None         # callback(req) when a request's blocks are freed
        self.ask_log = []

    # ---- requests -----------------------------------------------------------------
    def add(self, req):
        self.reqs[req.request_id] = req
        self.waiting.append(req)
        return req

    def _alloc(self, req):
        n = -(-(req.num_tokens + req.max_tokens) // self.block)
        if req.want_ids is not None:
            ids = list(req.want_ids)[:n]
            for b in ids:
                self.free.remove(b)
        else:
            ids = [self.free.pop(0) for _ in range(n)]
        req.block_ids = [list(ids)]
        return Blocks(req.block_ids)

    def _free(self, req):
        if req.block_ids is None:
            return
        if self.on_free is not None:
            self.on_free(req)
        self.free.extend(req.block_ids[0])
        self.free.sort()
        req.block_ids = None
        self.events.append(("freed", req.request_id, self.steps))

    def _finish(self, req, status, blocks_busy=False):
        req.status = SimpleNamespace(name=status)
        req.finished_at = self.steps
        self.finished_ids.add(req.request_id)
        hold, params = self.inst.scheduler.request_finished_all_groups(
            req, tuple(req.block_ids or ()))
        req.held, req.result_params = hold, params
        self.events.append(("finished", req.request_id, (status, hold)))
        if not hold and not blocks_busy:
            self._free(req)

    # ---- one step -------------------------------------------------------------------
    def _schedule(self):
        sched = self.inst.scheduler
        new, num = [], {}
        for req in list(self.remote):
            if req.request_id not in self.recv_ready:
                continue
            self.recv_ready.discard(req.request_id)
            self.remote.remove(req)
            if req.load_failed and req.num_computed_tokens == 0:
                self._free(req)              # asked again, from scratch
            elif not req.load_failed and req.num_computed_tokens == req.num_tokens:
                req.num_computed_tokens = req.num_tokens - 1
            req.status = SimpleNamespace(name="WAITING")
            self.waiting.insert(0, req)
        for req in list(self.waiting):
            ext, is_async = 0, False
            if req.block_ids is None:
                ext, is_async = sched.get_num_new_matched_tokens(req, 0)
                self.ask_log.append((req.request_id, ext, is_async))
                if ext is None:
                    continue
                again = sched.get_num_new_matched_tokens(req, 0)
                assert again == (ext, is_async), "the answer must repeat"
                assert ext <= req.num_tokens and (ext > 0 or not is_async)
                blocks = self._alloc(req)
                sched.update_state_after_alloc(req, blocks, ext)
                req.num_computed_tokens = ext
            self.waiting.remove(req)
            if is_async:
                req.status = SimpleNamespace(name="WAITING_FOR_REMOTE_KVS")
                self.remote.append(req)
                continue
            req.status = SimpleNamespace(name="RUNNING")
            self.running.append(req)
            new.append(SimpleNamespace(req_id=req.request_id, block_ids=tuple(req.block_ids),
                                       num_computed_tokens=req.num_computed_tokens))
            num[req.request_id] = req.num_tokens - req.num_computed_tokens
        cached = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[])
        for req in self.running:
            if req.request_id in num:
                continue
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num[req.request_id] = max(1, req.num_tokens - req.num_computed_tokens)
        out = SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=cached,
                              num_scheduled_tokens=num, finished_req_ids=self.finished_ids,
                              preempted_req_ids=set())
        self.finished_ids = set()
        out.kv_connector_metadata = sched.build_connector_meta(out)
        return out

    def _forward(self, rank, so):
        """Write the KV of every scheduled token."""
        import torch
        inst = self.inst
        for req_id, n in so.num_scheduled_tokens.items():
            req = self.reqs[req_id]
            first = req.num_computed_tokens
            ids = req.block_ids
            h = torch.arange(inst.setup.heads if not inst.setup.mla else 1).view(-1, 1)
            d = torch.arange(inst.setup.dim).view(1, -1)
            for li, (g, _, t) in enumerate(inst._layers(rank)):
                for p in range(first, first + n):
                    if ids[g][p // self.block] == 0:
                        continue
                    kb, tk = inst._slot(ids[g], p)
                    for k in range(t.shape[0]):
                        base = self.seed * 131 + rank * 17 + li * 29 + k * 7 + p * 3
                        t[k, kb, tk, :, :inst.setup.dim] = ((base + h * 37 + d) % 1021).to(t.dtype)

    def step(self):
        """One engine step; returns the aggregated connector output."""
        self.steps += 1
        so = self._schedule()
        meta = so.kv_connector_metadata
        outs = []
        for rank, w in enumerate(self.inst.workers):
            w.handle_preemptions(meta)
            w.bind_connector_metadata(meta)
            w.start_load_kv(SimpleNamespace())
            for name in w.layer_names:
                w.wait_for_layer_load(name)
            if so.num_scheduled_tokens:
                self._forward(rank, so)
            for name in w.layer_names:
                w.save_kv_layer(name, None, None)
            w.wait_for_save()
            sending, recving = w.get_finished(so.finished_req_ids)
            outs.append(SimpleNamespace(finished_sending=sending, finished_recving=recving,
                                        invalid_block_ids=w.get_block_ids_with_load_errors(),
                                        kv_connector_worker_meta=w.build_connector_worker_meta()))
            w.clear_connector_metadata()
        agg = self._aggregate(outs)
        self._update(so, agg)
        return agg

    def _aggregate(self, outs):
        world = len(self.inst.workers)
        done = {"sending": set(), "recving": set()}
        for o in outs:
            for what in ("sending", "recving"):
                for r in getattr(o, "finished_" + what) or ():
                    c = self.counts[what]
                    c[r] = c.get(r, 0) + 1
                    assert c[r] <= world, "%s reported twice by a worker" % r
                    if c[r] == world:
                        done[what].add(r)
                        del c[r]
        return SimpleNamespace(
            finished_sending=done["sending"] or None, finished_recving=done["recving"] or None,
            invalid_block_ids=set().union(*(o.invalid_block_ids for o in outs)),
            kv_connector_worker_meta=aggregate([o.kv_connector_worker_meta for o in outs]))

    def _update(self, so, agg):
        bad = agg.invalid_block_ids
        failed = set()
        if bad:
            for req in self.remote + self.running:
                ids = req.block_ids[0]
                done = req.num_computed_tokens         # loaded or computed before this step
                for i in range(-(-done // self.block)):
                    if ids[i] in bad:
                        req.num_computed_tokens = i * self.block
                        req.load_failed = True
                        failed.add(req.request_id)
                        self.events.append(("load-failed", req.request_id, i))
                        break
        for req in list(self.running):
            if req.request_id in failed:
                continue
            req.num_computed_tokens += so.num_scheduled_tokens.get(req.request_id, 0)
            if req.num_computed_tokens >= req.num_tokens:
                req.outputs += 1
                if req.outputs >= req.max_tokens:
                    self.running.remove(req)
                    self._finish(req, "FINISHED_LENGTH_CAPPED")
                else:
                    req.num_tokens += 1
        if failed and self.policy == "fail":
            for req in [self.reqs[r] for r in failed]:
                busy = req in self.remote
                if req in self.running:
                    self.running.remove(req)
                if busy:
                    self.remote.remove(req)
                self._finish(req, "FINISHED_ERROR", blocks_busy=busy)
        self.inst.scheduler.update_connector_output(agg)
        for r in agg.finished_recving or ():
            req = self.reqs[r]
            self.events.append(("recved", r, self.steps))
            if req.finished():
                self._free(req)
            else:
                self.recv_ready.add(r)
        for r in agg.finished_sending or ():
            self.events.append(("sent", r, self.steps))
            self._free(self.reqs[r])

    # ---- helpers for tests -------------------------------------------------------------
    def run(self, until, timeout_s=20.0, pause_s=0.005):
        """Step until until() is true (asserts it becomes true in time)."""
        end = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < end, "the engine did not get there in %.0f s" % timeout_s
            self.step()
            time.sleep(pause_s)

    def idle(self):
        """Nothing running, waiting or held: every block is free."""
        return not (self.waiting or self.running or self.remote) and \
            len(self.free) == self.inst.kcc.num_blocks - 1

    def read(self, req, n, rank=0):
        return self.inst.read(rank, req.block_ids, n)
