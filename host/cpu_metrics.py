"""CPU utilization and memory as Triton reports them (nv_cpu_utilization, nv_cpu_memory_*).

Like Triton, from /proc/stat (the aggregate "cpu" line; utilization is the share of non-idle time
between two samples) and /proc/meminfo (used = MemTotal - MemAvailable), sampled every
--metrics-interval-ms on a background thread; a scrape reads the last sample.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

__all__ = ["CpuMonitor"]


def read_cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, idle) jiffies of the aggregate CPU line, or None where it cannot be read."""
    try:
        with open(path) as f:
            line = f.readline()
    except OSError:
        return None
    if not line.startswith("cpu "):
        return None
    fields = [int(v) for v in line.split()[1:9]]
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal, idle + iowait


def read_memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, used) bytes, or None where /proc/meminfo cannot be read."""
    values: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    values[name] = int(parts[0]) * 1024
    except (OSError, ValueError):
        return None
    total, available = values.get("MemTotal"), values.get("MemAvailable")
    if total is None or available is None or available > total:
        return None
    return total, total - available


class CpuMonitor:
    """Samples every `interval_ms`; `collect()` yields Triton's three gauges (no labels)."""

    def __init__(self, interval_ms: float = 2000.0) -> None:
        self.interval = max(interval_ms, 1.0) / 1000.0
        self.utilization = 0.0
        self.memory = read_memory()
        self._last = read_cpu_times()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-metrics", daemon=True)

    def start(self) -> CpuMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def poll(self) -> None:
        now = read_cpu_times()
        if now is not None and self._last is not None:
            busy = max(0, now[0] - self._last[0])
            idle = max(0, now[1] - self._last[1])
            if busy + idle:
                self.utilization = busy / (busy + idle)
        self._last = now
        memory = read_memory()
        if memory is not None:
            self.memory = memory

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - metrics must not stop the server
                log.exception("polling CPU metrics failed")

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
                                value=self.utilization)
        if self.memory is not None:
            total, used = self.memory
            yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
                                    value=total)
            yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                                    value=used)
