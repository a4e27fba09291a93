"""Triton parity (issue 14): classification, raw binary requests, compression, loads with file
overrides, the answers clients check, data fidelity in JSON, and the `tritonserver` flags.

The real tritonclient (HTTP, gRPC and their asyncio clients) against a real `modelhost serve` of
`tests/parity_models`; the expected texts are those of Triton's current source (see
docs/triton_compat.md), and were checked against the Triton anchor where it agrees.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client as httplib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = [pytest.mark.modelhost_only, pytest.mark.timeout(120)]

HERE = Path(__file__).parent
MODELS = HERE / "parity_models"
LOAD_MODELS = HERE / "parity_load"
SCORES = np.array([[0.1, 0.7, 0.2, 0.7, 0.05]], np.float32)
# Triton's answer for SCORES, k=3: std::to_string values, ties by index, labels where not empty.
TOP3 = [b"0.700000:1:one", b"0.700000:3", b"0.200000:2:two"]


@pytest.fixture(scope="module")
def override_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("overrides")


@pytest.fixture(scope="module")
def parity(override_tmp):
    with serve(MODELS, "--model-control-mode=explicit", "--load-model=*", "--allow-client-shm=true",
               env={"TMPDIR": str(override_tmp)}) as s:
        yield s


@pytest.fixture
def http(parity):
    return httpclient.InferenceServerClient(parity.url, network_timeout=60)


@pytest.fixture
def grpcc(parity):
    return grpcclient.InferenceServerClient(parity.grpc_url)


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    host, port = server.url.rsplit(":", 1)
    conn = httplib.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _bytes(arr) -> list:
    """A BYTES result as nested lists of bytes (JSON outputs come back as str)."""
    return [_bytes(v) if isinstance(v, (list, np.ndarray)) else (v if isinstance(v, bytes) else v.encode())
            for v in arr]


def _scores_input(mod, data=SCORES):
    tensor = mod.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


# --- classification --------------------------------------------------------------------------

@pytest.mark.parametrize("binary", [True, False])
def test_classification_http_batched_with_labels(http, binary):
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3)
    result = http.infer("classify", [_scores_input(httpclient)], outputs=[out])
    described = result.get_output("OUTPUT0")
    assert described["datatype"] == "BYTES" and described["shape"] == [1, 3]
    assert _bytes(result.as_numpy("OUTPUT0")) == [TOP3]


def test_classification_grpc_and_k_beyond_the_classes(grpcc):
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=10)
    result = grpcc.infer("classify", [_scores_input(grpcclient)], outputs=[out])
    assert list(result.get_output("OUTPUT0").shape) == [1, 5]  # k is clipped to the classes
    assert result.as_numpy("OUTPUT0").tolist() == [TOP3 + [b"0.100000:0:zero", b"0.050000:4:four"]]


def test_classification_aio_clients(parity):
    batch = np.array([[1, 3, 2], [9, 8, 7]], np.float32)

    async def run():
        async with httpaio.InferenceServerClient(parity.url) as client:
            out = httpaio.InferRequestedOutput("OUTPUT0", class_count=1)
            first = await client.infer("classify", [_scores_input(httpaio, batch)], outputs=[out],
                                       request_compression_algorithm="gzip",
                                       response_compression_algorithm="deflate")
        client = grpcaio.InferenceServerClient(parity.grpc_url)
        try:
            out = grpcaio.InferRequestedOutput("OUTPUT0", class_count=2)
            second = await client.infer("classify", [_scores_input(grpcaio, batch)], outputs=[out])
        finally:
            await client.close()
        return first.as_numpy("OUTPUT0"), second.as_numpy("OUTPUT0")

    first, second = asyncio.run(run())
    assert first.tolist() == [[b"3.000000:1:one"], [b"9.000000:0:zero"]]  # one row per batch entry
    assert second.tolist() == [[b"3.000000:1:one", b"2.000000:2:two"],
                               [b"9.000000:0:zero", b"8.000000:1:one"]]


@pytest.mark.parametrize("datatype, expected", [
    ("UINT8", [b"250:1", b"7:2"]), ("UINT16", [b"250:1", b"7:2"]), ("UINT32", [b"250:1", b"7:2"]),
    ("UINT64", [b"250:1", b"7:2"]), ("INT8", [b"7:2", b"3:0"]),  # 250 wraps to -6 in INT8
    ("INT16", [b"250:1", b"7:2"]), ("INT32", [b"250:1", b"7:2"]), ("INT64", [b"250:1", b"7:2"]),
    ("FP16", [b"250.000000:1", b"7.000000:2"]), ("FP32", [b"250.000000:1", b"7.000000:2"]),
    ("FP64", [b"250.000000:1", b"7.000000:2"]),
])
def test_classification_of_every_numeric_datatype(http, grpcc, datatype, expected):
    values = np.array([3, 250, 7, 1], np.float64)
    for client, mod in ((http, httpclient), (grpcc, grpcclient)):
        tensor = mod.InferInput("INPUT0", [4], "FP64")
        tensor.set_data_from_numpy(values)
        out = mod.InferRequestedOutput(f"OUT_{datatype}", class_count=2)
        result = client.infer("cast_types", [tensor], outputs=[out])
        assert result.as_numpy(f"OUT_{datatype}").tolist() == expected  # unbatched: shape [k]


@pytest.mark.parametrize("datatype", ["BYTES", "BOOL"])
def test_classification_of_non_numeric_outputs_is_refused(http, grpcc, datatype):
    message = f"class result not available for output due to unsupported type '{datatype}'"
    for client, mod, status in ((http, httpclient, "400"),
                                (grpcc, grpcclient, "StatusCode.INVALID_ARGUMENT")):
        tensor = mod.InferInput("INPUT0", [2], "FP64")
        tensor.set_data_from_numpy(np.array([1, 2], np.float64))
        out = mod.InferRequestedOutput(f"OUT_{datatype}", class_count=1)
        error = _error(lambda c=client, t=tensor, o=out: c.infer("cast_types", [t], outputs=[o]))
        assert (error.status(), error.message()) == (status, message)
    assert http.is_server_live()


def test_classification_parameter_errors(parity, http, grpcc):
    base = {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [2], "data": [1, 2]}]}
    for value in (-1, "3", 1.5, True):
        body = dict(base, outputs=[{"name": "OUT_FP32", "parameters": {"classification": value}}])
        status, _, raw = _post(parity, "/v2/models/cast_types/infer", json.dumps(body).encode())
        assert status == 400 and json.loads(raw)["error"] == (
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer")
    body = dict(base, outputs=[{"name": "OUT_FP32", "parameters": {"classification": 0}}])
    status, _, raw = _post(parity, "/v2/models/cast_types/infer", json.dumps(body).encode())
    assert status == 200 and json.loads(raw)["outputs"][0]["datatype"] == "FP32"  # 0: not asked
    tensor = grpcclient.InferInput("INPUT0", [2], "FP64")
    tensor.set_data_from_numpy(np.array([1, 2], np.float64))
    error = _error(lambda: grpcc.infer("cast_types", [tensor],
                                       outputs=[grpcclient.InferRequestedOutput("OUT_FP32", class_count=-2)]))
    assert error.message() == "invalid value for 'classification' parameter, expected >= 0"


def test_classification_of_a_too_large_tensor_is_refused(http):
    big = np.zeros((1, 1_000_001), np.float32)
    out = httpclient.InferRequestedOutput("OUTPUT0", class_count=1)
    error = _error(lambda: http.infer("classify", [_scores_input(httpclient, big)], outputs=[out]))
    assert (error.status(), error.message()) == ("400", "classification output tensor too large")


def test_classification_into_shared_memory(parity):
    """tritonclient refuses this combination on its side (and Triton refuses it); modelhost
    writes the classes into the region: a request in plain JSON over HTTP, and over gRPC."""
    key = f"/mh_parity_cls_{os.getpid()}"
    region = shm.create_shared_memory_region("cls", key, 512)
    http_client = httpclient.InferenceServerClient(parity.url)
    try:
        http_client.register_system_shared_memory("cls", key, 512)
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 5],
                            "data": SCORES.ravel().tolist()}],
                "outputs": [{"name": "OUTPUT0", "parameters": {
                    "classification": 3, "shared_memory_region": "cls",
                    "shared_memory_byte_size": 256}}]}
        status, _, raw = _post(parity, "/v2/models/classify/infer", json.dumps(body).encode())
        assert status == 200, raw
        assert json.loads(raw)["outputs"][0] == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 3]}
        assert shm.get_contents_as_numpy(region, np.object_, [1, 3]).tolist() == [TOP3]
        request = pb.ModelInferRequest(model_name="classify")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 5])
        request.raw_input_contents.append(SCORES.tobytes())
        out = request.outputs.add(name="OUTPUT0")
        out.parameters["classification"].int64_param = 2
        out.parameters["shared_memory_region"].string_param = "cls"
        out.parameters["shared_memory_byte_size"].int64_param = 256
        out.parameters["shared_memory_offset"].int64_param = 256
        with grpc.insecure_channel(parity.grpc_url) as channel:
            response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
        assert list(response.outputs[0].shape) == [1, 2] and response.outputs[0].datatype == "BYTES"
        assert shm.get_contents_as_numpy(region, np.object_, [1, 2], offset=256).tolist() == [TOP3[:2]]
    finally:
        http_client.unregister_system_shared_memory("cls")
        shm.destroy_shared_memory_region(region)


# --- raw binary requests ---------------------------------------------------------------------

def test_raw_binary_request(parity):
    values = np.array([3, 250, 7, 1], np.float64)
    status, headers, body = _post(parity, "/v2/models/cast_types/infer", values.tobytes(),
                                  {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    length = int(headers["inference-header-content-length"])
    header = json.loads(body[:length])
    outputs = {o["name"]: o for o in header["outputs"]}
    assert outputs["OUT_INT32"]["shape"] == [4] and "binary_data_size" in outputs["OUT_INT32"]["parameters"]
    assert len(body) == length + sum(o["parameters"]["binary_data_size"] for o in header["outputs"])
    # a batching model gets batch size 1; BYTES raw input becomes one element
    status, _, body = _post(parity, "/v2/models/identity_bytes/infer", b"\xff\x00hello",
                            {"Inference-Header-Content-Length": "0"})
    assert status == 200 and body.endswith(b"\x07\x00\x00\x00\xff\x00hello")


def test_raw_binary_request_errors(parity):
    status, _, body = _post(parity, "/v2/models/classify/infer", SCORES.tobytes(),
                            {"Inference-Header-Content-Length": "0"})
    assert status == 400 and json.loads(body)["error"] == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but "
        "got 2 inputs in 'classify' model configuration")
    status, _, body = _post(parity, "/v2/models/cast_types/infer", b"abc",
                            {"Inference-Header-Content-Length": "0"})
    assert status == 400 and json.loads(body)["error"] == (
        "[request id: <id_unknown>] input byte size mismatch for input 'raw_input' for model "
        "'cast_types'. Expected 0, got 3")


# --- datatypes the server does not know --------------------------------------------------------

def _json_infer(parity, doc: dict, payload: bytes = b"") -> tuple[int, str]:
    header = json.dumps(doc).encode()
    status, _, body = _post(parity, "/v2/models/cast_types/infer", header + payload,
                            {"Inference-Header-Content-Length": str(len(header))} if payload else {})
    return status, json.loads(body)["error"]


def test_unknown_datatype_texts(parity):
    """Triton's texts, checked against Triton 2.51: its front end words JSON data of an unknown
    datatype; binary data and gRPC's raw contents reach its core, which compares the datatype
    (named '<invalid>') with the model's; gRPC's typed contents are compared with it."""
    item = {"name": "INPUT0", "datatype": "FOO", "shape": [2]}
    assert _json_infer(parity, {"inputs": [dict(item, data=[1, 2])]}) == (
        400, "invalid datatype for input INPUT0")
    binary = {"inputs": [dict(item, parameters={"binary_data_size": 16})]}
    core_text = ("[request id: <id_unknown>] inference input 'INPUT0' data-type is '<invalid>', but "
                 "model 'cast_types' expects 'FP64'")
    assert _json_infer(parity, binary, b"\0" * 16) == (400, core_text)
    assert _json_infer(parity, binary, b"\0" * 16) == (400, core_text)  # (a repeated header too)
    # an unknown input name is found first, as in Triton's core
    assert _json_infer(parity, {"inputs": [dict(item, name="X", parameters={"binary_data_size": 16})]},
                       b"\0" * 16) == (400, "unexpected inference input 'X' for model 'cast_types'")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(parity.grpc_url))

    def grpc_error(request) -> str:
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return info.value.details()

    for datatype in ("FOO", ""):
        request = pb.ModelInferRequest(model_name="cast_types")
        request.inputs.add(name="INPUT0", datatype=datatype, shape=[2])
        request.raw_input_contents.append(b"\0" * 16)
        assert grpc_error(request) == core_text
    request = pb.ModelInferRequest(model_name="cast_types")
    request.inputs.add(name="INPUT0", datatype="FOO", shape=[2]).contents.fp32_contents.extend([1, 2])
    assert grpc_error(request) == ("unexpected explicit tensor data for input tensor 'INPUT0' for "
                                   "model 'cast_types' of type 'FP32', expected datatype '<invalid>'")
    # and the server goes on serving
    ok = httpclient.InferInput("INPUT0", [2], "FP64")
    ok.set_data_from_numpy(np.array([1.0, 2.0]))
    result = httpclient.InferenceServerClient(parity.url).infer("cast_types", [ok])
    assert result.as_numpy("OUT_FP64").tolist() == [1.0, 2.0]


# --- compression -----------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_request_and_response_compression(http, algorithm):
    result = http.infer("classify", [_scores_input(httpclient)],
                        request_compression_algorithm=algorithm,
                        response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SCORES)


def test_http_compression_on_the_wire(parity):
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 5],
                                   "data": SCORES.ravel().tolist()}]}).encode()
    status, headers, raw = _post(parity, "/v2/models/classify/infer", zlib.compress(body),
                                 {"Content-Encoding": "deflate", "Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(raw))["outputs"][0]["shape"] == [1, 5]
    status, headers, raw = _post(parity, "/v2/models/classify/infer", body, {"Content-Encoding": "br"})
    assert (status, json.loads(raw)["error"]) == (501, "Unsupported compression type")
    assert headers["accept-encoding"] == "gzip, deflate"


def test_decompressed_size_is_bounded_while_inflating(parity):
    bomb = gzip.compress(b" " * (65 * 1024 * 1024), 9)  # 64 KiB that inflate past the 64 MiB limit
    status, _, raw = _post(parity, "/v2/models/classify/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and json.loads(raw)["error"].startswith(
        "Decompressed data size exceeds the maximum allowed value of 67108864 bytes.")


def test_grpc_compression(grpcc):
    for algorithm in ("gzip", "deflate"):
        result = grpcc.infer("classify", [_scores_input(grpcclient)], compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SCORES)


# --- loads with file overrides ---------------------------------------------------------------

def _override_files() -> dict[str, bytes]:
    model_dir = MODELS / "classify"
    return {"file:1/model.py": (model_dir / "1" / "model.py").read_bytes(),
            "file:labels.txt": b"a\nb\nc\nd\ne\n"}


def _override_config(name: str, label_file: str = "labels.txt") -> str:
    return json.dumps({
        "name": name, "backend": "python", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1],
                    "label_filename": label_file}]})


def _override_dirs(override_tmp: Path) -> list[Path]:
    return sorted(override_tmp.glob("modelhost-override-*"))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_with_file_overrides(parity, override_tmp, protocol):
    client = (httpclient.InferenceServerClient(parity.url) if protocol == "http"
              else grpcclient.InferenceServerClient(parity.grpc_url))
    mod = httpclient if protocol == "http" else grpcclient
    name = f"ov_{protocol}"
    before = _override_dirs(override_tmp)
    client.load_model(name, config=_override_config(name), files=_override_files())
    assert client.is_model_ready(name)
    [folder] = [d for d in _override_dirs(override_tmp) if d not in before]
    assert (folder / "1" / "model.py").is_file() and oct(folder.stat().st_mode & 0o777) == "0o700"
    out = mod.InferRequestedOutput("OUTPUT0", class_count=1)
    result = client.infer(name, [_scores_input(mod)], outputs=[out])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"0.700000:1:b"]]  # the override's labels
    client.unload_model(name)
    assert not folder.exists()  # removed with the model


def test_reload_without_files_returns_to_the_repository(http, override_tmp):
    before = _override_dirs(override_tmp)
    out = httpclient.InferRequestedOutput("OUTPUT0", class_count=1)
    http.load_model("classify", config=_override_config("classify"), files=_override_files())
    [folder] = [d for d in _override_dirs(override_tmp) if d not in before]
    result = http.infer("classify", [_scores_input(httpclient)], outputs=[out])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"0.700000:1:b"]]  # labels of the override
    http.load_model("classify")
    result = http.infer("classify", [_scores_input(httpclient)], outputs=[out])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"0.700000:1:one"]]  # the repository's again
    assert not folder.exists()


def test_file_override_errors(http, grpcc, override_tmp, parity):
    """Triton answers an override it cannot write (or one without a config) as a poll failure:
    INTERNAL with its fixed text, the cause in the server log (its L0_lifecycle checks the text)."""
    files = _override_files()
    before = _override_dirs(override_tmp)
    poll = "failed to load 'ov_x', failed to poll from model repository"
    cases = [
        (lambda c: c.load_model("ov_x", files=files), poll,
         "Load parameter 'config' must be specified for model file override"),
        (lambda c: c.load_model("ov_x", config=_override_config("ov_x"),
                                files={"file:1/../../evil.py": b"x"}), poll,
         "must stay within model directory."),
    ]
    for client in (http, grpcc):
        for call, message, cause in cases:
            error = _error(lambda f=call, c=client: f(c))
            assert error.message() == message, error.message()
            assert error.status() in ("500", "StatusCode.INTERNAL"), error.status()
            assert any(cause in line for line in parity.log_text().splitlines()
                       if "Poll failed for model directory 'ov_x': " in line), cause
        # a label file outside the model fails the load itself, with its own message
        error = _error(lambda c=client: c.load_model(
            "ov_x", config=_override_config("ov_x", "../../labels.txt"), files=files))
        assert "for output 'OUTPUT0' in model 'ov_x' is outside model directory" in error.message()
        assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), error.status()
    assert _override_dirs(override_tmp) == before  # nothing left behind


def test_override_size_is_bounded(tmp_path):
    from host import overrides
    from host.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match="total 11 bytes, more than the 10 bytes allowed"):
        overrides.write("m", {"1/a": b"x" * 6, "1/b": b"y" * 5}, 10)


# --- answers clients check -------------------------------------------------------------------

def test_input_count_errors_with_optional_inputs(http, grpcc):
    scale = httpclient.InferInput("SCALE", [1, 1], "FP32")
    scale.set_data_from_numpy(np.ones((1, 1), np.float32))
    extra = httpclient.InferInput("X", [1, 1], "FP32")
    extra.set_data_from_numpy(np.ones((1, 1), np.float32))
    error = _error(lambda: http.infer("classify", [_scores_input(httpclient), scale, extra]))
    # Triton lists them from its hash map: the reverse of their order (checked against 2.51)
    assert error.message() == (
        "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 3 inputs for "
        "model 'classify'. Got input(s) ['X','SCALE','INPUT0'], but missing required input(s) ]. "
        "Please provide all required input(s).")
    error = _error(lambda: grpcc.infer("classify", [], request_id="r7"))
    assert error.message() == (
        "[request id: r7] expected number of inputs between 1 and 2 but got 0 inputs for model "
        "'classify'. Got input(s) [], but missing required input(s) ['INPUT0']. Please provide all "
        "required input(s).")
    error = _error(lambda: http.infer("cast_types", []))
    assert error.message().startswith(
        "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'cast_types'.")
    error = _error(lambda: http.infer("classify", [extra]))  # the count fits: the name does not
    assert error.message() == "unexpected inference input 'X' for model 'classify'"
    # the optional input is optional
    result = http.infer("classify", [_scores_input(httpclient), scale])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SCORES)


def test_model_control_refused_in_none_mode(client):
    """The session server (conftest) runs in the default 'none' mode."""
    error = _error(lambda: client.load_model("simple"))
    assert (error.status(), error.message()) == (
        "503", "explicit model load / unload is not allowed if polling is enabled")


def test_model_control_refused_in_none_mode_grpc(server):
    """The session server (conftest): 'none' mode, no --id."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for call in (lambda: client.load_model("simple"), lambda: client.unload_model("simple")):
        error = _error(call)
        assert (error.status(), error.message()) == (
            "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")
    assert client.get_server_metadata().name == "modelhost"


