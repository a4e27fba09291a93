"""KServe v2 / Triton HTTP inference wire format <-> `host.inference` types. Pure functions.

Requests: a JSON inference header, optionally followed (binary tensor data extension) by the raw
bytes of the inputs that carry `parameters.binary_data_size`, in input order; the header's length
is then given by the `Inference-Header-Content-Length` HTTP header. Binary inputs become numpy
views over the body (no copy). Responses: JSON, or JSON followed by the raw bytes of the outputs
sent in binary (`binary_data` on a requested output, else the request's `binary_data_output`).

Only the wire format is checked here; everything about the model (names, datatypes, shapes
against its config) is the host's business.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import orjson

from host import datatypes, raw_input, validation
from host.errors import HostError, InvalidArgumentError, UnsupportedError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from host.request_plan import PlanCache, RequestPlan
from host.shm.tensors import REGION, mentions_shm

HEADER_LENGTH = "Inference-Header-Content-Length"

_INTEGER = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"))
_NOT_IN_JSON = frozenset(("FP16", "BF16"))
# TritonJson's texts for an element of the wrong JSON type (Triton: "Unable to parse 'data': ...")
_WRONG_TYPE = {"BOOL": "non-boolean as boolean", "FP32": "non-number as double",
               "FP64": "non-number as double"}
_WRONG_TYPE.update({dt: "non-unsigned-integer as unsigned-integer" if dt.startswith("U")
                    else "non-signed-integer as signed-integer" for dt in _INTEGER})
BYTES_NOT_STRING = "Unable to parse JSON bytes array: attempt to access JSON non-string as string"
_LIMITS = {dt: np.iinfo(datatypes.to_numpy(dt)) for dt in _INTEGER}
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(slots=True)
class OutputFormat:
    """How each output goes back: in binary or as JSON `data`."""

    default_binary: bool = False
    binary: dict[str, bool] = field(default_factory=dict)

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.default_binary)


# --- JSON helpers ----------------------------------------------------------------------------

# orjson parses nested arrays and objects recursively and (3.8) overflows the C stack on a body
# nested some 100,000 deep, killing the worker (60,000 still parse on an 8 MiB thread stack).
# Bodies that may nest deeper than this go to `_load_nested`, which takes any depth as
# rapidjson's iterative parser does; `data` nested past Triton's limit then gets Triton's own
# message (MAX_JSON_NESTING_DEPTH), other members the text of whatever reads them.
_ORJSON_MAX_NESTING = 10_000
_SCAN_CHUNK = 1 << 20


def _may_nest_deeper(buf: bytes | memoryview, limit: int) -> bool:
    """Whether the brackets in `buf` nest deeper than `limit` (brackets inside strings count
    too: a false alarm only costs the slower parser)."""
    if len(buf) <= limit:  # too short to hold that many brackets (most bodies)
        return False
    raw = bytes(buf) if isinstance(buf, memoryview) else buf
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    arr = np.frombuffer(raw, np.uint8)
    depth = 0
    for start in range(0, arr.size, _SCAN_CHUNK):
        part = arr[start:start + _SCAN_CHUNK]
        steps = ((part == 0x5B) | (part == 0x7B)).astype(np.int32)
        steps -= (part == 0x5D) | (part == 0x7D)
        running = np.cumsum(steps) + depth
        if running.max() > limit:
            return True
        depth = int(running[-1])
    return False


_ABSENT = object()  # a member the request does not have (None is JSON's null)


def load_json_object(buf: bytes | memoryview) -> dict[str, Any]:
    """An optional JSON object body: {} when empty; anything but an object is refused."""
    if not buf:
        return {}
    doc = load_json(buf)
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the request JSON must be an object")
    return doc


def load_json(buf: bytes | memoryview) -> Any:
    if _may_nest_deeper(buf, _ORJSON_MAX_NESTING):
        # As deep as rapidjson's iterative parser takes it: the caller then refuses what it
        # finds there with its own text (Triton's L0_http test_repository_index_deeply_nested_json)
        text = _RAPIDJSON_WORDS.sub(_python_word, bytes(buf).decode("utf-8", "surrogateescape"))
        try:
            return _load_nested(text)
        except ValueError as exc:
            raise InvalidArgumentError(f"failed to parse the request JSON buffer: {exc}") from None
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError as exc:
        error: Exception = exc
    # What orjson refuses but Triton's parser (rapidjson, kParseNanAndInfFlag, no encoding
    # validation) takes: NaN / Infinity / -Infinity, and strings holding bytes that are not
    # UTF-8 (kept byte for byte through `surrogateescape`; see `_utf8`).
    text = bytes(buf).decode("utf-8", "surrogateescape")
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:  # rapidjson's other spellings: Inf, -Inf, -NaN (outside strings only)
        return json.loads(_RAPIDJSON_WORDS.sub(_python_word, text))
    except json.JSONDecodeError as exc:
        message = rapidjson_error(exc)
    except ValueError:
        message = str(error)
    raise InvalidArgumentError(f"failed to parse the request JSON buffer: {message}") from None


# Python's json messages -> rapidjson's (GetParseError_En), which Triton's answers carry.
_RAPIDJSON_TEXTS = (
    ("Expecting property name enclosed in double quotes", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Extra data", "The document root must not be followed by other values."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
)


def rapidjson_error(exc: json.JSONDecodeError) -> str:
    """A JSON syntax error in Triton's words: rapidjson's message and " at <offset>"."""
    doc, pos = exc.doc, exc.pos
    if exc.msg == "Expecting value":
        text = "The document is empty." if not doc.strip() else "Invalid value."
    elif exc.msg == "Expecting ',' delimiter":
        text = "Missing a comma or '}' after an object member." if _innermost(doc, pos) == "{" \
            else "Missing a comma or ']' after an array element."
    else:
        text = next((new for old, new in _RAPIDJSON_TEXTS if exc.msg.startswith(old)), "Invalid value.")
        if exc.msg.startswith("Unterminated string"):
            pos = len(doc)  # rapidjson stops at the end of the text
    return f"{text} at {len(doc[:pos].encode('utf-8', 'surrogateescape'))}"


def _innermost(doc: str, pos: int) -> str:
    """The bracket ('{' or '[') open at `pos` of a JSON text, strings skipped."""
    stack, quoted, escaped = [], False, False
    for ch in doc[:pos]:
        if quoted:
            escaped, quoted = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            quoted = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


_DECODER = json.JSONDecoder()
_BLANK = re.compile(r"[ \t\n\r]*")


def _load_nested(text: str) -> Any:
    """JSON text of any nesting depth, parsed with an explicit stack (Python's json and orjson
    recurse); scalars and keys are read by Python's json scanner."""
    scan = _DECODER.scan_once  # type: ignore[attr-defined]
    blank = _skip_blank
    stack: list[Any] = []  # open lists and dicts
    keys: list[str] = []  # for each open dict, the key of the value being read
    pos = blank(text, 0)
    while True:
        ch = text[pos:pos + 1]
        if ch == "[" or ch == "{":  # open a container; an empty one is a value at once
            pos = blank(text, pos + 1)
            if text[pos:pos + 1] == ("]" if ch == "[" else "}"):
                value: Any = [] if ch == "[" else {}
                pos += 1
            else:
                stack.append([] if ch == "[" else {})
                if ch == "{":
                    pos = _key(text, pos, keys)
                continue
        else:
            try:
                value, pos = scan(text, pos)
            except StopIteration:
                raise ValueError(f"expecting a value at character {pos}") from None
        while True:  # place the value, then read what follows it
            if not stack:
                if blank(text, pos) != len(text):
                    raise ValueError(f"extra data at character {pos}")
                return value
            top = stack[-1]
            if type(top) is list:
                top.append(value)
            else:
                top[keys.pop()] = value
            pos = blank(text, pos)
            ch = text[pos:pos + 1]
            if ch == ",":
                pos = blank(text, pos + 1)
                if type(top) is dict:
                    pos = _key(text, pos, keys)
                break
            if ch != ("]" if type(top) is list else "}"):
                raise ValueError(f"expecting ',' or a closing bracket at character {pos}")
            pos += 1
            value = stack.pop()


