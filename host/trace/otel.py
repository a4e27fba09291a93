"""OpenTelemetry export of finished traces (OTLP over HTTP, protobuf), as Triton's opentelemetry
trace mode. Imported only in that mode: the SDK is the optional `trace` extra
(`pip install '.[trace]'` from the checkout)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from host.errors import UnsupportedError

if TYPE_CHECKING:
    from host.trace.record import Trace

log = logging.getLogger(__name__)

DEFAULT_OTEL_URL = "http://localhost:4318/v1/traces"
TRACER_NAME = "triton-server"  # Triton's kTritonTracer
DEFAULT_SERVICE_NAME = "triton-inference-server"


# The front ends' activities (HTTP_RECV_START, GRPC_SEND_END, ...)
_FRONTEND = ("HTTP_", "GRPC_")

class OtelExporter:
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
                f"(pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http, or "
                f"from modelhost's checkout: pip install '.[trace]'): {exc}") from None
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
        root = tracer.start_span("InferRequest", context=trace.parent, kind=server,
                                 start_time=stamps[0][1] + wall)
        # the model's span from REQUEST_START: the front end's activities come before it
        first = next((ns for name, ns in stamps if not name.startswith(_FRONTEND)), stamps[0][1]) + wall
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
            if name == "INFER_RESPONSE_COMPLETE" or name.startswith(_FRONTEND):
                # a front-end event: on the root, as Triton's
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
