"""The batch manager's latest statistics as Prometheus gauges, under the names Triton's
TensorRT-LLM backend uses (so its dashboards work): one family per group, the field in a label."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily

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


def families(model: str, version: str, stats: dict[str, Any]) -> list[GaugeMetricFamily]:
    if not stats:
        return []
    out = []
    for name, doc, label, fields in _GROUPS:
        family = GaugeMetricFamily(name, doc, labels=["model", label, "version"])
        for value, key in fields:
            family.add_metric([model, value, version], stats.get(key, 0))
        out.append(family)
    return out
