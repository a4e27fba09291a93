"""What modelhost does with every field of the model configuration: nothing is silently ignored.

`SUPPORT` classifies each field of `inference.ModelConfig` (dotted path, as in config.pbtxt):

- IMPLEMENTED: honoured as Triton honours it;
- REFUSED: a model that sets it does not load, with a message naming the field (`check`);
- NO_EFFECT: accepted, and documented as having no effect here (docs/config_support.md says why).

A "refused" or "no effect" entry covers the fields under it (unless a deeper entry says
otherwise); an "implemented" one does not, so every part of an implemented field is named.
tests/test_config_support.py walks the protobuf descriptor, so a field added to
model_config.proto fails the test until it is classified here; docs/config_support.md is
generated from this table (`python -m host.config_support`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig

IMPLEMENTED, REFUSED, NO_EFFECT = "implemented", "refused", "no effect"


class Support(NamedTuple):
    status: str
    note: str


def _impl(note: str = "") -> Support:
    return Support(IMPLEMENTED, note)


def _refused(note: str) -> Support:
    return Support(REFUSED, note)


def _none(note: str) -> Support:
    return Support(NO_EFFECT, note)


_GPU_ONLY = "applies to GPU execution; instances here run on the CPU"

SUPPORT: dict[str, Support] = {
    "name": _impl(),
    "platform": _impl("mapped to a backend as Triton maps it"),
    "backend": _impl("a backend plugin, or a native `libtriton_<backend>.so`"),
    "runtime": _refused("a backend library or python runtime other than the backend's own "
                        "(`libtriton_<backend>.so`, `model.py`) is not supported"),
    "version_policy": _impl(),
    "max_batch_size": _impl(),
    "input": _impl("name, data_type, dims, optional: validated on every request"),
    "input.format": _none("informational (image layout), as in Triton"),
    "input.reshape": _impl("the backend sees the reshaped tensor"),
    "input.is_shape_tensor": _impl("refused at load except for TensorRT models, as Triton does"),
    "input.allow_ragged_batch": _impl("the dynamic and sequence batchers put requests of different "
                                      "shapes in one execute only where every input that differs "
                                      "allows it; the python backend gets a list of requests, the "
                                      "onnxruntime and pytorch backends one flat vector of every "
                                      "request's elements, as Triton's"),
    "input.is_non_linear_format_io": _impl("refused at load except for TensorRT models, as Triton "
                                           "does"),
    "output": _impl("name, data_type, dims: responses are checked against them"),
    "output.reshape": _impl("the backend's output is reshaped to dims for the client"),
    "output.label_filename": _impl("labels of the classification extension"),
    "output.is_shape_tensor": _impl("refused at load except for TensorRT models"),
    "output.is_non_linear_format_io": _impl("refused at load except for TensorRT models"),
    "batch_input": _impl("as Triton's backend utilities: the onnxruntime and pytorch backends get "
                         "them as more model inputs; a native backend computes its own; the "
                         "python backend ignores them, as Triton's does"),
    "batch_output": _impl("BATCH_SCATTER_WITH_INPUT_SHAPE in the onnxruntime and pytorch "
                          "backends; a native backend does its own; the python backend ignores "
                          "them, as Triton's does"),
    "optimization": _none("backend tuning hints; each sub-field below"),
    "optimization.graph": _impl("onnxruntime's graph optimization level; other backends ignore "
                                "it, as Triton's do"),
    "optimization.priority": _none("Triton uses it for GPU stream priority"),
    "optimization.cuda": _none(_GPU_ONLY),
    "optimization.execution_accelerators.gpu_execution_accelerator": _none(_GPU_ONLY),
    "optimization.execution_accelerators.cpu_execution_accelerator": _refused(
        "CPU execution accelerators (OpenVINO) are not supported"),
    "optimization.input_pinned_memory": _none("pinned memory speeds up copies to a GPU; " + _GPU_ONLY),
    "optimization.output_pinned_memory": _none("pinned memory speeds up copies from a GPU; " + _GPU_ONLY),
    "optimization.gather_kernel_buffer_threshold": _none(_GPU_ONLY),
    "optimization.eager_batching": _none("the dynamic batcher forms a batch only when an instance "
                                         "is free to run it"),
    "dynamic_batching": _impl(),
    "dynamic_batching.preserve_ordering": _impl(
        "responses leave in the order the batcher took their requests, as Triton's: with several "
        "instances a batch that finishes early waits for the batches taken before it"),
    "dynamic_batching.priority_levels": _impl(
        "levels served lowest first; a request's `priority` picks its level (host/queue_policy.py)"),
    "dynamic_batching.default_priority_level": _impl(
        "the level of requests without a valid `priority`"),
    "dynamic_batching.default_queue_policy": _impl(
        "queue timeout, timeout action, timeout override and max queue size"),
    "dynamic_batching.priority_queue_policy": _impl(
        "each level's own queue policy, as default_queue_policy"),
    "sequence_batching": _impl("see docs/sequences.md"),
    "sequence_batching.oldest.preserve_ordering": _none(
        "one sequence's requests already run and answer in order"),
    "sequence_batching.state.use_same_buffer_for_input_output": _impl(
        "native backends write the next state in place, into the input state's memory"),
    "sequence_batching.state.use_growable_memory": _refused(
        "needs KIND_GPU instances (as in Triton)"),
    "sequence_batching.iterative_sequence": _impl(
        "requests without a correlation id start their own sequence; a native backend reschedules "
        "them (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)"),
    "ensemble_scheduling": _impl("see the ensemble documentation"),
    "instance_group": _impl(),
    "instance_group.rate_limiter": _impl("honoured with --rate-limit=execution_count; ignored "
                                         "with the default --rate-limit=off, as in Triton"),
    "instance_group.gpus": _impl("device ids handed to the backend"),
    "instance_group.secondary_devices": _refused("secondary devices (NVDLA) are not supported"),
    "instance_group.profile": _impl("refused at load except for TensorRT models"),
    "instance_group.passive": _impl("loaded and initialized, never scheduled; a model whose "
                                    "instances are all passive is refused"),
    "instance_group.host_policy": _impl("name handed to native backends; no NUMA placement"),
    "default_model_filename": _impl(),
    "cc_model_filenames": _none("per-GPU model files: " + _GPU_ONLY),
    "metric_tags": _refused("extra labels on a model's metrics (Triton's `_<key>` labels) are not "
                            "supported"),
    "parameters": _impl("handed to the backend"),
    "model_warmup": _impl("samples run on each instance as it loads; a failing sample fails the "
                          "load, with Triton's text (host.warmup)"),
    "model_warmup.name": _impl("named in the warmup log lines and errors"),
    "model_warmup.batch_size": _impl("requests of one row each in one execute; 0 skips the sample"),
    "model_warmup.inputs": _impl("zero_data, random_data (empty strings for BYTES) or "
                                 "input_data_file from <model>/warmup/"),
    "model_warmup.count": _impl("runs of the sample (at least one)"),
    "model_operations": _refused("custom operation libraries are not supported"),
    "model_transaction_policy": _impl("decoupled models answer over streams"),
    "model_repository_agents": _impl("agents from --repoagent-directory, with Triton's actions "
                                     "(host.native.repoagent)"),
    "model_repository_agents.agents": _impl("run in order, each on the files the one before "
                                            "left"),
    "model_repository_agents.agents.name": _impl("<dir>/<name>/libtritonrepoagent_<name>.so"),
    "model_repository_agents.agents.parameters": _impl("TRITONREPOAGENT_ModelParameter*"),
    "response_cache": _impl("refused for sequence and decoupled models, as in Triton"),
    "model_metrics": _impl("buckets of nv_inference_first_response_histogram_ms for this model "
                           "(with --metrics-config histogram_latencies=true); other families are "
                           "warned about, as in Triton"),
}



def _fields(parent: str, names: str, note: str = "") -> dict[str, Support]:
    return {f"{parent}.{name}": _impl(note) for name in names.split()}


# The parts of implemented fields, each named: an "implemented" entry does not cover fields under
# it (a new one must be classified), while "refused" and "no effect" entries cover their subtree.
SUPPORT.update({
    **_fields("version_policy", "latest latest.num_versions all specific specific.versions"),
    **_fields("input", "name data_type dims optional reshape.shape"),
    **_fields("output", "name data_type dims reshape.shape"),
    **_fields("batch_input", "kind target_name data_type source_input"),
    **_fields("batch_output", "kind target_name source_input"),
    "optimization.graph.level": _impl("onnxruntime"),
    "dynamic_batching.preferred_batch_size": _impl(
        "as Triton's GetDynamicBatch: a preferred size that the queued requests (in order, "
        "expired DELAY requests last) can form runs at once; otherwise the batch waits up to "
        "`max_queue_delay_microseconds` from its oldest request"),
    **_fields("dynamic_batching", "max_queue_delay_microseconds"),
    **_fields("dynamic_batching.default_queue_policy", "timeout_action "
              "default_timeout_microseconds allow_timeout_override max_queue_size"),
    **_fields("sequence_batching", "direct direct.max_queue_delay_microseconds "
              "direct.minimum_slot_utilization oldest oldest.max_candidate_sequences "
              "oldest.preferred_batch_size oldest.max_queue_delay_microseconds "
              "max_sequence_idle_microseconds control_input control_input.name "
              "control_input.control control_input.control.kind "
              "control_input.control.int32_false_true control_input.control.fp32_false_true "
              "control_input.control.bool_false_true control_input.control.data_type state "
              "state.input_name state.output_name state.data_type state.dims state.initial_state "
              "state.initial_state.data_type state.initial_state.dims "
              "state.initial_state.zero_data state.initial_state.data_file "
              "state.initial_state.name"),
    **_fields("ensemble_scheduling", "step step.model_name step.model_version step.input_map "
              "step.output_map step.model_namespace max_inflight_requests"),
    **_fields("instance_group", "name kind count"),
    **_fields("instance_group.rate_limiter", "resources resources.name resources.global "
              "resources.count priority", "with --rate-limit=execution_count"),
    "model_transaction_policy.decoupled": _impl(),
    "response_cache.enable": _impl(),
    **_fields("model_metrics", "metric_control metric_control.metric_identifier "
              "metric_control.metric_identifier.family metric_control.histogram_options "
              "metric_control.histogram_options.buckets"),
})

# Refused fields set to their default are accepted: a config that spells out a default (or a
# JSON config echoed back by a client) must still load. Each check says when a field is "set".
_SET: dict[str, Callable[[ModelConfig], bool]] = {
    # the defaults Triton itself fills in are accepted: the library named after the backend,
    # or model.py for a python-based backend
    "runtime": lambda c: c.runtime not in ("", "model.py", f"libtriton_{c.backend}.so"),
    "optimization.execution_accelerators.cpu_execution_accelerator": lambda c: len(
        c.optimization.execution_accelerators.cpu_execution_accelerator) > 0,
    "sequence_batching.state.use_growable_memory": lambda c: any(
        s.use_growable_memory for s in c.sequence_batching.state),
    "instance_group.secondary_devices": lambda c: any(g.secondary_devices for g in c.instance_group),
    "model_operations": lambda c: len(c.model_operations.op_library_filename) > 0,
    "metric_tags": lambda c: len(c.metric_tags) > 0,
    "instance_group.passive": lambda c: bool(c.instance_group) and all(
        g.passive for g in c.instance_group),
}
# Why an implemented field is refused in the combination its check above looks for.
_REASONS = {
    "instance_group.passive": "every instance is passive, so no instance could run a request",
}


def check(config: ModelConfig) -> None:
    """Refuse a model that sets a field modelhost does not honour (at load, before any backend)."""
    for path, is_set in _SET.items():
        if is_set(config):
            reason = _REASONS.get(path) or SUPPORT[path].note
            raise InvalidArgumentError(
                f"model '{config.name}': configuration field '{path}' is not supported by "
                f"modelhost: {reason}")


def classify(path: str) -> Support | None:
    """The entry for `path`, or the refused / no-effect entry of a field above it."""
    if path in SUPPORT:
        return SUPPORT[path]
    while "." in path:
        path = path.rpartition(".")[0]
        entry = SUPPORT.get(path)
        if entry is not None and entry.status != IMPLEMENTED:
            return entry
    return None


def render() -> str:
    """docs/config_support.md."""
    lines = [
        "# Model configuration: what modelhost honours",
        "",
        "Generated from `host/config_support.py` (`python -m host.config_support > "
        "docs/config_support.md`); the test `tests/test_config_support.py` fails when a field of "
        "`model_config.proto` is not classified, so none is silently ignored.",
        "",
        "- **implemented**: honoured as Triton honours it.",
        "- **refused**: a model that sets the field does not load; the load error names the field. "
        "The field left at its default is accepted.",
        "- **no effect**: accepted, and has no effect here, for the reason given.",
        "",
        "A field not listed is under a refused or no-effect field, and shares its status.",
        "",
        "| field | status | note |",
        "|---|---|---|",
    ]
    for path, (status, note) in SUPPORT.items():
        lines.append(f"| `{path}` | {status} | {note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
