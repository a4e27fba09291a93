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

import numpy as np

from host.errors import InternalError, InvalidArgumentError

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
        self.buffer = np.frombuffer(_map_window(name, key, offset, byte_size), dtype=np.uint8,
                                    count=byte_size, offset=offset)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _map_window(name: str, key: str, offset: int, byte_size: int) -> mmap.mmap:
    entry = key[1:] if key.startswith("/") else key
    if not _KEY.fullmatch(key) or entry in (".", ".."):
        raise _open_error(key)
    try:
        dir_fd = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise _open_error(key) from None
    try:
        fd = os.open(entry, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
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
        return mmap.mmap(fd, end, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        raise _open_error(key) from None
    finally:
        os.close(fd)
