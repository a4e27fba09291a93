"""The one request validator: every rule about a request, with Triton's messages.

- `RequestRules`: a request against its model's configuration; built once per loaded model
  version, run on every request before scheduling.
- The functions below it: rules on the tensors and parameters the front ends decode (data size
  against shape, BYTES element counts, dimensions, datatypes, duplicate inputs, outputs, versions,
  load parameters). The codecs call them while parsing, so HTTP and gRPC reject the same requests;
  where Triton's words differ by protocol, the texts are data here.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from host import datatypes
from host.errors import InternalError, InvalidArgumentError
from host.proto import model_config_pb2

_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse, Tensor


@dataclass(frozen=True)
class _TensorRule:
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension
    optional: bool


class RequestRules:
    def __init__(self, config: model_config_pb2.ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {
            i.name: _TensorRule(datatypes.from_config_enum(i.data_type),
                                tuple(i.dims), i.optional)
            for i in config.input
        }
        self.outputs = {o.name for o in config.output}
        self.required = [n for n, r in self.inputs.items() if not r.optional]
        # `reshape`: the backend sees inputs in their reshape shape and produces outputs in theirs,
        # while clients use dims (name -> (what the tensor has, what it becomes)).
        self.input_reshapes = {i.name: (tuple(i.dims), tuple(i.reshape.shape))
                               for i in config.input if i.HasField("reshape")}
        self.output_reshapes = {o.name: (tuple(o.reshape.shape), tuple(o.dims))
                                for o in config.output if o.HasField("reshape")}

    def check(self, request: InferenceRequest) -> None:
        """Raise InvalidArgumentError for the first rule the request breaks; set its batch size.

        Triton's core order (InferenceRequest::Normalize): the input count first (against
        required and total); then, input by input in its hash map's order (for a few inputs, the
        reverse of the request's, which is what this takes), the names, the batch dimension, the
        batch size; then each input's datatype, shape and data size. Its texts carry the
        request's tag (`request_tag`).
        """
        inputs = request.inputs
        if len(inputs) > len(self.inputs) or len(inputs) < len(self.required):
            raise self._count_error(request)
        for name in reversed(inputs):  # Triton's order (see above); no list on the request path
            if name not in self.inputs:
                raise InvalidArgumentError(
                    f"unexpected inference input '{name}' for model '{self.model}'")
        if len(inputs) < len(self.inputs) and any(n not in inputs for n in self.required):
            raise self._count_error(request)  # an optional input given in place of a required one
        batch = self._batch_size(request) if self.max_batch_size > 0 else 1
        data_errors = request.data_errors or {}
        for name in reversed(inputs):
            tensor, rule = inputs[name], self.inputs[name]
            if tensor.datatype != rule.datatype:
                raise InvalidArgumentError(
                    f"{request_tag(request)}inference input '{name}' data-type is '{tensor.datatype}', but model "
                    f"'{self.model}' expects '{rule.datatype}'")
            if not _matches(rule.dims, tensor.shape[1:] if self.max_batch_size > 0 else tensor.shape):
                full = ([-1] if self.max_batch_size > 0 else []) + list(rule.dims)
                raise InvalidArgumentError(
                    f"{request_tag(request)}unexpected shape for input '{name}' for model '{self.model}'. Expected "
                    f"{_shape(full)}, got {_shape(tensor.shape)}. "
                    + (_IMPLICIT_BATCH_NOTE if self.max_batch_size > 0 else ""))
            error = data_errors.get(name)
            if error is not None:
                raise error
        request.batch_size = batch
        if self.input_reshapes:
            for name, (dims, shape) in self.input_reshapes.items():
                if name in inputs:
                    try:
                        self._reshape(inputs[name], dims, shape)
                    except ValueError:
                        raise InvalidArgumentError(
                            f"input '{name}' of shape {_shape(inputs[name].shape)} cannot take "
                            f"the reshape {_shape(shape)} of model '{self.model}'") from None
        for out in request.outputs:
            if out.name not in self.outputs:
                raise InvalidArgumentError(
                    f"unexpected inference output '{out.name}' for model '{self.model}'")

    def _count_error(self, request: InferenceRequest) -> InvalidArgumentError:
        """Triton's words (core InferenceRequest::ValidateRequestInputs), lists included."""
        inputs = request.inputs
        missing = _names([n for n in self.required if n not in inputs])
        # Triton lists them from its hash map: for a few inputs, in the reverse of their order.
        got = _names(reversed(list(inputs))) if inputs else "[]"
        if len(self.required) == len(self.inputs):
            expected = f"expected {len(self.inputs)} inputs"
        else:
            expected = f"expected number of inputs between {len(self.required)} and {len(self.inputs)}"
        return InvalidArgumentError(
            f"{request_tag(request)}{expected} but got {len(inputs)} inputs for model "
            f"'{self.model}'. Got input(s) {got}, but missing required input(s) {missing}. "
            "Please provide all required input(s).")

    def _batch_size(self, request: InferenceRequest) -> int:
        """The request's batch size: the first dimension every input shares (a batching model)."""
        inputs = request.inputs
        if self.max_batch_size <= 0 or not inputs:
            return 1  # a request without inputs (text through parameters, host.inflight): one row
        batch = 0
        for name in reversed(inputs):
            shape = inputs[name].shape
            if not shape:
                raise InvalidArgumentError(
                    f"{request_tag(request)}input '{name}' has no shape but model requires batch dimension for "
                    f"'{self.model}'")
            if batch == 0:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidArgumentError(
                    f"{request_tag(request)}input '{name}' batch size does not match other inputs for '{self.model}'")
        if batch < 1 or batch > self.max_batch_size:
            raise InvalidArgumentError(
                f"{request_tag(request)}inference request batch-size must be <= {self.max_batch_size} for "
                f"'{self.model}'")
        return batch

    def reshape_outputs(self, response: InferenceResponse) -> None:
        """Give outputs with a `reshape` the shape of their dims (run on every response)."""
        for tensor in response.outputs:
            pair = self.output_reshapes.get(tensor.name)
            if pair is None:
                continue
            try:
                self._reshape(tensor, *pair)
            except ValueError:
                response.outputs, response.error = [], InternalError(
                    f"output '{tensor.name}' of model '{self.model}' has shape "
                    f"{_shape(tensor.shape)}, which does not match its reshape "
                    f"{_shape(pair[0])}")
                return

    def _reshape(self, tensor: Tensor, given: tuple[int, ...], target: tuple[int, ...]) -> None:
        """`tensor` (shaped `given`, after any batch dimension) reshaped to `target`: each
        variable-size dimension of `target` takes the size of the matching one of `given`."""
        batch = tensor.shape[:1] if self.max_batch_size > 0 else []
        rest = tensor.shape[len(batch):]
        sizes = iter([size for size, dim in zip(rest, given) if dim == -1])
        shape = batch + [next(sizes, 1) if dim == -1 else dim for dim in target]
        if shape != tensor.shape and tensor.data is not None:
            tensor.data = tensor.data.reshape(shape)
            tensor.shape = shape


