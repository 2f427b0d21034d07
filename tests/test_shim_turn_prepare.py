"""`plan_turn` takes a string input as the one user message it stands for, without the passes over a list's items
(compaction, validation): the plan must be the one its list form makes, whatever the previous state's calls."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from server_shim.backends import SimulatedBackend
from server_shim.requests import CreateRequest
from server_shim.state import ConnectionCache, MemoryResponseStore
from server_shim.turn import Turn, TurnEnv
from server_shim.turn_plan import TurnPlan, TurnResult
from server_shim.turn_prepare import plan_turn


def _plan(env: TurnEnv, cache: ConnectionCache, fields: dict[str, object]) -> TurnPlan:
    return asyncio.run(plan_turn(CreateRequest(model="m", **fields), env, cache, None, TurnResult()))


async def _previous(env: TurnEnv, cache: ConnectionCache) -> str:
    """A cached state whose output made a call (its id among the state's call ids)."""
    turn = Turn(CreateRequest(model="m", input='call lookup {"q": 1}', tools=[_TOOL]), env, cache)
    async for _ in turn.events():
        pass
    assert turn.response_id is not None
    return turn.response_id


_TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=20), st.booleans())
def test_string_input_plans_as_its_message(text: str, chained: bool) -> None:
    env = TurnEnv(backend=SimulatedBackend(), store=MemoryResponseStore())
    cache = ConnectionCache(10, 10**7)
    previous = {"previous_response_id": asyncio.run(_previous(env, cache))} if chained else {}
    plain = _plan(env, cache, {"input": text, **previous})
    listed = _plan(env, cache, {"input": [{"type": "message", "role": "user", "content": text}], **previous})
    assert plain.new_items == listed.new_items == [{"type": "message", "role": "user", "content": text}]
    assert plain.call_ids == listed.call_ids
    assert bool(plain.call_ids) == chained
    assert plain.history.items == listed.history.items
    assert plain.new_messages == listed.new_messages
