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
