"""Existing agents: a stock `ChatOpenAI` switched to the WebSocket transport, per model or per agent run."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import langchain_openai
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage

from .model import CLIENT_FIELDS, ChatOpenAI, Transport, default_transport


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
