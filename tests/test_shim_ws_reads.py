"""How the server reads frames off the socket, written byte by byte from a raw socket.

A read holding exactly one whole masked text or binary frame is unmasked by the shim's protocol itself
(`ShimWebSocketProtocol.data_received`); every other read goes through `websockets`' parser. Split the
same frames across reads and join several in one, and each request is still answered, in order, on one
connection that then chains a turn; a fragmented message is put together; text that is not UTF-8 still
closes with 1007 and an unmasked frame with 1002, whichever path read it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.wire import MODEL, ws_url
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

RECV_S = 10.0


class RawSocket:
    """A WebSocket client whose writes are exactly the bytes given; replies read by `websockets`' client parser."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.protocol = ClientProtocol(parse_uri(url))
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.pending: list[Any] = []

    async def __aenter__(self) -> RawSocket:
        parts = urlsplit(self.url)
        self.reader, self.writer = await asyncio.open_connection(parts.hostname, parts.port)
        self.protocol.send_request(self.protocol.connect())
        await self.write(*self.protocol.data_to_send())
        response = await self.next_event()
        assert isinstance(response, Response) and response.status_code == 101
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()

    async def write(self, *chunks: bytes, pause: float = 0.0) -> None:
        """Each chunk in its own write (a pause between them, so that each arrives in a read of its own)."""
        for chunk in chunks:
            self.writer.write(chunk)
            await self.writer.drain()
            if pause:
                await asyncio.sleep(pause)

    async def next_event(self) -> Any:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), RECV_S)
            if not data:
                self.protocol.receive_eof()
            else:
                self.protocol.receive_data(data)
            self.pending += self.protocol.events_received()
            if not data and not self.pending:
                raise EOFError("closed without a frame")
        return self.pending.pop(0)

    async def events_until_done(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in ("response.completed", "error"):
            frame = await self.next_event()
            assert frame.opcode is Opcode.TEXT, frame
            events.append(json.loads(frame.data))
        return events

    async def close_code(self) -> int:
        while True:
            frame = await self.next_event()
            if frame.opcode is Opcode.CLOSE:
                return Close.parse(frame.data).code


def masked(payload: bytes, opcode: Opcode = Opcode.TEXT, fin: bool = True) -> bytes:
    return Frame(opcode, payload, fin).serialize(mask=True)


def header_size(frame: bytes) -> int:
    """Header and mask: 2 bytes, 2 more for a 16-bit length, and the 4-byte mask."""
    return (4 if frame[1] & 0x7F == 126 else 2) + 4


def create(**fields: Any) -> bytes:
    return json.dumps({"type": "response.create", "model": MODEL, "store": False, **fields}).encode()


def completed_id(events: list[dict[str, Any]]) -> str:
    assert events[-1]["type"] == "response.completed", events[-1]
    return str(events[-1]["response"]["id"])


def split_frames(long_input: str) -> dict[str, list[bytes]]:
    frame = masked(create(input=long_input))
    head = header_size(frame)
    return {
        "header and mask, then the payload": [frame[:head], frame[head:]],
        "a byte at a time for the header": [frame[:1], frame[1:2], frame[2:head], frame[head:]],
        "in three pieces": [frame[: head + 3], frame[head + 3 : head + 40], frame[head + 40 :]],
    }


@pytest.mark.parametrize("long_input", ["hi", "x" * 300])
@pytest.mark.parametrize(
    "how", ["header and mask, then the payload", "a byte at a time for the header", "in three pieces"]
)
async def test_a_frame_split_across_reads_is_answered_and_the_connection_chains(server, long_input, how):
    async with RawSocket(ws_url(server)) as ws:
        await ws.write(*split_frames(long_input)[how], pause=0.05)
        first = completed_id(await ws.events_until_done())
        await ws.write(masked(create(input="again", previous_response_id=first)))
        assert (await ws.events_until_done())[-1]["response"]["previous_response_id"] == first


async def test_two_frames_in_one_read_and_a_frame_with_the_next_ones_start_are_each_answered(server):
    async with RawSocket(ws_url(server)) as ws:
        one, two, three = (masked(create(input=f"turn {n}")) for n in range(3))
        await ws.write(one + two + three[:3], three[3:], pause=0.05)
        ids = [completed_id(await ws.events_until_done()) for _ in range(3)]
        assert len(set(ids)) == 3
        await ws.write(masked(create(input="again", previous_response_id=ids[-1])))
        completed_id(await ws.events_until_done())


async def test_a_fragmented_message_and_a_binary_frame_are_read_whole(server):
    async with RawSocket(ws_url(server)) as ws:
        body = create(input="in two fragments")
        await ws.write(masked(body[:20], fin=False), masked(body[20:], Opcode.CONT), pause=0.05)
        first = completed_id(await ws.events_until_done())
        await ws.write(masked(create(input="binary", previous_response_id=first), Opcode.BINARY))
        completed_id(await ws.events_until_done())


async def test_text_that_is_not_utf8_closes_with_1007_whole_or_split(server):
    for chunks in ([masked(b'{"type": "\xff"}')], [masked(b'{"type": "\xff"}')[:6], masked(b'{"type": "\xff"}')[6:]]):
        async with RawSocket(ws_url(server)) as ws:
            await ws.write(*chunks, pause=0.05)
            assert await ws.close_code() == 1007


async def test_an_unmasked_frame_closes_with_1002(server):
    async with RawSocket(ws_url(server)) as ws:
        await ws.write(Frame(Opcode.TEXT, create(input="hi")).serialize(mask=False))
        assert await ws.close_code() == 1002


async def test_a_whole_create_frame_is_queued_as_it_is_read_and_every_other_frame_goes_through_the_receive_loop(
    server, monkeypatch
):
    """`ResponsesConnection.frame_now`: a whole, valid `response.create` read alone is queued on its lane from the
    protocol's read, without waking the receive loop; anything else (bad JSON, two frames in one read) goes
    through the loop as before, and requests on a lane still run in the order they were sent."""
    from server_shim.ws import ResponsesConnection

    offered: list[bool] = []
    original = ResponsesConnection.frame_now

    def spy(self: ResponsesConnection, text: str) -> bool:
        offered.append(original(self, text))
        return offered[-1]

    async def offers(count: int) -> list[bool]:
        """`offered` once `count` frames were offered: a turn read whole runs in the read (`eager`), so its events
        can reach this thread before the spy's `append`."""
        deadline = time.monotonic() + RECV_S
        while len(offered) < count:
            assert time.monotonic() < deadline, offered
            await asyncio.sleep(0.001)
        return offered

    monkeypatch.setattr(ResponsesConnection, "frame_now", spy)
    async with RawSocket(ws_url(server)) as ws:
        await ws.write(masked(create(input="one")))
        first = completed_id(await ws.events_until_done())
        assert await offers(1) == [True]
        await ws.write(masked(b'{"type": "response.create", "model": '))
        error = (await ws.events_until_done())[-1]
        assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
        assert await offers(2) == [True, False]
        await ws.write(masked(create(input="a", previous_response_id=first)), masked(create(input="b")), pause=0.01)
        a, b = await ws.events_until_done(), await ws.events_until_done()
        assert a[-1]["response"]["previous_response_id"] == first and b[-1]["response"]["previous_response_id"] is None
        assert (await offers(3))[2] is True  # the second may find the first still running: queued on its lane behind it
        await ws.write(masked(create(input="x")) + masked(create(input="y")))  # two in one read: the parser's
        completed_id(await ws.events_until_done())
        completed_id(await ws.events_until_done())
        assert len(await offers(4)) == 4
