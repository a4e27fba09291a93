"""ModelStreamInfer: any number of requests on one bidirectional stream, answered concurrently.

The transport (`host.grpc.server`) takes each request message as it arrives: `admit` gives it
its place (in arrival order), then the transport asks for the next message and `run`s this one,
which decodes it and submits it to the host (`Host.submit`). The transport runs it on the
polling thread that read it, as it runs unary calls: while one request holds its thread (a slow
model), the next messages of the stream are taken by other polling threads, so the requests of
a stream proceed concurrently, and a fast one costs no hand-off between threads. Responses come
back through each request's callback, from whatever thread the model answers on, and go to the
transport's writer (`send`, non-blocking; `finish` once everything was answered).

As Triton's stream handler (server repo, src/grpc/stream_infer_handler.cc):
- every response carries the parameter `triton_final_response` (true on a request's last one);
- a decoupled model's flags-only final response goes out as an empty response (id, model name
  and version, `triton_final_response: true`) only when the request set
  `triton_enable_empty_final_response: true`;
- the responses of non-decoupled requests go out in the order the requests came (a decoupled
  model's responses go out as they come); a non-decoupled model that sends several responses
  for one request has its first one sent;
- an error for one request is an `error_message` with that request's id; the stream stays open;
  except when the client opened the stream with the header `triton_grpc_error: true`: then the
  first error response of a request ends the stream with that error's gRPC status and message,
  and nothing more goes out on it (a request that cannot be submitted, e.g. to an unknown model,
  is still answered with an `error_message`, as in Triton);
- when the stream ends early (the client cancelled it or went away), every request of the
  stream still in flight is cancelled.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Protocol

from host.errors import HostError, InternalError
from host.grpc import codec
from host.grpc.status import status_code
from host.inference import InferenceRequest, InferenceResponse, ResponseCallback
from host.parameters import EMPTY_FINAL_RESPONSE

log = logging.getLogger("host.grpc")


class Writer(Protocol):
    def send(self, message: Any) -> None:
        """Queue one ModelStreamInferResponse; never blocks, keeps the order of calls."""

    def finish(self) -> None:
        """Every request was answered and no more will come: end the call (status OK)."""

    def fail(self, code: int, details: str) -> None:
        """End the call with an error status (after what was queued); later sends are dropped."""


class _Slot:
    """The place of a non-decoupled request in the stream's response order."""

    __slots__ = ("message", "ready")

    def __init__(self) -> None:
        self.message: Any = None
        self.ready = False


class _Turn:
    """One sequence request's turn to be submitted: done once it was. Most requests are read
    and submitted by one thread, in order, so nobody waits: the event exists only when another
    thread has to wait for this turn (made and set under the stream's lock)."""

    __slots__ = ("done", "event")

    def __init__(self) -> None:
        self.done = False
        self.event: threading.Event | None = None

    def wait(self, lock: threading.Lock) -> None:
        if self.done:
            return
        with lock:
            if self.done:
                return
            if self.event is None:
                self.event = threading.Event()
            event = self.event
        event.wait()

    def finish(self, lock: threading.Lock) -> None:
        with lock:
            self.done = True
            event = self.event
        if event is not None:
            event.set()


class Ticket:
    """An admitted request: its place in the response order (if it has one) and its kind.

    A request to a sequence model also waits for the previous such request of the stream to be
    submitted (`after`) and then lets the next one go (`submitted`): the requests of a sequence
    must reach the sequence batcher in the order they came (its submit only queues them)."""

    __slots__ = ("slot", "decoupled", "after", "submitted")

    def __init__(self, slot: _Slot | None, decoupled: bool,
                 after: _Turn | None = None, submitted: _Turn | None = None) -> None:
        self.slot = slot
        self.decoupled = decoupled
        self.after, self.submitted = after, submitted


