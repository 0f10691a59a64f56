"""What kvpool.vllm's tier and connector share: vLLM block hashes as kvpool
keys, and the parts of a namespace read from vLLM's configuration.
Internal: the names may change."""

import hashlib
import logging

from .._adapters import config as _cfg
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
    """(model, kv dtype) parts of a namespace. The model is the `model`
    setting, else what vLLM loaded: model_config.model (the path or hub
    id, not the served name, which two deployments of different weights
    may share) and, when set, model_config.revision after an '@'."""
    mc = getattr(vllm_config, "model_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    model = params.get("model")
    if not model:
        model = getattr(mc, "model", None) or getattr(mc, "served_model_name", None) or \
            "unknown-model"
        if isinstance(model, (list, tuple)):
            model = model[0]
        revision = getattr(mc, "revision", None)
        if isinstance(revision, str) and revision:
            model = "%s@%s" % (model, revision)
    dtype = params.get("kv_dtype") or getattr(cc, "cache_dtype", None) or "auto"
    if dtype == "auto":
        dtype = str(getattr(mc, "dtype", "auto"))
    return str(model), str(dtype).replace("torch.", "")


def _parallel(vllm_config):
    pc = getattr(vllm_config, "parallel_config", None)
    get = lambda n: int(getattr(pc, n, 1) or 1)  # noqa: E731
    return (get("tensor_parallel_size"), get("pipeline_parallel_size"),
            get("prefill_context_parallel_size"), get("decode_context_parallel_size"))


def _parallel_state_rank(tp):
    """pp rank * tp + tp rank from vLLM's initialised model-parallel groups
    (a worker), or None where they are not there (the scheduler, tests)."""
    ready = _import("vllm.distributed.parallel_state", "model_parallel_is_initialized")
    tp_rank = _import("vllm.distributed.parallel_state", "get_tensor_model_parallel_rank")
    pp_group = _import("vllm.distributed.parallel_state", "get_pp_group")
    try:
        if ready is None or ready() is not True:
            return None
        t, p = tp_rank(), pp_group().rank_in_group
    except Exception:
        return None
    if isinstance(t, int) and isinstance(p, int) and not isinstance(t, bool):
        return p * tp + t
    return None


def worker_rank(vllm_config, configured=None, who="kvpool.vllm"):
    """This process's rank in its vLLM instance, 0 .. tp*pp-1: from vLLM's
    model-parallel groups when initialised, else parallel_config.rank (which
    vLLM's WorkerBase sets to the worker's rank; 0 in the scheduler).

    `configured` is a "rank" setting: vLLM hands every worker the same
    kv_connector_extra_config, so a rank there names one worker for all of
    them and two ranks would write one namespace. It is refused
    (ConfigError) unless it equals the rank vLLM gives this process.
    ConfigError too for a rank outside 0 .. tp*pp-1."""
    tp, pp, _, _ = _parallel(vllm_config)
    rank = _parallel_state_rank(tp)
    if rank is None:
        pc = getattr(vllm_config, "parallel_config", None)
        rank = getattr(pc, "rank", 0)
        rank = 0 if rank is None else rank
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise _cfg.ConfigError("%s: vLLM's parallel_config.rank %r is not a rank"
                                   % (who, rank))
    if not 0 <= rank < tp * pp:
        raise _cfg.ConfigError("%s: rank %d is outside 0..%d (tensor parallel %d x pipeline "
                               "parallel %d)" % (who, rank, tp * pp - 1, tp, pp))
    if configured is not None:
        want = _cfg.integer(configured, who, "rank", 0, 0)
        if want != rank:
            raise _cfg.ConfigError(
                "%s: rank %d in kv_connector_extra_config disagrees with this worker's rank "
                "%d from vLLM: vLLM gives every worker the same extra config, so a rank there "
                "would make workers write each other's namespace; remove \"rank\" (the rank "
                "comes from vLLM)" % (who, want, rank))
    return rank
