"""Python models' custom metrics (pb_utils.MetricFamily / Metric) on `/metrics`.

A prometheus_client collector that reads pb_utils' family registry at scrape time, as Triton's
python backend registers them in the server's registry: counters and gauges with the names,
help and labels the model gave them; histograms as `_count`, `_sum` and `_bucket` (cumulative, `le`
last). Scraping never imports the python backend: before one is loaded there is nothing to
report. A model in a stub process (process mode) sends its families whenever they changed before
its next message (host.backends.python.stub); each stub is a source here until it ends. As one
registry in Triton, families of the same name are one family, and the same labels one value:
counters and histograms add up, a gauge shows the last source that has it.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Iterator

from prometheus_client.core import Metric

_KINDS = {0: "counter", 1: "gauge", 2: "histogram"}
_GAUGE = 1

# Process-mode stubs (host.backends.python.process._Child): `.metric_families()` each.
sources: weakref.WeakSet[Any] = weakref.WeakSet()


def _bound(value: float) -> str:
    """A bucket bound as prometheus-cpp writes it: 1, 2.5, +Inf."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class PythonCustomMetricsCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for name, doc, kind, cells in _merged():
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


def _merged() -> list[tuple[str, str, int, list[tuple[dict, Any]]]]:
    """The families of this process and of every stub, merged by name and labels."""
    pb_utils = sys.modules.get("host.backends.python.pb_utils")
    if pb_utils is None:  # no python model was ever loaded
        return []
    lists = [pb_utils._custom_metric_families()] + [s.metric_families() for s in list(sources)]
    lists = [families for families in lists if families]
    if len(lists) <= 1:
        return lists[0] if lists else []
    merged: dict[str, tuple[str, int, dict[tuple, tuple[dict, Any]]]] = {}
    for families in lists:
        for name, doc, kind, cells in families:
            known = merged.setdefault(name, (doc, kind, {}))
            if known[1] != kind:
                continue  # the same name with another kind: Triton refuses it; keep the first
            by_labels = known[2]
            for labels, value in cells:
                key = tuple(sorted(labels.items()))
                before = by_labels.get(key)
                if before is not None and kind != _GAUGE and before[1][2] == value[2]:
                    (v0, s0, b0, c0), (v1, s1, _, c1) = before[1], value
                    value = (v0 + v1, s0 + s1, b0,
                             [x + y for x, y in zip(c0, c1)] if c0 is not None else None)
                by_labels[key] = (labels, value)
    return [(name, doc, kind, list(cells.values())) for name, (doc, kind, cells) in merged.items()]
