"""Plugin module (entry point `pytorch` in group `modelhost`)."""

from __future__ import annotations

from host.plugins.registry import Registry
from host.plugins.spec import hookimpl


@hookimpl
def modelhost_register_backends(registry: Registry) -> None:
    # torch itself is imported when the first model loads, not at start-up.
    from modelhost_pytorch.backend import PyTorchBackend

    registry.add_backend("pytorch", PyTorchBackend)
