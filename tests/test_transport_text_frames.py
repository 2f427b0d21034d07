"""Whole text frames split from a socket's bytes before `websockets`' parser (`ws_transport/text_frames.py`).

`next_text` is compared with `websockets`' own frame parser on generated frames; a real `websockets`
server then writes a turn's frames cut at arbitrary points, with pings and a fragmented message
among them, and the connection must route every event in order and answer every ping.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import PayloadTooBig, ProtocolError
from websockets.frames import Frame, Opcode, apply_mask
from websockets.streams import StreamReader

from ws_transport.connection import Connection
from ws_transport.policy import Socket
from ws_transport.text_frames import next_text

OPCODES = [Opcode.TEXT, Opcode.BINARY, Opcode.CONT, Opcode.PING, Opcode.CLOSE]


def parsed_by_websockets(data: bytes, max_size: int | None) -> Frame | None:
    """The frame `websockets` parses from the start of `data` (unmasked, as from a server); None when cut short
    or refused."""
    reader = StreamReader()
    reader.feed_data(data)
    parser = Frame.parse(reader.read_exact, mask=False, max_size=max_size)
    try:
        next(parser)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except (PayloadTooBig, ProtocolError):
        return None
    return None  # it waits for more data


@settings(max_examples=300, deadline=None)
@given(
    opcode=st.sampled_from(OPCODES),
    fin=st.booleans(),
    rsv1=st.booleans(),
    masked=st.booleans(),
    size=st.sampled_from([0, 1, 125, 126, 127, 300, 65535, 65536, 70000]),
    cut=st.integers(min_value=0, max_value=20),
    max_size=st.sampled_from([None, 100, 70000]),
    before=st.binary(max_size=3),
)
def test_next_text_finds_exactly_the_whole_final_text_frames_websockets_parses(
    opcode: Opcode, fin: bool, rsv1: bool, masked: bool, size: int, cut: int, max_size: int | None, before: bytes
) -> None:
    if opcode in (Opcode.PING, Opcode.CLOSE):
        size, fin = min(size, 125), True
    payload = bytes(random.Random(size).randrange(256) for _ in range(size)) if size < 1000 else b"x" * size
    data = raw_frame(opcode, payload, fin=fin, rsv1=rsv1, masked=masked)
    data = data[: len(data) - cut] if cut else data
    found = next_text(before + data, len(before), max_size)
    frame = None if masked else parsed_by_websockets(data, max_size)
    if frame is not None and frame.opcode is Opcode.TEXT and frame.fin and not frame.rsv1:
        assert found is not None
        start, stop = found
        assert (before + data)[start:stop] == frame.data
    else:
        assert found is None


def raw_frame(opcode: Opcode, payload: bytes, *, fin: bool, rsv1: bool, masked: bool) -> bytes:
    """A frame's bytes as written, whatever `websockets` would refuse to write (an RSV bit, a fragmented ping)."""
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode.value])
    mask_bit = 0x80 if masked else 0
    size = len(payload)
    if size < 126:
        head += bytes([mask_bit | size])
    elif size < 65536:
        head += bytes([mask_bit | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([mask_bit | 127]) + size.to_bytes(8, "big")
    key = b"\x01\x02\x03\x04"
    return head + key + apply_mask(payload, key) if masked else head + payload


class Listener:
    def __init__(self) -> None:
        self.stray: list[dict[str, Any]] = []

    def socket_closed(self, conn: Connection) -> None:
        pass

    def stray_event(self, conn: Connection, event: dict[str, Any]) -> None:
        self.stray.append(event)


def event_frames(sizes: list[int]) -> list[bytes]:
    """A turn's events for lane `t1` as unmasked text frames (16- and 64-bit lengths among them), the last one terminal."""
    frames = []
    for n, size in enumerate(sizes):
        event = {"type": "response.output_text.delta", "stream_id": "t1", "n": n, "delta": "é" * size}
        frames.append(Frame(Opcode.TEXT, json.dumps(event).encode()).serialize(mask=False, extensions=[]))
    completed = {"type": "response.completed", "stream_id": "t1", "n": len(sizes)}
    frames.append(Frame(Opcode.TEXT, json.dumps(completed).encode()).serialize(mask=False, extensions=[]))
    return frames


def fragmented(n: int) -> bytes:
    """Event `n` as a text message in two fragments: `websockets` assembles it."""
    text = json.dumps({"type": "response.output_text.delta", "stream_id": "t1", "n": n, "delta": "f"}).encode()
    first = Frame(Opcode.TEXT, text[:10], fin=False).serialize(mask=False, extensions=[])
    return first + Frame(Opcode.CONT, text[10:]).serialize(mask=False, extensions=[])


async def write_cut(socket: ServerConnection, frames: list[bytes], pings: set[int], rng: random.Random) -> None:
    """The frames written raw, cut at random points; a ping (answered within 5 s) before each frame in `pings`."""
    pending = b""
    for n, frame in enumerate(frames):
        if n in pings:
            await write_pieces(socket, pending, rng)
            pending = b""
            await asyncio.wait_for(await socket.ping(f"p{n}"), 5)
        pending += frame
    await write_pieces(socket, pending, rng)


async def write_pieces(socket: ServerConnection, data: bytes, rng: random.Random) -> None:
    while data:
        size = rng.randint(1, len(data))
        socket.transport.write(data[:size])
        data = data[size:]
        await asyncio.sleep(0.002)  # a read of its own on the client's side


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.sampled_from([0, 10, 60, 70, 30000, 40000]), min_size=1, max_size=12),
    seed=st.integers(min_value=0, max_value=10**6),
    odd=st.sampled_from(["none", "pings", "fragment"]),
)
def test_events_cut_anywhere_with_pings_and_fragments_arrive_whole_and_in_order(
    sizes: list[int], seed: int, odd: str
) -> None:
    asyncio.run(one_turn(sizes, seed, odd))