class Stream:
    def __init__(self, host: Any, writer: Writer, forward: Any = None) -> None:
        self.host = host
        self.writer = writer
        self.forward = forward  # host.headers.HeaderForwarder, or None
        self._lock = threading.Lock()
        self._inflight: dict[int, InferenceRequest] = {}  # by id(): requests are not hashable
        self._pending = 0  # requests admitted and not finished yet
        self._reading = True
        self._closed = False
        self._order: collections.deque[_Slot] = collections.deque()
        self._last_sequenced: _Turn | None = None  # see Ticket
        # Triton's triton_grpc_error mode: the first error response ends the stream.
        self._error_ends = any(key == "triton_grpc_error" and value == "true"
                               for key, value in getattr(writer, "metadata", ()) or ())

    # --- from the transport --------------------------------------------------------------------
    def admit(self, msg: Any) -> Ticket | None:
        """A request message arrived: give it its place. None: the stream is over, drop it."""
        decoupled, sequenced = self._kind(msg)
        with self._lock:
            if self._closed:
                return None
            self._pending += 1
            slot = None
            if not decoupled:
                slot = _Slot()
                self._order.append(slot)
            after = submitted = None
            if sequenced:
                after, submitted = self._last_sequenced, _Turn()
                self._last_sequenced = submitted
        return Ticket(slot, decoupled, after, submitted)

    def run(self, msg: Any, ticket: Ticket, decoded: InferenceRequest | Exception) -> None:
        """Submit an admitted request to the host; errors go out on the stream. `decoded`: the
        request, or the error decoding it raised (codec.read_stream_request)."""
        slot = ticket.slot
        request = None
        if ticket.after is not None:
            ticket.after.wait(self._lock)
        try:
            if isinstance(decoded, Exception):
                raise decoded
            request = decoded
            if self.forward is not None:
                self.forward.apply(request, getattr(self.writer, "metadata", ()))
            empty_final = request.parameters.get(EMPTY_FINAL_RESPONSE) is True
            callback = self._callback(request, msg, slot, ticket.decoupled, empty_final)
            with self._lock:
                self._inflight[id(request)] = request
                if self._closed:
                    request.cancel()
            self.host.submit(request, callback)
        except Exception as exc:  # noqa: BLE001 - answered on the stream, the stream goes on
            if request is not None:
                with self._lock:
                    self._inflight.pop(id(request), None)
            if not isinstance(exc, HostError):
                log.exception("gRPC stream request '%s' failed", msg.id)
                exc = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            self._emit(slot, codec.stream_error(exc.message, msg.id))
            self._finished()
        finally:
            if ticket.submitted is not None:
                ticket.submitted.finish(self._lock)

    def request_error(self, message: str) -> None:
        """A message of the stream could not be read as a request."""
        self.writer.send(codec.stream_error(message, ""))

    def end_of_requests(self) -> None:
        """The client closed its side: finish once the requests in flight are answered."""
        with self._lock:
            self._reading = False
            done = self._pending == 0
        if done:
            self.writer.finish()

    def cancel(self) -> None:
        """The call ended early (cancelled, deadline, client gone): cancel what still runs."""
        with self._lock:
            self._closed = True
            self._reading = False
            running = list(self._inflight.values())
        for request in running:
            request.cancel()
        if running:
            log.info("gRPC stream ended with %d request(s) in flight: cancelled them", len(running))

    # --- helpers -------------------------------------------------------------------------------
    def _kind(self, msg: Any) -> tuple[bool, bool]:
        """(decoupled, sequence model) of the model the request names."""
        try:
            config = self.host.model_config(msg.model_name, msg.model_version)
        except HostError:
            return False, False  # the error is reported when the request is submitted, in order
        return (config.model_transaction_policy.decoupled,
                config.WhichOneof("scheduling_choice") == "sequence_batching")

    def _callback(self, request: InferenceRequest, msg: Any, slot: _Slot | None, decoupled: bool,
                  empty_final: bool) -> ResponseCallback:
        rid, model, version = msg.id, msg.model_name, msg.model_version
        answered = False

        def on_response(response: InferenceResponse | None, final: bool) -> None:
            nonlocal answered
            out = None
            if response is not None:
                answered = True
                if response.error is None:
                    try:
                        out = codec.stream_response(response, final, rid)
                    except Exception as exc:  # noqa: BLE001 - the request's error, not the stream's
                        if not isinstance(exc, HostError):
                            log.exception("encoding a response of request '%s' failed", rid)
                        out = codec.stream_error(getattr(exc, "message", str(exc)), rid, model,
                                                 version, final)
                else:
                    if self._error_ends:
                        self._end_with(response.error)
                    out = codec.stream_error(response.error.message, rid, model, version, final)
            elif final:
                if decoupled:
                    if empty_final:
                        out = codec.stream_empty_final(rid, model, version)
                elif not answered:
                    out = codec.stream_error(f"model '{model}' sent no response for the request",
                                             rid, model, version, True)
            if out is not None or final:
                self._emit(slot, out, final)
            if final:
                with self._lock:
                    self._inflight.pop(id(request), None)
                self._finished()

        return on_response

    def _end_with(self, error: HostError) -> None:
        """triton_grpc_error mode: end the call with the error's status; cancel what still runs."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._inflight.values())
        self.writer.fail(status_code(error.code).value[0], error.message)
        for request in running:
            request.cancel()

    def _emit(self, slot: _Slot | None, message: Any, final: bool = True) -> None:
        if slot is None:
            if message is not None:
                self.writer.send(message)
            return
        with self._lock:  # held while sending, so the slots go out in their order
            if message is not None and slot.message is None:
                # A non-decoupled model that sends several responses: the first one goes out,
                # as Triton's stream handler keeps it (its response queue holds one).
                slot.message = message
            if not final:
                return
            slot.ready = True
            order = self._order
            while order and order[0].ready:
                head = order.popleft()
                if head.message is not None:
                    self.writer.send(head.message)

    def _finished(self) -> None:
        with self._lock:
            self._pending -= 1
            done = not self._reading and self._pending == 0 and not self._closed
        if done:
            self.writer.finish()
