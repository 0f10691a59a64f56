"""The prefill instance of the hand-off tests (test_vllm_pd), run in a
process of its own: a kv_producer Instance (test_vllm_connector) driven by
the stand-in engine loop (vllm_standin_engine), one request with
kv_transfer_params {"do_remote_decode": true} and max_tokens 1, as
vLLM's disaggregated proxy sends it. It reports what the decode side and
the test need: request_finished's answer and params, the prompt's KV
bytes, whether the pool held every chunk when the blocks were freed, and
the engine's events."""

import traceback


def producer_main(conn, url, prefix, n_tokens, seed, ids, tp=1, extra=None):
    try:
        import kvpool
        from test_vllm_connector import BS, Instance
        from vllm_standin_engine import Engine, Req
        tokens = [(977 + i) % 30000 for i in range(n_tokens)]
        hashes = kvpool.block_hashes(tokens, BS)
        inst = Instance(url, prefix, role="kv_producer", tp=tp, **(extra or {}))
        eng = Engine(inst, seed)
        full = (n_tokens // BS) * BS
        seen = {}
        raws = [kvpool.Client(url, inst.scheduler.namespace_for_rank(r)) for r in range(tp)]

        def on_free(req):
            # what the pool holds when vLLM gets the blocks back
            from kvpool.vllm import block_key
            ks = [block_key(h) for h in hashes[:full // BS]]
            seen["held_at_free"] = [r.match(ks) for r in raws]
            seen["kv"] = [inst.read(r, req.block_ids, n_tokens).numpy() for r in range(tp)]
        eng.on_free = on_free
        conn.send(("ready", inst.scheduler.namespace_for_rank(0)))
        req = eng.add(Req("prefill-1", tokens, hashes, params={"do_remote_decode": True},
                          max_tokens=1, ids=ids))
        eng.run(eng.idle)
        batches = inst.workers[0]._pipeline.batches      # one MATCH each, rank 0's namespace
        conn.send(("ok", {"held": req.held, "params": req.result_params, "events": eng.events,
                          "held_at_free": seen.get("held_at_free"), "kv": seen.get("kv"),
                          "free": len(eng.free), "blocks": inst.kcc.num_blocks - 1,
                          "store_matches": batches,
                          "namespace": inst.scheduler.namespace_for_rank(0),
                          "probe_matches": len(raws) if "held_at_free" in seen else 0}))
        for r in raws:
            r.close()
        inst.close()
    except Exception:
        conn.send(("error", traceback.format_exc()))
