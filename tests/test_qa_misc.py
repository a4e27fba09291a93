"""Server-side behaviour that Triton's QA suites check (server repo qa/L0_response_cache,
qa/L0_server_status, qa/L0_metrics, qa/L0_warmup, qa/L0_response_statistics).

Each test reproduces, with small models of its own, one thing a QA suite found modelhost doing
differently from Triton 2.51 (checked side by side on the same models):
- L0_response_cache: the texts for --response-cache-byte-size with --cache-config and for two
  caches; a local cache of 200 bytes starts, and a response too large for it is a failed insert
  logged as Triton logs it ("Failed to insert key [...]"), each request a miss;
- L0_server_status: statistics of an unknown model or version are an invalid argument (400 /
  INVALID_ARGUMENT) with Triton's texts;
- L0_metrics: summary quantiles parse as Triton's std::stod ("0.1:0.0.1" keeps quantile 0.1),
  --model-namespacing=false is accepted, and a sequence batcher's queued requests count in
  nv_inference_pending_request_count;
- L0_warmup: model_warmup runs (it was refused): Triton's log lines, its error for a failing
  sample, decoupled models, data files, and the warmup counted in the statistics;
- L0_response_statistics: a native backend's per-response statistics (what Triton's `square`
  backend reports) are served by response index (they were dropped).
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.native.testing import build_library, compiler
from host.testing import ServerProcess, ServerStartError, serve, wait_until

pytestmark = pytest.mark.modelhost_only

NO_PROXY = {"http": "", "https": ""}

ADD_SUB = """
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

ADD_SUB_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

# A sequence model whose execute waits until the file named by the parameter GATE exists: the
# requests behind it stay queued for as long as the test wants.
GATED = """
import json, os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["GATE"]["string_value"]

    def execute(self, requests):
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

FAILING = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("An Error Occurred"))
                for _ in requests]
"""

DECOUPLED_ECHO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Records what the warmup sent (its strings, and the INPUT0 it saw), in the file named by SEEN.
RECORDER = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = json.loads(args["model_config"])["parameters"]["SEEN"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
            with open(self.seen, "a") as f:
                f.write(json.dumps([len(requests), [t.decode() for t in text.reshape(-1)],
                                    list(text.shape)]) + "\\n")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]))
        return out
"""


def _model(repo: Path, name: str, config: str, code: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{config}')
    (repo / name / "1" / "model.py").write_text(code)
    return repo / name


def _add_sub(batch: int = 8) -> np.ndarray:
    return np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)


def _infer_add_sub(client: httpclient.InferenceServerClient, model: str, x: np.ndarray,
                   version: str = "") -> None:
    inputs = [httpclient.InferInput("INPUT0", list(x.shape), "FP32"),
              httpclient.InferInput("INPUT1", list(x.shape), "FP32")]
    for i in inputs:
        i.set_data_from_numpy(x)
    result = client.infer(model, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("qa_misc_models")
    _model(repo, "addsub", "max_batch_size: 8\nversion_policy: { specific { versions: [ 1, 3 ] } }\n"
           + ADD_SUB_IO, ADD_SUB)
    (repo / "addsub" / "3").mkdir()
    (repo / "addsub" / "3" / "model.py").write_text(ADD_SUB)
    (repo / "addsub" / "2").mkdir()  # not in the policy: never loaded
    (repo / "addsub" / "2" / "model.py").write_text(ADD_SUB)
    gate = repo / "gate"
    _model(repo, "gated", f"""
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{ max_sequence_idle_microseconds: 60000000 }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "GATE" value: {{ string_value: "{gate}" }} }}
""", GATED)
    # warmup: a stateless sample (zeros and random data) and one skipped (batch_size 0)
    _model(repo, "warm", "max_batch_size: 8\n" + ADD_SUB_IO + """
model_warmup [
  { name: "regular sample" batch_size: 2 count: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } },
  { name: "skipped sample" batch_size: 0
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } }
]
""", ADD_SUB)
    _model(repo, "warm_failing", """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
