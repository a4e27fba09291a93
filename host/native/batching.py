"""A custom batching strategy library run for a native model (see host.batch_strategy for which
library, and host/native/src/batching.c for the calls).

Errors of the per-batch functions are logged with Triton's texts and change nothing else: an
include that fails counts as "not included" (Triton's default), as in Triton.
"""

from __future__ import annotations

import logging
from typing import Any

from host.backend import BatchStrategy
from host.inference import InferenceRequest

log = logging.getLogger(__name__)


class NativeBatchStrategy(BatchStrategy):
    def __init__(self, lib: Any, handle: Any, model_name: str) -> None:
        self._lib, self._handle, self._name = lib, handle, model_name

    def begin(self) -> int:
        userp, error = self._lib.strategy_begin(self._handle)
        if error is not None:
            log.error("Custom batching initialization function failed for model %s: %s",
                      self._name, error)
        return int(userp)

    def include(self, userp: int, request: InferenceRequest) -> bool:
        try:
            included, error = self._lib.strategy_include(self._handle, userp, request)
        except Exception as exc:  # noqa: BLE001 - a request the bridge cannot wrap
            included, error = False, str(exc) or type(exc).__name__
        if error is not None:
            log.error("Custom batching include function failed for model %s: %s", self._name, error)
        return bool(included)

    def end(self, userp: int) -> None:
        error = self._lib.strategy_end(self._handle, userp)
        if error is not None:
            log.error("Custom batching finalization function failed for model %s: %s",
                      self._name, error)

    def close(self) -> None:
        error = self._lib.strategy_unload(self._handle)
        if error is not None:
            log.error("Custom batcher finalization failed for model %s: %s", self._name, error)
