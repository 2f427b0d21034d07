"""The injection point: `POST .../responses` goes to the session, every other request to the original transport.

This is the universal path. It serves any client that has it as transport (`with_raw_response`,
`with_streaming_response`, `responses.parse`, copies, clients built elsewhere): it parses the
serialized body to find the delta. The wrapped `responses.create` (see `wrap.py`) prepares its
turn before serialization and marks the request with a ticket header, so here it is only sent.

The answer is an ordinary HTTP response built from the turn's events (see `replies.py`); for the
sync client the session runs on a private loop, run by the calling thread (see `portal.py`). A turn the session cannot take
(fallback, a frame over the server's limit, another URL) goes over the original transport.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any, Generic, TypedDict, TypeVar

import httpx2
import orjson
from typing_extensions import Unpack

from . import _http
from .errors import TurnNotPrepared, UseHTTP
from .headers import websocket_url
from .options import SessionOptions
from .portal import Portal, PortalStream
from .replies import SSEStream, websocket_reply
from .session import Session
from .turn import TICKET_HEADER, TurnRequest

InnerT = TypeVar("InnerT", httpx2.BaseTransport, httpx2.AsyncBaseTransport)


class SessionArgs(TypedDict, total=False):
    options: SessionOptions | None
    """Options for a new session (ignored when `session` is given)."""
    session: Session | None
    """A session to share (`wrap()` gives each of a client's transports the same one)."""


class _Router(Generic[InnerT]):
    """What both transports share: which requests are turns, and how a turn goes over HTTP instead."""

    def __init__(
        self, inner: InnerT | None = None, *, options: SessionOptions | None = None, session: Session | None = None
    ) -> None:
        self.inner: InnerT | None = inner
        self.session = session or Session(options)

    def _inner_for(self, request: httpx2.Request) -> InnerT:
        """The transport for everything that is not a turn; when none was given, a plain one of the
        request's own library (httpx2 for openai 3.x clients, httpx for 1.x/2.x), made on first use."""
        if self.inner is None:
            self.inner = self._plain(_http.module_of(request))
        return self.inner

    @staticmethod
    def _plain(http: Any) -> InnerT:
        raise NotImplementedError

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
        return turn, not self.session.http_only

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
        make = type(request)  # httpx2 or httpx, as the client that made it
        return make(request.method, request.url, headers=headers, content=body, extensions=request.extensions)

    def _http_attempts(self, request: httpx2.Request, turn: TurnRequest | None) -> list[httpx2.Request]:
        """The requests to try in turn until one connects: a turn for the session's server goes to the
        replica the session uses now, then to the others (`failover_base_urls`); anything else goes
        only where it was sent. Only a refused connection moves on: nothing reached a server then."""
        sent = self._http_request(request, turn)
        if not self.session.replicas.bases or not self._for_session(request):
            return [sent]
        endpoint = CHAT_PATH if request.url.path.endswith(CHAT_PATH) else "/responses"
        own = str(request.url.copy_with(query=None))
        return [_retarget(sent, url) for url in self.session.replicas.http_order(own, endpoint)]

    def _for_session(self, request: httpx2.Request) -> bool:
        """Whether `request` is a turn for the session's server (not a copy of the client with another base URL)."""
        if request.method != "POST" or not _turn_path(request.url.path, request.headers.get(TICKET_HEADER)):
            return False
        endpoint = _responses_endpoint(request.url) or request.url
        return self.session.url == (self.session.options.websocket_url or websocket_url(endpoint))


CHAT_PATH = "/chat/completions"


def _turn_path(path: str, ticket: str | None) -> bool:
    """`/responses`, and `/chat/completions` when the wrapped `chat.completions.create` prepared the turn."""
    return path.endswith("/responses") or (ticket is not None and path.endswith(CHAT_PATH))


def _responses_endpoint(url: httpx2.URL) -> httpx2.URL | None:
    """For a chat call, the `/responses` URL beside it (the socket's URL); None for a `/responses` call."""
    if not url.path.endswith(CHAT_PATH):
        return None
    return url.copy_with(path=url.path[: -len(CHAT_PATH)] + "/responses")


def _retarget(request: httpx2.Request, url: str) -> httpx2.Request:
    """The same request to another URL (the query kept; `host` and `content-length` computed anew)."""
    if url == str(request.url.copy_with(query=None)):
        return request
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in ("host", "content-length")]
    target = type(request.url)(url).copy_with(query=request.url.query or None)
    make = type(request)
    return make(request.method, target, headers=headers, content=request.read(), extensions=request.extensions)


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


