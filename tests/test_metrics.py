"""Prometheus metrics under Triton's names (host.metrics), scraped over HTTP from a real server.

One in-process Host serves the example `model_repository/` over the HTTP front end, with the
metrics endpoint beside it; requests go through `tritonclient.http`, /metrics is read with urllib
and parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from host.core import Host
from host.http.app import create_app
from host.http.server import serve
from host.metrics import CONTENT_TYPE, render, start_metrics_server
from host.options import ServerOptions

pytestmark = pytest.mark.modelhost_only

MODEL_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# Triton's per-model families (docs/user_guide/metrics.md), all counters.
INFERENCE_FAMILIES = [
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
]
CACHE_FAMILIES = ["nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model",
                  "nv_cache_hit_duration_per_model", "nv_cache_miss_duration_per_model"]
REASONS = ["REJECTED", "CANCELED", "BACKEND", "OTHER"]
# Gauges: per model, and of the machine (tests/test_observability_metrics.py checks their values).
GAUGE_FAMILIES = ["nv_inference_pending_request_count", "nv_model_load_duration_secs"]
PINNED_FAMILIES = ["nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes"]  # server-wide
CPU_FAMILIES = ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"]


class Stack:
    def __init__(self) -> None:
        self.host = Host(ServerOptions(model_repositories=[MODEL_REPOSITORY]))
        assert self.host.start() == {}
        self.http = serve(create_app(self.host), "127.0.0.1", 0)
        self.metrics = start_metrics_server(self.host, "127.0.0.1", 0)
        self.url = f"127.0.0.1:{self.http.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics.port}/metrics"

    def close(self) -> None:
        self.metrics.stop()
        self.http.shutdown(5)
        self.host.stop()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    s = Stack()
    yield s
    s.close()


@pytest.fixture
def client(stack: Stack) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(stack.url, network_timeout=30.0)
    yield triton
    triton.close()


def scrape_text(stack: Stack) -> str:
    with _NO_PROXY.open(stack.metrics_url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE
        return response.read().decode()


def scrape(stack: Stack) -> dict[str, object]:
    """Family name -> prometheus_client Metric, from the live endpoint."""
    return {f.name: f for f in text_string_to_metric_families(scrape_text(stack))}


def value(families, name: str, model: str, **labels: str) -> float:
    want = {"model": model, "version": "1", **labels}
    found = [s.value for s in families[name].samples if s.labels == want]
    assert len(found) == 1, (name, want, families[name].samples)
    return found[0]


def simple_inputs(rows: int) -> list[httpclient.InferInput]:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    inputs = [httpclient.InferInput("INPUT0", [rows, 16], "INT32"),
              httpclient.InferInput("INPUT1", [rows, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs


# --- names, types, labels ------------------------------------------------------------------------

def test_families_have_tritons_names_types_and_labels(stack):
    text = scrape_text(stack)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    models = {m["name"] for m in stack.host.statistics()["model_stats"]}
    # every loaded model of the example repository (which grows), the python ones at least
    assert models == {r["name"] for r in stack.host.repository_index() if r.get("state") == "READY"}
    assert models >= {"simple", "simple_string", "simple_identity", "identity_fp32", "batched_add",
                      "repeat_int32"}
    for name in INFERENCE_FAMILIES:
        assert families[name].type == "counter", name
        assert f"# TYPE {name} counter\n" in text
        assert families[name].documentation
        if name == "nv_inference_request_failure":
            labels = [s.labels for s in families[name].samples]
            assert sorted((l["model"], l["reason"]) for l in labels) == sorted(
                (m, r) for m in models for r in REASONS)
            assert all(l["version"] == "1" and set(l) == {"model", "reason", "version"} for l in labels)
        else:
            assert sorted(s.labels["model"] for s in families[name].samples) == sorted(models)
            assert all(set(s.labels) == {"model", "version"} and s.labels["version"] == "1"
                       for s in families[name].samples)
    # Exactly Triton's sample names: no `_total` appended to the counters.
    # Cache families only for the models with the response cache enabled (Triton shows them
    # only then): onnx_cached in the example repository.
    cached = {m for m in models if stack.host.model_config(m).response_cache.enable}
    assert cached == {"onnx_cached"} or "onnx_cached" not in models
    for name in CACHE_FAMILIES:
        assert {s.labels["model"] for s in families[name].samples} == cached if cached else (
            name not in families)
    samples = [line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line and not line.startswith("#")]
    assert set(samples) == (set(INFERENCE_FAMILIES) | set(GAUGE_FAMILIES) | set(CPU_FAMILIES)
                            | set(PINNED_FAMILIES) | (set(CACHE_FAMILIES) if cached else set()))
    for name in GAUGE_FAMILIES + CPU_FAMILIES + PINNED_FAMILIES:
        assert families[name].type == "gauge", name
    assert "_total " not in text and "_total{" not in text


# --- counters move by the right amounts ------------------------------------------------------------

def test_successful_requests_move_counts_and_durations(stack, client):
    before = scrape(stack)
    requests, rows = 3, 2
    for _ in range(requests):
        client.infer("simple", simple_inputs(rows))
    after = scrape(stack)

    def delta(name: str) -> float:
        return value(after, name, "simple") - value(before, name, "simple")

    assert delta("nv_inference_request_success") == requests
    assert delta("nv_inference_count") == requests * rows  # rows, not requests
    assert delta("nv_inference_exec_count") == requests  # no dynamic batching: one execute each
    for reason in REASONS:
        assert (value(after, "nv_inference_request_failure", "simple", reason=reason)
                == value(before, "nv_inference_request_failure", "simple", reason=reason))
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_compute_infer_duration_us") > 0
    for name in ("nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
                 "nv_inference_compute_output_duration_us"):
        assert delta(name) >= 0
    # The request takes at least as long as the model's execute.
    # (each is the floor of a cumulative sum in µs: allow 1 for the rounding)
    assert delta("nv_inference_request_duration_us") >= delta("nv_inference_compute_infer_duration_us") - 1
    # Other models did not move.
    assert value(after, "nv_inference_request_success", "identity_fp32") == \
        value(before, "nv_inference_request_success", "identity_fp32")


def test_metrics_equal_the_statistics_extension(stack, client):
    client.infer("simple", simple_inputs(1))
    families = scrape(stack)
    (stats,) = client.get_inference_statistics("simple")["model_stats"]
    inf = stats["inference_stats"]
    assert value(families, "nv_inference_request_success", "simple") == inf["success"]["count"]
    assert value(families, "nv_inference_count", "simple") == stats["inference_count"]
    assert value(families, "nv_inference_exec_count", "simple") == stats["execution_count"]
    assert value(families, "nv_inference_request_duration_us", "simple") == inf["success"]["ns"] // 1000
    assert value(families, "nv_inference_queue_duration_us", "simple") == inf["queue"]["ns"] // 1000
    for part in ("input", "infer", "output"):
        assert value(families, f"nv_inference_compute_{part}_duration_us", "simple") == \
            inf[f"compute_{part}"]["ns"] // 1000
    assert sum(value(families, "nv_inference_request_failure", "simple", reason=r) for r in REASONS) \
        == inf["fail"]["count"]


def test_dynamic_batching_counts_rows_and_executions(stack):
    name, clients = "batched_add", 8
    before = scrape(stack)
    barrier = threading.Barrier(clients)
    failures: list[BaseException] = []

    def send(index: int) -> None:
        triton = httpclient.InferenceServerClient(stack.url, network_timeout=30.0)
        try:
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.full((1, 4), index, dtype=np.float32))
            assert triton.is_model_ready(name)  # connected before the barrier
            barrier.wait(10)
            triton.infer(name, [tensor])
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            triton.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not failures, failures
    after = scrape(stack)  # every client has its answer: each execute is counted already

    def delta(metric: str) -> float:
        return value(after, metric, name) - value(before, metric, name)

    assert delta("nv_inference_request_success") == clients
    assert delta("nv_inference_count") == clients
    executions = delta("nv_inference_exec_count")
    assert 1 <= executions <= clients
    (stats,) = stack.host.statistics(name)["model_stats"]
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"]) == \
        stats["inference_count"]


def test_error_response_of_a_python_model_counts_as_success(stack, client):
    """simple_string (a python model) answers a non-number with an error response: Triton's
    python backend reports that request as a success (checked on 2.51; only an exception from
    execute is a failure, reason BACKEND)."""
    before = scrape(stack)
    strings = np.array([[b"x"] + [b"1"] * 15], dtype=np.object_)
    inputs = []
    for input_name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(input_name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(strings)
        inputs.append(tensor)
    with pytest.raises(InferenceServerException, match="decimal integers"):
        client.infer("simple_string", inputs)
    after = scrape(stack)
    m = "simple_string"
    for reason in ("BACKEND", "REJECTED", "CANCELED", "OTHER"):
        assert value(after, "nv_inference_request_failure", m, reason=reason) == \
            value(before, "nv_inference_request_failure", m, reason=reason)
    for name in ("nv_inference_request_success", "nv_inference_count"):
        assert value(after, name, m) == value(before, name, m) + 1, name
    assert value(after, "nv_inference_exec_count", m) == value(before, "nv_inference_exec_count", m) + 1


def test_request_rejected_before_scheduling_is_not_counted(stack, client):
    """As in Triton, a request refused by validation (400) never reaches the model's statistics."""
    def simple_lines() -> list[str]:
        return [line for line in scrape_text(stack).splitlines() if 'model="simple"' in line]

    before = simple_lines()
    assert len(before) == len(INFERENCE_FAMILIES) - 1 + len(REASONS) + len(GAUGE_FAMILIES)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    with pytest.raises(InferenceServerException, match="INT32"):
        client.infer("simple", inputs)
    assert simple_lines() == before


