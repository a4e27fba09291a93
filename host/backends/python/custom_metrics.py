"""Python models' custom metrics (pb_utils.MetricFamily / Metric) on `/metrics`.

A prometheus_client collector that reads pb_utils' family registry at scrape time, as Triton's
python backend registers them in the server's registry: counters and gauges with the names,
help and labels the model gave them; histograms as `_count`, `_sum` and `_bucket` (cumulative, `le`
last). Scraping never imports the python backend: before one is loaded there is nothing to
report. Models run in a stub process of their own (EXECUTION_MODE "process") keep theirs there.
"""

from __future__ import annotations

import sys
from typing import Iterator

from prometheus_client.core import Metric

_KINDS = {0: "counter", 1: "gauge", 2: "histogram"}


def _bound(value: float) -> str:
    """A bucket bound as prometheus-cpp writes it: 1, 2.5, +Inf."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class PythonCustomMetricsCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        pb_utils = sys.modules.get("host.backends.python.pb_utils")
        if pb_utils is None:  # no python model was ever loaded
            return
        for name, doc, kind, cells in pb_utils._custom_metric_families():
            family = Metric(name, doc, _KINDS[kind])
            for labels, (value, total, buckets, counts) in cells:
                if buckets is None:
                    family.add_sample(name, labels, value)
                    continue
                family.add_sample(name + "_count", labels, value)  # prometheus-cpp's order
                family.add_sample(name + "_sum", labels, total)
                running = 0
                for bound, count in zip([*map(_bound, buckets), "+Inf"], counts):
                    running += count
                    family.add_sample(name + "_bucket", {**labels, "le": bound}, running)
            yield family