def _key(text: str, pos: int, keys: list[str]) -> int:
    """Read `"key" :` at `pos` onto `keys`; the position of the value that follows."""
    if text[pos:pos + 1] != '"':
        raise ValueError(f"expecting a property name at character {pos}")
    key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
    pos = _skip_blank(text, pos)
    if text[pos:pos + 1] != ":":
        raise ValueError(f"expecting ':' at character {pos}")
    keys.append(key)
    return _skip_blank(text, pos + 1)


def _skip_blank(text: str, pos: int) -> int:
    """The position of the first character at or after `pos` that is not JSON whitespace."""
    match = _BLANK.match(text, pos)
    return match.end() if match is not None else pos


# A JSON string (kept as it is), or a bare Inf / -Inf / -NaN that Python's json does not know.
_RAPIDJSON_WORDS = re.compile(r'"(?:[^"\\]|\\.)*"|-?Inf(?!inity)|-NaN')


def _python_word(match: re.Match) -> str:
    word = match.group(0)
    if word.startswith('"'):
        return word
    return {"Inf": "Infinity", "-Inf": "-Infinity", "-NaN": "NaN"}[word]


def dump_json(obj: Any, exact: bool = False) -> bytes:
    """JSON bytes; `exact` (or a string orjson refuses) takes the path that writes NaN and
    Infinity, and string bytes that are not UTF-8, as Triton writes them."""
    if not exact:
        try:
            return orjson.dumps(obj, option=_JSON_OPTS, default=_json_default)
        except orjson.JSONEncodeError as exc:
            if isinstance(exc.__cause__, HostError):
                raise exc.__cause__ from None
    text = json.dumps(obj, ensure_ascii=False, allow_nan=True, separators=(",", ":"),
                      default=_json_default)
    return text.encode("utf-8", "surrogateescape")


