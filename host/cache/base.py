"""The response-cache contract: what a cache implementation provides to the host.

A cache stores *entries* under *keys* and knows nothing about tensors:

- a key is `KEY_BYTES` (16) bytes, a 128-bit BLAKE2b digest of the request (see `host.cache.key`);
  caches that need a string key use `key.hex()`;
- an entry is a list of buffers (bytes-like), one per output tensor of the response, each already
  encoded by the host (`host.cache.codec`: a small header plus the tensor's raw bytes). The cache
  stores the buffers and gives them back byte for byte; the host validates every buffer it gets
  back, so a cache shared with other processes (Redis) cannot feed the host a malformed entry.

A cache is built by the factory its plugin registers (`registry.add_cache(name, factory)`), called
once at start-up with the `--cache-config name,key=value` settings as `dict[str, str]`. A factory
rejects a bad setting by raising `host.errors.InvalidArgumentError` (the server does not start).

Methods are called from many threads at once (every request thread and every model instance
thread): an implementation must be thread-safe. `lookup` and `insert` should not raise for a
cache that is merely unreachable; if they do raise, the host logs the error (rate-limited) and the
request goes on uncached. This is the shape of Triton's TRITONCACHE API (initialize with a
config, lookup / insert by key, an entry made of buffers, finalize), so a native
`libtritoncache_<name>.so` can be adapted to it (`host.cache.native`).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

# The key length in bytes: a 128-bit digest.
KEY_BYTES = 16

Buffer = bytes | bytearray | memoryview
Entry = Sequence[Buffer]


@runtime_checkable
class ResponseCache(Protocol):
    """What `factory(config)` returns. `close()` is called once when the host stops."""

    def lookup(self, key: bytes) -> Entry | None:
        """The entry stored under `key`, or None on a miss (or when the cache is unreachable)."""

    def insert(self, key: bytes, entry: Entry) -> None:
        """Store `entry` under `key` (replacing any entry there). An entry the cache cannot hold
        (larger than the cache, for example) is dropped, not an error."""

    def close(self) -> None:
        """Release what the cache holds (connections, memory). No call follows."""
