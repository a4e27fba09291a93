"""`modelhost serve`: gunicorn hosting the falcon app, with gRPC, metrics and the models in its one worker.

Nothing heavy happens in the gunicorn master: the Host (plugins, models), the gRPC server and
the metrics server are built in `load()`, which gunicorn calls inside the worker after the fork. SIGINT and SIGTERM
both stop gracefully: in-flight requests finish, then every model is finalized.
"""

from __future__ import annotations

import logging
import os
import atexit
import shutil
import signal
import sys
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.glogging import Logger as GunicornLogger

from host import logs, startup
from host.options import ServerOptions
from host.supervise import Supervisor, start_host

log = logging.getLogger(__name__)


class _GracefulArbiter(Arbiter):
    """Ctrl-C stops the server the way SIGTERM does (gunicorn's default SIGINT is abrupt)."""

    def handle_int(self) -> None:
        self.handle_term()

    def reap_workers(self) -> None:
        engine = getattr(self.app, "engine", None)  # --frontend-processes: our other child
        if engine is not None:
            engine.check()
        super().reap_workers()

    def halt(self, reason: str | None = None, exit_status: int = 0) -> None:
        # A worker that failed to boot has already said why in one line (host.startup): stop
        # without gunicorn's "Shutting down / Reason: Worker failed to boot" and exit 1.
        if exit_status == self.WORKER_BOOT_ERROR:
            from gunicorn.errors import HaltServer

            try:
                self.stop()
            except HaltServer:  # another front end failing the same way while they stop
                pass
            self.cfg.on_exit(self)
            sys.exit(1)
        try:
            super().halt(reason, exit_status)  # stops the workers, then sys.exit(exit_status)
        except SystemExit as exc:
            supervisor = getattr(self.app, "supervisor", None)
            if not exc.code and supervisor is not None and supervisor.board.timed_out:
                raise SystemExit(1) from None  # the shutdown ran out of --exit-timeout-secs:
            raise  # Triton's exit(1)


class _QuietGunicorn(logging.Filter):
    """Drops gunicorn's lines that say nothing the server does not say better: "Worker exited
    with code 3" (the worker's own line said why), and unless verbose, its start-up lines
    ("Listening at", ...: the endpoints table once ready)."""

    _START_UP = ("Starting gunicorn %s", "Listening at: %s (%s)", "Using worker: %s")

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Worker (pid:%s) exited with code %s.":
            return not (isinstance(record.args, tuple)
                        and record.args[-1] == Arbiter.WORKER_BOOT_ERROR)
        return self.verbose or record.msg not in self._START_UP


