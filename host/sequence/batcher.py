"""The sequence batcher: stateful models (`sequence_batching`), after Triton's.

A sequence is the run of requests that share a correlation id (`sequence_id`), from the one
flagged START to the one flagged END. The batcher

- gives each new sequence a batch slot of one instance, and every request of the sequence goes
  to that slot, in order: at most one request of a sequence is in an execute at a time. When
  every slot is taken, a new sequence waits in the backlog (oldest first) until a slot frees,
  or until a request `timeout` of it runs out (the whole sequence is then rejected, as in Triton);
- runs one thread per instance that forms batches from the requests waiting in its slots:
  - `direct`: slot i is row i of the batch, so a model can keep state per row; a slot below the
    highest busy one that has no request gets a padding request whose READY control is false
    (its response is dropped). A batch waits up to `max_queue_delay_microseconds` for
    `minimum_slot_utilization` of the slots to have a request;
  - `oldest`: `max_candidate_sequences` slots per instance; a batch takes the oldest waiting
    request of each sequence, up to `max_batch_size`, and waits up to
    `max_queue_delay_microseconds` for the largest `preferred_batch_size`;
  when no delay is configured and the instance is idle, the thread that submits a request runs
  that batch itself (the hand-over to the worker thread and back costs more than a small model's
  execute); requests that arrive during an execute are the worker thread's to batch;
- fills in the control inputs (`host.sequence.controls`) and the implicit state
  (`host.sequence.state`) of each request just before its execute;
- releases a slot at END, and the slot of a sequence idle for longer than
  `max_sequence_idle_microseconds` (a client that went away): that sequence is then forgotten,
  and a request that continues it fails as one that never started.

Requests are checked with Triton's messages before they queue: the correlation id's type against
the CORRID control, batch size 1, a non-zero id, and START on the first request of a sequence.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from host import affinity
from host.errors import CancelledError, InternalError, InvalidArgumentError, UnavailableError
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.scheduler import InstanceSlot, defer, delay_count, execute_batch
from host.sequence.controls import Controls, in_sequence
from host.sequence.state import SequenceStates, StateSpecs

if TYPE_CHECKING:
    from host.model import ModelVersion

log = logging.getLogger(__name__)

_MAX_ZERO_SHAPES = 64  # padding zeros kept per batcher (input name, datatype, shape)


class _Sequence:
    __slots__ = ("id", "slot", "queue", "last_ns", "expired", "corrid", "expires_ns")

    def __init__(self, sequence_id: int | str, corrid: Tensor | None) -> None:
        self.id = sequence_id
        self.corrid = corrid  # the CORRID control tensor, the same for every request
        self.slot: _Slot | None = None
        self.queue: collections.deque[InferenceRequest] = collections.deque()
        self.last_ns = 0
        self.expired = False  # idle too long: released once its queue is empty
        # In the backlog: when the earliest `timeout` of its requests runs out (0: none). The
        # whole sequence is then rejected, as Triton rejects an expired backlog queue.
        self.expires_ns = 0


def _head(slot: _Slot) -> _Sequence:
    """The sequence of a busy slot."""
    sequence = slot.sequence
    assert sequence is not None
    return sequence


class _Slot:
    __slots__ = ("worker", "index", "sequence", "states")

    def __init__(self, worker: _Worker, index: int, states: SequenceStates | None) -> None:
        self.worker, self.index = worker, index
        self.sequence: _Sequence | None = None
        self.states = states  # implicit state of the sequence in this slot


class _PaddingRequest(InferenceRequest):
    """A batch slot without a request (direct strategy): its responses go nowhere."""

    padding = True

    def respond(self, response: InferenceResponse | None, final: bool = True) -> None:
        if final:
            self.completed = True


class _Worker:
    def __init__(self, batcher: SequenceBatcher, instance: InstanceSlot, slots: int,
                 states: StateSpecs) -> None:
        self.batcher, self.instance = batcher, instance
        self.cond = threading.Condition(batcher.lock)
        self.slots = [_Slot(self, i, states.new() if states else None) for i in range(slots)]
        # An execute on this instance is under way (by the worker thread or by a submitting
        # thread, see SequenceBatcher.submit): the other waits. Read and set with the lock.
        self.running = False
        self.retired = False  # an update removed the instance: it ends once its slots are free
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"sequence-{instance.spec.name}")

    def busy(self) -> list[_Slot]:
        return [s for s in self.slots if s.sequence is not None and s.sequence.queue]

    def _run(self) -> None:
        batcher = self.batcher
        affinity.pin()  # it hands the GIL to the front end's threads: same CPU (host.affinity)
        while True:
            with self.cond:
                batch = batcher._next_batch(self)
                if batch is None:
                    break
                self.running = True
            self.run_batch(*batch)
        if self.retired:
            batcher._retired(self)

    def run_batch(self, requests: list[InferenceRequest], padding: int) -> None:
        """Execute a batch taken (with the lock) by whichever thread set `running`; then let the
        worker thread see what arrived meanwhile."""
        try:
            self._execute(requests, padding)
        finally:
            with self.cond:
                self.running = False
                if self.busy() or self.batcher._stopping or self.retired:
                    self.cond.notify()

    def _execute(self, requests: list[InferenceRequest], padding: int) -> None:
        if not requests:
            return
        batcher = self.batcher
        try:
            execute_batch(batcher.model, self.instance, requests, padding)
        except BaseException as exc:  # noqa: BLE001 - the batch fails, the worker goes on
            log.error("model '%s': sequence batch failed", batcher.name, exc_info=exc)
            error = InternalError(f"{type(exc).__name__}: {exc}")
            for request in requests:
                if not request.completed and not request.rescheduled:
                    request.respond(InferenceResponse(error=error), True)


class SequenceBatcher:
    queues = True  # submitting only queues: its own threads execute (host.frontend.engine)

    def __init__(self, model: ModelVersion, instances: list[InstanceSlot],
                 compatible: Callable[[InferenceRequest], tuple] | None = None) -> None:
        cfg = model.config
        seq = cfg.sequence_batching
        self.model = model
        self.name = cfg.name
        self.controls = Controls(cfg)
        # Requests whose keys differ never share an execute (`host.batch.shape_key`: equal shapes,
        # `allow_ragged_batch` honoured), as Triton's sequence batcher enforces for a backend that
        # concatenates the batch.
        self._compatible = compatible
        self._zeros: dict[tuple[str, str, tuple[int, ...]], Tensor] = {}  # see _padding
        # The fields of a padding request before its own are set (its lists and dicts are
        # never filled in: a padding row asks for no output and has no parameters).
        self._blank = dict(_PaddingRequest(model_name=cfg.name).__dict__)
        self.states = StateSpecs(cfg, model.spec.path)
        self.config_outputs = frozenset(o.name for o in cfg.output)
        self.max_batch = max(cfg.max_batch_size, 1)
        self.batching = cfg.max_batch_size > 0
        self.idle_ns = seq.max_sequence_idle_microseconds * 1000
        # Iterative sequences: a request without a correlation id starts a sequence of its own
        # (ids from 1, as Triton's IterativeSequencer), and runs again for as long as its backend
        # releases it with RESCHEDULE; the sequence ends with its final response.
        self.iterative = seq.iterative_sequence
        self._auto_ids = itertools.count(1)
        self.oldest = seq.WhichOneof("strategy_choice") == "oldest"
        if self.oldest:
            slots = max(seq.oldest.max_candidate_sequences, 1)
            preferred = [p for p in seq.oldest.preferred_batch_size if p <= self.max_batch]
            self.target = max(preferred, default=self.max_batch)
            self.delay_ns = seq.oldest.max_queue_delay_microseconds * 1000
            self.utilization = 0.0
        else:
            slots = self.max_batch
            self.target = self.max_batch
            self.delay_ns = seq.direct.max_queue_delay_microseconds * 1000
            self.utilization = seq.direct.minimum_slot_utilization
        # Triton's testing hooks: no batch until this many requests are queued over all the
        # instances' slots, and this many in the backlog (then never again).
        self._delay = delay_count("TRITONSERVER_DELAY_SCHEDULER")
        self._backlog_delay = delay_count("TRITONSERVER_BACKLOG_DELAY_SCHEDULER")
        self.lock = threading.Lock()
        self._sequences: dict[int | str, _Sequence] = {}  # started, END not yet received
        self._backlog: collections.deque[_Sequence] = collections.deque()
        self._stopping = False
        self._slots_per = slots
        self._retire: Callable[[InstanceSlot], None] | None = None  # set by update
        self._retired_workers: list[_Worker] = []  # removed by an update, not ended yet
        self.workers = [_Worker(self, i, slots, self.states) for i in instances]
        # Free slots: a heap, the lowest slot index first (then the first instance), as Triton's
        # ready-slot priority queue: a new sequence takes row 0 of an idle instance, never a row
        # above a free one (the direct strategy pads every row below the highest busy slot).
        self._free: list[tuple[int, int, _Slot]] = [
            (i, n, w.slots[i]) for i in range(slots) for n, w in enumerate(self.workers)]
        heapq.heapify(self._free)
        self._reaper_cond = threading.Condition(self.lock)
        self._reaper = threading.Thread(target=self._reap, daemon=True, name=f"sequence-reaper-{self.name}")
        for w in self.workers:
            w.thread.start()
        self._reaper.start()

    # --- admission -------------------------------------------------------------------------
    def submit(self, request: InferenceRequest) -> None:
        self.controls.check_id_type(request)
        if request.batch_size > 1:
            raise InvalidArgumentError(
                f"inference request to model '{self.name}' must specify batch-size 1 due to "
                "requirements of sequence batcher")
        if self.iterative and not in_sequence(request.sequence_id):
            request.sequence_id, request.sequence_start = next(self._auto_ids), True
        sequence_id = request.sequence_id
        if not in_sequence(sequence_id):
            raise InvalidArgumentError(
                f"inference request to model '{self.name}' must specify a non-zero or "
                "non-empty correlation ID")
        start = request.sequence_start
        with self.lock:
            if self._stopping and start:
                raise UnavailableError(
                    "Server is stopping, scheduler for model has stopped accepting new "
                    "inference requests")
            sequence = self._sequences.get(sequence_id)
            if sequence is None:
                if not start:
                    raise InvalidArgumentError(
                        f"inference request for sequence {sequence_id} to model '{self.name}' "
                        "must specify the START flag on the first request of the sequence")
                sequence = self._sequences[sequence_id] = _Sequence(
                    sequence_id, self.controls.corrid_tensor(sequence_id))
                if self._free:
                    self._assign(sequence, heapq.heappop(self._free)[2])
                else:
                    self._backlog.append(sequence)
            elif start:
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence did "
                            "not end before this sequence start. Previous sequence will be "
                            "terminated early.", sequence_id, self.name)
            sequence.queue.append(request)
            sequence.last_ns = now = time.monotonic_ns()
            if request.sequence_end:
                del self._sequences[sequence_id]  # a new START with this id is a new sequence
            slot = sequence.slot
            if slot is None:
                if request.timeout_us:  # only a sequence waiting in the backlog can time out
                    expires = now + request.timeout_us * 1000
                    if not sequence.expires_ns or expires < sequence.expires_ns:
                        sequence.expires_ns = expires
                        self._reaper_cond.notify()
                return
            worker = slot.worker
            if not self._in_place(worker):
                return
            # A front end's event loop that has more requests to read runs the batch once it
            # has read them: those of other slots then share the execute (host.scheduler.defer).
            if defer(worker, functools.partial(self._run_idle, worker)):
                return
            batch = self._take_in_place(worker)
        if batch is not None:
            worker.run_batch(*batch)

    def _in_place(self, worker: _Worker) -> bool:
        """Whether the instance is idle and nothing is worth waiting for, so that a submitting
        thread may run its batch, sparing the hand-over to the worker thread and back (most of a
        small model's cost); if not, the worker thread is told (lock held)."""
        if worker.running or self.delay_ns or self._stopping or self._delay:
            worker.cond.notify()
            return False
        return True

    def _take_in_place(self, worker: _Worker) -> tuple[list[InferenceRequest], int] | None:
        """The batch for this thread to run; None when nothing is left (lock held)."""
        busy = self._drop_cancelled(worker.busy())
        if not busy:  # the requests were cancelled meanwhile, and answered
            return None
        batch = self._take_batch(worker, busy)
        worker.running = True
        return batch

    def _run_idle(self, worker: _Worker) -> None:
        """A deferred run (host.scheduler.defer): what the instance's slots hold now."""
        with self.lock:
            batch = self._take_in_place(worker) if self._in_place(worker) else None
        if batch is not None:
            worker.run_batch(*batch)

    def _assign(self, sequence: _Sequence, slot: _Slot) -> None:
        slot.sequence, sequence.slot = sequence, slot
        slot.worker.cond.notify()

    def _release(self, slot: _Slot) -> None:
        """The slot's sequence is over: give the slot to the oldest waiting sequence, if any."""
        sequence = slot.sequence
        if sequence is not None:
            sequence.slot = None
        slot.sequence = None
        if slot.worker.retired:  # its instance was removed: it ends once every slot is free
            slot.worker.cond.notify()
            return
        if self._backlog:
            self._assign(self._backlog.popleft(), slot)
        else:
            heapq.heappush(self._free, (slot.index, self.workers.index(slot.worker), slot))

    # --- batches (worker threads, lock held) -----------------------------------------------
    def _next_batch(self, worker: _Worker) -> tuple[list[InferenceRequest], int] | None:
        cond = worker.cond
        while True:
            if self._stopping and not worker.busy() and not worker.running:
                return None
            if worker.retired and not worker.running \
                    and all(s.sequence is None for s in worker.slots):
                return None
            if worker.running:  # a submitting thread is executing on this instance
                cond.wait()
                continue
            if self._delay:
                if self._delaying():
                    cond.wait(0.01)
                    continue
                self._delay = 0
            busy = self._drop_cancelled(worker.busy())
            if busy:
                wait = self._wait_ns(busy)
                if wait <= 0:
                    break
                cond.wait(wait / 1e9)
            else:
                cond.wait()
        return self._take_batch(worker, busy)

    def _delaying(self) -> bool:
        """TRITONSERVER_DELAY_SCHEDULER: fewer requests queued than asked for, over every slot
        (and in the backlog, with TRITONSERVER_BACKLOG_DELAY_SCHEDULER)."""
        if self._stopping:
            return False
        queued = sum(len(s.sequence.queue) for w in self.workers for s in w.slots
                     if s.sequence is not None)
        backlog = sum(len(sequence.queue) for sequence in self._backlog)
        return queued < self._delay or backlog < self._backlog_delay

    def _take_batch(self, worker: _Worker, busy: list[_Slot]) -> tuple[list[InferenceRequest], int]:
        """The batch to run now from the slots with a request (lock held)."""
        key = self._compatible
        if self.oldest:
            # The oldest requests first, up to max_batch_size; a request of another shape than
            # the first ends the batch (it starts the next one), as in Triton's dynamic batcher.
            busy.sort(key=lambda s: _head(s).queue[0].enqueue_ns)
            taken = busy[:self.max_batch]
            if key is not None and len(taken) > 1:
                first = key(_head(taken[0]).queue[0])
                for n, slot in enumerate(taken):
                    if key(_head(slot).queue[0]) != first:
                        taken = taken[:n]
                        break
        else:
            # Direct: the lowest busy slot sets the shapes; a slot whose request has other shapes
            # keeps it for a later batch and gets a padding row this time (Triton's rule).
            taken = busy
            if key is not None and len(busy) > 1:
                first = key(_head(busy[0]).queue[0])
                taken = [s for s in busy if key(_head(s).queue[0]) == first]
        like = _head(taken[0]).queue[0]  # padding rows are shaped like the first request
        top = busy[-1].index  # direct: rows up to the highest busy slot
        requests = [self._take(slot) for slot in taken]
        padding = 0
        if not self.oldest and self.batching:
            rows = {slot.index: r for slot, r in zip(taken, requests)}
            if top + 1 > len(requests):
                requests = [rows.get(i) or self._padding(like) for i in range(top + 1)]
                padding = top + 1 - len(rows)
        return requests, padding

    def _wait_ns(self, busy: list[_Slot]) -> int:
        """How much longer the batch should wait for more requests (<= 0: run it now)."""
        if self.delay_ns == 0:
            return 0
        if self.oldest:
            if len(busy) >= self.target:
                return 0
        elif self.utilization == 0.0 or len(busy) / self.max_batch >= self.utilization:
            return 0
        oldest = min(_head(s).queue[0].enqueue_ns for s in busy)
        return oldest + self.delay_ns - time.perf_counter_ns()

    def _drop_cancelled(self, busy: list[_Slot]) -> list[_Slot]:
        """A cancelled request cancels its sequence (as in Triton): fail what it has queued."""
        live = []
        for slot in busy:
            sequence = _head(slot)
            if not sequence.queue[0].is_cancelled():
                live.append(slot)
                continue
            for request in sequence.queue:
                request.respond(InferenceResponse(error=CancelledError("request was cancelled")), True)
            sequence.queue.clear()
            if self._sequences.get(sequence.id) is sequence:
                del self._sequences[sequence.id]
            self._release(slot)
        return live

    def _take(self, slot: _Slot) -> InferenceRequest:
        """The slot's next request, with its controls and state filled in."""
        sequence = _head(slot)
        request = sequence.queue.popleft()
        self.controls.add_to(request, sequence.corrid)
        states = slot.states
        if states is not None:
            if request.sequence_start:
                states.reset()
            states.add_to(request.inputs)
            request.sequence_states = states
            if not request.rescheduled:  # a rescheduled request has its capture already
                request.callback = _StateCapture(request.callback, states, self.config_outputs)
        if self.iterative:
            request.rescheduled = False
            if request.rescheduler is None:  # its first run: the sequence ends with its answer
                request.rescheduler = self
                request.callback = _IterativeEnd(request.callback, self, sequence)
        if request.sequence_end or (sequence.expired and not sequence.queue):
            self._release(slot)
        return request

    # --- iterative sequences -----------------------------------------------------------------
    def reschedule(self, request: InferenceRequest) -> str:
        """The backend released `request` to run again: it goes back to its sequence's queue,
        neither START nor END. "" when queued; Triton's error when the sequence is gone (idle
        for longer than max_sequence_idle_microseconds)."""
        with self.lock:
            sequence = self._sequences.get(request.sequence_id)
            if sequence is None or sequence.slot is None:
                return (f"inference request for sequence {request.sequence_id} to model "
                        f"'{self.name}' must specify the START flag on the first request of the "
                        "sequence")
            request.sequence_start = request.sequence_end = False
            request.rescheduled = True
            sequence.queue.append(request)
            sequence.last_ns = time.monotonic_ns()
            sequence.slot.worker.cond.notify()
        return ""

    def _end_iterative(self, sequence: _Sequence) -> None:
        """An iterative sequence's request has had its final response: the sequence is over."""
        with self.lock:
            if self._sequences.get(sequence.id) is sequence:
                del self._sequences[sequence.id]
            slot = sequence.slot
            if slot is not None and not sequence.queue:
                self._release(slot)

    def _padding(self, like: InferenceRequest) -> InferenceRequest:
        """A row for a slot without a request: zeros shaped like `like`'s inputs, the controls
        "not ready". The zero tensors are made once per input shape and shared read-only, as
        the control tensors are (a padding row is built for most batches of the direct strategy)."""
        controls = self.controls
        inputs = {}
        for name, t in like.inputs.items():
            if name in controls.names:
                continue
            key = (name, t.datatype, tuple(t.shape))
            zero = self._zeros.get(key)
            if zero is None:
                if len(self._zeros) >= _MAX_ZERO_SHAPES:  # shapes a client varies: stay bounded
                    self._zeros.clear()
                zero = self._zeros[key] = Tensor(name, t.datatype, list(t.shape), _zeros_like(t.data))
            inputs[name] = zero
        controls.add_padding_inputs(inputs)
        # A copy of one blank padding request's fields: the dataclass constructor, with its
        # thirty defaults, costs as much again as the rest of a padding row here.
        pad = _PaddingRequest.__new__(_PaddingRequest)
        pad.__dict__.update(self._blank)
        pad.model_name, pad.model_version, pad.inputs = like.model_name, like.model_version, inputs
        pad.enqueue_ns = like.enqueue_ns
        return pad

    # --- idle sequences, expired backlog ---------------------------------------------------
    def _reap(self) -> None:
        while True:
            with self._reaper_cond:
                if self._stopping:
                    return
                expired = self._reap_locked()
            for request in expired:  # outside the lock, as Triton rejects them
                request.respond(InferenceResponse(error=UnavailableError(
                    "timeout of the corresponding sequence has been expired")), True)

    def _reap_locked(self) -> list[InferenceRequest]:
        """Take the expired backlog sequences out and release the idle ones, then wait for the
        next deadline (lock held). Returns the requests of the expired backlog sequences."""
        now = time.monotonic_ns()
        wait = self.idle_ns
        expired: list[InferenceRequest] = []
        for sequence in [s for s in self._backlog if s.expires_ns]:
            left = sequence.expires_ns - now
            if left > 0:
                wait = min(wait, left)
                continue
            # A request that continues it is then refused as one of a sequence that never
            # started: Triton forgets the correlation id with its backlog queue.
            self._backlog.remove(sequence)
            if self._sequences.get(sequence.id) is sequence:
                del self._sequences[sequence.id]
            expired.extend(sequence.queue)
            sequence.queue.clear()
        if expired:
            return expired
        for sequence in list(self._sequences.values()):
            if sequence.slot is None:
                continue  # in the backlog: not started yet
            left = sequence.last_ns + self.idle_ns - now
            if left > 0:
                wait = min(wait, left)
                continue
            log.info("sequence %s of model '%s' idle for longer than %d us: released",
                     sequence.id, self.name, self.idle_ns // 1000)
            del self._sequences[sequence.id]
            sequence.expired = True
            if not sequence.queue:
                self._release(sequence.slot)
        self._reaper_cond.wait(max(wait, 1_000_000) / 1e9)
        return expired

    # --- in-place update of the instances (host.model) -------------------------------------------
    def update(self, added: list[InstanceSlot], removed: list[InstanceSlot],
               retire: Callable[[InstanceSlot], None]) -> None:
        """Added instances take new sequences at once (the backlog's first). A removed instance
        takes no new sequence; it is handed to `retire` when the sequences it holds end (at
        once when it holds none: this waits for that)."""
        self._retire = retire
        idle: list[_Worker] = []
        with self.lock:
            gone = [w for w in self.workers if w.instance in removed]
            for worker in gone:
                worker.retired = True
                self._retired_workers.append(worker)
                if all(s.sequence is None for s in worker.slots):
                    idle.append(worker)
                worker.cond.notify()
            fresh = [_Worker(self, i, self._slots_per, self.states) for i in added]
            self.workers = [w for w in self.workers if not w.retired] + fresh
            self._free = [(index, self.workers.index(slot.worker), slot)
                          for index, _, slot in self._free if not slot.worker.retired]
            self._free.extend((i, self.workers.index(w), w.slots[i])
                              for i in range(self._slots_per) for w in fresh)
            heapq.heapify(self._free)
            while self._backlog and self._free:
                self._assign(self._backlog.popleft(), heapq.heappop(self._free)[2])
        for worker in fresh:
            worker.thread.start()
        for worker in idle:
            worker.thread.join()

    def _retired(self, worker: _Worker) -> None:
        """A removed instance's worker ended (its thread)."""
        with self.lock:
            if worker in self._retired_workers:
                self._retired_workers.remove(worker)
        if self._retire is not None:
            self._retire(worker.instance)

    # --- stop ------------------------------------------------------------------------------
    def stop(self) -> None:
        with self.lock:
            self._stopping = True
            for w in self.workers:
                w.cond.notify_all()
            self._reaper_cond.notify_all()
            for sequence in self._backlog:  # never got a slot: nothing will run them
                for request in sequence.queue:
                    request.respond(InferenceResponse(error=UnavailableError(
                        f"model '{self.name}' is unloading")), True)
            self._backlog.clear()
            for w in self._retired_workers:
                w.cond.notify_all()
        for w in self.workers + list(self._retired_workers):
            w.thread.join()
        self._reaper.join()

    # --- introspection (metrics, tests, docs) ----------------------------------------------
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch, in the slots' sequences and in the
        backlog (nv_inference_pending_request_count, counted at scrape time)."""
        with self.lock:
            queued = sum(len(s.sequence.queue) for w in self.workers for s in w.slots
                         if s.sequence is not None)
            return queued + sum(len(sequence.queue) for sequence in self._backlog)

    def active_sequences(self) -> int:
        with self.lock:
            return sum(1 for w in self.workers for s in w.slots if s.sequence is not None)


class _IterativeEnd:
    """Wraps the callback of an iterative sequence's request: its final response ends the
    sequence (frees its slot), as Triton's IterativeSequencer does when the request is released."""

    __slots__ = ("callback", "batcher", "sequence")

    def __init__(self, callback: Any, batcher: SequenceBatcher, sequence: _Sequence) -> None:
        self.callback, self.batcher, self.sequence = callback, batcher, sequence

    def __call__(self, response: InferenceResponse | None, final: bool) -> None:
        self.callback(response, final)
        if final:
            self.batcher._end_iterative(self.sequence)


class _StateCapture:
    """Wraps a request's callback: a response output named after a state's `output_name` is the
    state's next value (python models produce state this way). It reaches the client only when
    the configuration lists it among the outputs, as Triton allows for debugging."""

    __slots__ = ("callback", "states", "outputs")

    def __init__(self, callback: Any, states: SequenceStates, outputs: frozenset[str]) -> None:
        self.callback, self.states, self.outputs = callback, states, outputs

    def __call__(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and response.error is None:
            by_output = self.states.by_output
            if any(t.name in by_output for t in response.outputs):
                for t in response.outputs:
                    if t.name in by_output:
                        self.states.update(t.name, t)
                response.outputs = [t for t in response.outputs
                                    if t.name not in by_output or t.name in self.outputs]
        self.callback(response, final)


def _zeros_like(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray) and data.dtype == object:
        zeros = np.full(data.shape, b"", dtype=object)
    else:
        zeros = np.zeros_like(np.asarray(data))
    zeros.flags.writeable = False  # shared by every padding row of that shape
    return zeros
