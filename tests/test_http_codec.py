"""Unit tests of the HTTP front end's pure parts: the infer codec (against tritonclient's own request
builder and response parser), the generate codec and SSE framing, request bodies and compression,
and the one error-code -> HTTP-status table."""

from __future__ import annotations

import gzip
import io
import json
import zlib

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from host.errors import (AlreadyExistsError, CancelledError, Code, HostError, InternalError,
                         InvalidArgumentError, NotFoundError, UnavailableError, UnsupportedError)
from host.http import body as body_mod
from host.http import codec, generate
from host.http.status import error_body, http_status, status_line
from host.inference import InferenceResponse, Tensor

Client = httpclient.InferenceServerClient

# datatype -> a sample array of that type (2 x 3, values that exercise the type's range)
SAMPLES = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [7, -8, 9]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767], [7, -8, 9]], dtype=np.int16),
    "INT32": np.array([[-2**31, 0, 2**31 - 1], [7, -8, 9]], dtype=np.int32),
    "INT64": np.array([[-2**63, 0, 2**63 - 1], [7, -8, 9]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504], [1e-3, 0, 3]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.25, 3.4e38], [1e-30, 0, 3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.25, 1.7e308], [5e-324, 0, 3]], dtype=np.float64),
    "BF16": np.array([[0.5, -1.25, 3.0], [1.0, 0, 256]], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"\x00", b"a\x00b", b"trailing\x00\x00"], [b"", bytes(range(256)), b"\xff\xfe"]],
                      dtype=np.object_),  # fmt: skip
}
JSON_TYPES = [t for t in SAMPLES if t not in ("FP16", "BF16")]
TEXT_BYTES = np.array([["hello", "wörld", ""], ["a\x00b", "x", "\x00"]], dtype=np.object_)


def _input(name, array, datatype, binary):
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _decode(inputs, outputs=None, **kwargs):
    body, header_length = Client.generate_request_body(inputs, outputs=outputs, **kwargs)
    return codec.decode_infer_request(body, header_length, "model", 3) + (body,)


def _roundtrip(response, fmt):
    """Encode a response and read it back with tritonclient's own parser."""
    data, header_length = codec.encode_infer_response(response, fmt)
    return Client.parse_response_body(data, header_length=header_length), data, header_length


def _same(a, b):
    assert a.shape == b.shape
    if a.dtype == np.object_:
        assert a.tolist() == b.tolist()
    else:
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.astype(np.float64) if a.dtype == ml_dtypes.bfloat16 else a,
                                      b.astype(np.float64) if b.dtype == ml_dtypes.bfloat16 else b)


# --- status table --------------------------------------------------------------------------------


@pytest.mark.parametrize("error, status", [
    (InternalError("x"), 500), (NotFoundError("x"), 404), (UnavailableError("x"), 503),
    (UnsupportedError("x"), 501), (InvalidArgumentError("x"), 400), (AlreadyExistsError("x"), 400),
    (CancelledError("x"), 400), (HostError("x"), 400),
])  # fmt: skip
def test_status_table_follows_triton(error, status):
    assert http_status(error.code) == status
    assert status_line(error.code).startswith(f"{status} ")


def test_every_code_has_a_status():
    for code in Code:
        assert http_status(code) in (400, 404, 500, 501, 503)


def test_error_body():
    assert json.loads(error_body('bad "thing"\n')) == {"error": 'bad "thing"\n'}


# --- infer requests: every datatype ---------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_input_every_datatype(datatype):
    sample = SAMPLES[datatype]
    request, fmt, body = _decode([_input("IN", sample, datatype, True)])
    tensor = request.inputs["IN"]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", datatype, [2, 3])
    _same(tensor.data, sample)
    assert tensor.parameters == {}
    if datatype != "BYTES":  # fixed-size data is a view over the request body, not a copy
        assert np.shares_memory(tensor.data, np.frombuffer(body, np.uint8))


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_input_every_datatype(datatype):
    sample = TEXT_BYTES if datatype == "BYTES" else SAMPLES[datatype]
    request, _, _ = _decode([_input("IN", sample, datatype, False)])
    tensor = request.inputs["IN"]
    assert tensor.shape == [2, 3]
    if datatype == "BYTES":
        assert tensor.data.tolist() == [[s.encode() for s in row] for row in TEXT_BYTES.tolist()]
    else:
        _same(tensor.data, sample)


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_output_every_datatype(datatype):
    sample = SAMPLES[datatype]
    response = InferenceResponse("model", "3", "", [Tensor("OUT", datatype, [2, 3], sample)])
    result, data, header_length = _roundtrip(response, codec.OutputFormat(default_binary=True))
    _same(result.as_numpy("OUT"), sample)
    out = result.get_output("OUT")
    assert out["datatype"] == datatype and out["shape"] == [2, 3]
    assert out["parameters"]["binary_data_size"] == len(data) - header_length
    assert "data" not in out


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_output_every_datatype(datatype):
    sample = TEXT_BYTES if datatype == "BYTES" else SAMPLES[datatype]
    array = np.array([[s.encode() for s in r] for r in TEXT_BYTES.tolist()], dtype=np.object_) \
        if datatype == "BYTES" else sample
    response = InferenceResponse("model", "3", "", [Tensor("OUT", datatype, [2, 3], array)])
    result, data, header_length = _roundtrip(response, codec.OutputFormat())
    assert header_length is None
    out = json.loads(data)["outputs"][0]
    assert "parameters" not in out and len(out["data"]) == 6
    got = result.as_numpy("OUT")
    if datatype == "BYTES":
        assert got.tolist() == TEXT_BYTES.tolist()
    elif datatype == "FP32":
        np.testing.assert_array_equal(got.astype(np.float32), sample)
    else:
        _same(got.astype(sample.dtype), sample)
        assert out["data"] == sample.reshape(-1).tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_refused_as_triton(datatype):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": datatype, "shape": [1], "data": [1.0]}]})
    with pytest.raises(InvalidArgumentError, match=f"receiving {datatype} data via JSON is not supported"):
        codec.decode_infer_request(body.encode(), None, "m")
    response = InferenceResponse("m", "1", "", [Tensor("OUT", datatype, [1], SAMPLES[datatype][0, :1])])
    with pytest.raises(InvalidArgumentError, match=f"sending {datatype} data via JSON is not supported"):
        codec.encode_infer_response(response, codec.OutputFormat())


