"""Concurrent conversations through one wrapped client: lanes on one socket, or a small pool of sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends.base import BackendRequest, Delta
from server_shim.backends.simulated import SimulatedBackend
from server_shim.demo import TOOLS

MODEL = "simulated-1"
TURNS = 4
TOKENS_PER_S = 400.0  # 16 tokens: about 40 ms a turn, so overlap is measurable


class Recorder:
    def __init__(self) -> None:
        self.new_items: list[int] = []

    def __call__(self, new_items: list[dict], previous: Any, request: Any) -> None:
        self.new_items.append(len(new_items))


class OverlapProbe(SimulatedBackend):
    """The simulator, counting how many responses it generates at the same time."""

    def __init__(self) -> None:
        super().__init__(tokens_per_s=TOKENS_PER_S)
        self.running = self.most = 0

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            async for delta in super().stream(request):
                yield delta
        finally:
            self.running -= 1


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def probe() -> OverlapProbe:
    return OverlapProbe()


@pytest.fixture(scope="module")
def server(recorder: Recorder, probe: OverlapProbe) -> Iterator[BackgroundServer]:
    settings = Settings()
    with BackgroundServer(create_app(settings, backend=probe, validators=[recorder]), settings) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh_counters(recorder: Recorder, probe: OverlapProbe) -> None:
    recorder.new_items.clear()
    probe.most = 0


def ask(conversation: int, turn: int) -> dict[str, Any]:
    n = conversation * 100 + turn
    return {"role": "user", "content": f"conversation {conversation}\ncall lookup {json.dumps({'n': n})}"}


def tool_outputs(output: list[Any], conversation: int, turn: int) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": item.call_id, "output": f"record {conversation * 100 + turn}"}
        for item in output
        if item.type == "function_call"
    ]


def check_conversation(texts: list[str], conversation: int) -> None:
    """Every text reply echoes this conversation's own tool result: nothing crossed over."""
    assert texts == [f"record {conversation * 100 + turn}" for turn in range(TURNS)]


async def conversation_async(client: AsyncOpenAI, conversation: int) -> list[str]:
    history: list[Any] = []
    texts = []
    for turn in range(TURNS):
        history.append(ask(conversation, turn))
        call = await client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        history += [*call.output, *tool_outputs(call.output, conversation, turn)]
        answer = await client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        history += answer.output
        texts.append(answer.output_text.split("returned: ")[1][: len(f"record {conversation * 100 + turn}")])
    return texts


def conversation_sync(client: OpenAI, conversation: int) -> list[str]:
    history: list[Any] = []
    texts = []
    for turn in range(TURNS):
        history.append(ask(conversation, turn))
        call = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        history += [*call.output, *tool_outputs(call.output, conversation, turn)]
        answer = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        history += answer.output
        texts.append(answer.output_text.split("returned: ")[1][: len(f"record {conversation * 100 + turn}")])
    return texts


async def test_concurrent_async_conversations_share_one_socket_and_overlap(
    server: BackgroundServer, recorder: Recorder, probe: OverlapProbe
) -> None:
    sockets_before = server.shim.stats.websocket_connections
    async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        results = await asyncio.gather(*(conversation_async(client, c) for c in range(8)))
        stats = ws_transport.session_of(client).stats
    for conversation, texts in enumerate(results):
        check_conversation(texts, conversation)
    assert server.shim.stats.websocket_connections - sockets_before == 1
    assert stats.turns_chained == stats.turns - 8  # every turn but each conversation's first
    assert recorder.new_items == [1] * stats.turns  # a full resend of any history would be 2 items or more
    assert probe.most >= 4  # the lanes ran side by side on the one socket, not one after another


def test_concurrent_sync_conversations_from_threads(server: BackgroundServer) -> None:
    with ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda c: conversation_sync(client, c), range(4)))
        stats = ws_transport.session_of(client).stats
    for conversation, texts in enumerate(results):
        check_conversation(texts, conversation)
    assert (stats.turns, stats.turns_chained, stats.resends) == (4 * 2 * TURNS, 4 * (2 * TURNS - 1), 0)


@pytest.mark.parametrize(
    "options",
    [{"max_in_flight": 2, "max_connections": 2}, {"lanes": False, "max_connections": 3}],
    ids=["few-lanes", "no-lanes"],
)
async def test_turns_beyond_a_sockets_capacity_use_a_bounded_pool(
    server: BackgroundServer, options: dict[str, Any]
) -> None:
    sockets_before = server.shim.stats.websocket_connections
    async with ws_transport.wrap(
        AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0), **options
    ) as client:
        results = await asyncio.gather(*(conversation_async(client, c) for c in range(6)))
        stats = ws_transport.session_of(client).stats
    for conversation, texts in enumerate(results):
        check_conversation(texts, conversation)
    assert server.shim.stats.websocket_connections - sockets_before <= options["max_connections"]
    assert stats.turns_chained > stats.turns // 2


async def test_abandoned_streams_are_stopped_on_the_server_and_hold_no_slot() -> None:
    """Closing the socket is this mode's only cancel: a stream given up mid-response must not keep
    generating server-side and hold one of the 16 in-flight slots (or a lane) from later turns."""
    settings = Settings(simulated_tokens_per_s=5, drain_timeout_s=1.0)
    with BackgroundServer(create_app(settings), settings) as slow:
        client = ws_transport.wrap(AsyncOpenAI(base_url=slow.base_url, api_key="x", max_retries=0))
        try:
            for n in range(20):  # more than the 16 in-flight slots: a leaked slot would block a later turn
                stream = await client.responses.create(model=MODEL, input=f"q{n}", stream=True)
                async for _ in stream:
                    break
                await stream.close()
                assert await eventually(lambda: not slow.shim.connections), f"turn {n} still runs on the server"
        finally:
            await client.close()


async def eventually(check: Callable[[], bool], attempts: int = 200) -> bool:
    """Poll `check` (20 ms apart): for state another task settles, not a timing assertion."""
    for _ in range(attempts):
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()
