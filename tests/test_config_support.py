"""No silently ignored configuration: every field of model_config.proto is classified
(host.config_support), refused fields stop a load with a message naming them, and the fields this
audit implemented (reshape, passive instances) work through a real server."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from host import config_support, devices
from host.config_support import IMPLEMENTED, REFUSED, SUPPORT, classify
from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig
from host.testing import serve

ROOT = Path(__file__).resolve().parent.parent


def _paths(descriptor, prefix="", seen=()):
    """Every field of the message, nested fields included (recursive messages once)."""
    for field in descriptor.fields:
        path = prefix + field.name
        yield path
        message = field.message_type
        if message is not None and not message.GetOptions().map_entry and message.full_name not in seen:
            yield from _paths(message, path + ".", seen + (message.full_name,))


def test_every_configuration_field_is_classified():
    paths = list(_paths(ModelConfig.DESCRIPTOR))
    assert len(paths) > 150
    unclassified = [p for p in paths if classify(p) is None]
    assert unclassified == [], ("classify these fields in host/config_support.py "
                                f"(implemented, refused or no effect): {unclassified}")
    assert sorted(set(SUPPORT) - set(paths)) == []  # no entry for a field that does not exist


def test_the_support_document_is_up_to_date():
    assert (ROOT / "docs" / "config_support.md").read_text() == config_support.render()


REFUSED_CONFIGS = {
    "runtime": 'runtime: "libtriton_other.so"',
    "optimization.execution_accelerators.cpu_execution_accelerator":
        'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }',
    "sequence_batching.state.use_growable_memory":
        'sequence_batching { state [ { input_name: "A" output_name: "B" data_type: TYPE_INT32 '
        "dims: [ 1 ] use_growable_memory: true } ] }",
    "instance_group.secondary_devices":
        "instance_group [ { secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]",
    "instance_group.passive": "instance_group [ { passive: true } ]",
    "metric_tags": 'metric_tags { key: "team" value: "search" }',
    "model_operations": 'model_operations { op_library_filename: [ "libops.so" ] }',
}


def test_every_refused_field_has_a_case_here():
    refused = {p for p, s in SUPPORT.items() if s.status == REFUSED}
    conditional = {"instance_group.passive"}
    assert refused | conditional == set(REFUSED_CONFIGS)


@pytest.mark.parametrize("path", sorted(REFUSED_CONFIGS))
def test_refused_fields_name_themselves(path):
    config = text_format.Parse('name: "m" backend: "python" ' + REFUSED_CONFIGS[path], ModelConfig())
    with pytest.raises(InvalidArgumentError) as info:
        config_support.check(config)
    assert f"configuration field '{path}' is not supported by modelhost" in str(info.value)


def test_defaults_spelled_out_are_accepted():
    config = text_format.Parse(
        'name: "m" backend: "python" runtime: "libtriton_python.so" dynamic_batching { priority_levels: 0 '
        "preserve_ordering: true } instance_group [ { count: 1 passive: false rate_limiter { } } ] "
        "model_operations { } model_repository_agents { }", ModelConfig())
    config_support.check(config)
    assert classify("optimization.cuda.graphs").status != IMPLEMENTED  # covered by its parent


# --- through a real server ----------------------------------------------------------------------

RESHAPE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.reshape(x.shape[0], 2, 3)),
                pb_utils.Tensor("SEEN", np.array(x.shape, dtype=np.int64).reshape(1, -1))]))
        return out
'''

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

WHO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()),
            pb_utils.Tensor("WHO", np.array([self.name.encode()], dtype=object))]) for r in requests]
'''

IO = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ] '
      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ] ')


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}" backend: "python" {config}')
    (repo / name / "1" / "model.py").write_text(code)


def test_refusals_reshape_and_passive_instances_through_a_server(tmp_path):
    _model(tmp_path, "reshaped", 'max_batch_size: 4 '
           'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 6 ] } } ] '
           'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } }, '
           '{ name: "SEEN" data_type: TYPE_INT64 dims: [ 2 ] } ]', RESHAPE_MODEL)
    _model(tmp_path, "warm", IO + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" '
           'value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]', IDENTITY)
    _model(tmp_path, "limited", IO + 'instance_group [ { rate_limiter { resources [ '
           '{ name: "R" count: 1 } ] } } ]', IDENTITY)
    _model(tmp_path, "half_passive", IO + "instance_group [ { name: \"active\" count: 1 }, "
           "{ name: \"standby\" count: 1 passive: true } ]", WHO)
    _model(tmp_path, "bucketed", IO + 'model_metrics { metric_control [ { metric_identifier { '
           'family: "nv_inference_first_response_histogram_ms" } histogram_options { '
           'buckets: [ 3, 70 ] } } ] }', IDENTITY)
    _model(tmp_path, "plain", IO, IDENTITY)
    _model(tmp_path, "on_gpu", IO + "instance_group [ { kind: KIND_GPU } ]", IDENTITY)
    (tmp_path / "tagged_ensemble" / "1").mkdir(parents=True)
    (tmp_path / "tagged_ensemble" / "config.pbtxt").write_text(  # ensembles are audited too
        'name: "tagged_ensemble" platform: "ensemble" ' + IO + 'metric_tags { key: "team" '
        'value: "search" } ensemble_scheduling { step [ { model_name: "plain" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" '
        'value: "OUTPUT0" } } ] }')
    with serve(tmp_path, "--metrics-config", "histogram_latencies=true") as server:
        client = httpclient.InferenceServerClient(server.url)
        reasons = {m["name"]: m.get("reason", "") for m in client.get_model_repository_index()}
        assert "configuration field 'metric_tags' is not supported" in reasons["tagged_ensemble"]
        assert reasons["warm"] == ""  # model_warmup is implemented (host.warmup)
        # --rate-limit=off (the default): a rate_limiter section is ignored, as in Triton
        assert reasons["limited"] == "" and client.is_model_ready("limited")
        if not devices.supported_gpus():  # Triton's refusal on a host without GPUs
            assert reasons["on_gpu"].endswith("instance group on_gpu_0 of model on_gpu has kind "
                                              "KIND_GPU but no GPUs are available")

        x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
        i = httpclient.InferInput("INPUT0", [2, 2, 3], "FP32")
        i.set_data_from_numpy(x)
        r = client.infer("reshaped", [i])
        assert r.as_numpy("SEEN").tolist() == [[2, 6]]  # the model sees the reshape shape
        assert r.as_numpy("OUTPUT0").shape == (2, 6)    # the client gets the dims shape
        assert r.as_numpy("OUTPUT0").tolist() == x.reshape(2, 6).tolist()

        i = httpclient.InferInput("INPUT0", [4], "FP32")
        i.set_data_from_numpy(np.ones(4, dtype=np.float32))
        who = {client.infer("half_passive", [i]).as_numpy("WHO").item() for _ in range(4)}
        assert who == {b"active_0"}  # the passive instance is loaded, never scheduled

        client.infer("bucketed", [i])  # model_metrics: the model's own histogram buckets
        with urllib.request.urlopen(server.metrics_url) as response:
            lines = response.read().decode().splitlines()
        buckets = [line for line in lines if line.startswith(
            "nv_inference_first_response_histogram_ms_bucket") and 'model="bucketed"' in line]
        assert [line.split('le="')[1].split('"')[0] for line in buckets] == ["3", "70", "+Inf"]
