"""Memory held across connections and tenants: queued frames, the server-wide cache budget, store quotas,
per-tenant connection slots, metadata limits.

Each probe runs a real server on loopback (real uvicorn, the real SDK or a raw WebSocket), bounded in
count and time; the accounting objects are tested as plain classes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
from typing import Any

import httpx2
import openai
import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, ws_url
from test_shim_state import state
from websockets.asyncio.client import connect as ws_connect

import ws_transport
from server_shim.admission import ConnectionGate, tenant_connection_cap
from server_shim.budgets import CacheBudget, default_cache_budget
from server_shim.redis_quota import TenantQuota
from server_shim.redis_store import RedisResponseStore
from server_shim.state import MemoryResponseStore, ResponseState

MB = 1024 * 1024


def create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False, **fields})


async def until_terminal(ws: Any, timeout: float = 20) -> dict[str, Any]:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return event


async def test_queued_frames_hold_about_their_own_bytes_not_their_parsed_size(make_server):
    """Attack finding 4: frames queued behind a running response were held parsed (7-8x their JSON), so
    `max_queued_bytes` (frame bytes) let one connection hold ~110 MB. Now a waiting frame is kept as it came."""
    server = make_server(simulated_tokens_per_s=200, usage_ledger="off", sliced_parse_bytes=0)
    frame = create(max_output_tokens=1, unknown_field={f"k{j}": "" for j in range(20_000)})
    async with ws_connect(ws_url(server), max_size=None) as ws:
        # a slow response (10 s): what follows waits behind it, also when sending the 16 frames is slow (each
        # is read twice under tracemalloc, its values counted and then parsed: ~0.25 s a frame at load 8)
        await ws.send(create(max_output_tokens=2000))
        await asyncio.sleep(0.2)
        connection = next(iter(server.shim.connections))
        gc.collect()
        tracemalloc.start(1)
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(16):
                await ws.send(frame)
            deadline = time.monotonic() + 6
            while connection.queued.requests < 16 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            queued = connection.queued.nbytes
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert queued >= 8 * len(frame), "most frames wait behind the slow response"
        assert held < 2.5 * queued, f"{held / MB:.1f} MB held for {queued / MB:.1f} MB of queued frames"
        events = [await until_terminal(ws) for _ in range(17)]
        assert [event["type"] for event in events] == ["response.completed"] * 17
        await ws.send(create(input="after", max_output_tokens=1))
        assert (await until_terminal(ws))["type"] == "response.completed"


# --- metadata: OpenAI's limits ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ({f"k{j}": "" for j in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata"),
        ({"note": "v" * 513}, "metadata.note"),
    ],
)
async def test_metadata_over_openais_limits_is_invalid_value_and_the_connection_chains_on(make_server, metadata, param):
    server = make_server()
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="hi", metadata=metadata)
        assert refused.value.code == "invalid_value" and refused.value.param == param
        async with sdk.responses.connect() as conn:
            await conn.response.create(model=MODEL, input="first", store=False)
            first = await terminal(conn)
            await conn.response.create(model=MODEL, input="hi", store=False, metadata=metadata)
            error = await terminal(conn)
            assert error.type == "error" and error.error.code == "invalid_value" and error.error.param == param
            await conn.response.create(model=MODEL, input="on", store=False, previous_response_id=first.response.id)
            assert (await terminal(conn)).type == "response.completed"
    at_limit = {"k" * 64: "v" * 512, **{f"k{j}": "" for j in range(15)}}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        assert (await sdk.responses.create(model=MODEL, input="hi", metadata=at_limit)).metadata == at_limit


async def terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
            return event
    raise AssertionError("the connection closed")


# --- WebSocket connections per tenant ---------------------------------------------------------------


def test_the_tenant_connection_cap_defaults_to_half_the_server_with_several_tenants():
    assert tenant_connection_cap(50, None, tenants=2) == 25
    assert tenant_connection_cap(50, None, tenants=1) == 0, "one tenant: only the server-wide cap"
    assert tenant_connection_cap(50, 0, tenants=3) == 0, "0 turns it off"
    assert tenant_connection_cap(50, 7, tenants=1) == 7


def test_a_tenant_at_its_connection_share_is_refused_and_others_are_not():
    gate = ConnectionGate(max_connections=4, tenant_max_connections=2)
    assert gate.admit_connection("a") is None and gate.admit_connection("a") is None
    refusal = gate.admit_connection("a")
    assert refusal is not None and (refusal.status, refusal.code) == (503, "tenant_connection_limit_reached")
    assert gate.admit_connection("b") is None
    gate.connection_closed("a")
    assert gate.admit_connection("a") is None
    assert gate.open_connections == 3 and gate._tenants == {"a": 2, "b": 1}
    gate.connection_closed("b")
    assert gate._tenants == {"a": 2}


async def test_one_tenant_cannot_take_every_websocket_slot(make_server):
    """Attack finding 7: with max_connections 50, k1 opened 60 and k2's upgrade got 503."""
    server = make_server(api_keys=["alice k1", "bob k2"], max_connections=6)
    opened = []
    try:
        for _ in range(3):
            opened.append(await ws_connect(ws_url(server), additional_headers={"Authorization": "Bearer k1"}))
        with pytest.raises(websockets.InvalidStatus) as refused:
            await ws_connect(ws_url(server), additional_headers={"Authorization": "Bearer k1"})
        assert refused.value.response.status_code == 503 and refused.value.response.headers["Retry-After"] == "1"
        assert json.loads(refused.value.response.body)["error"]["code"] == "tenant_connection_limit_reached"
        bob = AsyncOpenAI(base_url=server.base_url, api_key="k2", max_retries=0)
        async with bob, bob.responses.connect() as conn:
            await conn.response.create(model=MODEL, input="bob is served", store=False)
            assert (await terminal(conn)).type == "response.completed"
        await opened.pop().close()
        opened.append(await ws_connect(ws_url(server), additional_headers={"Authorization": "Bearer k1"}))
    finally:
        for ws in opened:
            await ws.close()


