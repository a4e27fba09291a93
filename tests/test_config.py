"""Model configuration layer: parsing, Triton's JSON form, defaults and validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format

from host import devices
from host.config import (
    PLATFORM_BACKENDS,
    backend_for,
    config_from_json,
    config_to_json,
    instance_kind_name,
    load_config_file,
    normalize_config,
    parse_config_text,
)
from host.errors import InvalidArgumentError
from host.proto import model_config_pb2 as mc
from host.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

# A Triton-style config using most features (dynamic batching goes in its own variant since
# scheduling_choice is a oneof).
FULL_CONFIG = """
name: "full"
platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { specific: { versions: [ 1, 3 ] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  },
  {
    name: "SCALAR"
    data_type: TYPE_INT64
    dims: [ 1 ]
    reshape: { shape: [ ] }
    optional: true
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP16
    dims: [ -1, 1000 ]
    label_filename: "labels.txt"
  }
]
instance_group [
  { count: 2 kind: KIND_CPU },
  { name: "gpu_group" count: 1 kind: KIND_GPU gpus: [ 0, 1 ]
    secondary_devices [ { kind: KIND_NVDLA device_id: 7 } ]
    rate_limiter { resources [ { name: "R1" global: true count: 2 } ] priority: 3 } }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: false
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000000000
                         allow_timeout_override: true max_queue_size: 10 }
  priority_queue_policy { key: 1 value { timeout_action: REJECT default_timeout_microseconds: 42 } }
}
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda { graphs: true graph_spec [ { batch_size: 4 input { key: "INPUT0" value { dim: [ 3, 224, 224 ] } } } ] }
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
    } ]
    cpu_execution_accelerator : [ { name : "openvino" } ]
  }
  input_pinned_memory { enable: false }
}
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters [ { key: "threads" value: { string_value: "4" } } ]
model_transaction_policy { decoupled: true }
response_cache { enable: false }
model_warmup [ { name: "warm" batch_size: 2 count: 3
                 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } } } ]
