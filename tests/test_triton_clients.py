"""What Triton's own example clients and QA tests check, against a real `modelhost serve`.

The server serves `tests/client_models`: python-backend models with the names, configs and
answers of Triton's docs/examples/model_repository, started the way Triton's example programs
expect (`--id triton`, client shared memory allowed, explicit model control with every model
loaded). Each test makes the same calls and checks as one of Triton's programs
(client repo src/python/examples, server repo qa/L0_http/http_test.py); docs/conformance.md says
which. scripts/run_triton_examples.sh runs the programs themselves.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, serve

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "client_models"
NO_PROXY = {"http": "", "https": ""}


@pytest.fixture(scope="module")
def triton_like() -> Iterator[ServerProcess]:
    with serve(MODELS, "--id", "triton", "--allow-client-shm=true", "--model-control-mode", "explicit",
               "--load-model", "*") as process:
        yield process


@pytest.fixture(params=["http", "grpc"])
def protocol_client(request, triton_like):
    if request.param == "http":
        client = httpclient.InferenceServerClient(triton_like.url)
    else:
        client = grpcclient.InferenceServerClient(triton_like.grpc_url)
    yield request.param, client
    client.close()


def _module(protocol: str):
    return httpclient if protocol == "http" else grpcclient


def _send_sequence(client, module, model: str, sequence_id, values: list[int]) -> list[int]:
    """simple_*_sequence_*_infer_client: one request per value, START on the first, END on the last."""
    results = []
    for i, value in enumerate(values):
        data = np.full((1, 1), value, dtype=np.int32)
        infer_input = module.InferInput("INPUT", [1, 1], "INT32")
        infer_input.set_data_from_numpy(data)
        result = client.infer(model, [infer_input], outputs=[module.InferRequestedOutput("OUTPUT")],
                              sequence_id=sequence_id, sequence_start=i == 0,
                              sequence_end=i == len(values) - 1)
        results.append(int(result.as_numpy("OUTPUT")[0][0]))
    return results


VALUES = [11, 7, 5, 3, 2, 0, 1]


def test_server_metadata_names_triton(protocol_client):
    """simple_*_health_metadata: the server's name is "triton" (here through --id)."""
    protocol, client = protocol_client
    metadata = client.get_server_metadata()
    name = metadata["name"] if protocol == "http" else metadata.name
    assert name == "triton"


def test_sequence_examples(protocol_client):
    """simple_*_sequence_sync_infer_client, with and without -d (dynamic sequence models)."""
    protocol, client = protocol_client
    module = _module(protocol)
    assert _send_sequence(client, module, "simple_sequence", 1000, [0] + VALUES) == [1] + VALUES
    assert _send_sequence(client, module, "simple_sequence", "a-uuid-like-id", [20] + [-v for v in VALUES]) \
        == [21] + [-v for v in VALUES]
    # The dynamic models add the correlation id to the sequence's last answer.
    dyna = _send_sequence(client, module, "simple_dyna_sequence", 1001, [0] + VALUES)
    assert dyna == [1] + VALUES[:-1] + [VALUES[-1] + 1001]
    running = _send_sequence(client, module, "simple_string_dyna_sequence", "1002", [20] + [-v for v in VALUES])
    expected, total = [], 0
    for value in [20] + [-v for v in VALUES]:
        total += value
        expected.append(total)
    expected[-1] += 1002
    assert running == expected


def test_model_control_example(protocol_client):
    """simple_*_model_control: Triton's answers to the loads and unloads it makes."""
    protocol, client = protocol_client
    client.load_model("simple")
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    client.load_model("simple", config='{"max_batch_size":"16"}')  # the model completes the rest
    config = client.get_model_config("simple")
    assert (config["max_batch_size"] if protocol == "http" else config.config.max_batch_size) == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    # A file name longer than NAME_MAX: INTERNAL and Triton's poll failure text; still serving.
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    assert caught.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
    assert "failed to poll from model repository" in caught.value.message()
    assert client.is_server_live()
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("wrong_model_name")
    client.load_model("simple")  # as it was
    assert client.is_model_ready("simple")


def test_load_failure_names_the_version(protocol_client):
    """L0_lifecycle: a model that fails to initialize answers "load failed for model '<m>':
    version N is at UNAVAILABLE state: <Code>: ..." with INVALID_ARG."""
    protocol, client = protocol_client
    name = f"broken_{protocol}"
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name, config='{"backend": "python"}',
                          files={"file:1/model.py": b"raise RuntimeError('broken on purpose')\n"})
    message = caught.value.message()
    assert message.startswith(f"load failed for model '{name}': version 1 is at UNAVAILABLE state: ")
    assert "broken on purpose" in message
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert not client.is_model_ready(name)


def _infer_json(server: ServerProcess, model: str, payload) -> requests.Response:
    return requests.post(f"http://{server.url}/v2/models/{model}/infer", data=payload,
                         headers={"Content-Type": "application/json"}, proxies=NO_PROXY, timeout=60)


def _nested(depth: int, value: str):
    for _ in range(depth):
        value = f"[{value}]"
    return json.loads(value)


@pytest.mark.parametrize("depth,ok", [(50, True), (99, True), (100, False), (120, False)])
def test_json_data_nesting_limit(triton_like, depth, ok):
    """L0_http test_json_recursion_depth_limit: Triton refuses an element at depth 100 (the data
    array is depth 0): 99 nested lists around a string pass, 100 do not."""
    payload = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                           "data": _nested(depth, '"hello"')}]}
    response = _infer_json(triton_like, "simple_identity", json.dumps(payload))
    if ok:
        assert response.status_code == 200
    else:
        assert response.status_code == 400
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in response.json()["error"]


def test_deeply_nested_body_is_refused_not_fatal(triton_like):
    """L0_http test_repository_index_deeply_nested_json: 250,000 nested arrays once killed the
    worker (orjson overflowed the C stack); now a 400, and the server serves on."""
    depth = 250_000
    body = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    for path in ("/v2/repository/index", "/v2/models/simple/infer"):
        response = requests.post(f"http://{triton_like.url}{path}", data=body, proxies=NO_PROXY,
                                 headers={"Content-Type": "application/json"}, timeout=60)
        assert response.status_code == 400
    assert requests.get(f"http://{triton_like.url}/v2/health/live", proxies=NO_PROXY).status_code == 200


def test_element_count_overflow_texts(triton_like):
    """L0_http test_buffer_size_overflow: Triton's texts for shapes whose size overflows int64."""
    def answer(shape):
        payload = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "INT32", "data": [1]},
                              {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}]}
        response = _infer_json(triton_like, "simple", json.dumps(payload))
        assert response.status_code == 400
        return response.json()["error"]

    assert "causes total element count to exceed maximum size of 9223372036854775807" in \
        answer([2**4, 2**60 + 2])
    assert "byte size overflow for input 'INPUT0': element count" in answer([2**2, 2**60 + 2])


def test_json_body_over_the_limit_says_json(triton_like):
    """L0_http test_loading_large_invalid_model: "request JSON size of N bytes exceeds ..."."""
    conn = http.client.HTTPConnection("127.0.0.1", triton_like.http_port, timeout=30)
    try:
        conn.putrequest("POST", "/v2/repository/models/invalid_onnx/load")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(3 << 30))  # refused before any of it is read
        conn.endheaders()
        response = conn.getresponse()
        error = json.loads(response.read())["error"]
    finally:
        conn.close()
    assert response.status == 400
    assert error.startswith(f"request JSON size of {3 << 30} bytes exceeds the maximum allowed input size")
