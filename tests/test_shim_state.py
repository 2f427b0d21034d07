"""The connection cache (bounded by count and bytes, LRU) and the response store, alone and over the wire."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI, NotFoundError
from support.sizes import footprint_by_definition
from support.wire import API_KEY, MODEL, completed_ok, only_connection, recv_event, run_turn, send_raw, user, ws_url
from websockets.asyncio.client import connect as ws_connect

from server_shim.backends.chat_convert import chat_prompt
from server_shim.history import History
from server_shim.state import ChainLedger, ConnectionCache, MemoryResponseStore, ResponseState
from server_shim.tools import ChatTools


def state(response_id: str, text: str = "x") -> ResponseState:
    return ResponseState(
        response={"id": response_id},
        input_items=[],
        output_items=[],
        tools=[],
        chat_tools=ChatTools(),
        history=History().extend([user(text)]),
        call_ids=frozenset(),
    )


def test_the_cache_keeps_at_most_max_responses_dropping_the_least_recently_used():
    cache = ConnectionCache(max_responses=2, max_bytes=10**9)
    for name in ("a", "b"):
        cache.put(state(name))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put(state("c"))
    assert cache.ids() == ["a", "c"]
    assert "b" not in cache and len(cache) == 2


def test_the_cache_keeps_its_bytes_under_max_bytes():
    one = state("a", "y" * 1000).size
    cache = ConnectionCache(max_responses=100, max_bytes=3 * one)
    for name in "abcde":
        cache.put(state(name, "y" * 1000))
    assert len(cache) == 3 and cache.nbytes <= 3 * one
    assert cache.ids() == ["c", "d", "e"]


def test_a_single_state_larger_than_the_byte_bound_is_still_kept():
    cache = ConnectionCache(max_responses=10, max_bytes=10)
    cache.put(state("big", "z" * 5000))
    assert cache.ids() == ["big"]


def test_replacing_and_evicting_keep_the_byte_count_exact():
    cache = ConnectionCache(max_responses=10, max_bytes=10**9)
    cache.put(state("a", "short"))
    cache.put(state("a", "a much longer text"))
    assert cache.nbytes == state("a", "a much longer text").size
    cache.evict("a")
    cache.evict("never-there")
    assert cache.nbytes == 0 and len(cache) == 0


async def test_the_memory_store_saves_loads_deletes_and_drops_the_oldest():
    store = MemoryResponseStore(max_responses=2)
    for name in ("a", "b", "c"):
        await store.save(state(name))
    assert await store.load("a", None) is None
    assert (await store.load("c", None)).id == "c"
    assert await store.delete("b", None) is True
    assert await store.delete("b", None) is False
    await store.aclose()
    assert await store.load("c", None) is None


async def test_the_memory_store_answers_another_tenant_as_for_an_unknown_id():
    store = MemoryResponseStore()
    owned = state("a")
    owned.tenant = "alice"
    await store.save(owned)
    assert await store.load("a", "bob") is None and await store.load("a", None) is None
    assert await store.delete("a", "bob") is False
    assert (await store.load("a", "alice")) is owned
    assert await store.delete("a", "alice") is True


# --- over the wire -------------------------------------------------------------------------------


async def test_a_long_chain_keeps_only_the_newest_responses_within_the_count_bound(make_server):
    server = make_server(cache_max_responses=3)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        ids = []
        previous = None
        for step in range(5):
            turn = await run_turn(conn, input=[user(f"step {step}")], previous_response_id=previous, store=False)
            completed_ok(turn)
            ids.append(previous := turn.id)
        cache = only_connection(server).cache
        assert cache.ids() == ids[-3:]
        evicted = await run_turn(conn, input=[user("branch")], previous_response_id=ids[0], store=False)
        assert evicted.error["error"]["code"] == "previous_response_not_found"
        completed_ok(await run_turn(conn, input=[user("go on")], previous_response_id=ids[-1], store=False))


async def test_the_byte_bound_holds_over_the_wire(make_server):
    limit = 40_000
    server = make_server(cache_max_bytes=limit)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        previous = None
        for step in range(8):
            turn = await run_turn(
                conn, input=[user(f"{step} " + "p" * 6000)], previous_response_id=previous, store=False
            )
            completed_ok(turn)
            previous = turn.id
            cache = only_connection(server).cache
            assert cache.nbytes <= limit or len(cache) == 1
        assert previous in cache and len(cache) < 8


async def test_a_stored_response_evicted_from_the_cache_is_loaded_from_the_store(make_server):
    server = make_server(cache_max_responses=1)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        stored = await run_turn(conn, input=[user("keep")], store=True)
        await run_turn(conn, input=[user("other")], store=False)
        assert stored.id not in only_connection(server).cache
        completed_ok(await run_turn(conn, input=[user("back")], previous_response_id=stored.id, store=False))


async def test_a_refused_request_on_a_stored_parent_does_not_push_anything_out_of_the_cache(make_server):
    server = make_server(cache_max_responses=1)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk:
        async with sdk.responses.connect() as other:
            stored = await run_turn(other, input=[user("stored elsewhere")], store=True)
        async with sdk.responses.connect() as conn:
            local = await run_turn(conn, input=[user("connection-local")], store=False)
            cache = only_connection(server).cache
            assert cache.ids() == [local.id]
            await send_raw(
                conn,
                {
                    "type": "response.create",
                    "model": "simulated-1",
                    "previous_response_id": stored.id,
                    "input": [{"type": "message", "role": "robot", "content": "x"}],
                },
            )
            assert (await recv_event(conn))["error"]["param"] == "input[0].role"
            assert cache.ids() == [local.id], "a refused request evicted a connection-local response"
            completed_ok(await run_turn(conn, input=[user("still here")], previous_response_id=local.id, store=False))


@pytest.mark.parametrize("store", [True, False])
async def test_chaining_works_with_and_without_store(client, server, store):
    async with client.responses.connect() as conn:
        first = await run_turn(conn, input=[user("a")], store=store)
        completed_ok(await run_turn(conn, input=[user("b")], previous_response_id=first.id, store=store))


# --- memory by real footprint, histories shared along chains -------------------------------------


def chain(length: int, output_bytes: int = 4096) -> list[ResponseState]:
    """A conversation of `length` turns, each adding a 4 KB tool output, built the way turns build it."""
    states: list[ResponseState] = []
    history = History()
    for n in range(length):
        base = history
        items = [user(f"step {n}"), {"type": "function_call_output", "call_id": f"c{n}", "output": "o" * output_bytes}]
        history = base.extend(items)
        chat_prompt(history)  # what a chat backend renders on the turn, cached with the history
        parent = states[-1].id if states else None
        states.append(
            ResponseState(
                response={"id": f"r{n}", "previous_response_id": parent},
                input_items=items,
                output_items=[],
                tools=[],
                chat_tools=ChatTools(),
                history=history,
                call_ids=frozenset(),
                base_held=base.held,
            )
        )
    return states


def test_a_chain_is_counted_once_not_once_per_turn():
    states = chain(400)
    ledger = ChainLedger()
    for one in states:
        ledger.add(one)
    per_turn = states[-1].own_bytes
    assert per_turn > 4096, "the footprint counts the output itself"
    assert ledger.total < 400 * per_turn * 1.2, "O(total bytes)"
    assert states[-1].size > states[-1].history.held > 400 * 2 * 4096, "alone, the newest holds the whole history"


def test_evicting_a_parent_charges_its_child_with_the_history_it_still_holds():
    states = chain(3)
    ledger = ChainLedger()
    for one in states:
        ledger.add(one)
    ledger.remove("r1")
    assert ledger.total == states[0].size + states[2].size
    ledger.remove("r0")
    ledger.remove("r2")
    assert ledger.total == 0


def test_forks_of_one_parent_are_charged_what_they_add_then_in_full_when_it_leaves():
    (root,) = chain(1)
    forks = [
        ResponseState(
            response={"id": f"f{n}", "previous_response_id": root.id},
            input_items=[],
            output_items=[],
            tools=[],
            chat_tools=ChatTools(),
            history=root.history.extend([user(f"fork {n}")]),
            call_ids=frozenset(),
            base_held=root.history.held,
        )
        for n in range(3)
    ]
    ledger = ChainLedger()
    for one in (root, *forks):
        ledger.add(one)
    assert ledger.total == root.size + sum(fork.own_bytes for fork in forks)
    ledger.remove("f1")
    ledger.remove(root.id)
    assert ledger.total == forks[0].size + forks[2].size
    ledger.add(root)
    ledger.add(forks[1])  # a child of a parent held again is charged only what it adds
    assert ledger.total == forks[0].size + forks[2].size + root.size + forks[1].own_bytes
    for one in (*forks, root):
        ledger.remove(one.id)
    assert ledger.total == 0


def test_the_cache_keeps_a_long_chain_within_its_byte_bound():
    states = chain(400)
    history = states[-1].size
    cache = ConnectionCache(max_responses=10_000, max_bytes=history + 60 * states[-1].own_bytes)
    for one in states:
        cache.put(one)
    assert cache.nbytes <= cache.max_bytes
    assert len(cache) > 60, "the newest turns stay, each charged only what it adds to the shared history"


async def test_the_memory_store_is_bounded_by_bytes():
    states = chain(200)
    whole = ChainLedger()
    for one in states:
        whole.add(one)
    newest = states[-1].size  # the newest alone holds the whole history (items and their chat rendering)
    assert newest < whole.total
    bound = (newest + whole.total) // 2  # room for the newest, not for the whole chain
    store = MemoryResponseStore(max_responses=10_000, max_bytes=bound)
    for one in states:
        await store.save(one)
    assert store.nbytes <= bound
    assert await store.load("r199", None) is not None and await store.load("r0", None) is None


async def test_a_thousand_stored_turns_with_4kb_tool_outputs_hold_linear_memory(make_server):
    """The issue's case: store true, 4 KB tool outputs; 4k turns held 598 MB before (each state copied its history)."""
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        previous = None
        store = server.shim.env.store
        halfway = 0
        for n in range(300):
            turn = await run_turn(
                conn, input=[user(f"step {n}: " + "t" * 4096)], previous_response_id=previous, max_output_tokens=2
            )
            previous = turn.id
            halfway = store.nbytes if n == 149 else halfway
        cache = only_connection(server).cache
        assert 1.8 < store.nbytes / halfway < 2.2, "twice the turns hold twice the bytes, not four times"
        assert store.nbytes < 300 * 4096 * 6, f"{store.nbytes / 300:.0f} bytes per 4 KB turn in the store"
        assert cache.nbytes < 300 * 4096 * 6
        completed_ok(await run_turn(conn, input=[user("and one more")], previous_response_id=previous))


