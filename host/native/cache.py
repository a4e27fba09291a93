"""A native Triton cache library (`libtritoncache_<name>.so`) as a `host.cache.base.ResponseCache`.

- construction: dlopen (RTLD_NOW), then TRITONCACHE_CacheInitialize with the settings as a JSON
  object whose values are strings (what Triton builds from `--cache-config name,key=value`);
- `lookup(key)`: TRITONCACHE_CacheLookup with the key's hex digits as the key string; the cache
  adds its buffers to the entry and calls TRITONCACHE_Copy, which copies them into host memory
  before the call returns. A NOT_FOUND error is a miss;
- `insert(key, entry)`: TRITONCACHE_CacheInsert with an entry of the host's buffers (no copy
  until the cache's TRITONCACHE_Copy writes them into its own memory). A key already present
  (ALREADY_EXISTS) is not an error;
- `close()`: TRITONCACHE_CacheFinalize, then the library is unloaded.

Calls into the library run with the GIL released; the library must be thread-safe, as Triton
requires too.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Sequence

from host.native.bridge import call, lib

log = logging.getLogger(__name__)


class NativeCache:
    def __init__(self, library: Path, config: dict[str, str]) -> None:
        self.library = library
        self._lib = lib()
        settings = json.dumps({str(k): str(v) for k, v in config.items()})
        self._handle = call(self._lib.cache_load, str(library), settings)
        self._closed = threading.Lock()
        log.info("loaded native cache from %s", library)

    def lookup(self, key: bytes) -> list[bytes] | None:
        return call(self._lib.cache_lookup, self._handle, key.hex())

    def insert(self, key: bytes, entry: Sequence[bytes | bytearray | memoryview]) -> None:
        call(self._lib.cache_insert, self._handle, key.hex(), list(entry))

    def close(self) -> None:
        if self._closed.acquire(blocking=False):
            call(self._lib.cache_close, self._handle)
