"""Reserved request parameters: one rule for every front end (host.parameters)."""

import numpy as np
import pytest

from host.errors import InvalidArgumentError, UnsupportedError
from host.inference import InferenceRequest, RequestedOutput, Tensor
from host.parameters import check_outputs, interpret


def req(**params) -> InferenceRequest:
    x = np.zeros(2, np.int32)
    return InferenceRequest("m", inputs={"IN": Tensor("IN", "INT32", [2], x)}, parameters=params)


def test_reserved_parameters_become_fields_and_leave_the_model_parameters():
    r = req(sequence_id=42, sequence_start=True, sequence_end=False, priority=2, timeout=100,
            binary_data_output=True, triton_enable_empty_final_response=True, temp=0.5, mode="x")
    interpret(r)
    assert (r.sequence_id, r.sequence_start, r.sequence_end, r.priority, r.timeout_us) == (42, True, False, 2, 100)
    assert r.enable_empty_final_response is True
    assert r.parameters == {"temp": 0.5, "mode": "x"}


def test_string_sequence_id_is_accepted():
    r = req(sequence_id="session-1")
    interpret(r)
    assert r.sequence_id == "session-1" and r.parameters == {}


@pytest.mark.parametrize("params, message", [
    ({"triton_x": 1}, "parameter keys starting with 'triton_' are reserved for Triton usage"),
    ({"sequence_start": "yes"}, "Unable to parse 'sequence_start'"),
    ({"priority": -1}, "Unable to parse 'priority'"),
    ({"timeout": 1.5}, "Unable to parse 'timeout'"),
    ({"sequence_id": 1.5}, "Unable to parse 'sequence_id'"),
    ({"triton_enable_empty_final_response": 1},
     "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."),
])
def test_bad_reserved_parameters(params, message):
    with pytest.raises(InvalidArgumentError, match=message):
        interpret(req(**params))


@pytest.mark.parametrize("outputs, error, message", [
    ([("A", {}), ("A", {})], InvalidArgumentError,
     r"^\[request id: <id_unknown>\] output 'A' already exists in request$"),
    ([("A", {"classification": -1})], InvalidArgumentError, "Unable to set 'classification'"),
])
def test_requested_outputs_are_judged_by_the_host(outputs, error, message):
    r = req()
    r.outputs = [RequestedOutput(name, params) for name, params in outputs]
    with pytest.raises(error, match=message):
        check_outputs(r)


def test_ordinary_requested_outputs_pass():
    r = req()
    r.outputs = [RequestedOutput("A", {"binary_data_size": 4}), RequestedOutput("B")]
    check_outputs(r)


def test_grpc_int64_ids_and_timeouts_are_read_as_unsigned_as_triton_does():
    r = req(sequence_id=-1, timeout=-2)
    r.protocol = "grpc"
    interpret(r)
    assert (r.sequence_id, r.timeout_us) == (2**64 - 1, 2**64 - 2)
    r = req(sequence_id=-1)
    r.protocol = "http"  # JSON: a negative id is neither unsigned nor a string
    with pytest.raises(InvalidArgumentError, match="attempt to access JSON non-string as string"):
        interpret(r)
