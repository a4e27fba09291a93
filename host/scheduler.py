"""Schedulers: how requests reach a model's instances.

Both schedulers keep Triton's two guarantees: an instance never runs two executes at once, and
different instances of a model run in parallel.

- `DirectScheduler` (no dynamic batching): the caller's own thread takes a free instance, runs
  execute with its one request and gives the instance back: no hand-off between threads, which is
  what makes a request at low concurrency cheap.
- `DynamicBatcher`: one thread per instance takes requests from a shared queue and combines those
  of several clients into one execute, up to max_batch_size rows: as Triton's GetDynamicBatch,
  the largest preferred batch size the queued requests can form runs at once, else it waits at
  most max_queue_delay_microseconds (from the oldest request). It alone decides which requests may
  share an execute: in order of arrival, and, for a backend that needs it, only requests whose
  `compatible` keys agree (`host.batch.shape_key`: equal shapes, `allow_ragged_batch` honoured);
  a batch ends at the first request that does not fit, as in Triton. A model's custom batching
  strategy (host.batch_strategy) is asked about each request as it arrives; a request it does not
  include ends the batch, which is then sent without waiting out the queue delay.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Sequence

from host import affinity, bls, supervise
from host.backend import Instance
from host.errors import CancelledError, HostError, InternalError
from host.inference import InferenceRequest, InferenceResponse, ResponseCallback
from host.queue_policy import RequestQueue, timeout_expired

_UNREPORTED = Instance.reported_statistics  # the base class's: the host times the execute

if TYPE_CHECKING:
    from host.backend import BatchStrategy, InstanceSpec
    from host.model import ModelVersion
    from host.proto.model_config_pb2 import ModelDynamicBatching

log = logging.getLogger(__name__)


class InstanceSlot:
    def __init__(self, spec: InstanceSpec, instance: Instance) -> None:
        self.spec, self.instance = spec, instance


class _Deferral(threading.local):
    """A front end's event loop that takes every event that is ready before it runs what they
    asked for (host.grpc.server's pollers): `runs` is what waits for the end of that round
    (None: this thread has no such loop); `armed` is set while such a loop submits a request it
    does not wait for (Host.infer_async). A scheduler that would run a batch on the submitting
    thread defers it to the end of the round instead, so that requests which arrived together
    share one execute: the sequence batcher's direct strategy would otherwise run each request
    alone, with a padding row for every other slot below it."""

    runs: dict | None = None
    armed = False


_deferral = _Deferral()


def open_deferral() -> dict:
    """Called once by an event-loop thread: its runs, to be run with `run_deferred`."""
    _deferral.runs = {}
    return _deferral.runs


def defer(key: object, run: Callable[[], None]) -> bool:
    """Run `run` at the end of this thread's round of events (once per key); False when the
    request being submitted is not one its thread may defer (the caller then runs it now)."""
    if not _deferral.armed:
        return False
    _deferral.runs[key] = run  # type: ignore[index]  # armed only where runs is a dict
    return True


def run_deferred(runs: dict) -> None:
    while runs:
        pending = list(runs.values())
        runs.clear()
        for run in pending:
            try:
                run()
            except BaseException:  # noqa: BLE001 - one failed run must not lose the others
                log.exception("a deferred batch failed")


def run_deferred_now() -> None:
    """Before this thread does something that may wait (model control): what it deferred."""
    if _deferral.runs:
        run_deferred(_deferral.runs)


def submit_deferrable(run: Callable[[InferenceRequest, ResponseCallback], None],
                      request: InferenceRequest, callback: ResponseCallback) -> None:
    """`run(request, callback)`, letting a scheduler defer its execute when this thread is an
    event loop that does not wait for the answer."""
    if _deferral.runs is None:
        run(request, callback)
        return
    _deferral.armed = True
    try:
        run(request, callback)
    finally:
        _deferral.armed = False


def execute_batch(model: ModelVersion, slot: InstanceSlot, requests: Sequence[InferenceRequest],
                  padding: int = 0) -> None:
    runs = _deferral.runs
    if runs is not None:  # what the model does (a BLS call that waits) is never deferred
        armed, _deferral.runs, _deferral.armed = _deferral.armed, None, False
        try:
            _execute_batch(model, slot, requests, padding)
        finally:
            _deferral.runs, _deferral.armed = runs, armed
    else:
        _execute_batch(model, slot, requests, padding)


def _execute_batch(model: ModelVersion, slot: InstanceSlot, requests: Sequence[InferenceRequest],
                   padding: int = 0) -> None:
    """Run one execute and make sure every request of a non-decoupled model gets its response.

    Statistics: compute_input is up to the `execute` call, compute_infer the call, compute_output
    the handing out of the responses (see host.stats). `padding`: how many of the requests are the
    sequence batcher's padding (counted in the batch size, not as requests, as in Triton)."""
    start = time.perf_counter_ns()
    rows = 0
    chained = False  # a BLS request run here from another thread brings its callers' chain
    for r in requests:
        r.exec_start_ns = start
        rows += r.batch_size
        if r.held:
            chained = True
    if model.tracing:  # a response sent from inside execute waits for the compute stamps
        for r in requests:
            if r.trace is not None:
                r.trace.executing = True
    chain = _chain(requests) if chained else bls.HELD.get()
    held = bls.HELD.set(chain + (slot,))  # for BLS calls made by this execute
    called = time.perf_counter_ns()
    failure: BaseException | None = None
    # if the process dies now, the log names it (no call without a supervisor's board)
    executing = supervise.executing(model.name) if supervise.board is not None else -1
    # A long execute (the last one was, or this is the first) may use every CPU (host.affinity).
    widened = model.wide_execute and affinity.widen()
    limiter = model.rate_limiter  # --rate-limit=execution_count: wait for the resources, and turn
    if limiter is not None:
        limiter.acquire(slot)
    try:
        responses = slot.instance.execute(requests)
    except BaseException as exc:  # noqa: BLE001 - even SystemExit: the failure of these requests only
        responses, failure = None, exc
    finally:
        if limiter is not None:  # staged again at once when more requests wait (Triton's order)
            limiter.release(slot, again=model.pending_requests() > 0)
        if widened:
            affinity.pin()
        if executing >= 0:
            supervise.done(executing)
        bls.HELD.reset(held)
    returned = time.perf_counter_ns()
    infer_ns, input_ns = returned - called, called - start
    model.wide_execute = infer_ns >= affinity.LONG_EXECUTE_NS  # a short one stays: moving costs more
    if model.tracing:  # a sampled request may be in this batch (host.trace)
        for r in requests:
            if r.trace is not None:
                r.trace.compute(start, called, returned)
    # A backend's own figures win (native backends); getattr: duck-typed instances may lack it.
    # Instances that keep the base class's method (None: the host times it) are not called.
    report = getattr(slot.instance, "reported_statistics", None)
    reported = report() if report is not None and \
        getattr(report, "__func__", None) is not _UNREPORTED else None
    if reported is not None:
        input_ns, infer_ns = reported[0], reported[1]
    counted = len(requests) - padding
    model.stats.execution_done(counted, rows, infer_ns, input_ns)
    handing = time.perf_counter_ns()
    if failure is not None:
        err = failure if isinstance(failure, HostError) else InternalError(
            f"{type(failure).__name__}: {failure}" if not isinstance(failure, Exception)
            else str(failure) or type(failure).__name__)
        if not isinstance(failure, HostError):
            log.error("model '%s' execute failed", model.name, exc_info=failure)
        _fail(requests, err)
    elif responses is not None:
        if len(responses) != len(requests):
            _fail(requests, InternalError(
                f"model '{model.name}' returned {len(responses)} responses for "
                f"{len(requests)} requests"))
        else:
            for request, response in zip(requests, responses):
                if not request.completed:
                    request.respond(response, True)
    if not model.decoupled:
        for r in requests:  # a loop, not all() over a generator: this runs for every execute
            if not (r.completed or r.rescheduled or r.factory_held):
                # Not those run again (iterative sequences), nor those a native backend may
                # still answer through its response factory.
                _fail([r for r in requests if not r.rescheduled and not r.factory_held],
                      InternalError(f"model '{model.name}' sent no response for the request"))
                break
    model.stats.output_done(counted, rows,
                            reported[2] if reported is not None else time.perf_counter_ns() - handing)


def _chain(requests: Sequence[InferenceRequest]) -> tuple:
    """The instances held by the callers of these requests (host.bls): this thread's own chain,
    plus that of each BLS request run here from another thread (a batcher's, a pool's)."""
    chain = bls.HELD.get()
    for r in requests:
        held = r.held
        if held:
            chain = chain + tuple(s for s in held if s not in chain)
    return chain


def _fail(requests: Sequence[InferenceRequest], err: HostError) -> None:
    for r in requests:
        if not r.completed:
            r.respond(InferenceResponse(error=err), True)


def _run_reentrant(model: ModelVersion, slots: list[InstanceSlot], request: InferenceRequest) -> bool:
    """A BLS request whose callers hold every instance of `model` runs now, on the innermost
    caller's instance, instead of waiting for an instance that cannot come free (host.bls)."""
    slot = bls.reentrant_slot(slots, request.held)
    if slot is None:
        return False
    execute_batch(model, slot, [request])
    return True


def delay_count(variable: str) -> int:
    """Triton's scheduler testing hooks (TRITONSERVER_DELAY_SCHEDULER,
    TRITONSERVER_BACKLOG_DELAY_SCHEDULER): a batcher forms no batch until that many requests are
    queued, so that a test sees a known batch. 0 (off) unless the variable holds a count."""
    try:
        return max(int(os.environ.get(variable, "0")), 0)
    except ValueError:
        return 0


class DirectScheduler:
    queues = False  # runs each request on the submitting thread (host.frontend.engine)

    def __init__(self, model: ModelVersion, slots: list[InstanceSlot]) -> None:
        self.model = model
        self._instances = list(slots)  # for BLS calls whose callers hold them all (host.bls)
        self._free: queue.SimpleQueue[InstanceSlot] = queue.SimpleQueue()
        self._slots = len(slots)
        for slot in slots:
            self._free.put(slot)
        # Instances an update removes (update): taken out of the free queue as they come back.
        self._retiring: set[InstanceSlot] = set()
        self._collected: set[InstanceSlot] = set()
        self._retire_cond = threading.Condition()

    def submit(self, request: InferenceRequest) -> None:
        if request.held and _run_reentrant(self.model, self._instances, request):
            return
        try:  # `_take`'s common case inlined: an instance is free (this runs for every request)
            slot: InstanceSlot | None = self._free.get_nowait()
            if self._retiring and slot in self._retiring:
                self._collect(slot)
                slot = self._take(request)
        except queue.Empty:
            slot = self._take(request)
        if slot is None:
            return
        try:
            if request.cancelled:
                _fail([request], CancelledError("request was cancelled"))
            elif _deferral.runs is None:  # `execute_batch`, without its call
                _execute_batch(self.model, slot, [request])
            else:
                execute_batch(self.model, slot, [request])
        finally:
            self._free.put(slot)

    def _take(self, request: InferenceRequest) -> InstanceSlot | None:
        slot: InstanceSlot | None
        while True:
            try:
                slot = self._free.get_nowait()
            except queue.Empty:
                slot = self._wait_for_instance(request)
                if slot is None:
                    return None
            if not self._retiring or slot not in self._retiring:
                return slot
            self._collect(slot)

    def _collect(self, slot: InstanceSlot) -> None:
        with self._retire_cond:
            self._collected.add(slot)
            self._retire_cond.notify_all()

    def _wait_for_instance(self, request: InferenceRequest) -> InstanceSlot | None:
        """Every instance is busy: wait, but leave when the client gives up (cancel, deadline),
        so that an instance stuck in execute does not collect the caller threads for ever."""
        while True:
            try:
                return self._free.get(timeout=0.25)
            except queue.Empty:
                if request.is_cancelled():
                    _fail([request], CancelledError("request was cancelled"))
                    return None

    def update(self, added: list[InstanceSlot], removed: list[InstanceSlot],
               retire: Callable[[InstanceSlot], None]) -> None:
        """An in-place update of the model's instances (host.model): the added ones serve at
        once; each removed one is handed to `retire` once its execute in flight is over."""
        for slot in added:
            self._free.put(slot)
        self._instances = [s for s in self._instances if s not in removed] + list(added)
        self._slots += len(added) - len(removed)
        if not removed:
            return
        gone = set(removed)
        with self._retire_cond:
            self._retiring |= gone
        while True:
            with self._retire_cond:
                if gone <= self._collected:
                    break
            try:  # an idle one waits in the free queue: take it out (others go back)
                slot = self._free.get(timeout=0.05)
            except queue.Empty:
                continue
            if slot in gone:
                self._collect(slot)
            else:
                self._free.put(slot)
        with self._retire_cond:
            self._retiring -= gone
            self._collected -= gone
        for slot in removed:
            retire(slot)

    def pending(self) -> int:
        """Requests waiting for a free instance (nv_inference_pending_request_count): those in
        flight beyond the instances busy with one (counted at scrape time, not per request)."""
        busy = self._slots - self._free.qsize()
        return max(0, self.model.inflight - busy)

    def stop(self) -> None:
        """Nothing runs on its own threads."""


class DynamicBatcher:
    queues = True  # submitting only queues: its own threads execute (host.frontend.engine)

    def __init__(self, model: ModelVersion, slots: list[InstanceSlot], max_batch_size: int,
                 preferred: Sequence[int], max_delay_us: int,
                 queue_config: ModelDynamicBatching | None = None,
                 compatible: Callable[[InferenceRequest], tuple] | None = None,
                 strategy: BatchStrategy | None = None) -> None:
        self.model = model
        self._compatible = compatible  # requests whose keys differ never share an execute
        # preserve_ordering: responses leave in the order the requests were taken (_Ordered)
        self._ordered = _Ordered() if queue_config is not None and getattr(
            queue_config, "preserve_ordering", False) and len(slots) > 1 else None
        self._strategy = strategy  # Triton's custom batching strategy (host.batch_strategy)
        self._forming: _Forming | None = None  # the batch the strategy is asked about (lock held)
        self._instances = list(slots)  # for BLS calls whose callers hold them all (host.bls)
        self.max_batch = max(max_batch_size, 1)
        # Waiting for more requests is only worth it until the largest preferred size is reached.
        self.target = max([p for p in preferred if p <= self.max_batch], default=self.max_batch)
        self._preferred = frozenset(p for p in preferred if p <= self.max_batch)
        self.max_delay_ns = max_delay_us * 1000
        # Triton's testing hook: hold batches until this many requests are queued (once).
        self._delay_count = delay_count("TRITONSERVER_DELAY_SCHEDULER")
        # Priority levels, queue sizes and timeouts as Triton's (host.queue_policy).
        self._queue = RequestQueue(queue_config)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._reaper_cond = threading.Condition(lock)  # wakes the timeout reaper only
        self._stopping = False
        self._retiring: set[InstanceSlot] = set()  # their threads end (update)
        self._by_slot = {slot: threading.Thread(target=self._run, args=(slot,), daemon=True,
                                                name=f"batcher-{slot.spec.name}") for slot in slots}
        self._threads = list(self._by_slot.values())
        if self._queue.has_timeouts:
            # Expired requests are rejected on time even while every instance is busy.
            self._threads.append(threading.Thread(target=self._reap, daemon=True,
                                                  name=f"batcher-timeouts-{model.name}"))
        log.debug("Starting dynamic-batcher thread for %s at nice 0...", model.name)  # Triton's line
        for t in self._threads:
            t.start()

    def submit(self, request: InferenceRequest) -> None:
        if request.held and _run_reentrant(self.model, self._instances, request):
            return
        with self._cond:
            self._queue.append(request)  # UNAVAILABLE when its queue is full: the request fails
            self._cond.notify()
            if self._queue.has_timeouts:
                self._reaper_cond.notify()

    def _reap(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                deadline = self._queue.next_deadline()
                wait = max(deadline - time.perf_counter_ns(), 0) / 1e9 + 0.0005 if deadline else None
                self._reaper_cond.wait(wait)
                rejected = self._queue.expire()
                self._cond.notify_all()  # what is left may make a batch now (or delayed ones moved)
            _fail(rejected, timeout_expired())

    def update(self, added: list[InstanceSlot], removed: list[InstanceSlot],
               retire: Callable[[InstanceSlot], None]) -> None:
        """An in-place update of the model's instances (host.model): a thread starts for each
        added one; the thread of each removed one ends after its batch in flight, and the
        instance is handed to `retire`."""
        with self._cond:
            self._instances = [s for s in self._instances if s not in removed] + list(added)
            self._retiring.update(removed)
            self._cond.notify_all()
        for slot in added:
            thread = self._by_slot[slot] = threading.Thread(
                target=self._run, args=(slot,), daemon=True, name=f"batcher-{slot.spec.name}")
            self._threads.append(thread)
            thread.start()
        for slot in removed:
            thread = self._by_slot.pop(slot)
            thread.join()
            self._threads.remove(thread)
            with self._cond:
                self._retiring.discard(slot)
            retire(slot)

    def _run(self, slot: InstanceSlot) -> None:
        affinity.pin()  # it hands the GIL to the front end's threads: same CPU (host.affinity)
        while True:
            batch = self._next_batch(slot)
            if batch is None:
                return
            try:
                live = [r for r in batch if not r.is_cancelled()]
                _fail([r for r in batch if r.is_cancelled()], CancelledError("request was cancelled"))
                if live:
                    execute_batch(self.model, slot, live)
            except BaseException as exc:  # noqa: BLE001 - the batch fails, the batcher goes on
                log.error("model '%s': batch failed", self.model.name, exc_info=exc)
                _fail(batch, InternalError(f"{type(exc).__name__}: {exc}"))

    def _next_batch(self, slot: InstanceSlot) -> list[InferenceRequest] | None:
        rejected: list[InferenceRequest] = []
        try:
            with self._cond:
                queue = self._queue
                while True:
                    if self._retiring and slot in self._retiring:
                        self._cond.notify()  # a wake-up meant for a thread that serves
                        return None
                    if queue and not (self._delay_count and len(queue) < self._delay_count
                                      and not self._stopping):
                        break
                    if self._stopping:
                        return None
                    self._cond.wait(0.01 if self._delay_count else None)
                self._delay_count = 0
                take = 0  # >0: the requests from the front that make a preferred batch size
                while not self._stopping:
                    # As Triton's GetDynamicBatch: a preferred batch size that can be formed
                    # now is executed at once, unless the oldest request waited its delay out.
                    rejected += queue.expire()
                    if not queue:
                        return []
                    remaining = queue.oldest_enqueue_ns() + self.max_delay_ns - time.perf_counter_ns()
                    exceeded = self.max_delay_ns > 0 and remaining <= 0
                    take = 0 if exceeded else self._preferred_prefix()
                    if take or exceeded or remaining <= 0 or not self._may_grow(queue):
                        break
                    if self._strategy is not None and self._evaluate(queue).stop is not None:
                        break  # the custom strategy closed the batch: sent now, as Triton does
                    self._cond.wait(remaining / 1e9)
                rejected += queue.expire()
                batch = self._take(queue, take) if self._strategy is None else self._take_custom(queue)
                if self._ordered is not None:
                    for r in batch:
                        self._ordered.add(r)
                if queue:
                    self._cond.notify()  # let an idle instance start on what is left
                return batch
        finally:
            _fail(rejected, timeout_expired())  # outside the lock

    def _preferred_prefix(self) -> int:
        """Triton's walk of the queue (dynamic_batch_scheduler.cc, GetDynamicBatch): how many
        requests from the front make the largest preferred batch size found before the batch
        would pass max_batch_size, or make the batch that the next request would push past the
        largest preferred size; 0 when there is neither (or no preferred sizes)."""
        if not self._preferred:
            return 0
        rows = count = best = 0
        key = self._compatible
        first = None
        for request in self._queue:
            size = max(1, request.batch_size)
            if count:
                if rows + size > self.target and not best:
                    best = count
                if rows + size > self.max_batch:
                    break
                if key is not None and key(request) != first:
                    break
            elif key is not None:
                first = key(request)
            rows += size
            count += 1
            if rows in self._preferred:
                best = count
        return best

    def _take(self, queue: RequestQueue, take: int = 0) -> list[InferenceRequest]:
        """The next batch, from the front of the queue (lock held, queue not empty): `take`
        requests when a preferred batch size was found (`_preferred_prefix`), else as many as fit."""
        batch: list[InferenceRequest] = []
        rows = 0
        key = self._compatible
        first = None
        while queue and (not take or len(batch) < take):
            front = queue.front()
            assert front is not None
            if batch and rows + front.batch_size > self.max_batch:
                break
            if key is not None:
                if not batch:
                    first = key(front)
                elif key(front) != first:
                    break  # a request of another shape starts the next batch
            r = queue.popleft()
            rows += r.batch_size
            batch.append(r)
        return batch

    def _evaluate(self, queue: RequestQueue) -> _Forming:
        """Ask the strategy about the requests that arrived since the last call (Triton's dynamic
        batcher does so as requests arrive): the batch it forms ends at the first request that
        does not fit it (rows, shapes) or that the strategy does not include; the first request
        of a batch joins it whatever the strategy answers (Triton would ask again for ever). When
        the front of the queue changed (another instance took requests, timeouts, a request of a
        higher priority), the batch is formed again: ModelBatchFinalize, ModelBatchInitialize."""
        strategy = self._strategy
        assert strategy is not None
        forming = self._forming
        items = iter(queue)
        if forming is not None:
            checked = forming.included if forming.stop is None else forming.included + [forming.stop]
            if all(next(items, None) is r for r in checked):
                if forming.stop is not None:
                    return forming
            else:
                self._forming = None
                strategy.end(forming.userp)
                forming = None
        if forming is None:
            forming = self._forming = _Forming(strategy.begin())
            items = iter(queue)
        key = self._compatible
        for request in items:
            if forming.included:
                if forming.rows + request.batch_size > self.max_batch or (
                        key is not None and key(request) != forming.key):
                    forming.stop = request
                    break
            elif key is not None:
                forming.key = key(request)
            if not strategy.include(forming.userp, request) and forming.included:
                forming.stop = request
                break
            forming.included.append(request)
            forming.rows += request.batch_size
        return forming

    def _take_custom(self, queue: RequestQueue) -> list[InferenceRequest]:
        """`_take` with a custom batching strategy: the batch `_evaluate` formed."""
        strategy = self._strategy
        assert strategy is not None
        forming = self._evaluate(queue)
        self._forming = None
        try:
            return [queue.popleft() for _ in forming.included]  # the front of the queue
        finally:
            strategy.end(forming.userp)

    def _may_grow(self, queue: RequestQueue) -> bool:
        """Whether the batch at the front of the queue is worth waiting for: it is below the
        target size and every queued request could join it. As in Triton, a pending batch is sent
        at once when the next request cannot join it (another shape, other optional inputs)."""
        key = self._compatible
        if key is None:
            return queue.rows < self.target
        rows = 0
        first = None
        for request in queue:
            if first is None:
                first = key(request)
            elif key(request) != first:
                return False
            rows += request.batch_size
            if rows >= self.target:
                return False
        return True

    def pending(self) -> int:
        """Requests queued and not yet taken into a batch (nv_inference_pending_request_count)."""
        return len(self._queue)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._reaper_cond.notify_all()
        for t in self._threads:
            t.join()
        if self._forming is not None and self._strategy is not None:
            self._strategy.end(self._forming.userp)
            self._forming = None


class _Ordered:
    """preserve_ordering with several instances (Triton's dynamic batcher keeps a completion
    queue): each request's responses wait until every request taken before it has sent its
    final response; the oldest unfinished request's responses go out as they come."""

    __slots__ = ("_lock", "_queue")

    def __init__(self) -> None:
        # Held while delivering, so that two instances finishing together cannot interleave.
        self._lock = threading.RLock()
        self._queue: deque[_OrderedEntry] = deque()

    def add(self, request: InferenceRequest) -> None:
        entry = _OrderedEntry(request)
        with self._lock:
            self._queue.append(entry)

        def hold(response: InferenceResponse | None, final: bool) -> None:
            with self._lock:
                if entry.done:
                    return  # after its final response: dropped, as the front end would
                entry.held.append((response, final))
                if final:  # answered, while its response may wait (execute_batch checks this)
                    entry.done = request.completed = True
                queue = self._queue
                while queue:
                    head = queue[0]
                    held, head.held = head.held, []
                    for item in held:
                        if item[1]:
                            head.request.completed = False  # the front end completes it now
                        head.callback(*item)
                    if not head.done:
                        break
                    queue.popleft()

        request.callback = hold


class _OrderedEntry:
    __slots__ = ("request", "callback", "held", "done")

    def __init__(self, request: InferenceRequest) -> None:
        assert request.callback is not None
        self.request, self.callback = request, request.callback
        self.held: list[tuple[InferenceResponse | None, bool]] = []
        self.done = False


class _Forming:
    """A batch being formed with a custom batching strategy: its user pointer, the requests
    included so far and their rows, the first request's shape key, and the request that ended it."""

    __slots__ = ("userp", "included", "rows", "key", "stop")

    def __init__(self, userp: int) -> None:
        self.userp = userp
        self.included: list[InferenceRequest] = []
        self.rows = 0
        self.key: tuple | None = None
        self.stop: InferenceRequest | None = None
