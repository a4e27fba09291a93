"""Per-model-version statistics in the shape of Triton's statistics extension.

What is counted, and when (Triton's definitions, docs/protocol/extension_statistics.md, with the
points where this in-process host takes its timestamps):

- `success` / `fail`: one per request (a failed ensemble request counts twice, as in Triton),
  when its final response is delivered (`request_done`);
  the duration runs from the moment the host scheduled the request (after validation) to that
  final response. Failures are also counted per reason for the metrics (`failure_counts`):
  REJECTED, CANCELED, BACKEND, OTHER, as Triton's `nv_inference_request_failure{reason=...}`.
- `queue`: successful requests only, from scheduling to the start of the execute that served them
  (waiting for a free instance, or in the dynamic batcher's queue).
- `compute_input` / `compute_infer` / `compute_output`: one per request an execute served, each
  with that execute's durations (Triton's backends report the batch's timestamps for every
  request of the batch too). Backends run in process, so there is no tensor copy to time:
  compute_input is the host's own work between the execute's start and the backend's `execute`
  call (stamping the requests, counting rows); compute_infer is the `execute` call itself (for the
  python backend that includes building the pb_utils requests and converting the responses);
  compute_output is the host's response handling after `execute` returned (naming and filtering
  each response and handing it to the front end that waits for it; encoding it for the wire is the
  front end's, after that, as in Triton). One difference: a request that reached an execute and
  then failed is counted here too (Triton counts successful requests only; for its python backend
  that also means every request that got an error response rather than an exception).
- `inference_count`: rows (the batch size of each request, 1 for models that do not batch) of the
  successful requests that reached an execute; a response-cache hit is not counted.
- `execution_count` and `batch_stats`: one per execute, by its total rows, counted as soon as
  `execute` returned (before its responses go out); `last_inference` (ms since the epoch) is when
  the latest execute returned. A response-cache hit counts in neither (as in Triton).
- `cache_hit` / `cache_miss`: recorded by the response cache through `cache_hit` / `cache_miss`.

Every event takes one short lock; nothing is computed per request beyond a few additions.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from host.errors import CancelledError

if TYPE_CHECKING:
    from host.latency import LatencyRecorder

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
              "cache_hit", "cache_miss")

# Triton's failure reasons (the `reason` label of nv_inference_request_failure).
REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


def failure_reason(error: BaseException | None, executed: bool, ensemble: bool = False) -> str:
    """Triton's reason for a failed request: CANCELED for a cancellation, REJECTED for a request
    the queue policy rejected (its timeout expired), BACKEND for a request that reached an
    execute, OTHER for the rest; an ensemble's failures are all OTHER, as Triton counts them."""
    if isinstance(error, CancelledError):
        return CANCELED
    if ensemble:
        return OTHER
    if getattr(error, "queue_rejected", False):
        return REJECTED
    return BACKEND if executed else OTHER


RESPONSE_STATS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")
RESPONSE_KINDS = ("success", "fail", "empty_response", "cancel")


