"""Replica failover through `ws_transport.wrap()`: two shim processes on one Redis.

The client reaches them through a balancer, or directly with `failover_base_urls`. Replica A is
killed with SIGKILL in the middle of a conversation; the wrapped client reconnects to replica B,
which continues from the responses A stored in Redis. The caller sees no error and no lost turn.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx2
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


async def lanes_busy(port: int) -> bool:
    """Whether replica `port` has a turn in flight (its `responses_ws_active_lanes` gauge)."""
    async with httpx2.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return any(
        line.startswith("responses_ws_active_lanes ") and float(line.split()[1]) > 0 for line in text.splitlines()
    )


def killer(replica_a, mid_turn: bool, in_flight_on_a):
    """The `on_turn` hook: kill A before turn KILL_AT (the client idle) or while that turn runs on A."""

    async def on_turn(step: int, create) -> Any:
        if step != KILL_AT:
            return await create
        if not mid_turn:  # A dies while the client is idle; its next turn chains from A's response in Redis
            os.kill(replica_a.pid, signal.SIGKILL)
            await asyncio.sleep(0.3)
            return await create
        task = asyncio.ensure_future(create)
        while not await in_flight_on_a():  # the turn's frame has reached A: it is in flight there
            await asyncio.sleep(0.005)
        os.kill(replica_a.pid, signal.SIGKILL)
        return await task

    return on_turn


def check_stats(stats: Any, mid_turn: bool) -> None:
    assert stats.turns == TURNS
    # every turn but the first went out chained; the one A died in was resent in full, once
    assert stats.turns_chained == TURNS - 1
    assert stats.resends == (1 if mid_turn else 0)


@pytest.mark.parametrize("mid_turn", [False, True], ids=["between-turns", "mid-turn"])
async def test_behind_a_balancer_a_conversation_survives_sigkill_of_its_replica(cluster, mid_turn):
    proxy, (replica_a, _), (port_a, port_b) = cluster
    client = ws_transport.wrap(AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="k", max_retries=0))
    before = proxy.bytes_to[port_a]

    async def frame_reached_a() -> bool:
        return proxy.bytes_to[port_a] > before

    async with client:
        texts = await conversation(client, killer(replica_a, mid_turn, frame_reached_a))
        check_stats(ws_transport.session_of(client).stats, mid_turn)
    assert len(texts) == TURNS and all(texts)
    assert proxy.connections_to[port_a] >= 1 and proxy.connections_to[port_b] >= 1


@pytest.mark.parametrize("mid_turn", [False, True], ids=["between-turns", "mid-turn"])
async def test_with_failover_urls_a_conversation_survives_sigkill_of_its_replica(cluster, mid_turn):
    _, (replica_a, _), (port_a, port_b) = cluster
    client = ws_transport.wrap(
        AsyncOpenAI(base_url=f"http://127.0.0.1:{port_a}/v1", api_key="k", max_retries=0),
        failover_base_urls=(f"http://127.0.0.1:{port_b}/v1",),
    )
    async with client:
        texts = await conversation(client, killer(replica_a, mid_turn, lambda: lanes_busy(port_a)))
        session = ws_transport.session_of(client)
        check_stats(session.stats, mid_turn)
        assert session.stats.reconnects >= 1 and session.connections
    assert len(texts) == TURNS and all(texts)
