"""A gunicorn worker for inference traffic: gthread, minus the trip back to the poller.

gunicorn's gthread worker returns every keep-alive connection to its main-thread poller after
each response, so the next request on it costs two thread hand-offs. Inference clients
(perf_analyzer, tritonclient, load balancers) send request after request on the same connection,
so here the worker thread lingers briefly on its connection and serves the next request itself;
a connection that stays idle goes back to the poller as before.
"""

from __future__ import annotations

import select
import socket

from gunicorn.workers.gthread import ThreadWorker

import os
LINGER_SECONDS = float(os.environ.get("MH_LINGER", "0.05"))
import sys
sys.setswitchinterval(float(os.environ.get("MH_SWITCH", "0.005")))


class InferenceWorker(ThreadWorker):
    def handle(self, conn):
        if not conn.initialized and conn.sock.family in (socket.AF_INET, socket.AF_INET6):
            # gunicorn writes headers and body separately: without this, Nagle's algorithm holds
            # the body back until the client acknowledges the headers.
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        result = super().handle(conn)
        while result is True and self.alive and conn.initialized and not conn.is_http2:
            if not _readable(conn.sock, LINGER_SECONDS):
                return True  # idle: back to the poller, freeing this thread
            conn.data_ready = True
            result = super().handle(conn)
        return result


def _readable(sock, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(timeout * 1000))
