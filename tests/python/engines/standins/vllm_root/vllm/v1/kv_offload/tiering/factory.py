"""STAND-IN of vLLM's SecondaryTierFactory (register_tier, create), written
from the contract: an unknown type raises; the class is built as
cls(vllm_config=, primary_kv_view=, tier_type=, **params). Not vLLM's code."""

import importlib

STANDIN = True


class SecondaryTierFactory:
    _registry = {}

    @classmethod
    def register_tier(cls, tier_type, module_path, class_name):
        if tier_type in cls._registry:
            raise ValueError("tier type %r is already registered" % tier_type)
        cls._registry[tier_type] = (module_path, class_name)

    @classmethod
    def create(cls, tier_config, vllm_config, primary_kv_view):
        params = dict(tier_config)
        tier_type = params.pop("type")
        if tier_type not in cls._registry:
            raise ValueError("unknown secondary tier type %r" % tier_type)
        module_path, class_name = cls._registry[tier_type]
        tier_cls = getattr(importlib.import_module(module_path), class_name)
        return tier_cls(vllm_config=vllm_config, primary_kv_view=primary_kv_view,
                        tier_type=tier_type, **params)
