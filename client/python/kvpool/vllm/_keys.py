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


# spellings of one KV format (vLLM's cache_config.cache_dtype values,
# torch dtype names, common short forms); vLLM documents fp8 as fp8_e4m3
_FORMAT_ALIASES = {"half": "float16", "fp16": "float16", "f16": "float16",
                   "bf16": "bfloat16", "float": "float32", "fp32": "float32",
                   "f32": "float32", "fp8": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
                   "float8_e5m2": "fp8_e5m2"}


def kv_format(name):
    """A KV dtype or format (a string or a torch dtype) in one spelling:
    "float16", "bfloat16", "fp8_e4m3", ...; None for None and "auto"."""
    if name is None:
        return None
    s = str(name).strip().lower().replace("torch.", "")
    if not s or s == "auto":
        return None
    return _FORMAT_ALIASES.get(s, s)


def running_kv_dtype(vllm_config, spec_dtype=None):
    """(the KV dtype part vLLM really runs, where it was read) or (None,
    None) when vLLM's configuration does not say: cache_config.cache_dtype
    (--kv-cache-dtype) unless "auto", else the KV-cache spec's dtype
    (spec_dtype, from kv_cache_config), else model_config.dtype unless
    "auto". As written by vLLM (not kv_format's spelling), so namespaces
    keep their names."""
    cc = getattr(vllm_config, "cache_config", None)
    mc = getattr(vllm_config, "model_config", None)
    fmt = str(getattr(cc, "cache_dtype", None) or "auto").replace("torch.", "")
    if fmt != "auto":
        return fmt, "--kv-cache-dtype"
    if spec_dtype is not None:
        return str(spec_dtype).replace("torch.", ""), "the KV-cache spec's dtype"
    dtype = str(getattr(mc, "dtype", None) or "auto").replace("torch.", "")
    if dtype != "auto":
        return dtype, "the model's dtype (--dtype)"
    return None, None


def kv_dtype_part(running, params, who):
    """The namespace's KV dtype part: `running` ((dtype, source) from
    running_kv_dtype) when vLLM says what it runs, else the kv_dtype
    setting, else "auto". A kv_dtype that names another format than the
    one vLLM runs raises ConfigError: a copied configuration must not put
    one instance's bytes in another format's namespace (or two formats'
    bytes in one)."""
    dtype, source = running if running else (None, None)
    setting = params.get("kv_dtype")
    if setting is not None and str(setting) != "" and dtype is not None and \
            kv_format(setting) != kv_format(dtype):
        raise _cfg.ConfigError(
            "%s: kv_dtype %r contradicts the KV cache vLLM runs (%s, from %s): the "
            "namespace takes the KV format from vLLM; remove kv_dtype from the "
            "configuration (or set it to %r)" % (who, str(setting), dtype, source, dtype))
    if dtype is not None:
        return dtype
    return str(setting).replace("torch.", "") if setting else "auto"


def _model_dtype(vllm_config, params, spec_dtype=None, who="kvpool.vllm"):
    """(model, kv dtype) parts of a namespace. The model is the `model`
    setting, else what vLLM loaded: model_config.model (the path or hub
    id, not the served name, which two deployments of different weights
    may share) and, when set, model_config.revision after an '@'. The kv
    dtype is what vLLM runs (kv_dtype_part; ConfigError for a kv_dtype
    that contradicts it)."""
    mc = getattr(vllm_config, "model_config", None)
    model = params.get("model")
    if not model:
        model = getattr(mc, "model", None) or getattr(mc, "served_model_name", None) or \
            "unknown-model"
        if isinstance(model, (list, tuple)):
            model = model[0]
        revision = getattr(mc, "revision", None)
        if isinstance(revision, str) and revision:
            model = "%s@%s" % (model, revision)
    dtype = kv_dtype_part(running_kv_dtype(vllm_config, spec_dtype), params, who)
    return str(model), dtype


# model_config fields that change the K and V one checkpoint produces
# (checked against local-inference-lab/vllm 28be48fa's ModelConfig):
# hf_overrides (rope scaling such as YaRN: K is cached after RoPE),
# quantization (online-quantized projections), hf_config_path (another
# config for the same weights), model_impl (another implementation),
# code_revision (other remote code), disable_sliding_window and
# override_attention_dtype. vLLM's own model_config.compute_hash() is not
# used: it leaves hf_overrides out and takes in options that do not change
# K/V (max_model_len, max_logprobs, generation_config, ...), which would
# split instances that can share blocks.
_KV_FACTORS = ("hf_overrides", "quantization", "hf_config_path", "model_impl",
               "code_revision", "disable_sliding_window", "override_attention_dtype")
_DEFAULTS = (None, False, "", "auto", {}, [])


def _stable(x):
    """x as JSON-able data that is the same in every process: a callable
    (hf_overrides may be a function) by its qualified name, an enum by its
    value, anything else unknown by its type's name and str()."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):
        return {str(k): _stable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [_stable(v) for v in x]
        return sorted(items, key=repr) if isinstance(x, (set, frozenset)) else items
    if callable(x):
        return "%s.%s" % (getattr(x, "__module__", ""), getattr(x, "__qualname__", ""))
    value = getattr(x, "value", None)
    if value is not None and type(x).__module__ != "builtins":
        return _stable(value)
    return "%s:%s" % (type(x).__name__, x)


def kv_options_part(vllm_config):
    """"" for a model run as its checkpoint says, else "kvo" and 12 hex
    digits of the SHA-256 of the model options in _KV_FACTORS that differ
    from their defaults, so instances that compute other K/V from one
    checkpoint never share blocks. The same in every process and rank (it
    reads only vllm_config)."""
    import json
    mc = getattr(vllm_config, "model_config", None)
    factors = {}
    for name in _KV_FACTORS:
        v = getattr(mc, name, None)
        if any(v is d or (type(v) is type(d) and v == d) for d in _DEFAULTS):
            continue
        factors[name] = _stable(v)
    if not factors:
        return ""
    blob = json.dumps(factors, sort_keys=True, default=str).encode()
    return "kvo" + hashlib.sha256(blob).hexdigest()[:12]


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
