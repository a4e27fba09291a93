"""Front-end behaviour that Triton's QA tests check (server repo qa/L0_http, qa/L0_logging).

Each test reproduces, with small models of its own, one thing a QA test found modelhost doing
differently from Triton (checked against Triton 2.51 or, for checks newer than 2.51, against
the QA test's assertion):
- L0_http/http_test.py: a body framed with both Content-Length and chunked (what `requests`
  sends for a manual `Transfer-Encoding: chunked`), a negative shape dimension (TritonJson's
  text, with a 400 where Triton answers 500), a `ready` value nested 250,000 deep on the repository index;
- L0_http/generate_endpoint_test.py: duplicate keys, TritonJson's type texts, the 'Converting
  keyword' prefix, an empty output whose datatype differs from the configuration;
- L0_http/http_input_size_limit_test.py: the raw-binary and JSON size-limit texts, and a zero
  --http-max-input-size refused at start;
- L0_logging: start-up tables logged as Triton logs them, "Infer failed" at verbose 1, a version
  folder with a leading zero ignored.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from host.testing import ServerProcess, serve

pytestmark = pytest.mark.modelhost_only

NO_PROXY = {"http": "", "https": ""}
LIMIT = 1 << 20  # --http-max-input-size of the module's server

IDENTITY = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.names = [i["name"] for i in json.loads(args["model_config"])["input"]]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
                    pb_utils.Tensor(n.replace("IN", "OUT"), pb_utils.get_input_tensor_by_name(r, n).as_numpy())
                    for n in self.names]) for r in requests]
"""

# Decoupled, as the generate endpoint's mock LLM: TEXT repeats PROMPT; EMPTY=true sends an empty
# float64 tensor (a generator that stops at once) although TEXT is configured as strings.
TALKER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            params = json.loads(r.parameters())
            prompt = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy()
            text = np.array([]) if params.get("EMPTY") else prompt
            r.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]),
                                         flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Sends float64 for an output configured as INT32: Triton's python backend passes it on as is.
LOOSE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.5, 2.5]))]) for r in requests]
"""


def _model(root: Path, name: str, config: str, code: str, version: str = "1") -> None:
    (root / name / version).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (root / name / version / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("qa_frontend")
    _model(root, "ident_fp32", """max_batch_size: 8
input [ { name: "IN0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
""", IDENTITY)
    _model(root, "ident_bytes", """max_batch_size: 0
input [ { name: "IN0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
""", IDENTITY)
    _model(root, "talker", """max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, -1 ] },
        { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1, -1 ] } ]
""", TALKER)
    _model(root, "loose", """max_batch_size: 0
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
""", LOOSE)
    _model(root, "zero_led", """max_batch_size: 0
input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""", IDENTITY, version="01")
    with serve(root, "--log-verbose=1", f"--http-max-input-size={LIMIT}") as process:
        yield process


def _post(server: ServerProcess, path: str, **kwargs) -> requests.Response:
    return requests.post(f"http://{server.url}{path}", proxies=NO_PROXY, timeout=60, **kwargs)


def _error(response: requests.Response) -> str:
    assert response.headers["Content-Type"] == "application/json"
    return response.json()["error"]


def _fp32_request(values: list[float], shape: list[int]) -> dict:
    return {"inputs": [{"name": "IN0", "datatype": "FP32", "shape": shape, "data": values}]}


# --- L0_http/http_test.py -----------------------------------------------------------------------

def test_chunked_body_with_content_length(server):
    """`requests` adds Content-Length to a body the caller chunk-encoded himself: Triton reads
    it as chunked (Transfer-Encoding wins), and so does modelhost."""
    body = json.dumps(_fp32_request([1.0, 2.0], [1, 2])).encode()
    chunked = b"%X\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    response = _post(server, "/v2/models/ident_fp32/infer", data=chunked,
                     headers={"Transfer-Encoding": "chunked"})
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0]


def test_both_framings_close_the_connection(server):
    """After a request framed both ways, nothing more is read from the connection: bytes after
    the chunked body are not taken as a second request."""
    body = json.dumps(_fp32_request([3.0], [1, 1])).encode()
    tail = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/ident_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%X\r\n%s\r\n0\r\n\r\n%s" % (len(body), body, tail))
        answer = b""
        while part := sock.recv(65536):
            answer += part
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == 1


def _chunked_raw_infer(server: ServerProcess, chunks: int) -> bytes:
    head = (b"POST /v2/models/ident_fp32/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        try:
            sock.sendall(head + b"1\r\nA\r\n" * chunks + b"0\r\n\r\n")
        except OSError:  # the server may answer and close before it has read everything
            pass
        answer = b""
        try:
            while part := sock.recv(65536):
                answer += part
        except ConnectionResetError:
            pass
    return answer


def test_chunk_count_limit(server):
    """L0_http/http_request_many_chunks.py: 65,536 non-empty chunks are read (here a raw input
    of 65,536 bytes, 16,384 FP32 values), one more is refused with Triton's text."""
    at_limit = _chunked_raw_infer(server, 1 << 16)
    assert at_limit.startswith(b"HTTP/1.1 200 "), at_limit[:300]
    over = _chunked_raw_infer(server, (1 << 16) + 1)
    assert over.startswith(b"HTTP/1.1 400 ")
    assert (b"Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger "
            b"HTTP chunks.") in over


