"""What to tell a user whose model or cache names a backend or cache that no plugin provides.

The plugins of this project that are distributions of their own are not on a package index: the
command that installs one names its folder in a modelhost checkout. A plugin that is installed
but blocked or broken needs no install, so the hint says which it is instead.
"""

from __future__ import annotations

from host.plugins.registry import Registry

# backend or cache name -> (plugin name, distribution); the folder is plugins/<distribution>
DISTRIBUTIONS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("onnxruntime", "modelhost-onnxruntime"),
    "pytorch": ("pytorch", "modelhost-pytorch"),
    "redis": ("redis", "modelhost-redis-cache"),
}


def install_hint(name: str, registry: Registry) -> str:
    """` (...)` to append to a "no plugin provides NAME" message, or "" for unknown names."""
    if name not in DISTRIBUTIONS:
        return ""
    plugin, dist = DISTRIBUTIONS[name]
    status = registry.plugin_status.get(plugin, "")
    if status == "blocked":
        return (f" (plugin '{plugin}' of {dist} is installed but blocked: remove it from "
                f"--block-plugin and MODELHOST_BLOCK_PLUGINS)")
    if status.startswith("failed"):
        return f" (plugin '{plugin}' of {dist} is installed but {status}; see `modelhost plugins`)"
    return f" (install the plugin from a modelhost checkout: pip install ./plugins/{dist})"
