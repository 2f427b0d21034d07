"""What a test sees on the wire: events read raw and parsed strictly into the SDK's own types.

The SDK's `recv()` uses `construct` (no validation); these helpers read the raw frame and run
`TypeAdapter(...).validate_python`, so a missing or mistyped field fails the test.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

import httpx2
import openai
import orjson
from openai.types.responses import Response, ResponseError, ResponseStreamEvent
from pydantic import TypeAdapter

OPENAI_MAJOR = int(openai.__version__.split(".")[0])
HTTP: Any = httpx2 if OPENAI_MAJOR >= 3 else importlib.import_module("httpx")
"""The HTTP library the installed `openai` client is built on (CI also runs the transport tests on 1.x and 2.x)."""

DROPPED_STREAM: type[Exception] = openai.APIConnectionError if OPENAI_MAJOR >= 3 else HTTP.RemoteProtocolError
"""What the SDK raises over HTTP when a stream breaks mid-way: openai 3.x wraps the transport's
error in `APIConnectionError`; 1.x/2.x let httpx's `RemoteProtocolError` through."""

try:
    from openai.types.responses import ResponsesServerEvent
except ImportError:  # openai 1.x has no WebSocket-mode types; its transport tests check events as stream events
    ResponsesServerEvent = ResponseStreamEvent  # type: ignore[misc]

WS_EVENT = TypeAdapter(ResponsesServerEvent)
SSE_EVENT = TypeAdapter(ResponseStreamEvent)
RESPONSE = TypeAdapter(Response)

MODEL = "simulated-1"
API_KEY = "test-key"
TERMINAL = frozenset({"response.completed", "response.incomplete", "error"})
RECV_TIMEOUT_S = 10.0

LOOKUP_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a record by number.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}

PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}
"""A custom tool with a grammar, as Codex sends it."""
AGENTS_TOOL = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]},
        },
        {"type": "custom", "name": "note"},
    ],
}
"""A namespace of a function and a custom tool, as Codex sends `multi_agent_v1`."""


SDK_ERROR_CODES = frozenset(get_args(ResponseError.model_fields["code"].annotation))


def sdk_error_code(data: dict[str, Any]) -> dict[str, Any]:
    """The event with a failed response's `error.code` as one of the SDK's literals.

    A failed response carries the same code as the `error` event after it (README "Errors"), which the
    SDK's closed `Literal` may not list (`backend_rejected_request`); the SDK reads it (it constructs
    events without validating). Everything else is still validated strictly."""
    error = data.get("response", {}).get("error") if isinstance(data.get("response"), dict) else None
    if not isinstance(error, dict) or error.get("code") in SDK_ERROR_CODES:
        return data
    return {**data, "response": {**data["response"], "error": {**error, "code": "server_error"}}}


def strict_ws_event(data: dict[str, Any]) -> Any:
    """Validate one WebSocket event against `ResponsesServerEvent`; return the typed model."""
    model = WS_EVENT.validate_python(sdk_error_code(data))
    assert model.type == data["type"]
    return model


def strict_sse_event(data: dict[str, Any]) -> Any:
    model = SSE_EVENT.validate_python(sdk_error_code(data))
    assert model.type == data["type"]
    return model


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


@dataclass
class TurnEvents:
    """The events of one response as dicts (each already validated strictly)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    @property
    def response(self) -> dict[str, Any]:
        for event in reversed(self.events):
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                return event["response"]
        raise AssertionError(f"no terminal response among {self.types}")

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def error(self) -> dict[str, Any] | None:
        last = self.events[-1] if self.events else None
        return last if last is not None and last["type"] == "error" else None

    @property
    def text(self) -> str:
        return "".join(
            part["text"]
            for item in self.response["output"]
            if item["type"] == "message"
            for part in item["content"]
            if part["type"] == "output_text"
        )


async def recv_event(conn: Any, timeout: float = RECV_TIMEOUT_S) -> dict[str, Any]:
    """The next event of an SDK connection, as a dict, after strict validation."""
    raw = await asyncio.wait_for(conn.recv_bytes(), timeout)
    data = json.loads(raw)
    strict_ws_event(data)
    return data


async def read_turn(conn: Any, stream_id: str | None = None, timeout: float = RECV_TIMEOUT_S) -> TurnEvents:
    """Events until `response.completed`/`response.incomplete`/`error` (a failure ends with its error)."""
    turn = TurnEvents()
    while True:
        event = await recv_event(conn, timeout)
        turn.events.append(event)
        if event["type"] in TERMINAL:
            check_sequence(turn.events, stream_id)
            return turn


async def run_turn(conn: Any, **create: Any) -> TurnEvents:
    """Send one `response.create` through the SDK and read its events."""
    create.setdefault("model", MODEL)
    await conn.response.create(**create)
    return await read_turn(conn, create.get("stream_id"))


async def send_raw(conn: Any, frame: Any) -> None:
    """Send a frame the typed SDK method would refuse to build."""
    await conn.send_raw(frame if isinstance(frame, (str, bytes)) else orjson.dumps(frame).decode())


def check_sequence(events: Iterable[dict[str, Any]], stream_id: str | None = None) -> None:
    """Per response: sequence numbers 0, 1, 2, ...; the lane echoed on every event when given."""
    numbered = [e for e in events if "sequence_number" in e]
    assert [e["sequence_number"] for e in numbered] == list(range(len(numbered)))
    for event in events:
        assert event.get("stream_id") == stream_id, event


def completed_ok(turn: TurnEvents) -> None:
    assert turn.types[0] == "response.created", turn.types
    assert turn.types[-1] == "response.completed", turn.types
    assert turn.response["status"] == "completed"
    RESPONSE.validate_python(turn.response)


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """Parse `event: <type>\\ndata: <json>\\n\\n` frames; the event name must match the data's type."""
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"]
        strict_sse_event(data)
        events.append(data)
    return events


def ws_url(server: Any) -> str:
    return server.base_url.replace("http://", "ws://", 1) + "/responses"


def only_connection(server: Any) -> Any:
    """The server side of the one open WebSocket (a `ResponsesConnection`)."""
    connections = list(server.shim.connections)
    assert len(connections) == 1, connections
    return connections[0]
