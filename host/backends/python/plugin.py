"""Plugin module of the builtin "python" backend (entry point `python` in group `modelhost`)."""

from __future__ import annotations

from host.plugins.registry import Registry
from host.plugins.spec import hookimpl


@hookimpl
def modelhost_register_backends(registry: Registry) -> None:
    from host.backends.python.backend import PythonBackend

    registry.add_backend("python", PythonBackend)