model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "abc" } } ] }
metric_tags { key: "team" value: "vision" }
cc_model_filenames { key: "8.0" value: "model_a100.onnx" }
model_operations { op_library_filename: [ "libcustom.so" ] }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                   histogram_options { buckets: [ 1, 2.5, 10 ] } } ] }
"""

SEQUENCE_CONFIG = """
name: "seq"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
            dims: [ -1 ] initial_state { name: "init" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 250 }
}
"""

SIMPLE = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def simple(extra: str = "", base: str = SIMPLE) -> ModelConfig:
    return parse_config_text(base + extra, "test/config.pbtxt")


def normalized(extra: str = "", base: str = SIMPLE, name: str = "m") -> ModelConfig:
    cfg = simple(extra, base)
    normalize_config(cfg, name)
    return cfg


def reject(cfg: ModelConfig, message: str, name: str = "m") -> None:
    with pytest.raises(InvalidArgumentError) as info:
        normalize_config(cfg, name)
    assert message in str(info.value), str(info.value)


# --- parsing ----------------------------------------------------------------------------------

def test_full_config_parses_every_feature() -> None:
    cfg = parse_config_text(FULL_CONFIG, "full/config.pbtxt")
    assert cfg.name == "full" and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 16
    assert list(cfg.version_policy.specific.versions) == [1, 3]
    assert cfg.input[0].format == mc.ModelInput.FORMAT_NCHW
    assert list(cfg.input[0].dims) == [3, 224, 224]
    assert cfg.input[1].HasField("reshape") and list(cfg.input[1].reshape.shape) == []
    assert cfg.input[1].optional
    assert cfg.output[0].data_type == mc.TYPE_FP16 and list(cfg.output[0].dims) == [-1, 1000]
    gpu = cfg.instance_group[1]
    assert gpu.kind == ModelInstanceGroup.KIND_GPU and list(gpu.gpus) == [0, 1]
    assert gpu.secondary_devices[0].device_id == 7
    assert getattr(gpu.rate_limiter.resources[0], "global") and gpu.rate_limiter.priority == 3
    db = cfg.dynamic_batching
    assert list(db.preferred_batch_size) == [4, 8] and db.max_queue_delay_microseconds == 100
    assert db.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY
    assert db.default_queue_policy.default_timeout_microseconds == 5_000_000_000
    assert db.priority_queue_policy[1].default_timeout_microseconds == 42
    accel = cfg.optimization.execution_accelerators
    assert accel.gpu_execution_accelerator[0].parameters["precision_mode"] == "FP16"
    assert accel.cpu_execution_accelerator[0].name == "openvino"
    assert cfg.optimization.priority == mc.ModelOptimizationPolicy.PRIORITY_MAX
    assert list(cfg.optimization.cuda.graph_spec[0].input["INPUT0"].dim) == [3, 224, 224]
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value.endswith("env.tar.gz")
    assert cfg.parameters["threads"].string_value == "4"
    assert cfg.model_transaction_policy.decoupled
    assert cfg.HasField("response_cache") and not cfg.response_cache.enable
    assert cfg.model_warmup[0].inputs["INPUT0"].zero_data
    assert cfg.model_repository_agents.agents[0].parameters["MD5:1/model.onnx"] == "abc"
    assert cfg.metric_tags["team"] == "vision"
    assert cfg.cc_model_filenames["8.0"] == "model_a100.onnx"
    assert list(cfg.model_operations.op_library_filename) == ["libcustom.so"]
    assert list(cfg.model_metrics.metric_control[0].histogram_options.buckets) == [1, 2.5, 10]


def test_sequence_config_parses() -> None:
    seq = parse_config_text(SEQUENCE_CONFIG, "seq").sequence_batching
    assert seq.WhichOneof("strategy_choice") == "oldest"
    assert [c.name for c in seq.control_input] == ["START", "READY", "END", "CORRID"]
    assert list(seq.control_input[2].control[0].bool_false_true) == [False, True]
    assert seq.control_input[3].control[0].data_type == mc.TYPE_UINT64
    assert seq.state[0].initial_state[0].zero_data
    assert seq.state[0].initial_state[0].WhichOneof("state_data") == "zero_data"


def test_field_numbers_match_triton_wire_format() -> None:
    # Spot checks of Triton's numbering; a mismatch here breaks every Triton client.
    fields = ModelConfig.DESCRIPTOR.fields_by_name
    numbers = {name: fields[name].number for name in fields}
    assert numbers["name"] == 1 and numbers["platform"] == 2 and numbers["backend"] == 17
    assert numbers["runtime"] == 25 and numbers["dynamic_batching"] == 11
    assert numbers["sequence_batching"] == 13 and numbers["ensemble_scheduling"] == 15
    assert numbers["response_cache"] == 24 and numbers["model_metrics"] == 26
    assert numbers["model_repository_agents"] == 23 and numbers["batch_output"] == 21
    assert mc.ModelInstanceGroup.DESCRIPTOR.fields_by_name["kind"].number == 4
    assert mc.ModelOutput.DESCRIPTOR.fields_by_name["label_filename"].number == 4
    assert mc.ModelSequenceBatching.Control.DESCRIPTOR.fields_by_name["bool_false_true"].number == 5
    assert mc.TYPE_STRING == 13 and mc.TYPE_BF16 == 14
    assert ModelInstanceGroup.KIND_CPU == 2 and ModelInstanceGroup.KIND_MODEL == 3
    # Known bytes: field 1 "m", field 4 varint 8, field 17 "python".
    cfg = ModelConfig(name="m", max_batch_size=8, backend="python")
    assert cfg.SerializeToString() == b"\x0a\x01m\x20\x08\x8a\x01\x06python"


def test_registered_like_tritonclient_and_coexists_with_it() -> None:
    # Same file name and content as tritonclient's copy, so both import into one process and
    # tritonclient decodes our bytes (a different name would fail on "duplicate symbol").
    assert mc.DESCRIPTOR.name == "model_config.proto" and mc.DESCRIPTOR.package == "inference"
    tc = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    pytest.importorskip("tritonclient.grpc.service_pb2")
    assert tc.DESCRIPTOR.serialized_pb == mc.DESCRIPTOR.serialized_pb
    cfg = parse_config_text(FULL_CONFIG, "full")
    decoded = tc.ModelConfig.FromString(cfg.SerializeToString())
    # deterministic=True: map entries otherwise serialize in hash order.
    assert decoded.SerializeToString(deterministic=True) == cfg.SerializeToString(deterministic=True)
    assert decoded.parameters["threads"].string_value == "4"


def test_messages_pickle() -> None:
    # In a fresh interpreter: once tritonclient has been imported first, the shared classes carry
    # tritonclient's module name instead and pickling them fails (tritonclient's own limitation).
    code = ("import pickle; from host.proto.model_config_pb2 import ModelConfig as C; "
            "assert C.__module__ == 'host.proto.model_config_pb2', C.__module__; "
            "c = C(name='m', max_batch_size=4); assert pickle.loads(pickle.dumps(c)) == c")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_binary_round_trip() -> None:
    cfg = parse_config_text(FULL_CONFIG, "full")
    assert ModelConfig.FromString(cfg.SerializeToString()) == cfg


def test_parse_error_names_the_file_and_the_problem() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_config_text('name: "x"\nbogus_field: 3\n', "/repo/x/config.pbtxt")
    message = str(info.value)
    assert "/repo/x/config.pbtxt" in message and "bogus_field" in message
    with pytest.raises(InvalidArgumentError, match="config.pbtxt.*TYPE_NOPE"):
        parse_config_text('input [ { data_type: TYPE_NOPE } ]', "config.pbtxt")


def test_load_config_file(tmp_path: Path) -> None:
    assert load_config_file(tmp_path) is None
    (tmp_path / "config.pbtxt").write_text(SIMPLE)
    cfg = load_config_file(tmp_path)
    assert cfg is not None and cfg.name == "m" and cfg.input[0].name == "INPUT0"
    (tmp_path / "config.pbtxt").write_text("max_batch_size: nope")
    with pytest.raises(InvalidArgumentError, match=str(tmp_path / "config.pbtxt")):
        load_config_file(tmp_path)


# --- JSON -------------------------------------------------------------------------------------

def test_json_has_numbers_enum_names_and_defaults() -> None:
    doc = config_to_json(parse_config_text(FULL_CONFIG, "full"))
    assert doc["max_batch_size"] == 16
    assert doc["input"][0]["dims"] == [3, 224, 224] and doc["output"][0]["dims"] == [-1, 1000]
    assert doc["input"][0]["data_type"] == "TYPE_FP32" and doc["input"][0]["format"] == "FORMAT_NCHW"
    assert doc["version_policy"]["specific"]["versions"] == [1, 3]
    db = doc["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 3 and db["default_priority_level"] == 2
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000_000
    assert db["default_queue_policy"]["timeout_action"] == "DELAY"
    # uint64 map keys stay strings (JSON keys), their values' int64 fields become numbers.
    assert db["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 42
    graph_input = doc["optimization"]["cuda"]["graph_spec"][0]["input"]["INPUT0"]
    assert graph_input["dim"] == [3, 224, 224]
    assert doc["instance_group"][1]["secondary_devices"][0]["device_id"] == 7
    assert doc["instance_group"][0]["kind"] == "KIND_CPU"
    assert doc["model_warmup"][0]["inputs"]["INPUT0"]["dims"] == [3, 224, 224]
    # Fields without presence appear with defaults, like Triton's always-print option.
    assert doc["backend"] == "" and doc["runtime"] == "" and doc["batch_input"] == []
    assert doc["input"][0]["is_shape_tensor"] is False and doc["output"][0]["label_filename"] == "labels.txt"
    assert doc["parameters"]["threads"] == {"string_value": "4"}
    # No int64 anywhere is left quoted.
    assert '"5000000000"' not in json.dumps(doc)


def test_json_int64_inside_sequence_and_ensemble() -> None:
    doc = config_to_json(parse_config_text(SEQUENCE_CONFIG, "seq"))
    seq = doc["sequence_batching"]
    assert seq["max_sequence_idle_microseconds"] == 5_000_000
    assert seq["oldest"]["max_queue_delay_microseconds"] == 250
    assert seq["state"][0]["dims"] == [-1]
    assert seq["state"][0]["initial_state"][0]["dims"] == [1]
    assert seq["control_input"][0]["control"][0]["kind"] == "CONTROL_SEQUENCE_START"
    ens = ModelConfig(name="e", platform="ensemble")
    ens.ensemble_scheduling.step.add(model_name="a", model_version=-1)
    assert config_to_json(ens)["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_json_round_trip_preserves_everything() -> None:
    for text in (FULL_CONFIG, SEQUENCE_CONFIG):
        cfg = parse_config_text(text, "x")
        doc = config_to_json(cfg)
        assert config_from_json(doc) == cfg
        assert config_from_json(json.dumps(doc)) == cfg
        assert config_from_json(json.dumps(doc).encode()) == cfg


def test_json_accepts_camel_case_and_lowercase_enums() -> None:
    cfg = config_from_json({"name": "m", "maxBatchSize": 4,
                            "input": [{"name": "x", "dataType": "type_fp32", "dims": ["2", 3]}],
                            "instance_group": [{"kind": "kind_gpu"}]})
    assert cfg.max_batch_size == 4 and cfg.input[0].data_type == mc.TYPE_FP32
    assert list(cfg.input[0].dims) == [2, 3]
    assert cfg.instance_group[0].kind == ModelInstanceGroup.KIND_GPU


def test_json_accepts_bare_word_keys_as_tritons_protobuf_parser_does() -> None:
    # Triton's own QA loads `..., direct: { "max_queue_delay_microseconds": 10 } ...`
    cfg = config_from_json('{"name": "m", sequence_batching: {iterative_sequence: true, '
                           'direct: {"max_queue_delay_microseconds": 10}}, '
                           '"parameters": {"k": {"string_value": "a: b, c: {d: 1}"}}}')
    assert cfg.sequence_batching.iterative_sequence
    assert cfg.sequence_batching.direct.max_queue_delay_microseconds == 10
    assert cfg.parameters["k"].string_value == "a: b, c: {d: 1}"  # strings are left alone


@pytest.mark.parametrize("bad", [
    '{"name": "m", "no_such_field": 1}',
    '{"name": ',
    '[1, 2]',
    '{"input": [{"data_type": "TYPE_NOPE"}]}',
    b'\xff\xfe',
])
def test_json_errors_are_invalid_argument(bad: str | bytes) -> None:
    with pytest.raises(InvalidArgumentError):
        config_from_json(bad)


# --- backend names ----------------------------------------------------------------------------

@pytest.mark.parametrize("platform,backend", [
    ("onnxruntime_onnx", "onnxruntime"),
    ("pytorch_libtorch", "pytorch"),
    ("libtorch", "pytorch"),
    ("torch_aoti", "pytorch"),
    ("tensorflow_graphdef", "tensorflow"),
    ("tensorflow_savedmodel", "tensorflow"),
    ("tensorrt_plan", "tensorrt"),
    ("ensemble", "ensemble"),
    ("", ""),
    ("unknown_platform", ""),
])
def test_backend_for_platform(platform: str, backend: str) -> None:
    assert backend_for(ModelConfig(platform=platform)) == backend
    assert PLATFORM_BACKENDS.get(platform, "") == backend


def test_backend_field_wins_over_platform() -> None:
    assert backend_for(ModelConfig(platform="onnxruntime_onnx", backend="python")) == "python"
    assert backend_for(ModelConfig(backend="vllm")) == "vllm"


def test_instance_kind_name() -> None:
    assert instance_kind_name(ModelInstanceGroup.KIND_CPU) == "CPU"
    assert instance_kind_name(ModelInstanceGroup.KIND_GPU) == "GPU"
    assert instance_kind_name(ModelInstanceGroup.KIND_MODEL) == "MODEL"
    assert instance_kind_name(ModelInstanceGroup.KIND_AUTO) == "AUTO"
    with pytest.raises(InvalidArgumentError):
        instance_kind_name(99)


# --- normalization: defaults ------------------------------------------------------------------

def test_normalize_fills_triton_defaults() -> None:
    cfg = simple()
    cfg.ClearField("name")
    normalize_config(cfg, "m")
    assert cfg.name == "m"
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"
    assert cfg.version_policy.latest.num_versions == 1
    assert len(cfg.instance_group) == 1
    group = cfg.instance_group[0]
    assert group.name == "m" and group.count == 1 and group.kind == ModelInstanceGroup.KIND_CPU
    assert cfg.default_model_filename == "model.py"
    assert cfg.optimization.input_pinned_memory.enable
    assert cfg.optimization.output_pinned_memory.enable


def test_normalize_instance_groups(monkeypatch) -> None:
    # The host's GPUs are what the CUDA driver reports (host.devices); this machine may have
    # none, so the list is set here to test both of Triton's cases.
    monkeypatch.setattr(devices, "supported_gpus", lambda: frozenset())
    cfg = normalized('instance_group [ { kind: KIND_AUTO }, { name: "g" count: 3 }, '
                     '{ kind: KIND_MODEL count: 0 } ]')
    groups = cfg.instance_group
    assert [g.name for g in groups] == ["m_0", "g", "m_2"]
    assert [g.count for g in groups] == [1, 3, 1]
    assert [g.kind for g in groups] == [ModelInstanceGroup.KIND_CPU, ModelInstanceGroup.KIND_CPU,
                                        ModelInstanceGroup.KIND_MODEL]
    reject(simple('instance_group [ { kind: KIND_GPU } ]'),
           "instance group m_0 of model m has kind KIND_GPU but no GPUs are available")
    reject(simple('instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]'),
           "instance group m_0 of model m specifies invalid or unsupported gpu id 0. GPUs with at "
           "least the minimum required CUDA compute compatibility of 6.000000 are: ")

    monkeypatch.setattr(devices, "supported_gpus", lambda: frozenset({0, 1}))
    cfg = normalized('instance_group [ { kind: KIND_AUTO }, { kind: KIND_GPU }, '
                     '{ kind: KIND_GPU gpus: [ 1 ] } ]')
    groups = cfg.instance_group
    assert [g.kind for g in groups] == [ModelInstanceGroup.KIND_GPU] * 3
    assert [list(g.gpus) for g in groups] == [[0, 1], [0, 1], [1]]
    # KIND_AUTO naming a GPU that is not here becomes a CPU group, which may not name GPUs
    reject(simple('instance_group [ { kind: KIND_AUTO gpus: [ 2 ] } ]'),
           "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs")
    reject(simple('instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]'),
           "instance group m_0 of model m specifies invalid or unsupported gpu id 3. GPUs with at "
           "least the minimum required CUDA compute compatibility of 6.000000 are: 0, 1")


def test_default_cpu_count_is_two_for_onnxruntime() -> None:
    cfg = normalized(base=SIMPLE.replace('backend: "python"', 'platform: "onnxruntime_onnx"'))
    assert cfg.backend == "onnxruntime" and cfg.default_model_filename == "model.onnx"
    assert cfg.instance_group[0].count == 2


def test_normalize_keeps_explicit_values() -> None:
    cfg = normalized('version_policy: { all { } }\n'
                     'dynamic_batching { preferred_batch_size: [ 2 ] }\n'
                     'optimization { input_pinned_memory { enable: false } }')
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2]
    assert not cfg.optimization.input_pinned_memory.enable
    assert cfg.optimization.output_pinned_memory.enable


def test_dynamic_batching_defaults() -> None:
    assert list(normalized("dynamic_batching { }").dynamic_batching.preferred_batch_size) == [8]
    # Triton allows dynamic batching on a non-batching model; no preferred size is added.
    cfg = normalized("dynamic_batching { }", base=SIMPLE.replace("max_batch_size: 8", "max_batch_size: 0"))
    assert list(cfg.dynamic_batching.preferred_batch_size) == []


def test_sequence_batching_defaults() -> None:
    seq = normalized("sequence_batching { oldest { } }").sequence_batching
    assert seq.max_sequence_idle_microseconds == 1_000_000
    assert list(seq.oldest.preferred_batch_size) == [8]
    full = parse_config_text(SEQUENCE_CONFIG, "seq")
    normalize_config(full, "seq")
    assert full.sequence_batching.max_sequence_idle_microseconds == 5_000_000


def test_normalize_is_idempotent(monkeypatch) -> None:
    monkeypatch.setattr(devices, "supported_gpus", lambda: frozenset({0, 1}))  # FULL's GPU group
    for text, name in ((FULL_CONFIG, "full"), (SEQUENCE_CONFIG, "seq"), (SIMPLE, "m")):
        cfg = parse_config_text(text, name)
        normalize_config(cfg, name)
        once = cfg.SerializeToString(deterministic=True)
        normalize_config(cfg, name)
        assert cfg.SerializeToString(deterministic=True) == once


def test_renormalize_after_backend_autocomplete() -> None:
    cfg = simple(base='name: "m" backend: "python" dynamic_batching { }')
    normalize_config(cfg, "m", validate_io=False)
    assert list(cfg.dynamic_batching.preferred_batch_size) == []
    cfg.max_batch_size = 4  # what a backend's auto_complete_config might set
    normalize_config(cfg, "m", validate_io=False)
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4]


def test_full_config_normalizes(monkeypatch) -> None:
    monkeypatch.setattr(devices, "supported_gpus", lambda: frozenset({0, 1}))  # its GPU group
    cfg = parse_config_text(FULL_CONFIG, "full")
    normalize_config(cfg, "full")
    assert cfg.backend == "onnxruntime" and cfg.instance_group[0].name == "full_0"
    assert not cfg.optimization.input_pinned_memory.enable  # explicit value kept


def test_decoupled_with_dynamic_batching_is_allowed() -> None:
    cfg = normalized("model_transaction_policy { decoupled: true }\ndynamic_batching { }")
    assert cfg.model_transaction_policy.decoupled


def test_backend_and_platform_autofill() -> None:
    cfg = normalized(base=SIMPLE.replace('backend: "python"', 'backend: "pytorch"'))
    assert cfg.platform == "pytorch_libtorch" and cfg.default_model_filename == "model.pt"
    cfg = normalized(base=SIMPLE.replace('backend: "python"', 'backend: "onnxruntime"'))
    assert cfg.platform == "onnxruntime_onnx"
    cfg = normalized(base=SIMPLE.replace('backend: "python"', 'platform: "tensorflow_savedmodel"'))
    assert cfg.backend == "tensorflow" and cfg.default_model_filename == "model.savedmodel"
    cfg = normalized(base=SIMPLE.replace('backend: "python"', 'default_model_filename: "model.py"'))
    assert cfg.backend == "python"


def test_backend_inferred_from_version_directory(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text("")
    cfg = simple(base=SIMPLE.replace('backend: "python"', ""))
    normalize_config(cfg, "m", model_dir=tmp_path)
    assert cfg.backend == "python" and cfg.default_model_filename == "model.py"


def test_custom_backend_from_model_name() -> None:
    cfg = simple(base=SIMPLE.replace('backend: "python"', "").replace('name: "m"', ""))
    normalize_config(cfg, "model.identity")
    assert cfg.backend == "identity" and cfg.default_model_filename == "model.identity"
    reject(simple(base=SIMPLE.replace('backend: "python"', "")),
           "Could not determine backend for model 'm'")


def test_validate_io_can_be_deferred() -> None:
    cfg = simple(base='name: "m" backend: "python"')
    normalize_config(cfg, "m", validate_io=False)  # a backend may still add inputs/outputs
    reject(simple("input [ { name: 'x' } ]"), "model input 'x' must specify 'data_type' for m")


# --- normalization: rejections ----------------------------------------------------------------

@pytest.mark.parametrize("extra,message", [
    ("", "unexpected directory name 'other' for model 'm', directory name must equal model name"),
])
def test_name_must_match_directory(extra: str, message: str) -> None:
    reject(simple(extra), message, name="other")


IO_REJECTIONS = [
    ('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]', "model input must specify 'name' for m"),
    ('input [ { name: "x" dims: [ 1 ] } ]', "model input 'x' must specify 'data_type' for m"),
    ('input [ { name: "x" data_type: TYPE_FP32 } ]', "model input 'x' must specify 'dims' for m"),
    ('output [ { name: "y" data_type: TYPE_FP32 } ]', "model output 'y' must specify 'dims' for m"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]',
     "model input 'x' dimension must be integer >= 1, or -1 to indicate a variable-size dimension"),
    ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, -2 ] } ]',
     "model output 'y' dimension must be integer >= 1, or -1"),
    ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "model input 'INPUT0' is specified more than once for m"),
    ('output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "model output 'OUTPUT0' is specified more than once for m"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 5 ] } } ]',
     "model input 'x' has different size for dims and reshape"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [ ] } } ]',
     "model input 'x' has different size for dims and reshape"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ] reshape { shape: [ -1, -1 ] } } ]',
     "has different number of variable-size dimensions for dims and reshape"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1, 6 ] reshape { shape: [ 3, -1, 4 ] } } ]',
     "model input 'x' has different size for dims and reshape"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 0, 4 ] } } ]',
     "reshape dimensions must be integer >= 1"),
    ('input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 4 ] } ]',
     "model input NHWC/NCHW require 3 dims"),
    ('input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true } ]',
     "shape tensors are only supported for TensorRT platform"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "c" data_type: TYPE_FP32 } ]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
    ('batch_input [ { target_name: "c" data_type: TYPE_INT64 source_input: "INPUT0" } ]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ('batch_input [ { target_name: "c" data_type: TYPE_INT32 source_input: "nope" } ]',
     "unknown source input name 'nope'"),
    ('batch_output [ { target_name: "nope" source_input: "INPUT0" } ]',
     "unknown target output name 'nope'"),
]


@pytest.mark.parametrize("extra,message", IO_REJECTIONS)
def test_io_rejections(extra: str, message: str) -> None:
    reject(simple(extra), message)


CONFIG_REJECTIONS = [
    ("dynamic_batching { preferred_batch_size: [ 16 ] }",
     "dynamic batching preferred size must be <= max batch size for m"),
    ("dynamic_batching { preferred_batch_size: [ 0 ] }",
     "dynamic batching preferred size must be positive for m"),
    ("dynamic_batching { priority_levels: 2 }",
     "default priority level must be in range [1, 2] for m"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value { } } }",
     "priority queue policy must have priority level in range [1, 2] for m"),
    ("dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
     "Only one priority level is allowed when 'preserve_ordering' is true for m"),
    ("dynamic_batching { preserve_ordering: true default_queue_policy "
     "{ timeout_action: DELAY default_timeout_microseconds: 10 } }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    ("sequence_batching { oldest { preferred_batch_size: [ 9 ] } }",
     "sequence batching preferred batch size must be <= max batch size for m"),
    ("sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
     "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
    ("sequence_batching { }\nresponse_cache { enable: true }",
     "Response Cache does not currently support model m with sequence batching scheduler"),
    ("model_transaction_policy { decoupled: true }\nresponse_cache { enable: true }",
     "Response Cache does not currently support model m with 'decoupled' transaction policy"),
    ("sequence_batching { control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
     "int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching control tensor must have a name for m"),
    ("sequence_batching { control_input [ "
     "{ name: 'S' control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: 'S' control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
    ("sequence_batching { control_input [ "
     "{ name: 'A' control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: 'B' control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
    ("sequence_batching { control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_END } ] } ] }",
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_END for m"),
    ("sequence_batching { control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_READY "
     "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching specifies more than one from"),
    ("sequence_batching { control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_READY "
     "int32_false_true: [ 1 ] } ] } ] }",
     "sequence batching control 'int32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_READY for m"),
    ("sequence_batching { control_input [ { name: 'C' control [ { kind: CONTROL_SEQUENCE_CORRID "
     "data_type: TYPE_FP32 } ] } ] }",
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for m"),
    ("sequence_batching { control_input [ { name: 'C' control [ { kind: CONTROL_SEQUENCE_CORRID "
     "data_type: TYPE_INT64 int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching must not specify either 'int32_false_true'"),
    ("model_metrics { metric_control [ { histogram_options { buckets: [ 1 ] } } ] }",
     "metric control must specify 'metric_identifier'"),
    ("model_metrics { metric_control [ { metric_identifier { family: 'f' } } ] }",
     "metric control must specify 'histogram_options'"),
    ("model_metrics { metric_control [ { metric_identifier { family: 'f' } "
     "histogram_options { } } ] }",
     "histogram options must specify non-empty 'buckets'"),
    ("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
     "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
    ("instance_group [ { name: 'g' kind: KIND_MODEL gpus: [ 1 ] } ]",
     "instance group g of model m has kind KIND_MODEL but specifies one or more GPUs"),
    ("instance_group [ { profile: [ '0' ] } ]",
     "specifies profile field which is only supported for TensorRT models"),
]


@pytest.mark.parametrize("extra,message", CONFIG_REJECTIONS)
def test_config_rejections(extra: str, message: str) -> None:
    reject(simple(extra), message)


def test_negative_max_batch_size() -> None:
    reject(simple(base=SIMPLE.replace("max_batch_size: 8", "max_batch_size: -1")),
           "'max_batch_size' must be non-negative value for m")


def test_platform_backend_rules() -> None:
    base = SIMPLE.replace('backend: "python"', "")
    reject(simple('backend: "onnxruntime" platform: "pytorch_libtorch"', base),
           "unexpected 'platform' and 'backend' pair, got:pytorch_libtorch, onnxruntime")
    reject(simple('backend: "tensorflow"', base), "unexpected 'platform' and 'backend' pair")
    reject(simple('platform: "ensemble" backend: "python"', base),
           "Ensemble model 'm' must have platform type 'ensemble' and empty backend type")
    reject(simple('platform: "ensemble"', base),
           "ensemble scheduling must be set for ensemble m whose platform is ensemble")
    reject(simple('platform: "madeup" default_model_filename: "x.bin"', base),
           "unexpected platform type 'madeup' for m")
    # A backend Triton doesn't know may pair with any platform.
    cfg = normalized('platform: "tensorrt_plan" backend: "mybackend"', base)
    assert cfg.backend == "mybackend"


def test_tensorrt_profiles() -> None:
    base = SIMPLE.replace('backend: "python"', 'platform: "tensorrt_plan"')
    cfg = normalized("instance_group [ { profile: [ '0', '2' ] } ]", base)
    assert cfg.backend == "tensorrt" and list(cfg.instance_group[0].profile) == ["0", "2"]
    reject(simple("instance_group [ { profile: [ 'x' ] } ]", base), "specifies invalid profile x")


def test_valid_reshapes() -> None:
    normalized('input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } },'
               '{ name: "b" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape { shape: [ 8, -1, 1, 6 ] } },'
               '{ name: "c" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } } ]')
    no_batch = SIMPLE.replace("max_batch_size: 8", "max_batch_size: 0")
    reject(simple('input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
                  no_batch),
           "model input 'a' cannot have empty reshape for non-batching model")


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "a" model_version: -1 input_map { key: "INPUT0" value: "IN" }
      output_map { key: "OUTPUT0" value: "mid" } },
    { model_name: "b" model_version: -1 input_map { key: "INPUT0" value: "mid" }
      output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
"""


