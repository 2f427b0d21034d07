"""The direct path: a wrapped client's `responses.create`, without the SDK's HTTP machinery.

Through the SDK a wrapped turn pays for a request pipeline that has nothing left to do once the
turn is prepared: request options copied, headers and an httpx request built, the retry loop, an
httpx response made of the terminal event and parsed back. That was most of a wrapped turn's
client CPU (`python -m benchmarks client`). The direct path sends the prepared turn on the session
and makes the SDK's own `Response` of the terminal event with the SDK's own parser, as it parses
the same JSON from an HTTP body (`_sdk.parse_response`): the caller gets the same object. A
streamed turn gets the SDK's own `Stream` (`_sdk.event_stream`) over the answer the transport gives
the SDK, so the SDK's code makes and raises what it does over that answer; its `response` is that
answer, to a bare `POST` of the endpoint (no headers: the SDK built none; one request object for the
client's streams while its binding holds). The `Stream` reads each
event's JSON as the session parsed it (`replies.EventBody`), not encoded to SSE and decoded again
(which cost a 1-token turn ~1.05M instructions, more than the rest of its events' reading).

It is taken only when the SDK's pipeline could not change the outcome (and `SessionOptions.direct`
is on: httpx event hooks and HTTP instrumentation do not see the turns it takes):
- the client has sent a turn of its own through the SDK on this session, which taught the
  session its upgrade headers, and its `default_headers` (credentials, organization, project,
  custom headers) are still the ones it had then;
- the call is a `/responses` call (not a chat one) and passes no `extra_headers`, `extra_query` or
  `timeout` (the SDK's raw and streaming response wrappers pass `extra_headers`);
- the client authenticates with a plain API key (`_sdk.request_key`);
- the client does not validate responses strictly (`_strict_response_validation`: the SDK's
  pipeline raises its `APIResponseValidationError`, which needs the HTTP response).
A turn that does not end in a response (an error event, a lost socket, a timeout, a fall back to
HTTP, a closed client), or a stream that does not get its first event, goes again through the SDK's own
path, which raises or retries exactly as it does over HTTP; an error costs that one more round trip.
Once a stream has its first event, what comes after reads as it reads through the SDK's path.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response

from . import _http, _sdk
from .errors import ConnectionLost, SessionClosed, TurnRejected, UpgradeRejected, UseHTTP
from .headers import Credentials, Headers, credentials_of
from .policy import SessionState
from .portal import Portal, PortalStream
from .replies import AsyncEventBody, EventBody, SSEStream, event_chunk, sse_response
from .session import Session
from .turn import TurnRequest

GIVE_UP = (TurnRejected, UpgradeRejected, ConnectionLost, TimeoutError, UseHTTP, SessionClosed)
"""What sends the turn again through the SDK's path, to be raised, retried or sent over HTTP as there."""


@dataclass(frozen=True)
class Binding:
    """What a client's turn through the SDK taught: its upgrade headers, valid while `key` holds."""

    key: tuple[Any, ...]
    request: Any
    """What a stream's response answers: a bare `POST` of the `/responses` URL the SDK posts to (of the client's
    httpx library), one for every stream of the binding: building an httpx request cost a streamed turn ~70k
    instructions, a tenth of a floor turn."""
    headers: Headers
    credentials: tuple[Headers, Credentials]
    """The headers with what `credentials_of` makes of them, worked out once for every turn they serve."""


