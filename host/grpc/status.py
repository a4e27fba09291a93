"""The one table from the host's error codes to gRPC status codes.

As Triton's GrpcStatusUtil::CodeToStatus (server repo, src/grpc/grpc_utils.cc): UNKNOWN -> UNKNOWN,
INTERNAL -> INTERNAL, NOT_FOUND -> NOT_FOUND, INVALID_ARG -> INVALID_ARGUMENT,
UNAVAILABLE -> UNAVAILABLE, UNSUPPORTED -> UNIMPLEMENTED, ALREADY_EXISTS -> ALREADY_EXISTS,
CANCELLED -> CANCELLED; anything else -> UNKNOWN.
"""

from __future__ import annotations

import grpc

from host.errors import Code

_BY_CODE: dict[Code, grpc.StatusCode] = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}


def status_code(code: Code) -> grpc.StatusCode:
    """The gRPC status for a host error code."""
    return _BY_CODE.get(code, grpc.StatusCode.UNKNOWN)
