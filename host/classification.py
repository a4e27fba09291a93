"""Triton's classification extension: an output returned as its top-k classes.

A requested output with the `classification` parameter (tritonclient's `class_count`) comes back
as BYTES, shape `[batch, k]` for a batching model and `[k]` otherwise, each element
`"<value>:<index>"`, or `"<value>:<index>:<label>"` when the output's `label_filename` gives the
class a label. Both front ends parse the parameter into `InferenceRequest.classification`
(`parse_count`); the host applies it to each response (`apply`), before any shared-memory write.

The texts are those of Triton's server (src/classification.cc, http_server.cc, grpc_utils.cc).
Where modelhost goes further (FP16/BF16 outputs, results written into shared memory), see
docs/triton_compat.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from host import datatypes
from host.errors import InvalidArgumentError, UnsupportedError
from host.inference import Tensor
from host.paths import is_inside
from host.proto import model_config_pb2

PARAMETER = "classification"
# Triton's bound on the elements one classification may sort (src/classification.cc).
MAX_ELEMENTS = 1_000_000
_NOT_NUMERIC = ("BOOL", "BYTES")


# --- the request: which outputs, how many classes -------------------------------------------

def parse_count(output_name: str, value: Any, protocol: str) -> int:
    """k from the output's `classification` parameter; 0 means "not a classification".

    HTTP takes any unsigned integer (0 leaves the output as it is); gRPC wants an int64 > 0.
    """
    if protocol == "grpc":
        if type(value) is not int:
            raise InvalidArgumentError(
                "invalid value type for 'classification' parameter, expected int64_param")
        if value <= 0:
            raise InvalidArgumentError(
                "invalid value for 'classification' parameter, expected >= 0")
        return value
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer")
    return value


# --- labels ----------------------------------------------------------------------------------

def load_labels(config: model_config_pb2.ModelConfig, model_dir: Path) -> dict[str, list[bytes]]:
    """Each output's labels (one a line of its `label_filename`, relative to the model folder).

    A label file outside the model folder (through '..', an absolute path or a symlink) is
    refused, as Triton refuses it.
    """
    labels: dict[str, list[bytes]] = {}
    root = Path(model_dir)
    for output in config.output:
        if not output.label_filename:
            continue
        path = root / output.label_filename
        real = os.path.realpath(path)
        if not is_inside(root, path):  # the one rule for files a config names (host.paths)
            raise UnsupportedError(
                f"label file path '{path}' for output '{output.name}' in model "
                f"'{config.name}' is outside model directory")
        try:
            text = Path(real).read_bytes()
        except OSError as exc:
            raise InvalidArgumentError(
                f"failed to open text file for read {path}: {exc.strerror}") from None
        lines = text.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # a final newline ends the last line; it does not start another
        labels[output.name] = lines
    return labels


# --- the response ----------------------------------------------------------------------------

def apply(tensor: Tensor, k: int, batching: bool, labels: list[bytes] | None) -> Tensor:
    """A new BYTES tensor holding the top-`k` classes of `tensor` (per batch row)."""
    datatype = tensor.datatype
    if datatype in _NOT_NUMERIC or not datatypes.is_valid(datatype):
        raise InvalidArgumentError(
            f"class result not available for output due to unsupported type '{datatype}'")
    data: Any = tensor.data
    if hasattr(data, "__cuda_array_interface__"):
        data = data.get()
    values = np.asarray(data)
    shape = list(tensor.shape)
    rows = shape[0] if batching and shape else 0
    per_row = datatypes.element_count(shape[1:] if rows else shape)
    if per_row > MAX_ELEMENTS:
        raise InvalidArgumentError("classification output tensor too large")
    if datatype in ("FP16", "BF16"):
        values = values.astype(np.float32)
    flat = values.reshape(-1)
    count = min(k, per_row)
    items: list[bytes] = []
    for row in range(max(rows, 1)):
        items.extend(_top(flat[row * per_row:(row + 1) * per_row], count, labels))
    out_shape = [rows, count] if rows else [count]
    return Tensor(tensor.name, "BYTES", out_shape, datatypes.bytes_array(items, out_shape),
                  dict(tensor.parameters))


def _top(values: np.ndarray, count: int, labels: list[bytes] | None) -> list[bytes]:
    # Largest first; equal values keep their index order (Triton's sort leaves ties unspecified).
    order = (len(values) - 1 - np.argsort(values[::-1], kind="stable"))[::-1][:count]
    text = _float_text if values.dtype.kind == "f" else _int_text
    out = []
    for index in order.tolist():
        item = f"{text(values[index])}:{index}".encode()
        label = labels[index] if labels is not None and index < len(labels) else b""
        if label:
            item += b":" + label
        out.append(item)
    return out


def _float_text(value: Any) -> str:
    return f"{float(value):f}"  # C++ std::to_string of a float or double: "%f"


def _int_text(value: Any) -> str:
    return str(int(value))
