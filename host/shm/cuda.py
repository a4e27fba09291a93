"""CUDA shared-memory regions: a client's device allocation, opened from its cudaIpcMemHandle_t.

cupy is the CUDA binding (optional: `pip install ".[cuda]"` from the checkout, or `pip install
cupy-cuda12x`). Without it, or without a device, the extension reports itself unavailable with
the reason, and only registering fails: status and unregister still answer, because clients call
them unconditionally.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from host.errors import InvalidArgumentError

log = logging.getLogger(__name__)

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when CUDA shared memory can be used in this process, else why not."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - any import failure means the same thing here
        return f"cupy is not installed or failed to import ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver, no device: CUDA errors of every kind
        return f"no CUDA device is usable ({exc})"
    return None if count > 0 else "no CUDA device is present"


def check_available(name: str = "") -> None:
    """Triton, whose CUDA IPC open fails without a device, answers registering so."""
    reason = unavailable_reason()
    if reason is not None:
        log.warning("cannot register CUDA shared memory region '%s': %s", name, reason)
        raise InvalidArgumentError("failed to register shared memory region: invalid args")


class _IpcMapping:
    """Owns the opened IPC pointer; closing it when the last array viewing it is gone."""

    def __init__(self, pointer: int, device_id: int) -> None:
        self.pointer, self.device_id = pointer, device_id

    def __del__(self) -> None:
        import cupy
        try:
            with cupy.cuda.Device(self.device_id):
                cupy.cuda.runtime.ipcCloseMemHandle(self.pointer)
        except Exception:  # noqa: BLE001 - interpreter shutdown or a context already gone
            pass


class CudaRegion:
    kind = "cuda"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        check_available(name)  # after the request's own checks, as Triton opens the handle last
        import cupy
        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise InvalidArgumentError("failed to register shared memory region: invalid args")
        self.name, self.device_id, self.byte_size = name, device_id, byte_size
        self.key, self.offset = "", 0
        self.users, self.pending = 0, False  # requests using it; unregistered while in use
        try:
            with cupy.cuda.Device(device_id):
                pointer = cupy.cuda.runtime.ipcOpenMemHandle(bytes(raw_handle))
        except Exception as exc:  # noqa: BLE001 - cupy raises CUDARuntimeError and friends
            raise InvalidArgumentError(
                f"failed to register shared memory region: invalid args ({exc})") from None
        owner = _IpcMapping(pointer, device_id)
        memory = cupy.cuda.UnownedMemory(pointer, byte_size, owner, device_id)
        # Tensor views are slices of this one device array; each keeps `owner` alive.
        self.buffer: Any = cupy.ndarray((byte_size,), dtype=cupy.uint8,
                                        memptr=cupy.cuda.MemoryPointer(memory, 0))

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}
