"""One loaded model version: its backend objects, instances, scheduler, state and statistics.

`ModelVersion.load` runs the model and instance lifecycle of Triton's backend API; a failure in
any initialize finalizes whatever was already initialized (in reverse order) and re-raises.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from host import batch, batch_strategy, classification, config_support, warmup
from host import config as config_mod
from host.backend import InstanceSpec, Model, ModelSpec
from host.errors import InvalidArgumentError, UnavailableError
from host.proto import model_config_pb2
from host.scheduler import DirectScheduler, DynamicBatcher, InstanceSlot
from host.sequence import SequenceBatcher
from host.stats import ModelStats
from host.validation import RequestRules

if TYPE_CHECKING:
    from host.backend import Backend, BatchStrategy
    from host.rate_limiter import RateLimiter
    from host.stages import Stages

log = logging.getLogger(__name__)

LOADING, READY, UNLOADING, UNAVAILABLE = "LOADING", "READY", "UNLOADING", "UNAVAILABLE"

_KIND = {v: model_config_pb2.ModelInstanceGroup.Kind.Name(v)[5:]
         for v in model_config_pb2.ModelInstanceGroup.Kind.values()}


def instance_specs(config: model_config_pb2.ModelConfig) -> list[InstanceSpec]:
    """Every instance of every instance group, named `<group>_<n>` as Triton names them.

    `extra["signature"]`: what an in-place update of the instance groups compares to keep an
    instance (Triton's TritonModelInstance::Signature): its group's configuration, name and
    count aside, and its device."""
    specs = []
    for group in config.instance_group:
        kind = _KIND[group.kind]
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        normalized = copy.deepcopy(group)
        normalized.name, normalized.count = "", 1
        signature = normalized.SerializeToString(deterministic=True)
        n = 0
        for device in devices:
            for _ in range(max(group.count, 1)):
                specs.append(InstanceSpec(name=f"{group.name}_{n}", kind=kind, device_id=device,
                                          group=group.name, host_policy=group.host_policy,
                                          extra={"passive": group.passive,
                                                 "rate_limiter": group.rate_limiter,
                                                 "signature": (signature, device)}))
                n += 1
    return specs


def _parallel_loading(backend: Backend, model: Model) -> bool:
    """Whether a model's instances are created in parallel: the backend model's say if it has
    one (`parallel_instance_loading`), else the backend's attribute (Triton's
    TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading); Triton's override
    TRITON_PARALLEL_INSTANCE_LOADING ("1" on, anything else off) wins."""
    env = os.environ.get("TRITON_PARALLEL_INSTANCE_LOADING", "")
    if env:
        return env == "1"
    own = getattr(model, "parallel_instance_loading", None)
    if own is not None:
        return bool(own)
    return bool(getattr(backend, "parallel_instance_loading", False))


class ModelVersion:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.name, self.version = spec.name, spec.version
        self.config = spec.config
        self.decoupled = spec.decoupled
        self.state, self.reason = LOADING, ""
        self.stats = ModelStats(spec.name, spec.version)
        self.rules = RequestRules(spec.config)
        self.batching = spec.config.max_batch_size > 0
        # Classification labels by output (label_filename), read once at load.
        self.labels = classification.load_labels(spec.config, spec.path)
        self._model: Model | None = None
        self._strategy: BatchStrategy | None = None  # a custom batching strategy (load)
        self._slots: list[InstanceSlot] = []
        # Instances an in-place update removed whose scheduler still runs them (a sequence
        # batcher's instance with sequences in flight): finalized when it lets them go.
        self._retiring: list[InstanceSlot] = []
        self._slots_lock = threading.Lock()  # who takes a retiring instance out finalizes it
        self._backend: Backend | None = None
        # host.rate_limiter.RateLimiter with --rate-limit=execution_count (set by the manager)
        self.rate_limiter: RateLimiter | None = None
        self.scheduler: DirectScheduler | DynamicBatcher | SequenceBatcher | None = None
        self._equal_shapes = False  # the backend's `equal_shape_batches`, set by `load`
        # host.affinity: the next execute may leave the Python CPU (the last one was long; the
        # first one does, so that pools a model starts lazily, torch's, get every CPU)
        self.wide_execute = True
        self.stages: Stages | None = None  # the request stages, made on the first request
        self._inflight = 0
        # The condition's own lock, taken directly on the request path: `with self._lock` is one C
        # call, `with self._cond` a Python-level __enter__ and __exit__ per request.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        spec.report_failure = self.fail
        self.tracing = False  # set once a request of this model was sampled (host.trace)
        self.load_duration_secs = 0.0  # how long `load` took (nv_model_load_duration_secs)
        # What a reload compares to load it again or keep it serving (host.manager, _load_versions).
        self.reload_key: tuple | None = None
        # The same, its instance groups aside: equal, the version takes new instance groups in
        # place (update_instances) instead of loading again.
        self.update_key: tuple | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def load(self, backend: Backend) -> None:
        config_support.check(self.config)  # nothing in the configuration is silently ignored
        self._equal_shapes = backend.equal_shape_batches  # for the dynamic batcher
        try:
            self._model = backend.create_model(self.spec)
            self._model.initialize()
        except BaseException:
            self._model = None
            raise
        try:
            # Triton's custom batching strategy, if the model has one (host.batch_strategy).
            directory = getattr(backend, "strategy_directory", None)  # duck-typed backends
            library = batch_strategy.find(self.spec, directory() if directory else None)
            if library is not None:
                log.info("Loading custom batching strategy library %s for model %s",
                         library, self.name)
                load_strategy = getattr(self._model, "load_batch_strategy", None)
                self._strategy = (load_strategy or Model(self.spec).load_batch_strategy)(library)
            self._backend = backend
            self._add_instances(backend, instance_specs(self.config), self._slots)
            # may refuse the queue policy, or an implicit state's initial value
            self.scheduler = self._make_scheduler()
        except BaseException:
            self._finalize()
            raise
        self.state = READY

    def _add_instances(self, backend: Backend, specs: list[InstanceSpec],
                       into: list[InstanceSlot]) -> None:
        """Create and initialize the instances of `specs` (in parallel where the backend allows
        it, as Triton), register them with the rate limiter and warm them up; each is appended
        to `into` as soon as it exists, so that a failure finalizes what was made (the caller's
        job). Raises the last failure, as Triton's PrepareInstances."""
        for ispec in specs:
            if ispec.kind not in backend.supported_instance_kinds:
                raise InvalidArgumentError(
                    f"backend '{backend.name}' does not support instance kind KIND_{ispec.kind} "
                    f"(instance '{ispec.name}')")
        assert self._model is not None
        model = self._model
        made: list[InstanceSlot | None] = [None] * len(specs)

        def create(n: int) -> None:
            instance = model.create_instance(specs[n])
            instance.initialize()
            made[n] = InstanceSlot(specs[n], instance)

        def ready(slot: InstanceSlot) -> None:
            if self.rate_limiter is not None:  # may refuse the resources, with Triton's texts
                self.rate_limiter.add_instance(slot, slot.spec.extra["rate_limiter"],
                                               slot.spec.device_id)
            if self.config.model_warmup:  # on each instance before it serves, as in Triton
                warmup.run(self, slot)

        if len(specs) < 2 or not _parallel_loading(backend, model):
            for n in range(len(specs)):
                create(n)
                slot = made[n]
                assert slot is not None
                into.append(slot)
                ready(slot)
            return
        failure: BaseException | None = None
        with ThreadPoolExecutor(len(specs), thread_name_prefix=f"instance-load-{self.name}") as pool:
            for future in [pool.submit(create, n) for n in range(len(specs))]:
                exc = future.exception()
                if exc is not None:
                    log.error("ERROR: Failed to create instance: %s", exc)
                    failure = exc
        created = [slot for slot in made if slot is not None]
        into.extend(created)
        if failure is not None:
            raise failure
        for slot in created:
            ready(slot)

    def update_instances(self, new_config: model_config_pb2.ModelConfig) -> None:
        """Triton's in-place update (TritonModel::UpdateInstanceGroup): the version takes the
        instance groups of `new_config` while it serves. An instance whose group is unchanged
        (name and count aside, same device) is kept; the others are created, and those left
        over removed once idle (a sequence's instance when its sequences end). A failure leaves
        the version as it was."""
        cfg = copy.deepcopy(self.config)
        cfg.ClearField("instance_group")
        cfg.instance_group.extend(new_config.instance_group)
        config_mod.normalize_instance_groups(cfg)
        config_support.check(cfg)  # nothing in the new groups is silently ignored either
        specs = instance_specs(cfg)
        existing: dict[tuple, list[InstanceSlot]] = {}
        for slot in self._slots:
            existing.setdefault(slot.spec.extra["signature"], []).append(slot)
        plan: list[InstanceSlot | InstanceSpec] = []
        for ispec in specs:
            reusable = existing.get(ispec.extra["signature"])
            if reusable:
                plan.append(reusable.pop(0))
            else:
                plan.append(ispec)
        removed = [slot for slots in existing.values() for slot in slots]
        creating = [p for p in plan if isinstance(p, InstanceSpec)]
        if not creating and not removed:
            self._set_groups(cfg)
            return
        assert self._backend is not None
        added: list[InstanceSlot] = []
        try:
            self._add_instances(self._backend, creating, added)
        except BaseException:
            for slot in reversed(added):
                self._finalize_instance(slot)
            raise
        made = iter(added)
        slots = [p if isinstance(p, InstanceSlot) else next(made) for p in plan]
        with self._slots_lock:
            self._slots = slots
            self._retiring.extend(removed)
        self._set_groups(cfg)
        scheduler = self.scheduler
        if scheduler is not None:
            scheduler.update([s for s in added if not s.spec.extra.get("passive")],
                             [s for s in removed if not s.spec.extra.get("passive")],
                             self._retire)
        for slot in reversed(removed):
            if slot.spec.extra.get("passive"):  # never scheduled
                self._retire(slot)

    def _set_groups(self, cfg: model_config_pb2.ModelConfig) -> None:
        self.config.ClearField("instance_group")
        self.config.instance_group.extend(cfg.instance_group)

    def _retire(self, slot: InstanceSlot) -> None:
        """An instance an update removed is out of its scheduler: finalize it (once)."""
        with self._slots_lock:
            if slot not in self._retiring:
                return
            self._retiring.remove(slot)
        self._finalize_instance(slot)

    def _finalize_instance(self, slot: InstanceSlot) -> None:
        if self.rate_limiter is not None:
            self.rate_limiter.remove_instance(slot)
        try:
            slot.instance.finalize()
        except Exception:
            log.exception("finalize of instance '%s' failed", slot.spec.name)

    def _make_scheduler(self) -> DirectScheduler | DynamicBatcher | SequenceBatcher:
        cfg = self.config
        # Passive instances are loaded but never scheduled (Triton's instance_group.passive).
        slots = [s for s in self._slots if not s.spec.extra.get("passive")]
        if cfg.WhichOneof("scheduling_choice") == "sequence_batching":
            return SequenceBatcher(self, slots,
                                   compatible=batch.shape_key(cfg) if self._equal_shapes else None)
        if cfg.WhichOneof("scheduling_choice") == "dynamic_batching" and cfg.max_batch_size > 0:
            db = cfg.dynamic_batching
            return DynamicBatcher(self, slots, cfg.max_batch_size, list(db.preferred_batch_size),
                                  db.max_queue_delay_microseconds, queue_config=db,
                                  compatible=batch.batch_key(cfg, self._equal_shapes),
                                  strategy=self._strategy)
        return DirectScheduler(self, slots)

    def begin_unload(self) -> None:
        """Refuse new requests from now on (those in flight go on)."""
        with self._cond:
            if self.state == READY:
                self.state = UNLOADING

    def unload(self, timeout: float | None = None) -> None:
        """Refuse new requests, wait for those in flight (final responses included), finalize."""
        with self._cond:
            if self.state == READY:
                self.state = UNLOADING
            self._cond.wait_for(lambda: self._inflight == 0, timeout)
        if self.scheduler is not None:
            self.scheduler.stop()
        self._finalize()
        self.state, self.reason = UNAVAILABLE, "unloaded"

    def fail(self, reason: str) -> None:
        """The backend model can no longer serve (see `ModelSpec.report_failure`)."""
        with self._cond:
            if self.state == READY:
                log.error("model '%s' version %d is UNAVAILABLE: %s", self.name, self.version, reason)
                self.state, self.reason = UNAVAILABLE, reason

    def _finalize(self) -> None:
        """Finalize the batching strategy, instances (reverse order), then the model (Triton's
        order); errors are logged, not raised."""
        if self._strategy is not None:
            try:
                self._strategy.close()
            except Exception:
                log.exception("finalize of the batching strategy of model '%s' failed", self.name)
            self._strategy = None
        with self._slots_lock:
            slots, self._slots = self._slots + self._retiring, []
            self._retiring = []
        while slots:
            self._finalize_instance(slots.pop())
        if self._model is not None:
            try:
                self._model.finalize()
            except Exception:
                log.exception("finalize of model '%s' version %d failed", self.name, self.version)
            self._model = None

    # --- requests ----------------------------------------------------------------------------
    def begin_request(self) -> None:
        with self._lock:
            if self.state != READY:
                raise UnavailableError(
                    f"Request for unknown model: '{self.name}' version {self.version} is not at ready state"
                    if self.state != UNLOADING else
                    f"model '{self.name}' version {self.version} is unloading")
            self._inflight += 1

    def end_request(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0 and self.state == UNLOADING:
                self._cond.notify_all()

    @property
    def inflight(self) -> int:
        return self._inflight

    def inflight_inferences(self) -> int:
        """What the server's shutdown waits for before it unloads the version (Triton's
        Scheduler::InflightInferenceCount): its sequences not yet ended under the sequence
        batcher (released by their END or their idle timeout), else its requests in flight."""
        sequences = getattr(self.scheduler, "active_sequences", None)
        if sequences is not None:
            return sequences()
        return self._inflight

    @property
    def slots(self) -> tuple[InstanceSlot, ...]:
        """The model's instances (as the schedulers hold them)."""
        return tuple(self._slots)

    def collect_response_statistics(self) -> None:
        """Move the per-response statistics the instances reported into `stats` (native
        backends report them; instances without `response_statistics` have none)."""
        for slot in list(self._slots):  # an unload may be finalizing them (host.native guards)
            take = getattr(slot.instance, "response_statistics", None)
            if take is not None:
                for record in take():
                    self.stats.response_reported(*record)

    def pending_requests(self) -> int:
        """Requests scheduled and not executing yet, as the scheduler counts them (0 when it
        has no such notion)."""
        pending = getattr(self.scheduler, "pending", None)
        return pending() if pending is not None else 0

    def metrics(self) -> list:
        """The backend model's own metric families (`host.backend.Model.metrics`)."""
        if self._model is None:
            return []
        try:
            return list(self._model.metrics())
        except Exception:  # a scrape must not fail because of one model
            log.exception("metrics of model '%s' version %d failed", self.name, self.version)
            return []
