"""STAND-IN of vLLM's KVConnectorFactory, written from the contract: the
kv_connector_module_path wins over the registry, and a class whose
__init__ lacks the kv_cache_config keyword is refused; with the hybrid
KV-cache manager on (scheduler_config.disable_hybrid_kv_cache_manager
False) a class that is not SupportsHMA is refused; it is built as
cls(vllm_config, role, kv_cache_config). Not vLLM's code."""

import importlib
import inspect

from .v1.base import supports_hma

STANDIN = True


class KVConnectorFactory:
    @staticmethod
    def get_connector_class(ktc):
        mod = importlib.import_module(ktc.kv_connector_module_path)
        return getattr(mod, ktc.kv_connector)

    @classmethod
    def create_connector(cls, vllm_config, role, kv_cache_config=None):
        ktc = vllm_config.kv_transfer_config
        if not ktc.kv_role:
            raise ValueError("kv_role is required")
        conn = cls.get_connector_class(ktc)
        if "kv_cache_config" not in inspect.signature(conn.__init__).parameters:
            raise TypeError("%s.__init__ lacks kv_cache_config" % conn.__name__)
        sc = getattr(vllm_config, "scheduler_config", None)
        if sc is not None and getattr(sc, "disable_hybrid_kv_cache_manager", True) is False \
                and not supports_hma(conn):
            raise ValueError("Connector %s does not support HMA but HMA is enabled"
                             % conn.__name__)
        return conn(vllm_config, role, kv_cache_config)