def test_cache_families_appear_with_cache_statistics():
    """The cache families show the models that have cache statistics (their own host: the shared
    one must keep showing none)."""
    host = Host(ServerOptions(model_repositories=[MODEL_REPOSITORY], model_control_mode="explicit",
                              load_models=["identity_fp32", "simple"]))
    host.start()
    handle = start_metrics_server(host, "127.0.0.1", 0)
    try:
        stats = host.manager.get("identity_fp32").stats
        stats.cache_hit(5_000)
        stats.cache_hit(7_000)
        stats.cache_miss(3_500)
        with _NO_PROXY.open(handle.url, timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    finally:
        handle.stop()
        host.stop()
    for name in CACHE_FAMILIES:
        assert families[name].type == "counter"
        assert [s.labels["model"] for s in families[name].samples] == ["identity_fp32"]
    assert value(families, "nv_cache_num_hits_per_model", "identity_fp32") == 2
    assert value(families, "nv_cache_hit_duration_per_model", "identity_fp32") == 12
    assert value(families, "nv_cache_num_misses_per_model", "identity_fp32") == 1
    assert value(families, "nv_cache_miss_duration_per_model", "identity_fp32") == 3
    # A cache hit is a success of its own kind: neither an inference nor an execution.
    assert value(families, "nv_inference_count", "identity_fp32") == 0
    assert value(families, "nv_inference_exec_count", "identity_fp32") == 0


# --- the endpoint ----------------------------------------------------------------------------------

def _status(url: str, method: str = "GET") -> int:
    try:
        with _NO_PROXY.open(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_endpoint_paths_and_methods(stack):
    base = f"http://127.0.0.1:{stack.metrics.port}"
    assert _status(base + "/metrics") == 200
    assert _status(base + "/metrics", "HEAD") == 200
    assert _status(base + "/") == 404
    assert _status(base + "/metrics/extra") == 404
    assert _status(base + "/v2/health/ready") == 404
    assert _status(base + "/metrics", "POST") == 405


def test_stop_releases_the_port():
    host = Host(ServerOptions(model_repositories=[MODEL_REPOSITORY], model_control_mode="explicit"))
    host.start()
    handle = start_metrics_server(host, "127.0.0.1", 0)
    try:
        assert _status(f"http://127.0.0.1:{handle.port}/metrics") == 200
        assert text_string_to_metric_families(
            _NO_PROXY.open(handle.url, timeout=10).read().decode()) is not None
    finally:
        handle.stop()
        host.stop()
    with pytest.raises(urllib.error.URLError):
        _NO_PROXY.open(f"http://127.0.0.1:{handle.port}/metrics", timeout=2)


# --- the exposition itself -------------------------------------------------------------------------

class _Fixed:
    def __init__(self, *families) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def test_render_keeps_counter_names_and_escapes_labels():
    counter = CounterMetricFamily("nv_inference_count", "rows\nand \\ more", labels=["model", "version"])
    counter.add_metric(['we"ird\\name\n', "1"], 3)
    gauge = GaugeMetricFamily("nv_something_gauge", "a gauge", labels=["model"])
    gauge.add_metric(["m"], 0.25)
    text = render(_Fixed(counter, gauge)).decode()
    assert text == (
        "# HELP nv_inference_count rows\\nand \\\\ more\n"
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="we\\"ird\\\\name\\n",version="1"} 3\n'
        "# HELP nv_something_gauge a gauge\n"
        "# TYPE nv_something_gauge gauge\n"
        'nv_something_gauge{model="m"} 0.25\n')
    (parsed, parsed_gauge) = text_string_to_metric_families(text)
    assert parsed.name == "nv_inference_count" and parsed.type == "counter"
    assert parsed.samples[0].labels == {"model": 'we"ird\\name\n', "version": "1"}
    assert parsed.samples[0].value == 3 and parsed_gauge.samples[0].value == 0.25