_IMPLICIT_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim "
    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
    "docs for more info on max_batch_size.")


def _matches(dims: tuple[int, ...], shape: list[int]) -> bool:
    if len(dims) != len(shape):
        return False
    for d, s in zip(dims, shape):  # a loop, not all() over a generator: it runs per input
        if d != s and d != -1:
            return False
    return True


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def request_tag(request: InferenceRequest) -> str:
    """Triton's prefix of a request's errors: `[request id: <id>] `."""
    return id_tag(request.id)


def id_tag(request_id: str) -> str:
    """`request_tag` from the id alone, for a request still being decoded."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def _names(names) -> str:
    """Triton's list: `['a','b']`; an empty list of missing inputs reads `]`, as in Triton."""
    text = ",".join(f"'{n}'" for n in names)
    return "[" + text + "]" if text else "]"


# TritonJson's texts: how Triton's HTTP front end words a JSON member that is missing or of
# another type. The front end prefixes most with "Unable to parse '<field>': " (json_field_error).
def json_type_text(kind: str) -> str:
    return f"attempt to access JSON non-{kind} as {kind}"


def json_missing_text(member: str) -> str:
    return f"attempt to access non-existing object member '{member}'"


def json_field_error(field: str, kind: str, container: dict[str, Any] | None = None) -> InvalidArgumentError:
    """Triton's text for `field` of another JSON type; with `container`, for a required member
    that may also be missing from it."""
    text = json_missing_text(field) if container is not None and field not in container \
        else json_type_text(kind)
    return InvalidArgumentError(f"Unable to parse '{field}': {text}")


# --- rules on the tensors and parameters a front end decodes --------------------------------------
# The codecs only parse their wire format; every rule about what they parsed is here, once.
# Where Triton words a rule differently per protocol, each protocol's text is data in `_TEXTS`
# (keyed by the request's protocol: "http" or "grpc"), never a branch in a codec.

