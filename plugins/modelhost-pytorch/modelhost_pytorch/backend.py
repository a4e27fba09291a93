"""The "pytorch" backend: Triton `pytorch_libtorch` models (TorchScript `model.pt`) in torch.

Triton's conventions:
- inputs named `<anything>__<index>` (`INPUT__0`, `INPUT__1`) are the forward arguments at those
  positions; otherwise inputs are matched to forward's argument names (named inputs), and failing
  that taken in the order of the config;
- outputs named `<anything>__<index>` (`OUTPUT__0`) are the elements at those positions of what
  forward returns (a tensor, or a tuple/list of tensors); others are taken in config order;
- each instance holds its own copy of the module on its device: `cuda:<device_id>` for a
  KIND_GPU instance when CUDA is there, the CPU otherwise;
- execute runs under `torch.inference_mode()` (parameter INFERENCE_MODE, default true) and with
  TorchScript's optimized execution unless DISABLE_OPTIMIZED_EXECUTION is true;
- INTRA_OP_THREAD_COUNT / INTER_OP_THREAD_COUNT set torch's thread pools. They are per process
  in torch, as in Triton: the last model to set them wins.
- a batch of requests from the dynamic batcher runs as one forward call (`host.batch`).
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from host import batch
from host.backend import Backend, Instance, InstanceSpec, Model, ModelSpec
from host.errors import HostError, InternalError, InvalidArgumentError, NotFoundError
from host.paths import resolve_inside
from host.proto import model_config_pb2 as mc
from modelhost_pytorch import tensors

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILENAME = "model.pt"
_INDEXED = re.compile(r"^.+__(\d+)$")


def _bool_parameter(spec: ModelSpec, key: str, default: bool) -> bool:
    value = spec.parameter(key)
    if value is None or value.strip() == "":
        return default
    if value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if value.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise InvalidArgumentError(f"parameter '{key}' of model '{spec.name}' must be true or false, "
                               f"got '{value}'")


def _int_parameter(spec: ModelSpec, key: str) -> int | None:
    value = spec.parameter(key)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"parameter '{key}' of model '{spec.name}' must be an integer, "
                                   f"got '{value}'") from None


def _set_threads(spec: ModelSpec) -> None:
    intra = _int_parameter(spec, "INTRA_OP_THREAD_COUNT")
    if intra is not None and intra > 0:
        torch.set_num_threads(intra)
    inter = _int_parameter(spec, "INTER_OP_THREAD_COUNT")
    if inter is not None and inter > 0 and torch.get_num_interop_threads() != inter:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError as exc:  # torch allows it once, before any inter-op work
            log.warning("model '%s': INTER_OP_THREAD_COUNT=%d not applied: %s", spec.name, inter, exc)


def _datatype(config_type: int) -> str:
    name = mc.DataType.Name(config_type)
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")


def _positions(names: list[str], fallback: list[str] | None) -> list[str]:
    """The names ordered by position: `__<index>` suffixes when all have one, else `fallback`
    (forward's argument names) when it names them all, else as given."""
    indexed = [_INDEXED.match(n) for n in names]
    if names and all(indexed):
        order = sorted(zip((int(m.group(1)) for m in indexed), names))
        return [n for _, n in order]
    if fallback is not None and set(names) <= set(fallback):
        return [n for n in fallback if n in names]
    return list(names)


class PyTorchBackend(Backend):
    supported_instance_kinds = ("CPU", "GPU", "MODEL")
    # A batch is one forward call on the concatenated inputs: the dynamic and sequence batchers
    # give an execute only requests of equal shapes (ragged inputs excepted), as Triton's core.
    equal_shape_batches = True

    def create_model(self, spec: ModelSpec) -> PyTorchModel:
        return PyTorchModel(spec)


class PyTorchModel(Model):
    def initialize(self) -> None:
        spec, cfg = self.spec, self.spec.config
        self.path = resolve_inside(spec.path, spec.default_model_filename or DEFAULT_MODEL_FILENAME,
                                   "default_model_filename", under=str(spec.version))
        if not self.path.is_file():
            raise NotFoundError(f"unable to find TorchScript model '{self.path}' for model "
                                f"'{spec.name}'")
        self.batching = cfg.max_batch_size > 0
        self.input_types = {i.name: _datatype(i.data_type) for i in cfg.input}
        self.output_types = {o.name: _datatype(o.data_type) for o in cfg.output}
        # Ragged inputs, batch inputs and batch outputs (host.batch.BatchLayout), as Triton's
        # libtorch backend: the batch inputs are more arguments of forward.
        self.layout = batch.BatchLayout.of(cfg)
        if self.layout is not None:
            self.input_types.update(self.layout.batch_input_types())
        for kind, table in (("input", self.input_types), ("output", self.output_types)):
            for name, datatype in table.items():
                tensors.check_datatype(datatype, f"{kind} '{name}' of model '{spec.name}'")
        self.inference_mode = _bool_parameter(spec, "INFERENCE_MODE", True)
        self.optimized = not _bool_parameter(spec, "DISABLE_OPTIMIZED_EXECUTION", False)
        _set_threads(spec)

    def create_instance(self, spec: InstanceSpec) -> PyTorchInstance:
        return PyTorchInstance(self, spec)


class PyTorchInstance(Instance):
    def __init__(self, model: PyTorchModel, spec: InstanceSpec) -> None:
        self.model, self.spec = model, spec
        self.module: torch.jit.ScriptModule | None = None

    def initialize(self) -> None:
        self.device = self._device()
        try:
            module = torch.jit.load(str(self.model.path), map_location=self.device)
        except Exception as exc:
            raise InvalidArgumentError(
                f"failed to load TorchScript model '{self.model.path}' for model "
                f"'{self.model.spec.name}': {exc}") from None
        module.eval()
        self.module = module
        arguments = _forward_arguments(module)
        self.input_order = _positions(list(self.model.input_types), arguments)
        self.output_order = _output_positions(list(self.model.output_types))

    def _device(self) -> torch.device:
        if self.spec.kind == "GPU":
            if torch.cuda.is_available() and self.spec.device_id < torch.cuda.device_count():
                return torch.device("cuda", self.spec.device_id)
            log.warning("instance '%s' of model '%s' is KIND_GPU but CUDA device %d is not "
                        "available: it runs on CPU", self.spec.name, self.model.spec.name,
                        self.spec.device_id)
        return torch.device("cpu")

    def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        return batch.run_batched(requests, self.model.batching, self._run, self.model.layout)

    def _mode(self) -> contextlib.AbstractContextManager:
        return torch.inference_mode() if self.model.inference_mode else torch.no_grad()

    def _run(self, group: Sequence[InferenceRequest]) -> dict[str, tuple[str, np.ndarray]]:
        assert self.module is not None
        arrays = batch.gather(group, self.model.layout)
        try:
            args = [self._tensor(name, arrays[name]) for name in self.input_order if name in arrays]
            with self._mode(), torch.jit.optimized_execution(self.model.optimized):
                result = self.module(*args)
            return self._outputs(result)
        except HostError:
            raise
        except Exception as exc:
            raise InternalError(
                f"PyTorch execute failure for model '{self.model.spec.name}': {exc}") from None

    def _tensor(self, name: str, data: Any) -> torch.Tensor | list[str]:
        if tensors.on_device(data):
            return tensors.from_device(data, self.device)
        datatype = self.model.input_types[name]
        if datatype == "BYTES":
            return tensors.to_strings(data)
        return tensors.to_torch(datatype, data, self.device)

    def _outputs(self, result: Any) -> dict[str, tuple[str, np.ndarray]]:
        # a tensor or a List[str] is one output; a tuple holds one per output (Triton's rules)
        items = [result] if isinstance(result, (torch.Tensor, list)) else list(result)
        outputs = {}
        for name, position in self.output_order:  # every index first, as Triton checks them
            if position >= len(items):  # Triton's libtorch backend's text and code
                raise InvalidArgumentError(
                    f"The output {name} in the model configuration refers to an output index "
                    f"which doesn't exist. This model has {len(items)} outputs")
        for name, position in self.output_order:
            tensor = items[position]
            if isinstance(tensor, list):
                if not all(isinstance(v, str) for v in tensor):  # Triton's libtorch text
                    raise InternalError(
                        f"output at index {position} must be of type Tensor or List[str]")
                datatype, array = "BYTES", tensors.from_strings(tensor)
            else:
                datatype, array = tensors.to_numpy(tensor)
            want = self.model.output_types[name]
            if datatype != want:  # Triton's libtorch backend's text and code
                raise InvalidArgumentError(
                    f"configuration expects datatype TYPE_{want} for output '{name}', model "
                    f"provides TYPE_{datatype}")
            outputs[name] = (datatype, array)
        return outputs

    def finalize(self) -> None:
        self.module = None


def _output_positions(names: list[str]) -> list[tuple[str, int]]:
    """(name, position in forward's result): the `__<index>` suffix when every name has one,
    else the position in the config."""
    indexed = [_INDEXED.match(n) for n in names]
    if names and all(indexed):
        return [(n, int(m.group(1))) for n, m in zip(names, indexed)]
    return [(n, i) for i, n in enumerate(names)]


def _forward_arguments(module: torch.jit.ScriptModule) -> list[str] | None:
    """forward's argument names (without self), or None when the schema can't be read."""
    try:
        arguments = module.forward.schema.arguments
    except (AttributeError, RuntimeError):
        return None
    return [a.name for a in arguments if a.name != "self"]
