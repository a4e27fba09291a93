"""The gRPC server: Triton's GRPCInferenceService for a `Host`, in the host's process.

`start_grpc_server(host, address, port)` binds, starts and returns a `GrpcServer`; `.stop(grace)`
ends it (in-flight calls get `grace` seconds, then are cancelled).

The transport is a small event loop over grpcio's C core (`grpc._cython.cygrpc`: the completion
queue, server, call and batch operations that grpcio's own `grpc.server` is built on; nothing
else of it is used), not `grpc.server` itself. That one hands every call between its polling
thread and its thread pool, with locks and condition variables at each step, which costs more
than running the model. Measured with perf_analyzer on this project's 2-core machine, canned
responses, no model: `grpc.server` 1.4k infer/s at concurrency 1 and 1.9k at 8, `grpc.aio`
1.3k and 2.5k, this loop 2.7k and 3.6k; with the python identity model behind it, `grpc.server`
stayed below real Triton's gRPC front end at both concurrencies, this loop is at or above it.

How it runs:
- One thread polls the completion queue and runs each event to the end: a unary call is
  received, its method runs on that thread (the model executes there, as with the HTTP front
  end) and the answer goes out, with no hand-off. More threads only cost more (contention for
  the GIL, measured): others are woken only while every polling thread has been stuck on one
  event for a moment (a slow model, a model load, a dynamic batcher gathering a batch), see
  `_Pollers`.
- A stream's requests run the same way: each on the thread that read it, the next one read
  first, so that while one request is stuck other threads take the next ones and the requests
  of a stream proceed concurrently (`host.grpc.stream`). Its responses are written one at a
  time, as the core requires, from a per-call queue.
- Every call watches for its cancellation (client cancel, deadline, disconnect): a unary call
  cancels its request, a stream every request it has in flight.
- At --log-verbose each call is made a `_LoggedUnaryCall` or `_LoggedStreamCall`, which logs its
  line (host.logs.GrpcCallLog: status, duration, request id, peer) when the core reports the
  call closed; otherwise the plain classes run, and the only cost is one check of the level.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import re
import threading
import time
from typing import Any, Callable

from host.grpc import core_settings

core_settings.apply()  # before grpc's core reads the environment (see the module)

import grpc  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402
from grpc._cython import cygrpc  # noqa: E402

from host import affinity, scheduler  # noqa: E402
from host.errors import HostError  # noqa: E402
from host.logs import GrpcCallLog  # noqa: E402
from host.grpc import codec  # noqa: E402
from host.grpc.servicer import DEFERRED, Servicer  # noqa: E402
from host.grpc.status import status_code  # noqa: E402
from host.proto import grpc_service_pb2 as pb  # noqa: E402
from host.restricted import Restrictions  # noqa: E402

log = logging.getLogger("host.grpc")
_REQUEST_LOG = logging.getLogger("host.request")

SERVICE = "inference.GRPCInferenceService"
DEFAULT_MAX_MESSAGE_BYTES = 2**31 - 1  # as Triton: INT32_MAX both ways
# Response compression as Triton's --grpc-infer-response-compression-level: the core picks an
# algorithm the client accepts. Compressed requests are always accepted (gzip, deflate).
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}

_OK = cygrpc.StatusCode.ok
_NO_FLAGS = 0
_OPERATION_COMPLETE = cygrpc.CompletionType.operation_complete
_QUEUE_SHUTDOWN = cygrpc.CompletionType.queue_shutdown
_ReceiveMessage = cygrpc.ReceiveMessageOperation
_ReceiveClose = cygrpc.ReceiveCloseOnServerOperation
_SendMetadata = cygrpc.SendInitialMetadataOperation
_SendMessage = cygrpc.SendMessageOperation
_SendStatus = cygrpc.SendStatusFromServerOperation
_VERBOSE2 = logging.DEBUG - 1  # --log-verbose=2 (host.logsettings)
# gRPC status code -> its name (OK, INVALID_ARGUMENT...), for the --log-verbose lines
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


_INFER_PATH = f"/{SERVICE}/ModelInfer"
_SHUTTING_DOWN = "GRPC server is shutting down and has stopped accepting new requests."
_STATE_IDS = itertools.count(1)
_HANDLERS = {_INFER_PATH: "ModelInferHandler", f"/{SERVICE}/ModelStreamInfer": "ModelStreamInferHandler"}


def _log_state_end(handler: str, cancelled: bool) -> None:
    """Triton's lines for an inference call's end, at --log-verbose (its QA greps the log for
    them): "Cancellation notification received for <handler>" (level 1) when the client
    cancelled it, and "StateRelease" (level 2) as the call's state is let go."""
    state = next(_STATE_IDS)
    if cancelled:
        _REQUEST_LOG.debug("Cancellation notification received for %s, rpc_ok=1, context %d "
                           "step CANCELLED, state %d step CANCELLED", handler, state, state)
    _REQUEST_LOG.log(_VERBOSE2, "StateRelease, %d Step %s", state,
                     "CANCELLED" if cancelled else "FINISH")


