"""The example engine configurations in config/engines/ parse, name classes
that exist, and build through the engines' loaders (stand-ins here)."""

import json
import os

import pytest

from conftest import ROOT

CFG = os.path.join(ROOT, "config", "engines")


def load(name):
    with open(os.path.join(CFG, name)) as f:
        return json.load(f)


def test_sglang_extra_config_builds(server):
    torch = pytest.importorskip("torch")
    from sglang.srt.mem_cache import hicache_storage as hs
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang_fake_pool import FakeHostPool
    ec = load("sglang-hicache.json")
    assert ec["interface_v1"] == 1 and ec["module_path"] == "kvpool.sglang"
    ec["url"] = server.url
    for k in ("prefetch_threshold",):        # SGLang pops these before the backend
        ec.pop(k)
    cfg = hs.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=ec)
    b = StorageBackendFactory.create_backend("dynamic", cfg, FakeHostPool(dtype=torch.float16))
    assert b.namespace.startswith("sglang-prod:m:float16:page_first:p4:")
    b.close()


def test_vllm_configs_name_real_classes():
    import kvpool.vllm as kv
    tier = load("vllm-tier.json")["kv_connector_extra_config"]["secondary_tiers"][0]
    assert tier["type"] == kv.TIER_TYPE
    conn = load("vllm-connector.json")
    assert conn["kv_load_failure_policy"] == "recompute"
    assert getattr(__import__(conn["kv_connector_module_path"], fromlist=["x"]),
                   conn["kv_connector"]) is kv.KVPoolConnector


def test_lmcache_configs_name_real_classes():
    import kvpool.lmcache as kl
    mp = load("lmcache-mp-l2.json")
    cls = getattr(__import__(mp["module_path"], fromlist=["x"]), mp["class_name"])
    assert cls is kl.KVPoolL2Plugin
    with open(os.path.join(CFG, "lmcache-remote.yaml")) as f:
        text = f.read()
    assert "remote_storage_plugin.kvpool.class_name: KVPoolConnectorAdapter" in text
    assert 'remote_storage_plugins: ["kvpool"]' in text


def test_leases_fit_the_servers_default_cap():
    """Row 16: every lease_ms in config/engines fits kvpoold's default
    max_lease_ms (config/kvpool.conf), which would otherwise cut it."""
    import re
    with open(os.path.join(ROOT, "config", "kvpool.conf")) as f:
        cap = int(re.search(r"^max_lease_ms\s*=\s*(\d+)", f.read(), re.M).group(1))
    found = 0
    for name in sorted(os.listdir(CFG)):
        with open(os.path.join(CFG, name)) as f:
            text = f.read()
        for m in re.finditer(r"lease_ms\"?\s*:\s*(\d+)", text):
            found += 1
            assert int(m.group(1)) <= cap, "%s: lease_ms %s > max_lease_ms %d" % (
                name, m.group(1), cap)
    assert found >= 5


def test_configs_build_with_the_config_rule():
    """The shipped settings pass the adapters' checks (ConfigError otherwise)."""
    from kvpool._adapters import config as cfg
    for name in ("sglang-hicache.json", "lmcache-mp-l2.json"):
        ec = load(name)
        ec = ec.get("adapter_params", ec)
        cfg.url(ec["url"])
        cfg.seconds(ec["timeout_s"])
        cfg.milliseconds(ec["lease_ms"])


def test_vllm_pd_configs_pair_up(server):
    """config/engines/vllm-pd-producer.json and vllm-pd-consumer.json: the
    prefill instance stores and never loads, the decode instance loads and
    never stores, both recompute failed loads, and their namespaces agree
    (blocks one stores, the other finds); the decode side's wait fits
    kvpoold's default max_match_wait_ms and the producer's retention its
    max_retain_ms (config/kvpool.conf)."""
    import re
    from types import SimpleNamespace
    import kvpool.vllm as kv
    prod, cons = load("vllm-pd-producer.json"), load("vllm-pd-consumer.json")
    assert (prod["kv_role"], cons["kv_role"]) == ("kv_producer", "kv_consumer")
    assert prod["kv_load_failure_policy"] == cons["kv_load_failure_policy"] == "recompute"
    with open(os.path.join(ROOT, "config", "kvpool.conf")) as f:
        conf = f.read()
    wait_cap = int(re.search(r"^max_match_wait_ms\s*=\s*(\d+)", conf, re.M).group(1))
    assert 0 < cons["kv_connector_extra_config"]["pd_wait_ms"] <= wait_cap
    m = re.search(r"^#?\s*max_retain_ms\s*=\s*(\d+)", conf, re.M)
    retain_cap = int(m.group(1)) if m else 24 * 3600 * 1000
    assert 0 < prod["kv_connector_extra_config"]["pd_retain_ms"] <= retain_cap
    conns = []
    for c, role in ((prod, "SCHEDULER"), (cons, "SCHEDULER")):
        ec = dict(c["kv_connector_extra_config"], url=server.url)
        vc = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(kv_role=c["kv_role"],
                                               kv_load_failure_policy="recompute",
                                               kv_connector_extra_config=ec),
            model_config=SimpleNamespace(model="m", dtype="float16"),
            cache_config=SimpleNamespace(block_size=16, cache_dtype="auto",
                                         prefix_caching_hash_algo="sha256"),
            parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
        conn = getattr(__import__(c["kv_connector_module_path"], fromlist=["x"]),
                       c["kv_connector"])(vc, 0)
        assert conn is not None and isinstance(conn, kv.KVPoolConnector)
        conns.append(conn)
    assert conns[0].stores and not conns[0].loads and conns[1].loads and not conns[1].stores
    assert conns[0].namespace_for_rank(0) == conns[1].namespace_for_rank(0)
    assert conns[1].pd_wait_ms == cons["kv_connector_extra_config"]["pd_wait_ms"]
    for conn in conns:
        conn.shutdown()
