"""Model lifecycle behaviour that Triton's QA tests check (server repo qa/L0_lifecycle).

Each test reproduces, with small models of its own, one thing lifecycle_test.py and its test.sh
found modelhost doing differently from Triton 2.51 (checked side by side with the real server):
- a model repository that cannot be read, with `--exit-on-error=false`: the server keeps its
  endpoints up, not live and not ready, and logs Triton's "failed to stat file" (it exits
  without the flag, as before: test_startup.py);
- a model that fails to poll (no config.pbtxt while auto-complete is off) is unknown to requests
  even when a version is named, and the log says Triton's "failed to open text file for read";
- a port already taken is logged with Triton's "failed to start <service> service" words
  (test_startup.py checks the whole line).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import free_port, serve

pytestmark = pytest.mark.modelhost_only

ADDSUB = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                   pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""

ADDSUB_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""


def _addsub(repo: Path, name: str, config: bool = True) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(ADDSUB)
    if config:
        (repo / name / "config.pbtxt").write_text(ADDSUB_CONFIG.format(name=name))


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# --- a model that fails to poll ------------------------------------------------------------

@pytest.fixture(scope="module")
def polled(tmp_path_factory) -> Iterator:
    repo = tmp_path_factory.mktemp("lifecycle") / "models"
    _addsub(repo, "good")
    _addsub(repo, "no_config", config=False)
    with serve(repo, "--strict-model-config=true") as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_that_failed_to_poll_is_unknown_even_by_version(polled, protocol):
    client = (httpclient.InferenceServerClient(polled.url) if protocol == "http"
              else grpcclient.InferenceServerClient(polled.grpc_url))
    for version in ("1", ""):
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("no_config", version)
        assert "Request for unknown model: 'no_config' is not found" in info.value.message()
    assert client.is_model_ready("good", "1")
    assert not client.is_model_ready("no_config", "1")


def test_missing_config_logged_with_tritons_words(polled):
    config = Path(polled.model_repository) / "no_config" / "config.pbtxt"
    assert (f"failed to open text file for read {config}: No such file or directory"
            in polled.log_text())


# --- a repository that cannot be read, --exit-on-error=false --------------------------------

def test_missing_repository_without_exit_on_error_serves_not_live(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "nowhere"
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "host", "serve", "--model-repository", str(missing),
             "--model-repository", str(empty), "--exit-on-error=false",
             "--strict-readiness=false", "--http-address", "127.0.0.1",
             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
             "--metrics-port", str(metrics_port), "--id", "triton"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if _status(f"{base}/v2") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert process.poll() is None, log_path.read_text()
        assert _status(f"{base}/v2/health/live") == 400
        assert _status(f"{base}/v2/health/ready") == 400
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert not grpc.is_server_live()
        assert not grpc.is_server_ready()
        assert grpc.get_server_metadata().name == "triton"
        assert f"failed to stat file {missing}" in log_path.read_text()
    finally:
        process.kill()
        process.wait()
