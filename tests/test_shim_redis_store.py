"""The Redis response store on a real redis-server: encoding, TTL, bound, tenants, replicas, faults."""

from __future__ import annotations

import asyncio
import time

import httpx2
import openai
import orjson
import pytest
from openai import AsyncOpenAI
from support.wire import LOOKUP_TOOL, MODEL, TurnEvents, completed_ok, run_turn, user

from server_shim.backends.chat_convert import chat_prompt
from server_shim.history import History
from server_shim.ledger_sinks import RedisStreamSink
from server_shim.redis_store import RedisResponseStore, UnreadableEntry, decode_state, encode_state
from server_shim.state import ResponseState
from server_shim.tools import chat_tools


def state(response_id: str, text: str = "hello", tenant: str | None = "alice") -> ResponseState:
    items = [user(text)]
    output = [{"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}", "id": "fc_1"}]
    return ResponseState(
        response={"id": response_id, "object": "response", "output": output},
        input_items=items,
        output_items=output,
        tools=[LOOKUP_TOOL],
        chat_tools=chat_tools([LOOKUP_TOOL]),
        history=History().extend(items).extend(output),
        call_ids=frozenset({"call_1"}),
        deployment="simulated",
        carry={"upstream": "resp_up"},
        tenant=tenant,
    )


def batches(state: ResponseState) -> list[bytes]:
    """What the history list holds for a state: one JSON array per batch of items."""
    return [orjson.dumps(batch) for batch in state.history.batch_list()]


def test_the_encoding_round_trips_every_field_and_the_rendered_bytes():
    original = state("resp_1")
    entry = encode_state(original, "responses-ws:hist:resp_1")
    assert entry.startswith(b"3\tresponses-ws:hist:resp_1\t2\n") and b"function_call" not in entry.split(b"\n")[0]
    decoded = decode_state(entry, batches(original))
    assert decoded == original
    assert chat_prompt(decoded.history).fragments == chat_prompt(original.history).fragments
    assert chat_prompt(decoded.history).encoded_messages("sys") == chat_prompt(original.history).encoded_messages("sys")


def test_entries_that_kept_chat_messages_read_as_absent_unknown_fields_are_ignored():
    original = state("resp_1")
    body = orjson.loads(encode_state(original, "unused").partition(b"\n")[2])
    with pytest.raises(UnreadableEntry, match="older ones kept chat messages"):
        decode_state(orjson.dumps({"v": 1, **body, "messages": []}))  # v1: the history inline as chat messages
    with pytest.raises(UnreadableEntry, match="older ones kept chat messages"):
        decode_state(b"2\tkey\t2\n" + orjson.dumps(body), [b"{}", b"{}"])  # v2: chat messages in the list
    later = encode_state(original, "k").replace(b'"tenant"', b'"added_later":[1,2],"tenant"', 1)
    assert decode_state(later, batches(original)).id == "resp_1"
    with pytest.raises(UnreadableEntry, match="expired"):
        decode_state(encode_state(original, "k"), [])
    with pytest.raises(UnreadableEntry):
        decode_state(b"{not json")


async def test_the_store_saves_with_a_ttl_loads_for_its_tenant_only_and_deletes(redis_server):
    store = RedisResponseStore(redis_server.url, ttl_s=600)
    try:
        await store.save(state("resp_1"))
        ttl_ms = int(redis_server.command("PTTL", "responses-ws:resp:resp_1")[1:].split(b"\r")[0])
        assert 590_000 < ttl_ms <= 600_000
        assert (await store.load("resp_1", "alice")) == state("resp_1")
        assert await store.load("resp_1", "bob") is None
        assert await store.load("resp_1", None) is None
        assert await store.delete("resp_1", "bob") is False
        assert await store.load("resp_1", "alice") is not None
        assert await store.delete("resp_1", "alice") is True
        assert await store.load("resp_1", "alice") is None
        assert await store.delete("resp_1", "alice") is False
    finally:
        await store.aclose()