_TEXTS: dict[str, dict[str, str]] = {
    "negative_dim": {
        # TritonJson's text (Triton answers it with 500; a 400 here)
        "http": "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        "grpc": "invalid shape {shape} for input '{name}' for model '{model}': dimensions must not be "
                "negative",
    },
    # Triton's core's words, binary data over HTTP as over gRPC
    "string_count": {
        "http": "expected {count} string elements for inference input '{name}' for model '{model}', "
                "got {got}",
        "grpc": "expected {count} string elements for inference input '{name}' for model '{model}', "
                "got {got}",
    },
    "string_count_over": {
        "http": "unexpected number of string elements {over} for inference input '{name}' for "
                "model '{model}', expecting {count}",
        "grpc": "unexpected number of string elements {over} for inference input '{name}' for "
                "model '{model}', expecting {count}",
    },
    "load_type": {
        "http": json_type_text("string"),  # unprefixed, as Triton's load answers it
        "grpc": "invalid value type for load parameter '{key}', expected {kind}.",
    },
    "load_key": {
        "http": "unexpected error on creating Triton parameter",  # (Triton's text)
        "grpc": "unrecognized load parameter '{key}'.",
    },
}
# What a load parameter's value must be, by protocol: JSON carries files as base64 text.
_LOAD_FILE_TYPE: dict[str, type] = {"http": str, "grpc": bytes}
_PROTOBUF_KIND: dict[type, str] = {str: "string_param", bytes: "bytes_param"}


def _error(rule: str, protocol: str, **values: object) -> InvalidArgumentError:
    return InvalidArgumentError(_TEXTS[rule][protocol].format(**values))


def shape_error(name: str, shape: object, model: str, protocol: str) -> InvalidArgumentError:
    """The error for a shape that is not a list of non-negative integers. Over HTTP the text is
    TritonJson's (Triton reads each dimension with AsUInt); Triton answers it with 500, and its
    L0_http test_negative_dimensions expects that 500, but bad input is a 400 here."""
    return _error("negative_dim", protocol, name=name, shape=shape, model=model)


# Whether a protocol's shape-limit messages name the model (host.datatypes.check_shape).
_SHAPE_LIMIT_NAMES_MODEL = {"http": False, "grpc": True}


def check_shape(name: str, shape: list[int], model: str, protocol: str,
                json_datatype: str | None = None) -> None:
    """No negative dimension, and a shape some tensor can have (host.datatypes.check_shape).
    `json_datatype`: the input's datatype when its data comes as JSON (HTTP), whose size
    overflowing int64 Triton words in its own way, checked first."""
    for d in shape:
        if d < 0:
            raise shape_error(name, shape, model, protocol)
    if json_datatype is not None:
        _check_json_size(name, json_datatype, shape)
    datatypes.check_shape(name, shape, model if _SHAPE_LIMIT_NAMES_MODEL[protocol] else "")


def check_new_input(inputs: dict, name: str, request_id: str) -> None:
    """An input may appear once in a request (Triton's core's text, with the request's tag)."""
    if name in inputs:
        raise InvalidArgumentError(f"{id_tag(request_id)}input '{name}' already exists in request")


class DataSizeError(InvalidArgumentError):
    """An input whose data does not fill its shape (byte size, BYTES element count). Triton's core
    checks these after the input count, input by input in its hash map's order (for a few inputs,
    the last one sent first): the codecs keep them on the request (`InferenceRequest.data_errors`,
    `tagged`) for `RequestRules.check`."""


def tagged(request: InferenceRequest, errors: dict[str, DataSizeError]) -> dict[str, Exception]:
    """The decoders' data-size errors as Triton's core words them: with the request's tag."""
    tag = request_tag(request)
    return {name: DataSizeError(tag + error.message) for name, error in errors.items()}


def check_byte_size(name: str, model: str, expected: int, got: int) -> None:
    if got != expected:
        raise DataSizeError(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
            f"got {got}")


def fixed_size_count(name: str, model: str, datatype: str, shape: list[int], nbytes: int) -> int:
    """The element count of a fixed-size input whose data is `nbytes` long (checked against its shape)."""
    count = datatypes.element_count(shape)
    check_byte_size(name, model, datatypes.element_size(datatype) * count, nbytes)
    return count


def check_string_count(name: str, model: str, count: int, got: int, protocol: str) -> None:
    """A BYTES input holds exactly the elements its shape says."""
    if got != count:
        rule = "string_count_over" if got > count else "string_count"
        # Triton's core stops at the first element too many: it names that one (count + 1).
        raise DataSizeError(_TEXTS[rule][protocol].format(
            name=name, model=model, count=count, got=got, over=count + 1))


