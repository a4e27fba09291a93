"""numpy / GPU arrays <-> torch tensors, without copies where that is safe.

- a writable numpy array becomes a tensor sharing its memory (`torch.from_numpy`); a read-only
  one (a view of the request body) is copied once, since torch tensors are writable and a
  model may write to its inputs;
- an array already in GPU memory (CUDA shared memory; anything with `__dlpack__`) is taken as
  is through DLPack (`from_device`) and moved only if it lies on another device;
- a CPU output tensor becomes a numpy view of the same memory (`Tensor.numpy()`); a GPU one is
  copied to the host once.
BF16 has no numpy type of its own in torch: it travels as int16 bits, reinterpreted both ways.
BYTES (TYPE_STRING) travels as a TorchScript `List[str]`, as in Triton's libtorch backend: every
element of the batch in one flat list, and an output `List[str]` is a 1-D BYTES tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from host import datatypes
from host.errors import InvalidArgumentError

_TORCH: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
    "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "FP32": torch.float32,
    "FP64": torch.float64, "BF16": torch.bfloat16,
    "UINT16": torch.uint16, "UINT32": torch.uint32, "UINT64": torch.uint64,
}
_TRITON = {v: k for k, v in _TORCH.items()}


def check_datatype(datatype: str, what: str) -> None:
    if datatype not in _TORCH and datatype != "BYTES":
        raise InvalidArgumentError(f"{what} has datatype {datatype}, which the pytorch backend "
                                   f"does not support")


def on_device(data: Any) -> bool:
    return not isinstance(data, np.ndarray) and hasattr(data, "__dlpack__")


def from_device(data: Any, device: torch.device) -> torch.Tensor:
    """A GPU-resident input (CUDA shared memory) as a tensor on `device`, via DLPack."""
    return torch.from_dlpack(data).to(device, non_blocking=True)


def to_torch(datatype: str, array: np.ndarray, device: torch.device) -> torch.Tensor:
    if datatype == "BF16":
        array = array.view(np.int16)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array)  # torch tensors are writable: never hand out a read-only buffer
    tensor = torch.from_numpy(array)
    if datatype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def to_numpy(tensor: torch.Tensor) -> tuple[str, np.ndarray]:
    """(datatype, array) of an output tensor; a view of a contiguous CPU tensor's memory."""
    datatype = _TRITON.get(tensor.dtype)
    if datatype is None:
        raise InvalidArgumentError(f"output tensor type {tensor.dtype} has no Triton datatype")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if datatype == "BF16":
        return datatype, tensor.view(torch.int16).numpy().view(datatypes.to_numpy("BF16"))
    return datatype, tensor.numpy()


def to_strings(array: np.ndarray) -> list[str]:
    """A BYTES input as the `List[str]` Triton's libtorch backend passes: every element, flat."""
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in np.asarray(array, dtype=object).reshape(-1)]


def from_strings(items: list) -> np.ndarray:
    """A `List[str]` output as a 1-D BYTES array."""
    out = np.empty(len(items), dtype=object)
    out[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in items]
    return out
