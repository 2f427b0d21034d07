"""One socket and its lanes: the asyncio layer that moves a socket's frames to the turns waiting for them.

A `Connection` owns a socket and, once `start()`ed, a reader task that puts each event in the
`Lane` (the `stream_id`) waiting for it; every turn gets a fresh lane id, so a late event of an
abandoned turn has no lane and is dropped instead of reaching the next turn. What the socket may
be used for is the `policy.Socket` record it carries; this module decides nothing.

A whole text message is routed from the socket's read itself (`websockets` hands each parsed frame to the
connection's `process_event`, which the connection takes over): no queueing in `websockets`' assembler,
no `recv()` and no wake-up of the reader task per message, which cost a wrapped turn about as much as
the rest of its reading (`python -m benchmarks.client_instructions`); and the whole final text frames a
read starts with are split from its bytes before `websockets`' parser sees them (`text_frames.py`), which
cost more again. The reader task stays for whatever the assembler still gets: fragmented and binary
messages (after the first, every later message goes that way too, so none overtakes another), a frame
that is not JSON, and the socket's close.

A lane is a deque and at most one waiting future, not an `asyncio.Queue`, and a wait's timeout is a
deadline on the lane checked by one timer per connection, not an `asyncio.timeout` per wait: with the
SDK's 600 s read timeout that timer is scheduled once and rarely moved, where a timer per wait was
made and cancelled for every event (with the queue, about a tenth of a wrapped turn's client CPU).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import DATA_OPCODES, Frame, Opcode

from .errors import ConnectionLost
from .policy import Socket
from .text_frames import at_a_boundary, next_text

log = logging.getLogger("ws_transport")

ABNORMAL_CLOSURE = 1006
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
"""What a turn that keeps only its outcome needs: the terminal event and the error that may follow it."""
RESPONSE_TERMINAL = sorted(kind.removeprefix("response.") for kind in TERMINAL_EVENTS if kind.startswith("response."))
PLAIN_UNKEPT_TYPE = re.compile(
    rb'\{"type":"response\.(?!(?:' + b"|".join(kind.encode() for kind in RESPONSE_TERMINAL) + rb')")[a-z_.]+"'
)
"""A frame opening with a plain `response.*` type (lowercase letters, dots and underscores: no escapes) that is
not a terminal one, as the shim writes every event; a narrow pattern because a regular expression's match
costs per character and per alternative (~3k instructions a frame, against ~4.4k for any type but the four)."""
plain_unkept = PLAIN_UNKEPT_TYPE.match
TEXT = Opcode.TEXT
SEND_TEXT_BYTES = "text" in inspect.signature(ClientConnection.send).parameters
"""websockets 14+ sends bytes as a text frame as they are."""


@dataclass(frozen=True, slots=True)
class Closed:
    """Put in every waiting lane when the socket closes, so no turn waits forever."""

    code: int
    reason: str


Item = dict[str, Any] | Closed


class Lane:
    """One turn's inbox on a connection: its events in arrival order, and the turn waiting for the next."""

    __slots__ = ("deadline", "events", "terminal_only", "waiter")

    def __init__(self, *, terminal_only: bool) -> None:
        self.events: collections.deque[Item] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.deadline: float | None = None
        self.terminal_only = terminal_only
        """Keeps only its terminal events (a non-streaming call): the rest are dropped by the reader
        instead of waking the turn once per event."""

    def put(self, item: Item) -> None:
        self.events.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


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
        self.lanes: dict[str | None, Lane] = {}
        self.keeping_all = 0
        """How many open lanes keep every event (streams): while none does, non-terminal frames are dropped unparsed."""
        self.parsing_all = False
        """Every frame is parsed: a lane keeps every event, or debug logging was on when a lane last opened or closed
        (then strays are logged)."""
        self.closed: Closed | None = None
        self.reader: asyncio.Task[None] | None = None
        self.listener: Listener | None = None
        self.taking = False
        """Whole text messages are routed from the socket's read (see the module's docstring)."""
        self._lane_ids = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    @property
    def generation(self) -> int:
        return self.record.generation

    def start(self, listener: Listener) -> None:
        """Start reading; the listener hears of the close and of events no lane waits for."""
        self.listener = listener
        self.reader = asyncio.create_task(self._read(listener), name=f"ws_transport reader #{self.generation}")
        process_event = getattr(self.socket, "process_event", None)
        if process_event is not None:  # every `websockets` asyncio connection has one; the reader alone otherwise
            self._process_event = process_event
            self.taking = True
            self.socket.process_event = self._take_event  # type: ignore[method-assign,assignment]
            self._data_received = self.socket.data_received
            self.socket.data_received = self._take_data  # type: ignore[method-assign]

    def open_lane(self, *, terminal_only: bool = False) -> str | None:
        lane = None
        if self.use_lanes:
            self._lane_ids += 1
            lane = f"t{self._lane_ids}"
        self.close_lane(lane)
        self.lanes[lane] = Lane(terminal_only=terminal_only)
        self.keeping_all += not terminal_only
        self.parsing_all = self.keeping_all > 0 or log.isEnabledFor(logging.DEBUG)
        return lane

    def close_lane(self, lane: str | None) -> None:
        closed = self.lanes.pop(lane, None)
        if closed is not None:
            self.keeping_all -= not closed.terminal_only
            self.parsing_all = self.keeping_all > 0 or log.isEnabledFor(logging.DEBUG)

    async def send(self, frame: bytes) -> None:
        try:
            if SEND_TEXT_BYTES:  # a text frame from the encoded bytes, not decoded and encoded again
                await self.socket.send(frame, text=True)
            else:
                await self.socket.send(frame.decode())
        except ConnectionClosed as exc:
            raise ConnectionLost(*close_info(self.socket)) from exc

    def queued(self, lane: str | None) -> dict[str, Any] | None:
        """The lane's next event when one is already queued (a stream reads its events so, without a coroutine
        each); None: wait for it with `next_event` (which raises for a closed socket's mark)."""
        inbox = self.lanes[lane]
        if not inbox.events:
            return None
        item = inbox.events[0]
        if isinstance(item, Closed):
            return None
        return inbox.events.popleft()  # type: ignore[return-value]

    async def next_event(self, lane: str | None, timeout: float | None) -> dict[str, Any]:
        """The lane's next event; `TimeoutError` when none came within `timeout` seconds."""
        inbox = self.lanes[lane]
        if not inbox.events:
            loop = asyncio.get_running_loop()
            inbox.waiter = waiter = loop.create_future()
            if timeout is not None:
                self._watch(loop, inbox, loop.time() + timeout)
            try:
                await waiter
            finally:
                inbox.waiter = inbox.deadline = None
        item = inbox.events.popleft()
        if isinstance(item, Closed):
            raise ConnectionLost(item.code, item.reason)
        return item

    def _watch(self, loop: asyncio.AbstractEventLoop, lane: Lane, deadline: float) -> None:
        """Fail `lane`'s wait at `deadline`: the connection's one timer moves only to an earlier deadline."""
        lane.deadline = deadline
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer is due: waits whose deadline it was set for time out; it is set again for the next one."""
        due, self._timer = self._timer_at, None
        for lane in self.lanes.values():
            waiter, deadline = lane.waiter, lane.deadline
            if waiter is None or deadline is None or waiter.done():
                continue
            if deadline <= due:
                lane.deadline = None
                waiter.set_exception(TimeoutError())
            else:
                self._watch(loop, lane, deadline)

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
                self._take(await self.socket.recv(decode=False))  # JSON bytes: orjson reads them undecoded
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
            for lane in self.lanes.values():
                lane.put(self.closed)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            listener.socket_closed(self)

    def _take_data(self, data: bytes) -> None:
        """The socket's `data_received`: the whole final text frames a read starts with are routed here and now
        (see `text_frames.py`), the rest of the read goes to `websockets`' parser (and `_take_event`)."""
        taken = 0
        protocol = self.socket.protocol
        if self.taking and at_a_boundary(protocol):
            view, max_size = memoryview(data), protocol.max_size
            while (frame := next_text(data, taken, max_size)) is not None and self._take_text(
                view[frame[0] : frame[1]]
            ):
                taken = frame[1]
        if taken < len(data):
            self._data_received(data[taken:] if taken else data)

    def _take_event(self, event: Frame) -> None:
        """The socket's `process_event` (it gets only frames once the connection is open): a whole text message
        is routed here and now; anything else goes on to `websockets` (and its recv, the reader's), and once
        a data frame did, every later one does."""
        if self.taking:
            opcode = event.opcode
            if opcode is TEXT and event.fin and self._take_text(event.data):
                return
            if opcode in DATA_OPCODES:
                self.taking = False
        self._process_event(event)

    def _take_text(self, message: bytes | bytearray | memoryview) -> bool:
        """Route a whole text message as `_take` does; False for one that is not JSON: from then on every message
        is left to `websockets` and the reader, which closes the socket."""
        if not self.parsing_all and plain_unkept(message) is not None:
            return True
        try:
            self._route_json(message)
        except orjson.JSONDecodeError:
            self.taking = False
            return False
        return True

    def _take(self, message: bytes | bytearray | memoryview) -> None:
        """Route one message to its lane (`orjson.JSONDecodeError` for one that is not JSON).

        Dropped unparsed when no lane keeps it, told without parsing it: every open lane keeps only its
        terminal events, and the frame opens with a plain type that is not one (`{"type":"response.created",`,
        as the shim writes every event; a frame written otherwise is parsed). Dropped so, a stray
        non-terminal event is not logged: with debug logging on, every frame is parsed."""
        if self.parsing_all or plain_unkept(message) is None:
            self._route_json(message)

    def _route_json(self, message: bytes | bytearray | memoryview) -> None:
        event = orjson.loads(message)
        if type(event) is dict:
            self._route(event)

    def _route(self, event: dict[str, Any]) -> None:
        lane = self.lanes.get(event.get("stream_id") if self.use_lanes else None)
        if lane is not None:
            if not lane.terminal_only or event.get("type") in TERMINAL_EVENTS:
                lane.put(event)
        elif self.listener is not None:
            self.listener.stray_event(self, event)


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
