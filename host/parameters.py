"""Reserved request parameters: interpreted by the host, never passed to the model.

Both front ends hand the client's request parameters over as they came; this is the one place
that rejects the `triton_` prefix (as Triton does) and moves Triton's reserved keys into fields
of the request, so HTTP and gRPC accept and refuse exactly the same parameters.
"""

from __future__ import annotations

from typing import Any

from host import classification, validation
from host.errors import InvalidArgumentError, UnsupportedError
from host.inference import InferenceRequest

RESERVED_PREFIX = "triton_"
# The one `triton_` key a client may send: ask for the flags-only final response on a stream.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
# Triton's limit on string correlation ids (TRITONSERVER_InferenceRequestSetCorrelationIdString).
MAX_STRING_SEQUENCE_ID = 128
# Consumed by the HTTP front end (output format); never reaches a model.
_FRONT_END_ONLY = ("binary_data_output",)


class Uint64(int):
    """An integer the gRPC client sent as `uint64_param` (not `int64_param`): Triton accepts the
    two for different keys, so the codec keeps the difference for `interpret`."""

    __slots__ = ()


_UINT64_LIMIT = 1 << 64


def interpret(request: InferenceRequest) -> None:
    """Validate the reserved parameters, move them into the request's fields, drop them."""
    params = request.parameters
    if not params:
        return
    grpc = request.protocol == "grpc"
    user: dict[str, Any] = {}
    for key, value in params.items():
        if key == "sequence_id":
            request.sequence_id = _grpc_sequence_id(value) if grpc else _json_sequence_id(value)
        elif key in ("sequence_start", "sequence_end"):
            if type(value) is not bool:
                raise _grpc_type(key, "bool_param") if grpc else validation.json_field_error(key, "boolean")
            setattr(request, key, value)
        elif key == "priority":
            request.priority = _grpc_priority(value) if grpc else _json_unsigned(key, value)
        elif key == "timeout":
            request.timeout_us = _grpc_timeout(value) if grpc else _json_unsigned(key, value)
        elif key == EMPTY_FINAL_RESPONSE and request.protocol != "http":
            # Triton's HTTP front end has no streaming and refuses it as any other triton_ key.
            if type(value) is not bool:
                raise InvalidArgumentError(
                    f"invalid value type for '{key}' parameter, expected bool_param.")
            request.enable_empty_final_response = value
        elif key in _FRONT_END_ONLY:
            continue
        elif key.startswith(RESERVED_PREFIX):
            raise InvalidArgumentError(_reserved_message(request.protocol))
        else:
            user[key] = int(value) if type(value) is Uint64 else value
    request.parameters = user


# Triton's two front ends word a badly typed reserved parameter differently: gRPC names the
# InferParameter field it expected; HTTP reports its JSON reader's complaint.
def _grpc_type(key: str, fields: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid value type for '{key}' parameter, expected {fields}.")


def _string_id(value: str) -> str:
    if len(value) > MAX_STRING_SEQUENCE_ID:
        raise UnsupportedError("string correlation ID cannot be longer than 128 characters")
    return value


def _grpc_sequence_id(value: Any) -> int | str:
    if type(value) is int:  # int64_param: Triton takes its bits as the unsigned id
        return value % _UINT64_LIMIT
    if type(value) is str:
        return _string_id(value)
    raise _grpc_type("sequence_id", "int64_param or string_param")


def _json_sequence_id(value: Any) -> int | str:
    if _unsigned(value):
        return value
    if type(value) is str:  # what is not an unsigned integer must be a string
        return _string_id(value)
    raise validation.json_field_error("sequence_id", "string")


def _grpc_priority(value: Any) -> int:
    if type(value) is int:
        if value < 0:
            raise InvalidArgumentError("invalid value for 'priority', expected value >= 0.")
        return value
    if type(value) is Uint64:
        return int(value)
    raise _grpc_type("priority", "int64_param or uint64_param")


def _grpc_timeout(value: Any) -> int:
    if type(value) is not int:
        raise _grpc_type("timeout", "int64_param")
    return value % _UINT64_LIMIT  # as Triton, which reads the int64 as microseconds unsigned


def _json_unsigned(key: str, value: Any) -> int:
    if not _unsigned(value):
        raise validation.json_field_error(key, "unsigned-integer")
    return value


def check_outputs(request: InferenceRequest) -> None:
    """Requested outputs: each named once, and no extension this host does not provide."""
    outputs = request.outputs
    if len(outputs) > 1 and len({o.name for o in outputs}) != len(outputs):
        seen: set[str] = set()
        for o in outputs:
            if o.name in seen:
                raise InvalidArgumentError(  # Triton's core's text, with the request's tag
                    f"{validation.request_tag(request)}output '{o.name}' already exists in request")
            seen.add(o.name)
    classes: dict[str, int] = {}
    for o in outputs:
        params = o.parameters
        if not params or classification.PARAMETER not in params:
            continue
        k = classification.parse_count(o.name, params[classification.PARAMETER], request.protocol)
        o.parameters = {key: v for key, v in params.items() if key != classification.PARAMETER}
        if k:
            classes[o.name] = k
    request.classification = classes or None


def _reserved_message(protocol: str) -> str:
    if protocol == "grpc":  # gRPC lets the client set the one key it knows
        return ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                f"following keys starting with 'triton_' are allowed: {EMPTY_FINAL_RESPONSE}")
    return ("parameter keys starting with 'triton_' are reserved for Triton usage and should not "
            "be specified.")


def _unsigned(value: Any) -> bool:
    return type(value) is int and 0 <= value < _UINT64_LIMIT
