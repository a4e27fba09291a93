"""Triton datatypes: wire names, config enum names, numpy dtypes, sizes, BYTES serialization.

This module is the one place that knows how a Triton datatype maps to anything else.
"""

from __future__ import annotations

import struct
from typing import Iterable, Sequence

import numpy as np

from host.errors import InvalidArgumentError
from host.proto import model_config_pb2

try:  # BF16 has no numpy dtype of its own; ml_dtypes provides one when installed.
    from ml_dtypes import bfloat16 as _bfloat16

    BF16_DTYPE: np.dtype | None = np.dtype(_bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency, this is belt and braces
    BF16_DTYPE = None

# Wire datatype -> numpy dtype. BYTES tensors are numpy object arrays of `bytes`.
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
if BF16_DTYPE is not None:
    _NUMPY["BF16"] = BF16_DTYPE

DATATYPES: tuple[str, ...] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
)

_SIZE = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
         "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}

_FROM_NUMPY = {dt: name for name, dt in _NUMPY.items() if name != "BYTES"}
# The datatype of each fixed-size numpy dtype (not BYTES), for lookups on a per-tensor path
# (read-only: the same dict as from_numpy's).
FIXED_BY_DTYPE: dict[np.dtype, str] = _FROM_NUMPY


# Triton's name for a datatype it does not know (TRITONSERVER_DataTypeString(INVALID)). The codecs
# give an input of such a datatype this one and no data (NO_DATA): the core then refuses it where
# Triton's core does, comparing it with the model's ("data-type is '<invalid>'", host.validation).
INVALID = "<invalid>"
NO_DATA = np.empty(0, np.uint8)
NO_DATA.flags.writeable = False


def is_valid(datatype: str) -> bool:
    return datatype in DATATYPES


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES (variable size)."""
    return _SIZE.get(datatype, 0)


def to_numpy(datatype: str) -> np.dtype:
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise InvalidArgumentError(f"unsupported datatype '{datatype}'") from None


def from_numpy(dtype: np.dtype) -> str:
    """Wire datatype of a numpy dtype; object, bytes and str arrays are BYTES."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _FROM_NUMPY[dtype]
    except KeyError:
        raise InvalidArgumentError(f"numpy dtype {dtype} has no Triton datatype") from None


def from_config(type_name: str) -> str:
    """`TYPE_INT32` (model config enum name) -> `INT32`; `TYPE_STRING` -> `BYTES`."""
    if type_name == "TYPE_STRING":
        return "BYTES"
    return type_name[5:] if type_name.startswith("TYPE_") else type_name


def from_config_enum(data_type: int) -> str:
    """A model config's DataType enum value (`TYPE_INT32`'s number) -> `INT32`."""
    return from_config(model_config_pb2.DataType.Name(data_type))


def to_config(datatype: str) -> str:
    """`INT32` -> `TYPE_INT32`; `BYTES` -> `TYPE_STRING`."""
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


MAX_DIMS = 64  # numpy's limit: a tensor with more dimensions cannot be represented
# nor one whose non-zero dimensions, times the widest element (16 bytes), pass int64: numpy
# refuses such an array even when another dimension is 0.
_MAX_ELEMENTS = (2**63 - 1) // 16


def check_shape(name: str, shape: Sequence[int], model: str = "") -> None:
    """Refuse a shape no tensor can have, before any array is made from it (both codecs call
    this): more than MAX_DIMS dimensions, or non-zero dimensions whose product overflows int64
    (`[0, 2**62]` holds no element, yet numpy cannot make that array)."""
    where = f" for model '{model}'" if model else ""
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(
            f"input '{name}'{where} has {len(shape)} dimensions; at most {MAX_DIMS} are supported")
    product = 1
    large = False  # one dimension alone too large (a negative one may hide it in the product)
    for d in shape:
        if d:
            product *= d
            if d > _MAX_ELEMENTS:
                large = True
    if large or product > _MAX_ELEMENTS:
        raise InvalidArgumentError(f"shape {list(shape)} of input '{name}'{where} is too large")


def element_count(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def byte_size(datatype: str, shape: Sequence[int]) -> int:
    """Byte size of a fixed-size tensor (undefined for BYTES)."""
    return element_size(datatype) * element_count(shape)


# --- BYTES: each element is a 4-byte little-endian length followed by its bytes ------------

_LEN = struct.Struct("<I")


def serialize_bytes(items: Iterable[object]) -> bytes:
    """Triton's length-prefixed serialization of a BYTES tensor (flattened, row-major)."""
    parts: list[bytes] = []
    for item in items:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes(buf: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Split a length-prefixed buffer into its elements; `count`, when given, must match."""
    view = memoryview(buf)
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if offset + 4 > end:
            raise InvalidArgumentError("unexpected end of BYTES tensor data: incomplete length prefix")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise InvalidArgumentError(
                f"unexpected end of BYTES tensor data: element of {length} bytes overruns the buffer")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise InvalidArgumentError(
            f"BYTES tensor holds {len(items)} elements, but its shape needs {count}")
    return items


def bytes_array(items: list[bytes], shape: Sequence[int]) -> np.ndarray:
    """An object array of `bytes` with the given shape (numpy would truncate at b'\\x00' otherwise)."""
    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    return arr.reshape(shape)


def array_from_buffer(datatype: str, shape: Sequence[int], buf: bytes | memoryview) -> np.ndarray:
    """Decode raw tensor bytes (as on the wire) into an array, zero-copy for fixed-size types."""
    count = element_count(shape)
    if datatype == "BYTES":
        return bytes_array(deserialize_bytes(buf, count), shape)
    expected = element_size(datatype) * count
    if len(buf) != expected:
        raise InvalidArgumentError(
            f"unexpected total byte size {len(buf)} for input, expecting {expected}")
    return shaped(np.frombuffer(buf, to_numpy(datatype), count), shape)


def shaped(flat: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """`flat` (1-D, as many elements as `shape` holds) in `shape`. A 1-D shape is that already:
    numpy's reshape costs more than the rest of decoding a small input, and most inputs are 1-D
    or batched 2-D."""
    return flat if len(shape) == 1 else flat.reshape(shape)


def array_to_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """Raw wire bytes of an array: a view for contiguous fixed-size data, serialized for BYTES."""
    if datatype == "BYTES":
        return serialize_bytes(array.reshape(-1))
    if not array.nbytes:
        return b""
    try:  # the common case: a byte view of a C-contiguous array, no numpy calls
        return memoryview(array).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not C-contiguous, or a dtype without a buffer format (BF16)
        array = np.ascontiguousarray(array)
        return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
