"""Plugin module of the builtin `local` cache (entry point `local` in group `modelhost`)."""

from __future__ import annotations

from host.plugins.registry import Registry
from host.plugins.spec import hookimpl


@hookimpl
def modelhost_register_caches(registry: Registry) -> None:
    from host.cache.local import LocalCache

    registry.add_cache("local", LocalCache.from_config)