async def test_a_third_tenant_gets_its_reserved_slot_on_a_real_server(make_server):
    """Two tenants at their caps (3 and 2 of 6 slots) leave the third its reserved one; over the wire, with
    the refusal's code and the served tenant's turn completing."""
    server = make_server(api_keys=["alice k1", "bob k2", "carol k3"], max_connections=6)

    async def open_as(key: str) -> Any:
        return await ws_connect(ws_url(server), additional_headers={"Authorization": f"Bearer {key}"})

    opened = [await open_as("k1") for _ in range(3)] + [await open_as("k2") for _ in range(2)]
    try:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await open_as("k2")
        body = json.loads(refused.value.response.body)["error"]
        assert refused.value.response.status_code == 503 and body["code"] == "tenant_connection_limit_reached"
        assert "kept for other API keys" in body["message"]
        carol = AsyncOpenAI(base_url=server.base_url, api_key="k3", max_retries=0)
        async with carol, carol.responses.connect() as conn:
            await conn.response.create(model=MODEL, input="carol is served", store=False)
            assert (await terminal(conn)).type == "response.completed"
    finally:
        for ws in opened:
            await ws.close()


# --- the server-wide cache budget -------------------------------------------------------------------


class FakeCache:
    """A cache as the budget sees it: a tenant and a list of response sizes, oldest first."""

    def __init__(self, tenant: str, *sizes: int) -> None:
        self.tenant = tenant
        self.sizes = list(sizes)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def drop_oldest(self) -> None:
        self.sizes.pop(0)


def test_over_the_budget_the_largest_tenants_least_recently_used_cache_loses_its_oldest_first():
    budget = CacheBudget(max_bytes=100)
    small = FakeCache("bob", 10)
    budget.settle(small)
    heavy_old, heavy_new = FakeCache("alice", 30, 30), FakeCache("alice")
    budget.settle(heavy_old)
    heavy_new.sizes.append(40)
    budget.settle(heavy_new)
    assert budget.total == 110 - 30 and heavy_old.sizes == [30], "alice's oldest response of her older connection"
    heavy_new.sizes.append(40)
    budget.settle(heavy_new)
    assert small.sizes == [10], "bob holds little: never evicted for alice"
    assert heavy_new.sizes == [40, 40] and heavy_old.sizes == [] and budget.total == 90
    assert budget.tenant_bytes("alice") == 80 and budget.tenant_bytes("bob") == 10 and budget.evicted == 2
    budget.leave(heavy_old)
    budget.leave(heavy_new)
    assert budget.total == 10 and budget.tenant_bytes("alice") == 0


