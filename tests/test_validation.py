"""The core's request rules for what the front ends decode, with each protocol's words as data."""

from __future__ import annotations

import numpy as np
import pytest

from host import validation
from host.errors import InternalError, InvalidArgumentError
from host.inference import Tensor


@pytest.mark.parametrize("protocol, text", [
    ("http", "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("grpc", "invalid shape [2, -1] for input 'X' for model 'm': dimensions must not be negative"),
])
def test_negative_dimension_per_protocol(protocol, text):
    with pytest.raises(InvalidArgumentError) as info:
        validation.check_shape("X", [2, -1], "m", protocol)
    assert info.value.message == text


@pytest.mark.parametrize("protocol, text", [
    ("http", "expected 2 string elements for inference input 'S' for model 'm', got 1"),
    ("grpc", "expected 2 string elements for inference input 'S' for model 'm', got 1"),
])
def test_string_count_per_protocol(protocol, text):
    with pytest.raises(InvalidArgumentError) as info:
        validation.bytes_input("S", "m", [2], b"\x01\x00\x00\x00a", protocol)
    assert info.value.message == text


def test_byte_size_and_count():
    assert validation.fixed_size_count("X", "m", "FP32", [2, 3], 24) == 6
    with pytest.raises(InvalidArgumentError, match=r"Expected 24, got 20$"):
        validation.fixed_size_count("X", "m", "FP32", [2, 3], 20)


def test_output_array_coerces_and_checks():
    out = validation.output_array(Tensor("O", "FP32", [2], np.array([1, 2], np.int64)))
    assert out.dtype == np.float32
    with pytest.raises(InternalError, match="does not match size of output for 'O'"):
        validation.output_array(Tensor("O", "FP32", [3], np.zeros(2, np.float32)))


@pytest.mark.parametrize("protocol, params, text", [
    ("http", {"other": "x"}, "unexpected error on creating Triton parameter"),
    ("grpc", {"other": "x"}, "unrecognized load parameter 'other'."),
    ("http", {"config": 1}, "attempt to access JSON non-string as string"),
    ("grpc", {"config": 1}, "invalid value type for load parameter 'config', expected string_param."),
    ("grpc", {"file:1/a": "x"}, "invalid value type for load parameter 'file:1/a', expected bytes_param."),
])
def test_load_parameters_per_protocol(protocol, params, text):
    with pytest.raises(InvalidArgumentError) as info:
        validation.load_parameters(params, protocol)
    assert info.value.message == text


def test_load_parameters_decode_files():
    config, files = validation.load_parameters({"config": "{}", "file:1/a": "YQ=="}, "http",
                                               lambda key, value: value.encode())
    assert config == "{}" and files == {"1/a": b"YQ=="}
    assert validation.load_parameters({}, "grpc") == (None, None)


def test_version_parsing():
    assert validation.parse_version("") == -1 and validation.parse_version("3") == 3
    with pytest.raises(InvalidArgumentError, match="invalid model version specified '-2'"):
        validation.parse_version("-2")
    # std::stol, as Triton parses it: white space and a sign first, anything after the digits
    # ignored; no digits, or a number past a long, is its error
    assert validation.parse_version(" 7") == 7 and validation.parse_version("5abc") == 5
    assert validation.parse_version("+4") == 4 and validation.parse_version(str(2**63 - 1)) == 2**63 - 1
    for text in ("abc", "99999999999999999999", " ", "-"):
        with pytest.raises(InvalidArgumentError) as info:
            validation.parse_version(text)
        assert info.value.message == (
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0")
