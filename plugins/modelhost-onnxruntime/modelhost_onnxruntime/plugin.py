"""Plugin module (entry point `onnxruntime` in group `modelhost`)."""

from __future__ import annotations

from host.plugins.registry import Registry
from host.plugins.spec import hookimpl


@hookimpl
def modelhost_register_backends(registry: Registry) -> None:
    # onnxruntime itself is imported when the first model loads, not at start-up.
    from modelhost_onnxruntime.backend import OnnxRuntimeBackend

    registry.add_backend("onnxruntime", OnnxRuntimeBackend)
