"""Latency summaries and histograms behind Triton's --metrics-config (off unless asked for).

    --metrics-config summary_latencies=true       nv_inference_{request,queue,compute_input,
                                                  compute_infer,compute_output}_summary_us, and
                                                  nv_cache_{hit,miss}_summary_per_model
    --metrics-config summary_quantiles=0.5:0.05,0.9:0.01
    --metrics-config histogram_latencies=true     nv_inference_first_response_histogram_ms
    --metrics-config counter_latencies=false      hides the *_duration_us latency counters

A model version's `ModelStats.latency` is a `LatencyRecorder` only when summaries or histograms
are on; `host.stats` feeds it the same events it counts anyway. Quantiles are computed over the
observations of the last `MAX_AGE` seconds (as prometheus-cpp's summaries, whose default window
Triton keeps), exactly rather than with CKMS's error bounds; the count and sum are cumulative.
"""

from __future__ import annotations

import bisect
import collections
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["LatencyConfig", "LatencyRecorder", "Summary", "Histogram", "parse_metrics_config"]

MAX_AGE = 60.0  # seconds of observations a summary's quantiles describe
MAX_KEPT = 100_000  # observations kept per summary at most (the oldest go first)
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # ms, Triton's defaults

# summary key -> (family name, help), Triton's names and texts
SUMMARIES = {
    "request_duration": ("nv_inference_request_summary_us",
                         "Summary of inference request duration in microseconds (includes cached "
                         "requests)"),
    "queue_duration": ("nv_inference_queue_summary_us",
                       "Summary of inference queuing duration in microseconds (includes cached "
                       "requests)"),
    "compute_input_duration": ("nv_inference_compute_input_summary_us",
                               "Cumulative compute input duration in microseconds (does not "
                               "include cached requests)"),
    "compute_infer_duration": ("nv_inference_compute_infer_summary_us",
                               "Cumulative compute inference duration in microseconds (does not "
                               "include cached requests)"),
    "compute_output_duration": ("nv_inference_compute_output_summary_us",
                                "Cumulative inference compute output duration in microseconds "
                                "(does not include cached requests)"),
    "cache_hit_duration": ("nv_cache_hit_summary_per_model",
                           "Summary of cache hit counts/durations per model, in microseconds."),
    "cache_miss_duration": ("nv_cache_miss_summary_per_model",
                            "Summary of cache miss counts/durations per model, in microseconds."),
}
FIRST_RESPONSE = ("nv_inference_first_response_histogram_ms",
                  "Duration from request to first response in milliseconds")


@dataclass(frozen=True)
class LatencyConfig:
    counters: bool = True
    summaries: bool = False
    histograms: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    buckets: tuple[float, ...] = field(default=FIRST_RESPONSE_BUCKETS)

    @property
    def any(self) -> bool:
        return self.summaries or self.histograms


def for_model(config: LatencyConfig, model_config: Any) -> LatencyConfig:
    """Triton's `model_metrics`: a model's own buckets for the first-response histogram (the one
    family Triton lets a model customize; others are warned about, as Triton does)."""
    for control in model_config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family == FIRST_RESPONSE[0]:
            config = replace(config, buckets=tuple(control.histogram_options.buckets))
        else:
            log.warning("Metric family '%s' in 'metric_identifier' is not a customizable metric "
                        "in Triton core.", family)
    return config


def parse_metrics_config(settings: dict[str, str]) -> LatencyConfig:
    """Triton's --metrics-config settings (unknown ones are ignored, as Triton does)."""
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    if "summary_quantiles" in settings:
        parsed = _quantiles(settings["summary_quantiles"])
        if parsed:
            quantiles = parsed
    return LatencyConfig(counters=settings.get("counter_latencies") != "false",
                         summaries=settings.get("summary_latencies") == "true",
                         histograms=settings.get("histogram_latencies") == "true",
                         quantiles=quantiles)


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`0.5:0.05,0.9:0.01` -> ((0.5, 0.05), (0.9, 0.01)); bad pairs are logged and skipped."""
    pairs = []
    for item in text.split(","):
        q, colon, e = item.partition(":")
        if not colon:
            log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is "
                      "<quantile>:<error>", item)
            continue
        try:
            pairs.append((_stod(q), _stod(e)))
        except ValueError:
            log.error("Invalid option: [%s]. Error: stod", item)
    return tuple(pairs)


_STOD = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))",
                   re.IGNORECASE)


def _stod(text: str) -> float:
    """C++'s std::stod, as Triton parses quantiles: the longest number at the start counts and
    the rest is ignored ("0.0.1" is 0.0); no number at all is an error."""
    match = _STOD.match(text)
    if match is None:
        raise ValueError(text)
    return float(match.group(1))


class Summary:
    """Observations of one quantity: cumulative count and sum, quantiles over a recent window."""

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=MAX_KEPT)

    def observe(self, value: float, times: int = 1) -> None:  # under the recorder's lock
        now = time.monotonic()
        self.count += times
        self.sum += value * times
        for _ in range(times):
            self._recent.append((now, value))

    def quantiles(self, wanted: tuple[tuple[float, float], ...]) -> list[tuple[float, float]]:
        horizon = time.monotonic() - MAX_AGE
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        values = sorted(v for _, v in self._recent)
        out = []
        for q, _ in wanted:
            if not values:
                out.append((q, math.nan))
            else:
                out.append((q, values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]))
        return out


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for c in self.counts:
            total += c
            out.append(total)
        return out


class LatencyRecorder:
    """The summaries and histograms of one model version (`host.stats.ModelStats.latency`)."""

    def __init__(self, config: LatencyConfig, cache_enabled: bool) -> None:
        self.config = config
        self._lock = threading.Lock()
        keys = []
        if config.summaries:
            # Triton leaves out the request summary of cached models (its FIXME DLIS-4762), and
            # the cache summaries of models without the cache.
            keys = [k for k in SUMMARIES
                    if (k != "request_duration" or not cache_enabled)
                    and (not k.startswith("cache_") or cache_enabled)]
        self.summaries = {k: Summary() for k in keys}
        self.first_response = Histogram(config.buckets) if config.histograms else None

    def observe(self, key: str, ns: int, times: int = 1) -> None:
        s = self.summaries.get(key)
        if s is not None:
            with self._lock:
                s.observe(ns // 1000, times)

    def success(self, total_ns: int, queue_ns: int) -> None:
        s = self.summaries
        if s:
            with self._lock:
                r = s.get("request_duration")
                if r is not None:
                    r.observe(total_ns // 1000)
                s["queue_duration"].observe(queue_ns // 1000)

    def responded(self, since_start_ns: int) -> None:
        """The first response of a request went out `since_start_ns` after it started."""
        h = self.first_response
        if h is not None:
            with self._lock:
                h.observe(since_start_ns // 1_000_000)  # whole ms, as Triton's

    def snapshot(self) -> tuple[dict[str, tuple[int, float, list[tuple[float, float]]]],
                                tuple[list[int], float] | None]:
        with self._lock:
            summaries = {k: (s.count, s.sum, s.quantiles(self.config.quantiles))
                         for k, s in self.summaries.items()}
            h = self.first_response
            hist = (h.cumulative(), h.sum) if h is not None else None
        return summaries, hist
