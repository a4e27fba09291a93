"""Triton's gRPC messages (`inference.*`) <-> `host.inference` types and the host's dicts. Pure.

Inference requests: every input comes either from `raw_input_contents` (all inputs do, in input
order; fixed-size data becomes a numpy view over the message's bytes, no copy) or from its typed
`contents`. Responses always carry their outputs in `raw_output_contents`, as Triton sends them.

Only the wire format is checked here; everything about the model (names, datatypes, shapes
against its config) and about reserved request parameters is the host's business.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from google.protobuf import json_format

from host import datatypes, validation
from host.errors import InvalidArgumentError, UnsupportedError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from host.parameters import Uint64
from host.proto import grpc_service_pb2 as pb
from host.request_plan import PlanCache, RequestPlan
from host.shm.tensors import mentions_shm

ModelInferResponse = pb.ModelInferResponse
InferOutputTensor = pb.ModelInferResponse.InferOutputTensor
ModelStreamInferResponse = pb.ModelStreamInferResponse

# Response parameter of the stream: true on the last response of a request.
FINAL_RESPONSE = "triton_final_response"
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

# Typed contents: (field, the datatype its values carry given the tensor's datatype, the numpy
# dtype protobuf holds them in). Triton's order (infer_handler.cc InferGRPCToInput): INT8/INT16
# ride in int_contents and UINT8/UINT16 in uint_contents; FP16 and BF16 have no field.
_CONTENTS = (
    ("bool_contents", lambda dt: "BOOL", np.dtype(np.bool_)),
    ("int_contents", lambda dt: dt if dt in ("INT8", "INT16") else "INT32", np.dtype(np.int32)),
    ("int64_contents", lambda dt: "INT64", np.dtype(np.int64)),
    ("uint_contents", lambda dt: dt if dt in ("UINT8", "UINT16") else "UINT32", np.dtype(np.uint32)),
    ("uint64_contents", lambda dt: "UINT64", np.dtype(np.uint64)),
    ("fp32_contents", lambda dt: "FP32", np.dtype(np.float32)),
    ("fp64_contents", lambda dt: "FP64", np.dtype(np.float64)),
    ("bytes_contents", lambda dt: "BYTES", None),
)


# --- parameters ------------------------------------------------------------------------------

def parameters_to_dict(params: Any) -> dict[str, Any]:
    """A map<string, InferParameter> as plain Python values (bool, int, str, float), as sent."""
    out: dict[str, Any] = {}
    for key in params:  # (the map's items() is a Python-level view: a generator per map)
        param = params[key]
        which = param.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param.")
        value = getattr(param, which)
        out[key] = Uint64(value) if which == "uint64_param" else value
    return out


def set_parameters(target: Any, params: dict[str, Any]) -> None:
    """Fill a map<string, InferParameter> from plain Python values."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, (bool, np.bool_)):
            param.bool_param = bool(value)
        elif isinstance(value, (int, np.integer)):
            value = int(value)
            if value > _INT64_MAX:
                param.uint64_param = value
            elif value >= _INT64_MIN:
                param.int64_param = value
            else:
                raise InvalidArgumentError(f"parameter '{key}' is out of the range of int64")
        elif isinstance(value, (float, np.floating)):
            param.double_param = float(value)
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise UnsupportedError(
                f"parameter '{key}' of type {type(value).__name__} cannot be sent over gRPC")


# --- request ---------------------------------------------------------------------------------

model_version = validation.parse_version  # the core's rule, with Triton's texts


def _from_raw(name: str, datatype: str, shape: list[int], buf: bytes, model: str) -> np.ndarray:
    if datatype == datatypes.INVALID:
        return datatypes.NO_DATA
    if datatype == "BYTES":
        return validation.bytes_input(name, model, shape, buf, "grpc")
    count = validation.fixed_size_count(name, model, datatype, shape, len(buf))
    return datatypes.shaped(np.frombuffer(buf, datatypes.to_numpy(datatype), count), shape)


