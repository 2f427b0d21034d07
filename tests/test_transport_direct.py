"""`wrap()`'s direct path: a turn sent without the SDK's HTTP pipeline, answered with the SDK's own `Response`
(or, streamed, the SDK's own `Stream` of its typed events).

The SDK's pipeline is observed through httpx's request event hook: a turn that takes the direct
path builds no httpx request at all. What the caller gets is compared with what the SDK gives over
plain HTTP for the same stored response (`responses.retrieve`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.responses import Response

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from ws_transport import chaining

MODEL = "simulated-1"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    settings = Settings(usage_ledger="off")
    with BackgroundServer(create_app(settings), settings) as running:
        yield running


class Requests:
    """Every request the SDK built and handed to httpx (the direct path builds none)."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.headers: list[dict[str, str]] = []

    def __call__(self, request: Any) -> None:
        self.urls.append(str(request.url))
        self.headers.append(dict(request.headers))

    async def hook(self, request: Any) -> None:
        self(request)


def wrapped(server: BackgroundServer, requests: Requests, **options: Any) -> OpenAI:
    http = openai.DefaultHttpxClient(event_hooks={"request": [requests]})
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0, http_client=http)
    return ws_transport.wrap(client, **options)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def same_as_http(response: Response, http: OpenAI) -> None:
    """The direct path's `Response` is the object the SDK makes of the same response over HTTP."""
    over_http = http.responses.retrieve(response.id)
    assert type(response) is Response
    assert response == over_http
    assert response.model_fields_set == over_http.model_fields_set
    assert [type(item) for item in response.output] == [type(item) for item in over_http.output]
    assert response._request_id is None


def test_chained_non_streaming_turns_build_no_http_request_and_return_what_http_gives(
    server: BackgroundServer,
) -> None:
    requests = Requests()
    http = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    with wrapped(server, requests) as client:
        history: list[Any] = [user("hello")]
        for turn in range(4):
            response = client.responses.create(model=MODEL, input=history, store=True)
            same_as_http(response, http)
            history += [*response.output, user(f"and then {turn}?")]
        stats = ws_transport.session_of(client).stats
    assert len(requests.urls) == 1, "only the first turn went through the SDK's pipeline"
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (4, 3, 0)


def test_the_async_client_takes_the_direct_path_too(server: BackgroundServer) -> None:
    requests = Requests()
    http = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

    async def main() -> list[Response]:
        hooks = openai.DefaultAsyncHttpxClient(event_hooks={"request": [requests.hook]})
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0, http_client=hooks)
        async with ws_transport.wrap(client) as wrapped_client:
            history: list[Any] = [user("hello")]
            responses = []
            for turn in range(3):
                response = await wrapped_client.responses.create(model=MODEL, input=history, store=True)
                responses.append(response)
                history += [*response.output, user(f"more {turn}")]
            return responses

    for response in asyncio.run(main()):
        same_as_http(response, http)
    assert len(requests.urls) == 1


def test_a_rejected_direct_turn_raises_what_http_raises_and_the_socket_chains_on(server: BackgroundServer) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        history: list[Any] = [user("hello")]
        first = client.responses.create(model=MODEL, input=history)
        history += [*first.output, user("now with a bad temperature")]
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=MODEL, input=history, temperature=5)
        assert "temperature" in str(raised.value)
        requests_after_error = len(requests.urls)
        second = client.responses.create(model=MODEL, input=history)
        session = ws_transport.session_of(client)
        assert [c.generation for c in session.connections] == [1]
        assert session.stats.reconnects == 0 and session.stats.turns_chained >= 1
        assert second.status == "completed"
    assert requests_after_error == 2, "the rejected turn went again through the SDK, which raised its error"
    assert len(requests.urls) == 2, "the turn after the error took the direct path again"