def _utf8(text: str) -> bytes:
    """The bytes of a JSON string: undoes `surrogateescape`, so bytes that were not UTF-8 on
    the way in come out as they were; a lone surrogate written as an escape is encoded as is."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):  # one orjson does not take as is (not contiguous, big-endian)
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        raise UnsupportedError("parameters of type bytes cannot be sent in a JSON response")
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


# Triton's HTTP_MAX_JSON_NESTING_DEPTH: deeper `data` is refused with its message.
MAX_JSON_NESTING_DEPTH = 100


def _flatten(data: Iterable[Any]) -> Iterator[Any]:
    """The elements of nested lists, in order; iterative, so no nesting can exhaust the stack."""
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                # Triton refuses an element at depth 100 (the data array is depth 0); this
                # list's items would be at depth len(stack) + 1.
                if len(stack) + 1 >= MAX_JSON_NESTING_DEPTH:
                    raise InvalidArgumentError(
                        f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING_DEPTH})")
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def json_values(name: str, datatype: str, data: list, what: str = "input") -> np.ndarray:
    """A flat array of the elements of JSON `data` (a list, flat or nested) as `datatype`."""
    if datatype == "BYTES":
        items = []
        for value in _flatten(data):
            if type(value) is not str:
                raise InvalidArgumentError(BYTES_NOT_STRING)
            items.append(_utf8(value))
        return datatypes.bytes_array(items, (len(items),))
    if datatype in _NOT_IN_JSON:
        raise InvalidArgumentError(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for {what} {name}")  # Triton's text: the name unquoted
    dtype = datatypes.to_numpy(datatype)
    if not data:
        return np.empty(0, dtype)
    try:
        arr = np.array(data)
    except (ValueError, OverflowError):  # ragged nesting: count the elements anyway
        try:
            arr = np.array(list(_flatten(data)))
        except (ValueError, OverflowError):
            arr = np.empty(0, np.object_)
    kind = arr.dtype.kind
    if datatype in _INTEGER:
        ok = kind in "iu"
        if not ok and kind in "fO":  # ints beyond int64 make numpy choose float64 or object
            return _big_integers(name, datatype, dtype, data, what)
    elif datatype == "BOOL":
        ok = kind == "b"
    else:
        ok = kind in "iuf"
    if not ok:
        raise _wrong_type(datatype)
    if datatype in _INTEGER:
        info = _LIMITS[datatype]
        if arr.min() < info.min or arr.max() > info.max:
            raise InvalidArgumentError(
                f"Unable to parse 'data' of {what} '{name}': value out of range for datatype "
                f"{datatype}")
    return arr.reshape(-1).astype(dtype, copy=False)


def _wrong_type(datatype: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Unable to parse 'data': attempt to access JSON {_WRONG_TYPE[datatype]}")


def _big_integers(name: str, datatype: str, dtype: np.dtype, data: list, what: str) -> np.ndarray:
    flat = list(_flatten(data))
    if not all(type(v) is int for v in flat):
        raise _wrong_type(datatype)
    try:
        return np.array(flat, dtype=dtype)
    except OverflowError:
        raise InvalidArgumentError(
            f"Unable to parse 'data' of {what} '{name}': value out of range for datatype "
            f"{datatype}") from None


def json_to_array(name: str, datatype: str, data: Any, shape: list[int]) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidArgumentError("Unable to parse 'data': attempt to access JSON non-array as array")
    flat = json_values(name, datatype, data)
    count = datatypes.element_count(shape)
    if flat.size != count:
        if datatype != "BYTES":  # Triton's texts (its L0_http test.sh greps for them)
            raise InvalidArgumentError(
                "Failed to parse 'data' field: shape does not match true shape" if flat.size < count
                else "Unable to parse 'data': Shape does not match true shape of 'data' field")
        raise InvalidArgumentError(
            f"Unable to parse 'data' of input '{name}': shape {shape} needs {count} elements, "
            f"but 'data' holds {flat.size}")
    return flat.reshape(shape)


def _text(value: Any) -> str:
    """A BYTES element as JSON text; bytes that are not UTF-8 are carried through
    `surrogateescape` and written back as the raw bytes (Triton writes them unchanged)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else str(value)


