"""JSON log lines, request ids, and request-level detail for `modelhost serve`.

- `JsonFormatter` (--log-format json, through host.logsettings' handler): one object per line:
  `time`, `level`, `logger`, `message`, `pid`, the request fields below on a request's line, and
  `exc` with a traceback.
- `--log-verbose 1` adds a line per HTTP request (`RequestLog`, a WSGI middleware) and per gRPC
  call (`GrpcCallLog`, from host.grpc.server; a stream's line when it ends), each as it ends,
  with its status, duration, peer and request id: the client's `X-Request-ID` header or gRPC
  metadata `x-request-id` when given, else a fresh one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from typing import Any, Callable, Iterable

_REQUEST_LOG = logging.getLogger("host.request")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key in ("request_id", "method", "path", "status", "duration_ms", "peer"):
            value = record.__dict__.get(key)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


class RequestLog:
    """WSGI middleware: one debug line per HTTP request, with its request id (--log-verbose 1).

    The id is the client's X-Request-ID when it sent one, else a new one; it is echoed back in
    the response's X-Request-ID header so the client can quote it.
    """

    def __init__(self, app: Callable) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:  # the wrapped app's attributes (e.g. `.falcon`)
        return getattr(self.app, name)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        request_id = environ.get("HTTP_X_REQUEST_ID") or new_request_id()
        started = time.perf_counter()
        status_line = ["-"]

        def _start(status: str, headers: list, exc_info: Any = None) -> Any:
            status_line[0] = status.split(" ", 1)[0]
            headers = [*headers, ("X-Request-ID", request_id)]
            return start_response(status, headers, exc_info) if exc_info else \
                start_response(status, headers)

        try:
            return self.app(environ, _start)
        finally:
            duration = (time.perf_counter() - started) * 1000
            path = environ.get("PATH_INFO", "")
            _REQUEST_LOG.debug(
                "HTTP %s %s -> %s in %.2f ms (request id %s, peer %s)",
                environ.get("REQUEST_METHOD"), path, status_line[0], duration, request_id,
                environ.get("REMOTE_ADDR"),
                extra={"request_id": request_id, "method": environ.get("REQUEST_METHOD"),
                       "path": path, "status": status_line[0], "duration_ms": round(duration, 3),
                       "peer": environ.get("REMOTE_ADDR")})


class GrpcCallLog:
    """One debug line for a gRPC call when it ends (host.grpc.server makes one per call, only at
    --log-verbose): method, status code name, duration, request id and peer, as `RequestLog`'s.

    The request id is the client's `x-request-id` metadata when it sent one, else a new one.
    """

    __slots__ = ("method", "request_id", "peer", "started")

    def __init__(self, method: str, metadata: Any, peer: Any) -> None:
        self.started = time.perf_counter()
        self.method = method
        request_id = None
        for key, value in metadata or ():
            if key == "x-request-id":
                request_id = value.decode() if isinstance(value, bytes) else value
        self.request_id = request_id or new_request_id()
        self.peer = peer.decode(errors="replace") if isinstance(peer, bytes) else str(peer)

    def done(self, status: str) -> None:
        """The call ended with `status`, a gRPC status code's name (OK, NOT_FOUND, CANCELLED...)."""
        duration = (time.perf_counter() - self.started) * 1000
        _REQUEST_LOG.debug(
            "gRPC %s -> %s in %.2f ms (request id %s, peer %s)",
            self.method, status, duration, self.request_id, self.peer,
            extra={"request_id": self.request_id, "method": "gRPC", "path": self.method,
                   "status": status, "duration_ms": round(duration, 3), "peer": self.peer})


def flush() -> None:
    """Everything logged so far is out (before the worker leaves with os._exit)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
