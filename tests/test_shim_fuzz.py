"""Fuzzed client input over a real server: never a `server_error` or a 500, and the connection stays usable.

Bounded: a fixed number of hypothesis examples per transport, each read with a timeout.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.wire import API_KEY, LOOKUP_TOOL, MODEL, ws_url
from websockets.sync.client import connect

TERMINAL = frozenset({"response.completed", "response.incomplete", "error"})
EXAMPLES = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
deep_values = st.sampled_from([2, 63, 64, 65, 200, 255, 300, 1000]).map(
    lambda depth: json.loads("[" * depth + "]" * depth)
)
items = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "item_reference", "bogus"])},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", 7]),
        "content": st.text(max_size=30) | json_values,
        "call_id": st.text(max_size=8) | json_values,
        "name": st.text(max_size=8),
        "arguments": st.text(max_size=20) | json_values,
        "output": st.text(max_size=20) | json_values,
        "id": st.text(max_size=12),
    },
)
fields = {
    "model": st.just(MODEL) | st.text(max_size=10) | json_values,
    "input": st.text(max_size=60) | st.lists(items, max_size=5) | json_values | deep_values,
    "instructions": st.text(max_size=30) | json_values,
    "tools": st.just([LOOKUP_TOOL]) | st.lists(json_values, max_size=3) | deep_values,
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "lookup"}]) | json_values,
    "text": json_values | deep_values,
    "metadata": json_values,
    "previous_response_id": st.text(max_size=12) | json_values,
    "stream_id": st.sampled_from(["lane-1", "bad lane"]) | json_values,
    "store": json_values,
    "stream": st.booleans(),
    "generate": json_values,
    "max_output_tokens": st.integers(-5, 256) | json_values,
    "temperature": json_values,
    "top_p": json_values,
    "parallel_tool_calls": json_values,
}


def _dumps(value: Any) -> bytes:
    """Serialized with the standard library, which (unlike orjson) writes documents deeper than 254."""
    return json.dumps(value, allow_nan=False).encode()


bodies = st.fixed_dictionaries({}, optional=fields)
mutants = st.one_of([st.tuples(st.just(name), values) for name, values in fields.items()]).map(
    lambda mutation: {"model": MODEL, "input": "hi", "store": False, mutation[0]: mutation[1]}
)
"""A valid request with one field replaced: reaches the stages behind the schema check."""
deep_mutants = st.tuples(st.sampled_from(list(fields)), deep_values).map(
    lambda mutation: {"model": MODEL, "input": "hi", "store": False, mutation[0]: mutation[1]}
)
requests = mutants | deep_mutants | bodies
frames = (
    requests.map(lambda body: _dumps({"type": "response.create", **body}))
    | requests.map(lambda body: _dumps({"type": "response.create", **body}))
    | st.binary(max_size=64)
    | json_values.map(_dumps)
    | st.text(max_size=64).map(str.encode)
)


def _usable(ws: Any) -> None:
    ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "still there?", "store": False}))
    while (event := json.loads(ws.recv(timeout=10)))["type"] != "response.completed":
        assert event["type"] != "error", event


def test_fuzzed_websocket_frames_never_get_server_error_and_the_connection_stays_usable(make_server):
    server = make_server(max_frame_bytes=64 * 1024)
    with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:

        @EXAMPLES
        @given(frame=frames)
        def one(frame: bytes) -> None:
            if frame.startswith(b"{") or frame.isascii():
                ws.send(frame.decode(errors="replace"))
            else:
                ws.send(frame)
            while True:
                event = json.loads(ws.recv(timeout=10))
                if event["type"] == "error":
                    assert event["error"]["code"] != "server_error", (frame, event)
                    assert event["status"] < 500 or event["error"]["code"].startswith("backend"), (frame, event)
                if event["type"] in TERMINAL:
                    return

        one()
        _usable(ws)
    assert len(server.shim.connections) <= 1


def test_fuzzed_http_bodies_never_get_a_500(make_server):
    server = make_server(max_body_bytes=64 * 1024)
    with httpx2.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10) as http:

        @EXAMPLES
        @given(body=requests.map(_dumps) | st.binary(max_size=64) | json_values.map(_dumps))
        def one(body: bytes) -> None:
            answer = http.post("/responses", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code < 500, (body, answer.status_code, answer.text)
            if answer.headers.get("content-type", "").startswith("text/event-stream"):
                assert b'"server_error"' not in answer.content, (body, answer.content[-500:])
            else:
                answer.json()  # every answer, error or not, is JSON

        one()
        ok = http.post("/responses", json={"model": MODEL, "input": "still there?", "store": False})
        assert ok.status_code == 200


def test_json_nested_300_deep_in_any_field_is_invalid_value_over_both_transports(make_server):
    """Deterministic companion of the fuzz: every field, past the depth orjson can serialize."""
    server = make_server()
    deep = json.loads("[" * 300 + "]" * 300)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with (
        connect(ws_url(server), additional_headers=headers) as ws,
        httpx2.Client(base_url=server.base_url, headers=headers, timeout=10) as http,
    ):
        for name in fields:
            body = {"model": MODEL, "input": "hi", "store": False, name: deep}
            ws.send(json.dumps({"type": "response.create", **body}))
            event = json.loads(ws.recv(timeout=10))
            expected = "invalid_stream_id" if name == "stream_id" else "invalid_value"  # the lane is checked first
            assert event["type"] == "error" and event["error"]["code"] == expected, (name, event)
            answer = http.post("/responses", content=json.dumps(body))
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_value", name
        _usable(ws)
