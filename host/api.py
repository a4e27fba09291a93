"""The public interface for plugin authors: import from here, not from the modules behind it.

Everything a backend or cache plugin needs, with a stable name: the backend lifecycle classes
(Triton's backend API as Python methods), the request and response types an instance executes,
the hook marker and the registry the registration hooks receive, the batch helpers for backends
that run a batch as one tensor per input, and the error classes (one per transport-neutral code).
docs/plugins.md describes the contracts.
"""

from __future__ import annotations

from host.backend import Backend, BackendFactory, Instance, InstanceSpec, Model, ModelSpec
from host.batch import gather, groups, run_batched, scatter, shape_key
from host.cache.base import Buffer, Entry, ResponseCache
from host.errors import (AlreadyExistsError, CancelledError, Code, HostError, InternalError,
                         InvalidArgumentError, NotFoundError, UnavailableError, UnsupportedError,
                         error_for)
from host.inference import (FINAL, InferenceRequest, InferenceResponse, RequestedOutput,
                            ResponseCallback, Tensor)
from host.plugins.registry import BackendRecord, CacheRecord, LogitsProcessorRecord, Registry
from host.plugins.spec import PROJECT, hookimpl

__all__ = [
    # backend lifecycle
    "Backend", "BackendFactory", "Model", "ModelSpec", "Instance", "InstanceSpec",
    # what an instance executes
    "InferenceRequest", "InferenceResponse", "Tensor", "RequestedOutput", "ResponseCallback", "FINAL",
    # hooks and registries
    "PROJECT", "hookimpl", "Registry", "BackendRecord", "CacheRecord",
    "LogitsProcessorRecord",
    # response caches
    "ResponseCache", "Entry", "Buffer",
    # batch helpers
    "groups", "gather", "scatter", "run_batched", "shape_key",
    # errors
    "Code", "HostError", "InternalError", "NotFoundError", "InvalidArgumentError", "UnavailableError",
    "UnsupportedError", "AlreadyExistsError", "CancelledError", "error_for",
]
