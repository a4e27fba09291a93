"""Which backend serves a model: Triton's platform names, and the model files that name a backend."""

from __future__ import annotations

from pathlib import Path

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

# Platform -> backend that serves it, as Triton maps them (the one table of this mapping).
# "libtorch" is Triton's alternative spelling of pytorch_libtorch.
PLATFORM_BACKENDS: dict[str, str] = {
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "ensemble": "ensemble",
}
ENSEMBLE_PLATFORM = "ensemble"

# Backends Triton knows by name: for these, platform and backend must agree.
KNOWN_BACKENDS = frozenset(PLATFORM_BACKENDS.values()) - {ENSEMBLE_PLATFORM}

# Model file -> the backend it names (the one table of this mapping), in the order a model
# without a config.pbtxt is probed (`infer_backend`). Auto-complete (host.config.autocomplete)
# follows Triton's own probe of the first version folder, which also sets platforms.
MODEL_FILES: tuple[tuple[str, str], ...] = (
    ("model.py", "python"),
    ("model.onnx", "onnxruntime"),
    ("model.pt", "pytorch"),
    ("model.plan", "tensorrt"),
    ("model.savedmodel", "tensorflow"),
    ("model.graphdef", "tensorflow"),
)


def backend_for(cfg: ModelConfig) -> str:
    """Backend serving the model: `backend` if set, else the one Triton maps `platform` to."""
    return cfg.backend or PLATFORM_BACKENDS.get(cfg.platform, "")


def instance_kind_name(kind_enum: int) -> str:
    """`KIND_CPU` -> "CPU" (also "GPU", "MODEL", "AUTO"), the names Triton's APIs print."""
    try:
        return ModelInstanceGroup.Kind.Name(kind_enum).removeprefix("KIND_")
    except ValueError:
        raise InvalidArgumentError(f"unknown instance group kind {kind_enum}") from None


def infer_backend(path: Path) -> str:
    """Best guess of a model's backend from its files, for models without a config.pbtxt."""
    for version in sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit()),
                          key=lambda p: int(p.name), reverse=True):
        for filename, backend in MODEL_FILES:
            if (version / filename).exists():
                return backend
    return ""
