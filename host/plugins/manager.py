"""Build a plugin manager from the `modelhost` entry points, and read what the plugins registered.

Builtins are declared as the distribution's own entry points, so they load through exactly the
same path as third-party plugins and can be blocked the same way (flag or environment variable).
A plugin that fails to import is logged and blocked; it never takes start-up down.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Iterable

import pluggy

from host.plugins import spec
from host.plugins.registry import Registry

log = logging.getLogger(__name__)

BLOCK_ENV = "MODELHOST_BLOCK_PLUGINS"  # comma-separated plugin names


@dataclass
class PluginInfo:
    name: str
    module: str
    distribution: str = ""
    version: str = ""
    status: str = "loaded"  # loaded | blocked | failed
    error: str = ""


@dataclass
class Plugins:
    """The manager plus what was found, for `modelhost plugins` and for load-time lookups."""

    manager: pluggy.PluginManager
    found: list[PluginInfo] = field(default_factory=list)
    registry: Registry = field(default_factory=Registry)


def blocked_from_env() -> set[str]:
    return {n.strip() for n in os.environ.get(BLOCK_ENV, "").split(",") if n.strip()}


def get_plugin_manager(blocked: Iterable[str] = (), extra: Iterable[object] = ()) -> Plugins:
    """A fresh manager with every `modelhost` entry point not blocked, plus `extra` plugin objects.

    `extra` serves embedders and tests that register a plugin object directly.
    """
    pm = pluggy.PluginManager(spec.PROJECT)
    pm.add_hookspecs(spec)
    blocked = set(blocked) | blocked_from_env()
    found: list[PluginInfo] = []
    for ep in sorted(metadata.entry_points(group=spec.PROJECT), key=lambda e: e.name):
        info = PluginInfo(ep.name, ep.value)
        if ep.dist is not None:
            info.distribution, info.version = ep.dist.name, ep.dist.version
        found.append(info)
        if ep.name in blocked or pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
            info.status = "blocked" if ep.name in blocked else "duplicate"
            pm.set_blocked(ep.name)
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken plugin is reported, never fatal
            info.status, info.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("plugin '%s' (%s) failed to load and is blocked: %s", ep.name, ep.value, info.error)
            pm.set_blocked(ep.name)
    for obj in extra:
        name = getattr(obj, "__name__", None) or type(obj).__name__
        if name not in blocked:
            pm.register(obj, name=name)
            found.append(PluginInfo(name, name, status="loaded"))
    pm.check_pending()
    plugins = Plugins(pm, found)
    plugins.registry.plugin_status = {
        i.name: "blocked" if i.status == "blocked" else f"failed to load: {i.error}"
        for i in found if i.status in ("blocked", "failed")}
    _collect(plugins)
    return plugins


def _collect(plugins: Plugins) -> None:
    """Call each registration hook plugin by plugin, so every record knows who made it.

    Each call goes through pluggy (a subset caller holding one plugin's implementation, and
    every hook wrapper), so pluggy's own machinery applies: wrappers, tracing, error reporting.
    """
    pm, registry = plugins.manager, plugins.registry
    for name in ("modelhost_register_backends", "modelhost_register_caches",
                 "modelhost_register_logits_processors"):
        impls = [i for i in getattr(pm.hook, name).get_hookimpls() if not (i.wrapper or i.hookwrapper)]
        for impl in impls:
            others = [i.plugin for i in impls if i.plugin is not impl.plugin]
            registry.current_plugin = impl.plugin_name
            pm.subset_hook_caller(name, remove_plugins=others)(registry=registry)
    registry.current_plugin = "?"