def test_load_with_an_invalid_config_override(http, grpcc, parity):
    """Triton's answer: its poll failure (INTERNAL), "Invalid config override" in the server log
    (which its L0_http and L0_grpc tests grep for)."""
    for client in (http, grpcc):
        error = _error(lambda c=client: c.load_model("cast_types", config="{not json"))
        assert error.message() == "failed to load 'cast_types', failed to poll from model repository"
        assert error.status() in ("500", "StatusCode.INTERNAL")
        assert client.is_model_ready("cast_types")  # the loaded version keeps serving
    assert "Poll failed for model directory 'cast_types': Invalid config override:" in parity.log_text()


@pytest.mark.parametrize("name, message", [
    ("  ", "Model name cannot be empty. Please enter a valid name to deploy."),
    ("a/b", "invalid model name 'a/b', model name must not contain path traversal characters"),
    ("..", "invalid model name '..', model name must not contain path traversal characters"),
])
def test_model_names_are_validated_on_load(http, grpcc, name, message):
    error = _error(lambda: grpcc.load_model(name))
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    if "/" not in name and name != "..":  # the others do not survive as one URL path segment
        error = _error(lambda: http.load_model(name))
        assert (error.status(), error.message()) == ("400", message)


def test_empty_final_response_parameter(parity):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [1], "data": [1]}],
            "parameters": {"triton_enable_empty_final_response": True}}
    status, _, raw = _post(parity, "/v2/models/cast_types/infer", json.dumps(body).encode())
    assert (status, json.loads(raw)["error"]) == (
        400, ("parameter keys starting with 'triton_' are reserved for Triton usage and should not "
              "be specified."))
    # gRPC takes it (tritonclient sets it itself on streams); other triton_ keys are refused
    def grpc_infer(key: str) -> tuple[grpc.StatusCode, str]:
        request = pb.ModelInferRequest(model_name="cast_types")
        request.inputs.add(name="INPUT0", datatype="FP64", shape=[1])
        request.raw_input_contents.append(np.ones(1).tobytes())
        request.parameters[key].bool_param = True
        with grpc.insecure_channel(parity.grpc_url) as channel:
            try:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
                return grpc.StatusCode.OK, ""
            except grpc.RpcError as err:
                return err.code(), err.details()

    assert grpc_infer("triton_enable_empty_final_response") == (grpc.StatusCode.OK, "")
    assert grpc_infer("triton_x") == (
        grpc.StatusCode.INVALID_ARGUMENT,
        ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
         "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"))


