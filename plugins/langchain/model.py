"""`ChatOpenAI`: `langchain_openai.ChatOpenAI` with a `transport` field (see the package docstring)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import AsyncIterator, Hashable, Iterator, Sequence
from typing import Any, Literal, Self, cast, get_args

import langchain_openai
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import BaseMessage, BaseMessageChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables.config import ensure_config
from pydantic import Field, PrivateAttr, model_validator

import ws_transport

from ..transport import wrap as wrap_client
from . import resend
from .lineage import Lineage, split_at_last_response
from .resend import FULL_HISTORY, lost_chain
from .sessions import AgentSessions, own_client

Transport = Literal["http", "websocket"]
TRANSPORT_ENV = "RESPONSES_WS_TRANSPORT"
"""Environment variable that sets the default `transport` ("http" or "websocket")."""

Messages = list[BaseMessage]
Stop = list[str] | None
SyncRun = CallbackManagerForLLMRun | None
AsyncRun = AsyncCallbackManagerForLLMRun | None

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
            self.root_client, sync_inner = own_client(self.root_client, self.http_client, asynchronous=False)
            wrap_client(self.root_client, **self.transport_options)
            self.client = self.root_client.chat.completions
        if self.root_async_client is not None:
            self.root_async_client, async_inner = own_client(
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
        self, messages: Messages, stop: Stop = None, run_manager: SyncRun = None, **kwargs: Any
    ) -> ChatResult:
        model = self._for_call(run_manager, asynchronous=False)
        generate = super(ChatOpenAI, model)._generate
        result = resend.call(model._may_resend, lambda kw: generate(messages, stop, run_manager, **kw), kwargs)
        model._remember(messages, result.generations[0].message if result.generations else None)
        return result

    async def _agenerate(
        self, messages: Messages, stop: Stop = None, run_manager: AsyncRun = None, **kwargs: Any
    ) -> ChatResult:
        model = self._for_call(run_manager, asynchronous=True)
        generate = super(ChatOpenAI, model)._agenerate
        result = await resend.acall(model._may_resend, lambda kw: generate(messages, stop, run_manager, **kw), kwargs)
        model._remember(messages, result.generations[0].message if result.generations else None)
        return result

    def _stream(
        self, messages: Messages, stop: Stop = None, run_manager: SyncRun = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        model = self._for_call(run_manager, asynchronous=False)
        stream = super(ChatOpenAI, model)._stream
        answer = Answer()
        for chunk in resend.stream(model._may_resend, lambda kw: stream(messages, stop, run_manager, **kw), kwargs):
            yield answer.add(chunk)
        model._remember(messages, answer.message)

    async def _astream(
        self, messages: Messages, stop: Stop = None, run_manager: AsyncRun = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        model = self._for_call(run_manager, asynchronous=True)
        stream = super(ChatOpenAI, model)._astream
        answer = Answer()
        async for chunk in resend.astream(
            model._may_resend, lambda kw: stream(messages, stop, run_manager, **kw), kwargs
        ):
            yield answer.add(chunk)
        model._remember(messages, answer.message)

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


class Answer:
    """A streamed answer's chunks added up: what the response said, once the stream ends."""

    def __init__(self) -> None:
        self.message: BaseMessageChunk | None = None

    def add(self, chunk: ChatGenerationChunk) -> ChatGenerationChunk:
        self.message = chunk.message if self.message is None else self.message + chunk.message
        return chunk


def _thread_id(run_manager: Any) -> Hashable | None:
    """The LangGraph thread this call runs in: the run's metadata, else the current runnable config."""
    metadata = getattr(run_manager, "metadata", None) or {}
    thread_id = metadata.get("thread_id")
    if thread_id is None:
        thread_id = (ensure_config().get("configurable") or {}).get("thread_id")
    return thread_id if isinstance(thread_id, Hashable) else None