def test_a_tenant_over_its_share_drops_its_own_and_a_cache_keeps_what_it_just_cached():
    budget = CacheBudget(max_bytes=1000, tenant_max_bytes=50)
    other = FakeCache("bob", 45)
    budget.settle(other)
    alone = FakeCache("alice", 20, 20, 70)
    budget.settle(alone)
    assert alone.sizes == [70] and other.sizes == [45], "over her share with one response: it stays, bob's too"
    assert budget.total == 115


class CountedCache(FakeCache):
    looks = 0

    def __len__(self) -> int:
        CountedCache.looks += 1
        return len(self.sizes)


def test_a_settle_that_drops_many_looks_at_about_as_many_caches_as_it_drops():
    """The review's case: many full caches of two tenants, then one large response; each drop must not
    walk every connection (500 caches x 5,000 drops stalled the loop for seconds)."""
    caches = [CountedCache("alice" if i % 2 else "bob", *[3] * 10) for i in range(500)]
    budget = CacheBudget(max_bytes=500 * 30)
    for cache in caches:
        budget.settle(cache)
    CountedCache.looks = 0
    large = CountedCache("alice", 2_000)
    budget.settle(large)
    assert budget.total <= budget.max_bytes and large.sizes == [2_000]
    assert budget.evicted >= 600
    assert CountedCache.looks < 4 * (budget.evicted + len(caches))


def test_the_default_budget_is_a_quarter_of_memory_and_at_least_64_mib():
    assert default_cache_budget(16 * 1024 * MB) == 4 * 1024 * MB
    assert default_cache_budget(100 * MB) == 64 * MB


async def test_the_caches_of_many_connections_stay_within_the_budget_and_another_tenant_keeps_its_own(make_server):
    """Attack finding 5: 30 connections of one tenant cached 672 MB (no bound above one connection)."""
    budget = 2 * MB
    server = make_server(api_keys=["alice k1", "bob k2"], cache_budget_bytes=budget, usage_ledger="off")
    bob = AsyncOpenAI(base_url=server.base_url, api_key="k2", max_retries=0)
    async with bob, bob.responses.connect() as kept:
        await kept.response.create(model=MODEL, input="bob's state", store=False)
        bobs = (await terminal(kept)).response.id
        heavy, ids = [], []
        try:
            for _ in range(8):
                ws = await ws_connect(ws_url(server), max_size=None, additional_headers={"Authorization": "Bearer k1"})
                heavy.append(ws)
                await ws.send(create(input="a" * 400_000, max_output_tokens=1))
                done = await until_terminal(ws)
                assert done["type"] == "response.completed"
                ids.append(done["response"]["id"])
            cached = await gauge(server, "responses_ws_cache_bytes")
            assert 0 < cached <= budget, f"{cached / MB:.2f} MB cached over a {budget / MB:.0f} MB budget"
            await heavy[0].send(create(input="on", previous_response_id=ids[0], max_output_tokens=1))
            dropped = await until_terminal(heavy[0])
            assert dropped["type"] == "error" and dropped["error"]["code"] == "previous_response_not_found"
            await heavy[0].send(create(input="anew", max_output_tokens=1))
            assert (await until_terminal(heavy[0]))["type"] == "response.completed", "the connection carries on"
            await kept.response.create(model=MODEL, input="on", store=False, previous_response_id=bobs)
            assert (await terminal(kept)).type == "response.completed", "bob's cached state survived alice's flood"
        finally:
            for ws in heavy:
                await ws.close()
    assert await gauge(server, "responses_ws_cache_bytes") <= budget


