"""Triton's logging extension and log flags against a real `modelhost serve`.

The `echo` model (tests/obs_models) logs a tag at every level through pb_utils.Logger when a
request carries a "log" parameter, so each check reads what actually reached the log file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, serve, wait_until

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "obs_models"
DEFAULT_LINE = r"^{level}\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} \d+ model\.py:\d+\] {message}$"
ISO_LINE = r"^\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ {level} \d+ model\.py:\d+\] {message}$"


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    log_file = tmp_path_factory.mktemp("log") / "server.log"
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--log-file", str(log_file), "--log-warning=false") as server:
        yield server, log_file


def _log(server: ServerProcess, tag: str) -> None:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    httpclient.InferenceServerClient(server.url).infer("echo", [tensor], parameters={"log": tag})


def _lines(log_file: Path, tag: str) -> list[str]:
    return [line for line in log_file.read_text().splitlines() if f'] "{tag} ' in line]


def _grpc_call_lines(log_file: Path, method: str) -> list[str]:
    return [line for line in log_file.read_text().splitlines()
            if f"gRPC /inference.GRPCInferenceService/{method} -> OK" in line]


def test_flags_file_levels_and_format(logged):
    server, log_file = logged
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_log_settings() == {
        "log_file": str(log_file), "log_info": True, "log_warning": False, "log_error": True,
        "log_verbose_level": 0, "log_format": "default"}
    _log(server, "t1")
    lines = wait_until(lambda: len(_lines(log_file, "t1")) == 2 and _lines(log_file, "t1"))
    assert re.match(DEFAULT_LINE.format(level="I", message='"t1 info"'), lines[0]), lines
    assert re.match(DEFAULT_LINE.format(level="E", message='"t1 error"'), lines[1]), lines
    # With a log file, nothing of the server's logging goes to stdout/stderr (gunicorn's own
    # lines included: they are in the file, in Triton's format).
    assert "t1 info" not in server.log_text() and "successfully loaded" not in server.log_text()
    assert "Booting worker" not in server.log_text()
    assert re.search(r'^I\d{4} [\d:.]+ \d+ \w+\.py:\d+\] "Booting worker with pid: \d+"$',
                     log_file.read_text(), re.M)


def test_settings_change_while_running(logged):
    server, log_file = logged
    http = httpclient.InferenceServerClient(server.url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    answer = http.update_log_settings({"log_format": "ISO8601", "log_warning": True,
                                       "log_verbose_level": 1})
    assert answer == {"log_file": str(log_file), "log_info": True, "log_warning": True,
                      "log_error": True, "log_verbose_level": 1, "log_format": "ISO8601"}
    _log(server, "t2")
    lines = wait_until(lambda: len(_lines(log_file, "t2")) == 4 and _lines(log_file, "t2"))
    for line, (level, message) in zip(lines, [("I", '"t2 info"'), ("W", '"t2 warning"'),
                                               ("E", '"t2 error"'), ("I", '"t2 verbose"')]):
        assert re.match(ISO_LINE.format(level=level, message=message), line), line
    # Verbose level 1, set while running, turns on the line per gRPC call at once.
    assert grpc_client.is_server_live()
    live_calls = wait_until(lambda: _grpc_call_lines(log_file, "ServerLive"))
    # gRPC: typed values; off switches stop those lines at once.
    settings = grpc_client.update_log_settings({"log_info": False, "log_error": False,
                                         "log_verbose_level": 0, "log_format": "default"},
                                        as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": False}
    assert settings["log_format"] == {"string_param": "default"}
    assert settings["log_file"] == {"string_param": str(log_file)}
    assert grpc_client.is_server_live()  # verbose level 0 again: no line for this call
    _log(server, "t3")
    lines = wait_until(lambda: _lines(log_file, "t3"))
    assert _grpc_call_lines(log_file, "ServerLive") == live_calls
    assert len(lines) == 1 and re.match(DEFAULT_LINE.format(level="W", message='"t3 warning"'),
                                        lines[0]), lines
    assert grpc_client.get_log_settings(as_json=True)["settings"]["log_error"] == {"bool_param": False}
    http.update_log_settings({"log_info": True, "log_error": True, "log_warning": False})


@pytest.mark.parametrize("settings, status, message", [
    ({"log_file": "elsewhere.log"}, "501",
     "log file location can not be updated through network protocol"),
    ({"log_format": "fancy"}, "400", "invalid argument for --log_format, got: fancy"),  # Triton: 503
    ({"log_info": "yes"}, "400", "attempt to access JSON non-boolean as boolean"),
    ({"log_verbose_level": -1}, "400",
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
])
def test_http_errors(logged, settings, status, message):
    server, _ = logged
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_log_settings()
    with pytest.raises(InferenceServerException) as info:
        client.update_log_settings(settings)
    assert (info.value.status(), info.value.message()) == (status, message)
    assert client.get_log_settings() == before


def test_grpc_errors(logged):
    server, _ = logged
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # tritonclient types the values itself; a raw stub sends the wrong one
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.LogSettingsRequest()
    request.settings["log_info"].string_param = "yes"
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as raw:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request)
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raw.value.details() == "expect boolean for 'log_info'"
    with pytest.raises(InferenceServerException) as info:
        client.update_log_settings({"log_file": "x.log"})
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    # a null over HTTP leaves the setting as it is
    http = httpclient.InferenceServerClient(server.url)
    assert http.update_log_settings({"log_file": None, "log_info": None}) == http.get_log_settings()


def test_without_a_file_the_log_goes_to_the_console(tmp_path):
    # TRITON_SERVER_ESCAPE_LOG_MESSAGES=0: messages as they are (Triton's switch), not JSON strings
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--log-info=false", "--log-format", "ISO8601",
               env={"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"}) as server:
        assert httpclient.InferenceServerClient(server.url).get_log_settings()["log_info"] is False
        _log(server, "t4")
        text = wait_until(lambda: "t4 error" in server.log_text() and server.log_text())
    assert "t4 info" not in text and "t4 warning" in text
    assert re.search(ISO_LINE.format(level="E", message="t4 error"), text, re.M)
