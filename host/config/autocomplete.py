"""What Triton's core does to a freshly read config before a model loads: auto-complete of the
backend fields (from the model's files), defaults (NormalizeModelConfig), then validation."""

from __future__ import annotations

from pathlib import Path

from host import devices
from host.config import versions
from host.config.validate import (_validate_instance_groups, _validate_model_config,
                                  validate_io_config)
from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000  # Triton's default max_sequence_idle_microseconds
_DEFAULT_CPU_INSTANCE_COUNT = 2  # Triton's CPU default for backends that scale with instances
_MULTI_INSTANCE_BACKENDS = frozenset({"tensorflow", "onnxruntime"})


def normalize_config(cfg: ModelConfig, model_name: str, *, model_dir: Path | None = None,
                     validate_io: bool = True, validate_groups: bool = True) -> None:
    """Fill in Triton's defaults in place and validate, raising InvalidArgumentError.

    Mirrors Triton's load path: auto-complete backend fields, normalize, validate the config, its
    inputs/outputs and instance groups, and require name == directory name. `model_dir`, when given,
    lets the backend be inferred from the files of the first version directory as Triton does.
    `validate_io=False` defers the input/output checks (Triton runs them after a backend's own
    auto-complete may have added inputs and outputs). Idempotent: after such an auto-complete,
    call it again, as Triton re-normalizes (e.g. to derive preferred batch sizes from a
    max_batch_size the backend supplied). `validate_groups=False` leaves the instance groups'
    checks (GPU ids, counts, profiles) to the load, where Triton makes them
    (ValidateInstanceGroup in backend_model.cc): a model failing them is a failed load of its
    versions, not a model that failed to poll.
    """
    _autofill_backend_fields(cfg, model_name, _first_version_contents(model_dir))
    _fill_defaults(cfg)
    _validate_model_config(cfg)
    if cfg.name != model_name:
        raise InvalidArgumentError(
            f"unexpected directory name '{model_name}' for model '{cfg.name}', "
            "directory name must equal model name")
    _normalize_instance_groups(cfg)
    if validate_groups:
        _validate_instance_groups(cfg)
    if validate_io:
        validate_io_config(cfg)


