"""The `responses` pass-through backend, with another real shim on loopback as its upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from support.chat_server import MODEL as CHAT_MODEL
from support.chat_server import text_reply
from support.wire import API_KEY, run_turn, user

from server_shim import BackgroundServer, Settings, create_app
from server_shim.config import ShimConfig

TOOL = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
}


class RecordPeers:
    """ASGI middleware: the client address of every `POST /v1/responses`, one address per TCP connection."""

    def __init__(self, app: Any, peers: list[tuple[str, int]]) -> None:
        self.app = app
        self.peers = peers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/responses":
            self.peers.append(tuple(scope["client"]))
        await self.app(scope, receive, send)


@pytest.fixture
def shims() -> Iterator[tuple[BackgroundServer, BackgroundServer, list[dict[str, Any]]]]:
    """An upstream shim on the simulator, and a front shim that passes through to it."""
    seen: list[dict[str, Any]] = []

    def record(new_items, previous, request):
        seen.append(
            {
                "items": list(new_items),
                "previous": request.previous_response_id,
                "store": request.store,
                "tools": request.tools,
            }
        )

    upstream_settings = Settings()
    upstream_app = create_app(upstream_settings, validators=[record])
    upstream_app.state.peers = []
    upstream_app.add_middleware(RecordPeers, peers=upstream_app.state.peers)
    with BackgroundServer(upstream_app, upstream_settings) as upstream:
        cfg = ShimConfig.model_validate(
            {
                "deployments": [
                    {"name": "up", "kind": "responses", "base_url": upstream.base_url, "models": {"m": "simulated-1"}}
                ]
            }
        )
        with BackgroundServer(create_app(cfg.settings(), config=cfg), cfg.settings()) as front:
            yield front, upstream, seen


async def test_text_function_call_and_chained_turns_pass_through(shims):
    front, _, seen = shims
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client, client.responses.connect() as conn:
        await conn.response.create(
            model="m", input="step one\ncall lookup " + json.dumps({"n": 3}), tools=[TOOL], instructions="be brief"
        )
        async for event in conn:
            if event.type == "response.completed":
                first = event.response
                break
        call = first.output[0]
        assert call.type == "function_call" and call.name == "lookup" and json.loads(call.arguments) == {"n": 3}

        await conn.response.create(
            model="m",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "record 3"}],
            tools=[TOOL],
        )
        async for event in conn:
            if event.type == "response.completed":
                second = event.response
                break
    assert "record 3" in second.output_text
    assert second.usage.input_tokens > 0
    # The upstream is stateless: it got the whole conversation each time, with store false.
    assert [len(turn["items"]) for turn in seen] == [1, 3]
    assert all(turn["previous"] is None and turn["store"] is False for turn in seen)
    assert seen[1]["items"][1]["type"] == "function_call"


async def test_every_turn_reuses_one_pooled_upstream_connection(shims):
    """The upstream's stream is read to its last byte after `response.completed`, so the connection is kept."""
    front, upstream, _ = shims
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client, client.responses.connect() as conn:
        previous = None
        for n in range(3):
            await conn.response.create(model="m", input=f"turn {n}", previous_response_id=previous, store=False)
            async for event in conn:
                if event.type in ("response.completed", "error"):
                    assert event.type == "response.completed", event
                    previous = event.response.id
                    break
    peers = upstream.app.state.peers
    assert len(peers) == 3 and len(set(peers)) == 1, peers


async def test_upstream_down_is_a_backend_error_and_the_connection_survives(shims):
    front, upstream, _ = shims
    upstream.stop()
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client, client.responses.connect() as conn:
        await conn.response.create(model="m", input="hello")
        types = []
        async for event in conn:
            types.append(event.type)
            if event.type == "error":
                assert event.error.code == "backend_error"
                break
        assert types[-2:] == ["response.failed", "error"]


@pytest.fixture
def chained_shims() -> Iterator[tuple[BackgroundServer, BackgroundServer, list[dict[str, Any]]]]:
    """The front shim keeps one upstream WebSocket per client connection and chains upstream."""
    seen: list[dict[str, Any]] = []

    def record(new_items, previous, request):
        seen.append({"items": len(new_items), "previous": request.previous_response_id})

    upstream_settings = Settings(cache_max_responses=1)
    with BackgroundServer(create_app(upstream_settings, validators=[record]), upstream_settings) as upstream:
        cfg = ShimConfig.model_validate(
            {
                "deployments": [
                    {
                        "name": "up",
                        "kind": "responses",
                        "base_url": upstream.base_url,
                        "models": {"m": "simulated-1"},
                        "upstream_websocket": True,
                    }
                ]
            }
        )
        with BackgroundServer(create_app(cfg.settings(), config=cfg), cfg.settings()) as front:
            yield front, upstream, seen


