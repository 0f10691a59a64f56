"""STAND-IN of how vLLM's scheduler and model runner call a KV connector
(KVConnectorBase_V1), written from the contract in the project's engine
notes (§3.2), not from vLLM's code: per new request,
get_num_new_matched_tokens (asked twice: the answer must repeat), the
assertion local + external <= num_tokens, update_state_after_alloc with
the request's blocks, build_connector_meta; per worker, bind metadata,
start_load_kv, per layer wait_for_layer_load and save_kv_layer, then
wait_for_save, get_block_ids_with_load_errors; request_finished."""

from types import SimpleNamespace


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


class Request:
    def __init__(self, req_id, tokens, block_hashes):
        self.request_id = req_id
        self.prompt_token_ids = list(tokens)
        self.num_tokens = len(tokens)
        self.block_hashes = list(block_hashes)


def step(scheduler, workers, request, block_ids, local_tokens=0, forward=None):
    """Schedule `request` as a new request; returns (external tokens, load
    errors per worker). forward(worker_index, first_block) writes the KV
    of the tokens computed in this step (from the first block not loaded)."""
    ext, is_async = scheduler.get_num_new_matched_tokens(request, local_tokens)
    again = scheduler.get_num_new_matched_tokens(request, local_tokens)
    assert (ext, is_async) == again, "the answer must repeat"
    assert ext is not None and local_tokens + ext <= request.num_tokens
    assert is_async is False
    scheduler.update_state_after_alloc(request, Blocks(block_ids), ext)
    computed = local_tokens + ext
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=request.request_id,
                                            block_ids=(list(block_ids),),
                                            num_computed_tokens=computed)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[]),
        num_scheduled_tokens={request.request_id: request.num_tokens - computed})
    meta = scheduler.build_connector_meta(out)
    errors = []
    for i, w in enumerate(workers):
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace())
        for name in w.layer_names:
            w.wait_for_layer_load(name)
        if forward is not None:
            forward(i, computed // scheduler.block_size)
        for name in w.layer_names:
            w.save_kv_layer(name, None, None)
        w.wait_for_save()
        errors.append(w.get_block_ids_with_load_errors())
        w.clear_connector_metadata()
    hold, params = scheduler.request_finished(request, block_ids)
    assert hold is False
    return ext, errors
