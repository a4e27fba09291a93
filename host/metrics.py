"""Prometheus metrics under Triton's names, read from the host's statistics at scrape time.

    handle = start_metrics_server(host, "0.0.0.0", 8002)   # GET /metrics
    ...
    handle.stop()

Nothing is counted on the request path for the metrics: `TritonCollector` turns
`Host.statistics()` (the counters of `host.stats`, kept for the statistics extension anyway) into
metric families each time it is scraped. Names, types and labels are Triton's
(docs/user_guide/metrics.md), so dashboards and alerts written for Triton work unchanged:

    counter nv_inference_request_success{model,version}       successful requests
    counter nv_inference_request_failure{model,reason,version} failed requests, by reason:
                                                              REJECTED, CANCELED, BACKEND, OTHER
    counter nv_inference_count{model,version}                 rows inferred (successful, not cached)
    counter nv_inference_exec_count{model,version}            executes (batches)
    counter nv_inference_request_duration_us{model,version}   end-to-end time of successful requests
    counter nv_inference_queue_duration_us{model,version}     queue time
    counter nv_inference_compute_input_duration_us, nv_inference_compute_infer_duration_us,
            nv_inference_compute_output_duration_us {model,version}
    counter nv_cache_num_hits_per_model, nv_cache_num_misses_per_model,
            nv_cache_hit_duration_per_model, nv_cache_miss_duration_per_model {model,version}
            (only for models with `response_cache { enable: true }`, or once they count something)
    ...and whatever families a loaded model's backend adds (`host.backend.Model.metrics`; the
    `inflight` backend's `nv_trt_llm_*` gauges), merged by name across models

Triton's counters carry no `_total` suffix (prometheus-cpp writes `# TYPE nv_inference_count
counter` and samples named `nv_inference_count`). prometheus_client's own exposition appends
`_total` to every counter, which would rename all of them, so `render()` writes the text format
itself from the collector's families, keeping the counter type and Triton's exact names; that is
valid Prometheus text format 0.0.4 (`_total` is only a convention there), what Triton serves, and
`prometheus_client.parser` reads it back as counters. Registering `TritonCollector` in another
prometheus_client registry also works, but its exposition would then add `_total`.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric

from host.options import ServerOptions
from host.stats import FAILURE_REASONS

if TYPE_CHECKING:
    from host.core import Host
    from host.http.server import HTTPServer

__all__ = ["CONTENT_TYPE", "MetricsServer", "TritonCollector", "make_registry", "make_wsgi_app",
           "render", "start_metrics_server"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ["model", "version"]

# (metric name, help, value from one model's statistics dict)
_Getter = Callable[[dict[str, Any]], int]
_INFERENCE: list[tuple[str, str, _Getter]] = [
    ("nv_inference_request_success",
     "Successful inference requests (a request counts once, whatever its batch size)",
     lambda m: m["inference_stats"]["success"]["count"]),
    ("nv_inference_count",
     "Inferences performed: the rows of successful requests (a batch of n counts n), cache hits excluded",
     lambda m: m["inference_count"]),
    ("nv_inference_exec_count",
     "Model executions (batches) performed, cache hits excluded",
     lambda m: m["execution_count"]),
    ("nv_inference_request_duration_us",
     "Cumulative end-to-end duration of successful inference requests, in microseconds "
     "(cache hits included)",
     lambda m: m["inference_stats"]["success"]["ns"] // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative time requests waited in the scheduling queue, in microseconds (cache hits included)",
     lambda m: m["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative time spent preparing the inputs of executed requests, in microseconds "
     "(cache hits excluded)",
     lambda m: m["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative time spent executing the model for requests, in microseconds (cache hits excluded)",
     lambda m: m["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative time spent handling the outputs of executed requests, in microseconds "
     "(cache hits excluded)",
     lambda m: m["inference_stats"]["compute_output"]["ns"] // 1000),
]
_FAILURE = ("nv_inference_request_failure",
            "Failed inference requests, by reason (a request counts once, whatever its batch size)")
_CACHE: list[tuple[str, str, _Getter]] = [
    ("nv_cache_num_hits_per_model", "Response cache hits of the model",
     lambda m: m["inference_stats"]["cache_hit"]["count"]),
    ("nv_cache_num_misses_per_model", "Response cache misses of the model",
     lambda m: m["inference_stats"]["cache_miss"]["count"]),
    ("nv_cache_hit_duration_per_model",
     "Cumulative time spent looking up and copying out cached responses on hits, in microseconds",
     lambda m: m["inference_stats"]["cache_hit"]["ns"] // 1000),
    ("nv_cache_miss_duration_per_model",
     "Cumulative time spent looking up and inserting responses on cache misses, in microseconds",
     lambda m: m["inference_stats"]["cache_miss"]["ns"] // 1000),
]


class TritonCollector:
    """A prometheus_client collector: Triton's per-model metrics from `host.statistics()`."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def describe(self) -> list[Metric]:
        return []  # names are per scrape; registering must not scrape

    def collect(self) -> Iterator[Metric]:
        families = self._collect()
        if getattr(self.host.manager, "namespaced", False):  # --model-namespacing
            families = _with_namespaces(families)
        yield from families

    def _collect(self) -> Iterator[Metric]:
        models = self.host.statistics()["model_stats"]
        # What the statistics extension has no field for: failures by reason, the cache setting.
        loaded = {(mv.name, str(mv.version)): mv for mv in self.host.manager.loaded()}

        families = [CounterMetricFamily(name, doc, labels=_LABELS) for name, doc, _ in _INFERENCE]
        failure = CounterMetricFamily(*_FAILURE, labels=["model", "reason", "version"])
        cache = [CounterMetricFamily(name, doc, labels=_LABELS) for name, doc, _ in _CACHE]
        any_cache = False
        for m in models:
            labels = [m["name"], m["version"]]
            for family, (_, _, value) in zip(families, _INFERENCE):
                family.add_metric(labels, value(m))
            mv = loaded.get((m["name"], m["version"]))
            reasons = (mv.stats.failure_counts() if mv is not None
                       else {"OTHER": m["inference_stats"]["fail"]["count"]})
            for reason in FAILURE_REASONS:
                failure.add_metric([m["name"], reason, m["version"]], reasons.get(reason, 0))
            if _cache_enabled(mv) or any(value(m) for _, _, value in _CACHE):
                any_cache = True
                for family, (_, _, value) in zip(cache, _CACHE):
                    family.add_metric(labels, value(m))
        latency = getattr(self.host, "latency_config", None)
        counters = latency is None or latency.counters  # counter_latencies=false hides them
        yield families[0]
        yield failure
        yield from (f for f in families[1:] if counters or not f.name.endswith("_duration_us"))
        yield from _gauges(loaded.values())
        if any_cache:
            yield from (f for f in cache if counters or not f.name.endswith("_duration_per_model"))
        if latency is not None and latency.any:
            yield from _latency_families(loaded.values(), latency)
        yield from _model_families(loaded.values())
        yield from _pinned_memory(getattr(self.host, "options", None))


