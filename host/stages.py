"""The stages every request to a model version passes, built once per loaded version.

    admit ──> cache ──> schedule ──> (the model) ──> respond
      │         └─ hit: respond, nothing scheduled
      └─ refused: raised to the caller, the request never started

- admit: the checks every request passes whatever its front end (raw binary input, shared-memory
  binding, reserved parameters, requested outputs, the model's rules); nothing is counted yet.
- cache: the request starts (counted in flight, timed, traced), then the response cache is looked
  up; a hit is answered through the respond stage and nothing is scheduled.
- schedule: the model version's scheduler takes the request; a failure to schedule fails it.
- respond: runs for every response the model sends (`Respond`, the request's callback): the cache
  insert, names, output reshape and filter, classification, shared-memory writes, and on the final
  response the request's completion (statistics, shared-memory regions, in-flight count). It
  completes a request exactly once: a response after the final one is dropped with a warning.

`Stages` holds what does not change between requests of one version (its names, statistics,
rules, scheduler, the host's cache and shared-memory manager), so the per-request work is the
stage functions and one small `Respond` object.
"""

from __future__ import annotations

import logging
import time
from _thread import RLock as _RLock  # threading.RLock is a Python function around it
from typing import TYPE_CHECKING, Any

from host import classification, parameters, raw_input, shm
from host.errors import HostError, InternalError
from host.inference import InferenceRequest, InferenceResponse, ResponseCallback

if TYPE_CHECKING:
    from host.cache.service import Probe
    from host.core import Host
    from host.model import ModelVersion

log = logging.getLogger(__name__)


class Stages:
    """The request stages of one model version (see the module docstring)."""

    __slots__ = ("host", "mv", "name", "version", "stats", "latency", "reshape", "shm", "cache")

    def __init__(self, host: Host, mv: ModelVersion) -> None:
        self.host, self.mv = host, mv
        self.name, self.version, self.stats = mv.name, str(mv.version), mv.stats
        self.latency = mv.stats.latency  # host.latency: None unless --metrics-config asks for it
        self.reshape = mv.rules.reshape_outputs if mv.rules.output_reshapes else None
        self.shm = host.shm
        self.cache = host.cache

    @staticmethod
    def of(host: Host, mv: ModelVersion) -> Stages:
        """The version's stages, made on its first request (two threads may both make them:
        they are equal, and either is kept)."""
        stages = mv.stages
        if stages is None:
            stages = mv.stages = Stages(host, mv)
        return stages

    # --- the whole path ------------------------------------------------------------------------
    def run(self, request: InferenceRequest, callback: ResponseCallback) -> None:
        """Admit, look up, schedule on this thread; `callback` gets every response."""
        try:  # `start`, inlined: this runs for every request
            self.admit(request)
            hit = self.lookup(request, callback)
        except BaseException:
            if request.shm_regions:  # refused before it ran: its regions are free again
                shm.release_request(request, self.shm)
            raise
        if hit is not None:
            request.respond(hit, True)  # from the response cache: nothing is scheduled
        else:
            self.schedule(request)

    def start(self, request: InferenceRequest, callback: ResponseCallback) -> InferenceResponse | None:
        """The admit and cache stages. Returns the cached response on a hit: the caller sends it
        through `request.respond` instead of scheduling the request."""
        try:
            self.admit(request)
            return self.lookup(request, callback)
        except BaseException:
            if request.shm_regions:  # refused before it ran: its regions are free again
                shm.release_request(request, self.shm)
            raise

    # --- admit ---------------------------------------------------------------------------------
    def admit(self, request: InferenceRequest) -> None:
        """The checks every request passes before it is scheduled, whatever its front end."""
        mv = self.mv
        if request.raw_input:
            raw_input.resolve(request, mv.config)
        if request.uses_shm:
            shm.bind_request(request, self.shm, mv.name)
        if request.parameters:  # most requests carry none, nor ask for outputs by name
            parameters.interpret(request)
        if request.outputs:
            parameters.check_outputs(request)
        mv.rules.check(request)

    # --- cache ---------------------------------------------------------------------------------
    def lookup(self, request: InferenceRequest, callback: ResponseCallback) -> InferenceResponse | None:
        """Start the request (in flight, its respond stage, its start time, its trace), then look
        it up in the response cache."""
        self.mv.begin_request()
        respond = Respond(self, request, callback)
        request.callback = respond
        request.enqueue_ns = time.perf_counter_ns()
        host = self.host
        if host.tracing:  # the only cost of tracing while no setting can sample
            host.tracer.begin(self.mv, request)
        # The one place the request path touches the response cache; after the request's start
        # time, so that its duration includes the lookup (as Triton's does).
        if self.cache is not None:
            probe = self.cache.probe(self.mv, request)
            if probe is not None:
                if probe.hit is not None:
                    return probe.hit
                respond.probe = probe
        return None

    # --- schedule ------------------------------------------------------------------------------
    def schedule(self, request: InferenceRequest) -> None:
        try:
            self.mv.scheduler.submit(request)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - whatever it is, it fails this request only
            if not isinstance(exc, Exception):
                log.error("model '%s': %s while scheduling a request", self.name, type(exc).__name__)
            if not request.completed:
                request.refused = not request.exec_start_ns  # it never reached an execute
                err = exc if isinstance(exc, HostError) else InternalError(
                    f"{type(exc).__name__}: {exc}" if not isinstance(exc, Exception) else str(exc))
                request.respond(InferenceResponse(error=err), True)


