"""Server-side plugin hooks on a real shim: validators and classifiers see only new items, and
post-inference sinks run after the client has its answer, overlapping the next request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from plugins import create_plugin_manager, hookimpl
from server_shim import APIError, BackgroundServer, Settings, create_app
from server_shim.postinference import PostInference, TurnInfo

MODEL = "simulated-1"
SINK_DELAY_S = 0.3


class ServerPlugin:
    """A third-party-style plugin: a validator, a classifier and a slow async usage sink."""

    def __init__(self) -> None:
        self.classified: list[int] = []
        self.finished: list[tuple[str, str, float]] = []

    @hookimpl
    def responses_ws_validators(self, settings: Any) -> list[Any]:
        def no_shouting(new_items: list[dict[str, Any]], previous: Any, request: Any) -> None:
            for index, item in enumerate(new_items):
                if isinstance(item.get("content"), str) and item["content"].isupper():
                    raise APIError(400, "shouting", "Please do not shout.", f"input[{index}].content")

        return [no_shouting]

    @hookimpl
    def responses_ws_classifiers(self, settings: Any) -> list[Any]:
        def topic(new_items: list[dict[str, Any]]) -> dict[str, str]:
            self.classified.append(len(new_items))
            text = " ".join(str(item.get("content", "")) for item in new_items)
            return {"topic": "billing" if "invoice" in text else "other"}

        return [topic]

    @hookimpl
    async def responses_ws_response_finished(self, response: dict[str, Any], transport: str) -> None:
        await asyncio.sleep(SINK_DELAY_S)
        self.finished.append((response["id"], transport, time.monotonic()))

    @hookimpl
    def responses_ws_backend_kinds(self) -> dict[str, Any]:
        return {}


class BrokenSink:
    @hookimpl
    def responses_ws_response_finished(self, response: dict[str, Any], transport: str) -> None:
        raise RuntimeError("sink exploded")


@pytest.fixture
def plugged() -> Iterator[tuple[BackgroundServer, ServerPlugin]]:
    manager = create_plugin_manager(load_entry_points=False)
    plugin = ServerPlugin()
    manager.register(plugin)
    manager.register(BrokenSink())
    settings = Settings(drain_timeout_s=2.0)
    with BackgroundServer(create_app(settings, plugin_manager=manager), settings) as server:
        yield server, plugin


async def turn(conn: Any, **create: Any) -> Any:
    await conn.response.create(model=MODEL, store=False, **create)
    async for event in conn:
        if event.type in ("response.completed", "error"):
            return event


async def test_validator_and_classifier_see_only_new_items_and_label_the_response(plugged):
    server, plugin = plugged
    async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
        first = await turn(conn, input=[{"role": "user", "content": "about my invoice"}])
        assert first.response.metadata == {"classifier.topic": "billing"}
        second = await turn(
            conn, input=[{"role": "user", "content": "and the weather"}], previous_response_id=first.response.id
        )
        assert second.response.metadata == {"classifier.topic": "other"}, "the history's 'invoice' is not re-read"
        refused = await turn(conn, input=[{"role": "user", "content": "WHY"}], previous_response_id=second.response.id)
        assert (
            refused.type == "error" and refused.error.code == "shouting" and refused.error.param == "input[0].content"
        )
        after = await turn(conn, input=[{"role": "user", "content": "sorry"}], previous_response_id=second.response.id)
        assert after.type == "response.completed"
    assert plugin.classified == [1, 1, 1]


async def test_sinks_run_after_the_answer_and_overlap_the_next_request(plugged, caplog):
    server, plugin = plugged
    caplog.set_level(logging.ERROR, logger="server_shim.postinference")
    async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
        start = time.monotonic()
        first = await turn(conn, input="one")
        second = await turn(conn, input="two", previous_response_id=first.response.id)
        both_answered = time.monotonic()
    assert both_answered - start < SINK_DELAY_S, "a slow sink must not delay the client"
    deadline = time.monotonic() + 5
    while len(plugin.finished) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert [(rid, transport) for rid, transport, _ in plugin.finished] == [
        (first.response.id, "websocket"),
        (second.response.id, "websocket"),
    ]
    assert all(done > both_answered for _, _, done in plugin.finished)
    assert "sink exploded" in caplog.text, "a failing sink is logged, never sent to the client"


async def test_pending_sinks_finish_before_shutdown_completes():
    manager = create_plugin_manager(load_entry_points=False)
    plugin = ServerPlugin()
    manager.register(plugin)
    settings = Settings(drain_timeout_s=2.0)
    server = BackgroundServer(create_app(settings, plugin_manager=manager), settings).start()
    async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client:
        response = await client.responses.create(model=MODEL, input="over http", store=False)
    await asyncio.to_thread(server.stop)
    assert [(rid, transport) for rid, transport, _ in plugin.finished] == [(response.id, "http")]


async def test_sinks_run_after_the_current_iteration_in_order_and_a_task_only_for_an_awaitable_one(caplog):
    calls: list[str] = []
    info = TurnInfo("websocket", None, None, None, None, 0.0)
    response = {"id": "resp_1"}

    def one(response: dict[str, Any], info: TurnInfo) -> None:
        calls.append("one")

    def broken(response: dict[str, Any], info: TurnInfo) -> None:
        raise RuntimeError("sink exploded")

    async def slow(response: dict[str, Any], info: TurnInfo) -> None:
        await asyncio.sleep(0.01)
        calls.append("slow")

    synchronous = PostInference([one, broken, one])
    synchronous.submit(response, info)
    assert calls == [] and synchronous.pending == 1, "nothing runs before the turn's frames are out"
    await asyncio.sleep(0)
    assert calls == ["one", "one"] and synchronous.pending == 0, "all ran at once: no task left behind"
    assert "sink exploded" in caplog.text

    mixed = PostInference([one, slow, one])
    mixed.submit(response, info)
    await asyncio.sleep(0)
    assert calls[2:] == ["one"] and mixed.pending == 1, "from the awaitable sink on, the rest run in one task"
    await mixed.aclose()
    assert calls[2:] == ["one", "slow", "one"] and mixed.pending == 0


async def test_a_turn_nothing_listens_to_schedules_nothing_and_listeners_are_asked_each_turn(caplog):
    """Issue 14: no post-inference work when nothing listens. The built-in usage log listens only while DEBUG
    is on for its logger; an implementation without `listening` always listens."""
    from server_shim.extensions import ResponseSink
    from server_shim.extensions import create_plugin_manager as server_manager

    info = TurnInfo("websocket", None, None, None, None, 0.0)
    response = {"id": "resp_1", "status": "completed", "model": "m", "usage": None}
    builtin_only = PostInference([ResponseSink(server_manager(load_entry_points=False))])
    caplog.set_level(logging.INFO, logger="responses_ws.usage")
    builtin_only.submit(response, info)
    assert builtin_only.pending == 0, "DEBUG off: nothing scheduled"
    caplog.set_level(logging.DEBUG, logger="responses_ws.usage")
    builtin_only.submit(response, info)
    assert builtin_only.pending == 1
    await asyncio.sleep(0)
    assert "resp_1 completed model=m" in caplog.text

    heard: list[str] = []

    class Quiet:
        @hookimpl
        def responses_ws_response_finished(self, response: dict[str, Any]) -> None:
            heard.append("quiet")

    Quiet.responses_ws_response_finished.listening = lambda: False  # type: ignore[attr-defined]

    class Loud:
        @hookimpl
        def responses_ws_response_finished(self, response: dict[str, Any]) -> None:
            heard.append("loud")

    manager = server_manager(load_entry_points=False)
    manager.register(Quiet())
    caplog.set_level(logging.INFO, logger="responses_ws.usage")
    post = PostInference([ResponseSink(manager)])
    post.submit(response, info)
    assert post.pending == 0 and heard == []
    manager.register(Loud())
    post.submit(response, info)
    await asyncio.sleep(0)
    assert heard == ["loud"], "a plugin without `listening` is always called; one not listening never"
