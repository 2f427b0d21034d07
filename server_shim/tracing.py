"""Optional OpenTelemetry spans: one per turn, one per pipeline stage under it (the `otel` extra).

Off unless `serve --otel` (`RESPONSES_WS_OTEL=true`) or `enable()` is called. The spans are drawn
once the turn has finished, from the stage clock's intervals, so tracing adds no work inside the
stages. A turn's span continues the caller's trace: the W3C `traceparent`/`tracestate` headers of
the WebSocket upgrade request (every turn on that connection) or of the HTTP request. The exporter
is OTLP over HTTP, configured by the standard `OTEL_EXPORTER_OTLP_*` and `OTEL_SERVICE_NAME`
variables.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from .turn import Turn

EXTRA = "pip install -e '.[otel]' from the responses-ws checkout"
TRACE_HEADERS = (b"traceparent", b"tracestate")

_tracer: Any = None


def available() -> bool:
    """Whether the `otel` extra is installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def enable(exporter: SpanExporter | None = None) -> None:
    """Start exporting spans: OTLP over HTTP by default, or to `exporter` (tests pass an in-memory one)."""
    global _tracer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: Any = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(exporter)
    provider = TracerProvider(resource=Resource.create({"service.name": "responses-ws"}))
    provider.add_span_processor(processor)
    _tracer = provider.get_tracer("responses_ws")


def disable() -> None:
    global _tracer
    _tracer = None


def enabled() -> bool:
    """Whether spans are recorded (callers skip building their attributes otherwise)."""
    return _tracer is not None


def carrier(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace context headers of an ASGI request (empty when tracing is off: nothing to keep)."""
    if _tracer is None:
        return {}
    return {name.decode(): value.decode("latin-1") for name, value in headers if name in TRACE_HEADERS}


def record(turn: Turn, trace_carrier: Mapping[str, str], attributes: Mapping[str, Any]) -> None:
    """The turn's span and its stage spans, placed at the times the stages ran."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    stages = turn.result.stages
    to_ns = _wall_clock(stages.clock)
    parent = TraceContextTextMapPropagator().extract(dict(trace_carrier))
    span = _tracer.start_span(
        "responses_ws.turn",
        context=parent,
        kind=trace.SpanKind.SERVER,
        start_time=to_ns(stages.started),
        attributes={k: v for k, v in attributes.items() if v is not None},
    )
    inside = trace.set_span_in_context(span)
    for stage, start, end in stages.intervals:
        _tracer.start_span(f"responses_ws.{stage}", context=inside, start_time=to_ns(start)).end(end_time=to_ns(end))
    if turn.result.error is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, turn.result.error.code))
    span.end(end_time=to_ns(stages.clock()))


def _wall_clock(clock: Any) -> Any:
    """Map the stage clock's readings to epoch nanoseconds (the clock is monotonic, spans need wall time)."""
    offset = time.time_ns() - int(clock() * 1e9)
    return lambda reading: int(reading * 1e9) + offset