def _non_finite(data: Any) -> bool:
    """Whether JSON float data holds NaN or an infinity (orjson would write them as null)."""
    return isinstance(data, np.ndarray) and data.dtype.kind == "f" and not np.isfinite(data).all()


output_array = validation.output_array  # the core's rule (kept here for generate.py's import)


def json_data(t: Tensor, arr: np.ndarray) -> Any:
    """The flat JSON `data` of an output: an array orjson writes as is, or a list of str."""
    if t.datatype == "BYTES":
        return [_text(v) for v in arr.reshape(-1)]
    if t.datatype in _NOT_IN_JSON:
        raise InvalidArgumentError(
            "sending " + t.datatype + " data via JSON is not supported. Please use the binary data "
            "format for output")  # Triton's text, without the output's name
    flat = arr.reshape(-1)
    if not flat.dtype.isnative or not flat.flags.c_contiguous:
        flat = np.ascontiguousarray(flat, flat.dtype.newbyteorder("="))
    return flat


# --- request ---------------------------------------------------------------------------------

def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The `Inference-Header-Content-Length` header: None when absent (JSON-only body)."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse {HEADER_LENGTH}, got: {value}") from None
    if n < 0 or n > body_length:
        raise InvalidArgumentError(
            f"inference header size should be in range (0, {body_length}), got: {value}")
    return n  # 0: a raw binary request (the whole body is the model's one input)


