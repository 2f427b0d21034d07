"""The client-side hooks reach a wrapped client: default options, request and event observers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

import ws_transport
from plugins import hookimpl, plugin_manager
from plugins.transport import wrap
from server_shim import BackgroundServer


class Observer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.events: list[str] = []

    @hookimpl
    def responses_ws_transport_options(self, client: Any) -> dict[str, Any]:
        return {"max_chains": 3}

    @hookimpl
    def responses_ws_client_request(self, request: dict[str, Any]) -> None:
        self.requests.append(request)

    @hookimpl
    def responses_ws_client_event(self, event: dict[str, Any]) -> None:
        self.events.append(event["type"])
        if event["type"] == "response.in_progress":
            raise RuntimeError("a broken observer must not break the turn")


class Meddler:
    """A plugin that fails on everything and mutates what it is given: the others must not notice."""

    @hookimpl
    def responses_ws_client_request(self, request: dict[str, Any]) -> None:
        request.clear()
        raise RuntimeError("broken request observer")

    @hookimpl
    def responses_ws_client_event(self, event: dict[str, Any]) -> None:
        event["type"] = "meddled"
        raise RuntimeError("broken event observer")


@pytest.fixture
def observer() -> Iterator[Observer]:
    plugin = Observer()
    manager = plugin_manager()
    manager.register(plugin, name="test-observer")
    manager.register(Meddler(), name="test-meddler")
    try:
        yield plugin
    finally:
        manager.unregister(name="test-observer")
        manager.unregister(name="test-meddler")


def test_hooks_see_the_chained_requests_and_every_event(server: BackgroundServer, observer: Observer) -> None:
    with OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as raw:
        client = wrap(raw)
        history: list[Any] = [{"role": "user", "content": "hello"}]
        history += client.responses.create(model="simulated-1", input=history, store=False).output
        history.append({"role": "user", "content": "again"})
        second = client.responses.create(model="simulated-1", input=history, store=False)
        assert second.status == "completed"
        session = ws_transport.session_of(client)
        assert session.options.max_chains == 3, "the plugin's default option applied"

    first, chained = observer.requests
    assert first["type"] == "response.create" and "previous_response_id" not in first
    assert chained["previous_response_id"] and chained["input"] == [{"role": "user", "content": "again"}]
    assert observer.events.count("response.completed") == 2
    assert observer.events[:2] == ["response.created", "response.in_progress"]


def test_explicit_options_win_over_plugin_defaults(server: BackgroundServer, observer: Observer) -> None:
    with OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as raw:
        client = wrap(raw, max_chains=7)
        assert ws_transport.session_of(client).options.max_chains == 7