model_warmup [ { name: "zero sample" batch_size: 1
  inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
""", FAILING)
    _model(repo, "warm_decoupled", """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
model_transaction_policy { decoupled: true }
model_warmup [ { name: "decoupled sample" batch_size: 1
  inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
""", DECOUPLED_ECHO)
    seen = repo / "seen.jsonl"
    folder = _model(repo, "warm_strings", f"""
max_batch_size: 4
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 2 ] }} ]
parameters {{ key: "SEEN" value: {{ string_value: "{seen}" }} }}
model_warmup [
  {{ name: "from file" batch_size: 3
     inputs {{ key: "TEXT" value: {{ data_type: TYPE_STRING dims: [ 2 ] input_data_file: "words" }} }} }},
  {{ name: "random strings" batch_size: 1
     inputs {{ key: "TEXT" value: {{ data_type: TYPE_STRING dims: [ 2 ] random_data: true }} }} }}
]
""", RECORDER)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "words").write_bytes(
        b"".join(struct.pack("<I", len(w)) + w for w in (b"hello", b"warm")))
    with serve(repo, "--log-verbose", "1", "--model-namespacing=false",
               "--metrics-config", "summary_latencies=true",
               "--metrics-config", "summary_quantiles=0.1:0.0.1,0.7:0.01,bad:0.1") as s:
        s.repo = repo  # type: ignore[attr-defined]
        yield s


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


# --- L0_server_status -------------------------------------------------------------------------

@pytest.mark.parametrize("name, version, text", [
    ("nosuch", "", "requested model 'nosuch' is not available"),
    ("addsub", "99", "requested model version is not available for model 'addsub'"),
    ("addsub", "2", "requested model version is not available for model 'addsub'"),
])
def test_statistics_of_an_unknown_model_or_version(http, grpc, name, version, text):
    with pytest.raises(InferenceServerException) as info:
        http.get_inference_statistics(name, version)
    assert (info.value.status(), info.value.message()) == ("400", text)
    with pytest.raises(InferenceServerException) as info:
        grpc.get_inference_statistics(name, version)
    assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", text)
    # metadata keeps its own texts (Triton's too)
    with pytest.raises(InferenceServerException) as info:
        http.get_model_metadata(name, version)
    assert info.value.message().startswith("Request for unknown model: ")


def test_statistics_of_the_loaded_versions(http):
    _infer_add_sub(http, "addsub", _add_sub(1), "3")
    stats = {s["version"]: s for s in http.get_inference_statistics("addsub")["model_stats"]}
    assert sorted(stats) == ["1", "3"]
    assert stats["1"]["inference_stats"]["success"]["count"] == 0
    assert stats["3"]["inference_stats"]["success"]["count"] >= 1
    (only,) = http.get_inference_statistics("addsub", "3")["model_stats"]
    assert only["version"] == "3"


# --- L0_metrics -------------------------------------------------------------------------------

def test_summary_quantiles_parse_as_stod(server, http):
    _infer_add_sub(http, "addsub", _add_sub(1))
    text = requests.get(server.metrics_url, proxies=NO_PROXY, timeout=10).text
    summary = [line for line in text.splitlines() if line.startswith("nv_inference_request_summary_us{")]
    assert summary
    assert any('quantile="0.1"' in line for line in summary)  # "0.1:0.0.1" is (0.1, 0.0)
    assert any('quantile="0.7"' in line for line in summary)
    assert not any('quantile="0.5"' in line for line in summary)  # the defaults were replaced
    assert "Invalid option: [bad:0.1]. Error: stod" in server.log_text()


def _pending(server: ServerProcess, model: str) -> float:
    text = requests.get(server.metrics_url, proxies=NO_PROXY, timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no pending count for {model}")


def test_sequence_batcher_pending_request_count(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list[object] = []
    done = threading.Event()

    def callback(result, error):
        results.append(error or result)
        if len(results) == 4:
            done.set()

    # On one stream: separate unary calls have no order on the server (HTTP/2 streams), and a
    # sequence's END must not overtake its START.
    client.start_stream(callback=callback)
    try:
        x = np.ones((1, 1), dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 1], "FP32")]
        inputs[0].set_data_from_numpy(x)
        assert _pending(server, "gated") == 0
        for n in range(4):  # two sequences, two requests each; the first execute blocks
            client.async_stream_infer("gated", inputs, sequence_id=1 + n % 2,
                                      sequence_start=n < 2, sequence_end=n >= 2)
        # one request executes (one slot), one waits in its sequence, two in the backlog
        wait_until(lambda: _pending(server, "gated") == 3, timeout=30, interval=0.05,
                   message="the queued sequence requests were not counted")
        (server.repo / "gate").touch()  # type: ignore[attr-defined]
        assert done.wait(30)
        assert all(not isinstance(r, Exception) for r in results)
        wait_until(lambda: _pending(server, "gated") == 0, timeout=30, interval=0.05,
                   message="the pending count did not drop back to 0")
    finally:
        client.stop_stream()
        client.close()


# --- L0_warmup --------------------------------------------------------------------------------

def test_warmup_runs_each_sample_and_counts_it(server, http):
    log = server.log_text()
    assert "model 'warm' instance warm_0 is running warmup sample 'regular sample' for iteration 1" in log
    assert "model 'warm' instance warm_0 is running warmup sample 'regular sample' for iteration 2" in log
    assert "Skipping batch 0 warmup sample 'skipped sample'" in log
    assert "is running warmup sample 'skipped sample'" not in log
    assert "failed to run warmup sample 'regular sample'" not in log
    (stats,) = http.get_inference_statistics("warm")["model_stats"]
    # two runs of two one-row requests, counted as Triton counts them
    assert (stats["inference_count"], stats["execution_count"]) == (4, 2)
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["batch_stats"][0]["batch_size"] == 2


def test_warmup_of_a_decoupled_model(server, http):
    assert "is running warmup sample 'decoupled sample' for iteration 1" in server.log_text()
    assert http.is_model_ready("warm_decoupled")


def test_a_failing_warmup_sample_fails_the_load(server, http):
    assert not http.is_model_ready("warm_failing")
    (entry,) = [m for m in http.get_model_repository_index() if m["name"] == "warm_failing"]
    assert entry["state"] == "UNAVAILABLE"
    assert "failed to run warmup sample 'zero sample': An Error Occurred; " in entry["reason"]
    assert "failed to run warmup sample 'zero sample': An Error Occurred;" in server.log_text()


def test_warmup_data_from_a_file_and_random_strings(server, http):
    lines = [json.loads(line) for line in
             (server.repo / "seen.jsonl").read_text().splitlines()]  # type: ignore[attr-defined]
    # "from file": three one-row requests in one execute, the file's strings; random BYTES data
    # is empty strings, as in Triton
    assert lines[:3] == [[3, ["hello", "warm"], [1, 2]]] * 3
    assert lines[3] == [1, ["", ""], [1, 2]]
    assert http.is_model_ready("warm_strings")


# --- L0_response_cache ------------------------------------------------------------------------

def test_a_response_larger_than_the_cache_is_a_failed_insert(tmp_path):
    repo = tmp_path / "models"
    _model(repo, "cached", "max_batch_size: 8\nresponse_cache { enable: true }\n" + ADD_SUB_IO,
           ADD_SUB)
    with serve(repo, "--cache-config", "local,size=200") as s:  # Triton 2.51 starts from 192
        client = httpclient.InferenceServerClient(s.url)
        try:
            for _ in range(2):
                _infer_add_sub(client, "cached", _add_sub(1))
            (stats,) = client.get_inference_statistics("cached")["model_stats"]
        finally:
            client.close()
        log = s.log_text()
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["cache_hit"]["count"] == 0
    assert "Failed to insert key [" in log
    assert "into response cache: Requested byte_size: " in log
    assert "is greater than total cache size: 200" in log


@pytest.mark.parametrize("args, message", [
    (["--response-cache-byte-size=12345", "--cache-config=local,size=67890"],
     "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
     "Please provide one or the other."),
    (["--cache-config=local,size=8192", "--cache-config=redis,key=value"],
     "found multiple cache configurations, but only a single cache is currently supported"),
    (["--cache-config=local,size=100"], "Failed to initialize LocalCache: size 100 is too small"),
])
def test_refused_server_settings(tmp_path, args, message):
    (tmp_path / "models").mkdir()
    with pytest.raises(ServerStartError) as info:
        ServerProcess(tmp_path / "models", *args).start(timeout=60, attempts=1)
    assert message in str(info.value)


# --- L0_response_statistics -------------------------------------------------------------------

def test_per_response_statistics_of_a_native_decoupled_backend(tmp_path):
    # What Triton's `square` test backend reports (TRITONBACKEND_ModelInstanceReportResponseStatistics),
    # aggregated by response index as Triton does, over HTTP and gRPC
    if compiler() is None:
        pytest.skip("no C compiler")
    backends = tmp_path / "backends"
    build_library(Path(__file__).parent / "native" / "response_stats.c",
                  backends / "response_stats" / "libtriton_response_stats.so")
    repo = tmp_path / "models"
    (repo / "counted" / "1").mkdir(parents=True)
    (repo / "counted" / "config.pbtxt").write_text("""
