"""The gRPC front end against the real clients: tritonclient.grpc (sync and aio) and raw stubs.

The server is real: `modelhost serve` (host.testing) once it serves gRPC, else a Host built in
this process with `start_grpc_server` on a free port (and the HTTP app on a wsgiref server, for
the tests that compare both front ends). Either way clients talk to it over TCP.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import subprocess
import sys
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host import datatypes
from host.proto import grpc_service_pb2 as pb
from host.proto import grpc_service_pb2_grpc as pb_grpc
from host.testing import free_port, serve, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
FINAL = "triton_final_response"

# --- a repository of extra models, written for these tests --------------------------------

_IDENTITY = """
import triton_python_backend_utils as pb_utils


def _same(t):
    if t.triton_dtype() == 14:  # BF16: as_numpy() raises (as in Triton), DLPack carries it
        return pb_utils.Tensor.from_dlpack("OUTPUT0", t.to_dlpack())
    return pb_utils.Tensor("OUTPUT0", t.as_numpy())


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            _same(pb_utils.get_input_tensor_by_name(r, "INPUT0"))]) for r in requests]
"""

# Records into record.txt (next to its config) when it starts and whether it saw cancellation.
_CANCELLABLE = """
import pathlib
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = pathlib.Path(args["model_repository"]) / "record.txt"

    def _write(self, line):
        with open(self.record, "a") as f:
            f.write(line + "\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy().reshape(-1)[0].decode()
            self._write(tag + " started")
            deadline = time.monotonic() + 20
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            self._write(tag + (" cancelled" if request.is_cancelled() else " finished"))
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        return responses
"""

_ECHO_PARAMETERS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "PARAMS", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
"""

DATATYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES"]


def _model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (root / name / "1" / "model.py").write_text(code)


_UNENCODABLE_OUTPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("\\udc80", np.ones(4, np.float32))])
                for _ in requests]
"""


def _extra_repository(root: Path) -> Path:
    for dt in DATATYPES:
        ct = datatypes.to_config(dt)
        _model(root, f"dtype_{dt.lower()}", f"""max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {ct} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {ct} dims: [ -1 ] }} ]
""", _IDENTITY)
    _model(root, "cancellable", """max_batch_size: 0
