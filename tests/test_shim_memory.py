"""What a held conversation costs the server, measured (tracemalloc) over a real shim, and what its states share.

The workload is the `memory` benchmark's agent loop (`benchmarks/memory.py`): each turn a 4 KB
tool output and a user message in, a function call out, chained with `previous_response_id`
over a raw WebSocket. Bytes are asserted, never time.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from support.wire import ws_url
from websockets.asyncio.client import connect

import server_shim
from benchmarks.memory import TARGET_MB, AgentLoop
from server_shim.backends.chat_convert import RENDERING, ChatPrompt, chat_prompt
from server_shim.callids import with_calls
from server_shim.history import History
from server_shim.state import ChainLedger, ResponseState, shared_tools
from server_shim.tools import ChatTools

MB = 1024 * 1024


SHIM_CODE = str(Path(server_shim.__file__).parent / "*")


def server_bytes(before: tracemalloc.Snapshot) -> int:
    """Bytes the shim's own code allocated since `before` and still holds (decoded frames, items, renderings,
    Response objects, states: all made in `server_shim/`). tracemalloc sees the whole process: in a full
    test run that includes other tests' servers still shutting down in their threads and pytest's log
    capture, and the test client's own allocations (orjson's key cache), none of them the conversation's."""
    after = tracemalloc.take_snapshot()
    shim = tracemalloc.Filter(True, SHIM_CODE)
    return sum(stat.size_diff for stat in after.filter_traces([shim]).compare_to(before, "filename"))


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


def _turn(parent: ResponseState | None, n: int, tools: list[dict[str, Any]]) -> ResponseState:
    """One agent-loop turn as `turn.py` builds it: the input rendered, the output appended, the tools repeated."""
    base = parent.history if parent is not None else History()
    given = [
        {"type": "function_call_output", "call_id": f"call_{n - 1}", "output": f"record {n}: " + "x" * 4000},
        {"type": "message", "role": "user", "content": f'call lookup {{"n": {n}}}'},
    ]
    history = base.extend(given)
    chat_prompt(history)  # the chat backend renders the turn's input, cached with the history
    output = [{"type": "function_call", "call_id": f"call_{n}", "name": "lookup", "arguments": f'{{"n": {n}}}'}]
    response = {"id": f"r{n}", "previous_response_id": parent.id if parent else None, "tools": [dict(tools[0])]}
    return ResponseState(
        response=response,
        input_items=given,
        output_items=output,
        tools=shared_tools(tools, response, parent),
        chat_tools=parent.chat_tools if parent is not None else ChatTools(),
        history=history.extend(output),
        call_ids=with_calls(parent.call_ids if parent else frozenset(), [f"call_{n}"]),
        base_held=base.held,
        parent=parent,
    )


def test_a_200_turn_chain_holds_linear_memory_and_the_ledger_counts_what_tracemalloc_sees():
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    ledger = ChainLedger()
    states: list[ResponseState] = []
    tracemalloc.start(1)
    try:
        for n in range(200):
            states.append(_turn(states[-1] if states else None, n, [dict(tools[0])]))
            ledger.add(states[-1])
            if n == 99:
                half = tracemalloc.get_traced_memory()[0]
        whole = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 0.85 < (whole - half) / half < 1.2, "the second 100 turns hold what the first 100 did"
    assert 0.8 < ledger.total / whole < 1.25, f"ledger {ledger.total} bytes, tracemalloc {whole}"
    assert whole < 200 * 3 * 4096, f"{whole / 200:.0f} bytes per 4 KB turn: the text is held about twice, not more"
