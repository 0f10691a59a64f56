"""STAND-IN of vLLM's KVConnectorFactory, written from the contract: the
kv_connector_module_path wins over the registry, and a class whose
__init__ lacks the kv_cache_config keyword is refused; it is built as
cls(vllm_config, role, kv_cache_config). Not vLLM's code."""

import importlib
import inspect

STANDIN = True


class KVConnectorFactory:
    @staticmethod
    def create_connector(vllm_config, role, kv_cache_config=None):
        ktc = vllm_config.kv_transfer_config
        if not ktc.kv_role:
            raise ValueError("kv_role is required")
        mod = importlib.import_module(ktc.kv_connector_module_path)
        cls = getattr(mod, ktc.kv_connector)
        if "kv_cache_config" not in inspect.signature(cls.__init__).parameters:
            raise TypeError("%s.__init__ lacks kv_cache_config" % cls.__name__)
        return cls(vllm_config, role, kv_cache_config)