def _ignore(event: Any) -> None:
    """Tag of batches whose completion needs no action."""


def _error_status(exc: BaseException) -> tuple[int, bytes]:
    if isinstance(exc, HostError):
        return status_code(exc.code).value[0], exc.message.encode("utf-8", "replace")
    log.error("unhandled error in a gRPC call", exc_info=exc)
    return (grpc.StatusCode.INTERNAL.value[0],
            f"internal error: {type(exc).__name__}: {exc}".encode("utf-8", "replace"))


class _CallCount:
    """How many inference calls (ModelInfer, ModelStreamInfer) are under way: Triton's count of
    "gRPC service connections and inference handlers" that its shutdown waits for. The calls
    are kept in a set (adding and discarding one is atomic under the GIL, cheaper per call than
    a lock around a counter)."""

    __slots__ = ("live", "refusing")

    def __init__(self) -> None:
        self.live: set[Any] = set()
        self.refusing = False  # draining: a stream's new requests are refused (GrpcServer.drain)

    @property
    def value(self) -> int:
        return len(self.live)


# --- unary calls ----------------------------------------------------------------------------

class _UnaryCall:
    """One unary call: receive the request, run the method, send response and status."""

    __slots__ = ("call", "method", "parse", "cancelled", "callbacks", "metadata", "counter",
                 "read_ns")

    def __init__(self, call: Any, method: Callable[[Any, Any], Any], parse: Callable[[bytes], Any],
                 metadata: Any = (), counter: _CallCount | None = None) -> None:
        # when the call began waiting for its request, then had it (Triton's GRPC_WAITREAD_*)
        self.read_ns = (time.perf_counter_ns(), 0)
        self.call = call
        self.counter = counter  # inference calls: counted until they end (GrpcServer.drain)
        if counter is not None:
            counter.live.add(self)
        self.metadata = metadata  # the client's (key, value) pairs
        self.method = method
        self.parse = parse
        self.cancelled = False
        self.callbacks: list[Callable[[], None]] | None = None
        call.start_server_batch((_ReceiveClose(_NO_FLAGS),), self._on_close)
        call.start_server_batch((_ReceiveMessage(_NO_FLAGS),), self._on_message)

    def add_cancel_callback(self, callback: Callable[[], None]) -> None:
        if self.callbacks is None:
            self.callbacks = [callback]
        else:
            self.callbacks.append(callback)
        if self.cancelled:  # it raced with the cancellation: run it (callbacks are idempotent)
            callback()

    def _on_close(self, event: Any) -> None:
        if self.counter is not None:
            self.counter.live.discard(self)
        if event.batch_operations[0].cancelled():
            self.cancelled = True
            for callback in self.callbacks or ():
                callback()

    def _on_message(self, event: Any) -> None:
        if not event.success:  # cancelled before the request arrived
            return
        data = event.batch_operations[0].message()
        self.read_ns = (self.read_ns[0], time.perf_counter_ns())
        try:
            if data is None:
                raise _Status(grpc.StatusCode.INTERNAL, "the call carried no request message")
            try:
                request = self.parse(data)
            except DecodeError:
                # Triton's answer (gRPC C++'s), checked on 2.51
                raise _Status(grpc.StatusCode.INTERNAL, "Unable to parse request") from None
            if self.counter is None:  # not an inference: it may wait (an unload for requests)
                scheduler.run_deferred_now()
            response = self.method(request, self)
        except BaseException as exc:  # noqa: BLE001 - every error (sys.exit() too) is the call's status
            self.finish(exc)
            return
        if response is not DEFERRED:
            self.finish(response)

    def finish(self, response: Any) -> None:
        """Send the answer (a message, or an exception for its status); any thread may call it,
        once. A method that returned `DEFERRED` calls it when its answer is ready."""
        try:
            if isinstance(response, BaseException):
                raise response
            # a message, or its bytes already (host.grpc.codec.encode_unary_response)
            data = response if type(response) is bytes else response.SerializeToString()
        except BaseException as exc:  # noqa: BLE001 - every error is the call's status
            code, details = exc.status if isinstance(exc, _Status) else _error_status(exc)
            self._send_error(code, details)
            return
        self.call.start_server_batch(
            (_SendMetadata(None, _NO_FLAGS), _SendMessage(data, _NO_FLAGS),
             _SendStatus(None, _OK, b"", _NO_FLAGS)), _ignore)

    def _send_error(self, code: int, details: bytes) -> None:
        self.call.start_server_batch(
            (_SendMetadata(None, _NO_FLAGS), _SendStatus(None, code, details, _NO_FLAGS)), _ignore)


