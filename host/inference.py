"""Protocol-neutral inference types: tensors, requests, responses.

The front ends decode their wire format into these and encode responses from them; the core,
the schedulers and the backends see nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

if TYPE_CHECKING:
    from host.errors import HostError

# Response flags (TRITONSERVER_ResponseCompleteFlag): the final response of a request.
FINAL = 1


@dataclass
class Tensor:
    """A named tensor; `data` is a numpy array (an object array of `bytes` for BYTES)."""

    name: str
    datatype: str
    shape: list[int]
    # np.ndarray as a rule; None for a tensor in shared memory; a device array (CUDA) on the way out.
    data: Any
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


# Called once per response; `final` is True on the last one of a request.
ResponseCallback = Callable[["InferenceResponse | None", bool], None]


@dataclass(init=False)  # __init__ below: the dataclass's sets all ~35 fields per request
class InferenceRequest:
    model_name: str
    model_version: int = -1  # -1: the policy's default (highest ready) version
    id: str = ""
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # the model's own, once interpreted
    # Triton's reserved parameters, moved out of `parameters` by host.parameters.interpret.
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    priority: int = 0
    timeout_us: int = 0
    enable_empty_final_response: bool = False
    # Filled in by the host before the request reaches a scheduler.
    callback: ResponseCallback | None = None
    batch_size: int = 1  # rows: the first dimension when the model batches, else 1
    enqueue_ns: int = 0
    exec_start_ns: int = 0
    completed: bool = False  # set once the final response went out
    cancelled: bool = False  # a plain flag: set once, read by schedulers and models
    # Shared memory: the front end sets `uses_shm` when a tensor names a region (its data is then
    # None until the host binds it); `shm_outputs` maps output names to (region, offset, size).
    uses_shm: bool = False
    # Inputs whose data does not fill their shape, found while decoding: name -> error, raised by
    # the request's checks in Triton's core order (host.validation.RequestRules.check).
    data_errors: dict[str, Exception] | None = None
    shm_outputs: dict[str, tuple[Any, int, int]] | None = None
    # A `host.trace.Trace` when this request was sampled for tracing, else None.
    trace: Any = None
    # Front-end activities (HTTP_RECV_*, GRPC_WAITREAD_*) stamped before the request reached the
    # host, by a front end that adds its send activities once it answered (Trace.frontend_done):
    # a sampled request is then written only after both (Triton writes a trace on its release).
    frontend_trace: list[tuple[str, int]] | None = None
    first_response_seen: bool = False  # for the first-response histogram (host.latency)
    # The request's W3C trace context headers (traceparent, tracestate), taken by the front end
    # only in OpenTelemetry trace mode (host.headers).
    trace_context: dict[str, str] | None = None
    shm_regions: list[Any] | None = None  # acquired by the host, released after the final response
    # The front end that decoded the request ("http" or "grpc"): the few rules Triton words or
    # applies differently per protocol (host.parameters, host.classification) look at it.
    protocol: str = ""
    # Classification extension: k by output name (host.classification), set by the host.
    classification: dict[str, int] | None = None
    # HTTP raw binary request: the one input's raw bytes, its name and shape still to be
    # deduced from the model configuration (host.raw_input).
    raw_input: bool = False
    # Implicit state of the request's sequence (host.sequence.state.SequenceStates), set by the
    # sequence batcher for the execute: native backends update it through TRITONBACKEND_State*.
    sequence_states: Any = None
    # A BLS request: the instances its callers hold while they wait for it (host.bls).
    held: tuple[Any, ...] = ()
    # Refused by its scheduler when submitted (a sequence without START, a full queue): answered
    # with the error, but not counted in the model's statistics, as Triton counts only requests
    # its schedulers took (host.stages).
    refused: bool = False
    # Iterative sequences (host.sequence.batcher): the batcher that takes this request back when
    # its backend releases it with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, and whether it did.
    rescheduler: Any = None
    rescheduled: bool = False
    # A native backend took a response factory for this request: it may answer after its
    # execute returned, as Triton lets any backend do (host.native fails the request if the
    # backend lets go of it unanswered).
    factory_held: bool = False
    # The sequence batcher's padding row (a batch slot without a request, READY false): a
    # backend may skip building its response, which goes nowhere (host.sequence.batcher).
    padding: ClassVar[bool] = False

    def __init__(self, model_name: str, model_version: int = -1, id: str = "",
                 inputs: dict[str, Tensor] | None = None, outputs: list[RequestedOutput] | None = None,
                 parameters: dict[str, Any] | None = None, protocol: str = "", **others: Any) -> None:
        """The dataclass's signature (every field by keyword), but only the fields given are
        stored: the others read their defaults from the class until something sets them (a
        request is made for every call, and for every ensemble step)."""
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs = {} if inputs is None else inputs
        self.outputs = [] if outputs is None else outputs
        self.parameters = {} if parameters is None else parameters
        if protocol:  # (every front end names itself: a parameter, not **others, is cheaper)
            self.protocol = protocol
        if others:
            known = _REQUEST_FIELDS
            for name, value in others.items():
                if name not in known:
                    raise TypeError(f"InferenceRequest() got an unexpected keyword argument '{name}'")
                setattr(self, name, value)

    @property
    def requested_output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def reschedule(self) -> str:
        """The backend released this request to run again (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
        "" once it is queued again, else Triton's reason why it cannot be."""
        if self.rescheduler is None:
            return ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the "
                    "model is not configured to handle such a flag.")
        return self.rescheduler.reschedule(self)

    def cancel(self) -> None:
        self.cancelled = True

    def is_cancelled(self) -> bool:
        return self.cancelled

    def respond(self, response: InferenceResponse | None, final: bool = True) -> None:
        """Send one response for this request (the sender API backends use)."""
        assert self.callback is not None, "request was not submitted through the host"
        self.callback(response, final)


_REQUEST_FIELDS = frozenset(f.name for f in fields(InferenceRequest))


def drain(request: InferenceRequest, responses: Any) -> Iterator[InferenceResponse]:
    """Yield the responses a callback put on `responses` (a queue of (response, final)) until
    the final one; a caller that stops early cancels the request."""
    finished = False
    try:
        while not finished:
            response, finished = responses.get()
            if response is not None:
                yield response
    finally:
        if not finished:
            request.cancel()


@dataclass
class InferenceResponse:
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    error: HostError | None = None

    def output(self, name: str) -> Tensor | None:
        for t in self.outputs:
            if t.name == name:
                return t
        return None
