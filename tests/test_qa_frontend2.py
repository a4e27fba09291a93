"""Request handling that Triton's QA tests check (server repo qa/L0_optional_input, qa/L0_decoupled,
qa/L0_request_cancellation, qa/L0_grpc, qa/L0_http).

Each test reproduces, with small models of its own, one thing a QA test found modelhost doing
differently from Triton (checked against Triton 2.51 or Triton's sources):
- L0_optional_input: the dynamic batcher sends a pending batch at once when the next queued
  request gives another set of optional inputs (it cannot join), instead of waiting out
  max_queue_delay_microseconds.
- L0_grpc: the standard gRPC health service (grpc.health.v1.Health/Check, what grpc-health-probe
  asks) answers SERVING, and is guarded by a restricted `health` protocol, as in Triton.
- L0_request_cancellation (grpc_cancellation_test, test.sh): a gRPC inference call or stream
  the client cancels logs Triton's "Cancellation notification received for ..." (verbose 1) once
  and "StateRelease" (verbose 2) once, and each call starts a "New request handler" (two for
  ModelInfer at start); test.sh and the test count them in the server log. Triton's testing hook
  TRITONSERVER_DELAY_RESPONSE_COMPLETION holds a ModelInfer response, so that a client can
  cancel the call before it is answered.
- L0_input_validation (InputShapeTest): Triton's core checks a request's inputs from a hash map,
  for a few inputs the last one sent first, and after the input count: over gRPC the data-size
  errors (byte size, BYTES element count) name the last bad input, carry the request's tag, and a
  missing input is reported before them; "Got input(s)" lists the inputs in that order. Binary
  data over HTTP gets the same (core) texts. Datatype, shape (with Triton's NOTE on the batch
  dimension) and batch errors carry the tag too.
- L0_output_validation: a TorchScript model whose output datatype differs from the
  configuration's, or that returns fewer outputs than the configuration names, fails the request
  with the libtorch backend's texts (400).
- L0_decoupled: its second server passes --grpc-max-response-pool-size=1 (a flag newer than
  Triton 2.51): accepted (no effect here), and a value <= 0 refused with Triton's text.
- L0_scalar_io: an ONNX tensor of rank 0 configured with dims other than 1s is refused at load
  with the onnxruntime backend's text.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, serve

pytestmark = pytest.mark.modelhost_only

NO_PROXY = {"http": "", "https": ""}

# Tells the test it started (touches the file named by the "marker" parameter), then waits
# until its request is cancelled.
SLEEPER = """
import json, pathlib, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            pathlib.Path(json.loads(r.parameters())["marker"]).touch()
            deadline = time.monotonic() + 60
            while not r.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.int32))])
                for r in requests]
"""

# Answers OUTn for each INn the request gives.
OPTIONAL_IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            outs = []
            for n in ("INPUT0", "INPUT1"):
                t = pb_utils.get_input_tensor_by_name(r, n)
                if t is not None:
                    outs.append(pb_utils.Tensor(n.replace("INPUT", "OUTPUT"), t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outs))
        return responses
"""


