"""The falcon app (`host.http.create_app`) against the REAL Host serving the example `model_repository/`
(falcon.testing, in process), a stub Host for what a real model cannot easily produce (every error
code, errors in the middle of a stream, a client leaving a stream), and the real `tritonclient.http`
over a socket."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import json
import shutil
import socket
import threading
import zlib
from pathlib import Path

import falcon.testing
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.core import Host
from host.errors import (AlreadyExistsError, CancelledError, InternalError, InvalidArgumentError, NotFoundError,
                         UnavailableError, UnsupportedError)
from host.http import create_app
from host.http.server import serve
from host.inference import InferenceResponse, Tensor
from host.options import ServerOptions

pytestmark = pytest.mark.timeout(60)

MODEL_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
Client = httpclient.InferenceServerClient
IHCL = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def host():
    h = Host(ServerOptions(model_repositories=[MODEL_REPOSITORY]))
    assert h.start() == {}
    yield h
    h.stop()


@pytest.fixture(scope="module")
def client(host):
    return falcon.testing.TestClient(create_app(host))


def _error(result, status):
    assert result.status_code == status, (result.status_code, result.text)
    assert result.headers["content-type"] == "application/json"
    body = json.loads(result.text)
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    return body["error"]


def _simple_request(binary=True, outputs=None, **kwargs):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    body, header_length = Client.generate_request_body(inputs, outputs=outputs, **kwargs)
    headers = {IHCL: str(header_length)} if header_length is not None else {}
    return a, b, body, headers


def _parse(result):
    header_length = result.headers.get(IHCL)
    return Client.parse_response_body(result.content, header_length=int(header_length) if header_length else None,
                                      content_encoding=result.headers.get("content-encoding"))  # fmt: skip


# --- health, metadata, config, statistics ----------------------------------------------------------


def test_health(client):
    for path in ("/v2/health/live", "/v2/health/ready"):
        result = client.simulate_get(path)
        assert result.status_code == 200 and result.content == b""


def test_health_not_ready_is_400():
    class NotReady:
        def live(self):
            return False

        def ready(self):
            return False

    app = falcon.testing.TestClient(create_app(NotReady()))
    assert app.simulate_get("/v2/health/live").status_code == 400
    assert app.simulate_get("/v2/health/ready").status_code == 400


def test_server_metadata(client):
    result = client.simulate_get("/v2")
    assert result.status_code == 200 and result.headers["content-type"] == "application/json"
    assert result.json["name"] == "modelhost" and "binary_tensor_data" in result.json["extensions"]


def test_model_metadata_and_versions(client):
    metadata = client.simulate_get("/v2/models/simple").json
    assert metadata["name"] == "simple" and metadata["versions"] == ["1"]
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.simulate_get("/v2/models/simple/versions/1").json == metadata
    assert "unknown model" in _error(client.simulate_get("/v2/models/nope"), 404)
    assert "version 7" in _error(client.simulate_get("/v2/models/simple/versions/7"), 404)
    # Triton routes numeric versions only: anything else is no route at all
    assert _error(client.simulate_get("/v2/models/simple/versions/latest"), 404) == "Not Found"


def test_model_ready(client):
    assert client.simulate_get("/v2/models/simple/ready").status_code == 200
    assert client.simulate_get("/v2/models/simple/versions/1/ready").status_code == 200
    assert _error(client.simulate_get("/v2/models/nope/ready"), 400) == "Model version not ready"
    assert _error(client.simulate_get("/v2/models/simple/versions/7/ready"), 400) == "Model version not ready"


def test_model_config(client):
    config = client.simulate_get("/v2/models/batched_add/config").json
    assert config["name"] == "batched_add" and config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert client.simulate_get("/v2/models/batched_add/versions/1/config").json == config
    assert "unknown model" in _error(client.simulate_get("/v2/models/nope/config"), 404)


def test_statistics(client):
    everything = client.simulate_get("/v2/models/stats").json["model_stats"]
    assert {s["name"] for s in everything} >= {"simple", "identity_fp32", "repeat_int32"}
    one = client.simulate_get("/v2/models/simple/stats").json["model_stats"]
    assert [(s["name"], s["version"]) for s in one] == [("simple", "1")]
    assert client.simulate_get("/v2/models/simple/versions/1/stats").json["model_stats"][0]["name"] == "simple"
    # Triton's answer (L0_server_status): 400 "requested model 'nope' is not available"
    assert _error(client.simulate_get("/v2/models/nope/stats"), 400) == "requested model 'nope' is not available"


def test_no_route_and_wrong_method(client):
    assert _error(client.simulate_get("/v2/nothing/here"), 404) == "Not Found"
    assert _error(client.simulate_get("/v2/models/simple/infer/more"), 404) == "Not Found"
    result = client.simulate_get("/v2/models/simple/infer")
    assert _error(result, 405) == "Method Not Allowed"
    assert "POST" in result.headers["allow"]
    assert _error(client.simulate_post("/v2/health/live"), 405) == "Method Not Allowed"
    assert _error(client.simulate_delete("/v2/repository/index"), 405) == "Method Not Allowed"


# --- infer ------------------------------------------------------------------------------------------


def test_infer_binary_with_tritonclient_codec(client):
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    a, b, body, headers = _simple_request(outputs=outputs, request_id="r-1")
    result = client.simulate_post("/v2/models/simple/infer", body=body, headers=headers)
    assert result.status_code == 200, result.text
    assert result.headers["content-type"] == "application/octet-stream"
    parsed = _parse(result)
    np.testing.assert_array_equal(parsed.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(parsed.as_numpy("OUTPUT1"), a - b)
    response = parsed.get_response()
    assert response["id"] == "r-1" and response["model_name"] == "simple" and response["model_version"] == "1"
    assert "data" in parsed.get_output("OUTPUT1") and "data" not in parsed.get_output("OUTPUT0")


def test_infer_json_only(client):
    a, b, body, headers = _simple_request(binary=False, outputs=[httpclient.InferRequestedOutput("OUTPUT1", False)])
    assert headers == {}
    result = client.simulate_post("/v2/models/simple/versions/1/infer", body=body)
    assert result.status_code == 200 and result.headers["content-type"] == "application/json"
    assert IHCL.lower() not in result.headers
    assert [o["name"] for o in result.json["outputs"]] == ["OUTPUT1"]
    assert result.json["outputs"][0]["data"] == (a - b).flatten().tolist()


def test_infer_without_outputs_returns_all_as_json(client):
    a = np.arange(16, dtype=np.int32).tolist()
    doc = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": a} for n in ("INPUT0", "INPUT1")]}
    result = client.simulate_post("/v2/models/simple/infer", body=json.dumps(doc))
    assert result.status_code == 200
    assert {o["name"]: o["data"] for o in result.json["outputs"]} == {
        "OUTPUT0": [2 * x for x in a], "OUTPUT1": [0] * 16}
    doc["parameters"] = {"binary_data_output": True}
    result = client.simulate_post("/v2/models/simple/infer", body=json.dumps(doc))
    assert result.headers["content-type"] == "application/octet-stream"
    np.testing.assert_array_equal(_parse(result).as_numpy("OUTPUT0"), np.array([a]) * 2)


def test_infer_bytes_with_nul(client):
    values = np.array([[b"\x00", b"a\x00b", b"", b"\xff\xfe", b"end\x00"]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [1, 5], "BYTES")
    tensor.set_data_from_numpy(values)
    body, header_length = Client.generate_request_body([tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    result = client.simulate_post("/v2/models/simple_identity/infer", body=body, headers={IHCL: str(header_length)})
    assert result.status_code == 200, result.text
    assert _parse(result).as_numpy("OUTPUT0").tolist() == values.tolist()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_infer_compressed_request_and_response(client, encoding):
    a, b, body, headers = _simple_request()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers.update({"Content-Encoding": encoding, "Accept-Encoding": encoding})
    result = client.simulate_post("/v2/models/simple/infer", body=packed, headers=headers)
    assert result.status_code == 200, result.text
    assert result.headers["content-encoding"] == encoding
    np.testing.assert_array_equal(_parse(result).as_numpy("OUTPUT0"), a + b)


def test_infer_unsupported_content_encoding(client):
    _, _, body, headers = _simple_request()
    result = client.simulate_post("/v2/models/simple/infer", body=body, headers={**headers, "Content-Encoding": "br"})
    assert _error(result, 501) == "Unsupported compression type"
    assert result.headers["accept-encoding"] == "gzip, deflate"


def test_max_input_size(host):
    small = falcon.testing.TestClient(create_app(host, max_input_size=1024))
    big = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2000], "datatype": "FP32", "data": [1.5] * 2000}]})
    message = _error(small.simulate_post("/v2/models/identity_fp32/infer", body=big), 400)
    assert "1024" in message and "--http-max-input-size" in message
    message = _error(small.simulate_post("/v2/models/identity_fp32/infer", body=gzip.compress(big.encode()),
                                         headers={"Content-Encoding": "gzip"}), 400)  # fmt: skip
    assert "Decompressed data size exceeds the maximum allowed value of 1024 bytes" in message
    ok = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2]}]})
    assert small.simulate_post("/v2/models/identity_fp32/infer", body=ok).json["outputs"][0]["data"] == [1.5, 2]


def test_infer_errors(client):
    _, _, body, headers = _simple_request()
    assert "Request for unknown model: 'nope'" in _error(client.simulate_post("/v2/models/nope/infer", body=body,
                                                                              headers=headers), 404)  # fmt: skip
    assert "version 4" in _error(client.simulate_post("/v2/models/simple/versions/4/infer", body=body,
                                                      headers=headers), 404)  # fmt: skip
    assert "failed to parse the request JSON buffer" in _error(
        client.simulate_post("/v2/models/simple/infer", body=b'{"inputs": ['), 400)
    assert "unexpected additional input data" in _error(
        client.simulate_post("/v2/models/simple/infer", body=body + b"xx", headers=headers), 400)
    assert "Inference-Header-Content-Length" in _error(
        client.simulate_post("/v2/models/simple/infer", body=body, headers={IHCL: "x"}), 400)
    wrong = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 8], "data": [0] * 8}
                                   for n in ("INPUT0", "INPUT1")]})  # fmt: skip
    assert "shape" in _error(client.simulate_post("/v2/models/simple/infer", body=wrong), 400)


def test_infer_on_decoupled_model_is_501(client):
    doc = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
                      {"name": "DELAY", "datatype": "UINT32", "shape": [1], "data": [0]},
                      {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}]}  # fmt: skip
    message = _error(client.simulate_post("/v2/models/repeat_int32/infer", body=json.dumps(doc)), 501)
    assert "doesn't support models with decoupled transaction policy" in message


# --- generate ---------------------------------------------------------------------------------------


def test_generate_text(client):
    result = client.simulate_post("/v2/models/simple_identity/generate", json={"id": "g1", "INPUT0": "hello\u0000"})
    assert result.status_code == 200 and result.headers["content-type"] == "application/json"
    assert result.json == {"id": "g1", "model_name": "simple_identity", "model_version": "1", "OUTPUT0": "hello\u0000"}


def test_generate_lists_and_parameters_object(client):
    a = list(range(16))
    result = client.simulate_post("/v2/models/simple/generate",
                                  json={"INPUT0": a, "parameters": {"INPUT1": [1] * 16, "temperature": 0.5}})
    assert result.status_code == 200, result.text
    assert result.json["OUTPUT0"] == [x + 1 for x in a] and result.json["OUTPUT1"] == [x - 1 for x in a]


def test_generate_decoupled_single_and_several_responses(client):
    one = client.simulate_post("/v2/models/repeat_int32/generate", json={"IN": [5], "DELAY": [0], "WAIT": [0]})
    assert one.status_code == 200 and (one.json["OUT"], one.json["IDX"]) == (5, 0)
    several = client.simulate_post("/v2/models/repeat_int32/generate", json={"IN": [5, 6], "DELAY": [0, 0], "WAIT": [0]})
    assert "generate expects model to produce exactly 1 response" in _error(several, 500)


def test_generate_errors(client):
    assert "unknown model" in _error(client.simulate_post("/v2/models/nope/generate", json={"x": 1}), 404)
    assert "failed to parse the request JSON buffer" in _error(
        client.simulate_post("/v2/models/simple/generate", body=b"{"), 400)
    assert "The schema can not convert input 'INPUT0'" in _error(
        client.simulate_post("/v2/models/simple/generate", json={"INPUT0": [1, 2, 3], "INPUT1": [1] * 16}), 400)
    assert "parameter 'x' has invalid type" in _error(
        client.simulate_post("/v2/models/simple/generate", json={"x": {"y": 1}}), 400)


def _events(result):
    assert result.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert result.text.endswith("\n\n") or result.text == ""
    return [json.loads(chunk[len("data: "):]) for chunk in result.text.split("\n\n") if chunk]


def test_generate_stream(client):
    result = client.simulate_post("/v2/models/repeat_int32/generate_stream",
                                  json={"IN": [4, -5, 6], "DELAY": [5, 0, 0], "WAIT": [0]})  # fmt: skip
    assert result.status_code == 200
    assert [(e["IDX"], e["OUT"], e["model_name"]) for e in _events(result)] == [
        (0, 4, "repeat_int32"), (1, -5, "repeat_int32"), (2, 6, "repeat_int32")]
    empty = client.simulate_post("/v2/models/repeat_int32/generate_stream", json={"IN": [], "DELAY": [], "WAIT": [0]})
    assert empty.status_code == 200 and _events(empty) == []
    plain = client.simulate_post("/v2/models/simple_identity/versions/1/generate_stream", json={"INPUT0": ["a", "b"]})
    assert _events(plain) == [{"model_name": "simple_identity", "model_version": "1", "OUTPUT0": ["a", "b"]}]


def test_generate_stream_model_error_first(client):
    """The model's first response is an error: its code sets the status (a python-backend TritonError is
    INTERNAL unless the model says otherwise, as in Triton), the error is an event."""
    result = client.simulate_post("/v2/models/repeat_int32/generate_stream", json={"IN": [1, 2], "DELAY": [0], "WAIT": [0]})
    assert result.status_code == 500
    events = _events(result)
    assert len(events) == 1 and "same shape" in events[0]["error"]


def test_generate_stream_error_before_inference_is_plain_json(client):
    assert "unknown model" in _error(client.simulate_post("/v2/models/nope/generate_stream", json={}), 404)
    assert "The schema can not convert input 'INPUT0'" in _error(
        client.simulate_post("/v2/models/simple/generate_stream", json={"INPUT0": [0] * 3, "INPUT1": [0] * 16}), 400)
    missing = client.simulate_post("/v2/models/simple/generate_stream", json={"INPUT0": [0] * 16})
    assert "INPUT1" in _error(missing, 400)  # the host's validation, before any response


# --- repository ---------------------------------------------------------------------------------------


def test_repository_index(client):
    for body in (None, "", json.dumps({}), json.dumps({"ready": True}), json.dumps({"ready": False})):
        result = client.simulate_post("/v2/repository/index", body=body)
        assert result.status_code == 200
        assert {e["name"]: e["state"] for e in result.json}["simple"] == "READY"
    assert "'ready'" in _error(client.simulate_post("/v2/repository/index", json={"ready": "yes"}), 400)
    assert "must be an object" in _error(client.simulate_post("/v2/repository/index", body="[]"), 400)


def test_load_unload_refused_in_mode_none(client):
    assert "not allowed if polling is enabled" in _error(client.simulate_post("/v2/repository/models/simple/load"), 503)
    assert "not allowed if polling is enabled" in _error(client.simulate_post("/v2/repository/models/simple/unload"), 503)


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    for name in ("simple", "simple_identity"):
        shutil.copytree(MODEL_REPOSITORY / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    h = Host(ServerOptions(model_repositories=[root], model_control_mode="explicit"))
    h.start()
    yield falcon.testing.TestClient(create_app(h))
    h.stop()


def test_explicit_load_and_unload(explicit):
    assert explicit.simulate_get("/v2/models/simple/ready").status_code == 400
    assert explicit.simulate_post("/v2/repository/models/simple/load").status_code == 200
    assert explicit.simulate_get("/v2/models/simple/ready").status_code == 200
    assert {e["name"]: e["state"] for e in explicit.simulate_post("/v2/repository/index", json={"ready": True}).json} \
        == {"simple": "READY"}
    unload = explicit.simulate_post("/v2/repository/models/simple/unload", json={"parameters": {"unload_dependents": True}})
    assert unload.status_code == 200
    assert explicit.simulate_get("/v2/models/simple/ready").status_code == 400
    assert "failed to load 'nope', failed to poll from model repository" in _error(
        explicit.simulate_post("/v2/repository/models/nope/load"), 500)  # Triton's INTERNAL
    assert "unload_dependents" in _error(explicit.simulate_post(
        "/v2/repository/models/simple/unload", json={"parameters": {"unload_dependents": "yes"}}), 400)


def test_explicit_load_with_config(explicit):
    config = {"name": "simple_identity", "backend": "python", "max_batch_size": 4,
              "input": [{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}]}
    result = explicit.simulate_post("/v2/repository/models/simple_identity/load",
                                    json={"parameters": {"config": json.dumps(config)}})
    assert result.status_code == 200, result.text
    assert explicit.simulate_get("/v2/models/simple_identity/config").json["max_batch_size"] == 4
    assert explicit.simulate_post("/v2/repository/models/simple_identity/unload").status_code == 200


# --- a stub host: every error code, load parameters, streams ---------------------------------------------


class Stub:
    """Answers what a test sets; records what it was given."""

    def __init__(self):
        self.error = None
        self.loaded = None
        self.stream_items = []
        self.closed = threading.Event()

    def model_metadata(self, name, version=""):
        if self.error:
            raise self.error
        return {"name": name, "inputs": [{"name": "X", "datatype": "INT32", "shape": [-1]}]}

    def load_model(self, name, config=None, files=None):
        self.loaded = (name, config, files)

    def infer_stream(self, request):
        def gen():
            try:
                for item in self.stream_items:
                    if isinstance(item, Exception):
                        raise item
                    yield item
            finally:
                self.closed.set()

        return gen()

    def submit(self, request, callback):  # the non-streaming generate path waits on callbacks
        items = [i for i in self.stream_items if not isinstance(i, Exception)]
        for n, item in enumerate(items):
            callback(item, n == len(items) - 1)
        if not items:
            callback(None, True)
        self.closed.set()


def _stub_response(value):
    return InferenceResponse("m", "1", "", [Tensor("Y", "INT32", [1], np.array([value], np.int32))])


@pytest.mark.parametrize("error, status", [
    (InvalidArgumentError("bad"), 400), (NotFoundError("bad"), 404), (UnavailableError("bad"), 503),
    (UnsupportedError("bad"), 501), (InternalError("bad"), 500), (AlreadyExistsError("bad"), 400),
    (CancelledError("bad"), 400),
])  # fmt: skip
def test_error_codes_to_status(error, status):
    stub = Stub()
    stub.error = error
    assert _error(falcon.testing.TestClient(create_app(stub)).simulate_get("/v2/models/m"), status) == "bad"


def test_unexpected_exception_is_500_json():
    stub = Stub()
    stub.error = KeyError("boom")
    message = _error(falcon.testing.TestClient(create_app(stub)).simulate_get("/v2/models/m"), 500)
    assert "KeyError" in message and "boom" in message


def test_load_parameters_reach_the_host():
    stub = Stub()
    app = falcon.testing.TestClient(create_app(stub))
    content = b"\x00model bytes\xff"
    params = {"config": '{"backend": "python"}', "file:1/model.py": base64.b64encode(content).decode()}
    assert app.simulate_post("/v2/repository/models/m/load", json={"parameters": params}).status_code == 200
    assert stub.loaded == ("m", '{"backend": "python"}', {"1/model.py": content})
    assert app.simulate_post("/v2/repository/models/m/load", body="").status_code == 200
    assert stub.loaded == ("m", None, None)
    assert "not valid base64" in _error(app.simulate_post(
        "/v2/repository/models/m/load", json={"parameters": {"file:1/x": "!!"}}), 400)
    # Triton's texts (its front end's and TritonJson's, checked against Triton 2.51)
    assert _error(app.simulate_post("/v2/repository/models/m/load", json={"parameters": {"other": "x"}}),
                  400) == "unexpected error on creating Triton parameter"
    assert _error(app.simulate_post("/v2/repository/models/m/load", json={"parameters": {"config": {"a": 1}}}),
                  400) == "attempt to access JSON non-string as string"
    assert _error(app.simulate_post("/v2/repository/models/m/load", json={"parameters": 3}),
                  400) == "attempt to get members for non-object"


def test_stream_error_mid_stream_is_an_event():
    stub = Stub()
    stub.stream_items = [_stub_response(1), InferenceResponse(error=InvalidArgumentError("model said no")),
                         _stub_response(2), UnavailableError("gone")]  # fmt: skip
    result = falcon.testing.TestClient(create_app(stub)).simulate_post("/v2/models/m/generate_stream", json={"X": 1})
    assert result.status_code == 200
    assert _events(result) == [{"model_name": "m", "model_version": "1", "Y": 1}, {"error": "model said no"},
                               {"model_name": "m", "model_version": "1", "Y": 2}, {"error": "gone"}]  # fmt: skip
    assert stub.closed.is_set()


def test_generate_error_response_is_raised():
    stub = Stub()
    stub.stream_items = [InferenceResponse(error=UnavailableError("busy"))]
    result = falcon.testing.TestClient(create_app(stub)).simulate_post("/v2/models/m/generate", json={"X": 1})
    assert _error(result, 503) == "busy"


def test_client_leaving_a_stream_closes_the_host_stream():
    stub = Stub()
    stub.stream_items = [_stub_response(i) for i in range(100)]
    app = create_app(stub)
    env = falcon.testing.create_environ("/v2/models/m/generate_stream", method="POST", body=json.dumps({"X": 1}))
    body = app(env, lambda status, headers, exc_info=None: None)
    first = next(iter(body))
    assert first.startswith(b"data: ")
    assert not stub.closed.is_set()
    body.close()  # what a WSGI server does when the client goes away
    assert stub.closed.is_set()


# --- the real tritonclient over a socket, through host.http.server ------------------------------------------


@pytest.fixture(scope="module")
def live_url(host):
    server = serve(create_app(host), "127.0.0.1", 0)
    yield f"127.0.0.1:{server.port}"
    server.shutdown(timeout=5)


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_tritonclient_over_the_wire(live_url, compression):
    triton = httpclient.InferenceServerClient(live_url, network_timeout=30.0)
    try:
        assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("simple")
        assert triton.get_model_metadata("simple")["name"] == "simple"
        assert triton.get_model_config("simple")["max_batch_size"] == 8
        for binary in (True, False):
            a = np.arange(32, dtype=np.int32).reshape(2, 16)
            inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT32"), httpclient.InferInput("INPUT1", [2, 16], "INT32")]
            inputs[0].set_data_from_numpy(a, binary_data=binary)
            inputs[1].set_data_from_numpy(a, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            result = triton.infer("simple", inputs, outputs=outputs, request_id="w",
                                  request_compression_algorithm=compression,
                                  response_compression_algorithm=compression)  # fmt: skip
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
            assert result.get_response()["id"] == "w"
        assert "simple" in {e["name"] for e in triton.get_model_repository_index()}
        assert triton.get_inference_statistics("simple")["model_stats"][0]["name"] == "simple"
        with pytest.raises(InferenceServerException) as info:
            triton.infer("nope", inputs)
        assert info.value.status() == "404" and "unknown model" in info.value.message()
    finally:
        triton.close()


# --- host.http.server itself ----------------------------------------------------------------------------


def _echo_app(environ, start_response):
    """Echoes what the server made of the request; `/stream` answers in three pieces of unknown length."""
    if environ["PATH_INFO"] == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"one,", b"", b"two,", b"three"])
    data = environ["wsgi.input"].read() if environ["PATH_INFO"] != "/noread" else b""
    body = json.dumps({"method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
                       "query": environ["QUERY_STRING"], "length": len(data),
                       "sha": hashlib.sha1(data).hexdigest()}).encode()  # fmt: skip
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


@pytest.fixture
def echo():
    server = serve(_echo_app, "127.0.0.1", 0, keepalive_timeout=5)
    yield server
    server.shutdown(timeout=5)


def _connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_response(sock, buffered=b""):
    """(status line, headers dict, body, rest) of one response; handles Content-Length and chunked."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, data = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}

    def need(n):
        nonlocal data
        while len(data) < n:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk

    if "content-length" in headers:
        n = int(headers["content-length"])
        need(n)
        return lines[0], headers, data[:n], data[n:]
    assert headers.get("transfer-encoding") == "chunked", headers
    body = b""
    while True:
        while b"\r\n" not in data:
            need(len(data) + 1)
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line, 16)
        need(size + 2)
        body, data = body + data[:size], data[size + 2:]
        if size == 0:
            return lines[0], headers, body, data


