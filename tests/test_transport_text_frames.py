"""Whole text frames split from a socket's bytes before `websockets`' parser (`ws_transport/text_frames.py`).

`next_text` is compared with `websockets`' own frame parser on generated frames; a real `websockets`
server then writes a turn's frames cut at arbitrary points, with pings and a fragmented message
among them, and the connection must route every event in order and answer every ping.
"""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace
from typing import Any

import pytest
import websockets.frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig, ProtocolError
from websockets.frames import Frame, Opcode, apply_mask
from websockets.protocol import State
from websockets.streams import StreamReader
from websockets.uri import parse_uri
from websockets.utils import accept_key

from ws_transport.connection import Connection
from ws_transport.policy import Socket
from ws_transport.text_frames import at_a_boundary, next_text

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


def opened_client(max_size: int | None) -> ClientProtocol:
    """A sans-I/O client protocol past its handshake, as the connection's socket holds it."""
    protocol = ClientProtocol(parse_uri("ws://shim/v1/responses"), max_size=max_size)
    request = protocol.connect()
    protocol.send_request(request)
    protocol.data_to_send()
    accept = accept_key(request.headers["Sec-WebSocket-Key"]).encode()
    protocol.receive_data(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    protocol.events_received()
    assert protocol.state is State.OPEN
    return protocol


def server_bytes(rng: random.Random) -> bytes:
    """A server's frames of every kind, payloads full of the bytes a header starts with (0x81, 0x7e, 0x7f), lengths
    at each bound (a 16-bit length 0x81xx reads as a text frame's first byte when a read starts there)."""
    out = []
    for _ in range(rng.randint(1, 10)):
        n = rng.choice([0, 1, 125, 126, 127, 200, 0x8100, 65535, 65536]) if rng.random() < 0.3 else rng.randint(0, 60)
        piece = bytes(
            rng.choice([0x81, 0x7E, 0x7F, 0x00]) if rng.random() < 0.5 else rng.randint(0, 255) for _ in range(64)
        )
        payload = (piece * (n // 64 + 1))[:n]
        opcode = rng.choice([*OPCODES, Opcode.TEXT, Opcode.TEXT, Opcode.TEXT, Opcode.PONG])
        if opcode in (Opcode.PING, Opcode.PONG, Opcode.CLOSE):
            payload = b"\x03\xe8" if opcode is Opcode.CLOSE else payload[:125]
        fin = opcode not in (Opcode.TEXT, Opcode.CONT) or rng.random() < 0.8
        odd = rng.random()
        out.append(raw_frame(opcode, payload, fin=fin, rsv1=odd < 0.03, masked=0.03 <= odd < 0.06))
    return b"".join(out)


def read_as_the_client(data: bytes, cuts: list[int], max_size: int | None, *, split: bool) -> tuple[Any, ...]:
    """What the client gets from `data` read in pieces (cut at `cuts`): frames in order, bytes it sends back (pongs,
    close), state and close codes; `split`: whole text frames taken as `Connection._take_data` takes them."""
    protocol = opened_client(max_size)
    frames: list[tuple[str, bool, bytes]] = []
    sent = []
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        read, taken = data[start:end], 0
        if split and at_a_boundary(protocol):
            while (bounds := next_text(read, taken, protocol.max_size)) is not None:
                frames.append(("TEXT", True, read[bounds[0] : bounds[1]]))
                taken = bounds[1]
        if taken < len(read):
            protocol.receive_data(read[taken:])
        frames += [(event.opcode.name, event.fin, bytes(event.data)) for event in protocol.events_received()]
        sent += protocol.data_to_send()
    codes = [close.code if close else None for close in (protocol.close_rcvd, protocol.close_sent)]
    return frames, b"".join(sent), protocol.state, codes


@pytest.mark.parametrize("block", range(4))
def test_splitting_reads_changes_nothing_websockets_parser_alone_would_do(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Differential, per random stream and cuts: frames, their order, pongs and closes sent, state and close codes
    are the parser's own. Cuts fall anywhere, byte by byte at the start, and right after frame headers."""
    monkeypatch.setattr(websockets.frames, "secrets", SimpleNamespace(token_bytes=bytes))  # unmasked: bytes compare
    for seed in range(block * 150, block * 150 + 150):
        rng = random.Random(seed)
        data = server_bytes(rng)
        cuts = set(rng.sample(range(1, len(data)), k=min(rng.randint(0, 6), len(data) - 1)))
        if rng.random() < 0.3:
            cuts.update(range(1, min(len(data), 40)))
        cuts.update(at for at in (2, 4) if rng.random() < 0.5 and at < len(data))
        max_size = rng.choice([None, 100, 2**16])
        split = read_as_the_client(data, sorted(cuts), max_size, split=True)
        assert split == read_as_the_client(data, sorted(cuts), max_size, split=False), seed