def _nonneg_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _check_parameter(key: str, value: Any) -> None:
    if type(value) not in (str, int, bool, float):
        raise InvalidArgumentError(
            f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def request_parameters(params: Any) -> tuple[dict[str, Any], bool]:
    """The request's parameters for the host, and the `binary_data_output` flag; `params` is
    _ABSENT when the request has none (JSON's null is refused, as any non-object)."""
    if params is _ABSENT:
        return {}, False
    if not isinstance(params, dict):
        raise InvalidArgumentError("failed to get request params.: attempt to get members for non-object")
    out: dict[str, Any] = {}
    binary = False
    for key, value in params.items():
        if key == "binary_data_output":
            if type(value) is not bool:
                raise validation.json_field_error("binary_data_output", "boolean")
            binary = value
            continue
        _check_parameter(key, value)  # reserved keys are the host's to interpret (host.parameters)
        out[key] = value
    return out, binary


def _decode_input(item: Any, view: memoryview, offset: int, has_header: bool,
                  model_name: str) -> tuple[Tensor, int, validation.DataSizeError | None]:
    """An input of the JSON header, its binary data (from `offset`) taken; and the error of data
    that does not fill its shape, which the caller keeps for later (Triton's core order)."""
    # Triton's order: where the data is, then name, datatype and shape, each read as TritonJson
    # reads it (an element that is not an object has no member; parameters that are not an
    # object have none either: Triton ignores them).
    if type(item) is not dict:
        item = {}
    params = item.get("parameters")
    if type(params) is not dict:
        params = {}
    has_data = "data" in item
    has_binary = "binary_data_size" in params
    has_shm = REGION in params  # Triton's HTTP rule: a size without a region is no reference
    if has_data + has_binary + has_shm != 1:
        given = [f"'{k}'" for k, on in (("data", has_data), ("binary_data_size", has_binary),
                                         ("shared_memory_region", has_shm)) if on]
        raise InvalidArgumentError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' "
            "in 'parameters', 'shared_memory_region' in 'parameters'. But "
            + (("set " + " ".join(given)) if given else "no field is set"))
    name = item.get("name")
    if type(name) is not str:
        raise validation.json_field_error("name", "string", item)
    datatype = item.get("datatype")
    if type(datatype) is not str:
        raise validation.json_field_error("datatype", "string", item)
    shape = item.get("shape")
    if type(shape) is not list:
        raise validation.json_field_error("shape", "array", item)
    for d in shape:  # a loop, not all() over a generator: this runs for every input
        if type(d) is not int:
            raise validation.shape_error(name, shape, model_name, "http")
    known = datatypes.is_valid(datatype)
    if has_data and not known:  # Triton's front end, as it reads JSON data
        raise InvalidArgumentError(f"invalid datatype for input {name}")
    # JSON data: Triton's texts for a size that overflows int64 come before the shared limits.
    validation.check_shape(name, shape, model_name, "http",
                           json_datatype=datatype if has_data else None)
    if not known and has_shm:  # refused by the core (datatypes.INVALID)
        return Tensor(name, datatypes.INVALID, shape, datatypes.NO_DATA), offset, None
    if has_shm:  # the host binds it to the region (host.shm)
        return Tensor(name, datatype, shape, None, dict(params)), offset, None
    if has_binary:
        size = params["binary_data_size"]
        if not _nonneg_int(size):
            raise validation.json_field_error("binary_data_size", "unsigned-integer")
        if not has_header:
            raise InvalidArgumentError(
                f"must specify valid '{HEADER_LENGTH}' in request header and 'binary_data_size' "
                "when passing inputs in binary data format")
        end = offset + size
        if end > len(view):
            raise InvalidArgumentError(
                f"unexpected size for input '{name}', expecting {end - len(view)} additional bytes "
                f"for model '{model_name}'")
        if not known:  # its bytes skipped; refused by the core (datatypes.INVALID)
            return Tensor(name, datatypes.INVALID, shape, datatypes.NO_DATA), end, None
        try:
            if datatype == "BYTES":
                data = validation.bytes_input(name, model_name, shape, view[offset:end], "http")
            else:
                count = validation.fixed_size_count(name, model_name, datatype, shape, size)
                data = datatypes.shaped(np.frombuffer(view, datatypes.to_numpy(datatype), count, offset),
                                        shape)
        except validation.DataSizeError as exc:  # Triton's core's check: raised after the count
            return Tensor(name, datatype, shape, None, {}), end, exc
        offset = end
        extra = {k: v for k, v in params.items() if k != "binary_data_size"} if len(params) > 1 else {}
    else:
        data = json_to_array(name, datatype, item["data"], shape)
        extra = dict(params)
    return Tensor(name, datatype, shape, data, extra), offset, None