def _model(root: Path, name: str, config: str, code: str, version: str = "1") -> None:
    (root / name / version).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (root / name / version / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("qa_frontend2")
    # A long queue delay: a batch that waits for it outlasts the clients' timeouts.
    _model(root, "optional_pair", """max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 120000000 }
""", OPTIONAL_IDENTITY)
    _model(root, "strings3", """max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_STRING dims: [ 4 ] },
        { name: "INPUT2" data_type: TYPE_STRING dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 4 ] } ]
""", OPTIONAL_IDENTITY)
    _model(root, "sleeper", """max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""", SLEEPER)
    with serve(root, "--log-verbose=2") as process:
        yield process


def _pending(server: ServerProcess, model: str) -> float:
    text = requests.get(server.metrics_url, proxies=NO_PROXY, timeout=10).text
    match = re.search(r'^nv_inference_pending_request_count\{model="%s",version="1"\} (\S+)$' % model,
                      text, re.M)
    return float(match.group(1)) if match else 0.0


def _wait_pending(server: ServerProcess, model: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while _pending(server, model) != count:
        assert time.monotonic() < deadline, f"{model}: never {count} pending"
        time.sleep(0.05)


# --- L0_optional_input ----------------------------------------------------------------------------

def test_batch_sent_when_next_request_gives_other_optional_inputs(server):
    """A request giving INPUT0 only waits for a batch of 3; a request giving INPUT1 only cannot
    join it, so Triton sends the first at once. The second then forms a preferred batch of 3 with
    two more INPUT1 requests. Before the fix the two first requests shared an execute (python
    backend) or waited out the (120 s) queue delay (a native backend)."""
    client = httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=60)

    def request(name: str, value: float):
        tensor = httpclient.InferInput(name, [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        return client.async_infer("optional_pair", [tensor])

    first = request("INPUT0", 1.0)
    _wait_pending(server, "optional_pair", 1)
    second = request("INPUT1", 2.0)
    result = first.get_result()  # sent when the INPUT1 request arrived
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0]]
    assert result.as_numpy("OUTPUT1") is None
    _wait_pending(server, "optional_pair", 1)
    third = request("INPUT1", 3.0)
    fourth = request("INPUT1", 4.0)
    assert second.get_result().as_numpy("OUTPUT1").tolist() == [[2.0]]
    assert third.get_result().as_numpy("OUTPUT1").tolist() == [[3.0]]
    assert fourth.get_result().as_numpy("OUTPUT1").tolist() == [[4.0]]
    stats = client.get_inference_statistics("optional_pair")["model_stats"][0]
    assert stats["execution_count"] == 2
    sizes = {s["batch_size"]: s["compute_infer"]["count"] for s in stats["batch_stats"]}
    assert sizes == {1: 1, 3: 1}
    client.close()


# --- L0_scalar_io ---------------------------------------------------------------------------------

def test_onnx_scalar_configured_with_other_dims_is_refused(tmp_path):
    """Triton's onnxruntime backend serves a rank-0 ONNX tensor configured as dims [1] (or
    [1, 1]), and refuses any other dims at load."""
    pytest.importorskip("onnx")
    pytest.importorskip("modelhost_onnxruntime")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["INPUT"], ["OUTPUT"])], "scalar",
                              [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for name, dims in (("scalar_ok", "[ 1, 1 ]"), ("scalar_bad", "[ 2 ]")):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
        (tmp_path / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
            f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: {dims} }} ]\n')
    with serve(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[7.0]], dtype=np.float32))
        assert client.infer("scalar_ok", [tensor]).as_numpy("OUTPUT").tolist() == [[7.0]]
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["scalar_bad"]["state"] == "UNAVAILABLE"
        assert index["scalar_bad"]["reason"].endswith(
            "unable to load model 'scalar_bad', scalar tensor 'INPUT', should only provide 1 in "
            "the model configuration when the model doesn't support batching. Model "
            "configuration provided: [2].")
        client.close()


# --- L0_grpc --------------------------------------------------------------------------------------

def _health_check(url: str, metadata: tuple = ()) -> bytes:
    with grpc.insecure_channel(url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=bytes, response_deserializer=bytes)
        return check(b"\n\x03any", timeout=30, metadata=metadata)  # service "any": ignored


def test_grpc_health_service_check(server):
    """grpc-health-probe's call: HealthCheckResponse{status: SERVING} (b"\\x08\\x01")."""
    assert _health_check(server.grpc_url) == b"\x08\x01"


def test_grpc_health_service_is_a_restricted_health_protocol(tmp_path):
    with serve(tmp_path, "--grpc-restricted-protocol=health:k=v") as restricted:
        with pytest.raises(grpc.RpcError) as info:
            _health_check(restricted.grpc_url)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == ("This protocol is restricted, expecting header "
                                        "'triton-grpc-protocol-k'")
        assert _health_check(restricted.grpc_url, (("triton-grpc-protocol-k", "v"),)) == b"\x08\x01"