def bytes_input(name: str, model: str, shape: list[int], buf: bytes | memoryview,
                protocol: str) -> np.ndarray:
    """A BYTES input from its length-prefixed wire bytes, its element count checked as Triton's
    core walks them (InferenceRequest::ValidateBytesInputs): a length prefix cut short, one
    element too many, or, when an element runs past the end of the data, the count of the
    elements begun. Where Triton would take a last element that runs past the end (the count
    then agrees), it is refused here: the model would read past the data."""
    count = datatypes.element_count(shape)
    view = memoryview(buf)
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if end - offset < 4:
            raise DataSizeError(
                f"incomplete string length indicator for inference input '{name}' for model "
                f"'{model}', expecting 4 bytes but only {end - offset} bytes available. Please "
                "make sure the string length indicator is in one buffer.")
        if len(items) == count:  # Triton stops at the element one too many
            check_string_count(name, model, count, count + 1, protocol)
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            if len(items) + 1 != count:
                check_string_count(name, model, count, len(items) + 1, protocol)
            raise InvalidArgumentError(f"input '{name}': unexpected end of BYTES tensor data: "
                                       f"element of {length} bytes overruns the buffer")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    check_string_count(name, model, count, len(items), protocol)
    return datatypes.bytes_array(items, shape)


def output_array(t: Tensor) -> np.ndarray:
    """An output's data as an array of its wire dtype, checked against its shape."""
    arr = t.data if isinstance(t.data, np.ndarray) else np.asarray(t.data)
    if t.datatype != "BYTES":
        want = datatypes.to_numpy(t.datatype)
        if arr.dtype != want:
            arr = arr.astype(want)
    if arr.size != datatypes.element_count(t.shape):
        raise InternalError(f"output tensor shape does not match size of output for '{t.name}'")
    return arr


_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def _stol(text: str) -> int | None:
    """std::stol as Triton calls it: leading white space, a sign and the digits that follow
    (what comes after them is ignored: "5abc" is 5); None where it throws."""
    match = _STOL.match(text)
    if match is None:
        return None
    value = int(match.group(1))
    return value if -2**63 <= value < 2**63 else None


def parse_version(version: str) -> int:
    """A requested model version as Triton parses it (GetModelVersionFromString); '' -> -1."""
    if not version:
        return -1
    value = _stol(version)
    if value is None:  # std::stol threw (no digits, or out of the range of a long)
        raise InvalidArgumentError(
            f"failed to get model version from specified version string '{version}' (details: "
            "stol), version should be an integral value > 0")
    if value < 0:
        raise InvalidArgumentError(
            f"invalid model version specified '{version}' , version should be an integral value > 0")
    return value


def load_parameters(params: dict[str, Any], protocol: str,
                    decode_file: Callable[[str, Any], bytes] | None = None
                    ) -> tuple[str | None, dict[str, bytes] | None]:
    """A model load's `config` (JSON text) and `file:<version>/<name>` parameters
    -> (config, {"<version>/<name>": bytes}); `decode_file(key, value)` turns a file's wire
    value into bytes (HTTP: base64)."""
    file_type = _LOAD_FILE_TYPE[protocol]
    config: Any = None
    files: dict[str, bytes] = {}
    value: Any
    for key, value in params.items():
        is_file = key.startswith("file:")
        want = file_type if is_file else str
        if file_type is str and not isinstance(value, str):  # HTTP: every value is text
            raise _error("load_type", protocol, key=key, kind=_PROTOBUF_KIND[str])
        if key != "config" and not is_file:
            raise _error("load_key", protocol, key=key)
        if not isinstance(value, want):
            raise _error("load_type", protocol, key=key, kind=_PROTOBUF_KIND[want])
        if is_file:
            files[key[5:]] = value if decode_file is None else decode_file(key, value)  # type: ignore[assignment]
        else:
            config = value
    return config, files or None


_INT64_MAX = 2**63 - 1


def _check_json_size(name: str, datatype: str, shape: list[int]) -> None:
    """Refuse JSON data whose element count or byte size overflows int64, in Triton's words."""
    count = datatypes.element_count(shape)
    shape_text = "[" + ",".join(str(d) for d in shape) + "]"
    if count > _INT64_MAX:
        raise InvalidArgumentError(
            f"invalid shape for input '{name}': shape {shape_text} causes total element count to "
            f"exceed maximum size of {_INT64_MAX}")
    size = datatypes.element_size(datatype)  # 0 for BYTES
    if size > 1 and count > _INT64_MAX // size:
        raise InvalidArgumentError(
            f"byte size overflow for input '{name}': element count ({count}) * data type size "
            f"({size}) exceeds maximum allowed size ({_INT64_MAX})")
