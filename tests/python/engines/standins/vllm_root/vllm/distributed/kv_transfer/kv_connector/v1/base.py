"""STAND-IN of vLLM's KVConnectorBase_V1 module for the kvpool contract tests,
written from the contract in the project's engine notes (vllm-project/vllm
9aaf83ef; local-inference-lab/vllm 28be48fa), not from vLLM's code. Used
only when vLLM is not importable:
- SupportsHMA: a connector that supports the hybrid KV-cache manager
  implements request_finished_all_groups(request, block_ids per group);
- KVConnectorWorkerMetadata: what a worker-side connector returns from
  build_connector_worker_meta(); the engine aggregates every worker's with
  aggregate() and hands the result to the scheduler-side connector's
  update_connector_output() as connector_output.kv_connector_worker_meta;
- get_required_kvcache_layout is a classmethod, called on the class, and
  raises on the abstract base itself."""

import abc
import enum

STANDIN = True


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    pass


class KVConnectorWorkerMetadata(abc.ABC):
    @abc.abstractmethod
    def aggregate(self, other):
        ...


class SupportsHMA(abc.ABC):
    @abc.abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        ...


def supports_hma(connector):
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
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

    def has_connector_metadata(self):
        return self._connector_metadata is not None

    def build_connector_worker_meta(self):
        return None

    def update_connector_output(self, connector_output):
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout called on the abstract base")
        return None
