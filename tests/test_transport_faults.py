"""Faults, each against a real server on loopback: the shim, the shim behind a small ASGI middleware
that misbehaves on purpose, or (for a TCP drop) a bare `websockets` server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from support.clock import FakeClock
from support.wire import DROPPED_STREAM
from websockets.asyncio.server import ServerConnection, serve

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends.base import BackendRequest, Delta, TextDelta
from server_shim.backends.simulated import SimulatedBackend
from server_shim.errors import APIError, BackendError
from server_shim.ws import FORCE_CLOSE_EXTENSION
from ws_transport.session import SessionState

MODEL = "simulated-1"
FAST_RECONNECT = ws_transport.ReconnectPolicy(max_attempts=2, initial_delay_s=0.01)


class FlakyBackend(SimulatedBackend):
    """The simulator, except that a user message containing `FAIL <status>` fails after one token."""

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        match = re.search(r"FAIL (\d+)", str(request.history.items[-1].get("content")))
        if match is None:
            async for delta in super().stream(request):
                yield delta
            return
        yield TextDelta("partial ")
        raise BackendError("the backend fell over", status=int(match[1]))


class Recorder:
    def __init__(self) -> None:
        self.turns: list[tuple[int, str | None]] = []

    def __call__(self, new_items: list[dict], previous: Any, request: Any) -> None:
        if any("REJECT" in str(item.get("content")) for item in new_items):
            raise APIError(400, "content_rejected", "A validator refused this item.", "input")
        self.turns.append((len(new_items), previous.id if previous else None))


class RefuseUpgrade:
    """A proxy that serves HTTP but answers every WebSocket upgrade with `status`."""

    def __init__(self, app: ASGIApp, status: int) -> None:
        self.app = app
        self.status = status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        denial = PlainTextResponse("no WebSocket here", status_code=self.status)
        await WebSocket(scope, receive, send).send_denial_response(denial)


class CloseOnce:
    """On the first socket only: instead of the first frame containing `trigger`, close with `code`."""

    def __init__(self, app: ASGIApp, code: int, trigger: str) -> None:
        self.app = app
        self.code = code
        self.trigger = trigger
        self.armed = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or not self.armed:
            await self.app(scope, receive, send)
            return
        self.armed = False
        closed = False
        # the shim writes frames straight to the socket through this scope extension; without it, every
        # frame goes through `send`, where this middleware can stand in for a server closing mid-response
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != FORCE_CLOSE_EXTENSION}
        scope = {**scope, "extensions": extensions}

        async def sabotaged(message: Message) -> None:
            nonlocal closed
            if not closed and message["type"] == "websocket.send" and self.trigger in (message.get("text") or ""):
                closed = True
                await send({"type": "websocket.close", "code": self.code, "reason": "test fault"})
            elif not closed:
                await send(message)

        await self.app(scope, receive, sabotaged)


Start = Callable[..., BackgroundServer]


@pytest.fixture(scope="module")
def start() -> Iterator[Start]:
    """Start shim servers for this module; all are stopped together at the end."""
    started: list[BackgroundServer] = []

    def make(
        *, middleware: tuple[type, dict[str, Any]] | None = None, **overrides: Any
    ) -> tuple[BackgroundServer, Recorder]:
        recorder = Recorder()
        settings = Settings(drain_timeout_s=1.0, **overrides)
        app = create_app(
            settings,
            backend=FlakyBackend(tokens_per_s=overrides.get("simulated_tokens_per_s", 0.0)),
            validators=[recorder],
        )
        if middleware is not None:
            app.add_middleware(middleware[0], **middleware[1])
        server = BackgroundServer(app, settings).start()
        started.append(server)
        return server, recorder

    yield make
    for server in started:
        server.server.should_exit = True
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def shim(start: Start) -> tuple[BackgroundServer, Recorder]:
    return start()


def sync_client(server: BackgroundServer, **options: Any) -> OpenAI:
    return ws_transport.wrap(OpenAI(base_url=server.base_url, api_key="k", max_retries=0), **options)


def async_client(server: BackgroundServer, **options: Any) -> AsyncOpenAI:
    return ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0), **options)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- server error events -------------------------------------------------------------------------


async def test_backend_failure_mid_stream_reads_exactly_as_over_http(shim: tuple[BackgroundServer, Recorder]) -> None:
    server, _ = shim

    async def event_types(client: AsyncOpenAI) -> list[tuple[str, str | None]]:
        stream = await client.responses.create(model=MODEL, input="FAIL 500", stream=True)
        return [(e.type, getattr(e, "code", None)) async for e in stream]

    async with AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as plain:
        over_http = await event_types(plain)
    async with async_client(server) as client:
        assert await event_types(client) == over_http
        assert (await client.responses.create(model=MODEL, input="still usable?")).status == "completed"
    assert over_http[-2:] == [("response.failed", None), ("error", "backend_error")]


@pytest.mark.parametrize(
    ("status", "exception"),
    [(429, openai.RateLimitError), (500, openai.InternalServerError), (400, openai.BadRequestError)],
)
def test_backend_failure_raises_the_exception_http_raises(
    shim: tuple[BackgroundServer, Recorder], status: int, exception: type[Exception]
) -> None:
    server, _ = shim
    with OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as plain, pytest.raises(exception) as over_http:
        plain.responses.create(model=MODEL, input=f"FAIL {status}")
    with sync_client(server) as client:
        with pytest.raises(exception) as over_websocket:
            client.responses.create(model=MODEL, input=f"FAIL {status}")
        assert ws_transport.session_of(client).stats.resends == 0
    assert over_websocket.value.status_code == over_http.value.status_code  # type: ignore[attr-defined]
    assert over_websocket.value.code == over_http.value.code  # type: ignore[attr-defined]


# --- invalid requests are never resent ------------------------------------------------------------


def test_invalid_request_raises_bad_request_and_is_sent_once(shim: tuple[BackgroundServer, Recorder]) -> None:
    server, _ = shim
    with sync_client(server) as client:
        client.responses.create(model=MODEL, input="warm the socket up")
        before = server.shim.stats.bytes_received
        stats = ws_transport.session_of(client).stats
        sent_before = stats.bytes_sent
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input="hi", temperature=5)
        assert caught.value.code == "invalid_value" and caught.value.param == "temperature"
        assert server.shim.stats.bytes_received - before == stats.bytes_sent - sent_before  # one frame, no resend
        assert stats.resends == 0


async def test_chained_turn_refused_by_a_validator_is_not_resent(shim: tuple[BackgroundServer, Recorder]) -> None:
    server, _ = shim
    async with async_client(server) as client:
        history: list[Any] = [user("hello")]
        first = await client.responses.create(model=MODEL, input=history, store=False)
        history += [*first.output, user("REJECT me")]
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=MODEL, input=history, store=False)
        assert caught.value.code == "content_rejected"
        stats = ws_transport.session_of(client).stats
        assert (stats.turns, stats.turns_chained, stats.resends) == (2, 1, 0)
        history[-1] = user("accept me")
        assert (await client.responses.create(model=MODEL, input=history, store=False)).status == "completed"


# --- lost chains and sockets: resend in full once -------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_previous_response_not_found_resends_the_full_input(start: Start, stream: bool) -> None:
    server, recorder = start(cache_max_responses=1)
    async with async_client(server) as client:
        a: list[Any] = [user("conversation A")]
        b: list[Any] = [user("conversation B")]
        for history in (a, b):
            history += (await client.responses.create(model=MODEL, input=history, store=False)).output
        a.append(user("A again"))  # B's turn evicted A's response from the connection cache
        if stream:
            events = await client.responses.create(model=MODEL, input=a, store=False, stream=True)
            response = [e async for e in events][-1].response
        else:
            response = await client.responses.create(model=MODEL, input=a, store=False)
        assert response.status == "completed"
        stats = ws_transport.session_of(client).stats
        assert (stats.turns, stats.turns_chained, stats.resends, stats.reconnects) == (3, 1, 1, 0)
    assert recorder.turns[-1] == (3, None)  # the resend carried the whole conversation


@pytest.mark.parametrize("code", [1001, 1011])
def test_close_mid_response_is_resent_transparently_when_nothing_was_delivered(start: Start, code: int) -> None:
    server, recorder = start(middleware=(CloseOnce, {"code": code, "trigger": "response.output_text.delta"}))
    with sync_client(server) as client:
        history: list[Any] = [user("hello")]
        response = client.responses.create(model=MODEL, input=history, store=False)
        assert response.status == "completed" and response.output_text
        history += [*response.output, user("and again")]
        assert client.responses.create(model=MODEL, input=history, store=False).status == "completed"
        stats = ws_transport.session_of(client).stats
        assert (stats.turns, stats.turns_chained, stats.resends, stats.reconnects) == (2, 1, 1, 1)
    assert recorder.turns[:2] == [(1, None), (1, None)]  # the cut-off attempt, then its full resend
    assert recorder.turns[2][0] == 1 and recorder.turns[2][1] is not None


@pytest.mark.parametrize("code", [1001, 1011])
async def test_close_before_the_first_event_is_hidden_from_a_stream(start: Start, code: int) -> None:
    server, _ = start(middleware=(CloseOnce, {"code": code, "trigger": "response.created"}))
    async with async_client(server) as client:
        stream = await client.responses.create(model=MODEL, input="hello", stream=True)
        types = [event.type async for event in stream]
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert ws_transport.session_of(client).stats.resends == 1


async def test_close_after_events_were_streamed_raises_a_connection_error_and_recovers(start: Start) -> None:
    server, _ = start(middleware=(CloseOnce, {"code": 1011, "trigger": "response.output_text.delta"}))
    async with async_client(server) as client:
        stream = await client.responses.create(model=MODEL, input="hello", stream=True)
        with pytest.raises(DROPPED_STREAM) as caught:
            async for _ in stream:
                pass
        causes = []
        cause: BaseException | None = caught.value
        while cause is not None:
            causes.append(cause)
            cause = cause.__cause__
        lost = [c for c in causes if isinstance(c, ws_transport.ConnectionLost)]
        assert lost and lost[0].code == 1011, causes
        response = await client.responses.create(model=MODEL, input="hello")
        assert response.status == "completed"
        assert ws_transport.session_of(client).stats.reconnects == 1


async def test_tcp_drop_before_completion_reconnects_and_resends_in_full() -> None:
    """A bare server: drops the TCP connection on the first frame (close code 1006), answers the second."""
    frames: list[dict[str, Any]] = []

    async def handler(socket: ServerConnection) -> None:
        async for message in socket:
            frame = json.loads(message)
            frames.append(frame)
            if len(frames) == 1:
                socket.transport.abort()
                return
            for event in scripted_response(frame):
                await socket.send(json.dumps(event))

    async with serve(handler, "127.0.0.1", 0) as listener:
        port = listener.sockets[0].getsockname()[1]
        base_url = f"http://127.0.0.1:{port}/v1"
        async with ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)) as client:
            response = await client.responses.create(model=MODEL, input=[user("hi")])
            assert response.output_text == "scripted"
            stats = ws_transport.session_of(client).stats
            assert (stats.resends, stats.reconnects) == (1, 1)
    assert [f["input"] for f in frames] == [[user("hi")], [user("hi")]]


async def test_a_final_output_of_null_from_a_server_out_of_spec_reaches_the_caller_as_over_http() -> None:
    """A direct stream's terminal event, and a call's `Response`, lend their output objects to the chain: an
    output that is not a list is left alone (it raised `TypeError` in the caller's loop, before the event)."""
    frames: list[dict[str, Any]] = []

    async def handler(socket: ServerConnection) -> None:
        async for message in socket:
            frames.append(frame := json.loads(message))
            events = scripted_response(frame)
            if len(frames) > 1:
                events[-1]["response"]["output"] = None
            for event in events:
                await socket.send(json.dumps(event))

    async with serve(handler, "127.0.0.1", 0) as listener:
        port = listener.sockets[0].getsockname()[1]
        base_url = f"http://127.0.0.1:{port}/v1"
        async with ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)) as client:
            history: list[Any] = [user("hi")]
            history += (await client.responses.create(model=MODEL, input=history)).output  # opens the direct path
            stream = await client.responses.create(model=MODEL, input=[*history, user("more")], stream=True)
            async with stream:
                events = [event async for event in stream]
            assert [event.type for event in events] == ["response.created", "response.completed"]
            assert events[-1].response.output is None
            response = await client.responses.create(model=MODEL, input=[*history, user("again")])
            assert response.output is None
    assert len(frames) == 3


