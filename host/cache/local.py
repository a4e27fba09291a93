"""`local`: an in-process response cache bounded by bytes, least-recently-used eviction.

    --cache-config local,size=1048576

`size` counts the bytes of the stored buffers plus a fixed overhead per entry and per buffer
(`ENTRY_OVERHEAD`, `BUFFER_OVERHEAD`: the key, the bookkeeping), so the cache never holds more
than `size` of what it accounts for. An entry that alone would exceed `size` is not stored: the
insert fails with Triton's text, which the host logs as Triton does ("Failed to insert key ...";
the request stays a miss). One lock guards the table; lookups and inserts are a few
dictionary operations under it, never a copy: buffers are kept and returned as immutable `bytes`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from host.cache.base import KEY_BYTES, Entry
from host.errors import InvalidArgumentError

log = logging.getLogger(__name__)

ENTRY_OVERHEAD = 64 + KEY_BYTES
BUFFER_OVERHEAD = 16
# Triton 2.51's local cache refuses sizes below 192 bytes (its buffer's own header does not fit:
# "Could not initialize buffer ..."); 192 and more start, and a response too large is then
# refused per insert.
MIN_SIZE = 192
INIT_FAILED = "Failed to initialize LocalCache: "  # Triton's prefix for a size it cannot use


def entry_cost(entry: Entry) -> int:
    """What one entry counts against `size`."""
    return ENTRY_OVERHEAD + BUFFER_OVERHEAD * len(entry) + sum(map(len, entry))


class LocalCache:
    """Thread-safe LRU table of key -> tuple of bytes."""

    def __init__(self, size: int) -> None:
        if size < MIN_SIZE:
            raise InvalidArgumentError(
                f"{INIT_FAILED}size {size} is too small: it must be at least {MIN_SIZE} bytes")
        self.size = size
        self.used = 0
        self._table: OrderedDict[bytes, tuple[tuple[bytes, ...], int]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: dict[str, str]) -> LocalCache:
        unknown = sorted(set(config) - {"size"})
        if unknown:
            raise InvalidArgumentError(
                f"unknown local cache setting(s) {', '.join(unknown)} (expected: size)")
        text = config.get("size")
        if text is None:
            raise InvalidArgumentError("the local cache needs a size: --cache-config local,size=BYTES")
        try:
            size = int(text)
        except ValueError:
            raise InvalidArgumentError(f"{INIT_FAILED}size '{text}' is not an integer") from None
        return cls(size)

    def lookup(self, key: bytes) -> Entry | None:
        with self._lock:
            found = self._table.get(key)
            if found is None:
                return None
            self._table.move_to_end(key)
            return found[0]

    def insert(self, key: bytes, entry: Entry) -> None:
        buffers = tuple(map(bytes, entry))  # bytes(b) is b itself for bytes: no copy
        cost = entry_cost(buffers)
        if cost > self.size:  # Triton's text; the host logs it as a failed insert
            raise InvalidArgumentError(
                f"Requested byte_size: {cost} is greater than total cache size: {self.size}")
        with self._lock:
            old = self._table.pop(key, None)
            if old is not None:
                self.used -= old[1]
            while self.used + cost > self.size:
                _, (_, evicted) = self._table.popitem(last=False)
                self.used -= evicted
            self._table[key] = (buffers, cost)
            self.used += cost

    def __len__(self) -> int:
        return len(self._table)

    def close(self) -> None:
        with self._lock:
            self._table.clear()
            self.used = 0
