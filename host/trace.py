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

Cost: with no setting able to sample, the host checks one attribute (`Host.tracing`) per request;
nothing here runs. A sampled request carries a `Trace` that the execute fills in.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from host.errors import InvalidArgumentError, UnsupportedError

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse, Tensor
    from host.model import ModelVersion

log = logging.getLogger(__name__)

__all__ = ["TraceConfig", "TraceManager", "Trace", "parse_config", "parse_level"]

TIMESTAMPS, TENSORS = 0x4, 0x8  # TRITONSERVER_InferenceTraceLevel bits
OFF = 0
MODES = ("triton", "opentelemetry")
MIN_COUNT = -1
DEFAULT_OTEL_URL = "http://localhost:4318/v1/traces"
TRACER_NAME = "triton-server"  # Triton's kTritonTracer
DEFAULT_SERVICE_NAME = "triton-inference-server"
_BSP_DEFAULTS = (("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
                 ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
                 ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
_INT32_MAX, _UINT32_MAX = 2**31 - 1, 2**32 - 1


# --- configuration (the --trace-config flags) -----------------------------------------------------

@dataclass
class TraceConfig:
    """The start-up trace configuration (Triton's defaults)."""

    level: int = OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    # The mode's own settings in the order given ("url", "resource", "bsp_*" for opentelemetry);
    # answered by the settings API as Triton does, except file and log-frequency.
    options: list[tuple[str, str]] = field(default_factory=list)


def parse_level(text: str) -> int:
    """A --trace-config level value (Triton's ParseTraceLevelOption)."""
    value = text.lower()
    if value in ("false", "off"):
        return OFF
    if value in ("true", "on", "min", "max", "timestamps"):
        return TIMESTAMPS
    if value == "tensors":
        return TENSORS
    raise ValueError(f"invalid value for trace level option: {value}")


def _parse_mode(text: str) -> str:
    value = text.lower()
    if value not in MODES:
        raise ValueError(f'invalid value for trace mode option: {value}. Available options are '
                         '"triton" and "opentelemetry"')
    return value


def split_setting(text: str) -> tuple[str, str, str]:
    """`<mode>,<setting>=<value>` or `<setting>=<value>` -> (mode or "", setting, value)."""
    mode, comma, rest = text.partition(",")
    if not comma:
        mode, rest = "", text
    elif not mode:
        raise ValueError("No trace mode specified. --trace-config option format is <trace mode>,"
                         f"<setting>=<value> or <setting>=<value>. Got {text}")
    else:
        mode = _parse_mode(mode)
    setting, eq, value = rest.partition("=")
    if not eq or not setting or not value:
        raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {text}")
    return mode, setting, value


def _int(text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"invalid integer '{text}'") from None
    if not low <= value <= high:
        raise ValueError(f"'{text}' is out of range [{low}, {high}]")
    return value


def parse_config(settings: list[tuple[str, str, str]], deprecated: dict[str, Any] | None = None
                 ) -> TraceConfig:
    """Settings from --trace-config (as `split_setting` triples) plus the deprecated flags
    (--trace-file, --trace-level, --trace-rate, --trace-count, --trace-log-frequency), which
    --trace-config overrides, as Triton's command line parser does. Raises ValueError."""
    cfg = TraceConfig()
    old = deprecated or {}
    disabled = False
    for level in old.get("level") or []:
        parsed = parse_level(level)
        disabled |= parsed == OFF
        cfg.level |= parsed
    if old.get("rate") is not None:
        cfg.rate = old["rate"]
    if old.get("count") is not None:
        cfg.count = old["count"]
    if old.get("file") is not None:
        cfg.file = old["file"]
    if old.get("log_frequency") is not None:
        cfg.log_frequency = old["log_frequency"]
    for mode, key, value in settings:
        if mode:
            continue
        try:
            if key == "rate":
                cfg.rate = _int(value, -_INT32_MAX - 1, _INT32_MAX) & _UINT32_MAX
            elif key == "level":
                parsed = parse_level(value)
                disabled |= parsed == OFF
                cfg.level |= parsed
            elif key == "mode":
                cfg.mode = _parse_mode(value)
            elif key == "count":
                cfg.count = _int(value, -_INT32_MAX - 1, _INT32_MAX)
            elif key in ("log-frequency", "log_frequency"):  # a triton-mode setting, given bare
                cfg.log_frequency = _int(value, 0, _INT32_MAX)
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {key}".\n{exc}') from None
    for mode, key, value in settings:
        if mode != cfg.mode:
            continue
        try:
            if mode == "triton" and key == "file":
                cfg.file = value
            elif mode == "triton" and key in ("log-frequency", "log_frequency"):
                cfg.log_frequency = _int(value, 0, _INT32_MAX)
            elif mode == "opentelemetry":
                if key.startswith("bsp_"):
                    _int(value, 0, _UINT32_MAX)
                cfg.options.append((key, value))
            else:
                cfg.options.append((key, value))
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {mode},{key}".\n{exc}') from None
    if cfg.mode == "opentelemetry":
        given = {k for k, _ in cfg.options}
        for key, env, default in _BSP_DEFAULTS:
            if key not in given:
                value = os.environ.get(env, default)
                try:
                    _int(value, 0, _UINT32_MAX)
                except ValueError as exc:
                    raise ValueError(f'Bad option: "{env}".\n{exc}') from None
                cfg.options.append((key, value))
    if disabled:
        cfg.level = OFF
    return cfg


# --- one trace ------------------------------------------------------------------------------

_ids = itertools.count(1)  # trace ids, as Triton's: 1, 2, ... for the server's life


class Trace:
    """The record of one sampled request: its activities in order, then written or exported."""

    __slots__ = ("id", "setting", "model_name", "model_version", "request_id", "stamps",
                 "tensors", "wall_offset", "compute_open", "parent")

    def __init__(self, setting: _Setting, request: InferenceRequest, version: int) -> None:
        self.id = next(_ids)
        self.setting = setting
        self.model_name = request.model_name
        self.model_version = version  # the version that serves it, as Triton reports
        self.request_id = request.id
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[tuple[str, Tensor]] = []
        # steady clock -> wall clock, taken once (OpenTelemetry wants wall-clock times, as Triton's
        # time_offset_ does)
        self.wall_offset = time.time_ns() - time.perf_counter_ns()
        self.compute_open = False
        self.parent: Any = None  # a propagated OpenTelemetry context, if the request had one

    def compute(self, start: int, input_end: int, output_start: int) -> None:
        """The execute that served the request (called by the scheduler before it responds)."""
        self.stamps += (("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                        ("COMPUTE_OUTPUT_START", output_start))
        self.compute_open = True

    def respond(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and self.setting.level & TENSORS and response.error is None:
            self.tensors += (("TENSOR_BACKEND_OUTPUT", t) for t in response.outputs)
        if final:
            now = time.perf_counter_ns()
            if self.compute_open:
                self.stamps.append(("COMPUTE_END", now))
                self.compute_open = False

    def end(self) -> None:
        self.stamps.append(("REQUEST_END", time.perf_counter_ns()))
        self.setting.finish(self)

    # triton mode: Triton's JSON trace objects, one per activity
    def to_json(self) -> str:
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name,
                                "model_version": self.model_version}
        if self.request_id:
            head["request_id"] = self.request_id
        parts = [json.dumps(head, separators=(",", ":"))]
        level = self.setting.level
        tensors = iter(self.tensors)
        for name, ns in self.stamps:
            if name == "QUEUE_START" and level & TENSORS:
                parts += (_tensor_json(self.id, a, t) for a, t in tensors
                          if a == "TENSOR_QUEUE_INPUT")
            if level & TIMESTAMPS:
                parts.append(f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
        if level & TENSORS:
            parts += (_tensor_json(self.id, a, t) for a, t in self.tensors
                      if a == "TENSOR_BACKEND_OUTPUT")
        return ",".join(parts)


def _tensor_json(trace_id: int, activity: str, tensor: Tensor) -> str:
    return json.dumps({"id": trace_id, "activity": activity,
                       "tensor": {"name": tensor.name, "data": _tensor_data(tensor),
                                  "shape": ",".join(str(d) for d in tensor.shape),
                                  "dtype": tensor.datatype}}, separators=(",", ":"))


def _tensor_data(tensor: Tensor) -> str:
    """Elements comma-separated as Triton writes them (FP16/BF16: empty, BYTES: quoted)."""
    import numpy as np

    data = tensor.data
    if data is None or tensor.datatype in ("FP16", "BF16"):
        return ""
    flat = np.asarray(data).reshape(-1)
    if tensor.datatype == "BYTES":
        return ",".join('"' + (v if isinstance(v, bytes) else str(v).encode()).decode("utf-8", "replace")
                        + '"' for v in flat)
    if tensor.datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat)
    if tensor.datatype in ("FP32", "FP64"):
        return ",".join(f"{v:g}" for v in flat.tolist())  # C++ ostream's default: 0, 0.5, 1e+06
    # Integers as numbers (Triton's ostream writes INT8/UINT8 elements as characters)
    return ",".join(str(v) for v in flat.tolist())


# --- settings -------------------------------------------------------------------------------

class _File:
    """A trace file as Triton's TraceFile: one JSON array written across saves, or indexed files."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.index = itertools.count()
        self._lock = threading.Lock()
        self._stream: Any = None

    def save(self, data: str, to_index: bool) -> None:
        try:
            if to_index:
                with open(f"{self.name}.{next(self.index)}", "w") as f:
                    f.write("[" + data + "]")
                return
            with self._lock:
                if self._stream is None:
                    self._stream = open(self.name, "w")
                    self._stream.write("[")
                else:
                    self._stream.write(",")
                self._stream.write(data)
                self._stream.flush()
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.write("]")
                self._stream.close()
                self._stream = None


class _Setting:
    """One immutable trace setting with its own sampling state (Triton's TraceSetting)."""

    def __init__(self, level: int, rate: int, count: int, log_frequency: int, file: _File,
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
        self.exporter = _OtelExporter(cfg.options) if cfg.mode == "opentelemetry" else None
        self._files: dict[str, _File] = {}
        self._lock = threading.Lock()

        def make() -> _Setting:
            return _Setting(cfg.level, cfg.rate, cfg.count, cfg.log_frequency, self._file(cfg.file),
                            cfg.mode, list(cfg.options), frozenset(), self.exporter)

        self._default = make()
        self._global = make()
        self._models: dict[str, _Setting] = {}
        self._fallback_models: set[str] = set()
        self.active = self._compute_active()
        self.on_change: Any = None  # called with `active` after each update (the host's flag)

    def _file(self, name: str) -> _File:
        file = self._files.get(name)
        if file is None:
            file = self._files[name] = _File(name)
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
        setting = _Setting(values["level"], values["rate"], values["count"], values["log_frequency"],
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
    if not -2**31 <= value <= _INT32_MAX:
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
    for key, name, low, high in (("trace_rate", "rate", 0, _UINT32_MAX),
                                 ("trace_count", "count", MIN_COUNT, _INT32_MAX),
                                 ("log_frequency", "log_frequency", 0, _UINT32_MAX)):
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
        new[name] = value if name == "count" else value & _UINT32_MAX  # uint32, as Triton stores it
    return new


# --- OpenTelemetry --------------------------------------------------------------------------

class _OtelExporter:
    """Spans of finished traces to an OTLP/HTTP endpoint, batched (Triton's BatchSpanProcessor).

    A trace becomes Triton's three spans: "InferRequest" (the root), a span named after the model
    (attributes triton.model_name, triton.model_version, triton.trace_id, triton.trace_parent_id,
    triton.request_id; events REQUEST_START, QUEUE_START, REQUEST_END) and its child "compute"
    (events COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END).
    """

    def __init__(self, options: list[tuple[str, str]]) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry import trace as otel_trace
        except ImportError as exc:
            raise UnsupportedError(
                f"--trace-config mode=opentelemetry needs the OpenTelemetry SDK and OTLP exporter "
                f"(pip install 'modelhost[trace]'): {exc}") from None
        url, attributes, bsp = DEFAULT_OTEL_URL, {"service.name": DEFAULT_SERVICE_NAME}, {}
        for key, value in options:
            if key == "url":
                url = value
            elif key == "resource":
                name, _, val = value.partition("=")
                attributes[name] = val
            elif key.startswith("bsp_"):
                bsp[key] = int(value)
        # Triton's users often give host:port/path (its exporter defaults to http): do the same.
        self.url = url if "://" in url else "http://" + url
        self._otel = otel_trace
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=self.url),
            max_queue_size=bsp.get("bsp_max_queue_size", 2048),
            schedule_delay_millis=bsp.get("bsp_schedule_delay", 5000),
            max_export_batch_size=bsp.get("bsp_max_export_batch_size", 512)))
        self._tracer = self._provider.get_tracer(TRACER_NAME)
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._propagator = TraceContextTextMapPropagator()  # W3C traceparent, as Triton's

    def extract(self, carrier: dict[str, str]) -> Any:
        """The remote parent a request's traceparent/tracestate describe, or None if invalid."""
        context = self._propagator.extract(carrier)
        span_context = self._otel.get_current_span(context).get_span_context()
        return context if span_context.is_valid else None

    def export(self, trace: Trace) -> None:
        otel, tracer = self._otel, self._tracer
        server = otel.SpanKind.SERVER
        wall = trace.wall_offset
        stamps = trace.stamps
        first = stamps[0][1] + wall
        root = tracer.start_span("InferRequest", context=trace.parent, kind=server,
                                 start_time=first)
        attributes: dict[str, Any] = {"triton.model_name": trace.model_name,
                      "triton.model_version": trace.model_version,
                      "triton.trace_id": trace.id, "triton.trace_parent_id": 0}
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        model = tracer.start_span(trace.model_name, context=otel.set_span_in_context(root),
                                  kind=server, start_time=first, attributes=attributes)
        compute = None
        for name, ns in stamps:
            at = ns + wall
            if name == "INFER_RESPONSE_COMPLETE":  # a front-end event: on the root, as Triton's
                root.add_event(name, timestamp=at)
                continue
            if name == "COMPUTE_START":
                compute = tracer.start_span("compute", context=otel.set_span_in_context(model),
                                            kind=server, start_time=at)
            (compute if compute is not None else model).add_event(name, timestamp=at)
            if name == "COMPUTE_END" and compute is not None:
                compute.end(end_time=at)
                compute = None
        last = stamps[-1][1] + wall
        if compute is not None:
            compute.end(end_time=last)
        model.end(end_time=last)
        root.end(end_time=last)

    def shutdown(self) -> None:
        try:
            self._provider.shutdown()  # exports what is batched
        except Exception:  # noqa: BLE001 - the collector may be gone; stopping must go on
            log.exception("OpenTelemetry exporter shutdown failed")
