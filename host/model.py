"""One loaded model version: its backend objects, instances, scheduler, state and statistics.

`ModelVersion.load` runs the model and instance lifecycle of Triton's backend API; a failure in
any initialize finalizes whatever was already initialized (in reverse order) and re-raises.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from host import batch, batch_strategy, classification, config_support, warmup
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
    """Every instance of every instance group, named `<group>_<n>` as Triton names them."""
    specs = []
    for group in config.instance_group:
        kind = _KIND[group.kind]
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        n = 0
        for device in devices:
            for _ in range(max(group.count, 1)):
                specs.append(InstanceSpec(name=f"{group.name}_{n}", kind=kind, device_id=device,
                                          group=group.name, host_policy=group.host_policy,
                                          extra={"passive": group.passive,
                                                 "rate_limiter": group.rate_limiter}))
                n += 1
    return specs


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
        # host.rate_limiter.RateLimiter with --rate-limit=execution_count (set by the manager)
        self.rate_limiter: RateLimiter | None = None
        self.scheduler: DirectScheduler | DynamicBatcher | SequenceBatcher | None = None
        self._equal_shapes = False  # the backend's `equal_shape_batches`, set by `load`
        # host.affinity: the next execute may leave the Python CPU (the last one was long; the
        # first one does, so that pools a model starts lazily, torch's, get every CPU)
        self.wide_execute = True
        self.stages: Stages | None = None  # the request stages, made on the first request
        self._inflight = 0
        self._cond = threading.Condition()
        spec.report_failure = self.fail
        self.tracing = False  # set once a request of this model was sampled (host.trace)
        self.load_duration_secs = 0.0  # how long `load` took (nv_model_load_duration_secs)
        # What a reload compares to load it again or keep it serving (host.manager, _load_versions).
        self.reload_key: tuple | None = None

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
            for ispec in instance_specs(self.config):
                if ispec.kind not in backend.supported_instance_kinds:
                    raise InvalidArgumentError(
                        f"backend '{backend.name}' does not support instance kind KIND_{ispec.kind} "
                        f"(instance '{ispec.name}')")
                instance = self._model.create_instance(ispec)
                instance.initialize()
                slot = InstanceSlot(ispec, instance)
                self._slots.append(slot)
                if self.rate_limiter is not None:  # may refuse the resources, with Triton's texts
                    self.rate_limiter.add_instance(slot, ispec.extra["rate_limiter"], ispec.device_id)
                if self.config.model_warmup:  # on each instance before it serves, as in Triton
                    warmup.run(self, slot)
            # may refuse the queue policy, or an implicit state's initial value
            self.scheduler = self._make_scheduler()
        except BaseException:
            self._finalize()
            raise
        self.state = READY

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
        while self._slots:
            slot = self._slots.pop()
            if self.rate_limiter is not None:
                self.rate_limiter.remove_instance(slot)
            try:
                slot.instance.finalize()
            except Exception:
                log.exception("finalize of instance '%s' failed", slot.spec.name)
        if self._model is not None:
            try:
                self._model.finalize()
            except Exception:
                log.exception("finalize of model '%s' version %d failed", self.name, self.version)
            self._model = None

    # --- requests ----------------------------------------------------------------------------
    def begin_request(self) -> None:
        with self._cond:
            if self.state != READY:
                raise UnavailableError(
                    f"Request for unknown model: '{self.name}' version {self.version} is not at ready state"
                    if self.state != UNLOADING else
                    f"model '{self.name}' version {self.version} is unloading")
            self._inflight += 1

    def end_request(self) -> None:
        with self._cond:
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
