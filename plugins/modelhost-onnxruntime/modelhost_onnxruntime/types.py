"""ONNX tensor types <-> Triton datatypes, and the numpy forms onnxruntime takes and gives.

Every ONNX tensor element type that Triton's onnxruntime backend maps is mapped here. BF16 is
the exception: onnxruntime's Python API has no numpy type for it, so a BF16 input or output is
refused when the model loads, with a message saying so.
"""

from __future__ import annotations

import numpy as np

from host.errors import InvalidArgumentError

# onnxruntime's type strings (NodeArg.type) -> Triton wire datatype.
ONNX_TO_TRITON: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
UNSUPPORTED = {"tensor(bfloat16)": "BF16 has no numpy type in onnxruntime's Python API"}


def triton_datatype(onnx_type: str, what: str) -> str:
    """The Triton datatype of an ONNX input/output type, or a clear error naming `what`."""
    datatype = ONNX_TO_TRITON.get(onnx_type)
    if datatype is None:
        why = UNSUPPORTED.get(onnx_type, "not a type Triton maps")
        raise InvalidArgumentError(f"{what} has ONNX type '{onnx_type}': {why}")
    return datatype


def to_onnx(datatype: str, array: np.ndarray) -> np.ndarray:
    """An input array as onnxruntime takes it: strings as an object array of `str`."""
    if datatype != "BYTES":
        return array
    try:
        return np.vectorize(_decode, otypes=[object])(array) if array.size else array.astype(object)
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"a string input element is not valid UTF-8 (onnxruntime strings are text): {exc}"
        ) from None


def from_onnx(datatype: str, array: np.ndarray) -> np.ndarray:
    """An output array as the host sends it: strings as an object array of `bytes`."""
    if datatype != "BYTES":
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out


def _decode(item: object) -> str:
    return item.decode("utf-8") if isinstance(item, (bytes, bytearray)) else str(item)


def dims(shape: list) -> list[int]:
    """ONNX shape (ints, symbolic names or None) -> config dims (-1 for anything not fixed)."""
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]
