"""Every use of the `openai` package's private internals, in this one module.

`ws_transport` plugs into a client the SDK built, so it needs a few things the SDK keeps private:
the client's HTTP client and transports, the request options and body transform the resource
methods use, and the WebSocket connector the SDK's own `responses.connect()` uses. When an
`openai` release moves one of them, this is the module to change; CI runs the transport tests
against the oldest supported 1.x, a 2.x and the newest 3.x release to find out (see `.ci/run`).
The 1.x/2.x clients are built on `httpx` instead of `httpx2` (see `_http.py`) and have no
`_WebSocketConnect`: the same connector is defined here. Everything else in `ws_transport`
uses only the SDK's public API.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx2
import pydantic
from openai import APIError, AsyncOpenAI, AsyncStream, OpenAI, Stream
from openai._base_client import make_request_options
from openai._models import add_request_id
from openai._types import NOT_GIVEN, NotGiven

try:
    from openai._types import Omit
except ImportError:  # a release without `omit`
    Omit = None  # type: ignore[assignment,misc]
from openai._utils import is_given, transform
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseIncompleteEvent,
    ResponseInputParam,
    ResponseStreamEvent,
)
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import SecurityError
from websockets.uri import parse_uri

from . import parsing

try:
    from openai.types.websocket_reconnection import is_recoverable_close
except ImportError:  # openai 1.x: the same close codes, RFC 6455 section 7.4.1

    def is_recoverable_close(code: int) -> bool:
        """Whether a socket closed with `code` is worth reopening (going away, abnormal, server error, restart)."""
        return code in (1001, 1005, 1006, 1011, 1012, 1013, 1015)


try:
    from openai.lib._websocket import _WebSocketConnect
except ImportError:  # openai 1.x/2.x: the project's own connector, with the same redirect rule

    class _WebSocketConnect(connect):  # type: ignore[no-redef]
        """`websockets.connect` that follows no redirect to another origin (the credentials stay home)."""

        def process_redirect(self, exc: Exception) -> Exception | str:
            target = super().process_redirect(exc)
            if isinstance(target, str):
                here, there = parse_uri(self.uri), parse_uri(target)
                if (here.secure, here.host, here.port) != (there.secure, there.host, there.port):
                    return SecurityError("Cross-origin WebSocket redirects are not allowed")
            return target


Client = OpenAI | AsyncOpenAI


def http_client(client: Client) -> httpx2.Client | httpx2.AsyncClient:
    """The httpx client a `openai` client sends through (shared by its copies)."""
    return client._client


def transport_of(client: Client) -> Any:
    """The transport the client's HTTP client sends through."""
    return client._client._transport


def replace_transports(client: Client, make: Callable[[Any], Any]) -> None:
    """Put `make(old)` in place of the client's transport and of each mounted one (proxies)."""
    http = client._client
    http._transport = make(http._transport)
    http._mounts = {pattern: None if t is None else make(t) for pattern, t in http._mounts.items()}


