"""What kvpool.vllm's tier and connector share: vLLM block hashes as kvpool
keys, and the parts of a namespace read from vLLM's configuration.
Internal: the names may change."""

import hashlib
import logging

from .._adapters.keys import pad_key

log = logging.getLogger("kvpool.vllm")

DEFAULT_URL = "tcp://127.0.0.1:7470"
DEFAULT_LEASE_MS = 5000     # kvpoold's default max_lease_ms


def _import(module, name):
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception as e:
        log.debug("kvpool.vllm: %s.%s not importable (%s)", module, name, e)
        return None


def block_key(h, group=None):
    """A vLLM block hash (or an OffloadKey: hash + 4-byte big-endian group
    index) as a 32-byte kvpool key. Group 0 (or none) keys are the hash,
    zero-padded when 16 bytes; another group's key is the SHA-256 of the
    group index and the hash, so groups never share keys."""
    b = bytes(h)
    if group is None and len(b) in (20, 36):
        b, group = b[:-4], int.from_bytes(b[-4:], "big")
    if group:
        return hashlib.sha256(b"vllm-group" + int(group).to_bytes(4, "big") + b).digest()
    return pad_key(b)


def _hash_algo(vllm_config, params):
    return (params.get("hash_algo") or
            getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo", None)
            or "sha256")


def _model_dtype(vllm_config, params):
    mc = getattr(vllm_config, "model_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    model = params.get("model") or getattr(mc, "served_model_name", None) or \
        getattr(mc, "model", None) or "unknown-model"
    if isinstance(model, (list, tuple)):
        model = model[0]
    dtype = params.get("kv_dtype") or getattr(cc, "cache_dtype", None) or "auto"
    if dtype == "auto":
        dtype = str(getattr(mc, "dtype", "auto"))
    return str(model), str(dtype).replace("torch.", "")


def _parallel(vllm_config):
    pc = getattr(vllm_config, "parallel_config", None)
    get = lambda n: int(getattr(pc, n, 1) or 1)  # noqa: E731
    return (get("tensor_parallel_size"), get("pipeline_parallel_size"),
            get("prefill_context_parallel_size"), get("decode_context_parallel_size"))
