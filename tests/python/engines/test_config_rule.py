"""Row 15: one configuration rule for every adapter. A configuration
error fails at start with a clear message (a ValueError naming the
setting); only an unreachable pool means misses. A number where a token
belongs (JSON or YAML read an unquoted all-digit token as one) is refused
with a message that says to quote it, never a crash."""

import asyncio
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import kvpool.lmcache as kl  # noqa: E402
import kvpool.sglang as ks  # noqa: E402
import kvpool.vllm as kv  # noqa: E402
from kvpool._adapters import config as cfg  # noqa: E402

BAD = [({"url": "not-a-url"}, "url"), ({"url": "tcp://host"}, "port"),
       ({"url": "tcp://h:99999"}, "port"), ({"url": "http://h:1"}, "scheme"),
       ({"url": 7470}, "url"), ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"),
       ({"timeout_s": "soon"}, "timeout_s"), ({"timeout_s": True}, "timeout_s"),
       ({"lease_ms": -5}, "lease_ms"), ({"lease_ms": "long"}, "lease_ms"),
       ({"lease_ms": 1.5}, "lease_ms"), ({"token": 1234}, "quote")]
GOOD = [{"timeout_s": "1.5"}, {"lease_ms": 3000.0}, {"token": "1234"},
        {"url": "tcp://127.0.0.1:1,127.0.0.1:2"}, {"url": "etcd://127.0.0.1:1/c"}]


def sglang(url, params):
    from sglang.srt.mem_cache import hicache_storage as hs
    from sglang_fake_pool import FakeHostPool
    ec = dict({"url": url, "timeout_s": 0.5}, **params)
    c = hs.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=ec)
    return ks.KVPoolHiCacheStorage(c, FakeHostPool())


def tier(url, params):
    import numpy as np
    from test_vllm_tier import Cfg
    return kv.KVPoolSecondaryTier(Cfg, memoryview(np.zeros((4, 64), dtype=np.uint8)),
                                  "kvpool", **dict({"url": url, "timeout_s": 0.5}, **params))


def connector(url, params):
    from test_vllm_connector import Setup, vllm_config
    import vllm_standin_layouts as vl
    s = Setup()
    vc = vllm_config(url, "cfg", s, **params)
    vc.kv_transfer_config.kv_connector_extra_config["timeout_s"] = params.get("timeout_s", 0.5)
    return kv.KVPoolConnector(vc, 0, vl.kv_cache_config(8, s.groups()))


def l2(url, params):
    return kl.KVPoolL2Plugin(**dict({"url": url, "timeout_s": 0.5}, **params))


def lmcache_remote(url, params):
    extra = {"remote_storage_plugin.kvpool.%s" % k: v for k, v in
             dict({"url": url, "timeout_s": 0.5}, **params).items()}
    meta = SimpleNamespace(model_name="m", world_size=1, worker_id=0, kv_dtype=torch.float16,
                           kv_shape=(2, 2, 16, 2, 8), use_mla=False)
    ctx = SimpleNamespace(url="plugin://kvpool", loop=None, local_cpu_backend=None,
                          config=SimpleNamespace(chunk_size=16, extra_config=extra),
                          metadata=meta, plugin_name="kvpool")
    return kl.KVPoolConnectorAdapter().create_connector(ctx)


ADAPTERS = {"sglang": sglang, "vllm-tier": tier, "vllm-connector": connector,
            "lmcache-mp": l2, "lmcache-remote": lmcache_remote}


def close(obj):
    for m in ("close", "shutdown", "close_sync"):
        fn = getattr(obj, m, None)
        if fn is not None:
            r = fn()
            if asyncio.iscoroutine(r):
                asyncio.run(r)
            return


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize("params,words", BAD, ids=[repr(b[0]) for b in BAD])
def test_configuration_errors_fail_at_start(server, adapter, params, words):
    p = dict(params)
    url = p.pop("url", server.url)
    with pytest.raises(ValueError) as e:
        close(ADAPTERS[adapter](url, p))
    assert isinstance(e.value, cfg.ConfigError)
    assert words in str(e.value), str(e.value)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize("params", GOOD, ids=[repr(g) for g in GOOD])
def test_accepted_forms(server, adapter, params):
    p = dict(params)
    url = p.pop("url", server.url)
    close(ADAPTERS[adapter](url, p))


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_unreachable_pool_is_not_an_error(adapter):
    from conftest import free_port
    close(ADAPTERS[adapter]("tcp://127.0.0.1:%d" % free_port(), {}))


def test_url_forms():
    for good in ("tcp://a:1", "tcp://[::1]:7470", "rdma://h", "auto://h:1", "tcp://a:1,b:2",
                 "tcp://a:1,rdma://b", "etcd://e:2379/c", "etcd://e/c"):
        assert cfg.url(good) == good
    for bad in ("tcp://", "tcp://a:1,", "tcp://a b:1", "etcd://e:1", "etcd://e:1/c/d",
                "tcp://[::1:7470", "tcp://a:0"):
        with pytest.raises(cfg.ConfigError):
            cfg.url(bad)


@pytest.mark.parametrize("params,words", [
    ({"pd_wait_ms": -1}, "pd_wait_ms"), ({"pd_wait_ms": "soon"}, "pd_wait_ms"),
    ({"pd_wait_ms": 2 ** 32}, "pd_wait_ms"), ({"pd_max_waits": 0}, "pd_max_waits"),
    ({"pd_max_waits": 1.5}, "pd_max_waits"), ({"pd_retain_ms": -1}, "pd_retain_ms"),
    ({"staging_mb": 0}, "staging_mb")], ids=lambda p: repr(p))
def test_handoff_settings_fail_at_start(server, params, words):
    """The vLLM connector's hand-off settings follow the same rule."""
    with pytest.raises(cfg.ConfigError) as e:
        connector(server.url, params)
    assert words in str(e.value)


def test_handoff_settings_accepted_forms(server):
    c = connector(server.url, {"pd_wait_ms": "2500", "pd_max_waits": 8.0, "pd_retain_ms": 0,
                               "staging_mb": "64"})
    assert (c.pd_wait_ms, c.pd_max_waits, c.pd_retain_ms, c.staging_mb) == (2500, 8, 0, 64)
    c.shutdown()
