"""A logger that says a repeated line at most once per interval, then how many it held back.

Bad requests are the client's problem, not the server's: each is worth one line in the log, and a
client that sends thousands of them must not flood it (or slow the server by writing it).
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """`warning(key_format, *args)`: one line per format string per `interval` seconds."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger = logger
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}  # format -> (last logged, held back since)

    def log(self, level: int, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last, held = self._last.get(msg, (-self.interval, 0))
            if now - last < self.interval:
                self._last[msg] = (last, held + 1)
                return
            self._last[msg] = (now, 0)
            if len(self._last) > 1024:  # formats are few; this only bounds a misuse
                self._last.clear()
        if held:
            msg += f" ({held} more like this in the last {now - last:.0f} s)"
        self.logger.log(level, msg, *args)

    def warning(self, msg: str, *args: object) -> None:
        self.log(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: object) -> None:
        self.log(logging.ERROR, msg, *args)
