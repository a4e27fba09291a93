"""Reserved request parameters: interpreted by the host, never passed to the model.

Both front ends hand the client's request parameters over as they came; this is the one place
that rejects the `triton_` prefix (as Triton does) and moves Triton's reserved keys into fields
of the request, so HTTP and gRPC accept and refuse exactly the same parameters.
"""

from __future__ import annotations

from typing import Any

from host import classification
from host.errors import InvalidArgumentError, UnsupportedError
from host.inference import InferenceRequest

RESERVED_PREFIX = "triton_"
# The one `triton_` key a client may send: ask for the flags-only final response on a stream.
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
# Triton's limit on string correlation ids (TRITONSERVER_InferenceRequestSetCorrelationIdString).
MAX_STRING_SEQUENCE_ID = 128
# Consumed by the HTTP front end (output format); never reaches a model.
_FRONT_END_ONLY = ("binary_data_output",)


def interpret(request: InferenceRequest) -> None:
    """Validate the reserved parameters, move them into the request's fields, drop them."""
    params = request.parameters
    if not params:
        return
    user: dict[str, Any] = {}
    for key, value in params.items():
        if key == "sequence_id":
            if not (_unsigned(value) or type(value) is str):
                raise InvalidArgumentError(
                    "Unable to parse 'sequence_id': expected an unsigned integer or a string")
            if type(value) is str and len(value) > MAX_STRING_SEQUENCE_ID:
                raise UnsupportedError(
                    "string correlation ID cannot be longer than 128 characters")
            request.sequence_id = value
        elif key in ("sequence_start", "sequence_end"):
            if type(value) is not bool:
                raise InvalidArgumentError(f"Unable to parse '{key}': expected a boolean")
            setattr(request, key, value)
        elif key == "priority":
            request.priority = _unsigned_or_error(key, value)
        elif key == "timeout":
            request.timeout_us = _unsigned_or_error(key, value)
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
            user[key] = value
    request.parameters = user


def check_outputs(request: InferenceRequest) -> None:
    """Requested outputs: each named once, and no extension this host does not provide."""
    outputs = request.outputs
    if len(outputs) > 1 and len({o.name for o in outputs}) != len(outputs):
        seen: set[str] = set()
        for o in outputs:
            if o.name in seen:
                raise InvalidArgumentError(f"output '{o.name}' already exists in request")
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
    return type(value) is int and value >= 0


def _unsigned_or_error(key: str, value: Any) -> int:
    if not _unsigned(value):
        raise InvalidArgumentError(f"Unable to parse '{key}': expected an unsigned integer")
    return value
