"""kvpool for LMCache: the multiprocess-mode native L2 plugin
(KVPoolL2Plugin, kvpool.lmcache.l2_plugin) and the non-MP remote storage
plugin (KVPoolConnectorAdapter / KVPoolRemoteConnector,
kvpool.lmcache.remote). Both are reached by this package's name, which
LMCache's configuration uses ("module_path": "kvpool.lmcache").
See docs/engines.md.
"""

from .l2_plugin import INTERFACE_MP, KVPoolL2Plugin
from .remote import (INTERFACE_REMOTE, USING_REAL_BASE, ConnectorAdapter,
                     KVPoolConnectorAdapter, KVPoolRemoteConnector, RemoteConnector)

__all__ = ["KVPoolL2Plugin", "KVPoolConnectorAdapter", "KVPoolRemoteConnector",
           "USING_REAL_BASE", "INTERFACE_MP", "INTERFACE_REMOTE", "ConnectorAdapter",
           "RemoteConnector"]
