"""The "onnxruntime" backend: Triton `onnxruntime_onnx` models (`model.onnx`) in onnxruntime.

- one `InferenceSession` per instance, with the providers of its instance kind (`session.py`);
- a batch of requests from the dynamic batcher runs as one session call, inputs concatenated
  along the batch dimension (`host.batch`); requests of different shapes run separately;
- the config is auto-completed from the model file: inputs, outputs and their types and dims,
  and max_batch_size (Triton's rules, see `auto_complete`);
- inputs whose data already lie in GPU memory (CUDA shared memory) are bound in place on a GPU
  instance (`_run_bound`), without a copy through the host.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from host import batch
from host.backend import Backend, Instance, InstanceSpec, Model, ModelSpec
from host.errors import HostError, InternalError, InvalidArgumentError
from host.proto import model_config_pb2 as mc
from modelhost_onnxruntime import session as sessions
from modelhost_onnxruntime import types

if TYPE_CHECKING:
    import onnxruntime as ort

    from host.inference import InferenceRequest, InferenceResponse

log = logging.getLogger(__name__)

# Triton's `default-max-batch-size` backend setting: the max_batch_size auto-complete gives a
# model that can batch when the config says nothing about batching.
DEFAULT_MAX_BATCH_SIZE = 4


class OnnxRuntimeBackend(Backend):
    supported_instance_kinds = ("CPU", "GPU")
    # A batch is one session call on the concatenated inputs: the dynamic and sequence batchers
    # give an execute only requests of equal shapes (ragged inputs excepted), as Triton's core.
    equal_shape_batches = True

    def auto_complete_config(self, spec: ModelSpec) -> None:
        session = sessions.create(spec)
        auto_complete(spec.config, session.get_inputs(), session.get_outputs(),
                      _default_max_batch_size(self.config))

    def create_model(self, spec: ModelSpec) -> OnnxModel:
        return OnnxModel(spec)


class OnnxModel(Model):
    def initialize(self) -> None:
        sessions.model_path(self.spec)  # a missing file fails the load before any instance
        cfg = self.spec.config
        self.batching = cfg.max_batch_size > 0
        self.input_types = {i.name: _datatype(i.data_type) for i in cfg.input}
        self.output_types = {o.name: _datatype(o.data_type) for o in cfg.output}
        # Ragged inputs, batch inputs and batch outputs (host.batch.BatchLayout), as Triton's
        # onnxruntime backend: the batch inputs are more inputs of the ONNX model.
        self.layout = batch.BatchLayout.of(cfg)
        if self.layout is not None:
            self.input_types.update(self.layout.batch_input_types())
        # A sequence model also takes the control inputs and implicit state the host adds to its
        # requests, and produces the next state (host.sequence).
        sequence = cfg.sequence_batching
        for control_input in sequence.control_input:
            for control in control_input.control:
                self.input_types[control_input.name] = _control_datatype(control)
        for state in sequence.state:
            self.input_types[state.input_name] = _datatype(state.data_type)
            self.output_types.setdefault(state.output_name, _datatype(state.data_type))

    def create_instance(self, spec: InstanceSpec) -> OnnxInstance:
        return OnnxInstance(self, spec)


class OnnxInstance(Instance):
    def __init__(self, model: OnnxModel, spec: InstanceSpec) -> None:
        self.model, self.spec = model, spec
        self.session: ort.InferenceSession | None = None

    def initialize(self) -> None:
        self.session = sessions.create(self.model.spec, self.spec)
        check_io(self.model.spec.config, self.session.get_inputs(), self.session.get_outputs())
        self.on_gpu = sessions.on_gpu(self.session)
        # Run every output the model has that the config lists (the core prunes per request).
        self.output_names = list(self.model.output_types)

    def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        return batch.run_batched(requests, self.model.batching, self._run, self.model.layout)

    def _run(self, group: Sequence[InferenceRequest]) -> dict[str, tuple[str, np.ndarray]]:
        assert self.session is not None
        feeds = {name: self._feed(name, data) for name, data in batch.gather(group, self.model.layout).items()}
        try:
            if any(_on_device(v) for v in feeds.values()):
                results = _run_bound(self.session, feeds, self.output_names, self.spec.device_id)
            else:
                results = self.session.run(self.output_names, feeds)
        except HostError:
            raise
        except Exception as exc:
            raise InternalError(
                f"onnxruntime execute failure for model '{self.model.spec.name}': {exc}") from None
        types_ = self.model.output_types
        return {name: (types_[name], types.from_onnx(types_[name], np.asarray(result)))
                for name, result in zip(self.output_names, results)}

    def _feed(self, name: str, data: Any) -> Any:
        if _on_device(data):
            return data if self.on_gpu else _to_host(data)
        return types.to_onnx(self.model.input_types[name], data)

    def finalize(self) -> None:
        self.session = None


# --- GPU-resident inputs -----------------------------------------------------------------------

def _on_device(data: Any) -> bool:
    """Data in GPU memory (a CuPy array or any `__cuda_array_interface__` object), not numpy."""
    return not isinstance(data, np.ndarray) and hasattr(data, "__cuda_array_interface__")


def _to_host(data: Any) -> np.ndarray:
    """Copy GPU data to host memory (for a CPU instance)."""
    if hasattr(data, "get"):  # CuPy
        return data.get()
    import torch  # any other DLPack producer: through torch, when it is there

    return torch.from_dlpack(data).cpu().numpy()


def _on_instance_device(data: Any, device_id: int) -> Any:
    """The data itself when it lies on the instance's GPU, else a copy there (CuPy arrays)."""
    source = getattr(getattr(data, "device", None), "id", device_id)
    if source == device_id:
        return data
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.array(data, copy=True)


