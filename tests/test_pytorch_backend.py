"""The pytorch plugin (plugins/modelhost-pytorch) through the real front ends.

The example repository's TorchScript models are served by the session's server; models scripted
here go to a repository of their own. Expected values come from the same module run in torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.testing import serve, wait_until

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.modelhost_only

REPO = Path(__file__).resolve().parent.parent / "model_repository"


def _http(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url, concurrency=16, network_timeout=60.0)


def _input(module, name: str, array: np.ndarray, datatype: str):
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


# --- the example repository ------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classifier_indexed_names(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else grpcclient.InferenceServerClient(server.grpc_url)
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    result = client.infer("torch_classifier", [_input(module, "INPUT__0", x, "FP32")])
    reference = torch.jit.load(str(REPO / "torch_classifier" / "1" / "model.pt"))
    logits, index = reference(torch.from_numpy(x))
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), logits.detach().numpy(), rtol=1e-5)
    out_index = result.as_numpy("OUTPUT__1")
    assert out_index.dtype == np.int64 and out_index.shape == (5, 1)
    np.testing.assert_array_equal(out_index, index.numpy())


def test_named_inputs_match_forward_arguments(server):
    client = _http(server)
    values = np.array([3, -4], dtype=np.int32)
    scale = np.array([0.5, 2.0])
    # Sent in the opposite order of forward(values, scale) and of the config: names decide.
    result = client.infer("torch_named", [_input(httpclient, "scale", scale, "FP64"),
                                          _input(httpclient, "values", values, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), values * scale)


def test_only_the_requested_output(server):
    x = np.ones((1, 4), dtype=np.float32)
    result = _http(server).infer("torch_classifier", [_input(httpclient, "INPUT__0", x, "FP32")],
                                 outputs=[httpclient.InferRequestedOutput("OUTPUT__1")])
    assert result.as_numpy("OUTPUT__0") is None and result.as_numpy("OUTPUT__1").shape == (1, 1)


# --- models of their own ---------------------------------------------------------------------

class _Types(torch.nn.Module):
    """One output per datatype: BF16 * 2, FP16 + 1, INT8 negated, UINT8 + 1, BOOL inverted."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
                e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
        return a * 2, b + 1, -c, d + 1, ~e


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Failing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() < 0):
            raise RuntimeError("negative input")
        return x


def _write(repo: Path, name: str, module: torch.nn.Module, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(module), str(repo / name / "1" / "model.pt"))
    (repo / name / "config.pbtxt").write_text(config)


_TYPES_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT__0" data_type: TYPE_BF16 dims: [ 2 ] },
  { name: "INPUT__1" data_type: TYPE_FP16 dims: [ 2 ] },
  { name: "INPUT__2" data_type: TYPE_INT8 dims: [ 2 ] },
  { name: "INPUT__3" data_type: TYPE_UINT8 dims: [ 2 ] },
  { name: "INPUT__4" data_type: TYPE_BOOL dims: [ 2 ] }
]
output [
  { name: "OUTPUT__4" data_type: TYPE_BOOL dims: [ 2 ] },
  { name: "OUTPUT__0" data_type: TYPE_BF16 dims: [ 2 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP16 dims: [ 2 ] },
  { name: "OUTPUT__2" data_type: TYPE_INT8 dims: [ 2 ] },
  { name: "OUTPUT__3" data_type: TYPE_UINT8 dims: [ 2 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

_BATCHED_CONFIG = """
backend: "pytorch"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }
parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "1" } }
"""


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("torch_models")
    _write(repo, "types", _Types(), _TYPES_CONFIG)
    _write(repo, "batched", _Double(), _BATCHED_CONFIG)
    _write(repo, "failing", _Failing(), _BATCHED_CONFIG.replace(
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }", ""))
    _write(repo, "gpu", _Double(), _BATCHED_CONFIG.replace("KIND_CPU", "KIND_GPU"))
    _write(repo, "bad_mode", _Double(), _BATCHED_CONFIG + (
        'parameters { key: "INFERENCE_MODE" value { string_value: "maybe" } }\n'))
    (repo / "not_torchscript" / "1").mkdir(parents=True)
    (repo / "not_torchscript" / "1" / "model.pt").write_bytes(b"not a TorchScript archive")
    (repo / "not_torchscript" / "config.pbtxt").write_text(_BATCHED_CONFIG)
    with serve(repo) as server:
        yield server


def test_datatypes_including_bf16(own_server):
    import ml_dtypes

    client = grpcclient.InferenceServerClient(own_server.grpc_url)
    arrays = [np.array([1.5, -3], dtype=ml_dtypes.bfloat16), np.array([0.5, 2], dtype=np.float16),
              np.array([5, -128 + 1], dtype=np.int8), np.array([0, 254], dtype=np.uint8),
              np.array([True, False])]
    datatypes = ["BF16", "FP16", "INT8", "UINT8", "BOOL"]
    inputs = []
    for i, (array, datatype) in enumerate(zip(arrays, datatypes)):
        tensor = grpcclient.InferInput(f"INPUT__{i}", [2], datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer("types", inputs)
    bf16 = result.as_numpy("OUTPUT__0")
    np.testing.assert_array_equal(np.asarray(bf16, dtype=np.float32), [3.0, -6.0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), np.array([1.5, 3], np.float16))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__2"), [-5, 127])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__3"), [1, 255])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__4"), [False, True])


def test_dynamic_batching_runs_concurrent_requests_as_one_forward(own_server):
    client = _http(own_server)
    arrays = [np.full((1, 3), i, dtype=np.float32) for i in range(4)]
    pending = [client.async_infer("batched", [_input(httpclient, "INPUT__0", a, "FP32")])
               for a in arrays]
    results = [p.get_result(timeout=60) for p in pending]
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), array * 2)
    stats = client.get_inference_statistics("batched")["model_stats"][0]
    assert stats["inference_count"] == 4 and stats["execution_count"] == 1


def test_execute_failure_is_the_requests_error_and_the_model_keeps_serving(own_server):
    client = _http(own_server)
    with pytest.raises(httpclient.InferenceServerException) as info:
        client.infer("failing", [_input(httpclient, "INPUT__0", -np.ones((1, 3), np.float32), "FP32")])
    assert "PyTorch execute failure" in info.value.message() and "negative input" in info.value.message()
    ok = client.infer("failing", [_input(httpclient, "INPUT__0", np.ones((1, 3), np.float32), "FP32")])
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT__0"), np.ones((1, 3)))


def test_load_errors_are_clear(own_server):
    index = {m["name"]: m for m in _http(own_server).get_model_repository_index()}
    assert index["not_torchscript"]["state"] == "UNAVAILABLE"
    assert "failed to load TorchScript model" in index["not_torchscript"]["reason"]
    assert index["bad_mode"]["state"] == "UNAVAILABLE"
    assert "INFERENCE_MODE" in index["bad_mode"]["reason"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_gpu_instance(own_server):
    client = _http(own_server)
    wait_until(lambda: client.is_model_ready("gpu"), 30)
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    out = client.infer("gpu", [_input(httpclient, "INPUT__0", x, "FP32")]).as_numpy("OUTPUT__0")
    np.testing.assert_array_equal(out, x * 2)
