"""--http-header-forward-pattern and --grpc-header-forward-pattern against a real server.

The `echo` model (tests/obs_models) answers with its request parameters as JSON, so the tests see
exactly what reached the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, serve

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "obs_models"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               # upper case: Triton matches without regard to case
               "--http-header-forward-pattern", "^X-FWD|Priority|MY_HEADER|sequence_",
               "--grpc-header-forward-pattern", "FWD|triton") as process:
        yield process


def _params(module, client, headers: dict[str, str], parameters: dict | None = None) -> dict:
    tensor = module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    result = client.infer("echo", [tensor], headers=headers, parameters=parameters)
    return json.loads(result.as_numpy("PARAMS")[0])


def test_http_matching_headers_become_parameters(server):
    client = httpclient.InferenceServerClient(server.url)
    params = _params(httpclient, client, {"X-Fwd-User": "alice", "X-Other": "no", "x-fwd-n": "7"},
                     {"mine": 1})
    # header names as HTTP leaves them: case-insensitive, given in lower case; values are strings
    assert params == {"mine": 1, "x-fwd-user": "alice", "x-fwd-n": "7"}


def test_http_header_names_with_underscores_are_forwarded_and_checked(server):
    """WSGI drops header names with underscores; Triton forwards them (its L0_parameters test)."""
    client = httpclient.InferenceServerClient(server.url)
    params = _params(httpclient, client, {"my_header_1": "v1", "my_header_3": 'a "quoted" \\ '})
    assert params == {"my_header_1": "v1", "my_header_3": 'a "quoted" \\ '}
    with pytest.raises(InferenceServerException) as info:
        _params(httpclient, client, {"sequence_id": "dummy-value"})
    assert info.value.status() == "400"
    assert info.value.message() == \
        "Header 'sequence_id' is reserved for Triton usage and cannot be forwarded."


def test_grpc_matching_metadata_become_parameters(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert _params(grpcclient, client, {"x-fwd-user": "bob", "x-other": "no"}) == {
        "x-fwd-user": "bob"}


def test_streaming_requests_forward_too(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)),
                        headers={"fwd-stream": "yes"})
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    client.async_stream_infer("echo", [tensor])
    client.stop_stream()
    ((result, error),) = results
    assert error is None and json.loads(result.as_numpy("PARAMS")[0]) == {"fwd-stream": "yes"}


def test_reserved_names_are_refused(server):
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        _params(httpclient, http, {"priority": "1"})
    assert info.value.status() == "400"
    assert info.value.message() == \
        "Header 'priority' is reserved for Triton usage and cannot be forwarded."
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        _params(grpcclient, grpc_client, {"triton_fwd": "1"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == \
        "Header 'triton_fwd' is reserved for Triton usage and cannot be forwarded."
    # the server goes on serving
    assert _params(httpclient, http, {}) == {}


def test_no_pattern_no_forwarding(tmp_path):
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo") as process:
        client = httpclient.InferenceServerClient(process.url)
        assert _params(httpclient, client, {"X-Fwd-User": "alice", "priority": "1"}) == {}


def test_patterns_ignore_case_unless_told_not_to():
    from host.headers import compile_pattern

    assert compile_pattern("MY_HEADER.*").search("my_header_1")
    assert compile_pattern("(?-i)MY_HEADER.*").search("MY_HEADER_1")
    assert not compile_pattern("(?-i)MY_HEADER.*").search("my_header_1")


def test_a_case_sensitive_pattern_is_accepted_at_start(tmp_path):
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--grpc-header-forward-pattern", "(?-i)^x-fwd") as process:
        client = grpcclient.InferenceServerClient(process.grpc_url)
        assert _params(grpcclient, client, {"x-fwd-a": "1"}) == {"x-fwd-a": "1"}
