"""Header forwarding: request headers (HTTP) or metadata (gRPC) whose name matches a pattern
become string parameters of the inference request, as Triton's --http-header-forward-pattern and
--grpc-header-forward-pattern do.

The rule is Triton's: a header matches when the pattern is found anywhere in its name (RE2
PartialMatch with `(?i)` in front, here `re.search` without regard to case); a matching header
named like a reserved parameter, or starting with `triton_`, fails the request with INVALID_ARG.
Both front ends call `HeaderForwarder.apply` with lower-case names: gRPC metadata keys are lower
case; over HTTP a server that forwards keeps every header line as sent (RAW_HEADERS, names with
underscores included, values with their trailing blanks, as Triton forwards them).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from host.errors import InvalidArgumentError
from host.inference import InferenceRequest

__all__ = ["RESERVED_KEYS", "HeaderForwarder", "compile_pattern", "forwarder", "wsgi_headers"]

# Triton's kReservedParameterKeys (src/common.h)
RESERVED_KEYS = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
                           "headers", "binary_data_output"))


# WSGI environ key: the request's headers as sent, [(name, value)] in bytes (host.http.h1c)
RAW_HEADERS = "modelhost.raw_headers"

TRACE_CONTEXT_KEYS = ("traceparent", "tracestate")  # W3C trace context (OpenTelemetry)


class HeaderForwarder:
    """Matching headers -> request parameters; with `trace_context`, also the W3C trace context
    headers -> `request.trace_context` (OpenTelemetry trace mode: a propagated context forces the
    request's trace, host.trace)."""

    def __init__(self, pattern: str, trace_context: bool = False) -> None:
        self.pattern = pattern
        self.trace_context = trace_context
        self._regex = compile_pattern(pattern) if pattern else None

    def apply(self, request: InferenceRequest, headers: Iterable[tuple[str, Any]]) -> None:
        search = self._regex.search if self._regex is not None else None
        for key, value in headers:
            if self.trace_context and key in TRACE_CONTEXT_KEYS:
                if request.trace_context is None:
                    request.trace_context = {}
                request.trace_context[key] = value if isinstance(value, str) else value.decode()
            if search is None or not search(key):
                continue
            if key in RESERVED_KEYS or key.startswith("triton_"):
                raise InvalidArgumentError(
                    f"Header '{key}' is reserved for Triton usage and cannot be forwarded.")
            if isinstance(value, bytes):  # binary gRPC metadata ("-bin" keys)
                value = value.decode("utf-8", "replace")
            request.parameters[key] = value


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A forward pattern as Triton applies it: without regard to case (Triton puts RE2's `(?i)`
    before it), unless it starts with `(?-i)`, RE2's way to turn that off again (which Python's
    `re` spells as a scoped group, so the prefix is taken off and the case kept here).
    Raises re.error for a pattern that does not compile."""
    if pattern.startswith("(?-i)"):
        return re.compile(pattern[len("(?-i)"):])
    return re.compile(pattern, re.IGNORECASE)


def forwarder(pattern: str, trace_context: bool = False) -> HeaderForwarder | None:
    """The forwarder for a flag's pattern (and the trace context headers in OpenTelemetry trace
    mode); None when there is nothing to take from headers: the front end then checks one
    attribute per request and does nothing else."""
    return HeaderForwarder(pattern, trace_context) if pattern or trace_context else None


def wsgi_headers(env: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """The request headers of a WSGI environ as (lower-case name, value): as the client sent
    them where the server kept them (host.http.h1c.RAW_HEADERS: names with underscores too),
    else from the environ's HTTP_ keys (dashes for underscores)."""
    raw = env.get(RAW_HEADERS)
    if raw is not None:
        for name, value in raw:
            yield name.decode("latin-1").lower(), value.decode("latin-1")
        return
    for key, value in env.items():
        if key.startswith("HTTP_"):
            yield key[5:].lower().replace("_", "-"), value
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            yield key.lower().replace("_", "-"), value