def given(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a caller actually passed to a resource method (`NOT_GIVEN` ones dropped)."""
    return {k: v for k, v in kwargs.items() if not isinstance(v, _UNGIVEN)}


_UNGIVEN = tuple(kind for kind in (NotGiven, Omit) if kind is not None and not is_given(kind()))
"""The sentinel types `is_given` refuses in the installed release, for one `isinstance` per argument."""


def passed(kwargs: Mapping[str, Any], name: str) -> bool:
    """Whether the caller passed argument `name` (`NOT_GIVEN` is not passing it; `None` is)."""
    return name in kwargs and is_given(kwargs[name])


def client_state(client: Client) -> tuple[type, dict[str, Any], Mapping[str, Any]]:
    """Everything `request_key` reads from a client, live: its class, its attributes (a new key, base URL,
    organization, copy of a header table...) and its custom header table (the one mutable attribute its
    headers are built from). Compared with copies of an earlier state: equal only while none of it changed."""
    return type(client), vars(client), client._custom_headers


def create_fields(params: Mapping[str, Any]) -> dict[str, Any]:
    """`responses.create` arguments as the JSON request fields the SDK would send."""
    return transform(dict(params), ResponseCreateParamsBase)


def request_options(kwargs: Mapping[str, Any], extra_headers: Mapping[str, str]) -> Any:
    """The per-request options `responses.create(**kwargs)` builds, with `extra_headers` added."""
    options: dict[str, Any] = {
        "extra_headers": {**(kwargs.get("extra_headers") or {}), **extra_headers},
        "extra_query": kwargs.get("extra_query"),
        "timeout": kwargs.get("timeout", NOT_GIVEN),
    }
    if _REQUEST_SECURITY:  # openai 3.x names the auth scheme per request; older clients always send the key
        options["security"] = {"bearer_auth": True}
    return make_request_options(**options)


_REQUEST_SECURITY = "security" in inspect.signature(make_request_options).parameters


def post(resource: Any, options: Any, path: str = "/responses", **kwargs: Any) -> Any:
    """`POST` a prepared turn through the resource's own request path (retries, parsing, streams)."""
    return resource._post(path, body={}, options=options, **kwargs)


def request_key(client: Client) -> tuple[Any, ...] | None:
    """What the SDK builds a request's headers and URL from (key, base URL, default headers); None for a
    client whose requests the SDK changes per call (a subclass such as Azure's, a key provider,
    workload identity, a provider runtime, custom auth): only the SDK's own pipeline may send for it."""
    if type(client) not in (OpenAI, AsyncOpenAI) or not isinstance(client.api_key, str) or client.custom_auth:
        return None
    if any(getattr(client, name, None) is not None for name in _PER_CALL_AUTH):
        return None
    headers = tuple((k, v) for k, v in client.default_headers.items() if isinstance(v, str))  # `Omit`s dropped
    return client.api_key, str(client.base_url), headers


_PER_CALL_AUTH = ("_api_key_provider", "_workload_identity_auth", "_provider_runtime")


def validates_strictly(client: Client) -> bool:
    """Whether the client validates every response (and raises `APIResponseValidationError` on a bad one)."""
    return bool(client._strict_response_validation)


def parse_faster(client: Client) -> None:
    """Make the client parse responses and stream events with `parsing` where that gives the SDK's own
    objects (its parser otherwise, and always for a client with `_strict_response_validation`).

    The SDK's parser validates each stream event against the union of every event type (about 50
    variants tried per event): most of a streamed turn's client CPU. The client's own method is
    replaced on the instance, so `Stream` and the SDK's HTTP pipeline use it too."""
    sdk_parser = client._process_response_data
    parse_event = parsing.union_parser(ResponseStreamEvent)

    def process_response_data(*, data: object, cast_to: Any, response: Any) -> Any:
        if not client._strict_response_validation:
            if cast_to is Response:
                parsed = parsing.parse(Response, data)
            elif cast_to is ResponseStreamEvent:
                parsed = parse_event(data)
            else:
                parsed = None
            if parsed is not None:
                return parsed
        return sdk_parser(data=data, cast_to=cast_to, response=response)

    client._process_response_data = process_response_data  # type: ignore[method-assign]


def parse_response(client: Client, data: dict[str, Any]) -> Response:
    """The `Response` the SDK makes of this JSON when it is an HTTP body with no request id (through the
    client's parser, which `parse_faster` made fast for a wrapped client)."""
    parsed: Response = client._process_response_data(data=data, cast_to=Response, response=None)  # type: ignore[arg-type]
    if _plain_request_id(type(parsed)):
        object.__setattr__(parsed, "_request_id", None)  # what `add_request_id` comes to, without pydantic's slow path
    else:
        add_request_id(parsed, None)
    return parsed


@functools.cache
def _plain_request_id(cls: type[pydantic.BaseModel]) -> bool:
    """Whether `add_request_id(model, None)` only sets an instance attribute on a `cls` model: pydantic 2's own
    `__setattr__` (not overridden) sets an underscored name that is neither a private attribute nor a class
    variable with `object.__setattr__`, after a lookup that costs as much as a floor turn's parsing."""
    return (
        not parsing.PYDANTIC_V1
        and cls.__setattr__ is pydantic.BaseModel.__setattr__  # type: ignore[comparison-overlap]
        and "_request_id" not in cls.__private_attributes__
        and "_request_id" not in cls.__class_vars__
    )


def endpoint_url(client: Client, path: str) -> Any:
    """The URL the SDK posts `path` to (its base URL joined as the SDK joins it), of the client's httpx library."""
    return client._prepare_url(path)


def event_stream(
    client: Client, response: Any, events: Callable[[], Any], final: Callable[[Response], None] = lambda _: None
) -> Any:
    """The SDK's `Stream` (`AsyncStream`) of `responses.create(stream=True)` over an SSE `response`, made as the
    SDK's pipeline makes it of the transport's answer, whose events are those `events()` yields (an iterator
    for a sync client, an async one for an async client) as parsed JSON, read as the SDK reads the JSON of
    each SSE event (`_read_events`) instead of decoded from the body's bytes, which are the same events encoded.
    `final` gets the `Response` of a `response.completed` or `response.incomplete` event as the caller gets it."""
    if isinstance(client, AsyncOpenAI):
        stream = _ASYNC_EVENT_STREAM(cast_to=ResponseStreamEvent, response=response, client=client)
        stream._iterator = _aread_events(stream, final)
    else:
        stream = _EVENT_STREAM(cast_to=ResponseStreamEvent, response=response, client=client)
        stream._iterator = _read_events(stream, final)
    stream._decoder = _ParsedEvents(events)
    return stream


_EVENT_STREAM: Any = Stream[ResponseStreamEvent]
_ASYNC_EVENT_STREAM: Any = AsyncStream[ResponseStreamEvent]
"""Subscripted once: each `Stream[...]` looks up its cached alias by the union's hash (~60 variants hashed)."""


class _ParsedEvents:
    """A stream's SSE decoder (the SDK's `SSEBytesDecoder`) whose events come parsed: the SDK's `Stream` hands it the
    body's bytes, which it leaves unread, and gets from it the JSON of the events the body stands for, read through
    the SDK's own `_iter_events` (which makes its exceptions of the transport's, as each release does)."""

    def __init__(self, events: Callable[[], Any]) -> None:
        self.events = events

    def iter_bytes(self, iterator: Iterator[bytes]) -> Iterator[dict[str, Any]]:
        return self.events()  # type: ignore[no-any-return]

    def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
        return self.events()  # type: ignore[no-any-return]


def _read_events(stream: Any, final: Callable[[Response], None]) -> Iterator[Any]:
    """What the SDK's `Stream.__stream__` makes of the SSE events that carry the stream's events (`_ParsedEvents`),
    each read from its JSON.

    Its loop, for events that are JSON objects named by their `type` (as the HTTP stream names each) and
    none of them `[DONE]`, in a stream made with no request options (the SDK's "legacy" mode): an event whose
    JSON has a truthy `error` raises the SDK's `APIError`, a `thread.*` event is handed to the parser wrapped
    with its name, any other as it is; the response is closed however the loop ends (as openai 2.x and 3.x
    close it; 1.x leaves it open after an error or an unfinished stream, which frees the turn's lane only when
    the stream is closed or collected). Encoding each event to SSE and decoding it again (the SDK's SSE parser
    and `json.loads`, in Python) cost a streamed turn more than its events' validation, and the SDK's loop over
    SSE objects made of the parsed events a tenth of it again. `tests/test_transport_parsing.py` compares the
    two on every event type, on each supported `openai` major. `final` sees a terminal event's `Response` before
    the caller does (`event_stream`)."""
    process, cast_to, response = stream._client._process_response_data, stream._cast_to, stream.response
    try:
        for data in stream._iter_events():
            event = process(data=_as_read(data, response), cast_to=cast_to, response=response)
            if type(event) in _FINAL_EVENTS:
                final(event.response)
            yield event
    finally:
        response.close()


async def _aread_events(stream: Any, final: Callable[[Response], None]) -> AsyncIterator[Any]:
    """`_read_events` for an `AsyncStream`."""
    process, cast_to, response = stream._client._process_response_data, stream._cast_to, stream.response
    try:
        async for data in stream._iter_events():
            event = process(data=_as_read(data, response), cast_to=cast_to, response=response)
            if type(event) in _FINAL_EVENTS:
                final(event.response)
            yield event
    finally:
        await response.aclose()


_FINAL_EVENTS = frozenset({ResponseCompletedEvent, ResponseIncompleteEvent})
"""The typed events that carry a turn's complete `Response` (its output is the chain's newest items)."""


def _as_read(data: dict[str, Any], response: Any) -> Any:
    """An event's JSON as the SDK's `Stream` hands it to the parser; raises its `APIError` for a truthy `error`."""
    kind = str(data.get("type"))
    if kind.startswith("thread."):  # an Assistants event: its JSON has no name of its own
        return {"data": data, "event": kind}
    error = data.get("error")
    if error:
        message = error.get("message") if isinstance(error, Mapping) else None
        if not message or not isinstance(message, str):
            message = "An error occurred during streaming"
        raise APIError(message=message, request=response.request, body=error)
    return data


def input_json(items: Any) -> bytes:
    """Input items as the SDK's `responses.create` sends them: its transform, then its JSON encoder."""
    return _sdk_json(transform(items, ResponseInputParam))


try:
    from openai._utils._json import openapi_dumps as _sdk_json
except ImportError:  # openai 1.x/2.x: httpx encodes the body, with the standard library's encoder

    def _sdk_json(obj: Any) -> bytes:  # type: ignore[misc]
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def chat_body(params: Mapping[str, Any]) -> dict[str, Any]:
    """`chat.completions.create` arguments as the JSON body the SDK would send."""
    return transform(dict(params), CompletionCreateParamsBase)


async def connect_websocket(
    url: str, headers: list[tuple[str, str]], user_agent: str | None, **options: Any
) -> ClientConnection:
    """Open a WebSocket as the SDK's `responses.connect()` does (no cross-origin redirects with credentials)."""
    return await _WebSocketConnect(url, additional_headers=headers, user_agent_header=user_agent, **options)  # type: ignore[no-any-return]