backend: "response_stats"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""")
    with serve(repo, "--backend-directory", str(backends)) as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        http_client = httpclient.InferenceServerClient(s.url)
        try:
            assert http_client.get_inference_statistics("counted")["model_stats"][0][
                "response_stats"] == {}
            for n in (4, 3):  # 2 + 1 successes, a failure each, an empty final response each
                responses: list[object] = []
                done = threading.Event()

                def callback(result, error, responses=responses, done=done):
                    responses.append(error or result)
                    if result is not None and result.get_response().parameters.get(
                            "triton_final_response", None) is not None:
                        if result.get_response().parameters["triton_final_response"].bool_param:
                            done.set()

                client.start_stream(callback)
                x = np.array([n], dtype=np.int32)
                inputs = [grpcclient.InferInput("IN", [1], "INT32")]
                inputs[0].set_data_from_numpy(x)
                client.async_stream_infer("counted", inputs, enable_empty_final_response=True)
                assert done.wait(30)
                client.stop_stream()
            by_http = http_client.get_inference_statistics("counted")["model_stats"][0]["response_stats"]
            by_grpc = client.get_inference_statistics("counted", as_json=True)["model_stats"][0][
                "response_stats"]
        finally:
            client.close()
            http_client.close()

    def counts(entry: dict) -> dict:
        return {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in entry.items()}

    ms = 1_000_000
    success = {"compute_infer": (1, 10 * ms), "compute_output": (1, 2 * ms), "success": (1, 12 * ms),
               "fail": (0, 0), "empty_response": (0, 0), "cancel": (0, 0)}
    fail = {"compute_infer": (1, 10 * ms), "compute_output": (0, 0), "success": (0, 0),
            "fail": (1, 10 * ms), "empty_response": (0, 0), "cancel": (0, 0)}
    empty = {"compute_infer": (1, 10 * ms), "compute_output": (0, 0), "success": (0, 0),
             "fail": (0, 0), "empty_response": (1, 10 * ms), "cancel": (0, 0)}

    def twice(entry: dict) -> dict:
        return {k: (c * 2, ns * 2) for k, (c, ns) in entry.items()}

    expected = {
        "0": twice(success),                                     # n=4 and n=3
        "1": {k: (a[0] + b[0], a[1] + b[1]) for (k, a), b in zip(success.items(), fail.values())},
        "2": {k: (a[0] + b[0], a[1] + b[1]) for (k, a), b in zip(fail.items(), empty.values())},
        "3": empty,                                              # n=4's empty final response
    }
    assert {i: counts(e) for i, e in by_http.items()} == expected
    assert {i: counts(e) for i, e in by_grpc.items()} == expected
