"""The gunicorn worker modelhost runs: each connection served on its own thread.

gunicorn's gthread worker returns every keep-alive connection to its main-thread poller after
each response, so each request costs two thread hand-offs and a poller re-registration, more
than the whole inference of a small model. Inference clients (perf_analyzer, tritonclient, load
balancers) send request after request on one connection, so this worker serves a connection
from start to end on one thread (`host.http.server`, with gunicorn's C HTTP parser) while
gunicorn keeps what it is good at: the master, the fork, signals, heartbeats and restarts.
"""

from __future__ import annotations

import os
import threading

from gunicorn.workers.base import Worker

from host import tls
from host.http.server import HTTPServer

HEARTBEAT_SECONDS = 1.0


class ConnectionWorker(Worker):
    def run(self) -> None:
        listeners = [getattr(s, "sock", s) for s in self.sockets]
        options = getattr(self.app, "options", None)  # host.serve.ServerApplication's
        server = HTTPServer(self.wsgi, listeners, max_connections=self.cfg.worker_connections,
                            keepalive_timeout=self.cfg.keepalive,
                            ssl_context=tls.http_context(options) if options is not None else None)
        accept = threading.Thread(target=server.serve_forever, name="http-accept", daemon=True)
        accept.start()
        parent = self.ppid
        front_end_failure = getattr(self.app, "front_end_failure", lambda: None)
        while self.alive:
            self.notify()
            if os.getppid() != parent:
                self.log.info("parent changed, shutting down: %s", self)
                break
            accept.join(HEARTBEAT_SECONDS)
            if not accept.is_alive():
                self.log.critical("the HTTP accept loop ended; restarting the worker")
                break
            # Never half alive: a front end that died takes the worker down, and the master
            # starts a new one (host.supervise restores its models and registrations).
            failure = front_end_failure()
            if failure:
                self.log.critical("%s; restarting the worker", failure)
                break
        server.shutdown(self.cfg.graceful_timeout)
