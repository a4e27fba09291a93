"""Start-up of a real `modelhost serve`: failures are one line and a non-zero exit (no traceback,
no worker restart), the ready summary lists models and endpoints, an empty repository is warned
about, JSON logs carry request ids, --log-verbose logs each request (HTTP and gRPC) as it ends."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import free_port, serve

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = ROOT / "model_repository" / "identity_fp32"


def _repository(tmp_path: Path, broken: bool = False) -> Path:
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "identity_fp32").symlink_to(IDENTITY, target_is_directory=True)
    if broken:
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "config.pbtxt").write_text('backend: "no_such_backend"\n')
    return repo


def _start(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A server expected to fail: its exit status and output."""
    ports = ["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
             "--metrics-address", "127.0.0.1"]
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        if flag not in args:
            ports += [flag, str(free_port())]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELHOST_")}
    return subprocess.run([sys.executable, "-m", "host", "serve", *ports, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


# an error line in either text format: "... E logger] ..." or Triton's "E1124 06:44:11.123 ..."
_ERROR_LINE = re.compile(r"( E [\w.]+\] |^E\d{4} )")
_WARNING_LINE = re.compile(r"( W [\w.]+\] |^W\d{4} )")


def _one_error_line(result: subprocess.CompletedProcess, expected: str, before: int = 0) -> str:
    """The failure is the last error line; `before`: error lines allowed ahead of it (a model's
    own load failure, logged as it happens)."""
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out and "Worker failed to boot" not in out, out
    assert out.count("Booting worker") <= 1, out  # never restarted
    assert "Listening at" not in out, out
    errors = [line for line in out.splitlines() if _ERROR_LINE.search(line)]
    assert len(errors) == 1 + before and expected in errors[-1], out
    return errors[-1]


def test_missing_repository(tmp_path):
    result = _start("--model-repository", str(tmp_path / "nowhere"))
    _one_error_line(result, f"model repository '{tmp_path / 'nowhere'}' does not exist: "
                            "pass --model-repository DIR")


@pytest.mark.parametrize("flag, name", [("--http-port", "HTTP"), ("--grpc-port", "gRPC"),
                                        ("--metrics-port", "metrics")])
def test_busy_port(tmp_path, flag, name):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _start("--model-repository", str(_repository(tmp_path)), flag, str(port))
    triton = {"HTTP": "HTTP", "gRPC": "GRPC", "metrics": "Metrics"}[name]
    _one_error_line(result, f"failed to start {triton} service: Unavailable - Socket "
                            f"'127.0.0.1:{port}' already in use (the {name} port {port} on "
                            f"127.0.0.1 is taken: another server listens there); stop it or pick "
                            f"another port with {flag}")


def test_bad_cache_configuration(tmp_path):
    result = _start("--model-repository", str(_repository(tmp_path)),
                    "--cache-config", "local,size=lots")
    _one_error_line(result, "bad response cache configuration: Failed to initialize LocalCache: "
                            "size 'lots' is not an integer (fix --cache-config)")


def test_model_failing_with_exit_on_error(tmp_path):
    result = _start("--model-repository", str(_repository(tmp_path, broken=True)), "--exit-on-error")
    line = _one_error_line(result, "failed to load all models: 'broken': ", before=1)
    assert "no plugin provides backend 'no_such_backend'" in line
    assert "--exit-on-error is set: fix the model, or start without --exit-on-error" in result.stderr


def test_bad_flag_value():
    result = _start("--model-control-mode", "sometimes")
    assert result.returncode == 2 and "usage: modelhost serve" in result.stderr
    assert "argument --model-control-mode: invalid choice: 'sometimes'" in result.stderr


def test_ready_summary_lists_models_and_endpoints(tmp_path):
    with serve(_repository(tmp_path, broken=True)) as server:
        log = server.log_text()
    assert "| Model" in log and "| Version | Status" in log
    assert "| identity_fp32 | 1       | READY" in log
    broken = next(line for line in log.splitlines() if line.startswith("| broken "))
    assert "| 1       | UNAVAILABLE |" in broken and "no plugin provides backend 'no_such_backend'" in broken
    assert f"| HTTP (KServe V2 / Triton REST)        | 127.0.0.1:{server.http_port}" in log
    # the metrics address defaults to the HTTP one, as in Triton
    assert f"0.0.0.0:{server.grpc_port}" in log and f"127.0.0.1:{server.metrics_port}" in log
    assert "Listening at" not in log  # gunicorn's own start-up lines only at --log-verbose


def test_empty_repository_is_warned_about(tmp_path):
    (tmp_path / "empty").mkdir()
    with serve(tmp_path / "empty") as server:
        log = server.log_text()
    assert any(_WARNING_LINE.search(line) and "holds no models" in line for line in log.splitlines())


def _grpc_calls(server) -> None:
    """A gRPC call that succeeds, one that fails (unknown model) and a stream, each with an id."""
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.is_server_ready(headers={"x-request-id": "grpc-7"})
    with pytest.raises(InferenceServerException, match="unknown model"):
        grpc.get_model_metadata("nope", headers={"x-request-id": "grpc-404"})
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, dtype="float32"))
    results: list = []
    grpc.start_stream(callback=lambda result, error: results.append((result, error)),
                      headers={"x-request-id": "grpc-stream"})
    grpc.async_stream_infer("identity_fp32", [tensor])
    grpc.stop_stream()
    assert len(results) == 1 and results[0][1] is None
    grpc.close()