def scripted_response(frame: dict[str, Any]) -> list[dict[str, Any]]:
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "scripted", "annotations": []}],
    }
    response = {"id": "resp_1", "object": "response", "created_at": 0, "model": MODEL, "status": "completed"}
    lane = {"stream_id": frame["stream_id"]}
    return [
        {"type": "response.created", "sequence_number": 0, "response": {**response, "output": []}, **lane},
        {"type": "response.completed", "sequence_number": 1, "response": {**response, "output": [message]}, **lane},
    ]


# --- connection age --------------------------------------------------------------------------------


@pytest.mark.parametrize(("store", "chained"), [(False, 0), (None, 1)], ids=["connection-local", "stored"])
async def test_client_reconnects_before_the_connection_age_limit(
    shim: tuple[BackgroundServer, Recorder], store: bool | None, chained: int
) -> None:
    server, _ = shim
    extra = {} if store is None else {"store": store}
    clock = FakeClock()
    async with async_client(server, max_connection_age_s=60, clock=clock) as client:
        history: list[Any] = [user("hello")]
        history += (await client.responses.create(model=MODEL, input=history, **extra)).output
        clock.advance(61)
        history.append(user("later"))
        assert (await client.responses.create(model=MODEL, input=history, **extra)).status == "completed"
        stats = ws_transport.session_of(client).stats
        assert (stats.reconnects, stats.turns_chained, stats.resends) == (1, chained, 0)


