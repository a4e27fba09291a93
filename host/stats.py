"""Per-model-version statistics in the shape of Triton's statistics extension."""

from __future__ import annotations

import threading
import time
from typing import Any

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
              "cache_hit", "cache_miss")


class ModelStats:
    """Counters for one model version; updated under one short lock per event."""

    def __init__(self, name: str, version: int) -> None:
        self.name, self.version = name, version
        self._lock = threading.Lock()
        self._durations = {k: [0, 0] for k in _DURATIONS}  # count, ns
        self._batches: dict[int, list[int]] = {}  # batch size -> [count, input ns, infer ns, output ns]
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def request_done(self, ok: bool, total_ns: int, queue_ns: int) -> None:
        with self._lock:
            d = self._durations["success" if ok else "fail"]
            d[0] += 1
            d[1] += total_ns
            if ok:
                q = self._durations["queue"]
                q[0] += 1
                q[1] += queue_ns
            self.last_inference_ms = int(time.time() * 1000)

    def execution_done(self, requests: int, batch_size: int, infer_ns: int) -> None:
        """One execute of `requests` requests holding `batch_size` rows in total."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += batch_size
            c = self._durations["compute_infer"]
            c[0] += requests
            c[1] += infer_ns * requests
            for key in ("compute_input", "compute_output"):
                self._durations[key][0] += requests
            b = self._batches.setdefault(batch_size, [0, 0, 0, 0])
            b[0] += 1
            b[2] += infer_ns

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            dur = {k: {"count": c, "ns": ns} for k, (c, ns) in self._durations.items()}
            batches = [
                {"batch_size": size,
                 "compute_input": {"count": b[0], "ns": b[1]},
                 "compute_infer": {"count": b[0], "ns": b[2]},
                 "compute_output": {"count": b[0], "ns": b[3]}}
                for size, b in sorted(self._batches.items())
            ]
            return {
                "name": self.name,
                "version": str(self.version),
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": dur,
                "response_stats": {},
                "batch_stats": batches,
                "memory_usage": [],
            }
