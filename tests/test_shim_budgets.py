"""Memory held across connections and tenants: queued frames, the server-wide cache budget, store quotas,
per-tenant connection slots, metadata limits.

Each probe runs a real server on loopback (real uvicorn, the real SDK or a raw WebSocket), bounded in
count and time; the accounting objects are tested as plain classes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from typing import Any

import openai
import pytest
import websockets
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, ws_url
from websockets.asyncio.client import connect as ws_connect

from server_shim.admission import ConnectionGate, tenant_connection_cap

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
        await ws.send(create(max_output_tokens=800))  # a slow response (4 s): what follows waits behind it
        await asyncio.sleep(0.2)
        connection = next(iter(server.shim.connections))
        gc.collect()
        tracemalloc.start(1)
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(16):
                await ws.send(frame)
            while connection.queued.requests < 16:
                await asyncio.sleep(0.02)
            queued = connection.queued.nbytes
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert queued == 16 * len(frame)
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
