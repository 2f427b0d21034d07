"""The injected transport alone (no `wrap`): a client built elsewhere gets WebSocket mode from its `http_client`.

Here the request is already serialized, so the turn is parsed from the body and split against the
session's chains by value; everything that is not a `POST .../responses` turn goes to the inner transport.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI, OpenAI
from support.wire import HTTP

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from ws_transport.turn import TICKET_HEADER

MODEL = "simulated-1"


class Recorder:
    def __init__(self) -> None:
        self.turns: list[tuple[int, str | None]] = []

    def __call__(self, new_items: list[dict], previous: Any, request: Any) -> None:
        self.turns.append((len(new_items), previous.id if previous else None))


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def server(recorder: Recorder) -> Iterator[BackgroundServer]:
    settings = Settings()
    with BackgroundServer(create_app(settings, validators=[recorder]), settings) as running:
        yield running


@pytest.fixture
def transport() -> Iterator[ws_transport.WebSocketTransport]:
    transport = ws_transport.WebSocketTransport()
    yield transport
    transport.close()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_client_built_elsewhere_chains_by_value(
    server: BackgroundServer, recorder: Recorder, transport: ws_transport.WebSocketTransport
) -> None:
    client = OpenAI(base_url=server.base_url, api_key="k", http_client=HTTP.Client(transport=transport))
    history: list[Any] = [user("hello")]
    first = client.responses.create(model=MODEL, input=history, store=False)
    history += [*first.output, user("more")]  # SDK models: compared by the JSON the SDK sends
    assert client.responses.create(model=MODEL, input=history, store=False).status == "completed"
    stats = transport.session.stats
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (2, 1, 0)
    assert recorder.turns[-1] == (1, first.id)


async def test_the_async_transport_does_the_same(server: BackgroundServer, recorder: Recorder) -> None:
    transport = ws_transport.AsyncWebSocketTransport()
    async with AsyncOpenAI(
        base_url=server.base_url, api_key="k", http_client=HTTP.AsyncClient(transport=transport)
    ) as client:
        history: list[Any] = [user("hello")]
        first = await client.responses.create(model=MODEL, input=history, store=False)
        history += [*first.output, user("more")]
        events = await client.responses.create(model=MODEL, input=history, store=False, stream=True)
        assert [e.type async for e in events][-1] == "response.completed"
    assert (transport.session.stats.turns, transport.session.stats.turns_chained) == (2, 1)
    assert recorder.turns[-1] == (1, first.id)


def test_requests_that_are_not_turns_go_to_the_inner_transport(
    server: BackgroundServer, transport: ws_transport.WebSocketTransport
) -> None:
    sockets = server.shim.stats.websocket_connections
    with httpx2.Client(transport=transport, headers={"authorization": "Bearer k"}) as http:
        assert http.get(f"{server.base_url}/models").status_code == 200
        not_json = http.post(f"{server.base_url}/responses", content=b"{not json")
        background = http.post(f"{server.base_url}/responses", json={"model": MODEL, "input": "hi", "background": True})
    assert not_json.status_code == 400, "the server's HTTP answer, not a transport error"
    assert background.status_code != 101
    assert server.shim.stats.websocket_connections == sockets
    assert transport.session.stats.turns == 0


def test_a_ticket_this_session_never_issued_is_refused(
    server: BackgroundServer, transport: ws_transport.WebSocketTransport
) -> None:
    with (
        httpx2.Client(transport=transport) as http,
        pytest.raises(ws_transport.TurnNotPrepared, match="another client"),
    ):
        http.post(f"{server.base_url}/responses", content=b"{}", headers={TICKET_HEADER: "42"})


def test_a_turn_for_another_url_than_the_sessions_goes_over_http(
    server: BackgroundServer, transport: ws_transport.WebSocketTransport
) -> None:
    client = OpenAI(base_url=server.base_url, api_key="k", http_client=HTTP.Client(transport=transport))
    client.responses.create(model=MODEL, input="hello")
    sockets = server.shim.stats.websocket_connections
    other = client.with_options(base_url=server.base_url.replace("127.0.0.1", "localhost"))
    assert other.responses.create(model=MODEL, input="hello").status == "completed"
    assert server.shim.stats.websocket_connections == sockets
    assert transport.session.stats.turns == 1, "not this session's turn: its stats do not count it"