def _requested_outputs(outputs: Any) -> tuple[list[RequestedOutput], dict[str, bool]]:
    if outputs is _ABSENT:
        return [], {}
    if type(outputs) is not list:
        raise validation.json_field_error("outputs", "array")
    requested: list[RequestedOutput] = []
    binary: dict[str, bool] = {}
    for item in outputs:
        if type(item) is not dict:  # as TritonJson reads it: no member
            item = {}
        name = item.get("name")
        if type(name) is not str:
            raise validation.json_field_error("name", "string", item)
        params = item.get("parameters")
        extra: dict[str, Any] = {}
        is_binary = None
        if type(params) is dict:  # (Triton ignores parameters that are not an object)
            for key, value in params.items():
                if key == "binary_data":
                    if type(value) is not bool:
                        raise validation.json_field_error("binary_data", "boolean")
                    is_binary = value
                else:  # the host judges the rest (host.parameters.check_outputs)
                    extra[key] = value
        if is_binary and mentions_shm(extra):  # tritonclient sends binary_data=false with it
            raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'binary_data'")
        binary[name] = is_binary  # type: ignore[assignment]
        requested.append(RequestedOutput(name, extra))
    return requested, {k: v for k, v in binary.items() if v is not None}


class _Plan:
    """A request plan (host.request_plan) of a binary request's JSON header, with what else the
    header says: the request's id and how its outputs go back."""

    __slots__ = ("plan", "request_id", "default_binary", "binary")

    def __init__(self, plan: RequestPlan, request_id: str, fmt: OutputFormat) -> None:
        self.plan, self.request_id = plan, request_id
        self.default_binary, self.binary = fmt.default_binary, dict(fmt.binary)

    def build(self, view: memoryview, header_length: int, model_name: str,
              model_version: int) -> tuple[InferenceRequest, OutputFormat] | None:
        """The request, its inputs views of the binary data after the header; None when the data
        does not fit (the full decoding then gives the error)."""
        request = self.plan.build(model_name, model_version, self.request_id, "http", view, None,
                                  header_length)
        if request is None:
            return None
        return request, OutputFormat(self.default_binary, dict(self.binary) if self.binary else {})


_PLANS: PlanCache[bytes, _Plan] = PlanCache()  # by the header's bytes
_PLAN_HEADER_MAX = 4096  # longer headers are not kept (they carry many inputs: reading them dominates less)


def decode_infer_request(body: bytes | memoryview, header_length: int | None, model_name: str,
                         model_version: int = -1) -> tuple[InferenceRequest, OutputFormat]:
    """Decode an infer request body; `header_length` from `Inference-Header-Content-Length`."""
    if header_length == 0:
        return _raw_request(body, model_name, model_version)
    view = memoryview(body)
    if header_length is None or header_length > _PLAN_HEADER_MAX:
        return _decode(view, header_length, model_name, model_version, None)
    key = bytes(view[:header_length])
    plan = _PLANS.plans.get(key)
    if plan is not None:
        decoded = plan.build(view, header_length, model_name, model_version)
        if decoded is not None:
            return decoded
    return _decode(view, header_length, model_name, model_version, key)