def _from_contents(name: str, datatype: str, shape: list[int], contents: Any, model: str) -> np.ndarray:
    found = None
    for field, carried, dtype in _CONTENTS:
        values = getattr(contents, field)
        if not values:
            continue
        if found is not None:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', "
                "binary data was already supplied.")
        if carried(datatype) != datatype:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of "
                f"type '{carried(datatype)}', expected datatype '{datatype}'")
        found = (values, dtype)
    if datatype == datatypes.INVALID:  # no contents (any would have failed above)
        return datatypes.NO_DATA
    count = datatypes.element_count(shape)
    if datatype == "BYTES":
        items = list(found[0]) if found is not None else []
        validation.check_string_count(name, model, count, len(items), "grpc")
        return datatypes.bytes_array(items, shape)
    target = datatypes.to_numpy(datatype)
    if found is None:
        array = np.empty(0, target)
    else:
        # INT8/INT16/UINT8/UINT16 keep the low bytes of each 32-bit value, as Triton does.
        array = np.array(found[0], dtype=found[1]).astype(target, copy=False)
    size = datatypes.element_size(datatype)
    validation.check_byte_size(name, model, size * count, size * array.size)
    return array.reshape(shape)


def decode_infer_request(msg: Any) -> InferenceRequest:
    """A ModelInferRequest as an InferenceRequest (parameters passed on as plain values)."""
    model = msg.model_name
    raw = msg.raw_input_contents[:]  # (the bytes of each, as indexing would give them)
    raw_index = 0
    inputs: dict[str, Tensor] = {}
    uses_shm = False
    size_errors: dict[str, validation.DataSizeError] = {}  # inputs whose data does not fill their shape
    # Slices: upb's repeated fields make a list in one call, cheaper than its iteration.
    for tensor in msg.inputs[:]:
        name = tensor.name
        datatype = tensor.datatype
        if not datatypes.is_valid(datatype):  # refused by the core (datatypes.INVALID)
            datatype = datatypes.INVALID
        shape = tensor.shape[:]
        validation.check_shape(name, shape, model, "grpc")
        params = tensor.parameters
        extra = {}
        if params:
            extra = parameters_to_dict(params)
            if mentions_shm(extra):  # the host binds it to the region (host.shm)
                if tensor.HasField("contents"):
                    raise InvalidArgumentError(
                        f"unexpected 'content' provided when using shared memory for input tensor "
                        f"'{name}' for model '{model}'")
                validation.check_new_input(inputs, name, msg.id)
                if datatype == datatypes.INVALID:  # no region to bind: the core refuses it
                    inputs[name] = Tensor(name, datatype, shape, datatypes.NO_DATA)
                    continue
                inputs[name] = Tensor(name, datatype, shape, None, extra)
                uses_shm = True
                continue
        if tensor.HasField("contents"):
            if raw:
                raise InvalidArgumentError(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model}'")
            try:
                data = _from_contents(name, datatype, shape, tensor.contents, model)
            except validation.DataSizeError as exc:
                size_errors[name], data = exc, None
        elif raw_index < len(raw):
            try:
                data = _from_raw(name, datatype, shape, raw[raw_index], model)
            except validation.DataSizeError as exc:
                size_errors[name], data = exc, None
            raw_index += 1
        else:
            raise InvalidArgumentError(
                f"unable to find data for input tensor '{name}' for model '{model}' in request.")
        validation.check_new_input(inputs, name, msg.id)
        inputs[name] = Tensor(name, datatype, shape, data, extra)
    outputs = []
    for out in msg.outputs[:] if msg.outputs else ():
        oparams = out.parameters
        extra = {}
        if oparams:  # the host judges them (host.parameters.check_outputs, host.shm)
            extra = parameters_to_dict(oparams)
            uses_shm = uses_shm or mentions_shm(extra)
        outputs.append(RequestedOutput(out.name, extra))
    params = msg.parameters
    # positional: keyword arguments cost more, and this runs for every request
    request = InferenceRequest(model, model_version(msg.model_version), msg.id, inputs, outputs,
                               parameters_to_dict(params) if params else {}, "grpc")
    request.uses_shm = uses_shm
    if size_errors:  # Triton's core words them with the request's tag
        request.data_errors = validation.tagged(request, size_errors)
    return request


