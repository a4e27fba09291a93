"""The gunicorn worker modelhost runs: each connection served on its own thread.

gunicorn's gthread worker returns every keep-alive connection to its main-thread poller after
each response, so each request costs two thread hand-offs and a poller re-registration, more
than the whole inference of a small model. Inference clients (perf_analyzer, tritonclient, load
balancers) send request after request on one connection, so this worker serves a connection
from start to end on one thread (`host.http.server`, with gunicorn's C HTTP parser) while
gunicorn keeps what it is good at: the master, the fork, signals, heartbeats and restarts.

gunicorn's own settings, when this worker runs under plain gunicorn
(`gunicorn -k host.http.worker.ConnectionWorker 'host.wsgi:create()'`):
- honoured: limit_request_line, limit_request_fields, limit_request_field_size (400 beyond them),
  timeout (the heartbeat; the master kills a worker silent for that long), keepalive (the idle
  limit of a connection; 0 closes every connection after its response), max_requests and
  max_requests_jitter (the worker leaves gracefully after that many HTTP requests; the master starts
  a new one), worker_connections, graceful_timeout;
- refused, the worker does not boot and says why: accesslog (this worker writes no access log:
  use the trace or a proxy), and gunicorn's own TLS (certfile/keyfile: modelhost serves TLS itself,
  see `modelhost serve --help`).
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Callable, Iterable

from gunicorn.workers.base import Worker

from host import tls
from host.http.h1c import Limits, head_parser
from host.http.server import HTTPServer

HEARTBEAT_SECONDS = 1.0


class UnsupportedSetting(RuntimeError):
    pass


def refused_settings(cfg: Any) -> list[str]:
    """gunicorn settings this worker cannot honour, each with why (empty: all fine)."""
    refused = []
    if cfg.accesslog:
        refused.append("accesslog: the modelhost worker writes no access log (use --trace-config or a proxy)")
    if getattr(cfg, "is_ssl", False):
        refused.append("certfile/keyfile: gunicorn's TLS is not used by the modelhost worker "
                       "(modelhost serve has its own TLS options)")
    return refused


class ConnectionWorker(Worker):
    def init_process(self) -> None:
        refused = refused_settings(self.cfg)
        if refused:
            for line in refused:
                self.log.error("unsupported gunicorn setting %s", line)
            # Before the app loads: gunicorn reports a worker that fails to boot and stops.
            raise UnsupportedSetting("unsupported gunicorn settings: " + "; ".join(refused))
        super().init_process()

    def run(self) -> None:
        listeners = [getattr(s, "sock", s) for s in self.sockets]
        app = self.wsgi  # type: ignore[has-type]  # set by gunicorn, untyped
        if self.cfg.keepalive <= 0:
            app = _closing(app)  # gunicorn's keepalive = 0: no keep-alive
        served = itertools.count(1)
        max_requests = self.max_requests  # gunicorn's, jitter included (no limit: sys.maxsize)
        if self.cfg.max_requests > 0:
            app = _counting(app, served)
        self.wsgi = app
        # keepalive = 0 still needs a limit on a client that never sends: gunicorn's timeout, else 30 s
        idle = self.cfg.keepalive if self.cfg.keepalive > 0 else (self.cfg.timeout or 30)
        options = getattr(self.app, "options", None)  # host.serve.ServerApplication's
        server = HTTPServer(self.wsgi, listeners, max_connections=self.cfg.worker_connections,
                            keepalive_timeout=idle,
                            ssl_context=tls.http_context(options) if options is not None else None)
        server.parse_head = head_parser(Limits(self.cfg.limit_request_line, self.cfg.limit_request_fields,
                                               self.cfg.limit_request_field_size),
                                        raw_headers=bool(getattr(options, "http_header_forward_pattern", "")))
        accept = threading.Thread(target=server.serve_forever, name="http-accept", daemon=True)
        accept.start()
        self._woken = threading.Event()  # handle_exit: stop now, not at the next heartbeat
        parent = self.ppid
        beats = 0
        front_end_failure = getattr(self.app, "front_end_failure", lambda: None)
        while self.alive:
            self.notify()
            if os.getppid() != parent:
                self.log.info("parent changed, shutting down: %s", self)
                break
            # self.timeout is half gunicorn's timeout (the arbiter's choice); 0: no timeout
            self._woken.wait(min(HEARTBEAT_SECONDS, self.timeout) if self.timeout else HEARTBEAT_SECONDS)
            beats += 1  # itertools.count is read by taking one (atomic): count those out
            if next(served) - beats > max_requests:
                self.log.info("autorestarting worker after current request: %s", self)
                break
            if not accept.is_alive():
                self.log.critical("the HTTP accept loop ended; restarting the worker")
                break
            # Never half alive: a front end that died takes the worker down, and the master
            # starts a new one (host.supervise restores its models and registrations).
            failure = front_end_failure()
            if failure:
                self.log.critical("%s; restarting the worker", failure)
                break
        # Triton's order (its main.cc): the HTTP front end takes no new connection and serves
        # the open ones until they close, then the gRPC one and the models finish what is in
        # flight, all within one exit timeout (--exit-timeout-secs), each stage with its
        # countdown lines.
        exit_timeout = getattr(options, "exit_timeout_secs", self.cfg.graceful_timeout)
        left = server.drain(int(exit_timeout),
                            close_idle=not getattr(options, "exit_wait_idle_connections", True))
        for listener in self.sockets:  # the HTTP port is closed now, as Triton unbinds it (the
            listener.close()           # master closed its copies; a new worker has its own)
        stop_serving = getattr(self.app, "stop_serving", None)
        if stop_serving is not None:
            stop_serving(left)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        woken = getattr(self, "_woken", None)
        if woken is not None:
            woken.set()


def _closing(app: Callable) -> Callable:
    """Every response says `Connection: close`: gunicorn's keepalive = 0."""
    def closing(environ: dict, start_response: Callable) -> Iterable[bytes]:
        def start(status: str, headers: list, exc_info: Any = None):
            return start_response(status, [*headers, ("Connection", "close")], exc_info)
        return app(environ, start)
    return closing


def _counting(app: Callable, counter: itertools.count[int]) -> Callable:
    def counting(environ: dict, start_response: Callable) -> Iterable[bytes]:
        next(counter)
        return app(environ, start_response)
    return counting
