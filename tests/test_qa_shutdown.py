"""Shutting down as Triton does (its main.cc, http_server.cc, grpc_server.cc and core server.cc;
Triton's QA L0_lifecycle `test_shutdown_*` cases), and what its gRPC front end answers for the
methods it does not serve.

On SIGINT/SIGTERM, within one exit timeout (--exit-timeout-secs) shared by the stages:
- HTTP: a new connection is closed at once; the open ones, idle keep-alive ones included, are
  served until their clients close them ("Timeout N: Found M HTTP service connections");
- gRPC: no new connection or call; the inference calls under way finish ("Timeout N: Found M
  gRPC service connections and inference handlers");
- the models: "Waiting for in-flight requests to complete.", a line a second while versions
  have inferences in flight (a sequence counts until its END or its idle timeout), then "All
  models are stopped, unloading models" and the unloads; "Exit timeout expired. Exiting
  immediately." when the time runs out first.
"""

from __future__ import annotations

import os
import signal
import socket
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, wait_until

pytestmark = [pytest.mark.timeout(120)]

GATED_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]

    def execute(self, requests):
        open(os.path.join(self.dir, "started"), "a").close()
        while not os.path.exists(os.path.join(self.dir, "gate")):
            time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

GATED_CONFIG = '''
name: "gated"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''

SEQUENCE_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

SEQUENCE_CONFIG = '''
name: "seq"
backend: "python"
max_batch_size: 4
sequence_batching { max_sequence_idle_microseconds: 4000000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def _model(repo: Path, name: str, config: str, code: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)
    return repo / name


def _gated(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "models"
    return repo, _model(repo, "gated", GATED_CONFIG, GATED_MODEL)


def _http_infer(client: httpclient.InferenceServerClient) -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    i = httpclient.InferInput("INPUT0", [4], "FP32")
    i.set_data_from_numpy(x)
    return client.infer("gated", [i]).as_numpy("OUTPUT0")


def _grpc_input() -> grpcclient.InferInput:
    i = grpcclient.InferInput("INPUT0", [4], "FP32")
    i.set_data_from_numpy(np.arange(4, dtype=np.float32))
    return i


def _new_connection_answer(port: int) -> bytes:
    """What a new HTTP connection gets: b"" (or a reset) once the server is stopping."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            return sock.recv(1024)
    except ConnectionError:
        return b""


def _exit(server: ServerProcess) -> str:
    assert server.process is not None
    server.process.wait(60)
    return server.log_text()


def test_open_keepalive_connection_is_served_until_closed(tmp_path):
    """Triton's test_shutdown_with_live_connection: after SIGINT the open connection still
    works, a new one does not, and the countdown runs once, until the client closes."""
    repo, gated = _gated(tmp_path)
    (gated / "gate").touch()
    with ServerProcess(repo, "--exit-wait-idle-connections=true") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert _http_infer(client).tolist() == [0, 1, 2, 3]
        assert server.pid is not None
        os.kill(server.pid, signal.SIGINT)
        wait_until(lambda: "Timeout 30: Found 1 HTTP service connections" in server.log_text(),
                   timeout=20)
        assert _http_infer(client).tolist() == [0, 1, 2, 3]
        assert client.is_server_live() and client.is_server_ready()
        assert _new_connection_answer(server.http_port) == b""
        client.close()
        log = _exit(server)
    assert server.process.returncode == 0, log[-3000:]
    assert log.count("Timeout 30: ") == 1, log[-3000:]
    assert "Waiting for in-flight requests to complete." in log
    assert "Found 0 model versions that have in-flight inferences" in log
    assert "All models are stopped, unloading models" in log
    assert "Found 0 live models and 0 in-flight non-inference requests" in log


def test_grpc_call_in_flight_finishes_and_new_calls_are_refused(tmp_path):
    repo, gated = _gated(tmp_path)
    with ServerProcess(repo) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: list = []
        client.async_infer("gated", [_grpc_input()], lambda result, error: results.append((result, error)))
        wait_until(lambda: (gated / "started").exists(), timeout=30)
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "Found 1 gRPC service connections and inference handlers"
                   in server.log_text(), timeout=20)
        with pytest.raises(InferenceServerException) as refused:
            grpcclient.InferenceServerClient(server.grpc_url).infer("gated", [_grpc_input()])
        assert "UNAVAILABLE" in str(refused.value.status())
        with pytest.raises(ConnectionRefusedError):  # the HTTP front end has stopped: no port
            socket.create_connection(("127.0.0.1", server.http_port), timeout=10).close()
        assert not results
        (gated / "gate").touch()
        wait_until(lambda: results, timeout=30)
        result, error = results[0]
        assert error is None
        assert result.as_numpy("OUTPUT0").tolist() == [0, 1, 2, 3]
        log = _exit(server)
    assert server.process.returncode == 0, log[-3000:]
    assert "Waiting for in-flight requests to complete." in log


def test_open_sequences_are_waited_for_until_their_idle_timeout(tmp_path):
    """Triton's test_shutdown_sequence: a sequence without its END is in flight for the
    shutdown until the sequence batcher releases it."""
    repo = tmp_path / "models"
    _model(repo, "seq", SEQUENCE_CONFIG, SEQUENCE_MODEL)
    with ServerProcess(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        for sequence_id in (1, 2):
            i = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            i.set_data_from_numpy(np.ones((1, 1), np.float32))
            client.infer("seq", [i], sequence_id=sequence_id, sequence_start=True)
        client.close()
        server.process.send_signal(signal.SIGINT)
        log = _exit(server)
    assert server.process.returncode == 0, log[-3000:]
    assert "Model 'seq' (version 1) has 2 in-flight inferences" in log, log[-3000:]
    assert "Found 0 model versions that have in-flight inferences" in log
    assert "successfully unloaded 'seq' version 1" in log


def test_exit_timeout_runs_out(tmp_path):
    repo, gated = _gated(tmp_path)
    with ServerProcess(repo, "--exit-timeout-secs", "2") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: list = []
        client.async_infer("gated", [_grpc_input()], lambda result, error: results.append((result, error)))
        wait_until(lambda: (gated / "started").exists(), timeout=30)
        server.process.send_signal(signal.SIGTERM)
        log = _exit(server)
    assert "Timeout 2: Found 1 gRPC service connections and inference handlers" in log, log[-3000:]
    assert "Model 'gated' (version 1) has 1 in-flight inferences" in log
    assert "Exit timeout expired. Exiting immediately." in log
    assert server.process.returncode == 1  # as Triton's exit(1)


def test_unserved_grpc_methods_answer_unimplemented_without_message(tmp_path):
    """Triton serves grpc.health.v1.Health/Check only: Watch, like any method it does not serve,
    is UNIMPLEMENTED with an empty message (gRPC C++'s answer)."""
    repo, gated = _gated(tmp_path)
    with ServerProcess(repo) as server, grpc.insecure_channel(server.grpc_url) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=lambda m: m,
                                     response_deserializer=lambda m: m)
        with pytest.raises(grpc.RpcError) as unimplemented:
            list(watch(b"", timeout=10))
        assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert unimplemented.value.details() == ""
        for method in ("/inference.GRPCInferenceService/Nope", "/grpc.health.v1.Health/List"):
            call = channel.unary_unary(method, request_serializer=lambda m: m,
                                       response_deserializer=lambda m: m)
            with pytest.raises(grpc.RpcError) as unknown:
                call(b"", timeout=10)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert unknown.value.details() == ""
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda m: m,
                                    response_deserializer=lambda m: m)
        assert check(b"", timeout=10) == b"\x08\x01"  # SERVING


# --- a TYPE_STRING implicit state's initial value from a file -------------------------------------

STRING_STATE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            state = pb_utils.get_input_tensor_by_name(r, "INPUT_STATE").as_numpy()
            value = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", state.astype(np.object_)),
                pb_utils.Tensor("OUTPUT_STATE", value.astype(np.object_))]))
        return responses
