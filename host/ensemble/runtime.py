"""The host's side of ensembles: how a step finds its model and is sent, and the thread pool
that runs steps which become ready together or on another thread."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from host.core import Host
    from host.inference import InferenceRequest, ResponseCallback
    from host.model import ModelVersion

# Steps waiting in the pool may each wait for a free instance; enough threads that independent
# branches of many requests still run side by side. Threads start only when needed.
POOL_THREADS = 64


class EnsembleRuntime:
    def __init__(self, host: Host) -> None:
        self._host = host
        self.pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="ensemble")
        # A step is a request the host sends itself, through the same stages as a client's
        # (bound once: this is on every step's path).
        self.submit: Callable[[ModelVersion, InferenceRequest, ResponseCallback], None] = host._submit

    def get(self, name: str, version: int) -> ModelVersion:
        """The version a step uses: -1 is the latest ready one, looked up per request."""
        return self._host.manager.get(name, version)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