async def one_turn(sizes: list[int], seed: int, odd: str) -> None:
    rng = random.Random(seed)
    frames = event_frames(sizes)
    pings = {rng.randrange(len(frames)) for _ in range(3)} if odd == "pings" else set()
    if odd == "fragment":
        at = rng.randrange(len(frames))
        frames.insert(at, fragmented(-1))

    async def handler(socket: ServerConnection) -> None:
        await socket.recv()
        await write_cut(socket, frames, pings, rng)
        await socket.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as socket:
            conn = Connection(socket, Socket(1, (), 0.0, capacity=16), lanes=True)
            listener = Listener()
            conn.start(listener)
            lane = conn.open_lane()
            await conn.send(b'{"type": "response.create"}')
            seen = []
            while True:
                event = await conn.next_event(lane, timeout=10)
                seen.append(event["n"])
                if event["type"] == "response.completed":
                    break
                assert len(event["delta"]) == (sizes[event["n"]] if event["n"] >= 0 else 1)
            expected = list(range(len(sizes)))
            if odd == "fragment":
                expected.insert(at, -1)
            assert seen == [*expected, len(sizes)]
            assert conn.taking is (odd != "fragment")  # after a fragmented message, websockets reads every frame
            assert listener.stray == []
            await conn.aclose()


def sized_event(n: int, payload_bytes: int) -> bytes:
    """Event `n` as a text frame whose payload is exactly `payload_bytes` long."""
    head = json.dumps({"type": "response.output_text.delta", "stream_id": "t1", "n": n, "delta": ""}).encode()
    payload = head[:-2] + b"x" * (payload_bytes - len(head)) + head[-2:]
    return Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[])


@pytest.mark.parametrize(
    ("second", "cut"),
    [("64-bit", 1), ("64-bit", 2), ("64-bit", 3), ("64-bit", 9), ("16-bit 0x81..", 2), ("16-bit 0x81..", 4)],
)
async def test_a_frame_cut_in_its_header_is_read_by_websockets_and_the_next_read_splits_again(
    second: str, cut: int
) -> None:
    """A read that ends inside a frame's header, or right after it, leaves `websockets`' parser mid-frame: the
    next read goes to the parser, even when it starts as a text frame would (a 16-bit length 0x81xx)."""
    frames = event_frames([200, 70000, 5])
    if second != "64-bit":
        frames[1] = sized_event(1, 0x8110)
        assert frames[1][2] == 0x81
    data = b"".join(frames)
    at = len(frames[0]) + cut  # inside the second frame's header or right after it

    async def handler(socket: ServerConnection) -> None:
        await socket.recv()
        for piece in (data[:at], data[at:]):
            socket.transport.write(piece)
            await asyncio.sleep(0.05)
        await socket.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as socket:
            conn = Connection(socket, Socket(1, (), 0.0, capacity=16), lanes=True)
            conn.start(Listener())
            lane = conn.open_lane()
            await conn.send(b"{}")
            assert [(await conn.next_event(lane, timeout=10))["n"] for _ in range(4)] == [0, 1, 2, 3]
            assert conn.taking
            await conn.aclose()