def test_server_keep_alive_and_pipelining(echo):
    connection = http.client.HTTPConnection("127.0.0.1", echo.port, timeout=10)
    connection.request("POST", "/a?x=1", body=b"hello")
    first = json.loads(connection.getresponse().read())
    sock = connection.sock
    connection.request("GET", "/b")
    second = json.loads(connection.getresponse().read())
    assert connection.sock is sock  # the same connection served both
    assert first == {"method": "POST", "path": "/a", "query": "x=1", "length": 5,
                     "sha": hashlib.sha1(b"hello").hexdigest()}
    assert second["method"] == "GET" and second["length"] == 0
    connection.close()

    sock = _connect(echo)
    sock.sendall(b"POST /p1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                 b"GET /p2 HTTP/1.1\r\nHost: x\r\n\r\n")
    status1, _, body1, rest = _read_response(sock)
    status2, _, body2, _ = _read_response(sock, rest)
    assert status1 == status2 == "HTTP/1.1 200 OK"
    assert (json.loads(body1)["path"], json.loads(body1)["length"], json.loads(body2)["path"]) == ("/p1", 3, "/p2")
    sock.close()


def test_server_chunked_request_body(echo):
    payload = bytes(range(256)) * 1000
    sock = _connect(echo)
    pieces = [payload[i:i + 70000] for i in range(0, len(payload), 70000)]
    request = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    request += b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nTrailer: x\r\n\r\n"
    sock.sendall(request + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    _, _, body, rest = _read_response(sock)
    assert json.loads(body)["length"] == len(payload)
    assert json.loads(body)["sha"] == hashlib.sha1(payload).hexdigest()
    assert json.loads(_read_response(sock, rest)[2])["path"] == "/after"
    sock.close()


def test_server_expect_100_continue(echo):
    sock = _connect(echo)
    sock.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(b"data")
    status, _, body, _ = _read_response(sock)
    assert status == "HTTP/1.1 200 OK" and json.loads(body)["length"] == 4
    # the app does not read the body: the answer comes without 100, and the connection closes
    sock.sendall(b"POST /noread HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    status, headers, _, _ = _read_response(sock)
    assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
    assert sock.recv(10) == b""
    sock.close()


def test_server_streamed_response_head_and_http10(echo):
    sock = _connect(echo)
    sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\nHEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body, rest = _read_response(sock)
    assert headers["transfer-encoding"] == "chunked" and body == b"one,two,three"
    data = rest
    while b"\r\n\r\n" not in data:
        data += sock.recv(1000)
    head, after = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length" not in head and after == b""
    sock.close()

    sock = _connect(echo)
    sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
    status, headers, body, _ = _read_response(sock)
    assert headers["connection"] == "close" and json.loads(body)["path"] == "/old"
    assert sock.recv(10) == b""
    sock.close()

    sock = _connect(echo)  # a stream to an HTTP/1.0 client: no chunks, the end is the connection's end
    sock.sendall(b"GET /stream HTTP/1.0\r\n\r\n")
    data = b""
    while chunk := sock.recv(1000):
        data += chunk
    assert data.endswith(b"\r\n\r\none,two,three")
    sock.close()


def test_server_connection_close_and_bad_requests(echo):
    sock = _connect(echo)
    sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _read_response(sock)[1]["connection"] == "close"
    assert sock.recv(10) == b""
    sock.close()
    for bad in (b"NOT A REQUEST\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
                b"POST / HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):  # fmt: skip
        sock = _connect(echo)
        sock.sendall(bad)
        status, headers, body, _ = _read_response(sock)
        assert status.startswith("HTTP/1.1 400") and "error" in json.loads(body), (bad, body)
        assert sock.recv(10) == b""
        sock.close()


def test_server_shutdown_closes_idle_connections():
    server = serve(_echo_app, "127.0.0.1", 0)
    sock = _connect(server)
    sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    _read_response(sock)
    server.shutdown(timeout=5)
    assert sock.recv(10) == b""  # the idle keep-alive connection was closed
    sock.close()
    with pytest.raises(OSError):
        _connect(server).sendall(b"GET / HTTP/1.1\r\n\r\n")


def test_server_with_the_app(live_url):
    host_, port = live_url.split(":")
    connection = http.client.HTTPConnection(host_, int(port), timeout=30)
    connection.request("GET", "/v2/models/na%C3%AFve")  # the path is percent-decoded, as UTF-8
    response = connection.getresponse()
    assert response.status == 404 and "'naïve'" in json.loads(response.read())["error"]
    connection.request("POST", "/v2/models/repeat_int32/generate_stream",
                       body=json.dumps({"IN": [1, 2, 3], "DELAY": [0, 30, 0], "WAIT": [0]}))
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
    events = [json.loads(line[6:]) for line in response.read().decode().split("\n\n") if line]
    assert [e["OUT"] for e in events] == [1, 2, 3]
    big = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)  # 4 MiB, chunked upload
    tensor = httpclient.InferInput("INPUT0", [big.size], "FP32")
    tensor.set_data_from_numpy(big)
    body, header_length = Client.generate_request_body([tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    connection.request("POST", "/v2/models/identity_fp32/infer", body=iter([body[:1000], body[1000:]]),
                       headers={IHCL: str(header_length)}, encode_chunked=True)  # fmt: skip
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, data[:200]
    result = Client.parse_response_body(data, header_length=int(response.getheader(IHCL)))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), big)
    connection.close()


def test_server_http10_keep_alive(echo):
    sock = _connect(echo)
    sock.sendall(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n")
    _, headers, body, rest = _read_response(sock)
    assert headers["connection"] == "keep-alive" and json.loads(body)["path"] == "/a"
    _, headers, body, _ = _read_response(sock, rest)
    assert headers["connection"] == "close" and json.loads(body)["path"] == "/b"
    sock.close()


def test_server_bad_chunked_body_read_by_the_app_is_400(live_url):
    host_, port = live_url.split(":")
    sock = socket.create_connection((host_, int(port)), timeout=10)
    sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"4\r\n{\"in\r\nnot-hex\r\n")
    status, _, body, _ = _read_response(sock)
    assert status.startswith("HTTP/1.1 400") and "chunk" in json.loads(body)["error"]
    assert sock.recv(10) == b""
    sock.close()
