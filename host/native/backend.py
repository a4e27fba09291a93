"""A native Triton backend library (`libtriton_<name>.so`) as a `host.backend.Backend`.

The host's lifecycle maps one to one onto the TRITONBACKEND entry points:

- `NativeBackend(...)`: dlopen the library (RTLD_NOW: a missing symbol fails here, with the
  loader's message); `TRITONBACKEND_ModelInstanceExecute` is required, the others optional.
- `initialize` / `finalize`: TRITONBACKEND_Initialize / Finalize, once per library (the host's
  BackendPool creates one backend object per name and finalizes it after the last model);
  then the backend attributes are read (TRITONBACKEND_GetBackendAttribute).
- `NativeModel.initialize` / `finalize`: TRITONBACKEND_ModelInitialize / ModelFinalize.
- `NativeModel.load_batch_strategy`: a custom batching strategy library (host.native.batching).
- `NativeInstance.initialize` / `finalize`: TRITONBACKEND_ModelInstanceInitialize / Finalize.
- `NativeInstance.execute(requests)`: one TRITONBACKEND_ModelInstanceExecute with the whole
  batch; the bridge builds the backend requests and hands the responses back in C, so Python
  runs once per batch. Responses reach each request through `request.respond`, so execute
  returns None (decoupled backends keep sending from their own threads after it returns).

What the backend sees: the model configuration as JSON (`host.config.config_to_json`, the form
Triton's config endpoint returns, defaults filled in), the model folder as its repository
location, instance names, kinds and device ids as the host's instance groups define them, and
the backend configuration `{"cmdline": {...}}` with Triton's default entries.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from host.backend import Backend, BatchStrategy, Instance, InstanceSpec, Model, ModelSpec
from host.config import config_to_json
from host.native.batching import NativeBatchStrategy
from host.native.bridge import call, lib, to_host_error
from host.proto import model_config_pb2

log = logging.getLogger(__name__)


def loader(backend_directory: Path | None) -> Callable[[Path, str, dict], Backend]:
    """The BackendPool's `native_loader`: a backend for a library the pool found."""

    def load(library: Path, name: str, settings: dict | None = None) -> Backend:
        return NativeBackend(name, library, backend_directory, settings)

    return load


def backend_config(library: Path, backend_directory: Path | None,
                   settings: dict[str, str] | None = None) -> str:
    """TRITONBACKEND_BackendConfig: the entries Triton always passes on its command line, then
    the --backend-config settings for this backend (which may replace them)."""
    return json.dumps({"cmdline": {
        "auto-complete-config": "true",
        "backend-directory": str(backend_directory or library.parent.parent),
        "min-compute-capability": "6.000000",
        "default-max-batch-size": "4",
        **(settings or {}),
    }})


class NativeBackend(Backend):
    supported_instance_kinds = ("CPU", "GPU", "MODEL")

    def __init__(self, name: str, library: Path, backend_directory: Path | None = None,
                 settings: dict[str, str] | None = None) -> None:
        super().__init__(name)
        self.library = library
        self._lib = lib()
        self.handle = call(self._lib.backend_load, str(library), name, str(library.parent),
                           backend_config(library, backend_directory, settings))
        self._directory = backend_directory / name if backend_directory else library.parent
        self.preferred_groups: list[tuple[str, int, list[int]]] = []
        log.info("loaded native backend '%s' from %s", name, library)

    def initialize(self) -> None:
        try:
            call(self._lib.backend_initialize, self.handle)
        except BaseException:
            self._lib.backend_unload(self.handle)
            raise
        self.preferred_groups, _parallel = self._lib.backend_attributes(self.handle)

    def auto_complete_config(self, spec: ModelSpec) -> None:
        """A model without instance groups gets the backend's preferred ones (Triton's rule).
        A GPU group is passed over, as Triton does on a host without GPUs (and as the host's
        config normalization assumes): a GPU build of a backend, such as Triton's prebuilt python
        backend, prefers KIND_GPU; the model then gets Triton's default CPU group."""
        if spec.config.instance_group or not self.preferred_groups:
            return
        for kind, count, device_ids in self.preferred_groups:
            if kind in ("AUTO", "GPU"):
                continue
            group = spec.config.instance_group.add()
            group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(f"KIND_{kind}")
            group.count = max(int(count), 1)
            group.gpus.extend(int(d) for d in device_ids)

    def create_model(self, spec: ModelSpec) -> Model:
        return NativeModel(self, spec)

    def strategy_directory(self) -> Path | None:
        return self._directory

    def finalize(self) -> None:
        try:
            call(self._lib.backend_finalize, self.handle)
        finally:
            self._lib.backend_unload(self.handle)


class NativeModel(Model):
    def __init__(self, backend: NativeBackend, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._lib = backend._lib
        config = json.dumps(config_to_json(spec.config))
        outputs = [o.name for o in spec.config.output]
        self.handle = self._lib.model_new(backend.handle, spec.name, spec.version, str(spec.path),
                                          config, outputs, spec.decoupled)

    def initialize(self) -> None:
        try:
            call(self._lib.model_initialize, self.handle)
        except BaseException:
            self._lib.model_free(self.handle)  # the host does not finalize what failed to initialize
            raise

    def create_instance(self, spec: InstanceSpec) -> Instance:
        return NativeInstance(self, spec)

    def load_batch_strategy(self, path: Path) -> BatchStrategy | None:
        """TRITONBACKEND_ModelBatcherInitialize with this model (its error fails the load)."""
        handle = call(self._lib.strategy_load, self.handle, str(path))
        return None if handle is None else NativeBatchStrategy(self._lib, handle, self.spec.name)

    def finalize(self) -> None:
        try:
            call(self._lib.model_finalize, self.handle)
        finally:
            self._lib.model_free(self.handle)


class NativeInstance(Instance):
    def __init__(self, model: NativeModel, spec: InstanceSpec) -> None:
        self._lib = model._lib
        # Triton's default host policy names: "cpu" for CPU instances, "gpu_<id>" for GPU ones.
        policy = spec.host_policy or ("gpu_%d" % spec.device_id if spec.kind == "GPU" else "cpu")
        self.handle = self._lib.instance_new(model.handle, spec.name, spec.kind, spec.device_id,
                                             policy, bool(spec.extra.get("passive", False)))
        self._execute = self._lib.execute
        # a statistics request may come while the instance is being freed (unload)
        self._free_lock = threading.Lock()
        self._freed = False

    def initialize(self) -> None:
        try:
            call(self._lib.instance_initialize, self.handle)
        except BaseException:
            self._lib.instance_free(self.handle)
            raise

    def execute(self, requests: Sequence[Any]) -> None:
        try:
            self._execute(self.handle, requests)
        except self._lib.BridgeError as exc:  # the backend's error fails the whole batch
            raise to_host_error(*exc.args) from None
        return None

    def reported_statistics(self) -> tuple[int, int, int] | None:
        return self._lib.take_statistics(self.handle)

    def response_statistics(self) -> list[tuple[int, int, int, int, int, bool, bool]]:
        """Per-response statistics reported since the last call (host.stats.response_reported)."""
        with self._free_lock:
            return [] if self._freed else self._lib.take_response_statistics(self.handle)

    def finalize(self) -> None:
        try:
            call(self._lib.instance_finalize, self.handle)
        finally:
            with self._free_lock:
                self._freed = True
                self._lib.instance_free(self.handle)
