"""Model configuration: parsing config.pbtxt and JSON, Triton's JSON form, defaults, validation.

The configuration is the `inference.ModelConfig` protobuf (host/proto/model_config.proto, wire-
compatible with Triton's). `normalize_config` reproduces what Triton's core does to a freshly read
config before a model loads (auto-complete of backend fields, defaults, validation), so that the
config a client reads back from us is the one Triton would have shown, and a config Triton rejects
is rejected here with Triton's message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

CONFIG_FILENAME = "config.pbtxt"

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
_KNOWN_BACKENDS = frozenset(PLATFORM_BACKENDS.values()) - {ENSEMBLE_PLATFORM}

SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000  # Triton's default max_sequence_idle_microseconds
_DEFAULT_CPU_INSTANCE_COUNT = 2  # Triton's CPU default for backends that scale with instances
_MULTI_INSTANCE_BACKENDS = frozenset({"tensorflow", "onnxruntime"})

_INT64_TYPES = frozenset({
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64,
})

_Control = ModelSequenceBatching.Control
_FALSE_TRUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32,
                 DataType.TYPE_INT32, DataType.TYPE_STRING)


# --- parsing and printing ---------------------------------------------------------------------

def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse config.pbtxt text; errors name `source` so a user can find the broken file."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise InvalidArgumentError(f"failed to read text proto from {source}: {exc}") from None
    return config


def load_config_file(model_dir: Path, custom_name: str = "") -> ModelConfig | None:
    """Read `<model_dir>/config.pbtxt`; None when absent (Triton may then auto-complete one).

    With `custom_name` (--model-config-name), `<model_dir>/configs/<custom_name>.pbtxt` is read
    instead where it exists, as Triton does.
    """
    path = Path(model_dir) / CONFIG_FILENAME
    if custom_name:
        custom = Path(model_dir) / "configs" / f"{custom_name}.pbtxt"
        if custom.is_file():
            path = custom
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, a directory, not UTF-8
        raise InvalidArgumentError(f"failed to read text proto from {path}: {exc}") from None
    return parse_config_text(text, str(path))


def config_from_json(data: str | bytes | dict) -> ModelConfig:
    """Parse a JSON config (the "load with config override" form), as Triton's JsonToModelConfig.

    Unknown fields are errors; enum names are matched case-insensitively, as Triton does.
    """
    try:
        if isinstance(data, (str, bytes, bytearray)):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise InvalidArgumentError(
                f"model configuration JSON must be an object, got {type(data).__name__}")
        return json_format.ParseDict(_upper_enum_names(data, ModelConfig.DESCRIPTOR), ModelConfig())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"failed to parse model configuration JSON: {exc}") from None


def config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The JSON form of Triton's `GET /v2/models/<m>/config`.

    Proto field names, enum names, fields without presence printed with their defaults, and
    64-bit integers as JSON numbers (protobuf's JSON mapping quotes them; Triton unquotes them).
    """
    doc = json_format.MessageToDict(
        cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _walk_json(doc, cfg.DESCRIPTOR, _unquote_int64)


def _unquote_int64(field: FieldDescriptor, value: Any) -> Any:
    """Turn a quoted 64-bit integer back into a number."""
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


def _upper_enum_names(doc: dict, descriptor: Descriptor) -> dict:
    """Copy of a JSON config whose unknown lowercase enum names are upper-cased (Triton's rule)."""
    def fix(field: FieldDescriptor, value: Any) -> Any:
        if (field.enum_type is not None and isinstance(value, str)
                and value not in field.enum_type.values_by_name
                and value.upper() in field.enum_type.values_by_name):
            return value.upper()
        return value
    return _walk_json(doc, descriptor, fix)


def _walk_json(doc: Any, descriptor: Descriptor,
               fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Rebuild a JSON object of message `descriptor`, passing every scalar through `fix`.

    Follows nested messages, repeated fields and map values (map keys stay strings: JSON object
    keys can't be numbers). Keys may be proto names or lowerCamel JSON names. Keys come out in
    the .proto's declaration order, as Triton prints them.
    """
    if not isinstance(doc, dict):
        return doc  # malformed input: leave it for json_format to report
    out = {}
    for field in descriptor.fields:
        for key in (field.name, field.json_name):
            if key in doc and key not in out:
                out[key] = _walk_field(field, doc[key], fix)
    for key, value in doc.items():  # unknown keys: kept for json_format to report
        out.setdefault(key, value)
    return out


def _walk_field(field: FieldDescriptor, value: Any,
                fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Apply `fix` to one field's JSON value (map, repeated, message or scalar)."""
    message_type = field.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            return value
        value_field = message_type.fields_by_name["value"]
        return {k: _walk_field(value_field, v, fix) for k, v in value.items()}
    if _is_repeated(field) and isinstance(value, list):
        return [_walk_single(field, v, fix) for v in value]
    return _walk_single(field, value, fix)


def _walk_single(field: FieldDescriptor, value: Any,
                 fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Apply `fix` to one non-repeated value of `field`."""
    if field.message_type is not None:
        return _walk_json(value, field.message_type, fix)
    return fix(field, value)


def _is_repeated(field: FieldDescriptor) -> bool:
    """Repeated-ness across protobuf versions (`label` is deprecated in newer runtimes)."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


# --- backend and instance kind names ----------------------------------------------------------

def backend_for(cfg: ModelConfig) -> str:
    """Backend serving the model: `backend` if set, else the one Triton maps `platform` to."""
    return cfg.backend or PLATFORM_BACKENDS.get(cfg.platform, "")


def instance_kind_name(kind_enum: int) -> str:
    """`KIND_CPU` -> "CPU" (also "GPU", "MODEL", "AUTO"), the names Triton's APIs print."""
    try:
        return ModelInstanceGroup.Kind.Name(kind_enum).removeprefix("KIND_")
    except ValueError:
        raise InvalidArgumentError(f"unknown instance group kind {kind_enum}") from None


# --- normalization ----------------------------------------------------------------------------

def normalize_config(cfg: ModelConfig, model_name: str, *, model_dir: Path | None = None,
                     validate_io: bool = True) -> None:
    """Fill in Triton's defaults in place and validate, raising InvalidArgumentError.

    Mirrors Triton's load path: auto-complete backend fields, normalize, validate the config, its
    inputs/outputs and instance groups, and require name == directory name. `model_dir`, when given,
    lets the backend be inferred from the files of the first version directory as Triton does.
    `validate_io=False` defers the input/output checks (Triton runs them after a backend's own
    auto-complete may have added inputs and outputs). Idempotent: after such an auto-complete,
    call it again, as Triton re-normalizes (e.g. to derive preferred batch sizes from a
    max_batch_size the backend supplied).
    """
    _autofill_backend_fields(cfg, model_name, _first_version_contents(model_dir))
    _fill_defaults(cfg)
    _validate_model_config(cfg)
    if cfg.name != model_name:
        raise InvalidArgumentError(
            f"unexpected directory name '{model_name}' for model '{cfg.name}', "
            "directory name must equal model name")
    _normalize_instance_groups(cfg)
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
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
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


def _normalize_instance_groups(cfg: ModelConfig) -> None:
    """Triton's NormalizeInstanceGroup on a host without GPUs (ensembles have no instances)."""
    if cfg.HasField("ensemble_scheduling"):
        return
    if not cfg.instance_group:
        cfg.instance_group.add(name=cfg.name)  # Triton names the default group after the model
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            group.kind = ModelInstanceGroup.KIND_CPU  # no supported GPUs here
        if group.count < 1:
            group.count = (_DEFAULT_CPU_INSTANCE_COUNT
                           if group.kind == ModelInstanceGroup.KIND_CPU
                           and cfg.backend in _MULTI_INSTANCE_BACKENDS else 1)


def _validate_model_config(cfg: ModelConfig) -> None:
    """Triton's ValidateModelConfig (everything but inputs/outputs and instance groups)."""
    name = cfg.name
    if not name:
        raise InvalidArgumentError("model configuration must specify 'name'")
    if not cfg.backend:
        if cfg.platform != ENSEMBLE_PLATFORM:
            raise InvalidArgumentError(f"unexpected platform type '{cfg.platform}' for {name}")
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise InvalidArgumentError(
            f"Ensemble model '{name}' must have platform type '{cfg.platform}' and empty "
            "backend type")
    if cfg.backend in _KNOWN_BACKENDS and PLATFORM_BACKENDS.get(cfg.platform) != cfg.backend:
        raise InvalidArgumentError(
            f"unexpected 'platform' and 'backend' pair, got:{cfg.platform}, {cfg.backend}")
    if cfg.max_batch_size < 0:
        raise InvalidArgumentError(f"'max_batch_size' must be non-negative value for {name}")
    if not cfg.HasField("version_policy"):
        raise InvalidArgumentError(f"must specify 'version policy' for {name}")
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if cfg.HasField("sequence_batching"):
        _validate_sequence_batching(cfg)
    if cfg.HasField("ensemble_scheduling"):
        _validate_ensemble(cfg)
    elif cfg.platform == ENSEMBLE_PLATFORM:
        raise InvalidArgumentError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is "
            f"{ENSEMBLE_PLATFORM}")
    if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
        raise InvalidArgumentError(
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache.")
    if cfg.HasField("model_metrics"):
        _validate_model_metrics(cfg)


def _check_preferred_sizes(sizes: Any, max_batch_size: int, what: str, name: str) -> None:
    """Preferred batch sizes must lie in [1, max_batch_size]."""
    for size in sizes:
        if size <= 0:
            raise InvalidArgumentError(f"{what} must be positive for {name}")
        if size > max_batch_size:
            raise InvalidArgumentError(f"{what} must be <= max batch size for {name}")


def _validate_dynamic_batching(cfg: ModelConfig) -> None:
    """Preferred sizes, priority levels, and preserve_ordering's incompatibilities."""
    batching, name = cfg.dynamic_batching, cfg.name
    _check_preferred_sizes(batching.preferred_batch_size, cfg.max_batch_size,
                           "dynamic batching preferred size", name)
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            raise InvalidArgumentError(
                f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise InvalidArgumentError(
                    f"priority queue policy must have priority level in range [1, {levels}] "
                    f"for {name}")
    if batching.preserve_ordering:
        if levels > 1:
            raise InvalidArgumentError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if (policy.default_timeout_microseconds != 0
                    and policy.timeout_action == ModelQueuePolicy.DELAY):
                raise InvalidArgumentError(
                    "Queue policy can not have DELAY as timeout action when 'preserve_ordering' "
                    f"is true for {name}")


def _validate_sequence_batching(cfg: ModelConfig) -> None:
    """Response cache exclusion, control tensors, and the strategy's limits."""
    batching, name = cfg.sequence_batching, cfg.name
    if cfg.response_cache.enable:
        raise InvalidArgumentError(
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache.")
    _validate_sequence_controls(batching, name)
    if batching.HasField("oldest"):
        _check_preferred_sizes(batching.oldest.preferred_batch_size, cfg.max_batch_size,
                               "sequence batching preferred batch size", name)
    if batching.HasField("direct"):
        if not 0.0 <= batching.direct.minimum_slot_utilization <= 1.0:
            raise InvalidArgumentError(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for "
                + name)


def _validate_sequence_controls(batching: ModelSequenceBatching, name: str) -> None:
    """Control tensors: named, one per tensor, one per kind, well-formed false/true values."""
    tensors: set[str] = set()
    for control_input in batching.control_input:
        if not control_input.name:
            raise InvalidArgumentError(
                f"sequence batching control tensor must have a name for {name}")
        if control_input.name in tensors:
            raise InvalidArgumentError(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {name}")
        tensors.add(control_input.name)
    kinds: set[int] = set()
    for control_input in batching.control_input:
        for control in control_input.control:
            kind = _Control.Kind.Name(control.kind)
            if control.kind in kinds:
                raise InvalidArgumentError(
                    f"sequence batching specifies multiple {kind} tensors for {name}")
            kinds.add(control.kind)
            given = [f for f in _FALSE_TRUE_FIELDS if len(getattr(control, f))]
            if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise InvalidArgumentError(
                        "sequence batching must not specify either 'int32_false_true', "
                        f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
                if control.data_type not in _CORRID_TYPES:
                    raise InvalidArgumentError(
                        f"unexpected data type for control {kind} for {name}. Allowed data "
                        "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and "
                        "TYPE_STRING")
            elif not given:
                raise InvalidArgumentError(
                    "sequence batching must specify either 'int32_false_true', "
                    f"'fp32_false_true' or 'bool_false_true' for {kind} for {name}")
            elif len(given) > 1:
                raise InvalidArgumentError(
                    "sequence batching specifies more than one from 'int32_false_true', "
                    f"'fp32_false_true' and 'bool_false_true' for {kind} for {name}")
            elif len(getattr(control, given[0])) != 2:
                raise InvalidArgumentError(
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for "
                    f"{kind} for {name}")


def _validate_ensemble(cfg: ModelConfig) -> None:
    """Ensemble shape rules and data flow: every tensor written once, consumed, and reachable."""
    name = cfg.name
    if cfg.platform != ENSEMBLE_PLATFORM:
        raise InvalidArgumentError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}")
    if cfg.instance_group:
        raise InvalidArgumentError(f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        raise InvalidArgumentError(f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        raise InvalidArgumentError(f"model_warmup can not be specified for ensemble '{name}'")
    steps = cfg.ensemble_scheduling.step
    if not steps:
        raise InvalidArgumentError(f"must specify 'step' for ensemble '{name}'")

    written: set[str] = set()
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise InvalidArgumentError(
                    f"must specify '{field}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in written:
                raise InvalidArgumentError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}")
            written.add(tensor)
        consumed.update(step.input_map.values())

    tensors = written | consumed
    ready = set()
    for tensor in cfg.input:
        if tensor.name not in tensors:  # (the unbalanced quote is Triton's exact text)
            raise InvalidArgumentError(
                f"ensemble input '{tensor.name}' for ensemble {name}' is not used")
        ready.add(tensor.name)
    pending = list(steps)
    while True:  # a step runs once all its inputs are ready; its outputs then are
        runnable = [s for s in pending if set(s.input_map.values()) <= ready]
        if not runnable:
            break
        for step in runnable:
            ready.update(step.output_map.values())
            pending.remove(step)
    outputs = {tensor.name for tensor in cfg.output}
    for tensor in cfg.output:
        if tensor.name not in tensors:
            raise InvalidArgumentError(
                f"ensemble output '{tensor.name}' for ensemble {name}' is not used")
        if tensor.name not in ready:
            raise InvalidArgumentError(
                f"output '{tensor.name}' for ensemble '{name}' is not written"
                + _unconnected_source(tensor.name, steps, ready))
    for tensor in sorted(tensors - outputs):
        if tensor not in ready or tensor not in consumed:
            raise InvalidArgumentError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _unconnected_source(tensor: str, steps: Any, ready: set[str]) -> str:
    """Triton's hint for an unwritten output: the furthest not-ready tensor it depends on."""
    producer_inputs = {}
    for step in steps:
        for written in step.output_map.values():
            producer_inputs[written] = [step.input_map[k] for k in sorted(step.input_map)]
    seen: set[str] = set()
    last = tensor
    sources = producer_inputs.get(tensor, [])
    while sources:
        source = next((t for t in sources if t not in ready and t not in seen), None)
        if source is None:
            break
        seen.add(source)
        last = source
        sources = producer_inputs.get(source, [])
    if last == tensor:
        return ""
    return f": at least one of its depending tensors, '{last}', is not connected"


def _validate_model_metrics(cfg: ModelConfig) -> None:
    """Each metric control names a metric family and gives non-empty histogram buckets."""
    for control in cfg.model_metrics.metric_control:
        if not control.HasField("metric_identifier"):
            raise InvalidArgumentError("metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise InvalidArgumentError("metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise InvalidArgumentError("metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            raise InvalidArgumentError("histogram options must specify non-empty 'buckets'")


def validate_io_config(cfg: ModelConfig) -> None:
    """Triton's ValidateModelIOConfig: each input/output, then batch inputs/outputs.

    Also rejects a tensor name used twice among the inputs or among the outputs (Triton's core
    would silently keep only one of them).
    """
    try:
        for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
            seen: set[str] = set()
            for tensor in tensors:
                _validate_io(tensor, kind, cfg)
                if tensor.name in seen:
                    raise InvalidArgumentError(
                        f"model {kind} '{tensor.name}' is specified more than once")
                seen.add(tensor.name)
        _validate_batch_io(cfg)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc.message} for {cfg.name}") from None


def _validate_io(io: ModelInput | ModelOutput, kind: str, cfg: ModelConfig) -> None:
    """Name, data type and dims of one input or output, its reshape, and format rules."""
    prefix = f"model {kind} "
    if not io.name:
        raise InvalidArgumentError(prefix + "must specify 'name'")
    prefix += f"'{io.name}' "
    if io.data_type == DataType.TYPE_INVALID:
        raise InvalidArgumentError(prefix + "must specify 'data_type'")
    if not io.dims:
        raise InvalidArgumentError(prefix + "must specify 'dims'")
    if io.HasField("reshape") and not io.reshape.shape and cfg.max_batch_size == 0:
        raise InvalidArgumentError(
            prefix + "cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported")
    if any(d < 1 and d != -1 for d in io.dims):
        raise InvalidArgumentError(
            prefix + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension")
    if io.HasField("reshape"):
        _validate_reshape(list(io.dims), list(io.reshape.shape), prefix)
    if kind == "input" and io.format != ModelInput.FORMAT_NONE and len(io.dims) != 3:
        raise InvalidArgumentError("model input NHWC/NCHW require 3 dims")
    if io.is_shape_tensor and cfg.platform != "tensorrt_plan":
        raise InvalidArgumentError("shape tensors are only supported for TensorRT platform")
    if io.is_non_linear_format_io:
        if cfg.platform != "tensorrt_plan":
            raise InvalidArgumentError(
                "Non-linear IO format is only supported for the TensorRT platform")
        if len(io.dims) != 3:
            raise InvalidArgumentError(f"Non-linear IO format {kind} requires 3 dims")


def _validate_reshape(dims: list[int], shape: list[int], prefix: str) -> None:
    """A reshape must hold as many elements as dims, segment by segment around each -1.

    An empty reshape (a scalar) is allowed for dims of one element.
    """
    if any(d < 1 and d != -1 for d in shape):
        raise InvalidArgumentError(
            prefix + "reshape dimensions must be integer >= 1, or -1 to indicate a "
            "variable-size dimension")
    if not shape:
        if -1 in dims or _product(dims) != 1:
            raise InvalidArgumentError(prefix + "has different size for dims and reshape")
        return
    dims_segments, shape_segments = _segments(dims), _segments(shape)
    if len(dims_segments) != len(shape_segments):
        if len(dims_segments) == 1 or len(shape_segments) == 1:
            raise InvalidArgumentError(prefix + "has different size for dims and reshape")
        raise InvalidArgumentError(
            prefix + "has different number of variable-size dimensions for dims and reshape")
    if dims_segments != shape_segments:
        raise InvalidArgumentError(prefix + "has different size for dims and reshape")


def _segments(shape: list[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable-size (-1) ones."""
    counts, current = [], 1
    for dim in shape:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def _product(shape: list[int]) -> int:
    """Element count of a fully known shape."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def _validate_batch_io(cfg: ModelConfig) -> None:
    """Batch inputs/outputs: one known source input each, valid types, known unique targets."""
    inputs = {tensor.name for tensor in cfg.input}
    outputs = {tensor.name for tensor in cfg.output}
    for batch_input in cfg.batch_input:
        if len(batch_input.source_input) != 1:
            raise InvalidArgumentError(
                f"batch input kind '{batch_input.Kind.Name(batch_input.kind)}' expects 1 source "
                f"input, got {len(batch_input.source_input)}")
        if batch_input.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise InvalidArgumentError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        _check_sources(batch_input.source_input, inputs)
    for batch_output in cfg.batch_output:
        if len(batch_output.source_input) != 1:
            raise InvalidArgumentError(
                f"batch output kind '{batch_output.Kind.Name(batch_output.kind)}' expects 1 "
                f"source input, got {len(batch_output.source_input)}")
        _check_sources(batch_output.source_input, inputs)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise InvalidArgumentError(f"unknown target output name '{target}'")
            if target in targets:
                raise InvalidArgumentError(
                    f"target output name '{target}' can only be specified once")
            targets.add(target)


def _check_sources(sources: Any, inputs: set[str]) -> None:
    """Every source_input of a batch input/output must name a model input."""
    for source in sources:
        if source not in inputs:
            raise InvalidArgumentError(f"unknown source input name '{source}'")


def _validate_instance_groups(cfg: ModelConfig) -> None:
    """Triton's ValidateInstanceGroup, except that KIND_GPU is accepted as given (see report)."""
    if cfg.HasField("ensemble_scheduling"):
        return
    if not cfg.instance_group:
        raise InvalidArgumentError(f"must specify one or more 'instance group's for {cfg.name}")
    for group in cfg.instance_group:
        where = f"instance group {group.name} of model {cfg.name}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            raise InvalidArgumentError(f"{where} has unexpected kind KIND_AUTO")
        if group.kind in (ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_MODEL) \
                and group.gpus:
            raise InvalidArgumentError(
                f"{where} has kind {ModelInstanceGroup.Kind.Name(group.kind)} but specifies one "
                "or more GPUs")
        if group.profile and cfg.platform != "tensorrt_plan":
            raise InvalidArgumentError(
                f"{where} and platform {cfg.platform} specifies profile field which is only "
                "supported for TensorRT models")
        for profile in group.profile:
            if not profile.isdigit():
                raise InvalidArgumentError(
                    f"{where} and platform {cfg.platform} specifies invalid profile {profile}. "
                    "The field should contain the string representation of a non-negative "
                    "integer.")
