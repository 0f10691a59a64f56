"""STAND-IN of SGLang's sglang.srt.mem_cache.hicache_storage for the kvpool
contract tests, written from the contract in the project's engine notes
(HiCacheStorage at sgl-project/sglang 8905cbd4), not from SGLang's code.
Used only when the real SGLang is not importable."""

import abc
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

STANDIN = True
STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[list] = None
    extra_info: Optional[dict] = None


class PoolName(str, Enum):
    """Pool names of the v2 interface (hybrid models)."""
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DRAFT = "draft"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, Enum):
    """ALL_PAGES: every page of the KV prefix must exist in the pool;
    TRAILING_PAGES: only the last len(transfer.keys) pages of it."""
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: Any
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[list] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict


class HiCacheStorage(abc.ABC):
    """The five copy-path methods are abstract; the zero-copy and v2 calls
    have defaults that raise; batch_exists loops exists()."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        raise NotImplementedError

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError

    @abc.abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        ...

    @abc.abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        ...

    @abc.abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None):
        ...

    @abc.abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        ...

    @abc.abstractmethod
    def exists(self, key):
        ...

    def batch_exists(self, keys, extra_info=None):
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def clear(self):
        pass

    def get_stats(self):
        return None