def _with_namespaces(families: Iterator[Metric]) -> Iterator[Metric]:
    """With model namespacing, Triton labels a model's metrics with its `namespace` too (its
    repository; the model label holds a host.repository.ModelKey there)."""
    for family in families:
        for sample in family.samples:
            namespace = getattr(sample.labels.get("model"), "namespace", "")
            if namespace:
                sample.labels["namespace"] = namespace
        yield family


def _pinned_memory(options: Any) -> Iterator[Metric]:
    """Triton's pinned-memory pool gauges. The total is the pool size asked for
    (--pinned-memory-pool-byte-size), as Triton reports it; modelhost stages no tensors in pinned
    memory (its CPU tensors are used where they lie), so nothing of it is ever in use."""
    total = getattr(options, "pinned_memory_pool_byte_size", ServerOptions.pinned_memory_pool_byte_size)
    yield GaugeMetricFamily("nv_pinned_memory_pool_total_bytes",
                            "Pinned memory pool total memory size, in bytes", value=total)
    yield GaugeMetricFamily("nv_pinned_memory_pool_used_bytes",
                            "Pinned memory pool used memory size, in bytes", value=0)


def _gauges(loaded: Iterable[Any]) -> Iterator[Metric]:
    """nv_inference_pending_request_count and nv_model_load_duration_secs, per model version."""
    pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                "Instantaneous number of pending requests awaiting execution "
                                "per-model.", labels=_LABELS)
    load = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds",
                             labels=_LABELS)
    for mv in sorted(loaded, key=lambda m: (m.name, m.version)):
        labels = [mv.name, str(mv.version)]
        pending.add_metric(labels, mv.pending_requests())
        load.add_metric(labels, mv.load_duration_secs)
    yield pending
    yield load


def _latency_families(loaded: Iterable[Any], config: Any) -> Iterator[Metric]:
    """The summaries and the first-response histogram (host.latency), per model version."""
    from host.latency import FIRST_RESPONSE, SUMMARIES

    summaries: dict[str, Metric] = {}
    histogram: Metric | None = None
    for mv in sorted(loaded, key=lambda m: (m.name, m.version)):
        recorder = mv.stats.latency
        if recorder is None:
            continue
        labels = {"model": mv.name, "version": str(mv.version)}
        observed, hist = recorder.snapshot()
        for key, (count, total, quantiles) in observed.items():
            name, doc = SUMMARIES[key]
            family = summaries.get(name)
            if family is None:
                family = summaries[name] = Metric(name, doc, "summary")
            for q, value in quantiles:
                family.add_sample(name, {**labels, "quantile": _number(q)}, value)
            family.add_sample(name + "_sum", labels, total)
            family.add_sample(name + "_count", labels, count)
        if hist is not None:
            name, doc = FIRST_RESPONSE
            if histogram is None:
                histogram = Metric(name, doc, "histogram")
            counts, total = hist
            bounds = [_number(b) for b in recorder.first_response.bounds] + ["+Inf"]
            for le, c in zip(bounds, counts):
                histogram.add_sample(name + "_bucket", {**labels, "le": le}, c)
            histogram.add_sample(name + "_sum", labels, total)
            histogram.add_sample(name + "_count", labels, counts[-1])
    if histogram is not None:
        yield histogram
    yield from summaries.values()


