"""LangChain: WebSocket mode behind one flag, for new code and for existing agents.

    from plugins.langchain import ChatOpenAI          # was: from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="gpt-5.1")                # transport="websocket" unless RESPONSES_WS_TRANSPORT=http
    agent = langchain.agents.create_agent(model, tools)

`ChatOpenAI` is `langchain_openai.ChatOpenAI` with a `transport` field. It always uses the
Responses API, so the two transports differ only in how the request travels:

- `"http"`: the stock behaviour, every turn a `POST /responses` with the whole history.
- `"websocket"`: the model's own `openai` clients are wrapped with `ws_transport.wrap`, so
  `responses.create` goes over one persistent WebSocket. Each call converts only the messages
  after the newest `AIMessage` that carries a response id and sends them with that id as
  `previous_response_id` (what `use_previous_response_id=True` does), so the client's work per
  turn does not grow with the history. That happens only when the messages before it are the
  history that response answered (see `Lineage`): a history a middleware summarized or trimmed
  goes in full, as over HTTP. If the server has lost the response (a reconnect with
  `store=False`), the call is repeated once with the full history.

Threads: a call made inside a LangGraph run with a `thread_id` (or inside `agent_session(key)`)
uses a session of its own, i.e. its own socket and server-side connection cache, kept for the
most recent `max_agent_sessions` threads; other calls share the model's root session. Either
way a thread's requests name the response its own history ended with, so parallel threads
never continue each other's chain.

For an agent whose model is already a stock `ChatOpenAI`, add `WebSocketTransportMiddleware()`
to `create_agent(..., middleware=[...])`: it switches the model to the WebSocket transport for
each model call of the run and leaves other models alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from typing import Any, Literal, Self, cast, get_args

import httpx2
import langchain_openai
import openai
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables.config import ensure_config
from pydantic import Field, PrivateAttr, model_validator

import ws_transport

from .transport import wrap as wrap_client

log = logging.getLogger(__name__)

Transport = Literal["http", "websocket"]
TRANSPORT_ENV = "RESPONSES_WS_TRANSPORT"
"""Environment variable that sets the default `transport` ("http" or "websocket")."""

FULL_HISTORY = "_responses_ws_full_history"
"""Private call keyword: build this request from the whole history (the resend after a lost chain)."""

CLIENT_FIELDS = frozenset({"client", "async_client", "root_client", "root_async_client"})
"""Fields holding `openai` clients: never copied from a stock model, the new one builds and wraps its own."""

_session_key: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("responses_ws_session", default=None)


def default_transport() -> Transport:
    """`RESPONSES_WS_TRANSPORT` when set, else "websocket"."""
    value = os.environ.get(TRANSPORT_ENV, "").strip().lower() or "websocket"
    if value not in get_args(Transport):
        raise ValueError(f"{TRANSPORT_ENV}={value!r}: expected one of {', '.join(get_args(Transport))}")
    return cast(Transport, value)


@contextlib.contextmanager
def agent_session(key: Hashable) -> Iterator[None]:
    """Model calls in this block use the WebSocket session `key` (a thread id of your own)."""
    token = _session_key.set(key)
    try:
        yield
    finally:
        _session_key.reset(token)


def split_at_last_response(messages: Sequence[BaseMessage]) -> tuple[Sequence[BaseMessage], str | None]:
    """The messages after the newest `AIMessage` with a Responses id, and that id (None: no such message).

    Scans backwards and stops at that message, so its cost is the number of new messages.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            response_id = message.response_metadata.get("id")
            if isinstance(response_id, str) and response_id.startswith("resp_"):
                return messages[index + 1 :], response_id
    return messages, None


def lost_chain(error: BaseException) -> bool:
    """Whether the server no longer holds the `previous_response_id` a request named."""
    return isinstance(error, openai.BadRequestError) and error.code == "previous_response_not_found"