def test_bytes_with_nul_and_non_utf8_binary_roundtrip():
    values = np.array([b"\x00", b"\x00\x00", b"a\x00", b"\xff\xfe\x00", b""], dtype=np.object_)
    request, fmt, _ = _decode([_input("IN", values, "BYTES", True)])
    data = request.inputs["IN"].data
    assert data.dtype == np.object_ and data.tolist() == values.tolist()
    assert all(type(v) is bytes for v in data.tolist())
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "BYTES", [5], data)])
    result, _, _ = _roundtrip(response, codec.OutputFormat(default_binary=True))
    assert result.as_numpy("OUT").tolist() == values.tolist()


def test_bytes_json_output_of_non_utf8_is_written_raw_as_triton_does():
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "BYTES", [2], np.array([b"\xff", b"ok"], dtype=object))])
    data, _ = codec.encode_infer_response(response, codec.OutputFormat())
    assert b'"data":["\xff","ok"]' in data
    request, _ = codec.decode_infer_request(data.replace(b'"outputs"', b'"inputs"'), None, "m")
    assert request.inputs["OUT"].data.tolist() == [b"\xff", b"ok"]


def test_bytes_output_may_hold_str():
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "BYTES", [2], np.array(["é", b"b"], dtype=object))])
    result, _, _ = _roundtrip(response, codec.OutputFormat(default_binary=True))
    assert result.as_numpy("OUT").tolist() == ["é".encode(), b"b"]


def test_mixed_binary_and_json_inputs_in_order():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([b"x", b"\x00y"], dtype=np.object_)
    c = np.array([1.5, 2.5], dtype=np.float64)
    d = np.array([True, False, True])
    request, _, _ = _decode([_input("A", a, "INT32", True), _input("B", b, "BYTES", True),
                             _input("C", c, "FP64", False), _input("D", d, "BOOL", True)])  # fmt: skip
    assert list(request.inputs) == ["A", "B", "C", "D"]
    _same(request.inputs["A"].data, a)
    assert request.inputs["B"].data.tolist() == b.tolist()
    _same(request.inputs["C"].data, c)
    _same(request.inputs["D"].data, d)


def test_zero_element_inputs():
    for binary in (True, False):
        request, _, _ = _decode([_input("IN", np.zeros((0, 4), np.float32), "FP32", binary),
                                 _input("S", np.zeros((0,), np.object_), "BYTES", binary)])  # fmt: skip
        assert request.inputs["IN"].data.shape == (0, 4) and request.inputs["IN"].data.dtype == np.float32
        assert request.inputs["S"].data.shape == (0,)