# --- request bytes: headers read before ------------------------------------------------------
#
# A client sends the same request again and again but for the tensors' bytes and the request id:
# the same model, inputs, shapes and outputs. The fields before `raw_input_contents` (field 7;
# tritonclient and perf_analyzer put it last), but for the id, are then the same bytes each time,
# and what they decode to can be kept (_Plan), keyed by those bytes: the message is split by hand
# (every field of a ModelInferRequest is length-delimited) and neither upb nor the field-by-field
# decoding runs. Anything else (another field after the raw contents, a field twice, a field this
# split does not know, data that does not fit the plan) goes through upb and
# `decode_infer_request`, whose errors are the answer.

_ID_TAG_IN = 3 << 3 | 2  # ModelInferRequest.id
_RAW_TAG = 7 << 3 | 2  # ModelInferRequest.raw_input_contents


class _Split:
    """A message cut at its id and its raw contents: `before` the id field, the id's value
    (`id_at`, `id_end`; id_at -1 without one), the fields `after` it up to the raw contents,
    and each raw content's (start, end)."""

    __slots__ = ("before", "id_at", "id_end", "after", "spans")

    def __init__(self, before: bytes, id_at: int, id_end: int, after: bytes,
                 spans: list[tuple[int, int]]) -> None:
        self.before, self.id_at, self.id_end, self.after, self.spans = before, id_at, id_end, after, spans

    @property
    def key(self) -> tuple[bytes, bytes, bool]:
        return self.before, self.after, self.id_at >= 0


def _raw_spans(data: bytes, pos: int) -> list[tuple[int, int]] | None:
    """(start, end) of each raw_input_contents field from `pos` to the end; None if any other
    field, or a malformed one, is there."""
    spans = []
    n = len(data)
    while pos < n:
        if data[pos] != _RAW_TAG:
            return None
        start, length = _length(data, pos + 1)
        end = start + length
        if start < 0 or end > n:
            return None
        spans.append((start, end))
        pos = end
    return spans


def _split(data: bytes) -> _Split | None:
    """The message cut as _Split says, when only raw contents follow the first of them, the id
    comes at most once and every field is well formed; else None."""
    pos, n = 0, len(data)
    id_tag = id_at = id_end = -1
    while pos < n:
        tag = data[pos]
        if tag == _RAW_TAG:
            break
        if tag & 7 != 2 or tag > 0x7F:  # fields 1-15, length-delimited: the message's own
            return None
        start, length = _length(data, pos + 1)
        end = start + length
        if start < 0 or end > n:
            return None
        if tag == _ID_TAG_IN:
            if id_tag >= 0:
                return None
            id_tag, id_at, id_end = pos, start, end
        pos = end
    spans = _raw_spans(data, pos)
    if spans is None:
        return None
    if id_tag < 0:
        return _Split(data[:pos], -1, -1, b"", spans)
    return _Split(data[:id_tag], id_at, id_end, data[id_end:pos], spans)


