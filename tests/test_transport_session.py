"""The session's asyncio layer against a bare `websockets` server that follows a script.

The decisions are tested without sockets in `test_transport_policy.py`; here the question is
whether the bytes move as decided: lanes keep turns apart, a socket starts reading only when
told, a socket the server retires or the clock ages out is closed once its turns end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI
from support.clock import FakeClock
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

import ws_transport
from ws_transport.connection import Connection
from ws_transport.policy import Socket

MODEL = "simulated-1"


class Script:
    """A bare server: answers each `response.create` with `created` + `completed` on its lane,
    after the frames `before(frame)` returns; counts sockets and notes when each closes."""

    def __init__(self, before: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None) -> None:
        self.before = before or (lambda frame: [])
        self.sockets = 0
        self.closed = 0
        self.frames: list[dict[str, Any]] = []
        self.url = ""

    async def handler(self, socket: ServerConnection) -> None:
        self.sockets += 1
        try:
            async for message in socket:
                frame = json.loads(message)
                self.frames.append(frame)
                for event in [*self.before(frame), *answer(frame, len(self.frames))]:
                    await socket.send(json.dumps(event))
        finally:
            self.closed += 1


def answer(frame: dict[str, Any], n: int) -> list[dict[str, Any]]:
    message = {
        "type": "message",
        "id": f"msg_{n}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}],
    }
    response = {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": MODEL, "status": "completed"}
    lane = {"stream_id": frame.get("stream_id")}
    return [
        {"type": "response.created", "sequence_number": 0, "response": {**response, "output": []}, **lane},
        {"type": "response.completed", "sequence_number": 1, "response": {**response, "output": [message]}, **lane},
    ]


@contextlib.asynccontextmanager
async def started(script: Script) -> AsyncIterator[str]:
    async with serve(script.handler, "127.0.0.1", 0) as listener:
        port = listener.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/v1"


def client(base_url: str, **options: Any) -> AsyncOpenAI:
    return ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0), **options)


async def eventually(check: Callable[[], bool]) -> bool:
    for _ in range(200):
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()


async def test_a_connection_reads_only_once_started() -> None:
    script = Script()
    async with started(script) as base_url, connect(base_url.replace("http", "ws") + "/responses") as socket:
        before = set(asyncio.all_tasks())
        conn = Connection(socket, Socket(1, (), 0.0, capacity=16), lanes=True)
        assert conn.reader is None and set(asyncio.all_tasks()) == before

        class Listener:
            closed: list[Connection] = []

            def socket_closed(self, conn: Connection) -> None:
                self.closed.append(conn)

            def stray_event(self, conn: Connection, event: dict[str, Any]) -> None:
                pass

        listener = Listener()
        conn.start(listener)
        lane = conn.open_lane()
        await conn.send(json.dumps({"type": "response.create", "stream_id": lane}).encode())
        assert (await conn.next_event(lane, timeout=5))["type"] == "response.created"
        await conn.aclose()
        assert conn.reader is not None and conn.reader.done()
        assert listener.closed == [conn]


async def test_frames_no_lane_keeps_are_dropped_unparsed_only_when_their_type_is_plain_and_not_terminal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = Connection(None, Socket(1, (), 0.0, capacity=16), lanes=True)  # type: ignore[arg-type]  # no I/O here
    strays: list[dict[str, Any]] = []

    class Listener:
        def socket_closed(self, conn: Connection) -> None:
            pass

        def stray_event(self, conn: Connection, event: dict[str, Any]) -> None:
            strays.append(event)

    conn.listener = Listener()

    def parsed(frame: bytes) -> bool:
        """Whether `frame` was parsed (a frame for no lane then reaches the listener as a stray)."""
        before = len(strays)
        try:
            conn._take(frame)
        except orjson.JSONDecodeError:
            return True
        return len(strays) > before

    delta = b'{"type":"response.output_text.delta","delta":"x","stream_id":"t999"}'
    assert not parsed(delta), "no lane open: a stray delta"
    outcome = conn.open_lane(terminal_only=True)
    assert not parsed(delta)
    for kept in (
        b'{"type":"response.completed","response":{}}',
        b'{"type":"response.incomplete","response":{}}',
        b'{"type":"response.failed","response":{}}',
        b'{"type":"error","error":{}}',
        b'{"type":"response.complete\\u0064","response":{}}',  # an escape: only parsing says what it is
        b'{"sequence_number":1,"type":"response.output_text.delta"}',  # written in another order
        b'{ "type": "response.output_text.delta"}',
        b'{"type":"',
    ):
        assert parsed(kept), kept
    streaming = conn.open_lane()
    assert parsed(delta), "a streaming lane keeps every event"
    conn.close_lane(streaming)
    assert not parsed(delta)
    conn.close_lane(outcome)
    with caplog.at_level(logging.DEBUG, logger="ws_transport"):
        debugged = conn.open_lane(terminal_only=True)
        assert parsed(delta), "with debug logging on when a lane opened, strays are parsed and logged"
        conn.close_lane(debugged)


async def test_an_event_for_another_lane_never_reaches_the_turn() -> None:
    stray = {"type": "response.output_text.delta", "delta": "not yours", "stream_id": "t999"}
    script = Script(before=lambda frame: [stray])
    async with started(script) as base_url, client(base_url) as wrapped:
        events = await wrapped.responses.create(model=MODEL, input="hello", stream=True)
        assert [e.type async for e in events] == ["response.created", "response.completed"]


async def test_a_socket_the_server_retires_takes_no_new_turn_and_closes() -> None:
    """A `websocket_connection_limit_reached` error for no lane: the server is closing this socket."""
    retiring = {
        "type": "error",
        "error": {"type": "invalid_request_error", "code": "websocket_connection_limit_reached"},
    }
    script = Script(before=lambda frame: [retiring] if len(script.frames) == 1 else [])
    async with started(script) as base_url, client(base_url) as wrapped:
        await wrapped.responses.create(model=MODEL, input="first")
        assert await eventually(lambda: script.closed == 1), "retired and idle: closed"
        assert (await wrapped.responses.create(model=MODEL, input="second")).status == "completed"
        assert script.sockets == 2
        assert ws_transport.session_of(wrapped).stats.resends == 0


async def test_a_socket_past_its_age_is_closed_after_its_turn_and_replaced() -> None:
    clock = FakeClock()
    script = Script()
    async with started(script) as base_url, client(base_url, clock=clock, max_connection_age_s=60) as wrapped:
        history: list[Any] = [{"role": "user", "content": "hello"}]
        history += (await wrapped.responses.create(model=MODEL, input=history)).output
        clock.advance(61)
        history.append({"role": "user", "content": "later"})
        assert (await wrapped.responses.create(model=MODEL, input=history)).status == "completed"
        assert await eventually(lambda: script.closed == 1)
        session = ws_transport.session_of(wrapped)
        assert (script.sockets, session.stats.reconnects, len(session.connections)) == (2, 1, 1)
    assert "previous_response_id" in script.frames[-1], "a stored chain continues on the new socket"


@pytest.mark.parametrize("lanes", [True, False])
async def test_concurrent_turns_share_sockets_as_the_pool_decides(lanes: bool) -> None:
    script = Script()
    async with started(script) as base_url, client(base_url, lanes=lanes, max_connections=2) as wrapped:
        replies = await asyncio.gather(*(wrapped.responses.create(model=MODEL, input=f"q{n}") for n in range(6)))
        assert all(r.status == "completed" for r in replies)
    assert script.sockets == (1 if lanes else 2)


# --- closing while the server still sends ------------------------------------------------------------

FLOOD = 200
"""Frames the server sends after the one that matters: far over the `websockets` client's 16 queued
messages, past which it stops reading from the socket (and the server's close frame sits behind them)."""
SLOW_CLOSE = {"close_timeout": 60}
"""A close handshake that never completes would hang the test for a minute, not `websockets`' 10 s."""


async def flood(socket: ServerConnection, first: str) -> None:
    """Answer the first frame with `first`, then `FLOOD` deltas, then wait for the client to close."""
    await socket.recv()
    await socket.send(first)
    with contextlib.suppress(Exception):
        for n in range(FLOOD):
            await socket.send(json.dumps({"type": "response.output_text.delta", "delta": f"{n} ", "stream_id": "t1"}))
    await socket.wait_closed()


async def test_a_connection_closed_while_the_server_streams_reads_and_drops_what_is_still_coming() -> None:
    async def handler(socket: ServerConnection) -> None:
        await flood(socket, json.dumps({"type": "response.created", "stream_id": "t1"}))

    async with serve(handler, "127.0.0.1", 0) as listener:
        url = f"ws://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1/responses"
        async with connect(url, **SLOW_CLOSE) as socket:
            conn = Connection(socket, Socket(1, (), 0.0, capacity=16), lanes=True)
            await conn.send(b'{"type": "response.create"}')
            await asyncio.sleep(0.2)  # the server's frames pile up unread: this connection was never started
            async with asyncio.timeout(10):
                await conn.aclose()
            assert socket.close_code == 1000


async def test_a_frame_that_is_not_json_fails_the_turn_at_once_however_much_the_server_still_sends() -> None:
    async def handler(socket: ServerConnection) -> None:
        await flood(socket, "this is not JSON")

    async with serve(handler, "127.0.0.1", 0) as listener:
        base_url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1"
        async with client(base_url, connect_options=SLOW_CLOSE) as wrapped:
            async with asyncio.timeout(10):
                with pytest.raises(openai.APIConnectionError):
                    await wrapped.responses.create(model=MODEL, input="hello")


# --- messages routed from the socket's read, and those left to `websockets` --------------------------------


async def test_whole_text_messages_are_routed_as_the_socket_reads_them() -> None:
    script = Script()
    async with started(script) as base_url, client(base_url) as wrapped:
        history: list[Any] = [{"role": "user", "content": "hello"}]
        for turn in range(3):
            history += (await wrapped.responses.create(model=MODEL, input=history)).output
            history.append({"role": "user", "content": f"more {turn}"})
        (conn,) = ws_transport.session_of(wrapped).connections
        assert conn.taking, "no message was left to websockets' own reading"
    assert ["previous_response_id" in frame for frame in script.frames] == [False, True, True]


@pytest.mark.parametrize("odd", ["fragmented", "binary"])
async def test_a_message_left_to_websockets_is_not_overtaken_by_the_whole_messages_after_it(odd: str) -> None:
    """A fragmented or binary message goes through `websockets`' assembler and the reader task; the whole text
    messages sent right after it go the same way from then on, so the turn sees every event in order, and
    the socket keeps serving chained turns."""

    async def handler(socket: ServerConnection) -> None:
        async for message in socket:
            frame = json.loads(message)
            script.frames.append(frame)
            created, completed = answer(frame, len(script.frames))
            delta = {"type": "response.output_text.delta", "delta": "x", "stream_id": frame.get("stream_id")}
            first = json.dumps(created)
            await socket.send([first[:20], first[20:]] if odd == "fragmented" else first.encode())
            await socket.send(json.dumps(delta))
            await socket.send(json.dumps(completed))

    script = Script()
    async with serve(handler, "127.0.0.1", 0) as listener:
        base_url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1"
        async with client(base_url) as wrapped:
            history: list[Any] = [{"role": "user", "content": "hello"}]
            events = [e async for e in await wrapped.responses.create(model=MODEL, input=history, stream=True)]
            assert [e.type for e in events] == ["response.created", "response.output_text.delta", "response.completed"]
            history += [*events[-1].response.output, {"role": "user", "content": "more"}]
            assert (await wrapped.responses.create(model=MODEL, input=history)).id == "resp_2"
            (conn,) = ws_transport.session_of(wrapped).connections
            assert not conn.taking
    assert "previous_response_id" in script.frames[1]