def test_json_nested_and_flat_data_and_bool_literals():
    doc = {"inputs": [
        {"name": "N", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
        {"name": "F", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "R", "datatype": "FP32", "shape": [3], "data": [[1], [2, 3]]},
        {"name": "B", "datatype": "BOOL", "shape": [2], "data": [True, False]},
        {"name": "S", "datatype": "BYTES", "shape": [1, 2], "data": [["a", "b\u0000"]]},
    ]}  # fmt: skip
    request, _ = codec.decode_infer_request(json.dumps(doc).encode(), None, "m")
    assert request.inputs["N"].data.tolist() == [[1, 2], [3, 4]] == request.inputs["F"].data.tolist()
    assert request.inputs["R"].data.tolist() == [1.0, 2.0, 3.0]
    assert request.inputs["B"].data.dtype == np.bool_ and request.inputs["B"].data.tolist() == [True, False]
    assert request.inputs["S"].data.tolist() == [[b"a", b"b\x00"]]
    assert json.loads(b'{"d": [true, false]}')["d"] == [True, False]


def test_request_fields_id_parameters_and_version():
    tensor = _input("IN", np.zeros(2, np.int32), "INT32", True)
    request, fmt, _ = _decode([tensor], request_id="req-7", sequence_id=42, sequence_start=True,
                              priority=2, timeout=100, parameters={"temp": 0.5, "mode": "x", "n": 3})  # fmt: skip
    assert request.id == "req-7" and request.model_name == "model" and request.model_version == 3
    # passed through as sent: the host interprets the reserved ones (tests/test_parameters.py)
    assert request.parameters == {"sequence_id": 42, "sequence_start": True, "sequence_end": False,
                                  "priority": 2, "timeout": 100, "temp": 0.5, "mode": "x", "n": 3}
    assert fmt.default_binary  # tritonclient asks every output in binary when none is named
    assert request.outputs == []


def test_requested_outputs_and_binary_flags():
    tensor = _input("IN", np.zeros(2, np.int32), "INT32", True)
    outputs = [httpclient.InferRequestedOutput("A", binary_data=True),
               httpclient.InferRequestedOutput("B", binary_data=False)]  # fmt: skip
    request, fmt, _ = _decode([tensor], outputs=outputs)
    assert request.requested_output_names == ["A", "B"]
    assert fmt.is_binary("A") and not fmt.is_binary("B") and not fmt.is_binary("C")
    doc = {"inputs": [], "parameters": {"binary_data_output": True},
           "outputs": [{"name": "A"}, {"name": "B", "parameters": {"binary_data": False, "custom": 1}}]}
    request, fmt = codec.decode_infer_request(json.dumps(doc).encode(), None, "m")
    assert fmt.is_binary("A") and not fmt.is_binary("B")
    assert request.outputs[1].parameters == {"custom": 1}
    assert "binary_data_output" not in request.parameters


def test_response_id_model_version_and_parameters():
    response = InferenceResponse("m", "2", "", [Tensor("OUT", "INT32", [1], np.array([5], np.int32))],
                                 parameters={"p": 1, "q": "s", "r": True, "f": 0.5})
    data, _ = codec.encode_infer_response(response, codec.OutputFormat(), request_id="abc")
    doc = json.loads(data)
    assert doc["id"] == "abc" and doc["model_name"] == "m" and doc["model_version"] == "2"
    assert doc["parameters"] == {"p": 1, "q": "s", "r": True, "f": 0.5}
    assert doc["outputs"] == [{"name": "OUT", "datatype": "INT32", "shape": [1], "data": [5]}]
    no_id, _ = codec.encode_infer_response(InferenceResponse("m", "2"), codec.OutputFormat())
    assert "id" not in json.loads(no_id) and json.loads(no_id)["outputs"] == []


def test_binary_response_layout_and_empty_binary_output():
    a = np.arange(4, dtype=np.int32)
    response = InferenceResponse("m", "1", "", [Tensor("A", "INT32", [4], a),
                                                Tensor("E", "FP32", [0], np.zeros(0, np.float32)),
                                                Tensor("J", "INT32", [4], a)])  # fmt: skip
    fmt = codec.OutputFormat(binary={"A": True, "E": True})
    data, header_length = codec.encode_infer_response(response, fmt)
    header = json.loads(data[:header_length])
    assert [o.get("parameters", {}).get("binary_data_size") for o in header["outputs"]] == [16, 0, None]
    assert data[header_length:] == a.tobytes()
    only_empty = InferenceResponse("m", "1", "", [Tensor("E", "FP32", [0], np.zeros(0, np.float32))])
    assert codec.encode_infer_response(only_empty, fmt)[1] is None  # no binary bytes: plain JSON


def test_output_data_is_cast_to_its_datatype_and_checked_against_shape():
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "INT16", [2], np.array([1, 2], np.int64))])
    result, _, _ = _roundtrip(response, codec.OutputFormat(default_binary=True))
    assert result.as_numpy("OUT").dtype == np.int16
    bad = InferenceResponse("m", "1", "", [Tensor("OUT", "INT32", [3], np.array([1, 2], np.int32))])
    with pytest.raises(InternalError, match="output tensor shape does not match size of output for 'OUT'"):
        codec.encode_infer_response(bad, codec.OutputFormat())


def test_json_output_of_non_contiguous_big_endian_and_unaligned_arrays():
    strided = np.arange(8, dtype=np.int32)[::2]
    big = np.array([1, 2, 3], dtype=">i4")
    unaligned = np.frombuffer(b"\x00" + np.arange(3, dtype=np.int32).tobytes(), np.int32, offset=1)
    response = InferenceResponse("m", "1", "", [Tensor("S", "INT32", [4], strided), Tensor("B", "INT32", [3], big),
                                                Tensor("U", "INT32", [3], unaligned)])  # fmt: skip
    doc = json.loads(codec.encode_infer_response(response, codec.OutputFormat())[0])
    assert [o["data"] for o in doc["outputs"]] == [[0, 2, 4, 6], [1, 2, 3], [0, 1, 2]]


# --- infer requests: malformed ---------------------------------------------------------------------