class DirectPath:
    """One wrapped client's direct path (copies made with `with_options` get their own)."""

    def __init__(self, client: Any, session: Session) -> None:
        self.client = client
        self.session = session
        self.binding: Binding | None = None
        self._seen: tuple[type, dict[str, Any], dict[str, Any]] | None = None
        self._key: tuple[Any, ...] | None = None

    def key(self) -> tuple[Any, ...] | None:
        """What the client's headers are built from now; None: the direct path is not for this client.

        Worked out again only when the client's attributes changed since the last call (`_sdk.client_state`):
        the SDK builds its default headers afresh on every request, which cost more than a whole floor turn.
        """
        kind, attributes, headers = _sdk.client_state(self.client)
        seen = self._seen
        if seen is None or kind is not seen[0] or not _same(attributes, seen[1]) or not _same(headers, seen[2]):
            self._seen, self._key = (kind, dict(attributes), dict(headers)), _sdk.request_key(self.client)
        return self._key

    def learn(self, key: tuple[Any, ...] | None, turn: TurnRequest) -> None:
        """After a turn through the SDK: its upgrade headers serve later turns while `key` holds."""
        if key is not None and turn.on_socket:
            headers = list(turn.headers)
            url = _sdk.endpoint_url(self.client, "/responses")
            request = _http.module_of(url).Request("POST", url)
            self.binding = Binding(key, request, headers, (headers, credentials_of(headers)))

    def takes(self, kwargs: dict[str, Any], turn: TurnRequest) -> bool:
        """Whether this call may skip the SDK's pipeline (then `turn.headers` are set for it)."""
        binding = self.binding
        if (
            binding is None
            or not self.session.options.direct
            or turn.chat is not None
            or self.session.state is not SessionState.WEBSOCKET
            or _sdk.validates_strictly(self.client)
        ):
            return False
        if kwargs.get("extra_headers") or kwargs.get("extra_query") or _sdk.passed(kwargs, "timeout"):
            return False
        if self.key() != binding.key:
            self.binding = None
            return False
        turn.headers, turn.credentials = binding.headers, binding.credentials
        return True

    def sync_create(self, turn: TurnRequest) -> Response | None:
        """The sync client's turn on the session's loop thread; None: send it through the SDK."""
        try:
            final = _sdk.transport_of(self.client).portal.call(self._final(turn))
        except SessionClosed:  # the loop thread is gone with the client
            return None
        return None if final is None else _sdk.parse_response(self.client, final)

    async def async_create(self, turn: TurnRequest) -> Response | None:
        """The async client's turn; None: send it through the SDK."""
        final = await self._final(turn)
        return None if final is None else _sdk.parse_response(self.client, final)

    def sync_stream(self, turn: TurnRequest) -> Any:
        """The sync client's streamed turn, its events read on the session's loop as the caller iterates
        (the SDK's `Stream`); None: send it through the SDK."""
        portal = _sdk.transport_of(self.client).portal
        request = self._request()
        try:
            stream = portal.call(_opened(self._events(turn), request, portal, turn))
        except SessionClosed:
            return None
        if stream is None:
            return None
        body = EventBody(stream)  # lists, which join as bytes do
        return _sdk.event_stream(self.client, sse_response(body, request), body.events, self._adopter(turn))

    async def async_stream(self, turn: TurnRequest) -> Any:
        """The async client's streamed turn (the SDK's `AsyncStream`); None: send it through the SDK."""
        events = self._events(turn)
        first = await _first(events)
        if first is None:
            return None
        request = self._request()
        body = AsyncEventBody(SSEStream(first, events, request, event_chunk))
        return _sdk.event_stream(self.client, sse_response(body, request), body.events, self._adopter(turn))

    def _adopter(self, turn: TurnRequest) -> Callable[[Response], None]:
        """What a stream does with its terminal `Response`: lend its output objects to the chain, as a call's
        `Response` does (`Session.adopt`), so the caller's history made of them matches by identity next turn
        instead of each item dumped and compared as JSON."""
        return functools.partial(self.session.adopt, turn)

    def _events(self, turn: TurnRequest) -> AsyncGenerator[dict[str, Any], None]:
        return self.session.events(turn, read_timeout=read_timeout(self.client.timeout))

    def _request(self) -> Any:
        """The request a stream's response answers (`Binding.request`)."""
        assert self.binding is not None
        return self.binding.request

    async def _final(self, turn: TurnRequest) -> dict[str, Any] | None:
        """The terminal event's response JSON, or None when the turn did not end in one."""
        try:
            kept = await self.session.outcome(turn, read_timeout=read_timeout(self.client.timeout))
        except GIVE_UP:
            return None
        if not kept or kept[-1].get("type") == "error":  # an error event comes last, when one comes
            return None
        response: dict[str, Any] = kept[-1]["response"]
        return response


async def _first(events: AsyncGenerator[dict[str, Any], None]) -> dict[str, Any] | None:
    """A stream's first event, or None when the turn goes again through the SDK's path (the generator has
    ended then: it raised)."""
    try:
        return await anext(events)
    except GIVE_UP:
        return None


async def _opened(
    events: AsyncGenerator[dict[str, Any], None], request: Any, portal: Portal, turn: TurnRequest
) -> PortalStream | None:
    """A sync stream's events in lists (`event_chunk`), opened on the loop: its first event and those already
    behind it read in this one portal call (`PortalStream.read_ahead`); None as for `_first`."""
    first = await _first(events)
    if first is None:
        return None
    chunks = SSEStream(first, events, request, event_chunk)
    stream = PortalStream(chunks, portal, turn.ready)  # type: ignore[arg-type]  # lists for bytes; no `cast` call
    await stream.read_ahead()
    return stream


def _same(now: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    """`now == before` (values compared by identity, then `==`); False where a value's `==` raises
    (then the key is worked out again)."""
    try:
        return now == before
    except Exception:
        return False


def read_timeout(timeout: Any) -> float | None:
    """The read timeout of a client's `timeout` (seconds, an httpx `Timeout` or None), as its requests get it."""
    return timeout.read if hasattr(timeout, "read") else timeout
