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


steer_items = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call_output"]) | json_values,
        "role": st.sampled_from(["user", "assistant"]) | json_values,
        "content": st.text(max_size=30)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["input_text", "input_image", "output_text"])},
                optional={"text": st.text(max_size=10) | json_values, "extra": json_values | deep_values},
            ),
            max_size=3,
        )
        | json_values
        | deep_values,
    },
)
steer_frames = st.fixed_dictionaries(
    {},
    optional={
        "previous_response_id": st.just("resp_gone") | json_values | deep_values,
        "input": st.text(max_size=30) | st.lists(steer_items, max_size=4) | json_values | deep_values,
        "stream_id": st.just("lane-1") | json_values,
        "extra": json_values | deep_values,
    },
).map(lambda body: _dumps({"type": "response.steer", **body}))


def test_fuzzed_steer_frames_get_one_answer_each_and_never_cost_the_connection(make_server):
    """Each `response.steer` is answered at once with one event (a refusal here: no response runs), whatever
    its input holds (deep values included, which once dropped the connection: its echo could not be encoded)."""
    server = make_server(max_frame_bytes=64 * 1024)
    with connect(ws_url(server), additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:

        @EXAMPLES
        @given(frame=steer_frames)
        def one(frame: bytes) -> None:
            ws.send(frame.decode())
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] in ("response.steer.failed", "error"), (frame, event)
            assert event["error"]["code"] not in ("server_error", "event_encoding_failed"), (frame, event)

        one()
        _usable(ws)


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


HOSTILE = [*'"\\,:[]{} \x00', "NaN", "-Infinity", "1e400", "18446744073709551616", "\\ud800", "\\udc00", "[" * 70]
padded = st.tuples(requests, st.lists(items, min_size=1, max_size=4), st.integers(0, 600)).map(
    lambda parts: {**parts[0], "input": parts[1] * parts[2], "instructions": "x" * 33_000}
)
"""Larger than the sliced parser's window, so the frame is walked, and its `input` read element by element."""


def _edited(text: bytes, edits: list[tuple[int, str, int]]) -> bytes:
    for at, token, removed in edits:
        at %= len(text) + 1
        text = text[:at] + token.encode() + text[at + removed :]
    return text


edits = st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(HOSTILE), st.integers(0, 2)), max_size=3)
both_parsers = (
    st.tuples((requests | padded).map(lambda body: _dumps({"type": "response.create", **body})), edits).map(
        lambda frame_edits: _edited(*frame_edits)
    )
    | frames
)


def _answer(ws: Any, frame: bytes) -> list[tuple[Any, ...]]:
    """What a frame gets, ids and times aside: each event's type, and an error's code, parameter and message
    (only the start of an `invalid_json` message: the two parsers word the JSON fault differently)."""
    ws.send(frame.decode(errors="replace") if frame.isascii() or frame.startswith(b"{") else frame)
    seen: list[tuple[Any, ...]] = []
    while True:
        event = json.loads(ws.recv(timeout=30))
        error = event.get("error") or {}
        message = str(error.get("message"))
        if error.get("code") == "invalid_json":
            message = message.split(":")[0]
        seen.append((event["type"], error.get("code"), error.get("param"), message if error else None))
        if event["type"] in TERMINAL:
            return seen


def test_fuzzed_frames_get_the_same_answer_from_the_sliced_parser_as_from_orjson(make_server):
    """Every frame parsed in slices (`sliced_parse_bytes=1`) against every frame parsed by orjson (0), same
    frames in the same order, over real connections: the same events and error codes."""
    whole, sliced = make_server(sliced_parse_bytes=0), make_server(sliced_parse_bytes=1)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with (
        connect(ws_url(whole), additional_headers=headers, max_size=2**24) as by_orjson,
        connect(ws_url(sliced), additional_headers=headers, max_size=2**24) as in_slices,
    ):

        @EXAMPLES
        @given(frame=both_parsers)
        def one(frame: bytes) -> None:
            assert _answer(in_slices, frame) == _answer(by_orjson, frame), frame[:300]

        one()
        _usable(in_slices)


def test_fuzzed_http_bodies_get_the_same_answer_from_the_sliced_parser_as_from_orjson(make_server):
    whole, sliced = make_server(sliced_parse_bytes=0), make_server(sliced_parse_bytes=1)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    with (
        httpx2.Client(base_url=whole.base_url, headers=headers, timeout=30) as by_orjson,
        httpx2.Client(base_url=sliced.base_url, headers=headers, timeout=30) as in_slices,
    ):

        @EXAMPLES
        @given(body=both_parsers)
        def one(body: bytes) -> None:
            for route in ("/responses", "/chat/completions"):
                a, b = by_orjson.post(route, content=body), in_slices.post(route, content=body)
                assert a.status_code == b.status_code, (route, body[:300], a.text[:300], b.text[:300])
                if a.status_code >= 400:
                    ea, eb = a.json()["error"], b.json()["error"]
                    assert (ea["code"], ea.get("param")) == (eb["code"], eb.get("param")), (route, body[:300])

        one()


TRICKY_VALUES = [
    *("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E+999", "1e-400", "-0", "0.5", "01", "1.", "nul", "true"),
    *("18446744073709551615", "18446744073709551616", "-9223372036854775809", "1" * 400),
    *('"\\ud800"', '"\\udc00"', '"\\ud83d\\ude00"', '"\\\\ud800"', '"\\ud800\\\\udc00"', '"\x1f"', '"\\U00e9"'),
    *("[1,]", '{"a":1,}', "[" * 65 + "]" * 65, "[" * 1024 + "]" * 1024, "[" * 1025 + "]" * 1025),
]


def _tricky_frames() -> list[str]:
    """Each value where the standard library and orjson disagree, put where a frame has values, keys and ends."""
    head = '{"type":"response.create","model":"simulated-1","store":false,'
    frames = []
    for padding in ("", '"instructions":"' + "x" * 33_000 + '",'):
        for value in TRICKY_VALUES:
            frames += [
                head + padding + '"input":"hi","temperature":' + value + "}",
                head + padding + '"input":[{"role":"user","content":"hi"},{"role":"user","content":' + value + "}]}",
                head + padding + '"input":"hi","temperature":1,"temperature":' + value + "}",
                head + padding + '"input":"hi","metadata":{' + value + ":1}}",
            ]
        body = head + padding + '"input":"hi"}'
        frames += [body + " x", body + "\x00", "\ufeff" + body, "[" + body + "]", body + "\n\t ", " " + body]
    return frames


def test_tricky_frames_get_the_same_answer_from_the_sliced_parser_as_from_orjson(make_server):
    whole, sliced = make_server(sliced_parse_bytes=0), make_server(sliced_parse_bytes=1)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with (
        connect(ws_url(whole), additional_headers=headers) as by_orjson,
        connect(ws_url(sliced), additional_headers=headers) as in_slices,
        httpx2.Client(base_url=whole.base_url, headers=headers, timeout=30) as http_orjson,
        httpx2.Client(base_url=sliced.base_url, headers=headers, timeout=30) as http_slices,
    ):
        for frame in _tricky_frames():
            data = frame.encode()
            assert _answer(in_slices, data) == _answer(by_orjson, data), frame[:200]
            a, b = http_orjson.post("/responses", content=data), http_slices.post("/responses", content=data)
            assert a.status_code == b.status_code, (frame[:200], a.text[:300], b.text[:300])
            if a.status_code >= 400:
                assert a.json()["error"]["code"] == b.json()["error"]["code"], frame[:200]
        _usable(in_slices)