def _json_request(*inputs, **top):
    return json.dumps({"inputs": list(inputs), **top}).encode()


INT_IN = {"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}
MALFORMED = [
    ("not_json", b"hello", None, InvalidArgumentError, "failed to parse the request JSON buffer"),
    ("truncated", b'{"inputs": [ {', None, InvalidArgumentError, "failed to parse the request JSON buffer"),
    # TritonJson's texts, as Triton 2.51 answers them (checked against the anchor)
    ("not_object", b"[1, 2]", None, InvalidArgumentError,
     "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ("no_inputs", b"{}", None, InvalidArgumentError,
     "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ("inputs_not_array", b'{"inputs": {}}', None, InvalidArgumentError,
     "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ("inputs_null", b'{"inputs": null}', None, InvalidArgumentError,
     "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ("parameters_null", b'{"parameters": null, "inputs": []}', None, InvalidArgumentError,
     "failed to get request params.: attempt to get members for non-object"),
    # an element that is not an object has no member: Triton finds no data in it first
    ("input_not_object", _json_request(3), None, InvalidArgumentError, "But no field is set"),
    ("no_name", _json_request({k: v for k, v in INT_IN.items() if k != "name"}), None, InvalidArgumentError,
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("null_name", _json_request({**INT_IN, "name": None}), None, InvalidArgumentError,
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    ("no_datatype", _json_request({k: v for k, v in INT_IN.items() if k != "datatype"}), None,
     InvalidArgumentError, "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'"),
    ("bad_datatype", _json_request({**INT_IN, "datatype": "INT31"}), None, InvalidArgumentError,
     "invalid datatype for input IN"),
    ("no_shape", _json_request({k: v for k, v in INT_IN.items() if k != "shape"}), None,
     InvalidArgumentError, "Unable to parse 'shape': attempt to access non-existing object member 'shape'"),
    # TritonJson's text (Triton answers with 500: its L0_http test_negative_dimensions; a 400 here)
    ("negative_shape", _json_request({**INT_IN, "shape": [-1, 2]}), None, InvalidArgumentError,
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("float_shape", _json_request({**INT_IN, "shape": [2.0]}), None, InvalidArgumentError, "Unable to parse 'shape'"),
    ("bool_shape", _json_request({**INT_IN, "shape": [True]}), None, InvalidArgumentError, "Unable to parse 'shape'"),
    ("no_data", _json_request({k: v for k, v in INT_IN.items() if k != "data"}), None, InvalidArgumentError,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But no field is set"),
    # Triton's HTTP rule: a size without a region refers to no shared memory
    ("size_without_region", _json_request({k: v for k, v in INT_IN.items() if k != "data"}
                                          | {"parameters": {"shared_memory_byte_size": 8}}), None,
     InvalidArgumentError, "But no field is set"),
    ("data_and_binary", _json_request({**INT_IN, "parameters": {"binary_data_size": 8}}), None,
     InvalidArgumentError, "But set 'data' 'binary_data_size'"),
    ("data_not_list", _json_request({**INT_IN, "data": 5}), None, InvalidArgumentError,
     "Unable to parse 'data': attempt to access JSON non-array as array"),
    ("too_few", _json_request({**INT_IN, "data": [1]}), None, InvalidArgumentError,
     "Failed to parse 'data' field: shape does not match true shape"),
    ("too_many", _json_request({**INT_IN, "data": [[1, 2], [3]]}), None, InvalidArgumentError,
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ("float_for_int", _json_request({**INT_IN, "data": [1.5, 2]}), None, InvalidArgumentError,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("string_for_int", _json_request({**INT_IN, "data": ["1", "2"]}), None, InvalidArgumentError,
     "non-signed-integer as signed-integer"),
    ("bool_for_int", _json_request({**INT_IN, "data": [True, False]}), None, InvalidArgumentError,
     "non-signed-integer as signed-integer"),
    ("null_in_data", _json_request({**INT_IN, "data": [1, None]}), None, InvalidArgumentError,
     "non-signed-integer as signed-integer"),
    ("int_out_of_range", _json_request({**INT_IN, "datatype": "UINT8", "data": [1, 256]}), None,
     InvalidArgumentError, "value out of range for datatype UINT8"),
    ("negative_unsigned", _json_request({**INT_IN, "datatype": "UINT32", "data": [-1, 2]}), None,
     InvalidArgumentError, "value out of range for datatype UINT32"),
    ("int64_beyond_range", _json_request({**INT_IN, "datatype": "INT64", "data": [2**63, 1]}), None,
     InvalidArgumentError, "value out of range for datatype INT64"),
    ("uint64_beyond_range", _json_request({**INT_IN, "datatype": "UINT64", "data": [-1, 2**64 - 1]}), None,
     InvalidArgumentError, "value out of range for datatype UINT64"),
    ("beyond_64_bits", _json_request({**INT_IN, "datatype": "UINT64", "data": [2**64, 1]}), None,
     InvalidArgumentError, "non-unsigned-integer as unsigned-integer"),  # beyond 64 bits: orjson reads a float
    ("big_int_and_float", _json_request({**INT_IN, "datatype": "UINT64", "data": [2**64 - 1, 1.5]}), None,
     InvalidArgumentError, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("int_for_bool", _json_request({**INT_IN, "datatype": "BOOL", "data": [1, 0]}), None, InvalidArgumentError,
     "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ("string_for_float", _json_request({**INT_IN, "datatype": "FP32", "data": ["a", "b"]}), None,
     InvalidArgumentError, "Unable to parse 'data': attempt to access JSON non-number as double"),
    ("number_for_bytes", _json_request({**INT_IN, "datatype": "BYTES", "data": ["a", 2]}), None,
     InvalidArgumentError, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ("duplicate_input", _json_request(INT_IN, INT_IN), None, InvalidArgumentError,
     "[request id: <id_unknown>] input 'IN' already exists in request"),
    ("shared_memory_and_data", _json_request(INT_IN | {"parameters": {"shared_memory_region": "r"}}),
     None, InvalidArgumentError, "But set 'data' 'shared_memory_region'"),
    ("shared_memory_output_binary", _json_request(INT_IN, outputs=[{"name": "O", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4, "binary_data": True}}]), None,
     InvalidArgumentError, "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ("id_not_string", _json_request(INT_IN, id=5), None, InvalidArgumentError,
     "Unable to parse 'id': attempt to access JSON non-string as string"),
    ("parameters_not_object", _json_request(INT_IN, parameters=[1]), None, InvalidArgumentError,
     "failed to get request params.: attempt to get members for non-object"),
    ("binary_data_output_not_bool", _json_request(INT_IN, parameters={"binary_data_output": 1}), None,
     InvalidArgumentError, "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"),
    ("parameter_list", _json_request(INT_IN, parameters={"x": [1]}), None, InvalidArgumentError,
     "parameter 'x' has invalid type"),
    ("outputs_not_array", _json_request(INT_IN, outputs={"name": "A"}), None, InvalidArgumentError,
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ("outputs_null", _json_request(INT_IN, outputs=None), None, InvalidArgumentError,
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ("output_no_name", _json_request(INT_IN, outputs=[{}]), None, InvalidArgumentError,
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("output_not_object", _json_request(INT_IN, outputs=[3]), None, InvalidArgumentError,
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("binary_data_not_bool", _json_request(INT_IN, outputs=[{"name": "A", "parameters": {"binary_data": 1}}]),
     None, InvalidArgumentError, "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"),
]  # fmt: skip


@pytest.mark.parametrize("body, header_length, error, message",
                         [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests(body, header_length, error, message):
    with pytest.raises(error) as info:
        codec.decode_infer_request(body, header_length, "m")
    assert type(info.value) is error
    assert message in info.value.message


def _binary_request(sizes, declared, datatype="INT32", shape=(4,)):
    header = json.dumps({"inputs": [
        {"name": f"IN{i}", "datatype": datatype, "shape": list(shape), "parameters": {"binary_data_size": d}}
        for i, d in enumerate(declared)]}).encode()  # fmt: skip
    return header + b"".join(b"\x01" * n for n in sizes), len(header)


def test_binary_size_mismatch_and_overrun():
    body, hl = _binary_request([16, 12], [16, 12])
    # kept on the request, raised after the input count (Triton's core order), with its tag
    assert codec.decode_infer_request(body, hl, "m")[0].data_errors["IN1"].message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'IN1' for model 'm'. "
        "Expected 16, got 12")
    body, hl = _binary_request([16, 8], [16, 16])
    with pytest.raises(InvalidArgumentError, match="unexpected size for input 'IN1', expecting 8 additional bytes"):
        codec.decode_infer_request(body, hl, "m")
    body, hl = _binary_request([16, 16, 4], [16, 16])
    with pytest.raises(InvalidArgumentError, match="unexpected additional input data for model 'm'"):
        codec.decode_infer_request(body, hl, "m")
    body, hl = _binary_request([16], [16])
    with pytest.raises(InvalidArgumentError, match="must specify valid 'Inference-Header-Content-Length'"):
        codec.decode_infer_request(body[:hl], None, "m")
    body, hl = _binary_request([16], [-16])
    with pytest.raises(InvalidArgumentError, match="Unable to parse 'binary_data_size': attempt to access "
                       "JSON non-unsigned-integer as unsigned-integer"):
        codec.decode_infer_request(body, hl, "m")
    body, hl = _binary_request([16], [16])
    request, _ = codec.decode_infer_request(body, hl, "m")
    assert request.inputs["IN0"].data.tolist() == [0x01010101] * 4


def test_a_header_sent_again_decodes_as_the_first_time_into_objects_of_its_own():
    """A binary request's header is read once (host.request_plan); the same header again gives the same
    request, whose objects are its own, and data that does not fit it the full decoding's errors."""
    codec._PLANS.clear()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [_input("A", x, "FP32", True), _input("B", x[0], "FP32", True),
              httpclient.InferInput("S", [2], "INT32")]
    inputs[2].set_shared_memory("region", 8)
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True),
               httpclient.InferRequestedOutput("OUT2", binary_data=False, class_count=2)]
    first, fmt1, body = _decode(inputs, outputs, request_id="r1", parameters={"p": 1})
    assert not codec._PLANS.plans  # seen once: no plan yet
    first, fmt1, body = _decode(inputs, outputs, request_id="r1", parameters={"p": 1})
    assert len(codec._PLANS.plans) == 1
    # what the host does to a request (host.parameters pops reserved keys, reshapes set shapes)
    first.parameters["p"] = 2
    first.inputs["A"].shape.append(9)
    first.inputs["S"].parameters["shared_memory_region"] = "other"
    first.outputs[1].parameters.clear()
    fmt1.binary["OUT"] = False
    second, fmt2, _ = codec.decode_infer_request(body, len(body) - 48, "model", 3) + (None,)
    assert (second.id, second.model_name, second.model_version, second.parameters) == ("r1", "model", 3, {"p": 1})
    assert [(t.name, t.datatype, t.shape, t.parameters) for t in second.inputs.values()] == [
        ("A", "FP32", [2, 4], {}), ("B", "FP32", [4], {}),
        ("S", "INT32", [2], {"shared_memory_region": "region", "shared_memory_byte_size": 8})]
    _same(second.inputs["A"].data, x)
    _same(second.inputs["B"].data, x[0])
    assert second.inputs["S"].data is None and second.uses_shm
    assert [(o.name, o.parameters) for o in second.outputs] == [("OUT", {}), ("OUT2", {"classification": 2})]
    assert fmt2.binary == {"OUT": True, "OUT2": False}
    # the data no longer fits the header: the full decoding's errors
    with pytest.raises(InvalidArgumentError, match="unexpected additional input data for model 'model'"):
        codec.decode_infer_request(body + b"x", len(body) - 48, "model")
    with pytest.raises(InvalidArgumentError, match="unexpected size for input 'B', expecting 4 additional bytes"):
        codec.decode_infer_request(body[:-4], len(body) - 48, "model")


def test_headers_with_json_or_bytes_data_are_read_every_time():
    """Data in the JSON header, or BYTES, is decoded for each request: two requests never share
    an array, which a model may write to."""
    codec._PLANS.clear()
    x = np.arange(4, dtype=np.int32)
    first, _, body = _decode([_input("J", x, "INT32", False)])
    second, _, _ = _decode([_input("J", x, "INT32", False)])
    first.inputs["J"].data[0] = 99
    assert second.inputs["J"].data.tolist() == [0, 1, 2, 3]
    for _ in range(3):
        _decode([_input("T", SAMPLES["BYTES"], "BYTES", True)])
    # a parameter that is a list: the requests would share it
    listed = httpclient.InferRequestedOutput("OUT")
    listed._parameters["tags"] = ["a"]
    for _ in range(3):
        _decode([_input("B", x, "INT32", True)], [listed])
    assert not codec._PLANS.plans


def test_the_kept_headers_are_bounded(monkeypatch):
    codec._PLANS.clear()
    monkeypatch.setattr(codec._PLANS, "limit", 4)
    for n in range(10):
        _decode([_input(f"IN{n}", np.zeros(2, np.float32), "FP32", True)])
        _decode([_input(f"IN{n}", np.zeros(2, np.float32), "FP32", True)])
        assert 1 <= len(codec._PLANS.plans) <= 4 and len(codec._PLANS.seen) <= 4


def test_binary_bytes_malformed():
    length_only = (5).to_bytes(4, "little") + b"abc"  # element of 5 bytes, 3 present
    body, hl = _binary_request([0], [len(length_only)], "BYTES", (1,))
    body += length_only
    with pytest.raises(InvalidArgumentError, match="input 'IN0': unexpected end of BYTES tensor data"):
        codec.decode_infer_request(body, hl, "m")
    two = (1).to_bytes(4, "little") + b"a" + (0).to_bytes(4, "little")
    body, hl = _binary_request([0], [len(two)], "BYTES", (3,))
    assert codec.decode_infer_request(body + two, hl, "m")[0].data_errors["IN0"].message == (
        "[request id: <id_unknown>] expected 3 string elements for inference input 'IN0' for "
        "model 'm', got 2")
    # Triton's core walk (ValidateBytesInputs): a length prefix cut short ...
    body, hl = _binary_request([0], [2], "BYTES", (1,))
    assert codec.decode_infer_request(body + b"\x01\x00", hl, "m")[0].data_errors["IN0"].message == (
        "[request id: <id_unknown>] incomplete string length indicator for inference input 'IN0' "
        "for model 'm', expecting 4 bytes but only 2 bytes available. Please make sure the string "
        "length indicator is in one buffer.")
    # ... and an element that runs past the end counts as begun: 1 of 3 here
    overrun = (2**31).to_bytes(4, "little") + b"abc"
    body, hl = _binary_request([0], [len(overrun)], "BYTES", (3,))
    assert codec.decode_infer_request(body + overrun, hl, "m")[0].data_errors["IN0"].message == (
        "[request id: <id_unknown>] expected 3 string elements for inference input 'IN0' for "
        "model 'm', got 1")


@pytest.mark.parametrize("value, length, error, message", [
    ("abc", 10, InvalidArgumentError, "Unable to parse Inference-Header-Content-Length, got: abc"),
    ("-1", 10, InvalidArgumentError, "inference header size should be in range (0, 10), got: -1"),
    ("11", 10, InvalidArgumentError, "inference header size should be in range (0, 10), got: 11"),
])  # fmt: skip
def test_header_length_errors(value, length, error, message):
    with pytest.raises(error) as info:
        codec.parse_header_length(value, length)
    assert message in info.value.message


def test_header_length_values():
    assert codec.parse_header_length(None, 10) is None
    assert codec.parse_header_length("10", 10) == 10
    assert codec.parse_header_length(" 4", 10) == 4


# --- bodies and compression ----------------------------------------------------------------------


def test_read_body_limits():
    assert body_mod.read(io.BytesIO(b"abc"), 3, False, 3) == b"abc"
    assert body_mod.read(io.BytesIO(b""), 0, False, 3) == b""
    assert body_mod.read(io.BytesIO(b"abc"), None, False, 3) == b""  # no length, not chunked: no body
    assert body_mod.read(io.BytesIO(b"abc"), None, True, 3) == b"abc"
    with pytest.raises(InvalidArgumentError, match="request body size of 4 bytes exceeds the maximum allowed input "
                                                   "size of 3 bytes. Use --http-max-input-size"):  # fmt: skip
        body_mod.read(io.BytesIO(b"abcd"), 4, False, 3)
    with pytest.raises(InvalidArgumentError, match="maximum allowed input size of 3 bytes"):
        body_mod.read(io.BytesIO(b"abcd"), None, True, 3)
    with pytest.raises(InvalidArgumentError, match="ended after 2 of the 5 bytes"):
        body_mod.read(io.BytesIO(b"ab"), 5, False, 10)


def test_decode_body():
    data = b"x" * 1000
    assert body_mod.decode(gzip.compress(data), "gzip", 1000) == data
    assert body_mod.decode(zlib.compress(data), "deflate", 1000) == data
    assert body_mod.decode(data, "identity", 1000) == data
    assert body_mod.decode(data, None, 1000) == data
    with pytest.raises(UnsupportedError, match="Unsupported compression type"):
        body_mod.decode(data, "br", 1000)
    with pytest.raises(InvalidArgumentError, match="Decompressed data size exceeds the maximum allowed value of 999 "
                                                   "bytes. Use --http-max-input-size"):  # fmt: skip
        body_mod.decode(gzip.compress(data), "gzip", 999)
    with pytest.raises(InvalidArgumentError, match="failed to decompress the gzip request body"):
        body_mod.decode(b"not gzip", "gzip", 1000)
    with pytest.raises(InvalidArgumentError, match="truncated"):
        body_mod.decode(gzip.compress(data)[:-10], "gzip", 1000)


@pytest.mark.parametrize("accept, chosen", [
    (None, None), ("", None), ("identity", None), ("gzip", "gzip"), ("deflate", "deflate"),
    ("gzip, deflate", "gzip"), ("deflate, gzip", "deflate"), ("gzip;q=0.5, deflate;q=0.8", "deflate"),
    ("br", None), ("br, gzip;q=0.1", "gzip"), ("gzip;q=0", None), ("gzip;q=abc, deflate", "deflate"),
    ("GZIP", "gzip"),
])  # fmt: skip
def test_response_encoding(accept, chosen):
    assert body_mod.response_encoding(accept) == chosen


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_response_reads_back_with_tritonclient(encoding):
    a = np.arange(100, dtype=np.float32)
    response = InferenceResponse("m", "1", "", [Tensor("OUT", "FP32", [100], a)])
    data, header_length = codec.encode_infer_response(response, codec.OutputFormat(default_binary=True))
    packed = body_mod.compress(data, encoding)
    result = Client.parse_response_body(packed, header_length=header_length, content_encoding=encoding)
    np.testing.assert_array_equal(result.as_numpy("OUT"), a)


# --- generate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_shape, count, shape", [
    ([1], 1, [1]), ([-1], 3, [3]), ([-1, 1], 1, [1, 1]), ([-1, 16], 16, [1, 16]), ([-1, 16], 32, [2, 16]),
    ([-1, -1], 4, [1, 4]), ([2, -1], 6, [2, 3]), ([], 1, []), ([-1], 0, [0]),
])  # fmt: skip
def test_fit_shape(model_shape, count, shape):
    assert generate.fit_shape("x", model_shape, count) == shape


@pytest.mark.parametrize("model_shape, count", [([16], 3), ([-1, 4], 6), ([], 2), ([0], 1)])
def test_fit_shape_refused(model_shape, count):
    with pytest.raises(InvalidArgumentError, match="The schema can not convert input 'x' to tensor with proper shape"):
        generate.fit_shape("x", model_shape, count)


METADATA = {"name": "m", "inputs": [
    {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]},
    {"name": "max_tokens", "datatype": "INT32", "shape": [1]},
    {"name": "values", "datatype": "FP32", "shape": [-1]},
    {"name": "flag", "datatype": "BOOL", "shape": [-1, 1]},
]}  # fmt: skip


def test_decode_generate_request():
    doc = {"id": "42", "text_input": "hi\u0000", "values": [1, 2.5], "stream": False, "temperature": 0.5,
           "parameters": {"max_tokens": 7, "flag": True, "top_k": 3, "mode": "greedy"}}
    request = generate.decode_generate_request(doc, METADATA, "m", 2)
    assert request.id == "42" and request.model_name == "m" and request.model_version == 2
    assert {n: (t.datatype, t.shape) for n, t in request.inputs.items()} == {
        "text_input": ("BYTES", [1, 1]), "values": ("FP32", [2]), "max_tokens": ("INT32", [1]), "flag": ("BOOL", [1, 1])}
    assert request.inputs["text_input"].data.tolist() == [[b"hi\x00"]]
    assert request.inputs["values"].data.dtype == np.float32 and request.inputs["values"].data.tolist() == [1, 2.5]
    assert request.inputs["max_tokens"].data.dtype == np.int32 and request.inputs["max_tokens"].data.tolist() == [7]
    assert request.parameters == {"stream": False, "temperature": 0.5, "top_k": 3, "mode": "greedy"}


@pytest.mark.parametrize("doc, message", [
    ([1], "the generate request JSON must be an object"),
    ({"id": 3}, "Unable to parse 'id'"),
    ({"parameters": [1]}, "Expected JSON object for keyword: 'parameters'"),
    ({"other": {"a": 1}}, "parameter 'other' has invalid type"),
    ({"max_tokens": [1, 2]}, "The schema can not convert input 'max_tokens'"),
    ({"max_tokens": "seven"}, "attempt to access JSON non-signed-integer as signed-integer"),
    ({"text_input": 5}, "attempt to access JSON non-string as string"),
])  # fmt: skip
def test_decode_generate_request_errors(doc, message):
    with pytest.raises(InvalidArgumentError) as info:
        generate.decode_generate_request(doc, METADATA, "m")
    assert message in info.value.message


def test_generate_parameters_input_name_clash():
    metadata = {"inputs": [{"name": "parameters", "datatype": "INT32", "shape": [1]}]}
    with pytest.raises(InvalidArgumentError, match="Keyword 'parameters' for nested schema also given as input"):
        generate.decode_generate_request({"parameters": {}}, metadata, "m")


def test_encode_generate_response():
    response = InferenceResponse("m", "1", "", [
        Tensor("text_output", "BYTES", [1, 1], np.array([[b"out\x00put"]], dtype=np.object_)),
        Tensor("ids", "INT64", [1, 3], np.array([[1, 2, 3]], np.int64)),
        Tensor("score", "FP32", [1], np.array([0.5], np.float32)),
        Tensor("done", "BOOL", [1], np.array([True])),
        Tensor("none", "INT32", [0], np.zeros(0, np.int32)),
    ], parameters={"finish_reason": "stop"})  # fmt: skip
    doc = json.loads(generate.encode_generate_response(response, "42"))
    assert doc == {"id": "42", "model_name": "m", "model_version": "1", "finish_reason": "stop",
                   "text_output": "out\x00put", "ids": [1, 2, 3], "score": 0.5, "done": True, "none": []}


def test_encode_generate_response_bytes_parameter_refused():
    response = InferenceResponse("m", "1", parameters={"raw": b"x"})
    with pytest.raises(UnsupportedError, match="Response parameter 'raw'"):
        generate.encode_generate_response(response)


def test_sse_framing():
    assert generate.sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    event = generate.sse_error("bad\nthing")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[6:]) == {"error": "bad\nthing"}


# Triton 2.51's answers to these infer bodies (rapidjson's words and byte offsets), read from the
# real server on 2026-11-27; the empty body is a raw request there, as here (test_http_app).
@pytest.mark.parametrize("text,message", [
    (b"AAAA", "Invalid value. at 0"),
    (b"   ", "The document is empty. at 3"),
    (b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
    (b'{"a":1 "b":2}', "Missing a comma or '}' after an object member. at 7"),
    (b"[1 2]", "Missing a comma or ']' after an array element. at 3"),
    (b"{1:2}", "Missing a name for object member. at 1"),
    (b"{} x", "The document root must not be followed by other values. at 3"),
    (b'"abc', "Missing a closing quotation mark in string. at 4"),
    (b'"\\q"', "Invalid escape character in string. at 1"),
    (b'{"a": [1, {"b": 2} 3]}', "Missing a comma or ']' after an array element. at 19"),
])
def test_json_syntax_errors_in_tritons_words(text, message):
    with pytest.raises(InvalidArgumentError) as info:
        codec.load_json(text)
    assert info.value.message == f"failed to parse the request JSON buffer: {message}"
