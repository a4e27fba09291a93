"""Model lifecycle behaviour that Triton's QA tests check (server repo qa/L0_lifecycle).

Each test reproduces, with small models of its own, one thing lifecycle_test.py and its test.sh
found modelhost doing differently from Triton 2.51 (checked side by side with the real server):
- a model repository that cannot be read, with `--exit-on-error=false`: the server keeps its
  endpoints up, not live and not ready, and logs Triton's "failed to stat file" (it exits
  without the flag, as before: test_startup.py);
- a model that fails to poll (no config.pbtxt while auto-complete is off) is unknown to requests
  even when a version is named, and the log says Triton's "failed to open text file for read";
- a port already taken is logged with Triton's "failed to start <service> service" words
  (test_startup.py checks the whole line);
- a load that fails for one version releases the versions it loaded; a model without a loadable
  version is a load failure (400), not a poll failure; requests for a model or version Triton
  once tried answer "has no available versions" / "is not at ready state";
- a model found in two repositories is listed UNAVAILABLE, "model appears in two or more
  repositories"; --load-model of a model in no repository logs Triton's words;
- a load without a config override keeps the last override while the model's files are
  unchanged; --model-load-retry-count; --model-load-gpu-limit checked with Triton's texts;
- qa/L0_model_queue: a preferred batch size that can be formed runs at once (also once an
  expired request left the queue); priority_levels up to 2^64-1; a queue-policy timeout is
  counted as REJECTED.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
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
    _addsub(repo, "lettered")
    (repo / "lettered" / "abc").mkdir()  # not a version: ignored, with Triton's warning
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


def test_version_folder_that_is_not_a_number_is_ignored(polled):
    client = httpclient.InferenceServerClient(polled.url)
    assert client.get_model_metadata("lettered")["versions"] == ["1"]
    assert ("ignore version directory 'abc' which fails to convert to integral number"
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
        grpc.close()
        assert f"failed to stat file {missing}" in log_path.read_text()
    finally:
        process.kill()
        process.wait()


# --- explicit control: failed loads, unloads, overrides, retries ------------------------------

FAIL_ONCE = ADDSUB.replace("class TritonPythonModel:", """class TritonPythonModel:
    def initialize(self, args):
        import os
        marker = os.path.join(args["model_repository"], args["model_version"], "tried")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise Exception("failing first load attempt")
""")


COUNTED = ADDSUB.replace("class TritonPythonModel:", """class TritonPythonModel:
    def initialize(self, args):
        import os
        outside = os.path.dirname(os.path.dirname(args["model_repository"]))  # not in the model
        with open(os.path.join(outside, "initialized"), "a") as f:
            f.write(args["model_version"] + "\\n")
