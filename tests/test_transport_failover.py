"""Replica failover through `ws_transport.wrap()`: two shim processes on one Redis.

The client reaches them through a balancer, or directly with `failover_base_urls`. Replica A is
killed with SIGKILL in the middle of a conversation; the wrapped client reconnects to replica B,
which continues from the responses A stored in Redis. The caller sees no error and no lost turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI, OpenAI
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket
from support.chat_server import closed_port
from support.serve import wait_healthy
from support.tcp_proxy import FirstAliveProxy
from support.wire import API_KEY, DROPPED_STREAM, MODEL, user
from websockets.asyncio.server import ServerConnection, serve

import ws_transport
from server_shim import BackgroundServer, Settings, create_app

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


# --- one replica dies at a chosen point (a bare server), the other is the shim -------------------------


class DyingReplica:
    """A bare WebSocket server standing for replica A: on the first frame it sends `before` (events),
    then dies: stops listening and drops the TCP connection, as a SIGKILL would."""

    def __init__(self, before: list[dict[str, Any]]) -> None:
        self.before = before
        self.listener: Any = None

    async def handler(self, socket: ServerConnection) -> None:
        frame = json.loads(await socket.recv())
        for event in self.before:
            await socket.send(json.dumps({**event, "stream_id": frame.get("stream_id")}))
        self.listener.close()
        socket.transport.abort()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serve(self.handler, "127.0.0.1", 0) as listener:
            self.listener = listener
            yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1"


CREATED = {
    "type": "response.created",
    "sequence_number": 0,
    "response": {"id": "resp_a", "object": "response", "created_at": 0, "model": MODEL, "status": "in_progress"},
}
QUICK = ws_transport.ReconnectPolicy(max_attempts=3, initial_delay_s=0.01)


def failing_over(base_url: str, replica: str) -> AsyncOpenAI:
    client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
    return ws_transport.wrap(client, failover_base_urls=(replica,), reconnect=QUICK)


async def test_a_stream_whose_replica_dies_before_its_first_event_fails_over_like_a_plain_turn(server):
    async with DyingReplica(before=[]).running() as replica_a, failing_over(replica_a, server.base_url) as client:
        stream = await client.responses.create(model=MODEL, input=[user("hi")], stream=True)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert events[0].response.id == events[-1].response.id != "resp_a"
        stats = ws_transport.session_of(client).stats
        assert (stats.resends, stats.reconnects) == (1, 1)


async def test_a_stream_whose_replica_dies_after_events_reached_the_caller_raises_then_fails_over(server):
    async with (
        DyingReplica(before=[CREATED]).running() as replica_a,
        failing_over(replica_a, server.base_url) as client,
    ):
        stream = await client.responses.create(model=MODEL, input=[user("hi")], stream=True)
        seen = []
        with pytest.raises(DROPPED_STREAM):
            async for event in stream:
                seen.append(event.type)
        assert seen == ["response.created"], "what reached the caller cannot be taken back: as a dropped HTTP stream"
        follow = await client.responses.create(model=MODEL, input=[user("hi")])
        assert follow.status == "completed", "the next turn opens its socket on the other replica"


class RefuseUpgrade:
    """Serves HTTP, answers every WebSocket upgrade 404: a replica behind a proxy without WebSocket support."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        denial = PlainTextResponse("no WebSocket here", status_code=404)
        await WebSocket(scope, receive, send).send_denial_response(denial)


@pytest.fixture
def http_only_replica(tmp_path):
    settings = Settings(drain_timeout_s=1.0, usage_path=str(tmp_path / "usage.db"))
    app = create_app(settings)
    app.add_middleware(RefuseUpgrade)
    server = BackgroundServer(app, settings).start()
    yield server
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_http_fallback_goes_to_the_failover_replicas_too(http_only_replica, stream):
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    async with failing_over(dead, http_only_replica.base_url) as client:
        for turn in range(2):
            answer = await client.responses.create(model=MODEL, input=[user(f"turn {turn}")], stream=stream)
            if stream:
                answer = [event async for event in answer][-1].response
            assert answer.status == "completed"
        session = ws_transport.session_of(client)
        assert session.http_only and session.stats.fallbacks == 2


def test_the_sync_client_falls_back_to_the_failover_replicas_over_http_too(http_only_replica):
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    client = OpenAI(base_url=dead, api_key=API_KEY, max_retries=0)
    failover = (http_only_replica.base_url,)
    with ws_transport.wrap(client, failover_base_urls=failover, reconnect=QUICK) as wrapped:
        assert wrapped.responses.create(model=MODEL, input=[user("hi")]).status == "completed"
