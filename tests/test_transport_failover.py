"""Replica failover through `ws_transport.wrap()`: two shim processes on one Redis behind a balancer.

Replica A is killed with SIGKILL in the middle of a conversation; the wrapped client reconnects
through the balancer to replica B, which continues from the responses A stored in Redis. The
caller sees no error and no lost turn.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from openai import AsyncOpenAI
from support.chat_server import closed_port
from support.serve import wait_healthy
from support.tcp_proxy import FirstAliveProxy
from support.wire import MODEL, user

import ws_transport

TURNS = 8
KILL_AT = 4


@pytest.fixture
async def cluster(serve_process, redis_server, tmp_path):
    """Replicas A and B (slow first token, so a turn can be caught in flight) and the balancer before them."""
    config = tmp_path / "replica.toml"
    config.write_text("[server]\nsimulated_ttft_s = 0.4\n")
    ports = [closed_port(), closed_port()]
    replicas = [serve_process("--port", str(p), "--store", redis_server.url, "--config", str(config)) for p in ports]
    for port, process in zip(ports, replicas, strict=True):
        await asyncio.to_thread(wait_healthy, port, process)
    proxy = await FirstAliveProxy(ports).start()
    yield proxy, replicas, ports
    await proxy.aclose()


def as_input(output: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in output]


async def conversation(client: AsyncOpenAI, on_turn) -> list[str]:
    """An agent loop that keeps its full history, as callers of the wrapped client do."""
    history: list[dict[str, Any]] = []
    texts = []
    for step in range(TURNS):
        history.append(user(f"step {step}"))
        response = await on_turn(step, client.responses.create(model=MODEL, input=history))
        assert response.status == "completed"
        history.extend(as_input(response.output))
        texts.append(response.output_text)
    return texts


@pytest.mark.parametrize("mid_turn", [False, True], ids=["between-turns", "mid-turn"])
async def test_a_conversation_survives_sigkill_of_its_replica_with_no_caller_visible_error(cluster, mid_turn):
    proxy, (replica_a, _), (port_a, port_b) = cluster
    client = ws_transport.wrap(AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="k", max_retries=0))

    async def on_turn(step: int, create) -> Any:
        if step != KILL_AT:
            return await create
        if not mid_turn:  # A dies while the client is idle; its next turn chains from A's response in Redis
            os.kill(replica_a.pid, signal.SIGKILL)
            await asyncio.sleep(0.3)
            return await create
        before = proxy.bytes_to[port_a]
        task = asyncio.ensure_future(create)
        while proxy.bytes_to[port_a] == before:  # the turn's frame has reached A: it is in flight there
            await asyncio.sleep(0.005)
        os.kill(replica_a.pid, signal.SIGKILL)
        return await task

    async with client:
        texts = await conversation(client, on_turn)
        stats = ws_transport.session_of(client).stats
    assert len(texts) == TURNS and all(texts)
    assert proxy.connections_to[port_a] >= 1 and proxy.connections_to[port_b] >= 1
    assert stats.turns == TURNS
    # every turn but the first went out chained; the one A died in was resent in full, once
    assert stats.turns_chained == TURNS - 1
    assert stats.resends == (1 if mid_turn else 0)