def test_ensemble_normalizes_without_instances() -> None:
    cfg = parse_config_text(ENSEMBLE, "ens")
    normalize_config(cfg, "ens")
    assert cfg.backend == "" and not cfg.instance_group and not cfg.HasField("optimization")
    assert backend_for(cfg) == "ensemble"
    assert cfg.version_policy.latest.num_versions == 1


@pytest.mark.parametrize("change,message", [
    (("", "instance_group [ { count: 1 } ]"), "instance group should not be specified for ensemble 'ens'"),
    (("", "optimization { }"), "optimization should not be specified for ensemble 'ens'"),
    (('value: "mid" } },\n', 'value: "mid" } },\n{ model_name: "c" input_map { key: "x" value: "IN" } '
      'output_map { key: "y" value: "mid" } },\n'),
     "ensemble tensor 'mid' can appear in an output map only once"),
    (('value: "OUT"', 'value: "OTHER"'), "ensemble output 'OUT' for ensemble ens' is not used"),
    (('{ key: "INPUT0" value: "mid" }', '{ key: "INPUT0" value: "X" }'),
     "output 'OUT' for ensemble 'ens' is not written: at least one of its depending tensors, "
     "'X', is not connected"),
    (('output_map { key: "OUTPUT0" value: "mid" }',
      'output_map { key: "OUTPUT0" value: "mid" } output_map { key: "OUTPUT1" value: "spare" }'),
     "ensemble tensor 'spare' is unused in ensemble 'ens'"),
    (('value: "IN"', 'value: "X"'), "ensemble input 'IN' for ensemble ens' is not used"),
    (('model_name: "b"', 'model_name: ""'), "must specify 'model_name' in step 1 of ensemble 'ens'"),
])
def test_ensemble_rejections(change: tuple[str, str], message: str) -> None:
    old, new = change
    text = ENSEMBLE + new if not old else ENSEMBLE.replace(old, new, 1)
    reject(parse_config_text(text, "ens"), message, name="ens")


def test_normalized_config_json_is_what_triton_shows() -> None:
    doc = config_to_json(normalized("dynamic_batching { max_queue_delay_microseconds: 100 }"))
    assert doc["instance_group"] == [{
        "name": "m", "kind": "KIND_CPU", "count": 1, "gpus": [], "secondary_devices": [],
        "profile": [], "passive": False, "host_policy": ""}]
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}
    assert doc["dynamic_batching"]["preferred_batch_size"] == [8]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert doc["dynamic_batching"]["priority_queue_policy"] == {}
    assert doc["optimization"]["input_pinned_memory"] == {"enable": True}
    assert doc["default_model_filename"] == "model.py"
    # Keys in declaration order, as Triton prints them.
    assert list(doc)[:6] == ["name", "platform", "backend", "runtime", "version_policy",
                             "max_batch_size"]
    assert text_format.MessageToString(config_from_json(doc)) == \
        text_format.MessageToString(normalized("dynamic_batching { max_queue_delay_microseconds: 100 }"))