def test_per_call_options_raw_responses_and_streaming_responses_go_through_the_sdk(server: BackgroundServer) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        client.responses.create(model=MODEL, input="hello")
        client.responses.create(model=MODEL, input="x", extra_headers={"x-trace": "1"})
        raw = client.responses.with_raw_response.create(model=MODEL, input="y")
        assert isinstance(raw.parse(), Response)
        with client.responses.with_streaming_response.create(model=MODEL, input="z", stream=True) as streaming:
            kinds = [event.type for event in streaming.parse()]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        client.responses.create(model=MODEL, input="timeout", timeout=30)
        assert len(requests.urls) == 5
        client.responses.create(model=MODEL, input="plain again")
        with client.responses.create(model=MODEL, input="streamed", stream=True) as stream:
            assert [event.type for event in stream][-1] == "response.completed"
        assert len(requests.urls) == 5


def shapes(events: Any) -> list[tuple[type, set[str], dict[str, Any] | None]]:
    """What the SDK made of each event, but for the values a turn makes afresh (ids, times)."""
    return [(type(event), event.model_fields_set, event.model_extra) for event in events]


def streamed_turns(client: OpenAI) -> list[Any]:
    """Three chained streamed turns' shapes, and the stream object of the last one."""
    history: list[Any] = [user("hello")]
    turns: list[Any] = []
    for turn in range(3):
        with client.responses.create(model=MODEL, input=history, stream=True) as stream:
            events = list(stream)
        turns.append(shapes(events))
        history += [*events[-1].response.output, user(f"and then {turn}?")]
    return [turns, stream]


def test_streamed_turns_build_no_http_request_and_yield_the_sdks_own_stream_and_events(
    server: BackgroundServer,
) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        turns, stream = streamed_turns(client)
        stats = ws_transport.session_of(client).stats
    assert len(requests.urls) == 1, "only the first turn went through the SDK's pipeline"
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (3, 2, 0)
    with wrapped(server, Requests(), direct=False) as client:
        through_sdk, sdk_stream = streamed_turns(client)
    assert turns == through_sdk, "the same event types, fields set and extras as through the SDK's pipeline"
    assert type(stream) is type(sdk_stream) is openai.Stream
    assert stream.__orig_class__ == sdk_stream.__orig_class__  # type: ignore[attr-defined]
    assert stream.response.status_code == 200 and stream.response.headers == sdk_stream.response.headers
    assert stream.response.request.method == "POST" and stream.response.request.url == sdk_stream.response.request.url
    assert stream.response.is_closed


