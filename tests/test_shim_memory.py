"""What a held conversation costs the server, measured (tracemalloc) over a real shim, and what its states share.

The workload is the `memory` benchmark's agent loop (`benchmarks/memory.py`): each turn a 4 KB
tool output and a user message in, a function call out, chained with `previous_response_id`
over a raw WebSocket. Bytes are asserted, never time.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest
from support.wire import ws_url
from websockets.asyncio.client import connect

from benchmarks.memory import TARGET_MB, AgentLoop
from server_shim.backends.chat_convert import RENDERING, ChatPrompt
from server_shim.history import History
from server_shim.state import ResponseState

MB = 1024 * 1024


def server_bytes(before: tracemalloc.Snapshot) -> int:
    """Bytes allocated since `before` and still held, less the test client's own (orjson's key cache
    keeps keys the client decoded: process-wide, not the server's)."""
    after = tracemalloc.take_snapshot()
    client = tracemalloc.Filter(False, AgentLoop.run.__code__.co_filename)
    return sum(stat.size_diff for stat in after.filter_traces([client]).compare_to(before, "filename"))


@pytest.mark.parametrize("store", [True, False])
async def test_a_held_50_turn_agent_loop_costs_the_server_under_the_target_and_grows_linearly(make_server, store):
    server = make_server(usage_ledger="off")
    async with connect(ws_url(server), max_size=None) as warm:
        await AgentLoop(warm, store).run(3)
    async with connect(ws_url(server), max_size=None) as ws:
        loop = AgentLoop(ws, store)
        gc.collect()
        tracemalloc.start(1)
        try:
            before = tracemalloc.take_snapshot()
            await loop.run(25)
            gc.collect()
            half = server_bytes(before)
            await loop.run(25)
            gc.collect()
            whole = server_bytes(before)
        finally:
            tracemalloc.stop()
        cache = next(c for c in server.shim.connections if c.cache.ids()).cache
        assert loop.json_bytes > 200_000, "the conversation is the issue's 200 KB one"
        assert whole < TARGET_MB * MB, f"{whole / MB:.3f} MB held for a {loop.json_bytes / 1024:.0f} KB conversation"
        assert 0.8 < (whole - half) / half < 1.25, "the second 25 turns hold what the first 25 did, not more"
        assert 0.75 < cache.nbytes / whole < 1.33, "the cache's byte bound counts what the conversation really holds"


def _prompt(history: History) -> ChatPrompt:
    return next(rendering for key, _, rendering in history._renderings if key == RENDERING)


def _ancestors(node: Any) -> list[Any]:
    chain = []
    while node is not None:
        chain.append(node)
        node = node.parent
    return chain


async def test_a_state_shares_its_history_rendering_tools_and_call_ids_with_its_parent(make_server):
    server = make_server(usage_ledger="off")
    async with connect(ws_url(server), max_size=None) as ws:
        await AgentLoop(ws, store=False).run(6)
        cache = next(iter(server.shim.connections)).cache
        states = [cache.get(i) for i in cache.ids()]
    assert all(isinstance(state, ResponseState) for state in states)
    first, second, third = states[-3:]
    assert second.history in _ancestors(third.history), "the child's history extends the parent's, not a copy"
    assert _prompt(second.history) in _ancestors(_prompt(third.history)), "the chat rendering's segments are shared"
    assert all(
        a is b for a, b in zip(_prompt(second.history).fragments, _prompt(third.history).fragments, strict=False)
    )
    assert third.tools is second.tools is first.tools, "the same tools every turn are held once"
    assert third.response["tools"] is third.tools, "the Response object echoes the state's list"
    assert third.call_ids.parent is second.call_ids  # type: ignore[attr-defined]
    assert third.base_held >= second.history.held, "what the parent holds is not charged to the child again"
    assert third.size > 3 * third.own_bytes, "a state is charged what it adds while its parent is held"
    assert 0.8 < third.own_bytes / second.own_bytes < 1.25, "each turn adds about the same"
