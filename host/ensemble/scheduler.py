"""Running an ensemble request: its steps as a graph of requests the host sends to itself.

Each step is a request to a composing model that goes through the host's own stages (admit,
cache lookup, schedule, respond: `StepRunner.submit`, which is `Host._submit`), so the composing
models validate, cache and count it as they would a client's request. Tensors pass between steps
as the same numpy arrays, renamed: nothing is copied.

A step runs as soon as all its inputs are ready. The thread that submits the ensemble request
runs the steps one after the other while they form a chain (no hand-off between threads, which
is what keeps a step cheap); when several steps become ready at once, or a response arrives on
another thread (a dynamic batcher, a decoupled model still running), the extra steps go to a
thread pool so independent branches run concurrently.

Decoupled steps: every response of a decoupled step is a new value of its output tensors. Each
value carries a key, the tuple of response indexes along its decoupled lineage (`()` for the
ensemble inputs); a step runs once per key for which all its inputs have a value, so fan-out
followed by fan-in pairs the right responses. The load-time check (`host.ensemble.plan`) makes
sure a step never reads two lineages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from host.errors import (
    CancelledError,
    HostError,
    InternalError,
    InvalidArgumentError,
    error_for,
)
from host.inference import InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from host.ensemble.plan import Plan, Pruned, Step
    from host.inference import ResponseCallback
    from host.model import ModelVersion

log = logging.getLogger(__name__)

Key = tuple  # a value's place in the decoupled lineage: () or (i,) or (i, j) ...
_ALL: frozenset[str] = frozenset()  # no output named: all of them


class StepRunner(Protocol):
    """What an ensemble needs from the host (`host.ensemble.runtime.EnsembleRuntime`)."""

    pool: ThreadPoolExecutor

    def get(self, name: str, version: int) -> ModelVersion: ...

    def submit(self, mv: ModelVersion, request: InferenceRequest, callback: ResponseCallback) -> None: ...


@dataclass(eq=False)
class StepRequest(InferenceRequest):
    """A step's request: cancelled whenever the ensemble request is."""

    parent: InferenceRequest | None = None

    def is_cancelled(self) -> bool:
        return self.cancelled or (self.parent is not None and self.parent.is_cancelled())


class _Drivers(threading.local):
    """Per thread: the ensemble runs this thread is driving, each with its queue of steps."""

    def __init__(self) -> None:
        self.queues: dict[_Run, deque] = {}


_drivers = _Drivers()


# How long a step waits for a slot under `max_inflight_requests` before it goes ahead anyway
# (Triton's kMutexTimeoutSeconds), and how often a waiting step looks for a cancellation.
LIMIT_WAIT_S = 300.0
_CANCEL_POLL_S = 0.1


class StepLimiter:
    """`ensemble_scheduling.max_inflight_requests` for one step (Triton's
    StepInflightRequestLimiter): at most `limit` requests of that step in flight at once, over
    all the ensemble's requests. A step waits for a slot (so a decoupled producer faster than its
    consumer is held back) unless its ensemble request is cancelled; after LIMIT_WAIT_S it goes
    ahead, as Triton does, rather than deadlock."""

    __slots__ = ("cond", "count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0
        self.cond = threading.Condition()

    def acquire(self, request: InferenceRequest, ensemble: str, step: int) -> None:
        with self.cond:
            if self.count >= self.limit:
                deadline = time.monotonic() + LIMIT_WAIT_S
                while self.count >= self.limit and not request.is_cancelled():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.error("[Internal Error] Ensemble '%s' unable to schedule step %d "
                                  "(inflight: %d >= limit: %d) for %d seconds. Proceeding to "
                                  "avoid deadlock.", ensemble, step, self.count, self.limit,
                                  LIMIT_WAIT_S)
                        break
                    self.cond.wait(min(left, _CANCEL_POLL_S))
            self.count += 1

    def release(self) -> None:
        with self.cond:
            if self.count == 0:
                log.error("[Internal Error] step inflight request limiter underflow")
                return
            self.count -= 1
            self.cond.notify()


class EnsembleScheduler:
    def __init__(self, mv: ModelVersion, plan: Plan, runner: StepRunner) -> None:
        self.mv, self.plan, self.runner = mv, plan, runner
        limit = mv.config.ensemble_scheduling.max_inflight_requests
        self.limiters: list[StepLimiter] | None = None
        if limit > 0:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d",
                     plan.name, limit)  # Triton's line (its QA looks for it)
            self.limiters = [StepLimiter(limit) for _ in plan.steps]
        # Every field of a step request at its default; a run sets those it takes from the
        # ensemble request, a step its model, inputs and outputs (all mutable defaults replaced).
        self.defaults = dict(StepRequest(model_name="").__dict__)

    def submit(self, request: InferenceRequest) -> None:
        requested = frozenset(o.name for o in request.outputs) if request.outputs else _ALL
        _Run(self, request, self.plan.pruned(requested)).start()

    def stop(self) -> None:
        """Nothing runs on threads of its own (the pool is the runtime's)."""


