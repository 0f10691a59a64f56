"""STAND-IN of SGLang's storage backend factory ("dynamic" backends only),
written from the contract: import module_path, take class_name, check
issubclass(cls, HiCacheStorage), build cls(storage_config, {}), then
register_mem_pool_host(pool). An exception is re-raised (the attach fails).
Not SGLang's code."""

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

STANDIN = True


class StorageBackendFactory:
    @staticmethod
    def create_backend(backend_name, storage_config, mem_pool_host):
        if backend_name != "dynamic":
            raise ValueError("the stand-in builds dynamic backends only")
        extra = storage_config.extra_config or {}
        for k in ("backend_name", "module_path", "class_name"):
            if k not in extra:
                raise ValueError("extra config lacks %s" % k)
        cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
        if not issubclass(cls, HiCacheStorage):
            raise TypeError("%s is not a HiCacheStorage" % cls)
        backend = cls(storage_config, {})
        backend.register_mem_pool_host(mem_pool_host)
        return backend
