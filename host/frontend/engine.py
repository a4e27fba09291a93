"""The engine process's side: serve the front ends' messages on the one Host.

One connection per front end carries all its traffic, each message tagged with a key the front
end chose:

- "i": unary inference; answered "r" (the response) or "e" (the error), as `Host.infer`.
- "c": one of the Host's other methods (a fixed list); answered "r" or "e".
- "s" / "t": `Host.submit` / `Host.infer_stream`: requests with any number of responses
  (streams, decoupled models, generate). "a" acknowledges that the submission returned (or
  carries what it raised), so that the front end's call returns or raises when the Host's would;
  each response goes back as "p" as it comes.
- "x": cancel the request with that key.

The connection's reader thread takes every message one read brought, and runs a request in place
when that is cheap: a model whose executes are short (host.affinity's measure), or one whose
scheduler only queues it (dynamic and sequence batching). Answers made on the reader thread wait
and leave together, after the last message of the read: under load one wake-up and one write
serve many requests in each direction. Anything that may take long (a model with long or unknown
executes, a decoupled model, model control) runs on a pool thread, and its answer leaves when it
is ready, so that one slow request never holds up the others.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from host import affinity
from host.errors import HostError, InternalError
from host.frontend import wire
from host.inference import InferenceResponse

log = logging.getLogger(__name__)

# The Host's methods a front end may call ("c"), and those of its shared-memory registry.
CALLS = frozenset({
    "live", "ready", "server_metadata", "model_ready", "model_metadata", "model_config",
    "statistics", "repository_index", "load_model", "unload_model", "trace_setting",
    "log_settings", "shm.status", "shm.register_system", "shm.register_cuda", "shm.unregister",
})
# Calls that only read the engine's state: answered on the reader thread.
QUICK_CALLS = frozenset({"live", "ready", "server_metadata", "model_ready", "model_metadata",
                         "model_config", "statistics", "repository_index", "shm.status"})


def _as_host_error(exc: BaseException) -> HostError:
    if isinstance(exc, HostError):
        return exc
    log.exception("a front end's request failed in the engine")
    return InternalError(f"internal error: {type(exc).__name__}: {exc}")


class EngineLink:
    """Listens on a Unix socket for the front ends of this server."""

    def __init__(self, host: Any, path: str) -> None:
        self.host = host
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="frontend-work")

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="frontend-accept", daemon=True).start()

    def stop(self) -> None:
        self._closed = True
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.pool.shutdown(wait=True)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="frontend-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        affinity.pin()
        try:
            FrontEndConnection(self.host, conn, self.pool).run()
        except (wire.Closed, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()


class FrontEndConnection:
    """One front end's messages."""

    def __init__(self, host: Any, conn: socket.socket, pool: ThreadPoolExecutor) -> None:
        self.host = host
        self.conn = conn
        self.pool = pool
        self.send_lock = threading.Lock()
        self.reader_thread = threading.get_ident()
        self.held: list[tuple] = []  # answers made on the reader thread, sent after the read
        self.inflight: dict[int, Any] = {}  # key -> request, for "x"
        self.lock = threading.Lock()

    # --- answers -----------------------------------------------------------------------------
    def answer(self, message: tuple) -> None:
        if threading.get_ident() == self.reader_thread:
            self.held.append(message)
            return
        with self.send_lock:
            try:
                wire.send(self.conn, message)
            except OSError:
                pass  # the front end is gone; its requests are cancelled by the reader

    def _flush(self) -> None:
        held, self.held = self.held, []
        if held:
            with self.send_lock:
                wire.send_many(self.conn, held)

    # --- the reader ----------------------------------------------------------------------------
    def run(self) -> None:
        reader = wire.Reader(self.conn)
        try:
            while True:
                for message in reader.messages():
                    try:
                        self._dispatch(message)
                    except Exception as exc:  # noqa: BLE001 - that message's failure, not the link's
                        self.answer(("e", message[1], _as_host_error(exc)))
                self._flush()
        finally:
            with self.lock:  # the front end went away: nobody waits for these any more
                for request in self.inflight.values():
                    request.cancel()
                self.inflight.clear()

    def _dispatch(self, message: tuple) -> None:
        op, key = message[0], message[1]
        if op == "i":
            request = wire.unpack_request(message[2])
            self._track(key, request)
            if self._runs_in_place(request):
                self._infer(key, request, message[3])
            else:
                self.pool.submit(self._infer, key, request, message[3])
        elif op == "c":
            if message[2] in QUICK_CALLS:
                self._call(key, message[2], message[3], message[4])
            else:
                self.pool.submit(self._call, key, message[2], message[3], message[4])
        elif op in ("s", "t"):
            request = wire.unpack_request(message[2])
            self._track(key, request)
            self.pool.submit(self._submit if op == "s" else self._stream, key, request)
        elif op == "x":
            with self.lock:
                target = self.inflight.get(key)
            if target is not None:
                target.cancel()
        else:
            raise InternalError(f"unknown engine message '{op}'")

    def _runs_in_place(self, request: Any) -> bool:
        try:
            mv = self.host.manager.get(request.model_name, request.model_version)
        except HostError:
            return True  # answered at once with the error
        if mv.decoupled:
            return False
        return mv.scheduler is not None and (getattr(mv.scheduler, "queues", False) or not mv.wide_execute)

    def _track(self, key: int, request: Any) -> None:
        with self.lock:
            self.inflight[key] = request

    def _finished(self, key: int) -> None:
        with self.lock:
            self.inflight.pop(key, None)

    # --- the work ------------------------------------------------------------------------------
    def _infer(self, key: int, request: Any, endpoint: str) -> None:
        def done(result: Any) -> None:
            self._finished(key)
            if isinstance(result, BaseException):
                self.answer(("e", key, _as_host_error(result)))
            else:
                self.answer(("r", key, wire.pack_response(result)))

        try:
            self.host.infer_async(request, done, endpoint)
        except BaseException as exc:  # noqa: BLE001 - raised before scheduling: the caller's error
            self._finished(key)
            self.answer(("e", key, _as_host_error(exc)))

    def _call(self, key: int, method: str, args: tuple, kwargs: dict) -> None:
        try:
            if method not in CALLS:
                raise InternalError(f"unknown engine call '{method}'")
            target = self.host.shm if method.startswith("shm.") else self.host
            self.answer(("r", key, getattr(target, method.rpartition(".")[2])(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001
            self.answer(("e", key, _as_host_error(exc)))

    def _submit(self, key: int, request: Any) -> None:
        def callback(response: Any, final: bool) -> None:
            if final:
                self._finished(key)
            self.answer(("p", key, wire.pack_response(response), final))

        try:
            self.host.submit(request, callback)
        except BaseException as exc:  # noqa: BLE001 - raised by the front end's submit
            self._finished(key)
            self.answer(("a", key, _as_host_error(exc)))
            return
        self.answer(("a", key, None))

    def _stream(self, key: int, request: Any) -> None:
        try:
            responses = self.host.infer_stream(request)
        except BaseException as exc:  # noqa: BLE001
            self._finished(key)
            self.answer(("a", key, _as_host_error(exc)))
            return
        self.answer(("a", key, None))
        try:
            for response in responses:
                self.answer(("p", key, wire.pack_response(response), False))
        except BaseException as exc:  # noqa: BLE001
            error = InferenceResponse(model_name=request.model_name, id=request.id,
                                      error=_as_host_error(exc))
            self.answer(("p", key, wire.pack_response(error), False))
        finally:
            self._finished(key)
            self.answer(("p", key, None, True))