async def test_a_wrapped_client_whose_cached_state_the_budget_dropped_resends_and_carries_on(make_server):
    server = make_server(cache_budget_bytes=1 * MB, usage_ledger="off")
    client = ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0))
    try:
        history: list[Any] = [{"role": "user", "content": "b" * 300_000}]
        first = await client.responses.create(model=MODEL, input=history, store=False, max_output_tokens=2)
        history += [item.model_dump(exclude_none=True) for item in first.output]
        async with ws_connect(ws_url(server), max_size=None) as other:
            for _ in range(4):  # the same tenant's other connection: the budget drops the wrapped one's state
                await other.send(create(input="c" * 300_000, max_output_tokens=1))
                assert (await until_terminal(other))["type"] == "response.completed"
        assert server.shim.cache_budget.evicted >= 1
        history.append({"role": "user", "content": "and then?"})
        second = await client.responses.create(model=MODEL, input=history, store=False, max_output_tokens=2)
        assert second.status == "completed"
        assert ws_transport.session_of(client).stats.resends == 1, "previous_response_not_found, then the whole input"
    finally:
        await client.close()


async def gauge(server: Any, name: str) -> float:
    async with httpx2.AsyncClient(base_url=server.base_url.removesuffix("/v1")) as http:
        text = (await http.get("/metrics", headers={"Authorization": "Bearer k1"})).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


# --- stored responses per tenant ----------------------------------------------------------------------


def stored(response_id: str, tenant: str, text: str = "x") -> ResponseState:
    one = state(response_id, text)
    one.tenant = tenant
    return one


async def test_a_tenant_filling_the_store_drops_its_own_oldest_never_anothers():
    bobs = stored("bob-1", "bob")
    one_big = stored("probe", "alice", "a" * 50_000).size
    store = MemoryResponseStore(max_bytes=one_big * 5)
    await store.save(bobs)
    for n in range(20):
        await store.save(stored(f"alice-{n}", "alice", "a" * 50_000))
        assert store.nbytes <= store.max_bytes
    assert await store.load("bob-1", "bob") is bobs
    assert await store.load("alice-19", "alice") is not None and await store.load("alice-0", "alice") is None
    counted = MemoryResponseStore(max_responses=100)
    await counted.save(bobs)
    for n in range(300):  # the count bound: many tiny responses
        await counted.save(stored(f"tiny-{n}", "alice"))
    assert await counted.load("bob-1", "bob") is bobs and len(counted._states) == 100


async def test_a_tenant_over_its_quota_drops_its_own_oldest():
    store = MemoryResponseStore(tenant_max_responses=2, tenant_max_bytes=10**9)
    for name in ("a1", "a2", "a3"):
        await store.save(stored(name, "alice"))
    await store.save(stored("b1", "bob"))
    assert [await store.load(name, "alice") is not None for name in ("a1", "a2", "a3")] == [False, True, True]
    assert await store.load("b1", "bob") is not None
    assert store.nbytes == sum(store.tenant_bytes(tenant) for tenant in ("alice", "bob"))
    assert await store.delete("a2", "alice") and store.tenant_bytes("alice") == stored("a3", "alice").size


async def test_over_http_one_tenants_large_stores_do_not_evict_anothers_response(make_server):
    """Attack finding 6: after 48 of k1's 2.8 MB stored POSTs, k2's stored response answered 404."""
    server = make_server(api_keys=["alice k1", "bob k2"], store_max_bytes=4 * MB, usage_ledger="off")
    bob = AsyncOpenAI(base_url=server.base_url, api_key="k2", max_retries=0)
    alice = AsyncOpenAI(base_url=server.base_url, api_key="k1", max_retries=0)
    async with bob, alice:
        kept = await bob.responses.create(model=MODEL, input="bob's important state")
        for _ in range(12):
            await alice.responses.create(model=MODEL, input="a" * 500_000, max_output_tokens=1)
        assert server.shim.env.store.nbytes <= 4 * MB
        assert (await bob.responses.retrieve(kept.id)).id == kept.id
        again = await bob.responses.create(model=MODEL, input="and?", previous_response_id=kept.id)
        assert again.status == "completed"


