"""The one table from the host's error codes to HTTP status, and the error body.

Triton's http_server.cc (HttpCodeFromError): INTERNAL -> 500, NOT_FOUND -> 404,
UNAVAILABLE -> 503, UNSUPPORTED -> 501, and UNKNOWN / INVALID_ARG / ALREADY_EXISTS /
CANCELLED (no direct match) -> 400; anything else -> 400 as well.
"""

from __future__ import annotations

import falcon
import orjson

from host.errors import Code

_BY_CODE: dict[Code, int] = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.UNKNOWN: 400,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}
_DEFAULT = 400

# Status lines computed once ("404 Not Found"), so that responders do no formatting per request.
_LINES = {code: falcon.code_to_http_status(status) for code, status in _BY_CODE.items()}
_DEFAULT_LINE = falcon.code_to_http_status(_DEFAULT)


def http_status(code: Code) -> int:
    return _BY_CODE.get(code, _DEFAULT)


def status_line(code: Code) -> str:
    return _LINES.get(code, _DEFAULT_LINE)


def error_body(message: str) -> bytes:
    """`{"error": "<message>"}`, the body of every error response."""
    return orjson.dumps({"error": message})
