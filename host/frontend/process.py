"""The engine process: started by `modelhost serve --frontend-processes N` before gunicorn
starts its workers (the front ends), stopped after they have drained.

It is forked from the master while the master has no thread yet (as gunicorn forks its workers),
loads the models, serves the metrics endpoint and then the front ends' Unix socket: a front end
that can connect knows the engine is ready. A start-up failure is one line from the engine, and
the front ends, finding it gone, stop the server (host.serve).
"""

from __future__ import annotations

import logging
import os
import shutil
import select
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from host import logs, startup
from host.options import ServerOptions

log = logging.getLogger(__name__)


class EngineProcess:
    """The master's handle on the engine."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.folder = tempfile.mkdtemp(prefix="modelhost-engine-")  # 0700: only our user connects
        self.path = os.path.join(self.folder, "engine.sock")  # exists once the engine is ready
        self.pid_path = os.path.join(self.folder, "engine.pid")  # the engine now: front ends read it
        self.journal_path = os.path.join(self.folder, "journal.json")  # what a new engine restores
        self.master = os.getpid()
        self.stopping = False
        self._crashes: list[float] = []
        self._start()

    def _start(self) -> None:
        # The engine stops when this pipe has something to read (a byte, or its end when the
        # master is gone), never on a signal: SIGTERM or SIGINT sent to the whole process group
        # (a terminal's Ctrl-C, systemd) must leave it serving until the front ends drained.
        stop_read, self.stop_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(self.stop_fd)
            _engine_main(self.options, self.path, self.master, stop_read, self.journal_path)
        os.close(stop_read)
        self.pid = pid
        tmp = self.pid_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(pid))
        os.replace(tmp, self.pid_path)

    def check(self) -> None:
        """In the master, when a child ended: an engine that died while serving is started
        again, with the models loaded through the API and the clients' shared-memory
        registrations (host.supervise's journal); one that died while starting is not (it said
        why, and the front ends stop the server); a crash loop stops the server."""
        if self.stopping or os.getpid() != self.master or _exists(self.pid):
            return
        if not os.path.exists(self.path):
            return
        from gunicorn.errors import HaltServer

        from host.supervise import CRASH_LIMIT, CRASH_WINDOW, crashed

        self._crashes = crashed(self._crashes)
        if len(self._crashes) > CRASH_LIMIT:
            message = (f"the engine process crashed {len(self._crashes)} times within "
                       f"{CRASH_WINDOW:.0f} s; not restarting it again")
            log.critical(message)
            raise HaltServer(message, 1)
        log.error("the engine process died; restarting it with its models and shared-memory "
                  "registrations")
        os.unlink(self.path)
        os.close(self.stop_fd)
        self._start()

    def forget(self) -> None:
        """In a front end after the fork: the master alone holds the engine's stop pipe."""
        os.close(self.stop_fd)

    def stop(self, timeout: float) -> None:
        """After the front ends are gone: the engine finishes what it has and unloads."""
        self.stopping = True
        try:
            os.write(self.stop_fd, b"x")
            os.close(self.stop_fd)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _exists(self.pid):
            time.sleep(0.05)
        if _exists(self.pid):
            log.warning("the engine process did not stop within %.0f s; killing it", timeout)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def _exists(pid: int) -> bool:
    try:  # our child: reap it if it ended (gunicorn's handler may have done so already)
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return False


def python_cpu(options: ServerOptions, slot: int | None = None) -> str:
    """--python-cpu for the engine (`slot` None) or front end `slot`: with 'auto' and several
    allowed CPUs, the engine takes the first and the front ends the others in turn, so that
    their Python threads do not share a CPU where they need not; else the setting as given."""
    if options.python_cpu != "auto":
        return options.python_cpu
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return "auto"
    if len(allowed) < 2:
        return "auto"
    return str(allowed[0 if slot is None else (slot + 1) % len(allowed)])


ENGINE_NAME = "modelhost-engine"  # what `ps -o comm` and /proc/PID/comm show (15 characters kept)


def _name_process(name: str) -> None:
    """The process's name as tools show it (prctl PR_SET_NAME), so that the engine can be told
    from the front ends; threads started afterwards inherit it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _engine_main(options: ServerOptions, path: str, master: int, stop_fd: int,
                 journal_path: str) -> None:
    # Signals to the process group are for the master: it stops the front ends first and then
    # this process (the stop pipe), so that requests in flight finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A restarted engine is forked from the running master: none of gunicorn's signal handlers
    # may run here (its SIGCHLD handler would reap this process's own children as workers).
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGTTIN,
                signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    _name_process(ENGINE_NAME)
    code = 0
    host = metrics = link = None
    try:
        from host.frontend.engine import EngineLink
        from host.supervise import Journal, start_host

        journal = Journal(Path(journal_path))
        journal.read()  # a previous engine's, when this one replaces it
        host = start_host(replace(options, python_cpu=python_cpu(options)), journal)
        metrics = startup.start_metrics(host, options)
        link = EngineLink(host, path)
        link.start()
        startup.log_summary(host, startup.listening_rows(options, listening_grpc(options), metrics))
        startup.settle()
        while not select.select([stop_fd], [], [], 1.0)[0]:
            if os.getppid() != master:  # the master is gone: so is the server
                break
    except BaseException as exc:  # noqa: BLE001 - every start-up failure ends the same way
        log.debug("engine start-up failed", exc_info=True)
        startup.log.error("%s", startup.explain(exc, options))
        code = 1
    finally:
        for part in (link, metrics):
            if part is not None:
                part.stop()
        if host is not None:
            if code == 0:
                log.info("stopping: waiting for in-flight requests, then unloading models")
            host.stop()
        if os.getppid() != master:  # the master died without cleaning up: its folder is ours
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        logs.flush()
        os._exit(code)


class _Listening:
    """What startup.listening_rows reads of a gRPC server: the port the front ends share."""

    def __init__(self, options: ServerOptions) -> None:
        self.port = options.grpc_port


def listening_grpc(options: ServerOptions) -> Any:
    return _Listening(options) if options.allow_grpc else None
