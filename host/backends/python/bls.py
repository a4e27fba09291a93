"""BLS for python models: `pb_utils.InferenceRequest(...).exec()` / `async_exec()` and model
control (`is_model_ready`, `load_model`, `unload_model`), sent to the host in this process.

A call becomes a host request (`host.bls`): inputs are the model's numpy arrays and outputs
come back as the callee's arrays, both without a copy. Errors reach the model the way Triton's
python backend reports them: as an error response (`has_error()`), with Triton's texts.
"""

from __future__ import annotations

import asyncio
import json
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterator

from host import bls
from host.errors import Code, HostError, InternalError
from host.inference import InferenceRequest as HostRequest
from host.inference import InferenceResponse as HostResponse
from host.inference import RequestedOutput
from host.inference import Tensor as HostTensor

if TYPE_CHECKING:
    from host.backends.python import pb_utils as pb

# async_exec runs the call on one of these threads (as Triton's stub uses the loop's default
# executor): a callee that runs in place must not block the caller's event loop. Generous, so
# that calls waiting for busy instances do not starve the others of threads.
_executor = ThreadPoolExecutor(max_workers=256, thread_name_prefix="bls")
# Where calls go when not to a host in this process (a process-mode stub sends them to the
# server): (call, decoupled) -> what `_start` returns.
starter: Any = None


def _pb() -> Any:
    from host.backends.python import pb_utils
    return pb_utils


def _error_response(message: str, code: int | None = None) -> pb.InferenceResponse:
    pb = _pb()
    return pb.InferenceResponse(error=pb.TritonError(message, pb.TritonError.INTERNAL if code is None
                                                     else code))


def _failed(model: str, message: str) -> pb.InferenceResponse:
    """Triton's wrapping of an error found before the request reached the model."""
    return _error_response(f"Model {model} - Error when running inference: {message}")


def _host_request(call: pb.InferenceRequest) -> HostRequest:
    pb = _pb()
    inputs = {}
    for t in call._inputs:
        if not isinstance(t, pb.Tensor):
            raise pb.TritonModelException(
                f"InferenceRequest inputs must be pb_utils.Tensor objects, found type {type(t)}")
        data = t._array if t._datatype != "BYTES" else pb._as_bytes_object_array(t._array)
        inputs[t._name] = HostTensor(t._name, t._datatype, list(data.shape), data)
    flags = int(call._flags)
    params = json.loads(call._parameters) if call._parameters not in ("", "{}") else {}
    return HostRequest(
        model_name=call._model_name, model_version=int(call._model_version), id=call._request_id,
        inputs=inputs, outputs=[RequestedOutput(n) for n in call._requested_output_names],
        parameters=params, sequence_id=call._correlation_id,
        sequence_start=bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
        sequence_end=bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
        timeout_us=int(call._timeout), held=bls.HELD.get())


def _model_response(response: HostResponse | None) -> pb.InferenceResponse:
    """The host's response as the calling model sees it: the callee's arrays, not copies."""
    pb = _pb()
    if response is None:  # a decoupled callee's final flag without data
        return pb.InferenceResponse()
    if response.error is not None:
        return _error_response(response.error.message, _code(response.error))
    out = pb.InferenceResponse()
    out._output_tensors = [pb.Tensor._wrap(t.name, t.datatype, t.data) for t in response.outputs]
    if response.parameters:
        out._parameters = json.dumps(response.parameters, default=str)
    return out


def _code(error: HostError) -> int:
    pb = _pb()
    try:
        return int(pb._ErrorCode[Code(error.code).name])
    except (KeyError, ValueError):
        return int(pb._ErrorCode.INTERNAL)


class _Call:
    """One BLS call in flight: the host's (response, final) pairs land in a queue the caller reads."""

    def __init__(self, request: HostRequest) -> None:
        self.request = request
        self.responses: queue.SimpleQueue = queue.SimpleQueue()

    def on_response(self, response: HostResponse | None, final: bool) -> None:
        self.responses.put((response, final))


def _start(call: pb.InferenceRequest, decoupled: bool) -> Any:
    """Send the call: a `_Call` (its responses come on `.responses`, `.request.cancel()` stops
    it), or an error response if it cannot be sent. In a process-mode stub the call travels to
    the server process instead (host.backends.python.stub sets `starter`)."""
    if starter is not None:
        return starter(call, decoupled)
    return start(call._model_name, int(call._model_version), lambda: _host_request(call), decoupled)


