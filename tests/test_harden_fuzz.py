"""Fuzzing the request decoders of both front ends (issue 15, "Done means").

Hypothesis generates malformed infer requests: JSON documents shaped like requests, binary tensor
data with inconsistent sizes, raw bytes, and gRPC ModelInferRequest messages (structured and raw).
Each must be answered with a 4xx (gRPC: a client-error status), never a 5xx / INTERNAL / UNKNOWN,
and the server must still serve a good request afterwards. Bounded: a fixed number of examples
per strategy and no deadline per example, so the run stays short.
"""

from __future__ import annotations

import http.client
import json

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from host.testing import serve
from test_e2e_serve import infer, write_identity

pytestmark = [pytest.mark.timeout(300), pytest.mark.modelhost_only]

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DATATYPES = ["FP32", "INT32", "BYTES", "BOOL", "FP16", "BF16", "UINT64", "nope", ""]
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED,
                 grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE,
                 grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_identity(repo, "a")
    with serve(repo) as s:
        yield s


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
    yield call
    channel.close()


def _ok(status: int) -> bool:
    """A client error, or 501: Triton's deliberate answer for what it does not support (an
    unknown Content-Encoding, a raw binary request), not a failure of the server."""
    return status < 500 or status == 501


def _post(server, body: bytes, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/a/infer", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
shapes = st.lists(st.one_of(st.integers(-3, 5), st.integers(2**30, 2**64), st.just(0)), max_size=70)
tensor = st.fixed_dictionaries({
    "name": st.sampled_from(["INPUT0", "OUTPUT0", "", "x"]),
    "datatype": st.sampled_from(DATATYPES),
    "shape": st.one_of(shapes, json_values),
}, optional={"data": json_values, "parameters": st.dictionaries(
    st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size",
                     "shared_memory_offset", "binary_data", "classification", "x"]),
    json_values, max_size=3)})
documents = st.fixed_dictionaries({"inputs": st.one_of(st.lists(tensor, max_size=3), json_values)},
                                  optional={"outputs": st.one_of(st.lists(tensor, max_size=2), json_values),
                                            "parameters": json_values, "id": json_values})


@FUZZ
@given(doc=documents)
def test_http_json_fuzz(server, doc):
    body = json.dumps(doc).encode()
    assert _ok(_post(server, body, {"Content-Type": "application/json"})), body[:300]


@FUZZ
@given(doc=documents, tail=st.binary(max_size=64), header_length=st.one_of(
    st.none(), st.integers(-5, 400), st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=4)))
def test_http_binary_fuzz(server, doc, tail, header_length):
    header = json.dumps(doc).encode()
    length = len(header) if header_length is None else header_length
    status = _post(server, header + tail, {"Inference-Header-Content-Length": str(length),
                                           "Content-Type": "application/octet-stream"})
    assert _ok(status), (header[:300], tail, header_length)


@FUZZ
@given(body=st.binary(max_size=200), encoding=st.sampled_from([None, "gzip", "deflate", "br"]))
def test_http_raw_bytes_fuzz(server, body, encoding):
    headers = {"Content-Encoding": encoding} if encoding else {}
    assert _ok(_post(server, body, headers))


contents = st.builds(
    lambda ints, fps, strs, bools: pb.InferTensorContents(
        int_contents=ints, fp32_contents=fps, bytes_contents=strs, bool_contents=bools),
    st.lists(st.integers(-2**31, 2**31 - 1), max_size=5), st.lists(st.floats(width=32), max_size=5),
    st.lists(st.binary(max_size=5), max_size=3), st.lists(st.booleans(), max_size=3))
grpc_tensors = st.builds(
    lambda name, datatype, shape, content, use: pb.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=shape, contents=content if use else None),
    st.sampled_from(["INPUT0", "", "x"]), st.sampled_from(DATATYPES),
    st.lists(st.one_of(st.integers(-3, 5), st.integers(2**30, 2**62)), max_size=70),
    contents, st.booleans())
grpc_requests = st.builds(
    lambda model, inputs, raw, outputs: pb.ModelInferRequest(
        model_name=model, inputs=inputs, raw_input_contents=raw,
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=o) for o in outputs]),
    st.sampled_from(["a", "nope", ""]), st.lists(grpc_tensors, max_size=3),
    st.lists(st.binary(max_size=40), max_size=3), st.lists(st.sampled_from(["OUTPUT0", "z"]), max_size=2))


@FUZZ
@given(request=grpc_requests)
def test_grpc_model_infer_fuzz(stub, request):
    try:
        stub(request.SerializeToString(), timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_ERRORS, (exc.code(), exc.details(), request)


@FUZZ
@given(data=st.binary(max_size=200))
def test_grpc_raw_bytes_fuzz(stub, data):
    try:
        stub(data, timeout=30)
    except grpc.RpcError as exc:
        # bytes that are no protobuf at all: Triton's answer (INTERNAL, gRPC C++'s text), kept
        ok = exc.code() in CLIENT_ERRORS or (exc.code() == grpc.StatusCode.INTERNAL
                                             and exc.details() == "Unable to parse request")
        assert ok, (exc.code(), exc.details(), data)


def test_server_still_serves_after_the_fuzzing(server):
    client = httpclient.InferenceServerClient(server.url)
    assert infer(client, "a", [1.0, 2.0]).tolist() == [1.0, 2.0]
    assert "Traceback" not in server.log_text()
    assert server.running()
    x = np.array([5.0], np.float32)
    import tritonclient.grpc as grpcclient

    g = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(x)
    assert g.infer("a", [inp]).as_numpy("OUTPUT0").tolist() == [5.0]