def _decode(view: memoryview, header_length: int | None, model_name: str, model_version: int,
            key: bytes | None) -> tuple[InferenceRequest, OutputFormat]:
    """The full decoding; with `key` (the header's bytes) it keeps a _Plan of a header that can
    have one."""
    end = len(view) if header_length is None else header_length
    doc = load_json(view[:end])
    if not isinstance(doc, dict):  # Triton finds no member in it: 'inputs' is missing
        raise validation.json_field_error("inputs", "array", {})
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise validation.json_field_error("id", "string")
    parameters, default_binary = request_parameters(doc.get("parameters", _ABSENT))
    inputs_json = doc.get("inputs")
    if type(inputs_json) is not list:
        raise validation.json_field_error("inputs", "array", doc)
    inputs: dict[str, Tensor] = {}
    offset = end
    has_header = header_length is not None
    data_errors: dict[str, validation.DataSizeError] = {}  # inputs whose data does not fill their shape
    sizes: list[int] = []  # the byte size of each input's binary data (a plan's, host.request_plan)
    for item in inputs_json:
        start = offset
        tensor, offset, error = _decode_input(item, view, offset, has_header, model_name)
        validation.check_new_input(inputs, tensor.name, request_id)
        inputs[tensor.name] = tensor
        if error is not None:
            data_errors[tensor.name] = error
        if offset > start:
            sizes.append(offset - start)
    if offset != len(view):
        raise InvalidArgumentError(f"unexpected additional input data for model '{model_name}'")
    outputs, binary = _requested_outputs(doc.get("outputs", _ABSENT))
    # positional: keyword arguments cost more, and this runs for every request
    request = InferenceRequest(model_name, model_version, request_id, inputs, outputs, parameters,
                               "http")
    fmt = OutputFormat(default_binary, binary)
    if data_errors:  # raised in Triton's core order, with the request's tag
        request.data_errors = validation.tagged(request, data_errors)
    else:
        request.uses_shm = _uses_shm(request)
        if key is not None:
            _PLANS.offer(key, lambda: _plan_of(request, sizes, fmt))
    return request, fmt


def _plan_of(request: InferenceRequest, sizes: list[int], fmt: OutputFormat) -> _Plan | None:
    plan = RequestPlan.of(request, sizes)
    return _Plan(plan, request.id, fmt) if plan is not None else None


def _raw_request(body: bytes | memoryview, model_name: str,
                 model_version: int) -> tuple[InferenceRequest, OutputFormat]:
    """A raw binary request: the body is the one input; every output goes back in binary.
    The host gives the input its name, datatype and shape (host.raw_input)."""
    raw = Tensor(raw_input.NAME, "", [len(body)], np.frombuffer(body, np.uint8))  # a view
    request = InferenceRequest(model_name=model_name, model_version=model_version,
                               inputs={raw_input.NAME: raw}, protocol="http", raw_input=True)
    return request, OutputFormat(default_binary=True)


def _uses_shm(request: InferenceRequest) -> bool:
    for t in request.inputs.values():  # loops, not any() over generators: once per request
        if t.data is None:
            return True
    for o in request.outputs:
        if o.parameters and mentions_shm(o.parameters):
            return True
    return False


# --- response --------------------------------------------------------------------------------

def encode_infer_response(response: InferenceResponse, fmt: OutputFormat,
                          request_id: str = "") -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it (else None)."""
    doc: dict[str, Any] = {}
    rid = response.id or request_id
    if rid:
        doc["id"] = rid
    doc["model_name"] = response.model_name
    doc["model_version"] = str(response.model_version)
    if response.parameters:
        doc["parameters"] = response.parameters
    outputs = []
    blobs: list[bytes | memoryview] = []
    exact = False  # NaN or an infinity in JSON data: written as Triton writes them
    for t in response.outputs:
        out: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if t.data is None:  # written to shared memory: the response only describes it
            if t.parameters:
                out["parameters"] = t.parameters
            outputs.append(out)
            continue
        arr = output_array(t)
        if fmt.is_binary(t.name):
            raw = datatypes.array_to_bytes(t.datatype, arr)
            size = len(raw)
            out["parameters"] = {**t.parameters, "binary_data_size": size} if t.parameters \
                else {"binary_data_size": size}
            if size:
                blobs.append(raw)
        else:
            if t.parameters:
                out["parameters"] = t.parameters
            out["data"] = data = json_data(t, arr)
            exact = exact or _non_finite(data)
        outputs.append(out)
    doc["outputs"] = outputs
    header = dump_json(doc, exact)
    if not blobs:
        return header, None
    blobs.insert(0, header)
    return b"".join(blobs), len(header)
