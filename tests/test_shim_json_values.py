"""`max_json_values`: a request's JSON values counted from its text before it is parsed or walked.

One legal-sized frame can hold millions of values (70,000 lists 61 deep in 8 MiB); every pass over them
(the depth walk, validation, copies) held the event loop for seconds. The count (`json_shape`) against a
Python walk on generated documents; a refusal that stops reading early; the attack shapes refused with
`too_many_json_values` over WebSocket and HTTP, the connection chaining afterwards and a second
connection's turns going on meanwhile; unknown top-level fields forwarded as they were, not copied; what
is left per value (the memory footprint of many tools) walked in slices, or taken from the parent state.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from support.ticks import ticks_beside
from support.wire import API_KEY, MODEL, completed_ok, recv_event, run_turn, send_raw

from server_shim.backends import SimulatedBackend
from server_shim.events import new_id
from server_shim.footprint import footprint, footprint_steps
from server_shim.history import History
from server_shim.json_shape import STEP_BYTES, TooManyValues, bounds, depth, measure, measure_steps
from server_shim.request_fields import SHIM_FIELDS, responses_fields
from server_shim.requests import CreateRequest, parse_create
from server_shim.state import MemoryResponseStore, ResponseState
from server_shim.tools import chat_tools
from server_shim.turn import Turn, TurnEnv

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_TRICKY = st.sampled_from(['"', "\\", '\\"', "\\\\", "[]", "{}", ",", ":", "é", "\u2028", " ", "\n", "x"])
_STRINGS = st.lists(_TRICKY, max_size=6).map("".join) | st.text(max_size=8)
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _STRINGS
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_STRINGS, inner, max_size=5),
    max_leaves=60,
)


def truth(value: Any) -> tuple[int, int]:
    """Values and depth by walking the parsed value (a scalar: depth 0)."""
    if isinstance(value, (list, dict)):
        children = [truth(child) for child in (value.values() if isinstance(value, dict) else value)]
        return 1 + sum(c[0] for c in children), 1 + max((c[1] for c in children), default=0)
    return 1, 0


def measured(data: str | bytes, step: int, max_values: int = 0) -> tuple[int, int]:
    steps = measure_steps(data, max_values, 1024, step)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value.values, done.value.depth


@EXAMPLES
@given(_VALUES, st.sampled_from([1, 2, 3, 7, 64, STEP_BYTES]), st.booleans(), st.sampled_from([None, 0, 2]))
def test_the_count_and_depth_from_the_text_are_those_of_the_parsed_value(value, step, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    expected = truth(orjson.loads(text))
    assert measured(text, step) == expected
    assert measured(text.encode(), step) == expected


@EXAMPLES
@given(_VALUES | st.text(max_size=40), st.booleans(), st.integers(1, 400), st.integers(0, 70))
def test_the_bounds_never_settle_what_the_exact_count_would_refuse(value, as_bytes, max_values, max_depth):
    """`bounds` (a small frame's shortcut) is taken only where the exact count would not refuse, and gives at
    least the exact figures: the depth it gives spares a nesting walk only where the walk finds nothing. Text
    that is not JSON too (a raw string), which the parse refuses after either."""
    text = json.dumps(value) if not isinstance(value, str) or value[:1] in ('"', "") else value
    data = text.encode() if as_bytes else text
    bound = bounds(data, len(text.encode()), max_values, max_depth)
    if bound is None:
        return
    exact = measure(data, max_values, 1024)  # raises TooManyValues if the exact count refuses
    assert bound.values >= exact.values and bound.depth <= max_depth
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return  # not JSON: refused by the parse either way; its "depth" means nothing
    assert bound.depth >= exact.depth


def test_the_bounds_settle_a_small_shallow_frame_and_leave_the_rest_to_the_exact_count():
    assert bounds("[" * 10 + "]" * 10, 20, 21, 10) == (21, 10) and bounds("[" * 11 + "]" * 11, 22, 23, 10) is None
    assert bounds(b'{"a":"[{"}', 10, 11, 3) == (11, 3)  # brackets in strings count: a bound, never too low
    assert bounds("[]", 2, 2, 64) is None  # not fewer bytes than the values bound: counted exactly


def test_depth_is_exact_up_to_the_cap_and_capped_beyond():
    assert depth(b"", 5) == 0 and depth(b"[]", 5) == 1 and depth(b"[[][[]]]", 5) == 3
    deep = b"[" * 40 + b"]" * 40
    assert depth(deep * 100, 64) == 40 and depth(deep, 39) == 40 and depth(deep, 10) == 11
    assert depth(b"[[]]" * 50_000, 64) == 2  # many shallow: C passes; few deep: runs
    assert measure("[[1,[2]],{}]") == measure(b" [ [1 , [ 2 ] ] , { } ] ")


def _lists_61_deep(count: int) -> dict[str, Any]:
    nested: Any = 0
    for _ in range(60):
        nested = [nested]
    return {"model": MODEL, "input": "x", "store": False, "zzz": [nested] * count}


def test_a_refusal_stops_reading_soon_after_the_bound():
    """Work done, not time: an 8 MiB document of 4.3 M values, bound 100,000, is refused after reading
    the first few slices of its text (the count stops there), not the whole of it."""
    text = orjson.dumps(_lists_61_deep(70_000))
    steps, read = measure_steps(text, 100_000), 0
    try:
        while True:
            next(steps)
            read += 1
    except TooManyValues as refused:
        assert 100_000 < refused.seen <= 100_000 + STEP_BYTES
    assert len(text) > 8 * 2**20 and read < 8 < len(text) // STEP_BYTES


def test_unknown_fields_reach_a_responses_upstream_as_they_were_sent_not_copies():
    extra = {"nested": [{"a": [1, 2]}], "flag": True}
    body = {"model": "m", "input": "x", "store": False, "zzz": extra, "temperature": 0.5, "text": {"verbosity": "low"}}
    request = parse_create(body, websocket=False)
    fields = responses_fields(request)
    assert fields == request.model_dump(exclude=set(SHIM_FIELDS), exclude_none=True)
    assert fields["zzz"] is request.model_extra["zzz"]  # type: ignore[index]


ATTACKS = {
    "61-deep lists": _lists_61_deep(4_000),
    "metadata keys": {"model": MODEL, "input": "x", "metadata": {f"k{j}": "" for j in range(120_000)}},
    "tool properties": {
        "model": MODEL,
        "input": "x",
        "tools": [
            {
                "type": "function",
                "name": f"f{t}",
                "parameters": {
                    "type": "object",
                    "properties": {f"p{j}": {"type": "string", "description": "d"} for j in range(300)},
                },
            }
            for t in range(128)
        ],
    },
    "items of parts": {
        "model": MODEL,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": ""}] * 20} for _ in range(5_000)],
    },
}


async def test_documents_over_the_bound_are_refused_by_name_and_the_connection_chains(make_server):
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="remember", store=False)
        for name, body in ATTACKS.items():
            await send_raw(conn, orjson.dumps({"type": "response.create", "store": False, **body}))
            error = await recv_event(conn)
            assert error["type"] == "error" and error["error"]["code"] == "too_many_json_values", (name, error)
            assert "100000" in error["error"]["message"]
        completed_ok(await run_turn(conn, input="and now", previous_response_id=first.id, store=False))
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        answer = await http.post("/responses", content=orjson.dumps(ATTACKS["61-deep lists"]))
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "too_many_json_values"


async def test_a_document_under_the_bound_still_gets_its_depth_checked(make_server):
    """The depth read from the text spares the walks only when it is within the limits."""
    server = make_server(max_json_values=1_000)
    schema: Any = {"type": "string"}
    for _ in range(20):  # 41 levels: over max_tool_schema_depth (32), under max_json_depth (64)
        schema = {"type": "object", "properties": {"p": schema}}
    tool = {"type": "function", "name": "f", "parameters": schema}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        refused = await run_turn(conn, input="x", tools=[tool], store=False)
        assert refused.error is not None and refused.error["error"]["code"] == "tool_schema_too_deep"
        nested: Any = 0
        for _ in range(70):
            nested = [nested]
        await send_raw(conn, orjson.dumps({"type": "response.create", "model": MODEL, "input": "x", "zzz": nested}))
        error = await recv_event(conn)
        assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "zzz"
        completed_ok(await run_turn(conn, input="x", store=False))


async def _turn_times(conn: Any, stop: asyncio.Event, into: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        completed_ok(await run_turn(conn, input="hi", store=False, max_output_tokens=1))
        into.append(time.monotonic() - start)


async def test_a_second_connection_keeps_its_turns_going_while_attack_frames_arrive(make_server):
    """8 MiB of 61-deep lists over HTTP, twice, while another connection runs turns: its longest turn
    stays within a generous bound of its own median measured just before (this took 6-10 s per
    request when every value was walked; the refusal now reads a few slices of the text)."""
    server = make_server()
    attack = orjson.dumps(_lists_61_deep(70_000))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        baseline: list[float] = []
        for _ in range(10):
            start = time.monotonic()
            completed_ok(await run_turn(conn, input="hi", store=False, max_output_tokens=1))
            baseline.append(time.monotonic() - start)
        stop, during = asyncio.Event(), []
        beside = asyncio.create_task(_turn_times(conn, stop, during))
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60) as http:
            for _ in range(2):
                answer = await http.post("/responses", content=attack)
                assert answer.json()["error"]["code"] == "too_many_json_values"
        stop.set()
        await beside
        assert during and max(during) < 1.0 + 20 * statistics.median(baseline), (baseline, during)


def test_the_footprint_in_steps_is_the_footprint_and_pauses_per_containers():
    tools = ATTACKS["tool properties"]["tools"]
    steps, pauses = footprint_steps(tools, None, 1_000), 0
    while True:
        try:
            next(steps)
            pauses += 1
        except StopIteration as done:
            assert done.value == footprint(tools)
            break
    assert 128 * 300 // 1_000 <= pauses <= 128 * 302 // 1_000 + 1  # one pause per 1,000 containers


async def _ticks_while_preparing(tools: list[dict[str, Any]]) -> int:
    env = TurnEnv(backend=SimulatedBackend(), store=MemoryResponseStore())
    turn = Turn(CreateRequest(model=MODEL, input="x", tools=tools, store=False), env, None)
    return (await ticks_beside(turn.prepare()))[0]


async def test_a_turn_measures_many_tools_in_slices_that_let_other_tasks_run():
    """128 tools of 300 properties (~38,000 containers): their footprint, ~100 ms in one walk, is taken
    in slices while the turn is prepared; one small tool is measured in one go."""
    many = await _ticks_while_preparing(ATTACKS["tool properties"]["tools"])
    few = await _ticks_while_preparing(ATTACKS["tool properties"]["tools"][:1])
    assert many >= few + 30, (few, many)


def test_a_state_keeping_its_parents_tools_keeps_their_footprint_unwalked():
    tools = ATTACKS["tool properties"]["tools"]
    history = History().extend([{"type": "message", "role": "user", "content": "x"}])

    def state(tools_list: list[dict[str, Any]], parent: ResponseState | None, held: int | None) -> ResponseState:
        response = {"id": new_id("resp"), "tools": tools_list}
        return ResponseState(
            response, [], [], tools_list, chat_tools([]), history, frozenset(), tools_held=held, parent=parent
        )

    first = state(tools, None, None)
    assert first.tools_held == footprint(tools)
    second = state(first.tools, first, -1)  # -1 would show if it were used instead of the parent's
    assert second.tools_held == first.tools_held and second.size == first.size


async def test_a_large_echoed_schema_is_measured_in_slices_and_counted_the_same():
    """A `text.format` schema of 40,000 properties is echoed in the Response: its footprint is taken in
    slices while the turn is prepared, and the state holds exactly what walking it at once gives."""
    schema = {"type": "object", "properties": {f"p{j}": {} for j in range(40_000)}}
    text = {"format": {"type": "json_schema", "name": "s", "schema": schema}}
    env = TurnEnv(backend=SimulatedBackend(), store=MemoryResponseStore())
    turn = Turn(CreateRequest(model=MODEL, input="x", text=text, store=False), env, None)
    ticks, _ = await ticks_beside(turn.prepare())
    assert ticks >= 40
    plan = turn._plan
    assert plan is not None and plan.held.echo
    response = {"id": new_id("resp"), "text": dict(turn.request.text or {})}
    measured = ResponseState(response, [], [], [], chat_tools([]), plan.history, frozenset(), echo_held=plan.held.echo)
    walked = ResponseState(response, [], [], [], chat_tools([]), plan.history, frozenset())
    assert measured.own_bytes == walked.own_bytes
