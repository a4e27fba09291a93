"""grpc core settings for the server's transport (host.grpc.server), applied before grpc starts.

grpcio's core reads its configuration from the environment once, when it first initialises, so
these are set (unless the user set them) before anything imports grpc: at the top of `modelhost
serve` and, for embedders, when host.grpc.server is imported.

Why: by default grpcio (1.8x) does its socket I/O on its EventEngine threads and hands every
completion to the thread polling the completion queue: per unary call about 12 system calls
(futex and eventfd wake-ups among them) against 4 when the polling thread reads and writes the
sockets itself, as the epoll1 engine does. Measured on the 2-core machine of docs/performance.md
(perf_analyzer, native identity model): server CPU per request over gRPC -23 % at concurrency 1 and
-27 % at 8, unary and stream alike, and 25-75 % more infer/s. Clients are unaffected (they run
in other processes); set GRPC_EXPERIMENTS or GRPC_POLL_STRATEGY yourself to choose otherwise.
"""

from __future__ import annotations

import os

SETTINGS = {
    # The completion-queue thread does the socket I/O: no EventEngine hand-offs.
    # (names grpcio 1.81-1.85 know; an unknown name is logged as an error at start-up)
    "GRPC_EXPERIMENTS": "-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq",
    "GRPC_POLL_STRATEGY": "epoll1",
}


def apply() -> None:
    """Set what the user has not set; effective only before grpc's core initialises."""
    for key, value in SETTINGS.items():
        os.environ.setdefault(key, value)