async def test_frames_of_many_tiny_items_are_counted_by_what_they_hold_and_memory_stays_bounded(make_server):
    """The issue's case: ten frames of tiny items took RSS from 44 MB to 2.7 GB (counted by JSON length only)."""
    server = make_server(cache_max_bytes=8 * 1024 * 1024, max_conversation_bytes=6 * 1024 * 1024)
    items = [{"type": "message", "role": "user", "content": "x"}] * 5_000
    rss_before = _rss()
    async with ws_connect(ws_url(server), max_size=None) as ws:
        previous = None
        codes = []
        for _ in range(10):  # one conversation: refused once it would hold more than its bound
            await ws.send(orjson.dumps({**_create(items, previous), "store": False}).decode())
            event = await _terminal(ws)
            codes.append(event["type"] if event["type"] != "error" else event["error"]["code"])
            previous = event["response"]["id"] if event["type"] == "response.completed" else previous
        assert "conversation_too_large" in codes and codes[0] == "response.completed"
        for _ in range(10):  # ten conversations: the cache drops the oldest to stay in its bound
            await ws.send(orjson.dumps({**_create(items, None), "store": False}).decode())
            assert (await _terminal(ws))["type"] == "response.completed"
        cache = only_connection(server).cache
        newest = cache.get(cache.ids()[-1])
        assert newest is not None and newest.own_bytes > 5_000 * 150, "each tiny item costs far more than its JSON"
        assert cache.nbytes <= 8 * 1024 * 1024
    assert _rss() - rss_before < 150 * 1024 * 1024


