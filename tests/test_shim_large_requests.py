"""A large request gives way to other connections between its stages instead of holding the loop throughout.

`python -m benchmarks load` (`big_frame`) and `python -m benchmarks.loop_stall` measure what large frames
cost another connection; here the rules (`limits.is_large`, `json_slices.parse_in_slices`) as plain
functions, and the yields of the turn and of a large frame's parse counted by a task beside them.
"""

from __future__ import annotations

import orjson
from openai import AsyncOpenAI
from support.ticks import ticks_beside
from support.wire import API_KEY, MODEL, completed_ok, recv_event, run_turn, send_raw, user

from server_shim.backends import SimulatedBackend
from server_shim.limits import LARGE_FRAME_BYTES, LARGE_ITEMS, RequestLimits, is_large
from server_shim.requests import CreateRequest
from server_shim.state import MemoryResponseStore
from server_shim.turn import Turn, TurnEnv
from server_shim.ws_frames import read_frame


def test_requests_past_the_item_count_or_the_frame_size_are_large():
    assert not is_large(items=LARGE_ITEMS - 1, nbytes=LARGE_FRAME_BYTES - 1)
    assert is_large(items=LARGE_ITEMS)
    assert is_large(nbytes=LARGE_FRAME_BYTES)


async def _yields_while_preparing(items: int) -> int:
    """How many times another task ran while one turn of `items` new items was prepared."""
    env = TurnEnv(backend=SimulatedBackend(), store=MemoryResponseStore())
    turn = Turn(CreateRequest(model=MODEL, input=[user(f"item {n}") for n in range(items)], store=False), env, None)
    return (await ticks_beside(turn.prepare()))[0]


async def test_a_large_turn_lets_other_tasks_run_between_its_passes_over_the_items():
    small = await _yields_while_preparing(3)
    large = await _yields_while_preparing(LARGE_ITEMS)
    assert large >= small + 3, (small, large)


MANY_VALUES = RequestLimits(max_json_values=1_000_000)
"""Frames of 60,000 items hold ~240,000 values: past `max_json_values`, refused before they are parsed."""


def _items_frame(count: int) -> bytes:
    items = [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]
    return orjson.dumps({"type": "response.create", "model": MODEL, "input": items, "store": False})


async def _yields_while_reading(frame: bytes, slice_from: int) -> int:
    ticks, (body, shape) = await ticks_beside(read_frame(frame, len(frame), slice_from, MANY_VALUES))
    assert body == orjson.loads(frame) and shape.depth == 3
    return int(ticks)


async def test_a_large_frame_is_parsed_in_slices_that_let_other_tasks_run():
    frame = _items_frame(60_000)  # 3.3 MB
    assert await _yields_while_reading(frame, slice_from=0) <= 1  # orjson: one call (the ticker wakes once after)
    assert await _yields_while_reading(frame, slice_from=256 * 1024) >= 20


async def test_large_frames_refused_or_malformed_leave_the_connection_chaining(make_server):
    """The sliced parse over a real connection: a 60,000-item frame gets `too_many_input_items`, the same
    frame cut short `invalid_json`, one with NaN `invalid_json`; the conversation then continues."""
    server = make_server(max_json_values=MANY_VALUES.max_json_values)
    big = _items_frame(60_000)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="remember", store=False)
        for frame, code in (
            (big, "too_many_input_items"),
            (big[:-10], "invalid_json"),
            (big[:-2] + b',"temperature":NaN}', "invalid_json"),
        ):
            await send_raw(conn, frame)
            error = await recv_event(conn, timeout=60)  # 3 MB frames on a loaded 2-core machine
            assert error["type"] == "error" and error["error"]["code"] == code, (code, error)
        accepted = _items_frame(4_000)
        await send_raw(conn, accepted)
        while (event := await recv_event(conn, timeout=60))["type"] != "response.completed":
            assert event["type"] != "error", event
        completed_ok(await run_turn(conn, input="and now", previous_response_id=first.id, store=False))
