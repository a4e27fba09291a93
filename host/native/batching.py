"""A custom batching strategy library run for a model (see host.batch_strategy for which library,
and host/native/src/batching.c for the calls): with a native model's own TRITONBACKEND_Model, or
one the bridge makes for a model of another backend (`load_for_model`).

Errors of the per-batch functions are logged with Triton's texts and change nothing else: an
include that fails counts as "not included" (Triton's default), as in Triton.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from host.backend import BatchStrategy, ModelSpec
from host.inference import InferenceRequest

log = logging.getLogger(__name__)


class NativeBatchStrategy(BatchStrategy):
    def __init__(self, lib: Any, handle: Any, model_name: str, owned: tuple[Any, Any] | None = None) -> None:
        self._lib, self._handle, self._name = lib, handle, model_name
        self._owned = owned  # (model, placeholder backend) made for it by `load_for_model`

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
        if self._owned is not None:
            model, backend = self._owned
            self._owned = None
            self._lib.model_free(model)
            self._lib.backend_unload(backend)


def load_for_model(spec: ModelSpec, path: Path) -> BatchStrategy | None:
    """The strategy library at `path` for a model whose backend is not a native library (the
    python backend, a plugin): Triton runs a strategy for a model of any backend, and the
    library asks the TRITONBACKEND_Model about it (its name, configuration, parameters), so the
    bridge makes one (under a placeholder backend of the model's backend name) for the strategy
    alone. Requests reach the include function as for a native model."""
    from host.config import config_to_json
    from host.native.bridge import call, lib as bridge

    lib = bridge()
    name = spec.backend or spec.config.backend or spec.config.platform
    config = json.dumps(config_to_json(spec.config))
    backend = lib.backend_placeholder(name, str(spec.path), "{}")
    model = lib.model_new(backend, spec.name, spec.version, str(spec.path), config,
                          [o.name for o in spec.config.output], spec.decoupled)
    try:
        handle = call(lib.strategy_load, model, str(path))
    except BaseException:
        lib.model_free(model)
        lib.backend_unload(backend)
        raise
    if handle is None:
        lib.model_free(model)
        lib.backend_unload(backend)
        return None
    return NativeBatchStrategy(lib, handle, spec.name, owned=(model, backend))