def _run_bound(session: ort.InferenceSession, feeds: dict[str, Any], output_names: list[str],
               device_id: int) -> list[np.ndarray]:
    """Run with IOBinding: GPU inputs bound where they lie (no host round trip), the rest as is."""
    binding = session.io_binding()
    kept = []  # device copies made here must outlive the run
    for name, data in feeds.items():
        if _on_device(data):
            data = _on_instance_device(data, device_id)
            kept.append(data)
            interface = data.__cuda_array_interface__
            binding.bind_input(name, "cuda", device_id, np.dtype(interface["typestr"]),
                               list(interface["shape"]), interface["data"][0])
        else:
            binding.bind_cpu_input(name, data)
    for name in output_names:
        binding.bind_output(name)  # onnxruntime allocates them; copied out below
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()


# --- config auto-complete and checks ------------------------------------------------------------

def _datatype(config_type: int) -> str:
    name = mc.DataType.Name(config_type)
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")


def _control_datatype(control: Any) -> str:
    """The datatype of a sequence control input (Triton's rules, host.sequence.controls)."""
    if control.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
        return _datatype(control.data_type)
    if len(control.fp32_false_true):
        return "FP32"
    return "BOOL" if len(control.bool_false_true) else "INT32"


def _config_type(datatype: str) -> int:
    return mc.DataType.Value("TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype)


def _can_batch(args: Sequence[Any]) -> bool:
    """Every model input and output has a first dimension that is not fixed."""
    return all(len(a.shape) >= 1 and not (isinstance(a.shape[0], int) and a.shape[0] > 0)
               for a in args)


def _default_max_batch_size(settings: dict[str, str]) -> int:
    """The `default-max-batch-size` backend setting (--backend-config), 4 when not given."""
    text = settings.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
    try:
        return max(int(text), 0)
    except ValueError:
        raise InvalidArgumentError(
            f"failed to parse default-max-batch-size '{text}': expected an integer") from None


def auto_complete(config: mc.ModelConfig, inputs: Sequence[Any], outputs: Sequence[Any],
                  default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
    """Fill what `config` leaves out from the model's inputs and outputs, as Triton does.

    max_batch_size: when the config leaves it at 0 and the model can batch (every input and
    output has a variable first dimension) and the config's own tensors, if any, leave the batch
    dimension out, it becomes `default_max_batch_size` (Triton's default-max-batch-size backend
    setting, 4 unless given; 0 leaves the model without batching), and a model without a
    scheduler gets the dynamic batcher. Inputs and outputs the config does not list are added
    with the model's types and dims (batch dimension dropped when batching); listed ones get
    their missing data_type or dims from the model.
    """
    model_args = list(inputs) + list(outputs)
    if config.max_batch_size == 0 and _can_batch(model_args):
        given = {t.name: len(t.dims) for t in list(config.input) + list(config.output) if t.dims}
        ranks = {a.name: len(a.shape) for a in model_args}
        if default_max_batch_size > 0 and all(ranks.get(name, rank + 1) == rank + 1
                                              for name, rank in given.items()):
            config.max_batch_size = default_max_batch_size
            if config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
    if config.max_batch_size > 0:
        fixed = [a.name for a in model_args if not _can_batch([a])]
        if fixed:
            raise InvalidArgumentError(
                f"model '{config.name}' has max_batch_size {config.max_batch_size}, but the first "
                f"dimension of {fixed} in the ONNX model is not variable, so it cannot batch")
    skip = 1 if config.max_batch_size > 0 else 0
    # A sequence model's control inputs and implicit state are the host's to fill in, not
    # inputs or outputs of the client's (Triton does not list them either).
    sequence = config.sequence_batching
    hidden = ({c.name for c in sequence.control_input} | {s.input_name for s in sequence.state}
              | {s.output_name for s in sequence.state}
              | {t for b in config.batch_input for t in b.target_name})  # the batch inputs too
    for kind, listed, args in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in listed}
        for arg in args:
            tensor = by_name.get(arg.name)
            if tensor is None:
                if arg.name in hidden:
                    continue
                tensor = listed.add(name=arg.name)
            if tensor.data_type == mc.TYPE_INVALID:
                tensor.data_type = _config_type(
                    types.triton_datatype(arg.type, f"model {kind} '{arg.name}'"))
            if not tensor.dims and not tensor.HasField("reshape"):
                tensor.dims.extend(types.dims(list(arg.shape)[skip:]) or [1])


def check_io(config: mc.ModelConfig, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Every configured tensor exists in the model with the same datatype (Triton's load check)."""
    for kind, listed, args in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {a.name: a for a in args}
        for tensor in listed:
            arg = by_name.get(tensor.name)
            if arg is None:
                raise InvalidArgumentError(
                    f"unexpected {kind} '{tensor.name}' in the configuration of model "
                    f"'{config.name}': the ONNX model's {kind}s are {sorted(by_name)}")
            if not arg.shape:  # rank 0: Triton's onnxruntime backend lets only 1s stand for it
                dims = list(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)
                if any(d != 1 for d in dims):
                    raise InvalidArgumentError(
                        f"unable to load model '{config.name}', scalar tensor '{tensor.name}', "
                        "should only provide 1 in the model configuration when the model doesn't "
                        "support batching. Model configuration provided: "
                        f"[{','.join(str(d) for d in dims)}].")
            want = types.triton_datatype(arg.type, f"model {kind} '{tensor.name}'")
            if _datatype(tensor.data_type) != want:
                raise InvalidArgumentError(
                    f"unexpected datatype {mc.DataType.Name(tensor.data_type)} for {kind} "
                    f"'{tensor.name}' of model '{config.name}', the ONNX model expects "
                    f"{_config_type_name(want)}")


def _config_type_name(datatype: str) -> str:
    return mc.DataType.Name(_config_type(datatype))
