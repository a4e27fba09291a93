"""The batch manager's metrics for /metrics.

- Its latest statistics as gauges, under the names Triton's TensorRT-LLM backend uses (so its
  dashboards work): one family per group, the field in a label.
- Request-level serving metrics under vLLM's names (so vLLM dashboards work), labelled
  `model_name`: histograms `vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`
  (inter-token latency), `vllm:request_queue_time_seconds`, `vllm:e2e_request_latency_seconds`;
  counters `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:request_success_total{finished_reason}`; gauges `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1; vLLM's older name
  `vllm:gpu_cache_usage_perc` is exported too).
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

# family, help, label, ((label value, stats field), ...)
_GROUPS = [
    ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type",
     (("active", "Active Request Count"), ("max", "Max Request Count"),
      ("scheduled", "Scheduled Requests"), ("context", "Context Requests"),
      ("waiting", "Waiting Requests"))),
    ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type",
     (("max", "Max KV cache blocks"), ("free", "Free KV cache blocks"),
      ("used", "Used KV cache blocks"), ("tokens_per", "Tokens per KV cache block"),
      ("reused", "Reused KV cache blocks"))),
    ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight batcher metrics",
     "inflight_batcher_specific_metric",
     (("total_context_tokens", "Total Context Tokens"), ("generation_requests", "Generation Requests"),
      ("micro_batch_id", "MicroBatch ID"), ("paused_requests", "Paused Requests"))),
    ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type",
     (("iteration_counter", "Iteration Counter"),)),
]


_HISTOGRAMS = [
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:time_per_output_token_seconds", "Histogram of inter-token latency in seconds.", "inter_token"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.",
     "queue_time"),
    ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", "e2e"),
]


def serving_families(model: str, manager: Any) -> list[Any]:
    m = manager.metrics
    labels = ["model_name"]
    out: list[Any] = []
    for name, doc, attr in _HISTOGRAMS:
        h = getattr(m, attr)
        histogram = HistogramMetricFamily(name, doc, labels=labels)
        histogram.add_metric([model], h.cumulative(), sum_value=h.total)
        out.append(histogram)
    # counters named with their `_total`, as vLLM's (host.metrics.render writes names as given)
    for name, doc, value in (("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
                              m.prompt_tokens),
                             ("vllm:generation_tokens_total", "Number of generation tokens processed.",
                              m.generation_tokens)):
        counter = Metric(name, doc, "counter")
        counter.add_sample(name, {"model_name": model}, value)
        out.append(counter)
    success = Metric("vllm:request_success_total", "Count of finished requests by reason.", "counter")
    for reason, count in m.finished.items():
        success.add_sample("vllm:request_success_total", {"model_name": model, "finished_reason": reason},
                           count)
    out.append(success)
    cache = manager.cache
    usage = cache.num_used / cache.num_blocks if cache.num_blocks else 0.0
    for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             len(manager.active)),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             len(manager.waiting)),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
            ("vllm:gpu_cache_usage_perc", "KV-cache usage (vLLM's older name).", usage)):
        gauge = GaugeMetricFamily(name, doc, labels=labels)
        gauge.add_metric([model], value)
        out.append(gauge)
    return out


def families(model: str, version: str, stats: dict[str, Any], manager: Any = None) -> list[Any]:
    # like the statistics gauges, the serving families appear once the model has had a request
    seen = manager is not None and (manager.metrics.prompt_tokens or manager.active or manager.waiting
                                    or sum(manager.metrics.finished.values()))
    out: list[Any] = serving_families(model, manager) if seen else []
    if not stats:
        return out
    for name, doc, label, fields in _GROUPS:
        family = GaugeMetricFamily(name, doc, labels=["model", label, "version"])
        for value, key in fields:
            family.add_metric([model, value, version], stats.get(key, 0))
        out.append(family)
    return out
