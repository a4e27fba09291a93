"""The onnxruntime plugin (plugins/modelhost-onnxruntime) through the real front ends.

The example repository's ONNX models are served by the session's server; models built here (with
the `onnx` package) go to a repository of their own. The expected values are computed with numpy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.testing import serve, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import make_examples  # noqa: E402  (the builders of the example models)

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.modelhost_only


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    weights = {t.name: numpy_helper.to_array(t) for t in make_examples.mlp_graph().initializer}
    hidden = np.maximum(x @ weights["W1"] + weights["B1"], 0)
    return hidden @ weights["W2"] + weights["B2"]


def _http(server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url, concurrency=16, network_timeout=60.0)


def _input(module, name: str, array: np.ndarray, datatype: str, binary: bool = True):
    tensor = module.InferInput(name, list(array.shape), datatype)
    if module is httpclient:
        tensor.set_data_from_numpy(array, binary_data=binary)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


# --- the example repository ------------------------------------------------------------------

@pytest.mark.parametrize("binary", [False, True])
def test_mlp_over_http(server, binary):
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    client = _http(server)
    result = client.infer("onnx_mlp", [_input(httpclient, "INPUT0", x, "FP32", binary)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (3, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, _mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_mlp_over_grpc(server):
    x = np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    out = client.infer("onnx_mlp", [_input(grpcclient, "INPUT0", x, "FP32")]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(out, _mlp_reference(x), rtol=1e-4, atol=1e-5)


def _types_inputs(module):
    arrays = {
        "TEXT_IN": ("BYTES", np.array(["héllo".encode(), b"", b"tab\there"], dtype=object)),
        "FLAGS_IN": ("BOOL", np.array([True, False, False, True])),
        "HALF_IN": ("FP16", np.array([[1.5, -2], [0.25, 100]], dtype=np.float16)),
        "COUNT_IN": ("INT64", np.array([2**40, -1, 0], dtype=np.int64)),
        "BYTE_IN": ("UINT8", np.array([0, 255, 7, 9, 1], dtype=np.uint8)),
    }
    return arrays, [_input(module, n, a, dt) for n, (dt, a) in arrays.items()]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tensor_types_including_strings(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = _http(server) if protocol == "http" else grpcclient.InferenceServerClient(server.grpc_url)
    arrays, inputs = _types_inputs(module)
    result = client.infer("onnx_types", inputs)
    assert list(result.as_numpy("TEXT_OUT")) == list(arrays["TEXT_IN"][1])
    np.testing.assert_array_equal(result.as_numpy("FLAGS_OUT"), ~arrays["FLAGS_IN"][1])
    half = result.as_numpy("HALF_OUT")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, arrays["HALF_IN"][1] * 2)
    np.testing.assert_array_equal(result.as_numpy("COUNT_OUT"), arrays["COUNT_IN"][1] + 1)
    byte = result.as_numpy("BYTE_OUT")
    assert byte.dtype == np.uint8 and list(byte) == [0, 255, 7, 9, 1]


def test_outputs_auto_completed_from_the_model(server):
    config = _http(server).get_model_config("onnx_types")
    outputs = {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]}
    assert outputs == {"TEXT_OUT": ("TYPE_STRING", [-1]), "FLAGS_OUT": ("TYPE_BOOL", [4]),
                       "HALF_OUT": ("TYPE_FP16", [2, 2]), "COUNT_OUT": ("TYPE_INT64", [3]),
                       "BYTE_OUT": ("TYPE_UINT8", [-1])}


def test_model_without_config_is_auto_completed(server):
    client = _http(server)
    config = client.get_model_config("onnx_add_sub")
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    result = client.infer("onnx_add_sub", [_input(httpclient, "INPUT0", a, "INT32"),
                                           _input(httpclient, "INPUT1", b, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_wrong_input_type_is_a_400_and_the_server_keeps_serving(server):
    client = _http(server)
    bad = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(httpclient.InferenceServerException) as info:
        client.infer("onnx_mlp", [_input(httpclient, "INPUT0", bad, "INT32")])
    assert info.value.status() == "400" and "FP32" in info.value.message()
    x = np.ones((1, 16), dtype=np.float32)
    out = client.infer("onnx_mlp", [_input(httpclient, "INPUT0", x, "FP32")]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(out, _mlp_reference(x), rtol=1e-4, atol=1e-5)


# --- models of their own ---------------------------------------------------------------------

def _save(graph, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def _scale_graph():
    """Y = X * 3 over INT32 [N, -1] (variable inner dim, so differently shaped requests exist)."""
    three = numpy_helper.from_array(np.array(3, dtype=np.int32), "three")
    return helper.make_graph(
        [helper.make_node("Mul", ["X", "three"], ["Y"])], "scale",
        [helper.make_tensor_value_info("X", TensorProto.INT32, ["N", "K"])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["N", "K"])], initializer=[three])


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("onnx_models")
    # Batched, with a long queue delay so that concurrent requests surely share one execute.
    _save(_scale_graph(), repo / "scale_batched" / "1" / "model.onnx")
    (repo / "scale_batched" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }\n'
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
        'optimization { graph { level: -1 } }\n'
        'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n')
    # A config naming an input the model does not have.
    _save(_scale_graph(), repo / "wrong_input" / "1" / "model.onnx")
    (repo / "wrong_input" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "NOPE" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')
    # A thread-count parameter that is not a number.
    _save(_scale_graph(), repo / "bad_threads" / "1" / "model.onnx")
    (repo / "bad_threads" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\n'
        'parameters { key: "intra_op_thread_count" value { string_value: "many" } }\n')
    # Not an ONNX file at all.
    (repo / "not_onnx" / "1").mkdir(parents=True)
    (repo / "not_onnx" / "1" / "model.onnx").write_bytes(b"this is not a model")
    # A GPU instance (runs only where a GPU is lent; see test_gpu_instance).
    _save(_scale_graph(), repo / "scale_gpu" / "1" / "model.onnx")
    (repo / "scale_gpu" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_GPU count: 1 } ]\n')
    with serve(repo) as server:
        yield server


def _index(server) -> dict[str, dict]:
    return {m["name"]: m for m in _http(server).get_model_repository_index()}


def _concurrently(client, model: str, name: str, arrays: list[np.ndarray]) -> list:
    """Send one request per array at once (tritonclient.http's async_infer) and wait for all."""
    pending = [client.async_infer(model, [_input(httpclient, name, a, "INT32")]) for a in arrays]
    return [p.get_result(timeout=60) for p in pending]


def test_dynamic_batching_runs_concurrent_requests_as_one_call(own_server):
    client = _http(own_server)
    before = client.get_inference_statistics("scale_batched")["model_stats"][0]
    arrays = [np.full((1, 5), i, dtype=np.int32) for i in range(4)]
    results = _concurrently(client, "scale_batched", "X", arrays)
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("Y"), array * 3)
    after = client.get_inference_statistics("scale_batched")["model_stats"][0]
    assert after["inference_count"] - before.get("inference_count", 0) == 4
    assert after["execution_count"] - before.get("execution_count", 0) == 1


