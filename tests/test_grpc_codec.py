"""host.grpc.codec: Triton's gRPC messages <-> host.inference types, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from host import datatypes
from host.errors import Code, InvalidArgumentError, NotFoundError, UnsupportedError
from host.grpc import codec
from host.grpc.status import status_code
from host.inference import InferenceResponse, Tensor
from host.proto import grpc_service_pb2 as pb

InputTensor = pb.ModelInferRequest.InferInputTensor


def _request(*inputs, raw=(), **kwargs) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", inputs=list(inputs), raw_input_contents=list(raw),
                                **kwargs)


def test_status_table_is_tritons() -> None:
    import grpc

    expected = {Code.UNKNOWN: grpc.StatusCode.UNKNOWN, Code.INTERNAL: grpc.StatusCode.INTERNAL,
                Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
                Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
                Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
                Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
                Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
                Code.CANCELLED: grpc.StatusCode.CANCELLED}
    assert {code: status_code(code) for code in Code} == expected


def test_raw_inputs_are_views_over_the_message_bytes() -> None:
    data = np.arange(6, dtype=np.float32)
    msg = _request(InputTensor(name="X", datatype="FP32", shape=[2, 3]), raw=[data.tobytes()],
                   id="r1", model_version="3")
    request = codec.decode_infer_request(msg)
    tensor = request.inputs["X"]
    assert (request.id, request.model_name, request.model_version) == ("r1", "m", 3)
    assert tensor.shape == [2, 3] and tensor.data.dtype == np.float32
    np.testing.assert_array_equal(tensor.data, data.reshape(2, 3))
    assert not tensor.data.flags.owndata  # a view, no copy


def test_raw_bytes_input() -> None:
    items = [b"a\x00b", b"", b"\xff"]
    msg = _request(InputTensor(name="S", datatype="BYTES", shape=[3]),
                   raw=[datatypes.serialize_bytes(items)])
    assert list(codec.decode_infer_request(msg).inputs["S"].data) == items


@pytest.mark.parametrize("datatype,field,values", [
    ("BOOL", "bool_contents", [True, False]),
    ("INT8", "int_contents", [-128, 127]),
    ("INT16", "int_contents", [-32768, 32767]),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 255]),
    ("UINT16", "uint_contents", [0, 65535]),
    ("UINT32", "uint_contents", [0, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 2**64 - 1]),
    ("FP32", "fp32_contents", [1.5, -2.25]),
    ("FP64", "fp64_contents", [1e300, -0.5]),
    ("BYTES", "bytes_contents", [b"x\x00", b""]),
])
def test_typed_contents(datatype: str, field: str, values: list) -> None:
    tensor = InputTensor(name="X", datatype=datatype, shape=[2])
    getattr(tensor.contents, field).extend(values)
    data = codec.decode_infer_request(_request(tensor)).inputs["X"].data
    assert data.dtype == datatypes.to_numpy(datatype)
    assert list(data) == values


def test_narrow_integers_keep_the_low_bytes_as_triton() -> None:
    tensor = InputTensor(name="X", datatype="INT8", shape=[2])
    tensor.contents.int_contents.extend([257, -129])
    assert list(codec.decode_infer_request(_request(tensor)).inputs["X"].data) == [1, 127]


def test_contents_of_another_type_is_rejected_with_tritons_words() -> None:
    tensor = InputTensor(name="X", datatype="FP16", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidArgumentError) as info:
        codec.decode_infer_request(_request(tensor))
    assert info.value.message == ("unexpected explicit tensor data for input tensor 'X' for model 'm' "
                                  "of type 'FP32', expected datatype 'FP16'")
    tensor = InputTensor(name="X", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    tensor.contents.int64_contents.append(1)
    with pytest.raises(InvalidArgumentError, match="binary data was already supplied"):
        codec.decode_infer_request(_request(tensor))


def test_raw_and_contents_together_are_rejected() -> None:
    a = InputTensor(name="A", datatype="INT32", shape=[1])
    b = InputTensor(name="B", datatype="INT32", shape=[1])
    b.contents.int_contents.append(1)
    with pytest.raises(InvalidArgumentError) as info:
        codec.decode_infer_request(_request(a, b, raw=[b"\0\0\0\0"]))
    assert info.value.message == ("contents field must not be specified when using "
                                  "raw_input_contents for 'B' for model 'm'")


def test_sizes_are_checked() -> None:
    """Data that does not fill its shape: the request carries each such input's error, which the
    host raises in Triton's core order (after the input count), with the request's tag."""
    def data_error(msg) -> str:
        errors = codec.decode_infer_request(msg).data_errors
        assert errors is not None and len(errors) == 1
        error = next(iter(errors.values()))
        assert isinstance(error, InvalidArgumentError)
        return error.message

    msg = _request(InputTensor(name="X", datatype="FP32", shape=[4]), raw=[b"\0" * 12])
    assert data_error(msg) == ("[request id: <id_unknown>] input byte size mismatch for input 'X' "
                               "for model 'm'. Expected 16, got 12")
    tensor = InputTensor(name="X", datatype="INT32", shape=[3])
    tensor.contents.int_contents.extend([1, 2])
    assert data_error(_request(tensor)).endswith("Expected 12, got 8")
    msg = _request(InputTensor(name="S", datatype="BYTES", shape=[3]),
                   raw=[datatypes.serialize_bytes([b"a", b"b"])])
    assert data_error(msg) == ("[request id: <id_unknown>] expected 3 string elements for inference "
                               "input 'S' for model 'm', got 2")
    msg = _request(InputTensor(name="S", datatype="BYTES", shape=[3]),
                   raw=[datatypes.serialize_bytes([b"a", b"b", b"c", b"d"])])
    assert data_error(msg) == ("[request id: <id_unknown>] unexpected number of string elements 4 "
                               "for inference input 'S' for model 'm', expecting 3")
    msg = _request(InputTensor(name="X", datatype="FP32", shape=[1]))
    with pytest.raises(InvalidArgumentError) as info:
        codec.decode_infer_request(msg)
    assert info.value.message == "unable to find data for input tensor 'X' for model 'm' in request."


def test_shared_memory_inputs_are_left_for_the_host_to_bind() -> None:
    tensor = InputTensor(name="X", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    request = codec.decode_infer_request(_request(tensor))
    assert request.uses_shm and request.inputs["X"].data is None
    assert request.inputs["X"].parameters == {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    tensor.contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidArgumentError, match="unexpected 'content' provided when using shared memory"):
        codec.decode_infer_request(_request(tensor))


def test_parameters_become_plain_values_passed_as_is() -> None:
    msg = _request()
    msg.parameters["b"].bool_param = True
    msg.parameters["i"].int64_param = -3
    msg.parameters["s"].string_param = "x"
    msg.parameters["d"].double_param = 0.5
    msg.parameters["u"].uint64_param = 2**64 - 1
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    msg.parameters["sequence_id"].int64_param = 7
    params = codec.decode_infer_request(msg).parameters
    assert params == {"b": True, "i": -3, "s": "x", "d": 0.5, "u": 2**64 - 1,
                      "triton_enable_empty_final_response": True, "sequence_id": 7}
    msg.parameters["unset"].Clear()
    with pytest.raises(InvalidArgumentError, match="invalid value type for 'unset' parameter"):
        codec.decode_infer_request(msg)


def test_model_version_as_triton_parses_it() -> None:
    assert codec.model_version("") == -1
    assert codec.model_version("12") == 12
    with pytest.raises(InvalidArgumentError, match="failed to get model version from specified"):
        codec.model_version("x")
    with pytest.raises(InvalidArgumentError, match="invalid model version specified '-2'"):
        codec.model_version("-2")


def test_response_outputs_are_raw_with_parameters() -> None:
    out = np.arange(6, dtype=np.int32).reshape(2, 3).T  # not contiguous
    response = InferenceResponse(
        model_name="m", model_version="2", id="r",
        outputs=[Tensor("A", "INT32", [3, 2], out, {"p": 1}),
                 Tensor("B", "BYTES", [2], np.array([b"x", b"\x00"], dtype=object))],
        parameters={"flag": True, "n": 2**63, "f": 0.25, "s": "v"})
    msg = codec.encode_infer_response(response)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "2", "r")
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("A", "INT32", [3, 2]), ("B", "BYTES", [2])]
    assert msg.outputs[0].parameters["p"].int64_param == 1
    assert msg.raw_output_contents[0] == np.ascontiguousarray(out).tobytes()
    assert datatypes.deserialize_bytes(msg.raw_output_contents[1]) == [b"x", b"\x00"]
    params = msg.parameters
    assert params["flag"].bool_param is True and params["n"].uint64_param == 2**63
    assert params["f"].double_param == 0.25 and params["s"].string_param == "v"
    assert not msg.outputs[0].HasField("contents")


def test_stream_messages() -> None:
    response = InferenceResponse(model_name="m", model_version="1", id="r")
    msg = pb.ModelStreamInferResponse.FromString(codec.stream_response(response, False))
    assert msg.infer_response.parameters["triton_final_response"].bool_param is False
    assert msg.infer_response.id == "r" and msg.infer_response.model_name == "m"
    empty = codec.stream_empty_final("r", "m", "")
    assert empty.infer_response.id == "r" and not empty.infer_response.outputs
    assert empty.infer_response.parameters["triton_final_response"].bool_param is True
    error = codec.stream_error("boom", "r")
    assert error.error_message == "boom" and error.infer_response.id == "r"


def test_statistics_dict_to_message() -> None:
    doc = {"model_stats": [{"name": "m", "version": "1", "last_inference": 5, "inference_count": 2,
                            "execution_count": 1,
                            "inference_stats": {"success": {"count": 2, "ns": 10}},
                            "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 1, "ns": 3}}],
                            "response_stats": {}, "memory_usage": []}]}
    msg = codec.statistics(doc)
    stats = msg.model_stats[0]
    assert stats.inference_stats.success.ns == 10 and stats.batch_stats[0].compute_infer.ns == 3


def test_load_parameters() -> None:
    params = pb.RepositoryModelLoadRequest().parameters
    params["config"].string_param = '{"max_batch_size": 2}'
    params["file:1/model.py"].bytes_param = b"x"
    assert codec.load_parameters(params) == ('{"max_batch_size": 2}', {"1/model.py": b"x"})
    params["config"].bool_param = True
    with pytest.raises(InvalidArgumentError, match="expected string_param"):
        codec.load_parameters(params)
    params = pb.RepositoryModelLoadRequest().parameters
    params["other"].string_param = "x"
    with pytest.raises(InvalidArgumentError, match="unrecognized load parameter 'other'"):
        codec.load_parameters(params)
    with pytest.raises(UnsupportedError, match="'repository_name' specification is not supported"):
        codec.check_repository_name("r")


def test_not_found_maps_to_not_found() -> None:
    import grpc

    assert status_code(NotFoundError("x").code) is grpc.StatusCode.NOT_FOUND


def test_a_response_with_parameters_frames_its_contents_after_upbs_head() -> None:
    from host.inference import InferenceResponse, Tensor
    big = np.arange(codec.LARGE_OUTPUT_BYTES // 4 + 3, dtype=np.float32)
    outputs = [Tensor("A", "FP32", [big.size], big),
               Tensor("S", "BYTES", [2], np.array([b"x\x00", b""], dtype=np.object_)),
               Tensor("M", "INT8", [4], None),  # written to shared memory: empty contents
               Tensor("T", "INT16", [3, 2], np.arange(6, dtype=np.int16).reshape(2, 3).T)]
    response = InferenceResponse("m", "1", "id7", outputs=outputs, parameters={"p": 1})
    framed = codec.encode_unary_response(response)
    assert isinstance(framed, codec.FramedResponse)
    parsed = pb.ModelInferResponse.FromString(framed.SerializeToString())
    assert parsed == codec.encode_infer_response(response)
    assert parsed.raw_output_contents[0] == big.tobytes()
    assert parsed.raw_output_contents[2] == b""
    assert parsed.raw_output_contents[3] == np.arange(6, dtype=np.int16).reshape(2, 3).T.tobytes()
    with_output_parameter = InferenceResponse("m", "1", outputs=[
        Tensor("A", "FP32", [2], big[:2], {"binary_data_size": 8})])
    framed = codec.encode_unary_response(with_output_parameter)
    assert isinstance(framed, codec.FramedResponse)
    assert pb.ModelInferResponse.FromString(framed.SerializeToString()) == \
        codec.encode_infer_response(with_output_parameter)


_RESPONSES = pytest.mark.parametrize("response", [
    pytest.param(lambda R, T: R("m", "1", "id7", outputs=[T("A", "FP32", [3], np.arange(3, dtype=np.float32))]),
                 id="one output"),
    pytest.param(lambda R, T: R("model_é", "12", "", outputs=[]), id="no output, utf-8 name"),
    pytest.param(lambda R, T: R("", "", ""), id="all empty"),
    pytest.param(lambda R, T: R("m", "1", outputs=[
        T("A", "FP32", [codec.LARGE_OUTPUT_BYTES // 4 + 3],
          np.arange(codec.LARGE_OUTPUT_BYTES // 4 + 3, dtype=np.float32)),
        T("S", "BYTES", [2], np.array([b"x\x00", b""], dtype=np.object_)),
        T("M", "INT8", [4], None),
        T("T", "INT16", [3, 2], np.arange(6, dtype=np.int16).reshape(2, 3).T),
        T("Z", "FP32", [0, 5], np.zeros((0, 5), np.float32)),
        T("W", "INT64", [200, 1], np.arange(200, dtype=np.int64).reshape(200, 1))]), id="mixed outputs"),
    pytest.param(lambda R, T: R("m", 7, "r" * 300, outputs=[T("O" * 200, "UINT8", [], np.uint8(5).reshape(()))]),
                 id="long id, scalar, int version"),
])


@_RESPONSES
def test_stream_responses_framed_by_hand_are_upbs_bytes(response: Any) -> None:
    from host.inference import InferenceResponse, Tensor
    built = response(InferenceResponse, Tensor)
    for final in (False, True):
        data = codec.stream_response(built, final, request_id="fallback")
        assert type(data) is bytes
        expected = pb.ModelStreamInferResponse(
            infer_response=codec.encode_infer_response(built, request_id="fallback"))
        expected.infer_response.parameters["triton_final_response"].bool_param = final
        assert data == expected.SerializeToString()
    with_parameter = InferenceResponse("m", "1", parameters={"p": 1})  # through upb
    msg = codec.stream_response(with_parameter, True)
    assert msg.infer_response.parameters["p"].int64_param == 1
    assert msg.infer_response.parameters["triton_final_response"].bool_param is True


@_RESPONSES
def test_unary_responses_framed_by_hand_read_back_as_upbs(response: Any) -> None:
    from host.inference import InferenceResponse, Tensor
    built = response(InferenceResponse, Tensor)
    data = codec.encode_unary_response(built, request_id="fallback")
    assert type(data) is bytes
    parsed = pb.ModelInferResponse.FromString(data)
    assert parsed == codec.encode_infer_response(built, request_id="fallback")
    # byte for byte what upb writes (field order, empty strings left out)
    assert data == codec.encode_infer_response(built, request_id="fallback").SerializeToString()


def test_an_input_named_twice_is_tritons_error_with_the_requests_tag() -> None:
    InputTensor = pb.ModelInferRequest.InferInputTensor
    x = InputTensor(name="X", datatype="INT32", shape=[1])
    for request_id, tag in (("", "<id_unknown>"), ("r7", "r7")):
        with pytest.raises(InvalidArgumentError) as info:
            codec.decode_infer_request(_request(x, x, raw=[b"\0" * 4] * 2, id=request_id))
        assert info.value.message == f"[request id: {tag}] input 'X' already exists in request"


def test_a_sequence_requests_turn_on_a_stream_waits_only_when_it_must() -> None:
    """host.grpc.stream: the requests of a sequence reach the batcher in stream order. A turn
    already done costs no wait and no event; a thread that comes early waits until it is done."""
    import threading
    import time

    from host.grpc.stream import _Turn

    lock = threading.Lock()
    done = _Turn()
    done.finish(lock)
    done.wait(lock)  # returns at once
    assert done.event is None

    turn, order = _Turn(), []
    waiter = threading.Thread(target=lambda: (turn.wait(lock), order.append("next")))
    waiter.start()
    while turn.event is None:  # the waiter made the event: it waits now
        time.sleep(0.001)
    order.append("first")
    turn.finish(lock)
    waiter.join(10)
    assert order == ["first", "next"] and not waiter.is_alive()


# --- requests whose fields were seen before (host.request_plan) ----------------------------------------

def _decoded(request):
    return (request.model_name, request.model_version, request.id, request.parameters, request.uses_shm,
            [(t.name, t.datatype, t.shape, None if t.data is None else t.data.tolist(), t.parameters)
             for t in request.inputs.values()],
            [(o.name, o.parameters) for o in request.outputs])


def _planned_request(values, request_id="r1") -> bytes:
    msg = _request(InputTensor(name="X", datatype="FP32", shape=[2, 2]),
                   InputTensor(name="S", datatype="INT32", shape=[2], parameters={
                       "shared_memory_region": pb.InferParameter(string_param="region"),
                       "shared_memory_byte_size": pb.InferParameter(int64_param=8)}),
                   raw=[np.array(values, dtype=np.float32).tobytes()], id=request_id, model_version="3",
                   parameters={"p": pb.InferParameter(int64_param=5)},
                   outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="O", parameters={
                       "classification": pb.InferParameter(int64_param=2)})])
    return msg.SerializeToString()


def _forget_plans() -> None:
    codec._PLANS.clear()
    codec._last_plan = None


def _upb(data: bytes):
    return codec.decode_infer_request(pb.ModelInferRequest.FromString(data))


def test_a_request_that_repeats_its_fields_decodes_as_upb_would_into_objects_of_its_own() -> None:
    _forget_plans()
    first = codec.parse_infer_request(_planned_request([1, 2, 3, 4]))
    assert not codec._PLANS.plans  # seen once: no plan yet
    first = codec.parse_infer_request(_planned_request([1, 2, 3, 4]))
    assert len(codec._PLANS.plans) == 1
    first.parameters["p"] = 6  # what the host does to a request
    first.inputs["X"].shape.append(1)
    first.inputs["S"].parameters.clear()
    first.outputs[0].parameters.clear()
    # the same fields, other data and other ids (an id of its own for each request, as streams send)
    for values, request_id in (([1, 2, 3, 4], "r1"), ([5, 6, 7, 8], "r2"), ([5, 6, 7, 8], ""),
                               ([0, 0, 0, 1], "\u00e9t\u00e9")):
        data = _planned_request(values, request_id)
        planned = codec.parse_infer_request(data)
        assert _decoded(planned) == _decoded(_upb(data))
        assert planned.id == request_id
        assert planned.inputs["X"].data.tolist() == np.reshape(values, (2, 2)).tolist()
    assert len(codec._PLANS.plans) == 1  # one plan whatever the id (the request without one came once)
    codec._last_plan = None  # found by its key as well as by the last plan
    assert _decoded(codec.parse_infer_request(data))[5][0][3] == [[0, 0], [0, 1]]
    msg, request = codec.read_stream_request(_planned_request([1, 2, 3, 4], "r9"))  # a stream's
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "3", "r9")
    assert _decoded(request) == _decoded(_upb(_planned_request([1, 2, 3, 4], "r9")))


def test_requests_that_do_not_fit_their_plan_are_decoded_in_full() -> None:
    _forget_plans()
    data = _planned_request([1, 2, 3, 4])
    codec.parse_infer_request(data)
    codec.parse_infer_request(data)
    assert codec._PLANS.plans
    # a raw content of another size: the full decoding's error
    short = _planned_request([1, 2, 3])  # the same fields, 12 bytes of data
    assert codec.parse_infer_request(short).data_errors["X"].message.endswith("Expected 16, got 12")
    # one raw content too many, a field after the raw contents, the id twice: as upb reads them
    for variant in (data + b"\x3a\x04abcd", data + b"\x1a\x02r2", b"\x1a\x02r0" + data):
        assert _decoded(codec.parse_infer_request(variant)) == _decoded(_upb(variant))
    assert codec.parse_infer_request(data + b"\x1a\x02r2").id == "r2"
    with pytest.raises(Exception, match="Error parsing message"):  # cut short: upb's DecodeError
        codec.parse_infer_request(data[:-1])
    bad_id = data.replace(b"\x1a\x02r1", b"\x1a\x02\xff\xfe")  # not UTF-8: upb refuses it
    with pytest.raises(Exception, match="Error parsing message"):
        codec.parse_infer_request(bad_id)
    msg, error = codec.read_stream_request(_request(
        InputTensor(name="X", datatype="FP32", shape=[2])).SerializeToString())
    assert isinstance(error, InvalidArgumentError) and msg.model_name == "m"


def test_bytes_and_typed_contents_are_decoded_every_time() -> None:
    _forget_plans()
    items = [b"a", b"bc"]
    typed = _request(InputTensor(name="T", datatype="INT32", shape=[2],
                                 contents=pb.InferTensorContents(int_contents=[1, 2]))).SerializeToString()
    raw_bytes = _request(InputTensor(name="B", datatype="BYTES", shape=[2]),
                         raw=[datatypes.serialize_bytes(np.array(items, dtype=object))]).SerializeToString()
    for data in (typed, typed, typed, raw_bytes, raw_bytes, raw_bytes):
        codec.parse_infer_request(data)
    assert not codec._PLANS.plans
    first, second = codec.parse_infer_request(typed), codec.parse_infer_request(typed)
    first.inputs["T"].data[0] = 9
    assert second.inputs["T"].data.tolist() == [1, 2]


def test_the_kept_plans_are_bounded(monkeypatch) -> None:
    _forget_plans()
    monkeypatch.setattr(codec._PLANS, "limit", 4)
    for n in range(10):
        data = _request(InputTensor(name=f"X{n}", datatype="FP32", shape=[1]),
                        raw=[b"\0\0\0\0"]).SerializeToString()
        codec.parse_infer_request(data)
        codec.parse_infer_request(data)
        assert 1 <= len(codec._PLANS.plans) <= 4 and len(codec._PLANS.seen) <= 4
