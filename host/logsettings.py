"""Server logging as Triton's: its line formats, its level switches, and the logging extension.

    install(LogSettings(file="server.log", verbose_level=1))   # once, by `modelhost serve`
    current().as_dict()                                          # GET /v2/logging
    update({"log_info": False, "log_format": "ISO8601"})         # POST /v2/logging

One handler on the root logger writes every record of the process (the host's, the backends',
the python models' `pb_utils.Logger`) in Triton's format:

    default   I1124 06:44:11.123456 4242 core.py:88] message
    ISO8601   2026-11-24T06:44:11Z I 4242 core.py:88] message
    json      {"time": "2026-11-24T06:44:11.123Z", "level": "INFO", "logger": ..., "message": ...}

(json is modelhost's own, for log pipelines: one object per line, host.logs.)

The switches are Triton's: `log_info`, `log_warning`, `log_error` turn those levels on and off,
`log_verbose_level` N shows verbose (DEBUG) messages up to level N (Python's DEBUG is verbose level
1, anything below it level 2). As with Triton, with a log file everything goes to the file;
without one, INFO goes to stdout and warnings and errors to stderr. The file is set at start
(--log-file) only: like Triton, the extension refuses to move it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from host.errors import InvalidArgumentError, UnsupportedError
from host.logs import JsonFormatter

__all__ = ["FORMATS", "LogSettings", "current", "install", "update"]

FORMATS = ("default", "ISO8601", "json")  # json: modelhost's own, one object per line (host.logs)


@dataclass
class LogSettings:
    file: str = ""
    info: bool = True
    warning: bool = True
    error: bool = True
    verbose_level: int = 0
    format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        """Triton's answer to GET /v2/logging (key order as Triton's)."""
        return {"log_file": self.file, "log_info": self.info, "log_warning": self.warning,
                "log_error": self.error, "log_verbose_level": self.verbose_level,
                "log_format": self.format}


class _TritonHandler(logging.Handler):
    """Formats and routes records by the live settings (read per record: updates apply at once)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__(logging.NOTSET)
        self.settings = settings
        self._file: IO[str] | None = open(settings.file, "a") if settings.file else None

    def enabled(self, record: logging.LogRecord) -> bool:
        s, level = self.settings, record.levelno
        if level >= logging.ERROR:
            return s.error
        if level >= logging.WARNING:
            return s.warning
        if level >= logging.INFO:
            return s.info
        return s.verbose_level >= (1 if level >= logging.DEBUG else 2)

    def format(self, record: logging.LogRecord) -> str:
        if self.settings.format == "json":
            return _JSON.format(record)
        letter = "E" if record.levelno >= logging.ERROR else (
            "W" if record.levelno >= logging.WARNING else "I")
        seconds = int(record.created)
        t = time.gmtime(seconds)
        if self.settings.format == "ISO8601":
            preamble = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', t)} {letter} "
        else:
            micros = int((record.created - seconds) * 1e6)
            preamble = f"{letter}{time.strftime('%m%d %H:%M:%S', t)}.{micros:06d} "
        message = record.getMessage()
        # Triton writes each message as a JSON string (TRITON_SERVER_ESCAPE_LOG_MESSAGES), but
        # its tables as they are (a record with `raw` set, host.startup's summary)
        if _ESCAPE and not getattr(record, "raw", False):
            message = json.dumps(message, ensure_ascii=False)
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        pid = os.getpid()  # the gunicorn worker is a fork of the process that installed this
        return f"{preamble}{pid} {record.filename}:{record.lineno}] {message}"

    def emit(self, record: logging.LogRecord) -> None:
        if not self.enabled(record):
            return
        try:
            line = self.format(record) + "\n"
            stream = self._file or (sys.stdout if record.levelno < logging.WARNING else sys.stderr)
            with _lock:
                stream.write(line)
                stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the caller
            self.handleError(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


_lock = threading.Lock()
_JSON = JsonFormatter()
_handler: _TritonHandler | None = None
# As Triton: messages are JSON-escaped and quoted unless TRITON_SERVER_ESCAPE_LOG_MESSAGES=0.
_ESCAPE = os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES") != "0"


def install(settings: LogSettings) -> None:
    """Route the root logger through Triton's format with `settings` (replaces an earlier install
    and any handlers logging.basicConfig added)."""
    global _handler
    if settings.format not in FORMATS:
        raise InvalidArgumentError(f"invalid argument for log_format, got: {settings.format}")
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        if h is _handler:
            h.close()
    _handler = _TritonHandler(settings)
    root.addHandler(_handler)
    _sync_level(settings)
    logging.captureWarnings(True)


def _sync_level(settings: LogSettings) -> None:
    """The root logger's level is the lowest level the settings let through, so that a record
    nobody will see is not even made: `log.debug` on the request path and `isEnabledFor` checks
    (a gRPC call's log line, host.logs) cost nothing unless --log-verbose is on. The handler
    still applies the switches above that level (info off, errors on, ...)."""
    if settings.verbose_level >= 2:
        level = 1  # anything below DEBUG is verbose level 2
    elif settings.verbose_level == 1:
        level = logging.DEBUG
    elif settings.info:
        level = logging.INFO
    elif settings.warning:
        level = logging.WARNING
    elif settings.error:
        level = logging.ERROR
    else:
        level = logging.CRITICAL + 1
    logging.getLogger().setLevel(level)


_detached = LogSettings()  # answered while nothing was installed (an embedder's own logging)


def current() -> LogSettings:
    """The live settings. `modelhost serve` installs the handler; an application that embeds
    the host (host.wsgi) keeps its own logging, and the extension then only records settings."""
    return _handler.settings if _handler is not None else _detached


def update(changes: dict[str, Any], format_name: str = "log_format") -> dict[str, Any]:
    """Apply a logging-extension request (values already typed by the front end; None: leave
    unchanged). Returns the settings after the change, as Triton answers. `format_name` is how
    a bad format's message names the setting: Triton's HTTP says "--log_format", its gRPC
    "log_format" (both answered as INVALID_ARG here; Triton's HTTP answers 503)."""
    settings = current()
    if changes.get("log_file") is not None:
        raise UnsupportedError("log file location can not be updated through network protocol")
    fmt = changes.get("log_format")
    if fmt is not None and fmt not in FORMATS:
        raise InvalidArgumentError(f"invalid argument for {format_name}, got: {fmt}")
    level = changes.get("log_verbose_level")
    if level is not None and level < 0:
        raise InvalidArgumentError(f"invalid argument for log_verbose_level, got: {level}")
    for key, attr in (("log_info", "info"), ("log_warning", "warning"), ("log_error", "error"),
                      ("log_verbose_level", "verbose_level"), ("log_format", "format")):
        if changes.get(key) is not None:
            setattr(settings, attr, changes[key])
    if _handler is not None:  # then `settings` are the handler's
        _sync_level(settings)
    return settings.as_dict()