# --- L0_request_cancellation ----------------------------------------------------------------------

def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True], ids=["infer", "stream"])
def test_grpc_cancellation_logged_as_triton(server, tmp_path, stream):
    handler = "ModelStreamInferHandler" if stream else "ModelInferHandler"
    marker = tmp_path / "started"
    log_path = Path(server.log_path)
    before = log_path.read_text(errors="replace")
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list = []
    if stream:
        client.start_stream(callback=lambda result, error: results.append(error))
        client.async_stream_infer("sleeper", [tensor], parameters={"marker": str(marker)})
    else:
        future = client.async_infer("sleeper", [tensor], lambda result, error: results.append(error),
                                    parameters={"marker": str(marker)})
    _wait_for(marker.exists, "the model never started")
    if stream:
        client.stop_stream(cancel_requests=True)
    else:
        future.cancel()

    def logged() -> str:
        return log_path.read_text(errors="replace")[len(before):]

    _wait_for(lambda: "StateRelease" in logged(), "no StateRelease line")
    lines = logged()
    assert lines.count("Cancellation notification received for ") == 1
    assert f"Cancellation notification received for {handler}, rpc_ok=1" in lines
    assert lines.count("StateRelease") == 1
    assert f"New request handler for {handler}, " in lines
    _wait_for(lambda: results, "no callback")
    assert "Locally cancelled by application!" in str(results[0])
    client.close()


