"""Hook specifications: what a modelhost plugin can implement.

Plugins are modules named by entry points in the `modelhost` group (builtins included). Each hook
receives a registry object to add to, rather than returning lists (as tox does), so a plugin can
register several things and the host can tell who registered what.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from host.plugins.registry import Registry

PROJECT = "modelhost"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- start-up ----------------------------------------------------------------------------------

@hookspec
def modelhost_register_backends(registry: Registry) -> None:
    """Register backend factories with `registry.add_backend(name, factory)`.

    Called once per plugin manager, at start-up, for every plugin. `factory(name)` returns a
    `host.backend.Backend`; it is called when the first model using the backend loads.
    Two plugins adding the same backend name is an error that names both.
    """


@hookspec
def modelhost_register_caches(registry: Registry) -> None:
    """Register response-cache factories with `registry.add_cache(name, factory)`.

    Called once per plugin manager, at start-up. `factory(config: dict[str, str])` returns a cache.
    """


@hookspec
def modelhost_register_logits_processors(registry: Registry) -> None:
    """Register logits post-processors with `registry.add_logits_processor(name, fn)`.

    Called once per plugin manager, at start-up. `fn(request_id, logits, beam_tokens, client_id)
    -> logits` (the batch manager's LogitsPostProcessor, docs/llm.md) runs on an "inflight"
    model's worker thread for each request of a model whose config names it
    (`logits_post_processor` parameter), or whose request names it (the same request parameter).
    A processor that raises fails only the request it ran for.
    """


# --- notifications -----------------------------------------------------------------------------

@hookspec
def modelhost_startup(host: Any) -> None:
    """Called once the host has loaded its initial models and is about to serve."""


@hookspec
def modelhost_shutdown(host: Any) -> None:
    """Called once when the host stops, after every model was unloaded."""


@hookspec
def modelhost_model_state(name: str, version: int, state: str, reason: str) -> None:
    """Called whenever a model version changes state (LOADING, READY, UNLOADING, UNAVAILABLE)."""