class _Run:
    """One ensemble request in flight."""

    __slots__ = (
        "done",
        "error",
        "inflight",
        "lock",
        "plan",
        "pruned",
        "refs",
        "request",
        "result",
        "sched",
        "started_ns",
        "template",
        "values",
    )

    def __init__(self, sched: EnsembleScheduler, request: InferenceRequest, pruned: Pruned) -> None:
        self.sched, self.plan, self.pruned, self.request = sched, sched.plan, pruned, request
        self.values: dict[tuple[str, Key], tuple[Tensor | None, bool]] = {}  # -> (tensor, batched)
        self.refs: dict[tuple[str, Key], int] = {}  # readers left before a value is dropped
        self.inflight = 0
        self.error: HostError | None = None
        self.result: InferenceResponse | None = None
        self.lock = threading.Lock()
        self.started_ns = 0
        self.done = False
        self.template: dict[str, Any] | None = None  # the step requests' common fields

    # --- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        request, plan = self.request, self.plan
        self.started_ns = request.exec_start_ns = time.perf_counter_ns()
        batched = plan.batching
        for name, tensor in request.inputs.items():
            self._store(name, (), tensor, batched)
        if plan.optional_inputs:
            for name in plan.optional_inputs - request.inputs.keys():
                self._store(name, (), None, batched)  # absent: the step omits that input
        first = [(s, ()) for s in self.pruned.first]
        self.inflight = len(first)
        if not first:  # host.config makes this unreachable; fail rather than hang
            self.error = InternalError(f"in ensemble '{plan.name}', no step can run")
            self._finish()
            return
        self._drive(first)

    def _store(self, tensor: str, key: Key, value: Tensor | None, batched: bool) -> None:
        readers = self.pruned.readers.get(tensor)
        if readers:
            self.values[(tensor, key)] = (value, batched)
            self.refs[(tensor, key)] = readers

    def _take(self, tensor: str, key: Key) -> tuple[Tensor | None, bool]:
        slot = (tensor, key)
        value = self.values[slot]
        left = self.refs[slot] - 1
        if left:
            self.refs[slot] = left
        else:
            del self.values[slot], self.refs[slot]
        return value

    # --- driving ----------------------------------------------------------------------------------
    def _drive(self, ready: list[tuple[Step, Key]]) -> None:
        """Run `ready` steps on this thread, and those their responses make ready on this thread;
        extras that are ready together go to the pool, so that branches run concurrently."""
        todo = deque(ready)
        queues = _drivers.queues
        outer = queues.get(self)
        queues[self] = todo
        try:
            while todo:
                step, key = todo.popleft()
                while todo:
                    self.sched.runner.pool.submit(self._drive, [todo.pop()])
                self._run_step(step, key)
        finally:
            if outer is None:
                del queues[self]
            else:
                queues[self] = outer

    def _run_step(self, step: Step, key: Key) -> None:
        parent = self.request
        try:
            if parent.is_cancelled():
                raise CancelledError("request was cancelled")
            with self.lock:
                inputs = self._step_inputs(step, key)
            mv = self.sched.runner.get(step.model_name, step.model_version)
            request = self._new_request()
            request.model_name, request.model_version = step.model_name, mv.version
            request.inputs, request.outputs = inputs, step.requested
            callback = _StepCallback(self, step, key)
            limiters = self.sched.limiters
            if limiters is not None:
                limiter = limiters[step.index]
                limiter.acquire(parent, self.plan.name, step.index)
                callback.limiter = limiter  # released with the step's final response
            try:
                self.sched.runner.submit(mv, request, callback)
            except BaseException:
                callback.release()
                raise
        except HostError as exc:
            self._step_response(step, key, 0, InferenceResponse(error=exc), True)
        except Exception as exc:  # never leave the ensemble request without its final response
            log.exception("ensemble '%s' failed to run step '%s'", self.plan.name, step.model_name)
            self._step_response(step, key, 0, InferenceResponse(error=InternalError(str(exc))), True)

    def _new_request(self) -> StepRequest:
        """A step request with the ensemble request's id, parameters, priority, timeout and
        sequence fields, and the instances its BLS callers hold; the fields are copied from one
        template per run (cheaper than the dataclass constructor, which runs once per run instead
        of once per step)."""
        template = self.template
        if template is None:
            parent = self.request
            template = self.template = dict(self.sched.defaults)
            template.update(
                id=parent.id, parameters=parent.parameters, sequence_id=parent.sequence_id,
                sequence_start=parent.sequence_start, sequence_end=parent.sequence_end,
                priority=parent.priority, timeout_us=parent.timeout_us, parent=parent,
                held=parent.held)  # a BLS caller's instances (host.bls)
        request = object.__new__(StepRequest)
        request.__dict__.update(template)
        return request

    def _step_inputs(self, step: Step, key: Key) -> dict[str, Tensor]:
        inputs = {}
        for model_input, tensor in step.inputs:
            value, batched = self._take(tensor, key)
            if value is not None:
                shape = _reshape(step.input_dims[model_input], step.batching, batched, value.shape)
                inputs[model_input] = value if value.name == model_input and shape is value.shape \
                    else Tensor(model_input, value.datatype, shape, value.data)
        return inputs

    # --- responses ------------------------------------------------------------------------------
    def _step_response(self, step: Step, key: Key, index: int, response: InferenceResponse | None,
                       final: bool) -> None:
        ready: list[tuple[Step, Key]] = []
        emit: InferenceResponse | None = None
        with self.lock:
            if final:
                self.inflight -= 1
            if response is not None:
                if response.error is not None:
                    if self.error is None:
                        self.error = _step_error(self.plan.name, step, response.error)
                elif self.error is None:
                    emit = self._consume(step, key + (index,) if step.decoupled else key,
                                         response, ready)
            if self.error is None:
                self.inflight += len(ready)
            else:
                ready = []
            finished = self.inflight == 0 and not self.done
            if finished:
                self.done = True
            if emit is not None and (finished or not self.plan.decoupled):
                # The last response carries the final flag (Triton's FinishEnsemble): a client
                # of a decoupled ensemble that does not ask for empty final responses still
                # learns that the request is complete.
                self.result, emit = emit, None
            # Send under the lock, so that a decoupled ensemble's responses keep their order.
            if emit is not None:
                self.request.respond(emit, False)
        if ready:
            todo = _drivers.queues.get(self) if final else None
            if todo is not None:
                todo.extend(ready)  # this thread runs them once the step's call returns
            else:
                pool = self.sched.runner.pool
                for item in ready:
                    pool.submit(self._drive, [item])
        if finished:
            self._finish()

    def _consume(self, step: Step, key: Key, response: InferenceResponse,
                 ready: list[tuple[Step, Key]]) -> InferenceResponse | None:
        """Store a step's outputs; collect the steps they make ready; return an ensemble
        response if every requested output now has a value for `key`."""
        pruned, values = self.pruned, self.values
        produced = response.outputs
        for model_output, tensor in step.outputs:
            # A missing output is stored as an absent value (the next step omits that input).
            value = None
            for t in produced:
                if t.name == model_output:
                    value = t
                    break
            self._store(tensor, key, value, step.batching)
        for s, reads in pruned.next_steps[step.index]:
            for read in reads:
                if (read, key) not in values:
                    break
            else:
                ready.append((s, key))
        if not pruned.writes_output[step.index]:
            return None
        outputs = pruned.ordered_outputs
        for name in outputs:
            if (name, key) not in values:
                return None
        plan, tensors = self.plan, []
        for name in outputs:
            value, batched = self._take(name, key)
            if value is None:
                log.debug("Composing models did not output tensor %s", name)  # Triton's text
                continue
            shape = value.shape if batched == plan.batching else \
                _reshape(plan.output_dims[name], plan.batching, batched, value.shape)
            tensors.append(value if value.name == name and shape is value.shape
                           else Tensor(name, value.datatype, shape, value.data, value.parameters))
        # As Triton's, an ensemble response names the sequence fields its steps ran with.
        request = self.request
        return InferenceResponse(outputs=tensors, parameters={
            "sequence_id": request.sequence_id, "sequence_start": request.sequence_start,
            "sequence_end": request.sequence_end})

    def _finish(self) -> None:
        request, plan, mv = self.request, self.plan, self.sched.mv
        now = time.perf_counter_ns()
        if self.error is None and not plan.decoupled and self.result is None:
            self.error = InvalidArgumentError(
                f"in ensemble '{plan.name}', unexpected deadlock, at least one output is not set "
                "while no more ensemble steps can be made")
        if self.error is None:
            # The ensemble's own execution (Triton counts one per request): the whole graph.
            mv.stats.execution_done(1, request.batch_size, now - self.started_ns)
        self.values.clear()
        if self.error is not None:
            request.respond(InferenceResponse(error=self.error), True)
        else:
            # A decoupled ensemble's last response, or None (flags only) when its last step
            # produced no response.
            request.respond(self.result, True)
            mv.stats.output_done(1, request.batch_size, time.perf_counter_ns() - now)


