"""An entry (a list of buffers) <-> one Redis value, checked strictly on the way back.

A shared Redis is written to by other processes, so a value is data to validate, never code to
run: no pickle. The host decodes and validates each buffer again (`host.cache.codec`).

    magic "MHR1" | count u32 | length u64 * count | buffer * count
"""

from __future__ import annotations

import struct
from typing import Sequence

from host.cache.base import Buffer
from host.cache.codec import CorruptEntryError

MAGIC = b"MHR1"
MAX_BUFFERS = 4096
_HEAD = struct.Struct("<4sI")


def frame(entry: Sequence[Buffer]) -> bytes:
    lengths = [len(memoryview(b).cast("B")) for b in entry]
    return b"".join([_HEAD.pack(MAGIC, len(entry)), struct.pack(f"<{len(entry)}Q", *lengths), *entry])


def unframe(value: bytes) -> list[memoryview]:
    view = memoryview(value)
    if len(view) < _HEAD.size:
        raise CorruptEntryError(f"Redis value of {len(view)} bytes is shorter than an entry header")
    magic, count = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise CorruptEntryError("Redis value is not a modelhost cache entry")
    if count > MAX_BUFFERS:
        raise CorruptEntryError(f"Redis value claims {count} buffers (at most {MAX_BUFFERS})")
    offset = _HEAD.size + 8 * count
    if offset > len(view):
        raise CorruptEntryError("Redis value is shorter than its buffer table")
    lengths = struct.unpack_from(f"<{count}Q", view, _HEAD.size)
    if offset + sum(lengths) != len(view):
        raise CorruptEntryError(
            f"Redis value is {len(view)} bytes, its buffer table says {offset + sum(lengths)}")
    buffers = []
    for length in lengths:
        buffers.append(view[offset:offset + length])
        offset += length
    return buffers
