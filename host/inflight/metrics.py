"""Request-level serving metrics the batch manager keeps (vLLM's set): latency histograms and
token counters, updated on the worker thread, read by exporters from any thread.

Histograms (seconds): time to first token (arrival to first token), inter-token latency
(between tokens of one request), queue time (arrival to first scheduled), end-to-end latency
(arrival to final response). Counters: prompt tokens, generation tokens, finished requests by
reason (stop, length, abort, error). The gauges (running, waiting, KV-cache usage) are read off
the manager's state when exported.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM's buckets for these histograms (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +Inf last
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def observe_all(self, values: list[float]) -> None:
        """observe() each of `values` (one call for a step's tokens)."""
        counts, buckets, where, total = self.counts, self.buckets, bisect.bisect_left, self.total
        for value in values:
            counts[where(buckets, value)] += 1
            total += value
        self.total = total
        self.count += len(values)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, cumulative count) pairs as Prometheus lists them, +Inf last."""
        out, running = [], 0
        for bound, c in zip([*map(str, self.buckets), "+Inf"], self.counts):
            running += c
            out.append((bound, running))
        return out


@dataclass
class ServingMetrics:
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    queue_time: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0,
                                                              "error": 0})