# --- data fidelity in JSON -------------------------------------------------------------------

def test_nan_and_infinities_survive_json(parity, http):
    values = np.array([np.nan, np.inf, -np.inf, 1.5])
    tensor = httpclient.InferInput("INPUT0", [4], "FP64")
    tensor.set_data_from_numpy(values, binary_data=False)  # tritonclient writes NaN / Infinity
    outs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUT_FP32", "OUT_FP64")]
    result = http.infer("cast_types", [tensor], outputs=outs)
    for name in ("OUT_FP32", "OUT_FP64"):
        np.testing.assert_array_equal(result.as_numpy(name), values.astype(result.as_numpy(name).dtype))
    # on the wire, as Triton writes them; its parser's other spellings are taken too
    body = (b'{"inputs":[{"name":"INPUT0","datatype":"FP64","shape":[5],'
            b'"data":[NaN,Infinity,-Infinity,Inf,-Inf]}],"outputs":[{"name":"OUT_FP64"}]}')
    status, _, raw = _post(parity, "/v2/models/cast_types/infer", body)
    assert status == 200 and b'"data":[NaN,Infinity,-Infinity,Infinity,-Infinity]' in raw


@pytest.mark.parametrize("element", [b"\xff\xfeab", "caf\xe9".encode(), b"\xc3", b"a\xed\xa0\x80b"])
def test_bytes_that_are_not_utf8_survive_a_json_round_trip(parity, element):
    def infer(value: bytes) -> tuple[int, bytes]:
        body = (b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1],"data":["' + value
                + b'"]}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}}]}')
        status, _, raw = _post(parity, "/v2/models/identity_bytes/infer", body)
        return status, raw

    status, raw = infer(element)
    assert status == 200, raw
    assert b'"data":["' + element + b'"]' in raw  # the bytes as they came, as Triton writes them
    status, again = infer(raw.split(b'"data":["')[1].split(b'"]')[0])
    assert status == 200 and again == raw