class Lineage:
    """Which history each response answered, so a request continues a response only from that same history.

    The server's chain under a response id is the history that response answered plus its output.
    If the messages before that response are no longer that history (a summarization or trimming
    middleware rewrote them, a dynamic system prompt changed, the app branched), continuing the
    chain would diverge from what HTTP sends, so the request goes in full instead. An id this
    model never produced (another model, another process) also goes in full.

    The response's own message must also still say what the server has (its text and tool calls):
    an answer a middleware redacted or the app corrected goes in full too.

    The check costs an identity or message-id compare per message; content is compared only for a
    message that is neither the same object nor carries the same id. Only the newest response of
    each chain is kept, at most `capacity` chains (least recently used dropped first).
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._histories: OrderedDict[str, tuple[tuple[BaseMessage, ...], BaseMessage]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, response_id: str, history: Sequence[BaseMessage], answer: BaseMessage) -> None:
        """Note the history `response_id` answered, and its answer (streamed: all its chunks added up)."""
        with self._lock:
            if response_id in self._histories:
                return
            _, previous_id = split_at_last_response(history)
            if previous_id is not None:
                self._histories.pop(previous_id, None)
            self._histories[response_id] = (tuple(history), answer)
            while len(self._histories) > self.capacity:
                self._histories.popitem(last=False)

    def continues(self, response_id: str, history: Sequence[BaseMessage], answer: BaseMessage) -> bool:
        """Whether `history` is what the response answered and `answer` (its message) is still its answer."""
        with self._lock:
            known = self._histories.get(response_id)
            if known is not None:
                self._histories.move_to_end(response_id)
        if known is None or len(known[0]) != len(history) or _said(known[1]) != _said(answer):
            return False
        return all(
            a is b or (a.id is not None and a.id == b.id) or a == b for a, b in zip(known[0], history, strict=True)
        )


def _said(message: BaseMessage) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What an answer says, as the server holds it: its text and its tool calls."""
    calls = getattr(message, "tool_calls", None) or []
    return str(message.text), tuple((call["name"], json.dumps(call["args"], sort_keys=True)) for call in calls)


