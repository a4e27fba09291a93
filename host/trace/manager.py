"""Trace settings (global and per model), sampling, and where finished traces go (Triton's
server TraceManager, src/tracer.cc)."""

from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING, Any

from host.errors import InvalidArgumentError, UnsupportedError
from host.trace.config import INT32_MAX, OFF, TENSORS, TIMESTAMPS, UINT32_MAX, TraceConfig
from host.trace.record import Trace, TraceFile

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse
    from host.model import ModelVersion

MIN_COUNT = -1


class TraceSetting:
    """One immutable trace setting with its own sampling state (Triton's TraceSetting)."""

    def __init__(self, level: int, rate: int, count: int, log_frequency: int, file: TraceFile,
                 mode: str, options: list[tuple[str, str]], specified: frozenset[str],
                 exporter: Any = None) -> None:
        self.level, self.rate, self.count, self.log_frequency = level, rate, count, log_frequency
        self.file, self.mode, self.options = file, mode, options
        self.specified = specified  # fields set for this setting (not following the fallback)
        self.exporter = exporter
        self._lock = threading.Lock()
        self._sampled = 0  # requests seen (Triton's sample_)
        self._collected = 0
        self._in_stream = 0
        self._stream: list[str] = []
        self._retired = False
        if level == OFF:
            self.reason = "tracing is disabled"
        elif rate == 0:
            self.reason = "sample rate must be non-zero"
        elif mode == "triton" and not file.name:
            self.reason = "trace file name is not given"
        else:
            self.reason = ""

    def can_sample(self) -> bool:
        """Whether a request could be traced: by sampling, or (OpenTelemetry, even at rate 0,
        Triton's way of tracing only those) because it carries a trace context."""
        return not self.reason or (self.mode == "opentelemetry" and self.level != OFF)

    def valid(self) -> bool:
        return not self.reason and self.count != 0

    def sample(self, forced: bool = False) -> bool:
        """Triton's TraceSetting::SampleTrace: every rate-th request while count lasts; a
        `forced` one (it carries an OpenTelemetry trace context) is traced whatever the count."""
        with self._lock:
            if self.rate == 0:
                return forced
            if not self.valid() and not forced:
                return False
            self._sampled += 1
            hit = self._sampled % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
            elif hit and self.count == 0:
                hit = False
            return hit or forced

    def finish(self, trace: Trace) -> None:
        if self.mode == "opentelemetry":
            if self.exporter is not None:
                self.exporter.export(trace)
            return
        text = trace.to_json()
        with self._lock:
            if self._in_stream:
                self._stream.append(",")
            self._in_stream += 1
            self._collected += 1
            self._stream.append(text)
            if not ((self.count == 0 and self._collected == self._sampled)
                    or (self.log_frequency and self._in_stream >= self.log_frequency)
                    or self._retired):
                return
            data, indexed = "".join(self._stream), not self._retired or self.log_frequency != 0
            self._stream, self._in_stream = [], 0
        self.file.save(data, indexed)

    def retire(self) -> None:
        """Replaced by a new setting (or the server stops): write what was collected, as Triton's
        TraceSetting destructor does; traces still running write when they end."""
        if self.mode != "triton":
            return
        with self._lock:
            self._retired = True
            if not self._in_stream:
                return
            data = "".join(self._stream)
            self._stream, self._in_stream = [], 0
        self.file.save(data, self.log_frequency != 0)

    def level_names(self) -> list[str]:
        if self.level == OFF:
            return ["OFF"]
        return [n for bit, n in ((TIMESTAMPS, "TIMESTAMPS"), (TENSORS, "TENSORS")) if self.level & bit]


_FIELDS = ("level", "rate", "count", "log_frequency")