def test_a_sync_stream_whose_events_came_together_is_sent_read_and_closed_in_one_portal_call(
    server: BackgroundServer,
) -> None:
    """A portal call costs ~75k instructions: a turn whose events arrive in one read takes one (it was three: the
    first event, the rest, the close)."""
    with wrapped(server, Requests()) as client:
        history: list[Any] = [user("hello")]
        history += client.responses.create(model=MODEL, input=history).output  # the SDK's turn opens the path
        portal = client._client._transport.portal
        calls: list[str] = []
        call = portal.call

        def counted(coro: Any, timeout: float | None = None) -> Any:
            calls.append(coro.__qualname__)
            return call(coro, timeout)

        portal.call = counted  # type: ignore[method-assign]
        with client.responses.create(model=MODEL, input=[*history, user("more")], stream=True) as stream:
            kinds = [event.type for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert calls == ["_opened"]
        assert stream.response.is_closed


def test_a_streamed_turns_output_objects_chain_the_next_turn_by_identity(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a call's `Response` does, a stream's terminal event lends its output objects to the chain: a history
    made of them matches without an item dumped and compared as JSON (that cost a streamed turn ~60k
    instructions, more than its portal call)."""
    dumped: list[Any] = []
    canonical = chaining.canonical
    monkeypatch.setattr(chaining, "canonical", lambda value: dumped.append(value) or canonical(value))
    with wrapped(server, Requests()) as client:
        history: list[Any] = [user("hello")]
        history += client.responses.create(model=MODEL, input=history).output  # the SDK's turn opens the path
        for turn in range(3):
            with client.responses.create(model=MODEL, input=[*history, user(f"more {turn}")], stream=True) as stream:
                events = list(stream)
            output = events[-1].response.output
            history += [user(f"more {turn}"), *output]
        assert ws_transport.session_of(client).stats.turns_chained == 3
    assert dumped == []


def test_an_async_streamed_turns_output_objects_chain_the_next_turn_by_identity(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumped: list[Any] = []
    canonical = chaining.canonical
    monkeypatch.setattr(chaining, "canonical", lambda value: dumped.append(value) or canonical(value))

    async def main() -> int:
        async with ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)) as client:
            history: list[Any] = [user("hello")]
            history += (await client.responses.create(model=MODEL, input=history)).output
            for turn in range(3):
                history.append(user(f"more {turn}"))
                stream = await client.responses.create(model=MODEL, input=history, stream=True)
                async with stream:
                    events = [event async for event in stream]
                history += events[-1].response.output
            return ws_transport.session_of(client).stats.turns_chained

    assert asyncio.run(main()) == 3
    assert dumped == []


def test_the_async_client_streams_on_the_direct_path_too(server: BackgroundServer) -> None:
    requests = Requests()

    async def main() -> list[list[str]]:
        hooks = openai.DefaultAsyncHttpxClient(event_hooks={"request": [requests.hook]})
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0, http_client=hooks)
        async with ws_transport.wrap(client) as wrapped_client:
            history: list[Any] = [user("hello")]
            kinds = []
            for turn in range(3):
                stream = await wrapped_client.responses.create(model=MODEL, input=history, stream=True)
                assert type(stream) is openai.AsyncStream
                async with stream:
                    events = [event async for event in stream]
                kinds.append([event.type for event in events])
                history += [*events[-1].response.output, user(f"more {turn}")]
            assert ws_transport.session_of(wrapped_client).stats.turns_chained == 2
            return kinds

    for kinds in asyncio.run(main()):
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert len(requests.urls) == 1


def test_a_rejected_direct_stream_raises_what_http_raises_and_a_stream_closed_early_lets_the_next_one_run(
    server: BackgroundServer,
) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        history: list[Any] = [user("hello")]
        first = client.responses.create(model=MODEL, input=history)
        history += [*first.output, user("now with a bad temperature")]
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=MODEL, input=history, temperature=5, stream=True)
        assert "temperature" in str(raised.value)
        assert len(requests.urls) == 2, "the rejected turn went again through the SDK, which raised its error"
        with client.responses.create(model=MODEL, input=history, stream=True) as stream:
            assert next(stream).type == "response.created"
        assert stream.response.is_closed
        with client.responses.create(model=MODEL, input=history, stream=True) as stream:
            assert [event.type for event in stream][-1] == "response.completed"
    assert len(requests.urls) == 2, "the streams after the error took the direct path again"


def test_changed_credentials_go_through_the_sdk_and_pick_their_own_socket(server: BackgroundServer) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        client.responses.create(model=MODEL, input="hello")
        client.responses.create(model=MODEL, input="direct")
        assert len(requests.urls) == 1
        client.api_key = "another-key"
        client.responses.create(model=MODEL, input="as another key")
        assert len(requests.urls) == 2, "new credentials: the SDK builds the headers again"
        client.responses.create(model=MODEL, input="direct as another key")
        assert len(requests.urls) == 2
        assert len(ws_transport.session_of(client).connections) == 2, "a socket per key"


def test_an_event_observer_still_sees_every_event_of_a_non_streaming_turn(server: BackgroundServer) -> None:
    seen: list[str] = []
    requests = Requests()
    with wrapped(server, requests, on_event=lambda event: seen.append(event["type"])) as client:
        client.responses.create(model=MODEL, input="hello")
        start = len(seen)
        client.responses.create(model=MODEL, input="direct")
    assert len(requests.urls) == 1
    direct = seen[start:]
    assert direct[0] == "response.created" and direct[-1] == "response.completed"
    assert "response.output_text.delta" in direct


def test_with_direct_off_every_turn_goes_through_the_sdk_pipeline(server: BackgroundServer) -> None:
    requests = Requests()
    with wrapped(server, requests, direct=False) as client:
        history: list[Any] = [user("hello")]
        for turn in range(3):
            response = client.responses.create(model=MODEL, input=history)
            history += [*response.output, user(f"more {turn}")]
        assert ws_transport.session_of(client).stats.turns_chained == 2
    assert len(requests.urls) == 3


def test_a_client_that_validates_responses_strictly_keeps_the_sdks_pipeline(server: BackgroundServer) -> None:
    """Its `APIResponseValidationError` carries the HTTP response: only the SDK's pipeline has one to give."""
    requests = Requests()
    http = openai.DefaultHttpxClient(event_hooks={"request": [requests]})
    client = OpenAI(
        base_url=server.base_url, api_key="k", max_retries=0, http_client=http, _strict_response_validation=True
    )
    with ws_transport.wrap(client) as wrapped_client:
        history: list[Any] = [user("hello")]
        for turn in range(3):
            response = wrapped_client.responses.create(model=MODEL, input=history)
            history += [*response.output, user(f"more {turn}")]
        assert ws_transport.session_of(wrapped_client).stats.turns_chained == 2
    assert len(requests.urls) == 3


def test_any_change_to_what_the_sdk_builds_headers_from_sends_the_next_turn_through_the_sdk(
    server: BackgroundServer,
) -> None:
    """The direct path remembers the client's header inputs; a change to any of them is noticed."""
    requests = Requests()
    with wrapped(server, requests) as client:
        client.responses.create(model=MODEL, input="hello")
        client.responses.create(model=MODEL, input="direct")
        assert len(requests.urls) == 1
        client.organization = "org-2"
        client.responses.create(model=MODEL, input="a new organization header")
        client.responses.create(model=MODEL, input="direct again")
        assert len(requests.urls) == 2
        client._custom_headers["x-team"] = "blue"  # changed in place, as the SDK's own tables can be
        client.responses.create(model=MODEL, input="a new custom header")
        client.responses.create(model=MODEL, input="direct again")
        assert len(requests.urls) == 3
        assert requests.headers[-1].get("x-team") == "blue"


class Uncomparable:
    """An attribute a caller hung on the client whose `==` raises (as a numpy array's truth value does)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("cannot compare")

    __hash__ = object.__hash__


def test_an_attribute_that_cannot_be_compared_only_makes_the_key_worked_out_again(server: BackgroundServer) -> None:
    requests = Requests()
    with wrapped(server, requests) as client:
        client.responses.create(model=MODEL, input="hello")
        client.tracer = Uncomparable()  # type: ignore[attr-defined]
        client.responses.create(model=MODEL, input="direct")
        client.tracer = Uncomparable()  # type: ignore[attr-defined]
        response = client.responses.create(model=MODEL, input="still direct")
        assert response.status == "completed"
    assert len(requests.urls) == 1


async def test_tools_and_metadata_changed_in_place_reach_the_server(server: BackgroundServer) -> None:
    """Review finding: the second call went out chained with the first call's tools and metadata."""
    client = ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0))
    metadata = {"step": "1"}
    tools: list[Any] = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    items: list[Any] = [{"role": "user", "content": "hi"}]
    try:
        first = await client.responses.create(model=MODEL, input=items, metadata=metadata, tools=tools)
        metadata["step"] = "2"
        tools[0]["name"] = "g"
        items = [*items, *first.output, {"role": "user", "content": "more"}]
        second = await client.responses.create(model=MODEL, input=items, metadata=metadata, tools=tools)
        assert second.metadata == {"step": "2"} and [tool.name for tool in second.tools] == ["g"]
        third = await client.responses.create(
            model=MODEL,
            input=[*items, *second.output, {"role": "user", "content": "again"}],
            metadata=metadata,
            tools=tools,
        )
        assert third.previous_response_id == second.id, "unchanged since: chained again"
    finally:
        await client.close()
