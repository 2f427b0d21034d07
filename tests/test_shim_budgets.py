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

from support.wire import MODEL, ws_url
from websockets.asyncio.client import connect as ws_connect

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
