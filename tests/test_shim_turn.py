"""One turn as a pipeline, driven directly (no sockets), plus how the transports report its failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx2
import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, completed_ok, only_connection, recv_event, run_turn, send_raw, user

from server_shim.backends import SimulatedBackend
from server_shim.backends.base import BackendRequest, Delta, Finish, TextDelta, Usage
from server_shim.backends.chat_convert import ChatPrompt, chat_prompt
from server_shim.errors import APIError
from server_shim.requests import CreateRequest
from server_shim.state import ConnectionCache, MemoryResponseStore
from server_shim.turn import Turn, TurnEnv


class ScriptedBackend:
    """An in-process backend that records requests and can misbehave on purpose."""

    name = "scripted"

    def __init__(self, *, explode: bool = False, endless: bool = False) -> None:
        self.requests: list[BackendRequest] = []
        self.prompts: list[ChatPrompt] = []
        """What a chat backend renders, in the stream as a chat backend does."""
        self.explode = explode
        self.endless = endless
        self.closed = 0

    async def models(self) -> list[str]:
        return [MODEL]

    async def aclose(self) -> None:
        return None

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        self.prompts.append(chat_prompt(request.history))
        try:
            yield TextDelta("one ")
            if self.explode:
                raise KeyError("a bug in the backend")
            while self.endless:
                yield TextDelta("more ")
            yield Usage(3, 1)
            yield Finish("stop")
        finally:
            self.closed += 1


def env(backend=None, validators=()) -> TurnEnv:
    return TurnEnv(backend=backend or ScriptedBackend(), store=MemoryResponseStore(), validators=list(validators))


async def drive(turn: Turn) -> list[dict]:
    async with contextlib.aclosing(turn.events()) as events:
        return [event async for batch in events for event in batch]


async def test_the_validator_sees_only_the_new_items_and_the_previous_state():
    seen = []
    turn_env = env(validators=[lambda items, previous, request: seen.append((items, previous))])
    cache = ConnectionCache(10, 10**9)
    first = Turn(CreateRequest(model=MODEL, input=[user("a")]), turn_env, cache)
    await drive(first)
    second = Turn(
        CreateRequest(model=MODEL, input=[user("b")], previous_response_id=first.result.response["id"]), turn_env, cache
    )
    await drive(second)
    assert seen[0] == ([user("a")], None)
    assert seen[1][0] == [user("b")]
    assert seen[1][1].id == first.result.response["id"]


async def test_the_backend_gets_the_items_and_a_chat_rendering_continues_the_cached_one():
    backend = ScriptedBackend()
    turn_env = env(backend)
    cache = ConnectionCache(10, 10**9)
    first = Turn(CreateRequest(model=MODEL, input=[user("a")]), turn_env, cache)
    await drive(first)
    parent = cache.get(first.result.response["id"])
    second = Turn(CreateRequest(model=MODEL, input=[user("b")], previous_response_id=parent.id), turn_env, cache)
    await drive(second)
    sent = backend.requests[1]
    assert sent.previous_items == len(parent.history) == 2
    assert all(a is b for a, b in zip(sent.history.items, parent.history.items, strict=False)), "items are shared"
    assert [item["type"] for item in sent.history.items] == ["message", "message", "message"]
    assert sent.new_items == (user("b"),)
    rendered_first, rendered = backend.prompts
    n = len(rendered_first.fragments)
    assert all(a is b for a, b in zip(rendered.fragments[:n], rendered_first.fragments, strict=True)), "no re-encoding"
    assert [m["role"] for m in rendered.messages] == ["user", "assistant", "user"]


async def test_a_refusing_validator_stops_the_turn_before_anything_changes():
    def refuse(items, previous, request):
        raise APIError(400, "policy_violation", "No.", "input")

    backend = ScriptedBackend()
    cache = ConnectionCache(10, 10**9)
    turn = Turn(CreateRequest(model=MODEL, input="hi"), env(backend, [refuse]), cache)
    with pytest.raises(APIError) as refused:
        await turn.prepare()
    assert refused.value.code == "policy_violation"
    assert backend.requests == [] and len(cache) == 0


async def test_a_warm_up_runs_no_inference_but_caches_its_state():
    backend = ScriptedBackend()
    cache = ConnectionCache(10, 10**9)
    turn = Turn(CreateRequest(model=MODEL, input=[user("ctx")], generate=False), env(backend), cache)
    events = await drive(turn)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert backend.requests == []
    assert cache.get(turn.result.response["id"]).history.items == (user("ctx"),)


async def test_a_backend_bug_fails_the_turn_instead_of_escaping_it():
    cache = ConnectionCache(10, 10**9)
    turn_env = env(ScriptedBackend())
    parent = Turn(CreateRequest(model=MODEL, input="a"), turn_env, cache)
    await drive(parent)
    parent_id = parent.result.response["id"]
    turn = Turn(
        CreateRequest(model=MODEL, input="b", previous_response_id=parent_id), env(ScriptedBackend(explode=True)), cache
    )
    events = await drive(turn)
    assert [e["type"] for e in events][-2:] == ["response.failed", "error"]
    assert events[-1]["error"]["code"] == "backend_error"
    assert parent_id not in cache


async def test_the_backend_stream_is_closed_as_soon_as_the_consumer_stops():
    backend = ScriptedBackend(endless=True)
    turn = Turn(CreateRequest(model=MODEL, input="hi"), env(backend), None)
    events = turn.events()
    async for batch in events:
        if any(event["type"] == "response.output_text.delta" for event in batch):
            break
    await events.aclose()
    assert backend.closed == 1, "the backend's HTTP stream must be released when the turn stops early"


# --- unexpected errors reach the client as errors, never as a hang --------------------------------


def crashing_validator(items, previous, request):
    if "crash" in json.dumps(items):
        raise RuntimeError("a bug in a plugin")


async def test_a_crashing_validator_gets_a_server_error_event_and_the_connection_stays_usable(make_server):
    server = make_server(validators=[crashing_validator])
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input=[user("fine")], store=False)
        cached = only_connection(server).cache.ids()
        await send_raw(conn, {"type": "response.create", "model": MODEL, "input": "crash", "stream_id": "l1"})
        error = await recv_event(conn)
        assert error["status"] == 500 and error["error"]["code"] == "server_error"
        assert error["error"]["type"] == "server_error" and error["stream_id"] == "l1"
        assert only_connection(server).cache.ids() == cached
        completed_ok(await run_turn(conn, input=[user("fine again")], previous_response_id=first.id, store=False))


@pytest.mark.parametrize("stream", [False, True])
def test_a_crashing_validator_over_http_is_a_500_with_error_json(make_server, stream):
    server = make_server(validators=[crashing_validator])
    reply = httpx2.post(
        server.base_url + "/responses", json={"model": MODEL, "input": "crash", "stream": stream}, timeout=10
    )
    assert reply.status_code == 500
    assert reply.json()["error"]["code"] == "server_error"


async def test_a_crashing_backend_over_websocket_ends_with_response_failed(make_server):
    server = make_server(backend_impl=ScriptedBackend(explode=True))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        failed = await run_turn(conn, input="hi", store=False)
        assert failed.types[-2:] == ["response.failed", "error"]
        completed_ok(await run_turn(conn, input="hi", generate=False, store=False))


async def test_the_simulated_backend_paces_tokens_without_blocking_other_connections(make_server):
    server = make_server(backend_impl=SimulatedBackend(ttft_s=0.2, model=MODEL))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk:

        async def one():
            async with sdk.responses.connect() as conn:
                return await run_turn(conn, input="hi", store=False)

        start = asyncio.get_running_loop().time()
        turns = await asyncio.gather(*(one() for _ in range(4)))
        assert asyncio.get_running_loop().time() - start < 0.7
    for turn in turns:
        completed_ok(turn)