async def completed(conn: Any, **create: Any) -> Any:
    await conn.response.create(model="m", **create)
    async for event in conn:
        if event.type in ("response.completed", "error"):
            assert event.type == "response.completed", event
            return event.response


async def test_upstream_websocket_chains_upstream_with_only_the_new_items(chained_shims):
    front, upstream, seen = chained_shims
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client, client.responses.connect() as conn:
        first = await completed(conn, input="hello", store=False)
        second = await completed(conn, input="more", previous_response_id=first.id, store=False)
        call = await completed(
            conn, input="call lookup " + json.dumps({"n": 1}), tools=[TOOL], previous_response_id=second.id
        )
        assert call.output[0].type == "function_call"
        answer = await completed(
            conn,
            input=[{"type": "function_call_output", "call_id": call.output[0].call_id, "output": "record 1"}],
            tools=[TOOL],
            previous_response_id=call.id,
        )
        assert "record 1" in answer.output_text
        assert len(upstream.shim.connections) == 1, "one upstream socket for this client connection"
    assert [turn["items"] for turn in seen] == [1, 1, 1, 1], "upstream received only the new items"
    assert seen[0]["previous"] is None and all(turn["previous"] for turn in seen[1:])
    deadline = asyncio.get_running_loop().time() + 5
    while upstream.shim.connections and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert not upstream.shim.connections, "the upstream socket closed with the client connection"


async def test_a_response_the_upstream_lost_is_resent_in_full_once(chained_shims):
    front, _, seen = chained_shims
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client, client.responses.connect() as conn:
        a1 = await completed(conn, input="conversation a", store=False)
        await completed(conn, input="conversation b", store=False)  # the upstream cache holds one response
        a2 = await completed(conn, input="a continues", previous_response_id=a1.id, store=False)
        assert a2.status == "completed"
    assert [turn["items"] for turn in seen] == [1, 1, 3]
    assert [turn["previous"] is not None for turn in seen] == [False, False, False]


async def test_items_reach_the_upstream_as_the_client_sent_them(shims):
    """No round trip through chat messages: content parts, developer messages, reasoning items and
    namespace tools arrive upstream unchanged (less the ids of messages and calls, unknown upstream)."""
    front, _, seen = shims
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be terse."}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "low"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Looked at it."}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
        {"type": "message", "role": "user", "content": "Thanks."},
    ]
    tools = [
        {"type": "namespace", "name": "pets", "description": "d", "tools": [{"type": "function", "name": "feed"}]},
        {"type": "web_search"},  # hosted: a responses upstream runs it (its policy is `pass`)
    ]
    async with AsyncOpenAI(base_url=front.base_url, api_key="x") as client:
        response = await client.responses.create(model="m", input=items, tools=tools, store=False)
    assert response.status == "completed"
    (received,) = seen
    assert received["items"][:3] == items[:3]
    assert received["items"][3] == {key: value for key, value in items[3].items() if key != "id"}
    assert received["items"][4] == items[4]
    assert received["tools"] == tools


async def test_logprobs_pass_through_a_responses_upstream_on_both_paths(make_server, chat_server):
    """Two layers: the front shim's `responses` deployment, the upstream shim's chat backend that sends logprobs."""
    upstream = make_server(backend=chat_server.base_url)
    deployment = {"name": "up", "kind": "responses", "base_url": upstream.base_url, "models": {"*": "*"}}
    front = make_server(config=ShimConfig.model_validate({"deployments": [deployment]}))
    chat_server.enqueue(text_reply("Hel", "lo"), text_reply("Hel", "lo"))
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 1}
    async with AsyncOpenAI(base_url=front.base_url, api_key=API_KEY, max_retries=0) as sdk:
        response = await sdk.responses.create(model=CHAT_MODEL, input="hi", **asked)
        assert [(p.token, p.bytes, len(p.top_logprobs)) for p in response.output[0].content[0].logprobs] == [
            ("Hel", list(b"Hel"), 1),
            ("lo", list(b"lo"), 1),
        ]
        async with sdk.responses.connect() as conn:
            turn = await run_turn(conn, model=CHAT_MODEL, input=[user("hi")], store=False, **asked)
    deltas = [e["logprobs"] for e in turn.events if e["type"] == "response.output_text.delta"]
    assert [[p["token"] for p in d] for d in deltas] == [["Hel"], ["lo"]]
    assert chat_server.bodies[-1]["logprobs"] is True and chat_server.bodies[-1]["top_logprobs"] == 1
