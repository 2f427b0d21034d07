"""`wrap(client)`: WebSocket mode for an existing `openai` client, chained before the SDK serializes.

Two layers, installed in place on the client:
- its HTTP transport is replaced by one that sends `POST /responses` over the session and
  everything else over the original transport (the universal path: `with_raw_response`,
  `with_streaming_response`, `responses.parse`, copies of the client);
- its `responses.create` (which `responses.stream` calls) is replaced by one that splits the
  input against the session's chains while the items are still the caller's objects, so the
  history is neither serialized by the SDK nor parsed again: only the new items are encoded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
from openai import AsyncOpenAI, AsyncStream, OpenAI, Stream
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from . import _sdk
from .chat_wrap import prepare_chat
from .direct import DirectPath
from .httpx_transport import AsyncWebSocketTransport, WebSocketTransport
from .options import SessionOptions
from .portal import Portal
from .session import Session
from .turn import TICKET_HEADER, TurnRequest

ClientT = TypeVar("ClientT", OpenAI, AsyncOpenAI)

REQUEST_ONLY = frozenset({"input", "stream", "extra_headers", "extra_query", "extra_body", "timeout"})
"""Arguments of `responses.create` that are not request fields compared for chaining."""

_tickets = itertools.count(1)


def wrap(client: ClientT, options: SessionOptions | None = None, **option_fields: Any) -> ClientT:
    """Route `client.responses.create/stream` (and `chat.completions.create`, unless `chat_completions=False`)
    over one persistent WebSocket session; returns `client`.

    The client is changed in place (its HTTP transport and its `responses.create`) so that code
    already holding it, and copies made with `with_options`, share the session. Closing the
    client closes the sockets. Options: a `SessionOptions`, or its fields as keywords
    (`direct=False` keeps every turn in the SDK's HTTP pipeline, for httpx hooks and instrumentation).
    """
    if isinstance(_sdk.transport_of(client), (WebSocketTransport, AsyncWebSocketTransport)):
        return client
    if options is not None and option_fields:
        raise TypeError("pass either a SessionOptions or its fields as keywords, not both")
    options = options or SessionOptions(**option_fields)
    if client.websocket_base_url is not None and options.websocket_url is None:
        options = dataclasses.replace(options, websocket_url=_responses_url(client.websocket_base_url))
    session = Session(options)
    _sdk.replace_transports(client, _transport_factory(client, session))
    _install(client, session)
    return client


def session_of(client: OpenAI | AsyncOpenAI) -> Session:
    """The session behind a wrapped client (or one built on a WebSocket transport): stats, chains."""
    transport = _sdk.transport_of(client)
    if not isinstance(transport, (WebSocketTransport, AsyncWebSocketTransport)):
        raise ValueError("this client is not wrapped by ws_transport")
    return transport.session


def _transport_factory(client: OpenAI | AsyncOpenAI, session: Session) -> Callable[[Any], Any]:
    if isinstance(client, AsyncOpenAI):
        return lambda inner: AsyncWebSocketTransport(inner, session=session)
    portal = Portal()
    return lambda inner: WebSocketTransport(inner, session=session, portal=portal)


@dataclass(frozen=True)
class _Endpoint:
    """A resource method that rides the session: how a call becomes a turn, and how the SDK parses the answer."""

    prepare: Callable[[Session, dict[str, Any]], TurnRequest | None]
    path: str
    cast_to: type
    stream_cls: Any
    async_stream_cls: Any

    def post_args(self, turn: TurnRequest, *, sync: bool) -> dict[str, Any]:
        """Where the SDK posts the prepared turn and how it parses the answer (a stream when asked)."""
        stream_cls = self.stream_cls if sync else self.async_stream_cls
        return {"path": self.path, "cast_to": self.cast_to, "stream": turn.stream, "stream_cls": stream_cls}


RESPONSES = _Endpoint(
    lambda session, kwargs: prepare(session, kwargs),
    "/responses",
    Response,
    Stream[ResponseStreamEvent],
    AsyncStream[ResponseStreamEvent],
)
CHAT = _Endpoint(
    prepare_chat, "/chat/completions", ChatCompletion, Stream[ChatCompletionChunk], AsyncStream[ChatCompletionChunk]
)


def _install(client: OpenAI | AsyncOpenAI, session: Session) -> None:
    """Wrap `responses.create` (and `chat.completions.create` when asked) here and on every copy
    that shares this client's HTTP client."""
    _sdk.parse_faster(client)
    make = _async_create if isinstance(client, AsyncOpenAI) else _sync_create
    client.responses.create = make(client, client.responses, session, RESPONSES)  # type: ignore[method-assign]
    if session.options.chat_completions:
        completions = client.chat.completions
        completions.create = make(client, completions, session, CHAT)  # type: ignore[method-assign]
    original_copy = client.copy

    @functools.wraps(original_copy)
    def copy(**kwargs: Any) -> Any:
        new = original_copy(**kwargs)
        if _sdk.http_client(new) is _sdk.http_client(client):
            _install(new, session)
        return new

    client.copy = client.with_options = copy  # type: ignore[method-assign]


def _sync_create(client: Any, resource: Any, session: Session, endpoint: _Endpoint) -> Callable[..., Any]:
    original = resource.create
    direct = DirectPath(client, session)

    @functools.wraps(original)
    def create(**kwargs: Any) -> Any:
        turn = endpoint.prepare(session, kwargs)
        if turn is None:
            return original(**kwargs)
        if direct.takes(kwargs, turn):
            result = direct.sync_stream(turn) if turn.stream else direct.sync_create(turn)
            if result is not None:
                return _adopted(session, turn, result)
        key = direct.key()
        with _ticket(session, turn, kwargs) as options:
            result = _sdk.post(resource, options, **endpoint.post_args(turn, sync=True))
        direct.learn(key, turn)
        return _adopted(session, turn, result)

    return create


def _async_create(client: Any, resource: Any, session: Session, endpoint: _Endpoint) -> Callable[..., Any]:
    original = resource.create
    direct = DirectPath(client, session)

    @functools.wraps(original)
    async def create(**kwargs: Any) -> Any:
        turn = endpoint.prepare(session, kwargs)
        if turn is None:
            return await original(**kwargs)
        if direct.takes(kwargs, turn):
            result = await (direct.async_stream(turn) if turn.stream else direct.async_create(turn))
            if result is not None:
                return _adopted(session, turn, result)
        key = direct.key()
        with _ticket(session, turn, kwargs) as options:
            result = await _sdk.post(resource, options, **endpoint.post_args(turn, sync=False))
        direct.learn(key, turn)
        return _adopted(session, turn, result)

    return create


def prepare(session: Session, kwargs: dict[str, Any]) -> TurnRequest | None:
    """Split `responses.create(**kwargs)` against the session's chains; None leaves the call to the SDK."""
    given = _sdk.given(kwargs)
    extra_body = given.get("extra_body") or {}
    if session.http_only or given.get("background") or not isinstance(extra_body, dict) or "input" in extra_body:
        return None
    params = {k: v for k, v in given.items() if k not in REQUEST_ONLY}
    if extra_body:
        params["extra_body"] = extra_body
    raw_input = given.get("input")
    plan = session.chains.plan(params, raw_input)
    fields = plan.chain.fields if plan.chain is not None else None
    if fields is None:
        body = {k: v for k, v in params.items() if k != "extra_body"}
        fields = {**_sdk.create_fields(body), **extra_body}
    return TurnRequest(fields, plan, raw_input, stream=given.get("stream") is True)


@contextlib.contextmanager
def _ticket(session: Session, turn: TurnRequest, kwargs: dict[str, Any]) -> Iterator[Any]:
    """Hand the prepared turn to the transport for the duration of the SDK call (retries included);
    yields the call's request options, which carry the ticket."""
    ticket = str(next(_tickets))
    session.tickets[ticket] = turn
    try:
        yield _sdk.request_options(kwargs, {TICKET_HEADER: ticket})
    finally:
        del session.tickets[ticket]


def _adopted(session: Session, turn: TurnRequest, result: Any) -> Any:
    """The call's result; a complete `Response` lends its output objects to the chain (identity matches next turn)."""
    if isinstance(result, Response):
        session.adopt(turn, result)
    return result


def _responses_url(base: str | httpx2.URL) -> str:
    url = httpx2.URL(str(base))
    path, separator, query = url.raw_path.partition(b"?")
    return str(url.copy_with(raw_path=path.rstrip(b"/") + b"/responses" + separator + query))