""")


@pytest.fixture(scope="module")
def explicit(tmp_path_factory) -> Iterator:
    root = tmp_path_factory.mktemp("explicit")
    repo, other = root / "models", root / "others"
    _addsub(repo, "good")
    _addsub(repo, "partial")  # versions 1 and 3; 3 cannot load (no model.py)
    (repo / "partial" / "3").mkdir()
    with open(repo / "partial" / "config.pbtxt", "a") as f:
        f.write("version_policy: { all { } }\n")
    (repo / "nover").mkdir()
    (repo / "nover" / "config.pbtxt").write_text(ADDSUB_CONFIG.format(name="nover"))
    _addsub(repo, "twice")
    _addsub(other, "twice")  # the same name in the second repository
    _addsub(repo, "flaky")
    (repo / "flaky" / "1" / "model.py").write_text(FAIL_ONCE)
    _addsub(repo, "single")
    _addsub(repo, "counted")  # versions 1 and 2, each counts its initialize calls
    (repo / "counted" / "2").mkdir()
    (repo / "counted" / "1" / "model.py").write_text(COUNTED)
    (repo / "counted" / "2" / "model.py").write_text(COUNTED)
    with open(repo / "counted" / "config.pbtxt", "a") as f:
        f.write("version_policy: { all { } }\n")
    with serve(repo, "--model-repository", str(other), "--model-control-mode=explicit",
               "--load-model=good", "--load-model=does-not-exist",
               "--model-load-retry-count=1") as server:
        yield server


def _message(call, *args, **kwargs) -> str:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value.message()


def _index(client) -> dict[tuple[str, str], dict]:
    return {(m["name"], m.get("version", "")): m for m in client.get_model_repository_index()}


def test_failed_version_releases_the_versions_loaded_with_it(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    message = _message(client.load_model, "partial")
    assert message.startswith("load failed for model 'partial': version 3 is at UNAVAILABLE state")
    assert not client.is_model_ready("partial", "1")
    index = _index(client)
    assert index[("partial", "1")]["state"] == "UNAVAILABLE"
    assert index[("partial", "1")]["reason"] == "unloaded"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("partial")
    assert info.value.message() == "Request for unknown model: 'partial' has no available versions"
    assert info.value.status() == "404"  # NOT_FOUND, as Triton's


def test_model_without_versions_is_a_load_failure(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    assert _message(client.load_model, "nover") == (
        "load failed for model 'nover': at least one version must be available under the "
        "version policy of model 'nover'\n")
    assert (_message(client.get_model_metadata, "nover")
            == "Request for unknown model: 'nover' has no available versions")
    assert (_message(client.get_model_metadata, "nover", "1")
            == "Request for unknown model: 'nover' version 1 is not found")


def test_unloaded_model_has_no_available_versions(explicit):
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    client.load_model("good")
    client.unload_model("good")
    try:
        assert (_message(client.get_model_metadata, "good")
                == "Request for unknown model: 'good' has no available versions")
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata("good", "1")
        assert info.value.message() == ("Request for unknown model: 'good' version 1 is not at "
                                        "ready state")
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert (_message(client.get_model_metadata, "good", "7")
                == "Request for unknown model: 'good' version 7 is not found")
        # the index goes on listing the version, as Triton's does (checked on 2.51)
        index = _index(httpclient.InferenceServerClient(explicit.url))
        assert index[("good", "1")] == {"name": "good", "version": "1", "state": "UNAVAILABLE",
                                        "reason": "unloaded"}
        assert ("good", "") not in index
    finally:
        client.load_model("good")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unloading_an_unknown_model_succeeds(explicit, protocol):
    client = (httpclient.InferenceServerClient(explicit.url) if protocol == "http"
              else grpcclient.InferenceServerClient(explicit.grpc_url))
    client.unload_model("unknown_model")  # as Triton: no error


def test_model_in_two_repositories(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    entry = _index(client)[("twice", "")]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == "model appears in two or more repositories"


def test_load_model_of_no_repository_logged(explicit):
    assert ("failed to poll model 'does-not-exist': model not found in any model repository."
            in explicit.log_text())


def test_reload_keeps_the_config_override_while_files_are_unchanged(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("good", config=json.dumps({"backend": "python", "max_batch_size": 4}))
    client.load_model("good")
    assert client.get_model_config("good")["max_batch_size"] == 4
    config = Path(explicit.model_repository) / "good" / "config.pbtxt"
    later = config.stat().st_mtime_ns + 1_000_000_000
    os.utime(config, ns=(later, later))  # newer files: the repository's configuration again
    client.load_model("good")
    assert client.get_model_config("good")["max_batch_size"] == 8


def test_config_override_takes_one_value_for_a_list(explicit):
    # as protobuf's C++ JSON parser in Triton: "instance_group": {...} is a list of one
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("single", config=json.dumps(
        {"backend": "python", "instance_group": {"kind": "KIND_CPU", "count": 2}}))
    groups = client.get_model_config("single")["instance_group"]
    assert [(g["kind"], g["count"]) for g in groups] == [("KIND_CPU", 2)]


def test_load_retry(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("flaky")  # fails once, then loads (--model-load-retry-count=1)
    assert client.is_model_ready("flaky", "1")
    assert "failed to load 'flaky' version 1, retrying" in explicit.log_text()


def test_reload_keeps_unchanged_versions(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    folder = Path(explicit.model_repository) / "counted"
    counts = folder.parent.parent / "initialized"
    client.load_model("counted")
    client.load_model("counted")  # nothing changed: nothing is loaded again
    assert sorted(counts.read_text().split()) == ["1", "2"]
    model = folder / "2" / "model.py"
    later = model.stat().st_mtime_ns + 1_000_000_000
    os.utime(model, ns=(later, later))
    client.load_model("counted")  # version 2 changed: only it is loaded again
    assert sorted(counts.read_text().split()) == ["1", "2", "2"]
    assert client.is_model_ready("counted", "1") and client.is_model_ready("counted", "2")


ENSEMBLE_CONFIG = """
name: "pair"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "part" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""