def _first_version_contents(model_dir: Path | None) -> dict[str, bool] | None:
    """{entry name: is directory} of the model's first subdirectory (Triton's probe), or None."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    subdirs = sorted(p.name for p in Path(model_dir).iterdir() if p.is_dir())
    if not subdirs:
        return None
    return {p.name: p.is_dir() for p in (Path(model_dir) / subdirs[0]).iterdir()}


def _autofill_backend_fields(cfg: ModelConfig, model_name: str,
                             contents: dict[str, bool] | None) -> None:
    """Fill name, platform, backend and default_model_filename as Triton's auto-complete does.

    Each framework in Triton's order: a match on platform, backend or default_model_filename, or
    (when none of platform/filename is given) the model file found in the first version directory.
    """
    if not cfg.name:
        cfg.name = model_name
    files = contents or {}
    has_version = contents is not None

    def found(filename: str, want_dir: bool | None) -> bool:
        """The probe: nothing given, and the version directory holds this file (or directory)."""
        return (has_version and not cfg.platform and not cfg.default_model_filename
                and filename in files and (want_dir is None or files[filename] == want_dir))

    def default_filename(filename: str) -> None:
        if not cfg.default_model_filename:
            cfg.default_model_filename = filename

    # TensorFlow needs a platform; it comes from the file name or the version directory.
    if not cfg.platform and cfg.backend in ("", "tensorflow"):
        if cfg.default_model_filename == "model.savedmodel":
            cfg.platform = "tensorflow_savedmodel"
        elif cfg.default_model_filename == "model.graphdef":
            cfg.platform = "tensorflow_graphdef"
        elif not cfg.default_model_filename and has_version:
            if files.get("model.savedmodel") is True:
                cfg.platform = "tensorflow_savedmodel"
            if files.get("model.graphdef") is False:
                cfg.platform = "tensorflow_graphdef"
    if cfg.platform in ("tensorflow_savedmodel", "tensorflow_graphdef"):
        cfg.backend = cfg.backend or "tensorflow"
        default_filename("model.savedmodel" if cfg.platform == "tensorflow_savedmodel"
                         else "model.graphdef")
        return

    for backend, platform, filename, want_dir in (
            ("tensorrt", "tensorrt_plan", "model.plan", False),
            ("onnxruntime", "onnxruntime_onnx", "model.onnx", None),  # file or directory
            ("openvino", "", "model.xml", None)):
        if not cfg.backend and ((platform and cfg.platform == platform)
                                or cfg.default_model_filename == filename
                                or found(filename, want_dir)):
            cfg.backend = backend
        if cfg.backend == backend:
            if platform and not cfg.platform:
                cfg.platform = platform
            default_filename(filename)
            return

    if not cfg.backend:
        if cfg.platform in ("pytorch_libtorch", "libtorch", "torch_aoti") or \
                cfg.default_model_filename in ("model.pt", "model.pt2"):
            cfg.backend = "pytorch"
        elif found("model.pt", None):
            if not files["model.pt"]:
                cfg.backend, cfg.platform = "pytorch", "pytorch_libtorch"
        elif found("model.pt2", False):
            cfg.backend, cfg.platform = "pytorch", "torch_aoti"
    if cfg.backend == "pytorch":
        if not cfg.platform:
            cfg.platform = "pytorch_libtorch"
            default_filename("model.pt")
        elif cfg.platform == "torch_aoti":
            default_filename("model.pt2")
        return

    if not cfg.backend and (cfg.default_model_filename == "model.py" or found("model.py", None)):
        cfg.backend = "python"
    if cfg.backend == "python":
        default_filename("model.py")
        return

    # Custom backend: nothing given at all, so the model name must read "<anything>.<backend>".
    if not cfg.backend and not cfg.platform and not cfg.default_model_filename:
        if "." not in model_name:
            raise InvalidArgumentError(
                f"Invalid model name: Could not determine backend for model '{model_name}' with "
                "no backend in model configuration. Expected model name of the form "
                "'model.<backend_name>'.")
        cfg.backend = model_name.split(".", 1)[1]
        cfg.default_model_filename = "model." + cfg.backend


def _fill_defaults(cfg: ModelConfig) -> None:
    """Triton's NormalizeModelConfig: version policy, preferred batch sizes, idle time, pinning."""
    versions.default_policy(cfg)
    if cfg.HasField("dynamic_batching"):
        if not cfg.dynamic_batching.preferred_batch_size and cfg.max_batch_size > 0:
            cfg.dynamic_batching.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        sequence = cfg.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if sequence.HasField("oldest"):
            if not sequence.oldest.preferred_batch_size and cfg.max_batch_size > 0:
                sequence.oldest.preferred_batch_size.append(cfg.max_batch_size)
    if not cfg.HasField("ensemble_scheduling"):
        if not cfg.optimization.HasField("input_pinned_memory"):
            cfg.optimization.input_pinned_memory.enable = True
        if not cfg.optimization.HasField("output_pinned_memory"):
            cfg.optimization.output_pinned_memory.enable = True


def normalize_instance_groups(cfg: ModelConfig) -> None:
    """Triton's NormalizeInstanceGroup then ValidateInstanceGroup, alone (an in-place update of
    a loaded model's instance groups: TritonModel::UpdateInstanceGroup)."""
    _normalize_instance_groups(cfg)
    _validate_instance_groups(cfg)


def _normalize_instance_groups(cfg: ModelConfig) -> None:
    """Triton's NormalizeInstanceGroup (host.devices: the GPUs here; ensembles have no instances)."""
    if cfg.HasField("ensemble_scheduling"):
        return
    if not cfg.instance_group:
        cfg.instance_group.add(name=cfg.name)  # Triton names the default group after the model
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            # a GPU group when every GPU it names (or, naming none, any GPU) is here
            gpus = devices.supported_gpus()
            on_gpu = bool(gpus) and all(g in gpus for g in group.gpus)
            group.kind = ModelInstanceGroup.KIND_GPU if on_gpu else ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = (_DEFAULT_CPU_INSTANCE_COUNT
                           if group.kind == ModelInstanceGroup.KIND_CPU
                           and cfg.backend in _MULTI_INSTANCE_BACKENDS else 1)
        if group.kind == ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(devices.supported_gpus()))  # all of them, as Triton does
