"""The connection cache (bounded by count and bytes, LRU) and the response store, alone and over the wire."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, completed_ok, only_connection, recv_event, run_turn, send_raw, user

from server_shim.render import ChatPrompt, render_items
from server_shim.state import ConnectionCache, MemoryResponseStore, ResponseState
from server_shim.tools import ChatTools


def state(response_id: str, text: str = "x") -> ResponseState:
    return ResponseState(
        response={"id": response_id},
        input_items=[],
        output_items=[],
        tools=[],
        chat_tools=ChatTools(),
        prompt=ChatPrompt().extend(render_items([user(text)])),
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