class _ServerLog(GunicornLogger):
    """gunicorn's own messages go through the server's log (host.logsettings): Triton's format,
    the --log-file, the level switches."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in list(self.error_log.handlers):
            self.error_log.removeHandler(handler)
        self.error_log.propagate = True


class ServerApplication(BaseApplication):
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.host: Any = None
        self.grpc: Any = None
        self.metrics: Any = None
        self.cloud: list[tuple[str, Any]] = []  # the SageMaker and Vertex AI servers (host.http.cloud)
        # Made here, in the master, before the fork: no crash loops, and a crashed worker comes
        # back with its models and shared-memory registrations (host.supervise).
        self.supervisor = Supervisor()
        # --frontend-processes N > 1: the engine process (host.frontend.process), and which
        # front-end slot this worker is (it chooses the worker's CPU).
        self.engine: Any = None
        self.slot = 0
        self._no_http_dir: str | None = None
        super().__init__()

    def load_config(self) -> None:
        o = self.options
        settings = {
            "bind": [self._http_bind()],
            "reuse_port": o.reuse_http_port,
            # One worker holds the models; with --frontend-processes N, N workers are front ends
            # of the engine process that holds them (host.frontend).
            "workers": o.frontend_processes if self.engine is not None else 1,
            "worker_class": "host.http.worker.ConnectionWorker",  # a thread per connection
            "worker_connections": 1024,  # connections served at once (each on its own thread)
            "timeout": 0,  # model loads happen in the worker before it serves: no boot deadline
            # the worker's own shutdown keeps to --exit-timeout-secs (stop_serving); the master
            # kills a worker that has not exited some time after that
            "graceful_timeout": int(o.exit_timeout_secs) + 15,
            "keepalive": 120,  # clients (perf_analyzer, tritonclient) hold connections open
            # the HTTP parser's limits (host.http.worker honours these gunicorn settings)
            "limit_request_line": 8190,
            "limit_request_fields": 100,
            "limit_request_field_size": 8190,
            "accesslog": None,
            # its debug level (a dump of its configuration) from --log-verbose 2; _QuietGunicorn
            # drops its start-up lines unless verbose
            "loglevel": "debug" if o.log_verbose > 1 else "info",
            "post_worker_init": self._post_worker_init,
            "worker_exit": self._worker_exit,
            "pre_fork": self.supervisor.pre_fork,
            "child_exit": self.supervisor.child_exit,
            "on_exit": self.supervisor.on_exit,
            "proc_name": "modelhost",
            "logger_class": _ServerLog,
            "control_socket_disable": True,  # several servers may run side by side
        }
        if self.engine is not None:  # front ends keep nothing to restore (host.supervise)
            settings.update(pre_fork=self._assign_slot, child_exit=_nothing,
                            on_exit=self._stop_engine, post_fork=self._take_slot)
        for key, value in settings.items():
            self.cfg.set(key, value)

    def _http_bind(self) -> str:
        """The HTTP listener; with --allow-http=false a socket file in a private folder, so that
        no TCP port is opened (gunicorn always listens somewhere) and the port flags are not
        used, as in Triton."""
        o = self.options
        if o.allow_http:
            return f"{_bracket(o.http_address)}:{o.http_port}"
        if self._no_http_dir is None:
            self._no_http_dir = tempfile.mkdtemp(prefix="modelhost-nohttp-")
            atexit.register(_remove_in, os.getpid(), self._no_http_dir)
        return f"unix:{os.path.join(self._no_http_dir, 'http.sock')}"

    def load(self):
        # Runs in the worker process, after the fork. A failure is one line and gunicorn's
        # boot-error exit status, which stops the server instead of restarting the worker.
        try:
            return self._load()
        except BaseException as exc:  # noqa: BLE001 - every start-up failure ends the same way
            log.debug("start-up failed", exc_info=True)
            startup.log.error("%s", startup.explain(exc, self.options))
            self._release_after_failure()
            logs.flush()
            os._exit(Arbiter.WORKER_BOOT_ERROR)

    def _load(self):
        if self.engine is not None:
            return self._load_front_end()
        from host import restricted
        from host.http.app import create_app

        o = self.options
        self.host = start_host(o, self.supervisor.worker_started())

        app = create_app(self.host, max_input_size=o.http_max_input_size,
                         restrictions=restricted.http(o.http_restricted_api))
        if o.allow_grpc:
            self._start_grpc(share_port=o.reuse_grpc_port)
            if o.grpc_keepalive and o.log_verbose:  # Triton's table of them (verbose 1)
                from host.grpc.server import keepalive_rows

                log.info("\n%s", startup.table(("GRPC KeepAlive Option", "Value"),
                                               keepalive_rows(o.grpc_keepalive)), extra={"raw": True})
            log.info("Started GRPCInferenceService at %s:%d", o.grpc_address, self.grpc.port)
        self.metrics = startup.start_metrics(self.host, o)
        self.cloud = startup.start_cloud_front_ends(app, o, self.metrics)
        if o.allow_http:
            log.info("Started HTTPService at %s:%d", o.http_address, o.http_port)  # Triton's line
        startup.log_summary(self.host, startup.listening_rows(o, self.grpc, self.metrics, self.cloud))
        if o.log_verbose:
            app = logs.RequestLog(app)
        startup.settle()
        return app

    def _load_front_end(self):
        """A front-end worker: HTTP and gRPC over the engine's Host (host.frontend)."""
        from host import affinity, restricted
        from host.errors import UnavailableError
        from host.frontend.process import python_cpu
        from host.frontend.remote import RemoteHost
        from host.http.app import create_app

        o = self.options
        affinity.configure(python_cpu(o, self.slot))
        try:
            self.host = RemoteHost(o, self.engine.path, self.engine.pid_path)  # waits for the engine
        except UnavailableError:
            # The engine failed to start (it said why, and is not started again): the master
            # stops on this exit status.
            logs.flush()
            os._exit(Arbiter.WORKER_BOOT_ERROR)
        app = create_app(self.host, max_input_size=o.http_max_input_size,
                         restrictions=restricted.http(o.http_restricted_api))
        if o.allow_grpc:
            self._start_grpc(share_port=True)
        if o.log_verbose:
            app = logs.RequestLog(app)
        startup.settle()
        return app

    def _start_grpc(self, share_port: bool) -> None:
        """The gRPC front end; front-end processes share its port (host.frontend)."""
        from host import restricted, tls
        from host.grpc.server import start_grpc_server

        o = self.options
        try:
            self.grpc = start_grpc_server(self.host, o.grpc_address, o.grpc_port,
                                          compression_level=o.grpc_compression_level,
                                          restrictions=restricted.grpc(o.grpc_restricted_protocol),
                                          credentials=tls.grpc_credentials(o), share_port=share_port,
                                          keepalive=o.grpc_keepalive)
        except OSError as exc:
            raise startup.StartupError(startup.port_error(
                "gRPC", o.grpc_address, o.grpc_port, "--grpc-port", exc)) from None

    def _assign_slot(self, server: Any, worker: Any) -> None:
        used = {getattr(w, "modelhost_slot", -1) for w in server.WORKERS.values()}
        worker.modelhost_slot = next(i for i in range(len(used) + 1) if i not in used)

    def _take_slot(self, server: Any, worker: Any) -> None:
        self.slot = getattr(worker, "modelhost_slot", 0)
        self.engine.forget()

    def _stop_engine(self, server: Any) -> None:
        if self.engine is not None and os.getpid() == self.engine.master:
            self.engine.stop(self.options.exit_timeout_secs + 10)
        self.supervisor.on_exit(server)

    def _stop_cloud(self) -> None:
        for _, server in self.cloud:
            server.shutdown(self.options.exit_timeout_secs)
        self.cloud = []

    def _release_after_failure(self) -> None:
        self._stop_cloud()
        for part in (self.grpc, self.metrics):
            if part is not None:
                part.stop(0) if part is self.grpc else part.stop()
        if self.host is not None:
            self.host.stop()

    def front_end_failure(self) -> str | None:
        """Why a front end of this worker stopped serving, or None; the worker's heartbeat asks
        (host.http.worker) and leaves when there is one, so that the master starts a new one."""
        if self.grpc is not None and self.grpc.failure:
            return self.grpc.failure
        return getattr(self.host, "failure", None) if self.engine is not None else None

    def stop_serving(self, seconds_left: int) -> None:
        """The worker is stopping and its HTTP connections are closed (host.http.worker): the
        gRPC front end takes no new call and finishes its calls under way, then the models
        finish what is in flight and unload, within what is left of the exit timeout (Triton's
        main.cc: StopEndpoints, then the server's Stop)."""
        if self.engine is None:
            self.supervisor.worker_exiting()
        if self.grpc is not None:
            seconds_left = self.grpc.drain(seconds_left)
        if self.host is not None and self.engine is None:
            if not self.host.stop(seconds_left):
                # Out of time: Triton exits at once, with status 1 (the master's too)
                self.supervisor.worker_timed_out()
                logs.flush()
                os._exit(1)

    def _post_worker_init(self, worker: Any) -> None:
        _graceful_worker_sigint(worker)
        if self.engine is None:
            self.supervisor.worker_booted()

    def _worker_exit(self, server: Any, worker: Any) -> None:
        if self.engine is not None:  # a front end: the engine keeps the models
            if self.grpc is not None:
                self.grpc.stop(grace=self.options.exit_timeout_secs)
            if self.host is not None:
                self.host.close()
            return
        self.supervisor.worker_exiting()
        # stop_serving has let the calls and requests in flight finish (or run out of time):
        # what is left of the gRPC front end is cancelled.
        if self.grpc is not None:
            self.grpc.stop(grace=0)
        self._stop_cloud()
        if self.metrics is not None:
            self.metrics.stop()
        if self.host is not None:
            self.host.stop()  # done already unless the worker left without stop_serving

    def run(self) -> None:
        _GracefulArbiter(self).run()


