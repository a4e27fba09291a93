"""Triton's checks of a model configuration (ValidateModelConfig, inputs and outputs, batching,
sequences, ensembles, instance groups), with Triton's messages."""

from __future__ import annotations

from typing import Any

from host import datatypes, devices
from host.config.platforms import ENSEMBLE_PLATFORM, KNOWN_BACKENDS, PLATFORM_BACKENDS
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

_Control = ModelSequenceBatching.Control
_FALSE_TRUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32,
                 DataType.TYPE_INT32, DataType.TYPE_STRING)


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
    if cfg.backend in KNOWN_BACKENDS and PLATFORM_BACKENDS.get(cfg.platform) != cfg.backend:
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
        if -1 in dims or datatypes.element_count(dims) != 1:
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
    """Triton's ValidateInstanceGroup: a GPU group names GPUs that are here (host.devices)."""
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
        if group.kind == ModelInstanceGroup.KIND_GPU:
            _check_gpus(group.gpus, where)
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


def _check_gpus(gpus: Any, where: str) -> None:
    supported = devices.supported_gpus()
    if not gpus:
        raise InvalidArgumentError(
            f"{where} has kind KIND_GPU but "
            + ("specifies no GPUs" if supported else "no GPUs are available"))
    for gpu in gpus:
        if gpu not in supported:
            raise InvalidArgumentError(
                f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs with at least the "
                f"minimum required CUDA compute compatibility of {devices.min_capability():f} "
                f"are: {', '.join(str(g) for g in sorted(supported))}")
