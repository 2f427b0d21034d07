"""A turn's events as the HTTP answer the SDK expects: the final `Response` JSON, or SSE bytes for a stream.

The SDK parses these with its own code (its SSE parser gives callers its typed events), so a
turn over the socket reads exactly as over HTTP; an `error` event becomes its status with an
`{"error": ...}` body, so the SDK raises the exception class it raises over HTTP, and a socket
lost mid-stream reads as a dropped HTTP stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import httpx2
import orjson

from . import _http
from .errors import ConnectionLost, TurnRejected, UpgradeRejected, error_body, error_response, error_status
from .portal import never_ready
from .session import Session
from .turn import TurnRequest

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


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
    return _http.module_of(request).Response(200, headers=SSE_HEADERS, stream=stream, request=request)


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


def _timeout(request: httpx2.Request) -> Exception:
    return _http.module_of(request).ReadTimeout("timed out waiting for the next WebSocket event", request=request)


class SSEStream(*_http.bases("AsyncByteStream")):  # type: ignore[misc]
    """Events re-framed as SSE; a socket lost mid-stream reads as a dropped HTTP stream would."""

    def __init__(
        self,
        first: dict[str, Any],
        events: AsyncGenerator[dict[str, Any], None],
        request: httpx2.Request,
        frame: Callable[[dict[str, Any]], bytes] = sse_frame,
        ready: Callable[[], bool] = never_ready,
    ) -> None:
        self.first = first
        self.events = events
        self.request = request
        self.frame = frame
        self.ready = ready
        """Whether the next step of the events would not wait (`TurnRequest.ready`)."""

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
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


def read_timeout(request: httpx2.Request) -> float | None:
    timeout = request.extensions.get("timeout")
    return timeout.get("read") if isinstance(timeout, dict) else None
