"""Plugin module (entry point `redis` in group `modelhost`): registers the `redis` cache."""

from __future__ import annotations

from host.plugins import Registry, hookimpl


@hookimpl
def modelhost_register_caches(registry: Registry) -> None:
    from modelhost_redis_cache.cache import RedisCache

    registry.add_cache("redis", RedisCache.from_config)
