"""One socket and its lanes: the asyncio layer that moves a socket's frames to the turns waiting for them.

A `Connection` owns a socket and, once `start()`ed, a reader task that puts each event in the
queue of the lane (the `stream_id`) waiting for it; every turn gets a fresh lane id, so a late
event of an abandoned turn has no queue and is dropped instead of reaching the next turn. What
the socket may be used for is the `policy.Socket` record it carries; this module decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from .errors import ConnectionLost
from .policy import Socket

log = logging.getLogger("ws_transport")

ABNORMAL_CLOSURE = 1006
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
"""What a turn that keeps only its outcome needs: the terminal event and the error that may follow it."""
TERMINAL_TYPES = frozenset(kind.encode() for kind in TERMINAL_EVENTS)
TYPE_PREFIX = b'{"type":"'
TYPE_START = len(TYPE_PREFIX)
SEND_TEXT_BYTES = "text" in inspect.signature(ClientConnection.send).parameters
"""websockets 14+ sends bytes as a text frame as they are."""


@dataclass(frozen=True, slots=True)
class Closed:
    """Put in every waiting lane when the socket closes, so no turn waits forever."""

    code: int
    reason: str


class Listener(Protocol):
    """What a connection tells its session: the socket closed, or an event came for no lane."""

    def socket_closed(self, conn: Connection) -> None: ...

    def stray_event(self, conn: Connection, event: dict[str, Any]) -> None: ...


class Connection:
    """One socket; its reader (started by `start`) routes each event to the lane waiting for it."""

    def __init__(self, socket: ClientConnection, record: Socket, *, lanes: bool) -> None:
        self.socket = socket
        self.record = record
        self.use_lanes = lanes
        self.lanes: dict[str | None, asyncio.Queue[dict[str, Any] | Closed]] = {}
        self.terminal_only: set[str | None] = set()
        """Lanes whose turn keeps only its terminal events (a non-streaming call): the rest are dropped
        here, in the reader, instead of waking the turn once per event."""
        self.closed: Closed | None = None
        self.reader: asyncio.Task[None] | None = None
        self._lane_ids = 0

    @property
    def generation(self) -> int:
        return self.record.generation

    def start(self, listener: Listener) -> None:
        """Start reading; the listener hears of the close and of events no lane waits for."""
        self.reader = asyncio.create_task(self._read(listener), name=f"ws_transport reader #{self.generation}")

    def open_lane(self, *, terminal_only: bool = False) -> str | None:
        lane = None
        if self.use_lanes:
            self._lane_ids += 1
            lane = f"t{self._lane_ids}"
        self.lanes[lane] = asyncio.Queue()
        if terminal_only:
            self.terminal_only.add(lane)
        return lane

    def close_lane(self, lane: str | None) -> None:
        self.lanes.pop(lane, None)
        self.terminal_only.discard(lane)

    async def send(self, frame: bytes) -> None:
        try:
            if SEND_TEXT_BYTES:  # a text frame from the encoded bytes, not decoded and encoded again
                await self.socket.send(frame, text=True)
            else:
                await self.socket.send(frame.decode())
        except ConnectionClosed as exc:
            raise ConnectionLost(*close_info(self.socket)) from exc

    async def next_event(self, lane: str | None, timeout: float | None) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            item = await self.lanes[lane].get()
        if isinstance(item, Closed):
            raise ConnectionLost(item.code, item.reason)
        return item

    async def aclose(self) -> None:
        """Close the socket and wait for the reader; without a reader, what still arrives is read and dropped."""
        if self.reader is None or self.reader.done():
            await close_discarding(self.socket)
            return
        await self.socket.close()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def _read(self, listener: Listener) -> None:
        try:
            while True:
                message = await self.socket.recv(decode=False)  # JSON bytes: orjson reads them undecoded
                if self._unwanted(message):
                    continue
                event = orjson.loads(message)
                if isinstance(event, dict):
                    self._route(event, listener)
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            self.socket.transport.abort()  # the loop is going away (asyncio.run ending): no close handshake
            raise
        except orjson.JSONDecodeError as exc:
            log.warning("ws_transport: closing a socket that sent a frame that is not JSON: %s", exc)
            await close_discarding(self.socket, 1002)
        finally:
            self.closed = Closed(*close_info(self.socket))
            for queue in self.lanes.values():
                queue.put_nowait(self.closed)
            listener.socket_closed(self)

    def _unwanted(self, message: bytes) -> bool:
        """Whether the frame is one no lane keeps, told without parsing it: every open lane keeps only its
        terminal events, and the frame opens with a plain type that is not one (`{"type":"response.created",`,
        as the shim writes every event; a frame written otherwise is parsed). Dropped so, a stray
        non-terminal event is not logged: with debug logging on, every frame is parsed."""
        if not message.startswith(TYPE_PREFIX) or len(self.terminal_only) != len(self.lanes):
            return False
        end = message.find(b'"', TYPE_START)
        kind = message[TYPE_START:end]
        return (
            end > TYPE_START
            and b"\\" not in kind
            and kind not in TERMINAL_TYPES
            and not log.isEnabledFor(logging.DEBUG)
        )

    def _route(self, event: dict[str, Any], listener: Listener) -> None:
        lane = event.get("stream_id") if self.use_lanes else None
        queue = self.lanes.get(lane)
        if queue is not None:
            if lane not in self.terminal_only or event.get("type") in TERMINAL_EVENTS:
                queue.put_nowait(event)
        else:
            listener.stray_event(self, event)


async def close_discarding(socket: ClientConnection, code: int = 1000) -> None:
    """Close `socket` while reading and dropping the frames still coming (a server mid-stream).

    `websockets` stops reading from the socket once 16 messages wait unread (`max_queue`), so the
    server's close frame would sit behind them and `close()` would wait out its `close_timeout`
    (10 s) before giving up. Only for a socket nobody else reads (`recv` allows one reader).
    """
    drain = asyncio.create_task(_discard(socket))
    try:
        await socket.close(code)
    finally:
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)


async def _discard(socket: ClientConnection) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for _ in socket:
            pass


def close_info(socket: ClientConnection) -> tuple[int, str]:
    return socket.close_code or ABNORMAL_CLOSURE, socket.close_reason or ""
