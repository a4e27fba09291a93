"""The front-end process's side: `RemoteHost`, the Host's interface, answered by the engine.

The HTTP app and the gRPC servicer are given a RemoteHost instead of a Host and do not know the
difference: every call goes to the engine (host.frontend.engine), so registrations, statistics,
model control and the response cache are the engine's, the same for every front end.
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
import time
from typing import Any, Callable, Iterator

from host import affinity, headers, logsettings
from host.errors import CancelledError, HostError, UnavailableError
from host.frontend import wire
from host.inference import InferenceRequest, InferenceResponse, ResponseCallback, drain
from host.options import ServerOptions

log = logging.getLogger(__name__)

ENGINE_GONE = "the engine process of this server is gone"
WATCH_S = 0.1  # how often cancellations are forwarded and the engine's presence checked
LOG_SYNC_S = 1.0  # how often the engine's log settings are taken over
_LOG_KEYS = ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


def connect(path: str, pid_path: str) -> tuple[socket.socket, int]:
    """A connection to the engine, and its process id; while it starts (loads its models),
    wait for it."""
    while True:
        pid = engine_pid(pid_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock, pid
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not engine_alive(pid) and engine_pid(pid_path) == pid:
                raise UnavailableError(ENGINE_GONE) from None
            time.sleep(0.05)


def engine_pid(pid_path: str) -> int:
    """The engine the master started last (host.frontend.process writes it)."""
    try:
        with open(pid_path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def engine_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class _Shm:
    """`host.shm` of the engine: the registry every front end shares."""

    def __init__(self, remote: RemoteHost) -> None:
        self._remote = remote

    def status(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call("shm.status", *args, **kwargs)

    def register_system(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call("shm.register_system", *args, **kwargs)

    def register_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call("shm.register_cuda", *args, **kwargs)

    def unregister(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call("shm.unregister", *args, **kwargs)


class _Pending:
    """A request or call sent to the engine, until its last answer."""

    __slots__ = ("request", "callback", "stream", "acked", "error", "sent_cancel", "final_seen")

    def __init__(self, request: InferenceRequest | None, callback: Callable[[tuple], None],
                 stream: bool = False) -> None:
        self.request = request
        self.stream = stream  # "s"/"t": acknowledged, then "p" answers; else one "r" or "e"
        self.callback = callback  # given each answer message
        self.acked = threading.Event()
        self.error: HostError | None = None
        self.sent_cancel = False
        self.final_seen = False  # the final response came before the acknowledgement


class RemoteHost:
    """What the front ends need of a Host, done by the engine process over one connection."""

    def __init__(self, options: ServerOptions, path: str, pid_path: str) -> None:
        self.options = options
        self.path = path
        self.shm = _Shm(self)
        otel = getattr(options.trace, "mode", "") == "opentelemetry"
        self.http_header_forwarder = headers.forwarder(options.http_header_forward_pattern, otel)
        self.grpc_header_forwarder = headers.forwarder(options.grpc_header_forward_pattern, otel)
        self.failure: str | None = None  # set once the engine is gone
        self._keys = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._sock, self.engine_pid = connect(path, pid_path)  # waits while the engine starts
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, name="engine-watch", daemon=True)
        self._watcher.start()

    # --- sending -------------------------------------------------------------------------------
    def _send(self, key: int, pending: _Pending, message: tuple) -> None:
        if self.failure:
            raise UnavailableError(self.failure)
        with self._lock:
            self._pending[key] = pending
        try:
            with self._send_lock:
                wire.send(self._sock, message)
        except OSError:
            self._engine_gone()

    def _round_trip(self, message_of: Callable[[int], tuple],
                    request: InferenceRequest | None = None) -> Any:
        answers: queue.SimpleQueue = queue.SimpleQueue()
        key = next(self._keys)
        self._send(key, _Pending(request, answers.put), message_of(key))
        kind, value = answers.get()
        if kind == "e":
            raise value
        return value

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._round_trip(lambda key: ("c", key, method, args, kwargs))

    # --- the Host's interface ------------------------------------------------------------------
    def live(self) -> bool:
        return self.call("live")

    def ready(self) -> bool:
        return self.call("ready")

    def server_metadata(self) -> dict[str, Any]:
        return self.call("server_metadata")

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.call("model_ready", name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self.call("model_metadata", name, version)

    def model_config(self, name: str, version: str = "") -> Any:
        return self.call("model_config", name, version)

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self.call("statistics", name, version)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.call("repository_index", ready_only=ready_only)

    def load_model(self, name: str, config: str | None = None,
                   files: dict[str, bytes] | None = None) -> None:
        self.call("load_model", name, config=config, files=files)

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.call("unload_model", name, unload_dependents=unload_dependents)

    def trace_setting(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("trace_setting", model, changes)

    def log_settings(self, changes: dict[str, Any] | None = None,
                     format_name: str = "log_format") -> dict[str, Any]:
        settings = self.call("log_settings", changes, format_name)
        if changes:
            self._follow_log_settings(settings)
        return settings

    def infer(self, request: InferenceRequest, timeout: float | None = None,
              endpoint: str = "HTTP end point") -> InferenceResponse:
        packed = wire.pack_request(request)
        response = self._round_trip(lambda key: ("i", key, packed, endpoint), request)
        return wire.unpack_response(response)  # type: ignore[return-value]

    def infer_async(self, request: InferenceRequest,
                    done: Callable[[InferenceResponse | HostError], None],
                    endpoint: str = "HTTP end point") -> None:
        """As the Host's: `done(response or error)` runs once, here on the connection's reader
        thread (the caller's thread is free at once)."""
        def answered(message: tuple) -> None:
            kind, value = message
            done(value if kind == "e" else wire.unpack_response(value))  # type: ignore[arg-type]

        key = next(self._keys)
        self._send(key, _Pending(request, answered), ("i", key, wire.pack_request(request), endpoint))

    def submit(self, request: InferenceRequest, callback: ResponseCallback) -> None:
        self._start("s", request, callback)

    def infer_stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        responses: queue.SimpleQueue = queue.SimpleQueue()
        self._start("t", request, lambda r, final: responses.put((r, final)))
        return drain(request, responses)  # a cancel reaches the engine through the watcher

    def _start(self, op: str, request: InferenceRequest, callback: ResponseCallback) -> None:
        def answered(message: tuple) -> None:  # (response, final)
            callback(wire.unpack_response(message[0]), message[1])

        key = next(self._keys)
        pending = _Pending(request, answered, stream=True)
        self._send(key, pending, (op, key, wire.pack_request(request)))
        pending.acked.wait()
        if pending.error is not None:
            raise pending.error

    # --- receiving -----------------------------------------------------------------------------
    def _read(self) -> None:
        affinity.pin()
        reader = wire.Reader(self._sock)
        try:
            while True:
                for message in reader.messages():
                    self._answer(message)
        except (wire.Closed, OSError):
            pass
        finally:
            self._engine_gone()

    def _answer(self, message: tuple) -> None:
        op, key = message[0], message[1]
        with self._lock:
            pending = self._pending.get(key)
        if pending is None:
            return
        if op == "a":  # a submission returned (None) or raised (the error)
            pending.error = message[2]
            if pending.error is not None or pending.final_seen:
                self._forget(key)
            pending.acked.set()
            return
        if op == "p":
            if message[3]:  # final
                if pending.acked.is_set():
                    self._forget(key)
                else:  # kept until its acknowledgement, which _start waits for
                    pending.final_seen = True
            payload: tuple = (message[2], message[3])
        else:  # "r" or "e": the one answer of a call or unary inference
            self._forget(key)
            payload = (op, message[2])
        try:
            pending.callback(payload)
        except Exception:  # noqa: BLE001 - one request's callback, not the connection's
            log.exception("a response callback failed")

    def _forget(self, key: int) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def _engine_gone(self) -> None:
        if self._closed:
            return
        with self._lock:
            if self.failure is None:
                self.failure = ENGINE_GONE
            pending, self._pending = self._pending, {}
        error = UnavailableError(ENGINE_GONE)
        for p in pending.values():
            try:
                if not p.stream:
                    p.callback(("e", error))
                elif not p.acked.is_set():  # its submit raises
                    p.error = error
                    p.acked.set()
                else:  # submitted: it ends with an error response
                    request = p.request
                    assert request is not None
                    response = InferenceResponse(model_name=request.model_name, id=request.id,
                                                 error=CancelledError(ENGINE_GONE))
                    p.callback((wire.pack_response(response), True))
            except Exception:  # noqa: BLE001
                log.exception("a response callback failed")

    def _watch(self) -> None:
        """Forward cancellations (a client gone, a stream closed), notice an engine that died,
        and take over the engine's log settings (changed through another front end)."""
        affinity.pin()
        next_sync = 0.0
        while not self._closed and self.failure is None:
            time.sleep(WATCH_S)
            with self._lock:
                cancelled = [(k, p) for k, p in self._pending.items()
                             if p.request is not None and p.request.cancelled and not p.sent_cancel]
            for key, p in cancelled:
                p.sent_cancel = True
                try:
                    with self._send_lock:
                        wire.send(self._sock, ("x", key))
                except OSError:
                    break
            if not engine_alive(self.engine_pid):
                self._engine_gone()
                break
            now = time.monotonic()
            if now >= next_sync:
                next_sync = now + LOG_SYNC_S
                try:
                    self._follow_log_settings(self.call("log_settings"))
                except HostError:
                    pass

    @staticmethod
    def _follow_log_settings(settings: dict[str, Any]) -> None:
        local = logsettings.current().as_dict()
        changes = {k: settings[k] for k in _LOG_KEYS if k in settings and settings[k] != local.get(k)}
        if changes:
            logsettings.update(changes)

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