def _remove_in(pid: int, folder: str) -> None:
    """Remove `folder` when the process that made it exits (not a forked worker)."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)


def _nothing(server: Any, worker: Any) -> None:
    """A front end that exits is started again by the master; the engine kept every state."""


def _graceful_worker_sigint(worker: Any) -> None:
    # A terminal's Ctrl-C reaches the worker too; let it finish in-flight requests.
    signal.signal(signal.SIGINT, worker.handle_exit)


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def serve(options: ServerOptions) -> int:
    startup.raise_file_limit()  # the worker and the engine inherit it
    try:
        startup.preflight(options)
    except startup.StartupError as exc:
        startup.log.error("%s", exc)
        return 1
    logging.getLogger("gunicorn.error").addFilter(_QuietGunicorn(options.log_verbose > 0))

    from host.grpc import core_settings

    core_settings.apply()  # the worker inherits it; grpc's core reads it when it first starts
    # The command line was read (options): from now on sys.argv is what python models see in
    # Triton's stub (host.backends.python.backend.triton_stub_argv).
    from host.backends.python.backend import triton_stub_argv

    triton_stub_argv()
    app = ServerApplication(options)
    if options.frontend_processes > 1:
        from host.frontend.process import EngineProcess

        app.engine = EngineProcess(options)  # before gunicorn: the master has no thread yet
        app.load_config()  # again: the worker count and hooks depend on the engine
    app.run()
    return 0