def test_negative_dimension_text(server):
    """Triton's text; Triton answers 500 (its test pins it), a client's mistake is a 400 here."""
    response = _post(server, "/v2/models/ident_fp32/infer", json=_fp32_request([1.0], [2, -5]))
    assert response.status_code == 400
    assert _error(response) == ("Unable to parse 'shape': attempt to access JSON non-unsigned-integer "
                                "as unsigned-integer")


def test_shape_that_is_not_an_array(server):
    response = _post(server, "/v2/models/ident_fp32/infer", json=_fp32_request([1.0], 1))  # type: ignore[arg-type]
    assert response.status_code == 400
    assert _error(response) == "Unable to parse 'shape': attempt to access JSON non-array as array"


def test_deeply_nested_ready_reaches_the_endpoint(server):
    depth = 250_000
    body = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    response = _post(server, "/v2/repository/index", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert _error(response) == "Invalid value for 'ready': expected a boolean"
    assert requests.get(f"http://{server.url}/v2/health/live", proxies=NO_PROXY).status_code == 200


def test_deep_json_that_is_malformed(server):
    depth = 20_000
    response = _post(server, "/v2/repository/index", data='{"ready":' + "[" * depth + "true" + "]" * (depth - 1))
    assert response.status_code == 400
    assert _error(response).startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize("datatype, model, data, text", [
    ("BYTES", "ident_bytes", [1], "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("FP32", "ident_fp32", ["a"], "Unable to parse 'data': attempt to access JSON non-number as double"),
])  # fmt: skip
def test_json_data_type_texts(server, datatype, model, data, text):
    shape = [1] if model == "ident_bytes" else [1, 1]
    response = _post(server, f"/v2/models/{model}/infer",
                     json={"inputs": [{"name": "IN0", "datatype": datatype, "shape": shape, "data": data}]})
    assert response.status_code == 400 and _error(response) == text


@pytest.mark.parametrize("values, text", [
    ([1.0] * 15, "Failed to parse 'data' field: shape does not match true shape"),
    ([1.0] * 18, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
])  # fmt: skip
def test_data_that_does_not_fill_the_shape(server, values, text):
    """L0_http/test.sh greps the whole answer: `{"error":"<text>"}`."""
    response = _post(server, "/v2/models/ident_fp32/infer", json=_fp32_request(values, [1, 16]))
    assert response.status_code == 400 and response.text == json.dumps({"error": text}, separators=(",", ":"))


def test_output_keeps_the_datatype_the_model_gave(server):
    result = httpclient.InferenceServerClient(server.url).infer("loose", [])
    assert result.get_response()["outputs"][0]["datatype"] == "FP64"
    assert result.as_numpy("OUT").tolist() == [1.5, 2.5]


# --- L0_http/generate_endpoint_test.py ----------------------------------------------------------

def _generate(server: ServerProcess, body: str | dict, stream: bool = False) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return _post(server, "/v2/models/talker/generate" + ("_stream" if stream else ""), data=data)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("body, name", [
    ('{"PROMPT": "hi", "STREAM": false, "PROMPT": "again"}', "PROMPT"),
    ('{"PROMPT": "hi", "STREAM": false, "STREAM": true, "PROMPT": "again"}', "STREAM"),
    ('{"PROMPT": "hi", "parameters": {"STREAM": false}, "STREAM": false}', "STREAM"),
])  # fmt: skip
def test_generate_duplicate_inputs(server, body, name, stream):
    response = _generate(server, body, stream)
    assert response.status_code == 400
    assert _error(response) == f"[request id: <id_unknown>] input '{name}' already exists in request"


def test_generate_duplicate_key_that_is_not_an_input(server):
    response = _generate(server, '{"PROMPT": "hi", "STREAM": false, "x": 1, "x": 2}')
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("body, text", [
    ({"PROMPT": 123, "STREAM": False}, "attempt to access JSON non-string as string"),
    ({"PROMPT": "hi", "STREAM": "false"}, "attempt to access JSON non-boolean as boolean"),
    ({"PROMPT": "hi", "STREAM": False, "parameters": {"nested": {"twice": 1}}},
     "Converting keyword: 'parameters': parameter 'nested' has invalid type."),
    ({"PROMPT": "hi", "parameters": {"STREAM": "no"}},
     "Converting keyword: 'parameters': Unable to parse 'data': attempt to access JSON non-boolean"),
])  # fmt: skip
def test_generate_error_texts(server, body, text):
    response = _generate(server, body)
    assert response.status_code == 400
    assert text in _error(response)


def test_generate_empty_output_of_another_datatype(server):
    response = _generate(server, {"PROMPT": "hello", "STREAM": False, "EMPTY": True})
    assert response.status_code == 200, response.text
    assert response.json()["TEXT"] == []


def test_generate_ignores_the_header_length(server):
    """A generate body is JSON whatever Inference-Header-Content-Length says: too large, it gets
    the JSON text."""
    body = json.dumps({"PROMPT": "x" * LIMIT, "STREAM": False})
    response = _post(server, "/v2/models/talker/generate", data=body,
                     headers={"Inference-Header-Content-Length": str(len(body))})
    assert response.status_code == 400
    assert _error(response) == (f"request JSON size of {len(body)} bytes exceeds the maximum allowed "
                                f"input size of {LIMIT} bytes. Use --http-max-input-size to increase the limit.")


# --- L0_http/http_input_size_limit_test.py ------------------------------------------------------

def test_raw_binary_size_limit_text(server):
    data = np.ones(LIMIT // 4 + 32, np.float32).tobytes()
    response = _post(server, "/v2/models/ident_fp32/infer", data=data,
                     headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 400
    assert _error(response) == (f"Raw input has a byte_size ({len(data)} bytes) that exceeds the maximum "
                                f"allowed value of {LIMIT} bytes. Use --http-max-input-size to increase "
                                "the limit.")
    small = np.arange(8, dtype=np.float32)
    response = _post(server, "/v2/models/ident_fp32/infer", data=small.tobytes(),
                     headers={"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200, response.text


def test_json_size_limit_text(server):
    body = json.dumps(_fp32_request([1.0] * (LIMIT // 4), [1, LIMIT // 4]))
    response = _post(server, "/v2/models/ident_fp32/infer", data=body)
    assert response.status_code == 400
    assert _error(response).startswith(f"request JSON size of {len(body)} bytes exceeds the maximum allowed "
                                       f"input size of {LIMIT} bytes.")


@pytest.mark.parametrize("size", ["0", "-1024"])
def test_zero_input_size_is_refused(tmp_path, size):
    result = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository", str(tmp_path),
                             f"--http-max-input-size={size}"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Error: --http-max-input-size must be greater than 0." in result.stdout + result.stderr


# --- L0_logging ---------------------------------------------------------------------------------

def test_failed_infer_is_logged_at_verbose_1(server):
    name = "\nNOT AN INPUT\n"
    response = _post(server, "/v2/models/ident_fp32/infer",
                     json={"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]})
    assert response.status_code == 400
    lines = [line for line in server.log_text().splitlines() if "Infer failed: " in line]
    assert any('] "[request id: <id_unknown>] Infer failed: ' in line and "\\nNOT AN INPUT\\n" in line
               for line in lines), lines  # escaped: one line, as Triton writes it


def test_startup_tables_as_triton_logs_them(server):
    """An empty first line, then the table (L0_logging log_format_test: a record's first line
    must be a JSON string or empty, what follows a table)."""
    log = server.log_text()
    tables = re.findall(r"\] \n(\+[-+]+\+)\n\| Model +\| Version +\| Status +\| Reason +\|", log)
    assert tables, log[-3000:]


def test_version_folder_with_leading_zero_is_ignored(server):
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    entry = next(m for m in index if m["name"] == "zero_led")
    assert entry["state"] == "UNAVAILABLE"
    assert "at least one version must be available under the version policy of model 'zero_led'" in entry["reason"]
    assert "ignore version directory '01' which contains leading zeros in its directory name" in server.log_text()
