"""Checks run beside inference: the backend starts at once, no output reaches the client before the
blocking checks pass, and a block cancels the backend request with `response.failed` and a specific
code while the connection and its cache stay as they were. Real shim, real SDK, over WebSocket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends.base import BackendRequest, Delta, Finish, TextDelta, Usage
from server_shim.checks import Finding
from server_shim.errors import APIError

MODEL = "simulated-1"
CHECK_S = 0.15
NEEDLE = 'responses_ws_plugin_seconds_count{kind="check_beside_inference"}'


class RecordingBackend:
    """Streams slowly and records when each request started and whether its stream was closed early."""

    name = "recording"

    def __init__(self) -> None:
        self.started: list[float] = []
        self.closed_early = 0

    async def models(self) -> list[str]:
        return [MODEL]

    async def release(self, connection_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        self.started.append(time.monotonic())
        finished = False
        try:
            for index in range(20):
                await asyncio.sleep(0.02)
                yield TextDelta(f"t{index} ")
            yield Usage(3, 20)
            yield Finish("stop")
            finished = True
        finally:
            self.closed_early += not finished


class SlowPolicy:
    """A blocking check that takes CHECK_S and refuses the word 'forbidden'."""

    name = "slow_policy"
    mutates = False
    blocking = True

    def __init__(self) -> None:
        self.finished: list[float] = []

    def initial(self) -> int:
        return 0

    def observe(self, state: int, items: list[Any]) -> int:
        return state

    async def inspect(self, state: int, items: list[Any]) -> tuple[int, Finding]:
        await asyncio.sleep(CHECK_S)
        self.finished.append(time.monotonic())
        bad = any("forbidden" in str(item.get("content")) for item in items)
        refusal = APIError(400, "content_policy_violation", "Not allowed.") if bad else None
        return state + 1, Finding(labels={"slow_policy.turns": str(state + 1)}, refusal=refusal)


async def _metrics_once_recorded(server: BackgroundServer, needle: str) -> str:
    """/metrics once the turn is recorded (that happens just after its last event is sent)."""
    async with httpx2.AsyncClient() as http:
        for _ in range(50):
            scraped = (await http.get(server.base_url.removesuffix("/v1") + "/metrics")).text
            if needle in scraped:
                break
            await asyncio.sleep(0.05)
    return scraped


def serve(overlap: bool) -> tuple[BackgroundServer, RecordingBackend, SlowPolicy]:
    backend, policy = RecordingBackend(), SlowPolicy()
    settings = Settings(checks_overlap=overlap, usage_ledger="off")
    return BackgroundServer(create_app(settings, backend=backend, checks=[policy]), settings), backend, policy


async def turn(conn: Any, text: str, previous: str | None) -> tuple[list[Any], float | None]:
    """All events of one turn, and when the first output delta arrived."""
    await conn.response.create(model=MODEL, input=text, previous_response_id=previous, store=False)
    events, first_delta = [], None
    async for event in conn:
        events.append(event)
        if event.type == "response.output_text.delta" and first_delta is None:
            first_delta = time.monotonic()
        if event.type in ("response.completed", "error"):
            return events, first_delta
    raise AssertionError("no terminal event")


async def test_overlapped_check_starts_with_inference_and_holds_the_first_token():
    server, backend, policy = serve(overlap=True)
    with server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            events, first_delta = await turn(conn, "hello", None)
        scraped = await _metrics_once_recorded(
            server, 'responses_ws_plugin_seconds_count{kind="check_beside_inference"}'
        )
    assert events[-1].type == "response.completed"
    assert events[-1].response.metadata == {"check.slow_policy.turns": "1"}
    assert backend.started[0] < policy.finished[0], "the backend request starts before the check ends"
    assert first_delta is not None and first_delta >= policy.finished[0], "no output before the check passed"
    assert NEEDLE in scraped, "the time checks ran beside inference is a metric"


async def test_a_block_cancels_inference_sends_response_failed_and_keeps_the_connection():
    server, backend, _policy = serve(overlap=True)
    with server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            first, _ = await turn(conn, "hello", None)
            parent = first[-1].response.id
            blocked, first_delta = await turn(conn, "something forbidden", parent)
            assert first_delta is None, "not one token of a blocked turn reaches the client"
            kinds = [event.type for event in blocked]
            assert kinds == ["response.created", "response.in_progress", "response.failed", "error"]
            assert blocked[2].response.error.code == "content_policy_violation"
            assert blocked[3].error.code == "content_policy_violation"
            after, _ = await turn(conn, "and now?", parent)
    assert backend.closed_early == 1, "the blocked turn's backend stream was closed before it finished"
    assert after[-1].type == "response.completed", "the parent is still cached: the chain continues"
    assert after[-1].response.metadata == {"check.slow_policy.turns": "2"}, "the blocked turn left no state"


async def test_without_overlap_checks_run_first_and_a_block_is_a_plain_error():
    server, backend, policy = serve(overlap=False)
    with server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            first, _ = await turn(conn, "hello", None)
            blocked, _ = await turn(conn, "forbidden", first[-1].response.id)
    assert backend.started[0] > policy.finished[0], "sequential: inference starts after the check"
    assert [event.type for event in blocked] == ["error"] and blocked[0].error.code == "content_policy_violation"
    assert len(backend.started) == 1, "a refused turn never reaches the backend"


@pytest.mark.parametrize("stream", [False, True])
async def test_http_block_gives_the_code(stream):
    server, _backend, _policy = serve(overlap=True)
    with server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
            if stream:
                events = [e async for e in await client.responses.create(model=MODEL, input="forbidden", stream=True)]
                assert events[-1].type == "error" and events[-1].code == "content_policy_violation"
                assert events[-2].type == "response.failed"
            else:
                with pytest.raises(Exception) as caught:
                    await client.responses.create(model=MODEL, input="forbidden")
                assert getattr(caught.value, "code", None) == "content_policy_violation"


class CrashingCheck:
    """A check that raises on 'crash': the turn must fail closed, never pass."""

    name = "crashing"
    mutates = False
    blocking = True

    def initial(self) -> int:
        return 0

    def observe(self, state: int, items: list[Any]) -> int:
        return state

    async def inspect(self, state: int, items: list[Any]) -> tuple[int, Finding]:
        await asyncio.sleep(0.01)
        if any("crash" in str(item.get("content")) for item in items):
            raise RuntimeError("the policy service is down")
        return state, Finding()


async def test_a_check_that_crashes_beside_inference_fails_the_turn_closed():
    backend = RecordingBackend()
    settings = Settings(usage_ledger="off")
    with BackgroundServer(create_app(settings, backend=backend, checks=[CrashingCheck()]), settings) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            first, _ = await turn(conn, "hello", None)
            crashed, first_delta = await turn(conn, "crash now", first[-1].response.id)
            after, _ = await turn(conn, "again", first[-1].response.id)
    assert first_delta is None
    assert crashed[-2].type == "response.failed" and crashed[-2].response.error.code == "server_error"
    assert crashed[-1].type == "error" and crashed[-1].error.code == "server_error"
    assert after[-1].type == "response.completed"
