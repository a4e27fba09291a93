"""Plugin system: hook specifications, the entry-point manager and the registry of records."""

from host.plugins.manager import Plugins, PluginInfo, get_plugin_manager
from host.plugins.registry import BackendRecord, CacheRecord, Registry
from host.plugins.spec import hookimpl, hookspec

__all__ = ["BackendRecord", "CacheRecord", "PluginInfo", "Plugins", "Registry",
           "get_plugin_manager", "hookimpl", "hookspec"]