class _LoggedUnaryCall(_UnaryCall):
    """A unary call at --log-verbose: its line (host.logs.GrpcCallLog) when it ends. The call
    ends when the core reports it closed, after its status went out (or it was cancelled)."""

    __slots__ = ("record", "code")

    def __init__(self, call: Any, method: Callable[[Any, Any], Any], parse: Callable[[bytes], Any],
                 metadata: Any, record: GrpcCallLog, counter: _CallCount | None = None) -> None:
        self.record = record
        self.code = _OK  # the status sent; an error's replaces it
        super().__init__(call, method, parse, metadata, counter)

    def _send_error(self, code: int, details: bytes) -> None:
        self.code = code
        super()._send_error(code, details)

    def _on_close(self, event: Any) -> None:
        cancelled = event.batch_operations[0].cancelled()
        try:
            super()._on_close(event)
        finally:
            self.record.done("CANCELLED" if cancelled else _CODE_NAMES.get(self.code, str(self.code)))
            if self.record.method == _INFER_PATH:
                _log_state_end("ModelInferHandler", cancelled)


class _Status(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status = (code.value[0], details.encode())


# --- the stream -----------------------------------------------------------------------------

class _StreamCall:
    """ModelStreamInfer's transport: reads requests one by one, writes responses one by one."""

    def __init__(self, call: Any, servicer: Servicer, metadata: Any = (),
                 counter: _CallCount | None = None) -> None:
        self.call = call
        self.metadata = metadata  # the client's (key, value) pairs
        self.counter = counter  # counted until the stream ends (GrpcServer.drain)
        if counter is not None:
            counter.live.add(self)
        self._lock = threading.Lock()
        self._queue: collections.deque[bytes] = collections.deque()
        self._sending = False
        self._metadata_sent = False
        self._finishing = False
        self._over = False  # status sent, or the call ended otherwise
        self._status: tuple[int, bytes] = (_OK, b"")  # fail() replaces it
        self.stream = servicer.ModelStreamInfer(self)
        call.start_server_batch((_ReceiveClose(_NO_FLAGS),), self._on_close)
        call.start_server_batch((_ReceiveMessage(_NO_FLAGS),), self._on_message)

    # reading
    def _on_message(self, event: Any) -> None:
        data = event.batch_operations[0].message() if event.success else None
        if data is None:  # the client closed its side (or the call is gone)
            self.stream.end_of_requests()
            return
        read = ticket = None
        try:
            read = codec.read_stream_request(data)  # (the message, its request or decoding error)
        except DecodeError:
            self.stream.request_error("failed to parse the request message")
        else:
            if self.counter is not None and self.counter.refusing:
                # Triton's stream handler once its server is stopping (its text)
                self.stream.request_error(_SHUTTING_DOWN)
            else:
                ticket = self.stream.admit(read[0])  # its place first, then the next one is read
        self.call.start_server_batch((_ReceiveMessage(_NO_FLAGS),), self._on_message)
        if ticket is not None and read is not None:
            # On this thread: if it takes long, other polling threads read and run the next ones.
            self.stream.run(read[0], ticket, read[1])

    def _on_close(self, event: Any) -> None:
        if self.counter is not None:
            self.counter.live.discard(self)
        cancelled = event.batch_operations[0].cancelled()
        with self._lock:
            self._over = True
            self._queue.clear()
        if cancelled:
            self.stream.cancel()

    # writing (the stream's Writer)
    def send(self, message: Any) -> None:
        # a message, or its bytes already (host.grpc.codec.stream_response)
        data = message if type(message) is bytes else message.SerializeToString()
        with self._lock:
            if self._over or self._finishing:
                return
            if self._sending:
                self._queue.append(data)
                return
            self._sending = True
        self._start_send(data)

    def finish(self) -> None:
        with self._lock:
            if self._over or self._finishing:
                return
            self._finishing = True
            if self._sending:
                return  # _on_sent ends the call once the queue is drained
        self._send_status()

    def fail(self, code: int, details: str) -> None:
        with self._lock:
            if self._over or self._finishing:
                return
            self._finishing = True
            self._status = (code, details.encode())
            if self._sending:
                return  # _on_sent ends the call once the queue is drained
        self._send_status()

    def _start_send(self, data: bytes) -> None:
        operations: tuple[Any, ...]
        if self._metadata_sent:
            operations = (_SendMessage(data, _NO_FLAGS),)
        else:
            self._metadata_sent = True
            operations = (_SendMetadata(None, _NO_FLAGS), _SendMessage(data, _NO_FLAGS))
        self.call.start_server_batch(operations, self._on_sent)

    def _on_sent(self, event: Any) -> None:
        with self._lock:
            if not event.success or self._over:
                self._sending = False
                self._queue.clear()
                return
            if self._queue:
                data = self._queue.popleft()
            else:
                self._sending = False
                if not self._finishing:
                    return
                data = None
        if data is not None:
            self._start_send(data)
        else:
            self._send_status()

    def _send_status(self) -> None:
        status = _SendStatus(None, self._status[0], self._status[1], _NO_FLAGS)
        operations: tuple[Any, ...]
        if self._metadata_sent:
            operations = (status,)
        else:
            self._metadata_sent = True
            operations = (_SendMetadata(None, _NO_FLAGS), status)
        self.call.start_server_batch(operations, _ignore)


class _LoggedStreamCall(_StreamCall):
    """A stream at --log-verbose: one line (host.logs.GrpcCallLog) when it ends, OK once its
    status went out (a stream's requests fail in its responses, not in its status)."""

    def __init__(self, call: Any, servicer: Servicer, metadata: Any, record: GrpcCallLog,
                 counter: _CallCount | None = None) -> None:
        self.record = record
        super().__init__(call, servicer, metadata, counter)

    def _on_close(self, event: Any) -> None:
        cancelled = event.batch_operations[0].cancelled()
        try:
            super()._on_close(event)
        finally:
            self.record.done("CANCELLED" if cancelled
                             else _CODE_NAMES.get(self._status[0], str(self._status[0])))
            _log_state_end("ModelStreamInferHandler", cancelled)


def _refuse(call: Any, code: int, details: bytes, record: GrpcCallLog | None) -> None:
    """End a call at once with an error status (a denied or unknown method)."""
    tag = _ignore
    if record is not None:  # --log-verbose: its line once the status went out
        def tag(event: Any) -> None:
            record.done("CANCELLED" if event.batch_operations[1].cancelled()
                        else _CODE_NAMES.get(code, str(code)))
    call.start_server_batch(
        (_SendMetadata(None, _NO_FLAGS), _ReceiveClose(_NO_FLAGS), _SendStatus(None, code, details, _NO_FLAGS)),
        tag)


# --- the server -----------------------------------------------------------------------------

def _response_delay_s() -> int:
    """TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC, Triton's testing hook (read once at start,
    as atoi does: 0 when unset or not a number) that holds the answer of every rpc but the
    infer ones for that many seconds; its QA (L0_client_timeout) makes client deadlines pass."""
    match = re.match(r"\s*[+-]?\d+", os.environ.get("TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC", ""))
    return max(int(match.group()), 0) if match else 0


def _delayed(method: Callable[[Any, Any], Any], seconds: int) -> Callable[[Any, Any], Any]:
    def run(request: Any, call: Any) -> Any:
        try:
            return method(request, call)
        finally:  # Triton holds errors too: the delay is in writing the answer
            log.debug("Delaying the write of the response by %d seconds", seconds)
            time.sleep(seconds)
    return run


def _unary_table(servicer: Servicer) -> dict[bytes, tuple[Callable, Callable]]:
    """Every unary rpc of the service: its path -> (servicer method, request parser)."""
    table: dict[bytes, tuple[Callable, Callable]] = {}
    delay = _response_delay_s()
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        if method.client_streaming or method.server_streaming:
            continue
        request_class = getattr(pb, method.input_type.name)
        handler = getattr(servicer, method.name)
        if delay and method.name != "ModelInfer":
            handler = _delayed(handler, delay)
        # ModelInfer's request is decoded as it is parsed (host.grpc.codec.parse_infer_request):
        # a request that repeats the fields of an earlier one skips upb.
        parse = codec.parse_infer_request if method.name == "ModelInfer" else request_class.FromString
        table[f"/{SERVICE}/{method.name}".encode()] = (handler, parse)
    # The standard health service Triton also serves (its request names a service: ignored).
    table[b"/grpc.health.v1.Health/Check"] = (
        _delayed(servicer.Check, delay) if delay else servicer.Check, bytes)
    return table


class _Pollers:
    """The threads that poll the completion queue, each running the event it gets to the end.

    Normally one thread does it all: no hand-off and no contention for the GIL (measured under
    perf_analyzer at concurrency 8, server CPU per request: 1 thread ~380 us, 4 threads ~440 us,
    32 threads ~690 us). When every active thread has been busy with one event for longer than
    `STALL` seconds (a slow model, a model load, a dynamic batcher gathering a batch), the
    watchdog (which looks every `STALL` seconds while events are handled, every `QUIET`
    seconds otherwise) wakes a resting thread (or starts one, up to `max_threads`) so that calls keep
    being taken; a thread that finishes its event while another one waits in `poll` rests again.
    """

    STALL = 0.002  # every active thread busy this long: wake another
    DRAIN = 64  # events read at most before the executes deferred meanwhile run
    QUIET = 0.02  # the watchdog's period while nothing is being handled

    def __init__(self, cq: Any, max_threads: int) -> None:
        self.cq = cq
        self.max_threads = max(1, max_threads)
        self.cond = threading.Condition(threading.Lock())
        self.threads: list[threading.Thread] = []
        self.active = 0  # threads polling or handling an event (the others rest)
        self.resting = 0
        self.wakeups = 0  # resting threads asked to become active
        self.busy: dict[int, float] = {}  # thread -> when it took the event it handles
        self.closed = False  # the completion queue is shut down
        self.failure: str | None = None  # why a polling thread died (it must not; see _run)
        self.stopping = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, name="grpc-watchdog", daemon=True)

    def start(self) -> None:
        with self.cond:
            self._add_thread()
        self.watchdog.start()

    def _add_thread(self) -> None:  # with self.cond held
        self.active += 1
        thread = threading.Thread(target=self._run, name=f"grpc-{len(self.threads)}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _run(self) -> None:
        affinity.pin()  # a poller runs Python: on the Python CPU (host.affinity)
        try:
            self._poll()
        except BaseException as exc:  # noqa: BLE001 - recorded: the worker notices and restarts
            self.failure = f"a gRPC polling thread died: {type(exc).__name__}: {exc}"
            log.critical(self.failure, exc_info=exc)

    def _poll(self) -> None:
        cq, cond, busy = self.cq, self.cond, self.busy
        me = threading.get_ident()
        monotonic = time.monotonic
        # Executes a batching scheduler deferred while this thread read its events: they run
        # once no more events are ready (or after DRAIN of them), so that the requests which
        # arrived together share an execute (host.scheduler.defer).
        deferred = scheduler.open_deferral()
        drained = 0
        event = None
        while True:
            if event is None:
                event = cq.poll()
            busy[me] = monotonic()  # single dict operations: atomic, no lock on this path
            kind = event.completion_type
            if kind == _OPERATION_COMPLETE:
                try:
                    event.tag(event)
                except BaseException:  # noqa: BLE001 - nothing a call does may stop the server
                    log.exception("error handling a gRPC event")
            elif kind == _QUEUE_SHUTDOWN:
                scheduler.run_deferred(deferred)
                with cond:
                    del busy[me]
                    self.active -= 1
                    self.closed = True
                    cond.notify_all()
                return
            event = None  # drop the call's reference before blocking again
            if deferred:
                if drained < self.DRAIN:
                    event = cq.poll(0)  # an absolute deadline in the past: what is ready now
                    if event.completion_type == _OPERATION_COMPLETE:
                        drained += 1
                        continue
                    if event.completion_type != _QUEUE_SHUTDOWN:
                        event = None  # nothing more is ready
                scheduler.run_deferred(deferred)
                drained = 0
                if event is not None:
                    continue
            del busy[me]
            if self.active > 1:
                with cond:
                    if self.active - len(busy) > 1:  # another thread is polling: rest
                        self.active -= 1
                        self.resting += 1
                        while not self.wakeups and not self.closed:
                            cond.wait()
                        self.resting -= 1
                        if self.closed:
                            return
                        self.wakeups -= 1
                        self.active += 1

    def _watch(self) -> None:
        cond = self.cond
        interval = self.QUIET
        while not self.stopping.wait(interval):
            with cond:
                busy = self.busy.copy()
                # Look closely only while something is being handled.
                interval = self.STALL if busy else self.QUIET
                if (not busy or len(busy) < self.active or self.closed
                        or self.active >= self.max_threads):
                    continue  # someone is polling (or there is nobody to add)
                if time.monotonic() - max(busy.values()) < self.STALL:
                    continue
                if self.resting > self.wakeups:
                    self.wakeups += 1
                    cond.notify()
                else:
                    self._add_thread()

    def join(self) -> None:
        """After the completion queue was shut down: wait for every thread."""
        self.stopping.set()
        if self.failure:  # the dead thread will not pass the queue's end on: wake the resting ones
            with self.cond:
                self.closed = True
                self.cond.notify_all()
        me = threading.current_thread()
        for thread in [self.watchdog, *self.threads]:
            if thread is not me and thread.ident is not None:
                thread.join(None if not self.failure else 2.0)


class GrpcServer:
    """A started gRPC server; `.port` is the port it listens on (useful when 0 was asked)."""

    def __init__(self, servicer: Servicer, target: str, options: tuple, max_threads: int,
                 restrictions: Restrictions | None = None, credentials: Any = None) -> None:
        self._servicer = servicer
        self._restrictions = restrictions or None  # host.restricted: None when nothing is
        self._unary = _unary_table(servicer)
        self._stream_path = f"/{SERVICE}/ModelStreamInfer".encode()
        self._infer_path = _INFER_PATH.encode()
        self._calls = _CallCount()  # inference calls under way (drain)
        self._cq = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(options, False)
        self._server.register_completion_queue(self._cq)
        if credentials is not None:  # grpc.ServerCredentials (host.tls): TLS, maybe mutual
            self.port = self._server.add_http2_port(target.encode(), credentials._credentials)
        else:
            self.port = self._server.add_http2_port(target.encode())
        self._pollers = _Pollers(self._cq, max_threads)
        self._lock = threading.Lock()
        self._serving = False
        self._refusing = False  # refuse_new_calls: the core takes no new call
        self._shutdown = threading.Event()

    def _start(self) -> None:
        self._server.start()
        self._serving = True
        # Several calls requested at once, so that several threads can take new calls.
        for _ in range(min(self._pollers.max_threads, 8)):
            self._server.request_call(self._cq, self._cq, self._on_new_call)
        self._pollers.start()
        # Triton's lines for the handlers that wait for the first calls (its two ModelInfer
        # threads, its stream thread), at --log-verbose; its QA counts them.
        for handler in ("ModelInferHandler", "ModelInferHandler", "ModelStreamInferHandler"):
            _REQUEST_LOG.debug("New request handler for %s, %d", handler, 0)

    def _on_new_call(self, event: Any) -> None:
        with self._lock:  # never after shutdown
            if self._serving and not self._refusing:
                self._server.request_call(self._cq, self._cq, self._on_new_call)
        if not event.success:
            return
        path = event.call_details.method
        record = None
        if _REQUEST_LOG.isEnabledFor(logging.DEBUG):  # --log-verbose: a line per call as it ends
            record = GrpcCallLog(path.decode(errors="replace"), event.invocation_metadata,
                                 event.call.peer())
            if record.method in _HANDLERS:  # Triton starts a handler for the next such call
                _REQUEST_LOG.debug("New request handler for %s, %d", _HANDLERS[record.method],
                                   next(_STATE_IDS))
        if self._restrictions is not None:
            denial = self._restrictions.grpc_denial(path.rsplit(b"/", 1)[-1].decode("latin-1"),
                                                    event.invocation_metadata)
            if denial is not None:
                _refuse(event.call, cygrpc.StatusCode.unavailable, denial.encode(), record)
                return
        entry = self._unary.get(path)
        if entry is not None:
            counter = self._calls if path == self._infer_path else None
            if record is None:
                _UnaryCall(event.call, entry[0], entry[1], event.invocation_metadata, counter)
            else:
                _LoggedUnaryCall(event.call, entry[0], entry[1], event.invocation_metadata, record,
                                 counter)
        elif path == self._stream_path:
            if record is None:
                _StreamCall(event.call, self._servicer, event.invocation_metadata, self._calls)
            else:
                _LoggedStreamCall(event.call, self._servicer, event.invocation_metadata, record,
                                  self._calls)
        else:
            # Triton (gRPC C++) answers a method it does not serve with UNIMPLEMENTED and no
            # message: grpc.health.v1.Health/Watch and /List included (it serves Check only).
            _refuse(event.call, cygrpc.StatusCode.unimplemented, b"", record)

    def _on_shutdown(self, event: Any) -> None:
        self._shutdown.set()

    def refuse_new_calls(self) -> None:
        """Take no new call from now on; calls in flight go on (`stop` then waits for them).
        A server asked to stop refuses new work at once, on every front end, as Triton does."""
        with self._lock:
            if not self._serving or self._refusing or self.failure:
                return  # (a failed server is shut down by `stop` alone)
            self._refusing = True
            self._server.shutdown(self._cq, self._on_shutdown)

    def drain(self, seconds: int) -> int:
        """Triton's GracefulStop with its exit timeout: no new connection or call from now on;
        the inference calls under way go on, waited for up to `seconds` with a line a second.
        Returns the seconds left of the exit timeout; `stop` ends what is still running."""
        self.refuse_new_calls()
        self._calls.refusing = True
        left = max(int(seconds), 0)
        while left > 0 and self._calls.value > 0 and not self._shutdown.is_set():
            log.info("Timeout %d: Found %d gRPC service connections and inference handlers",
                     left, self._calls.value)
            for _ in range(20):  # a second, ended early when the last call ends
                if self._calls.value <= 0 or self._shutdown.wait(0.05):
                    break
            left -= 1
        return left

    def stop(self, grace: float | None = 5.0) -> None:
        """Refuse new calls, give in-flight ones `grace` seconds, then cancel the rest."""
        with self._lock:
            if not self._serving:
                return
            self._serving = False
            if self.failure:
                # No thread polls the queue any more: one that only drains it lets the core
                # finish its shutdown; calls in flight are cancelled at once.
                threading.Thread(target=_drain, args=(self._cq,), daemon=True,
                                 name="grpc-drain").start()
                grace = 0
            if not self._refusing:
                self._server.shutdown(self._cq, self._on_shutdown)
        if not self._shutdown.wait(grace if grace is not None else 0):
            self._server.cancel_all_calls()
            self._shutdown.wait()
        self._cq.shutdown()
        self._pollers.join()
        self._server.destroy()
        log.info("gRPC server stopped")

    @property
    def failure(self) -> str | None:
        """Why the server can no longer serve (a polling thread died), or None."""
        return self._pollers.failure

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stopped (True) or `timeout` passed (False)."""
        return self._shutdown.wait(timeout)


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _drain(cq: Any) -> None:
    """Run the events left on a queue whose polling thread died, until it is shut down."""
    while True:
        event = cq.poll()
        if event.completion_type == _QUEUE_SHUTDOWN:
            return
        try:
            event.tag(event)
        except BaseException:  # noqa: BLE001 - shutting down: nothing left to protect
            pass


# Triton's keepalive flags -> grpc core's channel arguments (as Triton's grpc_server.cc sets them;
# the connection-age ones only when not 0).
KEEPALIVE_ARGS = {
    "grpc-keepalive-time": "grpc.keepalive_time_ms",
    "grpc-keepalive-timeout": "grpc.keepalive_timeout_ms",
    "grpc-keepalive-permit-without-calls": "grpc.keepalive_permit_without_calls",
    "grpc-http2-max-pings-without-data": "grpc.http2.max_pings_without_data",
    "grpc-http2-min-recv-ping-interval-without-data": "grpc.http2.min_ping_interval_without_data_ms",
    "grpc-http2-max-ping-strikes": "grpc.http2.max_ping_strikes",
    "grpc-max-connection-age": "grpc.max_connection_age_ms",
    "grpc-max-connection-age-grace": "grpc.max_connection_age_grace_ms",
}


def keepalive_args(settings: dict[str, int]) -> list[tuple[str, int]]:
    return [(KEEPALIVE_ARGS[name], value) for name, value in settings.items()
            if not (name.startswith("grpc-max-connection-age") and value == 0)]


# Triton's names for them in its start-up table, in its order.
_KEEPALIVE_ROWS = (
    ("keepalive_time_ms", "grpc-keepalive-time"),
    ("keepalive_timeout_ms", "grpc-keepalive-timeout"),
    ("keepalive_permit_without_calls", "grpc-keepalive-permit-without-calls"),
    ("http2_max_pings_without_data", "grpc-http2-max-pings-without-data"),
    ("http2_min_recv_ping_interval_without_data_ms", "grpc-http2-min-recv-ping-interval-without-data"),
    ("http2_max_ping_strikes", "grpc-http2-max-ping-strikes"),
    ("max_connection_age_ms", "grpc-max-connection-age"),
    ("max_connection_age_grace_ms", "grpc-max-connection-age-grace"),
)


def keepalive_rows(settings: dict[str, int]) -> list[tuple[str, str]]:
    return [(row, str(settings[name])) for row, name in _KEEPALIVE_ROWS if name in settings
            and not (name.startswith("grpc-max-connection-age") and settings[name] == 0)]


def start_grpc_server(host: Any, address: str, port: int, *, max_workers: int = 32,
                      max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                      compression_level: str = "none", restrictions: Restrictions | None = None,
                      credentials: Any = None, share_port: bool = False,
                      keepalive: dict[str, int] | None = None) -> GrpcServer:
    """Serve `host` over gRPC on `address:port` (port 0: any free port); returns once listening.

    `share_port`: the front-end processes of one server (host.frontend) listen on the same port,
    the kernel spreading connections over them (SO_REUSEPORT).

    At most `max_workers` threads take calls and run them (a call runs its model on the thread
    that took it; see `_Pollers`). `compression_level` (none, low, medium,
    high) compresses responses as Triton's --grpc-infer-response-compression-level does.
    """
    if compression_level not in COMPRESSION_LEVELS:
        raise ValueError(f"unknown compression level '{compression_level}' "
                         f"(expected one of {', '.join(COMPRESSION_LEVELS)})")
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # A port another server holds must fail here, not be shared with it (the master checked
        # the port was free before starting the front ends that share it).
        ("grpc.so_reuseport", 1 if share_port else 0),
    ]
    if COMPRESSION_LEVELS[compression_level]:
        options.append(("grpc.default_compression_level", COMPRESSION_LEVELS[compression_level]))
    options += keepalive_args(keepalive or {})
    target = f"{_bracket(address)}:{port}"
    server = GrpcServer(Servicer(host), target, tuple(options), max(1, max_workers),
                        restrictions, credentials)
    if not server.port:
        server._server.destroy()
        raise OSError(f"failed to start the gRPC server: cannot bind {target} "
                      "(address in use or not available)")
    server._start()
    log.info("gRPC server listening on %s:%d", _bracket(address), server.port)
    return server