def test_strict_readiness_after_a_composing_model_is_unloaded(tmp_path):
    repo = tmp_path / "models"
    _addsub(repo, "part")
    (repo / "pair" / "1").mkdir(parents=True)
    (repo / "pair" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with serve(repo, "--model-control-mode=explicit", "--strict-readiness=true") as server:
        client = httpclient.InferenceServerClient(server.url)
        client.load_model("pair")
        client.unload_model("part")
        assert not client.is_model_ready("pair")
        assert client.is_server_ready()  # unloaded, not failed: readiness stands (Triton)


@pytest.mark.parametrize("limit, text", [
    ("-1:0.6", "expects device ID >= 0, got -1"),
    ("0:-0.4", "expects limit fraction to be in range [0.0, 1.0], got -0.400000"),
])
def test_model_load_gpu_limit_checked(tmp_path, limit, text):
    result = subprocess.run(
        [sys.executable, "-m", "host", "serve", "--model-repository", str(tmp_path),
         "--http-port", str(free_port()), "--model-load-gpu-limit", limit],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"error: setting model load GPU limit: Invalid argument - {text}" in result.stderr


# --- the dynamic batcher's queue (qa/L0_model_queue) ----------------------------------------

# OUT: the number of rows of the batch the request was executed in.
ROWS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        ins = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() for r in requests]
        rows = sum(len(x) for x in ins)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(x.shape, rows, np.int32))])
                for x in ins]
"""

ROWS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
dynamic_batching {{
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 60000000
  {extra}
}}
"""


def _rows_model(repo: Path, name: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(ROWS)
    (repo / name / "config.pbtxt").write_text(ROWS_CONFIG.format(name=name, extra=extra))


@pytest.fixture(scope="module")
def queued(tmp_path_factory) -> Iterator:
    repo = tmp_path_factory.mktemp("queue") / "models"
    _rows_model(repo, "plain", "")
    _rows_model(repo, "reject", "default_queue_policy { default_timeout_microseconds: 100000 }")
    _rows_model(repo, "override", "default_queue_policy { allow_timeout_override: true "
                                  "default_timeout_microseconds: 50000000 }")
    _rows_model(repo, "levels", "priority_levels: 18446744073709551615 "
                                "default_priority_level: 4294967296")
    with serve(repo) as server:
        yield server


def _infer(url: str, model: str, rows: int, results: list, **kwargs) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=30.0)
    data = np.ones((rows, 1), np.int32)
    inputs = [httpclient.InferInput("IN", [rows, 1], "INT32")]
    inputs[0].set_data_from_numpy(data)
    try:
        results.append(int(client.infer(model, inputs, **kwargs).as_numpy("OUT")[0, 0]))
    except InferenceServerException as exc:
        results.append(exc)
    finally:
        client.close()  # in its own thread (gevent's pool belongs to it)


def _concurrently(*calls) -> None:
    threads = [threading.Thread(target=_infer, args=args, kwargs=kwargs) for args, kwargs in calls]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(40)


def test_preferred_batch_size_runs_at_once(queued):
    # 2 + 2 rows make the preferred size 4: executed together, not after the 60 s queue delay
    # (the client gives up after 30 s)
    results: list = []
    _concurrently(((queued.url, "plain", 2, results), {}), ((queued.url, "plain", 2, results), {}))
    assert results == [4, 4]


def test_queue_policy_timeout_is_rejected_and_counted(queued):
    results: list = []
    _infer(queued.url, "reject", 1, results)
    assert isinstance(results[0], InferenceServerException)
    assert results[0].message() == "Request timeout expired"
    with urllib.request.urlopen(queued.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_failure{model="reject",reason="REJECTED",version="1"} 1' in metrics


def test_requests_left_after_a_rejection_make_a_batch(queued):
    # 1 row that expires after 1 s (its own timeout), then 2 + 2 rows: 1, 3, 5 is no preferred
    # size; once the first is rejected, 2 + 2 runs at once
    results: list = []
    _concurrently(((queued.url, "override", 1, results), {"timeout": 1000000}),
                  ((queued.url, "override", 2, results), {}),
                  ((queued.url, "override", 2, results), {}))
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert [e.message() for e in errors] == ["Request timeout expired"]
    assert sorted(r for r in results if not isinstance(r, InferenceServerException)) == [4, 4]


def test_huge_priority_levels(queued):
    results: list = []
    _concurrently(((queued.url, "levels", 2, results), {"priority": 3}),
                  ((queued.url, "levels", 2, results), {"priority": 3}))
    assert results == [4, 4]