'''

STRING_STATE_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 1
sequence_batching {{
  state [ {{
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_STRING dims: [ 1 ]
    initial_state: {{ data_type: TYPE_STRING dims: [ 1 ] name: "init" data_file: "input_state_data" }}
  }} ]
}}
input [ {{ name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] }} ]
'''


def test_string_state_initial_value_from_a_file(tmp_path):
    """Triton copies a TYPE_STRING state's data_file as it is and loads the model (L0_sequence_
    batcher's INITIAL_STATE_FILE=1 writes `\\x64\\x00\\x00\\x00`, a length prefix of 100 and no
    bytes); a file of length-prefixed strings gives those strings."""
    repo = tmp_path / "models"
    files = {"whole": (5).to_bytes(4, "little") + b"hello", "cut": b"\x64\x00\x00\x00"}
    for name, data in files.items():
        folder = _model(repo, name, STRING_STATE_CONFIG.format(name=name), STRING_STATE_MODEL)
        (folder / "initial_state").mkdir()
        (folder / "initial_state" / "input_state_data").write_bytes(data)
    with ServerProcess(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        for sequence_id, (name, first) in enumerate((("whole", b"hello"), ("cut", b"")), 1):
            assert client.is_model_ready(name)
            seen = []
            for step, text in enumerate((b"a", b"b")):
                i = httpclient.InferInput("INPUT0", [1, 1], "BYTES")
                i.set_data_from_numpy(np.array([[text]], dtype=np.object_))
                result = client.infer(name, [i], sequence_id=sequence_id,
                                       sequence_start=step == 0, sequence_end=step == 1)
                seen.append(result.as_numpy("OUTPUT0").reshape(-1)[0])
            assert seen == [first, b"a"]


def test_stream_refuses_new_requests_while_draining(tmp_path):
    """Triton's stream handler, once the server stops: a stream that is still open gets an error
    response for each new request; the request already running finishes."""
    repo, gated = _gated(tmp_path)
    with ServerProcess(repo) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: list = []
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        client.async_stream_infer("gated", [_grpc_input()], request_id="first")
        wait_until(lambda: (gated / "started").exists(), timeout=30)
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "Found 1 gRPC service connections and inference handlers"
                   in server.log_text(), timeout=20)
        client.async_stream_infer("gated", [_grpc_input()], request_id="second")
        wait_until(lambda: results, timeout=20)
        assert results[0][1] is not None
        assert results[0][1].message() == ("GRPC server is shutting down and has stopped "
                                           "accepting new requests.")
        (gated / "gate").touch()
        wait_until(lambda: len(results) == 2, timeout=30)
        assert results[1][1] is None
        assert results[1][0].get_response().id == "first"
        client.stop_stream()
        log = _exit(server)
    assert server.process.returncode == 0, log[-3000:]


# --- an ensemble's failures --------------------------------------------------------------------

FAILING_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("boom")
'''

FAILING_CONFIG = '''
name: "failing"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''

ENSEMBLE_CONFIG = '''
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "failing" model_version: -1
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
'''


def test_failed_ensemble_request_counts_twice(tmp_path):
    """Triton's ensemble scheduler reports a failed request twice (the error response, then the
    request's statistics): the ensemble's fail count and its OTHER failures rise by 2."""
    repo = tmp_path / "models"
    _model(repo, "failing", FAILING_CONFIG, FAILING_MODEL)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with ServerProcess(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        i = httpclient.InferInput("IN", [1], "FP32")
        i.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException, match="in ensemble 'ens'"):
            client.infer("ens", [i])
        stats = client.get_inference_statistics("ens")["model_stats"][0]["inference_stats"]
        assert stats["fail"]["count"] == 2
        composing = client.get_inference_statistics("failing")["model_stats"][0]
        assert composing["inference_stats"]["fail"]["count"] == 1
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            metrics = response.read().decode()
        assert 'nv_inference_request_failure{model="ens",reason="OTHER",version="1"} 2' in metrics


ERROR_RESPONSE_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("no")) for _ in requests]
'''


def test_python_error_response_counts_as_success_and_an_exception_as_failure(tmp_path):
    """Triton's python backend reports its statistics per execute: a request answered with an
    error response is a success (inference and execution counted), only an exception raised by
    execute makes its requests failures (reason BACKEND). Checked on Triton 2.51."""
    repo = tmp_path / "models"
    _model(repo, "answers_error", FAILING_CONFIG.replace('"failing"', '"answers_error"'),
           ERROR_RESPONSE_MODEL)
    _model(repo, "failing", FAILING_CONFIG, FAILING_MODEL)
    with ServerProcess(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        i = httpclient.InferInput("IN", [1], "FP32")
        i.set_data_from_numpy(np.ones(1, np.float32))
        for name in ("answers_error", "failing"):
            with pytest.raises(InferenceServerException):
                client.infer(name, [i])
        answered = client.get_inference_statistics("answers_error")["model_stats"][0]
        assert answered["inference_stats"]["success"]["count"] == 1
        assert answered["inference_stats"]["fail"]["count"] == 0
        assert answered["inference_count"] == 1 and answered["execution_count"] == 1
        raised = client.get_inference_statistics("failing")["model_stats"][0]
        assert raised["inference_stats"]["fail"]["count"] == 1
        assert raised["inference_stats"]["success"]["count"] == 0
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            metrics = response.read().decode()
        assert 'nv_inference_request_failure{model="failing",reason="BACKEND",version="1"} 1' \
            in metrics
        assert 'nv_inference_request_success{model="answers_error",version="1"} 1' in metrics
