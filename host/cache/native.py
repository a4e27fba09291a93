"""Seam for native Triton caches: `<cache_directory>/<name>/libtritoncache_<name>.so`.

When no plugin registers the cache named by `--cache-config NAME,...`, the host asks
`load_native_cache` for it, as Triton loads its cache libraries. Driving such a library through
the TRITONCACHE C API is `host.native.cache.NativeCache`.
"""

from __future__ import annotations

from pathlib import Path

from host.cache.base import ResponseCache
from host.errors import NotFoundError

# Triton's default --cache-directory.
DEFAULT_CACHE_DIRECTORY = Path("/opt/tritonserver/caches")


def native_library_path(name: str, directory: Path | None) -> Path:
    """Where Triton looks for the cache `name`."""
    return (directory or DEFAULT_CACHE_DIRECTORY) / name / f"libtritoncache_{name}.so"


def load_native_cache(name: str, directory: Path | None, config: dict[str, str]) -> ResponseCache:
    """The native cache `name` built with `config`; NotFoundError when there is no library."""
    path = native_library_path(name, directory)
    if not path.is_file():
        raise NotFoundError(f"no native cache library '{path}'")
    from host.native.cache import NativeCache  # the bridge is loaded only when a library is used

    return NativeCache(path, config)
