"""End to end over HTTP: the real `tritonclient.http` (and plain `http.client` where tritonclient has no
API) against a real server process serving the example `model_repository/`.

Every test also passes against real NVIDIA Triton on the same repository (MODELHOST_TEST_URL), except
those marked `modelhost_only`; where Triton answers differently the test says so.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve, wait_until

pytestmark = pytest.mark.timeout(60)

MODELS = ["batched_add", "identity_fp32", "repeat_int32", "simple", "simple_identity", "simple_string"]
DECOUPLED_MESSAGE = "doesn't support models with decoupled transaction policy"


# --- helpers -----------------------------------------------------------------------------------


def _request(server, method, path, body=None, headers=None, timeout=30.0):
    """One raw HTTP request; returns (status, headers, body bytes)."""
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _error_of(status, body):
    """The message of a `{"error": "..."}` body, asserting that shape and a non-2xx status."""
    assert status >= 400, (status, body)
    payload = json.loads(body)
    assert isinstance(payload, dict) and isinstance(payload.get("error"), str), payload
    assert payload["error"], payload
    return payload["error"]


def _simple_inputs(a, b, binary=True):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
              httpclient.InferInput("INPUT1", list(b.shape), "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def _simple_json_body(a, b):
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": list(a.shape), "datatype": "INT32", "data": a.flatten().tolist()},
        {"name": "INPUT1", "shape": list(b.shape), "datatype": "INT32", "data": b.flatten().tolist()},
    ]}).encode()  # fmt: skip


def assert_still_serves(client):
    """After an error: a good request on `simple` still succeeds."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _infer_error(client, *args, **kwargs):
    with pytest.raises(InferenceServerException) as info:
        client.infer(*args, **kwargs)
    return info.value


def _read_sse(response):
    """`data: ...` events of a server-sent-events response, in order, until the server ends it."""
    events = []
    for raw in iter(response.readline, b""):
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            events.append(json.loads(line[len("data:"):].strip()))
    return events


# --- health and metadata -----------------------------------------------------------------------


