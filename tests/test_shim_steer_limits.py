"""Steer input held to the request limits, events that cannot be encoded, and the lanes gauge,
over real uvicorn with the official SDK's `responses.connect()` (raw frames where the SDK cannot build them).

Each case then completes a chained turn on the same connection: a refused frame costs nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx2
import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, run_turn, send_raw

from server_shim.limits import RequestLimits
from server_shim.steer import Steering
from server_shim.ws_frames import encode_event

DEEP_LIST = "[" * 300 + "]" * 300
"""Nested deeper than orjson encodes (~254 levels), well within what it decodes (1024)."""


def nested(depth: int) -> dict:
    value: dict = {"a": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.fixture
def slow_server(make_server):
    """100 tokens take half a second: time to steer a running response."""
    return make_server(simulated_tokens_per_s=200.0, max_input_items=10)


@pytest.fixture
async def slow_client(slow_server):
    async with AsyncOpenAI(base_url=slow_server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


async def read_raw_until(conn, kinds: set[str], seen: list[dict]) -> dict:
    """Raw events (a refused steer returns its input as sent, which the SDK's types may not parse)."""
    while True:
        event = json.loads(await asyncio.wait_for(conn.recv_bytes(), 10))
        seen.append(event)
        if event["type"] in kinds:
            return event


async def start_long_response(conn, seen: list[dict], stream_id: str = "a") -> str:
    await conn.response.create(model=MODEL, input="write", max_output_tokens=100, store=False, stream_id=stream_id)
    return (await read_raw_until(conn, {"response.created"}, seen))["response"]["id"]


@pytest.mark.parametrize("target", ["RUNNING", "resp_unknown"])
async def test_a_steer_nested_too_deep_to_encode_is_refused_and_every_lane_runs_on(slow_client, target, caplog):
    caplog.set_level(logging.ERROR)
    async with slow_client.responses.connect() as conn:
        seen: list[dict] = []
        parent = await start_long_response(conn, seen)
        other = await start_long_response(conn, seen, stream_id="b")
        target = parent if target == "RUNNING" else target
        await send_raw(
            conn, '{"type":"response.steer","previous_response_id":"' + target + '","input":' + DEEP_LIST + "}"
        )
        failed = await read_raw_until(conn, {"response.steer.failed"}, seen)
        assert failed["error"]["code"] == "invalid_value" and "nested deeper than 64" in failed["error"]["message"]
        assert failed["steer"] == {"input": "", "previous_response_id": target}, "too deep to return"
        done = {(await read_raw_until(conn, {"response.completed"}, seen))["response"]["id"] for _ in range(2)}
        assert done == {parent, other}, "both lanes finished: the connection was not dropped"
        chained = await run_turn(conn, input="more", previous_response_id=parent, store=False, stream_id="a")
        assert chained.types[-1] == "response.completed"
    assert not [r for r in caplog.records if r.name.startswith("server_shim")], "nothing logged as an error"


@pytest.mark.parametrize(
    ("steer_input", "code", "returned"),
    [
        # a part's unknown field 300 deep: accepted before, then server_error when the history was encoded
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "x", "extra": nested(300)}]}],
            "invalid_value",
            False,
        ),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": "x", "extra": nested(80)}]}],
            "invalid_value",
            False,
        ),
        ([{"role": "user", "content": "a"}] * 11, "too_many_input_items", True),  # max_input_items=10
    ],
    ids=["depth-300", "depth-80", "items"],
)
async def test_steer_input_gets_the_request_limits_with_their_codes(slow_client, steer_input, code, returned):
    async with slow_client.responses.connect() as conn:
        seen: list[dict] = []
        parent = await start_long_response(conn, seen)
        frame = {"type": "response.steer", "previous_response_id": parent, "input": steer_input}
        await send_raw(conn, json.dumps(frame))  # json: orjson (send_raw's) writes only ~254 levels
        failed = await read_raw_until(conn, {"response.steer.failed", "response.steer.accepted"}, seen)
        assert failed["type"] == "response.steer.failed" and failed["error"]["code"] == code
        assert failed["steer"]["input"] == (steer_input if returned else "")
        done = await read_raw_until(conn, {"response.completed", "response.incomplete", "error"}, seen)
        assert done["type"] == "response.completed" and done["response"]["id"] == parent, "not steered"
        assert not any(e["type"] == "error" for e in seen)
        chained = await run_turn(conn, input="more", previous_response_id=parent, store=False, stream_id="a")
        assert chained.types[-1] == "response.completed"


async def test_a_steer_within_the_limits_still_steers(slow_client):
    async with slow_client.responses.connect() as conn:
        seen: list[dict] = []
        parent = await start_long_response(conn, seen)
        steer_input = [{"role": "user", "content": [{"type": "input_text", "text": "stop"}]}] * 10
        await send_raw(conn, {"type": "response.steer", "previous_response_id": parent, "input": steer_input})
        await read_raw_until(conn, {"response.steer.accepted"}, seen)
        successor = await read_raw_until(conn, {"response.created"}, seen)
        assert successor["response"]["previous_response_id"] == parent
        done = await read_raw_until(conn, {"response.completed"}, seen)
        assert done["response"]["id"] == successor["response"]["id"]


def test_an_event_that_cannot_be_encoded_becomes_an_error_event_on_its_lane_logged_once(caplog):
    deep: list = []
    for _ in range(300):
        deep = [deep]
    caplog.set_level(logging.ERROR, logger="server_shim.ws_frames")
    sent = [json.loads(encode_event({"type": "response.steer.failed", "x": deep, "stream_id": "a"})) for _ in range(3)]
    assert sent[0] == {
        "type": "error",
        "status": 500,
        "stream_id": "a",
        "error": {
            "type": "server_error",
            "code": "event_encoding_failed",
            "param": None,
            "message": sent[0]["error"]["message"],
        },
    }
    assert "'response.steer.failed'" in sent[0]["error"]["message"]
    assert len(caplog.records) <= 1, "at most one log line, however often it happens"


def active_lanes(server) -> float:
    text = httpx2.get(server.base_url.removesuffix("/v1") + "/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith("responses_ws_active_lanes ")]
    return float(line.split()[1])


async def test_the_active_lanes_gauge_returns_to_where_it_was_once_connections_close(slow_server, slow_client):
    before = active_lanes(slow_server)
    for round_ in range(6):
        async with slow_client.responses.connect() as conn:
            for lane in ("L0", "L1", "L2"):  # pipelined, then closed at once: lane workers that never ran
                await conn.response.create(model=MODEL, input="x", store=False, stream_id=lane)
            if round_ % 2:
                await send_raw(conn, '{"type":"response.steer","previous_response_id":"r","input":' + DEEP_LIST + "}")
    async with slow_client.responses.connect() as conn:  # one that ends its turns normally
        turn = await run_turn(conn, input="x", store=False, stream_id="L0")
        assert turn.types[-1] == "response.completed"
    for _ in range(100):
        if not slow_server.shim.connections:
            break
        await asyncio.sleep(0.05)
    assert not slow_server.shim.connections
    assert active_lanes(slow_server) == before


def test_the_steers_queued_on_one_response_hold_at_most_one_request_s_items():
    steering = Steering(RequestLimits(max_input_items=3))
    steering.begin("resp_1", None)
    two = [{"role": "user", "content": "a"}] * 2
    assert steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": two})["type"] == (
        "response.steer.accepted"
    )
    refused = steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": two})
    assert refused["error"]["code"] == "too_many_input_items" and refused["steer"]["input"] == two
    one = steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": "b"})
    assert one["type"] == "response.steer.accepted", "what fits still goes"