class AsyncWebSocketTransport(_Router[httpx2.AsyncBaseTransport], *_http.bases("AsyncBaseTransport")):  # type: ignore[misc]
    """For `AsyncOpenAI`: `httpx2.AsyncClient(transport=AsyncWebSocketTransport())`, or via `wrap()`.

    `inner` (default: a new `AsyncHTTPTransport` of the client's httpx2 or httpx) carries every request that is not a turn.
    """

    @staticmethod
    def _plain(http: Any) -> httpx2.AsyncBaseTransport:
        return http.AsyncHTTPTransport()  # type: ignore[no-any-return]

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        turn, on_session = self._turn(request)
        if turn is not None and on_session:
            with contextlib.suppress(UseHTTP):
                return await websocket_reply(self.session, request, turn)
        attempts = self._http_attempts(request, turn)
        for attempt in attempts[:-1]:
            try:
                return await self._inner_for(request).handle_async_request(attempt)
            except _http.module_of(request).ConnectError:
                self.session.replicas.failed()
        return await self._inner_for(request).handle_async_request(attempts[-1])

    async def aclose(self) -> None:
        await self.session.aclose()
        if self.inner is not None:
            await self.inner.aclose()


class WebSocketTransport(_Router[httpx2.BaseTransport], *_http.bases("BaseTransport")):  # type: ignore[misc]
    """For `OpenAI`: the session runs on a private loop, run by the calling thread (see `portal.py` for why).

    `inner` (default: a new `HTTPTransport` of the client's httpx2 or httpx) carries every request that is not a turn;
    `portal` is that loop (`wrap()` gives each of a client's transports the same one).
    """

    def __init__(
        self, inner: httpx2.BaseTransport | None = None, *, portal: Portal | None = None, **session: Unpack[SessionArgs]
    ) -> None:
        super().__init__(inner, **session)
        self.portal = portal or Portal()
        self._dropped = weakref.finalize(self, _close_later, self.portal, self.session)
        self._dropped.atexit = False  # at exit the sockets are closed as `close()` closes them (`_close_at_exit`)
        _open.add(self)

    @staticmethod
    def _plain(http: Any) -> httpx2.BaseTransport:
        return http.HTTPTransport()  # type: ignore[no-any-return]

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        turn, on_session = self._turn(request)
        if turn is not None and on_session:
            with contextlib.suppress(UseHTTP):
                return _on_this_thread(self.portal.call(websocket_reply(self.session, request, turn)), self.portal)
        attempts = self._http_attempts(request, turn)
        for attempt in attempts[:-1]:
            try:
                return self._inner_for(request).handle_request(attempt)
            except _http.module_of(request).ConnectError:
                self.session.replicas.failed()
        return self._inner_for(request).handle_request(attempts[-1])

    def close(self) -> None:
        """Close the sockets on their loop, waited for, then stop its keeper thread (unless dropped before)."""
        if self._dropped.detach() is not None:
            _shutdown(self.portal, self.session)
        if self.inner is not None:
            self.inner.close()


def _on_this_thread(response: httpx2.Response, portal: Portal) -> httpx2.Response:
    stream = response.stream
    if not isinstance(stream, SSEStream):
        return response
    return _http.module_of(response).Response(
        response.status_code,
        headers=response.headers,
        stream=PortalStream(stream, portal, stream.ready),
        request=response.request,
    )


_open: weakref.WeakSet[WebSocketTransport] = weakref.WeakSet()
"""The sync transports alive: closed at exit (the keeper is a daemon thread)."""


@atexit.register
def _close_at_exit() -> None:
    for transport in list(_open):
        transport.close()


def _close_later(portal: Portal, session: Session) -> None:
    """A dropped transport's finalizer: its session closed on the loop, without waiting (`Portal.close_later`)."""
    portal.close_later(session.aclose())


def _shutdown(portal: Portal, session: Session) -> None:
    """Close the sockets on their loop, then stop its keeper thread."""
    try:
        if portal.running:
            portal.call(session.aclose(), timeout=10)
    finally:
        portal.stop()