def test_live_and_ready(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    for model in MODELS:
        assert client.is_model_ready(model), model
        assert client.is_model_ready(model, "1"), model
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("simple", "7")


def test_server_metadata(client):
    metadata = client.get_server_metadata()
    # The name differs between servers ("triton" / "modelhost"): not asserted.
    assert isinstance(metadata["name"], str) and metadata["name"]
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert isinstance(metadata["extensions"], list)
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata(client):
    metadata = client.get_model_metadata("simple")
    assert metadata["name"] == "simple"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "python"
    tensor = {"datatype": "INT32", "shape": [-1, 16]}
    assert metadata["inputs"] == [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}]
    assert metadata["outputs"] == [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}]
    assert client.get_model_metadata("simple", "1") == metadata

    identity = client.get_model_metadata("identity_fp32")
    assert identity["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]
    strings = client.get_model_metadata("simple_string")
    assert strings["inputs"][0] == {"name": "INPUT0", "datatype": "BYTES", "shape": [-1, 16]}


def test_model_config(client):
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]),
        ("OUTPUT1", "TYPE_INT32", [16]),
    ]

    batched = client.get_model_config("batched_add")
    assert batched["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert batched["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    repeat = client.get_model_config("repeat_int32")
    assert repeat["max_batch_size"] == 0
    assert repeat["model_transaction_policy"]["decoupled"] is True
    assert client.get_model_config("identity_fp32")["input"][0]["dims"] == [-1]


def test_repository_index(client):
    index = client.get_model_repository_index()
    by_name = {entry["name"]: entry for entry in index}
    for model in MODELS:
        assert by_name[model]["state"] == "READY", by_name.get(model)
        assert by_name[model]["version"] == "1"


# --- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary_in", "json_in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary_out", "json_out"])
def test_simple_add_sub(client, binary_in, binary_out):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), -3, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_out)]  # fmt: skip
    result = client.infer("simple", _simple_inputs(a, b, binary_in), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    response = result.get_response()
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"
    assert {o["name"]: o["shape"] for o in response["outputs"]} == {"OUTPUT0": [1, 16], "OUTPUT1": [1, 16]}


def test_simple_batch_of_rows(client):
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, size=(5, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(5, 16), dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_simple_plain_json_request(server):
    """No tritonclient: a hand-written KServe V2 JSON request and JSON response."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.arange(16, dtype=np.int32).reshape(1, 16) * 2
    status, headers, body = _request(
        server, "POST", "/v2/models/simple/infer", _simple_json_body(a, b), {"Content-Type": "application/json"}
    )
    assert status == 200, body
    assert headers["content-type"].startswith("application/json")
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"]["datatype"] == "INT32"
    assert outputs["OUTPUT0"]["shape"] == [1, 16]
    assert outputs["OUTPUT0"]["data"] == (a + b).flatten().tolist()
    assert outputs["OUTPUT1"]["data"] == (a - b).flatten().tolist()


def test_requested_output_subset(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, b), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_string(client, binary):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 1, dtype=np.int32)
    inputs = []
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        strings = np.array([str(x).encode() for x in values.flat], dtype=np.object_).reshape(values.shape)
        tensor = httpclient.InferInput(name, list(strings.shape), "BYTES")
        tensor.set_data_from_numpy(strings, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert out0.shape == (1, 16) and out1.shape == (1, 16)
    assert [int(x) for x in out0.flat] == (a + b).flatten().tolist()
    assert [int(x) for x in out1.flat] == (a - b).flatten().tolist()


def test_simple_identity_raw_bytes(client):
    values = [b"\x00", b"a\x00b", b"trailing\x00\x00", b"", bytes(range(256)), "ünïcode".encode(), b"\xff\xfe"]
    data = np.array(values, dtype=np.object_).reshape(1, len(values))
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    result = client.infer("simple_identity", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, len(values))
    assert list(out.flat) == values


def test_simple_identity_batch_json_output(client):
    data = np.array([[b"hello", b"world"], [b"x", b"\x00"]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [2, 2], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer("simple_identity", [tensor])  # output as JSON: valid UTF-8 only
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_model_error_response(client):
    """execute() answers one request with an InferenceResponse(error=TritonError(...)): the client gets
    the model's message; a TritonError's default code is INTERNAL, so HTTP 500 (as Triton)."""
    strings = np.array([[b"x"] + [b"1"] * 15], dtype=np.object_)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(strings)
        inputs.append(tensor)
    error = _infer_error(client, "simple_string", inputs)
    assert "inputs must hold decimal integers" in error.message()
    assert error.status() == "500"
    assert_still_serves(client)


def test_identity_fp32_large_tensor(client):
    data = np.random.default_rng(1).standard_normal(4 * 1024 * 1024, dtype=np.float32)  # 16 MiB
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity_fp32", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    out = result.as_numpy("OUTPUT0")
    assert out.dtype == np.float32 and out.shape == data.shape
    np.testing.assert_array_equal(out, data)


def test_identity_fp32_json_and_empty(client):
    for values in ([1.5, -2.25, 3.0], []):
        data = np.array(values, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=False)
        out = client.infer(
            "identity_fp32", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        ).as_numpy("OUTPUT0")
        assert out.shape == data.shape
        np.testing.assert_array_equal(out, data)


def test_async_infer_from_several_threads(server):
    """4 threads, each with its own client (a tritonclient object is single-threaded), each keeping
    4 async_infer requests in flight at once."""
    failures = []

    def work(offset):
        triton = httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=30.0)
        try:
            pending = []
            for i in range(4):
                a = np.full((1, 16), offset * 100 + i, dtype=np.int32)
                b = np.arange(16, dtype=np.int32).reshape(1, 16)
                pending.append((a, b, triton.async_infer("simple", _simple_inputs(a, b))))
            for a, b, request in pending:
                result = request.get_result(timeout=30)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            triton.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(45)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures


def test_dynamic_batching_combines_clients(server):
    """8 clients send at once; at least once, one execute call received rows from several of them."""
    clients = 8
    largest = 0
    for _round in range(10):
        barrier = threading.Barrier(clients)
        batches, failures = [], []

        def send(index):
            # A tritonclient object belongs to the thread that made it (gevent): one per thread.
            triton = httpclient.InferenceServerClient(server.url, network_timeout=30.0)
            try:
                data = np.full((1, 4), index, dtype=np.float32)
                tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(data)
                assert triton.is_model_ready("batched_add")  # connect before the barrier
                barrier.wait(10)
                result = triton.infer("batched_add", [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)
                batch = result.as_numpy("BATCH")
                assert batch.shape == (1, 1) and batch.dtype == np.int32
                batches.append(int(batch[0, 0]))
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)
            finally:
                triton.close()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        assert not failures, failures
        assert len(batches) == clients
        assert all(1 <= size <= 8 for size in batches), batches
        largest = max(largest, *batches)
        if largest > 1:
            break
    assert largest > 1, "no execute call ever received more than one request"


# --- decoupled model ---------------------------------------------------------------------------


def test_repeat_generate_stream(server):
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"IN": [4, -5, 6], "DELAY": [20, 10, 0], "WAIT": [0]})
        connection.request("POST", "/v2/models/repeat_int32/generate_stream", body=body,
                           headers={"Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/event-stream")
        events = _read_sse(response)
    finally:
        connection.close()
    # One event per response that carries outputs; the final, flag-only response adds no event.
    assert [(e["IDX"], e["OUT"]) for e in events] == [(0, 4), (1, -5), (2, 6)]
    for event in events:
        assert event["model_name"] == "repeat_int32"
        assert event["model_version"] == "1"


def test_repeat_generate_stream_is_incremental(server):
    """Each response is written when the model sends it, not buffered until the stream ends."""
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"IN": [1, 2], "DELAY": [0, 1500], "WAIT": [0]})
        started = time.monotonic()
        connection.request("POST", "/v2/models/repeat_int32/generate_stream", body=body)
        response = connection.getresponse()
        assert response.status == 200
        arrivals = []
        for raw in iter(response.readline, b""):
            if raw.startswith(b"data:"):
                arrivals.append((time.monotonic() - started, json.loads(raw[5:])["OUT"]))
    finally:
        connection.close()
    assert [out for _, out in arrivals] == [1, 2]
    assert arrivals[0][0] < 1.0, arrivals  # the first came before the model slept 1.5 s
    assert arrivals[1][0] >= 1.4, arrivals


def test_repeat_generate_stream_no_elements(server):
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"IN": [], "DELAY": [], "WAIT": [0]})
        connection.request("POST", "/v2/models/repeat_int32/generate_stream", body=body)
        response = connection.getresponse()
        assert response.status == 200
        assert _read_sse(response) == []
    finally:
        connection.close()


def test_repeat_generate_stream_model_error(server, client):
    """The model sends an error response: it is streamed as an `{"error": ...}` event, and the first
    response's error sets the status. (Triton 2.51 answers 400 here although a default-code TritonError
    answers 500 on a unary infer; either is accepted.)"""
    status, headers, body = _request(
        server, "POST", "/v2/models/repeat_int32/generate_stream",
        json.dumps({"IN": [1, 2], "DELAY": [0], "WAIT": [0]}),
    )  # fmt: skip
    assert status in (400, 500), (status, body)
    assert headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]
    assert len(events) == 1 and "same shape" in events[0]["error"], body
    assert_still_serves(client)


def test_repeat_unary_infer_is_refused(client):
    inputs = [httpclient.InferInput("IN", [2], "INT32"), httpclient.InferInput("DELAY", [2], "UINT32"),
              httpclient.InferInput("WAIT", [1], "UINT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([0, 0], dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([0], dtype=np.uint32))
    error = _infer_error(client, "repeat_int32", inputs)
    assert DECOUPLED_MESSAGE in error.message()
    assert error.status() == "501"  # Triton: UNSUPPORTED -> 501 Not Implemented
    assert_still_serves(client)


# --- errors ------------------------------------------------------------------------------------


def test_unknown_model(client):
    a = np.zeros((1, 16), dtype=np.int32)
    error = _infer_error(client, "no_such_model", _simple_inputs(a, a))
    assert "unknown model" in error.message() and "no_such_model" in error.message()
    assert error.status() == "404"
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("no_such_model")
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_config("no_such_model")
    assert_still_serves(client)


def test_unknown_version(client):
    a = np.zeros((1, 16), dtype=np.int32)
    error = _infer_error(client, "simple", _simple_inputs(a, a), model_version="7")
    assert "unknown model" in error.message() and "7" in error.message()
    assert error.status() == "404"
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_metadata("simple", "7")
    assert_still_serves(client)


def test_wrong_datatype(client):
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    error = _infer_error(client, "simple", inputs)
    assert error.status() == "400"
    assert "INPUT0" in error.message() and "INT32" in error.message() and "FP32" in error.message()
    assert_still_serves(client)


@pytest.mark.parametrize("shape", [[1, 8], [2], [1, 2, 8]])
def test_wrong_shape(client, shape):
    a = np.zeros(shape, dtype=np.int32)
    error = _infer_error(client, "simple", _simple_inputs(a, a))
    assert error.status() == "400"
    assert "shape" in error.message() and "INPUT" in error.message()
    assert_still_serves(client)


def test_batch_larger_than_max_batch_size(client):
    a = np.zeros((9, 16), dtype=np.int32)
    error = _infer_error(client, "simple", _simple_inputs(a, a))
    assert error.status() == "400"
    assert_still_serves(client)


def test_missing_input(client):
    tensor = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    error = _infer_error(client, "simple", [tensor])
    assert error.status() == "400" and "INPUT0" in error.message()
    assert_still_serves(client)


def test_unknown_requested_output(client):
    a = np.zeros((1, 16), dtype=np.int32)
    error = _infer_error(client, "simple", _simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert error.status() == "400" and "NOPE" in error.message()
    assert_still_serves(client)


def _binary_simple_request(sizes, declared=64):
    """A binary-data request for `simple` whose two input payloads have the given byte lengths."""
    header = json.dumps({"inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": declared}}
        for name in ("INPUT0", "INPUT1")
    ]}).encode()  # fmt: skip
    body = header + b"".join(bytes(range(n % 256)) + bytes(max(0, n - 256)) for n in sizes)
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return body, headers


@pytest.mark.parametrize(
    "sizes, declared",
    [((64, 60), 64), ((60, 60), 60), ((64, 64, 8), 64)],
    ids=["body_short", "declared_and_body_short", "body_long"],
)
def test_binary_byte_size_mismatch(server, client, sizes, declared):
    body, headers = _binary_simple_request(sizes, declared)
    status, _, answer = _request(server, "POST", "/v2/models/simple/infer", body, headers)
    assert status == 400, answer
    _error_of(status, answer)
    assert_still_serves(client)


def test_binary_request_is_well_formed(server):
    """The raw helper above, with the right sizes, is a valid request (so the mismatch tests test sizes)."""
    body, headers = _binary_simple_request((64, 64))
    status, _, answer = _request(server, "POST", "/v2/models/simple/infer", body, headers)
    assert status == 200, answer


def test_header_length_larger_than_body(server, client):
    body, headers = _binary_simple_request((64, 64))
    headers["Inference-Header-Content-Length"] = str(len(body) + 100)
    status, _, answer = _request(server, "POST", "/v2/models/simple/infer", body, headers)
    assert status == 400, answer
    _error_of(status, answer)
    assert_still_serves(client)


@pytest.mark.parametrize(
    "body",
    [b'{"inputs": [ {', b"hello", b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"'],
    ids=["truncated_object", "not_json", "unterminated"],
)
def test_malformed_json(server, client, external_server, body):
    status, _, answer = _request(server, "POST", "/v2/models/simple/infer", body, {"Content-Type": "application/json"})
    message = _error_of(status, answer)
    assert "JSON" in message or "json" in message, message
    # Triton 2.51 answers 500 ("failed to parse the request JSON buffer"); modelhost: a client error.
    assert status in ((400, 500) if external_server else (400,)), (status, answer)
    assert_still_serves(client)


def test_json_data_count_mismatch(server, client, external_server):
    a = np.zeros((1, 16), dtype=np.int32)
    payload = json.loads(_simple_json_body(a, a))
    payload["inputs"][0]["data"] = payload["inputs"][0]["data"][:15]
    status, _, answer = _request(server, "POST", "/v2/models/simple/infer", json.dumps(payload))
    _error_of(status, answer)
    # Triton 2.51 answers 500 ("Unable to parse 'data': Shape does not match ..."); modelhost: 400.
    assert status in ((400, 500) if external_server else (400,)), (status, answer)
    assert_still_serves(client)


@pytest.mark.modelhost_only
@pytest.mark.timeout(120)
def test_oversized_body(model_repository):
    """--http-max-input-size 1024: a larger request is refused with a 4xx error; smaller ones still work.
    (Triton 2.51 has no such flag; newer Triton answers 400.)"""
    with serve(model_repository, "--http-max-input-size", "1024") as small:
        big = json.dumps({"inputs": [
            {"name": "INPUT0", "shape": [2000], "datatype": "FP32", "data": [1.5] * 2000}
        ]}).encode()  # fmt: skip
        assert len(big) > 1024
        status, _, answer = _request(small, "POST", "/v2/models/identity_fp32/infer", big)
        assert 400 <= status < 500, (status, answer)
        _error_of(status, answer)

        data = np.arange(8, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [8], "FP32")
        tensor.set_data_from_numpy(data)
        triton = httpclient.InferenceServerClient(small.url, network_timeout=30.0)
        try:
            np.testing.assert_array_equal(triton.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)
        finally:
            triton.close()


@pytest.mark.modelhost_only
@pytest.mark.timeout(120)
def test_sigterm_stops_cleanly(model_repository):
    with serve(model_repository) as second:
        assert second.is_ready()
        assert second.stop() == 0, second.log_text()[-4000:]


# --- statistics --------------------------------------------------------------------------------


def _inference_count(client, model):
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(int(entry["inference_count"]) for entry in stats if entry["name"] == model)


def test_statistics_count_inferences(client):
    before = _inference_count(client, "simple")
    for _ in range(3):
        assert_still_serves(client)
    wait_until(lambda: _inference_count(client, "simple") >= before + 3, timeout=10,
               message="inference_count of 'simple' did not grow by 3")  # fmt: skip
    stats = client.get_inference_statistics("simple", "1")["model_stats"]
    assert stats[0]["name"] == "simple" and stats[0]["version"] == "1"
    success = stats[0]["inference_stats"]["success"]
    assert int(success["count"]) >= 3
    assert int(stats[0]["execution_count"]) >= 3


@pytest.mark.parametrize("params, message", [
    ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved for Triton usage"),
    # Triton's HTTP texts: the field, then its JSON reader's complaint
    ({"priority": -1}, "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
                       "unsigned-integer"),
    ({"timeout": 1.5}, "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as "
                       "unsigned-integer"),
    ({"sequence_id": -1}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_id": 2**64}, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ({"sequence_end": 1}, "Unable to parse 'sequence_end': attempt to access JSON non-boolean as boolean"),
])
def test_reserved_request_parameters_are_refused(server, client, params, message):
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
                       "parameters": params})
    status, _, raw = _request(server, "POST", "/v2/models/identity_fp32/infer", body,
                              {"Content-Type": "application/json"})
    assert status == 400 and message in json.loads(raw)["error"]
    # a well-formed request with an ordinary parameter still works
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
                       "parameters": {"temperature": 0.5, "sequence_id": 7}})
    status, _, raw = _request(server, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 200, raw
