"""STAND-IN of how vLLM's scheduler and model runner call a KV connector
(KVConnectorBase_V1), written from the contract in the project's engine
notes (§3.2, §0b), not from vLLM's code: per new request,
get_num_new_matched_tokens (asked twice: the answer must repeat), the
assertion local + external <= num_tokens, update_state_after_alloc with
the request's blocks (one list per KV-cache group), build_connector_meta;
per worker, handle_preemptions, bind metadata, start_load_kv, per layer
wait_for_layer_load and save_kv_layer, then wait_for_save,
get_finished(finished_req_ids), get_block_ids_with_load_errors and
build_connector_worker_meta; the workers' metadata, aggregated, goes to
the scheduler's update_connector_output; then request_finished (or
request_finished_all_groups for a SupportsHMA connector). When that
answers True (stores still in flight), the request's blocks stay held
and the following steps (the first naming the request in
finished_req_ids) run until every worker has reported it in
finished_sending. The asynchronous (hand-off) paths are driven by
vllm_standin_engine."""

import time

from types import SimpleNamespace


class Blocks:
    def __init__(self, ids):
        # one list of block ids per KV-cache group
        self.ids = tuple(list(g) for g in ids) if ids and isinstance(ids[0], (list, tuple)) \
            else (list(ids),)

    def get_block_ids(self):
        return self.ids


class Request:
    def __init__(self, req_id, tokens, block_hashes):
        self.request_id = req_id
        self.prompt_token_ids = list(tokens)
        self.num_tokens = len(tokens)
        self.num_prompt_tokens = len(tokens)
        self.block_hashes = list(block_hashes)


def worker_step(w, meta, forward=None, index=0, first_block=0, finished=(), sent=None):
    """One forward pass of one worker; (load errors, worker metadata).
    sent, a list, gets the requests the worker reports finished sending."""
    if hasattr(w, "handle_preemptions"):
        w.handle_preemptions(meta)
    w.bind_connector_metadata(meta)
    w.start_load_kv(SimpleNamespace())
    for name in w.layer_names:
        w.wait_for_layer_load(name)
    if forward is not None:
        forward(index, first_block)
    for name in w.layer_names:
        w.save_kv_layer(name, None, None)
    w.wait_for_save()
    sending, recving = w.get_finished(set(finished))
    assert not recving, "no asynchronous load was offered"
    if sent is not None:
        sent.extend(sending or ())
    errors = w.get_block_ids_with_load_errors()
    wmeta = w.build_connector_worker_meta() if hasattr(w, "build_connector_worker_meta") \
        else None
    w.clear_connector_metadata()
    return errors, wmeta


def aggregate(metas):
    out = None
    for m in metas:
        if m is None:
            continue
        out = m if out is None else out.aggregate(m)
    return out


def step(scheduler, workers, request, block_ids, local_tokens=0, forward=None):
    """Schedule `request` as a new request; returns (external tokens, load
    errors per worker). forward(worker_index, first_block) writes the KV
    of the tokens computed in this step (from the first block not loaded).
    block_ids: one list, or one list per KV-cache group."""
    ext, is_async = scheduler.get_num_new_matched_tokens(request, local_tokens)
    again = scheduler.get_num_new_matched_tokens(request, local_tokens)
    assert (ext, is_async) == again, "the answer must repeat"
    assert ext is not None and local_tokens + ext <= request.num_tokens
    assert is_async is False
    blocks = Blocks(block_ids)
    scheduler.update_state_after_alloc(request, blocks, ext)
    computed = local_tokens + ext
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=request.request_id,
                                            block_ids=blocks.get_block_ids(),
                                            num_computed_tokens=computed)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[]),
        num_scheduled_tokens={request.request_id: request.num_tokens - computed},
        finished_req_ids=set())
    meta = scheduler.build_connector_meta(out)
    errors, wmetas = [], []
    for i, w in enumerate(workers):
        e, m = worker_step(w, meta, forward, i, computed // scheduler.block_size)
        errors.append(e)
        wmetas.append(m)
    scheduler.update_connector_output(SimpleNamespace(
        kv_connector_worker_meta=aggregate(wmetas), finished_sending=None,
        finished_recving=None, invalid_block_ids=set().union(*errors)))
    if hasattr(scheduler, "request_finished_all_groups"):
        hold, params = scheduler.request_finished_all_groups(request, blocks.get_block_ids())
    else:
        hold, params = scheduler.request_finished(request, blocks.get_block_ids()[0])
    if hold:
        release(scheduler, workers, request.request_id)
    return ext, errors


def idle_output(finished=()):
    return SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=None,
                           num_scheduled_tokens={}, finished_req_ids=set(finished))


def release(scheduler, workers, req_id, timeout_s=20.0):
    """Steps with nothing scheduled (the first names req_id as finished)
    until every worker has reported req_id finished sending: what vLLM
    does before it frees a request whose request_finished answered True."""
    end = time.monotonic() + timeout_s
    sent, finished = [], {req_id}
    while sent.count(req_id) < len(workers):
        assert time.monotonic() < end, "%s never reported finished sending" % req_id
        meta = scheduler.build_connector_meta(idle_output(finished))
        wmetas = [worker_step(w, meta, finished=finished, sent=sent)[1] for w in workers]
        finished = ()
        scheduler.update_connector_output(SimpleNamespace(
            kv_connector_worker_meta=aggregate(wmetas), invalid_block_ids=set(),
            finished_sending={req_id} if sent.count(req_id) == len(workers) else None,
            finished_recving=None))
        time.sleep(0.002)
    assert sent.count(req_id) == len(workers), "reported once per worker"
