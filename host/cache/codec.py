"""One cached output tensor <-> one buffer: a small fixed header, then the tensor's raw bytes.

Never pickle: an entry may come from a cache other processes write to (Redis), so decoding only
ever builds numpy arrays of a known datatype from bytes, and every field is checked first (magic,
datatype, rank, sizes, exact total length, BYTES element framing). A buffer that fails any check
raises `CorruptEntryError`; the host then treats the lookup as a miss.

Layout (little-endian):

    magic "MHC1" | datatype u8 | rank u8 | name length u16 | data length u64
    | dims i64 * rank | name (UTF-8) | data
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from host import datatypes
from host.cache.base import Buffer
from host.cache.key import DEVICE_PARAMETER
from host.errors import InternalError, InvalidArgumentError
from host.inference import Tensor

MAGIC = b"MHC1"
MAX_RANK = 64
_HEADER = struct.Struct("<4sBBHQ")
_TYPES = datatypes.DATATYPES
_CODE = {name: i for i, name in enumerate(_TYPES)}
_SIZES = [datatypes.element_size(t) for t in _TYPES]


def _dtype(datatype: str) -> np.dtype | None:
    try:
        return datatypes.to_numpy(datatype)
    except InvalidArgumentError:  # BF16 without ml_dtypes
        return None


_DTYPES = [_dtype(t) for t in _TYPES]


class CorruptEntryError(InternalError):
    """A cached buffer is not a valid encoded tensor."""


def encode_tensor(tensor: Tensor) -> bytes:
    data = tensor.data
    if tensor.datatype == "BYTES":
        data = datatypes.serialize_bytes(np.asarray(data).reshape(-1))
        size = len(data)
    else:
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        size = data.nbytes  # joined below straight from the array's memory: one copy in all
    name = tensor.name.encode("utf-8")
    shape = tensor.shape
    return b"".join((
        _HEADER.pack(MAGIC, _CODE[tensor.datatype], len(shape), len(name), size),
        struct.pack(f"<{len(shape)}q", *shape), name, data))


def encode_entry(outputs: Sequence[Tensor]) -> list[bytes] | None:
    """The buffers of a response's outputs; None when one is not a numpy array in host memory
    (only such responses are cached)."""
    entry = []
    for t in outputs:
        if type(t.data) is not np.ndarray or (
                t.parameters and t.parameters.get(DEVICE_PARAMETER, "cpu") != "cpu"):
            return None
        entry.append(encode_tensor(t))
    return entry


def decode_tensor(buf: Buffer) -> Tensor:
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if len(view) < _HEADER.size:
        raise CorruptEntryError(f"cached tensor of {len(view)} bytes is shorter than its header")
    magic, code, rank, name_len, data_len = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise CorruptEntryError("cached tensor has no modelhost tensor header")
    if code >= len(_TYPES) or rank > MAX_RANK:
        raise CorruptEntryError(f"cached tensor has an invalid datatype ({code}) or rank ({rank})")
    offset = _HEADER.size
    end = offset + 8 * rank + name_len + data_len
    if end != len(view):
        raise CorruptEntryError(f"cached tensor is {len(view)} bytes, its header says {end}")
    shape = list(struct.unpack_from(f"<{rank}q", view, offset))
    if any(d < 0 for d in shape):
        raise CorruptEntryError(f"cached tensor has a negative dimension: {shape}")
    offset += 8 * rank
    try:
        name = bytes(view[offset:offset + name_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptEntryError("cached tensor name is not UTF-8") from None
    datatype = _TYPES[code]
    offset += name_len
    count = datatypes.element_count(shape)
    if datatype != "BYTES":  # the common case, inline: a read-only view of the cached bytes
        if _DTYPES[code] is None:
            raise CorruptEntryError(f"cached tensor '{name}' has datatype {datatype}, unsupported here")
        if data_len != _SIZES[code] * count:
            raise CorruptEntryError(
                f"cached tensor '{name}' holds {data_len} bytes, its shape {shape} needs "
                f"{_SIZES[code] * count}")
        data = np.frombuffer(view, _DTYPES[code], count, offset).reshape(shape)
        return Tensor(name, datatype, shape, data)
    try:
        data = datatypes.array_from_buffer(datatype, shape, view[offset:])
    except (InvalidArgumentError, ValueError) as exc:
        raise CorruptEntryError(f"cached tensor '{name}': {exc}") from None
    return Tensor(name, datatype, shape, data)


def decode_entry(entry: Sequence[Buffer]) -> list[Tensor]:
    """Every tensor of an entry; names must be distinct."""
    outputs = [decode_tensor(buf) for buf in entry]
    if len({t.name for t in outputs}) != len(outputs):
        raise CorruptEntryError("cached entry names an output twice")
    return outputs