def test_json_logs_with_request_ids(tmp_path):
    with serve(_repository(tmp_path), "--log-format", "json", "--log-verbose", "1") as server:
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, dtype="float32"))
        client.infer("identity_fp32", [tensor], headers={"X-Request-ID": "abc-123"})
        _grpc_calls(server)
        server.stop()
        lines = [line for line in server.log_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert not any("Current configuration" in r["message"] for r in records)  # no gunicorn dump
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    infer = [r for r in records if r.get("request_id") == "abc-123"]
    assert infer and infer[0]["path"] == "/v2/models/identity_fp32/infer" and infer[0]["status"] == "200"
    # gRPC: one line per call as it ends, with its status, like HTTP's
    service = "/inference.GRPCInferenceService/"
    for request_id, method, status in [("grpc-7", "ServerReady", "OK"),
                                       ("grpc-404", "ModelMetadata", "NOT_FOUND"),
                                       ("grpc-stream", "ModelStreamInfer", "OK")]:
        [line] = [r for r in records if r.get("request_id") == request_id]
        assert line["logger"] == "host.request" and line["method"] == "gRPC", line
        assert line["path"] == service + method and line["status"] == status, line
        assert isinstance(line["duration_ms"], float) and line["peer"].startswith("ipv4:127.0.0.1:"), line
        assert line["message"].startswith(f"gRPC {service}{method} -> {status} in "), line
    # (Triton's verbose gRPC handler lines, "New request handler ...", carry no request id)
    generated = [r for r in records if r["logger"] == "host.request" and "request_id" in r
                 and r["request_id"] not in ("abc-123", "grpc-7", "grpc-404", "grpc-stream")]
    assert generated and all(len(r["request_id"]) == 16 for r in generated)  # readiness polls


def test_verbose_request_lines_in_text_logs(tmp_path):
    with serve(_repository(tmp_path), "--log-verbose", "1") as server:
        httpclient.InferenceServerClient(server.url).is_server_live(headers={"X-Request-ID": "h-1"})
        _grpc_calls(server)
        server.stop()
        log = server.log_text()
    assert re.search(r"HTTP GET /v2/health/live -> 200 in [\d.]+ ms \(request id h-1, peer 127\.0\.0\.1\)", log)
    service = "/inference.GRPCInferenceService/"
    for request_id, method, status in [("grpc-7", "ServerReady", "OK"),
                                       ("grpc-404", "ModelMetadata", "NOT_FOUND"),
                                       ("grpc-stream", "ModelStreamInfer", "OK")]:
        pattern = (rf"gRPC {service}{method} -> {status} in [\d.]+ ms "
                   rf"\(request id {request_id}, peer ipv4:127\.0\.0\.1:\d+\)")
        assert len(re.findall(pattern, log)) == 1, log  # one line per call, when it ends


def test_without_log_verbose_no_request_lines(tmp_path):
    with serve(_repository(tmp_path)) as server:
        httpclient.InferenceServerClient(server.url).is_server_live()
        log = server.log_text()
    assert "request id" not in log and "HTTP GET /v2/health" not in log


def test_a_worker_that_fails_to_boot_is_not_restarted(tmp_path):
    # --log-verbose shows gunicorn's own lines: exactly one worker is booted, and the traceback
    # is there for whoever asked for detail
    result = _start("--model-repository", str(_repository(tmp_path)),
                    "--cache-config", "local,size=lots", "--log-verbose", "1")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert out.count("Booting worker") == 1, out
    assert "Traceback" in out and "Worker failed to boot" not in out