class TraceManager:
    """The trace settings of a host, the sampling, and where traces go."""

    def __init__(self, config: TraceConfig | None = None) -> None:
        cfg = config or TraceConfig()
        self.mode = cfg.mode
        self.exporter = otel_exporter(cfg.options) if cfg.mode == "opentelemetry" else None
        self._files: dict[str, TraceFile] = {}
        self._lock = threading.Lock()

        def make() -> TraceSetting:
            return TraceSetting(cfg.level, cfg.rate, cfg.count, cfg.log_frequency, self._file(cfg.file),
                            cfg.mode, list(cfg.options), frozenset(), self.exporter)

        self._default = make()
        self._global = make()
        self._models: dict[str, TraceSetting] = {}
        self._fallback_models: set[str] = set()
        self.active = self._compute_active()
        self.on_change: Any = None  # called with `active` after each update (the host's flag)

    def _file(self, name: str) -> TraceFile:
        file = self._files.get(name)
        if file is None:
            file = self._files[name] = TraceFile(name)
        return file

    # --- the request path ------------------------------------------------------------------
    def begin(self, mv: ModelVersion, request: InferenceRequest) -> None:
        """Sample `request` with its model's setting; a sampled request gets a `Trace` (stamped
        REQUEST_START and QUEUE_START) and its callback records the rest."""
        setting = self._models.get(mv.name, self._global)
        # A propagated OpenTelemetry context (traceparent) forces the trace, as in Triton.
        parent = None
        if request.trace_context is not None and setting.mode == "opentelemetry" \
                and setting.level != OFF and self.exporter is not None:
            parent = self.exporter.extract(request.trace_context)
        if not setting.sample(parent is not None):
            return
        trace = Trace(setting, request, mv.version)
        trace.parent = parent
        trace.stamps += (("REQUEST_START", request.enqueue_ns),
                         ("QUEUE_START", time.perf_counter_ns()))
        if setting.level & TENSORS:
            trace.tensors += (("TENSOR_QUEUE_INPUT", t) for t in request.inputs.values())
        request.trace = trace
        mv.tracing = True  # from now on the model's executes look for traced requests
        inner = request.callback
        assert inner is not None

        def traced(response: InferenceResponse | None, final: bool) -> None:
            trace.respond(response, final)
            inner(response, final)
            if response is not None:  # handed to the front end
                trace.stamps.append(("INFER_RESPONSE_COMPLETE", time.perf_counter_ns()))
            if final:
                trace.end()

        request.callback = traced

    # --- settings (the trace extension) -------------------------------------------------------
    def get(self, model: str = "") -> dict[str, Any]:
        """The effective setting of `model` (or the global one) in Triton's answer shape."""
        with self._lock:
            s = self._models.get(model, self._global) if model else self._global
        out: dict[str, Any] = {"trace_level": s.level_names(), "trace_rate": str(s.rate),
                               "trace_count": str(s.count)}
        if s.mode == "triton":
            out["log_frequency"] = str(s.log_frequency)
            out["trace_file"] = s.file.name
        out["trace_mode"] = s.mode
        for key, value in s.options:
            if key not in ("file", "log-frequency", "log_frequency"):
                out[key] = value
        return out

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply a settings request: key -> None (clear: follow the fallback again) or its text
        value(s) as sent (trace_level: a list). Returns the new effective setting."""
        new = _parse_changes(changes)
        with self._lock:
            self._update(model, new)
            if not model:
                for name in list(self._fallback_models):
                    self._update(name, {})
            self.active = self._compute_active()
        if self.on_change is not None:
            self.on_change(self.active)
        return self.get(model)

    def _update(self, model: str, new: dict[str, Any]) -> None:
        if model:
            current, fallback = self._models.get(model), self._global
        else:
            current, fallback = self._global, self._default
        values = {f: getattr(fallback, f) for f in _FIELDS}
        specified = set()
        for f in _FIELDS:
            if f in new and new[f] is None:
                continue  # cleared
            if f in new:
                values[f] = new[f]
                specified.add(f)
            elif current is not None and f in current.specified:
                values[f] = getattr(current, f)
                specified.add(f)
        file = fallback.file  # the file cannot change through the protocol
        if model:
            # Triton counts the file as one of the fields a model setting may set; it never can
            # be through the protocol, so a model setting always falls back for it.
            if not specified:
                old = self._models.pop(model, None)
                self._fallback_models.discard(model)
                if old is not None:
                    old.retire()
                return
            self._fallback_models.add(model)
        setting = TraceSetting(values["level"], values["rate"], values["count"], values["log_frequency"],
                           file, fallback.mode, fallback.options, frozenset(specified), self.exporter)
        if not setting.valid() and setting.level != OFF:
            raise InvalidArgumentError(f"Attempting to set invalid trace setting :{setting.reason}")
        old = self._models.get(model) if model else self._global
        if model:
            self._models[model] = setting
        else:
            self._global = setting
        if old is not None:
            old.retire()

    def _compute_active(self) -> bool:
        return any(s.can_sample() for s in (self._global, *self._models.values()))

    def close(self) -> None:
        """Write what was collected, close the files, flush the exporter (the server stops)."""
        with self._lock:
            for s in (self._global, *self._models.values()):
                s.retire()
            for f in self._files.values():
                f.close()
        if self.exporter is not None:
            self.exporter.shutdown()


_STOI = re.compile(r"\s*([+-]?\d+)")


def _stoi(key: str, text: str, low: int, high: int) -> int:
    """std::stoi as Triton applies it to a setting: leading integer, int32 range."""
    m = _STOI.match(text)
    if m is None:
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {text}")
    value = int(m.group(1))
    if not -2**31 <= value <= INT32_MAX:
        raise InvalidArgumentError(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}")
    return value


def _parse_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """A settings request's values -> typed fields (None: clear), with Triton's errors."""
    if "trace_file" in changes:
        raise UnsupportedError("trace file location can not be updated through network protocol")
    new: dict[str, Any] = {}
    if "trace_level" in changes:
        levels = changes["trace_level"]
        if levels is None:
            new["level"] = None
        else:
            level = OFF
            for name in levels:
                if name == "OFF":
                    if len(levels) != 1:
                        raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
                    new["level"] = OFF
                elif name == "TIMESTAMPS":
                    level |= TIMESTAMPS
                    new["level"] = level
                elif name == "TENSORS":
                    level |= TENSORS
                    new["level"] = level
    for key, name, low, high in (("trace_rate", "rate", 0, UINT32_MAX),
                                 ("trace_count", "count", MIN_COUNT, INT32_MAX),
                                 ("log_frequency", "log_frequency", 0, UINT32_MAX)):
        if key not in changes:
            continue
        text = changes[key]
        if text is None:
            new[name] = None
            continue
        value = _stoi(key, text, low, high)
        if name == "count" and value < MIN_COUNT:
            raise InvalidArgumentError(
                f"Unable to parse '{key}'. Expecting value >= {MIN_COUNT}, got:{text}")
        new[name] = value if name == "count" else value & UINT32_MAX  # uint32, as Triton stores it
    return new


def otel_exporter(options: list[tuple[str, str]]) -> Any:
    from host.trace.otel import OtelExporter  # the OpenTelemetry SDK only in that mode

    return OtelExporter(options)
