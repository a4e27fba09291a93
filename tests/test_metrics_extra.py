"""Triton's metric families beyond the counters (tests/test_metrics.py), from a real server:
pending requests, model load duration, CPU, and the latency summaries and histogram that
--metrics-config turns on (cache summaries included)."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from host.core import Host
from host.metrics import render, start_metrics_server
from host.options import ServerOptions
from host.testing import ServerProcess, serve, wait_until

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "obs_models"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SUMMARIES = ["nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us"]
CACHE_SUMMARIES = ["nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model"]
HISTOGRAM = "nv_inference_first_response_histogram_ms"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--load-model", "echo_cached", "--cache-config", "local,size=1048576",
               "--metrics-config", "summary_latencies=true",
               "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01",
               "--metrics-config", "histogram_latencies=true",
               "--metrics-interval-ms", "100") as process:
        yield process


def scrape(server: ServerProcess) -> dict:
    with _NO_PROXY.open(server.metrics_url, timeout=10) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def sample(families: dict, family: str, name: str | None = None, **labels: str) -> float:
    found = [s.value for s in families[family].samples
             if s.name == (name or family) and s.labels == labels]
    assert len(found) == 1, (family, name, labels, families[family].samples)
    return found[0]


def infer(server: ServerProcess, model: str, value: float = 0.0, delay: float | None = None) -> None:
    inputs = [httpclient.InferInput("IN", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.full(1, value, np.float32))
    if delay is not None:
        inputs.append(httpclient.InferInput("DELAY", [1], "FP32"))
        inputs[1].set_data_from_numpy(np.full(1, delay, np.float32))
    httpclient.InferenceServerClient(server.url, network_timeout=60).infer(model, inputs)


ECHO = {"model": "echo", "version": "1"}
CACHED = {"model": "echo_cached", "version": "1"}


def test_model_load_duration(server):
    families = scrape(server)
    assert families["nv_model_load_duration_secs"].type == "gauge"
    for labels in (ECHO, CACHED):
        # the model's initialize sleeps 0.2 s
        assert 0.2 <= sample(families, "nv_model_load_duration_secs", **labels) < 60


def test_cpu_utilization_and_memory(server):
    families = scrape(server)
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert families[name].type == "gauge"
    mem_total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo")
                     if line.startswith("MemTotal:"))
    assert sample(families, "nv_cpu_memory_total_bytes") == mem_total
    assert 0 < sample(families, "nv_cpu_memory_used_bytes") < mem_total
    # sampled every 100 ms (--metrics-interval-ms): the machine is never fully idle
    wait_until(lambda: 0 < sample(scrape(server), "nv_cpu_utilization") <= 1, timeout=10)


def test_pinned_memory_pool_gauges(server, tmp_path):
    families = scrape(server)
    assert sample(families, "nv_pinned_memory_pool_total_bytes") == 2**28  # Triton's default
    assert sample(families, "nv_pinned_memory_pool_used_bytes") == 0
    with serve(MODELS, "--model-control-mode", "explicit",
               "--pinned-memory-pool-byte-size", "1024") as process:
        assert sample(scrape(process), "nv_pinned_memory_pool_total_bytes") == 1024


def test_pending_request_count(server):
    families = scrape(server)
    assert families["nv_inference_pending_request_count"].type == "gauge"
    assert sample(families, "nv_inference_pending_request_count", **ECHO) == 0
    with ThreadPoolExecutor(3) as pool:
        # one instance: while the first request runs, the other two wait
        futures = [pool.submit(infer, server, "echo", delay=1.0) for _ in range(3)]
        wait_until(lambda: sample(scrape(server), "nv_inference_pending_request_count", **ECHO) == 2,
                   timeout=30)
        for f in futures:
            f.result()
    assert sample(scrape(server), "nv_inference_pending_request_count", **ECHO) == 0


def test_latency_summaries_and_first_response_histogram(server):
    before = scrape(server)
    for name in SUMMARIES:
        assert before[name].type == "summary", name
    assert before[HISTOGRAM].type == "histogram"
    for _ in range(3):
        infer(server, "echo")
    after = scrape(server)
    for name in SUMMARIES:
        count = sample(after, name, name + "_count", **ECHO)
        assert count == sample(before, name, name + "_count", **ECHO) + 3, name
        assert sample(after, name, name + "_sum", **ECHO) >= sample(before, name, name + "_sum", **ECHO)
        quantiles = {s.labels["quantile"]: s.value for s in after[name].samples
                     if s.name == name and s.labels["model"] == "echo"}
        assert set(quantiles) == {"0.5", "0.9"}  # summary_quantiles
        assert 0 <= quantiles["0.5"] <= quantiles["0.9"]
    buckets = {s.labels["le"]: s.value for s in after[HISTOGRAM].samples
               if s.name == HISTOGRAM + "_bucket" and s.labels["model"] == "echo"}
    assert list(buckets) == ["100", "500", "2000", "5000", "+Inf"]  # Triton's default buckets, ms
    assert list(buckets.values()) == sorted(buckets.values())
    assert buckets["+Inf"] == sample(after, HISTOGRAM, HISTOGRAM + "_count", **ECHO) == \
        sample(before, HISTOGRAM, HISTOGRAM + "_count", **ECHO) + 3


def test_cache_summaries(server):
    before = scrape(server)
    infer(server, "echo_cached", value=42.0)  # a miss (inserted)
    infer(server, "echo_cached", value=42.0)  # a hit
    after = scrape(server)
    for name in CACHE_SUMMARIES:
        count = sample(after, name, name + "_count", **CACHED)
        assert count == sample(before, name, name + "_count", **CACHED) + 1, name
        assert not [s for s in after[name].samples if s.labels["model"] == "echo"]
    # As Triton: no request summary for a model with the cache (its FIXME DLIS-4762).
    assert not [s for s in after["nv_inference_request_summary_us"].samples
                if s.labels["model"] == "echo_cached"]


def test_counter_latencies_off_and_cpu_metrics_off(tmp_path):
    host = Host(ServerOptions(model_repositories=[tmp_path], allow_cpu_metrics=False,
                              metrics_config={"counter_latencies": "false"}))
    host.start()
    metrics = start_metrics_server(host, "127.0.0.1", 0)
    try:
        text = render(metrics.registry).decode()
    finally:
        metrics.stop()
        host.stop()
    assert "# TYPE nv_inference_request_success counter" in text
    assert "nv_inference_request_duration_us" not in text and "_duration_us" not in text
    assert "nv_cpu_" not in text
