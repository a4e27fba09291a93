"""The response cache: the contract for implementations, the key, the entry codec, the builtins."""

from host.cache.base import KEY_BYTES, Entry, ResponseCache

__all__ = ["KEY_BYTES", "Entry", "ResponseCache"]
