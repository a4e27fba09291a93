"""Native backends' own metrics (TRITONSERVER_MetricFamilyNew / MetricNew) on `/metrics`.

A prometheus_client collector that reads the bridge's metric registry at scrape time: counters
and gauges with the names, help and labels the backend gave them, as Triton exports them.
Histograms are not exported (the bridge keeps only their sum). Scraping never loads the bridge:
before the first native backend or cache is loaded there is nothing to report.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import Metric

from host.native import bridge


class NativeMetricsCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if bridge.lib.cache_info().currsize == 0:  # the bridge was never loaded
            return
        for name, doc, kind, samples in bridge.lib().metrics():
            family = Metric(name, doc, kind)
            for labels, value in samples:
                family.add_sample(name, labels, value)
            yield family
