"""A turn's events as the HTTP answer the SDK expects: the final `Response` JSON, or SSE bytes for a stream.

The SDK parses these with its own code (its SSE parser gives callers its typed events), so a
turn over the socket reads exactly as over HTTP; an `error` event becomes its status with an
`{"error": ...}` body, so the SDK raises the exception class it raises over HTTP, and a socket
lost mid-stream reads as a dropped HTTP stream.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import httpx2
import orjson

from . import _http
from .errors import ConnectionLost, TurnRejected, UpgradeRejected, error_body, error_response, error_status
from .portal import PortalStream, never_ready
from .session import Session
from .turn import TurnRequest

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_SSE_HEADERS = {module: module.Headers(SSE_HEADERS) for module in _http.MODULES}
"""`SSE_HEADERS` made once per library: a response copies a `Headers` as it is, where it checks and encodes each
header of a dict (a streamed turn's response cost ~9k instructions, half of it that)."""


async def websocket_reply(session: Session, request: httpx2.Request, turn: TurnRequest) -> httpx2.Response:
    """Run the turn on the session and answer as the HTTP endpoint would; raises `UseHTTP` to fall back."""
    if not turn.stream:
        return await _reply(request, lambda: _final(session, request, turn))
    events = session.events(turn, read_timeout=read_timeout(request))
    try:
        return await _reply(request, lambda: _stream(events, request, turn))
    except BaseException:
        await events.aclose()  # whatever interrupted the reply, the lane is freed now, not at collection
        raise


async def _final(session: Session, request: httpx2.Request, turn: TurnRequest) -> httpx2.Response:
    return _final_reply(await session.outcome(turn, read_timeout=read_timeout(request)), request, turn)


async def _stream(
    events: AsyncGenerator[dict[str, Any], None], request: httpx2.Request, turn: TurnRequest
) -> httpx2.Response:
    first = await anext(events)
    return sse_response(SSEStream(first, events, request, _framer(turn), turn.ready), request)


def sse_response(stream: Any, request: httpx2.Request) -> httpx2.Response:
    """The HTTP answer carrying a streamed turn's events (`stream`: SSE bytes), of `request`'s library."""
    http = _http.module_of(request)
    return http.Response(200, headers=_SSE_HEADERS[http], stream=stream, request=request)


async def _reply(request: httpx2.Request, answer: Callable[[], Awaitable[httpx2.Response]]) -> httpx2.Response:
    """`answer()`, with the session's failures before the answer as HTTP would give them."""
    try:
        return await answer()
    except TurnRejected as rejected:
        return error_response(rejected.status, rejected.error, request)
    except UpgradeRejected as rejected:
        http = _http.module_of(request)
        return http.Response(rejected.status, headers=rejected.headers, content=rejected.body, request=request)
    except ConnectionLost as lost:
        raise _http.module_of(request).RemoteProtocolError(str(lost), request=request) from lost
    except TimeoutError as exc:
        raise _timeout(request) from exc


def _final_reply(kept: list[dict[str, Any]], request: httpx2.Request, turn: TurnRequest) -> httpx2.Response:
    errors = [e for e in kept if e.get("type") == "error"]
    if errors:
        return error_response(error_status(errors[-1]), error_body(errors[-1]), request)
    final = kept[-1]["response"]
    content = turn.chat.final(final, turn.recorded) if turn.chat is not None else orjson.dumps(final)
    json_headers = {"content-type": "application/json"}
    return _http.module_of(request).Response(200, headers=json_headers, content=content, request=request)


def _framer(turn: TurnRequest) -> Callable[[dict[str, Any]], bytes]:
    """How the turn's events become SSE bytes: as `/responses` streams them, or as chat chunks."""
    chat = turn.chat
    if chat is None:
        return sse_frame
    return lambda event: chat.sse(event, turn.recorded)  # the chain is recorded by the terminal event


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event as the HTTP stream carries it (`sse_event`), framed as SSE."""
    return sse_bytes(sse_event(event))


def sse_event(event: dict[str, Any]) -> dict[str, Any]:
    """One event as the HTTP stream's `data` carries it: no lane id, and the flat error shape."""
    event.pop("stream_id", None)
    return sse_error(event) if event.get("type") == "error" else event


def sse_bytes(event: dict[str, Any]) -> bytes:
    """An event as the HTTP stream carries it (`sse_event`'s), framed as SSE."""
    return b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def event_chunk(event: dict[str, Any]) -> list[dict[str, Any]]:
    """An event as the direct path's `SSEStream` hands it on: the HTTP stream's JSON (`sse_event`), unencoded, in
    a list that the sync client's `PortalStream` extends with the events it reads ahead."""
    return [sse_event(event)]


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


def _timeout(request: httpx2.Request) -> Exception:
    return _http.module_of(request).ReadTimeout("timed out waiting for the next WebSocket event", request=request)


Chunk = TypeVar("Chunk")


class SSEStream(*_http.bases("AsyncByteStream"), Generic[Chunk]):  # type: ignore[misc]
    """Events re-framed as SSE (or as `event_chunk`s, for the direct path); a socket lost mid-stream reads as a
    dropped HTTP stream would."""

    def __init__(
        self,
        first: dict[str, Any],
        events: AsyncGenerator[dict[str, Any], None],
        request: httpx2.Request,
        frame: Callable[[dict[str, Any]], Chunk],
        ready: Callable[[], bool] = never_ready,
    ) -> None:
        self.first = first
        self.events = events
        self.request = request
        self.frame = frame
        self.ready = ready
        """Whether the next step of the events would not wait (`TurnRequest.ready`)."""

    async def __aiter__(self) -> AsyncGenerator[Chunk, None]:
        yield self.frame(self.first)
        try:
            async for event in self.events:
                yield self.frame(event)
        except ConnectionLost as lost:
            raise _http.module_of(self.request).RemoteProtocolError(str(lost), request=self.request) from lost
        except TimeoutError as exc:
            raise _timeout(self.request) from exc
        finally:
            await self.events.aclose()

    async def aclose(self) -> None:
        await self.events.aclose()


class EventBody(*_http.bases("SyncByteStream")):  # type: ignore[misc]
    """A sync direct stream's body: its events read on the session's loop in lists (`PortalStream` over an
    `SSEStream` of `event_chunk`s), which the SDK's `Stream` reads as they are (`events`, through
    `_sdk.event_stream`) and httpx, if the body is read, as the SSE bytes they stand for."""

    def __init__(self, chunks: PortalStream) -> None:
        self.chunks = chunks
        self.batches: Iterable[list[dict[str, Any]]] = chunks  # type: ignore[assignment]
        """`chunks`, whose type says bytes: `PortalStream` hands on any chunks that `+=` joins."""

    def __iter__(self) -> Iterator[bytes]:
        for batch in self.batches:
            yield b"".join(map(sse_bytes, batch))

    def events(self) -> Iterator[dict[str, Any]]:
        return itertools.chain.from_iterable(self.batches)  # no generator of ours resumed per event

    def close(self) -> None:
        self.chunks.close()


class AsyncEventBody(*_http.bases("AsyncByteStream")):  # type: ignore[misc]
    """An async direct stream's body: its events (an `SSEStream` of `event_chunk`s), which the SDK's `AsyncStream`
    reads as they are (`events`, through `_sdk.event_stream`) and httpx, if the body is read, as SSE bytes."""

    def __init__(self, chunks: SSEStream[list[dict[str, Any]]]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        async for batch in self.chunks:
            yield b"".join(map(sse_bytes, batch))

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        async for batch in self.chunks:
            for event in batch:
                yield event

    async def aclose(self) -> None:
        await self.chunks.aclose()


def read_timeout(request: httpx2.Request) -> float | None:
    timeout = request.extensions.get("timeout")
    return timeout.get("read") if isinstance(timeout, dict) else None