class _StepCallback:
    """A step request's callback; counts the responses of a decoupled step."""

    __slots__ = ("index", "key", "limiter", "run", "step")

    def __init__(self, run: _Run, step: Step, key: Key) -> None:
        self.run, self.step, self.key, self.index = run, step, key, 0
        self.limiter: StepLimiter | None = None  # the step's slot under max_inflight_requests

    def release(self) -> None:
        limiter, self.limiter = self.limiter, None
        if limiter is not None:
            limiter.release()

    def __call__(self, response: InferenceResponse | None, final: bool) -> None:
        index = self.index
        if response is not None and response.error is None:
            self.index += 1
        if final and self.limiter is not None:
            self.release()  # before the next steps are scheduled, as Triton
        self.run._step_response(self.step, self.key, index, response, final)
        if final:
            self.run = None  # type: ignore[assignment]  # free the run with the request


def _step_error(ensemble: str, step: Step, error: HostError) -> HostError:
    """The step's error, its code kept, prefixed with the ensemble's name exactly as Triton does
    (clients match the step's message after it: "in ensemble 'E', <message>")."""
    return error_for(error.code, f"in ensemble '{ensemble}', {error.message}")


def _reshape(dims: tuple[int, ...], batching: bool, batched: bool, shape: list[int]) -> list[int]:
    """Triton's ReshapeTensorDims: pass a tensor between a batching and a non-batching model by
    adding or removing a batch dimension of 1 where the shapes call for it."""
    if batching == batched:
        return shape
    if batching:
        return [1, *shape] if _matches(dims, shape) else shape
    if not _matches(dims, shape) and shape and shape[0] == 1:
        return shape[1:]
    return shape


def _matches(dims: tuple[int, ...], shape: Any) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))
