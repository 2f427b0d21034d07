"""A 30-turn tool-calling loop that resends its whole history every turn, as LangChain does.

Over a wrapped client it must produce exactly what plain HTTP produces, while the shim (its
validator sees the new items of each turn) receives only the new items after the first turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from support.wire import HTTP

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.demo import TOOLS, follow_up, next_user_message

MODEL = "simulated-1"
TURNS = 30
PAYLOAD = 1000


class Recorder:
    """Validator: what each turn delivered to the server, and on top of which response."""

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


@pytest.fixture(scope="module")
def http_outputs(server: BackgroundServer) -> list[list[tuple]]:
    """The reference: the same loop over plain HTTP."""
    with OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
        return run_sync(client, stream=False, keep_objects=False)


@pytest.fixture(autouse=True)
def fresh_recorder(recorder: Recorder) -> None:
    recorder.turns.clear()


def signature(output: list[Any]) -> list[tuple]:
    """What a turn produced, without the per-response ids."""
    rows = []
    for item in output:
        text = "".join(part.text for part in getattr(item, "content", None) or [] if part.type == "output_text")
        rows.append((item.type, getattr(item, "name", None), getattr(item, "arguments", None), text))
    return rows


def extend(history: list[Any], output: list[Any], turn: int, *, keep_objects: bool) -> None:
    """Append the response as the caller would: the SDK objects themselves, or dumped dicts."""
    history += list(output) if keep_objects else [item.model_dump(exclude_none=True) for item in output]
    history += follow_up(output, turn + 1, PAYLOAD)


def run_sync(client: OpenAI, *, stream: bool, keep_objects: bool) -> list[list[tuple]]:
    history: list[Any] = [next_user_message(0)]
    outputs = []
    for turn in range(TURNS):
        if stream:
            events = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False, stream=True)
            response = next(e.response for e in events if e.type == "response.completed")
        else:
            response = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        outputs.append(signature(response.output))
        extend(history, response.output, turn, keep_objects=keep_objects)
    return outputs


async def run_async(client: AsyncOpenAI, *, stream: bool, keep_objects: bool) -> list[list[tuple]]:
    history: list[Any] = [next_user_message(0)]
    outputs = []
    for turn in range(TURNS):
        if stream:
            async with client.responses.stream(model=MODEL, input=history, tools=TOOLS, store=False) as events:
                async for _ in events:
                    pass
                response = await events.get_final_response()
        else:
            response = await client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        outputs.append(signature(response.output))
        extend(history, response.output, turn, keep_objects=keep_objects)
    return outputs


def assert_only_new_items_after_the_first_turn(recorder: Recorder) -> None:
    assert len(recorder.turns) == TURNS
    first, *rest = recorder.turns
    assert first == (1, None)
    assert all(count == 1 and previous is not None for count, previous in rest), recorder.turns


def assert_chained_stats(client: OpenAI | AsyncOpenAI) -> None:
    stats = ws_transport.session_of(client).stats
    assert (stats.turns, stats.turns_chained, stats.resends, stats.fallbacks) == (TURNS, TURNS - 1, 0, 0)
    assert stats.bytes_http_equivalent > 5 * stats.bytes_sent


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
@pytest.mark.parametrize("keep_objects", [True, False], ids=["sdk-objects", "dumped-dicts"])
def test_sync_loop_matches_http_and_sends_only_new_items(
    server: BackgroundServer, recorder: Recorder, http_outputs: list, stream: bool, keep_objects: bool
) -> None:
    with ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        assert run_sync(client, stream=stream, keep_objects=keep_objects) == http_outputs
        assert_chained_stats(client)
    assert_only_new_items_after_the_first_turn(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_async_loop_matches_http_and_sends_only_new_items(
    server: BackgroundServer, recorder: Recorder, http_outputs: list, stream: bool
) -> None:
    async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        assert await run_async(client, stream=stream, keep_objects=stream) == http_outputs
        assert_chained_stats(client)
    assert_only_new_items_after_the_first_turn(recorder)


def test_transport_level_path_alone_chains_a_client_built_elsewhere(
    server: BackgroundServer, recorder: Recorder, http_outputs: list
) -> None:
    transport = ws_transport.WebSocketTransport()
    http_client = HTTP.Client(transport=transport)
    with OpenAI(base_url=server.base_url, api_key="k", max_retries=0, http_client=http_client) as client:
        assert run_sync(client, stream=False, keep_objects=False) == http_outputs
    assert transport.session.stats.turns_chained == TURNS - 1
    assert_only_new_items_after_the_first_turn(recorder)


async def test_async_transport_level_path_streams_typed_events(server: BackgroundServer, recorder: Recorder) -> None:
    http_client = HTTP.AsyncClient(transport=ws_transport.AsyncWebSocketTransport())
    async with AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0, http_client=http_client) as client:
        history: list[Any] = [next_user_message(0)]
        for turn in range(3):
            stream = await client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False, stream=True)
            events = [event async for event in stream]
            assert events[0].type == "response.created" and events[-1].type == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            assert all("stream_id" not in e.model_dump() for e in events)  # what HTTP would have delivered
            extend(history, events[-1].response.output, turn, keep_objects=False)
    assert [count for count, _ in recorder.turns] == [1, 1, 1]


def test_bytes_on_the_wire_shrink_against_plain_http(server: BackgroundServer) -> None:
    shim = server.shim.stats
    before = shim.bytes_received
    with OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as plain:
        run_sync(plain, stream=False, keep_objects=False)
    http_bytes, before = shim.bytes_received - before, shim.bytes_received
    with ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
        run_sync(client, stream=False, keep_objects=True)
        stats = ws_transport.session_of(client).stats
    websocket_bytes = shim.bytes_received - before
    assert websocket_bytes == stats.bytes_sent
    assert http_bytes > 10 * websocket_bytes
    assert abs(stats.bytes_http_equivalent - http_bytes) < 0.02 * http_bytes