def _create(items: list[dict[str, Any]], previous: str | None) -> dict[str, Any]:
    return {
        "type": "response.create",
        "model": MODEL,
        "input": items,
        "previous_response_id": previous,
        "max_output_tokens": 1,
    }


async def _terminal(ws: Any) -> dict[str, Any]:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] in ("response.completed", "error"):
            return event


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_posts_of_large_stored_responses_keep_the_memory_store_within_its_byte_bound(make_server):
    """The issue's case: 150 POSTs of 1 MiB held 305 MB (the store had a count bound only)."""
    server = make_server(store_max_bytes=4 * 1024 * 1024)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        ids = [
            (await sdk.responses.create(model=MODEL, input="m" * 512 * 1024, max_output_tokens=1)).id for _ in range(20)
        ]
        store = server.shim.env.store
        assert store.nbytes <= 4 * 1024 * 1024
        assert (await sdk.responses.retrieve(ids[-1])).id == ids[-1], "the newest are kept"
        with pytest.raises(NotFoundError):
            await sdk.responses.retrieve(ids[0])


async def test_a_frame_of_60k_tiny_items_is_refused_before_anything_holds_it(make_server):
    server = make_server()
    items = [{"type": "message", "role": "user", "content": "x"}] * 60_000
    async with ws_connect(ws_url(server), max_size=None) as ws:
        await ws.send(orjson.dumps(_create(items, None)).decode())
        event = await _terminal(ws)
        # 240,000 JSON values: refused from the frame's text (max_json_values), before it is parsed
        assert event["type"] == "error" and event["error"]["code"] == "too_many_json_values"
        assert only_connection(server).cache.nbytes == 0


