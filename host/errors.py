"""The host's one error hierarchy.

Every error carries a transport-neutral code; the front ends translate codes into HTTP or gRPC
status in exactly one table each. Subclasses only set the code, and the message is the
constructor's only argument, so errors pickle and cross threads unchanged.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Transport-neutral error codes (the subset of TRITONSERVER_Error_Code the host uses)."""

    UNKNOWN = "unknown"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    INVALID_ARG = "invalid_arg"
    UNAVAILABLE = "unavailable"
    UNSUPPORTED = "unsupported"
    ALREADY_EXISTS = "already_exists"
    CANCELLED = "cancelled"


class HostError(Exception):
    """Base of every error the host raises on purpose."""

    code: Code = Code.UNKNOWN

    # True for an error in reading a model's folder, configuration or override files: Triton's
    # load answer for those is its poll failure (host.core.Host.load_model).
    poll_failure = False
    # True for a request the queue policy rejected (its timeout expired): failure reason REJECTED.
    queue_rejected = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def poll_failure(error: HostError) -> HostError:
    """`error`, marked as a poll failure (HostError.poll_failure)."""
    error.poll_failure = True
    return error


class InternalError(HostError):
    code = Code.INTERNAL


class NotFoundError(HostError):
    code = Code.NOT_FOUND


class InvalidArgumentError(HostError):
    code = Code.INVALID_ARG


class UnavailableError(HostError):
    code = Code.UNAVAILABLE


class UnsupportedError(HostError):
    code = Code.UNSUPPORTED


class AlreadyExistsError(HostError):
    code = Code.ALREADY_EXISTS


class CancelledError(HostError):
    code = Code.CANCELLED


_BY_CODE = {cls.code: cls for cls in HostError.__subclasses__()}


def error_for(code: Code, message: str) -> HostError:
    """Build the error class that carries `code` (used when a code crosses a boundary)."""
    return _BY_CODE.get(code, HostError)(message)


# Triton's own names for its codes (triton::common::Error::CodeString): the prefix of a model's
# state reason ("Internal: ..."), which Triton's load answers and repository index show.
TRITON_CODE_NAMES = {
    Code.UNKNOWN: "Unknown", Code.INTERNAL: "Internal", Code.NOT_FOUND: "Not found",
    Code.INVALID_ARG: "Invalid argument", Code.UNAVAILABLE: "Unavailable",
    Code.UNSUPPORTED: "Unsupported", Code.ALREADY_EXISTS: "Already exists",
    Code.CANCELLED: "Cancelled",
}


def state_reason(exc: HostError) -> str:
    """Triton's text for why a model version failed: its code's name, then the message."""
    return f"{TRITON_CODE_NAMES[exc.code]}: {exc.message}"
