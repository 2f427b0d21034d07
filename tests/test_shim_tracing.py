"""OpenTelemetry spans (the `otel` extra): one per turn and one per stage, continuing the caller's trace."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.wire import MODEL, completed_ok, run_turn

from server_shim import tracing
from server_shim.loading import ConfigError, load
from server_shim.metrics import STAGES

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    yield exporter
    tracing.disable()


def turn_spans(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == "responses_ws.turn"]


async def test_websocket_turns_continue_the_trace_of_the_upgrade_request(make_server, spans):
    server = make_server()
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as sdk,
        sdk.responses.connect(extra_headers={"traceparent": TRACEPARENT}) as conn,
    ):
        first = await run_turn(conn, input="hello", store=False)
        completed_ok(first)
        completed_ok(await run_turn(conn, input="again", previous_response_id=first.id, store=False))
    turns = turn_spans(spans)
    assert len(turns) == 2
    for span in turns:
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert format(span.parent.span_id, "016x") == CALLER_SPAN
        assert span.attributes["responses_ws.transport"] == "websocket"
        children = [s for s in spans.get_finished_spans() if s.parent and s.parent.span_id == span.context.span_id]
        assert [c.name for c in children] == [f"responses_ws.{stage}" for stage in STAGES]
        assert all(span.start_time <= c.start_time <= c.end_time <= span.end_time for c in children)
    assert turns[0].attributes["responses_ws.response"] == first.id


async def test_http_turns_continue_the_trace_of_the_request(make_server, spans):
    server = make_server()
    reply = httpx2.post(
        server.base_url + "/responses",
        json={"model": MODEL, "input": "hi", "store": False},
        headers={"traceparent": TRACEPARENT},
    )
    assert reply.status_code == 200
    (span,) = turn_spans(spans)
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes["responses_ws.response"] == reply.json()["id"]
    assert span.attributes["responses_ws.transport"] == "http"


async def test_without_a_caller_trace_a_turn_starts_one_and_off_means_no_spans(make_server, spans):
    server = make_server()
    assert httpx2.post(server.base_url + "/responses", json={"model": MODEL, "input": "hi", "store": False}).is_success
    (span,) = turn_spans(spans)
    assert span.parent is None
    tracing.disable()
    assert httpx2.post(server.base_url + "/responses", json={"model": MODEL, "input": "hi", "store": False}).is_success
    assert len(turn_spans(spans)) == 1


def test_otel_without_the_extra_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(tracing, "available", lambda: False)
    with pytest.raises(ConfigError) as caught:
        load(None, {"otel": True}, {})
    assert str(caught.value) == f"otel: OpenTelemetry is not installed: {tracing.EXTRA}"
