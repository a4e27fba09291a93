"""Behaviours found by running Triton's python-backend QA (qa/L0_backend_python: python_test.py,
lifecycle, response_sender) against modelhost and the real Triton side by side.

Each model here is written for these tests; one server, started once for the module, serves
them all, driven with tritonclient over HTTP and gRPC:
- BF16 through DLPack: `as_numpy()` of a BF16 tensor raises Triton's error; `to_dlpack()` of a
  request input (read-only memory) works, torch takes it and gives it back;
- the gRPC stream header `triton_grpc_error: true`: the first error response ends the stream
  with its gRPC status (decoupled and non-decoupled models), nothing after it; without the header
  errors stay in the stream;
- non-decoupled models and the response sender: a response sent after execute returned (the
  model took the sender) reaches the client; a response sent before an exception is kept;
- `await async_exec(decoupled=True)` comes back once the first response is there, so BLS calls
  gathered in one `async def execute` run at the same time (Triton's async_execute test);
- a model folder without model.py: Triton's load error text;
- a load with file overrides named 'file:/1/model.py' (a leading '/', as Triton's model-control
  QA writes them) puts the file in the model's folder, as Triton's JoinPath does.
"""

from __future__ import annotations

import json
import queue
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

BF16_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_BF16 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_BF16 dims: [ -1 ] },
         { name: "AS_NUMPY_ERROR" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# torch reads the input's DLPack capsule and hands its own back; as_numpy() must refuse BF16.
BF16_MODEL = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                tensor.as_numpy()
                refused = b"no error"
            except pb_utils.TritonModelException as e:
                refused = str(e).encode()
            doubled = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()) * 2
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(doubled))
            rows = doubled.shape[0]
            note = pb_utils.Tensor("AS_NUMPY_ERROR", np.array([[refused]] * rows, dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out, note]))
        return responses
"""

# Decoupled: a good response, then an error response (without the final flag), then the final
# flag later.
DECOUPLED_ERROR_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

DECOUPLED_ERROR_MODEL = """
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            threading.Thread(target=self._answer, args=(request.get_response_sender(), x),
                             daemon=True).start()
        return None

    def _answer(self, sender, x):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("second one failed")))
        time.sleep(0.3)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Non-decoupled: a request whose input is negative fails with a TritonError response.
FAILS_ON_NEGATIVE_CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

FAILS_ON_NEGATIVE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return responses
"""

# Non-decoupled with the response sender. MODE 0: answer from a thread after execute returned
# None; MODE 1: send one response, then a second send (which raises) ends execute.
SENDER_CONFIG = """
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

SENDER_MODEL = """
import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                threading.Thread(target=self._later, args=(sender, x), daemon=True).start()
            else:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 2)]), FINAL)
        return None

    def _later(self, sender, x):
        time.sleep(0.2)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 10)]), FINAL)
"""


# Decoupled callee: each request waits (at most 5 s) until WANTED requests are in flight at once,
# then answers 1.0 if they were, 0.0 if not.
GATHERED_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOGETHER" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

GATHERED_MODEL = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

WANTED = 3