def _number(value: float) -> str:
    """A label value as prometheus-cpp writes numbers: 100, 0.5 (no trailing .0)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _model_families(loaded: Iterable[Any]) -> Iterator[Metric]:
    """Families the backends add (`host.backend.Model.metrics`), merged by name."""
    merged: dict[str, Metric] = {}
    for mv in loaded:
        for family in mv.metrics():
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
    yield from merged.values()


def _cache_enabled(mv: Any) -> bool:
    try:
        return bool(mv.config.response_cache.enable)
    except AttributeError:
        return False


def make_registry(host: Host) -> CollectorRegistry:
    """A registry of its own holding only the Triton collector (no process or GC metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(host))
    from host.native.metrics import NativeMetricsCollector  # native backends' own metrics

    registry.register(NativeMetricsCollector())
    from host.backends.python.custom_metrics import PythonCustomMetricsCollector

    registry.register(PythonCustomMetricsCollector())  # pb_utils.MetricFamily
    return registry


# --- exposition --------------------------------------------------------------------------------
def render(registry: CollectorRegistry | TritonCollector) -> bytes:
    """Prometheus text format 0.0.4 of everything `registry` collects, with counters named as
    given (no `_total` added: Triton's names)."""
    out: list[str] = []
    for family in registry.collect():
        name, kind = family.name, family.type
        if kind == "unknown":
            kind = "untyped"
        elif kind not in ("counter", "gauge", "summary", "histogram"):
            kind = "untyped"
        out.append(f"# HELP {name} {_escape_help(family.documentation)}\n# TYPE {name} {kind}\n")
        for sample in family.samples:
            sample_name = sample.name
            if kind == "counter":
                if sample_name.endswith("_created"):
                    continue  # OpenMetrics only
                if sample_name == name + "_total":  # prometheus_client's counters, OpenMetrics style
                    sample_name = name
            out.append(f"{sample_name}{_labels(sample.labels)} {_value(sample.value)}\n")
    return "".join(out).encode("utf-8")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _label_order(item: tuple[str, str]) -> tuple[bool, str]:
    """A family's labels by name, then a bucket's `le` or a summary's `quantile` (prometheus-cpp)."""
    return (item[0] in ("le", "quantile"), item[0])


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        '{}="{}"'.format(k, str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"'))
        for k, v in sorted(labels.items(), key=_label_order))
    return "{" + inner + "}"


def _value(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**63):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# --- the HTTP endpoint -------------------------------------------------------------------------
def make_wsgi_app(registry: CollectorRegistry | TritonCollector
                  ) -> Callable[[dict, Callable], Iterable[bytes]]:
    """WSGI app: GET (or HEAD) /metrics renders `registry`; other paths 404, other methods 405."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != "/metrics":
            return _plain(start_response, "404 Not Found", b"Not Found\n")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _plain(start_response, "405 Method Not Allowed", b"Method Not Allowed\n",
                          [("Allow", "GET, HEAD")])
        try:
            body = render(registry)
        except Exception as exc:  # a scrape must not take the server down
            return _plain(start_response, "500 Internal Server Error",
                          f"collecting metrics failed: {exc}\n".encode())
        start_response("200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [b""] if method == "HEAD" else [body]

    return app


def _plain(start_response: Callable, status: str, body: bytes,
           extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))] + (extra or []))
    return [body]


class MetricsServer:
    """A running metrics endpoint: `port`, `url`, `stop()`."""

    def __init__(self, server: HTTPServer, registry: CollectorRegistry, cpu: Any = None) -> None:
        self._server = server
        self.registry = registry
        self._cpu = cpu  # host.cpu_metrics.CpuMonitor, or None
        self.address, self.port = server.address[0], server.port
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.address in ("0.0.0.0", "") else self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._server.shutdown(timeout)
            if self._cpu is not None:
                self._cpu.stop()


def start_metrics_server(host: Host, address: str = "0.0.0.0", port: int = 8002) -> MetricsServer:
    """Serve Triton's metrics of `host` at http://ADDRESS:PORT/metrics on background threads
    (port 0: a free one, see `.port`). Stop with `.stop()`."""
    from host.http.server import serve

    registry = make_registry(host)
    options = getattr(host, "options", None)
    cpu = None
    if options is None or options.allow_cpu_metrics:
        from host.cpu_metrics import CpuMonitor

        cpu = CpuMonitor(options.metrics_interval_ms if options is not None else 2000.0)
        registry.register(cpu)
        cpu.start()
    return MetricsServer(serve(make_wsgi_app(registry), address, port), registry, cpu)