async def test_a_response_over_the_entry_bound_is_not_stored(redis_server):
    store = RedisResponseStore(redis_server.url, max_entry_bytes=2048)
    try:
        await store.save(state("resp_big", "x" * 4096))
        await store.save(state("resp_small"))
        assert await store.load("resp_big", "alice") is None
        assert await store.load("resp_small", "alice") is not None
    finally:
        await store.aclose()


async def test_an_unreadable_or_chat_only_entry_reads_as_absent_and_the_state_round_trips(redis_server):
    redis_server.command("SET", "responses-ws:resp:resp_bad", '{"v": 99}')
    redis_server.command("SET", "responses-ws:resp:resp_old", '{"v": 1, "messages": []}')
    store = RedisResponseStore(redis_server.url)
    try:
        assert await store.load("resp_bad", None) is None
        assert await store.load("resp_old", "alice") is None, "a v1 entry kept no items: absent, resent in full"
        await store.save(state("resp_new"))
        assert await store.load("resp_new", "alice") == state("resp_new")
    finally:
        await store.aclose()


def child(parent: ResponseState, response_id: str, text: str) -> ResponseState:
    """The next turn of `parent`, built as the turn builds it: the parent's history extended."""
    items = [user(text)]
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok " + text}]}]
    return ResponseState(
        response={"id": response_id, "previous_response_id": parent.id, "output": output},
        input_items=items,
        output_items=output,
        tools=[],
        chat_tools=None,
        history=parent.history.extend(items).extend(output),
        call_ids=parent.call_ids,
        tenant=parent.tenant,
    )


def redis_int(redis_server, *command: str) -> int:
    return int(redis_server.command(*command)[1:].split(b"\r")[0])


async def test_a_conversation_appends_to_one_history_so_redis_holds_o_of_total_bytes(redis_server):
    store, other = RedisResponseStore(redis_server.url), RedisResponseStore(redis_server.url)
    try:
        states = [state("resp_0")]
        await store.save(states[0])
        for turn in range(1, 60):
            states.append(child(states[-1], f"resp_{turn}", f"{turn} " + "x" * 2000))
            await store.save(states[-1])
        # one list holds the conversation's batches once; each entry holds only its own turn
        assert redis_server.command("KEYS", "responses-ws:hist:*").count(b"responses-ws:hist:") == 1
        history = "responses-ws:hist:resp_0"
        assert redis_int(redis_server, "LLEN", history) == states[-1].history.batches == 2 + 2 * 59
        entries = sum(redis_int(redis_server, "STRLEN", f"responses-ws:resp:{s.id}") for s in states)
        assert entries < 3 * states[-1].history.nbytes  # its items and response; a history copy per turn: ~30x
        for s in (states[0], states[30], states[-1]):
            assert (await other.load(s.id, "alice")).history == s.history
        # another process that loaded the tip appends to the same list
        follow = child(states[-1], "resp_next", "more")
        await other.save(follow)
        assert redis_int(redis_server, "LLEN", history) == follow.history.batches
        assert (await store.load("resp_next", "alice")).history == follow.history
    finally:
        await store.aclose()
        await other.aclose()


async def test_a_fork_gets_its_own_history_and_both_branches_read_back(redis_server):
    store = RedisResponseStore(redis_server.url)
    try:
        root = state("resp_root")
        await store.save(root)
        left, right = child(root, "resp_left", "left"), child(root, "resp_right", "right")
        await store.save(left)
        await store.save(right)  # the list already continues with `left`: `right` starts its own
        assert redis_int(redis_server, "LLEN", "responses-ws:hist:resp_root") == left.history.batches
        assert redis_int(redis_server, "LLEN", "responses-ws:hist:resp_right") == right.history.batches
        for s in (root, left, right):
            assert (await store.load(s.id, "alice")).history == s.history
    finally:
        await store.aclose()


async def test_a_response_whose_history_was_evicted_reads_as_absent(redis_server):
    store = RedisResponseStore(redis_server.url)
    try:
        await store.save(state("resp_1"))
        redis_server.command("DEL", "responses-ws:hist:resp_1")
        assert await store.load("resp_1", "alice") is None
    finally:
        await store.aclose()