class TritonPythonModel:
    def initialize(self, args):
        self.in_flight = 0
        self.event = None

    async def execute(self, requests):
        await asyncio.gather(*(self._one(r) for r in requests))

    async def _one(self, request):
        if self.event is None:
            self.event = asyncio.Event()
        self.in_flight += 1
        if self.in_flight >= WANTED:
            self.event.set()
        try:
            await asyncio.wait_for(self.event.wait(), 5)
            together = 1.0
        except asyncio.TimeoutError:
            together = 0.0
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse(
            [pb_utils.Tensor("TOGETHER", np.array([together], np.float32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Decoupled, async: each request makes one decoupled BLS call to the callee and sends back what
# it answered. Three requests on one stream must reach the callee together.
GATHERING_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOGETHER" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

GATHERING_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def _one(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        call = pb_utils.InferenceRequest(
            model_name="gathered", inputs=[pb_utils.Tensor("IN", x)],
            requested_output_names=["TOGETHER"])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(response, "TOGETHER")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TOGETHER", out.as_numpy())]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self._one(r) for r in requests))
        return None
"""


def _write(repo: Path, name: str, config: str, code: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    if code is not None:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("qa_python_backend")
    _write(repo, "bf16_torch", BF16_CONFIG, BF16_MODEL)
    _write(repo, "decoupled_error", DECOUPLED_ERROR_CONFIG, DECOUPLED_ERROR_MODEL)
    _write(repo, "fails_on_negative", FAILS_ON_NEGATIVE_CONFIG, FAILS_ON_NEGATIVE_MODEL)
    _write(repo, "sender_model", SENDER_CONFIG, SENDER_MODEL)
    _write(repo, "no_model_file", FAILS_ON_NEGATIVE_CONFIG, None)
    _write(repo, "gathered", GATHERED_CONFIG, GATHERED_MODEL)
    _write(repo, "gathering", GATHERING_CONFIG, GATHERING_MODEL)
    loads = ["bf16_torch", "decoupled_error", "fails_on_negative", "sender_model", "gathered",
             "gathering"]
    with serve(repo, "--model-control-mode", "explicit",
               *(arg for name in loads for arg in ("--load-model", name))) as s:
        yield s


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


def _stream(server, headers=None):
    """A gRPC client with an open stream; (client, queue of (result, error))."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers=headers)
    return client, got


def _fp32_input(mod, x, name="IN"):
    i = mod.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


# --- BF16 and DLPack ----------------------------------------------------------------------------

def test_bf16_input_goes_through_dlpack_and_as_numpy_refuses_it(http):
    pytest.importorskip("torch")
    x = np.array([[1.5, -2.0, 256.0]], dtype=ml_dtypes.bfloat16)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "BF16")
    inp.set_data_from_numpy(x)
    result = http.infer("bf16_torch", [inp])
    out = result.as_numpy("OUTPUT0")
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), x.astype(np.float32) * 2)
    refused = result.as_numpy("AS_NUMPY_ERROR")[0][0].decode()
    assert refused.startswith("Tensor dtype is BF16 and cannot be converted to NumPy.")


# --- triton_grpc_error --------------------------------------------------------------------------

def test_triton_grpc_error_ends_a_decoupled_stream_with_the_error_status(server):
    x = np.array([1.0, 2.0], dtype=np.float32)
    client, got = _stream(server, headers={"triton_grpc_error": "true"})
    try:
        client.async_stream_infer("decoupled_error", [_fp32_input(grpcclient, x)])
        result, error = got.get(timeout=10)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUT"), x)
        result, error = got.get(timeout=10)
        assert result is None and isinstance(error, InferenceServerException)
        assert str(error.status()) == "StatusCode.INTERNAL"
        assert "second one failed" in error.message()
        with pytest.raises(queue.Empty):  # the delayed final flag does not come through
            got.get(timeout=1)
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            client.async_stream_infer("decoupled_error", [_fp32_input(grpcclient, x)])
    finally:
        client.stop_stream()
        client.close()
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()


def test_triton_grpc_error_ends_a_stream_on_a_non_decoupled_error(server):
    client, got = _stream(server, headers={"triton_grpc_error": "true"})
    try:
        good = np.array([3.0], dtype=np.float32)
        client.async_stream_infer("fails_on_negative", [_fp32_input(grpcclient, good)])
        result, error = got.get(timeout=10)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUT"), good)
        bad = np.array([-1.0], dtype=np.float32)
        client.async_stream_infer("fails_on_negative", [_fp32_input(grpcclient, bad)])
        result, error = got.get(timeout=10)
        assert str(error.status()) == "StatusCode.INTERNAL"
        assert "negative input" in error.message()
    finally:
        client.stop_stream()
        client.close()


def test_without_triton_grpc_error_errors_stay_in_the_stream(server):
    client, got = _stream(server)
    try:
        for value in (-1.0, 4.0):
            x = np.array([value], dtype=np.float32)
            client.async_stream_infer("fails_on_negative", [_fp32_input(grpcclient, x)])
        result, error = got.get(timeout=10)
        assert result is None and error.status() is None and "negative input" in error.message()
        result, error = got.get(timeout=10)  # the stream goes on
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUT"), [4.0])
    finally:
        client.stop_stream()
        client.close()


# --- non-decoupled models and the response sender ---------------------------------------------

def _sender_inputs(mod, mode: int):
    x = np.array([1.0, 2.0], dtype=np.float32)
    m = mod.InferInput("MODE", [1], "INT32")
    m.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return x, [_fp32_input(mod, x), m]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_model_may_answer_after_execute_returned(server, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    client = mod.InferenceServerClient(url)
    try:
        x, inputs = _sender_inputs(mod, 0)
        np.testing.assert_array_equal(client.infer("sender_model", inputs).as_numpy("OUT"), x * 10)
    finally:
        client.close()


def test_non_decoupled_response_sent_before_an_exception_is_kept(server):
    client, got = _stream(server)
    try:
        x, inputs = _sender_inputs(grpcclient, 1)
        client.async_stream_infer("sender_model", inputs)
        result, error = got.get(timeout=10)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUT"), x + 1)
        with pytest.raises(queue.Empty):  # the error of the second send is not sent
            got.get(timeout=1)
    finally:
        client.stop_stream()
        client.close()


# --- async BLS -----------------------------------------------------------------------------------

def test_decoupled_async_exec_calls_of_separate_requests_run_at_the_same_time(server):
    client, got = _stream(server)
    try:
        x = np.array([1.0], dtype=np.float32)
        for _ in range(3):
            client.async_stream_infer("gathering", [_fp32_input(grpcclient, x)])
        answers = []
        for _ in range(3):
            result, error = got.get(timeout=20)
            assert error is None, error
            answers.append(result.as_numpy("TOGETHER").tolist())
        assert answers == [[1.0]] * 3
    finally:
        client.stop_stream()
        client.close()


# --- load errors ---------------------------------------------------------------------------------

def test_a_model_without_model_py_fails_to_load_with_tritons_text(http):
    with pytest.raises(InferenceServerException) as info:
        http.load_model("no_model_file")
    assert ("Failed to preinitialize Python stub: Python model file not found in '"
            in info.value.message())
    assert "no_model_file/1/model.py'" in info.value.message()


def test_override_file_names_with_a_leading_slash_are_inside_the_model(server, http):
    config = {"name": "slash_override", "backend": "python",
              "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]}
    code = textwrap.dedent(FAILS_ON_NEGATIVE_MODEL).encode()
    http.load_model("slash_override", config=json.dumps(config),
                    files={"file:/1/model.py": code})
    x = np.array([2.5], dtype=np.float32)
    result = http.infer("slash_override", [_fp32_input(httpclient, x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x)
    http.unload_model("slash_override")


@pytest.mark.parametrize("name", ["model;test", "model$test", "model\\test", "model!test"])
def test_python_model_names_with_shell_characters_are_refused(server, name):
    """Triton's python backend refuses a stub name with any of ;|&$`<>()[]{}\\"'*?~#! (a
    backslash is not a path traversal character for Triton's model-name check)."""
    config = {"name": name, "backend": "python",
              "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}]}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(name, config=json.dumps(config),
                              files={"file:1/model.py": textwrap.dedent(FAILS_ON_NEGATIVE_MODEL).encode()})
        assert "Invalid stub name: contains invalid characters" in info.value.message()
        assert not client.is_model_ready(name)
    finally:
        client.close()
