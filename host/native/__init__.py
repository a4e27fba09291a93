"""Native Triton backends and caches, driven through modelhost's own implementation of
Triton's C API (the bridge, `host.native.libtritonserver`, built from `host/native/src`).

- `host.native.bridge`: loads the bridge once (RTLD_GLOBAL, so backend and cache libraries
  resolve their TRITONSERVER_* / TRITONBACKEND_* / TRITONCACHE_* symbols against it) and turns
  what the backends send back into host responses.
- `host.native.backend`: a `libtriton_<name>.so` as a `host.backend.Backend`.
- `host.native.cache`: a `libtritoncache_<name>.so` as a `host.cache.base.ResponseCache`.
- `host.native.metrics`: the backends' own counters and gauges on `/metrics`.
- `host.native.testing`: compile a backend or cache against the bridge's headers.

The headers (`include_dir()`) are installed with the package so that plugin authors and the
tests can compile backends against exactly the API the bridge implements.
"""

from __future__ import annotations

from pathlib import Path


def include_dir() -> Path:
    """The folder to pass as `-I` when compiling a backend or cache against the bridge."""
    return Path(__file__).resolve().parent / "include"
