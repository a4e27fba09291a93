"""Test helpers: run a real `modelhost serve` process on free loopback ports.

Shipped in the package so plugin authors can test their plugins the way modelhost tests itself::

    from host.testing import serve

    def test_my_backend(tmp_path):
        with serve(tmp_path / "models") as server:
            client = tritonclient.http.InferenceServerClient(server.url)
            ...

The server is a separate process (`python -m host serve ...`) with its output in a log file; it is
stopped (and killed if it does not stop) when the context exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

__all__ = ["ServerProcess", "ServerStartError", "free_port", "serve", "wait_until"]

T = TypeVar("T")

_LOG_TAIL_CHARS = 4000
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, message: str = ""
) -> T:
    """Call `predicate` until it returns a truthy value, and return that value.

    Raises TimeoutError (with `message`) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(message or f"condition not met within {timeout} s")
        time.sleep(interval)


class ServerStartError(RuntimeError):
    """The server process exited, or did not become ready, during start-up. The message has its log tail."""


class ServerProcess:
    """One `python -m host serve` process on free loopback ports.

    `start()` returns once `GET /v2/health/ready` answers 200; `stop()` ends it. Also a context manager
    that starts on enter and always stops (killing if needed) on exit.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        *extra_args: str,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        entry: Sequence[str] = ("-m", "host", "serve"),
    ) -> None:
        self.entry = tuple(entry)  # how python starts it: `modelhost serve`, or `tritonserver`
        self.model_repository = str(model_repository)
        # HTTPS servers (--http-ssl-cert): the client context the readiness probe uses.
        self.ssl_context = ssl_context
        self.extra_args = [str(arg) for arg in extra_args]
        self.env = dict(env or {})
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="modelhost-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._group_killed = False

    # --- addresses -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """"127.0.0.1:PORT", the form `tritonclient.http.InferenceServerClient` takes."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.ssl_context is not None else 'http'}://{self.url}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable, *self.entry,
            "--model-repository", self.model_repository,
            "--http-address", "127.0.0.1",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            *self.extra_args,
        ]  # fmt: skip

    # --- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 60.0, attempts: int = 3) -> ServerProcess:
        """Start on fresh free ports and wait until ready; retries when a port was taken meanwhile."""
        for attempt in range(attempts):
            self.http_port, self.grpc_port, self.metrics_port = _distinct_free_ports(3)
            try:
                self._start_once(timeout)
                return self
            except ServerStartError:
                if attempt + 1 == attempts or "address already in use" not in self.log_text().lower():
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        # `python -m host` imports this very package (installed or a source tree), not whatever `host`
        # the current directory holds: no cwd on sys.path (PYTHONSAFEPATH), this package's parent first.
        package_parent = str(Path(__file__).resolve().parent.parent)
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
        # A test's clients often outlive its server: stopping, the server closes their idle
        # connections instead of serving them until the exit timeout, as Triton and a server
        # started otherwise do (the flag, or this variable in `env`, restores that).
        env.setdefault("MODELHOST_EXIT_WAIT_IDLE_CONNECTIONS", "false")
        env.update(self.env)
        self._group_killed = False
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: kill() reaches any workers it forks
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"server exited with code {self.process.returncode} during start-up\n"
                    f"command: {' '.join(self.command)}\n{self._log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.1)
        self.kill()
        raise ServerStartError(f"server not ready after {timeout} s\n{self._log_tail()}")

    def is_ready(self) -> bool:
        try:
            opener = _NO_PROXY if self.ssl_context is None else urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.ssl_context))
            with opener.open(f"{self.http_url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send `sig` and wait up to `timeout` s for the exit; kill after that. Returns the exit code
        (negative: killed by that signal), or None when it was never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._kill_group()  # children left behind by the server
        return self.process.returncode

    def kill(self) -> None:
        if self.process is None:
            return
        self._kill_group()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()

    def _kill_group(self) -> None:
        # Once per start: after that the group id could in principle be reused.
        if self.process is None or self._group_killed:
            return
        self._group_killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> ServerProcess:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            if self.process is not None and self.process.poll() is None:
                self.kill()

    # --- output --------------------------------------------------------------------------
    def log_text(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self) -> str:
        text = self.log_text()
        tail = text[-_LOG_TAIL_CHARS:]
        return f"--- server log ({self.log_path}), last {len(tail)} of {len(text)} chars ---\n{tail}"


@contextlib.contextmanager
def serve(
    model_repository: str | os.PathLike[str],
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    ssl_context: ssl.SSLContext | None = None,
) -> Iterator[ServerProcess]:
    """Run `modelhost serve` on `model_repository` for the duration of the block.

    The log file is removed afterwards unless the block raised (then its path is kept for inspection).
    """
    server = ServerProcess(model_repository, *extra_args, env=env, ssl_context=ssl_context)
    failed = True
    try:
        with server.start(timeout):
            yield server
        failed = False
    finally:
        server.kill()
        if not failed:
            server.log_path.unlink(missing_ok=True)


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
