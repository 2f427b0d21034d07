"""The injection point: `POST .../responses` goes to the session, every other request to the original transport.

This is the universal path. It serves any client that has it as transport (`with_raw_response`,
`with_streaming_response`, `responses.parse`, copies, clients built elsewhere): it parses the
serialized body to find the delta. The wrapped `responses.create` (see `wrap.py`) prepares its
turn before serialization and marks the request with a ticket header, so here it is only sent.

The answer is an ordinary HTTP response built from the events: SSE bytes for `stream: true`
(fed to the SDK's own SSE parser, so callers get the SDK's typed events), the final `Response`
JSON otherwise, and for an error event its status with an `{"error": ...}` body, so the SDK
raises the same exception class it raises over HTTP.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
import orjson

from .errors import (
    ConnectionLost,
    TurnNotPrepared,
    TurnRejected,
    UpgradeRejected,
    UseHTTP,
    error_body,
    error_response,
    error_status,
)
from .options import SessionOptions
from .portal import Portal
from .session import Session
from .turn import TICKET_HEADER, TurnRequest

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Router:
    """What both transports share: which requests are turns, and how a turn goes over HTTP instead."""

    session: Session

    def _turn(self, request: httpx2.Request) -> tuple[TurnRequest | None, bool]:
        """The turn a request carries (None for other requests), and whether it goes on the session.

        A turn for another URL than the session's (a copy of the client with another `base_url`)
        goes over HTTP, as does everything when the session has fallen back.
        """
        ticket = request.headers.get(TICKET_HEADER)
        if request.method != "POST" or not _turn_path(request.url.path, ticket):
            return None, False
        if ticket is None and self.session.http_only:
            self._count_fallback(len(request.read()), new_turn=True)
            return None, False
        headers = self.session.bind(request, _responses_endpoint(request.url))
        turn = self._ticket(ticket) if ticket is not None else None
        if headers is None:
            return turn, False
        if turn is None:
            turn = parse_turn(self.session, request)
            if turn is None:
                return None, False
        turn.headers = headers
        return turn, True

    def _ticket(self, ticket: str) -> TurnRequest:
        try:
            return self.session.tickets[ticket]
        except KeyError:
            raise TurnNotPrepared(
                f"no prepared turn for {TICKET_HEADER}: {ticket}; was it sent through another client?"
            ) from None

    def _count_fallback(self, nbytes: int, *, new_turn: bool) -> None:
        stats = self.session.stats
        stats.fallbacks += 1
        stats.bytes_sent += nbytes
        if new_turn:
            stats.turns += 1
            stats.bytes_http_equivalent += nbytes

    def _http_request(self, request: httpx2.Request, turn: TurnRequest | None) -> httpx2.Request:
        """The request as plain HTTP sends it: a turn here is one the session could not take."""
        if turn is None:
            return request
        body = turn.http_body()
        self._count_fallback(len(body), new_turn=not turn.counted)
        turn.counted = True
        if TICKET_HEADER not in request.headers:
            return request
        headers = [
            (k, v) for k, v in request.headers.multi_items() if k.lower() not in (TICKET_HEADER, "content-length")
        ]
        return httpx2.Request(request.method, request.url, headers=headers, content=body, extensions=request.extensions)


CHAT_PATH = "/chat/completions"


def _turn_path(path: str, ticket: str | None) -> bool:
    """`/responses`, and `/chat/completions` when the wrapped `chat.completions.create` prepared the turn."""
    return path.endswith("/responses") or (ticket is not None and path.endswith(CHAT_PATH))


def _responses_endpoint(url: httpx2.URL) -> httpx2.URL | None:
    """For a chat call, the `/responses` URL beside it (the socket's URL); None for a `/responses` call."""
    if not url.path.endswith(CHAT_PATH):
        return None
    return url.copy_with(path=url.path[: -len(CHAT_PATH)] + "/responses")


def parse_turn(session: Session, request: httpx2.Request) -> TurnRequest | None:
    """A serialized request split against the session's chains (by equality: identity is gone by now)."""
    content = request.read()
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("background"):
        return None
    raw_input = body.get("input")
    fields = {k: v for k, v in body.items() if k not in ("input", "stream")}
    plan = session.chains.plan(fields, raw_input)
    return TurnRequest(fields, plan, raw_input, stream=body.get("stream") is True, http_body_bytes=content)


async def websocket_reply(session: Session, request: httpx2.Request, turn: TurnRequest) -> httpx2.Response:
    """Run the turn on the session and answer as the HTTP endpoint would; raises `UseHTTP` to fall back."""
    events = session.events(turn, transparent=not turn.stream, read_timeout=_read_timeout(request))
    try:
        return await _reply(turn, events, request)
    except BaseException:
        await events.aclose()  # whatever interrupted the reply, the lane is freed now, not at collection
        raise


async def _reply(
    turn: TurnRequest, events: AsyncGenerator[dict[str, Any], None], request: httpx2.Request
) -> httpx2.Response:
    try:
        if turn.stream:
            first = await anext(events)
            stream = _SSEStream(first, events, request, _framer(turn))
            return httpx2.Response(200, headers=SSE_HEADERS, stream=stream, request=request)
        return _final_reply(await _drain(events), request, turn)
    except TurnRejected as rejected:
        return error_response(rejected.status, rejected.error, request)
    except UpgradeRejected as rejected:
        return httpx2.Response(rejected.status, headers=rejected.headers, content=rejected.body, request=request)
    except ConnectionLost as lost:
        raise httpx2.RemoteProtocolError(str(lost), request=request) from lost
    except TimeoutError as exc:
        raise httpx2.ReadTimeout("timed out waiting for the next WebSocket event", request=request) from exc


async def _drain(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    """The terminal event, and the error event that may follow it."""
    kept = []
    async for event in events:
        if event.get("type") in TERMINAL or event.get("type") == "error":
            kept.append(event)
    return kept


def _final_reply(kept: list[dict[str, Any]], request: httpx2.Request, turn: TurnRequest) -> httpx2.Response:
    errors = [e for e in kept if e.get("type") == "error"]
    if errors:
        return error_response(error_status(errors[-1]), error_body(errors[-1]), request)
    final = kept[-1]["response"]
    content = turn.chat.final(final, turn.recorded) if turn.chat is not None else orjson.dumps(final)
    return httpx2.Response(200, headers={"content-type": "application/json"}, content=content, request=request)


def _framer(turn: TurnRequest) -> Callable[[dict[str, Any]], bytes]:
    """How the turn's events become SSE bytes: as `/responses` streams them, or as chat chunks."""
    chat = turn.chat
    if chat is None:
        return sse_frame
    return lambda event: chat.sse(event, turn.recorded)  # the chain is recorded by the terminal event


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event as the HTTP stream carries it: no lane id, and the flat error shape."""
    event.pop("stream_id", None)
    if event.get("type") == "error":
        event = sse_error(event)
    return b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def sse_error(event: dict[str, Any]) -> dict[str, Any]:
    """The HTTP stream's error event is flat (the SDK's `ResponseErrorEvent`); the WebSocket one nests `error`."""
    error = error_body(event)
    return {
        "type": "error",
        "sequence_number": event.get("sequence_number", 0),
        "code": error.get("code"),
        "message": error.get("message"),
        "param": error.get("param"),
    }


class _SSEStream(httpx2.AsyncByteStream):
    """Events re-framed as SSE; a socket lost mid-stream reads as a dropped HTTP stream would."""

    def __init__(
        self,
        first: dict[str, Any],
        events: AsyncGenerator[dict[str, Any], None],
        request: httpx2.Request,
        frame: Callable[[dict[str, Any]], bytes] = sse_frame,
    ) -> None:
        self.first = first
        self.events = events
        self.request = request
        self.frame = frame

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        yield self.frame(self.first)
        try:
            async for event in self.events:
                yield self.frame(event)
        except ConnectionLost as lost:
            raise httpx2.RemoteProtocolError(str(lost), request=self.request) from lost
        except TimeoutError as exc:
            raise httpx2.ReadTimeout("timed out waiting for the next WebSocket event", request=self.request) from exc
        finally:
            await self.events.aclose()

    async def aclose(self) -> None:
        await self.events.aclose()


class _PortalStream(httpx2.SyncByteStream):
    """An async byte stream on the portal's loop, read from the caller's thread.

    `close()` may come from any thread while the reader waits for a chunk (a "stop" button). The
    chunk generator must never be closed while a step of it runs, so every step and the close
    run as tasks on the loop: the close cancels the running step, waits until it has unwound,
    then closes the generator. A step that starts after the close sees `closed` and does nothing.
    """

    def __init__(self, stream: _SSEStream, portal: Portal) -> None:
        self.stream = stream
        self.portal = portal
        self.chunks: AsyncGenerator[bytes, None] = stream.__aiter__()
        self.closed = False
        self._step: asyncio.Task[bytes | None] | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        """One chunk per hop to the loop; `close()` from another thread interrupts the wait."""
        while True:
            with self._lock:
                if self.closed:
                    raise httpx2.ReadError("the response stream was closed")
                pending = self.portal.submit(self._next())
            try:
                chunk = pending.result()
            except (concurrent.futures.CancelledError, _StreamClosed):
                raise httpx2.ReadError("the response stream was closed") from None
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.portal.cleanup(self._aclose())

    async def _next(self) -> bytes | None:
        """One step of the generator, on the loop; runs only while the stream is open."""
        if self.closed:
            raise _StreamClosed
        self._step = asyncio.current_task()
        try:
            return await anext(self.chunks)
        except StopAsyncIteration:
            return None

    async def _aclose(self) -> None:
        step = self._step
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait([step])
        await self.chunks.aclose()
        await self.stream.aclose()


class _StreamClosed(Exception):
    """A chunk was asked for after the stream was closed."""


class AsyncWebSocketTransport(_Router, httpx2.AsyncBaseTransport):
    """For `AsyncOpenAI`: `httpx2.AsyncClient(transport=AsyncWebSocketTransport())`, or via `wrap()`."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport | None = None,
        *,
        options: SessionOptions | None = None,
        session: Session | None = None,
    ) -> None:
        self.inner = inner if inner is not None else httpx2.AsyncHTTPTransport()
        self.session = session or Session(options)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        turn, on_session = self._turn(request)
        if turn is not None and on_session and not self.session.http_only:
            try:
                return await websocket_reply(self.session, request, turn)
            except UseHTTP:
                pass
        return await self.inner.handle_async_request(self._http_request(request, turn))

    async def aclose(self) -> None:
        await self.session.aclose()
        await self.inner.aclose()


