"""The backend contract: Triton's backend API lifecycle, as Python classes.

A backend plugin registers a factory under a backend name (see `host.plugins.spec`). The host
drives the objects it makes with the lifecycle of Triton's backend API:

- `Backend.initialize()` once, when the first model using the backend loads;
  `Backend.finalize()` once, after the last such model unloads.
- `Backend.auto_complete_config(spec)` before a model loads; may fill in `spec.config`.
- `Backend.create_model(spec)` -> `Model`; then `Model.initialize()`.
- for every instance of every instance group: `Model.create_instance(ispec)` -> `Instance`,
  then `Instance.initialize()`.
- `Instance.execute(requests)` with a batch of requests; never two concurrent calls on one
  instance, different instances in parallel.
- at unload: `Instance.finalize()` for each instance, then `Model.finalize()`.

`execute` either returns one response per request (the host sends each as that request's final
response) or returns None after sending responses itself through `request.respond(resp, final)`,
which is how decoupled models answer zero, one or many times, possibly after execute returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse
    from host.proto import model_config_pb2


@dataclass
class ModelSpec:
    """What a backend knows of a model version it is asked to load."""

    name: str
    version: int
    repository: Path  # the repository root holding the model
    path: Path  # <repository>/<name>
    config: model_config_pb2.ModelConfig
    backend: str = ""
    # Set by the host: a backend model whose own machinery died (a worker thread) calls it with
    # the reason; the version becomes UNAVAILABLE so requests fail fast and health says so.
    report_failure: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    @property
    def version_path(self) -> Path:
        return self.path / str(self.version)

    @property
    def default_model_filename(self) -> str:
        return self.config.default_model_filename

    @property
    def decoupled(self) -> bool:
        return self.config.model_transaction_policy.decoupled

    def parameter(self, key: str, default: str | None = None) -> str | None:
        """A string parameter of the model config (`parameters { key: ... value { string_value } }`)."""
        p = self.config.parameters.get(key)
        return p.string_value if p is not None else default


@dataclass
class InstanceSpec:
    """One instance of a model: `name` is Triton's `<group>_<index>`."""

    name: str
    kind: str  # "CPU", "GPU" or "MODEL" (KIND_ prefix dropped)
    device_id: int
    group: str
    host_policy: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Instance:
    """One copy of a model; `execute` is only ever called from one thread at a time."""

    def initialize(self) -> None:
        """Called once before the first execute."""

    def execute(self, requests: Sequence[InferenceRequest]) -> Sequence[InferenceResponse] | None:
        raise NotImplementedError

    def reported_statistics(self) -> tuple[int, int, int] | None:
        """Durations (compute_input, compute_infer, compute_output, in ns) the backend itself
        reported for the execute that just returned, or None to let the host time it (as Triton
        takes a backend's TRITONBACKEND_ModelInstanceReportBatchStatistics)."""
        return None

    def finalize(self) -> None:
        """Called once after the last execute."""


class Model:
    """A loaded model version, shared by its instances."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def initialize(self) -> None:
        """Called once, before any instance is created."""

    def create_instance(self, spec: InstanceSpec) -> Instance:
        raise NotImplementedError

    def finalize(self) -> None:
        """Called once, after every instance was finalized."""

    def load_batch_strategy(self, path: Path) -> BatchStrategy | None:
        """Triton's custom batching strategy library at `path` (TRITON_BATCH_STRATEGY_PATH or a
        `batchstrategy.so` found by `host.batch_strategy.find`), called after `initialize`; None
        when the library defines none of its functions. Native backends hand it their own
        TRITONBACKEND_Model; other backends get one made by the bridge for the strategy alone
        (host.native.batching.load_for_model)."""
        from host.native.batching import load_for_model

        return load_for_model(self.spec, path)

    def metrics(self) -> Iterable[Any]:
        """Prometheus metric families of the model's own (prometheus_client `Metric`s), added to
        /metrics at each scrape; families of the same name from several models are merged."""
        return ()


class BatchStrategy:
    """A loaded custom batching strategy (host.native.batching): what the dynamic batcher asks
    while it forms a batch (Triton's TRITONBACKEND_ModelBatch* functions)."""

    def begin(self) -> int:
        """A new batch: its user pointer (TRITONBACKEND_ModelBatchInitialize)."""
        raise NotImplementedError

    def include(self, userp: int, request: InferenceRequest) -> bool:
        """Whether `request` joins the batch (TRITONBACKEND_ModelBatchIncludeRequest)."""
        raise NotImplementedError

    def end(self, userp: int) -> None:
        """The batch is formed (TRITONBACKEND_ModelBatchFinalize)."""

    def close(self) -> None:
        """At unload (TRITONBACKEND_ModelBatcherFinalize)."""


class Backend:
    """One object per backend name, shared by every model that uses it."""

    #: Backend attributes (as TRITONBACKEND_BackendAttribute): instance kinds it can run.
    supported_instance_kinds: tuple[str, ...] = ("CPU", "GPU", "MODEL")
    #: True (Triton's core rule, for every backend, the python backend included): the dynamic and
    #: sequence batchers give one execute only requests whose variable-size inputs agree in shape
    #: past the batch dimension (`host.batch.shape_key`: `allow_ragged_batch` honoured, shape
    #: tensors also by value, optional inputs by presence). A backend that takes any mix of
    #: requests may set False: its batches then differ from Triton's (execution counts included).
    equal_shape_batches: bool = True
    #: Triton's TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading: a model's
    #: instances may be created and initialized in parallel (host.model; the environment
    #: variable TRITON_PARALLEL_INSTANCE_LOADING overrides it, as in Triton).
    parallel_instance_loading: bool = False

    def __init__(self, name: str) -> None:
        self.name = name
        # --backend-config settings for this backend (set by the host before `initialize`).
        self.config: dict[str, str] = {}

    def initialize(self) -> None:
        """Called when the first model that uses this backend loads."""

    def auto_complete_config(self, spec: ModelSpec) -> None:
        """Fill in what `spec.config` leaves out (inputs, outputs, max_batch_size, ...)."""

    def create_model(self, spec: ModelSpec) -> Model:
        raise NotImplementedError

    def strategy_directory(self) -> Path | None:
        """Where Triton looks for a `batchstrategy.so` last: <backend directory>/<backend name>
        (native backends; None for the others)."""
        return None

    def finalize(self) -> None:
        """Called after the last model that uses this backend unloaded."""


BackendFactory = Callable[[str], Backend]
