"""kvpool for vLLM: a secondary tier of the offloading tiering manager
(KVPoolSecondaryTier, kvpool.vllm.tier) and a KV connector
(KVPoolConnector, kvpool.vllm.connector). Both are reached by this
package's name, which vLLM's configuration uses:

    secondary_tiers: [{"type": "kvpool", ...}]      (after register())
    "kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm"

register() is the vllm.general_plugins entry point (kvpool.vllm:register)
that registers the "kvpool" tier type. See docs/engines.md.
"""

from ._keys import DEFAULT_LEASE_MS, DEFAULT_URL, block_key
from .connector import (INTERFACE_CONNECTOR, USING_REAL_CONNECTOR_BASE, KVConnectorBase_V1,
                        KVPoolConnector, KVPoolConnectorMetadata)
from .tier import (INTERFACE_TIER, TIER_TYPE, USING_REAL_TIER_BASE, JobResult,
                   KVPoolSecondaryTier, SecondaryTierManager, register)

__all__ = ["KVPoolSecondaryTier", "KVPoolConnector", "KVPoolConnectorMetadata", "register",
           "block_key", "USING_REAL_TIER_BASE", "USING_REAL_CONNECTOR_BASE", "TIER_TYPE",
           "INTERFACE_TIER", "INTERFACE_CONNECTOR", "JobResult", "SecondaryTierManager",
           "KVConnectorBase_V1", "DEFAULT_URL", "DEFAULT_LEASE_MS"]
