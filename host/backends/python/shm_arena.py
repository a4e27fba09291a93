"""A POSIX shared-memory arena for the tensors of a python model instance that runs in its own process.

The host creates two arenas per instance (`host.backends.python.process`): one it writes input
tensors into, one the child writes output tensors into. Each side allocates only in the arena it
writes; the reader sees a tensor as a numpy view of the mapped memory, without a copy. Blocks are
given back by the side that allocated them, when told (inputs: at the request's final response;
outputs: when the host's last view of them is garbage-collected, see `Arena.view`).

A tensor is described on the control channel by a small tuple (`TensorRef`): where its bytes are
(`("a", offset, nbytes)` in the writer's arena, or `("i", raw bytes)` inline when the arena is
full) plus datatype and shape. BYTES tensors travel in Triton's serialized form (each element a
4-byte little-endian length, then its bytes), so they cross through the arena too; the reader
rebuilds the object array of `bytes` (Python objects cannot live in shared memory).

Linux only: the arena is a file under /dev/shm, unlinked as soon as both processes mapped it, so a
crash of either side leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from host import datatypes

ALIGN = 64  # every block starts on a cache line (and on any dtype's alignment)
SHM_DIR = "/dev/shm"

# (datatype, shape, location): location is ("a", offset, nbytes) or ("i", bytes)
TensorRef = tuple[str, tuple[int, ...], tuple[Any, ...]]


def _round(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


class Arena:
    """One mapped shared-memory file with a first-fit allocator (used by its writer only)."""

    def __init__(self, name: str, size: int, mm: mmap.mmap) -> None:
        self.name = name
        self.size = size
        self.mm = mm
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted (offset, length)
        self._used: dict[int, int] = {}  # offset -> length

    # --- creation ---

    @classmethod
    def create(cls, size: int, label: str = "") -> Arena:
        name = f"modelhost_{os.getpid()}_{label}_{secrets.token_hex(4)}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mm)

    @classmethod
    def attach(cls, name: str, size: int) -> Arena:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mm)

    def unlink(self) -> None:
        """Remove the name (the mappings stay valid until both sides drop them)."""
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass

    # --- allocation (writer side) ---

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a free block of `nbytes`, or None when the arena has no room."""
        need = _round(nbytes)
        with self._lock:
            for i, (off, length) in enumerate(self._free):
                if length >= need:
                    if length == need:
                        del self._free[i]
                    else:
                        self._free[i] = (off + need, length - need)
                    self._used[off] = need
                    return off
        return None

    def free(self, offset: int) -> None:
        with self._lock:
            length = self._used.pop(offset, None)
            if length is None:
                return
            free = self._free
            # insert sorted, then merge with the neighbours
            lo, hi = 0, len(free)
            while lo < hi:
                mid = (lo + hi) // 2
                if free[mid][0] < offset:
                    lo = mid + 1
                else:
                    hi = mid
            free.insert(lo, (offset, length))
            if lo + 1 < len(free) and offset + length == free[lo + 1][0]:
                free[lo] = (offset, length + free[lo + 1][1])
                del free[lo + 1]
            if lo > 0 and free[lo - 1][0] + free[lo - 1][1] == offset:
                free[lo - 1] = (free[lo - 1][0], free[lo - 1][1] + free[lo][1])
                del free[lo]

    def in_use(self) -> int:
        with self._lock:
            return sum(self._used.values())

    # --- tensors ---

    def write(self, datatype: str, array: np.ndarray) -> tuple[TensorRef, int | None]:
        """Put a tensor where the other side can read it: (its ref, the arena offset or None)."""
        shape = tuple(int(d) for d in array.shape)
        if datatype == "BYTES":
            payload = serialize_bytes(array)
            nbytes = len(payload)
        else:
            array = np.ascontiguousarray(array)
            payload = None
            nbytes = array.nbytes
        offset = self.alloc(nbytes) if nbytes else None
        if offset is None:  # full (or empty): send the bytes inline, a copy through the socket
            data = payload if payload is not None else array.tobytes()
            return (datatype, shape, ("i", data)), None
        dest = np.frombuffer(self.mm, dtype=np.uint8, count=nbytes, offset=offset)
        if payload is not None:
            dest[:] = np.frombuffer(payload, dtype=np.uint8)
        else:
            dest[:] = array.reshape(-1).view(np.uint8)
        return (datatype, shape, ("a", offset, nbytes)), offset

    def view(self, ref: TensorRef, on_release: Callable[[int], None] | None = None) -> np.ndarray:
        """The tensor `ref` describes, as a numpy view of this (the writer's) arena.

        `on_release(offset)` is called once no array viewing the block is alive any more.
        """
        datatype, shape, loc = ref
        if loc[0] == "i":
            raw = loc[1]
            if datatype == "BYTES":
                return deserialize_bytes(raw, shape)
            return np.frombuffer(raw, dtype=datatypes.to_numpy(datatype)).reshape(shape).copy()
        _, offset, nbytes = loc
        # A ctypes block is the buffer's owner: every numpy view made from it keeps it alive,
        # so its finalizer runs when the last view is gone (numpy collapses view chains).
        block = (ctypes.c_char * nbytes).from_buffer(self.mm, offset)
        if datatype == "BYTES":
            array = deserialize_bytes(memoryview(block), shape)
            if on_release is not None:
                on_release(offset)  # the elements were copied out
            return array
        if on_release is not None:
            weakref.finalize(block, on_release, offset)
        return np.frombuffer(block, dtype=datatypes.to_numpy(datatype)).reshape(shape)

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:
            pass  # views still alive: the mapping goes with them


def serialize_bytes(array: np.ndarray) -> bytes:
    return datatypes.serialize_bytes(np.asarray(array, dtype=object).reshape(-1))


def deserialize_bytes(raw: Any, shape: tuple[int, ...]) -> np.ndarray:
    return datatypes.bytes_array(
        datatypes.deserialize_bytes(memoryview(raw).cast("B"), datatypes.element_count(shape)), shape)
