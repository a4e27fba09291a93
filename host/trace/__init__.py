"""Request tracing: Triton's trace extension (settings, sampling, the JSON trace file, OpenTelemetry).

    tracer = TraceManager(parse_config([("", "level", "TIMESTAMPS"), ("triton", "file", "t.json")]))
    host.tracing = tracer.active            # the one check the request path makes
    tracer.begin(mv, request)               # at admission: samples, and stamps a sampled request

What is recorded (Triton's activity names, steady-clock nanoseconds like `time.perf_counter_ns`):
REQUEST_START (the host took the request), QUEUE_START (it goes to the scheduler; a response-cache
lookup comes after it, as in Triton), COMPUTE_START / COMPUTE_INPUT_END / COMPUTE_OUTPUT_START /
COMPUTE_END (the execute that served it: up to the backend call, the call, the response
handling), REQUEST_END (its final response went to the front end). With level TENSORS the
inputs (TENSOR_QUEUE_INPUT) and outputs (TENSOR_BACKEND_OUTPUT) are recorded too (triton mode).

Settings follow Triton's server `TraceManager` (src/tracer.cc): a global setting, per-model
settings that fall back field by field to the global one (a field set to null/empty is cleared
and follows the global one again), sampling by `rate` (every rate-th request of that setting)
limited by `count` (remaining traces, -1: no limit), and in triton mode the JSON file written as
Triton writes it: `file` at shutdown (or when the setting is replaced), or `file.N` each time
`log_frequency` traces were collected, or when `count` traces were collected.

Cost: with no setting able to sample, the host checks one attribute (`Host.tracing`) per request
(and the scheduler `ModelVersion.tracing` per execute); nothing here runs. A sampled request
carries a `Trace` that its callback and the execute fill in.

Modules: `config` (the flags), `manager` (settings, sampling), `record` (a trace, its JSON, the
trace file), `otel` (OpenTelemetry export; imported only in that mode).
"""

from __future__ import annotations

from host.trace.config import (OFF, TENSORS, TIMESTAMPS, TraceConfig, parse_config, parse_level,
                               split_setting)
from host.trace.manager import TraceManager
from host.trace.record import Trace

__all__ = ["OFF", "TENSORS", "TIMESTAMPS", "Trace", "TraceConfig", "TraceManager", "parse_config",
           "parse_level", "split_setting"]