class Respond:
    """The respond stage of one request: its callback, called once per response."""

    __slots__ = ("stages", "request", "callback", "probe", "wanted", "error", "lock")

    def __init__(self, stages: Stages, request: InferenceRequest, callback: ResponseCallback) -> None:
        self.stages, self.request, self.callback = stages, request, callback
        # Completion is a test-and-set under this lock: a scheduler failing the request and a
        # backend thread answering it at the same moment deliver one final response, not two.
        self.lock = _RLock()
        self.probe: Probe | None = None  # the response-cache lookup (host.cache.service)
        outputs = request.outputs
        self.wanted = {o.name for o in outputs} if outputs else None  # None: every output
        self.error: HostError | None = None

    def __call__(self, response: InferenceResponse | None, final: bool) -> None:
        # One function, not three: this runs for every response (its parts are commented).
        with self.lock:
            request, st = self.request, self.stages
            if request.completed:
                log.warning("model '%s' sent a response after the final one; dropped", st.name)
                return
            if self.probe is not None and final:
                self.probe.finish(response)  # stores a success with every output, before the filter
            if response is not None:
                # names, reshape, output filter, classification, shared-memory writes
                latency = st.latency
                if latency is not None and latency.first_response is not None:
                    _first_response(request, latency)
                response.model_name, response.model_version, response.id = st.name, st.version, request.id
                if st.reshape is not None and response.error is None:
                    st.reshape(response)  # an output that cannot take its dims makes it an error
                if response.error is not None:
                    self.error = response.error
                else:
                    wanted = self.wanted
                    if wanted is not None:
                        response.outputs = [t for t in response.outputs if t.name in wanted]
                    try:
                        classes = request.classification
                        if classes is not None:
                            mv = st.mv
                            response.outputs = [
                                classification.apply(t, classes[t.name], mv.batching, mv.labels.get(t.name))
                                if t.name in classes else t for t in response.outputs]
                        if request.shm_outputs is not None:
                            shm.write_outputs(response, request.shm_outputs)
                    except HostError as exc:
                        self.error = exc
                        response = InferenceResponse(st.name, st.version, request.id, error=exc)
            if final:
                # the request is complete, exactly once
                request.completed = True
                if request.shm_regions:
                    shm.release_request(request, st.shm)
                if not request.refused:
                    now = time.perf_counter_ns()
                    started = request.exec_start_ns
                    error = self.error
                    # (a python model's error response counts as a success, as in Triton)
                    st.stats.request_done(error is None or hasattr(error, "counted_as_success"),
                                          now - request.enqueue_ns,
                                          (started or now) - request.enqueue_ns,
                                          request.batch_size if started else 0, self.error)
                st.mv.end_request()
                # The request refers to this object and this object to the request: break the cycle
                # so reference counting frees both, instead of a garbage collection pause.
                request.callback = _after_final
            self.callback(response, final)


def _first_response(request: InferenceRequest, latency: Any) -> None:
    # nv_inference_first_response_histogram_ms: observed once per request (a decoupled model's
    # later responses are not).
    if not request.first_response_seen:
        request.first_response_seen = True
        latency.responded(time.perf_counter_ns() - request.enqueue_ns)


def _after_final(response: InferenceResponse | None, final: bool) -> None:
    log.warning("a response was sent after the final response of its request; dropped")
