"""Plugin module of the builtin "inflight" backend (entry point `inflight` in group `modelhost`).

Registering it imports nothing heavy: PyTorch is imported when a model using the backend loads,
and its absence fails that model alone, with a message saying what to install."""

from __future__ import annotations

from host.plugins.registry import Registry
from host.plugins.spec import hookimpl


@hookimpl
def modelhost_register_backends(registry: Registry) -> None:
    from host.backends.inflight.backend import InflightBackend

    # the registry is filled by every plugin before any model loads: the backend reads the
    # logits processors from it when a model is created
    registry.add_backend("inflight", lambda name: InflightBackend(name, registry.logits_processors))
