"""The engine-core side of a vLLM instance for the real-code tier's
hand-off tests (test_vllm_pd_real), in a process of its own: vLLM's own
Scheduler (v1/core/sched/scheduler.py) with its KVCacheManager, block
pool and request queues, which builds the kvpool connector through vLLM's
KVConnectorFactory, asks it about every request, puts a request whose
load is asynchronous in WAITING_FOR_REMOTE_KVS, handles the workers'
invalid blocks with kv_load_failure_policy, frees a finished request's
blocks at once or after finished_sending, and promotes a request on
finished_recving. The workers' KVConnectorOutputs are combined by vLLM's
KVOutputAggregator (one finished set per request once every worker has
reported it), as the executor does.

What the engine core does around the Scheduler is done here: it builds
the step's ModelRunnerOutput (a sampled token for each request whose
prompt is complete; the workers write the KV), and feeds requests in.
The configuration is a namespace with the attributes these classes read
(vLLM's VllmConfig is a pydantic 2 class that does not load here);
SamplingParams (a msgspec struct; msgspec is not packaged in Debian 12)
is a namespace with the fields the Scheduler and Request read.
"""

import pickle
import traceback
from types import SimpleNamespace

import vllm_roles


def sampling_params(max_tokens, kv_transfer_params=None):
    """The SamplingParams fields vLLM's Request and Scheduler read."""
    extra = {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None
    return SimpleNamespace(
        max_tokens=max_tokens, min_tokens=0, eos_token_id=None, stop_token_ids=[],
        repetition_detection=None, logprobs=None, num_logprobs=None,
        num_prompt_logprobs=None, prompt_logprobs=None, return_prompt_logits=False,
        extra_args=extra, skip_reading_prefix_cache=None, structured_outputs=None)


def engine_config(setup, url, prefix, role, policy):
    """vllm_roles.vllm_config plus what the Scheduler reads."""
    vc = vllm_roles.vllm_config(setup, url, prefix, 0, role, policy)
    vc.scheduler_config.__dict__.update(
        max_num_seqs=16, max_num_scheduled_tokens=None, max_num_batched_tokens=4096,
        long_prefill_token_threshold=0, enable_chunked_prefill=True, policy="fcfs",
        scheduler_reserve_full_isl=False, async_scheduling=False)
    vc.cache_config.__dict__.update(num_gpu_blocks=setup["num_blocks"],
                                    enable_prefix_caching=True, mamba_cache_mode="none")
    vc.model_config.__dict__.update(is_encoder_decoder=False, max_model_len=4096,
                                    enable_return_routed_experts=False)
    vc.parallel_config.__dict__.update(data_parallel_index=0, data_parallel_rank=0)
    vc.lora_config = vc.kv_events_config = vc.ec_transfer_config = None
    vc.speculative_config = None
    vc.observability_config = SimpleNamespace(kv_cache_metrics=False, enable_mfu_metrics=False)
    vc.use_v2_model_runner = False
    return vc


class EngineSide:
    def __init__(self, setup, url, prefix, role, policy):
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        self.setup = setup
        self.kcc = vllm_roles.kv_cache_config(setup)
        init_none_hash(sha256)          # PYTHONHASHSEED is set by the tier: a shared seed
        self.hasher = get_request_block_hasher(setup["block"], sha256)
        structured = SimpleNamespace(should_advance=lambda r: False)
        no_mm = SimpleNamespace(supports_multimodal_inputs=lambda cfg: False)
        self.sched = Scheduler(engine_config(setup, url, prefix, role, policy), self.kcc,
                               structured, block_size=setup["block"], mm_registry=no_mm)
        self.connector = self.sched.connector
        self.world = setup.get("tp", 1)
        self.aggregator = KVOutputAggregator(self.world)
        self.events = []                 # (step, what, req_id, detail)
        self.steps = 0
        self.requests = {}
        self.seeds = {}
        self.block_ids = {}              # req_id -> block ids at its last step
        self.reserved = []
        finished = self.connector.request_finished_all_groups

        def record(request, block_ids):
            out = finished(request, block_ids)
            self.events.append((self.steps, "request_finished", request.request_id,
                                (out[0], out[1], request.status.name)))
            return out
        self.connector.request_finished_all_groups = record

    def reserve(self, n):
        """Take n blocks from vLLM's block pool, so this instance's requests
        get other block ids than another instance's."""
        self.reserved += self.sched.kv_cache_manager.block_pool.get_new_blocks(n)
        return [b.block_id for b in self.reserved]

    def add(self, req_id, tokens, max_tokens=1, params=None, seed=1):
        from vllm.v1.request import Request
        req = Request(req_id, list(tokens), sampling_params(max_tokens, params), None,
                      block_hasher=self.hasher)
        self.requests[req_id] = req
        self.seeds[req_id] = seed
        self.sched.add_request(req)
        return [bytes(h) for h in req.block_hashes]

    def schedule(self):
        """vLLM's schedule(); the pickled SchedulerOutput and, per request
        scheduled, the (block ids, first token, end token, seed) its forward
        pass writes."""
        self.steps += 1
        so = self.sched.schedule()
        forwards = []
        for req_id, n in so.num_scheduled_tokens.items():
            req = self.requests[req_id]
            ids = [list(g) for g in self.sched.kv_cache_manager.get_block_ids(req_id)]
            self.block_ids[req_id] = ids
            end = req.num_computed_tokens       # already advanced by the scheduled tokens
            forwards.append((ids, end - n, end, self.seeds[req_id]))
        for req_id, req in self.requests.items():
            if req.status.name == "WAITING_FOR_REMOTE_KVS" and req_id not in self.block_ids:
                self.block_ids[req_id] = [list(g) for g in
                                          self.sched.kv_cache_manager.get_block_ids(req_id)]
        self._so = so
        return pickle.dumps(so), forwards

    def update(self, worker_outputs):
        """The workers' KVConnectorOutputs, each in a ModelRunnerOutput, through
        vLLM's KVOutputAggregator and Scheduler.update_from_output; then
        the state of every request and of the block pool."""
        from vllm.v1.outputs import ModelRunnerOutput
        so = self._so
        ids = list(so.num_scheduled_tokens)
        sampled = [[7] if self.requests[r].num_computed_tokens >= self.requests[r].num_tokens
                   else [] for r in ids]
        outs = []
        for blob in worker_outputs:
            kvo = pickle.loads(blob)
            for what in ("finished_sending", "finished_recving"):
                for r in getattr(kvo, what) or ():
                    self.events.append((self.steps, what + "-worker", r, None))
            if kvo.invalid_block_ids:
                self.events.append((self.steps, "invalid", None, sorted(kvo.invalid_block_ids)))
            outs.append(ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in
                                                                         enumerate(ids)},
                                          sampled_token_ids=sampled, kv_connector_output=kvo))
        out = self.aggregator.aggregate(outs)
        kvo = out.kv_connector_output
        for what in ("finished_sending", "finished_recving"):
            for r in getattr(kvo, what, None) or ():
                self.events.append((self.steps, what, r, None))
        self.sched.update_from_output(so, out)
        return self.state()

    def state(self):
        pool = self.sched.kv_cache_manager.block_pool
        return {"requests": {r: (q.status.name, q.num_computed_tokens, q.num_output_tokens)
                             for r, q in self.requests.items()},
                "free_blocks": pool.get_num_free_blocks(),
                "total_blocks": self.kcc.num_blocks - 1 - len(self.reserved),
                "unfinished": self.sched.get_num_unfinished_requests(),
                "events": list(self.events)}

    def block_ids_of(self, req_id):
        return self.block_ids.get(req_id)

    def stats(self):
        return {"handoff": getattr(self.connector, "pd_wait_ms", None)}


def engine_main(conn, setup, url, prefix, role, policy):
    try:
        vllm_roles.load()
        e = EngineSide(setup, url, prefix, role, policy)
        conn.send(("ready", e.connector.namespace_for_rank(0)))
        while True:
            what, args = conn.recv()
            if what == "stop":
                e.connector.shutdown()
                conn.send(("ok", None))
                return
            conn.send(("ok", getattr(e, what)(*args)))
    except Exception:
        conn.send(("error", traceback.format_exc()))