# --- two replicas on one Redis -------------------------------------------------------------------


@pytest.fixture
def replicas(make_server, redis_server):
    return [make_server(store=redis_server.url) for _ in range(2)]


def ok(turn: TurnEvents) -> TurnEvents:
    completed_ok(turn)
    return turn


def sdk(server, key: str = "k") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


async def test_a_conversation_stored_on_one_replica_continues_on_the_other_over_both_transports(replicas):
    a, b = replicas
    async with sdk(a) as on_a, sdk(b) as on_b:
        async with on_a.responses.connect() as conn:
            first = ok(await run_turn(conn, input=[user('call lookup {"n": 1}')], tools=[LOOKUP_TOOL]))
        call = next(item for item in first.response["output"] if item["type"] == "function_call")
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
        async with on_b.responses.connect() as conn:
            second = ok(await run_turn(conn, input=[output], previous_response_id=first.id, tools=[LOOKUP_TOOL]))
        assert b.shim.stats.input_items_received == 1  # B got only the new item, the history came from Redis
        third = await on_b.responses.create(model=MODEL, input="and over HTTP", previous_response_id=second.id)
        assert third.status == "completed"
        assert (await on_a.responses.retrieve(third.id)).id == third.id
        await on_a.responses.delete(third.id)
        with pytest.raises(openai.NotFoundError):
            await on_b.responses.retrieve(third.id)


async def test_tenant_isolation_holds_across_replicas(make_server, redis_server):
    keys = ["alice sk-a", "bob sk-b"]
    a, b = (make_server(api_keys=keys, store=redis_server.url) for _ in range(2))
    async with sdk(a, "sk-a") as alice, sdk(b, "sk-b") as bob, sdk(b, "sk-a") as alice_on_b:
        stored = await alice.responses.create(model=MODEL, input="secret")
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(stored.id)
        async with bob.responses.connect() as conn:
            refused = await run_turn(conn, input="go", previous_response_id=stored.id)
            assert refused.error["error"]["code"] == "previous_response_not_found"
        assert (await alice_on_b.responses.retrieve(stored.id)).id == stored.id


# --- Redis faults --------------------------------------------------------------------------------


async def test_redis_down_fails_only_turns_that_need_the_store_and_the_service_recovers(replicas, redis_server):
    a, b = replicas
    async with sdk(a) as on_a, sdk(b) as on_b, on_a.responses.connect() as conn:
        first = ok(await run_turn(conn, input=[user("one")]))
        redis_server.stop()
        # the connection cache needs no store: the chain on this socket goes on
        second = ok(await run_turn(conn, input=[user("two")], previous_response_id=first.id))
        async with on_b.responses.connect() as other:
            refused = await run_turn(other, input=[user("three")], previous_response_id=second.id)
            assert refused.error["error"]["code"] == "store_unavailable"
            completed_ok(await run_turn(other, input=[user("no store needed")], store=False))
        probe = httpx2.get(b.base_url.removesuffix("/v1") + "/readyz").json()
        assert probe["ready"] is True and probe["store"] == {"kind": "redis", "reachable": False}
        with pytest.raises(openai.InternalServerError) as http_refused:
            await on_b.responses.retrieve(first.id)
        assert http_refused.value.status_code == 503 and http_refused.value.code == "store_unavailable"
        redis_server.start()  # persistence is off: what was stored is gone, the service is not
        fresh = ok(await run_turn(conn, input=[user("four")]))
        assert httpx2.get(b.base_url.removesuffix("/v1") + "/readyz").json()["store"]["reachable"] is True
        continued = await on_b.responses.create(model=MODEL, input="five", previous_response_id=fresh.id)
        assert continued.status == "completed"
    # usage accepted while Redis was down waited in the journal and reached the stream once it was back
    expected = {second.id, fresh.id, continued.id}
    deadline = time.monotonic() + 15
    while not expected <= (ids := {r.id for r in RedisStreamSink(redis_server.url).read()}):
        assert time.monotonic() < deadline, f"missing usage records: {expected - ids}"
        await asyncio.sleep(0.1)