def start(name: str, version: int, make_request: Any, decoupled: bool
          ) -> _Call | pb.InferenceResponse:
    """Submit a BLS request for `name` to the host in this process; an error response if it
    cannot be sent. `make_request()` builds the host request once the model is known."""
    try:
        host = bls.server()
    except HostError:  # no server in this process: every model is unknown
        return _failed(name, f"Request for unknown model: '{name}' is not found")
    try:
        mv = host.manager.get(name, version)
    except HostError as exc:
        # Current Triton: TRITONSERVER_ServerModelIsReady fails with the core's lookup error
        # ("Request for unknown model: 'm' is not found"); 2.51 said "Failed for execute the
        # inference request. Model 'm' is not ready." instead.
        return _failed(name, exc.message)
    if mv.decoupled and not decoupled:
        return _failed(name, (
            f"Model {name} is using the decoupled. The current BLS request call doesn't support "
            "models using the decoupled transaction policy. Please use 'decoupled=True' argument "
            "to the 'exec' or 'async_exec' calls for decoupled models.'"))
    pending = _Call(make_request())
    if decoupled and not getattr(mv.scheduler, "queues", False):
        # This scheduler runs the callee on the submitting thread: its whole execute would run
        # before exec() returns, so the caller could neither read its responses as they come
        # nor cancel it (Triton's callee runs on its own thread). Submit from a pool thread.
        _executor.submit(_submit_detached, host, pending)
        return pending
    try:
        host.submit(pending.request, pending.on_response)
    except HostError as exc:
        return _failed(name, exc.message)
    return pending


def _submit_detached(host: Any, pending: _Call) -> None:
    """`host.submit` on a pool thread; a refusal becomes the call's one (final) response."""
    try:
        host.submit(pending.request, pending.on_response)
    except Exception as exc:  # noqa: BLE001 - the caller waits on the queue: it must hear of it
        message = exc.message if isinstance(exc, HostError) else str(exc)
        pending.on_response(HostResponse(error=InternalError(
            f"Model {pending.request.model_name} - Error when running inference: {message}")), True)


def execute(call: pb.InferenceRequest, decoupled: bool = False) -> Any:
    """`exec()`: the response (or, decoupled, an iterator over every response)."""
    started = _start(call, decoupled)
    if isinstance(started, _pb().InferenceResponse):  # refused: an error response
        return ResponseIterator.of([started]) if decoupled else started
    if decoupled:
        return ResponseIterator(started)
    last: HostResponse | None = None
    final = False
    while not final:
        response, final = started.responses.get()
        if response is not None:
            last = response
    if last is None:
        return _error_response("Unexpected empty response.")
    return _model_response(last)


async def execute_async(call: pb.InferenceRequest, decoupled: bool = False) -> Any:
    """`await async_exec()`: as `exec`, without blocking the model's event loop."""
    held = bls.HELD.get()  # the caller's instances: the executor thread must know them

    def run() -> Any:
        token = bls.HELD.set(held)
        try:
            result = execute(call, decoupled)
            if isinstance(result, ResponseIterator):
                # As Triton's: the iterator comes once the first response is there, so the
                # caller's event loop never waits for it in the loop's own thread.
                result._prefetch()
            return result
        finally:
            bls.HELD.reset(token)  # pool threads are reused

    return await asyncio.get_running_loop().run_in_executor(_executor, run)


class ResponseIterator:
    """The responses of a decoupled BLS call, in order; the last one carries the final flag (it
    may have no outputs). Iterating again after the end replays the responses, as Triton does."""

    def __init__(self, call: _Call | None) -> None:
        self._call = call
        self._seen: list[pb.InferenceResponse] = []
        self._index = 0
        self._done = call is None

    @classmethod
    def of(cls, responses: list[pb.InferenceResponse]) -> ResponseIterator:
        it = cls(None)
        it._seen = list(responses)
        return it

    def __iter__(self) -> Iterator[pb.InferenceResponse]:
        if self._done and self._index >= len(self._seen):
            self._index = 0
        return self

    def __next__(self) -> pb.InferenceResponse:
        if self._index < len(self._seen):
            self._index += 1
            return self._seen[self._index - 1]
        if self._done:
            raise StopIteration
        assert self._call is not None
        response, final = self._call.responses.get()
        self._done = final
        self._seen.append(_model_response(response))
        self._index += 1
        return self._seen[-1]

    def _prefetch(self) -> None:
        """Wait here for the next response and keep it for `__next__`."""
        if not self._done and self._index >= len(self._seen):
            assert self._call is not None
            response, final = self._call.responses.get()
            self._done = final
            self._seen.append(_model_response(response))

    def cancel(self) -> None:
        """Ask the callee to stop (it sees `is_cancelled()`); its remaining responses still come."""
        if self._call is not None and not self._done:
            self._call.request.cancel()