class ModelStats:
    """Counters for one model version; updated under one short lock per event."""

    def __init__(self, name: str, version: int) -> None:
        self.name, self.version = name, version
        self._lock = threading.Lock()
        self._durations = {k: [0, 0] for k in _DURATIONS}  # count, ns
        d = self._durations
        self._success, self._fail, self._queue = d["success"], d["fail"], d["queue"]
        self._input, self._infer, self._output = d["compute_input"], d["compute_infer"], d["compute_output"]
        self._batches: dict[int, list[int]] = {}  # batch size -> [count, input ns, infer ns, output ns]
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        # Per-response statistics of decoupled models, by response index (what a native backend
        # reports with TRITONBACKEND_ModelInstanceReportResponseStatistics): name -> [count, ns]
        self._responses: dict[int, dict[str, list[int]]] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.ensemble = False  # an ensemble's failures are counted as OTHER (failure_reason)
        self.last_inference_ms = 0
        # Summaries and histograms (host.latency): None unless --metrics-config asks for them.
        self.latency: LatencyRecorder | None = None

    # --- the events ----------------------------------------------------------------------------
    def request_done(self, ok: bool, total_ns: int, queue_ns: int, rows: int = 0,
                     error: BaseException | None = None) -> None:
        """A request's final response was delivered.

        `rows`: the request's batch size if it reached an execute, else 0 (never executed: a
        cache hit, or a failure before execution); `error`: what it failed with, if it did.
        """
        if ok:
            with self._lock:
                s, q = self._success, self._queue
                s[0] += 1
                s[1] += total_ns
                q[0] += 1
                q[1] += queue_ns
                self.inference_count += rows
            if self.latency is not None:
                self.latency.success(total_ns, queue_ns)
        else:
            reason = failure_reason(error, rows > 0, self.ensemble)
            # Triton counts a failed ensemble request twice (core ensemble_scheduler.cc: the
            # error response's RespondIfError, then the request tracker's statistics report):
            # its fail count and nv_inference_request_failure rise by 2 (checked on 2.51).
            times = 2 if self.ensemble and reason == OTHER else 1
            with self._lock:
                f = self._fail
                f[0] += times
                f[1] += total_ns * times
                self._failures[reason] += times

    def execution_done(self, requests: int, batch_size: int, infer_ns: int, input_ns: int = 0) -> None:
        """An execute of `requests` requests holding `batch_size` rows in all returned (called
        before its responses are handed out, so a client that has its response sees the count)."""
        now_ms = time.time_ns() // 1_000_000
        with self._lock:
            self.execution_count += 1
            if now_ms > self.last_inference_ms:
                self.last_inference_ms = now_ms
            i, c, o = self._input, self._infer, self._output
            i[0] += requests
            i[1] += input_ns * requests
            c[0] += requests
            c[1] += infer_ns * requests
            o[0] += requests  # its time comes with output_done
            b = self._batches.get(batch_size)
            if b is None:
                b = self._batches[batch_size] = [0, 0, 0, 0]
            b[0] += 1
            b[1] += input_ns
            b[2] += infer_ns
        if self.latency is not None:
            self.latency.observe("compute_input_duration", input_ns, requests)
            self.latency.observe("compute_infer_duration", infer_ns, requests)

    def output_done(self, requests: int, batch_size: int, output_ns: int) -> None:
        """The responses of that execute were handed out, which took `output_ns`."""
        with self._lock:
            self._output[1] += output_ns * requests
            b = self._batches.get(batch_size)
            if b is not None:
                b[3] += output_ns
        if self.latency is not None:
            self.latency.observe("compute_output_duration", output_ns, requests)

    def cache_hit(self, lookup_ns: int) -> None:
        """A response-cache hit: looking the response up and copying it out took `lookup_ns`.
        The request itself is then reported with `request_done(True, ..., rows=0)`."""
        with self._lock:
            h = self._durations["cache_hit"]
            h[0] += 1
            h[1] += lookup_ns
        if self.latency is not None:
            self.latency.observe("cache_hit_duration", lookup_ns)

    def cache_miss(self, ns: int) -> None:
        """A response-cache miss: the lookup plus inserting the computed response took `ns`
        (the request's own duration includes it when the insert precedes its final response)."""
        with self._lock:
            m = self._durations["cache_miss"]
            m[0] += 1
            m[1] += ns
        if self.latency is not None:
            self.latency.observe("cache_miss_duration", ns)

    # --- reading -------------------------------------------------------------------------------
    def failure_counts(self) -> dict[str, int]:
        """Failed requests by Triton's reason (REJECTED, CANCELED, BACKEND, OTHER)."""
        with self._lock:
            return dict(self._failures)

    def response_reported(self, index: int, kind: int, infer_ns: int, output_ns: int,
                          total_ns: int, has_infer: bool, has_output: bool) -> None:
        """One response's statistics, aggregated as Triton's InferenceStatsAggregator does:
        `kind` 0 success, 1 fail, 2 empty response, 3 cancel."""
        with self._lock:
            entry = self._responses.get(index)
            if entry is None:
                entry = self._responses[index] = {k: [0, 0] for k in RESPONSE_STATS}
            if has_infer:
                entry["compute_infer"][0] += 1
                entry["compute_infer"][1] += infer_ns
            if has_output:
                entry["compute_output"][0] += 1
                entry["compute_output"][1] += output_ns
            outcome = entry[RESPONSE_KINDS[kind]]
            outcome[0] += 1
            outcome[1] += total_ns

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
                "response_stats": {
                    str(index): {k: {"count": c, "ns": ns} for k, (c, ns) in entry.items()}
                    for index, entry in sorted(self._responses.items())},
                "batch_stats": batches,
                "memory_usage": [],
            }