# --- flags -----------------------------------------------------------------------------------

def test_every_triton_flag(tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    flags = [
        "--model-repository", str(LOAD_MODELS), "--model-control-mode=explicit",
        "--load-model=wait_a", "--load-model=wait_b", "--load-model=classify",
        "--id=parity-server",
        "--backend-config=python,shm-default-byte-size=8388608",
        "--backend-config=default-max-batch-size=8",
        "--model-load-thread-count=2",
        "--disable-auto-complete-config",
        "--model-config-name=h100",
        "--strict-readiness=true",
        "--rate-limit=off", "--rate-limit-resource=R1:4:0",
        "--pinned-memory-pool-byte-size=1048576",
        "--cuda-memory-pool-byte-size=0:1048576",
        "--cuda-virtual-address-size=0:1048576",
        f"--log-file={tmp_path / 'server.log'}", "--log-format=ISO8601",
        "--log-info=true", "--log-warning=false", "--log-error=true",
    ]
    with serve(MODELS, *flags, env={"PARITY_GATE": str(gate)}) as s:
        client = httpclient.InferenceServerClient(s.url)
        assert client.get_server_metadata()["name"] == "parity-server"
        # the log flags (docs/observability.md; tests/test_logging_ext.py checks the lines)
        assert client.get_log_settings() == {
            "log_file": str(tmp_path / "server.log"), "log_info": True, "log_warning": False,
            "log_error": True, "log_verbose_level": 0, "log_format": "ISO8601"}
        assert "successfully loaded 'wait_a'" in (tmp_path / "server.log").read_text()
        assert grpcclient.InferenceServerClient(s.grpc_url).get_server_metadata().name == "parity-server"
        # --model-load-thread-count: each of the two waited for the other while loading
        for name in ("wait_a", "wait_b"):
            tensor = httpclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.ones(1, np.float32))
            assert client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist() == [True]
        # --model-config-name: classify/configs/h100.pbtxt
        assert client.get_model_config("classify")["max_batch_size"] == 4
        # --disable-auto-complete-config: the python model's auto_complete_config is not run
        client.load_model("needs_autocomplete")
        assert client.get_model_config("needs_autocomplete").get("input", []) == []
        # --strict-readiness: not ready while a model that was asked to load is not
        assert client.is_server_ready()
        error = _error(lambda: client.load_model("broken"))
        assert "broken on purpose" in error.message()
        assert not client.is_server_ready()
        client.unload_model("broken")
        assert client.is_server_ready()