def test_requests_of_different_shapes_in_one_batch_each_get_their_answer(own_server):
    client = _http(own_server)
    arrays = [np.arange(k * 2, dtype=np.int32).reshape(2, k) for k in (1, 2, 2, 3)]
    results = _concurrently(client, "scale_batched", "X", arrays)
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result.as_numpy("Y"), array * 3)


def test_load_errors_are_clear(own_server):
    index = _index(own_server)
    assert index["wrong_input"]["state"] == "UNAVAILABLE"
    assert "unexpected input 'NOPE'" in index["wrong_input"]["reason"]
    assert "['X']" in index["wrong_input"]["reason"]
    assert index["bad_threads"]["state"] == "UNAVAILABLE"
    assert "intra_op_thread_count" in index["bad_threads"]["reason"]
    assert "must be an integer" in index["bad_threads"]["reason"]
    assert index["not_onnx"]["state"] == "UNAVAILABLE"
    assert "onnxruntime could not load" in index["not_onnx"]["reason"]
    assert index["scale_batched"]["state"] == "READY"


def _cuda_usable() -> bool:
    try:
        import onnxruntime as ort

        graph = _scale_graph()
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        return session.get_providers()[0] == "CUDAExecutionProvider"
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_usable(), reason="no GPU usable by onnxruntime here")
def test_gpu_instance(own_server):
    client = _http(own_server)
    wait_until(lambda: client.is_model_ready("scale_gpu"), 30)
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = client.infer("scale_gpu", [_input(httpclient, "X", x, "INT32")]).as_numpy("Y")
    np.testing.assert_array_equal(out, x * 3)