async def test_server_age_limit_close_is_followed_by_a_transparent_reconnect(start: Start) -> None:
    server, _ = start(connection_max_age_s=1.0)  # room for a turn on a loaded machine: one close, one reconnect
    async with async_client(server) as client:
        await client.responses.create(model=MODEL, input="hello")
        for _ in range(200):  # the server's age limit has closed it (a fixed sleep raced a slow machine's timer)
            if not server.shim.connections:
                break
            await asyncio.sleep(0.05)
        assert not server.shim.connections
        assert (await client.responses.create(model=MODEL, input="hello again")).status == "completed"
        assert ws_transport.session_of(client).stats.reconnects == 1


# --- refused upgrades: HTTP for the rest of the session --------------------------------------------


@pytest.mark.parametrize("status", [404, 426])
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_refused_upgrade_falls_back_to_http_with_one_warning(
    start: Start, caplog: pytest.LogCaptureFixture, status: int, stream: bool
) -> None:
    server, recorder = start(middleware=(RefuseUpgrade, {"status": status}))
    caplog.set_level(logging.DEBUG, logger="ws_transport")
    async with async_client(server) as client:
        history: list[Any] = [user("hello")]
        for n in range(3):
            if stream:
                async with client.responses.stream(model=MODEL, input=history) as events:
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(model=MODEL, input=history)
            assert response.status == "completed"
            history += [*response.output, user(f"turn {n}")]
        stats = ws_transport.session_of(client).stats
        assert (stats.turns, stats.fallbacks, stats.turns_chained) == (3, 3, 0)
        assert ws_transport.session_of(client).state is SessionState.HTTP_ONLY
    warnings = [r for r in caplog.records if r.name == "ws_transport" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert str(status) in warnings[0].getMessage()
    assert [count for count, _ in recorder.turns] == [1, 3, 5]  # plain HTTP: the whole history each turn


def test_refused_upgrade_falls_back_for_a_sync_client_too(start: Start) -> None:
    server, _ = start(middleware=(RefuseUpgrade, {"status": 426}))
    with sync_client(server) as client:
        assert client.responses.create(model=MODEL, input="hello").status == "completed"
        stream = client.responses.create(model=MODEL, input="hello", stream=True)
        assert [e.type for e in stream][-1] == "response.completed"
        assert ws_transport.session_of(client).stats.fallbacks == 2


def test_spent_reconnect_budget_falls_back_to_http(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    server, _ = start(middleware=(RefuseUpgrade, {"status": 503}))
    with sync_client(server, reconnect=FAST_RECONNECT) as client:
        assert client.responses.create(model=MODEL, input="hello").status == "completed"
        assert ws_transport.session_of(client).stats.fallbacks == 1
    assert any("after 2 attempts" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_bad_api_key_at_the_upgrade_is_an_authentication_error_not_a_fallback(start: Start) -> None:
    server, _ = start(api_keys=["the-key"])
    with sync_client(server) as client:
        with pytest.raises(openai.AuthenticationError):
            client.responses.create(model=MODEL, input="hello")
        assert not ws_transport.session_of(client).http_only


# --- the caller walks away --------------------------------------------------------------------------


async def test_cancelled_stream_leaves_the_session_usable(start: Start) -> None:
    server, _ = start(simulated_tokens_per_s=200.0)
    async with async_client(server) as client:
        stream = await client.responses.create(model=MODEL, input="hello", max_output_tokens=100, stream=True)
        first = await anext(stream)
        await anext(stream)
        await stream.close()
        assert first.type == "response.created"
        response = await client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
        assert response.status == "completed"
        session = ws_transport.session_of(client)
        assert all(not conn.lanes for conn in session.connections)


async def test_cancelled_task_leaves_the_session_usable(start: Start) -> None:
    server, _ = start(simulated_tokens_per_s=200.0)
    streaming = asyncio.Event()
    async with async_client(server, on_event=lambda event: streaming.set()) as client:
        task = asyncio.create_task(client.responses.create(model=MODEL, input="hello", max_output_tokens=100))
        await streaming.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        response = await client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
        assert response.status == "completed"


def test_sync_stream_closed_early_leaves_the_session_usable(start: Start) -> None:
    server, _ = start(simulated_tokens_per_s=200.0)
    with sync_client(server) as client:
        with client.responses.stream(model=MODEL, input="hello", max_output_tokens=100) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    break
        assert client.responses.create(model=MODEL, input="hello", max_output_tokens=4).status == "completed"


@pytest.mark.parametrize("lanes", [True, False])
async def test_closing_the_client_while_an_unread_stream_runs_does_not_wait_for_the_close_timeout(
    start: Start, lanes: bool
) -> None:
    server, _ = start(simulated_tokens_per_s=5000.0)
    client = async_client(server, lanes=lanes, connect_options={"close_timeout": 60})
    stream = await client.responses.create(model=MODEL, input="hello", max_output_tokens=100_000, stream=True)
    await anext(stream)
    await asyncio.sleep(0.2)  # the server keeps streaming; the caller reads nothing more
    async with asyncio.timeout(10):
        await client.close()
    assert not ws_transport.session_of(client).connections


async def test_without_lanes_an_abandoned_stream_never_leaks_into_the_next_turn(start: Start) -> None:
    server, _ = start(simulated_tokens_per_s=200.0)
    async with async_client(server, lanes=False, max_connections=1) as client:
        stream = await client.responses.create(model=MODEL, input="hello", max_output_tokens=100, stream=True)
        await anext(stream)
        await stream.close()
        response = await client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
        assert len(response.output_text.split()) == 4  # its own answer, not the rest of the abandoned one


def test_frame_over_the_server_limit_goes_over_http_for_that_turn_only(start: Start) -> None:
    server, _ = start(max_frame_bytes=4096)
    with sync_client(server) as client:
        assert client.responses.create(model=MODEL, input="x" * 10_000).status == "completed"
        assert client.responses.create(model=MODEL, input="small").status == "completed"
        session = ws_transport.session_of(client)
        assert (session.stats.turns, session.stats.fallbacks, session.http_only) == (2, 1, False)
        # the session learnt the limit: another large frame goes over HTTP without costing a socket
        reconnects = session.stats.reconnects
        assert client.responses.create(model=MODEL, input="y" * 10_000).status == "completed"
        assert client.responses.create(model=MODEL, input="small again").status == "completed"
        assert (session.stats.fallbacks, session.stats.reconnects) == (2, reconnects)


@pytest.mark.parametrize("wrapped", [True, False], ids=["websocket", "http"])
def test_closing_a_sync_stream_from_another_thread_stops_its_reader_as_over_http(start: Start, wrapped: bool) -> None:
    """A "stop generating" button: one thread reads the stream, another closes it."""
    server, _ = start(simulated_tokens_per_s=20)
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    if wrapped:
        client = ws_transport.wrap(client)
    with client:
        stream = client.responses.create(model=MODEL, input="a long answer", stream=True, max_output_tokens=200)
        outcome: list[BaseException | int] = []
        reading = threading.Event()

        def read() -> None:
            seen = 0
            try:
                for _ in stream:
                    seen += 1
                    reading.set()
                outcome.append(seen)
            except BaseException as exc:
                outcome.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        assert reading.wait(10)
        stream.close()
        reader.join(10)
        assert not reader.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], Exception), f"the reader was not stopped: {outcome}"
        if wrapped:
            assert client.responses.create(model=MODEL, input="still usable").status == "completed"
