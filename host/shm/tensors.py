"""Shared-memory tensors of one request: inputs as views of a region, outputs written into one.

The front ends only notice that a tensor names shared memory (`mentions_shm`) and leave its data
out; every rule about the references (which parameters, their types, the region, the bounds, the
byte size) lives here, so HTTP and gRPC give the same answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host import datatypes, validation
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.parameters import Uint64

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
KEYS = (REGION, OFFSET, BYTE_SIZE)
_UINT64 = 1 << 64


def mentions_shm(params: Any) -> bool:
    """Whether a tensor's parameters put it in shared memory (the front ends' one question)."""
    return REGION in params or BYTE_SIZE in params


def bind_request(request: InferenceRequest, manager: Any, model_name: str) -> None:
    """Give each shared-memory input its view, and reserve each shared-memory output's target.

    The request keeps the region objects it uses (through its views and `shm_outputs`), so an
    unregister during the request cannot pull its memory away; each region is acquired into
    `request.shm_regions`, which the host releases once the request is over (`release_request`).
    """
    request.shm_regions = []
    for tensor in request.inputs.values():
        if tensor.data is None:
            tensor.data = _input_view(tensor, manager, model_name, request.shm_regions,
                                      request.protocol)
    targets = {}
    for output in request.outputs:
        params = output.parameters
        if params and mentions_shm(params):
            region, offset, size = _target(params, output.name, manager, request.shm_regions,
                                           request.protocol)
            targets[output.name] = (region, offset, size)
            output.parameters = {k: v for k, v in params.items() if k not in KEYS}
    request.shm_outputs = targets or None


def release_request(request: InferenceRequest, manager: Any) -> None:
    """The request is over: release the regions it acquired (an unregistered one may go now)."""
    regions, request.shm_regions = request.shm_regions, None
    if regions:
        manager.release(regions)


def write_outputs(response: InferenceResponse, targets: dict[str, tuple[Any, int, int]]) -> None:
    """Write each output that has a target into its region, once; the response keeps only its
    name, datatype and shape (the front ends send no data for it)."""
    for tensor in response.outputs:
        target = targets.get(tensor.name)
        if target is not None and tensor.data is not None:
            _write(tensor, *target)
            tensor.data = None


# --- inputs ------------------------------------------------------------------------------------

def _input_view(tensor: Tensor, manager: Any, model_name: str, used: list, protocol: str) -> Any:
    name = tensor.name
    region, offset, size = _target(tensor.parameters, name, manager, used, protocol)
    tensor.parameters = {k: v for k, v in tensor.parameters.items() if k not in KEYS}
    window = region.buffer[offset:offset + size]
    # The rules of data in a request body (host.validation), as Triton's core checks both alike.
    if tensor.datatype == "BYTES":
        host = window if region.kind == "system" else window.get()  # strings are parsed on the CPU
        return validation.bytes_input(name, model_name, tensor.shape, memoryview(host), protocol)
    validation.fixed_size_count(name, model_name, tensor.datatype, tensor.shape, size)
    view = window.view(datatypes.to_numpy(tensor.datatype)).reshape(tensor.shape)
    if region.kind == "system":
        view.flags.writeable = False  # the model reads the client's bytes; it must not change them
    return view


# --- outputs -----------------------------------------------------------------------------------

def _write(tensor: Tensor, region: Any, offset: int, size: int) -> None:
    data = tensor.data
    on_device = hasattr(data, "__cuda_array_interface__")
    if tensor.datatype == "BYTES":
        host = data.get() if on_device else np.asarray(data)
        src: Any = np.frombuffer(datatypes.serialize_bytes(host.reshape(-1)), dtype=np.uint8)
        on_device = False
    else:
        want = datatypes.to_numpy(tensor.datatype)
        if on_device:
            import cupy
            src = cupy.ascontiguousarray(cupy.asarray(data), dtype=want).reshape(-1).view(cupy.uint8)
        else:
            src = np.ascontiguousarray(data, dtype=want).reshape(-1).view(np.uint8)
    need = src.size
    if need > size:
        raise InvalidArgumentError(
            f"shared memory size specified with the request for output '{tensor.name}' "
            f"({size} bytes) should be at least {need} bytes to hold the results")
    if region.kind == "system":
        region.check_size()  # again: the model ran meanwhile, the client may have shrunk it
    dst = region.buffer[offset:offset + need]
    if region.kind == "system":
        if on_device:
            src.get(out=dst)  # device to host, straight into the region
        else:
            np.copyto(dst, src)
        region.check_size()  # a shrink during the copy: the output did not reach the client
    elif on_device:
        dst[...] = src  # device to device
    else:
        dst.set(src)  # host to device


# --- references --------------------------------------------------------------------------------

# A size or an offset without a region: over gRPC Triton's front end words it (grpc_utils.h), over
# HTTP it has no such rule (it would ignore them); this server refuses them over both.
_WITHOUT_REGION = {
    "grpc": "'{key}' can not be specified without '" + REGION + "' parameter for tensor '{name}'",
}


def _target(params: dict, name: str, manager: Any, used: list,
            protocol: str = "") -> tuple[Any, int, int]:
    region_name = params.get(REGION)
    size = params.get(BYTE_SIZE)
    if region_name is None:
        text = _WITHOUT_REGION.get(protocol)
        if text is not None:  # Triton looks at the offset first
            raise InvalidArgumentError(text.format(key=OFFSET if OFFSET in params else BYTE_SIZE,
                                                   name=name))
        raise InvalidArgumentError(
            f"'{REGION}' must be specified along with '{BYTE_SIZE}' parameter for tensor '{name}'")
    if size is None:
        raise InvalidArgumentError(
            f"'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{name}'")
    if type(region_name) is not str:
        raise InvalidArgumentError(f"Unable to parse '{REGION}': expected a string")
    size = _uint64(BYTE_SIZE, size)
    offset = _uint64(OFFSET, params.get(OFFSET, 0))
    region = manager.acquire(region_name)
    used.append(region)
    if region.kind == "system":
        region.check_size()
    # Triton's checks and order (SharedMemoryManager::GetMemoryInfo): an offset must fall inside
    # the region, and offset + size must not pass 2^64 - 1 (Triton's size_t) nor the region's end.
    if offset >= region.byte_size:
        raise InvalidArgumentError(f"Invalid offset for shared memory region: '{region_name}'")
    if size > _UINT64 - 1 - offset:
        raise InvalidArgumentError(
            f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds maximum "
            f"value ({_UINT64 - 1}) for region '{region_name}'")
    if offset + size > region.byte_size:
        raise InvalidArgumentError(
            f"Invalid offset + byte size for shared memory region: '{region_name}'")
    return region, offset, size


def _uint64(key: str, value: Any) -> int:
    # gRPC's uint64_param (Uint64) too: a region's size may not fit an int64
    if type(value) not in (int, Uint64) or not 0 <= value < _UINT64:
        raise InvalidArgumentError(f"Unable to parse '{key}': expected an unsigned 64-bit integer")
    return value
