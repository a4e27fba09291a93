"""System (POSIX) shared-memory regions: a window of a client's `/dev/shm` object, mapped once.

The host only ever opens the object the client created: it never creates, unlinks, truncates or
resizes it, so the client's region outlives the server. The key must name a POSIX shared-memory
object and nothing else (no path separators, no '..', no symlinks), so a register request cannot
reach any other file.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import weakref

import numpy as np

from host.errors import InternalError, InvalidArgumentError

try:  # the SIGBUS guard (host/shm/_guard.c); without a compiled one, the size checks alone
    from host.shm import _guard  # type: ignore[attr-defined]  # compiled: mypy sees no source
except ImportError:  # pragma: no cover - an installation built without a C compiler
    _guard = None

SHM_DIR = "/dev/shm"
# shm_open(3): an optional leading '/', then a name with no further '/', at most NAME_MAX bytes.
_KEY = re.compile(r"/?[^/\x00]{1,255}")


def _open_error(key: str) -> InternalError:
    return InternalError(f"Unable to open shared memory region: '{key}'")  # Triton: INTERNAL


class SystemRegion:
    kind = "system"

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.device_id = -1
        self.users, self.pending = 0, False  # requests using it; unregistered while in use
        # One byte view of the window: tensor views are slices of it (no copies, no new mappings).
        # The mapping lives exactly as long as something refers to it: the registry until
        # unregister, and every in-flight request through its views, so there is no close().
        mapping, self._fd = _map_window(name, key, offset, byte_size)
        self.buffer = np.frombuffer(mapping, dtype=np.uint8, count=byte_size, offset=offset)
        # A shrink that races the size check faults on a zero page instead of killing the
        # process, and marks the region (see _guard.c).
        self._guard = _guard.guard(self.buffer.ctypes.data - offset, offset + byte_size) \
            if _guard is not None else -1
        # The object stays open, and the guard in place, while the mapping lives: as long as the
        # registry or any in-flight request's view refers to it.
        weakref.finalize(mapping, _release, self._fd, self._guard)

    def check_size(self) -> None:
        """Refuse an access when the client shrank the object under the mapping (ftruncate):
        touching a page past the object's end would kill the process with SIGBUS."""
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            size = -1
        if size < self.offset + self.byte_size or self.faulted():
            raise InvalidArgumentError(
                f"shared memory region '{self.name}' is no longer usable: its object '{self.key}' "
                f"shrank to {max(size, 0)} bytes after it was registered with offset {self.offset} "
                f"and byte_size {self.byte_size}; unregister it and register it again")

    def faulted(self) -> bool:
        """Whether an access to the region hit a part the client had truncated away."""
        return self._guard >= 0 and _guard is not None and _guard.faulted(self._guard)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _release(fd: int, slot: int) -> None:
    os.close(fd)
    if slot >= 0 and _guard is not None:
        _guard.unguard(slot)


def _map_window(name: str, key: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    entry = key[1:] if key.startswith("/") else key
    if not _KEY.fullmatch(key) or entry in (".", ".."):
        raise _open_error(key)
    try:
        dir_fd = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise _open_error(key) from None
    try:
        fd = os.open(entry, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        # Triton's text first (clients match it), then why: most often the client is elsewhere
        raise InternalError(
            f"Unable to open shared memory region: '{key}': no such object in {SHM_DIR} on the "
            f"server's host. System shared memory works only for a client on the same host as "
            f"the server (sharing its {SHM_DIR}: not across machines, pods or load-balanced "
            f"replicas); send the tensors in the request instead") from None
    except OSError:
        raise _open_error(key) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        end = offset + byte_size
        if not stat.S_ISREG(info.st_mode):
            raise _open_error(key)
        if end > info.st_size:
            raise InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args")
        if byte_size == 0:  # Triton's mmap of 0 bytes fails with EINVAL, and says so this way
            raise InvalidArgumentError(f"failed to register shared memory region '{name}': "
                                       "unable to process address spaceInvalid argument")
        # Map from the object's start: mmap offsets must be page aligned, region offsets need not be.
        mapping = mmap.mmap(fd, end, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise _open_error(key) from None
        raise
    return mapping, fd