def test_footprint_matches_its_definition_on_any_json_like_value_with_shared_parts():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from server_shim.footprint import footprint

    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary())
    values = st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner), st.lists(inner).map(tuple), st.dictionaries(st.text(max_size=80), inner)
        ),
        max_leaves=40,
    )

    @settings(max_examples=300, deadline=None)
    @given(values)
    def check(value):
        shared = [value, {"again": value}]
        assert footprint(shared) == footprint_by_definition(shared)

    check()


def test_footprint_matches_its_definition_on_keys_without_length_subclasses_and_empty_dicts():
    """The walk checks every dict's keys for long ones at the end, all dicts in one pass: a number key, a
    long key beside it, only empty dicts, and dict/list/tuple subclasses still give the definition's figure."""
    from collections import OrderedDict, namedtuple

    from server_shim.footprint import footprint

    pair = namedtuple("pair", "a b")
    for value in (
        {1: "a", "k" * 70: 2, (1,) * 80: 3},
        [{}, {}, ()],
        OrderedDict(k=["x" * 100, {"y" * 65: None}]),
        pair([1, 2], {"z": 1.5}),
        {"shared": (shared := {"q": [1]}), "again": [shared]},
    ):
        assert footprint(value) == footprint_by_definition(value), value


def test_the_echoed_defaults_known_footprints_give_the_walked_figure():
    """A Response object's shared default fields are sized from `ECHO_DEFAULT_SIZES`, to the same total."""
    from server_shim.events import response_object
    from server_shim.footprint import footprint
    from server_shim.requests import CreateRequest
    from server_shim.response_held import ECHO_DEFAULT_SIZES

    for body in ({"model": "m"}, {"model": "m", "text": {"verbosity": "low"}, "reasoning": {"effort": "low"}}):
        response = response_object("resp_1", CreateRequest.model_validate(body), status="completed")
        assert footprint((response, {}, ()), ECHO_DEFAULT_SIZES) == footprint((response, {}, ()))
    assert footprint([{}, {"a": [1]}], {}) == footprint([{}, {"a": [1]}])