input [ { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
""", _CANCELLABLE)
    # an output name no protobuf string can hold (a lone surrogate)
    _model(root, "unencodable_output", """max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", _UNENCODABLE_OUTPUT)
    _model(root, "echo_parameters", """max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
""", _ECHO_PARAMETERS)
    return root


# --- servers -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    grpc_url: str  # "127.0.0.1:PORT"
    http_url: str  # "127.0.0.1:PORT", for tritonclient.http


_SERVE_HAS_GRPC: list[bool] = []


def _grpc_live(url: str) -> bool:
    try:
        with grpc.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
    except grpc.RpcError:
        return False


@contextlib.contextmanager
def _in_process(repositories: list[Path], control_mode: str) -> Iterator[Endpoint]:
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from host.core import Host
    from host.grpc import start_grpc_server
    from host.http.app import create_app
    from host.options import ServerOptions

    class _Threading(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class _Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    host = Host(ServerOptions(model_repositories=repositories, model_control_mode=control_mode))
    host.start()
    server = start_grpc_server(host, "127.0.0.1", 0)
    http = make_server("127.0.0.1", 0, create_app(host), server_class=_Threading, handler_class=_Quiet)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        yield Endpoint(f"127.0.0.1:{server.port}", f"127.0.0.1:{http.server_port}")
    finally:
        http.shutdown()
        server.stop(2)
        host.stop()


@contextlib.contextmanager
def grpc_serving(repositories: list[Path], control_mode: str = "none") -> Iterator[Endpoint]:
    """`modelhost serve` when it serves gRPC (probed once), else the in-process server."""
    args: list[str] = []
    for extra in repositories[1:]:
        args += ["--model-repository", str(extra)]
    if control_mode != "none":
        args += ["--model-control-mode", control_mode]
    if _SERVE_HAS_GRPC != [False]:
        with serve(repositories[0], *args) as process:
            if not _SERVE_HAS_GRPC:
                _SERVE_HAS_GRPC.append(_grpc_live(process.grpc_url))
            if _SERVE_HAS_GRPC[0]:
                yield Endpoint(process.grpc_url, process.url)
                return
    with _in_process(repositories, control_mode) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def extra_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _extra_repository(tmp_path_factory.mktemp("grpc_models"))


@pytest.fixture(scope="module")
def endpoint(extra_repository: Path) -> Iterator[Endpoint]:
    with grpc_serving([MODEL_REPOSITORY, extra_repository]) as ep:
        yield ep


@pytest.fixture
def client(endpoint: Endpoint) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(endpoint.grpc_url)
    yield triton
    triton.close()


@pytest.fixture
def stub(endpoint: Endpoint) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(endpoint.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _raises(status: grpc.StatusCode, message: str | None = None):
    """Context manager: a tritonclient call fails with `status` (and exactly `message`)."""

    class _Check:
        def __enter__(self) -> _Check:
            return self

        def __exit__(self, kind, exc, tb) -> bool:
            assert isinstance(exc, InferenceServerException), f"expected a server error, got {exc!r}"
            assert exc.status() == str(status), (exc.status(), exc.message())
            if message is not None:
                assert exc.message() == message
            self.error = exc
            return True

    return _Check()


def _input(name: str, array: np.ndarray, datatype: str | None = None) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape),
                                   datatype or datatypes.from_numpy(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    return [_input("INPUT0", a), _input("INPUT1", b)]


def _repeat_inputs(values: list[int], delays_ms: list[int], wait_ms: int = 0) -> list:
    return [_input("IN", np.array(values, dtype=np.int32)),
            _input("DELAY", np.array(delays_ms, dtype=np.uint32)),
            _input("WAIT", np.array([wait_ms], dtype=np.uint32))]


# --- the protocol definition -----------------------------------------------------------------

def test_a_response_that_cannot_be_encoded_fails_its_call_and_the_server_goes_on(
        client: grpcclient.InferenceServerClient) -> None:
    # It used to leave the call open: the client waited for its deadline.
    x = _input("INPUT0", np.ones(4, np.float32))
    with _raises(grpc.StatusCode.INTERNAL) as failed:
        client.infer("unencodable_output", [x], client_timeout=30)
    assert "UnicodeEncodeError" in failed.error.message()
    y = _input("INPUT0", np.arange(3, dtype=np.int32))
    assert client.infer("dtype_int32", [y]).as_numpy("OUTPUT0").tolist() == [0, 1, 2]


def test_descriptor_is_tritonclients_and_both_import_in_one_process() -> None:
    from tritonclient.grpc import service_pb2 as tc

    assert pb.DESCRIPTOR.name == "grpc_service.proto" and pb.DESCRIPTOR.package == "inference"
    assert pb.DESCRIPTOR.serialized_pb == tc.DESCRIPTOR.serialized_pb
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert len(service.methods) == 20
    # Both orders of import, each in a fresh interpreter.
    for first, second in (("host.proto.grpc_service_pb2", "tritonclient.grpc"),
                          ("tritonclient.grpc", "host.proto.grpc_service_pb2")):
        code = f"import {first}, {second}; import host.grpc"
        subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


# --- health, metadata, configuration -------------------------------------------------------

def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("simple", "7")
    with _raises(grpc.StatusCode.INVALID_ARGUMENT):
        client.is_model_ready("simple", "x")


def test_a_version_that_is_no_long_gets_tritons_error_on_every_endpoint(
        client: grpcclient.InferenceServerClient, endpoint: Endpoint) -> None:
    """As Triton parses a version (std::stol): past the range of a long it is the 'stol' error
    (INVALID_ARGUMENT / 400), readiness included, never 'not found' or 'not ready'."""
    huge = "99999999999999999999"
    text = (f"failed to get model version from specified version string '{huge}' (details: stol), "
            "version should be an integral value > 0")
    with _raises(grpc.StatusCode.INVALID_ARGUMENT, text):
        client.is_model_ready("simple", huge)
    with _raises(grpc.StatusCode.INVALID_ARGUMENT, text):
        client.get_model_metadata("simple", huge)
    assert not client.is_model_ready("simple", "5abc")  # stol reads 5: no such version
    http = httpclient.InferenceServerClient(endpoint.http_url)
    for call in (lambda: http.is_model_ready("simple", huge),
                 lambda: http.get_model_metadata("simple", huge)):
        with pytest.raises(InferenceServerException) as info:
            if call() is False:  # is_model_ready reports a failure as False: read the body
                raise InferenceServerException(_http_get(endpoint.http_url, huge))
        assert text in str(info.value)
    http.close()


def _http_get(url: str, version: str) -> str:
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(f"http://{url}/v2/models/simple/versions/{version}/ready", timeout=20)
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        return exc.read().decode()
    return "ready"


def test_metadata(client: grpcclient.InferenceServerClient) -> None:
    server = client.get_server_metadata()
    assert server.name == "modelhost" and "model_repository" in server.extensions
    meta = client.get_model_metadata("simple", as_json=True)
    assert meta["name"] == "simple" and meta["versions"] == ["1"] and meta["platform"] == "python"
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": ["-1", "16"]}
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    strings = client.get_model_metadata("simple_identity")
    assert strings.inputs[0].datatype == "BYTES"
    with _raises(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found"):
        client.get_model_metadata("nope")


def test_model_config_is_the_hosts_and_http_agrees(client: grpcclient.InferenceServerClient,
                                                   endpoint: Endpoint) -> None:
    from host.config import config_from_json
    from host.proto.model_config_pb2 import ModelConfig

    config = client.get_model_config("repeat_int32").config
    assert isinstance(config, ModelConfig)  # one class: the descriptor pool is shared
    assert config.name == "repeat_int32" and config.model_transaction_policy.decoupled
    http = httpclient.InferenceServerClient(endpoint.http_url)
    try:
        over_http = http.get_model_config("repeat_int32")
    finally:
        http.close()
    assert config_from_json(over_http) == config
    with _raises(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'simple' version 9 is not found"):
        client.get_model_config("simple", "9")


# --- unary inference -----------------------------------------------------------------------

def test_infer_raw(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b), request_id="req-7")
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-7", "simple", "1")
    assert not response.outputs[0].HasField("contents") and len(response.raw_output_contents) == 2
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # Requested outputs are honoured.
    only = client.infer("simple", _simple_inputs(a, b),
                        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)
    x = np.arange(1024, dtype=np.float32)
    np.testing.assert_array_equal(client.infer("identity_fp32", [_input("INPUT0", x)]).as_numpy("OUTPUT0"), x)
    s = np.array([[b"raw\x00bytes", b"", b"\xff"]], dtype=np.object_)
    echoed = client.infer("simple_identity", [_input("INPUT0", s, "BYTES")]).as_numpy("OUTPUT0")
    assert echoed.tolist() == s.tolist()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_raw_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    array = np.array(_VALUES[datatype], dtype=datatypes.to_numpy(datatype))  # BF16: ml_dtypes
    result = client.infer(f"dtype_{datatype.lower()}", [_input("INPUT0", array, datatype)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


_VALUES: dict[str, list] = {
    "BOOL": [True, False, True],
    "INT8": [-128, 0, 127], "INT16": [-32768, 1, 32767], "INT32": [-(2**31), 0, 2**31 - 1],
    "INT64": [-(2**63), 0, 2**63 - 1], "UINT8": [0, 1, 255], "UINT16": [0, 65535, 7],
    "UINT32": [0, 2**32 - 1, 5], "UINT64": [0, 2**64 - 1, 5],
    "FP16": [1.5, -2.0, 65504.0], "FP32": [1.5, -2.25, 3e38], "FP64": [1e300, -0.5, 2.0],
    "BF16": [1.5, -2.0, 256.0], "BYTES": [b"a\x00b", b"", b"\xff"],
}
_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
          "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
          "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
          "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _typed(model: str, datatype: str, values: list, name: str = "INPUT0") -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, _FIELD[datatype]).extend(values)
    return pb.ModelInferRequest(model_name=model, inputs=[tensor])


@pytest.mark.parametrize("datatype", sorted(_FIELD))
def test_infer_typed_contents_every_datatype(stub: pb_grpc.GRPCInferenceServiceStub,
                                             datatype: str) -> None:
    values = _VALUES[datatype]
    response = stub.ModelInfer(_typed(f"dtype_{datatype.lower()}", datatype, values), timeout=30)
    # Outputs always come back raw, as Triton sends them.
    assert not response.outputs[0].HasField("contents") and len(response.raw_output_contents) == 1
    out = grpcclient.InferResult(response).as_numpy("OUTPUT0")
    if datatype == "BYTES":
        assert out.tolist() == values
    else:
        np.testing.assert_array_equal(out, np.array(values, dtype=datatypes.to_numpy(datatype)))


def _rpc_error(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=30, **kwargs)
    return info.value


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_fp16_and_bf16_only_come_raw(stub: pb_grpc.GRPCInferenceServiceStub, datatype: str) -> None:
    request = _typed(f"dtype_{datatype.lower()}", "FP32", [1.0])
    request.inputs[0].datatype = datatype
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (f"unexpected explicit tensor data for input tensor 'INPUT0' for model "
                               f"'dtype_{datatype.lower()}' of type 'FP32', expected datatype "
                               f"'{datatype}'")


def test_mixing_raw_and_contents_is_tritons_error(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = _typed("simple", "INT32", list(range(16)), name="INPUT1")
    request.inputs[0].shape[:] = [1, 16]
    request.inputs.insert(0, pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32",
                                                                   shape=[1, 16]))
    request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("contents field must not be specified when using raw_input_contents "
                               "for 'INPUT1' for model 'simple'")


def test_raw_size_mismatch_is_tritons_error(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[4])
    request = pb.ModelInferRequest(model_name="identity_fp32", inputs=[tensor],
                                   raw_input_contents=[b"\0" * 12])
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Triton's core words it with the request's tag (checked against Triton 2.51)
    assert error.details() == ("[request id: <id_unknown>] input byte size mismatch for input "
                               "'INPUT0' for model 'identity_fp32'. Expected 16, got 12")


def test_unknown_model_and_version(client: grpcclient.InferenceServerClient) -> None:
    x = [_input("INPUT0", np.zeros(4, np.float32))]
    with _raises(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not found"):
        client.infer("nope", x)
    with _raises(grpc.StatusCode.NOT_FOUND,
                 "Request for unknown model: 'identity_fp32' version 4 is not found"):
        client.infer("identity_fp32", x, model_version="4")
    with _raises(grpc.StatusCode.INVALID_ARGUMENT):
        client.infer("identity_fp32", x, model_version="one")


def test_decoupled_model_refused_on_unary(client: grpcclient.InferenceServerClient) -> None:
    with _raises(grpc.StatusCode.UNIMPLEMENTED,
                 "ModelInfer RPC doesn't support models with decoupled transaction policy"):
        client.infer("repeat_int32", _repeat_inputs([1], [0]))


def test_invalid_request_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    with _raises(grpc.StatusCode.INVALID_ARGUMENT) as check:
        client.infer("simple", [_input("INPUT0", np.zeros((1, 16), np.int32))])
    assert "missing required input(s) ['INPUT1']" in check.error.message()


def test_request_parameters_reach_the_model(client: grpcclient.InferenceServerClient,
                                            stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    params = {"flag": True, "count": -3, "name": "x", "ratio": 0.5}
    result = client.infer("echo_parameters", [_input("INPUT0", np.zeros(1, np.int32))],
                          parameters=params)
    assert json.loads(result.as_numpy("PARAMS")[0]) == params
    # Reserved keys are the host's business; it refuses what Triton refuses (tritonclient already
    # refuses to send them, so this goes through the raw stub).
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1])
    request = pb.ModelInferRequest(model_name="echo_parameters", inputs=[tensor],
                                   raw_input_contents=[b"\0" * 4])
    request.parameters["triton_nope"].int64_param = 1
    error = _rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "triton_" in error.details()


@pytest.mark.parametrize("field, value, message", [
    ("sequence_id", ("uint64_param", 5),
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ("sequence_id", ("bool_param", True),
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    ("sequence_start", ("int64_param", 1),
     "invalid value type for 'sequence_start' parameter, expected bool_param."),
    ("sequence_end", ("string_param", "yes"),
     "invalid value type for 'sequence_end' parameter, expected bool_param."),
    ("priority", ("int64_param", -1), "invalid value for 'priority', expected value >= 0."),
    ("priority", ("double_param", 1.0),
     "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
    ("timeout", ("uint64_param", 10), "invalid value type for 'timeout' parameter, expected int64_param."),
])
def test_badly_typed_reserved_parameters_get_tritons_texts(stub: pb_grpc.GRPCInferenceServiceStub,
                                                           field, value, message) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1])
    request = pb.ModelInferRequest(model_name="echo_parameters", inputs=[tensor],
                                   raw_input_contents=[b"\0" * 4])
    setattr(request.parameters[field], *value)
    error = _rpc_error(stub.ModelInfer, request)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_priority_may_be_uint64_and_user_uint64_parameters_reach_the_model(
        stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1])
    request = pb.ModelInferRequest(model_name="echo_parameters", inputs=[tensor],
                                   raw_input_contents=[b"\0" * 4])
    request.parameters["priority"].uint64_param = 1
    request.parameters["big"].uint64_param = 2**64 - 1
    response = stub.ModelInfer(request)
    assert json.loads(response.raw_output_contents[0][4:]) == {"big": 2**64 - 1}


def test_compressed_requests(client: grpcclient.InferenceServerClient) -> None:
    x = np.arange(4096, dtype=np.float32)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("identity_fp32", [_input("INPUT0", x)], compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_sync_client_async_infer_callbacks(client: grpcclient.InferenceServerClient) -> None:
    """tritonclient.grpc's callback API: many requests in flight, each answered through its callback."""
    import queue

    done: queue.Queue = queue.Queue()
    for k in range(8):
        x = np.full(16, k, dtype=np.float32)
        client.async_infer("identity_fp32", [_input("INPUT0", x)],
                           callback=lambda result, error, k=k: done.put((k, result, error)),
                           request_id=f"r{k}")
    got = {}
    for _ in range(8):
        k, result, error = done.get(timeout=30)
        assert error is None, error
        got[k] = result
    for k, result in got.items():
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(16, k, np.float32))
        assert result.get_response().id == f"r{k}"


def test_aio_client(endpoint: Endpoint) -> None:
    import asyncio

    import tritonclient.grpc.aio as aioclient

    async def run() -> np.ndarray:
        async with aioclient.InferenceServerClient(endpoint.grpc_url) as aio:
            assert await aio.is_server_live()
            assert (await aio.get_model_metadata("simple")).name == "simple"
            a = np.ones((1, 16), dtype=np.int32)
            inputs = [aioclient.InferInput("INPUT0", [1, 16], "INT32"),
                      aioclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a)
            return (await aio.infer("simple", inputs)).as_numpy("OUTPUT0")

    np.testing.assert_array_equal(asyncio.run(run()), np.full((1, 16), 2, np.int32))


DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


def test_shared_memory_is_off_unless_allowed(client: grpcclient.InferenceServerClient) -> None:
    # status answers whatever the setting; unregister is refused, as Triton refuses it
    assert not client.get_system_shared_memory_status().regions
    assert not client.get_cuda_shared_memory_status().regions
    for unregister in (client.unregister_system_shared_memory, client.unregister_cuda_shared_memory):
        with _raises(grpc.StatusCode.UNIMPLEMENTED, DISABLED):
            unregister()
    with _raises(grpc.StatusCode.UNIMPLEMENTED, DISABLED):
        client.register_system_shared_memory("r", "/key", 16)
    assert "system_shared_memory" not in client.get_server_metadata().extensions


# --- streaming -----------------------------------------------------------------------------

class _Collector:
    """A tritonclient stream callback that keeps (result, error) pairs and wakes waiters."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []
        self.cond = threading.Condition()

    def __call__(self, result: Any, error: Any) -> None:
        with self.cond:
            self.items.append((result, error))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30) -> list[tuple[Any, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= count, timeout), self.items
            return list(self.items)

    def responses(self) -> list[Any]:
        errors = [e for _, e in self.items if e is not None]
        assert not errors, errors
        return [r.get_response() for r, _ in self.items]


def _by_id(responses: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in responses:
        out.setdefault(r.id, []).append(r)
    return out


def test_stream_repeat_concurrent_requests(client: grpcclient.InferenceServerClient) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    try:
        client.async_stream_infer("repeat_int32", _repeat_inputs([10, 11, 12, 13], [60] * 4),
                                  request_id="many")
        client.async_stream_infer("repeat_int32", _repeat_inputs([5], [10]), request_id="one")
        client.async_stream_infer("repeat_int32", _repeat_inputs([], []), request_id="zero")
    finally:
        client.stop_stream()  # waits for every response
    responses = got.responses()
    by_id = _by_id(responses)
    assert set(by_id) == {"many", "one"}  # "zero": no response (no empty final asked for)
    assert [int(grpcclient.InferResult(r).as_numpy("OUT")[0]) for r in by_id["many"]] == [10, 11, 12, 13]
    assert [int(grpcclient.InferResult(r).as_numpy("IDX")[0]) for r in by_id["many"]] == [0, 1, 2, 3]
    assert [int(grpcclient.InferResult(r).as_numpy("OUT")[0]) for r in by_id["one"]] == [5]
    # Processed concurrently: the short request was answered before the long one ended.
    assert responses.index(by_id["one"][0]) < responses.index(by_id["many"][-1])
    # Every decoupled response says whether it is the last; the flags-only last one is not sent.
    assert all(r.parameters[FINAL].bool_param is False for r in responses)
    assert all(r.model_name == "repeat_int32" and r.model_version == "1" for r in responses)


def test_stream_empty_final_response_only_when_asked(client: grpcclient.InferenceServerClient) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    try:
        client.async_stream_infer("repeat_int32", _repeat_inputs([1, 2], [5, 5]), request_id="two",
                                  enable_empty_final_response=True)
        client.async_stream_infer("repeat_int32", _repeat_inputs([], []), request_id="zero",
                                  enable_empty_final_response=True)
        client.async_stream_infer("repeat_int32", _repeat_inputs([3], [5]), request_id="plain")
    finally:
        client.stop_stream()
    by_id = _by_id(got.responses())
    assert [r.parameters[FINAL].bool_param for r in by_id["two"]] == [False, False, True]
    assert [len(r.outputs) for r in by_id["two"]] == [2, 2, 0]
    assert [(r.parameters[FINAL].bool_param, len(r.outputs)) for r in by_id["zero"]] == [(True, 0)]
    assert by_id["zero"][0].model_name == "repeat_int32"
    assert [r.parameters[FINAL].bool_param for r in by_id["plain"]] == [False]


def test_stream_non_decoupled_models(client: grpcclient.InferenceServerClient) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    x = np.arange(8, dtype=np.float32)
    try:
        for i in range(5):
            client.async_stream_infer("simple", _simple_inputs(a, a * i), request_id=f"s{i}")
            client.async_stream_infer("identity_fp32", [_input("INPUT0", x + i)], request_id=f"i{i}")
    finally:
        client.stop_stream()
    responses = got.responses()
    # One response each, final, in the order of the requests (as Triton for non-decoupled models).
    assert [r.id for r in responses] == [f"{k}{i}" for i in range(5) for k in "si"]
    assert all(r.parameters[FINAL].bool_param for r in responses)
    for r, _ in got.items:
        i = int(r.get_response().id[1:])
        if r.get_response().model_name == "simple":
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a * i)
        else:
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x + i)


def test_stream_many_requests_keep_their_order(client: grpcclient.InferenceServerClient) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    try:
        for i in range(300):
            client.async_stream_infer("identity_fp32", [_input("INPUT0", np.full(64, i, np.float32))],
                                      request_id=str(i))
    finally:
        client.stop_stream()
    assert [r.id for r in got.responses()] == [str(i) for i in range(300)]
    assert [float(r.as_numpy("OUTPUT0")[0]) for r, _ in got.items] == [float(i) for i in range(300)]


def test_concurrent_unary_clients(endpoint: Endpoint) -> None:
    failures: list[BaseException] = []

    def run(k: int) -> None:
        triton = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            for i in range(40):
                x = np.full(256, k * 1000 + i, dtype=np.float32)
                out = triton.infer("identity_fp32", [_input("INPUT0", x)], request_id=f"{k}-{i}")
                assert out.get_response().id == f"{k}-{i}"
                np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)
        finally:
            triton.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_stream_error_for_one_request_then_others_succeed(client: grpcclient.InferenceServerClient,
                                                          stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    a = np.ones((1, 16), dtype=np.int32)
    try:
        client.async_stream_infer("nope", _simple_inputs(a, a), request_id="bad")
        client.async_stream_infer("simple", [_input("INPUT0", a)], request_id="half")
        client.async_stream_infer("simple", _simple_inputs(a, a), request_id="good")
        client.async_stream_infer("repeat_int32", _repeat_inputs([4], [1]), request_id="after")
    finally:
        client.stop_stream()
    errors = [str(e) for _, e in got.items if e is not None]
    assert len(errors) == 2
    assert "Request for unknown model: 'nope' is not found" in errors[0]
    assert "missing required input(s) ['INPUT1']" in errors[1]
    results = [r for r, e in got.items if e is None]
    assert [r.get_response().id for r in results] == ["good", "after"]
    np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), a + a)
    # On the wire the error carries the request's id.
    requests = [pb.ModelInferRequest(model_name="nope", id="bad-id"),
                pb.ModelInferRequest(model_name="repeat_int32", id="model-error",
                                     inputs=[pb.ModelInferRequest.InferInputTensor(
                                         name=n, datatype=d, shape=[s]) for n, d, s in
                                         (("IN", "INT32", 2), ("DELAY", "UINT32", 1),
                                          ("WAIT", "UINT32", 1))],
                                     raw_input_contents=[b"\0" * 8, b"\0" * 4, b"\0" * 4])]
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
    assert [(m.infer_response.id, bool(m.error_message)) for m in answers] == [
        ("bad-id", True), ("model-error", True)]
    assert "IN and DELAY must have the same shape" in answers[1].error_message
    assert answers[1].infer_response.parameters[FINAL].bool_param is True


def _read_record(root: Path) -> list[str]:
    path = root / "cancellable" / "record.txt"
    return path.read_text().split("\n") if path.exists() else []


def _tag(value: str) -> list[grpcclient.InferInput]:
    return [_input("TAG", np.array([value.encode()], dtype=np.object_), "BYTES")]


def test_stream_cancellation_reaches_the_model(client: grpcclient.InferenceServerClient,
                                               extra_repository: Path) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    client.async_stream_infer("cancellable", _tag("stream"), request_id="c")
    wait_until(lambda: "stream started" in _read_record(extra_repository), timeout=20)
    # The blocked request does not hold up the next ones of the same stream.
    client.async_stream_infer("repeat_int32", _repeat_inputs([9], [0]), request_id="next")
    (result, error), = got.wait_for(1, timeout=10)
    assert error is None and result.get_response().id == "next"
    assert "stream cancelled" not in _read_record(extra_repository)
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: "stream cancelled" in _read_record(extra_repository), timeout=20,
               message=f"the model did not see the cancellation: {_read_record(extra_repository)}")
    assert client.is_server_live()


def test_unary_deadline_cancels_the_request(client: grpcclient.InferenceServerClient,
                                            extra_repository: Path) -> None:
    def blocked() -> None:
        with _raises(grpc.StatusCode.DEADLINE_EXCEEDED):
            client.infer("cancellable", _tag("unary"), client_timeout=5.0)

    thread = threading.Thread(target=blocked)
    thread.start()
    wait_until(lambda: "unary started" in _read_record(extra_repository), timeout=20)
    # While the model blocks, other calls are answered: before the blocked call's deadline.
    a = np.ones((1, 16), dtype=np.int32)
    assert client.is_server_ready()
    np.testing.assert_array_equal(client.infer("simple", _simple_inputs(a, a)).as_numpy("OUTPUT0"), a + a)
    assert thread.is_alive() and "unary cancelled" not in _read_record(extra_repository)
    thread.join()
    wait_until(lambda: "unary cancelled" in _read_record(extra_repository), timeout=20,
               message=f"the model did not see the cancellation: {_read_record(extra_repository)}")


def test_stream_cancel_mid_repeat_then_server_keeps_serving(client: grpcclient.InferenceServerClient) -> None:
    got = _Collector()
    client.start_stream(callback=got)
    client.async_stream_infer("repeat_int32", _repeat_inputs(list(range(40)), [50] * 40),
                              request_id="long")
    got.wait_for(2)
    client.stop_stream(cancel_requests=True)
    seen = len(got.items)
    assert seen < 40
    # A new stream and unary calls work as before.
    again = _Collector()
    client.start_stream(callback=again)
    try:
        client.async_stream_infer("repeat_int32", _repeat_inputs([1, 2], [1, 1]), request_id="next")
    finally:
        client.stop_stream()
    assert [int(grpcclient.InferResult(r).as_numpy("OUT")[0]) for r in again.responses()] == [1, 2]
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(client.infer("simple", _simple_inputs(a, a)).as_numpy("OUTPUT0"), a + a)


# --- statistics ----------------------------------------------------------------------------

def test_statistics_equal_http(client: grpcclient.InferenceServerClient, endpoint: Endpoint) -> None:
    http = httpclient.InferenceServerClient(endpoint.http_url)
    try:
        a = np.ones((1, 16), dtype=np.int32)
        for _ in range(3):
            client.infer("simple", _simple_inputs(a, a))
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                  httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        http.infer("simple", inputs)
        over_grpc = client.get_inference_statistics("simple")
        over_http = http.get_inference_statistics("simple")
        everything = client.get_inference_statistics()
    finally:
        http.close()
    assert over_grpc == json_format.ParseDict(over_http, pb.ModelStatisticsResponse())
    stats = over_grpc.model_stats[0]
    assert stats.name == "simple" and stats.inference_stats.success.count >= 4
    assert {s.name for s in everything.model_stats} >= {"simple", "identity_fp32"}
    # Triton's answer for statistics of an unknown model: INVALID_ARGUMENT (L0_server_status)
    with _raises(grpc.StatusCode.INVALID_ARGUMENT):
        client.get_inference_statistics("nope")


# --- repository control ---------------------------------------------------------------------

def test_repository_index_load_unload_in_explicit_mode() -> None:
    with grpc_serving([MODEL_REPOSITORY], control_mode="explicit") as ep:
        client = grpcclient.InferenceServerClient(ep.grpc_url)
        try:
            index = client.get_model_repository_index(as_json=True)["models"]
            assert {m["name"] for m in index} >= {"simple", "identity_fp32", "repeat_int32"}
            assert not any(m.get("state") == "READY" for m in index)
            assert client.get_model_repository_index().models  # as a message too
            client.load_model("simple")
            assert client.is_model_ready("simple")
            ready = client.get_model_repository_index(as_json=True)["models"]
            assert [m["name"] for m in ready if m.get("state") == "READY"] == ["simple"]
            # A configuration override, as JSON text in parameters["config"].string_param.
            override = {"backend": "python", "max_batch_size": 4,
                        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
            client.load_model("identity_fp32", config=json.dumps(override))
            assert client.get_model_config("identity_fp32").config.max_batch_size == 4
            client.unload_model("simple")
            wait_until(lambda: not client.is_model_ready("simple"), timeout=20)
            with _raises(grpc.StatusCode.INTERNAL) as check:  # Triton's poll failure
                client.load_model("nope")
            assert "nope" in check.error.message()
            with grpc.insecure_channel(ep.grpc_url) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                error = _rpc_error(stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="r"))
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            assert error.details() == "'repository_name' specification is not supported"
        finally:
            client.close()


def test_load_unload_refused_without_explicit_mode(client: grpcclient.InferenceServerClient) -> None:
    with _raises(grpc.StatusCode.UNAVAILABLE,
                 "explicit model load / unload is not allowed if polling is enabled"):
        client.load_model("simple")


# --- the server object -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_host() -> Iterator[Any]:
    from host.core import Host
    from host.options import ServerOptions

    host = Host(ServerOptions(model_repositories=[MODEL_REPOSITORY]))
    host.start()
    yield host
    host.stop()


class _CountingProxy:
    """A TCP proxy in front of a server that counts the bytes going each way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = self.down = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, "down"), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        try:
            while data := source.recv(65536):
                setattr(self, direction, getattr(self, direction) + len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def _bytes_through_proxy(port: int, compression: str | None) -> tuple[int, int]:
    proxy = _CountingProxy(port)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{proxy.port}")
    try:
        zeros = np.zeros(1 << 18, dtype=np.float32)  # 1 MiB, compresses to almost nothing
        result = client.infer("identity_fp32", [_input("INPUT0", zeros)], compression_algorithm=compression)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), zeros)
        return proxy.up, proxy.down
    finally:
        client.close()
        proxy.close()


def test_compression_on_the_wire(small_host: Any) -> None:
    from host.grpc import start_grpc_server

    plain = start_grpc_server(small_host, "127.0.0.1", 0)
    compressing = start_grpc_server(small_host, "127.0.0.1", 0, compression_level="high")
    try:
        up, down = _bytes_through_proxy(plain.port, None)
        assert up > 1 << 20 and down > 1 << 20  # Triton's default: no response compression
        up, down = _bytes_through_proxy(plain.port, "gzip")
        assert up < 100_000 and down > 1 << 20  # a compressed request is accepted
        up, down = _bytes_through_proxy(compressing.port, "deflate")
        assert up < 100_000 and down < 100_000  # responses compressed, as the client accepts
    finally:
        plain.stop(1)
        compressing.stop(1)


def test_bind_failure_and_stop(small_host: Any) -> None:
    from host.grpc import start_grpc_server

    server = start_grpc_server(small_host, "127.0.0.1", 0)
    with pytest.raises(OSError, match="failed to start the gRPC server"):
        start_grpc_server(small_host, "127.0.0.1", server.port)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_server_live()
        server.stop(1)
        assert server.wait(0)
        with pytest.raises(InferenceServerException):
            client.is_server_live(client_timeout=2)
    finally:
        client.close()
    port = free_port()
    again = start_grpc_server(small_host, "127.0.0.1", port)
    assert again.port == port
    again.stop(0)


def test_slow_calls_do_not_hold_up_others(small_host: Any) -> None:
    """A call that blocks its thread (a slow model, a batch being gathered) leaves others served."""
    from host.grpc import start_grpc_server

    server = start_grpc_server(small_host, "127.0.0.1", 0)
    try:
        results: list[float] = []

        def batched(n: int) -> None:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
            x = np.ones((1, 4), dtype=np.float32)
            for _ in range(n):
                started = time.monotonic()
                rows = client.infer("batched_add", [_input("INPUT0", x)]).as_numpy("BATCH")
                results.append(time.monotonic() - started)
                assert rows.shape == (1, 1)
            client.close()

        threads = [threading.Thread(target=batched, args=(10,)) for _ in range(8)]
        for t in threads:
            t.start()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        for _ in range(20):
            started = time.monotonic()
            assert client.is_server_ready()
            assert time.monotonic() - started < 1.0
        client.close()
        for t in threads:
            t.join()
        assert len(results) == 80
    finally:
        server.stop(1)


def test_concurrent_unary_calls_reach_the_dynamic_batcher_together(
        client: grpcclient.InferenceServerClient) -> None:
    """ModelInfer does not hold the polling thread while a batch gathers: the calls that arrive
    meanwhile join the same batch (batched_add's BATCH output is the rows its execute saw)."""
    x = np.ones((1, 4), dtype=np.float32)
    for _ in range(5):  # a slow machine may split one wave; five waves of 8 cannot all split
        done: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(8):
            client.async_infer("batched_add", [_input("INPUT0", x)],
                               callback=lambda result, error: done.put((result, error)))
        rows = []
        for _ in range(8):
            result, error = done.get(timeout=30)
            assert error is None, error
            rows.append(int(result.as_numpy("BATCH")[0, 0]))
        if max(rows) >= 4:  # (one at a time gave all 1s, at best a 2 from a late wake-up)
            return
    pytest.fail(f"eight concurrent calls were never batched together: {rows}")


def test_bytes_that_are_no_request_message_get_tritons_answer(endpoint: Endpoint) -> None:
    """Not a protobuf at all: INTERNAL 'Unable to parse request', as Triton 2.51 (gRPC C++)
    answers, for inference and every other unary method; the server goes on serving."""
    with grpc.insecure_channel(endpoint.grpc_url) as channel:
        for method in ("ModelInfer", "ServerLive", "RepositoryIndex"):
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                                       request_serializer=lambda x: x,
                                       response_deserializer=lambda x: x)
            with pytest.raises(grpc.RpcError) as info:
                call(b"\xff\xfe\x00\x01garbage", timeout=20)
            assert info.value.code() == grpc.StatusCode.INTERNAL, method
            assert info.value.details() == "Unable to parse request", method
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                   request_serializer=pb.ServerLiveRequest.SerializeToString,
                                   response_deserializer=pb.ServerLiveResponse.FromString)
        assert live(pb.ServerLiveRequest(), timeout=20).live
