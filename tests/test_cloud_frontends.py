"""Triton's cloud front ends: SageMaker (--allow-sagemaker) and Vertex AI (--allow-vertex-ai).

A real `modelhost serve`, real sockets, and `tritonclient.http`'s own request and response
framing, as Triton's L0_sagemaker and L0_vertex_ai clients use them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.testing import ServerProcess, _distinct_free_ports

ADDSUB = '''
import numpy as np
import triton_python_backend_utils as pb_utils

SIGN = {sign}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            if (a == -1).all():
                raise pb_utils.TritonModelException("CUDA out of memory: tried to allocate")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + SIGN * b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - SIGN * b).astype(np.int32))]))
        return out
'''
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
'''
ENSEMBLE = '''
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ {
  model_name: "adder" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
'''
DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def write_model(root: Path, name: str, sign: int = 1) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name))
    (folder / "1" / "model.py").write_text(ADDSUB.format(sign=sign))
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cloud_repo")
    write_model(root, "addsub", 1)
    write_model(root, "subadd", -1)
    return root


def request_body(binary_input: bool = False, binary_output: bool = False,
                 data: np.ndarray = DATA) -> tuple[bytes, int | None]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(data, binary_data=binary_input)
    inputs[1].set_data_from_numpy(data, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body, length


def call(url: str, method: str = "GET", data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def outputs(content: bytes, header_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    result = httpclient.InferenceServerClient.parse_response_body(content, header_length=header_length)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if call(url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready: {url}\n{log.read_text()[-3000:]}")


def run_to_exit(repo: Path, args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    """A server that must refuse to start: its exit status and log."""
    http, grpc, metrics = _distinct_free_ports(3)
    log = tmp_path / "refused.log"
    cmd = [sys.executable, "-m", "host", "serve", "--model-repository", str(repo),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), *args]
    with open(log, "wb") as out:
        proc = subprocess.run(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                              timeout=120)
    return proc.returncode, log.read_text()


# --- Vertex AI -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vertex(repo):
    (port,) = _distinct_free_ports(1)
    env = {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}
    server = ServerProcess(repo, "--allow-vertex-ai=true", "--vertex-ai-port", str(port),
                           "--vertex-ai-default-model", "addsub", env=env)
    with server:
        server.vertex = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield server


def test_vertex_started_and_health(vertex):
    assert "Started Vertex AI HTTPService at 0.0.0.0:" in vertex.log_text()
    assert "Started HTTPService at" in vertex.log_text()  # HTTP stays on outside AIP_MODE
    status, _, data = call(vertex.vertex + "/health")
    assert (status, data) == (200, b"")
    status, _, data = call(vertex.vertex + "/health", "POST", b"")
    assert status == 405 and json.loads(data) == {"error": "Method Not Allowed"}
    assert call(vertex.vertex + "/nowhere")[0] == 400


def test_vertex_predict_json_and_binary(vertex):
    body, _ = request_body()
    status, headers, content = call(vertex.vertex + "/predict", "POST", body,
                                    {"Content-Type": "application/json"})
    assert status == 200, content
    out0, out1 = outputs(content)
    assert (out0 == DATA * 2).all() and (out1 == 0).all()

    body, length = request_body(binary_input=True)
    status, _, content = call(vertex.vertex + "/predict", "POST", body, {
        "Content-Type": f"application/vnd.vertex-ai-triton.binary+json;json-header-size={length}"})
    assert status == 200, content
    assert (outputs(content)[0] == DATA * 2).all()

    body, _ = request_body(binary_output=True)
    status, headers, content = call(vertex.vertex + "/predict", "POST", body,
                                    {"Content-Type": "application/json"})
    assert status == 200
    out0, _ = outputs(content, int(headers["Inference-Header-Content-Length"]))
    assert (out0 == DATA * 2).all()


@pytest.mark.parametrize("content_type,message", [
    ("additional-string/application/vnd.vertex-ai-triton.binary+json;json-header-size={n}",
     "expect MIME type for binary data starts with"),
    ("application/vnd.vertex-ai-triton.binary+json;json-header-size=additional-string{n}",
     "Unable to parse inference header size, got: additional-string"),
    ("application/vnd.vertex-ai-triton.binary+json;json-header-size=-123",
     "inference header size should be in range (0, "),
    ("application/vnd.vertex-ai-triton.binary+json;json-header-size=99999999999",
     "value is out of range"),
])
def test_vertex_malformed_binary_header(vertex, content_type, message):
    body, length = request_body(binary_input=True)
    status, _, content = call(vertex.vertex + "/predict", "POST", body,
                              {"Content-Type": content_type.format(n=length)})
    assert status == 400 and message in json.loads(content)["error"]
    assert call(vertex.http_url + "/v2/health/ready")[0] == 200


def test_vertex_redirects(vertex):
    body, _ = request_body()
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/subadd/infer"}
    status, _, content = call(vertex.vertex + "/predict", "POST", body, redirect)
    assert status == 200
    out0, out1 = outputs(content)
    assert (out0 == 0).all() and (out1 == DATA * 2).all()

    def redirected(endpoint: str, data: bytes = b"") -> tuple[int, bytes]:
        status, _, content = call(vertex.vertex + "/predict", "POST", data,
                                  {"X-Vertex-Ai-Triton-Redirect": endpoint})
        return status, content

    assert redirected("v2/models/addsub/ready")[0] == 200
    assert redirected("v2/models/addsub/versions/1/ready")[0] == 200
    assert json.loads(redirected("v2/models/addsub/config")[1])["name"] == "addsub"
    assert json.loads(redirected("v2/models/addsub")[1])["name"] == "addsub"
    assert json.loads(redirected("v2")[1])["name"] == "modelhost"
    assert redirected("v2/health/live")[0] == 200
    stats = json.loads(redirected("v2/models/stats")[1])
    assert {m["name"] for m in stats["model_stats"]} >= {"addsub", "subadd"}
    index = json.loads(redirected("v2/repository/index", b"{}")[1])
    assert {m["name"] for m in index} == {"addsub", "subadd"}
    assert redirected("v2/systemsharedmemory/status")[0] == 200
    status, content = redirected("metrics")
    assert status == 200 and b"nv_inference_request_success" in content
    # Anything that changes the server's state is for the V2 port only.
    assert redirected("v2/repository/models/addsub/unload", b"{}")[0] == 403
    assert redirected("v2/systemsharedmemory/region/r/register", b"{}")[0] == 403
    assert redirected("v2/cudasharedmemory/region/r/unregister")[0] == 403
    assert redirected("v2/models/addsub/trace/setting")[0] == 400
    assert redirected("v2/models/addsub/ready")[0] == 200  # still loaded
    status, _, _ = call(vertex.vertex + "/predict", "GET", None,
                        {"X-Vertex-Ai-Triton-Redirect": "v2/models/addsub/ready"})
    assert status == 405


def test_vertex_refuses_to_start(repo, tmp_path):
    code, log = run_to_exit(repo, ["--allow-vertex-ai=true"], {"AIP_HEALTH_ROUTE": "/health"},
                            tmp_path)
    assert code != 0 and "failed to start Vertex AI service: Invalid argument - " \
        "API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in log
    code, log = run_to_exit(repo, ["--allow-vertex-ai=true"], {"AIP_PREDICT_ROUTE": "/p"}, tmp_path)
    assert code != 0 and "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint" in log
    routes = {"AIP_PREDICT_ROUTE": "/p", "AIP_HEALTH_ROUTE": "/h"}
    code, log = run_to_exit(repo, ["--allow-vertex-ai=true"], routes, tmp_path)
    assert code != 0 and ("Expect the model repository contains only a single model if default "
                          "model is not specified") in log
    code, log = run_to_exit(repo, ["--allow-vertex-ai=true", "--vertex-ai-default-model", "nope"],
                            routes, tmp_path)
    assert code != 0 and "Expect the default model 'nope' is loaded" in log


def test_vertex_prediction_mode_turns_http_and_grpc_off(repo, tmp_path):
    single = tmp_path / "single"
    write_model(single, "addsub")
    vport, http, grpc, metrics = _distinct_free_ports(4)
    log = tmp_path / "aip.log"
    env = {**os.environ, "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(vport),
           "AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}
    cmd = [sys.executable, "-m", "host", "serve", "--model-repository", str(single),
           "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{vport}/health", proc, log)
        body, _ = request_body()
        status, _, content = call(f"http://127.0.0.1:{vport}/predict", "POST", body)
        assert status == 200 and (outputs(content)[0] == DATA * 2).all()
        with pytest.raises(OSError):
            call(f"http://127.0.0.1:{http}/v2/health/ready")
        text = log.read_text()
        assert "Started Vertex AI HTTPService at" in text
        assert "Started HTTPService at" not in text
        assert "Started GRPCInferenceService at" not in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


# --- SageMaker -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sagemaker(repo, tmp_path_factory):
    (port,) = _distinct_free_ports(1)
    models_root = tmp_path_factory.mktemp("opt_ml_models")
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "addsub",
           "MODELHOST_SAGEMAKER_MODELS_ROOT": str(models_root)}
    server = ServerProcess(repo, "--allow-sagemaker=true", "--sagemaker-port", str(port),
                           "--model-control-mode=explicit", "--load-model=addsub", env=env)
    with server:
        server.sagemaker = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        server.models_root = models_root  # type: ignore[attr-defined]
        yield server


def test_sagemaker_ping_and_invocations(sagemaker):
    assert "Started Sagemaker HTTPService at 0.0.0.0:" in sagemaker.log_text()
    assert call(sagemaker.sagemaker + "/ping")[:3:2] == (200, b"")
    assert call(sagemaker.sagemaker + "/ping", "POST", b"")[0] == 405
    body, _ = request_body()
    status, headers, content = call(sagemaker.sagemaker + "/invocations", "POST", body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert (outputs(content)[0] == DATA * 2).all()

    body, length = request_body(binary_input=True, binary_output=True)
    mime = "application/vnd.sagemaker-triton.binary+json;json-header-size="
    status, headers, content = call(sagemaker.sagemaker + "/invocations", "POST", body,
                                    {"Content-Type": mime + str(length)})
    assert status == 200 and headers["Content-Type"].startswith(mime)
    assert "Inference-Header-Content-Length" not in headers
    out0, _ = outputs(content, int(headers["Content-Type"][len(mime):]))
    assert (out0 == DATA * 2).all()
    assert call(sagemaker.sagemaker + "/elsewhere")[0] == 400


def test_sagemaker_out_of_memory_is_507(sagemaker):
    body, _ = request_body(data=np.full((1, 16), -1, np.int32))
    status, _, content = call(sagemaker.sagemaker + "/invocations", "POST", body)
    assert status == 507 and "CUDA out of memory" in json.loads(content)["error"]


def test_sagemaker_multi_model_endpoint(sagemaker, repo):
    root = sagemaker.models_root
    single = root / "a1b2" / "model"
    write_model(single, "addsub_archive", -1)
    ens = root / "c3d4" / "model"
    write_model(ens, "adder")
    (ens / "pipeline").mkdir()
    (ens / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    (ens / "pipeline" / "1").mkdir()
    base = sagemaker.sagemaker

    assert json.loads(call(base + "/models")[2]) == {"models": []}
    assert call(base + "/models/a1b2")[0] == 404
    load = json.dumps({"model_name": "a1b2", "url": str(single)}).encode()
    status, _, content = call(base + "/models", "POST", load)
    assert status == 200, content
    assert json.loads(call(base + "/models/a1b2")[2]) == {"modelName": "a1b2", "modelUrl": str(single)}
    assert json.loads(call(base + "/models")[2]) == {
        "models": [{"modelName": "a1b2", "modelUrl": str(single)}]}
    body, _ = request_body()
    status, _, content = call(base + "/models/a1b2/invoke", "POST", body)
    assert status == 200, content
    assert (outputs(content)[0] == 0).all()  # the archive's model subtracts

    # An archive with several models serves its ensemble, under the name SageMaker gives it.
    load = json.dumps({"model_name": "c3d4", "url": str(ens)}).encode()
    status, _, content = call(base + "/models", "POST", load,
                              {"X-Amzn-SageMaker-Target-Model": "pipeline_tgz"})
    assert status == 200, content
    inputs = [httpclient.InferInput("A", [1, 16], "INT32"), httpclient.InferInput("B", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(DATA, binary_data=False)
    pbody, _ = httpclient.InferenceServerClient.generate_request_body(inputs)
    status, headers, content = call(base + "/models/c3d4/invoke", "POST", pbody,
                                    {"X-Amzn-SageMaker-Target-Model": "pipeline_tgz"})
    assert status == 200, content
    mime = "application/vnd.sagemaker-triton.binary+json;json-header-size="
    assert headers["Content-Type"].startswith(mime)  # outputs binary by default
    result = httpclient.InferenceServerClient.parse_response_body(
        content, header_length=int(headers["Content-Type"][len(mime):]))
    assert (result.as_numpy("SUM") == DATA * 2).all(), content

    # Loading the same archive again: 409; bad paths: 400.
    load = json.dumps({"model_name": "a1b2", "url": str(single)}).encode()
    assert call(base + "/models", "POST", load)[0] == 409
    elsewhere = json.dumps({"model_name": "x", "url": str(repo / "addsub")}).encode()
    status, _, content = call(base + "/models", "POST", elsewhere)
    assert status == 400 and "expected a path of the form" in json.loads(content)["error"]
    assert call(base + "/models", "POST", json.dumps({"model_name": "x", "url": "/proc/1"}).encode())[0] == 400

    assert call(base + "/models/a1b2", "DELETE")[0] == 200
    assert call(base + "/models/a1b2")[0] == 404
    assert call(base + "/models/a1b2/invoke", "POST", body)[0] == 404
    assert call(base + "/models/a1b2", "DELETE")[0] == 404
    assert call(base + "/models/c3d4", "DELETE", None, {"X-Amzn-SageMaker-Target-Model": "pipeline_tgz"})[0] == 200
    # The repository's own model was left alone, and the archive can be loaded again.
    assert call(sagemaker.http_url + "/v2/models/addsub/ready")[0] == 200
    status, _, content = call(base + "/models", "POST",
                              json.dumps({"model_name": "a1b2", "url": str(single)}).encode())
    assert status == 200, content
    assert call(base + "/models/a1b2", "DELETE")[0] == 200
    shutil.rmtree(root / "a1b2")


def test_sagemaker_refuses_to_start(repo, tmp_path):
    code, log = run_to_exit(repo, ["--allow-sagemaker=true"],
                            {"SAGEMAKER_TRITON_INFERENCE_TYPE": "bogus"}, tmp_path)
    assert code != 0 and "Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'bogus'" in log
    code, log = run_to_exit(repo, ["--allow-sagemaker=true", "--sagemaker-safe-port-range", "1-2"],
                            {}, tmp_path)
    assert code != 0 and "The server cannot listen to HTTP requests at port" in log
    assert "allowed port range is [1, 2]" in log


# --- the SageMaker `serve` command ---------------------------------------------------------------

def serve_command(env: dict[str, str], tmp_path: Path, name: str = "serve.log"
                  ) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / name
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "host.sagemaker_serve"],
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, log


def test_sagemaker_serve_command(tmp_path):
    model_dir = tmp_path / "opt_ml_model"
    write_model(model_dir, "only")
    (port,) = _distinct_free_ports(1)
    proc, log = serve_command({"MODELHOST_SAGEMAKER_MODEL_DIR": str(model_dir),
                               "SAGEMAKER_BIND_TO_PORT": str(port)}, tmp_path)
    try:
        wait_for(f"http://127.0.0.1:{port}/ping", proc, log)
        body, _ = request_body()
        status, _, content = call(f"http://127.0.0.1:{port}/invocations", "POST", body)
        assert status == 200 and (outputs(content)[0] == DATA * 2).all()
        text = log.read_text()
        assert "WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided." in text
        assert "Started Sagemaker HTTPService at" in text
        assert "Started HTTPService at" not in text and "Started GRPCInferenceService" not in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@pytest.mark.parametrize("layout,env,message", [
    ("empty", {}, "ERROR: No model found in model repository"),
    ("two", {}, "ERROR: More than 1 model directory found in model repository."),
    ("two", {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "nope"},
     "ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME nope does not exist"),
    ("flat", {}, "ERROR: Incorrect directory structure."),
    ("two", {"SAGEMAKER_TRITON_INFERENCE_TYPE": "bogus"},
     "ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'bogus'"),
])
def test_sagemaker_serve_command_checks(tmp_path, layout, env, message):
    model_dir = tmp_path / "opt_ml_model"
    model_dir.mkdir()
    if layout == "two":
        write_model(model_dir, "a")
        write_model(model_dir, "b")
    elif layout == "flat":
        (model_dir / "config.pbtxt").write_text(CONFIG.format(name="x"))
    proc, log = serve_command({"MODELHOST_SAGEMAKER_MODEL_DIR": str(model_dir), **env}, tmp_path)
    assert proc.wait(60) == 1
    assert message in log.read_text()


def test_sagemaker_chunk_limits(sagemaker):
    """Triton's L0_sagemaker many-chunks case: at most 65,536 non-empty chunks in a body."""
    import socket

    port = int(sagemaker.sagemaker.rsplit(":", 1)[1])

    def send(chunks: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"POST /models HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                      b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            try:
                s.sendall(b"1\r\nA\r\n" * chunks + b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            return data

    at_limit = send(65536)
    assert at_limit.startswith(b"HTTP/1.1 400 ")
    assert b"failed to parse the request JSON buffer: Invalid value. at 0" in at_limit
    over = send(65537)
    assert over.startswith(b"HTTP/1.1 400 ")
    assert b"Chunked request body exceeds maximum of 65536 non-empty chunks" in over
    assert call(sagemaker.sagemaker + "/ping")[0] == 200


def test_sagemaker_multi_model_endpoint_with_namespacing(repo, tmp_path):
    """Triton's SageMaker `serve` turns namespacing on: archives loaded through /models are
    found by name, also with a repository registered after the start."""
    (port,) = _distinct_free_ports(1)
    models_root = tmp_path / "opt_ml_models"
    archive = models_root / "e5f6" / "model"
    write_model(archive, "archived", -1)
    env = {"MODELHOST_SAGEMAKER_MODELS_ROOT": str(models_root)}
    with ServerProcess(repo, "--allow-sagemaker=true", "--sagemaker-port", str(port),
                       "--model-namespacing=true", "--model-control-mode=explicit", env=env):
        base = f"http://127.0.0.1:{port}"
        load = json.dumps({"model_name": "e5f6", "url": str(archive)}).encode()
        status, _, content = call(base + "/models", "POST", load)
        assert status == 200, content
        assert json.loads(call(base + "/models")[2])["models"] == [
            {"modelName": "e5f6", "modelUrl": str(archive)}]
        body, _ = request_body()
        status, _, content = call(base + "/models/e5f6/invoke", "POST", body)
        assert status == 200, content
        assert (outputs(content)[0] == 0).all()
        assert call(base + "/models/e5f6", "DELETE")[0] == 200
        assert call(base + "/models/e5f6/invoke", "POST", body)[0] == 404