def test_auto_complete_is_on_by_default():
    with serve(LOAD_MODELS, "--model-control-mode=explicit", "--load-model=needs_autocomplete") as s:
        config = httpclient.InferenceServerClient(s.url).get_model_config("needs_autocomplete")
        assert [t["name"] for t in config["input"]] == ["INPUT0"]


def test_refused_flags_say_why():
    # (--allow-sagemaker and --allow-vertex-ai are served now: tests/test_cloud_frontends.py)
    for flag, message in (("--model-config-name=", "empty argument for --model-config-name"),):
        done = subprocess.run([sys.executable, "-m", "host", "serve", flag, "--model-repository",
                               str(MODELS)], check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and message in done.stderr, done.stderr


def test_help_says_which_flags_have_no_effect():
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--help"], check=True,
                          capture_output=True, text=True, timeout=60)
    text = " ".join(done.stdout.split())
    for flag in ("--pinned-memory-pool-byte-size",
                 "--cuda-memory-pool-byte-size", "--cuda-virtual-address-size"):
        entry = text.split(f" {flag} ", 1)[1].split(" --", 1)[0]
        assert "no effect" in entry, entry


def test_backend_config_reaches_backends():
    from host.backends.python import settings
    from host.errors import InvalidArgumentError
    from host.native.backend import backend_config
    cmdline = json.loads(backend_config(Path("/b/x/libtriton_x.so"), None,
                                        {"default-max-batch-size": "8", "k": "v"}))["cmdline"]
    assert cmdline["default-max-batch-size"] == "8" and cmdline["k"] == "v"
    assert cmdline["auto-complete-config"] == "true"
    settings.check({"shm-default-byte-size": "8388608", "stub-timeout-seconds": "30"})
    with pytest.raises(InvalidArgumentError, match="stub-timeout-seconds can't be smaller than or equal to zero."):
        settings.check({"stub-timeout-seconds": "0"})
