"""STAND-IN of vLLM's vllm.v1.kv_offload.tiering.base for the kvpool contract
tests, written from the contract in the project's engine notes (tiering at
vllm-project/vllm 9aaf83ef), not from vLLM's code. Used only when the real
vLLM is not importable."""

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

STANDIN = True


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None


@dataclass
class JobMetadata:
    job_id: int
    keys: list
    block_ids: np.ndarray
    is_promotion: bool = False
    req_context: Any = None


@dataclass
class JobResult:
    job_id: int
    success: bool


class SecondaryTierManager(abc.ABC):
    @abc.abstractmethod
    def lookup(self, key, req_context):
        ...

    @abc.abstractmethod
    def submit_store(self, job):
        ...

    @abc.abstractmethod
    def submit_load(self, job):
        ...

    @abc.abstractmethod
    def get_finished(self):
        ...

    def touch(self, keys, req_context):
        return None

    def shutdown(self):
        return None