class ChatOpenAI(langchain_openai.ChatOpenAI):
    """`langchain_openai.ChatOpenAI` on the Responses API, over HTTP or one persistent WebSocket.

    A drop-in replacement: every field and method of the stock class works the same. Added:

    - `transport`: "websocket" (default, or `RESPONSES_WS_TRANSPORT`) or "http";
    - `transport_options`: `ws_transport.SessionOptions` fields for every session this model opens;
    - `max_agent_sessions`: per-thread sessions kept open;
    - `ws_session(key)` (its `.stats`), `close()`/`aclose()`, `close_session(key)`/`aclose_session(key)`.

    `use_responses_api` is always True; passing False is an error. A custom `http_client` /
    `http_async_client` is kept and wrapped in place (`ws_transport.wrap` installs itself on it, and
    closing it closes the root session's socket); without one the model gets its own, since
    langchain-openai shares its default client between every model with the same base URL. The
    sync and async sides are separate sessions (the async one lives on the caller's event loop).
    """

    transport: Transport = Field(default_factory=default_transport)
    """How Responses requests travel: "websocket" (one persistent session) or "http"."""

    transport_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for `ws_transport.wrap` (`ws_transport.SessionOptions` fields)."""

    max_agent_sessions: int = 64
    """Per-thread sessions kept open (least recently used closed first)."""

    _sessions: AgentSessions | None = PrivateAttr(default=None)
    _lineage: Lineage | None = PrivateAttr(default=None)
    _routed: bool = PrivateAttr(default=False)

    @model_validator(mode="before")
    @classmethod
    def _responses_api_only(cls, values: Any) -> Any:
        if isinstance(values, dict):
            if values.get("use_responses_api") is False:
                raise ValueError("plugins.langchain.ChatOpenAI always uses the Responses API (use_responses_api=False)")
            values = {**values, "use_responses_api": True}
        return values

    @model_validator(mode="after")
    def _install_transport(self) -> Self:
        """Give the WebSocket path its own clients, wrapped; runs after the stock client set-up."""
        if self.transport != "websocket":
            return self
        sync_inner = async_inner = None
        owned = (self.http_client is None, self.http_async_client is None)
        if self.root_client is not None:
            self.root_client, sync_inner = _own_client(self.root_client, self.http_client, asynchronous=False)
            wrap_client(self.root_client, **self.transport_options)
            self.client = self.root_client.chat.completions
        if self.root_async_client is not None:
            self.root_async_client, async_inner = _own_client(
                self.root_async_client, self.http_async_client, asynchronous=True
            )
            wrap_client(self.root_async_client, **self.transport_options)
            self.async_client = self.root_async_client.chat.completions
        self._sessions = AgentSessions(
            self.root_client,
            self.root_async_client,
            sync_inner,
            async_inner,
            capacity=self.max_agent_sessions,
            options=self.transport_options,
            owned=owned,
        )
        self._lineage = Lineage()
        return self

    # Sessions ------------------------------------------------------------------------------

    def ws_session(self, key: Hashable | None = None, *, asynchronous: bool = False) -> ws_transport.Session | None:
        """The session of thread `key` (None: the root session), sync or async side; None if there is none."""
        if self._sessions is None:
            return None
        client = self._sessions.get(key, asynchronous=asynchronous)
        return None if client is None else ws_transport.session_of(client)

    @property
    def lineage(self) -> Lineage | None:
        """Which history each response of this model answered (None on the HTTP path)."""
        return self._lineage

    def close(self) -> None:
        """Close the sync side's WebSocket sessions (root and per thread).

        A model whose clients it built itself cannot make WebSocket calls afterwards; a `http_client`
        you passed stays open (it is yours), and so does the session installed on it. Nothing to do
        on the HTTP path.
        """
        if self._sessions is not None:
            self._sessions.close_all()

    async def aclose(self) -> None:
        """Close every WebSocket session of this model, sync and async side; WebSocket calls fail after this."""
        if self._sessions is not None:
            await self._sessions.aclose_all()

    def close_session(self, key: Hashable) -> None:
        """Close thread `key`'s sync session now (its socket and cache); the next call opens a new one."""
        if self._sessions is not None:
            self._sessions.close(key)

    async def aclose_session(self, key: Hashable) -> None:
        """Close thread `key`'s sessions now, the async one on this event loop."""
        if self._sessions is not None:
            await self._sessions.aclose(key)

    def _for_call(
        self, run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None, *, asynchronous: bool
    ) -> ChatOpenAI:
        """This model, or a shallow copy on the session of the thread this call belongs to."""
        if self._sessions is None or self._routed:
            return self
        key = _session_key.get()
        if key is None:
            key = _thread_id(run_manager)
        if key is None:
            return self
        if asynchronous:
            aclient = self._sessions.async_client(key)
            routed = self.model_copy(update={"root_async_client": aclient, "async_client": aclient.chat.completions})
        else:
            client = self._sessions.sync_client(key)
            routed = self.model_copy(update={"root_client": client, "client": client.chat.completions})
        routed._routed = True
        return routed

    # Requests ------------------------------------------------------------------------------

    def _get_request_payload(self, input_: LanguageModelInput, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        """On the WebSocket path, only the messages after the last response, with its id, when that chain holds."""
        full = kwargs.pop(FULL_HISTORY, False)
        if (
            self._lineage is None
            or full
            or "previous_response_id" in kwargs
            or "previous_response_id" in self.model_kwargs
        ):
            return super()._get_request_payload(input_, stop=stop, **kwargs)
        messages = self._convert_input(input_).to_messages()
        tail, previous_id = split_at_last_response(messages)
        if (
            previous_id is None
            or not tail
            or not self._lineage.continues(previous_id, messages[: -len(tail) - 1], messages[-len(tail) - 1])
        ):
            return super()._get_request_payload(messages, stop=stop, **kwargs)
        return super()._get_request_payload(list(tail), stop=stop, previous_response_id=previous_id, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model = self._for_call(run_manager, asynchronous=False)
        generate = super(ChatOpenAI, model)._generate
        try:
            result = generate(messages, stop, run_manager, **kwargs)
        except openai.BadRequestError as error:
            if not model._may_resend(error, kwargs):
                raise
            log.debug("plugins.langchain: %s; resending with the full history", error.code)
            result = generate(messages, stop, run_manager, **{**kwargs, FULL_HISTORY: True})
        model._remember(messages, result.generations[0].message if result.generations else None)
        return result

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        model = self._for_call(run_manager, asynchronous=True)
        generate = super(ChatOpenAI, model)._agenerate
        try:
            result = await generate(messages, stop, run_manager, **kwargs)
        except openai.BadRequestError as error:
            if not model._may_resend(error, kwargs):
                raise
            log.debug("plugins.langchain: %s; resending with the full history", error.code)
            result = await generate(messages, stop, run_manager, **{**kwargs, FULL_HISTORY: True})
        model._remember(messages, result.generations[0].message if result.generations else None)
        return result

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        model = self._for_call(run_manager, asynchronous=False)
        stream = super(ChatOpenAI, model)._stream
        chunks = stream(messages, stop, run_manager, **kwargs)
        try:
            first = next(chunks)
        except StopIteration:
            return
        except openai.BadRequestError as error:
            if not model._may_resend(error, kwargs):
                raise
            log.debug("plugins.langchain: %s; resending with the full history", error.code)
            chunks = stream(messages, stop, run_manager, **{**kwargs, FULL_HISTORY: True})
            answer = None
        else:
            answer = first.message
            yield first
        for chunk in chunks:
            answer = chunk.message if answer is None else answer + chunk.message
            yield chunk
        model._remember(messages, answer)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        model = self._for_call(run_manager, asynchronous=True)
        stream = super(ChatOpenAI, model)._astream
        chunks = stream(messages, stop, run_manager, **kwargs)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            return
        except openai.BadRequestError as error:
            if not model._may_resend(error, kwargs):
                raise
            log.debug("plugins.langchain: %s; resending with the full history", error.code)
            chunks = stream(messages, stop, run_manager, **{**kwargs, FULL_HISTORY: True})
            answer = None
        else:
            answer = first.message
            yield first
        async for chunk in chunks:
            answer = chunk.message if answer is None else answer + chunk.message
            yield chunk
        model._remember(messages, answer)

    def _remember(self, messages: Sequence[BaseMessage], message: BaseMessage | None) -> None:
        """Note which history the response in `message` answered (streamed: its chunks added up, once complete)."""
        if self._lineage is None or message is None:
            return
        response_id = message.response_metadata.get("id")
        if isinstance(response_id, str) and response_id.startswith("resp_"):
            self._lineage.record(response_id, messages, message)

    def _may_resend(self, error: BaseException, kwargs: dict[str, Any]) -> bool:
        """Only a chain this class made is resent in full; a `previous_response_id` the caller chose is not."""
        return (
            lost_chain(error)
            and self.transport == "websocket"
            and not kwargs.get(FULL_HISTORY)
            and "previous_response_id" not in kwargs
            and "previous_response_id" not in self.model_kwargs
        )


def with_websocket_transport(model: langchain_openai.ChatOpenAI, **overrides: Any) -> ChatOpenAI:
    """A `plugins.langchain.ChatOpenAI` with the settings of a stock `model`, on the WebSocket transport.

    The new model builds its own `openai` clients. A custom `http_client` the stock model was given
    is shared, and the WebSocket transport installs itself on it (so the stock model's Responses
    calls ride the same session).
    """
    fields = {name: getattr(model, name) for name in model.model_fields_set if name not in CLIENT_FIELDS}
    if fields.get("openai_proxy"):
        # langchain-openai built these from openai_proxy; the new model builds its own.
        fields.pop("http_client", None)
        fields.pop("http_async_client", None)
    fields.pop("use_responses_api", None)
    return ChatOpenAI(**{**fields, "transport": "websocket", **overrides})


class WebSocketTransportMiddleware(AgentMiddleware):
    """Run an existing agent's stock `ChatOpenAI` over the WebSocket transport, per agent run.

        agent = create_agent(ChatOpenAI(model="gpt-5.1"), tools, middleware=[WebSocketTransportMiddleware()])

    Each model call of the run gets a `plugins.langchain.ChatOpenAI` with the same settings and
    `transport="websocket"` (built once per stock model and reused), with the run's `thread_id`
    selecting its session. Models that are not `langchain_openai.ChatOpenAI` pass through.
    `transport="http"` (or `RESPONSES_WS_TRANSPORT=http`) turns the middleware off.
    """

    def __init__(self, transport: Transport | None = None, **transport_options: Any) -> None:
        super().__init__()
        self.transport = transport or default_transport()
        if self.transport not in get_args(Transport):
            raise ValueError(f"transport={self.transport!r}: expected one of {', '.join(get_args(Transport))}")
        self.transport_options = transport_options
        self._converted: dict[int, tuple[BaseChatModel, ChatOpenAI]] = {}
        self._lock = threading.Lock()

    def websocket_model(self, model: BaseChatModel) -> BaseChatModel:
        """`model` on the WebSocket transport when it is a `ChatOpenAI`, else `model` itself."""
        if self.transport != "websocket" or not isinstance(model, langchain_openai.ChatOpenAI):
            return model
        if isinstance(model, ChatOpenAI) and model.transport == "websocket":
            return model
        with self._lock:
            cached = self._converted.get(id(model))
            if cached is None or cached[0] is not model:
                options = {"transport_options": self.transport_options} if self.transport_options else {}
                cached = (model, with_websocket_transport(model, **options))
                self._converted[id(model)] = cached
        return cached[1]

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse | AIMessage:
        model = self.websocket_model(request.model)
        return handler(request if model is request.model else request.override(model=model))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse | AIMessage:
        model = self.websocket_model(request.model)
        return await handler(request if model is request.model else request.override(model=model))


def _thread_id(run_manager: Any) -> Hashable | None:
    """The LangGraph thread this call runs in: the run's metadata, else the current runnable config."""
    metadata = getattr(run_manager, "metadata", None) or {}
    thread_id = metadata.get("thread_id")
    if thread_id is None:
        thread_id = (ensure_config().get("configurable") or {}).get("thread_id")
    return thread_id if isinstance(thread_id, Hashable) else None


# Clients ------------------------------------------------------------------------------------


def _own_client(client: Any, given_http_client: Any, *, asynchronous: bool) -> tuple[Any, Any]:
    """The client to wrap, and the HTTP transport (connection pool) it and the per-thread sessions use.

    With no `http_client` given, langchain-openai hands every model with the same base URL one
    cached httpx client; wrapping that in place would switch unrelated models to WebSocket, so
    this model gets an httpx client of its own that borrows the cached one's connection pool
    (building a pool costs tens of milliseconds; borrowing costs nothing).
    """
    pool = client._client._transport
    if given_http_client is None:
        http = (
            openai.DefaultAsyncHttpxClient(transport=_AsyncBorrowed(pool))
            if asynchronous
            else openai.DefaultHttpxClient(transport=_Borrowed(pool))
        )
        client = client.copy(http_client=http)
    return client, pool


class _Borrowed(httpx2.BaseTransport):
    """Another client's HTTP transport, used but never closed by this one."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        pass


class _AsyncBorrowed(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        pass


class AgentSessions:
    """Wrapped clients per thread key, sync and async, each with its own WebSocket session.

    Each is a copy of the model's root client on a fresh httpx client that borrows the root's
    connection pool (so only the WebSocket is per thread). At most `capacity` per side; the least
    recently used is closed when a new thread needs room. An async client belongs to the event
    loop it was made on; on another loop the thread gets a new one.
    """

    def __init__(
        self,
        sync_root: openai.OpenAI | None,
        async_root: openai.AsyncOpenAI | None,
        sync_inner: Any,
        async_inner: Any,
        *,
        capacity: int,
        options: dict[str, Any],
        owned: tuple[bool, bool] = (True, True),
    ) -> None:
        self.sync_root = sync_root
        self.async_root = async_root
        self.sync_inner = sync_inner
        self.async_inner = async_inner
        self.capacity = max(1, capacity)
        self.options = options
        self.owned = owned
        self._sync: OrderedDict[Hashable, openai.OpenAI] = OrderedDict()
        self._async: OrderedDict[Hashable, tuple[openai.AsyncOpenAI, asyncio.AbstractEventLoop]] = OrderedDict()
        self._lock = threading.Lock()
        self._closing: set[asyncio.Task[Any]] = set()

    def get(self, key: Hashable | None, *, asynchronous: bool) -> openai.OpenAI | openai.AsyncOpenAI | None:
        if key is None:
            return self.async_root if asynchronous else self.sync_root
        with self._lock:
            if asynchronous:
                entry = self._async.get(key)
                return None if entry is None else entry[0]
            return self._sync.get(key)

    def sync_client(self, key: Hashable) -> openai.OpenAI:
        if self.sync_root is None:
            raise ValueError("this model has no sync client (its API key is an async callable)")
        evicted: list[openai.OpenAI] = []
        with self._lock:
            client = self._sync.get(key)
            if client is None:
                http = openai.DefaultHttpxClient(transport=_Borrowed(self.sync_inner))
                client = wrap_client(self.sync_root.copy(http_client=http), **self.options)
                self._sync[key] = client
                while len(self._sync) > self.capacity:
                    evicted.append(self._sync.popitem(last=False)[1])
            else:
                self._sync.move_to_end(key)
        for old in evicted:
            old.close()
        return client

    def async_client(self, key: Hashable) -> openai.AsyncOpenAI:
        assert self.async_root is not None
        loop = asyncio.get_running_loop()
        evicted: list[tuple[openai.AsyncOpenAI, asyncio.AbstractEventLoop]] = []
        with self._lock:
            entry = self._async.get(key)
            if entry is not None and entry[1] is not loop:
                evicted.append(self._async.pop(key))
                entry = None
            if entry is None:
                http = openai.DefaultAsyncHttpxClient(transport=_AsyncBorrowed(self.async_inner))
                entry = (wrap_client(self.async_root.copy(http_client=http), **self.options), loop)
                self._async[key] = entry
                while len(self._async) > self.capacity:
                    evicted.append(self._async.popitem(last=False)[1])
            else:
                self._async.move_to_end(key)
        for client, owner in evicted:
            self._close_async(client, owner)
        return entry[0]

    def close(self, key: Hashable) -> None:
        with self._lock:
            client = self._sync.pop(key, None)
            entry = self._async.pop(key, None)
        if client is not None:
            client.close()
        if entry is not None:
            self._close_async(*entry)

    async def aclose(self, key: Hashable) -> None:
        with self._lock:
            client = self._sync.pop(key, None)
            entry = self._async.pop(key, None)
        if client is not None:
            await asyncio.to_thread(client.close)
        if entry is not None:
            aclient, owner = entry
            if owner is asyncio.get_running_loop():
                await aclient.close()
            else:
                self._close_async(aclient, owner)

    def close_all(self) -> None:
        with self._lock:
            clients, self._sync = list(self._sync.values()), OrderedDict()
            entries, self._async = list(self._async.values()), OrderedDict()
        for client in clients:
            client.close()
        for entry in entries:
            self._close_async(*entry)
        if self.sync_root is not None and self.owned[0]:
            self.sync_root.close()

    async def aclose_all(self) -> None:
        with self._lock:
            keys = [*self._sync, *(k for k in self._async if k not in self._sync)]
        for key in keys:
            await self.aclose(key)
        if self.sync_root is not None and self.owned[0]:
            await asyncio.to_thread(self.sync_root.close)
        if self.async_root is not None and self.owned[1]:
            await self.async_root.close()

    def _close_async(self, client: openai.AsyncOpenAI, loop: asyncio.AbstractEventLoop) -> None:
        """Close an async client on its own loop (its sockets live there); a stopped loop took them along."""
        if loop.is_closed() or not loop.is_running():
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            task = loop.create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        else:
            asyncio.run_coroutine_threadsafe(client.close(), loop)
