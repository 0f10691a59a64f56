"""STAND-IN of vLLM's KVConnectorBase_V1 module for the kvpool contract tests,
written from the contract in the project's engine notes (vllm-project/vllm
9aaf83ef), not from vLLM's code. Used only when vLLM is not importable."""

import enum

STANDIN = True


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    pass


class KVConnectorBase_V1:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._vllm_config = vllm_config
        self._role = role
        self._kv_cache_config = kv_cache_config
        self._connector_metadata = None

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata
