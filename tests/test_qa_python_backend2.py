"""Behaviours found by running more of Triton's python-backend QA (qa/L0_backend_python:
decoupled, argument_validation, python_based_backends, restart) against modelhost and Triton.

- a decoupled BLS call (`exec(decoupled=True)` / `await async_exec(decoupled=True)`) to a model
  that runs on the submitting thread: the caller reads the responses as the callee sends them
  and `cancel()` reaches the callee (`is_cancelled()`), which then ends with a CANCELLED error
  response (Triton's decoupled_bls_cancel models);
- the pb_utils constructors and Logger take arguments as Triton's pybind11 bindings do: a wrong
  type or a None is a TypeError, a None tensor in a list and an empty output name are refused
  with Triton's TritonModelException texts (argument_validation);
- python-based backends: `<backend-directory>/<name>/model.py` serves the models whose config
  says `backend: "<name>"`, and `get_model_dir()` is the model's version folder;
- `import c_python_backend_utils` works (the restart model reads
  `c_python_backend_utils.shared_memory.free_memory()`);
- model readiness asks the model's optional `is_ready()` (model_readiness): False, an exception
  or a non-bool answer is "not ready", a coroutine is awaited, a call that takes longer than 5 s
  answers "not ready" and a later check waits for its result; a process-mode instance whose stub
  died is not ready ("Stub process '<instance>' is not healthy." in the log);
- an EXECUTION_ENV_PATH archive that Triton's secure extraction refuses (an entry with '..' or an
  absolute path) fails the model's load with Triton's text (env/zipslip_test.py); others load.

Each model here is written for these tests; one server serves them all.
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.backends.python import pb_utils
from host.testing import serve

pytestmark = pytest.mark.modelhost_only

# Sends INPUT again and again (10 ms apart) until cancelled or MAX responses were sent; once
# cancelled it ends with a CANCELLED error response.
UNTIL_CANCELLED_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "MAX" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

UNTIL_CANCELLED_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
        most = int(pb_utils.get_input_tensor_by_name(request, "MAX").as_numpy()[0])
        sender = request.get_response_sender()
        for sent in range(most):
            if request.is_cancelled():
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "request has been cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", value)]))
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

BLS_CANCEL_CONFIG = """
backend: "python"
input [ { name: "STOP_AT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IS_CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""

# Sums the callee's responses and cancels the stream once the sum reaches STOP_AT; the callee
# would send 500 responses if the cancellation did not reach it.
BLS_CANCEL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    {async_}def execute(self, requests):
        stop_at = int(pb_utils.get_input_tensor_by_name(requests[0], "STOP_AT").as_numpy()[0])
        call = pb_utils.InferenceRequest(
            model_name="until_cancelled", requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("INPUT", np.array([1], np.int32)),
                    pb_utils.Tensor("MAX", np.array([500], np.int32))])
        stream = {await_}call.{exec_}(decoupled=True)
        total, cancelled = 0, False
        for response in stream:
            if response.has_error():
                cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                break
            output = pb_utils.get_output_tensor_by_name(response, "OUTPUT")
            if output is None:
                break
            total += int(output.as_numpy()[0])
            if total >= stop_at:
                stream.cancel()
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("SUM", np.array([total], np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], np.bool_))])]
"""

# A python-based backend: one model.py for every model of backend "addsub_backend"; each model's
# version folder holds its operation in op.json.
BACKEND_MODEL = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_input({"name": "B", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "op.json")) as f:
            self.op = json.load(f)["op"]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            out = a + b if self.op == "add" else a - b
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

C_UTILS_CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "FREE" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

C_UTILS_MODEL = """
import numpy as np
import c_python_backend_utils as c_utils
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        assert c_utils.Tensor is pb_utils.Tensor
        free = c_utils.shared_memory.free_memory()
        return [pb_utils.InferenceResponse([
            c_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()),
            pb_utils.Tensor("FREE", np.array([free], np.int64))]) for r in requests]
"""


IDENTITY_CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

READINESS_MODEL = """
import asyncio
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]

    {is_ready}
"""

READY_ANSWERS = {
    "ready_true": "def is_ready(self):\n        return True",
    "ready_false": "def is_ready(self):\n        return False",
    "ready_raises": "def is_ready(self):\n        raise RuntimeError('check failed')",
    "ready_not_bool": "def is_ready(self):\n        return 'ready'",
    "ready_coroutine": ("async def is_ready(self):\n        await asyncio.sleep(0.01)\n"
                        "        return True"),
    "ready_slow": "def is_ready(self):\n        time.sleep(6)\n        return True",
}

STUB_PID_CONFIG = """
backend: "python"
parameters { key: "EXECUTION_MODE" value { string_value: "process" } }
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

STUB_PID_MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "PID", np.array([os.getpid()], np.int64))]) for _ in requests]
"""


def _write(repo: Path, name: str, config: str, code: str | None, version_files: dict | None = None) -> None:
    folder = repo / name / "1"
    folder.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if code is not None:
        (folder / "model.py").write_text(textwrap.dedent(code))
    for file_name, text in (version_files or {}).items():
        (folder / file_name).write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    backends = tmp_path_factory.mktemp("backends")
    _write(repo, "until_cancelled", UNTIL_CANCELLED_CONFIG, UNTIL_CANCELLED_MODEL)
    _write(repo, "bls_cancel", BLS_CANCEL_CONFIG,
           BLS_CANCEL_MODEL.format(async_="", await_="", exec_="exec"))
    _write(repo, "bls_async_cancel", BLS_CANCEL_CONFIG,
           BLS_CANCEL_MODEL.format(async_="async ", await_="await ", exec_="async_exec"))
    (backends / "addsub_backend").mkdir()
    (backends / "addsub_backend" / "model.py").write_text(textwrap.dedent(BACKEND_MODEL))
    for name, op in (("based_add", "add"), ("based_sub", "sub")):
        _write(repo, name, 'backend: "addsub_backend"\n', None, {"op.json": json.dumps({"op": op})})
    _write(repo, "c_utils", C_UTILS_CONFIG, C_UTILS_MODEL)
    for name, is_ready in READY_ANSWERS.items():
        _write(repo, name, IDENTITY_CONFIG, READINESS_MODEL.replace("{is_ready}", is_ready))
    _write(repo, "stub_pid", STUB_PID_CONFIG, STUB_PID_MODEL)
    env = 'parameters: {key: "EXECUTION_ENV_PATH", value: {string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}}\n'
    for name, entry in (("env_dotdot", "../../escaped"), ("env_absolute", "/tmp/escaped"),
                        ("env_fine", "bin/activate")):
        _write(repo, name, IDENTITY_CONFIG + env, READINESS_MODEL.replace("{is_ready}", ""))
        with tarfile.open(repo / name / "env.tar.gz", "w:gz") as archive:
            info = tarfile.TarInfo(entry)
            info.size = 4
            archive.addfile(info, io.BytesIO(b"test"))
    with serve(repo, "--backend-directory", str(backends)) as srv:
        yield srv


@pytest.mark.parametrize("model", ["bls_cancel", "bls_async_cancel"])
def test_decoupled_bls_cancel_reaches_the_callee(server, model):
    client = httpclient.InferenceServerClient(server.url)
    stop_at = np.array([5], np.int32)
    inp = httpclient.InferInput("STOP_AT", [1], "INT32")
    inp.set_data_from_numpy(stop_at)
    result = client.infer(model, [inp])
    # The caller saw the responses one by one and its cancel() stopped the callee, which then
    # answered CANCELLED: it did not run to its 500 responses before the caller read any.
    assert result.as_numpy("SUM")[0] == 5
    assert bool(result.as_numpy("IS_CANCELLED")[0]) is True


def test_decoupled_bls_cancel_over_grpc_stream(server):
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    try:
        inp = grpcclient.InferInput("STOP_AT", [1], "INT32")
        inp.set_data_from_numpy(np.array([3], np.int32))
        client.async_stream_infer("bls_cancel", [inp])
        result = responses.get(timeout=30)
    finally:
        client.stop_stream()
    assert result.as_numpy("SUM")[0] == 3 and bool(result.as_numpy("IS_CANCELLED")[0])


def test_python_based_backend_serves_its_models(server):
    client = httpclient.InferenceServerClient(server.url)
    a = np.array([3.0, 5.0], np.float32)
    b = np.array([1.0, 2.0], np.float32)
    for model, expected in (("based_add", a + b), ("based_sub", a - b)):
        inputs = [httpclient.InferInput("A", [2], "FP32"), httpclient.InferInput("B", [2], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUT"), expected)
    # The backend's auto_complete_config filled the model's configuration.
    config = client.get_model_config("based_add")
    assert [i["name"] for i in config["input"]] == ["A", "B"]
    assert config["backend"] == "addsub_backend"


def test_c_python_backend_utils_is_importable(server):
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1.5, 2.5], np.float32))
    first = client.infer("c_utils", [inp])
    second = client.infer("c_utils", [inp])
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), [1.5, 2.5])
    assert first.as_numpy("FREE")[0] > 0
    assert first.as_numpy("FREE")[0] == second.as_numpy("FREE")[0]


@pytest.mark.parametrize("model,ready", [
    ("ready_true", True), ("ready_false", False), ("ready_raises", False),
    ("ready_not_bool", False), ("ready_coroutine", True)])
def test_user_defined_is_ready(server, model, ready):
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_model_ready(model) is ready
    assert grpc.is_model_ready(model) is ready
    # Not ready or not, the model still serves (as in Triton).
    inp = httpclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(http.infer(model, [inp]).as_numpy("OUTPUT0"), [1.0, 2.0])


def test_is_ready_that_times_out(server):
    http = httpclient.InferenceServerClient(server.url, network_timeout=30)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # The check gives up after 5 s; the call goes on, and the next check waits for its answer.
    assert http.is_model_ready("ready_slow") is False
    assert grpc.is_model_ready("ready_slow") is True


def test_dead_stub_is_not_ready(server):
    client = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("stub_pid")
    pid = int(client.infer("stub_pid", []).as_numpy("PID")[0])
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):  # until the host has seen it go
        if not client.is_model_ready("stub_pid"):
            break
    assert client.is_model_ready("stub_pid") is False
    assert grpc.is_model_ready("stub_pid") is False
    # The next request starts the stub again, and the model is ready again.
    assert int(client.infer("stub_pid", []).as_numpy("PID")[0]) != pid
    assert client.is_model_ready("stub_pid") is True


def test_execution_env_archive_that_escapes_is_refused(server):
    client = httpclient.InferenceServerClient(server.url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert client.is_model_ready("env_fine")
    for name, why in (("env_dotdot", "Path contains '..'"), ("env_absolute", "Path is absolute")):
        assert not client.is_model_ready(name)
        assert index[name]["state"] == "UNAVAILABLE"
        assert (f"archive_write_header() failed with error code = -25 error message is {why}"
                in index[name]["reason"])


# --- argument validation (no server: the checks are in pb_utils itself) ------------------------

def _tensor() -> pb_utils.Tensor:
    return pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))


def test_inference_request_arguments():
    ok = {"inputs": [_tensor()], "model_name": "my_model", "requested_output_names": ["out"]}
    with pytest.raises(pb_utils.TritonModelException,
                       match="Input tensor for request with id '' and model name 'my_model' "
                             "should not be empty."):
        pb_utils.InferenceRequest(**{**ok, "inputs": [None]})
    with pytest.raises(pb_utils.TritonModelException,
                       match="Requested output name for request with id 'r1' and model name "
                             "'my_model' should not be empty."):
        pb_utils.InferenceRequest(**{**ok, "requested_output_names": [""], "request_id": "r1"})
    for bad in ({"inputs": None}, {"model_name": None}, {"requested_output_names": [None]},
                {"requested_output_names": None}, {"correlation_id": None},
                {"request_id": None}, {"model_version": None}, {"flags": None},
                {"timeout": None}):
        with pytest.raises(TypeError, match="incompatible"):
            pb_utils.InferenceRequest(**{**ok, **bad})
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID must be integer or string"):
        pb_utils.InferenceRequest(**ok, correlation_id=1.5)
    assert pb_utils.InferenceRequest(**ok, correlation_id="id-5").correlation_id() == "id-5"
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="my_model")
    # std::string arguments take bytes too (a BYTES input's element as the model name).
    by_bytes = pb_utils.InferenceRequest(requested_output_names=[b"out"], inputs=[],
                                         model_name=b"my_model")
    assert by_bytes._model_name == "my_model" and by_bytes._requested_output_names == ["out"]


def test_inference_response_tensor_and_logger_arguments():
    with pytest.raises(pb_utils.TritonModelException,
                       match="Output tensor for inference response should not be empty."):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.InferenceResponse([_tensor()])
    arr = np.asarray([1, 2], dtype=np.int32)
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, arr)
    with pytest.raises(TypeError):
        pb_utils.Tensor("OUTPUT0", None)
    with pytest.raises(TypeError):
        pb_utils.Tensor("", None)
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor("", arr)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor.from_dlpack("OUTPUT0", None)
    logger = pb_utils.Logger
    for call in (lambda: logger.log("x", None), lambda: logger.log("x", 1),
                 lambda: logger.log_info(None), lambda: logger.log_warn(None),
                 lambda: logger.log_error(None), lambda: logger.log_verbose(None)):
        with pytest.raises(TypeError):
            call()
    logger.log("Level unspecified")
    logger.log("warn", logger.WARNING)