def _length(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and where what it measures starts; (-1, 0) when malformed."""
    value = shift = 0
    n = len(data)
    while pos < n and shift < 35:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return pos, value
        shift += 7
    return -1, 0


class _Message:
    """What stands for a planned request's message where a stream needs it."""

    __slots__ = ("model_name", "model_version", "id")

    def __init__(self, model_name: str, model_version: str, request_id: str) -> None:
        self.model_name, self.model_version, self.id = model_name, model_version, request_id


class _Plan:
    """A request plan (host.request_plan) with what locates it in a message: the fields before
    the id and after it, up to the raw contents; and the model the fields name."""

    __slots__ = ("before", "after", "has_id", "model", "version", "model_version", "plan")

    def __init__(self, split: _Split, request: InferenceRequest, msg: Any, plan: RequestPlan) -> None:
        self.before, self.after, self.has_id = split.key
        self.model, self.version, self.model_version = request.model_name, request.model_version, msg.model_version
        self.plan = plan

    def match(self, data: bytes) -> tuple[str, list[tuple[int, int]]] | None:
        """(id, raw spans) when `data` is this plan's fields around an id, then raw contents."""
        before = self.before
        if not data.startswith(before):
            return None
        pos = len(before)
        request_id = ""
        if self.has_id:
            if pos >= len(data) or data[pos] != _ID_TAG_IN:
                return None
            start, length = _length(data, pos + 1)
            pos = start + length
            text = _text(data, start, pos) if start >= 0 and pos <= len(data) else None
            if text is None:
                return None
            request_id = text
        if not data.startswith(self.after, pos):
            return None
        spans = _raw_spans(data, pos + len(self.after))
        return (request_id, spans) if spans is not None else None

    def build(self, data: bytes, request_id: str, spans: list[tuple[int, int]]) -> InferenceRequest | None:
        """The request, its inputs views of the raw contents in `data`; None when they do not
        fit (the full decoding then gives the error)."""
        return self.plan.build(self.model, self.version, request_id, "grpc", data, spans)


def _text(data: bytes, start: int, end: int) -> str | None:
    """A string field's value; None when it is not UTF-8 (upb refuses it: the full decoding
    then raises)."""
    try:
        return data[start:end].decode("utf-8")
    except UnicodeDecodeError:
        return None


_PLANS: PlanCache[tuple[bytes, bytes, bool], _Plan] = PlanCache()
_PLAN_KEY_MAX = 4096
_last_plan: _Plan | None = None  # the plan of the last request that had one: tried first


def parse_infer_request(data: bytes) -> InferenceRequest:
    """A serialized ModelInferRequest, decoded (`decode_infer_request`); raises protobuf's
    DecodeError for bytes that are not one."""
    planned, split = _planned(data)
    if planned is not None:
        return planned[1]
    msg = pb.ModelInferRequest.FromString(data)
    request = decode_infer_request(msg)
    _keep_plan(split, request, msg)
    return request


def read_stream_request(data: bytes) -> tuple[Any, InferenceRequest | Exception]:
    """A stream's request message: (the message, or what stands for it: its model_name,
    model_version and id; the decoded request, or the error decoding it raised, which the
    stream reports in the request's turn). Raises DecodeError as `parse_infer_request`."""
    planned, split = _planned(data)
    if planned is not None:
        plan, request = planned
        return _Message(plan.model, plan.model_version, request.id), request
    msg = pb.ModelInferRequest.FromString(data)
    try:
        request = decode_infer_request(msg)
    except Exception as exc:  # noqa: BLE001 - the stream answers it, in order
        return msg, exc
    _keep_plan(split, request, msg)
    return msg, request


def _planned(data: bytes) -> tuple[tuple[_Plan, InferenceRequest] | None, _Split | None]:
    """(the plan and its request, or None; the split when it was needed)."""
    global _last_plan
    last = _last_plan
    if last is not None:
        matched = last.match(data)
        if matched is not None:
            request = last.plan.build(last.model, last.version, matched[0], "grpc", data, matched[1])
            if request is not None:
                return (last, request), None
    split = _split(data)
    if split is not None:
        plan = _PLANS.plans.get(split.key)
        if plan is not None:
            request_id = _text(data, split.id_at, split.id_end) if split.id_at >= 0 else ""
            request = plan.build(data, request_id, split.spans) if request_id is not None else None
            if request is not None:
                _last_plan = plan
                return (plan, request), split
    return None, split


def _keep_plan(split: _Split | None, request: InferenceRequest, msg: Any) -> None:
    """Keep the plan of a request that can have one (host.request_plan), the second time it comes."""
    global _last_plan
    if split is None or len(split.before) + len(split.after) > _PLAN_KEY_MAX:
        return

    def make() -> _Plan | None:
        plan = RequestPlan.of(request, [end - start for start, end in split.spans])
        return _Plan(split, request, msg, plan) if plan is not None else None

    kept = _PLANS.offer(split.key, make)
    if kept is not None:
        _last_plan = kept


# --- response --------------------------------------------------------------------------------

def _raw_output(t: Tensor, view: bool = False) -> bytes | memoryview:
    arr = validation.output_array(t)
    if t.datatype == "BYTES":
        return datatypes.serialize_bytes(arr.reshape(-1))
    if view:  # no copy of contiguous data: the caller copies it once, into the message
        return datatypes.array_to_bytes(t.datatype, arr)
    return arr.tobytes()  # C order, whatever the array's layout


# Outputs at least this large are passed to the framing as views (no copy before the join).
LARGE_OUTPUT_BYTES = 1 << 16
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents: field 6, bytes
# ModelInferResponse: model_name 1, model_version 2, id 3, outputs 5 (InferOutputTensor: name 1,
# datatype 2, shape 3, packed int64); all length-delimited (wire type 2).
_NAME_TAG, _VERSION_TAG, _ID_TAG, _OUTPUT_TAG = b"\x0a", b"\x12", b"\x1a", b"\x2a"
_OUT_NAME_TAG, _OUT_DATATYPE_TAG, _OUT_SHAPE_TAG = b"\x0a", b"\x12", b"\x1a"
_SMALL_VARINTS = [bytes([i]) for i in range(128)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value] if value >= 0 else _varint(value & 0xFFFFFFFFFFFFFFFF)
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


# The framed fields a model's responses repeat, made once: (model name, version) -> fields 1-2;
# (output name, datatype, *shape) -> that output's field 5. Bounded: a client that varies shapes
# endlessly makes the cache start over, never grow.
_MODEL_FIELDS: dict[tuple, bytes] = {}
_OUTPUT_FIELDS: dict[tuple, bytes] = {}
_MAX_CACHED = 4096


def _remember(cache: dict[tuple, bytes], key: tuple, value: bytes) -> bytes:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def _model_fields(model_name: str, version: str) -> bytes:
    out = _delimited(_NAME_TAG, model_name.encode()) if model_name else b""
    return out + _delimited(_VERSION_TAG, version.encode()) if version else out


def _output_fields(t: Tensor) -> bytes:
    head = _delimited(_OUT_NAME_TAG, t.name.encode()) if t.name else b""
    if t.datatype:
        head += _delimited(_OUT_DATATYPE_TAG, t.datatype.encode())
    if t.shape:
        head += _delimited(_OUT_SHAPE_TAG, b"".join([_varint(int(d)) for d in t.shape]))
    return _delimited(_OUTPUT_TAG, head)


def _framed(response: InferenceResponse, request_id: str, parameters: bytes = b"") -> bytes:
    """The serialized ModelInferResponse of a response without parameters of its own, framed
    here from fields made once per model and output shape (`_MODEL_FIELDS`, `_OUTPUT_FIELDS`)
    rather than through upb messages made only to be serialized; `parameters`: field 4, framed
    (a stream's final flag). Fields in field-number order, empty strings left out, as protobuf
    writes them: tests/test_grpc_codec.py checks the bytes against upb's."""
    key = (response.model_name, str(response.model_version))
    head = _MODEL_FIELDS.get(key)
    if head is None:
        head = _remember(_MODEL_FIELDS, key, _model_fields(*key))
    parts: list[bytes | memoryview] = [head]
    rid = response.id or request_id
    if rid:
        parts.append(_delimited(_ID_TAG, rid.encode()))
    if parameters:
        parts.append(parameters)
    raws = []
    for t in response.outputs:
        okey = (t.name, t.datatype, *t.shape)
        fields = _OUTPUT_FIELDS.get(okey)
        if fields is None:
            fields = _remember(_OUTPUT_FIELDS, okey, _output_fields(t))
        parts.append(fields)
        # An output written to shared memory keeps its place with empty contents: clients
        # index raw_output_contents by output position.
        data = t.data
        raws.append(b"" if data is None else _raw_output(
            t, view=isinstance(data, np.ndarray) and data.nbytes >= LARGE_OUTPUT_BYTES))
    _add_raw_contents(parts, raws)
    return b"".join(parts)


def _add_raw_contents(parts: list[bytes | memoryview], raws: list) -> None:
    """Frame each output's raw bytes as a raw_output_contents field (6) onto `parts`."""
    small = _SMALL_VARINTS
    for raw in raws:
        size = len(raw)
        parts.append(_RAW_OUTPUT_TAG + (small[size] if size < 128 else _varint(size)))
        parts.append(raw)


class FramedResponse:
    """A ModelInferResponse whose raw_output_contents are appended as framed bytes (a response
    with parameters: its small part goes through upb).

    upb's encoder takes about 100-300 ms for one 16 MiB bytes field here (it grows its buffer
    step by step), against a few ms for one copy. A message's fields may come in any order, so the
    small part goes through upb and the tensors are framed after it, with one join (one copy).
    Used for unary responses; streams embed the message and keep `encode_infer_response`.
    """

    __slots__ = ("head", "raws")

    def __init__(self, head: Any, raws: list) -> None:
        self.head, self.raws = head, raws

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf method name the server calls
        parts: list[bytes | memoryview] = [self.head.SerializeToString()]
        _add_raw_contents(parts, self.raws)
        return b"".join(parts)


def _plain(response: InferenceResponse) -> bool:
    """Whether neither the response nor an output carries parameters (`_framed` frames it)."""
    if response.parameters:
        return False
    for t in response.outputs:
        if t.parameters:
            return False
    return True


def encode_unary_response(response: InferenceResponse, request_id: str = "") -> bytes | FramedResponse:
    """The ModelInfer answer, serialized (`_framed`), or a `FramedResponse` when the
    response or an output carries parameters."""
    if _plain(response):
        return _framed(response, request_id)
    msg = encode_infer_response(response, request_id, with_contents=False)
    raws = [_raw_output(t, view=True) if t.data is not None else b"" for t in response.outputs]
    return FramedResponse(msg, raws)


def encode_infer_response(response: InferenceResponse, request_id: str = "",
                          with_contents: bool = True) -> Any:
    """A ModelInferResponse carrying every output in raw_output_contents (unless `with_contents`
    is False: then the caller frames them, see `FramedResponse`)."""
    outputs = []
    raws: list = []
    for t in response.outputs:
        out = InferOutputTensor(name=t.name, datatype=t.datatype, shape=t.shape)
        if t.parameters:
            set_parameters(out.parameters, t.parameters)
        outputs.append(out)
        # An output written to shared memory keeps its place with empty contents: clients
        # index raw_output_contents by output position.
        if with_contents:
            raws.append(_raw_output(t) if t.data is not None else b"")
    msg = ModelInferResponse(model_name=response.model_name, model_version=str(response.model_version),
                             id=response.id or request_id, outputs=outputs, raw_output_contents=raws)
    if response.parameters:
        set_parameters(msg.parameters, response.parameters)
    return msg


def _final_flag(final: bool) -> bytes:
    """ModelInferResponse.parameters (field 4) holding `triton_final_response`: one map entry
    (key 1, value 2: an InferParameter whose bool_param, field 1, a oneof member, is written
    even when false)."""
    key = FINAL_RESPONSE.encode()
    value = _delimited(b"\x12", b"\x08" + (b"\x01" if final else b"\x00"))
    return _delimited(b"\x22", _delimited(b"\x0a", key) + value)


_FINAL_FLAGS = (_final_flag(False), _final_flag(True))
_STREAM_INFER_TAG = b"\x12"  # ModelStreamInferResponse.infer_response: field 2


def stream_response(response: InferenceResponse, final: bool, request_id: str = "") -> Any:
    """One response of a stream, serialized (a message when the response carries parameters);
    `triton_final_response` says whether it is the request's last."""
    if _plain(response):
        return _delimited(_STREAM_INFER_TAG, _framed(response, request_id, _FINAL_FLAGS[final]))
    msg = ModelStreamInferResponse(infer_response=encode_infer_response(response, request_id))
    msg.infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return msg


def stream_error(message: str, request_id: str, model_name: str = "", model_version: str = "",
                 final: bool | None = None) -> Any:
    """An error on a stream: the message, and the id of the request it belongs to."""
    msg = ModelStreamInferResponse(error_message=message)
    infer = msg.infer_response
    infer.id = request_id
    infer.model_name = model_name
    infer.model_version = model_version
    if final is not None:
        infer.parameters[FINAL_RESPONSE].bool_param = final
    return msg


def stream_empty_final(request_id: str, model_name: str, model_version: str) -> Any:
    """The flags-only final response of a decoupled model (when the client asked for it)."""
    msg = ModelStreamInferResponse()
    infer = msg.infer_response
    infer.id = request_id
    infer.model_name = model_name
    infer.model_version = model_version
    infer.parameters[FINAL_RESPONSE].bool_param = True
    return msg


# --- metadata, statistics, repository ---------------------------------------------------------

def server_metadata(doc: dict[str, Any]) -> Any:
    return pb.ServerMetadataResponse(name=doc["name"], version=doc["version"],
                                     extensions=doc.get("extensions", []))


def model_metadata(doc: dict[str, Any]) -> Any:
    tensor = pb.ModelMetadataResponse.TensorMetadata

    def tensors(items: Iterable[dict[str, Any]]) -> list[Any]:
        return [tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in items]

    return pb.ModelMetadataResponse(name=doc["name"], versions=doc.get("versions", []),
                                    platform=doc.get("platform", ""),
                                    inputs=tensors(doc.get("inputs", [])),
                                    outputs=tensors(doc.get("outputs", [])))


def statistics(doc: dict[str, Any]) -> Any:
    """The statistics dict the HTTP front end serves, as a ModelStatisticsResponse."""
    return json_format.ParseDict(doc, pb.ModelStatisticsResponse())


def repository_index(rows: list[dict[str, Any]]) -> Any:
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(models=[
        index(name=r["name"], version=r.get("version", ""), state=r.get("state", ""),
              reason=r.get("reason", "")) for r in rows])


def _repository_value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def load_parameters(params: Any) -> tuple[str | None, dict[str, bytes] | None]:
    """`config` (JSON text) and `file:<version>/<name>` (bytes) -> (config, {"<version>/<name>": bytes}),
    checked by the core (Triton's gRPC words)."""
    return validation.load_parameters({k: _repository_value(p) for k, p in params.items()}, "grpc")


def unload_dependents(params: Any) -> bool:
    if "unload_dependents" not in params:
        return False
    value = _repository_value(params["unload_dependents"])
    if type(value) is not bool:
        raise InvalidArgumentError(
            "invalid value type for 'unload_dependents' parameter, expected bool_param.")
    return value


def check_repository_name(name: str) -> None:
    if name:
        raise UnsupportedError("'repository_name' specification is not supported")


# --- trace and logging extensions -------------------------------------------------------------

def trace_changes(settings: Any) -> dict[str, Any]:
    """TraceSettingRequest.settings -> the host's changes: no value clears a setting, trace_level
    takes a list, every other setting exactly one value (Triton's rule)."""
    changes: dict[str, Any] = {}
    for key, setting in settings.items():
        values = list(setting.value)
        if not values:
            changes[key] = None
        elif key == "trace_level":
            changes[key] = values
        elif key in ("trace_rate", "trace_count", "log_frequency") and len(values) != 1:
            raise InvalidArgumentError(f"expect only 1 value for '{key}'")
        else:
            changes[key] = values[0] if key != "trace_file" else values
    return changes


def trace_setting(setting: dict[str, Any]) -> Any:
    response = pb.TraceSettingResponse()
    for key, value in setting.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response


_LOG_KINDS = {"log_info": "bool_param", "log_warning": "bool_param", "log_error": "bool_param",
              "log_verbose_level": "uint32_param", "log_format": "string_param"}
_LOG_EXPECT = {"bool_param": "boolean", "uint32_param": "int32", "string_param": "string"}


def log_changes(settings: Any) -> dict[str, Any]:
    """LogSettingsRequest.settings -> the host's changes, each of the type Triton expects."""
    changes: dict[str, Any] = {}
    for key, setting in settings.items():
        chosen = setting.WhichOneof("parameter_choice")
        if key == "log_file":
            changes[key] = getattr(setting, chosen) if chosen else ""  # refused by the host
            continue
        kind = _LOG_KINDS.get(key)
        if kind is None:
            continue
        if chosen != kind:
            raise InvalidArgumentError(f"expect {_LOG_EXPECT[kind]} for '{key}'")
        changes[key] = getattr(setting, kind)
    return changes


def log_settings(settings: dict[str, Any]) -> Any:
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        entry = response.settings[key]
        if type(value) is bool:
            entry.bool_param = value
        elif type(value) is int:
            entry.uint32_param = value
        else:
            entry.string_param = value
    return response