async def test_on_redis_a_tenant_over_its_quota_drops_its_own_oldest_and_its_history(redis_server):
    """Attack finding 6 on the shared store: a quota per tenant (Redis's LRU alone evicts anyone's)."""
    quota = TenantQuota(max_responses=3, max_bytes=200_000)
    store = RedisResponseStore(redis_server.url, quota=quota, prefix="q:")
    try:
        await store.save(stored("bob-1", "bob"))
        for n in range(5):
            await store.save(stored(f"alice-{n}", "alice"))
        assert [await store.load(f"alice-{n}", "alice") is not None for n in range(5)] == [False] * 2 + [True] * 3
        assert await store.load("bob-1", "bob") is not None, "bob's response is never alice's to drop"
        for n in range(5, 9):  # 60 KB each: the byte quota holds three
            await store.save(stored(f"alice-{n}", "alice", "a" * 60_000))
        kept = [n for n in range(9) if await store.load(f"alice-{n}", "alice") is not None]
        assert kept == [6, 7, 8] and await store.load("bob-1", "bob") is not None
        raw = store._redis
        assert not await raw.exists("q:hist:alice-0"), "a dropped response's own history went with it"
        held = int(await raw.get("q:tenant:alice:bytes"))
        assert 180_000 < held <= 200_000
        assert await store.delete("alice-8", "alice")
        assert int(await raw.get("q:tenant:alice:bytes")) < held - 60_000
    finally:
        await store.aclose()


async def test_over_http_on_redis_a_tenants_quota_keeps_its_newest_conversation_and_anothers_response(
    make_server, redis_server
):
    server = make_server(api_keys=["alice k1", "bob k2"], store=redis_server.url, store_tenant_max_responses=3)
    bob = AsyncOpenAI(base_url=server.base_url, api_key="k2", max_retries=0)
    alice = AsyncOpenAI(base_url=server.base_url, api_key="k1", max_retries=0)
    async with bob, alice:
        kept = await bob.responses.create(model=MODEL, input="bob's state")
        previous = None
        ids = []
        for n in range(6):  # one chained conversation: its older responses go, its shared history stays
            response = await alice.responses.create(model=MODEL, input=f"turn {n}", previous_response_id=previous)
            previous = response.id
            ids.append(previous)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(ids[0])
        assert (await alice.responses.retrieve(ids[-1])).id == ids[-1]
        on = await alice.responses.create(model=MODEL, input="and on", previous_response_id=ids[-1])
        assert on.status == "completed"
        assert (await bob.responses.retrieve(kept.id)).id == kept.id


def test_two_busy_tenants_cannot_shut_out_a_third():
    """Attack leftover: with three tenants and the half-server cap, two tenants took all 6 slots."""
    gate = ConnectionGate(max_connections=6, tenant_max_connections=3, tenants=3)
    assert gate.tenant_reserved == 1
    assert all(gate.admit_connection("a") is None for _ in range(3))
    assert gate.admit_connection("b") is None and gate.admit_connection("b") is None
    refusal = gate.admit_connection("b")
    assert refusal is not None and refusal.code == "tenant_connection_limit_reached"
    assert "kept for other API keys" in refusal.message and "holds 2" in refusal.message
    assert gate.admit_connection("c") is None, "c is below its reserve: a slot was kept for it"
    assert gate.open_connections == 6


def test_no_reserve_with_one_tenant_or_the_tenant_cap_off():
    assert ConnectionGate(max_connections=6, tenant_max_connections=0, tenants=3).tenant_reserved == 0
    assert ConnectionGate(max_connections=6, tenants=1).tenant_reserved == 0
    gate = ConnectionGate(max_connections=6, tenants=0)
    assert all(gate.admit_connection(None) is None for _ in range(6))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=2, max_value=5),
    st.integers(min_value=4, max_value=40),
    st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=4)), max_size=200),
)
def test_a_tenant_below_its_reserve_is_always_admitted(tenants, max_connections, steps):
    """Any order of opens and closes: the server cap and the tenant cap hold, and a tenant under its reserve
    is never refused (what the reserve promises)."""
    cap = tenant_connection_cap(max_connections, None, tenants)
    gate = ConnectionGate(max_connections=max_connections, tenant_max_connections=cap, tenants=tenants)
    held = [0] * tenants
    for opening, who in steps:
        tenant = who % tenants
        if opening:
            refusal = gate.admit_connection(str(tenant))
            if held[tenant] < gate.tenant_reserved:
                assert refusal is None
            held[tenant] += refusal is None
        elif held[tenant]:
            gate.connection_closed(str(tenant))
            held[tenant] -= 1
        assert gate.open_connections == sum(held) <= max_connections
        assert max(held) <= cap
