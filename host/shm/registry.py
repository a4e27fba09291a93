"""The registry of client shared-memory regions: one namespace for system and CUDA regions.

Registering maps the region once; a request acquires its regions by name and releases them when
its final response is out. Unregistering a region that requests still use only marks it: it
stays listed (and its name taken) until the last of them finishes, and new requests may still
name it meanwhile, both as in Triton. The request keeps the region object (and so the mapping)
either way, so its memory stays valid until it finishes.

The texts and codes are those of Triton's server (src/shared_memory_manager.cc, src/common.cc).
"""

from __future__ import annotations

import base64
import binascii
import threading
from typing import Any, Callable

from host import validation
from host.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnsupportedError
from host.shm import cuda
from host.shm.system import SystemRegion

DISABLED = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
            "to enable.")
# Keys Triton's python backend uses for its own regions; a client may not register them.
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
_UINT64 = 1 << 64


class SharedMemoryManager:
    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self._regions: dict[str, Any] = {}
        self._lock = threading.Lock()
        # Called as on_change(action, names, record) after a register or unregister, so that
        # registrations survive a worker restart (host.supervise).
        self.on_change: Callable[[str, list[str], dict | None], None] | None = None

    # --- what the server advertises --------------------------------------------------------
    def extensions(self) -> list[str]:
        if not self.enabled:
            return []
        found = ["system_shared_memory"]
        if cuda.unavailable_reason() is None:
            found.append("cuda_shared_memory")
        return found

    # --- register / unregister / status ----------------------------------------------------
    def register_system(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self._check_enabled()
        if type(key) is not str:  # (TritonJson's texts: only a JSON body can get these wrong)
            raise InvalidArgumentError(validation.json_type_text("string"))
        offset = _uint64("offset", offset)
        byte_size = _uint64("byte_size", byte_size)
        self._check_name(name, "system")
        _check_key(name, key)
        with self._lock:
            self._check_free(name)
            # Mapping under the lock keeps two registers of one name from both succeeding.
            self._regions[name] = SystemRegion(name, key, offset, byte_size)
        if self.on_change is not None:
            self.on_change("register", [name], {"kind": "system", "key": key, "offset": offset,
                                                "byte_size": byte_size})

    def register_cuda(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        self._check_enabled()
        if isinstance(raw_handle, str):  # HTTP: base64 text
            try:
                raw_handle = base64.b64decode(raw_handle, validate=True)
            except (binascii.Error, ValueError):
                raw_handle = b""
            if len(raw_handle) != cuda.IPC_HANDLE_SIZE:
                raise InvalidArgumentError(
                    "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        if type(device_id) is not int or not 0 <= device_id < _UINT64:
            raise InvalidArgumentError(_NOT_UINT64)
        byte_size = _uint64("byte_size", byte_size)
        self._check_name(name, "cuda")
        with self._lock:
            self._check_free(name)
            self._regions[name] = cuda.CudaRegion(name, raw_handle, device_id, byte_size)
        if self.on_change is not None:
            self.on_change("register", [name], {
                "kind": "cuda", "raw_handle": base64.b64encode(raw_handle).decode(),
                "device_id": device_id, "byte_size": byte_size})

    def unregister(self, name: str = "", kind: str | None = None) -> None:
        """Unregister one region, or every region of `kind` when `name` is empty.

        Unknown names succeed (as in Triton): the client's intent, no region by that name, holds.
        A region of the other kind is left alone: the two APIs only see their own regions.
        Refused while client shared memory is disabled (Triton refuses it too).
        """
        self._check_enabled()
        self._unregister(name, kind)

    def _unregister(self, name: str = "", kind: str | None = None) -> None:
        with self._lock:
            if name:
                region = self._regions.get(name)
                gone = [region] if region is not None and (kind is None or region.kind == kind) else []
            else:
                gone = [r for r in self._regions.values() if kind is None or r.kind == kind]
            for each in gone:
                if each.users:
                    each.pending = True  # goes when its last request releases it
                    continue
                # Dropping the registry's reference is the whole unregister: the mapping goes
                # with the last view of it.
                del self._regions[each.name]
        if gone and self.on_change is not None:
            self.on_change("unregister", [r.name for r in gone], None)

    def status(self, kind: str, name: str = "") -> list[dict]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None or region.kind != kind:
                    label = "system" if kind == "system" else "cuda"
                    raise NotFoundError(f"Unable to find {label} shared memory region: '{name}'")
                return [region.status()]
            return [r.status() for r in self._regions.values() if r.kind == kind]

    # --- used by requests ------------------------------------------------------------------
    def get(self, name: str) -> Any:
        region = self._regions.get(name)  # a dict read is atomic: no lock on the request path
        # A region awaiting unregister (pending) still serves new requests, as in Triton
        # (shared_memory_manager.cc): it goes when the last request using it finishes.
        if region is None:
            raise NotFoundError(f"Unable to find shared memory region: '{name}'")
        return region

    def acquire(self, name: str) -> Any:
        """The region named `name`, counted as used until `release`."""
        with self._lock:
            region = self.get(name)
            region.users += 1
        return region

    def release(self, regions: list[Any]) -> None:
        """A request is done with `regions` (one entry per acquire)."""
        with self._lock:
            for used in regions:
                used.users -= 1
                name = used.name
                if used.pending and not used.users and self._regions.get(name) is used:
                    del self._regions[name]

    def close(self) -> None:
        self._unregister()

    # --- rules -----------------------------------------------------------------------------
    def _check_enabled(self) -> None:
        if not self.enabled:
            raise UnsupportedError(DISABLED)

    @staticmethod
    def _check_name(name: str, kind: str) -> None:
        if not name:
            raise InvalidArgumentError(
                f"'region name' is necessary to register {kind} shared memory region")

    def _check_free(self, name: str) -> None:
        if name in self._regions:
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")


def _check_key(name: str, key: str) -> None:
    """Triton's ValidateSharedMemoryKey: not only slashes, not the python backend's prefix."""
    bare = key.lstrip("/")
    if not bare:
        raise InvalidArgumentError(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    if bare.startswith(RESERVED_KEY_PREFIX):
        raise InvalidArgumentError(
            f"cannot register shared memory region '{name}' with key '{key}' as the key contains "
            f"the reserved prefix '{RESERVED_KEY_PREFIX}'")


_NOT_UINT64 = validation.json_type_text("unsigned-integer")


def _uint64(field: str, value: Any) -> int:
    if value is None:
        raise InvalidArgumentError(f"Shared memory register request has no '{field}' field")
    if type(value) is not int or not 0 <= value < _UINT64:
        raise InvalidArgumentError(_NOT_UINT64)
    return value