def test_grpc_response_completion_delay_hook(tmp_path):
    """TRITONSERVER_DELAY_RESPONSE_COMPLETION=N: a ModelInfer response waits N ms (logged as
    Triton logs it) before it is sent; a call cancelled meanwhile ends cancelled."""
    _model(tmp_path, "ident", """max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""", OPTIONAL_IDENTITY)
    with serve(tmp_path, "--log-verbose=1",
               env={"TRITONSERVER_DELAY_RESPONSE_COMPLETION": "8000"}) as delayed:
        log_path = Path(delayed.log_path)
        assert log_path.read_text().count("New request handler for ModelInferHandler, 0") == 2
        client = grpcclient.InferenceServerClient(delayed.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        results: list = []
        future = client.async_infer("ident", [tensor], lambda result, error: results.append(error))
        _wait_for(lambda: "Delaying InferResponseComplete by 8000 ms..." in log_path.read_text(),
                  "the response was not held")
        assert not results
        future.cancel()
        _wait_for(lambda: results, "no callback")
        assert "Locally cancelled by application!" in str(results[0])
        client.close()


# --- L0_output_validation -------------------------------------------------------------------------

def test_torchscript_output_mismatch_texts(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("modelhost_pytorch")

    class Identity(torch.nn.Module):
        def forward(self, x):
            return x

    module = torch.jit.trace(Identity(), torch.zeros(1, 1))
    for name, outputs in (("wrong_type", '{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ -1 ] }'),
                          ("wrong_index", '{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }, '
                                          '{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1 ] }')):
        (tmp_path / name / "1").mkdir(parents=True)
        module.save(str(tmp_path / name / "1" / "model.pt"))
        (tmp_path / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f"output [ {outputs} ]\n")
    body = {"inputs": [{"name": "INPUT__0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    with serve(tmp_path) as torch_server:
        def infer(model: str) -> requests.Response:
            return requests.post(f"{torch_server.http_url}/v2/models/{model}/infer", json=body,
                                 proxies=NO_PROXY, timeout=60)

        response = infer("wrong_type")
        assert response.status_code == 400
        assert response.json()["error"] == ("configuration expects datatype TYPE_INT32 for output "
                                             "'OUTPUT__0', model provides TYPE_FP32")
        response = infer("wrong_index")
        assert response.status_code == 400
        assert response.json()["error"] == (
            "The output OUTPUT__1 in the model configuration refers to an output index which "
            "doesn't exist. This model has 1 outputs")


# --- L0_input_validation --------------------------------------------------------------------------

def _strings(names: list[str], count: int) -> list:
    inputs = []
    for name in names:
        tensor = grpcclient.InferInput(name, [1, count], "BYTES")
        tensor.set_data_from_numpy(np.array([[b"7"] * count], dtype=object))
        tensor.set_shape([1, 4])  # what the configuration wants, not what the data holds
        inputs.append(tensor)
    return inputs


def test_grpc_input_errors_in_tritons_order(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    names = ["INPUT0", "INPUT1", "INPUT2"]

    def error(inputs, **kwargs) -> str:
        with pytest.raises(InferenceServerException) as info:
            client.infer("strings3", inputs, **kwargs)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        return info.value.message()

    assert error(_strings(names, 3)) == (
        "[request id: <id_unknown>] expected 4 string elements for inference input 'INPUT2' for "
        "model 'strings3', got 3")
    assert error(_strings(names, 5), request_id="r1") == (
        "[request id: r1] unexpected number of string elements 5 for inference input 'INPUT2' for "
        "model 'strings3', expecting 4")
    assert error(_strings(names[:2], 3)) == (
        "[request id: <id_unknown>] expected 3 inputs but got 2 inputs for model 'strings3'. Got "
        "input(s) ['INPUT1','INPUT0'], but missing required input(s) ['INPUT2']. Please provide all "
        "required input(s).")
    inputs = []
    for name, rows, count in (("INPUT0", 1, 3), ("INPUT1", 1, 3), ("INPUT2", 1, 3)):
        tensor = grpcclient.InferInput(name, [rows, count], "BYTES")
        tensor.set_data_from_numpy(np.array([[b"7"] * count] * rows, dtype=object))
        inputs.append(tensor)
    assert error(inputs) == (
        "[request id: <id_unknown>] unexpected shape for input 'INPUT2' for model 'strings3'. "
        "Expected [-1,4], got [1,3]. NOTE: Setting a non-zero max_batch_size in the model config "
        "requires a batch dimension to be prepended to each input shape. If you want to specify "
        "the full shape including the batch dim in your input dims config, try setting "
        "max_batch_size to zero. See the model configuration docs for more info on max_batch_size.")
    inputs = _strings(names, 4)
    inputs[2] = grpcclient.InferInput("INPUT2", [2, 4], "BYTES")
    inputs[2].set_data_from_numpy(np.array([[b"7"] * 4] * 2, dtype=object))
    assert error(inputs) == ("[request id: <id_unknown>] input 'INPUT1' batch size does not match "
                             "other inputs for 'strings3'")
    client.close()


def test_http_binary_data_size_errors_are_the_cores(server):
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for name in ("INPUT0", "INPUT1", "INPUT2"):
        tensor = httpclient.InferInput(name, [1, 5], "BYTES")
        tensor.set_data_from_numpy(np.array([[b"7"] * 5], dtype=object), binary_data=True)
        tensor.set_shape([1, 4])
        inputs.append(tensor)
    with pytest.raises(InferenceServerException) as info:
        client.infer("strings3", inputs)
    assert info.value.status() == "400"
    assert info.value.message() == (
        "[request id: <id_unknown>] unexpected number of string elements 5 for inference input "
        "'INPUT2' for model 'strings3', expecting 4")
    client.close()


# --- L0_decoupled ---------------------------------------------------------------------------------

def test_grpc_max_response_pool_size_flag(tmp_path):
    with serve(tmp_path, "--grpc-max-response-pool-size=1") as pooled:
        assert httpclient.InferenceServerClient(pooled.url).is_server_ready()
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository",
                           str(tmp_path), "--grpc-max-response-pool-size=0"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Error: --grpc-max-response-pool-size must be greater than 0." in done.stderr
