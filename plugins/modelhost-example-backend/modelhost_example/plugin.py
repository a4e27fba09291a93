"""The hooks modelhost calls (entry point `example` in group `modelhost`)."""

from __future__ import annotations

from host.api import Registry, hookimpl


@hookimpl
def modelhost_register_backends(registry: Registry) -> None:
    from modelhost_example.backend import ScaleBackend

    registry.add_backend("example", ScaleBackend)