class WebSocketTransport(_Router, httpx2.BaseTransport):
    """For `OpenAI`: the session runs on a private loop thread (see `portal.py` for why)."""

    def __init__(
        self,
        inner: httpx2.BaseTransport | None = None,
        *,
        options: SessionOptions | None = None,
        session: Session | None = None,
        portal: Portal | None = None,
    ) -> None:
        self.inner = inner if inner is not None else httpx2.HTTPTransport()
        self.session = session or Session(options)
        self.portal = portal or Portal()
        self._shutdown = weakref.finalize(self, _shutdown, self.portal, self.session)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        turn, on_session = self._turn(request)
        if turn is not None and on_session and not self.session.http_only:
            try:
                response = self.portal.call(websocket_reply(self.session, request, turn))
            except UseHTTP:
                pass
            else:
                return _on_this_thread(response, self.portal)
        return self.inner.handle_request(self._http_request(request, turn))

    def close(self) -> None:
        self._shutdown()
        self.inner.close()


def _on_this_thread(response: httpx2.Response, portal: Portal) -> httpx2.Response:
    stream = response.stream
    if not isinstance(stream, _SSEStream):
        return response
    return httpx2.Response(
        response.status_code, headers=response.headers, stream=_PortalStream(stream, portal), request=response.request
    )


def _shutdown(portal: Portal, session: Session) -> None:
    """Close the sockets on their loop, then stop the loop thread; runs once (close() or garbage collection)."""
    try:
        if portal.running:
            portal.call(session.aclose(), timeout=10)
    finally:
        portal.stop()


def _read_timeout(request: httpx2.Request) -> float | None:
    timeout = request.extensions.get("timeout")
    return timeout.get("read") if isinstance(timeout, dict) else None
