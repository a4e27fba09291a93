"""Triton's generate extension (`/generate`, `/generate_stream`): request/response JSON and SSE.

As in Triton's http_server.cc: every top-level key of the request object, and every key of its
`parameters` object, that names a model input becomes that input (datatype and shape from the
model's metadata, the values' count spread over the shape: fixed dimensions divide it, the
innermost variable dimension takes the rest, other variable dimensions are 1); every other key
becomes a request parameter (string, number or boolean). `id` is the request id.
A response is one JSON object: `id` (when set), `model_name`, `model_version`, the response's
parameters, and each output by name (a scalar when it holds one element, else a flat list;
BYTES as text).
"""

from __future__ import annotations

import json
import queue
from typing import TYPE_CHECKING, Any, Callable

from host import validation
from host.errors import CancelledError, InvalidArgumentError, UnsupportedError
from host.http.codec import dump_json, json_data, json_values, output_array, request_parameters
from host.http.status import error_body
from host.inference import InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from host.core import Host

CONTENT_TYPE_SSE = "text/event-stream; charset=utf-8"
CLIENT_POLL_S = 0.2  # how often a waiting handler checks that its client is still there
SINGLE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for "
                   "model that generates various number of responses")


def collect(host: Host, request: InferenceRequest,
            client_gone: Callable[[], bool] | None) -> list[InferenceResponse]:
    """Every response of `request` (not streamed), watching the client meanwhile: a client that
    closes its connection cancels the request, so the model stops working for nobody (a
    generation model frees its KV blocks at its next iteration)."""
    responses: queue.SimpleQueue = queue.SimpleQueue()
    host.submit(request, lambda response, final: responses.put((response, final)))
    out: list[InferenceResponse] = []
    while True:
        try:
            response, final = responses.get(timeout=CLIENT_POLL_S)
        except queue.Empty:
            if client_gone is not None and client_gone():
                request.cancel()
                raise CancelledError("the client closed the connection") from None
            continue
        if response is not None:
            out.append(response)
        if final:
            return out


def fit_shape(name: str, model_shape: list[int], count: int) -> list[int]:
    """Spread `count` elements over the model's input shape (-1: variable dimension)."""
    shape = list(model_shape)
    rest = count
    for d in reversed(shape):
        if d != -1:
            if d <= 0 or rest % d:
                raise InvalidArgumentError(
                    f"The schema can not convert input '{name}' to tensor with proper shape")
            rest //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = rest
            rest = 1
    if rest != 1:
        raise InvalidArgumentError(
            f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def _tensor(name: str, value: Any, meta: dict[str, Any]) -> Tensor:
    datatype = meta["datatype"]
    values = value if isinstance(value, list) else [value]
    try:
        flat = json_values(name, datatype, values)
    except InvalidArgumentError as exc:
        # Triton's text, which does not say which keyword it was; the input's name follows it
        # (an LLM user sends a dozen of them: a bad value is a 400 naming it)
        if f"'{name}'" in exc.message:
            raise
        raise InvalidArgumentError(f"{exc.message} (keyword '{name}')") from None
    shape = fit_shape(name, meta["shape"], flat.size)
    return Tensor(name, datatype, shape, flat.reshape(shape))


def decode_generate_request(doc: Any, metadata: dict[str, Any], model_name: str,
                            model_version: int = -1, raw: bytes | None = None) -> InferenceRequest:
    """A generate request object -> InferenceRequest, given the model's metadata. `raw`: the
    request's JSON text, read again for a key given twice (Triton then refuses the second
    input as any request naming an input twice)."""
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the generate request JSON must be an object")
    inputs_meta = {m["name"]: m for m in metadata.get("inputs", ())}
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise InvalidArgumentError("Unable to parse 'id': expected a string")
    inputs: dict[str, Tensor] = {}
    loose: dict[str, Any] = {}
    items = _members(doc, raw, inputs_meta)
    for key, value in items:
        if key == "parameters":
            if "parameters" in inputs_meta:
                raise InvalidArgumentError(
                    "Keyword 'parameters' for nested schema also given as input tensor name")
            if not isinstance(value, dict):
                raise InvalidArgumentError("Expected JSON object for keyword: 'parameters'")
            try:  # Triton's prefix for what goes wrong inside the nested object
                nested: dict[str, Any] = {}
                for pkey, pvalue in value.items():
                    if pkey in inputs_meta:
                        _add_input(inputs, pkey, pvalue, inputs_meta[pkey], request_id)
                    else:
                        nested[pkey] = pvalue
                loose.update(request_parameters(nested)[0])
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"Converting keyword: 'parameters': {exc.message}") from None
        elif key in inputs_meta:
            _add_input(inputs, key, value, inputs_meta[key], request_id)
        elif key != "id":
            loose.update(request_parameters({key: value})[0])
    return InferenceRequest(model_name=model_name, model_version=model_version, id=request_id,
                            inputs=inputs, parameters=loose)


def _add_input(inputs: dict[str, Tensor], name: str, value: Any, meta: dict[str, Any],
               request_id: str) -> None:
    validation.check_new_input(inputs, name, request_id)
    inputs[name] = _tensor(name, value, meta)


def _members(doc: dict[str, Any], raw: bytes | None, inputs_meta: dict[str, Any]) -> list[tuple[str, Any]]:
    """The request object's members in order, a key given twice included (the parsed `doc`
    keeps only its last value). The text is read again only when an input's quoted name
    appears more than once in it."""
    if raw is None or not any(raw.count(b'"%s"' % name.encode()) > 1 for name in inputs_meta):
        return list(doc.items())
    outer: list[list[tuple[str, Any]]] = []

    def pairs(members: list[tuple[str, Any]]) -> dict[str, Any]:
        outer[:] = [members]  # the outermost object is the last one to close
        return dict(members)

    try:
        json.loads(raw.decode("utf-8", "surrogateescape"), object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return list(doc.items())
    return outer[0] if outer else list(doc.items())


def generate_response_dict(response: InferenceResponse, request_id: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {}
    rid = response.id or request_id
    if rid:
        doc["id"] = rid
    doc["model_name"] = response.model_name
    doc["model_version"] = str(response.model_version)
    for key, value in response.parameters.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            raise UnsupportedError(
                f"Response parameter '{key}' has type 'TRITONSERVER_PARAMETER_BYTES' which is not "
                "currently supported")
        doc[key] = value
    for t in response.outputs:
        values = json_data(t, output_array(t))
        if not isinstance(values, list):
            values = values.tolist()
        doc[t.name] = values[0] if len(values) == 1 else values
    return doc


def encode_generate_response(response: InferenceResponse, request_id: str = "") -> bytes:
    return dump_json(generate_response_dict(response, request_id))


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying a JSON payload."""
    return b"data: " + payload + b"\n\n"


def sse_error(message: str) -> bytes:
    return sse_event(error_body(message))
