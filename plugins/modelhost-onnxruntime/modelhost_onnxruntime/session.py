"""Creating one onnxruntime session: model file, session options and execution providers.

Session options come from the model config as Triton's onnxruntime backend reads them:

- `optimization { graph { level: N } }`: -1 basic, 1 extended, 2 none, anything else (or no
  `graph` at all) every optimization (ORT_ENABLE_ALL).
- `parameters`: `intra_op_thread_count`, `inter_op_thread_count` (0 or absent: onnxruntime's
  default), `execution_mode` (0 sequential, 1 parallel), `enable_mem_arena`, `enable_mem_pattern`.

Providers come from the instance: a KIND_GPU instance asks for CUDA on its device, then CPU; when
CUDA cannot be had (no GPU, no CUDA libraries) onnxruntime falls back to CPU and we log it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host.errors import InvalidArgumentError, NotFoundError
from host.paths import resolve_inside

if TYPE_CHECKING:
    import onnxruntime as ort

    from host.backend import InstanceSpec, ModelSpec
    from host.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILENAME = "model.onnx"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def model_path(spec: ModelSpec) -> Path:
    """The model file; a directory `model.onnx/` (a model with external data) holds `model.onnx`."""
    path = resolve_inside(spec.path, spec.default_model_filename or DEFAULT_MODEL_FILENAME,
                          "default_model_filename", under=str(spec.version))
    if path.is_dir():
        path = path / DEFAULT_MODEL_FILENAME
    if not path.is_file():
        raise NotFoundError(f"unable to find ONNX model '{path}' for model '{spec.name}'")
    return path


def _int_parameter(config: ModelConfig, key: str) -> int | None:
    p = config.parameters.get(key)
    if p is None or p.string_value.strip() == "":
        return None
    try:
        return int(p.string_value)
    except ValueError:
        raise InvalidArgumentError(
            f"parameter '{key}' of model '{config.name}' must be an integer, "
            f"got '{p.string_value}'") from None


def _graph_level(config: ModelConfig) -> ort.GraphOptimizationLevel:
    import onnxruntime as ort

    levels = {-1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
    if config.HasField("optimization") and config.optimization.HasField("graph"):
        return levels.get(config.optimization.graph.level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def session_options(config: ModelConfig) -> ort.SessionOptions:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = _graph_level(config)
    options.log_severity_level = 3  # errors only: warnings about unused providers are noise here
    intra = _int_parameter(config, "intra_op_thread_count")
    if intra is not None and intra > 0:
        options.intra_op_num_threads = intra
    inter = _int_parameter(config, "inter_op_thread_count")
    if inter is not None and inter > 0:
        options.inter_op_num_threads = inter
    mode = _int_parameter(config, "execution_mode")
    if mode == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    arena = _int_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = bool(arena)
    pattern = _int_parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = bool(pattern)
    return options


def providers(kind: str, device_id: int) -> list[Any]:
    """Execution providers for an instance kind, in onnxruntime's (name, options) form."""
    if kind == "GPU":
        return [(CUDA, {"device_id": device_id}), CPU]
    return [CPU]


def create(spec: ModelSpec, instance: InstanceSpec | None = None) -> ort.InferenceSession:
    """A session for one instance (or, with no instance, a CPU session to read the model's I/O)."""
    import onnxruntime as ort

    path = model_path(spec)
    kind, device = (instance.kind, instance.device_id) if instance else ("CPU", 0)
    options = session_options(spec.config)
    if instance is None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), sess_options=options,
                                       providers=providers(kind, device))
    except Exception as exc:  # onnxruntime raises its own exception types for bad models
        raise InvalidArgumentError(
            f"onnxruntime could not load '{path}' for model '{spec.name}': {exc}") from None
    if kind == "GPU" and session.get_providers()[0] != CUDA:
        log.warning("instance '%s' of model '%s' is KIND_GPU but CUDA is not available to "
                    "onnxruntime: it runs on CPU", instance.name if instance else "", spec.name)
    return session


def on_gpu(session: ort.InferenceSession) -> bool:
    return session.get_providers()[0] == CUDA
