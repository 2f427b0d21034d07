"""uvicorn's sans-I/O WebSocket protocol, as the shim runs it: frames corked per loop iteration, a
direct frame writer for the app, reads paused only when a frame waits, a close that does not wait
for a peer that does not read, and the error event before a 1009 for an oversized frame."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Coroutine, Generator
from typing import Any, Literal, TypeVar

import orjson
from uvicorn._types import ASGISendEvent, WebSocketSendEvent
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode, apply_mask
from websockets.http11 import Request
from websockets.protocol import State
from websockets.streams import StreamReader

from .ws import CLOSE_MESSAGE_TOO_BIG, FORCE_CLOSE_EXTENSION
from .ws_frames import too_large_error

FORCE_CLOSE_GRACE_S = 5.0


def _send_when_gone(frames: list[bytes]) -> None:
    raise ClientDisconnected()


GONE_EXTENSION: dict[str, Any] = {
    "close": lambda code, reason: None,
    "writable": lambda: True,
    "send_texts": _send_when_gone,
}
"""The force-close extension of a lost connection: the same answers (nothing to close, sends fail at
once), without a reference back to the protocol."""


CORK_MAX_BYTES = 64 * 1024
"""Frames held for one loop iteration are written at once past this size (the writer's backpressure bound)."""
_HEADER_16 = struct.Struct("!BBH")
_AT_A_FRAME_BOUNDARY = StreamReader.at_eof.__code__
"""Where `websockets`' parser waits between frames (its `parse` loop starts each frame there)."""
_DATA_KINDS: dict[int, Literal["text", "bytes"]] = {0x81: "text", 0x82: "bytes"}
"""A final, unfragmented text or binary frame's first byte (no RSV bit, as no extension is negotiated)."""
_HEADER_64 = struct.Struct("!BBQ")
_OPEN = State.OPEN
"""Read as a global: reading an Enum's member off its class costs ~900 instructions under Python 3.11 (its
metaclass is not `type`: no specialized lookup), for each frame read whole and each batch the app sends."""
T = TypeVar("T")


class ShimWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, but a frame over its size bound gets the error event first.

    The frame parser refuses a frame whose header announces more than `ws_max_size` bytes
    before reading its payload, and closes with 1009; the app never sees that frame, so the
    `message_too_large` event (the same one the app sends for frames it refuses) is written here,
    just ahead of the close frame. Responses in flight on that connection are cut.

    It also counts a finished denial response (our 401 for a wrong key) as the end of the handshake:
    uvicorn sends the `websocket.http.response` denial correctly but then logs "ASGI callable
    returned without completing handshake" at ERROR for it, and a refused key is not a server error.

    Frames sent in one loop iteration leave in one socket write (`_cork`): a turn whose events are
    ready together costs one `transport.write`, and a lone delta waits only for the end of the
    iteration it was sent in, never for a timer. Frames sent by a task running as `steps(...)` (the
    connection's lanes) leave at the end of the task's step instead: no loop iteration for the write.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._corked: list[bytes] = []
        self._corked_bytes = 0
        self._extension: dict[str, Any] = {}
        self._stepping = False
        """A `FlushedSteps` task's step is running: what it corks is written when the step ends."""

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "websocket.send" and self.handshake_complete and not self.close_sent:
            await self._cork(message)
            return
        self.flush()
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True

    async def _cork(self, message: WebSocketSendEvent) -> None:
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        try:
            data = message.get("bytes")
            if data is not None:
                self.conn.send_binary(data)
            else:
                self.conn.send_text((message.get("text") or "").encode())
        except InvalidState:
            raise ClientDisconnected() from None
        self._hold(*self.conn.data_to_send())

    def send_texts_now(self, frames: list[bytes]) -> None:
        """A text frame for each of `frames` (UTF-8) corked at once, without an ASGI message: the app's fast path.

        For a socket that is writable (the caller checks), so nothing waits: the frame headers are
        built here (a server's frames are unmasked, and this protocol negotiates no extension), which
        is what `websockets` would write, less the ASGI, Starlette and `websockets` layers per event.
        A turn's events ready together come in one call: one check and one cork for all of them.
        """
        if self.disconnected or self.close_sent or self.conn.state is not _OPEN:
            raise ClientDisconnected()
        corked = self._corked
        first = not corked
        size = self._corked_bytes
        for data in frames:
            length = len(data)
            header = _HEADERS[length] if length < _HEADERS_MADE else text_frame_header(length)
            corked.append(header)
            corked.append(data)
            size += len(header) + length
        self._corked_bytes = size
        if size >= CORK_MAX_BYTES:
            self.flush()
        elif first and corked and not self._stepping:
            self.loop.call_soon(self.flush)

    def _hold(self, *chunks: bytes) -> None:
        """Keep chunks for the write at the end of this loop iteration, or of the running `steps` task's step (at
        once past `CORK_MAX_BYTES`)."""
        first = not self._corked
        for chunk in chunks:
            self._corked.append(chunk)
            self._corked_bytes += len(chunk)
        if self._corked_bytes >= CORK_MAX_BYTES:
            self.flush()
        elif first and not self._stepping:
            self.loop.call_soon(self.flush)

    def steps(self, coro: Coroutine[Any, Any, T]) -> FlushedSteps[T]:
        """`coro` to run as a task whose frames are written as each of its steps ends (see `FlushedSteps`)."""
        return FlushedSteps(coro, self)

    def data_received(self, data: bytes) -> None:
        """A read holding exactly one whole masked text or binary frame, on an open connection whose parser
        waits between frames, goes to the app at once; any other read through `websockets`' parser as before.

        The usual read on a connection: one `response.create` frame. `websockets` feeds it to a buffer and
        a generator-based parser (frame header, length, mask, payload read by nested generators, a `Frame`
        built and checked), ~20,000 instructions more than unmasking it here. Fragments, control frames,
        several frames or part of one in a read, an oversized frame, negotiated extensions, debug logging:
        all left to the parser, which is then the only one that reads them.
        """
        payload = self._whole_frame(data)
        if payload is None:
            super().data_received(data)
            return
        if data[0] == 0x81 and self._offered(payload):
            return
        self.curr_msg_data_type, self.frames = _DATA_KINDS[data[0]], [payload]
        self.send_receive_event_to_app()  # decodes text (1007 when not UTF-8), as uvicorn's handle_text does

    def _offered(self, payload: bytes) -> bool:
        """Whether the app took a text frame as it was read (`on_text`, see `ws.FORCE_CLOSE_EXTENSION`): only with
        no message waiting for it in the queue (frames stay in order), and valid UTF-8 (else the queue's path
        closes with 1007)."""
        on_text = self._extension.get("on_text")
        if on_text is None or not self.queue.empty():
            return False
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            return False
        return bool(on_text(text))

    def _whole_frame(self, data: bytes) -> bytes | None:
        """The unmasked payload when `data` is exactly one whole final text or binary frame the parser would
        take as it is, else None."""
        conn = self.conn
        if (
            len(data) < 6
            or data[0] not in _DATA_KINDS
            or data[1] < 0x80  # unmasked: the parser's protocol error
            or conn.state is not _OPEN
            or conn.cur_size is not None
            or conn.reader.buffer
            or conn.extensions
            or conn.debug
        ):
            return None
        waiting: Any = conn.parser  # the server's parser delegates to the frame parser, which waits in `at_eof`
        while waiting.gi_yieldfrom is not None:
            waiting = waiting.gi_yieldfrom
        if waiting.gi_code is not _AT_A_FRAME_BOUNDARY:  # mid-frame (its payload not yet read), or closing
            return None
        length, start = data[1] & 0x7F, 2
        if length == 126:
            length, start = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            return None
        if len(data) != start + 4 + length or (conn.max_size is not None and length > conn.max_size):
            return None
        return apply_mask(data[start + 4 :], data[start : start + 4])

    def send_receive_event_to_app(self) -> None:
        """Pause reading only once a message is already waiting for the app, not on every frame.

        uvicorn pauses the socket after each message and resumes it when the app takes it: two
        `epoll_ctl` calls per turn for a client that sends one frame and waits. One message may
        wait unread; the next pauses reading as before, so a client pipelining frames the app does
        not take (its own request bound is full) is still not read from.
        """
        if self.read_paused or not self.queue.empty():
            super().send_receive_event_to_app()
            return
        self.read_paused = True  # uvicorn pauses only when this is False
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = False

    def flush(self) -> None:
        """Write the frames held since the last write, in one call (before anything else is written)."""
        if not self._corked:
            return
        data = b"".join(self._corked)
        self._corked.clear()
        self._corked_bytes = 0
        if not self.transport.is_closing():
            self.transport.write(data)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            self._extension = scope["extensions"][FORCE_CLOSE_EXTENSION] = {
                "close": self.force_close,
                "writable": self.writable.is_set,
                "send_texts": self.send_texts_now,
                "steps": self.steps,
                "asgi_send": self.send,
            }

    def connection_lost(self, exc: Exception | None) -> None:
        """Also unhook the force-close extension from this protocol once the socket is gone.

        The scope's extension points back at the protocol, so a closed connection's objects (protocol,
        transport, queues, buffers) formed a reference cycle that waited for a full collection,
        which the raised GC thresholds make rare: after a burst of clients they stayed, and pinned
        allocator memory. Without the cycle, reference counting frees them as the app finishes.
        """
        super().connection_lost(exc)
        extension = getattr(self, "scope", {}).get("extensions", {}).get(FORCE_CLOSE_EXTENSION)
        if extension is not None:
            extension.clear()
            extension.update(GONE_EXTENSION)

    def force_close(self, code: int, reason: str) -> None:
        """Close without waiting for the peer to read, which it may never do (a slow or stuck client).

        The close frame is queued behind what is already buffered, for a peer that catches up;
        the socket is aborted after a grace period if the buffer never drains.
        """
        if self.transport.is_closing():
            return
        self.flush()
        with contextlib.suppress(Exception):
            self.conn.send_close(code, reason)
            self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()
        self.loop.call_later(FORCE_CLOSE_GRACE_S, self.transport.abort)

    def shutdown(self) -> None:
        """Server shutdown. Under `ShimServer` the app has drained and closed with 1001 already; under
        `--workers` (uvicorn's own server in each worker) this is the first the app hears of it: start
        the same drain instead of uvicorn's immediate 1012, which would cut responses in flight."""
        app = self.scope.get("app") if self.handshake_complete and not self.close_sent else None
        shim = getattr(getattr(app, "state", None), "shim", None)
        if shim is None:
            super().shutdown()
            return
        self.stop_keepalive()
        shim.drain_soon()

    def handle_parser_exception(self) -> None:
        sent = self.conn.close_sent
        self.flush()
        if sent is not None and sent.code == CLOSE_MESSAGE_TOO_BIG:
            limit = getattr(self.config, "max_frame_bytes", self.config.ws_max_size)
            event = too_large_error(limit).event()
            self.transport.write(Frame(Opcode.TEXT, orjson.dumps(event)).serialize(mask=False, extensions=[]))
        super().handle_parser_exception()


class FlushedSteps(Coroutine[Any, Any, T]):
    """A task's coroutine whose frames on `protocol` leave as each of its steps ends, written by the task itself.

    A corked frame is otherwise written by a callback on the loop's next iteration, an iteration of its own
    (~16,000 instructions: the loop's bookkeeping, a poll of the selector, the callback) when the sender has
    nothing left to do: a connection's lane runs a whole turn whose events are all ready (the simulator's, a
    response refused at once) in one step, and writes them as that step ends. A step that waits (for a backend's
    next delta) writes what it made before waiting, as the callback would have done; nothing is held longer.
    Every step ends in a flush, whether the coroutine waits, returns or raises. Only a task may run it: awaiting
    it runs `coro` without the flushes.
    """

    __slots__ = ("_coro", "_protocol")

    def __init__(self, coro: Coroutine[Any, Any, T], protocol: ShimWebSocketProtocol) -> None:
        self._coro = coro
        self._protocol = protocol

    def send(self, value: Any) -> Any:
        protocol = self._protocol
        protocol._stepping = True
        try:
            return self._coro.send(value)
        finally:
            protocol._stepping = False
            protocol.flush()

    def throw(self, *exc: Any) -> Any:
        protocol = self._protocol
        protocol._stepping = True
        try:
            return self._coro.throw(*exc)
        finally:
            protocol._stepping = False
            protocol.flush()

    def close(self) -> None:
        self._coro.close()

    @property
    def __name__(self) -> str:
        """The coroutine's name, for the task's `repr`."""
        return str(getattr(self._coro, "__qualname__", type(self._coro).__name__))

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()


def text_frame_header(size: int) -> bytes:
    """The header of a final, unmasked text frame of `size` payload bytes (RFC 6455 section 5.2)."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65536:
        return _HEADER_16.pack(0x81, 126, size)
    return _HEADER_64.pack(0x81, 127, size)


_HEADERS_MADE = 2048
_HEADERS = [text_frame_header(size) for size in range(_HEADERS_MADE)]
"""The header of each text frame of fewer than `_HEADERS_MADE` bytes, made once (~115 KB): a list index where
packing one costs ~800 instructions, for each event (a 1-token turn's are 170 to 1,200 bytes)."""
